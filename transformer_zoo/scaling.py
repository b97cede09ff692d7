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
import time
import weakref
from collections.abc import Callable
from typing import Annotated, Any

import torch
from pydantic import BaseModel, Field, field_validator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .api import load_config
from .core.options import Options, VariantConfig
from .registry import get_registry

MODES = ("forward", "train")


class ScalingSpec(Options):
    """Which models to measure at which lengths (a section of a compare spec)."""

    task: str | None = Field(None, description="the task kind whose model configs are measured (default: the spec's first task)")
    lengths: list[Annotated[int, Field(ge=1)]] = Field(
        [512, 1024, 2048, 4096], min_length=1, description="sequence lengths, in tokens")
    batch_size: int = Field(1, ge=1, description="sequences per measured batch")
    references: list[str] = Field(
        ["sdpa", "math"],
        description="full attention kinds; a variant with another kind is also measured with each of these in its place",
    )
    repeats: int = Field(3, ge=1, description="timed repeats after one warm-up; the median is reported")

    @field_validator("references")
    @classmethod
    def _registered(cls, kinds: list[str]) -> list[str]:
        for kind in kinds:
            get_registry().component("attention", kind)  # an unknown kind raises, naming the registered ones
        return kinds


class ScalingPoint(BaseModel):
    """One model at one length in one mode."""

    variant: str = Field(description="the variant's label in the spec")
    attention: str = Field(description="'as configured', or the full attention kind of a twin")
    length: int = Field(description="tokens per sequence")
    mode: str = Field(description="'forward' (inference, no gradients) or 'train' (forward and backward)")
    seconds: float = Field(description="median wall time of one pass")
    peak_mb: float = Field(description="peak memory of the tensors the pass created (weights not counted), in MiB")


class PeakMemory(TorchDispatchMode):
    """The peak bytes of tensor storage alive at once among the storages created while active.

    Every operator's outputs are watched: a storage no input shares is new, counted until it is
    freed. The figure is exact, the same on every run and device, and excludes what existed
    before (weights, inputs); allocator caching and a fused kernel's private workspace are
    not seen.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._watched: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._watch(tensor.untyped_storage(), inputs)
        return out

    def _watch(self, storage: torch.UntypedStorage, inputs: set[int]) -> None:
        key = id(storage)
        if key in inputs or key in self._watched:
            return
        size = storage.nbytes()
        self._watched.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self._watched.discard(key)
        self.live -= size


def attention_kinds(config: VariantConfig) -> set[str]:
    """The self-attention kinds of the config's stacks."""
    data, kinds = config.model_dump(mode="json"), set()
    for side in ("encoder", "decoder"):
        if data.get(side):
            attention = data[side]["attention"]
            kinds |= {a["kind"] for a in (attention if isinstance(attention, list) else [attention])}
    return kinds


def twin(config: VariantConfig, kind: str) -> VariantConfig:
    """``config`` with every self-attention of kind ``kind`` (other options unchanged)."""
    data = config.model_dump(mode="json")
    for side in ("encoder", "decoder"):
        if data.get(side):
            data[side]["attention"] = {"kind": kind}
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


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and lazy initialisation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_mb(fn: Callable[[], Any]) -> float:
    with PeakMemory() as tracker:
        fn()
    return tracker.peak / 2**20


def measure(model: torch.nn.Module, task: Any, length: int, spec: ScalingSpec, device: torch.device) -> dict[str, tuple[float, float]]:
    """``{mode: (seconds, peak MiB)}`` for ``model`` on a ``task`` batch stretched to ``length``."""
    test = task.dataset("test")
    rows = [test[i % len(test)] for i in range(spec.batch_size)]
    batch = {k: v.to(device) for k, v in stretched(task.collate(rows), length).items()}
    inputs = {k: v for k, v in batch.items() if k != "targets"}

    def forward() -> None:
        with torch.no_grad():
            model(**inputs)

    def train() -> None:
        model.zero_grad(set_to_none=True)
        task.loss(model, batch).backward()

    model.eval()  # no dropout: both modes do the same arithmetic on every repeat
    return {mode: (_median_seconds(fn, spec.repeats), _peak_mb(fn)) for mode, fn in zip(MODES, (forward, train))}


def measure_scaling(models: list[tuple[str, VariantConfig]], task: Any, spec: ScalingSpec,
                    device: str | torch.device = "cpu", progress: bool = True) -> list[ScalingPoint]:
    """Time and peak memory of each ``(label, config)`` and of its full-attention twins at each
    of ``spec.lengths``; each config's ``max_len`` is raised to the longest length if needed.
    Weights are freshly initialised (cost does not depend on training)."""
    from tqdm.auto import tqdm

    device = torch.device(device)
    longest = max(spec.lengths)
    jobs = []
    for label, config in models:
        if getattr(config, "max_len", longest) < longest:
            config = load_config(config, {"max_len": longest})
        jobs.append((label, "as configured", config))
        if not attention_kinds(config) <= set(spec.references):  # a full-attention model is a reference itself
            jobs += [(label, kind, twin(config, kind)) for kind in spec.references]
    points = []
    bar = tqdm(total=len(jobs) * len(spec.lengths), desc="scaling", unit="point", disable=not progress)
    for label, attention, config in jobs:
        torch.manual_seed(0)
        model = config.build().to(device)
        for length in spec.lengths:
            bar.set_postfix_str(f"{label} [{attention}] n={length}")
            for mode, (seconds, peak) in measure(model, task, length, spec, device).items():
                points.append(ScalingPoint(variant=label, attention=attention, length=length, mode=mode,
                                           seconds=seconds, peak_mb=peak))
            bar.update()
    bar.close()
    return points
