"""One bridge between the zoo's families and Hugging Face ``transformers`` checkpoint folders.

A family declares an :class:`HFMap`: its ``model_type`` there, the names of its tensors there
(:class:`Weight`: renamed, fused from separate query, key and value projections, transposed,
tied) and the config fields that map both ways (:class:`ConfigField`); what no table can say
(which head an ``architectures`` entry means, what the family refuses) it gives as a few
functions. This module does the rest, the same for every family:

- :func:`read_hf_folder`: the folder's config translated (a refusal names each field the
  family cannot hold), its tensors' names and shapes read first (``model.safetensors``, its
  shards, or ``pytorch_model.bin``) and placed in the model built on the ``meta`` device, then
  every tensor placed in the real model. Every tensor of the file must find a place and every
  tensor of the model be filled, each of its shape, or one WeightsError names each that does
  not; what a family leaves out on purpose (a pooler it does not use) and a head the folder
  lacks (transformers' base model) are warned about.
- :func:`write_hf_folder`: ``config.json`` and ``model.safetensors`` as ``save_pretrained``
  writes them, after reading the config back through the same map: the model's config must
  come back field for field, or one ConfigError names each field and the value transformers
  would need, and nothing is written. A family with several counterparts in transformers
  (the decoder-only LMs) writes the first that can hold the model (:func:`closest_map`).

What the bridge needs of :mod:`transformer_zoo.api` (validating a config, building a model) is
passed in, as ``validate`` and ``build``: core imports nothing above it.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import weights
from .errors import ConfigError
from .model import ZooModel
from .weights import TensorInfo, WeightsError, write_folder

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
REQUIRED: Any = object()  # a ConfigField's default: config.json must give the field


@dataclass(frozen=True)
class Weight:
    """One entry of a name map: a tensor of ours and its name, or names, in ``transformers``.

    Names are dotted paths in which ``{i}`` stands for a layer's index (the same on both sides).
    A module's name (``encoder.layers.{i}.ffn.linear1``) maps each of its tensors: ``.weight``
    to ``.weight``, ``.bias`` to ``.bias``.

    Attributes:
        ours: our tensor's or module's name.
        theirs: transformers' name. Several: the copies transformers keeps of one tensor
            (BERT's output bias): read from whichever the file holds (those it holds must be
            equal) and written under each, or under the first alone when the model ties its
            embeddings, as transformers 5 saves tied tensors once.
        fused: instead of ``theirs``, transformers' separate tensors (the query, key and value
            projections) that ours concatenates along its first dimension, in this order;
            written back split as an attention's ``in_proj`` lays them out (the queries take
            as many rows as the heads are wide, the attention's ``d_inner``: the model's width
            unless ``head_dim`` sets it apart; the keys and the values half the rest each).
        transposed: transformers holds the weight transposed (GPT-2's ``Conv1D``, ``(in, out)``);
            a bias is the same both ways.
        unsqueezed: transformers holds it with a leading dimension of 1 (ViT's ``(1, n, D)``).
        when: a boolean field of our config (``share_embeddings``) the entry holds under alone.
        zeros: transformers starts the tensor (a bias; ``ours`` names the tensor itself) at zero
            when a file lacks it, and a model without it is written with zeros there (Marian's
            ``final_logits_bias``).

    Two entries for one tensor of ours are alternatives: either name is read, the first written.
    Tensors the model ties (one tensor under several of our names) are read from any of their
    names and written once, under the first name of the first.
    """

    ours: str
    theirs: str | tuple[str, ...] = ()
    fused: tuple[str, ...] = ()
    transposed: bool = False
    unsqueezed: bool = False
    when: str = ""
    zeros: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.theirs, str):
            object.__setattr__(self, "theirs", (self.theirs,))
        if bool(self.theirs) == bool(self.fused):
            raise ValueError(f"Weight({self.ours!r}): give transformers' name(s) as theirs, or its parts as fused")

    @property
    def names(self) -> tuple[str, ...]:
        """transformers' names: the copies, or the fused parts."""
        return self.fused or self.theirs


@dataclass(frozen=True)
class ConfigField:
    """A ``config.json`` field that maps to one field of our config, both ways.

    Attributes:
        theirs: transformers' field (``hidden_size``).
        ours: our field, a dotted path into nested options (``encoder.layers``, ``norm.eps``).
        default: transformers' default, read when ``config.json`` leaves the field out or gives
            null; :data:`REQUIRED`: the field must be there.
        values: transformers' values and ours, where they are spelt differently (``swish`` is our
            ``silu``); a value not listed is refused. Written back as the first value listed
            for ours.
    """

    theirs: str
    ours: str
    default: Any = REQUIRED
    values: Mapping[Any, Any] | None = None


def _no_problems(*_: Any) -> list[str]:
    return []


def _no_fields(*_: Any) -> dict[str, Any]:
    return {}


def _as_is(dump: dict[str, Any], _: dict[str, Any]) -> dict[str, Any]:
    return dump


@dataclass(frozen=True)
class HFMap:
    """A family's counterpart in ``transformers``, declared: what :func:`read_hf_folder` and
    :func:`write_hf_folder` need to read and write its folders.

    Attributes:
        model_type: ``config.json``'s ``model_type`` (``bert``).
        title: the model's name in messages (``transformers' BERT needs ...``).
        family: the zoo family that holds it, for messages.
        variant: the variant a folder is read as (its preset gives what the map leaves out).
        architectures: the transformers classes read; the first is written unless
            ``to_theirs`` gives ``architectures``.
        weights: the name map.
        fields: the config fields that map one to one.
        prefix: the base model's prefix in a checkpoint with a head (``bert.``): stripped when
            reading (older files lack it), written before every name but the head's.
        base: architectures of the base model alone (``BertModel``): written without the
            prefix and the head; a folder of one is read with a new head.
        legacy: ``(pattern, replacement)`` regular expressions for older spellings of
            transformers' names (``LayerNorm.gamma``), applied when reading.
        ignored: transformers' names that hold no weight (``embeddings.position_ids``), dropped
            unless an entry of ``weights`` claims them.
        left_out: transformers' names the family does not use, and why: dropped with a warning.
        checked: transformers' names that the zoo computes rather than reads, each with a
            function ``(name, tensor, config) -> problem or None`` checking the file's values.
        why: for fields of our config, what transformers has, added to a refusal that names them.
        refusals: ``(config.json) -> [problem, ...]``: what the family cannot hold, one line
            naming each field, refused in one ConfigError with the fields missing or of a value
            ``fields`` does not map (it may raise its own ConfigError instead).
        to_ours: ``(config.json, tensor names) -> fields``: our config's fields that ``fields``
            does not give.
        to_theirs: ``(model, **options) -> fields``: ``config.json``'s fields that ``fields``
            does not give; it takes the options of ``save_pretrained(format="hf", ...)``.
        save_problems: ``(model, config.json) -> [problem, ...]``: what a read-back cannot see
            (a module the config alone does not decide), refused with its differences.
        comparable: ``(config dump, config.json) -> dump``: a config as the read-back can hold
            it (fields transformers has no place for left out).
    """

    model_type: str
    title: str
    family: str
    variant: str
    architectures: tuple[str, ...]
    weights: tuple[Weight, ...]
    fields: tuple[ConfigField, ...] = ()
    prefix: str = ""
    base: tuple[str, ...] = ()
    legacy: tuple[tuple[str, str], ...] = ()
    ignored: tuple[str, ...] = ()
    left_out: Mapping[str, str] = field(default_factory=dict)
    checked: Mapping[str, Callable[[str, Tensor, Any], str | None]] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)
    refusals: Callable[[dict[str, Any]], list[str]] = _no_problems
    to_ours: Callable[[dict[str, Any], Collection[str]], dict[str, Any]] = _no_fields
    to_theirs: Callable[..., dict[str, Any]] = _no_fields
    save_problems: Callable[[ZooModel, dict[str, Any]], list[str]] = _no_problems
    comparable: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] = _as_is

    def matches(self, config: dict[str, Any]) -> bool:
        """Whether a parsed ``config.json`` is this model's: its ``model_type``, or (older files
        without one) an architecture this map reads."""
        if "model_type" in config:
            return config["model_type"] == self.model_type
        return any(a in self.architectures for a in config.get("architectures") or ())


