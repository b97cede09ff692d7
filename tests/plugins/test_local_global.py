"""Local and global attention kinds: each equals full attention under its explicit mask (forward
and gradients, lengths that are not multiples of the window or block), causal kinds never see
the future, and bad pattern configs are refused with a clear message."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import CAUSAL_KINDS, SPARSE_KINDS, sparse_pattern

import transformer_zoo as tz
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.local_attention import BLOCK_MASKS, BlockMaskCache, flex_attention_kernel
from transformer_zoo.plugins.local_global.kernels import chunked_attention

KINDS, CAUSAL, pattern = SPARSE_KINDS, CAUSAL_KINDS, sparse_pattern


def qkv(length, batch=2, heads=2, dim=8):
    torch.manual_seed(0)
    return [torch.randn(batch, heads, length, dim, dtype=torch.float32, requires_grad=True) for _ in range(3)]


def full_attention(q, k, v, mask):
    """The reference: SDPA over all keys with the explicit mask; all-masked rows are zero."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.masked_fill(~mask.any(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("batched", [False, True], ids=["loop", "batched"])
@pytest.mark.parametrize("length", [97, 203])
@pytest.mark.parametrize(("kind", "causal"), [(kind, False) for kind in KINDS] + [(kind, True) for kind in CAUSAL])
def test_chunked_kernel_equals_full_attention_under_the_mask(kind, causal, length, batched):
    """Block-sparse is encoder-only, so it has no causal case (a decoder refuses it, below). The
    loop over chunks (the CPU's default) and every chunk in one call (the GPU's) alike."""
    p = pattern(kind, causal)
    q, k, v = qkv(length)
    padding = torch.ones(2, length, dtype=torch.bool)
    padding[1, length - 30 :] = False
    mask = p.dense(length, length) & padding[:, None, None, :]
    expected = full_attention(q, k, v, mask)
    out = chunked_attention(q, k, v, p, padding, batched=batched)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad((expected * grad).sum(), (q, k, v))
    grads = torch.autograd.grad((out * grad).sum(), (q, k, v))
    for mine, theirs in zip(grads, expected_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    assert not mask.all(), "the pattern is really sparse"


@pytest.mark.parametrize("kind", list(KINDS))
def test_flex_kernel_equals_full_attention_under_the_mask(kind):
    """FlexAttention uncompiled on CPU (forward only: it has no CPU backward)."""
    p = pattern(kind)
    q, k, v = (t.detach() for t in qkv(150))
    mask = p.dense(150, 150)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention_kernel(q, k, v, p, compiled=False)
    torch.testing.assert_close(out, full_attention(q, k, v, mask[None, None]), atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
def test_compiled_flex_kernel_on_cpu_equals_the_chunked_kernel():
    """What ``backend: flex`` runs for CPU inference: compiled block mask and attention."""
    p = pattern("local-global")
    q, k, v = (t.detach() for t in qkv(150))
    padding = torch.ones(2, 150, dtype=torch.bool)
    padding[1, 120:] = False
    with torch.no_grad():
        out = flex_attention_kernel(q, k, v, p, padding)
    expected = chunked_attention(q, k, v, p, padding)
    torch.testing.assert_close(out[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :, :120], expected[1, :, :120], atol=1e-5, rtol=1e-5)  # padding rows differ


def test_the_block_mask_is_built_once_per_pattern_length_and_padding_and_reused():
    """Every layer of a forward and every step of one length shares the block mask; a padding
    tensor gets its own, which no other padding (equal in value or not) ever reuses."""
    p = pattern("local-global")
    q, k, v = (t.detach() for t in qkv(150))
    BLOCK_MASKS.clear()
    built = BLOCK_MASKS.built
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = flex_attention_kernel(q, k, v, p, compiled=False)
        again = flex_attention_kernel(q, k, v, p, compiled=False)  # the next layer, or the next step
        assert BLOCK_MASKS.built == built + 1
        torch.testing.assert_close(again, first, rtol=0, atol=0)
        flex_attention_kernel(q[:, :, :120], k[:, :, :120], v[:, :, :120], p, compiled=False)
        assert BLOCK_MASKS.built == built + 2, "another length builds its own mask"

        padding = torch.ones(2, 150, dtype=torch.bool)
        padding[1, 100:] = False
        padded = flex_attention_kernel(q, k, v, p, padding, compiled=False)
        assert BLOCK_MASKS.built == built + 3
        torch.testing.assert_close(flex_attention_kernel(q, k, v, p, padding, compiled=False), padded, rtol=0, atol=0)
        assert BLOCK_MASKS.built == built + 3, "the layers of one forward share its padding's mask"
        other = torch.ones(2, 150, dtype=torch.bool)
        other[0, 60:] = False
        out = flex_attention_kernel(q, k, v, p, other, compiled=False)
        assert BLOCK_MASKS.built == built + 4, "another padding never reuses a mask"
        torch.testing.assert_close(
            out[0, :, :60], chunked_attention(q, k, v, p, other)[0, :, :60], atol=1e-5, rtol=1e-5
        )
        padding[1, 50:] = False  # changed in place: its mask is stale
        out = flex_attention_kernel(q, k, v, p, padding, compiled=False)
        assert BLOCK_MASKS.built == built + 5
        torch.testing.assert_close(
            out[1, :, :50], chunked_attention(q, k, v, p, padding)[1, :, :50], atol=1e-5, rtol=1e-5
        )


def test_the_block_mask_cache_keeps_at_most_its_size():
    cache = BlockMaskCache(size=2)
    for n in range(4):
        cache.put(("pattern", n), None, object())
    assert len(cache) == 2 and cache.get(("pattern", 0)) is None and cache.get(("pattern", 3)) is not None


@pytest.mark.parametrize("kind", ["local-global", "dilated"])
def test_a_cached_query_sees_what_it_would_see_in_the_full_sequence(kind):
    p = pattern(kind, causal=True)
    q, k, v = (t.detach() for t in qkv(120))
    full = chunked_attention(q, k, v, p)
    last = chunked_attention(q[:, :, -3:], k, v, p)  # three new queries, end-aligned with the keys
    torch.testing.assert_close(last, full[:, :, -3:], atol=1e-6, rtol=1e-6)


def test_a_dilated_window_sees_every_d_th_key():
    p = pattern("dilated")
    assert p.dense(30, 30)[15].nonzero().flatten().tolist() == [3, 6, 9, 12, 15, 18, 21, 24, 27]


@pytest.mark.parametrize(
    "attention",
    [
        {"kind": "sliding-window", "window": 6, "backend": "chunked"},
        {"kind": "sliding-window", "window": 3, "dilation": 2, "backend": "chunked"},
        {"kind": "block-local", "block": 8, "backend": "chunked"},
        {"kind": "local-global", "window": 4, "global_positions": [0, 9], "backend": "chunked"},
        {"kind": "memory-compressed", "compression": 3},
    ],
)
def test_causal_kinds_never_see_the_future(attention):
    model = tz.build_model(
        "transformer-tiny",
        encoder=None,
        decoder={"layers": 2, "attention": attention},
        vocab_size=50,
        d_model=32,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
    ).eval()
    ids = torch.randint(3, 50, (2, 41))
    base = model(ids).logits
    for t in range(0, 40, 3):
        changed = ids.clone()
        changed[:, t + 1 :] = torch.randint(3, 50, changed[:, t + 1 :].shape)
        out = model(changed).logits
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :]), "later positions do see the change"


