"""A study's sweep: its variants expanded one per value, what it refuses, the sensitivity of each
swept variant (checked against Wortsman et al.'s definition written out here), the loss at
initialisation it reads, and the small-scale-proxies study run end to end at a tiny size."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from run_records import record

from transformer_zoo.comparing.records import CompareResults, Failed
from transformer_zoo.comparing.studies.pages import study_lines
from transformer_zoo.comparing.studies.spec import Claim, load_study
from transformer_zoo.comparing.studies.sweeps import InitialLosses, Sweep, sensitivity, sweep_result
from transformer_zoo.comparing.studies.verdicts import judge, verdict
from transformer_zoo.core.errors import ConfigError

TASK = {"kind": "python-source", "max_len": 16, "longer": [], "train_tokens": 2048, "test_tokens": 256}


def study_data(**changes) -> dict:
    """A study of one's own sweeping two of three variants over the learning rate, 1 step each."""
    data = {
        "name": "mine",
        "title": "t",
        "source": "s",
        "claims": [
            {"statement": "a is less sensitive", "task": "python-source", "metric": "sensitivity", "a": "a", "b": "b"}
        ],
        "sweep": {"over": "lr", "values": [0.1, 0.001, 0.01], "variants": ["a", "b"]},
        "compare": {
            "variants": [
                "llama-tiny",
                {"variant": "llama-tiny", "label": "a"},
                {"variant": "llama-tiny", "label": "b", "d_ff": 64},
            ],
            "tasks": [TASK],
            "steps": 1,
            "seeds": [0],
            "workers": 1,
            "threads": 1,
            "variant_train": {"b": {"warmup_steps": 0}, "llama-tiny": {"batch_size": 2}},
            "train": {"batch_size": 2},
        },
    }
    for key, value in changes.items():
        data[key] = value
    return data


def test_each_swept_variant_runs_once_per_value_in_its_place():
    spec = load_study(study_data()).spec()
    labels = [v if isinstance(v, str) else v["label"] for v in spec.variants]
    assert labels == ["llama-tiny", "a lr=0.001", "a lr=0.01", "a lr=0.1", "b lr=0.001", "b lr=0.01", "b lr=0.1"]
    assert spec.variants[6] == {"variant": "llama-tiny", "label": "b lr=0.1", "d_ff": 64}
    assert spec.variant_train["b lr=0.01"] == {"warmup_steps": 0, "lr": 0.01}  # the variant's own options kept
    assert spec.variant_train["a lr=0.1"] == {"lr": 0.1} and spec.variant_train["llama-tiny"] == {"batch_size": 2}
    assert "a" not in spec.variant_train and "b" not in spec.variant_train


def test_the_built_in_study_sweeps_six_learning_rates_and_its_paper_scale_seven():
    study = load_study("small-scale-proxies")
    cpu, paper = study.spec("cpu"), study.spec("paper")
    lrs = {label: train["lr"] for label, train in cpu.variant_train.items()}
    assert sorted({lr for lr in lrs.values()}) == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
    assert "baseline lr=0.3" in lrs and "qk-norm lr=0.001" in lrs and len(cpu.variants) == 12
    assert study.sweep_at("paper").values[0] == 3e-4 and len(paper.variants) == 14
    assert "logits" in cpu.probes and cpu.pairing == "seeds"


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ({"values": [0.1, 0.01]}, "at least 3 values"),
        ({"values": [0.1, 0.01, 0.1]}, "more than once"),
        ({"over": "d_model"}, "not a training option that takes a number"),
        ({"over": "seed"}, "the spec sets it for every run"),
        ({"over": "log_every"}, "how a run is recorded"),
        ({"variants": ["a", "c"]}, r"sweep.variants \['c'\] are not among the spec's variants"),
    ],
)
def test_a_bad_sweep_is_refused_with_what_would_be_right(sweep, message):
    data = study_data()
    data["sweep"] = {**data["sweep"], **sweep}
    with pytest.raises(ConfigError, match=message):
        load_study(data).spec()


def test_what_a_sweep_cannot_share_is_refused():
    data = study_data()
    data["compare"] = {**data["compare"], "variant_train": {"a": {"lr": 0.5}}}
    with pytest.raises(ConfigError, match="variant_train sets lr for 'a', which the sweep varies"):
        load_study(data).spec()
    data["compare"] = {**study_data()["compare"], "reference": "a"}
    with pytest.raises(ConfigError, match="name one of its runs, such as 'a lr=0.001'"):
        load_study(data).spec()
    with pytest.raises(ConfigError, match="at the paper scale changes the study's sweep, and it has none"):
        load_study(study_data(sweep=None, scales={"paper": {"sweep": {"values": [1, 2, 3]}}})).spec("paper")


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ({"a": "llama-tiny"}, "'llama-tiny' is not swept, so it has no sensitivity"),
        ({"a": "a lr=0.1"}, "is not swept"),
    ],
)
def test_a_sensitivity_claim_names_swept_variants(claim, message):
    data = study_data()
    data["claims"] = [{**data["claims"][0], **claim}]
    with pytest.raises(ConfigError, match=message):
        load_study(data).spec()


