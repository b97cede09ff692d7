"""Learned relative positions inside attention: T5's bucketed bias and Shaw et al.'s relative keys.

Papers: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer" (T5), section 2.1; Shaw et al. 2018, "Self-Attention with Relative
Position Representations".

Both are :class:`~transformer_zoo.core.attention.AttentionPositional` schemes: the model builds one
per stack and hands it to every self-attention layer of that stack, so its table is shared by
the stack's layers (T5's choice; cross-attention gets no positions). Positions are those of
:meth:`~transformer_zoo.core.attention.AttentionPositional.bias`: the queries are the last ``Tq``
of ``Tk`` keys, or start at ``q_offset`` under a static cache.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionPositional
from transformer_zoo.core.options import PositionalOptions
from transformer_zoo.core.validation import MAX_LENGTH
from transformer_zoo.registry import hookimpl


def relative_distances(q_len: int, k_len: int, device: torch.device, q_offset: int | Tensor | None = None) -> Tensor:
    """``key position - query position`` ``(Tq, Tk)``: keys at ``0 .. k_len - 1``, queries at
    ``q_offset + i`` (a 0-d tensor under a static cache), or end-aligned (``k_len - q_len + i``)."""
    start = k_len - q_len if q_offset is None else q_offset
    return torch.arange(k_len, device=device)[None, :] - (start + torch.arange(q_len, device=device))[:, None]


def relative_position_bucket(
    relative: Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each ``key - query`` distance (Mesh TensorFlow's ``_relative_position_bucket``).

    Bidirectional: half the buckets for keys before the query (and itself), half for keys after
    it; unidirectional (a causal decoder): every bucket for keys before it, later keys in bucket 0.
    Of a direction's ``n`` buckets, the first ``n / 2`` hold one distance each (0, 1, ...); the rest
    are logarithmically wider up to ``max_distance``, and every farther distance shares the last.
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    # clamped so that the exact distances, which torch.where drops, take no log of 0
    ratio = distance.float().clamp(min=max_exact) / max_exact
    large = max_exact + (torch.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class T5RelativeBias(AttentionPositional):
    """A learned scalar per (distance bucket, head) added to the scores (Raffel et al. 2020, section 2.1).

    Args:
        n_heads: heads; each has its own scalar per bucket.
        num_buckets, max_distance, bidirectional: the bucketing (:func:`relative_position_bucket`).
        init_std: the table starts from N(0, init_std^2).
    """

    def __init__(
        self,
        n_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        init_std: float = 1.0,
    ) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)  # transformers' T5 name
        nn.init.normal_(self.relative_attention_bias.weight, std=init_std)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"

    def bias(self, q_len: int, k_len: int, device: torch.device, q_offset: Tensor | None = None) -> Tensor:
        relative = relative_distances(q_len, k_len, device, q_offset)
        buckets = relative_position_bucket(
            relative, bidirectional=self.bidirectional, num_buckets=self.num_buckets, max_distance=self.max_distance
        )
        return self.relative_attention_bias(buckets).permute(2, 0, 1)  # (H, Tq, Tk)


class ShawRelativeKeys(AttentionPositional):
    """Relative keys (Shaw et al. 2018, eq. 4): ``q_i . a_ij / sqrt(d_head)`` added to the scores.

    ``a_ij = w_clip(j - i, k)`` is a learned ``d_head`` vector per clipped distance ``-k .. k``,
    shared by the heads, as in the paper. Computed as tensor2tensor's
    ``dot_product_attention_relative`` does, less its ``(Tq, Tk, d_head)`` gather: the queries'
    products with the ``2k + 1`` vectors first, then picked per query-key pair.

    Args:
        d_head: width of a head.
        max_relative_position: ``k``, the distance beyond which every key shares one vector.
    """

    def __init__(self, d_head: int, max_relative_position: int) -> None:
        super().__init__()
        self.max_relative_position = max_relative_position
        self.relative_keys = nn.Embedding(2 * max_relative_position + 1, d_head)  # row r: distance r - k
        nn.init.xavier_uniform_(self.relative_keys.weight)  # tensorflow's default, which tensor2tensor's table has

    def extra_repr(self) -> str:
        return f"max_relative_position={self.max_relative_position}"

    def query_bias(self, q: Tensor, k_len: int, q_offset: Tensor | None = None) -> Tensor:
        k = self.max_relative_position
        index = relative_distances(q.size(-2), k_len, q.device, q_offset).clamp(-k, k) + k  # (Tq, Tk)
        scores = q @ self.relative_keys.weight.to(q.dtype).T / math.sqrt(q.size(-1))  # (B, H, Tq, 2k + 1)
        return scores.gather(-1, index.expand(*scores.shape[:-1], k_len))  # (B, H, Tq, Tk)


# ---- options ------------------------------------------------------------------------------
class T5BiasOptions(PositionalOptions):
    """T5's relative position bias (Raffel et al. 2020, section 2.1): a learned scalar per head and
    distance bucket, added to the attention scores; exact buckets for short distances, logarithmic
    ones up to max_distance. One table per stack, shared by its layers, as in T5."""

    kind: Literal["t5-bias"] = "t5-bias"
    in_attention: ClassVar[bool] = True
    scores_bias: ClassVar[bool] = True
    relative: ClassVar[bool] = True

    num_buckets: int = Field(
        32,
        ge=2,
        le=MAX_LENGTH,
        description="distance buckets (T5: 32), split between the two "
        "directions when bidirectional; half of a direction's are one distance each",
    )
    max_distance: int = Field(
        128,
        ge=2,
        le=MAX_LENGTH,
        description="distance at which the logarithmic buckets end; farther keys share the last bucket (T5: 128)",
    )
    bidirectional: bool = Field(
        True,
        description="buckets for keys after the query too (T5's encoder); false: all "
        "buckets for earlier keys (T5's decoder). An encoder-decoder takes one setting for both "
        "stacks; a causal decoder works with either",
    )

    @model_validator(mode="after")
    def _buckets_fit(self) -> T5BiasOptions:
        per_direction = self.num_buckets // 2 if self.bidirectional else self.num_buckets
        if per_direction < 2:
            raise ValueError(
                f"num_buckets={self.num_buckets} leaves {per_direction} per direction; give at least "
                f"{4 if self.bidirectional else 2}"
            )
        if self.max_distance <= per_direction // 2:
            raise ValueError(
                f"max_distance={self.max_distance} must pass the {per_direction // 2} exact distances of "
                f"num_buckets={self.num_buckets}; raise max_distance or lower num_buckets"
            )
        return self

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        # initialised as transformers' T5 (Mesh TensorFlow's code does not say)
        return T5RelativeBias(
            n_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
            init_std=d_model**-0.5,
        )


class ShawOptions(PositionalOptions):
    """Relative position representations (Shaw et al. 2018): a learned vector per clipped distance
    j - i, whose product with the query is added to the scores (relative keys, a^K). Relative
    values (a^V) are left out: the paper's ablation of the two found keys alone as good as both.
    One table per stack, shared by its layers and heads."""

    kind: Literal["shaw"] = "shaw"
    in_attention: ClassVar[bool] = True
    scores_bias: ClassVar[bool] = True
    relative: ClassVar[bool] = True

    max_relative_position: int = Field(
        16,
        ge=1,
        le=MAX_LENGTH,
        description="clipping distance k: keys farther than k from the query share one vector (the paper's models: 16)",
    )

    def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
        return ShawRelativeKeys(d_model // n_heads, self.max_relative_position)


@hookimpl
def tzoo_components() -> list[type[PositionalOptions]]:
    return [T5BiasOptions, ShawOptions]
