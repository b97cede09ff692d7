"""Saving a transformer-family model as a Hugging Face ``MarianMTModel`` folder.

:func:`save_marian` writes ``config.json`` (a MarianConfig) and ``model.safetensors`` under
``transformers``' names (:mod:`.hf`'s table, the other way), after checking that reading the
config back through :func:`.hf.marian_config` gives the model's config, field for field: what
Marian cannot express (pre-norm, learned or rotary positions, the interleaved sinusoids, RMS
norm, gated FFNs, ...) is refused, each field named with the value Marian needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.inputs import BOS, EOS
from transformer_zoo.core.model import ZooModel, write_folder

from .hf import LOGITS_BIAS, is_fused, marian_config, tensor_names

TO_MARIAN = {"silu": "swish", "relu": "relu", "gelu": "gelu"}  # our activations -> transformers' names
NOT_COMPARED = {
    "variant",
    "head.bias",  # Marian always has final_logits_bias: an output layer without a bias saves zeros there
    "head.label_smoothing",  # a training setting that MarianConfig has no field for
}


def marian_hf_config(
    config: Any, dtype: torch.dtype, *, decoder_start_token_id: int, eos_token_id: int | None
) -> dict[str, Any]:
    """A ``transformers`` MarianConfig (as ``config.json`` holds it) for our config; what it
    cannot express is found by :func:`check_expressible`."""
    ffn_activation = getattr(config.ffn, "activation", "relu")
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.output_vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.encoder.layers if config.encoder else 0,
        "decoder_layers": config.decoder.layers if config.decoder else 0,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": TO_MARIAN.get(ffn_activation, ffn_activation),
        "dropout": config.dropout,
        "attention_dropout": config.dropout,  # the zoo has one dropout rate
        "activation_dropout": config.dropout if getattr(config.ffn, "inner_dropout", False) else 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "max_position_embeddings": config.max_len,
        "scale_embedding": config.scale_embeddings,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": getattr(config.head, "tie_weights", False),
        "pad_token_id": config.pad_id,
        "decoder_start_token_id": decoder_start_token_id,
        "eos_token_id": eos_token_id,
        "forced_eos_token_id": None,  # MarianConfig's default (0) would force token 0 at the length limit
        "bos_token_id": None,
        "is_encoder_decoder": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _comparable(dump: dict[str, Any]) -> dict[str, Any]:
    """A config dump as both sides of :func:`check_expressible` can hold it: the target vocabulary
    spelled out, and the inner dropout left as read where there is no dropout at all (it changes nothing)."""
    dump = {**dump, "tgt_vocab_size": dump["tgt_vocab_size"] or dump["vocab_size"]}
    if dump["dropout"] == 0 and isinstance(dump.get("ffn"), dict) and "inner_dropout" in dump["ffn"]:
        dump["ffn"] = {**dump["ffn"], "inner_dropout": True}
    return dump


def _differences(ours: Any, theirs: Any, path: str) -> list[str]:
    """Each field where two config dumps differ: ``norm_placement is 'pre'; Marian needs 'post'``."""
    if path[:-1] in NOT_COMPARED:
        return []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("kind") != theirs.get("kind"):
            return [f"{path}kind is {ours.get('kind')!r}; transformers' Marian needs {theirs.get('kind')!r}"]
        return [line for key in ours for line in _differences(ours[key], theirs.get(key), f"{path}{key}.")]
    return [] if ours == theirs else [f"{path[:-1]} is {ours!r}; transformers' Marian needs {theirs!r}"]


def check_expressible(model: ZooModel, hf: dict[str, Any]) -> None:
    """Refuse a model that ``hf`` does not describe: read back by the importer's own translation
    (:func:`marian_config`), ``hf`` must give the model's config, field for field; one
    ConfigError names each field that differs and the value transformers' Marian would need."""
    from transformer_zoo.api import load_config

    config = model.config
    problems = []
    if config.encoder is None or config.decoder is None:
        problems.append(f"the model is {model.architecture}; a MarianMTModel has an encoder and a decoder")
    elif config.share_embeddings and not getattr(config.head, "tie_weights", True):
        problems.append(
            "share_embeddings is true but head.tie_weights false; transformers 5 shares the encoder's and the "
            "decoder's tables only with the output layer tied to them: set head.tie_weights true, or "
            "share_embeddings false (two tables)"
        )
    else:
        ours = _comparable(config.model_dump(mode="json"))
        back = _comparable(load_config(marian_config(hf)).model_dump(mode="json"))
        problems += [line for key in ours for line in _differences(ours[key], back.get(key), f"{key}.")]
    if problems:
        raise ConfigError(
            f"this {config.variant} model cannot be saved with format='hf' as transformers' MarianMTModel:\n"
            + "\n".join(f"  {line}" for line in problems)
            + "\nchange these fields, or save with format='zoo' (the default), which keeps every option"
        )


def marian_state_dict(model: ZooModel) -> dict[str, Tensor]:
    """The model's weights under ``transformers``' names, each a CPU copy: the fused input
    projections split into query, key and value, each tied table saved once (as transformers 5
    saves it), and the output bias as ``final_logits_bias`` ``(1, V)`` (zeros for a head without)."""
    ours = model.state_dict()
    state: dict[str, Tensor] = {}
    for name, parts in tensor_names(model.config).items():
        tensors = ours[name].chunk(3) if is_fused(name) else [ours[name]]  # (3D, D) -> 3 x (D, D)
        for part, tensor in zip(parts, tensors):  # a tied table: under its first name only
            state[part] = tensor.detach().to("cpu", copy=True)
    bias = model.head.proj.bias
    logits_bias = torch.zeros(model.config.output_vocab_size) if bias is None else bias.detach()
    state[LOGITS_BIAS] = logits_bias.to("cpu", copy=True).reshape(1, -1)
    return state


def save_marian(
    model: ZooModel,
    directory: str | Path,
    *,
    decoder_start_token_id: int = BOS,
    eos_token_id: int | None = EOS,
) -> Path:
    """Write a transformer-family model as ``transformers``' ``save_pretrained`` writes a
    ``MarianMTModel``, into ``directory`` (created if needed): ``config.json`` and
    ``model.safetensors``, each atomically.

    Args:
        decoder_start_token_id: the token ``transformers``' ``generate`` starts the target with
            (the zoo's tasks start with BOS, 1; Marian's own models with the padding id).
        eos_token_id: the token that ends a generated sequence (the zoo's tasks: EOS, 2), or None.

    Raises:
        ConfigError: the config has options transformers' Marian cannot express (each is named,
            with the value it would need).
    """
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    hf = marian_hf_config(model.config, dtype, decoder_start_token_id=decoder_start_token_id, eos_token_id=eos_token_id)
    check_expressible(model, hf)
    state = marian_state_dict(model)
    return write_folder(directory, state, hf)
