"""Symbol pairs: classify a random sequence by two of its symbols, at positions a study picks.

A sequence is ``length`` random symbols in ``[0, symbols)``, read after the CLS token that the
classification head pools; its label is ``(x[a] + x[b]) mod symbols`` (``sum``) or
``(x[a] - x[b]) mod symbols`` (``difference``), for two fixed positions ``a`` and ``b``
(1-based; -1 is the last symbol). Every other symbol is noise, so what a model must reach is
set by the positions alone. The three kinds are for the studies of local against global
attention and of one head against several:

- ``near-pair`` (the first two symbols): next to the CLS token, inside any sliding window
  (Beltagy et al. 2020, "Longformer").
- ``far-pair`` (the first and the last symbol): with a window of ``w`` keys on each side and
  ``L`` layers, the CLS token sees about ``L * w`` positions, so a sequence longer than that
  needs global attention; Longformer makes the CLS token global for this reason.
- ``ordered-pair`` (the first minus the last): the answer depends on which symbol is where.
  One head spreading its weight evenly over the two symbols returns ``e(x_a) + e(x_b)`` plus a
  constant (the positions add the same amount to every example), which gives the sum but not
  the difference; heads that each look at one position keep them apart (Vaswani et al. 2017,
  section 3.2.2: "With a single attention head, averaging inhibits this").

The classes are uniform, so the majority-class baseline is about ``1 / symbols``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from transformer_zoo.core.embedding import CLS, PAD
from transformer_zoo.core.tasks import ClassificationTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

FIRST_SYMBOL = 2  # after PAD and CLS
POSITIONS = "the two symbols the label combines: 1-based, negative counts from the end (-1: the last)"
OPERATION = "label = (x[a] + x[b]) mod symbols (sum) or (x[a] - x[b]) mod symbols (difference)"


class PairOptions(TaskOptions):
    """Options shared by the symbol-pair tasks."""

    symbols: int = Field(8, ge=2, le=1000, description="distinct symbols, and classes")
    length: int = Field(64, ge=2, le=MAX_LENGTH, description="symbols in every sequence (after the CLS token)")
    positions: tuple[int, int] = Field((1, 2), description=POSITIONS)
    operation: Literal["sum", "difference"] = Field("sum", description=OPERATION)
    train_size: int = Field(5000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size: int = Field(500, ge=1, le=MAX_EXAMPLES, description="test examples")

    @model_validator(mode="after")
    def _check_positions(self) -> PairOptions:
        n = self.length
        outside = [p for p in self.positions if not (1 <= p <= n or -n <= p <= -1)]
        if outside:
            raise ValueError(
                f"positions={list(self.positions)}: {outside[0]} is outside the {n} symbols (length={n}); "
                f"use 1..{n}, or -{n}..-1 counting from the end"
            )
        if len(set(self.indices())) == 1:
            raise ValueError(
                f"positions={list(self.positions)} are the same symbol when length={n}; give two different positions"
            )
        return self

    def indices(self) -> tuple[int, int]:
        """The two positions as 0-based indices into the symbols."""
        a, b = (p - 1 if p > 0 else self.length + p for p in self.positions)
        return a, b

    def build(self) -> PairTask:
        return PairTask(self)


class NearPairOptions(PairOptions):
    """The sum of the first two symbols, modulo ``symbols``: next to the CLS token (local)."""

    kind: Literal["near-pair"] = "near-pair"


class FarPairOptions(PairOptions):
    """The sum of the first and the last symbol, modulo ``symbols``: a long-range dependency."""

    kind: Literal["far-pair"] = "far-pair"
    positions: tuple[int, int] = Field((1, -1), description=POSITIONS)


class OrderedPairOptions(PairOptions):
    """The first symbol minus the last, modulo ``symbols``: two positions kept apart, in order."""

    kind: Literal["ordered-pair"] = "ordered-pair"
    positions: tuple[int, int] = Field((1, -1), description=POSITIONS)
    operation: Literal["sum", "difference"] = Field("difference", description=OPERATION)


class PairTask(ClassificationTask):
    """Generated symbol sequences, each labelled by its pair of symbols."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __init__(self, options: PairOptions) -> None:
        self.options = options
        self.vocab_size = FIRST_SYMBOL + options.symbols
        self.num_classes = options.symbols

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        needed = self.options.length + 1
        if getattr(config, "max_len", needed) < needed:
            return (
                f"the model's max_len={config.max_len} is shorter than the task's {needed} tokens (CLS + length="
                f"{self.options.length}); raise max_len or lower length"
            )
        return None

    def label(self, symbols: np.ndarray) -> np.ndarray:
        """The labels of ``(N, length)`` symbols (0-based, before the id offset): ``(N,)``."""
        o = self.options
        a, b = o.indices()
        combined = symbols[:, a] + symbols[:, b] if o.operation == "sum" else symbols[:, a] - symbols[:, b]
        return combined % o.symbols

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        self._check_split(split)
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        size = o.train_size if split == "train" else o.test_size
        symbols = rng.integers(0, o.symbols, (size, o.length))  # (N, length)
        labels = self.label(symbols)
        return datasets.Dataset.from_dict({"src": (symbols + FIRST_SYMBOL).tolist(), "label": labels.tolist()})

    def parse_input(self, text: str) -> dict[str, list[int]]:
        """Exactly ``length`` symbols ``0`` to ``symbols - 1``, separated by spaces (``'3 1 4'``), or
        written together when each is one character (``'314'``)."""
        o = self.options
        parts = text.split() if " " in text.strip() else list(text.strip())
        for part in parts:
            if not (part.isdigit() and int(part) < o.symbols):
                raise ValueError(
                    f"{text!r}: {part!r} is not a symbol of task {o.kind!r}; use symbols 0-{o.symbols - 1}"
                )
        if len(parts) != o.length:
            raise ValueError(
                f"task {o.kind!r} reads exactly {o.length} symbols (length={o.length}), and {text!r} has "
                f"{len(parts)}; or pick an example with --example test:0"
            )
        return {"src": [FIRST_SYMBOL + int(part) for part in parts]}

    def token_strings(self, ids: list[int]) -> list[str]:
        names = {PAD: "<pad>", CLS: "<cls>"}
        return [names.get(i, str(i - FIRST_SYMBOL) if FIRST_SYMBOL <= i < self.vocab_size else "?") for i in ids]
