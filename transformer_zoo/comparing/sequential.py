"""Claims judged as seeds are added in rounds, with the chance of any false verdict kept at alpha.

A claim (``a`` is ``better`` than ``b``, ``not-worse``, or ``matches`` it, on one metric) is
judged from the two-sided interval over seeds of the *gain*: ``a - b`` taken the way the metric
is better (the caller flips the sign of a lower-is-better metric). With the smallest effect of
interest ``effect`` (``δ``, the margin of ``not-worse`` and ``matches``), :func:`region` reads an
interval ``[low, high]`` of the gain as:

- ``better``: **holds** when ``low > 0``; **does not hold** when ``high < δ`` (no gain as large
  as ``δ``; with ``δ = 0``, when ``high <= 0``); **inconclusive** otherwise. A "holds" whose
  ``high < δ`` is a gain smaller than the effect of interest (:func:`smaller_than_effect`).
- ``not-worse``: holds when ``low >= -δ``; does not hold when ``high < -δ``.
- ``matches`` (``δ > 0``): holds when ``-δ <= low`` and ``high <= δ``; does not hold when
  ``low > δ`` or ``high < -δ``.

Seeds come in rounds ("looks": 3 a side, then 5, 7, 9, 10; :func:`planned_looks`), and a claim
stops at the first look that decides it. Looking again and again at a 95% interval would give a
false verdict more often than 5% of the time (each look is another chance to be misled), so the
look at ``n_k`` seeds a side uses the interval at confidence ``1 - alpha_k``, where

    alpha_k = f(n_k / most) - f(n_(k-1) / most),   f(t) = alpha * ln(1 + (e - 1) * min(t, 1))

is the increment of Lan and DeMets' Pocock-type spending function (:func:`spent`,
:func:`look_alphas`; K. K. G. Lan and D. L. DeMets, "Discrete sequential boundaries for clinical
trials", Biometrika 70(3), 1983). The increments sum to at most ``alpha``, so by the union bound
the true gain lies in every look's interval with a chance of at least ``1 - alpha``: a
confidence sequence, conservative (the union bound ignores that looks share seeds), and valid
however the looks end early (a look the time budget prevents leaves its alpha unspent). Each
false verdict needs the interval to miss the true gain, so a claim's chance of one is at most
``alpha``.

Several claims of one study. A verdict is a one-sided statement about the true gain (``gain >
0``, ``gain < δ``, ...); a false one needs the interval to miss the truth on one side, a chance
of at most ``alpha_k / 2`` at level ``alpha_k``. Of a ``better`` or ``not-worse`` claim's
statements at most one can be false, of a ``matches`` claim's at most two (``gain > δ`` and
``gain < -δ`` are both false when it matches); call that the claim's count, and ``F`` the
study's total. Judging every claim at level ``alpha_k * min(1, 2 / F)`` (:func:`claim_share`)
keeps the chance of any false verdict in the study at or below ``alpha``: the union bound over
at most ``F`` false statements, each missed with a chance of at most ``alpha / F`` over all
looks. This is Bonferroni's correction counted in statements, not claims, and it is twice as
lenient as Bonferroni over claims for ``better`` and ``not-worse`` claims.

Why not Holm's step-down, as in Bartroff and Lai's multistage tests (J. Bartroff and T. L. Lai,
"Multistage tests of multiple hypotheses", Communications in Statistics - Theory and Methods
39(8-9), 2010)? Holm raises the level of the claims still open as others are decided, which is
safe when only one kind of decision is error-controlled (rejecting a true hypothesis) and the
other (accepting it) spends nothing. Here both verdicts are: a claim rightly decided "does not
hold" may still be one whose "holds" would be false, so deciding it says nothing about how many
false statements remain, and raising the others' level can exceed ``alpha`` (four precise
``better`` claims and a ``matches`` claim with a small margin, none with a true difference: about
0.069 at ``alpha = 0.05``, where the count above gives 0.049; ``tests/comparing/test_sequential.py``
simulates it).

:func:`simulate` runs the procedure on many simulated studies at once (``naive=True``: a plain
interval at every look, for contrast), which is how the tests check the error rates and the
seeds saved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _scipy

from .records import ALPHA

GainRelation = Literal["better", "not-worse", "matches"]
"""The relations judged from an interval of the gain of ``a`` over ``b``."""

HOLDS, INCONCLUSIVE, DOES_NOT_HOLD = 1, 0, -1
"""The codes :func:`region` gives a verdict."""

FALSE_STATEMENTS: dict[str, int] = {"better": 1, "not-worse": 1, "matches": 2, "steadier": 2}
"""How many of a claim's one-sided statements can be false at once, by relation. ``steadier``,
judged by a two-sided test of equal spread (``p`` below the level), errs with a chance of up to
the whole level, as two one-sided statements would."""


def spent(fraction: float, alpha: float = ALPHA) -> float:
    """The alpha spent once ``fraction`` of the planned seeds have run: Lan and DeMets'
    Pocock-type function ``alpha * ln(1 + (e - 1) * min(fraction, 1))`` (0 at 0, ``alpha`` at 1).

    Raises:
        ValueError: ``fraction`` is negative, or ``alpha`` is not in (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha} must lie in (0, 1), such as 0.05")
    if not fraction >= 0:
        raise ValueError(f"the fraction of planned seeds run is {fraction}; it must be 0 or more")
    return alpha * math.log(1 + (math.e - 1) * min(fraction, 1.0))


