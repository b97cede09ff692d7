"""Local 2-D attention (Parmar et al. 2018, "Image Transformer", section 3.3): its pattern and its
own kernel. Only the image family uses them, so they live beside its plugin; the pattern
interface and the kernel chooser that computes it (dense, FlexAttention, or the blocked kernel
below), shared with the local and global kinds, are in :mod:`transformer_zoo.core.local_attention`.

The grid is cut into query blocks, and each block attends to a memory block around it. The
paper generates pixels in order, so its memory extends the block up, left and right only; this
is the non-causal form for encoders, extended on every side. A grid of tokens is the sequence
``(B, H * W, D)`` in reading order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.local_attention import AttentionPattern


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
                raise ValueError(
                    f"{name} must be two {'non-negative' if name == 'memory' else 'positive'} "
                    f"integers (rows, columns), got {value}"
                )
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
            raise ValueError(
                f"local-2d attention is encoder self-attention over a whole {self.grid[0]}x{self.grid[1]} "
                f"grid ({cells} positions): no causal mask, padding or cache; got {q_len} queries and "
                f"{k_len} keys"
            )
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
        raise ValueError(
            f"q, k and v must all be (batch, heads, positions, head_dim); got {tuple(q.shape)}, "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
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
    out = F.scaled_dot_product_attention(
        queries, memory_blocks(k), memory_blocks(v), attn_mask=real[:, None, :], dropout_p=dropout
    )  # (B, Hd, blocks, b, Dh)
    out = out.view(batch, heads, nbh, nbw, bh, bw, dim).permute(0, 1, 2, 4, 3, 5, 6)
    out = out.reshape(batch, heads, nbh * bh, nbw * bw, dim)[:, :, :height, :width]
    return out.reshape(batch, heads, n, dim)
