"""Multi-head attention (Vaswani et al. 2017, section 3.2), its kernels and its mask description.

One module, :class:`MultiHeadAttention`, does what every attention kind shares: the query, key
and value projections, the key/value cache of incremental decoding, the in-attention positions
(rotary, ALiBi), dropout and the output projection. What the kinds differ in is a *kernel*: a
plain function, a callable object holding its settings, or an ``nn.Module`` holding learned
parameters (talking-heads attention's head mixing), which the module registers as its
``kernel`` submodule so that those parameters train, move, save and load with it::

    kernel(q, k, v, mask, bias, dropout_p, need_weights) -> (out, weights or None)

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V`` is :func:`attention_math`, written out;
:func:`sdpa_kernel` computes it with PyTorch's fused kernels, :func:`math_kernel` always with the
written-out formula. Every kernel divides the scores by ``sqrt(d_k)``; a module given another
``scale`` multiplies its queries by ``scale * sqrt(d_k)`` first, so any kernel computes
``softmax(scale * Q K^T) V`` (``scale=1.0``: the unscaled dot products that section 3.2.1 of
the paper argues against at large ``d_k``). Kernels receive an :class:`AttentionMask`, a
description (padding, causal, explicit) rather than a dense matrix, so that each can pick its
fastest computation; the key/value caches of decoding are in :mod:`.cache`.

Three options of the module reach every kind that computes through it: a sigmoid gate on the
heads' output (Qiu et al. 2025), attention sinks (a learned logit per head in every softmax,
gpt-oss's form of Xiao et al. 2024) and value residual learning (Zhou et al. 2024), whose
first layer hands its values to the later ones through :class:`FirstValues`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import InputTypeError


class Kernel(Protocol):
    """What an attention kind computes, once the queries, keys and values are made.

    Args:
        q: queries ``(B, H, Tq, Dh)``; k, v: keys and values ``(B, H, Tk, Dh)``. With a cache,
            ``Tq < Tk`` and the queries are the last ``Tq`` positions (end-aligned).
        mask: which keys each query may see (:class:`~transformer_zoo.core.attention.AttentionMask`):
            padding, causal, and an explicit mask some kinds set.
        bias: float, broadcastable to ``(B, H, Tq, Tk)``, added to the scores before the softmax
            (ALiBi); None without one. A kernel that never forms the scores raises a ValueError
            when given one (its options set ``takes_bias = False``, so validation refuses first).
        dropout_p: dropout on the attention weights (0 in eval mode); the caller has decided.
        need_weights: whether the caller wants the weights for a picture.

    Returns:
        The output ``(B, H, Tq, Dh)``, and the weights ``(B, H, Tq, Tk)`` (before dropout) when
        ``need_weights``; a kernel may return None otherwise. A query with no key to see gets a
        zero output and zero weights.

    A kernel that scores query head ``h`` against another key than head ``h`` has a method
    ``logit_pairs(q, k)`` returning the queries and keys ``(B, H, Tq, Dh)`` and ``(B, H, Tk, Dh)``
    it scores head by head (what the ``logits`` probe of ``transformer_zoo.comparing.probes``
    reads); without one, the pairs are ``(q, k)`` as received.
    """

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        bias: Tensor | None,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]: ...


class Cache(Protocol):
    """What attention reads and extends of a key/value cache (:class:`~.cache.KVCache` is one).

    Positions are counted in tokens seen, one count for the batch (a 0-d tensor under a static
    cache); a row with ``left_padding`` counts its own from its first real token, that many less.
    """

    key: Tensor | None
    value: Tensor | None
    state: dict[str, Tensor]  # what a kind keeps between decoding steps, batch first
    left_padding: Tensor | None  # (B,) padding tokens before each row's first real one, or None

    @property
    def start(self) -> int | Tensor: ...  # the position of the first new query

    @property
    def key_start(self) -> int | Tensor: ...  # the position of the first key append returned

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]: ...  # the keys the new queries see

    def visible(self, mask: AttentionMask, q_len: int) -> AttentionMask: ...  # the mask over those keys


def apply_weights(weights: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """``dropout(weights) @ v``: ``(B, H, Tq, Tk)`` weights on ``(B, H, Tk, Dh)`` values.

    The weights a kernel returns are the ones before dropout: dropout is a training device, not
    a change of what the model attends to.
    """
    return (F.dropout(weights, dropout_p) if dropout_p else weights) @ v


def attention_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The paper's formula, written out: returns ``(output, weights)``.

    Args:
        q: ``(B, H, Tq, Dh)``; k, v: ``(B, H, Tk, Dh)``.
        mask: bool, broadcastable to ``(B, H, Tq, Tk)``, True where a query may attend.
        bias: float, broadcastable to ``(B, H, Tq, Tk)``, added to the scores (ALiBi, relative).
        dropout_p: dropout on the weights before they weigh the values (the returned weights
            are before dropout).
        softcap: soft-capping of the scores, ``cap * tanh(scores / cap)`` before the bias and the
            mask (Gemma 2); None: off.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a query with no key to attend to (all padding) gets zeros, not NaN
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return apply_weights(weights, v, dropout_p), weights


def math_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, dropout_p: float, need_weights: bool
) -> tuple[Tensor, Tensor]:
    """Full attention by :func:`attention_math` only, never a fused kernel: the ``(B, H, Tq, Tk)``
    weights are always made (and returned), as in the paper."""
    return attention_math(q, k, v, mask.dense(q.size(-2), k.size(-2), q.device), bias, dropout_p)


@dataclass(frozen=True)
class SoftcapKernel:
    """Full attention with its scores soft-capped, ``cap * tanh(scores / cap)`` (Gemma 2): by
    :func:`attention_math`, since no fused kernel caps the scores."""

    cap: float

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        bias: Tensor | None,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor]:
        return attention_math(q, k, v, mask.dense(q.size(-2), k.size(-2), q.device), bias, dropout_p, self.cap)


def sdpa_kernel(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, dropout_p: float, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """Full attention on :func:`torch.nn.functional.scaled_dot_product_attention`.

    Without padding, bias or an explicit mask, a causal mask is SDPA's ``is_causal`` flag (when
    the queries are all the keys, or one new query), so PyTorch picks its fused kernels; other
    masks go in as a dense ``attn_mask``. With ``need_weights`` it is :func:`math_kernel`.
    """
    if need_weights:
        return math_kernel(q, k, v, mask, bias, dropout_p, need_weights)
    q_len, k_len = q.size(-2), k.size(-2)
    plain = mask.padding is None and mask.explicit is None and bias is None
    # In this order torch.export needs no guard on a dynamic length: without a cache, queries and keys
    # share one (symbolic) length, so ``q_len == 1`` is never asked; ``is_causal`` stays a Python bool.
    if plain and (not mask.causal or q_len == k_len):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=mask.causal), None
    if plain and q_len == 1:  # one new query of a cached decoding step sees every key so far
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
    dense = mask.dense(q_len, k_len, q.device)
    if bias is not None:
        dense = bias if dense is None else bias.masked_fill(~dense, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, dropout_p=dropout_p), None


class AttentionPositional(nn.Module):
    """Base of positional schemes that act inside attention (rotary, ALiBi, relative bias).

    The default does nothing; subclasses override any of the methods.
    """

    category: ClassVar[str] = "positional"

    def rotate(self, q: Tensor, k: Tensor, q_offset: int | Tensor, k_offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """Transform ``q`` ``(B, H, Tq, Dh)`` and ``k`` ``(B, H, Tk, Dh)``; ``q`` starts at position
        ``q_offset`` (a 0-d tensor under a static cache) and ``k`` at ``k_offset`` (past 0 when a
        sliding window's cache has dropped the keys before it). Either may be one start per
        sequence ``(B,)`` (left-padded rows)."""
        return q, k

    def bias(self, q_len: int, k_len: int, device: torch.device, q_offset: Tensor | None = None) -> Tensor | None:
        """A float bias broadcastable to ``(B, H, q_len, k_len)``, end-aligned like a cache; under a
        static cache, whose keys are a buffer longer than the keys written, the queries start at
        ``q_offset`` (a 0-d tensor) instead."""
        return None

    def query_bias(self, q: Tensor, k_len: int, q_offset: Tensor | None = None) -> Tensor | None:
        """A float bias ``(B, H, Tq, k_len)`` that depends on the queries ``q`` ``(B, H, Tq, Dh)``
        (relative keys, Shaw et al. 2018: ``q_i . a_ij / sqrt(Dh)``), added to :meth:`bias`;
        positions as for :meth:`bias`. Computed from the queries before the module's ``scale``,
        which multiplies it as it multiplies ``q . k``."""
        return None


def kv_heads_problem(n_heads: int, n_kv_heads: int) -> str:
    """The message for ``n_kv_heads`` that does not divide ``n_heads``, with the values that would."""
    divisors = [h for h in range(1, n_heads + 1) if n_heads % h == 0]
    return (
        f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}; choose n_kv_heads among {divisors} "
        f"(1: multi-query attention; {n_heads} or null: multi-head)"
    )


def _check_bias_shape(scheme: AttentionPositional, method: str, bias: Tensor, expected: tuple[int, ...]) -> None:
    """Raise a ValueError naming the scheme when the bias its ``method`` returned does not
    broadcast to ``expected``, ``(B, H, Tq, Tk)``; shapes only, so no device sync."""
    shape = tuple(bias.shape)
    if len(shape) <= 4 and all(size in (1, want) for size, want in zip(shape[::-1], expected[::-1])):
        return
    _, h, q_len, k_len = expected
    raise ValueError(
        f"positional scheme {type(scheme).__name__} ({type(scheme).__module__}): {method}() returned a bias of "
        f"shape {shape}; expected one that broadcasts to (batch, heads, q_len, k_len) = {expected}, such as "
        f"({h}, {q_len}, {k_len}) for a bias per head or ({q_len}, {k_len}) for one shared by the heads"
    )


def _kernel_name(kernel: Kernel) -> str:
    return getattr(kernel, "__name__", None) or repr(kernel)


class FirstValues:
    """The values of a stack's first self-attention, handed to its later layers (value residual
    learning, Zhou et al. 2024, "Value Residual Learning For Alleviating Attention Concentration
    In Transformers", arXiv 2410.17897).

    One per stack, shared by its layers' attention modules (:class:`MultiHeadAttention`'s
    ``first_values``): at every call the first layer's module puts the values ``V_1`` of its new
    tokens here, ``(B, n_kv_heads, T, Dh)`` before they enter its cache, and each later layer's
    reads them in the same forward pass. A plain object, not a module: it holds no parameters,
    so none is shared or counted twice, and it is not saved. The tensor stays here until the
    next call of the first layer. A copy (``copy.deepcopy`` of the model) or a pickle of the
    holder is an empty holder: the values belong to one forward pass and its autograd graph, and
    the copy's first layer makes its own at its next call.
    """

    def __init__(self) -> None:
        self.value: Tensor | None = None

    def __deepcopy__(self, memo: dict) -> FirstValues:
        # the deepcopy memo keeps one holder per stack in the copy, shared by its layers as here
        return FirstValues()

    def __getstate__(self) -> dict:
        return {"value": None}

    def __repr__(self) -> str:
        shape = None if self.value is None else tuple(self.value.shape)
        return f"FirstValues(value shape={shape})"


class MultiHeadAttention(nn.Module):
    """Multi-head attention over batch-first tensors, for self- or cross-attention, computed by a kernel.

    ``forward`` projects the queries, keys and values, reads and extends the cache, applies the
    in-attention positions (:meth:`project`), lets a kind adjust what the kernel receives
    (:meth:`kernel_inputs`), adds the sink (:meth:`with_sink`), calls the kernel, and gates and
    projects its output back to ``d_model`` (:meth:`output`).

    The projection layout, which a state dict and a checkpoint converter rely on: one fused
    ``in_proj`` (``nn.Linear(d_model, 3 * d_model)``) whose output rows are the queries, then the
    keys, then the values (``in_proj.weight[:d_model]`` is ``W_Q``, ``[d_model:2 * d_model]`` is
    ``W_K``, ``[2 * d_model:]`` is ``W_V``, and ``in_proj.bias`` alike); within each, head ``h``
    is rows ``h * d_head`` to ``(h + 1) * d_head``. ``out_proj`` (``nn.Linear(d_model, d_model)``)
    reads the heads' outputs concatenated in the same order. This is ``torch.nn.MultiheadAttention``'s
    ``in_proj_weight`` layout.

    Grouped-query attention (Ainslie et al. 2023; multi-query attention, Shazeer 2019, is
    ``n_kv_heads=1``): with ``n_kv_heads`` below ``n_heads``, the keys and values have
    ``n_kv_heads`` heads, each shared by ``n_heads // n_kv_heads`` consecutive query heads (query
    head ``h`` reads key head ``h // group``). ``in_proj`` is then
    ``nn.Linear(d_model, d_model + 2 * n_kv_heads * d_head)``, the queries' rows first, then the
    keys', then the values'. The cache holds the ``n_kv_heads`` heads only; :meth:`expand_kv`
    repeats them for :meth:`kernel_inputs` and the kernel, which always see ``n_heads`` heads.

    Three options change the equations, each where every kind shares it:

    - ``gate`` (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv 2505.06708:
      the gate after SDPA, ``Y' = Y * sigmoid(X W_theta)``, elementwise and head-specific;
      Qwen3-Next): the heads' concatenated output is multiplied by ``sigmoid(x W_gate + b_gate)``
      before the output projection, ``x`` being the queries' input (the decoder's, in
      cross-attention). ``gate_proj`` is ``nn.Linear(d_model, n_heads * d_head)``; head ``h``
      gates with its rows ``h * d_head`` to ``(h + 1) * d_head``.
    - ``sinks`` (Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks",
      arXiv 2309.17453, in the learned form of OpenAI's gpt-oss): each head ``h`` has a learned
      logit ``s_h`` (parameter ``sinks``, ``(n_heads,)``, starting at 0) that joins every query's
      softmax as one more key with no value, ``a_ij = exp(e_ij) / (exp(s_h) + sum_j' exp(e_ij'))``,
      so a query's weights over the real keys sum to less than 1. Computed by any kernel that takes
      a bias and an explicit mask (:meth:`with_sink`): a zero key and a zero value in front, seen by
      every query, its score ``q . 0 = 0`` plus ``s_h`` as a bias (not soft-capped: it is a logit,
      not a score); the weights returned leave it out.
    - value residual learning (Zhou et al. 2024, "Value Residual Learning For Alleviating Attention
      Concentration In Transformers", arXiv 2410.17897: ResFormer's ``U_n = A_n (lambda_1 V_1 +
      lambda_2 V_n)``): every layer after the first attends over the values
      ``lambda_1 V_1 + lambda_2 V_n``, ``V_1`` the first layer's values of the same tokens
      (:class:`FirstValues`). The lambdas are learned, one pair per layer (parameter
      ``value_lambdas``: ``[lambda_1, lambda_2]``), starting at 0.5 and 0.5, as modded-nanogpt
      learns them. The new tokens' values are mixed before they enter the cache (:meth:`project`),
      so the cache holds mixed values and decoding with it equals the forward.

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_model // n_heads``.
        n_heads: number of heads.
        kernel: what computes attention from ``(B, H, T, Dh)`` queries, keys and values (see
            :class:`Kernel`); :func:`sdpa_kernel` by default. A kernel with learned parameters
            is an ``nn.Module``: it becomes this module's ``kernel`` submodule, so its parameters
            are in ``parameters()`` and the state dict (``kernel.<name>``) and move with ``.to()``.
            Give each attention module its own kernel module unless sharing is meant.
        dropout: dropout on the attention weights, in training only.
        bias: whether the projections have a bias.
        positional: an in-attention positional scheme, or None.
        n_kv_heads: heads of the keys and values, a divisor of ``n_heads``; None: ``n_heads``
            (multi-head attention). 1 is multi-query attention.
        scale: the factor on the query-key dot products; None: ``1 / sqrt(d_head)``, the
            paper's. The queries are multiplied by ``scale * sqrt(d_head)`` before
            :meth:`kernel_inputs` (the kernels divide by ``sqrt(d_head)``); no parameter or
            buffer is added, so state dicts do not change.
        gate: gate the heads' output by ``sigmoid(gate_proj(x))`` (parameter ``gate_proj``, with a
            bias when ``bias``).
        sinks: a learned sink logit per head in every softmax (parameter ``sinks``); the kernel
            must take a bias and an explicit mask (:func:`sdpa_kernel`, :func:`math_kernel`,
            :class:`SoftcapKernel`).
        first_values: the stack's :class:`FirstValues` (value residual learning); None: off.
            Self-attention only.
        mix_values: with ``first_values``, this is a later layer: it mixes the first layer's
            values into its own (parameter ``value_lambdas``). False: this is the first layer,
            which puts its values in ``first_values``.
    """

    category: ClassVar[str] = "attention"

    self_only: ClassVar[bool] = False
    """Whether the module is for self-attention only: its rule is over the positions of one
    sequence (a sparse pattern, a convolution over positions), so attending to an encoder's
    memory raises a ValueError. The run-time guard; the kind's options declare ``self_only`` too,
    so that validation refuses such a ``cross_attention`` first."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kernel: Kernel = sdpa_kernel,
        dropout: float = 0.0,
        bias: bool = True,
        positional: AttentionPositional | None = None,
        scale: float | None = None,
        n_kv_heads: int | None = None,
        d_head: int | None = None,
        qk_norm: tuple[nn.Module, nn.Module] | None = None,
        qk_norm_over: str = "head",
        gate: bool = False,
        sinks: bool = False,
        first_values: FirstValues | None = None,
        mix_values: bool = False,
    ) -> None:
        super().__init__()
        if d_head is None and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(kv_heads_problem(n_heads, n_kv_heads))
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be positive (or None for 1/sqrt(d_head)), got {scale}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads if d_head is None else d_head
        self.d_inner = n_heads * self.d_head  # the queries' width (d_model unless d_head is given)
        self.n_kv_heads = n_kv_heads
        self.kernel = kernel  # an nn.Module kernel registers as a submodule here, with its parameters
        self.dropout = dropout
        # Query, key and value projections stacked in one matrix: self-attention runs one matmul.
        self.in_proj = nn.Linear(d_model, self.d_inner + 2 * n_kv_heads * self.d_head, bias=bias)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)
        self.positional = positional
        self.scale = scale
        if qk_norm_over not in ("head", "projection"):
            raise ValueError(f"qk_norm_over must be head or projection, got {qk_norm_over!r}")
        self.q_norm, self.k_norm = (None, None) if qk_norm is None else qk_norm
        self.qk_norm_over = qk_norm_over
        self.gate_proj = nn.Linear(d_model, self.d_inner, bias=bias) if gate else None
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None  # s_h, gpt-oss's name
        if mix_values and first_values is None:
            raise ValueError("mix_values mixes the first layer's values into this layer's: give first_values too")
        self.first_values = first_values
        # [lambda_1, lambda_2] of V_n <- lambda_1 V_1 + lambda_2 V_n
        self.value_lambdas = nn.Parameter(torch.tensor([0.5, 0.5])) if mix_values else None

    def extra_repr(self) -> str:
        scale = "" if self.scale is None else f", scale={self.scale:g}"
        # a kernel that is a module is shown as a child, below this line
        kernel = "" if isinstance(self.kernel, nn.Module) else f", kernel={_kernel_name(self.kernel)}"
        kv = "" if self.n_kv_heads == self.n_heads else f", n_kv_heads={self.n_kv_heads}"
        d_head = "" if self.d_inner == self.d_model else f", d_head={self.d_head}"
        qk = "" if self.q_norm is None else f", qk_norm over {self.qk_norm_over}"
        gate = "" if self.gate_proj is None else ", output gate"
        sinks = "" if self.sinks is None else ", sinks"
        values = ""
        if self.first_values is not None:
            values = ", value residual: " + ("mixes the first layer's values" if self.mix_values else "first layer")
        return f"d_model={self.d_model}, n_heads={self.n_heads}{kv}{d_head}{kernel}{scale}{qk}{gate}{sinks}{values}"

    @property
    def mix_values(self) -> bool:
        """Whether this module mixes the first layer's values into its own (value residual learning)."""
        return self.value_lambdas is not None

    def _heads(self, x: Tensor, parts: int, heads: int | None = None) -> tuple[Tensor, ...]:
        """``(B, T, parts * heads * Dh)`` to ``parts`` tensors of ``(B, heads, T, Dh)``; heads: ``n_heads``."""
        b, t, _ = x.shape
        return x.view(b, t, parts, heads or self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def _normed(self, norm: nn.Module | None, x: Tensor) -> Tensor:
        """Queries or keys ``(B, T, heads * Dh)`` through their QK-norm: over the whole
        projection, or over each head's ``Dh`` channels (one norm shared by the heads)."""
        if norm is None:
            return x
        if self.qk_norm_over == "projection":
            return norm(x)
        return norm(x.unflatten(-1, (-1, self.d_head))).flatten(-2)

    def self_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries ``(B, H, T, Dh)``, keys and values ``(B, n_kv_heads, T, Dh)`` of ``x``, by one
        matmul (the queries and keys through their QK-norm, if any)."""
        if self.n_kv_heads == self.n_heads and self.q_norm is None:
            return self._heads(self.in_proj(x), 3)
        kv_width = self.n_kv_heads * self.d_head
        q, k, v = self.in_proj(x).split([self.d_inner, kv_width, kv_width], dim=-1)
        q, k = self._normed(self.q_norm, q), self._normed(self.k_norm, k)
        return (*self._heads(q, 1), *self._heads(k, 1, self.n_kv_heads), *self._heads(v, 1, self.n_kv_heads))

    def expand_kv(self, x: Tensor) -> Tensor:
        """Keys or values of ``n_kv_heads`` heads repeated for the ``n_heads`` query heads: ``(B, H, T, Dh)``."""
        group = self.n_heads // self.n_kv_heads
        return x if group == 1 else x.repeat_interleave(group, dim=1)

    def _project(self, x: Tensor, rows: slice) -> Tensor:
        bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
        return F.linear(x, self.in_proj.weight[rows], bias)

    def project(
        self, x: Tensor, memory: Tensor | None = None, cache: Cache | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries ``(B, H, T, Dh)``, keys and values ``(B, n_kv_heads, T, Dh)`` of every key so far,
        and the positional bias.

        Reads and extends ``cache`` (the cache holds keys before rotation, of ``n_kv_heads`` heads,
        and values after :meth:`value_residual`), and applies the in-attention positional scheme:
        the queries from the cache's ``start``, the keys from its ``key_start``, each row shifted
        back by its ``left_padding``.
        """
        d = self.d_inner
        q_offset, k_offset, left_padding = 0, 0, None
        if memory is None:
            q, k, v = self.self_heads(x)
            v = self.value_residual(v)
            if cache is not None:
                q_offset = cache.start
                k, v = cache.append(k, v)
                k_offset, left_padding = cache.key_start, cache.left_padding
        else:
            (q,) = self._heads(self._normed(self.q_norm, self._project(x, slice(0, d))), 1)
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value  # the encoder memory does not change while decoding
            else:
                k, v = self._project(memory, slice(d, None)).chunk(2, dim=-1)
                k, v = (
                    self._heads(self._normed(self.k_norm, k), 1, self.n_kv_heads)[0],
                    self._heads(v, 1, self.n_kv_heads)[0],
                )
                if cache is not None:
                    cache.append(k, v)
        bias = None
        if self.positional is not None:
            if left_padding is None:
                q, k = self.positional.rotate(q, k, q_offset, k_offset)
            else:  # distances, and so any bias, are the same in every row
                q, k = self.positional.rotate(q, k, q_offset - left_padding, k_offset - left_padding)
            if isinstance(q_offset, Tensor):  # a static cache: the keys are its whole buffer
                bias = self.positional.bias(q.size(-2), k.size(-2), q.device, q_offset=q_offset)
                relation = self.positional.query_bias(q, k.size(-2), q_offset=q_offset)
            else:
                bias = self.positional.bias(q.size(-2), k.size(-2), q.device)
                relation = self.positional.query_bias(q, k.size(-2))
            expected = (x.size(0), self.n_heads, q.size(-2), k.size(-2))
            for method, value in (("bias", bias), ("query_bias", relation)):
                if value is not None:
                    _check_bias_shape(self.positional, method, value, expected)
            if relation is not None:
                if self.scale is not None:  # as forward multiplies q for the kernel's q . k
                    relation = relation * (self.scale * math.sqrt(self.d_head))
                bias = relation if bias is None else bias + relation
        return q, k, v, bias

    def value_residual(self, v: Tensor) -> Tensor:
        """The new tokens' self-attention values ``(B, n_kv_heads, T, Dh)`` after value residual
        learning (Zhou et al. 2024): the first layer's module keeps them in
        ``first_values``; a later layer's returns ``lambda_1 V_1 + lambda_2 v``; without
        ``first_values``, ``v`` unchanged."""
        if self.first_values is None:
            return v
        if self.value_lambdas is None:
            self.first_values.value = v
            return v
        first = self.first_values.value
        if first is None or first.shape != v.shape:
            found = "none" if first is None else f"values of shape {tuple(first.shape)}"
            raise ValueError(
                f"value residual: this layer mixes in the first layer's values of the same tokens, "
                f"{tuple(v.shape)}, but found {found}; call the whole stack, whose first layer makes them"
            )
        first_weight, own_weight = self.value_lambdas.to(v.dtype).unbind()
        return first_weight * first + own_weight * v

    def with_sink(
        self, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None
    ) -> tuple[Tensor, Tensor, AttentionMask, Tensor]:
        """Keys and values ``(B, H, Tk, Dh)`` with a sink in front, ``(B, H, 1 + Tk, Dh)``: a zero
        key and a zero value that every query sees, whose score ``q . 0 = 0`` plus its bias
        ``s_h`` is the head's sink logit. The mask gains that key (a causal mask is end-aligned, so
        it sees it as it is); the bias gains a column of ``s_h`` in front of the positional bias,
        or of zeros without one."""
        b, h, k_len, _ = k.shape
        k = torch.cat([k.new_zeros(b, h, 1, k.size(-1)), k], dim=-2)
        v = torch.cat([v.new_zeros(b, h, 1, v.size(-1)), v], dim=-2)
        sink = self.sinks.to(k.dtype).view(1, h, 1, 1)
        if bias is None:
            bias = torch.cat([sink, sink.new_zeros(1, h, 1, k_len)], dim=-1)  # (1, H, 1, 1 + Tk)
        else:
            shape = torch.broadcast_shapes(bias.shape, (1, h, 1, k_len))
            bias = torch.cat([sink.expand(*shape[:-1], 1), bias.to(k.dtype).expand(shape)], dim=-1)
        padding, explicit = mask.padding, mask.explicit
        if padding is not None:
            padding = torch.cat([torch.ones_like(padding[:, :1]), padding], dim=-1)
        if explicit is not None:
            explicit = explicit.expand(*explicit.shape[:-1], k_len)
            explicit = torch.cat([torch.ones_like(explicit[..., :1]), explicit], dim=-1)
        return k, v, AttentionMask(padding=padding, causal=mask.causal, explicit=explicit), bias

    def output(self, out: Tensor, x: Tensor) -> Tensor:
        """The heads' concatenated output ``(B, Tq, H * Dh)`` to ``(B, Tq, D)``: gated by
        ``sigmoid(gate_proj(x))`` (``x`` the queries' input), when the module has a gate, then
        the output projection."""
        if self.gate_proj is not None:
            out = out * torch.sigmoid(self.gate_proj(x))
        return self.out_proj(out)

    def kernel_inputs(
        self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, cache: Cache | None
    ) -> tuple[Tensor, Tensor, Tensor, AttentionMask, Tensor | None]:
        """What the kernel receives: the one place a kind changes queries, keys or values.

        Called with the queries ``(B, H, Tq, Dh)`` (already multiplied for a ``scale`` other than
        the paper's), the keys and values ``(B, H, Tk, Dh)`` of every key so far (cache read,
        positions applied), the call's mask and positional bias, and the cache (None without
        one). A kind that normalises the queries here (cosine attention) discards that factor,
        and its options refuse ``scale``. Returns them as the kernel should see them; the default
        changes nothing. A kind that changes the keys changes what ``mask`` and ``bias`` index
        too: it returns a mask over its new keys (``AttentionMask.explicit``) and refuses a bias
        it cannot carry over. State to keep between decoding steps goes in ``cache.state``.
        """
        return q, k, v, mask, bias

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: AttentionMask | None = None,
        cache: Cache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` ``(B, Tq, D)`` to itself, or to ``memory`` ``(B, Tk, D)``.

        Returns the output ``(B, Tq, D)`` and, if ``need_weights``, the weights ``(B, H, Tq, Tk)``.
        """
        if memory is not None and self.self_only:
            raise ValueError(f"{type(self).__name__} is for self-attention; keep cross_attention: sdpa")
        q, k, v, bias = self.project(x, memory, cache)
        k, v = self.expand_kv(k), self.expand_kv(v)
        mask = mask or AttentionMask()
        if cache is not None and memory is None:
            mask = cache.visible(mask, q.size(-2))
        if self.scale is not None:  # the kernels divide by sqrt(q's width); this leaves ``scale`` on q . k
            q = q * (self.scale * math.sqrt(q.size(-1)))
        q, k, v, mask, bias = self.kernel_inputs(q, k, v, mask, bias, cache)
        if self.sinks is not None:
            k, v, mask, bias = self.with_sink(k, v, mask, bias)
        dropout = self.dropout if self.training else 0.0
        out, weights = self.kernel(q, k, v, mask, bias, dropout, need_weights)
        if self.sinks is not None and weights is not None:
            weights = weights[..., 1:]  # the real keys' weights, which sum to less than 1
        out = out.transpose(1, 2).reshape(x.size(0), q.size(-2), -1)  # (B, Tq, H * Dh)
        return self.output(out, x), weights if need_weights else None


class MathAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` on :func:`math_kernel`: the ``(B, H, Tq, Tk)`` weights are made,
    as in the paper; the reference that fused and sparse kernels are measured against."""

    def __init__(self, d_model: int, n_heads: int, *, kernel: Kernel = math_kernel, **kwargs) -> None:
        super().__init__(d_model, n_heads, kernel=kernel, **kwargs)


@dataclass(frozen=True)
class AttentionMask:
    """What a query may attend to: the keys allowed by all of the parts that are set.

    Positions are aligned at the end. A call has ``q_len`` queries and ``k_len`` keys; with a
    key/value cache ``q_len < k_len`` (the keys of earlier calls come first), and query ``i``
    sits at key position ``k_len - q_len + i``. ``causal`` and every sparse pattern use these
    positions, so a decoding step sees exactly what it would see in the whole sequence.

    Attributes:
        padding: ``(batch, k_len)`` bool, True for a real key, False for padding; or None. A
            padded key is never attended to; a query whose keys are all padding gets zeros.
        causal: whether a query may see only keys at its own position or earlier.
        explicit: bool, broadcastable to ``(batch, heads, q_len, k_len)``, True where a query may
            attend; for rules neither of the above describes, such as memory-compressed
            attention's summaries (a kind's ``kernel_inputs`` hook sets it). None for most calls.
    """

    padding: Tensor | None = None
    causal: bool = False
    explicit: Tensor | None = None

    def dense(self, q_len: int, k_len: int, device: torch.device | None = None) -> Tensor | None:
        """The explicit mask, broadcastable to ``(batch, heads, q_len, k_len)``; True = may attend.
        None when nothing is masked."""
        mask = None
        if self.causal:
            q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
            mask = q_pos >= torch.arange(k_len, device=device)[None, :]  # (Tq, Tk)
        if self.padding is not None:
            pad = self.padding[:, None, None, :].to(device=device, dtype=torch.bool)  # (B, 1, 1, Tk)
            mask = pad if mask is None else pad & mask
        if self.explicit is not None:
            explicit = self.explicit.to(device=device, dtype=torch.bool)
            mask = explicit if mask is None else explicit & mask
        return mask


def as_padding_mask(mask: Tensor | None, ids: Tensor, name: str) -> Tensor | None:
    """Check a user-given ``(batch, seq)`` mask (1/True = real token) against its ids."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor of shape (batch, seq), got {type(mask).__name__}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but its token ids have shape "
            f"{tuple(ids.shape)}; expected the same (batch, seq) shape, 1 for real tokens and 0 for padding"
        )
    return mask.to(torch.bool)
