"""The placement alone: in one process, every part of it is the plain thing."""

from __future__ import annotations

import pytest
import torch

from transformer_zoo.training.distributed import World
from transformer_zoo.training.placement import Placement, resolve_device


def test_one_process_keeps_the_model_its_states_and_its_values_as_they_are():
    placement = Placement("cpu")
    assert placement.here == World() and placement.home == placement.device == torch.device("cpu")
    model = torch.nn.Linear(3, 2)
    assert placement.place(model, phases=1) is model and not (placement.wrapped or placement.sharded)
    assert placement.distribute(model) is model
    optimizer = torch.optim.AdamW(model.parameters())
    assert placement.optimizer_states(model, {"model": optimizer}) == {"model": optimizer.state_dict()}
    with placement.whole(model) as whole:
        assert whole is model
    assert placement.last_gathered(model) is model
    assert placement.mean(2.5) == 2.5 and placement.any_true(True) and not placement.any_true(False)
    batch = {"src": torch.arange(8).view(4, 2)}
    assert torch.equal(placement.shard(batch)["src"], batch["src"])


def test_a_world_of_several_processes_is_kept_but_not_wrapped_until_placed():
    placement = Placement("cpu", World(rank=1, size=2, launched=True), parallel="fsdp")
    assert not placement.here.main and not placement.sharded
    placement.place(torch.nn.Linear(3, 2), phases=2)  # a phase-trained model runs unwrapped
    assert not placement.wrapped and placement.home == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_asked_for_without_a_gpu_is_a_clear_error():
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device is available; ask for the CPU"):
        Placement("cuda")
