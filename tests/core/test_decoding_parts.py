"""Decoding with the parts of today's decoder-only LMs.

- A sliding-window layer's cache keeps its window only: between steps it holds the full
  cache's last ``window`` keys and values, and the decoder cache's bytes are the window's and
  the global layers' (:func:`~transformer_zoo.core.decoding.make_cache`); only a plain window
  is kept short.
- Cached equals uncached: for every decoder-lm ``-tiny`` preset and for variants with each part
  (soft-capped scores and logits, QK-norm over each head and over the projection, the four
  rotary stretches decoding past their original length, partial rotary, a NoPE layer), the
  logits of a prompt and then of one token at a time, on the dynamic cache and on the static one
  where the model takes it, equal a forward over the same tokens (1e-5, float32). Each variant's
  part is first shown to matter: switched off, the logits change.
- Left padding: a left-padded batch generates, row by row, what each prompt generates alone,
  on the cache and without; and what transformers' ``generate`` gives on a random
  ``LlamaForCausalLM`` and ``GPT2LMHeadModel`` of llama-tiny's and gpt2-tiny's shapes, read into
  the zoo.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import MultiHeadAttention, SoftcapKernel, sdpa_kernel
from transformer_zoo.core.cache import DecoderCache, KVCache, StaticDecoderCache, WindowKVCache
from transformer_zoo.core.decoding import make_cache, static_cache_problem
from transformer_zoo.core.relative import RotaryPositional, RotaryScaling

TOLERANCE = dict(atol=1e-5, rtol=0.0)
LENGTH, PROMPT = 40, 5  # past gemma2-tiny's window (15 keys before a query) and the stretches' original 16
INIT_STD = 0.1  # weights large enough that attention is far from uniform: a wrong position shows
PRESETS = ["gpt2-tiny", "llama-tiny", "qwen3-tiny", "gemma2-tiny", "olmo2-tiny"]
DYNAMIC_ONLY = {"gemma2-tiny"}  # its sliding-window layers keep their window in a dynamic cache


def build(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return tz.build_model(name, init_std=INIT_STD, **overrides).eval()


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 1000, (batch, length), generator=torch.Generator().manual_seed(seed))


def attentions(model: torch.nn.Module) -> list[MultiHeadAttention]:
    """Each layer's self-attention."""
    return [layer.self_attn for layer in model.decoder.layers]


def incremental_logits(model: torch.nn.Module, ids: torch.Tensor, cache: DecoderCache, prompt: int) -> torch.Tensor:
    """The logits of ``ids`` as generation computes them: the first ``prompt`` tokens in one call,
    then one token a call, on ``cache``."""
    steps = [model.head(model.decode(ids[:, :prompt], cache=cache).hidden)]
    steps += [model.head(model.decode(ids[:, t : t + 1], cache=cache).hidden) for t in range(prompt, ids.size(1))]
    return torch.cat(steps, dim=1)


