"""Configs: loading, merging, overrides, and the messages a bad config gets."""

from __future__ import annotations

import json

import pytest

import transformer_zoo as tz
from transformer_zoo.api import merge, parse_overrides
from transformer_zoo.core.options import CATEGORIES
from transformer_zoo.registry import get_registry


def test_yaml_json_and_dict_give_the_same_config(tmp_path):
    data = {"variant": "transformer-tiny", "d_model": 32, "encoder": {"layers": 3}}
    (tmp_path / "c.json").write_text(json.dumps(data))
    (tmp_path / "c.yaml").write_text("variant: transformer-tiny\nd_model: 32\nencoder:\n  layers: 3\n")
    configs = [tz.load_config(data), tz.load_config(tmp_path / "c.json"), tz.load_config(str(tmp_path / "c.yaml"))]
    assert configs[0] == configs[1] == configs[2]
    assert configs[0].encoder.layers == 3 and configs[0].decoder.layers == 2  # preset value kept
    assert configs[0].n_heads == 4  # from the preset


def test_dotted_overrides_are_typed():
    assert parse_overrides(["encoder.layers=3", "dropout=0", "decoder=null", "norm.kind=rmsnorm"]) == {
        "encoder": {"layers": 3},
        "dropout": 0,
        "decoder": None,
        "norm": {"kind": "rmsnorm"},
    }
    config = tz.load_config({"variant": "transformer-tiny"}, ["encoder.layers=3", "decoder=null"])
    assert config.encoder.layers == 3 and config.decoder is None
    assert parse_overrides(["positional.kind=rotary", "positional.base=500"]) == {"positional": {"kind": "rotary", "base": 500}}
    with pytest.raises(tz.ConfigError, match="write positional.kind=rotary instead"):
        parse_overrides(["positional=rotary", "positional.base=500"])


def test_a_changed_kind_replaces_the_old_options():
    merged = merge({"norm": {"kind": "batchnorm", "momentum": 0.2}}, {"norm": {"kind": "rmsnorm"}})
    assert merged == {"norm": {"kind": "rmsnorm"}}
    config = tz.load_config({"variant": "transformer-tiny", "norm": {"kind": "batchnorm", "momentum": 0.2}}, {"norm": {"kind": "rmsnorm"}})
    assert config.norm.kind == "rmsnorm"


def test_a_kind_name_alone_is_enough():
    config = tz.load_config({"variant": "transformer-tiny", "positional": "rotary"})
    assert config.positional.kind == "rotary"
    kept = tz.load_config({"variant": "transformer-tiny", "head": "lm"})
    assert kept.head.label_smoothing == 0.1, "the same kind by name keeps the preset's options"


def test_preset_values_merge_over_the_class_defaults():
    from transformer_zoo.core.options import Variant
    from transformer_zoo.plugins.transformer import TransformerConfig
    from transformer_zoo.registry import hookimpl

    class Plugin:
        @staticmethod
        @hookimpl
        def tzoo_variants():
            return [Variant(name="preset-merge", config=TransformerConfig, defaults={"head": {"bias": True}, "decoder": {"layers": 1}})]

    name = tz.register_plugin(Plugin)
    try:
        assert name == "Plugin"
        config = tz.load_config({"variant": "preset-merge"})
        assert config.head.bias and config.head.label_smoothing == 0.1, "class default kept beside the preset's value"
        assert config.decoder.layers == 1 and config.decoder.attention.kind == "sdpa"
    finally:
        get_registry().unregister(name)


def test_config_round_trips_through_json():
    config = tz.load_config({"variant": "transformer-tiny", "ffn": {"kind": "gated", "activation": "gelu"}})
    again = tz.load_config(json.loads(json.dumps(config.model_dump(mode="json"))))
    assert again == config


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        ({"dmodel": 3}, ["unknown key 'dmodel'", "did you mean 'd_model'", "allowed keys"]),
        ({"encoder": {"lyers": 2}}, ["encoder:", "unknown key 'lyers'", "did you mean 'layers'"]),
        ({"d_model": "wide"}, ["d_model:", "valid integer", "'wide'"]),
        ({"dropout": 1.5}, ["dropout:", "less than 1"]),
        ({"n_heads": 3}, ["n_heads=3 does not divide d_model=64", "choose n_heads among [1, 2, 4, 8, 16, 32, 64]"]),
        ({"norm": "groupnorm"}, ["norm:", "unknown norm kind 'groupnorm'", "layernorm"]),
        ({"encoder": None, "decoder": None}, ["keep at least one stack"]),
        ({"tgt_vocab_size": 7}, ["share_embeddings needs one vocabulary"]),
        ({"ffn": {"activation": "tanh"}}, ["ffn.activation:", "'relu', 'gelu' or 'silu'"]),
    ],
)
def test_bad_configs_name_the_field_and_what_is_allowed(data, fragments):
    with pytest.raises(tz.ConfigError) as info:
        tz.load_config({"variant": "transformer-tiny", **data})
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_variant_lists_close_names():
    with pytest.raises(tz.UnknownNameError, match="did you mean 'transformer-tiny'"):
        tz.load_config({"variant": "transfomer-tiny"})
    with pytest.raises(tz.ConfigError, match="needs a 'variant' key"):
        tz.load_config({"d_model": 3})
    with pytest.raises(tz.ConfigError, match="key=value"):
        parse_overrides(["encoder.layers"])


def test_missing_or_broken_config_files(tmp_path):
    with pytest.raises(tz.ConfigError, match="does not exist"):
        tz.load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("variant: [unclosed")
    with pytest.raises(tz.ConfigError, match="not valid YAML"):
        tz.load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_every_registered_option_is_described(category):
    for kind, options in get_registry().components(category).items():
        assert (options.__doc__ or "").strip(), f"{category} kind {kind!r} needs a docstring"
        for name, field in options.model_fields.items():
            assert name == "kind" or field.description, f"{category} kind {kind!r}: field {name!r} has no description"


def test_every_variant_config_field_is_described():
    for name in tz.list_variants():
        config = get_registry().variant(name).config
        undocumented = [f for f, info in config.model_fields.items() if not info.description]
        assert not undocumented, f"{config.__name__} fields without description: {undocumented}"
