"""Builders: configs unpack into functions of explicit arguments, and stacks receive built layers."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.config import build_encoder_decoder, build_layer, build_stack
from transformer_zoo.core.layers import StandardStack, TransformerLayer
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.core.recurrent import RecurrentStack, StepSignal
from transformer_zoo.registry import get_registry


def options(category: str, value):
    """The validated options of a component value (a kind name or a mapping)."""
    data = {"kind": value} if isinstance(value, str) else value
    registry = get_registry()
    kind = data.get("kind", registry.default_kind(category))
    return registry.component(category, kind).model_validate({**data, "kind": kind})


SIZES = dict(d_model=16, n_heads=2, d_ff=32, dropout=0.0)


def spec(**fields) -> LayerSpec:
    """A layer spec of the test's sizes, a mlp and a layer norm unless ``fields`` say otherwise."""
    return LayerSpec(**{**SIZES, "ffn": options("ffn", "mlp"), "norm": options("norm", "layernorm"), **fields})


def test_transformer_layer_builds_the_kinds_it_is_given():
    described = spec(ffn=options("ffn", "gated"), norm=options("norm", "rmsnorm"), norm_placement="pre")
    layer = build_layer(described, options("attention", "math"), cross_attention=options("attention", "sdpa"))
    assert layer.spec is described
    assert isinstance(layer, TransformerLayer) and layer.placement == "pre"
    assert type(layer.self_attn).__name__ == "MathAttention"
    assert type(layer.cross_attn).__name__ == "MultiHeadAttention"
    assert [type(n).__name__ for n in layer.norms] == ["RMSNorm"] * 3


def test_a_standard_stack_receives_its_layers_built_each_with_its_attention_kind():
    stack_options = options("stack", {"layers": 3, "attention": ["sdpa", "math"]})
    stack = build_stack(stack_options, spec(final_norm=True))
    assert isinstance(stack, StandardStack)
    assert [type(layer.self_attn).__name__ for layer in stack.layers] == [
        "MultiHeadAttention",
        "MathAttention",
        "MultiHeadAttention",
    ]
    assert isinstance(stack.final_norm, torch.nn.LayerNorm)


def test_a_recurrent_stack_shares_one_built_layer_and_takes_its_signal_as_an_argument():
    signal = StepSignal(16, 4)
    stack = build_stack(options("stack", {"kind": "recurrent", "layers": 4}), spec(), signal=signal)
    assert isinstance(stack, RecurrentStack) and stack.steps == 4 and stack.signal is signal
    x = torch.randn(2, 5, 16)
    assert stack(x).hidden.shape == (2, 5, 16)


def test_a_standard_stack_refuses_a_step_signal():
    with pytest.raises(ValueError, match="'standard' stack applies distinct layers and takes no step signal"):
        build_stack(options("stack", {"layers": 2}), spec(), signal=StepSignal(16, 2))


def test_the_universal_transformer_puts_positions_in_its_step_signal_and_not_in_the_embeddings():
    model = tz.build_model("universal-transformer-tiny")
    assert model.src_embed.positional is None and model.encoder.signal.positional is not None
    # a standard stack in the same family keeps its positions in the embeddings
    model = tz.build_model("universal-transformer-tiny", encoder={"kind": "standard", "layers": 2})
    assert model.src_embed.positional is not None and isinstance(model.encoder, StandardStack)
    # another family's recurrent stack adds the step index only
    model = tz.build_model("transformer-tiny", encoder={"kind": "recurrent", "layers": 3})
    assert model.src_embed.positional is not None and model.encoder.signal.positional is None


def test_a_recurrent_stack_with_a_list_of_attention_kinds_is_refused_at_validation():
    with pytest.raises(tz.ConfigError, match="encoder.attention: .*a recurrent stack shares one layer"):
        tz.load_config("universal-transformer-tiny", ["encoder.attention=[sdpa, math]"])


def test_image_models_give_local_2d_attention_its_grid_as_a_builder_argument():
    model = tz.build_model("image-transformer-tiny")
    attention = model.encoder.layers[0].self_attn
    assert type(attention).__name__ == "Local2dAttention"
    assert "grid" not in model.config.model_dump()["encoder"]["attention"]  # derived, not a user field


def test_a_family_config_is_unpacked_into_the_encoder_decoder_builder():
    config = tz.load_config("transformer-tiny", {"positional": "rotary", "norm_placement": "pre"})
    torch.manual_seed(0)
    by_name = tz.build_model(config)
    torch.manual_seed(0)
    layer = LayerSpec(
        d_model=config.d_model,
        n_heads=config.n_heads,
        d_ff=config.d_ff,
        dropout=config.dropout,
        ffn=options("ffn", "mlp"),
        norm=options("norm", "layernorm"),
        norm_placement="pre",
    )
    by_hand = build_encoder_decoder(
        layer,
        vocab_size=config.vocab_size,
        max_len=config.max_len,
        positional=options("positional", "rotary"),
        head=options("head", "lm"),
        encoder=config.encoder,
        decoder=config.decoder,
    )
    assert by_hand.state_dict().keys() == by_name.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(by_hand.state_dict().values(), by_name.state_dict().values()))
