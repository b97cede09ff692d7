"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1): the same outputs as
transformers' DeepseekV3Attention on copied weights, with and without a query latent, with either
rotary layout; cached decoding (dynamic, static, left-padded) equal to decoding without a cache;
a cache that holds the latent and the rotary key only; and what it cannot take refused at
validation, in one message."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.cache import DecoderCache, KVCache, StaticDecoderCache, WindowKVCache
from transformer_zoo.core.decoding import DecodeStep, greedy_decode
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.core.relative import RotaryPositional
from transformer_zoo.plugins.latent_attention import LatentAttention, LatentAttentionOptions

D, H = 64, 4
NOPE, ROPE, V, KV_RANK, Q_RANK = 16, 8, 12, 32, 24
TOLERANCE = dict(atol=1e-5, rtol=0.0)

MLA = {"kind": "mla", "bias": False, "kv_rank": 24, "nope_head_dim": 8, "v_head_dim": 16}
"""llama-tiny's attention replaced by MLA: with ``head_dim=8`` the rotary turns 8 channels, so the
queries and keys are 8 + 8 wide, the values 16, and the cache holds 24 + 8 numbers per token."""
CASES = {
    "rotary": {"head_dim": 8},
    "sinusoidal": {"positional": "sinusoidal"},  # no rotary part: the latent alone (rope width 0)
    "query-latent-gate-sinks-softcap": {
        "head_dim": 8,
        "attention": {**MLA, "q_rank": 16, "gate": True, "sinks": True, "softcap": 5.0, "scale": 0.2},
    },
}
"""Models that decode: the options every kind of MultiHeadAttention shares reach latent attention too."""


def mla_model(case: str = "rotary") -> torch.nn.Module:
    torch.manual_seed(0)
    overrides = dict(CASES[case])
    decoder = {"layers": 2, "attention": overrides.pop("attention", MLA)}
    return tz.build_model("llama-tiny", decoder=decoder, **overrides).eval()


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 1000, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---- against transformers --------------------------------------------------------------------
def deepseek_attention(q_rank: int | None, interleave: bool, bias: bool):
    """transformers' DeepseekV3Attention with every parameter drawn, its rotary embedding (at the
    rope width, as DeepseekV3Config builds it), and the config."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    config = transformers.DeepseekV3Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=q_rank,
        kv_lora_rank=KV_RANK,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
        rope_interleave=interleave,
        attention_bias=bias,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        num_hidden_layers=1,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attention = deepseek.DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            normed = "layernorm" in name
            parameter.normal_(1.0 if normed else 0.0, 0.3 if normed else 0.1)
    return attention, deepseek.DeepseekV3RotaryEmbedding(config)


def ours_of(theirs, q_rank: int | None, interleave: bool, bias: bool) -> LatentAttention:
    """Ours with their weights: every name the same but ``o_proj``, which is ``out_proj`` here."""
    # transformers' rope_interleave pairs channels (2i, 2i + 1), as our interleaved layout does (it
    # returns them de-interleaved, a permutation of the queries' and keys' channels alike, which
    # changes no score); without it, rotate_half pairs i and i + r/2, our halves layout.
    rotary = RotaryPositional(ROPE, 64, base=100.0, layout="interleaved" if interleave else "halves")
    ours = LatentAttention(
        D, H, kv_rank=KV_RANK, q_rank=q_rank, nope_head_dim=NOPE, v_head_dim=V, positional=rotary, bias=bias
    ).eval()
    state = {name.replace("o_proj.", "out_proj."): tensor for name, tensor in theirs.state_dict().items()}
    ours.load_state_dict(state, strict=True)  # one to one: no parameter left out on either side
    return ours


@pytest.mark.parametrize(
    ("q_rank", "interleave", "bias"),
    [(None, True, False), (None, False, False), (Q_RANK, True, False), (Q_RANK, False, True)],
    ids=["q_proj-interleaved", "q_proj-halves", "q_latent-interleaved", "q_latent-halves-bias"],
)
def test_equals_transformers_deepseek_v3_attention_on_copied_weights(q_rank, interleave, bias):
    theirs, rotary = deepseek_attention(q_rank, interleave, bias)
    ours = ours_of(theirs, q_rank, interleave, bias)
    x = torch.randn(2, 10, D, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(10)[None].expand(2, -1)
    real = torch.ones(2, 10, dtype=torch.bool)
    real[1, 7:] = False  # the second row's last three tokens are padding
    allowed = torch.ones(10, 10, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]
    additive = torch.zeros(2, 1, 10, 10).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=rotary(x, positions), attention_mask=additive)
        got, _ = ours(x, mask=AttentionMask(padding=real, causal=True))
    torch.testing.assert_close(got[real], expected[real], **TOLERANCE)


def test_the_options_build_the_widths_of_the_layer_and_the_rotary():
    """The rope width is what the rotary turns; the other widths default to the head width
    (kv_rank to four times it), the paper's proportions."""
    rotary = RotaryPositional(16, 64, fraction=0.5)
    spec = LayerSpec(d_model=D, n_heads=H, in_attention=rotary)
    built = LatentAttentionOptions().build(spec)
    assert (built.nope_head_dim, built.rope_head_dim, built.v_head_dim, built.kv_rank) == (16, 8, 16, 64)
    assert built.q_proj.out_features == H * (16 + 8) and built.out_proj.in_features == H * 16
    assert built.kv_a_proj_with_mqa.out_features == 64 + 8 and built.kv_b_proj.out_features == H * (16 + 16)
    assert not hasattr(built, "in_proj")


