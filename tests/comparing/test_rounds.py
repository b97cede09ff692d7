"""Smallest effects of interest, paired seeds and seeds added until decided, as studies and
comparisons use them: the verdict rules on planted effects, the paired tests, each look's
share of alpha, the rounds and their budget (on a frozen clock), and a tiny study run until decided."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_records import record

from transformer_zoo.cli import main
from transformer_zoo.comparing import rounds
from transformer_zoo.comparing.records import CompareResults
from transformer_zoo.comparing.rounds import Looks, compare_until_decided, look_seeds, run_rounds
from transformer_zoo.comparing.spec import UntilDecided, budget_seconds, load_spec
from transformer_zoo.comparing.studies.spec import Claim, Study
from transformer_zoo.comparing.studies.verdicts import judge
from transformer_zoo.comparing.summary import summarize
from transformer_zoo.core.errors import ConfigError


def planted(gain: float, seeds: list[int], spread: float = 0.02, shared: float = 0.0, pairing: str = "none"):
    """Runs of a and b whose true gain is ``gain``: each seed's noise has a part both share
    (``shared``, what paired seeds cancel) and a part of its own (``spread``)."""
    noise = {s: np.random.default_rng([7, s]).normal(0, 1, 3) * (shared, spread, spread) for s in seeds}
    runs = [record("a", s, 0.5 + gain + noise[s][0] + noise[s][1]) for s in seeds]
    runs += [record("b", s, 0.5 + noise[s][0] + noise[s][2]) for s in seeds]
    return CompareResults(spec={"test": "welch", "pairing": pairing}, machine={}, runs=runs, skipped=[])


def claim(**fields) -> Claim:
    return Claim(**{"statement": "a beats b", "task": "listops", "metric": "accuracy", "a": "a", "b": "b", **fields})


def test_a_planted_zero_effect_reaches_does_not_hold_only_with_an_effect_of_interest():
    """No true gain: with an effect of interest of 0.05 enough seeds decide 'does not hold'; with
    none the interval straddles 0 at any number of seeds, and the claim stays open."""
    data = planted(0.0, list(range(30)))
    decided = judge(claim(effect=0.05), data)
    assert decided.verdict == "does not hold" and decided.high < 0.05 and decided.low <= 0, decided.reason
    assert judge(claim(), data).verdict == "inconclusive"


def test_a_gain_smaller_than_the_effect_holds_and_says_so():
    result = judge(claim(effect=0.5), planted(0.1, list(range(10)), spread=0.005))
    assert result.verdict == "holds" and result.below_effect and "smaller than the effect" in result.reason


def test_an_inconclusive_claim_says_which_verdict_it_leans_to_and_the_seeds_it_needs():
    near_no = judge(claim(effect=0.05), planted(0.0, [0, 1, 2], spread=0.02))
    assert near_no.verdict == "inconclusive" and near_no.leaning == "does not hold", near_no.reason
    near_yes = judge(claim(effect=0.05), planted(0.04, [0, 1, 2], spread=0.03))
    assert near_yes.verdict == "inconclusive" and near_yes.leaning == "holds", near_yes.reason
    assert near_no.seeds_needed is not None and "seeds a side would decide it" in near_no.reason


def test_paired_seeds_judge_by_the_per_seed_differences_and_keep_welchs_interval_beside():
    """Noise the two variants share at a seed (their common start) cancels in the paired test."""
    data = planted(0.03, list(range(5)), spread=0.005, shared=0.1, pairing="seeds")
    paired = judge(claim(effect=0.01), data)
    assert paired.paired and paired.verdict == "holds", paired.reason
    assert paired.high - paired.low < 0.2 * (paired.unpaired_high - paired.unpaired_low)
    unpaired = judge(claim(effect=0.01), data.model_copy(update={"spec": {"test": "welch"}}))
    assert not unpaired.paired and unpaired.verdict == "inconclusive" and unpaired.unpaired_low is None


def test_a_paired_comparison_tests_each_variant_against_the_reference_by_seed():
    data = planted(0.03, list(range(5)), spread=0.005, shared=0.1)
    (paired,) = summarize(data.runs, "b", paired=True)
    (welch,) = summarize(data.runs, "b")
    test = next(t for t in paired.tests if t.column == paired.headline)
    assert test.test == "paired" and test.p < 0.01 and test.low > 0
    assert next(t for t in welch.tests if t.column == welch.headline).p > 0.05


def test_a_study_states_effects_for_its_claims_and_refuses_one_on_a_steadier_claim():
    data = {
        "name": "s",
        "title": "t",
        "source": "x",
        "effect": 0.03,
        "compare": {"variants": ["transformer-tiny"], "tasks": ["listops"]},
        "claims": [
            {"statement": "a", "task": "listops", "metric": "accuracy", "a": "a", "b": "b"},
            {"statement": "b", "task": "listops", "metric": "accuracy", "a": "a", "b": "b", "effect": 0.2},
            {"statement": "c", "task": "listops", "metric": "accuracy", "a": "a", "b": "b", "relation": "steadier"},
        ],
    }
    study = Study.model_validate(data)
    assert [c.effect for c in study.claims] == [0.03, 0.2, 0.0]  # a claim's own effect stands
    with pytest.raises(ValueError, match="steadier.*no effect of interest"):
        claim(relation="steadier", effect=0.1)
    with pytest.raises(ValueError, match="needs an effect > 0"):
        claim(relation="matches", effect=0)


def test_the_looks_add_a_round_of_new_seeds_up_to_the_most():
    settings = UntilDecided(round=2, most_seeds=8)
    assert look_seeds([0, 1, 2], settings) == [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6], list(range(8))]
    assert look_seeds([5, 9], UntilDecided(round=3, most_seeds=5)) == [[5, 9], [5, 9, 0, 1, 2]]
    assert look_seeds(list(range(12)), settings) == [list(range(12))]  # more seeds than the most: one look


def test_each_look_judges_the_open_items_at_its_share_of_alpha_and_keeps_the_decided():
    """Items judged at a look's alpha of 0.03 with a study share of 2/3: x (which needs a level of
    0.01) decides at the first look, y and z (0.04) need a larger share, and a decided item is not
    judged again."""
    needs = {"x": 0.01, "y": 0.04, "z": 0.04}
    judged: list[tuple[str, float]] = []

    def judge_at(key: str, level: float) -> tuple[str, float]:
        judged.append((key, level))
        return (key if level >= needs[key] - 1e-12 else "", level)

    looks: Looks[tuple[str, float]] = Looks(list(needs), share=2 / 3)
    judges = {key: (lambda level, k=key: judge_at(k, level)) for key in needs}
    assert not looks.judge(0, 0.03, judges, lambda outcome: bool(outcome[0]))
    assert looks.open == ["y", "z"] and all(level == pytest.approx(0.02) for _, level in judged)
    judged.clear()
    assert looks.judge(1, 0.06, judges, lambda outcome: bool(outcome[0]))
    assert [key for key, _ in judged] == ["y", "z"] and looks.outcome("x")[0] == 0 and looks.outcome("y")[0] == 1


class FakeClock:
    """A clock that each comparison moves on by ``per_seed`` seconds a new seed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_compare(gains: dict[str, float], clock: FakeClock, per_seed: float, calls: list, onlys: list | None = None):
    def compare(spec, out_dir, plugins=None, only=None):
        if onlys is not None:
            onlys.append(only)
        new = [s for s in spec.seeds if s not in calls[-1]] if calls else spec.seeds
        calls.append(list(spec.seeds))
        clock.now += per_seed * len(new)
        runs = []
        for task, gain in gains.items():
            runs += planted(gain, spec.seeds, spread=0.02).model_copy().runs
            runs[-2 * len(spec.seeds) :] = [r.model_copy(update={"task": task}) for r in runs[-2 * len(spec.seeds) :]]
        runs = [run for run in runs if only is None or run.variant in only]
        results = CompareResults(spec=spec.model_dump(mode="json"), machine={}, runs=runs, skipped=[])
        results.summaries = summarize(runs, "b")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "report.md").write_text("# report\n")
        return results

    return compare


