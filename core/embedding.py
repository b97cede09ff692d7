"""Token embeddings: lookup, scaling, additive positions and dropout, with input checks."""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor, nn

from .inputs import check_token_ids
from .positional import add_positions, position_starts


class Embeddings(nn.Module):
    """``dropout(positional(scale * E[ids]))``: ``(B, T)`` ids to ``(B, T, D)`` vectors.

    Args:
        token: the lookup table; share one instance between modules to tie weights.
        positional: an additive positional module taking ``(x, offset)``, or None.
        scale: the factor on the looked-up vectors (``sqrt(d_model)`` in Vaswani et al. 2017).
        dropout: dropout on the sum.
        random_offset: in training, each sequence's positions start at a random offset in
            ``[0, random_offset)`` past ``offset`` (:func:`~.positional.position_starts`); 0: off.
            ``positional`` must cover ``random_offset`` more positions than the longest input.
    """

    category: ClassVar[str] = "embedding"

    def __init__(
        self,
        token: nn.Embedding,
        *,
        positional: nn.Module | None = None,
        scale: float = 1.0,
        dropout: float = 0.0,
        random_offset: int = 0,
    ) -> None:
        super().__init__()
        self.token = token
        self.positional = positional
        self.scale = scale
        self.dropout = nn.Dropout(dropout)
        self.random_offset = random_offset

    @classmethod
    def scaled(cls, token: nn.Embedding, **kwargs) -> Embeddings:
        """Embeddings scaled by ``sqrt(d_model)``, as in the original Transformer."""
        return cls(token, scale=math.sqrt(token.embedding_dim), **kwargs)

    def forward(self, ids: Tensor, offset: int | Tensor = 0, starts: Tensor | None = None) -> Tensor:
        """``starts``: the model's random starts of this batch (:func:`~.positional.draw_starts`), shared
        with the other side of an encoder-decoder; None: this module draws its own in training."""
        check_token_ids(ids, self.token.num_embeddings)
        x = self.token(ids)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positional is not None:
            x = add_positions(self.positional, x, position_starts(x, offset, self.random_offset, self.training, starts))
        return self.dropout(x)
