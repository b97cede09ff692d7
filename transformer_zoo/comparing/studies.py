"""``tzoo reproduce``: what the papers and lectures claim, rerun as comparisons with a verdict.

A study is a YAML file: a compare spec (:class:`~transformer_zoo.comparing.spec.CompareSpec`), the
claims it tests, where they come from, and what changes at each scale (:data:`SCALES`: ``cpu``,
about ten minutes on a 2-core machine; ``gpu``, every study together in about eight minutes on
one large GPU; ``paper``, the paper's own settings, hours on one GPU). A claim names a task, a
metric (a task's score on one split, or a probe's measurement), two variants of the spec by
label and a relation: ``a`` is ``better`` than ``b``, ``not-worse``, ``matches`` it within a
margin, or is ``steadier`` over seeds. Its verdict comes from the 95% interval over seeds of
the difference ``a - b``, taken in the direction in which the metric is better:

- ``better``: **holds** when the interval lies above 0 (the test rejects equal means, the
  claimed way); **does not hold** when it lies at or below ``margin`` (an advantage, if any, is
  smaller than the least that would count); **inconclusive** otherwise.
- ``not-worse``: holds when the interval lies at or above ``-margin``; does not hold when it
  lies below ``-margin``.
- ``matches``: holds when the interval lies within ``[-margin, margin]``; does not hold when it
  lies wholly outside.
- ``steadier``: ``a``'s standard deviation over seeds is below ``b``'s and the Brown-Forsythe
  test of equal spread rejects (holds), or above it and the test rejects (does not hold).

A study holds when every claim holds, does not hold when one does not, and is inconclusive
otherwise. The built-in studies are the package's ``studies/*.yaml``; a path to a YAML file
of the same shape runs a study of one's own.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import time
from importlib import resources
from multiprocessing import connection, get_context
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ..configs import merge, read_config, validate
from ..core.errors import ConfigError, UnknownNameError, ZooError
from ..core.files import atomic_write
from ..core.options import Options
from ..core.tasks import Better
from ..registry import get_registry
from .probes import PROBE_OUTPUTS
from .progress import duration
from .records import ALPHA, Cell, CompareResults
from .runner import compare
from .spec import CompareSpec, plan
from .stats import TEST_NAMES, bounded_interval, difference, interval, paired_difference, seeds_needed, spread
from .summary import format_cell, format_number
from .tallies import Tally, TallyResult, tally, tally_lines
from .tuning import tuned_runs

Scale = Literal["cpu", "gpu", "paper"]
SCALES: dict[str, str] = {
    "cpu": "about ten minutes a study on a 2-core CPU (the study's compare spec itself)",
    "gpu": "every built-in study together in about eight minutes on one H100 or H200: all of them at once, each "
    "with a few runs on the GPU, in bfloat16",
    "paper": "the paper's own settings where it gives them: hours on one GPU",
}
Relation = Literal["better", "not-worse", "matches", "steadier"]
Verdict = Literal["holds", "does not hold", "inconclusive"]
RELATIONS: dict[str, str] = {
    "better": "a beats b: the interval of a - b lies above 0",
    "not-worse": "a is at least as good as b, within margin: the interval lies at or above -margin",
    "matches": "a equals b within margin: the interval lies within [-margin, margin]",
    "steadier": "a varies less over seeds than b (Brown-Forsythe test)",
}


class Claim(Options):
    """One stated claim: ``a`` relates to ``b`` so on ``task``'s ``metric``."""

    statement: str = Field(description="the claim in words, as the report prints it")
    task: str = Field(description="the task kind, one of the spec's tasks")
    metric: str = Field(description="a metric of the task, or a measurement of one of the spec's probes")
    split: str = Field("test", description="the evaluation split of a task metric (a probe's is the test split)")
    split_b: str | None = Field(
        None,
        description="b's split, where it is not a's: one variant at two lengths (a and b may then name the same "
        "variant, and each seed's run is compared with itself, by a paired t-test)",
    )
    a: str = Field(description="the variant claimed to do better, by its label in the spec")
    b: str = Field(description="the variant it is compared with, by its label")
    relation: Relation = Field("better", description="; ".join(f"{k}: {v}" for k, v in RELATIONS.items()))
    margin: float = Field(0.0, ge=0.0, description="the least difference that counts, in the metric's units")
    direction: Better | None = Field(
        None, description="which way the metric is better; null: as the task declares it (a probe needs it)"
    )

    @model_validator(mode="after")
    def _margin(self) -> Claim:
        if self.relation == "matches" and self.margin == 0:
            raise ValueError(
                "a 'matches' claim needs a margin > 0: no interval lies within [0, 0]; give the largest "
                "difference that still counts as a match, in the metric's units"
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
    task: str = Field(description="the task kind")
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
        description="by scale: spec values that replace the cpu scale's; under 'tasks', a mapping by task kind "
        "of the task options that change",
    )
    claims: list[Claim] = Field(min_length=1, description="the claims, each judged on its own")
    figures: list[SourceFigure] = Field([], description="the source's own figures, reported beside ours")
    tally: Tally | None = Field(
        None,
        description="also count every other variant against one reference after Holm's correction (better, not "
        "separable, worse); with tuning compared both ways, the untuned and the tuned runs each",
    )

    def spec(self, scale: Scale = "cpu", overrides: dict[str, Any] | None = None) -> CompareSpec:
        """The compare spec at ``scale``, with ``overrides`` (``steps``, ``seeds``, ...) on top;
        each claim checked against it: its variants and task are in it, its split and metric exist."""
        if scale != "cpu" and scale not in self.scales:
            given = ", ".join(["cpu", *self.scales])
            raise ConfigError(
                f"study {self.name!r} has no {scale} scale (it has: {given}); add a '{scale}' block under "
                "its scales:, or run it at one it has"
            )
        data = dict(self.compare)
        for change in (self.scales.get(scale, {}), overrides or {}):
            change = dict(change)
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
        spec = validate(CompareSpec, {**data, "name": self.name}, f"study {self.name!r} at the {scale} scale")
        self.check(spec)
        return spec

    def check(self, spec: CompareSpec) -> None:
        """Raise a ConfigError unless every claim can be judged from ``spec``'s runs."""
        runs, skipped = planned_runs(spec)
        ran = {(label, config.task.kind) for label, config in runs}
        tasks = {options.kind: options for options in spec.tasks}
        built: dict[str, Any] = {}
        probed = {name for probe in spec.probes for name in PROBE_OUTPUTS[probe]}
        for i, claim in enumerate(self.claims):
            where = f"study {self.name!r}, claims.{i}"
            if claim.task not in tasks:
                raise ConfigError(f"{where}: task {claim.task!r} is not one of the spec's tasks {sorted(tasks)}")
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


