"""A study's file: a compare spec (:class:`~transformer_zoo.comparing.spec.CompareSpec`), the
claims it tests, where they come from, and what changes at each scale (:data:`SCALES`: ``cpu``,
about ten minutes on a 2-core machine; ``gpu``, every study together in about eight minutes on
one large GPU; ``paper``, the paper's own settings, hours on one GPU). A claim names a task, a
metric (a task's score on one split, or a probe's measurement), two variants of the spec by
label and a relation: ``a`` is ``better`` than ``b``, ``not-worse``, ``matches`` it within a
margin, or is ``steadier`` over seeds (:data:`RELATIONS`; how each is judged:
:mod:`~transformer_zoo.comparing.studies.verdicts`).

A study may also **sweep** one training option over a grid of values for some of its variants
(:class:`~transformer_zoo.comparing.studies.sweeps.Sweep`): each swept variant then runs once per
value, and a claim on the metric ``sensitivity`` compares two swept variants by how much their
final loss suffers over the grid (Wortsman et al. 2023's LR sensitivity).

The built-in studies are the package's ``studies/*.yaml``; a path to a YAML file of the same
shape runs a study of one's own.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ...configs import merge, read_config, validate
from ...core.errors import ConfigError, UnknownNameError
from ...core.tasks import Better
from ...core.validation import Options
from ..probes import PROBE_OUTPUTS
from ..spec import CompareSpec, plan
from ..suites import load_suite, task_name, with_suite_tasks
from ..tallies import Tally
from ..tuning import tuned_runs
from .sweeps import SENSITIVITY, Sweep, loss_problem

Scale = Literal["cpu", "gpu", "paper"]
SCALES: dict[str, str] = {
    "cpu": "about ten minutes a study on a 2-core CPU (the study's compare spec itself)",
    "gpu": "every built-in study together in about eight minutes on one H100 or H200: all of them at once, each "
    "with a few runs on the GPU, in bfloat16",
    "paper": "the paper's own settings where it gives them: hours on one GPU",
}
Relation = Literal["better", "not-worse", "matches", "steadier"]
RELATIONS: dict[str, str] = {
    "better": "a beats b: the interval of a - b lies above 0",
    "not-worse": "a is at least as good as b, within margin: the interval lies at or above -margin",
    "matches": "a equals b within margin: the interval lies within [-margin, margin]",
    "steadier": "a varies less over seeds than b (Brown-Forsythe test)",
}


class Claim(Options):
    """One stated claim: ``a`` relates to ``b`` so on ``task``'s ``metric``."""

    statement: str = Field(description="the claim in words, as the report prints it")
    task: str = Field(
        description="the task's name (its id, or else its kind), one of the spec's tasks, or a suite's aggregate"
    )
    metric: str = Field(
        description="a metric of the task, a measurement of one of the spec's probes, or 'sensitivity': of two "
        "swept variants, their sensitivity to the swept option (lower is better)"
    )
    split: str = Field("test", description="the evaluation split of a task metric (a probe's is the test split)")
    split_b: str | None = Field(
        None,
        description="b's split, where it is not a's: one variant at two lengths (a and b may then name the same "
        "variant, and each seed's run is compared with itself, by a paired t-test)",
    )
    a: str = Field(description="the variant claimed to do better, by its label in the spec")
    b: str = Field(description="the variant it is compared with, by its label")
    relation: Relation = Field("better", description="; ".join(f"{k}: {v}" for k, v in RELATIONS.items()))
    effect: float = Field(
        0.0,
        ge=0.0,
        description="the smallest effect of interest, in the metric's units: better: a gain smaller than it does not "
        "count (the claim does not hold when its interval reaches 0 or below and ends below it); not-worse and "
        "matches: the margin; not given: the study's effect (steadier claims have none)",
    )
    direction: Better | None = Field(
        None, description="which way the metric is better; null: as the task declares it (a probe needs it)"
    )

    @model_validator(mode="after")
    def _effect(self) -> Claim:
        if self.relation == "matches" and self.effect == 0 and "effect" in self.model_fields_set:
            raise ValueError(
                "a 'matches' claim needs an effect > 0: no interval lies within [0, 0]; give the largest "
                "difference that still counts as a match, in the metric's units"
            )
        if self.relation == "steadier" and self.effect:
            raise ValueError(
                "a 'steadier' claim is judged by a test of equal spread over seeds, which has no effect of interest; "
                "drop its effect"
            )
        if self.metric == SENSITIVITY and (self.split_b is not None or self.split != "test"):
            raise ValueError(
                "a sensitivity claim reads each swept run's final loss on the test split; drop its split and split_b"
            )
        if self.metric == SENSITIVITY and self.direction == "higher":
            raise ValueError(
                "a sensitivity is better lower (a loss that suffers less over the sweep); to claim that a is more "
                "sensitive than b, swap a and b"
            )
        if self.a == self.b and self.split_b in (None, self.split):
            raise ValueError(
                f"a and b are both {self.a!r} on split {self.split!r}; a claim compares two variants, or one "
                "variant on two splits (give split_b)"
            )
        return self

    @property
    def b_split(self) -> str:
        """The split b is scored on."""
        return self.split_b or self.split

    @property
    def paired(self) -> bool:
        """One variant on two splits: each seed's run against itself."""
        return self.a == self.b


