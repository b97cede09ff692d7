"""A study's tally: every variant against one reference as one family of tests, counted better, not
separable or worse after Holm's correction, untuned and tuned, with the ranks of each."""

from __future__ import annotations

import json

import pytest

from transformer_zoo.comparing.records import CompareResults, RunRecord
from transformer_zoo.comparing.studies.pages import study_lines
from transformer_zoo.comparing.studies.spec import load_study
from transformer_zoo.comparing.studies.verdicts import verdict
from transformer_zoo.comparing.tallies import Tally, families, rank_correlation, tally, tally_lines
from transformer_zoo.core.errors import ConfigError

NOISE = [0.0, 0.01, -0.01, 0.005, -0.005]


def run(label: str, seed: int, value: float) -> RunRecord:
    return RunRecord(
        variant=label,
        family="transformer",
        task="python-source",
        seed=seed,
        parameters=100,
        flops_per_token=1.0,
        train_tokens_per_second=1.0,
        peak_memory_mb=1.0,
        steps=300,
        wall_seconds=1.0,
        metric="perplexity",
        metrics={"test": {"perplexity": value}},
        better={"perplexity": "lower"},
        curve=[],
    )


def results(means: dict[str, float], width: float = 1.0) -> CompareResults:
    runs = [run(label, seed, mean + width * n) for label, mean in means.items() for seed, n in enumerate(NOISE)]
    return CompareResults(spec={"test": "welch"}, machine={}, runs=runs, skipped=[])


SPEC = Tally(reference="vanilla", task="python-source", metric="perplexity")


def test_each_variant_is_counted_after_holms_correction_the_way_the_metric_is_better():
    # perplexity: lower is better; a is far below vanilla, b far above, c a hair below, d just separable alone
    means = {"vanilla": 10.0, "a": 9.0, "b": 11.0, "c": 9.999, "d": 9.9875}
    (found,) = tally(SPEC, results(means), list(means))
    rows = {row.label: row for row in found.rows}
    assert found.family == "as run" and found.direction == "lower"
    assert rows["a"].outcome == "better" and rows["b"].outcome == "worse" and rows["c"].outcome == "not separable"
    assert rows["d"].p < 0.05 <= rows["d"].p_holm, "separable on its own, not once the family of four counts"
    assert rows["d"].outcome == "not separable"
    assert found.counts == {"better": 1, "not separable": 2, "worse": 1}
    assert [rows[x].rank for x in "adcb"] == [1, 2, 3, 5] and found.reference_rank == 4
    assert rows["b"].difference == pytest.approx(1.0)


def test_tuned_twins_are_a_family_of_their_own_and_the_ranks_are_compared():
    means = {
        "vanilla": 10.0,
        "a": 9.0,
        "b": 11.0,
        "vanilla tuned": 8.0,
        "a tuned": 8.5,
        "b tuned": 7.0,
    }
    assert families(list(means), "vanilla") == {
        "untuned": ("vanilla", ["a", "b"]),
        "tuned": ("vanilla tuned", ["a tuned", "b tuned"]),
    }
    untuned, tuned = tally(SPEC, results(means), list(means))
    assert (untuned.family, tuned.family) == ("untuned", "tuned")
    assert untuned.counts == {"better": 1, "not separable": 0, "worse": 1}
    assert tuned.counts == {"better": 1, "not separable": 0, "worse": 1}
    assert {r.label: r.outcome for r in tuned.rows} == {"a tuned": "worse", "b tuned": "better"}
    assert rank_correlation([untuned, tuned]) == pytest.approx(-1.0), "tuning reversed the order"
    page = "\n".join(tally_lines(SPEC, [untuned, tuned], "Welch's t-test"))
    assert "| a | " in page and "**worse**" in page and "Spearman's rank correlation -1" in page
    assert "of 2 variants against vanilla tuned, 1 better, 0 not separable, 1 worse" in page


def test_the_modifications_study_tallies_every_modification_and_prints_the_table():
    study = load_study("modifications")
    spec = study.spec("cpu")
    labels = ["vanilla", "rmsnorm", "swiglu", "geglu", "rezero", "switch", "talking-heads", "shared-weights", "t5-bias"]
    means = {label: 10.0 - 0.1 * i for i, label in enumerate(labels)}
    means |= {f"{label} tuned": 9.0 for label in labels}
    outcome = verdict(study, spec, results(means, width=0.01), "cpu", 1.0, "tzoo reproduce modifications")
    untuned, tuned = outcome.tallies
    assert len(untuned.rows) == len(tuned.rows) == 8
    assert untuned.counts["better"] == 8 and tuned.counts["not separable"] == 8
    page = "\n".join(study_lines(outcome))
    assert "Every variant against vanilla" in page and "Table 1: 1.789, 76.00" in page
    assert json.loads(outcome.model_dump_json())["tallies"][1]["family"] == "tuned"


def test_a_tally_naming_what_the_spec_lacks_is_refused_before_training(tmp_path):
    data = load_study("modifications").model_dump()
    data["tally"]["reference"] = "baseline"
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="tally: no run of reference 'baseline' on task 'python-source'"):
        load_study(str(path)).spec()
    data["tally"] |= {"reference": "vanilla", "metric": "bleu"}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="tally: task 'python-source' has metrics"):
        load_study(str(path)).spec()
