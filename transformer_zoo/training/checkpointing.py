"""A run's checkpoints: a trainer's checkpointer.

:class:`Checkpointer` holds one run folder for one run: its lock, the choice of the checkpoint
to resume (the newest that reads, once the config is checked to be the run's), loading its
weights, optimizer and schedule states and random state, ``train.json`` and the task's assets,
writing a checkpoint of a step, and when one is due. The files themselves (their layout, the
atomic swap, the checks made on reading) are :mod:`~transformer_zoo.training.run_folder`'.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.errors import ZooError
from ..registry import get_registry
from .config import RESUMABLE_FIELDS, TrainConfig, config_changes, load_train_config, model_config_for
from .placement import Placement
from .run_folder import (
    CHECKPOINT,
    PLUGINS,
    CheckpointError,
    CheckpointMismatch,
    CheckpointWarning,
    RunFolderError,
    RunLock,
    candidates,
    check_run_folder,
    check_weights,
    first_non_finite,
    load_weights,
    optimizer_tensors,
    promote,
    read_optimizers,
    read_state,
    remove_partial_files,
    verify_digests,
    warn_passed_over,
    write_checkpoint,
)
from .step import TrainingDiverged, optimized_parameters


class Checkpointer:
    """The run folder of one run (None: a run that never saves).

    Attributes:
        run_dir: the run folder, or None.
        saved: the step of the run folder's checkpoint (None: it has none).
        resumed_from: the checkpoint's step when resuming; None for a run from scratch.
    """

    def __init__(self, config: TrainConfig, run_dir: Path | None, placement: Placement | None = None) -> None:
        """
        Args:
            placement: the device and processes (process 0 writes); None: ``config.device`` in
                this process alone.
        """
        self.config, self.run_dir = config, run_dir
        self.placement = Placement(config.device) if placement is None else placement
        self.saved: int | None = None
        self.resumed_from: int | None = None
        self._read_optimizers: tuple[Path, dict] | None = None  # checked by load, for load_optimizer_states
        self._saved_at = time.monotonic()  # when the last checkpoint was written (or training began)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run folder: process 0 takes its lock at once or not at all, every process
        learns which, and what interrupted writes left is removed.

        Raises:
            RunFolderBusy: another run holds the folder; the message names its pid.
            RunFolderError: the folder holds files but no run (:func:`~transformer_zoo.training.run_folder.check_run_folder`).
        """
        held = RunLock(self.run_dir) if self.placement.here.main and self.run_dir is not None else None
        refused = None
        try:
            if held is not None:
                check_run_folder(self.run_dir)
                held.acquire()
        except RunFolderError as exc:  # busy, or a folder of something else
            refused, held = exc, None
        if self.placement.any_true(refused is not None):
            raise refused or RunFolderError(f"run folder {str(self.run_dir)!r} was refused by process 0 (it says why)")
        try:
            if held is not None:
                remove_partial_files(self.run_dir)
            yield
        finally:
            if held is not None:
                held.release()

    # ---- resume -------------------------------------------------------------------------------
    def resumable(self) -> list[Path]:
        """The run folder's checkpoints, newest first (see :func:`~transformer_zoo.training.run_folder.candidates`),
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
            raise RunFolderError(
                f"{path} does not validate ({exc}); it is the config of the run whose checkpoint the folder "
                "holds: restore it to resume that run, or train into another --out"
            ) from None
        changes = config_changes(before, self.config)
        if changes:
            raise self.another_run(before, changes)
        return found

    def another_run(self, before: TrainConfig, changes: list[str]) -> RunFolderError:
        """The refusal to resume a run folder whose run (``before``) is not this config's: one
        line naming that run and the first differences; all of them in its ``details``."""
        model = before.model if isinstance(before.model, str) else before.model.get("variant", "model")
        shown = "; ".join(changes[:2]) + ("; ..." if len(changes) > 2 else "")
        error = RunFolderError(
            f"run folder {str(self.run_dir)!r} holds another run, of {model} on {before.task.kind}: this config "
            f"differs from it in {len(changes)} field{'s' if len(changes) > 1 else ''} ({shown}), and a run resumes "
            f"only with its own config (but for {', '.join(sorted(RESUMABLE_FIELDS))}); train into another --out "
            "(--json lists every difference)"
        )
        error.details = {"run_dir": str(self.run_dir), "run": {"model": model, "task": before.task.kind}}
        error.details["differences"] = changes
        return error

    def resume_from(self, found: list[Path], model: torch.nn.Module) -> tuple[Path | None, dict | None]:
        """Load the first of ``found`` that reads (:meth:`load`) into ``model``, with a warning
        for each one passed over: that checkpoint and its ``state.json``; (None, None) when
        ``found`` is empty.

        Raises:
            CheckpointError: none of them reads; the message names each file and the way out.
        """
        problems = []
        for checkpoint in found:
            try:
                state = self.load(checkpoint, model)
            except CheckpointError as exc:
                problems.append(exc)
                continue
            warn_passed_over(list(map(str, problems)), checkpoint, state["step"])
            return checkpoint, state
        if not problems:
            return None, None
        if any(isinstance(problem, CheckpointMismatch) for problem in problems):
            raise CheckpointMismatch(
                f"cannot resume {str(self.run_dir)!r}: {'; '.join(map(str, problems))}; resume it with the "
                "config it was trained with, or train into another --out"
            )
        raise CheckpointError(
            f"cannot resume {str(self.run_dir)!r}: {'; '.join(map(str, problems))}; no intact checkpoint is "
            "left: start over with --restart, or train into another --out"
        )

    def load(self, checkpoint: Path, model: torch.nn.Module) -> dict[str, Any]:
        """Continue from ``checkpoint``: its weights (into ``model``, before it is distributed)
        and random state; returns its checked ``state.json`` (the step and learning curve).
        Every file is checked first, against the digests ``state.json`` records, then read, the
        optimizer states too (kept for :meth:`load_optimizer_states`), so that nothing of a
        checkpoint that does not read is taken.

        Raises:
            CheckpointError: a file is missing, changed since it was written, does not read, or
                holds a value out of place (a non-finite weight); the message names the file.
            CheckpointMismatch: it does not fit the model (written by another).
            RunFolderError: the checkpoint is intact and beyond ``steps``.
        """
        device = self.placement.device
        state = read_state(checkpoint)
        if not verify_digests(checkpoint, state):
            warnings.warn(
                f"{checkpoint / 'state.json'} records no SHA-256 digests (it was written before checkpoints "
                "carried them): its files are checked for shape and finite values, not byte for byte",
                CheckpointWarning,
                stacklevel=3,
            )
        if state["step"] > self.config.steps:
            step, steps = state["step"], self.config.steps
            raise RunFolderError(
                f"run folder {str(self.run_dir)!r} holds this run at step {step}, beyond steps={steps}: to train "
                f"it further, give steps above {step} (--set steps=N); to train a new run of {steps} steps, "
                "train into another --out"
            )
        check_weights(checkpoint, model)
        optimizers = optimized_parameters(model, self.config)  # each optimizer's parameters, by name
        states = read_optimizers(checkpoint, optimizers, state["step"], self.placement.map_location)
        load_weights(checkpoint, model, self.placement.home)
        self._read_optimizers = (checkpoint, states)
        self.saved = self.resumed_from = state["step"]
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))
        if device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(torch.tensor(state["cuda_rng"], dtype=torch.uint8), device)
        return state

    def load_optimizer_states(
        self,
        checkpoint: Path,
        step: int,
        model: torch.nn.Module,
        optimizers: dict[str, torch.optim.Optimizer],
        schedulers: dict[str, Any],
    ) -> None:
        """Each optimizer's and schedule's state from ``checkpoint`` of ``step``, by name (after the
        model is distributed and its optimizers made: a phase's AdamW, and its Muon with
        ``optimizer: muon``).

        Raises:
            CheckpointError: the checkpoint holds the optimizers of other phases, or states that
                do not fit them.
        """
        read, self._read_optimizers = self._read_optimizers, None
        if read is not None and read[0] == checkpoint:
            states = read[1]
        else:
            held = {
                name: [p for group in optimizer.param_groups for p in group["params"]]
                for name, optimizer in optimizers.items()
            }
            states = read_optimizers(checkpoint, held, step, self.placement.map_location)
        try:
            for name, optimizer in optimizers.items():
                self.placement.load_optimizer_state(model, optimizer, states["optimizers"][name])
                schedulers[name].load_state_dict(states["schedulers"][name])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointMismatch(
                f"{checkpoint / 'optimizer.pt'} does not load into the optimizers ({exc}): it was written for "
                "other optimizers; resume it with the config it was trained with, or train into another --out"
            ) from None

    def write_run_folder(self, checkpoint: Path | None, task: Any) -> None:
        """Process 0, once every process has read ``checkpoint``: it becomes the folder's
        ``checkpoint`` (the other checkpoint folders are removed), and ``train.json``,
        ``plugins.json`` (the plugin module that provided each kind and variant the run uses) and
        the task's assets (for a run from scratch) are written."""
        self.placement.barrier()
        if not self.placement.here.main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        promote(self.run_dir, checkpoint)
        (self.run_dir / "train.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=2))
        # so that a machine without a plugin can name it: the task's and the resolved model's kinds
        providers = get_registry().providers_of([self.config, model_config_for(self.config, task)])
        (self.run_dir / PLUGINS).write_text(json.dumps(providers, indent=2))
        if checkpoint is None:
            task.save_assets(self.run_dir)

    # ---- save ---------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizers: dict[str, torch.optim.Optimizer],
        schedulers: dict[str, Any],
        history: list[dict],
        step_flops: float | None = None,
    ) -> None:
        """Checkpoint ``step`` into the run folder (written by process 0, every process taking part),
        with the FLOPs of a step (``step_flops``, when counted), which a resumed run takes.

        Raises:
            TrainingDiverged: a weight or an optimizer state is not finite; nothing is written,
                and the run folder keeps its checkpoint.
        """
        if self.run_dir is None:
            raise ValueError("this Trainer has no run folder to save into; give run_dir to Trainer(...)")
        whole = self.placement.gather(model) if self.placement.sharded else model
        states = self.placement.optimizer_states(model, optimizers)
        bad = None
        if self.placement.here.main:
            bad = first_non_finite(whole.state_dict().items()) or first_non_finite(optimizer_tensors(states))
        if self.placement.any_true(bad is not None):
            since = "" if self.saved is None else f" after step {self.saved}"
            raise self.diverged(f"{bad or 'a value'} became non-finite{since}, by step {step} (not saved)")
        if self.placement.here.main:
            write_checkpoint(
                self.run_dir,
                whole,
                states,
                {name: scheduler.state_dict() for name, scheduler in schedulers.items()},
                self.random_state(step, history, step_flops),
            )
        self.placement.barrier()
        self.saved, self._saved_at = step, time.monotonic()

    def random_state(self, step: int, history: list[dict], step_flops: float | None = None) -> dict[str, Any]:
        """``state.json``'s contents at ``step``: the step, the random state, the learning curve and
        the FLOPs of a step (when counted: a resumed run takes them rather than count a step)."""
        state = {"step": step, "rng": torch.get_rng_state().tolist(), "history": history}
        if step_flops is not None:
            state["step_flops"] = step_flops
        if self.placement.device.type == "cuda":  # dropout on CUDA draws from the device's generator
            state["cuda_rng"] = torch.cuda.get_rng_state(self.placement.device).tolist()
        return state

    def start_clock(self) -> None:
        """Count ``checkpoint_minutes`` from now (training begins)."""
        self._saved_at = time.monotonic()

    def due(self, step: int) -> bool:
        """Whether step ``step`` is checkpointed: every ``checkpoint_every`` steps, or once
        ``checkpoint_minutes`` have passed since the last checkpoint (in any process, so that
        all save together)."""
        every, minutes = self.config.checkpoint_every, self.config.checkpoint_minutes
        if every and step % every == 0:
            return True
        if minutes is None or self.run_dir is None:
            return False
        return self.placement.any_true(time.monotonic() - self._saved_at >= 60 * minutes)

    def diverged(self, what: str) -> TrainingDiverged:
        """The error of a run stopped by ``what`` (a non-finite value): the checkpoint kept, if
        any, and what to try. Resuming repeats the same steps exactly, so it would diverge again."""
        if self.run_dir is None:
            kept = ""
        elif self.saved is None:
            kept = "; no checkpoint was written, so the next run starts from step 0"
        else:
            kept = f"; kept: the checkpoint of step {self.saved} in {self.run_dir / CHECKPOINT} (every value finite)"
        grad_clip, lr = self.config.grad_clip, self.config.lr
        clip = "set grad_clip" if grad_clip is None else f"a lower grad_clip (now {grad_clip})"
        new_run = "start over (--restart)" if self.saved is None else "train a new run into another --out"
        retry = f"{new_run} with a lower lr (now {lr}) or {clip}"
        if self.resumed_from is not None:
            return TrainingDiverged(
                f"{what}{kept}; this run resumed from step {self.resumed_from} and diverged again, "
                f"as resuming the same steps will: {retry}"
            )
        return TrainingDiverged(f"{what}{kept}; {retry} (resuming would take the same steps again)")
