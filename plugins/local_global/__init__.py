"""Local and global attention: long sequences at memory linear in their length.

Attention kinds any variant can use by config (``encoder: {attention: sliding-window}``):

- ``sliding-window``: each query sees the keys within ``window`` positions (Beltagy et al.
  2020, "Longformer"), or every ``dilation``-th key out to ``window * dilation``; causal in a
  decoder;
- ``block-local``: blocks of ``block`` positions attend within themselves; causal, to their
  own and the previous block (Liu et al. 2018, "Generating Wikipedia by Summarizing Long
  Sequences", local attention);
- ``local-global``: a sliding window plus global positions (the first token, every k-th) that
  see and are seen by every position (Longformer);
- ``memory-compressed``: keys and values shortened by a strided convolution (Liu et al. 2018);
- ``block-sparse``: blocks that see their neighbouring blocks, global blocks and random blocks
  (Zaheer et al. 2020, "Big Bird"); encoders only.

Presets: ``local-global-encoder-tiny`` and ``-base`` (encoder-only, Longformer-style) and
``transformer-dmca-tiny`` (decoder-only, local layers interleaved with memory-compressed ones:
Liu 2018's T-DMCA). The 1-D patterns, their chunked kernel and memory-compressed attention are in
:mod:`.kernels`; the kernel chooser they share with local 2-D attention is in
:mod:`transformer_zoo.core.local_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field
from torch import nn

from transformer_zoo.core.attention import AttentionMask, Kernel, math_kernel
from transformer_zoo.core.config import EncoderDecoderConfig
from transformer_zoo.core.local_attention import PatternKernel, SparseAttention
from transformer_zoo.core.options import AttentionOptions, HeadField, LayerSpec, PositionalField, StackField, Variant
from transformer_zoo.core.validation import MAX_LENGTH
from transformer_zoo.registry import hookimpl

from .kernels import MemoryCompressedAttention, Pattern


class _SparseOptions(AttentionOptions):
    """Options every sparse kind shares: a pattern, computed by the sparse kernel chooser."""

    full: ClassVar[bool] = False
    takes_bias: ClassVar[bool] = False
    takes_softcap: ClassVar[bool] = True  # computed densely, by the written-out formula
    self_only: ClassVar[bool] = True
    module: ClassVar[type[nn.Module]] = SparseAttention

    backend: Literal["auto", "chunked", "flex", "dense"] = Field(
        "auto", description="auto: dense up to 256 keys, then compiled FlexAttention on CUDA (no dropout), else chunked"
    )

    def pattern(self) -> Pattern:
        raise NotImplementedError

    def make_kernel(self) -> Kernel:
        return PatternKernel(self.pattern(), self.backend, softcap=self.softcap)


class SlidingWindowOptions(_SparseOptions):
    """Each query sees the keys within ``window`` positions of it (Longformer)."""

    kind: Literal["sliding-window"] = "sliding-window"
    window: int = Field(
        128, ge=1, le=MAX_LENGTH, description="keys seen on each side of a query (before it only, when causal)"
    )
    dilation: int = Field(
        1, ge=1, le=MAX_LENGTH, description="gap between the keys of the window (Longformer's dilation; 1: none)"
    )

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        if self.dilation == 1 and self.window >= max_len:
            raise ValueError(
                f"{self.kind} window={self.window} is not smaller than max_len={max_len}: that is full "
                "attention; use kind: sdpa, or a window below max_len"
            )
        if self.dilation >= max_len:
            raise ValueError(
                f"{self.kind} dilation={self.dilation} is not smaller than max_len={max_len}: each query "
                "would see only itself; use a dilation below max_len"
            )

    def pattern(self) -> Pattern:
        return Pattern(window=self.window, dilation=self.dilation)


class BlockLocalOptions(_SparseOptions):
    """Blocks of ``block`` positions attend within themselves; causal: own and previous block (Liu 2018)."""

    kind: Literal["block-local"] = "block-local"
    block: int = Field(128, ge=1, le=MAX_LENGTH, description="positions per block")

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        if self.block >= max_len:
            raise ValueError(
                f"block-local block={self.block} is not smaller than max_len={max_len}; choose a block below max_len"
            )

    def pattern(self) -> Pattern:
        return Pattern(block=self.block)


class LocalGlobalOptions(SlidingWindowOptions):
    """A sliding window plus global positions that see and are seen by all (Longformer)."""

    kind: Literal["local-global"] = "local-global"
    global_positions: list[int] = Field([0], description="global positions, such as [0] for a [CLS] token")
    global_every: int = Field(0, ge=0, le=MAX_LENGTH, description="also make every k-th position global (0: none)")

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        super().check(max_len=max_len, grid=grid)
        bad = [p for p in self.global_positions if not 0 <= p < max_len]
        if bad:
            raise ValueError(f"local-global global_positions {bad} are outside 0..{max_len - 1} (max_len={max_len})")
        if self.global_every >= max_len:
            raise ValueError(f"local-global global_every={self.global_every} is not below max_len={max_len}")

    def pattern(self) -> Pattern:
        return Pattern(
            window=self.window,
            dilation=self.dilation,
            global_positions=tuple(self.global_positions),
            global_every=self.global_every,
        )


class BlockSparseOptions(_SparseOptions):
    """BigBird: blocks see their neighbours, global blocks and random blocks; encoders only."""

    takes_causal: ClassVar[bool] = False  # its random and global blocks see the future
    kind: Literal["block-sparse"] = "block-sparse"
    block: int = Field(64, ge=1, le=MAX_LENGTH, description="positions per block")
    window_blocks: int = Field(1, ge=0, le=MAX_LENGTH, description="neighbouring blocks seen on each side")
    global_blocks: int = Field(1, ge=0, le=MAX_LENGTH, description="the first blocks, which see and are seen by all")
    random_blocks: int = Field(1, ge=0, le=MAX_LENGTH, description="random blocks each block also sees (fixed by seed)")
    seed: int = Field(0, description="seed of the random blocks")

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        blocks, needed = max_len // self.block, 2 * self.window_blocks + 1 + self.global_blocks + self.random_blocks
        if blocks < needed:
            raise ValueError(
                f"block-sparse block={self.block} divides max_len={max_len} into {blocks} blocks, but each block "
                f"sees {needed} (1 own + {2 * self.window_blocks} neighbours + {self.global_blocks} global + "
                f"{self.random_blocks} random); use a smaller block or fewer blocks seen"
            )

    def pattern(self) -> Pattern:
        return _EncoderPattern(
            block=self.block,
            window=self.window_blocks,
            global_positions=tuple(range(self.global_blocks * self.block)),
            random_blocks=self.random_blocks,
            seed=self.seed,
        )


@dataclass(frozen=True)
class _EncoderPattern(Pattern):
    """BigBird's pattern, which a decoder refuses: its random and global blocks see the future."""

    def for_call(self, mask: AttentionMask, q_len: int, k_len: int) -> Pattern:
        if mask.causal:
            raise ValueError(
                "block-sparse attention is for encoders (its random and global blocks see the future); "
                "use sliding-window, block-local or local-global in a decoder"
            )
        return super().for_call(mask, q_len, k_len)


