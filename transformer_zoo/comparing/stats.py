"""Statistics over seeds: confidence intervals of a mean, and tests of a difference.

A comparison's claim that one variant beats another is a statement over seeds. Every mean is
reported with its Student-t 95% interval, and every difference with a test: Welch's t-test
(unequal variances; its interval uses the Welch-Satterthwaite degrees of freedom) or an exact
permutation test of the difference in means (every split of the pooled runs into two groups,
when there are few). The arithmetic is ``scipy.stats``'.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass
from typing import Literal

from scipy import stats as _scipy

ALPHA = 0.05
"""The significance level of every test and the complement of every interval's confidence."""

TestKind = Literal["welch", "permutation"]
TEST_NAMES = {"welch": "Welch's t-test", "permutation": "an exact permutation test of the difference in means"}


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
    test: TestKind
    n: tuple[int, int]

    def separable(self, alpha: float = ALPHA) -> bool:
        """Whether the test rejects equal means at ``alpha``."""
        return self.p is not None and self.p < alpha


def interval(values: list[float], confidence: float = 1 - ALPHA) -> Interval:
    """The mean of ``values`` with its Student-t interval (``n - 1`` degrees of freedom)."""
    if not values:
        raise ValueError("an interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, None, None, 1)
    half = float(_scipy.t.ppf(0.5 + confidence / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


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
        p = float(_scipy.permutation_test(
            (a, b), lambda x, y: statistics.fmean(x) - statistics.fmean(y), permutation_type="independent",
            vectorized=False, n_resamples=100_000, alternative="two-sided").pvalue)
    return Difference(delta, delta - half, delta + half, p, test, (len(a), len(b)))


def smallest_p(n_a: int, n_b: int, test: TestKind) -> float | None:
    """The smallest p-value ``test`` can give with these numbers of runs (a permutation test of
    3 against 3 runs cannot go below 0.1), None when no test is possible."""
    if n_a < 2 or n_b < 2:
        return None
    if test == "permutation":
        return 2 / math.comb(n_a + n_b, n_a)
    return 0.0


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
