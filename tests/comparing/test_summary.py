"""What a report claims from synthetic results: a winner only when a test separates it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from transformer_zoo.comparing.records import CompareResults, RunRecord
from transformer_zoo.comparing.report import write_report
from transformer_zoo.comparing.summary import format_cell, summarize, summarize_task

TOKENS_PER_SECOND = {"a": 1000.0, "b": 2000.0, "c": 1500.0}


def record(variant: str, seed: int, accuracy: float, metric: str = "accuracy", task: str = "listops",
           invocation: str = "now", **fields) -> RunRecord:
    return RunRecord(**{
        "variant": variant, "family": "transformer", "task": task, "seed": seed, "parameters": 100,
        "flops_per_token": 600.0, "train_tokens_per_second": TOKENS_PER_SECOND[variant] + seed, "peak_memory_mb": 2.0,
        "steps": 10, "wall_seconds": 10.0 + seed, "metric": metric, "metrics": {"test": {metric: accuracy}},
        "curve": [{"step": 10, "loss": 1.0}], "threads": 1, "cpus": 2, "load_average": 1.0, "invocation": invocation,
        **fields})


NOISE = [0.00, 0.01, -0.01, 0.005, -0.005]


def clear_winner() -> list[RunRecord]:
    """Over 5 seeds, b is 0.2 above a and c; a and c are the same."""
    return [record(v, seed, base + NOISE[seed]) for v, base in (("a", 0.5), ("b", 0.7), ("c", 0.5))
            for seed in range(5)]


def test_a_clearly_better_variant_is_bold_and_its_test_rejects():
    summary = summarize_task(clear_winner(), reference="a")
    assert summary.best == "b" and summary.leaders == ["b"]
    test = next(t for t in summary.tests if t.variant == "b" and t.column == "test accuracy")
    assert test.p < 0.05 and test.separable and test.difference == pytest.approx(0.2)
    assert test.low < 0.2 < test.high
    assert summary.verdict.startswith("b is best: 0.700 [")
    assert "separable from every other variant (Welch's t-test over 5 seeds" in summary.verdict
    same = next(t for t in summary.tests if t.variant == "c")
    assert same.p > 0.5 and not same.separable


def test_equal_variants_are_not_separable_and_nothing_is_bold():
    runs = [r for r in clear_winner() if r.variant != "b"]
    summary = summarize_task(runs)
    assert summary.reference == "a", "by default the first variant that ran the task"
    accuracy = next(c for c in summary.columns if c.name == "test accuracy")
    assert accuracy.best is None and summary.best is None
    assert summary.verdict.startswith("Not separable at 5 seeds: ")
    assert set(summary.leaders) == {"a", "c"}


def test_one_seed_claims_no_winner():
    runs = [record(v, 0, acc) for v, acc in (("a", 0.5), ("b", 0.9))]
    summary = summarize_task(runs)
    assert summary.best is None and all(c.best is None for c in summary.columns)
    assert summary.verdict.startswith("One seed: no test was possible")
    assert all(t.p is None for t in summary.tests)


def test_lower_is_better_for_perplexity():
    runs = [record(v, seed, base + NOISE[seed], metric="perplexity", task="language-modeling")
            for v, base in (("a", 5.0), ("b", 9.0)) for seed in range(5)]
    assert summarize_task(runs).best == "a"


def test_a_task_of_its_own_says_which_way_its_metrics_are_better():
    """No library file names the metric: the task declares it, and the records carry it (or,
    written without it, take it from the task classes that declare the name)."""
    from transformer_zoo.core.tasks import Task

    class Regret(Task):
        metrics = {"test_regret": "lower", "test_hits": "higher"}

    def runs(**fields):
        return [record(v, seed, base + NOISE[seed], metric="test_regret", task="bandit", **fields)
                for v, base in (("a", 5.0), ("b", 9.0)) for seed in range(5)]

    for records in (runs(better=Regret.metrics), runs()):
        summary = summarize_task(records)
        assert next(c.better for c in summary.columns if c.name == "test test_regret") == "lower"
        assert summary.best == summary.leaders[0] == "a"


def test_a_permutation_test_of_three_seeds_says_it_cannot_separate():
    runs = [record(v, seed, base + NOISE[seed]) for v, base in (("a", 0.5), ("b", 0.9)) for seed in range(3)]
    welch = summarize_task(runs, test="welch")
    exact = summarize_task(runs, test="permutation")
    assert welch.best == "b"
    assert exact.best is None and "this test cannot give p below 0.1: run more seeds" in exact.verdict


def test_times_of_another_invocation_are_not_compared():
    runs = clear_winner()
    mixed = [r.model_copy(update={"invocation": "earlier", "reused": True}) if r.variant == "b" else r for r in runs]
    summary = summarize_task(mixed, reference="a", invocation="now")
    assert not summary.costs_comparable
    assert {c.name: c.best for c in summary.columns}["train tokens/s"] is None
    assert "train tokens/s" not in summary.cost_ratios["b"] and summary.cost_ratios["b"]["parameters"] == 1.0
    alone = summarize_task(runs, reference="a", invocation="now")
    assert {c.name: c.best for c in alone.columns}["train tokens/s"] == "b"
    assert alone.cost_ratios["b"]["train tokens/s"] == pytest.approx(2002 / 1002)


def test_one_number_format_for_every_column():
    assert format_cell(summarize_task([record("a", 0, 17.0)]).cells["a"]["test accuracy"]) == "17.000"
    cells = summarize_task(clear_winner()).cells["b"]
    assert format_cell(cells["test accuracy"]).startswith("0.700 [0.6")
    assert format_cell(cells["train tokens/s"]) == "2,002 [2,000, 2,004]"


def test_the_report_opens_with_the_findings_and_bolds_only_the_separable(tmp_path):
    runs = clear_winner() + [record(v, seed, base + NOISE[seed], task="digits") for v, base in (("a", 0.8), ("c", 0.8))
                             for seed in range(5)]
    results = CompareResults(spec={"name": "synthetic", "seeds": list(range(5)), "test": "welch"},
                             machine={"device": "cpu", "cpus": 2}, invocation="now", runs=runs, skipped=[],
                             summaries=summarize(runs, reference="a", invocation="now"))
    jsonschema.validate(json.loads(results.model_dump_json()), CompareResults.model_json_schema())
    text = write_report(results, tmp_path).read_text()
    summary = text[text.index("## Summary"):text.index("## listops")]
    assert "- **listops** (test accuracy): b is best" in summary
    assert "- **digits** (test accuracy): Not separable at 5 seeds: " in summary
    assert "Cost of b against the reference, a: 1.00x parameters" in summary
    listops = text[text.index("## listops"):text.index("## digits")]
    row_b = next(line for line in listops.splitlines() if line.startswith("| b |"))
    assert row_b.startswith("| b | 5 | **0.700 [") and " | 100 | 600.000 | " in row_b, "no spread: the value alone"
    digits = text[text.index("## digits"):text.index("## Plots")]
    rows = [line.split(" | ") for line in digits.split("Against the reference")[0].splitlines()
            if line.startswith(("| a |", "| c |"))]
    assert len(rows) == 2 and all(row[2].startswith("0.800 [") for row in rows), "no accuracy is bold"
    assert text.index("## Summary") < text.index("## Runs") < text.index("```yaml")


def test_a_loaded_machine_is_reported(tmp_path):
    runs = [r.model_copy(update={"load_average": 4.5}) if r.seed == 0 else r for r in clear_winner()]
    results = CompareResults(spec={"name": "loaded", "seeds": list(range(5))}, machine={}, invocation="now",
                             runs=runs, skipped=[], summaries=summarize(runs, invocation="now"))
    text = write_report(results, tmp_path).read_text()
    assert "The machine's load exceeded its cores by one or more during 3 runs (at worst 4.5 on 2 cores" in text
    calm = [r.model_copy(update={"load_average": 2.1}) for r in clear_winner()]  # the comparison's own two workers
    results = results.model_copy(update={"runs": calm})
    assert "load exceeded" not in write_report(results, tmp_path).read_text()
