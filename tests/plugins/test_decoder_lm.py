"""The decoder-only family: each real size has its source's published parameter count (built on
the meta device, against transformers' own model of the same config, also on meta), each tiny
size trains as a causal LM, and the initialisation is its source's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.plugins.decoder_lm import PUBLISHED

transformers = pytest.importorskip("transformers")

FAMILIES = ["gpt2", "llama", "qwen3", "gemma2", "olmo2"]


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied table once, as transformers counts it


def hf_config(name: str):
    """transformers' config of each real size, written out from its published config.json."""
    if name == "gpt2":
        return transformers.GPT2Config()
    if name == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        return transformers.LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_parameters=rope,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
        )
    if name == "qwen3":
        return transformers.Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
        )
    if name == "gemma2":
        return transformers.Gemma2Config()  # its defaults are Gemma 2 2B's... checked below by the count
    return transformers.Olmo2Config(
        vocab_size=100352,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_each_real_size_has_its_published_parameter_count(name):
    with torch.device("meta"):
        ours = count(tz.build_model(name))
        theirs = count(transformers.AutoModelForCausalLM.from_config(hf_config(name)))
    assert abs(ours - PUBLISHED[name]) <= 0.01 * PUBLISHED[name], (ours, PUBLISHED[name])
    assert ours == theirs


@pytest.mark.parametrize("name", FAMILIES)
def test_each_tiny_size_is_a_causal_lm_whose_first_loss_is_that_of_a_uniform_guess(name):
    torch.manual_seed(0)
    model = tz.build_model(f"{name}-tiny").eval()
    ids = torch.randint(3, 1000, (4, 32))
    out = model(ids, labels=ids)
    assert out.logits.shape == (4, 32, 1000)
    assert abs(out.loss.item() - math.log(1000)) < 0.25 * math.log(1000)
    changed = ids.clone()
    changed[:, 20:] = torch.randint(3, 1000, (4, 12))
    with torch.no_grad():  # the future does not reach the past
        torch.testing.assert_close(model(changed).logits[:, :20], out.logits[:, :20])


def test_gpt2_scales_its_residual_projections_down_by_the_depth():
    torch.manual_seed(0)
    model = tz.build_model("gpt2", vocab_size=1000, max_len=64, decoder={"layers": 12, "attention": "sdpa"})
    layer = model.decoder.layers[0]
    std = 0.02 / math.sqrt(2 * 12)
    assert layer.self_attn.out_proj.weight.std().item() == pytest.approx(std, rel=0.05)
    assert layer.ffn.linear2.weight.std().item() == pytest.approx(std, rel=0.05)
    assert layer.self_attn.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.tgt_embed.token.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_the_qk_norm_spec_compares_llama_tiny_with_and_without_it(tmp_path):
    from transformer_zoo.comparing import compare, load_spec

    path = Path(__file__).parents[2] / "examples" / "specs" / "llama-qk-norm.yaml"
    spec = load_spec(path).model_dump(mode="json")
    spec.update(steps=3, seeds=[0], workers=1)
    spec["tasks"][0].update(train_tokens=20000, test_tokens=512)
    results = compare(load_spec(spec), tmp_path / "out")
    assert sorted(run.variant for run in results.runs) == ["llama", "llama + qk-norm"]
    models = {run.variant: run for run in results.runs}
    assert all(math.isfinite(run.metrics["test"]["perplexity"]) for run in models.values())
