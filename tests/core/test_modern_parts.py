"""Four parts of 2024-2026 Transformers, each against its equation written out here, on the
caches as without them, and refused where a kind or a stack cannot take it:

- ReLU^2 (So et al. 2021, "Primer"): ``relu(x)^2`` in the mlp, gated and moe feed-forwards;
- the gated attention output (Qiu et al. 2025): ``out_proj(O * sigmoid(x W_gate))``, for every
  attention kind, cross-attention reading the queries' input;
- attention sinks (Xiao et al. 2024, learned as in gpt-oss): a logit per head that joins every
  softmax as a key with no value, under padding, soft-capping, ALiBi, GQA and every cache;
- value residual learning (Zhou et al. 2024, ResFormer): each later layer attends over
  ``lambda_1 V_1 + lambda_2 V_n``, recomputed by hand from a 3-layer llama-tiny's weights.

Cached decoding (a prompt, then one token a call, on the dynamic, window and static caches)
equals the forward over the same tokens (float32, 1e-5), and a left-padded batch generates each
prompt as it would alone. transformers' parity for sinks and the gate is in
``test_modern_parts_hf.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, FirstValues, MultiHeadAttention
from transformer_zoo.core.cache import DecoderCache, KVCache, StaticDecoderCache, WindowKVCache
from transformer_zoo.core.decoding import make_cache, static_cache_problem
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.layers import ACTIVATIONS, SquaredReLU
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.core.relative import ALiBiPositional
from transformer_zoo.plugins.components import RMSNormOptions
from transformer_zoo.registry.manager import get_registry

TOLERANCE = dict(atol=1e-5, rtol=0.0)
LENGTH, PROMPT = 24, 5
D, H = 32, 4
NO_BIAS = {"kind": "sdpa", "bias": False, "n_kv_heads": 2}


def lm(name: str = "llama-tiny", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return tz.build_model(name, init_std=0.1, **overrides).eval()


def attending(attention: dict | list, layers: int = 2, **stack) -> dict:
    return {"decoder": {"layers": layers, "attention": attention, **stack}}


def attentions(model: torch.nn.Module) -> list[MultiHeadAttention]:
    return [layer.self_attn for layer in model.decoder.layers]


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 1000, (batch, length), generator=torch.Generator().manual_seed(seed))


def drawn(model: torch.nn.Module) -> torch.nn.Module:
    """The model with its sinks and value lambdas drawn away from their starts (0; 0.5 and 0.5),
    so that a wrong use of either shows."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rpartition(".")[2] == "sinks":
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            if name.rpartition(".")[2] == "value_lambdas":
                parameter.copy_(torch.rand(parameter.shape, generator=generator) * 1.5)
    return model


def module(kind: str = "sdpa", *, d_head=None, in_attention=None, **options) -> MultiHeadAttention:
    """One attention module of ``kind`` with ``options``, d 32, 4 heads."""
    torch.manual_seed(0)
    built = get_registry().component("attention", kind)(kind=kind, **options)
    layer = LayerSpec(
        d_model=D, n_heads=H, norm=RMSNormOptions(), grid=(4, 4), head_dim=d_head, in_attention=in_attention
    )
    return built.build(layer).eval()