# ---- decoding -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_logits_equal_the_full_forward_on_the_dynamic_and_static_caches(case):
    model = mla_model(case)
    ids = random_ids(2, 9)
    with torch.no_grad():
        full = model(ids).logits
        for cache in (DecoderCache(), StaticDecoderCache(12, "cpu")):
            step = DecodeStep(model, None, None, cache)
            logits = [step(ids[:, :3])] + [step(ids[:, t : t + 1]) for t in range(3, 9)]
            torch.testing.assert_close(torch.cat(logits, dim=1), full[:, 2:], **TOLERANCE)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_greedy_tokens_equal_uncached(case):
    model = mla_model(case)
    prompt = random_ids(3, 5)
    uncached = greedy_decode(model, prompt=prompt, max_new_tokens=16, use_cache=False)
    assert len(set(uncached[:, 5:].flatten().tolist())) > 5, "the tokens vary, so a wrong cache would show"
    for static in (False, True):
        assert torch.equal(greedy_decode(model, prompt=prompt, max_new_tokens=16, static_cache=static), uncached)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_a_left_padded_batch_generates_each_prompt_as_it_would_alone(use_cache):
    model = mla_model()
    prompts = [random_ids(1, n, seed=10 + i) for i, n in enumerate((7, 4, 2))]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, 7 - prompt.size(1) :], mask[row, 7 - prompt.size(1) :] = prompt[0], 1
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=8, use_cache=use_cache)
    for row, prompt in zip(batch, prompts):
        alone = model.generate(prompt, max_new_tokens=8)
        assert torch.equal(row[7:], alone[0, prompt.size(1) :])
    assert len(set(batch[:, 7:].flatten().tolist())) > 5


def test_a_left_padded_rows_rotary_part_turns_from_its_first_real_token():
    """Row 0 has 3 padding tokens: its queries and keys turn from position 0 at its fourth token,
    in the prompt and in the next step, as that row's tokens alone turn."""
    attention = mla_model().decoder.layers[0].self_attn
    x, step = torch.randn(2, 6, D), torch.randn(2, 1, D)
    padded, alone = KVCache(left_padding=torch.tensor([3, 0])), KVCache()
    with torch.no_grad():
        for tokens, real in ((x, x[:1, 3:]), (step, step[:1])):
            q, k, _, _ = attention.project(tokens, cache=padded)
            q_alone, k_alone, _, _ = attention.project(real, cache=alone)
            torch.testing.assert_close(q[:1, :, -real.size(1) :], q_alone, atol=1e-6, rtol=0.0)
            torch.testing.assert_close(k[:1, :, 3:], k_alone, atol=1e-6, rtol=0.0)


