"""Options models: the validated boundary between configs and modules.

Every component (attention, positional, norm, ffn, stack, head) declares one options model:
a subclass of its category's base below with a ``kind`` literal, a described field per
option, and a ``build`` method that unpacks the options into explicit constructor
arguments. A config field annotated with :data:`AttentionField`, :data:`NormField`, ... (one
``<Category>Field`` per category) accepts any registered kind of that category, built-in or
third-party, dispatched on ``kind``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
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

from .attention import AttentionPositional, Kernel, MultiHeadAttention, kv_heads_problem, sdpa_kernel
from .errors import UnknownNameError

# ---- bounds ---------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class LayerSpec:
    """What every layer of a stack shares, described once by the family and handed whole to the
    stack builder (:func:`~transformer_zoo.core.builders.stack`): the sizes, the dropout, the
    feed-forward and norm kinds, the norms' placement, and what every attention kind reads
    besides its own options (the in-attention positions, the token grid).

    A family makes it with :meth:`VariantConfig.layer_spec`, which reads each field from the
    config field of the same name, so an option every layer takes is one field here (and one in
    the configs' shared fields, :class:`LayerFields`): no family forwards it by hand. Attention
    kinds receive the whole spec (:meth:`AttentionOptions.build`).

    Attributes:
        d_model, n_heads, d_ff: the widths and heads.
        dropout: on residuals and attention weights.
        ffn, norm: the feed-forward and norm kinds (None only for a spec that builds attention alone).
        norm_placement: norm before each sub-layer (``pre``) or after the residual (``post``).
        final_norm: a norm after the last layer; None: only with pre placement.
        in_attention: the built in-attention positional scheme (rotary, ALiBi) of the self-attention, or None.
        grid: ``(rows, columns)`` of the token grid in image models; None for sequences.
    """

    d_model: int
    n_heads: int
    d_ff: int = 0
    dropout: float = 0.0
    ffn: FFNOptions | None = None
    norm: NormOptions | None = None
    norm_placement: Literal["pre", "post"] = "post"
    final_norm: bool | None = None
    in_attention: AttentionPositional | None = None
    grid: tuple[int, int] | None = None

    @property
    def pre_norm(self) -> bool:
        return self.norm_placement == "pre"

    @property
    def uses_final_norm(self) -> bool:
        return self.pre_norm if self.final_norm is None else self.final_norm


class AttentionOptions(ComponentOptions):
    """Attention kinds: a kernel and the options that choose it.

    ``build(layer)`` returns a module called as
    ``attn(x, memory=None, *, mask, cache, need_weights) -> (out, weights)``: an instance of the
    kind's :attr:`module` class (:class:`~transformer_zoo.core.attention.MultiHeadAttention` by
    default), built once, here, for every kind, from the layer's :class:`LayerSpec`.
    :meth:`common_arguments` gives it what every kind shares (the fields ``bias``, ``scale`` and
    ``n_kv_heads``, and the layer's dropout and in-attention positions); :meth:`module_arguments`
    gives it what is the kind's own (by default its kernel, from :meth:`make_kernel`). A new kind
    declares its fields and overrides :meth:`make_kernel`; a kind that changes keys and values (or
    keeps parameters of its own) also sets :attr:`module` to a ``MultiHeadAttention`` subclass
    with its ``kernel_inputs`` hook, and overrides :meth:`module_arguments` for that class's own
    arguments. A kind does not override :meth:`build`: a common option added to
    :meth:`common_arguments` then reaches every kind with no edit in any of them.

    Every kind has the three fields below, ``bias``, ``scale`` and ``n_kv_heads``. What a kind can
    take is declared by the class variables ``full``, ``takes_bias``, ``takes_positions``,
    ``takes_scale``, ``takes_causal``, ``self_only`` and ``needs_grid``, each with the default
    given here; a kind that differs says so in its own class body, and nothing is inferred from
    which methods it overrides. :meth:`check_use` checks them all, in one place, for one use of
    the kind (the stacks call it: :meth:`StackOptions.check`); a kind's own option values are
    checked by :meth:`check`. The table of these capabilities is in the plugin guide
    (docs/writing-a-plugin.md, "What a kind can take").
    """

    category: ClassVar[str] = "attention"
    default_kind: ClassVar[str] = "sdpa"
    module: ClassVar[type[nn.Module]] = MultiHeadAttention
    """The class :meth:`build` instantiates as ``module(d_model, n_heads, **common_arguments(...),
    **module_arguments(...))``."""
    full: ClassVar[bool] = True
    """Whether every query sees every key the mask allows, by softmax attention. False for sparse
    and compressed kinds, and for kinds that see every key another way (linear attention): a
    comparison measures a model with such a kind beside twins with a full kind in its place."""
    takes_bias: ClassVar[bool] = True
    """Whether the kernel adds a positional bias to every query-key score (a scheme whose options
    set ``scores_bias``: ALiBi, T5's bias, Shaw's relative keys)."""
    takes_positions: ClassVar[bool] = True
    """Whether the kind can apply a positional scheme that acts inside attention (``in_attention``) at all: rotate
    its keys, or bias their scores. False for a kind that keeps running sums over keys rather than
    the keys (linear attention), which no later call could rotate."""
    takes_scale: ClassVar[bool] = True
    """Whether the kind honours ``scale``: its module multiplies the queries by it (as
    ``MultiHeadAttention`` does) and its kernel divides the scores by ``sqrt(d_head)``, as SDPA
    does. A kind that does not (its own temperature, a kernel that is not softmax attention) sets
    ``takes_scale: ClassVar[bool] = False`` in its class body, and a non-null ``scale`` is then
    refused at validation rather than silently ignored."""
    takes_causal: ClassVar[bool] = True
    """Whether the kind can be a decoder's (causal) self-attention, where no query sees a later
    key. False for a kind whose every key mixes positions, later ones included (Linformer's
    projections, BigBird's global and random blocks) or whose rule has no causal form (local 2-D
    attention): a config with such a kind in a decoder is refused at validation, not at the first
    forward pass."""
    self_only: ClassVar[bool] = False
    """Whether the kind is for self-attention only: its rule is over the positions of one sequence
    (a sparse pattern, a convolution over positions), so an encoder-decoder refuses it as the
    decoder's ``cross_attention``."""
    needs_grid: ClassVar[bool] = False
    """Whether the kind runs over a 2-D grid of tokens (local 2-D attention), so only a model that
    knows its grid (an image model) can use it."""

    bias: bool = Field(True, description="bias on the query, key, value and output projections")
    scale: float | None = Field(
        None,
        gt=0,
        description="factor on the query-key dot products; None: 1/sqrt(d_head) "
        "(Vaswani et al. 2017); 1.0: unscaled dot products",
    )
    n_kv_heads: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="key/value heads, a divisor of n_heads, each shared by n_heads / "
        "n_kv_heads query heads (grouped-query attention); 1: multi-query; null: n_heads",
    )

    @model_validator(mode="after")
    def _scale_is_taken(self) -> AttentionOptions:
        if self.scale is not None and not self.takes_scale:
            raise ValueError(
                f"{self.kind} attention does not apply scale (its module or kernel does not take it); "
                "remove scale, or use kind: sdpa"
            )
        return self

    def check_use(
        self,
        *,
        n_heads: int,
        max_len: int,
        positional: PositionalOptions | None = None,
        causal: bool = False,
        cross: bool = False,
        grid: tuple[int, int] | None = None,
    ) -> None:
        """Raise a ValueError if this kind cannot be used so: every declared capability checked in
        one place, then the kind's own :meth:`check`.

        Args:
            n_heads: the model's heads (``n_kv_heads`` must divide them).
            max_len: the longest sequence the model takes.
            positional: the model's positional kind (in-attention schemes are checked against
                ``takes_bias`` and ``takes_positions``); None for cross-attention, which takes none.
            causal: the kind is a decoder's self-attention (``takes_causal``).
            cross: the kind attends to an encoder's memory (``self_only``).
            grid: ``(rows, columns)`` of the token grid in image models; None for sequences (``needs_grid``).
        """
        if self.n_kv_heads is not None and n_heads % self.n_kv_heads:
            raise ValueError(kv_heads_problem(n_heads, self.n_kv_heads))
        if cross and self.self_only:
            raise ValueError(
                f"{self.kind} attention is for self-attention (its rule is over the positions of one "
                "sequence), not attention to the encoder's memory; keep cross_attention: sdpa"
            )
        if causal and not self.takes_causal:
            raise ValueError(
                f"{self.kind} attention cannot be causal (a query would see later positions), so it "
                "cannot be a decoder's self-attention; use it in an encoder, or give the decoder a "
                "kind that can be causal (sdpa, sliding-window, block-local, linear)"
            )
        if self.needs_grid and grid is None:
            raise ValueError(
                f"{self.kind} attention runs over a grid of image patches: use it in an image model "
                "(vit-tiny, image-transformer-tiny), which knows the grid"
            )
        if positional is not None and positional.scores_bias and not self.takes_bias:
            raise ValueError(
                f"{self.kind} attention does not form every query-key score, so it cannot add the bias "
                f"{positional.kind} positions put on them; use sinusoidal, learned or rotary positions"
            )
        if positional is not None and positional.in_attention and not self.takes_positions:
            raise ValueError(
                f"{self.kind} attention keeps running sums over keys, not the keys, so it cannot apply "
                f"{positional.kind} positions to them; use sinusoidal or learned positions"
            )
        self.check(max_len=max_len, grid=grid)

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        """Raise a ValueError if the kind's own option values cannot work with sequences of up to
        ``max_len`` (or, for a kind that ``needs_grid``, with the token ``grid``). The one method a
        kind overrides to refuse what it cannot take; :meth:`check_use` calls it."""

    def make_kernel(self) -> Kernel:
        """The kind's kernel ``(q, k, v, mask, bias, dropout_p, need_weights) -> (out, weights)``
        (:class:`~transformer_zoo.core.attention.Kernel`); full attention on SDPA by default."""
        return sdpa_kernel

    def common_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        """The constructor arguments every kind's :attr:`module` takes: the shared fields and the
        layer's dropout and in-attention positions. The one place a common option is passed on."""
        return dict(
            dropout=layer.dropout,
            bias=self.bias,
            positional=layer.in_attention,
            scale=self.scale,
            n_kv_heads=self.n_kv_heads,
        )

    def module_arguments(self, *, d_model: int, n_heads: int, grid: tuple[int, int] | None) -> dict[str, Any]:
        """The constructor arguments that are the kind's own: ``kernel=make_kernel()`` by default.
        A kind whose :attr:`module` takes more (or builds its own kernel) overrides this.

        Args:
            d_model, n_heads: the model's width and heads (a kernel with per-head parameters reads them).
            grid: ``(rows, columns)`` of the token grid in image models; None for sequences. Kinds
                over a grid read it; the others ignore it.
        """
        return dict(kernel=self.make_kernel())

    def build(self, layer: LayerSpec) -> nn.Module:
        """The attention module of a layer described by ``layer``: :attr:`module` given
        :meth:`common_arguments` and :meth:`module_arguments`. Cross-attention is built from the
        same spec without its positions (``dataclasses.replace(layer, in_attention=None)``)."""
        return self.module(
            layer.d_model,
            layer.n_heads,
            **self.common_arguments(layer),
            **self.module_arguments(d_model=layer.d_model, n_heads=layer.n_heads, grid=layer.grid),
        )


