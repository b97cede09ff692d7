"""What every model of the image family reads and predicts (its own module, so that the GAN in
:mod:`.gan` builds on it without importing the package that registers it)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from transformer_zoo.core.options import MAX_IMAGE_SIDE, MAX_VOCAB, MAX_WIDTH, VariantConfig

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
