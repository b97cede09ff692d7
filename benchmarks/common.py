"""Shared by the benchmarks: paired timing, so that two functions see the same machine load."""

from __future__ import annotations

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
