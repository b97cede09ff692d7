"""Linear attention, Performer (FAVOR+) and Linformer: each equals its paper's formula written out,
the causal kinds decode on running sums of constant size, and what a kind cannot take is refused."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask, attention_math
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import greedy_decode, static_cache_problem
from transformer_zoo.core.options import LayerSpec
from transformer_zoo.plugins.efficient import kernels
from transformer_zoo.registry import get_registry

D_MODEL, HEADS = 16, 2
D_HEAD = D_MODEL // HEADS
SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
UNTIED = {"head": {"tie_weights": False}}  # a random tied model only repeats its input token


def attention(kind: str, **options) -> torch.nn.Module:
    values = get_registry().component("attention", kind).model_validate({"kind": kind, **options})
    return values.build(LayerSpec(d_model=D_MODEL, n_heads=HEADS)).eval()


def heads(attn: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The layer's own queries, keys and values, ``(B, H, T, Dh)`` each."""
    b, t, _ = x.shape
    return tuple(part.view(b, t, HEADS, D_HEAD).transpose(1, 2) for part in attn.in_proj(x).chunk(3, dim=-1))


def output(attn: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, Dh)`` heads joined and projected, as the layer does."""
    b, _, t, _ = out.shape
    return attn.out_proj(out.transpose(1, 2).reshape(b, t, D_MODEL))


def feature_attention(phi, q, k, v, padding, causal) -> torch.Tensor:
    """``sum_j phi(q_i) . phi(k_j) v_j / sum_j phi(q_i) . phi(k_j)`` over the keys query ``i`` sees,
    one query at a time."""
    out = torch.zeros_like(q)
    for b in range(q.size(0)):
        for h in range(q.size(1)):
            for i in range(q.size(2)):
                seen = [j for j in range(k.size(2)) if padding[b, j] and (j <= i or not causal)]
                similarity = torch.stack([phi(q[b, h, i]) @ phi(k[b, h, j]) for j in seen])
                out[b, h, i] = (similarity[:, None] * v[b, h, seen]).sum(0) / similarity.sum()
    return out


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))


def favor(projection: torch.Tensor):
    """FAVOR+'s positive features (Choromanski et al. 2021, lemma 1) for ``q . k / sqrt(d)``:
    ``exp(w_i . x / d^(1/4) - |x|^2 / (2 sqrt(d))) / sqrt(m)``."""
    m, d = projection.shape
    return lambda x: torch.exp(projection @ x / d**0.25 - x @ x / (2 * math.sqrt(d))) / math.sqrt(m)


X = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(1))
PADDING = torch.ones(2, 9, dtype=torch.bool)
PADDING[1, 6:] = False


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["linear", "performer"])
def test_feature_kinds_equal_their_formula_written_out(kind, causal, monkeypatch):
    monkeypatch.setattr(kernels, "CHUNK", 4)  # 9 positions: chunks of 4, 4 and 1, the running sums carried across
    attn = attention(kind, **({"features": 32} if kind == "performer" else {}))
    phi = elu_plus_one if kind == "linear" else favor(attn.kernel.features.projection)
    mask = AttentionMask(padding=PADDING, causal=causal)
    with torch.no_grad():
        q, k, v = heads(attn, X)
        expected = output(attn, feature_attention(phi, q, k, v, PADDING, causal))
        out, weights = attn(X, mask=mask)
        assert weights is None
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        out, weights = attn(X, mask=mask, need_weights=True)  # the n x n weights made, for a picture
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, HEADS, 9))
    assert (weights[1, :, :, 6:] == 0).all(), "padded keys get no weight"
    if causal:
        assert (weights.triu(1) == 0).all(), "no query sees a later key"


def test_the_performer_projection_is_orthogonal_seeded_and_saved():
    projection = attention("performer", features=20, seed=3).kernel.features.projection  # (20, 8): blocks of 8, 8, 4
    assert projection.shape == (20, D_HEAD)
    for start in range(0, 20, D_HEAD):
        block = projection[start : start + D_HEAD]
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-5, rtol=0)  # orthogonal rows
    assert torch.equal(projection, attention("performer", features=20, seed=3).kernel.features.projection)
    assert not torch.equal(projection, attention("performer", features=20, seed=4).kernel.features.projection)
    assert "kernel.features.projection" in attention("performer").state_dict()


def test_performer_with_many_features_approximates_softmax_attention():
    # small queries and keys, as the estimator's variance grows with exp(|q + k|^2 / sqrt(d)); its error
    # shrinks as 1 / sqrt(features): with 8192 the weights and outputs are within 0.05 (0.01 to 0.035 here)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, 12, D_HEAD, generator=generator) * 0.5 for _ in range(3))
    kernel = attention("performer", features=8192).kernel
    for causal in (False, True):
        mask = AttentionMask(padding=PADDING.repeat(1, 2)[:, :12], causal=causal)
        expected, exact = attention_math(q, k, v, mask.dense(12, 12))
        out, weights = kernel(q, k, v, mask, None, 0.0, True)
        assert (out - expected).abs().max() < 0.05
        assert (weights - exact).abs().max() < 0.05
    few, _ = attention("performer", features=4).kernel(q, k, v, AttentionMask(), None, 0.0, False)
    assert (few - attention_math(q, k, v)[0]).abs().max() > 0.1, "with few features the estimate is rough"


def test_linformer_equals_softmax_over_projected_keys_and_values():
    attn = attention("linformer", projected_length=4, seq_len=12)
    with torch.no_grad():
        q, k, v = heads(attn, X)
        real = PADDING[:, None, :, None].float()
        e, f = attn.project_k[:, :9], attn.project_v[:, :9]  # (4, 9): the first 9 of 12 columns
        out = torch.zeros_like(q)
        for b in range(2):
            for h in range(HEADS):
                keys, values = e @ (k[b, h] * real[b, 0]), f @ (v[b, h] * real[b, 0])  # (4, Dh)
                out[b, h] = torch.softmax(q[b, h] @ keys.T / math.sqrt(D_HEAD), dim=-1) @ values
        expected = output(attn, out)
        got, weights = attn(X, mask=AttentionMask(padding=PADDING), need_weights=True)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn(X, mask=AttentionMask(padding=PADDING))[0], expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, HEADS, 9, 4), "each query attends to projected_length rows"
    with pytest.raises(ValueError, match="for encoders"):
        attn(X, mask=AttentionMask(causal=True))
    with pytest.raises(ValueError, match="more than its seq_len=12"):
        attn(torch.randn(1, 13, D_MODEL))


@pytest.mark.parametrize("kind", ["linear", "performer"])
def test_cached_decoding_equals_uncached(kind):
    model = tz.build_model(
        "transformer-tiny", encoder=None, decoder={"attention": {"kind": kind}}, **SMALL, **UNTIED
    ).eval()
    prompt = torch.randint(3, 60, (3, 5))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=12)
    assert len(set(cached[:, 5:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, greedy_decode(model, prompt=prompt, max_new_tokens=12, use_cache=False))
    tgt = torch.randint(3, 60, (2, 7))
    with torch.no_grad():
        full = model.decode(tgt).hidden
        cache = DecoderCache()
        steps = [model.decode(tgt[:, :3], cache=cache).hidden]  # a prompt of three, then one at a time
        steps += [model.decode(tgt[:, t : t + 1], cache=cache).hidden for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert static_cache_problem(model, 32) is not None, "the static cache, which holds keys, is not used"


@pytest.mark.parametrize("kind", ["linear", "performer"])
def test_the_decoding_cache_does_not_grow_with_the_tokens_decoded(kind):
    model = tz.build_model("transformer-tiny", encoder=None, decoder={"attention": {"kind": kind}}, **SMALL).eval()
    cache = DecoderCache()
    sizes = []
    with torch.no_grad():
        model.decode(torch.randint(3, 60, (2, 4)), cache=cache)
        for _ in range(12):
            model.decode(torch.randint(3, 60, (2, 1)), cache=cache)
            sizes.append(
                [{name: tuple(t.shape) for name, t in self_cache.state.items()} for self_cache, _ in cache.layers]
            )
    assert cache.offset == 16
    assert all(self_cache.key is None for self_cache, _ in cache.layers), "no keys are kept"
    assert all(step == sizes[0] for step in sizes), "the running sums keep one size"
    features = 32 // 4 if kind == "linear" else 256
    assert sizes[0][0] == {"kv": (2, 4, features, 8), "z": (2, 4, features)}


@pytest.mark.parametrize("kind", ["linear", "performer"])
def test_beam_search_reorders_the_running_sums(kind):
    """An encoder-decoder with a Linformer encoder and ``kind`` in the decoder's self- and
    cross-attention: the scores beam search reports (on the cache, whose rows it reorders) are
    those of its sequences scored without a cache."""
    from transformer_zoo.core.decoding import beam_search, sequence_log_prob

    model = tz.build_model(
        "transformer-tiny",
        **SMALL,
        encoder={"layers": 1, "attention": "linformer"},
        decoder={"layers": 2, "attention": kind, "cross_attention": kind},
    ).eval()
    src = torch.randint(3, 60, (4, 7))
    src_mask = torch.ones_like(src)
    src_mask[0, 4:] = 0
    with torch.no_grad():
        beam, scores = beam_search(model, src, src_mask, bos_id=1, eos_id=2, beam_size=3, max_new_tokens=8)
        torch.testing.assert_close(
            scores, sequence_log_prob(model, src, src_mask, beam, eos_id=2), atol=1e-4, rtol=1e-5
        )


@pytest.mark.parametrize("kind", ["linear", "performer", "linformer"])
def test_each_kind_trains_and_round_trips(kind, tmp_path):
    side = (
        {"encoder": {"layers": 1, "attention": kind}, "decoder": None, "head": "sequence-classification"}
        if kind == "linformer"
        else {"encoder": None, "decoder": {"layers": 1, "attention": kind}}
    )
    model = tz.build_model("transformer-tiny", **{**SMALL, "dropout": 0.1}, **side)
    src = torch.randint(3, 60, (2, 9))
    mask = PADDING.clone()
    out = model(src, src_mask=mask) if kind == "linformer" else model(src, tgt_mask=mask)
    targets = torch.randint(0, 2, (2,)) if kind == "linformer" else src
    model.loss(out, targets).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(tz.from_pretrained(tmp_path)(src).logits, model(src).logits)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"positional": "alibi", "encoder": {"attention": "linear"}}, "cannot add the bias alibi"),
        ({"positional": "alibi", "encoder": {"attention": "performer"}}, "cannot add the bias alibi"),
        ({"positional": "alibi", "encoder": {"attention": "linformer"}}, "cannot add the bias alibi"),
        ({"positional": "rotary", "decoder": {"attention": "linear"}}, "running sums over keys"),
        ({"positional": "rotary", "decoder": {"attention": "performer"}}, "running sums over keys"),
        ({"encoder": {"attention": {"kind": "linear", "scale": 1.0}}}, "does not apply scale"),
        ({"encoder": {"attention": {"kind": "performer", "features": 0}}}, "features"),
        ({"encoder": {"attention": {"kind": "performer", "feature": 8}}}, "did you mean 'features'"),
        ({"encoder": {"attention": {"kind": "linformer", "seq_len": 100}}}, "seq_len=100 is below max_len=512"),
        ({"encoder": {"attention": {"kind": "linformer", "projected_length": 512}}}, "nothing is compressed"),
        ({"decoder": {"cross_attention": "linformer"}}, "is for self-attention"),
        ({"encoder": None, "decoder": {"attention": "linformer"}}, "decoder.attention: linformer attention cannot be"),
    ],
)
def test_what_a_kind_cannot_take_is_refused_at_validation(config, message):
    with pytest.raises(tz.ConfigError, match=message):
        tz.load_config("transformer-tiny", config)


def test_the_kinds_are_built_in_and_not_full():
    registry = get_registry()
    for kind in ("linear", "performer", "linformer"):
        options = registry.component("attention", kind)
        assert registry.provider("attention", kind) == "tzoo.efficient"
        assert not options.full and not options.takes_bias
    assert registry.component("attention", "performer").takes_scale
    attn = attention("performer")
    with torch.no_grad():  # a scale is taken: the features estimate exp(scale * q . k)
        scaled = attention("performer", scale=0.5)
        scaled.load_state_dict(attn.state_dict())
        assert not torch.allclose(scaled(X)[0], attn(X)[0])
