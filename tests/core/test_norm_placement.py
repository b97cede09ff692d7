"""Where a layer's norms go (pre, post, sandwich, output), each against its equation written out
here and against transformers' Gemma 2 and OLMo 2 decoder layers; and the norm and activation
those models bring (RMSNorm scaled by 1 + w, GELU's tanh approximation) against transformers' own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.config import build_layer
from transformer_zoo.core.layers import ACTIVATIONS, TransformerLayer, UnitOffsetRMSNorm
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.registry import get_registry

transformers = pytest.importorskip("transformers")

D = 16
PLACEMENTS = ("pre", "post", "sandwich", "output")

EQUATIONS = {  # sub-layer f with its norm n (and the sandwich's second norm m), residual dropout drop
    "pre": lambda x, f, n, m, drop: x + drop(f(n(x))),
    "post": lambda x, f, n, m, drop: n(x + drop(f(x))),
    "sandwich": lambda x, f, n, m, drop: x + drop(m(f(n(x)))),
    "output": lambda x, f, n, m, drop: x + drop(n(f(x))),
}


def options(category: str, value):
    """The validated options of a component value (a kind name or a mapping)."""
    data = {"kind": value} if isinstance(value, str) else value
    registry = get_registry()
    kind = data.get("kind", registry.default_kind(category))
    return registry.component(category, kind).model_validate({**data, "kind": kind})


class Mixer(nn.Module):
    """Attention's stand-in, called as a layer calls attention: ``tanh(W x)``, plus the memory's
    mean over its positions when given one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x, memory=None, *, mask=None, cache=None, need_weights=False):
        out = torch.tanh(self.proj(x))
        return (out if memory is None else out + memory.mean(1, keepdim=True)), None


def random_layer_norms(count: int) -> list[nn.LayerNorm]:
    """Layer norms each with its own random gain and bias, so one in the wrong place shows."""
    norms = [nn.LayerNorm(D) for _ in range(count)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.normal_(1.0, 0.5)
            norm.bias.normal_(0.0, 0.5)
    return norms


def hand_built(placement: str, cross: bool, dropout: float = 0.0) -> TransformerLayer:
    torch.manual_seed(0)
    count = 3 if cross else 2
    return TransformerLayer(
        Mixer(),
        nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D)),
        random_layer_norms(count),
        cross_attn=Mixer() if cross else None,
        post_norms=random_layer_norms(count) if placement == "sandwich" else None,
        dropout=dropout,
        placement=placement,
    )


def by_equation(layer: TransformerLayer, placement: str, x, memory=None, *, drop=None, mask=None, post_norms=None):
    """The output of ``placement``'s equation, sub-layer after sub-layer, with ``layer``'s modules
    (and its second norms, or ``post_norms`` where it has none); ``drop`` the residual dropout."""
    blocks = [lambda h: layer.self_attn(h, mask=mask)[0]]
    if memory is not None:
        blocks.append(lambda h: layer.cross_attn(h, memory)[0])
    blocks.append(layer.ffn)
    post = layer.post_norms if layer.post_norms is not None else post_norms or [None] * len(blocks)
    for f, n, m in zip(blocks, layer.norms, post):
        x = EQUATIONS[placement](x, f, n, m, drop or (lambda t: t))
    return x


@pytest.mark.parametrize("cross", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_each_placement_computes_its_equation(placement, cross):
    layer = hand_built(placement, cross).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 3, D) if cross else None
    with torch.no_grad():
        out, _ = layer(x, memory)
        torch.testing.assert_close(out, by_equation(layer, placement, x, memory), rtol=0, atol=0)
        post_norms = random_layer_norms(len(layer.norms))
        others = [by_equation(layer, p, x, memory, post_norms=post_norms) for p in PLACEMENTS if p != placement]
    assert not any(torch.allclose(out, other, atol=1e-3) for other in others), "each placement computes its own"


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_residual_dropout_acts_on_the_branch_before_the_sum(placement):
    layer = hand_built(placement, cross=True, dropout=0.5).train()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 3, D)
    torch.manual_seed(1)
    out, _ = layer(x, memory)
    torch.manual_seed(1)
    expected = by_equation(layer, placement, x, memory, drop=lambda t: F.dropout(t, 0.5, training=True))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_built_layers_keep_the_norm_names_and_compute_the_equation_with_their_own_modules(placement):
    spec = LayerSpec(
        d_model=D,
        n_heads=2,
        d_ff=32,
        ffn=options("ffn", {"kind": "gated", "activation": "gelu-tanh"}),
        norm=options("norm", {"kind": "rmsnorm", "unit_offset": True}),
        norm_placement=placement,
    )
    torch.manual_seed(0)
    layer = build_layer(spec, options("attention", "sdpa"), cross_attention=options("attention", "sdpa")).eval()
    names = {name.rsplit(".", 1)[0] for name in layer.state_dict() if "norms" in name}
    second = {f"post_norms.{i}" for i in range(3)} if placement == "sandwich" else set()
    assert names == {f"norms.{i}" for i in range(3)} | second and layer.placement == placement
    with torch.no_grad():
        for name, weight in layer.named_parameters():
            if "norms" in name:
                weight.normal_(0.0, 0.5)
        x, memory, mask = torch.randn(2, 5, D), torch.randn(2, 3, D), AttentionMask(causal=True)
        out, _ = layer(x, memory, self_mask=mask)
        torch.testing.assert_close(out, by_equation(layer, placement, x, memory, mask=mask), rtol=0, atol=0)


