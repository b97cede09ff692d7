"""The run cache: a comparison trains only the cells it has no finished run for."""

from __future__ import annotations

import json

import pytest

from transformer_zoo.cli import main
from transformer_zoo.comparing.cache import run_key
from transformer_zoo.comparing.runner import compare
from transformer_zoo.comparing.runs import RECORD
from transformer_zoo.comparing.spec import load_spec, plan
from transformer_zoo.training.trainer import model_config_for

LISTOPS = {"kind": "listops", "train_size": 200, "test_size": 10, "max_length": 32}
ONE = {
    "name": "cache",
    "variants": ["transformer-tiny"],
    "tasks": [LISTOPS],
    "steps": 3,
    "seeds": [0, 1],
    "threads": 1,
    "train": {"batch_size": 4},
}
NARROW = {"variant": "transformer-tiny", "label": "narrow", "d_ff": 16}


def _keys(spec: dict) -> dict[tuple[str, int], str]:
    runs, _ = plan(load_spec(spec))
    task = load_spec(spec).tasks[0].build()
    return {
        (label, config.seed): run_key(config, model_config_for(config, task), load_spec(spec).probes)
        for label, config in runs
    }


def test_a_runs_key_holds_what_decides_its_result_and_nothing_else():
    base = _keys(ONE)
    assert base[("transformer-tiny", 0)] != base[("transformer-tiny", 1)], "the seed"
    assert _keys({**ONE, "train": {"batch_size": 4, "checkpoint_every": 1}}) == base, "checkpoints change nothing"
    assert list(_keys({**ONE, "variants": [{"variant": "transformer-tiny", "label": "other name"}]}).values()) == list(
        base.values()
    ), "a label is not content"
    assert not set(_keys({**ONE, "train": {"batch_size": 4, "lr": 3e-4}}).values()) & set(base.values())
    assert not set(_keys({**ONE, "model": {"d_ff": 16}}).values()) & set(base.values())
    assert not set(_keys({**ONE, "steps": 4}).values()) & set(base.values())
    assert not set(_keys({**ONE, "tasks": [{**LISTOPS, "train_size": 201}]}).values()) & set(base.values())
    assert not set(_keys({**ONE, "probes": ["attention"]}).values()) & set(base.values()), "the record holds probes"
    assert _keys({**ONE, "train": {"batch_size": 4, "peak_tflops": 100.0}}) == base


def test_a_runs_key_follows_its_local_data_files(tmp_path):
    from transformer_zoo.registry import get_registry

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("a b c\n" * 50)
    runs, _ = plan(load_spec(ONE))
    config = runs[0][1]
    model = model_config_for(config, load_spec(ONE).tasks[0].build())
    text = (
        get_registry()
        .component("task", "language-modeling")
        .model_validate({"kind": "language-modeling", "files": str(data)})
    )
    on_text = config.model_copy(update={"task": text})
    before = run_key(on_text, model)
    assert run_key(on_text, model) == before
    (data / "train.txt").write_text("a b c d\n" * 50)
    assert run_key(on_text, model) != before, "the same config over other data is another run"


def test_adding_a_variant_trains_only_its_runs_and_a_new_lr_only_the_runs_it_changes(tmp_path, capsys):
    first = compare(load_spec(ONE), tmp_path)
    assert not any(r.reused for r in first.runs)
    capsys.readouterr()
    second = compare(load_spec({**ONE, "variants": ["transformer-tiny", NARROW]}), tmp_path)
    err = capsys.readouterr().err
    assert "2 of 4 runs are finished in the run cache" in err and "training the other 2" in err
    reused = {(r.variant, r.seed): r.reused for r in second.runs}
    assert reused == {
        ("transformer-tiny", 0): True,
        ("transformer-tiny", 1): True,
        ("narrow", 0): False,
        ("narrow", 1): False,
    }
    kept = {(r.variant, r.seed): r for r in second.runs if r.reused}
    for run in first.runs:  # the very runs, measurements and all, with when they were made
        assert kept[(run.variant, run.seed)].metrics == run.metrics
        assert kept[(run.variant, run.seed)].started == run.started
    assert "kept from an earlier invocation" in (tmp_path / "report.md").read_text()
    third = compare(
        load_spec({**ONE, "variants": ["transformer-tiny", NARROW], "variant_train": {"narrow": {"lr": 3e-4}}}),
        tmp_path,
    )
    assert {(r.variant, r.seed): r.reused for r in third.runs} == reused  # only narrow's runs changed
    assert len(list((tmp_path / "runs").iterdir())) == 6


