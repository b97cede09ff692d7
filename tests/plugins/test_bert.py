"""The bert family against Hugging Face transformers, on checkpoints the tests save offline."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers

import transformer_zoo as tz
from transformer_zoo.core.errors import ConfigError

SMALL = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
)


def save(tmp_path, cls, name="ckpt", **overrides):
    """A randomly initialised Hugging Face model, saved as a user would have it; returns it and the folder."""
    torch.manual_seed(0)
    config = transformers.BertConfig(**{**SMALL, **overrides})
    model = cls(config).eval()
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def load(path, *expected_warnings):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tz.from_pretrained(path)
    messages = [str(w.message) for w in caught if "transformer_zoo" in w.filename or str(path) in str(w.message)]
    for expected in expected_warnings:
        assert any(expected in m for m in messages), (expected, messages)
    return model, messages


def batch():
    """Padding in two rows, and two segments."""
    ids = torch.randint(1, 99, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 3:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_bert_model_hidden_states_and_pooled_output_match(tmp_path, attn):
    ref, path = save(tmp_path, transformers.BertModel, attn_implementation=attn)
    ours, messages = load(path, "no weights for the head; newly initialised")
    ids, mask, types = batch()
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, token_type_ids=types)
        hidden = ours.encode(ids, mask, types)
        pooled = ours.pool(hidden)
        out = ours(ids, mask, types)
    real = mask.bool()
    assert hidden.shape == (3, 10, 32)
    torch.testing.assert_close(hidden[real], expected.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled, expected.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.extras["pooled"], expected.pooler_output, atol=1e-5, rtol=0)
    fresh = tz.build_model(ours.config)  # the same architecture, random weights: parity is not by accident
    assert not torch.allclose(fresh.encode(ids, mask, types)[real], hidden[real], atol=1e-3)


def test_masked_lm_logits_match_and_round_trip(tmp_path):
    ref, path = save(tmp_path, transformers.BertForMaskedLM)
    ours, messages = load(path)
    assert messages == [], "a BertForMaskedLM folder places every weight"
    ids, mask, types = batch()
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        logits = ours(ids, mask, types).logits
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=0)
    assert ours.head.decoder.proj.weight is ours.src_embed.token.weight, "the decoder stays tied"
    ours.save_pretrained(tmp_path / "ours")
    again = tz.from_pretrained(tmp_path / "ours")
    assert torch.equal(again(ids, mask, types).logits, ours(ids, mask, types).logits)


def test_an_old_style_pytorch_bin_checkpoint_loads_the_same(tmp_path):
    """pytorch_model.bin, without the 'bert.' prefix, with LayerNorm gamma/beta (TensorFlow-era names)."""
    ref, path = save(tmp_path, transformers.BertForMaskedLM)
    state = {
        k.removeprefix("bert.")
        .replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in ref.state_dict().items()
    }
    assert any(k.endswith("LayerNorm.gamma") for k in state) and not any(k.startswith("bert.") for k in state)
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    ours, _ = load(path)
    ids, mask, types = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, mask, types).logits,
            ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            atol=1e-5,
            rtol=0,
        )


def test_classification_heads_match(tmp_path):
    seq_ref, seq_path = save(tmp_path, transformers.BertForSequenceClassification, "seq", num_labels=3)
    tok_ref, tok_path = save(tmp_path, transformers.BertForTokenClassification, "tok", num_labels=5)
    ids, mask, types = batch()
    seq, _ = load(seq_path)
    tok, _ = load(tok_path)
    assert seq.config.head.kind == "sequence-classification" and seq.config.head.num_classes == 3
    with torch.no_grad():
        torch.testing.assert_close(
            seq(ids, mask, types).logits,
            seq_ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            atol=1e-5,
            rtol=0,
        )
        theirs = tok_ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(tok(ids, mask, types).logits[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=0)


def test_weights_it_cannot_place_are_reported(tmp_path):
    _, path = save(tmp_path, transformers.BertForPreTraining)
    _, messages = load(path, "weights with no place in the model, left out: cls.seq_relationship.bias")


def test_next_sentence_prediction_and_an_untied_decoder_match(tmp_path):
    nsp_ref, nsp_path = save(tmp_path, transformers.BertForNextSentencePrediction, "nsp")
    untied_ref, untied_path = save(tmp_path, transformers.BertForMaskedLM, "untied", tie_word_embeddings=False)
    ids, mask, types = batch()
    nsp, nsp_messages = load(nsp_path)
    untied, untied_messages = load(untied_path)
    assert nsp_messages == [] and untied_messages == []
    assert untied.head.decoder.proj.weight is not untied.src_embed.token.weight
    with torch.no_grad():
        torch.testing.assert_close(
            nsp(ids, mask, types).logits,
            nsp_ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            atol=1e-5,
            rtol=0,
        )
        torch.testing.assert_close(
            untied(ids, mask, types).logits,
            untied_ref(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            atol=1e-5,
            rtol=0,
        )


def test_mlm_labels_in_the_transformers_convention(tmp_path):
    ref, path = save(tmp_path, transformers.BertForMaskedLM)
    ours, _ = load(path)
    ids, mask, types = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
        torch.testing.assert_close(ours.loss(ours(ids, mask, types), labels), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("cls", "overrides", "message"),
    [
        (transformers.BertForQuestionAnswering, {}, "architectures \\['BertForQuestionAnswering'\\] are not supported"),
        (
            transformers.BertForSequenceClassification,
            {"num_labels": 1},
            "num_labels=1 \\(regression\\) is not supported",
        ),
        (
            transformers.BertForSequenceClassification,
            {"num_labels": 3, "problem_type": "multi_label_classification"},
            "problem_type='multi_label_classification'; only single-label",
        ),
    ],
)
def test_heads_it_cannot_build_are_refused(tmp_path, cls, overrides, message):
    _, path = save(tmp_path, cls, **overrides)
    with pytest.raises(ConfigError, match=message):
        tz.from_pretrained(path)


def test_a_config_without_model_type_is_read_by_its_architectures(tmp_path):
    ref, path = save(tmp_path, transformers.BertModel)
    config = json.loads((path / "config.json").read_text())
    del config["model_type"]
    (path / "config.json").write_text(json.dumps(config))
    ours, _ = load(path)
    ids, mask, types = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            ours.encode(ids, mask, types)[mask.bool()],
            ref(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state[mask.bool()],
            atol=1e-5,
            rtol=0,
        )


def test_a_folder_that_is_not_bert_is_refused(tmp_path):
    _, path = save(tmp_path, transformers.BertModel)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(
        ConfigError,
        match="is not a transformer-zoo config \\(it has model_type 'mamba'\\) and no "
        "plugin imports it; formats read: hf-bert",
    ):
        tz.from_pretrained(path)


def test_weights_that_do_not_fit_the_config_name_keys_and_shapes(tmp_path):
    _, path = save(tmp_path, transformers.BertForMaskedLM)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": 40, "num_hidden_layers": 1}))
    with pytest.raises(ConfigError) as error:
        tz.from_pretrained(path)
    message = str(error.value)
    assert (
        "shape mismatch bert.encoder.layer.0.intermediate.dense.weight -> encoder.layers.0.ffn.linear1.weight: "
        "checkpoint (37, 32), model (40, 32)"
    ) in message
    assert "not in the model the config describes: bert.encoder.layer.1.attention.output.dense.weight" in message
    assert (
        "not in the model the config describes: bert.encoder.layer.1.attention.self.query|key|value.weight" in message
    )


def test_a_relative_position_checkpoint_is_refused(tmp_path):
    _, path = save(tmp_path, transformers.BertModel)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    with pytest.raises(ConfigError, match="only 'absolute' positions"):
        tz.from_pretrained(path)


def test_token_types_and_inputs_are_checked():
    model = tz.build_model("bert-tiny", vocab_size=50, dropout=0.0)
    ids = torch.randint(1, 50, (2, 6))
    with pytest.raises(ValueError, match="token_type_ids contain 2, outside the vocabulary"):
        model(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="token_type_ids has shape \\(2, 5\\); expected \\(2, 6\\)"):
        model(ids, token_type_ids=ids[:, :5])
    with pytest.raises(ValueError, match="BERT is encoder-only"):
        tz.build_model("bert-tiny", decoder={"layers": 1})


def test_presets_have_the_published_sizes():
    sizes = {name: tz.load_config(name) for name in ("bert-tiny", "bert-mini", "bert-small", "bert-base")}
    shapes = {n: (c.encoder.layers, c.d_model, c.n_heads, c.d_ff) for n, c in sizes.items()}
    assert shapes == {
        "bert-tiny": (2, 128, 2, 512),
        "bert-mini": (4, 256, 4, 1024),
        "bert-small": (4, 512, 8, 2048),
        "bert-base": (12, 768, 12, 3072),
    }
    base = tz.build_model("bert-base", pooler=False)  # BertForMaskedLM has no pooler
    reference = transformers.BertForMaskedLM(transformers.BertConfig())
    assert sum(p.numel() for p in base.parameters()) == sum(p.numel() for p in reference.parameters())


def test_the_padding_row_starts_at_zero():
    model = tz.build_model("bert-tiny")
    assert torch.equal(model.src_embed.token.weight[0], torch.zeros(128))
    assert model.src_embed.token.weight[1].abs().sum() > 0


def test_the_pooler_comes_with_a_head_that_reads_it():
    assert tz.build_model("bert-tiny").pooler is None, "a masked-LM model has no pooler unless asked"
    classifier = tz.build_model("bert-tiny", head={"kind": "sequence-classification", "num_classes": 3})
    assert classifier.pooler is not None
    assert tz.build_model("bert-tiny", pooler=True).pooler is not None
    with pytest.raises(ValueError, match="has no pooler; build it with pooler: true"):
        tz.build_model("bert-tiny").pool(torch.zeros(1, 2, 128))


@pytest.mark.heavy
def test_bert_tiny_learns_listops(tmp_path):
    """500 steps on short ListOps: test accuracy at least twice the majority class's.

    Measured on a 2-core CPU: 0.23-0.27 over seeds 0-2 (majority 0.094), in about 14 s.
    """
    from transformer_zoo.registry import get_registry
    from transformer_zoo.training.config import load_train_config
    from transformer_zoo.training.trainer import train

    task = {"kind": "listops", "max_length": 32, "min_length": 8, "max_depth": 3, "train_size": 5000, "test_size": 500}
    config = load_train_config(
        {
            "model": {"variant": "bert-tiny", "dropout": 0.0},
            "task": task,
            "steps": 500,
            "batch_size": 32,
            "lr": 1e-3,
            "warmup_steps": 50,
        }
    )
    summary = train(config, tmp_path, progress=False)
    majority = get_registry().component("task", "listops").model_validate(task).build().majority_accuracy("test")
    print("bert-tiny on listops:", summary["metrics"]["test"], "majority", majority)
    assert summary["metrics"]["test"]["accuracy"] >= 2 * majority