def test_memory_compressed_equals_attention_over_convolved_keys():
    model = tz.build_model(
        "transformer-tiny",
        encoder={"layers": 1, "attention": {"kind": "memory-compressed"}},
        decoder=None,
        head={"kind": "sequence-classification"},
        d_model=32,
        n_heads=4,
        vocab_size=50,
        dropout=0.0,
    ).eval()
    attn = model.encoder.layers[0].self_attn
    x = torch.randn(2, 10, 32)
    out, _ = attn(x)
    q, k, v = attn.in_proj(x).chunk(3, dim=-1)
    pad = lambda t: F.pad(t.transpose(1, 2), (0, 2))  # noqa: E731  10 -> 12 positions, 4 summaries
    k, v = attn.compress_k(pad(k)).transpose(1, 2), attn.compress_v(pad(v)).transpose(1, 2)  # (B, 4, D)
    heads = lambda t: t.view(2, -1, 4, 8).transpose(1, 2)  # noqa: E731
    expected = F.scaled_dot_product_attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(2, 10, 32)
    torch.testing.assert_close(out, attn.out_proj(expected), atol=1e-5, rtol=1e-5)


def test_kernels_agree_inside_a_model():
    torch.manual_seed(0)
    outputs = {}
    for kernel in ("dense", "chunked"):
        torch.manual_seed(0)
        model = tz.build_model(
            "local-global-encoder-tiny",
            dropout=0.0,
            encoder={"layers": 2, "attention": {"kind": "local-global", "window": 16, "backend": kernel}},
        )
        ids = torch.randint(3, 1000, (2, 300))
        mask = torch.ones_like(ids)
        mask[1, 250:] = 0
        outputs[kernel] = model(ids, src_mask=mask).logits
    torch.testing.assert_close(outputs["dense"], outputs["chunked"], atol=1e-5, rtol=1e-5)


