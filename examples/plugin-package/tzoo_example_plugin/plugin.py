"""Cosine attention (Henry et al. 2020, "Query-Key Normalization for Transformers").

Scores are cosine similarities of queries and keys times a learned temperature ``g``:
``softmax(g * q_hat k_hat^T) V``, with ``q_hat``, ``k_hat`` unit vectors per head.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

import transformer_zoo as tz
from transformer_zoo.core.attention import KVCache, MultiHeadAttention
from transformer_zoo.core.masks import AttentionMask
from transformer_zoo.core.options import AttentionOptions, Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig


class CosineAttention(MultiHeadAttention):
    """Multi-head attention on cosine similarities; reuses the projections and cache of the core."""

    def __init__(self, d_model: int, n_heads: int, *, dropout: float, init_scale: float) -> None:
        super().__init__(d_model, n_heads, dropout=dropout)
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
        mask = mask or AttentionMask()
        d = self.d_model
        if memory is None:
            q, k, v = self._heads(self.in_proj(x), 3)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            (q,) = self._heads(self._project(x, slice(0, d)), 1)
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value
            else:
                k, v = self._heads(self._project(memory, slice(d, 3 * d)), 2)
                if cache is not None:
                    cache.append(k, v)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        scores = self.log_scale.exp() * (q @ k.transpose(-2, -1))  # (B, H, Tq, Tk)
        dense = mask.dense(q.size(-2), k.size(-2), q.device)
        if dense is not None:
            scores = scores.masked_fill(~dense, float("-inf"))
        weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
        out = (weights @ v).transpose(1, 2).reshape(x.size(0), q.size(-2), d)  # (B, Tq, D)
        return self.out_proj(out), weights if need_weights else None


class Cosine(AttentionOptions):
    """Cosine-similarity attention with a learned temperature (QKNorm)."""

    kind: Literal["cosine"] = "cosine"
    init_scale: float = Field(10.0, gt=0.0, description="initial temperature multiplying the cosine scores")

    def build(self, *, d_model: int, n_heads: int, dropout: float, positional=None) -> nn.Module:
        if positional is not None:
            raise ValueError("cosine attention does not take in-attention positions; use sinusoidal or learned")
        return CosineAttention(d_model, n_heads, dropout=dropout, init_scale=self.init_scale)


COSINE_STACK = {"layers": 2, "attention": "cosine", "cross_attention": "cosine"}


@tz.hookimpl
def tzoo_components():
    return [Cosine]


@tz.hookimpl
def tzoo_variants():
    return [
        Variant(
            name="cosine-transformer-tiny",
            config=TransformerConfig,
            defaults={**TINY, "encoder": COSINE_STACK, "decoder": COSINE_STACK},
            description="transformer-tiny with cosine attention everywhere (example plugin)",
        )
    ]
