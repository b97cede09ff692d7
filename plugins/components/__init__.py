"""The generic components every family composes: attention, positions, norms, FFNs, stacks, heads.

Papers: Vaswani et al. 2017 (scaled dot-product attention, sinusoids, post-norm), Ba et al.
2016 (layer norm), Zhang & Sennrich 2019 (RMS norm), Ioffe & Szegedy 2015 (batch norm),
Shazeer 2020 (gated FFNs), Su et al. 2021 (rotary), Press et al. 2022 (ALiBi); mixtures of
experts: Shazeer et al. 2017, Lepikhin et al. 2020 (GShard), Fedus et al. 2021 (Switch Transformer).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from torch import nn

from transformer_zoo.core.attention import MathAttention
from transformer_zoo.core.builders import recurrent_stack
from transformer_zoo.core.heads import LMHead, SequenceClassificationHead, TokenClassificationHead
from transformer_zoo.core.layers import FeedForward, GatedFeedForward, MixtureOfExperts, TokenBatchNorm
from transformer_zoo.core.options import (
    MAX_EXPERTS,
    MAX_VOCAB,
    AttentionOptions,
    FFNOptions,
    HeadOptions,
    NormOptions,
    PositionalOptions,
    StackOptions,
)
from transformer_zoo.core.positional import (
    ALiBiPositional,
    LearnedPositional,
    RotaryPositional,
    SinusoidalPositional,
)
from transformer_zoo.core.stack import StandardStack
from transformer_zoo.registry import hookimpl


# ---- attention ----------------------------------------------------------------------------
class SDPAAttentionOptions(AttentionOptions):
    """Full multi-head attention on PyTorch's scaled_dot_product_attention."""

    kind: Literal["sdpa"] = "sdpa"


class MathAttentionOptions(AttentionOptions):
    """Full attention written out (no fused kernel): the n x n weights are made, a reference for kernels."""

    kind: Literal["math"] = "math"
    module: ClassVar[type[nn.Module]] = MathAttention

    def module_arguments(self, *, d_model: int, n_heads: int, grid: tuple[int, int] | None) -> dict[str, Any]:
        return {}  # MathAttention runs math_kernel itself


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


class RotaryOptions(PositionalOptions):
    """Rotary embeddings applied to queries and keys inside self-attention (Su et al. 2021)."""

    kind: Literal["rotary"] = "rotary"
    in_attention: ClassVar[bool] = True
    relative: ClassVar[bool] = True
    base: float = Field(10000.0, gt=1.0, description="wavelength base of the rotations")

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return RotaryPositional(d_model // n_heads, max_len, base=self.base)


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
    """Root-mean-square normalisation, no centring (Zhang & Sennrich 2019)."""

    kind: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-6, gt=0.0, description="added to the mean square for stability")

    def build(self, *, d_model: int) -> nn.Module:
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
Activation = Literal["relu", "gelu", "silu"]
"""The non-linearities of the feed-forward kinds (:data:`~transformer_zoo.core.layers.ACTIVATIONS`)."""


class _ActivatedOptions(FFNOptions):
    """What the feed-forward kinds share: a non-linearity (ReLU unless a kind says otherwise)."""

    activation: Activation = Field("relu", description="non-linearity")


class MLPOptions(_ActivatedOptions):
    """Two linear maps with an activation between (Vaswani et al. 2017, eq. 2)."""

    kind: Literal["mlp"] = "mlp"
    inner_dropout: bool = Field(
        True, description="dropout between the two projections (nn.Transformer has it, BERT not)"
    )

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        return FeedForward(d_model, d_ff, activation=self.activation, dropout=dropout if self.inner_dropout else 0.0)


class GatedOptions(_ActivatedOptions):
    """Gated linear unit FFN: GEGLU with gelu, SwiGLU with silu (Shazeer 2020)."""

    kind: Literal["gated"] = "gated"
    activation: Activation = Field("silu", description="non-linearity on the gate (SwiGLU by default)")

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        return GatedFeedForward(d_model, d_ff, activation=self.activation, dropout=dropout)


