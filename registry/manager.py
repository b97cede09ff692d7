"""The plugin manager: finds plugins, checks what they offer, and answers lookups by name."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pluggy
from pydantic import BaseModel

from ..core.errors import (
    ConfigError,
    DuplicateNameError,
    PluginLoadError,
    UnknownNameError,
    ZooError,
)
from ..core.options import CATEGORIES, Variant, VariantConfig
from ..core.tracking import TrackedRun, Tracker
from ..core.validation import ComponentOptions, use_kinds
from ..core.weights import Importer
from . import hookspecs

ENTRY_POINT_GROUP = "transformer_zoo"
PLUGINS_VARIABLE = "TZOO_PLUGINS"
"""An environment variable naming plugin modules to load after the entry points, separated by
commas (as ``PYTEST_PLUGINS`` does for pytest); worker processes inherit it."""
DISABLE_AUTOLOAD_VARIABLE = "TZOO_DISABLE_PLUGIN_AUTOLOAD"
"""Set (to anything but empty) to skip the ``transformer_zoo`` entry points, as
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does for pytest; the built-in plugins, ``$TZOO_PLUGINS`` and
``--plugin`` still load."""
BUILTIN_PLUGINS: dict[str, str] = {
    "tzoo.components": "transformer_zoo.plugins.components",
    "tzoo.transformer": "transformer_zoo.plugins.transformer",
    "tzoo.bert": "transformer_zoo.plugins.bert",
    "tzoo.universal-transformer": "transformer_zoo.plugins.universal_transformer",
    "tzoo.local-global": "transformer_zoo.plugins.local_global",
    "tzoo.efficient": "transformer_zoo.plugins.efficient",
    "tzoo.image": "transformer_zoo.plugins.image",
    "tzoo.relative": "transformer_zoo.plugins.relative",
    "tzoo.talking-heads": "transformer_zoo.plugins.talking_heads",
    "tzoo.latent-attention": "transformer_zoo.plugins.latent_attention",
    "tzoo.differential": "transformer_zoo.plugins.differential",
    "tzoo.moe": "transformer_zoo.plugins.moe",
    "tzoo.decoder-lm": "transformer_zoo.plugins.decoder_lm",
    "tzoo.tasks": "transformer_zoo.plugins.tasks",
}  # plugin name -> module
LOAD_HINT = (
    "if a plugin provides it, load the plugin: --plugin MODULE (or TZOO_PLUGINS=MODULE), or install "
    "the package that declares it as a 'transformer_zoo' entry point"
)
"""What an unknown kind or variant message adds: the name may come from a plugin not loaded."""


def kind_name(options: type[ComponentOptions]) -> str:
    """The ``kind`` literal of an options class, checked."""
    field = options.model_fields.get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    if field is None or len(args) != 1 or field.default != args[0] or not isinstance(args[0], str):
        raise PluginLoadError(f"{options.__name__} must declare kind: Literal['<name>'] = '<name>' to be registered")
    return args[0]


BUILD_KEYWORDS: dict[str, tuple[str, ...]] = {
    "positional": ("d_model", "n_heads", "max_len"),
    "norm": ("d_model",),
    "ffn": ("d_model", "d_ff", "dropout"),
    "head": ("d_model", "vocab_size", "embedding", "pad_id", "dropout"),
    "task": (),
}
"""The keyword arguments the zoo calls ``build`` with, for the categories whose base declares
``build(**context)``; a base that spells out its ``build`` (attention, stack) is its own answer."""


def build_call(category: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """How the zoo calls the ``build`` of a kind of ``category``: the names of the arguments it
    passes by position (after the options themselves), and of those it passes by keyword."""
    base = CATEGORIES[category]
    parameters = list(inspect.signature(base.build).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return (), BUILD_KEYWORDS[category]
    by_position = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return by_position, tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


def check_build(options: type[ComponentOptions], plugin: str) -> None:
    """Refuse an options class whose ``build`` cannot be called as the zoo calls it (see
    :func:`build_call`), naming the plugin, the kind and the signature expected: a wrong
    signature would otherwise be a ``TypeError`` when a model (or the task) is first built."""
    by_position, keywords = build_call(options.category)
    build = inspect.getattr_static(options, "build")
    try:
        signature = inspect.signature(options.build)
    except (TypeError, ValueError):  # nothing to read it from (a builtin callable): left to the call
        return
    bound = () if isinstance(build, (staticmethod, classmethod)) else (None,)
    try:
        signature.bind(*bound, *by_position, **dict.fromkeys(keywords))
    except TypeError as exc:
        given = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        expected = ", ".join(["self", *by_position, *(["*", *keywords] if keywords else [])])
        raise PluginLoadError(
            f"plugin {plugin!r} offers {_what(options.category)} {kind_name(options)!r} ({options.__name__}), "
            f"whose build{given} cannot be called as the zoo calls a {options.category} kind's build ({exc}); "
            f"expected build({expected})"
        ) from None


class PluginWarning(UserWarning):
    """A plugin failed to load, or offers something that looks like a hook but is not one."""


class Registry:
    """Every component kind and variant offered by the loaded plugins.

    A plugin that fails to load (an import error, even ``sys.exit()``; a clashing or malformed
    offer) is recorded in :attr:`load_errors` and warned about with a :class:`PluginWarning`;
    the others still load.

    Args:
        builtins: the built-in plugins, plugin name to module name.
        entry_points: whether to load third-party plugins of the ``transformer_zoo`` group
            (unless ``$TZOO_DISABLE_PLUGIN_AUTOLOAD`` is set) and the modules named in
            ``$TZOO_PLUGINS``.

    Attributes:
        load_errors: plugin name -> why it was not loaded.
        load_warnings: plugin name -> what was loaded but looks wrong (a ``tzoo_*`` function
            without ``@hookimpl``).
    """

    def __init__(self, *, builtins: Mapping[str, str] = BUILTIN_PLUGINS, entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._builtins = dict(builtins)
        self._entry_points = entry_points
        self._components: dict[str, dict[str, type[ComponentOptions]]] = {c: {} for c in CATEGORIES}
        self._variants: dict[str, Variant] = {}
        self._importers: dict[str, Importer] = {}
        self._providers: dict[tuple[str, str], str] = {}
        self.load_errors: dict[str, str] = {}
        self.load_warnings: dict[str, list[str]] = {}
        self.in_process: dict[str, Any] = {}  # plugin name -> what register() was given
        self._loaded = False

    # ---- loading ---------------------------------------------------------------------------
    def load(self) -> Registry:
        """Load the built-in plugins, then the entry-point plugins; once."""
        if self._loaded:
            return self
        self._loaded = True
        for name, module in self._builtins.items():
            self._load_plugin(name, lambda module=module: importlib.import_module(module))
        if self._entry_points:
            for ep in self._entry_point_plugins():
                if self.pm.has_plugin(ep.name):
                    where = ep.dist.name if ep.dist is not None else "an installed package"
                    self._failed(
                        f"{ep.name} ({where})",
                        f"a plugin named {ep.name!r} is already registered; "
                        "entry-point names must be unique: rename this one",
                    )
                    continue
                self._load_plugin(ep.name, ep.load)
            for module in plugin_modules(os.environ.get(PLUGINS_VARIABLE, "")):
                if not self.pm.has_plugin(module):
                    self._load_plugin(module, lambda module=module: import_plugin_module(module))
        return self

    @staticmethod
    def _entry_point_plugins() -> list[importlib.metadata.EntryPoint]:
        """The ``transformer_zoo`` entry points; none when ``$TZOO_DISABLE_PLUGIN_AUTOLOAD`` is set."""
        if os.environ.get(DISABLE_AUTOLOAD_VARIABLE):
            return []
        return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))

    def _load_plugin(self, name: str, load: Callable[[], Any]) -> None:
        """Import and register one plugin; a failure is recorded by name and the rest go on."""
        try:
            self._register(load(), name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken plugin, even one calling sys.exit(), must not stop the others
            self._failed(name, _describe(exc))

    def _failed(self, name: str, message: str) -> None:
        self.load_errors[name] = message
        warnings.warn(f"plugin {name!r} failed to load: {message}", PluginWarning, stacklevel=2)

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register a plugin in-process (a notebook, a test): a module or object with hook functions.

        Raises:
            DuplicateNameError: it offers a name another plugin already provides.
            PluginLoadError: what it offers is malformed.
        """
        self.load()
        if self.pm.is_registered(plugin):  # already loaded (an entry point, --plugin, $TZOO_PLUGINS): once is enough
            registered = self.pm.get_name(plugin)
            return self._replace(plugin, registered) if self._reloaded(plugin) else registered
        name = self._register(plugin, name or getattr(plugin, "__name__", None) or type(plugin).__name__)
        self.in_process[name] = plugin
        return name

    def _reloaded(self, plugin: Any) -> bool:
        """Whether a registered plugin's hook functions are no longer the ones registered: the module
        was run again (``importlib.reload``), so the classes it offers now are new ones."""
        registered = {
            impl.function
            for caller in self.pm.get_hookcallers(plugin) or ()
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin
        }
        current = {
            getattr(plugin, attr) for attr in dir(plugin) if self.pm.parse_hookimpl_opts(plugin, attr) is not None
        }
        return registered != current  # a bound method equals the one registered: an object is not reloaded

    def _replace(self, plugin: Any, name: str) -> str:
        """Register a reloaded plugin again under its name, in place of what its earlier run offered."""
        in_process = name in self.in_process
        self.unregister(name)
        try:
            self._register(plugin, name)
        except ZooError as exc:
            reloaded = (
                f" (plugin {name!r} was registered again after a reload: what it offered before was removed, and "
                "nothing of the reloaded module was registered; fix it and register it again)"
            )
            exc.args = (f"{exc.args[0]}{reloaded}", *exc.args[1:])
            raise
        if in_process:
            self.in_process[name] = plugin
        return name

    def register_module(self, module: str) -> str:
        """Import ``module`` and register it as a plugin named after it, as ``--plugin MODULE``
        does. Once: a module already registered under its name is left alone, unless it was
        reloaded since (``importlib.reload``), when what it offers now replaces what it offered.

        Raises:
            PluginLoadError: the module cannot be found, or it was found and failed while being
                imported (a package it imports is missing, say: the message names it).
        """
        self.load()
        if self.pm.has_plugin(module):
            registered = self.pm.get_plugin(module)
            return self.register(registered) if sys.modules.get(module) is registered else module
        return self.register(import_plugin_module(module), module)

    def portable_plugins(self) -> tuple[list[str], list[str]]:
        """The plugins registered in this process, as another process (a comparison's worker)
        could register them again: the modules it can import, and the names of those it cannot
        (an object defined in a notebook or in ``__main__``)."""
        modules, stranded = [], []
        for name, plugin in self.in_process.items():
            if _importable(plugin):
                modules.append(plugin.__name__)
            else:
                stranded.append(name)
        return modules, stranded

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name`` and everything it offered."""
        plugin = self.pm.get_plugin(name)
        if plugin is None:
            raise UnknownNameError("plugin", name, [n for n, _ in self.pm.list_name_plugin()])
        self.pm.unregister(plugin)
        self.in_process.pop(name, None)
        for key, provider in list(self._providers.items()):
            if provider == name:
                del self._providers[key]
                category, item = key
                if category == "variant":
                    del self._variants[item]
                elif category == "importer":
                    del self._importers[item]
                else:
                    del self._components[category][item]

    def _register(self, plugin: Any, name: str | None) -> str:
        if self.pm.is_registered(plugin):  # the same module through two routes: the first registration stands
            return self.pm.get_name(plugin)
        if name is not None and self.pm.has_plugin(name):
            raise PluginLoadError(
                f"another plugin is already registered under the name {name!r} (from "
                f"{_origin(self.pm.get_plugin(name))}); register this one under another name"
            )
        try:
            name = self.pm.register(plugin, name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginLoadError(f"plugin {name!r} could not be registered: {exc}") from None
        try:
            self._check_hook_names(name)
            self._collect(plugin, name)
        except Exception:
            self.pm.unregister(plugin)
            raise
        self._warn_unmarked_hooks(plugin, name)
        return name

    def _warn_unmarked_hooks(self, plugin: Any, name: str) -> None:
        """Warn of ``tzoo_*`` functions without ``@hookimpl``: pluggy ignores them, so what they
        offer would silently be missing."""
        unmarked = sorted(
            attr
            for attr in dir(plugin)
            if attr.startswith("tzoo_")
            and callable(getattr(plugin, attr, None))
            and self.pm.parse_hookimpl_opts(plugin, attr) is None
        )
        if unmarked:
            one = len(unmarked) == 1
            message = (
                f"{', '.join(unmarked)} {'looks like a hook implementation' if one else 'look like hook implementations'}"
                f" but {'lacks' if one else 'lack'} @hookimpl (from transformer_zoo import hookimpl), so "
                f"{'it is' if one else 'they are'} ignored"
            )
            self.load_warnings.setdefault(name, []).append(message)
            warnings.warn(f"plugin {name!r}: {message}", PluginWarning, stacklevel=3)

    def _check_hook_names(self, name: str) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            known = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("tzoo_")))
            raise PluginLoadError(
                f"plugin {name!r} implements a hook that does not exist ({exc}); hooks are: {known}"
            ) from None

    def _collect(self, plugin: Any, name: str) -> None:
        """Ask one plugin what it offers, check it all, then add it all (or nothing)."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        components = self.pm.subset_hook_caller("tzoo_components", others)()
        components += self.pm.subset_hook_caller("tzoo_tasks", others)()
        variants = self.pm.subset_hook_caller("tzoo_variants", others)()
        importers = self.pm.subset_hook_caller("tzoo_importers", others)()
        offered: dict[tuple[str, str], Any] = {}
        for options in (item for batch in components for item in batch or ()):
            category = getattr(options, "category", None)
            if not (isinstance(options, type) and issubclass(options, ComponentOptions) and category in CATEGORIES):
                raise PluginLoadError(
                    f"plugin {name!r} offers {options!r} as a component; expected a subclass of one of "
                    + ", ".join(base.__name__ for base in CATEGORIES.values())
                )
            kind = kind_name(options)
            check_build(options, name)
            self._add_offer(offered, (category, kind), options, name)
        for variant in (item for batch in variants for item in batch or ()):
            if not (isinstance(variant, Variant) and issubclass(variant.config, VariantConfig)):
                raise PluginLoadError(
                    f"plugin {name!r} offers {variant!r} as a variant; expected a Variant whose config "
                    "subclasses VariantConfig"
                )
            self._add_offer(offered, ("variant", variant.name), variant, name)
        for importer in (item for batch in importers for item in batch or ()):
            if not isinstance(importer, Importer):
                raise PluginLoadError(f"plugin {name!r} offers {importer!r} as an importer; expected an Importer")
            self._add_offer(offered, ("importer", importer.name), importer, name)
        self._refuse_clashes(offered, name)
        for (category, item), value in offered.items():
            self._providers[(category, item)] = name
            if category == "variant":
                self._variants[item] = value
            elif category == "importer":
                self._importers[item] = value
            else:
                self._components[category][item] = value

    def _add_offer(self, offered: dict, key: tuple[str, str], value: Any, name: str) -> None:
        if key in offered:
            category, item = key
            raise DuplicateNameError(
                f"plugin {name!r} offers the {_what(category)} {item!r} twice; offer each name once"
            )
        offered[key] = value

    def _refuse_clashes(self, offered: dict, name: str) -> None:
        """Refuse the whole plugin if any name it offers is already provided, naming every clash and
        what is dropped with it (a plugin is registered whole or not at all)."""
        clashes = [
            f"{_what(category)} {item!r} is provided by plugin {self._providers[(category, item)]!r} and again "
            f"by plugin {name!r}"
            for category, item in offered
            if (category, item) in self._providers
        ]
        if not clashes:
            return
        dropped = sorted(f"{_what(c)} {i!r}" for c, i in offered if (c, i) not in self._providers)
        also = f"; its other offers were not registered either: {', '.join(dropped)}" if dropped else ""
        raise DuplicateNameError("; ".join(clashes) + f"; names must be unique: rename one of them{also}")

    # ---- lookups ---------------------------------------------------------------------------
    def components(self, category: str) -> dict[str, type[ComponentOptions]]:
        """Registered kinds of ``category``, by name."""
        if category not in CATEGORIES:
            raise UnknownNameError("component category", category, CATEGORIES)
        return dict(sorted(self.load()._components[category].items()))

    def component(self, category: str, kind: str) -> type[ComponentOptions]:
        """The options class of one kind."""
        kinds = self.components(category)
        if kind not in kinds:
            raise UnknownNameError(f"{category} kind", str(kind), kinds, hint=LOAD_HINT)
        return kinds[kind]

    def default_kind(self, category: str) -> str:
        return CATEGORIES[category].default_kind

    def variants(self, pattern: str = "*") -> list[str]:
        """Registered variant names matching a shell-style ``pattern``, sorted."""
        return sorted(n for n in self.load()._variants if fnmatch.fnmatchcase(n, pattern))

    def variant(self, name: str) -> Variant:
        self.load()
        if name not in self._variants:
            raise UnknownNameError("variant", name, self._variants, hint=LOAD_HINT)
        return self._variants[name]

    def importers(self) -> list[Importer]:
        """The registered checkpoint formats, by name."""
        return [importer for _, importer in sorted(self.load()._importers.items())]

    def exporters(self, family: str) -> dict[str, Callable[..., Path]]:
        """The formats besides the zoo's own that ``family``'s models save in, by name: the
        ``save`` of each importer that writes that family."""
        return {i.format: i.save for i in self.importers() if i.family == family and i.save and i.format}

    def trackers(self, run: TrackedRun) -> list[Tracker]:
        """The trackers the registered plugins give ``run`` (their ``tzoo_tracker`` hooks).

        Raises:
            PluginLoadError: a plugin's hook returned something that is not a tracker.
        """
        found = self.load().pm.hook.tzoo_tracker(run=run)
        for tracker in found:
            if not isinstance(tracker, Tracker):
                raise PluginLoadError(
                    f"a plugin's tzoo_tracker returned {tracker!r}; expected an object with "
                    "log(step, scalars) and finish(scores) (see transformer_zoo.core.tracking.Tracker)"
                )
        return found

    def provider(self, category: str, name: str) -> str:
        """The name of the plugin that offers a component kind or (``category="variant"``) a variant."""
        return self.load()._providers[(category, name)]

    def plugin_module(self, name: str) -> str:
        """The module a registered plugin is, as ``--plugin`` would name it; the plugin's name when it
        is no importable module (an object or module made in a notebook or in ``__main__``)."""
        plugin = self.load().pm.get_plugin(name)
        if plugin is None:
            raise UnknownNameError("plugin", name, [n for n, _ in self.pm.list_name_plugin()])
        return plugin.__name__ if _importable(plugin) else name

    # ---- which plugins a saved config needs ------------------------------------------------
    def providers_of(self, config: Any) -> dict[str, str]:
        """The plugin module that provides each kind and variant ``config`` uses, to be saved with it.

        Args:
            config: a validated model config (its ``variant`` and every component kind in it), a
                task's options, or anything holding them: a training config, a list, a mapping.

        Returns:
            ``"category:name"`` (``"task:reverse"``, ``"attention:local"``, ``"variant:bert-tiny"``)
            -> plugin module (``"transformer_zoo.plugins.tasks"``), sorted; what :meth:`missing_plugin_hint`
            and :meth:`saved_plugins` read back.
        """
        self.load()
        found: dict[str, str] = {}

        def walk(value: Any) -> None:
            if isinstance(value, ComponentOptions):
                key: tuple[str, str] | None = (value.category, value.kind)
            elif isinstance(value, VariantConfig):
                key = ("variant", value.variant)
            else:
                key = None
            if key is not None and key in self._providers:
                found[f"{key[0]}:{key[1]}"] = self.plugin_module(self._providers[key])
            if isinstance(value, BaseModel):
                for field in type(value).model_fields:
                    walk(getattr(value, field))
            elif isinstance(value, Mapping):
                for item in value.values():
                    walk(item)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    walk(item)

        walk(config)
        return dict(sorted(found.items()))

    def missing_plugins(self, record: Mapping[str, str]) -> dict[str, str]:
        """The entries of a :meth:`providers_of` record that nothing loaded provides now (neither a
        kind nor a variant): ``"category:name"`` -> the module that did."""
        self.load()
        return {key: module for key, module in record.items() if tuple(key.split(":", 1)) not in self._providers}

    def missing_plugin_hint(
        self, record: Mapping[str, str] | None, category: str | None = None, name: str | None = None
    ) -> str:
        """How to load what a saved run used and this process lacks, from the run's
        :meth:`providers_of` record: one clause per missing kind or variant, such as ``task kind
        'my-task' was provided by plugin module 'my_pkg.zoo' when this run was saved; load it with
        --plugin my_pkg.zoo or TZOO_PLUGINS=my_pkg.zoo``. With ``category`` and ``name``, only that
        lookup (``category="variant"`` for a variant). ``""`` when nothing is missing (or no record).
        """
        missing = self.missing_plugins(record or {})
        if category is not None:
            missing = {k: m for k, m in missing.items() if k == f"{category}:{name}"}
        clauses = []
        for key, module in missing.items():
            what, item = key.split(":", 1)
            clauses.append(
                f"{_what(what)} {item!r} was provided by plugin module {module!r} when this run was saved; "
                f"load it with --plugin {module} or TZOO_PLUGINS={module}"
            )
        return "; ".join(clauses)

    @contextmanager
    def saved_plugins(self, record: Mapping[str, str] | None) -> Iterator[None]:
        """Around reading a saved run's config (``tzoo evaluate``, ``from_pretrained``): an error
        raised inside while a kind or variant of ``record`` (its :meth:`providers_of`) is missing
        says which plugin module provided it and how to load it. A :class:`ZooError` gets the hint
        after its message; another ``ValueError`` (a pydantic ``ValidationError``) is raised as a
        :class:`ConfigError` with the hint, from the original. With nothing missing, errors pass
        unchanged.

        >>> with get_registry().saved_plugins(saved.get("plugins")):
        ...     config = load_config(saved["model"])
        """
        try:
            yield
        except (ZooError, ValueError) as exc:
            hint = self.missing_plugin_hint(record)
            if not hint:
                raise
            if isinstance(exc, ZooError) and exc.args:
                exc.args = (f"{exc.args[0]}; {hint}", *exc.args[1:])
                raise
            raise ConfigError(f"{exc}; {hint}") from exc


