"""Self-attention on images: SAGAN's block on convolutional feature maps, patch embeddings and
2-D positions. (Local 2-D attention, a sparse pattern only the image family uses, is in
:mod:`transformer_zoo.plugins.image.kernels`.)

- :class:`SelfAttention2d`: Zhang et al. 2018, "Self-Attention Generative Adversarial
  Networks", section 3: ``o = gamma * v(softmax(f(x)^T g(x)) h(x)) + x`` over all ``H * W``
  positions, with ``gamma`` starting at 0 so the block starts as the identity.
- :class:`PatchEmbedding`: Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words": non-
  overlapping patches, each projected linearly to ``d_model``.
- :class:`Sinusoidal2d` and :class:`Learned2d`: a position for each grid cell, half of the
  channels for its row and half for its column.
- :class:`LearnedPositions`: ViT's own, one learned vector per token, the class token's included
  (the table ``transformers`` keeps as ``position_embeddings``).

Images are ``(B, C, H, W)``; a grid of tokens is the sequence ``(B, H * W, D)`` in reading order.
Each positional module reads the sequence the encoder reads: ``leading`` tokens before the grid
(a class token), then the grid.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import check_image


# ---- SAGAN ----------------------------------------------------------------------------------
class SelfAttention2d(nn.Module):
    """SAGAN's self-attention block, for any convolutional network.

    ``f`` (keys), ``g`` (queries) and ``h`` (values) are 1x1 convolutions to ``C / reduction``
    channels, ``v`` a 1x1 convolution back to ``C``; the scores ``f(x_i)^T g(x_j)`` are not
    scaled (as in the paper), and the softmax runs over all ``H * W`` positions.

    Args:
        channels: ``C`` of the feature maps.
        reduction: ``C / C-bar``, 8 in the paper; must divide ``channels``.

    The convolutions have biases, as in the authors' code (the paper writes ``W x``); the key's
    bias has no effect on the softmax. Returns ``(output, weights)`` like every attention here.
    """

    category: ClassVar[str] = "attention"

    def __init__(self, channels: int, reduction: int = 8) -> None:
        super().__init__()
        if reduction < 1 or channels % reduction:
            raise ValueError(
                f"reduction={reduction} must be a positive divisor of channels={channels} "
                f"(C-bar = C / reduction channels for queries, keys and values)"
            )
        inner = channels // reduction
        self.channels = channels
        self.key = nn.Conv2d(channels, inner, 1)  # f
        self.query = nn.Conv2d(channels, inner, 1)  # g
        self.value = nn.Conv2d(channels, inner, 1)  # h
        self.out = nn.Conv2d(inner, channels, 1)  # v
        self.gamma = nn.Parameter(torch.zeros(1))  # one element: a 0-d parameter cannot be sharded (FSDP)

    def forward(self, x: Tensor, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``x`` ``(B, C, H, W)`` to ``(B, C, H, W)``, and if asked the weights ``(B, H*W, H*W)``
        (row ``j``: how query position ``j`` spreads over the positions ``i``)."""
        check_image(x, self.channels)
        b, _, h, w = x.shape
        q, k, v = (conv(x).flatten(2).transpose(1, 2) for conv in (self.query, self.key, self.value))  # (B, HW, C')
        if need_weights:
            # unscaled scores can pass float16's range: softmax in float32
            weights = torch.softmax(q.float() @ k.float().transpose(1, 2), dim=-1).to(q.dtype)  # (B, HW, HW)
            attended = weights @ v
        else:
            weights = None
            attended = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], scale=1.0)[:, 0]
        out = self.out(attended.transpose(1, 2).reshape(b, -1, h, w))
        return x + self.gamma * out, weights


