"""Positional encodings against their papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_zoo.core.positional import (
    ALiBiPositional,
    LearnedPositional,
    RotaryPositional,
    SinusoidalPositional,
    sinusoid_table,
)


def test_sinusoid_table_matches_section_3_5():
    table = sinusoid_table(50, 8)
    for pos in (0, 7, 49):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_additive_positions_respect_the_offset():
    pe = SinusoidalPositional(8, 20)
    x = torch.zeros(1, 3, 8)
    torch.testing.assert_close(pe(x, offset=5), pe.table[5:8][None])
    learned = LearnedPositional(8, 20)
    torch.testing.assert_close(learned(x, offset=2), learned.embedding.weight[2:5][None])


@pytest.mark.parametrize("module", [SinusoidalPositional(8, 10), LearnedPositional(8, 10)])
def test_too_long_sequences_are_refused(module):
    with pytest.raises(ValueError, match="max_len=10"):
        module(torch.zeros(1, 11, 8))


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryPositional(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> float:
        rq, _ = rope.rotate(q, q, i)
        rk, _ = rope.rotate(k, k, j)
        return (rq * rk).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = ALiBiPositional(4, symmetric=False)
    bias = alibi.bias(3, 3, torch.device("cpu"))
    slopes = [2 ** (-8 * (h + 1) / 4) for h in range(4)]
    assert bias.shape == (4, 3, 3)
    assert bias[1, 2, 0].item() == pytest.approx(-2 * slopes[1])
    assert bias[0, 0, 2].item() == 0.0  # the future is masked elsewhere, not penalised here
    symmetric = ALiBiPositional(4, symmetric=True).bias(3, 3, torch.device("cpu"))
    assert symmetric[0, 0, 2].item() == pytest.approx(-2 * slopes[0])
