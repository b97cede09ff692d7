"""Where dense attention stops paying: a pattern's own kernel (chunked band, gathered blocks,
blocked local 2-D) against SDPA under the pattern's explicit mask, by number of keys.

Each measurement is one training pass of the attention alone (forward and backward, no
dropout) through :class:`~transformer_zoo.core.local_attention.PatternKernel` with its choice
forced, the two timed alternately. A ratio above 1 means dense is slower; ``auto`` computes
densely up to :data:`~transformer_zoo.core.local_attention.DENSE_UP_TO` keys.

    python -m benchmarks.dense_threshold [--keys 64 256 1024 --batch 8 --heads 4 --head-dim 16]
"""

from __future__ import annotations

import argparse
import math

import torch

from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.local_attention import DENSE_UP_TO, PatternKernel
from transformer_zoo.plugins.image.kernels import Local2dPattern
from transformer_zoo.plugins.local_global.kernels import Pattern

from .common import add_device_options, bench_parser, device_of, paired_medians, precision, write_json


def patterns(keys: int) -> dict[str, object]:
    """The patterns measured at ``keys`` keys (local 2-D on a square grid of that many cells)."""
    side = math.isqrt(keys)
    return {
        "band, window 16": Pattern(window=16),
        "BigBird, blocks of 16": Pattern(block=16, window=1, global_positions=tuple(range(16)), random_blocks=1),
        f"local 2-D, {side}x{side}, 2x2 blocks, margin 2": Local2dPattern(
            grid=(side, side), query_block=(2, 2), memory=(2, 2)
        ),
    }


def training_pass(kernel: PatternKernel, qkv: list[torch.Tensor], args: argparse.Namespace):
    def run() -> None:
        with precision(args):
            out, _ = kernel(*qkv, AttentionMask(), None, 0.0, False)
        out.float().sum().backward()

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--keys", type=int, nargs="+", default=[64, 256, 1024], help="sequence lengths (squares)")
    parser.add_argument("--batch", type=int, default=8, help="examples per batch")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=16, help="width of each head")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", type=str, default=None, metavar="PATH", help="also write the results as JSON")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    print(
        f"training pass of the attention, batch {args.batch}, {args.heads} heads of {args.head_dim}, on "
        f"{device.type}; auto is dense up to {DENSE_UP_TO} keys"
    )
    print(f"{'pattern':>44} {'keys':>6} {'own ms':>8} {'dense ms':>9} {'dense / own':>12}")
    rows = []
    for keys in args.keys:
        for name, pattern in patterns(keys).items():
            qkv = [
                torch.randn(args.batch, args.heads, keys, args.head_dim, device=device, requires_grad=True)
                for _ in range(3)
            ]
            own = training_pass(PatternKernel(pattern, pattern.own_kernel), qkv, args)
            dense = training_pass(PatternKernel(pattern, "dense"), qkv, args)
            own_s, dense_s = paired_medians(own, dense, args.repeats, device=device)
            rows.append({"pattern": name, "keys": keys, "own_seconds": own_s, "dense_seconds": dense_s})
            print(f"{name:>44} {keys:6d} {own_s * 1e3:8.2f} {dense_s * 1e3:9.2f} {dense_s / own_s:11.2f}x", flush=True)
    if args.json:
        write_json(args.json, {"benchmark": "dense-threshold", "rows": rows}, device)


if __name__ == "__main__":
    main()
