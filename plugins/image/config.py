"""What every model of the image family reads and predicts (its own module, so that the GAN in
:mod:`.gan` builds on it without importing the package that registers it)."""

from __future__ import annotations

from typing import Annotated, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from transformer_zoo.core.embedding import check_not_empty, check_tensor
from transformer_zoo.core.options import VariantConfig
from transformer_zoo.core.validation import MAX_IMAGE_SIDE, MAX_VOCAB, MAX_WIDTH

Side = Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)]
"""Pixels (or patches, or cells) on one side of an image."""


class ImageConfig(VariantConfig):
    """What every model of the family reads and predicts; an image task sets these fields."""

    family: ClassVar[str] = "image-attention"
    inputs: ClassVar[str] = "image"
    objective: ClassVar[str] = "image-classification"  # what an image task must ask for to train it

    image_size: tuple[Side, Side] = Field((8, 8), description="image height and width, in pixels")
    channels: int = Field(1, ge=1, le=MAX_WIDTH, description="image channels")
    num_classes: int = Field(10, ge=2, le=MAX_VOCAB, description="classes of the head")


AUTOCAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what autocast casts


def check_float_dtype(value: Tensor, name: str, dtype: torch.dtype | None) -> None:
    """Raise a ValueError unless ``value`` has the model's floating ``dtype``; under autocast,
    which casts float32, float16 and bfloat16 inputs itself (never float64), any of those."""
    if dtype is None or value.dtype == dtype:
        return
    if value.dtype in AUTOCAST_DTYPES and torch.is_autocast_enabled(value.device.type):
        return
    raise ValueError(
        f"{name} must have the model's dtype {dtype}, got {value.dtype}; convert with .to({dtype})"
        + ("" if value.dtype == torch.float64 else ", or run under torch.autocast")
    )


def check_image(
    image: object,
    channels: int,
    size: tuple[int, int] | None = None,
    *,
    dtype: torch.dtype | None = None,
    name: str = "images",
) -> None:
    """Raise a ValueError naming what was expected unless ``image`` is a non-empty float tensor
    ``(B, channels, H, W)``, with ``(H, W) == size`` and the model's ``dtype`` when given.

    Pixel values are not read: a NaN pixel propagates to the outputs it reaches.
    """
    expected = f"(batch, {channels}, {size[0]}, {size[1]})" if size else f"(batch, {channels}, height, width)"
    check_tensor(image, name, f"of shape {expected}")
    if image.dim() != 4 or image.size(1) != channels or (size is not None and tuple(image.shape[-2:]) != tuple(size)):
        raise ValueError(f"expected {name} of shape {expected}, got {tuple(image.shape)}")
    check_not_empty(image, name, "image")
    if not image.is_floating_point():
        raise ValueError(f"expected float {name} (pixel values, for example in [0, 1]), got {image.dtype}")
    check_float_dtype(image, name, dtype)
