"""Training: exact resume, a NaN stop that keeps the last good checkpoint, and real learning."""

from __future__ import annotations

import ast
import inspect
import json

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz
from transformer_zoo.cli import main
from transformer_zoo.core.tasks import Seq2SeqTask
from transformer_zoo.training import checkpointing as checkpointing_module
from transformer_zoo.training import interrupts as interrupts_module
from transformer_zoo.training import placement as placement_module
from transformer_zoo.training import step as step_module
from transformer_zoo.training import trainer as train_module
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.run_folder import CheckpointMismatch, CheckpointWarning
from transformer_zoo.training.trainer import Trainer, TrainingDiverged, evaluate_run, train

SMALL_MODEL = {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.1}
SMALL_TASK = {"kind": "reverse", "train_size": 300, "test_size": 20, "train_lengths": [1, 6], "test_lengths": [7, 8]}


def small_config(**overrides):
    return load_train_config({"model": SMALL_MODEL, "task": SMALL_TASK, "steps": 12, "batch_size": 8, **overrides})


def weights(run_dir):
    return safetensors.torch.load_file(str(run_dir / "checkpoint" / "model.safetensors"))


def test_resumed_run_ends_with_the_same_weights(tmp_path):
    config = small_config()
    train(config, tmp_path / "straight", progress=False)
    stopped = train(config, tmp_path / "resumed", progress=False, stop_after=5)
    assert stopped == {"step": 5, "stopped": True}
    train(config, tmp_path / "resumed", progress=False)
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resume must continue exactly where it stopped"
    train(config, tmp_path / "again", progress=False)
    fresh = weights(tmp_path / "again")
    assert all(torch.equal(a[k], fresh[k]) for k in a), "the same seed gives the same run"


def test_a_checkpoint_of_the_single_optimizer_layout_resumes_exactly(tmp_path):
    """Checkpoints written before models had phases hold {"optimizer", "scheduler"}."""
    config = small_config()
    train(config, tmp_path / "straight", progress=False)
    train(config, tmp_path / "old", progress=False, stop_after=5)
    path = tmp_path / "old" / "checkpoint" / "optimizer.pt"
    states = torch.load(path, weights_only=True)
    torch.save({"optimizer": states["optimizers"]["model"], "scheduler": states["schedulers"]["model"]}, path)
    without_digests(tmp_path / "old" / "checkpoint")  # written before checkpoints carried them, too
    with pytest.warns(CheckpointWarning, match="records no SHA-256 digests"):
        train(config, tmp_path / "old", progress=False)
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "old")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_of_other_phases_is_refused_with_a_way_out(tmp_path):
    config = small_config()
    train(config, tmp_path, progress=False, stop_after=2)
    path = tmp_path / "checkpoint" / "optimizer.pt"
    torch.save({"optimizers": {"generator": {}}, "schedulers": {"generator": {}}}, path)
    without_digests(tmp_path / "checkpoint")
    with (
        pytest.warns(CheckpointWarning),
        pytest.raises(
            CheckpointMismatch,
            match=r"optimizers for the phases \['generator'\], and the model trains in "
            r"\['model'\]; it was written for another model; resume it with the config it was trained with, "
            "or train into another --out",
        ),
    ):
        train(config, tmp_path, progress=False)


def without_digests(checkpoint):
    """The checkpoint as it was written before checkpoints recorded their files' digests."""
    state = json.loads((checkpoint / "state.json").read_text())
    del state["sha256"]
    (checkpoint / "state.json").write_text(json.dumps(state))


def test_a_task_written_before_phases_still_trains(tmp_path, monkeypatch):
    real_loss = Seq2SeqTask.loss
    monkeypatch.setattr(Seq2SeqTask, "loss", lambda self, model, batch: real_loss(self, model, batch))
    assert train(small_config(steps=2), tmp_path, progress=False)["step"] == 2


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_loss = Seq2SeqTask.loss

    def loss(self, model, batch):
        calls["n"] += 1
        value = real_loss(self, model, batch)
        return value * float("nan") if calls["n"] == 6 else value

    monkeypatch.setattr(Seq2SeqTask, "loss", loss)
    with pytest.raises(
        TrainingDiverged, match=f"at step 6; kept: the checkpoint of step 4 in {tmp_path / 'checkpoint'}"
    ):
        train(small_config(checkpoint_every=2), tmp_path, progress=False)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 4
    assert all(torch.isfinite(t).all() for t in weights(tmp_path).values())


