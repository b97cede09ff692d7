"""Multi-head attention (Vaswani et al. 2017, section 3.2) and its key/value cache.

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``, computed on the hot path by
:func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels), and by the
small :func:`attention_math` when the weights are wanted for a picture.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .masks import AttentionMask


def attention_math(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The paper's formula, written out: returns ``(output, weights)``.

    Args:
        q: ``(B, H, Tq, Dh)``; k, v: ``(B, H, Tk, Dh)``.
        mask: bool, broadcastable to ``(B, H, Tq, Tk)``, True where a query may attend.
        bias: float, broadcastable to ``(B, H, Tq, Tk)``, added to the scores (ALiBi, relative).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a query with no key to attend to (all padding) gets zeros, not NaN
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


class KVCache:
    """Keys and values of the tokens seen so far, for one attention module.

    Self-attention appends the new tokens' keys and values at every step; cross-attention
    stores the projected encoder memory once and reuses it.
    """

    def __init__(self) -> None:
        self.key: Tensor | None = None  # (B, H, T, Dh)
        self.value: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.key is None else self.key.size(-2)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if self.key is not None:
            key = torch.cat([self.key, key], dim=-2)
            value = torch.cat([self.value, value], dim=-2)
        self.key, self.value = key, value
        return key, value

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


class AttentionPositional(nn.Module):
    """Base of positional schemes that act inside attention (rotary, ALiBi, relative bias).

    The default does nothing; subclasses override one or both methods.
    """

    def rotate(self, q: Tensor, k: Tensor, q_offset: int) -> tuple[Tensor, Tensor]:
        """Transform ``q`` ``(B, H, Tq, Dh)`` and ``k`` ``(B, H, Tk, Dh)``; ``q`` starts at position
        ``q_offset`` and ``k`` at 0."""
        return q, k

    def bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor | None:
        """A float bias broadcastable to ``(B, H, q_len, k_len)``, end-aligned like a cache."""
        return None


class MultiHeadAttention(nn.Module):
    """Multi-head attention over batch-first tensors, for self- or cross-attention.

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_model // n_heads``.
        n_heads: number of heads.
        dropout: dropout on the attention weights, in training only.
        bias: whether the projections have a bias.
        positional: an in-attention positional scheme, or None.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        positional: AttentionPositional | None = None,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        # Query, key and value projections stacked in one matrix: self-attention runs one matmul.
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.positional = positional

    def _heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        """``(B, T, parts * D)`` to ``parts`` tensors of ``(B, H, T, Dh)``."""
        b, t, _ = x.shape
        return x.view(b, t, parts, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def _project(self, x: Tensor, rows: slice) -> Tensor:
        bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
        return F.linear(x, self.in_proj.weight[rows], bias)

    def project(
        self, x: Tensor, memory: Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries, keys and values ``(B, H, T, Dh)`` of every key so far, and the positional bias.

        Reads and extends ``cache``, and applies the in-attention positional scheme; attention
        kinds that change only the scoring reuse this and write their own formula after it.
        """
        d = self.d_model
        q_offset = 0
        if memory is None:
            q, k, v = self._heads(self.in_proj(x), 3)
            if cache is not None:
                q_offset = len(cache)
                k, v = cache.append(k, v)
        else:
            (q,) = self._heads(self._project(x, slice(0, d)), 1)
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value  # the encoder memory does not change while decoding
            else:
                k, v = self._heads(self._project(memory, slice(d, 3 * d)), 2)
                if cache is not None:
                    cache.append(k, v)
        bias = None
        if self.positional is not None:
            q, k = self.positional.rotate(q, k, q_offset)
            bias = self.positional.bias(q.size(-2), k.size(-2), q.device)
        return q, k, v, bias

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` ``(B, Tq, D)`` to itself, or to ``memory`` ``(B, Tk, D)``.

        Returns the output ``(B, Tq, D)`` and, if ``need_weights``, the weights ``(B, H, Tq, Tk)``.
        """
        mask = mask or AttentionMask()
        q, k, v, bias = self.project(x, memory, cache)

        q_len, k_len = q.size(-2), k.size(-2)
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = attention_math(q, k, v, mask.dense(q_len, k_len, q.device), bias)
            out = F.dropout(weights, dropout, self.training) @ v if dropout else out
        else:
            weights = None
            if mask.padding is None and bias is None and (not mask.causal or q_len == 1 or q_len == k_len):
                is_causal = mask.causal and q_len > 1
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=is_causal)
            else:
                dense = mask.dense(q_len, k_len, q.device)
                if bias is not None:
                    dense = bias if dense is None else bias.masked_fill(~dense, float("-inf"))
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, dropout_p=dropout)
        out = out.transpose(1, 2).reshape(x.size(0), q_len, -1)  # (B, Tq, D)
        return self.out_proj(out), weights


class MathAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` computed by :func:`attention_math` only, never a fused kernel:
    the ``(B, H, Tq, Tk)`` weights are made, as in the paper; the reference that fused and
    sparse kernels are measured against."""

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: AttentionMask | None = None,
                cache: KVCache | None = None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        out, weights = super().forward(x, memory, mask=mask, cache=cache, need_weights=True)
        return out, weights if need_weights else None
