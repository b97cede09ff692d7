"""The config of the base encoder-decoder, shared by every family built on it.

A family subclasses :class:`EncoderDecoderConfig`, sets ``family`` and its paper's defaults;
``build()`` describes the layers once (:meth:`~transformer_zoo.core.options.VariantConfig.layer_spec`)
and unpacks the rest into :func:`~transformer_zoo.core.builders.encoder_decoder`, which returns an
:class:`~transformer_zoo.core.model.EncoderDecoder`. Leave out ``decoder`` for an encoder-only
model and ``encoder`` for a decoder-only one.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from . import builders
from .model import EncoderDecoder
from .options import (
    MAX_LENGTH,
    MAX_VOCAB,
    HeadField,
    LayerFields,
    PositionalField,
    StackField,
    VariantConfig,
)


class EncoderDecoderConfig(VariantConfig, LayerFields):
    """Every option of the base encoder-decoder: the layer-wide fields of
    :class:`~transformer_zoo.core.options.LayerFields` (widths, dropout, norm and its placement,
    feed-forward), and the embeddings, stacks and head below."""

    positions_per_step: ClassVar[bool] = False
    """Whether a recurrent stack adds the positions at every step, in its step signal (the
    Universal Transformer's ``P^t``), rather than once to the embeddings."""

    vocab_size: int = Field(
        32000, ge=1, le=MAX_VOCAB, description="token vocabulary of the source (and target, unless tgt_vocab_size)"
    )
    tgt_vocab_size: int | None = Field(
        None, ge=1, le=MAX_VOCAB, description="target vocabulary when it differs; None: vocab_size"
    )
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
    encoder: StackField | None = Field(
        {"layers": 6}, validate_default=True, description="encoder stack; null for a decoder-only model"
    )
    decoder: StackField | None = Field(
        {"layers": 6}, validate_default=True, description="decoder stack; null for an encoder-only model"
    )
    head: HeadField = Field("lm", validate_default=True, description="task head on the last stack")

    @model_validator(mode="after")
    def _check(self) -> EncoderDecoderConfig:
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
        uses = dict(n_heads=self.n_heads, max_len=self.max_len, positional=self.positional)
        for name, stack, decoder in (("encoder", self.encoder, False), ("decoder", self.decoder, True)):
            try:
                if stack is not None:  # a decoder's self-attention is causal
                    stack.check(causal=decoder, cross=decoder and self.encoder is not None, **uses)
            except ValueError as error:
                raise ValueError(f"{name}.{error}") from None
        return self

    @property
    def output_vocab_size(self) -> int:
        return (self.tgt_vocab_size or self.vocab_size) if self.decoder is not None else self.vocab_size

    def build(self) -> EncoderDecoder:
        return builders.encoder_decoder(
            self.layer_spec(),
            vocab_size=self.vocab_size,
            tgt_vocab_size=self.tgt_vocab_size,
            max_len=self.max_len,
            pad_id=self.pad_id,
            share_embeddings=self.share_embeddings,
            scale_embeddings=self.scale_embeddings,
            positional=self.positional,
            head=self.head,
            encoder=self.encoder,
            decoder=self.decoder,
            positions_per_step=self.positions_per_step,
        )