def test_a_sensitivity_claim_needs_a_sweep_and_is_better_lower():
    with pytest.raises(ConfigError, match="the study has no sweep: block"):
        load_study(study_data(sweep=None)).spec()
    base = study_data()["claims"][0]
    with pytest.raises(ValueError, match="to claim that a is more sensitive than b, swap a and b"):
        Claim(**base, direction="higher")
    with pytest.raises(ValueError, match="drop its split"):
        Claim(**base, split="test_2x")


def wortsman(losses: list[float | None], initial: float) -> float:
    """LR sensitivity as the paper defines it: E over the grid of min(loss, loss_0) - loss*, where
    loss* = min over the grid of loss, and a diverged run's loss is loss_0."""
    as_run = [initial if x is None or math.isnan(x) or math.isinf(x) else x for x in losses]
    best = min(as_run)
    return sum(min(x, initial) - best for x in as_run) / len(as_run)


@pytest.mark.parametrize(
    "losses",
    [
        [2.4, 2.2, 2.5, 2.6, 2.9, 3.0],
        [2.4, 2.2, None, 2.6, float("nan"), float("inf")],  # diverged: None, NaN or inf count as loss_0
        [2.4, 2.2, 6.5, 2.6],  # a finite loss above loss_0 is capped at it
        [2.3, 2.3, 2.3],
    ],
)
def test_the_sensitivity_is_the_papers(losses):
    assert sensitivity(losses, 5.5) == pytest.approx(wortsman(losses, 5.5), abs=1e-12)
    assert sensitivity([2.3, 2.3, 2.3], 5.5) == 0.0


def test_the_sensitivity_is_never_negative_when_every_run_ends_above_the_initial_loss():
    """The best loss is capped at loss_0 as every loss is: a sweep none of whose runs ends below
    its initial loss is as insensitive as it is flat, 0."""
    assert sensitivity([6.0, 7.0, 6.5], 5.5) == 0.0
    assert sensitivity([6.0, 7.0, None], 5.5) == 0.0
    assert sensitivity([6.0, 5.0, 7.0], 5.5) == pytest.approx((5.5 + 5.0 + 5.5) / 3 - 5.0)


SWEEP = Sweep(over="lr", values=[1e-3, 1e-2, 1e-1], variants=["qk", "base"])
LOSSES = {  # by variant and seed, the final test loss at each lr (None: diverged)
    "qk": {0: [2.40, 2.20, 2.45], 1: [2.42, 2.21, 2.50], 2: [2.38, 2.19, 2.44]},
    "base": {0: [2.41, 2.30, None], 1: [2.43, 2.28, 6.0], 2: [2.39, 2.27, float("nan")]},  # 6.0: above loss_0
}
INITIAL = {("qk", 0): 5.6, ("qk", 1): 5.5, ("qk", 2): 5.7, ("base", 0): 5.61, ("base", 1): 5.51, ("base", 2): 5.71}


def sweep_runs(extra_failed: list[Failed] = ()) -> CompareResults:
    """Runs of :data:`SWEEP` whose test perplexity is exp of :data:`LOSSES`; a diverged run is a
    failed one whose error is TrainingDiverged's."""
    runs, failed = [], list(extra_failed)
    for variant, seeds in LOSSES.items():
        for seed, losses in seeds.items():
            for lr, loss in zip(SWEEP.values, losses):
                label = SWEEP.label(variant, lr)
                if loss is None:
                    error = "TrainingDiverged: loss loss became nan at step 7"
                    failed.append(Failed(variant=label, task="python-source", seed=seed, attempts=1, error=error))
                    continue
                run = record(label, seed, math.exp(loss), task="python-source", metric="perplexity", better="lower")
                runs.append(run.model_copy(update={"probes": {"max_attention_logit": 10 * lr}}))
    return CompareResults(spec={"test": "welch", "pairing": "seeds"}, machine={}, runs=runs, skipped=[], failed=failed)


