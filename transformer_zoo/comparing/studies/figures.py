"""The picture of how a ``better`` claim's verdict follows from its interval and its smallest
effect of interest (docs/images/effect-regions.png): example intervals of the gain, each labelled
with the verdict :func:`~transformer_zoo.comparing.sequential.region` gives it."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from ..plots import save
from ..sequential import region, smaller_than_effect

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