def planned_runs(spec: CompareSpec) -> tuple[list[tuple[str, Any]], list[Any]]:
    """:func:`~.spec.plan`'s runs and skipped pairs, with the tuned twins that run beside the spec's
    own or in their place (labelled ``LABEL tuned``, planned as their variant)."""
    runs, skipped = plan(spec)
    return (runs if spec.tune is None else tuned_runs(spec.tune, runs, [])), skipped


def _merged_tasks(tasks: list[Any], changes: dict[str, Any], study: str) -> list[Any]:
    """The spec's tasks with a scale's changes merged into the task of each named kind."""
    if not isinstance(changes, dict):
        raise ConfigError(
            f"study {study!r}: a scale's 'tasks' is a mapping by task kind of the options that change, "
            f"such as {{reverse: {{train_size: 100000}}}}; got {type(changes).__name__}"
        )
    kinds = [task if isinstance(task, str) else task.get("kind") for task in tasks]
    unknown = sorted(set(changes) - set(kinds))
    if unknown:
        raise ConfigError(f"study {study!r}: a scale changes tasks {unknown}, which are not among the spec's {kinds}")
    return [
        merge({"kind": task} if isinstance(task, str) else task, changes.get(kind, {}))
        for task, kind in zip(tasks, kinds)
    ]


