"""Training: one model on one task for a budget of steps, with exact resume.

A run folder holds ``train.json`` (the run's config), ``plugins.json`` (which plugin module
provided each kind it uses), what the task derived from its data (``tokenizer/`` for text
tasks), ``checkpoint/`` (``model.safetensors``, ``config.json``, ``optimizer.pt``, ``state.json``
with the learning curve; replaced atomically, see :mod:`~transformer_zoo.training.run_folder`),
and at the end ``summary.json`` and ``model/``. Batches are drawn by a generator seeded from
(seed, step), so a run resumed from step k sees exactly the batches an uninterrupted run sees.

One run at a time trains in a run folder (:meth:`Trainer.lock`). A run checkpoints every
``checkpoint_minutes`` and on Ctrl-C, so an interruption loses little; it resumes only with the
config it was started with (:mod:`~transformer_zoo.training.config`), but for its
:data:`~transformer_zoo.training.config.RESUMABLE_FIELDS`.

:class:`Trainer` runs the loop over three parts, each readable alone: its
:class:`~transformer_zoo.training.placement.Placement` (the device and processes), its
:class:`~transformer_zoo.training.checkpointing.Checkpointer` (the run folder) and its
:class:`~transformer_zoo.training.step.Stepper` (batches, losses, optimizer steps).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from ..api import build_model, from_pretrained
from ..core.errors import naming
from ..registry import get_registry
from . import distributed
from .checkpointing import Checkpointer
from .config import TrainConfig, load_train_config, model_config_for
from .holdout import VALIDATION, held_out
from .interrupts import TrainingInterrupted, stop_requests
from .placement import Placement, resolve_device
from .run_folder import CHECKPOINT, check_folder, read_plugins
from .step import Stepper, TrainingDiverged, flop_rates, peak_tflops
from .tracking import Trackers


@dataclass(frozen=True)
class SharedStart:
    """Which parameters of a run started from the values of the models its ``shared_init``
    names (:meth:`Trainer.take_initial_values`), by name (a tied weight under its first name).

    Attributes:
        shared: those that did, in the model's order.
        own: those that kept the run's own initial values.
        shared_weights: the elements of the ``shared`` parameters together.
    """

    shared: list[str]
    own: list[str]
    shared_weights: int


@dataclass(frozen=True)
class Reached:
    """Where :meth:`Trainer.run_until` stopped: the ``step``, the ``scores`` asked for there, and
    the run's ``summary`` once it ended (a torchrun process but 0: its step and rank)."""

    step: int
    scores: dict[str, float] | None = None
    summary: dict[str, Any] | None = None


