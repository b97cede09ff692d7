"""Reading configs: YAML and JSON files (a repeated key is an error), ``--set key=value``
overrides, deep merging, and validation into a pydantic model with one message per problem.

Used by :mod:`transformer_zoo.api` (model configs), :mod:`transformer_zoo.training` (training
configs) and :mod:`transformer_zoo.comparing` (specs and studies).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .core.errors import ConfigError
from .core.options import VariantConfig
from .registry import get_registry

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

ConfigSource = str | os.PathLike | Mapping[str, Any] | VariantConfig
M = TypeVar("M", bound=BaseModel)


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into ``base``; a mapping whose ``kind`` changes replaces the old one.

    A bare kind name stands for ``{"kind": name}``: with the same kind it keeps the options.
    """
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, str) and "kind" in old:
            value = {"kind": value}  # a bare kind name: keep the options given so far if the kind is unchanged
        if (
            isinstance(old, Mapping)
            and isinstance(value, Mapping)
            and value.get("kind", old.get("kind")) == old.get("kind")
        ):
            out[key] = merge(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that sets one key twice (YAML requires keys to be
    unique; PyYAML would keep the last value silently). Merge keys (``<<: *base``) may still be
    overridden: that is what they are for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the constructor below says so
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is set twice (first on line {first.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def load_yaml(text: str, name: str | None = None) -> Any:
    """``yaml.safe_load(text)``, but a mapping that sets one key twice is a ``yaml.YAMLError``;
    its errors name ``name`` (the file the text came from) where given."""
    loader = _UniqueKeyLoader(text)  # a safe loader: plain data only
    if name is not None:
        loader.name = name  # what error marks call the source, rather than "<unicode string>"
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a ValueError if one key comes twice (the last would win)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is set twice in one object; keep one")
        out[key] = value
    return out


def load_json(text: str) -> Any:
    """``json.loads(text)``, but an object that sets one key twice is a ValueError."""
    return json.loads(text, object_pairs_hook=_unique_keys)


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
            try:
                value = load_yaml(text) if text.strip() else ""
            except yaml.YAMLError as exc:
                problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
                raise ConfigError(
                    f"override {item!r}: the value {text!r} is not valid YAML ({problem}); write a list as [0.1, 0.2], "
                    f"a mapping as {{window: 8}}, or quote text: {key.strip()}={json.dumps(text)}"
                ) from None
            pairs.append((key.strip(), value))
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


def is_folder_path(text: str) -> bool:
    """Whether ``text`` is a path to a folder (it has a separator, which no variant name has)."""
    return ("/" in text or os.sep in text) and Path(text).is_dir()


def read_config(
    source: ConfigSource, what: str = "config file", accepts: str = "a YAML or JSON file, or a variant name"
) -> dict[str, Any]:
    """The mapping of fields in ``source`` (a config, a mapping, or a YAML or JSON file).

    Args:
        what, accepts: what the file is and what else the caller takes, for the message of a
            path that is no file.

    Raises:
        ConfigError: the file is missing, a folder, not YAML or JSON, or not a mapping.
    """
    if isinstance(source, VariantConfig):
        return source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source)
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder; give {accepts}")
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist; give {accepts}")
    try:
        data = load_json(path.read_text()) if path.suffix == ".json" else load_yaml(path.read_text(), str(path))
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # ValueError: bad JSON, a repeated key, not UTF-8
        raise ConfigError(
            f"config file {str(path)!r} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from None
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
