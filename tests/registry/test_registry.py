"""The plugin manager: discovery, in-process registration, duplicates and broken plugins."""

from __future__ import annotations

import types
from typing import Literal

import pytest
from pydantic import Field

import transformer_zoo as tz
from transformer_zoo.core.errors import DuplicateNameError, PluginLoadError
from transformer_zoo.core.options import NormOptions, Variant
from transformer_zoo.plugins.transformer import TransformerConfig
from transformer_zoo.registry import BUILTIN_PLUGINS, PluginWarning, Registry, get_registry, hookimpl


class ScaleNorm(NormOptions):
    """ScaleNorm (Nguyen & Salazar 2019): one learned scale over the L2-normalised vector."""

    kind: Literal["scalenorm"] = "scalenorm"
    eps: float = Field(1e-5, description="floor on the norm")

    def build(self, *, d_model: int):
        import torch

        class _ScaleNorm(torch.nn.Module):
            def __init__(self, d: int, eps: float) -> None:
                super().__init__()
                self.g = torch.nn.Parameter(torch.tensor(d**0.5))
                self.eps = eps

            def forward(self, x):
                return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)

        return _ScaleNorm(d_model, self.eps)


def make_plugin(**hooks) -> types.ModuleType:
    """A plugin module made on the fly, as a notebook cell would define one."""
    plugin = types.ModuleType("plugin")
    for name, fn in hooks.items():
        setattr(plugin, name, hookimpl(fn))
    return plugin


@pytest.fixture
def notebook_plugin():
    """A plugin registered in-process, removed afterwards."""
    plugin = make_plugin(
        tzoo_components=lambda: [ScaleNorm],
        tzoo_variants=lambda: [
            Variant(
                name="scalenorm-tiny",
                config=TransformerConfig,
                defaults={
                    "norm": "scalenorm",
                    "vocab_size": 30,
                    "d_model": 16,
                    "n_heads": 2,
                    "d_ff": 32,
                    "encoder": {"layers": 1},
                    "decoder": {"layers": 1},
                },
            )
        ],
    )
    name = tz.register_plugin(plugin, "notebook")
    yield name
    get_registry().unregister(name)


def test_builtins_load_through_the_plugin_path_and_hooks_are_spelt_right():
    registry = get_registry()
    for name in BUILTIN_PLUGINS:
        assert registry.pm.has_plugin(name)
    registry.pm.check_pending()
    assert registry.load_errors == {}
    assert registry.provider("variant", "transformer-tiny") == "tzoo.transformer"
    assert registry.provider("attention", "sdpa") == "tzoo.components"


def test_a_misspelt_hook_fails_loudly():
    registry = Registry(builtins={}, entry_points=False)
    with pytest.raises(PluginLoadError, match="'typo' implements a hook that does not exist.*tzoo_variant"):
        registry.register(make_plugin(tzoo_variant=lambda: []), "typo")
    assert not registry.pm.has_plugin("typo")
    registry.pm.check_pending()


def test_in_process_registration(notebook_plugin):
    assert "scalenorm-tiny" in tz.list_variants("*-tiny")
    assert "scalenorm" in get_registry().components("norm")
    model = tz.build_model("scalenorm-tiny")
    assert type(model.encoder.layers[0].norms[0]).__name__ == "_ScaleNorm"
    config = tz.load_config({"variant": "transformer-tiny", "norm": {"kind": "scalenorm", "eps": 1e-3}})
    assert config.norm.eps == 1e-3


def test_unregister_removes_everything_it_offered(notebook_plugin):
    get_registry().unregister(notebook_plugin)
    assert "scalenorm-tiny" not in tz.list_variants()
    with pytest.raises(tz.ConfigError, match="unknown norm kind 'scalenorm'"):
        tz.load_config({"variant": "transformer-tiny", "norm": "scalenorm"})
    tz.register_plugin(make_plugin(tzoo_components=lambda: []), notebook_plugin)  # for the fixture's cleanup


def test_duplicate_names_are_errors_naming_both_plugins(notebook_plugin):
    clash = make_plugin(tzoo_components=lambda: [ScaleNorm])
    with pytest.raises(
        DuplicateNameError, match="'scalenorm' is provided by plugin 'notebook' and again by plugin 'clash'"
    ):
        tz.register_plugin(clash, "clash")
    assert not get_registry().pm.has_plugin("clash"), "a refused plugin is not left half-registered"
    twice = make_plugin(tzoo_variants=lambda: [Variant(name="transformer-tiny", config=TransformerConfig)])
    with pytest.raises(DuplicateNameError, match="'tzoo.transformer'"):
        tz.register_plugin(twice, "twice")


def test_registering_the_same_plugin_twice_is_a_no_op(notebook_plugin):
    """The same module through two routes (an entry point and --plugin, say): the first stands."""
    plugin = get_registry().pm.get_plugin(notebook_plugin)
    assert tz.register_plugin(plugin, "again") == notebook_plugin
    assert tz.register_plugin(plugin) == notebook_plugin
    assert not get_registry().pm.has_plugin("again")
    assert get_registry().provider("norm", "scalenorm") == notebook_plugin


