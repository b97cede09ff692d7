"""Greedy decoding on the key/value cache gives what decoding without it gives."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.cache import DecoderCache, StaticDecoderCache
from transformer_zoo.core.decoding import DecodeStep, greedy_decode

SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


POSITIONAL = ["sinusoidal", "learned", "rotary", "alibi"]
UNTIED = {"head": {"tie_weights": False}}  # a random tied model only repeats its input token


@pytest.mark.parametrize("positional", POSITIONAL)
def test_cached_greedy_equals_uncached(positional):
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL, **UNTIED).eval()
    src = torch.randint(3, 60, (4, 9))
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    cached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20)
    uncached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, use_cache=False)
    assert cached.shape == (4, 21)
    assert len(set(cached[:, 1:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_cached_hidden_states_equal_full_decode(positional, architecture):
    extra = {"encoder": None} if architecture == "decoder-only" else {}
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL, **extra).eval()
    src, tgt = torch.randint(3, 60, (2, 8)), torch.randint(3, 60, (2, 6))
    memory = model.encode(src).hidden if model.encoder is not None else None
    full = model.decode(tgt, memory).hidden
    cache = DecoderCache()
    steps = [model.decode(tgt[:, :2], memory, cache=cache).hidden]  # a prefix of two, then one at a time
    steps += [model.decode(tgt[:, t : t + 1], memory, cache=cache).hidden for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.offset == 6


def test_decoder_only_continues_a_prompt():
    model = tz.build_model("transformer-tiny", encoder=None, positional="rotary", **SMALL, **UNTIED).eval()
    prompt = torch.randint(3, 60, (2, 5))
    cached = greedy_decode(model, prompt=prompt, max_new_tokens=12)
    uncached = greedy_decode(model, prompt=prompt, max_new_tokens=12, use_cache=False)
    assert cached.shape == (2, 17)
    assert torch.equal(cached[:, :5], prompt)
    assert len(set(cached[:, 5:].flatten().tolist())) > 3
    assert torch.equal(cached, uncached)


def test_rows_after_eos_are_padded():
    model = tz.build_model("transformer-tiny", **SMALL, head={"tie_weights": False, "bias": True}).eval()
    with torch.no_grad():
        model.head.proj.weight.zero_()
        model.head.proj.bias.zero_()
    src = torch.randint(3, 60, (2, 4))
    calls = {"n": 0}
    real_head = model.head.forward

    def head(hidden, mask=None):  # row 0 says eos at once; row 1 says 7, 7, then eos
        logits = real_head(hidden, mask)
        calls["n"] += 1
        logits[0, :, 2] = 1.0
        logits[1, :, 2 if calls["n"] >= 3 else 7] = 1.0
        return logits

    model.head.forward = head
    out = greedy_decode(model, src, bos_id=1, eos_id=2, pad_id=0, max_new_tokens=6)
    assert out.tolist() == [[1, 2, 0, 0], [1, 7, 7, 2]], "finished rows are padded; decoding stops when all ended"


def test_decoding_needs_what_it_decodes_from():
    enc_dec = tz.build_model("transformer-tiny", **SMALL).eval()
    with pytest.raises(ValueError, match="needs src"):
        greedy_decode(enc_dec, bos_id=1)
    encoder_only = tz.build_model("transformer-tiny", decoder=None, **SMALL).eval()
    with pytest.raises(ValueError, match="encoder-only"):
        greedy_decode(encoder_only, torch.ones(1, 3, dtype=torch.long), bos_id=1)


def soft_model():
    """An untied output layer keeps a random model's distributions far from one-hot; a penalty
    on eos makes its sequences long enough for the search to matter."""
    model = tz.build_model("transformer-tiny", vocab_size=30, dropout=0.0, head={"tie_weights": False, "bias": True})
    with torch.no_grad():
        model.head.proj.bias[2] = -2.0
    return model.eval()


def test_beam_of_one_is_greedy():
    from transformer_zoo.core.decoding import beam_search

    model = soft_model()
    src = torch.randint(3, 30, (5, 7))
    greedy = greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=10)
    beam, _ = beam_search(model, src, bos_id=1, eos_id=2, beam_size=1, max_new_tokens=10)
    assert torch.equal(beam, greedy)


@pytest.mark.parametrize("beam_size", [2, 4, 8])
def test_beam_never_scores_below_greedy_and_reports_true_scores(beam_size):
    from transformer_zoo.core.decoding import beam_search, sequence_log_prob

    model = soft_model()
    src = torch.randint(3, 30, (32, 7))
    src_mask = torch.ones_like(src)
    src_mask[0, 4:] = 0
    greedy = greedy_decode(model, src, src_mask, bos_id=1, eos_id=2, max_new_tokens=10)
    with torch.no_grad():
        greedy_scores = sequence_log_prob(model, src, src_mask, greedy, eos_id=2)
        beam, scores = beam_search(model, src, src_mask, bos_id=1, eos_id=2, beam_size=beam_size, max_new_tokens=10)
        torch.testing.assert_close(
            scores, sequence_log_prob(model, src, src_mask, beam, eos_id=2), atol=1e-4, rtol=1e-5
        )
    assert (scores >= greedy_scores - 1e-5).all()
    if beam_size >= 4:
        assert (scores > greedy_scores + 1e-3).any(), "a wider beam finds better sequences on some inputs"


@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_static_cache_hidden_states_equal_full_decode(positional, architecture):
    """The preallocated cache: keys written in place at a position held on the device, attention
    over the whole buffer masked to the keys written so far."""
    extra = {"encoder": None} if architecture == "decoder-only" else {}
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL, **extra).eval()
    src, tgt = torch.randint(3, 60, (2, 8)), torch.randint(3, 60, (2, 6))
    memory = model.encode(src).hidden if model.encoder is not None else None
    full = model.decode(tgt, memory).hidden
    cache = StaticDecoderCache(10, "cpu")
    steps = [model.decode(tgt[:, :2], memory, cache=cache).hidden]
    steps += [model.decode(tgt[:, t : t + 1], memory, cache=cache).hidden for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert int(cache.offset) == 6 and cache.layer(0)[0].key.shape[-2] == 10, "the buffers keep their size"


@pytest.mark.parametrize("positional", POSITIONAL)
def test_static_cache_greedy_equals_uncached(positional):
    model = tz.build_model("transformer-tiny", positional=positional, **SMALL, **UNTIED).eval()
    src = torch.randint(3, 60, (4, 9))
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    static = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, static_cache=True)
    uncached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, use_cache=False)
    assert len(set(static[:, 1:].flatten().tolist())) > 3
    assert torch.equal(static, uncached)


def test_static_cache_decodes_a_universal_transformer_and_a_prompt():
    model = tz.build_model("universal-transformer-tiny", **SMALL, **UNTIED).eval()
    src = torch.randint(3, 60, (3, 7))
    assert torch.equal(
        greedy_decode(model, src, bos_id=1, max_new_tokens=12, static_cache=True),
        greedy_decode(model, src, bos_id=1, max_new_tokens=12, use_cache=False),
    )
    model = tz.build_model("transformer-tiny", encoder=None, positional="rotary", **SMALL, **UNTIED).eval()
    prompt = torch.randint(3, 60, (2, 5))
    assert torch.equal(
        greedy_decode(model, prompt=prompt, max_new_tokens=12, static_cache=True),
        greedy_decode(model, prompt=prompt, max_new_tokens=12, use_cache=False),
    )


@pytest.mark.parametrize("beam_size", [1, 4])
def test_static_cache_beam_search_equals_the_dynamic_cache(beam_size):
    from transformer_zoo.core.decoding import beam_search

    model = soft_model()
    src = torch.randint(3, 30, (8, 7))
    src_mask = torch.ones_like(src)
    src_mask[0, 4:] = 0
    with torch.no_grad():
        dynamic, dynamic_scores = beam_search(
            model, src, src_mask, bos_id=1, eos_id=2, beam_size=beam_size, max_new_tokens=10, static_cache=False
        )
        static, static_scores = beam_search(
            model, src, src_mask, bos_id=1, eos_id=2, beam_size=beam_size, max_new_tokens=10, static_cache=True
        )
    assert torch.equal(static, dynamic)
    torch.testing.assert_close(static_scores, dynamic_scores, atol=1e-5, rtol=1e-5)


def test_the_static_decoding_step_traces_as_one_graph_without_reading_values_back():
    """What a CUDA graph needs of a step (checked here on the CPU): no host sync, no shape that
    changes; ``fullgraph=True`` fails on any graph break, which reading a value back would be."""
    model = tz.build_model("transformer-tiny", positional="alibi", **SMALL, **UNTIED).eval()
    src = torch.randint(3, 60, (2, 7))
    memory = model.encode(src).hidden
    cache = StaticDecoderCache(8, "cpu")
    step = DecodeStep(model, memory, None, cache)
    with torch.no_grad():
        token = step(torch.ones(2, 1, dtype=torch.long)).argmax(-1)  # the first step, as written
        traced = torch.compile(step.run, fullgraph=True, backend="eager")
        try:
            logits = traced(token)
        finally:
            torch._dynamo.reset()
        assert int(cache.offset) == 2, "the traced step advanced the position on the device"
        cache.offset = 1  # the same step again, as written: the same logits
        torch.testing.assert_close(step.run(token), logits, atol=1e-6, rtol=1e-6)


def test_a_static_cache_is_refused_where_the_model_cannot_take_it():
    model = tz.build_model("transformer-tiny", max_len=16, **SMALL, positional="learned").eval()
    src = torch.randint(3, 60, (2, 5))
    with pytest.raises(ValueError, match="past its learned positions' max_len=16"):
        greedy_decode(model, src, bos_id=1, max_new_tokens=20, static_cache=True)
    for kind in ("sinusoidal", "rotary"):  # computed for the cache's length: as on the dynamic cache
        model = tz.build_model("transformer-tiny", max_len=16, **SMALL, positional=kind).eval()
        torch.testing.assert_close(
            greedy_decode(model, src, bos_id=1, max_new_tokens=20, static_cache=True),
            greedy_decode(model, src, bos_id=1, max_new_tokens=20, static_cache=False),
        )
    sparse = tz.build_model(
        "transformer-tiny", **SMALL, decoder={"attention": {"kind": "sliding-window", "window": 4}}
    ).eval()
    with pytest.raises(ValueError, match="static cache"):
        greedy_decode(sparse, src, bos_id=1, max_new_tokens=4, static_cache=True)
    assert greedy_decode(sparse, src, bos_id=1, max_new_tokens=4).shape == (2, 5), "the default falls back"
