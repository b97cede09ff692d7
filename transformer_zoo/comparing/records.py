"""What a comparison records: one :class:`RunRecord` per run, the statistics of each task
(:class:`TaskSummary`), and :class:`CompareResults`, the contents of ``results.json``.

Data only: the runner writes these, and the summary, the report and the plots read them. This
module imports none of those.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ..core.tasks import Better, declared_metrics
from ..registry import get_registry
from .scaling import ScalingPoint
from .stats import ALPHA, TestKind


class RunRecord(BaseModel):
    """One run of one variant on one task with one seed."""

    variant: str = Field(description="the variant's label in the spec")
    family: str = Field(description="the variant's family")
    task: str = Field(description="the task kind")
    seed: int = Field(description="the run's seed")
    parameters: int = Field(description="trainable parameters (tied weights counted once)")
    flops_per_token: float = Field(
        description="training FLOPs per token read: forward and backward of one batch, counted by torch's FlopCounterMode"
    )
    train_tokens_per_second: float = Field(description="tokens read by the model per second of training")
    peak_memory_mb: float = Field(
        description="peak memory (MiB) of training: on CPU, the tensor storage alive at once during one training "
        "step on the run's first batch (weights, gradients, AdamW state and activations), counted exactly by "
        "PeakMemory; on CUDA, the allocator's peak over the run")
    steps: int = Field(description="optimizer steps taken")
    wall_seconds: float = Field(description="wall time of the run, evaluation included")
    started: str = Field("", description="when the run started (UTC, ISO 8601)")
    threads: int = Field(0, description="the CPU threads the run trained with")
    cpus: int = Field(0, description="the cores available to the run's process")
    load_average: float = Field(
        0.0, description="the machine's 1-minute load average, the larger of its values at the start and the end of "
        "training (the comparison's own runs included): one or more above cpus, other work competed with the run")
    invocation: str = Field("", description="the compare invocation that ran it (its start time)")
    reused: bool = Field(
        False, description="finished by an earlier invocation and kept: its costs were measured under other conditions")
    placed_on: str = Field("", description="where it trained: the device of a local worker, or a Ray node and its GPUs")
    attempts: int = Field(1, description="times its invocation started it: more than one, it was retried after its "
                          "worker died, from its last checkpoint")
    resumed_from: int | None = Field(None, description="the checkpoint step its last start resumed from; None: from "
                                     "scratch")
    run_folder: str = Field("", description="its run folder (in the run cache), relative to the report when under it")
    metric: str = Field(description="the task's headline metric")
    metrics: dict[str, dict[str, float]] = Field(description="metrics by evaluation split")
    better: dict[str, Better] = Field(
        {}, description="which way each metric is better, as the task declares it (its metrics); a metric a record "
        "does not give takes the direction the tasks that declare its name give it (higher where none does)")
    curve: list[dict[str, float]] = Field(description="the learning curve: step, loss, lr, and test metrics when evaluated")
    ponder_time: dict[str, float] = Field(
        {}, description="models with a recurrent stack: mean steps per real test position, by stack (fixed without ACT)"
    )
    ponder_plot: str | None = Field(None, description="a heat map of one test example's ponder times, relative to the report")
    probes: dict[str, float] = Field({}, description="the spec's probes of the trained model, by measurement name")
    samples_plot: str | None = Field(None, description="a generation task: a grid of samples, relative to the report")

    @model_validator(mode="after")
    def _every_direction(self) -> RunRecord:
        names = {self.metric, *(name for scores in self.metrics.values() for name in scores)}
        if not names <= self.better.keys():  # written before records carried them, or by hand
            get_registry()  # the plugins' task classes are imported, with what they declare
            declared = declared_metrics()
            self.better = {**{name: declared.get(name, "higher") for name in sorted(names)}, **self.better}
        return self

class Failed(BaseModel):
    """A run that did not finish: its error, or the worker that died once more than it may be retried."""

    variant: str = Field(description="the variant's label")
    task: str = Field(description="the task kind")
    seed: int = Field(description="the run's seed")
    attempts: int = Field(description="times it was started")
    error: str = Field(description="what went wrong")
    run_folder: str = Field("", description="its run folder, which keeps its last checkpoint")


class Skipped(BaseModel):
    """A variant and task that were not run, and why."""

    variant: str = Field(description="the variant's label")
    task: str = Field(description="the task kind")
    reason: str = Field(description="why the variant cannot do the task")


class Cell(BaseModel):
    """A column's mean over a variant's seeds and its Student-t 95% interval (none for one seed)."""

    mean: float
    low: float | None = None
    high: float | None = None
    n: int = Field(description="runs (seeds) averaged")


class Column(BaseModel):
    """One column of a task's table."""

    name: str = Field(description="e.g. 'test accuracy', 'train tokens/s'")
    kind: Literal["metric", "ponder", "probe", "cost"]
    better: Literal["higher", "lower"] | None = Field(description="which way is better; None: neither (a size)")
    best: str | None = Field(None, description="the variant whose mean is best and separable from every other's")


class Test(BaseModel):
    """A variant's difference from the reference in one metric column, over seeds."""

    variant: str
    reference: str
    column: str
    difference: float = Field(description="the variant's mean minus the reference's")
    low: float | None = Field(description="the difference's 95% interval (Welch-Satterthwaite)")
    high: float | None
    p: float | None = Field(description="two-sided p of the test; None: fewer than two seeds on a side, no test")
    test: TestKind
    separable: bool = Field(description=f"p < {ALPHA}")


class TaskSummary(BaseModel):
    """One task's statistics."""

    task: str
    headline: str = Field(description="the headline column: the task's metric on its test split")
    reference: str = Field(description="the variant every other is tested against")
    test: TestKind
    seeds: int = Field(description="the fewest seeds any variant ran")
    columns: list[Column]
    cells: dict[str, dict[str, Cell]] = Field(description="variant -> column -> mean and interval")
    tests: list[Test] = Field(description="every other variant against the reference, in each metric column")
    best: str | None = Field(description="the headline's winner, when separable from every other variant")
    leaders: list[str] = Field(description="the best headline mean's variant and those not separable from it")
    verdict: str = Field(description="the headline finding in words")
    costs_comparable: bool = Field(description="every run of the task ran in this invocation, so times compare")
    cost_ratios: dict[str, dict[str, float]] = Field(
        description="variant -> cost column -> its mean over the reference's (times only when costs_comparable)")


class CompareResults(BaseModel):
    """The contents of results.json."""

    spec: dict[str, Any] = Field(description="the spec as run")
    machine: dict[str, Any] = Field(description="where it ran")
    invocation: str = Field("", description="this invocation (its start time); a run of another was reused")
    runs: list[RunRecord] = Field(description="one record per run")
    skipped: list[Skipped] = Field(description="pairs not run, with the reason")
    failed: list[Failed] = Field([], description="runs that did not finish, with what went wrong; the others are "
                                 "summarized without them")
    baselines: dict[str, dict[str, float]] = Field(
        {}, description="by task: test scores of a reference predictor (the majority class), where the task has one"
    )
    baseline_names: dict[str, str] = Field({}, description="by task: what its baseline is")
    scaling: list[ScalingPoint] = Field([], description="time and memory against sequence length, when the spec asks")
    summaries: list[TaskSummary] = Field(
        [], description="by task: every column's mean and 95% interval over seeds, each variant tested against the "
        "reference, and the verdict")
