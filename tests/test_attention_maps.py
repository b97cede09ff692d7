"""tzoo attention: one PNG per stack and layer, from typed input or a dataset example."""

from __future__ import annotations

import json

import matplotlib.image
import pytest

from transformer_zoo.cli import main
from transformer_zoo.train import load_train_config, train

MODEL = {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A seq2seq run (reverse) and a classification run (listops), a few steps each."""
    root = tmp_path_factory.mktemp("runs")
    tasks = {
        "reverse": {"kind": "reverse", "train_size": 100, "test_size": 10},
        "listops": {"kind": "listops", "train_size": 100, "test_size": 10, "max_length": 32},
    }
    for name, task in tasks.items():
        train(load_train_config({"model": MODEL, "task": task, "steps": 3, "batch_size": 4}), root / name,
              progress=False)
    return root


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_seq2seq_run_draws_encoder_and_decoder_layers(runs, capsys, tmp_path):
    paths = run_json(capsys, "attention", str(runs / "reverse"), "--input", "3 1 4 1 5", "--out", str(tmp_path))
    layers = load_train_config(runs / "reverse" / "train.json")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["encoder-layer1.png", "encoder-layer2.png",
                                                   "decoder-layer1.png", "decoder-layer2.png"], layers
    decoder = matplotlib.image.imread(paths[-1])
    encoder = matplotlib.image.imread(paths[0])
    assert decoder.shape[0] > encoder.shape[0], "decoder grids have a second row: cross-attention"
    assert decoder.shape[1] == encoder.shape[1], "one column per head in both"


def test_a_dataset_example_and_the_default_folder(runs, capsys):
    paths = run_json(capsys, "attention", str(runs / "listops"), "--example", "test:2")
    assert paths == [str(runs / "listops" / "attention" / f"encoder-layer{i}.png") for i in (1, 2)]
    paths = run_json(capsys, "attention", str(runs / "listops"), "--input", "[MAX 2 9 [MIN 4 7 ] 0 ]")
    assert len(paths) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "3 1 x"], "'x' is not a symbol of task 'reverse'; use symbols 0-9"),
        (["--example", "test:99"], "split 'test' has 10 examples (0 to 9)"),
        (["--example", "dev:0"], "task 'reverse' has no split 'dev'; splits: train, test, test_long"),
        (["--example", "test"], "expected SPLIT:INDEX such as test:0"),
        ([], "give exactly one of --input TEXT and --example SPLIT:INDEX"),
    ],
)
def test_bad_input_is_one_clear_message(runs, capsys, args, message):
    assert main(["attention", str(runs / "reverse"), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["attention", str(tmp_path), "--input", "1"]) == 2
    assert "not a finished run folder" in capsys.readouterr().err
