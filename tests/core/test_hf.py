"""The Hugging Face bridge (transformer_zoo.core.hf) on families declared here as tables alone.

Two maps over the transformer family's decoder-only configuration stand for the decoder-only
families to come: GPT-2's layout (the query, key and value projections fused in one ``Conv1D``,
held transposed) and Llama's (separate query, key and value projections, with fewer key and
value heads than query heads, and the gate and up projections separate), each with tied and
untied embeddings. Neither family is offered by a plugin: the tests show that a table, with no
code, reads and writes ``transformers``' own folders.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz
from transformer_zoo.api import build_checked, load_config
from transformer_zoo.core.hf import ConfigField, HFMap, Weight, read_hf_folder, write_hf_folder

transformers = pytest.importorskip("transformers")

LM = {"kind": "lm", "bias": False, "label_smoothing": 0.0}
DECODER_ONLY = {"encoder": None, "norm_placement": "pre", "scale_embeddings": False, "dropout": 0.0}
H = "h.{i}."
GPT2 = HFMap(
    model_type="gpt2",
    title="GPT-2",
    family="transformer",
    variant="transformer",
    architectures=("GPT2LMHeadModel", "GPT2Model"),
    prefix="transformer.",
    base=("GPT2Model",),
    ignored=(H + "attn.bias", H + "attn.masked_bias"),  # older files' causal masks
    weights=(
        Weight("tgt_embed.token", "wte"),
        Weight("tgt_embed.positional.embedding", "wpe"),
        Weight("decoder.layers.{i}.norms.0", H + "ln_1"),
        Weight("decoder.layers.{i}.self_attn.in_proj", H + "attn.c_attn", transposed=True),
        Weight("decoder.layers.{i}.self_attn.out_proj", H + "attn.c_proj", transposed=True),
        Weight("decoder.layers.{i}.norms.1", H + "ln_2"),
        Weight("decoder.layers.{i}.ffn.linear1", H + "mlp.c_fc", transposed=True),
        Weight("decoder.layers.{i}.ffn.linear2", H + "mlp.c_proj", transposed=True),
        Weight("decoder.final_norm", "ln_f"),
        Weight("head.proj.weight", "lm_head.weight"),
    ),
    fields=(
        ConfigField("vocab_size", "vocab_size"),
        ConfigField("n_embd", "d_model"),
        ConfigField("n_head", "n_heads"),
        ConfigField("n_layer", "decoder.layers"),
        ConfigField("n_inner", "d_ff"),
        ConfigField("n_positions", "max_len", 1024),
        ConfigField("layer_norm_epsilon", "norm.eps", 1e-5),
        ConfigField("activation_function", "ffn.activation", "gelu_new", {"gelu": "gelu", "relu": "relu"}),
        ConfigField("tie_word_embeddings", "head.tie_weights", True),
    ),
    to_ours=lambda hf, names: {
        **DECODER_ONLY,
        "positional": "learned",
        "norm": {"kind": "layernorm"},
        "ffn": {"kind": "mlp"},
        "head": LM,
    },
)
L = "layers.{i}."
LLAMA = HFMap(
    model_type="llama",
    title="Llama",
    family="transformer",
    variant="transformer",
    architectures=("LlamaForCausalLM", "LlamaModel"),
    prefix="model.",
    base=("LlamaModel",),
    weights=(
        Weight("tgt_embed.token", "embed_tokens"),
        Weight("decoder.layers.{i}.norms.0", L + "input_layernorm"),
        Weight("decoder.layers.{i}.self_attn.in_proj", fused=tuple(f"{L}self_attn.{p}_proj" for p in "qkv")),
        Weight("decoder.layers.{i}.self_attn.out_proj", L + "self_attn.o_proj"),
        Weight("decoder.layers.{i}.norms.1", L + "post_attention_layernorm"),
        Weight("decoder.layers.{i}.ffn.gate_up", fused=(L + "mlp.gate_proj", L + "mlp.up_proj")),
        Weight("decoder.layers.{i}.ffn.down", L + "mlp.down_proj"),
        Weight("decoder.final_norm", "norm"),
        Weight("head.proj.weight", "lm_head.weight"),
    ),
    fields=(
        ConfigField("vocab_size", "vocab_size"),
        ConfigField("hidden_size", "d_model"),
        ConfigField("num_attention_heads", "n_heads"),
        ConfigField("num_key_value_heads", "decoder.attention.n_kv_heads"),
        ConfigField("num_hidden_layers", "decoder.layers"),
        ConfigField("intermediate_size", "d_ff"),
        ConfigField("max_position_embeddings", "max_len", 2048),
        ConfigField("rms_norm_eps", "norm.eps", 1e-6),
        ConfigField("hidden_act", "ffn.activation", "silu", {"silu": "silu"}),
        ConfigField("tie_word_embeddings", "head.tie_weights", False),
    ),
    to_ours=lambda hf, names: {
        **DECODER_ONLY,
        "positional": "rotary",
        "norm": {"kind": "rmsnorm"},
        "ffn": {"kind": "gated"},
        "decoder": {"attention": {"kind": "sdpa", "bias": False}},
        "head": LM,
    },
    to_theirs=lambda model: {"attention_bias": False, "mlp_bias": True},  # the zoo's gated FFN has biases
)
SIZES = dict(vocab_size=50, d_model=16, n_heads=4, d_ff=24, max_len=32, **DECODER_ONLY)


def gpt2_like(tie: bool):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer",
        **SIZES,
        decoder={"layers": 2},
        positional="learned",
        norm={"kind": "layernorm", "eps": 1e-5},
        ffn={"kind": "mlp", "activation": "gelu"},
        head={**LM, "tie_weights": tie},
    ).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.3)
    return model


def llama_like(tie: bool):
    torch.manual_seed(0)
    attention = {"kind": "sdpa", "bias": False, "n_kv_heads": 2}
    return tz.build_model(
        "transformer",
        **SIZES,
        decoder={"layers": 2, "attention": attention},
        positional="rotary",
        norm={"kind": "rmsnorm", "eps": 1e-6},
        ffn={"kind": "gated", "activation": "silu"},
        head={**LM, "tie_weights": tie},
    ).eval()


def load_cleanly(cls, path):
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items() if v} == {}, "missing, unexpected or mismatched weights"
    return model.eval()


def read_back(spec, path):
    config = json.loads((path / "config.json").read_text())
    return read_hf_folder(spec, path, config, validate=load_config, build=build_checked)


def assert_round_trip(spec, model, reference, tmp_path):
    """transformers' own folder of ``reference`` reads into the zoo as ``model``, under the same names."""
    reference.save_pretrained(tmp_path / "theirs")
    again = read_back(spec, tmp_path / "theirs")
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())
    theirs = safetensors.torch.load_file(tmp_path / "theirs" / "model.safetensors")
    ours = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    assert ours.keys() == theirs.keys()


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2s_transposed_fused_projections_are_a_table(tmp_path, tie):
    model = gpt2_like(tie)
    write_hf_folder(GPT2, model, tmp_path / "ours", validate=load_config)
    reference = load_cleanly(transformers.GPT2LMHeadModel, tmp_path / "ours")
    c_attn = reference.transformer.h[0].attn.c_attn.weight
    assert torch.equal(c_attn, model.decoder.layers[0].self_attn.in_proj.weight.t())  # (D, 3D) there
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(tgt=ids).logits, reference(ids).logits, atol=1e-5, rtol=0)
    assert_round_trip(GPT2, model, reference, tmp_path)


