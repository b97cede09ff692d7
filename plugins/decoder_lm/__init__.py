"""Decoder-only language models as they are built today: GPT-2 (Radford et al. 2019), Llama
(Touvron et al. 2023; Llama 3.2), Qwen 3 (Qwen Team 2025), Gemma 2 (Gemma Team 2024) and OLMo 2
(OLMo Team 2024).

One causal stack over token embeddings and a language-model head, every part a component of the
core any family may use: RMSNorm with a (1 + w) weight, norms before, after or around each
sub-layer (``norm_placement``), gated feed-forward networks, rotary positions on part of the
head, scaled for longer inputs, grouped-query attention, QK-norm, soft-capped attention scores
and final logits, sliding-window layers between global ones (a stack's list of attention kinds)
and layers without positions (``positions: false``). This file holds only each model's values,
and the initialisation its source uses.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from torch import nn

from transformer_zoo.core.config import EncoderDecoderConfig
from transformer_zoo.core.model import EncoderDecoder
from transformer_zoo.core.options import (
    FFNField,
    HeadField,
    NormField,
    PositionalField,
    StackField,
    Variant,
)
from transformer_zoo.core.validation import MAX_VOCAB, NormPlacement
from transformer_zoo.registry import hookimpl

from .hf import IMPORTERS


class DecoderLMConfig(EncoderDecoderConfig):
    """A decoder-only language model. The defaults are Llama's design (pre-norm RMSNorm, SwiGLU,
    rotary positions, no biases); each preset gives its model's values."""

    family: ClassVar[str] = "decoder-lm"

    variant: str = Field("llama", description="the registered variant this config started from")
    vocab_size: int = Field(32000, ge=1, le=MAX_VOCAB, description="token vocabulary")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on residuals, embeddings and attention weights")
    norm: NormField = Field({"kind": "rmsnorm", "eps": 1e-5}, validate_default=True, description="normalisation layer")
    norm_placement: NormPlacement = Field("pre", description="where each sub-layer's norms go")
    ffn: FFNField = Field(
        {"kind": "gated", "activation": "silu", "bias": False},
        validate_default=True,
        description="feed-forward network",
    )
    positional: PositionalField = Field(
        {"kind": "rotary", "layout": "halves"}, validate_default=True, description="positional encoding"
    )
    scale_embeddings: bool = Field(False, description="multiply embeddings by sqrt(d_model) (Gemma)")
    encoder: StackField | None = Field(None, description="always null: a decoder-only model has no encoder")
    decoder: StackField | None = Field(
        {"layers": 16, "attention": {"kind": "sdpa", "bias": False}},
        validate_default=True,
        description="the causal stack",
    )
    head: HeadField = Field(
        {"kind": "lm", "tie_weights": False}, validate_default=True, description="next-token logits"
    )
    init: Literal["normal", "gpt2"] = Field(
        "normal",
        description="initialisation: normal (every weight N(0, init_std), biases 0, norms their own: Llama, Qwen 3, "
        "Gemma 2, OLMo 2) or gpt2 (the same, and each residual branch's output projection N(0, init_std / "
        "sqrt(2 * layers)): Radford et al. 2019, section 2.3)",
    )
    init_std: float = Field(0.02, gt=0.0, le=1.0, description="standard deviation of the initial weights")

    @model_validator(mode="after")
    def _decoder_only(self) -> DecoderLMConfig:
        if self.encoder is not None or self.decoder is None:
            raise ValueError(
                "a decoder-only model has one stack, the decoder: leave encoder null (for an encoder-decoder, "
                "build transformer-tiny; for an encoder, bert-tiny)"
            )
        return self

    def build(self) -> EncoderDecoder:
        model = super().build()
        initialise(model, std=self.init_std, scaled_residuals=self.init == "gpt2", layers=self.decoder.layers)
        return model


RESIDUAL_OUTPUTS = ("self_attn.out_proj", "ffn.linear2", "ffn.down")
"""The projections that end a residual branch, which GPT-2 scales down by sqrt(2 * layers)."""


def initialise(model: nn.Module, *, std: float, scaled_residuals: bool, layers: int) -> None:
    """Draw every linear and embedding weight from N(0, std) and zero the biases, as
    transformers' ``_init_weights`` does for these models (norms keep their own start: 1, or 0
    for a (1 + w) RMSNorm); with ``scaled_residuals``, the projections that end a residual branch
    from N(0, std / sqrt(2 * layers)) (GPT-2)."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            scaled = scaled_residuals and name.endswith(RESIDUAL_OUTPUTS)
            nn.init.normal_(module.weight, std=std / math.sqrt(2 * layers) if scaled else std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def _tiny(**extra: Any) -> dict[str, Any]:
    """A preset's ``-tiny`` size for CPUs and tests: d 64, 4 heads, 2 layers, 1000 tokens."""
    return {"vocab_size": 1000, "d_model": 64, "n_heads": 4, "d_ff": 128, "max_len": 512, **extra}


