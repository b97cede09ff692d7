"""Training: one model on one task for a budget of steps, with exact resume.

A run folder holds ``train.json`` (the run's config), what the task derived from its data
(``tokenizer/`` for text tasks), ``checkpoint/`` (``model.safetensors``, ``config.json``,
``optimizer.pt``, ``state.json`` with the learning curve; replaced atomically, see
:mod:`~transformer_zoo.training.checkpoints`), and at the end ``summary.json`` and ``model/``. Batches are
drawn by a generator seeded from (seed, step), so a run resumed from step k sees exactly the
batches an uninterrupted run sees.

One run at a time trains in a run folder (:meth:`Trainer.lock`). A run checkpoints every
``checkpoint_minutes`` and on Ctrl-C, so an interruption loses little; it resumes only with the
config it was started with (:mod:`~transformer_zoo.training.config`), but for its
:data:`~transformer_zoo.training.config.RESUMABLE_FIELDS`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.flop_counter import FlopCounterMode

from ..api import build_model
from ..core.errors import ZooError
from . import distributed
from .checkpoints import (
    CHECKPOINT,
    CheckpointError,
    RunFolderBusy,
    RunFolderError,
    RunLock,
    candidates,
    check_folder,
    check_weights,
    first_non_finite,
    load_weights,
    optimizer_tensors,
    promote,
    read_optimizers,
    read_state,
    remove_partial_files,
    warn_passed_over,
    write_checkpoint,
)
from .config import (  # noqa: F401  (load_train_config and RESUMABLE_FIELDS are imported from here too)
    RESUMABLE_FIELDS,
    TrainConfig,
    config_changes,
    load_train_config,
    lr_factor,
    model_config_for,
)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available; ask for the CPU (cpu) or "
                         "for auto, which takes CUDA when there is one")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else ("cpu" if name == "auto" else name))


def fused_adamw(device: torch.device, sharded: bool = False) -> bool:
    """Whether AdamW takes its fused kernel: on CUDA, where it updates every parameter in a few
    launches instead of a dozen per parameter group (a bert-base step spent 4% of its time in the
    unfused update); not over FSDP's sharded parameters."""
    return device.type == "cuda" and not sharded


def phase_optimizers(model, config: TrainConfig, fused: bool = False) -> tuple[list, dict, dict]:
    """The model's phases, with an AdamW optimizer and a learning-rate schedule for each
    (``fused``: AdamW's fused kernel).

    Raises:
        ValueError: the phases are unnamed, named twice, or do not train every trainable
            parameter exactly once.
    """
    phases = model.phases()
    names = [phase.name for phase in phases]
    if len(set(names)) != len(names) or not phases:
        raise ValueError(f"{type(model).__name__}.phases() must name one or more phases, each once; got {names}")
    trained = [id(p) for phase in phases for p in phase.parameters if p.requires_grad]
    if len(set(trained)) != len(trained) or set(trained) != {id(p) for p in model.parameters() if p.requires_grad}:
        raise ValueError(f"{type(model).__name__}.phases() {names} must train every trainable parameter of the model "
                         "exactly once: one phase's parameters may not be in another, and none may be left out")
    optimizers, schedulers = {}, {}
    for phase in phases:
        settings = ({} if phase.betas is None else {"betas": phase.betas}) | ({"fused": True} if fused else {})
        optimizers[phase.name] = torch.optim.AdamW(
            phase.parameters, lr=config.lr * phase.lr_scale,
            weight_decay=config.weight_decay if phase.weight_decay is None else phase.weight_decay, **settings)
        schedulers[phase.name] = LambdaLR(optimizers[phase.name], lambda step: lr_factor(step, config))
    return phases, optimizers, schedulers


@contextlib.contextmanager
def trains_only(parameters, model) -> Iterator[None]:
    """Freeze every parameter of ``model`` but ``parameters`` (no gradient is computed for them)."""
    keep = {id(p) for p in parameters}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