def test_a_layer_refuses_norms_that_do_not_fit_its_placement():
    parts = (Mixer(), nn.Linear(D, D), random_layer_norms(2))
    with pytest.raises(ValueError, match="a sandwich layer needs a second norm per sub-layer: 2 post_norms, got none"):
        TransformerLayer(*parts, placement="sandwich")
    with pytest.raises(ValueError, match="2 post_norms, got 1"):
        TransformerLayer(*parts, placement="sandwich", post_norms=random_layer_norms(1))
    with pytest.raises(ValueError, match="post_norms are for placement='sandwich' without rezero; this layer has "):
        TransformerLayer(*parts, placement="pre", post_norms=random_layer_norms(2))
    with pytest.raises(ValueError, match="placement='middle'; expected one of pre, post, sandwich, output"):
        TransformerLayer(*parts, placement="middle")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_rezero_ignores_the_placement(placement):
    spec = LayerSpec(
        d_model=D,
        n_heads=2,
        d_ff=32,
        ffn=options("ffn", "mlp"),
        norm=options("norm", "layernorm"),
        norm_placement=placement,
    )
    layer = build_layer(spec, options("attention", "sdpa"), rezero=True)
    assert layer.post_norms is None and all(isinstance(n, nn.Identity) for n in layer.norms)
    with torch.no_grad():
        layer.alpha.copy_(torch.tensor([0.5, -2.0]))
        x = torch.randn(2, 5, D)
        h = x + 0.5 * layer.self_attn(x)[0]
        torch.testing.assert_close(layer(x)[0], h - 2.0 * layer.ffn(h), rtol=0, atol=0)


# ---- transformers' decoder layers ---------------------------------------------------------------
class Borrowed(nn.Module):
    """transformers' attention module, called as a zoo layer calls its self-attention: both
    layers run the same attention, so what is compared is what lies around it."""

    def __init__(self, attention: nn.Module, position_embeddings) -> None:
        super().__init__()
        self.attention, self.position_embeddings = attention, position_embeddings

    def forward(self, x, memory=None, *, mask=None, cache=None, need_weights=False):
        return self.attention(x, position_embeddings=self.position_embeddings, attention_mask=None)[0], None