def test_rounds_stop_when_every_item_is_decided(monkeypatch, tmp_path):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.3}, clock, 10.0, calls))
    spec = load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2]})
    judged = []

    def judge_look(results, look, alpha):
        judged.append((look, alpha))
        return look == 1  # decided at the second look

    _, done, why = run_rounds(spec, tmp_path, judge_look, UntilDecided(budget=3600, round=2, most_seeds=9), say=str)
    assert calls == [[0, 1, 2], [0, 1, 2, 3, 4]] and [r.look for r in done] == [1, 2]
    assert "every item decided after 2 look(s)" in why
    assert judged[0][1] > judged[1][1] > 0 and sum(a for _, a in judged) < 0.05  # shares of alpha, spent in part


def test_rounds_stop_when_the_budget_leaves_no_time_for_the_next(monkeypatch, tmp_path):
    """Each seed takes 100 s on the frozen clock: 3 seeds, then 2 more (500 s), and a third round
    (another 200 s) would pass a budget of 600 s, so it does not start."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.0}, clock, 100.0, calls))
    spec = load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2]})
    _, done, why = run_rounds(
        spec, tmp_path, lambda *_: False, UntilDecided(budget=600, round=2, most_seeds=9), say=str
    )
    assert calls == [[0, 1, 2], [0, 1, 2, 3, 4]] and "leaves no time for another round" in why


def test_a_comparison_until_decided_reports_each_tests_look_and_seeds(monkeypatch, tmp_path):
    """A clear gain is decided at the first look; no gain, with an effect of interest, is decided
    'within the effect' once enough seeds narrow its interval."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.3, "copy": 0.0}, clock, 1.0, calls))
    spec = load_spec(
        {
            "variants": ["transformer-tiny"],
            "tasks": ["listops"],
            "seeds": [0, 1, 2],
            "effect": 0.05,
            "until_decided": {"budget": "1h", "round": 3, "most_seeds": 30},
        }
    )
    _, decisions = compare_until_decided(spec, tmp_path)
    found = {d.task: d for d in decisions}
    assert found["listops"].found == "above 0" and found["listops"].look == 1
    assert found["copy"].found == "within the effect" and found["copy"].seeds > 3
    assert found["copy"].confidence > 0.95  # a look's share of alpha: a wider interval than 95%
    report = (tmp_path / "report.md").read_text()
    assert "## Seeds added until decided" in report and "within the effect" in report
    assert json.loads((tmp_path / "rounds.json").read_text())["decisions"][0]["task"] == "listops"


