"""What a comparison records: one :class:`RunRecord` per run, the statistics of each task
(:class:`TaskSummary`), and :class:`CompareResults`, the contents of ``results.json``.

Data only: the runner writes these, and the summary, the report and the plots read them. This
module imports none of those.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ..core.tasks import Better

ALPHA = 0.05
"""The significance level of every test and the complement of every interval's confidence."""

TestKind = Literal["welch", "permutation"]
"""The tests a comparison may run on two variants' scores (:data:`~.stats.TEST_NAMES` names them)."""

MODES = ("forward", "train")
"""How a scaling point is measured: inference, or a training step."""
MODE_NAMES = {"forward": "forward (inference)", "train": "forward + backward"}


class ScalingPoint(BaseModel):
    """One model at one length in one mode."""

    variant: str = Field(description="the variant's label in the spec")
    attention: str = Field(description="'as configured', or the full attention kind of a twin")
    length: int = Field(description="tokens per sequence")
    mode: str = Field(description="'forward' (inference, no gradients) or 'train' (forward and backward)")
    seconds: float | None = Field(description="median wall time of one pass (None: it failed)")
    peak_mb: float | None = Field(
        description="peak memory of the tensors the pass created (weights not counted), in MiB (None: it failed)"
    )
    error: str | None = Field(None, description="why the pass failed (out of memory, say), if it did")

    @property
    def label(self) -> str:
        """The measured model's name: the variant, with a twin's full attention kind in brackets."""
        return self.variant if self.attention == "as configured" else f"{self.variant} [{self.attention}]"


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
        "PeakMemory; on CUDA, the allocator's peak over the run"
    )
    steps: int = Field(description="optimizer steps taken")
    wall_seconds: float = Field(
        description="wall time of the run, evaluation included: for a run started more than once, from its first "
        "start to its end, so the time lost to a dead worker or node counts (the report's 'wall s' column and its "
        "cost tests use this total)"
    )
    last_attempt_seconds: float | None = Field(
        None, description="wall time of its last start alone (equal to wall_seconds for a run started once)"
    )
    started: str = Field("", description="when the run started (UTC, ISO 8601)")
    timespan: tuple[float, float] | None = Field(
        None,
        description="when its last start began training and when its record was written (Unix seconds): runs "
        "whose timespans overlap trained at once",
    )
    threads: int = Field(0, description="the CPU threads the run trained with")
    cpus: int = Field(0, description="the cores available to the run's process")
    load_average: float = Field(
        0.0,
        description="the machine's 1-minute load average, the larger of its values at the start and the end of "
        "training (the comparison's own runs included): one or more above cpus, other work competed with the run",
    )
    invocation: str = Field("", description="the compare invocation that ran it (its unique id)")
    reused: bool = Field(
        False, description="finished by an earlier invocation and kept: its costs were measured under other conditions"
    )
    placed_on: str = Field(
        "", description="where it trained: the device of a local worker, or a Ray node (ID@HOST) and its CPU or GPUs"
    )
    attempts: int = Field(
        1,
        description="times its invocation started it: more than one, it was retried after its "
        "worker died, from its last checkpoint",
    )
    resumed_from: int | None = Field(
        None, description="the checkpoint step its last start resumed from; None: from scratch"
    )
    run_folder: str = Field("", description="its run folder (in the run cache), relative to the report when under it")
    metric: str = Field(description="the task's headline metric")
    metrics: dict[str, dict[str, float]] = Field(description="metrics by evaluation split")
    better: dict[str, Better] = Field(
        description="which way each metric is better, as the task declares it (its metrics); every metric of "
        "the record has one",
    )
    bounds: dict[str, tuple[float, float]] = Field(
        {},
        description="the range (low, high) each bounded metric's values lie in, as the task declares it (its "
        "bounds: an accuracy (0, 1), BLEU (0, 100)); a metric absent here, and every metric of a record written "
        "without bounds, is unbounded",
    )
    curve: list[dict[str, float]] = Field(
        description="the learning curve: step, loss, lr, and test metrics when evaluated"
    )
    ponder_time: dict[str, float] = Field(
        {}, description="models with a recurrent stack: mean steps per real test position, by stack (fixed without ACT)"
    )
    ponder_plot: str | None = Field(
        None, description="a heat map of one test example's ponder times, relative to the report"
    )
    probes: dict[str, float] = Field({}, description="the spec's probes of the trained model, by measurement name")
    samples_plot: str | None = Field(None, description="a generation task: a grid of samples, relative to the report")
    width: int | None = Field(None, description="the model's width (d_model); None: not recorded")
    aggregate_of: list[str] = Field(
        [],
        description="a suite's aggregate, not a run: the tasks whose headline metric it averages for this variant "
        "and seed (its costs are their sums); empty for a run",
    )
    tuning_seconds: float | None = Field(
        None,
        description="wall seconds of the tuning trials that chose this variant's setting on this task (the "
        "spec's tune:), the same for each of its seeds; None: not tuned",
    )
    shared: list[str] = Field(
        [],
        description="pairing: seeds: the parameters (by name) whose initial values came from an earlier variant "
        "of the spec at the same seed, their names and shapes agreeing; empty for the first variant on a task, "
        "and without pairing",
    )
    own: list[str] = Field(
        [],
        description="pairing: seeds: the parameters (by name) that kept their own initial values (every one, for "
        "the first variant on a task); empty without pairing",
    )
    shared_weights: int = Field(
        0, description="the weights (elements) of the shared parameters, a share of the parameters count"
    )

    @model_validator(mode="after")
    def _every_direction(self) -> RunRecord:
        names = {self.metric, *(name for scores in self.metrics.values() for name in scores)}
        if missing := sorted(names - self.better.keys()):
            raise ValueError(
                f"better gives no direction for the metrics {missing}; give each metric 'higher' or 'lower' "
                "(the task's metrics declare them)"
            )
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
    """A column's mean over a variant's seeds and its 95% interval (none for one seed), computed
    on the column's scale; the interval contains the mean."""

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
    scale: Literal["linear", "log", "arcsine-sqrt"] = Field(
        "linear",
        description="the scale of its cells' Student-t intervals: 'linear' (unbounded), 'log' (a cost: "
        "positive), 'arcsine-sqrt' (a metric with bounds), each mapped back to the column's units",
    )
    bounds: tuple[float, float] | None = Field(
        None, description="the range its values lie in, as the task declares it; None: unbounded"
    )
    decimals: int = Field(
        3,
        description="the decimals every number of the column is written with (means, interval "
        "ends and differences; 0 when a value reaches 1,000 or every value is whole), with "
        "thousands separators",
    )