class SourceFigure(Options):
    """A figure the source reports for one of the study's variants, set beside ours."""

    variant: str = Field(description="the variant it stands beside, by its label in the spec")
    task: str = Field(description="the task's name (its id, or else its kind)")
    metric: str = Field(description="a metric of the task")
    split: str = Field("test", description="the evaluation split")
    value: float = Field(description="the source's figure, in the metric's units")
    where: str = Field(description="where the source gives it (table, row, setting)")


class Study(Options):
    """A study: a comparison, the claims it tests and what changes at each scale."""

    name: str = Field(description="the study's name (its file's name)")
    title: str = Field(description="the claim in a line")
    source: str = Field(description="where the claim comes from: paper and section, or lecture")
    notes: str = Field("", description="what the setup follows of the source, what it does not, and why")
    compare: dict[str, Any] = Field(description="the compare spec of the cpu scale (see `tzoo compare`)")
    scales: dict[Scale, dict[str, Any]] = Field(
        {},
        description="by scale: spec values that replace the cpu scale's; under 'tasks', a mapping by task name (id, or else kind) "
        "of the task options that change",
    )
    effect: float | None = Field(
        None,
        ge=0.0,
        description="the smallest effect of interest of every claim that gives none of its own, in the metrics' "
        "units (see Claim.effect); say in the notes why it is the least that counts",
    )
    claims: list[Claim] = Field(min_length=1, description="the claims, each judged on its own")
    figures: list[SourceFigure] = Field([], description="the source's own figures, reported beside ours")
    tally: Tally | None = Field(
        None,
        description="also count every other variant against one reference after Holm's correction (better, not "
        "separable, worse); with tuning compared both ways, the untuned and the tuned runs each",
    )
    sweep: Sweep | None = Field(
        None,
        description="run some of the spec's variants once per value of one training option (a scale's 'sweep' "
        "changes it); the report plots each one's final loss (and largest attention logit, with the logits probe) "
        "against the value",
    )

    @model_validator(mode="after")
    def _claims_effects(self) -> Study:
        """The study's effect on each claim that gives none (but steadier claims, which have none)."""
        for i, claim in enumerate(self.claims):
            if "effect" not in claim.model_fields_set and claim.relation != "steadier" and self.effect is not None:
                self.claims[i] = claim.model_copy(update={"effect": self.effect})
            if self.claims[i].relation == "matches" and not self.claims[i].effect:
                raise ValueError(
                    f"claims.{i} ({claim.statement!r}) is a 'matches' claim with no effect: give it (or the study) "
                    "the largest difference that still counts as a match, in the metric's units"
                )
        return self

    def sweep_at(self, scale: Scale = "cpu", overrides: dict[str, Any] | None = None) -> Sweep | None:
        """The study's sweep with the scale's ``sweep`` changes, then ``overrides``'s, on top."""
        changes = [c["sweep"] for c in (self.scales.get(scale, {}), overrides or {}) if c.get("sweep") is not None]
        if self.sweep is None:
            if changes:
                raise ConfigError(
                    f"study {self.name!r}: a 'sweep' at the {scale} scale changes the study's sweep, and it has none; "
                    "give the study a sweep: block"
                )
            return None
        data = self.sweep.model_dump()
        for change in changes:
            if not isinstance(change, dict):
                raise ConfigError(
                    f"study {self.name!r}: a scale's 'sweep' is a mapping of what changes (over, values, variants), "
                    f"such as {{values: [0.001, 0.01, 0.1]}}; got {type(change).__name__}"
                )
            data = merge(data, change)
        return validate(Sweep, data, f"study {self.name!r}, sweep at the {scale} scale")

    def spec(self, scale: Scale = "cpu", overrides: dict[str, Any] | None = None) -> CompareSpec:
        """The compare spec at ``scale``, with ``overrides`` (``steps``, ``seeds``, ...) on top, its
        swept variants expanded (one per value); each claim checked against it: its variants and
        task are in it, its split and metric exist."""
        if scale != "cpu" and scale not in self.scales:
            given = ", ".join(["cpu", *self.scales])
            raise ConfigError(
                f"study {self.name!r} has no {scale} scale (it has: {given}); add a '{scale}' block under "
                "its scales:, or run it at one it has"
            )
        sweep = self.sweep_at(scale, overrides)
        data = dict(self.compare)
        suite = next((c["suite"] for c in (overrides or {}, self.scales.get(scale, {})) if c.get("suite")), None)
        if (suite := suite or data.get("suite")) is not None:  # the suite's tasks, for a scale to change
            data["suite"] = suite
            data["tasks"] = with_suite_tasks(list(data.get("tasks") or []), load_suite(suite))
        for change in (self.scales.get(scale, {}), overrides or {}):
            change = {key: value for key, value in change.items() if key != "sweep"}  # sweep_at's
            tasks = change.pop("tasks", None)
            data = merge(data, change)
            if tasks is not None:
                data["tasks"] = _merged_tasks(data.get("tasks", []), tasks, self.name)
        if overrides and "steps" in overrides:  # every run's budget, a task's own and a tuning trial's included
            for key in ("task_train", "variant_train"):
                data[key] = {
                    name: {**train, "steps": overrides["steps"]} if "steps" in train else train
                    for name, train in data.get(key, {}).items()
                }
            if data.get("tune", {}).get("steps") is not None:
                data["tune"] = {**data["tune"], "steps": overrides["steps"]}
        if sweep is not None:
            data = sweep.expand(data, f"study {self.name!r} at the {scale} scale")
        spec = validate(CompareSpec, {**data, "name": self.name}, f"study {self.name!r} at the {scale} scale")
        self.check(spec, sweep)
        return spec

    def check(self, spec: CompareSpec, sweep: Sweep | None = None) -> None:
        """Raise a ConfigError unless every claim can be judged from ``spec``'s runs (``sweep``: the
        sweep that expanded its variants, which a sensitivity claim reads)."""
        runs, skipped = planned_runs(spec)
        ran = {(label, config.task.name) for label, config in runs}
        tasks = {options.name: options for options in spec.tasks}
        built: dict[str, Any] = {}
        suite = None if spec.suite is None else load_suite(spec.suite)
        names = [] if suite is None else [task_name(task) for task in suite.tasks]
        if suite is not None and suite.aggregate and len({tasks[name].build().metric for name in names}) == 1:
            # the aggregate, a task whose headline is its tasks' own (the first's metrics and splits)
            tasks[suite.aggregate_name] = tasks[names[0]]
            ran |= {(label, suite.aggregate_name) for label, _ in runs if all((label, name) in ran for name in names)}
        probed = {name for probe in spec.probes for name in PROBE_OUTPUTS[probe]}
        for i, claim in enumerate(self.claims):
            where = f"study {self.name!r}, claims.{i}"
            if claim.task not in tasks:
                raise ConfigError(f"{where}: task {claim.task!r} is not one of the spec's tasks {sorted(tasks)}")
            if claim.metric == SENSITIVITY:
                task = built.setdefault(claim.task, tasks[claim.task].build())
                _check_sensitivity(claim, sweep, ran, task, where)
                continue
            for label in (claim.a, claim.b):
                if (label, claim.task) not in ran:
                    why = next(
                        (s.reason for s in skipped if s.variant == label and s.task == claim.task),
                        f"it is not one of the spec's variants {sorted({v for v, _ in ran})}",
                    )
                    raise ConfigError(f"{where}: variant {label!r} does not run {claim.task!r}: {why}")
            task = built.setdefault(claim.task, tasks[claim.task].build())
            if claim.metric in probed:
                if claim.direction is None:
                    raise ConfigError(
                        f"{where}: {claim.metric!r} is a probe's measurement, which no task ranks; "
                        "say which way supports the claim with direction: higher or lower"
                    )
                continue
            if claim.metric not in task.metrics:
                raise ConfigError(
                    f"{where}: metric {claim.metric!r} is neither a metric of task {claim.task!r} "
                    f"({', '.join(task.metrics)}) nor a measurement of the spec's probes "
                    f"({', '.join(sorted(probed)) or 'none: add probes to the spec'})"
                )
            for split in {claim.split, claim.b_split}:
                if split not in task.splits:
                    raise ConfigError(
                        f"{where}: split {split!r} is not one of task {claim.task!r}'s splits "
                        f"({', '.join(task.splits)})"
                    )
        if self.tally is not None:
            t, where = self.tally, f"study {self.name!r}, tally"
            if (t.reference, t.task) not in ran:
                raise ConfigError(
                    f"{where}: no run of reference {t.reference!r} on task {t.task!r}; the spec runs "
                    f"{sorted(label for label, kind in ran if kind == t.task) or 'nothing on it'}"
                )
            task = built.setdefault(t.task, tasks[t.task].build())
            if t.metric not in task.metrics or t.split not in task.splits:
                raise ConfigError(
                    f"{where}: task {t.task!r} has metrics {', '.join(task.metrics)} on splits "
                    f"{', '.join(task.splits)}; got {t.split} {t.metric}"
                )
        for i, figure in enumerate(self.figures):
            where = f"study {self.name!r}, figures.{i}"
            if (figure.variant, figure.task) not in ran:
                raise ConfigError(f"{where}: no run of variant {figure.variant!r} on task {figure.task!r} in the spec")
            task = built.setdefault(figure.task, tasks[figure.task].build())
            if figure.metric not in task.metrics or figure.split not in task.splits:
                raise ConfigError(
                    f"{where}: task {figure.task!r} has metrics {', '.join(task.metrics)} on splits "
                    f"{', '.join(task.splits)}; got {figure.split} {figure.metric}"
                )