class ClaimResult(BaseModel):
    """A claim's figures over seeds and its verdict."""

    claim: Claim
    a: Cell = Field(description="a's mean over seeds and its 95% interval")
    b: Cell = Field(description="b's mean and interval")
    difference: float = Field(description="mean(a) - mean(b)")
    low: float | None = Field(description="the difference's 95% interval (Welch-Satterthwaite); None: one seed")
    high: float | None
    p: float | None = Field(description="two-sided p of the test of equal means (steadier: of equal spread)")
    sd_a: float = Field(0.0, description="a's standard deviation over seeds")
    sd_b: float = Field(0.0, description="b's standard deviation over seeds")
    probe: bool = Field(False, description="the metric is a probe's measurement (of the test split)")
    direction: Better = Field("higher", description="which way the metric is better, as the claim was judged")
    verdict: Verdict
    reason: str = Field(description="why the verdict, in words")
    seeds_needed: int | None = Field(
        None,
        description="inconclusive: about how many seeds a side would decide the claim at the spreads seen "
        "(stats.seeds_needed); None: decided, or no practical number would",
    )


class FigureResult(BaseModel):
    """A source's figure and ours for the same variant, task and metric."""

    figure: SourceFigure
    ours: Cell = Field(description="our mean over seeds and its 95% interval")


class StudyResult(BaseModel):
    """A study's outcome: the contents of its ``verdict.json``."""

    name: str
    title: str
    source: str
    notes: str = ""
    scale: Scale
    seeds: list[int]
    steps: int
    test: str = Field(description="the test of each difference")
    verdict: Verdict
    claims: list[ClaimResult]
    figures: list[FigureResult] = []
    tally: Tally | None = Field(None, description="the study's tally as it states it")
    tallies: list[TallyResult] = Field([], description="the tally's outcome, by family (untuned, tuned)")
    short_runs: list[str] = Field([], description="runs that stopped before their steps when the time cap ran out")
    wall_seconds: float = Field(description="wall time of the study's comparison")
    report: str = Field(description="the comparison's report.md, relative to the study's folder")
    command: str = Field(description="the command that runs the study again")


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
    data = read_config(source)
    if not isinstance(source, dict):
        data.setdefault("name", Path(source).stem)
    return validate(Study, data, "study")


def _values(results: CompareResults, label: str, task: str, split: str, metric: str) -> list[float]:
    """A variant's figure on ``task`` from each of its runs: a probe's measurement, or a split's metric."""
    return list(_by_seed(results, label, task, split, metric).values())


def _by_seed(results: CompareResults, label: str, task: str, split: str, metric: str) -> dict[int, float]:
    """:func:`_values` by the seed of each run."""
    found = {}
    for run in results.runs:
        if run.variant == label and run.task == task:
            value = run.probes.get(metric, run.metrics.get(split, {}).get(metric))
            if value is not None:
                found[run.seed] = value
    return found


def _cell(results: CompareResults, metric: str, values: list[float]) -> Cell:
    """The mean and 95% interval of ``values``, within the metric's bounds where the task declares them."""
    bounds = next((r.bounds[metric] for r in results.runs if metric in r.bounds), None)
    return Cell(**(interval(values) if bounds is None else bounded_interval(values, bounds)).__dict__)


