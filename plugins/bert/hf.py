"""BERT in Hugging Face ``transformers``: the bert family's map for :mod:`transformer_zoo.core.hf`.

A folder holding ``config.json`` (``model_type: bert``) and ``model.safetensors`` (or sharded
safetensors, or ``pytorch_model.bin``) becomes a :class:`~transformer_zoo.plugins.bert.Bert`,
and a bert model's ``save_pretrained(folder, format="hf")`` writes one: the head's own class
(``BertForMaskedLM``, ``BertForSequenceClassification``, ``BertForTokenClassification``), or
``architecture="BertModel"`` for the encoder and pooler alone. The query, key and value
projections are concatenated into one fused input projection; the masked-LM decoder is tied to
the word embeddings as ``tie_word_embeddings`` says.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from transformer_zoo.api import build_checked, load_config
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.hf import (
    ConfigField,
    HFMap,
    Weight,
    label_fields,
    num_labels,
    read_hf_folder,
    write_hf_folder,
)
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.weights import Importer

HEADS = {  # architectures -> our head config
    "BertModel": lambda hf: {"kind": "lm", "bias": True},
    "BertForMaskedLM": lambda hf: {"kind": "lm", "bias": True},
    "BertForPreTraining": lambda hf: {"kind": "lm", "bias": True},
    "BertForNextSentencePrediction": lambda hf: {"kind": "sequence-classification", "num_classes": 2},
    "BertForSequenceClassification": lambda hf: {"kind": "sequence-classification", "num_classes": num_labels(hf)},
    "BertForTokenClassification": lambda hf: {"kind": "token-classification", "num_classes": num_labels(hf)},
}
SAVED_AS = {  # our head kind -> the transformers class that holds it
    "lm": "BertForMaskedLM",
    "sequence-classification": "BertForSequenceClassification",
    "token-classification": "BertForTokenClassification",
}
LAYER = "encoder.layer.{i}."


def _bert_head(hf: dict[str, Any]) -> dict[str, Any] | None:
    known = [a for a in hf.get("architectures") or ["BertModel"] if a in HEADS]
    return HEADS[known[0]](hf) if known else None


def _bert_refusals(hf: dict[str, Any]) -> list[str]:
    problems = []
    if hf.get("position_embedding_type", "absolute") != "absolute":
        problems.append(
            f"position_embedding_type={hf['position_embedding_type']!r}; only 'absolute' positions (the original "
            "BERT's) are supported"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        problems.append(
            "a BERT used as a decoder (is_decoder / add_cross_attention) is not supported; load an encoder checkpoint"
        )
    head = _bert_head(hf)
    if head is None:
        problems.append(f"architectures {hf['architectures']} are not supported; supported: {', '.join(HEADS)}")
    elif head["kind"] == "sequence-classification" and hf.get("problem_type") not in (
        None,
        "single_label_classification",
    ):
        problems.append(f"problem_type={hf['problem_type']!r}; only single-label classification is supported")
    elif head["kind"] != "lm" and head["num_classes"] < 2:
        problems.append(
            f"num_labels={head['num_classes']} (regression) is not supported; a classification head needs 2 or more "
            "labels"
        )
    return problems


def _bert_fields(hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    dropout = hf.get("hidden_dropout_prob", 0.1)
    others = {
        k: hf[k] for k in ("attention_probs_dropout_prob", "classifier_dropout") if hf.get(k) not in (None, dropout)
    }
    if others:
        warnings.warn(
            f"the zoo uses one dropout rate, hidden_dropout_prob={dropout}; "
            f"{', '.join(f'{k}={v}' for k, v in others.items())} are replaced by it (this matters only in training)",
            stacklevel=5,
        )
    head = _bert_head(hf)
    if head["kind"] == "lm":
        head["tie_weights"] = hf.get("tie_word_embeddings", True)
    return {
        "norm": {"kind": "layernorm"},
        "ffn": {"kind": "mlp", "inner_dropout": False},
        "pooler": any(name.endswith("pooler.dense.weight") for name in names),
        "head": head,
    }


def _bert_json(model: ZooModel, architecture: str | None = None) -> dict[str, Any]:
    """``config.json``'s fields beyond the one-to-one ones, for transformers' ``architecture``:
    the head's own class, unless ``BertModel`` (the encoder and pooler alone) is asked for."""
    config = model.config
    head = config.head
    own = SAVED_AS.get(head.kind)
    chosen = own if architecture is None else architecture
    if chosen is None or chosen not in (own, "BertModel"):
        allowed = " or ".join(repr(a) for a in (own, "BertModel") if a)
        raise ConfigError(
            f"architecture={architecture!r}: a bert model with a {head.kind!r} head saves as {allowed} (the "
            f"encoder and pooler, without the head); transformers has a class for the heads {', '.join(SAVED_AS)}"
        )
    hf = {
        "architectures": [chosen],
        "attention_probs_dropout_prob": config.dropout,  # the zoo has one dropout rate
        "classifier_dropout": None,
        "position_embedding_type": "absolute",
        "is_decoder": False,
        "add_cross_attention": False,
        "tie_word_embeddings": head.tie_weights if head.kind == "lm" else True,
    }
    if head.kind != "lm":
        hf |= label_fields(head.num_classes)
    if head.kind == "sequence-classification":
        hf["problem_type"] = "single_label_classification"
    return hf


