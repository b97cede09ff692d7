"""The six MAD tasks: synthetic token tasks that rank sequence-mixing architectures.

Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures" (MAD, ICML);
the generators follow the authors' code (github.com/athms/mad-lab,
``mad/data/instances.py``), the defaults its baseline settings (``configs/tasks/*.yml``), and the
option names its ``MADConfig`` (``mad/configs.py``), the test set size included (1,280).

- ``mad-in-context-recall``: key-value pairs, keys repeating; at every value whose key came
  before, give that value (the multi-query form MAD benchmarks).
- ``mad-noisy-recall``: the same, with pairs replaced by noise tokens to ignore.
- ``mad-fuzzy-recall``: keys and values are motifs of several tokens, of varying sizes.
- ``mad-selective-copying``: give the ``num_tokens_to_copy`` tokens spread among blanks, in order,
  after a copy token.
- ``mad-compression``: read a sequence and rebuild it from one vector, the model's state at its
  last (compression) token; the model takes MAD's small decoder as its head.
- ``mad-memorization``: the value of a key, from one fixed key-value table: facts kept in the
  weights, not read from the context.

Every generator draws MAD's tokens ``0 .. vocab_size - 1`` (each task gives the top ids its
special roles, as MAD does); a row holds them as ids ``FIRST_TOKEN + token``, keeping the zoo's
PAD, BOS and EOS apart. Rows are :class:`~transformer_zoo.core.tasks.AnswerTask` rows: ``answers[t]``
is the token to give at position ``t``, PAD where nothing is asked. As in MAD, the recall tasks
ask every next token of a training row (a language-model loss) and, in the test split, only the
values a model can recall; the other tasks ask the same positions in both splits. No test row
repeats a training row's ids: a test draw equal to one is drawn again (MAD only warns).

MAD's score of a model is, for each task, the mean over the settings of
:data:`~.mad_instances.DIFFICULTIES` of the best test accuracy over its learning-rate and
weight-decay sweep; the suite's, the mean over the tasks.

Where this departs from mad-lab (the distributions are MAD's; the random draws are not):

- Noisy recall keeps one pair free of noise among the pairs it draws; mad-lab draws that pair
  among one more, so in one sequence of ``seq_len / 2`` it keeps none.
- Fuzzy recall always places the probe pair before the sequence ends; mad-lab's may end first,
  asking a value whose key never came (about 2% of its baseline test sequences).
- Selective copying draws where the blanks go from the task's seeded generator; mad-lab from
  numpy's global one.
- Compression and memorization do not take mad-lab's noise options, which no MAD setting uses
  (and whose noisy targets mad-lab's compression generator drops).
- The compression decoder's position sinusoids are the zoo's (:class:`CompressionDecoder`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from transformer_zoo.core.embedding import EOS, PAD, sinusoid_table
from transformer_zoo.core.model import token_loss
from transformer_zoo.core.options import HeadOptions
from transformer_zoo.core.tasks import AnswerTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH, MAX_VOCAB

from .mad_instances import (
    IGNORE,
    compression_instance,
    fuzzy_recall_instance,
    memorization_instance,
    memorization_table,
    recall_instance,
    selective_copying_instance,
)

if TYPE_CHECKING:
    import datasets

FIRST_TOKEN = EOS + 1  # MAD's token t is id FIRST_TOKEN + t
# ---- the compression task's decoder -----------------------------------------------------------


class CompressionDecoder(nn.Module):
    """MAD's decoder for compression (mad-lab's ``AutoEncoder.decode``): the hidden state of the
    last real position ``(B, D)``, plus a sinusoid of each output position, through a two-layer
    MLP that keeps the width, to logits over the vocabulary: ``(B, T, D)`` in, ``(B, T, V)`` out.

    Everything the model passes on about the sequence goes through that one vector. The
    sinusoids are the zoo's table with the sines first; mad-lab's (fairseq's) spaces the
    frequencies a little differently. RMSNorm as in mad-lab's ``AutoEncoder``.
    """

    category: ClassVar[str] = "head"

    def __init__(self, d_model: int, vocab_size: int, *, ignore_index: int) -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.mlp = nn.Sequential(
            nn.RMSNorm(d_model),
            nn.Linear(d_model, d_model),
            nn.GELU(),
            nn.RMSNorm(d_model),
            nn.Linear(d_model, d_model),
            nn.GELU(),
        )
        self.unembed = nn.Sequential(nn.RMSNorm(d_model), nn.Linear(d_model, vocab_size))
        for module in self.modules():
            if isinstance(module, nn.Linear):  # mad-lab's initialisation
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        batch, length, width = hidden.shape
        last = mask.sum(1) - 1 if mask is not None else torch.full((batch,), length - 1, device=hidden.device)
        code = hidden[torch.arange(batch, device=hidden.device), last]  # (B, D)
        positions = sinusoid_table(length, width, layout="halves").to(hidden)  # (T, D)
        return self.unembed(self.mlp(code[:, None] + positions))  # (B, T, V)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return token_loss(logits, targets, self.ignore_index)


class MADCompressionDecoderOptions(HeadOptions):
    """The head ``mad-compression`` puts on a model: MAD's decoder of the sequence from the state
    at its last token (:class:`CompressionDecoder`). No options: it is MAD's, as MAD has it."""

    kind: Literal["mad-compression-decoder"] = "mad-compression-decoder"

    def build(
        self, *, d_model: int, vocab_size: int, embedding: nn.Embedding, pad_id: int, dropout: float
    ) -> nn.Module:
        return CompressionDecoder(d_model, vocab_size, ignore_index=pad_id)


# ---- options ----------------------------------------------------------------------------------

VOCAB = "MAD's vocabulary, its special tokens included (MADConfig.vocab_size)"
SEQ_LEN = "tokens MAD draws for one example (MADConfig.seq_len)"
TRAIN = "training examples (MADConfig.num_train_examples)"
TEST = "test examples (MADConfig.num_test_examples), none equal to a training example"
MULTI_QUERY = (
    "ask the value at every repeated key (true: MAD's benchmark) or only at the last pair, after a copy "
    "prefix token (MADConfig.multi_query)"
)
NOISE_VOCAB = "tokens, out of vocab_size, used only as noise (MADConfig.noise_vocab_size)"
FRAC_NOISE = "chance that a pair is replaced by as many noise tokens (MADConfig.frac_noise)"
Roles = tuple[tuple[int, str], ...]  # (end, name): the tokens below end, and above the one before, are name


class MADOptions(TaskOptions):
    """Options every MAD task takes (mad-lab's ``MADConfig``); a task's defaults are MAD's
    baseline setting of it (``configs/tasks/<task>.yml``)."""

    vocab_size: int = Field(16, ge=3, le=MAX_VOCAB - FIRST_TOKEN, description=VOCAB)
    seq_len: int = Field(128, ge=2, le=MAX_LENGTH, description=SEQ_LEN)
    num_train_examples: int = Field(12_800, ge=1, le=MAX_EXAMPLES, description=TRAIN)
    num_test_examples: int = Field(1_280, ge=1, le=MAX_EXAMPLES, description=TEST)

    def build(self) -> MADTask:
        raise NotImplementedError


class RecallOptions(MADOptions):
    """Options of in-context recall, with or without noise (one generator in mad-lab)."""

    multi_query: bool = Field(True, description=MULTI_QUERY)
    noise_vocab_size: int = Field(0, ge=0, description=NOISE_VOCAB)
    frac_noise: float = Field(0.0, ge=0.0, lt=1.0, description=FRAC_NOISE)

    def special_tokens(self) -> tuple[str, ...]:
        """The tokens after the keys, values and noise, in order: their names."""
        return () if self.multi_query else ("<copy>",)  # the copy prefix

    def content(self) -> int:
        """Key and value tokens together."""
        return self.vocab_size - self.noise_vocab_size - len(self.special_tokens())

    @model_validator(mode="after")
    def _check_recall(self) -> RecallOptions:
        if self.frac_noise > 0 and self.noise_vocab_size == 0:
            raise ValueError(f"frac_noise={self.frac_noise} needs noise tokens; set noise_vocab_size >= 1")
        return self

    def _check_vocabulary(self, keys_needed: int, values_needed: int) -> None:
        keys_n = self.content() // 2
        values_n = self.content() - keys_n
        if keys_n < keys_needed or values_n < values_needed:
            least = max(2 * keys_needed, 2 * values_needed - 1) + self.noise_vocab_size + len(self.special_tokens())
            raise ValueError(
                f"vocab_size={self.vocab_size} leaves {keys_n} key and {values_n} value tokens (after "
                f"noise_vocab_size={self.noise_vocab_size} noise tokens and {len(self.special_tokens())} special), and a "
                f"key needs {keys_needed} distinct key tokens, a value {values_needed} distinct value tokens; "
                f"raise vocab_size to {least} or more"
            )

    def roles(self) -> Roles:
        keys_n, content = self.content() // 2, self.content()
        noise = content + self.noise_vocab_size
        return (
            (keys_n, "k"),
            (content, "v"),
            (noise, "n"),
            *((noise + i + 1, s) for i, s in enumerate(self.special_tokens())),
        )


class InContextRecallOptions(RecallOptions):
    """In-context recall: the value of every key seen before (mad-lab
    ``configs/tasks/in-context-recall.yml``: vocab_size 16, seq_len 128, 12,800 training examples,
    multi_query)."""

    kind: Literal["mad-in-context-recall"] = "mad-in-context-recall"

    @model_validator(mode="after")
    def _check_pairs(self) -> InContextRecallOptions:
        if self.seq_len % 2 or self.seq_len < 4:
            raise ValueError(
                f"seq_len={self.seq_len}: a recall sequence is pairs of key and value, at least two of them; "
                f"use an even seq_len of 4 or more, such as {max(4, self.seq_len + self.seq_len % 2)}"
            )
        self._check_vocabulary(1, 1)
        return self

    def build(self) -> MADTask:
        draw = functools.partial(
            recall_instance,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            multi_query=self.multi_query,
            noise_vocab_size=self.noise_vocab_size,
            frac_noise=self.frac_noise,
        )
        keys_n = self.content() // 2
        length = self.seq_len - 1 if self.multi_query else self.seq_len
        return MADTask(
            self,
            draw,
            length=length,
            answers=range(keys_n, self.content()),
            roles=self.roles(),
        )


class NoisyRecallOptions(InContextRecallOptions):
    """Noisy in-context recall (mad-lab ``configs/tasks/noisy-in-context-recall.yml``: vocab_size
    32, 16 of them noise, seq_len 128, frac_noise 0.2, 12,800 training examples, multi_query)."""

    kind: Literal["mad-noisy-recall"] = "mad-noisy-recall"  # type: ignore[assignment]
    vocab_size: int = Field(32, ge=3, le=MAX_VOCAB - FIRST_TOKEN, description=VOCAB)
    noise_vocab_size: int = Field(16, ge=0, description=NOISE_VOCAB)
    frac_noise: float = Field(0.2, ge=0.0, lt=1.0, description=FRAC_NOISE)


class FuzzyRecallOptions(RecallOptions):
    """Fuzzy in-context recall: keys and values of several tokens (mad-lab
    ``configs/tasks/fuzzy-in-context-recall.yml``: vocab_size 16, seq_len 128, motifs of up to 3
    tokens, 12,800 training examples, multi_query)."""

    kind: Literal["mad-fuzzy-recall"] = "mad-fuzzy-recall"
    k_motif_size: int = Field(3, ge=1, description="most tokens of a key; test keys have this many (MADConfig)")
    v_motif_size: int = Field(3, ge=1, description="most tokens of a value (MADConfig.v_motif_size)")

    def special_tokens(self) -> tuple[str, ...]:
        return ("<left-pad>",) if self.multi_query else ("<left-pad>", "<copy>")

    @model_validator(mode="after")
    def _check_motifs(self) -> FuzzyRecallOptions:
        self._check_vocabulary(self.k_motif_size, self.v_motif_size)
        least = 2 * (self.k_motif_size + self.v_motif_size) + 1
        if self.seq_len < least:
            raise ValueError(
                f"seq_len={self.seq_len} cannot hold the probe pair twice (up to k_motif_size + v_motif_size = "
                f"{self.k_motif_size + self.v_motif_size} tokens each); use seq_len >= {least}"
            )
        return self

    def build(self) -> MADTask:
        draw = functools.partial(
            fuzzy_recall_instance,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            k_motif_size=self.k_motif_size,
            v_motif_size=self.v_motif_size,
            multi_query=self.multi_query,
            noise_vocab_size=self.noise_vocab_size,
            frac_noise=self.frac_noise,
        )
        keys_n = self.content() // 2
        answers = range(keys_n, self.content())
        return MADTask(
            self,
            draw,
            length=self.seq_len,
            answers=answers,
            roles=self.roles(),
        )


class SelectiveCopyingOptions(MADOptions):
    """Selective copying (mad-lab ``configs/tasks/selective-copying.yml``: vocab_size 16, seq_len
    256, 16 tokens to copy, 12,800 training examples)."""

    kind: Literal["mad-selective-copying"] = "mad-selective-copying"
    seq_len: int = Field(256, ge=4, le=MAX_LENGTH, description=SEQ_LEN)
    num_tokens_to_copy: int = Field(16, ge=1, description="tokens to copy (MADConfig.num_tokens_to_copy)")

    @model_validator(mode="after")
    def _check_length(self) -> SelectiveCopyingOptions:
        least = 2 * self.num_tokens_to_copy + 2
        if self.seq_len < least:
            raise ValueError(
                f"seq_len={self.seq_len} cannot hold num_tokens_to_copy={self.num_tokens_to_copy} tokens, a blank, "
                f"the copy token and the {self.num_tokens_to_copy} answers; use seq_len >= {least} or copy "
                f"{max(1, (self.seq_len - 2) // 2)} tokens or fewer"
            )
        return self

    def build(self) -> MADTask:
        draw = functools.partial(
            selective_copying_instance,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            num_tokens_to_copy=self.num_tokens_to_copy,
        )
        roles = ((self.vocab_size - 2, "t"), (self.vocab_size - 1, "<blank>"), (self.vocab_size, "<copy>"))
        return MADTask(
            self, lambda rng, training: draw(rng), length=self.seq_len, answers=range(self.vocab_size - 2), roles=roles
        )


class CompressionOptions(MADOptions):
    """Compression (mad-lab ``configs/tasks/compression.yml``: vocab_size 16, seq_len 32, 12,800
    training examples). The model takes MAD's decoder as its head (:class:`CompressionDecoder`)."""

    kind: Literal["mad-compression"] = "mad-compression"
    seq_len: int = Field(32, ge=2, le=MAX_LENGTH, description=SEQ_LEN)

    def build(self) -> MADTask:
        draw = functools.partial(compression_instance, vocab_size=self.vocab_size, seq_len=self.seq_len)
        roles = ((self.vocab_size - 1, "t"), (self.vocab_size, "<compress>"))
        return CompressionTask(
            self, lambda rng, training: draw(rng), length=self.seq_len, answers=range(self.vocab_size), roles=roles
        )


class MemorizationOptions(MADOptions):
    """Memorization of one fixed key-value table (mad-lab ``configs/tasks/memorization.yml``:
    vocab_size 256, seq_len 32, 256 training examples).

    The table is drawn once from ``seed`` and is the same in both splits, as in MAD: the test
    split asks the facts the training split taught, in other sequences (no test row's keys, in
    order, equal a training row's). With ``(vocab_size - 1) // 2`` keys and ``seq_len / 2`` keys
    a row, a key may never come up in training (at vocab_size 8192 and MAD's 256 rows, about
    37% of the keys do not); MAD asks those too, and so does this task."""

    kind: Literal["mad-memorization"] = "mad-memorization"
    vocab_size: int = Field(256, ge=3, le=MAX_VOCAB - FIRST_TOKEN, description=VOCAB)
    seq_len: int = Field(32, ge=2, le=MAX_LENGTH, description=SEQ_LEN)
    num_train_examples: int = Field(256, ge=1, le=MAX_EXAMPLES, description=TRAIN)

    @model_validator(mode="after")
    def _check_pairs(self) -> MemorizationOptions:
        if self.seq_len % 2:
            raise ValueError(
                f"seq_len={self.seq_len}: a memorization sequence is pairs of key and insert token; use an even "
                f"seq_len, such as {self.seq_len + 1}"
            )
        return self

    def table(self) -> np.ndarray:
        """The value of each key, drawn from ``seed`` alone: the same for every split."""
        return memorization_table(
            np.random.default_rng([self.seed, 2]), self.vocab_size
        )  # the splits draw from 0 and 1

    def build(self) -> MADTask:
        table = self.table()
        draw = functools.partial(
            memorization_instance, table=table, insert_token=self.vocab_size - 1, seq_len=self.seq_len
        )
        roles = ((len(table), "k"), (self.vocab_size - 1, "v"), (self.vocab_size, "<insert>"))
        answers = range(len(table), self.vocab_size - 1)
        return MADTask(self, lambda rng, training: draw(rng), length=self.seq_len, answers=answers, roles=roles)


# ---- tasks ------------------------------------------------------------------------------------


class MADTask(AnswerTask):
    """A MAD task's rows, drawn example by example from its generator."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __init__(
        self,
        options: MADOptions,
        draw: Callable[..., tuple[np.ndarray, np.ndarray]],
        *,
        length: int,
        answers: range,
        roles: Roles,
    ) -> None:
        """``draw(rng, training=)``: one example's tokens and targets (IGNORE where nothing is
        asked), ``length`` tokens each; ``answers``: the tokens a test answer can be; ``roles``:
        what each token is, for labels."""
        self.options = options
        self.draw = draw
        self.length = length
        self.roles = roles
        self.vocab_size = FIRST_TOKEN + options.vocab_size
        self.answer_ids = tuple(FIRST_TOKEN + t for t in answers)

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "max_len", self.length) < self.length:
            return (
                f"the model's max_len={config.max_len} is shorter than the task's {self.length}-token rows "
                f"(seq_len={self.options.seq_len}); raise max_len or lower seq_len"
            )
        return None

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        self._check_split(split)
        o = self.options
        rng = np.random.default_rng([o.seed, self.splits.index(split)])
        size = o.num_train_examples if split == "train" else o.num_test_examples
        taken = set() if split == "train" else set(map(tuple, self.dataset("train")["ids"]))
        rows: dict[str, list[list[int]]] = {"ids": [], "answers": []}
        for _ in range(10 * size + 100):
            tokens, targets = self.draw(rng, training=split == "train")
            ids = (tokens + FIRST_TOKEN).tolist()
            if tuple(ids) in taken:
                continue
            rows["ids"].append(ids)
            rows["answers"].append(np.where(targets == IGNORE, PAD, targets + FIRST_TOKEN).tolist())
            if len(rows["ids"]) == size:
                return datasets.Dataset.from_dict(rows)
        raise ValueError(
            f"task {o.kind!r}: after {10 * size + 100} draws only {len(rows['ids'])} of num_test_examples="
            f"{size} test sequences differ from every training sequence; raise seq_len or vocab_size, or lower "
            "num_train_examples or num_test_examples"
        )

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.token_string(i) for i in ids]

    def token_string(self, id_: int) -> str:
        """``k3`` (key token 3), ``v9`` (value), ``n20`` (noise), ``t5`` (a token to copy or
        compress), or a special token's name, such as ``<copy>``; ``<pad>`` for the zoo's PAD."""
        token = id_ - FIRST_TOKEN
        for end, role in self.roles:
            if 0 <= token < end:
                return role if role.startswith("<") else f"{role}{token}"
        return "<pad>" if id_ == PAD else "?"


class CompressionTask(MADTask):
    """Compression: a model decodes the whole sequence from its last state, through MAD's
    decoder (the head :class:`MADCompressionDecoderOptions`) rather than the LM head."""

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return {**super().model_overrides(config), "head": {"kind": MADCompressionDecoderOptions().kind}}
