"""Stacks: how layers are composed into an encoder or a decoder.

A stack takes ``(B, T, D)`` and returns a :class:`StackOutput`. The ``standard`` stack runs
N distinct layers; other kinds (a shared layer applied T times, with adaptive computation
time) implement the same call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from .attention import KVCache
from .masks import AttentionMask


class DecoderCache:
    """Per-layer key/value caches of an incremental decoder, plus how many tokens it has seen.

    A stack asks for the cache of its i-th layer application with :meth:`layer`; a stack that
    applies one layer T times simply asks for T of them.
    """

    def __init__(self) -> None:
        self.layers: list[tuple[KVCache, KVCache]] = []
        self.offset = 0

    def layer(self, index: int) -> tuple[KVCache, KVCache]:
        while len(self.layers) <= index:
            self.layers.append((KVCache(), KVCache()))
        return self.layers[index]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` of every cache (beam search)."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(index)
            cross_cache.reorder(index)


@dataclass
class StackOutput:
    """What a stack returns.

    Attributes:
        hidden: ``(B, T, D)``.
        attentions: per layer application, the weights by block name (``self``, ``cross``),
            each ``(B, H, Tq, Tk)``; empty unless asked for.
        aux_loss: a term to add to the training loss (ponder cost), or None.
        extras: other per-forward outputs a stack exposes (ponder times), by name.
    """

    hidden: Tensor
    attentions: list[dict[str, Tensor]] = field(default_factory=list)
    aux_loss: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)


class StandardStack(nn.Module):
    """N distinct layers applied in turn, then an optional final norm (needed by pre-norm)."""

    def __init__(self, layers: list[nn.Module], *, final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        self_mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> StackOutput:
        attentions = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(
                x,
                memory,
                self_mask=self_mask,
                memory_mask=memory_mask,
                cache=None if cache is None else cache.layer(i),
                need_weights=need_weights,
            )
            if need_weights:
                attentions.append(weights)
        return StackOutput(self.final_norm(x), attentions)
