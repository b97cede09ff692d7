"""Names a package imports when they are first read (PEP 562), so that importing it stays light,
and modules imported once a heavy one they serve is (:func:`import_after`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each of ``names`` (name -> the module
    that defines it, relative to the package) is imported when first read, then kept there.

    >>> __getattr__, __dir__ = lazy_names(__name__, {"compare": ".runner"})
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__


def import_after(trigger: str, module: str) -> None:
    """Import ``module`` as soon as the top-level module ``trigger`` is imported: now if it is
    already, else right after the first ``import trigger`` ends (a finder on ``sys.meta_path``,
    removed once it has served). What ``module`` registers with ``trigger`` on import is then
    there whichever of the two the user imports first, without importing ``trigger`` early.
    """
    if trigger in sys.modules:
        importlib.import_module(module)
    else:
        sys.meta_path.insert(0, _ImportAfter(trigger, module))


class _ImportAfter(importlib.abc.MetaPathFinder):
    def __init__(self, trigger: str, module: str) -> None:
        self.trigger, self.module = trigger, module

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.trigger:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # as the finders after this one find it
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(new: Any) -> None:
                run(new)
                importlib.import_module(self.module)

            spec.loader.exec_module = exec_module  # this spec's own loader
        return spec
