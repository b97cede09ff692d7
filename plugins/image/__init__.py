"""Image self-attention: SAGAN's block in a convolutional classifier (Zhang et al. 2018), local
2-D attention over pixels (Parmar et al. 2018, "Image Transformer") and a patch encoder with full
attention (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", ViT).

The models read images ``(B, C, H, W)``, not token ids (``inputs = "image"`` on their configs),
so they train on tasks that have images (``digits``). The building blocks are in
:mod:`transformer_zoo.plugins.image.blocks`; local 2-D attention's pattern and kernel, used by this family
only, are beside this file in :mod:`.kernels`.

A Hugging Face ``transformers`` ViT folder (``ViTForImageClassification``) loads into the patch
encoder (:mod:`.hf`), and a patch encoder with ``positional: learned`` saves as one
(``save_pretrained(folder, format="hf")``), both through the name map in :mod:`.hf`.

Presets, sized for 8x8 digits: ``vit-tiny`` (2x2 patches, full attention), ``image-transformer-tiny``
(every pixel a token, ``local-2d`` attention) and ``sagan-classifier-tiny`` (two convolution
stages, each followed by a SAGAN block). The GAN, ``sagan-gan``, is in :mod:`.gan`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.config import build_stack
from transformer_zoo.core.heads import SequenceClassificationHead
from transformer_zoo.core.local_attention import PatternKernel, SparseAttention
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.options import AttentionOptions, FFNField, LayerFields, LayerSpec, StackField, Variant
from transformer_zoo.core.output import ModelOutput
from transformer_zoo.core.validation import MAX_IMAGE_SIDE, MAX_WIDTH, NormPlacement, Width
from transformer_zoo.registry import hookimpl

from .blocks import (
    Learned2d,
    LearnedPositions,
    PatchEmbedding,
    SelfAttention2d,
    Sinusoidal2d,
)
from .config import ImageConfig, Side, check_image
from .gan import SaganGanConfig
from .hf import VIT_IMPORTER
from .kernels import Local2dPattern

Pair = tuple[int, int]
Reach = Annotated[int, Field(ge=0, le=MAX_IMAGE_SIDE)]
"""Cells a block extends by on one side."""


# ---- local 2-D attention as an attention kind -----------------------------------------------
class Local2dAttention(SparseAttention):
    """Multi-head self-attention over a grid of tokens, each query block seeing its memory block:
    :class:`~transformer_zoo.core.local_attention.SparseAttention` given a
    :class:`~transformer_zoo.core.local_attention.PatternKernel` over a
    :class:`~transformer_zoo.plugins.image.kernels.Local2dPattern` (``auto``, ``dense``, ``flex`` or
    ``blocked``, :func:`~transformer_zoo.plugins.image.kernels.local_2d_attention`)."""


class Local2dOptions(AttentionOptions):
    """Image Transformer's local 2-D attention: query blocks attend to the memory block around them."""

    full: ClassVar[bool] = False
    takes_bias: ClassVar[bool] = False
    takes_causal: ClassVar[bool] = False  # an encoder's, over the whole grid: no causal form
    self_only: ClassVar[bool] = True
    needs_grid: ClassVar[bool] = True
    module: ClassVar[type[nn.Module]] = Local2dAttention
    takes_head_dim: ClassVar[bool] = False
    kind: Literal["local-2d"] = "local-2d"
    query_block: tuple[Side, Side] = Field((2, 2), description="rows and columns of a query block")
    memory: tuple[Reach, Reach] = Field(
        (1, 1), description="rows and columns the memory block extends its query block by, each side"
    )
    backend: Literal["auto", "blocked", "flex", "dense"] = Field(
        "auto",
        description="auto: dense up to 256 positions, then compiled FlexAttention on CUDA (no dropout), else blocked",
    )

    def check(self, *, max_len: int, grid: Pair | None = None) -> None:
        if grid is not None:
            self.pattern(grid)  # the query block must fit the grid

    def pattern(self, grid: Pair) -> Local2dPattern:
        """The pattern over a ``(rows, columns)`` grid of tokens; a ValueError if the query block
        does not fit it."""
        return Local2dPattern(grid=tuple(grid), query_block=tuple(self.query_block), memory=tuple(self.memory))

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        if layer.grid is None:
            raise ValueError(
                "local-2d attention needs the token grid (rows, columns): use it in an image model, which gives it"
            )
        return dict(kernel=PatternKernel(self.pattern(layer.grid), self.backend))


