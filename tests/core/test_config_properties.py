"""Generated configs, careless and hostile: each one builds, or is refused with the zoo's error.

The strategies draw over the fields of the registered variants and component kinds: real and
bogus keys, kinds as names, lists, mappings and numbers, huge, negative and non-finite numbers,
booleans, empty lists and nested mappings, and ``key=value`` overrides as a user types them.
Every example must finish quickly and raise nothing but
:class:`~transformer_zoo.ConfigError` or :class:`~transformer_zoo.UnknownNameError`.
"""

from __future__ import annotations

import math
import signal
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_zoo as tz
from transformer_zoo import api
from transformer_zoo.core.options import CATEGORIES
from transformer_zoo.core.validation import ComponentField
from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import TrainConfig, load_train_config

SECONDS = 5.0  # a hang guard: a first build pays one-off imports, and this machine is shared
"""The most one example may take, validation and build together."""
MODEL_BYTES = 64 * 2**20
"""The memory limit models are built under here: larger ones are refused, not allocated."""
ZOO_ERRORS = (tz.ConfigError, tz.UnknownNameError)

REGISTRY = get_registry()
VARIANTS = tz.list_variants()
TINY = [name for name in VARIANTS if name.endswith("-tiny") or name == "sagan-gan"]
KINDS = {category: sorted(REGISTRY.components(category)) for category in CATEGORIES}
BOGUS = ["", "nope", "sdpa ", "LAYERNORM", "transformer-tinyy", "0", "kind"]


def _fields(model: type) -> dict[str, Any]:
    return dict(model.model_fields)


def _component_category(field: Any) -> str | None:
    """The category a ``ComponentField`` annotation validates, else None."""
    for meta in field.metadata:
        if isinstance(meta, ComponentField):
            return meta.category
    return None


FIELD_NAMES = sorted(
    {name for variant in VARIANTS for name in _fields(REGISTRY.variant(variant).config)}
    | {
        name
        for category in CATEGORIES
        for options in REGISTRY.components(category).values()
        for name in _fields(options)
    }
)

HUGE_INTS = [2**31, 2**53 + 1, 10**12, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**19, 10**30, 10**400]
ODD_FLOATS = [math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, -0.0]

numbers = st.one_of(
    st.integers(-3, 70),
    st.sampled_from(HUGE_INTS),
    st.sampled_from(ODD_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
kind_names = st.sampled_from(sorted({k for kinds in KINDS.values() for k in kinds}) + BOGUS)
kinds = st.one_of(
    kind_names,
    st.lists(kind_names, max_size=2),
    st.dictionaries(st.sampled_from(["kind", "a"]), kind_names, max_size=2),
    numbers,
    st.none(),
)
scalars = st.one_of(numbers, st.none(), st.text(max_size=6), kind_names)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from([*FIELD_NAMES, "kind", "bogus"]), inner, max_size=3),
    ),
    max_leaves=6,
)


def plausible(annotation: Any) -> st.SearchStrategy:
    """Values a careful user might give a field of type ``annotation``: small sizes (powers of two
    divide one another, as widths and heads must), fractions, the literals allowed."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.sampled_from([0, 1, 2, 4, 8, 16, 32, 3, 6])
    if annotation is float:
        return st.floats(0.0, 1.0) | st.sampled_from([1e-6, 2.0, 100.0])
    if annotation is str:
        return kind_names
    if origin is Annotated:
        return plausible(args[0])
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of([plausible(arg) for arg in args])
    if annotation is type(None):
        return st.none()
    if origin is tuple:
        return st.tuples(*(plausible(arg) for arg in args if arg is not Ellipsis))
    if origin is list:
        return st.lists(plausible(args[0]), max_size=3)
    return values


@st.composite
def component(draw: st.DrawFn, category: str, depth: int = 0) -> Any:
    """A value for a field of ``category``: a kind (real or bogus, in any shape) with options."""
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return draw(kinds)
    if shape == 1:
        return draw(values)
    kind = draw(st.sampled_from(KINDS[category]))
    out: dict[str, Any] = {"kind": kind} if draw(st.booleans()) else {}
    options = REGISTRY.component(category, kind)
    out.update(draw(options_of(options, depth + 1)))
    if category == "attention" and draw(st.integers(0, 5)) == 0:
        return draw(st.lists(st.just(out) | component("attention", depth + 1), max_size=2))
    return out


@st.composite
def options_of(draw: st.DrawFn, model: type, depth: int = 0) -> dict[str, Any]:
    """A few of ``model``'s fields with drawn values, sometimes with an unknown key."""
    fields = {name: field for name, field in _fields(model).items() if name not in ("kind", "variant")}
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)) if fields else []
    out: dict[str, Any] = {}
    for name in chosen:
        category = _component_category(fields[name])
        roll = draw(st.integers(0, 9))
        if category is not None and depth < 3:
            out[name] = draw(component(category, depth))
        elif roll < 6:
            out[name] = draw(plausible(fields[name].annotation))
        elif roll < 9:
            out[name] = draw(numbers | st.none() | st.just([]) | st.lists(numbers, max_size=3))
        else:
            out[name] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        out[draw(st.sampled_from(["bogus", "dmodel", "kind"]))] = draw(scalars)
    return out


