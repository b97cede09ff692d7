"""Rotary options against Hugging Face transformers: the ``halves`` layout, partial rotary and
the four frequency stretches (linear, dynamic NTK, YaRN, Llama 3.1's), each compared with
transformers' own inverse frequencies, attention factor and rotation; the default (interleaved,
whole head, no stretch) against today's formula, value for value."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import GlmConfig, GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.glm.modeling_glm import GlmRotaryEmbedding  # noqa: E402
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_rotation  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_rotation  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotation  # noqa: E402

import transformer_zoo as tz  # noqa: E402
from transformer_zoo.core.decoding import greedy_decode  # noqa: E402
from transformer_zoo.core.relative import RotaryPositional  # noqa: E402
from transformer_zoo.plugins.components import RotaryOptions  # noqa: E402

D_HEAD, N_HEADS, BASE = 32, 2, 500.0
TOLERANCE = dict(atol=1e-6, rtol=0.0)
"""transformers computes its angles in float32, each off by up to ~1e-7 of itself, so the positions
compared stay under 10, where that is below 1e-6 on values in [-1, 1); past a dozen it is not."""

# Each stretch as transformers' rope_parameters and as our scaling options, with the context
# lengths transformers expects beside them (max_position_embeddings = factor * original).
SCALINGS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, {"kind": "linear", "factor": 4.0}, 64),
    # the original length is transformers' max_position_embeddings: short, so the tests reach past it
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0}, {"kind": "dynamic", "factor": 4.0, "original_max_len": 4}, 4),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {"kind": "yarn", "factor": 4.0, "original_max_len": 64},
        256,
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        {"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_len": 16},
        128,
    ),
}


def their_config(config_class: type, rope_parameters: dict, max_positions: int, fraction: float = 1.0):
    parameters = {"rope_theta": BASE, **rope_parameters}
    if fraction != 1.0:
        parameters["partial_rotary_factor"] = fraction
    return config_class(
        hidden_size=D_HEAD * N_HEADS,
        num_attention_heads=N_HEADS,
        head_dim=D_HEAD,
        max_position_embeddings=max_positions,
        rope_parameters=parameters,
    )


def ours(max_len: int = 8, **options) -> RotaryPositional:
    return RotaryOptions(base=BASE, **options).build(d_model=D_HEAD * N_HEADS, n_heads=N_HEADS, max_len=max_len)


def uniform(*shape: int) -> torch.Tensor:
    """Queries or keys in [-1, 1): float32 results of size ~1 differ by a few of their last bits."""
    return torch.rand(*shape) * 2 - 1


# ---- the default: today's values -----------------------------------------------------------
def todays_rotation(x: torch.Tensor, offset: int) -> torch.Tensor:
    """The rotation as it was before the options: interleaved pairs over the whole head."""
    d = x.size(-1)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(offset + x.size(-2), dtype=torch.float64)[offset:, None] * inv_freq
    cos, sin = angles.cos().float(), angles.sin().float()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def test_the_default_turns_interleaved_pairs_of_the_whole_head_as_before():
    rope = RotaryOptions().build(d_model=64, n_heads=4, max_len=8)
    assert (rope.layout, rope.rotated) == ("interleaved", 16) and not rope.state_dict()
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 12, 16)
    rope.cover(12)
    for offset in (0, 7, torch.tensor(7)):
        turned_q, turned_k = rope.rotate(q, k, offset)
        assert torch.equal(turned_q, todays_rotation(q, int(offset)))
        assert torch.equal(turned_k, todays_rotation(k, 0))


def test_no_option_adds_to_the_state_dict():
    plain = tz.build_model("transformer-tiny", encoder=None, positional="rotary")
    yarn = {"kind": "rotary", "layout": "halves", "fraction": 0.5, "scaling": SCALINGS["yarn"][1]}
    stretched = tz.build_model("transformer-tiny", encoder=None, positional=yarn)
    assert stretched.state_dict().keys() == plain.state_dict().keys()


# ---- inverse frequencies and attention factor ----------------------------------------------
YARN_VARIANTS = {
    "defaults": {},
    "attention_factor": {"attention_factor": 0.75},
    "mscale": {"mscale": 0.707, "mscale_all_dim": 1.0},
    "betas": {"beta_fast": 8.0, "beta_slow": 2.0, "truncate": False},
}


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("kind", list(SCALINGS))
def test_inverse_frequencies_and_attention_factor_are_transformers(kind, fraction):
    theirs, options, max_positions = SCALINGS[kind]
    config = their_config(LlamaConfig, theirs, max_positions, fraction)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, None)
    rope = ours(scaling=options, fraction=fraction)
    torch.testing.assert_close(rope.scaling.inverse_frequencies(rope.rotated, BASE), inv_freq.double(), **TOLERANCE)
    assert rope.scaling.attention_factor == pytest.approx(attention_factor, abs=1e-6)
    assert rope.scaling.attention_factor != 1.0 or kind != "yarn"


@pytest.mark.parametrize("variant", list(YARN_VARIANTS))
def test_yarn_fields_are_transformers(variant):
    theirs, options, max_positions = SCALINGS["yarn"]
    config = their_config(LlamaConfig, {**theirs, **YARN_VARIANTS[variant]}, max_positions)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    rope = ours(scaling={**options, **YARN_VARIANTS[variant]})
    torch.testing.assert_close(rope.scaling.inverse_frequencies(rope.rotated, BASE), inv_freq.double(), **TOLERANCE)
    assert rope.scaling.attention_factor == pytest.approx(attention_factor, abs=1e-6)


@pytest.mark.parametrize("length", [3, 4, 5, 40, torch.tensor(40)])
def test_dynamic_frequencies_follow_the_sequence_length_as_transformers(length):
    theirs, options, max_positions = SCALINGS["dynamic"]
    config = their_config(LlamaConfig, theirs, max_positions)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=length)
    rope = ours(scaling=options)
    mine = rope.scaling.inverse_frequencies(rope.rotated, BASE, length)
    torch.testing.assert_close(mine, inv_freq.double(), **TOLERANCE)
    assert torch.equal(mine, rope.scaling.inverse_frequencies(rope.rotated, BASE)) == (int(length) <= 4)


@pytest.mark.parametrize("kind", ["dynamic", "yarn", "llama3"])
def test_the_original_length_defaults_to_the_model_max_len(kind):
    options = {key: value for key, value in SCALINGS[kind][1].items() if key != "original_max_len"}
    assert ours(max_len=48, scaling=options).scaling.original_max_len == 48


# ---- the rotation ------------------------------------------------------------------------
def their_rotation(embedding, rotation, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor):
    """transformers' rotation of ``q`` at ``q_positions`` ``(B, Tq)`` and of ``k`` from position 0,
    both at the frequencies of the queries' last position (dynamic NTK's, as in a cached step)."""
    cos, sin = embedding(q, q_positions)
    turned_q, _ = rotation(q, q, cos, sin)
    cos, sin = embedding(k, torch.arange(k.size(-2))[None])
    _, turned_k = rotation(k, k, cos, sin)
    return turned_q, turned_k


@pytest.mark.parametrize("offset", [0, 3, torch.tensor(3)], ids=["start", "cached", "static-cache"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("kind", [None, *SCALINGS])
def test_halves_rotation_is_transformers(kind, fraction, offset):
    """Llama's rotary embedding and ``apply_rotary_pos_emb`` for whole heads, GPT-NeoX's for half
    of each head turned; queries at ``offset``, keys from 0, as a cached step sees them."""
    theirs, options, max_positions = SCALINGS[kind] if kind else ({"rope_type": "default"}, None, 64)
    config_class, embedding_class, rotation = (
        (LlamaConfig, LlamaRotaryEmbedding, llama_rotation)
        if fraction == 1.0
        else (GPTNeoXConfig, GPTNeoXRotaryEmbedding, neox_rotation)
    )
    embedding = embedding_class(their_config(config_class, theirs, max_positions, fraction))
    rope = ours(layout="halves", fraction=fraction, scaling=options)
    q_len = 6  # past dynamic's original 4 positions even at the start
    q, k = uniform(2, N_HEADS, q_len, D_HEAD), uniform(2, N_HEADS, int(offset) + q_len, D_HEAD)
    rope.cover(k.size(-2))  # as decoding does before a static cache looks its positions up
    expected = their_rotation(embedding, rotation, q, k, torch.arange(int(offset), int(offset) + q_len)[None])
    for turned, wanted in zip(rope.rotate(q, k, offset), expected):
        torch.testing.assert_close(turned, wanted, **TOLERANCE)
    assert not torch.equal(expected[0][..., D_HEAD // 2 :], q[..., D_HEAD // 2 :]) or fraction < 1.0


def test_dynamic_reads_the_largest_position_in_the_batch():
    """One start per sequence: every sequence turns at the frequencies of the batch's last position."""
    theirs, options, max_positions = SCALINGS["dynamic"]
    embedding = LlamaRotaryEmbedding(their_config(LlamaConfig, theirs, max_positions))
    rope = ours(layout="halves", scaling=options)
    starts, q_len = torch.tensor([1, 3]), 4
    q, k = uniform(2, N_HEADS, q_len, D_HEAD), uniform(2, N_HEADS, 7, D_HEAD)
    rope.cover(7)
    expected = their_rotation(embedding, llama_rotation, q, k, starts[:, None] + torch.arange(q_len))
    for turned, wanted in zip(rope.rotate(q, k, starts), expected):
        torch.testing.assert_close(turned, wanted, **TOLERANCE)


