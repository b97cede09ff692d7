"""What a comparison shows, task by task: every column's mean and 95% interval over seeds, each
variant tested against the reference, the variant that is best (only when it is separable from
every other), and costs relative to the reference.

A column's intervals respect what it measures: a cost's stay above 0
(:func:`~transformer_zoo.comparing.stats.log_interval`), a metric's stay inside the bounds its
task declares (:func:`~transformer_zoo.comparing.stats.bounded_interval`), any other is the
Student-t interval (:func:`~transformer_zoo.comparing.stats.interval`).

A winner is named only when a test says so: the best mean of a column is bold when its
difference to every other variant's is significant at :data:`~transformer_zoo.comparing.records.ALPHA`.
The tests against the reference also carry Holm's correction over all of a task's tests
(:func:`~transformer_zoo.comparing.stats.holm`). Costs measured in different invocations (a run
kept from an interrupted comparison ran under other load) are never compared.

Every number of a column is written in one format, chosen from all of them (:func:`column_decimals`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .records import ALPHA, Cell, Column, RunRecord, TaskSummary, Test, TestKind
from .stats import (
    TESTS_RUN,
    Interval,
    bounded_interval,
    holm,
    interval,
    log_interval,
    seeded_difference,
    smallest_p,
)

HEADLINE_SPLIT = "test"


@dataclass(frozen=True)
class _Getter:
    column: Column
    get: Callable[[RunRecord], float | None]


def _getters(records: list[RunRecord]) -> list[_Getter]:
    splits = sorted({split for r in records for split in r.metrics}, key=lambda s: (s != HEADLINE_SPLIT, s))
    names = sorted({name for r in records for values in r.metrics.values() for name in values})
    better = {name: next(r.better[name] for r in records if name in r.better) for name in names}  # as the task declares
    bounds = {name: next((r.bounds[name] for r in records if name in r.bounds), None) for name in names}
    getters = [
        _Getter(
            Column(
                name=f"{split} {name}",
                kind="metric",
                better=better[name],
                bounds=bounds[name],
                scale="linear" if bounds[name] is None else "arcsine-sqrt",
            ),
            lambda r, s=split, n=name: r.metrics.get(s, {}).get(n),
        )
        for split in splits
        for name in names
    ]
    for stack in sorted({stack for r in records for stack in r.ponder_time}):
        getters.append(
            _Getter(Column(name=f"{stack} ponder", kind="ponder", better=None), lambda r, s=stack: r.ponder_time.get(s))
        )
    for name in sorted({name for r in records for name in r.probes}):  # what the spec's probes measured
        getters.append(_Getter(Column(name=name, kind="probe", better=None), lambda r, n=name: r.probes.get(n)))
    getters += [
        _Getter(Column(name="parameters", kind="cost", better=None, scale="log"), lambda r: r.parameters),
        _Getter(Column(name="FLOPs/token", kind="cost", better=None, scale="log"), lambda r: r.flops_per_token),
        _Getter(
            Column(name="train tokens/s", kind="cost", better="higher", scale="log"),
            lambda r: r.train_tokens_per_second,
        ),
        _Getter(Column(name="peak MiB", kind="cost", better="lower", scale="log"), lambda r: r.peak_memory_mb),
        _Getter(Column(name="wall s", kind="cost", better="lower", scale="log"), lambda r: r.wall_seconds),
    ]
    if any(r.tuning_seconds is not None for r in records):  # what finding a tuned variant's setting took
        getters.append(
            _Getter(
                Column(name="tuning s", kind="cost", better=None, scale="log"),  # one figure a
                lambda r: r.tuning_seconds,
            )
        )  # variant, on each of its seeds: nothing to test
    return getters


def _interval(column: Column, values: list[float]) -> Interval:
    """The mean and interval of ``values`` on the column's scale."""
    if column.scale == "log":
        return log_interval(values)
    if column.bounds is not None:  # the arcsine-sqrt scale
        return bounded_interval(values, column.bounds)
    return interval(values)