class Trainer:
    """One training run, in parts: :meth:`lock` holds the run folder, :meth:`setup` builds the
    task, the model and its optimizers (continuing from the run folder's checkpoint),
    :meth:`batch` draws a step's batch, :meth:`step` takes one optimizer step of every phase,
    :meth:`evaluate` scores the model, :meth:`save` writes a checkpoint, :meth:`run` trains
    to the budget and returns the summary, and :meth:`run_until` trains part of it at a time.

    The trainer holds the loop's state and three parts: :attr:`placement` (the device, and the
    model's place among the processes), :attr:`checkpointer` (the run folder: lock, resume,
    save) and, once a model is attached, :attr:`stepper` (batches, losses and optimizer steps).

    Under torchrun each process runs its own trainer over its share of every global batch (see
    :mod:`~transformer_zoo.training.distributed`); process 0 writes the run folder and evaluates.

    Attributes:
        placement, checkpointer, stepper: the trainer's parts (the stepper from :meth:`attach` on).
        task: the task (given, or built by :meth:`setup`).
        model: the model trained (sharded in place under ``parallel: fsdp``).
        start: the first step of the latest :meth:`run_until` (the checkpoint's step when resuming).
        reached: the last step taken.
        history: the learning curve so far.
        step_flops: FLOPs of one step over the global batch, counted on the first step this trainer takes,
            or taken from the checkpoint it resumes (see :meth:`~transformer_zoo.training.step.Stepper.counted_step`).
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | os.PathLike | None = None,
        *,
        task: Any = None,
        progress: bool = True,
        world: distributed.World | None = None,
        name: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        """
        Args:
            run_dir: the run folder (None: a trainer that never saves, to measure a step).
            task: ``config.task`` already built; None: :meth:`setup` builds it.
            progress: show a progress bar with loss and throughput.
            world: the processes training together; None: those torchrun started, or this one.
            name, tags: the run's name (default: its folder's) and tags for its trackers.
        """
        here = distributed.world() if world is None else world
        if here.size > 1 and config.batch_size % here.size:
            raise ValueError(
                f"batch_size {config.batch_size} is the global batch, split over {here.size} "
                f"processes; use a multiple of {here.size}"
            )
        self.config, self.task, self.progress = config, task, progress
        self.run_dir = None if run_dir is None else check_folder(run_dir, "run folder")
        self.placement = Placement(config.device, here, config.parallel)
        self.checkpointer = Checkpointer(config, self.run_dir, self.placement)
        self.stepper: Stepper | None = None  # made by attach
        self.model: Any = None
        self.start, self.reached, self.history, self.tokens = 0, 0, [], 0
        self.step_flops: float | None = None
        self.shared: SharedStart | None = None  # set by build_model, with shared_init
        self.name, self.tags, self.trackers = name, tags or {}, Trackers([])  # opened by run_until
        self._started = time.perf_counter()

    # ---- setup ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator[Trainer]:
        """Hold the run folder for this run
        (:meth:`~transformer_zoo.training.checkpointing.Checkpointer.lock`). ``train`` holds it;
        hold it too when driving a trainer by hand.

        Raises:
            RunFolderBusy: another run holds the folder; the message names its pid.
        """
        with self.checkpointer.lock():
            yield self

    def setup(self, resume: bool = True) -> Trainer:
        """Build the task, the model and its optimizers, and write ``train.json``; with ``resume``,
        continue from the run folder's newest intact checkpoint, if it has one (and the run's
        config is the one it was started with, but for :data:`~transformer_zoo.training.config.RESUMABLE_FIELDS`); without,
        remove the folder's checkpoints, whose steps belong to another run.

        Raises:
            RunFolderError: the run folder's run was trained with another config.
            CheckpointError: no checkpoint of the folder can be resumed.
        """
        found = self.checkpointer.resumable() if resume else []
        if found:  # the run's own tokenizer (or other assets), whatever the data is now
            self.task = self.config.task.with_assets(self.run_dir).build()
        elif self.task is None:
            self.task = self.config.task.build()
        self.task = held_out(self.task, self.config.holdout, self.config.holdout_seed)  # the task itself for None
        self.model = self.build_model()
        checkpoint, state = self.checkpointer.resume_from(found, self.model)
        if state is not None:
            self.resumed(state)
        self.attach(self.model)
        if checkpoint is not None:
            self.load_optimizer_states(checkpoint)
        if self.run_dir is not None:
            self.checkpointer.write_run_folder(checkpoint, self.task)
        return self

    def build_model(self) -> torch.nn.Module:
        """The model for the task, initialised from the seed, in train mode on the placement's home.
        With ``shared_init``, its parameters take the initial values of the models it names
        (:meth:`take_initial_values`, recorded in :attr:`shared`), and the random stream starts
        again from the seed.

        Raises:
            ValueError: the model trains in several phases, over processes or compiled; or a
                model of ``shared_init`` cannot do the task.
        """
        torch.manual_seed(self.config.seed)
        model = build_model(model_config_for(self.config, self.task))
        if self.config.shared_init is not None:
            self.shared = self.take_initial_values(model)
            # dropout and other draws of training then start alike, whatever each architecture drew to initialise
            torch.manual_seed(self.config.seed)
        phases = [phase.name for phase in model.phases()]
        if len(phases) > 1 and (self.placement.here.size > 1 or self.config.compile):
            raise ValueError(
                f"{model.config.variant!r} trains in phases {phases}; training over several processes "
                "and compile: true are for one-phase models: run it in one process, eager"
            )
        return self.placement.place(model, len(phases)).train()

    def take_initial_values(self, model: torch.nn.Module) -> SharedStart:
        """Give ``model``'s parameters the initial values of the models ``shared_init`` names, each
        built for the task from the seed as this run's model is: a parameter whose name and shape
        agree with one of theirs takes the first such model's value. The models are built one at a
        time, each freed once copied, and none after every parameter is taken."""
        mine, taken = dict(model.named_parameters()), set()
        for index, entry in enumerate(self.config.shared_init):
            if len(taken) == len(mine):
                break
            torch.manual_seed(self.config.seed)
            with naming(f"shared_init.{index}"):
                source = build_model(model_config_for(self.config.model_copy(update={"model": entry}), self.task))
            with torch.no_grad():
                for name, value in source.named_parameters(remove_duplicate=False):  # a tied weight under each name
                    if name in mine and name not in taken and value.shape == mine[name].shape:
                        mine[name].copy_(value)
                        taken.add(name)
            del source
        return SharedStart(
            shared=[name for name in mine if name in taken],
            own=[name for name in mine if name not in taken],
            shared_weights=sum(mine[name].numel() for name in taken),
        )

    def attach(self, model: torch.nn.Module) -> Trainer:
        """Train ``model`` from here, through a :class:`~transformer_zoo.training.step.Stepper`:
        spread over the processes, with each phase's optimizer and schedule, and its loss
        compiled with ``compile: true``."""
        self.model = model
        self.stepper = Stepper(self.config, self.task, model, self.placement)
        return self

    def resumed(self, state: dict[str, Any]) -> None:
        """Take the step, learning curve and FLOPs per step of a checkpoint's ``state.json`` (a
        checkpoint written before checkpoints kept the FLOPs has its run count them again)."""
        self.start = self.reached = state["step"]
        self.history = state["history"]
        flops = state.get("step_flops")
        if isinstance(flops, (int, float)) and not isinstance(flops, bool) and math.isfinite(flops) and flops >= 0:
            self.step_flops = flops

    def load_optimizer_states(self, checkpoint: Path) -> None:
        """Each phase's optimizer and schedule state from ``checkpoint`` (after :meth:`attach`).

        Raises:
            CheckpointError: the checkpoint holds the optimizers of other phases, or states that
                do not fit them.
        """
        self.checkpointer.load_optimizer_states(
            checkpoint, self.start, self.model, self.stepper.optimizers, self.stepper.schedulers
        )

    # ---- a step, evaluate, save ---------------------------------------------------------------
    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """Step ``step``'s batch (:meth:`~transformer_zoo.training.step.Stepper.batch`), after
        :meth:`attach`."""
        return self.stepper.batch(step)

    def step(self, step: int, batch: dict[str, torch.Tensor] | None = None, *, eager: bool = False) -> dict[str, float]:
        """One optimizer step of every phase in turn, each with the others frozen, on ``batch``
        (None: :meth:`batch` of ``step``; see :meth:`~transformer_zoo.training.step.Stepper.step`);
        returns each phase's loss.

        Raises:
            TrainingDiverged: a loss was not finite (in any process).
        """
        with self.explained():
            return self.stepper.step(step, batch, eager=eager)

    def counted_step(self, step: int, batch: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, float], float]:
        """:meth:`step`, run eagerly under PyTorch's FLOP counter
        (:meth:`~transformer_zoo.training.step.Stepper.counted_step`): the losses, and the FLOPs
        of its forward and backward passes over the global batch."""
        with self.explained():
            return self.stepper.counted_step(step, batch)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """A step's :class:`TrainingDiverged`, told with what the run folder keeps and what to try."""
        try:
            yield
        except TrainingDiverged as exc:
            raise self.checkpointer.diverged(str(exc)) from None

    def evaluate(self, split: str) -> dict[str, float] | None:
        """The trained model's scores on ``split``, from process 0 (None elsewhere)."""
        with self.placement.whole(self.model) as model:
            return None if model is None else self.task.evaluate(model, split)

    def score(self, split: str) -> dict[str, float] | None:
        """:meth:`evaluate` ``split`` at the step reached, added to the learning curve as ``SPLIT_METRIC``."""
        scores = self.evaluate(split)
        if scores is not None:
            self.history.append({"step": self.reached, **{f"{split}_{k}": v for k, v in scores.items()}})
            self.track(self.history[-1])
        return scores

    def save(self, step: int) -> None:
        """Checkpoint ``step`` into the run folder (written by process 0, every process taking
        part; :meth:`~transformer_zoo.training.checkpointing.Checkpointer.save`).

        Raises:
            TrainingDiverged: a weight or an optimizer state is not finite; nothing is written,
                and the run folder keeps its checkpoint.
        """
        self.checkpointer.save(
            step, self.model, self.stepper.optimizers, self.stepper.schedulers, self.history, self.step_flops
        )

    # ---- the run ------------------------------------------------------------------------------
    def run(self, stop_after: int | None = None) -> dict[str, Any]:
        """Train to the budget's end and return the summary: :meth:`run_until` ``stop_after`` (None:
        ``steps``), as a mapping (``{"step", "stopped": True}`` when it stopped before the end)."""
        reached = self.run_until(stop_after)
        return {"step": reached.step, "stopped": True} if reached.summary is None else reached.summary

    def run_until(self, step: int | None = None, seconds: float | None = None, *, score: str | None = None) -> Reached:
        """Train on from the step reached until ``step`` (None: ``steps``) or for ``seconds`` (None:
        ``max_seconds``), and checkpoint. At ``steps``, or out of time with no ``step`` asked, the run
        ends (evaluated, ``summary.json`` and ``model/`` written); otherwise another call trains on.
        ``score``: a split to score where it stops (:meth:`score`, unless the run ended: its summary's).

        Raises:
            TrainingInterrupted: Ctrl-C, the step reached saved (a second stops at once, keeping the last checkpoint).
            TrainingDiverged: a loss, weight or optimizer state became non-finite.
        """
        end = self.config.steps if step is None else min(self.config.steps, step)
        self.start, self.tokens = self.reached, 0
        started = self._started = time.perf_counter()
        folder = self.run_dir if self.placement.here.main else None
        self.trackers = Trackers.open(self.name, folder, self.config, self.start, self.tags)
        try:
            end = self.train_steps(end, started, self.config.max_seconds if seconds is None else seconds)
            elapsed = time.perf_counter() - started
            self.save(end)
            if step is not None and end < self.config.steps:
                return Reached(end, None if score is None else self.score(score))
            if not self.placement.here.main:
                return Reached(end, summary={"step": end, "rank": self.placement.here.rank})
            summary = self.summary(end, elapsed)
            self.trackers.finish(summary["metrics"], end)
            return Reached(end, None if score is None else summary["metrics"][score], summary)
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C, or one outside the steps: the last checkpoint stands
            raise self.interrupted() from None
        finally:
            self.trackers.finish(None)  # no-op after the final scores

    def track(self, row: dict[str, float]) -> None:
        """Hand a learning-curve row to the trackers, with the tokens per second so far."""
        self.trackers.log_row(row, self.tokens / max(time.perf_counter() - self._started, 1e-9))

    def train_steps(self, end: int, started: float, seconds: float | None = None) -> int:
        """Steps :attr:`start` up to ``end`` (this trainer's first step counted); returns the step reached (earlier
        than ``end`` when ``seconds`` ran out). Ctrl-C stops it after the step under way."""
        self.checkpointer.start_clock()
        with self.progress_bar() as bar, stop_requests() as stop:
            shown = bar.add_task(f"{self.config.task.kind}", total=self.config.steps, completed=self.start, status="")
            for step in range(self.start, end):
                batch = self.batch(step)
                if self.step_flops is None:  # counted once: a trial trained in parts counts its first part
                    losses, self.step_flops = self.counted_step(step, batch)
                else:
                    losses = self.step(step, batch)
                self.tokens += self.task.tokens_in(batch) * self.placement.here.size
                self.reached = step + 1
                loss = self.after_step(step + 1, losses)
                rate = self.tokens / (time.perf_counter() - started)
                bar.update(shown, completed=step + 1, status=f"loss {loss:.3f}  {rate:,.0f} tok/s")
                if self.placement.any_true(stop.is_set()):
                    self.stop(step + 1)
                if seconds is not None and self.placement.any_true(time.perf_counter() - started >= seconds):
                    return step + 1  # the time is spent, in any process (all stop together): the last step
        return end

    def stop(self, done: int) -> None:
        """Save step ``done`` (unless its checkpoint is written) and raise :class:`TrainingInterrupted`."""
        if self.run_dir is not None and self.checkpointer.saved != done:
            self.save(done)
        raise self.interrupted()

    def interrupted(self) -> TrainingInterrupted:
        """The interruption of this run, saying where it stopped, what is saved and how to resume."""
        where = f"at step {self.reached} of {self.config.steps}" if self.model is not None else "before training began"
        step = self.checkpointer.saved
        if self.run_dir is None:
            saved = "; nothing is saved (the trainer has no run folder)"
        elif step is None:
            saved = "; no checkpoint is saved: the next run starts from step 0"
        else:
            kept = "saved" if step == self.reached else "without saving it; kept"
            saved = (
                f", {kept}: the checkpoint of step {step} in {self.run_dir / CHECKPOINT}; run the same "
                f"command again to resume from step {step}"
            )
        return TrainingInterrupted(
            f"interrupted {where}{saved}", self.reached if self.model is not None else None, step
        )

    def after_step(self, done: int, losses: dict[str, float]) -> float:
        """The learning curve, evaluation and checkpoint due after step ``done``; returns the
        headline loss (the first phase's; the global batch's where recorded)."""
        config, first = self.config, self.stepper.phases[0].name
        loss = losses[first]
        if done % config.log_every == 0 or done == config.steps:
            loss = self.placement.mean(loss)  # the global batch's
            several = len(self.stepper.phases) > 1
            phase_losses = {f"loss_{name}": value for name, value in losses.items()} if several else {}
            norms = {f"grad_norm_{name}" if several else "grad_norm": self.stepper.grad_norm(name) for name in losses}
            self.history.append(
                {
                    "step": done,
                    "loss": loss,
                    **phase_losses,
                    "lr": self.stepper.lr(first),
                    **norms,
                }
            )
            self.track(self.history[-1])
        if config.eval_every and done % config.eval_every == 0 and done != config.steps:
            self.score("test" if self.config.holdout is None else VALIDATION)
        if self.checkpointer.due(done):
            self.save(done)
        return loss

    def progress_bar(self) -> Progress:
        """A bar of steps with the loss and throughput (process 0's, when ``progress``)."""
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            disable=not (self.progress and self.placement.here.main),
            transient=True,
        )

    def summary(self, end: int, elapsed: float) -> dict[str, Any]:
        """Process 0's summary of a run that reached step ``end`` in ``elapsed`` seconds, after
        :meth:`save`: scores on every split but train, sizes, throughput and the learning curve;
        written to ``summary.json``, and the model to ``model/``."""
        placement = self.placement
        held, peak = distributed.held_parameters(self.model), peak_tflops(self.config, placement.device)
        model = placement.last_gathered(self.model)  # save() has just gathered the final weights
        metrics = {split: self.task.evaluate(model, split) for split in self.task.splits if split != "train"}
        summary = {
            "step": end,
            "train_seconds": elapsed,
            "metrics": metrics,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameters_per_process": held,  # process 0's shards with parallel: fsdp, else every parameter
            "processes": placement.here.size,
            "parallel": self.config.parallel if placement.wrapped else None,  # under torchrun: ddp or fsdp
            "train_tokens_per_second": self.tokens / max(elapsed, 1e-9),
            **flop_rates(self.step_flops, end - self.start, elapsed, peak, placement.here.size),
            "history": self.history,
            "resumed_from": self.checkpointer.resumed_from,  # the checkpoint's step this invocation began at; None: from scratch
            **({} if self.shared is None else asdict(self.shared)),  # with shared_init alone
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        model.save_pretrained(self.run_dir / "model")
        return summary


def train(
    config: TrainConfig,
    run_dir: str | os.PathLike,
    *,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    task: Any = None,
    name: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train ``config.model`` on ``config.task``; returns the run summary (also in ``summary.json``).

    Args:
        run_dir: the run folder; an existing checkpoint there is resumed when ``resume``.
        progress: show a progress bar with loss and throughput.
        stop_after: stop (after checkpointing) once this step is reached, as an interruption would.
        task: ``config.task`` already built (a comparison builds each task once for all its
            seeds); None: built here.
        name, tags: the run's name (default: its folder's) and tags for its trackers.

    Raises:
        RunFolderBusy: another run trains in ``run_dir``.
        RunFolderError: ``run_dir`` is a file, or holds a run of another config (see
            :data:`~transformer_zoo.training.config.RESUMABLE_FIELDS`).
        CheckpointError: no checkpoint in ``run_dir`` can be resumed.
        TrainingDiverged: a loss, weight or optimizer state became non-finite.
        TrainingInterrupted: Ctrl-C, after saving the step reached.
    """
    trainer = Trainer(config, run_dir, task=task, progress=progress, name=name, tags=tags)
    try:
        with trainer.lock():
            return trainer.setup(resume).run(stop_after)
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:  # while setting up: the run folder is as it was
        raise trainer.interrupted() from None


def load_run(run_dir: str | os.PathLike) -> tuple[TrainConfig, Any, torch.nn.Module]:
    """The config, task and trained model (in eval mode) of a finished run folder."""
    run_dir = Path(run_dir)
    if not (run_dir / "train.json").is_file() or not (run_dir / "model").is_dir():
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a finished run folder: expected train.json and model/ written by tzoo train"
        )
    with get_registry().saved_plugins(read_plugins(run_dir)):  # a missing plugin is named, with how to load it
        config = load_train_config(run_dir / "train.json")
        model = from_pretrained(run_dir / "model").to(resolve_device(config.device)).eval()
        task = config.task.with_assets(run_dir).build()
    return config, task, model


def evaluate_run(run_dir: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Score the model of a finished run (``run_dir/model``) on its task's test splits."""
    _, task, model = load_run(run_dir)
    return {split: task.evaluate(model, split) for split in task.splits if split != "train"}
