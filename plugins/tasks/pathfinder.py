"""Pathfinder (Linsley et al. 2018), as the Long Range Arena poses it (Tay et al. 2021): is there a
path between the two markers of an image, read as a sequence of pixels?

Each image is ``size`` x ``size`` (32 in the Long Range Arena) of black background with
``paths`` curved strokes, each a smooth random walk of ``path_length`` one-pixel steps whose
heading turns by a normally distributed angle at each step. Two markers (small discs) sit at
path ends: at the two ends of one path (label 1, connected) or at one end of each of two
different paths (label 0). Every label is checked on the finished image: the markers are in one
8-connected component of lit pixels exactly when the label is 1, so crossing strokes never
make a negative example connected (such draws are rejected and redrawn). The two labels
alternate, so every split is balanced.

The model reads the ``size * size`` pixels row by row as tokens of their 8-bit intensity (256
levels, as the Long Range Arena's pixel sequences), and predicts the label. Images are drawn
with numpy from the task's seed and split, so the data is the same everywhere and needs no
download.

Not as in the original: the strokes are solid rather than dashed, and the markers are discs of
radius 1; the curvature and the number of distractor paths are options rather than the
original's three difficulty settings.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from transformer_zoo.core.embedding import CLS, PAD
from transformer_zoo.core.tasks import ClassificationTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES

if TYPE_CHECKING:
    import datasets

LEVELS = 256  # 8-bit pixel intensities, one token each
FIRST_TOKEN = 2  # after PAD and CLS
LIT = 255


class PathfinderOptions(TaskOptions):
    """Pathfinder: are the two markers of a generated image joined by one path? 2 classes, pixels as tokens."""

    kind: Literal["pathfinder"] = "pathfinder"
    size: int = Field(
        32, ge=8, le=128, description="image side in pixels (32 in the Long Range Arena); size * size tokens"
    )
    paths: int = Field(3, ge=2, le=12, description="strokes per image, the markers' included")
    path_length: int = Field(14, ge=3, le=512, description="one-pixel steps of each stroke")
    curvature: float = Field(
        0.35, ge=0, le=math.pi, description="standard deviation of a stroke's turn per step (radians)"
    )
    train_size: int = Field(10000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size: int = Field(1000, ge=1, le=MAX_EXAMPLES, description="test examples")

    def build(self) -> PathfinderTask:
        return PathfinderTask(self)


class PathfinderTask(ClassificationTask):
    """Generated Pathfinder images, flattened to pixel tokens, and whether their markers are joined."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    vocab_size = FIRST_TOKEN + LEVELS
    num_classes = 2

    def __init__(self, options: PathfinderOptions) -> None:
        self.options = options

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        needed = self.options.size**2 + 1
        if getattr(config, "max_len", needed) < needed:
            return (
                f"the model's max_len={config.max_len} is shorter than the task's {needed} tokens (CLS + "
                f"{self.options.size} x {self.options.size} pixels); raise max_len or lower size"
            )
        return None

    def token_strings(self, ids: list[int]) -> list[str]:
        names = {PAD: "<pad>", CLS: "<cls>"}
        return [names.get(i, str(i - FIRST_TOKEN)) for i in ids]

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        if split not in self.splits:
            raise ValueError(f"task 'pathfinder' has no split {split!r}; splits: {', '.join(self.splits)}")
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        size = o.train_size if split == "train" else o.test_size
        src, labels = [], []
        for i in range(size):
            label = i % 2
            image, _ = draw(rng, o, connected=bool(label))
            src.append((image.reshape(-1).astype(np.int64) + FIRST_TOKEN).tolist())
            labels.append(label)
        return datasets.Dataset.from_dict({"src": src, "label": labels})


def draw(
    rng: np.random.Generator, options: PathfinderOptions, *, connected: bool, attempts: int = 1000
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """One ``(size, size)`` uint8 image whose markers are joined by a path exactly when
    ``connected``, and the markers' centres ``(row, column)``."""
    from scipy import ndimage

    for _ in range(attempts):
        strokes = [_stroke(rng, options) for _ in range(options.paths)]
        image = np.zeros((options.size, options.size), dtype=np.uint8)
        for stroke in strokes:
            image[stroke[:, 0], stroke[:, 1]] = LIT
        ends = (strokes[0][0], strokes[0][-1]) if connected else (strokes[0][0], strokes[1][-1])
        for row, col in ends:
            image[max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2] = LIT  # a disc of radius 1 (3 x 3)
        components, _ = ndimage.label(image > 0, structure=np.ones((3, 3)))
        if (components[tuple(ends[0])] == components[tuple(ends[1])]) == connected and not _touching(ends):
            return image, ends
    raise ValueError(
        f"pathfinder could not draw a {'connected' if connected else 'separated'} image of size "
        f"{options.size} with {options.paths} paths of {options.path_length} steps in {attempts} tries; "
        "use fewer or shorter paths, or a larger size"
    )


def _touching(ends: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether the two markers' discs overlap or touch (then no path is needed to join them)."""
    return bool(np.abs(ends[0] - ends[1]).max() <= 3)


def _stroke(rng: np.random.Generator, options: PathfinderOptions) -> np.ndarray:
    """``(n, 2)`` pixel coordinates of a smooth random walk, each step 8-connected to the last;
    a walk that reaches the border is mirrored back inside it."""
    low, high = 1, options.size - 2
    headings = rng.uniform(0, 2 * math.pi) + np.cumsum(rng.normal(0, options.curvature, options.path_length))
    steps = np.stack([np.sin(headings), np.cos(headings)], axis=1)
    walk = rng.uniform(low + 1, high - 1, 2) + np.concatenate([np.zeros((1, 2)), np.cumsum(steps, axis=0)])
    span = high - low
    folded = np.abs((walk - low) % (2 * span) - span)  # a triangle wave: mirrored at both borders
    pixels = np.round(high - folded).astype(np.int64)
    keep = np.concatenate([[True], (pixels[1:] != pixels[:-1]).any(axis=1)])
    return pixels[keep]
