"""A description of what each query may attend to, turned into a dense mask only when needed.

Attention implementations receive an :class:`AttentionMask` rather than a dense matrix so
that each can pick its fastest kernel: SDPA's ``is_causal`` flag, a block mask, a band.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AttentionMask:
    """What a query may attend to.

    Attributes:
        padding: ``(batch, key_len)`` bool, True for a real key, False for padding; or None.
        causal: whether a query may see only keys at its own position or earlier. Positions are
            aligned at the end: with ``q_len < key_len`` (a key/value cache), query ``i`` sits at
            key position ``key_len - q_len + i``.
    """

    padding: Tensor | None = None
    causal: bool = False

    def is_empty(self) -> bool:
        return self.padding is None and not self.causal

    def dense(self, q_len: int, k_len: int, device: torch.device | None = None) -> Tensor | None:
        """The explicit mask, broadcastable to ``(batch, heads, q_len, k_len)``; True = may attend."""
        mask = None
        if self.causal:
            q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
            mask = q_pos >= torch.arange(k_len, device=device)[None, :]  # (Tq, Tk)
        if self.padding is not None:
            pad = self.padding[:, None, None, :].to(device=device, dtype=torch.bool)  # (B, 1, 1, Tk)
            mask = pad if mask is None else pad & mask
        return mask


def as_padding_mask(mask: Tensor | None, ids: Tensor, name: str) -> Tensor | None:
    """Check a user-given ``(batch, seq)`` mask (1/True = real token) against its ids."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (batch, seq), got {type(mask).__name__}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but its token ids have shape "
            f"{tuple(ids.shape)}; expected the same (batch, seq) shape, 1 for real tokens and 0 for padding"
        )
    return mask.to(torch.bool)