def test_cli_train_and_evaluate(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"model": SMALL_MODEL, "task": SMALL_TASK, "steps": 3, "batch_size": 4}))
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--set", "steps=4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 4 and set(summary["metrics"]) == {"test", "test_long"}
    assert main(["evaluate", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == summary["metrics"]
    assert evaluate_run(tmp_path / "run") == summary["metrics"]
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "not a finished run folder" in capsys.readouterr().err


def test_a_variant_unfit_for_the_task_is_refused_before_training(tmp_path):
    config = load_train_config({"model": {**SMALL_MODEL, "decoder": None}, "task": SMALL_TASK, "steps": 2})
    with pytest.raises(ValueError, match="cannot do task 'reverse': a seq2seq task needs an encoder-decoder"):
        train(config, tmp_path, progress=False)


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        ("nope", tz.UnknownNameError, "model: unknown variant 'nope'"),
        ({}, tz.ConfigError, "model: a config needs a 'variant' key"),
        (
            {**SMALL_MODEL, "d_model": "wide"},
            tz.ConfigError,
            "(?s)model: invalid config .*d_model: Input should be a valid",
        ),
    ],
)
def test_a_bad_model_in_a_training_config_is_named_as_the_model(tmp_path, model, error, message):
    config = load_train_config({"model": model, "task": SMALL_TASK, "steps": 2})
    with pytest.raises(error, match=message):
        train(config, tmp_path, progress=False)


@pytest.mark.xdist_group("reverse")
def test_transformer_tiny_learns_to_reverse(reverse_run):
    """Train lengths 1-8, 250 steps of 64 at lr 3e-3: at least 95% token accuracy on held-out
    sequences of those lengths (100% measured with seeds 0 and 1; it was lengths 1-16 and 500 steps,
    2.6 times the time, before).

    The longer test_long split (9-12) is reported, not asserted: the original Transformer is
    known not to generalise in length, which is what the comparison shows. The run
    (conftest's ``REVERSE_RUN``) is trained once per session; the probes read it too.
    """
    run_dir, summary = reverse_run
    assert load_train_config(run_dir / "train.json").model.get("variant") == "transformer-tiny"
    print("reverse:", summary["metrics"])
    assert summary["metrics"]["test"]["token_accuracy"] >= 0.95
    assert 0.0 <= summary["metrics"]["test_long"]["token_accuracy"] <= 1.0


def test_a_time_budget_ends_training_early_and_still_evaluates(tmp_path):
    summary = train(small_config(steps=100000, max_seconds=0.5), tmp_path, progress=False)
    assert 1 <= summary["step"] < 100000
    assert summary["train_seconds"] >= 0.5
    assert set(summary["metrics"]) == {"test", "test_long"}


@pytest.mark.heavy
def test_a_compiled_run_follows_the_eager_curve_and_reports_its_flops(tmp_path):
    # an encoder of one layer on inputs of one length, whose steps share one graph: compiling it took about
    # half the time an encoder-decoder took, with an empty compile cache
    model = {**SMALL_MODEL, "dropout": 0.0, "encoder": {"layers": 1}}
    task = {"kind": "ordered-pair", "length": 8, "symbols": 4, "train_size": 100, "test_size": 20}
    from torch._dynamo.utils import counters

    settings = {"model": model, "task": task, "steps": 3, "log_every": 1}
    eager = train(small_config(**settings, peak_tflops=0.5), tmp_path / "eager", progress=False)
    counters.clear()
    compiled = train(small_config(**settings, compile=True), tmp_path / "compiled", progress=False)
    assert counters["stats"]["unique_graphs"] > 0, "the model was really compiled"
    curve = [[h["loss"] for h in run["history"]] for run in (eager, compiled)]
    torch.testing.assert_close(torch.tensor(curve[0]), torch.tensor(curve[1]), rtol=1e-4, atol=1e-5)
    assert eager["train_flops_per_step"] == compiled["train_flops_per_step"] > 0  # counted eagerly, the same step
    assert eager["mfu"] == pytest.approx(eager["train_tflops_per_second"] / 0.5)
    assert compiled["mfu"] is None, "no known peak on a CPU"


