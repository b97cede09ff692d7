"""Positions that act inside attention, by the distance between query and key: rotary embeddings
(Su et al. 2021) and ALiBi's linear penalties (Press et al. 2022)."""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import AttentionPositional
from .embedding import grown_rows, position_ids


class RotaryPositional(AttentionPositional):
    """Rotary position embedding (Su et al. 2021): rotates query/key channel pairs by position.
    Like the sinusoids, it goes past ``max_len``: longer inputs compute more angles."""

    def __init__(self, d_head: int, max_len: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions need an even head width, got d_model / n_heads = {d_head}")
        self.max_len, self.d_head, self.base = max_len, d_head, base
        cos, sin = self._angles(max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _angles(self, length: int) -> tuple[Tensor, Tensor]:
        """The cosines and sines of every position's angles: ``(length, d_head / 2)`` each."""
        inv_freq = self.base ** (-torch.arange(0, self.d_head, 2, dtype=torch.float64) / self.d_head)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
        return angles.cos().float(), angles.sin().float()

    def cover(self, length: int) -> None:
        """Compute the angles of positions up to ``length`` now (see :meth:`SinusoidalPositional.cover`)."""
        if length > len(self.cos):
            self.cos, self.sin = (t.to(self.cos.device) for t in self._angles(grown_rows(len(self.cos), length)))

    def _rotate(self, x: Tensor, offset: int | Tensor) -> Tensor:
        if isinstance(offset, Tensor):  # a static cache's position on the device: looked up, not sliced
            positions = position_ids(offset, x.size(-2))
            cos, sin = self.cos.index_select(0, positions).to(x.dtype), self.sin.index_select(0, positions).to(x.dtype)
        else:
            self.cover(offset + x.size(-2))
            cos = self.cos[offset : offset + x.size(-2)].to(x.dtype)
            sin = self.sin[offset : offset + x.size(-2)].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)

    def rotate(self, q: Tensor, k: Tensor, q_offset: int | Tensor) -> tuple[Tensor, Tensor]:
        return self._rotate(q, q_offset), self._rotate(k, 0)


class ALiBiPositional(AttentionPositional):
    """Attention with linear biases (Press et al. 2022): ``-slope_h * distance`` on the scores."""

    def __init__(self, n_heads: int, *, symmetric: bool = True) -> None:
        super().__init__()
        self.symmetric = symmetric
        slopes = torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(self, q_len: int, k_len: int, device: torch.device, q_offset: Tensor | None = None) -> Tensor:
        start = k_len - q_len if q_offset is None else q_offset
        q_pos = position_ids(start, q_len, device)[:, None]
        distance = torch.arange(k_len, device=device)[None, :] - q_pos  # (Tq, Tk)
        distance = distance.abs() if self.symmetric else distance.clamp(max=0).neg()
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)
