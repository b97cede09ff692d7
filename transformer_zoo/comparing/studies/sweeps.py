"""A study's sweep: one training option over a grid of values for some of the spec's variants, and
how sensitive each swept variant's final loss is to it.

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities",
section 2.2, eq. 1) summarise a learning-rate sweep by its **LR sensitivity**::

    sensitivity = E_{eta in [a, b]} [ min(loss(eta), loss_0) - loss* ]

the mean over the grid's values (a log-spaced grid, so the mean over its points is the expectation
over log eta) of the final loss ``loss(eta)``, capped at the loss at initialisation ``loss_0``,
less the best final loss of the sweep ``loss* = min_eta loss(eta)``. A run that diverged counts as
``loss_0``: the most a value can add is the whole of what training gains. :func:`sensitivity` is
that formula, with ``loss*`` capped at ``loss_0`` as each loss is (``min(loss*, loss_0)``), so that
a sweep none of whose runs ends below ``loss_0`` has sensitivity 0, not a negative one;
:func:`sweep_result` computes it for each swept variant at each seed, from a
comparison's runs, with ``loss_0`` the test loss of the run's own initial weights
(:class:`InitialLosses`).

A swept variant ``LABEL`` runs once per value ``V`` of the option ``OVER``, labelled ``LABEL OVER=V``
(:meth:`Sweep.label`), its ``variant_train`` setting ``OVER: V``; a claim on the metric
:data:`SENSITIVITY` names the swept variants by their own labels.
"""

from __future__ import annotations

import math
import statistics
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ...core.errors import ConfigError
from ...core.validation import Options
from ...training.config import TrainConfig
from ...training.step import TrainingDiverged
from ...training.trainer import Trainer
from ..records import CompareResults
from ..spec import CompareSpec, plan, variant_label

SENSITIVITY = "sensitivity"
"""The metric of a claim on a sweep: each swept variant's sensitivity to the swept option, lower
is better."""

LOGIT = "max_attention_logit"
"""The probe measurement the sweep's figures plot beside the loss (the ``logits`` probe's)."""

SPEC_OWNED = ("model", "task", "seed", "shared_init", "holdout", "holdout_seed")
"""Training options a sweep may not vary: the spec sets them for every run."""

RECORDING = ("peak_tflops", "eval_every", "checkpoint_every", "checkpoint_minutes", "log_every")
"""Training options that change how a run is recorded, not what it learns: nothing to sweep."""

DIVERGED = TrainingDiverged.__name__
"""The error of a run whose loss, weights or optimizer state became non-finite, as a failed run's
record names it (its type first)."""


def sweepable() -> list[str]:
    """The training options a sweep may vary: those that take a number, that the spec does not set
    itself (:data:`SPEC_OWNED`) and that change what a run learns (not :data:`RECORDING`)."""
    return [
        name
        for name, field in TrainConfig.model_fields.items()
        if name not in SPEC_OWNED + RECORDING and {int, float} & set(_types(field.annotation))
    ]


def _types(annotation: Any) -> tuple[Any, ...]:
    args = typing.get_args(annotation)
    return tuple(t for arg in args for t in _types(arg)) if args else (annotation,)


