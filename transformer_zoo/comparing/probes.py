"""Probes of a trained model's attention, measured on the first test examples of a task.

- :func:`attention_statistics`: how spread the attention rows are (their mean entropy) and how
  many are saturated, nearly all their weight on one key: Vaswani et al. 2017 (section 3.2.1)
  divide the dot products by ``sqrt(d_k)`` because large ones push the softmax "into regions
  where it has extremely small gradients".
- :func:`mirror_alignment`: how much of the decoder's cross-attention lies on the source position
  that a copy (the diagonal) or a reverse (the anti-diagonal) reads; a model that learned the
  rule, rather than the training lengths, keeps it on longer inputs (Dehghani et al. 2018).
- :func:`max_attention_logit`: the largest query-key logit of any self-attention layer; its
  growth makes high learning rates unstable, which QK-layernorm prevents (Dehghani et al. 2023;
  Wortsman et al. 2023, section 3.1).

Each runs the model once, in eval mode and with teacher forcing (the decoder reads the target, as
in training), and returns plain floats by name. :func:`run_probes` runs probes by name, as a
comparison spec lists them (``probes: [attention]``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..core.attention import AttentionMask, MultiHeadAttention
from ..core.tasks import model_reads

SATURATED = 0.99
"""A row is saturated when its largest weight is above this."""

QUERY_MASKS = {"encoder": "src_mask", "decoder": "tgt_mask"}
"""The batch mask of each stack's query positions (1 for real tokens); a stack of another name,
or a batch without its mask, counts every query row as real."""

ALIGNMENTS = {"copy": False, "reverse": True}
"""Task kinds whose output position ``i`` reads one source position: ``i`` (copy), or ``n - 1 - i``
(reverse, ``mirrored``)."""

_ABSENT = object()  # a module whose kernel is a submodule, with no entry of its own to restore

ProbeName = Literal["attention", "alignment", "logits"]

PROBE_NAMES: dict[str, str] = {
    "attention": "attention_entropy (mean entropy of an attention row over real queries, in nats) and saturated_rows "
    f"(fraction of rows whose largest weight is above {SATURATED}); token models; a sink's share counts as one more "
    "key, and blocks with signed weights (differential attention's A1 - lambda A2), which are no distribution, are "
    "left out",
    "alignment": "alignment (the largest, over decoder layers, mean cross-attention weight an output position puts "
    "on the source position it copies); encoder-decoder models on copy and reverse",
    "logits": "max_attention_logit (the largest query-key logit q.k / sqrt(d_head), after the attention's scale and "
    "before any bias, soft-cap or mask, over every self-attention layer, head, real query and key it may see); token "
    "models",
}
"""Each probe a spec can ask for, with what it measures."""

PROBE_OUTPUTS: dict[str, tuple[str, ...]] = {
    "attention": ("attention_entropy", "saturated_rows"),
    "alignment": ("alignment",),
    "logits": ("max_attention_logit",),
}
"""The measurements each probe may return, by probe name."""


@torch.no_grad()
def _attend(
    model: nn.Module, task: Any, examples: int, need_weights: bool = True
) -> tuple[dict[str, Tensor], Any] | None:
    """The model's inputs for the first ``examples`` test examples and its output (with attention
    weights when ``need_weights``), in eval mode (the model's mode is restored); None for a model
    that reads no tokens."""
    if model_reads(getattr(model, "config", None)) != "tokens":
        return None
    test = task.dataset("test")
    rows = [test[i] for i in range(min(examples, len(test)))]
    if not rows:
        return None
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in task.model_inputs(model, task.collate(rows)).items()}
    was_training = model.training
    model.eval()
    try:
        out = model(**inputs, need_weights=True) if need_weights else model(**inputs)
    finally:
        model.train(was_training)
    return inputs, out


def _real_queries(inputs: dict[str, Tensor], stack: str, weights: Tensor) -> Tensor:
    """``(B, 1, Tq)`` bool: which query rows of a block's ``(B, H, Tq, Tk)`` weights are real tokens."""
    b, _, tq, _ = weights.shape
    mask = inputs.get(QUERY_MASKS.get(stack, ""))
    if mask is None or mask.shape != (b, tq):
        return torch.ones(b, 1, tq, dtype=torch.bool, device=weights.device)
    return mask.bool()[:, None, :].to(weights.device)


def attention_statistics(model: nn.Module, task: Any, examples: int = 64) -> dict[str, float]:
    """Entropy and saturation of a token model's attention rows on the task's test examples.

    The model runs in eval mode with ``need_weights`` on the first ``examples`` test examples
    (teacher forcing for a decoder). Every row of every block (self- and cross-attention), layer
    (or application of a recurrent layer) and head counts once, over real query positions only:
    padded queries are left out by the batch masks (padded keys get no weight anyway), and so is
    a row with no weight at all (a query that sees no key). A row with a single key to see, such
    as a causal decoder's first, has entropy 0 and counts as saturated. With attention sinks a
    row's weights on the keys sum to less than 1: the sink's share, ``1 - sum_k w_k``, counts as
    one more key (it is one, with no value), in the entropy and as a largest weight. A block whose
    weights are signed (any negative entry, as differential attention's ``A1 - lambda A2``) is no
    distribution and is left out.

    Args:
        model: a zoo model; ``task``: the task it was trained on (its ``test`` split is read).
        examples: how many test examples, from the first.

    Returns:
        ``attention_entropy``: the mean entropy of a row, ``-sum_k w_k log w_k``, in nats
        (between 0 and ``log`` of the keys a row sees, a sink counted); ``saturated_rows``: the
        fraction of rows whose largest weight is above :data:`SATURATED`. Empty for a model that
        reads no tokens (image models, the GAN), returns no attention weights, or only signed ones.
    """
    ran = _attend(model, task, examples)
    if ran is None:
        return {}
    inputs, out = ran
    sinks = any(getattr(module, "sinks", None) is not None for module in model.modules())
    entropy, saturated, rows = 0.0, 0, 0
    for stack, layers in (getattr(out, "attentions", None) or {}).items():
        for blocks in layers:
            for weights in blocks.values():  # (B, H, Tq, Tk)
                weights = weights.float()
                if bool((weights < 0).any()):
                    continue
                seen = weights.sum(-1)  # (B, H, Tq)
                real = _real_queries(inputs, stack, weights) & (seen > 0)
                row_entropy = torch.special.entr(weights).sum(-1)  # 0 log 0 = 0
                largest = weights.amax(-1)
                if sinks:  # a block without a sink of its own has a share of 0 up to rounding
                    sink = (1 - seen).clamp(min=0)
                    row_entropy, largest = row_entropy + torch.special.entr(sink), torch.maximum(largest, sink)
                entropy += float(row_entropy[real].sum())
                saturated += int((largest > SATURATED)[real].sum())
                rows += int(real.sum())
    if not rows:
        return {}
    return {"attention_entropy": entropy / rows, "saturated_rows": saturated / rows}


def mirror_alignment(model: nn.Module, task: Any, examples: int = 64, mirrored: bool = True) -> dict[str, float]:
    """How much of each decoder layer's cross-attention lies on the source position an output copies.

    Under teacher forcing the decoder reads ``[BOS, y_0, ..., y_{m-1}]`` and its position ``i``
    predicts ``y_i``; on a source of ``n`` symbols (no BOS or EOS in the source), a reverse writes
    ``y_i = x_{n-1-i}`` and a copy ``y_i = x_i``. For each layer, the weight position ``i`` puts on
    source position ``n - 1 - i`` (``mirrored``) or ``i`` is averaged over heads and over the real
    positions ``i < n`` of the first ``examples`` test examples, every position of every example
    counting once. The model runs in eval mode.

    Args:
        model: an encoder-decoder zoo model; ``task``: a seq2seq task whose batches hold ``src``,
            ``src_mask``, ``tgt`` and ``tgt_mask`` (copy and reverse, ``plugins/tasks/algorithmic``).
        examples: how many test examples, from the first.
        mirrored: True for reverse (the anti-diagonal), False for copy (the diagonal).

    Returns:
        ``layer0``, ``layer1``, ...: the mean weight of each decoder layer (each application, for
        a recurrent stack), between 0 and 1 (1: every head puts all its weight on the position
        read); ``best``: the largest of them. Empty for a model without cross-attention.
    """
    if getattr(model, "architecture", "encoder-decoder") != "encoder-decoder":
        return {}
    ran = _attend(model, task, examples)
    if ran is None:
        return {}
    inputs, out = ran
    layers = [
        blocks["cross"] for blocks in (getattr(out, "attentions", None) or {}).get("decoder", []) if "cross" in blocks
    ]
    if not layers:
        return {}
    batch, tgt_len, src_len = layers[0].size(0), layers[0].size(-2), layers[0].size(-1)
    device = layers[0].device
    src_mask, tgt_mask = inputs.get("src_mask"), inputs.get("tgt_mask")
    n = (src_mask.sum(1) if src_mask is not None else torch.full((batch,), src_len)).to(device)[:, None]  # (B, 1)
    m = (tgt_mask.sum(1) if tgt_mask is not None else torch.full((batch,), tgt_len)).to(device)[:, None]
    i = torch.arange(tgt_len, device=device)[None, :]  # (1, T)
    real = (i < n) & (i < m)  # (B, T)
    read = (n - 1 - i if mirrored else i.expand(batch, -1)).clamp(0, src_len - 1)  # (B, T): the source position
    found = {}
    for layer, weights in enumerate(layers):  # (B, H, T, S)
        index = read[:, None, :, None].expand(-1, weights.size(1), -1, 1)
        on_read = weights.float().gather(-1, index).squeeze(-1).mean(1)  # (B, T), mean over heads
        found[f"layer{layer}"] = float(on_read[real].mean()) if real.any() else 0.0
    found["best"] = max(found.values())
    return found


def largest_logit(q: Tensor, k: Tensor, mask: AttentionMask, sinks: int = 0) -> float | None:
    """The largest logit ``q . k / sqrt(Dh)`` of one attention call over the keys each query may see
    and its real queries: ``(B, H, Tq, Dh)`` queries and ``(B, H, Tk, Dh)`` keys as a kernel receives
    them, the first ``sinks`` of the keys a module's attention sinks (zero keys in front, whose logit
    is the sink's bias alone: :meth:`~transformer_zoo.core.attention.MultiHeadAttention.with_sink`),
    left out. With as many queries as real keys (self-attention without a cache) query ``i`` is key
    ``i``, so the mask's padding leaves out padded queries too. None when no query sees a key."""
    k = k[..., sinks:, :]
    padding = None if mask.padding is None else mask.padding[:, sinks:]
    explicit = None if mask.explicit is None else mask.explicit[..., sinks:]
    mask = AttentionMask(padding=padding, causal=mask.causal, explicit=explicit)
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    seen = mask.dense(q.size(-2), k.size(-2), q.device)
    if seen is not None:
        scores = scores.masked_fill(~seen, float("-inf"))
    if mask.padding is not None and q.size(-2) == k.size(-2):
        real = mask.padding.to(device=q.device, dtype=torch.bool)[:, None, :, None]  # (B, 1, Tq, 1)
        scores = scores.masked_fill(~real, float("-inf"))
    top = float(scores.max()) if scores.numel() else float("-inf")
    return top if top > float("-inf") else None


@contextlib.contextmanager
def recorded_logits(model: nn.Module) -> Iterator[list[float]]:
    """Within the block, each self-attention call of ``model`` appends its :func:`largest_logit`
    to the list yielded. Each self-attention module's kernel is shadowed, in the module's instance
    dictionary, by one that records and then calls it (the module's parameters, submodules and state
    dict stay as they are); removed on leaving. A module is cross-attention by its role, some
    layer's ``cross_attn``, not by whether a call passes ``memory``: a recurrent stack's adaptive
    computation time calls self-attention with the keys' input as ``memory`` when only some
    positions run. The logits are of the queries and keys as the kernel pairs them: a kernel with
    a ``logit_pairs(q, k)`` method (differential attention's) returns the pairs it scores, and any
    other pairs query head ``h`` with key head ``h``."""
    found: list[float] = []
    crossing = {
        id(module.cross_attn)
        for module in model.modules()
        if isinstance(getattr(module, "cross_attn", None), MultiHeadAttention)
    }
    shadowed = []
    for module in model.modules():
        if not isinstance(module, MultiHeadAttention) or id(module) in crossing:
            continue

        def recording(q, k, v, mask, bias, dropout_p, need_weights, kernel=module.kernel, module=module):
            sinks = 0 if getattr(module, "sinks", None) is None else 1
            pairs = getattr(kernel, "logit_pairs", None)
            scored_q, scored_k = (q, k) if pairs is None else pairs(q, k)
            if (top := largest_logit(scored_q, scored_k, mask, sinks)) is not None:
                found.append(top)
            return kernel(q, k, v, mask, bias, dropout_p, need_weights)

        shadowed.append((module, module.__dict__.get("kernel", _ABSENT)))
        module.__dict__["kernel"] = recording  # found before nn.Module's own lookup of a kernel submodule
    try:
        yield found
    finally:
        for module, own in shadowed:
            if own is _ABSENT:
                del module.__dict__["kernel"]
            else:
                module.__dict__["kernel"] = own


def max_attention_logit(model: nn.Module, task: Any, examples: int = 64) -> dict[str, float]:
    """The largest attention logit of a token model's self-attention on the task's test examples.

    The logit of query ``i`` and key ``j`` is ``q_i . k_j / sqrt(d_head)`` as the kernel receives
    them: after the projections, any QK-norm, the in-attention positions (rotary) and the module's
    ``scale`` (which multiplies the queries), before any additive bias (ALiBi), soft-cap or mask;
    attention sinks are not keys of the input, and are left out. Each query head is paired with
    the key head its kernel scores it against (:func:`recorded_logits`).
    The maximum is over every self-attention layer (each application of a recurrent one), head,
    real query and key the mask lets that query see, on the first ``examples`` test examples, in
    eval mode (teacher forcing for a decoder). Wortsman et al. 2023 (section 3.1, Figure 1) plot it
    against the learning rate: it grows with the learning rate unless the queries and keys are
    normalised.

    Returns:
        ``max_attention_logit``; empty for a model that reads no tokens or has no self-attention.
    """
    with recorded_logits(model) as found:
        ran = _attend(model, task, examples, need_weights=False)
    if ran is None or not found:
        return {}
    return {"max_attention_logit": max(found)}


def run_probes(probes: Iterable[str], model: nn.Module, task: Any, examples: int = 64) -> dict[str, float]:
    """The measurements of the named probes (:data:`PROBE_NAMES`) on a trained model, by name
    (:data:`PROBE_OUTPUTS`); a probe that does not apply to the model or the task (alignment on
    a task other than copy or reverse) measures nothing."""
    found: dict[str, float] = {}
    for probe in probes:
        if probe == "attention":
            found.update(attention_statistics(model, task, examples))
        elif probe == "alignment":
            kind = getattr(task, "name", None)
            if kind in ALIGNMENTS:
                alignment = mirror_alignment(model, task, examples, mirrored=ALIGNMENTS[kind])
                if alignment:
                    found["alignment"] = alignment["best"]
        elif probe == "logits":
            found.update(max_attention_logit(model, task, examples))
        else:
            raise ValueError(f"unknown probe {probe!r}; probes: {', '.join(PROBE_NAMES)}")
    return found
