"""Plugins that fail in the ways real ones do: each is reported by name and the rest still load."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Literal

import pytest
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.errors import DuplicateNameError, PluginLoadError
from transformer_zoo.core.options import NormOptions, Variant
from transformer_zoo.plugins.transformer import TransformerConfig
from transformer_zoo.registry import BUILTIN_PLUGINS, PluginWarning, Registry, get_registry, hookimpl, manager


class ScaleNorm(NormOptions):
    """A norm kind offered by the plugins below."""

    kind: Literal["scalenorm"] = "scalenorm"

    def build(self, *, d_model: int) -> nn.Module:
        return nn.LayerNorm(d_model)


def make_plugin(**hooks) -> types.ModuleType:
    plugin = types.ModuleType("plugin")
    for name, fn in hooks.items():
        setattr(plugin, name, hookimpl(fn))
    return plugin


EXITS = "import sys\nsys.exit(3)\n"
RAISES = "raise RuntimeError('the plugin could not find its data')\n"
UNMARKED = textwrap.dedent("""
    from transformer_zoo import hookimpl

    def tzoo_variants():  # no @hookimpl: pluggy ignores it
        return []

    @hookimpl
    def tzoo_components():
        return []
""")


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path holding plugin modules that misbehave."""
    for name, text in {"exits_plugin": EXITS, "raises_plugin": RAISES, "unmarked_plugin": UNMARKED}.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("exits_plugin", "raises_plugin", "unmarked_plugin"):
        sys.modules.pop(name, None)


def registry_with(**extra: str) -> Registry:
    return Registry(builtins={**BUILTIN_PLUGINS, **extra}, entry_points=False)


def test_a_plugin_calling_sys_exit_at_import_is_reported_and_the_rest_load(modules: Path) -> None:
    registry = registry_with(exits="exits_plugin", raises="raises_plugin")
    with pytest.warns(PluginWarning) as warned:
        registry.load()
    assert registry.load_errors["exits"] == "it called sys.exit(3) while loading"
    assert registry.load_errors["raises"] == "RuntimeError: the plugin could not find its data"
    assert {"exits", "raises"} <= {str(w.message).split("'")[1] for w in warned}
    assert "transformer-tiny" in registry.variants()


