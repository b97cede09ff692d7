"""The generic components every family composes: attention, positions, norms, FFNs, stacks, heads.

Papers: Vaswani et al. 2017 (scaled dot-product attention, sinusoids, post-norm), Ba et al.
2016 (layer norm), Zhang & Sennrich 2019 (RMS norm), Ioffe & Szegedy 2015 (batch norm),
Shazeer 2020 (gated FFNs), Su et al. 2021 (rotary), Press et al. 2022 (ALiBi).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema, model_validator
from torch import nn

from transformer_zoo.core.attention import MathAttention
from transformer_zoo.core.embedding import LearnedPositional, SinusoidalPositional
from transformer_zoo.core.heads import SequenceClassificationHead, TokenClassificationHead
from transformer_zoo.core.layers import (
    FeedForward,
    GatedFeedForward,
    StandardStack,
    TokenBatchNorm,
    UnitOffsetRMSNorm,
)
from transformer_zoo.core.model import LMHead
from transformer_zoo.core.options import (
    AttentionOptions,
    FFNOptions,
    HeadOptions,
    LayerSpec,
    NormOptions,
    PositionalOptions,
    StackOptions,
)
from transformer_zoo.core.relative import (
    ALiBiPositional,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    RotaryLayout,
    RotaryPositional,
    RotaryScaling,
    YarnScaling,
)
from transformer_zoo.core.validation import MAX_LENGTH, MAX_VOCAB, Options
from transformer_zoo.registry import hookimpl


# ---- attention ----------------------------------------------------------------------------
class SDPAAttentionOptions(AttentionOptions):
    """Full multi-head attention on PyTorch's scaled_dot_product_attention."""

    kind: Literal["sdpa"] = "sdpa"
    takes_softcap: ClassVar[bool] = True  # the default kernel, soft-capped (SoftcapKernel)
    takes_sinks: ClassVar[bool] = True  # SDPA takes the sink's bias column and its mask


class MathAttentionOptions(AttentionOptions):
    """Full attention written out (no fused kernel): the n x n weights are made, a reference for kernels."""

    kind: Literal["math"] = "math"
    module: ClassVar[type[nn.Module]] = MathAttention
    takes_softcap: ClassVar[bool] = True
    takes_sinks: ClassVar[bool] = True

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return {} if self.softcap is None else {"kernel": self.make_kernel()}  # MathAttention runs math_kernel


