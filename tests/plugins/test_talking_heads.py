"""Talking-heads attention against the paper's einsums written out, its mixing matrices as
parameters, and cached decoding equal to decoding without a cache."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.plugins.relative import T5RelativeBias
from transformer_zoo.plugins.talking_heads import TalkingHeadsKernel

SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
UNTIED = {"head": {"tie_weights": False}}


def talking_heads_by_hand(attn, x, mask, bias):
    """Shazeer et al. 2020, section 4, with the layer's own projections: logits mixed across heads
    by P_l, softmax over the keys, weights mixed by P_w, then the values."""
    b, t, d = x.shape
    h, dh = attn.n_heads, attn.d_head
    q, k, v = (part.view(b, t, h, dh) for part in attn.in_proj(x).split(d, dim=-1))  # (B, T, H, Dh)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh) + bias
    logits = torch.einsum("bhij,hg->bgij", logits, attn.kernel.logits_mix)
    allowed = mask.dense(t, t)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    weights = torch.einsum("bhij,hg->bgij", logits.softmax(-1), attn.kernel.weights_mix)
    out = torch.einsum("bgij,bjgd->bigd", weights, v).reshape(b, t, d)
    return attn.out_proj(out), weights


def test_talking_heads_equals_the_einsums_written_out():
    torch.manual_seed(0)
    positional = T5RelativeBias(4, num_buckets=8, max_distance=20)
    attn = MultiHeadAttention(32, 4, kernel=TalkingHeadsKernel(4), positional=positional).eval()
    with torch.no_grad():
        attn.kernel.logits_mix.copy_(torch.randn(4, 4))
        attn.kernel.weights_mix.copy_(torch.randn(4, 4))
    x = torch.randn(2, 7, 32)
    bias = positional.bias(7, 7, x.device)
    padding = torch.ones(2, 7, dtype=torch.bool)
    padding[1, 5:] = False
    for mask in (
        AttentionMask(),
        AttentionMask(causal=True),
        AttentionMask(padding=padding),
        AttentionMask(padding=padding, causal=True),
    ):
        expected, expected_weights = talking_heads_by_hand(attn, x, mask, bias)
        with torch.no_grad():
            out, weights = attn(x, mask=mask, need_weights=True)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_at_initialisation_it_is_multi_head_attention():
    torch.manual_seed(0)
    talking = tz.build_model(
        "transformer-tiny",
        encoder={"layers": 1, "attention": "talking-heads"},
        decoder={"layers": 1, "attention": "talking-heads"},
        **SMALL,
    ).eval()
    plain = tz.build_model("transformer-tiny", encoder={"layers": 1}, decoder={"layers": 1}, **SMALL).eval()
    plain.load_state_dict({k: v for k, v in talking.state_dict().items() if ".kernel." not in k})
    src, tgt = torch.randint(3, 60, (2, 6)), torch.randint(3, 60, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(talking(src, tgt).logits, plain(src, tgt).logits, atol=1e-5, rtol=1e-5)


def test_the_mixing_matrices_train_and_are_saved(tmp_path):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny", encoder={"layers": 2, "attention": "talking-heads"}, decoder={"layers": 1}, **SMALL
    )
    names = dict(model.named_parameters())
    mixing = [f"encoder.layers.{i}.self_attn.kernel.{m}" for i in range(2) for m in ("logits_mix", "weights_mix")]
    assert all(names[name].shape == (4, 4) for name in mixing)
    assert names[mixing[0]] is not names[mixing[2]], "each layer mixes its own heads"
    src, tgt = torch.randint(3, 60, (2, 6)), torch.randint(3, 60, (2, 5))
    model.loss(model(src, tgt), tgt).backward()
    assert all(names[name].grad.abs().sum() > 0 for name in mixing)
    model.eval()
    with torch.no_grad():
        names[mixing[1]].copy_(torch.randn(4, 4))
    again = tz.from_pretrained(model.save_pretrained(tmp_path / "talking"))
    with torch.no_grad():
        torch.testing.assert_close(again(src, tgt).logits, model(src, tgt).logits)


@pytest.mark.parametrize("positional", ["sinusoidal", "alibi", "t5-bias", "shaw"])
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_cached_greedy_equals_uncached(positional, architecture):
    torch.manual_seed(0)
    stacks = {"decoder": {"layers": 2, "attention": "talking-heads"}}
    if architecture == "decoder-only":
        stacks["encoder"] = None
    model = tz.build_model("transformer-tiny", positional=positional, **stacks, **SMALL, **UNTIED).eval()
    with torch.no_grad():  # away from the identity, so that the heads do talk
        for layer in model.decoder.layers:
            layer.self_attn.kernel.logits_mix.add_(0.5 * torch.randn(4, 4))
            layer.self_attn.kernel.weights_mix.add_(0.5 * torch.randn(4, 4))
    if architecture == "decoder-only":
        inputs = {"prompt": torch.randint(3, 60, (2, 5))}
    else:
        src = torch.randint(3, 60, (3, 8))
        src_mask = torch.ones_like(src)
        src_mask[1, 5:] = 0
        inputs = {"src": src, "src_mask": src_mask, "bos_id": 1}
    cached = greedy_decode(model, **inputs, max_new_tokens=12)
    uncached = greedy_decode(model, **inputs, max_new_tokens=12, use_cache=False)
    assert len(set(cached[:, -12:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, uncached)