def judge(claim: Claim, results: CompareResults, stopped: list[str] = ()) -> ClaimResult:
    """A claim's verdict from the comparison's runs (see the module's docstring for the rules).

    Args:
        stopped: the claim's runs that stopped at the time cap before their steps: then the claim
            is not judged (inconclusive, the measured verdict in its reason), since a and b did not
            train alike.
    """
    by_seed = [
        _by_seed(results, label, claim.task, split, claim.metric)
        for label, split in ((claim.a, claim.split), (claim.b, claim.b_split))
    ]
    if claim.paired:  # the seeds scored on both splits, each against itself
        by_seed = [{seed: side[seed] for seed in sorted(by_seed[0].keys() & by_seed[1].keys())} for side in by_seed]
    a, b = (list(side.values()) for side in by_seed)
    if not a or not b:
        missing, split = (claim.a, claim.split) if not a else (claim.b, claim.b_split)
        raise ConfigError(f"no run of {missing!r} on {claim.task!r} recorded {split} {claim.metric}")
    direction = claim.direction or next(
        (r.better[claim.metric] for r in results.runs if claim.metric in r.better), "higher"
    )
    cells = {"a": _cell(results, claim.metric, a), "b": _cell(results, claim.metric, b)}
    diff = paired_difference(a, b) if claim.paired else difference(a, b, results.spec.get("test", "welch"))
    sd = spread(a, b)
    probe = any(claim.metric in run.probes for run in results.runs)
    figures = dict(
        a=cells["a"],
        b=cells["b"],
        difference=diff.difference,
        low=diff.low,
        high=diff.high,
        sd_a=sd.sd_a,
        sd_b=sd.sd_b,
        probe=probe,
        direction=direction,
    )
    needed, p = None, diff.p
    if claim.relation == "steadier":
        (verdict, reason), p = _steadier(sd, claim, min(len(a), len(b))), sd.p
    else:
        verdict, reason = _by_interval(claim, diff.low, diff.high, direction, diff.difference)
    if stopped:
        verdict, reason = _not_judged(verdict, reason, len(stopped))
    elif verdict == "inconclusive" and diff.low is not None and claim.relation != "steadier":
        sides = (sd.sd_a, sd.sd_b)
        if claim.paired:  # the interval is of the per-seed differences: half their variance on each side
            sides = (statistics.stdev(x - y for x, y in zip(a, b)) / math.sqrt(2),) * 2
        needed = seeds_needed(*sides, _gap(claim, (1.0 if direction == "higher" else -1.0) * diff.difference))
        reason += (
            f"; at these spreads about {needed} seeds a side would decide it"
            if needed
            else "; at these spreads no practical number of seeds would decide it (the mean lies at or near the boundary)"
        )
    return ClaimResult(claim=claim, p=p, verdict=verdict, reason=reason, seeds_needed=needed, **figures)


def _not_judged(verdict: Verdict, reason: str, stopped: int) -> tuple[Verdict, str]:
    """The verdict of a claim with ``stopped`` runs cut short by the time cap: inconclusive."""
    capped = f"{stopped} of its runs stopped at the time cap before their steps"
    if verdict == "inconclusive":
        return verdict, f"{reason}; and {capped}: give the runs more time"
    return "inconclusive", (
        f"not judged: {capped}, so a and b did not train alike (as measured, {verdict}: {reason}); give the runs more time"
    )


def _gap(claim: Claim, gain: float) -> float:
    """How far the mean gain of a over b lies from the boundary the claim's verdict turns on."""
    m = claim.margin
    if claim.relation == "better":
        return max(gain, m - gain)  # above 0: holds; at or below the margin: does not hold
    if claim.relation == "not-worse":
        return abs(gain + m)
    return abs(m - abs(gain))  # matches


def beside(figure: SourceFigure, results: CompareResults) -> FigureResult | None:
    """The source's figure and ours; None when no run of the variant recorded it."""
    ours = _values(results, figure.variant, figure.task, figure.split, figure.metric)
    return FigureResult(figure=figure, ours=_cell(results, figure.metric, ours)) if ours else None


def _by_interval(
    claim: Claim, low: float | None, high: float | None, direction: str, mean: float
) -> tuple[Verdict, str]:
    if low is None or high is None:
        return "inconclusive", "one seed a side gives no interval: run two or more seeds"
    sign = 1.0 if direction == "higher" else -1.0
    lo, hi = sorted((sign * low, sign * high))  # the gain of a over b, the way the metric is better
    gain = (
        f"the gain of a over b ({direction} is better) is {format_number(sign * mean, 4)} "
        f"[{format_number(lo, 4)}, {format_number(hi, 4)}]"
    )
    m = claim.margin
    if claim.relation == "better":
        if lo > 0:
            return "holds", f"{gain}: the interval lies above 0"
        if hi <= m:
            return "does not hold", f"{gain}: the interval lies at or below {_margin(m)}"
        return "inconclusive", f"{gain}: the interval spans 0{'' if m == 0 else f' and {m:g}'}"
    if claim.relation == "not-worse":
        if lo >= -m:
            return "holds", f"{gain}: the interval lies at or above {_margin(-m)}"
        if hi < -m:
            return "does not hold", f"{gain}: the interval lies below {_margin(-m)}"
        return "inconclusive", f"{gain}: the interval spans {_margin(-m)}"
    if -m <= lo and hi <= m:
        return "holds", f"{gain}: the interval lies within the margin ±{m:g}"
    if lo > m or hi < -m:
        return "does not hold", f"{gain}: the interval lies outside the margin ±{m:g}"
    return "inconclusive", f"{gain}: the interval reaches beyond the margin ±{m:g}"


