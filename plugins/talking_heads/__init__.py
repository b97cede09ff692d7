"""Talking-heads attention (Shazeer et al. 2020, "Talking-Heads Attention", arXiv 2003.02436).

The heads exchange information twice: their scores are mixed across heads by a learned
``h x h`` matrix ``P_l`` before the softmax, and their weights by another, ``P_w``, after it
(the paper's section 4, with as many heads for the logits and the weights as for the queries,
keys and values)::

    logits[g, i, j]  = sum_h P_l[h, g] * (q[h, i] . k[h, j] / sqrt(d_head) + bias[h, i, j])
    weights          = softmax_j(logits)      (masked keys get no weight)
    weights'[g, i, j] = sum_h P_w[h, g] * weights[h, i, j]
    out[g, i]        = sum_j weights'[g, i, j] * v[g, j]

The kernel is an ``nn.Module`` holding ``P_l`` and ``P_w``, so they are parameters of the
attention module (``...self_attn.kernel.logits_mix``). Both start as the identity: at
initialisation the kind is multi-head attention.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, apply_weights
from transformer_zoo.core.options import AttentionOptions, LayerSpec
from transformer_zoo.registry import hookimpl


class TalkingHeadsKernel(nn.Module):
    """The talking-heads kernel (the :class:`~transformer_zoo.core.attention.Kernel` contract).

    Args:
        n_heads: heads, mixed by two ``(n_heads, n_heads)`` matrices that start as the identity.
    """

    category: ClassVar[str] = "kernel"

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.logits_mix = nn.Parameter(torch.eye(n_heads))  # P_l[h, g]: head h's share in head g's logits
        self.weights_mix = nn.Parameter(torch.eye(n_heads))  # P_w

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        bias: Tensor | None,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
        if bias is not None:
            scores = scores + bias
        scores = torch.einsum("bhqk,hg->bgqk", scores, self.logits_mix.to(scores.dtype))
        allowed = mask.dense(q.size(-2), k.size(-2), q.device)  # masked after mixing: -inf must not mix
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(dim=-1)
        if allowed is not None:  # a query with no key to see gets zeros, not NaN
            weights = weights.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
        weights = torch.einsum("bhqk,hg->bgqk", weights, self.weights_mix.to(weights.dtype))
        return apply_weights(weights, v, dropout_p), weights if need_weights else None


class TalkingHeadsOptions(AttentionOptions):
    """Talking-heads attention (Shazeer et al. 2020): learned h x h matrices mix the heads' scores
    before the softmax and their weights after it; both start as the identity (multi-head attention)."""

    kind: Literal["talking-heads"] = "talking-heads"

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(kernel=TalkingHeadsKernel(layer.n_heads))


@hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [TalkingHeadsOptions]
