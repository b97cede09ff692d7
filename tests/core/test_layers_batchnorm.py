"""Token batch norm: statistics over real positions only, padding left out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.layers import TokenBatchNorm

D = 8


def _norm(momentum: float | None = 0.1) -> TokenBatchNorm:
    torch.manual_seed(0)
    norm = TokenBatchNorm(D, momentum=momentum)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    return norm


def _padded(real_rows: list[torch.Tensor], length: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of real tokens ``(n_i, D)`` padded to ``(B, length, D)`` with ``fill`` plus noise."""
    x = fill + torch.randn(len(real_rows), length, D)
    real = torch.zeros(len(real_rows), length, dtype=torch.bool)
    for i, row in enumerate(real_rows):
        x[i, : len(row)] = row
        real[i, : len(row)] = True
    return x, real


@pytest.mark.parametrize("momentum", [0.1, None])
def test_padding_changes_neither_the_outputs_nor_the_running_statistics(momentum):
    rows = [torch.randn(n, D) * 3 + 1 for n in (6, 4, 2)]
    x_a, real_a = _padded(rows, 6, fill=0.0)
    x_b, real_b = _padded(rows, 11, fill=50.0)
    norm_a, norm_b = _norm(momentum).train(), _norm(momentum).train()
    out_a, out_b = norm_a(x_a, real=real_a), norm_b(x_b, real=real_b)
    torch.testing.assert_close(out_a[real_a], out_b[real_b])
    assert torch.isfinite(out_b).all()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(norm_a, name), getattr(norm_b, name))
    reference = torch.cat(rows)  # the real tokens alone, unbiased variance for the running update
    momentum_used = 1.0 if momentum is None else momentum  # cumulative average after one batch
    torch.testing.assert_close(norm_b.running_mean, momentum_used * reference.mean(0))
    torch.testing.assert_close(norm_b.running_var, (1 - momentum_used) + momentum_used * reference.var(0))


@pytest.mark.parametrize("all_real", [False, True])
def test_without_padding_it_is_batchnorm1d_over_all_tokens(all_real):
    x = torch.randn(3, 5, D) * 2 - 1
    norm = _norm().train()
    reference = nn.BatchNorm1d(D)
    reference.load_state_dict(norm.state_dict())
    real = torch.ones(3, 5, dtype=torch.bool) if all_real else None
    torch.testing.assert_close(norm(x, real=real), reference.train()(x.reshape(-1, D)).reshape(3, 5, D))
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)


def test_eval_uses_the_running_statistics():
    norm = _norm()
    norm.running_mean.copy_(torch.linspace(-1, 1, D))
    norm.running_var.copy_(torch.linspace(0.5, 2, D))
    norm.eval()
    x, real = _padded([torch.randn(5, D), torch.randn(2, D)], 5, fill=7.0)
    expected = (x - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x, real=real), expected)
    torch.testing.assert_close(norm(x[1:, :2], real=real[1:, :2]), expected[1:, :2])  # no batch dependence
    torch.testing.assert_close(norm.running_mean, torch.linspace(-1, 1, D))


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_padded_tokens_do_not_change_a_training_models_logits(placement):
    config = tz.load_config(
        {"variant": "transformer-tiny", "norm": "batchnorm", "dropout": 0.0, "norm_placement": placement}
    )
    torch.manual_seed(0)
    model = tz.build_model(config).train()
    vocab = config.vocab_size
    src, tgt = torch.randint(1, vocab, (3, 7)), torch.randint(1, vocab, (3, 6))
    src_mask, tgt_mask = torch.ones_like(src), torch.ones_like(tgt)
    src_mask[0, 3:], src_mask[2, 5:] = 0, 0
    tgt_mask[1, 2:], tgt_mask[2, 4:] = 0, 0
    out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask).logits
    src_changed = src.masked_fill(src_mask == 0, 5)
    tgt_changed = tgt.masked_fill(tgt_mask == 0, 9)
    changed = model(src_changed, tgt_changed, src_mask=src_mask, tgt_mask=tgt_mask).logits
    real = tgt_mask.bool()
    torch.testing.assert_close(changed[real], out[real], atol=1e-5, rtol=1e-5)