def test_budgets_read_as_durations_and_bad_ones_say_what_would_be_right(capsys):
    assert budget_seconds("20m") == 1200 and budget_seconds("1.5h") == 5400 and budget_seconds(90) == 90
    with pytest.raises(ValueError, match="give seconds .* or a number with s, m or h"):
        budget_seconds("soon")
    with pytest.raises(ConfigError, match="budget"):
        load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "until_decided": {"budget": "-1m"}})
    with pytest.raises(SystemExit):
        main(["compare", "--until-decided", "--budget", "soon"])
    assert "20m" in capsys.readouterr().err


def test_the_regions_picture_labels_each_interval_with_the_verdict_the_rules_give(tmp_path):
    from transformer_zoo.comparing.studies.figures import EXAMPLES, effect_regions_figure, verdict_of

    labels = [verdict_of(low, high, 0.05) for low, high in EXAMPLES]
    assert labels == [
        "holds",
        "holds (smaller than the effect)",
        "does not hold",
        "does not hold",
        "inconclusive",
        "holds",
    ]
    assert effect_regions_figure(tmp_path / "regions.png").stat().st_size > 10_000


def test_compare_until_decided_from_the_command_line_takes_the_specs_settings(monkeypatch, tmp_path):
    """--until-decided alone: the spec's until_decided settings (here none: the defaults)."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.3}, clock, 1.0, calls))
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2]}))
    main(["compare", str(spec), "--until-decided", "--out", str(tmp_path / "out")])
    assert calls == [[0, 1, 2]]  # decided at the first look
    assert json.loads((tmp_path / "out" / "rounds.json").read_text())["decisions"][0]["found"] == "above 0"


def test_a_round_of_reused_runs_is_timed_by_their_recorded_wall_time(monkeypatch, tmp_path):
    """The first look's runs all come from the cache (of another invocation) and take no time on
    the clock; the next round is planned at their recorded 400 s a seed, so a budget of 600 s
    leaves no time for it."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    fake = fake_compare({"listops": 0.0}, clock, 0.0, calls)

    def reused(spec, out_dir, plugins=None, only=None):
        results = fake(spec, out_dir)
        results.runs = [r.model_copy(update={"wall_seconds": 400.0, "invocation": "earlier"}) for r in results.runs]
        return results.model_copy(update={"invocation": "now"})

    monkeypatch.setattr(rounds, "compare", reused)
    spec = load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2], "workers": 2})
    _, done, why = run_rounds(
        spec, tmp_path, lambda *_: False, UntilDecided(budget=600, round=2, most_seeds=9), say=str
    )
    assert calls == [[0, 1, 2]] and "the next would take about" in why, why