# ---- positional ---------------------------------------------------------------------------
class SinusoidalOptions(PositionalOptions):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017)."""

    kind: Literal["sinusoidal"] = "sinusoidal"
    base: float = Field(10000.0, gt=1.0, description="wavelength base of the sinusoids")
    layout: Literal["interleaved", "halves"] = Field(
        "interleaved",
        description="where the sines and cosines go: interleaved (sin, cos, sin, ...: the paper's formula) "
        "or halves (every sine, then every cosine: Marian's, and Hugging Face MarianMTModel's)",
    )

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return SinusoidalPositional(d_model, max_len, base=self.base, layout=self.layout)


class LearnedOptions(PositionalOptions):
    """A learned vector per absolute position, added to the embeddings."""

    kind: Literal["learned"] = "learned"

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return LearnedPositional(d_model, max_len)


class RotaryScalingOptions(Options):
    """How rotary frequencies stretch past the length a model was trained on: one kind of
    Hugging Face transformers' ``rope_type``, with its fields and defaults. ``build(max_len=)``
    returns a :class:`~transformer_zoo.core.relative.RotaryScaling`."""

    category: ClassVar[str] = "rotary scaling"
    factor: float = Field(
        ge=1.0,
        le=MAX_LENGTH,
        description="the stretch: about factor times the trained length fits (transformers' factor; at least 1)",
    )

    def build(self, *, max_len: int) -> RotaryScaling:
        raise NotImplementedError(f"{type(self).__name__} does not define build()")


class TrainedLengthScalingOptions(RotaryScalingOptions):
    """A stretch that reads the length the model was trained on."""

    original_max_len: int | None = Field(
        None,
        ge=1,
        le=MAX_LENGTH,
        description="the length the model was trained on (transformers' original_max_position_embeddings, "
        "or max_position_embeddings for dynamic); null: the model's max_len",
    )


class LinearScalingOptions(RotaryScalingOptions):
    """Position interpolation (Chen et al. 2023): every frequency divided by factor."""

    kind: Literal["linear"] = "linear"

    def build(self, *, max_len: int) -> RotaryScaling:
        return LinearScaling(self.factor)


class DynamicScalingOptions(TrainedLengthScalingOptions):
    """Dynamic NTK-aware scaling: past original_max_len, the base grows with the sequence length."""

    kind: Literal["dynamic"] = "dynamic"

    def build(self, *, max_len: int) -> RotaryScaling:
        return DynamicNTKScaling(self.factor, self.original_max_len or max_len)


class YarnScalingOptions(TrainedLengthScalingOptions):
    """YaRN (Peng et al. 2023): slow pairs interpolated, fast pairs kept, a ramp between, and a
    factor on cos and sin."""

    kind: Literal["yarn"] = "yarn"
    beta_fast: float = Field(
        32.0, gt=0.0, le=MAX_LENGTH, description="pairs turning more times than this over original_max_len are kept"
    )
    beta_slow: float = Field(
        1.0, gt=0.0, le=MAX_LENGTH, description="pairs turning fewer times than this are divided by factor"
    )
    attention_factor: float | None = Field(
        None,
        gt=0.0,
        le=MAX_LENGTH,
        description="multiplies cos and sin; null: 0.1 ln(factor) + 1, or the ratio of mscale's to "
        "mscale_all_dim's where both are given",
    )
    mscale: float | None = Field(
        None,
        gt=0.0,
        le=MAX_LENGTH,
        description="with mscale_all_dim: attention_factor = (0.1 mscale ln(factor) + 1) / "
        "(0.1 mscale_all_dim ln(factor) + 1) (DeepSeek's); null: not used",
    )
    mscale_all_dim: float | None = Field(None, gt=0.0, le=MAX_LENGTH, description="see mscale; null: not used")
    truncate: bool = Field(True, description="round the ramp's ends outwards to whole pairs")

    @model_validator(mode="after")
    def _fields_agree(self) -> YarnScalingOptions:
        problems = []
        if self.beta_fast < self.beta_slow:
            problems.append(
                f"beta_fast={self.beta_fast} is below beta_slow={self.beta_slow}: the ramp runs from the pairs "
                "turning beta_fast times down to those turning beta_slow times; raise beta_fast or lower beta_slow"
            )
        if (self.mscale is None) != (self.mscale_all_dim is None):
            problems.append("mscale and mscale_all_dim are used together: give both or neither")
        if self.attention_factor is not None and self.mscale is not None:
            problems.append("attention_factor replaces mscale and mscale_all_dim: give one or the other")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def build(self, *, max_len: int) -> RotaryScaling:
        return YarnScaling(
            self.factor,
            self.original_max_len or max_len,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            attention_factor=self.attention_factor,
            mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim,
            truncate=self.truncate,
        )


class Llama3ScalingOptions(TrainedLengthScalingOptions):
    """Llama 3.1's: long wavelengths divided by factor, short ones kept, a smooth blend between."""

    kind: Literal["llama3"] = "llama3"
    low_freq_factor: float = Field(
        gt=0.0,
        le=MAX_LENGTH,
        description="pairs whose wavelength exceeds original_max_len / low_freq_factor are divided by factor "
        "(Llama 3.1: 1)",
    )
    high_freq_factor: float = Field(
        gt=0.0,
        le=MAX_LENGTH,
        description="pairs whose wavelength is below original_max_len / high_freq_factor are kept (Llama 3.1: 4)",
    )

    @model_validator(mode="after")
    def _blend_has_width(self) -> Llama3ScalingOptions:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor={self.high_freq_factor} must exceed low_freq_factor={self.low_freq_factor}: "
                "the pairs between the two wavelengths blend over their difference (Llama 3.1: 4 and 1)"
            )
        return self

    def build(self, *, max_len: int) -> RotaryScaling:
        return Llama3Scaling(
            self.factor,
            self.original_max_len or max_len,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
        )


SCALING_KINDS: dict[str, type[RotaryScalingOptions]] = {
    "linear": LinearScalingOptions,
    "dynamic": DynamicScalingOptions,
    "yarn": YarnScalingOptions,
    "llama3": Llama3ScalingOptions,
}
"""The rotary stretches by kind."""


def _scaling_options(value: Any) -> RotaryScalingOptions:
    """The stretch ``value`` describes: a mapping with its ``kind``, or options already made."""
    if isinstance(value, RotaryScalingOptions):
        return value
    kind = value.get("kind") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind not in SCALING_KINDS:
        raise ValueError(f"a rotary scaling is a mapping with a kind among {', '.join(SCALING_KINDS)}; got {value!r}")
    return SCALING_KINDS[kind].model_validate(value)


