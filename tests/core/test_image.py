"""Image self-attention pieces: SAGAN's block, local 2-D attention, patches, 2-D positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_zoo.core.image import (
    Learned2d,
    Local2dPattern,
    PatchEmbedding,
    SelfAttention2d,
    Sinusoidal2d,
    local_2d_attention,
    sinusoid_2d,
)


def test_sagan_block_is_the_identity_at_init_and_not_after_training():
    torch.manual_seed(0)
    block = SelfAttention2d(16)
    x = torch.randn(2, 16, 5, 6)
    assert torch.equal(block(x)[0], x), "gamma = 0: exactly the identity"
    optimizer = torch.optim.SGD(block.parameters(), lr=0.1)
    target = torch.randn_like(x)
    for _ in range(3):
        optimizer.zero_grad()
        F.mse_loss(block(x)[0], target).backward()
        optimizer.step()
    assert block.gamma.item() != 0
    assert not torch.allclose(block(x)[0], x)


def test_sagan_block_is_the_papers_formula():
    torch.manual_seed(0)
    block = SelfAttention2d(16, reduction=4)
    with torch.no_grad():
        block.gamma.fill_(0.7)
    x = torch.randn(2, 16, 3, 4)
    flat = x.flatten(2)  # (B, C, N)

    def conv(layer, t):
        return torch.einsum("oc,bcn->bon", layer.weight[:, :, 0, 0], t) + layer.bias[None, :, None]

    f, g, h = conv(block.key, flat), conv(block.query, flat), conv(block.value, flat)
    beta = torch.softmax(torch.einsum("bci,bcj->bji", f, g), dim=-1)  # beta[j, i]: softmax over i, unscaled
    o = conv(block.out, torch.einsum("bji,bci->bcj", beta, h))
    expected = (x.flatten(2) + 0.7 * o).view_as(x)
    out, weights = block(x, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, beta, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(block(x)[0], expected, atol=1e-5, rtol=1e-5)  # the fused path


@pytest.mark.parametrize(("grid", "block", "memory"), [((7, 9), (2, 3), (1, 2)), ((8, 8), (4, 4), (0, 0)),
                                                        ((6, 5), (1, 5), (2, 0)), ((5, 7), (2, 3), (1, 1)),
                                                        ((3, 4), (1, 1), (10, 10))])
def test_local_2d_equals_full_attention_under_the_2d_mask(grid, block, memory):
    pattern = Local2dPattern(grid=grid, query_block=block, memory=memory)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, grid[0] * grid[1], 8, requires_grad=True) for _ in range(3))
    mask = pattern.dense()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = local_2d_attention(q, k, v, pattern)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    for mine, theirs in zip(torch.autograd.grad((out * grad).sum(), (q, k, v)),
                            torch.autograd.grad((expected * grad).sum(), (q, k, v))):
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


@pytest.mark.parametrize(("fields", "message"), [
    ({"grid": (4, 4), "query_block": (5, 1), "memory": (0, 0)}, "query_block \\(5, 1\\) is larger than the grid"),
    ({"grid": (4, 4), "query_block": (0, 1), "memory": (0, 0)}, "query_block must be two positive integers"),
    ({"grid": (4, 4), "query_block": (2, 2), "memory": (-1, 0)}, "memory must be two non-negative integers"),
    ({"grid": (4, 4), "query_block": 2, "memory": (1, 1)}, "query_block must be two positive integers"),
    ({"grid": (4, 4), "query_block": (2, 2), "memory": (1.5, 0)}, "memory must be two non-negative integers"),
])
def test_bad_local_2d_patterns_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Local2dPattern(**fields)


def test_images_of_the_wrong_shape_name_the_expected_shape():
    embed = PatchEmbedding((8, 8), channels=1, patch=2, d_model=16)
    assert embed(torch.rand(3, 1, 8, 8)).shape == (3, 16, 16)
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 1, 8, 8\), got \(3, 3, 8, 8\)"):
        embed(torch.rand(3, 3, 8, 8))
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 1, 8, 8\), got \(3, 8, 8\)"):
        embed(torch.rand(3, 8, 8))
    with pytest.raises(ValueError, match="expected float images"):
        embed(torch.zeros(3, 1, 8, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 16, height, width\)"):
        SelfAttention2d(16)(torch.rand(2, 8, 4, 4))
    with pytest.raises(ValueError, match="patch=3 does not divide the image size"):
        PatchEmbedding((8, 8), channels=1, patch=3, d_model=16)
    with pytest.raises(ValueError, match="reduction=8 must be a positive divisor of channels=12"):
        SelfAttention2d(12)


def test_2d_sinusoids_are_the_transformers_per_axis():
    d, half = 16, 8
    table = sinusoid_2d((3, 4), d).view(3, 4, d)
    i = torch.arange(half // 2, dtype=torch.float32)
    for row, col in [(0, 0), (2, 3), (1, 2)]:
        for value, part in ((row, table[row, col, :half]), (col, table[row, col, half:])):
            angle = value / 10000 ** (2 * i / half)  # PE(pos, 2i) = sin(pos / 10000^(2i / d_axis))
            torch.testing.assert_close(part, torch.cat([angle.sin(), angle.cos()]))


def test_2d_positions_encode_row_and_column_separately():
    table = sinusoid_2d((3, 4), 16).view(3, 4, 16)
    assert torch.equal(table[1, 0, :8], table[1, 3, :8]), "the first half depends on the row only"
    assert torch.equal(table[0, 2, 8:], table[2, 2, 8:]), "the second half on the column only"
    assert not torch.equal(table[0, 0], table[1, 1])
    x = torch.zeros(2, 12, 16)
    assert torch.equal(Sinusoidal2d((3, 4), 16)(x)[0], table.view(12, 16))
    learned = Learned2d((3, 4), 16)(x)[0].view(3, 4, 16)
    assert torch.equal(learned[1, 0, :8], learned[1, 2, :8]) and torch.equal(learned[0, 1, 8:], learned[2, 1, 8:])
    assert sum(p.numel() for p in Learned2d((3, 4), 16).parameters()) == (3 + 4) * 8
    for module in (Sinusoidal2d((3, 4), 16), Learned2d((3, 4), 16)):
        with pytest.raises(ValueError, match=r"expected a 3x4 grid of tokens, \(batch, 12, 16\); got \(1, 6, 16\)"):
            module(torch.zeros(1, 6, 16))


def test_sagan_weights_in_half_precision_do_not_overflow():
    block = SelfAttention2d(64).half()
    with torch.no_grad():
        block.gamma.fill_(1.0)
    x = torch.randn(1, 64, 4, 4).half() * 150
    out, weights = block(x, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()


def test_a_sagan_block_saved_with_a_scalar_gamma_still_loads(tmp_path):
    import safetensors.torch

    block = SelfAttention2d(16)
    old = {k: v for k, v in block.state_dict().items()}
    old["gamma"] = torch.tensor(0.25)  # the 0-d layout of earlier checkpoints
    safetensors.torch.save_file(old, str(tmp_path / "old.safetensors"))
    safetensors.torch.load_model(block, str(tmp_path / "old.safetensors"))
    assert block.gamma.shape == (1,) and block.gamma.item() == 0.25


def test_local_2d_is_a_sparse_pattern_the_kernel_chooser_computes():
    import warnings

    from transformer_zoo.core.local_attention import DENSE_UP_TO, PatternKernel, flex_attention_kernel
    from transformer_zoo.core.masks import AttentionMask

    pattern = Local2dPattern(grid=(5, 7), query_block=(2, 3), memory=(1, 1))
    q, k, v = (torch.randn(2, 3, 35, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=pattern.dense())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(flex_attention_kernel(q, k, v, pattern, compiled=False), expected, atol=1e-5,
                                   rtol=1e-5)
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
