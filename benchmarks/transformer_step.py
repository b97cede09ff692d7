"""Training step and inference time of the ``transformer`` family against torch.nn.Transformer.

Both run the same shapes in the same process, timed alternately, and the ratio of medians is
reported (ours / reference; below 1.0 means faster). Only the encoder-decoder stacks are
compared: the reference has no embeddings or head, so ours are fed the same embedded inputs.

    python -m benchmarks.transformer_step [--d-model 256 --layers 3 --batch 16 --length 64 --repeats 20 --device cuda --bf16]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask

from .common import add_device_options, autocast, bench_parser, device_name, device_of, paired_medians, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--layers", type=int, default=3, help="layers in the encoder and in the decoder")
    parser.add_argument("--batch", type=int, default=16, help="examples per batch")
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    torch.manual_seed(0)
    d, ff = args.d_model, 4 * args.d_model

    ours = tz.build_model(
        "transformer",
        d_model=d,
        n_heads=args.heads,
        d_ff=ff,
        dropout=0.1,
        encoder={"layers": args.layers},
        decoder={"layers": args.layers},
    )
    ref = nn.Transformer(d, args.heads, args.layers, args.layers, ff, dropout=0.1, batch_first=True)
    ref.encoder.norm = nn.Identity()  # the paper's post-norm stacks have no final norm; ours neither
    ref.decoder.norm = nn.Identity()
    ours.to(device), ref.to(device)
    src = torch.randn(args.batch, args.length, d, device=device)
    tgt = torch.randn(args.batch, args.length, d, device=device)
    causal = torch.ones(args.length, args.length, dtype=torch.bool, device=device).triu(1)

    def ours_forward():
        memory = ours.encoder(src).hidden
        return ours.decoder(tgt, memory, self_mask=AttentionMask(causal=True)).hidden

    def ref_forward():
        return ref(src, tgt, tgt_mask=causal, tgt_is_causal=True)

    def step(model, forward, optimizer):
        def run():
            optimizer.zero_grad(set_to_none=True)
            forward().square().mean().backward()
            optimizer.step()

        return run

    results = {}
    ours.train(), ref.train()
    results["train_step"] = paired_medians(
        step(ours, autocast(args, ours_forward), torch.optim.AdamW(ours.parameters())),
        step(ref, autocast(args, ref_forward), torch.optim.AdamW(ref.parameters())),
        args.repeats,
        device=device,
    )
    ours.eval(), ref.eval()
    with torch.inference_mode():
        results["inference"] = paired_medians(
            autocast(args, ours_forward), autocast(args, ref_forward), args.repeats, device=device
        )

    rows = {k: {"ours_ms": a * 1e3, "torch_ms": b * 1e3, "ratio": a / b} for k, (a, b) in results.items()}
    print(
        f"transformer vs torch.nn.Transformer, d={d} heads={args.heads} layers={args.layers}+{args.layers} "
        f"batch={args.batch} length={args.length}, {device_name(device)}{' bf16' if args.bf16 else ''}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    for name, row in rows.items():
        print(
            f"  {name:<11} ours {row['ours_ms']:8.2f} ms   torch {row['torch_ms']:8.2f} ms   ratio {row['ratio']:.2f}"
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "results": rows}, device)


if __name__ == "__main__":
    main()
