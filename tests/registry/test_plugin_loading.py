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


@pytest.mark.parametrize(
    ("code", "lacks"),
    [
        ("import tzoo_no_such_package.part\n", "the package 'tzoo_no_such_package' is not installed here"),
        ("import json.no_such_part\n", "it imports 'json.no_such_part', which the package 'json' does not have"),
    ],
)
def test_a_plugin_module_found_but_lacking_what_it_imports_names_it(code, lacks, tmp_path, monkeypatch) -> None:
    (tmp_path / "lacking_plugin.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(PluginLoadError) as raised:
            get_registry().register_module("lacking_plugin")
    finally:
        sys.modules.pop("lacking_plugin", None)
    message = str(raised.value)
    assert message.startswith("plugin module 'lacking_plugin' was found, but importing it failed: it imports")
    assert lacks in message and "importable from here" not in message
    monkeypatch.setenv("TZOO_PLUGINS", "lacking_plugin")  # the same message, by name, from the variable
    with pytest.warns(PluginWarning, match="'lacking_plugin' failed to load: plugin module 'lacking_plugin' was found"):
        Registry(entry_points=True).load()
    sys.modules.pop("lacking_plugin", None)


@pytest.mark.parametrize("module", ["tzoo_no_such_plugin", "tzoo_no_such_package.plugin", "json.no_such_plugin"])
def test_a_plugin_module_not_found_says_where_it_is_looked_for(module) -> None:
    with pytest.raises(PluginLoadError, match="could not be imported .*; give a module importable from here") as raised:
        get_registry().register_module(module)
    assert "current folder" in str(raised.value) and "was found" not in str(raised.value)


RELOADED = textwrap.dedent('''
    from typing import Literal

    from pydantic import Field
    from torch import nn

    from transformer_zoo import hookimpl
    from transformer_zoo.core.options import NormOptions


    class ReloadNorm(NormOptions):
        """VERSION"""

        kind: Literal["reloadnorm"] = "reloadnorm"
        eps: float = Field(EPS, description="the layer norm's epsilon")

        def build(self, *, d_model: int) -> nn.Module:
            return nn.LayerNorm(d_model, eps=self.eps)


    @hookimpl
    def tzoo_components():
        return [ReloadNorm]
''')


def test_a_module_registered_again_after_a_reload_replaces_what_it_offered(tmp_path, monkeypatch) -> None:
    """A notebook edits its plugin file, reloads it and registers it again: the new classes count."""
    import importlib

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = tmp_path / "reloading_plugin.py"
    path.write_text(RELOADED.replace("VERSION", "The first version.").replace("EPS", "1e-5"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import reloading_plugin  # type: ignore[import-not-found]

    registry = get_registry()
    try:
        name = tz.register_plugin(reloading_plugin)
        first = registry.component("norm", "reloadnorm")
        assert first is reloading_plugin.ReloadNorm and first().eps == 1e-5
        assert tz.register_plugin(reloading_plugin) == name, "unchanged: registering again is a no-op"
        assert registry.component("norm", "reloadnorm") is first
        path.write_text(RELOADED.replace("VERSION", "The second, edited version.").replace("EPS", "1e-3"))
        importlib.reload(reloading_plugin)
        assert tz.register_plugin(reloading_plugin) == name
        second = registry.component("norm", "reloadnorm")
        assert second is reloading_plugin.ReloadNorm and second is not first and second().eps == 1e-3
        assert registry.provider("norm", "reloadnorm") == name and name in registry.in_process
        model = tz.build_model("transformer-tiny", norm="reloadnorm")
        assert model.encoder.layers[0].norms[0].eps == 1e-3
        path.write_text(RELOADED.replace("VERSION", "Third.").replace("EPS", "1e-2"))
        importlib.reload(reloading_plugin)
        assert registry.register_module("reloading_plugin") == name, "--plugin's path replaces it too"
        assert registry.component("norm", "reloadnorm")().eps == 1e-2
    finally:
        if registry.pm.has_plugin("reloading_plugin"):
            registry.unregister("reloading_plugin")
        sys.modules.pop("reloading_plugin", None)


def test_a_reloaded_module_that_no_longer_registers_says_its_earlier_offers_are_gone(tmp_path, monkeypatch) -> None:
    import importlib

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = tmp_path / "clashing_plugin.py"
    path.write_text(RELOADED.replace("VERSION", "Mine.").replace("EPS", "1e-5"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import clashing_plugin  # type: ignore[import-not-found]

    registry = get_registry()
    try:
        name = tz.register_plugin(clashing_plugin)
        path.write_text(
            RELOADED.replace("VERSION", "Now a clash.").replace("EPS", "1e-5").replace("reloadnorm", "layernorm")
        )
        importlib.reload(clashing_plugin)
        with pytest.raises(DuplicateNameError, match="norm kind 'layernorm' is provided by plugin") as raised:
            tz.register_plugin(clashing_plugin)
        assert f"plugin {name!r} was registered again after a reload: what it offered before was removed" in str(
            raised.value
        )
        assert "reloadnorm" not in registry.components("norm") and not registry.pm.has_plugin(name)
    finally:
        if registry.pm.has_plugin("clashing_plugin"):
            registry.unregister("clashing_plugin")
        sys.modules.pop("clashing_plugin", None)
