"""Hugging Face ``MarianMTModel`` folders read as models of the transformer family, with no network.

Marian (Junczys-Dowmunt et al. 2018), as ``transformers`` implements it, is the paper's
encoder-decoder: post-norm layers, embeddings scaled by sqrt(d_model) (``scale_embedding``),
fixed sinusoids added to them, positions counted from 0 on both sides, and an output projection
with a bias (``final_logits_bias``). Its sinusoids hold every sine, then every cosine, which is
the zoo's ``positional: {kind: sinusoidal, layout: halves}``.

Marian's fields and tensors, and ours (``{side}`` is encoder or decoder, ``i`` a layer):

- ``d_model``, ``vocab_size``, ``max_position_embeddings``: ``d_model``, ``vocab_size``, ``max_len``;
  ``decoder_vocab_size``: ``tgt_vocab_size`` (None when equal); ``pad_token_id``: ``pad_id``
- ``{encoder,decoder}_attention_heads``, ``{encoder,decoder}_ffn_dim`` (equal on both sides):
  ``n_heads``, ``d_ff``; ``{side}_layers``: ``{side}.layers``
- ``activation_function`` swish or silu, relu, gelu: ``ffn: {kind: mlp, activation: silu | relu | gelu}``;
  ``activation_dropout: 0`` (with ``dropout > 0``): ``ffn.inner_dropout: false``; ``dropout``:
  ``dropout`` (a different ``attention_dropout`` or a layer drop is warned of, and replaced by
  it: only training sees them)
- ``scale_embedding``: ``scale_embeddings``; ``share_encoder_decoder_embeddings`` and
  ``tie_word_embeddings``: ``share_embeddings``; ``tie_word_embeddings``: ``head.tie_weights``
- ``model.shared.weight`` or ``model.{side}.embed_tokens.weight``: ``{src,tgt}_embed.token.weight``;
  ``lm_head.weight``: ``head.proj.weight``; ``final_logits_bias`` ``(1, V)``: ``head.proj.bias`` ``(V,)``
- ``model.{side}.layers.i.``: ``{side}.layers.i.``, with ``self_attn.{q,k,v}_proj`` and
  ``encoder_attn.{q,k,v}_proj`` concatenated into ``self_attn.in_proj`` and ``cross_attn.in_proj``;
  ``self_attn.out_proj``, ``encoder_attn.out_proj``, ``fc1``, ``fc2``: ``self_attn.out_proj``,
  ``cross_attn.out_proj``, ``ffn.linear1``, ``ffn.linear2``; ``self_attn_layer_norm``,
  ``encoder_attn_layer_norm``, ``final_layer_norm``: ``norms.0``, ``norms.1``, ``norms.2``
  (``norms.1`` in the encoder)
- ``model.{side}.embed_positions.weight``, where a file holds it: checked to be Marian's sinusoids

Refused, in one ConfigError naming each field: architectures without ``MarianMTModel``; the
fields of older configs for what transformers' Marian has not (``normalize_before: true``,
``normalize_embedding`` or ``layernorm_embedding: true``, ``add_final_layer_norm: true``,
``static_position_embeddings: false``); an activation other than the four above; unequal sizes
of the two stacks; a shared table over two vocabularies.

Transformers 5 ties embeddings only when ``tie_word_embeddings`` is true: with it false, the
encoder's, the decoder's and the output tables are three, whatever
``share_encoder_decoder_embeddings`` says (``model.shared.weight`` is then unused). The start and
end tokens (``decoder_start_token_id``, ``eos_token_id``) have no place in the zoo's config; pass
them to ``generate``. The other way is :mod:`.hf_save`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_zoo.core import weights
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.model import WEIGHTS_NAME, ZooModel
from transformer_zoo.core.positional import sinusoid_table

DEFAULTS: dict[str, Any] = {  # transformers' MarianConfig defaults, for the fields read here
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "max_position_embeddings": 1024,
    "scale_embedding": False,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "pad_token_id": 58100,
}
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}  # transformers' ACT2FN -> ours
SIZES = (  # no default: a MarianMTModel's config.json gives each
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)
LEGACY = {  # fields of older Marian and BART configs, each with the one value that maps, and what another means
    "normalize_before": (False, "pre-norm layers"),
    "normalize_embedding": (False, "a layer norm on the embeddings"),
    "layernorm_embedding": (False, "a layer norm on the embeddings"),
    "add_final_layer_norm": (False, "a layer norm after each stack's last layer"),
    "static_position_embeddings": (True, "learned positions"),
}

SHARED = "model.shared.weight"
ENCODER_TOKENS = "model.encoder.embed_tokens.weight"
DECODER_TOKENS = "model.decoder.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
LOGITS_BIAS = "final_logits_bias"
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
POSITIONS_ATOL = 1e-6  # a saved table is float32 sinusoids computed in float64, like ours


def is_marian(config: dict[str, Any]) -> bool:
    """A Marian config: ``model_type: marian``, or (older files) no model_type and Marian architectures."""
    if "model_type" in config:
        return config["model_type"] == "marian"
    return any(str(a).startswith("Marian") for a in config.get("architectures") or ())


def _json(value: Any) -> str:
    """``value`` as ``config.json`` spells it (``true``, ``null``, ``"gelu_new"``)."""
    return json.dumps(value)


def _refusals(hf: dict[str, Any]) -> list[str]:
    """What in a Marian config (defaults filled in) the transformer family cannot hold, one line each."""
    problems = []
    architectures = hf.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        problems.append(
            f"architectures is {_json(architectures)}; the transformer family reads MarianMTModel (an encoder, a "
            "decoder and the output layer)"
        )
    for field, (value, meaning) in LEGACY.items():
        if field in hf and hf[field] != value:
            problems.append(
                f"{field} is {_json(hf[field])}: {meaning}, which transformers' MarianMTModel and the transformer "
                f"family do not have; it must be {_json(value)} (or absent)"
            )
    if hf["activation_function"] not in ACTIVATIONS:
        problems.append(
            f"activation_function is {_json(hf['activation_function'])}; the transformer family maps "
            f"{', '.join(map(_json, ACTIVATIONS))}"
        )
    for encoder, decoder in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if encoder in hf and decoder in hf and hf[encoder] != hf[decoder]:
            problems.append(
                f"{encoder} is {_json(hf[encoder])} but {decoder} is {_json(hf[decoder])}; the transformer family has one "
                "value for both stacks: make them equal"
            )
    vocab, decoder_vocab = hf.get("vocab_size"), hf.get("decoder_vocab_size") or hf.get("vocab_size")
    if hf["share_encoder_decoder_embeddings"] and decoder_vocab != vocab:
        problems.append(
            f"share_encoder_decoder_embeddings is true but decoder_vocab_size is {_json(decoder_vocab)} and "
            f"vocab_size {_json(vocab)}; one shared table needs one vocabulary: make them equal"
        )
    return problems


def marian_config(hf: dict[str, Any]) -> dict[str, Any]:
    """Our transformer config for a Marian ``config.json``, or one ConfigError naming every field
    that does not map and the value that would."""
    hf = {**DEFAULTS, **hf}
    problems = [f"{field} is missing; a MarianMTModel config gives it" for field in SIZES if field not in hf]
    problems += _refusals(hf)
    if problems:
        raise ConfigError(
            "this Marian config cannot be read into the transformer family:\n"
            + "\n".join(f"  {line}" for line in problems)
        )
    dropout = hf["dropout"]
    others = {k: hf[k] for k in ("encoder_layerdrop", "decoder_layerdrop") if hf[k]}
    if hf["attention_dropout"] != dropout:
        others["attention_dropout"] = hf["attention_dropout"]
    if hf["activation_dropout"] not in (0, dropout):  # 0: no dropout inside the FFN (inner_dropout false)
        others["activation_dropout"] = hf["activation_dropout"]
    if others:
        warnings.warn(
            f"the transformer family has one dropout rate and no layer drop: dropout={dropout} stands in for "
            f"{', '.join(f'{k}={v}' for k, v in others.items())} (which only training sees)",
            stacklevel=4,
        )
    tied = bool(hf["tie_word_embeddings"])
    decoder_vocab = hf.get("decoder_vocab_size") or hf["vocab_size"]
    return {
        "variant": "transformer",
        "vocab_size": hf["vocab_size"],
        "tgt_vocab_size": None if decoder_vocab == hf["vocab_size"] else decoder_vocab,
        "d_model": hf["d_model"],
        "n_heads": hf["encoder_attention_heads"],
        "d_ff": hf["encoder_ffn_dim"],
        "dropout": dropout,
        "max_len": hf["max_position_embeddings"],
        "pad_id": 0 if hf["pad_token_id"] is None else hf["pad_token_id"],
        "share_embeddings": bool(hf["share_encoder_decoder_embeddings"]) and tied,  # transformers 5 ties both or none
        "scale_embeddings": hf["scale_embedding"],
        "positional": {"kind": "sinusoidal", "layout": "halves"},
        "norm": {"kind": "layernorm", "eps": 1e-5},  # nn.LayerNorm's default, which Marian's layers keep
        "norm_placement": "post",
        "ffn": {
            "kind": "mlp",
            "activation": ACTIVATIONS[hf["activation_function"]],
            # off where Marian turns it off (while dropping elsewhere); with no dropout at all it changes nothing
            "inner_dropout": not (hf["activation_dropout"] == 0 and dropout > 0),
        },
        "encoder": {"layers": hf["encoder_layers"]},
        "decoder": {"layers": hf["decoder_layers"]},
        "head": {"kind": "lm", "tie_weights": tied, "bias": True, "label_smoothing": 0.0},
    }


# ---- tensor names ---------------------------------------------------------------------------
def is_fused(name: str) -> bool:
    """Whether our weight ``name`` is an attention's input projection, the query, key and value
    projections of Marian concatenated."""
    return ".in_proj." in name


def _qkv(block: str) -> tuple[str, ...]:
    return tuple(f"{block}.{part}_proj" for part in ("q", "k", "v"))


def layer_names(side: str, index: int) -> dict[str, tuple[str, ...]]:
    """Each weight of our layer ``index`` of ``side`` (``encoder`` or ``decoder``) and the Marian
    tensors it is made of: one, or the query, key and value projections our ``in_proj`` fuses."""
    modules = {
        "self_attn.in_proj": _qkv("self_attn"),
        "self_attn.out_proj": ("self_attn.out_proj",),
        "norms.0": ("self_attn_layer_norm",),
        "ffn.linear1": ("fc1",),
        "ffn.linear2": ("fc2",),
    }
    if side == "decoder":
        modules |= {
            "cross_attn.in_proj": _qkv("encoder_attn"),
            "cross_attn.out_proj": ("encoder_attn.out_proj",),
            "norms.1": ("encoder_attn_layer_norm",),
            "norms.2": ("final_layer_norm",),
        }
    else:
        modules["norms.1"] = ("final_layer_norm",)
    ours, theirs = f"{side}.layers.{index}.", f"model.{side}.layers.{index}."
    return {
        f"{ours}{module}.{param}": tuple(f"{theirs}{name}.{param}" for name in names)
        for module, names in modules.items()
        for param in ("weight", "bias")
    }


def token_tables(share_embeddings: bool, tie_weights: bool) -> dict[str, tuple[str, ...]]:
    """Each of our token tables (and an untied output projection) and the Marian names that hold
    it, as transformers 5 ties them: the file keeps one of the names, any other it keeps is equal."""
    if share_embeddings:
        return {"src_embed.token.weight": (SHARED, ENCODER_TOKENS, DECODER_TOKENS, LM_HEAD)}
    if tie_weights:
        return {"src_embed.token.weight": (ENCODER_TOKENS,), "tgt_embed.token.weight": (DECODER_TOKENS, LM_HEAD)}
    return {
        "src_embed.token.weight": (ENCODER_TOKENS,),
        "tgt_embed.token.weight": (DECODER_TOKENS,),
        "head.proj.weight": (LM_HEAD,),
    }


def tensor_names(config: Any) -> dict[str, tuple[str, ...]]:
    """Every weight of a transformer-family model of ``config`` and its Marian tensors (see
    :func:`layer_names` and :func:`token_tables`), the output bias aside."""
    names = token_tables(config.share_embeddings, config.head.tie_weights)
    for side in ("encoder", "decoder"):
        for index in range(getattr(config, side).layers):
            names |= layer_names(side, index)
    return names


# ---- placing the tensors --------------------------------------------------------------------
def _same(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors hold the same values; tensors from a header (on the meta device) hold none, and pass."""
    return a.is_meta or b.is_meta or (a.shape == b.shape and torch.equal(a, b))


