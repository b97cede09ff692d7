"""Suites: a suite's tasks join a spec, its aggregate is a task of the report, its plots are drawn."""

from __future__ import annotations

import json

import pytest

from transformer_zoo.cli import main
from transformer_zoo.comparing.plots import width_stem, widths_figure
from transformer_zoo.comparing.records import RunRecord
from transformer_zoo.comparing.runner import compare
from transformer_zoo.comparing.spec import load_spec
from transformer_zoo.comparing.suites import Suite, available_suites, load_suite, suite_records, with_suite_tasks
from transformer_zoo.core.errors import ConfigError, UnknownNameError

SMALL_MQAR = {"kind": "mqar", "vocab_size": 16, "length": 16, "pairs": 2, "train_size": 64, "test_size": 16}


def record(variant: str, task: str, seed: int, score: float, width: int = 64) -> RunRecord:
    return RunRecord(
        variant=variant,
        family="transformer",
        task=task,
        seed=seed,
        parameters=10,
        flops_per_token=1.0,
        train_tokens_per_second=1.0,
        peak_memory_mb=1.0,
        steps=5,
        wall_seconds=2.0,
        metric="accuracy",
        metrics={"test": {"accuracy": score}},
        better={"accuracy": "higher"},
        bounds={"accuracy": (0.0, 1.0)},
        curve=[],
        width=width,
    )


def test_every_built_in_suite_loads_and_its_tasks_validate():
    assert {"mqar", "mad", "chomsky-hierarchy"} <= set(available_suites())
    for name in available_suites():
        suite = load_suite(name)
        spec = load_spec({"name": name, "variants": ["transformer-tiny"], "suite": name})
        assert [t.kind for t in spec.tasks] == [t["kind"] for t in suite.tasks]


def test_an_unknown_suite_names_the_built_in_ones():
    with pytest.raises(UnknownNameError, match="mqar"):
        load_suite("mqr")


def test_a_specs_task_replaces_the_suites_task_of_its_kind_and_applying_twice_changes_nothing():
    suite = Suite(name="s", title="t", source="x", tasks=[{"kind": "mqar"}, {"kind": "near-pair"}])
    spec_tasks = [{"kind": "near-pair", "length": 6}, {"kind": "copy"}]
    once = with_suite_tasks(spec_tasks, suite)
    assert once == [{"kind": "mqar"}, {"kind": "near-pair", "length": 6}, {"kind": "copy"}]
    assert with_suite_tasks(once, suite) == once
    spec = load_spec({"name": "s", "variants": ["transformer-tiny"], "suite": "mqar", "tasks": [SMALL_MQAR]})
    assert [t.model_dump() for t in spec.tasks] == [t.model_dump() for t in load_spec(spec.model_dump()).tasks]
    assert spec.tasks[0].pairs == 2


def test_the_aggregate_is_the_per_seed_mean_over_the_suites_tasks():
    suite = Suite(name="pairs", title="t", source="x", tasks=[{"kind": "near-pair"}, {"kind": "far-pair"}])
    runs = [
        record("a", "near-pair", 0, 0.9),
        record("a", "far-pair", 0, 0.5),
        record("a", "near-pair", 1, 0.8),
        record("a", "far-pair", 1, 0.4),
        record("b", "near-pair", 0, 0.3),  # b's seed 0 lacks far-pair: no aggregate for it
    ]
    found = suite_records(suite, runs)
    assert [(r.variant, r.seed, r.task) for r in found] == [("a", 0, "pairs"), ("a", 1, "pairs")]
    assert [r.metrics["test"]["accuracy"] for r in found] == pytest.approx([0.7, 0.6])
    assert found[0].aggregate_of == ["near-pair", "far-pair"] and found[0].wall_seconds == 4.0
    assert suite_records(suite.model_copy(update={"aggregate": False}), runs) == []


def test_a_plot_against_width_joins_the_labels_of_one_stem():
    assert width_stem("linear-d128", 128) == "linear" and width_stem("softmax_d32", 32) == "softmax"
    assert width_stem("softmax-1layer-d32", 32) == "softmax-1layer" and width_stem("d128", 64) == "d128"
    runs = [
        record(f"{kind}-d{w}", "mqar", s, 0.5, w) for kind in ("softmax", "linear") for w in (32, 64) for s in (0, 1)
    ]
    figure = widths_figure(runs, "mqar")
    lines = figure.axes[0].get_lines()
    drawn = {line.get_label(): list(line.get_xdata()) for line in lines if not line.get_label().startswith("_")}
    assert drawn == {"softmax": [32, 64], "linear": [32, 64]}


