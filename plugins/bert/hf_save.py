"""Saving a bert-family model in the layout of Hugging Face ``transformers``.

:func:`save_hf` writes ``config.json`` (a BertConfig) and ``model.safetensors`` under
``transformers``' names: :mod:`.hf`'s name tables inverted, after checking that reading the
folder back through :func:`.hf.bert_config` gives the model's config, field for field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.model import ZooModel, write_folder

from .hf import BODY, DECODER, LAYER, OTHER, bert_config

ARCHITECTURES = {  # our head kind -> the transformers class that holds it
    "lm": "BertForMaskedLM",
    "sequence-classification": "BertForSequenceClassification",
    "token-classification": "BertForTokenClassification",
}
TO_LAYER = {ours: theirs for theirs, ours in LAYER.items()}
TO_OTHER = {ours: theirs for theirs, ours in reversed(OTHER.items())}  # head.proj: 'classifier', the first listed
FUSED = re.compile(r"encoder\.layers\.(\d+)\.self_attn\.in_proj\.(weight|bias)")


def hf_architecture(config: Any, architecture: str | None) -> str:
    """The ``transformers`` class to save as: the head's own, unless ``BertModel`` (the encoder
    and pooler alone) is asked for; a ConfigError for any other."""
    kind = config.head.kind
    own = ARCHITECTURES.get(kind)
    chosen = own if architecture is None else architecture
    if chosen is not None and chosen in (own, "BertModel"):
        return chosen
    allowed = " or ".join(repr(a) for a in (own, "BertModel") if a)
    heads = ", ".join(ARCHITECTURES)
    raise ConfigError(
        f"architecture={architecture!r}: a bert model with a {kind!r} head saves as {allowed} (the "
        f"encoder and pooler, without the head); transformers has a class for the heads {heads}"
    )


def hf_config(config: Any, architecture: str, dtype: torch.dtype) -> dict[str, Any]:
    """A ``transformers`` BertConfig (as ``config.json`` holds it) for our config; what it cannot
    express is found by :func:`check_expressible`."""
    head = config.head
    hf: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.encoder.layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": getattr(config.ffn, "activation", "gelu"),
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,  # the zoo has one dropout rate
        "classifier_dropout": None,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": config.type_vocab_size,
        "position_embedding_type": "absolute",
        "layer_norm_eps": getattr(config.norm, "eps", 1e-12),
        "initializer_range": config.init_std,
        "pad_token_id": config.pad_id,
        "is_decoder": False,
        "add_cross_attention": False,
        "tie_word_embeddings": head.tie_weights if head.kind == "lm" else True,
        "dtype": str(dtype).removeprefix("torch."),
    }
    if head.kind != "lm":
        labels = [f"LABEL_{i}" for i in range(head.num_classes)]
        hf |= {
            "num_labels": head.num_classes,
            "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    if head.kind == "sequence-classification":
        hf["problem_type"] = "single_label_classification"
    return hf


def _differences(ours: Any, theirs: Any, path: str) -> list[str]:
    """Each field where two config dumps differ: ``norm_placement is 'pre'; transformers' BERT needs 'post'``."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("kind") != theirs.get("kind"):
            return [f"{path}kind is {ours.get('kind')!r}; transformers' BERT needs {theirs.get('kind')!r}"]
        return [line for key in ours for line in _differences(ours[key], theirs.get(key), f"{path}{key}.")]
    return [] if ours == theirs else [f"{path[:-1]} is {ours!r}; transformers' BERT needs {theirs!r}"]