TIMES = ("train tokens/s", "wall s")  # costs that depend on the machine's load at the time


def summarize_task(
    records: list[RunRecord],
    reference: str | None = None,
    test: TestKind = "welch",
    invocation: str | None = None,
    paired: bool = False,
) -> TaskSummary:
    """The statistics of one task's runs (every variant, every seed).

    Args:
        reference: the variant to test the others against; None or absent from the task: the
            first variant of ``records``.
        invocation: this comparison's; runs of another make the task's times incomparable.
        paired: the runs at one seed were paired (``pairing: seeds``): each variant is tested
            against the reference by the paired t-test on the per-seed differences.
    """
    variants = list(dict.fromkeys(r.variant for r in records))
    reference = reference if reference in variants else variants[0]
    getters = _getters(records)
    values = {  # variant -> column -> seed -> value
        v: {
            g.column.name: {r.seed: x for r in records if r.variant == v and (x := g.get(r)) is not None}
            for g in getters
        }
        for v in variants
    }
    cells = {
        v: {
            g.column.name: Cell(**_interval(g.column, list(values[v][g.column.name].values())).__dict__)
            for g in getters
            if values[v][g.column.name]
        }
        for v in variants
    }
    comparable = invocation is None or all(r.invocation == invocation for r in records)
    columns = []
    for g in getters:
        column = g.column.model_copy()
        if column.better is not None and (column.name not in TIMES or comparable):
            column.best = _separable_best(values, column.name, column.better == "higher", test, paired)
        column.decimals = column_decimals(
            x for v in variants if (cell := cells[v].get(column.name)) for x in (cell.mean, cell.low, cell.high)
        )
        if column.bounds is not None:  # a score in a range keeps its decimals where every seed scored 1
            column.decimals = max(column.decimals, 3)
        columns.append(column)
    task, metric = records[0].task, records[0].metric
    headline = f"{HEADLINE_SPLIT} {metric}"
    tested = [
        (c.name, v, seeded_difference(values[v][c.name], values[reference][c.name], paired, test))
        for c in columns
        if c.kind == "metric"
        for v in variants
        if v != reference and values[v][c.name] and values[reference][c.name]
    ]
    tests = [
        Test(
            variant=v,
            reference=reference,
            column=name,
            test=d.test,
            separable=d.separable(),
            p_holm=q,
            survives_holm=q is not None and q < ALPHA,
            **{k: getattr(d, k) for k in ("difference", "low", "high", "p")},
        )
        for (name, v, d), q in zip(tested, holm([d.p for _, _, d in tested]))
    ]
    higher = records[0].better[metric] == "higher"
    leaders = _leaders(values, headline, higher, test, paired)
    seeds = min(len(values[v][headline]) for v in variants)
    best = next(c.best for c in columns if c.name == headline)
    ratios = {
        v: {
            name: cells[v][name].mean / cells[reference][name].mean
            for name in ("parameters", "FLOPs/token", "peak MiB", *TIMES)
            if (name not in TIMES or comparable)
            and cells[reference].get(name)
            and cells[reference][name].mean
            and name in cells[v]
        }
        for v in variants
        if v != reference
    }
    return TaskSummary(
        task=task,
        headline=headline,
        reference=reference,
        test="paired" if paired else test,
        seeds=seeds,
        columns=columns,
        cells=cells,
        tests=tests,
        best=best,
        leaders=leaders,
        verdict=_verdict(
            variants,
            cells,
            headline,
            best,
            leaders,
            seeds,
            "paired" if paired else test,
            next(c.decimals for c in columns if c.name == headline),
        ),
        costs_comparable=comparable,
        cost_ratios=ratios,
    )


def summarize(
    records: list[RunRecord],
    reference: str | None = None,
    test: TestKind = "welch",
    invocation: str | None = None,
    paired: bool = False,
) -> list[TaskSummary]:
    """:func:`summarize_task` for every task of ``records``, in their order."""
    tasks = list(dict.fromkeys(r.task for r in records))
    return [
        summarize_task([r for r in records if r.task == task], reference, test, invocation, paired) for task in tasks
    ]