# ---- names ----------------------------------------------------------------------------------
@functools.cache
def _pattern(name: str) -> re.Pattern[str]:
    """A name of a map as a regular expression: ``{i}`` a layer index, then a tensor's own name
    (``weight``) when the name is a module's."""
    body = re.escape(name).replace(r"\{i\}", r"(?P<i>\d+)", 1).replace(r"\{i\}", r"(?P=i)")
    return re.compile(body + r"(?:\.(?P<param>\w+))?")


def _fill(name: str, match: re.Match[str]) -> str:
    """``name`` with the index and the tensor's own name of ``match`` (a match of another name)."""
    index, param = match.groupdict().get("i"), match["param"]
    name = name if index is None else name.replace("{i}", index)
    return name if param is None else f"{name}.{param}"


def _holds(config: Any, path: str) -> bool:
    """Whether the boolean field at dotted ``path`` of ``config`` is set (an empty path: always)."""
    for part in filter(None, path.split(".")):
        config = getattr(config, part, None)
    return bool(config)


def _entries(spec: HFMap, config: Any) -> list[Weight]:
    """The entries of ``spec``'s name map that hold for ``config``."""
    return [entry for entry in spec.weights if not entry.when or _holds(config, entry.when)]


def _theirs_match(entries: list[Weight], name: str) -> tuple[Weight, int, re.Match[str]] | None:
    """The first entry naming transformers' tensor ``name``, which of its names, and the match."""
    for entry in entries:
        for index, theirs in enumerate(entry.names):
            if match := _pattern(theirs).fullmatch(name):
                return entry, index, match
    return None


