"""Algorithmic seq2seq tasks: copy, reverse, sort and addition.

The Universal Transformer paper (Dehghani et al. 2018, section 3.2) trains on short
sequences and tests on longer ones to measure length generalisation; each task here has a
``train`` split and a ``test`` split in the training lengths, and a ``test_long`` split in
longer lengths. Data is generated from the seed, so every run sees the same examples.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from transformer_zoo.core.embedding import BOS, EOS, PAD
from transformer_zoo.core.tasks import Seq2SeqTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

FIRST_SYMBOL = 3  # after PAD, BOS, EOS
Length = Annotated[int, Field(le=MAX_LENGTH)]  # the lower bound is checked with the range


class AlgorithmicOptions(TaskOptions):
    """Options shared by the algorithmic tasks."""

    symbols: int = Field(10, ge=2, le=1000, description="distinct input symbols (digits for addition)")
    train_lengths: tuple[Length, Length] = Field((1, 16), description="inclusive range of training lengths")
    test_lengths: tuple[Length, Length] = Field(
        (17, 24), description="inclusive range of the test_long split's lengths"
    )
    train_size: int = Field(20000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size: int = Field(500, ge=1, le=MAX_EXAMPLES, description="examples in each test split")

    @model_validator(mode="after")
    def _check_lengths(self) -> AlgorithmicOptions:
        for name in ("train_lengths", "test_lengths"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name}=({low}, {high}) must satisfy 1 <= low <= high")
        return self

    def build(self) -> AlgorithmicTask:
        return AlgorithmicTask(self)


class AlgorithmicTask(Seq2SeqTask):
    """Generated source/target pairs for one algorithmic rule."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test", "test_long")

    def __init__(self, options: AlgorithmicOptions) -> None:
        self.options = options
        self.extra_symbols = 1 if options.kind == "addition" else 0  # the '+' sign
        self.vocab_size = FIRST_SYMBOL + options.symbols + self.extra_symbols

    def _example(self, rng: np.random.Generator, length: int) -> dict[str, list[int]]:
        o = self.options
        if o.kind == "addition":  # two numbers of about length/2 digits each, base `symbols`
            a_len = max(1, length // 2)
            b_len = max(1, length - a_len)
            a = [int(d) for d in rng.integers(0, o.symbols, a_len)]
            b = [int(d) for d in rng.integers(0, o.symbols, b_len)]
            total = _to_digits(_from_digits(a, o.symbols) + _from_digits(b, o.symbols), o.symbols)
            plus = o.symbols
            return {
                "src": [FIRST_SYMBOL + d for d in a] + [FIRST_SYMBOL + plus] + [FIRST_SYMBOL + d for d in b],
                "tgt": [FIRST_SYMBOL + d for d in total],
            }
        seq = [FIRST_SYMBOL + int(s) for s in rng.integers(0, o.symbols, length)]
        target = {"copy": seq, "reverse": seq[::-1], "sort": sorted(seq)}[o.kind]
        return {"src": seq, "tgt": target}

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        if split not in self.splits:
            raise ValueError(f"task {self.options.kind!r} has no split {split!r}; splits: {', '.join(self.splits)}")
        o = self.options
        low, high = o.test_lengths if split == "test_long" else o.train_lengths
        size = o.train_size if split == "train" else o.test_size
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        lengths = rng.integers(low, high + 1, size)
        rows = [self._example(rng, int(n)) for n in lengths]
        return datasets.Dataset.from_dict({"src": [r["src"] for r in rows], "tgt": [r["tgt"] for r in rows]})

    def parse_input(self, text: str) -> dict[str, list[int]]:
        """Symbols ``0`` to ``symbols - 1`` separated by spaces (``'3 1 4'``), or written together
        when each is one character (``'314'``); addition takes one ``+`` (``'12+34'``)."""
        o = self.options
        parts = text.replace("+", " + ").split() if " " in text.strip() else list(text.strip())
        allowed = f"symbols 0-{o.symbols - 1}" + (" and one '+'" if o.kind == "addition" else "")
        ids = []
        for part in parts:
            if part == "+" and o.kind == "addition":
                ids.append(FIRST_SYMBOL + o.symbols)
            elif part.isdigit() and int(part) < o.symbols:
                ids.append(FIRST_SYMBOL + int(part))
            else:
                raise ValueError(f"{text!r}: {part!r} is not a symbol of task {o.kind!r}; use {allowed}")
        if o.kind == "addition" and (parts.count("+") != 1 or parts[0] == "+" or parts[-1] == "+"):
            raise ValueError(f"{text!r}: addition takes two numbers joined by one '+', such as '12+34'")
        if not ids:
            raise ValueError(f"task {o.kind!r} needs at least one symbol, such as '3 1 4'")
        return {"src": ids}

    def token_strings(self, ids: list[int]) -> list[str]:
        plus = FIRST_SYMBOL + self.options.symbols
        names = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", plus: "+"}
        return [names.get(i, str(i - FIRST_SYMBOL)) for i in ids]


def _from_digits(digits: list[int], base: int) -> int:
    value = 0
    for d in digits:
        value = value * base + d
    return value


def _to_digits(value: int, base: int) -> list[int]:
    digits = []
    while True:
        value, d = divmod(value, base)
        digits.append(d)
        if value == 0:
            return digits[::-1]


class CopyOptions(AlgorithmicOptions):
    """Copy the input sequence."""

    kind: Literal["copy"] = "copy"


class ReverseOptions(AlgorithmicOptions):
    """Reverse the input sequence."""

    kind: Literal["reverse"] = "reverse"


class SortOptions(AlgorithmicOptions):
    """Sort the input symbols."""

    kind: Literal["sort"] = "sort"


class AdditionOptions(AlgorithmicOptions):
    """Add two numbers written as digit sequences (base ``symbols``), most significant first."""

    kind: Literal["addition"] = "addition"
