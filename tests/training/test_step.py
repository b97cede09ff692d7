"""The stepper alone: a tiny model's steps without a trainer or a run folder."""

from __future__ import annotations

import pytest
import torch

from transformer_zoo.api import build_model
from transformer_zoo.training.config import load_train_config, model_config_for
from transformer_zoo.training.step import Stepper, TrainingDiverged, flop_rates

CONFIG = {
    "model": {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.1},
    "task": {"kind": "reverse", "train_size": 100, "test_size": 10, "train_lengths": [1, 6], "test_lengths": [7, 8]},
    "steps": 4,
    "batch_size": 8,
    "grad_clip": 1.0,
}


def tiny_stepper() -> Stepper:
    config = load_train_config(CONFIG)
    task = config.task.build()
    torch.manual_seed(config.seed)
    return Stepper(config, task, build_model(model_config_for(config, task)).train())


def test_a_stepper_alone_draws_the_same_batch_for_a_step_and_takes_a_step():
    stepper = tiny_stepper()
    assert [phase.name for phase in stepper.phases] == list(stepper.optimizers) == list(stepper.schedulers) == ["model"]
    assert stepper.placement.device == torch.device("cpu") and not stepper.bf16
    batch = stepper.batch(1)
    assert all(torch.equal(batch[k], v) for k, v in stepper.batch(1).items()), "a step's batch depends on the step only"
    assert any(not torch.equal(batch[k], v) for k, v in stepper.batch(2).items())
    before = [p.detach().clone() for p in stepper.model.parameters()]
    losses, flops = stepper.counted_step(0)
    assert set(losses) == {"model"} and losses["model"] > 0 and flops > 0
    assert stepper.schedulers["model"].last_epoch == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, stepper.model.parameters())), "the step moved the weights"
    assert stepper.step(1, batch)["model"] > 0


def test_a_stepper_stops_on_a_non_finite_loss_before_stepping():
    stepper = tiny_stepper()
    with torch.no_grad():
        next(stepper.model.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match=r"^model loss became nan at step 3$"):
        stepper.step(2)
    assert stepper.schedulers["model"].last_epoch == 0, "nothing was stepped"


def test_flop_rates_need_a_count_and_a_peak():
    assert flop_rates(2e12, 10, 2.0, None, 1) == {
        "train_flops_per_step": 2e12,
        "train_tflops_per_second": 10.0,
        "mfu": None,
    }
    assert flop_rates(2e12, 10, 2.0, 20.0, 2)["mfu"] == pytest.approx(0.25)
    nothing = dict.fromkeys(("train_flops_per_step", "train_tflops_per_second", "mfu"))
    assert flop_rates(None, 0, 1.0, 20.0, 1) == nothing
