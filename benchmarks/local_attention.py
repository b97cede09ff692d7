"""Time and peak memory of the sparse attention kernels against full attention, by length.

For each length n and each method, q, k, v ``(1, heads, n, 64)`` are allocated, the forward
(or forward and backward) pass runs once to warm up, then ``--repeats`` times, and the report
gives the median time, the exact peak of the tensors one pass creates
(:class:`~transformer_zoo.comparing.scaling.PeakMemory`) and the growth of the peak memory over what the
inputs took: on the CPU each measurement has a fresh process, whose peak resident memory is
read; on CUDA they share one process, and the allocator's peak is reset for each (it is read
for SDPA's kernel too, which the dispatch mode sees, and FlexAttention, which it does not). The
kernel SDPA dispatched to is recorded for its forward rows. Full attention is
measured twice: ``sdpa`` (PyTorch's fused kernel, which does not store the n x n matrix on
CPU) and ``math`` (the formula written out, which does). The time ratio of each method
against ``sdpa`` at the same length is printed; a plot of memory and time against length is
written with ``--plot``.

    python -m benchmarks.local_attention [--lengths 1024 4096 16384 --window 256 --repeats 3 --plot out.png --device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from transformer_zoo.comparing.scaling import PeakMemory
from transformer_zoo.core.attention import attention_math
from transformer_zoo.core.local_attention import flex_attention_kernel
from transformer_zoo.plugins.local_global.kernels import Pattern, chunked_attention

from .common import add_device_options, bench_parser, device_name, device_of, sdpa_kernels, write_json

METHODS = ("sdpa", "math", "sliding-window", "dilated", "block-local", "local-global", "block-sparse")
FLEX_METHODS = ("flex-sliding-window", "flex-block-local", "flex-local-global", "flex-block-sparse")
"""Compiled FlexAttention with each pattern's block mask (built once, then reused as by the
layers of a model); forward only on CPU."""


def pattern(method: str, window: int) -> Pattern | None:
    return {
        "sliding-window": Pattern(window=window),
        "dilated": Pattern(window=window // 2, dilation=2),
        "block-local": Pattern(block=window),
        "local-global": Pattern(window=window, global_positions=(0,)),
        "block-sparse": Pattern(block=64, window=1, global_positions=tuple(range(64)), random_blocks=2),
    }.get(method.removeprefix("flex-"))


def _measure(args: tuple[str, int, int, int, bool, int, str, bool, bool | None]) -> dict:
    method, n, heads, window, backward, repeats, device, bf16, batched = args
    cuda = device == "cuda"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    q, k, v = (torch.randn(1, heads, n, 64, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
    before = None if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB
    p = pattern(method, window)
    if method in FLEX_METHODS:  # each compiled as if alone: on CUDA the measurements share a process, and past
        torch._dynamo.reset()  # dynamo's recompile limit the block mask would be built eagerly, n x n

    def run():
        if method == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        elif method == "math":
            out, _ = attention_math(q, k, v)
        elif method in FLEX_METHODS:
            out = flex_attention_kernel(q, k, v, p)
        else:
            out = chunked_attention(q, k, v, p, batched=batched)
        if backward:
            out.sum().backward()
        return out

    with torch.set_grad_enabled(backward):
        run()  # warm-up: compiling, library handles, first allocations
    q.grad = k.grad = v.grad = None
    if cuda:  # the allocator's peak from here on, above what is allocated now
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated() / 1024
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.set_grad_enabled(backward):
            run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    after = torch.cuda.max_memory_allocated() / 1024 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = (after - before) / 1024  # kB -> MB
    tensor_mb = None
    if method not in FLEX_METHODS:  # FlexAttention is a higher-order operator, which a dispatch mode cannot watch
        with PeakMemory() as tensors, torch.set_grad_enabled(backward):
            run()
        tensor_mb = tensors.peak / 2**20
    kernels = sorted(sdpa_kernels(run)) if method == "sdpa" and not backward else None  # which fused kernel ran
    return {
        "method": method,
        "n": n,
        "pass": "forward+backward" if backward else "forward",
        "seconds": statistics.median(times),
        "peak_mb": peak,
        "tensor_mb": tensor_mb,
        "kernels": kernels,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths for every method"
    )
    parser.add_argument("--long", type=int, nargs="*", default=[65536], help="lengths for the chunked kernels only")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--window", type=int, default=256, help="keys each query sees on each side (sliding window)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (the median is reported)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=(*METHODS, *FLEX_METHODS),
        help="the flex-* methods (compiled FlexAttention) are not in the default list: they compile in each process",
    )
    parser.add_argument(
        "--chunks",
        choices=("auto", "loop", "batched"),
        default="auto",
        help="how the chunked kernels compute their chunks: a Python loop (a CPU's default), all in "
        "one call (a GPU's), or the device's default",
    )
    parser.add_argument("--backward", action="store_true", help="also time forward+backward")
    parser.add_argument("--plot", help="write a PNG of memory and time against length")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    print(f"attention kernels on {device_name(device)}{' in bf16' if args.bf16 else ''}", flush=True)
    passes = [False, True] if args.backward else [False]
    common = (args.heads, args.window)
    timing = (args.repeats, device.type, args.bf16, {"auto": None, "loop": False, "batched": True}[args.chunks])
    no_backward = device.type == "cpu"  # FlexAttention has no CPU backward
    jobs = [
        (m, n, *common, b, *timing)
        for n in args.lengths
        for m in args.methods
        for b in passes
        if not (b and m in FLEX_METHODS and no_backward)
    ]
    jobs += [
        (m, n, *common, b, *timing)
        for n in args.long
        for m in args.methods
        if m not in ("sdpa", "math")
        for b in passes
        if not (b and m in FLEX_METHODS and no_backward)
    ]
    rows = []
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":  # the allocator's peak is reset for each measurement: one process serves
            measured = map(_measure, jobs)
        else:  # one fresh process per measurement: its own peak resident memory
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1))
            measured = pool.imap(_measure, jobs)
        for row in measured:
            rows.append(row)
            print(
                f"{row['method']:>19} n={row['n']:>6} {row['pass']:>17}: {1e3 * row['seconds']:10.2f} ms "
                f"{row['tensor_mb'] or float('nan'):9.1f} MiB tensors {row['peak_mb']:9.1f} MB "
                f"{'allocated' if device.type == 'cuda' else 'resident'}"
                f"{'  ' + ', '.join(row['kernels']) if row['kernels'] else ''}",
                flush=True,
            )
    reference = {(r["n"], r["pass"]): r["seconds"] for r in rows if r["method"] == "sdpa"}
    for row in rows:
        if (row["n"], row["pass"]) in reference:
            row["time_vs_sdpa"] = row["seconds"] / reference[(row["n"], row["pass"])]
    print("\ntime against sdpa at the same length:")
    for row in rows:
        if "time_vs_sdpa" in row and row["method"] != "sdpa":
            print(f"{row['method']:>19} n={row['n']:>6} {row['pass']:>17}: {row['time_vs_sdpa']:.3f}")
    if args.json:
        write_json(args.json, {"args": vars(args), "rows": rows}, device)
    if args.plot:
        plot(rows, args.plot, allocated=device.type == "cuda")


def plot(rows: list[dict], path: str, allocated: bool = False) -> None:
    """Memory and time against length, a line per method. ``allocated``: plot the CUDA allocator's
    peak (every method has one), not the tensor peak (which FlexAttention has not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    shown = "forward+backward" if any(r["pass"] == "forward+backward" for r in rows) else "forward"
    memory = "peak_mb" if allocated else "tensor_mb"
    for method in dict.fromkeys(r["method"] for r in rows):
        points = sorted((r["n"], r[memory], r["seconds"]) for r in rows if r["method"] == method and r["pass"] == shown)
        axes[0].plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        axes[1].plot([p[0] for p in points], [p[2] for p in points], marker="o", label=method)
    memory_label = "peak allocated memory (MB)" if allocated else "peak tensor memory (MiB)"
    axes[0].set(xscale="log", yscale="log", xlabel="sequence length", ylabel=memory_label, title=f"memory, {shown}")
    axes[1].set(xscale="log", yscale="log", xlabel="sequence length", ylabel="time (s)", title=f"time, {shown}")
    lengths = sorted({r["n"] for r in rows})
    for axis in axes:  # a tick at each measured length, no minor labels to collide with them
        axis.set_xticks(lengths, [f"{n:,}" for n in lengths])
        axis.xaxis.set_minor_formatter(NullFormatter())
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
