"""Positional encodings: additive ones added to the embeddings, and ones that act in attention.

Additive modules take ``(B, T, D)`` and a start ``offset`` (the number of tokens already
decoded) and return ``(B, T, D)``; in-attention modules subclass
:class:`~transformer_zoo.core.attention.AttentionPositional`. Their callers start the positions
through :func:`position_starts` and :func:`add_positions`, which add the Universal Transformer's
random start offsets in training to any additive module.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from .attention import AttentionPositional


def _check_length(end: int, max_len: int) -> None:
    if end > max_len:
        raise ValueError(
            f"sequence reaches position {end} but learned positions have a vector for each of max_len={max_len} "
            "positions only (they cannot extrapolate); use shorter inputs or build the model with a larger max_len"
        )


def _positions(start: int | Tensor, length: int, device: torch.device | None = None) -> Tensor:
    """``start, start + 1, ..., start + length - 1``: ``(T,)``. ``start`` may be a 0-d tensor on
    the device (a static cache's position), which is never read back to the host, or one start
    per sequence ``(B,)`` (random starts in training, a CPU tensor): then ``(B, T)``."""
    if isinstance(start, Tensor):
        if start.dim() == 1:
            return start.to(device, non_blocking=True)[:, None] + torch.arange(length, device=device)
        return start + torch.arange(length, device=start.device)
    return torch.arange(start, start + length, device=device)


def _reach(start: int | Tensor, length: int) -> int | None:
    """How far the positions of an int start, or of per-sequence starts (a CPU tensor: no device
    sync), reach; None for a static cache's 0-d device start, which is never read back (the cache
    is at most ``max_len`` long)."""
    if not isinstance(start, Tensor):
        return start + length
    if start.dim() == 1 and start.device.type == "cpu":
        return int(start.max()) + length
    return None


def _check_starts(start: int | Tensor, length: int, max_len: int) -> None:
    """The length check of :func:`_reach`."""
    end = _reach(start, length)
    if end is not None:
        _check_length(end, max_len)


def _longer(rows: int, needed: int) -> int:
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
            self.table = sinusoid_table(_longer(rows, length), dim, self.base, self.layout).to(self.table.device)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        end = _reach(offset, x.size(1))
        if end is not None:
            self.cover(end)
        if isinstance(offset, Tensor):  # looked up, not sliced: a static cache's position, or a start per sequence
            return x + nn.functional.embedding(_positions(offset, x.size(1), x.device), self.table).to(x.dtype)
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
        return x + self.embedding(_positions(offset, x.size(1), x.device))


class RotaryPositional(AttentionPositional):
    """Rotary position embedding (Su et al. 2021): rotates query/key channel pairs by position.
    Like the sinusoids, it goes past ``max_len``: longer inputs compute more angles."""

    def __init__(self, d_head: int, max_len: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions need an even head width, got d_model / n_heads = {d_head}")
        self.max_len, self.d_head, self.base = max_len, d_head, base
        cos, sin = self._angles(max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _angles(self, length: int) -> tuple[Tensor, Tensor]:
        """The cosines and sines of every position's angles: ``(length, d_head / 2)`` each."""
        inv_freq = self.base ** (-torch.arange(0, self.d_head, 2, dtype=torch.float64) / self.d_head)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
        return angles.cos().float(), angles.sin().float()

    def cover(self, length: int) -> None:
        """Compute the angles of positions up to ``length`` now (see :meth:`SinusoidalPositional.cover`)."""
        if length > len(self.cos):
            self.cos, self.sin = (t.to(self.cos.device) for t in self._angles(_longer(len(self.cos), length)))

    def _rotate(self, x: Tensor, offset: int | Tensor) -> Tensor:
        if isinstance(offset, Tensor):  # a static cache's position on the device: looked up, not sliced
            positions = _positions(offset, x.size(-2))
            cos, sin = self.cos.index_select(0, positions).to(x.dtype), self.sin.index_select(0, positions).to(x.dtype)
        else:
            self.cover(offset + x.size(-2))
            cos = self.cos[offset : offset + x.size(-2)].to(x.dtype)
            sin = self.sin[offset : offset + x.size(-2)].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)

    def rotate(self, q: Tensor, k: Tensor, q_offset: int | Tensor) -> tuple[Tensor, Tensor]:
        return self._rotate(q, q_offset), self._rotate(k, 0)


class ALiBiPositional(AttentionPositional):
    """Attention with linear biases (Press et al. 2022): ``-slope_h * distance`` on the scores."""

    def __init__(self, n_heads: int, *, symmetric: bool = True) -> None:
        super().__init__()
        self.symmetric = symmetric
        slopes = torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(self, q_len: int, k_len: int, device: torch.device, q_offset: Tensor | None = None) -> Tensor:
        start = k_len - q_len if q_offset is None else q_offset
        q_pos = _positions(start, q_len, device)[:, None]
        distance = torch.arange(k_len, device=device)[None, :] - q_pos  # (Tq, Tk)
        distance = distance.abs() if self.symmetric else distance.clamp(max=0).neg()
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)
