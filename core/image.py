"""Self-attention on images: SAGAN's block on convolutional feature maps, local 2-D attention,
patch embeddings and 2-D positions.

- :class:`SelfAttention2d`: Zhang et al. 2018, "Self-Attention Generative Adversarial
  Networks", section 3: ``o = gamma * v(softmax(f(x)^T g(x)) h(x)) + x`` over all ``H * W``
  positions, with ``gamma`` starting at 0 so the block starts as the identity.
- :class:`Local2dPattern` and :func:`local_2d_attention`: Parmar et al. 2018, "Image
  Transformer", section 3.3: the grid is cut into query blocks, and each block attends to a
  memory block around it. The paper generates pixels in order, so its memory extends the block
  up, left and right only; this is the non-causal form for encoders, extended on every side.
  The pattern is an :class:`~transformer_zoo.core.local_attention.AttentionPattern`, so the
  sparse kinds' kernel chooser computes it (dense, FlexAttention, or the blocked kernel).
- :class:`PatchEmbedding`: Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words": non-
  overlapping patches, each projected linearly to ``d_model``.
- :class:`Sinusoidal2d` and :class:`Learned2d`: a position for each grid cell, half of the
  channels for its row and half for its column.

Images are ``(B, C, H, W)``; a grid of tokens is the sequence ``(B, H * W, D)`` in reading order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .inputs import check_image
from .local_attention import AttentionPattern
from .masks import AttentionMask


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

    def __init__(self, channels: int, reduction: int = 8) -> None:
        super().__init__()
        if reduction < 1 or channels % reduction:
            raise ValueError(f"reduction={reduction} must be a positive divisor of channels={channels} "
                             f"(C-bar = C / reduction channels for queries, keys and values)")
        inner = channels // reduction
        self.channels = channels
        self.key = nn.Conv2d(channels, inner, 1)  # f
        self.query = nn.Conv2d(channels, inner, 1)  # g
        self.value = nn.Conv2d(channels, inner, 1)  # h
        self.out = nn.Conv2d(inner, channels, 1)  # v
        self.gamma = nn.Parameter(torch.zeros(1))  # one element: a 0-d parameter cannot be sharded (FSDP)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        gamma = state_dict.get(prefix + "gamma")
        if gamma is not None and gamma.dim() == 0:  # saved when gamma was 0-d
            state_dict[prefix + "gamma"] = gamma.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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


# ---- local 2-D attention --------------------------------------------------------------------
@dataclass(frozen=True)
class Local2dPattern(AttentionPattern):
    """Which grid cells a query may see: Image Transformer's local 2-D attention (non-causal).

    Positions are the cells in reading order (``row * width + column``); a query sees the cells
    of its query block's memory block.

    Attributes:
        grid: ``(height, width)`` of the token grid.
        query_block: ``(rows, columns)`` of a query block.
        memory: ``(rows, columns)`` the memory block extends its query block by on each side.
    """

    own_kernel: ClassVar[str] = "blocked"

    grid: tuple[int, int]
    query_block: tuple[int, int]
    memory: tuple[int, int]

    def __post_init__(self) -> None:
        for name in ("grid", "query_block", "memory"):
            value = getattr(self, name)
            pair = isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value)
            if not pair or min(value) < (0 if name == "memory" else 1):
                raise ValueError(f"{name} must be two {'non-negative' if name == 'memory' else 'positive'} "
                                 f"integers (rows, columns), got {value}")
        if any(b > g for b, g in zip(self.query_block, self.grid)):
            raise ValueError(f"query_block {self.query_block} is larger than the grid {self.grid}")

    def allowed(self, q_pos: Tensor, k_pos: Tensor, length: int) -> Tensor:
        width, (bh, bw), (mh, mw) = self.grid[1], self.query_block, self.memory
        top, left = q_pos // width // bh * bh, q_pos % width // bw * bw  # each query's block corner
        k_row, k_col = k_pos // width, k_pos % width
        see_rows = (k_row >= top - mh) & (k_row < top + bh + mh)
        return see_rows & (k_col >= left - mw) & (k_col < left + bw + mw)

    def dense(self, q_len: int | None = None, k_len: int | None = None, device: torch.device | None = None) -> Tensor:
        """The explicit ``(H*W, H*W)`` mask in reading order (by default): True where query ``i``
        sees key ``j``."""
        cells = self.grid[0] * self.grid[1]
        return super().dense(cells if q_len is None else q_len, cells if k_len is None else k_len, device)

    def for_call(self, mask: AttentionMask, q_len: int, k_len: int) -> Local2dPattern:
        """Local 2-D attention is an encoder's, over the whole grid: no causal mask, padding or cache."""
        cells = self.grid[0] * self.grid[1]
        if mask.causal or mask.padding is not None or q_len != cells or k_len != cells:
            raise ValueError(f"local-2d attention is encoder self-attention over a whole {self.grid[0]}x{self.grid[1]} "
                             f"grid ({cells} positions): no causal mask, padding or cache; got {q_len} queries and "
                             f"{k_len} keys")
        return self

    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, dropout_p: float) -> Tensor:
        return local_2d_attention(q, k, v, self, dropout_p)


