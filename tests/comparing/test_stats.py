"""Intervals and tests over seeds, against values computed by hand."""

from __future__ import annotations

import math

import pytest

from transformer_zoo.comparing.stats import difference, interval, smallest_p


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