class Test(BaseModel):
    """A variant's difference from the reference in one metric column, over seeds."""

    variant: str
    reference: str
    column: str
    difference: float = Field(description="the variant's mean minus the reference's")
    low: float | None = Field(description="the difference's 95% interval (Welch-Satterthwaite, or the paired t's)")
    high: float | None
    p: float | None = Field(description="two-sided p of the test; None: fewer than two seeds on a side, no test")
    test: TestKind | Literal["paired"] = Field(description="the test: the spec's, or paired (pairing: seeds)")
    separable: bool = Field(description=f"p < {ALPHA}")
    p_holm: float | None = Field(
        None,
        description="p adjusted by Holm's step-down correction over every test of "
        "the task (each metric column, each variant against the reference)",
    )
    survives_holm: bool = Field(False, description=f"p_holm < {ALPHA}: separable once every test of the task counts")


class TaskSummary(BaseModel):
    """One task's statistics."""

    task: str
    headline: str = Field(description="the headline column: the task's metric on its test split")
    reference: str = Field(description="the variant every other is tested against")
    test: TestKind | Literal["paired"] = Field(description="the test of the differences: the spec's, or paired")
    seeds: int = Field(description="the fewest seeds any variant ran")
    columns: list[Column]
    cells: dict[str, dict[str, Cell]] = Field(description="variant -> column -> mean and interval")
    tests: list[Test] = Field(
        description="every other variant against the reference, in each metric column, with "
        "Holm's correction over them all"
    )
    best: str | None = Field(description="the headline's winner, when separable from every other variant")
    leaders: list[str] = Field(description="the best headline mean's variant and those not separable from it")
    verdict: str = Field(description="the headline finding in words")
    costs_comparable: bool = Field(description="every run of the task ran in this invocation, so times compare")
    cost_ratios: dict[str, dict[str, float]] = Field(
        description="variant -> cost column -> its mean over the reference's (times only when costs_comparable)"
    )


