"""The python-source corpus: the standard library's bytes, split by file, the same for a Python
version and a seed, scored at the training length and at longer ones over the same text."""

from __future__ import annotations

import json
import platform
import re

import pytest

from transformer_zoo.core.embedding import EOS
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.registry import get_registry
from transformer_zoo.training import load_train_config
from transformer_zoo.training.config import model_config_for

SMALL = {"kind": "python-source", "max_len": 32, "longer": [2, 4], "train_tokens": 20_000, "test_tokens": 2048}


def build(**changes):
    return get_registry().component("task", "python-source").model_validate({**SMALL, **changes}).build()


def stream(task, split: str) -> list[int]:
    """A split's windows joined back into one stream (they overlap by one token)."""
    windows = task.dataset(split)["ids"]
    return windows[0] + [t for w in windows[1:] for t in w[1:]]


def test_the_corpus_is_the_same_for_a_python_version_and_a_seed():
    a, b, other = build(), build(), build(seed=1)
    for split in a.splits:
        assert a.dataset(split)["ids"] == b.dataset(split)["ids"], split
    assert a.corpus == b.corpus and a.corpus["python"] == platform.python_version()
    assert re.fullmatch(r"[0-9a-f]{64}", a.corpus["sha256"]) and other.corpus["sha256"] == a.corpus["sha256"]
    assert stream(other, "test") != stream(a, "test"), "another seed is another split of the files"


def test_each_file_is_in_one_split_and_the_bytes_are_the_files():
    task = build()
    files = {split: set(paths) for split, paths in task._files.items()}
    assert not (
        files["train"] & files["test"] or files["train"] & files["validation"] or files["validation"] & files["test"]
    )
    assert task.corpus["files"] == {split: len(paths) for split, paths in files.items()}
    assert all(len(paths) > 20 for paths in files.values())
    first = task._files["train"][0].read_bytes()
    assert bytes(t - 3 for t in stream(task, "train")[: len(first)]) == first, "tokens are the file's bytes"
    assert stream(task, "train")[len(first)] == EOS, "each file ends with EOS"


def test_longer_test_lengths_score_the_same_text_as_the_training_length():
    task = build()
    assert task.splits == ("train", "validation", "test", "test_2x", "test_4x")
    assert {len(w) for w in task.dataset("train")["ids"][:-1]} == {33}  # max_len tokens read, each next one predicted
    for split, length in (("test", 32), ("test_2x", 64), ("test_4x", 128)):
        assert {len(w) for w in task.dataset(split)["ids"]} == {length + 1}
        assert stream(task, split) == stream(task, "test"), split


def test_the_run_folder_names_its_data(tmp_path):
    task = build()
    task.save_assets(tmp_path)
    assert json.loads((tmp_path / "corpus.json").read_text()) == task.corpus


def test_learned_positions_shorter_than_the_test_lengths_are_refused_in_one_message():
    task = build()
    learned = {"variant": "transformer-tiny", "positional": "learned", "max_len": 32}
    with pytest.raises(
        ValueError, match=r"learned positions cannot read the test lengths up to 128 tokens with max_len=32"
    ):
        model_config_for(load_train_config({"model": learned, "task": SMALL}), task)
    for kind in ("sinusoidal", "rotary", "alibi", "t5-bias"):
        config = model_config_for(load_train_config({"model": {**learned, "positional": kind}, "task": SMALL}), task)
        assert config.decoder is not None and config.encoder is None and config.vocab_size == 259


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"longer": [1]}, "longer: 1 is not a multiple of max_len above 1"),
        ({"longer": [128]}, "longer: 128 x max_len=32 is longer than test_tokens=2048"),
    ],
)
def test_bad_lengths_are_refused(changes, message):
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        build(**changes)
