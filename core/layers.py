"""Building blocks of a layer: norms, feed-forward networks (dense and mixture of experts) and
the residual wrapper."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .masks import AttentionMask

if TYPE_CHECKING:
    from .options import LayerSpec

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class TokenBatchNorm(nn.BatchNorm1d):
    """Batch normalisation over the feature axis of ``(B, T, D)`` tensors (Ioffe & Szegedy 2015).

    Statistics are over real positions only: padding neither enters the batch mean and
    variance nor the running statistics, so a batch's statistics jitter only as its real
    tokens do (the contrast with layer norm that the lectures draw, made measurable). Padded
    positions come out as zeros whenever batch statistics are used; with running statistics
    (eval) every position is normalised by them. The state dict is ``nn.BatchNorm1d``'s.
    """

    category: ClassVar[str] = "norm"

    takes_padding: ClassVar[bool] = True

    def forward(self, x: Tensor, real: Tensor | None = None) -> Tensor:
        """``x``: ``(B, T, D)``; ``real``: ``(B, T)`` bool, True for a real token, or None (all real)."""
        uses_batch_stats = self.training or self.running_mean is None
        if real is None or not uses_batch_stats:
            return super().forward(x.transpose(1, 2)).transpose(1, 2)
        normed = super().forward(x[real])  # (N_real, D): the parent's statistics and running update
        out = normed.new_zeros(x.shape)
        out[real] = normed
        return out


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 act(W1 x)`` (Vaswani et al. 2017, eq. 2).

    ``dropout`` acts between the two projections, as in ``nn.TransformerEncoderLayer``.
    """

    category: ClassVar[str] = "ffn"

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class GatedFeedForward(nn.Module):
    """Gated feed-forward ``W2 (act(W x) * V x)`` (Shazeer 2020: GEGLU, SwiGLU)."""

    category: ClassVar[str] = "ffn"

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "silu", dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.dropout(self.activation(gate) * up))


@dataclass
class Routing:
    """What a mixture of experts did in its last forward, as tensors on its device (nothing is
    read back to the host). A stack gathers these after each layer (:func:`routings`).

    Attributes:
        aux_loss: the weighted load-balancing loss, 0-d.
        tokens: ``(E,)`` the token assignments each expert took (within its capacity).
        dropped: 0-d, the assignments over capacity (a token all of whose choices are dropped
            passes through the residual unchanged).
        capacity: 0-d, the most assignments one expert takes.
    """

    aux_loss: Tensor
    tokens: Tensor
    dropped: Tensor
    capacity: Tensor

    def __deepcopy__(self, memo: dict) -> Routing:
        # a copy of the model (an average of its weights, a frozen twin) keeps the values, not the autograd graph
        return Routing(*(value.detach().clone() for value in vars(self).values()))


