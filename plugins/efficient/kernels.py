"""The modules of the efficient attention kinds: feature maps, linear attention and its
recurrent decoding, and Linformer's projections along the sequence.

- :func:`linear_attention`: ``phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1)`` on features already
  made, non-causal or causal, from running sums of earlier keys when given them.
- :class:`EluFeatures` (Katharopoulos et al. 2020) and :class:`PositiveRandomFeatures` (FAVOR+,
  Choromanski et al. 2021): the feature maps ``phi``.
- :class:`FeatureKernel`: a kernel (see :class:`~transformer_zoo.core.attention.Kernel`) that
  applies a feature map, then linear attention.
- :class:`FeatureMapAttention`: multi-head attention on a :class:`FeatureKernel` whose decoding
  cache is two running sums, not the keys: O(1) memory and time per decoded token.
- :class:`LinformerAttention`: keys and values projected along the sequence to a fixed length
  (Wang et al. 2020).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, AttentionPositional, MultiHeadAttention, apply_weights
from transformer_zoo.core.cache import KVCache

CHUNK = 64
"""Queries per chunk of causal linear attention: within a chunk the ``CHUNK x CHUNK`` weights are
made, across chunks the running sums carry the earlier keys."""


def _no_bias(kind: str, bias: Tensor | None) -> None:
    if bias is not None:
        raise ValueError(
            f"{kind} attention does not form every query-key score, so it cannot add the positional "
            "scheme's bias to them; use sinusoidal or learned positions (a positional kind whose scheme "
            "returns a bias declares scores_bias = True, and validation then refuses it by name)"
        )


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, state: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Linear attention on features: each query's output is ``phi(q) S / phi(q) z`` with
    ``S = sum_j phi(k_j) v_j^T`` and ``z = sum_j phi(k_j)`` over the keys it sees.

    Args:
        q: query features ``(B, H, Tq, F)``; k: key features ``(B, H, Tk, F)``, non-negative, a
            zero row for a key no query may see (padding); v: values ``(B, H, Tk, Dh)``.
        causal: query ``i`` sees keys ``j <= i`` only (then ``Tq == Tk``), computed in chunks of
            :data:`CHUNK` queries: memory O(T * CHUNK), not O(T^2).
        state: ``(S, z)``, ``(B, H, F, Dh)`` and ``(B, H, F)``, the sums over keys before these
            (every query sees them); None: there are none.

    Returns:
        The output ``(B, H, Tq, Dh)`` (zeros for a query that sees no key), and ``(S, z)`` after
        all the keys.
    """
    b, h, _, f = k.shape
    kv, z = state if state is not None else (k.new_zeros(b, h, f, v.size(-1)), k.new_zeros(b, h, f))
    if not causal:
        kv, z = kv + k.transpose(-2, -1) @ v, z + k.sum(-2)  # (B, H, F, Dh), (B, H, F)
        return _ratio(q @ kv, q @ z.unsqueeze(-1)), (kv, z)
    if q.size(-2) != k.size(-2):
        raise ValueError(f"causal linear attention takes as many queries as keys, got {q.size(-2)} and {k.size(-2)}")
    outputs = []
    for start in range(0, q.size(-2), CHUNK):
        qc, kc, vc = (t[:, :, start : start + CHUNK] for t in (q, k, v))
        scores = (qc @ kc.transpose(-2, -1)).tril()  # (B, H, C, C): the keys of this chunk up to each query
        outputs.append(_ratio(qc @ kv + scores @ vc, qc @ z.unsqueeze(-1) + scores.sum(-1, keepdim=True)))
        kv, z = kv + kc.transpose(-2, -1) @ vc, z + kc.sum(-2)
    return torch.cat(outputs, dim=2), (kv, z)


