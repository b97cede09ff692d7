"""The registry: the plugin hooks (:mod:`.hookspecs`), the plugin manager and discovery through
the ``transformer_zoo`` entry points (:mod:`.manager`), and lookups of kinds and variants by name.

What it may import: :mod:`transformer_zoo.core` alone. It loads the built-in plugins by module
name, as it loads third-party ones, and never imports them (nor anything above them).
"""

from .hookspecs import hookimpl, hookspec
from .manager import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginWarning,
    Registry,
    get_registry,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PluginWarning",
    "Registry",
    "get_registry",
    "hookimpl",
    "hookspec",
]