def _margin(value: float) -> str:
    return "0" if value == 0 else f"{value:g} (the margin)"


def _steadier(sd: Any, claim: Claim, seeds: int) -> tuple[Verdict, str]:
    text = f"standard deviation over seeds: a {sd.sd_a:.4g}, b {sd.sd_b:.4g}"
    if seeds < 2:
        return "inconclusive", "one seed a side gives no spread: run two or more seeds"
    if sd.p is None:
        if sd.sd_a == sd.sd_b:
            return "does not hold", f"{text}: equal, so a is not steadier"
        return "inconclusive", f"{text}: too few seeds to test the spread"
    tested = f"{text}, Brown-Forsythe p = {sd.p:.3g}"
    if sd.p < ALPHA:
        return (
            ("holds", f"{tested}: a's is smaller")
            if sd.sd_a < sd.sd_b
            else ("does not hold", f"{tested}: a's is larger")
        )
    return "inconclusive", f"{tested}: not separable at alpha = {ALPHA}"


def overall(verdicts: list[str]) -> Verdict:
    """A study's verdict from its claims'."""
    if all(v == "holds" for v in verdicts):
        return "holds"
    return "does not hold" if "does not hold" in verdicts else "inconclusive"


def command(name: str, scale: Scale, overrides: dict[str, Any] | None = None) -> str:
    """The command line that runs the study again as it ran."""
    overrides = overrides or {}
    given = [
        f"--{key} {','.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in overrides.items()
        if key in ("seeds", "steps")
    ]
    return " ".join([f"tzoo reproduce {name}", *([] if scale == "cpu" else [f"--scale {scale}"]), *given])


def reproduce(
    study: Study,
    out_dir: str | os.PathLike,
    scale: Scale = "cpu",
    overrides: dict[str, Any] | None = None,
    plugins: list[str] | None = None,
) -> StudyResult:
    """Run a study's comparison into ``out_dir`` and judge its claims: ``verdict.json`` and
    ``verdict.md`` beside the comparison's ``report.md``."""
    for module in plugins or ():  # before the spec, whose variants a plugin may provide
        get_registry().register_module(module)
    spec = study.spec(scale, overrides)
    out_dir = Path(out_dir)
    started = time.perf_counter()
    results = compare(spec, out_dir, plugins=plugins)
    if results is None:  # another process of a torchrun job
        raise RuntimeError("reproduce runs in one process; run it without torchrun")
    result = verdict(study, spec, results, scale, time.perf_counter() - started, command(study.name, scale, overrides))
    text = result.model_dump_json(indent=2)
    atomic_write(out_dir / "verdict.json", lambda tmp: tmp.write_text(text))
    page = "\n".join(study_lines(result))
    atomic_write(out_dir / "verdict.md", lambda tmp: tmp.write_text(page))
    return result


