"""Training: one model on one task, for a budget of steps, resumable to the step.

What lives here:

- :mod:`.config`: :class:`TrainConfig`, the training config (model, task, budget, optimiser,
  schedule, device) and :func:`load_train_config`;
- :mod:`.trainer`: :class:`Trainer`, which holds its parts, and :func:`train`,
  :func:`evaluate_run` and :func:`load_run`;
- :mod:`.checkpoints`: the run folder (its lock, atomic checkpoints, checks on resume);
- :mod:`.distributed`: one run over a torchrun job's processes (DDP, FSDP).

What it may import: :mod:`transformer_zoo.core`, :mod:`transformer_zoo.registry`,
:mod:`transformer_zoo.api` and :mod:`transformer_zoo.configs`; never
:mod:`transformer_zoo.comparing` or the command line, which build on it.
"""

from .config import RESUMABLE_FIELDS, TrainConfig, load_train_config
from .trainer import Trainer, TrainingDiverged, TrainingInterrupted, evaluate_run, load_run, train

__all__ = [
    "RESUMABLE_FIELDS",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "evaluate_run",
    "load_run",
    "load_train_config",
    "train",
]
