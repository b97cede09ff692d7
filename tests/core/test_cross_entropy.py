"""The chunked cross-entropy of bf16 training equals ``F.cross_entropy``: loss and gradient, with
ignored targets and label smoothing, in float32 to 1e-5 and in bfloat16 within its rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import transformer_zoo.core.heads as heads
from transformer_zoo.core.heads import chunked_cross_entropy, token_loss

BF16_GRADIENT = 8e-3
"""Largest gap allowed between a bf16 gradient and float32's: two roundings of a value below 1
to bfloat16's 8 significant bits (2^-8 each)."""


def _case(dtype: torch.dtype, rows: int = 300, vocab: int = 97):
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(rows, vocab, generator=generator)).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    targets[::7] = -100
    return logits, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunked_cross_entropy_equals_torch(dtype, smoothing, monkeypatch):
    monkeypatch.setattr(heads, "CHUNK_ELEMENTS", 97 * 64)  # five chunks, the last one short
    logits, targets = _case(dtype)
    loss = chunked_cross_entropy(logits, targets, -100, smoothing)
    (grad,) = torch.autograd.grad(1.7 * loss, logits)
    reference_logits = logits.detach().float().requires_grad_()
    expected = F.cross_entropy(reference_logits, targets, ignore_index=-100, label_smoothing=smoothing, reduction="sum")
    (expected_grad,) = torch.autograd.grad(1.7 * expected, reference_logits)
    assert grad.dtype == dtype, "the gradient is written in the logits' dtype"
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)  # float32 arithmetic either way
    if dtype == torch.float32:
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)
    else:
        assert (grad.float() - expected_grad).abs().max() <= BF16_GRADIENT
    assert not grad[::7].any(), "an ignored target has no gradient"


def test_bf16_token_loss_takes_the_chunked_path_and_an_all_ignored_batch_is_zero(monkeypatch):
    calls = []
    monkeypatch.setattr(heads, "chunked_cross_entropy", lambda *args: calls.append(1) or heads._ChunkedCrossEntropy.apply(*args))
    logits, targets = _case(torch.bfloat16)
    torch.testing.assert_close(token_loss(logits.view(3, 100, 97), targets.view(3, 100), -100),
                               F.cross_entropy(logits.float(), targets, ignore_index=-100), rtol=1e-5, atol=1e-5)
    assert calls == [1]
    ignored = token_loss(logits, torch.full_like(targets, -100), -100)
    (grad,) = torch.autograd.grad(ignored, logits)
    assert ignored.item() == 0.0 and not grad.any()