def test_dmca_decodes_the_same_with_and_without_the_cache():
    from transformer_zoo.core.decoding import greedy_decode

    model = tz.build_model(
        "transformer-dmca-tiny",
        dropout=0.0,
        head={"kind": "lm", "tie_weights": False},
        decoder={
            "layers": 4,
            "attention": [{"kind": "block-local", "block": 4, "backend": "chunked"}, {"kind": "memory-compressed"}],
        },
    ).eval()
    layers = model.decoder.layers
    assert [type(layer.self_attn).__name__ for layer in layers] == ["SparseAttention", "MemoryCompressedAttention"] * 2
    prompt = torch.randint(3, 1000, (2, 6))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=14)
    assert torch.equal(cached, greedy_decode(model, prompt=prompt, max_new_tokens=14, use_cache=False))


def test_dmca_starts_with_logits_of_unit_scale_as_the_transformer_decoder_does():
    """Its embeddings are the Transformer's, N(0, 1/d) scaled by sqrt(d), tied to the output layer:
    the loss on random tokens starts near ln V (unscaled N(0, 1) embeddings started near 50)."""
    torch.manual_seed(0)
    model = tz.build_model("transformer-dmca-tiny", dropout=0.0).eval()
    ids = torch.randint(3, 1000, (4, 64))
    with torch.no_grad():
        loss = model.loss(model(ids), torch.randint(3, 1000, (4, 64))).item()
    assert model.config.scale_embeddings and math.log(1000) - 0.5 < loss < math.log(1000) + 1.5


@pytest.mark.parametrize(
    ("attention", "message"),
    [
        ({"kind": "sliding-window", "window": 512}, "window=512 is not smaller than max_len=512"),
        (
            {"kind": "local-global", "window": 8, "global_positions": [0, 600]},
            "global_positions \\[600\\] are outside 0..511",
        ),
        ({"kind": "block-sparse", "block": 128}, "block=128 divides max_len=512 into 4 blocks, but each block sees 5"),
        ({"kind": "block-local", "block": 1024}, "block=1024 is not smaller than max_len=512"),
        ({"kind": "sliding-window", "window": 0}, "window"),
        (
            {"kind": "sliding-window", "window": 4, "dilation": 512},
            "sliding-window dilation=512 is not smaller than max_len=512: each query would see only itself",
        ),
    ],
)
def test_bad_patterns_are_refused(attention, message):
    with pytest.raises(ConfigError, match=message):
        tz.load_config("transformer-tiny", {"encoder": {"attention": attention}})


def test_a_dilated_window_may_reach_past_max_len():
    config = tz.load_config(
        "transformer-tiny", {"encoder": {"attention": {"kind": "sliding-window", "window": 100, "dilation": 6}}}
    )
    assert config.encoder.attention.dilation == 6, "201 of 512 keys at most: sparse, not full attention"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"window": 4, "dilation": 0}, "dilation must be >= 1"),
        ({"block": 16, "dilation": 2}, "dilation is for a band"),
        ({"window": 4, "random_blocks": 1}, "random_blocks are blocks of keys"),
    ],
)
def test_patterns_that_the_kernels_cannot_agree_on_are_refused(fields, message):
    from transformer_zoo.plugins.local_global.kernels import Pattern

    with pytest.raises(ValueError, match=message):
        Pattern(**fields)


