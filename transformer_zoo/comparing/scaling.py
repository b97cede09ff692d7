"""Time and memory against sequence length: how each variant's cost grows with its input.

:func:`measure_scaling` times a forward pass (inference) and a forward and backward pass (the
cost of a training step before the optimizer) of each model at growing lengths, and measures
their peak tensor memory with :class:`PeakMemory`. A variant with a sparse attention kind is
measured next to its *twins*: the same config with every self-attention replaced by a full
attention kind (``sdpa``: PyTorch's fused kernels; ``math``: the n x n weights written out),
so the ratios show what the sparse kernel saves.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Annotated, Any

import torch
from pydantic import Field, field_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..api import load_config
from ..core.options import VariantConfig
from ..core.validation import Options
from ..registry import get_registry
from .records import MODES, ScalingPoint


class ScalingSpec(Options):
    """Which models to measure at which lengths (a section of a compare spec)."""

    task: str | None = Field(
        None, description="the task kind whose model configs are measured (default: the spec's first task)"
    )
    lengths: list[Annotated[int, Field(ge=1)]] = Field(
        [512, 1024, 2048, 4096], min_length=1, description="sequence lengths, in tokens"
    )
    batch_size: int = Field(1, ge=1, description="sequences per measured batch")
    references: list[str] = Field(
        ["sdpa", "math"],
        description="full attention kinds; a variant with another kind is also measured with each of these in its place",
    )
    repeats: int = Field(3, ge=1, description="timed repeats after one warm-up; the median is reported")

    @field_validator("references")
    @classmethod
    def _full_kinds(cls, kinds: list[str]) -> list[str]:
        sparse = [kind for kind in kinds if not is_full(kind)]  # an unknown kind raises, naming the registered ones
        if sparse:
            full = sorted(k for k in get_registry().components("attention") if is_full(k))
            raise ValueError(f"references {sparse} are not full attention kinds; use some of {full}")
        return kinds


class PeakMemory(TorchDispatchMode):
    """The peak bytes of tensor storage alive at once among the storages created while active.

    Every operator's outputs are watched: a storage no input shares is new, counted until it is
    freed. The figure is exact and the same on every run, and excludes what existed before
    (weights, inputs). Not seen: allocator caching, a fused kernel's private workspace, storage
    grown in place (``resize_``, ``out=``), and what a higher-order operator such as an eager
    FlexAttention call allocates (it refuses to run under a dispatch mode).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._watched: set[int] = set()
        self._lock = threading.Lock()  # storages may be freed on an autograd worker thread

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if _has_storage(t)}
        for tensor in tree_leaves(out):
            if _has_storage(tensor):
                self._watch(tensor.untyped_storage(), inputs)
        return out

    def _watch(self, storage: torch.UntypedStorage, inputs: set[int]) -> None:
        key = id(storage)
        with self._lock:
            if key in inputs or key in self._watched:
                return
            size = storage.nbytes()
            self._watched.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        with self._lock:
            self._watched.discard(key)
            self.live -= size


