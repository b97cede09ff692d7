"""The factor on the query-key dot products (``scale``): the paper's 1/sqrt(d_k) by default,
any other on request (Vaswani et al. 2017, section 3.2.1)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pytest
import torch
import yaml

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MathAttention, MultiHeadAttention, math_kernel, sdpa_kernel
from transformer_zoo.core.cache import KVCache
from transformer_zoo.core.options import AttentionOptions, LayerSpec

MASKS = {
    "none": AttentionMask(),
    "padding": AttentionMask(padding=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool()),
    "causal": AttentionMask(causal=True),
    "padding+causal": AttentionMask(padding=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool(), causal=True),
}


def _pair(
    scale: float | None, kernel=sdpa_kernel, d_model: int = 32, n_heads: int = 2
) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A module with the paper's scale and one with ``scale``, holding the same weights."""
    torch.manual_seed(0)
    paper = MultiHeadAttention(d_model, n_heads, kernel=kernel).eval()
    other = MultiHeadAttention(d_model, n_heads, kernel=kernel, scale=scale).eval()
    other.load_state_dict(paper.state_dict())
    return paper, other


def _reference(
    attn: MultiHeadAttention, x: torch.Tensor, mask: AttentionMask, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(scale * q k^T) v`` over the module's own projections, written out."""
    b, t, d = x.shape
    q, k, v = attn.in_proj(x).view(b, t, 3, attn.n_heads, attn.d_head).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh)
    scores = scale * torch.einsum("bhqd,bhkd->bhqk", q, k)
    allowed = mask.dense(t, t, x.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(-1)
    out = torch.einsum("bhqk,bhkd->bhqd", weights, v).transpose(1, 2).reshape(b, t, d)
    return attn.out_proj(out), weights


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask", list(MASKS))
def test_default_scale_is_the_kernel_call_unchanged(mask, need_weights):
    torch.manual_seed(1)
    attn = MultiHeadAttention(32, 2, scale=None).eval()
    x = torch.randn(2, 6, 32)
    q, k, v, bias = attn.project(x)
    out, weights = attn.kernel(q, k, v, MASKS[mask], bias, 0.0, need_weights)
    expected = attn.out_proj(out.transpose(1, 2).reshape(2, 6, 32))
    got, got_weights = attn(x, mask=MASKS[mask], need_weights=need_weights)
    assert torch.equal(got, expected), "scale=None must be bit-for-bit the paper's attention"
    if need_weights:
        assert torch.equal(got_weights, weights)


@pytest.mark.parametrize("kernel", [sdpa_kernel, math_kernel])
@pytest.mark.parametrize("mask", list(MASKS))
def test_unit_scale_is_softmax_of_raw_dot_products(kernel, mask):
    _, unscaled = _pair(1.0, kernel)
    x = torch.randn(2, 6, 32) * 3
    expected, expected_weights = _reference(unscaled, x, MASKS[mask], 1.0)
    torch.testing.assert_close(unscaled(x, mask=MASKS[mask])[0], expected, atol=1e-5, rtol=1e-4)
    out, weights = unscaled(x, mask=MASKS[mask], need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_unit_scale_sharpens_the_weights_at_a_large_head_dimension():
    paper, unscaled = _pair(1.0, d_model=256, n_heads=1)
    x = torch.randn(2, 8, 256)
    entropy = {
        name: float(-(w * w.clamp_min(1e-30).log()).sum(-1).mean())
        for name, w in (("paper", paper(x, need_weights=True)[1]), ("unscaled", unscaled(x, need_weights=True)[1]))
    }
    assert entropy["unscaled"] < entropy["paper"]


def test_the_papers_scale_given_explicitly_equals_the_default():
    for kernel in (sdpa_kernel, math_kernel):
        paper, explicit = _pair(1 / math.sqrt(16), kernel)  # d_head = 32 / 2
        x = torch.randn(2, 6, 32)
        for mask in MASKS.values():
            torch.testing.assert_close(explicit(x, mask=mask)[0], paper(x, mask=mask)[0], atol=1e-6, rtol=1e-5)


def test_scale_applies_to_cross_attention_and_incremental_decoding():
    _, unscaled = _pair(0.5)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    full = unscaled(x, memory)[0]
    cache = KVCache()
    steps = torch.cat([unscaled(x[:, i : i + 1], memory, cache=cache)[0] for i in range(5)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-6, rtol=1e-5)
    causal = unscaled(x, mask=AttentionMask(causal=True))[0]
    cache = KVCache()
    steps = torch.cat([unscaled(x[:, i : i + 1], cache=cache, mask=AttentionMask(causal=True))[0] for i in range(5)], 1)
    torch.testing.assert_close(steps, causal, atol=1e-6, rtol=1e-5)


def test_scale_adds_no_state_and_is_shown():
    paper, unscaled = _pair(1.0)
    assert paper.state_dict().keys() == unscaled.state_dict().keys()
    assert "scale=1" in repr(unscaled) and "scale" not in repr(paper)
    assert "scale=1" in repr(MathAttention(32, 2, scale=1.0))
    with pytest.raises(ValueError, match="scale must be positive"):
        MultiHeadAttention(32, 2, scale=0.0)


def test_a_model_config_sets_scale_per_stack():
    config = yaml.safe_load("""
        variant: transformer-tiny
        dropout: 0.0
        encoder: {attention: {kind: sdpa, scale: 1.0}}
        decoder: {attention: {kind: sdpa, scale: 1.0}, cross_attention: {kind: sdpa, scale: 1.0}}
    """)
    torch.manual_seed(0)
    unscaled = tz.build_model(config).eval()
    paper = tz.build_model({"variant": "transformer-tiny", "dropout": 0.0}).eval()
    assert unscaled.state_dict().keys() == paper.state_dict().keys()
    paper.load_state_dict(unscaled.state_dict())
    blocks = [m for m in unscaled.modules() if isinstance(m, MultiHeadAttention)]
    assert len(blocks) == 6 and all(m.scale == 1.0 for m in blocks)
    assert all(m.scale is None for m in paper.modules() if isinstance(m, MultiHeadAttention))
    src, tgt = torch.randint(3, 1000, (2, 7)), torch.randint(3, 1000, (2, 5))
    assert not torch.allclose(unscaled(src, tgt).logits, paper(src, tgt).logits)
    assert unscaled.config.encoder.attention.scale == 1.0
    assert tz.load_config(unscaled.config.model_dump(mode="json")).decoder.cross_attention.scale == 1.0


def test_what_a_kind_takes_is_declared_in_its_class_body_not_inferred():
    math = tz.build_model("transformer-tiny", encoder={"attention": {"kind": "math", "scale": 1.0}})
    assert all(m.scale == 1.0 for m in math.encoder.modules() if isinstance(m, MathAttention))

    class Own(AttentionOptions):  # its own module applies no scale, and it says so
        kind: Literal["own-module"] = "own-module"
        takes_scale: ClassVar[bool] = False

        def build(self, layer: LayerSpec) -> torch.nn.Module:
            return MathAttention(layer.d_model, layer.n_heads)

    class Taking(AttentionOptions):  # overriding build changes nothing it declares: the default holds
        kind: Literal["taking"] = "taking"

        def build(self, layer: LayerSpec) -> torch.nn.Module:
            return MathAttention(layer.d_model, layer.n_heads, scale=self.scale)

    class Inherits(Taking):
        kind: Literal["inherits"] = "inherits"

    assert AttentionOptions.takes_scale and not Own.takes_scale and Taking.takes_scale and Inherits.takes_scale
    assert "scale" in Own.model_fields, "a kind keeps the inherited field and refuses the values it cannot take"
    with pytest.raises(ValueError, match="own-module attention does not apply scale"):
        Own(scale=2.0)
    assert Own().scale is None
    module = Inherits(scale=2.0).build(LayerSpec(d_model=32, n_heads=2))
    assert module.scale == 2.0
