"""The MAD tasks: seeded data, splits apart, every answer re-derived from the sequence by rules
written here (not by the generators), lengths, option errors, MAD's grid, and one pass of a tiny
model through each task."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import transformer_zoo as tz
from transformer_zoo import hookimpl
from transformer_zoo.core.embedding import PAD
from transformer_zoo.plugins.tasks import mad, mad_instances
from transformer_zoo.plugins.tasks.mad import FIRST_TOKEN
from transformer_zoo.registry import get_registry

OPTIONS = {
    "mad-in-context-recall": mad.InContextRecallOptions,
    "mad-noisy-recall": mad.NoisyRecallOptions,
    "mad-fuzzy-recall": mad.FuzzyRecallOptions,
    "mad-selective-copying": mad.SelectiveCopyingOptions,
    "mad-compression": mad.CompressionOptions,
    "mad-memorization": mad.MemorizationOptions,
}
SMALL = {  # small enough to generate in milliseconds, still MAD's shape
    "mad-in-context-recall": {"seq_len": 32},
    "mad-noisy-recall": {"seq_len": 32},
    "mad-fuzzy-recall": {"seq_len": 48},
    "mad-selective-copying": {"seq_len": 40, "num_tokens_to_copy": 6},
    "mad-compression": {"seq_len": 12},
    "mad-memorization": {"vocab_size": 64, "seq_len": 12},
}


def make(kind: str, **options) -> mad.MADTask:
    return OPTIONS[kind](**{"num_train_examples": 60, "num_test_examples": 30, **SMALL[kind], **options}).build()


def rows(task: mad.MADTask, split: str) -> list[tuple[list[int], list[int]]]:
    """A split's rows in MAD's tokens, -1 where nothing is asked."""
    data = task.dataset(split)
    return [
        ([i - FIRST_TOKEN for i in ids], [-1 if a == PAD else a - FIRST_TOKEN for a in answers])
        for ids, answers in zip(data["ids"], data["answers"])
    ]


@pytest.mark.parametrize("kind", OPTIONS)
def test_data_is_seeded(kind):
    first, again, other = make(kind), make(kind), make(kind, seed=1)
    for split in ("train", "test"):
        assert first.dataset(split)[:] == again.dataset(split)[:]
        assert first.dataset(split)[:] != other.dataset(split)[:]


@pytest.mark.parametrize("kind", OPTIONS)
def test_no_test_row_repeats_a_training_row(kind):
    task = make(kind)
    train = {tuple(ids) for ids in task.dataset("train")["ids"]}
    assert not any(tuple(ids) in train for ids in task.dataset("test")["ids"])


def test_a_test_split_that_cannot_differ_from_training_is_refused():
    task = make("mad-compression", vocab_size=3, seq_len=3)  # 4 sequences in all, all in training
    with pytest.raises(ValueError, match="test sequences differ from every training sequence; raise seq_len"):
        task.dataset("test")


@pytest.mark.parametrize("kind", OPTIONS)
def test_rows_have_the_stated_length_and_ids(kind):
    task = make(kind)
    seq_len = task.options.seq_len
    expected = seq_len - 1 if kind in ("mad-in-context-recall", "mad-noisy-recall") else seq_len
    assert task.length == expected
    for split in task.splits:
        for ids, answers in zip(task.dataset(split)["ids"], task.dataset(split)["answers"]):
            assert len(ids) == len(answers) == expected
            assert all(type(i) is int and FIRST_TOKEN <= i < task.vocab_size for i in ids)
            assert all(a == PAD or FIRST_TOKEN <= a < task.vocab_size for a in answers)
            assert any(a != PAD for a in answers)
    test_answers = {a for answers in task.dataset("test")["answers"] for a in answers if a != PAD}
    assert test_answers <= set(task.answer_ids)


# ---- every answer, re-derived -----------------------------------------------------------------


def recall_targets(tokens: list[int], keys: int, values: int, noise: int, multi_query: bool) -> list[int]:
    """The values asked of a whole recall sequence: walk its pairs, remembering each key's value."""
    seen: dict[int, int] = {}
    targets: list[int] = []
    body = tokens[:-2] if multi_query else tokens[:-3]
    for a, b in zip(body[0::2], body[1::2]):
        targets += [-1, -1]
        if keys <= a:  # two noise tokens
            assert values <= a < noise and values <= b < noise
            continue
        assert keys <= b < values
        if a in seen:
            assert seen[a] == b, "a key changed its value"
            if multi_query:
                targets[-1] = b
        seen[a] = b
    if not multi_query:
        assert tokens[-3] == noise  # the copy prefix
        targets.append(-1)
    probe, value = tokens[-2:]
    assert seen[probe] == value, "the last key was not shown before, with this value"
    return targets + [-1, value]


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("mad-in-context-recall", {}),
        ("mad-in-context-recall", {"multi_query": False}),
        ("mad-noisy-recall", {}),
        ("mad-noisy-recall", {"frac_noise": 0.8, "multi_query": False}),
    ],
)
def test_recall_answers(kind, options):
    task = make(kind, **options)
    o = task.options
    content = o.vocab_size - o.noise_vocab_size - (0 if o.multi_query else 1)
    keys, values, noise = content // 2, content, content + o.noise_vocab_size
    for ids, answers in rows(task, "train"):  # every next token
        assert answers[:-1] == ids[1:]
    for ids, answers in rows(task, "test"):
        whole = ids + [answers[-1]]  # the last token, asked at the position before
        assert answers == recall_targets(whole, keys, values, noise, o.multi_query)[1:]
    if o.frac_noise:
        assert any(t >= content for ids, _ in rows(task, "test") for t in ids)


