"""Shared by the benchmarks: paired timing, so that two functions see the same machine load,
and the JSON record each writes."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable


def paired_medians(ours: Callable[[], object], reference: Callable[[], object], repeats: int,
                   warmup: int = 3) -> tuple[float, float]:
    """Median seconds of each function, timed alternately so both see the same machine load."""
    for _ in range(warmup):
        ours(), reference()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, bucket in ((ours, times[0]), (reference, times[1])):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def write_json(path: str, record: dict, device: str = "cpu") -> None:
    """Write a benchmark's results to ``path``, with the machine and versions they were measured on
    (``device``: where the benchmark ran)."""
    import torch

    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device}
    with open(path, "w") as f:
        json.dump({"machine": machine, **record}, f, indent=2)


def sdpa_kernels(fn: Callable[[], object]) -> set[str]:
    """The kernels ``torch.nn.functional.scaled_dot_product_attention`` dispatched to while ``fn``
    ran (profiler names such as ``aten::_scaled_dot_product_flash_attention_for_cpu``, or
    ``aten::_scaled_dot_product_attention_math`` for the unfused fallback)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}