def test_each_seeds_sensitivity_reads_the_runs_and_a_diverged_one_counts_as_the_initial_loss():
    other = Failed(variant="base lr=0.01", task="python-source", seed=3, attempts=3, error="worker died")
    found = sweep_result(SWEEP, sweep_runs([other]), "python-source", lambda v, t, s: INITIAL[(v, s)])
    for variant in ("qk", "base"):
        swept = found.of(variant)
        assert sorted(swept.sensitivity) == [0, 1, 2]  # seed 3 has one run that failed otherwise: left out
        for seed, losses in LOSSES[variant].items():
            assert swept.sensitivity[seed] == pytest.approx(wortsman(losses, INITIAL[(variant, seed)]), abs=1e-9)
    assert found.of("base").missing == ["base lr=0.01, seed 3: worker died"]
    diverged = [p for p in found.of("base").points if p.loss is None]  # failed, or finished with a NaN loss
    assert sorted((p.value, p.seed) for p in diverged) == [(0.1, 0), (0.1, 2)]
    assert found.of("qk").points[0].max_logit == pytest.approx(0.01)


def test_a_sensitivity_claim_is_judged_on_the_per_seed_sensitivities_paired():
    found = sweep_result(SWEEP, sweep_runs(), "python-source", lambda v, t, s: INITIAL[(v, s)])
    claim = Claim(statement="qk is less sensitive", task="python-source", metric="sensitivity", a="qk", b="base")
    outcome = judge(claim.model_copy(update={"effect": 0.05}), sweep_runs(), sweep=found)
    per_seed = [
        wortsman(LOSSES["qk"][s], INITIAL[("qk", s)]) - wortsman(LOSSES["base"][s], INITIAL[("base", s)])
        for s in range(3)
    ]
    assert outcome.paired and outcome.seeds == 3 and outcome.direction == "lower"
    assert outcome.difference == pytest.approx(statistics.fmean(per_seed))
    assert outcome.verdict == "holds", outcome.reason  # qk's sensitivity is far lower at every seed
    with pytest.raises(ConfigError, match="judge it with the study's sweep"):
        judge(claim, sweep_runs())


def test_the_initial_loss_is_the_loss_of_a_run_that_does_not_move(tmp_path):
    """A run at a vanishing learning rate ends where it started: its final test loss is the loss at
    initialisation the sweep computes, for the first variant and for one that takes its initial
    weights from it (pairing: seeds)."""
    from transformer_zoo.comparing.runner import compare

    data = study_data(sweep={"over": "lr", "values": [1e-12, 2e-12, 3e-12], "variants": ["a", "b"]})
    data["compare"] = {**data["compare"], "pairing": "seeds", "variant_train": {}, "train": {"warmup_steps": 0}}
    study = load_study(data)
    spec = study.spec()
    results = compare(spec, tmp_path)
    initial = InitialLosses(spec, study.sweep)
    for variant in ("a", "b"):
        ended = results.by_seed(study.sweep.label(variant, 1e-12), "python-source", "test", "perplexity")[0]
        assert math.log(ended) == pytest.approx(initial(variant, "python-source", 0), abs=1e-5)
    assert initial("a", "python-source", 0) != pytest.approx(initial("b", "python-source", 0), abs=1e-5)


@pytest.mark.slow
def test_the_study_runs_end_to_end_and_draws_its_figures(tmp_path):
    """small-scale-proxies at a tiny size (3 steps, 2 seeds, 3 learning rates, a few windows): the
    verdicts, the sweep's table and both figures, linked from verdict.md and report.md."""
    from transformer_zoo.comparing.studies.running import reproduce

    study = load_study("small-scale-proxies")
    overrides = {
        "steps": 3,
        "seeds": [0, 1],
        "workers": 1,
        "train": {"batch_size": 4},
        "tasks": {"python-source": {"train_tokens": 4096, "test_tokens": 512}},
        "sweep": {"values": [1e-3, 1e-2, 3e-1]},
    }
    result = reproduce(study, tmp_path, overrides=overrides)
    assert [c.claim.metric for c in result.claims] == ["sensitivity", "max_attention_logit"]
    assert all(c.seeds == 2 and c.paired for c in result.claims)
    figures = ["sweep-loss-python-source.png", "sweep-logits-python-source.png"]
    assert result.plots == figures
    for name in figures:
        assert (tmp_path / name).stat().st_size > 10_000
        for page in ("verdict.md", "report.md"):
            assert f"![{name}]({name})" in (tmp_path / page).read_text()
    saved = json.loads((tmp_path / "verdict.json").read_text())
    [swept] = saved["sweeps"]
    assert swept["over"] == "lr" and [v["variant"] for v in swept["variants"]] == ["baseline", "qk-norm"]
    assert all(len(v["sensitivity"]) == 2 and len(v["points"]) == 6 for v in swept["variants"])
    assert "| baseline | 0.3 |" in (tmp_path / "verdict.md").read_text()