class Sweep(Options):
    """One training option over a grid of values, for some of the spec's variants."""

    over: str = Field(description="the training option swept (lr, warmup_steps, weight_decay, ...)")
    values: list[float] = Field(
        description="its values, at least 3 and each once: a grid (log-spaced for lr, as Wortsman et al. sweep it); "
        "each swept variant runs once at each"
    )
    variants: list[str] = Field(
        min_length=1,
        description="the spec's variants swept, by label; each runs once per value, labelled 'LABEL OVER=VALUE', and "
        "a claim on the metric 'sensitivity' names it by its own label",
    )

    @field_validator("over")
    @classmethod
    def _a_training_option(cls, over: str) -> str:
        if over in SPEC_OWNED:
            raise ValueError(
                f"a sweep cannot vary {over!r}: the spec sets it for every run; sweep one of {sweepable()}"
            )
        if over in RECORDING:
            raise ValueError(f"{over!r} changes how a run is recorded, not what it learns; sweep one of {sweepable()}")
        if over not in sweepable():
            raise ValueError(
                f"{over!r} is not a training option that takes a number; a sweep varies one of {sweepable()} "
                "(model options differ between variants, not over a sweep)"
            )
        return over

    @field_validator("values")
    @classmethod
    def _a_grid(cls, values: list[float]) -> list[float]:
        if len(values) < 3:
            raise ValueError(
                f"a sweep needs at least 3 values to show how the final loss changes over them; got {values}"
            )
        if len(set(values)) != len(values):
            raise ValueError(f"values {values} give a value more than once; give each once")
        return sorted(values)

    @field_validator("variants")
    @classmethod
    def _each_once(cls, variants: list[str]) -> list[str]:
        if len(set(variants)) != len(variants):
            raise ValueError(f"variants {variants} name a variant more than once; give each once")
        return variants

    def label(self, variant: str, value: float) -> str:
        """The label of ``variant``'s run at ``value``: ``baseline lr=0.01``."""
        return f"{variant} {self.over}={value:g}"

    def labels(self, variant: str) -> list[str]:
        """The labels of ``variant``'s runs, one per value, in the grid's order."""
        return [self.label(variant, value) for value in self.values]

    def expand(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        """A compare spec's data with each swept variant replaced by one per value, in its place,
        each labelled :meth:`label` and with ``variant_train`` setting the value over the variant's
        own training options.

        Raises:
            ConfigError: a swept label is not one of the spec's variants, the spec's variant_train
                already sets the swept option for it, its reference is a swept variant, or it tunes.
        """
        entries = list(data.get("variants") or [])
        labels = [variant_label(entry) for entry in entries]
        problems = []
        unknown = [label for label in self.variants if label not in labels]
        if unknown:
            problems.append(f"sweep.variants {unknown} are not among the spec's variants {labels}; name them by label")
        own = dict(data.get("variant_train") or {})
        for label in self.variants:
            if self.over in own.get(label, {}):
                problems.append(
                    f"variant_train sets {self.over} for {label!r}, which the sweep varies; leave it to the sweep"
                )
        if data.get("reference") in self.variants:
            problems.append(
                f"reference {data['reference']!r} is swept, so no one run is it; name one of its runs, such as "
                f"{self.label(data['reference'], self.values[0])!r}"
            )
        if data.get("tune"):
            problems.append("a sweep sets a training option of the swept variants, which tune: would search; drop one")
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems))
        variants, train = [], {k: v for k, v in own.items() if k not in self.variants}
        for entry, label in zip(entries, labels):
            if label not in self.variants:
                variants.append(entry)
                continue
            config = {"variant": entry} if isinstance(entry, str) else dict(entry)
            for value in self.values:
                variants.append({**config, "label": self.label(label, value)})
                train[self.label(label, value)] = {**own.get(label, {}), self.over: value}
        return {**data, "variants": variants, "variant_train": train}


def sensitivity(losses: Sequence[float | None], initial: float) -> float:
    """Wortsman et al.'s sensitivity of one sweep at one seed (their eq. 1): the mean over the grid
    of ``min(loss, initial) - best``, ``best`` the smallest loss of the sweep, where a run that
    diverged (None, or a loss that is not finite) counts as ``initial``, the loss at initialisation.
    ``best`` is capped at ``initial`` as each loss is, so the sensitivity is never negative (0 when
    every run ends at or above ``initial``). In the loss's units (nats for a cross-entropy); 0 when
    every value trains alike."""
    if not losses:
        raise ValueError("a sweep's sensitivity needs the loss of at least one value")
    capped = [initial if loss is None or not math.isfinite(loss) else min(loss, initial) for loss in losses]
    return statistics.fmean(capped) - min(capped)


def loss_of(metrics: dict[str, float]) -> float | None:
    """A task's loss from its scores on a split: ``loss`` where the task reports it, else the log
    of ``perplexity`` (the mean cross-entropy, in nats); None when it reports neither."""
    if "loss" in metrics:
        return metrics["loss"]
    if "perplexity" in metrics:
        value = metrics["perplexity"]
        return math.log(value) if value > 0 else None
    return None


def loss_problem(task: Any) -> str | None:
    """Why a sweep's sensitivity cannot be read from ``task``'s metrics; None when it can."""
    if "loss" in task.metrics or "perplexity" in task.metrics:
        return None
    return (
        f"the sensitivity is of the final test loss, and this task reports neither loss nor perplexity (it reports "
        f"{', '.join(task.metrics)})"
    )


class SweepPoint(BaseModel):
    """One run of a sweep."""

    value: float = Field(description="the swept option's value")
    seed: int
    loss: float | None = Field(description="the final test loss (nats); None: the run diverged")
    max_logit: float | None = Field(
        None, description="the largest attention logit (the logits probe); None: not measured"
    )


