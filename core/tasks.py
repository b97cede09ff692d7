"""The task interface: data as ``datasets.Dataset`` splits, what a model needs, how it is scored.

A task declares what its batches offer a model (``inputs``: tokens, images or both), which
model outputs it needs (``objective``), and its scores with the way each is better
(``metrics``). For a model config it says why the model cannot do it (``unfit_reason``) and
which config values it fixes (``model_overrides``: vocabulary size, head, image size); a
variant that cannot do the task is refused with the reason before any training starts.
:class:`TaskOptions` is the base of task kinds' options; :class:`Phase` is one optimizer of a
training step, as a model's ``phases()`` gives them and a task's loss receives them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import torch
from pydantic import (
    Field,
)
from torch import Tensor, nn

from .decoding import beam_search, greedy_decode
from .embedding import BOS, CLS, EOS, PAD
from .validation import (
    ComponentField,
    ComponentOptions,
)

if TYPE_CHECKING:
    import datasets


Better = Literal["higher", "lower"]
"""Which way a metric is better."""


def model_reads(config: Any) -> str:
    """What a model config's forward reads: its ``inputs`` (``"tokens"``, or ``"image"`` for an image model)."""
    return getattr(config, "inputs", "tokens")


def objective_reason(config: Any, objective: str) -> str | None:
    """Why a model made for one objective (an image model's ``objective``) cannot train for
    ``objective``; None when it is made for it, or says nothing of what it is for."""
    made_for = getattr(config, "objective", objective)
    return None if made_for == objective else f"the model is for {made_for}, and this task is {objective}"


def _quoted(keys: Any) -> str:
    return ", ".join(repr(key) for key in keys)


def _input_words(kind: str) -> str:
    return "images" if kind == "image" else kind


