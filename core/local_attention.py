"""Sparse attention shared by the sparse families: the pattern interface, and the one kernel that
chooses how to compute a pattern.

An :class:`AttentionPattern` is a rule ``allowed(q_pos, k_pos, length)`` over absolute
positions (queries end-aligned with the keys, as with a cache) and an efficient kernel of its
own (:meth:`AttentionPattern.attend`). :class:`PatternKernel` is the attention kernel of every
sparse kind: it holds a pattern and computes it, per call, by

- the explicit n x n mask (``dense``, :func:`attend_masked`), for short inputs, tests and pictures;
- :func:`flex_attention_kernel`: PyTorch's FlexAttention with a block mask built from the rule
  (compiled on GPU);
- the pattern's own kernel.

:class:`SparseAttention` is the module around it. What lives here is what both sparse families
use; a pattern and its own kernel live beside the one family that uses them: the 1-D patterns
(sliding window, dilated, blocks, global and random positions) and memory-compressed attention
in :mod:`transformer_zoo.plugins.local_global.kernels`, local 2-D attention over a grid in
:mod:`transformer_zoo.plugins.image.kernels`.
"""

from __future__ import annotations

import functools
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import AttentionMask, MultiHeadAttention, attention_math

NO_BIAS = (
    "the positional scheme adds a bias to every query-key score, which sparse and compressed attention "
    "do not compute; use sinusoidal, learned or rotary positions with them (a positional kind whose "
    "scheme returns a bias declares scores_bias = True, and validation then refuses it by name)"
)
"""The refusal of a positional bias by every kernel that does not form all the scores."""


class AttentionPattern(ABC):
    """Which keys each query may see: the interface every sparse pattern implements.

    Positions are absolute and end-aligned: with ``length`` keys and ``q_len`` queries, query
    ``i`` sits at position ``length - q_len + i`` (a cache holds the earlier keys).
    """

    own_kernel: ClassVar[str]
    """The name of the pattern's efficient kernel (:meth:`attend`), which a config may force."""

    @abstractmethod
    def allowed(self, q_pos: Tensor, k_pos: Tensor, length: int) -> Tensor:
        """Bool, the broadcast of ``q_pos`` and ``k_pos``: True where that query may see that key.

        Out-of-place tensor operations only: FlexAttention compiles the rule.
        """

    def lookback(self) -> int | None:
        """How many keys before a causal query it may see, where that is one number at every
        position (a band): all that a decoding cache of its layer must keep between steps. None
        (the default): a rule over absolute positions (blocks, global or random keys)."""
        return None

    def rule(self, length: int, device: torch.device | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """:meth:`allowed` for ``length`` keys, with what it needs computed once (FlexAttention's
        ``mask_mod`` calls it for every block)."""
        return lambda q_pos, k_pos: self.allowed(q_pos, k_pos, length)

    def dense(self, q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
        """The explicit ``(q_len, k_len)`` mask, queries end-aligned with keys."""
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        return self.rule(k_len, device)(q_pos, torch.arange(k_len, device=device)[None, :])

    def for_call(self, mask: AttentionMask, q_len: int, k_len: int) -> AttentionPattern:
        """The pattern one call uses: the mask's ``causal`` flag applies to it. Raises a
        ValueError for a call the pattern cannot take (a causal mask for an encoder-only one)."""
        return self

    @abstractmethod
    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, dropout_p: float) -> Tensor:
        """The pattern's own kernel: ``(B, H, Tq, Dh)`` without the ``Tq x Tk`` matrix.

        ``padding``: ``(B, Tk)`` bool, True for real keys; ``dropout_p``: on the weights.
        """


def attend_masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float = 0.0) -> Tensor:
    """SDPA under a bool ``mask`` (True: may attend), broadcastable to the scores; a query with no
    key to see gets zeros. The step every sparse kernel ends with, on its chunk or blocks."""
    # SDPA's fused kernels keep only the output and the softmax's log-sum-exp for backward, not a
    # chunk's weights. A query with no key to see (padding) is let see all, then zeroed: some
    # fused kernels give NaN for a row with no key.
    empty = ~mask.any(dim=-1, keepdim=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty, dropout_p=dropout).masked_fill(empty, 0.0)


