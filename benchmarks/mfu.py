"""Model FLOPs utilisation of a compiled bfloat16 training step, against the device's peak.

Each variant, at its preset size, trains on random token batches of ``--batch`` x ``--length``
(an encoder-decoder reads them as source and target) as ``tzoo train`` runs it with
``compile: true``: the model and its loss compiled in one graph, under bfloat16 autocast, then
the backward and AdamW (fused on CUDA). ``--eager-loss`` compiles the model alone and runs the
loss eagerly, to show what the loss costs. The FLOPs of one step's forward and backward are
counted by torch's ``FlopCounterMode`` on an eager step; the compiled step is timed (median of ``--repeats``, after
``--warmup`` steps that compile it). Reported: TFLOP/s, and the MFU against two references: the
device's data-sheet dense bf16 peak (``--peak-tflops``, else the known GPUs' figures that
``tzoo train`` uses) and a large bf16 matrix product measured in the same run.

    tzoo bench mfu [--variants transformer-base bert-base --batch 64 --length 256 --profile --device cuda]
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

import transformer_zoo as tz
from transformer_zoo.comparing.scaling import median_seconds
from transformer_zoo.training.step import datasheet_tflops, fused_adamw

from .common import add_device_options, bench_parser, device_name, device_of, write_json
from .throughput import random_batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, size: int, repeats: int = 10) -> float:
    """TFLOP/s of a ``size`` x ``size`` x ``size`` bfloat16 matrix product on random data."""
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    return 2 * size**3 / median_seconds(lambda: a @ b, repeats, device) / 1e12


def measure(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = tz.build_model(name, max_len=max(args.length, tz.load_config(name).max_len)).to(device).train()
    inputs, targets, tokens = random_batch(model, args.batch, args.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw(device))  # as tzoo train's

    def loss_of(module: torch.nn.Module) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return model.loss(module(**inputs), targets)

    with FlopCounterMode(display=False) as counter:
        loss_of(model).backward()
    flops = counter.get_total_flops()
    optimizer.zero_grad(set_to_none=True)
    mode = None if args.compile_mode == "default" else args.compile_mode
    if args.eager_loss:  # the model compiled alone
        compiled = torch.compile(model, mode=mode)
        trained_loss = functools.partial(loss_of, compiled)
    else:  # as tzoo train: the loss (a float32 cross-entropy over the vocabulary) in the model's graph
        trained_loss = torch.compile(lambda: loss_of(model), mode=mode)

    def step() -> None:
        trained_loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    _sync(device)
    warmup_seconds = time.perf_counter() - started
    seconds = median_seconds(step, args.repeats, device)
    row = {
        "variant": name,
        "loss": "eager" if args.eager_loss else "compiled",
        "compile_mode": args.compile_mode,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "length": args.length,
        "tokens": tokens,
        "flops_per_step": flops,
        "seconds": seconds,
        "warmup_seconds": warmup_seconds,
        "tflops": flops / seconds / 1e12,
        "tokens_per_second": tokens / seconds,
    }
    if args.profile:
        row["profile"] = profile(step, device)
    return row


def profile(step, device: torch.device, steps: int = 3) -> str:
    """Where a step's time goes: the profiler's table of the costliest kernels over ``steps`` steps."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument(
        "--variants", nargs="+", default=["transformer-base", "bert-base"], help="registered variants to measure"
    )
    parser.add_argument("--batch", type=int, default=64, help="examples per batch")
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (they compile)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side (the median is reported)")
    parser.add_argument(
        "--matmul-size", type=int, help="side of the reference matrix product (default: 8192 on CUDA, 1024 on the CPU)"
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="the device's dense bf16 peak (default: the data sheet's, for known GPUs)"
    )
    parser.add_argument("--profile", action="store_true", help="print the costliest kernels of three steps")
    parser.add_argument(
        "--eager-loss",
        action="store_true",
        help="compile the model alone and run its loss eagerly (tzoo train compiles them together)",
    )
    parser.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
        default="default",
        help="torch.compile's mode (tzoo train compiles with the default; "
        "reduce-overhead replays the step's kernels as CUDA graphs)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    matmul = matmul_tflops(device, args.matmul_size or (8192 if device.type == "cuda" else 1024))
    peak = args.peak_tflops or datasheet_tflops(device)
    print(
        f"compiled bf16 training step on {device_name(device)}: bf16 matrix product {matmul:.3g} TFLOP/s, "
        f"data-sheet peak {peak or 'unknown'} TFLOP/s, torch {torch.__version__}"
    )
    rows = []
    for name in args.variants:
        row = measure(name, args, device)
        row["mfu_vs_matmul"] = row["tflops"] / matmul
        row["mfu"] = None if peak is None else row["tflops"] / peak
        rows.append(row)
        mfu = "" if row["mfu"] is None else f"  MFU {row['mfu']:.1%} of the data sheet's peak,"
        print(
            f"{name:>18} ({row['loss']} loss, {args.compile_mode}): batch {row['batch']} x {row['length']}, "
            f"{1e3 * row['seconds']:.1f} ms a step, "
            f"{row['tflops']:.3g} TFLOP/s,{mfu} {row['mfu_vs_matmul']:.1%} of the matrix product's rate "
            f"(compiling took {row['warmup_seconds']:.0f} s)",
            flush=True,
        )
        if args.profile:
            print(row["profile"], flush=True)
    if args.json:
        write_json(args.json, {"args": vars(args), "matmul_tflops": matmul, "peak_tflops": peak, "rows": rows}, device)


if __name__ == "__main__":
    main()