def verdict(
    study: Study, spec: CompareSpec, results: CompareResults, scale: Scale, wall_seconds: float, rerun: str
) -> StudyResult:
    """The study's outcome from its comparison's results: each claim judged, the source's figures
    beside ours, and the runs that stopped short of their steps (a time cap)."""
    short = short_runs(spec, results)
    claims = [
        judge(
            claim, results, [text for label, task, text in short if task == claim.task and label in (claim.a, claim.b)]
        )
        for claim in study.claims
    ]
    figures = [found for figure in study.figures if (found := beside(figure, results)) is not None]
    labels = list(dict.fromkeys(label for label, _ in planned_runs(spec)[0]))
    tallies = [] if study.tally is None else tally(study.tally, results, labels)
    return StudyResult(
        name=study.name,
        title=study.title,
        source=study.source,
        notes=study.notes,
        scale=scale,
        seeds=spec.seeds,
        steps=spec.steps,
        test=TEST_NAMES[spec.test],
        verdict=overall([c.verdict for c in claims]),
        claims=claims,
        figures=figures,
        tally=study.tally,
        tallies=tallies,
        short_runs=[text for _, _, text in short],
        wall_seconds=wall_seconds,
        report="report.md",
        command=rerun,
    )


def short_runs(spec: CompareSpec, results: CompareResults) -> list[tuple[str, str, str]]:
    """The runs that stopped before their steps (the spec's ``seconds`` ran out): their variant,
    task, and ``variant on task, seed S: N of M steps``, M from the run's own plan (a task's or a
    variant's budget, and a tuned twin's, its variant's)."""
    planned = {(label, config.task.kind): config.steps for label, config in planned_runs(spec)[0]}
    short = []
    for run in results.runs:
        steps = planned.get((run.variant, run.task), spec.steps)
        if run.steps < steps:
            short.append(
                (run.variant, run.task, f"{run.variant} on {run.task}, seed {run.seed}: {run.steps} of {steps} steps")
            )
    return short