class MoEOptions(_ActivatedOptions):
    """Mixture of experts: a router sends each token to its top-k of ``experts`` MLPs, each within a
    capacity (Switch Transformer, Fedus et al. 2021, with top-1; Shazeer et al. 2017 and GShard,
    Lepikhin et al. 2020, with top-2). Its load-balancing loss joins the model's loss; the stacks
    report each layer's routing in the output's extras (``moe_tokens``, ``moe_dropped``, ``moe_capacity``)."""

    kind: Literal["moe"] = "moe"
    experts: int = Field(8, ge=1, le=MAX_EXPERTS, description="number of experts, each an MLP of width d_ff")
    top_k: int = Field(1, ge=1, le=2, description="experts per token: 1 (Switch) or 2 (GShard)")
    capacity_factor: float = Field(
        1.25,
        gt=0.0,
        description="expert capacity ceil(capacity_factor * tokens * top_k / "
        "experts); assignments past it are dropped (the token passes through the residual)",
    )
    aux_loss_weight: float = Field(
        0.01,
        ge=0.0,
        description="alpha of the load-balancing loss alpha * experts * sum_i f_i P_i added to the model's loss",
    )

    @model_validator(mode="after")
    def _enough_experts(self) -> MoEOptions:
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} needs at least {self.top_k} experts, got experts={self.experts}")
        return self

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        experts = [FeedForward(d_model, d_ff, activation=self.activation, dropout=dropout) for _ in range(self.experts)]
        return MixtureOfExperts(
            experts,
            d_model=d_model,
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
            aux_loss_weight=self.aux_loss_weight,
        )


# ---- stacks -------------------------------------------------------------------------------
class StandardOptions(StackOptions):
    """N distinct layers applied in turn."""

    kind: Literal["standard"] = "standard"

    def build(
        self, *, layers: list[nn.Module], final_norm: nn.Module | None, d_model: int, signal: nn.Module | None = None
    ) -> nn.Module:
        return StandardStack(layers, final_norm=final_norm)


class RecurrentOptions(StackOptions):
    """One shared layer applied up to ``layers`` times, with optional adaptive computation time
    (Dehghani et al. 2018; Graves 2016)."""

    kind: Literal["recurrent"] = "recurrent"
    recurrent: ClassVar[bool] = True
    act: bool = Field(True, description="adaptive computation time: each position decides how many steps it takes")
    threshold: float = Field(
        0.99,
        gt=0.0,
        lt=1.0,
        description="ACT halts a position when its summed halting probability would pass this (1 - epsilon)",
    )
    ponder_weight: float = Field(0.01, ge=0.0, description="weight of the ponder cost (steps taken) in the loss")
    halting_bias: float = Field(1.0, description="initial bias of the halting unit (higher: halt sooner at first)")

    @field_validator("attention")
    @classmethod
    def _one_kind(cls, attention):
        if isinstance(attention, list) and len(attention) > 1:
            raise ValueError("a recurrent stack shares one layer: give one attention kind, not a list")
        return attention

    def build(
        self, *, layers: list[nn.Module], final_norm: nn.Module | None, d_model: int, signal: nn.Module | None = None
    ) -> nn.Module:
        (layer,) = layers
        return recurrent_stack(
            layer,
            steps=self.layers,
            d_model=d_model,
            signal=signal,
            act=self.act,
            threshold=self.threshold,
            ponder_weight=self.ponder_weight,
            halting_bias=self.halting_bias,
            final_norm=final_norm,
        )


# ---- heads --------------------------------------------------------------------------------
class LMOptions(HeadOptions):
    """Next-token logits over the vocabulary: the seq2seq generator and the LM head."""

    kind: Literal["lm"] = "lm"
    tie_weights: bool = Field(True, description="share the output projection with the token embedding")
    bias: bool = Field(False, description="bias on the output projection")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="label smoothing of the cross-entropy")

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
        MoEOptions,
        StandardOptions,
        RecurrentOptions,
        LMOptions,
        SequenceClassificationOptions,
        TokenClassificationOptions,
    ]