class SweptVariant(BaseModel):
    """A swept variant's runs and its sensitivity at each seed."""

    variant: str = Field(description="the variant's label in the study")
    initial: dict[int, float] = Field(description="by seed: the test loss of the runs' initial weights, loss_0")
    points: list[SweepPoint] = Field(description="every run that finished or diverged")
    sensitivity: dict[int, float] = Field(
        description="by seed: the sensitivity, at the seeds where every value's run finished or diverged"
    )
    missing: list[str] = Field([], description="runs that neither finished nor diverged (they failed otherwise)")

    def losses(self, seed: int) -> list[float | None]:
        """The final loss at each value at ``seed``, in the grid's order (None: diverged)."""
        return [p.loss for p in sorted((p for p in self.points if p.seed == seed), key=lambda p: p.value)]


class SweepResult(BaseModel):
    """A study's sweep as it ran: each swept variant's runs and sensitivities."""

    over: str
    values: list[float]
    task: str = Field(description="the task the losses are of")
    variants: list[SweptVariant]

    def of(self, variant: str) -> SweptVariant:
        found = next((v for v in self.variants if v.variant == variant), None)
        if found is None:
            raise ConfigError(
                f"{variant!r} is not swept; the sweep's variants are {[v.variant for v in self.variants]}"
            )
        return found


class InitialLosses:
    """``loss_0`` of each swept variant on each task at each seed: the test loss of the initial
    weights its runs start from (with ``pairing: seeds``, those taken from the variants before it),
    computed once each by building the model as its runs' trainer does."""

    def __init__(self, spec: CompareSpec, sweep: Sweep) -> None:
        self.sweep = sweep
        self.configs = {(label, config.task.name): config for label, config in plan(spec)[0]}  # a seed's, of each
        self.tasks: dict[str, Any] = {}
        self.found: dict[tuple[str, str, int], float] = {}

    def __call__(self, variant: str, task: str, seed: int) -> float:
        key = (variant, task, seed)
        if key not in self.found:
            config = self.configs[(self.sweep.label(variant, self.sweep.values[0]), task)]
            config = config.model_copy(update={"seed": seed})
            built = self.tasks.setdefault(task, config.task.build())
            model = Trainer(config, task=built, progress=False).build_model()
            loss = loss_of(built.evaluate(model, "test"))
            if loss is None or not math.isfinite(loss):
                raise ConfigError(
                    f"the test loss of {variant!r}'s initial weights on {task!r} at seed {seed} is {loss}; a sweep's "
                    "sensitivity needs a finite loss at initialisation"
                )
            self.found[key] = loss
        return self.found[key]


def sweep_result(
    sweep: Sweep, results: CompareResults, task: str, initial: Callable[[str, str, int], float]
) -> SweepResult:
    """Each swept variant's runs on ``task`` and its sensitivity at every seed where each value's
    run finished or diverged; ``initial(variant, task, seed)`` gives ``loss_0``. A run that diverged
    (a failed run whose error is a ``TrainingDiverged``, or a finished one whose loss is not finite)
    has no loss and counts as ``loss_0``."""
    swept = []
    for variant in sweep.variants:
        points, missing = [], []
        for value, label in zip(sweep.values, sweep.labels(variant)):
            for run in results.runs:
                if run.variant == label and run.task == task:
                    loss = loss_of(run.metrics.get("test", {}))
                    finite = loss is not None and math.isfinite(loss)
                    points.append(
                        SweepPoint(
                            value=value, seed=run.seed, loss=loss if finite else None, max_logit=run.probes.get(LOGIT)
                        )
                    )
            for failed in results.failed:
                if failed.variant == label and failed.task == task:
                    if failed.error.startswith(DIVERGED):
                        points.append(SweepPoint(value=value, seed=failed.seed, loss=None))
                    else:
                        missing.append(f"{label}, seed {failed.seed}: {failed.error.splitlines()[0]}")
        seeds = sorted({p.seed for p in points})
        complete = [s for s in seeds if len({p.value for p in points if p.seed == s}) == len(sweep.values)]
        initial_losses = {seed: initial(variant, task, seed) for seed in complete}
        found = SweptVariant(variant=variant, initial=initial_losses, points=points, sensitivity={}, missing=missing)
        found.sensitivity = {seed: sensitivity(found.losses(seed), initial_losses[seed]) for seed in complete}
        swept.append(found)
    return SweepResult(over=sweep.over, values=sweep.values, task=task, variants=swept)
