"""Load ViT checkpoints saved by Hugging Face ``transformers``, with no network.

A folder holding ``config.json`` (``model_type: vit``) and ``model.safetensors``, as
``ViTForImageClassification.save_pretrained`` writes it, becomes the zoo's patch encoder
(:class:`~transformer_zoo.plugins.image.ImageEncoder`, ``positional: learned``) computing the same
logits. A ``ViTModel`` folder (the encoder alone) loads too, with a new classifier. The other way
is :mod:`.hf_save`.

Weights (transformers' names, inside ``vit.`` but for the classifier, and ours):

- ``embeddings.patch_embeddings.projection`` -> ``patches.proj``: both a Conv2d with kernel and
  stride the patch side, so the weights ``(D, C, p, p)`` and the patches' order (reading order,
  ``flatten(2)``) are the same;
- ``embeddings.cls_token`` ``(1, 1, D)`` -> ``cls``;
- ``embeddings.position_embeddings`` ``(1, 1 + n, D)`` -> ``positional.table`` ``(1 + n, D)``, one
  flat table, the class token's position first (:class:`~.blocks.LearnedPositions`);
- ``encoder.layer.{i}.`` -> ``encoder.layers.{i}.``: ``layernorm_before`` -> ``norms.0``,
  ``attention.attention.query|key|value`` -> ``self_attn.in_proj`` (fused, in that order),
  ``attention.output.dense`` -> ``self_attn.out_proj``, ``layernorm_after`` -> ``norms.1``,
  ``intermediate.dense`` -> ``ffn.linear1``, ``output.dense`` -> ``ffn.linear2`` (pre-norm layers);
- ``layernorm`` -> ``encoder.final_norm``; ``classifier`` -> ``head.proj`` (on the class token);
- left out, with a warning: ``ViTModel``'s pooler (a dense layer and tanh on the class token,
  which ``ViTForImageClassification`` does not use) and the mask token of masked image modelling.

Config fields: ``hidden_size``, ``num_attention_heads``, ``intermediate_size``,
``num_hidden_layers``, ``image_size``, ``patch_size``, ``num_channels``, ``num_labels``,
``layer_norm_eps``, ``hidden_act`` (``gelu`` is exact GELU, as the zoo's) and
``hidden_dropout_prob`` map to their zoo fields; ``initializer_range``, ``encoder_stride``,
``pooler_output_size`` and ``pooler_act`` (of training from scratch, masked image modelling and
the pooler) are ignored. What the zoo cannot compute (GELU's tanh approximation, ``qkv_bias:
false``, non-square patches, multi-label or regression heads, other architectures) is refused
with a ConfigError naming the field.

Dropout (training only): both drop after the embeddings, on the attention weights and on each
residual branch at ``hidden_dropout_prob``; the zoo's head also drops before the classifier,
where transformers' does not.

Inputs: both models read pixel values ``(B, C, H, W)`` as given; the normalisation of the
checkpoint's image processor (``preprocessor_config.json``, not read here) is applied before
calling either. The zoo's model reads images of its config's ``image_size`` only: an image of
another size is refused (a ValueError naming the expected shape) where transformers would
interpolate the positions on request (``interpolate_pos_encoding``).
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

WEIGHTS_NAME = "model.safetensors"
ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu"}  # transformers' -> ours
LAYER = {  # transformers' modules inside encoder.layer.{i}. -> ours inside encoder.layers.{i}.
    "layernorm_before": "norms.0",
    "attention.output.dense": "self_attn.out_proj",
    "layernorm_after": "norms.1",
    "intermediate.dense": "ffn.linear1",
    "output.dense": "ffn.linear2",
}
OTHER = {  # transformers' modules and parameters outside the layers -> ours
    "embeddings.patch_embeddings.projection": "patches.proj",
    "embeddings.cls_token": "cls",
    "embeddings.position_embeddings": "positional.table",  # (1, 1 + n, D) there, (1 + n, D) here
    "layernorm": "encoder.final_norm",
    "classifier": "head.proj",
}
LEFT_OUT = {  # weights of transformers' ViT that ViTForImageClassification does not use, and why
    "pooler.dense.weight": "ViTModel's pooler, dense and tanh on the class token",
    "pooler.dense.bias": "ViTModel's pooler, dense and tanh on the class token",
    "embeddings.mask_token": "the mask token of masked image modelling",
}
FUSED = re.compile(r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)")
IN_LAYER = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
BODY = ("embeddings.", "encoder.", "layernorm.")  # a body weight that cannot be placed contradicts the config


def is_vit(config: dict[str, Any]) -> bool:
    """A transformers ViT config: ``model_type: vit``."""
    return config.get("model_type") == "vit"


def _pair(hf: dict[str, Any], field: str, default: int) -> list[int]:
    """``image_size`` or ``patch_size``: one side, or ``[height, width]``."""
    value = hf.get(field, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value
    raise ConfigError(f"{field}={value!r}; expected a number of pixels or [height, width]")


def _labels(hf: dict[str, Any]) -> int:
    return int(hf.get("num_labels") or len(hf.get("id2label") or {}) or 2)


def vit_config(hf: dict[str, Any]) -> dict[str, Any]:
    """Our patch encoder's config for a transformers ViT one (``config.json``), or a ConfigError
    naming the field it cannot take and what would be right."""
    architectures = hf.get("architectures") or ["ViTForImageClassification"]
    if not any(a in ARCHITECTURES for a in architectures):
        raise ConfigError(
            f"architectures={architectures}; the zoo reads ViTForImageClassification, and ViTModel (the "
            "encoder alone, given a new classifier)"
        )
    activation = hf.get("hidden_act", "gelu")
    if activation not in ACTIVATIONS:
        raise ConfigError(
            f"hidden_act={activation!r}; the zoo's feed-forward activations are 'gelu' (exact, as transformers' "
            "'gelu'), 'relu' and 'silu': GELU's tanh approximation ('gelu_new', 'gelu_pytorch_tanh') is not one"
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
    labels = _labels(hf)
    if labels < 2:
        raise ConfigError(
            f"num_labels={labels}; the zoo's classifier needs 2 or more labels (1 is regression, 0 no classifier)"
        )
    dropout = hf.get("hidden_dropout_prob", 0.0)
    if hf.get("attention_probs_dropout_prob", dropout) != dropout:
        warnings.warn(
            f"the zoo uses one dropout rate, hidden_dropout_prob={dropout}; attention_probs_dropout_prob="
            f"{hf['attention_probs_dropout_prob']} is replaced by it (this matters only in training)",
            stacklevel=4,
        )
    try:
        return {
            "variant": "vit-tiny",  # the family's preset; every field that matters is set here
            "image_size": _pair(hf, "image_size", 224),
            "channels": hf.get("num_channels", 3),
            "num_classes": labels,
            "patch": patch[0],
            "d_model": hf["hidden_size"],
            "n_heads": hf["num_attention_heads"],
            "d_ff": hf["intermediate_size"],
            "dropout": dropout,
            "positional": "learned",
            "pooling": "cls",
            "norm": {"kind": "layernorm", "eps": hf.get("layer_norm_eps", 1e-12)},
            "norm_placement": "pre",
            "ffn": {"kind": "mlp", "activation": ACTIVATIONS[activation], "inner_dropout": False},
            "encoder": {"kind": "standard", "layers": hf["num_hidden_layers"]},
        }
    except KeyError as missing:
        raise ConfigError(f"a ViT config needs {missing.args[0]!r}; it is not there") from None


def map_weights(checkpoint: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str], list[str]]:
    """transformers' names to ours: the mapped tensors, the checkpoint name of each, and the
    checkpoint names with no place."""
    mapped: dict[str, Tensor] = {}
    sources: dict[str, str] = {}
    unplaced: list[str] = []
    fused: dict[tuple[str, str], dict[str, Tensor]] = {}
    for original, tensor in checkpoint.items():
        name = original.removeprefix("vit.")
        prefix, _, param = name.rpartition(".")
        if match := FUSED.fullmatch(name):
            layer, part, param = match.groups()
            fused.setdefault((layer, param), {})[part] = tensor
            sources[f"encoder.layers.{layer}.self_attn.in_proj.{param}"] = original.replace(
                f".{part}.", ".query|key|value."
            )
            continue
        if (match := IN_LAYER.fullmatch(name)) and match[2] in LAYER:
            ours = f"encoder.layers.{match[1]}.{LAYER[match[2]]}.{match[3]}"
        elif name in OTHER:  # a parameter of its own: the class token, the positions
            ours = OTHER[name]
            if ours == "positional.table":
                tensor = tensor.squeeze(0)  # (1, 1 + n, D) -> (1 + n, D)
        elif prefix in OTHER:
            ours = f"{OTHER[prefix]}.{param}"
        else:
            unplaced.append(original)
            continue
        mapped[ours], sources[ours] = tensor, original
    for (layer, param), parts in fused.items():
        ours = f"encoder.layers.{layer}.self_attn.in_proj.{param}"
        if set(parts) != {"query", "key", "value"} or len({part.shape for part in parts.values()}) > 1:
            unplaced.append(f"{sources.pop(ours)} (query, key and value must all be there, of one shape)")
            continue
        mapped[ours] = torch.cat([parts["query"], parts["key"], parts["value"]])  # (3D, D) or (3D,)
    return mapped, sources, unplaced


def fit(model: ZooModel, checkpoint: dict[str, Tensor], source: str) -> tuple[dict[str, Tensor], list[str]]:
    """Place ``checkpoint`` in ``model`` by name (either may be on the ``meta`` device): the
    mapped tensors and the checkpoint names with no place, or a WeightsError naming each
    mismatched shape, weight of a non-float dtype, body weight with no place and missing weight."""
    mapped, sources, unplaced = map_weights(checkpoint)
    ours = model.state_dict()
    problems = [
        f"dtype mismatch {problem}"
        for name, tensor in checkpoint.items()
        if (problem := weights.dtype_problem(name, tensor.dtype, torch.float32))
    ]
    problems += [
        f"shape mismatch {sources[k]} -> {k}: checkpoint {tuple(checkpoint.get(sources[k], v).shape)}, "
        f"model {tuple(ours[k].shape)}"
        for k, v in mapped.items()
        if k in ours and v.shape != ours[k].shape
    ]
    unplaced += [sources[k] for k in mapped if k not in ours]
    problems += [
        f"not in the model the config describes: {k}"
        for k in unplaced
        if k.removeprefix("vit.").startswith(BODY) and k.removeprefix("vit.") not in LEFT_OUT
    ]
    problems += [f"missing from the checkpoint: {k}" for k in ours if k not in mapped and not k.startswith("head.")]
    weights.raise_if_any(Path(source), problems, "holds weights that do not fit its config.json")
    return mapped, unplaced


def load_vit(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """Build the zoo's patch encoder from a transformers ViT folder and place every weight.

    The tensor shapes and dtypes are read first (the safetensors header) and checked against
    the model the config describes, built on the ``meta`` device, so a config that does not fit
    its weights is refused before the model is allocated.

    Raises:
        FileNotFoundError: the folder has no ``model.safetensors``.
        ConfigError: the config is not one the zoo can compute (the field is named), or the
            weights do not fit it (each mismatched name, with both shapes).
        WeightsError: (a ConfigError) the weights file is damaged or lies outside the folder.
    """
    from transformer_zoo.api import build_model, load_config

    source = str(directory)
    if not (directory / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{source!r} holds no {WEIGHTS_NAME}; a ViT folder is read from its safetensors weights "
            "(transformers' save_pretrained writes them)"
        )
    path = weights.inside(directory, WEIGHTS_NAME)
    header = weights.read_header(path)
    config = load_config(vit_config(hf_config))
    skeleton = weights.build_on_meta(config.build)
    if skeleton is not None:
        fit(skeleton, {name: info.on_meta() for name, info in header.items()}, source)
    model = build_model(config)
    mapped, unplaced = fit(model, weights.read_tensors(path), source)
    model.load_state_dict(mapped, strict=False)
    if unplaced:
        reasons = [
            f"{name} ({LEFT_OUT[name.removeprefix('vit.')]})" if name.removeprefix("vit.") in LEFT_OUT else name
            for name in sorted(unplaced)
        ]
        warnings.warn(
            f"{source}: weights ViTForImageClassification does not use, left out: {', '.join(reasons)}", stacklevel=4
        )
    fresh = [k for k in model.state_dict() if k not in mapped]
    if fresh:
        warnings.warn(
            f"{source}: the checkpoint has no weights for the classifier; newly initialised: {', '.join(fresh)}",
            stacklevel=4,
        )
    return model.eval()
