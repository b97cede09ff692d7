"""Load BERT checkpoints saved by Hugging Face ``transformers``, with no network.

A folder holding ``config.json`` (``model_type: bert``) and ``model.safetensors`` (or sharded
safetensors, or ``pytorch_model.bin``) becomes a :class:`~transformer_zoo.plugins.bert.Bert`:
its config is translated, every weight is placed by name (the query, key and value projections
are concatenated into one fused input projection), and whatever cannot be placed is reported.

The other way is :mod:`.hf_save`.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_zoo.core import weights
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.weights import TensorInfo, WeightsError

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"

HEADS = {  # architectures -> our head config
    "BertModel": lambda c: {"kind": "lm", "bias": True},
    "BertForMaskedLM": lambda c: {"kind": "lm", "bias": True},
    "BertForPreTraining": lambda c: {"kind": "lm", "bias": True},
    "BertForNextSentencePrediction": lambda c: {"kind": "sequence-classification", "num_classes": 2},
    "BertForSequenceClassification": lambda c: {"kind": "sequence-classification", "num_classes": _labels(c)},
    "BertForTokenClassification": lambda c: {"kind": "token-classification", "num_classes": _labels(c)},
}
LAYER = {  # Hugging Face names inside encoder.layer.{i}. -> ours inside encoder.layers.{i}.
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norms.0",
    "intermediate.dense": "ffn.linear1",
    "output.dense": "ffn.linear2",
    "output.LayerNorm": "norms.1",
}
OTHER = {
    "embeddings.word_embeddings": "src_embed.token",
    "embeddings.position_embeddings": "src_embed.positional.embedding",
    "embeddings.token_type_embeddings": "src_embed.token_type",
    "embeddings.LayerNorm": "src_embed.norm",
    "pooler.dense": "pooler.dense",
    "cls.predictions.transform.dense": "head.dense",
    "cls.predictions.transform.LayerNorm": "head.norm",
    "classifier": "head.proj",
    "cls.seq_relationship": "head.proj",  # next-sentence prediction: a 2-class pooled classifier
}
DECODER = {  # the masked-LM decoder; transformers keeps its bias under two names
    "cls.predictions.bias": "head.decoder.proj.bias",
    "cls.predictions.decoder.bias": "head.decoder.proj.bias",
    "cls.predictions.decoder.weight": "head.decoder.proj.weight",  # tied to the token embeddings: checked on load
}
BODY = ("embeddings.", "encoder.", "pooler.")  # a body weight that cannot be placed contradicts the config


def _labels(config: dict[str, Any]) -> int:
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)


def is_bert(config: dict[str, Any]) -> bool:
    """A BERT config: ``model_type: bert``, or (older files) no model_type and Bert architectures."""
    if "model_type" in config:
        return config["model_type"] == "bert"
    return any(str(a).startswith("Bert") for a in config.get("architectures") or ())


def bert_config(hf: dict[str, Any], checkpoint: dict[str, Tensor], source: str) -> dict[str, Any]:
    """Our BERT config for a Hugging Face one (``config.json``), or a ConfigError saying what differs."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(
            f"{source}: position_embedding_type={hf['position_embedding_type']!r}; only 'absolute' "
            "positions (the original BERT's) are supported"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(
            f"{source}: a BERT used as a decoder (is_decoder / add_cross_attention) is not supported; "
            "load an encoder checkpoint"
        )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ("gelu", "relu", "silu"):
        raise ConfigError(f"{source}: hidden_act={activation!r}; supported activations are gelu, relu and silu")
    architectures = hf.get("architectures") or ["BertModel"]
    known = [a for a in architectures if a in HEADS]
    if not known:
        raise ConfigError(f"{source}: architectures {architectures} are not supported; supported: {', '.join(HEADS)}")
    head = HEADS[known[0]](hf)
    if head["kind"] == "lm":
        head["tie_weights"] = hf.get("tie_word_embeddings", True)
    problem = hf.get("problem_type")
    if head["kind"] == "sequence-classification" and problem not in (None, "single_label_classification"):
        raise ConfigError(f"{source}: problem_type={problem!r}; only single-label classification is supported")
    if head["kind"] != "lm" and head["num_classes"] < 2:
        raise ConfigError(
            f"{source}: num_labels={head['num_classes']} (regression) is not supported; "
            "a classification head needs 2 or more labels"
        )
    dropout = hf.get("hidden_dropout_prob", 0.1)
    others = {
        k: hf[k] for k in ("attention_probs_dropout_prob", "classifier_dropout") if hf.get(k) not in (None, dropout)
    }
    if others:
        warnings.warn(
            f"{source}: the zoo uses one dropout rate, hidden_dropout_prob={dropout}; "
            f"{', '.join(f'{k}={v}' for k, v in others.items())} are replaced by it (this matters only "
            "in training)",
            stacklevel=4,
        )
    try:
        return {
            "variant": "bert",
            "vocab_size": hf["vocab_size"],
            "d_model": hf["hidden_size"],
            "n_heads": hf["num_attention_heads"],
            "d_ff": hf["intermediate_size"],
            "encoder": {"layers": hf["num_hidden_layers"]},
            "max_len": hf.get("max_position_embeddings", 512),
            "type_vocab_size": hf.get("type_vocab_size", 2),
            "dropout": dropout,
            "pad_id": hf.get("pad_token_id") or 0,
            "init_std": hf.get("initializer_range", 0.02),
            "norm": {"kind": "layernorm", "eps": hf.get("layer_norm_eps", 1e-12)},
            "ffn": {"kind": "mlp", "activation": activation, "inner_dropout": False},
            "pooler": any(k.endswith("pooler.dense.weight") for k in checkpoint),
            "head": head,
        }
    except KeyError as missing:
        raise ConfigError(f"{source}: a BERT config needs {missing.args[0]!r}; it is not there") from None