def test_a_static_cache_turns_its_whole_buffer_as_the_dynamic_cache_turns_the_keys_so_far():
    rope = ours(layout="halves", scaling=SCALINGS["dynamic"][1])
    q, k = uniform(1, N_HEADS, 1, D_HEAD), uniform(1, N_HEADS, 32, D_HEAD)
    rope.cover(32)
    for offset in (2, 20):  # within the original length, and past it
        static_q, static_k = rope.rotate(q, k, torch.tensor(offset))
        dynamic_q, dynamic_k = rope.rotate(q, k[:, :, : offset + 1], offset)
        torch.testing.assert_close(static_q, dynamic_q, atol=1e-7, rtol=0.0)
        torch.testing.assert_close(static_k[:, :, : offset + 1], dynamic_k, atol=1e-7, rtol=0.0)


def test_interleaved_partial_rotation_is_glm():
    """GLM turns interleaved pairs of half of each head: ``layout: interleaved`` with ``fraction: 0.5``."""
    config = GlmConfig(
        hidden_size=D_HEAD * N_HEADS,
        num_attention_heads=N_HEADS,
        head_dim=D_HEAD,
        rope_parameters={"rope_type": "default", "rope_theta": BASE, "partial_rotary_factor": 0.5},
    )
    embedding, rope = GlmRotaryEmbedding(config), ours(fraction=0.5)
    q, k = uniform(2, N_HEADS, 6, D_HEAD), uniform(2, N_HEADS, 9, D_HEAD)
    expected = their_rotation(embedding, glm_rotation, q, k, torch.arange(3, 9)[None])
    for turned, wanted in zip(rope.rotate(q, k, 3), expected):
        torch.testing.assert_close(turned, wanted, **TOLERANCE)


