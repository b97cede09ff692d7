"""Claims judged as seeds are added in rounds: the spending of alpha over the looks, the interval
and regions of the gain, and, by simulating many studies of normal data (sd 1, fixed numpy
seeds), the error rates and seeds the procedure gives against peeking at a plain 95% interval and
against a fixed number of seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t

from transformer_zoo.comparing.records import ALPHA
from transformer_zoo.comparing.sequential import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    claim_share,
    gain_interval,
    look_alphas,
    planned_looks,
    region,
    simulate,
    simulate_fixed,
    smaller_than_effect,
    spent,
)
from transformer_zoo.comparing.stats import difference, paired_difference

LOOKS = [3, 5, 7, 9, 10]  # 3 seeds a side, then 2 more a round, up to 10
STUDIES = 20_000


def sides(seed: int, gain: float, most: int = 10, studies: int = STUDIES) -> tuple[np.ndarray, np.ndarray]:
    """``studies`` simulated studies of ``most`` seeds a side: a ~ N(gain, 1), b ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((studies, most)) + gain, rng.standard_normal((studies, most))


def at_most(rate: float, bound: float, studies: int) -> bool:
    """Whether an observed rate is within Monte-Carlo error (3 standard errors) of ``bound``."""
    return rate <= bound + 3 * math.sqrt(bound * (1 - bound) / studies)


# --- spending and looks


def test_the_looks_spend_alpha_in_all_when_they_reach_most():
    alphas = look_alphas(LOOKS, 10)
    assert sum(alphas) == pytest.approx(ALPHA)
    assert all(x > 0 for x in alphas)
    assert alphas[0] == pytest.approx(spent(0.3))  # Pocock-type: 0.05 * ln(1 + (e - 1) * 0.3)
    assert spent(0.3) == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.3))
    assert spent(0.0) == 0.0 and spent(1.0) == pytest.approx(ALPHA) and spent(2.0) == pytest.approx(ALPHA)


def test_looks_cut_short_leave_alpha_unspent():
    assert sum(look_alphas([3, 5, 7], 10)) == pytest.approx(spent(0.7))
    assert spent(0.7) < ALPHA


def test_planned_looks_add_a_round_at_a_time_and_end_at_most():
    assert planned_looks(3, 2, 10) == [3, 5, 7, 9, 10]
    assert planned_looks(3, 2, 9) == [3, 5, 7, 9]
    assert planned_looks(4, 10, 6) == [4, 6]
    assert planned_looks(5, 1, 5) == [5]


@pytest.mark.parametrize(
    "looks, most, message",
    [
        ([], 10, "no looks"),
        ([1, 3], 10, "needs 2 or more"),
        ([3, 5, 5], 10, "strictly increasing: 5 follows 5"),
        ([3, 12], 10, "passes most = 10"),
    ],
)
def test_look_alphas_refuse_looks_that_cannot_be_planned(looks, most, message):
    with pytest.raises(ValueError, match=message):
        look_alphas(looks, most)


@pytest.mark.parametrize(
    "first, round_size, most, message",
    [(1, 2, 10, "needs 2 or more"), (12, 2, 10, "give most >= 12"), (3, 0, 10, "add 1 or more")],
)
def test_planned_looks_refuse_what_cannot_be_planned(first, round_size, most, message):
    with pytest.raises(ValueError, match=message):
        planned_looks(first, round_size, most)


def test_spending_refuses_an_alpha_outside_zero_and_one():
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\)"):
        spent(0.5, alpha=1.5)


# --- the interval and regions of the gain


def test_the_gain_interval_is_welchs_and_the_paired_t_interval():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, (4, 6)), rng.normal(0.0, 2.0, (4, 6))
    mean, low, high = gain_interval(a, b, ALPHA)
    paired_mean, paired_low, paired_high = gain_interval(a, b, ALPHA, paired=True)
    for i in range(4):
        welch = difference(list(a[i]), list(b[i]))
        assert (mean[i], low[i], high[i]) == pytest.approx((welch.difference, welch.low, welch.high))
        pairs = paired_difference(list(a[i]), list(b[i]))
        assert (paired_mean[i], paired_low[i], paired_high[i]) == pytest.approx(
            (pairs.difference, pairs.low, pairs.high)
        )


