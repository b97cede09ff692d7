"""A description of what each query may attend to, turned into a dense mask only when needed.

Attention kernels receive an :class:`AttentionMask` rather than a dense matrix so that each can
pick its fastest computation: SDPA's ``is_causal`` flag, a FlexAttention block mask, a band of
keys, prefix sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InputTypeError


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