class TrainingDiverged(ZooError, RuntimeError):
    """A loss, weight or optimizer state became NaN or infinite. Nothing non-finite is saved:
    the message says which checkpoint the run folder keeps (if any) and what to try."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped at Ctrl-C (SIGINT), after saving the step it had reached; the message
    says at which step, what is saved and how to resume. A ``KeyboardInterrupt``, so code that
    lets Ctrl-C through lets this through too.

    Attributes:
        step: the last step taken (None: interrupted before training began).
        saved: the step of the checkpoint in the run folder (None: there is none).
    """

    def __init__(self, message: str, step: int | None = None, saved: int | None = None) -> None:
        super().__init__(message)
        self.step, self.saved = step, saved

    def __reduce__(self) -> tuple:
        return type(self), (self.args[0], self.step, self.saved)


@contextlib.contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """While inside, Ctrl-C (SIGINT) asks to stop: the event yielded is set, for the training
    loop to stop after the step under way (a step is never half applied); a second Ctrl-C
    raises ``KeyboardInterrupt`` at once. Only in the main thread, and only over Python's own
    handler: a handler set by the caller (or SIGINT ignored, as in compare's workers) stays."""
    requested = threading.Event()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield requested
        return

    def ask_to_stop(signum: int, frame: Any) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, ask_to_stop)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10G": 70.0}
"""Dense bfloat16 tensor-core peaks (no sparsity) by device name, from the vendors' data sheets;
the first key found in the device's name wins, so the more specific names come first."""


def datasheet_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of a known GPU (:data:`PEAK_BF16_TFLOPS`); None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def peak_tflops(config: TrainConfig, device: torch.device) -> float | None:
    """The peak MFU is measured against: ``config.peak_tflops``, else a known GPU's bf16 peak."""
    if config.peak_tflops is not None:
        return config.peak_tflops
    return datasheet_tflops(device) if config.bf16 else None


def flop_rates(step_flops: float | None, steps: int, seconds: float, peak: float | None,
               processes: int) -> dict[str, float | None]:
    """The summary's FLOP figures: one step's FLOPs (``step_flops``, of the global batch), the
    rate over ``steps`` steps in ``seconds``, and the model FLOPs utilisation of ``processes``
    devices of ``peak`` TFLOP/s each; None where nothing was counted or no peak is known."""
    rate = step_flops * steps / max(seconds, 1e-9) if steps > 0 and step_flops is not None else None
    return {
        "train_flops_per_step": step_flops if steps > 0 else None,
        "train_tflops_per_second": None if rate is None else rate / 1e12,
        "mfu": None if rate is None or peak is None else rate / (peak * 1e12 * processes),
    }


