"""Cosine attention: Henry et al. 2020, "Query-Key Normalization for Transformers" (arXiv 2010.04245).

Queries and keys are L2-normalised per head, so every score is a cosine similarity in
[-1, 1], and a learned temperature ``g`` takes the place of ``1 / sqrt(d_k)``:

    Attention(Q, K, V) = softmax(g * Q_hat K_hat^T) V

Bounded scores cannot push the softmax into saturation however large the activations grow.

The file reads top to bottom: the formula as a function, the module, the options model
(attention kind ``cosine``), the variant ``cosine-transformer-tiny``, and the two hooks the
``transformer_zoo`` entry point of this package points at.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionPositional, KVCache, MultiHeadAttention
from transformer_zoo.core.masks import AttentionMask
from transformer_zoo.core.options import AttentionOptions, Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig


# ---- the formula --------------------------------------------------------------------------
def cosine_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``softmax(scale * q_hat k_hat^T + bias) v`` with unit-length ``q_hat``, ``k_hat``.

    Args:
        q: ``(B, H, Tq, Dh)``; k, v: ``(B, H, Tk, Dh)``.
        scale: the temperature, a tensor broadcastable to ``(B, H, Tq, Tk)`` (a scalar here).
        mask: bool, broadcastable to ``(B, H, Tq, Tk)``, True where a query may attend.
        bias: float, broadcastable to ``(B, H, Tq, Tk)``, added to the scores (ALiBi).

    Returns:
        The output ``(B, H, Tq, Dh)`` and the weights ``(B, H, Tq, Tk)``.
    """
    scores = scale * (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1))  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        # The lowest finite value rather than -inf: a query that sees no key stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a query with no key to attend to (all padding) gets zeros
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


# ---- the module ---------------------------------------------------------------------------
class CosineAttention(MultiHeadAttention):
    """Multi-head cosine attention for self- or cross-attention.

    Only the scoring differs from the core's multi-head attention: the projections, the
    key/value cache and the in-attention positions (rotary, ALiBi) come from
    :meth:`MultiHeadAttention.project`.

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_model // n_heads``.
        n_heads: number of heads.
        init_scale: the temperature ``g`` at initialisation; it is learned (in log space, so it
            stays positive).
        dropout: dropout on the attention weights, in training only.
        positional: an in-attention positional scheme, or None.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        init_scale: float = 10.0,
        dropout: float = 0.0,
        positional: AttentionPositional | None = None,
    ) -> None:
        super().__init__(d_model, n_heads, dropout=dropout, positional=positional)
        if init_scale <= 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

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
        q, k, v, bias = self.project(x, memory, cache)  # (B, H, T, Dh); reads and extends the cache
        allowed = mask.dense(q.size(-2), k.size(-2), q.device)
        out, weights = cosine_attention(q, k, v, self.log_scale.exp(), allowed, bias)
        if self.training and self.dropout:
            out = F.dropout(weights, self.dropout) @ v
        out = out.transpose(1, 2).flatten(2)  # (B, Tq, D)
        return self.out_proj(out), weights if need_weights else None


# ---- the options model: the attention kind "cosine" ---------------------------------------
class CosineAttentionOptions(AttentionOptions):
    """Multi-head attention on cosine similarities with a learned temperature (QKNorm)."""

    kind: Literal["cosine"] = "cosine"
    init_scale: float = Field(
        10.0, gt=0.0, description="temperature g multiplying the cosine scores at initialisation (then learned)"
    )

    def build(
        self, *, d_model: int, n_heads: int, dropout: float, positional: AttentionPositional | None = None
    ) -> nn.Module:
        return CosineAttention(
            d_model, n_heads, init_scale=self.init_scale, dropout=dropout, positional=positional
        )


# ---- the variant: transformer-tiny with cosine attention everywhere -----------------------
COSINE_TINY = {
    **TINY,
    "encoder": {**TINY["encoder"], "attention": "cosine"},
    "decoder": {**TINY["decoder"], "attention": "cosine", "cross_attention": "cosine"},
}


# ---- the hooks ----------------------------------------------------------------------------
@tz.hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [CosineAttentionOptions]


@tz.hookimpl
def tzoo_variants() -> list[Variant]:
    return [
        Variant(
            name="cosine-transformer-tiny",
            config=TransformerConfig,
            defaults=COSINE_TINY,
            description="transformer-tiny with cosine attention in every attention block",
        )
    ]
