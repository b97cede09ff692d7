"""ReZero residuals (a stack's ``rezero: true``): every layer starts as the identity, its scales
learn, a model with them trains, every family that builds TransformerLayer offers it, and models
without it keep their state dicts."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.layers import TransformerLayer

STACKED = [
    "transformer-tiny",
    "bert-tiny",
    "universal-transformer-tiny",
    "local-global-encoder-tiny",
    "transformer-dmca-tiny",
    "vit-tiny",
    "image-transformer-tiny",
]
"""A tiny variant of each family whose stacks are made of TransformerLayers."""


def with_rezero(name: str, **overrides) -> torch.nn.Module:
    config = tz.load_config(name)
    stacks = {side: {"rezero": True} for side in ("encoder", "decoder") if getattr(config, side, None) is not None}
    return tz.build_model(name, **stacks, **overrides)


def layers(model: torch.nn.Module) -> list[TransformerLayer]:
    return [m for m in model.modules() if isinstance(m, TransformerLayer)]


@pytest.mark.parametrize("name", STACKED)
def test_every_family_takes_rezero_layers_without_norms(name):
    model = with_rezero(name)
    built = layers(model)
    assert built and all(layer.alpha is not None and (layer.alpha == 0).all() for layer in built)
    assert all(len(layer.alpha) == len(layer.norms) for layer in built), "one scale per sub-layer"
    assert not [key for key in model.state_dict() if ".norms." in key], "ReZero layers have no norms"


@pytest.mark.parametrize("name", STACKED)
def test_a_model_without_rezero_keeps_its_state_dict(name):
    torch.manual_seed(0)
    plain = tz.build_model(name)
    assert not any(key.endswith(".alpha") for key in plain.state_dict())
    assert all(layer.alpha is None for layer in layers(plain))
    torch.manual_seed(0)
    off = tz.build_model(
        name,
        **{side: {"rezero": False} for side in ("encoder", "decoder") if getattr(plain.config, side, None) is not None},
    )
    assert off.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(off.state_dict()[key], value) for key, value in plain.state_dict().items())


def test_each_layer_is_the_identity_at_initialisation():
    model = with_rezero("transformer-tiny", dropout=0.1).train()
    x = torch.randn(2, 5, model.config.d_model)
    memory = torch.randn(2, 7, model.config.d_model)
    padding = torch.ones(2, 5, dtype=torch.bool)
    padding[1, 3:] = False
    for layer in model.encoder.layers:
        assert torch.equal(layer(x, self_mask=AttentionMask(padding=padding))[0], x)
    for layer in model.decoder.layers:
        assert torch.equal(layer(x, memory, self_mask=AttentionMask(causal=True))[0], x)


def test_gradients_reach_every_alpha():
    model = with_rezero("transformer-tiny", dropout=0.0)
    src, tgt, targets = torch.randint(1, 50, (2, 6)), torch.randint(1, 50, (2, 5)), torch.randint(1, 50, (2, 5))
    model.loss(model(src, tgt), targets).backward()
    assert all((layer.alpha.grad != 0).all() for layer in model.decoder.layers)
    # at 0 the decoder's cross-attention branch hides the encoder: its scales learn once that one moves
    assert all((layer.alpha.grad == 0).all() for layer in model.encoder.layers)
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.alpha.fill_(0.1)
    model.zero_grad()
    model.loss(model(src, tgt), targets).backward()
    assert all((layer.alpha.grad != 0).all() for layer in layers(model))


def test_a_tiny_model_with_rezero_trains():
    torch.manual_seed(0)
    model = with_rezero("transformer-tiny", dropout=0.0, vocab_size=20).train()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(1, 20, (8, 6), generator=generator)
    tgt = torch.cat([torch.ones(8, 1, dtype=torch.long), src.flip(1)[:, :-1]], 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        optimizer.zero_grad()
        loss = model.loss(model(src, tgt), src.flip(1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    assert all((layer.alpha != 0).any() for layer in layers(model)), "the scales moved off 0"
