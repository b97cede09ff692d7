"""What a report claims from synthetic results: a winner only when a test separates it."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from scipy import stats as scipy_stats

from transformer_zoo.comparing import report
from transformer_zoo.comparing.records import CompareResults, RunRecord
from transformer_zoo.comparing.report import write_report
from transformer_zoo.comparing.stats import holm
from transformer_zoo.comparing.summary import (
    column_decimals,
    format_cell,
    summarize,
    summarize_task,
)

TOKENS_PER_SECOND = {"a": 1000.0, "b": 2000.0, "c": 1500.0}


def record(
    variant: str,
    seed: int,
    accuracy: float,
    metric: str = "accuracy",
    task: str = "listops",
    invocation: str = "now",
    **fields,
) -> RunRecord:
    return RunRecord(
        **{
            "variant": variant,
            "family": "transformer",
            "task": task,
            "seed": seed,
            "parameters": 100,
            "flops_per_token": 600.0,
            "train_tokens_per_second": TOKENS_PER_SECOND[variant] + seed,
            "peak_memory_mb": 2.0,
            "steps": 10,
            "wall_seconds": 10.0 + seed,
            "metric": metric,
            "metrics": {"test": {metric: accuracy}},
            "better": {metric: "lower" if metric == "perplexity" else "higher"},
            "curve": [{"step": 10, "loss": 1.0}],
            "threads": 1,
            "cpus": 2,
            "load_average": 1.0,
            "invocation": invocation,
            **fields,
        }
    )


NOISE = [0.00, 0.01, -0.01, 0.005, -0.005]


def clear_winner() -> list[RunRecord]:
    """Over 5 seeds, b is 0.2 above a and c; a and c are the same."""
    return [
        record(v, seed, base + NOISE[seed]) for v, base in (("a", 0.5), ("b", 0.7), ("c", 0.5)) for seed in range(5)
    ]


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
    runs = [
        record(v, seed, base + NOISE[seed], metric="perplexity", task="language-modeling")
        for v, base in (("a", 5.0), ("b", 9.0))
        for seed in range(5)
    ]
    assert summarize_task(runs).best == "a"


def test_a_task_of_its_own_says_which_way_its_metrics_are_better():
    """No library file names the metric: the task declares it, and the records carry it; a record
    that does not is refused, naming the metric."""
    from transformer_zoo.core.tasks import Task

    class Regret(Task):
        metrics = {"test_regret": "lower", "test_hits": "higher"}

    def runs(**fields):
        return [
            record(v, seed, base + NOISE[seed], metric="test_regret", task="bandit", **fields)
            for v, base in (("a", 5.0), ("b", 9.0))
            for seed in range(5)
        ]

    summary = summarize_task(runs(better=Regret.metrics))
    assert next(c.better for c in summary.columns if c.name == "test test_regret") == "lower"
    assert summary.best == summary.leaders[0] == "a"
    with pytest.raises(ValueError, match=r"better gives no direction for the metrics \['test_regret'\]"):
        runs(better={"test_hits": "higher"})


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


def test_the_column_format_is_chosen_from_all_its_numbers():
    assert column_decimals([0.5, 0.93, None]) == 3
    assert column_decimals([0.00123, 0.0009]) == 5, "three significant digits of the largest"
    assert column_decimals([999.5, 1000.0]) == 0 and column_decimals([-1200.0, 5.25]) == 0
    assert column_decimals([100.0, 600.0]) == 0, "whole numbers stay whole"
    assert column_decimals([]) == 3 and column_decimals([float("inf"), 0.5]) == 3


def test_one_number_format_per_column_whatever_the_magnitude():
    """Tokens per second around 1,000: a cell below 1,000 is written like the ones above it."""
    speeds = {"a": [420.0, 610.0, 980.0], "b": [1500.0, 1900.0, 2400.0]}
    runs = [
        record(v, seed, 0.5 + NOISE[seed], train_tokens_per_second=x)
        for v, xs in speeds.items()
        for seed, x in enumerate(xs)
    ]
    summary = summarize_task(runs)
    column = next(c for c in summary.columns if c.name == "train tokens/s")
    assert column.decimals == 0
    texts = {v: format_cell(summary.cells[v]["train tokens/s"], column.decimals) for v in speeds}
    assert texts["a"].startswith("670 [") and "." not in texts["a"] and "." not in texts["b"]
    assert texts["b"].startswith("1,933 [")
    accuracy = next(c for c in summary.columns if c.name == "test accuracy")
    assert format_cell(summary.cells["a"]["test accuracy"], accuracy.decimals).startswith("0.500 [0.4")
    assert format_cell(summarize_task([record("a", 0, 17.25)]).cells["a"]["test accuracy"]) == "17.250"
    one = summarize_task(clear_winner()).cells["b"]["train tokens/s"]
    assert format_cell(one) == "2,002 [2,000, 2,004]", "alone, a cell is written in the format of its own numbers"


def test_costs_have_positive_log_scale_intervals():
    speeds = [10.0, 9000.0, 4760.0]  # a Student-t interval of these goes below 0
    runs = [record("a", seed, 0.5, train_tokens_per_second=x) for seed, x in enumerate(speeds)]
    summary = summarize_task(runs)
    assert {c.name: c.scale for c in summary.columns if c.kind == "cost"} == dict.fromkeys(
        ("parameters", "FLOPs/token", "train tokens/s", "peak MiB", "wall s"), "log"
    )
    cell = summary.cells["a"]["train tokens/s"]
    logs = np.log(speeds)
    low, high = np.exp(scipy_stats.t.interval(0.95, 2, loc=logs.mean(), scale=scipy_stats.sem(logs)))
    assert cell.mean == pytest.approx(np.mean(speeds)) and (cell.low, cell.high) == pytest.approx((low, high))
    assert cell.low > 0


def bounded_runs(**fields) -> list[RunRecord]:
    """Accuracies at and near 1, whose Student-t interval passes 1."""
    return [
        record(v, seed, x, **fields)
        for v, xs in (("a", [1.0, 1.0, 0.9]), ("b", [0.0, 0.05, 0.0]))
        for seed, x in enumerate(xs)
    ]


def test_declared_bounds_keep_a_metric_interval_inside_them():
    from transformer_zoo.core.tasks import ClassificationTask

    summary = summarize_task(bounded_runs(bounds=ClassificationTask.bounds))
    column = next(c for c in summary.columns if c.name == "test accuracy")
    assert column.scale == "arcsine-sqrt" and column.bounds == (0.0, 1.0)
    a, b = summary.cells["a"]["test accuracy"], summary.cells["b"]["test accuracy"]
    assert a.high == 1.0 and 0 < a.low < a.mean and b.low == 0.0 and b.mean < b.high < 1
    scaled = np.arcsin(np.sqrt([1.0, 1.0, 0.9]))
    ends = scipy_stats.t.interval(0.95, 2, loc=scaled.mean(), scale=scipy_stats.sem(scaled))
    low, high = np.sin(np.clip(ends, 0, np.pi / 2)) ** 2
    assert (a.low, a.high) == pytest.approx((low, high))
    results = CompareResults(
        spec={}, machine={}, runs=bounded_runs(bounds={"accuracy": (0.0, 1.0)}), skipped=[], summaries=[summary]
    )
    jsonschema.validate(json.loads(results.model_dump_json()), CompareResults.model_json_schema())
    assert CompareResults.model_validate_json(results.model_dump_json()).runs[0].bounds == {"accuracy": (0.0, 1.0)}


def test_a_record_without_bounds_loads_unbounded():
    old = json.loads(bounded_runs()[0].model_dump_json())
    del old["bounds"]
    assert RunRecord.model_validate(old).bounds == {}
    summary = summarize_task(bounded_runs())
    column = next(c for c in summary.columns if c.name == "test accuracy")
    assert column.scale == "linear" and column.bounds is None
    assert summary.cells["a"]["test accuracy"].high > 1, "unbounded: the Student-t interval"


def test_the_built_in_tasks_declare_their_bounds():
    from transformer_zoo.core.tasks import (
        ClassificationTask,
        LanguageModelTask,
        MaskedLMTask,
        Seq2SeqTask,
    )
    from transformer_zoo.plugins.tasks.digits_generation import DigitsGenerationTask
    from transformer_zoo.plugins.tasks.seq2seq import Seq2SeqDataTask

    unit = (0.0, 1.0)
    assert Seq2SeqTask.bounds == {"token_accuracy": unit, "sequence_accuracy": unit}
    assert ClassificationTask.bounds == {"accuracy": unit}
    assert LanguageModelTask.bounds == {"token_accuracy": unit} and MaskedLMTask.bounds == {"masked_accuracy": unit}
    assert Seq2SeqDataTask.bounds == {"bleu": (0.0, 100.0), "token_accuracy": unit, "sequence_accuracy": unit}
    assert DigitsGenerationTask.bounds == {"classifier_accuracy": unit}
    for task in (
        Seq2SeqTask,
        ClassificationTask,
        LanguageModelTask,
        MaskedLMTask,
        Seq2SeqDataTask,
        DigitsGenerationTask,
    ):
        assert task.bounds.keys() <= task.metrics.keys(), f"{task.__name__} bounds a metric it does not score"


def test_holm_adjusts_over_every_test_of_a_task():
    """b is 0.013 above the reference (p = 0.032 alone), c equals it: two tests, and b's p doubles."""
    runs = [
        record(v, seed, base + NOISE[seed]) for v, base in (("a", 0.5), ("b", 0.513), ("c", 0.5)) for seed in range(5)
    ]
    summary = summarize_task(runs, reference="a")
    b, c = (next(t for t in summary.tests if t.variant == v) for v in ("b", "c"))
    assert b.p == pytest.approx(0.0316, abs=1e-3) and b.separable
    assert b.p_holm == pytest.approx(2 * b.p) and not b.survives_holm
    assert c.p_holm == pytest.approx(max(2 * b.p, c.p)) and not c.survives_holm
    clear = summarize_task(clear_winner(), reference="a")
    assert [t.p_holm for t in clear.tests] == pytest.approx(holm([t.p for t in clear.tests]))
    winner = next(t for t in clear.tests if t.variant == "b")
    assert winner.survives_holm and winner.p_holm == pytest.approx(2 * winner.p)
    table = report.tests_table(summary)
    assert "Holm's step-down correction over the task's 2 tests" in table
    assert "| p | Holm p | separable at 0.05 | survives Holm |" in table
    row_b = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert row_b.endswith(f"| {b.p:.3g} | {b.p_holm:.3g} | yes | no |")


