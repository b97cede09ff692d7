"""Linear attention (Katharopoulos et al. 2020): phi(q) (phi(k)^T v) / (phi(q) sum_j phi(k_j)), phi = elu + 1."""

from typing import ClassVar, Literal

from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, Kernel, apply_weights
from transformer_zoo.core.options import AttentionOptions


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, dropout_p: float, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """The kind's kernel (see ``transformer_zoo.core.attention.Kernel``); causal by prefix sums."""
    if bias is not None:
        raise ValueError("linear attention forms no scores to add a bias to; use sinusoidal, learned or rotary")
    q, k = nn.functional.elu(q) + 1, nn.functional.elu(k) + 1  # (B, H, T, Dh), positive
    k = k if mask.padding is None else k * mask.padding[:, None, :, None]  # a padded key drops out of the sums
    if need_weights or dropout_p:  # the n x n weights, only to return them or to drop some out
        scores = (q @ k.transpose(-2, -1)).tril(k.size(-2) - q.size(-2) if mask.causal else k.size(-2))
        weights = scores / scores.sum(-1, keepdim=True).clamp_min(1e-6)  # (B, H, Tq, Tk)
        return apply_weights(weights, v, dropout_p), weights
    if mask.causal:  # prefix sums up to each query, end-aligned as with a cache: (B, H, Tq, Dh, Dh), (B, H, Tq, Dh)
        kv, z = (k[..., None] * v[..., None, :]).cumsum(2)[:, :, -q.size(-2) :], k.cumsum(2)[:, :, -q.size(-2) :]
    else:  # one sum over all keys, for every query
        kv, z = (k.transpose(-2, -1) @ v)[:, :, None], k.sum(2, keepdim=True)
    return (q[..., None, :] @ kv).squeeze(-2) / (q * z).sum(-1, keepdim=True).clamp_min(1e-6), None


class SimpleLinearAttentionOptions(AttentionOptions):
    """Linear attention (Katharopoulos et al. 2020): elu + 1 feature maps, linear in the length."""

    full: ClassVar[bool] = False  # it sees every key, but its weights are not softmax attention's
    takes_bias: ClassVar[bool] = False  # it forms no scores to add a bias to
    takes_scale: ClassVar[bool] = False  # phi(q) is not a dot product that a factor on q scales
    kind: Literal["simple-linear"] = "simple-linear"

    def make_kernel(self) -> Kernel:
        return linear_attention
