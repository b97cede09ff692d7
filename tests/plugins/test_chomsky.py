"""The Chomsky-hierarchy tasks: seeded data, every answer checked by a rule written here (not the
generator's), the paper's lengths and splits, the per-length mean of the test score, option
errors that say what to do, and a real decoder and encoder on a small instance."""

from __future__ import annotations

from types import SimpleNamespace

import datasets
import pytest
import torch
from pydantic import ValidationError
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.embedding import PAD
from transformer_zoo.plugins.tasks import chomsky
from transformer_zoo.plugins.tasks.chomsky import BLANK, FIRST

OPTIONS = {
    "parity-check": chomsky.ParityCheckOptions,
    "even-pairs": chomsky.EvenPairsOptions,
    "cycle-navigation": chomsky.CycleNavigationOptions,
    "reverse-string": chomsky.ReverseStringOptions,
    "stack-manipulation": chomsky.StackManipulationOptions,
    "duplicate-string": chomsky.DuplicateStringOptions,
    "binary-addition": chomsky.BinaryAdditionOptions,
}
SMALL = {"train_size": 300, "test_lengths": (41, 60), "test_size_per_length": 3, "test_stride": 2}


def make(kind: str, **options):
    return OPTIONS[kind](**{**SMALL, **options}).build()


def binary(digits: str) -> int:
    """A number written lowest digit first."""
    return int(digits[::-1] or "0", 2)


def stack_after(symbols: list[str]) -> list[str]:
    stack: list[str] = []
    for symbol in symbols:
        if symbol in ("0", "1"):
            stack.append(symbol)
        elif symbol == "pop":
            if stack:
                stack.pop()
        else:
            stack.append(symbol[-1])
    return stack[::-1]


def expected(kind: str, s: list[str]) -> list[str]:
    """The output the paper defines for input ``s``, computed without the task's generator."""
    text = "".join(s)
    if kind == "parity-check":
        return ["odd" if text.count("1") % 2 else "even"]
    if kind == "even-pairs":
        pairs = sum(text[i : i + 2] in ("01", "10") for i in range(len(text) - 1))
        return ["odd" if pairs % 2 else "even"]
    if kind == "cycle-navigation":
        return [str(sum(int(move) for move in s) % 5)]
    if kind == "reverse-string":
        return s[::-1]
    if kind == "duplicate-string":
        return s + s
    if kind == "stack-manipulation":
        out = stack_after(s) + ["end"]
    else:  # binary-addition; an input of one or two symbols is a number alone
        total = sum(binary(part) for part in text.split("+"))
        out = list(bin(total)[2:][::-1]) + ["end"]
    return out + ["0"] * (len(s) + 1 - len(out))


def decoded(task, row) -> tuple[list[str], list[str]]:
    o, n = task.options, row["length"]
    return [o.inputs[i - FIRST] for i in row["ids"][:n]], [
        o.outputs[a - task.answer_ids[0]] for a in row["answers"][n:]
    ]


@pytest.mark.parametrize("kind", OPTIONS)
def test_every_answer_is_the_papers_output_at_the_stated_lengths(kind):
    task = make(kind)
    o = task.options
    ranges = {"train": (1, 40), "test_1-40": (1, 40), "test": (41, 60)}
    for split in task.splits:
        low, high = ranges.get(split, (41, 60))
        for row in task.dataset(split):
            n = row["length"]
            s, out = decoded(task, row)
            assert low <= n <= high and len(row["ids"]) == len(row["answers"]) == n + o.output_length(n)
            assert row["ids"][n:] == [BLANK] * o.output_length(n), "blanks follow the input"
            assert row["answers"][:n] == [PAD] * n, "nothing asked over the input"
            assert all(a in task.answer_ids for a in row["answers"][n:]), "an answer at every blank"
            assert out == expected(kind, s), (split, s)
    lengths = set(task.dataset("train")["length"])
    assert {1, 2, 40} <= lengths, "the short cases of the paper's generators are drawn too"


