"""Studies: their files validate, each claim's verdict follows from the intervals over seeds, and
every built-in study runs end to end at a tiny budget and writes a verdict."""

from __future__ import annotations

import json
import math

import pytest
from run_records import record as run_record

from transformer_zoo.cli import main
from transformer_zoo.comparing.records import CompareResults, RunRecord
from transformer_zoo.comparing.studies.running import StudiesFailed, reproduce, reproduce_all
from transformer_zoo.comparing.studies.spec import Claim, available_studies, load_study
from transformer_zoo.comparing.studies.verdicts import judge, overall
from transformer_zoo.core.errors import ConfigError, UnknownNameError
from transformer_zoo.registry import get_registry

NOISE = [0.0, 0.01, -0.01, 0.005, -0.005]


def record(
    variant: str, seed: int, value: float, metric: str = "accuracy", better: str = "higher", probes: dict | None = None
) -> RunRecord:
    return run_record(variant, seed, value, metric=metric, better=better, probes=probes or {})


def results(a: list[float], b: list[float], **kwargs) -> CompareResults:
    runs = [record("a", i, v, **kwargs) for i, v in enumerate(a)] + [
        record("b", i, v, **kwargs) for i, v in enumerate(b)
    ]
    return CompareResults(spec={"test": "welch"}, machine={}, runs=runs, skipped=[])


def claim(**fields) -> Claim:
    return Claim(**{"statement": "a beats b", "task": "listops", "metric": "accuracy", "a": "a", "b": "b", **fields})


def spread(mean: float, width: float = 1.0) -> list[float]:
    return [mean + width * n for n in NOISE]


@pytest.mark.parametrize(
    ("a", "b", "fields", "verdict"),
    [
        (spread(0.8), spread(0.5), {}, "holds"),  # clearly better
        (spread(0.5), spread(0.8), {}, "does not hold"),  # clearly worse
        (spread(0.5, 10), spread(0.52, 10), {}, "inconclusive"),  # within each other's noise
        ([0.0] * 3, [0.0] * 3, {}, "does not hold"),  # identical: no advantage at all
        (spread(0.5), spread(0.5), {"effect": 0.05}, "does not hold"),  # any advantage is below the margin
        (spread(0.5), spread(0.8), {"direction": "lower"}, "holds"),  # lower is better: a's lower mean wins
        (spread(0.50), spread(0.51), {"relation": "not-worse", "effect": 0.05}, "holds"),
        (spread(0.30), spread(0.51), {"relation": "not-worse", "effect": 0.05}, "does not hold"),
        (spread(0.50, 10), spread(0.51, 10), {"relation": "not-worse", "effect": 0.05}, "inconclusive"),
        (spread(0.50), spread(0.51), {"relation": "matches", "effect": 0.05}, "holds"),
        (spread(0.30), spread(0.51), {"relation": "matches", "effect": 0.05}, "does not hold"),
        (spread(0.50, 10), spread(0.51, 10), {"relation": "matches", "effect": 0.05}, "inconclusive"),
        ([0.5, 0.5, 0.5, 0.5], [0.1, 0.9, 0.2, 0.8], {"relation": "steadier"}, "holds"),
        ([0.1, 0.9, 0.2, 0.8], [0.5, 0.5, 0.5, 0.5], {"relation": "steadier"}, "does not hold"),
        ([0.5, 0.6, 0.4], [0.5, 0.61, 0.39], {"relation": "steadier"}, "inconclusive"),
    ],
)
def test_a_claims_verdict_follows_from_the_interval_over_seeds(a, b, fields, verdict):
    result = judge(claim(**fields), results(a, b))
    assert result.verdict == verdict, result.reason
    assert result.a.n == len(a) and result.b.n == len(b)


def lengths(seeds: dict[int, tuple[float, float]]) -> CompareResults:
    """One variant "a" scored on two splits, test and test_4x, by seed."""
    runs = []
    for seed, (short, long) in seeds.items():
        run = record("a", seed, short, metric="perplexity", better="lower")
        runs.append(
            run.model_copy(update={"metrics": {"test": {"perplexity": short}, "test_4x": {"perplexity": long}}})
        )
    return CompareResults(spec={"test": "welch"}, machine={}, runs=runs, skipped=[])