def _shards(directory: Path) -> list[Path]:
    """The files a sharded checkpoint's ``model.safetensors.index.json`` names, each kept inside
    the folder (:func:`~transformer_zoo.core.weights.inside`)."""
    index = weights.read_json_object(directory, INDEX_NAME, "tensor names by shard file (a weight_map)")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(
            f"{str(directory / INDEX_NAME)!r}: 'weight_map' must map each tensor name to the name of "
            f"its shard file, got {weights.shorten(repr(weight_map))}"
        )
    shards = [weights.inside(directory, name) for name in sorted(set(weight_map.values()))]
    absent = [str(path) for path in shards if not path.is_file()]
    if absent:
        raise WeightsError(f"{str(directory / INDEX_NAME)!r} names shards that are not there: {', '.join(absent)}")
    return shards


def safetensors_files(directory: Path) -> list[Path] | None:
    """``model.safetensors``, or the shards of ``model.safetensors.index.json``; None if neither."""
    if (directory / WEIGHTS_NAME).is_file():
        return [weights.inside(directory, WEIGHTS_NAME)]
    if (directory / INDEX_NAME).is_file():
        return _shards(directory)
    return None


def read_headers(files: list[Path]) -> dict[str, TensorInfo]:
    """The shapes and dtypes of every tensor in ``files``, from their headers; a tensor given by
    two files is refused."""
    header: dict[str, TensorInfo] = {}
    where: dict[str, Path] = {}
    for path in files:
        for name, info in weights.read_header(path).items():
            if name in header:
                raise WeightsError(
                    f"{weights.shorten(repr(name))} is in both {str(where[name])!r} and "
                    f"{str(path)!r}; each tensor must be in one shard"
                )
            header[name], where[name] = info, path
    return header