def test_the_cli_survives_a_plugin_that_exits(modules: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")]),
        "TZOO_PLUGINS": "exits_plugin",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "transformer_zoo", "list", "transformer-tiny", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"transformer-tiny"' in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "exits_plugin" in lines[0] and "sys.exit(3)" in lines[0], result.stderr


def test_plugin_option_for_a_module_that_fails_while_importing_is_a_plugin_error(modules: Path) -> None:
    with pytest.raises(PluginLoadError, match=r"'raises_plugin' failed while being imported: RuntimeError"):
        get_registry().register_module("raises_plugin")
    with pytest.raises(PluginLoadError, match=r"sys.exit\(3\)"):
        get_registry().register_module("exits_plugin")


def test_a_hook_without_hookimpl_is_warned_about(modules: Path) -> None:
    registry = registry_with(unmarked="unmarked_plugin")
    with pytest.warns(PluginWarning, match=r"'unmarked': tzoo_variants looks like a hook implementation"):
        registry.load()
    assert "unmarked" not in registry.load_errors, "it loads: only the unmarked function is ignored"
    assert registry.load_warnings["unmarked"] == [
        (
            "tzoo_variants looks like a hook implementation but lacks @hookimpl (from transformer_zoo import hookimpl), "
            "so it is ignored"
        )
    ]


def test_a_marked_plugin_gives_no_warning(recwarn: pytest.WarningsRecorder) -> None:
    plugin = make_plugin(tzoo_components=lambda: [ScaleNorm])
    name = tz.register_plugin(plugin, "marked")
    try:
        assert not [w for w in recwarn if issubclass(w.category, PluginWarning)]
    finally:
        get_registry().unregister(name)


def test_a_clash_names_the_clashing_name_and_what_was_dropped() -> None:
    plugin = make_plugin(
        tzoo_components=lambda: [ScaleNorm],
        tzoo_variants=lambda: [
            Variant(name="transformer-tiny", config=TransformerConfig),
            Variant(name="my-tiny", config=TransformerConfig),
        ],
    )
    with pytest.raises(DuplicateNameError) as raised:
        tz.register_plugin(plugin, "clashing")
    message = str(raised.value)
    assert (
        "variant 'transformer-tiny' is provided by plugin 'tzoo.transformer' and again by plugin 'clashing'" in message
    )
    assert "its other offers were not registered either: norm kind 'scalenorm', variant 'my-tiny'" in message
    assert "my-tiny" not in tz.list_variants() and "scalenorm" not in get_registry().components("norm")
    assert not get_registry().pm.has_plugin("clashing")


def test_a_name_offered_twice_by_one_plugin_is_refused() -> None:
    plugin = make_plugin(tzoo_components=lambda: [ScaleNorm, ScaleNorm])
    with pytest.raises(DuplicateNameError, match="plugin 'twice' offers the norm kind 'scalenorm' twice"):
        tz.register_plugin(plugin, "twice")


def test_plugin_errors_exposes_load_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = registry_with(broken="transformer_zoo.no_such_module")
    with pytest.warns(PluginWarning, match="'broken' failed to load: ModuleNotFoundError"):
        registry.load()
    monkeypatch.setattr(manager, "_registry", registry)
    assert tz.plugin_errors() == {"broken": registry.load_errors["broken"]}
    assert "ModuleNotFoundError" in tz.plugin_errors()["broken"]


class RecordingEntryPoint:
    """An entry point of the ``transformer_zoo`` group that records whether it was loaded."""

    name, dist, loaded = "recording", None, False

    def load(self):
        RecordingEntryPoint.loaded = True
        return make_plugin(tzoo_variants=lambda: [])


@pytest.mark.parametrize("disabled", ["", "1"])
def test_entry_point_autoload_can_be_disabled(monkeypatch: pytest.MonkeyPatch, disabled: str) -> None:
    def entry_points(*, group: str):
        assert group == "transformer_zoo"
        return [RecordingEntryPoint()]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv("TZOO_DISABLE_PLUGIN_AUTOLOAD", disabled)
    monkeypatch.setattr(RecordingEntryPoint, "loaded", False)
    registry = Registry().load()
    assert RecordingEntryPoint.loaded is (not disabled)
    assert registry.pm.has_plugin("recording") is (not disabled)
    assert "transformer-tiny" in registry.variants(), "the built-in plugins load either way"


# ---- one plugin module through two routes is loaded once ----------------------------------------
TWICE = textwrap.dedent('''
    """A plugin installed through its entry point and also named with --plugin or $TZOO_PLUGINS."""
    from typing import Literal

    from torch import nn

    from transformer_zoo import hookimpl
    from transformer_zoo.core.options import NormOptions


    class TwiceNorm(NormOptions):
        """A norm kind of the plugin loaded twice."""

        kind: Literal["twicenorm"] = "twicenorm"

        def build(self, *, d_model: int) -> nn.Module:
            return nn.LayerNorm(d_model)


    @hookimpl
    def tzoo_components():
        return [TwiceNorm]
''')


class TwiceEntryPoint:
    """The ``transformer_zoo`` entry point of the installed package ``twice`` (``twice_plugin``)."""

    name, dist = "twice", None

    def load(self):
        import importlib

        return importlib.import_module("twice_plugin")


@pytest.fixture
def installed_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``twice_plugin`` importable and declared as an entry point; a fresh process-wide registry."""
    (tmp_path / "twice_plugin.py").write_text(TWICE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TZOO_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("TZOO_PLUGINS", raising=False)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda *, group: [TwiceEntryPoint()])
    monkeypatch.setattr(manager, "_registry", None)
    yield
    sys.modules.pop("twice_plugin", None)


def test_an_entry_point_plugin_named_again_is_loaded_once(installed_twice, recwarn: pytest.WarningsRecorder) -> None:
    registry = Registry().load()
    assert registry.provider("norm", "twicenorm") == "twice"
    assert registry.register_module("twice_plugin") == "twice", "--plugin of the same module: a no-op"
    assert registry.register_module("twice_plugin") == "twice"
    assert registry.register(sys.modules["twice_plugin"]) == "twice"
    assert registry.load_errors == {} and not [w for w in recwarn if issubclass(w.category, PluginWarning)]
    assert [name for name, _ in registry.pm.list_name_plugin()].count("twice") == 1


def test_an_entry_point_plugin_also_in_tzoo_plugins_is_loaded_once(
    installed_twice, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    monkeypatch.setenv("TZOO_PLUGINS", "twice_plugin, twice_plugin")
    registry = Registry().load()
    assert registry.load_errors == {} and not [w for w in recwarn if issubclass(w.category, PluginWarning)]
    assert registry.provider("norm", "twicenorm") == "twice"


@pytest.mark.parametrize(
    "argv",
    [
        ["--plugin", "twice_plugin", "list"],
        ["list", "--plugin", "twice_plugin"],
        ["--plugin", "twice_plugin", "list", "--plugin", "twice_plugin"],
    ],
    ids=["before", "after", "both"],
)
def test_the_cli_loads_an_entry_point_plugin_given_again_once(installed_twice, argv: list[str], capsys) -> None:
    from transformer_zoo.cli import main

    assert main([*argv, "--kind", "norm", "--json"]) == 0
    captured = capsys.readouterr()
    rows = [row for row in json.loads(captured.out) if row["name"] == "twicenorm"]
    assert rows == [
        {
            "name": "twicenorm",
            "kind": "norm",
            "plugin": "twice",
            "description": "A norm kind of the plugin loaded twice.",
        }
    ]
    assert "already registered" not in captured.err and "warning" not in captured.err


def test_plugin_before_the_command_is_taken_with_those_after_it(installed_twice, monkeypatch, tmp_path, capsys) -> None:
    """``tzoo --plugin A list --plugin B`` loads both (with autoload off, only through the options)."""
    monkeypatch.setenv("TZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
    (tmp_path / "other_plugin.py").write_text(TWICE.replace("twicenorm", "othernorm").replace("TwiceNorm", "OtherNorm"))
    importlib.invalidate_caches()
    from transformer_zoo.cli import main

    try:
        assert main(["--plugin", "twice_plugin", "list", "--kind", "norm", "--plugin", "other_plugin", "--json"]) == 0
    finally:
        sys.modules.pop("other_plugin", None)
    rows = {row["name"]: row["plugin"] for row in json.loads(capsys.readouterr().out)}
    assert rows["twicenorm"] == "twice_plugin" and rows["othernorm"] == "other_plugin"