def study_lines(result: StudyResult) -> list[str]:
    """A study's verdict as markdown: the claims' figures, their test and verdict."""
    lines = [f"# {result.name}: {result.verdict}", "", f"**{result.title}** ({result.source})", ""]
    if result.notes:
        lines += [result.notes.strip(), ""]
    lines += [
        (
            f"{result.scale} scale: seeds {result.seeds}, {result.steps} steps, {duration(result.wall_seconds)}; "
            f"{result.test}"
            + (
                "; a claim on one variant at two splits: the paired t-test"
                if any(c.claim.paired for c in result.claims)
                else ""
            )
            + "; 95% Student-t intervals over seeds (costs on the log scale, bounded metrics on the "
            f"arcsine-square-root scale). Rerun: `{result.command}`. Full comparison: "
            f"[{result.report}]({result.report})."
        ),
        "",
        "| claim | a | b | a - b [95% CI] | p | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in result.claims:
        cl = c.claim
        where = f"{cl.task}, {cl.metric}" if c.probe else f"{cl.task}, {cl.split} {cl.metric}"
        if cl.split_b and not c.probe:
            where = f"{cl.task}, {cl.metric}: a on {cl.split}, b on {cl.split_b}" + (
                ", paired by seed" if cl.paired else ""
            )
        delta = format_cell(Cell(mean=c.difference, low=c.low, high=c.high, n=c.a.n))
        p = "n/a" if c.p is None else f"{c.p:.3g}"
        lines.append(
            f"| {cl.statement} ({where}; {cl.relation}) | {cl.a}: {format_cell(c.a)} | {cl.b}: "
            f"{format_cell(c.b)} | {delta} | {p} | **{c.verdict}** |"
        )
    lines += [
        "",
        *[f"- {c.claim.statement}: {c.verdict}. {c.reason[0].upper() + c.reason[1:]}." for c in result.claims],
    ]
    if result.short_runs:
        lines += [
            "",
            f"**{len(result.short_runs)} run(s) stopped at the time cap before their steps**, so "
            "the verdicts above compare runs trained for different numbers of steps: "
            + "; ".join(result.short_runs)
            + ".",
        ]
    if result.tally is not None and result.tallies:
        lines += ["", *tally_lines(result.tally, result.tallies, result.test)]
    if result.figures:
        lines += [
            "",
            "The source's figures beside ours (mean [95% CI] over seeds, at this scale):",
            "",
            "| variant | task | metric | source | ours | where the source gives it |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {f.figure.variant} | {f.figure.task} | {f.figure.split} {f.figure.metric} | "
            f"{format_number(f.figure.value, 3)} | {format_cell(f.ours)} | {f.figure.where} |"
            for f in result.figures
        ]
    return lines


def summary_lines(results: list[StudyResult]) -> list[str]:
    """One row per study: claim | source | figures | verdict | time."""
    lines = [
        "| study | claim | source | our figures (mean [95% CI]; seeds, steps) | verdict | time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        figures = "; ".join(
            f"{c.claim.a} {format_cell(c.a)} vs {c.claim.b} {format_cell(c.b)} "
            f"({c.claim.task} {c.claim.metric}: {c.verdict})"
            for c in r.claims
        )
        short = f"; {len(r.short_runs)} run(s) stopped at the time cap" if r.short_runs else ""
        lines.append(
            f"| [{r.name}]({r.name}/verdict.md) | {r.title} | {r.source} | {figures}; {len(r.seeds)} seeds, "
            f"{r.steps} steps{short} | **{r.verdict}** | {duration(r.wall_seconds)} |"
        )
    return lines


def default_at_once(scale: Scale, count: int) -> int:
    """How many studies run at once by default: every one at the gpu scale on a machine with
    CUDA (each study's spec asks for the few GPU slots it needs, sized for sharing one GPU with
    the others), else one after another."""
    import torch

    return count if scale == "gpu" and torch.cuda.is_available() else 1


def reproduce_all(
    names: list[str],
    out_dir: str | os.PathLike,
    scale: Scale = "cpu",
    overrides: dict[str, Any] | None = None,
    plugins: list[str] | None = None,
    at_once: int | None = None,
) -> list[StudyResult]:
    """Run the named studies (each into ``out_dir/NAME``), then write ``out_dir/reproductions.md``,
    a row per study of this scale run so far in ``out_dir``, with the wall time of this call.
    Every study is validated before the first one trains.

    Args:
        plugins: plugin modules to register in every study's process (``--plugin``); plugins
            registered in this process are carried too.
        at_once: studies run at the same time, each in a process of its own whose output goes to
            ``out_dir/NAME/log.txt``; None: :func:`default_at_once`.

    Raises:
        ConfigError: two studies of one name (they would share a folder).
        StudiesFailed: a study run beside others failed; the others finished and are reported.
    """
    studies = [load_study(name) for name in names]
    twice = sorted({s.name for s in studies if [t.name for t in studies].count(s.name) > 1})
    if twice:
        raise ConfigError(f"studies {twice} are named more than once (a study's folder is its name); give each once")
    for study in studies:
        study.spec(scale, overrides)
    out_dir = Path(out_dir)
    at_once = default_at_once(scale, len(studies)) if at_once is None else at_once
    carried, stranded = get_registry().portable_plugins()
    if at_once > 1 and stranded:  # a study's own process could not register them
        print(
            f"plugin(s) {', '.join(stranded)} are not importable modules, so no study's own process could register "
            "them: the studies run one after another in this process",
            file=sys.stderr,
        )
        at_once = 1
    started = time.perf_counter()
    failed: dict[str, str] = {}
    if at_once <= 1 or len(studies) == 1:
        results = [reproduce(study, out_dir / study.name, scale, overrides, plugins) for study in studies]
    else:
        carry = list(dict.fromkeys([*(plugins or []), *carried]))
        results = _side_by_side(studies, out_dir, scale, overrides, carry, at_once, failed)
    wall = time.perf_counter() - started
    done = [StudyResult.model_validate_json(p.read_text()) for p in sorted(out_dir.glob("*/verdict.json"))]
    ran = f"This call ran {len(results)} of {len(studies)} studies, {at_once} at a time, in {duration(wall)} of wall time."
    page = "\n".join(
        [f"# Reproductions ({scale} scale)", "", ran, "", *summary_lines([r for r in done if r.scale == scale]), ""]
    )
    atomic_write(out_dir / "reproductions.md", lambda tmp: tmp.write_text(page))
    if failed:
        heading = f"{len(failed)} of {len(studies)} studies failed (the others are in {out_dir / 'reproductions.md'}):"
        raise StudiesFailed("\n".join([heading, *failed.values()]))
    return results


class StudiesFailed(ZooError):
    """Studies run side by side ended, and some of them failed."""


LOG_START = "== tzoo reproduce: "  # the line each start of a study writes first in its log


def _side_by_side(
    studies: list[Study],
    out_dir: Path,
    scale: Scale,
    overrides: dict[str, Any] | None,
    plugins: list[str],
    at_once: int,
    failed: dict[str, str],
) -> list[StudyResult]:
    """Run ``studies``, ``at_once`` at a time, each in a process of its own; returns the results
    of those that finished, and puts why each other failed in ``failed``. Ctrl-C is passed on,
    once, to each study (its comparison keeps what finished)."""
    context = get_context("spawn")
    waiting, running = list(studies), {}
    results: list[StudyResult] = []
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{duration(time.perf_counter() - begun)}] {message}", file=sys.stderr, flush=True)

    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                study = waiting.pop(0)
                (out_dir / study.name).mkdir(parents=True, exist_ok=True)
                log = out_dir / study.name / "log.txt"
                with open(log, "a") as stream:
                    stream.write(
                        f"{LOG_START}{study.name} at the {scale} scale, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                    )
                process = context.Process(
                    target=_reproduce_logged,
                    name=f"study {study.name}",
                    args=(study, out_dir / study.name, scale, overrides, plugins, str(log)),
                )
                process.start()
                running[process.sentinel] = (process, study, log)
                say(f"started {study.name} ({len(studies) - len(waiting)} of {len(studies)}); its log: {log}")
            for sentinel in connection.wait(list(running)):
                process, study, log = running.pop(sentinel)
                process.join()
                verdict = out_dir / study.name / "verdict.json"
                if process.exitcode == 0 and verdict.is_file():
                    result = StudyResult.model_validate_json(verdict.read_text())
                    results.append(result)
                    say(f"{study.name}: {result.verdict} ({duration(result.wall_seconds)})")
                else:
                    code = process.exitcode
                    ended = (
                        f"killed by {signal.Signals(-code).name}"
                        if code is not None and code < 0
                        else f"exit code {code}"
                    )
                    failed[study.name] = f"  {study.name} ({ended}): {_last_line(log)}; the log: {log}"
                    say(f"{study.name} failed ({ended}): {_last_line(log)}")
    except KeyboardInterrupt:
        for process, _, _ in running.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)  # each comparison keeps what finished and says so in its log
        for process, _, _ in running.values():
            process.join(60)
        from .runner import ComparisonInterrupted

        failures = f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""
        raise ComparisonInterrupted(
            f"reproduction interrupted with {len(results)} of {len(studies)} studies finished (in {out_dir}){failures}; "
            "run the same command again to go on: finished runs are reused and the others resume from their checkpoints"
        ) from None
    finally:  # an error here, or a study that did not stop in time: none is left running
        for process, _, _ in running.values():
            if process.is_alive():
                process.terminate()
                process.join(10)
    order = [study.name for study in studies]
    return sorted(results, key=lambda r: order.index(r.name))


def _reproduce_logged(
    study: Study, out_dir: Path, scale: Scale, overrides: dict[str, Any] | None, plugins: list[str], log: str
) -> None:
    """A study in a process of its own, its output (progress and errors) written to ``log``. The
    process leaves the terminal's group, so that Ctrl-C reaches it once, from the caller."""
    os.setpgrp()
    with open(log, "a") as stream:
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    try:
        reproduce(study, out_dir, scale, overrides, plugins)
    except KeyboardInterrupt as exc:
        print(exc, file=sys.stderr)
        sys.exit(130)


def _last_line(log: Path) -> str:
    """The last line the study's latest start wrote to its log."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line for line in text.rpartition(LOG_START)[2].splitlines()[1:] if line.strip()]
    return lines[-1].strip() if lines else "it wrote nothing"


def study_rows() -> list[dict[str, str]]:
    """The built-in studies, for ``tzoo reproduce`` with no name."""
    rows = []
    for name, path in available_studies().items():
        study = load_study(path)
        rows.append({"study": name, "claim": study.title, "source": study.source})
    return rows


def as_json(results: list[StudyResult]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in results]