def _ours_match(entries: list[Weight], name: str) -> tuple[Weight, re.Match[str]] | None:
    """The first entry naming our tensor ``name``, and the match."""
    for entry in entries:
        if match := _pattern(entry.ours).fullmatch(name):
            return entry, match
    return None


def _alternation(names: tuple[str, ...]) -> str:
    """Names that differ in one segment as one name: ``a.query``, ``a.key`` -> ``a.query|key``."""
    start = _common(names).rfind(".") + 1
    tails = [name[start:] for name in names]
    common = _common([tail[::-1] for tail in tails])[::-1]
    cut = min((k for k in (common.find("."), common.find("_")) if k >= 0), default=None)
    end = 0 if cut is None else len(common) - cut  # the shared end, from a separator on
    return names[0][:start] + "|".join(tail[: len(tail) - end] for tail in tails) + tails[0][len(tails[0]) - end :]


def _common(names: Collection[str]) -> str:
    """The longest start all ``names`` share."""
    shortest = min(names, key=len)
    return next((shortest[:k] for k in range(len(shortest)) if len({n[k] for n in names}) > 1), shortest)


def _as_ours(entry: Weight, tensor: Tensor) -> Tensor:
    if entry.unsqueezed:
        tensor = tensor.squeeze(0)  # (1, ...) -> (...)
    return tensor.t() if entry.transposed and tensor.dim() == 2 else tensor


def _as_theirs(entry: Weight, tensor: Tensor) -> Tensor:
    if entry.transposed and tensor.dim() == 2:
        tensor = tensor.t()
    return tensor[None] if entry.unsqueezed else tensor


def _split(fused: Tensor, width: int, parts: int) -> list[Tensor]:
    """A fused projection's rows as transformers' parts: q, k and v as :class:`Weight` says."""
    if parts != 3:
        return list(fused.chunk(parts))
    rest = (fused.shape[0] - width) // 2  # the keys' and values' rows: fewer than the queries' with n_kv_heads
    return list(fused.split([width, rest, rest]))


def _tied(state: dict[str, Tensor]) -> list[tuple[str, ...]]:
    """The model's tensors as groups of the names each has (tied ones several), in state order."""
    groups: dict[int, list[str]] = {}
    for name, tensor in state.items():
        groups.setdefault(id(tensor), []).append(name)
    return [tuple(names) for names in groups.values()]


