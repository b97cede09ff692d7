"""Grouped-query and multi-query attention against multi-head attention: the key/value cache's
bytes after ``--new-tokens`` tokens, the attention parameters, and cached greedy decoding's time.

Each model is the same ``transformer`` but for ``n_kv_heads`` in its decoder's self- and
cross-attention; the first of ``--kv-heads`` is the reference (by default ``--heads``:
multi-head). Times are paired with the reference's, in one process. The bytes are counted in the
decoder's cache (self-attention keys and values, and the encoder memory's keys and values),
so they do not depend on the machine.

    tzoo bench kv-heads [--kv-heads 8 2 1 --new-tokens 128 --d-model 256 --heads 8 --layers 3 --batch 8
                         --src-length 64 --repeats 3 --device cuda --bf16]
"""

from __future__ import annotations

import argparse

import torch

import transformer_zoo as tz
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import DecodeStep, greedy_decode

from .common import add_device_options, autocast, bench_parser, device_name, device_of, paired_medians, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument(
        "--kv-heads",
        type=int,
        nargs="+",
        default=None,
        help="n_kv_heads of each model, the reference first (default: heads, heads/4, 1)",
    )
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens each source decodes to")
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=8, help="query heads")
    parser.add_argument("--layers", type=int, default=3, help="layers in the encoder and in the decoder")
    parser.add_argument("--batch", type=int, default=8, help="sources decoded together")
    parser.add_argument("--src-length", type=int, default=64, help="tokens per source")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", help="also write the results to this file")
    add_device_options(parser)
    return parser


def cache_bytes(model: torch.nn.Module, src: torch.Tensor, new_tokens: int) -> int:
    """Bytes in the decoder's cache once ``new_tokens`` tokens have been decoded from ``src``."""
    cache = DecoderCache()
    step = DecodeStep(model, model.encode(src).hidden, None, cache)
    tokens = torch.ones(src.size(0), 1, dtype=torch.long, device=src.device)
    for _ in range(new_tokens):
        tokens = step(tokens)[:, -1].argmax(-1, keepdim=True)
    return cache.nbytes


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    kv_heads = args.kv_heads or sorted({args.heads, max(args.heads // 4, 1), 1}, reverse=True)
    src = torch.randint(3, 1000, (args.batch, args.src_length)).to(device)

    def model(n_kv_heads: int) -> torch.nn.Module:
        torch.manual_seed(0)
        attention = {"kind": "sdpa", "n_kv_heads": n_kv_heads}
        return (
            tz.build_model(
                "transformer-base",
                d_model=args.d_model,
                n_heads=args.heads,
                d_ff=4 * args.d_model,
                encoder={"layers": args.layers},
                vocab_size=1000,
                decoder={"layers": args.layers, "attention": attention, "cross_attention": attention},
                max_len=max(args.src_length, args.new_tokens + 1) + 8,
            )
            .to(device)
            .eval()
        )

    def decoding(m: torch.nn.Module):
        def decode() -> torch.Tensor:
            with torch.no_grad():
                return greedy_decode(m, src, bos_id=1, max_new_tokens=args.new_tokens)

        return autocast(args, decode)

    models = {k: model(k) for k in kv_heads}
    reference = models[kv_heads[0]]
    rows = []
    for k, m in models.items():
        with torch.no_grad():
            nbytes = autocast(args, lambda m=m: cache_bytes(m, src, args.new_tokens))()
        params = sum(p.numel() for name, p in m.named_parameters() if ".self_attn." in name and "decoder" in name)
        ours, ref = paired_medians(decoding(m), decoding(reference), args.repeats, warmup=1, device=device)
        rows.append(
            {
                "n_kv_heads": k,
                "cache_bytes": nbytes,
                "self_attention_params": params,
                "decode_s": ours,
                "reference_decode_s": ref,
            }
        )
    first = rows[0]
    print(
        f"cached greedy decoding of {args.new_tokens} tokens, transformer d={args.d_model} heads={args.heads} "
        f"layers={args.layers}+{args.layers} batch={args.batch} source={args.src_length}, "
        f"{device_name(device)}{' bf16' if args.bf16 else ''}, {torch.get_num_threads()} threads; "
        f"reference n_kv_heads={kv_heads[0]}"
    )
    print(
        f"  {'n_kv_heads':>10} {'cache MB':>9} {'x ref':>6} {'self-attn params':>17} {'x ref':>6} "
        f"{'decode s':>9} {'x ref (same run)':>17}"
    )
    for row in rows:
        print(
            f"  {row['n_kv_heads']:>10} {row['cache_bytes'] / 2**20:>9.2f} "
            f"{row['cache_bytes'] / first['cache_bytes']:>6.3f} {row['self_attention_params']:>17,} "
            f"{row['self_attention_params'] / first['self_attention_params']:>6.3f} {row['decode_s']:>9.3f} "
            f"{row['decode_s'] / row['reference_decode_s']:>17.2f}"
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "rows": rows}, device)


if __name__ == "__main__":
    main()
