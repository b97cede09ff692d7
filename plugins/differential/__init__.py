"""Differential attention (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258, section 2.1).

The model's ``h`` heads are paired into ``h / 2`` differential heads. Differential head ``j``
has two query maps and two key maps of width ``d`` (the model's query and key heads ``2j`` and
``2j + 1``: ``Q1, Q2`` and ``K1, K2``) and values of width ``2d`` (the value heads ``2j`` and
``2j + 1`` side by side). It attends by the difference of two softmax maps (the paper's eq. 1),
the second weighed by a learned scalar ``lambda`` (eq. 2)::

    DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V
    lambda      = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
    lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))          (l: the layer's index, from 1)

Each differential head's output is normalised by RMSNorm over its ``2d`` channels (the paper's
headwise norm, ``subln`` in its reference code, eps 1e-5) and multiplied by
``1 - lambda_init`` (eq. 3); the heads are then concatenated and projected by ``W_O``, as in
multi-head attention.

The queries, keys and values come from the model's usual fused projection
(:class:`~transformer_zoo.core.attention.MultiHeadAttention`), so rotary positions turn each
query and key head of width ``d`` as usual, and the parameters are multi-head attention's plus
the four lambda vectors (``4d``) and the norm's weight (``2d``) per layer. The kernel,
:class:`DifferentialKernel`, is an ``nn.Module`` holding them (``...self_attn.kernel.lambda_q1``).

Grouped-query attention follows the reference's recommended kernel (``multihead_flashdiff_1.py``):
the ``n_kv_heads`` key heads pair up as ``n_kv_heads / 2`` groups (``K1, K2`` and a value of width
``2d``), each read by ``n_heads / n_kv_heads`` consecutive differential heads.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, sdpa_kernel
from transformer_zoo.core.options import AttentionOptions, LayerSpec
from transformer_zoo.registry import hookimpl


def lambda_init_at(depth: int) -> float:
    """The paper's initial lambda of the layer at index ``depth`` from 0 (``l - 1``, l from 1):
    ``0.8 - 0.6 exp(-0.3 (l - 1))``, 0.2 in the first layer, rising towards 0.8."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def _heads_of(x: Tensor | None, parity: int, n_heads: int) -> Tensor | None:
    """Of ``x`` broadcastable to ``(B, n_heads, Tq, Tk)`` (a bias or an explicit mask), the heads
    ``parity, parity + 2, ...``: what the first (0) or second (1) map of each differential head reads."""
    if x is None or x.dim() < 3 or x.size(-3) != n_heads:
        return x  # one value for every head
    return x[..., parity::2, :, :]