class PositionalOptions(ComponentOptions):
    """Positional kinds. ``build(d_model=, n_heads=, max_len=)`` returns an additive module
    ``pos(x, offset) -> x'`` or an :class:`~transformer_zoo.core.attention.AttentionPositional`."""

    category: ClassVar[str] = "positional"
    default_kind: ClassVar[str] = "sinusoidal"
    in_attention: ClassVar[bool] = False
    """Whether the scheme acts inside attention: its ``build`` returns an
    :class:`~transformer_zoo.core.attention.AttentionPositional` (rotary, ALiBi, relative biases)
    rather than a module added to the embeddings. Attention kinds that cannot apply one
    (``takes_positions = False``) refuse it at validation."""
    scores_bias: ClassVar[bool] = False  # adds a bias to the attention scores (ALiBi): a kernel must take bias
    relative: ClassVar[bool] = False
    """Whether the scheme depends only on query-key distance, so shifting every position changes
    nothing (rotary, ALiBi); such a scheme refuses ``random_offset``."""

    random_offset: int = Field(
        0,
        ge=0,
        le=MAX_LENGTH,
        description="in training, each sequence's positions start at an offset drawn uniformly from "
        "[0, random_offset) (Dehghani et al. 2018, section 3.3); 0: off. Built for max_len + random_offset positions",
    )

    @model_validator(mode="after")
    def _offset_needs_absolute_positions(self) -> PositionalOptions:
        if self.random_offset and self.relative:
            raise ValueError(
                f"{self.kind} positions depend only on the distance between query and key, so a random "
                f"offset changes no score; remove random_offset, or use sinusoidal or learned positions"
            )
        return self


