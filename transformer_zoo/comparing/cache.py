"""The run cache: finished runs kept by what decides their result, so that a comparison trains
only the cells it has no finished run for.

A run's key (:func:`run_key`) is a hash of its resolved model config (the variant's every
field, with what the task sets, such as the vocabulary), its task config and the local data
files it names (:data:`DATA_FIELDS`: each file's path, size and modification time), its training config (seed,
budget, optimizer, schedule, the device it resolves to, ...; not how often it checkpoints or
the peak FLOP rate MFU is measured against, which change nothing it computes), the probes
measured after training, the resolved model configs whose initial weights it takes
(``shared_init``, which ``pairing: seeds`` sets; nothing for a run without it, whose key is
that of its own initialisation alone), and :data:`KEY_VERSIONS`. A dataset from a hub is keyed by its name
alone: rerun (``--rerun``) when it changes. Its folder in the cache is
``TASK--VARIANT--seedS--KEY`` (the key's first 16 hex digits); a run of the same key under
another label is the same run, and is reused.

The cache is the report folder's ``runs/`` unless the spec's ``cache:`` names a folder that
several specs share.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..api import load_config
from ..training.config import TrainConfig
from ..training.placement import resolve_device

KEY_VERSIONS = {
    "transformer_zoo": ".".join(__version__.split(".")[:2]),
    "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
}
"""The versions a run's key holds: major.minor of transformer-zoo and of torch (a patch release
changes no result; a minor one may change a kernel, and with it the last digits)."""
NOT_IN_KEY = frozenset({"checkpoint_every", "checkpoint_minutes", "peak_tflops"})
"""Training options that change no result: how often a run checkpoints (it resumes exactly), and
the peak its MFU is reported against."""
KEY_DIGITS = 16


DATA_FIELDS = frozenset({"path", "files", "test_files", "tokenizer"})
"""The task config fields that name local data (the built-in text and dataset tasks')."""


def data_files(value: Any, field: str | None = None) -> list[list[Any]]:
    """Path, size and modification time of every local file a task config's :data:`DATA_FIELDS`
    name (a file, a folder's files, a glob's matches), for a run's key."""
    if isinstance(value, dict):
        return [
            entry
            for key, item in value.items()
            if field or key in DATA_FIELDS
            for entry in data_files(item, field or key)
        ]
    if field is None:
        return []
    if isinstance(value, list):
        return [entry for item in value for entry in data_files(item, field)]
    if not isinstance(value, str) or not value:
        return []
    matches = sorted(glob.glob(value)) if glob.has_magic(value) else [value]
    files = []
    for match in map(Path, matches):
        files += sorted(p for p in match.rglob("*") if p.is_file()) if match.is_dir() else [match] * match.is_file()
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def run_key(config: TrainConfig, model: Any, probes: list[str] = ()) -> str:
    """The hex SHA-256 of everything that decides a run's record (see the module's docstring).

    Args:
        model: the run's resolved model config (:func:`~transformer_zoo.training.trainer.model_config_for`).
        probes: the measurements of the trained model its record holds.
    """
    task = config.task.model_dump(mode="json", exclude={"id"})  # a report's name for the task, not part of the run
    held = set() if config.holdout is not None else {"holdout", "holdout_seed"}  # the keys of runs before them
    train = config.model_dump(mode="json", exclude={"model", "task", "shared_init", *NOT_IN_KEY, *held})
    content = {
        "model": model.model_dump(mode="json"),
        **({} if config.shared_init is None else {"shared_init": [_resolved(entry) for entry in config.shared_init]}),
        "task": task,
        "data": data_files(task),
        "train": {**train, "device": resolve_device(config.device).type},
        "probes": sorted(probes),
        "versions": KEY_VERSIONS,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _resolved(entry: str | dict[str, Any]) -> dict[str, Any]:
    """A model entry of ``shared_init`` as its every field (the task's fixed values are keyed with the task)."""
    return load_config({"variant": entry} if isinstance(entry, str) else entry).model_dump(mode="json")


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