def test_one_variant_on_two_splits_is_judged_seed_by_seed():
    """Each seed's run against itself: a steady gap of 0.2 between lengths is decided although the
    seeds differ by far more than that (an unpaired test could not separate them)."""
    seeds = {0: (10.0, 10.2), 1: (20.0, 20.21), 2: (30.0, 30.19), 3: (15.0, 15.2)}
    worse = judge(claim(metric="perplexity", a="a", b="a", split="test", split_b="test_4x"), lengths(seeds))
    assert worse.verdict == "holds", worse.reason  # lower perplexity at the training length
    assert worse.difference == pytest.approx(-0.2, abs=0.01) and worse.high < 0 and worse.p < 0.01
    flat = claim(metric="perplexity", a="a", b="a", split="test_4x", split_b="test", relation="not-worse", effect=0.5)
    assert judge(flat, lengths(seeds)).verdict == "holds"
    assert judge(flat.model_copy(update={"effect": 0.1}), lengths(seeds)).verdict == "does not hold"
    unpaired = judge(
        claim(metric="perplexity", a="a", b="b", split="test"),
        CompareResults(
            spec={"test": "welch"},
            machine={},
            skipped=[],
            runs=[
                *lengths(seeds).runs,
                *(
                    r.model_copy(update={"variant": "b", "metrics": {"test": r.metrics["test_4x"]}})
                    for r in lengths(seeds).runs
                ),
            ],
        ),
    )
    assert unpaired.verdict == "inconclusive", "the same figures, as two variants, are not separable"
    close = judge(
        claim(metric="perplexity", a="a", b="a", split="test", split_b="test_4x"),
        lengths({0: (10.0, 10.05), 1: (20.0, 20.2), 2: (30.0, 30.0)}),
    )
    assert close.verdict == "inconclusive" and close.seeds_needed is not None and close.seeds_needed < 30, (
        "the seeds needed follow the spread of the per-seed differences, not of the seeds"
    )


def test_a_claim_on_one_variant_needs_two_splits():
    with pytest.raises(ValueError, match="a claim compares two variants, or one variant on two splits"):
        claim(a="a", b="a")
    with pytest.raises(ValueError, match="give split_b"):
        claim(a="a", b="a", split="test", split_b="test")


def test_the_metrics_declared_direction_is_the_default():
    """A lower-is-better metric (a Frechet distance): a's lower values win without a direction."""
    result = judge(
        claim(metric="frechet_distance"), results(spread(10.0), spread(20.0), metric="frechet_distance", better="lower")
    )
    assert result.verdict == "holds" and result.difference == pytest.approx(-10.0)


def test_a_claim_on_a_probe_reads_the_probe():
    data = CompareResults(
        spec={},
        machine={},
        skipped=[],
        runs=[
            record(v, i, 0.5, probes={"saturated_rows": x + n})
            for v, x in (("a", 0.9), ("b", 0.1))
            for i, n in enumerate(NOISE)
        ],
    )
    result = judge(claim(metric="saturated_rows", direction="higher"), data)
    assert result.verdict == "holds" and result.probe and result.a.mean == pytest.approx(0.9)


def test_one_seed_is_inconclusive():
    assert judge(claim(), results([0.9], [0.1])).verdict == "inconclusive"


def test_a_study_holds_only_when_every_claim_holds():
    assert overall(["holds", "holds"]) == "holds"
    assert overall(["holds", "inconclusive"]) == "inconclusive"
    assert overall(["holds", "does not hold", "inconclusive"]) == "does not hold"


def test_bad_claims_are_refused_with_what_would_be_right():
    with pytest.raises(ValueError, match="needs an effect > 0"):
        claim(relation="matches", effect=0)
    study = load_study("local-vs-global").model_dump()
    study["claims"][0].pop("effect")
    with pytest.raises(ConfigError, match="'matches' claim with no effect"):
        load_study({**study, "effect": None})
    with pytest.raises(ValueError, match="compares two variants"):
        claim(b="a")


STUDIES = [
    "ut-length-generalisation",
    "layernorm-vs-batchnorm",
    "scaled-dot-product",
    "local-vs-global",
    "sagan-attention",
    "multi-head",
    "pre-vs-post-norm",
    "tuned-pre-vs-post-norm",
    "length-extrapolation",
    "modifications",
    "associative-recall",
    "mad",
    "chomsky-hierarchy",
    "small-scale-proxies",
    "modern-modifications",
]


