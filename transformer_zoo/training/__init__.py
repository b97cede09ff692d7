"""Training: one model on one task, for a budget of steps, resumable to the step.

What lives here:

- :mod:`.config`: :class:`TrainConfig`, the training config (model, task, budget, optimiser,
  schedule, device) and :func:`load_train_config`;
- :mod:`.trainer`: :class:`Trainer`, which runs the loop over its parts, and :func:`train`,
  :func:`evaluate_run` and :func:`load_run`;
- the trainer's parts, each usable alone: :mod:`.step` (:class:`Stepper`: batches, losses,
  optimizer steps, FLOP counts), :mod:`.checkpointing` (:class:`Checkpointer`: a run folder's
  lock, resume and saves) and :mod:`.placement` (:class:`Placement`: the device, and the
  model's place among the processes);
- :mod:`.run_folder`: the run folder's files (its lock, atomic checkpoints, checks on resume);
- :mod:`.distributed`: one run over a torchrun job's processes (DDP, FSDP);
- :mod:`.interrupts`: Ctrl-C, which stops a run after the step under way;
- :mod:`.tracking`: every run's scalars as CSV, TensorBoard events and plugins' trackers.

What it may import: :mod:`transformer_zoo.core`, :mod:`transformer_zoo.registry`,
:mod:`transformer_zoo.api` and :mod:`transformer_zoo.configs`; never
:mod:`transformer_zoo.comparing` or the command line, which build on it.
"""

from .checkpointing import Checkpointer
from .config import RESUMABLE_FIELDS, TrainConfig, load_train_config
from .interrupts import TrainingInterrupted
from .placement import Placement
from .step import Stepper, TrainingDiverged
from .trainer import Trainer, evaluate_run, load_run, train

__all__ = [
    "RESUMABLE_FIELDS",
    "Checkpointer",
    "Placement",
    "Stepper",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "evaluate_run",
    "load_run",
    "load_train_config",
    "train",
]