def _what(category: str) -> str:
    return category if category in ("variant", "importer") else f"{category} kind"


def _importable(plugin: Any) -> bool:
    """Whether a plugin is a module another process could import by its name."""
    if not inspect.ismodule(plugin) or plugin.__name__ == "__main__":
        return False
    try:
        return importlib.util.find_spec(plugin.__name__) is not None
    except (ImportError, ValueError):  # a module made on the fly has no spec
        return False


def _origin(plugin: Any) -> str:
    """Where a registered plugin comes from, for messages: its module, or its type."""
    return f"module {plugin.__name__}" if inspect.ismodule(plugin) else f"a {type(plugin).__name__} object"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while loading"
    if isinstance(exc, PluginLoadError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def import_plugin_module(module: str) -> Any:
    """Import a plugin module named by ``--plugin`` or ``$TZOO_PLUGINS``.

    Raises:
        PluginLoadError: the module is not found (on ``sys.path`` or installed); or it was found
            and its own import failed: a module it imports is missing (named, with the package
            to install), or its code raised (or called ``sys.exit()``).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name == module or module.startswith(f"{exc.name}."):  # the module itself
            raise PluginLoadError(
                f"plugin module {module!r} could not be imported ({exc}); give a module importable from "
                "here (installed, or on sys.path: the tzoo command also looks in the current folder), such "
                "as my_package.zoo_plugin"
            ) from None
        raise PluginLoadError(
            f"plugin module {module!r} was found, but importing it failed: {_lacking(exc.name)}"
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # its own code failed while importing, sys.exit() included
        raise PluginLoadError(
            f"plugin module {module!r} failed while being imported: {_describe(exc)}; fix the module or leave it out"
        ) from None


def _lacking(missing: str) -> str:
    """What a plugin lacks when its import of module ``missing`` found nothing: a package, or a
    module of a package that is there."""
    package = missing.partition(".")[0]
    try:
        installed = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        installed = False
    if installed and package != missing:
        return (
            f"it imports {missing!r}, which the package {package!r} does not have; fix the import or leave the "
            "plugin out"
        )
    return (
        f"it imports {missing!r}, and the package {package!r} is not installed here; install the package that "
        "provides it (with the plugin's other requirements), or leave the plugin out"
    )


def plugin_modules(text: str) -> list[str]:
    """Module names from a comma-separated list (``$TZOO_PLUGINS``), blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry.load()


use_kinds(get_registry)  # what config validation reads when no registry is in its context
