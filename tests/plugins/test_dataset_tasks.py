"""The tasks over Hugging Face ``datasets`` (text-classification, seq2seq, language-modeling),
on small CSV, JSONL, parquet and saved datasets that the tests write; nothing downloads.

The classification data is separable: the label says whether the keyword "cat" is in the text.
The seq2seq data is a sentence and its words reversed.
"""

from __future__ import annotations

import csv
import json
import math
import random

import datasets
import pytest
import tokenizers

import transformer_zoo as tz
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import evaluate_run, load_run, train

WORDS = "the a dog bird sat ran flew on under over mat log tree red big small".split()
COLUMNS = {  # each kind's column options, named unlike the defaults so that the mapping is exercised
    "text-classification": {"text": "sentence", "label": "topic"},
    "seq2seq": {"source": "question", "target": "answer"},
    "language-modeling": {"text": "sentence"},
}


def rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Sentences with a string label (whether "cat" is in them: half are) and their reversal."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        if rng.random() < 0.5:
            words[rng.randrange(len(words))] = "cat"
        sentence = " ".join(words)
        out.append(
            {
                "sentence": sentence,
                "topic": "cat" if "cat" in words else "other",
                "question": sentence,
                "answer": " ".join(reversed(words)),
            }
        )
    return out


def write_csv(path, data):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(data[0]) if data else ["sentence", "topic"])
        writer.writeheader()
        writer.writerows(data)
    return path


def write_jsonl(path, data):
    path.write_text("".join(json.dumps(row) + "\n" for row in data))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    examples = rows(400)
    write_csv(root / "data.csv", examples)
    write_jsonl(root / "data.jsonl", examples)
    datasets.Dataset.from_list(examples).to_parquet(str(root / "data.parquet"))
    return root


def make(kind: str, **options):
    return get_registry().component("task", kind).model_validate({"kind": kind, **options}).build()


def task_on(kind, path, **options):
    return make(kind, path=str(path), vocab_size=300, max_test_examples=1000, **COLUMNS[kind], **options)


@pytest.mark.parametrize("kind", list(COLUMNS))
def test_each_kind_reads_csv_jsonl_and_parquet_alike_with_a_seeded_split(data, kind):
    """The same rows in three formats give the same examples; the held-out split is the same for
    the same seed, another for another seed."""
    csv_task, jsonl_task, parquet_task = (
        task_on(kind, data / f"data.{suffix}") for suffix in ("csv", "jsonl", "parquet")
    )
    assert (csv_task.pad_id, csv_task.bos_id, csv_task.eos_id) == (0, 1, 2)
    for split in ("train", "test"):
        assert csv_task.dataset(split)[:] == jsonl_task.dataset(split)[:] == parquet_task.dataset(split)[:]
    assert len(csv_task.raw["test"]) == math.ceil(0.1 * 400) and len(csv_task.raw["train"]) == 360
    assert task_on(kind, data / "data.csv").dataset("test")[:] == csv_task.dataset("test")[:]
    other = task_on(kind, data / "data.csv", seed=1)
    assert other.raw["test"]["sentence"] != csv_task.raw["test"]["sentence"]


def test_classification_maps_string_labels_to_sorted_class_ids(data):
    task = task_on("text-classification", data / "data.csv", max_len=4)
    assert task.classes == ["cat", "other"] and task.num_classes == 2
    raw, encoded = task.raw["test"], task.dataset("test")
    assert encoded["label"] == [0 if topic == "cat" else 1 for topic in raw["topic"]]
    assert max(len(src) for src in encoded["src"]) == 4, "longer texts are cut to max_len tokens"
    assert task.collate([encoded[0]])["src"][0, 0] == task.cls_id == task.bos_id


def test_a_loaded_tokenizer_brings_its_own_special_ids(data, tmp_path):
    """A BERT-style vocabulary: the class token is [CLS] and padding is [PAD], wherever they are."""
    vocab = {token: i for i, token in enumerate(["[CLS]", "[SEP]", "[UNK]", "[PAD]", "cat", *WORDS])}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    task = task_on("text-classification", data / "data.csv", tokenizer=str(tmp_path / "tokenizer.json"))
    assert (task.cls_id, task.pad_id, task.model_overrides(tz.load_config("bert-tiny"))["pad_id"]) == (0, 3, 3)
    batch = task.collate([{"src": [4], "label": 0}, {"src": [4, 5, 6], "label": 1}])
    assert batch["src"].tolist() == [[0, 4, 3, 3], [0, 4, 5, 6]]


