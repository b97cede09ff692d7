"""Checks on a model folder from elsewhere, made before anything is allocated.

A folder given to ``transformer_zoo.from_pretrained`` may be damaged, or made to do harm: a
config asking for terabytes beside a tiny weights file, a truncated or garbage file, integer
weights, a shard index naming ``../outside.safetensors``. The functions here read only the
safetensors header (the tensor names, shapes and dtypes), compare it with a model built on the
``meta`` device (which holds no memory), and keep every path inside the folder, so that each of
these is refused with a message naming the file, before the model is built for real.

Writing is here too: :func:`save_folder` (``model.save_pretrained``), :func:`write_folder` for
another library's layout, and :class:`Importer`, a format a plugin reads (and may write).

Integrity: every safetensors file written here carries, in its metadata under :data:`DIGEST`,
the SHA-256 digest of its tensors (:func:`tensors_digest`), and every file read here
(:func:`read_tensors`) is checked against it when it has one, so that weights whose bytes
changed after saving (a flipped bit on disk, a damaged copy) are refused, naming the file,
instead of loading as a silently different model. Files of other writers, without the digest,
are read as they are.

Symlinks: the folder itself may be a link. A file in it (or named by a shard index) is followed
through links, and must then lie inside the folder; the one exception is the Hugging Face hub
cache, whose ``snapshots/<revision>/`` folders hold links into the ``blobs/`` folder of the same
cached repository, which are followed too. Anything else resolving outside is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import safetensors.torch
import torch
from safetensors import SafetensorError
from torch import Tensor, nn

from .errors import ConfigError
from .files import atomic_write

DIGEST = "tensors_sha256"
"""The safetensors metadata key of the file's :func:`tensors_digest`, written by every save of
this module and checked by every read (:func:`read_tensors`)."""
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
MAX_LISTED = 20  # problems named in one message; the rest are counted

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class WeightsError(ConfigError):
    """A weights file that cannot be read, names a path outside its folder, or does not fit the
    model its config describes; the message names the file."""


class TensorInfo(NamedTuple):
    """What a weights file says about one tensor, without its values."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def on_meta(self) -> torch.Tensor:
        """A tensor of this shape and dtype that holds no memory."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


# ---- paths ----------------------------------------------------------------------------------
def _roots(folder: Path) -> list[Path]:
    """Where files of ``folder`` may resolve to: the folder, and for a Hugging Face hub cache
    snapshot (``<repo>/snapshots/<revision>``) the repository's ``blobs`` folder."""
    root = folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        roots.append((root.parent.parent / "blobs").resolve())
    return roots


def inside(folder: str | os.PathLike, name: str | os.PathLike) -> Path:
    """``folder / name``, resolved through symlinks; a WeightsError if it lies outside ``folder``.

    ``name`` comes from the folder's own files (a shard index), so it may be hostile: an
    absolute path or one climbing out with ``..`` is refused, as is a link that points out of
    the folder (see the module docstring for the Hugging Face cache's links, which are followed).
    """
    folder = Path(folder)
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise WeightsError(f"{str(folder)!r}: a file name must be a non-empty string, got {shorten(repr(name))}")
    path = (folder / name).resolve()
    roots = _roots(folder)
    if not any(path.is_relative_to(root) for root in roots):
        raise WeightsError(
            f"{str(folder / name)!r} resolves to {str(path)!r}, outside the model folder {str(roots[0])!r}; "
            "a model folder may only name files inside itself (no absolute paths, no '..', no links out of it)"
        )
    return path


# ---- safetensors headers --------------------------------------------------------------------
def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters: a hostile file's names and values go into messages."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(path: Path, what: str) -> WeightsError:
    return WeightsError(f"{str(path)!r} is not a readable safetensors file: {what}")