def test_every_scale_of_every_study_validates():
    """Every study's every scale is a valid spec whose runs plan; the paper scale's models (a d 512 UT, say) build,
    on the meta device, which holds no memory."""
    from transformer_zoo.api import on_meta
    from transformer_zoo.comparing.spec import plan
    from transformer_zoo.training.config import model_config_for

    assert sorted(available_studies()) == sorted(STUDIES)
    for name in STUDIES:
        study = load_study(name)
        cpu, gpu, paper = (study.spec(scale) for scale in ("cpu", "gpu", "paper"))
        for spec in (gpu, paper):
            runs = {(label, config.task.kind): config for label, config in plan(spec)[0]}  # a model per variant, task
            assert runs, name
            for (label, _), config in runs.items():
                model = on_meta(model_config_for(config, config.task.build()))
                assert model is not None and sum(p.numel() for p in model.parameters()) > 0, (name, spec.name, label)
        # the gpu scale has eight minutes for every study at once: fewer steps than the cpu scale at times, but larger
        # models, batches and inputs; the paper scale has hours
        assert paper.steps > max(gpu.steps, cpu.steps) and min(len(cpu.seeds), len(gpu.seeds), len(paper.seeds)) >= 3
        assert gpu.seconds is not None and paper.seconds is None, name
        # the gpu scale shares one GPU with the other studies: a few slots each, one CPU thread a run
        assert gpu.workers is None and gpu.threads == 1 and gpu.runs_per_device >= 1, name
        assert paper.workers is None, name


def test_a_scale_the_study_lacks_is_refused_with_the_ones_it_has(tmp_path):
    data = load_study("multi-head").model_dump()
    data["scales"] = {"gpu": data["scales"]["gpu"]}
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"no paper scale \(it has: cpu, gpu\)"):
        load_study(str(path)).spec("paper")


def small_data(study, scale: str = "cpu") -> dict:
    """Overrides that keep a study's runs to a few examples a split and a batch (and short long-test inputs), one
    seed and trial, and one run at a time in this process: what the gpu and paper scales build, at a CPU test's
    cost."""
    overrides = {"steps": 2, "seeds": [0], "workers": 1, "threads": 1, "tasks": {}, "train": {"batch_size": 2}}
    for options in study.spec(scale).tasks:
        fields = type(options).model_fields
        sizes = (("train_size", 64), ("test_size", 4), ("num_train_examples", 64), ("num_test_examples", 4))
        change = {key: value for key, value in sizes if key in fields}
        if "test_lengths" in fields:
            change["test_lengths"] = [41, 44]  # the gpu and paper scales' long tests start past 40
        if "buckets" in fields:  # the Chomsky tasks: one example a length, at each, in one bucket
            change.update(test_stride=1, test_size_per_length=1, buckets=1)
        if "train_tokens" in fields:  # python-source: one input of each length scored, up to the claims' 4L
            change.update(train_tokens=8 * options.max_len, longer=[2, 4], test_tokens=4 * options.max_len)
        overrides["tasks"][options.name] = change
    if study.compare.get("tune"):
        overrides["tune"] = {"trials": 1, "startup_trials": 1}
    model = study.scales.get(scale, {}).get("model", {})
    if "d_model" in model:  # narrower layers: the full widths build on meta
        overrides["model"] = narrow(model)
    return overrides


NARROW = {"d_model": 64, "d_ff": 128}
"""The width :func:`small_data` gives the gpu and paper scales' token models (every scale's own widths build, on the
meta device, in ``test_every_scale_of_every_study_validates``)."""


def narrow(model: dict) -> dict:
    """:data:`NARROW` widths for a scale's ``model`` options, with its heads cut to the most that divide the narrow
    width (a paper scale's 12 heads of 768 become 4 of 64)."""
    heads = model.get("n_heads")
    return NARROW if heads is None else {**NARROW, "n_heads": math.gcd(heads, NARROW["d_model"])}


@pytest.mark.parametrize("name", STUDIES)
def test_every_scale_of_every_study_builds_as_the_end_to_end_test_shrinks_it(name):
    """The specs and models that ``test_every_study_builds_trains_and_is_judged_at_every_scale`` trains (slow at the
    gpu and paper scales), validated and built on the meta device, in seconds: a shrinking that makes a model the
    variant refuses (12 heads of a width of 64) shows in the default run."""
    from transformer_zoo.api import on_meta
    from transformer_zoo.comparing.spec import plan
    from transformer_zoo.training.config import model_config_for

    study = load_study(name)
    for scale in ("cpu", "gpu", "paper"):
        spec = study.spec(scale, small_data(study, scale))
        runs, skipped = plan(spec)
        own = plan(study.spec(scale))[1]
        assert runs, (name, scale)
        assert [(s.variant, s.task) for s in skipped] == [(s.variant, s.task) for s in own], (
            "the shrinking skips nothing the study itself does not",
            [s.reason for s in skipped],
        )
        for label, config in runs:
            model = on_meta(model_config_for(config, config.task.build()))
            assert model is not None and sum(p.numel() for p in model.parameters()) > 0, (name, scale, label)


