"""Heads that classify: one label per sequence, or one per token. The language-model head, which
most models end with, is beside the model in :mod:`.model`."""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from .model import token_loss


class SequenceClassificationHead(nn.Module):
    """One label per sequence ``(B, C)``, from the first token or the mean over real tokens."""

    category: ClassVar[str] = "head"

    def __init__(self, d_model: int, num_classes: int, *, pooling: str = "cls", dropout: float = 0.0) -> None:
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, num_classes)

    def pool(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """``(B, T, D)`` to ``(B, D)``."""
        if self.pooling == "cls":
            return hidden[:, 0]
        if mask is None:
            return hidden.mean(dim=1)
        weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.proj(self.dropout(self.pool(hidden, mask)))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets.long())


class TokenClassificationHead(nn.Module):
    """One label per token ``(B, T, C)`` (tagging: named entities, parts of speech).

    Targets equal to ``ignore_index`` (padding, sub-word continuations) do not count in the loss.
    """

    category: ClassVar[str] = "head"

    def __init__(self, d_model: int, num_classes: int, *, dropout: float = 0.0, ignore_index: int = -100) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, num_classes)
        self.ignore_index = ignore_index

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.proj(self.dropout(hidden))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return token_loss(logits, targets, self.ignore_index)