def pad_batch(rows: list[list[int]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """Right-pad ``rows`` to ``(B, T)`` ids and a ``(B, T)`` mask, 1 for real tokens."""
    length = max(1, max(len(r) for r in rows))
    ids = torch.tensor([[*row, *[pad] * (length - len(row))] for row in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in rows], dtype=torch.long)
    return ids, mask


class Task:
    """Base of every task.

    Attributes:
        inputs: what a batch offers a model: ``"tokens"`` (ids and masks: ``src``, ``tgt``),
            ``"image"`` (``(B, C, H, W)`` under ``image``), or both; a model reads one of them
            (its config's ``inputs``).
        objective: what the model must produce: ``seq2seq``, ``sequence-classification``, ...
        metrics: every score :meth:`evaluate` returns, with the way it is better (``"higher"``
            or ``"lower"``); the first is the headline (:attr:`metric`).
        bounds: the range ``(low, high)`` of each metric whose values cannot leave one (an
            accuracy ``(0.0, 1.0)``, BLEU ``(0.0, 100.0)``): comparisons keep its intervals inside
            it. A metric not named here is unbounded.
    """

    inputs: ClassVar[frozenset[str]] = frozenset({"tokens"})
    objective: ClassVar[str] = ""
    metrics: ClassVar[dict[str, Better]] = {}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {}
    baseline: ClassVar[str] = "Majority-class baseline"  # what :meth:`baselines` scores, for reports
    options: Any = None

    @property
    def name(self) -> str:
        """The task's name: its options' ``id``, or else its kind, as named in configs."""
        return getattr(self.options, "id", None) or getattr(self.options, "kind", type(self).__name__)

    @property
    def metric(self) -> str:
        """The headline metric: the first of :attr:`metrics`."""
        return next(iter(self.metrics), "")

    def dataset(self, split: str) -> datasets.Dataset:
        raise NotImplementedError

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {split!r}; splits: {', '.join(self.splits)}")

    @property
    def splits(self) -> tuple[str, ...]:
        raise NotImplementedError

    def unfit_reason(self, config: Any) -> str | None:
        """Why a model config cannot do this task, or None if it can.

        The base refuses a model that reads none of the task's :attr:`inputs`; a task adds what
        it needs of a model that reads each input it offers (a subclass calls this first)."""
        reads = model_reads(config)
        if reads not in self.inputs:
            offered = " and ".join(_input_words(kind) for kind in sorted(self.inputs))
            return f"the model reads {_input_words(reads)}, and this task has none (it offers {offered})"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        """Config values the task fixes in ``config`` (vocabulary and head for a token model;
        image size, channels and classes for an image model).

        Applied after :meth:`unfit_reason` accepted the config.
        """
        return {}

    def model_inputs(self, model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The part of a batch the model's forward reads: the image for an image model, the
        token ids and masks otherwise."""
        config = getattr(model, "config", None)
        kind = model_reads(config)
        if kind != "tokens":  # any other input kind is one batch key of its name (image, audio, ...)
            if kind not in batch:
                raise ValueError(
                    f"variant {config.variant!r} reads {_input_words(kind)}, and task {self.name!r} has "
                    "none; train it on a task that offers them"
                )
            return {kind: batch[kind]}
        return {k: v for k, v in batch.items() if k != "targets" and k not in self.inputs}

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        """A batch of examples to model inputs and ``targets``."""
        raise NotImplementedError

    def check_rows(self, rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> None:
        """Raise a ValueError, naming the task, the keys ``collate`` reads and those a row has, if
        a row of ``rows`` lacks one of ``keys``: a wrong column name is reported at the first
        batch, rather than as a ``KeyError`` from inside ``collate``."""
        for row in rows:
            missing = [key for key in keys if key not in row]
            if missing:
                raise ValueError(
                    f"task {self.name!r} ({type(self).__qualname__} in {type(self).__module__}) has rows with the "
                    f"keys {_quoted(row) or 'none'}, and its collate reads {_quoted(keys)} (missing: "
                    f"{_quoted(missing)}); give the rows of dataset(split) those keys, or override collate"
                )

    def loss(self, model: nn.Module, batch: dict[str, Tensor], phase: str = "model") -> Tensor:
        """The loss of one batch, for the model's training ``phase`` (see
        :meth:`~transformer_zoo.core.model.ZooModel.phases`; most models have one)."""
        if "targets" not in batch:
            raise ValueError(
                f"task {self.name!r} ({type(self).__qualname__}): collate returned a batch with the keys "
                f"{_quoted(batch) or 'none'}, and the loss reads 'targets'; return the targets under that key"
            )
        return model.loss(model(**self.model_inputs(model, batch)), batch["targets"])

    def tokens_in(self, batch: dict[str, Tensor]) -> int:
        """Tokens the model reads for one batch (throughput)."""
        return int(sum(v.numel() for k, v in batch.items() if k in ("src", "tgt")))

    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        raise NotImplementedError

    def baselines(self, split: str) -> dict[str, float]:
        """Scores on ``split`` of a reference predictor (by default, the majority class; see
        :attr:`baseline`), for reports to compare against."""
        return {}

    def plot_samples(self, model: nn.Module, path: Path) -> Path | None:
        """Draw what a trained model generates into ``path`` (PNG) and return it; None for a task
        that generates nothing to look at."""
        return None

    def save_assets(self, directory: Path) -> None:
        """Write what the task derived from its data (a trained tokenizer) into a run folder,
        so the run can be read back even if the data changes; see ``TaskOptions.with_assets``."""

    def parse_input(self, text: str) -> dict[str, Any]:
        """One example (a dataset row without its answer) from text a user typed."""
        raise ValueError(f"task {self.name!r} does not read typed input; pick an example with --example SPLIT:INDEX")

    def token_strings(self, ids: list[int]) -> list[str]:
        """A readable label for each token id (axis labels of attention maps)."""
        return [str(i) for i in ids]

    def example_inputs(self, model: nn.Module, row: dict[str, Any]) -> dict[str, Tensor]:
        """The model inputs for one example, as its forward pass takes them (batch of one).

        A task whose model writes an output (seq2seq) decodes it first, so the decoder's
        attention can be looked at too.
        """
        device = next(model.parameters()).device
        return {k: v.to(device) for k, v in self.model_inputs(model, self.collate([row])).items()}


class Seq2SeqTask(Task):
    """Source sequence in, target sequence out; scored by greedy decoding.

    Examples are ``{"src": [...], "tgt": [...]}`` of symbol ids; :data:`PAD`, :data:`BOS`
    and :data:`EOS` are reserved.
    """

    objective: ClassVar[str] = "seq2seq"
    metrics: ClassVar[dict[str, Better]] = {"token_accuracy": "higher", "sequence_accuracy": "higher"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"token_accuracy": (0.0, 1.0), "sequence_accuracy": (0.0, 1.0)}
    vocab_size: int = 0
    pad_id, bos_id, eos_id = PAD, BOS, EOS
    beam_size: int = 1  # 1: greedy decoding when scoring

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "encoder", None) is None or getattr(config, "decoder", None) is None:
            return "a seq2seq task needs an encoder-decoder model"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "tgt_vocab_size": None, "pad_id": self.pad_id, "head": {"kind": "lm"}}

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        self.check_rows(rows, ("src", "tgt"))
        src, src_mask = pad_batch([r["src"] for r in rows], self.pad_id)
        tgt, tgt_mask = pad_batch([[self.bos_id, *r["tgt"]] for r in rows], self.pad_id)
        targets, _ = pad_batch([[*r["tgt"], self.eos_id] for r in rows], self.pad_id)
        return {"src": src, "src_mask": src_mask, "tgt": tgt, "tgt_mask": tgt_mask, "targets": targets}

    def decode(self, model: nn.Module, src: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """The model's output for each source, up to (not including) EOS: greedy, or beam search
        when ``beam_size`` > 1; both on the key/value cache."""
        device = next(model.parameters()).device
        ids, mask = (t.to(device) for t in pad_batch(src, self.pad_id))
        special = {
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "max_new_tokens": max_new_tokens,
        }
        if self.beam_size > 1:
            out, _ = beam_search(model, ids, mask, beam_size=self.beam_size, **special)
        else:
            out = greedy_decode(model, ids, mask, **special)
        outputs = []
        for row in out[:, 1:].tolist():
            outputs.append(row[: row.index(self.eos_id)] if self.eos_id in row else row)
        return outputs

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        """Decode every example: ``token_accuracy`` (target positions right) and
        ``sequence_accuracy`` (the whole output equals the target), with :meth:`extra_scores`."""
        data = self.dataset(split)
        self.check_rows([data[0]] if len(data) else [], ("src", "tgt"))
        was_training = model.training
        model.eval()
        outputs: list[list[int]] = []
        for start in range(0, len(data), batch_size):
            rows = data[start : start + batch_size]
            outputs += self.decode(model, rows["src"], max_new_tokens=self.output_budget(rows))
        model.train(was_training)
        targets = data["tgt"]
        right_tokens = sum(p == t for predicted, target in zip(outputs, targets) for p, t in zip(predicted, target))
        return {
            **self.extra_scores(data, outputs),
            "token_accuracy": right_tokens / max(sum(len(t) for t in targets), 1),
            "sequence_accuracy": sum(p == t for p, t in zip(outputs, targets)) / max(len(targets), 1),
        }

    def output_budget(self, rows: dict[str, list]) -> int:
        """How many tokens to decode for a batch of examples: one more than the longest target,
        enough to write it and EOS (scores of exact outputs cannot gain from more)."""
        return max(len(t) for t in rows["tgt"]) + 1

    def extra_scores(self, data: datasets.Dataset, outputs: list[list[int]]) -> dict[str, float]:
        """Further scores of the decoded ``outputs`` (one per example of ``data``), such as BLEU."""
        return {}

    @torch.no_grad()
    def example_inputs(self, model: nn.Module, row: dict[str, Any]) -> dict[str, Tensor]:
        """The source and the model's own (greedy) output, so decoder attention shows what it wrote."""
        output = self.decode(model, [row["src"]], max_new_tokens=4 * len(row["src"]) + 8)[0]
        batch = self.collate([{"src": row["src"], "tgt": output}])
        device = next(model.parameters()).device
        return {k: v.to(device) for k, v in self.model_inputs(model, batch).items()}


class ClassificationTask(Task):
    """Token sequence in, one of ``num_classes`` labels out; scored by accuracy.

    Examples are ``{"src": [...], "label": int}``; each source is prefixed with ``cls_id``
    (:data:`CLS` unless a tokenizer names another) and padded with ``pad_id``. An
    encoder-decoder model keeps its encoder only.
    """

    objective: ClassVar[str] = "sequence-classification"
    metrics: ClassVar[dict[str, Better]] = {"accuracy": "higher"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"accuracy": (0.0, 1.0)}
    vocab_size: int = 0
    num_classes: int = 0
    pad_id, cls_id = PAD, CLS

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "encoder", None) is None:
            return "a classification task needs a model with an encoder"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "tgt_vocab_size": None,
            "pad_id": self.pad_id,
            "decoder": None,
            "head": {"kind": "sequence-classification", "num_classes": self.num_classes, "pooling": "cls"},
        }

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        self.check_rows(rows, ("src", "label"))
        src, src_mask = pad_batch([[self.cls_id, *r["src"]] for r in rows], self.pad_id)
        return {"src": src, "src_mask": src_mask, "targets": torch.tensor([r["label"] for r in rows])}

    def example_inputs(self, model: nn.Module, row: dict[str, Any]) -> dict[str, Tensor]:
        return super().example_inputs(model, {"label": -1, **row})  # typed input has no label

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        data = self.dataset(split)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        right = 0
        for start in range(0, len(data), batch_size):
            batch = self.collate([data[i] for i in range(start, min(start + batch_size, len(data)))])
            logits = model(**{k: v.to(device) for k, v in self.model_inputs(model, batch).items()}).logits
            right += int((logits.argmax(-1).cpu() == batch["targets"]).sum())
        model.train(was_training)
        return {"accuracy": right / max(len(data), 1)}

    def baselines(self, split: str) -> dict[str, float]:
        return {"accuracy": self.majority_accuracy(split)}

    def majority_accuracy(self, split: str) -> float:
        """Accuracy of always answering the most common training label (the baseline to beat)."""
        labels = self.dataset("train")["label"]
        majority = max(set(labels), key=labels.count)
        test = self.dataset(split)["label"]
        return sum(label == majority for label in test) / max(len(test), 1)


