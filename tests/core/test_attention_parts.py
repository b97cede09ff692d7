"""The attention parts of today's decoder-only LMs, each against its equation written out here:
QK-norm over each head (Qwen 3) or over the projection (OLMo 2), soft-capped scores (Gemma 2),
heads wider or narrower than d_model / n_heads (Gemma 2, Qwen 3), and layers without positions
(NoPE); and the kinds that cannot take a part refuse it at validation, in one message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.plugins.components import RMSNormOptions
from transformer_zoo.registry.manager import get_registry

D, H, KV = 32, 4, 2


def attention(kind="sdpa", d_head=None, **options):
    torch.manual_seed(0)
    built = get_registry().component("attention", kind)(kind=kind, **options)
    module = built.build(LayerSpec(d_model=D, n_heads=H, norm=RMSNormOptions(eps=1e-6), head_dim=d_head)).eval()
    with torch.no_grad():  # QK-norm weights away from 1, so that they matter
        for norm in (module.q_norm, module.k_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return module


def written_out(module, x, *, over=None, softcap=None, causal=True, window=None):
    """Grouped-query attention from ``module``'s weights, by the equations: projections, QK-norm
    (RMS over the head's channels or the whole projection, times its weight), scores over
    sqrt(d_head), soft-capping, the causal (and window) mask, softmax, output projection."""
    dh, kv = module.d_head, module.n_kv_heads
    w, b = module.in_proj.weight, module.in_proj.bias
    q, k, v = F.linear(x, w, b).split([H * dh, kv * dh, kv * dh], dim=-1)

    def rms(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    if over == "projection":
        q, k = rms(q, module.q_norm.weight), rms(k, module.k_norm.weight)
    q, k, v = (t.unflatten(-1, (-1, dh)).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, dh)
    if over == "head":
        q, k = rms(q, module.q_norm.weight), rms(k, module.k_norm.weight)
    k, v = (t.repeat_interleave(H // kv, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    t = x.size(1)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) if causal else torch.ones(t, t, dtype=torch.bool)
    if window is not None:
        allowed = allowed & (i - j <= window)
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return module.out_proj(out.transpose(1, 2).flatten(-2))


@pytest.mark.parametrize("over", ["head", "projection"])
@pytest.mark.parametrize("d_head", [None, 16])
def test_qk_norm_equals_its_equation(over, d_head):
    module = attention(qk_norm=over, n_kv_heads=KV, d_head=d_head)
    dh = d_head or D // H
    widths = (dh, dh) if over == "head" else (H * dh, KV * dh)
    assert (module.q_norm.weight.numel(), module.k_norm.weight.numel()) == widths
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        out, _ = module(x, mask=AttentionMask(causal=True))
    torch.testing.assert_close(out, written_out(module, x, over=over), atol=1e-5, rtol=1e-5)
    plain = attention(n_kv_heads=KV, d_head=d_head)
    plain.load_state_dict({k: v for k, v in module.state_dict().items() if "norm" not in k})
    assert not torch.allclose(plain(x, mask=AttentionMask(causal=True))[0], out, atol=1e-3), "the norm matters"


@pytest.mark.parametrize("kind", ["sdpa", "math", "sliding-window"])
def test_soft_capped_scores_equal_their_equation(kind):
    window = {"window": 3} if kind == "sliding-window" else {}
    module = attention(kind, softcap=2.0, **window)
    x = torch.randn(2, 9, D) * 4  # scores well past the cap
    with torch.no_grad():
        out, weights = module(x, mask=AttentionMask(causal=True), need_weights=True)
        fast, _ = module(x, mask=AttentionMask(causal=True))
    expected = written_out(module, x, softcap=2.0, window=window.get("window"))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    uncapped = written_out(module, x, window=window.get("window"))
    assert not torch.allclose(uncapped, expected, atol=1e-3), "the cap matters at these scores"


def test_heads_of_their_own_width_change_the_projections_only():
    module = attention(d_head=24, n_kv_heads=KV)
    assert module.in_proj.weight.shape == (H * 24 + 2 * KV * 24, D) and module.out_proj.weight.shape == (D, H * 24)
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(
            module(x, mask=AttentionMask(causal=True))[0], written_out(module, x), atol=1e-5, rtol=1e-5
        )


def lm(**overrides):
    config = dict(
        vocab_size=50,
        d_model=D,
        n_heads=H,
        d_ff=64,
        dropout=0.0,
        encoder=None,
        positional="rotary",
        norm_placement="pre",
    )
    return tz.build_model("transformer-tiny", **{**config, **overrides}).eval()


def test_a_layer_without_positions_ignores_them_and_the_others_keep_them():
    torch.manual_seed(0)
    model = lm(decoder={"layers": 2, "attention": ["sdpa", {"kind": "sdpa", "positions": False}]})
    assert model.decoder.layers[0].self_attn.positional is not None
    assert model.decoder.layers[1].self_attn.positional is None
    nope = model.decoder.layers[1].self_attn
    x = torch.randn(1, 6, D)
    with torch.no_grad():  # without positions, attention is the written-out formula, no rotation
        torch.testing.assert_close(
            nope(x, mask=AttentionMask(causal=True))[0], written_out(nope, x), atol=1e-5, rtol=1e-5
        )


def test_a_head_width_of_its_own_reaches_rotary_positions():
    model = lm(head_dim=16, decoder={"layers": 1})
    attn = model.decoder.layers[0].self_attn
    assert attn.d_head == 16 and attn.positional.d_head == 16
    assert model(torch.randint(3, 50, (2, 7))).logits.shape == (2, 7, 50)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"decoder": {"layers": 1, "attention": {"kind": "linear", "softcap": 5.0}}},
            "linear attention does not soft-cap",
        ),
        ({"decoder": {"layers": 1, "attention": {"kind": "talking-heads", "softcap": 5.0}}}, "does not soft-cap"),
        (
            {"head_dim": 8, "decoder": {"layers": 1, "attention": "linear"}, "positional": "sinusoidal"},
            "remove head_dim",
        ),
        (
            {"positional": "sinusoidal", "decoder": {"layers": 1, "attention": {"kind": "sdpa", "positions": False}}},
            "sinusoidal positions are added to the embeddings",
        ),
        ({"d_model": 30, "n_heads": 4}, "does not divide d_model"),
    ],
)
def test_a_part_a_kind_cannot_take_is_refused_in_one_message(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        lm(**overrides)
    assert len(str(error.value).splitlines()) <= 2


def test_qk_norm_and_soft_capping_reach_every_kind_that_takes_them():
    """Every registered kind either takes a part or refuses it at validation: none ignores it."""
    for kind, options in get_registry().components("attention").items():
        for part in ({"softcap": 30.0}, {"qk_norm": "head"}):
            try:
                built = options(kind=kind, **part)
            except ValueError:
                (name,) = part  # refused only where the kind declares it (takes_softcap, takes_qk_norm)
                assert not getattr(options, f"takes_{name}", True), kind
                continue
            module = built.build(LayerSpec(d_model=D, n_heads=H, norm=RMSNormOptions(), grid=(4, 4)))
            if "qk_norm" in part:
                assert module.q_norm is not None, kind
            else:
                assert getattr(module.kernel, "softcap", getattr(module.kernel, "cap", None)) == 30.0, kind
