"""Configs: loading, merging, overrides, and the messages a bad config gets."""

from __future__ import annotations

import json
from typing import ClassVar, Literal

import pytest
import torch
from pydantic import ValidationError

import transformer_zoo as tz
from transformer_zoo.configs import merge, parse_overrides
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention
from transformer_zoo.core.options import CATEGORIES, AttentionOptions, LayerSpec
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
    assert parse_overrides(["positional.kind=rotary", "positional.base=500"]) == {
        "positional": {"kind": "rotary", "base": 500}
    }
    with pytest.raises(tz.ConfigError, match="write positional.kind=rotary instead"):
        parse_overrides(["positional=rotary", "positional.base=500"])


def test_a_changed_kind_replaces_the_old_options():
    merged = merge({"norm": {"kind": "batchnorm", "momentum": 0.2}}, {"norm": {"kind": "rmsnorm"}})
    assert merged == {"norm": {"kind": "rmsnorm"}}
    config = tz.load_config(
        {"variant": "transformer-tiny", "norm": {"kind": "batchnorm", "momentum": 0.2}}, {"norm": {"kind": "rmsnorm"}}
    )
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
            return [
                Variant(
                    name="preset-merge",
                    config=TransformerConfig,
                    defaults={"head": {"bias": True}, "decoder": {"layers": 1}},
                )
            ]

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
        ({"ffn": {"activation": "tanh"}}, ["ffn.activation:", "'relu', 'relu2', 'gelu', 'gelu-tanh' or 'silu'"]),
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


def test_a_misspelt_key_in_a_nested_attention_kind_is_one_line_naming_its_path():
    with pytest.raises(tz.ConfigError) as info:
        tz.load_config("local-global-encoder-tiny", ["encoder.attention.windw=3"])
    allowed = ", ".join(sorted(get_registry().component("attention", "local-global").model_fields))
    assert str(info.value) == (
        "invalid config for variant 'local-global-encoder-tiny':\n"
        f"  encoder.attention: unknown key 'windw' (did you mean 'window'?); allowed keys for attention kind "
        f"'local-global': {allowed}"
    )


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["encoder.attention.window=-1"],
            "  encoder.attention.window: Input should be greater than or equal to 1 (got -1)",
        ),
        (
            ["encoder.attention=[sdpa, {kind: local-global, window: 0}]"],
            "  encoder.attention.1.window: Input should be greater than or equal to 1 (got 0)",
        ),
        (["encoder.attention=[sdpa, nope]"], "  encoder.attention.1: unknown attention kind 'nope'"),
        (
            ["encoder.attention=[sdpa, {kind: sliding-window, window: 5000}]"],
            "  encoder.attention.1: sliding-window window=5000 is not smaller than max_len=4096",
        ),
        (
            ["encoder.attention=7"],
            (
                "  encoder.attention: expected the name of one attention kind or a mapping with 'kind' or a "
                "list of them, got int"
            ),
        ),
        (
            ["encoder.attention=[]"],
            "  encoder.attention: give one attention kind or a non-empty list of them, got an empty list",
        ),
    ],
)
def test_a_nested_error_names_the_users_path_on_one_line(overrides, line):
    with pytest.raises(tz.ConfigError) as info:
        tz.load_config("local-global-encoder-tiny", overrides)
    message = str(info.value)
    assert message.count("\n") == 1, message  # the title, then one line for the one problem
    assert message.splitlines()[1].startswith(line)
    assert "function-" not in message and "list[" not in message


