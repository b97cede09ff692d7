"""The compare report's plots, drawn to be read at the width a report shows them (about 1,000 px).

Each ``plot_*`` function saves the figure its ``*_figure`` builder returns (tests inspect the
builders). A comparison runs several seeds per variant: a variant is one colour and one point,
bar or line, the mean over its seeds; error bars are 95% Student-t intervals of that mean
(:func:`transformer_zoo.comparing.stats.interval`; none for one seed), and a learning curve's band is the
range over seeds. Log axes are ticked at 1-2-5 values written plainly (20k, 100k, 500k).
"""

from __future__ import annotations

import math
import re
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from .records import MODE_NAMES, MODES, RunRecord, ScalingPoint, Tuned
from .stats import interval

DPI = 120
WIDTH = 8.5  # inches: about 1,000 px at DPI, what a report page shows without shrinking the text
MARKERS = "osD^vP*Xph<>"
PONDER_ROW = 24  # positions per row of the ponder map: wider rows shrink its numbers below legibility


def save(fig: Figure, path: Path) -> None:
    """Write ``fig`` as a PNG at the report's resolution."""
    fig.savefig(path, dpi=DPI)


def number(value: float, _position: object = None) -> str:
    """A tick or value label in three significant digits: 20000 -> 20k, 1.5e6 -> 1.5M, 0.05 -> 0.05."""
    value = float(f"{value:.3g}")  # rounded first: 999,600 is 1M, not 1e+03k
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def log_ticks(low: float, high: float) -> list[float]:
    """The 1-2-5 values (decades alone past three decades) from the largest at or below ``low``
    to the smallest above it at or above ``high``: at least two, so an axis always has two labels."""
    if not 0 < low <= high:
        raise ValueError(f"a log axis needs 0 < low <= high, got {low} and {high}")
    subs = (1, 2, 5) if high / low <= 1e3 else (1,)
    first, last = math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1
    values = [s * 10.0**e for e in range(first, last + 1) for s in subs]
    below = max(v for v in values if v <= low * (1 + 1e-9))
    above = min(v for v in values if v >= high * (1 - 1e-9) and v > below)
    return [v for v in values if below <= v <= above]


def log_axis(ax: Axes, axis: str, low: float, high: float, margin: float = 1.15) -> None:
    """Make ``ax``'s ``axis`` ("x" or "y") logarithmic over ``low``..``high``, ticked by
    :func:`log_ticks`; a point at either end stays ``margin`` times inside the axis (not cut in half).

    Values with no logarithm (``low`` at or below 0: a run too short for its clock to measure
    a rate, say) get a linear axis from 0 instead, its ticks written as on a log axis."""
    if not 0 < low <= high:
        target = ax.xaxis if axis == "x" else ax.yaxis
        getattr(ax, f"set_{axis}scale")("linear")
        getattr(ax, f"set_{axis}lim")(min(0.0, low), high * margin if high > 0 else 1.0)
        target.set_major_formatter(FuncFormatter(number))
        return
    ticks = log_ticks(low, high)
    getattr(ax, f"set_{axis}scale")("log")
    getattr(ax, f"set_{axis}lim")(min(ticks[0], low / margin), max(ticks[-1], high * margin))
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(number))
    target.set_minor_locator(NullLocator())


