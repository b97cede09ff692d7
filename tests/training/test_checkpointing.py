"""The checkpointer alone: a tiny model's state saved into a run folder and resumed, without a trainer."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_zoo.api import build_model
from transformer_zoo.training.checkpointing import Checkpointer
from transformer_zoo.training.config import load_train_config, model_config_for
from transformer_zoo.training.run_folder import RunFolderBusy, RunFolderError, candidates
from transformer_zoo.training.step import TrainingDiverged, phase_optimizers

CONFIG = {
    "model": {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64},
    "task": {"kind": "reverse", "train_size": 50, "test_size": 10, "train_lengths": [1, 6], "test_lengths": [7, 8]},
    "steps": 6,
    "batch_size": 4,
    "checkpoint_every": 2,
    "checkpoint_minutes": None,
}


def tiny(seed: int):
    config = load_train_config({**CONFIG, "seed": seed})
    task = config.task.build()
    torch.manual_seed(seed)
    model = build_model(model_config_for(config, task))
    _, optimizers, schedulers = phase_optimizers(model, config)
    return config, task, model, optimizers, schedulers


def step_once(model, optimizers, schedulers) -> None:
    optimizers["model"].zero_grad(set_to_none=True)
    sum(p.square().sum() for p in model.parameters()).backward()
    optimizers["model"].step()
    schedulers["model"].step()


def test_a_saved_state_resumes_exactly_into_another_model(tmp_path):
    config, task, model, optimizers, schedulers = tiny(0)
    step_once(model, optimizers, schedulers)
    saver = Checkpointer(config, tmp_path)
    with saver.lock():
        saver.write_run_folder(None, task)
        saver.save(1, model, optimizers, schedulers, [{"step": 1, "loss": 0.5}])
        with pytest.raises(RunFolderBusy), Checkpointer(config, tmp_path).lock():
            pass
    assert saver.saved == 1 and saver.resumed_from is None
    assert json.loads((tmp_path / "train.json").read_text())["steps"] == 6
    expected_rng = torch.get_rng_state()

    _, _, other, other_optimizers, other_schedulers = tiny(1)
    torch.manual_seed(123)
    loader = Checkpointer(config, tmp_path)
    found = loader.resumable()
    assert found == candidates(tmp_path) == [tmp_path / "checkpoint"]
    checkpoint, state = loader.resume_from(found, other)
    loader.load_optimizer_states(checkpoint, state["step"], other, other_optimizers, other_schedulers)
    assert (state["step"], state["history"], loader.saved, loader.resumed_from) == (1, [{"step": 1, "loss": 0.5}], 1, 1)
    assert torch.equal(torch.get_rng_state(), expected_rng), "the random state is the saved one"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    step_once(model, optimizers, schedulers)
    step_once(other, other_optimizers, other_schedulers)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters())), "the optimizer resumed too"


def test_a_checkpoint_is_due_by_steps_and_a_non_finite_one_is_refused(tmp_path):
    config, _, model, optimizers, schedulers = tiny(0)
    checkpointer = Checkpointer(config, tmp_path)
    assert [step for step in range(1, 7) if checkpointer.due(step)] == [2, 4, 6]
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    with pytest.raises(TrainingDiverged, match=r"non-finite, by step 2 \(not saved\); no checkpoint was written"):
        checkpointer.save(2, model, optimizers, schedulers, [])
    assert candidates(tmp_path) == [] and checkpointer.saved is None
    with pytest.raises(ValueError, match="no run folder to save into"):
        Checkpointer(config, None).save(2, model, optimizers, schedulers, [])


def test_a_folder_of_another_config_is_refused(tmp_path):
    config, task, model, optimizers, schedulers = tiny(0)
    saver = Checkpointer(config, tmp_path)
    saver.write_run_folder(None, task)
    saver.save(2, model, optimizers, schedulers, [])
    with pytest.raises(RunFolderError, match=r"holds another run, of .* differs from it in 1 field \(seed: 0 -> 1\)"):
        Checkpointer(tiny(1)[0], tmp_path).resumable()


def test_one_reader_reads_the_run_sides_json_and_names_a_file_that_is_not_json(tmp_path):
    from transformer_zoo.training.run_folder import CheckpointError, read_json

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"step": 3, "loss": float("nan")}))  # as json.dumps writes it, NaN included
    assert read_json(good)["step"] == 3
    torn, garbage = tmp_path / "torn.json", tmp_path / "garbage.json"
    torn.write_text('{"step": 3')
    garbage.write_bytes(b"\xff\x00")
    for path, message in (
        (tmp_path / "missing.json", "is missing"),
        (torn, "is not readable JSON"),
        (garbage, "is not readable JSON"),
    ):
        with pytest.raises(RunFolderError, match=message) as caught:
            read_json(path)
        assert str(caught.value).startswith(str(path))
    with pytest.raises(CheckpointError, match="torn.json is not readable JSON"):
        read_json(torn, CheckpointError)
