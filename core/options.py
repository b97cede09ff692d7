"""Options models: the validated boundary between configs and modules.

Every component (attention, positional, norm, ffn, stack, head) declares one options model:
a subclass of its category's base below with a ``kind`` literal, a described field per
option, and a ``build`` method that unpacks the options into explicit constructor
arguments. A config field annotated with ``Attention``, ``Norm``, ... accepts any registered
kind of that category, built-in or third-party, dispatched on ``kind``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, model_validator
from pydantic_core import core_schema
from torch import nn

from .errors import UnknownNameError


class Options(BaseModel):
    """Base of every options model: unknown keys are rejected with the allowed ones listed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = set(cls.model_fields)
            for key in data:
                if key not in allowed:
                    close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(
                        f"unknown key {key!r}{hint}; allowed keys for {cls.__name__}: {', '.join(sorted(allowed))}"
                    )
        return data


class ComponentOptions(Options):
    """Base of component options. Subclasses set ``kind: Literal["name"] = "name"``."""

    category: ClassVar[str] = ""
    default_kind: ClassVar[str] = ""
    kind: str

    def build(self, **context: Any) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} does not define build()")


class AttentionOptions(ComponentOptions):
    """Attention kinds. ``build(d_model=, n_heads=, dropout=, positional=)`` returns a module
    called as ``attn(x, memory=None, *, mask, cache, need_weights) -> (out, weights)``."""

    category: ClassVar[str] = "attention"
    default_kind: ClassVar[str] = "sdpa"
    full: ClassVar[bool] = True  # every query may see every key the mask allows (False: a sparse or compressed kind)

    def check(self, *, max_len: int) -> None:
        """Raise a ValueError if these options cannot work with sequences of up to ``max_len``."""


class PositionalOptions(ComponentOptions):
    """Positional kinds. ``build(d_model=, n_heads=, max_len=)`` returns an additive module
    ``pos(x, offset) -> x'`` or an :class:`~transformer_zoo.core.attention.AttentionPositional`."""

    category: ClassVar[str] = "positional"
    default_kind: ClassVar[str] = "sinusoidal"


class NormOptions(ComponentOptions):
    """Norm kinds. ``build(d_model=)`` returns a module on ``(B, T, D)``."""

    category: ClassVar[str] = "norm"
    default_kind: ClassVar[str] = "layernorm"


class FFNOptions(ComponentOptions):
    """Feed-forward kinds. ``build(d_model=, d_ff=, dropout=)`` returns a module on ``(B, T, D)``."""

    category: ClassVar[str] = "ffn"
    default_kind: ClassVar[str] = "mlp"


class HeadOptions(ComponentOptions):
    """Head kinds. ``build(d_model=, vocab_size=, embedding=, pad_id=, dropout=)`` returns a module
    ``head(hidden, mask) -> logits`` with ``loss(logits, targets)``."""

    category: ClassVar[str] = "head"
    default_kind: ClassVar[str] = "lm"


class ComponentField:
    """Pydantic annotation: validate a field as any registered kind of ``category``.

    Accepts a mapping with ``kind`` (the category's default kind when left out), a kind name
    alone, or an options instance. The JSON Schema lists every registered kind.
    """

    def __init__(self, category: str) -> None:
        self.category = category

    def _validate(self, value: Any) -> ComponentOptions:
        from ..registry import get_registry

        if isinstance(value, ComponentOptions):
            if value.category != self.category:
                raise ValueError(f"expected {self.category} options, got {value.category} options ({value.kind!r})")
            return value
        if isinstance(value, str):
            value = {"kind": value}
        if not isinstance(value, dict):
            raise ValueError(
                f"expected a {self.category} kind name or a mapping with 'kind', got {type(value).__name__}"
            )
        registry = get_registry()
        kind = value.get("kind", registry.default_kind(self.category))
        try:
            options = registry.component(self.category, kind)
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None  # so the message carries the field's location
        return options.model_validate({**value, "kind": kind})

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value, info: value.model_dump(mode=info.mode), info_arg=True
            ),
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        from ..registry import get_registry

        registry = get_registry()
        kinds = registry.components(self.category)
        branches = []
        for kind, options in kinds.items():
            branch = dict(handler(options.__pydantic_core_schema__))
            if kind != registry.default_kind(self.category):  # a mapping without kind means the default
                branch["required"] = sorted({*branch.get("required", ()), "kind"})
            branches.append(branch)
        return {
            "anyOf": [{"type": "string", "enum": sorted(kinds), "description": "a kind name, with its defaults"}, *branches],
            "description": f"a {self.category} kind: one of {', '.join(sorted(kinds))}",
        }


