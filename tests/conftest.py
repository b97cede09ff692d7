"""Shared fixtures. Every test runs on CPU in float32, seeded."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n N`` (pytest-xdist), each worker runs on a core of its own with one torch
    thread, and so does every process it starts (they inherit the affinity): two workers never
    compete for a core, whose OpenMP threads would spin against each other.

    The garbage collector runs less often: at Python's default threshold it took about 5% of the
    tests' time, walking the modules and fixtures a test session keeps alive (see also
    :func:`pytest_collection_finish`)."""
    gc.set_threshold(50_000, 20, 100)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(worker.removeprefix("gw")) % len(cores)]})
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported lives to the end of the session: the collector need not walk it again."""
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy tests first (a stable sort: the order is otherwise the files'), so that under
    ``pytest -n`` no worker is left with a long test while the others have finished. Each worker
    sorts its collection alike, as pytest-xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Any]], tuple[Path, dict[str, Any]]]:
    """Trained tiny models, keyed by their training config: a learning test and the tests that read
    what it learned share one run, trained once per test session. Under ``pytest -n`` the
    workers share it too (the first to ask trains it, under a lock; mark the tests that share a
    run with one ``xdist_group`` so that they run on one worker, which never waits).

    Returns ``trained(config) -> (run_dir, summary)``; a test may add files to ``run_dir`` (attention
    maps) but must not change what training wrote.
    """
    from transformer_zoo.training import load_train_config, train

    root = tmp_path_factory.getbasetemp()
    root = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "trained"
    root.mkdir(exist_ok=True)

    def get(config: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
        run_dir = root / hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
        with filelock.FileLock(f"{run_dir}.lock"):
            if not (run_dir / "summary.json").is_file():
                torch.manual_seed(0)
                train(load_train_config(config), run_dir, progress=False)
        return run_dir, json.loads((run_dir / "summary.json").read_text())

    return get


REVERSE_RUN = {
    "model": {"variant": "transformer-tiny", "dropout": 0.0},
    "task": {"kind": "reverse", "train_lengths": [1, 8], "test_lengths": [9, 12], "test_size": 200},
    "steps": 250,
    "batch_size": 64,
    "lr": 3e-3,
    "warmup_steps": 25,
}
"""transformer-tiny trained on reverse: the learning test's run, which the probes read too."""


@pytest.fixture(scope="session")
def reverse_run(trained: Callable) -> tuple[Path, dict[str, Any]]:
    """:data:`REVERSE_RUN`, trained once per session (mark users ``xdist_group("reverse")``)."""
    return trained(REVERSE_RUN)


DIGITS_RUNS = {
    "vit-tiny": {
        "model": {"variant": "vit-tiny", "patch": 4},
        "task": "digits",
        "steps": 300,
        "batch_size": 64,
        "lr": 0.002,
        "warmup_steps": 30,
        "seed": 0,
    },
    "sagan-classifier-tiny": {
        "model": "sagan-classifier-tiny",
        "task": "digits",
        "steps": 300,
        "batch_size": 32,
        "lr": 0.003,
        "warmup_steps": 30,
        "seed": 0,
    },
    "sagan-gan": {
        "model": "sagan-gan",
        "task": {"kind": "digits-generation"},
        "steps": 800,
        "batch_size": 64,
        "lr": 4e-4,
        "warmup_steps": 0,
        "schedule": "constant",
        "grad_clip": None,
        "seed": 0,
    },
}
"""The image models trained on digits by the learning tests (the GAN's, 800 steps, is among the
``slow`` tests), whose runs the attention-map tests draw; they draw a GAN trained 5 steps
(``sagan-gan-sketch``), whose attention maps have the shape a trained one's have."""
DIGITS_RUNS["sagan-gan-sketch"] = {**DIGITS_RUNS["sagan-gan"], "steps": 5}


@pytest.fixture(scope="session")
def digits_run(trained: Callable) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """``digits_run(name)``: :data:`DIGITS_RUNS` ``[name]``, trained once per session (mark users
    ``xdist_group("digits")``)."""
    return lambda name: trained(DIGITS_RUNS[name])


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Trained tokenizers go to a folder of this session, not the user's cache."""
    os.environ["TZOO_CACHE"] = str(tmp_path_factory.mktemp("tzoo-cache"))


SPARSE_KINDS = {
    "sliding-window": {"window": 7},
    "dilated": {"kind": "sliding-window", "window": 4, "dilation": 3},
    "dilated-global": {"kind": "local-global", "window": 3, "dilation": 2, "global_positions": [0, 37]},
    "block-local": {"block": 16},
    "local-global": {"window": 5, "global_positions": [0, 37], "global_every": 50},
    "block-sparse": {"block": 16, "window_blocks": 1, "global_blocks": 1, "random_blocks": 2, "seed": 3},
}
"""Options of each sparse attention kind, small enough that a test's lengths are really sparse."""
CAUSAL_KINDS = ["sliding-window", "dilated", "block-local", "local-global", "dilated-global"]
"""The kinds a decoder may use (block-sparse is encoder-only)."""


def sparse_pattern(kind: str, causal: bool = False):
    """The :class:`~transformer_zoo.plugins.local_global.kernels.Pattern` of ``SPARSE_KINDS[kind]``."""
    from dataclasses import replace

    from transformer_zoo.registry import get_registry

    values = {"kind": kind, **SPARSE_KINDS[kind]}
    options = get_registry().component("attention", values["kind"]).model_validate(values)
    return replace(options.pattern(), causal=causal)
