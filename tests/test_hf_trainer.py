"""A zoo model trains under Hugging Face's ``Trainer`` through the adapter docs/training.md
prints: the batch's keys are the forward's arguments, ``labels=`` gives ``out.loss``, and
``out[0]`` is that loss."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz

transformers = pytest.importorskip("transformers")  # test-only dependencies (the dev extra)
pytest.importorskip("accelerate")
DOC = Path(__file__).parents[1] / "docs" / "training.md"


def documented_adapter() -> type:
    (code,) = re.findall(r"```python\n(# for_trainer.py\n.*?)```", DOC.read_text(), re.S)
    module = types.ModuleType("for_trainer")
    exec(compile(code, str(DOC), "exec", dont_inherit=True), module.__dict__)
    return module.ForTrainer


def examples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Sequences of 8 ids whose label is whether the first id is 10 or more (learnable in a few steps)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 20, (n, 8), generator=generator)
    return [{"src": row, "labels": (row[0] >= 10).long()} for row in src]


def test_a_zoo_classifier_trains_with_the_transformers_trainer(tmp_path):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        decoder=None,
        vocab_size=20,
        d_model=32,
        n_heads=2,
        d_ff=64,
        dropout=0.0,
        head={"kind": "sequence-classification", "num_classes": 2},
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=60,
        per_device_train_batch_size=32,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=documented_adapter()(model), args=args, train_dataset=examples(512, 0), eval_dataset=examples(256, 1)
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and after < 0.25 * before, (before, after, losses)
    test = examples(256, 2)
    with torch.no_grad():
        logits = model.eval()(torch.stack([e["src"] for e in test])).logits
    accuracy = (logits.argmax(-1) == torch.stack([e["labels"] for e in test])).float().mean().item()
    assert accuracy >= 0.95, accuracy