# ---- placing a checkpoint -------------------------------------------------------------------
@dataclass
class Placement:
    """Where a checkpoint's tensors go: ``tensors`` by our names (one name of each tied group),
    the checkpoint's names ``left`` out (with why, where known) and our ``fresh`` names, those
    of a head the checkpoint lacks; ``problems`` found on the way."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


Found = dict[
    str, list[tuple[str, Tensor | None, torch.Size | None]]
]  # ours -> [(their name, tensor, shape in the file)]


def place_checkpoint(spec: HFMap, model: ZooModel, checkpoint: Mapping[str, Tensor], source: str) -> Placement:
    """Place ``checkpoint`` (transformers' names; tensors, or ``meta`` ones of their shapes) in
    ``model`` (either may be on the ``meta`` device), or one WeightsError naming each tensor
    of a non-float dtype, with no place in the model, missing, of another shape, or differing
    from a copy of it that the config ties."""
    state = model.state_dict(keep_vars=True)
    entries = _entries(spec, model.config)
    placement = Placement()
    found = _by_our_names(spec, entries, model.config, checkpoint, state.keys(), placement)
    for ours, copies in found.items():
        for name, _, _ in copies if ours not in state else ():
            if ours.startswith("head."):
                placement.left.append(name)  # a head the model has not (next-sentence prediction)
            else:
                placement.problems.append(f"not in the model the config describes: {name}")
    lead = spec.prefix if any(name.startswith(spec.prefix) for name in checkpoint) else ""
    for group in _tied(state):
        _fill_group(spec, entries, group, state[group[0]], found, placement, lead)
    weights.raise_if_any(Path(source), placement.problems, "holds weights that do not fit its config.json")
    return placement


def _by_our_names(
    spec: HFMap,
    entries: list[Weight],
    config: Any,
    checkpoint: Mapping[str, Tensor],
    ours: Collection[str],
    placement: Placement,
) -> Found:
    """The checkpoint's tensors by our names, as ours hold them (transposed back, fused: the
    parts of a tensor ``ours``, the model's names, holds must all be there and fit together);
    what has no name of ours is left out, checked, or a problem."""
    found: Found = {}
    parts: dict[str, tuple[Weight, str, re.Match[str], dict[int, tuple[str, Tensor]]]] = {}
    for original, tensor in checkpoint.items():
        name = original.removeprefix(spec.prefix)
        for pattern, replacement in spec.legacy:
            name = re.sub(pattern, replacement, name)
        matched = _theirs_match(entries, name)
        if matched is None and any(_pattern(n).fullmatch(name) for n in spec.ignored):
            continue
        if problem := weights.dtype_problem(original, tensor.dtype, torch.float32):
            placement.problems.append(f"dtype mismatch {problem}")
        if name in spec.checked:
            placement.problems += filter(None, [spec.checked[name](original, tensor, config)])
        elif name in spec.left_out:
            placement.left.append(f"{original} ({spec.left_out[name]})")
        elif matched is None:
            placement.problems.append(f"not in the model the config describes: {original}")
        elif matched[0].fused:
            entry, index, match = matched
            lead = spec.prefix if original.startswith(spec.prefix) else ""
            parts.setdefault(_fill(entry.ours, match), (entry, lead, match, {}))[3][index] = (original, tensor)
        else:
            entry, _, match = matched
            found.setdefault(_fill(entry.ours, match), []).append((original, _as_ours(entry, tensor), tensor.shape))
    for name, (entry, lead, match, given) in parts.items():
        display = lead + _fill(_alternation(entry.fused), match)  # ...attention.self.query|key|value.weight
        if name not in ours:
            found[name] = [(display, None, None)]
        elif len(given) < len(entry.fused):
            absent = [f"missing from the checkpoint: {lead}{_fill(n, match)}" for n in entry.fused]
            placement.problems += [line for k, line in enumerate(absent) if k not in given]
        elif len({tuple(t.shape[1:]) for _, t in given.values()}) > 1:
            shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in given.values())
            placement.problems.append(f"shape mismatch {display}: its parts cannot be concatenated ({shapes})")
        else:
            fused = torch.cat([given[k][1] for k in range(len(entry.fused))])  # (q + k + v rows, D) or (rows,)
            found[name] = [(display, fused, fused.shape)]
    return found


def _fill_group(
    spec: HFMap,
    entries: list[Weight],
    group: tuple[str, ...],
    expected: Tensor,
    found: Found,
    placement: Placement,
    lead: str,
) -> None:
    """Place one tensor of the model (``group``: its names, several if tied; ``expected``: it)
    from the copies ``found`` of it, which must fit it and be equal; or start it at zeros or
    new, or name it missing (``lead``: the prefix of the checkpoint's names)."""
    copies = [(ours, *copy) for ours in group for copy in found.get(ours, ())]
    if not copies:
        matched = _ours_match(entries, group[0])
        if matched is not None and matched[0].zeros:
            placement.tensors[group[0]] = torch.zeros_like(expected)
        elif spec.base and all(name.startswith("head.") for name in group):
            placement.fresh += group  # a base model's folder: the head starts new
        else:
            placement.problems.append(_missing(spec, matched, group[0], lead))
        return
    misfits = [
        f"shape mismatch {name} -> {ours}: checkpoint {tuple(shape)}, model {tuple(expected.shape)}"
        for ours, name, tensor, shape in copies
        if tensor.shape != expected.shape
    ]
    placement.problems += misfits
    _, first_name, first, _ = copies[0]
    if not misfits:
        placement.problems += [
            f"{name} differs from {first_name}, but the config ties them ({', '.join(group)} are one tensor)"
            for _, name, tensor, _ in copies[1:]
            if not _copies_agree(tensor, first)
        ]
        placement.tensors[group[0]] = first


def _copies_agree(copy: Tensor, first: Tensor) -> bool:
    """Whether two copies of one tensor in a checkpoint hold the same values; copies read from a
    header (on the ``meta`` device) hold none, and agree."""
    return copy.is_meta or first.is_meta or torch.equal(copy, first)


def _missing(spec: HFMap, matched: tuple[Weight, re.Match[str]] | None, ours: str, lead: str) -> str:
    """The problem of a checkpoint without our tensor ``ours``, naming transformers' names for it."""
    if matched is None:
        return f"missing from the checkpoint: a tensor for {ours}, which transformers' {spec.title} does not name"
    entry, match = matched
    names = _alternation(entry.fused) if entry.fused else " or ".join(entry.theirs)
    lead = "" if ours.startswith("head.") else lead
    return f"missing from the checkpoint: {lead}{_fill(names, match)} (for {ours})"


def shortest_cycle(values: Sequence[Any]) -> list[Any]:
    """The shortest list whose items, taken in turn (item ``i`` modulo its length), give
    ``values``: a stack's list of attention kinds for transformers' ``layer_types``, one type a
    layer (Gemma 2's alternation ``[sliding, full, sliding, full]`` is ``[sliding, full]``)."""
    count = len(values)
    period = next(p for p in range(1, count + 1) if all(values[i] == values[i % p] for i in range(count)))
    return list(values[:period])


def num_labels(hf: dict[str, Any]) -> int:
    """The classes of a transformers classifier's ``config.json``: ``num_labels``, else its labels, else 2."""
    return int(hf.get("num_labels") or len(hf.get("id2label") or {}) or 2)


def label_fields(count: int) -> dict[str, Any]:
    """``config.json``'s fields for a classifier of ``count`` classes, named as transformers names them."""
    labels = [f"LABEL_{i}" for i in range(count)]
    return {"num_labels": count, "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}


# ---- reading a folder -----------------------------------------------------------------------
def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *outer, last = path.split(".")
    for key in outer:
        data = data.setdefault(key, {})
    data[last] = value


def _merged(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        both = isinstance(out.get(key), dict) and isinstance(value, Mapping)
        out[key] = _merged(out[key], value) if both else value
    return out


def _unreadable(spec: HFMap, problems: list[str]) -> ConfigError:
    """The refusal of a ``config.json`` the family cannot hold: one line naming each field."""
    return ConfigError(
        f"this {spec.title} config cannot be read into the {spec.family} family:\n"
        + "\n".join(f"  {line}" for line in problems)
    )


def our_config(spec: HFMap, hf: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    """Our config (unvalidated) for transformers' ``hf`` (``config.json``), whose checkpoint
    holds the tensors ``names``; a ConfigError naming each field it cannot hold."""
    problems = spec.refusals(hf)
    data: dict[str, Any] = {"variant": spec.variant}
    for item in spec.fields:
        value = item.default if hf.get(item.theirs) is None else hf[item.theirs]
        if value is REQUIRED:
            problems.append(f"{item.theirs} is missing; a {spec.title} config gives it")
        elif item.values is not None and not (isinstance(value, Hashable) and value in item.values):
            known = ", ".join(map(json.dumps, item.values))
            problems.append(f"{item.theirs} is {json.dumps(value)}; the {spec.family} family maps {known}")
        else:
            _set(data, item.ours, value if item.values is None else item.values[value])
    if problems:
        raise _unreadable(spec, problems)
    return _merged(data, spec.to_ours(hf, names))


def _shards(directory: Path) -> list[Path]:
    """The files a sharded checkpoint's index names, each kept inside the folder."""
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


def _headers(files: list[Path]) -> dict[str, TensorInfo]:
    """The shapes and dtypes of every tensor in ``files``; a tensor in two files is refused."""
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


def _read_bin(directory: Path) -> dict[str, Tensor]:
    """A ``pytorch_model.bin`` state dict, memory-mapped where the format allows, read without
    running any code it holds (``weights_only``)."""
    if not (directory / BIN_NAME).is_file():
        raise FileNotFoundError(
            f"{str(directory)!r} holds no weights: expected {WEIGHTS_NAME}, {INDEX_NAME} or {BIN_NAME}"
        )
    path = weights.inside(directory, BIN_NAME)
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


def read_hf_folder(
    spec: HFMap,
    directory: str | Path,
    hf: dict[str, Any],
    *,
    validate: Callable[[dict[str, Any]], Any],
    build: Callable[[Any, Any], ZooModel],
) -> ZooModel:
    """A zoo model, in eval mode, from transformers' folder ``directory`` (``hf``: its parsed
    ``config.json``), every weight placed.

    The tensors' shapes and dtypes are read first (the safetensors headers; a ``.bin`` is
    memory-mapped) and placed in the model the config describes, built on the ``meta`` device,
    so that a config that does not fit its weights is refused before the model is allocated.

    Args:
        validate: our config from its fields (``transformer_zoo.api.load_config``).
        build: ``(config, model on meta or None) -> model`` (``transformer_zoo.api.build_checked``).

    Raises:
        FileNotFoundError: the folder holds no weights.
        ConfigError: the config has fields the family cannot hold (each named).
        WeightsError: (a ConfigError) a weights file is damaged or lies outside the folder, or
            its tensors do not fit the config (each named, with both shapes).
    """
    directory = Path(directory)
    source = str(directory)
    if (directory / WEIGHTS_NAME).is_file() or (directory / INDEX_NAME).is_file():
        files = (
            [weights.inside(directory, WEIGHTS_NAME)] if (directory / WEIGHTS_NAME).is_file() else _shards(directory)
        )
        tensors = None
        shapes = {name: info.on_meta() for name, info in _headers(files).items()}
    else:
        tensors = _read_bin(directory)
        shapes = {name: tensor.to("meta") for name, tensor in tensors.items()}
    config = validate(our_config(spec, hf, shapes.keys()))
    skeleton = weights.build_on_meta(config.build)
    if skeleton is not None:
        skeleton.config = config
        place_checkpoint(spec, skeleton, shapes, source)
    model = build(config, skeleton)
    if tensors is None:
        tensors = {name: tensor for path in files for name, tensor in weights.read_tensors(path).items()}
    placement = place_checkpoint(spec, model, tensors, source)
    model.load_state_dict(placement.tensors, strict=False)  # tied tensors are given once
    if placement.left:
        left = ", ".join(sorted(placement.left))
        warnings.warn(f"{source}: weights with no place in the model, left out: {left}", stacklevel=3)
    if placement.fresh:
        fresh = ", ".join(placement.fresh)
        warnings.warn(f"{source}: the checkpoint has no weights for the head; newly initialised: {fresh}", stacklevel=3)
    return model.eval()


# ---- writing a folder -----------------------------------------------------------------------
def _get(dump: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(dump, dict) or part not in dump:
            return REQUIRED
        dump = dump[part]
    return dump


def _differences(spec: HFMap, ours: Any, theirs: Any, path: str) -> list[str]:
    """Each field where two config dumps differ: ``norm_placement is 'pre'; transformers' BERT needs 'post'``;
    lists of one length item by item (``decoder.attention.2.window``)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("kind") != theirs.get("kind"):
            return [f"{path}kind is {ours.get('kind')!r}; transformers' {spec.title} needs {theirs.get('kind')!r}"]
        return [line for key in ours for line in _differences(spec, ours[key], theirs.get(key), f"{path}{key}.")]
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [line for i, pair in enumerate(zip(ours, theirs)) for line in _differences(spec, *pair, f"{path}{i}.")]
    name = path[:-1]
    why = spec.why.get(name, "")
    return [] if ours == theirs else [f"{name} is {ours!r}; transformers' {spec.title} needs {theirs!r}{why}"]


def hf_config(spec: HFMap, model: ZooModel, **options: Any) -> dict[str, Any]:
    """The ``config.json`` transformers would hold for ``model`` (what it cannot express is
    found by reading it back, in :func:`write_hf_folder`)."""
    hf: dict[str, Any] = {"architectures": [spec.architectures[0]], "model_type": spec.model_type}
    hf |= spec.to_theirs(model, **options)
    dump = model.config.model_dump(mode="json")
    for item in spec.fields:
        value = _get(dump, item.ours)
        if value is not REQUIRED:
            spelt = [theirs for theirs, ours in (item.values or {}).items() if ours == value]
            hf[item.theirs] = spelt[0] if spelt else value
    hf["dtype"] = str(next(p.dtype for p in model.parameters() if p.is_floating_point())).removeprefix("torch.")
    return hf


def hf_state_dict(spec: HFMap, model: ZooModel, architecture: str) -> tuple[dict[str, Tensor], list[str]]:
    """The model's tensors under transformers' names (views: nothing is copied), the fused
    projections split, tied tensors once, a base architecture's without the head; and our
    names that transformers has none for."""
    base = architecture in spec.base
    ours = model.state_dict(keep_vars=True)
    entries = _entries(spec, model.config)
    groups = _tied(ours)
    tied = any(len(group) > 1 for group in groups)  # transformers 5 then saves every copy once
    state: dict[str, Tensor] = {}
    unnamed = []
    for group in groups:
        if base and group[0].startswith("head."):
            continue
        matched = _ours_match(entries, group[0])
        if matched is None:
            unnamed.append(group[0])
            continue
        entry, match = matched
        lead = "" if base or group[0].startswith("head.") else spec.prefix
        tensor = ours[group[0]].detach()
        if entry.fused:
            projection = _fill(entry.ours, match).rpartition(".")[0]
            attention = model.get_submodule(projection.rpartition(".")[0])
            width = getattr(attention, "d_inner", None) or ours[projection + ".weight"].shape[-1]
            for name, part in zip(entry.fused, _split(tensor, width, len(entry.fused))):
                state[lead + _fill(name, match)] = part
            continue
        for name in entry.theirs[:1] if tied else entry.theirs:
            state[lead + _fill(name, match)] = _as_theirs(entry, tensor)
    for entry in entries:  # a tensor transformers always has, where the model has none: zeros
        if entry.zeros and entry.ours not in ours:
            rows = ours[entry.ours.rpartition(".")[0] + ".weight"].shape[0]
            lead = "" if base or entry.ours.startswith("head.") else spec.prefix
            state[lead + entry.theirs[0]] = _as_theirs(entry, torch.zeros(rows))
    return state, unnamed


def _planned(
    spec: HFMap, model: ZooModel, validate: Callable[[dict[str, Any]], Any], options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Tensor], list[str]]:
    """``model`` as transformers would hold it as ``spec``'s model: its ``config.json``, its
    tensors by transformers' names, and each problem that keeps it from being written so."""
    hf = hf_config(spec, model, **options)
    state, unnamed = hf_state_dict(spec, model, hf["architectures"][0])
    problems = spec.save_problems(model, hf)
    dump = model.config.model_dump(mode="json")
    problems += _read_back(spec, dump, hf, state.keys(), validate, unreadable_too=not problems)
    if unnamed and not problems:  # else a field named above is why (a final norm, learned positions)
        problems.append(f"weights with no name in transformers' {spec.title}: {', '.join(unnamed)}")
    return hf, state, problems


def closest_map(
    specs: Sequence[HFMap], model: ZooModel, *, validate: Callable[[dict[str, Any]], Any], **options: Any
) -> HFMap:
    """The first of ``specs`` that can write ``model`` (its config comes back field for field
    through that map); where none can, the one with the fewest problems, whose refusal
    :func:`write_hf_folder` then gives. For a family with several counterparts in transformers,
    one map each (the decoder-only LMs: GPT-2, Llama, Qwen 3, Gemma 2, OLMo 2)."""
    if model.config is None:
        return specs[0]  # write_hf_folder says why nothing can be written
    counts = []
    for spec in specs:
        problems = _planned(spec, model, validate, options)[2]
        if not problems:
            return spec
        counts.append(len(problems))
    return specs[counts.index(min(counts))]


def write_hf_folder(
    spec: HFMap,
    model: ZooModel,
    directory: str | Path,
    *,
    validate: Callable[[dict[str, Any]], Any],
    **options: Any,
) -> Path:
    """Write ``model`` into ``directory`` (created if needed) as transformers' ``save_pretrained``
    would: ``config.json`` and ``model.safetensors``, each atomically.

    ``config.json`` is read back first, through the map that reads a folder (``validate``:
    ``transformer_zoo.api.load_config``): it must give the model's config field for field.

    Args:
        options: the family's (``spec.to_theirs``'s), such as BERT's ``architecture``.

    Raises:
        ValueError: the model was built by hand (it has no config), or an option is not one.
        ConfigError: the config has options transformers cannot express (each is named, with
            the value it would need); nothing is written.
    """
    config = model.config
    if config is None:
        raise ValueError(
            f"this {type(model).__name__} has no config: it was built by hand; build it with "
            "transformer_zoo.build_model(...) to be able to save it"
        )
    hf, state, problems = _planned(spec, model, validate, options)
    if problems:
        raise ConfigError(
            f"this {config.variant} model cannot be saved with format='hf' as transformers' {hf['architectures'][0]}:\n"
            + "\n".join(f"  {line}" for line in problems)
            + "\nchange these fields, or save with format='zoo' (the default), which keeps every option"
        )
    state = {name: tensor.to("cpu").clone(memory_format=torch.contiguous_format) for name, tensor in state.items()}
    return write_folder(directory, state, hf)


def _read_back(
    spec: HFMap,
    dump: dict[str, Any],
    hf: dict[str, Any],
    names: Collection[str],
    validate: Callable[..., Any],
    *,
    unreadable_too: bool,
) -> list[str]:
    """Each field of our config (``dump``) that ``hf`` read back does not give, with the value it
    does; if the map cannot read ``hf`` back (it holds a value the map refuses), that refusal,
    unless ``unreadable_too`` is false (the caller has refused the model already)."""
    try:
        back = validate(our_config(spec, hf, names)).model_dump(mode="json")
    except ConfigError as error:
        return [str(error)] if unreadable_too else []
    ours, back = ({k: v for k, v in spec.comparable(d, hf).items() if k != "variant"} for d in (dump, back))
    return [line for key in ours for line in _differences(spec, ours[key], back.get(key), f"{key}.")]