def test_output_lengths_and_alphabets_are_the_papers():
    n = 45
    out = {kind: cls().output_length(n) for kind, cls in OPTIONS.items()}
    assert out == {
        "parity-check": 1,
        "even-pairs": 1,
        "cycle-navigation": 1,
        "reverse-string": n,
        "stack-manipulation": n + 1,
        "duplicate-string": 2 * n,
        "binary-addition": n + 1,
    }
    sizes = {kind: (len(cls.inputs), len(cls.outputs)) for kind, cls in OPTIONS.items()}
    assert sizes == {
        "parity-check": (2, 2),
        "even-pairs": (2, 2),
        "cycle-navigation": (3, 5),
        "reverse-string": (2, 2),
        "stack-manipulation": (5, 3),
        "duplicate-string": (2, 2),
        "binary-addition": (3, 3),
    }
    task = make("stack-manipulation")
    assert task.vocab_size == 2 + 5 + 3 and task.answer_ids == (7, 8, 9)
    assert task.baselines("test") == {"accuracy": pytest.approx(1 / 3)}


@pytest.mark.parametrize("kind", ["parity-check", "binary-addition"])
def test_seeded(kind):
    first, again, other = make(kind), make(kind), make(kind, seed=1)
    for split in first.splits:
        assert first.dataset(split)[:] == again.dataset(split)[:]
    assert first.dataset("train")[:] != other.dataset("train")[:]
    assert first.dataset("test")[:] != other.dataset("test")[:]


def test_a_lengths_rows_do_not_change_with_the_other_lengths_scored():
    every, strided = make("reverse-string", test_stride=1), make("reverse-string", test_stride=2)
    at = lambda task, n: [r["ids"] for r in task.dataset("test") if r["length"] == n]  # noqa: E731
    assert at(every, 43) == at(strided, 43) and len(at(every, 43)) == 3
    assert at(strided, 42) == []


def test_splits_are_disjoint_and_the_buckets_cover_the_test_split():
    task = make("parity-check", train_size=2000, test_stride=1, buckets=3)
    assert task.splits == ("train", "test_1-40", "test", "test_41-47", "test_48-54", "test_55-60")
    ids = {split: {tuple(r) for r in task.dataset(split)["ids"]} for split in task.splits}
    assert not ids["train"] & ids["test_1-40"], "the in-distribution split leaves out what was trained on"
    assert not ids["train"] & ids["test"] and not ids["test_1-40"] & ids["test"]
    buckets = list(task.options.bucket_lengths)
    assert set().union(*(ids[b] for b in buckets)) == ids["test"]
    assert sum(len(task.dataset(b)) for b in buckets) == len(task.dataset("test"))
    short = [r for r in task.dataset("test_1-40") if r["length"] <= 8]
    assert len(short) < 8 * 3, "short inputs are mostly trained on, so mostly left out"
    assert task.options.lengths == {"test_1-40": 20, "test_41-47": 44, "test_48-54": 51, "test_55-60": 57}


def test_the_defaults_are_the_papers_lengths():
    o = chomsky.BinaryAdditionOptions()
    assert (o.train_lengths, o.test_lengths, o.test_stride, o.buckets) == ((1, 40), (41, 500), 1, 4)
    task = o.build()
    assert task.splits == ("train", "test_1-40", "test", "test_41-155", "test_156-270", "test_271-385", "test_386-500")
    assert o.lengths == {
        "test_1-40": 20,
        "test_41-155": 98,
        "test_156-270": 213,
        "test_271-385": 328,
        "test_386-500": 443,
    }
    assert len(o.scored_lengths) == 460 and o.test_size_per_length == 4
    assert chomsky.BinaryAdditionOptions(buckets=0).build().splits == ("train", "test_1-40", "test")