def test_runs_that_agree_give_an_empty_interval_at_the_mean():
    mean, low, high = gain_interval(np.array([2.0, 2.0, 2.0]), np.array([1.5, 1.5, 1.5]), ALPHA)
    assert mean == low == high == 0.5
    mean, low, high = gain_interval(np.array([2.0, 3.0]), np.array([1.0, 2.0]), ALPHA, paired=True)
    assert mean == low == high == 1.0


def test_pairing_narrows_the_interval_when_the_pairs_move_together():
    rng = np.random.default_rng(1)
    shared = rng.standard_normal((1000, 8))  # what a seed does to both variants
    a, b = shared + 0.1 * rng.standard_normal((1000, 8)), shared + 0.1 * rng.standard_normal((1000, 8))
    _, low, high = gain_interval(a, b, ALPHA)
    _, paired_low, paired_high = gain_interval(a, b, ALPHA, paired=True)
    assert np.all(paired_high - paired_low < high - low)


def test_the_gain_interval_refuses_too_few_values_and_unpaired_pairs():
    with pytest.raises(ValueError, match="2 or more values a side"):
        gain_interval(np.array([1.0]), np.array([1.0, 2.0]), ALPHA)
    with pytest.raises(ValueError, match="one b for each a"):
        gain_interval(np.ones(3), np.ones(4), ALPHA, paired=True)


@pytest.mark.parametrize(
    "relation, effect, low, high, expected",
    [
        ("better", 0.5, 0.1, 0.9, HOLDS),
        ("better", 0.5, 0.1, 0.4, HOLDS),  # holds, smaller than the effect of interest
        ("better", 0.5, -0.1, 0.4, DOES_NOT_HOLD),
        ("better", 0.5, -0.1, 0.5, INCONCLUSIVE),
        ("better", 0.0, -0.1, 0.0, DOES_NOT_HOLD),  # no effect of interest: at or below 0, as before
        ("better", 0.0, -0.1, 0.1, INCONCLUSIVE),
        ("not-worse", 0.5, -0.5, 2.0, HOLDS),
        ("not-worse", 0.5, -0.9, -0.6, DOES_NOT_HOLD),
        ("not-worse", 0.5, -0.9, -0.5, INCONCLUSIVE),
        ("matches", 0.5, -0.5, 0.5, HOLDS),
        ("matches", 0.5, 0.6, 0.9, DOES_NOT_HOLD),
        ("matches", 0.5, -0.9, -0.6, DOES_NOT_HOLD),
        ("matches", 0.5, 0.4, 0.9, INCONCLUSIVE),
    ],
)
def test_regions(relation, effect, low, high, expected):
    assert region(np.array([low]), np.array([high]), relation, effect)[0] == expected


def test_a_gain_smaller_than_the_effect_is_flagged():
    flags = smaller_than_effect(np.array([0.1, 0.1, -0.1]), np.array([0.4, 0.6, 0.4]), 0.5)
    assert flags.tolist() == [True, False, False]


@pytest.mark.parametrize(
    "relation, effect, message",
    [("steadier", 0.5, "not judged by an interval"), ("better", -1.0, "0 or more"), ("matches", 0.0, "effect")],
)
def test_regions_refuse_what_cannot_be_judged(relation, effect, message):
    with pytest.raises(ValueError, match=message):
        region(np.zeros(1), np.ones(1), relation, effect)


def test_the_simulation_judges_each_study_as_the_scalar_statistics_do():
    a, b = sides(3, 1.0, studies=60)
    got = simulate(a, b, LOOKS, "better", 0.5)
    for i in range(60):
        verdict, seeds = INCONCLUSIVE, LOOKS[-1]
        for n, level in zip(LOOKS, look_alphas(LOOKS, 10)):
            d = difference(list(a[i, :n]), list(b[i, :n]), confidence=1 - level)
            verdict = HOLDS if d.low > 0 else DOES_NOT_HOLD if d.high < 0.5 else INCONCLUSIVE
            if verdict != INCONCLUSIVE:
                seeds = n
                break
        assert (got.verdict[i], got.seeds[i]) == (verdict, seeds)
    assert 0 < (got.verdict == HOLDS).sum() < 60  # some studies decided at some look, others not


