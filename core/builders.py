"""Builders: functions that assemble modules from explicit arguments.

A family's config validates what a user wrote, then unpacks it into these functions: options
of the chosen kinds and plain sizes go in, ready modules come out. Nothing here reads a config
object or calls back into one (data flows one way: config, builder, modules).

- :func:`encoder_decoder`: the whole base model: embeddings, the encoder and/or decoder stacks,
  the head;
- :func:`positional_modules`: a positional scheme built, additive or in-attention;
- :func:`transformer_layer`: one layer, self-attention (and cross-attention), a feed-forward
  network and their norms;
- :func:`stack`: the layers a stack kind asks for, handed to it built;
- :func:`recurrent_stack`: one shared layer applied step after step, with its step signal and
  optional adaptive computation time.
"""

from __future__ import annotations

import math

from torch import nn

from .attention import AttentionPositional
from .embedding import Embeddings
from .layers import TransformerLayer
from .model import EncoderDecoder
from .options import AttentionOptions, FFNOptions, HeadOptions, NormOptions, PositionalOptions, StackOptions
from .stack import RecurrentStack, StepSignal


def encoder_decoder(
    *,
    vocab_size: int,
    d_model: int,
    n_heads: int,
    d_ff: int,
    dropout: float,
    max_len: int,
    positional: PositionalOptions,
    norm: NormOptions,
    ffn: FFNOptions,
    head: HeadOptions,
    encoder: StackOptions | None = None,
    decoder: StackOptions | None = None,
    tgt_vocab_size: int | None = None,
    pad_id: int = 0,
    share_embeddings: bool = True,
    scale_embeddings: bool = True,
    pre_norm: bool = False,
    final_norm: bool = False,
    positions_per_step: bool = False,
) -> EncoderDecoder:
    """The base encoder-decoder: leave out ``decoder`` for an encoder-only model, ``encoder`` for
    a decoder-only one.

    Args:
        share_embeddings: the decoder reuses the encoder's token table (and a tied head reads it).
        scale_embeddings: embeddings start at N(0, 1/d_model) and are multiplied by sqrt(d_model).
        final_norm: a norm after the last layer of each stack.
        positions_per_step: a recurrent stack adds additive positions at every step, in its step
            signal (the Universal Transformer's ``P^t``), instead of the embeddings adding them once.
    """
    layers = dict(
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        dropout=dropout,
        ffn=ffn,
        norm=norm,
        pre_norm=pre_norm,
        final_norm=final_norm,
    )
    sides = dict(
        positional=positional,
        max_len=max_len,
        scale_embeddings=scale_embeddings,
        positions_per_step=positions_per_step,
        layers=layers,
    )
    src_embed = built_encoder = tgt_embed = built_decoder = None
    if encoder is not None:
        token = token_embedding(vocab_size, d_model, scaled=scale_embeddings)
        src_embed, built_encoder = embedded_stack(encoder, token, cross=False, **sides)
    if decoder is not None:
        shared = src_embed is not None and share_embeddings
        token = (
            src_embed.token
            if shared
            else token_embedding(tgt_vocab_size or vocab_size, d_model, scaled=scale_embeddings)
        )
        tgt_embed, built_decoder = embedded_stack(decoder, token, cross=encoder is not None, **sides)
    output_vocab = (tgt_vocab_size or vocab_size) if decoder is not None else vocab_size
    built_head = head.build(
        d_model=d_model,
        vocab_size=output_vocab,
        embedding=(tgt_embed or src_embed).token,
        pad_id=pad_id,
        dropout=dropout,
    )
    return EncoderDecoder(
        head=built_head, encoder=built_encoder, src_embed=src_embed, decoder=built_decoder, tgt_embed=tgt_embed
    )


def token_embedding(vocab_size: int, d_model: int, *, scaled: bool) -> nn.Embedding:
    """A token table; ``scaled``: drawn from N(0, 1/d_model), for embeddings multiplied by sqrt(d_model)."""
    token = nn.Embedding(vocab_size, d_model)
    if scaled:
        # as in the reference implementation (tensor2tensor): scaled by sqrt(d_model) the inputs have unit
        # variance, and a tied output layer starts with logits of unit scale
        nn.init.normal_(token.weight, std=d_model**-0.5)
    return token


def embedded_stack(
    options: StackOptions,
    token: nn.Embedding,
    *,
    cross: bool,
    positional: PositionalOptions,
    max_len: int,
    scale_embeddings: bool,
    positions_per_step: bool,
    layers: dict,
) -> tuple[Embeddings, nn.Module]:
    """The embeddings and the stack of one side (encoder or decoder). ``layers`` holds the
    :func:`stack` arguments every layer shares (sizes, dropout, ffn, norm and its placement)."""
    d_model, dropout = layers["d_model"], layers["dropout"]
    additive, in_attention = positional_modules(positional, d_model=d_model, n_heads=layers["n_heads"], max_len=max_len)
    signal, random_offset = None, positional.random_offset
    if options.recurrent and positions_per_step:
        signal = StepSignal(d_model, options.layers, positional=additive, random_offset=random_offset)
        additive = None
    embed = Embeddings(
        token,
        positional=additive,
        scale=math.sqrt(d_model) if scale_embeddings else 1.0,
        dropout=dropout,
        random_offset=random_offset,
    )
    return embed, stack(options, **layers, cross=cross, positional=in_attention, signal=signal)