def test_one_seed_leaves_holm_nothing_to_adjust():
    summary = summarize_task([record(v, 0, acc) for v, acc in (("a", 0.5), ("b", 0.9))])
    assert all(t.p is None and t.p_holm is None and not t.survives_holm for t in summary.tests)
    assert "| b | test accuracy | 0.400 | n/a | n/a | no test (one seed) | n/a |" in report.tests_table(summary)


def test_the_report_opens_with_the_findings_and_bolds_only_the_separable(tmp_path):
    runs = clear_winner() + [
        record(v, seed, base + NOISE[seed], task="digits") for v, base in (("a", 0.8), ("c", 0.8)) for seed in range(5)
    ]
    results = CompareResults(
        spec={"name": "synthetic", "seeds": list(range(5)), "test": "welch"},
        machine={"device": "cpu", "cpus": 2},
        invocation="now",
        runs=runs,
        skipped=[],
        summaries=summarize(runs, reference="a", invocation="now"),
    )
    jsonschema.validate(json.loads(results.model_dump_json()), CompareResults.model_json_schema())
    text = write_report(results, tmp_path).read_text()
    summary = text[text.index("## Summary") : text.index("## listops")]
    assert "- **listops** (test accuracy): b is best" in summary
    assert "- **digits** (test accuracy): Not separable at 5 seeds: " in summary
    assert "Cost of b against the reference, a: 1.00x parameters" in summary
    listops = text[text.index("## listops") : text.index("## digits")]
    row_b = next(line for line in listops.splitlines() if line.startswith("| b |"))
    assert row_b.startswith("| b | 5 | **0.700 [") and " | 100 | 600 | " in row_b, "no spread: the value alone"
    digits = text[text.index("## digits") : text.index("## Plots")]
    rows = [
        line.split(" | ")
        for line in digits.split("Against the reference")[0].splitlines()
        if line.startswith(("| a |", "| c |"))
    ]
    assert len(rows) == 2 and all(row[2].startswith("0.800 [") for row in rows), "no accuracy is bold"
    assert text.index("## Summary") < text.index("## Runs") < text.index("```yaml")


def test_a_loaded_machine_is_reported(tmp_path):
    runs = [r.model_copy(update={"load_average": 4.5}) if r.seed == 0 else r for r in clear_winner()]
    results = CompareResults(
        spec={"name": "loaded", "seeds": list(range(5))},
        machine={},
        invocation="now",
        runs=runs,
        skipped=[],
        summaries=summarize(runs, invocation="now"),
    )
    text = write_report(results, tmp_path).read_text()
    assert "The machine's load exceeded its cores by one or more during 3 runs (at worst 4.5 on 2 cores" in text
    calm = [r.model_copy(update={"load_average": 2.1}) for r in clear_winner()]  # the comparison's own two workers
    results = results.model_copy(update={"runs": calm})
    assert "load exceeded" not in write_report(results, tmp_path).read_text()
