"""The transformer family and Hugging Face ``MarianMTModel`` folders, both ways, with no network:
small random Marian models are saved by transformers, read by the zoo, written back, and read by
transformers again; both compute the same logits and decode the same tokens."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import generate
from transformer_zoo.core.embedding import sinusoid_table
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.weights import WeightsError

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, PAD, EOS = 50, 49, 0
SMALL = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    scale_embedding=True,
    activation_function="swish",
    pad_token_id=PAD,
    decoder_start_token_id=PAD,  # Marian starts the target with the padding id
    eos_token_id=EOS,
    forced_eos_token_id=None,
    init_std=0.2,  # larger than the default 0.02, so that the logits and the decoded tokens vary
)
TYINGS = {  # (share_encoder_decoder_embeddings, tie_word_embeddings)
    "shared-tied": (True, True),
    "shared-untied": (True, False),
    "separate-tied": (False, True),
    "separate-untied": (False, False),
}
ZOO_SMALL = dict(
    vocab_size=VOCAB,
    d_model=32,
    n_heads=4,
    d_ff=64,
    max_len=64,
    pad_id=PAD,
    dropout=0.0,
    positional={"kind": "sinusoidal", "layout": "halves"},
    ffn={"kind": "mlp", "activation": "silu"},
    encoder={"layers": 2},
    decoder={"layers": 2},
)


def marian(folder, tying="shared-tied", **overrides):
    """A random MarianMTModel, its layer norms and output bias moved off their initial ones and
    zeros, saved by transformers to ``folder``; returns it in eval mode."""
    share, tie = TYINGS[tying]
    config = transformers.MarianConfig(
        **{**SMALL, "share_encoder_decoder_embeddings": share, "tie_word_embeddings": tie, **overrides}
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
        model.final_logits_bias.normal_()
    model.save_pretrained(folder)
    return model.eval()


def load(folder):
    """The zoo's model of a Marian folder; the one warning expected (Marian's attention dropout
    differs from its dropout) is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the transformer family has one dropout rate")
        return tz.from_pretrained(folder)


def load_cleanly(folder):
    """transformers' MarianMTModel from ``folder``, asserting that every weight it has came from
    the file and every weight of the file went into it."""
    model, info = transformers.MarianMTModel.from_pretrained(folder, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items() if v} == {}, "missing, unexpected or mismatched weights"
    return model.eval()


def batch():
    """Source ids with padding in two rows, and target ids."""
    torch.manual_seed(1)
    src = torch.randint(1, PAD, (3, 9))
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    src = src.masked_fill(mask == 0, PAD)
    tgt = torch.randint(1, PAD, (3, 7))
    return src, mask, tgt


def max_difference(zoo_model, hf_model) -> float:
    src, mask, tgt = batch()
    with torch.no_grad():
        theirs = hf_model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        ours = zoo_model(src, tgt, src_mask=mask).logits
    return (ours - theirs).abs().max().item()


def test_the_halves_layout_is_marians_sinusoids_and_the_default_is_unchanged():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for length, dim in ((64, 32), (40, 7)):
        marians = MarianSinusoidalPositionalEmbedding(length, dim).create_weight()
        assert torch.equal(sinusoid_table(length, dim, layout="halves"), marians)
    position = torch.arange(64, dtype=torch.float64)[:, None]
    angles = position / 10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    interleaved = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).float()
    torch.testing.assert_close(sinusoid_table(64, 32), interleaved, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="layout='stacked'; a sinusoid table's layout is one of interleaved, halves"):
        sinusoid_table(4, 8, layout="stacked")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("tying", TYINGS)
def test_logits_equal_transformers_with_source_padding(tmp_path, tying, attention):
    reference = marian(tmp_path, tying, attn_implementation=attention)
    model = load(tmp_path)
    share, tie = TYINGS[tying]
    assert model.config.share_embeddings == (share and tie) and model.config.head.tie_weights == tie
    assert model.config.positional.layout == "halves" and model.config.ffn.activation == "silu"
    assert max_difference(model, reference) <= 1e-5


