"""Checkpoints written by an earlier release load unchanged and compute what they computed then."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz

ROOT = Path(__file__).parent.parent / "data" / "checkpoints"
FOLDERS = sorted(path.name for path in ROOT.iterdir() if (path / "config.json").is_file())


def test_the_old_checkpoints_are_all_here():
    assert FOLDERS == ["bert-tiny", "image-transformer-tiny", "local-global-encoder-tiny", "transformer-dmca-tiny",
                       "transformer-tiny", "universal-transformer-tiny"]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_checkpoint_saved_before_the_kernel_change_loads_and_gives_the_same_logits(name):
    model = tz.from_pretrained(ROOT / name)  # strict: a renamed or missing key raises
    saved = safetensors.torch.load_file(str(ROOT / name / "io.safetensors"))
    expected = saved.pop("logits")
    with torch.no_grad():
        logits = model(**saved).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
