"""A study's tally: every variant against one reference, counted after Holm's correction.

Where a study asks how many of several modifications beat a baseline (Narang et al. 2021), one
claim per modification would test each at alpha on its own; a tally tests them as one family.
Each variant's difference from the reference is tested (the spec's test, Welch's by default),
the p-values are adjusted by Holm's step-down correction over the family, and each variant is
counted **better** (adjusted p below alpha, the difference the way the metric is better),
**worse** (adjusted p below alpha, the other way) or **not separable**. When the spec tunes
every variant and compares both (``tune: {compare: both}``), the untuned runs and the tuned
twins are tallied as two families, and the variants' ranks in each show whether tuning changed
the order (Melis et al. 2018; Narang et al. 2021).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from scipy import stats as _scipy

from ..core.validation import Options
from .records import ALPHA, Cell, CompareResults
from .stats import bounded_interval, difference, holm, interval
from .summary import format_cell, format_number
from .tuning import TUNED, untuned_label

Outcome = Literal["better", "not separable", "worse"]
OUTCOMES: tuple[Outcome, ...] = ("better", "not separable", "worse")


class Tally(Options):
    """Every other variant of the spec against ``reference`` on one task metric, as one family of
    tests: how many are better, not separable, worse after Holm's correction."""

    reference: str = Field(description="the baseline, by its label in the spec (untuned)")
    task: str = Field(description="the task kind")
    metric: str = Field(description="a metric of the task")
    split: str = Field("test", description="the evaluation split")
    source: dict[str, str] = Field(
        {}, description="the source's own figure or finding for a variant, by label, printed beside ours"
    )
    source_counts: str = Field("", description="the source's own count, in words, printed beside ours")


class TallyRow(BaseModel):
    """One variant against the reference."""

    label: str = Field(description="the variant, by label (a tuned twin's includes ' tuned')")
    cell: Cell = Field(description="its mean over seeds and 95% interval")
    difference: float = Field(description="its mean minus the reference's")
    low: float | None = Field(description="the difference's 95% interval (not adjusted); None: one seed")
    high: float | None
    p: float | None = Field(description="the test's two-sided p")
    p_holm: float | None = Field(description="p adjusted by Holm's correction over the family")
    outcome: Outcome
    rank: int = Field(description="its place by mean among the family and the reference (1: best)")


class TallyResult(BaseModel):
    """One family's tally."""

    family: Literal["as run", "untuned", "tuned"]
    reference: str
    reference_cell: Cell
    reference_rank: int
    rows: list[TallyRow]
    counts: dict[Outcome, int]
    direction: Literal["higher", "lower"]


def families(labels: list[str], reference: str) -> dict[str, tuple[str, list[str]]]:
    """The families to tally from the labels that ran: by name, the reference's label and the
    others'. With tuned twins (``LABEL tuned``) beside the untuned runs, two families; else one."""
    plain = [label for label in labels if not label.endswith(TUNED)]
    others = [label for label in plain if label != reference]
    if reference + TUNED in labels:
        tuned = [label + TUNED for label in others if label + TUNED in labels]
        if reference in labels:
            return {"untuned": (reference, others), "tuned": (reference + TUNED, tuned)}
        return {"tuned": (reference + TUNED, tuned)}
    return {"as run": (reference, others)}


def tally(spec: Tally, results: CompareResults, labels: list[str]) -> list[TallyResult]:
    """Each family's tally from the comparison's runs (``labels``: the labels that ran, in order)."""

    def values(label: str) -> list[float]:
        return [
            run.metrics[spec.split][spec.metric]
            for run in results.runs
            if run.variant == label and run.task == spec.task and spec.metric in run.metrics.get(spec.split, {})
        ]

    bounds = next((r.bounds[spec.metric] for r in results.runs if spec.metric in r.bounds), None)
    direction = next((r.better[spec.metric] for r in results.runs if spec.metric in r.better), "higher")
    sign = 1.0 if direction == "higher" else -1.0
    test = results.spec.get("test", "welch")
    out = []
    for family, (reference, others) in families(labels, spec.reference).items():
        base = values(reference)
        found = {label: v for label in others if (v := values(label))}
        if not base or not found:
            continue

        def cell(v: list[float]) -> Cell:
            return Cell(**(interval(v) if bounds is None else bounded_interval(v, bounds)).__dict__)

        tests = {label: difference(v, base, test) for label, v in found.items()}
        adjusted = dict(zip(tests, holm([d.p for d in tests.values()])))
        means = {reference: sum(base) / len(base), **{label: sum(v) / len(v) for label, v in found.items()}}
        order = sorted(means, key=lambda label: -sign * means[label])
        rows = []
        for label, d in tests.items():
            q = adjusted[label]
            outcome: Outcome = (
                "not separable" if q is None or q >= ALPHA else ("better" if sign * d.difference > 0 else "worse")
            )
            rows.append(
                TallyRow(
                    label=label,
                    cell=cell(found[label]),
                    difference=d.difference,
                    low=d.low,
                    high=d.high,
                    p=d.p,
                    p_holm=q,
                    outcome=outcome,
                    rank=order.index(label) + 1,
                )
            )
        out.append(
            TallyResult(
                family=family,
                reference=reference,
                reference_cell=cell(base),
                reference_rank=order.index(reference) + 1,
                rows=rows,
                counts={o: sum(r.outcome == o for r in rows) for o in OUTCOMES},
                direction=direction,
            )
        )
    return out


