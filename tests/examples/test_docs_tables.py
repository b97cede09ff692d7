"""docs/configs.md's tables against the registry: the fields of transformer-base with their values,
and the options of the built-in kinds with their defaults, so that a new field or a changed
default fails here until the page says it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from docs_pages import ROOT

import transformer_zoo as tz
from transformer_zoo.core.options import AttentionOptions, PositionalOptions
from transformer_zoo.registry import get_registry

PAGE = (ROOT / "docs" / "configs.md").read_text()
CATEGORIES = ("attention", "positional", "norm", "ffn", "stack", "head")
GENERIC = {
    "tzoo.components",
    "tzoo.efficient",
    "tzoo.talking-heads",
    "tzoo.relative",
    "tzoo.moe",
    "tzoo.differential",
    "tzoo.latent-attention",
}
"""The plugins whose kinds the page's table of options lists; a family's own kinds (the sparse
attention kinds, local 2-D attention, the recurrent stack) are on the family's page."""
BASES = {"attention": AttentionOptions, "positional": PositionalOptions}
"""Categories whose base declares fields every kind takes: the page describes the attention kinds'
once above the table, and positional random_offset in a row of the kinds that accept a value
other than its default."""


def inherited(category: str) -> set[str]:
    return set(BASES[category].model_fields) - {"kind"} if category in BASES else set()


def table(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading``, each a list of its cells."""
    after = PAGE[PAGE.index(heading) :]
    rows = re.search(r"\n(\|.*\|\n)+", after)[0].strip().splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def code(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def written(value: Any) -> str:
    """A default as the table writes it: YAML's true, false and null, Python's numbers."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def test_the_transformer_base_table_holds_every_field_with_its_value():
    config = tz.load_config("transformer-base").model_dump(exclude={"format"})
    rows = {code(row[0])[0]: row[2] for row in table("## The Transformer config")}
    assert set(rows) == set(config), "the table's fields are TransformerConfig's"
    for field, cell in rows.items():
        shown = yaml.safe_load(code(cell)[0])
        assert same(shown, config[field]), f"{field}: the page says {cell}, transformer-base has {config[field]}"


def same(shown: Any, actual: Any) -> bool:
    """Whether the table's value is ``actual``: a mapping with every key, a kind name alone for that
    kind with its defaults."""
    if isinstance(actual, dict) and isinstance(shown, str) and "kind" in actual:
        return actual == get_registry().component(category_of(actual), shown)().model_dump() | {"kind": shown}
    if isinstance(actual, dict):
        return isinstance(shown, dict) and set(shown) == set(actual) and all(same(shown[k], actual[k]) for k in actual)
    return shown == actual


def category_of(options: dict[str, Any]) -> str:
    (category,) = [c for c in CATEGORIES if options["kind"] in get_registry().components(c)]
    return category


def documented() -> dict[tuple[str, str], dict[str, str]]:
    """(category, kind) -> {field: the default the table gives}."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for row in table("### Component options"):
        category = row[0].split()[0]
        for kind in code(row[0]):
            fields = out.setdefault((category, kind), {})
            if code(row[1]):
                fields[code(row[1])[0]] = code(row[3])[0] if code(row[3]) else row[3]
    return out


def built_in() -> list[tuple[str, str]]:
    registry = get_registry()
    return [(c, kind) for c in CATEGORIES for kind in registry.components(c) if registry.provider(c, kind) in GENERIC]


@pytest.mark.parametrize(("category", "kind"), built_in())
def test_the_options_table_lists_each_kinds_fields_with_their_defaults(category, kind):
    options = get_registry().component(category, kind)
    fields = {name: field for name, field in options.model_fields.items() if name != "kind"}
    rows = documented().get((category, kind))
    assert rows is not None, f"docs/configs.md's table of options has no row for {category} {kind!r}"
    own = set(fields) - inherited(category)
    assert own <= set(rows) <= set(fields), f"{category} {kind!r}: the page has {sorted(rows)}, the kind {sorted(own)}"
    for name, default in rows.items():
        assert default == written(fields[name].default), (
            f"{category} {kind!r}: {name} defaults to {fields[name].default}"
        )


def test_the_options_table_names_only_kinds_there_are():
    assert set(documented()) <= set(built_in())


def test_the_fields_every_attention_kind_takes_are_named_above_the_table():
    text = PAGE[PAGE.index("### Component options") : PAGE.index("| kind | field |")]
    assert not [field for field in sorted(inherited("attention")) if f"`{field}`" not in text]
