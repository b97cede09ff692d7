"""Greedy decoding with the key/value cache against without it (re-running the whole prefix at
every step), for ``--new-tokens`` tokens from an encoder-decoder ``transformer``.

Both decode the same sources with the same weights, timed alternately; the outputs are checked
equal. Reported: median seconds of each and the speed-up (uncached / cached).

    tzoo bench decoding [--new-tokens 256 --d-model 256 --heads 4 --layers 3 --batch 8 --src-length 32 --repeats 3
                         --cache auto|static|dynamic --device cuda --bf16]
"""

from __future__ import annotations

import argparse

import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode

from .common import add_device_options, autocast, bench_parser, device_name, device_of, paired_medians, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument(
        "--new-tokens", type=int, default=256, help="tokens each source decodes to (no end token stops a row early)"
    )
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--layers", type=int, default=3, help="layers in the encoder and in the decoder")
    parser.add_argument("--batch", type=int, default=8, help="sources decoded together")
    parser.add_argument("--src-length", type=int, default=32, help="tokens per source")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (the median is reported)")
    parser.add_argument(
        "--cache",
        choices=("auto", "static", "dynamic"),
        default="auto",
        help="the cached side's cache: preallocated, each step replayed as a CUDA graph on a GPU "
        "(static), grown step by step (dynamic), or what greedy_decode picks (auto: static on "
        "CUDA, dynamic on a CPU)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)

    torch.manual_seed(0)
    model = (
        tz.build_model(
            "transformer-base",
            d_model=args.d_model,
            n_heads=args.heads,
            d_ff=4 * args.d_model,
            encoder={"layers": args.layers},
            decoder={"layers": args.layers},
            vocab_size=1000,
            max_len=max(args.src_length, args.new_tokens + 1) + 8,
        )
        .to(device)
        .eval()
    )
    src = torch.randint(3, 1000, (args.batch, args.src_length)).to(device)

    static = {"auto": None, "static": True, "dynamic": False}[args.cache]

    def decode(use_cache: bool) -> torch.Tensor:
        with torch.no_grad():  # no eos: every row writes all the tokens
            return greedy_decode(
                model, src, bos_id=1, max_new_tokens=args.new_tokens, use_cache=use_cache, static_cache=static
            )

    if not torch.equal(autocast(args, lambda: decode(True))(), autocast(args, lambda: decode(False))()):
        raise SystemExit("cached and uncached decoding disagree")
    cached, uncached = paired_medians(
        autocast(args, lambda: decode(True)),
        autocast(args, lambda: decode(False)),
        args.repeats,
        warmup=1,
        device=device,
    )
    result = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cached_s": cached,
        "uncached_s": uncached,
        "speedup": uncached / cached,
    }
    print(
        f"greedy decoding of {args.new_tokens} tokens, transformer d={args.d_model} heads={args.heads} "
        f"layers={args.layers}+{args.layers} batch={args.batch} source={args.src_length}, "
        f"{device_name(device)}{' bf16' if args.bf16 else ''}, {torch.get_num_threads()} threads, cache: {args.cache}"
    )
    print(f"  with cache {cached:8.2f} s   without {uncached:8.2f} s   speed-up {uncached / cached:.1f}x")
    if args.json:
        write_json(args.json, result, device)


if __name__ == "__main__":
    main()
