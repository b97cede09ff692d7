"""``model.generate`` and ``transformer_zoo.generate`` under Hugging Face's argument names: the same
tokens as under the zoo's own names, the same seed the same tokens, and one line for a model
that cannot generate or an argument under no name or two."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core import decoding
from transformer_zoo.core.decoding import ZOO_NAMES, generate, greedy_decode

SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


@pytest.fixture(scope="module")
def seq2seq():
    torch.manual_seed(0)
    return tz.build_model("transformer-tiny", **SMALL).eval()


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return tz.build_model("transformer-tiny", encoder=None, **SMALL).eval()


def test_model_generate_samples_reproducibly_from_a_seed(seq2seq):
    src = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    first = seq2seq.generate(src, max_new_tokens=8, do_sample=True, top_p=0.9, seed=0)
    assert first.shape == (2, 9) and (first[:, 0] == 1).all(), "the zoo's BOS starts each row by default"
    assert torch.equal(first, seq2seq.generate(src, max_new_tokens=8, do_sample=True, top_p=0.9, seed=0))
    others = [seq2seq.generate(src, max_new_tokens=8, do_sample=True, top_p=0.9, seed=s) for s in (1, 2, 3)]
    assert any(not torch.equal(first, other) for other in others), "another seed, other tokens"
    assert tz.generate is generate


def test_hugging_faces_names_and_the_zoos_give_the_same_tokens(seq2seq, lm):
    src = torch.randint(3, 60, (3, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[0, -2:] = False
    zoo = generate(seq2seq, src=src, src_mask=mask, bos_id=1, eos_id=2, pad_id=0, static_cache=False, max_new_tokens=6)
    hf = seq2seq.generate(
        input_ids=src,
        attention_mask=mask,
        decoder_start_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        cache_implementation="dynamic",
        max_length=7,  # the start token and 6 new ones
    )
    assert torch.equal(zoo, hf) and torch.equal(
        hf, greedy_decode(seq2seq, src, mask, bos_id=1, eos_id=2, pad_id=0, max_new_tokens=6)
    )
    beams = seq2seq.generate(src, num_beams=3, eos_token_id=2, max_new_tokens=5)
    assert torch.equal(beams, generate(seq2seq, src, bos_id=1, eos_id=2, num_beams=3, max_new_tokens=5))
    # a decoder-only model continues input_ids, the zoo's prompt
    prompt = torch.randint(3, 60, (2, 4), generator=torch.Generator().manual_seed(3))
    assert torch.equal(lm.generate(prompt, max_new_tokens=5), generate(lm, prompt=prompt, max_new_tokens=5))
    assert lm.generate(prompt, max_new_tokens=5).shape == (2, 9)
    continued = seq2seq.generate(src, decoder_input_ids=torch.ones(3, 2, dtype=torch.long), max_new_tokens=3)
    assert continued.shape == (3, 5) and torch.equal(
        continued, generate(seq2seq, src, prompt=torch.ones(3, 2, dtype=torch.long), max_new_tokens=3)
    )
    assert set(ZOO_NAMES) == {"src", "src_mask", "prompt", "bos_id", "eos_id", "pad_id", "static_cache"}


def test_a_model_that_cannot_generate_says_so_in_one_line():
    for name in ("bert-tiny", "vit-tiny"):
        model = tz.build_model(name)
        with pytest.raises(ValueError, match=r"cannot generate: it has no decoder") as caught:
            model.generate(torch.randint(3, 60, (1, 5)))
        assert "\n" not in str(caught.value) and name in str(caught.value)


def test_arguments_under_no_name_or_two_names_are_refused(seq2seq, lm):
    src = torch.randint(3, 60, (1, 5))
    with pytest.raises(TypeError, match="unexpected argument 'num_return_sequences'; it takes Hugging Face's names"):
        seq2seq.generate(src, num_return_sequences=2)
    with pytest.raises(TypeError, match="got eos_id= and eos_token_id=, one argument under two names"):
        seq2seq.generate(src, eos_id=2, eos_token_id=2)
    with pytest.raises(ValueError, match="cache_implementation='offloaded'; it is one of 'dynamic', 'static'"):
        seq2seq.generate(src, cache_implementation="offloaded")
    with pytest.raises(ValueError, match="give max_new_tokens or max_length"):
        seq2seq.generate(src, max_new_tokens=3, max_length=4)
    with pytest.raises(ValueError, match="a decoder-only model continues input_ids"):
        lm.generate(src, decoder_input_ids=src)
    with pytest.raises(ValueError, match="attention_mask marks padding in a decoder-only model's prompt"):
        lm.generate(src, attention_mask=torch.tensor([[1, 1, 1, 0, 0]]))
    assert decoding.CACHES == {"dynamic": False, "static": True}