def local_2d_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Local2dPattern, dropout: float = 0.0) -> Tensor:
    """Each query block against its own memory block only: ``(B, Hd, H*W, Dh)`` in and out.

    The grid is padded to whole query blocks and by the memory margin; padding keys are masked.
    Memory grows as O(n * m) for ``m`` cells per memory block, not O(n^2). Pass ``dropout=0``
    in eval mode.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must all be (batch, heads, positions, head_dim); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads, n, dim = q.shape
    (height, width), (bh, bw), (mh, mw) = pattern.grid, pattern.query_block, pattern.memory
    if n != height * width:
        raise ValueError(f"local-2d attention over a {height}x{width} grid needs {height * width} positions, got {n}")
    pad_h, pad_w = -height % bh, -width % bw
    nbh, nbw = (height + pad_h) // bh, (width + pad_w) // bw

    def grid(t: Tensor) -> Tensor:  # (B, Hd, n, Dh) -> (B * Hd, Dh, H, W)
        return t.transpose(2, 3).reshape(batch * heads, dim, height, width)

    def unfold(t: Tensor) -> Tensor:  # (N, C, H, W) -> (N, C * m, blocks): each block's memory cells
        t = F.pad(t, (mw, mw + pad_w, mh, mh + pad_h))
        return F.unfold(t, kernel_size=(bh + 2 * mh, bw + 2 * mw), stride=(bh, bw))

    def memory_blocks(t: Tensor) -> Tensor:  # (B, Hd, n, Dh) -> (B, Hd, blocks, m, Dh)
        return unfold(grid(t)).view(batch, heads, dim, -1, nbh * nbw).permute(0, 1, 4, 3, 2)

    queries = F.pad(grid(q), (0, pad_w, 0, pad_h)).view(batch, heads, dim, nbh, bh, nbw, bw)
    queries = queries.permute(0, 1, 3, 5, 4, 6, 2).reshape(batch, heads, nbh * nbw, bh * bw, dim)
    real = unfold(torch.ones(1, 1, height, width, device=q.device))[0].t() > 0  # (blocks, m): cells inside the image
    out = F.scaled_dot_product_attention(queries, memory_blocks(k), memory_blocks(v),
                                         attn_mask=real[:, None, :], dropout_p=dropout)  # (B, Hd, blocks, b, Dh)
    out = out.view(batch, heads, nbh, nbw, bh, bw, dim).permute(0, 1, 2, 4, 3, 5, 6)
    out = out.reshape(batch, heads, nbh * bh, nbw * bw, dim)[:, :, :height, :width]
    return out.reshape(batch, heads, n, dim)


# ---- patches and 2-D positions --------------------------------------------------------------
class PatchEmbedding(nn.Module):
    """Non-overlapping ``patch x patch`` patches, each projected to ``d_model`` (ViT).

    ``(B, C, H, W)`` to ``(B, H/patch * W/patch, d_model)`` in reading order.
    """

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


def _check_grid_tokens(x: Tensor, grid: tuple[int, int], d_model: int) -> None:
    if x.dim() != 3 or x.shape[1:] != (grid[0] * grid[1], d_model):
        raise ValueError(f"expected a {grid[0]}x{grid[1]} grid of tokens, (batch, {grid[0] * grid[1]}, {d_model}); "
                         f"got {tuple(x.shape)}")


class Sinusoidal2d(nn.Module):
    """Fixed 2-D sinusoids added to a grid of tokens ``(B, H*W, D)``."""

    def __init__(self, grid: tuple[int, int], d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.grid, self.d_model = tuple(grid), d_model
        self.register_buffer("table", sinusoid_2d(self.grid, d_model, base), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        _check_grid_tokens(x, self.grid, self.d_model)
        return x + self.table.to(x.dtype)


class Learned2d(nn.Module):
    """A learned embedding per row and per column, concatenated: ``H + W`` vectors, not ``H * W``."""

    def __init__(self, grid: tuple[int, int], d_model: int) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"learned 2-D positions need an even d_model (half rows, half columns), got {d_model}")
        self.grid, self.d_model = tuple(grid), d_model
        self.rows = nn.Parameter(torch.randn(grid[0], d_model // 2) * 0.02)
        self.cols = nn.Parameter(torch.randn(grid[1], d_model // 2) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        _check_grid_tokens(x, self.grid, self.d_model)
        height, width = self.grid
        table = torch.cat([self.rows[:, None].expand(height, width, -1), self.cols[None].expand(height, width, -1)], -1)
        return x + table.reshape(height * width, -1).to(x.dtype)

