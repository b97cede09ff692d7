"""Data-parallel training over processes, launched by ``torchrun``.

``torchrun --nproc-per-node N -m transformer_zoo train CONFIG`` starts N copies of ``tzoo
train``; each reads its rank from the environment torchrun sets. Every process draws the same
global batch of ``batch_size`` examples (the batch a single process would draw) and keeps its
own slice of ``batch_size / N`` rows. With ``parallel: ddp`` each process trains a whole copy
of the model in :class:`~torch.nn.parallel.DistributedDataParallel`, which averages the
gradients; with ``parallel: fsdp`` the parameters, gradients and optimizer state are sharded
over the processes (:func:`~torch.distributed.fsdp.fully_shard`, one unit per block of each
stack), and each block is gathered only while it runs. Process 0 writes the run folder
(checkpoints hold the plain model and optimizer, loadable on one device) and evaluates.

With a loss that is a mean over examples (classification), N processes follow the same curve
as one process with the same global batch, up to float rounding. A token loss averaged over
each slice's own tokens weighs the slices equally instead of the tokens.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

# torch.distributed.checkpoint and torch.distributed.tensor (a second to import) are imported by
# the functions of sharded training that use them, so that a process training alone starts without them


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    launched: bool = False
    """Started by torchrun: the process group is up and training goes through DDP or FSDP, also
    in a job of one process (so one GPU runs the same code as several)."""

    @property
    def main(self) -> bool:
        """Whether this process writes the run folder and evaluates."""
        return self.rank == 0


def world() -> World:
    """The processes torchrun started (the process group is set up on first use: NCCL on CUDA,
    gloo on CPU); a world of one, with no process group, when not launched by torchrun."""
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        return World()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if torch.cuda.is_available():  # each process's own GPU is its default one from the start
            torch.cuda.set_device(local_rank)
        # gloo for CPU tensors (a run with device: cpu, and CPU-side book-keeping), NCCL for CUDA ones
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank, launched=True)


class Replica(DistributedDataParallel):
    """DistributedDataParallel that lends its model's attributes (``config``, ``loss``), so a task
    uses it as it uses the model; calling it runs the forward that synchronises gradients."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def replicate(model: nn.Module, device: torch.device) -> Replica:
    # some variants leave parameters out of some losses (a pooler, halting units)
    # buffers are not broadcast: each process keeps its own batch-norm statistics, process 0's are saved
    return Replica(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=True,
        broadcast_buffers=False,
    )


def fully_shard(model: nn.Module, device: torch.device, here: World) -> None:
    """Shard ``model`` in place over the processes. Each layer of a
    :class:`~transformer_zoo.core.layers.StandardStack` is a unit, gathered for its own forward
    and backward; the rest (embeddings, heads, a recurrent stack's shared layer, which ACT may
    apply a different number of times in each process) is the root's unit, gathered once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as shard_module

    from ..core.layers import StandardStack

    mesh = init_device_mesh(device.type, (here.size,))
    for stack in [m for m in model.modules() if isinstance(m, StandardStack)]:
        for layer in stack.layers:
            shard_module(layer, mesh=mesh)
    shard_module(model, mesh=mesh)


def held_parameters(model: nn.Module) -> int:
    """The parameter elements this process holds: its shards of a sharded model's."""
    tensor = sys.modules.get("torch.distributed.tensor")  # not imported yet: no parameter is sharded
    sharded = () if tensor is None else tensor.DTensor
    return sum(p.to_local().numel() if isinstance(p, sharded) else p.numel() for p in model.parameters())


def _whole_on_cpu() -> Any:
    """State dict options: gathered on process 0's CPU, one tensor at a time."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def gathered_weights(model: nn.Module) -> dict[str, Tensor]:
    """The whole weights of a sharded model, on the CPU of process 0 (empty elsewhere; every
    process must call it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_whole_on_cpu())


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order of its state's indices."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def gathered_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, here: World) -> dict[str, Any]:
    """A sharded model's optimizer state in the layout of one process's (by parameter index), on
    the CPU of process 0 (empty elsewhere; every process must call it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_whole_on_cpu())
    if not here.main:
        return {}
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return {
        "state": {index[name]: values for name, values in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]} for group in state["param_groups"]
        ],
    }


def load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an optimizer state saved whole, by parameter index (every process reads it on the
    CPU), into a sharded model's optimizer: each process keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _parameter_names(model, optimizer)
    by_name = {
        "state": {names[int(i)]: values for i, values in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(i)] for i in group["params"]]} for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def shard(batch: dict[str, Tensor], here: World) -> dict[str, Tensor]:
    """This process's rows of a global batch."""
    rows = next(iter(batch.values())).size(0) // here.size
    return {k: v[here.rank * rows : (here.rank + 1) * rows] for k, v in batch.items()}


def mean(value: float, here: World, device: torch.device) -> float:
    """The mean of ``value`` over the processes."""
    if here.size == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.item() / here.size


def any_true(flag: bool, here: World, device: torch.device) -> bool:
    """Whether ``flag`` holds in any process (so that all stop together)."""
    return mean(float(flag), here, device) > 0


@contextlib.contextmanager
def job() -> Iterator[None]:
    """A command's span: the process group torchrun's processes set up is taken down at its end."""
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def barrier(here: World) -> None:
    if here.size > 1:
        dist.barrier()