# --- error rates by simulation


def test_with_no_difference_false_holds_stay_within_alpha():
    a, b = sides(10, 0.0)
    rate = float(np.mean(simulate(a, b, LOOKS, "better", 0.5).verdict == HOLDS))
    # observed 0.0133 (a false "holds" needs the interval above the true gain: at most alpha / 2)
    assert at_most(rate, ALPHA, STUDIES), rate


def test_peeking_at_a_plain_interval_inflates_the_error_and_spending_does_not():
    looks = list(range(2, 21))  # a look after every seed, up to 20
    a, b = sides(11, 0.0, most=20)
    naive = float(np.mean(simulate(a, b, looks, "better", 0.5, naive=True).verdict == HOLDS))
    spending = float(np.mean(simulate(a, b, looks, "better", 0.5).verdict == HOLDS))
    # observed: naive 0.110, with spending 0.008
    assert not at_most(naive, ALPHA, STUDIES), f"naive peeking gave false 'holds' {naive:.4f}, expected above {ALPHA}"
    assert at_most(spending, ALPHA, STUDIES), f"with spending, false 'holds' {spending:.4f}"


def test_the_procedure_needs_fewer_seeds_than_a_fixed_design_of_equal_power():
    gain = 2.0  # in sd units
    a, b = sides(12, gain)
    run = simulate(a, b, LOOKS, "better", 0.5)
    power, seeds = float(np.mean(run.verdict == HOLDS)), float(run.seeds.mean())
    fixed = next(
        n
        for n in range(2, 40)
        if np.mean(simulate_fixed(*sides(100 + n, gain, most=n), "better", 0.5).verdict == HOLDS) >= power
    )
    # observed: power 0.885 with 6.40 seeds a side on average; the fixed design needs 7 for that power
    # (6 give 0.868). Where the most seeds leave the power low the saving turns round: at a gain of
    # 1.5 sd these looks give power 0.61 with 7.8 seeds on average, which 6 fixed seeds pass (0.63).
    assert 0.8 <= power <= 0.95, power
    assert seeds < fixed, f"{seeds:.2f} seeds a side on average, against {fixed} fixed ones for power {power:.3f}"


@pytest.mark.parametrize(
    "relation, gain, wrong, bound",
    [
        ("better", 0.0, HOLDS, ALPHA / 2),  # no gain: "holds" is false
        ("better", 0.5, DOES_NOT_HOLD, ALPHA / 2),  # a gain of exactly the effect: "no gain that large" is false
        ("not-worse", -0.5, DOES_NOT_HOLD, ALPHA / 2),  # at the margin: "worse by more than it" is false
        ("not-worse", -0.5, HOLDS, ALPHA / 2),  # "holds" is false just below the margin
        ("matches", 0.0, DOES_NOT_HOLD, ALPHA),  # equal: "differs by more than the margin" is false, either way
        ("matches", 0.5, DOES_NOT_HOLD, ALPHA / 2),
        ("matches", 0.5, HOLDS, ALPHA / 2),  # "holds" is false just beyond the margin
    ],
)
@pytest.mark.parametrize("design", ["fixed", "sequential"])
def test_each_verdict_is_wrong_no_more_often_than_its_share_of_alpha(relation, gain, wrong, bound, design):
    a, b = sides(13, gain)
    run = simulate_fixed(a, b, relation, 0.5) if design == "fixed" else simulate(a, b, LOOKS, relation, 0.5)
    rate = float(np.mean(run.verdict == wrong))
    assert at_most(rate, bound, STUDIES), f"{design} {relation} at a gain of {gain}: verdict {wrong} in {rate:.4f}"


def test_a_zero_gain_reaches_does_not_hold_only_with_an_effect_of_interest():
    a, b = sides(14, 0.0, most=30)
    with_effect = float(np.mean(simulate_fixed(a, b, "better", 1.0).verdict == DOES_NOT_HOLD))
    without = [
        float(np.mean(simulate_fixed(a[:, :n], b[:, :n], "better", 0.0).verdict == DOES_NOT_HOLD)) for n in (10, 30)
    ]
    # observed: 0.96 at 30 seeds with an effect of 1 sd; 0.026 at both 10 and 30 seeds with none: the
    # interval then must lie at or below 0, as likely with 30 seeds as with 10
    assert with_effect > 0.9, with_effect
    assert all(at_most(rate, ALPHA / 2, STUDIES) for rate in without), without


