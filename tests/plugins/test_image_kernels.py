"""Local 2-D attention (the image plugin's kernels): the pattern is the query block grown by the
memory margin, the blocked kernel equals full attention under the pattern's mask, and the sparse
kernel chooser of the core computes it."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.local_attention import DENSE_UP_TO, PatternKernel, flex_attention_kernel
from transformer_zoo.plugins.image.kernels import Local2dPattern, local_2d_attention


@pytest.mark.parametrize(
    ("grid", "block", "memory"),
    [
        ((7, 9), (2, 3), (1, 2)),
        ((8, 8), (4, 4), (0, 0)),
        ((6, 5), (1, 5), (2, 0)),
        ((5, 7), (2, 3), (1, 1)),
        ((3, 4), (1, 1), (10, 10)),
    ],
)
def test_local_2d_equals_full_attention_under_the_2d_mask(grid, block, memory):
    pattern = Local2dPattern(grid=grid, query_block=block, memory=memory)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, grid[0] * grid[1], 8, requires_grad=True) for _ in range(3))
    mask = pattern.dense()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = local_2d_attention(q, k, v, pattern)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    for mine, theirs in zip(
        torch.autograd.grad((out * grad).sum(), (q, k, v)), torch.autograd.grad((expected * grad).sum(), (q, k, v))
    ):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    if any(b + 2 * m < g for b, m, g in zip(block, memory, grid)):  # a memory block smaller than the grid
        assert not mask.all(), "the pattern is local"
    else:
        assert mask.all(), "a margin past the grid sees everything"


def test_local_2d_mask_is_the_query_block_grown_by_the_memory_margin():
    mask = Local2dPattern(grid=(6, 6), query_block=(2, 2), memory=(1, 1)).dense()
    seen = mask[2 * 6 + 3].view(6, 6)  # query at row 2, column 3: block rows 2-3, columns 2-3
    expected = torch.zeros(6, 6, dtype=torch.bool)
    expected[1:5, 1:5] = True
    assert torch.equal(seen, expected)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"grid": (4, 4), "query_block": (5, 1), "memory": (0, 0)}, "query_block \\(5, 1\\) is larger than the grid"),
        ({"grid": (4, 4), "query_block": (0, 1), "memory": (0, 0)}, "query_block must be two positive integers"),
        ({"grid": (4, 4), "query_block": (2, 2), "memory": (-1, 0)}, "memory must be two non-negative integers"),
        ({"grid": (4, 4), "query_block": 2, "memory": (1, 1)}, "query_block must be two positive integers"),
        ({"grid": (4, 4), "query_block": (2, 2), "memory": (1.5, 0)}, "memory must be two non-negative integers"),
    ],
)
def test_bad_local_2d_patterns_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Local2dPattern(**fields)


def test_local_2d_is_a_sparse_pattern_the_kernel_chooser_computes():
    pattern = Local2dPattern(grid=(5, 7), query_block=(2, 3), memory=(1, 1))
    q, k, v = (torch.randn(2, 3, 35, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=pattern.dense())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(
            flex_attention_kernel(q, k, v, pattern, compiled=False), expected, atol=1e-5, rtol=1e-5
        )
    for choice in ("dense", "blocked", "auto"):
        out, _ = PatternKernel(pattern, choice)(q, k, v, AttentionMask(), None, 0.0, False)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    kernel = PatternKernel(pattern)
    cpu = torch.device("cpu")
    assert [kernel.choose(n, cpu) for n in (DENSE_UP_TO, DENSE_UP_TO + 1)] == ["dense", "blocked"]
    with pytest.raises(ValueError, match="kernel must be one of auto, dense, flex, blocked"):
        PatternKernel(pattern, "chunked")
    with pytest.raises(ValueError, match="no causal mask, padding or cache"):
        kernel(q, k, v, AttentionMask(causal=True), None, 0.0, False)
