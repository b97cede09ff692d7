"""Image self-attention pieces: SAGAN's block, patches, 2-D positions. (Local 2-D attention's
pattern and kernel are the image plugin's: tests/plugins/test_image_kernels.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_zoo.plugins.image.blocks import Learned2d, PatchEmbedding, SelfAttention2d, Sinusoidal2d, sinusoid_2d


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