def probed_runs(logits: dict[str, dict[int, float | None]], failed: dict[tuple[str, int], str]) -> CompareResults:
    """Finished runs that measured ``logits`` (by label and seed; None: no measurement), and failed
    runs with their errors, paired by seed."""
    runs = [
        record(label, seed, math.exp(2.5), task="python-source", metric="perplexity", better="lower").model_copy(
            update={"probes": {} if value is None else {"max_attention_logit": value}}
        )
        for label, by_seed in logits.items()
        for seed, value in by_seed.items()
    ]
    failures = [
        Failed(variant=label, task="python-source", seed=seed, attempts=1, error=error)
        for (label, seed), error in failed.items()
    ]
    return CompareResults(
        spec={"test": "welch", "pairing": "seeds"}, machine={}, runs=runs, skipped=[], failed=failures
    )


LOGIT_CLAIM = Claim(
    statement="the baseline's largest logit exceeds qk's at the highest lr",
    task="python-source",
    metric="max_attention_logit",
    a="base lr=0.1",
    b="qk lr=0.1",
    direction="higher",
)
DIVERGED = "TrainingDiverged: loss became nan at step 7"


def test_a_claim_on_a_probe_names_the_runs_without_a_figure_and_the_seeds_left_out_of_the_pairing():
    """A run that diverged records no probe: its seed leaves the pairing, and the reason says which."""
    results = probed_runs(
        {"base lr=0.1": {1: 40.0, 2: 44.0, 4: None}, "qk lr=0.1": {0: 5.0, 1: 6.0, 2: 5.5, 3: 6.5, 4: 5.0}},
        {("base lr=0.1", 0): DIVERGED, ("base lr=0.1", 3): "worker died\nmore"},
    )
    outcome = judge(LOGIT_CLAIM, results)
    assert outcome.seeds == 2 and outcome.paired and outcome.difference == pytest.approx((34.0 + 38.5) / 2)
    assert outcome.reason.endswith(
        "; seeds 0, 3, 4 left out of the pairing, a side having no figure there; runs without a figure: "
        "base lr=0.1, seed 0: diverged; base lr=0.1, seed 3: worker died; base lr=0.1, seed 4: no "
        "max_attention_logit recorded"
    ), outcome.reason


def test_a_claim_whose_every_run_of_a_side_diverged_is_inconclusive_and_the_study_keeps_its_verdict():
    """Every seed of the baseline's highest learning rate diverged: the claim on its probe is not
    judged (inconclusive, naming the runs), and the study's other claims and verdict stand."""
    failed = {("base lr=0.1", seed): DIVERGED for seed in (0, 1)}
    results = probed_runs({"qk lr=0.1": {0: 5.0, 1: 6.0}}, failed)
    outcome = judge(LOGIT_CLAIM, results)
    assert (outcome.verdict, outcome.a, outcome.b, outcome.difference, outcome.seeds) == (
        "inconclusive",
        None,
        None,
        None,
        0,
    )
    assert outcome.reason == (
        "not judged: no run of 'base lr=0.1' on 'python-source' recorded test max_attention_logit (runs without a "
        "figure: base lr=0.1, seed 0: diverged; base lr=0.1, seed 1: diverged)"
    )

    data = study_data(sweep={"over": "lr", "values": [0.1, 0.001, 0.01], "variants": ["a", "b"]})
    data["claims"] = [
        *data["claims"],
        {**LOGIT_CLAIM.model_dump(exclude_defaults=True), "a": "b lr=0.1", "b": "a lr=0.1"},
    ]
    data["compare"] = {**data["compare"], "probes": ["logits"], "pairing": "seeds", "seeds": [0, 1]}
    study = load_study(data)
    spec = study.spec()
    runs, failures = {}, {}  # every run ends at a loss of 2.5 but b's at lr 0.1, which diverged at every seed
    for label in (study.sweep.label(variant, lr) for variant in ("a", "b") for lr in (0.1, 0.001, 0.01)):
        for seed in (0, 1):
            if label == "b lr=0.1":
                failures[(label, seed)] = DIVERGED
            else:
                runs.setdefault(label, {})[seed] = 10.0 + seed
    results = probed_runs(runs, failures)
    found = verdict(study, spec, results, "cpu", 1.0, "rerun", sweep=study.sweep, initial=lambda v, t, s: 5.5)
    sensitivity_claim, logit_claim = found.claims
    assert sensitivity_claim.verdict != "inconclusive" and found.verdict == "inconclusive"
    assert logit_claim.verdict == "inconclusive" and "no run of 'b lr=0.1'" in logit_claim.reason
    page = "\n".join(study_lines(found))
    assert "| b lr=0.1: n/a | a lr=0.1: n/a | n/a |" in page
