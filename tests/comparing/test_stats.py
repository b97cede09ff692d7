"""Intervals and tests over seeds, against values computed by hand or independently with scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from transformer_zoo.comparing.stats import (
    bounded_interval,
    difference,
    holm,
    interval,
    log_interval,
    paired_difference,
    smallest_p,
)


def test_the_interval_is_student_t_with_n_minus_one_degrees_of_freedom():
    # mean 2, standard deviation 1, n 3: half-width t(0.975, 2) / sqrt(3) = 4.302653 / 1.732051
    got = interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0 and got.n == 3
    assert got.high - got.mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert got.mean - got.low == pytest.approx(got.high - got.mean)


def test_one_value_gives_no_interval_and_equal_values_an_empty_one():
    assert interval([0.5]).low is None and interval([0.5]).high is None
    same = interval([0.25, 0.25, 0.25])
    assert same.low == same.high == 0.25


def test_welch_against_a_hand_computed_example():
    # a: mean 2, variance 1; b: mean 16/3, variance 7/3. se^2 = 1/3 + 7/9 = 10/9; t = -(10/3) / sqrt(10/9) = -sqrt(10)
    # df = (10/9)^2 / ((1/3)^2 / 2 + (7/9)^2 / 2) = 3.448276; two-sided p = 0.041915; t(0.975, df) = 2.960730
    got = difference([1.0, 2.0, 3.0], [4.0, 5.0, 7.0], "welch")
    assert got.difference == pytest.approx(-10 / 3)
    assert got.p == pytest.approx(0.041915, abs=2e-6)
    half = 2.960730 * math.sqrt(10 / 9)
    assert (got.low, got.high) == pytest.approx((-10 / 3 - half, -10 / 3 + half), rel=1e-5)
    assert got.separable()


def test_the_exact_permutation_test_counts_every_split():
    # 3 against 3 completely separated: 2 of the C(6, 3) = 20 splits are as extreme, p = 0.1
    assert difference([1.0, 2.0, 3.0], [4.0, 5.0, 7.0], "permutation").p == pytest.approx(0.1)
    assert smallest_p(3, 3, "permutation") == pytest.approx(0.1)
    # 5 against 5: 2 / C(10, 5) = 2 / 252
    five = difference([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0], "permutation")
    assert five.p == pytest.approx(2 / 252) and five.separable()


def test_no_test_with_one_seed_and_degenerate_runs():
    assert difference([0.9], [0.8, 0.7]).p is None and not difference([0.9], [0.8, 0.7]).separable()
    assert difference([1.0, 1.0], [1.0, 1.0]).p == 1.0
    assert difference([1.0, 1.0], [0.5, 0.5]).p == 0.0
    with pytest.raises(ValueError, match="test 'bootstrap' is not one of welch, permutation"):
        difference([1.0, 2.0], [1.0, 2.0], "bootstrap")


def test_against_scipy_on_noisy_samples():
    scipy_stats = pytest.importorskip("scipy.stats")
    a, b = [0.91, 0.93, 0.90, 0.95, 0.92], [0.89, 0.90, 0.91, 0.88, 0.90]
    assert difference(a, b).p == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue)
    low, high = scipy_stats.t.interval(0.95, len(a) - 1, loc=sum(a) / 5, scale=scipy_stats.sem(a))
    assert (interval(a).low, interval(a).high) == pytest.approx((low, high))


def _scipy_t(values, confidence=0.95) -> tuple[float, float]:
    return scipy_stats.t.interval(confidence, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))


def test_the_log_interval_is_scipys_t_interval_of_the_logs_exponentiated():
    tokens_per_second = [4000.0, 5200.0, 4570.0, 3900.0]
    got = log_interval(tokens_per_second)
    assert got.mean == pytest.approx(sum(tokens_per_second) / 4), "the reported point is the arithmetic mean"
    low, high = np.exp(_scipy_t(np.log(tokens_per_second)))
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-12)
    assert got.low < got.mean < got.high and got.n == 4


def test_the_log_interval_reaches_the_arithmetic_mean_where_the_geometric_one_falls_short():
    skewed = [1.0, 1.0, 1.0, 1.0, 1000.0]  # arithmetic mean 200.8, far above the geometric mean 3.98
    low, high = np.exp(_scipy_t(np.log(skewed)))
    assert high < 200.8, "scipy's interval of the logs misses the arithmetic mean"
    got = log_interval(skewed)
    assert got.mean == pytest.approx(200.8) and got.high == got.mean and got.low == pytest.approx(low)


def test_a_cost_interval_never_goes_below_zero():
    spread = [10.0, 9000.0, 4760.0]
    assert interval(spread).low < 0, "the Student-t interval of these runs passes below 0"
    assert 0 < log_interval(spread).low < log_interval(spread).mean
    assert log_interval([7.0]).low is None, "one seed: no interval"
    for same in (log_interval([2.5, 2.5, 2.5]), log_interval([600.0] * 3)):
        assert same.low == same.high == same.mean, "runs that agree: no interval wider than the value"
    # a value <= 0 has no log: the Student-t interval, cut at 0
    with_zero = log_interval([0.0, 0.0, 5.0])
    assert interval([0.0, 0.0, 5.0]).low < 0 and with_zero.low == 0.0
    assert with_zero.high == pytest.approx(interval([0.0, 0.0, 5.0]).high)
    assert log_interval([0.0, 0.0]).low == log_interval([0.0, 0.0]).high == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e9), min_size=2, max_size=6))
def test_a_cost_interval_is_never_negative_and_contains_its_mean(values):
    got = log_interval(values)
    assert 0.0 <= got.low <= got.mean <= got.high


def test_the_bounded_interval_is_the_arcsine_square_root_t_interval_mapped_back():
    accuracies = [0.91, 0.95, 0.88, 0.97]
    low, high = np.sin(np.clip(_scipy_t(np.arcsin(np.sqrt(accuracies))), 0, np.pi / 2)) ** 2
    got = bounded_interval(accuracies, (0.0, 1.0))
    assert got.mean == pytest.approx(0.9275)
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-12)
    bleu = [21.5, 24.0, 19.8]  # BLEU in [0, 100]: the share of the range is transformed
    low, high = 100 * np.sin(np.clip(_scipy_t(np.arcsin(np.sqrt(np.array(bleu) / 100))), 0, np.pi / 2)) ** 2
    got = bounded_interval(bleu, (0.0, 100.0))
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-12)


def test_a_bounded_interval_stays_in_its_bounds_at_the_edges():
    near_one = [1.0, 1.0, 0.9]
    assert interval(near_one).high > 1, "the Student-t interval passes 1"
    got = bounded_interval(near_one, (0.0, 1.0))
    assert got.high == 1.0 and 0 < got.low < got.mean
    near_zero = bounded_interval([0.0, 0.0, 0.1], (0.0, 1.0))
    assert near_zero.low == 0.0 and near_zero.mean < near_zero.high < 1
    assert (bounded_interval([0.0, 1.0], (0.0, 1.0)).low, bounded_interval([0.0, 1.0], (0.0, 1.0)).high) == (0.0, 1.0)
    for edge in (0.0, 1.0):
        same = bounded_interval([edge] * 3, (0.0, 1.0))
        assert same.low == same.high == same.mean == edge
    assert bounded_interval([1.0], (0.0, 1.0)).low is None
    one_ulp = bounded_interval([1.0, 1 - 2**-53, 1.0], (0.0, 1.0))
    assert 0.999 < one_ulp.low <= one_ulp.mean <= one_ulp.high <= 1.0
    with pytest.raises(ValueError, match=r"value 1.2 lies outside the bounds \[0.0, 1.0\]"):
        bounded_interval([0.9, 1.2], (0.0, 1.0))
    with pytest.raises(ValueError, match="low < high"):
        bounded_interval([0.5, 0.6], (1.0, 0.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6), st.sampled_from([(0.0, 1.0), (0.0, 100.0)]))
def test_a_bounded_interval_is_inside_its_bounds_and_contains_its_mean(shares, bounds):
    values = [bounds[0] + x * (bounds[1] - bounds[0]) for x in shares]
    got = bounded_interval(values, bounds)
    assert bounds[0] <= got.low <= got.mean <= got.high <= bounds[1]


def test_the_bounded_interval_covers_the_true_mean_95_percent_of_the_time_with_three_seeds():
    rng = np.random.default_rng(0)
    true_mean, draws = 0.9, 2000  # accuracies Beta(90, 10) over seeds
    covered = sum(
        got.low <= true_mean <= got.high
        for got in (bounded_interval(list(rng.beta(90, 10, 3)), (0.0, 1.0)) for _ in range(draws))
    )
    assert 0.93 <= covered / draws <= 0.97


def test_holm_against_hand_computed_adjustments():
    # sorted: 0.005 * 4 = 0.02, 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # a test not possible stays None and is not counted: m = 2
    assert holm([0.02, None, 0.04]) == [pytest.approx(0.04), None, pytest.approx(0.04)]
    assert holm([0.5, 0.6, 0.01]) == pytest.approx([1.0, 1.0, 0.03]), "capped at 1"
    assert holm([0.02, 0.02]) == pytest.approx([0.04, 0.04]), "ties adjust alike"
    assert holm([]) == [] and holm([None]) == [None]


def test_a_paired_difference_is_the_t_test_of_the_pairs_differences():
    a, b = [3.0, 5.5, 4.1, 7.0], [2.5, 5.2, 3.0, 6.1]
    found = paired_difference(a, b)
    reference = scipy_stats.ttest_rel(a, b)
    assert found.p == pytest.approx(reference.pvalue) and found.test == "paired"
    low, high = reference.confidence_interval(0.95)
    assert (found.low, found.high) == (pytest.approx(low), pytest.approx(high))
    assert found.difference == pytest.approx(np.mean(np.subtract(a, b)))
    same = paired_difference([1.0, 2.0], [0.5, 1.5])  # every pair differs alike: decided, no t statistic
    assert same.p == 0.0 and same.low == same.high == 0.5
    assert paired_difference([1.0], [0.5]).p is None
    with pytest.raises(ValueError, match="one b for each a, got 2 and 1"):
        paired_difference([1.0, 2.0], [1.0])
