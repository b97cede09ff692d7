"""Decoding by sampling, and ``generate``: top-k with k = 1 is greedy, top-p never leaves the
nucleus, min-p never takes an id below its bar, many samples follow the softmax (a chi-square
test), the same seed gives the same tokens, and stop conditions end rows."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

import transformer_zoo as tz
from transformer_zoo.core.decoding import beam_search, generate, greedy_decode, sample_logits

SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0, head={"tie_weights": False})
LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
DRAWS = 20_000


def _counts(**options) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    ids = sample_logits(LOGITS.expand(DRAWS, -1), generator=generator, **options)
    return torch.bincount(ids, minlength=LOGITS.size(-1)).double()


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_many_samples_follow_the_softmax_within_a_chi_square_bound(temperature):
    expected = (LOGITS[0].double() / temperature).softmax(-1) * DRAWS
    result = stats.chisquare(_counts(temperature=temperature), expected)
    assert result.pvalue > 1e-3, f"chi-square {result.statistic:.1f}, p = {result.pvalue:.2e}"


def test_top_p_never_picks_outside_the_nucleus_and_follows_the_renormalised_softmax():
    probs = LOGITS[0].double().softmax(-1)  # 0.40, 0.25, 0.15, 0.09, ...: 0.40 + 0.25 < 0.7 <= 0.40 + 0.25 + 0.15
    nucleus = 3
    assert probs[: nucleus - 1].sum() < 0.7 <= probs[:nucleus].sum()
    counts = _counts(top_p=0.7)
    assert counts[nucleus:].sum() == 0 and (counts[:nucleus] > 0).all()
    expected = probs[:nucleus] / probs[:nucleus].sum() * DRAWS
    assert stats.chisquare(counts[:nucleus], expected).pvalue > 1e-3


def test_top_k_and_min_p_cut_where_they_say():
    assert (_counts(top_k=2)[2:] == 0).all()
    probs = LOGITS[0].softmax(-1)
    counts = _counts(min_p=0.3)  # ids with at least 0.3 of the most likely's probability
    kept = probs >= 0.3 * probs.max()
    assert (counts[~kept] == 0).all() and (counts[kept] > 0).all()
    assert torch.equal(sample_logits(LOGITS.expand(5, -1), temperature=0), torch.zeros(5, dtype=torch.long))


def test_top_k_of_one_equals_greedy_and_the_same_seed_gives_the_same_tokens():
    model = tz.build_model("transformer-tiny", encoder=None, **SMALL).eval()
    prompt = torch.randint(3, 60, (4, 5))
    greedy = greedy_decode(model, prompt=prompt, max_new_tokens=15)
    assert torch.equal(generate(model, prompt=prompt, max_new_tokens=15, do_sample=True, top_k=1, seed=3), greedy)
    first = generate(model, prompt=prompt, max_new_tokens=15, do_sample=True, temperature=1.5, seed=7)
    again = generate(model, prompt=prompt, max_new_tokens=15, do_sample=True, temperature=1.5, seed=7)
    other = generate(model, prompt=prompt, max_new_tokens=15, do_sample=True, temperature=1.5, seed=8)
    assert torch.equal(first, again) and not torch.equal(first, other)
    uncached = generate(
        model, prompt=prompt, max_new_tokens=15, do_sample=True, temperature=1.5, seed=7, use_cache=False
    )
    assert torch.equal(uncached, first), "sampling on the cache draws what sampling without it draws"


def test_generate_is_greedy_and_beam_search_too():
    model = tz.build_model("transformer-tiny", **SMALL).eval()
    src = torch.randint(3, 60, (3, 7))
    assert torch.equal(
        generate(model, src, bos_id=1, max_new_tokens=8), greedy_decode(model, src, bos_id=1, max_new_tokens=8)
    )
    beam, _ = beam_search(model, src, bos_id=1, eos_id=2, beam_size=3, max_new_tokens=8)
    assert torch.equal(generate(model, src, bos_id=1, eos_id=2, num_beams=3, max_new_tokens=8), beam)


def test_rows_end_at_any_eos_or_where_the_stop_condition_says():
    model = tz.build_model("transformer-tiny", encoder=None, **SMALL).eval()
    prompt = torch.randint(3, 60, (6, 4))
    free = generate(model, prompt=prompt, max_new_tokens=12, do_sample=True, seed=0)
    ends = free[:, 4:6].flatten().unique()[:3].tolist()  # ids some rows draw early
    stopped = generate(model, prompt=prompt, max_new_tokens=12, do_sample=True, seed=0, eos_id=ends, pad_id=0)
    for row, whole in zip(stopped[:, 4:], free[:, 4:]):
        hits = [i for i, t in enumerate(whole.tolist()) if t in ends]
        if hits:  # the same draws up to the first end id, filler after it
            first = hits[0]
            assert torch.equal(row[: first + 1], whole[: first + 1]) and (row[first + 1 :] == 0).all()
    length_three = generate(
        model, prompt=prompt, max_new_tokens=12, pad_id=0, stop=lambda ids: torch.full((ids.size(0),), ids.size(1) >= 7)
    )
    assert length_three.shape == (6, 7), "every row stopped after three new tokens"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"do_sample": True, "temperature": -1.0}, "temperature"),
        ({"do_sample": True, "top_p": 0.0}, "top_p"),
        ({"do_sample": True, "min_p": 1.5}, "min_p"),
        ({"do_sample": True, "top_k": 0}, "top_k"),
        ({"num_beams": 2, "do_sample": True}, "num_beams"),
        ({"stop": lambda ids: ids[:, 0] > 0}, "pad_id"),
    ],
)
def test_bad_sampling_options_are_refused_with_what_is_allowed(options, message):
    model = tz.build_model("transformer-tiny", encoder=None, **SMALL).eval()
    with pytest.raises(ValueError, match=message):
        generate(model, prompt=torch.randint(3, 60, (2, 4)), max_new_tokens=3, **options)