def rank_correlation(results: list[TallyResult]) -> float | None:
    """Spearman's correlation of the untuned and tuned ranks (1: tuning kept the order); None
    without both families or with fewer than three variants in common."""
    by = {r.family: r for r in results}
    if "untuned" not in by or "tuned" not in by:
        return None
    ranks = [
        {untuned_label(r.reference): r.reference_rank, **{untuned_label(row.label): row.rank for row in r.rows}}
        for r in (by["untuned"], by["tuned"])
    ]
    common = [label for label in ranks[0] if label in ranks[1]]
    if len(common) < 3:
        return None
    return float(_scipy.spearmanr([ranks[0][c] for c in common], [ranks[1][c] for c in common]).statistic)


def tally_lines(spec: Tally, results: list[TallyResult], test: str) -> list[str]:
    """The tally as markdown: one row per variant, a column pair per family, the counts last."""
    if not results:
        return []
    names = [r.family for r in results]
    rows: dict[str, dict[str, TallyRow]] = {}
    for r in results:
        for row in r.rows:
            rows.setdefault(untuned_label(row.label), {})[r.family] = row
    lines = [
        (
            f"### Every variant against {spec.reference} ({spec.task}, {spec.split} {spec.metric}; "
            f"{results[0].direction} is better)"
        ),
        "",
        (
            f"Each family's differences from its reference are tested by {test} and adjusted by Holm's correction "
            f"over the family; a variant counts as better or worse when its adjusted p is below {ALPHA}, else as not "
            "separable. The interval of each difference is the unadjusted 95% one; rank 1 is the best mean."
        ),
        "",
        "| variant | "
        + " | ".join(f"{n}: mean [95% CI] | {n}: difference, Holm p | {n}: rank" for n in names)
        + (" | source |" if spec.source else " |"),
        "|---|" + "---|---|---|" * len(names) + ("---|" if spec.source else ""),
    ]
    reference = untuned_label(results[0].reference)
    cells = [f"{format_cell(r.reference_cell)} | reference | {r.reference_rank}" for r in results]
    lines.append(
        f"| {reference} | " + " | ".join(cells) + (f" | {spec.source.get(reference, '')} |" if spec.source else " |")
    )
    for label, found in rows.items():
        parts = []
        for n in names:
            row = found.get(n)
            if row is None:
                parts.append("n/a | n/a | n/a")
                continue
            delta = format_cell(Cell(mean=row.difference, low=row.low, high=row.high, n=row.cell.n))
            q = "n/a" if row.p_holm is None else f"{row.p_holm:.2g}"
            parts.append(f"{format_cell(row.cell)} | {delta}, {q}: **{row.outcome}** | {row.rank}")
        lines.append(
            f"| {label} | " + " | ".join(parts) + (f" | {spec.source.get(label, '')} |" if spec.source else " |")
        )
    lines += ["", *[f"- {r.family}: " + _counts(r) for r in results]]
    rho = rank_correlation(results)
    if rho is not None:
        lines.append(
            f"- the order of the variants, untuned against tuned: Spearman's rank correlation {format_number(rho, 2)}"
            " (1: tuning kept the order)"
        )
    if spec.source_counts:
        lines.append(f"- the source: {spec.source_counts}")
    return lines


def _counts(result: TallyResult) -> str:
    counts = ", ".join(f"{result.counts[o]} {o}" for o in OUTCOMES)
    return f"of {len(result.rows)} variants against {result.reference}, {counts}"
