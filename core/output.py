"""What a model returns, :class:`ModelOutput`: a module of its own that imports nothing of the
package but torch, so that the package can register it with torch's pytrees as soon as torch is
imported (``transformer_zoo/__init__.py``), and ``torch.export.load`` reads a saved program back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.export
from torch import Tensor

if TYPE_CHECKING:
    from .layers import StackOutput


@dataclass
class ModelOutput:
    """What :class:`EncoderDecoder` returns.

    Read it by attribute (``out.logits``), or as ``transformers``' ``ModelOutput`` is read: by
    key (``out["logits"]``), by index (``out[0]``) or as ``out.to_tuple()``. Keys and indices
    run over the fields that are set, ``loss`` first and then in the order below: a field that
    is None or empty (no labels given, no attention weights asked for, no auxiliary loss) is
    left out, so ``out[0]`` is the loss when the forward had ``labels=``, else the logits.

    Attributes:
        logits: the head's output: ``(B, T, V)`` for token heads, ``(B, C)`` for sequence heads.
        hidden: the last stack's hidden states ``(B, T, D)``.
        attentions: weights by stack (``encoder``, ``decoder``), per layer application, by block.
        aux_loss: terms to add to the task loss (ponder cost, experts' load balancing), or None.
        extras: other per-forward outputs of the stacks, prefixed by stack name (``encoder_ponder_time``,
            ``decoder_moe_dropped``, ...).
        loss: the model's loss on the forward's ``labels=`` (:meth:`ZooModel.loss`), or None.
    """

    logits: Tensor
    hidden: Tensor
    attentions: dict[str, list[dict[str, Tensor]]] = field(default_factory=dict)
    aux_loss: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    loss: Tensor | None = None

    def keys(self) -> list[str]:
        """The names of the fields that are set (not None, not empty): ``loss``, then in order."""
        names = ["loss", *(f.name for f in fields(self) if f.name != "loss")]
        return [name for name in names if _is_set(getattr(self, name))]

    def values(self) -> list[Any]:
        return [getattr(self, key) for key in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(key, getattr(self, key)) for key in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        """The values of the fields that are set, in order: ``([loss,] logits, hidden, ...)``."""
        return tuple(self.values())

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(f"{key!r} is not set in this output; set: {', '.join(self.keys())}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self) -> Iterator[str]:  # as a mapping's: its keys
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    @classmethod
    def of(
        cls,
        logits: Tensor,
        stacks: dict[str, StackOutput | None],
        *,
        need_weights: bool = False,
        extras: dict[str, Tensor] | None = None,
    ) -> ModelOutput:
        """The output of a model whose ``stacks`` (by name, in order; None for an absent one)
        produced ``logits``: the last stack's hidden states, every stack's attention weights
        (when asked for), the sum of their auxiliary losses, and their extras prefixed by stack name."""
        ran = {name: out for name, out in stacks.items() if out is not None}
        terms = [out.aux_loss for out in ran.values() if out.aux_loss is not None]
        return cls(
            logits=logits,
            hidden=list(ran.values())[-1].hidden,
            attentions={name: out.attentions for name, out in ran.items()} if need_weights else {},
            aux_loss=sum(terms[1:], terms[0]) if terms else None,
            extras={
                **{f"{name}_{key}": value for name, out in ran.items() for key, value in out.extras.items()},
                **(extras or {}),
            },
        )


# A pytree node, so that torch.export can return it; the name keeps saved programs loadable if the class moves.
torch.export.register_dataclass(ModelOutput, serialized_type_name="transformer_zoo.core.model.ModelOutput")


def _is_set(value: Any) -> bool:
    return value is not None and not (isinstance(value, (dict, list, tuple)) and not value)