def forward_logits(model: torch.nn.Module, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """The same logits by forwards without a cache: the prompt's from one forward over it, each
    later token's from a forward over every token up to it (dynamic scaling turns at the length of
    the sequence, so each prefix is a forward of its own)."""
    steps = [model(ids[:, :prompt]).logits]
    steps += [model(ids[:, : t + 1]).logits[:, -1:] for t in range(prompt, ids.size(1))]
    return torch.cat(steps, dim=1)


# ---- a sliding-window layer's cache ------------------------------------------------------------
def test_a_sliding_window_layer_keeps_only_its_window_between_steps():
    """gemma2-tiny: layer 0 sees 15 keys before each query, layer 1 every key. A 20-token prompt,
    longer than the window, attends within itself; then one token at a time to 40."""
    model = build("gemma2-tiny")
    ids = random_ids(2, LENGTH)
    windowed, full = make_cache(model), DecoderCache()
    assert windowed.windows == {0: 15}
    with torch.no_grad():
        torch.testing.assert_close(
            incremental_logits(model, ids[:, :20], windowed, 20), model(ids[:, :20]).logits, **TOLERANCE
        )
        model.decode(ids[:, :20], cache=full)
        for seen in range(20, LENGTH + 1):
            window_cache, global_cache = windowed.layers[0][0], windowed.layers[1][0]
            assert isinstance(window_cache, WindowKVCache) and type(global_cache) is KVCache
            assert (len(window_cache), len(global_cache), window_cache.start) == (15, seen, seen)
            for kept, every in (
                (window_cache.key, full.layers[0][0].key),
                (window_cache.value, full.layers[0][0].value),
            ):
                torch.testing.assert_close(kept, every[:, :, -15:], atol=1e-6, rtol=0.0)
            if seen < LENGTH:
                step = ids[:, seen : seen + 1]
                torch.testing.assert_close(
                    model.head(model.decode(step, cache=windowed).hidden),
                    model(ids[:, : seen + 1]).logits[:, -1:],
                    **TOLERANCE,
                )
                model.decode(step, cache=full)
    # at 40 tokens the window layer holds 15, the global one 40, where the full cache holds 40 each
    assert windowed.nbytes * (LENGTH + LENGTH) == full.nbytes * (15 + LENGTH)


SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0, encoder=None, positional="rotary")