def flex_attention_kernel(
    q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern, padding: Tensor | None = None, compiled: bool = True
) -> Tensor:
    """The pattern's attention through FlexAttention's block mask (``torch.nn.attention``).

    Compiled, FlexAttention skips the blocks the mask rules out; uncompiled (for tests) it
    computes the dense product. The block mask comes from :data:`BLOCK_MASKS`: built once per
    pattern, length and padding, and reused by every layer and step that asks again.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Compiled, the block mask is built block by block; eager, it evaluates all n x n pairs.
    make_mask, attend = _compiled_flex(q.device.type) if compiled else (create_block_mask, flex_attention)
    q_len, k_len = q.size(-2), k.size(-2)
    if torch.compiler.is_compiling():  # inside a compiled model the mask is part of its graph
        return attend(q, k, v, block_mask=_block_mask(make_mask, pattern, q_len, k_len, padding, q.device))
    key = (pattern, q_len, k_len, q.device, compiled)
    block_mask = BLOCK_MASKS.get(key, padding)
    if block_mask is None:
        block_mask = BLOCK_MASKS.put(key, padding, _block_mask(make_mask, pattern, q_len, k_len, padding, q.device))
    return attend(q, k, v, block_mask=block_mask)


def _block_mask(
    make_mask: Callable, pattern: AttentionPattern, q_len: int, k_len: int, padding: Tensor | None, device: torch.device
):
    offset = k_len - q_len
    allowed = pattern.rule(k_len, device)

    def mask_mod(b, h, q_idx, kv_idx):
        see = allowed(q_idx + offset, kv_idx)
        return see if padding is None else see & padding[b, kv_idx]

    batch = None if padding is None else padding.size(0)
    return make_mask(mask_mod, batch, None, q_len, k_len, device=device)


class BlockMaskCache:
    """FlexAttention block masks by pattern, lengths, device and padding, the least recently used
    dropped past ``size``.

    Without padding a mask is found by its key alone, so every layer and every step of one
    length shares it. With padding, the mask belongs to that padding tensor: it is found only
    when the same tensor, unchanged since (its version counter), is passed again, as the layers
    of one forward pass it. A new batch's padding, even one equal in value, builds a new mask
    (comparing the values would read them back from the device at every call); no other
    padding ever reuses it.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._masks: OrderedDict[tuple, tuple[Callable[[], Tensor | None] | None, int, object]] = OrderedDict()
        self.built = 0  # masks built, for tests and benchmarks

    @staticmethod
    def _full_key(key: tuple, padding: Tensor | None) -> tuple:
        return key if padding is None else (*key, id(padding))

    def get(self, key: tuple, padding: Tensor | None = None):
        """The mask stored for ``key`` and ``padding``, or None."""
        full = self._full_key(key, padding)
        entry = self._masks.get(full)
        if entry is None:
            return None
        ref, version, mask = entry
        if padding is not None and (ref() is not padding or version != padding._version):
            del self._masks[full]  # that padding tensor is gone (its id reused) or was changed in place
            return None
        self._masks.move_to_end(full)
        return mask

    def put(self, key: tuple, padding: Tensor | None, mask):
        """Store ``mask`` for ``key`` and ``padding``; returns it."""
        ref = None if padding is None else weakref.ref(padding)
        self._masks[self._full_key(key, padding)] = (ref, 0 if padding is None else padding._version, mask)
        self.built += 1
        while len(self._masks) > self.size:
            self._masks.popitem(last=False)
        return mask

    def clear(self) -> None:
        self._masks.clear()

    def __len__(self) -> int:
        return len(self._masks)


BLOCK_MASKS = BlockMaskCache()
"""The block masks of :func:`flex_attention_kernel`, shared by every sparse kind in this process."""


@functools.cache
def _compiled_flex(device_type: str):
    """``torch.compile``-d ``create_block_mask`` and ``flex_attention``, compiled once per process.

    On CUDA a second length makes the compiled attention dynamic in the length, so batches of
    many lengths (padded to each batch's longest) compile twice, not once per length until
    dynamo's recompile limit sends them to the unfused eager path. Inductor's CPU FlexAttention
    does not compile with dynamic lengths: there each length compiles once.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(create_block_mask), torch.compile(
        flex_attention, dynamic=False if device_type == "cpu" else None
    )


# ---- the kernel of every sparse kind ----------------------------------------------------------
DENSE_UP_TO = 256
"""Keys up to which ``auto`` computes a pattern densely (SDPA under the explicit mask).