# ---- refusals ----------------------------------------------------------------------------
def rotary(**fields) -> dict:
    return {"variant": "transformer-tiny", "encoder": None, "positional": {"kind": "rotary", **fields}}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layout": "half"}, r"positional\.layout: Input should be 'interleaved' or 'halves'"),
        ({"fraction": 0}, r"positional\.fraction: Input should be greater than 0"),
        ({"fraction": 1.5}, r"positional\.fraction: Input should be less than or equal to 1"),
        (
            {"scaling": {"kind": "ntk", "factor": 2}},
            r"positional\.scaling: a rotary scaling is a mapping with a kind among linear, dynamic, yarn, llama3",
        ),
        (
            {"scaling": {"kind": "linear", "factor": 0.5}},
            r"positional\.scaling\.factor: .*greater than or equal to 1",
        ),
        ({"scaling": {"kind": "dynamic"}}, r"positional\.scaling\.factor: Field required"),
        ({"scaling": {"kind": "linear", "factor": 2, "beta_fast": 8}}, r"unknown key 'beta_fast'.*kind 'linear'"),
        (
            {"scaling": {"kind": "yarn", "factor": 2, "original_max_len": 0}},
            r"positional\.scaling\.original_max_len: .*greater than or equal to 1",
        ),
        (
            {"scaling": {"kind": "yarn", "factor": 2, "beta_fast": 0.5, "mscale": 1.0, "attention_factor": 1.0}},
            (
                r"positional\.scaling: beta_fast=0\.5 is below beta_slow=1\.0.*; mscale and mscale_all_dim are "
                r"used together: give both or neither; attention_factor replaces mscale and mscale_all_dim"
            ),
        ),
        (
            {"scaling": {"kind": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}},
            r"positional\.scaling: high_freq_factor=1\.0 must exceed low_freq_factor=4\.0",
        ),
        (
            {"scaling": {"kind": "llama3", "factor": 8, "high_freq_factor": 4}},
            r"positional\.scaling\.low_freq_factor: Field required",
        ),
    ],
)
def test_options_that_cannot_work_are_refused_naming_the_field(fields, message):
    with pytest.raises(tz.ConfigError, match=message):
        tz.load_config(rotary(**fields))