def fuzzy_targets(tokens: list[int], keys: int, values: int, k_motif_size: int, multi_query: bool) -> list[int]:
    """The values asked of a whole fuzzy-recall test sequence: after MAD's padding (the token after
    the values), runs of ``k_motif_size`` key tokens, each followed by a run of value tokens."""
    pad, copy = values, values + 1
    start = next(i for i, t in enumerate(tokens) if t != pad)
    targets = [-1] * start
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    i = start
    while i < len(tokens):
        if not multi_query and tokens[i] == copy:
            targets.append(-1)
            i += 1
            continue
        key = tuple(tokens[i : i + k_motif_size])
        assert all(t < keys for t in key)
        j = i + k_motif_size
        while j < len(tokens) and keys <= tokens[j] < values:
            j += 1
        value = tuple(tokens[i + k_motif_size : j])
        assert value, "a key without a value"
        asked = key in seen and (multi_query or j == len(tokens))  # single query: the last pair only
        assert seen.setdefault(key, value) == value, "a key changed its value"
        targets += [-1] * k_motif_size + (list(value) if asked else [-1] * len(value))
        i = j
    assert targets[-1] != -1, "the last key was not shown before"
    return targets


@pytest.mark.parametrize("options", [{}, {"multi_query": False}])
def test_fuzzy_recall_answers(options):
    task = make("mad-fuzzy-recall", **options)
    o = task.options
    content = o.vocab_size - (1 if o.multi_query else 2)
    for ids, answers in rows(task, "train"):
        assert answers[:-1] == ids[1:]
    for ids, answers in rows(task, "test"):
        whole = ids + [answers[-1]]
        assert answers == fuzzy_targets(whole, content // 2, content, o.k_motif_size, o.multi_query)[1:]


def test_fuzzy_training_keys_vary_in_size():
    task = make("mad-fuzzy-recall")
    keys = task.options.vocab_size - 1
    runs = set()
    for ids, _ in rows(task, "train"):
        run = 0
        for t in ids:
            if t < keys // 2:
                run += 1
            elif run:
                runs.add(run)
                run = 0
    assert runs == {1, 2, 3}


def test_selective_copying_answers():
    task = make("mad-selective-copying")
    o = task.options
    blank, copy, n = o.vocab_size - 2, o.vocab_size - 1, o.num_tokens_to_copy
    for split in task.splits:
        for ids, answers in rows(task, split):
            assert ids[-n - 1] == copy and ids[-n:] == [blank] * n
            kept = [t for t in ids[: -n - 1] if t != blank]
            assert answers == [-1] * (len(ids) - n) + kept
            assert len(kept) == n and ids[-n - 2] == kept[-1]  # as in mad-lab: no blank after the last token


def test_compression_answers():
    task = make("mad-compression")
    for split in task.splits:
        for ids, answers in rows(task, split):
            assert answers == ids and ids[-1] == task.options.vocab_size - 1
            assert all(t < task.options.vocab_size - 1 for t in ids[:-1])


def test_memorization_is_one_fixed_table_in_both_splits():
    task = make("mad-memorization")
    insert = task.options.vocab_size - 1
    table: dict[int, int] = {}
    for split in task.splits:
        for ids, answers in rows(task, split):
            assert ids[1::2] == [insert] * (len(ids) // 2) and answers[0::2] == [-1] * (len(ids) // 2)
            for key, value in zip(ids[0::2], answers[1::2]):
                assert table.setdefault(key, value) == value, "a key changed its value"
    keys = (task.options.vocab_size - 1) // 2
    assert set(table) <= set(range(keys))
    assert len(set(table.values())) == len(table)  # one value per key
    assert set(table.values()) <= set(range(keys, insert))
    assert make("mad-memorization", num_train_examples=10).options.table().tolist() == task.options.table().tolist()
    assert make("mad-memorization", seed=1).options.table().tolist() != task.options.table().tolist()


def test_token_strings():
    recall = make("mad-noisy-recall", multi_query=False)
    o = recall.options
    content = o.vocab_size - o.noise_vocab_size - 1
    names = recall.token_strings(
        [PAD, FIRST_TOKEN, FIRST_TOKEN + content - 1, FIRST_TOKEN + content, FIRST_TOKEN + o.vocab_size - 1]
    )
    assert names == ["<pad>", "k0", f"v{content - 1}", f"n{content}", "<copy>"]
    copying = make("mad-selective-copying")
    assert copying.token_strings([FIRST_TOKEN + t for t in (0, 14, 15)]) == ["t0", "<blank>", "<copy>"]


# ---- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("mad-in-context-recall", {"seq_len": 31}, "seq_len=31: a recall sequence is pairs .* such as 32"),
        ("mad-noisy-recall", {"vocab_size": 17}, "leaves 0 key and 1 value tokens .* raise vocab_size to 18"),
        ("mad-in-context-recall", {"frac_noise": 0.2}, "frac_noise=0.2 needs noise tokens; set noise_vocab_size"),
        ("mad-fuzzy-recall", {"vocab_size": 6}, "a key needs 3 distinct key tokens.* raise vocab_size to 7"),
        ("mad-fuzzy-recall", {"seq_len": 12}, "seq_len=12 cannot hold the probe pair twice .* seq_len >= 13"),
        ("mad-selective-copying", {"num_tokens_to_copy": 20}, "use seq_len >= 42 or copy 19 tokens or fewer"),
        ("mad-memorization", {"seq_len": 11}, "pairs of key and insert token; use an even seq_len, such as 12"),
        ("mad-compression", {"vocab_size": 2}, "greater than or equal to 3"),
    ],
)
def test_impossible_options_say_what_would_do(kind, options, message):
    with pytest.raises(ValidationError, match=message):
        OPTIONS[kind](**{**SMALL[kind], **options})


