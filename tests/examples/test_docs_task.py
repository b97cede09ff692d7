"""The task plugin written out in docs/tasks.md works as printed: it registers, and trains."""

from __future__ import annotations

import re
import types
from pathlib import Path

from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

DOC = Path(__file__).parents[2] / "docs" / "tasks.md"


def test_the_documented_task_plugin_registers_and_trains(tmp_path):
    (code,) = re.findall(r"```python\n(# my_tasks/plugin.py\n.*?)```", DOC.read_text(), re.S)
    module = types.ModuleType("my_tasks_plugin")
    exec(compile(code, str(DOC), "exec", dont_inherit=True), module.__dict__)  # as its own file would run
    name = get_registry().register(module, "my-tasks")
    try:
        task = get_registry().component("task", "by-frequency")(train_size=50).build()
        row = task.dataset("test")[0]
        counts = {s: row["src"].count(s) for s in row["tgt"]}
        assert sorted(set(row["src"])) == sorted(row["tgt"])
        assert all(counts[a] >= counts[b] for a, b in zip(row["tgt"], row["tgt"][1:]))
        config = load_train_config(
            {
                "model": {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64},
                "task": {"kind": "by-frequency", "train_size": 50},
                "steps": 2,
                "batch_size": 4,
            }
        )
        summary = train(config, tmp_path, progress=False)
        assert set(summary["metrics"]["test"]) == {"token_accuracy", "sequence_accuracy"}
    finally:
        get_registry().unregister(name)