def look_alphas(looks: Sequence[int], most: int, alpha: float = ALPHA) -> list[float]:
    """The alpha each look spends: ``spent(n_k / most) - spent(n_(k-1) / most)`` for looks at
    ``n_k`` seeds a side (``n_0 = 0``). They sum to ``alpha`` when the last look is at ``most``,
    and to less when the looks stop short of it.

    Raises:
        ValueError: ``looks`` is empty, not strictly increasing, starts below 2 seeds (one seed
            gives no interval), or passes ``most``.
    """
    if not looks:
        raise ValueError("no looks: give the seeds a side at each look, such as [3, 5, 7, 9, 10]")
    if looks[0] < 2:
        raise ValueError(f"the first look is at {looks[0]} seeds a side; an interval needs 2 or more")
    for earlier, later in zip(looks, looks[1:]):
        if later <= earlier:
            raise ValueError(f"looks {list(looks)} must be strictly increasing: {later} follows {earlier}")
    if looks[-1] > most:
        raise ValueError(f"the last look, at {looks[-1]} seeds a side, passes most = {most}; raise most or drop it")
    fractions = [0.0] + [n / most for n in looks]
    return [spent(t, alpha) - spent(s, alpha) for s, t in zip(fractions, fractions[1:])]


def planned_looks(first: int, round_size: int, most: int) -> list[int]:
    """The seeds a side at each look: ``first``, then ``round_size`` more each round, the last
    look at ``most``. Planned before any run, so that the alpha each look spends does not depend
    on what the runs show.

    >>> planned_looks(3, 2, 10)
    [3, 5, 7, 9, 10]

    Raises:
        ValueError: ``first`` is below 2 or above ``most``, or ``round_size`` is below 1.
    """
    if first < 2:
        raise ValueError(f"the first look is at {first} seeds a side; an interval needs 2 or more")
    if first > most:
        raise ValueError(f"the first look, at {first} seeds a side, passes most = {most}; give most >= {first}")
    if round_size < 1:
        raise ValueError(f"each round adds {round_size} seeds; it must add 1 or more")
    return [*range(first, most, round_size), most]