class NormOptions(ComponentOptions):
    """Norm kinds. ``build(d_model=)`` returns a module on ``(B, T, D)``."""

    category: ClassVar[str] = "norm"
    default_kind: ClassVar[str] = "layernorm"


class FFNOptions(ComponentOptions):
    """Feed-forward kinds. ``build(d_model=, d_ff=, dropout=)`` returns a module on ``(B, T, D)``.

    A module whose class sets ``takes_padding = True`` is called as ``ffn(x, real=real)``
    (:class:`~transformer_zoo.core.layers.TransformerLayer`); one that sets its ``routing`` to a
    :class:`~transformer_zoo.core.layers.Routing` in its forward (a mixture of experts) has its
    load-balancing loss added to the model's loss and its routing reported by the stacks.
    """

    category: ClassVar[str] = "ffn"
    default_kind: ClassVar[str] = "mlp"


class HeadOptions(ComponentOptions):
    """Head kinds. ``build(d_model=, vocab_size=, embedding=, pad_id=, dropout=)`` returns a module
    ``head(hidden, mask) -> logits`` with ``loss(logits, targets)``."""

    category: ClassVar[str] = "head"
    default_kind: ClassVar[str] = "lm"


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


# The field types of configs: ``<Category>Field`` validates a value as any registered kind of
# that category (the ``<Category>Options`` class above is the base those kinds subclass).
AttentionField = Annotated[AttentionOptions, ComponentField("attention")]
PositionalField = Annotated[PositionalOptions, ComponentField("positional")]
NormField = Annotated[NormOptions, ComponentField("norm")]
FFNField = Annotated[FFNOptions, ComponentField("ffn")]
HeadField = Annotated[HeadOptions, ComponentField("head")]