NO_BIAS = {"kind": "sdpa", "bias": False}
GPT2 = dict(
    vocab_size=50257,
    max_len=1024,
    d_model=768,
    n_heads=12,
    d_ff=3072,
    dropout=0.1,
    positional="learned",
    norm={"kind": "layernorm", "eps": 1e-5},
    ffn={"kind": "mlp", "activation": "gelu-tanh", "inner_dropout": False},
    decoder={"layers": 12, "attention": {"kind": "sdpa", "bias": True}},
    head={"kind": "lm", "tie_weights": True},
    init="gpt2",
)
LLAMA = dict(  # Llama 3.2 1B
    vocab_size=128256,
    max_len=131072,
    d_model=2048,
    n_heads=32,
    d_ff=8192,
    positional={
        "kind": "rotary",
        "layout": "halves",
        "base": 500000.0,
        "scaling": {
            "kind": "llama3",
            "factor": 32.0,
            "original_max_len": 8192,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    },
    decoder={"layers": 16, "attention": {**NO_BIAS, "n_kv_heads": 8}},
    head={"kind": "lm", "tie_weights": True},
)
QWEN3 = dict(  # Qwen3-0.6B
    vocab_size=151936,
    max_len=40960,
    d_model=1024,
    n_heads=16,
    head_dim=128,
    d_ff=3072,
    norm={"kind": "rmsnorm", "eps": 1e-6},
    positional={"kind": "rotary", "layout": "halves", "base": 1000000.0},
    decoder={"layers": 28, "attention": {**NO_BIAS, "n_kv_heads": 8, "qk_norm": "head"}},
    head={"kind": "lm", "tie_weights": True},
)
GEMMA2_ATTENTION = {**NO_BIAS, "n_kv_heads": 4, "softcap": 50.0, "scale": 256**-0.5}
GEMMA2 = dict(  # Gemma 2 2B: a sliding window of 4096 keys (the query's own and 4095 before) in every other layer
    vocab_size=256000,
    max_len=8192,
    d_model=2304,
    n_heads=8,
    head_dim=256,
    d_ff=9216,
    norm={"kind": "rmsnorm", "eps": 1e-6, "unit_offset": True},
    norm_placement="sandwich",
    ffn={"kind": "gated", "activation": "gelu-tanh", "bias": False},
    scale_embeddings=True,
    positional={"kind": "rotary", "layout": "halves"},
    decoder={
        "layers": 26,
        "attention": [{**GEMMA2_ATTENTION, "kind": "sliding-window", "window": 4095}, GEMMA2_ATTENTION],
    },
    head={"kind": "lm", "tie_weights": True, "softcap": 30.0},
)
OLMO2 = dict(  # OLMo-2-0425-1B
    vocab_size=100352,
    max_len=4096,
    d_model=2048,
    n_heads=16,
    d_ff=8192,
    norm={"kind": "rmsnorm", "eps": 1e-6},
    norm_placement="output",
    positional={"kind": "rotary", "layout": "halves", "base": 500000.0},
    decoder={"layers": 16, "attention": {**NO_BIAS, "qk_norm": "projection"}},
)
GEMMA2_TINY_ATTENTION = {**NO_BIAS, "n_kv_heads": 2, "softcap": 50.0, "scale": 32**-0.5}
PUBLISHED = {  # parameters, embeddings counted as the source counts them (a tied table once)
    "gpt2": 124_439_808,
    "llama": 1_235_814_400,
    "qwen3": 596_049_920,
    "gemma2": 2_614_341_888,
    "olmo2": 1_484_916_736,
}
"""What each real size's source publishes (model cards, the transformers configs' counts)."""


@hookimpl
def tzoo_variants():
    def preset(name: str, defaults: dict[str, Any], description: str) -> Variant:
        return Variant(name=name, config=DecoderLMConfig, defaults=defaults, description=description)

    return [
        preset("gpt2", GPT2, "GPT-2 small (Radford et al. 2019): 124M, learned positions, pre-LN, tied embeddings"),
        preset(
            "gpt2-tiny",
            {**GPT2, **_tiny(decoder={"layers": 2, "attention": {"kind": "sdpa", "bias": True}})},
            "GPT-2's design at d 64, 4 heads, 2 layers, for CPUs and tests",
        ),
        preset("llama", LLAMA, "Llama 3.2 1B: RMSNorm, SwiGLU, rotary (Llama 3 scaling), grouped-query attention"),
        preset(
            "llama-tiny",
            {
                **LLAMA,
                **_tiny(decoder={"layers": 2, "attention": {**NO_BIAS, "n_kv_heads": 2}}),
                "positional": {"kind": "rotary", "layout": "halves"},
                "head": {"kind": "lm", "tie_weights": False},
            },
            "Llama's design at d 64, 4 heads (2 key/value heads), 2 layers, untied head, for CPUs and tests",
        ),
        preset("qwen3", QWEN3, "Qwen3-0.6B: Llama's design with per-head QK-norm and 128-wide heads"),
        preset(
            "qwen3-tiny",
            {
                **QWEN3,
                **_tiny(
                    head_dim=32, decoder={"layers": 2, "attention": {**NO_BIAS, "n_kv_heads": 2, "qk_norm": "head"}}
                ),
            },
            "Qwen 3's design at d 64, 4 heads of 32, 2 layers, for CPUs and tests",
        ),
        preset(
            "gemma2",
            GEMMA2,
            "Gemma 2 2B: soft-capped scores and logits, sliding-window and global layers in turn, sandwich norms",
        ),
        preset(
            "gemma2-tiny",
            {
                **GEMMA2,
                **_tiny(
                    head_dim=32,
                    decoder={
                        "layers": 2,
                        "attention": [
                            {**GEMMA2_TINY_ATTENTION, "kind": "sliding-window", "window": 15},
                            GEMMA2_TINY_ATTENTION,
                        ],
                    },
                ),
            },
            "Gemma 2's design at d 64, 4 heads of 32, 2 layers (a window of 16 keys, then global), for CPUs and tests",
        ),
        preset("olmo2", OLMO2, "OLMo 2 1B: QK-norm over the projections, a norm on each sub-layer's output"),
        preset(
            "olmo2-tiny",
            {**OLMO2, **_tiny(decoder={"layers": 2, "attention": {**NO_BIAS, "qk_norm": "projection"}})},
            "OLMo 2's design at d 64, 4 heads, 2 layers, for CPUs and tests",
        ),
    ]


@hookimpl
def tzoo_importers():
    return IMPORTERS