class Trainer:
    """One training run, in parts: :meth:`lock` holds the run folder, :meth:`setup` builds the
    task, the model and its optimizers (continuing from the run folder's checkpoint),
    :meth:`batch` draws a step's batch, :meth:`step` takes one optimizer step of every phase,
    :meth:`evaluate` scores the model, :meth:`save` writes a checkpoint, and :meth:`run` trains
    to the budget and returns the summary.

    Under torchrun each process runs its own trainer over its share of every global batch (see
    :mod:`~transformer_zoo.training.distributed`); process 0 writes the run folder and evaluates.

    Attributes:
        task: the task (given, or built by :meth:`setup`).
        model: the model trained (sharded in place under ``parallel: fsdp``).
        phases: the model's training phases, stepped in turn on every batch.
        optimizers, schedulers: each phase's AdamW and learning-rate schedule, by phase name.
        start: the first step :meth:`run` takes (the checkpoint's step when resuming).
        reached: the last step taken.
        saved: the step of the run folder's checkpoint (None: it has none).
        resumed_from: the checkpoint's step when resuming; None for a run from scratch.
        history: the learning curve so far.
        step_flops: FLOPs of one step over the global batch, counted on :meth:`run`'s first step.
    """

    def __init__(self, config: TrainConfig, run_dir: str | os.PathLike | None = None, *, task: Any = None,
                 progress: bool = True, world: distributed.World | None = None) -> None:
        """
        Args:
            run_dir: the run folder (None: a trainer that never saves, to measure a step).
            task: ``config.task`` already built; None: :meth:`setup` builds it.
            progress: show a progress bar with loss and throughput.
            world: the processes training together; None: those torchrun started, or this one.
        """
        self.here = distributed.world() if world is None else world
        if self.here.size > 1 and config.batch_size % self.here.size:
            raise ValueError(f"batch_size {config.batch_size} is the global batch, split over {self.here.size} "
                             f"processes; use a multiple of {self.here.size}")
        self.config, self.task, self.progress = config, task, progress
        self.run_dir = None if run_dir is None else check_folder(run_dir, "run folder")
        self.device = resolve_device(config.device)
        if self.device.type == "cuda" and self.here.launched:
            self.device = torch.device("cuda", self.here.local_rank)  # world() made it the process's current device
        self.bf16 = config.bf16 and self.device.type == "cuda"
        self.wrapped = self.sharded = False  # trained over torchrun's processes; with parallel: fsdp
        self.model: Any = None
        self.phases: list = []
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, LambdaLR] = {}
        self.start, self.history, self.tokens = 0, [], 0
        self.reached = 0
        self.saved: int | None = None
        self.resumed_from: int | None = None
        self.step_flops: float | None = None
        self._replica: Any = None  # what the loss calls (set by attach): the model, or DDP's replica of it
        self._trained_loss: Any = None  # the loss of a step (set by attach): eager_loss, compiled with compile: true
        self._whole = None  # a sharded model's weights gathered on process 0, on the CPU: what is saved and evaluated
        self._read_optimizers: tuple[Path, dict] | None = None  # checked by load_checkpoint, for load_optimizer_states
        self._saved_at = time.monotonic()  # when the last checkpoint was written (or training began)

    # ---- setup ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator[Trainer]:
        """Hold the run folder for this run: process 0 takes its lock at once or not at all,
        every process learns which, and what interrupted writes left is removed. ``train``
        holds it; hold it too when driving a trainer by hand.

        Raises:
            RunFolderBusy: another run holds the folder; the message names its pid.
        """
        held = RunLock(self.run_dir) if self.here.main and self.run_dir is not None else None
        refused = None
        try:
            if held is not None:
                held.acquire()
        except RunFolderBusy as exc:
            refused, held = exc, None
        if distributed.any_true(refused is not None, self.here, self.device):
            raise refused or RunFolderBusy(f"run folder {str(self.run_dir)!r} is in use by another training run")
        try:
            if held is not None:
                remove_partial_files(self.run_dir)
            yield self
        finally:
            if held is not None:
                held.release()

    def setup(self, resume: bool = True) -> Trainer:
        """Build the task, the model and its optimizers, and write ``train.json``; with ``resume``,
        continue from the run folder's newest intact checkpoint, if it has one (and the run's
        config is the one it was started with, but for :data:`RESUMABLE_FIELDS`); without,
        remove the folder's checkpoints, whose steps belong to another run.

        Raises:
            RunFolderError: the run folder's run was trained with another config.
            CheckpointError: no checkpoint of the folder can be resumed.
        """
        found = self.resumable() if resume else []
        if found:  # the run's own tokenizer (or other assets), whatever the data is now
            self.task = self.config.task.with_assets(self.run_dir).build()
        elif self.task is None:
            self.task = self.config.task.build()
        self.model = self.build_model()
        checkpoint = self.resume_from(found)
        self.attach(self.model)
        if checkpoint is not None:
            self.load_optimizer_states(checkpoint)
        if self.run_dir is not None:
            self.write_run_folder(checkpoint)
        return self

    def resumable(self) -> list[Path]:
        """The run folder's checkpoints, newest first (see :func:`~transformer_zoo.training.checkpoints.candidates`),
        once the config is checked to be the run's.

        Raises:
            RunFolderError: the folder's ``train.json`` differs from the config in other fields
                than :data:`RESUMABLE_FIELDS`, or does not validate.
        """
        found = [] if self.run_dir is None else candidates(self.run_dir)
        path = None if self.run_dir is None else self.run_dir / "train.json"
        if not found or not path.is_file():
            return found
        try:
            before = load_train_config(path)
        except (ZooError, ValueError) as exc:
            raise RunFolderError(f"{path} does not validate ({exc}); start over with --restart, or train into "
                                 "another --out") from None
        changes = config_changes(before, self.config)
        if changes:
            raise RunFolderError(
                f"run folder {str(self.run_dir)!r} holds a run trained with another config ({'; '.join(changes)}); "
                f"only {', '.join(sorted(RESUMABLE_FIELDS))} may change when a run resumes: start over with "
                "--restart, or train into another --out")
        return found

    def resume_from(self, found: list[Path]) -> Path | None:
        """Load the first of ``found`` that reads (:meth:`load_checkpoint`), with a warning for
        each one passed over; None when ``found`` is empty.

        Raises:
            CheckpointError: none of them reads; the message names each file and the way out.
        """
        problems = []
        for checkpoint in found:
            try:
                self.load_checkpoint(checkpoint)
            except CheckpointError as exc:
                problems.append(str(exc))
                continue
            warn_passed_over(problems, checkpoint, self.start)
            return checkpoint
        if problems:
            raise CheckpointError(f"cannot resume {str(self.run_dir)!r}: {'; '.join(problems)}; no intact checkpoint is "
                                  "left: start over with --restart, or train into another --out")
        return None

    def write_run_folder(self, checkpoint: Path | None) -> None:
        """Process 0, once every process has read ``checkpoint``: it becomes the folder's
        ``checkpoint`` (the other checkpoint folders are removed), and ``train.json`` and the
        task's assets are written."""
        distributed.barrier(self.here)
        if not self.here.main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        promote(self.run_dir, checkpoint)
        (self.run_dir / "train.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=2))
        if checkpoint is None:
            self.task.save_assets(self.run_dir)

    @property
    def home(self) -> torch.device:
        """Where the whole model lives before training: the CPU under FSDP, which moves each
        process's shards to the device; the device otherwise."""
        return torch.device("cpu") if self.sharded else self.device

    def build_model(self) -> torch.nn.Module:
        """The model for the task, initialised from the seed, in train mode on :attr:`home`.

        Raises:
            ValueError: the model trains in several phases, over processes or compiled.
        """
        torch.manual_seed(self.config.seed)
        model = build_model(model_config_for(self.config, self.task))
        phases = [phase.name for phase in model.phases()]
        if len(phases) > 1 and (self.here.size > 1 or self.config.compile):
            raise ValueError(f"{model.config.variant!r} trains in phases {phases}; training over several processes "
                             "and compile: true are for one-phase models: run it in one process, eager")
        self.wrapped = self.here.launched and len(phases) == 1  # a phase-trained model runs in a job of one, unwrapped
        self.sharded = self.wrapped and self.config.parallel == "fsdp"
        return model.to(self.home).train()

    def attach(self, model: torch.nn.Module) -> Trainer:
        """Train ``model`` from here: spread over the processes (:meth:`distribute`), with each
        phase's optimizer and schedule, and its loss compiled with ``compile: true``."""
        self.model = model
        self._replica = self.distribute(model)
        self.phases, self.optimizers, self.schedulers = phase_optimizers(
            model, self.config, fused_adamw(self.device, self.sharded))
        # compiled, the task's loss is one graph with the model: the float32 cross-entropy over the vocabulary fuses
        # with the logits' cast (a compiled bf16 step of bert-base took 17% less time than with the loss left eager)
        self._trained_loss = torch.compile(self.eager_loss) if self.config.compile else self.eager_loss
        return self

    def distribute(self, model: torch.nn.Module) -> torch.nn.Module:
        """What the task's loss calls: under ``parallel: fsdp`` the model itself, its parameters
        sharded over the processes in place (so the optimizers see the shards); under ``ddp`` a
        replica that averages gradients; in one process, the model."""
        if self.sharded:
            distributed.fully_shard(model, self.device, self.here)
            return model
        return distributed.replicate(model, self.device) if self.wrapped else model

    @functools.cached_property
    def train_data(self):
        """The task's training split."""
        return self.task.dataset("train")

    # ---- a step -----------------------------------------------------------------------------
    def step_seed(self, step: int) -> int:
        """The seed of step ``step``'s batch: the same whatever ran before it, so resuming is exact."""
        return (self.config.seed * 1_000_003 + step) % 2**64  # the generator's range; smaller seeds are unchanged

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """Step ``step``'s batch, on the device: ``batch_size`` examples drawn by a generator
        seeded from (seed, step); under torchrun, this process's rows of that global batch
        (every process draws the same one, masking included), and dropout seeded per process."""
        if self.here.launched:
            torch.manual_seed(self.step_seed(step))
        generator = torch.Generator().manual_seed(self.step_seed(step))
        index = torch.randint(len(self.train_data), (self.config.batch_size,), generator=generator).tolist()
        rows = self.train_data[index]
        batch = self.task.collate([dict(zip(rows, values)) for values in zip(*rows.values())])
        batch = distributed.shard({k: v.to(self.device) for k, v in batch.items()}, self.here)
        if self.here.launched:
            torch.manual_seed((self.step_seed(step) * 1009 + 1 + self.here.rank) % 2**64)
        return batch

    def eager_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss of a one-phase model on ``batch``, as the task computes it (through DDP's replica)."""
        # a task written before phases existed takes (model, batch)
        return self.task.loss(self._replica, batch)

    def loss(self, phase: str, batch: dict[str, torch.Tensor], *, eager: bool = False) -> torch.Tensor:
        """``phase``'s loss on ``batch``; a one-phase model's through the compiled graph with
        ``compile: true``, unless ``eager``."""
        if len(self.phases) > 1:
            return self.task.loss(self.model, batch, phase)
        return self.eager_loss(batch) if eager else self._trained_loss(batch)

    def step(self, step: int, batch: dict[str, torch.Tensor] | None = None, *, eager: bool = False) -> dict[str, float]:
        """One optimizer step of every phase in turn, each with the others frozen, on ``batch``
        (None: :meth:`batch` of ``step``); returns each phase's loss.

        Raises:
            TrainingDiverged: a loss was not finite (in any process).
        """
        batch = self.batch(step) if batch is None else batch
        losses = {}
        for phase in self.phases:
            alone = trains_only(phase.parameters, self.model) if len(self.phases) > 1 else contextlib.nullcontext()
            with alone:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                    loss = self.loss(phase.name, batch, eager=eager)
                self.check_finite(loss, phase.name, step)
                self.optimizers[phase.name].zero_grad(set_to_none=True)
                loss.backward()
                if self.config.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(phase.parameters, self.config.grad_clip)
                self.optimizers[phase.name].step()
                self.schedulers[phase.name].step()
            losses[phase.name] = loss.item()
        return losses

    def check_finite(self, loss: torch.Tensor, phase: str, step: int) -> None:
        """Stop every process when ``loss`` is not finite in any of them.

        Raises:
            TrainingDiverged: saying what the run folder keeps and what to try.
        """
        if distributed.any_true(not torch.isfinite(loss), self.here, self.device):
            raise self.diverged(f"{phase} loss became {loss.item()} at step {step + 1}")

    def diverged(self, what: str) -> TrainingDiverged:
        """The error of a run stopped by ``what`` (a non-finite value): the checkpoint kept, if
        any, and what to try. Resuming repeats the same steps exactly, so it would diverge again."""
        if self.run_dir is None:
            kept = ""
        elif self.saved is None:
            kept = "; no checkpoint was written, so the next run starts from step 0"
        else:
            kept = f"; kept: the checkpoint of step {self.saved} in {self.run_dir / CHECKPOINT} (every value finite)"
        clip = "set grad_clip" if self.config.grad_clip is None else f"a lower grad_clip (now {self.config.grad_clip})"
        retry = f"start over (--restart) with a lower lr (now {self.config.lr}) or {clip}"
        if self.resumed_from is not None:
            return TrainingDiverged(f"{what}{kept}; this run resumed from step {self.resumed_from} and diverged again, "
                                    f"as resuming the same steps will: {retry}")
        return TrainingDiverged(f"{what}{kept}; {retry} (resuming would take the same steps again)")

    def counted_step(self, step: int, batch: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, float], float]:
        """:meth:`step`, run eagerly under PyTorch's FLOP counter: the losses, and the FLOPs of
        its forward and backward passes over the global batch (every process's share).

        Eagerly, because a compiled loss first called under the counter would never compile."""
        with FlopCounterMode(display=False) as counter:
            losses = self.step(step, batch, eager=True)
        return losses, counter.get_total_flops() * self.here.size

    # ---- evaluate, save, resume ---------------------------------------------------------------
    def gather(self) -> torch.nn.Module | None:
        """A sharded model's weights, whole, in a model on process 0's CPU (None elsewhere);
        every process takes part."""
        weights = distributed.gathered_weights(self.model)
        if not self.here.main:
            return None
        if self._whole is None:
            with torch.random.fork_rng(devices=[]):  # building draws initial weights: leave training's stream alone
                self._whole = build_model(self.model.config)
        self._whole.load_state_dict(weights)
        return self._whole

    def evaluate(self, split: str) -> dict[str, float] | None:
        """The trained model's scores on ``split``, from process 0 (None elsewhere)."""
        whole = self.gather() if self.sharded else None
        if not self.here.main:
            return None
        if not self.sharded:
            return self.task.evaluate(self.model, split)
        try:
            return self.task.evaluate(whole.to(self.device), split)
        finally:
            whole.cpu()

    def save(self, step: int) -> None:
        """Checkpoint ``step`` into the run folder (written by process 0, every process taking part).

        Raises:
            TrainingDiverged: a weight or an optimizer state is not finite; nothing is written,
                and the run folder keeps its checkpoint.
        """
        if self.run_dir is None:
            raise ValueError("this Trainer has no run folder to save into; give run_dir to Trainer(...)")
        if self.sharded:
            model = self.gather()
            states = {name: distributed.gathered_optimizer(self.model, optimizer, self.here)
                      for name, optimizer in self.optimizers.items()}
        else:
            model, states = self.model, {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}
        bad = None
        if self.here.main:
            bad = first_non_finite(model.state_dict().items()) or first_non_finite(optimizer_tensors(states))
        if distributed.any_true(bad is not None, self.here, self.device):
            since = "" if self.saved is None else f" after step {self.saved}"
            raise self.diverged(f"{bad or 'a value'} became non-finite{since}, by step {step} (not saved)")
        if self.here.main:
            write_checkpoint(self.run_dir, model, states,
                             {name: scheduler.state_dict() for name, scheduler in self.schedulers.items()},
                             self.random_state(step))
        distributed.barrier(self.here)
        self.saved, self._saved_at = step, time.monotonic()

    def random_state(self, step: int) -> dict[str, Any]:
        """``state.json``'s contents at ``step``: the step, the random state and the learning curve."""
        state = {"step": step, "rng": torch.get_rng_state().tolist(), "history": self.history}
        if self.device.type == "cuda":  # dropout on CUDA draws from the device's generator
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device).tolist()
        return state

    def load_checkpoint(self, checkpoint: Path) -> None:
        """Continue from ``checkpoint``: its weights (into the model before :meth:`attach`), its
        step, learning curve and random state. Every file is checked first, the optimizer
        states too (kept for :meth:`load_optimizer_states`), so that nothing of a checkpoint
        that does not read is taken.

        Raises:
            CheckpointError: a file is missing, does not read, does not fit the model, or holds
                a value out of place (a step beyond ``steps``, a non-finite weight); the
                message names the file.
        """
        state = read_state(checkpoint, self.config.steps)
        check_weights(checkpoint, self.model)
        phases = {phase.name: list(phase.parameters) for phase in self.model.phases()}
        # sharded: read on the CPU, and each process moves only its shards to the device
        states = read_optimizers(checkpoint, phases, state["step"], "cpu" if self.sharded else self.device)
        load_weights(checkpoint, self.model, self.home)
        self._read_optimizers = (checkpoint, states)
        self.start = self.reached = self.saved = self.resumed_from = state["step"]
        self.history = state["history"]
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(torch.tensor(state["cuda_rng"], dtype=torch.uint8), self.device)

    def load_optimizer_states(self, checkpoint: Path) -> None:
        """Each phase's optimizer and schedule state from ``checkpoint`` (after :meth:`attach`).

        Raises:
            CheckpointError: the checkpoint holds the optimizers of other phases, or states that
                do not fit them.
        """
        read, self._read_optimizers = self._read_optimizers, None
        if read is not None and read[0] == checkpoint:
            states = read[1]
        else:
            phases = {phase.name: list(phase.parameters) for phase in self.phases}
            states = read_optimizers(checkpoint, phases, self.start, "cpu" if self.sharded else self.device)
        try:
            for name, optimizer in self.optimizers.items():
                state = states["optimizers"][name]
                if self.sharded:
                    distributed.load_sharded_optimizer(self.model, optimizer, state)
                else:
                    optimizer.load_state_dict(state)
                self.schedulers[name].load_state_dict(states["schedulers"][name])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{checkpoint / 'optimizer.pt'} does not load into the optimizers ({exc}); start "
                                  "over with --restart, or train into another --out") from None

    # ---- the run ------------------------------------------------------------------------------
    def run(self, stop_after: int | None = None) -> dict[str, Any]:
        """Train from :attr:`start` to ``steps`` (or ``max_seconds``), checkpoint, evaluate and
        return the summary (also in ``summary.json``, with the model in ``model/``).

        Args:
            stop_after: stop (after checkpointing) once this step is reached, as an interruption
                would; returns ``{"step", "stopped": True}``.

        Raises:
            TrainingInterrupted: Ctrl-C; the step reached is saved first (a second Ctrl-C
                stops at once, keeping the last checkpoint).
            TrainingDiverged: a loss, weight or optimizer state became non-finite.
        """
        end = self.config.steps if stop_after is None else min(self.config.steps, stop_after)
        started = time.perf_counter()
        try:
            end = self.train_steps(end, started)
            elapsed = time.perf_counter() - started
            self.save(end)
            if stop_after is not None and end < self.config.steps:
                return {"step": end, "stopped": True}
            if not self.here.main:
                return {"step": end, "rank": self.here.rank}
            return self.summary(end, elapsed)
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C, or one outside the steps: the last checkpoint stands
            raise self.interrupted() from None

    def train_steps(self, end: int, started: float) -> int:
        """Steps :attr:`start` up to ``end``, the first counted; returns the step reached (earlier
        than ``end`` when ``max_seconds`` ran out). Ctrl-C stops it after the step under way."""
        self._saved_at = time.monotonic()
        with self.progress_bar() as bar, stop_requests() as stop:
            shown = bar.add_task(f"{self.config.task.kind}", total=self.config.steps, completed=self.start, status="")
            for step in range(self.start, end):
                batch = self.batch(step)
                if step == self.start:
                    losses, self.step_flops = self.counted_step(step, batch)
                else:
                    losses = self.step(step, batch)
                self.tokens += self.task.tokens_in(batch) * self.here.size
                self.reached = step + 1
                loss = self.after_step(step + 1, losses)
                rate = self.tokens / (time.perf_counter() - started)
                bar.update(shown, completed=step + 1, status=f"loss {loss:.3f}  {rate:,.0f} tok/s")
                if distributed.any_true(stop.is_set(), self.here, self.device):
                    self.stop(step + 1)
                if self.out_of_time(started):
                    return step + 1  # the time budget is spent: finish as if this were the last step
        return end

    def stop(self, done: int) -> None:
        """Save step ``done`` (unless its checkpoint is written) and raise :class:`TrainingInterrupted`."""
        if self.run_dir is not None and self.saved != done:
            self.save(done)
        raise self.interrupted()

    def interrupted(self) -> TrainingInterrupted:
        """The interruption of this run, saying where it stopped, what is saved and how to resume."""
        where = f"at step {self.reached} of {self.config.steps}" if self.model is not None else "before training began"
        if self.run_dir is None:
            saved = "; nothing is saved (the trainer has no run folder)"
        elif self.saved is None:
            saved = "; no checkpoint is saved: the next run starts from step 0"
        else:
            kept = "saved" if self.saved == self.reached else "without saving it; kept"
            saved = (f", {kept}: the checkpoint of step {self.saved} in {self.run_dir / CHECKPOINT}; run the same "
                     f"command again to resume from step {self.saved}")
        return TrainingInterrupted(f"interrupted {where}{saved}", self.reached if self.model is not None else None,
                                   self.saved)

    def after_step(self, done: int, losses: dict[str, float]) -> float:
        """The learning curve, evaluation and checkpoint due after step ``done``; returns the
        headline loss (the first phase's; the global batch's where recorded)."""
        config, first = self.config, self.phases[0].name
        loss = losses[first]
        if done % config.log_every == 0 or done == config.steps:
            loss = distributed.mean(loss, self.here, self.device)  # the global batch's
            phase_losses = {f"loss_{name}": value for name, value in losses.items()} if len(self.phases) > 1 else {}
            self.history.append({"step": done, "loss": loss, **phase_losses,
                                 "lr": self.schedulers[first].get_last_lr()[0]})
        if config.eval_every and done % config.eval_every == 0 and done != config.steps:
            scores = self.evaluate("test")
            if self.here.main:
                self.history.append({"step": done, **{f"test_{k}": v for k, v in scores.items()}})
        if (config.checkpoint_every and done % config.checkpoint_every == 0) or self.checkpoint_due():
            self.save(done)
        return loss

    def checkpoint_due(self) -> bool:
        """Whether ``checkpoint_minutes`` have passed since the last checkpoint (in any process,
        so that all save together)."""
        if self.config.checkpoint_minutes is None or self.run_dir is None:
            return False
        due = time.monotonic() - self._saved_at >= 60 * self.config.checkpoint_minutes
        return distributed.any_true(due, self.here, self.device)

    def out_of_time(self, started: float) -> bool:
        """Whether ``max_seconds`` of training have passed (in any process, so that all stop together)."""
        if self.config.max_seconds is None:
            return False
        spent = time.perf_counter() - started >= self.config.max_seconds
        return distributed.any_true(spent, self.here, self.device)

    def progress_bar(self) -> Progress:
        """A bar of steps with the loss and throughput (process 0's, when ``progress``)."""
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TextColumn("{task.fields[status]}"), TimeRemainingColumn(),
                        disable=not (self.progress and self.here.main), transient=True)

    def summary(self, end: int, elapsed: float) -> dict[str, Any]:
        """Process 0's summary of a run that reached step ``end`` in ``elapsed`` seconds, after
        :meth:`save`: scores on every split but train, sizes, throughput and the learning curve;
        written to ``summary.json``, and the model to ``model/``."""
        held = distributed.held_parameters(self.model)
        model = self._whole.to(self.device) if self.sharded else self.model  # save() has just gathered the final weights
        metrics = {split: self.task.evaluate(model, split) for split in self.task.splits if split != "train"}
        summary = {
            "step": end,
            "train_seconds": elapsed,
            "metrics": metrics,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameters_per_process": held,  # process 0's shards with parallel: fsdp, else every parameter
            "processes": self.here.size,
            "parallel": self.config.parallel if self.wrapped else None,  # under torchrun: ddp or fsdp
            "train_tokens_per_second": self.tokens / max(elapsed, 1e-9),
            **flop_rates(self.step_flops, end - self.start, elapsed, peak_tflops(self.config, self.device), self.here.size),
            "history": self.history,
            "resumed_from": self.resumed_from,  # the checkpoint's step this invocation began at; None: from scratch
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        model.save_pretrained(self.run_dir / "model")
        return summary


def train(config: TrainConfig, run_dir: str | os.PathLike, *, resume: bool = True, progress: bool = True,
          stop_after: int | None = None, task: Any = None) -> dict[str, Any]:
    """Train ``config.model`` on ``config.task``; returns the run summary (also in ``summary.json``).

    Args:
        run_dir: the run folder; an existing checkpoint there is resumed when ``resume``.
        progress: show a progress bar with loss and throughput.
        stop_after: stop (after checkpointing) once this step is reached, as an interruption would.
        task: ``config.task`` already built (a comparison builds each task once for all its
            seeds); None: built here.

    Raises:
        RunFolderBusy: another run trains in ``run_dir``.
        RunFolderError: ``run_dir`` is a file, or holds a run of another config (see
            :data:`RESUMABLE_FIELDS`).
        CheckpointError: no checkpoint in ``run_dir`` can be resumed.
        TrainingDiverged: a loss, weight or optimizer state became non-finite.
        TrainingInterrupted: Ctrl-C, after saving the step reached.
    """
    trainer = Trainer(config, run_dir, task=task, progress=progress)
    try:
        with trainer.lock():
            return trainer.setup(resume).run(stop_after)
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:  # while setting up: the run folder is as it was
        raise trainer.interrupted() from None


def load_run(run_dir: str | os.PathLike) -> tuple[TrainConfig, Any, torch.nn.Module]:
    """The config, task and trained model (in eval mode) of a finished run folder."""
    from ..api import from_pretrained

    run_dir = Path(run_dir)
    if not (run_dir / "train.json").is_file() or not (run_dir / "model").is_dir():
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a finished run folder: expected train.json and model/ written by tzoo train"
        )
    config = load_train_config(run_dir / "train.json")
    model = from_pretrained(run_dir / "model").to(resolve_device(config.device)).eval()
    return config, config.task.with_assets(run_dir).build(), model


def evaluate_run(run_dir: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Score the model of a finished run (``run_dir/model``) on its task's test splits."""
    _, task, model = load_run(run_dir)
    return {split: task.evaluate(model, split) for split in task.splits if split != "train"}