One threshold for every pattern, counted in keys, so the choice is easy to predict. Measured on
a 2-core CPU, one training pass of the attention (batch 8, 4 heads of 16;
``python -m benchmarks.dense_threshold --device cpu``), dense against the pattern's own kernel:
at 64 keys dense is faster for every pattern (a 16-wide band 0.88x the time, BigBird blocks of
16 0.25x, local 2-D 0.13x); at 256 it is 1.3x slower for the band and still faster for blocks
(0.47x) and local 2-D (0.20x); at 1024 it is 4.0x slower for the band and 1.7x for blocks, and
local 2-D is the last to lose (0.71x at 1024). The n x n matrix also grows quadratically in
memory, which the own kernels avoid. On CUDA, past the threshold, ``auto`` takes compiled
FlexAttention instead (docs/benchmarks.md, "On a GPU").
"""


@dataclass(frozen=True)
class PatternKernel:
    """The attention kernel of the sparse kinds: attention restricted to ``pattern``.

    ``choice`` picks the computation: ``dense`` (SDPA under the explicit mask), ``flex``
    (compiled FlexAttention; GPU, or CPU inference), the pattern's own kernel
    (``pattern.own_kernel``: ``chunked`` for 1-D patterns, ``blocked`` for local 2-D; any
    device, training included) or ``auto``: dense up to ``dense_up_to`` keys (see
    :data:`DENSE_UP_TO`), then FlexAttention on CUDA without attention dropout, else the
    pattern's own kernel. Asking for the weights always uses the dense reference.

    Takes padding and causal masks (the pattern takes the causal flag of each call); refuses a
    positional bias on the scores (ALiBi, T5's), which no sparse computation forms.
    """

    pattern: AttentionPattern
    choice: str = "auto"
    dense_up_to: int = DENSE_UP_TO
    softcap: float | None = None  # soft-capped scores: computed densely, by attention_math

    def __post_init__(self) -> None:
        choices = ("auto", "dense", "flex", self.pattern.own_kernel)
        if self.choice not in choices:
            raise ValueError(f"kernel must be one of {', '.join(choices)}, got {self.choice!r}")

    def choose(self, k_len: int, device: torch.device, dropout_p: float = 0.0) -> str:
        """The computation for ``k_len`` keys on ``device``: ``dense``, ``flex`` or the pattern's own."""
        if self.choice != "auto":
            return self.choice
        if k_len <= self.dense_up_to:
            return "dense"
        return "flex" if device.type == "cuda" and not dropout_p else self.pattern.own_kernel

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttentionMask,
        bias: Tensor | None,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        if bias is not None:
            raise ValueError(NO_BIAS)
        if mask.explicit is not None:
            raise ValueError("a sparse pattern takes padding and causal masks, not an explicit one")
        q_len, k_len = q.size(-2), k.size(-2)
        pattern = self.pattern.for_call(mask, q_len, k_len)
        padding = None if mask.padding is None else mask.padding.to(device=q.device, dtype=torch.bool)
        choice = "dense" if need_weights or self.softcap is not None else self.choose(k_len, q.device, dropout_p)
        if choice == "dense":
            allowed = pattern.dense(q_len, k_len, q.device)  # (Tq, Tk)
            if padding is not None:
                allowed = allowed & padding[:, None, None, :]  # (B, 1, Tq, Tk)
            if need_weights or self.softcap is not None:
                out, weights = attention_math(q, k, v, allowed, None, dropout_p, self.softcap)
                return out, weights if need_weights else None
            return attend_masked(q, k, v, allowed, dropout_p), None
        if choice == "flex":
            if dropout_p:
                raise ValueError(
                    f"FlexAttention has no attention dropout; set backend: {pattern.own_kernel}, or dropout: 0"
                )
            return flex_attention_kernel(q, k, v, pattern, padding, compiled=True), None
        return pattern.attend(q, k, v, padding, dropout_p), None


class SparseAttention(MultiHeadAttention):
    """Multi-head self-attention restricted to a pattern: :class:`MultiHeadAttention` given a
    :class:`PatternKernel`, refusing to attend to an encoder's memory (its pattern is over the
    positions of one sequence)."""

    self_only = True
