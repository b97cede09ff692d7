"""Attention sinks and the gated attention output against transformers' modules, on copied weights.

- ``sinks`` (Xiao et al. 2024, learned as in gpt-oss) equals transformers' ``GptOssAttention``
  (eager attention): biased query, key, value and output projections, grouped-query attention,
  rotary positions in the rotate-half layout (``layout: halves``), a causal mask with left
  padding, and sink logits drawn away from 0; the ``sdpa`` and ``math`` kinds both, and the
  weights either returns.
- ``gate`` (Qiu et al. 2025) equals transformers' ``Qwen3NextAttention``, whose ``q_proj`` holds,
  head by head, the query's rows and then the gate's; with its (1 + w) QK-norm over each head
  (``qk_norm: head`` with ``rmsnorm``, ``unit_offset: true``), partial rotary (``fraction``) and
  grouped-query attention, with and without biases.

float32, within 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.core.relative import RotaryPositional
from transformer_zoo.plugins.components import MathAttentionOptions, RMSNormOptions, SDPAAttentionOptions

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import (  # noqa: E402
    Qwen3NextAttention,
    Qwen3NextRotaryEmbedding,
)

TOLERANCE = dict(atol=1e-5, rtol=0.0)
D, H, KV, DH, T, THETA = 64, 4, 2, 16, 9, 500.0
KINDS = {"sdpa": SDPAAttentionOptions, "math": MathAttentionOptions}


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of ``T`` tokens, the second with three padding tokens on the left."""
    torch.manual_seed(1)
    x = torch.randn(2, T, D)
    real = torch.ones(2, T, dtype=torch.bool)
    real[1, :3] = False
    return x, real


def their_mask(real: torch.Tensor) -> torch.Tensor:
    """transformers' eager mask: ``(B, 1, T, T)``, 0 where a query may attend (causal, real key),
    the dtype's minimum elsewhere."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal[None, None] & real[:, None, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def ours(options, *, norm=None, fraction=1.0):
    rotary = RotaryPositional(DH, 64, base=THETA, layout="halves", fraction=fraction)
    layer = LayerSpec(d_model=D, n_heads=H, head_dim=DH, norm=norm, in_attention=rotary)
    return options.build(layer).eval()


# ---- attention sinks: gpt-oss --------------------------------------------------------------------
def gpt_oss():
    config = transformers.GptOssConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=DH,
        attention_bias=True,
        attention_dropout=0.0,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = GptOssAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.normal_(std=0.3)  # the sinks too: logits away from 0, some above the scores
    return theirs, GptOssRotaryEmbedding(config)


def copied_from_gpt_oss(module, theirs) -> None:
    with torch.no_grad():
        module.in_proj.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
        module.in_proj.bias.copy_(torch.cat([theirs.q_proj.bias, theirs.k_proj.bias, theirs.v_proj.bias]))
        module.out_proj.load_state_dict(theirs.o_proj.state_dict())
        module.sinks.copy_(theirs.sinks)


@pytest.mark.parametrize("kind", KINDS)
def test_sinks_are_gpt_oss_attention(kind):
    theirs, rotary = gpt_oss()
    module = ours(KINDS[kind](kind=kind, sinks=True, n_kv_heads=KV, bias=True))
    copied_from_gpt_oss(module, theirs)
    x, real = padded_batch()
    with torch.no_grad():
        position_embeddings = rotary(x, torch.arange(T)[None].expand(2, T))
        expected, expected_weights = theirs(x, position_embeddings, their_mask(real))
        got, weights = module(x, mask=AttentionMask(padding=real, causal=True), need_weights=True)
        plain, _ = module(x, mask=AttentionMask(padding=real, causal=True))
    assert (theirs.sinks.abs() > 0.05).all()
    torch.testing.assert_close(got, expected, **TOLERANCE)
    torch.testing.assert_close(plain, expected, **TOLERANCE)  # the fused path, where it is one
    torch.testing.assert_close(weights, expected_weights, **TOLERANCE)
    shares = weights.sum(-1)[:, :, 3:]  # (B, H, Tq): the real queries' weight over the real keys
    assert shares.max() <= 1.0 and shares.min() < 0.5, "the sink takes a share of the queries' weight"


# ---- gated attention output: Qwen3-Next ----------------------------------------------------------
def qwen3_next(bias: bool):
    config = transformers.Qwen3NextConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=DH,
        attention_bias=bias,
        attention_dropout=0.0,
        rms_norm_eps=1e-6,
        partial_rotary_factor=0.5,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = Qwen3NextAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.normal_(std=0.3)  # the (1 + w) norms' w and the gate's rows too
    return theirs, Qwen3NextRotaryEmbedding(config)


def copied_from_qwen3_next(module, theirs, bias: bool) -> None:
    """Qwen3-Next's ``q_proj`` rows are, head by head, the head's query then its gate: ``(H, 2, DH)``."""
    with torch.no_grad():
        q_weight, gate_weight = theirs.q_proj.weight.view(H, 2, DH, D).unbind(1)
        module.in_proj.weight.copy_(
            torch.cat([q_weight.reshape(H * DH, D), theirs.k_proj.weight, theirs.v_proj.weight])
        )
        module.gate_proj.weight.copy_(gate_weight.reshape(H * DH, D))
        if bias:
            q_bias, gate_bias = theirs.q_proj.bias.view(H, 2, DH).unbind(1)
            module.in_proj.bias.copy_(torch.cat([q_bias.flatten(), theirs.k_proj.bias, theirs.v_proj.bias]))
            module.gate_proj.bias.copy_(gate_bias.flatten())
        module.out_proj.load_state_dict(theirs.o_proj.state_dict())
        module.q_norm.weight.copy_(theirs.q_norm.weight)
        module.k_norm.weight.copy_(theirs.k_norm.weight)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_gated_output_is_qwen3_next_attention(bias):
    theirs, rotary = qwen3_next(bias)
    norm = RMSNormOptions(eps=1e-6, unit_offset=True)
    options = SDPAAttentionOptions(gate=True, n_kv_heads=KV, bias=bias, qk_norm="head")
    module = ours(options, norm=norm, fraction=0.5)
    assert module.positional.rotated == 8
    copied_from_qwen3_next(module, theirs, bias)
    x, real = padded_batch()
    with torch.no_grad():
        position_embeddings = rotary(x, torch.arange(T)[None].expand(2, T))
        assert position_embeddings[0].shape[-1] == 8, "transformers turns half of each head too"
        expected, _ = theirs(x, position_embeddings, their_mask(real))
        got, _ = module(x, mask=AttentionMask(padding=real, causal=True))
        module.gate_proj = None
        ungated, _ = module(x, mask=AttentionMask(padding=real, causal=True))
    torch.testing.assert_close(got[0], expected[0], **TOLERANCE)
    torch.testing.assert_close(got[1, 3:], expected[1, 3:], **TOLERANCE)  # the padded queries see no key
    assert (ungated - expected).abs().max() > 1e-2, "without its gate the module is not Qwen3-Next's"