def mask_tokens(
    ids: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    pad_id: int = PAD,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masked-language-model corruption (Devlin et al. 2018, section 3.1).

    Each token that is not special is selected with ``probability``; a selected token becomes
    ``mask_id`` 80% of the time, a random ordinary token 10% of the time, and stays as it is
    10% of the time. The model must predict the original token at every selected position; a
    batch in which no token was drawn gets one, so that it has a loss.

    Args:
        ids: ``(B, T)`` token ids on the CPU (or on ``generator``'s device).
        special_ids: ids never selected and never drawn as replacements (padding, BOS, EOS,
            unknown); ``mask_id`` is never drawn either.
        vocab_size: replacements are drawn uniformly from ``[0, vocab_size)`` less those ids.

    Returns:
        ``(inputs, targets)``: the corrupted ids, and the original ids at selected positions
        with ``pad_id`` (ignored by the loss) everywhere else.
    """
    excluded = torch.tensor(sorted({*special_ids, mask_id}), dtype=ids.dtype, device=ids.device)
    candidates = ~torch.isin(ids, excluded)
    selected = (torch.rand(ids.shape, generator=generator, device=ids.device) < probability) & candidates
    if not selected.any() and candidates.any():  # a batch with nothing to predict would have no loss
        choice = torch.randint(int(candidates.sum()), (1,), generator=generator, device=ids.device)
        selected.view(-1)[candidates.view(-1).nonzero()[choice]] = True
    roll = torch.rand(ids.shape, generator=generator, device=ids.device)
    ordinary = torch.ones(vocab_size, dtype=torch.bool, device=ids.device)
    ordinary[excluded[excluded < vocab_size]] = False
    choices = ordinary.nonzero().squeeze(1)
    random_ids = choices[torch.randint(len(choices), ids.shape, generator=generator, device=ids.device)]
    inputs = ids.masked_fill(selected & (roll < 0.8), mask_id)
    inputs = torch.where(selected & (roll >= 0.9), ids, inputs)
    inputs = torch.where(selected & (roll >= 0.8) & (roll < 0.9), random_ids, inputs)
    targets = ids.masked_fill(~selected, pad_id)
    return inputs, targets


class LanguageModelTask(Task):
    """Predict each next token (a causal decoder); scored by perplexity.

    Examples are ``{"ids": [...]}``: the model reads ``ids[:-1]`` and predicts ``ids[1:]``.
    An encoder-decoder model keeps its decoder only.
    """

    objective: ClassVar[str] = "language-modeling"
    metrics: ClassVar[dict[str, Better]] = {"perplexity": "lower", "token_accuracy": "higher"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"token_accuracy": (0.0, 1.0)}
    vocab_size: int = 0
    pad_id: int = PAD

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "decoder", None) is None:
            return "a language-modelling task needs a causal decoder (an encoder-only model does masked LM: text-mlm)"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "tgt_vocab_size": None,
            "pad_id": self.pad_id,
            "encoder": None,
            "head": {"kind": "lm"},
        }

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        self.check_rows(rows, ("ids",))
        tgt, tgt_mask = pad_batch([r["ids"][:-1] for r in rows], self.pad_id)
        targets, _ = pad_batch([r["ids"][1:] for r in rows], self.pad_id)
        return {"tgt": tgt, "tgt_mask": tgt_mask, "targets": targets}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 32) -> dict[str, float]:
        """``perplexity``: exp of the mean next-token cross-entropy; ``token_accuracy``: share of
        next tokens that are the model's top guess."""
        return _token_scores(self, model, split, batch_size)


class MaskedLMTask(Task):
    """Recover tokens hidden by :func:`mask_tokens` (an encoder); scored by masked-token accuracy.

    Examples are ``{"ids": [...]}``, starting with the BOS token and ending with EOS (both never
    masked). Training batches are masked afresh each step; evaluation masks with a fixed seed,
    so every model is scored on the same positions. An encoder-decoder model keeps its encoder only.
    """

    objective: ClassVar[str] = "masked-lm"
    metrics: ClassVar[dict[str, Better]] = {"masked_accuracy": "higher", "perplexity": "lower"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"masked_accuracy": (0.0, 1.0)}
    vocab_size: int = 0
    pad_id, bos_id, eos_id, mask_id = PAD, BOS, EOS, 3
    special_ids: tuple[int, ...] = (PAD, BOS, EOS)
    mask_probability: float = 0.15

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "encoder", None) is None:
            return "a masked-LM task needs a bidirectional encoder (a decoder-only model does language-modeling)"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "tgt_vocab_size": None,
            "pad_id": self.pad_id,
            "decoder": None,
            "head": {"kind": "lm"},
        }

    def collate(self, rows: list[dict[str, Any]], generator: torch.Generator | None = None) -> dict[str, Tensor]:
        self.check_rows(rows, ("ids",))
        ids, mask = pad_batch([r["ids"] for r in rows], self.pad_id)
        src, targets = mask_tokens(
            ids,
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            special_ids=self.special_ids,
            pad_id=self.pad_id,
            probability=self.mask_probability,
            generator=generator,
        )
        return {"src": src, "src_mask": mask, "targets": targets}

    def example_inputs(self, model: nn.Module, row: dict[str, Any]) -> dict[str, Tensor]:
        device = next(model.parameters()).device
        batch = self.collate([row], generator=torch.Generator().manual_seed(0))
        return {k: v.to(device) for k, v in self.model_inputs(model, batch).items()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 32) -> dict[str, float]:
        """``masked_accuracy``: share of selected tokens recovered; ``perplexity`` over them."""
        scores = _token_scores(self, model, split, batch_size, generator=torch.Generator().manual_seed(0))
        return {"masked_accuracy": scores.pop("token_accuracy"), **scores}