def test_a_window_cache_keeps_the_last_latents_as_it_keeps_keys():
    attention = mla_model().decoder.layers[0].self_attn
    x = torch.randn(2, 6, D)
    cache = WindowKVCache(3)
    with torch.no_grad():
        attention(x[:, :4], mask=AttentionMask(causal=True), cache=cache)
        attention(x[:, 4:5], cache=cache)
        latent, k_rope = attention.latents(x[:, :5])
    assert cache.key.shape == (2, 1, 3, 24) and cache.value.shape == (2, 1, 3, 8)
    torch.testing.assert_close(cache.key, latent[:, :, 2:], **TOLERANCE)
    torch.testing.assert_close(cache.value, k_rope[:, :, 2:], **TOLERANCE)


# ---- the cache holds the latent ----------------------------------------------------------------
def test_the_cache_holds_the_latent_and_the_rotary_key_only():
    model = mla_model()
    batch, tokens, layers = 3, 11, 2
    cache = DecoderCache()
    step = DecodeStep(model, None, None, cache)
    with torch.no_grad():
        step(random_ids(batch, 4))
        for _ in range(tokens - 4):
            step(torch.ones(batch, 1, dtype=torch.long))
    assert cache.nbytes == batch * tokens * layers * (24 + 8) * 4  # (kv_rank + rope) float32 numbers
    grouped = batch * tokens * layers * 2 * 2 * 16 * 4  # llama-tiny's: 2 key/value heads of 16, keys and values
    assert cache.nbytes == grouped // 2
    latent, k_rope = cache.layer(0)[0].key, cache.layer(0)[0].value
    assert latent.shape == (batch, 1, tokens, 24) and k_rope.shape == (batch, 1, tokens, 8)


# ---- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"positional": "alibi", "decoder": {"layers": 1, "attention": MLA}},
            "takes no alibi positions; use positional: rotary, or positions added to the embeddings",
        ),
        (
            {"decoder": {"layers": 1, "attention": {**MLA, "n_kv_heads": 2}}},
            "n_kv_heads does not apply; remove n_kv_heads",
        ),
        (
            {"decoder": {"layers": 1, "attention": {**MLA, "qk_norm": "head"}}},
            "normalises its latents .* remove qk_norm, or use kind: sdpa",
        ),
    ],
    ids=["alibi", "n_kv_heads", "qk_norm"],
)
def test_what_it_cannot_take_is_refused_at_validation_in_one_message(overrides, message):
    with pytest.raises(tz.ConfigError, match=message) as refused:
        tz.load_config("llama-tiny", overrides)
    assert "decoder.attention" in str(refused.value) and len(str(refused.value).splitlines()) <= 2


def test_cross_attention_is_refused_and_the_module_says_so_too():
    with pytest.raises(tz.ConfigError, match="mla attention is for self-attention .* keep cross_attention: sdpa"):
        tz.load_config("transformer-tiny", {"decoder": {"cross_attention": {"kind": "mla"}}})
    attention = LatentAttentionOptions().build(LayerSpec(d_model=D, n_heads=H))
    with pytest.raises(ValueError, match="is for self-attention"):
        attention(torch.randn(1, 3, D), torch.randn(1, 4, D))


def test_what_it_takes_reaches_its_module():
    attention = mla_model("query-latent-gate-sinks-softcap").decoder.layers[0].self_attn
    assert attention.kernel.cap == 5.0 and attention.scale == 0.2 and attention.q_rank == 16
    assert attention.gate_proj.out_features == H * 16, "the gate is as wide as the values"
    assert attention.sinks.shape == (H,)
    config = tz.load_config("llama-tiny", {"decoder": {"layers": 2, "attention": [MLA, {**MLA, "positions": False}]}})
    assert config.build().decoder.layers[1].self_attn.rope_head_dim == 0


def test_value_residual_is_refused_since_the_cache_holds_latents():
    with pytest.raises(tz.ConfigError, match="mla attention does not; remove value_residual"):
        tz.load_config("llama-tiny", {"decoder": {"layers": 2, "value_residual": True, "attention": MLA}})