# ---- cached against uncached -------------------------------------------------------------------
def incremental_logits(model: torch.nn.Module, ids: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
    """The first ``PROMPT`` tokens in one call, then one token a call, on ``cache``."""
    steps = [model.head(model.decode(ids[:, :PROMPT], cache=cache).hidden)]
    steps += [model.head(model.decode(ids[:, t : t + 1], cache=cache).hidden) for t in range(PROMPT, ids.size(1))]
    return torch.cat(steps, dim=1)


def assert_cached_equals_forward(model: torch.nn.Module, *, static: bool = True) -> None:
    ids = random_ids(2, LENGTH)
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(incremental_logits(model, ids, make_cache(model)), expected, **TOLERANCE)
        if static:
            assert static_cache_problem(model, LENGTH) is None
            cache = StaticDecoderCache(LENGTH, "cpu")
            torch.testing.assert_close(incremental_logits(model, ids, cache), expected, **TOLERANCE)


def gate_off(model: torch.nn.Module) -> None:
    for attention in attentions(model):
        attention.gate_proj = None


def sinks_off(model: torch.nn.Module) -> None:
    for attention in attentions(model):
        attention.sinks = None


def values_unmixed(model: torch.nn.Module) -> None:
    for attention in attentions(model):
        attention.first_values = attention.value_lambdas = None


def relu_back(model: torch.nn.Module) -> None:
    for layer in model.decoder.layers:
        layer.ffn.activation = torch.nn.ReLU()


PARTS = {  # llama-tiny with one part, and what switches the part off
    "relu2": ({"ffn": {"kind": "mlp", "activation": "relu2", "bias": False}}, relu_back),
    "gate": (attending({**NO_BIAS, "gate": True}), gate_off),
    "sinks": (attending({**NO_BIAS, "sinks": True}), sinks_off),
    "sinks-softcap": (attending({**NO_BIAS, "sinks": True, "softcap": 2.0}), sinks_off),
    "sinks-math": (attending({**NO_BIAS, "kind": "math", "sinks": True}), sinks_off),
    "value-residual": (attending(NO_BIAS, layers=3, value_residual=True), values_unmixed),
    "all": (
        {
            "ffn": {"kind": "gated", "activation": "relu2", "bias": False},
            **attending({**NO_BIAS, "gate": True, "sinks": True}, layers=3, value_residual=True),
        },
        lambda model: (gate_off(model), sinks_off(model), values_unmixed(model)),
    ),
}


@pytest.mark.parametrize("part", PARTS)
def test_each_part_decodes_on_the_dynamic_and_static_caches_as_the_forward(part):
    overrides, switch_off = PARTS[part]
    model = drawn(lm(**overrides))
    without = copy.deepcopy(model)
    switch_off(without)
    ids = random_ids(1, LENGTH, seed=1)
    with torch.no_grad():
        change = (model(ids).logits - without(ids).logits).abs().max()
    assert change > 1e-3, f"{part} changes nothing here, so the comparison below would not test it"
    assert_cached_equals_forward(model)


@pytest.mark.parametrize("part", ["gate", "value-residual"])
def test_a_part_decodes_on_a_window_cache_as_the_forward(part):
    """gemma2-tiny: layer 0 a sliding window (its cache keeps 15 keys), layer 1 global; 40 tokens."""
    config = tz.load_config("gemma2-tiny").decoder.model_dump()
    if part == "gate":
        config["attention"] = [{**kind, "gate": True} for kind in config["attention"]]
    else:
        config["value_residual"] = True
    model = drawn(lm("gemma2-tiny", decoder=config))
    cache = make_cache(model)
    ids = random_ids(2, 40)
    with torch.no_grad():
        torch.testing.assert_close(incremental_logits(model, ids, cache), model(ids).logits, **TOLERANCE)
    assert isinstance(cache.layers[0][0], WindowKVCache) and len(cache.layers[0][0]) == 15


def test_sinks_decode_on_a_window_cache_as_under_the_windows_mask():
    """A window cache keeps the last ``w`` keys; full attention with sinks decoding on it equals the
    forward under the sliding-window mask, whose explicit rows the cache cuts to the keys it returns."""
    attention = drawn(module("sdpa", sinks=True, n_kv_heads=2))
    window, steps = 4, 12
    x = torch.randn(2, steps, D)
    i, j = torch.arange(steps)[:, None], torch.arange(steps)[None, :]
    band = (j <= i) & (i - j <= window)
    with torch.no_grad():
        expected, _ = attention(x, mask=AttentionMask(explicit=band))
        cache = WindowKVCache(window)
        outputs = [attention(x[:, :3], mask=AttentionMask(explicit=band[:3, :3]), cache=cache)[0]]
        for t in range(3, steps):
            row = AttentionMask(explicit=band[t : t + 1, : t + 1])
            outputs.append(attention(x[:, t : t + 1], mask=row, cache=cache)[0])
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, **TOLERANCE)
    assert len(cache) == window


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(p.size(1) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - prompt.size(1) :], mask[row, longest - prompt.size(1) :] = prompt[0], 1
    return ids, mask


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_a_left_padded_batch_with_every_part_generates_each_prompt_as_alone(use_cache):
    overrides, _ = PARTS["all"]
    model = drawn(lm(**overrides))
    prompts = [random_ids(1, n, seed=10 + i) for i, n in enumerate((3, 11, 7, 1))]
    ids, mask = left_padded(prompts)
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=12, use_cache=use_cache)
    for row, prompt in zip(batch, prompts):
        alone = model.generate(prompt, max_new_tokens=12)
        assert torch.equal(row[ids.size(1) :], alone[0, prompt.size(1) :])
    assert len(set(batch[:, ids.size(1) :].flatten().tolist())) > 5, "the tokens vary: a wrong value would show"


