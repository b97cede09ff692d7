"""Differential attention (Ye et al. 2024, arXiv 2410.05258) against the paper's equations written
out, its lambda_init schedule over depth, cached decoding equal to decoding without a cache, the
causal mask, its refusals, and its parameter count."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import DecodeStep, greedy_decode, padding_counts
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.plugins.components import ALiBiOptions, RotaryOptions
from transformer_zoo.plugins.differential import DifferentialKernel, DifferentialOptions

DIFFERENTIAL = {"kind": "differential", "bias": False}


def paper_lambda_init(layer: int) -> float:
    """Section 2.1: lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)), l the layer's index from 1."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def differential_by_hand(attn, x, mask, *, layer, memory=None, bias=None, n_kv_heads=None):
    """Eqs. 1 to 3 of the paper for each differential head j, as the reference code lays out the
    projections: query heads 2j and 2j + 1 are Q1 and Q2; the key/value group i = j // (h / g)
    gives K1, K2 (key heads 2i, 2i + 1) and V (the value's channels [2 i d, 2 (i + 1) d))."""
    source = x if memory is None else memory
    b, t, _ = x.shape
    s = source.size(1)
    h, d = attn.n_heads, attn.d_head
    g = n_kv_heads or h
    w = attn.in_proj.weight
    q = (x @ w[: h * d].T).view(b, t, h, d).transpose(1, 2)  # (B, h, T, d)
    k = (source @ w[h * d : (h + g) * d].T).view(b, s, g, d).transpose(1, 2)  # (B, g, S, d)
    v = (source @ w[(h + g) * d :].T).view(b, s, g // 2, 2 * d).transpose(1, 2)  # (B, g/2, S, 2d)
    if attn.positional is not None and memory is None:
        q, k = attn.positional.rotate(q, k, 0)
    kernel = attn.kernel
    lambda_init = paper_lambda_init(layer)
    lam = (
        torch.exp((kernel.lambda_q1 * kernel.lambda_k1).sum())
        - torch.exp((kernel.lambda_q2 * kernel.lambda_k2).sum())
        + lambda_init
    )
    allowed = mask.dense(t, s)
    allowed = torch.ones(b, 1, t, s, dtype=torch.bool) if allowed is None else allowed.expand(b, 1, t, s)
    bias = torch.zeros(1, h, t, s) if bias is None else bias.expand(1, h, t, s)
    heads, maps = [], []
    for j in range(h // 2):
        i = j // (h // g)  # the key/value group differential head j reads
        two = []
        for part in range(2):  # softmax(Q_part K_part^T / sqrt(d)), masked rows of no key: zeros
            scores = q[:, 2 * j + part] @ k[:, 2 * i + part].transpose(-1, -2) / math.sqrt(d) + bias[:, 2 * j + part]
            scores = scores.masked_fill(~allowed[:, 0], float("-inf"))
            two.append(torch.nan_to_num(scores.softmax(-1), nan=0.0))
        weights = two[0] - lam * two[1]  # (B, T, S)
        out = weights @ v[:, i]  # (B, T, 2d)
        out = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * kernel.head_norm.weight
        heads.append(out * (1 - lambda_init))
        maps.append(weights)
    return attn.out_proj(torch.cat(heads, dim=-1)), torch.stack(maps, dim=1)


def built(*, n_heads=8, n_kv_heads=None, depth=2, positional=None, head_dim=None, d_model=64):
    spec = LayerSpec(d_model=d_model, n_heads=n_heads, depth=depth, in_attention=positional, head_dim=head_dim)
    attn = DifferentialOptions(n_kv_heads=n_kv_heads, bias=False).build(spec).eval()
    with torch.no_grad():  # away from the start, so that lambda and the norm's weight matter
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(attn.kernel, name).normal_(0, 0.5)
        attn.kernel.head_norm.weight.uniform_(0.5, 1.5)
    return attn


def masks(batch: int, length: int) -> list[AttentionMask]:
    right = torch.ones(batch, length, dtype=torch.bool)
    right[1, length - 2 :] = False
    left = torch.ones(batch, length, dtype=torch.bool)
    left[1, :2] = False  # with the causal mask, row 1's first two queries see no key
    return [
        AttentionMask(),
        AttentionMask(causal=True),
        AttentionMask(padding=right),
        AttentionMask(padding=right, causal=True),
        AttentionMask(padding=left, causal=True),
    ]


POSITIONAL = {"none": None, "rotary": RotaryOptions(layout="halves"), "alibi": ALiBiOptions()}


@pytest.mark.parametrize("positional", sorted(POSITIONAL))
@pytest.mark.parametrize("n_kv_heads", [None, 4, 2])
def test_the_equations_written_out(positional, n_kv_heads):
    torch.manual_seed(0)
    options = POSITIONAL[positional]
    positional = None if options is None else options.build(d_model=64, n_heads=8, max_len=32)
    attn = built(n_kv_heads=n_kv_heads, positional=positional)
    x = torch.randn(2, 7, 64)
    bias = None if positional is None else positional.bias(7, 7, x.device)
    for mask in masks(2, 7):
        expected, expected_weights = differential_by_hand(attn, x, mask, layer=3, bias=bias, n_kv_heads=n_kv_heads)
        with torch.no_grad():
            out, weights = attn(x, mask=mask, need_weights=True)
            fused, _ = attn(x, mask=mask)  # the SDPA path, no weights made
        assert weights.shape == (2, 4, 7, 7), "the weights of the h / 2 differential heads"
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)


def test_the_equations_with_wider_heads_and_in_cross_attention():
    torch.manual_seed(0)
    attn = built(head_dim=12, depth=0)
    assert attn.kernel.head_norm.weight.shape == (24,), "the norm is over a differential head's 2d channels"
    x, memory = torch.randn(2, 5, 64), torch.randn(2, 9, 64)
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[0, 6:] = False
    mask = AttentionMask(padding=padding)
    expected, expected_weights = differential_by_hand(attn, x, mask, layer=1, memory=memory)
    with torch.no_grad():
        out, weights = attn(x, memory, mask=mask, need_weights=True)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_grouped_keys_are_multi_head_with_each_pair_repeated(n_kv_heads):
    """Each key/value group (K1, K2 and a value of 2d) serves h / g consecutive differential
    heads: as the ungrouped kind with each group's rows repeated for them."""
    torch.manual_seed(0)
    grouped, reference = built(n_kv_heads=n_kv_heads), built()
    h, d, g = 8, 8, n_kv_heads
    state = grouped.state_dict()
    q, k, v = state["in_proj.weight"].split([h * d, g * d, g * d])
    pairs = [part.unflatten(0, (g // 2, 2 * d)).repeat_interleave(h // g, 0).flatten(0, 1) for part in (k, v)]
    state["in_proj.weight"] = torch.cat([q, *pairs])
    reference.load_state_dict(state)
    x = torch.randn(2, 6, 64)
    padding = torch.ones(2, 6, dtype=torch.bool)
    padding[1, 4:] = False
    for mask in (AttentionMask(causal=True), AttentionMask(padding=padding)):
        with torch.no_grad():
            torch.testing.assert_close(grouped(x, mask=mask)[0], reference(x, mask=mask)[0], atol=1e-5, rtol=1e-5)


def test_lambda_init_follows_the_depth_schedule():
    model = tz.build_model("llama-tiny", decoder={"layers": 3, "attention": DIFFERENTIAL})
    found = [layer.self_attn.kernel.lambda_init for layer in model.decoder.layers]
    assert found == pytest.approx([paper_lambda_init(layer) for layer in (1, 2, 3)], abs=1e-12)
    assert found[0] == pytest.approx(0.2), "the first layer starts at 0.8 - 0.6"
    fixed = tz.build_model("llama-tiny", decoder={"layers": 3, "attention": {**DIFFERENTIAL, "lambda_init": 0.5}})
    assert [layer.self_attn.kernel.lambda_init for layer in fixed.decoder.layers] == [0.5] * 3


def test_each_stack_counts_its_own_depth():
    model = tz.build_model(
        "transformer-tiny",
        encoder={"layers": 2, "attention": "differential"},
        decoder={"layers": 2, "attention": "differential", "cross_attention": "differential"},
    )
    for stack in (model.encoder, model.decoder):
        assert [layer.self_attn.kernel.lambda_init for layer in stack.layers] == pytest.approx(
            [paper_lambda_init(1), paper_lambda_init(2)]
        )
    assert [layer.cross_attn.kernel.lambda_init for layer in model.decoder.layers] == pytest.approx(
        [paper_lambda_init(1), paper_lambda_init(2)]
    )


def moved_lambdas(model):
    """Lambdas and norm weights away from their start, so that a cache that read them wrong would show."""
    torch.manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DifferentialKernel):
                for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                    getattr(module, name).normal_(0, 0.5)
                module.head_norm.weight.uniform_(0.5, 1.5)
    return model.eval()


def stepwise_logits(model, ids, prompt_len, prompt_mask=None, use_cache=True):
    """Next-token logits after each prefix of ``ids`` from ``prompt_len`` on, (B, steps, V)."""
    cache = None
    if use_cache:
        cache = DecoderCache(left_padding=None if prompt_mask is None else padding_counts(prompt_mask))
    step = DecodeStep(model, None, None, cache, prompt_mask=prompt_mask)
    with torch.no_grad():
        if use_cache:
            logits = [step(ids[:, :prompt_len])]
            logits += [step(ids[:, t : t + 1]) for t in range(prompt_len, ids.size(1))]
        else:
            logits = [step(ids[:, :t]) for t in range(prompt_len, ids.size(1) + 1)]
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize(
    "attention, positional",
    [(DIFFERENTIAL, None), ({**DIFFERENTIAL, "n_kv_heads": 2}, None), (DIFFERENTIAL, "alibi")],
)
def test_cached_decoding_equals_uncached(attention, positional):
    torch.manual_seed(0)
    extra = {} if positional is None else {"positional": positional}
    model = moved_lambdas(tz.build_model("llama-tiny", decoder={"layers": 2, "attention": attention}, **extra))
    prompt = torch.randint(3, 200, (3, 5))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=12)
    uncached = greedy_decode(model, prompt=prompt, max_new_tokens=12, use_cache=False)
    assert len(set(cached[:, 5:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, uncached)
    torch.testing.assert_close(
        stepwise_logits(model, cached, 5), stepwise_logits(model, cached, 5, use_cache=False), atol=1e-5, rtol=1e-5
    )


def test_cached_decoding_of_a_left_padded_batch():
    torch.manual_seed(0)
    model = moved_lambdas(tz.build_model("llama-tiny", decoder={"layers": 2, "attention": DIFFERENTIAL}))
    prompt = torch.randint(3, 200, (3, 6))
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, :2] = 0
    prompt_mask[2, :4] = 0
    cached = greedy_decode(model, prompt=prompt, prompt_mask=prompt_mask, max_new_tokens=10)
    uncached = greedy_decode(model, prompt=prompt, prompt_mask=prompt_mask, max_new_tokens=10, use_cache=False)
    assert len(set(cached[:, 6:].flatten().tolist())) > 3
    assert torch.equal(cached, uncached)
    mask = prompt_mask.bool()
    torch.testing.assert_close(
        stepwise_logits(model, cached, 6, mask), stepwise_logits(model, cached, 6, mask, use_cache=False)
    )
    alone = greedy_decode(model, prompt=prompt[2:, 4:], max_new_tokens=10)
    assert torch.equal(cached[2:, 6:], alone[:, 2:]), "a padded row decodes as it would alone"


def test_the_output_gate_and_value_residuals_reach_it():
    """The module's output gate acts on the differential heads' concatenated outputs, and a value
    residual on the values before they are paired; decoding on the cache still equals decoding without."""
    torch.manual_seed(0)
    attention = {**DIFFERENTIAL, "gate": True}
    model = tz.build_model("llama-tiny", decoder={"layers": 3, "value_residual": True, "attention": attention})
    model = moved_lambdas(model)
    assert model.decoder.layers[1].self_attn.gate_proj.out_features == 64
    prompt = torch.randint(3, 200, (2, 5))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=10)
    assert torch.equal(cached, greedy_decode(model, prompt=prompt, max_new_tokens=10, use_cache=False))


def test_a_later_token_changes_no_earlier_output():
    torch.manual_seed(0)
    model = moved_lambdas(tz.build_model("llama-tiny", decoder={"layers": 2, "attention": DIFFERENTIAL}))
    ids = torch.randint(3, 200, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(3, 200, (2, 4))
    with torch.no_grad():
        before, after = model.decode(ids).hidden, model.decode(changed).hidden
    torch.testing.assert_close(after[:, :6], before[:, :6], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after[:, 6:], before[:, 6:]), "the changed positions do change"


def test_refusals_say_what_would_work():
    with pytest.raises(ConfigError, match="n_heads must be even, got 1; use an even number of heads"):
        tz.build_model("llama-tiny", n_heads=1, decoder={"attention": DIFFERENTIAL})
    with pytest.raises(ConfigError, match="n_kv_heads must be even, got 1; choose an even divisor of n_heads"):
        tz.build_model("llama-tiny", decoder={"attention": {**DIFFERENTIAL, "n_kv_heads": 1}})
    with pytest.raises(ConfigError, match="does not soft-cap its scores"):
        tz.build_model("llama-tiny", decoder={"attention": {**DIFFERENTIAL, "softcap": 30.0}})
    with pytest.raises(ConfigError, match="differential attention does not take sinks"):
        tz.build_model("llama-tiny", decoder={"attention": {**DIFFERENTIAL, "sinks": True}})
    with pytest.raises(ConfigError, match="lambda_init"):
        tz.build_model("llama-tiny", decoder={"attention": {**DIFFERENTIAL, "lambda_init": 1.0}})
    with pytest.raises(ValueError, match="must be even"):
        DifferentialKernel(3, 8, 0.2)
    with pytest.raises(ValueError, match="must be even"):
        DifferentialKernel(4, 8, 0.2, kv_group=4)  # one key/value head cannot pair


def test_parameters_are_multi_head_attentions_plus_the_lambdas_and_the_norm():
    """Per layer, 4 lambda vectors of d = d_model / n_heads and a norm weight of 2d: 6d = 96 for
    llama-tiny's d = 16; nothing else differs from multi-head attention with the same projections."""
    layers, d = 3, 64 // 4
    mha = {"kind": "sdpa", "bias": False, "n_kv_heads": None}  # over llama-tiny's grouped keys
    plain = tz.build_model("llama-tiny", decoder={"layers": layers, "attention": mha})
    differential = tz.build_model("llama-tiny", decoder={"layers": layers, "attention": DIFFERENTIAL})
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(differential) - count(plain) == layers * (4 * d + 2 * d) == 288
    names = {n for n, _ in differential.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert names == {
        f"decoder.layers.{i}.self_attn.kernel.{name}"
        for i in range(layers)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "head_norm.weight")
    }


def test_the_lambdas_train_and_are_saved(tmp_path):
    torch.manual_seed(0)
    model = tz.build_model("llama-tiny", decoder={"layers": 2, "attention": DIFFERENTIAL})
    ids = torch.randint(3, 200, (2, 8))
    model.loss(model(tgt=ids), ids).backward()
    kernel = model.decoder.layers[1].self_attn.kernel
    for parameter in (kernel.lambda_q1, kernel.lambda_k2, kernel.head_norm.weight):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    model = moved_lambdas(model)
    again = tz.from_pretrained(model.save_pretrained(tmp_path / "differential")).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(tgt=ids).logits, model(tgt=ids).logits)