def hf_layer(name: str):
    """transformers' decoder layer of model ``name`` (``gemma2``, ``olmo2``), small, every norm
    weight random; its rotary position embeddings module; and the config."""
    import importlib

    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    prefix = {"gemma2": "Gemma2", "olmo2": "Olmo2"}[name]
    config = getattr(modeling, f"{prefix}Config")(
        vocab_size=32,
        hidden_size=D,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    layer = getattr(modeling, f"{prefix}DecoderLayer")(config, layer_idx=0).eval()
    with torch.no_grad():
        for param_name, weight in layer.named_parameters():
            if "layernorm" in param_name:
                weight.normal_(0.0, 0.5)
    return layer, getattr(modeling, f"{prefix}RotaryEmbedding")(config), config


def positions(rotary, x):
    return rotary(x, torch.arange(x.size(1)).unsqueeze(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sandwich_with_unit_offset_rmsnorm_is_gemma2s_decoder_layer(dtype):
    theirs, rotary, config = hf_layer("gemma2")
    norm = options("norm", {"kind": "rmsnorm", "unit_offset": True, "eps": config.rms_norm_eps})

    def copy(hf_norm):
        ours = norm.build(d_model=D)
        ours.load_state_dict(hf_norm.state_dict())
        return ours

    x = torch.randn(2, 6, D)
    ours = TransformerLayer(
        Borrowed(theirs.self_attn, positions(rotary, x)),
        theirs.mlp,
        [copy(theirs.input_layernorm), copy(theirs.pre_feedforward_layernorm)],
        post_norms=[copy(theirs.post_attention_layernorm), copy(theirs.post_feedforward_layernorm)],
        placement="sandwich",
    ).eval()
    theirs.to(dtype), ours.to(dtype)
    ours.self_attn.position_embeddings = tuple(t.to(dtype) for t in ours.self_attn.position_embeddings)
    x = x.to(dtype)
    with torch.no_grad():
        expected = theirs(x, position_embeddings=ours.self_attn.position_embeddings, attention_mask=None)
        torch.testing.assert_close(ours(x)[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_placement_with_rmsnorm_is_olmo2s_decoder_layer(dtype):
    theirs, rotary, config = hf_layer("olmo2")
    norm = options("norm", {"kind": "rmsnorm", "eps": config.rms_norm_eps})

    def copy(hf_norm):
        ours = norm.build(d_model=D)
        ours.load_state_dict(hf_norm.state_dict())
        return ours

    x = torch.randn(2, 6, D)
    ours = TransformerLayer(
        Borrowed(theirs.self_attn, positions(rotary, x)),
        theirs.mlp,
        [copy(theirs.post_attention_layernorm), copy(theirs.post_feedforward_layernorm)],
        placement="output",
    ).eval()
    theirs.to(dtype), ours.to(dtype)
    ours.self_attn.position_embeddings = tuple(t.to(dtype) for t in ours.self_attn.position_embeddings)
    x = x.to(dtype)
    with torch.no_grad():
        expected = theirs(x, position_embeddings=ours.self_attn.position_embeddings, attention_mask=None)
        torch.testing.assert_close(ours(x)[0], expected, rtol=0, atol=0)


# ---- the norm and the activation ----------------------------------------------------------------
def random_input(dtype):
    torch.manual_seed(2)
    return (torch.randn(4, 7, 64) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_with_unit_offset_is_gemma2s(dtype):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    ours = options("norm", {"kind": "rmsnorm", "unit_offset": True}).build(d_model=64)
    assert isinstance(ours, UnitOffsetRMSNorm) and (ours.weight == 0).all(), "w starts at 0: a scale of 1"
    theirs = Gemma2RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(0.0, 0.5)
    theirs.load_state_dict(ours.state_dict())  # the same name, weight, holding w
    ours.to(dtype), theirs.to(dtype)
    x = random_input(dtype)
    with torch.no_grad():
        out = ours(x)
        assert out.dtype == dtype
        torch.testing.assert_close(out, theirs(x), rtol=0, atol=0)


def test_rmsnorm_is_llamas_in_float32_and_rounds_once_in_bfloat16():
    """nn.RMSNorm computes in float32 and rounds once, after the weight, as OLMo 2's norm does;
    Llama's rounds the normalised input before the weight too, one bfloat16 step apart at most."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    ours = options("norm", "rmsnorm").build(d_model=64)
    with torch.no_grad():
        ours.weight.normal_(1.0, 0.5)
    llama, olmo = LlamaRMSNorm(64, eps=1e-6), Olmo2RMSNorm(64, eps=1e-6)
    llama.load_state_dict(ours.state_dict()), olmo.load_state_dict(ours.state_dict())
    with torch.no_grad():
        x = random_input(torch.float32)
        torch.testing.assert_close(ours(x), llama(x), rtol=0, atol=0)
        ours.to(torch.bfloat16), llama.to(torch.bfloat16), olmo.to(torch.bfloat16)
        x = random_input(torch.bfloat16)
        torch.testing.assert_close(ours(x), olmo(x), rtol=0, atol=0)
        torch.testing.assert_close(ours(x), llama(x), rtol=2**-7, atol=0)


def test_gelu_tanh_is_transformers_gelu_pytorch_tanh_and_gelu_new():
    from transformers.activations import ACT2FN

    x = torch.linspace(-8, 8, 4001)
    ours = ACTIVATIONS["gelu-tanh"]()
    torch.testing.assert_close(ours(x), ACT2FN["gelu_pytorch_tanh"](x), rtol=0, atol=0)
    torch.testing.assert_close(ours(x), ACT2FN["gelu_new"](x), rtol=0, atol=1e-6)  # the same formula, spelt out
    assert (ours(x) - F.gelu(x)).abs().max() > 1e-4, "not the exact GELU"


def test_gelu_tanh_and_unit_offset_are_options_of_a_config():
    model = tz.build_model(
        "transformer-tiny",
        norm_placement="sandwich",
        norm={"kind": "rmsnorm", "unit_offset": True},
        ffn={"kind": "mlp", "activation": "gelu-tanh"},
    )
    layer = model.encoder.layers[0]
    assert isinstance(layer.post_norms[1], UnitOffsetRMSNorm) and isinstance(
        model.encoder.final_norm, UnitOffsetRMSNorm
    )
    assert isinstance(layer.ffn.activation, nn.GELU) and layer.ffn.activation.approximate == "tanh"
