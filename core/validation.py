"""How options are validated: the base of every options model (unknown keys refused, numbers
checked), the base of component options, and the field type that dispatches a config value to
the registered kind it names, with the bounds every size is checked against."""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Iterator
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema
from torch import nn

from .errors import UnknownNameError

# Sizes a config may ask for. Each is far above any model trained today, and low enough that a
# typo (an extra zero or six) is refused at validation rather than hanging a build that loops
# over it or allocating what no machine has; what a whole model needs in memory is checked when
# it is built (``transformer_zoo.build_model``).
MAX_LAYERS = 1024
"""Most layers of a stack, or steps of a recurrent one."""


MAX_WIDTH = 2**17
"""Most channels of any width: ``d_model``, ``d_ff``, heads, image channels, convolution widths."""


MAX_VOCAB = 2**24
"""Most entries of a vocabulary or of a set of classes."""


MAX_LENGTH = 2**24
"""Most positions of a sequence, and so of a window, a block or a position offset."""


MAX_IMAGE_SIDE = 2**14
"""Most pixels on a side of an image."""


MAX_EXAMPLES = 2**24
"""Most examples a task generates or scores."""


MAX_BEAM = 1024
"""Widest beam of a beam search."""


MAX_EXPERTS = 4096
"""Most experts of a mixture-of-experts layer (the Switch Transformer's largest had 2048)."""


INT64 = (-(2**63), 2**63 - 1)
"""The range of every integer in a config: what a tensor, a seed or a size can hold."""


Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]
"""A positive width, for the items of a list or tuple of widths."""


class Options(BaseModel):
    """Base of every options model: unknown keys are refused, each with the closest allowed key
    suggested and the allowed keys listed.

    Numbers are checked alike in every subclass: a float must be finite (no inf or NaN), an
    integer must fit in 64 bits, and a field of numbers refuses a boolean (which Python would
    otherwise take as 1 or 0).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)

    @field_validator("*", mode="wrap")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _numbers_only(field.annotation) and _holds_bool(value):
            raise PydanticCustomError("bool_is_not_a_number", "expected a number, not a boolean")
        value = handler(value)
        if _int_out_of_range(value) is not None:
            raise PydanticCustomError("int64_range", "an integer here must fit in 64 bits (-2**63 to 2**63 - 1)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise ValueError(_unknown_keys(unknown, sorted(cls.model_fields), cls))
        return data


def _numbers_only(annotation: Any) -> bool:
    """Whether a field's type holds numbers and nothing else: ``int``, ``float``, and optional,
    tuple, list and union forms of them (so a boolean, which Python counts as an int, is wrong)."""
    if annotation in (int, float):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _numbers_only(args[0])
    if origin in (Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        return bool(kept) and all(_numbers_only(arg) for arg in kept)
    if origin in (list, tuple):
        kept = [arg for arg in args if arg is not Ellipsis]
        return bool(kept) and all(_numbers_only(arg) for arg in kept)
    return False


def _holds_bool(value: Any) -> bool:
    """Whether ``value`` is a boolean or a list or tuple holding one (at any depth)."""
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_bool(item) for item in value)


def _int_out_of_range(value: Any) -> int | None:
    """The first integer in ``value`` (a number, or a list, tuple or mapping of them, not an
    options model, which checks its own) outside :data:`INT64`; None if there is none."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if not INT64[0] <= value <= INT64[1] else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _int_out_of_range(item)
        if found is not None:
            return found
    return None


def _unknown_keys(keys: list[Any], allowed: list[str], options: type[Options]) -> str:
    """``unknown key 'windw' (did you mean 'window'?); allowed keys for attention kind 'local-global': ...``"""
    named = []
    for key in keys:
        close = difflib.get_close_matches(str(key), allowed, n=1)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    kind, category = options.model_fields.get("kind"), getattr(options, "category", "")
    what = f"{category} kind {kind.default!r}" if kind is not None and category and kind.default else options.__name__
    return (
        f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(named)}; allowed keys for {what}: {', '.join(allowed)}"
    )


class ComponentOptions(Options):
    """Base of component options. Subclasses set ``kind: Literal["name"] = "name"``.

    Every module a kind's ``build`` returns carries ``category`` and ``kind`` attributes (the
    category and kind of the options that built it), so a reader of a built model
    (``tzoo show NAME --modules``) sees what each part is without guessing from names.
    """

    category: ClassVar[str] = ""
    default_kind: ClassVar[str] = ""
    kind: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "build" in cls.__dict__:
            cls.build = _labelled(cls.__dict__["build"])

    def build(self, **context: Any) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} does not define build()")