def _ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator``, 0 where the denominator is 0 (a query that sees no key)."""
    return numerator / denominator.clamp_min(torch.finfo(denominator.dtype).tiny)


class EluFeatures(nn.Module):
    """``phi(x) = elu(x) + 1``, positive (Katharopoulos et al. 2020, section 3.2.1)."""

    category: ClassVar[str] = "features"

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1


def orthogonal_gaussian(rows: int, columns: int, generator: torch.Generator) -> Tensor:
    """``(rows, columns)`` random directions, orthogonal within each block of ``columns`` rows, each
    of the length of a Gaussian vector (Choromanski et al. 2021, section 4: orthogonal random
    features, ORF). Drawn on the CPU from ``generator``."""
    blocks = []
    for _ in range(math.ceil(rows / columns)):
        q, r = torch.linalg.qr(torch.randn(columns, columns, generator=generator, device="cpu"))
        blocks.append((q * r.diagonal().sign()).T)  # orthonormal rows; the signs make them uniform on the sphere
    lengths = torch.randn(rows, columns, generator=generator, device="cpu").norm(dim=1, keepdim=True)
    return torch.cat(blocks)[:rows] * lengths


class PositiveRandomFeatures(nn.Module):
    """FAVOR+'s positive random features (Choromanski et al. 2021, "Rethinking Attention with
    Performers", lemma 1): ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)`` with ``x' = x / d^(1/4)``,
    so that ``E[phi(q) . phi(k)] = exp(q . k / sqrt(d))``, the softmax kernel of scaled dot-product
    attention.

    ``W`` (``m x d``, :func:`orthogonal_gaussian`) is drawn once from ``seed`` and kept as the
    buffer ``projection`` (saved with the model); it is not redrawn during training. Every head
    shares it.

    Args:
        d_head: ``d``, the width of a query or key.
        features: ``m``, the number of random features.
        seed: the seed of ``W``.
    """

    category: ClassVar[str] = "features"

    def __init__(self, d_head: int, features: int, seed: int = 0) -> None:
        super().__init__()
        projection = orthogonal_gaussian(features, d_head, torch.Generator().manual_seed(seed))
        self.register_buffer("projection", projection)  # (m, d)

    def forward(self, x: Tensor) -> Tensor:
        x = x * x.size(-1) ** -0.25
        projected = x @ self.projection.to(x.dtype).T  # (..., m)
        return torch.exp(projected - x.pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(self.projection.size(0))


class FeatureKernel(nn.Module):
    """A kernel (``(q, k, v, mask, bias, dropout_p, need_weights) -> (out, weights)``): ``features``
    on the queries and keys, then :func:`linear_attention`; a padded key's features are zeroed.

    The ``(B, H, Tq, Tk)`` weights ``phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`` are made
    only when asked for, or for attention dropout, which drops weights (so with ``dropout > 0``
    training takes the quadratic path; set the model's dropout to 0 to train in linear memory).
    """

    category: ClassVar[str] = "kernel"

    def __init__(self, features: nn.Module, kind: str) -> None:
        super().__init__()
        self.features = features
        self.kind = kind

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"

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
        _no_bias(self.kind, bias)
        if mask.explicit is not None:
            raise ValueError(f"{self.kind} attention takes a padding or causal mask, not an explicit one")
        q, k = self.features(q), self.features(k)  # (B, H, T, F)
        if mask.padding is not None:
            k = k * mask.padding[:, None, :, None].to(k.dtype)  # a padded key drops out of every sum
        if need_weights or dropout_p:
            scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
            if mask.causal:
                scores = scores.tril(k.size(-2) - q.size(-2))
            weights = _ratio(scores, scores.sum(-1, keepdim=True))
            return apply_weights(weights, v, dropout_p), weights
        return linear_attention(q, k, v, causal=mask.causal)[0], None


class FeatureMapAttention(MultiHeadAttention):
    """Multi-head attention on a :class:`FeatureKernel`, decoding as a recurrent network
    (Katharopoulos et al. 2020, section 3.4: "Transformers are RNNs").

    Without a cache, or attending to an encoder's memory, it is :class:`MultiHeadAttention`. In a
    decoder's cached self-attention, each call adds its keys to two running sums kept in
    ``cache.state`` (``"kv"``: ``S``, ``(B, H, F, Dh)``; ``"z"``: ``z``, ``(B, H, F)``), and its
    queries read them: the cache holds no keys, so its size and a step's time do not grow with
    the tokens decoded. That path returns no weights, and applies no attention dropout.

    In-attention positions (rotary, ALiBi) are refused: the keys are summed as they come, so no
    later call could rotate them or bias their scores.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        features: nn.Module,
        kind: str,
        positional: AttentionPositional | None = None,
        **kwargs,
    ) -> None:
        if positional is not None:
            raise ValueError(
                f"{kind} attention keeps running sums over keys, not the keys, so it takes no "
                f"in-attention positions ({type(positional).__name__}); use sinusoidal or learned"
            )
        super().__init__(d_model, n_heads, kernel=FeatureKernel(features, kind), **kwargs)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is None or memory is not None:
            return super().forward(x, memory, mask=mask, cache=cache, need_weights=need_weights)
        q, k, v = self.self_heads(x)  # the new tokens only
        k, v = self.expand_kv(k), self.expand_kv(v)  # (B, H, Tq, Dh)
        if self.scale is not None:
            q = q * (self.scale * math.sqrt(self.d_head))
        q, k = self.kernel.features(q), self.kernel.features(k)
        padding = None if mask is None else mask.padding  # over every key so far; these are the last
        if padding is not None:
            k = k * padding[:, None, -k.size(-2) :, None].to(k.dtype)
        state = (cache.state["kv"], cache.state["z"]) if cache.state else None
        out, (cache.state["kv"], cache.state["z"]) = linear_attention(q, k, v, causal=True, state=state)
        out = out.transpose(1, 2).reshape(x.size(0), x.size(1), -1)  # (B, Tq, D)
        return self.output(out, x), None


