"""Layers and the standard stack: norms, feed-forward networks, the layer that wraps attention and
feed-forward in residuals, and the stack of distinct layers (the recurrent stack is in
:mod:`.recurrent`, mixtures of experts in :mod:`.moe`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, ClassVar, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionMask
from .cache import KVCache
from .moe import routing_outputs, routings
from .validation import NormPlacement

if TYPE_CHECKING:
    from .cache import DecoderCache
    from .options import LayerSpec


class SquaredReLU(nn.Module):
    """``relu(x)^2``, the squared ReLU of Primer (So et al. 2021, "Primer: Searching for Efficient
    Transformers for Language Modeling", arXiv 2109.08668, section 3: ``y = max(x, 0)^2``);
    modded-nanogpt's and nanochat's MLP non-linearity; transformers' ``relu2``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "relu2": SquaredReLU,
    "gelu": nn.GELU,
    "gelu-tanh": partial(nn.GELU, approximate="tanh"),  # GPT-2's, Gemma's; transformers' gelu_pytorch_tanh
    "silu": nn.SiLU,
}


class UnitOffsetRMSNorm(nn.Module):
    """RMS normalisation scaled by ``1 + w``, ``w`` starting at 0 (Gemma's RMSNorm):
    ``x / sqrt(mean(x^2) + eps) * (1 + w)`` over the last axis.

    It computes in float32 and rounds to the input's dtype once, at the end, as ``nn.RMSNorm``
    does with its ``w``. The weight is named as ``nn.RMSNorm``'s: ``weight`` holds ``w``.
    """

    category: ClassVar[str] = "norm"

    def __init__(self, d_model: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``(..., d_model)``."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


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

    def __init__(
        self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class GatedFeedForward(nn.Module):
    """Gated feed-forward ``W2 (act(W x) * V x)`` (Shazeer 2020: GEGLU, SwiGLU)."""

    category: ClassVar[str] = "ffn"

    def __init__(
        self, d_model: int, d_ff: int, *, activation: str = "silu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.dropout(self.activation(gate) * up))


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

    ``placement`` (:data:`~.options.NormPlacement`) says where each sub-layer ``f``'s norms go,
    ``drop`` being the residual dropout:

    - ``pre``: ``x + drop(f(norm(x)))`` (Xiong et al. 2020; GPT-2, Llama);
    - ``post``: ``norm(x + drop(f(x)))``, the paper's;
    - ``sandwich``: ``x + drop(post_norm(f(norm(x))))``, two norms per sub-layer (Gemma 2);
    - ``output``: ``x + drop(norm(f(x)))``, the norm on the sub-layer's output only (OLMo 2).

    With ``rezero`` the residual is ``x + alpha_i * drop(f(norm(x)))`` whatever the placement,
    ``alpha`` a learned scalar per sub-layer starting at 0, so the layer starts as the identity
    (Bachlechner et al. 2020, who use no norm: pass ``nn.Identity()`` norms). An encoder layer
    has no cross-attention; a decoder layer of an encoder-decoder has one.

    Args:
        self_attn: attention over the layer's own input.
        ffn: the position-wise network; one declaring ``takes_padding`` (a mixture of experts) is
            called as ``ffn(x, real=real)``, ``real`` ``(B, T)`` True for real positions or None.
        norms: one norm per sub-layer, in order (2 without cross-attention, 3 with); a norm
            declaring ``takes_padding`` is told which of ``x``'s positions are real (:func:`apply_norm`).
        cross_attn: attention to the encoder memory, or None.
        post_norms: the second norm of each sub-layer, on its output, with ``sandwich`` placement
            only (as many as ``norms``); None otherwise.
        dropout: residual dropout.
        placement: where the norms go (without ``rezero``).
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
        post_norms: list[nn.Module] | None = None,
        dropout: float = 0.0,
        placement: NormPlacement = "post",
        rezero: bool = False,
        spec: LayerSpec | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        expected = 2 if cross_attn is None else 3
        if len(norms) != expected:
            raise ValueError(f"a layer with {expected - 1} attention block(s) needs {expected} norms, got {len(norms)}")
        if placement not in get_args(NormPlacement):
            raise ValueError(f"placement={placement!r}; expected one of {', '.join(get_args(NormPlacement))}")
        sandwich = placement == "sandwich" and not rezero
        if sandwich and (post_norms is None or len(post_norms) != expected):
            given = "none" if post_norms is None else len(post_norms)
            raise ValueError(f"a sandwich layer needs a second norm per sub-layer: {expected} post_norms, got {given}")
        if post_norms is not None and not sandwich:
            raise ValueError(
                "post_norms are for placement='sandwich' without rezero; this layer has "
                + ("rezero" if rezero else f"placement={placement!r}")
            )
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.norms = nn.ModuleList(norms)
        self.post_norms = None if post_norms is None else nn.ModuleList(post_norms)
        self.dropout = nn.Dropout(dropout)
        self.placement = placement
        self.alpha = nn.Parameter(torch.zeros(expected)) if rezero else None

    @property
    def normed_inputs(self) -> bool:
        """Whether each sub-layer reads its input through ``norms`` (``pre`` and ``sandwich``
        placements, and rezero, whose norms are the identity)."""
        return self.alpha is not None or self.placement in ("pre", "sandwich")

    def residual(self, x: Tensor, index: int, fn: Callable[[Tensor], Tensor], real: Tensor | None) -> Tensor:
        """Sub-layer ``index`` (``fn``) in its residual, with its norms where ``placement`` puts them."""
        norm = self.norms[index]
        if self.alpha is not None:
            return x + self.alpha[index].to(x.dtype) * self.dropout(fn(apply_norm(norm, x, real)))
        if self.placement == "post":
            return apply_norm(norm, x + self.dropout(fn(x)), real)
        if self.placement == "output":
            return x + self.dropout(apply_norm(norm, fn(x), real))
        out = fn(apply_norm(norm, x, real))
        if self.post_norms is not None:
            out = apply_norm(self.post_norms[index], out, real)
        return x + self.dropout(out)

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

        x = self.residual(x, 0, attend, real)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer attends to an encoder memory, but none was given")

            def cross(h: Tensor) -> Tensor:
                out, w = self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights)
                if w is not None:
                    weights["cross"] = w
                return out

            x = self.residual(x, 1, cross, real)
        ffn = partial(self.ffn, real=real) if getattr(self.ffn, "takes_padding", False) else self.ffn
        x = self.residual(x, len(self.norms) - 1, ffn, real)
        return x, weights


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


class StandardStack(nn.Module):
    """N distinct layers applied in turn, then an optional final norm (needed by every placement but post)."""

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
