"""The 1-D sparse patterns of the local and global kinds, their own kernel, and memory-compressed
attention. They serve this family only, so they live beside its plugin; the pattern interface
and the kernel chooser that the image family's local 2-D attention uses too are in
:mod:`transformer_zoo.core.local_attention`.

- :class:`Pattern`: which keys a query may see along one sequence (sliding window, dilated
  window, blocks, global positions, random blocks).
- :func:`chunked_attention`: the pattern's own kernel (``backend: chunked``): queries in chunks,
  each against only the keys its chunk needs; a dilated band folded into the batch; BigBird's
  gathered blocks. Memory grows as O(n * w) and autograd works as usual.
- :func:`dense_attention`: the same attention under the explicit mask, the reference.
- :class:`MemoryCompressedAttention`: keys and values shortened by a strided convolution (Liu
  et al. 2018).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, Kernel, MultiHeadAttention, attention_math, math_kernel
from transformer_zoo.core.cache import KVCache
from transformer_zoo.core.local_attention import NO_BIAS, AttentionPattern, attend_masked


@dataclass(frozen=True)
class Pattern(AttentionPattern):
    """Which keys a query may attend to, along one sequence.

    Attributes:
        window: a query at ``i`` sees keys ``j`` with ``|i - j| <= window`` (0: no band).
        dilation: with ``dilation = d > 1``, the band is dilated: ``j = i + m * d`` for
            ``|m| <= window`` (Longformer's dilated sliding window); not with ``block``.
        block: with ``block > 0``, a query sees the keys of its own block of this size (and, when
            ``causal``, of the previous block), instead of a band.
        global_positions: positions that see every key and are seen by every query.
        global_every: every ``global_every``-th position (0, k, 2k, ...) is global too (0: none).
        random_blocks: blocks of keys (of size ``block``) each query block also sees, chosen
            with ``seed`` (BigBird); needs ``block``.
        causal: a query never sees a key after itself.
    """

    own_kernel: ClassVar[str] = "chunked"

    window: int = 0
    dilation: int = 1
    block: int = 0
    global_positions: tuple[int, ...] = ()
    global_every: int = 0
    random_blocks: int = 0
    seed: int = 0
    causal: bool = False

    def __post_init__(self) -> None:
        if self.window < 0 or self.block < 0 or self.random_blocks < 0 or self.global_every < 0:
            raise ValueError(f"window, block, random_blocks and global_every must be >= 0: {self}")
        if self.dilation < 1:
            raise ValueError(f"dilation must be >= 1 (1: no gaps), got {self.dilation}")
        if self.dilation > 1 and self.block:
            raise ValueError("dilation is for a band (window), not for blocks; set block=0 or dilation=1")
        if self.random_blocks and not self.block:
            raise ValueError("random_blocks are blocks of keys: they need block > 0")

    # ---- the rule (out-of-place ops only: FlexAttention compiles it) --------------------------
    def is_global(self, pos: Tensor) -> Tensor:
        hit = torch.zeros_like(pos, dtype=torch.bool)
        for g in self.global_positions:
            hit = hit | (pos == g)
        if self.global_every:
            hit = hit | (pos % self.global_every == 0)
        return hit

    def random_table(self, n_blocks: int, device: torch.device | None = None) -> Tensor:
        """``(n_blocks, random_blocks)`` key blocks each query block sees at random (fixed by ``seed``)."""
        if not self.random_blocks or n_blocks == 0:
            return torch.zeros(n_blocks, 0, dtype=torch.long, device=device)
        generator = torch.Generator().manual_seed(self.seed)
        picks = torch.rand(n_blocks, n_blocks, generator=generator).argsort(dim=1)[:, : self.random_blocks]
        return picks.to(device)

    def allowed(self, q: Tensor, k: Tensor, length: int, table: Tensor | None = None) -> Tensor:
        """Bool, broadcast of ``q`` and ``k`` (absolute positions): True where ``q`` may see ``k``.

        ``table`` is :meth:`random_table` for ``length``, when the caller has it already.
        """
        if self.block:
            qb, kb = q // self.block, k // self.block
            see = qb == kb
            if self.causal:
                see = see | (kb == qb - 1)
            elif self.window:
                see = see | ((qb - kb).abs() <= self.window)  # neighbouring blocks (block-sparse)
        else:
            gap = q - k
            see = gap.abs() <= self.reach()
            if self.dilation > 1:
                see = see & (gap % self.dilation == 0)
        if self.random_blocks:
            if table is None:
                table = self.random_table(math.ceil(length / self.block), q.device)  # (nb, r)
            qb, kb = (q // self.block).expand_as(see), (k // self.block).expand_as(see)
            see = see | (table[qb] == kb.unsqueeze(-1)).any(-1)
        if self.global_positions or self.global_every:
            see = see | self.is_global(q) | self.is_global(k)
        if self.causal:
            see = see & (k <= q)
        return see

    def rule(self, length: int, device: torch.device | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        table = self.random_table(math.ceil(length / self.block), device) if self.random_blocks else None
        return lambda q_pos, k_pos: self.allowed(q_pos, k_pos, length, table)

    def for_call(self, mask: AttentionMask, q_len: int, k_len: int) -> Pattern:
        """A decoder's self-attention is causal: the pattern takes the flag of each call's mask."""
        return self if self.causal == mask.causal else replace(self, causal=mask.causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, dropout_p: float) -> Tensor:
        return chunked_attention(q, k, v, self, padding, dropout_p)

    # ---- what a chunk of queries needs ----------------------------------------------------------
    def reach(self) -> int:
        """How far the band reaches on each side, in positions."""
        return self.window * self.dilation

    def chunk_size(self) -> int:
        """Queries per chunk: one block, or the window's width (at least 32)."""
        return self.block if self.block else max(32, self.window)

    def lookback(self) -> int | None:
        """A plain band's reach (no blocks, no global or random keys); None otherwise."""
        plain = not (self.block or self.global_positions or self.global_every or self.random_blocks)
        return self.reach() if plain else None

    def key_range(self, start: int, end: int, length: int) -> tuple[int, int] | None:
        """For a plain band (no blocks, no global or random keys): the contiguous key range
        queries ``start .. end - 1`` need; None otherwise."""
        if self.lookback() is None:
            return None
        return max(0, start - self.reach()), min(length, end if self.causal else end + self.reach())

    def keys_for(self, start: int, end: int, length: int, device: torch.device, table: Tensor | None = None) -> Tensor:
        """Key positions queries ``start .. end - 1`` may need (a superset; ``allowed`` decides).

        ``table`` is :meth:`random_table` for ``length``, when the caller has it already.
        """
        if self.block:
            first_block, last_block = start // self.block, (end - 1) // self.block
            reach = 1 if self.causal else self.window
            blocks = torch.arange(
                max(0, first_block - reach), min(last_block + reach, (length - 1) // self.block) + 1, device=device
            )
            if self.random_blocks:
                if table is None:
                    table = self.random_table(math.ceil(length / self.block), device)
                blocks = torch.cat([blocks, table[first_block : last_block + 1].flatten()]).unique()
            keys = (blocks[:, None] * self.block + torch.arange(self.block, device=device)).flatten()
            keys = keys[keys < length]
        else:
            keys = torch.arange(max(0, start - self.reach()), min(length, end + self.reach()), device=device)
        if self.global_positions or self.global_every:
            everything = torch.arange(length, device=device)
            keys = torch.cat([keys, everything[self.is_global(everything)]]).unique()
        if self.causal:
            keys = keys[keys < end]
        return keys


def dense_attention(
    q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, padding: Tensor | None = None, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention under the pattern's explicit mask: ``(output, weights)``; the reference."""
    mask = pattern.dense(q.size(-2), k.size(-2), q.device)  # (Tq, Tk)
    if padding is not None:
        mask = mask & padding[:, None, None, :]
    return attention_math(q, k, v, mask, bias)


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: Pattern,
    padding: Tensor | None = None,
    dropout: float = 0.0,
    *,
    batched: bool | None = None,
) -> Tensor:
    """The pattern's attention, one chunk of queries at a time against the keys it needs.

    Args:
        q: ``(B, H, Tq, Dh)``, end-aligned with the keys; k, v: ``(B, H, Tk, Dh)``.
        padding: ``(B, Tk)`` bool, True for real keys.
        dropout: dropout on the attention weights (pass 0 in eval mode).
        batched: compute all the chunks of a band, or all the blocks, in one attention call
            (``_band``, ``_blocked``) rather than a Python loop over chunks. None: on
            GPUs, where a loop is bound by its kernel launches; a CPU takes the loop, faster
            there in the forward pass (``tzoo bench attention-kernels --chunks loop`` against
            ``--chunks batched``, docs/benchmarks.md).

    Memory is O(Tq * m) for ``m`` keys per chunk (about ``chunk + 2 * window``), not O(Tq * Tk).
    Global queries, which see every key, are computed in one extra pass over all keys.
    """
    q_len, k_len = q.size(-2), k.size(-2)
    offset = k_len - q_len
    size = pattern.chunk_size()
    table = pattern.random_table(math.ceil(k_len / pattern.block), q.device) if pattern.random_blocks else None
    batched = q.device.type != "cpu" if batched is None else batched
    if (
        pattern.block
        and offset == 0
        and (batched or pattern.random_blocks or pattern.global_positions or pattern.global_every)
    ):
        out = _blocked(q, k, v, pattern, padding, dropout, table)  # gathers: one batched product beats a loop
    elif pattern.dilation > 1 and offset == 0 and not (pattern.global_positions or pattern.global_every):
        out = _dilated(q, k, v, pattern, padding, dropout, batched)
    elif batched and offset == 0 and pattern.key_range(0, 1, k_len) is not None:
        out = _band(q, k, v, pattern, padding, dropout, size)
    else:  # a cached decoding step (a few queries), or a band with global positions
        out = _chunks(q, k, v, pattern, padding, dropout, table, size)
    if pattern.global_positions or pattern.global_every:
        positions = torch.arange(offset, k_len, device=q.device)
        rows = positions[pattern.is_global(positions)]
        if len(rows):
            mask = pattern.allowed(rows[:, None], torch.arange(k_len, device=q.device)[None, :], k_len, table)
            if padding is not None:
                mask = mask & padding[:, None, None, :]
            out = out.index_copy(2, rows - offset, attend_masked(q[:, :, rows - offset], k, v, mask, dropout))
    return out


def _chunks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: Pattern,
    padding: Tensor | None,
    dropout: float,
    table: Tensor | None,
    size: int,
) -> Tensor:
    """Queries ``size`` at a time, each chunk against the keys it may need."""
    q_len, k_len = q.size(-2), k.size(-2)
    offset = k_len - q_len
    outputs = []
    for start in range(offset, k_len, size):
        end = min(start + size, k_len)
        queries = torch.arange(start, end, device=q.device)
        span = pattern.key_range(start, end, k_len)
        if span is not None:  # a band: slice, no gather
            keys = torch.arange(*span, device=q.device)
            chunk_k, chunk_v, chunk_pad = (
                k[:, :, span[0] : span[1]],
                v[:, :, span[0] : span[1]],
                None if padding is None else padding[:, span[0] : span[1]],
            )
        else:
            keys = pattern.keys_for(start, end, k_len, q.device, table)  # (m,)
            chunk_k, chunk_v = k[:, :, keys], v[:, :, keys]
            chunk_pad = None if padding is None else padding[:, keys]
        mask = pattern.allowed(queries[:, None], keys[None, :], k_len, table)  # (c, m)
        if chunk_pad is not None:
            mask = mask & chunk_pad[:, None, None, :]  # (B, 1, c, m)
        outputs.append(attend_masked(q[:, :, start - offset : end - offset], chunk_k, chunk_v, mask, dropout))
    return torch.cat(outputs, dim=2)  # (B, H, Tq, Dh)


def _band(
    q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, padding: Tensor | None, dropout: float, size: int
) -> Tensor:
    """A band, every chunk of ``size`` queries at once against its own ``m = size + 2 * reach`` keys
    (``size + reach`` when causal): the keys are unfolded into overlapping windows, so one
    attention call over ``(B, H * chunks)`` rows computes what a loop over the chunks would, with
    no Python loop and O(n * m) memory."""
    batch, heads, n, dim = q.shape
    chunks = math.ceil(n / size)
    before, after = pattern.reach(), 0 if pattern.causal else pattern.reach()
    m, tail = size + before + after, chunks * size - n

    def windows(t: Tensor) -> Tensor:  # (..., n, Dh) -> (..., chunks, m, Dh): chunk j's keys start at j * size - before
        return F.pad(t, (0, 0, before, tail + after)).unfold(-2, m, size).transpose(-1, -2)

    device = q.device
    q_pos = torch.arange(chunks * size, device=device).view(chunks, size, 1)
    k_pos = (torch.arange(chunks, device=device) * size - before)[:, None, None] + torch.arange(m, device=device)
    mask = pattern.allowed(q_pos, k_pos, n) & (k_pos >= 0) & (k_pos < n)  # (chunks, size, m)
    mask = mask[None, None]
    if padding is not None:
        real = F.pad(padding, (before, tail + after)).unfold(-1, m, size)  # (B, chunks, m)
        mask = mask & real[:, None, :, None, :]  # (B, 1, chunks, size, m)
    mask = mask.expand(-1, heads, -1, -1, -1).reshape(mask.size(0), heads * chunks, size, m)
    queries = F.pad(q, (0, 0, 0, tail)).reshape(batch, heads * chunks, size, dim)
    keys, values = (windows(t).reshape(batch, heads * chunks, m, dim) for t in (k, v))
    out = attend_masked(queries, keys, values, mask, dropout)  # (B, H * chunks, size, Dh)
    return out.view(batch, heads, chunks * size, dim)[:, :, :n]


def _dilated(
    q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, padding: Tensor | None, dropout: float, batched: bool
) -> Tensor:
    """A dilated band is a plain band on each of the ``d`` interleaved subsequences ``r, r + d,
    r + 2d, ...``: fold them into the batch, so no key outside the band is computed."""
    batch, heads, n, dim = q.shape
    d = pattern.dilation
    pad = -n % d

    def fold(t: Tensor) -> Tensor:  # (B, H, n, Dh) -> (B * d, H, n / d, Dh)
        t = F.pad(t, (0, 0, 0, pad))
        return t.view(batch, heads, -1, d, dim).permute(0, 3, 1, 2, 4).reshape(batch * d, heads, -1, dim)

    real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if padding is None else padding
    real = F.pad(real, (0, pad)).view(batch, -1, d).transpose(1, 2).reshape(batch * d, -1)  # (B * d, n / d)
    band = replace(pattern, dilation=1)
    folded = fold(q), fold(k), fold(v)
    out = (
        _band(*folded, band, real, dropout, band.chunk_size())
        if batched
        else _chunks(*folded, band, real, dropout, None, band.chunk_size())
    )
    return out.view(batch, d, heads, -1, dim).permute(0, 2, 3, 1, 4).reshape(batch, heads, -1, dim)[:, :, :n]


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, pattern: Pattern, padding: Tensor | None, dropout: float, table: Tensor | None
) -> Tensor:
    """Every query block at once against its own gathered key blocks (BigBird's layout).

    Each of the ``nb`` query blocks gathers ``m`` key blocks: its neighbours, the blocks holding
    global positions, and its random blocks; a block gathered twice counts once. Memory is
    O(n * m * block).
    """
    batch, heads, n, dim = q.shape
    b = pattern.block
    nb = math.ceil(n / b)
    device = q.device
    blocks = torch.arange(nb, device=device)
    reach = (
        torch.arange(-1, 1, device=device)
        if pattern.causal
        else torch.arange(-pattern.window, pattern.window + 1, device=device)
    )
    parts = [blocks[:, None] + reach[None, :]]  # neighbours, (nb, 2r + 1)
    if pattern.global_positions or pattern.global_every:
        positions = torch.arange(n, device=device)
        held = (positions[pattern.is_global(positions)] // b).unique()
        parts.append(held[None, :].expand(nb, -1))
    if table is not None:
        parts.append(table)
    ids = torch.cat(parts, dim=1)  # (nb, m)
    valid = (ids >= 0) & (ids < nb)
    slots = ids.size(1)
    named = torch.where(valid, ids, -1 - torch.arange(slots, device=device))  # invalid slots never match
    earlier = torch.ones(slots, slots, dtype=torch.bool, device=device).tril(-1)  # (m, m): i < j
    valid &= ~((named[:, :, None] == named[:, None, :]) & earlier).any(-1)  # a repeated block counts once
    ids = ids.clamp(0, nb - 1)
    key_pos = (ids[:, :, None] * b + torch.arange(b, device=device)).flatten(1)  # (nb, m * b)
    pad = nb * b - n
    kp, vp, qp = (F.pad(t, (0, 0, 0, pad)) for t in (k, v, q))
    query_pos = torch.arange(nb * b, device=device).view(nb, b)
    mask = pattern.allowed(query_pos[:, :, None], key_pos[:, None, :], n, table)  # (nb, b, m * b)
    mask &= (valid.repeat_interleave(b, dim=1) & (key_pos < n))[:, None, :]
    mask = mask[None, None]  # (1, 1, nb, b, m * b)
    if padding is not None:
        mask = mask & F.pad(padding, (0, pad))[:, key_pos][:, None, :, None, :]  # (B, 1, nb, b, m * b)
    out = attend_masked(qp.view(batch, heads, nb, b, dim), kp[:, :, key_pos], vp[:, :, key_pos], mask, dropout)
    return out.reshape(batch, heads, nb * b, dim)[:, :, :n]


class MemoryCompressedAttention(MultiHeadAttention):
    """Self-attention over keys and values shortened by a strided convolution (Liu et al. 2018).

    Keys and values, after their projections, are each convolved over the sequence with kernel
    and stride ``compression`` (3 in the paper), so every query attends to ``ceil(n / c)``
    summaries instead of ``n`` keys (:meth:`kernel_inputs`). Causal: a query sees a summary only
    once every position it covers is at or before the query. The kernel is
    :func:`~transformer_zoo.core.attention.math_kernel`, which gives a query that sees no
    summary yet (the first ``c - 1`` of a decoder) zeros.
    """

    self_only = True

    def __init__(
        self, d_model: int, n_heads: int, *, compression: int = 3, kernel: Kernel = math_kernel, **kwargs
    ) -> None:
        super().__init__(d_model, n_heads, kernel=kernel, **kwargs)
        self.compression = compression
        self.compress_k = nn.Conv1d(d_model, d_model, compression, stride=compression)
        self.compress_v = nn.Conv1d(d_model, d_model, compression, stride=compression)

    def _compress(self, x: Tensor, conv: nn.Conv1d) -> Tensor:
        """``(B, H, T, Dh)`` to ``(B, H, ceil(T / c), Dh)``, zero-padding the last block."""
        b, h, t, dh = x.shape
        flat = x.transpose(1, 2).reshape(b, t, h * dh).transpose(1, 2)  # (B, D, T)
        flat = F.pad(flat, (0, -t % self.compression))
        out = conv(flat).transpose(1, 2)  # (B, T', D)
        return out.view(b, -1, h, dh).transpose(1, 2)

    def summary_mask(
        self, q_len: int, k_len: int, padding: Tensor | None, causal: bool, device: torch.device
    ) -> Tensor | None:
        """Which summaries each query may see, ``(B or 1, 1, Tq, T')``; None: all of them."""
        c = self.compression
        n_summaries = (k_len + -k_len % c) // c  # ceil(k_len / c) as _compress pads: one expression for torch.export
        mask = None
        if causal:
            last = (torch.arange(n_summaries, device=device) + 1) * c - 1  # the last position a summary covers
            q_pos = torch.arange(k_len - q_len, k_len, device=device)
            mask = (last[None, :] <= q_pos[:, None])[None, None]
        if padding is not None:
            real = F.pad(padding.float(), (0, -k_len % c)).view(padding.size(0), n_summaries, c).amax(-1) > 0
            real = real[:, None, None, :].to(device)
            mask = real if mask is None else mask & real
        return mask

    def kernel_inputs(
        self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor, AttentionMask, Tensor | None]:
        """The keys and values compressed to summaries, and the mask over the summaries."""
        if bias is not None:
            raise ValueError(NO_BIAS)
        summaries = self.summary_mask(q.size(-2), k.size(-2), mask.padding, mask.causal, q.device)
        k, v = self._compress(k, self.compress_k), self._compress(v, self.compress_v)  # (B, H, T', Dh)
        return q, k, v, AttentionMask(explicit=summaries), None