def _positions_problem(name: str, table: Tensor, d_model: int) -> str | None:
    """Why a saved position table is not Marian's sinusoids (the zoo computes its own), or None."""
    if table.is_meta:
        return None
    if table.dim() != 2 or table.size(1) != d_model:
        return f"{name} has shape {list(table.shape)}; Marian's sinusoids are (max_position_embeddings, {d_model})"
    expected = sinusoid_table(table.size(0), d_model, layout="halves")
    gap = (table.float() - expected).abs().max().item() if table.numel() else 0.0
    if gap > POSITIONS_ATOL:
        return (
            f"{name} differs from Marian's sinusoids by up to {gap:.3g}: learned positions, which the transformer "
            "family does not read (it computes its sinusoids)"
        )
    return None


def place(config: Any, ours: dict[str, Tensor], checkpoint: dict[str, Tensor], source: Path) -> dict[str, Tensor]:
    """Our weights (by the names of ``ours``, the model's state dict) from a Marian ``checkpoint``
    (tensors, or from a header the ``meta`` tensors of their shapes): a WeightsError naming each
    missing tensor, tensor with no place, shape or dtype that does not fit, tied copy that
    differs and position table that is not Marian's sinusoids."""
    mapped: dict[str, Tensor] = {}
    used = set()
    problems = []
    for name, parts in tensor_names(config).items():
        if is_fused(name):
            used.update(parts)
            problems += [f"missing from the checkpoint: {p}" for p in parts if p not in checkpoint]
            shapes = {p: list(checkpoint[p].shape) for p in parts if p in checkpoint}
            if len(shapes) == 3 and len(set(map(tuple, shapes.values()))) > 1:
                problems.append(f"shape mismatch: {', '.join(f'{p} {s}' for p, s in shapes.items())} must be equal")
            elif len(shapes) == 3:
                mapped[name] = torch.cat([checkpoint[p] for p in parts])  # (3D, D) or (3D,)
            continue
        present = [p for p in parts if p in checkpoint]
        if not present:
            problems.append(f"missing from the checkpoint: {' or '.join(parts)}")
            continue
        mapped[name] = checkpoint[present[0]]
        used.update(present)
        problems += [
            f"{p} differs from {present[0]}, but the config ties them (tie_word_embeddings, "
            "share_encoder_decoder_embeddings)"
            for p in present[1:]
            if not _same(checkpoint[p], mapped[name])
        ]
    if LOGITS_BIAS in checkpoint:
        mapped["head.proj.bias"] = checkpoint[LOGITS_BIAS].reshape(-1)  # (1, V) -> (V,)
        used.add(LOGITS_BIAS)
    for name in POSITIONS:
        if name in checkpoint:
            used.add(name)
            problems += filter(None, [_positions_problem(name, checkpoint[name], config.d_model)])
    if SHARED in checkpoint and not config.share_embeddings:
        used.add(SHARED)  # transformers 5 saves the shared table even where nothing reads it (untied embeddings)
    problems += [f"not in the model the config describes: {name}" for name in checkpoint if name not in used]
    problems += [
        f"shape mismatch {name}: checkpoint {list(tensor.shape)}, model {list(ours[name].shape)}"
        for name, tensor in mapped.items()
        if tensor.shape != ours[name].shape
    ]
    problems += [
        f"dtype mismatch {problem}"
        for name, tensor in checkpoint.items()
        if (problem := weights.dtype_problem(name, tensor.dtype, torch.float32))
    ]
    weights.raise_if_any(source, problems, "holds weights that do not fit its config.json")
    return mapped


