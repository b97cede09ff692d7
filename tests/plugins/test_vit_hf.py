"""The zoo's ViT and Hugging Face transformers' ViTForImageClassification, both ways.

transformers' folders are saved here from small random models (no network) and loaded into the
zoo; the zoo's ViT (``positional: learned``) is saved with ``format="hf"`` and loaded by
transformers. Both read the same pixel tensor ``(B, C, H, W)``: neither model normalises it.
"""

from __future__ import annotations

import json
import warnings

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz
from transformer_zoo.core.errors import ConfigError

transformers = pytest.importorskip("transformers")

SMALL = dict(
    image_size=8,
    patch_size=2,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    num_labels=10,
)
ZOO = dict(patch=2, d_model=32, n_heads=4, d_ff=64, encoder={"layers": 2}, positional="learned")


def save(tmp_path, cls=None, name="theirs", **overrides):
    """A random transformers ViT, saved as a user would have it; returns it and the folder."""
    torch.manual_seed(0)
    model = (cls or transformers.ViTForImageClassification)(transformers.ViTConfig(**{**SMALL, **overrides})).eval()
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def load(path, *expected_warnings):
    """``tz.from_pretrained(path)``, asserting it warns with each of ``expected_warnings`` and
    nothing else."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tz.from_pretrained(path)
    messages = [str(w.message) for w in caught if str(path) in str(w.message)]
    assert len(messages) == len(expected_warnings), messages
    for expected in expected_warnings:
        assert any(expected in m for m in messages), (expected, messages)
    return model


def images(channels, size=(8, 8)):
    torch.manual_seed(1)
    return torch.rand(4, channels, *size)


def edit_config(path, **fields):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))


def load_cleanly(path):
    """transformers' ViTForImageClassification from ``path``, asserting that every weight it has
    came from the file and every weight of the file went into it."""
    model, info = transformers.ViTForImageClassification.from_pretrained(path, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items() if v} == {}, "missing, unexpected or mismatched weights"
    return model.eval()


def zoo_vit(**overrides):
    """A zoo ViT with every weight random, the class token and positions included."""
    torch.manual_seed(0)
    model = tz.build_model("vit-tiny", **{**ZOO, **overrides}).eval()
    with torch.no_grad():
        model.cls.normal_()
        model.positional.table.normal_(std=0.5)
    return model


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("channels", [1, 3])
def test_logits_equal_transformers(tmp_path, channels, attn):
    reference, path = save(tmp_path, num_channels=channels, attn_implementation=attn)
    ours = load(path)
    assert ours.config.positional == "learned" and ours.config.norm.eps == 1e-12
    x = images(channels)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, reference(pixel_values=x).logits, atol=1e-5, rtol=0)


def test_a_vit_model_folder_gives_the_same_hidden_states_and_a_new_classifier(tmp_path):
    reference, path = save(tmp_path, transformers.ViTModel, num_channels=3)
    ours = load(path, "pooler.dense.weight (ViTModel's pooler", "newly initialised: head.proj.weight, head.proj.bias")
    x = images(3)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).hidden, reference(pixel_values=x).last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("channels", "image_size"), [(1, (8, 8)), (3, (8, 12))])
def test_a_zoo_vit_saved_as_hf_loads_in_transformers_with_the_same_logits(tmp_path, channels, image_size):
    model = zoo_vit(channels=channels, image_size=image_size)
    model.save_pretrained(tmp_path, format="hf")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vit" and config["architectures"] == ["ViTForImageClassification"]
    reference = load_cleanly(tmp_path)
    x = images(channels, image_size)
    with torch.no_grad():
        torch.testing.assert_close(reference(pixel_values=x).logits, model(x).logits, atol=1e-5, rtol=0)
    again = load(tmp_path)
    ours, theirs = model.config.model_dump(), again.config.model_dump()
    assert ours["ffn"].pop("inner_dropout") and not theirs["ffn"].pop("inner_dropout")  # no dropout: no matter
    assert theirs == ours
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("activation", ["relu", "gelu_pytorch_tanh"])
def test_a_transformers_folder_comes_back_as_transformers_wrote_it(tmp_path, activation):
    _, path = save(tmp_path, num_channels=3, layer_norm_eps=1e-6, hidden_act=activation)
    load(path).save_pretrained(tmp_path / "ours", format="hf")
    theirs = safetensors.torch.load_file(path / "model.safetensors")
    ours = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    original = json.loads((path / "config.json").read_text())
    shared = set(written) & set(original)
    assert shared >= {"hidden_act", "layer_norm_eps", "image_size", "patch_size", "num_channels", "id2label"}
    assert {k: written[k] for k in shared} == {k: original[k] for k in shared}


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "gelu_new"])
def test_gelus_tanh_approximation_loads_as_gelu_tanh_and_saves_as_gelu_pytorch_tanh(tmp_path, activation):
    reference, path = save(tmp_path, num_channels=3, hidden_act=activation)
    ours = load(path)
    assert ours.config.ffn.activation == "gelu-tanh"
    x = images(3)
    with torch.no_grad():
        expected = reference(pixel_values=x).logits
        torch.testing.assert_close(ours(x).logits, expected, atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours", format="hf")  # both spellings are one function: written as one
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["hidden_act"] == "gelu_pytorch_tanh"
    with torch.no_grad():
        torch.testing.assert_close(load_cleanly(tmp_path / "ours")(pixel_values=x).logits, expected, atol=1e-5, rtol=0)


def test_a_vit_model_folder_with_gelus_tanh_approximation_gives_the_same_hidden_states(tmp_path):
    reference, path = save(tmp_path, transformers.ViTModel, num_channels=3, hidden_act="gelu_pytorch_tanh")
    ours = load(path, "pooler.dense.weight (ViTModel's pooler", "newly initialised: head.proj.weight, head.proj.bias")
    x = images(3)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).hidden, reference(pixel_values=x).last_hidden_state, atol=1e-5, rtol=0)


def test_images_of_another_size_are_refused_where_transformers_would_interpolate(tmp_path):
    reference, path = save(tmp_path, num_channels=3)
    ours = load(path)
    larger = images(3, (16, 16))
    with torch.no_grad():
        reference(pixel_values=larger, interpolate_pos_encoding=True)  # transformers resizes its positions
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 3, 8, 8\), got \(4, 3, 16, 16\)"):
        ours(larger)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu'; the zoo reads a ViT's 'gelu', 'gelu_pytorch_tanh', "),
        ({"qkv_bias": False}, "qkv_bias=False; the zoo's attention has biases on all its projections or on none"),
        ({"patch_size": [2, 4]}, r"patch_size=\[2, 4\]; the zoo's patches are square"),
        ({"problem_type": "multi_label_classification"}, "problem_type='multi_label_classification'; only single"),
        ({"num_labels": 1, "id2label": {"0": "score"}}, "num_labels=1; the zoo's classifier needs 2 or more labels"),
        ({"architectures": ["ViTForMaskedImageModeling"]}, r"architectures=\['ViTForMaskedImageModeling'\]"),
    ],
)
def test_what_the_zoo_cannot_compute_is_refused_by_name(tmp_path, fields, message):
    _, path = save(tmp_path, num_channels=3)
    edit_config(path, **fields)
    with pytest.raises(ConfigError, match=f"config.json'?: {message}"):
        tz.from_pretrained(path)


def test_weights_that_do_not_fit_the_config_name_keys_and_shapes(tmp_path):
    _, path = save(tmp_path, num_channels=3)
    edit_config(path, intermediate_size=40, image_size=10)
    with pytest.raises(ConfigError) as error:
        tz.from_pretrained(path)
    message = str(error.value)
    assert (
        "shape mismatch vit.encoder.layer.0.intermediate.dense.weight -> encoder.layers.0.ffn.linear1.weight: "
        "checkpoint (64, 32), model (40, 32)"
    ) in message
    assert "shape mismatch vit.embeddings.position_embeddings -> positional.table: checkpoint (1, 17, 32)" in message


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"positional": "learned-2d"}, "positional is 'learned-2d'; transformers' ViT needs 'learned' (one learned"),
        ({"positional": "sinusoidal-2d"}, "positional is 'sinusoidal-2d'; transformers' ViT needs 'learned'"),
        ({"norm_placement": "post"}, "norm_placement is 'post'; transformers' ViT needs 'pre'"),
        ({"pooling": "mean"}, "pooling is 'mean'; transformers' ViT needs 'cls' (the classifier reads the class"),
        ({"norm": "rmsnorm"}, "norm.kind is 'rmsnorm'; transformers' ViT needs 'layernorm'"),
        ({"encoder": {"layers": 2, "attention": {"kind": "sdpa", "bias": False}}}, "encoder.attention.bias is False"),
        ({"dropout": 0.1}, "ffn.inner_dropout is True; transformers' ViT needs False"),
    ],
)
def test_what_transformers_cannot_express_is_refused_by_name(tmp_path, overrides, message):
    model = tz.build_model("vit-tiny", **{**ZOO, **overrides})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        model.save_pretrained(tmp_path, format="hf")
    assert str(error.value).count("transformers' ViT needs") == 1, "one field named, the others map"
    assert list(tmp_path.iterdir()) == [], "a refused model writes nothing"


def test_a_sagan_model_of_the_family_and_options_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"'sagan-classifier-tiny' model \(SaganClassifier\) is not one"):
        tz.build_model("sagan-classifier-tiny").save_pretrained(tmp_path, format="hf")
    with pytest.raises(ValueError, match="architecture=: format='hf' takes no options for a ViT"):
        zoo_vit().save_pretrained(tmp_path, format="hf", architecture="ViTModel")
    assert list(tmp_path.iterdir()) == []
