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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel


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
    return Replica(model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True,
                   broadcast_buffers=False)


def fully_shard(model: nn.Module, device: torch.device, here: World) -> None:
    """Shard ``model`` in place over the processes. Each layer of a
    :class:`~transformer_zoo.core.stack.StandardStack` is a unit, gathered for its own forward
    and backward; the rest (embeddings, heads, a recurrent stack's shared layer, which ACT may
    apply a different number of times in each process) is the root's unit, gathered once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as shard_module

    from .core.stack import StandardStack

    mesh = init_device_mesh(device.type, (here.size,))
    for stack in [m for m in model.modules() if isinstance(m, StandardStack)]:
        for layer in stack.layers:
            shard_module(layer, mesh=mesh)
    shard_module(model, mesh=mesh)


def held_parameters(model: nn.Module) -> int:
    """The parameter elements this process holds: its shards of a sharded model's."""
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())


def gathered(value: Any) -> Any:
    """A sharded tensor whole (every process must call it, in the same order); anything else as is."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def gathered_weights(model: nn.Module, here: World) -> dict[str, Tensor]:
    """The whole weights of a sharded model, on the CPU of process 0 (empty elsewhere)."""
    whole = {}
    for name, value in model.state_dict().items():
        value = gathered(value)
        if here.main:
            whole[name] = value.detach().cpu()
    return whole


def gathered_optimizer(optimizer: torch.optim.Optimizer, here: World) -> dict[str, Any]:
    """A sharded model's optimizer state in the layout of one process's, on the CPU of process 0
    (empty elsewhere); one tensor at a time is whole on a device."""
    state = optimizer.state_dict()
    moments = {}
    for index, values in sorted(state["state"].items()):
        whole = {}
        for key, value in values.items():
            value = gathered(value)
            whole[key] = value.cpu() if isinstance(value, Tensor) else value
        if here.main:
            moments[index] = whole
    return {"state": moments, "param_groups": state["param_groups"]} if here.main else {}


def sharded_optimizer(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state saved whole (read by every process, on the CPU), cut into this
    process's shards of the optimizer's parameters."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    moments = {}
    for index, values in state["state"].items():
        like = parameters[int(index)]
        moments[index] = {
            # every process holds the whole value: each keeps its own shard, nothing is sent
            key: distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
            if isinstance(like, DTensor) and isinstance(value, Tensor) and value.shape == like.shape else value
            for key, value in values.items()}
    return {**state, "state": moments}


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