# ---- a patch (or pixel) encoder -------------------------------------------------------------
class ImageEncoder(ZooModel):
    """Patches to tokens, a class token before them (if any), positions, a Transformer encoder,
    and a classification head.

    ``positional`` reads the whole sequence, class token first: the 2-D kinds give the class
    token no position, :class:`~.blocks.LearnedPositions` (ViT's flat table) gives it one.
    """

    def __init__(
        self,
        *,
        patches: PatchEmbedding,
        positional: nn.Module,
        encoder: nn.Module,
        head: SequenceClassificationHead,
        cls_token: bool,
        dropout: float,
    ) -> None:
        super().__init__()
        self.patches, self.positional, self.encoder, self.head = patches, positional, encoder, head
        self.cls = nn.Parameter(torch.zeros(1, 1, patches.proj.out_channels)) if cls_token else None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        image: Tensor,
        *,
        need_weights: bool = False,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> ModelOutput:
        """``image`` ``(B, C, H, W)``, floats of the model's dtype, to class logits ``(B, num_classes)``
        (and ``out.loss``, given ``labels`` ``(B,)``; ``output_attentions`` is ``need_weights``).

        Pixel values are not checked (that would cost a device sync on every call): a NaN or
        infinite pixel propagates, so its image's logits are NaN, and a loss over them stops
        training. Anything but a non-empty float tensor of that shape and dtype is a ValueError.
        """
        need_weights = need_weights or bool(output_attentions)
        x = self.patches(image)  # (B, n_patches, D)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1)  # (B, 1 + n_patches, D)
        x = self.positional(x)
        out = self.encoder(self.dropout(x), self_mask=AttentionMask(), need_weights=need_weights)
        return self.labelled(ModelOutput.of(self.head(out.hidden), {"encoder": out}, need_weights=need_weights), labels)


class ImageEncoderConfig(ImageConfig, LayerFields):
    """A Transformer encoder over image patches (ViT), or over pixels with local 2-D attention."""

    variant: str = Field("vit-tiny", description="the registered variant this config started from")
    patch: int = Field(2, ge=1, le=MAX_IMAGE_SIDE, description="side of a square patch (1: every pixel is a token)")
    d_model: int = Field(64, ge=1, le=MAX_WIDTH, description="model width")
    n_heads: int = Field(4, ge=1, le=MAX_WIDTH, description="attention heads; must divide d_model")
    d_ff: int = Field(256, ge=1, le=MAX_WIDTH, description="inner width of the feed-forward network")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on residuals, embeddings and attention weights")
    positional: Literal["learned-2d", "sinusoidal-2d", "learned"] = Field(
        "learned-2d",
        description="learned-2d: a learned vector per row and per column, concatenated; sinusoidal-2d: fixed "
        "sinusoids of row and column (neither gives the class token a position); learned: one learned vector "
        "per token, the class token's included (ViT's own, and transformers')",
    )
    pooling: Literal["cls", "mean"] = Field(
        "cls", description="classify from a class token, or the mean of the patches"
    )
    norm_placement: NormPlacement = Field(
        "pre",
        description="norm before each sub-layer (pre: ViT), after the residual (post), before and after each "
        "sub-layer (sandwich) or on each sub-layer's output (output)",
    )
    ffn: FFNField = Field(
        {"kind": "mlp", "activation": "gelu"}, validate_default=True, description="feed-forward network"
    )
    encoder: StackField = Field({"layers": 4}, validate_default=True, description="the encoder stack")

    @property
    def grid(self) -> Pair:
        return self.image_size[0] // self.patch, self.image_size[1] // self.patch

    @model_validator(mode="after")
    def _check(self) -> ImageEncoderConfig:
        if self.image_size[0] % self.patch or self.image_size[1] % self.patch:
            raise ValueError(
                f"patch={self.patch} does not divide image_size={list(self.image_size)}; "
                "use a patch that divides both sides"
            )
        if self.positional == "sinusoidal-2d" and self.d_model % 4:
            raise ValueError(f"sinusoidal-2d positions need d_model divisible by 4, got {self.d_model}")
        if self.positional == "learned-2d" and self.d_model % 2:
            raise ValueError(f"learned-2d positions need an even d_model (half rows, half columns), got {self.d_model}")
        kinds = self.encoder.attention if isinstance(self.encoder.attention, list) else [self.encoder.attention]
        if self.pooling == "cls" and any(kind.needs_grid for kind in kinds):
            raise ValueError(
                "encoder.attention: local-2d attention runs over the patch grid, which a class token is not on; "
                "use pooling: mean"
            )
        tokens = self.grid[0] * self.grid[1] + (self.pooling == "cls")
        try:
            self.encoder.check(n_heads=self.n_heads, max_len=tokens, grid=self.grid, head_dim=self.head_dim)
        except ValueError as error:
            raise ValueError(f"encoder.{error}") from None
        return self

    def build(self) -> ImageEncoder:
        kind = {"learned-2d": Learned2d, "sinusoidal-2d": Sinusoidal2d, "learned": LearnedPositions}[self.positional]
        positional = kind(self.grid, self.d_model, leading=int(self.pooling == "cls"))
        patches = PatchEmbedding(self.image_size, self.channels, self.patch, self.d_model)
        encoder = build_stack(self.encoder, self.layer_spec(grid=self.grid))
        return ImageEncoder(
            patches=patches,
            positional=positional,
            encoder=encoder,
            head=SequenceClassificationHead(self.d_model, self.num_classes, pooling=self.pooling, dropout=self.dropout),
            cls_token=self.pooling == "cls",
            dropout=self.dropout,
        )


