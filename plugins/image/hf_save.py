"""Saving the zoo's ViT in the layout of Hugging Face ``transformers``.

:func:`save_hf` writes ``config.json`` (a ViTConfig for ``ViTForImageClassification``) and
``model.safetensors`` under ``transformers``' names (:mod:`.hf`'s name tables inverted), after
checking that reading the folder back through :func:`.hf.vit_config` gives the model's config,
field for field. Only a patch encoder saves so; the family's SAGAN models are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.model import ZooModel, write_folder

from .blocks import PatchEmbedding
from .hf import LAYER, OTHER, vit_config

ARCHITECTURE = "ViTForImageClassification"
TO_LAYER = {ours: theirs for theirs, ours in LAYER.items()}
TO_OTHER = {ours: theirs for theirs, ours in OTHER.items()}
FUSED = re.compile(r"encoder\.layers\.(\d+)\.self_attn\.in_proj\.(weight|bias)")
IN_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")
WHY = {  # what transformers' ViT has, for the fields whose needed value does not say it
    "positional": " (one learned table over the class token and the patches)",
    "norm_placement": " (layernorm_before and layernorm_after in each layer, and a final layernorm)",
    "pooling": " (the classifier reads the class token)",
}


def hf_config(config: Any, dtype: torch.dtype) -> dict[str, Any]:
    """A ``transformers`` ViTConfig (as ``config.json`` holds it) for our config; what it cannot
    express is found by :func:`check_expressible`."""
    height, width = config.image_size
    labels = [f"LABEL_{i}" for i in range(config.num_classes)]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "vit",
        "hidden_size": config.d_model,
        "num_hidden_layers": config.encoder.layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": getattr(config.ffn, "activation", "gelu"),
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,  # the zoo has one dropout rate
        "layer_norm_eps": getattr(config.norm, "eps", 1e-12),
        "image_size": height if height == width else [height, width],
        "patch_size": config.patch,
        "num_channels": config.channels,
        "qkv_bias": True,
        "num_labels": config.num_classes,
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "problem_type": "single_label_classification",
        "dtype": str(dtype).removeprefix("torch."),
    }


def _differences(ours: Any, theirs: Any, path: str) -> list[str]:
    """Each field where two config dumps differ: ``norm_placement is 'post'; transformers' ViT needs 'pre'``."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("kind") != theirs.get("kind"):
            return [f"{path}kind is {ours.get('kind')!r}; transformers' ViT needs {theirs.get('kind')!r}"]
        return [line for key in ours for line in _differences(ours[key], theirs.get(key), f"{path}{key}.")]
    field = path[:-1]
    return [] if ours == theirs else [f"{field} is {ours!r}; transformers' ViT needs {theirs!r}{WHY.get(field, '')}"]


def check_expressible(model: ZooModel, hf: dict[str, Any]) -> None:
    """Refuse a model that ``hf`` does not describe: read back by the importer's own translation
    (:func:`vit_config`), ``hf`` must give the model's config, field for field; the ConfigError
    names each field that differs and the value transformers' ViT would need."""
    from transformer_zoo.api import load_config

    ours = model.config.model_dump(mode="json")
    back = load_config(vit_config(hf)).model_dump(mode="json")
    for dump in (ours, back):
        dump.pop("variant")
        dump["encoder"].pop("cross_attention", None)  # an encoder's stack has none to use
        if model.config.dropout == 0:
            dump["ffn"].pop("inner_dropout", None)  # without dropout there is none to place
    problems = [line for key in ours for line in _differences(ours[key], back.get(key), f"{key}.")]
    if problems:
        raise ConfigError(
            f"this model cannot be saved with format='hf' as transformers' {ARCHITECTURE}:\n"
            + "\n".join(f"  {line}" for line in problems)
            + "\nchange these fields, or save with format='zoo' (the default), which keeps every option"
        )


def _hf_name(ours: str) -> str | None:
    """The name ``transformers`` gives one of our weights (the inverse of :func:`.hf.map_weights`,
    the fused projections aside); None if it has none."""
    if match := IN_LAYER.fullmatch(ours):
        inner = TO_LAYER.get(match[2])
        return None if inner is None else f"vit.encoder.layer.{match[1]}.{inner}.{match[3]}"
    prefix, _, param = ours.rpartition(".")
    theirs = TO_OTHER.get(ours) or (f"{TO_OTHER[prefix]}.{param}" if prefix in TO_OTHER else None)
    if theirs is None:
        return None
    return theirs if theirs.startswith("classifier.") else f"vit.{theirs}"


def hf_state_dict(model: ZooModel) -> dict[str, Tensor]:
    """The model's weights under ``transformers``' names, each a CPU copy: the fused input
    projections split into query, key and value, the position table ``(1, 1 + n, D)``."""
    state: dict[str, Tensor] = {}
    unnamed: list[str] = []
    for ours, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu", copy=True)
        if match := FUSED.fullmatch(ours):
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3)):  # (D, D) or (D,) each
                # a storage of its own each, as safetensors asks
                state[f"vit.encoder.layer.{match[1]}.attention.attention.{part}.{match[2]}"] = chunk.clone()
            continue
        name = _hf_name(ours)
        if name is None:
            unnamed.append(ours)
        else:
            state[name] = tensor[None] if ours == "positional.table" else tensor
    if unnamed:
        raise ConfigError(f"weights with no name in transformers' ViT: {', '.join(unnamed)}; save with format='zoo'")
    return state


def save_hf(model: ZooModel, directory: str | Path, **options: Any) -> Path:
    """Write the zoo's ViT as ``transformers``' ``ViTForImageClassification.save_pretrained``
    would, into ``directory`` (created if needed): ``config.json`` and ``model.safetensors``,
    each atomically. It takes no ``options``.

    Raises:
        ValueError: an option was given.
        ConfigError: the model is not a patch encoder (a SAGAN model of the family), or its
            config has options transformers' ViT cannot express (each is named, with the value it
            would need: ``positional: learned``, ``pooling: cls``, ``norm_placement: pre``, ...).
    """
    if model.config is None:
        raise ValueError(
            f"this {type(model).__name__} has no config: it was built by hand; build it with "
            "transformer_zoo.build_model(...) to be able to save it"
        )
    if options:
        raise ValueError(
            f"{', '.join(f'{key}=' for key in options)}: format='hf' takes no options for a ViT; it always "
            f"writes {ARCHITECTURE}"
        )
    if not isinstance(getattr(model, "patches", None), PatchEmbedding):
        raise ConfigError(
            f"format='hf' writes transformers' {ARCHITECTURE}, a patch encoder (vit-tiny and its configs); this "
            f"{model.config.variant!r} model ({type(model).__name__}) is not one: save it with format='zoo' (the default)"
        )
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    hf = hf_config(model.config, dtype)
    check_expressible(model, hf)
    state = hf_state_dict(model)
    return write_folder(directory, state, hf)
