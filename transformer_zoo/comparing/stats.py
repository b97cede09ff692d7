"""Statistics over seeds: confidence intervals of a mean, tests of a difference, and Holm's
correction of a family of tests.

A comparison's claim that one variant beats another is a statement over seeds. Every mean is
reported with a 95% interval that respects what it measures:

- :func:`interval`: the Student-t interval of the mean (``n - 1`` degrees of freedom), for a
  quantity with no declared range.
- :func:`log_interval`: a positive quantity (a cost: parameters, FLOPs, tokens per second,
  memory, seconds): the Student-t interval of the mean log, exponentiated, so it stays above 0.
- :func:`bounded_interval`: a score with a declared range (an accuracy in [0, 1], BLEU in
  [0, 100]): the Student-t interval on the arcsine-square-root scale, mapped back, so it stays
  inside the range.

Each reports the arithmetic mean and an interval that contains it. Every difference is tested
by Welch's t-test (unequal variances; its interval uses the Welch-Satterthwaite degrees of
freedom) or an exact permutation test of the difference in means (every split of the pooled
runs into two groups, when there are few), and :func:`holm` adjusts a family of such p-values
for their number. The arithmetic is ``scipy.stats``' and numpy's.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _scipy

from .records import ALPHA, TestKind

TEST_NAMES = {"welch": "Welch's t-test", "permutation": "an exact permutation test of the difference in means"}
"""The tests a spec may choose for the differences between variants."""
TESTS_RUN = {**TEST_NAMES, "paired": "the paired t-test on the per-seed differences"}
"""Every test a difference may be reported with: the spec's, or the paired t-test (paired seeds)."""


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` runs and its two-sided confidence interval (``low`` = ``high`` = the
    mean when the runs agree exactly; None when ``n`` is 1: one run gives no interval)."""

    mean: float
    low: float | None
    high: float | None
    n: int


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)``, its confidence interval and the two-sided p-value of ``test``
    (None when either side has one run: no test is possible)."""

    difference: float
    low: float | None
    high: float | None
    p: float | None
    test: TestKind | Literal["paired"]
    n: tuple[int, int]

    def separable(self, alpha: float = ALPHA) -> bool:
        """Whether the test rejects equal means at ``alpha``."""
        return self.p is not None and self.p < alpha


def interval(values: list[float], confidence: float = 1 - ALPHA) -> Interval:
    """The mean of ``values`` with its Student-t interval (``n - 1`` degrees of freedom)."""
    return _on_scale(values, _identity, _identity, confidence)


def log_interval(values: list[float], confidence: float = 1 - ALPHA) -> Interval:
    """The mean of a positive quantity with an interval that stays above 0: the Student-t
    interval of the mean of ``log(values)``, exponentiated (an interval of the geometric mean,
    widened to the arithmetic mean where it falls outside).

    A value <= 0 has no logarithm: ``values`` then get the Student-t interval, its low end cut
    at 0 (or at the smallest value, were one negative).
    """
    if min(values, default=1.0) > 0:
        return _on_scale(values, np.log, np.exp, confidence)
    plain = interval(values, confidence)
    if plain.low is None:
        return plain
    return Interval(plain.mean, max(plain.low, min(0.0, min(values))), plain.high, plain.n)


def bounded_interval(values: list[float], bounds: tuple[float, float], confidence: float = 1 - ALPHA) -> Interval:
    """The mean of a score that lies in ``bounds`` (``(0, 1)`` for an accuracy) with an interval
    inside them: the Student-t interval on the arcsine-square-root scale of the score's share
    of the range, ``asin(sqrt((x - low) / (high - low)))``, mapped back (its ends cut at the
    scale's ends, 0 and pi/2, first), and widened to the arithmetic mean where it falls outside.

    The transform stabilises the variance of a proportion, and is finite at both bounds (a
    logit is not: an accuracy of 1.000 is common).

    Raises:
        ValueError: ``bounds`` are not increasing, or a value lies outside them.
    """
    low, high = bounds
    if not low < high:
        raise ValueError(f"bounds {bounds} must be (low, high) with low < high")
    outside = [x for x in values if not low <= x <= high]
    if outside:
        raise ValueError(
            f"value {outside[0]} lies outside the bounds [{low}, {high}] declared for it: declare the "
            "range the metric's values take, or none"
        )
    width = high - low
    return _on_scale(
        values,
        lambda x: np.arcsin(np.sqrt((x - low) / width)),
        lambda y: low + width * np.sin(np.clip(y, 0.0, np.pi / 2)) ** 2,
        confidence,
    )


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _on_scale(
    values: list[float],
    forward: Callable[[np.ndarray], np.ndarray],
    back: Callable[[np.ndarray], np.ndarray],
    confidence: float,
) -> Interval:
    """The arithmetic mean of ``values`` and the Student-t interval of the mean of
    ``forward(values)``, mapped ``back`` (both increasing), widened to contain the mean."""
    if not values:
        raise ValueError("an interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, None, None, 1)
    scaled = forward(np.asarray(values, dtype=float))
    sem = float(_scipy.sem(scaled))
    if min(values) == max(values) or not sem > 0:  # runs that agree (to a float's precision): no t interval
        return Interval(mean, mean, mean, len(values))
    ends = _scipy.t.interval(confidence, len(values) - 1, loc=scaled.mean(), scale=sem)
    with np.errstate(over="ignore"):  # runs some hundred orders of magnitude apart: an end at infinity is the answer
        low, high = (float(end) for end in back(np.asarray(ends)))
    return Interval(mean, min(low, mean), max(high, mean), len(values))


def difference(a: list[float], b: list[float], test: TestKind = "welch", confidence: float = 1 - ALPHA) -> Difference:
    """Test ``mean(a) = mean(b)``: the difference, its interval (Welch's in both cases) and p.

    Runs that agree exactly on both sides (zero variance) give p = 1 when the means are equal and
    p = 0 when they differ, where the t statistic itself is undefined.
    """
    if test not in TEST_NAMES:
        raise ValueError(f"test {test!r} is not one of {', '.join(TEST_NAMES)}")
    delta = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Difference(delta, None, None, None, test, (len(a), len(b)))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        p = 1.0 if delta == 0 else 0.0
        return Difference(delta, delta, delta, p, test, (len(a), len(b)))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(_scipy.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(va + vb)
    if test == "welch":
        with warnings.catch_warnings():  # nearly equal runs: scipy warns of precision it does not need here
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(_scipy.ttest_ind(a, b, equal_var=False).pvalue)
    else:
        p = float(
            _scipy.permutation_test(
                (a, b),
                lambda x, y: statistics.fmean(x) - statistics.fmean(y),
                permutation_type="independent",
                vectorized=False,
                n_resamples=100_000,
                alternative="two-sided",
            ).pvalue
        )
    return Difference(delta, delta - half, delta + half, p, test, (len(a), len(b)))


def paired_difference(a: list[float], b: list[float], confidence: float = 1 - ALPHA) -> Difference:
    """Test ``mean(a - b) = 0`` over pairs (``a[i]`` and ``b[i]`` measured on one model, such as
    one seed's run scored at two lengths): the mean difference, its Student-t interval, and the
    p of the paired t-test (1 or 0 where every pair differs alike).

    >>> d = paired_difference([3.0, 4.0, 5.0], [2.0, 3.1, 3.9])
    >>> round(d.difference, 3), d.test
    (1.0, 'paired')
    """
    if len(a) != len(b):
        raise ValueError(f"a paired test needs one b for each a, got {len(a)} and {len(b)}")
    pairs = interval([x - y for x, y in zip(a, b)], confidence)
    if len(a) < 2:
        return Difference(pairs.mean, None, None, None, "paired", (len(a), len(b)))
    if pairs.low == pairs.high:  # every pair differs alike: the t statistic is undefined
        p = 1.0 if pairs.mean == 0 else 0.0
    else:
        p = float(_scipy.ttest_rel(a, b).pvalue)
    return Difference(pairs.mean, pairs.low, pairs.high, p, "paired", (len(a), len(b)))


def seeded_difference(
    a: dict[int, float], b: dict[int, float], paired: bool, test: TestKind = "welch", confidence: float = 1 - ALPHA
) -> Difference:
    """``mean(a) - mean(b)`` of runs keyed by seed: with ``paired``, by :func:`paired_difference`
    on the seeds both ran; else by :func:`difference` (``test``) on every run."""
    if not paired:
        return difference(list(a.values()), list(b.values()), test, confidence)
    seeds = sorted(a.keys() & b.keys())
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds], confidence)


def seeds_needed(sd_a: float, sd_b: float, gap: float, confidence: float = 1 - ALPHA, most: int = 1000) -> int | None:
    """How many seeds a side would make Welch's interval of the difference narrower than ``gap``
    on each side of the mean (so that it clears a boundary ``gap`` away), if the standard
    deviations over seeds stay ``sd_a`` and ``sd_b``; None when ``gap`` is not positive or more
    than ``most`` seeds would be needed. A planning figure: the spreads were estimated from a
    few seeds themselves.

    >>> seeds_needed(0.1, 0.1, 0.1)
    9
    """
    if gap <= 0:
        return None
    if sd_a == 0 and sd_b == 0:
        return 2
    for n in range(2, most + 1):
        va, vb = sd_a**2 / n, sd_b**2 / n
        df = (va + vb) ** 2 / ((va**2 + vb**2) / (n - 1))
        if float(_scipy.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(va + vb) < gap:
            return n
    return None


def smallest_p(n_a: int, n_b: int, test: TestKind) -> float | None:
    """The smallest p-value ``test`` can give with these numbers of runs (a permutation test of
    3 against 3 runs cannot go below 0.1), None when no test is possible."""
    if n_a < 2 or n_b < 2:
        return None
    if test == "permutation":
        return 2 / math.comb(n_a + n_b, n_a)
    return 0.0


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (Holm 1979) of a family of p-values, in their order.

    The i-th smallest of the m p-values is multiplied by ``m - i + 1``, capped at 1, and raised
    to the adjusted value of any smaller p: an adjusted p below alpha rejects its hypothesis with
    a chance of at most alpha of any false rejection in the family. A None (no test possible)
    stays None and does not count in m.
    """
    tested = [i for i, p in enumerate(p_values) if p is not None]
    order = sorted(tested, key=lambda i: p_values[i])
    scaled = np.minimum(1.0, (len(order) - np.arange(len(order))) * np.array([p_values[i] for i in order], dtype=float))
    adjusted: list[float | None] = list(p_values)
    for i, p in zip(order, np.maximum.accumulate(scaled)):
        adjusted[i] = float(p)
    return adjusted


@dataclass(frozen=True)
class Spread:
    """The standard deviations over seeds of ``a`` and ``b`` and the two-sided p of the
    Brown-Forsythe test of equal spread (Levene's test about the medians; None when a side has
    fewer than two runs, or both sides agree exactly, where no test is possible)."""

    sd_a: float
    sd_b: float
    p: float | None


def spread(a: list[float], b: list[float]) -> Spread:
    """Compare the spread over seeds of ``a`` and ``b`` (which is the steadier)."""
    if len(a) < 2 or len(b) < 2:
        return Spread(0.0, 0.0, None)
    sd_a, sd_b = statistics.stdev(a), statistics.stdev(b)
    if sd_a == sd_b == 0:
        return Spread(sd_a, sd_b, None)
    with warnings.catch_warnings():  # a side whose runs agree exactly: scipy warns, the test still stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(_scipy.levene(a, b, center="median").pvalue)
    return Spread(sd_a, sd_b, None if math.isnan(p) else p)
