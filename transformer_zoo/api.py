"""The public functions: list, configure, build, save and reload variants by name."""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from torch import nn

from .configs import (
    CONFIG_SUFFIXES,
    ConfigSource,
    describe_validation_error,
    is_folder_path,
    merge,
    parse_overrides,
    read_config,
)
from .core import weights
from .core.errors import ConfigError, naming
from .core.model import ZooModel
from .core.options import CATEGORIES, VariantConfig
from .core.weights import CONFIG_NAME, FORMAT, WEIGHTS_NAME
from .registry import Registry, get_registry


def list_variants(pattern: str = "*") -> list[str]:
    """Registered variant names matching a shell-style pattern (``"transformer-*"``), sorted."""
    return get_registry().variants(pattern)


def load_config(source: ConfigSource, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> VariantConfig:
    """A validated config from a variant name, a YAML or JSON file, a mapping, or a config.

    The mapping names a registered ``variant``; its preset values are the defaults that the
    other keys, then ``overrides`` (``["encoder.layers=2"]`` or a nested mapping), replace.

    Raises:
        ConfigError: a field is unknown, of the wrong type or out of range (each one named).
        UnknownNameError: the variant or a component kind is not registered.
    """
    if isinstance(source, str) and Path(source).suffix not in CONFIG_SUFFIXES and not is_folder_path(source):
        source = {"variant": source}
    data = _without_format(read_config(source))
    if overrides:
        data = merge(data, parse_overrides(overrides))
    name = data.get("variant")
    if not isinstance(name, str):
        raise ConfigError(
            "a config needs a 'variant' key naming a registered variant (see `tzoo list`), "
            f"for example variant: transformer-tiny; got {name!r}"
        )
    registry = get_registry()
    variant = registry.variant(name)
    try:
        return variant.config.model_validate(merge(_preset(registry, name), data), context={"registry": registry})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"config for variant {name!r}")) from None


_presets: weakref.WeakKeyDictionary[Registry, dict[str, tuple[Any, dict[str, Any]]]] = weakref.WeakKeyDictionary()


def _preset(registry: Registry, name: str) -> dict[str, Any]:
    """Every field of variant ``name`` as its preset sets it, in full (each component's options
    spelled out, so that a config changing one option of a component keeps the others): the
    config's class defaults, then the preset's values over them. Resolved once for each variant
    and set of registered kinds (a plugin registered or reloaded since resolves it again)."""
    variant = registry.variant(name)
    kinds = frozenset(cls for category in CATEGORIES for cls in registry.components(category).values())
    key = (variant, kinds)
    resolved = _presets.setdefault(registry, {})
    if name not in resolved or resolved[name][0] != key:
        context = {"registry": registry}
        base = variant.config.model_validate({"variant": name}, context=context).model_dump(mode="json")
        full = variant.config.model_validate(merge(base, variant.defaults), context=context).model_dump(mode="json")
        resolved[name] = (key, full)
    return copy.deepcopy(resolved[name][1])


def _without_format(data: dict[str, Any]) -> dict[str, Any]:
    """A config's fields without the ``format`` a saved ``config.json`` carries, upgraded to the
    current format (:data:`UPGRADES`); refused if a newer transformer-zoo wrote it (a config
    without ``format`` is read as the current one)."""
    saved = data.get("format", FORMAT)
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        raise ConfigError(f"format {saved!r}: expected a positive integer (save_pretrained writes format {FORMAT})")
    if saved > FORMAT:
        raise ConfigError(
            f"format {saved}: the config was saved by a newer transformer-zoo; this one reads format {FORMAT} "
            "and older: upgrade it (pip install -U transformer-zoo)"
        )
    fields = {key: value for key, value in data.items() if key != "format"}
    for version in range(saved, FORMAT):
        fields = UPGRADES[version](fields)
    return fields


def _kernel_is_backend(value: Any) -> Any:
    """Format 1 to 2: a component's ``kernel`` option (the sparse and local 2-D attention kinds')
    is named ``backend``."""
    if isinstance(value, list):
        return [_kernel_is_backend(item) for item in value]
    if not isinstance(value, dict):
        return value
    renamed = {k: _kernel_is_backend(v) for k, v in value.items()}
    if "kind" in renamed and isinstance(renamed.get("kernel"), str) and "backend" not in renamed:
        renamed["backend"] = renamed.pop("kernel")
    return renamed


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _kernel_is_backend}
"""How a config of each older format becomes one of the next: ``UPGRADES[n]`` reads format ``n``."""


def build_model(name_or_config: ConfigSource, **overrides: Any) -> nn.Module:
    """A ready model from a variant name, a config file, a mapping or a config.

    Keyword overrides replace config fields; nested fields by mapping
    (``encoder={"layers": 1}``) or by dotted key (``**{"encoder.layers": 1}``).

    A config whose parameters and buffers would not fit in this machine's memory is refused
    before anything is allocated (:func:`check_memory`).

    >>> model = build_model("transformer-tiny", dropout=0.0)

    Raises:
        ConfigError: a field is invalid, or the model would not fit in memory.
        UnknownNameError: the variant or a component kind is not registered.
    """
    return build_checked(load_config(name_or_config, overrides))


def build_checked(config: VariantConfig, skeleton: nn.Module | None = None) -> nn.Module:
    """``config.build()``, after :func:`check_memory` (reading ``skeleton``, the model built on
    the meta device, when the caller has one already), with ``model.config`` set."""
    check_memory(config, skeleton)
    model = config.build()
    if not isinstance(model, ZooModel):
        raise TypeError(
            f"{type(config).__name__}.build() returned a {type(model).__name__}; a variant's builder must "
            "return a transformer_zoo.core.model.ZooModel (EncoderDecoder is one)"
        )
    model.config = config
    model.exporters = get_registry().exporters(config.family)
    return model


