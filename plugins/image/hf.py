"""ViT in Hugging Face ``transformers``: the image family's map for :mod:`transformer_zoo.core.hf`.

``ViTForImageClassification`` is the zoo's patch encoder
(:class:`~transformer_zoo.plugins.image.ImageEncoder`) with ``positional: learned``: one learned
vector per token, the class token's first (``(1, 1 + n, D)`` there, ``(1 + n, D)`` here). A
patch encoder saves as one, and its folder reads back; a ``ViTModel`` folder (the encoder alone)
reads with a new classifier, its pooler and any mask token left out with a warning. Both models
read pixels ``(B, C, H, W)`` as given (the image processor's normalisation is the caller's),
and the zoo's reads its config's ``image_size`` alone, where transformers can interpolate its
positions. ``hidden_act`` ``gelu_new`` and ``gelu_pytorch_tanh`` are both the zoo's ``gelu-tanh``
(GELU's tanh approximation), written back as ``gelu_pytorch_tanh``. ``initializer_range``,
``encoder_stride``, ``pooler_output_size`` and ``pooler_act`` are ignored; the zoo's head drops
out before the classifier, where transformers' does not.
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

from .blocks import PatchEmbedding

# transformers' -> ours; ours is written back as its first spelling here
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_new": "gelu-tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
LAYER = "encoder.layer.{i}."
POOLER = "ViTModel's pooler, dense and tanh on the class token"


def _pair(hf: dict[str, Any], field: str, default: int) -> list[int]:
    """``image_size`` or ``patch_size``: one side, or ``[height, width]``."""
    value = hf.get(field, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value
    raise ConfigError(f"{field}={value!r}; expected a number of pixels or [height, width]")


def _vit_refusals(hf: dict[str, Any]) -> list[str]:
    # each refusal names its field first, in one line, and alone
    architectures = hf.get("architectures") or ["ViTForImageClassification"]
    if not any(a in VIT.architectures for a in architectures):
        raise ConfigError(
            f"architectures={architectures}; the zoo reads ViTForImageClassification, and ViTModel (the "
            "encoder alone, given a new classifier)"
        )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ConfigError(
            f"hidden_act={activation!r}; the zoo reads a ViT's {', '.join(map(repr, ACTIVATIONS))} (GELU exact, "
            "GELU's tanh approximation, ReLU and SiLU)"
        )
    if hf.get("qkv_bias", True) is not True:
        raise ConfigError(
            f"qkv_bias={hf['qkv_bias']!r}; the zoo's attention has biases on all its projections or on none, "
            "and transformers' ViT always has one on its output projection: only qkv_bias: true is read"
        )
    patch = _pair(hf, "patch_size", 16)
    if patch[0] != patch[1]:
        raise ConfigError(f"patch_size={patch}; the zoo's patches are square: give patch_size as one number")
    problem = hf.get("problem_type")
    if problem not in (None, "single_label_classification"):
        raise ConfigError(f"problem_type={problem!r}; only single_label_classification is supported")
    if num_labels(hf) < 2:
        raise ConfigError(
            f"num_labels={num_labels(hf)}; the zoo's classifier needs 2 or more labels (1 is regression, 0 no "
            "classifier)"
        )
    return []


def _vit_fields(hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    dropout = hf.get("hidden_dropout_prob", 0.0)
    if hf.get("attention_probs_dropout_prob", dropout) != dropout:
        warnings.warn(
            f"the zoo uses one dropout rate, hidden_dropout_prob={dropout}; attention_probs_dropout_prob="
            f"{hf['attention_probs_dropout_prob']} is replaced by it (this matters only in training)",
            stacklevel=5,
        )
    return {
        "image_size": _pair(hf, "image_size", 224),
        "num_classes": num_labels(hf),
        "patch": _pair(hf, "patch_size", 16)[0],
        "positional": "learned",
        "pooling": "cls",
        "norm": {"kind": "layernorm"},
        "norm_placement": "pre",
        "ffn": {"kind": "mlp", "inner_dropout": False},
        "encoder": {"kind": "standard"},
    }


def _vit_json(model: ZooModel, **options: Any) -> dict[str, Any]:
    config = model.config
    if options:
        raise ValueError(
            f"{', '.join(f'{key}=' for key in options)}: format='hf' takes no options for a ViT; it always "
            "writes ViTForImageClassification"
        )
    if not isinstance(getattr(model, "patches", None), PatchEmbedding):
        raise ConfigError(
            "format='hf' writes transformers' ViTForImageClassification, a patch encoder (vit-tiny and its "
            f"configs); this {config.variant!r} model ({type(model).__name__}) is not one: save it with "
            "format='zoo' (the default)"
        )
    height, width = config.image_size
    return {
        "image_size": height if height == width else [height, width],
        "patch_size": config.patch,
        "attention_probs_dropout_prob": config.dropout,  # the zoo has one dropout rate
        "qkv_bias": True,
        "problem_type": "single_label_classification",
        **label_fields(config.num_classes),
    }


def _vit_comparable(dump: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    dump = {**dump, "encoder": {k: v for k, v in dump["encoder"].items() if k != "cross_attention"}}  # none to use
    if dump["dropout"] == 0:  # without dropout there is none to place inside the FFN
        dump["ffn"] = {k: v for k, v in dump["ffn"].items() if k != "inner_dropout"}
    return dump


VIT = HFMap(
    model_type="vit",
    title="ViT",
    family="image-attention",
    variant="vit-tiny",  # the family's preset; every field that matters is set by the map
    architectures=("ViTForImageClassification", "ViTModel"),
    prefix="vit.",
    base=("ViTModel",),
    left_out={
        "pooler.dense.weight": POOLER,
        "pooler.dense.bias": POOLER,
        "embeddings.mask_token": "masked image modelling's mask token",
    },
    weights=(
        Weight("patches.proj", "embeddings.patch_embeddings.projection"),
        Weight("cls", "embeddings.cls_token"),
        Weight("positional.table", "embeddings.position_embeddings", unsqueezed=True),
        Weight("encoder.layers.{i}.norms.0", LAYER + "layernorm_before"),
        Weight(
            "encoder.layers.{i}.self_attn.in_proj",
            fused=tuple(f"{LAYER}attention.attention.{p}" for p in ("query", "key", "value")),
        ),
        Weight("encoder.layers.{i}.self_attn.out_proj", LAYER + "attention.output.dense"),
        Weight("encoder.layers.{i}.norms.1", LAYER + "layernorm_after"),
        Weight("encoder.layers.{i}.ffn.linear1", LAYER + "intermediate.dense"),
        Weight("encoder.layers.{i}.ffn.linear2", LAYER + "output.dense"),
        Weight("encoder.final_norm", "layernorm"),
        Weight("head.proj", "classifier"),
    ),
    fields=(
        ConfigField("hidden_size", "d_model"),
        ConfigField("num_attention_heads", "n_heads"),
        ConfigField("intermediate_size", "d_ff"),
        ConfigField("num_hidden_layers", "encoder.layers"),
        ConfigField("num_channels", "channels", 3),
        ConfigField("hidden_dropout_prob", "dropout", 0.0),
        ConfigField("layer_norm_eps", "norm.eps", 1e-12),
        ConfigField("hidden_act", "ffn.activation", "gelu", ACTIVATIONS),
    ),
    why={
        "positional": " (one learned table over the class token and the patches)",
        "norm_placement": " (layernorm_before and layernorm_after in each layer, and a final layernorm)",
        "pooling": " (the classifier reads the class token)",
    },
    refusals=_vit_refusals,
    to_ours=_vit_fields,
    to_theirs=_vit_json,
    comparable=_vit_comparable,
)
is_vit = VIT.matches


def load_vit(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """The zoo's patch encoder from a transformers ViT folder (:func:`~transformer_zoo.core.hf.read_hf_folder`)."""
    return read_hf_folder(VIT, directory, hf_config, validate=load_config, build=build_checked)


def save_vit(model: ZooModel, directory: str | Path, **options: Any) -> Path:
    """Write a patch encoder as transformers' ``ViTForImageClassification.save_pretrained`` would
    (:func:`~transformer_zoo.core.hf.write_hf_folder`); it takes no ``options``, and refuses the
    family's SAGAN models."""
    return write_hf_folder(VIT, model, directory, validate=load_config, **options)


VIT_IMPORTER = Importer(
    name="hf-vit",
    description="a Hugging Face transformers ViT folder (config.json with model_type vit: ViTForImageClassification)",
    matches=is_vit,
    load=load_vit,
    family="image-attention",
    format="hf",
    save=save_vit,
)