@pytest.mark.heavy
@pytest.mark.parametrize("scale", ["cpu", *(pytest.param(scale, marks=pytest.mark.slow) for scale in ("gpu", "paper"))])
@pytest.mark.parametrize("name", STUDIES)
def test_every_study_builds_trains_and_is_judged_at_every_scale(name, scale, tmp_path):
    """Each scale's own variants, tasks (lengths up to 40 at the paper scale, say), tuning and claims train a few
    steps on the CPU, and the claims are judged and written; only the data are cut to a few examples, and the gpu and
    paper scales' token models to :data:`NARROW` widths (a run of a d 256 model here took seconds; the same code runs
    at any width). The gpu and paper scales are among the slow tests (``pytest -m slow``): the paper scale takes 10 s
    to 80 s a study even so, and the gpu scale 80 s for all of them. That every scale's spec validates and its models
    build at their own widths is checked in the default run, by ``test_every_scale_of_every_study_validates``."""
    study = load_study(name)
    result = reproduce(study, tmp_path / name, scale, small_data(study, scale))
    spec = study.spec(scale)
    assert result.scale == scale and result.steps == 2 and result.seeds == [0]
    runs = CompareResults.model_validate_json((tmp_path / name / "results.json").read_text()).runs
    widths = {run.parameters for run in runs}
    assert len(runs) >= len(spec.variants) and min(widths) > 0
    assert (f"--scale {scale}" in result.command) == (scale != "cpu")
    assert result.verdict in ("holds", "does not hold", "inconclusive")
    assert all(c.a.n == 1 and c.b.n == 1 for c in result.claims)
    page = (tmp_path / name / "verdict.md").read_text()
    assert result.claims[0].claim.statement in page and result.verdict in page


def test_a_claim_naming_what_the_spec_lacks_fails_before_training(tmp_path):
    study = load_study("multi-head").model_dump()
    for change, message in [
        ({"a": "8 heads"}, "does not run"),
        ({"metric": "bleu"}, "neither a metric"),
        ({"split": "test_long"}, "not one of task"),
        ({"task": "reverse"}, "not one of the spec"),
    ]:
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