class LinformerAttention(MultiHeadAttention):
    """Self-attention over keys and values projected along the sequence (Wang et al. 2020,
    "Linformer: Self-Attention with Linear Complexity", section 4).

    ``softmax(Q (E K)^T / sqrt(d)) (F V)``: the ``n`` keys and values of each head are mixed into
    ``k`` (``projected_length``) by learned ``E`` and ``F`` (``k x n``, shared by the heads), so
    each query attends to ``k`` rows whatever the length: time and memory O(n k). ``E`` and ``F``
    have ``seq_len`` columns; a shorter sequence uses its first ones (as zero padding would).
    Padded keys and values are zeroed before the projection. For encoders: a projected row mixes
    every position, future ones included, so a causal call raises a ValueError.
    """

    self_only = True

    def __init__(self, d_model: int, n_heads: int, *, projected_length: int, seq_len: int, **kwargs) -> None:
        super().__init__(d_model, n_heads, **kwargs)
        self.seq_len = seq_len
        # entries N(0, 1/k): the random projection of the paper's theorem 1, here learned from there
        self.project_k = nn.Parameter(torch.randn(projected_length, seq_len) / math.sqrt(projected_length))  # E
        self.project_v = nn.Parameter(torch.randn(projected_length, seq_len) / math.sqrt(projected_length))  # F

    def kernel_inputs(
        self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor, AttentionMask, Tensor | None]:
        """Keys and values ``(B, H, n, Dh)`` projected to ``(B, H, k, Dh)``; every query sees them all."""
        _no_bias("linformer", bias)
        if mask.causal or mask.explicit is not None:
            raise ValueError(
                "linformer attention is for encoders: each projected key mixes every position, later "
                "ones included, so it cannot be causal; use sdpa or linear attention in a decoder"
            )
        n = k.size(-2)
        if n > self.seq_len:
            raise ValueError(
                f"linformer attention got {n} keys, more than its seq_len={self.seq_len} "
                "(the columns of its projections); use shorter inputs or a larger seq_len"
            )
        if mask.padding is not None:
            real = mask.padding[:, None, :, None].to(k.dtype)  # (B, 1, n, 1)
            k, v = k * real, v * real
        k, v = self.project_k[:, :n] @ k, self.project_v[:, :n] @ v  # (B, H, k, Dh)
        return q, k, v, AttentionMask(), None