class DifferentialKernel(nn.Module):
    """The differential attention kernel (the :class:`~transformer_zoo.core.attention.Kernel` contract).

    Receives the queries ``(B, h, Tq, d)`` and the keys and values ``(B, h, Tk, d)`` of the
    model's ``h`` heads and returns the ``h / 2`` differential heads' outputs ``(B, h/2, Tq, 2d)``
    (eqs. 1 to 3 of the paper, the norm and ``1 - lambda_init`` included), which
    ``MultiHeadAttention`` concatenates to ``h d`` channels; with ``need_weights``, the weights
    ``A1 - lambda A2`` ``(B, h/2, Tq, Tk)``, which may be negative. Dropout (training only) falls on
    each softmax map before it weighs the values.

    Args:
        n_heads: the model's heads ``h``, even.
        d_head: their width ``d``.
        lambda_init: the constant in ``lambda`` and the output factor ``1 - lambda_init``
            (:func:`lambda_init_at` gives the paper's schedule).
        kv_group: ``n_heads / n_kv_heads``, the query heads each key/value head serves (1: no grouping).
    """

    category: ClassVar[str] = "kernel"

    def __init__(self, n_heads: int, d_head: int, lambda_init: float, *, kv_group: int = 1) -> None:
        super().__init__()
        if n_heads % 2 or (n_heads // kv_group) % 2:
            raise ValueError(
                f"differential attention pairs heads, so n_heads={n_heads} and its key/value heads "
                f"({n_heads // kv_group}) must be even"
            )
        self.n_heads = n_heads
        self.lambda_init = lambda_init
        self.kv_group = kv_group
        # The re-parameterised lambda's four vectors, drawn N(0, 0.1^2) as in the reference code.
        self.lambda_q1 = nn.Parameter(torch.randn(d_head) * 0.1)
        self.lambda_k1 = nn.Parameter(torch.randn(d_head) * 0.1)
        self.lambda_q2 = nn.Parameter(torch.randn(d_head) * 0.1)
        self.lambda_k2 = nn.Parameter(torch.randn(d_head) * 0.1)
        self.head_norm = nn.RMSNorm(2 * d_head, eps=1e-5)

    def extra_repr(self) -> str:
        return f"differential heads={self.n_heads // 2}, lambda_init={self.lambda_init:.4g}"

    def lambda_full(self) -> Tensor:
        """``lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init`` (eq. 2), 0-d."""
        first = torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
        second = torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
        return first - second + self.lambda_init

    def paired(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``K1, K2`` ``(B, h/2, Tk, d)`` and ``V`` ``(B, h/2, Tk, 2d)`` of each differential head,
        from the keys and values ``(B, h, Tk, d)`` that ``MultiHeadAttention`` repeated for its query heads."""
        # The key/value heads (B, n_kv, Tk, d), before the module's one-by-one repetition: the reference
        # groups them in pairs, K1 and K2 of a group serving the same differential heads.
        k, v = k[:, :: self.kv_group], v[:, :: self.kv_group]
        b, n_kv, t, d = v.shape
        v = v.view(b, n_kv // 2, 2, t, d).transpose(2, 3).reshape(b, n_kv // 2, t, 2 * d)  # heads 2i, 2i+1 side by side
        parts = k[:, 0::2], k[:, 1::2], v
        if self.kv_group == 1:
            return parts
        return tuple(part.repeat_interleave(self.kv_group, dim=1) for part in parts)

    def logit_pairs(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The queries and keys this kernel scores, head by head: the queries ``(B, h, Tq, d)``
        unchanged, and for query head ``2j`` differential head ``j``'s ``K1``, for ``2j + 1`` its
        ``K2`` (:meth:`paired`), ``(B, h, Tk, d)``. Under grouped-query attention these are not the
        key heads ``2j`` and ``2j + 1`` of the module's repetition."""
        k1, k2, _ = self.paired(k, k)
        return q, torch.stack((k1, k2), dim=2).flatten(1, 2)  # (B, h/2, 2, Tk, d) to (B, h, Tk, d)

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
        k1, k2, v = self.paired(k, v)
        outs, maps = [], []
        for parity, keys in enumerate((k1, k2)):  # softmax(Q1 K1^T / sqrt(d)) V, then with Q2, K2
            heads_mask = dataclasses.replace(mask, explicit=_heads_of(mask.explicit, parity, self.n_heads))
            heads_bias = _heads_of(bias, parity, self.n_heads)
            out, weights = sdpa_kernel(q[:, parity::2], keys, v, heads_mask, heads_bias, dropout_p, need_weights)
            outs.append(out)  # (B, h/2, Tq, 2d)
            maps.append(weights)
        lam = self.lambda_full().to(q.dtype)
        out = self.head_norm(outs[0] - lam * outs[1]) * (1 - self.lambda_init)  # (B, h/2, Tq, 2d)
        return out, maps[0] - lam * maps[1] if need_weights else None


class DifferentialOptions(AttentionOptions):
    """Differential attention (Ye et al. 2024): each pair of heads attends by the difference of
    two softmax maps, the second weighed by a learned lambda; each pair's output is RMS-normalised
    and multiplied by ``1 - lambda_init``."""

    kind: Literal["differential"] = "differential"
    # Every capability flag keeps its default: full softmax attention over each map (full), a
    # positional bias on each map's scores, each head's own (takes_bias), rotary per head of width d
    # (takes_positions), scale on the queries before SDPA divides by sqrt(d) (takes_scale), causal
    # and cross-attention (takes_causal, self_only False), any head width (takes_head_dim), values
    # formed in the module's project, where a value residual mixes them (takes_value_residual); no
    # soft-capping, as SDPA does not cap (takes_softcap False), and no sinks (takes_sinks False): a
    # sink would join each map's softmax, which the paper does not define.

    lambda_init: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="the constant in lambda and the output factor 1 - lambda_init; null: the paper's "
        "schedule 0.8 - 0.6 exp(-0.3 (l - 1)), l the layer's index from 1",
    )

    @model_validator(mode="after")
    def _kv_heads_pair_up(self) -> DifferentialOptions:
        if self.n_kv_heads is not None and self.n_kv_heads % 2:
            raise ValueError(
                f"differential attention pairs the key heads (K1, K2) and value heads, so n_kv_heads must be "
                f"even, got {self.n_kv_heads}; choose an even divisor of n_heads, or null for one per query head"
            )
        return self

    def check_use(self, *, n_heads: int, **uses: Any) -> None:
        super().check_use(n_heads=n_heads, **uses)
        if n_heads % 2:
            raise ValueError(
                f"differential attention pairs the model's heads (2j, 2j + 1) into n_heads / 2 differential "
                f"heads, so n_heads must be even, got {n_heads}; use an even number of heads such as "
                f"{n_heads + 1}, with a d_model it divides (or set head_dim)"
            )

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        lambda_init = lambda_init_at(layer.depth) if self.lambda_init is None else self.lambda_init
        d_head = layer.head_dim or layer.d_model // layer.n_heads
        kv_group = layer.n_heads // (self.n_kv_heads or layer.n_heads)
        return dict(kernel=DifferentialKernel(layer.n_heads, d_head, lambda_init, kv_group=kv_group))


@hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [DifferentialOptions]
