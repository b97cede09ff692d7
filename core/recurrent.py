"""The recurrent stack: one shared layer applied step after step (Dehghani et al. 2018, the
Universal Transformer), with its step signal and optional adaptive computation time (Graves 2016)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn

from .attention import AttentionMask, MultiHeadAttention
from .cache import KVCache
from .embedding import add_positions, position_starts, sinusoid_table
from .layers import StackOutput, TransformerLayer, apply_norm, real_positions
from .moe import Routing, routing_outputs, routings

if TYPE_CHECKING:
    from .cache import DecoderCache


def gathers(layer: TransformerLayer) -> bool:
    """Whether :func:`forward_at` computes what ``layer.forward`` does at the positions it is
    given: the self-attention is a plain :class:`MultiHeadAttention` (no in-attention
    positions, no hook that changes keys, not self-only), and no norm or feed-forward mixes
    positions (``takes_padding``: batch norm, a mixture of experts)."""
    attn = layer.self_attn
    plain = (
        isinstance(attn, MultiHeadAttention)
        and attn.positional is None
        and not attn.self_only
        and type(attn).kernel_inputs is MultiHeadAttention.kernel_inputs
        and type(attn).forward is MultiHeadAttention.forward
    )
    mixing = [m for m in (*layer.norms, layer.ffn) if getattr(m, "takes_padding", False)]
    return plain and not mixing


def forward_at(
    layer: TransformerLayer,
    x: Tensor,
    index: Tensor,
    memory: Tensor | None = None,
    *,
    self_mask: AttentionMask | None = None,
    memory_mask: AttentionMask | None = None,
    cross_cache: KVCache | None = None,
) -> Tensor:
    """``layer``'s output ``(B, Q, D)`` at positions ``index`` ``(B, Q)`` of ``x`` ``(B, T, D)``
    only: those positions' queries attend to every key of ``x``, as in ``layer.forward``, and
    only they go through the feed-forward network (for a layer that :func:`gathers`). What lets
    adaptive computation time send only the running positions through the shared layer.

    ``cross_cache`` keeps the encoder memory's keys and values between calls on one memory.
    """
    keys = x
    x = x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.size(-1)))
    mask = self_mask or AttentionMask()
    explicit = None
    if mask.causal:  # a query sees the keys at or before its own position
        explicit = (index.unsqueeze(-1) >= torch.arange(keys.size(1), device=x.device)).unsqueeze(1)
    mask = AttentionMask(padding=mask.padding, explicit=explicit)
    context = layer.norms[0](keys) if layer.normed_inputs else keys

    def attend(h: Tensor) -> Tensor:
        return layer.self_attn(h, context, mask=mask)[0]

    x = layer.residual(x, 0, attend, None)
    if layer.cross_attn is not None:
        x = layer.residual(x, 1, lambda h: layer.cross_attn(h, memory, mask=memory_mask, cache=cross_cache)[0], None)
    return layer.residual(x, len(layer.norms) - 1, layer.ffn, None)


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
        so that a sequence keeps one start at every step (:func:`~.embedding.position_starts`);
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
        """Whether ACT can send only the running positions through the layer (:func:`gathers`)."""
        return isinstance(self.layer, TransformerLayer) and gathers(self.layer)

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
        out = forward_at(
            self.layer, signalled, index, memory, self_mask=self_mask, memory_mask=memory_mask, cross_cache=cross_cache
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
        decoder (:func:`~.embedding.draw_starts`); None: drawn here, in training."""
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


def recurrent_stack(
    layer: nn.Module,
    *,
    steps: int,
    d_model: int,
    signal: nn.Module | None = None,
    act: bool = True,
    threshold: float = 0.99,
    ponder_weight: float = 0.01,
    halting_bias: float = 1.0,
    final_norm: nn.Module | None = None,
) -> RecurrentStack:
    """``layer`` applied up to ``steps`` times (Dehghani et al. 2018), each step adding ``signal``
    (default: the sinusoid of the step index), with ACT halting when ``act`` (Graves 2016): a
    halting unit ``Linear(d_model, 1)`` whose bias starts at ``halting_bias``."""
    halting = None
    if act:
        halting = nn.Linear(d_model, 1)
        nn.init.constant_(halting.bias, halting_bias)
    return RecurrentStack(
        layer,
        steps,
        signal=signal if signal is not None else StepSignal(d_model, steps),
        halting=halting,
        threshold=threshold,
        ponder_weight=ponder_weight,
        final_norm=final_norm,
    )