def tiny_study(tmp_path, name: str, variant: str = "transformer-tiny", **train) -> str:
    """A study of one's own: one-layer encoders on a short ordered-pair, 2 steps."""
    data = {
        "name": name,
        "title": "t",
        "source": "s",
        "claims": [
            {
                "statement": "four heads beat one",
                "task": "ordered-pair",
                "metric": "accuracy",
                "a": "4 heads",
                "b": "1 head",
            }
        ],
        "compare": {
            "variants": [
                {"variant": variant, "label": "1 head", "n_heads": 1},
                {"variant": variant, "label": "4 heads", "n_heads": 4},
            ],
            "tasks": [{"kind": "ordered-pair", "length": 4, "symbols": 2, "train_size": 32, "test_size": 4}],
            "steps": 2,
            "seeds": [0, 1],
            "workers": 1,
            "threads": 1,
            "model": {"encoder": {"layers": 1}},
            "train": {"batch_size": 4, **train},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(data))
    return str(path)


PLUGIN = """
from transformer_zoo.core.options import Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig
from transformer_zoo.registry import hookimpl


@hookimpl
def tzoo_variants():
    return [Variant(name="transformer-studies-tiny", config=TransformerConfig, defaults={**TINY, "d_ff": 32})]
"""


@pytest.fixture
def plugin_variant(tmp_path, monkeypatch):
    """A plugin's variant, registered here from an importable module; unregistered afterwards."""
    import importlib

    (tmp_path / "zoo_studies_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    get_registry().register(importlib.import_module("zoo_studies_plugin"))
    yield "transformer-studies-tiny"
    get_registry().unregister("zoo_studies_plugin")


@pytest.mark.heavy
def test_studies_side_by_side_each_log_to_their_folder_and_a_failure_spares_the_others(tmp_path, plugin_variant):
    """Studies run at once, each in a process of its own (a plugin registered here reaches them); one whose every
    run fails (its loss diverges) is named with its log, and the others finish and are on the page."""
    good = tiny_study(tmp_path, "good", variant=plugin_variant)
    other = tiny_study(tmp_path, "other")
    bad = tiny_study(tmp_path, "bad", lr=1e6, grad_clip=None, warmup_steps=0)
    out = tmp_path / "out"
    with pytest.raises(StudiesFailed, match=r"1 of 3 studies failed[\s\S]*bad \(exit code 1\)[\s\S]*bad/log.txt"):
        reproduce_all([good, bad, other], out, at_once=2)
    for name in ("good", "other"):
        assert json.loads((out / name / "verdict.json").read_text())["name"] == name
        assert "compared 4 runs" in (out / name / "log.txt").read_text()
    assert "no run of the comparison finished" in (out / "bad" / "log.txt").read_text()
    with pytest.raises(ConfigError, match=r"studies \['good'\] are named more than once"):
        reproduce_all([good, good], out, at_once=2)
    page = (out / "reproductions.md").read_text()
    assert "[good](good/verdict.md)" in page and "[other](other/verdict.md)" in page and "2 at a time" in page


def test_cli_with_a_scale_and_no_name_runs_every_study(monkeypatch, tmp_path, capsys):
    called = {}

    def fake(names, out, scale, overrides, plugins, at_once):
        called.update(names=names, out=out, scale=scale, overrides=overrides, at_once=at_once)
        return []

    monkeypatch.setattr("transformer_zoo.comparing.studies.running.reproduce_all", fake)
    assert main(["reproduce", "--scale", "gpu", "--out", str(tmp_path), "--json"]) == 0
    assert called == {
        "names": list(available_studies()),
        "out": tmp_path,
        "scale": "gpu",
        "overrides": {},
        "at_once": None,
    }
    assert main(["reproduce", "multi-head", "--steps", "5", "--at-once", "2"]) == 0
    assert called["names"] == ["multi-head"] and called["scale"] == "cpu" and called["overrides"] == {"steps": 5}
    assert called["at_once"] == 2
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "--at-once", "0"])
    assert exit_.value.code == 2 and "'0' is not a count" in capsys.readouterr().err


def test_seeds_needed_makes_the_interval_clear_the_boundary():
    from scipy import stats as scipy_stats

    from transformer_zoo.comparing.stats import seeds_needed

    for sd_a, sd_b, gap in [(0.1, 0.1, 0.1), (0.3, 0.05, 0.2), (21.0, 3.4, 5.2)]:
        n = seeds_needed(sd_a, sd_b, gap)
        for seeds, clears in ((n, True), (n - 1, False)):
            va, vb = sd_a**2 / seeds, sd_b**2 / seeds
            df = (va + vb) ** 2 / ((va**2 + vb**2) / (seeds - 1))
            assert (scipy_stats.t.ppf(0.975, df) * (va + vb) ** 0.5 < gap) == clears
    assert seeds_needed(0.1, 0.1, 0.0) is None and seeds_needed(1.0, 1.0, 1e-6) is None


def test_an_inconclusive_claim_says_how_many_seeds_would_decide_it():
    outcome = judge(claim(), results(spread(0.52, 2), spread(0.5, 2)))
    assert outcome.verdict == "inconclusive" and outcome.seeds_needed is not None and outcome.seeds_needed > 5
    assert f"about {outcome.seeds_needed} seeds a side would decide it" in outcome.reason
    decided = judge(claim(), results(spread(0.8), spread(0.5)))
    assert decided.verdict == "holds" and decided.seeds_needed is None


def test_the_sources_figures_stand_beside_ours_and_a_wrong_one_is_refused(tmp_path):
    from transformer_zoo.comparing.studies.verdicts import beside

    study = load_study("ut-length-generalisation")
    assert {(f.variant, f.task, f.metric) for f in study.figures} >= {
        ("ut+offset", "copy", "sequence_accuracy"),
        ("transformer", "reverse", "token_accuracy"),
    }
    data = load_study("multi-head").model_dump()
    data["figures"] = [
        {"variant": "4 heads", "task": "ordered-pair", "metric": "accuracy", "value": 0.9, "where": "Table 1"}
    ]
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(data))
    mine = load_study(str(path))
    runs = [
        record("4 heads", seed, value).model_copy(update={"task": "ordered-pair"})
        for seed, value in enumerate([0.7, 0.8])
    ]
    found = beside(mine.figures[0], CompareResults(spec={}, machine={}, runs=runs, skipped=[]))
    assert found.ours.mean == pytest.approx(0.75) and found.figure.value == 0.9
    data["figures"][0]["variant"] = "8 heads"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="figures.0: no run of variant '8 heads'"):
        load_study(str(path)).spec()


