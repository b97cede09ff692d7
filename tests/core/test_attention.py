"""Multi-head attention: the formula, the masks, the cache and the weights."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MathAttention, MultiHeadAttention, attention_math
from transformer_zoo.core.cache import KVCache


def test_attention_math_is_the_papers_formula():
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 4)
    out, weights = attention_math(q, k, v)
    expected_weights = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, torch.einsum("bhqk,bhkd->bhqd", expected_weights, v))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)


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
    from benchmarks.common import sdpa_kernels

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
    assert seen == {
        "q": (2, 4, 6, 4),
        "k": (2, 4, 6, 4),
        "mask": mask,
        "bias": None,
        "dropout_p": 0.0,
        "need_weights": False,
    }


def test_a_kernel_with_parameters_is_a_submodule_of_the_attention():
    from transformer_zoo.core.attention import sdpa_kernel

    class Gated(torch.nn.Module):  # a learned gate per head on the output of the softmax attention
        def __init__(self, n_heads):
            super().__init__()
            self.gate = torch.nn.Parameter(torch.full((n_heads, 1, 1), 0.5))

        def forward(self, q, k, v, mask, bias, dropout_p, need_weights):
            out, weights = sdpa_kernel(q, k, v, mask, bias, dropout_p, need_weights)
            return out * self.gate, weights

    attn = MultiHeadAttention(16, 4, kernel=Gated(4))
    assert attn.kernel.gate is dict(attn.named_parameters())["kernel.gate"]
    assert "kernel.gate" in attn.state_dict() and "Gated" in repr(attn)
    attn.to(torch.float64)
    assert attn.kernel.gate.dtype == torch.float64
    out, _ = attn(torch.randn(2, 5, 16, dtype=torch.float64))
    out.sum().backward()
    assert attn.kernel.gate.grad is not None


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


def test_the_projection_layout_is_one_fused_in_proj_q_k_v_with_heads_in_order():
    """``in_proj`` rows: W_Q, then W_K, then W_V, each split into heads in order; ``out_proj``
    reads the heads concatenated in that order (``torch.nn.MultiheadAttention``'s layout)."""
    torch.manual_seed(0)
    d_model, n_heads = 12, 3
    d_head = d_model // n_heads
    attn = MultiHeadAttention(d_model, n_heads).eval()
    x, memory = torch.randn(2, 5, d_model), torch.randn(2, 7, d_model)
    w, b = attn.in_proj.weight, attn.in_proj.bias
    w_q, w_k, w_v = w[:d_model], w[d_model : 2 * d_model], w[2 * d_model :]
    b_q, b_k, b_v = b[:d_model], b[d_model : 2 * d_model], b[2 * d_model :]
    for source in (x, memory):  # self-attention, then cross-attention
        heads = []
        for h in range(n_heads):
            rows = slice(h * d_head, (h + 1) * d_head)
            q = x @ w_q[rows].T + b_q[rows]  # (B, Tq, Dh)
            k = source @ w_k[rows].T + b_k[rows]
            v = source @ w_v[rows].T + b_v[rows]
            weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d_head), dim=-1)
            heads.append(weights @ v)
        expected = torch.cat(heads, dim=-1) @ attn.out_proj.weight.T + attn.out_proj.bias
        got = attn(x) if source is x else attn(x, source)
        torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
    q, k, v, _ = attn.project(x)
    torch.testing.assert_close(q[:, 1], x @ w_q[d_head : 2 * d_head].T + b_q[d_head : 2 * d_head])
    torch.testing.assert_close(v[:, 2], x @ w_v[2 * d_head :].T + b_v[2 * d_head :])
