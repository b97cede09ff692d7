"""Multi-head attention: the formula, the masks, the cache and the weights."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import KVCache, MathAttention, MultiHeadAttention, attention_math
from transformer_zoo.core.masks import AttentionMask


def test_attention_math_is_the_papers_formula():
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 4)
    out, weights = attention_math(q, k, v)
    expected_weights = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, torch.einsum("bhqk,bhkd->bhqd", expected_weights, v))
    torch.testing.assert_close(
        out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_fused_path_equals_math_path(causal, padding):
    attn = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool() if padding else None
    mask = AttentionMask(padding=pad, causal=causal)
    fast, no_weights = attn(x, mask=mask)
    slow, weights = attn(x, mask=mask, need_weights=True)
    assert no_weights is None
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    if padding:
        assert weights[1, :, :, 4:].abs().max() == 0, "padding keys get no weight"
    if causal:
        assert weights.triu(1).abs().max() == 0, "no query attends to a later key"


@pytest.mark.parametrize("causal", [False, True])
def test_math_attention_equals_the_fused_path_and_makes_the_weights(causal, monkeypatch):
    fused = MultiHeadAttention(16, 4).eval()
    written = MathAttention(16, 4).eval()
    written.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, 16)
    mask = AttentionMask(padding=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool(), causal=causal)
    expected = fused(x, mask=mask)[0]

    def no_fused_kernel(*args, **kwargs):
        raise AssertionError("math attention called scaled_dot_product_attention")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_fused_kernel)
    out, weights = written(x, mask=mask)
    assert weights is None, "weights only when asked"
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert written(x, mask=mask, need_weights=True)[1].shape == (2, 4, 6, 6)


def test_dense_mask_is_end_aligned_for_a_cache():
    dense = AttentionMask(causal=True).dense(2, 5)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()
    assert torch.equal(dense, expected)


def test_incremental_self_attention_equals_full_causal():
    attn = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    full, _ = attn(x, mask=AttentionMask(causal=True))
    cache = KVCache()
    first, _ = attn(x[:, :3], mask=AttentionMask(causal=True), cache=cache)  # a prefix of 3
    steps = [first] + [attn(x[:, t : t + 1], mask=AttentionMask(causal=True), cache=cache)[0] for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=1e-5)
    assert len(cache) == 7


def test_cross_attention_cache_projects_memory_once():
    attn = MultiHeadAttention(16, 4).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    cache = KVCache()
    first, _ = attn(x, memory, cache=cache)
    stored = cache.key
    again, _ = attn(x, memory * 0, cache=cache)  # memory is read from the cache, not recomputed
    assert cache.key is stored
    torch.testing.assert_close(first, again)


def test_cache_reorder_selects_rows():
    cache = KVCache()
    cache.append(torch.arange(3.0).view(3, 1, 1, 1), torch.arange(3.0).view(3, 1, 1, 1))
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.key.flatten().tolist() == [2.0, 2.0, 0.0]


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(10, 3)


@pytest.mark.parametrize("dropout, train", [(0.1, False), (0.0, True)])
def test_the_fused_sdpa_kernel_runs_where_pytorch_has_one(dropout, train):
    """On CPU PyTorch fuses attention in inference, and in training without attention dropout
    (with dropout it, and torch.nn.Transformer, take the math path); the model must not force
    the unfused path itself, with its padding and causal masks."""
    from transformer_zoo.bench.common import sdpa_kernels

    model = tz.build_model("transformer-tiny", dropout=dropout).train(train)
    src, tgt = torch.randint(3, 100, (2, 12)), torch.randint(3, 100, (2, 9))
    src_mask = torch.ones_like(src)
    src_mask[0, 8:] = 0

    def run():
        with torch.set_grad_enabled(train):
            out = model(src, tgt, src_mask=src_mask).logits
            if train:
                out.sum().backward()

    kernels = sdpa_kernels(run)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels, kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels, kernels
    if train:
        assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in kernels


def test_a_kind_is_a_kernel_called_on_heads_with_the_mask_and_bias():
    from transformer_zoo.core.attention import sdpa_kernel

    seen = {}

    def recording_kernel(q, k, v, mask, bias, dropout_p, need_weights):
        seen.update(q=q.shape, k=k.shape, mask=mask, bias=bias, dropout_p=dropout_p, need_weights=need_weights)
        return sdpa_kernel(q, k, v, mask, bias, dropout_p, need_weights)

    plain = MultiHeadAttention(16, 4).eval()
    custom = MultiHeadAttention(16, 4, kernel=recording_kernel).eval()
    custom.load_state_dict(plain.state_dict())
    x, mask = torch.randn(2, 6, 16), AttentionMask(causal=True)
    torch.testing.assert_close(custom(x, mask=mask)[0], plain(x, mask=mask)[0])
    assert seen == {"q": (2, 4, 6, 4), "k": (2, 4, 6, 4), "mask": mask, "bias": None, "dropout_p": 0.0,
                    "need_weights": False}
    with pytest.raises(ValueError, match="not a module"):
        MultiHeadAttention(16, 4, kernel=torch.nn.Identity())


def test_the_kernel_inputs_hook_changes_what_the_kernel_receives():
    class Uniform(MultiHeadAttention):
        def kernel_inputs(self, q, k, v, mask, bias, cache):
            return q * 0, k, v, mask, bias  # equal scores: each query averages the values it may see

    attn = Uniform(16, 4).eval()
    x = torch.randn(2, 5, 16)
    out, weights = attn(x, mask=AttentionMask(causal=True), need_weights=True)
    steps = torch.arange(1, 6, dtype=torch.float32)
    torch.testing.assert_close(weights[0, 0], torch.ones(5, 5).tril() / steps[:, None])
    v = attn.in_proj(x)[..., 32:]
    torch.testing.assert_close(out, attn.out_proj(v.cumsum(1) / steps[None, :, None]), atol=1e-6, rtol=1e-5)


def test_cache_reorder_selects_rows_of_a_kinds_own_state():
    cache = KVCache()
    cache.state["sums"] = torch.arange(3.0).view(3, 1)
    cache.reorder(torch.tensor([1, 1, 2]))
    assert cache.state["sums"].flatten().tolist() == [1.0, 1.0, 2.0] and len(cache) == 0