def test_two_problems_give_two_lines():
    with pytest.raises(tz.ConfigError) as info:
        tz.load_config("transformer-tiny", ["dropout=2", "encoder.attention.bias=maybe"])
    lines = str(info.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["dropout", "encoder.attention.bias"]


def test_validation_reads_the_registry_from_its_context():
    from transformer_zoo.core.options import NormOptions
    from transformer_zoo.registry import Registry, hookimpl

    class Scaled(NormOptions):
        """A norm known only to a registry of this test."""

        kind: Literal["test-scaled"] = "test-scaled"

    class Plugin:
        @hookimpl
        def tzoo_components(self):
            return [Scaled]

    mine = Registry(entry_points=False)
    mine.register(Plugin(), "test-norm")
    config = type(tz.load_config("transformer-tiny"))
    data = {"variant": "transformer-tiny", "norm": "test-scaled"}
    assert config.model_validate(data, context={"registry": mine}).norm.kind == "test-scaled"
    with pytest.raises(ValidationError, match="unknown norm kind 'test-scaled'"):
        config.model_validate(data)  # the process-wide registry has no such kind


def test_no_core_module_imports_the_registry():
    import ast
    from pathlib import Path

    import transformer_zoo.core

    core = Path(transformer_zoo.core.__file__).parent
    assert (core / "options.py").is_file()
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            assert not any("registry" in name for name in names), f"{path.name} imports {names}"


ATTENTION = get_registry().components("attention")


def test_a_common_attention_option_is_one_edit_and_reaches_every_registered_kind(monkeypatch):
    """A made-up common option added in one place, ``AttentionOptions.common_arguments``, reaches
    the module of every registered kind: a kind that built its module by hand would not pass it."""
    common, init = AttentionOptions.common_arguments, MultiHeadAttention.__init__

    def with_made_up(self, layer):  # the one edit
        return {**common(self, layer), "made_up": self.kind}

    def taking_made_up(module, *args, made_up=None, **kwargs):
        init(module, *args, **kwargs)
        module.made_up = made_up

    monkeypatch.setattr(AttentionOptions, "common_arguments", with_made_up)
    monkeypatch.setattr(MultiHeadAttention, "__init__", taking_made_up)
    received = {}
    for kind, options in ATTENTION.items():
        module = options(kind=kind).build(LayerSpec(d_model=16, n_heads=2, grid=(4, 4)))
        received[kind] = getattr(module, "made_up", None)
    assert received == {kind: kind for kind in ATTENTION}


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_what_a_kind_declares_is_what_its_module_does(kind):
    """``takes_causal`` and ``self_only`` are the module's behaviour, declared: a kind that says it
    can be causal runs under a causal mask, one that says it cannot raises there; a self-only kind's
    module refuses an encoder's memory, the others attend to it (validation refuses both first)."""
    options = ATTENTION[kind]
    module = options(kind=kind).build(LayerSpec(d_model=16, n_heads=2, grid=(4, 4))).eval()
    x, memory = torch.randn(2, 16, 16), torch.randn(2, 16, 16)
    if options.takes_causal:
        assert module(x, mask=AttentionMask(causal=True))[0].shape == (2, 16, 16)
    else:
        with pytest.raises(ValueError):
            module(x, mask=AttentionMask(causal=True))
    if options.self_only:
        with pytest.raises(ValueError, match="is for self-attention"):
            module(x, memory)
    else:
        assert module(x, memory)[0].shape == (2, 16, 16)


@pytest.mark.parametrize("kind", sorted(kind for kind, options in ATTENTION.items() if not options.takes_causal))
@pytest.mark.parametrize("model", [{}, {"encoder": None}], ids=["encoder-decoder", "decoder-only"])
def test_a_decoder_given_a_kind_that_cannot_be_causal_is_refused_at_validation(kind, model):
    decoder = {"layers": 1, "attention": kind}
    with pytest.raises(tz.ConfigError) as refused:
        tz.load_config("transformer-tiny", {**model, "decoder": decoder})
    message = str(refused.value)
    assert "decoder.attention" in message
    if kind != "local-2d":  # refused first for another reason: a token model has no grid for it
        assert f"{kind} attention cannot be causal" in message
        assert "use it in an encoder, or give the decoder a kind that can be causal" in message
        assert tz.load_config("transformer-tiny", {"encoder": {"attention": kind}}).encoder.attention.kind == kind


def test_key_value_heads_and_qk_norm_are_refused_where_a_kind_declares_it_cannot_take_them():
    """``takes_kv_heads`` and ``takes_qk_norm`` are checked with the other declarations, in
    ``AttentionOptions``: a kind that declares it cannot take one is refused with no check of its
    own, and every kind takes both unless it says otherwise."""

    class Latent(AttentionOptions):
        kind: Literal["made-up-latent"] = "made-up-latent"
        takes_kv_heads: ClassVar[bool] = False
        takes_qk_norm: ClassVar[bool] = False

    assert AttentionOptions.takes_kv_heads and AttentionOptions.takes_qk_norm
    assert Latent().n_kv_heads is None and Latent().qk_norm is None
    with pytest.raises(ValueError, match="made-up-latent attention .* n_kv_heads does not apply; remove n_kv_heads"):
        Latent(n_kv_heads=2)
    with pytest.raises(ValueError, match="made-up-latent attention normalises .* remove qk_norm, or use kind: sdpa"):
        Latent(qk_norm="head")
    refusing = {kind for kind, options in ATTENTION.items() if not (options.takes_kv_heads and options.takes_qk_norm)}
    assert refusing == {"mla"}
    for kind, options in ATTENTION.items():
        if kind not in refusing:
            options(kind=kind, n_kv_heads=2, qk_norm="head")
