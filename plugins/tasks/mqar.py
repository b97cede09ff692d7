"""``mqar``: multi-query associative recall (Arora et al. 2023, "Zoology", section 3).

An example opens with ``pairs`` key-value pairs, ``k1 v1 k2 v2 ...``, the keys drawn without
replacement from the first half of the vocabulary and the values from the second. The rest of
the sequence asks for every key again, once each, in a random order: a query is a key at an
even offset of the rest, the offsets drawn with Zoology's power law (``p(i) ∝ i^(a - 1)``, with
``a = power_a``, which favours early ones), and every other position holds a random token. At
each query the model must give that key's value, the next token in Zoology's layout; nothing
is asked elsewhere. Attention answers by looking the key up; a model with a fixed-size state
(a gated convolution, linear attention) must hold every pair in that state, which needs a
width that grows with the number of pairs (Zoology, section 4 and Figure 2).

The generator is Zoology's ``multiquery_ar`` with ``random_non_queries=True``, its tokens moved up
by one so that id 0 is padding. Zoology's Figure 2 trains on 100,000 examples with a vocabulary
of 8,192 at lengths 64 to 512 and widths 64 to 512; the defaults here are its generator's own
(vocabulary 64, length 64, 8 pairs), small enough for a CPU.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from transformer_zoo.core.embedding import PAD
from transformer_zoo.core.tasks import AnswerTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

FIRST = 1  # Zoology's token t is id t + 1: id 0 is padding


def draws(rng: np.random.Generator, size: int, n: int, k: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``(size, k)``: for each row, ``k`` of ``range(n)`` drawn without replacement, each draw
    with probability proportional to ``weights`` among those left (uniform when None), as
    ``rng.choice(n, k, replace=False, p=...)`` draws them; by the Gumbel top-k trick, in chunks."""
    log_weights = np.zeros(n) if weights is None else np.log(weights / weights.sum())
    chunk = max(1, 2**22 // n)
    return np.concatenate(
        [
            np.argsort(-(log_weights + rng.gumbel(size=(min(chunk, size - start), n))), axis=1)[:, :k]
            for start in range(0, size, chunk)
        ]
    )


class MQAROptions(TaskOptions):
    """Multi-query associative recall (Zoology): give the value of every key asked again."""

    kind: Literal["mqar"] = "mqar"
    vocab_size: int = Field(64, ge=8, le=1_000_000, description="tokens: keys are the first half, values the second")
    length: int = Field(64, ge=8, le=MAX_LENGTH, description="tokens of every example (Zoology's input_seq_len)")
    pairs: int = Field(8, ge=1, description="key-value pairs of an example, each asked once (num_kv_pairs)")
    power_a: float = Field(0.01, gt=0, le=1, description="the power law of the query offsets: p(i) ∝ i^(power_a - 1)")
    train_size: int = Field(20_000, ge=1, le=MAX_EXAMPLES, description="training examples")
    test_size: int = Field(1_000, ge=1, le=MAX_EXAMPLES, description="test examples")

    @model_validator(mode="after")
    def _check_sizes(self) -> MQAROptions:
        if self.length % 2:
            raise ValueError(
                f"length={self.length} is odd; Zoology's layout needs an even length, such as {self.length + 1}"
            )
        if 4 * self.pairs > self.length:
            raise ValueError(
                f"pairs={self.pairs} do not fit in length={self.length}: the pairs take 2 x pairs tokens and their "
                f"queries as many again at even offsets; use length >= {4 * self.pairs} or pairs <= {self.length // 4}"
            )
        if self.pairs >= self.vocab_size // 2:
            raise ValueError(
                f"pairs={self.pairs} distinct keys need more than vocab_size // 2 - 1 = {self.vocab_size // 2 - 1} key "
                f"tokens; use vocab_size >= {2 * self.pairs + 2} or pairs <= {self.vocab_size // 2 - 1}"
            )
        return self

    def build(self) -> MQARTask:
        return MQARTask(self)


class MQARTask(AnswerTask):
    """Generated MQAR examples, read causally (a decoder); the test split has no example of the
    training split."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    causal: ClassVar[bool] = True  # Zoology trains language models on it

    def __init__(self, options: MQAROptions) -> None:
        self.options = options
        self.vocab_size = FIRST + options.vocab_size
        half = options.vocab_size // 2
        self.answer_ids = tuple(range(FIRST + half, FIRST + options.vocab_size))

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "max_len", self.options.length) < self.options.length:
            return (
                f"the model's max_len={config.max_len} is shorter than the task's length={self.options.length}; "
                "raise max_len or lower length"
            )
        return None

    def generate(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``size`` examples as Zoology's ``multiquery_ar`` draws them: ``(ids, answers)``, two
        ``(size, length)`` arrays of ids (answers 0 where nothing is asked)."""
        o = self.options
        half = o.vocab_size // 2
        keys = 1 + draws(rng, size, half - 1, o.pairs)
        values = half + draws(rng, size, o.vocab_size - half, o.pairs)
        context = 2 * o.pairs
        space = (o.length - context) // 2
        gaps = draws(rng, size, space, o.pairs, weights=np.arange(1, space + 1) ** (o.power_a - 1))
        tokens = rng.integers(0, o.vocab_size, (size, o.length))  # the random non-queries
        tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
        rows = np.arange(size)[:, None]
        tokens[rows, context + 2 * gaps] = keys
        answers = np.zeros_like(tokens)
        answers[rows, context + 2 * gaps] = values + FIRST
        return tokens + FIRST, answers

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        self._check_split(split)
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        ids, answers = self.generate(rng, o.train_size if split == "train" else o.test_size)
        if split != "train":  # no test example repeats one trained on
            seen = {row.tobytes() for row in self.generate(np.random.default_rng([o.seed, 0]), o.train_size)[0]}
            fresh = [i for i, row in enumerate(ids) if row.tobytes() not in seen]
            ids, answers = ids[fresh], answers[fresh]
        return datasets.Dataset.from_dict({"ids": ids.tolist(), "answers": answers.tolist()})

    def token_strings(self, ids: list[int]) -> list[str]:
        half = FIRST + self.options.vocab_size // 2
        return ["<pad>" if i == PAD else f"k{i - FIRST}" if i < half else f"v{i - FIRST}" for i in ids]