# ---- ReLU^2 ------------------------------------------------------------------------------------
def test_relu2_is_relu_squared_in_the_mlp_the_gated_and_the_experts():
    x = torch.randn(2, 5, D)
    assert ACTIVATIONS["relu2"] is SquaredReLU
    torch.testing.assert_close(SquaredReLU()(x), torch.where(x > 0, x * x, torch.zeros_like(x)))
    registry = get_registry()
    mlp = registry.component("ffn", "mlp")(activation="relu2").build(d_model=D, d_ff=48, dropout=0.0)
    hidden = F.linear(x, mlp.linear1.weight, mlp.linear1.bias).clamp_min(0) ** 2
    torch.testing.assert_close(mlp(x), F.linear(hidden, mlp.linear2.weight, mlp.linear2.bias), **TOLERANCE)
    gated = registry.component("ffn", "gated")(activation="relu2").build(d_model=D, d_ff=48, dropout=0.0)
    gate, up = F.linear(x, gated.gate_up.weight, gated.gate_up.bias).chunk(2, dim=-1)
    expected = F.linear(gate.clamp_min(0) ** 2 * up, gated.down.weight, gated.down.bias)
    torch.testing.assert_close(gated(x), expected, **TOLERANCE)
    experts = registry.component("ffn", "moe")(activation="relu2").build(d_model=D, d_ff=48, dropout=0.0)
    assert all(isinstance(expert.activation, SquaredReLU) for expert in experts.experts)
    with pytest.raises(ConfigError, match="relu2"):  # the literal names it among the choices
        tz.load_config("llama-tiny", {"ffn": {"kind": "mlp", "activation": "relu3"}})