def check_expressible(model: ZooModel, hf: dict[str, Any], architecture: str) -> None:
    """Refuse a model that ``hf`` does not describe: read back by the importer's own translation
    (:func:`bert_config`), ``hf`` must give the model's config, field for field; the ConfigError
    names each field that differs and the value transformers' BERT would need."""
    from transformer_zoo.api import load_config

    config = model.config
    ours = config.model_dump(mode="json")
    back = load_config(bert_config(hf, {}, "format='hf'")).model_dump(mode="json")
    ignored = {"variant", "pooler"} | ({"head"} if architecture == "BertModel" else set())  # the pooler: below
    problems = [
        line for key in ours if key not in ignored for line in _differences(ours[key], back.get(key), f"{key}.")
    ]
    if config.type_vocab_size == 0:
        problems.append(
            "type_vocab_size is 0; transformers' BERT always adds token-type embeddings, so it needs 1 or more"
        )
    if model.pooler is None and architecture in ("BertModel", "BertForSequenceClassification"):
        problems.append(
            f"the model has no pooler (pooler is {config.pooler!r}); {architecture} has one: set pooler: true"
        )
    if problems:
        raise ConfigError(
            f"this model cannot be saved with format='hf' as transformers' {architecture}:\n"
            + "\n".join(f"  {line}" for line in problems)
            + "\nchange these fields, or save with format='zoo' (the default), which keeps every option"
        )


def _hf_names(ours: str, tied: bool) -> list[str] | None:
    """The names ``transformers`` gives one of our weights (the inverse of :func:`map_weights`,
    with no ``bert.`` prefix); None if it has none."""
    prefix, _, param = ours.rpartition(".")
    if match := re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)", prefix):
        inner = TO_LAYER.get(match[2])
        return None if inner is None else [f"encoder.layer.{match[1]}.{inner}.{param}"]
    if prefix in TO_OTHER:
        return [f"{TO_OTHER[prefix]}.{param}"]
    if ours in DECODER.values():
        names = [theirs for theirs, name in DECODER.items() if name == ours]
        # a tied decoder's weight is the word embeddings, and transformers saves its bias once
        return [n for n in names if n == "cls.predictions.bias"] if tied else names
    return None


def hf_state_dict(model: ZooModel, architecture: str) -> dict[str, Tensor]:
    """The model's weights under ``transformers``' names, each a CPU copy: the fused input
    projections split into query, key and value, a tied decoder left out (as transformers saves
    it), the body under ``bert.`` except for ``BertModel``, which has no head."""
    decoder = getattr(model.head, "decoder", None)
    tied = decoder is not None and decoder.proj.weight is model.src_embed.token.weight
    body = "" if architecture == "BertModel" else "bert."
    state: dict[str, Tensor] = {}
    unnamed: list[str] = []
    for ours, tensor in model.state_dict().items():
        if architecture == "BertModel" and ours.startswith("head."):
            continue
        if match := FUSED.fullmatch(ours):
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3)):  # (D, D) or (D,) each
                name = f"{body}encoder.layer.{match[1]}.attention.self.{part}.{match[2]}"
                state[name] = chunk.detach().to("cpu", copy=True)
            continue
        names = _hf_names(ours, tied)
        if names is None:
            unnamed.append(ours)
        for name in names or ():
            state[body + name if name.startswith(BODY) else name] = tensor.detach().to("cpu", copy=True)
    if unnamed:
        raise ConfigError(f"weights with no name in transformers' BERT: {', '.join(unnamed)}; save with format='zoo'")
    return state


def save_hf(model: ZooModel, directory: str | Path, architecture: str | None = None) -> Path:
    """Write a bert-family model as ``transformers``' ``save_pretrained`` would, into ``directory``
    (created if needed): ``config.json`` (a BertConfig) and ``model.safetensors``, each atomically.

    Args:
        architecture: the ``transformers`` class; None: the head's (``BertForMaskedLM``,
            ``BertForSequenceClassification``, ``BertForTokenClassification``); ``"BertModel"``:
            the encoder and pooler alone.

    Raises:
        ConfigError: the config has options transformers' BERT cannot express (each is named,
            with the value it would need), or ``architecture`` does not fit the head.
    """
    if model.config is None:
        raise ValueError(
            f"this {type(model).__name__} has no config: it was built by hand; build it with "
            "transformer_zoo.build_model(...) to be able to save it"
        )
    architecture = hf_architecture(model.config, architecture)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    hf = hf_config(model.config, architecture, dtype)
    check_expressible(model, hf, architecture)
    state = hf_state_dict(model, architecture)
    return write_folder(directory, state, hf)
