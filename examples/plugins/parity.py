"""A classification task: is the number of ones in a string of bits odd? Parity is a classic
hard case for attention (Hahn 2020, "Theoretical Limitations of Self-Attention")."""

import functools
from typing import ClassVar, Literal

import datasets
import numpy as np
from pydantic import Field

import transformer_zoo as tz
from transformer_zoo.core.tasks import ClassificationTask, TaskOptions


class ParityOptions(TaskOptions):
    """Strings of bits, each labelled 1 if it holds an odd number of ones, else 0."""

    kind: Literal["parity"] = "parity"
    length: int = Field(12, ge=1, le=512, description="bits per string")
    train_size: int = Field(2000, ge=1, description="strings to train on")
    test_size: int = Field(500, ge=1, description="strings to score on")
    # seed (every task's field, from TaskOptions): the seed of the generated strings

    def build(self) -> "ParityTask":
        return ParityTask(self)


class ParityTask(ClassificationTask):
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    vocab_size = 5  # ids 0-2 are padding, start (the pooled first token) and end; the bits are 3 and 4
    num_classes = 2

    def __init__(self, options: ParityOptions) -> None:
        self.options = options

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        self._check_split(split)  # an unknown split gets a clear error
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])  # each split its own strings
        bits = rng.integers(0, 2, (o.train_size if split == "train" else o.test_size, o.length))
        return datasets.Dataset.from_dict({"src": (3 + bits).tolist(), "label": (bits.sum(1) % 2).tolist()})


@tz.hookimpl
def tzoo_tasks() -> list[type[TaskOptions]]:
    return [ParityOptions]
