"""The base encoder-decoder's config, and the builders it unpacks into.

A family subclasses :class:`EncoderDecoderConfig` with its paper's defaults. ``build()``
describes the layers once (``layer_spec()``, a :class:`~transformer_zoo.core.options.LayerSpec`)
and unpacks the rest into :func:`build_encoder_decoder`; leave out ``decoder`` for an
encoder-only model, ``encoder`` for a decoder-only one. The builders (:func:`build_encoder_decoder`,
:func:`positional_modules`, :func:`build_stack`, :func:`build_layer`) take the spec, options of
the chosen kinds and plain sizes, and return modules; nothing in them reads a config or calls
back into one (data flows one way: config, builder, modules).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

from pydantic import (
    Field,
    model_validator,
)
from torch import nn

from .attention import AttentionPositional, FirstValues
from .embedding import Embeddings
from .layers import TransformerLayer
from .model import EncoderDecoder
from .options import (
    AttentionOptions,
    HeadField,
    HeadOptions,
    LayerFields,
    LayerSpec,
    PositionalField,
    PositionalOptions,
    StackField,
    StackOptions,
    VariantConfig,
)
from .recurrent import StepSignal
from .validation import (
    MAX_LENGTH,
    MAX_VOCAB,
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
        uses = dict(n_heads=self.n_heads, max_len=self.max_len, positional=self.positional, head_dim=self.head_dim)
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
        return build_encoder_decoder(
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


def build_encoder_decoder(
    layer: LayerSpec,
    *,
    vocab_size: int,
    max_len: int,
    positional: PositionalOptions,
    head: HeadOptions,
    encoder: StackOptions | None = None,
    decoder: StackOptions | None = None,
    tgt_vocab_size: int | None = None,
    pad_id: int = 0,
    share_embeddings: bool = True,
    scale_embeddings: bool = True,
    positions_per_step: bool = False,
) -> EncoderDecoder:
    """The base encoder-decoder, every layer as ``layer`` describes: leave out ``decoder`` for an
    encoder-only model, ``encoder`` for a decoder-only one.

    Args:
        share_embeddings: the decoder reuses the encoder's token table (and a tied head reads it).
        scale_embeddings: embeddings start at N(0, 1/d_model) and are multiplied by sqrt(d_model).
        positions_per_step: a recurrent stack adds additive positions at every step, in its step
            signal (the Universal Transformer's ``P^t``), instead of the embeddings adding them once.
    """
    d_model = layer.d_model
    tied = getattr(head, "tie_weights", False)  # the head reads a token table: see token_embedding
    sides = dict(
        positional=positional, max_len=max_len, scale_embeddings=scale_embeddings, positions_per_step=positions_per_step
    )
    src_embed = built_encoder = tgt_embed = built_decoder = None
    if encoder is not None:
        token = token_embedding(vocab_size, d_model, scaled=scale_embeddings, tied=tied)
        src_embed, built_encoder = build_side(encoder, layer, token, cross=False, **sides)
    if decoder is not None:
        shared = src_embed is not None and share_embeddings
        token = (
            src_embed.token
            if shared
            else token_embedding(tgt_vocab_size or vocab_size, d_model, scaled=scale_embeddings, tied=tied)
        )
        tgt_embed, built_decoder = build_side(decoder, layer, token, cross=encoder is not None, **sides)
    output_vocab = (tgt_vocab_size or vocab_size) if decoder is not None else vocab_size
    built_head = head.build(
        d_model=d_model,
        vocab_size=output_vocab,
        embedding=(tgt_embed or src_embed).token,
        pad_id=pad_id,
        dropout=layer.dropout,
    )
    return EncoderDecoder(
        head=built_head, encoder=built_encoder, src_embed=src_embed, decoder=built_decoder, tgt_embed=tgt_embed
    )


def token_embedding(vocab_size: int, d_model: int, *, scaled: bool, tied: bool = False) -> nn.Embedding:
    """A token table, drawn from N(0, 1/d_model) when it is ``scaled`` (its embeddings multiplied by
    sqrt(d_model)) or ``tied`` (an output layer reads it), else from N(0, 1) (``nn.Embedding``'s)."""
    token = nn.Embedding(vocab_size, d_model)
    if scaled or tied:
        # as in the reference implementation (tensor2tensor): scaled by sqrt(d_model) the inputs have unit
        # variance; and a tied output layer starts with logits of unit scale, not of sqrt(d_model)
        nn.init.normal_(token.weight, std=d_model**-0.5)
    return token


def build_side(
    options: StackOptions,
    layer: LayerSpec,
    token: nn.Embedding,
    *,
    cross: bool,
    positional: PositionalOptions,
    max_len: int,
    scale_embeddings: bool,
    positions_per_step: bool,
) -> tuple[Embeddings, nn.Module]:
    """The embeddings and the stack of one side (encoder or decoder), its layers as ``layer``
    describes with this side's in-attention positions."""
    d_model = layer.d_model
    additive, in_attention = positional_modules(
        positional, d_model=d_model, n_heads=layer.n_heads, max_len=max_len, head_dim=layer.head_dim
    )
    signal, random_offset = None, positional.random_offset
    if options.recurrent and positions_per_step:
        signal = StepSignal(d_model, options.layers, positional=additive, random_offset=random_offset)
        additive = None
    embed = Embeddings(
        token,
        positional=additive,
        scale=math.sqrt(d_model) if scale_embeddings else 1.0,
        dropout=layer.dropout,
        random_offset=random_offset,
    )
    return embed, build_stack(options, replace(layer, in_attention=in_attention), cross=cross, signal=signal)


def positional_modules(
    options: PositionalOptions, *, d_model: int, n_heads: int, max_len: int, head_dim: int | None = None
) -> tuple[nn.Module | None, AttentionPositional | None]:
    """The scheme ``options`` describe, built: ``(additive module, None)`` for one added to the
    embeddings (sinusoidal, learned), ``(None, scheme)`` for one acting inside attention (rotary, ALiBi).

    An additive module is built for ``max_len + options.random_offset`` positions, room for the
    random starts its caller adds in training (:func:`~.embedding.position_starts`). A scheme
    acting inside attention is built for the attention's width, ``n_heads * head_dim`` when the
    heads' width is set apart from ``d_model / n_heads``.
    """
    if options.in_attention and head_dim is not None:
        d_model = n_heads * head_dim
    positional = options.build(d_model=d_model, n_heads=n_heads, max_len=max_len + options.random_offset)
    if isinstance(positional, AttentionPositional) != options.in_attention:
        raise ValueError(
            f"{options.kind} positions ({type(options).__name__}) built a {type(positional).__name__}, but the "
            f"options declare in_attention = {options.in_attention}: a scheme acting inside attention returns an "
            "AttentionPositional and sets in_attention = True; one added to the embeddings does neither"
        )
    if not options.in_attention:
        return positional, None
    if options.random_offset:
        raise ValueError(
            f"random_offset shifts additive positions, but {options.kind} positions act inside attention; "
            f"remove random_offset, or use sinusoidal or learned positions"
        )
    return None, positional


def build_layer(
    layer: LayerSpec,
    attention: AttentionOptions,
    *,
    cross_attention: AttentionOptions | None = None,
    rezero: bool = False,
) -> TransformerLayer:
    """A layer as ``layer`` describes, with self-attention of kind ``attention`` and, when
    ``cross_attention`` is given, attention to an encoder memory (without the in-attention positions
    or the stack's value residual, which are self-attention's).

    The norms go where ``layer.norm_placement`` says, one per sub-layer (``norms.i``), and with
    ``sandwich`` a second one on each sub-layer's output (``post_norms.i``).

    Args:
        rezero: ReZero residuals (Bachlechner et al. 2020): each branch scaled by a learned
            ``alpha`` starting at 0, and no norms (the spec's norm and placement are then unused).
    """
    if layer.ffn is None or layer.norm is None:
        raise ValueError("a layer needs its feed-forward and norm kinds: give the LayerSpec ffn and norm")
    count = 2 if cross_attention is None else 3
    norm = layer.norm

    def norms() -> list[nn.Module]:
        return [nn.Identity() if rezero else norm.build(d_model=layer.d_model) for _ in range(count)]

    cross_layer = replace(layer, in_attention=None, first_values=None)
    return TransformerLayer(
        attention.build(layer),
        layer.ffn.build(d_model=layer.d_model, d_ff=layer.d_ff, dropout=layer.dropout),
        norms(),
        cross_attn=None if cross_attention is None else cross_attention.build(cross_layer),
        post_norms=norms() if layer.norm_placement == "sandwich" and not rezero else None,
        dropout=layer.dropout,
        placement=layer.norm_placement,
        rezero=rezero,
        spec=layer,
    )


def build_stack(
    options: StackOptions, layer: LayerSpec, *, cross: bool = False, signal: nn.Module | None = None
) -> nn.Module:
    """The stack ``options`` describe, given its layers built as ``layer`` describes: layer ``i``
    takes the stack's ``i``-th attention kind (and its cross-attention kind when ``cross``), and a
    norm follows the last layer when ``layer.uses_final_norm``. With ``options.value_residual`` the
    layers' self-attention modules share one :class:`~.attention.FirstValues` (value residual
    learning, Zhou et al. 2024): the first keeps its values there, the later ones mix them in.

    Args:
        signal: what a recurrent stack adds before each step (:class:`~.recurrent.StepSignal`); None
            for the default, the step index alone. Only recurrent kinds take one.
    """
    if signal is not None and not options.recurrent:
        raise ValueError(f"a {options.kind!r} stack applies distinct layers and takes no step signal")
    if options.value_residual:
        layer = replace(layer, first_values=FirstValues())
    layers = [
        build_layer(
            replace(layer, depth=i),
            options.attention_at(i),
            cross_attention=options.cross_attention if cross else None,
            rezero=options.rezero,
        )
        for i in range(options.layer_count)
    ]
    final_norm = layer.norm.build(d_model=layer.d_model) if layer.uses_final_norm else None
    return options.build(layers=layers, final_norm=final_norm, d_model=layer.d_model, signal=signal)