def _has_storage(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def attention_kinds(config: VariantConfig) -> set[str]:
    """The self-attention kinds of the config's stacks."""
    stacks = [s for s in (getattr(config, "encoder", None), getattr(config, "decoder", None)) if s is not None]
    return {stack.attention_at(i).kind for stack in stacks for i in range(stack.layers)}


def is_full(kind: str) -> bool:
    """Whether the attention kind lets every query see every key the mask allows."""
    return get_registry().component("attention", kind).full


def twin(config: VariantConfig, kind: str) -> VariantConfig:
    """``config`` with every self-attention of kind ``kind``, keeping a ``bias`` option where
    both kinds have one (other options of the old kind do not apply to the new one)."""
    data = config.model_dump(mode="json")
    fields = get_registry().component("attention", kind).model_fields
    for side in ("encoder", "decoder"):
        if data.get(side):
            attention = data[side]["attention"]
            first = attention[0] if isinstance(attention, list) else attention
            data[side]["attention"] = {"kind": kind, **{k: v for k, v in first.items() if k == "bias" and k in fields}}
    return load_config(data)


def stretched(batch: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """The batch with every sequence tiled (along dim 1) to ``length`` tokens."""
    out = {}
    for key, value in batch.items():
        if value.dim() >= 2:
            reps = -(-length // value.shape[1])
            value = value.repeat(1, reps, *([1] * (value.dim() - 2)))[:, :length]
        out[key] = value
    return out


def median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    timed()  # warm-up: first-call allocations, lazy initialisation, compilation
    return statistics.median(timed() for _ in range(repeats))


def _peak_mb(fn: Callable[[], Any], device: torch.device) -> float:
    """On CUDA, the allocator's peak above what was allocated before (the kernels CUDA picks
    cannot all run under :class:`PeakMemory`); elsewhere, :class:`PeakMemory`'s exact count."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    with PeakMemory() as tracker:
        fn()
    return tracker.peak / 2**20


def measure(
    model: torch.nn.Module, task: Any, length: int, spec: ScalingSpec, device: torch.device
) -> dict[str, tuple[float, float]]:
    """``{mode: (seconds, peak MiB)}`` for ``model`` on a ``task`` batch stretched to ``length``."""
    test = task.dataset("test")
    rows = [test[i % len(test)] for i in range(spec.batch_size)]
    batch = {k: v.to(device) for k, v in stretched(task.collate(rows), length).items()}
    inputs = task.model_inputs(model, batch)

    def forward() -> None:
        with torch.no_grad():
            model(**inputs)

    def train() -> None:
        model.zero_grad(set_to_none=True)
        task.loss(model, batch).backward()

    model.eval()  # no dropout: both modes do the same arithmetic on every repeat
    return {
        mode: (median_seconds(fn, spec.repeats, device), _peak_mb(fn, device))
        for mode, fn in zip(MODES, (forward, train))
    }


def measure_scaling(
    models: list[tuple[str, VariantConfig]],
    task: Any,
    spec: ScalingSpec,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> list[ScalingPoint]:
    """Time and peak memory of each ``(label, config)`` and of its full-attention twins at each
    of ``spec.lengths``; each config's ``max_len`` is raised to the longest length if needed.
    Weights are freshly initialised (cost does not depend on training)."""
    device = torch.device(device)
    longest = max(spec.lengths)
    jobs = []
    for label, config in models:
        if getattr(config, "inputs", "tokens") != "tokens":
            print(f"scaling: {label} reads images, not sequences of a length; not measured", file=sys.stderr)
            continue
        if getattr(config, "max_len", longest) < longest:
            config = load_config(config, {"max_len": longest})
        jobs.append((label, "as configured", config))
        if not all(is_full(kind) for kind in attention_kinds(config)):  # a full-attention model is a reference itself
            jobs += [(label, kind, twin(config, kind)) for kind in spec.references]
    points = []
    bar = Progress(
        TextColumn("scaling"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[point]}"),
        console=Console(stderr=True),
        disable=not progress,
        transient=True,
    )
    with bar:
        points_done = bar.add_task("scaling", total=len(jobs) * len(spec.lengths), point="")
        for label, attention, config in jobs:
            torch.manual_seed(0)
            model = config.build().to(device)
            for length in spec.lengths:
                bar.update(points_done, point=f"{label} [{attention}] n={length}")
                try:
                    measured = {
                        mode: (*figures, None) for mode, figures in measure(model, task, length, spec, device).items()
                    }
                except RuntimeError as exc:  # out of memory, say: keep the other points
                    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    bar.console.print(
                        f"scaling: {label} [{attention}] at n={length} failed ({reason})", markup=False, highlight=False
                    )
                    measured = {mode: (None, None, reason) for mode in MODES}
                for mode, (seconds, peak, error) in measured.items():
                    points.append(
                        ScalingPoint(
                            variant=label,
                            attention=attention,
                            length=length,
                            mode=mode,
                            seconds=seconds,
                            peak_mb=peak,
                            error=error,
                        )
                    )
                bar.advance(points_done)
    return points
