"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient
Mixture-of-Experts Language Model", arXiv 2405.04434, section 2.1; kept in DeepSeek-V3, arXiv
2412.19437, section 2.1.1).

Keys and values are compressed, jointly, into one latent vector per token, ``c_kv`` of ``kv_rank``
(``d_c``) channels, and only that latent is cached; every head's keys and values are decompressed
from it when attention needs them (the paper's equations 9 to 11)::

    c_kv    = RMSNorm(W_DKV h)                        (9)   (B, T, d_c), cached
    k_nope  = W_UK c_kv,  v = W_UV c_kv               (10), (11)   per head: (B, H, T, d_h), (B, H, T, d_v)

Rotary positions cannot turn a key that is rebuilt from a latent (the rotation would sit between
``W_UK`` and the query), so they are *decoupled*: each query head has a rotary part of its own,
and one rotary key, shared by every head, is made from the input and cached beside the latent
(equations 12 to 17)::

    c_q     = RMSNorm(W_DQ h)                         (12)   (q_rank set; else c_q = h)
    q_nope  = W_UQ c_q,  q_rope = RoPE(W_QR c_q)      (13), (14)
    k_rope  = RoPE(W_KR h)                            (15)   one head, cached before rotation
    q = [q_nope; q_rope],  k = [k_nope; k_rope]       (16), (17)
    o = softmax(q k^T / sqrt(d_h + d_h^R)) v          (18)
    u = W_O [o_1; ...; o_H]                           (19)

The equations leave out the RMSNorm on each latent that the released models apply (and
transformers' ``DeepseekV3Attention``, whose parameter names this module takes: ``q_proj`` or
``q_a_proj``, ``q_a_layernorm`` and ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm`` and
``kv_b_proj``; its ``o_proj`` is ``out_proj`` here). The cache holds ``kv_rank + rope`` numbers per
token and layer, against ``2 * n_kv_heads * d_head`` for multi-head and grouped-query attention
(the paper's Table 1).

The rotary part is the model's rotary scheme: the channels it turns (``rotated``) are the rope
width ``d_h^R``, as transformers' ``DeepseekV3Config`` sets ``head_dim = qk_rope_head_dim`` and
builds its rotary embedding at that width. A model sets ``head_dim`` (or ``d_model / n_heads``)
and the rotary ``fraction`` so that the rotary turns the rope width it wants: DeepSeek-V2's
128-wide heads with ``fraction: 0.5`` turn 64 channels. With positions added to the embeddings
(or ``positions: false``), there is no rotary part: the rope width is 0.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionPositional, Cache, MultiHeadAttention
from transformer_zoo.core.options import AttentionOptions, LayerSpec, PositionalOptions
from transformer_zoo.core.relative import RotaryPositional
from transformer_zoo.core.validation import MAX_WIDTH
from transformer_zoo.registry import hookimpl

LATENT_NORM_EPS = 1e-6
"""The epsilon of the RMSNorm on each latent (transformers' ``DeepseekV3RMSNorm`` default, which its
attention uses whatever the model's ``rms_norm_eps``)."""


class LatentAttention(MultiHeadAttention):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, equations 9 to 19): keys and
    values decompressed from a cached latent, and a decoupled rotary part of each query and key.

    :class:`~transformer_zoo.core.attention.MultiHeadAttention` does the rest (mask, cache
    visibility, ``scale``, kernel, dropout, ``out_proj``): this class replaces its projections and
    :meth:`project`. Queries and keys are ``nope_head_dim + rope`` wide, values ``v_head_dim``;
    the kernels divide the scores by ``sqrt(nope_head_dim + rope)``, DeepSeek's softmax scale.

    Args:
        d_model: model width.
        n_heads: heads.
        kv_rank: width of the key/value latent ``d_c``; None: ``4 * d_head`` (DeepSeek-V2: 512 =
            4 * 128).
        q_rank: width of the query latent ``d'_c``; None: the queries are one projection of the
            input (``q_proj``; DeepSeek-V2-Lite), else ``q_a_proj``, RMSNorm, ``q_b_proj``.
        nope_head_dim: the channels of each query and key head without positions ``d_h``; None:
            ``d_head``.
        v_head_dim: each value head's width; None: ``d_head``.
        d_head: the layer's head width, of which the widths above are taken; None: ``d_model //
            n_heads``. Once built, ``self.d_head`` is the value heads' width, which ``out_proj``
            reads, as in ``MultiHeadAttention``.
        positional: the rotary scheme (:class:`~transformer_zoo.core.relative.RotaryPositional`),
            whose turned channels are the rope width ``d_h^R``; None: no rotary part.
        bias: a bias on the projections that read the input (``q_proj`` or ``q_a_proj``,
            ``kv_a_proj_with_mqa``) and on ``out_proj``; the up-projections from the normed latents
            have none. (transformers' ``q_proj`` never has one.)
        **kwargs: the rest of ``MultiHeadAttention``'s arguments (kernel, dropout, scale, gate,
            sinks; the gate is as wide as the values, ``n_heads * v_head_dim``).
    """

    self_only: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_rank: int | None = None,
        q_rank: int | None = None,
        nope_head_dim: int | None = None,
        v_head_dim: int | None = None,
        d_head: int | None = None,
        positional: AttentionPositional | None = None,
        bias: bool = True,
        n_kv_heads: int | None = None,
        qk_norm: tuple[nn.Module, nn.Module] | None = None,
        first_values: Any = None,
        **kwargs: Any,
    ) -> None:
        if n_kv_heads not in (None, n_heads):
            raise ValueError(
                f"latent attention shares one latent among its {n_heads} heads; n_kv_heads={n_kv_heads} does not "
                "apply (leave it None)"
            )
        if qk_norm is not None:
            raise ValueError("latent attention normalises its latents, not its queries and keys: leave qk_norm None")
        if first_values is not None:
            raise ValueError(
                "latent attention caches latents, not the values a value residual mixes: leave first_values None"
            )
        if positional is not None and not isinstance(positional, RotaryPositional):
            raise ValueError(
                f"latent attention takes rotary positions only (its rotary part is decoupled from the latent), "
                f"got {type(positional).__name__}"
            )
        d_head = d_model // n_heads if d_head is None else d_head
        v_head_dim = d_head if v_head_dim is None else v_head_dim
        super().__init__(d_model, n_heads, d_head=v_head_dim, positional=positional, bias=bias, **kwargs)
        del self.in_proj  # the projections below take its place
        self.kv_rank = 4 * d_head if kv_rank is None else kv_rank
        self.q_rank = q_rank
        self.nope_head_dim = d_head if nope_head_dim is None else nope_head_dim
        self.rope_head_dim = 0 if positional is None else positional.rotated
        self.v_head_dim = v_head_dim
        q_width = n_heads * (self.nope_head_dim + self.rope_head_dim)
        if q_rank is None:
            self.q_proj = nn.Linear(d_model, q_width, bias=bias)  # [W_UQ; W_QR], per head: nope, then rope
        else:
            self.q_a_proj = nn.Linear(d_model, q_rank, bias=bias)  # W_DQ
            self.q_a_layernorm = nn.RMSNorm(q_rank, eps=LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(q_rank, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, self.kv_rank + self.rope_head_dim, bias=bias)  # [W_DKV; W_KR]
        self.kv_a_layernorm = nn.RMSNorm(self.kv_rank, eps=LATENT_NORM_EPS)
        # [W_UK; W_UV], per head: the key's nope channels, then the value's
        self.kv_b_proj = nn.Linear(self.kv_rank, n_heads * (self.nope_head_dim + v_head_dim), bias=False)

    def extra_repr(self) -> str:
        q = "" if self.q_rank is None else f", q_rank={self.q_rank}"
        widths = f"nope_head_dim={self.nope_head_dim}, rope_head_dim={self.rope_head_dim}, v_head_dim={self.v_head_dim}"
        scale = "" if self.scale is None else f", scale={self.scale:g}"
        gate = "" if getattr(self, "gate_proj", None) is None else ", output gate"
        sinks = "" if getattr(self, "sinks", None) is None else ", sinks"
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, kv_rank={self.kv_rank}{q}, {widths}{scale}{gate}{sinks}"
        )

    def queries(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The queries of ``x`` ``(B, T, D)``, without positions: ``q_nope`` ``(B, H, T, nope)`` and
        ``q_rope`` ``(B, H, T, rope)`` before rotation (equations 12 to 14)."""
        q = self.q_proj(x) if self.q_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, T, nope + rope)
        return q.split([self.nope_head_dim, self.rope_head_dim], dim=-1)

    def latents(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """What the cache holds of ``x`` ``(B, T, D)``: the normed latent ``c_kv`` ``(B, 1, T, kv_rank)``
        and the shared rotary key ``(B, 1, T, rope)`` before rotation (equations 9 and 15), each as
        one head so that every cache stores them as it stores keys and values."""
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope_head_dim], dim=-1)
        return self.kv_a_layernorm(latent)[:, None], k_rope[:, None]

    def decompressed(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's keys without positions ``(B, H, T, nope)`` and values ``(B, H, T, v_head_dim)``
        of the latents ``(B, 1, T, kv_rank)`` (equations 10 and 11)."""
        kv = self.kv_b_proj(latent[:, 0]).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)
        return kv.split([self.nope_head_dim, self.v_head_dim], dim=-1)

    def project(
        self, x: Tensor, memory: Tensor | None = None, cache: Cache | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries and keys ``(B, H, T, nope + rope)`` and values ``(B, H, T, v_head_dim)`` of every
        token so far, and no positional bias (equations 16 and 17).

        The cache holds the latents (its keys) and the rotary keys before rotation (its values),
        so every token's keys and values are decompressed from it at each call; the rotary parts
        turn as ``MultiHeadAttention.project`` turns its queries and keys: from the cache's
        ``start`` and ``key_start``, each row shifted back by its ``left_padding``.
        """
        if memory is not None:
            raise ValueError(f"{type(self).__name__} is for self-attention; keep cross_attention: sdpa")
        q_nope, q_rope = self.queries(x)
        latent, k_rope = self.latents(x)
        q_offset, k_offset = 0, 0
        if cache is not None:
            q_offset = cache.start
            latent, k_rope = cache.append(latent, k_rope)
            k_offset = cache.key_start
            if cache.left_padding is not None:
                q_offset, k_offset = q_offset - cache.left_padding, k_offset - cache.left_padding
        k_nope, v = self.decompressed(latent)
        if self.positional is not None:
            q_rope, k_rope = self.positional.rotate(q_rope, k_rope, q_offset, k_offset)
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)  # one rotary key for every head
        return q, k, v, None