def _tensor_info(path: Path, name: str, entry: Any, data_bytes: int) -> tuple[TensorInfo, int, int]:
    """One header entry, checked: its shape, dtype and byte range in the data."""
    name = shorten(repr(name))
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise _bad(
            path, f"the header entry of {name} is {shorten(repr(entry))}; expected dtype, shape and data_offsets"
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _bad(path, f"{name} has dtype {shorten(repr(dtype))}; the dtypes read are {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise _bad(path, f"{name} has shape {shorten(repr(shape))}; expected a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise _bad(
            path,
            f"{name} has data_offsets {shorten(repr(offsets))}; expected [begin, end] within the "
            f"{data_bytes} bytes of tensor data the file holds (truncated?)",
        )
    numel = math.prod(shape)
    if offsets[1] - offsets[0] != numel * DTYPES[dtype].itemsize:
        raise _bad(
            path,
            f"{name} is {dtype} of shape {shorten(repr(shape))} ({numel * DTYPES[dtype].itemsize} bytes) "
            f"but its data_offsets {offsets} span {offsets[1] - offsets[0]} bytes",
        )
    return TensorInfo(tuple(shape), DTYPES[dtype]), offsets[0], offsets[1]


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """The names, shapes and dtypes of the tensors in a safetensors file, read from its header
    only (no tensor data is read), after checking that the file is whole.

    Layout: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON, then the tensor
    data, which the entries' ``data_offsets`` must cover exactly, in order.

    Raises:
        WeightsError: the file is empty, truncated, or not safetensors (each case named).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            prefix = file.read(8)
            if size < 8:
                raise _bad(path, f"it holds {size} bytes; a safetensors file starts with an 8-byte header length")
            length = int.from_bytes(prefix, "little")
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise _bad(
                    path,
                    f"its header length field says {length} bytes, but "
                    + (
                        f"the file holds only {size - 8} after it (truncated, or not safetensors)"
                        if length > size - 8
                        else f"a header may be at most {MAX_HEADER_BYTES}"
                    ),
                )
            raw = file.read(length)
    except OSError as error:
        raise WeightsError(f"{str(path)!r} cannot be read: {error.strerror or error}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, or nested too deeply
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise _bad(path, f"its header is not JSON ({reason})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"its header is a JSON {type(header).__name__}; expected an object of tensors by name")
    data_bytes = size - 8 - length
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name], begin, end = _tensor_info(path, name, entry, data_bytes)
        spans.append((begin, end, name))
    end_of_last = 0
    for begin, end, name in sorted(spans):
        if begin != end_of_last:
            raise _bad(
                path,
                f"the data of {shorten(repr(name))} starts at byte {begin}, not at {end_of_last} where "
                "the previous tensor's ends (tensors must be stored back to back)",
            )
        end_of_last = end
    if end_of_last != data_bytes:
        raise _bad(path, f"the header describes {end_of_last} bytes of tensor data but the file holds {data_bytes}")
    return tensors


# ---- comparing with a model -----------------------------------------------------------------
def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "floating point"
    return "bool" if dtype == torch.bool else "integer"


def dtype_problem(name: str, found: torch.dtype, expected: torch.dtype) -> str | None:
    """Why a saved tensor of dtype ``found`` cannot fill a model tensor of dtype ``expected``,
    or None if it can: weights (floating point) take any floating dtype, which loading casts;
    integer buffers (batch norm's step count) take integers."""
    if _kind(found) == _kind(expected):
        return None
    return f"{name}: the file holds {found}, the model {expected}; this tensor must be {_kind(expected)}"


def raise_if_any(path: Path, problems: list[str], what: str) -> None:
    """One WeightsError listing ``problems`` (the first few, then a count) under ``what``."""
    if not problems:
        return
    lines = [f"  {p}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"  ... and {len(problems) - MAX_LISTED} more")
    raise WeightsError(f"{str(path)!r} {what}:\n" + "\n".join(lines))


def check_against(model: nn.Module, header: dict[str, TensorInfo], path: str | os.PathLike) -> None:
    """Refuse weights that do not fit ``model`` (best built on the ``meta`` device): every
    tensor of the model present once (tied tensors, saved under one of their names, count as
    one), nothing else, each of the model's shape and of a dtype it can take.

    Raises:
        WeightsError: naming each missing, unexpected, misshapen or mistyped tensor.
    """
    path = Path(path)
    groups: dict[int, list[str]] = {}
    state = model.state_dict(keep_vars=True)
    for name, tensor in state.items():
        groups.setdefault(id(tensor), []).append(name)  # tied weights are one Parameter under several names
    problems, misshapen = [], []
    for names in groups.values():
        if not any(n in header for n in names):
            tied = f" (tied to {', '.join(names[1:])})" if len(names) > 1 else ""
            problems.append(f"missing from the file: {names[0]}{tied}")
    for name, info in header.items():
        if name not in state:
            problems.append(f"not in the model the config describes: {shorten(name)} {shorten(str(list(info.shape)))}")
            continue
        expected = state[name]
        if tuple(info.shape) != tuple(expected.shape):
            misshapen.append(
                (-expected.numel(), f"shape mismatch {name}: file {list(info.shape)}, model {list(expected.shape)}")
            )
        elif problem := dtype_problem(name, info.dtype, expected.dtype):
            problems.append(f"dtype mismatch {problem}")
    problems += [line for _, line in sorted(misshapen)]  # the largest first: what made the model too big
    if problems:
        wanted = sum(state[names[0]].numel() for names in groups.values())
        held = sum(math.prod(info.shape) for info in header.values())
        raise_if_any(
            path,
            problems,
            f"does not fit the model its config.json describes ({wanted:,} values in "
            f"{len(groups)} tensors; the file holds {held:,} in {len(header)})",
        )


# ---- config.json and building ---------------------------------------------------------------
MAX_CONFIG_BYTES = 16 * 2**20
JSON_TYPES = {list: "array", str: "string", type(None): "null", int: "number", float: "number", bool: "boolean"}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {shorten(repr(repeated))} appears more than once in one object; give each key once")
    return data


def _finite_only(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number; numbers must be finite")


def read_json_object(
    folder: str | os.PathLike, name: str = "config.json", what: str = "config fields"
) -> dict[str, Any]:
    """The JSON object in ``folder / name`` (a model folder's ``config.json``, or a shard index),
    kept inside the folder (:func:`inside`); a ConfigError naming the file if it is not one
    object of ``what`` (it is a list, a string, ``null``, holds NaN or a key given twice, or
    is not JSON at all)."""
    path = inside(folder, name)
    try:
        size = path.stat().st_size
        text = path.read_bytes() if size <= MAX_CONFIG_BYTES else b""
    except OSError as error:
        raise ConfigError(f"{str(path)!r} cannot be read: {error.strerror or error}") from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{str(path)!r} is {size} bytes; a config.json may be at most {MAX_CONFIG_BYTES} "
            "(it is a small JSON object of fields)"
        )
    try:
        data = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_finite_only)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, the hooks above, nesting
        reason = "it nests too deeply" if isinstance(error, RecursionError) else str(error)
        raise ConfigError(f"{str(path)!r} is not valid JSON: {reason}; expected a JSON object of {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{str(path)!r} holds a JSON {JSON_TYPES.get(type(data), type(data).__name__)}; expected a "
            f"JSON object of {what}"
        )
    return data


def build_on_meta(build: Callable[[], nn.Module]) -> nn.Module | None:
    """``build()`` on the ``meta`` device: every tensor's shape and dtype, with no memory behind
    them, so a config asking for terabytes costs nothing to check. None for a builder that
    cannot run there (one that reads tensor values while building); its errors about the
    config itself (ValueError) are raised."""
    try:
        with torch.device("meta"):
            return build()
    except (NotImplementedError, RuntimeError):
        return None


def load_safetensors(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the tensors of ``path`` into ``model`` (already checked with :func:`check_against`),
    verifying the file's digest (:func:`read_tensors`); a WeightsError naming the file if it
    changed since, is damaged, or its values cannot be loaded."""
    tensors = read_tensors(path)
    try:
        model.load_state_dict(tensors, strict=False)  # tied tensors are saved under one name
    except RuntimeError as error:
        raise WeightsError(f"{str(path)!r} could not be loaded into the model: {error}") from None


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (checked with :func:`read_header` first), on the CPU,
    verified against the digest in its metadata when it has one (:data:`DIGEST`).

    Raises:
        WeightsError: naming the file: it cannot be read, or its tensors do not match its digest.
    """
    try:
        with safetensors.safe_open(str(path), framework="pt") as file:
            recorded = (file.metadata() or {}).get(DIGEST)
        tensors = safetensors.torch.load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise WeightsError(f"{str(path)!r} is not a readable safetensors file: {error}") from None
    if recorded is not None and (found := tensors_digest(tensors)) != recorded:
        raise WeightsError(
            f"{str(path)!r} does not match the SHA-256 digest in its metadata (recorded {shorten(recorded, 16)}, "
            f"its tensors give {found[:16]}...): its bytes changed after it was saved (damaged on disk or "
            "in a copy); save the model again, or copy the folder again from where it was made"
        )
    return tensors


def tensors_digest(tensors: dict[str, Tensor]) -> str:
    """The SHA-256 digest of ``tensors``, in hexadecimal: over each tensor in the order of its
    name, its name, dtype and shape, then its bytes as stored. Saved under :data:`DIGEST` in a
    safetensors file's metadata; it is the same for any layout of the same tensors."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f"{name}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode())
        digest.update(tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def unique_tensors(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state dict with each tensor once: a tied tensor (one Parameter under several
    names) under its first name, as :func:`check_against` and loading expect it."""
    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors[name] = tensor.detach().contiguous()
    return tensors


def save_safetensors(tensors: dict[str, Tensor], path: Path) -> None:
    """Write ``tensors`` to ``path`` atomically, with the metadata ``transformers`` reads
    (``format: pt``) and their digest (:data:`DIGEST`)."""
    metadata = {"format": "pt", DIGEST: tensors_digest(tensors)}
    atomic_write(path, lambda tmp: safetensors.torch.save_file(tensors, str(tmp), metadata=metadata))


def save_folder(model: nn.Module, directory: str | os.PathLike, *, format: str = "zoo", **options: Any) -> Path:
    """Write ``model``'s ``config.json`` and ``model.safetensors`` into ``directory`` (created if
    needed): what ``model.save_pretrained`` does.

    Each file is written atomically; load with ``transformer_zoo.from_pretrained``.
    ``format="zoo"``, the zoo's own layout, keeps every option of the config; ``config.json``
    holds the config's fields and ``format``, the layout's version (:data:`FORMAT`). Another
    format is written by the plugin that reads it (an :class:`Importer` with ``save``): the
    bert, transformer and ViT families' ``"hf"``, which ``transformers`` loads; ``options``
    go to it (bert's ``architecture``).
    """
    if model.config is None:
        raise ValueError(
            f"this {type(model).__name__} has no config: it was built by hand; build it with "
            "transformer_zoo.build_model(...) to be able to save and reload it"
        )
    if format != "zoo":
        save = model.exporters.get(format)
        if save is None:
            family = getattr(model.config, "family", "") or type(model).__name__
            known = ", ".join(repr(name) for name in ["zoo", *model.exporters])
            raise ValueError(
                f"format={format!r}: a {family} model saves as {known} (a plugin's importer with save= adds a "
                "format to the family it writes)"
            )
        return save(model, directory, **options)
    if options:
        raise ValueError(
            f"{', '.join(f'{key}=' for key in options)}: options of another format; format='zoo' takes none"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(unique_tensors(model), directory / WEIGHTS_NAME)
    text = json.dumps({"format": FORMAT, **model.config.model_dump(mode="json")}, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda p: p.write_text(text))
    return directory


def write_folder(directory: str | os.PathLike, tensors: dict[str, Tensor], config: dict[str, Any]) -> Path:
    """Write ``tensors`` as ``model.safetensors`` and ``config`` as ``config.json`` into
    ``directory`` (created if needed), each atomically: the layout of ``transformers``'
    ``save_pretrained``, whose loader needs the safetensors metadata ``format: pt`` (the
    digest, :data:`DIGEST`, is added beside it). The importers that also write their format
    (:class:`Importer`'s ``save``) end with it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, directory / WEIGHTS_NAME)
    text = json.dumps(config, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda p: p.write_text(text))
    return directory


@dataclass(frozen=True)
class Importer:
    """A checkpoint format a plugin can read into a zoo model (offered by ``tzoo_importers``).

    An importer may also write the format: ``save`` is then what ``save_pretrained(directory,
    format=FORMAT, **options)`` calls for a model of ``family``.

    Attributes:
        name: a unique name, such as ``hf-bert``.
        description: what folders it reads, for messages.
        matches: whether a folder's parsed ``config.json`` is in this format.
        load: ``(directory, config) -> nn.Module``, the model in eval mode with every weight placed.
        family: the family whose models ``save`` writes.
        format: the name ``save_pretrained`` gives the format, such as ``hf``.
        save: ``(model, directory, **options) -> directory``; it refuses, with a ConfigError
            naming the field, a model the format cannot express.
    """

    name: str
    description: str
    matches: Callable[[dict[str, Any]], bool]
    load: Callable[[Path, dict[str, Any]], nn.Module]
    family: str | None = None
    format: str | None = None
    save: Callable[..., Path] | None = None


CONFIG_NAME = "config.json"


WEIGHTS_NAME = "model.safetensors"


FORMAT = 2
"""The version of the folder layout ``save_pretrained`` writes, saved as ``config.json``'s
``format``: a config of a newer format is refused (it was saved by a newer transformer-zoo), one
of an older format is upgraded when read (``transformer_zoo.api``), and one without ``format``
(written by hand) is read as this format. 2: the sparse and local 2-D attention kinds' option
``kernel`` is named ``backend``."""
