"""Marian in Hugging Face ``transformers``: the transformer family's map for :mod:`transformer_zoo.core.hf`.

Marian (Junczys-Dowmunt et al. 2018), as ``transformers``' ``MarianMTModel`` implements it, is the
paper's encoder-decoder: post-norm layers, embeddings scaled by sqrt(d_model)
(``scale_embedding``), fixed sinusoids added to them, positions counted from 0 on both sides, and
an output projection with a bias (``final_logits_bias``). Its sinusoids hold every sine, then
every cosine, which is the zoo's ``positional: {kind: sinusoidal, layout: halves}``; a file's
``embed_positions.weight`` is checked to be them, not read.

Refused, in one ConfigError naming each field: architectures without ``MarianMTModel``; the
fields of older configs for what transformers' Marian has not (``normalize_before: true``,
``normalize_embedding`` or ``layernorm_embedding: true``, ``add_final_layer_norm: true``,
``static_position_embeddings: false``); an activation other than swish, silu, relu and gelu;
unequal sizes of the two stacks; a shared table over two vocabularies.

Transformers 5 ties embeddings only when ``tie_word_embeddings`` is true: with it false, the
encoder's, the decoder's and the output tables are three, whatever
``share_encoder_decoder_embeddings`` says (``model.shared.weight`` is then unused). The start and
end tokens (``decoder_start_token_id``, ``eos_token_id``) have no place in the zoo's config: they
are options of ``save_pretrained(format="hf")``, and are given to ``generate``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer_zoo.api import build_checked, load_config
from transformer_zoo.core.embedding import BOS, EOS, sinusoid_table
from transformer_zoo.core.hf import ConfigField, HFMap, Weight, read_hf_folder, write_hf_folder
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.weights import Importer

DEFAULTS: dict[str, Any] = {  # transformers' MarianConfig defaults, for the fields the functions below read
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
LEGACY = {  # fields of older Marian and BART configs, each with the one value that maps, and what another means
    "normalize_before": (False, "pre-norm layers"),
    "normalize_embedding": (False, "a layer norm on the embeddings"),
    "layernorm_embedding": (False, "a layer norm on the embeddings"),
    "add_final_layer_norm": (False, "a layer norm after each stack's last layer"),
    "static_position_embeddings": (True, "learned positions"),
}
POSITIONS_ATOL = 1e-6  # a saved table is float32 sinusoids computed in float64, like ours
ENCODER, DECODER = "encoder.layers.{i}.", "decoder.layers.{i}."


def _marian_refusals(hf: dict[str, Any]) -> list[str]:
    hf = {**DEFAULTS, **hf}
    problems = []
    architectures = hf.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        problems.append(
            f"architectures is {json.dumps(architectures)}; the transformer family reads MarianMTModel (an encoder, a "
            "decoder and the output layer)"
        )
    for field, (value, meaning) in LEGACY.items():
        if field in hf and hf[field] != value:
            problems.append(
                f"{field} is {json.dumps(hf[field])}: {meaning}, which transformers' MarianMTModel and the transformer "
                f"family do not have; it must be {json.dumps(value)} (or absent)"
            )
    for encoder, decoder in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if encoder in hf and decoder in hf and hf[encoder] != hf[decoder]:
            problems.append(
                f"{encoder} is {json.dumps(hf[encoder])} but {decoder} is {json.dumps(hf[decoder])}; the transformer "
                "family has one value for both stacks: make them equal"
            )
    vocab, decoder_vocab = hf.get("vocab_size"), hf.get("decoder_vocab_size") or hf.get("vocab_size")
    if hf["share_encoder_decoder_embeddings"] and decoder_vocab != vocab:
        problems.append(
            f"share_encoder_decoder_embeddings is true but decoder_vocab_size is {json.dumps(decoder_vocab)} and "
            f"vocab_size {json.dumps(vocab)}; one shared table needs one vocabulary: make them equal"
        )
    return problems


def _marian_fields(hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    hf = {**DEFAULTS, **hf}
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
            stacklevel=5,
        )
    decoder_vocab = hf.get("decoder_vocab_size") or hf["vocab_size"]
    return {
        "tgt_vocab_size": None if decoder_vocab == hf["vocab_size"] else decoder_vocab,
        # transformers 5 shares the tables with the output layer tied, or none
        "share_embeddings": bool(hf["share_encoder_decoder_embeddings"] and hf["tie_word_embeddings"]),
        "positional": {"kind": "sinusoidal", "layout": "halves"},
        "norm": {"kind": "layernorm", "eps": 1e-5},  # nn.LayerNorm's default, which Marian's layers keep
        "norm_placement": "post",
        # off where Marian turns it off (while dropping elsewhere); with no dropout at all it changes nothing
        "ffn": {"kind": "mlp", "inner_dropout": not (hf["activation_dropout"] == 0 and dropout > 0)},
        "head": {"kind": "lm", "bias": True, "label_smoothing": 0.0},
    }


def _marian_json(
    model: ZooModel, *, decoder_start_token_id: int = BOS, eos_token_id: int | None = EOS
) -> dict[str, Any]:
    config = model.config
    return {
        "decoder_vocab_size": config.output_vocab_size,
        "attention_dropout": config.dropout,  # the zoo has one dropout rate
        "activation_dropout": config.dropout if getattr(config.ffn, "inner_dropout", False) else 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "decoder_start_token_id": decoder_start_token_id,
        "eos_token_id": eos_token_id,
        "forced_eos_token_id": None,  # MarianConfig's default (0) would force token 0 at the length limit
        "bos_token_id": None,
        "is_encoder_decoder": True,
    }


def _marian_save_problems(model: ZooModel, hf: dict[str, Any]) -> list[str]:
    config = model.config
    if config.encoder is None or config.decoder is None:
        return [f"the model is {model.architecture}; a MarianMTModel has an encoder and a decoder"]
    if config.share_embeddings and not getattr(config.head, "tie_weights", True):
        return [
            (
                "share_embeddings is true but head.tie_weights false; transformers 5 shares the encoder's and the "
                "decoder's tables only with the output layer tied to them: set head.tie_weights true, or "
                "share_embeddings false (two tables)"
            )
        ]
    return []


def _marian_comparable(dump: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    # Marian always has final_logits_bias (an output layer without a bias saves zeros there), and no
    # label smoothing; one vocabulary may be spelt out or left null; with no dropout, none inside the FFN;
    # shared tables read back unshared only with an untied head, which _marian_save_problems names
    dump = {k: v for k, v in dump.items() if k != "share_embeddings"}
    dump["tgt_vocab_size"] = dump["tgt_vocab_size"] or dump["vocab_size"]
    dump["head"] = {k: v for k, v in dump["head"].items() if k not in ("bias", "label_smoothing")}
    if dump["dropout"] == 0:
        dump["ffn"] = {k: v for k, v in dump["ffn"].items() if k != "inner_dropout"}
    return dump


def _positions_problem(name: str, table: Tensor, config: Any) -> str | None:
    """Why a saved position table is not Marian's sinusoids (the zoo computes its own), or None."""
    if table.is_meta:
        return None
    if table.dim() != 2 or table.size(1) != config.d_model:
        return (
            f"{name} has shape {list(table.shape)}; Marian's sinusoids are (max_position_embeddings, {config.d_model})"
        )
    expected = sinusoid_table(table.size(0), config.d_model, layout="halves")
    gap = (table.float() - expected).abs().max().item() if table.numel() else 0.0
    if gap > POSITIONS_ATOL:
        return (
            f"{name} differs from Marian's sinusoids by up to {gap:.3g}: learned positions, which the transformer "
            "family does not read (it computes its sinusoids)"
        )
    return None