class AnswerTask(Task):
    """A sequence in, an answer asked at some of its positions; scored by the answers right.

    The form of the synthetic suites (MQAR, the MAD tasks, the Chomsky hierarchy): examples are
    ``{"ids": [...], "answers": [...]}`` of one length, ``answers[t]`` the token the model must
    give at position ``t`` having read ``ids`` (up to ``t`` for a causal model), and ``pad_id``
    where nothing is asked. A model with a decoder reads ``ids`` causally, as a decoder-only LM
    (an encoder-decoder keeps its decoder); one with an encoder only reads them bidirectionally,
    with a token head over the vocabulary.
    """

    objective: ClassVar[str] = "answer-positions"
    metrics: ClassVar[dict[str, Better]] = {"accuracy": "higher", "sequence_accuracy": "higher"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"accuracy": (0.0, 1.0), "sequence_accuracy": (0.0, 1.0)}
    baseline: ClassVar[str] = "Chance (a uniform guess among the answers the task can ask)"
    vocab_size: int = 0
    pad_id: int = PAD
    answer_ids: tuple[int, ...] = ()
    """The ids an answer can take; chance accuracy is one over their number (:meth:`baselines`)."""
    causal: ClassVar[bool] = False
    """True: a language model's task, as its source defines it (MQAR): a model without a decoder is refused."""

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        if getattr(config, "decoder", None) is None:
            if self.causal:
                return f"{self.name} is read causally, as a language model reads it: it needs a model with a decoder"
            if getattr(config, "encoder", None) is None:
                return "an answer-positions task needs a decoder (read causally) or an encoder (read bidirectionally)"
        return None

    def model_overrides(self, config: Any) -> dict[str, Any]:
        stack = {"encoder": None} if getattr(config, "decoder", None) is not None else {"decoder": None}
        return {
            "vocab_size": self.vocab_size,
            "tgt_vocab_size": None,
            "pad_id": self.pad_id,
            **stack,
            "head": {"kind": "lm"},
        }

    def reads(self, model: nn.Module) -> str:
        """``"tgt"`` for a model with a decoder (causal), ``"src"`` for an encoder alone."""
        return "tgt" if getattr(getattr(model, "config", None), "decoder", None) is not None else "src"

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        self.check_rows(rows, ("ids", "answers"))
        ids, mask = pad_batch([r["ids"] for r in rows], self.pad_id)
        answers, _ = pad_batch([r["answers"] for r in rows], self.pad_id)
        return {"ids": ids, "mask": mask, "targets": answers}

    def model_inputs(self, model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        side = self.reads(model)
        return {side: batch["ids"], f"{side}_mask": batch["mask"]}

    def tokens_in(self, batch: dict[str, Tensor]) -> int:
        return int(batch["ids"].numel())

    @torch.no_grad()
    def predictions(self, model: nn.Module, rows: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
        """The model's answer at every position of ``rows``, and the answers asked (``pad_id``
        where none is): two ``(B, T)`` tensors on the CPU."""
        batch = self.collate(rows)
        device = next(model.parameters()).device
        logits = model(**{k: v.to(device) for k, v in self.model_inputs(model, batch).items()}).logits
        return logits.argmax(-1).cpu(), batch["targets"]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        """``accuracy``: the share of asked positions answered right (Zoology's MQAR accuracy);
        ``sequence_accuracy``: the share of examples with every answer right (of those that ask
        something)."""
        data = self.dataset(split)
        was_training = model.training
        model.eval()
        right = asked = whole = rows = 0
        for start in range(0, len(data), batch_size):
            predicted, answers = self.predictions(
                model, [data[i] for i in range(start, min(start + batch_size, len(data)))]
            )
            ask = answers != self.pad_id
            hits = (predicted == answers) & ask
            right += int(hits.sum())
            asked += int(ask.sum())
            rows += int((ask.sum(1) > 0).sum())  # an example that asks nothing is not scored
            whole += int(((hits.sum(1) == ask.sum(1)) & (ask.sum(1) > 0)).sum())
        model.train(was_training)
        return {"accuracy": right / max(asked, 1), "sequence_accuracy": whole / max(rows, 1)}

    def baselines(self, split: str) -> dict[str, float]:
        return {"accuracy": 1.0 / len(self.answer_ids)} if self.answer_ids else {}


def _token_scores(task: Task, model: nn.Module, split: str, batch_size: int, **collate: Any) -> dict[str, float]:
    """Perplexity and top-1 accuracy over the targets that are not padding."""
    data = task.dataset(split)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll = right = count = 0.0
    for start in range(0, len(data), batch_size):
        batch = task.collate([data[i] for i in range(start, min(start + batch_size, len(data)))], **collate)
        batch = {k: v.to(device) for k, v in batch.items()}
        targets = batch.pop("targets")
        logits = model(**batch).logits.float()
        keep = targets != task.pad_id
        nll += float(nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum"))
        right += float((logits[keep].argmax(-1) == targets[keep]).sum())
        count += float(keep.sum())
    model.train(was_training)
    count = max(count, 1.0)
    return {"perplexity": math.exp(min(nll / count, 50.0)), "token_accuracy": right / count}


@dataclass(frozen=True)
class Phase:
    """One optimizer of a training step: the parameters it updates and its own settings.

    Most models train all their parameters on one loss (one phase, ``model``). A GAN has two,
    each with its own optimizer, run in turn on every step: the discriminator, then the
    generator. The task's ``loss(model, batch, phase)`` gives each phase's loss.

    Attributes:
        name: passed to the task's loss, and used in checkpoints and learning curves.
        parameters: what this phase's optimizer updates; the others are frozen during its step.
        lr_scale: the phase's learning rate as a multiple of the run's ``lr``.
        betas: Adam's betas; None: the optimizer's defaults.
        weight_decay: None: the run's ``weight_decay``.
    """

    name: str
    parameters: tuple[nn.Parameter, ...]
    lr_scale: float = 1.0
    betas: tuple[float, float] | None = None
    weight_decay: float | None = None


class TaskOptions(ComponentOptions):
    """Task kinds. ``build()`` returns a :class:`~transformer_zoo.core.tasks.Task`: its data,
    what it needs from a model, and how it is scored."""

    category: ClassVar[str] = "task"
    default_kind: ClassVar[str] = "reverse"

    seed: int = Field(0, description="seed of the generated data and of its split")
    id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][\w.+-]*$",
        description="the task's name in a comparison (its tables, claims, task_train and file names) where it is not "
        "the kind: two tasks of one kind in a spec, such as two of MAD's difficulty settings, each need one; letters, "
        "digits and . _ + -",
    )

    @property
    def name(self) -> str:
        """The task's name in a comparison: its ``id``, or else its kind."""
        return self.id or self.kind

    def build(self, **context: Any) -> Any:
        raise NotImplementedError

    def with_assets(self, directory: Path) -> TaskOptions:
        """These options, reading what ``Task.save_assets`` wrote into ``directory`` (if anything)."""
        return self


TaskField = Annotated[TaskOptions, ComponentField("task")]
