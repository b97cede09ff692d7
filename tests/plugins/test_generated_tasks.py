"""The algorithmic tasks: seeded data, the rule each one follows, and the length splits."""

from __future__ import annotations

import re

import pytest

import transformer_zoo as tz
from transformer_zoo.core.embedding import BOS, EOS, PAD
from transformer_zoo.plugins.tasks.algorithmic import FIRST_SYMBOL
from transformer_zoo.registry import get_registry


def make(kind: str, **options):
    return (
        get_registry()
        .component("task", kind)
        .model_validate({"kind": kind, "train_size": 200, "test_size": 50, **options})
        .build()
    )


@pytest.mark.parametrize("kind", ["copy", "reverse", "sort", "addition"])
def test_data_is_seeded_and_in_range(kind):
    first, again, other = make(kind), make(kind), make(kind, seed=1)
    assert first.dataset("train")[:] == again.dataset("train")[:]
    assert first.dataset("train")[:] != other.dataset("train")[:]
    for split in first.splits:
        for row in first.dataset(split):
            assert all(FIRST_SYMBOL <= t < first.vocab_size for t in row["src"] + row["tgt"])


def test_each_rule():
    for row in make("reverse").dataset("test"):
        assert row["tgt"] == row["src"][::-1]
    for row in make("copy").dataset("test"):
        assert row["tgt"] == row["src"]
    for row in make("sort").dataset("test"):
        assert row["tgt"] == sorted(row["src"])
    task = make("addition")
    for row in task.dataset("test"):
        plus = row["src"].index(FIRST_SYMBOL + 10)
        number = lambda digits: int("".join(str(d - FIRST_SYMBOL) for d in digits))  # noqa: E731
        assert number(row["tgt"]) == number(row["src"][:plus]) + number(row["src"][plus + 1 :])


def test_long_split_is_longer_than_training():
    task = make("reverse", train_lengths=(1, 8), test_lengths=(12, 14))
    assert max(len(r) for r in task.dataset("train")["src"]) <= 8
    assert {len(r) for r in task.dataset("test_long")["src"]} <= {12, 13, 14}


def test_collate_pads_and_shifts():
    task = make("reverse")
    batch = task.collate([{"src": [3, 4, 5], "tgt": [5, 4, 3]}, {"src": [6], "tgt": [6]}])
    assert batch["src"].tolist() == [[3, 4, 5], [6, PAD, PAD]]
    assert batch["src_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["tgt"].tolist() == [[BOS, 5, 4, 3], [BOS, 6, PAD, PAD]]
    assert batch["targets"].tolist() == [[5, 4, 3, EOS], [6, EOS, PAD, PAD]]


def test_bad_task_options_are_named():
    with pytest.raises(tz.ConfigError, match="train_lengths=\\(5, 2\\)"):
        from transformer_zoo.training.config import load_train_config

        load_train_config({"model": "transformer-tiny", "task": {"kind": "reverse", "train_lengths": [5, 2]}})
    with pytest.raises(ValueError, match="no split 'valid'"):
        make("copy").dataset("valid")


def test_listops_labels_are_the_values_of_the_expressions():
    from transformer_zoo.plugins.tasks.listops import FIRST_TOKEN, TOKENS

    task = make("listops", max_depth=3, max_length=40)
    assert task.vocab_size == FIRST_TOKEN + len(TOKENS)

    def evaluate(tokens: list[str]) -> int:
        stack: list[list] = []
        for token in tokens:
            if token.startswith("["):
                stack.append([token[1:]])
            elif token == "]":
                op, *args = stack.pop()
                value = {
                    "MAX": max,
                    "MIN": min,
                    "MED": lambda a: (
                        sorted(a)[(len(a) - 1) // 2]
                        if len(a) % 2
                        else int((sorted(a)[len(a) // 2 - 1] + sorted(a)[len(a) // 2]) / 2)
                    ),
                    "SM": lambda a: sum(a) % 10,
                }[op](args)
                if not stack:
                    return value
                stack[-1].append(value)
            else:
                stack[-1].append(int(token))
        raise AssertionError("unbalanced expression")

    rows = task.dataset("test")
    assert len(rows) == 50
    for row in rows:
        tokens = [TOKENS[t - FIRST_TOKEN] for t in row["src"]]
        assert 16 <= len(tokens) <= 40
        assert tokens[0].startswith("[") and tokens[-1] == "]"
        assert evaluate(tokens) == row["label"]
    assert len(set(task.dataset("train")["label"])) == 10


def test_listops_refuses_impossible_lengths():
    with pytest.raises(tz.ConfigError, match="min_length=50 is larger than max_length=20"):
        from transformer_zoo.training.config import load_train_config

        load_train_config(
            {"model": "transformer-tiny", "task": {"kind": "listops", "min_length": 50, "max_length": 20}}
        )
    with pytest.raises(ValueError, match="could not generate expressions"):
        make("listops", max_depth=1, max_args=2, min_length=30, max_length=40).dataset("test")


def test_classification_collate_and_model_fit():
    from transformer_zoo.core.embedding import CLS
    from transformer_zoo.training.config import load_train_config, model_config_for

    task = make("listops")
    batch = task.collate([{"src": [5, 6, 7], "label": 3}, {"src": [8], "label": 9}])
    assert batch["src"].tolist() == [[CLS, 5, 6, 7], [CLS, 8, 0, 0]]
    assert batch["targets"].tolist() == [3, 9]
    config = load_train_config({"model": "transformer-tiny", "task": "listops"})
    model_config = model_config_for(config, task)
    assert model_config.decoder is None and model_config.head.num_classes == 10
    decoder_only = load_train_config({"model": {"variant": "transformer-tiny", "encoder": None}, "task": "listops"})
    with pytest.raises(ValueError, match="needs a model with an encoder"):
        model_config_for(decoder_only, task)


def test_typed_input_in_each_notation():
    reverse, addition = make("reverse"), make("addition")
    assert reverse.parse_input("3 1 4") == reverse.parse_input("314") == {"src": [FIRST_SYMBOL + d for d in (3, 1, 4)]}
    plus = FIRST_SYMBOL + 10
    expected = {"src": [FIRST_SYMBOL + 1, FIRST_SYMBOL + 2, plus, FIRST_SYMBOL + 3, FIRST_SYMBOL + 4]}
    assert addition.parse_input("12+34") == addition.parse_input("1 2 + 3 4") == expected
    assert addition.token_strings(expected["src"]) == ["1", "2", "+", "3", "4"]
    for bad, message in [
        ("1++2", "joined by one '+'"),
        ("+12", "joined by one '+'"),
        ("1 2", "joined by one '+'"),
        ("1a+2", "'a' is not a symbol of task 'addition'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            addition.parse_input(bad)
    with pytest.raises(ValueError, match="'\\+' is not a symbol of task 'reverse'; use symbols 0-9"):
        reverse.parse_input("1+2")
    listops = make("listops")
    row = listops.parse_input("[MAX 2 9 [MIN 4 7 ] 0 ]")
    assert listops.token_strings(row["src"]) == "[MAX 2 9 [MIN 4 7 ] 0 ]".split()
    with pytest.raises(ValueError, match="'\\[MUL' is not a ListOps token"):
        listops.parse_input("[MUL 2 3 ]")
