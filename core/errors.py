"""Errors a user can cause, each carrying a message that says what was wrong and what is allowed."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType


class ZooError(Exception):
    """Base class of every error transformer-zoo raises on purpose.

    Attributes:
        details: what the one-line message leaves out, as JSON values (None: nothing); the
            command line prints it with ``--json``.
    """

    details: dict | None = None


class ConfigError(ZooError, ValueError):
    """A configuration that does not validate; the message names each bad field."""


class InputTypeError(ZooError, TypeError, ValueError):
    """A model input of the wrong type (a list where a tensor goes): a TypeError, and a ValueError
    like every other bad input, so that one ``except ValueError`` catches what a user got wrong."""


class UnknownNameError(ZooError, LookupError):
    """A name (variant, component kind, task) that nothing registered; ``hint`` (optional) is
    appended to the message: what else may be wrong."""

    def __init__(self, what: str, name: str, known: Iterable[str], hint: str = ""):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        guess = f"did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(
            f"unknown {what} {name!r}; {guess + ' ' if guess else ''}registered: {', '.join(known) or '(none)'}"
            + (f"; {hint}" if hint else "")  # such as how to load the plugin that may provide it
        )
        self.name = name
        self.close_matches = close

    def __str__(self) -> str:  # LookupError would quote the message
        return self.args[0]


class DuplicateNameError(ZooError, ValueError):
    """Two plugins provide the same name."""


class PluginLoadError(ZooError, RuntimeError):
    """A plugin that could not be imported or registered."""


def optional(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, one of an optional feature's packages (the ``extra`` of the distribution);
    a ConfigError saying how to install it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{feature} needs {module}, which is not installed; install it with pip install 'transformer-zoo[{extra}]'"
        ) from None


@contextmanager
def naming(where: str) -> Iterator[None]:
    """Say where a config came from: a :class:`ConfigError` or :class:`UnknownNameError` raised
    inside gets ``where: `` before its message (a file, or a field of a larger config), unless
    the message starts with it already.

    >>> with naming("model"):
    ...     load_config({"variant": "nope"})  # UnknownNameError: model: unknown variant 'nope'; ...
    """
    try:
        yield
    except (ConfigError, UnknownNameError) as exc:
        if exc.args and not str(exc).startswith(where):
            exc.args = (f"{where}: {exc.args[0]}", *exc.args[1:])
        raise