def test_a_fraction_that_splits_a_pair_is_refused_with_the_fractions_that_would_not():
    config = {**rotary(fraction=0.3), "d_model": 128, "n_heads": 2}
    message = r"fraction=0\.3 turns int\(64 \* 0\.3\) = 19 channels .* choose fraction=0\.29 \(18 channels\) or fraction=0\.32"
    with pytest.raises(tz.ConfigError, match=message):
        tz.build_model(config)
    for fraction, rotated in ((0.29, 18), (0.32, 20)):
        model = tz.build_model({**config, "positional": {"kind": "rotary", "fraction": fraction}})
        assert model.decoder.layers[0].self_attn.positional.rotated == rotated
    with pytest.raises(
        tz.ConfigError, match=r"= 0 channels of each head, no channel pair; .* fraction=0\.04 \(2 channels\)"
    ):
        tz.build_model({**config, "positional": {"kind": "rotary", "fraction": 0.01}})
    with pytest.raises(tz.ConfigError, match="dynamic rotary scaling .* turn more than 2"):
        tz.build_model(
            {**config, "positional": {"kind": "rotary", "fraction": 0.04, "scaling": {"kind": "dynamic", "factor": 2}}}
        )


def test_decoding_past_the_original_length_gives_what_decoding_without_a_cache_gives():
    """The cache keeps keys unturned, so each step turns every key at the step's frequencies: a
    stretched model decodes on a cache, dynamic or static, as it reads the whole sequence."""
    positional = {"kind": "rotary", "layout": "halves", "fraction": 0.5, "scaling": {"kind": "dynamic", "factor": 4.0}}
    sizes = dict(vocab_size=60, d_model=32, n_heads=2, d_ff=64, dropout=0.0, max_len=6)
    model = tz.build_model(
        "transformer-tiny", encoder=None, positional=positional, head={"tie_weights": False}, **sizes
    )
    prompt = torch.randint(3, 60, (2, 5))
    uncached = greedy_decode(model.eval(), prompt=prompt, max_new_tokens=12, use_cache=False)
    assert len(set(uncached[:, 5:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    for static_cache in (False, True):
        assert torch.equal(greedy_decode(model, prompt=prompt, max_new_tokens=12, static_cache=static_cache), uncached)
