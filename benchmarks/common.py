"""Shared by the benchmarks: where they run, paired timing (so that two functions see the same
machine load), and the JSON record each writes."""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written (the module's docstring), and each option's default after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def bench_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of the benchmark in ``module`` (its ``__name__``): ``tzoo bench NAME`` in its
    usage, its docstring as the description."""
    from . import BENCHMARKS

    if module == "__main__":  # python -m benchmarks.NAME: the module's own name is in its spec
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    name = next(name for name, (stem, *_) in BENCHMARKS.items() if module.rsplit(".", 1)[-1] == stem)
    return argparse.ArgumentParser(prog=f"tzoo bench {name}", description=doc, formatter_class=_HelpFormatter)


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--bf16``, the same in every benchmark."""
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where both sides run; auto: CUDA when available",
    )
    parser.add_argument("--bf16", action="store_true", help="run both sides under bfloat16 autocast")


def device_of(args: argparse.Namespace) -> torch.device:
    from transformer_zoo.training.placement import resolve_device

    return resolve_device(args.device)


def precision(args: argparse.Namespace) -> torch.autocast:
    """bfloat16 autocast on the benchmark's device with ``--bf16``; a disabled one without."""
    return torch.autocast(device_of(args).type, dtype=torch.bfloat16, enabled=args.bf16)


def autocast(args: argparse.Namespace, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` (a forward pass, not a backward or an optimizer step) under :func:`precision`."""

    @functools.wraps(fn)
    def run() -> object:
        with precision(args):
            return fn()

    return run


def paired_medians(
    ours: Callable[[], object],
    reference: Callable[[], object],
    repeats: int,
    warmup: int = 3,
    device: torch.device | None = None,
) -> tuple[float, float]:
    """Median seconds of each function, timed alternately so both see the same machine load, the
    one that goes first swapped every round (on CUDA each call is timed to the end of its kernels)."""
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        ours(), reference()
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(repeats):
        pairs = ((ours, times[0]), (reference, times[1]))
        for fn, bucket in pairs if round_ % 2 == 0 else pairs[::-1]:
            sync()
            start = time.perf_counter()
            fn()
            sync()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def device_name(device: torch.device | None = None) -> str:
    """``cpu``, or the GPU's name."""
    return torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else "cpu"


def write_json(path: str, record: dict, device: torch.device | None = None) -> None:
    """Write a benchmark's results to ``path``, with the machine and versions they were measured on
    (``device``: where the benchmark ran; None: the CPU)."""
    machine = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device_name(device),
    }
    with open(path, "w") as f:
        json.dump({"machine": machine, **record}, f, indent=2)


def sdpa_kernels(fn: Callable[[], object]) -> set[str]:
    """The kernels ``torch.nn.functional.scaled_dot_product_attention`` dispatched to while ``fn``
    ran (profiler names such as ``aten::_scaled_dot_product_flash_attention_for_cpu``,
    ``aten::_scaled_dot_product_flash_attention`` or ``aten::_scaled_dot_product_efficient_attention``
    on CUDA, or ``aten::_scaled_dot_product_attention_math`` for the unfused fallback)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:  # the aten operators are recorded on the host side
        fn()
    return {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}
