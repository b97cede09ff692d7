"""The import paths of the 0.1 layout, kept for one release: ``transformer_zoo.train`` and the
other modules that now live in :mod:`transformer_zoo.training` and
:mod:`transformer_zoo.comparing` still import, with a ``DeprecationWarning`` naming the new place.

Each old path is a module made on import whose names are read from its new homes, so no file
stands at the old place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED: dict[str, tuple[str, ...]] = {  # old module -> the modules its names now live in
    "transformer_zoo.train": (
        "transformer_zoo.training.trainer",
        "transformer_zoo.training.config",
        "transformer_zoo.training.step",
        "transformer_zoo.training.placement",
        "transformer_zoo.training.interrupts",
    ),
    "transformer_zoo.train_config": ("transformer_zoo.training.config",),
    "transformer_zoo.checkpoints": ("transformer_zoo.training.checkpoints",),
    "transformer_zoo.distributed": ("transformer_zoo.training.distributed",),
    "transformer_zoo.compare": (
        "transformer_zoo.comparing.spec",
        "transformer_zoo.comparing.records",
        "transformer_zoo.comparing.runner",
    ),
    "transformer_zoo.summary": ("transformer_zoo.comparing.summary", "transformer_zoo.comparing.records"),
    "transformer_zoo.report": ("transformer_zoo.comparing.report",),
    "transformer_zoo.plots": ("transformer_zoo.comparing.plots",),
    "transformer_zoo.stats": ("transformer_zoo.comparing.stats",),
    "transformer_zoo.scaling": ("transformer_zoo.comparing.scaling",),
    "transformer_zoo.probes": ("transformer_zoo.comparing.probes",),
    "transformer_zoo.reproduce": ("transformer_zoo.comparing.studies",),
    "transformer_zoo.attention_maps": ("transformer_zoo.comparing.attention_maps",),
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in :data:`MOVED` (and nothing else) and makes each one a module whose
    names come from its new homes."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a plain module

    def exec_module(self, module: ModuleType) -> None:
        homes = [importlib.import_module(home) for home in MOVED[module.__name__]]
        where = new_place(module.__name__)
        warnings.warn(
            f"{module.__name__} has moved to {where}; import from there (the old path goes in 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )  # importlib's own frames are skipped

        def __getattr__(name: str) -> Any:
            for home in homes:
                if hasattr(home, name):
                    return getattr(home, name)
            raise AttributeError(f"module {module.__name__!r} (moved to {where}) has no attribute {name!r}")

        module.__getattr__ = __getattr__  # type: ignore[attr-defined]
        module.__doc__ = f"Moved to {where}."


def new_place(old: str) -> str:
    """Where an old module's names live now: ``transformer_zoo.comparing.report``, or
    ``transformer_zoo.comparing (spec, records, runner)`` when they were split."""
    homes = MOVED[old]
    if len(homes) == 1:
        return homes[0]
    package = homes[0].rpartition(".")[0]
    return f"{package} ({', '.join(home.rpartition('.')[2] for home in homes)})"


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once), after the ordinary finders."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