RotaryScalingField = Annotated[
    RotaryScalingOptions,
    PlainValidator(_scaling_options),
    PlainSerializer(lambda options, info: options.model_dump(mode=info.mode)),
    # each kind written out where it is used, as the component kinds are, not as a reference
    WithJsonSchema(
        {
            "oneOf": [
                {**schema, "required": sorted({*schema.get("required", ()), "kind"})}
                for schema in (options.model_json_schema() for options in SCALING_KINDS.values())
            ]
        }
    ),
]
"""A rotary stretch of any of the kinds of :data:`SCALING_KINDS`, chosen by its ``kind``."""


class RotaryOptions(PositionalOptions):
    """Rotary embeddings applied to queries and keys inside self-attention (Su et al. 2021)."""

    kind: Literal["rotary"] = "rotary"
    in_attention: ClassVar[bool] = True
    relative: ClassVar[bool] = True
    base: float = Field(10000.0, gt=1.0, description="wavelength base of the rotations")
    layout: RotaryLayout = Field(
        "interleaved",
        description="which channels of a head turn together: interleaved (neighbours 2i and 2i+1: the paper's, "
        "GPT-J's) or halves (channel i with i + r/2 of the r turned: transformers' rotate_half, as in Llama, "
        "Qwen, Gemma, OLMo and GPT-NeoX)",
    )
    fraction: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="the share of each head that turns: its first int(d_head * fraction) channels, an even "
        "number; the others pass unchanged (transformers' partial_rotary_factor: GPT-NeoX, Phi, StableLM)",
    )
    scaling: RotaryScalingField | None = Field(
        None,
        description="how the frequencies stretch past the trained length: kind linear (position "
        "interpolation), dynamic (dynamic NTK), yarn or llama3, with that kind's fields, as transformers' "
        "rope_parameters; null: no stretch",
    )

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return RotaryPositional(
            d_model // n_heads,
            max_len,
            base=self.base,
            layout=self.layout,
            fraction=self.fraction,
            scaling=None if self.scaling is None else self.scaling.build(max_len=max_len),
        )


class ALiBiOptions(PositionalOptions):
    """Linear distance penalties on the attention scores, one slope per head (Press et al. 2022)."""

    kind: Literal["alibi"] = "alibi"
    in_attention: ClassVar[bool] = True
    scores_bias: ClassVar[bool] = True
    relative: ClassVar[bool] = True
    symmetric: bool = Field(
        True, description="penalise distance to later keys too (encoders); causal decoders never see them anyway"
    )

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return ALiBiPositional(n_heads, symmetric=self.symmetric)


# ---- norms --------------------------------------------------------------------------------
class LayerNormOptions(NormOptions):
    """Layer normalisation over the feature axis (Ba et al. 2016)."""

    kind: Literal["layernorm"] = "layernorm"
    eps: float = Field(1e-5, gt=0.0, description="added to the variance for stability")

    def build(self, *, d_model: int) -> nn.Module:
        return nn.LayerNorm(d_model, eps=self.eps)


class RMSNormOptions(NormOptions):
    """Root-mean-square normalisation, no centring (Zhang & Sennrich 2019), scaled by a learned
    ``w`` (``nn.RMSNorm``) or, with ``unit_offset``, by ``1 + w`` (Gemma). Both compute in float32
    and round to the input's dtype once, after the scale."""

    kind: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-6, gt=0.0, description="added to the mean square for stability")
    unit_offset: bool = Field(
        False,
        description="scale by 1 + w, w starting at 0 (Gemma's RMSNorm), rather than by w starting at 1; the "
        "weight is named weight either way",
    )

    def build(self, *, d_model: int) -> nn.Module:
        if self.unit_offset:
            return UnitOffsetRMSNorm(d_model, eps=self.eps)
        return nn.RMSNorm(d_model, eps=self.eps)


class BatchNormOptions(NormOptions):
    """Batch normalisation over batch and time (Ioffe & Szegedy 2015), for comparison; its
    statistics, batch and running, are over real tokens only, padding left out."""

    kind: Literal["batchnorm"] = "batchnorm"
    eps: float = Field(1e-5, gt=0.0, description="added to the variance for stability")
    momentum: float = Field(0.1, gt=0.0, le=1.0, description="running statistics update rate")

    def build(self, *, d_model: int) -> nn.Module:
        return TokenBatchNorm(d_model, eps=self.eps, momentum=self.momentum)


# ---- feed-forward -------------------------------------------------------------------------
Activation = Literal["relu", "relu2", "gelu", "gelu-tanh", "silu"]
"""The non-linearities of the feed-forward kinds (:data:`~transformer_zoo.core.layers.ACTIVATIONS`):
``relu2`` is ``relu(x)^2`` (Primer, So et al. 2021), ``gelu`` is exact, ``gelu-tanh`` GELU's tanh
approximation (GPT-2's; transformers' ``gelu_new`` and ``gelu_pytorch_tanh``)."""