def positional_modules(
    options: PositionalOptions, *, d_model: int, n_heads: int, max_len: int
) -> tuple[nn.Module | None, AttentionPositional | None]:
    """The scheme ``options`` describe, built: ``(additive module, None)`` for one added to the
    embeddings (sinusoidal, learned), ``(None, scheme)`` for one acting inside attention (rotary, ALiBi).

    An additive module is built for ``max_len + options.random_offset`` positions, room for the
    random starts its caller adds in training (:func:`~.positional.position_starts`).
    """
    positional = options.build(d_model=d_model, n_heads=n_heads, max_len=max_len + options.random_offset)
    if not isinstance(positional, AttentionPositional):
        return positional, None
    if options.random_offset:
        raise ValueError(
            f"random_offset shifts additive positions, but {options.kind} positions act inside attention; "
            f"remove random_offset, or use sinusoidal or learned positions"
        )
    return None, positional


def transformer_layer(
    *,
    d_model: int,
    n_heads: int,
    d_ff: int,
    dropout: float,
    attention: AttentionOptions,
    ffn: FFNOptions,
    norm: NormOptions,
    pre_norm: bool = False,
    cross_attention: AttentionOptions | None = None,
    positional: AttentionPositional | None = None,
    grid: tuple[int, int] | None = None,
    rezero: bool = False,
) -> TransformerLayer:
    """A layer with self-attention of kind ``attention`` and, when ``cross_attention`` is given,
    attention to an encoder memory.

    Args:
        rezero: ReZero residuals (Bachlechner et al. 2020): each branch scaled by a learned
            ``alpha`` starting at 0, and no norms (``norm`` and ``pre_norm`` are then unused).
        positional: an in-attention positional scheme (rotary, ALiBi) for the self-attention.
        grid: ``(rows, columns)`` of the token grid in image models (local 2-D attention reads it);
            None for sequences.
    """

    def attend(options: AttentionOptions, scheme: AttentionPositional | None) -> nn.Module:
        return options.build(d_model=d_model, n_heads=n_heads, dropout=dropout, positional=scheme, grid=grid)

    return TransformerLayer(
        attend(attention, positional),
        ffn.build(d_model=d_model, d_ff=d_ff, dropout=dropout),
        [nn.Identity() if rezero else norm.build(d_model=d_model) for _ in range(2 if cross_attention is None else 3)],
        cross_attn=None if cross_attention is None else attend(cross_attention, None),
        dropout=dropout,
        pre_norm=pre_norm,
        rezero=rezero,
    )


def stack(
    options: StackOptions,
    *,
    d_model: int,
    n_heads: int,
    d_ff: int,
    dropout: float,
    ffn: FFNOptions,
    norm: NormOptions,
    pre_norm: bool = False,
    final_norm: bool = False,
    cross: bool = False,
    positional: AttentionPositional | None = None,
    signal: nn.Module | None = None,
    grid: tuple[int, int] | None = None,
) -> nn.Module:
    """The stack ``options`` describe, given its layers built: layer ``i`` takes the stack's
    ``i``-th attention kind (and its cross-attention kind when ``cross``).

    Args:
        final_norm: put a norm after the last layer (pre-norm models need it).
        signal: what a recurrent stack adds before each step (:class:`~.stack.StepSignal`); None
            for the default, the step index alone. Only recurrent kinds take one.
        grid: as for :func:`transformer_layer`.
    """
    if signal is not None and not options.recurrent:
        raise ValueError(f"a {options.kind!r} stack applies distinct layers and takes no step signal")
    layers = [
        transformer_layer(
            d_model=d_model,
            n_heads=n_heads,
            d_ff=d_ff,
            dropout=dropout,
            attention=options.attention_at(i),
            ffn=ffn,
            norm=norm,
            pre_norm=pre_norm,
            cross_attention=options.cross_attention if cross else None,
            positional=positional,
            grid=grid,
            rezero=options.rezero,
        )
        for i in range(options.layer_count)
    ]
    return options.build(
        layers=layers, final_norm=norm.build(d_model=d_model) if final_norm else None, d_model=d_model, signal=signal
    )


def recurrent_stack(
    layer: nn.Module,
    *,
    steps: int,
    d_model: int,
    signal: nn.Module | None = None,
    act: bool = True,
    threshold: float = 0.99,
    ponder_weight: float = 0.01,
    halting_bias: float = 1.0,
    final_norm: nn.Module | None = None,
) -> RecurrentStack:
    """``layer`` applied up to ``steps`` times (Dehghani et al. 2018), each step adding ``signal``
    (default: the sinusoid of the step index), with ACT halting when ``act`` (Graves 2016): a
    halting unit ``Linear(d_model, 1)`` whose bias starts at ``halting_bias``."""
    halting = None
    if act:
        halting = nn.Linear(d_model, 1)
        nn.init.constant_(halting.bias, halting_bias)
    return RecurrentStack(
        layer,
        steps,
        signal=signal if signal is not None else StepSignal(d_model, steps),
        halting=halting,
        threshold=threshold,
        ponder_weight=ponder_weight,
        final_norm=final_norm,
    )
