"""Seeds added in rounds until every claim (a study's) or test (a comparison's) is decided, or the
time budget is spent (``until_decided:`` in a spec; ``--until-decided --budget 20m``).

The first round runs the spec's seeds; each later one adds ``round`` seeds, up to ``most_seeds``.
The looks are planned before any run (:func:`look_seeds`), and each spends its share of alpha
(:func:`~transformer_zoo.comparing.sequential.look_alphas`). Every open item is judged at each
look at that share times the study's :func:`~transformer_zoo.comparing.sequential.claim_share`
(Bonferroni's correction counted in the statements that can be false at once; the module
:mod:`~transformer_zoo.comparing.sequential` says why Holm's step-down would not keep alpha
here). A decided item keeps the verdict, seeds and interval of its look; the runs of later
rounds do not change it. A round that the budget leaves no time for, at the slowest pace a round
has run so far, is not started: its share of alpha stays unspent.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..core.errors import ConfigError
from ..core.files import atomic_write
from ..training import distributed
from .progress import duration
from .records import ALPHA, CompareResults, RunRecord
from .report import write_report
from .runner import compare
from .sequential import HOLDS, claim_share, look_alphas, planned_looks, region
from .spec import CompareSpec, UntilDecided
from .stats import seeded_difference
from .summary import summarize

T = TypeVar("T")


def look_seeds(seeds: list[int], settings: UntilDecided) -> list[list[int]]:
    """The seeds of each look: the spec's, then ``settings.round`` more each (the next unused
    integers), up to ``settings.most_seeds`` (or the spec's seeds, were there more)."""
    most = max(settings.most_seeds, len(seeds))
    looks = planned_looks(len(seeds), settings.round, most) if len(seeds) < most else [len(seeds)]
    extra = [s for s in range(max(seeds) + 1 + most) if s not in seeds]
    every = [*seeds, *extra]
    return [every[:n] for n in looks]


@dataclass
class Looks(Generic[T]):
    """Which items are decided, at which look, with what outcome.

    Attributes:
        items: every item's key (a claim's index, a test's task and variant).
        share: the share of each look's alpha every item is judged at (``claim_share``).
    """

    items: list[Hashable]
    share: float = 1.0
    decided: dict[Hashable, tuple[int, T]] = field(default_factory=dict)
    last: dict[Hashable, tuple[int, T]] = field(default_factory=dict)

    def judge(
        self, look: int, alpha: float, judges: dict[Hashable, Callable[[float], T]], settled: Callable[[T], bool]
    ) -> bool:
        """Judge the open items at ``look`` (0-based), whose share of alpha is ``alpha``: each by
        ``judges[key](alpha * share)``; returns whether every item is decided."""
        for key in self.open:
            outcome = judges[key](alpha * self.share)
            self.last[key] = (look, outcome)
            if settled(outcome):
                self.decided[key] = (look, outcome)
        return not self.open

    @property
    def open(self) -> list[Hashable]:
        return [key for key in self.items if key not in self.decided]

    def outcome(self, key: Hashable) -> tuple[int, T]:
        """The item's look and outcome: where it was decided, else the last look's."""
        return self.decided.get(key) or self.last[key]


@dataclass(frozen=True)
class Round:
    """One look: its seeds, the wall time its comparison took and its share of alpha."""

    look: int
    seeds: list[int]
    seconds: float
    alpha: float


def run_rounds(
    spec: CompareSpec,
    out_dir: str | os.PathLike,
    judge_look: Callable[[CompareResults, int, float], bool],
    settings: UntilDecided,
    plugins: list[str] | None = None,
    say: Callable[[str], None] = print,
    needed: Callable[[], Collection[str] | None] = lambda: None,
) -> tuple[CompareResults, list[Round], str]:
    """Run ``spec`` look after look (its seeds growing by :func:`look_seeds`) into ``out_dir``,
    calling ``judge_look(results, look, alpha)`` after each, until it returns True (every item
    decided), the planned looks end, or the budget leaves no time for the next round. Finished
    runs are reused from the run cache, so each look trains only its new seeds, and only of the
    variants ``needed()`` names after the first look (those of the items still open; None:
    every variant).

    Returns:
        the results (each variant's runs as of the last look that ran it; ``report.md`` and
        ``results.json`` rewritten to match), the rounds, and why the rounds stopped, in words.
    """
    if distributed.world().launched:
        raise ConfigError(
            "seeds added until decided run in one process, which trains the runs on its workers; run it without torchrun"
        )
    seeds = look_seeds(spec.seeds, settings)
    alphas = look_alphas([len(s) for s in seeds], len(seeds[-1]))
    rounds: list[Round] = []
    started, pace = time.perf_counter(), 0.0
    kept: dict[str, list[RunRecord]] = {}  # by variant: its runs as of the last look that ran it
    for look, look_seeds_ in enumerate(seeds):
        begun = time.perf_counter()
        only = needed() if look else None
        results = compare(spec.model_copy(update={"seeds": look_seeds_}), out_dir, plugins=plugins, only=only)
        took = time.perf_counter() - begun
        for variant in {r.variant for r in results.runs}:
            kept[variant] = [r for r in results.runs if r.variant == variant]
        if only is not None:  # the variants this look did not run, as their last look left them
            results = _with_runs(results, [run for runs in kept.values() for run in runs], spec)
        new = set(look_seeds_) - set(seeds[look - 1] if look else [])
        pace = max(pace, _round_seconds(results, new, took, spec) / len(new))
        done = judge_look(results, look, alphas[look])
        rounds.append(Round(look + 1, look_seeds_, took, alphas[look]))
        spent = time.perf_counter() - started
        if done:
            why = f"every item decided after {look + 1} look(s), in {duration(spent)}"
            break
        if look + 1 == len(seeds):
            why = f"the planned looks ended at {len(look_seeds_)} seeds ({duration(spent)})"
            break
        need = pace * (len(seeds[look + 1]) - len(look_seeds_))
        if spent + need > settings.budget:
            why = (
                f"the budget of {duration(settings.budget)} leaves no time for another round (spent {duration(spent)}; "
                f"the next would take about {duration(need)})"
            )
            break
        say(
            f"look {look + 1} of {len(seeds)}: some items are open; adding {len(seeds[look + 1]) - len(look_seeds_)} seed(s)"
        )
    if only is not None:  # the last look ran some variants alone: its folder's report shows them all
        text = results.model_dump_json(indent=2)
        atomic_write(Path(out_dir) / "results.json", lambda tmp: tmp.write_text(text))
        write_report(results, Path(out_dir))
    return results, rounds, why


def _with_runs(results: CompareResults, runs: list[RunRecord], spec: CompareSpec) -> CompareResults:
    """``results`` with ``runs`` in place of its own, and their summaries."""
    merged = results.model_copy(update={"runs": runs})
    merged.summaries = summarize(runs, spec.reference, spec.test, results.invocation, spec.pairing == "seeds")
    return merged


def _round_seconds(results: CompareResults, new: set[int], took: float, spec: CompareSpec) -> float:
    """How long a round of the ``new`` seeds takes: the time this look took when it trained some of
    them; else (every run reused from the cache) their runs' recorded wall time, over the spec's
    workers running at once."""
    runs = [run for run in results.trained if run.seed in new]
    if any(run.invocation == results.invocation for run in runs):
        return took
    return max(took, sum(run.wall_seconds for run in runs) / (spec.workers or 1))


def write_rounds(
    out_dir: str | os.PathLike, rounds: list[Round], why: str, extra: dict[str, Any] | None = None
) -> None:
    """``rounds.json``: each look's seeds, time and alpha, and why the rounds stopped."""
    data = {"rounds": [r.__dict__ for r in rounds], "stopped": why, "alpha": ALPHA, **(extra or {})}
    text = json.dumps(data, indent=2)
    atomic_write(Path(out_dir) / "rounds.json", lambda tmp: tmp.write_text(text))


@dataclass(frozen=True)
class Decision:
    """A comparison's test (a variant against the reference in a task's headline metric) at one
    look: the difference variant - reference, its interval at the look's level, and what it found:
    ``above 0``, ``below 0``, ``within the effect`` (no difference as large as the spec's effect),
    or ``open``."""

    task: str
    variant: str
    reference: str
    found: str
    difference: float | None
    low: float | None
    high: float | None
    seeds: int
    confidence: float
    look: int


def compare_until_decided(
    spec: CompareSpec, out_dir: str | os.PathLike, plugins: list[str] | None = None
) -> tuple[CompareResults, list[Decision]]:
    """``tzoo compare --until-decided``: the spec's comparison, seeds added in rounds until every
    variant's test against the reference in each task's headline metric is decided (a difference
    above or below 0, or, with an ``effect``, none as large as it), or the budget is spent.
    Writes ``rounds.json`` and adds the decisions to ``report.md``."""

    settings = spec.until_decided or UntilDecided()
    looks: Looks[Decision] = Looks([])
    metrics: dict[str, str] = {}  # by task: its headline metric

    def at(results: CompareResults, key: tuple[str, str, str], look: int, alpha: float) -> Decision:
        task, variant, reference = key
        a, b = (results.by_seed(label, task, "test", metrics[task]) for label in (variant, reference))
        found, d = "open", seeded_difference(a, b, spec.pairing == "seeds", spec.test, 1 - alpha) if a and b else None
        if d is not None and d.low is not None and d.high is not None:
            effect = spec.effect.get(task, 0.0) if isinstance(spec.effect, dict) else spec.effect or 0.0
            if d.low > 0:
                found = "above 0"
            elif d.high < 0:
                found = "below 0"
            elif effect and region(d.low, d.high, "matches", effect) == HOLDS:
                found = "within the effect"
        figures = (None, None, None, 0) if d is None else (d.difference, d.low, d.high, min(d.n))
        return Decision(task, variant, reference, found, *figures, 1 - alpha, look + 1)

    def judge_tests(results: CompareResults, look: int, alpha: float) -> bool:
        if not looks.items:  # the tests of the first look's summaries
            metrics.update({s.task: s.headline.split(" ", 1)[1] for s in results.summaries})
            looks.items = [
                (s.task, t.variant, t.reference) for s in results.summaries for t in s.tests if t.column == s.headline
            ]
            if not looks.items:
                raise ConfigError(
                    "nothing to decide: no task has two variants that finished a run (a test against the reference "
                    "needs both); give the spec two variants or more, or see the report for the runs that failed"
                )
            # at no difference both "above 0" and "below 0" are false: two statements a test, as a matches claim's
            looks.share = claim_share(["matches"] * len(looks.items))
        judges = {key: partial(at, results, key, look) for key in looks.open}
        return looks.judge(look, alpha, judges, lambda d: d.found != "open")

    def needed() -> set[str]:
        return {label for _, variant, reference in looks.open for label in (variant, reference)}

    results, rounds, why = run_rounds(spec, out_dir, judge_tests, settings, plugins, needed=needed)
    decisions = [looks.outcome(key)[1] for key in looks.items]
    write_rounds(out_dir, rounds, why, {"decisions": [d.__dict__ for d in decisions]})
    report = Path(out_dir) / "report.md"
    text = report.read_text() + "\n" + "\n".join(decision_lines(decisions, rounds, why, settings)) + "\n"
    atomic_write(report, lambda tmp: tmp.write_text(text))
    return results, decisions


def decision_lines(decisions: list[Decision], rounds: list[Round], why: str, settings: UntilDecided) -> list[str]:
    """The decisions of seeds added until decided, as a section of the report."""
    lines = [
        "## Seeds added until decided",
        "",
        (
            f"Looks at {', '.join(str(len(r.seeds)) for r in rounds)} seeds (planned up to {settings.most_seeds}, "
            f"a budget of {duration(settings.budget)}); {why}. Each look spends its share of alpha = {ALPHA} "
            "(Lan-DeMets Pocock-type spending), divided among the tests (Bonferroni's correction), so a test is "
            "decided only when its interval at that level clears 0 or lies within the effect; a decided test keeps "
            "its look's figures."
        ),
        "",
        "| task | variant - reference | difference [interval] | confidence | seeds | look | found |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in decisions:
        interval = "n/a" if d.low is None else f"{d.difference:.4g} [{d.low:.4g}, {d.high:.4g}]"  # one seed, or none
        lines.append(
            f"| {d.task} | {d.variant} - {d.reference} | {interval} | {100 * d.confidence:.3g}% | {d.seeds} | "
            f"{d.look} | {d.found} |"
        )
    return lines