def test_compare_suite_runs_the_suites_tasks_and_reports_the_aggregate(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "mine",
                "variants": [{"variant": "transformer-tiny", "label": "a", "encoder": None}],
                "tasks": [{"kind": "copy"}],  # replaced by the suite's
                "steps": 2,
                "seeds": [0, 1],
                "train": {"batch_size": 4},
            }
        )
    )
    suite = tmp_path / "two.yaml"
    suite.write_text(
        json.dumps(
            {
                "title": "two recall tasks",
                "source": "a test",
                "plots": ["width"],
                "tasks": [SMALL_MQAR, {**SMALL_MQAR, "kind": "mqar", "pairs": 3}],
            }
        )
    )
    with pytest.raises(ConfigError, match="more than once"):  # one kind twice: a report keys tasks by kind
        load_spec(str(spec), suite=str(suite))
    suite.write_text(json.dumps({"title": "recall", "source": "a test", "tasks": [SMALL_MQAR]}))
    assert main(["compare", str(spec), "--suite", str(suite), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["task"] for s in results["summaries"]] == ["mqar", "two"]
    assert "## Suite: two" in report and "## two" in report and "copy" not in report.split("## Spec")[0]
    aggregate = [r for r in results["runs"] if r["aggregate_of"]]
    runs = {r["seed"]: r for r in results["runs"] if not r["aggregate_of"]}
    assert [r["metrics"]["test"]["accuracy"] for r in aggregate] == [
        runs[r["seed"]]["metrics"]["test"]["accuracy"] for r in aggregate
    ]
    assert "| a | 2 |" in report.split("## Runs")[1] or report.split("## Runs")[1].count("| a |") == 2, (
        "the runs table lists the two runs, not the aggregate"
    )


def test_a_suite_alone_runs_on_its_own_variants(tmp_path, monkeypatch):
    captured = {}

    def fake_compare(spec, out, rerun=False):
        captured["spec"] = spec
        raise SystemExit(0)

    monkeypatch.setattr("transformer_zoo.comparing.compare", fake_compare)
    with pytest.raises(SystemExit):
        main(["compare", "--suite", "mqar", "--out", str(tmp_path)])
    spec = captured["spec"]
    assert spec.suite == "mqar" and spec.name == "mqar" and [t.kind for t in spec.tasks] == ["mqar"]
    assert len(spec.variants) > 1


def test_a_kinds_settings_are_averaged_before_the_kinds_are():
    suite = Suite(
        name="grid",
        label="g",
        title="t",
        source="x",
        tasks=[{"kind": "near-pair"}, {"kind": "near-pair", "id": "near-long", "length": 32}, {"kind": "far-pair"}],
    )
    runs = [record("a", "near-pair", 0, 1.0), record("a", "near-long", 0, 0.5), record("a", "far-pair", 0, 0.25)]
    (found,) = suite_records(suite, runs)
    assert found.task == "g" and found.metrics["test"]["accuracy"] == pytest.approx((0.75 + 0.25) / 2)


def test_two_tasks_of_one_kind_run_under_their_ids(tmp_path):
    small = {"kind": "near-pair", "length": 4, "symbols": 2, "train_size": 32, "test_size": 8}
    spec = load_spec(
        {
            "name": "labels",
            "variants": [{"variant": "transformer-tiny", "decoder": None}],
            "tasks": [small, {**small, "id": "near-pair-6", "length": 6}],
            "task_train": {"near-pair-6": {"steps": 3}},
            "steps": 2,
            "seeds": [0],
            "train": {"batch_size": 4},
        }
    )
    results = compare(spec, tmp_path)
    assert {(r.task, r.steps) for r in results.runs} == {("near-pair", 2), ("near-pair-6", 3)}
    assert [s.task for s in results.summaries] == ["near-pair", "near-pair-6"]
    with pytest.raises(ConfigError, match="give each task of one kind an id"):
        load_spec({**spec.model_dump(), "tasks": [small, small]})


def test_a_spec_task_named_as_a_suite_task_sets_its_options_and_others_are_dropped():
    spec = {"name": "s", "variants": ["transformer-tiny"], "tasks": [SMALL_MQAR, {"kind": "copy"}]}
    found = load_spec(spec, suite="mqar")
    assert [(t.kind, t.pairs) for t in found.tasks] == [("mqar", 2)]
    with pytest.raises(ConfigError, match="names no variants of its own"):
        load_spec(None, suite="mad-grid")


def test_the_mad_grid_suite_is_mads_difficulty_grid():
    from transformer_zoo.plugins.tasks.mad_instances import DIFFICULTIES, difficulty_settings

    grid = load_suite("mad-grid")
    expected = [{"kind": kind, **setting} for kind in DIFFICULTIES for setting in difficulty_settings(kind)]
    assert [{k: v for k, v in t.items() if k != "id"} for t in grid.tasks] == expected
    assert grid.aggregate_name == "mad" == load_suite("mad").aggregate_name


def test_a_report_plots_against_length_the_splits_a_tasks_options_give_lengths_to():
    from transformer_zoo.comparing.report import scored_lengths

    chomsky = {"kind": "reverse-string", "test_lengths": [41, 100], "test_stride": 3, "buckets": 2}
    source = {"kind": "python-source", "max_len": 64, "longer": [4]}
    spec = {"tasks": [chomsky, source, {"kind": "mqar", "id": "recall"}]}
    splits = ["test", "test_1-40", "test_41-68", "test_71-98"]
    runs = [
        record("a", "reverse-string", 0, 0.5).model_copy(update={"metrics": {s: {"accuracy": 0.5} for s in splits}})
    ]
    assert scored_lengths(spec, "reverse-string", runs) == {"test_1-40": 20, "test_41-68": 54, "test_71-98": 84}
    runs = [record("a", "python-source", 0, 1.0).model_copy(update={"metrics": {"test": {}, "test_4x": {}}})]
    assert scored_lengths(spec, "python-source", runs) == {"test": 64, "test_4x": 256}
    assert scored_lengths(spec, "recall", runs) == {}  # mqar names no lengths
