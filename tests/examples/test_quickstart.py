"""The quickstart runs, and every example config loads, builds and gives its documented shapes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.training.config import load_train_config

EXAMPLES = Path(__file__).parents[2] / "examples"
CONFIGS = EXAMPLES / "configs"
BATCH, SRC_LEN, TGT_LEN = 2, 7, 4

# Model configs: the architecture each describes and the logits shape its header comment documents.
MODEL_CONFIGS: dict[str, tuple[str, tuple[int, ...]]] = {
    "transformer-tiny.yaml": ("encoder-decoder", (BATCH, TGT_LEN, 1000)),
    "encoder-classifier.yaml": ("encoder-only", (BATCH, 10)),
    "decoder-only-lm.yaml": ("decoder-only", (BATCH, SRC_LEN, 1000)),
}
TRAIN_CONFIGS = ["train-reverse.yaml"]  # training configs: a model config under `model`, a task


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    """Logits of ``model`` on a random batch, called as its architecture is documented to be."""
    vocab = model.config.vocab_size
    src = torch.randint(3, vocab, (BATCH, SRC_LEN))
    tgt = torch.randint(3, vocab, (BATCH, TGT_LEN))
    with torch.no_grad():
        if model.architecture == "encoder-decoder":
            return model(src, tgt).logits
        mask = torch.ones(BATCH, SRC_LEN, dtype=torch.long)
        mask[0, -2:] = 0  # padding at the end of the first row
        if model.architecture == "encoder-only":
            return model(src, src_mask=mask).logits
        return model(src).logits


def test_quickstart_runs_and_saves(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "reloaded outputs identical: True" in result.stdout
    assert "greedy decode" in result.stdout
    saved = tmp_path / "transformer-tiny"
    assert (saved / "config.json").is_file() and (saved / "model.safetensors").is_file()
    reloaded = tz.from_pretrained(saved)
    assert reloaded.config.variant == "transformer-tiny" and reloaded.config.dropout == 0.0


def test_quickstart_runs_without_an_output_folder() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "reloaded outputs identical: True" in result.stdout


def test_every_example_config_is_checked() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(
        [*MODEL_CONFIGS, *TRAIN_CONFIGS, "train-sagan-gan.yaml"]
    )


def test_the_gan_training_config_is_the_papers_recipe() -> None:
    config = load_train_config(CONFIGS / "train-sagan-gan.yaml")
    assert config.task.kind == "digits-generation" and config.model == "sagan-gan"
    assert (config.lr, config.warmup_steps, config.schedule, config.grad_clip) == (4e-4, 0, "constant", None)
    d, g = tz.build_model(config.model).phases()
    assert config.lr * d.lr_scale == 4e-4 and config.lr * g.lr_scale == 1e-4


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_model_config_loads_builds_and_runs(name: str) -> None:
    architecture, shape = MODEL_CONFIGS[name]
    config = tz.load_config(CONFIGS / name)
    assert config.variant == "transformer-tiny"
    model = tz.build_model(config).eval()
    assert model.architecture == architecture
    logits = logits_of(model)
    assert logits.shape == shape
    assert torch.isfinite(logits).all()


def test_config_overrides_reach_the_model() -> None:
    tiny = tz.build_model(CONFIGS / "transformer-tiny.yaml")
    assert (len(tiny.encoder.layers), len(tiny.decoder.layers)) == (3, 2)
    lm = tz.load_config(CONFIGS / "decoder-only-lm.yaml")
    assert (lm.positional.kind, lm.norm.kind, lm.norm_placement, lm.ffn.kind) == ("rotary", "rmsnorm", "pre", "gated")
    classifier = tz.load_config(CONFIGS / "encoder-classifier.yaml")
    assert (classifier.head.num_classes, classifier.head.pooling) == (10, "mean")


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_train_config_loads_and_its_model_runs(name: str) -> None:
    config = load_train_config(CONFIGS / name)
    assert config.task.kind == "reverse"
    model = tz.build_model(config.model).eval()
    assert model.architecture == "encoder-decoder"
    assert logits_of(model).shape == (BATCH, TGT_LEN, model.config.vocab_size)