# ---- gated attention output ----------------------------------------------------------------------
def written_out(attention: MultiHeadAttention, x: torch.Tensor, memory: torch.Tensor | None = None, *, sinks=None):
    """The heads' concatenated output ``(B, T, H * Dh)`` by the equations: projections, scores over
    sqrt(d_head), the causal mask (self-attention), a sink logit per head joining the softmax
    (``sinks``), the weights on the values. No positions."""
    dh, kv = attention.d_head, attention.n_kv_heads
    w, b = attention.in_proj.weight, attention.in_proj.bias
    q = F.linear(x, w[: H * dh], b[: H * dh])
    k, v = F.linear(x if memory is None else memory, w[H * dh :], b[H * dh :]).chunk(2, dim=-1)
    q, k, v = (t.unflatten(-1, (-1, dh)).transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(H // kv, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    if memory is None:
        t = x.size(1)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        logits = torch.cat([scores, sinks.view(1, H, 1, 1).expand(*scores.shape[:-1], 1)], dim=-1)
        weights = logits.softmax(-1)[..., :-1]
    else:
        weights = scores.softmax(-1)
    return (weights @ v).transpose(1, 2).flatten(2), weights


def test_the_gate_multiplies_each_heads_output_by_a_sigmoid_of_the_queries_input():
    attention = module("sdpa", gate=True, n_kv_heads=2)
    x, memory = torch.randn(2, 6, D), torch.randn(2, 9, D)
    gate = torch.sigmoid(F.linear(x, attention.gate_proj.weight, attention.gate_proj.bias))
    for source, mask in ((None, AttentionMask(causal=True)), (memory, None)):
        heads, _ = written_out(attention, x, source)
        expected = F.linear(heads * gate, attention.out_proj.weight, attention.out_proj.bias)
        with torch.no_grad():
            got, _ = attention(x, source, mask=mask)
        torch.testing.assert_close(got, expected, **TOLERANCE)
    assert attention.gate_proj.weight.shape == (H * 8, D) and attention.gate_proj.bias is not None
    assert module("sdpa", gate=True, bias=False).gate_proj.bias is None
    assert "output gate" in repr(attention)


def test_a_cross_attentions_gate_reads_the_decoders_input():
    model = tz.build_model(
        "transformer-tiny", dropout=0.0, decoder={"layers": 1, "cross_attention": {"kind": "sdpa", "gate": True}}
    ).eval()
    cross = model.decoder.layers[0].cross_attn
    assert cross.gate_proj is not None and model.decoder.layers[0].self_attn.gate_proj is None
    assert model.encoder.layers[0].self_attn.gate_proj is None


ATTENTION = get_registry().components("attention")


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """The softmax of ``(..., T, T)`` scores, query ``i`` seeing keys ``0`` to ``i``."""
    t = scores.size(-1)
    return scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def latent_heads(attention: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Multi-head latent attention's heads, causal, no positions (DeepSeek-V2's eqs. 9 to 11 and
    13): ``c = RMSNorm(x W_DKV)``, head ``h``'s keys and values ``c W_UK^h`` and ``c W_UV^h``, its
    output ``softmax(q_h k_h^T / sqrt(nope)) v_h``; concatenated, ``(B, T, H * v_head_dim)``."""
    nope, width = attention.nope_head_dim, attention.v_head_dim
    q = attention.q_proj(x).unflatten(-1, (H, nope)).transpose(1, 2)  # (B, H, T, nope)
    latent = attention.kv_a_proj_with_mqa(x)
    latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6) * attention.kv_a_layernorm.weight
    k, v = F.linear(latent, attention.kv_b_proj.weight).unflatten(-1, (H, nope + width)).split([nope, width], -1)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, nope), (B, H, T, v_head_dim)
    return (causal_softmax(q @ k.transpose(-1, -2) / math.sqrt(nope)) @ v).transpose(1, 2).flatten(2)


def differential_heads(attention: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Differential attention's heads, causal, no positions (Ye et al. 2024, eqs. 1 to 3): head
    ``j`` reads queries ``2j``, ``2j + 1`` and keys alike, and the value heads ``2j``, ``2j + 1`` side
    by side (``2d`` channels); its output ``(A1 - lambda A2) V``, RMS-normed, times
    ``1 - lambda_init``; concatenated, ``(B, T, H * d)``."""
    d, kernel = attention.d_head, attention.kernel
    q, k, v = attention.in_proj(x).chunk(3, dim=-1)
    q, k = (t.unflatten(-1, (H, d)).transpose(1, 2) for t in (q, k))  # (B, H, T, d)
    v = v.unflatten(-1, (H // 2, 2 * d)).transpose(1, 2)  # (B, H/2, T, 2d)
    lam = torch.exp(kernel.lambda_q1 @ kernel.lambda_k1) - torch.exp(kernel.lambda_q2 @ kernel.lambda_k2)
    lam = lam + kernel.lambda_init
    heads = []
    for j in range(H // 2):
        first, second = (
            causal_softmax(q[:, 2 * j + p] @ k[:, 2 * j + p].transpose(-1, -2) / math.sqrt(d)) for p in (0, 1)
        )
        out = (first - lam * second) @ v[:, j]  # (B, T, 2d)
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * kernel.head_norm.weight
        heads.append(out * (1 - kernel.lambda_init))
    return torch.cat(heads, dim=-1)


HEADS_WRITTEN_OUT = {"mla": latent_heads, "differential": differential_heads}
"""Kinds whose heads' output is not ``H * d_head`` channels of one head each, written out."""


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_every_kind_gates_each_channel_of_its_heads_output_in_its_forward_and_its_cached_steps(kind):
    """``out_proj(Y * sigmoid(x W_gate + b_gate))``, ``Y`` the heads' concatenated output as the
    output projection reads it, with random gate weights, so that a gate whose channels did not
    line up with ``Y``'s would show: ``Y`` is caught from the ungated module, in a forward and in
    decoding steps on a cache, and written out for mla (``H * v_head_dim`` channels, here 12 a head)
    and differential attention (each pair of heads' ``2 d_head`` value channels)."""
    extra = {"v_head_dim": 12} if kind == "mla" else {}
    attention = module(kind, gate=True, **extra)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        attention.gate_proj.weight.copy_(torch.randn(attention.gate_proj.weight.shape, generator=generator))
        attention.gate_proj.bias.copy_(torch.randn(attention.gate_proj.bias.shape, generator=generator))
    ungated = copy.deepcopy(attention)
    ungated.gate_proj = None
    caught = []
    ungated.out_proj.register_forward_pre_hook(lambda _module, args: caught.append(args[0]))
    options = ATTENTION[kind]
    x = torch.randn(2, 16, D)
    mask = AttentionMask(causal=options.takes_causal)

    def gated(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(F.linear(x, attention.gate_proj.weight, attention.gate_proj.bias))
        return F.linear(y * gate, attention.out_proj.weight, attention.out_proj.bias)

    with torch.no_grad():
        ungated(x, mask=mask)
        torch.testing.assert_close(attention(x, mask=mask)[0], gated(caught[-1], x), **TOLERANCE)
        if kind in HEADS_WRITTEN_OUT:
            torch.testing.assert_close(caught[-1], HEADS_WRITTEN_OUT[kind](attention, x), **TOLERANCE)
        if options.takes_causal:
            first, second = KVCache(), KVCache()
            for t in range(3):
                step = x[:, t : t + 1]
                ungated(step, mask=mask, cache=second)
                torch.testing.assert_close(
                    attention(step, mask=mask, cache=first)[0], gated(caught[-1], step), **TOLERANCE
                )
    channels = {"mla": H * 12}.get(kind, caught[-1].size(-1))
    assert attention.gate_proj.weight.shape == (channels, D) == (caught[-1].size(-1), D)


# ---- attention sinks -----------------------------------------------------------------------------
def test_a_sink_joins_every_softmax_as_a_key_with_no_value():
    attention = drawn(module("math", sinks=True, n_kv_heads=2))
    x = torch.randn(2, 7, D)
    heads, weights = written_out(attention, x, sinks=attention.sinks)
    expected = F.linear(heads, attention.out_proj.weight, attention.out_proj.bias)
    with torch.no_grad():
        got, got_weights = attention(x, mask=AttentionMask(causal=True), need_weights=True)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    torch.testing.assert_close(got_weights, weights, **TOLERANCE)
    assert attention.sinks.shape == (H,) and attention.sinks.abs().min() > 0.05 and "sinks" in repr(attention)
    assert (module("sdpa", sinks=True).sinks == 0).all(), "the sinks start at 0"


@pytest.mark.parametrize("kind", ["sdpa", "math"])
def test_sinks_under_padding_softcap_and_alibi_are_the_equation(kind):
    """A float32 sink column beside ALiBi's bias and a soft-capped score (the sink's logit itself is
    not capped), a padded key hidden, a query with no real key to see gets zeros."""
    alibi = ALiBiPositional(H, symmetric=False)
    attention = drawn(module(kind, sinks=True, softcap=2.0, in_attention=alibi))
    x = torch.randn(2, 6, D)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[1, :2] = False
    mask = AttentionMask(padding=real, causal=True)
    dh = attention.d_head
    q, k, v = F.linear(x, attention.in_proj.weight, attention.in_proj.bias).unflatten(-1, (3, H, dh)).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = 2.0 * torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(dh) / 2.0) + alibi.bias(6, 6, x.device)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril() & real[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = attention.sinks.view(1, H, 1, 1).expand(2, H, 6, 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    expected = F.linear((weights @ v).transpose(1, 2).flatten(2), attention.out_proj.weight, attention.out_proj.bias)
    with torch.no_grad():
        got, _ = attention(x, mask=mask)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    torch.testing.assert_close(got[1, :2], attention.out_proj.bias.expand(2, D), **TOLERANCE)


def test_the_kinds_that_do_not_take_sinks_refuse_them_in_one_message():
    for kind, options in ATTENTION.items():
        if options.takes_sinks:
            assert module(kind, sinks=True).sinks is not None, kind
            continue
        with pytest.raises(ValueError, match=f"{kind} attention does not take sinks") as refused:
            options(kind=kind, sinks=True)
        assert "use kind: sdpa or math" in str(refused.value)
    assert {kind for kind, options in ATTENTION.items() if options.takes_sinks} >= {"sdpa", "math"}
    with pytest.raises(ConfigError, match="decoder.attention: talking-heads attention does not take sinks"):
        tz.load_config("llama-tiny", {"decoder": {"attention": {"kind": "talking-heads", "sinks": True}}})


# ---- value residual learning -----------------------------------------------------------------------
def test_each_later_layer_attends_over_its_mix_of_the_first_layers_values_and_its_own():
    """ResFormer's ``U_n = A_n (lambda_1 V_1 + lambda_2 V_n)``: each layer's output recomputed from
    its input (caught by a hook), its weights and the first layer's values, with rotary positions
    and grouped-query attention as llama-tiny has them."""
    model = drawn(lm(**attending(NO_BIAS, layers=3, value_residual=True)))
    inputs, outputs = {}, {}

    def caught(n: int, _: torch.nn.Module, args: tuple, out: tuple) -> None:
        inputs[n], outputs[n] = args[0], out[0]

    for n, attention in enumerate(attentions(model)):
        attention.register_forward_hook(partial(caught, n))
    ids = random_ids(2, 10)
    with torch.no_grad():
        model(ids)
        first = attentions(model)[0]
        kv_width = first.n_kv_heads * first.d_head

        def values(attention: MultiHeadAttention, h: torch.Tensor) -> torch.Tensor:
            v = F.linear(h, attention.in_proj.weight[-kv_width:])
            return v.unflatten(-1, (-1, attention.d_head)).transpose(1, 2)  # (B, KV, T, Dh)

        v_1 = values(first, inputs[0])
        for n, attention in enumerate(attentions(model)):
            h = inputs[n]
            q, k = F.linear(h, attention.in_proj.weight[:-kv_width]).split([H * 16, kv_width], dim=-1)
            q, k = (t.unflatten(-1, (-1, 16)).transpose(1, 2) for t in (q, k))
            q, k = attention.positional.rotate(q, k, 0)
            v_n = values(attention, h)
            if n > 0:
                lambda_1, lambda_2 = attention.value_lambdas
                v_n = lambda_1 * v_1 + lambda_2 * v_n
            k, v_n = (t.repeat_interleave(2, dim=1) for t in (k, v_n))
            scores = (q @ k.transpose(-1, -2) / 4.0).masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
            heads = (scores.softmax(-1) @ v_n).transpose(1, 2).flatten(2)
            torch.testing.assert_close(outputs[n], F.linear(heads, attention.out_proj.weight), **TOLERANCE)
    lambdas = torch.stack([attention.value_lambdas for attention in attentions(model)[1:]])
    assert (lambdas - 0.5).abs().min() > 1e-3, "drawn away from their start, so a swapped pair would show"


def test_the_value_residual_parameters_read_well_and_the_first_values_are_the_stacks_own():
    model = tz.build_model(
        "transformer-tiny",
        dropout=0.0,
        encoder={"layers": 2, "value_residual": True},
        decoder={"layers": 3, "value_residual": True},
    )
    names = [name for name, _ in model.named_parameters() if "value_lambdas" in name]
    assert names == [
        "encoder.layers.1.self_attn.value_lambdas",
        "decoder.layers.1.self_attn.value_lambdas",
        "decoder.layers.2.self_attn.value_lambdas",
    ]
    assert all((parameter == 0.5).all() for name, parameter in model.named_parameters() if name in names)
    holders = {
        side: {id(layer.self_attn.first_values) for layer in getattr(model, side).layers}
        for side in ("encoder", "decoder")
    }
    assert all(len(ids) == 1 for ids in holders.values()) and holders["encoder"] != holders["decoder"]
    assert isinstance(model.decoder.layers[0].self_attn.first_values, FirstValues)
    assert all(layer.cross_attn.first_values is None for layer in model.decoder.layers), "self-attention's only"
    assert "value residual: first layer" in repr(model.decoder.layers[0].self_attn)
    assert "value residual: mixes the first layer's values" in repr(model.decoder.layers[2].self_attn)
    src, tgt = torch.randint(3, 100, (2, 7)), torch.randint(3, 100, (2, 5))
    model(src, tgt).logits.sum().backward()
    assert model.decoder.layers[1].self_attn.value_lambdas.grad.abs().min() > 0, "the lambdas learn"


def test_a_model_copied_or_pickled_after_a_training_forward_has_an_empty_holder_shared_by_its_layers():
    """The first values of a training forward carry its autograd graph, which a tensor's deepcopy
    refuses: a copy (torch.optim.swa_utils.AveragedModel's) or a pickle starts with an empty holder."""
    model = lm(**attending(NO_BIAS, layers=3, value_residual=True)).train()
    ids = random_ids(2, 7)
    model(ids).logits.sum().backward()
    assert attentions(model)[0].first_values.value.grad_fn is not None
    twin = copy.deepcopy(model)
    loaded = pickle.loads(pickle.dumps(model))
    for copied in (twin, loaded):
        holders = {id(attention.first_values) for attention in attentions(copied)}
        assert len(holders) == 1 and holders.isdisjoint({id(attentions(model)[0].first_values)})
        assert attentions(copied)[0].first_values.value is None
        with torch.no_grad():
            torch.testing.assert_close(copied.eval()(ids).logits, model.eval()(ids).logits, **TOLERANCE)


def test_a_later_layer_called_without_its_stacks_first_layer_says_so():
    model = lm(**attending(NO_BIAS, layers=2, value_residual=True))
    later = attentions(model)[1]
    later.first_values.value = None
    with pytest.raises(ValueError, match="call the whole stack, whose first layer makes them"):
        later(torch.randn(1, 3, 64), mask=AttentionMask(causal=True))


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        (
            "universal-transformer-tiny",
            {"encoder": {"value_residual": True}},
            (
                "encoder: value_residual mixes the first layer's values into each later layer's, but a recurrent "
                "stack applies one shared layer at every step; remove value_residual, or use kind: standard"
            ),
        ),
        (
            "llama-tiny",
            {"positional": "learned", **attending({"kind": "linear"}, value_residual=True)},
            (
                "decoder: value_residual mixes the first layer's values into the later layers' as attention forms them "
                "in MultiHeadAttention.project, which linear attention does not; remove value_residual, or use kinds "
                "that take it, such as sdpa"
            ),
        ),
        (
            "llama-tiny",
            attending([{"kind": "sdpa", "n_kv_heads": 2}, {"kind": "sdpa"}], value_residual=True),
            (
                "decoder.value_residual: every later layer mixes the first layer's values into its own, so every "
                "layer's values need the same heads, but the attention kinds have 2 and 4 key/value heads; give "
                "them one n_kv_heads"
            ),
        ),
    ],
    ids=["recurrent", "linear", "kv-heads"],
)
def test_value_residual_is_refused_where_a_stack_cannot_take_it(name, overrides, message):
    with pytest.raises(ConfigError) as refused:
        tz.load_config(name, overrides)
    assert message in str(refused.value)


def test_every_kind_that_takes_value_residual_mixes_in_project():
    """A kind declaring ``takes_value_residual`` forms its values in project(): built as a later
    layer, its output moves with its lambdas; the others are refused at validation."""
    for kind, options in ATTENTION.items():
        stack = {"layers": 2, "attention": {"kind": kind}, "value_residual": True}
        if not options.takes_value_residual:
            with pytest.raises(ValueError, match=f"which {kind} attention does not"):
                get_registry().component("stack", "standard")(**stack)
            continue
        first_values = FirstValues()
        layer = LayerSpec(d_model=D, n_heads=H, norm=RMSNormOptions(), grid=(4, 4), first_values=first_values)
        first = options(kind=kind).build(layer)
        torch.manual_seed(1)  # weights of its own: with the first layer's, V_1 = V_n and no mix would show
        later = options(kind=kind).build(dataclasses.replace(layer, depth=1))
        x = torch.randn(2, 16, D)
        with torch.no_grad():
            first(x)
            mixed = later(x)[0]
            later.value_lambdas.copy_(torch.tensor([0.0, 1.0]))
            own = later(x)[0]
        assert (mixed - own).abs().max() > 1e-4, kind