class StackOptions(ComponentOptions):
    """Stack kinds: how layers are applied.

    The family builds :attr:`layer_count` layers (layer ``i`` with :meth:`attention_at` ``(i)``)
    and calls ``build(layers=, final_norm=, d_model=, signal=)``, which returns a module called
    as ``stack(x, memory=None, *, self_mask, memory_mask, cache, need_weights) -> StackOutput``.
    ``signal`` is given to a :attr:`recurrent` kind only: what it adds before each step.
    """

    category: ClassVar[str] = "stack"
    default_kind: ClassVar[str] = "standard"
    recurrent: ClassVar[bool] = False  # applies one shared layer step after step, adding a per-step signal

    layers: int = Field(6, ge=1, le=MAX_LAYERS, description="number of layer applications (depth)")
    attention: Annotated[AttentionOptions | list[AttentionOptions], ComponentField("attention", many=True)] = Field(
        "sdpa",
        validate_default=True,
        description="self-attention kind, or a list of kinds that layer i takes in turn (i modulo its length)",
    )
    cross_attention: AttentionField = Field(
        "sdpa", validate_default=True, description="attention to the encoder memory (decoders of encoder-decoders)"
    )
    rezero: bool = Field(
        False,
        description="ReZero (Bachlechner et al. 2020): each sub-layer adds alpha * F(x), alpha a learned scalar "
        "starting at 0, and the layers have no norms (a final norm is kept where the config asks for one)",
    )

    @property
    def layer_count(self) -> int:
        """How many distinct layers :meth:`build` takes: ``layers``, or 1 for a shared layer."""
        return 1 if self.recurrent else self.layers

    def attention_at(self, index: int) -> AttentionOptions:
        """The self-attention kind of layer ``index``."""
        kinds = self.attention if isinstance(self.attention, list) else [self.attention]
        return kinds[index % len(kinds)]

    def check(
        self,
        *,
        n_heads: int,
        max_len: int,
        positional: PositionalOptions | None = None,
        causal: bool = False,
        cross: bool = False,
        grid: tuple[int, int] | None = None,
    ) -> None:
        """Raise a ValueError, naming the attention field, if an attention kind of this stack cannot
        be used as the model asks (:meth:`AttentionOptions.check_use` on each). Every family checks
        its stacks through this one method.

        Args:
            n_heads, max_len, grid: the model's heads, longest sequence and token grid (None for sequences).
            positional: the model's positional kind.
            causal: the stack is a decoder, whose self-attention is causal.
            cross: the stack attends to an encoder's memory (its ``cross_attention`` is checked too).
        """
        listed = isinstance(self.attention, list)
        uses = dict(n_heads=n_heads, max_len=max_len, grid=grid)
        for index, kind in enumerate(self.attention if listed else [self.attention]):
            try:
                kind.check_use(positional=positional, causal=causal, **uses)
            except ValueError as error:
                raise ValueError(f"attention{f'.{index}' if listed else ''}: {error}") from None
        if cross:
            try:
                self.cross_attention.check_use(cross=True, **uses)
            except ValueError as error:
                raise ValueError(f"cross_attention: {error}") from None

    def build(
        self, *, layers: list[nn.Module], final_norm: nn.Module | None, d_model: int, signal: nn.Module | None = None
    ) -> nn.Module:
        raise NotImplementedError