@pytest.mark.parametrize("tie", [True, False])
def test_llamas_separate_projections_with_fewer_key_value_heads_are_a_table(tmp_path, tie):
    model = llama_like(tie)
    write_hf_folder(LLAMA, model, tmp_path / "ours", validate=load_config)
    reference = load_cleanly(transformers.LlamaForCausalLM, tmp_path / "ours")
    attention = reference.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (16, 16) and attention.k_proj.weight.shape == (8, 16)  # 2 of 4 heads
    saved = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    assert ("lm_head.weight" in saved) is not tie, "a tied table is saved once, as transformers saves it"
    assert_round_trip(LLAMA, model, reference, tmp_path)


def test_a_field_without_a_mapped_value_and_a_missing_one_are_refused_together(tmp_path):
    write_hf_folder(GPT2, gpt2_like(True), tmp_path, validate=load_config)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["n_embd"]
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new"}))
    with pytest.raises(tz.ConfigError) as refused:
        read_back(GPT2, tmp_path)
    assert str(refused.value).splitlines() == [
        "this GPT-2 config cannot be read into the transformer family:",
        "  n_embd is missing; a GPT-2 config gives it",
        '  activation_function is "gelu_new"; the transformer family maps "gelu", "relu"',
    ]


def test_what_the_table_cannot_place_is_named(tmp_path):
    write_hf_folder(GPT2, gpt2_like(False), tmp_path, validate=load_config)
    state = safetensors.torch.load_file(tmp_path / "model.safetensors")
    state["transformer.h.0.attn.extra.weight"] = torch.zeros(3)
    state["lm_head.weight"] = state["lm_head.weight"][:, :8].clone()
    del state["transformer.ln_f.bias"]
    safetensors.torch.save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(tz.ConfigError) as refused:
        read_back(GPT2, tmp_path)
    message = str(refused.value)
    assert "not in the model the config describes: transformer.h.0.attn.extra.weight" in message
    assert "shape mismatch lm_head.weight -> head.proj.weight: checkpoint (50, 8), model (50, 16)" in message
    assert "missing from the checkpoint: transformer.ln_f.bias (for decoder.final_norm.bias)" in message
