"""The task interface: data as ``datasets.Dataset`` splits, what a model needs, how it is scored.

A task says which model outputs it needs (``objective``) and which config values it fixes
(``model_overrides``: vocabulary size, head); a variant that cannot serve the objective is
refused with a reason before any training starts.
"""

from __future__ import annotations

from typing import Any, ClassVar

import datasets
import torch
from torch import Tensor, nn

from .decoding import greedy_decode

PAD, BOS, EOS = 0, 1, 2
CLS = BOS  # classification tasks start each sequence with this id; the head pools it


def pad_batch(rows: list[list[int]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """Right-pad ``rows`` to ``(B, T)`` ids and a ``(B, T)`` mask, 1 for real tokens."""
    length = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


class Task:
    """Base of every task.

    Attributes:
        objective: what the model must produce: ``seq2seq``, ``sequence-classification``, ...
        metric: the name of the headline metric in :meth:`evaluate`'s result (higher is better).
    """

    objective: ClassVar[str] = ""
    metric: ClassVar[str] = ""

    def dataset(self, split: str) -> datasets.Dataset:
        raise NotImplementedError

    @property
    def splits(self) -> tuple[str, ...]:
        raise NotImplementedError

    def model_overrides(self) -> dict[str, Any]:
        """Config values the task fixes in any model trained on it (vocabulary, head).

        Applied after :meth:`unfit_reason` accepted the config.
        """
        return {}

    def unfit_reason(self, config: Any) -> str | None:
        """Why a model config cannot do this task, or None if it can."""
        return None

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        """A batch of examples to model inputs and ``targets``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        inputs = {k: v for k, v in batch.items() if k != "targets"}
        return model.loss(model(**inputs), batch["targets"])

    def tokens_in(self, batch: dict[str, Tensor]) -> int:
        """Tokens the model reads for one batch (throughput)."""
        return int(sum(v.numel() for k, v in batch.items() if k in ("src", "tgt")))

    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        raise NotImplementedError


class Seq2SeqTask(Task):
    """Source sequence in, target sequence out; scored by greedy decoding.

    Examples are ``{"src": [...], "tgt": [...]}`` of symbol ids; :data:`PAD`, :data:`BOS`
    and :data:`EOS` are reserved.
    """

    objective: ClassVar[str] = "seq2seq"
    metric: ClassVar[str] = "token_accuracy"
    vocab_size: int = 0

    def model_overrides(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "tgt_vocab_size": None, "pad_id": PAD, "head": {"kind": "lm"}}

    def unfit_reason(self, config: Any) -> str | None:
        if getattr(config, "encoder", None) is None or getattr(config, "decoder", None) is None:
            return "a seq2seq task needs an encoder-decoder model"
        return None

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        src, src_mask = pad_batch([r["src"] for r in rows])
        tgt, tgt_mask = pad_batch([[BOS, *r["tgt"]] for r in rows])
        targets, _ = pad_batch([[*r["tgt"], EOS] for r in rows])
        return {"src": src, "src_mask": src_mask, "tgt": tgt, "tgt_mask": tgt_mask, "targets": targets}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        """Greedy-decode every example: ``token_accuracy`` (target positions right) and
        ``sequence_accuracy`` (whole target right, ended by EOS)."""
        data = self.dataset(split)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        right_tokens = total_tokens = right_sequences = 0
        for start in range(0, len(data), batch_size):
            rows = data[start : start + batch_size]
            src, src_mask = pad_batch(rows["src"])
            longest = max(len(t) for t in rows["tgt"])
            out = greedy_decode(
                model, src.to(device), src_mask.to(device), bos_id=BOS, eos_id=EOS, pad_id=PAD,
                max_new_tokens=longest + 1,
            )[:, 1:].cpu()
            for predicted, target in zip(out.tolist(), rows["tgt"], strict=True):
                predicted = predicted + [PAD] * (len(target) + 1 - len(predicted))
                hits = sum(p == t for p, t in zip(predicted, target))
                right_tokens += hits
                total_tokens += len(target)
                right_sequences += hits == len(target) and predicted[len(target)] == EOS
        model.train(was_training)
        return {
            "token_accuracy": right_tokens / max(total_tokens, 1),
            "sequence_accuracy": right_sequences / max(len(data), 1),
        }


class ClassificationTask(Task):
    """Token sequence in, one of ``num_classes`` labels out; scored by accuracy.

    Examples are ``{"src": [...], "label": int}``; each source is prefixed with :data:`CLS`.
    An encoder-decoder model keeps its encoder only.
    """

    objective: ClassVar[str] = "sequence-classification"
    metric: ClassVar[str] = "accuracy"
    vocab_size: int = 0
    num_classes: int = 0

    def model_overrides(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "tgt_vocab_size": None,
            "pad_id": PAD,
            "decoder": None,
            "head": {"kind": "sequence-classification", "num_classes": self.num_classes, "pooling": "cls"},
        }

    def unfit_reason(self, config: Any) -> str | None:
        if getattr(config, "encoder", None) is None:
            return "a classification task needs a model with an encoder"
        return None

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        src, src_mask = pad_batch([[CLS, *r["src"]] for r in rows])
        return {"src": src, "src_mask": src_mask, "targets": torch.tensor([r["label"] for r in rows])}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 128) -> dict[str, float]:
        data = self.dataset(split)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        right = 0
        for start in range(0, len(data), batch_size):
            batch = self.collate([data[i] for i in range(start, min(start + batch_size, len(data)))])
            logits = model(batch["src"].to(device), src_mask=batch["src_mask"].to(device)).logits
            right += int((logits.argmax(-1).cpu() == batch["targets"]).sum())
        model.train(was_training)
        return {"accuracy": right / max(len(data), 1)}

    def majority_accuracy(self, split: str) -> float:
        """Accuracy of always answering the most common training label (the baseline to beat)."""
        labels = self.dataset("train")["label"]
        majority = max(set(labels), key=labels.count)
        test = self.dataset(split)["label"]
        return sum(label == majority for label in test) / max(len(test), 1)
