"""Every run tracked: its scalars as CSV always, as TensorBoard event files when ``tensorboard``
is installed, and to whatever trackers plugins add (the ``tzoo_tracker`` hook).

Both files live in the run folder, so a run's curves travel with it (a comparison's cache
included) and ``tensorboard --logdir FOLDER`` shows every run under ``FOLDER``, each named by
its folder. A resumed run drops what an earlier attempt logged after its checkpoint: the CSV
keeps only rows up to it, and TensorBoard is told to purge the later steps.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path
from typing import Any

from ..core.files import atomic_write
from ..core.tracking import TrackedRun, Tracker
from ..registry import get_registry

SCALARS = "scalars.csv"
"""The run folder's CSV of every scalar: one row per (step, name, value)."""


def tensorboard_installed() -> bool:
    """Whether ``tensorboard`` can be imported (the ``[tensorboard]`` extra)."""
    return importlib.util.find_spec("tensorboard") is not None


def scalar_names(row: dict[str, float]) -> dict[str, float]:
    """A learning-curve row as tracked scalars: ``test_<metric>`` as ``test/<metric>`` (and
    ``validation_<metric>`` as ``validation/<metric>``), the rest as ``train/<name>`` (the step
    itself is not a scalar)."""

    def name(key: str) -> str:
        split = next((s for s in ("test", "validation") if key.startswith(f"{s}_")), None)
        return f"train/{key}" if split is None else f"{split}/{key.removeprefix(f'{split}_')}"

    return {name(key): float(value) for key, value in row.items() if key != "step"}


class CSVTracker:
    """``scalars.csv`` in the run folder: ``step,name,value`` rows, appended as they come."""

    def __init__(self, run: TrackedRun) -> None:
        self.path = Path(run.run_dir) / SCALARS
        kept = []
        if self.path.is_file() and run.resumed_from:
            with self.path.open(newline="") as f:
                kept = [row for row in csv.DictReader(f) if int(row["step"]) <= run.resumed_from]

        def write(tmp: Path) -> None:
            with tmp.open("w", newline="") as f:
                out = csv.DictWriter(f, ["step", "name", "value"])
                out.writeheader()
                out.writerows(kept)

        atomic_write(self.path, write)
        self._file = self.path.open("a", newline="")
        self._out = csv.writer(self._file)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._out.writerows([step, name, repr(value)] for name, value in scalars.items())
        self._file.flush()

    def finish(self, scores: dict[str, dict[str, float]] | None) -> None:
        self._file.close()


class TensorBoardTracker:
    """TensorBoard event files in the run folder (torch's ``SummaryWriter``)."""

    def __init__(self, run: TrackedRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # what an earlier attempt logged after the checkpoint (the steps after resumed_from) is dropped
        self._writer = SummaryWriter(log_dir=str(run.run_dir), purge_step=run.resumed_from + 1)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            if math.isfinite(value):
                self._writer.add_scalar(name, value, step)

    def finish(self, scores: dict[str, dict[str, float]] | None) -> None:
        self._writer.close()


class Trackers:
    """Every tracker of one run, fed together: the CSV, TensorBoard where installed, and the
    plugins' (:meth:`~transformer_zoo.registry.Registry.trackers`)."""

    @classmethod
    def open(
        cls, name: str | None, run_dir: Path | None, config: Any, resumed_from: int, tags: dict[str, str]
    ) -> Trackers:
        """Every tracker of the run of ``config`` (a training config) in ``run_dir`` (None: no
        tracker, as for a trainer without a run folder, or a process of a job but process 0),
        named ``name`` (None: the folder's name)."""
        if run_dir is None:
            return cls([])
        run = TrackedRun(
            name=name or run_dir.name,
            run_dir=run_dir,
            config=config.model_dump(mode="json"),
            resumed_from=resumed_from,
            tags=tags,
        )
        return cls(
            [
                CSVTracker(run),
                *([TensorBoardTracker(run)] if tensorboard_installed() else []),
                *get_registry().trackers(run),
            ]
        )

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers
        self._finished = False

    def log(self, step: int, scalars: dict[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def log_row(self, row: dict[str, float], tokens_per_second: float) -> None:
        """A learning-curve row (:func:`scalar_names`); a training row with the tokens per second so far."""
        scalars = scalar_names(row)
        if "loss" in row:
            scalars["train/tokens_per_second"] = tokens_per_second
        self.log(int(row["step"]), scalars)

    def finish(self, scores: dict[str, dict[str, float]] | None, step: int | None = None) -> None:
        """End every tracker; the final ``scores`` are logged first, at ``step``, as ``SPLIT/METRIC``."""
        if self._finished:
            return
        self._finished = True
        if scores is not None and step is not None:
            self.log(
                step, {f"{split}/{name}": value for split, metrics in scores.items() for name, value in metrics.items()}
            )
        for tracker in self.trackers:
            tracker.finish(scores)