def _check_sensitivity(claim: Claim, sweep: Sweep | None, ran: set[tuple[str, str]], task: Any, where: str) -> None:
    """Raise a ConfigError unless ``claim``'s sensitivities can be read from the sweep's runs."""
    if sweep is None:
        raise ConfigError(f"{where}: {SENSITIVITY!r} is a sweep's measurement, and the study has no sweep: block")
    for label in (claim.a, claim.b):
        if label not in sweep.variants:
            raise ConfigError(
                f"{where}: {label!r} is not swept, so it has no sensitivity; the sweep's variants are {sweep.variants}"
            )
        lacking = [run for run in sweep.labels(label) if (run, claim.task) not in ran]
        if lacking:
            raise ConfigError(f"{where}: {lacking} do not run task {claim.task!r}, so {label!r} has no sensitivity")
    if (problem := loss_problem(task)) is not None:
        raise ConfigError(f"{where}: task {claim.task!r}: {problem}")


def planned_runs(spec: CompareSpec) -> tuple[list[tuple[str, Any]], list[Any]]:
    """:func:`~.spec.plan`'s runs and skipped pairs, with the tuned twins that run beside the spec's
    own or in their place (labelled ``LABEL tuned``, planned as their variant)."""
    runs, skipped = plan(spec)
    return (runs if spec.tune is None else tuned_runs(spec.tune, runs, [])), skipped


