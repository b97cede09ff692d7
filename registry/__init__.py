"""Plugin hooks, the plugin manager and discovery through the ``transformer_zoo`` entry points."""

from .hookspecs import hookimpl, hookspec
from .manager import BUILTIN_PLUGINS, ENTRY_POINT_GROUP, PluginWarning, Registry, RenamedWarning, get_registry

__all__ = ["BUILTIN_PLUGINS", "ENTRY_POINT_GROUP", "PluginWarning", "Registry", "RenamedWarning", "get_registry",
           "hookimpl", "hookspec"]
