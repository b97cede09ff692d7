"""The examples run as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_quickstart_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "reloaded outputs identical: True" in result.stdout
    assert (tmp_path / "transformer-tiny" / "model.safetensors").is_file()


@pytest.mark.parametrize("path", sorted((EXAMPLES / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_load_and_run(path):
    if path.name.startswith("train-"):
        from transformer_zoo.train import load_train_config

        config = load_train_config(path)
        assert config.task.kind == "reverse"
        return
    model = tz.build_model(path).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 7))
    if model.architecture == "encoder-decoder":
        logits = model(ids, ids[:, :4]).logits
        assert logits.shape == (2, 4, model.config.vocab_size)
    elif model.config.head.kind == "sequence-classification":
        assert model(ids).logits.shape == (2, model.config.head.num_classes)
    else:
        assert model(ids).logits.shape == (2, 7, model.config.vocab_size)
