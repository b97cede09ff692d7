"""Every run tracked: scalars.csv always, TensorBoard event files, and trackers from plugins."""

from __future__ import annotations

import csv
from collections import defaultdict

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer_zoo.core.errors import PluginLoadError
from transformer_zoo.registry import get_registry, hookimpl
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

MODEL = {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64}
TASK = {"kind": "reverse", "train_size": 300, "test_size": 20, "train_lengths": [1, 6], "test_lengths": [7, 8]}
TRAIN_SCALARS = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second"}


def config(**overrides):
    return load_train_config(
        {"model": MODEL, "task": TASK, "steps": 12, "batch_size": 8, "log_every": 2, "eval_every": 6, **overrides}
    )


def csv_steps(run_dir) -> dict[str, list[int]]:
    steps = defaultdict(list)
    with (run_dir / "scalars.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            steps[row["name"]].append(int(row["step"]))
    return steps


def event_steps(run_dir) -> dict[str, list[int]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_run_writes_its_curves_as_csv_and_tensorboard_events(tmp_path):
    summary = train(config(), tmp_path, progress=False)
    logged = [2, 4, 6, 8, 10, 12]
    for steps in (csv_steps(tmp_path), event_steps(tmp_path)):
        assert all(steps[name] == logged for name in TRAIN_SCALARS), steps
        assert steps["test/token_accuracy"] == [6, 12]  # evaluated mid-way, and the final score
        assert steps["test_long/sequence_accuracy"] == [12]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Scalars("train/loss")[-1].value == pytest.approx(
        [p for p in summary["history"] if "loss" in p][-1]["loss"]
    )
    assert events.Scalars("test/token_accuracy")[-1].value == pytest.approx(
        summary["metrics"]["test"]["token_accuracy"]
    )
    assert all(point["grad_norm"] > 0 for point in summary["history"] if "loss" in point)


def test_a_resumed_run_drops_what_an_attempt_logged_after_its_checkpoint(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    train(config(), tmp_path, progress=False, stop_after=8)
    with (tmp_path / "scalars.csv").open("a", newline="") as f:  # an attempt that logged on, then died unsaved
        csv.writer(f).writerows([[10, "train/loss", 99.0], [10, "train/lr", 0.5]])
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("train/loss", 99.0, 10)
    train(config(), tmp_path, progress=False)
    for steps in (csv_steps(tmp_path), event_steps(tmp_path)):
        assert steps["train/loss"] == [2, 4, 6, 8, 10, 12], "each step once, the dead attempt's gone"
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert all(e.value != 99.0 for e in events.Scalars("train/loss"))


class Recorder:
    """A tracker plugin, as a Weights & Biases or MLflow one would be."""

    def __init__(self) -> None:
        self.runs, self.logged, self.finished = [], [], []

    @hookimpl
    def tzoo_tracker(self, run):
        self.runs.append(run)
        return self

    def log(self, step, scalars):
        self.logged.append((step, scalars))

    def finish(self, scores):
        self.finished.append(scores)


def test_a_plugin_tracks_runs_through_the_hook(tmp_path):
    recorder, registry = Recorder(), get_registry()
    registry.register(recorder, "recorder")
    try:
        summary = train(config(), tmp_path / "run", progress=False, name="reverse/tiny/seed0", tags={"seed": "0"})
    finally:
        registry.unregister("recorder")
    (run,) = recorder.runs
    assert run.name == "reverse/tiny/seed0" and run.tags == {"seed": "0"} and run.resumed_from == 0
    assert run.config["steps"] == 12 and run.run_dir == tmp_path / "run"
    assert [step for step, scalars in recorder.logged if "train/loss" in scalars] == [2, 4, 6, 8, 10, 12]
    assert recorder.finished == [summary["metrics"]]


def test_a_tracker_hook_that_returns_no_tracker_is_named(tmp_path):
    class Broken:
        @hookimpl
        def tzoo_tracker(self, run):
            return "wandb"

    registry = get_registry()
    registry.register(Broken(), "broken")
    try:
        with pytest.raises(PluginLoadError, match="tzoo_tracker returned 'wandb'"):
            train(config(steps=2), tmp_path, progress=False)
    finally:
        registry.unregister("broken")


def test_the_documented_mlflow_tracker_tracks_a_run(tmp_path, monkeypatch):
    """docs/writing-a-plugin.md's MLflow plugin, against a stand-in ``mlflow`` that records calls."""
    import re
    import sys
    import types
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "writing-a-plugin.md").read_text()
    code = re.search(r"## A tracker.*?```python\n(.*?)```", text, re.S)[1]
    calls = []
    mlflow = types.ModuleType("mlflow")
    for name in ("set_experiment", "start_run", "log_params", "log_metrics", "end_run"):
        setattr(mlflow, name, lambda *args, _name=name, **kwargs: calls.append((_name, args, kwargs)))
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    (tmp_path / "tzoo_mlflow.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = get_registry()
    registry.register_module("tzoo_mlflow")
    try:
        summary = train(config(), tmp_path / "run", progress=False, name="reverse/tiny/seed0", tags={"task": "reverse"})
    finally:
        registry.unregister("tzoo_mlflow")
        sys.modules.pop("tzoo_mlflow", None)
    names = [name for name, _, _ in calls]
    assert names[:3] == ["set_experiment", "start_run", "log_params"] and names[-1] == "end_run"
    assert calls[1][2] == {"run_name": "reverse/tiny/seed0", "tags": {"task": "reverse"}}
    steps = [kwargs["step"] for name, args, kwargs in calls if name == "log_metrics" and "train.loss" in args[0]]
    assert steps == [2, 4, 6, 8, 10, 12]
    final = [args[0] for name, args, kwargs in calls if name == "log_metrics" and "step" not in kwargs]
    assert final[0] == {f"test.{k}": v for k, v in summary["metrics"]["test"].items()}
    assert calls[-1][2] == {"status": "FINISHED"}
