"""transformer-zoo: a plugin-based zoo of Transformer variants on PyTorch.

Build any registered variant by name or from a config, register your own through the
``transformer_zoo`` entry points, and compare them on tasks.

Importing the package is light: torch and the registry load on first use of a name below, so
that ``tzoo --help`` and ``tzoo --version`` start without them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from .core.errors import ConfigError, UnknownNameError, ZooError
from .core.lazy import import_after, lazy_names

if TYPE_CHECKING:
    from .api import build_model, from_pretrained, list_variants, load_config
    from .core.decoding import generate
    from .registry import get_registry, hookimpl

try:
    __version__ = version("transformer-zoo")  # pyproject.toml is the one place the version is written
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "build_model": ".api",
    "from_pretrained": ".api",
    "list_variants": ".api",
    "load_config": ".api",
    "generate": ".core.decoding",
    "get_registry": ".registry",
    "hookimpl": ".registry",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)  # PEP 562: the names that need torch, imported when first read

# ModelOutput is a pytree node registered with torch when its module is imported; once torch is,
# so that torch.export.load reads a saved program after `import transformer_zoo` alone
import_after("torch", f"{__name__}.core.output")


def register_plugin(plugin: object, name: str | None = None) -> str:
    """Register a plugin in-process (a notebook): a module or object with ``@hookimpl`` functions."""
    from .registry import get_registry

    return get_registry().register(plugin, name)


def plugin_errors() -> dict[str, str]:
    """The plugins that failed to load, by name, with why (empty when all loaded). Each failure
    was also warned about (a ``PluginWarning``) when the registry loaded."""
    from .registry import get_registry

    return dict(get_registry().load_errors)


__all__ = [
    "ConfigError",
    "UnknownNameError",
    "ZooError",
    "build_model",
    "from_pretrained",
    "generate",
    "get_registry",
    "hookimpl",
    "list_variants",
    "load_config",
    "plugin_errors",
    "register_plugin",
]