class MixtureOfExperts(nn.Module):
    """A router sends each real token to its ``top_k`` best experts, within each expert's capacity.

    Top-1 is the Switch Transformer (Fedus et al. 2021): the output is ``p_i(x) E_i(x)``, ``p`` the
    router's softmax. Top-2 follows Shazeer et al. 2017 and GShard (Lepikhin et al. 2020): the two
    chosen experts' outputs weighted by their probabilities renormalised to sum to 1, the second
    choice always dispatched (no random second expert).

    An expert takes at most ``capacity = ceil(capacity_factor * tokens * top_k / experts)``
    assignments (capped at ``tokens``), ``tokens`` the real tokens of the batch. Slots are filled
    in order of priority: every token's first choice, then the second choices, tokens in batch
    order. An assignment past capacity is dropped: it adds nothing, so a token with no choice kept
    passes through the layer's residual unchanged. Padding is neither routed nor counted.

    The load-balancing loss is Switch's ``alpha * E * sum_i f_i P_i``: ``f_i`` the fraction of real
    tokens whose first choice is expert ``i``, ``P_i`` the mean router probability of expert ``i``
    over them. Each forward sets :attr:`routing` (a :class:`Routing`); routing has no randomness.

    Args:
        experts: the expert networks, each on ``(N, D)``.
        d_model: the width, the router's input.
        top_k: experts per token, 1 or 2.
        capacity_factor: the capacity's multiple of an even share.
        aux_loss_weight: ``alpha``, the load-balancing loss's weight.
    """

    category: ClassVar[str] = "ffn"

    takes_padding: ClassVar[bool] = True

    def __init__(
        self,
        experts: list[nn.Module],
        *,
        d_model: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        aux_loss_weight: float = 0.01,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= min(2, len(experts)):
            raise ValueError(f"top_k must be 1 or 2 and at most the number of experts ({len(experts)}), got {top_k}")
        self.router = nn.Linear(d_model, len(experts), bias=False)
        self.experts = nn.ModuleList(experts)
        self.top_k = top_k
        self.share = min(capacity_factor * top_k / len(experts), 1.0)  # capacity per token routed
        self.aux_loss_weight = aux_loss_weight
        self.routing: Routing | None = None

    def forward(self, x: Tensor, real: Tensor | None = None) -> Tensor:
        """``x``: ``(B, T, D)``; ``real``: ``(B, T)`` bool, True for a real token, or None (all real)."""
        n_experts, k = len(self.experts), self.top_k
        tokens = x.reshape(-1, x.size(-1))  # (N, D)
        n = tokens.size(0)
        real = torch.ones(n, dtype=torch.bool, device=x.device) if real is None else real.reshape(-1)
        probs = self.router(tokens).float().softmax(-1)  # (N, E), in float32 whatever x's dtype
        gates, chosen = probs.topk(k, dim=-1)  # (N, k)
        if k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        # assignments in order of priority: the first choices of every token, then the second choices
        routed = real.repeat(k)  # (k*N,)
        expert = chosen.t().reshape(-1)  # (k*N,)
        hits = (expert.unsqueeze(-1) == torch.arange(n_experts, device=x.device)) & routed.unsqueeze(-1)  # (k*N, E)
        slot = ((hits.long().cumsum(0) - 1) * hits).sum(-1)  # (k*N,) place in its expert's queue
        # each expert runs on a buffer of `slots` rows, sized by the shape (so nothing is read back to the host);
        # the capacity, counted over real tokens, fits in it
        slots = math.ceil(n * self.share)
        count = real.sum()
        capacity = torch.ceil(count * self.share).long().clamp(max=slots)
        kept = routed & (slot < capacity)

        where = torch.where(kept, expert * slots + slot, n_experts * slots)  # (k*N,) row E * slots takes the dropped
        buffer = tokens.new_zeros(n_experts * slots + 1, tokens.size(-1)).index_add(0, where, tokens.repeat(k, 1))
        buffer = buffer[:-1].view(n_experts, slots, -1)  # (E, C, D)
        outputs = torch.cat([ffn(rows) for ffn, rows in zip(self.experts, buffer)])  # (E*C, D)
        outputs = torch.cat([outputs, outputs.new_zeros(1, outputs.size(-1))])  # a zero row for the dropped
        weights = (gates.t().reshape(-1) * kept).to(outputs.dtype)  # (k*N,)
        out = (outputs[where] * weights.unsqueeze(-1)).view(k, n, -1).sum(0)  # (N, D)

        real_f = real.float().unsqueeze(-1)
        total = count.clamp(min=1)
        fraction = ((chosen[:, :1] == torch.arange(n_experts, device=x.device)) * real_f).sum(0) / total  # f_i
        mean_prob = (probs * real_f).sum(0) / total  # P_i
        self.routing = Routing(
            aux_loss=self.aux_loss_weight * n_experts * (fraction * mean_prob).sum(),
            tokens=(hits & kept.unsqueeze(-1)).sum(0),
            dropped=(routed & ~kept).sum(),
            capacity=capacity,
        )
        return out.view(x.shape)


def routings(module: nn.Module) -> list[Routing]:
    """The :class:`Routing` of each mixture of experts in ``module`` (any submodule whose
    ``routing`` attribute holds one), as its last forward set it, in module order."""
    found = [getattr(m, "routing", None) for m in module.modules()]
    return [routing for routing in found if isinstance(routing, Routing)]


def real_positions(x: Tensor, mask: AttentionMask | None) -> Tensor | None:
    """``(B, T)`` bool, True for the real tokens of ``x`` ``(B, T, D)``; None when ``mask`` has no
    padding. With a key/value cache the mask covers earlier keys too, and ``x`` holds the last."""
    if mask is None or mask.padding is None:
        return None
    return mask.padding[:, -x.size(1) :].bool()


def apply_norm(norm: nn.Module, x: Tensor, real: Tensor | None) -> Tensor:
    """``norm(x, real=real)`` for a norm whose class sets ``takes_padding = True``, else ``norm(x)``.

    A norm that mixes positions (batch norm) declares ``takes_padding`` to keep padding out of
    its statistics; any other module on ``(B, T, D)`` is called as it always was.
    """
    if getattr(norm, "takes_padding", False):
        return norm(x, real=real)
    return norm(x)


class TransformerLayer(nn.Module):
    """One layer: self-attention, optional cross-attention, feed-forward, each in a residual.

    With ``pre_norm`` the residual is ``x + drop(f(norm(x)))`` (Xiong et al. 2020); otherwise
    ``norm(x + drop(f(x)))``, the paper's post-norm. With ``rezero`` it is
    ``x + alpha_i * drop(f(norm(x)))``, ``alpha`` a learned scalar per sub-layer starting at 0, so
    the layer starts as the identity (Bachlechner et al. 2020, who use no norm: pass
    ``nn.Identity()`` norms). An encoder layer has no cross-attention; a decoder layer of an
    encoder-decoder has one.

    Args:
        self_attn: attention over the layer's own input.
        ffn: the position-wise network; one declaring ``takes_padding`` (a mixture of experts) is
            called as ``ffn(x, real=real)``, ``real`` ``(B, T)`` True for real positions or None.
        norms: one norm per sub-layer, in order (2 without cross-attention, 3 with); a norm
            declaring ``takes_padding`` is told which of ``x``'s positions are real (:func:`apply_norm`).
        cross_attn: attention to the encoder memory, or None.
        dropout: residual dropout.
        pre_norm: norm placement (without ``rezero``).
        rezero: scale each sub-layer's branch by ``alpha`` (parameter ``alpha``, one entry per sub-layer).
        spec: the :class:`~.options.LayerSpec` the layer was built from, kept as :attr:`spec` for
            a reader (None for a layer put together by hand).
    """

    category: ClassVar[str] = "layer"

    def __init__(
        self,
        self_attn: nn.Module,
        ffn: nn.Module,
        norms: list[nn.Module],
        *,
        cross_attn: nn.Module | None = None,
        dropout: float = 0.0,
        pre_norm: bool = False,
        rezero: bool = False,
        spec: LayerSpec | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        expected = 2 if cross_attn is None else 3
        if len(norms) != expected:
            raise ValueError(f"a layer with {expected - 1} attention block(s) needs {expected} norms, got {len(norms)}")
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.norms = nn.ModuleList(norms)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm
        self.alpha = nn.Parameter(torch.zeros(expected)) if rezero else None

    def _residual(self, x: Tensor, index: int, fn: Callable[[Tensor], Tensor], real: Tensor | None) -> Tensor:
        norm = self.norms[index]
        if self.alpha is not None:
            return x + self.alpha[index].to(x.dtype) * self.dropout(fn(apply_norm(norm, x, real)))
        if self.pre_norm:
            return x + self.dropout(fn(apply_norm(norm, x, real)))
        return apply_norm(norm, x + self.dropout(fn(x)), real)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        self_mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``x``: ``(B, T, D)``; ``memory``: ``(B, S, D)`` for a layer with cross-attention.

        Returns the output ``(B, T, D)`` and the attention weights asked for, by block name.
        """
        weights: dict[str, Tensor] = {}
        self_cache, cross_cache = cache if cache is not None else (None, None)
        real = real_positions(x, self_mask)  # every norm of the layer acts on the queries' positions

        def attend(h: Tensor) -> Tensor:
            out, w = self.self_attn(h, mask=self_mask, cache=self_cache, need_weights=need_weights)
            if w is not None:
                weights["self"] = w
            return out

        x = self._residual(x, 0, attend, real)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer attends to an encoder memory, but none was given")

            def cross(h: Tensor) -> Tensor:
                out, w = self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights)
                if w is not None:
                    weights["cross"] = w
                return out

            x = self._residual(x, 1, cross, real)
        ffn = partial(self.ffn, real=real) if getattr(self.ffn, "takes_padding", False) else self.ffn
        x = self._residual(x, len(self.norms) - 1, ffn, real)
        return x, weights

    def gathers(self) -> bool:
        """Whether :meth:`forward_at` computes what :meth:`forward` does at the positions it is
        given: the self-attention is a plain :class:`MultiHeadAttention` (no in-attention
        positions, no hook that changes keys, not self-only), and no norm or feed-forward mixes
        positions (``takes_padding``: batch norm, a mixture of experts)."""
        attn = self.self_attn
        plain = (
            isinstance(attn, MultiHeadAttention)
            and attn.positional is None
            and not attn.self_only
            and type(attn).kernel_inputs is MultiHeadAttention.kernel_inputs
            and type(attn).forward is MultiHeadAttention.forward
        )
        mixing = [m for m in (*self.norms, self.ffn) if getattr(m, "takes_padding", False)]
        return plain and not mixing

    def forward_at(
        self,
        x: Tensor,
        index: Tensor,
        memory: Tensor | None = None,
        *,
        self_mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
        cross_cache: KVCache | None = None,
    ) -> Tensor:
        """The layer's output ``(B, Q, D)`` at positions ``index`` ``(B, Q)`` of ``x`` ``(B, T, D)``
        only: those positions' queries attend to every key of ``x``, as in :meth:`forward`, and
        only they go through the feed-forward network (for a layer that :meth:`gathers`).

        ``cross_cache`` keeps the encoder memory's keys and values between calls on one memory.
        """
        keys = x
        x = x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        mask = self_mask or AttentionMask()
        explicit = None
        if mask.causal:  # a query sees the keys at or before its own position
            explicit = (index.unsqueeze(-1) >= torch.arange(keys.size(1), device=x.device)).unsqueeze(1)
        mask = AttentionMask(padding=mask.padding, explicit=explicit)
        context = keys if self.alpha is None and not self.pre_norm else self.norms[0](keys)

        def attend(h: Tensor) -> Tensor:
            return self.self_attn(h, context, mask=mask)[0]

        x = self._residual(x, 0, attend, None)
        if self.cross_attn is not None:
            x = self._residual(x, 1, lambda h: self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache)[0], None)
        return self._residual(x, len(self.norms) - 1, self.ffn, None)
