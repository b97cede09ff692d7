"""What follows a training run as it trains: the :class:`Tracker` interface.

A trainer hands every tracker the run's scalars as it records them (training loss, learning
rate, gradient norm, tokens per second, and test metrics when it evaluates) and the final
scores at the end. The training room writes a CSV of them always and TensorBoard event files
when ``tensorboard`` is installed; a plugin adds another tracker (Weights & Biases, MLflow)
through the ``tzoo_tracker`` hook, so core imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TrackedRun:
    """The run a tracker follows.

    Attributes:
        name: the run's display name (``task/variant/seed0`` in a comparison, the run folder's
            name for ``tzoo train``).
        run_dir: the run folder.
        config: the run's training config, as JSON data.
        resumed_from: the checkpoint step the run continues from (0: from scratch); a tracker
            drops what an earlier attempt logged after it.
        tags: what the run is, for trackers that group runs (task, variant, seed).
    """

    name: str
    run_dir: Path
    config: dict[str, Any]
    resumed_from: int = 0
    tags: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Tracker(Protocol):
    """Follows one run: :meth:`log` while it trains, :meth:`finish` once, at its end or when it
    stops (then with ``scores`` None)."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars at ``step``, named ``train/loss``, ``train/lr``, ``test/accuracy``, ..."""

    def finish(self, scores: dict[str, dict[str, float]] | None) -> None:
        """The run ended: its final scores by split (None: it stopped before its end)."""