Attention = Annotated[AttentionOptions, ComponentField("attention")]
Positional = Annotated[PositionalOptions, ComponentField("positional")]
Norm = Annotated[NormOptions, ComponentField("norm")]
FFN = Annotated[FFNOptions, ComponentField("ffn")]
Head = Annotated[HeadOptions, ComponentField("head")]


class StackOptions(ComponentOptions):
    """Stack kinds: how ``layers`` are applied. ``build(make_layer=, final_norm=, d_model=)`` returns a module
    called as ``stack(x, memory=None, *, self_mask, memory_mask, cache, need_weights) -> StackOutput``;
    ``make_layer(i)`` returns a fresh i-th layer with the attention kinds chosen here."""

    category: ClassVar[str] = "stack"
    default_kind: ClassVar[str] = "standard"

    layers: int = Field(6, ge=1, description="number of layer applications (depth)")
    attention: Attention | list[Attention] = Field(
        "sdpa", validate_default=True,
        description="self-attention kind, or a list of kinds that layer i takes in turn (i modulo its length)",
    )
    cross_attention: Attention = Field(
        "sdpa", validate_default=True, description="attention to the encoder memory (decoders of encoder-decoders)"
    )

    def attention_at(self, index: int) -> AttentionOptions:
        """The self-attention kind of layer ``index``."""
        kinds = self.attention if isinstance(self.attention, list) else [self.attention]
        return kinds[index % len(kinds)]

    def build(self, *, make_layer: Callable[[int], nn.Module], final_norm: nn.Module | None, d_model: int) -> nn.Module:
        raise NotImplementedError


Stack = Annotated[StackOptions, ComponentField("stack")]

class TaskOptions(ComponentOptions):
    """Task kinds. ``build()`` returns a :class:`~transformer_zoo.core.tasks.Task`: its data,
    what it needs from a model, and how it is scored."""

    category: ClassVar[str] = "task"
    default_kind: ClassVar[str] = "reverse"

    seed: int = Field(0, description="seed of the generated data and of its split")

    def build(self, **context: Any) -> Any:
        raise NotImplementedError

    def with_assets(self, directory: Path) -> TaskOptions:
        """These options, reading what ``Task.save_assets`` wrote into ``directory`` (if anything)."""
        return self


Task = Annotated[TaskOptions, ComponentField("task")]

CATEGORIES: dict[str, type[ComponentOptions]] = {
    base.category: base
    for base in (AttentionOptions, PositionalOptions, NormOptions, FFNOptions, StackOptions, HeadOptions, TaskOptions)
}


class VariantConfig(Options):
    """Base of a family's config: every field a user may set for that family.

    Subclasses set ``family`` and implement ``build()``, returning a
    :class:`~transformer_zoo.core.model.ZooModel`.
    """

    family: ClassVar[str] = ""
    inputs: ClassVar[str] = "tokens"  # what forward() reads: token ids (src, tgt) or an image

    variant: str = Field(description="the registered variant this config started from")

    def build(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} does not define build()")


class Variant(BaseModel):
    """A registered variant: a family's config class and the values that make this preset.

    Attributes:
        name: the name users build it by (``transformer-tiny``).
        config: the family's :class:`VariantConfig` subclass.
        defaults: field values over the config's defaults (nested mappings allowed).
        description: one line for ``tzoo list``.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(description="the name users build it by")
    config: type[VariantConfig] = Field(description="the family's config class")
    defaults: dict[str, Any] = Field(default_factory=dict, description="values over the config's defaults")
    description: str = Field("", description="one line for tzoo list")
