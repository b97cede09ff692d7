"""Building blocks of a layer: norms, feed-forward networks and the residual wrapper."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import Tensor, nn

from .attention import KVCache
from .masks import AttentionMask

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class TokenBatchNorm(nn.BatchNorm1d):
    """Batch normalisation over the feature axis of ``(B, T, D)`` tensors (Ioffe & Szegedy 2015).

    Statistics are over real positions only: padding neither enters the batch mean and
    variance nor the running statistics, so a batch's statistics jitter only as its real
    tokens do (the contrast with layer norm that the lectures draw, made measurable). Padded
    positions come out as zeros whenever batch statistics are used; with running statistics
    (eval) every position is normalised by them. The state dict is ``nn.BatchNorm1d``'s.
    """

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

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "silu", dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.dropout(self.activation(gate) * up))


def real_positions(x: Tensor, mask: AttentionMask | None) -> Tensor | None:
    """``(B, T)`` bool, True for the real tokens of ``x`` ``(B, T, D)``; None when ``mask`` has no
    padding. With a key/value cache the mask covers earlier keys too, and ``x`` holds the last."""
    if mask is None or mask.padding is None:
        return None
    return mask.padding[:, -x.size(1):].bool()


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
    ``norm(x + drop(f(x)))``, the paper's post-norm. An encoder layer has no cross-attention;
    a decoder layer of an encoder-decoder has one.

    Args:
        self_attn: attention over the layer's own input.
        ffn: the position-wise network.
        norms: one norm per sub-layer, in order (2 without cross-attention, 3 with); a norm
            declaring ``takes_padding`` is told which of ``x``'s positions are real (:func:`apply_norm`).
        cross_attn: attention to the encoder memory, or None.
        dropout: residual dropout.
        pre_norm: norm placement.
    """

    def __init__(
        self,
        self_attn: nn.Module,
        ffn: nn.Module,
        norms: list[nn.Module],
        *,
        cross_attn: nn.Module | None = None,
        dropout: float = 0.0,
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        expected = 2 if cross_attn is None else 3
        if len(norms) != expected:
            raise ValueError(f"a layer with {expected - 1} attention block(s) needs {expected} norms, got {len(norms)}")
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.norms = nn.ModuleList(norms)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def _residual(self, x: Tensor, norm: nn.Module, fn: Callable[[Tensor], Tensor], real: Tensor | None) -> Tensor:
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

        x = self._residual(x, self.norms[0], attend, real)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer attends to an encoder memory, but none was given")

            def cross(h: Tensor) -> Tensor:
                out, w = self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights)
                if w is not None:
                    weights["cross"] = w
                return out

            x = self._residual(x, self.norms[1], cross, real)
        x = self._residual(x, self.norms[-1], self.ffn, real)
        return x, weights
