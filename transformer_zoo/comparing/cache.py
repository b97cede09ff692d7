"""The run cache: finished runs kept by what decides their result, so that a comparison trains
only the cells it has no finished run for.

A run's key (:func:`run_key`) is a hash of its resolved model config (the variant's every
field, with what the task sets, such as the vocabulary), its task config, its training config
(seed, budget, optimizer, schedule, device, ...; not how often it checkpoints, which changes
nothing it computes) and :data:`KEY_VERSIONS`. Its folder in the cache is
``TASK--VARIANT--seedS--KEY`` (the key's first 16 hex digits); a run of the same key under
another label is the same run, and is reused.

The cache is the report folder's ``runs/`` unless the spec's ``cache:`` names a folder that
several specs share.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..training.config import TrainConfig

KEY_VERSIONS = {"transformer_zoo": ".".join(__version__.split(".")[:2]),
                "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2])}
"""The versions a run's key holds: major.minor of transformer-zoo and of torch (a patch release
changes no result; a minor one may change a kernel, and with it the last digits)."""
NOT_IN_KEY = frozenset({"checkpoint_every", "checkpoint_minutes"})
"""Training options that change no result: how often a run checkpoints (it resumes exactly)."""
KEY_DIGITS = 16


def run_key(config: TrainConfig, model: Any) -> str:
    """The hex SHA-256 of everything that decides a run's result (see the module's docstring).

    Args:
        model: the run's resolved model config (:func:`~transformer_zoo.training.trainer.model_config_for`).
    """
    content = {"model": model.model_dump(mode="json"), "task": config.task.model_dump(mode="json"),
               "train": config.model_dump(mode="json", exclude={"model", "task", *NOT_IN_KEY}),
               "versions": KEY_VERSIONS}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


class RunCache:
    """A folder of run folders, found by key."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def folder(self, label: str, config: TrainConfig, key: str) -> Path:
        """The run's folder: the one of its key already in the cache (finished, or with a
        checkpoint to resume), else a new one named by task, label and seed."""
        found = sorted(self.root.glob(f"*--{key[:KEY_DIGITS]}")) if self.root.is_dir() else []
        if found:
            return found[0]
        name = re.sub(r"[^\w.+-]+", "_", label.split(" ")[0])  # a label may hold any character; a folder name not
        return self.root / f"{config.task.kind}--{name}--seed{config.seed}--{key[:KEY_DIGITS]}"