@st.composite
def model_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A config mapping over a registered variant (now and then a bogus or a mistyped one)."""
    roll = draw(st.integers(0, 19))
    if roll == 0:
        variant: Any = draw(st.sampled_from([*BOGUS, 7, None, ["bert"]]))
    else:  # mostly small presets, which build within the memory limit here
        variant = draw(st.sampled_from(TINY if roll > 4 else VARIANTS))
    config = REGISTRY.variant(variant).config if variant in VARIANTS else REGISTRY.variant("transformer-tiny").config
    return {"variant": variant, **draw(options_of(config))}


yaml_text = st.one_of(
    st.text(alphabet="[]{}:,'\"!&*#|>-. 0123456789abexn\\\t", max_size=12),
    st.sampled_from(
        [
            ".inf",
            "-.inf",
            ".nan",
            "true",
            "no",
            "[0.1",
            "{a: 1",
            "1e400",
            "0x10",
            "~",
            "*a",
            "!!binary x",
            str(10**30),
            "[]",
            "{}",
            "{kind: []}",
            "{kind: {a: 1}}",
            "- 1",
            "'",
            "a: b: c",
        ]
    ),
)


@contextmanager
def _limited(seconds: float) -> Iterator[None]:
    """Fail an example that runs past ``seconds`` (a hang), rather than hang the suite."""

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError(f"an example ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds * 3)  # generous: the deadline below is the real limit
    start = time.thread_time()  # the work itself: another process on the machine does not count
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.thread_time() - start < seconds * 1.5


def _builds_or_refuses(build: Any) -> None:
    with _limited(SECONDS), mock.patch.object(api, "memory_limit", return_value=MODEL_BYTES):
        try:
            build()
        except ZOO_ERRORS as error:
            assert str(error).strip(), "a refusal says why"


# no wall-clock deadline: _limited bounds each example by the thread's own time, which a busy machine does not inflate
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.heavy
@PROPERTY
@given(model_configs())
def test_a_generated_model_config_builds_or_is_refused(config):
    _builds_or_refuses(lambda: tz.build_model(config))


@settings(PROPERTY, max_examples=60)
@given(
    st.sampled_from(VARIANTS),
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    *FIELD_NAMES,
                    "encoder.layers",
                    "decoder.attention",
                    "norm.kind",
                    "norm.eps",
                    "head.kind",
                    "encoder.attention.window",
                    "a..b",
                    ".",
                    "",
                ]
            ),
            yaml_text,
        ),
        max_size=3,
    ),
)
def test_generated_overrides_as_typed_build_or_are_refused(variant, pairs):
    _builds_or_refuses(lambda: tz.build_model(tz.load_config(variant, [f"{key}={text}" for key, text in pairs])))


@st.composite
def train_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A training config mapping: a model, a task with drawn options, and drawn run fields."""
    out: dict[str, Any] = {"model": draw(st.sampled_from(VARIANTS) | values), "task": draw(component("task"))}
    out.update(draw(options_of(TrainConfig)))
    return out


@settings(PROPERTY, max_examples=100)
@given(train_configs())
def test_a_generated_training_config_validates_or_is_refused(config):
    _builds_or_refuses(lambda: load_train_config(config))
