"""Options models: the validated boundary between configs and modules.

Every component (attention, positional, norm, ffn, stack, head) declares one options model:
a subclass of its category's base below with a ``kind`` literal, a described field per
option, and a ``build`` method that unpacks the options into explicit constructor
arguments. A config field annotated with :data:`AttentionField`, :data:`NormField`, ... (one
``<Category>Field`` per category) accepts any registered kind of that category, built-in or
third-party, dispatched on ``kind`` (:mod:`.validation`).

A family's config (:class:`VariantConfig`; the base encoder-decoder's is
:class:`EncoderDecoderConfig`) describes its layers once, in a :class:`LayerSpec` built from the
layer-wide fields every family inherits (:class:`LayerFields`), and checks its stacks' attention
kinds in one place (:meth:`StackOptions.check`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)
from torch import nn

from .attention import (
    AttentionPositional,
    FirstValues,
    Kernel,
    MultiHeadAttention,
    SoftcapKernel,
    kv_heads_problem,
    sdpa_kernel,
)
from .tasks import TaskOptions
from .validation import (
    MAX_LAYERS,
    MAX_LENGTH,
    MAX_WIDTH,
    ComponentField,
    ComponentOptions,
    NormPlacement,
    Options,
)


@dataclass(frozen=True)
class LayerSpec:
    """What every layer of a stack shares, described once by the family and handed whole to the
    stack builder (:func:`~transformer_zoo.core.config.build_stack`): the sizes, the dropout, the
    feed-forward and norm kinds, the norms' placement, and what every attention kind reads
    besides its own options (the in-attention positions, the token grid).

    A family makes it with :meth:`VariantConfig.layer_spec`, which reads each field from the
    config field of the same name (:class:`LayerFields`), so no family forwards an option every
    layer takes. Attention kinds receive the whole spec (:meth:`AttentionOptions.build`).

    Attributes:
        d_model, n_heads, d_ff: the widths and heads.
        dropout: on residuals and attention weights.
        ffn, norm: the feed-forward and norm kinds (None only for a spec that builds attention alone).
        norm_placement: where each sub-layer's norms go (:data:`NormPlacement`).
        final_norm: a norm after the last layer; None: only with pre placement.
        in_attention: the built in-attention positional scheme (rotary, ALiBi) of the self-attention, or None.
        grid: ``(rows, columns)`` of the token grid in image models; None for sequences.
        head_dim: each attention head's width; None: ``d_model / n_heads``.
        depth: the layer's index in its stack, from 0 (set by the stack builder; a kind whose
            rule depends on it reads it, as differential attention's initial lambda does).
        first_values: the stack's :class:`~transformer_zoo.core.attention.FirstValues` when it
            learns value residuals (set by the stack builder for its self-attention; the first
            layer's attention keeps its values there, the later layers' mix them in); None: off.
    """

    d_model: int
    n_heads: int
    d_ff: int = 0
    dropout: float = 0.0
    ffn: FFNOptions | None = None
    norm: NormOptions | None = None
    norm_placement: NormPlacement = "post"
    final_norm: bool | None = None
    in_attention: AttentionPositional | None = None
    grid: tuple[int, int] | None = None
    head_dim: int | None = None
    depth: int = 0
    first_values: FirstValues | None = None

    @property
    def uses_final_norm(self) -> bool:
        """A norm after the last layer: as ``final_norm`` says, else for every placement that
        leaves a layer's output unnormalised (all but ``post``)."""
        return self.norm_placement != "post" if self.final_norm is None else self.final_norm


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

    Every kind has the fields of this class (``bias``, ``scale``, ``n_kv_heads``, ``qk_norm``,
    ``softcap``, ``positions``, ``gate``, ``sinks``). What a kind can take is
    declared by the class variables below, each with its default; a kind that differs says so in
    its own class body. :meth:`check_use` checks them all, in one place (the stacks call it:
    :meth:`StackOptions.check`); a kind's own option values are checked by :meth:`check`. Their
    table is in the plugin guide (docs/writing-a-plugin.md, "What a kind can take").
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
    does. Where it does not (its own temperature), a non-null ``scale`` is refused at validation."""
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
    takes_softcap: ClassVar[bool] = False
    """Whether the kind's kernel soft-caps its scores when ``softcap`` is set (its
    :meth:`make_kernel` reads it). False by default: a kind that never forms the scores, or whose
    kernel does not cap them, refuses ``softcap`` at validation."""
    takes_head_dim: ClassVar[bool] = True
    """Whether the kind's module takes heads of any width (``head_dim``), not only ``d_model / n_heads``."""
    takes_sinks: ClassVar[bool] = False
    """Whether the kind's kernel takes attention sinks (``sinks``): a softmax over every key the
    mask allows that takes a positional bias and an explicit mask, so that the module's sink (one
    more key in front, its logit as a bias:
    :meth:`~transformer_zoo.core.attention.MultiHeadAttention.with_sink`) joins it. False by
    default: a kind whose kernel mixes or drops keys, or refuses a bias, refuses ``sinks`` at
    validation."""
    takes_value_residual: ClassVar[bool] = True
    """Whether the kind forms its self-attention values in
    :meth:`~transformer_zoo.core.attention.MultiHeadAttention.project`, where a stack's
    ``value_residual`` mixes the first layer's values into the later layers'. False for a kind
    whose module makes its values elsewhere (linear attention's running sums while decoding, a
    latent projection): a stack with ``value_residual`` refuses it at validation."""
    takes_kv_heads: ClassVar[bool] = True
    """Whether the kind has key/value heads that ``n_kv_heads`` can group (grouped-query
    attention). False for a kind that shares one latent among all heads in their place
    (multi-head latent attention): a non-null ``n_kv_heads`` is refused at validation."""
    takes_qk_norm: ClassVar[bool] = True
    """Whether the kind's module normalises its queries and keys when ``qk_norm`` is set. False for
    a kind that normalises something else in their place (latent attention's latents): a non-null
    ``qk_norm`` is refused at validation."""

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
    qk_norm: Literal["head", "projection"] | None = Field(
        None,
        description="normalise the queries and keys (the layer's norm kind) before the positions: over "
        "each head's channels, one norm shared by the heads (head: Qwen 3), or over the whole projection "
        "(projection: OLMo 2); null: off",
    )
    softcap: float | None = Field(
        None,
        gt=0,
        description="soft-cap the attention scores to (-softcap, softcap): softcap * tanh(scores / softcap), "
        "before the mask (Gemma 2: 50); null: off",
    )
    positions: bool = Field(
        True,
        description="apply the model's in-attention positions (rotary, ALiBi) in this attention; false: none "
        "(NoPE, Kazemnejad et al. 2023), for chosen layers of a stack's list of kinds",
    )
    gate: bool = Field(
        False,
        description="gate the heads' output by sigmoid(x W_gate) before the output projection, x the queries' "
        "input (Qiu et al. 2025; Qwen3-Next): parameter gate_proj, with a bias when bias",
    )
    sinks: bool = Field(
        False,
        description="attention sinks: a learned logit per head, starting at 0, joins every query's softmax as a "
        "key with no value, so the weights over the real keys sum to less than 1 (Xiao et al. 2024, learned as "
        "in gpt-oss): parameter sinks",
    )

    @model_validator(mode="after")
    def _options_are_taken(self) -> AttentionOptions:
        if self.scale is not None and not self.takes_scale:
            raise ValueError(
                f"{self.kind} attention does not apply scale (its module or kernel does not take it); "
                "remove scale, or use kind: sdpa"
            )
        if self.softcap is not None and not self.takes_softcap:
            raise ValueError(
                f"{self.kind} attention does not soft-cap its scores (its kernel does not form them, or does "
                "not cap them); remove softcap, or use kind: sdpa, math or sliding-window"
            )
        if self.sinks and not self.takes_sinks:
            raise ValueError(
                f"{self.kind} attention does not take sinks (its kernel does not form a softmax over every key the "
                "mask allows with a bias on the scores, which the sink logit joins); remove sinks, or use kind: "
                "sdpa or math"
            )
        if self.n_kv_heads is not None and not self.takes_kv_heads:
            raise ValueError(
                f"{self.kind} attention shares one latent among all heads in place of key/value heads, so "
                "n_kv_heads does not apply; remove n_kv_heads (a smaller kv_rank shrinks the cache), or use "
                "kind: sdpa for grouped-query attention"
            )
        if self.qk_norm is not None and not self.takes_qk_norm:
            raise ValueError(
                f"{self.kind} attention normalises its latents (RMSNorm over kv_rank and q_rank), not its "
                "queries and keys; remove qk_norm, or use kind: sdpa"
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
        head_dim: int | None = None,
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
            head_dim: the heads' width when the model sets it (``takes_head_dim``); None: ``d_model / n_heads``.
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
        if positional is not None and positional.in_attention and not self.takes_positions and self.positions:
            raise ValueError(
                f"{self.kind} attention keeps running sums over keys, not the keys, so it cannot apply "
                f"{positional.kind} positions to them; use sinusoidal or learned positions"
            )
        if not self.positions and (positional is None or not positional.in_attention):
            raise ValueError(
                "positions: false leaves out in-attention positions, but this attention has none "
                f"({'cross-attention takes no positions' if positional is None else f'{positional.kind} positions are added to the embeddings'}); "
                "remove positions: false, or use rotary or alibi positions"
            )
        if head_dim is not None and not self.takes_head_dim:
            raise ValueError(
                f"{self.kind} attention takes heads of d_model / n_heads channels only; remove head_dim, or use "
                "kind: sdpa"
            )
        self.check(max_len=max_len, grid=grid)

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        """Raise a ValueError if the kind's own option values cannot work with sequences of up to
        ``max_len`` (or, for a kind that ``needs_grid``, with the token ``grid``). The one method a
        kind overrides to refuse what it cannot take; :meth:`check_use` calls it."""

    def make_kernel(self) -> Kernel:
        """The kind's kernel ``(q, k, v, mask, bias, dropout_p, need_weights) -> (out, weights)``
        (:class:`~transformer_zoo.core.attention.Kernel`); full attention on SDPA by default, soft-capped
        (:class:`~transformer_zoo.core.attention.SoftcapKernel`) with ``softcap``."""
        return sdpa_kernel if self.softcap is None else SoftcapKernel(self.softcap)

    def common_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        """The constructor arguments every kind's :attr:`module` takes: the shared fields and the
        layer's dropout, head width and in-attention positions (none with ``positions: false``),
        the QK-norms built of the layer's norm kind, and the stack's value residual (the first
        layer keeps its values, the later ones mix them in). The one place a common option is
        passed on; an option left at its default is not passed, so a module need not know it."""
        qk_norm = None
        if self.qk_norm is not None:
            if layer.norm is None:
                raise ValueError("qk_norm normalises with the layer's norm kind: give the LayerSpec a norm")
            d_head = layer.head_dim or layer.d_model // layer.n_heads
            kv_heads = self.n_kv_heads or layer.n_heads
            widths = (d_head, d_head) if self.qk_norm == "head" else (layer.n_heads * d_head, kv_heads * d_head)
            qk_norm = tuple(layer.norm.build(d_model=width) for width in widths)
        return dict(
            dropout=layer.dropout,
            bias=self.bias,
            positional=layer.in_attention if self.positions else None,
            scale=self.scale,
            n_kv_heads=self.n_kv_heads,
            **({} if layer.head_dim is None else {"d_head": layer.head_dim}),
            **({} if qk_norm is None else {"qk_norm": qk_norm, "qk_norm_over": self.qk_norm}),
            **({"gate": True} if self.gate else {}),
            **({"sinks": True} if self.sinks else {}),
            **(
                {}
                if layer.first_values is None
                else {"first_values": layer.first_values, "mix_values": layer.depth > 0}
            ),
        )

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        """The constructor arguments that are the kind's own: ``kernel=make_kernel()`` by default.
        A kind whose :attr:`module` takes more (or builds its own kernel) overrides this.

        Args:
            layer: the layer's :class:`LayerSpec`: a kind reads what it needs of it, such as the
                width and heads (a kernel with per-head parameters), the token ``grid`` of image
                models (kinds over a grid) or the layer's ``depth`` in its stack.
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
            **self.module_arguments(layer),
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
    :class:`~transformer_zoo.core.moe.Routing` in its forward (a mixture of experts) has its
    load-balancing loss added to the model's loss and its routing reported by the stacks.
    """

    category: ClassVar[str] = "ffn"
    default_kind: ClassVar[str] = "mlp"


class HeadOptions(ComponentOptions):
    """Head kinds. ``build(d_model=, vocab_size=, embedding=, pad_id=, dropout=)`` returns a module
    ``head(hidden, mask) -> logits`` with ``loss(logits, targets)``."""

    category: ClassVar[str] = "head"
    default_kind: ClassVar[str] = "lm"


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
    value_residual: bool = Field(
        False,
        description="value residual learning (Zhou et al. 2024, ResFormer): every layer after the first attends "
        "over lambda_1 V_1 + lambda_2 V_n, V_1 the first layer's values, the lambdas learned per layer from 0.5 "
        "and 0.5 (parameter value_lambdas of each later layer's self-attention)",
    )

    @model_validator(mode="after")
    def _value_residual_is_taken(self) -> StackOptions:
        if not self.value_residual:
            return self
        if self.recurrent:
            raise ValueError(
                f"value_residual mixes the first layer's values into each later layer's, but a {self.kind} stack "
                "applies one shared layer at every step; remove value_residual, or use kind: standard"
            )
        kinds = self.attention if isinstance(self.attention, list) else [self.attention]
        refused = sorted({kind.kind for kind in kinds if not kind.takes_value_residual})
        if refused:
            raise ValueError(
                "value_residual mixes the first layer's values into the later layers' as attention forms them "
                f"in MultiHeadAttention.project, which {' and '.join(refused)} attention does not; remove "
                "value_residual, or use kinds that take it, such as sdpa"
            )
        return self

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
        head_dim: int | None = None,
    ) -> None:
        """Raise a ValueError, naming the attention field, if an attention kind of this stack cannot
        be used as the model asks: :meth:`AttentionOptions.check_use` on each (its arguments), and
        on ``cross_attention`` when the stack attends to an encoder (``cross``). Every family
        checks its stacks through this one method."""
        listed = isinstance(self.attention, list)
        kinds = self.attention if listed else [self.attention]
        uses = dict(n_heads=n_heads, max_len=max_len, grid=grid, head_dim=head_dim)
        for index, kind in enumerate(kinds):
            try:
                kind.check_use(positional=positional, causal=causal, **uses)
            except ValueError as error:
                raise ValueError(f"attention{f'.{index}' if listed else ''}: {error}") from None
        kv_heads = sorted({kind.n_kv_heads or n_heads for kind in kinds})
        if self.value_residual and len(kv_heads) > 1:
            raise ValueError(
                "value_residual: every later layer mixes the first layer's values into its own, so every layer's "
                f"values need the same heads, but the attention kinds have {' and '.join(map(str, kv_heads))} "
                "key/value heads; give them one n_kv_heads"
            )
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
    head_dim: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="width of each attention head; null: d_model / n_heads (Gemma 2 and Qwen 3 set it apart)",
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on residuals, embeddings and attention weights")
    norm: NormField = Field("layernorm", validate_default=True, description="normalisation layer")
    norm_placement: NormPlacement = Field(
        "post",
        description="norm before each sub-layer (pre), after the residual (post), before and after each "
        "sub-layer (sandwich: Gemma 2) or on each sub-layer's output (output: OLMo 2)",
    )
    final_norm: bool | None = Field(
        None, description="norm after the last layer of each stack; None: with every placement but post"
    )
    ffn: FFNField = Field("mlp", validate_default=True, description="position-wise feed-forward network")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> LayerFields:
        if self.d_model % self.n_heads and self.head_dim is None:
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