class ActivationOptions(FFNOptions):
    """Base of the feed-forward kinds with a non-linearity (ReLU unless a kind says otherwise):
    ``mlp``, ``gated`` and the experts of ``moe`` (:mod:`transformer_zoo.plugins.moe`)."""

    activation: Activation = Field(
        "relu",
        description="non-linearity: relu, relu2 (relu(x)^2: Primer, So et al. 2021), gelu (exact), gelu-tanh "
        "(GELU's tanh approximation) or silu",
    )


class MLPOptions(ActivationOptions):
    """Two linear maps with an activation between (Vaswani et al. 2017, eq. 2)."""

    kind: Literal["mlp"] = "mlp"
    inner_dropout: bool = Field(
        True, description="dropout between the two projections (nn.Transformer has it, BERT not)"
    )
    bias: bool = Field(True, description="biases on the two projections (GPT-2 has them)")

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        return FeedForward(
            d_model, d_ff, activation=self.activation, dropout=dropout if self.inner_dropout else 0.0, bias=self.bias
        )


class GatedOptions(ActivationOptions):
    """Gated linear unit FFN: GEGLU with gelu, SwiGLU with silu (Shazeer 2020)."""

    kind: Literal["gated"] = "gated"
    activation: Activation = Field("silu", description="non-linearity on the gate (SwiGLU by default)")
    bias: bool = Field(True, description="biases on the projections (Llama, Gemma and OLMo have none)")

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        return GatedFeedForward(d_model, d_ff, activation=self.activation, dropout=dropout, bias=self.bias)


# ---- stacks -------------------------------------------------------------------------------
class StandardOptions(StackOptions):
    """N distinct layers applied in turn."""

    kind: Literal["standard"] = "standard"

    def build(
        self, *, layers: list[nn.Module], final_norm: nn.Module | None, d_model: int, signal: nn.Module | None = None
    ) -> nn.Module:
        return StandardStack(layers, final_norm=final_norm)


# ---- heads --------------------------------------------------------------------------------
class LMOptions(HeadOptions):
    """Next-token logits over the vocabulary: the seq2seq generator and the LM head."""

    kind: Literal["lm"] = "lm"
    tie_weights: bool = Field(True, description="share the output projection with the token embedding")
    bias: bool = Field(False, description="bias on the output projection")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="label smoothing of the cross-entropy")
    softcap: float | None = Field(
        None, gt=0, description="soft-cap the logits: softcap * tanh(logits / softcap) (Gemma 2: 30); null: off"
    )

    def build(
        self, *, d_model: int, vocab_size: int, embedding: nn.Embedding, pad_id: int, dropout: float
    ) -> nn.Module:
        return LMHead(
            d_model,
            vocab_size,
            tied_embedding=embedding if self.tie_weights else None,
            bias=self.bias,
            label_smoothing=self.label_smoothing,
            ignore_index=pad_id,
            softcap=self.softcap,
        )


class SequenceClassificationOptions(HeadOptions):
    """One label per sequence, from the first token or the mean of the real tokens."""

    kind: Literal["sequence-classification"] = "sequence-classification"
    num_classes: int = Field(2, ge=2, le=MAX_VOCAB, description="number of labels")
    pooling: Literal["cls", "mean"] = Field("cls", description="first token (cls) or mean over real tokens")

    def build(
        self, *, d_model: int, vocab_size: int, embedding: nn.Embedding, pad_id: int, dropout: float
    ) -> nn.Module:
        return SequenceClassificationHead(d_model, self.num_classes, pooling=self.pooling, dropout=dropout)


class TokenClassificationOptions(HeadOptions):
    """One label per token (tagging), on an encoder."""

    kind: Literal["token-classification"] = "token-classification"
    num_classes: int = Field(2, ge=2, le=MAX_VOCAB, description="number of labels")

    def build(
        self, *, d_model: int, vocab_size: int, embedding: nn.Embedding, pad_id: int, dropout: float
    ) -> nn.Module:
        return TokenClassificationHead(d_model, self.num_classes, dropout=dropout)


@hookimpl
def tzoo_components():
    return [
        SDPAAttentionOptions,
        MathAttentionOptions,
        SinusoidalOptions,
        LearnedOptions,
        RotaryOptions,
        ALiBiOptions,
        LayerNormOptions,
        RMSNormOptions,
        BatchNormOptions,
        MLPOptions,
        GatedOptions,
        StandardOptions,
        LMOptions,
        SequenceClassificationOptions,
        TokenClassificationOptions,
    ]