class Constant(nn.Module):
    """A stand-in decoder that answers ``answer`` at every position."""

    def __init__(self, answer: int, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(decoder=object())
        self.answer, self.vocab_size = answer, vocab_size

    def forward(self, tgt, tgt_mask):
        logits = torch.zeros(*tgt.shape, self.vocab_size)
        logits[..., self.answer] = 1.0
        return SimpleNamespace(logits=logits)


def with_rows(task, rows: list[tuple[list[int], list[int], int]]):
    data = datasets.Dataset.from_dict({k: list(v) for k, v in zip(("ids", "answers", "length"), zip(*rows))})
    task.dataset = lambda split: data
    return task


def test_test_accuracy_is_the_mean_over_lengths_each_weighted_equally():
    task = make("parity-check")
    even, odd = task.answer_ids
    b, x = BLANK, FIRST  # a blank, an input symbol
    with_rows(
        task,
        [
            ([x, x, b], [PAD, PAD, even], 2),  # length 2: 1 of 1 right
            ([x, x, x, b], [PAD, PAD, PAD, even], 3),  # length 3: 1 of 3 right
            ([x, x, x, b], [PAD, PAD, PAD, odd], 3),
            ([x, x, x, b], [PAD, PAD, PAD, odd], 3),
        ],
    )
    scores = task.evaluate(Constant(even, task.vocab_size), "test")
    assert scores["accuracy"] == pytest.approx((1 / 1 + 1 / 3) / 2), "not the pooled 2 / 4"
    assert scores["sequence_accuracy"] == pytest.approx(2 / 4)


def test_answers_after_the_terminator_are_trained_on_but_not_scored():
    task = make("binary-addition")
    zero, one, end = task.answer_ids
    x = FIRST
    with_rows(
        task,
        [
            ([x, x, x, BLANK, BLANK, BLANK, BLANK], [PAD, PAD, PAD, one, end, zero, zero], 3),  # 0 of 2 scored
            ([x, x, x, BLANK, BLANK, BLANK, BLANK], [PAD, PAD, PAD, zero, end, zero, zero], 3),  # 1 of 2
            ([x, BLANK, BLANK], [PAD, zero, end], 1),  # 1 of 2
        ],
    )
    scores = task.evaluate(Constant(zero, task.vocab_size), "test")
    assert scores["accuracy"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert scores["sequence_accuracy"] == 0.0
    batch = task.collate([task.dataset("test")[0]])
    assert (batch["targets"] != PAD).sum() == 4, "the loss reads the zeros after the terminator"


def test_evaluation_batches_keep_to_the_token_budget():
    task = make("duplicate-string")
    lengths = [500] * 50 + [1] * 3
    runs = list(task.batches(lengths, batch_size=128))
    assert runs[0] == (0, chomsky.EVAL_TOKENS // 1500) and runs[-1][1] == len(lengths)
    assert all(stop > start for start, stop in runs) and [s for s, _ in runs[1:]] == [e for _, e in runs[:-1]]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"test_lengths": (30, 500)}, "start it above 40, such as (41, 500)"),
        ({"train_lengths": (0, 40)}, "1 <= lowest <= highest <= 16777216, such as (1, 40)"),
        ({"test_lengths": (500, 41)}, "1 <= lowest <= highest <= 16777216, such as (41, 500)"),
        ({"test_lengths": (41, 43), "buckets": 4}, "score 3 length(s); use buckets <= 3"),
        ({"test_stride": 0}, "greater than or equal to 1"),
        ({"sizes": 3}, "unknown key 'sizes'"),
    ],
)
def test_bad_options_say_what_would_do(options, says):
    with pytest.raises(ValidationError) as error:
        chomsky.ReverseStringOptions(**options)
    assert says in str(error.value)


def test_typed_input_and_labels():
    task = make("stack-manipulation")
    row = task.parse_input("1 0 pop push1")
    assert row["ids"] == [FIRST + 1, FIRST, FIRST + 2, FIRST + 4] + [BLANK] * 5 and set(row["answers"]) == {PAD}
    assert make("reverse-string").parse_input("011")["ids"] == [FIRST, FIRST + 1, FIRST + 1, BLANK, BLANK, BLANK]
    with pytest.raises(ValueError, match="use the symbols 0, 1, pop, push0, push1"):
        task.parse_input("1 2")
    assert task.token_strings([PAD, BLANK, FIRST + 2, task.answer_ids[2]]) == ["<pad>", "_", "pop", "end"]


def build(name: str, task):
    config = tz.load_config(name)
    assert task.unfit_reason(config) is None
    return tz.build_model(tz.load_config(config, task.model_overrides(config)))


@pytest.mark.parametrize("name", ["transformer-tiny", "bert-tiny"])
def test_a_real_model_trains_and_is_scored(name):
    torch.manual_seed(0)
    task = make("binary-addition", train_size=40, test_lengths=(41, 44), test_size_per_length=2, buckets=2)
    model = build(name, task)
    assert task.reads(model) == ("tgt" if name == "transformer-tiny" else "src")
    batch = task.collate([task.dataset("train")[i] for i in range(8)])
    loss = task.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    for split in task.splits[1:]:
        scores = task.evaluate(model, split, batch_size=3)
        assert set(scores) == {"accuracy", "sequence_accuracy"} and 0 <= scores["accuracy"] <= 1


def test_learned_positions_too_short_for_the_test_lengths_are_refused():
    reason = chomsky.DuplicateStringOptions().build().unfit_reason(tz.load_config("bert-tiny"))
    assert "1500 tokens" in reason and "max_len >= 1500" in reason