# --- several claims of a study


def test_claims_share_alpha_by_the_statements_that_can_be_false():
    assert claim_share(["better"]) == 1.0
    assert claim_share(["better", "not-worse"]) == 1.0  # at most one false statement each: alpha / 2 apiece
    assert claim_share(["better"] * 3) == pytest.approx(2 / 3)
    assert claim_share(["matches"]) == 1.0
    assert claim_share(["better", "matches"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="'equals' is not one of"):
        claim_share(["equals"])
    with pytest.raises(ValueError, match="one claim or more"):
        claim_share([])


def test_three_claims_with_no_difference_give_any_false_holds_within_alpha():
    studies = 5_000
    rng = np.random.default_rng(15)
    b = rng.standard_normal((studies, 10))  # three variants, each against one reference
    share = claim_share(["better"] * 3)
    runs = [simulate(rng.standard_normal((studies, 10)), b, LOOKS, "better", 0.5, share=share) for _ in range(3)]
    rate = float(np.mean(np.any([run.verdict == HOLDS for run in runs], axis=0)))
    # observed 0.026
    assert at_most(rate, ALPHA, studies), rate


def test_sharing_by_statements_decides_what_bonferroni_over_claims_leaves_open():
    # three better claims: each judged at 2/3 of alpha, where Bonferroni over claims gives 1/3
    n, base = 5, np.array([-1.5, -0.5, 0.0, 0.5, 1.5]) / math.sqrt(1.25)  # mean 0, sd 1
    statistic = (t.ppf(1 - ALPHA / 6, n - 1) + t.ppf(1 - ALPHA / 3, n - 1)) / 2  # between the two levels
    gains = base + statistic / math.sqrt(n)
    by_statements = region(
        *gain_interval(gains, np.zeros(n), ALPHA * claim_share(["better"] * 3), paired=True)[1:], "better", 0.5
    )
    by_claims = region(*gain_interval(gains, np.zeros(n), ALPHA / 3, paired=True)[1:], "better", 0.5)
    assert (int(by_statements), int(by_claims)) == (HOLDS, INCONCLUSIVE)


def test_holms_step_down_over_claims_would_let_false_verdicts_past_alpha():
    # Four precise better claims and a matches claim with a small margin, none with a difference. Holm
    # over claims judges the first pass at alpha / 5; the better claims are then decided "does not hold"
    # (rightly), and the matches claim alone is judged at alpha, where "differs" is false yet given
    # about alpha of the time, on top of the better claims' false "holds". The statement count keeps it.
    studies, n = 20_000, 30
    rng = np.random.default_rng(16)
    zeros = np.zeros((studies, n))
    precise = [rng.standard_normal((studies, n)) for _ in range(4)]
    close = rng.standard_normal((studies, n))

    def verdicts(level: float) -> tuple[list[np.ndarray], np.ndarray]:
        better = [region(*gain_interval(x, zeros, level, paired=True)[1:], "better", 3.0) for x in precise]
        return better, region(*gain_interval(close, zeros, level, paired=True)[1:], "matches", 0.001)

    better, matches = verdicts(ALPHA / 5)
    assert np.all(np.array(better) != INCONCLUSIVE)  # every better claim decided at the first pass
    matches = np.where(matches == INCONCLUSIVE, verdicts(ALPHA)[1], matches)
    holm = float(np.mean(np.any(np.array(better) == HOLDS, axis=0) | (matches == DOES_NOT_HOLD)))
    better, matches = verdicts(ALPHA * claim_share(["better"] * 4 + ["matches"]))
    shared = float(np.mean(np.any(np.array(better) == HOLDS, axis=0) | (matches == DOES_NOT_HOLD)))
    # observed: Holm 0.069, the statement count 0.049
    assert not at_most(holm, ALPHA, studies), holm
    assert at_most(shared, ALPHA, studies), shared