# ---- a convolutional classifier with SAGAN blocks -------------------------------------------
class SaganClassifier(ZooModel):
    """Convolution stages (3x3 conv, batch norm, ReLU; the later ones halve the size), a SAGAN
    block after the chosen stages, global average pooling and a linear classifier."""

    def __init__(
        self,
        *,
        channels: int,
        widths: list[int],
        attention_at: list[int],
        reduction: int,
        num_classes: int,
        image_size: Pair,
    ) -> None:
        super().__init__()
        self.channels, self.image_size = channels, tuple(image_size)
        stages, attention = [], {}
        for i, width in enumerate(widths):
            stages.append(
                nn.Sequential(
                    nn.Conv2d(widths[i - 1] if i else channels, width, 3, stride=1 if i == 0 else 2, padding=1),
                    nn.BatchNorm2d(width),
                    nn.ReLU(),
                )
            )
            if i in attention_at:
                attention[str(i)] = SelfAttention2d(width, reduction)
        self.stages = nn.ModuleList(stages)
        self.attention = nn.ModuleDict(attention)
        self.classifier = nn.Linear(widths[-1], num_classes)

    def forward(
        self,
        image: Tensor,
        *,
        need_weights: bool = False,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> ModelOutput:
        """``image`` ``(B, C, H, W)``, floats of the model's dtype, to class logits; with
        ``need_weights`` (or ``output_attentions``), each SAGAN block's weights ``(B, h*w, h*w)``
        over its feature map, by stage; with ``labels`` ``(B,)``, ``out.loss``.

        Pixel values are not checked (that would cost a device sync on every call): a NaN or
        infinite pixel propagates, so its image's logits are NaN (in training, batch norm spreads
        it to the whole batch), and a loss over them stops training.
        """
        check_image(image, self.channels, self.image_size, dtype=self.classifier.weight.dtype)
        need_weights = need_weights or bool(output_attentions)
        x, maps = image, {}
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if str(i) in self.attention:
                x, weights = self.attention[str(i)](x, need_weights=need_weights)
                if need_weights:
                    maps[f"stage{i}"] = weights
        pooled = x.mean(dim=(2, 3))  # (B, C)
        out = ModelOutput(
            logits=self.classifier(pooled),
            hidden=pooled[:, None],
            attentions={name: [{"self": w[:, None]}] for name, w in maps.items()},
        )
        return self.labelled(out, labels)

    def loss(self, output: ModelOutput, targets: Tensor) -> Tensor:
        return nn.functional.cross_entropy(output.logits, targets.long())


class SaganClassifierConfig(ImageConfig):
    """A small convolutional classifier with SAGAN self-attention blocks (Zhang et al. 2018)."""

    variant: str = Field("sagan-classifier-tiny", description="the registered variant this config started from")
    widths: list[Width] = Field([32, 64], min_length=1, description="channels of each convolution stage")
    attention_at: list[int] = Field([0, 1], description="stages followed by a SAGAN block (0 is the first)")
    reduction: int = Field(
        8, ge=1, le=MAX_WIDTH, description="query/key/value channels are width / reduction (8 in the paper)"
    )

    @model_validator(mode="after")
    def _check(self) -> SaganClassifierConfig:
        bad = [i for i in self.attention_at if not 0 <= i < len(self.widths)]
        if bad:
            raise ValueError(f"attention_at {bad} names no stage; stages are 0..{len(self.widths) - 1}")
        for i in self.attention_at:
            if self.widths[i] % self.reduction:
                raise ValueError(f"reduction={self.reduction} does not divide stage {i}'s width {self.widths[i]}")
        return self

    def build(self) -> SaganClassifier:
        return SaganClassifier(
            channels=self.channels,
            widths=self.widths,
            attention_at=self.attention_at,
            reduction=self.reduction,
            num_classes=self.num_classes,
            image_size=self.image_size,
        )


@hookimpl
def tzoo_components():
    return [Local2dOptions]


@hookimpl
def tzoo_variants():

    return [
        Variant(
            name="vit-tiny",
            config=ImageEncoderConfig,
            defaults={},
            description="ViT for 8x8 images: 2x2 patches, 4 pre-norm layers, d 64, class token, learned 2-D positions",
        ),
        Variant(
            name="image-transformer-tiny",
            config=ImageEncoderConfig,
            defaults={
                "patch": 1,
                "pooling": "mean",
                "positional": "sinusoidal-2d",
                "encoder": {"layers": 4, "attention": {"kind": "local-2d", "query_block": (2, 2), "memory": (2, 2)}},
            },
            description="Image Transformer encoder for 8x8 images: every pixel a token, local 2-D attention",
        ),
        Variant(
            name="sagan-classifier-tiny",
            config=SaganClassifierConfig,
            description="convolutional classifier for 8x8 images with a SAGAN block after each of 2 stages",
        ),
        Variant(
            name="sagan-gan",
            config=SaganGanConfig,
            description="class-conditional SAGAN for 8x8 images: spectral norm, hinge loss, attention in G and D",
        ),
    ]


@hookimpl
def tzoo_importers():
    return [VIT_IMPORTER]
