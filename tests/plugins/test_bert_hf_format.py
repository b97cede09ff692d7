"""Saving bert-family models in the layout of Hugging Face transformers (``format="hf"``).

Folders from transformers loading into the zoo are tested in test_bert.py; here the zoo writes
them, transformers reads them with nothing missing or left over, and both compute the same.
"""

from __future__ import annotations

import json
import warnings

import pytest
import safetensors.torch
import torch
import transformers

import transformer_zoo as tz
from transformer_zoo.core.errors import ConfigError

SMALL = dict(vocab_size=100, d_model=32, n_heads=4, d_ff=37, encoder={"layers": 2}, max_len=64, dropout=0.0)
HEADS = {
    "BertForMaskedLM": {"kind": "lm", "bias": True},
    "BertForSequenceClassification": {"kind": "sequence-classification", "num_classes": 3},
    "BertForTokenClassification": {"kind": "token-classification", "num_classes": 5},
}


def zoo_model(head: dict, **overrides):
    torch.manual_seed(0)
    return tz.build_model("bert", **SMALL, head=head, **overrides).eval()


def batch():
    """Padding in two rows, and two segments."""
    torch.manual_seed(1)
    ids = torch.randint(1, 100, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 3:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


def load_cleanly(cls, path):
    """transformers' ``cls`` from ``path``, asserting that every weight it has came from the file and
    every weight of the file went into it."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items() if v} == {}, "missing, unexpected or mismatched weights"
    return model.eval()


def assert_same_zoo_model(again, model):
    """The same config (the variant's name aside, and the pooler as built) and the same weights."""
    ours, theirs = model.config.model_dump(), again.config.model_dump()
    assert {k: v for k, v in theirs.items() if k not in ("variant", "pooler")} == {
        k: v for k, v in ours.items() if k not in ("variant", "pooler")
    }
    assert (again.pooler is None) == (model.pooler is None)
    assert again.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("architecture", HEADS)
def test_transformers_loads_each_head_and_computes_the_same(tmp_path, architecture):
    model = zoo_model(HEADS[architecture])
    model.save_pretrained(tmp_path, format="hf")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == [architecture]
    reference = load_cleanly(getattr(transformers, architecture), tmp_path)
    ids, mask, types = batch()
    real = mask.bool()
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        ours = model(ids, mask, types).logits
    if architecture == "BertForSequenceClassification":
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=0)
    assert_same_zoo_model(tz.from_pretrained(tmp_path), model)


def test_bert_model_holds_the_encoder_and_pooler_alone(tmp_path):
    model = zoo_model(HEADS["BertForSequenceClassification"])
    model.save_pretrained(tmp_path, format="hf", architecture="BertModel")
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]
    reference = load_cleanly(transformers.BertModel, tmp_path)
    ids, mask, types = batch()
    real = mask.bool()
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask, token_type_ids=types)
        hidden = model.encode(ids, mask, types)
        torch.testing.assert_close(hidden[real], theirs.last_hidden_state[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(model.pool(hidden), theirs.pooler_output, atol=1e-5, rtol=0)
        with pytest.warns(UserWarning, match="no weights for the head"):
            again = tz.from_pretrained(tmp_path)  # as any BertModel folder: the encoder, and a new head
        torch.testing.assert_close(again.encode(ids, mask, types), hidden, atol=0, rtol=0)


def test_an_untied_decoder_is_saved_under_its_own_name(tmp_path):
    model = zoo_model({"kind": "lm", "bias": True, "tie_weights": False})
    model.save_pretrained(tmp_path, format="hf")
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    reference = load_cleanly(transformers.BertForMaskedLM, tmp_path)
    decoder, embeddings = reference.cls.predictions.decoder.weight, reference.bert.embeddings.word_embeddings.weight
    assert decoder.data_ptr() != embeddings.data_ptr()
    ids, mask, types = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, mask, types).logits,
            reference(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            atol=1e-5,
            rtol=0,
        )
    assert_same_zoo_model(tz.from_pretrained(tmp_path), model)


@pytest.mark.parametrize(
    ("cls", "architecture", "overrides"),
    [
        (transformers.BertForMaskedLM, None, {}),
        (transformers.BertForSequenceClassification, None, {"num_labels": 3}),
        (transformers.BertModel, "BertModel", {}),
    ],
)
def test_a_transformers_folder_comes_back_as_transformers_wrote_it(tmp_path, cls, architecture, overrides):
    """transformers -> zoo (test_bert.py checks the outputs) -> format='hf': the same tensors under the same names."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        **overrides,
    )
    cls(config).save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*the checkpoint has no weights for the head")  # a BertModel folder's
        model = tz.from_pretrained(tmp_path / "theirs")
    model.save_pretrained(tmp_path / "ours", format="hf", architecture=architecture)
    theirs = safetensors.torch.load_file(tmp_path / "theirs" / "model.safetensors")
    ours = safetensors.torch.load_file(tmp_path / "ours" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    original = json.loads((tmp_path / "theirs" / "config.json").read_text())
    shared = set(written) & set(original)
    assert {k: written[k] for k in shared} == {k: original[k] for k in shared}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"norm_placement": "pre"}, "norm_placement is 'pre'; transformers' BERT needs 'post'"),
        ({"positional": "sinusoidal"}, "positional.kind is 'sinusoidal'; transformers' BERT needs 'learned'"),
        (
            {"encoder": {"layers": 2, "attention": {"kind": "sliding-window", "window": 4}}},
            "encoder.attention.kind is 'sliding-window'; transformers' BERT needs 'sdpa'",
        ),
        (
            {"ffn": {"kind": "mlp", "activation": "gelu", "inner_dropout": True}},
            "ffn.inner_dropout is True; transformers' BERT needs False",
        ),
        ({"type_vocab_size": 0}, "type_vocab_size is 0; transformers' BERT always adds token-type embeddings"),
        (
            {"head": {"kind": "sequence-classification", "num_classes": 3, "pooling": "mean"}},
            "head.pooling is 'mean'; transformers' BERT needs 'cls'",
        ),
    ],
)
def test_what_transformers_cannot_express_is_refused_by_name(tmp_path, overrides, message):
    model = tz.build_model("bert", **{**SMALL, **overrides})
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")) as error:
        model.save_pretrained(tmp_path, format="hf")
    assert "save with format='zoo' (the default), which keeps every option" in str(error.value)
    assert list(tmp_path.iterdir()) == [], "a refused model writes nothing"
    model.save_pretrained(tmp_path)  # the zoo's own format keeps it
    assert_same_zoo_model(tz.from_pretrained(tmp_path), model)


def test_formats_and_architectures_that_do_not_apply_are_refused(tmp_path):
    bert = zoo_model(HEADS["BertForMaskedLM"])
    with pytest.raises(
        ConfigError,
        match="architecture='BertForSequenceClassification': a bert model with a 'lm' head "
        "saves as 'BertForMaskedLM' or 'BertModel'",
    ):
        bert.save_pretrained(tmp_path, format="hf", architecture="BertForSequenceClassification")
    with pytest.raises(ConfigError, match="the model has no pooler \\(pooler is None\\); BertModel has one"):
        bert.save_pretrained(tmp_path, format="hf", architecture="BertModel")
    with pytest.raises(ValueError, match="format='onnx': a bert model saves as 'zoo', 'hf'"):
        bert.save_pretrained(tmp_path, format="onnx")
    with pytest.raises(ValueError, match="format='hf': a universal-transformer model saves as 'zoo' \\("):
        tz.build_model("universal-transformer-tiny").save_pretrained(tmp_path, format="hf")
    assert list(tmp_path.iterdir()) == []
