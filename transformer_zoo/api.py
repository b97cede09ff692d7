"""The public functions: list, configure, build, save and reload variants by name."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from torch import nn

from .core import weights
from .core.errors import ConfigError
from .core.model import CONFIG_NAME, WEIGHTS_NAME, ZooModel
from .core.options import VariantConfig
from .registry import get_registry

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

ConfigSource = str | os.PathLike | Mapping[str, Any] | VariantConfig
M = TypeVar("M", bound=BaseModel)


def list_variants(pattern: str = "*") -> list[str]:
    """Registered variant names matching a shell-style pattern (``"transformer-*"``), sorted."""
    return get_registry().variants(pattern)


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into ``base``; a mapping whose ``kind`` changes replaces the old one.

    A bare kind name stands for ``{"kind": name}``: with the same kind it keeps the options.
    """
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, str) and "kind" in old:
            value = {"kind": value}  # a bare kind name: keep the options given so far if the kind is unchanged
        if isinstance(old, Mapping) and isinstance(value, Mapping) and value.get("kind", old.get("kind")) == old.get("kind"):
            out[key] = merge(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(items: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``["encoder.layers=2", "dropout=0"]`` (or ``{"encoder.layers": 2}``) to a nested mapping.

    Values given as text are read as YAML scalars: ``2`` is an int, ``null`` is None.
    """
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items:
            key, sep, text = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"override {item!r} is not of the form key=value (for example encoder.layers=2)")
            pairs.append((key.strip(), yaml.safe_load(text) if text.strip() else ""))
    out: dict[str, Any] = {}
    for key, value in pairs:
        *parents, leaf = key.split(".")
        node = out
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(
                    f"override {key!r} sets a field inside {where!r}, which an earlier override set to {node!r}; "
                    f"write {where}.kind={node} instead (if it names a kind)"
                )
        node.update(merge(node, {leaf: value}))  # later overrides win; a bare kind name keeps same-kind options
    return out


def _read(source: ConfigSource) -> dict[str, Any]:
    if isinstance(source, VariantConfig):
        return source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; give a YAML or JSON file, or a variant name")
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields, got {type(data).__name__}")
    return data


def describe_validation_error(error: ValidationError, title: str) -> str:
    """One line per problem: the field's dotted path, what was wrong, and the value given."""
    lines = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"])  # a list's item by its index: encoder.attention.1
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] not in ("missing", "value_error") and "input" in item:
            given = repr(item["input"])
            message += f" (got {given if len(given) < 60 else given[:57] + '...'})"
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    return f"invalid {title}:\n" + "\n".join(lines)


def validate(model: type[M], data: Any, title: str) -> M:
    """``model.model_validate(data)``, with a validation error turned into a one-message ConfigError."""
    try:
        return model.model_validate(data, context={"registry": get_registry()})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, title)) from None


def load_config(source: ConfigSource, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> VariantConfig:
    """A validated config from a variant name, a YAML or JSON file, a mapping, or a config.

    The mapping names a registered ``variant``; its preset values are the defaults that the
    other keys, then ``overrides`` (``["encoder.layers=2"]`` or a nested mapping), replace.

    Raises:
        ConfigError: a field is unknown, of the wrong type or out of range (each one named).
        UnknownNameError: the variant or a component kind is not registered.
    """
    if isinstance(source, str) and Path(source).suffix not in CONFIG_SUFFIXES:
        source = {"variant": source}
    data = _read(source)
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
    context = {"registry": registry}
    try:
        base = variant.config.model_validate({"variant": name}, context=context).model_dump(mode="json")
        base = variant.config.model_validate(merge(base, variant.defaults), context=context).model_dump(mode="json")
        return variant.config.model_validate(merge(base, data), context=context)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"config for variant {name!r}")) from None


def build_model(name_or_config: ConfigSource, **overrides: Any) -> nn.Module:
    """A ready model from a variant name, a config file, a mapping or a config.

    Keyword overrides replace config fields; nested fields by mapping
    (``encoder={"layers": 1}``) or by dotted key (``**{"encoder.layers": 1}``).

    >>> model = build_model("transformer-tiny", dropout=0.0)
    """
    config = load_config(name_or_config, overrides)
    model = config.build()
    if not isinstance(model, ZooModel):
        raise TypeError(
            f"{type(config).__name__}.build() returned a {type(model).__name__}; a variant's builder must "
            "return a transformer_zoo.core.model.ZooModel (EncoderDecoder is one)"
        )
    model.config = config
    return model


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
    data = weights.read_config(directory, CONFIG_NAME)
    if "variant" not in data:
        return _import(directory, data)
    path = weights.inside(directory, WEIGHTS_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"{str(directory / WEIGHTS_NAME)!r} not found; save_pretrained writes it beside {CONFIG_NAME}")
    header = weights.read_header(path)
    config = load_config(data)
    skeleton = weights.build_on_meta(config.build)
    if skeleton is not None:
        weights.check_against(skeleton, header, path)
    model = build_model(config)
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
