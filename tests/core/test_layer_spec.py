"""One layer spec: a family describes its layers once, and every layer and attention kind is
built from that description, so an option every layer takes is one edit."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest

import transformer_zoo as tz
from transformer_zoo.core import options as options_module
from transformer_zoo.core.layers import TransformerLayer
from transformer_zoo.core.options import AttentionOptions, LayerFields, LayerSpec
from transformer_zoo.core.weights import build_on_meta
from transformer_zoo.registry import get_registry


def test_a_layer_wide_option_is_one_edit_and_reaches_every_registered_familys_layers(monkeypatch):
    """A made-up field added to the spec in one place reaches every layer of every registered
    variant, and every attention kind those layers build: a family or kind that built a layer
    or an attention module from hand-forwarded arguments would not pass it on."""

    @dataclass(frozen=True)
    class WithMadeUp(LayerSpec):
        made_up: str = "reached"

    monkeypatch.setattr(options_module, "LayerSpec", WithMadeUp)  # the one edit
    seen_by_attention: dict[str, set[str]] = defaultdict(set)
    build = AttentionOptions.build

    def recording(self, layer):
        seen_by_attention[self.kind].add(getattr(layer, "made_up", "missing"))
        return build(self, layer)

    monkeypatch.setattr(AttentionOptions, "build", recording)
    layers_by_family: dict[str, int] = defaultdict(int)
    for name in tz.list_variants():
        config = tz.load_config(name)
        model = build_on_meta(config.build)
        assert model is not None, f"{name} does not build on the meta device"
        layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
        assert all(layer.spec is not None and layer.spec.made_up == "reached" for layer in layers), name
        layers_by_family[config.family] += len(layers)
    with_layers = {family for family, count in layers_by_family.items() if count}
    assert {"transformer", "bert", "universal-transformer", "local-global", "image-attention"} <= with_layers
    assert seen_by_attention and all(seen == {"reached"} for seen in seen_by_attention.values()), seen_by_attention


def test_every_layer_wide_field_is_declared_once_and_read_by_name():
    """The config fields a layer reads are :class:`LayerFields`, which every family with layers
    inherits, and each is a field of the spec that ``layer_spec`` fills by name."""
    spec_fields = set(LayerSpec.__dataclass_fields__)
    assert set(LayerFields.model_fields) <= spec_fields
    for name in tz.list_variants():
        config = tz.load_config(name)
        if not isinstance(config, LayerFields):
            continue
        spec = config.layer_spec()
        assert {field: getattr(spec, field) for field in LayerFields.model_fields} == {
            field: getattr(config, field) for field in LayerFields.model_fields
        }, name


@pytest.mark.parametrize(
    ("variant", "overrides", "message"),
    [
        (
            "transformer-tiny",
            {"decoder.attention": "linformer"},
            "decoder.attention: linformer attention cannot be causal",
        ),
        ("transformer-tiny", {"decoder.cross_attention": "block-sparse"}, "decoder.cross_attention: block-sparse"),
        (
            "transformer-tiny",
            {"encoder.attention": "local-2d"},
            "encoder.attention: local-2d attention runs over a grid",
        ),
        ("transformer-tiny", {"positional": "rotary", "encoder.attention": "linear"}, "cannot apply rotary positions"),
        ("transformer-tiny", {"positional": "alibi", "encoder.attention": "performer"}, "cannot add the bias alibi"),
        ("transformer-tiny", {"encoder.attention": {"kind": "sdpa", "n_kv_heads": 3}}, "n_kv_heads=3 does not divide"),
        ("vit-tiny", {"encoder.attention": {"kind": "sdpa", "n_kv_heads": 3}}, "encoder.attention: n_kv_heads=3"),
        (
            "image-transformer-tiny",
            {"encoder.attention": {"kind": "local-2d", "query_block": [16, 16]}},
            "encoder.attention: query_block",
        ),
    ],
)
def test_capabilities_are_checked_in_one_place_for_every_family(variant, overrides, message):
    with pytest.raises(tz.ConfigError, match=message):
        tz.load_config(variant, overrides)


def test_a_positional_kind_that_acts_inside_attention_says_so_and_building_checks_it():
    from typing import ClassVar, Literal

    from torch import nn

    from transformer_zoo.core.attention import AttentionPositional
    from transformer_zoo.core.config import positional_modules
    from transformer_zoo.core.options import PositionalOptions

    class Undeclared(PositionalOptions):
        kind: Literal["undeclared"] = "undeclared"

        def build(self, *, d_model: int, n_heads: int, max_len: int) -> nn.Module:
            return AttentionPositional()

    class Declared(Undeclared):
        kind: Literal["declared"] = "declared"
        in_attention: ClassVar[bool] = True

    with pytest.raises(ValueError, match="undeclared positions .* declare in_attention = False"):
        positional_modules(Undeclared(), d_model=16, n_heads=2, max_len=8)
    assert positional_modules(Declared(), d_model=16, n_heads=2, max_len=8)[0] is None
    linear = get_registry().component("attention", "linear")()
    with pytest.raises(ValueError, match="linear attention keeps running sums over keys"):
        linear.check_use(n_heads=2, max_len=8, positional=Declared())
    linear.check_use(n_heads=2, max_len=8, positional=Undeclared())  # added to the embeddings: any kind takes it
