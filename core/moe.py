"""Mixtures of experts: a router sends each token to its best experts, each within a capacity
(Shazeer et al. 2017; Lepikhin et al. 2020, GShard; Fedus et al. 2021, the Switch Transformer), and
what the stacks report of their routing."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    pass


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


def routing_outputs(routed: list[Routing]) -> tuple[Tensor | None, dict[str, Tensor]]:
    """What a stack reports of the mixtures of experts its layer applications ran, in order: the
    sum of their load-balancing losses, and extras ``moe_tokens`` ``(L, E)`` (assignments each
    expert took), ``moe_dropped`` ``(L,)`` (assignments over capacity) and ``moe_capacity`` ``(L,)``,
    one row per application; ``(None, {})`` when there were none."""
    if not routed:
        return None, {}
    aux = sum((r.aux_loss for r in routed[1:]), routed[0].aux_loss)
    return aux, {
        "moe_tokens": torch.stack([r.tokens for r in routed]),
        "moe_dropped": torch.stack([r.dropped for r in routed]),
        "moe_capacity": torch.stack([r.capacity for r in routed]),
    }