StackField = Annotated[StackOptions, ComponentField("stack")]


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


TaskField = Annotated[TaskOptions, ComponentField("task")]

CATEGORIES: dict[str, type[ComponentOptions]] = {
    base.category: base
    for base in (AttentionOptions, PositionalOptions, NormOptions, FFNOptions, StackOptions, HeadOptions, TaskOptions)
}


class LayerFields(Options):
    """The config fields every layer of a model reads, declared once: each family's config inherits
    them (and may give them its paper's defaults), and :meth:`VariantConfig.layer_spec` carries
    them, by name, into the :class:`LayerSpec` its stacks are built from. A new option every layer
    takes is a field here and one in :class:`LayerSpec`."""

    d_model: int = Field(512, ge=1, le=MAX_WIDTH, description="model width")
    n_heads: int = Field(8, ge=1, le=MAX_WIDTH, description="attention heads; must divide d_model")
    d_ff: int = Field(2048, ge=1, le=MAX_WIDTH, description="inner width of the feed-forward network")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on residuals, embeddings and attention weights")
    norm: NormField = Field("layernorm", validate_default=True, description="normalisation layer")
    norm_placement: Literal["pre", "post"] = Field(
        "post", description="norm before each sub-layer (pre) or after the residual (post)"
    )
    final_norm: bool | None = Field(
        None, description="norm after the last layer of each stack; None: only with pre placement"
    )
    ffn: FFNField = Field("mlp", validate_default=True, description="position-wise feed-forward network")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> LayerFields:
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"choose n_heads among {divisors} or change d_model"
            )
        return self


class VariantConfig(Options):
    """Base of a family's config: every field a user may set for that family.

    Subclasses set ``family`` and implement ``build()``, returning a
    :class:`~transformer_zoo.core.model.ZooModel`.
    """

    family: ClassVar[str] = ""
    inputs: ClassVar[str] = "tokens"  # what forward() reads: token ids (src, tgt) or an image

    variant: str = Field(description="the registered variant this config started from")

    def layer_spec(self, **given: Any) -> LayerSpec:
        """The :class:`LayerSpec` every layer of this model shares: each of its fields from
        ``given``, else from this config's field of the same name, else the spec's default. The
        one place a config's layer-wide options reach the layers."""
        names = [field.name for field in dataclasses.fields(LayerSpec)]
        values = {name: getattr(self, name) for name in names if name in type(self).model_fields}
        return LayerSpec(**{**values, **given})

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