@pytest.mark.parametrize("tying", ["shared-tied", "separate-untied"])
def test_greedy_decoding_equals_transformers_generate(tmp_path, tying):
    reference = marian(tmp_path, tying, eos_token_id=None)
    model = load(tmp_path)
    src, mask, _ = batch()

    def both(eos):
        theirs = reference.generate(
            input_ids=src,
            attention_mask=mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=12,
            decoder_start_token_id=PAD,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
        ours = generate(model, src, mask, bos_id=PAD, eos_id=eos, pad_id=PAD, max_new_tokens=12)
        return theirs, ours

    theirs, ours = both(None)  # every row runs 12 tokens
    assert theirs.shape == (3, 13) and torch.equal(ours, theirs)
    eos = int(theirs[0, 4])  # now the first row ends at its 4th token, and the others where they pick it
    theirs, ours = both(eos)
    assert torch.equal(ours, theirs) and (theirs[0, 5:] == PAD).all()


@pytest.mark.parametrize("tying", ["shared-tied", "separate-tied", "separate-untied"])
def test_a_marian_folder_comes_back_tensor_for_tensor(tmp_path, tying):
    marian(tmp_path / "hf", tying)
    load(tmp_path / "hf").save_pretrained(tmp_path / "again", format="hf", decoder_start_token_id=PAD, eos_token_id=EOS)
    before = safetensors_torch.load_file(tmp_path / "hf" / "model.safetensors")
    after = safetensors_torch.load_file(tmp_path / "again" / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    original = json.loads((tmp_path / "hf" / "config.json").read_text())
    written = set(config) - {"attention_dropout"}  # the zoo has one dropout rate
    assert {k: config[k] for k in written} == {k: original[k] for k in written}


def test_the_unused_shared_table_of_untied_embeddings_is_not_written_back(tmp_path):
    marian(tmp_path / "hf", "shared-untied")
    model = load(tmp_path / "hf")
    model.save_pretrained(tmp_path / "again", format="hf")
    before = safetensors_torch.load_file(tmp_path / "hf" / "model.safetensors")
    after = safetensors_torch.load_file(tmp_path / "again" / "model.safetensors")
    assert before.keys() - after.keys() == {"model.shared.weight"}  # transformers 5 keeps it, though nothing reads it
    assert all(torch.equal(after[name], before[name]) for name in after)
    assert max_difference(model, load_cleanly(tmp_path / "again")) <= 1e-5


@pytest.mark.parametrize(("share", "tie"), [(True, True), (False, True), (False, False)])  # shared, untied: refused
def test_a_zoo_model_saved_as_hf_loads_in_transformers_and_computes_the_same(tmp_path, share, tie):
    torch.manual_seed(0)
    head = {"kind": "lm", "tie_weights": tie, "bias": True}
    model = tz.build_model("transformer", **ZOO_SMALL, share_embeddings=share, head=head).eval()
    with torch.no_grad():
        model.head.proj.bias.normal_()
    model.save_pretrained(tmp_path, format="hf", decoder_start_token_id=1, eos_token_id=2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "marian" and config["activation_function"] == "swish"
    assert (config["share_encoder_decoder_embeddings"], config["tie_word_embeddings"]) == (share, tie)
    assert max_difference(model, load_cleanly(tmp_path)) <= 1e-5
    again = tz.from_pretrained(tmp_path)
    assert {k: v for k, v in again.config.model_dump().items() if k not in ("variant", "head")} == {
        k: v for k, v in model.config.model_dump().items() if k not in ("variant", "head")
    }
    assert again.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


REFUSED_CONFIGS = {  # a field of config.json, and what the one line of the refusal says
    "normalize_before": (True, "normalize_before is true: pre-norm layers, which"),
    "static_position_embeddings": (False, "static_position_embeddings is false: learned positions, which"),
    "normalize_embedding": (True, "normalize_embedding is true: a layer norm on the embeddings, which"),
    "layernorm_embedding": (True, "layernorm_embedding is true: a layer norm on the embeddings, which"),
    "add_final_layer_norm": (True, "add_final_layer_norm is true: a layer norm after each stack's last layer"),
    "activation_function": ("gelu_new", 'activation_function is "gelu_new"; the transformer family maps "swish"'),
    "decoder_ffn_dim": (48, "encoder_ffn_dim is 64 but decoder_ffn_dim is 48; the transformer family has one value"),
    "architectures": (["MarianForCausalLM"], 'architectures is ["MarianForCausalLM"]; the transformer family reads'),
}


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian")
    marian(folder)
    return folder


@pytest.mark.parametrize("field", REFUSED_CONFIGS)
def test_a_marian_config_that_does_not_map_is_refused_naming_the_field(tmp_path, marian_folder, field):
    value, message = REFUSED_CONFIGS[field]
    shutil.copytree(marian_folder, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ConfigError) as refused:
        tz.from_pretrained(tmp_path)
    lines = str(refused.value).splitlines()
    assert lines[0].endswith("this Marian config cannot be read into the transformer family:")
    assert len(lines) == 2 and lines[1].startswith(f"  {message}"), lines


def test_learned_positions_in_the_file_are_refused(tmp_path, marian_folder):
    shutil.copytree(marian_folder, tmp_path, dirs_exist_ok=True)
    state = safetensors_torch.load_file(tmp_path / "model.safetensors")
    state["model.encoder.embed_positions.weight"] = torch.randn(64, 32)
    safetensors_torch.save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match="model.encoder.embed_positions.weight differs from Marian's sinusoids"):
        load(tmp_path)
    state["model.encoder.embed_positions.weight"] = sinusoid_table(64, 32, layout="halves")
    safetensors_torch.save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    load(tmp_path)  # the sinusoids themselves, as older transformers saved them, are read


REFUSED_MODELS = {  # overrides of ZOO_SMALL, and the one line of the refusal
    "pre-norm": ({"norm_placement": "pre"}, "norm_placement is 'pre'; transformers' Marian needs 'post'"),
    "learned positions": ({"positional": "learned"}, "positional.kind is 'learned'; transformers' Marian needs"),
    "the paper's layout": (
        {"positional": "sinusoidal"},
        "positional.layout is 'interleaved'; transformers' Marian needs 'halves'",
    ),
    "shared, untied": (
        {"head": {"kind": "lm", "tie_weights": False}},
        "share_embeddings is true but head.tie_weights false",
    ),
    "encoder-only": ({"decoder": None}, "the model is encoder-only; a MarianMTModel has an encoder and a decoder"),
}


@pytest.mark.parametrize("case", REFUSED_MODELS)
def test_a_zoo_model_marian_cannot_express_is_refused_naming_the_field(tmp_path, case):
    overrides, message = REFUSED_MODELS[case]
    model = tz.build_model("transformer", **{**ZOO_SMALL, **overrides})
    with pytest.raises(ConfigError) as refused:
        model.save_pretrained(tmp_path, format="hf")
    lines = str(refused.value).splitlines()
    assert len(lines) == 3 and lines[1].startswith(f"  {message}"), lines
    assert lines[2].startswith("change these fields, or save with format='zoo'")
    assert list(tmp_path.iterdir()) == []