# ---- patches and 2-D positions --------------------------------------------------------------
class PatchEmbedding(nn.Module):
    """Non-overlapping ``patch x patch`` patches, each projected to ``d_model`` (ViT).

    ``(B, C, H, W)`` to ``(B, H/patch * W/patch, d_model)`` in reading order.
    """

    category: ClassVar[str] = "embedding"

    def __init__(self, image_size: tuple[int, int], channels: int, patch: int, d_model: int) -> None:
        super().__init__()
        if patch < 1 or image_size[0] % patch or image_size[1] % patch:
            raise ValueError(f"patch={patch} does not divide the image size {image_size}; use a divisor of both sides")
        self.image_size, self.channels, self.patch = tuple(image_size), channels, patch
        self.grid = (image_size[0] // patch, image_size[1] // patch)
        self.proj = nn.Conv2d(channels, d_model, kernel_size=patch, stride=patch)  # one linear map per patch

    def forward(self, image: Tensor) -> Tensor:
        check_image(image, self.channels, self.image_size, dtype=self.proj.weight.dtype)
        return self.proj(image).flatten(2).transpose(1, 2)  # (B, n_patches, D)


def sinusoid_2d(grid: tuple[int, int], d_model: int, base: float = 10000.0) -> Tensor:
    """``(H*W, d_model)``: the first half of the channels encodes the row, the second the column,
    each with the Transformer's sinusoids."""
    if d_model % 4:
        raise ValueError(f"2-D sinusoids need d_model divisible by 4 (sin and cos of rows and columns), got {d_model}")
    quarter = d_model // 4
    frequencies = base ** (-torch.arange(quarter, dtype=torch.float32) / quarter)

    def encode(positions: Tensor) -> Tensor:
        angles = positions[:, None].float() * frequencies[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (N, D/2)

    rows = torch.arange(grid[0]).repeat_interleave(grid[1])
    cols = torch.arange(grid[1]).repeat(grid[0])
    return torch.cat([encode(rows), encode(cols)], dim=-1)


def _check_grid_tokens(x: Tensor, grid: tuple[int, int], d_model: int, leading: int) -> None:
    tokens = leading + grid[0] * grid[1]
    if x.dim() != 3 or x.shape[1:] != (tokens, d_model):
        before = f"{leading} class token(s) and " if leading else ""
        raise ValueError(
            f"expected {before}a {grid[0]}x{grid[1]} grid of tokens, (batch, {tokens}, {d_model}); got {tuple(x.shape)}"
        )


def _add_to_grid(x: Tensor, table: Tensor, leading: int) -> Tensor:
    """``x + table`` on the grid's tokens; the ``leading`` tokens before it are left as they are."""
    return x + F.pad(table.to(x.dtype), (0, 0, leading, 0))  # (leading + H*W, D): zero rows first


class Sinusoidal2d(nn.Module):
    """Fixed 2-D sinusoids added to a grid of tokens ``(B, leading + H*W, D)``; the ``leading``
    tokens (a class token) get none."""

    category: ClassVar[str] = "positional"

    def __init__(self, grid: tuple[int, int], d_model: int, base: float = 10000.0, *, leading: int = 0) -> None:
        super().__init__()
        self.grid, self.d_model, self.leading = tuple(grid), d_model, leading
        self.register_buffer("table", sinusoid_2d(self.grid, d_model, base), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        _check_grid_tokens(x, self.grid, self.d_model, self.leading)
        return _add_to_grid(x, self.table, self.leading)


class Learned2d(nn.Module):
    """A learned embedding per row and per column, concatenated: ``H + W`` vectors, not ``H * W``,
    added to ``(B, leading + H*W, D)``; the ``leading`` tokens (a class token) get none."""

    category: ClassVar[str] = "positional"

    def __init__(self, grid: tuple[int, int], d_model: int, *, leading: int = 0) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"learned 2-D positions need an even d_model (half rows, half columns), got {d_model}")
        self.grid, self.d_model, self.leading = tuple(grid), d_model, leading
        self.rows = nn.Parameter(torch.randn(grid[0], d_model // 2) * 0.02)
        self.cols = nn.Parameter(torch.randn(grid[1], d_model // 2) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        _check_grid_tokens(x, self.grid, self.d_model, self.leading)
        height, width = self.grid
        table = torch.cat([self.rows[:, None].expand(height, width, -1), self.cols[None].expand(height, width, -1)], -1)
        return _add_to_grid(x, table.reshape(height * width, -1), self.leading)


class LearnedPositions(nn.Module):
    """One learned vector per token, the ``leading`` ones (a class token) included: a flat table
    ``(leading + H*W, D)`` added to ``(B, leading + H*W, D)`` (ViT as published, and the table
    ``transformers`` keeps as ``position_embeddings``, there ``(1, 1 + H*W, D)``)."""

    category: ClassVar[str] = "positional"

    def __init__(self, grid: tuple[int, int], d_model: int, *, leading: int = 0) -> None:
        super().__init__()
        self.grid, self.d_model, self.leading = tuple(grid), d_model, leading
        self.table = nn.Parameter(torch.randn(leading + grid[0] * grid[1], d_model) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        _check_grid_tokens(x, self.grid, self.d_model, self.leading)
        return x + self.table.to(x.dtype)