def _labelled(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build``, its result (a module) labelled with the options' category and kind."""

    def labelled_build(self: ComponentOptions, *args: Any, **kwargs: Any) -> Any:
        built = build(self, *args, **kwargs)
        if isinstance(built, nn.Module) and "category" not in vars(built):
            built.category, built.kind = self.category, self.kind
        return built

    labelled_build.__doc__, labelled_build.__name__, labelled_build.__qualname__ = (
        build.__doc__,
        build.__name__,
        build.__qualname__,
    )
    labelled_build.__wrapped__ = build  # type: ignore[attr-defined]
    return labelled_build


class Kinds(Protocol):
    """What validation needs of a registry: the registered kinds of each category.

    :class:`transformer_zoo.registry.Registry` is one. Validation reads it from pydantic's
    validation context (``model_validate(data, context={"registry": registry})``), else from the
    process-wide registry the registry package installs with :func:`use_kinds`.
    """

    def components(self, category: str) -> dict[str, type[ComponentOptions]]: ...

    def component(self, category: str, kind: str) -> type[ComponentOptions]: ...

    def default_kind(self, category: str) -> str: ...


_default_kinds: Callable[[], Kinds] | None = None


def use_kinds(provider: Callable[[], Kinds]) -> None:
    """Install the registry that validation without a ``registry`` in its context uses."""
    global _default_kinds
    _default_kinds = provider


def kinds_from(context: Any) -> Kinds:
    """The registry in a validation context, else the installed one."""
    kinds = context.get("registry") if isinstance(context, dict) else None
    if kinds is None and _default_kinds is not None:
        kinds = _default_kinds()
    if kinds is None:
        raise RuntimeError(
            "no registry to validate component kinds against: pass context={'registry': registry} "
            "to model_validate, or import transformer_zoo (which installs its registry)"
        )
    return kinds


class ComponentField:
    """Pydantic annotation: validate a field as any registered kind of ``category``.

    Accepts a mapping with ``kind`` (the category's default kind when left out), a kind name
    alone, or an options instance; with ``many``, also a list of those (errors name the item's
    index). The JSON Schema lists every registered kind.
    """

    def __init__(self, category: str, *, many: bool = False) -> None:
        self.category = category
        self.many = many

    def _validate(self, value: Any, info: ValidationInfo) -> ComponentOptions | list[ComponentOptions]:
        kinds = kinds_from(info.context)
        if self.many and isinstance(value, (list, tuple)):
            if not value:
                raise ValueError(f"give one {self.category} kind or a non-empty list of them, got an empty list")
            return list(self._each(value, kinds, info.context))
        return self._one(value, kinds, info.context)

    def _each(self, values: list[Any], kinds: Kinds, context: Any) -> Iterator[ComponentOptions]:
        errors = []
        for index, value in enumerate(values):
            try:
                yield self._one(value, kinds, context)
            except ValidationError as error:
                errors += [
                    InitErrorDetails(
                        type=PydanticCustomError(e["type"], e["msg"].replace("{", "{{").replace("}", "}}")),
                        loc=(index, *e["loc"]),
                        input=e["input"],
                    )
                    for e in error.errors()
                ]
            except ValueError as error:
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError("value_error", str(error).replace("{", "{{").replace("}", "}}")),
                        loc=(index,),
                        input=value,
                    )
                )
        if errors:
            raise ValidationError.from_exception_data(self.category, errors)

    def _one(self, value: Any, kinds: Kinds, context: Any) -> ComponentOptions:
        if isinstance(value, ComponentOptions):
            if value.category != self.category:
                raise ValueError(f"expected {self.category} options, got {value.category} options ({value.kind!r})")
            return value
        if isinstance(value, str):
            value = {"kind": value}
        if not isinstance(value, dict):
            listing = " or a list of them" if self.many else ""
            raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError as the field's error; a TypeError escapes it
                f"expected the name of one {self.category} kind or a mapping with 'kind'{listing}, "
                f"got {type(value).__name__}"
            )
        kind = value.get("kind", kinds.default_kind(self.category))
        if not isinstance(kind, str):
            raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError as the field's error; a TypeError escapes it
                f"kind must be the name of one {self.category} kind, got {type(kind).__name__} {kind!r}; "
                f"registered: {', '.join(sorted(kinds.components(self.category)))}"
            )
        try:
            options = kinds.component(self.category, kind)
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None  # so the message carries the field's location
        return options.model_validate({**value, "kind": kind}, context=context)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def serialize(value: Any, info: Any) -> Any:
            if isinstance(value, list):
                return [item.model_dump(mode=info.mode) for item in value]
            return value.model_dump(mode=info.mode)

        return core_schema.with_info_plain_validator_function(
            self._validate, serialization=core_schema.plain_serializer_function_ser_schema(serialize, info_arg=True)
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        registry = kinds_from(None)
        kinds = registry.components(self.category)
        branches = []
        for kind, options in kinds.items():
            branch = dict(handler(options.__pydantic_core_schema__))
            if kind != registry.default_kind(self.category):  # a mapping without kind means the default
                branch["required"] = sorted({*branch.get("required", ()), "kind"})
            branches.append(branch)
        one = [{"type": "string", "enum": sorted(kinds), "description": "a kind name, with its defaults"}, *branches]
        if self.many:
            one.append(
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"anyOf": list(one)},
                    "description": "a kind for each layer in turn (layer i takes item i modulo the length)",
                }
            )
        return {"anyOf": one, "description": f"a {self.category} kind: one of {', '.join(sorted(kinds))}"}


NormPlacement = Literal["pre", "post", "sandwich", "output"]
"""Where a layer's norms go around each sub-layer ``f`` (attention, feed-forward):

- ``pre``: ``x + f(norm(x))`` (Xiong et al. 2020; GPT-2, Llama);
- ``post``: ``norm(x + f(x))``, the original Transformer's;
- ``sandwich``: ``x + norm_out(f(norm_in(x)))``, two norms per sub-layer (Gemma 2);
- ``output``: ``x + norm(f(x))``, the norm on the sub-layer's output only (OLMo 2).
"""
