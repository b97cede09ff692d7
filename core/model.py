"""The base encoder-decoder, from which encoder-only and decoder-only models are configured.

``EncoderDecoder`` composes embeddings, an encoder stack, a decoder stack and a head (the
language-model head, :class:`LMHead`, is here; the others in :mod:`.heads`); it owns no
attention, norm or positional logic of its own. Leave out the decoder for an encoder-only model
(BERT), the encoder for a decoder-only one (a language model).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionMask, as_padding_mask
from .cache import DecoderCache
from .decoding import generate
from .embedding import check_tensor, check_token_ids, draw_starts
from .layers import StackOutput
from .output import ModelOutput
from .tasks import Phase
from .weights import save_folder


class ZooModel(nn.Module):
    """Base of every model the zoo builds: it knows its config and can save itself."""

    category: ClassVar[str] = "model"

    config: Any = None  # the validated config, set by ``transformer_zoo.build_model``
    exporters: dict[
        str, Callable[..., Path]
    ] = {}  # replaced, never changed: by format, the savers of its family (build_model)

    def phases(self) -> list[Phase]:
        """The optimizers of a training step, in the order they step: by default one, over
        every parameter."""
        return [Phase("model", tuple(self.parameters()))]

    def loss(self, output: ModelOutput, targets: Tensor) -> Tensor:
        """The head's loss on ``output.logits`` plus any auxiliary term of the stacks (ponder cost,
        the load-balancing loss of mixtures of experts)."""
        loss = self.head.loss(output.logits, targets)
        return loss if output.aux_loss is None else loss + output.aux_loss

    def labelled(self, output: ModelOutput, labels: Tensor | None) -> ModelOutput:
        """``output`` with its ``loss`` set from ``labels`` (a forward's ``labels=``), when given."""
        if labels is not None:
            output.loss = self.loss(output, labels)
        return output

    def generate(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None, **options: Any) -> Tensor:
        """Generate token ids, as Hugging Face's ``model.generate``: greedy, beam search
        (``num_beams``) or sampling (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
        ``min_p``, ``seed``). See :func:`~transformer_zoo.core.decoding.generate` for every
        option, and the README's first example; a model without a decoder says it cannot."""
        return generate(self, input_ids, attention_mask, **options)

    def save_pretrained(self, directory: str | os.PathLike, *, format: str = "zoo", **options: Any) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``, in the zoo's own
        layout or another ``format`` a plugin writes (:func:`~.weights.save_folder`); load with
        ``transformer_zoo.from_pretrained``."""
        return save_folder(self, directory, format=format, **options)


class EncoderDecoder(ZooModel):
    """Embeddings, an encoder and/or a decoder stack, and a head.

    Args:
        head: maps the last hidden states to logits; has ``loss(logits, targets)``.
        encoder: the encoder stack, or None (decoder-only).
        src_embed: the encoder's embeddings, given with ``encoder``.
        decoder: the decoder stack, or None (encoder-only).
        tgt_embed: the decoder's embeddings, given with ``decoder``.
    """

    def __init__(
        self,
        *,
        head: nn.Module,
        encoder: nn.Module | None = None,
        src_embed: nn.Module | None = None,
        decoder: nn.Module | None = None,
        tgt_embed: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if encoder is None and decoder is None:
            raise ValueError("a model needs an encoder, a decoder, or both")
        if (encoder is None) != (src_embed is None) or (decoder is None) != (tgt_embed is None):
            raise ValueError("each stack needs its embeddings: pass encoder with src_embed, decoder with tgt_embed")
        self.src_embed, self.encoder = src_embed, encoder
        self.tgt_embed, self.decoder = tgt_embed, decoder
        self.head = head

    @property
    def architecture(self) -> str:
        """``encoder-decoder``, ``encoder-only`` or ``decoder-only``."""
        if self.encoder is None:
            return "decoder-only"
        return "encoder-only" if self.decoder is None else "encoder-decoder"

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False, starts: Tensor | None = None
    ) -> StackOutput:
        """Encode ``src`` ids ``(B, S)``; ``src_mask`` ``(B, S)`` is 1 for real tokens, 0 for padding.

        ``starts``: in training with random position offsets, the batch's starts
        (:func:`~.embedding.draw_starts`), which :meth:`forward` gives the encoder and the decoder
        alike; None: the encoder draws its own.
        """
        if self.encoder is None:
            raise ValueError("this model is decoder-only: it has no encoder to encode with")
        check_token_ids(src, name="src")
        padding = as_padding_mask(src_mask, src, "src_mask")
        x = self.src_embed(src, starts=starts)
        return self.encoder(
            x,
            self_mask=AttentionMask(padding=padding),
            need_weights=need_weights,
            **({} if starts is None else {"starts": starts}),
        )

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None = None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
        starts: Tensor | None = None,
    ) -> StackOutput:
        """Run the causal decoder on ``tgt`` ids ``(B, T)``, attending to ``memory`` ``(B, S, D)``.

        With a ``cache``, ``tgt`` holds only the new tokens; earlier ones are read from the cache,
        and a cache's ``left_padding`` starts each row's positions at its first real token.
        ``starts``: as for :meth:`encode`.
        """
        if self.decoder is None:
            raise ValueError("this model is encoder-only: it has no decoder to decode with")
        if self.encoder is not None and memory is None:
            raise ValueError("this encoder-decoder needs the encoder memory to decode; call encode() first")
        check_token_ids(tgt, name="tgt" if self.encoder is not None else "token ids")
        offset = 0 if cache is None else cache.offset
        padding = None
        if tgt_mask is not None and isinstance(offset, Tensor):
            raise ValueError(
                "a static cache decodes without tgt_mask (no padding among the decoded tokens); "
                "use the dynamic cache (DecoderCache) to pass one"
            )
        if tgt_mask is not None:
            if not isinstance(tgt_mask, Tensor):
                raise ValueError(
                    f"tgt_mask must be a torch.Tensor of shape (batch, seq), got {type(tgt_mask).__name__}"
                )
            if tgt_mask.shape != (tgt.size(0), offset + tgt.size(1)):
                raise ValueError(
                    f"tgt_mask has shape {tuple(tgt_mask.shape)}; expected {(tgt.size(0), offset + tgt.size(1))} "
                    "(batch, all target positions so far), 1 for real tokens and 0 for padding"
                )
            padding = tgt_mask.bool()
        memory_padding = None
        if src_mask is not None and memory is not None:
            check_tensor(src_mask, "src_mask", "of shape (batch, source positions)")
            if src_mask.shape != memory.shape[:2]:
                raise ValueError(
                    f"src_mask has shape {tuple(src_mask.shape)} but the memory covers {tuple(memory.shape[:2])} "
                    "(batch, source positions); give the mask the source ids were encoded with"
                )
            memory_padding = src_mask.bool()
        first = offset if cache is None or cache.left_padding is None else offset - cache.left_padding
        out = self.decoder(
            self.tgt_embed(tgt, first, starts=starts),
            memory,
            self_mask=AttentionMask(padding=padding, causal=True),
            memory_mask=AttentionMask(padding=memory_padding),
            cache=cache,
            need_weights=need_weights,
            **({} if starts is None else {"starts": starts}),
        )
        if cache is not None:
            cache.offset += tgt.size(1)
        return out

    def forward(
        self,
        src: Tensor | None = None,
        tgt: Tensor | None = None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        need_weights: bool = False,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> ModelOutput:
        """Logits for a batch (and the loss, given ``labels``).

        Encoder-decoder: ``model(src, tgt)``; encoder-only: ``model(src)``; decoder-only:
        ``model(tgt=ids)`` or simply ``model(ids)``. Ids are ``(B, T)`` tensors of ``torch.long``
        (or ``int32``), ``B`` and ``T`` at least 1; masks are ``(B, T)``, 1 for real tokens and 0
        for padding. Anything else (a list, a numpy array, ``uint8`` ids, an empty batch) is a
        ValueError saying what was expected.

        ``labels`` are the targets of the logits, position by position, as :meth:`ZooModel.loss`
        takes them (for a language model, the ids shifted by one: nothing is shifted here);
        ``out.loss`` is then set. ``output_attentions=True``, ``transformers``' name, is
        ``need_weights=True``.
        """
        need_weights = need_weights or bool(output_attentions)
        if self.encoder is None and tgt is None:  # decoder-only: the one sequence may come as src
            if src_mask is not None and tgt_mask is not None:
                raise ValueError("this model is decoder-only: give one mask (tgt_mask), not src_mask and tgt_mask")
            src, tgt, src_mask, tgt_mask = None, src, None, tgt_mask if tgt_mask is not None else src_mask
        if self.encoder is not None and src is None:
            raise ValueError(f"this {self.architecture} model needs src token ids (batch, seq)")
        if self.decoder is not None and tgt is None:
            raise ValueError("this encoder-decoder model needs tgt token ids (batch, seq) as well as src")
        if self.decoder is None and tgt is not None:
            raise ValueError("this model is encoder-only: pass only src (and src_mask)")
        if self.encoder is None and (src is not None or src_mask is not None):
            raise ValueError("this model is decoder-only: pass one sequence, as tgt (and tgt_mask)")
        if src is not None and tgt is not None:
            check_token_ids(src, name="src")
            check_token_ids(tgt, name="tgt")
            if src.size(0) != tgt.size(0):
                raise ValueError(f"src has batch size {src.size(0)} but tgt has {tgt.size(0)}; they must be equal")

        # one random position start per example (in training, with random offsets), shared by both sides
        ids = src if src is not None else tgt
        batched = isinstance(ids, Tensor) and ids.dim() > 0  # encode/decode refuse the rest, naming the input
        starts = draw_starts(self, ids.size(0)) if batched else None
        enc = self.encode(src, src_mask, need_weights=need_weights, starts=starts) if self.encoder is not None else None
        dec = None
        if self.decoder is not None:
            memory = None if enc is None else enc.hidden
            dec = self.decode(
                tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=need_weights, starts=starts
            )
        last, mask = (dec, tgt_mask) if dec is not None else (enc, src_mask)
        logits = self.head(last.hidden, None if mask is None else mask.bool())
        return self.labelled(
            ModelOutput.of(logits, {"encoder": enc, "decoder": dec}, need_weights=need_weights), labels
        )


def token_loss(logits: Tensor, targets: Tensor, ignore_index: int, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(..., V)`` over the targets that are not ``ignore_index``;
    0 (with a zero gradient) when every target is ignored, where a plain mean would be 0/0 (a
    masked-LM batch, or one process's slice of it, may hold no masked token). Targets may be of
    any integer dtype, as ids may."""
    targets = targets.flatten().long()
    total = F.cross_entropy(
        logits.flatten(0, -2), targets, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    return total / (targets != ignore_index).sum().clamp(min=1)


class LMHead(nn.Module):
    """Next-token logits ``(B, T, V)``: the seq2seq generator and the language-model head.

    Args:
        d_model: input width.
        vocab_size: output classes.
        tied_embedding: an embedding whose weight the projection shares (Press & Wolf 2017).
        bias: whether the projection has a bias.
        label_smoothing: epsilon of label-smoothed cross-entropy (Szegedy et al. 2016).
        ignore_index: target id that does not count in the loss (padding).
        softcap: soft-cap the logits to (-softcap, softcap), ``softcap * tanh(logits / softcap)``
            (Gemma 2: 30); None: off.
    """

    category: ClassVar[str] = "head"

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        *,
        tied_embedding: nn.Embedding | None = None,
        bias: bool = False,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)
        self.softcap = softcap
        if tied_embedding is not None:
            if tied_embedding.weight.shape != self.proj.weight.shape:
                raise ValueError(
                    f"cannot tie the output projection {tuple(self.proj.weight.shape)} to an embedding of "
                    f"shape {tuple(tied_embedding.weight.shape)}; vocabulary sizes and widths must match"
                )
            self.proj.weight = tied_embedding.weight
        self.label_smoothing = label_smoothing
        self.ignore_index = ignore_index

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        logits = self.proj(hidden)
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over the non-ignored targets ``(B, T)`` (see :func:`token_loss`)."""
        return token_loss(logits, targets, self.ignore_index, self.label_smoothing)
