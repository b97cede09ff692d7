"""A run folder records which plugin module provided each kind and variant it uses, so that
loading it where that plugin is missing names the plugin and how to load it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformer_zoo.registry import get_registry
from transformer_zoo.training import load_train_config, train

PLUGIN = '''
from typing import Literal

from transformer_zoo import hookimpl
from transformer_zoo.core.options import AttentionOptions


class RecordedAttention(AttentionOptions):
    """Full attention under a name of its own."""

    kind: Literal["recorded-sdpa"] = "recorded-sdpa"


@hookimpl
def tzoo_components():
    return [RecordedAttention]
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "zoo_recorded_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    yield "zoo_recorded_plugin", folder
    if get_registry().pm.has_plugin("zoo_recorded_plugin"):
        get_registry().unregister("zoo_recorded_plugin")


def _evaluate(run_dir, *extra, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TZOO_PLUGINS", "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "transformer_zoo", *extra, "evaluate", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a_run_names_the_plugin_it_needs_where_that_plugin_is_missing(plugin_module, tmp_path):
    module, folder = plugin_module
    get_registry().register_module(module)
    config = load_train_config(
        {
            "model": {
                "variant": "transformer-tiny",
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
                "encoder": {"layers": 1, "attention": "recorded-sdpa"},
                "decoder": {"layers": 1},
            },
            "task": {
                "kind": "reverse",
                "train_size": 40,
                "test_size": 8,
                "train_lengths": [1, 4],
                "test_lengths": [5, 6],
            },
            "steps": 2,
            "batch_size": 4,
        }
    )
    run_dir = tmp_path / "run"
    train(config, run_dir, progress=False)
    record = json.loads((run_dir / "plugins.json").read_text())
    assert record["attention:recorded-sdpa"] == module
    assert record["variant:transformer-tiny"] == "transformer_zoo.plugins.transformer"
    assert record["task:reverse"] == "transformer_zoo.plugins.tasks"

    missing = _evaluate(run_dir)  # another machine: the plugin is not installed
    assert missing.returncode == 2, missing.stderr
    message = " ".join(missing.stderr.split())
    assert "unknown attention kind 'recorded-sdpa'" in message
    assert f"provided by plugin module '{module}' when this run was saved" in message
    assert f"--plugin {module}" in message and f"TZOO_PLUGINS={module}" in message

    found = _evaluate(run_dir, "--plugin", module, pythonpath=folder)  # as the message says
    assert found.returncode == 0, found.stderr


def test_a_run_saved_before_the_record_still_loads_and_errors_are_unchanged(tmp_path):
    from transformer_zoo.training import evaluate_run
    from transformer_zoo.training.run_folder import read_plugins

    config = load_train_config(
        {
            "model": {
                "variant": "transformer-tiny",
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
                "encoder": {"layers": 1},
                "decoder": {"layers": 1},
            },
            "task": {
                "kind": "reverse",
                "train_size": 40,
                "test_size": 8,
                "train_lengths": [1, 4],
                "test_lengths": [5, 6],
            },
            "steps": 2,
            "batch_size": 4,
        }
    )
    run_dir = tmp_path / "run"
    train(config, run_dir, progress=False)
    (run_dir / "plugins.json").unlink()
    assert read_plugins(run_dir) is None
    assert set(evaluate_run(run_dir)) == {"test", "test_long"}
    (run_dir / "plugins.json").write_text("not json")
    assert read_plugins(run_dir) is None
