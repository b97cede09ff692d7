"""Every hook a transformer-zoo plugin can implement.

A plugin is any importable module (or object) with functions marked ``@hookimpl``. Hooks
declare what a plugin offers; the registry validates it and the core builds it. Built-in
plugins use these same hooks.
"""

from __future__ import annotations

import pluggy

from ..core.options import Variant
from ..core.tasks import TaskOptions
from ..core.tracking import TrackedRun, Tracker
from ..core.validation import ComponentOptions
from ..core.weights import Importer

PROJECT = "transformer_zoo"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def tzoo_components() -> list[type[ComponentOptions]]:
    """Component kinds this plugin offers.

    Return options classes, each subclassing one category base of
    :mod:`transformer_zoo.core.options` (``AttentionOptions``, ``NormOptions``, ...) with a
    ``kind`` literal and a ``build`` method.
    """


@hookspec
def tzoo_variants() -> list[Variant]:
    """Variants this plugin offers: a family config class and, for presets, its values."""


@hookspec
def tzoo_tasks() -> list[type[TaskOptions]]:
    """Task kinds this plugin offers: options classes subclassing ``TaskOptions``."""


@hookspec
def tzoo_importers() -> list[Importer]:
    """Checkpoint formats this plugin reads (``transformer_zoo.from_pretrained`` tries each on a
    folder whose ``config.json`` is not the zoo's own), such as Hugging Face BERT folders."""


@hookspec
def tzoo_tracker(run: TrackedRun) -> Tracker | None:
    """A tracker for ``run`` (Weights & Biases, MLflow, ...), or None to leave it alone.

    Called once per training run, in the process that trains it (a comparison's workers
    register the plugin too); the tracker gets the run's scalars as they are recorded. See
    :class:`~transformer_zoo.core.tracking.Tracker` and the worked example in
    docs/writing-a-plugin.md."""
