"""What enters a model: token ids checked, looked up, scaled, given their positions, dropped out.

- :class:`Embeddings`: ``dropout(positional(scale * E[ids]))``.
- Additive positions (sinusoidal, learned) take ``(B, T, D)`` and a start ``offset`` (the tokens
  already decoded); :func:`position_starts` and :func:`add_positions` add the Universal
  Transformer's random start offsets in training to any of them. Positions that act inside
  attention are in :mod:`.relative`.
- Checks on what a model is called with (:func:`check_token_ids`, :func:`check_tensor`): a
  ValueError that says what was expected, read from the tensor's metadata; only the ids' range
  is read from their values, once per call.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from .errors import InputTypeError


class Embeddings(nn.Module):
    """``dropout(positional(scale * E[ids]))``: ``(B, T)`` ids to ``(B, T, D)`` vectors.

    Args:
        token: the lookup table; share one instance between modules to tie weights.
        positional: an additive positional module taking ``(x, offset)``, or None.
        scale: the factor on the looked-up vectors (``sqrt(d_model)`` in Vaswani et al. 2017).
        dropout: dropout on the sum.
        random_offset: in training, each sequence's positions start at a random offset in
            ``[0, random_offset)`` past ``offset`` (:func:`~.embedding.position_starts`); 0: off.
            ``positional`` must cover ``random_offset`` more positions than the longest input.
    """

    category: ClassVar[str] = "embedding"

    def __init__(
        self,
        token: nn.Embedding,
        *,
        positional: nn.Module | None = None,
        scale: float = 1.0,
        dropout: float = 0.0,
        random_offset: int = 0,
    ) -> None:
        super().__init__()
        self.token = token
        self.positional = positional
        self.scale = scale
        self.dropout = nn.Dropout(dropout)
        self.random_offset = random_offset

    @classmethod
    def scaled(cls, token: nn.Embedding, **kwargs) -> Embeddings:
        """Embeddings scaled by ``sqrt(d_model)``, as in the original Transformer."""
        return cls(token, scale=math.sqrt(token.embedding_dim), **kwargs)

    def forward(self, ids: Tensor, offset: int | Tensor = 0, starts: Tensor | None = None) -> Tensor:
        """``starts``: the model's random starts of this batch (:func:`~.embedding.draw_starts`), shared
        with the other side of an encoder-decoder; None: this module draws its own in training."""
        check_token_ids(ids, self.token.num_embeddings)
        x = self.token(ids)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positional is not None:
            x = add_positions(self.positional, x, position_starts(x, offset, self.random_offset, self.training, starts))
        return self.dropout(x)


def _check_length(end: int, max_len: int) -> None:
    if end > max_len:
        raise ValueError(
            f"sequence reaches position {end} but learned positions have a vector for each of max_len={max_len} "
            "positions only (they cannot extrapolate); use shorter inputs or build the model with a larger max_len"
        )


def position_ids(start: int | Tensor, length: int, device: torch.device | None = None) -> Tensor:
    """``start, start + 1, ..., start + length - 1``: ``(T,)``. ``start`` may be a 0-d tensor on
    the device (a static cache's position), which is never read back to the host, or one start
    per sequence ``(B,)`` (random starts in training; a left-padded row's, negative by its
    padding; a CPU tensor): then ``(B, T)``, the positions before a row's 0 (its left padding,
    never attended to) at 0."""
    if isinstance(start, Tensor):
        if start.dim() == 1:
            return (start.to(device, non_blocking=True)[:, None] + torch.arange(length, device=device)).clamp(min=0)
        return start + torch.arange(length, device=start.device)
    return torch.arange(start, start + length, device=device)


def positions_end(start: int | Tensor, length: int) -> int | None:
    """How far the positions of an int start, or of per-sequence starts (a CPU tensor: no device
    sync), reach; None for a static cache's 0-d device start, which is never read back (the cache
    is at most ``max_len`` long)."""
    if not isinstance(start, Tensor):
        return start + length
    if start.dim() == 1 and start.device.type == "cpu":
        return int(start.max()) + length
    return None


def _check_starts(start: int | Tensor, length: int, max_len: int) -> None:
    """The length check of :func:`positions_end`."""
    end = positions_end(start, length)
    if end is not None:
        _check_length(end, max_len)


def grown_rows(rows: int, needed: int) -> int:
    """The rows a table computed on demand grows to for ``needed`` positions: at least double."""
    return max(needed, 2 * rows)


SINUSOID_LAYOUTS = ("interleaved", "halves")
"""Where :func:`sinusoid_table` puts the sines and cosines of each position: ``interleaved``
(sine, cosine, sine, ...: the paper's formula) or ``halves`` (every sine, then every cosine: the
layout of Marian and of Hugging Face's ``MarianSinusoidalPositionalEmbedding``)."""


def sinusoid_table(length: int, dim: int, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """``(length, dim)`` sinusoids of the frequencies ``w_i = base^(-2i/d)``.

    ``layout="interleaved"``: ``PE[pos, 2i] = sin(pos * w_i)``, ``PE[pos, 2i+1] = cos(pos * w_i)``
    (Vaswani et al. 2017, section 3.5). ``layout="halves"``: the same values with the sines first,
    ``PE[pos, i] = sin(pos * w_i)`` for the first ``ceil(d/2)`` channels, then the cosines.
    """
    if layout not in SINUSOID_LAYOUTS:
        raise ValueError(f"layout={layout!r}; a sinusoid table's layout is one of {', '.join(SINUSOID_LAYOUTS)}")
    position = torch.arange(length, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(base) / dim))
    sines, cosines = torch.sin(position * inv_freq), torch.cos(position * inv_freq[: dim // 2])
    if layout == "halves":
        return torch.cat([sines, cosines], dim=1).float()
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = sines
    table[:, 1::2] = cosines
    return table.float()


def position_starts(
    x: Tensor, offset: int, random_offset: int, training: bool, drawn: Tensor | None = None
) -> int | Tensor:
    """Where the positions of each sequence of ``x`` ``(B, T, D)`` start.

    ``offset`` for every sequence, unless ``training`` with ``random_offset`` K > 0: then
    ``offset`` plus a start per sequence drawn uniformly from ``[0, K)`` (Dehghani et al. 2018,
    section 3.3), a CPU ``LongTensor`` ``(B,)`` drawn from the global RNG (a seed repeats it).
    ``drawn``: the model's one draw for the batch (:func:`draw_starts`), which the source and
    the target of an example then share; taken modulo K.
    """
    if not training or random_offset == 0:
        return offset
    if drawn is not None:
        return offset + drawn % random_offset
    # drawn on the CPU generator: seeded alike on every device, and read back without a device sync
    return offset + torch.randint(random_offset, (x.size(0),))


def draw_starts(model: nn.Module, batch: int) -> Tensor | None:
    """One random start per example for every module of ``model`` that offsets its positions in
    training (``random_offset``), or None when none does or the model is not training.

    The encoder's and the decoder's positions of one example start at the same offset, so that
    a target position stays aligned with its source position (copying, reversing), as when
    positions are not shifted at all. Each module takes the draw modulo its own ``random_offset``.
    """
    bound = max((getattr(m, "random_offset", 0) for m in model.modules()), default=0) if model.training else 0
    return torch.randint(bound, (batch,)) if bound else None


def add_positions(positional: nn.Module, x: Tensor, start: int | Tensor) -> Tensor:
    """``positional(x, start)`` for an additive module ``(x, offset) -> x'``, ``x`` ``(B, T, D)``.

    With a tensor ``start`` ``(B,)`` (from :func:`position_starts`), row ``b`` has its positions
    start at ``start[b]``. A module that declares ``takes_row_starts`` (the built-in ones) looks
    them all up at once; any other is called once per distinct start on the rows having it, so
    a module with the ``(x, offset: int)`` call takes per-sequence starts unchanged.
    """
    if isinstance(start, int) or start.dim() == 0 or getattr(positional, "takes_row_starts", False):
        return positional(x, start)
    parts, rows = [], []
    for value in start.unique().tolist():
        index = (start == value).nonzero().squeeze(1)
        parts.append(positional(x[index.to(x.device)], value))
        rows.append(index)
    order = torch.cat(rows).argsort()  # puts the rows back in the batch's order
    return torch.cat(parts)[order.to(x.device)]


class SinusoidalPositional(nn.Module):
    """Fixed sinusoids (Vaswani et al. 2017, section 3.5), added to the input. A function of the
    position, so it goes past ``max_len`` (the rows computed up front): longer inputs compute
    more rows, as Press et al. 2022 evaluate it past its training length. ``layout``: where the
    sines and cosines go (:data:`SINUSOID_LAYOUTS`)."""

    category: ClassVar[str] = "positional"

    takes_row_starts = True  # offset may be one start per sequence, (B,)

    def __init__(self, d_model: int, max_len: int, *, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_len, self.base, self.layout = max_len, base, layout
        self.register_buffer("table", sinusoid_table(max_len, d_model, base, layout), persistent=False)

    def cover(self, length: int) -> None:
        """Compute the rows of positions up to ``length`` now (a static cache's length, before a
        CUDA graph captures the lookups)."""
        rows, dim = self.table.shape
        if length > rows:
            self.table = sinusoid_table(grown_rows(rows, length), dim, self.base, self.layout).to(self.table.device)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        end = positions_end(offset, x.size(1))
        if end is not None:
            self.cover(end)
        if isinstance(offset, Tensor):  # looked up, not sliced: a static cache's position, or a start per sequence
            return x + nn.functional.embedding(position_ids(offset, x.size(1), x.device), self.table).to(x.dtype)
        return x + self.table[offset : offset + x.size(1)].to(x.dtype)


class LearnedPositional(nn.Module):
    """A learned vector per absolute position (Gehring et al. 2017; BERT), added to the input."""

    category: ClassVar[str] = "positional"

    takes_row_starts = True  # offset may be one start per sequence, (B,)

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        _check_starts(offset, x.size(1), self.max_len)
        return x + self.embedding(position_ids(offset, x.size(1), x.device))


PAD, BOS, EOS = 0, 1, 2
"""The token ids every built-in task gives padding, the start of a sequence and its end."""


PAD, BOS, EOS = 0, 1, 2
"""The token ids every built-in task gives padding, the start of a sequence and its end."""
CLS = BOS  # classification tasks start each sequence with this id; the head pools it


ID_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding indexes with


def check_tensor(value: object, name: str, expected: str) -> None:
    """Raise an :class:`InputTypeError` (a ValueError too) unless ``value`` is a tensor; ``expected`` describes it
    (``"of shape (batch, seq)"``)."""
    if not isinstance(value, Tensor):
        kind, module = type(value).__qualname__, type(value).__module__
        hint = ""
        if isinstance(value, (list, tuple)) or module.split(".")[0] == "numpy":
            hint = " (convert it with torch.as_tensor)"
        raise InputTypeError(
            f"{name} must be a torch.Tensor {expected}, got "
            f"{kind if module == 'builtins' else f'{module}.{kind}'}{hint}"
        )


def check_not_empty(value: Tensor, name: str, what: str = "example") -> None:
    """Raise a ValueError if ``value``'s first (batch) dimension is 0."""
    if value.dim() and value.size(0) == 0:
        raise ValueError(f"{name}: an empty batch (shape {tuple(value.shape)}); give at least one {what}")


def check_token_ids(ids: object, vocab_size: int | None = None, name: str = "token ids") -> None:
    """Raise a ValueError unless ``ids`` is a non-empty ``(batch, seq)`` tensor of ``torch.long``
    (or ``int32``) ids, and, given ``vocab_size``, each in ``[0, vocab_size)``."""
    check_tensor(ids, name, "of shape (batch, seq) and dtype torch.long")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, seq), got shape {tuple(ids.shape)}")
    check_not_empty(ids, name, "sequence")
    if ids.size(1) == 0:
        raise ValueError(
            f"the sequences of {name} are empty (shape {tuple(ids.shape)}); give at least one token per sequence"
        )
    if ids.dtype not in ID_DTYPES:
        raise ValueError(
            f"{name} must be integers of dtype torch.long (or torch.int32), got {ids.dtype}; convert with .long()"
        )
    # a compiled graph cannot read values, nor can a step being captured as a CUDA graph (its ids are
    # the model's own argmax), and a meta tensor (shapes alone) has none
    if (
        vocab_size is not None
        and not torch.compiler.is_compiling()
        and ids.device.type != "meta"
        and not (ids.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} contain {bad}, outside the vocabulary; ids must lie in [0, {vocab_size - 1}] "
                f"(vocab_size={vocab_size})"
            )
