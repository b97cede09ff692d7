"""Efficient attention: kinds whose time and memory grow linearly with the sequence length.

Attention kinds any variant can use by config (``decoder: {attention: linear}``):

- ``linear``: linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast
  Autoregressive Transformers with Linear Attention"): ``phi(q) . phi(k)`` with
  ``phi = elu + 1`` in place of ``exp(q . k)``, so the sums over keys are made once, O(n);
  causal in a decoder, where decoding is a recurrent network over two running sums;
- ``performer``: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers"):
  positive orthogonal random features whose dot products estimate softmax attention's
  ``exp(q . k / sqrt(d))``, then the same linear form; causal too;
- ``linformer``: Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear
  Complexity"): keys and values projected along the sequence to ``projected_length`` rows by
  learned matrices; softmax attention over those; encoders only.

None of them forms every query-key score, so none takes ALiBi; ``linear`` and ``performer`` keep
running sums over keys rather than the keys, so they take no in-attention positions at all. Their
modules are in :mod:`.kernels`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field
from torch import nn

from transformer_zoo.core.options import AttentionOptions, LayerSpec
from transformer_zoo.core.validation import MAX_LENGTH, MAX_WIDTH
from transformer_zoo.registry import hookimpl

from .kernels import EluFeatures, FeatureMapAttention, LinformerAttention, PositiveRandomFeatures


class _FeatureMapOptions(AttentionOptions):
    """Options the feature-map kinds share: a feature map, linear attention, a cache of running sums."""

    full: ClassVar[bool] = False
    takes_bias: ClassVar[bool] = False
    takes_positions: ClassVar[bool] = False  # the keys are summed as they come: no later call could rotate them
    takes_value_residual: ClassVar[bool] = False  # a decoding step makes its values outside project()
    module: ClassVar[type[nn.Module]] = FeatureMapAttention
    takes_head_dim: ClassVar[bool] = False

    def feature_map(self, d_head: int) -> nn.Module:
        raise NotImplementedError

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(
            features=self.feature_map(layer.d_model // layer.n_heads), kind=self.kind
        )  # its module makes the kernel


class LinearAttentionOptions(_FeatureMapOptions):
    """Linear attention with phi = elu + 1 (Katharopoulos et al. 2020); causal by running sums."""

    takes_scale: ClassVar[bool] = False  # phi(q) . phi(k) is no dot product that a factor on q scales
    kind: Literal["linear"] = "linear"

    def feature_map(self, d_head: int) -> nn.Module:
        return EluFeatures()


class PerformerOptions(_FeatureMapOptions):
    """FAVOR+ (Choromanski et al. 2021): positive orthogonal random features estimating softmax attention."""

    kind: Literal["performer"] = "performer"
    features: int = Field(
        256,
        ge=1,
        le=MAX_WIDTH,
        description="random features per head (m); more estimate softmax attention more closely",
    )
    seed: int = Field(0, description="seed of the random projection, drawn once and saved with the model (not redrawn)")

    def feature_map(self, d_head: int) -> nn.Module:
        return PositiveRandomFeatures(d_head, self.features, self.seed)


class LinformerOptions(AttentionOptions):
    """Linformer (Wang et al. 2020): keys and values projected along the sequence; encoders only."""

    full: ClassVar[bool] = False
    takes_bias: ClassVar[bool] = False
    takes_causal: ClassVar[bool] = False  # each projected key mixes every position, later ones included
    self_only: ClassVar[bool] = True
    module: ClassVar[type[nn.Module]] = LinformerAttention
    takes_head_dim: ClassVar[bool] = False
    kind: Literal["linformer"] = "linformer"
    projected_length: int = Field(64, ge=1, le=MAX_LENGTH, description="rows keys and values are projected to (k)")
    seq_len: int = Field(
        512,
        ge=1,
        le=MAX_LENGTH,
        description="columns of the projections E and F (n): the longest "
        "sequence they take; at least the model's max_len",
    )

    def check(self, *, max_len: int, grid: tuple[int, int] | None = None) -> None:
        if self.seq_len < max_len:
            raise ValueError(
                f"linformer seq_len={self.seq_len} is below max_len={max_len}: its projections would not "
                f"cover the longest sequence; set seq_len: {max_len}"
            )
        if self.projected_length >= max_len:
            raise ValueError(
                f"linformer projected_length={self.projected_length} is not below max_len={max_len}: "
                "nothing is compressed; use kind: sdpa, or a projected_length below max_len"
            )

    def module_arguments(self, layer: LayerSpec) -> dict[str, Any]:
        return dict(
            super().module_arguments(layer),
            projected_length=self.projected_length,
            seq_len=self.seq_len,
        )


@hookimpl
def tzoo_components():
    return [LinearAttentionOptions, PerformerOptions, LinformerOptions]
