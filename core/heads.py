"""Task heads: what turns the final hidden states into logits, and the loss on them.

A head is called as ``head(hidden, mask)`` with ``hidden`` ``(B, T, D)`` and ``mask``
``(B, T)`` (True for real tokens, or None), and has ``loss(logits, targets)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def token_loss(logits: Tensor, targets: Tensor, ignore_index: int, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(..., V)`` over the targets that are not ``ignore_index``;
    0 (with a zero gradient) when every target is ignored, where a plain mean would be 0/0 (a
    masked-LM batch, or one process's slice of it, may hold no masked token). Targets may be of
    any integer dtype, as ids may.

    Half-precision logits (bf16 autocast) go through :func:`chunked_cross_entropy`, which never
    makes a float32 copy of them; inside a compiled graph the compiler fuses that cast itself.
    """
    targets = targets.flatten().long()
    logits = logits.flatten(0, -2)
    if logits.dtype in (torch.bfloat16, torch.float16) and not torch.compiler.is_compiling():
        total = chunked_cross_entropy(logits, targets, ignore_index, label_smoothing)
    else:
        total = F.cross_entropy(logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                reduction="sum")
    return total / (targets != ignore_index).sum().clamp(min=1)


CHUNK_ELEMENTS = 2**26
"""Logits one chunk of :func:`chunked_cross_entropy` turns into float32 at a time (256 MB)."""


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy, computed in float32 a chunk of rows at a time; the gradient is
    written in the logits' dtype, chunk by chunk. Saved for backward: the logits themselves and
    one float32 log-sum-exp per row."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int, smoothing: float) -> Tensor:
        rows, vocab = logits.shape
        step = max(1, CHUNK_ELEMENTS // vocab)
        real = targets != ignore_index
        picked = torch.where(real, targets, 0)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, step):
            chunk = logits[start : start + step].float()
            lse[start : start + step] = chunk.logsumexp(-1)
            nll = lse[start : start + step] - chunk.gather(1, picked[start : start + step, None]).squeeze(1)
            if smoothing:  # against the uniform distribution: lse - mean of the logits
                nll = (1 - smoothing) * nll + smoothing * (lse[start : start + step] - chunk.mean(-1))
            losses[start : start + step] = nll
        ctx.save_for_backward(logits, picked, real, lse)
        ctx.smoothing, ctx.step = smoothing, step
        return (losses * real).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, picked, real, lse = ctx.saved_tensors
        vocab = logits.size(1)
        out = torch.empty_like(logits)
        scale = grad * real  # (rows,): 0 for an ignored target
        for start in range(0, logits.size(0), ctx.step):
            end = start + ctx.step
            g = (logits[start:end].float() - lse[start:end, None]).exp_()  # softmax
            if ctx.smoothing:
                g.sub_(ctx.smoothing / vocab)
            g.scatter_add_(1, picked[start:end, None], g.new_full((g.size(0), 1), ctx.smoothing - 1.0))
            out[start:end] = g.mul_(scale[start:end, None])
        return out, None, None, None


def chunked_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tensor:
    """``F.cross_entropy(logits, targets, reduction="sum")`` for ``(N, V)`` logits of any float
    dtype, computed in float32 without a float32 copy of the logits or of their gradient.

    A bf16 training step's logits are the largest tensor it makes (``batch x length x
    vocabulary``); cross-entropy upcasts them whole, and its backward makes a float32 gradient
    of the same size before casting it back. Here each chunk of :data:`CHUNK_ELEMENTS` is cast,
    reduced and, in the backward, differentiated on its own.
    """
    return _ChunkedCrossEntropy.apply(logits, targets, ignore_index, label_smoothing)


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

    def __init__(self, d_model: int, num_classes: int, *, dropout: float = 0.0, ignore_index: int = -100) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, num_classes)
        self.ignore_index = ignore_index

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.proj(self.dropout(hidden))

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return token_loss(logits, targets, self.ignore_index)
