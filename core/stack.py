"""Stacks: how layers are composed into an encoder or a decoder.

A stack takes ``(B, T, D)`` and returns a :class:`StackOutput`. The ``standard`` stack runs
N distinct layers; other kinds (a shared layer applied T times, with adaptive computation
time) implement the same call. After each layer application a stack gathers the routing of
the mixtures of experts it ran (:func:`~.layers.routings`) into its auxiliary loss and extras
(:func:`routing_outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from .attention import KVCache, StaticKVCache
from .layers import Routing, TransformerLayer, apply_norm, real_positions, routings
from .masks import AttentionMask
from .positional import add_positions, position_starts, sinusoid_table


class DecoderCache:
    """Per-layer key/value caches of an incremental decoder, plus how many tokens it has seen.

    A stack asks for the cache of its i-th layer application with :meth:`layer`; a stack that
    applies one layer T times simply asks for T of them. The caches grow with every step (see
    :class:`StaticDecoderCache` for preallocated ones).
    """

    def __init__(self) -> None:
        self.layers: list[tuple[KVCache, KVCache]] = []
        self.offset = 0

    def layer(self, index: int) -> tuple[KVCache, KVCache]:
        while len(self.layers) <= index:
            self.layers.append((KVCache(), KVCache()))
        return self.layers[index]

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's keys, values and state (self- and cross-attention)."""
        return sum(
            t.nbytes
            for caches in self.layers
            for cache in caches
            for t in (cache.key, cache.value, *cache.state.values())
            if t is not None
        )

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` of every cache (beam search)."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(index)
            cross_cache.reorder(index)


class StaticDecoderCache(DecoderCache):
    """A decoder cache whose self-attention caches are preallocated to ``capacity`` positions
    (:class:`~transformer_zoo.core.attention.StaticKVCache`) and whose ``offset`` is a 0-d
    tensor on ``device``, advanced in place: a decoding step has the same shapes and addresses
    every time, and reads no value back to the host, so it can be captured as a CUDA graph.
    Reordering (beam search) writes the selected rows in place too.
    """

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=device)
        super().__init__()

    @property
    def offset(self) -> Tensor:
        return self.position

    @offset.setter
    def offset(self, value: int | Tensor) -> None:
        if value is not self.position:  # ``offset += n`` has already added in place
            self.position.copy_(torch.as_tensor(value))

    def layer(self, index: int) -> tuple[KVCache, KVCache]:
        while len(self.layers) <= index:
            self.layers.append((StaticKVCache(self.capacity, self.position), KVCache(in_place=True)))
        return self.layers[index]


@dataclass
class StackOutput:
    """What a stack returns.

    Attributes:
        hidden: ``(B, T, D)``.
        attentions: per layer application, the weights by block name (``self``, ``cross``),
            each ``(B, H, Tq, Tk)``; empty unless asked for.
        aux_loss: a term to add to the training loss (ponder cost, experts' load balancing), or None.
        extras: other per-forward outputs a stack exposes (ponder times, experts' routing), by name.
    """

    hidden: Tensor
    attentions: list[dict[str, Tensor]] = field(default_factory=list)
    aux_loss: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)


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


class StandardStack(nn.Module):
    """N distinct layers applied in turn, then an optional final norm (needed by pre-norm)."""

    category: ClassVar[str] = "stack"

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
        starts: Tensor | None = None,
    ) -> StackOutput:
        """``starts`` (random position starts, in training) is for stacks that add positions
        themselves; here the embeddings have added them."""
        attentions, routed = [], []
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
            routed += routings(layer)
        aux, extras = routing_outputs(routed)
        return StackOutput(apply_norm(self.final_norm, x, real_positions(x, self_mask)), attentions, aux, extras)


class StepSignal(nn.Module):
    """What a recurrent stack adds to its input before each step: the sinusoid of the step
    index ``t`` and, when given, the positions (Dehghani et al. 2018, section 2.1:
    ``P^t[i, 2j] = sin(i / 10000^(2j/d)) + sin(t / 10000^(2j/d))``, cosines at odd ``j``).

    Args:
        d_model: the width.
        steps: the number of steps.
        positional: an additive positional module taking ``(x, offset)``, or None when the
            positions are added once by the embeddings or act inside attention.
        random_offset: in training, each sequence's positions start at a random offset in
            ``[0, random_offset)`` (:meth:`starts`); 0: off.
    """

    category: ClassVar[str] = "positional"

    def __init__(
        self, d_model: int, steps: int, positional: nn.Module | None = None, *, random_offset: int = 0
    ) -> None:
        super().__init__()
        self.register_buffer("timestep", sinusoid_table(steps + 1, d_model), persistent=False)  # (T + 1, D): t = 1..T
        self.positional = positional
        self.random_offset = random_offset

    def starts(self, x: Tensor, offset: int, drawn: Tensor | None = None) -> int | Tensor:
        """Where the positions of each sequence of ``x`` start, drawn once per forward of the stack
        so that a sequence keeps one start at every step (:func:`~.positional.position_starts`);
        ``drawn``: the model's draw for the batch, shared by its encoder and decoder."""
        if self.positional is None:
            return offset
        return position_starts(x, offset, self.random_offset, self.training, drawn)

    def forward(self, x: Tensor, step: int, offset: int | Tensor = 0) -> Tensor:
        """``x`` ``(B, T, D)`` plus the signal of ``step``; ``offset``: the first position, or one
        per sequence ``(B,)`` from :meth:`starts`."""
        if self.positional is not None:
            x = add_positions(self.positional, x, offset)
        return x + self.timestep[step + 1].to(x.dtype)  # step 0 is the paper's t = 1


class RecurrentStack(nn.Module):
    """One shared layer applied up to ``steps`` times (the Universal Transformer), with
    optional adaptive computation time (ACT, Graves 2016).

    Without ACT every position goes through exactly ``steps`` applications. With ACT a halting
    unit gives each position a probability ``p_t = sigmoid(w . s_t + b)`` per step; a position
    halts at the first step ``N`` where its cumulative probability would pass ``threshold``
    (or at the last step), its last weight being the remainder ``R = 1 - sum_{t<N} p_t``. Its
    output is the weighted mean ``sum_t w_t s_t`` of its states (``w_t = p_t``, ``w_N = R``), and
    once halted its state is copied unchanged to every later step. The ponder time
    ``rho = N + R`` of each position is returned in ``extras["ponder_time"]``, and
    ``ponder_weight * mean(rho)`` over real positions as the auxiliary loss.

    In eager mode a step sends only the positions still running through the layer (once every
    row has one that halted or is padding): their queries attend to every position's keys (a
    halted position's state still serves as context), and only they go through the feed-forward
    network; the encoder memory's keys are then projected once for all steps. Exported and compiled graphs, decoding with a cache, attention weights
    asked for, and a layer that does not :meth:`~TransformerLayer.gathers` run the dense form
    (every position, halted ones copied), which computes the same outputs.
    ``gather_running = False`` forces the dense form.

    Args:
        layer: the shared layer (one set of parameters whatever ``steps`` is).
        steps: the most applications ``T``.
        signal: adds the step (and position) signal before each application.
        halting: the halting unit, ``Linear(d_model, 1)``, or None for no ACT.
        threshold: ``1 - epsilon`` of ACT.
        ponder_weight: the weight of the ponder cost in the loss.
        final_norm: a norm after the last step, or None.
    """

    category: ClassVar[str] = "stack"

    def __init__(
        self,
        layer: nn.Module,
        steps: int,
        *,
        signal: StepSignal,
        halting: nn.Linear | None = None,
        threshold: float = 0.99,
        ponder_weight: float = 0.01,
        final_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.steps = steps
        self.signal = signal
        self.halting = halting
        self.threshold = threshold
        self.ponder_weight = ponder_weight
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.gather_running = True

    @property
    def layer_gathers(self) -> bool:
        """Whether ACT can send only the running positions through the layer (:meth:`TransformerLayer.gathers`)."""
        return isinstance(self.layer, TransformerLayer) and self.layer.gathers()

    def _apply_running(
        self,
        state: Tensor,
        signalled: Tensor,
        running: Tensor,
        memory: Tensor | None,
        self_mask: AttentionMask | None,
        memory_mask: AttentionMask | None,
        cross_cache: KVCache | None,
    ) -> Tensor:
        """One step for the running positions only, gathered row by row (each row's running positions
        first, to the longest row's count; a shorter row's extra slots rewrite states unchanged)."""
        counts = running.sum(1)
        width = int(counts.max())
        index = torch.sort((~running).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # (B, Q)
        valid = (torch.arange(width, device=state.device) < counts.unsqueeze(1)).unsqueeze(-1)  # (B, Q, 1)
        out = self.layer.forward_at(
            signalled, index, memory, self_mask=self_mask, memory_mask=memory_mask, cross_cache=cross_cache
        )
        expanded = index.unsqueeze(-1).expand(-1, -1, state.size(-1))
        out = torch.where(valid, out, state.gather(1, expanded))
        return state.scatter(1, expanded, out)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        self_mask: AttentionMask | None = None,
        memory_mask: AttentionMask | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
        starts: Tensor | None = None,
    ) -> StackOutput:
        """``starts``: the model's random position starts for the batch, shared by its encoder and
        decoder (:func:`~.positional.draw_starts`); None: drawn here, in training."""
        # with a cache the positions continue from the tokens already decoded, never at random
        offset = self.signal.starts(x, 0, starts) if cache is None else cache.offset
        attentions: list[dict[str, Tensor]] = []
        routed: list[Routing] = []

        def apply(h: Tensor, step: int, signalled: bool = False) -> Tensor:
            """The layer on ``h`` at ``step``; ``signalled``: ``h`` has the step's signal already."""
            out, weights = self.layer(
                h if signalled else self.signal(h, step, offset),
                memory,
                self_mask=self_mask,
                memory_mask=memory_mask,
                cache=None if cache is None else cache.layer(step),
                need_weights=need_weights,
            )
            if need_weights:
                attentions.append(weights)
            routed.extend(routings(self.layer))
            return out

        padding = real_positions(x, self_mask)  # (B, T) bool, or None: no padding
        real = padding if padding is not None else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if self.halting is None:
            for step in range(self.steps):
                x = apply(x, step)
            ponder = real.to(x.dtype) * self.steps
            aux, extras = routing_outputs(routed)
            return StackOutput(
                apply_norm(self.final_norm, x, padding), attentions, aux, extras={"ponder_time": ponder, **extras}
            )

        running = real.clone()
        halted_sum = torch.zeros(real.shape, device=x.device)  # float32 book-keeping, whatever x's dtype
        remainder = torch.zeros_like(halted_sum)
        updates = torch.zeros_like(halted_sum)
        output = torch.zeros_like(x)
        state = x
        # An exported graph cannot branch on a tensor's values, nor can a meta tensor (shapes alone), nor a
        # compiled one without breaking: they run every step over every position, in the dense form.
        eager = (
            cache is None
            and not torch.compiler.is_exporting()
            and not torch.compiler.is_compiling()
            and x.device.type != "meta"
        )
        gather = eager and self.gather_running and not need_weights and self.layer_gathers
        cross_cache = KVCache() if gather and memory is not None else None  # the memory's keys, once
        for step in range(self.steps):
            # Every position has halted: stop early (with a cache later tokens need every step's keys). Where the
            # loop runs on, a halted position's weight is 0 and its state is copied, so the outputs are the same.
            if eager and not bool(running.any()):
                break
            signalled = self.signal(state, step, offset)
            p = torch.sigmoid(self.halting(signalled).float()).squeeze(-1)  # (B, T)
            last = step == self.steps - 1
            halts = running & ((halted_sum + p > self.threshold) | last)
            continues = running & ~halts
            remainder = torch.where(halts, 1.0 - halted_sum, remainder)
            weight = torch.where(continues, p, torch.where(halts, remainder, torch.zeros_like(p)))  # (B, T)
            halted_sum = halted_sum + p * continues
            updates = updates + running.float()
            # only the running positions go through the layer, when a row has halted ones to leave out
            if gather and int(running.sum(1).max()) < x.size(1):
                new_state = self._apply_running(state, signalled, running, memory, self_mask, memory_mask, cross_cache)
                routed.extend(routings(self.layer))
            else:
                new_state = apply(signalled, step, signalled=True)
            output = output + weight.unsqueeze(-1).to(new_state.dtype) * new_state
            state = torch.where(running.unsqueeze(-1), new_state, state)  # halted positions are copied
            running = continues
        ponder = (updates + remainder) * real  # rho = N + R (Graves 2016, eq. 11)
        moe_aux, extras = routing_outputs(routed)
        aux = self.ponder_weight * ponder.sum() / real.sum().clamp(min=1)
        aux = aux if moe_aux is None else aux + moe_aux
        return StackOutput(
            apply_norm(self.final_norm, output, padding),
            attentions,
            aux_loss=aux,
            extras={"ponder_time": ponder, **extras},
        )
