"""A validation split carved from a task's training data, for choosing settings without the test
splits: :func:`held_out` gives the task trained on its train split less a seeded part, and
scored on that part alone (split ``validation``). Its test splits cannot be read at all, so a
search over settings never sees them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..core.tasks import Task

if TYPE_CHECKING:
    import datasets

VALIDATION = "validation"
"""The name of the carved split."""


def carve(size: int, amount: float, seed: int) -> tuple[list[int], list[int]]:
    """The rows ``(kept, held)`` of a split of ``size`` rows: ``amount`` rows when it is 1 or more,
    else ``round(amount * size)`` (at least one, and one fewer than all), drawn without
    replacement with ``seed``; each list in row order."""
    if not amount > 0:
        raise ValueError(
            f"the validation split is a fraction of the train split (0 to 1) or a number of rows, got {amount}"
        )
    if size < 2:
        raise ValueError(f"a train split of {size} row(s) leaves nothing to carve a validation split from")
    count = min(max(1, int(amount) if amount >= 1 else round(amount * size)), size - 1)
    held = np.sort(np.random.default_rng(seed).permutation(size)[:count])
    kept = np.setdiff1d(np.arange(size), held)
    return kept.tolist(), held.tolist()


class _HeldOut:
    """Mixed in before a task's class by :func:`held_out`."""

    splits: ClassVar[tuple[str, ...]] = ("train", VALIDATION)
    holdout: tuple[float, int]
    source: Task

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in self.splits:
            raise ValueError(
                f"task {self.name!r} is held out for validation: it reads its train split only, as "
                f"'train' and {VALIDATION!r}; split {split!r} is not read while settings are chosen"
            )
        return self._parts()[split]

    @functools.cache  # one carve per task object, which lives as long as its run
    def _parts(self) -> dict[str, datasets.Dataset]:
        full = self.source.dataset("train")  # the task's own, which caches its data for every trial
        kept, held = carve(len(full), *self.holdout)
        return {"train": full.select(kept), VALIDATION: full.select(held)}

    def baselines(self, split: str) -> dict[str, float]:
        return super().baselines(split) if split in self.splits else {}


def held_out(task: Task, amount: float | None, seed: int) -> Task:
    """``task``, trained on its train split less ``amount`` of its rows (a fraction below 1, else a
    number of rows; drawn with ``seed``) and scored on those rows, as split ``validation``;
    reading any other split raises a ValueError. ``amount`` None: ``task`` itself.

    The task keeps its class's behaviour (collation, scoring, metrics): the returned object is an
    instance of a subclass of ``type(task)`` sharing ``task``'s state.
    """
    if amount is None:
        return task
    cls = type(task)
    held = type(f"HeldOut{cls.__name__}", (_HeldOut, cls), {"__module__": __name__})
    copy: Any = object.__new__(held)
    copy.__dict__.update(task.__dict__)
    copy.holdout, copy.source = (amount, seed), task
    return copy
