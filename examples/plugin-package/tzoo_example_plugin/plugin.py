"""Cosine attention: Henry et al. 2020, "Query-Key Normalization for Transformers" (arXiv 2010.04245).

Queries and keys are L2-normalised per head, so every score is a cosine similarity in
[-1, 1], and a learned temperature ``g`` takes the place of ``1 / sqrt(d_k)``:

    Attention(Q, K, V) = softmax(g * Q_hat K_hat^T) V

Bounded scores cannot push the softmax into saturation however large the activations grow.

The formula is the core's softmax attention on changed inputs: with queries ``g * sqrt(d_k) *
Q_hat`` and keys ``K_hat``, ``Q K^T / sqrt(d_k)`` is ``g * Q_hat K_hat^T``. So the kind keeps a
core kernel (``math_kernel``: the written-out formula, which computes the same numbers whether
or not the weights are asked for) with its masks, cache and positions, and changes only what
the kernel receives, in the ``kernel_inputs`` hook. The temperature is a parameter, so it lives
on a small subclass of the core's ``MultiHeadAttention``, not in the kernel (a kernel holds
none); ``sdpa_kernel`` in its place would run PyTorch's fused kernels.

The file reads top to bottom: the module, the options model (attention kind ``cosine``), the
variant ``cosine-transformer-tiny``, and the hooks the ``transformer_zoo`` entry point of this
package points at. The linear-attention kind, a kernel alone, is in :mod:`.linear`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention, math_kernel
from transformer_zoo.core.cache import KVCache
from transformer_zoo.core.options import AttentionOptions, LayerSpec, Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig

from .linear import SimpleLinearAttentionOptions


# ---- the module ---------------------------------------------------------------------------
class CosineAttention(MultiHeadAttention):
    """Multi-head cosine attention for self- or cross-attention.

    Args:
        d_model: model width; split into ``n_heads`` heads of ``d_model // n_heads``.
        n_heads: number of heads.
        init_scale: the temperature ``g`` at initialisation; it is learned (in log space, so it
            stays positive).
        **common: what every attention module takes (``dropout``, ``bias``, ``positional``,
            ``scale``, ``n_kv_heads``), passed on to ``MultiHeadAttention``.
    """

    def __init__(self, d_model: int, n_heads: int, *, init_scale: float = 10.0, **common: Any) -> None:
        super().__init__(d_model, n_heads, kernel=math_kernel, **common)
        if init_scale <= 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def kernel_inputs(
        self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor, AttentionMask, Tensor | None]:
        """Unit-length queries and keys ``(B, H, T, Dh)``, the queries times ``g * sqrt(Dh)``: the
        kernel divides the scores by ``sqrt(Dh)``, leaving ``g`` times the cosines."""
        scale = self.log_scale.exp() * math.sqrt(self.d_head)
        return F.normalize(q, dim=-1) * scale, F.normalize(k, dim=-1), v, mask, bias


# ---- the options model: the attention kind "cosine" ---------------------------------------
class CosineAttentionOptions(AttentionOptions):
    """Multi-head attention on cosine similarities with a learned temperature (QKNorm)."""

    # The learned temperature takes the place of ``scale``: the inherited field stays, and validation
    # refuses any value but null (``takes_scale``). The base build passes the inherited fields on.
    takes_scale: ClassVar[bool] = False
    module: ClassVar[type[nn.Module]] = CosineAttention
    kind: Literal["cosine"] = "cosine"
    init_scale: float = Field(
        10.0, gt=0.0, description="temperature g multiplying the cosine scores at initialisation (then learned)"
    )

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(init_scale=self.init_scale)  # CosineAttention brings its own kernel


# ---- the variant: transformer-tiny with cosine attention everywhere -----------------------
COSINE_TINY = {
    **TINY,
    "encoder": {**TINY["encoder"], "attention": "cosine"},
    "decoder": {**TINY["decoder"], "attention": "cosine", "cross_attention": "cosine"},
}


# ---- the hooks ----------------------------------------------------------------------------
@tz.hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [CosineAttentionOptions, SimpleLinearAttentionOptions]


@tz.hookimpl
def tzoo_variants() -> list[Variant]:
    return [
        Variant(
            name="cosine-transformer-tiny",
            config=TransformerConfig,
            defaults=COSINE_TINY,
            description="transformer-tiny with cosine attention in every attention block",
        )
    ]