def gain_interval(
    a: np.ndarray, b: np.ndarray, alpha_level: float, paired: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``mean(a) - mean(b)`` over the last axis and its two-sided interval at confidence
    ``1 - alpha_level``: Welch's (Welch-Satterthwaite degrees of freedom), or with ``paired``
    the Student-t interval of the pairs' differences ``a[..., i] - b[..., i]``. Where the runs
    agree exactly (zero variance), ``low = high = mean``.

    Args:
        a, b: values of shape ``(..., n_a)`` and ``(..., n_b)`` (equal when paired); the leading
            axes (simulated studies, say) are kept.
        alpha_level: the interval's alpha, in (0, 1).

    Returns:
        ``(mean, low, high)``, each of the leading shape.

    Raises:
        ValueError: a side has fewer than 2 values, pairs that do not pair up, or ``alpha_level``
            outside (0, 1).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not 0 < alpha_level < 1:
        raise ValueError(f"alpha_level {alpha_level} must lie in (0, 1)")
    if a.shape[-1] < 2 or b.shape[-1] < 2:
        raise ValueError(f"an interval needs 2 or more values a side, got {a.shape[-1]} and {b.shape[-1]}")
    if paired:
        if a.shape != b.shape:
            raise ValueError(f"paired values need one b for each a, got shapes {a.shape} and {b.shape}")
        d = a - b
        mean = d.mean(axis=-1)
        var = d.var(axis=-1, ddof=1) / d.shape[-1]  # of the mean difference
        df = np.full(mean.shape, d.shape[-1] - 1.0)
    else:
        mean = a.mean(axis=-1) - b.mean(axis=-1)
        va = a.var(axis=-1, ddof=1) / a.shape[-1]
        vb = b.var(axis=-1, ddof=1) / b.shape[-1]
        var = va + vb
        with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where both sides agree: masked below
            df = var**2 / (va**2 / (a.shape[-1] - 1) + vb**2 / (b.shape[-1] - 1))
    spread = var > 0
    t = _scipy.t.ppf(1 - alpha_level / 2, np.where(spread, df, 1.0))
    half = np.where(spread, t * np.sqrt(var), 0.0)
    return mean, mean - half, mean + half


def region(low: np.ndarray, high: np.ndarray, relation: GainRelation, effect: float) -> np.ndarray:
    """The verdict an interval ``[low, high]`` of the gain gives ``relation`` with the smallest
    effect of interest (the margin) ``effect``: :data:`HOLDS`, :data:`DOES_NOT_HOLD` or
    :data:`INCONCLUSIVE` (1, -1, 0), elementwise (the rules are the module's docstring's).

    Raises:
        ValueError: an unknown relation, a negative effect, or ``matches`` with effect 0 (no
            interval lies within [0, 0]).
    """
    if relation not in ("better", "not-worse", "matches"):
        raise ValueError(f"relation {relation!r} is not judged by an interval; give better, not-worse or matches")
    if not effect >= 0:
        raise ValueError(f"effect {effect} must be 0 or more: the smallest gain that counts, in the metric's units")
    if relation == "matches" and effect == 0:
        raise ValueError("a 'matches' claim needs an effect (margin) > 0: no interval lies within [0, 0]")
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    if relation == "better":
        holds = low > 0
        fails = high < effect if effect > 0 else high <= 0
    elif relation == "not-worse":
        holds = low >= -effect
        fails = high < -effect
    else:
        holds = (low >= -effect) & (high <= effect)
        fails = (low > effect) | (high < -effect)
    return np.where(holds, HOLDS, np.where(fails, DOES_NOT_HOLD, INCONCLUSIVE))


def smaller_than_effect(low: np.ndarray, high: np.ndarray, effect: float) -> np.ndarray:
    """Whether a ``better`` claim holds with a gain smaller than the effect of interest: the
    interval lies above 0 and ends below ``effect`` (a real gain, too small to count)."""
    return (np.asarray(low) > 0) & (np.asarray(high) < effect)


def claim_share(relations: Sequence[str]) -> float:
    """The share of each look's alpha at which every claim of a study is judged, given the
    relations of all its claims (decided or not): ``min(1, 2 / F)``, ``F`` the most statements
    that can be false at once (:data:`FALSE_STATEMENTS`; the module's docstring says why).

    >>> claim_share(["better"]), claim_share(["better", "better", "better"]), claim_share(["matches"] * 2)
    (1.0, 0.6666666666666666, 0.5)

    Raises:
        ValueError: no relations, or an unknown one.
    """
    if not relations:
        raise ValueError("a study needs one claim or more to share alpha among")
    unknown = [r for r in relations if r not in FALSE_STATEMENTS]
    if unknown:
        raise ValueError(f"relation {unknown[0]!r} is not one of {', '.join(FALSE_STATEMENTS)}")
    return min(1.0, 2 / sum(FALSE_STATEMENTS[r] for r in relations))


@dataclass(frozen=True)
class Simulated:
    """Each simulated study's outcome for one claim: its verdict code, the seeds a side it ran
    and the index of the look that stopped it (the last look when none decided it)."""

    verdict: np.ndarray
    seeds: np.ndarray
    look: np.ndarray


def simulate(
    a: np.ndarray,
    b: np.ndarray,
    looks: Sequence[int],
    relation: GainRelation,
    effect: float,
    alpha: float = ALPHA,
    share: float = 1.0,
    paired: bool = False,
    naive: bool = False,
) -> Simulated:
    """Run the sequential procedure on many studies at once: at each look, each study still open
    is judged from its first ``n_k`` seeds a side, and stops when decided.

    Args:
        a, b: gains' two sides, shape ``(studies, most)``: ``most``, the planned last look over
            which alpha is spent, is their width.
        looks: seeds a side at each look (:func:`planned_looks`); they may stop short of
            ``most``, as when the time budget ends the rounds.
        share: the share of each look's alpha this claim gets (:func:`claim_share`).
        naive: judge every look at ``alpha`` itself, with no spending (which lets a false
            verdict through more often: the contrast the procedure is for).

    Returns:
        Each study's verdict, seeds a side and stopping look (:class:`Simulated`).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"a and b must both be (studies, most), got shapes {a.shape} and {b.shape}")
    levels = [alpha] * len(looks) if naive else look_alphas(looks, a.shape[1], alpha)
    verdict = np.zeros(a.shape[0], dtype=int)
    look = np.full(a.shape[0], len(looks) - 1)
    open_ = np.ones(a.shape[0], dtype=bool)
    for k, (n, level) in enumerate(zip(looks, levels)):
        judged = np.flatnonzero(open_)
        _, low, high = gain_interval(a[judged, :n], b[judged, :n], level * share, paired)
        verdict[judged] = region(low, high, relation, effect)
        stopped = judged[verdict[judged] != INCONCLUSIVE]
        look[stopped] = k
        open_[stopped] = False
        if not open_.any():
            break
    return Simulated(verdict, np.asarray(looks)[look], look)


def simulate_fixed(
    a: np.ndarray,
    b: np.ndarray,
    relation: GainRelation,
    effect: float,
    alpha: float = ALPHA,
    paired: bool = False,
) -> Simulated:
    """The fixed design, for comparison: one look at every seed of ``a`` and ``b`` (shape
    ``(studies, n)``), at confidence ``1 - alpha``."""
    return simulate(a, b, [np.shape(a)[-1]], relation, effect, alpha, paired=paired)
