"""Chomsky-hierarchy tasks: length generalisation on formal-language transductions (Delétang et
al. 2023, "Neural Networks and the Chomsky Hierarchy", ICLR; the generators follow the tasks of
google-deepmind/neural_networks_chomsky_hierarchy, ``tasks/``).

An example is an input string over a small alphabet and the output string the task maps it to.
The model reads the input followed by one blank token per output symbol and answers at the
blanks, all at once (the paper's ``make_model_with_empty_targets``, ``training/utils.py``): an
:class:`~transformer_zoo.core.tasks.AnswerTask`, read causally by a decoder, bidirectionally by an
encoder (the paper's Transformer is an encoder). Training inputs have lengths drawn uniformly
from ``train_lengths`` (1 to 40); the ``test`` split scores every length of ``test_lengths`` (41
to 500), so no test input equals a training one. Its ``accuracy`` is the paper's score: the
share of output symbols right at each length, averaged over the lengths with each weighted
equally (``training/range_evaluation.py``, ``training/example.py``). Outputs that end with a
termination symbol and zero padding (``stack-manipulation``, ``binary-addition``) are trained on
every symbol and scored up to the termination symbol, as the paper's ``accuracy_mask``.

The kinds, by level of the hierarchy (as the paper's code files them, ``training/constants.py``):

- regular: ``parity-check``, ``even-pairs``, ``cycle-navigation``;
- deterministic context-free: ``reverse-string``, ``stack-manipulation``;
- context-sensitive: ``duplicate-string``, ``binary-addition``.

Ids: 0 is padding, 1 the blank, then the input alphabet, then the output alphabet (the paper
one-hot codes them apart, and so do these ids). Chance is one over the output alphabet.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from transformer_zoo.core.embedding import PAD
from transformer_zoo.core.tasks import AnswerTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

BLANK = 1  # read where an output symbol is asked (the paper's empty output token)
FIRST = 2  # the first input symbol; the output symbols follow the input alphabet
EVAL_TOKENS = 2**15  # tokens of one evaluation batch at most: test inputs run to 1,500 tokens
LENGTHS = "input lengths (lowest, highest), each included"


def little_endian(number: int, digits: int = 0) -> list[int]:
    """The binary digits of ``number``, lowest first, padded with zeros to ``digits``."""
    return [int(bit) for bit in f"{number:b}".zfill(digits)[::-1]]


def nonzero_bits(rng: np.random.Generator, digits: int) -> int:
    """A number drawn uniformly from 1 to ``2**digits - 1`` (beyond numpy's integers)."""
    while not (bits := rng.integers(0, 2, digits)).any():
        pass
    return int("".join(map(str, bits)), 2)


class ChomskyOptions(TaskOptions):
    """Options shared by the Chomsky-hierarchy tasks: the paper's lengths and how many examples."""

    inputs: ClassVar[tuple[str, ...]] = ("0", "1")
    """The input alphabet: symbol ``i`` is id ``FIRST + i``."""
    outputs: ClassVar[tuple[str, ...]] = ("0", "1")
    """The output alphabet: symbol ``j`` is id ``FIRST + len(inputs) + j``."""
    terminator: ClassVar[str | None] = None
    """The output symbol that ends the output (zeros follow it, not scored); None: all scored."""

    train_lengths: tuple[int, int] = Field((1, 40), description=f"training {LENGTHS}; the paper's 1 to 40")
    test_lengths: tuple[int, int] = Field(
        (41, 500), description=f"test {LENGTHS}, above the training ones; the paper's 41 to 500"
    )
    test_stride: int = Field(
        1, ge=1, description="score every n-th test length from the lowest: 1 (the paper) scores them all"
    )
    train_size: int = Field(20_000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size_per_length: int = Field(
        4,
        ge=1,
        le=MAX_EXAMPLES,
        description="examples at each test length (the paper's code scores 512 a length), and at each training "
        "length in the in-distribution split",
    )
    buckets: int = Field(
        4,
        ge=0,
        description="splits of consecutive test lengths, for a plot against the length; each scores again the test "
        "split's rows at its lengths (0: none, the test split scored once)",
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> ChomskyOptions:
        for name in ("train_lengths", "test_lengths"):
            low, high = getattr(self, name)
            if not 1 <= low <= high <= MAX_LENGTH:
                raise ValueError(
                    f"{name}=({low}, {high}) is no range of input lengths; give (lowest, highest) with "
                    f"1 <= lowest <= highest <= {MAX_LENGTH}, such as {type(self).model_fields[name].default}"
                )
        (_, longest), (low, high) = self.train_lengths, self.test_lengths
        if low <= longest:
            raise ValueError(
                f"test_lengths=({low}, {high}) reach down to the training lengths (up to {longest}): the test "
                f"scores longer inputs than any trained on; start it above {longest}, such as ({longest + 1}, {high})"
            )
        scored = len(range(low, high + 1, self.test_stride))
        if self.buckets > scored:
            raise ValueError(
                f"buckets={self.buckets}, and test_lengths=({low}, {high}) with test_stride={self.test_stride} "
                f"score {scored} length(s); use buckets <= {scored}"
            )
        return self

    @property
    def scored_lengths(self) -> list[int]:
        """The test input lengths scored: ``test_lengths`` at ``test_stride``."""
        low, high = self.test_lengths
        return list(range(low, high + 1, self.test_stride))

    @property
    def in_distribution(self) -> str:
        """The split at the training lengths (its inputs seen in training left out)."""
        return "test_{}-{}".format(*self.train_lengths)

    @property
    def bucket_lengths(self) -> dict[str, list[int]]:
        """The scored test lengths in ``buckets`` runs of consecutive ones, by split name."""
        runs = np.array_split(np.array(self.scored_lengths), self.buckets) if self.buckets else []
        return {f"test_{run[0]}-{run[-1]}": run.tolist() for run in runs}

    @property
    def lengths(self) -> dict[str, int]:
        """The midpoint input length of the in-distribution split and of each bucket split."""
        ranges = {self.in_distribution: list(self.train_lengths), **self.bucket_lengths}
        return {split: (run[0] + run[-1]) // 2 for split, run in ranges.items()}

    def output_length(self, length: int) -> int:
        """Output symbols for an input of ``length`` symbols (the paper's ``output_length``)."""
        return 1

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` examples of ``length`` input symbols: ``(inputs, outputs)``, ``(n, length)`` and
        ``(n, output_length(length))`` indices into :attr:`inputs` and :attr:`outputs`."""
        raise NotImplementedError

    def build(self) -> ChomskyTask:
        return ChomskyTask(self)


class ParityCheckOptions(ChomskyOptions):
    """Regular: whether a binary string has an even or odd number of ones
    (``tasks/regular/parity_check.py``)."""

    kind: Literal["parity-check"] = "parity-check"
    outputs: ClassVar[tuple[str, ...]] = ("even", "odd")

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        bits = rng.integers(0, 2, (n, length))
        return bits, bits.sum(1, keepdims=True) % 2


class EvenPairsOptions(ChomskyOptions):
    """Regular: whether the pairs ``01`` and ``10`` of a binary string are even or odd in number
    (``tasks/regular/even_pairs.py``); even exactly when the first and last bits agree."""

    kind: Literal["even-pairs"] = "even-pairs"
    outputs: ClassVar[tuple[str, ...]] = ("even", "odd")

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        bits = rng.integers(0, 2, (n, length))
        return bits, (bits[:, 1:] != bits[:, :-1]).sum(1, keepdims=True) % 2


class CycleNavigationOptions(ChomskyOptions):
    """Regular: the position on a cycle of 5 after moves left, stay and right from position 0
    (``tasks/regular/cycle_navigation.py``)."""

    kind: Literal["cycle-navigation"] = "cycle-navigation"
    inputs: ClassVar[tuple[str, ...]] = ("-1", "0", "+1")
    outputs: ClassVar[tuple[str, ...]] = ("0", "1", "2", "3", "4")

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        moves = rng.integers(0, 3, (n, length))
        return moves, (moves - 1).sum(1, keepdims=True) % 5


class ReverseStringOptions(ChomskyOptions):
    """Deterministic context-free: a binary string reversed (``tasks/dcf/reverse_string.py``)."""

    kind: Literal["reverse-string"] = "reverse-string"

    def output_length(self, length: int) -> int:
        return length

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        bits = rng.integers(0, 2, (n, length))
        return bits, bits[:, ::-1]


class StackManipulationOptions(ChomskyOptions):
    """Deterministic context-free: a binary stack (given bottom to top) then pops and pushes;
    the output is the final stack top to bottom, ``end``, then zeros up to the input length
    plus one (``tasks/dcf/stack_manipulation.py``). A pop of an empty stack does nothing."""

    kind: Literal["stack-manipulation"] = "stack-manipulation"
    inputs: ClassVar[tuple[str, ...]] = ("0", "1", "pop", "push0", "push1")
    outputs: ClassVar[tuple[str, ...]] = ("0", "1", "end")
    terminator: ClassVar[str | None] = "end"

    def output_length(self, length: int) -> int:
        return length + 1

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        inputs, outputs = np.zeros((n, length), int), np.zeros((n, length + 1), int)
        for row in range(n):
            # the paper's split: a stack of 1 to length - 1 bits, then actions (one bit alone at length 1)
            size = int(rng.integers(1, length)) if length > 1 else 1
            stack = rng.integers(0, 2, size).tolist()
            actions = rng.integers(2, 5, length - size).tolist()
            inputs[row] = stack + actions
            for action in actions:
                if action == 2:  # pop
                    stack = stack[:-1]
                else:  # push0, push1
                    stack.append(action - 3)
            outputs[row, : len(stack) + 1] = stack[::-1] + [2]  # 2: "end"
        return inputs, outputs


class DuplicateStringOptions(ChomskyOptions):
    """Context-sensitive: a binary string written twice (``tasks/cs/duplicate_string.py``)."""

    kind: Literal["duplicate-string"] = "duplicate-string"

    def output_length(self, length: int) -> int:
        return 2 * length

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        bits = rng.integers(0, 2, (n, length))
        return bits, np.concatenate([bits, bits], 1)


class BinaryAdditionOptions(ChomskyOptions):
    """Context-sensitive: the sum of two binary numbers written lowest digit first, ``a+b``; the
    output is the sum, lowest digit first, ``end``, then zeros up to the input length plus one
    (``tasks/cs/binary_addition.py``). Each number has 1 to length - 2 digits (leading zeros
    kept) and is not zero; an input of 1 or 2 symbols is one number alone, 0 to ``2**length - 2``,
    and the output is that number, as the paper's code draws them."""

    kind: Literal["binary-addition"] = "binary-addition"
    inputs: ClassVar[tuple[str, ...]] = ("0", "1", "+")
    outputs: ClassVar[tuple[str, ...]] = ("0", "1", "end")
    terminator: ClassVar[str | None] = "end"

    def output_length(self, length: int) -> int:
        return length + 1

    def sample(self, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        inputs, outputs = np.zeros((n, length), int), np.zeros((n, length + 1), int)
        for row in range(n):
            if length <= 2:
                total = int(rng.integers(0, 2**length - 1))
                inputs[row] = little_endian(total, length)
            else:
                digits = int(rng.integers(1, length - 1))
                a, b = nonzero_bits(rng, digits), nonzero_bits(rng, length - 1 - digits)
                inputs[row] = little_endian(a, digits) + [2] + little_endian(b, length - 1 - digits)  # 2: "+"
                total = a + b
            written = little_endian(total)
            outputs[row, : len(written) + 1] = written + [2]  # 2: "end"
        return inputs, outputs


class ChomskyTask(AnswerTask):
    """Generated examples of one Chomsky-hierarchy task (see the module). Splits: ``train``; the
    in-distribution ``test_1-40`` (training lengths, inputs trained on left out); ``test`` (every
    scored test length, the paper's score); and ``buckets`` splits ``test_41-155``, ... of
    consecutive test lengths, the rows of ``test`` at those lengths."""

    def __init__(self, options: ChomskyOptions) -> None:
        self.options = options
        outputs = FIRST + len(options.inputs)
        self.vocab_size = outputs + len(options.outputs)
        self.answer_ids = tuple(range(outputs, self.vocab_size))
        end = options.terminator
        self.end_id = None if end is None else outputs + options.outputs.index(end)

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", self.options.in_distribution, "test", *self.options.bucket_lengths)

    def longest(self) -> int:
        """Tokens of the longest example: the longest test input and its blanks."""
        length = self.options.test_lengths[1]
        return length + self.options.output_length(length)

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        positional = getattr(getattr(config, "positional", None), "kind", None)
        if positional == "learned" and getattr(config, "max_len", self.longest()) < self.longest():
            return (
                f"learned positions cannot read the longest test example, {self.longest()} tokens (input and blanks), "
                f"with max_len={config.max_len}: build the model with max_len >= {self.longest()}, or lower test_lengths"
            )
        return None

    def examples(self, rng: np.random.Generator, lengths: np.ndarray) -> dict[str, list]:
        """One example for each entry of ``lengths``, in its order: input then blanks (``ids``),
        nothing asked over the input then the output (``answers``), and the input ``length``."""
        o = self.options
        ids: list[list[int]] = [[] for _ in lengths]
        answers: list[list[int]] = [[] for _ in lengths]
        for length in np.unique(lengths).tolist():
            where = np.flatnonzero(lengths == length)
            inputs, outputs = o.sample(rng, len(where), length)
            blanks, nothing = [BLANK] * outputs.shape[1], [PAD] * length
            for i, x, y in zip(where, (inputs + FIRST).tolist(), (outputs + self.answer_ids[0]).tolist()):
                ids[i], answers[i] = x + blanks, nothing + y
        return {"ids": ids, "answers": answers, "length": lengths.tolist()}

    def per_length(self, key: int, lengths: list[int]) -> dict[str, list]:
        """``test_size_per_length`` rows at each of ``lengths``, ascending; a length's rows are drawn
        with their own generator, so they do not change with the other lengths asked for."""
        o = self.options
        parts = [
            self.examples(np.random.default_rng([o.seed, key, n]), np.full(o.test_size_per_length, n)) for n in lengths
        ]
        return {column: [value for part in parts for value in part[column]] for column in ("ids", "answers", "length")}

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        self._check_split(split)
        o = self.options
        if split == "train":
            rng = np.random.default_rng([o.seed, 0])
            rows = self.examples(rng, rng.integers(o.train_lengths[0], o.train_lengths[1] + 1, o.train_size))
        elif split == o.in_distribution:
            low, high = o.train_lengths
            drawn = self.per_length(2, list(range(low, high + 1)))
            seen = {tuple(ids) for ids in self.dataset("train")["ids"]}
            keep = [i for i, ids in enumerate(drawn["ids"]) if tuple(ids) not in seen]
            rows = {column: [values[i] for i in keep] for column, values in drawn.items()}
        else:  # longer than every training input: no test example can equal a training one
            rows = self.per_length(1, o.bucket_lengths.get(split, o.scored_lengths))
        return datasets.Dataset.from_dict(rows)

    def scored(self, answers: torch.Tensor) -> torch.Tensor:
        """Which answers of ``(B, T)`` ``answers`` are scored: every one asked, up to and including
        the terminator where the output has one (the paper's ``accuracy_mask``)."""
        asked = answers != self.pad_id
        if self.end_id is None:
            return asked
        ends = (answers == self.end_id).int()
        return asked & (ends.cumsum(1) - ends == 0)

    def batches(self, lengths: list[int], batch_size: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` runs of rows: ``batch_size`` at most, and at most :data:`EVAL_TOKENS`
        tokens once padded to the run's longest row."""
        start = 0
        while start < len(lengths):
            stop, longest = start, 0
            while stop < len(lengths) and stop - start < batch_size:
                longest = max(longest, lengths[stop] + self.options.output_length(lengths[stop]))
                if stop > start and (stop - start + 1) * longest > EVAL_TOKENS:
                    break
                stop += 1
            yield start, stop
            start = stop

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        """``accuracy``: at each input length, the share of scored answers right over its examples;
        then the mean over the lengths, each weighted equally (the paper's score).
        ``sequence_accuracy``: the share of examples with every scored answer right."""
        data = self.dataset(split)
        lengths = data["length"]
        right: Counter[int] = Counter()
        scored: Counter[int] = Counter()
        whole = 0
        was_training = model.training
        model.eval()
        for start, stop in self.batches(lengths, batch_size):
            chunk = data[start:stop]
            predicted, answers = self.predictions(model, [dict(zip(chunk, row)) for row in zip(*chunk.values())])
            mask = self.scored(answers)
            hits = ((predicted == answers) & mask).sum(1).tolist()
            for length, hit, count in zip(chunk["length"], hits, mask.sum(1).tolist()):
                right[length] += hit
                scored[length] += count
                whole += hit == count
        model.train(was_training)
        means = [right[n] / scored[n] for n in scored]
        return {"accuracy": float(np.mean(means)) if means else 0.0, "sequence_accuracy": whole / max(len(data), 1)}

    def parse_input(self, text: str) -> dict[str, list[int]]:
        """Input symbols separated by spaces (``'1 0 pop push1'``), or written together when each
        is one character (``'0110'``); the blanks follow, nothing asked."""
        o = self.options
        parts = text.split() if " " in text.strip() else list(text.strip())
        unknown = [part for part in parts if part not in o.inputs]
        if unknown or not parts:
            raise ValueError(
                f"{text!r} is not an input of task {o.kind!r}: {unknown[0] if unknown else 'no symbols'!r}; "
                f"use the symbols {', '.join(o.inputs)}"
            )
        ids = [FIRST + o.inputs.index(part) for part in parts] + [BLANK] * o.output_length(len(parts))
        return {"ids": ids, "answers": [PAD] * len(ids)}

    def token_strings(self, ids: list[int]) -> list[str]:
        names = ("<pad>", "_", *self.options.inputs, *self.options.outputs)
        return [names[i] if 0 <= i < len(names) else "?" for i in ids]