def memory_limit() -> int | None:
    """Bytes of memory a model may take: the machine's RAM, or its container's limit (cgroup v2
    ``memory.max``) when lower; None where neither can be read."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None
    try:
        cgroup = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return limit
    return min(limit, int(cgroup)) if cgroup.isdigit() else limit


def _size(count: float) -> str:
    """``count`` bytes for a reader: ``512 bytes``, ``3.2 GiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} PiB"


def on_meta(config: VariantConfig) -> nn.Module | None:
    """``config``'s model built on the meta device (no memory behind its tensors); None for a
    builder that cannot run there.

    Raises:
        ConfigError: the builder refused the config (a combination of fields validation let through).
    """
    try:
        return weights.build_on_meta(config.build)
    except ValueError as exc:
        raise ConfigError(f"invalid config for variant {config.variant!r}:\n  {exc}") from None


def check_memory(config: VariantConfig, skeleton: nn.Module | None = None) -> None:
    """Refuse ``config`` if its parameters and buffers would not fit in :func:`memory_limit`.

    The model is built on the meta device (or ``skeleton``, one built there already, is read),
    which allocates nothing: the estimate is exact for the tensors the model keeps, the build's
    passing temporaries aside. A builder that cannot run on meta is not checked.

    Raises:
        ConfigError: the model does not fit (naming the estimate, the limit and its largest
            tensors), or its builder refused the config with a ValueError.
    """
    if skeleton is None:
        skeleton = on_meta(config)
    limit = memory_limit()
    if skeleton is None or limit is None:
        return
    tensors = dict(skeleton.named_buffers())
    tensors.update(skeleton.named_parameters())  # a shared tensor once, under its first name
    nbytes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    total = sum(nbytes.values())
    if total <= limit:
        return
    largest = sorted(nbytes, key=nbytes.get, reverse=True)[:3]
    named = ", ".join(f"{name} {' x '.join(map(str, tensors[name].shape))} ({_size(nbytes[name])})" for name in largest)
    raise ConfigError(
        f"config for variant {config.variant!r} needs about {_size(total)} for its parameters and buffers, more than "
        f"the {_size(limit)} of memory this machine has; its largest tensors: {named}. Shrink the sizes behind them "
        "(d_model, d_ff, layers, vocab_size, max_len, widths, image_size)"
    )


def from_pretrained(directory: str | os.PathLike) -> nn.Module:
    """Rebuild a model saved by ``save_pretrained`` (``config.json`` + ``model.safetensors``), or
    read a checkpoint in a format a plugin imports (a Hugging Face BERT folder), with no network.

    The folder may come from anyone, so it is checked before anything is allocated: the
    tensor names, shapes and dtypes in the safetensors header must be those of the model its
    ``config.json`` describes (built first on the ``meta`` device, which holds no memory), so a
    config asking for terabytes beside a small file is refused at once. Weights must be floating
    point (of any float dtype: loading casts them), integer buffers integers.

    Symlinks: ``directory`` itself may be a link. Its files are followed through links and must
    then lie inside it; links out of the folder are refused, except those of a Hugging Face hub
    cache snapshot into its repository's ``blobs`` folder. A name read from a file (a shard
    index) that is absolute or climbs out with ``..`` is refused too.

    The model is returned in eval mode.

    Raises:
        FileNotFoundError: no ``config.json``, or no ``model.safetensors`` beside it.
        ConfigError: ``config.json`` is not one JSON object of valid fields, or no plugin reads it.
        WeightsError: (a ConfigError) a weights file is damaged, lies outside the folder, or does
            not fit the model: each missing, unexpected, misshapen or mistyped tensor is named.
    """
    directory = Path(directory)
    if not (directory / CONFIG_NAME).is_file():
        raise FileNotFoundError(
            f"{str(directory / CONFIG_NAME)!r} not found; from_pretrained expects a folder written by "
            f"save_pretrained ({CONFIG_NAME} and {WEIGHTS_NAME}) or a checkpoint folder a plugin imports"
        )
    data = weights.read_json_object(directory, CONFIG_NAME)
    if "variant" not in data:
        with naming(repr(str(directory / CONFIG_NAME))):
            return _import(directory, data)
    path = weights.inside(directory, WEIGHTS_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(directory / WEIGHTS_NAME)!r} not found; save_pretrained writes it beside {CONFIG_NAME}"
        )
    header = weights.read_header(path)
    where = repr(str(directory / CONFIG_NAME))
    with naming(where):
        config = load_config(data)
        skeleton = on_meta(config)
    if skeleton is not None:
        weights.check_against(skeleton, header, path)
    with naming(where):
        model = build_checked(config, skeleton)
    if skeleton is None:  # a builder that cannot run on meta: check before loading instead
        weights.check_against(model, header, path)
    weights.load_safetensors(model, path)
    return model.eval()


def _import(directory: Path, data: dict[str, Any]) -> nn.Module:
    importers = get_registry().importers()
    for importer in importers:
        if importer.matches(data):
            return importer.load(directory, data)
    what = f"model_type {data['model_type']!r}" if "model_type" in data else "no 'variant' and no 'model_type'"
    known = "; ".join(f"{i.name}: {i.description}" for i in importers) or "none"
    raise ConfigError(
        f"{str(directory / CONFIG_NAME)!r} is not a transformer-zoo config (it has {what}) and no plugin imports it; "
        f"formats read: {known}"
    )