def test_seq2seq_drops_or_cuts_long_pairs_and_keeps_the_reference_text(data):
    dropped = task_on("seq2seq", data / "data.jsonl", max_len=5)
    kept = dropped.dataset("train")
    assert 0 < len(kept) < 360 and max(len(r) for r in [*kept["src"], *kept["tgt"]]) <= 5
    cut = task_on("seq2seq", data / "data.jsonl", max_len=5, too_long="truncate")
    assert len(cut.dataset("train")) == 360
    row = cut.dataset("test")[0]
    assert cut.tokenizer.decode(row["tgt"]) == row["target_text"]


def test_language_modeling_cuts_the_text_stream_into_windows(data):
    task = task_on("language-modeling", data / "data.csv", max_len=16)
    windows = task.dataset("train")["ids"]
    assert all(len(w) == 17 for w in windows[:-1]) and all(a[-1] == b[0] for a, b in zip(windows, windows[1:]))
    assert task.parse_input("the cat sat")["ids"][-1] == task.eos_id


def test_splits_are_read_from_a_saved_dataset_a_folder_and_a_mapping(data, tmp_path):
    examples = rows(60, seed=3)
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(examples[:50]), "test": datasets.Dataset.from_list(examples[50:])}
    ).save_to_disk(str(tmp_path / "saved"))
    saved = task_on("text-classification", tmp_path / "saved")
    assert saved.raw["test"]["sentence"] == [r["sentence"] for r in examples[50:]]
    assert len(saved.dataset("train")) == 50
    (tmp_path / "folder").mkdir()
    write_csv(tmp_path / "folder" / "train.csv", examples[:50])
    write_csv(tmp_path / "folder" / "test.csv", examples[50:])
    folder = task_on("text-classification", tmp_path / "folder")
    assert folder.raw["test"]["sentence"] == saved.raw["test"]["sentence"]
    mapping = make(
        "seq2seq",
        path={"train": str(tmp_path / "folder" / "train.csv"), "dev": str(tmp_path / "folder" / "test.csv")},
        test_split="dev",
        vocab_size=300,
        **COLUMNS["seq2seq"],
    )
    assert mapping.raw["test"]["answer"] == [r["answer"] for r in examples[50:]]


def test_mistakes_a_user_can_make_are_named_with_what_would_be_right(data, tmp_path):
    with pytest.raises(ConfigError, match="path='.*nowhere.csv' matched no file; give a file, a folder of .csv"):
        task_on("text-classification", tmp_path / "nowhere.csv")
    (tmp_path / "data.xlsx").write_text("not read")
    with pytest.raises(ConfigError, match="unknown format '.xlsx'; give .csv, .tsv, .json, .jsonl, .parquet, .txt"):
        task_on("text-classification", tmp_path / "data.xlsx")
    with pytest.raises(
        ConfigError,
        match="text='body': split 'train' .* has no such column; its columns are "
        "sentence, topic, question, answer \\(set text to one of them\\)",
    ):
        make("text-classification", path=str(data / "data.csv"), text="body", label="topic")
    write_csv(tmp_path / "one.csv", rows(1))
    with pytest.raises(ConfigError, match="holds 1 example\\(s\\): too few to hold out test_fraction=0.1"):
        task_on("language-modeling", tmp_path / "one.csv")
    with pytest.raises(ConfigError, match="test_split='dev': .* has no split 'dev'; its splits are train"):
        task_on("seq2seq", data / "data.csv", test_split="dev")
    (tmp_path / "empty").mkdir()
    write_csv(tmp_path / "empty" / "train.csv", rows(20))
    write_csv(tmp_path / "empty" / "test.csv", [])
    with pytest.raises(ConfigError, match="split 'test' .* has no examples; give a split with examples"):
        task_on("text-classification", tmp_path / "empty")
    (tmp_path / "unseen").mkdir()
    write_csv(tmp_path / "unseen" / "train.csv", rows(20))
    write_csv(tmp_path / "unseen" / "test.csv", [{**rows(1)[0], "topic": "fish"}])
    with pytest.raises(
        ConfigError,
        match="split 'test' has the label 'fish', which is not among the classes "
        "\\('cat', 'other'.*every label must appear in training",
    ):
        task_on("text-classification", tmp_path / "unseen")
    with pytest.raises(ConfigError, match="split 'train' has the label 'other', .*the labels option.*add it to labels"):
        task_on("text-classification", data / "data.csv", labels=["cat", "dog"])
    with pytest.raises(
        ConfigError, match="every pair of split 'train' has a side longer than max_len=1 .*too_long: truncate"
    ):
        task_on("seq2seq", data / "data.csv", max_len=1).dataset("train")
    with pytest.raises(ValueError, match="exactly one of path .* and dataset_name"):
        make("seq2seq")


def test_a_binary_file_is_refused_naming_the_file_and_why(tmp_path):
    (tmp_path / "train.txt").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="path: '.*train.txt' is not UTF-8 text \\(byte 0: a NUL byte\\)"):
        task_on("language-modeling", tmp_path / "train.txt")
    (tmp_path / "train.csv").write_bytes(b"sentence,topic\n\xff\xfe,cat\n")
    with pytest.raises(ConfigError, match="could not read path='.*train.csv': 'utf-8' codec can't decode byte 0xff"):
        task_on("text-classification", tmp_path / "train.csv")


