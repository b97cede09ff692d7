"""Digits: 8x8 images of handwritten digits (Alpaydin & Kaynak 1998), shipped with the package.

Real data that needs no download: 1797 images with 17 grey levels, 10 classes, split 80/20
with a fixed seed. ``digits.safetensors`` beside this module holds them as uint8 (``images``
``(1797, 8, 8)``, ``labels`` ``(1797,)``, 117 KB): the test set of the UCI Optical Recognition
of Handwritten Digits dataset, as scikit-learn's ``load_digits`` gives it, under the UCI
repository's CC BY 4.0 licence (doi:10.24432/C50P49). Each example holds the image as a ``(1, 8, 8)`` array in [0, 1] for image
models, and its 64 grey levels in reading order as tokens, so that a sequence model reads the
image as a sequence of pixels.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import safetensors.numpy
import torch
from pydantic import Field

from transformer_zoo.core.tasks import ClassificationTask, TaskOptions, model_reads, objective_reason

if TYPE_CHECKING:
    import datasets

LEVELS = 17  # grey levels 0..16
FIRST_TOKEN = 2  # after PAD and CLS
DATA = Path(__file__).with_name("digits.safetensors")


@functools.cache
def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 images ``(N, 8, 8)`` (grey levels 0 to 16) and their labels ``(N,)``, as uint8."""
    data = safetensors.numpy.load_file(DATA)
    return data["images"], data["labels"]


class DigitsOptions(TaskOptions):
    """Classify 8x8 images of handwritten digits (real data, shipped with the package, no download)."""

    kind: Literal["digits"] = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of the images held out for testing")

    def build(self) -> DigitsTask:
        return DigitsTask(self)


class DigitsTask(ClassificationTask):
    """The digits images as pixel-token sequences (``src``) and image arrays (``image``): a
    sequence classifier reads the tokens, an image classifier the image."""

    inputs: ClassVar[frozenset[str]] = frozenset({"tokens", "image"})
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    vocab_size = FIRST_TOKEN + LEVELS
    num_classes = 10

    def __init__(self, options: DigitsOptions) -> None:
        self.options = options

    def unfit_reason(self, config: Any) -> str | None:
        if model_reads(config) == "image":
            return objective_reason(config, "image-classification")
        return super().unfit_reason(config)

    def model_overrides(self, config: Any) -> dict[str, Any]:
        if model_reads(config) == "image":
            return {"image_size": (8, 8), "channels": 1, "num_classes": self.num_classes}
        return super().model_overrides(config)

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {**super().collate(rows), "image": torch.tensor([r["image"] for r in rows], dtype=torch.float32)}

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        if split not in self.splits:
            raise ValueError(f"task 'digits' has no split {split!r}; splits: {', '.join(self.splits)}")
        all_images, labels = load_digits()
        order = np.random.default_rng(self.options.seed).permutation(len(labels))
        n_test = int(round(self.options.test_fraction * len(order)))
        index = order[n_test:] if split == "train" else order[:n_test]
        images = all_images[index].astype(np.int64)  # (N, 8, 8), levels 0..16
        return datasets.Dataset.from_dict(
            {
                "src": (images.reshape(len(index), 64) + FIRST_TOKEN).tolist(),
                "image": (images[:, None] / (LEVELS - 1)).astype(np.float32).tolist(),
                "label": labels[index].astype(np.int64).tolist(),
            }
        )
