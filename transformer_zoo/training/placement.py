"""Where a run's model lives and how its processes share it: a trainer's placement.

:class:`Placement` holds the device, the processes training together (a
:class:`~transformer_zoo.training.distributed.World`) and what follows from them: where the
model is built (:attr:`Placement.home`), how it is spread over the processes for training
(:meth:`Placement.distribute`: DDP's replica, FSDP's shards, or the model itself), how its
whole weights and optimizer states are gathered on process 0, and the averages and flags the
processes agree on. In one process every one of these is the plain thing: the model, its own
state dicts, the value itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..api import build_model
from . import distributed


def resolve_device(name: str) -> torch.device:
    """The device named in a config: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (CUDA when there is one).

    Raises:
        ValueError: ``cuda`` was asked for and there is none.
    """
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device 'cuda' was asked for but no CUDA device is available; ask for the CPU (cpu) or "
            "for auto, which takes CUDA when there is one"
        )
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else ("cpu" if name == "auto" else name))


class Placement:
    """The device and the processes of one run, and the model's place among them.

    Attributes:
        here: this process's place among the training processes.
        device: this process's device (under torchrun, its own GPU).
        parallel: how a launched run spreads the model: ``ddp`` or ``fsdp``.
        wrapped: trained over torchrun's processes (set by :meth:`place`).
        sharded: and sharded, with ``parallel: fsdp`` (set by :meth:`place`).
    """

    def __init__(self, device: str, here: distributed.World | None = None, parallel: str = "ddp") -> None:
        """
        Args:
            device: the config's device name (see :func:`resolve_device`).
            here: the processes training together; None: this one alone.
            parallel: ``ddp`` or ``fsdp``, for a run launched by torchrun.
        """
        self.here, self.parallel = distributed.World() if here is None else here, parallel
        self.device = resolve_device(device)
        if self.device.type == "cuda" and self.here.launched:
            self.device = torch.device("cuda", self.here.local_rank)  # world() made it the process's current device
        self.wrapped = self.sharded = False
        self._whole: Any = None  # a sharded model's weights gathered on process 0, on the CPU: saved and evaluated

    @property
    def home(self) -> torch.device:
        """Where the whole model lives before training: the CPU under FSDP, which moves each
        process's shards to the device; the device otherwise."""
        return torch.device("cpu") if self.sharded else self.device

    def place(self, model: torch.nn.Module, phases: int) -> torch.nn.Module:
        """Decide how ``model`` (of ``phases`` training phases) trains, and move it to :attr:`home`:
        over torchrun's processes if launched (a phase-trained model runs in a job of one,
        unwrapped), sharded with ``parallel: fsdp``."""
        self.wrapped = self.here.launched and phases == 1
        self.sharded = self.wrapped and self.parallel == "fsdp"
        return model.to(self.home)

    def distribute(self, model: torch.nn.Module) -> torch.nn.Module:
        """What the task's loss calls: under ``parallel: fsdp`` the model itself, its parameters
        sharded over the processes in place (so the optimizers see the shards); under ``ddp`` a
        replica that averages gradients; in one process, the model."""
        if self.sharded:
            distributed.fully_shard(model, self.device, self.here)
            return model
        return distributed.replicate(model, self.device) if self.wrapped else model

    # ---- the whole model and its optimizer states, on process 0 --------------------------------
    def gather(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """A sharded model's weights, whole, in a model on process 0's CPU (None elsewhere);
        every process takes part."""
        weights = distributed.gathered_weights(model)
        if not self.here.main:
            return None
        if self._whole is None:
            with torch.random.fork_rng(devices=[]):  # building draws initial weights: leave training's stream alone
                self._whole = build_model(model.config)
        self._whole.load_state_dict(weights)
        return self._whole

    @contextlib.contextmanager
    def whole(self, model: torch.nn.Module) -> Iterator[torch.nn.Module | None]:
        """While inside, ``model`` whole on the device on process 0 (None elsewhere): a sharded
        one gathered (every process takes part), and its copy put back on the CPU after."""
        whole = self.gather(model) if self.sharded else None
        if not self.here.main:
            yield None
        elif not self.sharded:
            yield model
        else:
            try:
                yield whole.to(self.device)
            finally:
                whole.cpu()

    def last_gathered(self, model: torch.nn.Module) -> torch.nn.Module:
        """On process 0, ``model`` whole on the device as :meth:`gather` last gathered it (a
        checkpoint just saved gathers the final weights); an unsharded model itself."""
        return self._whole.to(self.device) if self.sharded else model

    def optimizer_states(self, model: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer]) -> dict[str, dict]:
        """Each optimizer's state dict in one process's layout (gathered on process 0's CPU when
        sharded, empty elsewhere; every process takes part)."""
        if self.sharded:
            return {
                name: distributed.gathered_optimizer(model, optimizer, self.here)
                for name, optimizer in optimizers.items()
            }
        return {name: optimizer.state_dict() for name, optimizer in optimizers.items()}

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load a state saved in one process's layout; each process keeps its shards when sharded."""
        if self.sharded:
            distributed.load_sharded_optimizer(model, optimizer, state)
        else:
            optimizer.load_state_dict(state)

    @property
    def map_location(self) -> torch.device | str:
        """Where a checkpoint's optimizer states are read: the CPU when sharded (each process
        moves only its shards to the device), the device otherwise."""
        return "cpu" if self.sharded else self.device

    # ---- what the processes agree on -----------------------------------------------------------
    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This process's rows of a global batch, on the device."""
        return distributed.shard({k: v.to(self.device) for k, v in batch.items()}, self.here)

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the processes."""
        return distributed.mean(value, self.here, self.device)

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds in any process (so that all act together)."""
        return distributed.any_true(flag, self.here, self.device)

    def barrier(self) -> None:
        distributed.barrier(self.here)
