"""Digits: scikit-learn's bundled 8x8 images of handwritten digits (Alpaydin & Kaynak 1998).

Real data that needs no download: 1797 images with 17 grey levels, 10 classes, split 80/20
with a fixed seed. Each example holds the image as a ``(1, 8, 8)`` array in [0, 1] for image
models, and its 64 grey levels in reading order as tokens, so that a sequence model reads the
image as a sequence of pixels.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import datasets
import numpy as np
import torch
from pydantic import Field

from transformer_zoo.core.options import TaskOptions
from transformer_zoo.core.tasks import ClassificationTask, model_reads, objective_reason

LEVELS = 17  # grey levels 0..16
FIRST_TOKEN = 2  # after PAD and CLS


class Digits(TaskOptions):
    """Classify scikit-learn's 8x8 digit images (real data, bundled, no download)."""

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

    def __init__(self, options: Digits) -> None:
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
        from sklearn.datasets import load_digits

        if split not in self.splits:
            raise ValueError(f"task 'digits' has no split {split!r}; splits: {', '.join(self.splits)}")
        digits = load_digits()
        order = np.random.default_rng(self.options.seed).permutation(len(digits.target))
        n_test = int(round(self.options.test_fraction * len(order)))
        index = order[n_test:] if split == "train" else order[:n_test]
        images = digits.images[index].astype(np.int64)  # (N, 8, 8), levels 0..16
        return datasets.Dataset.from_dict(
            {
                "src": (images.reshape(len(index), 64) + FIRST_TOKEN).tolist(),
                "image": (images[:, None] / (LEVELS - 1)).astype(np.float32).tolist(),
                "label": digits.target[index].tolist(),
            }
        )