class MemoryCompressedOptions(AttentionOptions):
    """Keys and values shortened by a strided convolution of kernel and stride ``compression`` (Liu 2018)."""

    full: ClassVar[bool] = False
    takes_bias: ClassVar[bool] = False
    self_only: ClassVar[bool] = True
    module: ClassVar[type[nn.Module]] = MemoryCompressedAttention
    takes_head_dim: ClassVar[bool] = False
    kind: Literal["memory-compressed"] = "memory-compressed"
    compression: int = Field(
        3, ge=2, le=MAX_LENGTH, description="kernel and stride of the convolution (3 in the paper)"
    )

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        if self.compression >= max_len:
            raise ValueError(f"memory-compressed compression={self.compression} is not below max_len={max_len}")

    def make_kernel(self) -> Kernel:
        return math_kernel  # gives a query that sees no summary yet (the first of a decoder) zeros

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(super().module_arguments(layer), compression=self.compression)


# ---- the family -----------------------------------------------------------------------------
class LocalGlobalConfig(EncoderDecoderConfig):
    """A Transformer whose self-attention is local, global or compressed; defaults are Longformer-style."""

    family: ClassVar[str] = "local-global"

    variant: str = Field("local-global-encoder-base", description="the registered variant this config started from")
    max_len: int = Field(4096, ge=1, le=MAX_LENGTH, description="longest sequence")
    positional: PositionalField = Field(
        "learned", validate_default=True, description="learned absolute positions, as Longformer"
    )
    scale_embeddings: bool = Field(False, description="not scaled")
    encoder: StackField | None = Field(
        {"layers": 12, "attention": {"kind": "local-global", "window": 256}},
        validate_default=True,
        description="the encoder stack, with local-global attention",
    )
    decoder: StackField | None = Field(None, description="no decoder: encoder-only")
    head: HeadField = Field(
        {"kind": "sequence-classification"}, validate_default=True, description="classification head"
    )


TINY = dict(vocab_size=1000, d_model=64, n_heads=4, d_ff=256, max_len=4096)
DMCA_LAYERS = [{"kind": "block-local", "block": 256}, {"kind": "memory-compressed", "compression": 3}]


@hookimpl
def tzoo_components():
    return [SlidingWindowOptions, BlockLocalOptions, LocalGlobalOptions, BlockSparseOptions, MemoryCompressedOptions]


@hookimpl
def tzoo_variants():
    return [
        Variant(
            name="local-global-encoder-base",
            config=LocalGlobalConfig,
            defaults=dict(d_model=768, n_heads=12, d_ff=3072, vocab_size=50265, dropout=0.1),
            description="Longformer-style encoder: 12 layers, d 768, window 256 each side, [CLS] global",
        ),
        Variant(
            name="local-global-encoder-tiny",
            config=LocalGlobalConfig,
            defaults={**TINY, "encoder": {"layers": 2, "attention": {"kind": "local-global", "window": 16}}},
            description="tiny Longformer-style encoder: 2 layers, d 64, window 16 each side, [CLS] global",
        ),
        Variant(
            name="transformer-dmca-tiny",
            config=LocalGlobalConfig,
            # the Transformer decoder's embeddings (tensor2tensor, which the paper used): N(0, 1/d) scaled by
            # sqrt(d), so the tied output layer starts with logits of unit scale
            defaults={
                **TINY,
                "encoder": None,
                "decoder": {"layers": 4, "attention": DMCA_LAYERS},
                "positional": "sinusoidal",
                "scale_embeddings": True,
                "head": {"kind": "lm"},
            },
            description="Liu 2018 T-DMCA, tiny: decoder-only, block-local layers interleaved with memory-compressed",
        ),
    ]
