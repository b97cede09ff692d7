"""The ``logits`` probe: the largest attention logit ``q . k / sqrt(d_head)`` of a trained model's
self-attention, checked against the logits computed here from each layer's input and weights."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.comparing.probes import (
    PROBE_NAMES,
    PROBE_OUTPUTS,
    largest_logit,
    max_attention_logit,
    recorded_logits,
    run_probes,
)
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention
from transformer_zoo.plugins.tasks.algorithmic import ReverseOptions
from transformer_zoo.plugins.tasks.python_source import PythonSourceOptions

EXAMPLES = 6


def reverse_task():
    return ReverseOptions(symbols=5, train_lengths=(2, 7), train_size=8, test_size=12).build()


def batch_of(task, model) -> dict[str, torch.Tensor]:
    rows = [task.dataset("test")[i] for i in range(EXAMPLES)]
    return task.model_inputs(model, task.collate(rows))


def layer_inputs(model, inputs) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Each attention module's input ``x`` and ``memory`` in one eval-mode forward pass, by module name."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):

            def keep(_module, args, kwargs, name=name):
                seen[name] = (args[0], args[1] if len(args) > 1 else kwargs.get("memory"))

            hooks.append(module.register_forward_pre_hook(keep, with_kwargs=True))
    model.eval()
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    return seen


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, T, n * Dh)`` to ``(B, n, T, Dh)``."""
    b, t, d = x.shape
    return x.view(b, t, n, d // n).transpose(1, 2)


def rotated(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary positions on ``(B, H, T, Dh)`` as Llama applies them: channel ``i`` of the first half
    paired with channel ``i`` of the second, turned by ``position * base ** (-2i / Dh)``."""
    d, t = x.size(-1), x.size(-2)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).float() for f in (torch.cos, torch.sin))
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


@torch.no_grad()
def transformer_logits(model, inputs, scale: float | None) -> tuple[float, float, float]:
    """From each layer's input: the largest self-attention logit over real queries and the keys they
    may see, the largest with nothing masked, and the largest cross-attention logit."""
    d, h = model.config.d_model, model.config.n_heads
    dh = d // h
    factor = 1 / math.sqrt(dh) if scale is None else scale
    src, tgt = inputs["src_mask"].bool(), inputs["tgt_mask"].bool()
    masked, unmasked, cross = -math.inf, -math.inf, -math.inf
    for name, (x, memory) in layer_inputs(model, inputs).items():
        module = model.get_submodule(name)
        w, b = module.in_proj.weight, module.in_proj.bias
        q = heads(x @ w[:d].T + b[:d], h)
        k = heads((x if memory is None else memory) @ w[d : 2 * d].T + b[d : 2 * d], h)
        logits = factor * q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
        if memory is not None:
            cross = max(cross, float(logits.max()))
            continue
        real = src if name.startswith("encoder") else tgt  # (B, T)
        sees = real[:, None, None, :] & real[:, None, :, None]
        if name.startswith("decoder"):
            sees = sees & torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
        masked = max(masked, float(logits.masked_fill(~sees, -math.inf).max()))
        unmasked = max(unmasked, float(logits.max()))
    return masked, unmasked, cross


@pytest.mark.parametrize("scale", [None, 1.0])
def test_the_largest_logit_is_over_self_attention_real_queries_and_the_keys_they_see(scale):
    """An encoder-decoder on a padded task: padded queries and keys, future keys and the (much
    larger, here) cross-attention logits are all left out; a scale other than 1/sqrt(d_head) counts."""
    task = reverse_task()
    attention = {"kind": "sdpa", "scale": scale}
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        vocab_size=task.vocab_size,
        dropout=0.0,
        encoder={"attention": attention},
        decoder={"attention": attention, "cross_attention": {"kind": "sdpa"}},
    )
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("cross_attn"):
                module.in_proj.weight.mul_(10.0)
    inputs = batch_of(task, model)
    masked, unmasked, cross = transformer_logits(model, inputs, scale)
    assert masked < unmasked and masked < cross, "the case must tell what is left out from what is not"
    found = max_attention_logit(model, task, examples=EXAMPLES)
    assert found["max_attention_logit"] == pytest.approx(masked, rel=1e-5)


@torch.no_grad()
def llama_logits(model, inputs, kv: int) -> dict[str, float]:
    """From each layer's input: the largest causal logit of the rotated, normalised queries and keys;
    and the largest with no causal mask, with no rotation, and with no QK-norm gains."""
    d, h = model.config.d_model, model.config.n_heads
    dh = d // h
    found = dict.fromkeys(("logit", "no mask", "no rotation", "no gains"), -math.inf)

    def normed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # RMSNorm over a head's channels
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    for name, (x, _) in layer_inputs(model, inputs).items():
        module = model.get_submodule(name)
        w = module.in_proj.weight
        causal = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
        for case in found:
            turn = (lambda t: t) if case == "no rotation" else rotated
            gains = [torch.ones(dh)] * 2 if case == "no gains" else [module.q_norm.weight, module.k_norm.weight]
            q = turn(normed(heads(x @ w[:d].T, h), gains[0]))
            k = turn(normed(heads(x @ w[d : d + kv * dh].T, kv), gains[1]))
            k = k.repeat_interleave(h // kv, dim=1)  # query head i reads key head i // 2
            logits = q @ k.transpose(-2, -1) / math.sqrt(dh)  # (B, H, T, T)
            if case != "no mask":
                logits = logits.masked_fill(~causal, -math.inf)
            found[case] = max(found[case], float(logits.max()))
    return found


@pytest.mark.parametrize("sinks", [False, True])
def test_the_logits_are_after_qk_norm_and_rotary_with_grouped_keys(sinks):
    """llama-tiny with per-head QK-norm (its gains set apart from 1) and two key heads shared by
    four query heads, causal: the logits come from the rotated, normalised queries and keys. An
    attention sink (here a logit of 100, above every other) is no key of the input: left out."""
    task = PythonSourceOptions(max_len=16, longer=[], train_tokens=256, test_tokens=256).build()
    torch.manual_seed(3)  # a draw whose largest logit each left-out step would change
    attention = {"kind": "sdpa", "bias": False, "n_kv_heads": 2, "qk_norm": "head", "sinks": sinks}
    model = tz.build_model("llama-tiny", vocab_size=task.vocab_size, decoder={"layers": 2, "attention": attention})
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.q_norm.weight.uniform_(0.5, 3.0)
                module.k_norm.weight.uniform_(0.5, 3.0)
                if sinks:
                    module.sinks.fill_(100.0)
    inputs = batch_of(task, model)
    assert bool(inputs["tgt_mask"].all())  # windows of text: no padding
    found = llama_logits(model, inputs, kv=2)
    assert all(abs(value - found["logit"]) > 1e-3 for case, value in found.items() if case != "logit")
    assert max_attention_logit(model, task, EXAMPLES)["max_attention_logit"] == pytest.approx(found["logit"], rel=1e-5)


@pytest.mark.parametrize("sinks", [0, 1])
def test_the_largest_logit_of_one_call_leaves_out_padding_and_sinks(sinks):
    """Two positions of width 4, the second padded: its query's logit (10) and its key's (-6) are
    left out, and so is a sink's zero key in front (logit 0): the largest is the real pair's, -2."""
    q = torch.stack([-torch.ones(4), 5 * torch.ones(4)])[None, None]  # (1, 1, 2, 4)
    k = torch.stack([torch.ones(4), 3 * torch.ones(4)])[None, None]
    padding = torch.tensor([[True, False]])
    if sinks:
        k = torch.cat([torch.zeros(1, 1, 1, 4), k], dim=-2)
        padding = torch.cat([torch.ones(1, 1, dtype=torch.bool), padding], dim=-1)
    assert largest_logit(q, k, AttentionMask(padding=padding), sinks) == pytest.approx(-2.0)
    assert largest_logit(q, k, AttentionMask(padding=torch.zeros_like(padding)), sinks) is None


def test_the_kernels_are_restored_and_the_model_is_unchanged():
    """A plain-function kernel and an ``nn.Module`` kernel (talking heads) are back in place after the
    probe, the state dict's names unchanged and the model's mode restored."""
    task = reverse_task()
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny", vocab_size=task.vocab_size, dropout=0.0, encoder={"attention": {"kind": "talking-heads"}}
    )
    kernels = {name: m.kernel for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    assert any(isinstance(k, torch.nn.Module) for k in kernels.values())
    names = list(model.state_dict())
    model.train()
    found = max_attention_logit(model, task, EXAMPLES)
    assert math.isfinite(found["max_attention_logit"])
    assert {name: m.kernel for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)} == kernels
    for name, kernel in kernels.items():  # a submodule kernel is found as a submodule again, not shadowed
        assert isinstance(kernel, torch.nn.Module) != ("kernel" in model.get_submodule(name).__dict__)
    assert list(model.state_dict()) == names and model.training


def test_the_probe_is_named_and_run_by_name():
    task = reverse_task()
    torch.manual_seed(0)
    model = tz.build_model("transformer-tiny", vocab_size=task.vocab_size, dropout=0.0)
    assert PROBE_OUTPUTS["logits"] == ("max_attention_logit",) and "max_attention_logit" in PROBE_NAMES["logits"]
    assert run_probes(["logits"], model, task, EXAMPLES) == max_attention_logit(model, task, EXAMPLES)
    digits = tz.build_model("vit-tiny")
    assert max_attention_logit(digits, task) == {}  # reads images, not tokens


@torch.no_grad()
def test_a_recurrent_stacks_running_positions_attend_as_self_attention():
    """Adaptive computation time sends only the running positions through the shared layer, whose
    self-attention then reads the keys' input as ``memory``: those calls are self-attention's, by
    the module's role, and count. Each call's largest logit is recomputed here from its inputs."""
    task = reverse_task()
    torch.manual_seed(0)
    model = tz.build_model("universal-transformer-tiny", vocab_size=task.vocab_size, dropout=0.0).eval()
    for stack in (model.encoder, model.decoder):
        stack.halting.weight.normal_(0.0, 3.0)  # positions halt at different steps
    d, h = model.config.d_model, model.config.n_heads
    calls = []

    def expected(module, args, kwargs):
        x, memory, mask = args[0], args[1] if len(args) > 1 else kwargs.get("memory"), kwargs["mask"]
        keys = x if memory is None else memory
        w, b = module.in_proj.weight, module.in_proj.bias
        logits = heads(x @ w[:d].T + b[:d], h) @ heads(keys @ w[d : 2 * d].T + b[d : 2 * d], h).transpose(-2, -1)
        sees = mask.padding[:, None, None, :]  # (B, 1, 1, Tk)
        if mask.explicit is not None:
            sees = sees & mask.explicit
        elif mask.causal:
            sees = sees & torch.ones(x.size(1), keys.size(1), dtype=torch.bool).tril()
        if memory is None:  # queries are the keys' positions: padded ones are left out
            sees = sees & mask.padding[:, None, :, None]
        calls.append((memory is not None, float((logits / math.sqrt(d // h)).masked_fill(~sees, -math.inf).max())))

    hooks = [
        stack.layer.self_attn.register_forward_pre_hook(expected, with_kwargs=True)
        for stack in (model.encoder, model.decoder)
    ]
    found = max_attention_logit(model, task, EXAMPLES)
    for hook in hooks:
        hook.remove()
    assert {gathered for gathered, _ in calls} == {False, True}, "some steps run every position, some only a few"
    with recorded_logits(model) as recorded:
        model(**batch_of(task, model))
    assert len(recorded) == len(calls), "every application of the self-attention counts"
    assert found["max_attention_logit"] == pytest.approx(max(top for _, top in calls), rel=1e-5)
    assert recorded == pytest.approx([top for _, top in calls], rel=1e-5)


@torch.no_grad()
def test_differential_attention_pairs_each_query_head_with_the_key_its_kernel_scores():
    """Differential attention with 4 query heads (2 differential heads) and 2 key heads, the
    reference's grouped layout: differential head ``j`` has queries ``2j``, ``2j + 1`` and reads the
    one pair of key heads (``K1, K2``), so query heads 2 and 3 read key heads 0 and 1; the module's
    repetition would give them key head 1 alone."""
    task = PythonSourceOptions(max_len=16, longer=[], train_tokens=256, test_tokens=256).build()
    torch.manual_seed(0)
    attention = {"kind": "differential", "bias": False, "n_kv_heads": 2}
    model = tz.build_model(
        "llama-tiny", init_std=1.0, vocab_size=task.vocab_size, decoder={"layers": 2, "attention": attention}
    )
    d, h, kv = model.config.d_model, model.config.n_heads, 2
    dh = d // h
    inputs = batch_of(task, model)
    assert bool(inputs["tgt_mask"].all())  # windows of text: no padding
    largest = {"kernel's": -math.inf, "repeated": -math.inf}
    for name, (x, _) in layer_inputs(model, inputs).items():
        w = model.get_submodule(name).in_proj.weight
        q = rotated(heads(x @ w[:d].T, h))
        k = rotated(heads(x @ w[d : d + kv * dh].T, kv))
        causal = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
        pairs = {"kernel's": [0, 1, 0, 1], "repeated": [0, 0, 1, 1]}  # the key head of each query head
        for case, keys in pairs.items():
            logits = q @ k[:, keys].transpose(-2, -1) / math.sqrt(dh)  # (B, H, T, T)
            largest[case] = max(largest[case], float(logits.masked_fill(~causal, -math.inf).max()))
    assert abs(largest["kernel's"] - largest["repeated"]) > 1e-3
    found = max_attention_logit(model, task, EXAMPLES)["max_attention_logit"]
    assert found == pytest.approx(largest["kernel's"], rel=1e-5)