def test_a_claim_whose_runs_stopped_at_the_time_cap_is_not_judged():
    from transformer_zoo.comparing.studies.pages import study_lines
    from transformer_zoo.comparing.studies.verdicts import verdict

    study = load_study("multi-head")
    spec = study.spec("cpu")

    def runs(one_short: bool) -> CompareResults:
        made = [
            record(label, seed, value).model_copy(update={"task": "ordered-pair", "steps": spec.steps})
            for label, value in (("4 heads", 1.0), ("1 head", 0.5))
            for seed, value in enumerate(spread(value))
        ]
        if one_short:
            made[-1] = made[-1].model_copy(update={"steps": spec.steps - 300})
        return CompareResults(spec={"test": "welch"}, machine={}, runs=made, skipped=[])

    assert verdict(study, spec, runs(False), "cpu", 1.0, "x").claims[0].verdict == "holds"
    capped = verdict(study, spec, runs(True), "cpu", 1.0, "x")
    assert capped.verdict == "inconclusive" and capped.short_runs == [
        "1 head on ordered-pair, seed 4: 500 of 800 steps"
    ]
    assert capped.claims[0].reason.startswith("not judged: 1 of its runs stopped at the time cap")
    assert "as measured, holds" in capped.claims[0].reason
    assert "stopped at the time cap before their steps" in "\n".join(study_lines(capped))


def test_a_runs_planned_steps_come_from_its_own_plan_tuned_twins_included():
    from transformer_zoo.comparing.spec import CompareSpec
    from transformer_zoo.comparing.studies.verdicts import short_runs

    spec = load_study("tuned-pre-vs-post-norm").spec("cpu")
    spec = CompareSpec.model_validate({**spec.model_dump(), "variant_train": {"post-ln": {"steps": 300}}})

    def run(label: str, steps: int) -> RunRecord:
        return record(label, 0, 0.5).model_copy(update={"task": "reverse", "steps": steps})

    made = [run("pre-ln", 400), run("post-ln", 300), run("pre-ln tuned", 400), run("post-ln tuned", 300)]
    assert short_runs(spec, CompareResults(spec={}, machine={}, runs=made, skipped=[])) == []
    made[3] = run("post-ln tuned", 250)
    found = short_runs(spec, CompareResults(spec={}, machine={}, runs=made, skipped=[]))
    assert [text for _, _, text in found] == ["post-ln tuned on reverse, seed 0: 250 of 300 steps"]


@pytest.mark.heavy
def test_tuning_in_the_modifications_study_reads_only_the_training_split(tmp_path, monkeypatch):
    """Every read of the corpus while the variants are tuned is of its train split (the validation rows are carved
    from it); the comparison after it scores the test split. Four of the study's variants, a few steps each."""
    from transformer_zoo.comparing import runner
    from transformer_zoo.plugins.tasks.python_source import PythonSourceTask

    reads, phase = [], ["compare"]
    dataset, run_tuning = PythonSourceTask.dataset, runner.run_tuning

    def counted(self, split):
        reads.append((phase[0], split))
        return dataset(self, split)

    def tuning(*args, **kwargs):
        phase[0] = "tuning"
        try:
            return run_tuning(*args, **kwargs)
        finally:
            phase[0] = "compare"

    monkeypatch.setattr(PythonSourceTask, "dataset", counted)
    monkeypatch.setattr(runner, "run_tuning", tuning)
    study = load_study("modifications")
    variants = [v for v in study.compare["variants"] if v["label"] in ("vanilla", "rmsnorm", "swiglu", "geglu")]
    result = reproduce(study, tmp_path, "cpu", {**small_data(study), "variants": variants})
    assert {split for when, split in reads if when == "tuning"} == {"train"}
    assert ("compare", "test") in reads
    saved = CompareResults.model_validate_json((tmp_path / "results.json").read_text())
    assert {t.variant for t in saved.tuning} == {"vanilla", "rmsnorm", "swiglu", "geglu"}
    assert [t.family for t in result.tallies] == ["untuned", "tuned"] and len(result.tallies[1].rows) == 3