class TrialRecord(BaseModel):
    """One trial of a study."""

    number: int
    values: dict[str, Any] = Field(description="the setting it tried, by path")
    value: float | None = Field(description="its validation score at the end (None: pruned or failed)")
    state: Literal["complete", "pruned", "failed", "running"]
    steps: int = Field(description="steps it trained before it ended or was pruned")
    seconds: float = Field(description="wall seconds it took")
    scores: dict[int, float] = Field({}, description="its validation score by step (the rungs it reached)")


class Tuned(BaseModel):
    """What tuning found for one variant on one task."""

    variant: str
    task: str
    metric: str = Field(description="the objective: the task's headline metric on the validation split")
    direction: Literal["maximize", "minimize"]
    best: dict[str, Any] = Field(description="the chosen setting, by path; empty: no trial finished, the spec's own")
    best_value: float | None
    trials: list[TrialRecord]
    steps: int = Field(description="steps of a trial that runs to the end")
    seconds: float = Field(description="wall seconds of every trial together: the tuning budget it spent")
    trained_steps: int = Field(description="steps every trial trained together")
    saved_steps: int = Field(description="steps the pruned trials did not train")

    @property
    def top(self) -> list[TrialRecord]:
        """The best quarter of the finished trials (at least two, when two finished), best first."""
        done = sorted(
            (t for t in self.trials if t.value is not None), key=lambda t: t.value, reverse=self.direction == "maximize"
        )
        return done[: max(2, math.ceil(len(done) / 4))]

    def best_so_far(self) -> list[float | None]:
        """The best finished score after each trial, in trial order."""
        best, out = None, []
        for trial in sorted(self.trials, key=lambda t: t.number):
            if trial.value is not None and (best is None or (trial.value > best) == (self.direction == "maximize")):
                best = trial.value
            out.append(best)
        return out


class CompareResults(BaseModel):
    """The contents of results.json."""

    spec: dict[str, Any] = Field(description="the spec as run")
    machine: dict[str, Any] = Field(description="where it ran")
    invocation: str = Field("", description="this invocation's unique id; a run of another was reused")
    started: str = Field("", description="when this invocation began (UTC, ISO 8601)")
    runs: list[RunRecord] = Field(description="one record per run")
    skipped: list[Skipped] = Field(description="pairs not run, with the reason")
    failed: list[Failed] = Field(
        [], description="runs that did not finish, with what went wrong; the others are summarized without them"
    )
    baselines: dict[str, dict[str, float]] = Field(
        {}, description="by task: test scores of a reference predictor (the majority class), where the task has one"
    )
    baseline_names: dict[str, str] = Field({}, description="by task: what its baseline is")
    scaling: list[ScalingPoint] = Field([], description="time and memory against sequence length, when the spec asks")
    tuning: list[Tuned] = Field([], description="by variant and task: what tuning tried and chose, when the spec asks")
    summaries: list[TaskSummary] = Field(
        [],
        description="by task: every column's mean and 95% interval over seeds, each variant tested against the "
        "reference, and the verdict",
    )

    @property
    def trained(self) -> list[RunRecord]:
        """The runs, without the suites' aggregates."""
        return [run for run in self.runs if not run.aggregate_of]

    def by_seed(self, variant: str, task: str, split: str, metric: str) -> dict[int, float]:
        """A variant's figure on ``task`` by the seed of each of its runs: a probe's measurement
        ``metric``, or else the metric on ``split``."""
        found = {}
        for run in self.runs:
            if run.variant == variant and run.task == task:
                value = run.probes.get(metric, run.metrics.get(split, {}).get(metric))
                if value is not None:
                    found[run.seed] = value
        return found
