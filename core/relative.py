"""Positions that act inside attention, by the distance between query and key: rotary embeddings
(Su et al. 2021), with the ways of stretching them past the length a model was trained on, and
ALiBi's linear penalties (Press et al. 2022).

The stretches (:class:`RotaryScaling`) are those of Hugging Face transformers' ``rope_type``:
position interpolation (``linear``, Chen et al. 2023), dynamic NTK-aware scaling (``dynamic``),
YaRN (``yarn``, Peng et al. 2023) and Llama 3.1's (``llama3``), each giving the same inverse
frequencies and attention factor as transformers' ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .attention import AttentionPositional
from .embedding import grown_rows, position_ids, positions_end

RotaryLayout = Literal["interleaved", "halves"]
"""Which of the ``r`` rotated channels of a head turn together, pair ``i`` at the inverse frequency
``base^(-2i/r)``: ``interleaved`` pairs neighbours ``(2i, 2i + 1)`` (Su et al. 2021; GPT-J, GLM);
``halves`` pairs channel ``i`` with channel ``i + r/2`` (transformers' ``rotate_half``: GPT-NeoX,
Llama, Qwen, Gemma, OLMo)."""


def rotary_frequencies(dim: int, base: float | Tensor) -> Tensor:
    """The inverse frequencies ``base^(-2i/dim)`` of ``dim`` rotated channels, in radians per
    position: ``(dim / 2,)``, float64. ``base`` may be a 0-d float64 tensor (dynamic NTK's grown
    base, on the device): the frequencies are then on its device."""
    device = base.device if isinstance(base, Tensor) else None
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)


class RotaryScaling:
    """How a rotary scheme stretches its frequencies to reach past the length it was trained on.

    This base stretches nothing. A kind overrides :meth:`inverse_frequencies`, and sets
    :attr:`attention_factor` and :attr:`dynamic_past` where they differ.
    """

    attention_factor: float = 1.0
    """A factor on the cosines and sines, so on every query-key score twice over (YaRN's)."""
    dynamic_past: int | None = None
    """Past a sequence of this many positions the frequencies depend on its length, given to
    :meth:`inverse_frequencies` (dynamic NTK's original length); None: they never do."""

    def inverse_frequencies(self, dim: int, base: float, length: int | Tensor | None = None) -> Tensor:
        """The inverse frequencies of ``dim`` rotated channels at wavelength base ``base``:
        ``(dim / 2,)``, float64, radians per position. ``length``: the positions of the sequence
        (a 0-d tensor on the device under a static cache); only a dynamic kind reads it."""
        return rotary_frequencies(dim, base)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"{type(self).__name__}({fields})"


class LinearScaling(RotaryScaling):
    """Position interpolation (Chen et al. 2023; transformers' ``linear``): every frequency divided
    by ``factor``, so ``factor`` times the trained length turns through the trained angles."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def inverse_frequencies(self, dim: int, base: float, length: int | Tensor | None = None) -> Tensor:
        return rotary_frequencies(dim, base) / self.factor


class DynamicNTKScaling(RotaryScaling):
    """Dynamic NTK-aware scaling (transformers' ``dynamic``): up to ``original_max_len`` positions the
    frequencies are unscaled; a sequence of ``s`` positions past it turns at the base
    ``base * (factor * s / original_max_len - (factor - 1)) ^ (dim / (dim - 2))``, recomputed as
    ``s`` grows. ``s`` is the last position of the call plus one (under a cache, the last query's),
    the largest in the batch, as transformers' ``dynamic_rope_update`` reads it."""

    def __init__(self, factor: float, original_max_len: int) -> None:
        self.factor, self.original_max_len = factor, original_max_len

    @property
    def dynamic_past(self) -> int:
        return self.original_max_len

    def inverse_frequencies(self, dim: int, base: float, length: int | Tensor | None = None) -> Tensor:
        if length is None or (not isinstance(length, Tensor) and length <= self.original_max_len):
            return rotary_frequencies(dim, base)
        if isinstance(length, Tensor):
            length = length.to(torch.float64).clamp(min=self.original_max_len)
        grown = (self.factor * length / self.original_max_len - (self.factor - 1)) ** (dim / (dim - 2))
        return rotary_frequencies(dim, base * grown)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor for a stretch ``factor`` (Peng et al. 2023, eq. 22): ``0.1 * mscale *
    ln(factor) + 1``; 1 for no stretch."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class YarnScaling(RotaryScaling):
    """YaRN (Peng et al. 2023; transformers' ``yarn``): the pairs that turn fewer than ``beta_slow``
    times over ``original_max_len`` positions are interpolated (divided by ``factor``), those that
    turn more than ``beta_fast`` times are kept, and a linear ramp blends the pairs between; the
    cosines and sines are multiplied by :attr:`attention_factor`.

    Args:
        factor: the stretch.
        original_max_len: the length the model was trained on.
        beta_fast, beta_slow: the turns bounding the ramp.
        attention_factor: the factor on cos and sin; None: ``yarn_mscale(factor, mscale) /
            yarn_mscale(factor, mscale_all_dim)`` where both are given (DeepSeek's), else
            ``yarn_mscale(factor)``.
        truncate: round the ramp's ends outwards to whole pairs.
    """

    def __init__(
        self,
        factor: float,
        original_max_len: int,
        *,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        attention_factor: float | None = None,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        truncate: bool = True,
    ) -> None:
        self.factor, self.original_max_len = factor, original_max_len
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = yarn_mscale(factor)
        self.attention_factor = attention_factor

    def _pair_turning(self, turns: float, dim: int, base: float) -> float:
        """The pair (a fractional index) that turns ``turns`` times over the original length."""
        return dim * math.log(self.original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    def inverse_frequencies(self, dim: int, base: float, length: int | Tensor | None = None) -> Tensor:
        kept = rotary_frequencies(dim, base)
        low, high = self._pair_turning(self.beta_fast, dim, base), self._pair_turning(self.beta_slow, dim, base)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: a ramp of one pair, not a division by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return kept / self.factor * ramp + kept * (1 - ramp)


class Llama3Scaling(RotaryScaling):
    """Llama 3.1's stretch (transformers' ``llama3``): the pairs whose wavelength exceeds
    ``original_max_len / low_freq_factor`` are divided by ``factor``, those shorter than
    ``original_max_len / high_freq_factor`` are kept, and those between blend the two smoothly."""

    def __init__(
        self, factor: float, original_max_len: int, *, low_freq_factor: float, high_freq_factor: float
    ) -> None:
        self.factor, self.original_max_len = factor, original_max_len
        self.low_freq_factor, self.high_freq_factor = low_freq_factor, high_freq_factor

    def inverse_frequencies(self, dim: int, base: float, length: int | Tensor | None = None) -> Tensor:
        kept = rotary_frequencies(dim, base)
        wavelength = 2 * math.pi / kept
        smooth = (self.original_max_len / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * kept / self.factor + smooth * kept
        long = wavelength > self.original_max_len / self.low_freq_factor
        short = wavelength < self.original_max_len / self.high_freq_factor
        return torch.where(long, kept / self.factor, torch.where(short, kept, blended))


def _fraction_turning(channels: int, d_head: int) -> float:
    """The shortest decimal ``fraction`` with ``int(d_head * fraction) == channels``."""
    for digits in range(1, 18):
        fraction = math.ceil(channels / d_head * 10**digits) / 10**digits
        if int(d_head * fraction) == channels:
            return min(fraction, 1.0)
    return channels / d_head


def _rotated_channels_problem(d_head: int, fraction: float) -> str | None:
    """The message for a ``fraction`` of ``d_head`` that does not turn whole pairs, naming the
    fractions that would; None if it does."""
    rotated = int(d_head * fraction)
    if rotated >= 2 and rotated % 2 == 0:
        return None
    near = [n for n in ((2,) if rotated < 2 else (rotated - 1, rotated + 1)) if 2 <= n <= d_head]
    instead = " or ".join(f"fraction={_fraction_turning(n, d_head)} ({n} channels)" for n in near)
    if fraction == 1.0:
        return f"rotary positions need an even head width, got d_model / n_heads = {d_head}" + (
            f"; or turn part of each head: {instead}" if instead else ""
        )
    what = "no channel pair" if rotated < 2 else "an odd number"
    return (
        f"rotary fraction={fraction} turns int({d_head} * {fraction}) = {rotated} channels of each head, {what}; "
        + (f"channels turn in pairs: choose {instead}" if instead else f"a head {d_head} wide has no pair to turn")
    )


class RotaryPositional(AttentionPositional):
    """Rotary position embedding (Su et al. 2021): turns each channel pair of the queries and keys
    by an angle proportional to the position, so that a query-key score depends on their distance
    only. Like the sinusoids, it goes past ``max_len``: longer inputs compute more angles.

    Args:
        d_head: the width of a head.
        max_len: the positions whose angles are computed at once (more are computed on demand).
        base: the wavelength base: pair ``i`` of the ``r`` turned channels turns ``base^(-2i/r)``
            radians per position.
        layout: which channels pair up (:data:`RotaryLayout`).
        fraction: the share of each head that turns, in (0, 1]: its first ``int(d_head *
            fraction)`` channels, an even number; the others pass unchanged (transformers'
            ``partial_rotary_factor``).
        scaling: how the frequencies stretch past the trained length (:class:`RotaryScaling`);
            None: they do not.
    """

    def __init__(
        self,
        d_head: int,
        max_len: int,
        *,
        base: float = 10000.0,
        layout: RotaryLayout = "interleaved",
        fraction: float = 1.0,
        scaling: RotaryScaling | None = None,
    ) -> None:
        super().__init__()
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"rotary layout must be 'interleaved' or 'halves', got {layout!r}")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"rotary fraction must be in (0, 1], got {fraction}")
        problem = _rotated_channels_problem(d_head, fraction)
        if problem:
            raise ValueError(problem)
        self.max_len, self.d_head, self.base = max_len, d_head, base
        self.layout, self.fraction, self.rotated = layout, fraction, int(d_head * fraction)
        self.scaling = RotaryScaling() if scaling is None else scaling
        if self.scaling.dynamic_past is not None and self.rotated <= 2:
            raise ValueError(
                f"dynamic rotary scaling grows the base by a power rotated / (rotated - 2) of the {self.rotated} "
                "turned channels: turn more than 2 (a larger fraction), or choose another scaling kind"
            )
        cos, sin = self._angles(max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def extra_repr(self) -> str:
        scaling = "" if type(self.scaling) is RotaryScaling else f", scaling={self.scaling!r}"
        return f"d_head={self.d_head}, rotated={self.rotated}, base={self.base}, layout={self.layout}{scaling}"

    def _cos_sin(self, angles: Tensor) -> tuple[Tensor, Tensor]:
        """The cosines and sines of float64 ``angles``, times the scaling's attention factor: float32."""
        cos, sin = angles.cos(), angles.sin()
        if self.scaling.attention_factor != 1.0:
            cos, sin = cos * self.scaling.attention_factor, sin * self.scaling.attention_factor
        return cos.float(), sin.float()

    def _angles(self, length: int) -> tuple[Tensor, Tensor]:
        """The cosines and sines of every position's angles: ``(length, rotated / 2)`` each."""
        inv_freq = self.scaling.inverse_frequencies(self.rotated, self.base)
        return self._cos_sin(torch.arange(length, dtype=torch.float64)[:, None] * inv_freq)

    def _grown(self, positions: Tensor, length: int | Tensor) -> tuple[Tensor, Tensor]:
        """The cosines and sines of ``positions`` at the frequencies of a sequence of ``length``
        positions (dynamic scaling past its original length), on their device."""
        inv_freq = self.scaling.inverse_frequencies(self.rotated, self.base, length).to(positions.device)
        return self._cos_sin(positions.to(torch.float64)[..., None] * inv_freq)

    def cover(self, length: int) -> None:
        """Compute the angles of positions up to ``length`` now (see :meth:`SinusoidalPositional.cover`)."""
        if length > len(self.cos):
            self.cos, self.sin = (t.to(self.cos.device) for t in self._angles(grown_rows(len(self.cos), length)))

    def _looked_up(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The table's cosines and sines of ``positions`` ``(T,)`` or ``(B, T)``: ``(..., T, rotated / 2)``."""
        flat = positions.flatten()
        return tuple(t.index_select(0, flat).unflatten(0, positions.shape) for t in (self.cos, self.sin))

    def _turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x`` ``(B, H, T, Dh)`` with its first ``rotated`` channels turned by the angles of
        ``cos`` and ``sin`` ``(T, rotated / 2)``, or ``(B, 1, T, rotated / 2)``."""
        cos, sin, r = cos.to(x.dtype), sin.to(x.dtype), self.rotated
        turning = x[..., :r]
        if self.layout == "interleaved":
            x1, x2 = turning[..., 0::2], turning[..., 1::2]
            turned = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        else:
            x1, x2 = turning[..., : r // 2], turning[..., r // 2 :]
            turned = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        return turned if r == x.size(-1) else torch.cat([turned, x[..., r:]], dim=-1)

    def rotate(self, q: Tensor, k: Tensor, q_offset: int | Tensor, k_offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """``q`` turned from position ``q_offset`` and ``k`` from ``k_offset`` (see
        :meth:`AttentionPositional.rotate`). Under dynamic scaling both turn at the frequencies of
        the last query position plus one, the largest in the batch for one start per sequence."""
        q_len, k_len = q.size(-2), k.size(-2)
        grows_past = self.scaling.dynamic_past
        if not isinstance(q_offset, Tensor) and not isinstance(k_offset, Tensor):  # slices of the table
            length, rows = q_offset + q_len, max(q_offset + q_len, k_offset + k_len)
            if grows_past is not None and length > grows_past:
                cos, sin = self._grown(torch.arange(rows, device=self.cos.device), length)
            else:
                self.cover(rows)
                cos, sin = self.cos, self.sin
            q_angles = (cos[q_offset:length], sin[q_offset:length])
            k_angles = (cos[k_offset : k_offset + k_len], sin[k_offset : k_offset + k_len])
            return self._turn(q, *q_angles), self._turn(k, *k_angles)
        # looked up: a static cache's position on the device (never read back), or one start per sequence
        for offset, count in ((q_offset, q_len), (k_offset, k_len)):
            end = positions_end(offset, count)
            if end is not None:
                self.cover(end)
        q_positions = position_ids(q_offset, q_len, self.cos.device)
        k_positions = position_ids(k_offset, k_len, self.cos.device)
        q_angles, k_angles = self._looked_up(q_positions), self._looked_up(k_positions)
        if grows_past is not None:  # both sets of angles made, and one chosen on the device
            length = q_positions.max() + 1
            past = length > grows_past

            def chosen(positions: Tensor, table: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
                grown = self._grown(positions, length)
                return torch.where(past, grown[0], table[0]), torch.where(past, grown[1], table[1])

            q_angles, k_angles = chosen(q_positions, q_angles), chosen(k_positions, k_angles)
        if q_positions.dim() == 2:  # one start per sequence: (B, T) positions, broadcast over the heads
            q_angles = tuple(t[:, None] for t in q_angles)
        if k_positions.dim() == 2:
            k_angles = tuple(t[:, None] for t in k_angles)
        return self._turn(q, *q_angles), self._turn(k, *k_angles)


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