def test_a_trainer_in_parts_takes_the_steps_train_takes(tmp_path):
    config = small_config(steps=3, log_every=1)
    summary = train(config, tmp_path / "whole", progress=False)
    trainer = Trainer(config, tmp_path / "parts", progress=False).setup()
    assert [phase.name for phase in trainer.stepper.phases] == list(trainer.stepper.optimizers) == ["model"]
    assert trainer.stepper.model is trainer.model and trainer.checkpointer.run_dir == tmp_path / "parts"
    batch = trainer.batch(0)
    assert all(torch.equal(batch[k], v) for k, v in trainer.batch(0).items()), "a step's batch depends on the step only"
    losses, flops = trainer.counted_step(0, batch)
    assert flops == summary["train_flops_per_step"] > 0
    assert losses["model"] == pytest.approx(summary["history"][0]["loss"], abs=0)
    assert trainer.step(1)["model"] == pytest.approx(summary["history"][1]["loss"], abs=0)
    trainer.save(2)
    resumed = Trainer(config, tmp_path / "parts", progress=False).setup()
    assert resumed.start == 2 and resumed.run()["history"][-1]["loss"] == summary["history"][-1]["loss"]
    assert all(
        torch.equal(a, b) for a, b in zip(weights(tmp_path / "whole").values(), weights(tmp_path / "parts").values())
    )


@pytest.mark.parametrize(
    "module",
    [train_module, step_module, checkpointing_module, placement_module, interrupts_module],
    ids=lambda module: module.__name__.rpartition(".")[2],
)
def test_no_function_of_the_trainer_is_longer_than_a_screen(module):
    tree = ast.parse(inspect.getsource(module))
    spans = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    assert spans, "the module's functions were read"
    assert {name: lines for name, lines in spans.items() if lines > 60} == {}
    if module is train_module:
        assert "run" in spans and "step" in spans


def test_compare_and_scaling_use_only_the_trainers_public_names():
    import transformer_zoo.comparing.runner
    import transformer_zoo.comparing.scaling
    import transformer_zoo.comparing.spec

    for module in (transformer_zoo.comparing.runner, transformer_zoo.comparing.scaling, transformer_zoo.comparing.spec):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and "training" in (node.module or ""):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{module.__name__} imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "train":
                assert not node.attr.startswith("_"), f"{module.__name__} uses train.{node.attr}"


def test_run_until_trains_a_run_in_parts_exactly_and_scores_where_it_stops(tmp_path):
    config = small_config(holdout=40)
    whole = train(config, tmp_path / "whole", progress=False)
    trainer = Trainer(config, tmp_path / "parts", progress=False)
    with trainer.lock():
        trainer.setup()
        first = trainer.run_until(5, score="validation")
        assert first.step == trainer.reached == 5 and first.summary is None
        assert set(first.scores) == set(whole["metrics"]["validation"])
        assert trainer.history[-1] == {"step": 5, **{f"validation_{k}": v for k, v in first.scores.items()}}
        last = trainer.run_until(score="validation")
    assert last.step == 12 and last.summary["step"] == 12 and last.scores == last.summary["metrics"]["validation"]
    assert last.scores == whole["metrics"]["validation"], "the same model at the end"
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "parts")
    assert all(torch.equal(a[k], b[k]) for k in a), "two calls train exactly what one call trains"
    assert trainer.config == config, "the trainer's config is never rewritten"


def test_run_until_stops_at_its_time_budget_and_ends_the_run_only_when_no_step_is_asked(tmp_path):
    trainer = Trainer(small_config(steps=1000), tmp_path, progress=False)
    with trainer.lock():
        trainer.setup()
        part = trainer.run_until(500, seconds=0)
        assert (part.step, part.scores, part.summary) == (1, None, None), "out of time after one step; the run goes on"
        end = trainer.run_until(seconds=0)
    assert end.step == 2 and end.summary["step"] == 2 and (tmp_path / "summary.json").is_file()
