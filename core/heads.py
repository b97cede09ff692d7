"""Task heads: what turns the final hidden states into logits, and the loss on them.

A head is called as ``head(hidden, mask)`` with ``hidden`` ``(B, T, D)`` and ``mask``
``(B, T)`` (True for real tokens, or None), and has ``loss(logits, targets)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn


def token_loss(logits: Tensor, targets: Tensor, ignore_index: int, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(..., V)`` over the targets that are not ``ignore_index``;
    0 (with a zero gradient) when every target is ignored, where a plain mean would be 0/0 (a
    masked-LM batch, or one process's slice of it, may hold no masked token). Targets may be of
    any integer dtype, as ids may."""
    targets = targets.flatten().long()
    total = F.cross_entropy(
        logits.flatten(0, -2), targets, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    return total / (targets != ignore_index).sum().clamp(min=1)


class LMHead(nn.Module):
    """Next-token logits ``(B, T, V)``: the seq2seq generator and the language-model head.

    Args:
        d_model: input width.
        vocab_size: output classes.
        tied_embedding: an embedding whose weight the projection shares (Press & Wolf 2017).
        bias: whether the projection has a bias.
        label_smoothing: epsilon of label-smoothed cross-entropy (Szegedy et al. 2016).
        ignore_index: target id that does not count in the loss (padding).
    """

    category: ClassVar[str] = "head"

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        *,
        tied_embedding: nn.Embedding | None = None,
        bias: bool = False,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
    ) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)
        if tied_embedding is not None:
            if tied_embedding.weight.shape != self.proj.weight.shape:
                raise ValueError(
                    f"cannot tie the output projection {tuple(self.proj.weight.shape)} to an embedding of "
                    f"shape {tuple(tied_embedding.weight.shape)}; vocabulary sizes and widths must match"
                )
            self.proj.weight = tied_embedding.weight
        self.label_smoothing = label_smoothing
        self.ignore_index = ignore_index

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.proj(hidden)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over the non-ignored targets ``(B, T)`` (see :func:`token_loss`)."""
        return token_loss(logits, targets, self.ignore_index, self.label_smoothing)


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
