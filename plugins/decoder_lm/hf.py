"""The decoder-only LMs in Hugging Face ``transformers``: the decoder-lm family's maps for
:mod:`transformer_zoo.core.hf`, one for each of ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
``Qwen3ForCausalLM``, ``Gemma2ForCausalLM`` and ``Olmo2ForCausalLM`` (and their base models).

Llama, Qwen 3, Gemma 2 and OLMo 2 share one layout (``model.layers.{i}.self_attn.q_proj``, ...)
and one reading of their config: a :class:`Design` gives each what is its own (where its norms
go and their names, its QK-norm, Gemma's (1 + w) norms and scaled embeddings, transformers'
defaults for the fields its config class has), and :func:`llama_like` makes its map. GPT-2
(``Conv1D`` projections held transposed, learned positions, LayerNorm) has its own.

What maps, both ways: the sizes, ``num_key_value_heads``, ``head_dim``, ``attention_bias``,
``mlp_bias`` (Llama), the norms' epsilon, the activation, ``tie_word_embeddings``,
``max_position_embeddings``, ``initializer_range``, ``pad_token_id``; the rotary base and its
stretch (``rope_parameters``, or an older config's ``rope_theta`` and ``rope_scaling``:
``rope_type`` default, linear, dynamic, yarn or llama3); Gemma 2's ``query_pre_attn_scalar``
(``scale = q ** -0.5``), ``attn_logit_softcapping``, ``final_logit_softcapping`` and its layers,
sliding (``sliding_window`` counts the query, the zoo's ``window`` the keys before it, so
``window = sliding_window - 1``) or full, as ``layer_types`` gives them (the shortest list of
kinds the stack takes in turn); GPT-2's ``n_inner`` (null: ``4 * n_embd``),
``activation_function``, its three equal dropout rates, and ``scale_attn_weights: false``
(``scale: 1.0``).

Refused, in one ConfigError naming each field: a ``rope_type`` or ``layer_types`` entry the zoo
has not, ``partial_rotary_factor`` other than 1 (these four turn the whole head), rotary
parameters that differ by layer type, Qwen 3's ``use_sliding_window``, Gemma 2's
``use_bidirectional_attention``, ``attention_dropout`` (dropout on the attention weights alone),
GPT-2's ``scale_attn_by_inverse_layer_idx``, ``add_cross_attention`` and dropout rates that
differ, and an architecture other than the LM or its base model.

``save_pretrained(folder, format="hf")`` writes the first of the five whose design the model's
config matches (:func:`~transformer_zoo.core.hf.closest_map`), or names each field that keeps
it from the nearest. The start and end tokens have no place in the zoo's config: they are
options of the save (``bos_token_id``, ``eos_token_id``), null by default.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_zoo.api import build_checked, load_config
from transformer_zoo.core.hf import (
    ConfigField,
    HFMap,
    Weight,
    closest_map,
    read_hf_folder,
    shortest_cycle,
    write_hf_folder,
)
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.weights import Importer

ACTIVATIONS = {  # transformers' names -> ours; an activation of ours is written as the first that names it
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_new": "gelu-tanh",
    "gelu": "gelu",
    "relu": "relu",
}
ROPE_TYPES: dict[str, dict[str, str]] = {  # rope_type -> the rope_parameters its stretch reads, and ours
    "default": {},
    "linear": {"factor": "factor"},
    "dynamic": {"factor": "factor"},  # past max_position_embeddings, as our original_max_len null says
    "yarn": {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_len",
        "beta_fast": "beta_fast",
        "beta_slow": "beta_slow",
        "attention_factor": "attention_factor",
        "mscale": "mscale",
        "mscale_all_dim": "mscale_all_dim",
        "truncate": "truncate",
    },
    "llama3": {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_len",
        "low_freq_factor": "low_freq_factor",
        "high_freq_factor": "high_freq_factor",
    },
}
THETA = 10000.0  # transformers' default_theta
LAYER_TYPES = {"full_attention": "sdpa", "sliding_attention": "sliding-window"}


def _json(value: Any) -> str:
    return json.dumps(value)


# ---- what every map shares -----------------------------------------------------------------
def _architecture_problems(hf: dict[str, Any], title: str, classes: tuple[str, ...]) -> list[str]:
    architectures = hf.get("architectures") or [classes[0]]
    if not any(a in classes for a in architectures):
        return [
            (
                f"architectures is {_json(architectures)}; the decoder-lm family reads {' or '.join(classes)} "
                f"(transformers' {title} language model, or its base model)"
            )
        ]
    return []


def _token_fields(model: ZooModel, bos_token_id: int | None, eos_token_id: int | None) -> dict[str, Any]:
    return {"pad_token_id": model.config.pad_id, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id}


def _attention_at(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """The self-attention options of each layer of a config dump."""
    decoder = dump["decoder"]
    kinds = decoder["attention"] if isinstance(decoder["attention"], list) else [decoder["attention"]]
    return [kinds[i % len(kinds)] for i in range(decoder["layers"])]


def _comparable(dump: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """A config as a read-back can give it: defaults spelt out (head width, key/value heads, the
    scale, a stretch's trained length), the attention layer by layer, and what transformers has
    no place for left out (label smoothing, a sparse kind's choice of backend, dropout inside a
    feed-forward network when nothing drops)."""
    dump = json.loads(json.dumps(dump))
    d_head = dump["head_dim"] = dump["head_dim"] or dump["d_model"] // dump["n_heads"]
    if dump["final_norm"] is None:
        dump["final_norm"] = dump["norm_placement"] != "post"
    dump["head"].pop("label_smoothing", None)
    if dump["dropout"] == 0:
        dump["ffn"].pop("inner_dropout", None)
    if dump["decoder"] is not None:
        attention = _attention_at(dump)
        for kind in attention:
            kind.pop("backend", None)
            kind["n_kv_heads"] = kind.get("n_kv_heads") or dump["n_heads"]
            kind["scale"] = kind.get("scale") or d_head**-0.5
        dump["decoder"]["attention"] = attention
    scaling = dump["positional"].get("scaling")
    if scaling and "original_max_len" in scaling:
        scaling["original_max_len"] = scaling["original_max_len"] or dump["max_len"]
    return dump


# ---- GPT-2 ---------------------------------------------------------------------------------
GPT2_DEFAULTS: dict[str, Any] = {  # GPT2Config's, for the fields the functions below read
    "n_inner": None,
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}
GPT2_CLASSES = ("GPT2LMHeadModel", "GPT2Model")
GPT2_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")


def _gpt2_refusals(hf: dict[str, Any]) -> list[str]:
    hf = {**GPT2_DEFAULTS, **hf}
    problems = _architecture_problems(hf, "GPT-2", GPT2_CLASSES)
    if hf["scale_attn_by_inverse_layer_idx"]:
        problems.append(
            "scale_attn_by_inverse_layer_idx is true: layer i's scores divided by i + 1, which the decoder-lm family "
            "does not read; it must be false"
        )
    if hf["add_cross_attention"]:
        problems.append("add_cross_attention is true: attention to an encoder, which a decoder-only model has not")
    rates = {name: hf[name] for name in GPT2_DROPOUTS}
    if len(set(rates.values())) > 1:
        given = ", ".join(f"{name} {_json(rate)}" for name, rate in rates.items())
        problems.append(f"{given} differ; the decoder-lm family has one dropout rate for all three: make them equal")
    return problems


def _gpt2_fields(hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    hf = {**GPT2_DEFAULTS, **hf}
    return {
        "d_ff": hf["n_inner"] or 4 * hf["n_embd"],
        "dropout": hf["resid_pdrop"],
        "head_dim": None,
        "pad_id": hf.get("pad_token_id") or 0,
        "scale_embeddings": False,
        "norm_placement": "pre",
        "final_norm": None,
        "norm": {"kind": "layernorm"},
        "ffn": {"kind": "mlp", "inner_dropout": False, "bias": True},
        "positional": {"kind": "learned", "random_offset": 0},
        "decoder": {"attention": {"kind": "sdpa", "bias": True, "scale": None if hf["scale_attn_weights"] else 1.0}},
        "head": {"kind": "lm", "bias": False, "softcap": None},
    }


def _gpt2_json(model: ZooModel, *, bos_token_id: int | None = None, eos_token_id: int | None = None) -> dict[str, Any]:
    config = model.config
    scale = getattr(config.decoder.attention_at(0), "scale", None)
    return {
        "n_inner": config.d_ff,
        **dict.fromkeys(GPT2_DROPOUTS, config.dropout),
        "scale_attn_weights": scale != 1.0,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        **_token_fields(model, bos_token_id, eos_token_id),
    }


H = "h.{i}."
GPT2 = HFMap(
    model_type="gpt2",
    title="GPT-2",
    family="decoder-lm",
    variant="gpt2",
    architectures=GPT2_CLASSES,
    prefix="transformer.",
    base=GPT2_CLASSES[1:],
    ignored=(H + "attn.bias", H + "attn.masked_bias"),  # older files' causal masks
    weights=(
        Weight("tgt_embed.token", "wte"),
        Weight("tgt_embed.positional.embedding", "wpe"),
        Weight("decoder.layers.{i}.norms.0", H + "ln_1"),
        Weight("decoder.layers.{i}.self_attn.in_proj", H + "attn.c_attn", transposed=True),
        Weight("decoder.layers.{i}.self_attn.out_proj", H + "attn.c_proj", transposed=True),
        Weight("decoder.layers.{i}.norms.1", H + "ln_2"),
        Weight("decoder.layers.{i}.ffn.linear1", H + "mlp.c_fc", transposed=True),
        Weight("decoder.layers.{i}.ffn.linear2", H + "mlp.c_proj", transposed=True),
        Weight("decoder.final_norm", "ln_f"),
        Weight("head.proj.weight", "lm_head.weight"),
    ),
    fields=(
        ConfigField("vocab_size", "vocab_size"),
        ConfigField("n_embd", "d_model"),
        ConfigField("n_head", "n_heads"),
        ConfigField("n_layer", "decoder.layers"),
        ConfigField("n_positions", "max_len", 1024),
        ConfigField("layer_norm_epsilon", "norm.eps", 1e-5),
        # GPT-2's own gelu_new first, so that it is what a gelu-tanh model is written with
        ConfigField("activation_function", "ffn.activation", "gelu_new", {"gelu_new": "gelu-tanh", **ACTIVATIONS}),
        ConfigField("tie_word_embeddings", "head.tie_weights", True),
        ConfigField("initializer_range", "init_std", 0.02),
    ),
    refusals=_gpt2_refusals,
    to_ours=_gpt2_fields,
    to_theirs=_gpt2_json,
    comparable=_comparable,
)


# ---- Llama, Qwen 3, Gemma 2, OLMo 2 --------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """What one of the models of Llama's layout has of its own.

    Attributes:
        title, model_type, variant: its name in messages, ``config.json``'s ``model_type``, and
            the variant a folder is read as.
        classes: the language model's transformers class, then its base model's.
        norms: our norm of a layer (``norms.0``, ``post_norms.1``) and transformers' name for it.
        placement: where those norms go (our ``norm_placement``).
        defaults: transformers' defaults for the fields its config class has (a field it has
            not, such as Gemma 2's ``mlp_bias``, is neither read nor written).
        qk_norm: its QK-norm (our ``qk_norm``), or None.
        unit_offset: its norms scale by 1 + w (Gemma).
        scale_embeddings: its embeddings are multiplied by sqrt(d_model) (Gemma).
        activation: the field naming its activation (``hidden_act``; Gemma 2's ``hidden_activation``).
        sliding: its layers may attend within a window (Gemma 2: ``sliding_window``, ``layer_types``).
        refusals: ``(config.json) -> [problem, ...]``: what else it cannot hold, one line a field.
    """

    title: str
    model_type: str
    variant: str
    classes: tuple[str, str]
    norms: tuple[tuple[str, str], ...]
    placement: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    qk_norm: str | None = None
    unit_offset: bool = False
    scale_embeddings: bool = False
    activation: str = "hidden_act"
    sliding: bool = False
    refusals: Callable[[dict[str, Any]], list[str]] = field(default=lambda hf: [])


def _read(design: Design, hf: dict[str, Any], name: str, fixed: Any = None) -> Any:
    """``config.json``'s ``name`` (null too: no soft-capping, no window), or transformers' default
    where it leaves the field out; ``fixed`` for a field the model's config class has not (its
    modules never read one)."""
    if name not in design.defaults:
        return fixed
    return hf[name] if name in hf else design.defaults[name]


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers' rotary parameters as its config standardises them: ``rope_parameters`` (or
    an older config's ``rope_scaling``), with ``rope_theta`` and ``partial_rotary_factor`` from
    beside them, and ``rope_type`` (older: ``type``), default ``default``."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    nested = [value for value in rope.values() if isinstance(value, dict)]  # by layer type (Gemma 3's)
    if nested:
        rope = dict(nested[0]) if all(value == nested[0] for value in nested) else {"by_layer_type": rope}
    rope.setdefault("rope_theta", hf.get("rope_theta") or THETA)
    if hf.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    return rope


def _rope_problems(design: Design, hf: dict[str, Any]) -> list[str]:
    rope = _rope(hf)
    if "by_layer_type" in rope:
        return [
            (
                f"rope_parameters differ by layer type ({', '.join(rope['by_layer_type'])}); the decoder-lm family has "
                "one rotary scheme for every layer"
            )
        ]
    problems = []
    if rope["rope_type"] not in ROPE_TYPES:
        problems.append(
            f"rope_parameters.rope_type is {_json(rope['rope_type'])}; the decoder-lm family maps "
            f"{', '.join(ROPE_TYPES)}"
        )
    fraction = rope.get("partial_rotary_factor", 1.0)
    if fraction != 1.0:
        problems.append(
            f"partial_rotary_factor is {_json(fraction)}; transformers' {design.title} turns the whole of each head "
            "(its default rotary ignores the factor, a stretched one fails on it): it must be 1.0 (or absent)"
        )
    return problems


def _positional(hf: dict[str, Any]) -> dict[str, Any]:
    rope = _rope(hf)
    scaling = None
    if rope["rope_type"] != "default":
        table = ROPE_TYPES[rope["rope_type"]]
        scaling = {"kind": rope["rope_type"]}
        scaling |= {ours: rope[theirs] for theirs, ours in table.items() if rope.get(theirs) is not None}
        if "original_max_position_embeddings" in table:
            scaling.setdefault("original_max_len", None)
        if rope["rope_type"] == "yarn" and rope.get("factor") is None and scaling["original_max_len"]:
            scaling["factor"] = hf["max_position_embeddings"] / scaling["original_max_len"]  # transformers' fallback
    return {
        "kind": "rotary",
        "layout": "halves",
        "base": float(rope["rope_theta"]),
        "fraction": 1.0,
        "scaling": scaling,
    }


def _rope_parameters(positional: Any) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": getattr(positional, "base", THETA)}
    scaling = getattr(positional, "scaling", None)
    if scaling is not None:
        rope["rope_type"] = scaling.kind
        values = ((theirs, getattr(scaling, ours)) for theirs, ours in ROPE_TYPES[scaling.kind].items())
        rope |= {theirs: value for theirs, value in values if value is not None}
    return rope


def _layer_types(design: Design, hf: dict[str, Any]) -> list[str]:
    layers = hf["num_hidden_layers"]
    if not design.sliding:
        return ["full_attention"] * layers
    given = hf.get("layer_types")  # Gemma 2's default: sliding, then full, in turn
    return list(given) if given else ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def _llama_refusals(design: Design, hf: dict[str, Any]) -> list[str]:
    problems = _architecture_problems(hf, design.title, design.classes) + _rope_problems(design, hf)
    if _read(design, hf, "attention_dropout", 0.0):
        problems.append(
            f"attention_dropout is {_json(hf['attention_dropout'])}: dropout on the attention weights alone; the "
            "decoder-lm family's dropout drops the residuals and embeddings too: it must be 0.0"
        )
    types = _layer_types(design, hf)
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        problems.append(
            f"layer_types holds {_json(unknown)}; the decoder-lm family maps {', '.join(LAYER_TYPES)} in any pattern"
        )
    if len(types) != hf.get("num_hidden_layers", len(types)):
        problems.append(f"layer_types names {len(types)} layers but num_hidden_layers is {hf['num_hidden_layers']}")
    if "sliding_attention" in types and not _read(design, hf, "sliding_window"):
        problems.append("sliding_window is null, but layer_types has sliding_attention layers: give their window")
    return problems + design.refusals(hf)


def _llama_fields(design: Design, hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    head_dim = _read(design, hf, "head_dim", hf.get("head_dim"))
    kv_heads = _read(design, hf, "num_key_value_heads")
    softcap, scalar = _read(design, hf, "attn_logit_softcapping"), _read(design, hf, "query_pre_attn_scalar")
    attention = {
        "kind": "sdpa",
        "bias": _read(design, hf, "attention_bias"),
        "n_kv_heads": None if kv_heads in (None, heads) else kv_heads,
        "qk_norm": design.qk_norm,
        "softcap": softcap,
        "scale": None if scalar is None else scalar**-0.5,
    }
    window = _read(design, hf, "sliding_window")
    kinds = {
        "full_attention": attention,
        "sliding_attention": {**attention, "kind": "sliding-window", "window": (window or 1) - 1},
    }
    pattern = shortest_cycle([kinds[t] for t in _layer_types(design, hf)])
    return {
        "head_dim": None if head_dim in (None, hf["hidden_size"] // heads) else head_dim,
        "dropout": 0.0,
        "pad_id": _read(design, hf, "pad_token_id") or 0,
        "scale_embeddings": design.scale_embeddings,
        "norm": {"kind": "rmsnorm", "unit_offset": design.unit_offset},
        "norm_placement": design.placement,
        "final_norm": None,
        "ffn": {"kind": "gated", "bias": _read(design, hf, "mlp_bias", False)},
        "positional": _positional({**hf, "max_position_embeddings": _read(design, hf, "max_position_embeddings")}),
        "decoder": {"attention": pattern[0] if len(pattern) == 1 else pattern},
        "head": {"kind": "lm", "bias": False, "softcap": _read(design, hf, "final_logit_softcapping")},
    }


def _llama_json(
    design: Design, model: ZooModel, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    config = model.config
    attention = [config.decoder.attention_at(i) for i in range(config.decoder.layers)]
    first = attention[0]
    scale = first.scale or (config.head_dim or config.d_model // config.n_heads) ** -0.5
    windows = [kind.window for kind in attention if hasattr(kind, "window")]
    wanted = {
        "num_key_value_heads": first.n_kv_heads or config.n_heads,
        "head_dim": config.head_dim or config.d_model // config.n_heads,
        "attention_bias": first.bias,
        "attention_dropout": 0.0,  # the zoo's dropout drops more: a model with one is refused, by its dropout
        "mlp_bias": getattr(config.ffn, "bias", False),
        "rope_parameters": _rope_parameters(config.positional),
        "attn_logit_softcapping": first.softcap,
        "final_logit_softcapping": getattr(config.head, "softcap", None),
        "query_pre_attn_scalar": _whole(scale**-2.0),
        "sliding_window": windows[0] + 1 if windows else None,
        "layer_types": ["sliding_attention" if hasattr(kind, "window") else "full_attention" for kind in attention],
        "use_bidirectional_attention": False,
    }
    hf = {name: value for name, value in wanted.items() if name in design.defaults}
    return hf | _token_fields(model, bos_token_id, eos_token_id)


def _whole(value: float) -> float | int:
    """``value`` as an int where it is one but for rounding (Gemma 2's ``query_pre_attn_scalar``)."""
    return round(value) if abs(value - round(value)) < 1e-9 * max(1.0, abs(value)) else value


def llama_like(design: Design) -> HFMap:
    """The map of a model of Llama's layout, as ``design`` makes it its own."""
    layer = "layers.{i}."
    ours = "decoder.layers.{i}."
    qk_norms = (
        ()
        if design.qk_norm is None
        else tuple(Weight(f"{ours}self_attn.{n}_norm", f"{layer}self_attn.{n}_norm") for n in "qk")
    )
    defaults = design.defaults
    return HFMap(
        model_type=design.model_type,
        title=design.title,
        family="decoder-lm",
        variant=design.variant,
        architectures=design.classes,
        prefix="model.",
        base=design.classes[1:],
        ignored=(layer + "self_attn.rotary_emb.inv_freq", "rotary_emb.inv_freq"),  # older files' frequencies
        weights=(
            Weight("tgt_embed.token", "embed_tokens"),
            Weight(ours + "self_attn.in_proj", fused=tuple(f"{layer}self_attn.{p}_proj" for p in "qkv")),
            Weight(ours + "self_attn.out_proj", layer + "self_attn.o_proj"),
            *qk_norms,
            *(Weight(ours + norm, layer + theirs) for norm, theirs in design.norms),
            Weight(ours + "ffn.gate_up", fused=(layer + "mlp.gate_proj", layer + "mlp.up_proj")),
            Weight(ours + "ffn.down", layer + "mlp.down_proj"),
            Weight("decoder.final_norm", "norm"),
            Weight("head.proj.weight", "lm_head.weight"),
        ),
        fields=(
            ConfigField("vocab_size", "vocab_size"),
            ConfigField("hidden_size", "d_model"),
            ConfigField("num_attention_heads", "n_heads"),
            ConfigField("num_hidden_layers", "decoder.layers"),
            ConfigField("intermediate_size", "d_ff"),
            ConfigField("max_position_embeddings", "max_len", defaults["max_position_embeddings"]),
            ConfigField("rms_norm_eps", "norm.eps", defaults["rms_norm_eps"]),
            ConfigField(design.activation, "ffn.activation", defaults[design.activation], ACTIVATIONS),
            ConfigField("tie_word_embeddings", "head.tie_weights", defaults["tie_word_embeddings"]),
            ConfigField("initializer_range", "init_std", 0.02),
        ),
        refusals=functools.partial(_llama_refusals, design),
        to_ours=functools.partial(_llama_fields, design),
        to_theirs=functools.partial(_llama_json, design),
        comparable=_comparable,
    )


PRE = (("norms.0", "input_layernorm"), ("norms.1", "post_attention_layernorm"))
COMMON: dict[str, Any] = {  # the defaults the four config classes share
    "num_key_value_heads": None,
    "head_dim": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "pad_token_id": None,
    "rope_parameters": None,
}


def _qwen3_refusals(hf: dict[str, Any]) -> list[str]:
    if hf.get("use_sliding_window"):
        return [
            (
                "use_sliding_window is true: Qwen 3's sliding layers (from max_window_layers on), which the decoder-lm "
                "family does not read for Qwen 3; it must be false"
            )
        ]
    if "sliding_attention" in (hf.get("layer_types") or ()):
        return [
            "layer_types has sliding_attention layers, which Qwen 3 runs without a window: make them full_attention"
        ]
    return []


def _gemma2_refusals(hf: dict[str, Any]) -> list[str]:
    problems = []
    if hf.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention is true: every token sees later ones; a decoder-lm is causal")
    scalar = hf.get("query_pre_attn_scalar")
    if scalar is not None and scalar != round(scalar):
        problems.append(
            f"query_pre_attn_scalar is {_json(scalar)}; transformers' Gemma 2 takes a whole number (the scale on "
            "the queries is its power -1/2)"
        )
    return problems


LLAMA = llama_like(
    Design(
        title="Llama",
        model_type="llama",
        variant="llama",
        classes=("LlamaForCausalLM", "LlamaModel"),
        norms=PRE,
        placement="pre",
        defaults={**COMMON, "max_position_embeddings": 2048, "mlp_bias": False},
    )
)
QWEN3 = llama_like(
    Design(
        title="Qwen 3",
        model_type="qwen3",
        variant="qwen3",
        classes=("Qwen3ForCausalLM", "Qwen3Model"),
        norms=PRE,
        placement="pre",
        qk_norm="head",
        defaults={**COMMON, "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
        refusals=_qwen3_refusals,
    )
)
GEMMA2 = llama_like(
    Design(
        title="Gemma 2",
        model_type="gemma2",
        variant="gemma2",
        classes=("Gemma2ForCausalLM", "Gemma2Model"),
        norms=(
            ("norms.0", "input_layernorm"),
            ("post_norms.0", "post_attention_layernorm"),
            ("norms.1", "pre_feedforward_layernorm"),
            ("post_norms.1", "post_feedforward_layernorm"),
        ),
        placement="sandwich",
        unit_offset=True,
        scale_embeddings=True,
        activation="hidden_activation",
        sliding=True,
        defaults={
            **{k: v for k, v in COMMON.items() if k != "hidden_act"},
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
            "pad_token_id": 0,
            "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 4096,
            "layer_types": None,
            "use_bidirectional_attention": None,
        },
        refusals=_gemma2_refusals,
    )
)
OLMO2 = llama_like(
    Design(
        title="OLMo 2",
        model_type="olmo2",
        variant="olmo2",
        classes=("Olmo2ForCausalLM", "Olmo2Model"),
        norms=(("norms.0", "post_attention_layernorm"), ("norms.1", "post_feedforward_layernorm")),
        placement="output",
        qk_norm="projection",
        defaults={**COMMON, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "pad_token_id": 1},
    )
)
MAPS = (LLAMA, QWEN3, GEMMA2, OLMO2, GPT2)
"""The five, in the order a model is tried against them when it is saved."""


def save_decoder_lm(
    model: ZooModel, directory: str | Path, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> Path:
    """Write a decoder-lm model as transformers' ``save_pretrained`` writes the first of
    :data:`MAPS` whose design its config matches (:func:`~transformer_zoo.core.hf.write_hf_folder`).

    Args:
        bos_token_id, eos_token_id: the start and end tokens ``config.json`` gives ``generate``; None: none.
    """
    tokens = dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    spec = closest_map(MAPS, model, validate=load_config, **tokens)
    return write_hf_folder(spec, model, directory, validate=load_config, **tokens)


def _importer(spec: HFMap) -> Importer:
    def load(directory: Path, hf_config: dict[str, Any]) -> ZooModel:
        return read_hf_folder(spec, directory, hf_config, validate=load_config, build=build_checked)

    return Importer(
        name=f"hf-{spec.model_type}",
        description=f"a Hugging Face transformers {spec.architectures[0]} folder (config.json with model_type "
        f"{spec.model_type})",
        matches=spec.matches,
        load=load,
        family="decoder-lm",
        format="hf",
        save=save_decoder_lm,
    )


IMPORTERS = [_importer(spec) for spec in MAPS]
