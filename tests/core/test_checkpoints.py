"""Checkpoints written by an earlier release load unchanged and compute what they computed then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz

ROOT = Path(__file__).parent.parent / "data" / "checkpoints"
FOLDERS = sorted(path.name for path in ROOT.iterdir() if (path / "config.json").is_file())


def test_the_old_checkpoints_are_all_here():
    assert FOLDERS == [
        "bert-tiny",
        "image-transformer-tiny",
        "local-global-encoder-tiny",
        "transformer-dmca-tiny",
        "transformer-tiny",
        "universal-transformer-tiny",
    ]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_checkpoint_saved_before_the_kernel_change_loads_and_gives_the_same_logits(name):
    model = tz.from_pretrained(ROOT / name)  # strict: a missing or unexpected key raises
    saved = safetensors.torch.load_file(str(ROOT / name / "io.safetensors"))
    expected = saved.pop("logits")
    with torch.no_grad():
        logits = model(**saved).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_a_sagan_folder_with_scalar_gammas_is_refused_by_name(tmp_path):
    """SAGAN's gamma is one element; a folder holding it 0-d does not fit the model and is refused,
    naming the file, rather than loaded into a differently shaped parameter."""
    folder = tz.build_model("sagan-classifier-tiny").save_pretrained(tmp_path / "sagan")
    state = safetensors.torch.load_file(str(folder / "model.safetensors"))
    safetensors.torch.save_file(
        {k: v.reshape(()) if k.endswith(".gamma") else v for k, v in state.items()}, str(folder / "model.safetensors")
    )
    with pytest.raises(
        tz.ConfigError, match=r"(?s)model\.safetensors.*shape mismatch attention\.0\.gamma: file \[\], model \[1\]"
    ):
        tz.from_pretrained(folder)


def test_a_saved_config_names_its_format_and_a_newer_format_is_refused(tmp_path):
    from transformer_zoo.core.weights import FORMAT

    folder = tz.build_model("transformer-tiny").save_pretrained(tmp_path / "model")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["format"] == FORMAT == 2
    assert tz.from_pretrained(folder).config == tz.load_config(folder / "config.json")
    for newer, says in ((FORMAT + 1, "saved by a newer transformer-zoo"), ("1", "expected a positive integer")):
        (folder / "config.json").write_text(json.dumps({**saved, "format": newer}))
        with pytest.raises(tz.ConfigError, match=f"config.json.*format {newer!r}: {says}" if newer == "1" else says):
            tz.from_pretrained(folder)
    del saved["format"]  # a config written by hand: the current format
    (folder / "config.json").write_text(json.dumps(saved))
    assert tz.from_pretrained(folder).config.variant == "transformer-tiny"


def test_a_format_1_config_names_the_sparse_backend_kernel_and_is_upgraded(tmp_path):
    """Format 2 renamed the sparse and local 2-D kinds' ``kernel`` option to ``backend``; a
    format-1 config is upgraded when read, and a format-2 one with ``kernel`` is refused by name."""
    folder = tz.build_model(
        "local-global-encoder-tiny", encoder={"attention": {"kind": "local-global", "backend": "chunked"}}
    )
    folder = folder.save_pretrained(tmp_path / "model")
    saved = json.loads((folder / "config.json").read_text())
    attention = saved["encoder"]["attention"]
    old = {
        **saved,
        "format": 1,
        "encoder": {
            **saved["encoder"],
            "attention": {**{k: v for k, v in attention.items() if k != "backend"}, "kernel": "chunked"},
        },
    }
    (folder / "config.json").write_text(json.dumps(old))
    assert tz.from_pretrained(folder).config.encoder.attention.backend == "chunked"
    (folder / "config.json").write_text(json.dumps({**old, "format": 2}))
    with pytest.raises(tz.ConfigError, match="unknown key 'kernel'"):
        tz.from_pretrained(folder)
