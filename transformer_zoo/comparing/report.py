"""The compare report: ``report.md``, the findings first and the spec last, with its PNG plots."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from .plots import (
    plot_curves,
    plot_lengths,
    plot_metric_vs_parameters,
    plot_scaling,
    plot_throughput,
    plot_tuning,
    plot_widths,
)
from .records import ALPHA, MODE_NAMES, MODES, CompareResults, RunRecord, ScalingPoint, TaskSummary
from .stats import TEST_NAMES, TESTS_RUN
from .suites import task_name
from .summary import column_decimals, format_cell, format_number

KEPT = "†"  # marks a variant with runs kept from an earlier invocation


def task_table(summary: TaskSummary, records: list[RunRecord]) -> str:
    """One row per variant: each column's mean [95% interval] over seeds, in the column's one
    number format; a column's best in bold when it is separable from every other variant."""
    names = [column.name for column in summary.columns]
    best = {column.name: column.best for column in summary.columns}
    decimals = {column.name: column.decimals for column in summary.columns}
    lines = ["| variant | seeds | " + " | ".join(names) + " |", "|" + " --- |" * (len(names) + 2)]
    for variant, cells in summary.cells.items():
        kept = KEPT if any(r.reused for r in records if r.variant == variant) else ""
        texts = [format_cell(cells.get(name), decimals[name]) for name in names]
        row = [f"**{text}**" if best[name] == variant else text for name, text in zip(names, texts)]
        seeds = max(cell.n for cell in cells.values())
        lines.append(f"| {variant}{kept} | {seeds} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def tests_table(summary: TaskSummary) -> str:
    """Every variant against the reference, in each metric column: p, and p after Holm's
    correction over all of the task's tests, with whether each difference survives it."""
    decimals = {column.name: column.decimals for column in summary.columns}
    family = sum(test.p is not None for test in summary.tests)
    lines = [
        (
            f"Against the reference, {summary.reference} ({TESTS_RUN[summary.test]}; the difference is the "
            "variant's mean minus the reference's, with its 95% interval; Holm p is p adjusted by Holm's step-down "
            f"correction over the task's {family} tests, and a difference separable at {ALPHA} survives it when "
            f"Holm p < {ALPHA} too):"
        ),
        "",
        f"| variant | column | difference [95% CI] | p | Holm p | separable at {ALPHA} | survives Holm |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for test in summary.tests:
        d = decimals.get(test.column)
        if test.p is None:
            lines.append(
                f"| {test.variant} | {test.column} | {format_number(test.difference, d)} | n/a | n/a | "
                "no test (one seed) | n/a |"
            )
            continue
        interval = f"{format_number(test.difference, d)} [{format_number(test.low, d)}, {format_number(test.high, d)}]"
        holm = "n/a" if test.p_holm is None else f"{test.p_holm:.3g}"
        lines.append(
            f"| {test.variant} | {test.column} | {interval} | {test.p:.3g} | {holm} | "
            f"{'yes' if test.separable else 'no'} | {'yes' if test.survives_holm else 'no'} |"
        )
    return "\n".join(lines)


def task_verdict_lines(summaries: list[TaskSummary]) -> list[str]:
    """Per task: the verdict, and what the best mean costs against the reference."""
    lines = []
    for summary in summaries:
        lines.append(f"- **{summary.task}** ({summary.headline}): {summary.verdict}")
        top = summary.leaders[0] if summary.leaders else None
        if top is None or top == summary.reference:
            if len(summary.cells) > 1:
                lines.append(f"  The reference, {summary.reference}, has the best mean.")
            continue
        ratios = summary.cost_ratios.get(top, {})
        costs = ", ".join(f"{value:.2f}x {name}" for name, value in ratios.items())
        lines.append(
            f"  Cost of {top} against the reference, {summary.reference}: {costs}."
            + (
                ""
                if summary.costs_comparable
                else " Times are not compared: runs of this task come from different invocations."
            )
        )
    return lines


def condition_lines(results: CompareResults) -> list[str]:
    """Warnings about how the runs were measured: retried, kept from another invocation, or under load."""
    lines = []
    retried = [r for r in results.trained if r.attempts > 1]
    if retried:
        lost = sum(r.wall_seconds - (r.last_attempt_seconds or r.wall_seconds) for r in retried)
        lines.append(
            f"- {len(retried)} of {len(results.trained)} runs were started more than once (a worker or node died): "
            "each went on from its last checkpoint, at the step its attempts column gives. Their wall s counts "
            f"from the first start, so the {lost:.0f} s their earlier starts took are in it, and in the cost "
            "tests of wall time."
        )
    kept = [r for r in results.trained if r.reused]
    if kept:
        lines.append(
            f"- {len(kept)} of {len(results.trained)} runs (marked {KEPT}) were kept from an earlier invocation "
            f"({_started(kept)}); their times were measured under other conditions, so times of tasks that mix "
            "invocations are neither bolded nor compared."
        )
    loaded = [r for r in results.trained if r.cpus and r.load_average >= r.cpus + 1]  # a process more than cores
    if loaded:
        worst = max(loaded, key=lambda r: r.load_average / r.cpus)
        lines.append(
            f"- The machine's load exceeded its cores by one or more during {len(loaded)} runs (at worst "
            f"{worst.load_average:.1f} on {worst.cpus} cores, {worst.variant} on {worst.task}, seed "
            f"{worst.seed}): other work competed with them, and their times are slower than the machine's."
        )
    return lines


def _started(runs: list[RunRecord]) -> str:
    """When ``runs`` started, as one time or the first and last (UTC)."""
    times = sorted({r.started for r in runs if r.started})
    if not times:
        return "started at an unknown time"
    return f"started {times[0]} UTC" if len(times) == 1 else f"started {times[0]} to {times[-1]} UTC"


def scored_lengths(spec: dict[str, Any], task: str, runs: list[RunRecord]) -> dict[str, int]:
    """The splits of ``task`` its options name a length for (their ``lengths``: ``python-source``'s
    ``test`` and ``test_Nx``, a Chomsky task's length buckets), with the tokens of their inputs:
    what a plot of the metric against the length shows; empty for a task with none."""
    from ..registry import get_registry

    splits = {split for run in runs for split in run.metrics}
    given = next((t for t in spec.get("tasks", []) if isinstance(t, dict) and task_name(t) == task), None)
    kinds = get_registry().components("task")
    if given is None or given.get("kind") not in kinds:
        return {}
    options = kinds[given["kind"]].model_validate(given, context={"registry": get_registry()})
    return {split: n for split, n in getattr(options, "lengths", {}).items() if split in splits}


def suite_lines(spec: dict[str, Any], aggregate: RunRecord) -> str:
    """What a suite's aggregate is."""
    from .suites import load_suite

    suite = load_suite(spec["suite"])
    kinds = list(dict.fromkeys(task["kind"] for task in suite.tasks))
    text = (
        f"The {suite.name} suite ({suite.title}; {suite.source}): for each variant and seed, the mean of test "
        f"{aggregate.metric} over its {len(kinds)} task kinds ({', '.join(kinds)}), each weighted equally"
        + (f", a kind's {len(suite.tasks)} settings averaged first" if len(kinds) < len(suite.tasks) else "")
        + "; its wall time and steps are the sums over those runs, its parameters and peak memory their largest."
    )
    return text + (f" {suite.notes}" if suite.notes else "")


def suite_section(results: CompareResults, out_dir: Path) -> list[str]:
    """The suite's source, and the metric against model width on each of its tasks where its
    variants differ in width (a line per variant stem, Zoology's Figure 2); a task's plot against
    input length is in its own section."""
    from .suites import load_suite

    suite = load_suite(results.spec["suite"])
    lines = [f"## Suite: {suite.name}", "", f"{suite.title} ({suite.source}).", ""]
    for kind in map(task_name, suite.tasks):
        runs = [r for r in results.trained if r.task == kind]
        if not runs:
            continue
        widths = {r.width for r in runs if r.width and math.isfinite(r.metrics.get("test", {}).get(r.metric, math.nan))}
        if "width" in suite.plots and len(widths) > 1:
            plot_widths(runs, kind, out_dir / f"widths-{kind}.png")
            lines += [f"![{kind}: {runs[0].metric} by model width](widths-{kind}.png)", ""]
    return lines


def runs_table(records: list[RunRecord]) -> str:
    lines = [
        "| variant | task | seed | started (UTC) | where | threads | load / cores | attempts | wall s | kept |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    wall = column_decimals(r.wall_seconds for r in records)
    for r in records:
        lines.append(
            f"| {r.variant} | {r.task} | {r.seed} | {r.started or 'n/a'} | {r.placed_on or 'n/a'} | "
            f"{r.threads or 'n/a'} | {r.load_average:.1f} / {r.cpus or 'n/a'} | "
            f"{r.attempts}{'' if r.resumed_from is None else f' (resumed at step {r.resumed_from})'} | "
            f"{format_number(r.wall_seconds, wall)} | {'yes' if r.reused else ''} |"
        )
    return "\n".join(lines)


def paired_lines(results: CompareResults) -> list[str]:
    """What runs at one seed shared (``pairing: seeds``), and per task and variant how many of its
    parameters, and what share of its weights, started from an earlier variant's values, with the
    names of those that kept their own (its first seed's run: every seed shares alike)."""
    lines = [
        (
            "Seeds were paired (`pairing: seeds`): at each seed, a variant's parameter whose name and shape agree "
            "with one of a variant before it in the spec, on the same task, started from that variant's initial "
            "value (the first such variant's), and its other parameters from its own initialisation; after "
            "initialising, every run's random stream (dropout, random position offsets) started again from the "
            "seed, and batches come from the seed and step alike. The first variant on a task keeps its own values, "
            "which the later ones take; what differs between two variants at one seed is their architecture and "
            "the parameters each kept as its own."
        ),
        "",
        "| task | variant | parameters from an earlier variant | share of its weights | kept their own |",
        "| --- | --- | --- | --- | --- |",
    ]
    firsts: dict[tuple[str, str], RunRecord] = {}
    for record in results.trained:
        firsts.setdefault((record.task, record.variant), record)
    for (task, variant), record in firsts.items():
        count = len(record.shared) + len(record.own)
        share = record.shared_weights / max(record.parameters, 1)
        kept = "all" if not record.shared else _grouped(record.own) or "none"
        lines.append(f"| {task} | {variant} | {len(record.shared)} of {count} | {share:.1%} | {kept} |")
    return lines


def _grouped(names: list[str]) -> str:
    """Parameter names, those that differ in their numbers alone (a layer's index) written once
    with ``*`` and a count: ```decoder.layers.*.norm.weight` (x2)``."""
    groups = Counter(re.sub(r"(?<![^.])\d+(?![^.])", "*", name) for name in names)
    return ", ".join(f"`{group}`" + (f" (x{n})" if n > 1 else "") for group, n in groups.items())


def scaling_tables(points: list[ScalingPoint]) -> str:
    """Time and peak memory by model and length, then each sparse model against its full-attention twins."""
    lengths = sorted({p.length for p in points})
    at = {(p.variant, p.attention, p.mode, p.length): p for p in points}
    models = list(dict.fromkeys((p.variant, p.attention) for p in points))
    names = {(p.variant, p.attention): p.label for p in points}
    head = "| model | pass | " + " | ".join(f"n = {n}" for n in lengths) + " |"
    rule = "|" + " --- |" * (len(lengths) + 2)
    lines = ["Time (ms) and peak memory (MiB) of one pass:", "", head, rule]
    for variant, attention in models:
        for mode in MODES:
            cells = [at.get((variant, attention, mode, n)) for n in lengths]
            text = [
                ("failed" if c.error else f"{c.seconds * 1e3:,.1f} ms, {c.peak_mb:,.1f} MiB") if c else "n/a"
                for c in cells
            ]
            lines.append(f"| {names[variant, attention]} | {MODE_NAMES[mode]} | " + " | ".join(text) + " |")
    twins = [(v, a) for v, a in models if a != "as configured"]
    if twins:
        lines += [
            "",
            (
                "Against full attention: the model as configured over the same model with a full attention "
                "kind, time x and memory x (below 1: the sparse model is cheaper):"
            ),
            "",
            head,
            rule,
        ]
        for variant, attention in twins:
            for mode in MODES:
                cells = []
                for n in lengths:
                    mine, full = at.get((variant, "as configured", mode, n)), at.get((variant, attention, mode, n))
                    cells.append(
                        f"{mine.seconds / full.seconds:.2f}x time, {mine.peak_mb / full.peak_mb:.2f}x memory"
                        if mine and full and full.seconds and full.peak_mb and mine.seconds
                        else "n/a"
                    )
                lines.append(f"| {variant} vs [{attention}] | {MODE_NAMES[mode]} | " + " | ".join(cells) + " |")
    failed = [p for p in points if p.error and p.mode == MODES[0]]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{p.label} at n = {p.length} ({p.error})" for p in failed) + "."]
    return "\n".join(lines)


def _method(results: CompareResults) -> str:
    spec = results.spec
    return (
        f"Every run of a task had the same data and budget; each variant ran with seeds {spec.get('seeds')}. "
        "A cell is the mean over seeds with its 95% confidence interval in brackets (one seed: the value alone), "
        "every number of a column in one format: a cost's interval is the Student-t interval of the mean log, "
        "exponentiated, so it stays above 0; a metric with a declared range (an accuracy, BLEU) has the "
        "Student-t interval on the arcsine-square-root scale, mapped back inside the range; any other column has "
        "the Student-t interval. Each interval contains its mean. Each variant is tested against the reference "
        f"with {TEST_NAMES[spec.get('test', 'welch')]} over seeds. The best mean of a column is bold only when it "
        f"is separable from every other variant's at alpha = {ALPHA}; a single seed, or means within each other's "
        "noise, bold nothing. These tests say whether a difference would recur with other seeds of this spec "
        "(initialisation, batch order, dropout), not whether it holds for other budgets, sizes or data. Several "
        "columns tested at once will now and then show a difference by chance: the tests against the reference "
        "also give p after Holm's correction over all of a task's tests, and a difference that survives it is "
        "not one of those chance findings (at most a 5% chance of any in the task). FLOPs per token are those of one training step's forward and "
        "backward on one batch, counted by PyTorch's FlopCounterMode, per token read. Peak memory on CPU is the "
        "tensor storage alive at once during one training step on the run's first batch (weights, gradients, "
        "AdamW state, activations), counted exactly; on CUDA, the allocator's peak over the run. Tokens per "
        "second and wall time vary with the machine's load: see the runs table."
    )


def write_report(results: CompareResults, out_dir: Path) -> Path:
    """Write ``report.md`` and the plots; returns the report's path."""
    records, spec = results.trained, results.spec
    threads = sorted({r.threads for r in records if r.threads})
    lines = [f"# Comparison: {spec.get('name', 'compare')}", ""]
    places = sorted({r.placed_on for r in records if r.placed_on and not r.reused})
    lines += [
        f"{len(records)} runs ({len(spec.get('seeds', []))} seeds) on the {spec.get('executor', 'local')} executor"
        + (f" ({', '.join(places)})" if places else "")
        + " with "
        f"{', '.join(map(str, threads)) or 'n/a'} CPU thread(s) each, on {results.machine.get('device')} "
        f"({results.machine.get('cpus')} cores), invocation {results.invocation or 'n/a'} begun "
        f"{results.started + ' UTC' if results.started else 'at an unknown time'}.",
        "",
    ]
    lines += ["## Summary", "", *task_verdict_lines(results.summaries), ""]
    warnings = condition_lines(results)
    if warnings:
        lines += ["Measurement conditions:", "", *warnings, ""]
    if spec.get("suite"):
        lines += suite_section(results, out_dir)
    if results.tuning:
        lines += ["## Tuning", "", *tuning_lines(results, out_dir), ""]
    for summary in results.summaries:
        task = summary.task
        runs = [r for r in results.runs if r.task == task]
        lines += [f"## {task}", "", summary.verdict, "", task_table(summary, runs), ""]
        if runs[0].aggregate_of:  # a suite's aggregate: no runs of its own to plot
            lines += [suite_lines(spec, runs[0]), ""]
            if len(summary.cells) > 1:
                lines += [tests_table(summary), ""]
            continue
        if len(summary.cells) > 1:
            lines += [tests_table(summary), ""]
        if task in results.baselines:
            scores = ", ".join(f"test {name} {format_number(value)}" for name, value in results.baselines[task].items())
            lines += [f"{results.baseline_names.get(task, 'Baseline')}: {scores}.", ""]
        curve = out_dir / f"curves-{task}.png"
        plot_curves(runs, task, curve)
        lines += [f"![{task} learning curves]({curve.name})", ""]
        lengths = scored_lengths(results.spec, task, runs)
        if len(lengths) > 1:
            plot_lengths(runs, task, lengths, out_dir / f"lengths-{task}.png")
            lines += [f"![{task}: {runs[0].metric} by input length](lengths-{task}.png)", ""]
        for record in runs:
            if record.samples_plot and record.seed == runs[0].seed:
                lines += [
                    f"Samples of {record.variant} (seed {record.seed}), a row per class:",
                    "",
                    f"![{record.variant} samples on {task}]({record.samples_plot})",
                    "",
                ]
            if record.ponder_plot and record.seed == runs[0].seed:
                lines += [
                    f"Ponder time of {record.variant} (seed {record.seed}) on one test example:",
                    "",
                    f"![{record.variant} ponder time on {task}]({record.ponder_plot})",
                    "",
                ]
    if results.scaling:
        task = spec["scaling"].get("task") or task_name(spec["tasks"][0])
        plot_scaling(results.scaling, out_dir / "scaling.png")
        lines += [
            f"## Time and memory against length ({task} models)",
            "",
            (
                f"Each variant as configured for {task}, freshly initialised (cost does not depend on training), "
                "on one batch of test sequences tiled to each length, with max_len raised where needed. "
                "A variant whose self-attention is not full is also measured with each full kind in its place "
                "(in brackets: `sdpa` runs PyTorch's fused kernels, `math` writes out the n x n weights). "
                "Times are medians of repeated passes; memory is the peak of the tensors a pass creates "
                "(weights excluded), counted exactly on CPU, by the allocator on CUDA."
            ),
            "",
            scaling_tables(results.scaling),
            "",
            "![time and memory against length](scaling.png)",
            "",
        ]
    if results.failed:
        lines += [
            "## Failed runs",
            "",
            (
                "These runs did not finish; the tables above summarize the others. Each keeps "
                "its last checkpoint in its folder: fix the cause and run the same command again."
            ),
            "",
        ]
        lines += [
            f"- {f.variant} on {f.task}, seed {f.seed} (attempt {f.attempts}, `{f.run_folder}`): "
            f"{f.error.strip().splitlines()[0]}"
            for f in results.failed
        ] + [""]
    if results.skipped:
        lines += ["## Not run", ""] + [f"- {s.variant} on {s.task}: {s.reason}" for s in results.skipped] + [""]
    plot_metric_vs_parameters(records, out_dir / "metric-vs-parameters.png")
    plot_throughput(records, out_dir / "throughput.png")
    lines += [
        "## Plots",
        "",
        "![metric against parameters](metric-vs-parameters.png)",
        "",
        "![throughput](throughput.png)",
        "",
    ]
    if spec.get("pairing") == "seeds":
        lines += ["## Paired seeds", "", *paired_lines(results), ""]
    lines += ["## How to read it", "", _method(results), ""]
    lines += ["## Runs", "", runs_table(records), ""]
    machine = ", ".join(f"{k} {v}" for k, v in results.machine.items())
    lines += [
        "## Spec and machine",
        "",
        f"Machine: {machine}.",
        "",
        "```yaml",
        yaml.safe_dump(spec, sort_keys=False).rstrip(),
        "```",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def tuning_lines(results: CompareResults, out_dir: Path) -> list[str]:
    """The tuning section: how the search ran, and per task each variant's trials, chosen setting,
    best validation score, the spread of its best trials and the budget spent; with a plot of
    the best score so far against trial."""
    tune = results.spec.get("tune") or {}
    tuned = results.tuning
    pruned = [t for study in tuned for t in study.trials if t.state == "pruned"]
    full = sum(study.steps * len(study.trials) for study in tuned)
    saved = sum(study.saved_steps for study in tuned)
    lines = [
        f"Every variant was tuned on the same budget before the comparison: {max(len(t.trials) for t in tuned)} "
        f"trials of {tuned[0].steps} steps each, sampler {tune.get('sampler')} (seed {tune.get('seed')}), over "
        + ", ".join(f"`{path}` {values}" for path, values in tune.get("space", {}).items())
        + f". A trial trains on the train split less a validation split carved from it with the seed "
        f"({_share(tune.get('validation', 0.1))}) and is scored there, never on the test splits; the comparison below "
        "then runs each variant's seeds at its best setting"
        + (", beside the spec's own (`tuned` marks the tuned runs)" if tune.get("compare") == "both" else "")
        + ". The tuning time is in each tuned variant's cost columns (`tuning s`).",
        "",
    ]
    if tune.get("prune"):
        lines += [
            (
                f"Pruning (median pruner, {tune.get('rungs')} rungs) stopped {len(pruned)} trial(s) early: "
                f"{saved:,} of {full:,} trial steps ({saved / max(full, 1):.0%}) were not trained."
            ),
            "",
        ]
    for task in dict.fromkeys(t.task for t in tuned):
        studies = [t for t in tuned if t.task == task]
        metric = studies[0].metric
        lines += [
            f"### {task}",
            "",
            (
                f"| variant | trials (done / pruned / failed) | chosen | best validation {metric} "
                f"| best trials (top quarter) | steps trained | tuning s |"
            ),
            "| --- | --- | --- | ---: | --- | ---: | ---: |",
        ]
        for study in studies:
            counts = [sum(t.state == state for t in study.trials) for state in ("complete", "pruned", "failed")]
            chosen = ", ".join(f"`{k}` {_value(v)}" for k, v in study.best.items()) or "none finished: the spec's own"
            top = study.top
            spread = (
                f"{_value(top[-1].value)} to {_value(top[0].value)}; "
                + ", ".join(
                    f"`{path}` {_value(min(t.values[path] for t in top))} to {_value(max(t.values[path] for t in top))}"
                    for path in study.best
                    if all(isinstance(t.values.get(path), (int, float)) for t in top)
                )
                if len(top) > 1
                else "n/a"
            )
            best = "n/a" if study.best_value is None else _value(study.best_value)
            lines.append(
                f"| {study.variant} | {' / '.join(map(str, counts))} | {chosen} | {best} | {spread} | "
                f"{study.trained_steps:,} of {study.steps * len(study.trials):,} | {study.seconds:,.0f} |"
            )
        plot_tuning(tuned, task, out_dir / f"tuning-{task}.png")
        lines += ["", f"![{task} tuning]({f'tuning-{task}.png'})", ""]
    return lines


def _share(amount: float) -> str:
    return f"{amount:.0%} of it" if amount < 1 else f"{int(amount):,} of its rows"


def _value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
