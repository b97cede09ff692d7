"""Positional encodings against their papers' formulas."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core import embedding as embedding_module
from transformer_zoo.core import recurrent as recurrent_module
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.core.embedding import LearnedPositional, SinusoidalPositional, add_positions, sinusoid_table
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.relative import ALiBiPositional, RotaryPositional


def test_sinusoid_table_matches_section_3_5():
    table = sinusoid_table(50, 8)
    for pos in (0, 7, 49):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_additive_positions_respect_the_offset():
    pe = SinusoidalPositional(8, 20)
    x = torch.zeros(1, 3, 8)
    torch.testing.assert_close(pe(x, offset=5), pe.table[5:8][None])
    learned = LearnedPositional(8, 20)
    torch.testing.assert_close(learned(x, offset=2), learned.embedding.weight[2:5][None])


def test_learned_positions_refuse_a_sequence_past_max_len_and_sinusoids_compute_more_rows():
    with pytest.raises(ValueError, match=r"max_len=10 positions only \(they cannot extrapolate\)"):
        LearnedPositional(8, 10)(torch.zeros(1, 11, 8))
    pe, x = SinusoidalPositional(8, 10), torch.zeros(1, 25, 8)
    torch.testing.assert_close(pe(x), sinusoid_table(25, 8)[None])
    torch.testing.assert_close(pe(x[:, :3], offset=30), sinusoid_table(33, 8)[None, 30:])
    rope, q = RotaryPositional(8, 10), torch.randn(1, 2, 40, 8)
    torch.testing.assert_close(rope.rotate(q, q, 0)[0], RotaryPositional(8, 40).rotate(q, q, 0)[0])


@pytest.mark.parametrize("kind", ["sinusoidal", "rotary", "alibi", "t5-bias", "shaw", "learned"])
def test_every_positional_scheme_reads_past_its_training_length_or_refuses_in_one_message(kind):
    """A language model built (and trained) for 16 tokens reads 8 times as many, the first 16
    positions' logits unchanged (the decoder is causal); learned positions cannot, and say so."""
    model = tz.build_model("transformer-tiny", encoder=None, positional=kind, max_len=16, dropout=0.0).eval()
    ids = torch.randint(3, 100, (2, 128))
    if kind == "learned":
        with pytest.raises(ValueError, match="reaches position 128 but learned positions .* max_len=16"):
            model(ids)
        return
    with torch.no_grad():
        long, short = model(ids).logits, model(ids[:, :16]).logits
    assert long.shape == (2, 128, model.config.vocab_size) and torch.isfinite(long).all()
    torch.testing.assert_close(long[:, :16], short, atol=1e-5, rtol=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryPositional(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> float:
        rq, _ = rope.rotate(q, q, i)
        rk, _ = rope.rotate(k, k, j)
        return (rq * rk).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = ALiBiPositional(4, symmetric=False)
    bias = alibi.bias(3, 3, torch.device("cpu"))
    slopes = [2 ** (-8 * (h + 1) / 4) for h in range(4)]
    assert bias.shape == (4, 3, 3)
    assert bias[1, 2, 0].item() == pytest.approx(-2 * slopes[1])
    assert bias[0, 0, 2].item() == 0.0  # the future is masked elsewhere, not penalised here
    symmetric = ALiBiPositional(4, symmetric=True).bias(3, 3, torch.device("cpu"))
    assert symmetric[0, 0, 2].item() == pytest.approx(-2 * slopes[0])


# ---- random start offsets (Dehghani et al. 2018, section 3.3) ---------------------------------
SMALL = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, dropout=0.0, max_len=64)


def model_with(positional: dict | str, variant: str = "transformer-tiny", **extra) -> torch.nn.Module:
    config = tz.load_config({"variant": variant, "positional": positional, **SMALL, **extra})
    return config.build()


def test_add_positions_takes_one_start_per_row_and_keeps_gradients():
    learned = LearnedPositional(8, 20)
    x = torch.randn(4, 3, 8, requires_grad=True)
    start = torch.tensor([2, 0, 2, 5])
    out = add_positions(learned, x, start)
    expected = torch.stack([learned(x[b : b + 1], int(start[b]))[0] for b in range(4)])
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    assert learned.embedding.weight.grad[[0, 1, 2, 3, 4, 5, 6, 7]].abs().sum() > 0
    assert learned.embedding.weight.grad[8:].abs().sum() == 0


@pytest.mark.parametrize("module", [SinusoidalPositional(8, 20), LearnedPositional(8, 20)])
def test_the_built_in_tables_look_up_every_rows_start_at_once(module, monkeypatch):
    """One lookup for a batch of per-sequence starts (no call per distinct start, which on a GPU cost a
    synchronising nonzero() per start), equal to calling the module at each row's start; a start
    past the table is refused by learned positions, and computed by sinusoids."""
    x = torch.randn(6, 3, 8)
    start = torch.tensor([2, 0, 2, 5, 17, 9])
    expected = torch.stack([module(x[b : b + 1], int(start[b]))[0] for b in range(6)])
    calls = []
    monkeypatch.setattr(torch.Tensor, "unique", lambda *a, **k: calls.append(1))
    torch.testing.assert_close(add_positions(module, x, start), expected, rtol=0, atol=0)
    assert not calls
    past = torch.tensor([0, 18, 0, 0, 0, 0])
    if isinstance(module, LearnedPositional):
        with pytest.raises(ValueError, match="reaches position 21"):
            add_positions(module, x, past)
    else:
        torch.testing.assert_close(add_positions(module, x, past)[1], x[1] + sinusoid_table(21, 8)[18:])


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_training_positions_start_at_a_random_offset_below_k(kind):
    embed = model_with({"kind": kind, "random_offset": 5}).src_embed.train()
    torch.nn.init.zeros_(embed.token.weight)  # the embeddings are then the positions alone
    table = embed.positional.table if kind == "sinusoidal" else embed.positional.embedding.weight
    ids = torch.randint(1, 60, (64, 7))
    torch.manual_seed(0)
    with torch.no_grad():
        added = embed(ids)  # (B, T, D)
    starts = []
    for row in added:
        matches = [r for r in range(len(table) - 7 + 1) if torch.allclose(row, table[r : r + 7], atol=1e-6)]
        assert len(matches) == 1, "each row holds consecutive table rows"
        starts.append(matches[0])
    assert max(starts) < 5
    assert len(set(starts)) > 1, "the start is drawn per sequence"
    torch.manual_seed(0)
    with torch.no_grad():
        torch.testing.assert_close(embed(ids), added)  # a seed repeats the draws


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_evaluation_starts_at_zero(kind):
    torch.manual_seed(0)
    model = model_with({"kind": kind, "random_offset": 5}).eval()
    plain = model_with(kind).eval()
    state = model.state_dict()
    if kind == "learned":  # the plain table has the first max_len of the K-offset model's rows
        for key in ("src_embed.positional.embedding.weight", "tgt_embed.positional.embedding.weight"):
            state[key] = state[key][: SMALL["max_len"]]
    plain.load_state_dict(state)
    src, tgt = torch.randint(1, 60, (3, 9)), torch.randint(1, 60, (3, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt).logits, plain(src, tgt).logits)
        assert not torch.allclose(model.train()(src, tgt).logits, plain(src, tgt).logits, atol=1e-4)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_cached_greedy_decoding_ignores_the_random_offset(kind):
    torch.manual_seed(0)
    model = model_with({"kind": kind, "random_offset": 5}, head={"tie_weights": False}).eval()
    src = torch.randint(3, 60, (4, 9))
    cached = greedy_decode(model, src, bos_id=1, max_new_tokens=12)
    uncached = greedy_decode(model, src, bos_id=1, max_new_tokens=12, use_cache=False)
    assert len(set(cached[:, 1:].flatten().tolist())) > 3
    assert torch.equal(cached, uncached)


def test_random_offset_is_off_by_default():
    model = model_with("sinusoidal")
    assert tz.load_config("transformer-tiny").positional.random_offset == 0
    src, tgt = torch.randint(1, 60, (3, 9)), torch.randint(1, 60, (3, 6))
    with torch.no_grad():
        torch.testing.assert_close(model.train()(src, tgt).logits, model.eval()(src, tgt).logits)


def test_universal_transformer_keeps_one_start_at_every_step(monkeypatch):
    calls: dict[int, list] = {}

    def spy(positional, x, start):
        calls.setdefault(id(positional), []).append(start)
        return add_positions(positional, x, start)

    monkeypatch.setattr(recurrent_module, "add_positions", spy)
    torch.manual_seed(0)
    model = model_with(
        {"kind": "sinusoidal", "random_offset": 5},
        variant="universal-transformer-tiny",
        encoder={"kind": "recurrent", "layers": 3, "act": False},
        decoder={"kind": "recurrent", "layers": 3, "act": True},
    ).train()
    src, tgt = torch.randint(1, 60, (16, 9)), torch.randint(1, 60, (16, 6))
    model(src, tgt)
    assert len(calls) == 2, "the encoder's and the decoder's step signals"
    for starts in calls.values():
        assert len(starts) >= 3, "positions are added at every step"
        assert isinstance(starts[0], torch.Tensor) and len(set(starts[0].tolist())) > 1
        assert all(torch.equal(start, starts[0]) for start in starts)
    calls.clear()
    model.eval()(src, tgt)
    assert all(start == 0 for starts in calls.values() for start in starts)


@pytest.mark.parametrize("variant", ["transformer-tiny", "universal-transformer-tiny"])
def test_the_source_and_the_target_of_an_example_share_their_random_start(monkeypatch, variant):
    """One draw per example for the whole model: a target position stays aligned with its source
    position, which copying and reversing rely on. The embeddings add the positions once
    (transformer), or the step signal at every step (universal transformer)."""
    calls: list[torch.Tensor] = []

    def spy(positional, x, start):
        calls.append(start)
        return add_positions(positional, x, start)

    monkeypatch.setattr(recurrent_module, "add_positions", spy)
    monkeypatch.setattr(embedding_module, "add_positions", spy)
    torch.manual_seed(0)
    model = model_with({"kind": "sinusoidal", "random_offset": 16}, variant=variant).train()
    model(torch.randint(1, 60, (32, 9)), torch.randint(1, 60, (32, 6)))
    assert len(calls) >= 2 and all(isinstance(start, torch.Tensor) for start in calls)
    assert len(set(calls[0].tolist())) > 4, "the start differs between examples"
    assert all(torch.equal(start, calls[0]) for start in calls), "and is the same on both sides and at every step"


@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_relative_schemes_refuse_a_random_offset(kind):
    with pytest.raises(
        ConfigError,
        match=f"{kind} positions depend only on the distance between query and key.*"
        "use sinusoidal or learned positions",
    ):
        tz.load_config({"variant": "transformer-tiny", "positional": {"kind": kind, "random_offset": 3}})
    assert tz.load_config({"variant": "transformer-tiny", "positional": {"kind": kind}}).positional.random_offset == 0


def test_a_learned_table_has_room_for_the_offsets():
    model = model_with({"kind": "learned", "random_offset": 4})
    assert model.src_embed.positional.embedding.num_embeddings == SMALL["max_len"] + 4
    assert model_with("learned").src_embed.positional.embedding.num_embeddings == SMALL["max_len"]
    bert = tz.build_model("bert-tiny", positional={"kind": "learned", "random_offset": 4}, max_len=32, dropout=0.0)
    assert bert.src_embed.positional.embedding.num_embeddings == 36


def test_bert_embeddings_start_at_a_random_offset_in_training():
    torch.manual_seed(0)
    bert = tz.build_model("bert-tiny", positional={"kind": "learned", "random_offset": 4}, max_len=32, dropout=0.0)
    ids = torch.randint(1, 100, (8, 10))
    with torch.no_grad():
        trained, evaluated = bert.train().src_embed(ids), bert.eval().src_embed(ids)
        unshifted = bert.src_embed.norm(
            bert.src_embed.token(ids)
            + bert.src_embed.token_type(torch.zeros_like(ids))
            + bert.src_embed.positional.embedding.weight[:10]
        )
    torch.testing.assert_close(evaluated, unshifted)
    assert not torch.allclose(trained, evaluated)