def test_rerun_trains_everything_again(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**ONE, "seeds": [0]}))
    out = tmp_path / "out"
    assert main(["compare", str(spec), "--out", str(out), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["runs"][0]
    assert main(["compare", str(spec), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["reused"]
    assert main(["compare", str(spec), "--out", str(out), "--json", "--rerun"]) == 0
    again = json.loads(capsys.readouterr().out)["runs"][0]
    assert not again["reused"] and again["invocation"] != before["invocation"]
    assert again["resumed_from"] is None and again["metrics"] == before["metrics"]  # from scratch, and exact


def test_two_comparisons_begun_in_the_same_second_are_two_invocations(tmp_path, monkeypatch):
    """The second reads the first's run from the cache, and says so, with the clock stopped."""
    from datetime import datetime, timezone

    from transformer_zoo.comparing import runner

    class Stopped(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)

    monkeypatch.setattr(runner, "datetime", Stopped)
    spec = load_spec({**ONE, "seeds": [0]})
    first = compare(spec, tmp_path)
    second = compare(spec, tmp_path)
    assert first.started == second.started == "2024-01-01T12:00:00+00:00"
    assert first.invocation != second.invocation
    assert [r.reused for r in first.runs] == [False]
    assert [r.reused for r in second.runs] == [True], "a run read from the cache is kept, not the second's own"
    assert second.runs[0].invocation == first.invocation
    assert "invocation " + second.invocation in (tmp_path / "report.md").read_text()


def test_specs_share_a_cache_folder(tmp_path, capsys):
    cache = tmp_path / "cache"
    compare(load_spec({**ONE, "cache": str(cache)}), tmp_path / "a")
    other = compare(
        load_spec({**ONE, "name": "other", "cache": str(cache), "variants": [NARROW, "transformer-tiny"]}),
        tmp_path / "b",
    )
    assert {r.variant: r.reused for r in other.runs} == {"narrow": False, "transformer-tiny": True}
    assert not (tmp_path / "a" / "runs").exists() and len(list(cache.iterdir())) == 4
    assert all(r.run_folder.startswith(str(cache)) for r in other.runs)


def test_a_run_that_fails_is_reported_and_the_others_are_summarized(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                **ONE,
                "variants": ["transformer-tiny", NARROW],
                "steps": 6,
                "variant_train": {"narrow": {"lr": 1e6, "grad_clip": None, "warmup_steps": 0}},
            }
        )
    )
    out = tmp_path / "out"
    assert main(["compare", str(spec), "--out", str(out), "--json"]) == 1
    printed = capsys.readouterr()
    results = json.loads(printed.out)
    assert {r["variant"] for r in results["runs"]} == {"transformer-tiny"}
    assert [(f["variant"], f["seed"]) for f in results["failed"]] == [("narrow", 0), ("narrow", 1)]
    assert all("TrainingDiverged" in f["error"] for f in results["failed"])
    assert "2 run(s) failed" in printed.err
    report = (out / "report.md").read_text()
    assert "## Failed runs" in report and "TrainingDiverged" in report


@pytest.mark.parametrize("executor", ["local"])
def test_a_comparison_with_no_finished_run_says_why(executor, tmp_path):
    from transformer_zoo.comparing.runner import ComparisonFailed

    spec = load_spec(
        {
            **ONE,
            "seeds": [0],
            "executor": executor,
            "train": {"batch_size": 4, "lr": 1e6, "grad_clip": None, "warmup_steps": 0},
        }
    )
    with pytest.raises(ComparisonFailed, match=r"no run of the comparison finished:\n  transformer-tiny on listops"):
        compare(spec, tmp_path)


def test_a_cached_record_this_version_cannot_read_is_trained_again(tmp_path, capsys):
    spec = load_spec({**ONE, "seeds": [0]})
    first = compare(spec, tmp_path)
    (path,) = (tmp_path / "runs").glob(f"*/{RECORD}")
    record = json.loads(path.read_text())
    del record["better"]  # as a record written before records carried every metric's direction
    path.write_text(json.dumps(record))
    again = compare(spec, tmp_path)
    assert [r.reused for r in again.runs] == [False] and again.runs[0].metrics == first.runs[0].metrics
    assert "better" in json.loads(path.read_text()), "the record is written again, whole"


def test_a_run_folder_whose_files_do_not_read_as_json_is_a_run_to_train(tmp_path):
    from transformer_zoo.comparing.runs import ATTEMPTS, finished_record, started_where

    (tmp_path / RECORD).write_text('{"variant": ')
    assert finished_record(tmp_path) is None, "a torn record is trained again"
    (tmp_path / ATTEMPTS).write_text("{")
    assert started_where(tmp_path, "x") == (0, ""), "a file being replaced as it is read: no start seen yet"