def _ranked(values: dict, name: str, higher: bool) -> list[str]:
    present = [v for v in values if values[v][name]]
    return sorted(present, key=lambda v: statistics.fmean(values[v][name].values()), reverse=higher)


def _leaders(values: dict, name: str, higher: bool, test: TestKind, paired: bool = False) -> list[str]:
    """The variant with the best mean in column ``name``, and every variant not separable from it
    (by ``test``, or the paired t-test on the seeds both ran)."""
    ranked = _ranked(values, name, higher)
    if not ranked:
        return []
    top = ranked[0]
    return [top] + [
        v for v in ranked[1:] if not seeded_difference(values[top][name], values[v][name], paired, test).separable()
    ]


def _separable_best(values: dict, name: str, higher: bool, test: TestKind, paired: bool = False) -> str | None:
    """The variant with the best mean in column ``name`` if it differs significantly from every other."""
    leaders = _leaders(values, name, higher, test, paired)
    return leaders[0] if len(leaders) == 1 and len(_ranked(values, name, higher)) > 1 else None


def column_decimals(values: Iterable[float | None]) -> int:
    """The decimals one column's numbers are written with, chosen from all of them (every
    variant's mean and interval ends): none once a value reaches 1,000 (``4,590 [3,210, 5,970]``)
    or when every value is whole (parameters); otherwise three, or more where the largest value
    needs them for three significant digits (``0.00123``). None values (no interval) are passed over."""
    found = [abs(x) for x in values if x is not None and math.isfinite(x)]
    if not found:
        return 3
    largest = max(found)
    if largest >= 1000 or all(x.is_integer() for x in found):
        return 0
    return max(3, 2 - math.floor(math.log10(largest)))


def format_cell(cell: Cell | None, decimals: int | None = None) -> str:
    """``mean [low, high]`` (the 95% interval), every number with ``decimals`` decimals and thousands
    separators (a table passes its column's :attr:`~transformer_zoo.comparing.records.Column.decimals`;
    None: :func:`column_decimals` of the cell's own numbers); one seed, or seeds that agree
    exactly, the mean alone."""
    if cell is None:
        return "n/a"
    if decimals is None:
        decimals = column_decimals((cell.mean, cell.low, cell.high))
    text = format_number(cell.mean, decimals)
    if cell.low is None or cell.low == cell.high:
        return text
    return f"{text} [{format_number(cell.low, decimals)}, {format_number(cell.high, decimals)}]"


def format_number(value: float, decimals: int | None = None) -> str:
    """``value`` with ``decimals`` decimals and thousands separators (None: as
    :func:`column_decimals` chooses for the value alone)."""
    return f"{value:,.{column_decimals([value]) if decimals is None else decimals}f}"


def _verdict(variants, cells, headline, best, leaders, seeds, test, decimals) -> str:
    if len(variants) < 2:
        return f"Only {variants[0]} ran this task: nothing to compare."
    top = leaders[0]
    stated = f"{top} has the best mean, {format_cell(cells[top].get(headline), decimals)}"
    if seeds < 2:
        return (
            f"One seed: no test was possible, so no variant is called best ({stated}). "
            "Run two or more seeds (--seeds 0,1,2) to test the differences."
        )
    how = f"{TESTS_RUN[test]} over {seeds} seeds, alpha = {ALPHA}"
    if best is not None:
        return (
            f"{best} is best: {format_cell(cells[best][headline], decimals)}, separable from every other variant "
            f"({how})."
        )
    floor = smallest_p(seeds, seeds, test)
    note = (
        f" With {seeds} seeds a side this test cannot give p below {floor:.2g}: run more seeds."
        if floor is not None and floor >= ALPHA
        else ""
    )
    return (
        f"Not separable at {seeds} seeds: {', '.join(leaders)} ({stated}; the others listed are not "
        f"separable from it, {how}).{note}"
    )