class LatentAttentionOptions(AttentionOptions):
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2, arXiv 2405.04434, section 2.1):
    keys and values decompressed from one cached latent of kv_rank channels per token, and a
    decoupled rotary part of each query and key, whose width is the channels the model's rotary
    positions turn (set head_dim and the rotary fraction for it). The widths default to the
    paper's proportions of the layer's head width d_h: nope and value heads d_h, latent 4 d_h."""

    kind: Literal["mla"] = "mla"
    module: ClassVar[type[nn.Module]] = LatentAttention
    # The flags it keeps at their defaults: full softmax attention, scale on the queries (the kernels
    # divide by sqrt(nope + rope)), causal, any head width (it sets the rotary width and the default
    # widths); in-attention positions are rotary only (check_use). The ones that differ:
    self_only: ClassVar[bool] = True  # the cache holds this sequence's latents; no memory is compressed
    takes_softcap: ClassVar[bool] = True  # make_kernel's soft-capped kernel forms the scores
    takes_sinks: ClassVar[bool] = True  # its kernel (sdpa, or soft-capped) takes the sink's bias and mask
    takes_value_residual: ClassVar[bool] = False  # the cache holds latents, not the values to carry on
    takes_kv_heads: ClassVar[bool] = False  # one latent for every head, in place of key/value heads
    takes_qk_norm: ClassVar[bool] = False  # the latents are normed, not the queries and keys

    kv_rank: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="width of the key/value latent, the only thing cached with the rotary key (d_c, "
        "transformers' kv_lora_rank); null: 4 * the head width (DeepSeek-V2: 512)",
    )
    q_rank: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="width of the query latent (d'_c, transformers' q_lora_rank: DeepSeek-V2 1536); null: the "
        "queries are one projection of the input (DeepSeek-V2-Lite)",
    )
    nope_head_dim: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="channels of each query and key head without positions, decompressed from the latent "
        "(transformers' qk_nope_head_dim); the rotary part adds the channels the rotary turns; null: the head width",
    )
    v_head_dim: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="width of each value head, out_proj's input per head; null: the head width",
    )

    def check_use(self, *, positional: PositionalOptions | None = None, **uses: Any) -> None:
        """:meth:`AttentionOptions.check_use`, after refusing in-attention positions that are not
        rotary: the rotary part is decoupled from the latent, and a bias or a rotation of the
        decompressed keys has no place in it. Positions added to the embeddings leave the rotary
        part out (rope width 0)."""
        if positional is not None and positional.in_attention and self.positions and positional.kind != "rotary":
            raise ValueError(
                f"{self.kind} attention turns a rotary part of each query and key kept apart from its latent "
                f"(DeepSeek-V2's decoupled rotary positions), so it takes no {positional.kind} positions; use "
                "positional: rotary, or positions added to the embeddings (sinusoidal, learned)"
            )
        super().check_use(positional=positional, **uses)

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(
            kernel=self.make_kernel(),
            kv_rank=self.kv_rank,
            q_rank=self.q_rank,
            nope_head_dim=self.nope_head_dim,
            v_head_dim=self.v_head_dim,
        )


@hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [LatentAttentionOptions]
