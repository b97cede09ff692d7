"""Training runs that are interrupted, crash, run twice at once, diverge or find damaged checkpoints:
one clear message each, nothing lost that was saved, nothing non-finite saved."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
import safetensors.torch
import torch

from transformer_zoo.cli import main
from transformer_zoo.core.errors import ConfigError, ZooError
from transformer_zoo.core.tasks import Seq2SeqTask
from transformer_zoo.training.config import RESUMABLE_FIELDS, TrainConfig, load_train_config
from transformer_zoo.training.run_folder import (
    FILES,
    SEALED,
    CheckpointError,
    CheckpointMismatch,
    CheckpointWarning,
    RunFolderBusy,
    RunFolderError,
    RunLock,
    candidates,
    seal,
)
from transformer_zoo.training.trainer import Trainer, TrainingDiverged, TrainingInterrupted, train

MODEL = {
    "variant": "transformer-tiny",
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "dropout": 0.1,
    "encoder": {"layers": 1},
    "decoder": {"layers": 1},
}
TASK = {"kind": "reverse", "train_size": 200, "test_size": 10, "train_lengths": [1, 6], "test_lengths": [7, 8]}
BASE = {"model": MODEL, "task": TASK, "steps": 8, "batch_size": 8, "log_every": 1}


def small_config(**overrides) -> TrainConfig:
    return load_train_config({**BASE, **overrides})


def weights(folder):
    return safetensors.torch.load_file(str(folder / "model.safetensors"))


def step_of(folder) -> int:
    return json.loads((folder / "state.json").read_text())["step"]


def tzoo(*args: str) -> subprocess.Popen:
    """``tzoo ARGS`` in a process of its own (one thread, as the machine's other tests)."""
    return subprocess.Popen(
        [sys.executable, "-m", "transformer_zoo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def config_file(tmp_path, **overrides) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps({**BASE, **overrides}))
    return str(path)


# ---- the lock ----------------------------------------------------------------------------------
def test_two_concurrent_runs_on_one_folder_give_one_clean_refusal(tmp_path):
    path, out = config_file(tmp_path, steps=100000, max_seconds=5, log_every=1000), str(tmp_path / "run")
    runs = [tzoo("train", path, "--out", out, "--json") for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]  # read as they run: a full pipe would block them
    results = [(run.pid, run.returncode, stdout, stderr) for run, (stdout, stderr) in zip(runs, outputs)]
    refused = [r for r in results if r[1] != 0]
    assert len(refused) == 1, [(code, stderr[-2000:]) for _, code, _, stderr in results]
    (_, code, _, err), (holder, _, stdout, _) = refused[0], next(r for r in results if r[1] == 0)
    assert code == 2 and "Traceback" not in err
    assert f"is in use by another training run (pid {holder})" in err
    assert json.loads(stdout)["step"] >= 1, "the holder trained to its end"


def test_a_held_folder_is_refused_at_once_and_the_lock_is_released_on_every_exit(tmp_path, monkeypatch):
    with RunLock(tmp_path):
        started = time.monotonic()
        with pytest.raises(RunFolderBusy, match=f"in use by another training run \\(pid {os.getpid()}\\)"):
            train(small_config(steps=2), tmp_path, progress=False)
        assert time.monotonic() - started < 10, "refused without waiting"
    real_loss = Seq2SeqTask.loss
    monkeypatch.setattr(Seq2SeqTask, "loss", lambda self, model, batch: real_loss(self, model, batch) * float("nan"))
    with pytest.raises(TrainingDiverged):
        train(small_config(steps=2), tmp_path, progress=False, resume=False)
    monkeypatch.setattr(Seq2SeqTask, "loss", real_loss)
    assert train(small_config(steps=2), tmp_path, progress=False)["step"] == 2, "the failed run let go of the folder"
    assert not (tmp_path / ".lock.pid").exists()


def test_out_naming_a_file_is_a_clear_error(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["train", config_file(tmp_path), "--out", str(taken)]) == 2
    assert f"run folder {str(taken)!r} is a file; give a folder" in capsys.readouterr().err
    assert main(["train", config_file(tmp_path), "--out", str(taken / "run")]) == 2
    assert "which is a file" in capsys.readouterr().err
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"variants": [MODEL], "tasks": [TASK], "steps": 1}))
    assert main(["compare", str(spec), "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert f"report folder {str(taken)!r} is a file" in err and "Traceback" not in err


def test_out_at_a_folder_of_other_files_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("# a comparison")
    (report / "plots").mkdir()
    assert main(["train", config_file(tmp_path), "--out", str(report)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"run folder {str(report)!r} holds files that are not a training run (plots, report.md)" in err
    assert "give a new or empty folder, or the folder of a run to resume, as --out" in err
    assert sorted(p.name for p in report.iterdir()) == ["plots", "report.md"]
    assert main(["train", config_file(tmp_path), "--out", str(report), "--restart"]) == 2, "nor started over there"


@pytest.mark.parametrize(
    "refused",
    [
        ["--set", "model.n_heads=3"],  # a model value its builder refuses
        ["--set", "model.variant=bert-tiny"],  # a model that cannot do the task
    ],
)
def test_a_refused_run_leaves_nothing_behind(tmp_path, capsys, refused):
    config = config_file(tmp_path)
    new, empty = tmp_path / "runs" / "new", tmp_path / "empty"
    empty.mkdir()
    for out in (new, empty):
        assert main(["train", config, "--out", str(out), *refused]) == 2
        assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists(), "no folder made"
    assert list(empty.iterdir()) == [], "no lock file left"


# ---- Ctrl-C --------------------------------------------------------------------------------------
@pytest.fixture
def python_sigint():
    """Ctrl-C as a fresh Python process has it: Python's handler, the signal not blocked. A test
    run earlier in the same pytest worker may have left SIGINT ignored or blocked (a child
    process inherits both), and Ctrl-C handling is what these tests check."""
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_saves_the_step_reached_says_so_in_one_line_and_the_run_resumes_there(tmp_path):
    path, out = config_file(tmp_path, steps=100000, checkpoint_every=2), tmp_path / "run"
    run = tzoo("train", path, "--out", str(out), "--json")
    deadline = time.monotonic() + 120
    while not (out / "checkpoint" / "state.json").is_file():  # the first steps are taken
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    stopped = step_of(out / "checkpoint")
    assert lines[0].startswith(f"interrupted at step {stopped} of 100000, saved: the checkpoint of step {stopped}")
    assert lines[0].endswith(f"run the same command again to resume from step {stopped}")
    resumed = tzoo("train", path, "--out", str(out), "--set", f"steps={stopped + 2}", "--json")
    stdout, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    summary = json.loads(stdout)
    assert (summary["resumed_from"], summary["step"]) == (stopped, stopped + 2)
    assert [h["step"] for h in summary["history"] if "loss" in h] == list(range(1, stopped + 3))


def interrupt_at(monkeypatch, *steps: int) -> None:
    """Ctrl-C (a real SIGINT to this process) during each step in ``steps``."""
    real_step = Trainer.step

    def step(self, step, batch=None, *, eager=False):
        if step + 1 in steps:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, step, batch, eager=eager)

    monkeypatch.setattr(Trainer, "step", step)


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_stops_after_the_step_under_way_and_restores_the_handler(tmp_path, monkeypatch):
    interrupt_at(monkeypatch, 3)
    config = small_config()
    with pytest.raises(TrainingInterrupted) as caught:
        train(config, tmp_path / "run", progress=False)
    assert (caught.value.step, caught.value.saved) == (3, 3)
    assert step_of(tmp_path / "run" / "checkpoint") == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.undo()
    train(config, tmp_path / "run", progress=False)
    train(config, tmp_path / "straight", progress=False)
    a, b = weights(tmp_path / "run" / "model"), weights(tmp_path / "straight" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a), "the interrupted run ends as an uninterrupted one"


@pytest.mark.usefixtures("python_sigint")
def test_a_second_ctrl_c_stops_at_once_keeping_the_last_checkpoint(tmp_path, monkeypatch):
    interrupt_at(monkeypatch, 3)
    real_save = Trainer.save

    def save(self, step):  # Ctrl-C again while the interrupted run saves
        if self.reached == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real_save(self, step)

    monkeypatch.setattr(Trainer, "save", save)
    with pytest.raises(
        TrainingInterrupted,
        match=r"interrupted at step 3 of 8, without saving it; kept: the "
        r"checkpoint of step 2 .* resume from step 2",
    ):
        train(small_config(checkpoint_every=2), tmp_path, progress=False)
    assert [c.name for c in candidates(tmp_path)] == ["checkpoint"] and step_of(tmp_path / "checkpoint") == 2


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_during_compare_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    interrupt_at(monkeypatch, 2)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        json.dumps({"variants": [MODEL], "tasks": [TASK], "steps": 4, "seeds": [0, 1], "train": {"batch_size": 4}})
    )
    assert main(["compare", str(spec), "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"comparison interrupted with 0 of 2 runs finished (in {tmp_path / 'out' / 'runs'}); the run "
        "in progress saved its step 2; run the same command again to go on: finished runs are reused "
        "and the others resume from their checkpoints"
    )


# ---- checkpoints by time -----------------------------------------------------------------------
@pytest.mark.parametrize(("minutes", "saved"), [(1e-9, [1, 2, 3, 3]), (None, [3])])
def test_a_run_checkpoints_by_time_by_default(tmp_path, monkeypatch, minutes, saved):
    assert TrainConfig.model_fields["checkpoint_minutes"].default == 5
    steps = []
    real_save = Trainer.save
    monkeypatch.setattr(Trainer, "save", lambda self, step: (steps.append(step), real_save(self, step)))
    train(small_config(steps=3, checkpoint_minutes=minutes), tmp_path, progress=False)
    assert steps == saved


# ---- the NaN stop ------------------------------------------------------------------------------
def nan_loss_at(monkeypatch, *calls: int) -> None:
    count = {"n": 0}
    real_loss = Seq2SeqTask.loss

    def loss(self, model, batch):
        count["n"] += 1
        value = real_loss(self, model, batch)
        return value * float("nan") if count["n"] in calls else value

    monkeypatch.setattr(Seq2SeqTask, "loss", loss)


def test_divergence_is_one_line_exit_2_and_says_that_no_checkpoint_exists(tmp_path, monkeypatch, capsys):
    nan_loss_at(monkeypatch, 3)
    assert main(["train", config_file(tmp_path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "model loss became nan at step 3; no checkpoint was written, so the next run starts from step 0" in err
    assert "start over (--restart) with a lower lr (now 0.001)" in err
    assert candidates(tmp_path / "run") == []


def test_weights_made_non_finite_by_a_finite_loss_step_are_never_saved(tmp_path, monkeypatch):
    """With checkpoint_every=1, the update of step 3 makes the weights NaN while its loss was finite."""
    real_step = Trainer.step

    def step(self, step, batch=None, *, eager=False):
        losses = real_step(self, step, batch, eager=eager)
        if step + 1 == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return losses

    monkeypatch.setattr(Trainer, "step", step)
    with pytest.raises(
        TrainingDiverged,
        match=r"became non-finite after step 2, by step 3 \(not saved\); kept: the "
        r"checkpoint of step 2",
    ):
        train(small_config(checkpoint_every=1), tmp_path, progress=False)
    assert step_of(tmp_path / "checkpoint") == 2
    assert all(torch.isfinite(t).all() for t in weights(tmp_path / "checkpoint").values())
    states = torch.load(tmp_path / "checkpoint" / "optimizer.pt", weights_only=True)["optimizers"]["model"]["state"]
    assert all(torch.isfinite(v).all() for state in states.values() for v in state.values())


def test_a_resumed_run_that_diverges_again_suggests_starting_over(tmp_path, monkeypatch):
    train(small_config(), tmp_path, progress=False, stop_after=4)
    nan_loss_at(monkeypatch, 2)
    with pytest.raises(
        TrainingDiverged,
        match=r"at step 6; kept: the checkpoint of step 4 .*; this run resumed from "
        r"step 4 and diverged again, .*: train a new run into another --out with a lower lr",
    ) as caught:
        train(small_config(), tmp_path, progress=False)
    assert "--restart" not in str(caught.value), "the kept checkpoint is intact: --restart would delete it"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", float("inf")),
        ("lr", float("nan")),
        ("lr", 1e39),
        ("seed", 10**19),
        ("seed", -1),
        ("steps", 10**20),
        ("checkpoint_minutes", 0),
        ("max_seconds", float("inf")),
        ("grad_clip", float("nan")),
    ],
)
def test_non_finite_and_out_of_range_training_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        small_config(**{field: value})


# ---- changed configs ---------------------------------------------------------------------------
def test_resuming_with_a_changed_config_is_refused_in_one_line_naming_the_run(tmp_path, capsys):
    path, out = config_file(tmp_path, lr=0.003, steps=8), str(tmp_path / "run")
    train(load_train_config(path), out, progress=False, stop_after=3)
    written = (tmp_path / "run" / "train.json").read_text()
    changed = ["--set", "lr=0.01", "--set", "steps=6", "--set", "model.d_model=48", "--set", "model.n_heads=4"]
    assert main(["train", path, "--out", out, *changed]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"run folder {out!r} holds another run, of transformer-tiny on reverse" in err
    assert "differs from it in 3 fields (model.d_model: 32 -> 48; model.n_heads: 2 -> 4; ...)" in err
    assert f"(but for {', '.join(sorted(RESUMABLE_FIELDS))}); train into another --out" in err
    assert "--restart" not in err and "steps:" not in err
    assert main(["train", path, "--out", out, *changed, "--json"]) == 2
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"] == {"model": "transformer-tiny", "task": "reverse"}
    assert shown["differences"] == ["model.d_model: 32 -> 48", "model.n_heads: 2 -> 4", "lr: 0.003 -> 0.01"]
    assert (tmp_path / "run" / "train.json").read_text() == written, "train.json is left as it was"
    assert main(["train", path, "--out", out, "--set", "steps=6", "--set", "max_seconds=60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resumed_from"] == 3, "a safe change resumes"


def test_a_run_beyond_its_new_steps_says_where_it_is_and_how_to_go_on(tmp_path, capsys):
    path, out = config_file(tmp_path), tmp_path / "run"
    train(load_train_config(path), out, progress=False)
    before = (out / "checkpoint" / "model.safetensors").read_bytes()
    assert main(["train", path, "--out", str(out), "--set", "steps=5"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert (
        f"run folder {str(out)!r} holds this run at step 8, beyond steps=5: to train it further, give steps above 8"
        in err
    )
    assert "to train a new run of 5 steps, train into another --out" in err and "--restart" not in err
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == before
    assert main(["train", path, "--out", str(out), "--set", "steps=10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resumed_from"] == 8


def intact_but_refused(tmp_path, straight, case):
    """A run folder holding an intact checkpoint (step 3, or 6 where kept beside one), and the
    refusal (or warning) that training there with the base config gives in ``case``."""
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    config = small_config()
    if case == "another config":
        config = small_config(lr=0.01)
    elif case == "beyond steps":
        config = small_config(steps=2)
    elif case == "train.json damaged":
        (run / "train.json").write_text("{")
    elif case == "another model, no train.json":
        (run / "train.json").unlink()
        config = small_config(model={**MODEL, "d_ff": 48})
    elif case == "another optimizer state":
        resealed(edit_optimizer(lambda s: s["optimizers"]["model"]["param_groups"][0].update(params=[])))(
            run / "checkpoint" / "optimizer.pt"
        )
    elif case == "a damaged newer checkpoint beside it":
        shutil.copytree(straight / "6" / "checkpoint", run / ".checkpoint.tmp")
        flip_bytes(run / ".checkpoint.tmp" / "optimizer.pt")
    elif case == "a resumed run diverging":
        nan_loss_at = {"n": 0}
        real = Seq2SeqTask.loss

        def loss(self, model, batch):
            nan_loss_at["n"] += 1
            return real(self, model, batch) * (float("nan") if nan_loss_at["n"] == 2 else 1.0)

        Seq2SeqTask.loss = loss
        try:
            with pytest.raises(ZooError) as caught:
                train(config, run, progress=False)
        finally:
            Seq2SeqTask.loss = real
        return run, str(caught.value)
    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        try:
            train(config, run, progress=False)
        except ZooError as exc:
            return run, str(exc)
    return run, " ".join(str(w.message) for w in caught_warnings)


INTACT = [
    "another config",
    "beyond steps",
    "train.json damaged",
    "another model, no train.json",
    "another optimizer state",
    "a damaged newer checkpoint beside it",
    "a resumed run diverging",
]


@pytest.mark.parametrize("case", INTACT)
def test_no_message_suggests_restart_where_an_intact_checkpoint_is_left(tmp_path, straight, case):
    """--restart deletes the folder's checkpoints: where one is intact, no message offers it."""
    run, message = intact_but_refused(tmp_path, straight, case)
    assert message, "a refusal or a warning"
    assert "--restart" not in message and "no intact checkpoint" not in message
    assert any(step_of(folder) >= 3 for folder in candidates(run)), "an intact checkpoint is still there"


def test_a_model_named_or_spelt_out_is_the_same_model(tmp_path):
    config = small_config(model="transformer-tiny", steps=2)
    train(config, tmp_path, progress=False, stop_after=1)
    assert train(small_config(model={"variant": "transformer-tiny"}, steps=2), tmp_path, progress=False)["step"] == 2


def test_an_override_of_a_named_models_option_keeps_its_name(tmp_path):
    path = config_file(tmp_path, model="transformer-tiny")
    config = load_train_config(path, ["model.d_model=48", "model.n_heads=4"])
    assert config.model == {"variant": "transformer-tiny", "d_model": 48, "n_heads": 4}
    assert load_train_config(path, ["model=bert-tiny"]).model == "bert-tiny"


def test_restart_with_a_changed_config_starts_over_and_drops_the_old_checkpoints(tmp_path):
    train(small_config(), tmp_path, progress=False, stop_after=3)
    shutil.copytree(tmp_path / "checkpoint", tmp_path / ".checkpoint.old")
    summary = train(small_config(lr=0.002, steps=2), tmp_path, progress=False, resume=False)
    assert (summary["resumed_from"], step_of(tmp_path / "checkpoint")) == (None, 2)
    assert not (tmp_path / ".checkpoint.old").exists()
    assert load_train_config(tmp_path / "train.json").lr == 0.002


# ---- crashes -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of 8 steps, and the checkpoints of steps 3 and 6 of the same run."""
    root = tmp_path_factory.mktemp("straight")
    config = small_config()
    train(config, root / "whole", progress=False)
    for step in (3, 6):
        train(config, root / str(step), progress=False, stop_after=step)
    return root


def crashed(tmp_path, straight, layout: dict[str, int | None]):
    """A run folder whose checkpoint folders hold the given steps (None: an incomplete folder)."""
    run = tmp_path / "run"
    shutil.copytree(straight / "3", run, ignore=shutil.ignore_patterns("checkpoint"))
    for name, step in layout.items():
        shutil.copytree(straight / str(step or 6) / "checkpoint", run / name)
        if step is None:
            (run / name / "state.json").unlink()
    return run


@pytest.mark.parametrize(
    ("layout", "resumed"),
    [
        ({".checkpoint.tmp": 6}, 6),  # the double crash: only a complete .tmp is left
        ({".checkpoint.old": 3, ".checkpoint.tmp": 6}, 6),  # a crash after checkpoint was moved to .old
        ({"checkpoint": 3, ".checkpoint.tmp": 6}, 6),  # a crash before the swap began
        ({"checkpoint": 6, ".checkpoint.old": 3}, 6),  # a crash before .old was removed
        ({"checkpoint": 3, ".checkpoint.tmp": None}, 3),  # a crash while writing .tmp
        ({".checkpoint.old": 3, ".checkpoint.tmp": None}, 3),
    ],
)
def test_recovery_takes_the_newest_complete_checkpoint_of_the_three(tmp_path, straight, layout, resumed):
    run = crashed(tmp_path, straight, layout)
    summary = train(small_config(), run, progress=False)
    assert summary["resumed_from"] == resumed
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint"]
    a, b = weights(straight / "whole" / "model"), weights(run / "model")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed exactly"


def test_a_crash_right_after_recovering_from_tmp_keeps_what_it_recovered(tmp_path, straight, monkeypatch):
    run = crashed(tmp_path, straight, {".checkpoint.tmp": 6})

    def crash(self, stop_after=None):
        raise MemoryError("a crash as training begins")

    monkeypatch.setattr(Trainer, "run", crash)
    with pytest.raises(MemoryError):
        train(small_config(), run, progress=False)
    assert [(c.name, step_of(c)) for c in candidates(run)] == [("checkpoint", 6)], "made the checkpoint before training"


def test_partial_files_of_a_killed_save_are_removed_by_the_next_run(tmp_path, straight):
    run = crashed(tmp_path, straight, {"checkpoint": 6})
    (run / "model").mkdir()
    leftovers = [
        run / "model" / ".model.safetensors.k2j3.tmp",
        run / "checkpoint" / ".config.json.x8.tmp",
        run / ".summary.json.a1.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"")
    train(small_config(), run, progress=False)
    assert not any(path.exists() for path in leftovers)
    assert (run / "model" / "model.safetensors").is_file()


# ---- damaged checkpoints -----------------------------------------------------------------------
def flip_bytes(path, count=64):
    """Flip ``count`` bytes in the middle of a file (in the tensor data of a safetensors file)."""
    data = bytearray(path.read_bytes())
    middle = (
        len(data) // 2 if path.suffix != ".safetensors" else (len(data) + 8 + int.from_bytes(data[:8], "little")) // 2
    )
    for i in range(middle, min(middle + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def change_a_digit(path):
    """A JSON file that still reads, with one digit of its last number changed (the state's
    learning curve, a config's last value)."""
    text = path.read_text()
    at = max(i for i, c in enumerate(text) if c.isdigit())
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :])


FLIPS = {
    "model.safetensors": flip_bytes,
    "optimizer.pt": flip_bytes,
    "state.json": change_a_digit,
    "config.json": change_a_digit,
}


@pytest.mark.parametrize("name", FLIPS)
def test_a_file_changed_after_it_was_written_is_refused_by_its_digest(tmp_path, straight, name):
    """The damage of the weights, the optimizer state, the state file or the model's config,
    bytes that still read (flipped weights load silently without the digests)."""
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    FLIPS[name](run / "checkpoint" / name)
    with pytest.raises(CheckpointError, match="does not match the SHA-256 digest") as caught:
        train(small_config(), run, progress=False)
    message = str(caught.value)
    assert f"{run / 'checkpoint' / name} does not match the SHA-256 digest" in message
    assert "its bytes changed after the checkpoint was written" in message
    assert message.endswith("no intact checkpoint is left: start over with --restart, or train into another --out")


def test_a_flipped_checkpoint_falls_back_to_the_kept_one_with_a_warning_naming_the_file(tmp_path, straight, capsys):
    run = crashed(tmp_path, straight, {"checkpoint": 6, ".checkpoint.old": 3})
    flip_bytes(run / "checkpoint" / "model.safetensors")
    assert main(["train", config_file(tmp_path), "--out", str(run), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["resumed_from"] == 3
    (warning,) = [line for line in captured.err.splitlines() if line.strip()]
    assert warning.startswith(f"warning: {run / 'checkpoint' / 'model.safetensors'} does not match the SHA-256 digest")
    assert warning.endswith(f"resuming from the intact {run / '.checkpoint.old'} (step 3) instead")
    a, b = weights(straight / "whole" / "model"), weights(run / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_records_the_digest_of_each_file_as_sha256sum_gives_it(straight):
    folder = straight / "3" / "checkpoint"
    recorded = json.loads((folder / "state.json").read_text())["sha256"]
    assert sorted(recorded) == sorted(FILES)
    for name in SEALED:
        assert recorded[name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()


def test_a_checkpoint_without_digests_resumes_with_a_warning_that_it_is_not_verified(tmp_path, straight):
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    edit_state(sha256=...)(run / "checkpoint" / "state.json")
    with pytest.warns(CheckpointWarning, match="records no SHA-256 digests .* not byte for byte"):
        summary = train(small_config(), run, progress=False)
    assert summary["resumed_from"] == 3
    assert "sha256" in json.loads((run / "checkpoint" / "state.json").read_text()), "the new checkpoint has them"


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def edit_state(**changes):
    def edit(path):
        state = json.loads(path.read_text())
        state.update(changes)
        path.write_text(json.dumps({k: v for k, v in state.items() if v is not ...}))

    return edit


def transpose_one(path):
    tensors = safetensors.torch.load_file(str(path))
    name = next(k for k, v in tensors.items() if v.dim() == 2 and v.size(0) != v.size(1))
    tensors[name] = tensors[name].t().contiguous()
    safetensors.torch.save_file(tensors, str(path))


def edit_optimizer(change):
    def edit(path):
        states = torch.load(path, weights_only=True)
        change(states)
        torch.save(states, path)

    return edit


def first_moment(states):
    return next(v for v in states["optimizers"]["model"]["state"].values() if v["exp_avg"].dim() == 2)


def resealed(change):
    """``change``, then the digests recorded anew: a checkpoint whose files are as a faulty
    writer (or another model) left them, which only the checks of their contents can refuse."""

    def apply(path):
        change(path)
        folder = path.parent
        try:
            state = json.loads((folder / "state.json").read_text())
        except ValueError:
            return
        if (
            isinstance(state, dict)
            and isinstance(state.get("sha256"), dict)
            and all((folder / n).is_file() for n in SEALED)
        ):
            state.pop("sha256")
            (folder / "state.json").write_text(json.dumps(seal(state, folder)))

    return apply


DAMAGE = {
    "truncated weights": ("model.safetensors", truncate, "is not a readable safetensors file"),
    "empty weights": ("model.safetensors", lambda p: p.write_bytes(b""), "is not a readable safetensors file"),
    "no weights": ("model.safetensors", lambda p: p.unlink(), "is missing"),
    "NaN weight": (
        "model.safetensors",
        lambda p: safetensors.torch.save_file(
            {k: v * float("nan") for k, v in safetensors.torch.load_file(str(p)).items()}, str(p)
        ),
        "non-finite",
    ),
    "garbage optimizer": ("optimizer.pt", lambda p: p.write_bytes(b"garbage" * 100), "not a readable optimizer state"),
    "truncated optimizer": ("optimizer.pt", truncate, "not a readable optimizer state"),
    "empty optimizer": ("optimizer.pt", lambda p: p.write_bytes(b""), r"not a readable optimizer state \(EOFError"),
    "optimizer of a list": ("optimizer.pt", lambda p: torch.save([1, 2], p), "not a mapping of optimizers"),
    "no schedule": (
        "optimizer.pt",
        edit_optimizer(lambda s: s["schedulers"].update(model={})),
        "no learning-rate schedule state",
    ),
    "schedule of another step": (
        "optimizer.pt",
        edit_optimizer(lambda s: s["schedulers"]["model"].update(last_epoch=2)),
        "schedule is at step 2, and state.json at step 3",
    ),
    "empty state": ("state.json", lambda p: p.write_text(""), "is not readable JSON"),
    "state of a list": ("state.json", lambda p: p.write_text("[]"), "holds list, not a mapping"),
    "no rng": ("state.json", edit_state(rng=...), "lacks 'rng'"),
    "rng of a string": ("state.json", edit_state(rng="abc"), "has a rng that is not a random state"),
    "negative step": ("state.json", edit_state(step=-5), "has step -5; a step is a whole number of at least 0"),
    "step of text": ("state.json", edit_state(step="3"), "has step '3'"),
    "history of a mapping": ("state.json", edit_state(history={}), "history that is not a list"),
    "digests of a list": ("state.json", edit_state(sha256=[]), "'sha256' record that is not a SHA-256 digest"),
    "garbage config": ("config.json", lambda p: p.write_bytes(b"\xff\x00"), "is not readable JSON"),
}
MISMATCH = {  # intact checkpoints of another model
    "transposed weight": ("model.safetensors", transpose_one, r"holds .* of shape \[\d+, \d+\], and the model's is"),
    "transposed moment": (
        "optimizer.pt",
        edit_optimizer(lambda s: first_moment(s).update(exp_avg=first_moment(s)["exp_avg"].t().contiguous())),
        "has exp_avg of shape",
    ),
}


@pytest.mark.parametrize("damage", [*DAMAGE, *MISMATCH])
def test_a_damaged_checkpoint_or_one_of_another_model_is_a_clear_error_naming_the_file(tmp_path, straight, damage):
    """Only where nothing intact is left does the message offer --restart, which deletes it."""
    name, change, message = DAMAGE.get(damage) or MISMATCH[damage]
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    resealed(change)(run / "checkpoint" / name)
    with pytest.raises(CheckpointMismatch if damage in MISMATCH else CheckpointError, match=message) as caught:
        train(small_config(), run, progress=False)
    assert str(run / "checkpoint" / name) in str(caught.value)
    assert str(caught.value).endswith(
        "resume it with the config it was trained with, or train into another --out"
        if damage in MISMATCH
        else "no intact checkpoint is left: start over with --restart, or train into another --out"
    )


def test_a_checkpoint_of_another_model_is_refused_even_without_train_json(tmp_path, straight):
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    (run / "train.json").unlink()
    with pytest.raises(
        CheckpointMismatch,
        match=r"model.safetensors holds .* of shape \[\d+(, \d+)?\], and the model's "
        r"is .*; it was written for another model",
    ) as caught:
        train(small_config(model={**MODEL, "d_model": 48}), run, progress=False)
    assert "--restart" not in str(caught.value)


def test_a_damaged_checkpoint_on_the_command_line_is_one_line_and_exit_2(tmp_path, straight, capsys):
    run = crashed(tmp_path, straight, {"checkpoint": 3})
    (run / "checkpoint" / "model.safetensors").write_bytes(b"\0" * 10)
    assert main(["train", config_file(tmp_path), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "model.safetensors does not match the SHA-256 digest" in err and "--restart" in err


def test_checkpoint_errors_are_the_zoos_value_errors():
    assert issubclass(CheckpointError, RunFolderError) and issubclass(RunFolderError, (ZooError, ValueError))
    assert issubclass(TrainingDiverged, ZooError) and issubclass(TrainingInterrupted, KeyboardInterrupt)
