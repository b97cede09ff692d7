"""A study's figures: the picture of how a ``better`` claim's verdict follows from its interval and
its smallest effect of interest (docs/images/effect-regions.png), example intervals of the gain each
labelled with the verdict :func:`~transformer_zoo.comparing.sequential.region` gives it; and a
sweep's, each swept variant's final loss and largest attention logit against the swept option
(Wortsman et al. 2023, Figure 1)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from ..plots import DPI, MARKERS, WIDTH, log_axis, save
from ..sequential import region, smaller_than_effect
from ..stats import interval
from .sweeps import SweepResult

EXAMPLES = [(0.02, 0.09), (0.01, 0.04), (-0.03, 0.03), (-0.06, -0.01), (-0.02, 0.08), (0.03, 0.12)]
"""Intervals of the gain (low, high) drawn for an effect of interest of 0.05."""

WORDS = {1: "holds", -1: "does not hold", 0: "inconclusive"}


def verdict_of(low: float, high: float, effect: float) -> str:
    """The verdict of a ``better`` claim with this interval, as the picture labels it."""
    words = WORDS[int(region(low, high, "better", effect))]
    return (
        f"{words} (smaller than the effect)" if words == "holds" and smaller_than_effect(low, high, effect) else words
    )


def effect_regions_figure(path: str | os.PathLike, effect: float = 0.05) -> Path:
    """Draw :data:`EXAMPLES` against the boundaries 0 and ``effect``, each labelled with its
    verdict, into ``path``."""
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    ax.axvspan(-0.1, 0.0, color="tab:red", alpha=0.06)
    ax.axvspan(0.0, effect, color="tab:orange", alpha=0.08)
    ax.axvspan(effect, 0.15, color="tab:green", alpha=0.06)
    for x, text in ((0.0, "0"), (effect, f"δ = {effect:g}")):
        ax.axvline(x, color="black", linewidth=1, linestyle="--" if x else "-")
        ax.annotate(text, (x, len(EXAMPLES) - 0.3), ha="center", fontsize=9)
    for row, (low, high) in enumerate(EXAMPLES):
        verdict = verdict_of(low, high, effect)
        color = {"holds": "tab:green", "does not hold": "tab:red"}.get(verdict.split(" (")[0], "tab:gray")
        ax.plot([low, high], [row, row], color=color, linewidth=3)
        ax.plot([(low + high) / 2], [row], "o", color=color)
        ax.annotate(verdict, (0.155, row), va="center", fontsize=9)
    ax.set_xlim(-0.1, 0.27)
    ax.set_ylim(-0.7, len(EXAMPLES) - 0.1)
    ax.set_yticks([])
    ax.set_xlabel("gain of a over b (the way the metric is better), with its interval")
    ax.set_title("A better claim's verdict from its interval and its smallest effect of interest δ", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    save(fig, path)
    return path


def _axis_values(swept: SweepResult) -> tuple[str, float, float]:
    return swept.over, min(swept.values), max(swept.values)


def sweep_loss_figure(swept: SweepResult) -> Figure:
    """Each swept variant's final test loss against the swept option (log x where every value is
    above 0): its seeds' runs as points (a diverged run as a cross at the loss at initialisation),
    and the mean over seeds of the capped loss the sensitivity averages, with its 95% interval. The
    legend gives each variant's sensitivity, mean over seeds."""
    fig = Figure(figsize=(WIDTH, 4.6), dpi=DPI)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["tab10"]
    shown: list[float] = []
    for i, variant in enumerate(swept.variants):
        color, marker = cmap(i % cmap.N), MARKERS[i % len(MARKERS)]
        means, lows, highs, xs = [], [], [], []
        for value in swept.values:
            points = [p for p in variant.points if p.value == value]
            finite = [p.loss for p in points if p.loss is not None]
            ax.scatter([value] * len(finite), finite, color=color, marker=marker, s=18, alpha=0.45, linewidths=0)
            diverged = [variant.initial[p.seed] for p in points if p.loss is None and p.seed in variant.initial]
            if diverged:
                ax.scatter([value] * len(diverged), diverged, color=color, marker="x", s=40)
            shown += finite + diverged
            capped = [
                variant.initial[p.seed] if p.loss is None else min(p.loss, variant.initial[p.seed])
                for p in points
                if p.seed in variant.initial
            ]
            if capped:
                found = interval(capped)
                xs.append(value)
                means.append(found.mean)
                lows.append(found.mean if found.low is None else found.low)
                highs.append(found.mean if found.high is None else found.high)
        score = interval(list(variant.sensitivity.values())) if variant.sensitivity else None
        label = variant.variant + ("" if score is None else f" (sensitivity {score.mean:.3g})")
        ax.plot(xs, means, color=color, marker=marker, label=label)
        ax.fill_between(xs, lows, highs, color=color, alpha=0.15, linewidth=0)
    if any(p.loss is None for v in swept.variants for p in v.points):
        ax.scatter([], [], color="gray", marker="x", label="diverged: counted as the loss at initialisation")
    over, low, high = _axis_values(swept)
    if low > 0:
        log_axis(ax, "x", low, high)
    if shown:
        spread = max(shown) - min(shown) or 1.0
        ax.set_ylim(min(shown) - 0.08 * spread, max(shown) + 0.08 * spread)
    ax.set_xlabel(over)
    ax.set_ylabel("final test loss (nats)")
    ax.set_title(
        f"Final loss against {over} on {swept.task}: seeds as points, the mean of the capped loss with its 95% interval",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def sweep_logit_figure(swept: SweepResult) -> Figure | None:
    """Each swept variant's largest attention logit (the logits probe) against the swept option,
    both axes logarithmic where the values allow: its seeds' runs as points and their mean as a line.
    None when no run measured it."""
    measured = [p.max_logit for v in swept.variants for p in v.points if p.max_logit is not None]
    if not measured:
        return None
    fig = Figure(figsize=(WIDTH, 4.6), dpi=DPI)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["tab10"]
    for i, variant in enumerate(swept.variants):
        color, marker = cmap(i % cmap.N), MARKERS[i % len(MARKERS)]
        xs, means = [], []
        for value in swept.values:
            found = [p.max_logit for p in variant.points if p.value == value and p.max_logit is not None]
            ax.scatter([value] * len(found), found, color=color, marker=marker, s=18, alpha=0.45, linewidths=0)
            if found:
                xs.append(value)
                means.append(statistics.fmean(found))
        ax.plot(xs, means, color=color, marker=marker, label=variant.variant)
    over, low, high = _axis_values(swept)
    if low > 0:
        log_axis(ax, "x", low, high)
    log_axis(ax, "y", min(measured), max(measured))
    ax.set_xlabel(over)
    ax.set_ylabel("largest attention logit")
    ax.set_title(
        f"Largest attention logit q.k / sqrt(d_head) against {over} on {swept.task}: seeds as points, their mean",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_sweep(swept: SweepResult, out_dir: str | os.PathLike) -> list[str]:
    """Draw :func:`sweep_loss_figure` and, where measured, :func:`sweep_logit_figure` into
    ``out_dir``, as ``sweep-loss-TASK.png`` and ``sweep-logits-TASK.png``; returns their names."""
    names = []
    for name, fig in (
        (f"sweep-loss-{swept.task}.png", sweep_loss_figure(swept)),
        (f"sweep-logits-{swept.task}.png", sweep_logit_figure(swept)),
    ):
        if fig is not None:
            save(fig, Path(out_dir) / name)
            names.append(name)
    return names
