"""Autoregressive decoding on the key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from .model import EncoderDecoder
from .stack import DecoderCache


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: Tensor | None = None,
    src_mask: Tensor | None = None,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    prompt: Tensor | None = None,
    max_new_tokens: int = 64,
    pad_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Pick the most likely next token until ``eos_id`` or ``max_new_tokens``.

    Args:
        model: an encoder-decoder or decoder-only model with a token head.
        src, src_mask: source ids ``(B, S)`` and mask, for an encoder-decoder.
        bos_id: the first decoder token, when no ``prompt`` is given.
        eos_id: a token that ends a sequence; finished rows are then filled with ``pad_id``.
        prompt: ``(B, P)`` ids to continue instead of a lone ``bos_id``.
        max_new_tokens: how many tokens to add at most.
        pad_id: filler after ``eos_id`` (defaults to ``eos_id``).
        use_cache: read earlier keys/values from a cache (fast) instead of re-running the prefix.

    Returns:
        ``(B, P + n)`` ids: the prompt (or ``bos_id``) followed by the generated tokens.
    """
    if model.decoder is None:
        raise ValueError("greedy decoding needs a model with a decoder; this one is encoder-only")
    memory = None
    if model.encoder is not None:
        if src is None:
            raise ValueError("an encoder-decoder model needs src ids (batch, seq) to decode from")
        memory = model.encode(src, src_mask).hidden
        batch, device = src.size(0), src.device
    elif prompt is not None:
        batch, device = prompt.size(0), prompt.device
    else:
        raise ValueError("a decoder-only model needs a prompt (batch, seq) to continue")
    if prompt is None:
        if bos_id is None:
            raise ValueError("give bos_id (the start token) or a prompt")
        prompt = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)
    pad_id = eos_id if pad_id is None else pad_id

    tokens = prompt
    cache = DecoderCache() if use_cache else None
    step_input = prompt
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        hidden = model.decode(
            step_input if use_cache else tokens, memory, src_mask=src_mask, cache=cache
        ).hidden[:, -1:]
        next_token = model.head(hidden).argmax(dim=-1)  # (B, 1)
        if eos_id is not None:
            next_token = next_token.masked_fill(finished[:, None], pad_id)
            finished |= next_token.squeeze(1) == eos_id
        tokens = torch.cat([tokens, next_token], dim=1)
        step_input = next_token
        if eos_id is not None and bool(finished.all()):
            break
    return tokens