def test_block_sparse_in_a_decoder_is_refused_at_validation():
    with pytest.raises(tz.ConfigError, match="decoder.attention: block-sparse attention cannot be causal"):
        tz.build_model(
            "transformer-tiny",
            encoder=None,
            decoder={"layers": 1, "attention": {"kind": "block-sparse", "block": 8, "random_blocks": 0}},
            d_model=32,
            n_heads=4,
            vocab_size=50,
        )


def test_weights_are_the_dense_reference():
    model = tz.build_model("local-global-encoder-tiny", dropout=0.0).eval()
    out = model(torch.randint(3, 1000, (1, 60)), need_weights=True)
    weights = out.attentions["encoder"][0]["self"][0, 0]  # (T, T)
    allowed = model.encoder.layers[0].self_attn.kernel.pattern.dense(60, 60)
    assert (weights[~allowed] == 0).all() and torch.allclose(weights.sum(-1), torch.ones(60))


def test_one_rule_chooses_the_kernel_of_every_sparse_kind():
    from transformer_zoo.core.local_attention import DENSE_UP_TO, PatternKernel

    kernel = PatternKernel(pattern("local-global"))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [kernel.choose(n, cpu) for n in (DENSE_UP_TO, DENSE_UP_TO + 1)] == ["dense", "chunked"]
    assert kernel.choose(DENSE_UP_TO + 1, cuda) == "flex", "compiled FlexAttention on CUDA"
    assert kernel.choose(DENSE_UP_TO + 1, cuda, dropout_p=0.1) == "chunked", "FlexAttention has no dropout"
    assert PatternKernel(pattern("block-local"), "flex").choose(10, cpu) == "flex", "a forced choice is kept"
    with pytest.raises(ValueError, match="kernel must be one of auto, dense, flex, chunked"):
        PatternKernel(pattern("block-local"), "blocked")


def test_sparse_kinds_refuse_alibi_and_cross_attention_at_validation():
    with pytest.raises(
        ConfigError,
        match="encoder.attention: sliding-window attention does not form every query-key "
        "score.*use sinusoidal, learned or rotary",
    ):
        tz.load_config("transformer-tiny", {"positional": "alibi", "encoder": {"attention": "sliding-window"}})
    for kind in ("memory-compressed", "sliding-window", "block-sparse"):
        with pytest.raises(
            ConfigError,
            match=f"decoder.cross_attention: {kind} attention is for self-attention.*keep cross_attention: sdpa",
        ):
            tz.load_config("transformer-tiny", {"decoder": {"cross_attention": kind}})
    tz.load_config("transformer-tiny", {"encoder": None, "decoder": {"cross_attention": "memory-compressed"}})  # unused


def test_a_sparse_module_refuses_cross_attention_when_run():
    from transformer_zoo.plugins.local_global.kernels import MemoryCompressedAttention

    attn = MemoryCompressedAttention(16, 2)
    with pytest.raises(ValueError, match="MemoryCompressedAttention is for self-attention; keep cross_attention: sdpa"):
        attn(torch.randn(1, 4, 16), torch.randn(1, 6, 16))


def test_a_bias_the_sparse_kernel_cannot_add_is_refused_without_naming_alibi():
    """A scheme that returns a bias but does not declare scores_bias passes validation; the sparse
    kernel then refuses its bias at the first call, naming what it is, not ALiBi."""
    from transformer_zoo.core.attention import AttentionMask, AttentionPositional
    from transformer_zoo.core.options import LayerSpec
    from transformer_zoo.registry import get_registry

    class Biased(AttentionPositional):
        def bias(self, q_len, k_len, device, q_offset=None):
            return torch.zeros(q_len, k_len, device=device)

    options = get_registry().component("attention", "sliding-window")(window=2)
    module = options.build(LayerSpec(d_model=16, n_heads=2, in_attention=Biased()))
    with pytest.raises(ValueError, match="adds a bias to every query-key score") as refused:
        module(torch.randn(1, 8, 16), mask=AttentionMask())
    assert "ALiBi" not in str(refused.value) and "scores_bias = True" in str(refused.value)
