"""A study's claims judged from its comparison's runs, and the study's outcome.

A claim's verdict comes from the interval over seeds (95%, or a sequential look's level) of the
gain of ``a`` over ``b``: the difference ``a - b`` taken in the direction in which the metric is
better. Each relation has its smallest effect of interest δ (the claim's ``effect``), and three
regions (:func:`~transformer_zoo.comparing.sequential.region`):

- ``better``: **holds** when the interval lies above 0 (marked "smaller than the effect of
  interest" when it also lies below δ); **does not hold** when it reaches 0 or below and ends
  below δ (no gain as large as δ; with δ = 0, when it lies at or below 0); **inconclusive**
  otherwise.
- ``not-worse``: holds when the interval lies at or above ``-δ``; does not hold when it lies below
  ``-δ``.
- ``matches``: holds when the interval lies within ``[-δ, δ]``; does not hold when it lies
  wholly outside.
- ``steadier``: ``a``'s standard deviation over seeds is below ``b``'s and the Brown-Forsythe
  test of equal spread rejects (holds), or above it and the test rejects (does not hold).

The interval is the paired t-test's, on the per-seed differences, for one variant on two splits
and for two variants of a comparison declared ``pairing: seeds``; else the spec's test's (Welch's).

A claim on a sweep's ``sensitivity`` is judged the same way, on each swept variant's sensitivity
at each seed (:mod:`~transformer_zoo.comparing.studies.sweeps`), lower being better: ``better``
says a's final loss suffers less over the sweep than b's.
A study holds when every claim holds, does not hold when one does not, and is inconclusive
otherwise. A claim judged without some of its runs (a run that diverged has no probe's
measurement) names them in its reason; one with no seed left to judge it on is inconclusive.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from ...core.errors import ConfigError
from ...core.tasks import Better
from ..records import ALPHA, Cell, CompareResults
from ..sequential import region, smaller_than_effect
from ..spec import CompareSpec
from ..stats import TEST_NAMES, bounded_interval, difference, interval, paired_difference, seeds_needed, spread
from ..summary import format_number
from ..tallies import Tally, TallyResult, tally
from .spec import Claim, Scale, SourceFigure, Study, planned_runs
from .sweeps import DIVERGED, SENSITIVITY, InitialLosses, Sweep, SweepResult, sweep_result

Verdict = Literal["holds", "does not hold", "inconclusive"]


class ClaimResult(BaseModel):
    """A claim's figures over seeds and its verdict."""

    claim: Claim
    a: Cell | None = Field(description="a's mean over seeds and its 95% interval; None: no run of a has the figure")
    b: Cell | None = Field(description="b's mean and interval; None: no run of b has the figure")
    difference: float | None = Field(description="mean(a) - mean(b); None: a side has no figure")
    low: float | None = Field(
        description="the difference's interval at the claim's confidence (Welch-Satterthwaite, or the paired t's); "
        "None: one seed"
    )
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
    effect: float = Field(0.0, description="the smallest effect of interest the claim was judged with (the margin)")
    below_effect: bool = Field(
        False, description="holds, but the whole interval lies below the effect of interest: a gain smaller than it"
    )
    leaning: Verdict | None = Field(
        None, description="inconclusive: the verdict its interval is nearer to reaching (holds or does not hold)"
    )
    paired: bool = Field(False, description="judged by the paired t-test on the per-seed differences")
    unpaired_low: float | None = Field(
        None, description="paired claims between two variants: Welch's interval on the same runs, for comparison"
    )
    unpaired_high: float | None = None
    seeds: int = Field(0, description="the seeds the claim was judged on (the fewer of a's and b's)")
    confidence: float = Field(1 - ALPHA, description="the confidence level of the interval it was judged by")
    look: int | None = Field(
        None, description="seeds added until decided: the look (1, 2, ...) at which it was decided or last judged"
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
    sweeps: list[SweepResult] = Field(
        [], description="the study's sweep on each task its swept variants ran: their runs and sensitivities"
    )
    plots: list[str] = Field([], description="the study's figures (the sweep's), relative to the study's folder")
    wall_seconds: float = Field(description="wall time of the study's comparison")
    pairing: str = Field("none", description="the comparison's pairing of runs at one seed (none, seeds)")
    rounds: list[dict[str, Any]] = Field(
        [], description="seeds added until decided: each look's seeds, wall seconds and share of alpha"
    )
    stopped: str = Field("", description="seeds added until decided: why the rounds stopped")
    report: str = Field(description="the comparison's report.md, relative to the study's folder")
    command: str = Field(description="the command that runs the study again")


def _cell(results: CompareResults, metric: str, values: list[float]) -> Cell:
    """The mean and 95% interval of ``values``, within the metric's bounds where the task declares them."""
    bounds = next((r.bounds[metric] for r in results.runs if metric in r.bounds), None)
    return Cell(**(interval(values) if bounds is None else bounded_interval(values, bounds)).__dict__)


def judge(
    claim: Claim,
    results: CompareResults,
    stopped: list[str] = (),
    alpha: float = ALPHA,
    sweep: SweepResult | None = None,
) -> ClaimResult:
    """A claim's verdict from the comparison's runs (see the module's docstring for the rules).

    A run that gives the claim no figure (it diverged, and so has no probe's measurement; it failed
    otherwise; it did not record the metric) is left out, and its reason names it, with the seeds
    that a pairing left out for want of the other side's figure. A claim with no seed left to judge
    it on is inconclusive, not judged.

    Args:
        stopped: the claim's runs that stopped at the time cap before their steps: then the claim
            is not judged (inconclusive, the measured verdict in its reason), since a and b did not
            train alike.
        alpha: one minus the interval's confidence (a sequential look's level; 0.05: the 95% interval).
        sweep: the study's sweep on the claim's task, which a claim on its ``sensitivity`` reads.
    """
    by_seed, direction = _per_seed(claim, results, sweep)
    paired = claim.paired or results.spec.get("pairing") == "seeds"
    dropped = sorted(by_seed[0].keys() ^ by_seed[1].keys()) if paired else []
    scored = (bool(by_seed[0]), bool(by_seed[1]))  # at any seed, before the pairing
    if paired:  # the seeds scored on both sides, each against itself
        by_seed = [{seed: side[seed] for seed in sorted(by_seed[0].keys() & by_seed[1].keys())} for side in by_seed]
    a, b = (list(side.values()) for side in by_seed)
    without = _without_figure(claim, results, sweep)
    if not a or not b:
        return _no_figure(claim, results, direction, paired, scored, without)
    cells = {"a": _cell(results, claim.metric, a), "b": _cell(results, claim.metric, b)}
    welch = difference(a, b, results.spec.get("test", "welch"), 1 - alpha)
    diff = paired_difference(a, b, 1 - alpha) if paired else welch
    sd = spread(a, b)
    figures = dict(
        a=cells["a"],
        b=cells["b"],
        difference=diff.difference,
        low=diff.low,
        high=diff.high,
        sd_a=sd.sd_a,
        sd_b=sd.sd_b,
        probe=any(claim.metric in run.probes for run in results.runs),
        direction=direction,
        effect=claim.effect,
        paired=paired,
        unpaired_low=welch.low if paired and not claim.paired else None,
        unpaired_high=welch.high if paired and not claim.paired else None,
        seeds=min(len(a), len(b)),
        confidence=1 - alpha,
    )
    needed, p, leaning, below = None, diff.p, None, False
    if claim.relation == "steadier":
        (verdict, reason), p = _steadier(sd, claim, min(len(a), len(b)), alpha), sd.p
    else:
        verdict, reason, leaning, below = _by_interval(claim, diff.low, diff.high, direction, diff.difference, alpha)
    if dropped or without:
        reason += _left_out(dropped, without)
    if stopped:
        verdict, reason = _not_judged(verdict, reason, len(stopped))
        leaning = None
    elif verdict == "inconclusive" and diff.low is not None and claim.relation != "steadier":
        sides = (sd.sd_a, sd.sd_b)
        if paired:  # the interval is of the per-seed differences: half their variance on each side
            sides = (statistics.stdev(x - y for x, y in zip(a, b)) / math.sqrt(2),) * 2
        gain = (1.0 if direction == "higher" else -1.0) * diff.difference
        needed = seeds_needed(*sides, _gap(claim, gain), 1 - alpha)
        reason += (
            f"; at these spreads about {needed} seeds a side would decide it"
            if needed
            else "; at these spreads no practical number of seeds would decide it (the mean lies at or near the boundary)"
        )
    return ClaimResult(
        claim=claim,
        p=p,
        verdict=verdict,
        reason=reason,
        seeds_needed=needed,
        leaning=leaning,
        below_effect=below,
        **figures,
    )


def _per_seed(claim: Claim, results: CompareResults, sweep: SweepResult | None) -> tuple[list[dict[int, float]], str]:
    """a's and b's figures by seed, and which way they are better: the metric's (or a probe's) on
    each side's split, or a sweep's sensitivities, lower being better."""
    if claim.metric == SENSITIVITY:
        if sweep is None:
            raise ConfigError(
                f"claim {claim.statement!r} is on a sweep's sensitivity; judge it with the study's sweep on "
                f"{claim.task!r} (verdict() computes it)"
            )
        return [dict(sweep.of(claim.a).sensitivity), dict(sweep.of(claim.b).sensitivity)], "lower"
    by_seed = [
        results.by_seed(label, claim.task, split, claim.metric)
        for label, split in ((claim.a, claim.split), (claim.b, claim.b_split))
    ]
    direction = claim.direction or next(
        (r.better[claim.metric] for r in results.runs if claim.metric in r.better), "higher"
    )
    return by_seed, direction


def _without_figure(claim: Claim, results: CompareResults, sweep: SweepResult | None) -> list[str]:
    """The runs of the claim's sides that give it no figure, in words: each that diverged, failed
    otherwise, or finished without the metric (a probe measures nothing on a run that diverged);
    for a sensitivity, the runs of its sweeps that neither finished nor diverged."""
    if claim.metric == SENSITIVITY:
        return [] if sweep is None else [run for label in (claim.a, claim.b) for run in sweep.of(label).missing]
    found = []
    for label, split in ((claim.a, claim.split), (claim.b, claim.b_split)):
        for failed in results.failed:
            if failed.variant == label and failed.task == claim.task:
                why = "diverged" if failed.error.startswith(DIVERGED) else failed.error.splitlines()[0]
                found.append(f"{label}, seed {failed.seed}: {why}")
        for run in results.runs:
            if run.variant == label and run.task == claim.task:
                if run.probes.get(claim.metric, run.metrics.get(split, {}).get(claim.metric)) is None:
                    found.append(f"{label}, seed {run.seed}: no {claim.metric} recorded")
    return found


def _left_out(dropped: list[int], without: list[str]) -> str:
    """What a reason adds when some of the claim's runs give no figure: the seeds a pairing left out
    and those runs."""
    text = ""
    if dropped:
        text += f"; seeds {', '.join(map(str, dropped))} left out of the pairing, a side having no figure there"
    if without:
        text += f"; runs without a figure: {'; '.join(without)}"
    return text


def _no_figure(
    claim: Claim,
    results: CompareResults,
    direction: str,
    paired: bool,
    scored: tuple[bool, bool],
    without: list[str],
) -> ClaimResult:
    """The verdict of a claim with no seed to judge it on (every run of a side diverged, say):
    inconclusive, with the runs that give no figure."""
    if all(scored):  # each side has figures, at different seeds
        what = f"no seed at which both {claim.a!r} and {claim.b!r} on {claim.task!r} have a figure"
    elif claim.metric == SENSITIVITY:
        missing = claim.b if scored[0] else claim.a
        what = f"no seed at which every run of {missing!r}'s sweep on {claim.task!r} finished or diverged"
    else:
        missing, split = (claim.b, claim.b_split) if scored[0] else (claim.a, claim.split)
        what = f"no run of {missing!r} on {claim.task!r} recorded {split} {claim.metric}"
    return ClaimResult(
        claim=claim,
        a=None,
        b=None,
        difference=None,
        low=None,
        high=None,
        p=None,
        probe=any(claim.metric in run.probes for run in results.runs),
        direction=direction,
        verdict="inconclusive",
        reason=f"not judged: {what}" + (f" (runs without a figure: {'; '.join(without)})" if without else ""),
        effect=claim.effect,
        paired=paired,
    )


def claim_labels(claim: Claim, sweep: Sweep | None = None) -> set[str]:
    """The labels of the runs a claim reads: a and b, or each run of their sweeps for a claim on
    the sweep's sensitivity."""
    if claim.metric == SENSITIVITY and sweep is not None:
        return {label for variant in (claim.a, claim.b) for label in sweep.labels(variant)}
    return {claim.a, claim.b}


def sweep_results(
    sweep: Sweep, spec: CompareSpec, results: CompareResults, initial: Callable[[str, str, int], float] | None = None
) -> dict[str, SweepResult]:
    """The sweep on each task of the spec that its variants ran, by task name (``initial``: the
    loss at initialisation, :class:`~.sweeps.InitialLosses` of the spec when None)."""
    initial = initial or InitialLosses(spec, sweep)
    ran = {(run.variant, run.task) for run in results.runs} | {(f.variant, f.task) for f in results.failed}
    labels = {label for variant in sweep.variants for label in sweep.labels(variant)}
    return {
        task.name: sweep_result(sweep, results, task.name, initial)
        for task in spec.tasks
        if any((label, task.name) in ran for label in labels)
    }


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
    m = claim.effect
    if claim.relation == "better":
        return max(gain, m - gain)  # above 0: holds; below the effect: does not hold
    if claim.relation == "not-worse":
        return abs(gain + m)
    return abs(m - abs(gain))  # matches


def beside(figure: SourceFigure, results: CompareResults) -> FigureResult | None:
    """The source's figure and ours; None when no run of the variant recorded it."""
    ours = list(results.by_seed(figure.variant, figure.task, figure.split, figure.metric).values())
    return FigureResult(figure=figure, ours=_cell(results, figure.metric, ours)) if ours else None


def _by_interval(
    claim: Claim, low: float | None, high: float | None, direction: str, mean: float, alpha: float = ALPHA
) -> tuple[Verdict, str, Verdict | None, bool]:
    """The verdict, its reason, the verdict an inconclusive interval leans to, and whether a claim
    that holds does so by less than its effect of interest."""
    if low is None or high is None:
        return "inconclusive", "one seed a side gives no interval: run two or more seeds", None, False
    sign = 1.0 if direction == "higher" else -1.0
    lo, hi = sorted((sign * low, sign * high))  # the gain of a over b, the way the metric is better
    level = f"{100 * (1 - alpha):.3g}%"
    gain = (
        f"the gain of a over b ({direction} is better) is {format_number(sign * mean, 4)} "
        f"[{format_number(lo, 4)}, {format_number(hi, 4)}] ({level} interval)"
    )
    m, relation = claim.effect, claim.relation
    verdict: Verdict = {1: "holds", -1: "does not hold", 0: "inconclusive"}[int(region(lo, hi, relation, m))]
    shortfall = _shortfalls(lo, hi, relation, m)  # how far the interval is from each decision
    leaning = None if verdict != "inconclusive" else min(shortfall, key=shortfall.get)
    below = verdict == "holds" and relation == "better" and bool(smaller_than_effect(lo, hi, m))
    if relation == "better":
        effect = "0" if m == 0 else f"{m:g} (the effect of interest)"
        reason = {
            "holds": "the interval lies above 0"
            + (f", and below {m:g}: a gain smaller than the effect of interest" if below else ""),
            "does not hold": f"the interval reaches 0 or below and ends below {effect}"
            if m
            else "the interval lies at or below 0",
            "inconclusive": f"the interval spans 0 and {m:g}" if m else "the interval spans 0",
        }[verdict]
    elif relation == "not-worse":
        bound = f"-{m:g} (the margin)" if m else "0"
        reason = {
            "holds": f"the interval lies at or above {bound}",
            "does not hold": f"the interval lies below {bound}",
            "inconclusive": f"the interval spans {bound}",
        }[verdict]
    else:
        reason = {
            "holds": f"the interval lies within the margin ±{m:g}",
            "does not hold": f"the interval lies outside the margin ±{m:g}",
            "inconclusive": f"the interval reaches beyond the margin ±{m:g}",
        }[verdict]
    if leaning is not None:
        reason += f"; nearer to '{leaning}'"
    return verdict, f"{gain}: {reason}", leaning, below


def _shortfalls(lo: float, hi: float, relation: str, m: float) -> dict[Verdict, float]:
    """How far the gain's interval [lo, hi] is from holding and from not holding (0: there)."""
    if relation == "better":
        return {"holds": max(0.0, -lo), "does not hold": max(0.0, hi - m)}
    if relation == "not-worse":
        return {"holds": max(0.0, -m - lo), "does not hold": max(0.0, hi + m)}
    return {"holds": max(0.0, -m - lo, hi - m), "does not hold": max(0.0, min(m - lo, hi + m))}


def _steadier(sd: Any, claim: Claim, seeds: int, alpha: float = ALPHA) -> tuple[Verdict, str]:
    text = f"standard deviation over seeds: a {sd.sd_a:.4g}, b {sd.sd_b:.4g}"
    if seeds < 2:
        return "inconclusive", "one seed a side gives no spread: run two or more seeds"
    if sd.p is None:
        if sd.sd_a == sd.sd_b:
            return "does not hold", f"{text}: equal, so a is not steadier"
        return "inconclusive", f"{text}: too few seeds to test the spread"
    tested = f"{text}, Brown-Forsythe p = {sd.p:.3g}"
    if sd.p < alpha:
        return (
            ("holds", f"{tested}: a's is smaller")
            if sd.sd_a < sd.sd_b
            else ("does not hold", f"{tested}: a's is larger")
        )
    return "inconclusive", f"{tested}: not separable at alpha = {alpha:.3g}"


def overall(verdicts: list[str]) -> Verdict:
    """A study's verdict from its claims'."""
    if all(v == "holds" for v in verdicts):
        return "holds"
    return "does not hold" if "does not hold" in verdicts else "inconclusive"


def stopped_runs(
    claim: Claim, short: list[tuple[str, str, str]], results: CompareResults, sweep: Sweep | None = None
) -> list[str]:
    """The claim's runs among ``short`` (:func:`short_runs`: those that stopped before their
    steps), a suite's aggregate's being those of its tasks, a sensitivity's those of its sweeps."""
    parts = {run.task: set(run.aggregate_of) for run in results.runs if run.aggregate_of}
    labels = claim_labels(claim, sweep)
    return [text for label, task, text in short if task in parts.get(claim.task, {claim.task}) and label in labels]


def verdict(
    study: Study,
    spec: CompareSpec,
    results: CompareResults,
    scale: Scale,
    wall_seconds: float,
    rerun: str,
    claims: list[ClaimResult] | None = None,
    sweep: Sweep | None = None,
    initial: Callable[[str, str, int], float] | None = None,
) -> StudyResult:
    """The study's outcome from its comparison's results: each claim judged (unless ``claims``
    gives their verdicts, as seeds added until decided found them), the source's figures beside
    ours, the runs that stopped short of their steps (a time cap), and ``sweep`` (the study's at
    this scale, which expanded the spec) on each task, ``initial`` giving the loss at
    initialisation (None: computed)."""
    short = short_runs(spec, results)
    swept = {} if sweep is None else sweep_results(sweep, spec, results, initial)
    if claims is None:
        claims = [
            judge(claim, results, stopped_runs(claim, short, results, sweep), sweep=swept.get(claim.task))
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
        sweeps=list(swept.values()),
        wall_seconds=wall_seconds,
        pairing=spec.pairing,
        report="report.md",
        command=rerun,
    )


def short_runs(spec: CompareSpec, results: CompareResults) -> list[tuple[str, str, str]]:
    """The runs that stopped before their steps (the spec's ``seconds`` ran out): their variant,
    task, and ``variant on task, seed S: N of M steps``, M from the run's own plan (a task's or a
    variant's budget, and a tuned twin's, its variant's)."""
    planned = {(label, config.task.name): config.steps for label, config in planned_runs(spec)[0]}
    short = []
    for run in results.trained:
        steps = planned.get((run.variant, run.task), spec.steps)
        if run.steps < steps:
            short.append(
                (run.variant, run.task, f"{run.variant} on {run.task}, seed {run.seed}: {run.steps} of {steps} steps")
            )
    return short


def as_json(results: list[StudyResult]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in results]