def load_marian(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """A transformer-family model from a Hugging Face ``MarianMTModel`` folder, every weight placed.

    The config is translated first, then the tensors' shapes and dtypes (the safetensors header)
    are checked against the model it describes, built on the ``meta`` device, so that a config
    that does not fit its weights is refused before the model is allocated.

    Raises:
        ConfigError: the config has fields the transformer family cannot hold (each named, with the
            value that would map).
        WeightsError: (a ConfigError) the weights file is missing or damaged, or its tensors do not
            fit the config (each named).
    """
    from transformer_zoo.api import build_model, load_config

    path = weights.inside(directory, WEIGHTS_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} not found; the transformer family reads a Marian folder's weights from {WEIGHTS_NAME} "
            "(save it with transformers' save_pretrained, whose default is safetensors)"
        )
    header = {name: info.on_meta() for name, info in weights.read_header(path).items()}
    config = load_config(marian_config(hf_config))
    skeleton = weights.build_on_meta(config.build)
    if skeleton is not None:
        place(config, skeleton.state_dict(), header, path)
    model = build_model(config)
    mapped = place(config, model.state_dict(), weights.read_tensors(path), path)
    if "head.proj.bias" not in mapped:  # transformers starts a missing final_logits_bias at zero
        mapped["head.proj.bias"] = torch.zeros(config.output_vocab_size)
    model.load_state_dict(mapped, strict=False)  # tied tables are given once
    return model.eval()
