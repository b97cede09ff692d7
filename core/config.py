"""The config of the base encoder-decoder, shared by every family built on it.

A family subclasses :class:`EncoderDecoderConfig`, sets ``family`` and its paper's defaults;
``build()`` unpacks the config into :func:`~transformer_zoo.core.builders.encoder_decoder`,
which returns an :class:`~transformer_zoo.core.model.EncoderDecoder`. Leave out ``decoder`` for an
encoder-only model and ``encoder`` for a decoder-only one.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from torch import nn

from . import builders
from .attention import AttentionPositional
from .model import EncoderDecoder
from .options import (
    MAX_LENGTH,
    MAX_VOCAB,
    MAX_WIDTH,
    FFNField,
    HeadField,
    NormField,
    PositionalField,
    StackField,
    StackOptions,
    VariantConfig,
)


class EncoderDecoderConfig(VariantConfig):
    """Every option of the base encoder-decoder."""

    positions_per_step: ClassVar[bool] = False
    """Whether a recurrent stack adds the positions at every step, in its step signal (the
    Universal Transformer's ``P^t``), rather than once to the embeddings."""

    vocab_size: int = Field(
        32000, ge=1, le=MAX_VOCAB, description="token vocabulary of the source (and target, unless tgt_vocab_size)"
    )
    tgt_vocab_size: int | None = Field(
        None, ge=1, le=MAX_VOCAB, description="target vocabulary when it differs; None: vocab_size"
    )
    d_model: int = Field(512, ge=1, le=MAX_WIDTH, description="model width")
    n_heads: int = Field(8, ge=1, le=MAX_WIDTH, description="attention heads; must divide d_model")
    d_ff: int = Field(2048, ge=1, le=MAX_WIDTH, description="inner width of the feed-forward network")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on residuals, embeddings and attention weights")
    max_len: int = Field(
        1024,
        ge=1,
        le=MAX_LENGTH,
        description="positions the model is built for: learned positions have a vector for each and refuse longer inputs; sinusoidal and rotary compute more on demand, and alibi, t5-bias and shaw take any length",
    )
    pad_id: int = Field(0, ge=0, le=MAX_VOCAB, description="padding token id, ignored by token losses")
    share_embeddings: bool = Field(
        True, description="one embedding table for source and target (needs equal vocabularies)"
    )
    scale_embeddings: bool = Field(True, description="multiply embeddings by sqrt(d_model)")
    positional: PositionalField = Field("sinusoidal", validate_default=True, description="positional encoding")
    norm: NormField = Field("layernorm", validate_default=True, description="normalisation layer")
    norm_placement: Literal["pre", "post"] = Field(
        "post", description="norm before each sub-layer (pre) or after the residual (post)"
    )
    final_norm: bool | None = Field(
        None, description="norm after the last layer of each stack; None: only with pre placement"
    )
    ffn: FFNField = Field("mlp", validate_default=True, description="position-wise feed-forward network")
    encoder: StackField | None = Field(
        {"layers": 6}, validate_default=True, description="encoder stack; null for a decoder-only model"
    )
    decoder: StackField | None = Field(
        {"layers": 6}, validate_default=True, description="decoder stack; null for an encoder-only model"
    )
    head: HeadField = Field("lm", validate_default=True, description="task head on the last stack")

    @model_validator(mode="after")
    def _check(self) -> EncoderDecoderConfig:
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"choose n_heads among {divisors} or change d_model"
            )
        if self.encoder is None and self.decoder is None:
            raise ValueError("encoder and decoder are both null; keep at least one stack")
        if self.share_embeddings and self.encoder is not None and self.decoder is not None:
            if self.tgt_vocab_size not in (None, self.vocab_size):
                raise ValueError(
                    f"share_embeddings needs one vocabulary, but vocab_size={self.vocab_size} and "
                    f"tgt_vocab_size={self.tgt_vocab_size}; set share_embeddings: false or make them equal"
                )
        if self.pad_id >= min(self.vocab_size, self.tgt_vocab_size or self.vocab_size):
            raise ValueError(f"pad_id={self.pad_id} is outside the vocabulary (vocab_size={self.vocab_size})")
        for name, stack in (("encoder", self.encoder), ("decoder", self.decoder)):
            if stack is None:
                continue
            listed = isinstance(stack.attention, list)
            for index, kind in enumerate(stack.attention if listed else [stack.attention]):
                try:
                    kind.check(max_len=self.max_len)
                    kind.check_heads(self.n_heads)
                    kind.check_positional(self.positional)
                    if name == "decoder":  # a decoder's self-attention is causal
                        kind.check_causal()
                except ValueError as error:
                    raise ValueError(f"{name}.attention{f'.{index}' if listed else ''}: {error}") from None
        if self.encoder is not None and self.decoder is not None:
            try:
                self.decoder.cross_attention.check_cross_attention()
                self.decoder.cross_attention.check_heads(self.n_heads)
            except ValueError as error:
                raise ValueError(f"decoder.cross_attention: {error}") from None
        return self

    @property
    def output_vocab_size(self) -> int:
        return (self.tgt_vocab_size or self.vocab_size) if self.decoder is not None else self.vocab_size

    @property
    def uses_final_norm(self) -> bool:
        return self.norm_placement == "pre" if self.final_norm is None else self.final_norm

    def positional_modules(self) -> tuple[nn.Module | None, AttentionPositional | None]:
        """The positional scheme built: ``(additive module or None, in-attention scheme or None)``."""
        return builders.positional_modules(
            self.positional, d_model=self.d_model, n_heads=self.n_heads, max_len=self.max_len
        )

    def stack(
        self,
        options: StackOptions,
        *,
        cross: bool,
        in_attention: AttentionPositional | None,
        final_norm: bool | None = None,
    ) -> nn.Module:
        """One of the model's stacks, with this config's sizes, norm and feed-forward kinds (for a
        family that builds its own embeddings, as BERT does)."""
        return builders.stack(
            options,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            ffn=self.ffn,
            norm=self.norm,
            pre_norm=self.norm_placement == "pre",
            final_norm=self.uses_final_norm if final_norm is None else final_norm,
            cross=cross,
            positional=in_attention,
        )

    def build(self) -> EncoderDecoder:
        return builders.encoder_decoder(
            vocab_size=self.vocab_size,
            tgt_vocab_size=self.tgt_vocab_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            max_len=self.max_len,
            pad_id=self.pad_id,
            share_embeddings=self.share_embeddings,
            scale_embeddings=self.scale_embeddings,
            positional=self.positional,
            norm=self.norm,
            ffn=self.ffn,
            head=self.head,
            encoder=self.encoder,
            decoder=self.decoder,
            pre_norm=self.norm_placement == "pre",
            final_norm=self.uses_final_norm,
            positions_per_step=self.positions_per_step,
        )
