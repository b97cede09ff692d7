"""ListOps (Nangia & Bowman 2018), as generated for the Long Range Arena (Tay et al. 2021).

Nested prefix expressions over the digits 0-9 with the operators MAX, MIN, MED (median) and
SM (sum modulo 10), for example ``[MAX 2 9 [MIN 4 7 ] 0 ]`` = 9; the label is the value,
one of 10 classes. The long-range difficulty is that the answer depends on every token.
"""

from __future__ import annotations

import functools
import statistics
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from transformer_zoo.core.embedding import CLS, PAD
from transformer_zoo.core.tasks import ClassificationTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

OPERATORS = ("MAX", "MIN", "MED", "SM")
TOKENS = [*(str(d) for d in range(10)), *(f"[{op}" for op in OPERATORS), "]"]
FIRST_TOKEN = 2  # after PAD and CLS
TOKEN_ID = {token: FIRST_TOKEN + i for i, token in enumerate(TOKENS)}


def apply(op: str, values: list[int]) -> int:
    if op == "MAX":
        return max(values)
    if op == "MIN":
        return min(values)
    if op == "MED":
        return int(statistics.median(values))  # as numpy's median, in a twentieth of its time on a short list
    return sum(values) % 10


MAX_DEPTH = 100  # expressions are generated recursively, one Python frame a level


class ListOpsOptions(TaskOptions):
    """ListOps: evaluate nested MAX/MIN/MED/SM expressions over digits; 10 classes."""

    kind: Literal["listops"] = "listops"
    max_depth: int = Field(
        4, ge=1, le=MAX_DEPTH, description="deepest nesting of operators (10 in the Long Range Arena)"
    )
    max_args: int = Field(
        5, ge=2, le=MAX_LENGTH, description="most arguments of one operator (10 in the Long Range Arena)"
    )
    min_length: int = Field(16, ge=3, le=MAX_LENGTH, description="fewest tokens of an expression")
    max_length: int = Field(
        128, ge=3, le=MAX_LENGTH, description="most tokens of an expression (2000 in the Long Range Arena)"
    )
    leaf_probability: float = Field(
        0.5, gt=0, lt=1, description="chance that an argument is a digit, not a sub-expression"
    )
    train_size: int = Field(20000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size: int = Field(1000, ge=1, le=MAX_EXAMPLES, description="test examples")

    @model_validator(mode="after")
    def _check(self) -> ListOpsOptions:
        if self.min_length > self.max_length:
            raise ValueError(f"min_length={self.min_length} is larger than max_length={self.max_length}")
        return self

    def build(self) -> ListOpsTask:
        return ListOpsTask(self)


class ListOpsTask(ClassificationTask):
    """Generated ListOps expressions and their values."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    vocab_size = FIRST_TOKEN + len(TOKENS)
    num_classes = 10

    def __init__(self, options: ListOpsOptions) -> None:
        self.options = options

    def parse_input(self, text: str) -> dict[str, list[int]]:
        """An expression with space-separated tokens, such as ``'[MAX 2 9 [MIN 4 7 ] 0 ]'``."""
        unknown = [t for t in text.split() if t not in TOKEN_ID]
        if unknown or not text.split():
            what = f"{unknown[0]!r} is not a ListOps token" if unknown else "there is no token"
            raise ValueError(
                f"{text!r}: {what}; write an expression such as '[MAX 2 9 [MIN 4 7 ] 0 ]' from {' '.join(TOKENS)}"
            )
        return {"src": [TOKEN_ID[t] for t in text.split()]}

    def token_strings(self, ids: list[int]) -> list[str]:
        names = {PAD: "<pad>", CLS: "<cls>"}
        return [names.get(i, TOKENS[i - FIRST_TOKEN] if FIRST_TOKEN <= i < self.vocab_size else "?") for i in ids]

    def _tree(self, rng: np.random.Generator, depth: int) -> tuple[list[str], int]:
        """Tokens and value of a random expression whose root is an operator."""
        o = self.options
        op = OPERATORS[rng.integers(len(OPERATORS))]
        tokens, values = [f"[{op}"], []
        for _ in range(rng.integers(2, o.max_args + 1)):
            if depth + 1 < o.max_depth and rng.random() > o.leaf_probability:
                sub_tokens, value = self._tree(rng, depth + 1)
            else:
                value = int(rng.integers(10))
                sub_tokens = [str(value)]
            tokens += sub_tokens
            values.append(value)
        return tokens + ["]"], apply(op, values)

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        if split not in self.splits:
            raise ValueError(f"task 'listops' has no split {split!r}; splits: {', '.join(self.splits)}")
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        size = o.train_size if split == "train" else o.test_size
        src, labels, attempts = [], [], 0
        while len(src) < size:
            attempts += 1
            if attempts > 100 * size:
                raise ValueError(
                    f"listops could not generate expressions of {o.min_length}-{o.max_length} tokens with "
                    f"max_depth={o.max_depth}, max_args={o.max_args}; widen the length range or raise the depth"
                )
            tokens, value = self._tree(rng, 0)
            if o.min_length <= len(tokens) <= o.max_length:
                src.append([TOKEN_ID[t] for t in tokens])
                labels.append(value)
        return datasets.Dataset.from_dict({"src": src, "label": labels})
