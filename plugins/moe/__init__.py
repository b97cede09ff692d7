"""Mixtures of experts: the ``moe`` feed-forward kind, any variant's by config (``ffn: moe``).

Papers: Shazeer et al. 2017 ("Outrageously Large Neural Networks: The Sparsely-Gated
Mixture-of-Experts Layer"), Lepikhin et al. 2020 (GShard, top-2), Fedus et al. 2021 (the Switch
Transformer, top-1). The module is the core's :class:`~transformer_zoo.core.moe.MixtureOfExperts`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from torch import nn

from transformer_zoo.core.layers import FeedForward
from transformer_zoo.core.moe import MixtureOfExperts
from transformer_zoo.core.validation import MAX_EXPERTS
from transformer_zoo.plugins.components import ActivationOptions
from transformer_zoo.registry import hookimpl


class MoEOptions(ActivationOptions):
    """Mixture of experts: a router sends each token to its top-k of ``experts`` MLPs, each within a
    capacity (Switch Transformer, Fedus et al. 2021, with top-1; Shazeer et al. 2017 and GShard,
    Lepikhin et al. 2020, with top-2). Its load-balancing loss joins the model's loss; the stacks
    report each layer's routing in the output's extras (``moe_tokens``, ``moe_dropped``, ``moe_capacity``)."""

    kind: Literal["moe"] = "moe"
    experts: int = Field(8, ge=1, le=MAX_EXPERTS, description="number of experts, each an MLP of width d_ff")
    top_k: int = Field(1, ge=1, le=2, description="experts per token: 1 (Switch) or 2 (GShard)")
    capacity_factor: float = Field(
        1.25,
        gt=0.0,
        description="expert capacity ceil(capacity_factor * tokens * top_k / "
        "experts); assignments past it are dropped (the token passes through the residual)",
    )
    aux_loss_weight: float = Field(
        0.01,
        ge=0.0,
        description="alpha of the load-balancing loss alpha * experts * sum_i f_i P_i added to the model's loss",
    )

    @model_validator(mode="after")
    def _enough_experts(self) -> MoEOptions:
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} needs at least {self.top_k} experts, got experts={self.experts}")
        return self

    def build(self, *, d_model: int, d_ff: int, dropout: float) -> nn.Module:
        experts = [FeedForward(d_model, d_ff, activation=self.activation, dropout=dropout) for _ in range(self.experts)]
        return MixtureOfExperts(
            experts,
            d_model=d_model,
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
            aux_loss_weight=self.aux_loss_weight,
        )


@hookimpl
def tzoo_components():
    return [MoEOptions]