def read_bin(path: Path) -> dict[str, Tensor]:
    """A ``pytorch_model.bin`` state dict, memory-mapped where the format allows, read without
    running any code it holds (``weights_only``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on odd pickle protocols: the file is refused anyway
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:
                if "mmap" not in str(error):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)  # the pre-1.6 format cannot be mapped
    except Exception as error:  # a damaged file can fail anywhere in torch's unpickler (IndexError, KeyError, ...)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise WeightsError(
            f"{str(path)!r} is not a readable PyTorch state dict (only tensors are read, no code): "
            f"{weights.shorten(reason, 300)}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise WeightsError(f"{str(path)!r} holds a {type(state).__name__}; expected a state dict of tensors by name")
    return state


def _bin_path(directory: Path) -> Path:
    if not (directory / BIN_NAME).is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no weights: expected {WEIGHTS_NAME}, {INDEX_NAME} or {BIN_NAME}"
        )
    return weights.inside(directory, BIN_NAME)


def _normalise(name: str) -> str:
    name = name.removeprefix("bert.")
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def map_weights(checkpoint: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str], list[str]]:
    """Hugging Face names to ours: the mapped tensors, the checkpoint name of each, and the
    checkpoint names with no place."""
    mapped: dict[str, Tensor] = {}
    sources: dict[str, str] = {}
    unplaced: list[str] = []
    fused: dict[tuple[int, str], dict[str, Tensor]] = {}
    for original, tensor in checkpoint.items():
        name = _normalise(original)
        prefix, _, param = name.rpartition(".")
        if _is_position_ids(original):
            continue
        if match := re.fullmatch(r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)", prefix):
            fused.setdefault((int(match[1]), param), {})[match[2]] = tensor
            sources[f"encoder.layers.{match[1]}.self_attn.in_proj.{param}"] = original.replace(
                f".{match[2]}.", ".query|key|value."
            )
            continue
        if match := re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", prefix):
            ours = f"encoder.layers.{match[1]}.{LAYER[match[2]]}.{param}" if match[2] in LAYER else None
        elif prefix in OTHER:
            ours = f"{OTHER[prefix]}.{param}"
        elif name in DECODER:
            ours = DECODER[name]
        else:
            ours = None
        if ours is None:
            unplaced.append(original)
        else:
            mapped[ours], sources[ours] = tensor, original
    for (layer, param), parts in fused.items():
        ours = f"encoder.layers.{layer}.self_attn.in_proj.{param}"
        if set(parts) != {"query", "key", "value"}:
            unplaced.append(sources.pop(ours))
            continue
        if len({part.shape for part in parts.values()}) > 1:  # they cannot be fused into one projection
            shapes = ", ".join(f"{name} {tuple(part.shape)}" for name, part in sorted(parts.items()))
            unplaced.append(f"{sources.pop(ours)} (of different shapes: {shapes})")
            continue
        mapped[ours] = torch.cat([parts["query"], parts["key"], parts["value"]])  # (3D, D) or (3D,): fused
    return mapped, sources, unplaced


def _is_position_ids(name: str) -> bool:
    return _normalise(name) == "embeddings.position_ids"  # a buffer of positions 0..n-1, not a weight


def fit(model: ZooModel, checkpoint: dict[str, Tensor], source: str) -> tuple[dict[str, Tensor], list[str]]:
    """Place ``checkpoint`` in ``model`` by name (either may be on the ``meta`` device): the
    mapped tensors and the checkpoint names with no place, or a WeightsError naming each
    mismatched shape, weight of a non-float dtype, body weight with no place and missing weight."""
    mapped, sources, unplaced = map_weights(checkpoint)
    ours = model.state_dict()
    mistyped = [
        problem
        for name, tensor in checkpoint.items()
        if not _is_position_ids(name) and (problem := weights.dtype_problem(name, tensor.dtype, torch.float32))
    ]
    wrong = [
        f"{sources[k]} -> {k}: checkpoint {tuple(v.shape)}, model {tuple(ours[k].shape)}"
        for k, v in mapped.items()
        if k in ours and v.shape != ours[k].shape
    ]
    unplaced += [sources[k] for k in mapped if k not in ours]
    body = [k for k in unplaced if _normalise(k).startswith(BODY)]
    missing = [k for k in ours if k not in mapped and not k.startswith("head.")]
    problems = [f"dtype mismatch {m}" for m in mistyped]
    problems += [f"shape mismatch {w}" for w in wrong]
    problems += [f"not in the model the config describes: {k}" for k in body]
    problems += [f"missing from the checkpoint: {k}" for k in missing]
    weights.raise_if_any(Path(source), problems, "holds weights that do not fit its config.json")
    return mapped, unplaced


def load_bert(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """Build a Bert from a Hugging Face BERT folder and place every weight.

    The tensor shapes and dtypes are read first (the safetensors headers; a ``.bin`` is
    memory-mapped) and checked against the model the config describes, built on the ``meta``
    device, so a config that does not fit its weights is refused before the model is allocated.

    Raises:
        ConfigError: the config is not one we can translate, or the weights do not fit it
            (the message names each mismatched key with both shapes).
        WeightsError: (a ConfigError) a weights file is damaged or lies outside the folder.
    """
    from transformer_zoo.api import build_model, load_config

    source = str(directory)
    files = safetensors_files(directory)
    if files is not None:
        tensors = None
        shapes = {name: info.on_meta() for name, info in read_headers(files).items()}
    else:
        tensors = read_bin(_bin_path(directory))
        shapes = {name: tensor.to("meta") for name, tensor in tensors.items()}
    config = load_config(bert_config(hf_config, shapes, source))
    skeleton = weights.build_on_meta(config.build)
    if skeleton is not None:
        fit(skeleton, shapes, source)
    model = build_model(config)
    if tensors is None:
        tensors = {name: tensor for path in files for name, tensor in weights.read_tensors(path).items()}
    mapped, unplaced = fit(model, tensors, source)
    if model.config.head.kind == "lm" and model.config.head.tie_weights:
        tied = mapped.pop("head.decoder.proj.weight", None)
        if tied is not None and not torch.equal(tied, mapped["src_embed.token.weight"]):
            unplaced.append(
                "cls.predictions.decoder.weight (differs from the word embeddings, but the config "
                "ties them: tie_word_embeddings is true)"
            )
    model.load_state_dict(mapped, strict=False)
    ours = model.state_dict()
    decoder = getattr(model.head, "decoder", None)
    tied = decoder is not None and decoder.proj.weight is model.src_embed.token.weight
    fresh = [
        k for k in ours if k.startswith("head.") and k not in mapped and not (tied and k == "head.decoder.proj.weight")
    ]
    if unplaced:
        warnings.warn(
            f"{source}: weights with no place in the model, left out: {', '.join(sorted(unplaced))}", stacklevel=4
        )
    if fresh:
        warnings.warn(
            f"{source}: the checkpoint has no weights for the head; newly initialised: {', '.join(fresh)}", stacklevel=4
        )
    return model.eval()
