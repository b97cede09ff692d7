"""T5's relative bias and Shaw et al.'s relative keys against their papers' formulas written out,
and decoding on either cache equal to decoding without one."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, MultiHeadAttention, math_kernel
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.plugins.relative import ShawRelativeKeys, T5RelativeBias, relative_position_bucket

SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
UNTIED = {"head": {"tie_weights": False}}  # a random tied model only repeats its input token


# ---- T5 -----------------------------------------------------------------------------------
# (key - query distance, bucket) with T5's defaults: 32 buckets, max_distance 128. Bidirectional:
# 16 per direction, 8 exact; later keys in 16..31. Unidirectional: 32 for earlier keys, 16 exact.
BIDIRECTIONAL = [
    (0, 0),
    (-1, 1),
    (-7, 7),
    (-8, 8),
    (-12, 9),
    (-20, 10),
    (-50, 13),
    (-100, 15),
    (-1000, 15),
    (1, 17),
    (7, 23),
    (8, 24),
    (20, 26),
    (200, 31),
]
UNIDIRECTIONAL = [
    (0, 0),
    (-1, 1),
    (-15, 15),
    (-16, 16),
    (-20, 17),
    (-32, 21),
    (-64, 26),
    (-100, 30),
    (-1000, 31),
    (1, 0),
    (50, 0),
]


@pytest.mark.parametrize(
    ("bidirectional", "table"),
    [(True, BIDIRECTIONAL), (False, UNIDIRECTIONAL)],
    ids=["bidirectional", "unidirectional"],
)
def test_t5_buckets_match_a_table_by_hand(bidirectional, table):
    relative = torch.tensor([distance for distance, _ in table])
    buckets = relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert buckets.tolist() == [bucket for _, bucket in table]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_equal_transformers(bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-300, 301)[None, :]
    for num_buckets, max_distance in ((32, 128), (8, 20), (64, 256)):
        expected = t5.T5Attention._relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        got = relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        assert torch.equal(got, expected), (num_buckets, max_distance)


def bucket_by_hand(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's bucketing, one distance at a time, in Python floats."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket = num_buckets if relative > 0 else 0
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    max_exact = num_buckets // 2
    if distance < max_exact:
        return bucket + distance
    large = max_exact + int(
        math.log(distance / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_is_the_table_entry_of_each_pairs_bucket(bidirectional):
    torch.manual_seed(0)
    # 8 buckets up to distance 20: no distance below 20 falls on a bucket's edge, where float32 and
    # Python floats could disagree
    positional = T5RelativeBias(3, num_buckets=8, max_distance=20, bidirectional=bidirectional)
    table = positional.relative_attention_bias.weight  # (buckets, H)
    for q_len, k_len, q_offset in ((9, 9, None), (1, 9, None), (3, 25, None), (2, 12, torch.tensor(4))):
        bias = positional.bias(q_len, k_len, torch.device("cpu"), q_offset=q_offset)
        assert bias.shape == (3, q_len, k_len)
        start = k_len - q_len if q_offset is None else int(q_offset)
        for h in range(3):
            for i in range(q_len):
                for j in range(k_len):
                    bucket = bucket_by_hand(j - (start + i), bidirectional, 8, 20)
                    assert bias[h, i, j].item() == table[bucket, h].item(), (q_len, k_len, h, i, j)


def attention_by_hand(attn: MultiHeadAttention, x: torch.Tensor, mask: AttentionMask, logit) -> tuple:
    """Softmax attention with the layer's own projections and ``logit(b, h, i, j, q, k)`` per pair,
    masked, written out; returns the output and the weights."""
    b, t, d = x.shape
    h, dh = attn.n_heads, attn.d_head
    q, k, v = (part.view(b, t, h, dh).transpose(1, 2) for part in attn.in_proj(x).split(d, dim=-1))  # (B, H, T, Dh)
    scores = torch.tensor(
        [[[[logit(bb, hh, i, j, q, k) for j in range(t)] for i in range(t)] for hh in range(h)] for bb in range(b)]
    )
    allowed = mask.dense(t, t)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(-1)
    out = (weights @ v).transpose(1, 2).reshape(b, t, d)
    return attn.out_proj(out), weights


def masks(t: int) -> list[AttentionMask]:
    padding = torch.ones(2, t, dtype=torch.bool)
    padding[1, t - 2 :] = False
    return [
        AttentionMask(),
        AttentionMask(causal=True),
        AttentionMask(padding=padding),
        AttentionMask(padding=padding, causal=True),
    ]


def test_t5_attention_adds_the_bias_of_each_pair():
    torch.manual_seed(0)
    positional = T5RelativeBias(2, num_buckets=8, max_distance=20)
    attn = MultiHeadAttention(16, 2, kernel=math_kernel, positional=positional).eval()
    table = positional.relative_attention_bias.weight
    x = torch.randn(2, 6, 16)

    def logit(b, h, i, j, q, k):
        return ((q[b, h, i] @ k[b, h, j]) / math.sqrt(8) + table[bucket_by_hand(j - i, True, 8, 20), h]).item()

    for mask in masks(6):
        expected, expected_weights = attention_by_hand(attn, x, mask, logit)
        with torch.no_grad():
            out, weights = attn(x, mask=mask, need_weights=True)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ---- Shaw ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [None, 0.5])
def test_shaw_logits_are_q_dot_key_plus_relative_key(scale):
    """e_ij = q_i . (k_j + a_clip(j - i, K)) / sqrt(d_head) (Shaw et al. 2018, eq. 4); with a
    ``scale``, that factor on the whole product instead."""
    torch.manual_seed(0)
    clip = 2
    positional = ShawRelativeKeys(8, clip)
    attn = MultiHeadAttention(16, 2, kernel=math_kernel, positional=positional, scale=scale).eval()
    a = positional.relative_keys.weight  # (2K + 1, Dh): row r is distance r - K
    factor = 1 / math.sqrt(8) if scale is None else scale
    x = torch.randn(2, 7, 16)

    def logit(b, h, i, j, q, k):
        return (q[b, h, i] @ (k[b, h, j] + a[min(max(j - i, -clip), clip) + clip]) * factor).item()

    for mask in masks(7):
        expected, expected_weights = attention_by_hand(attn, x, mask, logit)
        with torch.no_grad():
            out, weights = attn(x, mask=mask, need_weights=True)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        with torch.no_grad():  # the fused kernel takes the same bias
            fused = MultiHeadAttention(16, 2, positional=positional, scale=scale).eval()
            fused.load_state_dict(attn.state_dict())
            torch.testing.assert_close(fused(x, mask=mask)[0], expected, atol=1e-5, rtol=1e-5)


def test_shaw_positions_are_end_aligned_or_start_at_the_static_offset():
    torch.manual_seed(0)
    positional = ShawRelativeKeys(4, 3)
    q = torch.randn(1, 2, 3, 4)
    end = positional.query_bias(q, 9)  # the last 3 of 9 positions: 6, 7, 8
    assert end.shape == (1, 2, 3, 9)
    static = positional.query_bias(q, 12, q_offset=torch.tensor(6))  # a buffer of 12, queries at 6, 7, 8
    torch.testing.assert_close(static[..., :9], end)


# ---- in models ----------------------------------------------------------------------------
RELATIVE = [
    "t5-bias",
    {"kind": "t5-bias", "bidirectional": False, "num_buckets": 8, "max_distance": 16},
    "shaw",
    {"kind": "shaw", "max_relative_position": 2},
]
IDS = ["t5-bias", "t5-bias-unidirectional", "shaw", "shaw-clip-2"]


@pytest.mark.parametrize("positional", RELATIVE, ids=IDS)
@pytest.mark.parametrize("static_cache", [False, True], ids=["dynamic", "static"])
def test_cached_greedy_equals_uncached_encoder_decoder(positional, static_cache):
    torch.manual_seed(0)
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL, **UNTIED).eval()
    src = torch.randint(3, 60, (4, 9))
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    cached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, static_cache=static_cache)
    uncached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, use_cache=False)
    assert cached.shape == (4, 21)
    assert len(set(cached[:, 1:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", RELATIVE, ids=IDS)
@pytest.mark.parametrize("static_cache", [False, True], ids=["dynamic", "static"])
def test_cached_greedy_equals_uncached_decoder_only(positional, static_cache):
    torch.manual_seed(0)
    model = tz.build_model("transformer-tiny", encoder=None, positional=positional, **SMALL, **UNTIED).eval()
    prompt = torch.randint(3, 60, (2, 5))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=12, static_cache=static_cache)
    uncached = greedy_decode(model, prompt=prompt, max_new_tokens=12, use_cache=False)
    assert cached.shape == (2, 17)
    assert len(set(cached[:, 5:].flatten().tolist())) > 3
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", ["t5-bias", "shaw"])
def test_one_table_per_stack_shared_by_its_layers(positional, tmp_path):
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL).eval()
    for stack in (model.encoder, model.decoder):
        first, second = (layer.self_attn.positional for layer in stack.layers)
        assert first is second
    assert model.encoder.layers[0].self_attn.positional is not model.decoder.layers[0].self_attn.positional
    assert all(layer.cross_attn.positional is None for layer in model.decoder.layers)
    with torch.no_grad():
        for parameter in model.encoder.layers[0].self_attn.positional.parameters():
            parameter.normal_()
    again = tz.from_pretrained(model.save_pretrained(tmp_path / positional))
    src, tgt = torch.randint(3, 60, (2, 6)), torch.randint(3, 60, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(again(src, tgt).logits, model(src, tgt).logits)


@pytest.mark.parametrize("positional", ["t5-bias", "shaw"])
def test_a_model_exports_with_a_dynamic_length(positional):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny", positional=positional, encoder={"layers": 1}, decoder={"layers": 1}, **SMALL
    ).eval()

    def inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
        src_mask = torch.ones(batch, length, dtype=torch.long)
        src_mask[0, length // 2 :] = 0
        return {
            "src": torch.randint(3, 60, (batch, length)),
            "src_mask": src_mask,
            "tgt": torch.randint(3, 60, (batch, length - 1)),
        }

    dynamic = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in ("src", "src_mask", "tgt")}
    program = torch.export.export(model, (), inputs(2, 6), dynamic_shapes=dynamic)
    longer = inputs(3, 11)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(**longer).logits, model(**longer).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("positional", "message"),
    [
        ({"kind": "t5-bias", "num_buckets": 3}, "num_buckets=3 leaves 1 per direction"),
        ({"kind": "t5-bias", "num_buckets": 32, "max_distance": 8}, "max_distance=8 must pass the 8 exact distances"),
        ({"kind": "shaw", "max_relative_position": 0}, "max_relative_position"),
        ({"kind": "shaw", "random_offset": 4}, "depend only on the distance"),
        ({"kind": "t5-bias", "random_offset": 4}, "depend only on the distance"),
    ],
)
def test_bad_options_are_refused_at_validation(positional, message):
    with pytest.raises(tz.ConfigError, match=message):
        tz.load_config({"variant": "transformer-tiny", "positional": positional})


@pytest.mark.parametrize("positional", ["t5-bias", "shaw"])
def test_kinds_that_form_no_scores_refuse_them(positional):
    with pytest.raises(tz.ConfigError, match="cannot add the bias"):
        tz.load_config(
            {
                "variant": "local-global-encoder-tiny",
                "positional": positional,
                "encoder": {"attention": {"kind": "sliding-window"}},
            }
        )