def _merged_tasks(tasks: list[Any], changes: dict[str, Any], study: str) -> list[Any]:
    """The spec's tasks with a scale's changes merged into the task of each name (its id, or else its kind)."""
    if not isinstance(changes, dict):
        raise ConfigError(
            f"study {study!r}: a scale's 'tasks' is a mapping by task name (id, or else kind) of the options that change, "
            f"such as {{reverse: {{train_size: 100000}}}}; got {type(changes).__name__}"
        )
    kinds = [task_name(task) for task in tasks]
    unknown = sorted(set(changes) - set(kinds))
    if unknown:
        raise ConfigError(f"study {study!r}: a scale changes tasks {unknown}, which are not among the spec's {kinds}")
    return [
        merge({"kind": task} if isinstance(task, str) else task, changes.get(kind, {}))
        for task, kind in zip(tasks, kinds)
    ]


def studies_dir() -> Path:
    return Path(str(resources.files("transformer_zoo") / "studies"))


def available_studies() -> dict[str, Path]:
    """The built-in studies, by name."""
    return {path.stem: path for path in sorted(studies_dir().glob("*.yaml"))}


def load_study(source: str | os.PathLike | dict[str, Any]) -> Study:
    """A validated study from a built-in name, a YAML file or a mapping."""
    if isinstance(source, (str, os.PathLike)) and not str(source).endswith((".yaml", ".yml", ".json")):
        found = available_studies()
        if str(source) not in found:
            raise UnknownNameError("study (or a path to a study's YAML file)", str(source), found)
        source = found[str(source)]
    data = read_config(source, "study file", "a built-in study's name (tzoo reproduce lists them) or a YAML file")
    if not isinstance(source, dict):
        data.setdefault("name", Path(source).stem)
    return validate(Study, data, "study")


def study_rows() -> list[dict[str, str]]:
    """The built-in studies, for ``tzoo reproduce`` with no name."""
    rows = []
    for name, path in available_studies().items():
        study = load_study(path)
        rows.append({"study": name, "claim": study.title, "source": study.source})
    return rows