def test_defaults_are_mads_baselines():
    expected = {
        "mad-in-context-recall": {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800},
        "mad-noisy-recall": {"vocab_size": 32, "noise_vocab_size": 16, "frac_noise": 0.2, "seq_len": 128},
        "mad-fuzzy-recall": {"vocab_size": 16, "seq_len": 128, "k_motif_size": 3, "v_motif_size": 3},
        "mad-selective-copying": {"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16},
        "mad-compression": {"vocab_size": 16, "seq_len": 32, "num_train_examples": 12800},
        "mad-memorization": {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256},
    }
    for kind, values in expected.items():
        defaults = OPTIONS[kind]().model_dump()
        assert {name: defaults[name] for name in values} == values, kind
        assert defaults["num_test_examples"] == 1280


def test_every_difficulty_setting_is_valid():
    assert set(mad_instances.DIFFICULTIES) == set(OPTIONS)
    counts = {kind: len(mad_instances.difficulty_settings(kind)) for kind in OPTIONS}
    assert counts == {
        "mad-in-context-recall": 11,
        "mad-noisy-recall": 14,
        "mad-fuzzy-recall": 11,
        "mad-selective-copying": 13,
        "mad-compression": 11,
        "mad-memorization": 6,
    }
    for kind, settings in ((k, mad_instances.difficulty_settings(k)) for k in OPTIONS):
        assert settings[0] == {}
        for setting in settings:
            OPTIONS[kind](**setting)
    with pytest.raises(ValueError, match="no MAD difficulty grid for task 'reverse'"):
        mad_instances.difficulty_settings("reverse")


# ---- with a model -----------------------------------------------------------------------------


class _CompressionHeadPlugin:
    @hookimpl
    def tzoo_components(self):
        return [mad.MADCompressionDecoderOptions]


@pytest.fixture(scope="module")
def compression_head():
    """The compression head, registered for these tests if the built-in plugins do not yet."""
    registry = get_registry()
    if "mad-compression-decoder" in registry.components("head"):
        yield
        return
    name = registry.register(_CompressionHeadPlugin(), "test-mad-compression-decoder")
    yield
    registry.unregister(name)


@pytest.mark.parametrize("kind", OPTIONS)
def test_a_tiny_model_takes_each_task(kind, compression_head):
    torch.manual_seed(0)
    task = make(kind, num_train_examples=8, num_test_examples=8)
    config = tz.load_config("transformer-tiny")
    assert task.unfit_reason(config) is None
    model = tz.build_model(tz.load_config(config, task.model_overrides(config)))
    batch = task.collate([task.dataset("train")[i] for i in range(4)])
    loss = task.loss(model, batch)
    assert loss.ndim == 0 and math.isfinite(loss.item())
    loss.backward()
    predicted, answers = task.predictions(model, [task.dataset("test")[i] for i in range(3)])
    assert predicted.shape == answers.shape == (3, task.length)
    scores = task.evaluate(model, "test", batch_size=4)
    assert set(scores) == {"accuracy", "sequence_accuracy"}
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    assert task.baselines("test") == {"accuracy": 1 / len(task.answer_ids)}


def test_compression_reads_the_sequence_through_its_last_state(compression_head):
    task = make("mad-compression")
    config = tz.load_config({"variant": "transformer-tiny"})
    model_config = tz.load_config(config, task.model_overrides(config))
    assert model_config.head.kind == "mad-compression-decoder" and model_config.encoder is None
    head = mad.CompressionDecoder(16, 10, ignore_index=PAD)
    hidden = torch.randn(2, 5, 16)
    changed = hidden.clone()
    changed[:, :-1] = torch.randn(2, 4, 16)
    assert torch.equal(head(hidden), head(changed))  # only the last state reaches the output
    assert head(hidden).shape == (2, 5, 10)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    last_real = hidden.clone()
    last_real[0, -1] = hidden[0, 2]  # row 0 ends at its third position
    assert torch.allclose(head(hidden, mask), head(last_real))


def test_too_short_a_model_is_refused():
    task = make("mad-selective-copying")
    config = tz.load_config({"variant": "transformer-tiny", "max_len": 16})
    assert "max_len=16 is shorter than the task's 40-token rows" in task.unfit_reason(config)
    assert np.isclose(1 / len(task.answer_ids), 1 / 14)