def _qkv(layer: str, attention: str) -> tuple[str, ...]:
    return tuple(f"{layer}{attention}.{part}_proj" for part in "qkv")


MARIAN = HFMap(
    model_type="marian",
    title="Marian",
    family="transformer",
    variant="transformer",
    architectures=("MarianMTModel",),
    prefix="model.",
    ignored=("shared.weight",),  # transformers 5 saves the shared table even where nothing reads it (untied)
    checked={
        "encoder.embed_positions.weight": _positions_problem,
        "decoder.embed_positions.weight": _positions_problem,
    },
    weights=(
        Weight("src_embed.token.weight", "shared.weight", when="share_embeddings"),
        Weight("src_embed.token.weight", "encoder.embed_tokens.weight"),
        Weight("tgt_embed.token.weight", "decoder.embed_tokens.weight"),
        Weight("head.proj.weight", "lm_head.weight"),
        Weight("head.proj.bias", "final_logits_bias", unsqueezed=True, zeros=True),
        Weight(ENCODER + "self_attn.in_proj", fused=_qkv(ENCODER, "self_attn")),
        Weight(ENCODER + "self_attn.out_proj", ENCODER + "self_attn.out_proj"),
        Weight(ENCODER + "norms.0", ENCODER + "self_attn_layer_norm"),
        Weight(ENCODER + "ffn.linear1", ENCODER + "fc1"),
        Weight(ENCODER + "ffn.linear2", ENCODER + "fc2"),
        Weight(ENCODER + "norms.1", ENCODER + "final_layer_norm"),
        Weight(DECODER + "self_attn.in_proj", fused=_qkv(DECODER, "self_attn")),
        Weight(DECODER + "self_attn.out_proj", DECODER + "self_attn.out_proj"),
        Weight(DECODER + "norms.0", DECODER + "self_attn_layer_norm"),
        Weight(DECODER + "cross_attn.in_proj", fused=_qkv(DECODER, "encoder_attn")),
        Weight(DECODER + "cross_attn.out_proj", DECODER + "encoder_attn.out_proj"),
        Weight(DECODER + "norms.1", DECODER + "encoder_attn_layer_norm"),
        Weight(DECODER + "ffn.linear1", DECODER + "fc1"),
        Weight(DECODER + "ffn.linear2", DECODER + "fc2"),
        Weight(DECODER + "norms.2", DECODER + "final_layer_norm"),
    ),
    fields=(
        ConfigField("vocab_size", "vocab_size"),
        ConfigField("d_model", "d_model"),
        ConfigField("encoder_layers", "encoder.layers"),
        ConfigField("decoder_layers", "decoder.layers"),
        ConfigField("encoder_attention_heads", "n_heads"),
        ConfigField("decoder_attention_heads", "n_heads"),
        ConfigField("encoder_ffn_dim", "d_ff"),
        ConfigField("decoder_ffn_dim", "d_ff"),
        ConfigField("max_position_embeddings", "max_len", 1024),
        ConfigField("pad_token_id", "pad_id", 58100),
        ConfigField("dropout", "dropout", 0.1),
        ConfigField("scale_embedding", "scale_embeddings", False),
        ConfigField("tie_word_embeddings", "head.tie_weights", True),
        ConfigField(
            "activation_function",
            "ffn.activation",
            "gelu",
            {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"},
        ),
    ),
    refusals=_marian_refusals,
    to_ours=_marian_fields,
    to_theirs=_marian_json,
    save_problems=_marian_save_problems,
    comparable=_marian_comparable,
)
is_marian = MARIAN.matches


def load_marian(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
    """A transformer-family model from a transformers ``MarianMTModel`` folder
    (:func:`~transformer_zoo.core.hf.read_hf_folder`)."""
    return read_hf_folder(MARIAN, directory, hf_config, validate=load_config, build=build_checked)


def save_marian(
    model: ZooModel, directory: str | Path, *, decoder_start_token_id: int = BOS, eos_token_id: int | None = EOS
) -> Path:
    """Write a transformer-family model as transformers' ``save_pretrained`` writes a
    ``MarianMTModel`` (:func:`~transformer_zoo.core.hf.write_hf_folder`).

    Args:
        decoder_start_token_id: the token ``transformers``' ``generate`` starts the target with
            (the zoo's tasks start with BOS, 1; Marian's own models with the padding id).
        eos_token_id: the token that ends a generated sequence (the zoo's tasks: EOS, 2), or None.
    """
    return write_hf_folder(
        MARIAN,
        model,
        directory,
        validate=load_config,
        decoder_start_token_id=decoder_start_token_id,
        eos_token_id=eos_token_id,
    )


MARIAN_IMPORTER = Importer(
    name="hf-marian",
    description="a Hugging Face transformers MarianMTModel folder (config.json with model_type marian)",
    matches=is_marian,
    load=load_marian,
    family="transformer",
    format="hf",
    save=save_marian,
)