def _bert_save_problems(model: ZooModel, hf: dict[str, Any]) -> list[str]:
    architecture = hf["architectures"][0]
    problems = []
    if model.config.type_vocab_size == 0:
        problems.append(
            "type_vocab_size is 0; transformers' BERT always adds token-type embeddings, so it needs 1 or more"
        )
    if model.pooler is None and architecture in ("BertModel", "BertForSequenceClassification"):
        problems.append(
            f"the model has no pooler (pooler is {model.config.pooler!r}); {architecture} has one: set pooler: true"
        )
    return problems


def _bert_comparable(dump: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    # the pooler is checked on the model (_bert_save_problems); BertModel holds no head
    unheld = {"pooler"} | ({"head"} if hf["architectures"] == ["BertModel"] else set())
    return {k: v for k, v in dump.items() if k not in unheld}


BERT = HFMap(
    model_type="bert",
    title="BERT",
    family="bert",
    variant="bert",
    architectures=tuple(HEADS),
    prefix="bert.",
    base=("BertModel",),
    legacy=((r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias")),
    ignored=("embeddings.position_ids",),  # a buffer of positions 0..n-1
    weights=(
        Weight("src_embed.token", "embeddings.word_embeddings"),
        Weight("src_embed.positional.embedding", "embeddings.position_embeddings"),
        Weight("src_embed.token_type", "embeddings.token_type_embeddings"),
        Weight("src_embed.norm", "embeddings.LayerNorm"),
        Weight(
            "encoder.layers.{i}.self_attn.in_proj",
            fused=tuple(f"{LAYER}attention.self.{p}" for p in ("query", "key", "value")),
        ),
        Weight("encoder.layers.{i}.self_attn.out_proj", LAYER + "attention.output.dense"),
        Weight("encoder.layers.{i}.norms.0", LAYER + "attention.output.LayerNorm"),
        Weight("encoder.layers.{i}.ffn.linear1", LAYER + "intermediate.dense"),
        Weight("encoder.layers.{i}.ffn.linear2", LAYER + "output.dense"),
        Weight("encoder.layers.{i}.norms.1", LAYER + "output.LayerNorm"),
        Weight("pooler.dense", "pooler.dense"),
        Weight("head.dense", "cls.predictions.transform.dense"),
        Weight("head.norm", "cls.predictions.transform.LayerNorm"),
        Weight("head.decoder.proj.weight", "cls.predictions.decoder.weight"),
        Weight("head.decoder.proj.bias", ("cls.predictions.bias", "cls.predictions.decoder.bias")),
        Weight("head.proj", "classifier"),
        Weight("head.proj", "cls.seq_relationship"),  # next-sentence prediction: a 2-class pooled classifier
    ),
    fields=(
        ConfigField("vocab_size", "vocab_size"),
        ConfigField("hidden_size", "d_model"),
        ConfigField("num_attention_heads", "n_heads"),
        ConfigField("intermediate_size", "d_ff"),
        ConfigField("num_hidden_layers", "encoder.layers"),
        ConfigField("max_position_embeddings", "max_len", 512),
        ConfigField("type_vocab_size", "type_vocab_size", 2),
        ConfigField("hidden_dropout_prob", "dropout", 0.1),
        ConfigField("pad_token_id", "pad_id", 0),
        ConfigField("initializer_range", "init_std", 0.02),
        ConfigField("layer_norm_eps", "norm.eps", 1e-12),
        ConfigField("hidden_act", "ffn.activation", "gelu", {"gelu": "gelu", "relu": "relu", "silu": "silu"}),
    ),
    refusals=_bert_refusals,
    to_ours=_bert_fields,
    to_theirs=_bert_json,
    save_problems=_bert_save_problems,
    comparable=_bert_comparable,
)
is_bert = BERT.matches


def load_bert(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """A bert model from a transformers BERT folder (:func:`~transformer_zoo.core.hf.read_hf_folder`)."""
    return read_hf_folder(BERT, directory, hf_config, validate=load_config, build=build_checked)


def save_bert(model: ZooModel, directory: str | Path, architecture: str | None = None) -> Path:
    """Write a bert model as transformers' ``save_pretrained`` would
    (:func:`~transformer_zoo.core.hf.write_hf_folder`).

    Args:
        architecture: the transformers class; None: the head's (``BertForMaskedLM``,
            ``BertForSequenceClassification``, ``BertForTokenClassification``); ``"BertModel"``:
            the encoder and pooler alone.
    """
    return write_hf_folder(BERT, model, directory, validate=load_config, architecture=architecture)


BERT_IMPORTER = Importer(
    name="hf-bert",
    description="a Hugging Face transformers BERT folder (config.json with model_type bert)",
    matches=is_bert,
    load=load_bert,
    family="bert",
    format="hf",
    save=save_bert,
)