def test_another_plugin_under_a_taken_name_is_one_clear_error(notebook_plugin):
    with pytest.raises(
        PluginLoadError,
        match="already registered under the name 'notebook' \\(from module plugin\\); "
        "register this one under another name$",
    ):
        tz.register_plugin(make_plugin(tzoo_components=lambda: []), notebook_plugin)


def test_malformed_offers_are_refused():
    with pytest.raises(PluginLoadError, match="expected a subclass"):
        tz.register_plugin(make_plugin(tzoo_components=lambda: [int]), "bad-component")

    class NoLiteral(NormOptions):
        """A norm whose kind is not a literal."""

        kind: str = "free"

    with pytest.raises(PluginLoadError, match="Literal"):
        tz.register_plugin(make_plugin(tzoo_components=lambda: [NoLiteral]), "bad-kind")


def test_a_plugin_that_fails_to_import_is_reported_and_the_rest_load():
    registry = Registry(builtins={**BUILTIN_PLUGINS, "broken": "transformer_zoo.no_such_module"}, entry_points=False)
    with pytest.warns(PluginWarning, match="'broken' failed to load"):
        registry.load()
    assert "broken" in registry.load_errors
    assert "ModuleNotFoundError" in registry.load_errors["broken"]
    assert "transformer-tiny" in registry.variants()


def test_unknown_kind_lists_the_close_names():
    with pytest.raises(tz.UnknownNameError, match="did you mean 'layernorm'"):
        get_registry().component("norm", "layernorn")
    with pytest.raises(tz.UnknownNameError, match="unknown component category 'normalisation'"):
        get_registry().components("normalisation")


def test_list_variants_takes_wildcards():
    assert tz.list_variants("transformer-*") == [
        "transformer-base",
        "transformer-big",
        "transformer-dmca-tiny",
        "transformer-tiny",
    ]
    assert tz.list_variants("nothing-*") == []


# ---- an unknown name says how to load the plugin that may provide it ----------------------------
@pytest.mark.parametrize(
    "lookup",
    [
        lambda r: r.component("norm", "scalenorm"),
        lambda r: r.variant("scalenorm-tiny"),
        lambda r: tz.load_config({"variant": "transformer-tiny", "norm": "scalenorm"}),
    ],
    ids=["kind", "variant", "config"],
)
def test_an_unknown_name_says_a_plugin_may_be_missing_and_how_to_load_one(lookup):
    with pytest.raises(tz.ZooError) as raised:
        lookup(get_registry())
    message = str(raised.value)
    assert "unknown" in message and "if a plugin provides it, load the plugin: --plugin MODULE" in message
    assert "TZOO_PLUGINS=MODULE" in message and "'transformer_zoo' entry point" in message


# ---- which plugin provided each kind of a saved config ----------------------------------------
def test_providers_of_names_the_module_behind_every_kind_and_variant(notebook_plugin):
    registry = get_registry()
    config = tz.load_config({"variant": "scalenorm-tiny", "encoder": {"attention": "sliding-window"}})
    record = registry.providers_of({"model": config, "task": registry.component("task", "reverse")()})
    assert record["variant:scalenorm-tiny"] == "notebook", "an object that is no importable module keeps its name"
    assert record["norm:scalenorm"] == "notebook"
    assert record["attention:sliding-window"] == "transformer_zoo.plugins.local_global"
    assert record["task:reverse"] == "transformer_zoo.plugins.tasks"
    assert list(record) == sorted(record) and all(":" in key for key in record)
    assert registry.missing_plugins(record) == {} and registry.missing_plugin_hint(record) == ""


def test_a_missing_plugin_of_a_saved_run_is_named_with_how_to_load_it(notebook_plugin):
    registry = get_registry()
    record = {
        "variant:transformer-tiny": "transformer_zoo.plugins.transformer",
        "norm:fancy": "fancy_pkg.zoo",
        "task:my-task": "my_pkg.tasks",
    }
    assert registry.missing_plugins(record) == {"norm:fancy": "fancy_pkg.zoo", "task:my-task": "my_pkg.tasks"}
    assert registry.missing_plugin_hint(record, "task", "my-task") == (
        "task kind 'my-task' was provided by plugin module 'my_pkg.tasks' when this run was saved; load it with "
        "--plugin my_pkg.tasks or TZOO_PLUGINS=my_pkg.tasks"
    )
    assert registry.missing_plugin_hint(record, "variant", "transformer-tiny") == ""
    assert registry.missing_plugin_hint(None) == ""
    with pytest.raises(
        tz.ConfigError,
        match="unknown norm kind 'fancy'.*; norm kind 'fancy' was provided by plugin "
        "module 'fancy_pkg.zoo' when this run was saved; load it with --plugin "
        "fancy_pkg.zoo or TZOO_PLUGINS=fancy_pkg.zoo",
    ):
        with registry.saved_plugins(record):
            tz.load_config({"variant": "transformer-tiny", "norm": "fancy"})
    with pytest.raises(ValueError, match="^boom; norm kind 'fancy'"):  # any ValueError: a pydantic one included
        with registry.saved_plugins(record):
            raise ValueError("boom")
    with pytest.raises(tz.ConfigError, match="unknown norm kind 'fancy'") as raised:  # no record: unchanged
        with registry.saved_plugins(None):
            tz.load_config({"variant": "transformer-tiny", "norm": "fancy"})
    assert "was provided by" not in str(raised.value)
