"""Studies: their files validate, each claim's verdict follows from the intervals over seeds, and
every built-in study runs end to end at a tiny budget and writes a verdict."""

from __future__ import annotations

import json

import pytest

from transformer_zoo.cli import main
from transformer_zoo.comparing.records import CompareResults, RunRecord
from transformer_zoo.core.errors import ConfigError, UnknownNameError
from transformer_zoo.comparing.studies import Claim, available_studies, judge, load_study, overall, reproduce_all

NOISE = [0.0, 0.01, -0.01, 0.005, -0.005]


def record(variant: str, seed: int, value: float, metric: str = "accuracy", better: str = "higher",
           probes: dict | None = None) -> RunRecord:
    return RunRecord(
        variant=variant, family="transformer", task="listops", seed=seed, parameters=100, flops_per_token=1.0,
        train_tokens_per_second=1.0, peak_memory_mb=1.0, steps=10, wall_seconds=1.0, metric=metric,
        metrics={"test": {metric: value}}, better={metric: better}, curve=[], probes=probes or {})


def results(a: list[float], b: list[float], **kwargs) -> CompareResults:
    runs = [record("a", i, v, **kwargs) for i, v in enumerate(a)] + [record("b", i, v, **kwargs) for i, v in enumerate(b)]
    return CompareResults(spec={"test": "welch"}, machine={}, runs=runs, skipped=[])


def claim(**fields) -> Claim:
    return Claim(**{"statement": "a beats b", "task": "listops", "metric": "accuracy", "a": "a", "b": "b", **fields})


def spread(mean: float, width: float = 1.0) -> list[float]:
    return [mean + width * n for n in NOISE]


@pytest.mark.parametrize(("a", "b", "fields", "verdict"), [
    (spread(0.8), spread(0.5), {}, "holds"),                      # clearly better
    (spread(0.5), spread(0.8), {}, "does not hold"),              # clearly worse
    (spread(0.5, 10), spread(0.52, 10), {}, "inconclusive"),      # within each other's noise
    ([0.0] * 3, [0.0] * 3, {}, "does not hold"),                  # identical: no advantage at all
    (spread(0.5), spread(0.5), {"margin": 0.05}, "does not hold"),  # any advantage is below the margin
    (spread(0.5), spread(0.8), {"direction": "lower"}, "holds"),  # lower is better: a's lower mean wins
    (spread(0.50), spread(0.51), {"relation": "not-worse", "margin": 0.05}, "holds"),
    (spread(0.30), spread(0.51), {"relation": "not-worse", "margin": 0.05}, "does not hold"),
    (spread(0.50, 10), spread(0.51, 10), {"relation": "not-worse", "margin": 0.05}, "inconclusive"),
    (spread(0.50), spread(0.51), {"relation": "matches", "margin": 0.05}, "holds"),
    (spread(0.30), spread(0.51), {"relation": "matches", "margin": 0.05}, "does not hold"),
    (spread(0.50, 10), spread(0.51, 10), {"relation": "matches", "margin": 0.05}, "inconclusive"),
    ([0.5, 0.5, 0.5, 0.5], [0.1, 0.9, 0.2, 0.8], {"relation": "steadier"}, "holds"),
    ([0.1, 0.9, 0.2, 0.8], [0.5, 0.5, 0.5, 0.5], {"relation": "steadier"}, "does not hold"),
    ([0.5, 0.6, 0.4], [0.5, 0.61, 0.39], {"relation": "steadier"}, "inconclusive"),
])
def test_a_claims_verdict_follows_from_the_interval_over_seeds(a, b, fields, verdict):
    result = judge(claim(**fields), results(a, b))
    assert result.verdict == verdict, result.reason
    assert result.a.n == len(a) and result.b.n == len(b)


def test_the_metrics_declared_direction_is_the_default():
    """A lower-is-better metric (a Frechet distance): a's lower values win without a direction."""
    result = judge(claim(metric="frechet_distance"), results(spread(10.0), spread(20.0), metric="frechet_distance",
                                                            better="lower"))
    assert result.verdict == "holds" and result.difference == pytest.approx(-10.0)


def test_a_claim_on_a_probe_reads_the_probe():
    data = CompareResults(spec={}, machine={}, skipped=[], runs=[
        record(v, i, 0.5, probes={"saturated_rows": x + n}) for v, x in (("a", 0.9), ("b", 0.1))
        for i, n in enumerate(NOISE)])
    result = judge(claim(metric="saturated_rows", direction="higher"), data)
    assert result.verdict == "holds" and result.probe and result.a.mean == pytest.approx(0.9)


def test_one_seed_is_inconclusive():
    assert judge(claim(), results([0.9], [0.1])).verdict == "inconclusive"


def test_a_study_holds_only_when_every_claim_holds():
    assert overall(["holds", "holds"]) == "holds"
    assert overall(["holds", "inconclusive"]) == "inconclusive"
    assert overall(["holds", "does not hold", "inconclusive"]) == "does not hold"


def test_bad_claims_are_refused_with_what_would_be_right():
    with pytest.raises(ValueError, match="needs a margin"):
        claim(relation="matches")
    with pytest.raises(ValueError, match="compares two variants"):
        claim(b="a")


STUDIES = ["ut-length-generalisation", "layernorm-vs-batchnorm", "scaled-dot-product", "local-vs-global",
           "sagan-attention", "multi-head", "pre-vs-post-norm", "tuned-pre-vs-post-norm"]


def test_the_built_in_studies_are_listed_and_validate_at_both_scales():
    assert sorted(available_studies()) == sorted(STUDIES)
    for name in STUDIES:
        study = load_study(name)
        cpu, gpu = study.spec("cpu"), study.spec("gpu")
        assert gpu.steps > cpu.steps and len(gpu.seeds) >= len(cpu.seeds) >= 3, name


def test_a_claim_naming_what_the_spec_lacks_fails_before_training(tmp_path):
    study = load_study("multi-head").model_dump()
    for change, message in [({"a": "8 heads"}, "does not run"), ({"metric": "bleu"}, "neither a metric"),
                            ({"split": "test_long"}, "not one of task"), ({"task": "reverse"}, "not one of the spec")]:
        data = {**study, "claims": [{**study["claims"][0], **change}]}
        path = tmp_path / "mine.yaml"
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=message):
            load_study(str(path)).spec()


def test_an_unknown_study_names_the_built_in_ones():
    with pytest.raises(UnknownNameError, match="multi-head"):
        load_study("no-such-study")


def test_cli_lists_the_studies(capsys):
    assert main(["reproduce", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["study"] for row in rows} == set(STUDIES) and all(row["source"] for row in rows)


TINY = {"steps": 2, "seeds": [0, 1], "workers": 1, "threads": 1}


def test_every_study_runs_at_a_tiny_budget_and_writes_a_verdict(tmp_path):
    """Each spec validates, trains (2 steps, 2 seeds), and its claims are judged; the page lists them all."""
    out = tmp_path / "reproduce"
    done = reproduce_all(STUDIES, out, overrides=TINY)
    assert [r.name for r in done] == STUDIES
    for result in done:
        assert result.verdict in ("holds", "does not hold", "inconclusive")
        assert all(c.a.n == 2 and c.b.n == 2 for c in result.claims)
        assert (out / result.name / "report.md").is_file()
        page = (out / result.name / "verdict.md").read_text()
        assert result.claims[0].claim.statement in page and result.verdict in page
    summary = (out / "reproductions.md").read_text()
    assert all(f"[{name}]({name}/verdict.md)" in summary for name in STUDIES)
