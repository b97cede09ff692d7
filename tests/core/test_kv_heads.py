"""Grouped-query and multi-query attention (``n_kv_heads``): against multi-head attention with each
key/value head repeated for its query heads, for every registered attention kind; parameters
and cache shrink by ``n_heads / n_kv_heads``; cached decoding equals uncached; bad values are
refused with the values that would do."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import DecodeStep, generate, greedy_decode
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.registry.manager import get_registry

D, H, DH = 32, 4, 8
SMALL = {"vocab_size": 60, "d_model": D, "n_heads": H, "d_ff": 64, "dropout": 0.0, "head": {"tie_weights": False}}
# Differential attention groups its key/value heads in pairs (K1, K2), as its reference code does, not one
# by one; tests/plugins/test_differential.py checks its grouping. Latent attention (mla) has no key/value
# heads (one latent for all heads) and refuses n_kv_heads.
KINDS = sorted(set(get_registry().components("attention")) - {"differential", "mla"})
GRID = (4, 4)


def build(kind: str, n_kv_heads: int | None) -> MultiHeadAttention:
    options = get_registry().component("attention", kind)(kind=kind, n_kv_heads=n_kv_heads)
    return options.build(LayerSpec(d_model=D, n_heads=H, grid=GRID)).eval()


def repeated_kv(module: MultiHeadAttention, reference: MultiHeadAttention) -> None:
    """Load ``module``'s weights into the multi-head ``reference``, each key and value head
    repeated for the query heads that read it (query head ``h`` reads key head ``h // group``)."""
    group = module.n_heads // module.n_kv_heads
    state = module.state_dict()
    for name in ("weight", "bias"):
        rows = state[f"in_proj.{name}"]
        q, k, v = rows.split([D, module.n_kv_heads * DH, module.n_kv_heads * DH])

        def repeat(part: torch.Tensor) -> torch.Tensor:
            return part.unflatten(0, (module.n_kv_heads, DH)).repeat_interleave(group, 0).flatten(0, 1)

        state[f"in_proj.{name}"] = torch.cat([q, repeat(k), repeat(v)])
    reference.load_state_dict(state)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_every_kind_equals_multi_head_attention_with_repeated_key_value_heads(kind, n_kv_heads):
    torch.manual_seed(0)
    grouped, reference = build(kind, n_kv_heads), build(kind, None)
    assert grouped.n_kv_heads == n_kv_heads and reference.n_kv_heads == H
    repeated_kv(grouped, reference)
    x = torch.randn(2, GRID[0] * GRID[1], D)
    padding = torch.ones(2, x.size(1), dtype=torch.bool)
    padding[1, 11:] = False
    takes_padding = kind != "local-2d"  # attention over a whole image grid takes no padding
    for mask in (AttentionMask(), AttentionMask(padding=padding)) if takes_padding else (AttentionMask(),):
        with torch.no_grad():
            out, _ = grouped(x, mask=mask)
            expected, _ = reference(x, mask=mask)
        torch.testing.assert_close(out[padding], expected[padding], atol=1e-5, rtol=1e-5)


def test_cross_attention_and_the_causal_mask_equal_the_repeated_reference():
    torch.manual_seed(0)
    grouped, reference = MultiHeadAttention(D, H, n_kv_heads=2).eval(), MultiHeadAttention(D, H).eval()
    repeated_kv(grouped, reference)
    x, memory = torch.randn(2, 5, D), torch.randn(2, 9, D)
    with torch.no_grad():
        torch.testing.assert_close(grouped(x, memory)[0], reference(x, memory)[0], atol=1e-5, rtol=1e-5)
        causal = AttentionMask(causal=True)
        out, weights = grouped(x, mask=causal, need_weights=True)
        expected, expected_weights = reference(x, mask=causal, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_n_kv_heads_equal_to_n_heads_is_multi_head_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).eval()
    same = MultiHeadAttention(D, H, n_kv_heads=H).eval()
    same.load_state_dict(mha.state_dict())  # the same layout: every name and shape
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        torch.testing.assert_close(
            same(x, mask=AttentionMask(causal=True))[0], mha(x, mask=AttentionMask(causal=True))[0], atol=0, rtol=0
        )


def test_key_value_parameters_shrink_by_the_group():
    for n_kv_heads in (4, 2, 1):
        attn = MultiHeadAttention(D, H, n_kv_heads=n_kv_heads)
        assert attn.in_proj.weight.shape == (D + 2 * D * n_kv_heads // H, D)
        assert attn.in_proj.bias.shape == (D + 2 * D * n_kv_heads // H,)


def gqa_model(n_kv_heads: int | None, positional: str = "sinusoidal", **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    attention = {"kind": "sdpa", "n_kv_heads": n_kv_heads}
    return tz.build_model(
        "transformer-tiny",
        **SMALL,
        positional=positional,
        encoder={"layers": 1, "attention": attention},
        decoder={"layers": 2, "attention": attention, "cross_attention": attention},
        **extra,
    ).eval()


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_the_cache_holds_only_the_key_value_heads(n_kv_heads):
    model = gqa_model(n_kv_heads)
    src = torch.randint(3, 60, (3, 7))
    cache = DecoderCache()
    step = DecodeStep(model, model.encode(src).hidden, None, cache)
    with torch.no_grad():
        step(torch.ones(3, 1, dtype=torch.long))
        step(torch.full((3, 1), 5, dtype=torch.long))
    for self_cache, cross_cache in cache.layers:
        assert self_cache.key.shape == (3, n_kv_heads, 2, DH) and self_cache.value.shape == (3, n_kv_heads, 2, DH)
        assert cross_cache.key.shape == (3, n_kv_heads, 7, DH)
    full = 2 * 2 * 3 * H * (2 + 7) * DH * 4  # layers x (keys, values) x batch x heads x positions x Dh x fp32
    assert cache.nbytes == full * n_kv_heads // H


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "alibi"])
@pytest.mark.parametrize("static", [False, True])
def test_cached_decoding_equals_uncached(positional, static):
    model = gqa_model(1, positional)
    src = torch.randint(3, 60, (3, 7))
    with torch.no_grad():
        cached = greedy_decode(model, src, bos_id=1, max_new_tokens=10, static_cache=static)
        uncached = greedy_decode(model, src, bos_id=1, max_new_tokens=10, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached[:, 1:].unique().numel() > 1  # the tokens vary, so a wrong cache would show


def test_decoder_only_generation_with_multi_query_attention_equals_uncached():
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        **SMALL,
        positional="rotary",
        encoder=None,
        decoder={"layers": 2, "attention": {"kind": "sdpa", "n_kv_heads": 1}},
    ).eval()
    prompt = torch.randint(3, 60, (2, 4))
    with torch.no_grad():
        cached = generate(model, prompt=prompt, max_new_tokens=8, do_sample=True, seed=3)
        uncached = generate(model, prompt=prompt, max_new_tokens=8, do_sample=True, seed=3, use_cache=False)
    assert torch.equal(cached, uncached)


def test_a_value_that_does_not_divide_n_heads_is_refused_with_the_divisors():
    with pytest.raises(
        ValueError,
        match=r"decoder.attention: n_kv_heads=3 does not divide n_heads=4; "
        r"choose n_kv_heads among \[1, 2, 4\]",
    ):
        tz.load_config({"variant": "transformer-tiny", "decoder": {"attention": {"kind": "sdpa", "n_kv_heads": 3}}})
    with pytest.raises(ValueError, match=r"decoder.cross_attention: n_kv_heads=3 does not divide"):
        tz.load_config({"variant": "transformer-tiny", "decoder": {"cross_attention": {"n_kv_heads": 3}}})
    with pytest.raises(ValueError, match=r"encoder.attention: n_kv_heads=8 does not divide n_heads=4"):
        tz.load_config({"variant": "vit-tiny", "encoder": {"attention": {"kind": "sdpa", "n_kv_heads": 8}}})
    with pytest.raises(ValueError, match="n_kv_heads=3 does not divide n_heads=4"):
        MultiHeadAttention(D, H, n_kv_heads=3)