def test_an_empty_path_is_refused_rather_than_read_as_the_working_directory():
    with pytest.raises(ValueError, match="'' is empty, which would read every file under the working directory"):
        make("language-modeling", path="")


def test_a_hub_dataset_is_read_by_name_and_offline_says_to_give_a_path(monkeypatch):
    """datasets.load_dataset stands in for the network: a DatasetDict with a validation split."""
    hub = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows(30)), "validation": datasets.Dataset.from_list(rows(10, seed=1))}
    )
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args: asked.append(args) or hub)
    task = make("language-modeling", dataset_name="some/corpus", dataset_config="en", text="sentence", vocab_size=300)
    assert asked[0] == ("some/corpus", "en") and task.raw["test"]["sentence"] == hub["validation"]["sentence"]

    def offline(*args):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        ConfigError, match="could not load the Hugging Face dataset 'imdb' .* give a local file or folder as path"
    ):
        make("text-classification", dataset_name="imdb")


def test_classification_learns_and_a_run_keeps_its_classes(tmp_path):
    """200 steps of transformer-tiny on whether "cat" is in the text: test accuracy at least 0.9,
    with the majority class at 0.6 or less; the run folder keeps the classes and the tokenizer,
    and evaluating it again gives the same score."""
    write_csv(tmp_path / "cats.csv", rows(1000, seed=5))
    options = {
        "kind": "text-classification",
        "path": str(tmp_path / "cats.csv"),
        "vocab_size": 300,
        "max_test_examples": 200,
        **COLUMNS["text-classification"],
    }
    config = load_train_config(
        {
            "model": {"variant": "transformer-tiny", "dropout": 0.0},
            "task": options,
            "steps": 200,
            "batch_size": 32,
            "lr": 3e-3,
            "warmup_steps": 30,
        }
    )
    summary = train(config, tmp_path / "run", progress=False)
    majority = make(**options).majority_accuracy("test")
    print("text-classification:", summary["metrics"]["test"], "majority", majority)
    assert majority <= 0.6 and summary["metrics"]["test"]["accuracy"] >= 0.9
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["cat", "other"]
    _, task, _ = load_run(tmp_path / "run")
    assert task.options.labels == ["cat", "other"] and task.options.tokenizer == str(tmp_path / "run" / "tokenizer")
    assert evaluate_run(tmp_path / "run")["test"] == summary["metrics"]["test"]


def test_a_model_unfit_for_a_kind_is_refused(data, tmp_path):
    options = {"path": str(data / "data.csv"), "vocab_size": 300, **COLUMNS["seq2seq"]}
    config = load_train_config(
        {"model": {"variant": "transformer-tiny", "decoder": None}, "steps": 1, "task": {"kind": "seq2seq", **options}}
    )
    with pytest.raises(ValueError, match="needs an encoder-decoder model"):
        train(config, tmp_path, progress=False)


def test_compare_runs_both_kinds_over_two_seeds(tmp_path):
    from transformer_zoo.comparing.runner import compare
    from transformer_zoo.comparing.spec import load_spec

    write_csv(tmp_path / "cats.csv", rows(300, seed=7))
    write_jsonl(tmp_path / "pairs.jsonl", rows(300, seed=8))
    tasks = [
        {
            "kind": "text-classification",
            "path": str(tmp_path / "cats.csv"),
            "vocab_size": 300,
            "max_test_examples": 30,
            **COLUMNS["text-classification"],
        },
        {
            "kind": "seq2seq",
            "path": str(tmp_path / "pairs.jsonl"),
            "vocab_size": 300,
            "max_len": 12,
            "max_test_examples": 30,
            **COLUMNS["seq2seq"],
        },
    ]
    results = compare(
        load_spec(
            {
                "name": "own-data",
                "variants": ["transformer-tiny"],
                "tasks": tasks,
                "steps": 30,
                "seeds": [0, 1],
                "train": {"batch_size": 16},
            }
        ),
        tmp_path / "report",
    )
    assert sorted((r.task, r.seed) for r in results.runs) == [
        ("seq2seq", 0),
        ("seq2seq", 1),
        ("text-classification", 0),
        ("text-classification", 1),
    ]
    for run in results.runs:
        assert run.steps == 30 and run.metric in run.metrics["test"]
    seq2seq = next(r for r in results.runs if r.task == "seq2seq")
    assert {"token_accuracy", "sequence_accuracy", "bleu"} <= set(seq2seq.metrics["test"])
    assert "text-classification" in results.baselines and (tmp_path / "report" / "report.md").is_file()