def test_seeds_added_until_decided_refuse_torchrun(monkeypatch, tmp_path):
    from transformer_zoo.training import distributed

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=0, size=2, launched=True))
    spec = load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1]})
    with pytest.raises(ConfigError, match="run it without torchrun"):
        run_rounds(spec, tmp_path, lambda *_: True, UntilDecided())


def test_a_tiny_study_runs_until_decided_and_its_page_gives_each_claims_seeds(tmp_path):
    """multi-head at 3 steps: no claim can be decided, so the rounds run to the planned last look
    (3 seeds), each claim judged at a look's share of alpha, and the page says so."""
    from transformer_zoo.comparing.studies.running import reproduce
    from transformer_zoo.comparing.studies.spec import load_study

    overrides = {"steps": 3, "seeds": [0, 1], "workers": 1, "threads": 1}
    overrides["until_decided"] = {"round": 1, "most_seeds": 3, "budget": "1h"}
    result = reproduce(load_study("multi-head"), tmp_path, overrides=overrides)
    assert [len(r["seeds"]) for r in result.rounds] == [2, 3] or result.claims[0].verdict != "inconclusive"
    claim = result.claims[0]
    assert claim.paired and claim.look == len(result.rounds) and claim.seeds == len(result.rounds[-1]["seeds"])
    assert claim.confidence > 0.95 and claim.unpaired_low is not None
    page = (tmp_path / "verdict.md").read_text()
    assert "Seeds added until decided: looks at" in page and "paired / unpaired" in page
    assert "--until-decided --budget 60m" in result.command


def test_later_looks_run_only_the_variants_of_the_open_items_and_keep_the_others_runs(monkeypatch, tmp_path):
    """listops is decided at the first look, copy is not: later looks run copy's variants alone
    (here every variant, a and b, as both tasks share them), and the results hold every task."""
    clock, calls, onlys = FakeClock(), [], []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    monkeypatch.setattr(rounds, "write_report", lambda results, out_dir: None)
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.3, "copy": 0.0}, clock, 1.0, calls, onlys))
    spec = load_spec(
        {"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2], "effect": 0.05}
        | {"until_decided": {"budget": "1h", "round": 3, "most_seeds": 30}}
    )
    results, decisions = compare_until_decided(spec, tmp_path)
    assert onlys[0] is None and all(only == {"a", "b"} for only in onlys[1:]) and len(onlys) > 1
    assert {r.task for r in results.runs} == {"listops", "copy"}


def test_a_variant_a_later_look_does_not_run_keeps_its_runs_of_the_last_look_that_ran_it(monkeypatch, tmp_path):
    clock, calls, onlys = FakeClock(), [], []
    monkeypatch.setattr(rounds.time, "perf_counter", clock)
    written = []
    monkeypatch.setattr(rounds, "write_report", lambda results, out_dir: written.append(results))
    monkeypatch.setattr(rounds, "compare", fake_compare({"listops": 0.0}, clock, 1.0, calls, onlys))
    spec = load_spec({"variants": ["transformer-tiny"], "tasks": ["listops"], "seeds": [0, 1, 2]})
    results, done, _ = run_rounds(
        spec, tmp_path, lambda *_: False, UntilDecided(round=2, most_seeds=5), say=str, needed=lambda: {"a"}
    )
    assert onlys == [None, {"a"}] and [len(r.seeds) for r in done] == [3, 5]
    seeds = {v: sorted(r.seed for r in results.runs if r.variant == v) for v in ("a", "b")}
    assert seeds == {"a": [0, 1, 2, 3, 4], "b": [0, 1, 2]}
    assert written and written[-1] is results and json.loads((tmp_path / "results.json").read_text())["runs"]


def test_a_verdict_another_version_wrote_is_left_out_of_the_page_not_fatal(tmp_path, capsys):
    from transformer_zoo.comparing.studies.running import reproduce_all

    (tmp_path / "old-study").mkdir()
    (tmp_path / "old-study" / "verdict.json").write_text(json.dumps({"name": "old-study", "margin": 0.1}))
    overrides = {"steps": 2, "seeds": [0, 1], "workers": 1, "threads": 1}
    reproduce_all(["multi-head"], tmp_path, overrides=overrides)
    page = (tmp_path / "reproductions.md").read_text()
    assert "multi-head" in page and "old-study" not in page
    assert "another version wrote it" in capsys.readouterr().err
