"""Sigmoid attention (Ramapuram et al. 2024, arXiv 2409.04431): each weight is
sigmoid(q.k / sqrt(d) - log n), n the number of keys its query sees, in place of a softmax."""

import math
from typing import ClassVar, Literal

import torch
from torch import Tensor

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, Kernel, apply_weights
from transformer_zoo.core.options import AttentionOptions


def sigmoid_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, bias: Tensor | None, dropout_p: float, need_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) -> out (B, H, Tq, Dh), and the weights (B, H, Tq, Tk) if asked."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if bias is not None:  # a positional scheme's (ALiBi)
        scores = scores + bias
    allowed = mask.dense(q.size(-2), k.size(-2), q.device)  # True where a query may look; None: everywhere
    if allowed is None:
        weights = torch.sigmoid(scores - math.log(k.size(-2)))
    else:  # n counts what each query sees, so no output depends on the keys after it
        seen = allowed.sum(-1, keepdim=True).clamp_min(1).to(scores.dtype)  # broadcasts to (B, H, Tq, 1)
        weights = torch.sigmoid(scores - seen.log()).masked_fill(~allowed, 0.0)
    return apply_weights(weights, v, dropout_p), weights if need_weights else None


class SigmoidAttentionOptions(AttentionOptions):
    """Sigmoid attention (Ramapuram et al. 2024): an elementwise sigmoid in place of the softmax."""

    full: ClassVar[bool] = False  # it sees every key, but its weights are not softmax attention's
    kind: Literal["sigmoid"] = "sigmoid"

    def make_kernel(self) -> Kernel:
        return sigmoid_attention


@tz.hookimpl
def tzoo_components() -> list[type[AttentionOptions]]:
    return [SigmoidAttentionOptions]