@pytest.mark.parametrize(
    ("attention", "kept"),
    [
        ({"kind": "sliding-window", "window": 4}, 4),
        ({"kind": "sliding-window", "window": 3, "dilation": 2}, 6),  # a dilated band reaches 3 * 2 back
        ({"kind": "local-global", "window": 4}, None),  # a global token sits at an absolute position
        ({"kind": "block-local", "block": 8}, None),  # blocks begin at absolute positions
        ({"kind": "sdpa"}, None),
    ],
)
def test_only_a_plain_window_is_kept_short_and_every_kind_decodes_as_its_forward(attention, kept):
    torch.manual_seed(0)
    model = tz.build_model("transformer-tiny", **SMALL, decoder={"layers": 2, "attention": attention}).eval()
    cache = make_cache(model)
    assert cache.windows == ({} if kept is None else {0: kept, 1: kept})
    ids = torch.randint(3, 60, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(incremental_logits(model, ids, cache, 10), model(ids).logits, **TOLERANCE)
    assert {len(own) for own, _ in cache.layers} == {24 if kept is None else kept}


def test_the_window_cache_benchmark_measures_the_window_against_the_full_cache(tmp_path):
    from benchmarks import window_cache

    out = tmp_path / "window-cache.json"
    window_cache.main(
        ["--window", "8", "--prompt", "3", "--batch", "1", "--repeats", "1", "--device", "cpu", "--json", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [row["tokens"] for row in rows] == [8, 16, 24, 32]
    for row in rows:  # the window layer's 8 keys and the global layer's n, against n and n
        assert row["window_cache_bytes"] * 2 * row["tokens"] == row["full_cache_bytes"] * (8 + row["tokens"])


# ---- cached equals uncached, part by part --------------------------------------------------------
ROTARY = {"kind": "rotary", "layout": "halves"}
ATTENTION = {"kind": "sdpa", "bias": False, "n_kv_heads": 2}


def stretched(scaling: dict) -> dict:
    return {"positional": {**ROTARY, "scaling": scaling}}


def attending(attention: dict | list, layers: int = 2) -> dict:
    return {"decoder": {"layers": layers, "attention": attention}}


def scores_uncapped(model: torch.nn.Module) -> None:
    for attention in attentions(model):
        assert isinstance(attention.kernel, SoftcapKernel)
        attention.kernel = sdpa_kernel


def logits_uncapped(model: torch.nn.Module) -> None:
    model.head.softcap = None


def without_qk_norm(model: torch.nn.Module) -> None:
    for attention in attentions(model):
        attention.q_norm = attention.k_norm = None


def turned_anew(model: torch.nn.Module, **changes) -> None:
    """Each rotary scheme with ``changes`` to its attributes, its angles computed again."""
    for attention in attentions(model):
        if isinstance(attention.positional, RotaryPositional):
            rope = attention.positional
            for name, value in changes.items():
                setattr(rope, name, value)
            rope.cos, rope.sin = rope._angles(len(rope.cos))


def unstretched(model: torch.nn.Module) -> None:
    turned_anew(model, scaling=RotaryScaling())


def whole_heads_turned(model: torch.nn.Module) -> None:
    turned_anew(model, rotated=attentions(model)[0].positional.d_head)


def positions_in_every_layer(model: torch.nn.Module) -> None:
    first, second = attentions(model)
    assert first.positional is None and isinstance(second.positional, RotaryPositional)
    first.positional = second.positional


VARIANTS = {  # llama-tiny with one part, and what switches the part off
    "softcap-scores": (attending({**ATTENTION, "softcap": 2.0}), scores_uncapped),
    "softcap-logits": ({"head": {"kind": "lm", "tie_weights": False, "softcap": 3.0}}, logits_uncapped),
    "qk-norm-head": (attending({**ATTENTION, "qk_norm": "head"}), without_qk_norm),
    "qk-norm-projection": (attending({**ATTENTION, "qk_norm": "projection"}), without_qk_norm),
    "linear": (stretched({"kind": "linear", "factor": 4.0}), unstretched),
    # one layer: past its original length dynamic scaling turns every position at the frequencies of the
    # sequence's length, so a forward over more tokens changes the first layer's outputs at earlier
    # positions, which the later layers' cached keys were made from (transformers' cache alike); the
    # cache holds keys before rotation, so the first layer's are turned again at each length, as a forward does
    "dynamic": (
        {**stretched({"kind": "dynamic", "factor": 4.0, "original_max_len": 16}), **attending(ATTENTION, layers=1)},
        unstretched,
    ),
    "yarn": (stretched({"kind": "yarn", "factor": 4.0, "original_max_len": 16}), unstretched),
    "llama3": (
        stretched(
            {"kind": "llama3", "factor": 8.0, "original_max_len": 16, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        ),
        unstretched,
    ),
    "partial-rotary": ({"positional": {**ROTARY, "fraction": 0.5}}, whole_heads_turned),
    "nope-layer": (attending([{**ATTENTION, "positions": False}, ATTENTION]), positions_in_every_layer),
}


def assert_cached_equals_forward(model: torch.nn.Module, static: bool) -> None:
    ids = random_ids(2, LENGTH)
    with torch.no_grad():
        expected = forward_logits(model, ids, PROMPT)
        torch.testing.assert_close(incremental_logits(model, ids, make_cache(model), PROMPT), expected, **TOLERANCE)
        if static:
            assert static_cache_problem(model, LENGTH) is None
            cache = StaticDecoderCache(LENGTH, "cpu")
            torch.testing.assert_close(incremental_logits(model, ids, cache, PROMPT), expected, **TOLERANCE)
        else:
            assert static_cache_problem(model, LENGTH) is not None


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_decodes_on_its_caches_as_its_forward(name):
    assert_cached_equals_forward(build(name), static=name not in DYNAMIC_ONLY)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_part_decodes_on_the_caches_as_the_forward(variant):
    overrides, switch_off = VARIANTS[variant]
    model = build("llama-tiny", **overrides)
    ids = random_ids(1, LENGTH, seed=1)
    without = copy.deepcopy(model)
    switch_off(without)
    with torch.no_grad():
        change = (model(ids).logits - without(ids).logits).abs().max()
    assert change > 1e-3, f"{variant} changes nothing here, so the comparison below would not test it"
    assert_cached_equals_forward(model, static=True)


# ---- left padding ----------------------------------------------------------------------------
PROMPT_LENGTHS = (3, 17, 9, 1)  # one past gemma2-tiny's window, one of a lone token
NEW_TOKENS = 20


def left_padded(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, P)`` ids and attention mask of ``prompts`` ``(1, n)`` padded on the left to the longest."""
    longest = max(p.size(1) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - prompt.size(1) :], mask[row, longest - prompt.size(1) :] = prompt[0], 1
    return ids, mask


def prompts_of(lengths: tuple[int, ...]) -> list[torch.Tensor]:
    return [random_ids(1, n, seed=10 + i) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("name", PRESETS)
def test_a_left_padded_batch_generates_each_prompt_as_it_would_alone(name, use_cache):
    model = build(name)
    prompts = prompts_of(PROMPT_LENGTHS)
    ids, mask = left_padded(prompts)
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, use_cache=use_cache)
    assert batch.shape == (len(prompts), ids.size(1) + NEW_TOKENS) and torch.equal(batch[:, : ids.size(1)], ids)
    for row, prompt in zip(batch, prompts):
        alone = model.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert torch.equal(row[ids.size(1) :], alone[0, prompt.size(1) :])
    assert len(set(batch[:, ids.size(1) :].flatten().tolist())) > 5, "the tokens vary: a wrong position would show"


def test_a_left_padded_rows_rotary_positions_start_at_its_first_real_token():
    """Attention itself: row 0 has 3 padding tokens, so its queries and keys turn from position 0
    at its fourth token, in the prompt and in the next step, as that row's tokens alone turn."""
    attention = build("llama-tiny").decoder.layers[0].self_attn
    x, step = torch.randn(2, 6, 64), torch.randn(2, 1, 64)
    padded, alone = KVCache(left_padding=torch.tensor([3, 0])), KVCache()
    with torch.no_grad():
        for tokens, real in ((x, x[:1, 3:]), (step, step[:1])):
            q, k, _, _ = attention.project(tokens, cache=padded)
            q_alone, k_alone, _, _ = attention.project(real, cache=alone)
            torch.testing.assert_close(q[:1, :, -real.size(1) :], q_alone, atol=1e-6, rtol=0.0)
            torch.testing.assert_close(k[:1, :, 3:], k_alone, atol=1e-6, rtol=0.0)


def test_generate_refuses_padding_after_a_real_token_an_empty_row_and_a_static_cache_for_padding():
    model = build("llama-tiny")
    ids = random_ids(2, 5)
    with pytest.raises(ValueError, match=r"after a real token \(row 1\).*pad on the left"):
        model.generate(ids, attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="row 0 of attention_mask is all padding"):
        model.generate(ids, attention_mask=torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]))
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="a static cache takes no padding mask"):
        model.generate(ids, attention_mask=padding, cache_implementation="static", max_new_tokens=2)
    assert model.generate(ids, attention_mask=padding, max_new_tokens=2).shape == (2, 7), "dynamic by default"
    unpadded = model.generate(ids, max_new_tokens=4, cache_implementation="static")
    assert torch.equal(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4), unpadded)


# ---- against transformers ------------------------------------------------------------------------
def their_llama():
    """A random LlamaForCausalLM of llama-tiny's shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


def their_gpt2():
    """A random GPT2LMHeadModel of gpt2-tiny's shape."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=1000,
        n_positions=512,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


@pytest.mark.parametrize("theirs", [their_llama, their_gpt2], ids=["llama", "gpt2"])
def test_a_left_padded_batch_generates_what_transformers_generates(theirs, tmp_path):
    """Their weights read by the decoder-lm family's importer (plugins/decoder_lm/hf.py); their
    generate counts each row's positions from its first real token (``attention_mask.cumsum(-1) - 1``)."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = theirs().eval()
    model.save_pretrained(tmp_path)
    ours = tz.from_pretrained(tmp_path).eval()
    ids, mask = left_padded(prompts_of(PROMPT_LENGTHS))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids[1:2]).logits, model(ids[1:2]).logits, **TOLERANCE)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert len(set(expected[:, ids.size(1) :].flatten().tolist())) > 5
    for use_cache in (True, False):
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, use_cache=use_cache)
        assert torch.equal(got, expected), f"use_cache={use_cache}"