def _by_variant(records: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for record in records:
        groups[record.variant].append(record)
    return dict(groups)


def _styles(records: Iterable[RunRecord]) -> dict[str, dict]:
    """A colour and marker per variant, in order of first appearance, the same in every panel."""
    variants = list(dict.fromkeys(r.variant for r in records))
    cmap = matplotlib.colormaps["tab10" if len(variants) <= 10 else "tab20"]
    return {v: {"color": cmap(i % cmap.N), "marker": MARKERS[i % len(MARKERS)]} for i, v in enumerate(variants)}


def _name(variant: str, width: int = 32) -> str:
    """A variant's label wrapped to lines of ``width`` (labels with options are long)."""
    return "\n".join(textwrap.wrap(variant, width, break_on_hyphens=False)) or variant


def _seeds_note(groups: Iterable[list[RunRecord]], spread: str) -> str:
    counts = sorted({len(runs) for runs in groups})
    if counts == [1]:
        return "one seed per variant"
    many = f"{counts[0]} seeds" if len(counts) == 1 else f"{counts[0]} to {counts[-1]} seeds"
    return f"mean over {many}; {spread}"


def _mean_and_error(values: list[float]) -> tuple[float, list[list[float]] | None]:
    """The mean and its interval as matplotlib's ``[[below], [above]]`` error, None for one value."""
    found = interval(values)
    if found.low is None:
        return found.mean, None
    return found.mean, [[found.mean - found.low], [found.high - found.mean]]


def _outer_legend(fig: Figure, axes: Iterable[Axes], columns: int = 3) -> None:
    """One legend for the whole figure, below the panels, so it covers no data."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside lower center",
            ncols=min(columns, len(entries)),
            fontsize=8,
            frameon=False,
        )


# ---- a metric against the length scored --------------------------------------------------
def lengths_figure(records: list[RunRecord], task: str, lengths: dict[str, int]) -> Figure:
    """The headline metric of each variant on the splits of ``lengths`` (split -> the length its
    inputs have) against that length, log x: mean over seeds with 95% intervals, one line each."""
    groups = _by_variant(records)
    styles = _styles(records)
    first = records[0]
    order = sorted(lengths, key=lengths.get)
    fig = Figure(figsize=(WIDTH, 4.4 + 0.25 * math.ceil(len(groups) / 3)), layout="constrained")
    ax = fig.subplots()
    for variant, runs in groups.items():
        points = []
        for split in order:
            values = [r.metrics[split][r.metric] for r in runs if r.metric in r.metrics.get(split, {})]
            if values and all(math.isfinite(v) for v in values):
                points.append((lengths[split], *_mean_and_error(values)))
        if not points:
            continue
        xs, means = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, means, color=styles[variant]["color"], linewidth=1.2, label=_name(variant))
        for x, mean, error in points:
            ax.errorbar([x], [mean], yerr=error, capsize=3, markersize=5, linestyle="none", **styles[variant])
    log_axis(ax, "x", min(lengths.values()), max(lengths.values()))
    metric = first.metric
    ax.set(
        xlabel="tokens of each scored input", ylabel=f"{metric.replace('_', ' ')} ({first.better[metric]} is better)"
    )
    ax.grid(alpha=0.3)
    fig.suptitle(
        f"{task}: {metric} by input length: {_seeds_note(groups.values(), 'error bars: 95% interval')}", fontsize=10
    )
    _outer_legend(fig, [ax])
    return fig


def plot_lengths(records: list[RunRecord], task: str, lengths: dict[str, int], path: Path) -> None:
    """``path``: see :func:`lengths_figure`."""
    save(lengths_figure(records, task, lengths), path)


# ---- a metric against the model's width ------------------------------------------------------
def width_stem(variant: str, width: int | None) -> str:
    """The line a variant joins in a plot against width: its label less a ``-d{width}`` (or
    ``-{width}``) ending, so ``linear-d64`` and ``linear-d128`` draw one line, ``linear`` (and their
    tuned twins ``linear tuned``)."""
    stem, tuned = (variant.removesuffix(" tuned"), " tuned") if variant.endswith(" tuned") else (variant, "")
    return (re.sub(rf"[-_@]d?{width}$", "", stem) if width else stem) + tuned


def widths_figure(records: list[RunRecord], task: str) -> Figure:
    """The headline metric on the test split against the model's width (d_model, log x): a line
    per variant stem (:func:`width_stem`), mean over seeds with 95% intervals, as Zoology's
    Figure 2 draws MQAR accuracy against model dimension."""
    lines: dict[str, dict[int, list[float]]] = {}
    for r in records:
        value = r.metrics.get("test", {}).get(r.metric)
        if r.width and value is not None and math.isfinite(value):
            lines.setdefault(width_stem(r.variant, r.width), {}).setdefault(r.width, []).append(value)
    first = records[0]
    fig = Figure(figsize=(WIDTH, 4.4 + 0.25 * math.ceil(len(lines) / 3)), layout="constrained")
    ax = fig.subplots()
    colors = matplotlib.colormaps["tab10"].colors
    for i, (stem, points) in enumerate(lines.items()):
        widths = sorted(points)
        means = [_mean_and_error(points[w]) for w in widths]
        color = colors[i % len(colors)]
        ax.plot(widths, [m for m, _ in means], color=color, linewidth=1.2, marker="o", label=_name(stem))
        for w, (mean, error) in zip(widths, means):
            ax.errorbar([w], [mean], yerr=error, capsize=3, linestyle="none", color=color)
    every = [w for points in lines.values() for w in points]
    log_axis(ax, "x", min(every), max(every))
    metric = first.metric
    ax.set(xlabel="model width (d_model)", ylabel=f"test {metric.replace('_', ' ')} ({first.better[metric]} is better)")
    ax.grid(alpha=0.3)
    seeds = max(len(v) for points in lines.values() for v in points.values())
    fig.suptitle(f"{task}: {metric} by model width: up to {seeds} seeds a point, error bars: 95% interval", fontsize=10)
    _outer_legend(fig, [ax])
    return fig


def plot_widths(records: list[RunRecord], task: str, path: Path) -> None:
    """``path``: see :func:`widths_figure`."""
    save(widths_figure(records, task), path)


# ---- learning curves ----------------------------------------------------------------------
def loss_keys(records: Iterable[RunRecord]) -> list[str]:
    """The curve keys to draw: each phase's ``loss_<phase>`` for a model trained in phases (its
    ``loss`` is the first phase's, so it is not drawn twice), ``loss`` otherwise."""
    keys: dict[str, None] = {}
    for record in records:
        phases = [k for k in dict.fromkeys(k for point in record.curve for k in point) if k.startswith("loss_")]
        keys.update(dict.fromkeys(phases or ["loss"]))
    return list(keys)


def _loss_name(key: str) -> str:
    return "training loss" if key == "loss" else f"{key.removeprefix('loss_')} loss"


def _mean_curve(runs: list[RunRecord], key: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """Steps, and the mean, least and greatest ``key`` over the runs that logged each step."""
    by_step: dict[float, list[float]] = defaultdict(list)
    for run in runs:
        for point in run.curve:
            if key in point:
                by_step[point["step"]].append(point[key])
    steps = sorted(by_step)
    return (
        steps,
        [statistics.fmean(by_step[s]) for s in steps],
        [min(by_step[s]) for s in steps],
        [max(by_step[s]) for s in steps],
    )


def curves_figure(records: list[RunRecord], task: str) -> Figure:
    """A panel per loss (one, or one per training phase), a line per variant (mean over seeds)
    with the range over seeds shaded."""
    keys = loss_keys(records)
    groups = _by_variant(records)
    styles = _styles(records)
    mixed = len({len(runs) for runs in groups.values()}) > 1  # then each legend entry says its seeds
    fig = Figure(figsize=(WIDTH, 0.9 + 3.1 * len(keys) + 0.25 * math.ceil(len(groups) / 3)), layout="constrained")
    axes = fig.subplots(len(keys), 1, squeeze=False, sharex=True)[:, 0]
    for index, (ax, key) in enumerate(zip(axes, keys)):
        drawn: list[float] = []
        for variant, runs in groups.items():
            steps, mean, low, high = _mean_curve(runs, key)
            if not steps:
                continue
            colour = styles[variant]["color"]
            label = _name(variant, 44) + (f" ({len(runs)} seed{'s' if len(runs) > 1 else ''})" if mixed else "")
            ax.plot(steps, mean, color=colour, linewidth=1.5, label=label)
            if len(runs) > 1:
                ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
            drawn += low + high
        if drawn and min(drawn) > 0 and max(drawn) / min(drawn) > 10:
            log_axis(ax, "y", min(drawn), max(drawn))
        if key != "loss":
            headline = ", the run's headline loss" if index == 0 else ""
            ax.set_title(f"{_loss_name(key)} (training phase {index + 1} of {len(keys)}{headline})", fontsize=10)
        ax.set_ylabel(_loss_name(key))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training step")
    fig.suptitle(
        f"Learning curves on {task}: {_seeds_note(groups.values(), 'shaded band: range over seeds')}", fontsize=10
    )
    _outer_legend(fig, axes)
    return fig


def plot_curves(records: list[RunRecord], task: str, path: Path) -> None:
    """``path``: the training loss of every variant on ``task`` against step (see :func:`curves_figure`)."""
    save(curves_figure(records, task), path)


# ---- test metric against parameters --------------------------------------------------------
def _grid(fig: Figure, panels: int, columns: int = 2) -> list[Axes]:
    """``panels`` axes in rows of ``columns``; the unused cells of the last row removed."""
    rows = math.ceil(panels / columns)
    axes = list(fig.subplots(rows, min(columns, panels), squeeze=False).flat)
    for ax in axes[panels:]:
        fig.delaxes(ax)
    return axes[:panels]


def metric_figure(records: list[RunRecord]) -> Figure:
    """A panel per task: each variant's test metric (mean over seeds, 95% interval) against its
    parameters, log x; one legend names the variants."""
    tasks = sorted({r.task for r in records})
    styles = _styles(records)
    rows = math.ceil(len(tasks) / 2)
    fig = Figure(figsize=(WIDTH, 0.9 + 3.2 * rows + 0.25 * math.ceil(len(styles) / 3)), layout="constrained")
    axes = _grid(fig, len(tasks))
    seeded: list[list[RunRecord]] = []
    for ax, task in zip(axes, tasks):
        groups = _by_variant(r for r in records if r.task == task)
        seeded += groups.values()
        first = next(iter(groups.values()))[0]
        metric = first.metric
        sizes = []
        for variant, runs in groups.items():
            mean, error = _mean_and_error([r.metrics["test"][r.metric] for r in runs])
            size = statistics.fmean(r.parameters for r in runs)
            ax.errorbar(
                [size],
                [mean],
                yerr=error,
                capsize=4,
                markersize=7,
                linestyle="none",
                label=_name(variant),
                **styles[variant],
            )
            sizes.append(size)
        log_axis(ax, "x", min(sizes), max(sizes))
        better = first.better[metric]
        ax.set_title(task, fontsize=10)
        ax.set(xlabel="trainable parameters", ylabel=f"test {metric.replace('_', ' ')} ({better} is better)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Test metric against size: {_seeds_note(seeded, 'error bars: 95% interval')}", fontsize=10)
    _outer_legend(fig, axes)
    return fig


def plot_metric_vs_parameters(records: list[RunRecord], path: Path) -> None:
    """``path``: each task's headline test metric against parameters (see :func:`metric_figure`)."""
    save(metric_figure(records), path)


# ---- throughput ---------------------------------------------------------------------------
def throughput_figure(records: list[RunRecord]) -> Figure:
    """A panel per task (a token is the task's own unit), a horizontal bar per variant, fastest
    on top: training tokens per second, mean over seeds with its 95% interval, log x."""
    tasks = sorted({r.task for r in records})
    by_task = {task: _by_variant(r for r in records if r.task == task) for task in tasks}
    styles = _styles(records)
    bars = [len(groups) for groups in by_task.values()]
    fig = Figure(figsize=(WIDTH, 0.7 + sum(0.95 + 0.3 * n for n in bars)), layout="constrained")
    axes = fig.subplots(len(tasks), 1, squeeze=False, gridspec_kw={"height_ratios": [n + 1.5 for n in bars]})[:, 0]
    for ax, (task, groups) in zip(axes, by_task.items()):
        rows = sorted(
            (
                (variant, *_mean_and_error([r.train_tokens_per_second for r in runs]))
                for variant, runs in groups.items()
            ),
            key=lambda row: -row[1],
        )
        ends = []
        for y, (variant, mean, error) in enumerate(rows):
            ax.barh(y, mean, xerr=error, height=0.65, capsize=3, color=styles[variant]["color"])
            ends.append(mean + (error[1][0] if error else 0))
            ax.text(ends[-1] * 1.08, y, number(mean), va="center", fontsize=8)
        lows = [mean - (error[0][0] if error else 0) for _, mean, error in rows]
        low = min([v for v in lows if v > 0] or [min(mean for _, mean, _ in rows)])
        log_axis(ax, "x", low / 1.5, max(ends) * 2, margin=1)  # room on the right for the value labels
        ax.set_yticks(range(len(rows)), [_name(variant, 36) for variant, _, _ in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(task, fontsize=10, loc="left")
        ax.set_xlabel(f"training tokens / s (tokens of {task})", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    note = _seeds_note([runs for groups in by_task.values() for runs in groups.values()], "error bars: 95% interval")
    fig.suptitle(f"Training throughput, a panel per task (a token is a different unit in each): {note}", fontsize=10)
    return fig


def plot_throughput(records: list[RunRecord], path: Path) -> None:
    """``path``: training throughput by task and variant (see :func:`throughput_figure`)."""
    save(throughput_figure(records), path)


# ---- ponder time ------------------------------------------------------------------------------
def _ponder_rows(ponder: dict[str, torch.Tensor], tokens: dict[str, list[str]]) -> list[tuple]:
    """Each stack's positions in rows of at most ``PONDER_ROW``, balanced in length: tuples of
    (stack, first position, values, token strings); positions are numbered where strings are missing."""
    rows = []
    for stack, steps in ponder.items():
        values = steps.float().cpu().flatten().tolist()
        labels = tokens.get(stack, [])
        labels = labels if len(labels) == len(values) else [str(i + 1) for i in range(len(values))]
        width = math.ceil(len(values) / max(1, math.ceil(len(values) / PONDER_ROW)))
        for start in range(0, len(values), width):
            rows.append((stack, start, values[start : start + width], labels[start : start + width]))
    return rows


def ponder_figure(ponder: dict[str, torch.Tensor], tokens: dict[str, list[str]]) -> Figure:
    """The ponder time (steps) of each position of one example: a row of cells per stack, wrapped
    into several rows when long, each cell with its value and its token; one colour bar."""
    rows = _ponder_rows(ponder, tokens)
    width = max(len(values) for _, _, values, _ in rows)
    top = max([v for _, _, values, _ in rows for v in values] + [1e-9])
    fig = Figure(figsize=(min(WIDTH, 2.6 + 0.3 * width), 0.7 + 1.05 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    image = None
    for ax, (stack, start, values, labels) in zip(axes, rows):
        image = ax.imshow([values], cmap="magma", vmin=0, vmax=top, aspect="auto")
        for i, value in enumerate(values):
            ax.text(
                i,
                0,
                f"{value:.1f}",
                ha="center",
                va="center",
                fontsize=7.5,
                color="white" if value < 0.6 * top else "black",
            )
        ax.set_xlim(-0.5, width - 0.5)
        ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=90)
        ax.set_yticks([])
        ax.set_ylabel(f"{stack}\n{start + 1}-{start + len(values)}", rotation=0, ha="right", va="center", fontsize=8)
    fig.colorbar(image, ax=list(axes), label="ponder time (steps)", fraction=0.04, pad=0.02)
    axes[0].set_title("Ponder time per position of one test example (rows: stack, positions)", fontsize=10)
    axes[-1].set_xlabel("token", fontsize=9)
    return fig


def plot_ponder(ponder: dict[str, torch.Tensor], tokens: dict[str, list[str]], path: Path) -> None:
    """``path``: one example's ponder time per position (``ponder``: stack -> steps per position,
    shape (positions,); ``tokens``: stack -> the positions' token strings)."""
    save(ponder_figure(ponder, tokens), path)


# ---- time and memory against length -------------------------------------------------------------
def scaling_figure(points: list[ScalingPoint]) -> Figure:
    """Time and memory (rows) of each pass (columns) against length, log-log, a line per model
    (dashed: a twin with full attention)."""
    lengths = sorted({p.length for p in points})
    fig = Figure(figsize=(WIDTH, 7.4), layout="constrained")
    axes = fig.subplots(2, len(MODES), squeeze=False)
    models = list(dict.fromkeys(p.label for p in points))
    for column, mode in enumerate(MODES):
        for name in models:
            mine = sorted(
                (p for p in points if p.mode == mode and p.label == name and not p.error), key=lambda p: p.length
            )
            style = "--" if "[" in name else "-"
            axes[0, column].plot(
                [p.length for p in mine], [p.seconds * 1e3 for p in mine], style, marker="o", label=name
            )
            axes[1, column].plot([p.length for p in mine], [p.peak_mb for p in mine], style, marker="o", label=name)
        axes[0, column].set(title=MODE_NAMES[mode], ylabel="time per pass (ms)")
        axes[1, column].set(xlabel="sequence length (tokens)", ylabel="peak tensor memory (MiB)")
        for ax in axes[:, column]:
            ax.set(xscale="log", yscale="log")
            ax.xaxis.set_major_locator(FixedLocator(lengths))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0f}"))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(True, which="both", alpha=0.3)
    _outer_legend(fig, axes[0], columns=2)
    return fig


def plot_scaling(points: list[ScalingPoint], path: Path) -> None:
    """``path``: time and memory against sequence length (see :func:`scaling_figure`)."""
    save(scaling_figure(points), path)


# ---- tuning ---------------------------------------------------------------------------------
def tuning_figure(tuned: list[Tuned], task: str) -> Figure:
    """The best validation score so far against trial, a line per variant tuned on ``task``; each
    trial that ran to the end is a point, a pruned one a cross at its last rung's score."""
    found = [t for t in tuned if t.task == task]
    fig = Figure(figsize=(WIDTH, 3.6), layout="constrained")
    ax = fig.subplots()
    for index, study in enumerate(found):
        color, marker = f"C{index % 10}", MARKERS[index % len(MARKERS)]
        trials = sorted(study.trials, key=lambda t: t.number)
        numbers = [t.number + 1 for t in trials]
        best = study.best_so_far()
        ax.step(
            [n for n, b in zip(numbers, best) if b is not None],
            [b for b in best if b is not None],
            where="post",
            color=color,
            label=_name(study.variant),
        )
        done = [(t.number + 1, t.value) for t in trials if t.value is not None]
        ax.plot([n for n, _ in done], [v for _, v in done], marker, color=color, alpha=0.6, linestyle="none")
        pruned = [(t.number + 1, t.scores[max(t.scores)]) for t in trials if t.state == "pruned" and t.scores]
        ax.plot([n for n, _ in pruned], [v for _, v in pruned], "x", color=color, alpha=0.6, linestyle="none")
    if found:
        ax.set(xlabel="trial", ylabel=f"validation {found[0].metric.replace('_', ' ')}")
        ax.xaxis.set_major_locator(FixedLocator(range(1, max(len(t.trials) for t in found) + 1)))
    ax.set_title(f"{task}: best so far (line), trials run to the end (points), pruned (x, last score)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def plot_tuning(tuned: list[Tuned], task: str, path: Path) -> None:
    """``path``: best-so-far against trial of every variant tuned on ``task`` (see :func:`tuning_figure`)."""
    save(tuning_figure(tuned, task), path)
