"""tzoo compare: planning before training, the report folder, and resuming."""

from __future__ import annotations

import json
import random
from typing import ClassVar, Literal

import datasets
import jsonschema
import pytest

import transformer_zoo as tz
from transformer_zoo.cli import main
from transformer_zoo.comparing.records import CompareResults
from transformer_zoo.comparing.runner import compare
from transformer_zoo.comparing.spec import load_spec, plan
from transformer_zoo.registry import get_registry

TASKS = [
    {"kind": "reverse", "train_size": 200, "test_size": 10, "train_lengths": [1, 5], "test_lengths": [6, 7]},
    {"kind": "listops", "train_size": 200, "test_size": 10, "max_length": 32},
]


def small_spec(**overrides):
    return load_spec(
        {
            "name": "smoke",
            "variants": ["transformer-tiny", {"variant": "transformer-tiny", "decoder": None}],
            "tasks": TASKS,
            "steps": 6,
            "seeds": [0, 1],
            "train": {"batch_size": 4},
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, compare(small_spec(), out)


def test_report_folder_has_the_three_kinds_of_output(report):
    out, results = report
    data = json.loads((out / "results.json").read_text())
    jsonschema.validate(data, CompareResults.model_json_schema())
    assert len(data["runs"]) == 6  # 2 variants x 2 tasks x 2 seeds, less the encoder-only model on reverse x 2
    assert data["skipped"] == [
        {
            "variant": 'transformer-tiny {"decoder"=null}',
            "task": "reverse",
            "reason": "variant 'transformer-tiny' cannot do task 'reverse': a seq2seq task needs an encoder-decoder model",
        }
    ]
    for run in data["runs"]:
        assert run["parameters"] > 0 and run["train_tokens_per_second"] > 0 and run["peak_memory_mb"] > 0
        assert 2 * run["parameters"] < run["flops_per_token"] < 20 * run["parameters"]
        assert run["steps"] == 6 and run["curve"][-1]["step"] == 6
        assert 0 <= run["metrics"]["test"][run["metric"]] <= 1
    majority = get_registry().component("task", "listops").model_validate(TASKS[1]).build().majority_accuracy("test")
    assert data["baselines"] == {"listops": {"accuracy": majority}}, "reverse has no trivial baseline"
    text = (out / "report.md").read_text()
    assert f"Majority-class baseline: test accuracy {majority:.3f}." in text
    assert "## reverse" in text and "## listops" in text and "## Not run" in text
    assert text.index("## Summary") < text.index("## reverse") < text.index("## Runs") < text.index("```yaml"), (
        "the findings first, the spec last"
    )
    assert "| variant | seeds |" in text and "Against the reference, transformer-tiny" in text
    assert "Machine:" in text
    for run in data["runs"]:
        assert run["threads"] >= 1 and run["cpus"] >= 1 and run["started"] and run["load_average"] >= 0
        assert run["invocation"] == data["invocation"] and not run["reused"]
    assert [s["task"] for s in data["summaries"]] == ["reverse", "listops"]
    for png in ("curves-reverse.png", "curves-listops.png", "metric-vs-parameters.png", "throughput.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_seeds_give_different_runs_and_same_budget(report):
    _, results = report
    listops = [r for r in results.runs if r.task == "listops" and r.variant == "transformer-tiny"]
    assert {r.seed for r in listops} == {0, 1}
    assert listops[0].curve != listops[1].curve


def test_a_rerun_reuses_finished_runs_and_flags_them(report):
    out, results = report
    again = compare(small_spec(), out)  # retraining would change wall times and throughputs
    assert all(r.reused for r in again.runs)
    assert [r.model_dump(exclude={"reused"}) for r in again.runs] == [
        r.model_dump(exclude={"reused"}) for r in results.runs
    ]
    text = (out / "report.md").read_text()
    assert "6 of 6 runs (marked †) were kept from an earlier invocation" in text
    assert not any(s.costs_comparable for s in again.summaries), "times of another invocation are never compared"
    assert all(c.best is None for s in again.summaries for c in s.columns if c.name in ("train tokens/s", "wall s"))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"variants": ["transfomer-tiny"]}, tz.UnknownNameError, "did you mean 'transformer-tiny'"),
        ({"tasks": ["revers"]}, tz.ConfigError, "unknown task kind 'revers'"),
        (
            {"variants": [{"variant": "transformer-tiny", "decoder": None}], "tasks": ["reverse"]},
            tz.ConfigError,
            "no variant in the spec can do any of its tasks",
        ),
        ({"train": {"batch_sise": 4}}, tz.ConfigError, "unknown key 'batch_sise'"),
        (
            {"model": {"dropuot": 0.0}},
            tz.ConfigError,
            r"model options \['dropuot'\] are fields of none of its variants",
        ),
        ({"reference": "bert-tiny"}, tz.ConfigError, "reference 'bert-tiny' is not one of the spec's variants"),
        ({"tasks": [TASKS[1], TASKS[1]]}, tz.ConfigError, "tasks name 'listops' more than once"),
        ({"seeds": [0, 0]}, tz.ConfigError, r"seeds \[0, 0\] name a seed twice"),
    ],
)
def test_bad_specs_fail_before_any_training(change, error, message, tmp_path):
    with pytest.raises(error, match=message):
        compare(small_spec(**change), tmp_path / "out")
    assert not (tmp_path / "out").exists(), "nothing was written, no run started"


def test_cli_errors_for_a_bad_spec(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("variants: [transformer-tiny]\ntasks: [reverse]\nsteps: 0\n")
    assert main(["compare", str(spec), "--out", str(tmp_path / "out")]) == 2
    assert "steps: Input should be greater than or equal to 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_default_spec_covers_the_required_tasks_and_every_family():
    spec = load_spec()
    kinds = {task.kind for task in spec.tasks}
    assert {"listops", "digits"} <= kinds
    assert kinds & {"copy", "reverse", "sort", "addition"}, "at least one seq2seq task"
    families = {
        tz.load_config({"variant": v} if isinstance(v, str) else {k: w for k, w in v.items() if k != "label"}).family
        for v in spec.variants
    }
    registry = get_registry()
    builtin = [name for name in registry.variants() if registry.provider("variant", name).startswith("tzoo.")]
    assert families == {registry.variant(name).config.family for name in builtin}
    runs, skipped = plan(spec)
    ran = {
        tz.load_config(config.model if isinstance(config.model, dict) else {"variant": config.model}).family
        for _, config in runs
    }
    assert ran == families, "every family runs on at least one task"
    assert [(s.variant, s.task) for s in skipped] == [
        ("transformer-tiny", "digits-generation"),  # generation needs an image generator
        ("bert-tiny", "reverse"),
        ("bert-tiny", "digits-generation"),  # and seq2seq a decoder
        ("bert-tiny", "python-source"),  # and language modelling a causal stack
        ("bert-tiny", "mqar"),  # as does recall, a language model's task
        ("universal-transformer-tiny", "digits-generation"),
        ("local-global-encoder-tiny", "reverse"),
        ("local-global-encoder-tiny", "digits-generation"),
        ("local-global-encoder-tiny", "python-source"),
        ("local-global-encoder-tiny", "mqar"),
        ("vit-tiny", "reverse"),
        ("vit-tiny", "listops"),
        ("vit-tiny", "digits-generation"),  # image models need images
        ("vit-tiny", "python-source"),
        ("vit-tiny", "mqar"),
        ("sagan-classifier-tiny", "reverse"),
        ("sagan-classifier-tiny", "listops"),
        ("sagan-classifier-tiny", "digits-generation"),
        ("sagan-classifier-tiny", "python-source"),
        ("sagan-classifier-tiny", "mqar"),
        ("sagan-gan", "reverse"),
        ("sagan-gan", "listops"),
        ("sagan-gan", "digits"),  # a generator, not a classifier
        ("sagan-gan", "python-source"),
        ("sagan-gan", "mqar"),
        ("llama-tiny", "reverse"),  # a decoder-only LM: no encoder, no classification head
        ("llama-tiny", "listops"),
        ("llama-tiny", "digits"),
        ("llama-tiny", "digits-generation"),
        ("llama-tiny-linear", "reverse"),
        ("llama-tiny-linear", "listops"),
        ("llama-tiny-linear", "digits"),
        ("llama-tiny-linear", "digits-generation"),
    ]
    gan = next(config for label, config in runs if label == "sagan-gan")
    assert (gan.lr, gan.schedule, gan.warmup_steps, gan.batch_size, gan.steps) == (4e-4, "constant", 0, 32, 600), (
        "the GAN's recipe and budget"
    )


def test_flops_are_counted_with_the_steps_a_recurrent_stack_runs(tmp_path):
    """The same parameters applied twice as often cost about twice the FLOPs."""
    from transformer_zoo.comparing.runner import training_step_costs
    from transformer_zoo.training.config import load_train_config
    from transformer_zoo.training.trainer import load_run, train

    flops = {}
    for steps in (2, 4):
        stack = {"kind": "recurrent", "layers": steps, "act": False}
        config = load_train_config(
            {
                "model": {"variant": "universal-transformer-tiny", "encoder": stack, "decoder": stack},
                "task": TASKS[0],
                "steps": 1,
                "batch_size": 4,
            }
        )
        train(config, tmp_path / str(steps), progress=False)
        _, task, model = load_run(tmp_path / str(steps))
        flops[steps], _ = training_step_costs(model, task, config)
    assert 1.5 < flops[4] / flops[2] < 2.0, flops  # the head and embeddings do not grow with steps


def test_default_spec_measures_the_local_global_family_against_full_attention_at_long_lengths():
    spec = load_spec()
    assert "local-global-encoder-tiny" in spec.variants
    assert spec.scaling is not None and spec.scaling.task == "listops"
    assert max(spec.scaling.lengths) >= 4096 and {"sdpa", "math"} <= set(spec.scaling.references)


def test_a_generation_task_reports_its_real_image_baseline_and_a_grid_of_samples(tmp_path):
    gan = {"variant": "sagan-gan", "generator_widths": [16, 16, 8], "discriminator_widths": [8, 16, 16], "reduction": 4}
    spec = load_spec(
        {
            "name": "gan",
            "variants": [gan],
            "tasks": ["digits-generation"],
            "steps": 2,
            "seeds": [0],
            "train": {"batch_size": 8, "lr": 0.1},
            "task_train": {"digits-generation": {"lr": 4e-4}},
        }
    )
    results = compare(spec, tmp_path)
    (run,) = results.runs
    assert json.loads((tmp_path / run.samples_plot).parent.joinpath("train.json").read_text())["lr"] == 4e-4
    assert {"loss_discriminator", "loss_generator"} <= set(run.curve[-1])
    assert run.metric == "frechet_distance" and run.flops_per_token > 0
    real = results.baselines["digits-generation"]
    text = (tmp_path / "report.md").read_text()
    assert (
        f"Real digits (the classifier on the test images; training images against them): test classifier_accuracy {real['classifier_accuracy']:.3f}, "
        f"test frechet_distance {real['frechet_distance']:.3f}."
    ) in text
    assert f"![{run.variant} samples on digits-generation]({run.samples_plot})" in text
    assert (tmp_path / run.samples_plot).read_bytes()[:4] == b"\x89PNG"


def test_task_train_must_name_tasks_of_the_spec():
    with pytest.raises(tz.ConfigError, match=r"task_train names \['digits'\], which are not among the spec's tasks"):
        small_spec(task_train={"digits": {"lr": 0.1}})


PLUGIN = """
from transformer_zoo.core.options import Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig
from transformer_zoo.registry import hookimpl


@hookimpl
def tzoo_variants():
    return [Variant(name="transformer-narrow-tiny", config=TransformerConfig, defaults={**TINY, "d_ff": 32})]
"""
ONE_TASK = {"variants": ["transformer-narrow-tiny"], "tasks": [TASKS[1]], "steps": 3, "train": {"batch_size": 4}}


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """An importable plugin module that nothing has registered yet; unregistered afterwards."""
    (tmp_path / "zoo_narrow_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zoo_narrow_plugin"
    if get_registry().pm.has_plugin("zoo_narrow_plugin"):
        get_registry().unregister("zoo_narrow_plugin")


def test_a_plugin_registered_in_process_reaches_the_workers(plugin_module, tmp_path):
    import importlib

    get_registry().register(importlib.import_module(plugin_module))
    results = compare(load_spec({**ONE_TASK, "seeds": [0]}), tmp_path / "out")
    assert [(r.variant, r.seed) for r in results.runs] == [("transformer-narrow-tiny", 0)]


def test_plugin_and_seeds_on_the_command_line(plugin_module, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**ONE_TASK, "seeds": [0, 1]}))
    out = tmp_path / "out"
    assert main(["compare", str(spec), "--plugin", plugin_module, "--seeds", "5", "--out", str(out), "--json"]) == 0
    printed = capsys.readouterr()
    data = json.loads(printed.out)
    assert [run["seed"] for run in data["runs"]] == [5] and data["spec"]["seeds"] == [5]
    assert "[1/1] transformer-narrow-tiny on listops (seed 5): accuracy " in printed.err
    assert "\r" not in printed.err, "progress written to a file or pipe is one line per run, with no bar"
    with pytest.raises(SystemExit):
        main(["compare", str(spec), "--seeds", "one", "--out", str(out)])
    assert "'one' in 'one' is not a whole number; give seeds such as 0,1,2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ("0,,1", "'0,,1' has an empty item; give whole numbers separated by single commas"),
        ("0,1,", "'0,1,' has an empty item"),
        ("-1", "-1 in '-1' is negative; a seed is a whole number of 0 or more"),
        ("2,-3", "-3 in '2,-3' is negative"),
        ("1.5", "'1.5' in '1.5' is not a whole number"),
        ("1,1", "'1,1' names a seed twice"),
    ],
)
def test_seeds_on_the_command_line_are_checked_by_their_own_message(tmp_path, capsys, seeds, message):
    for command in (["compare", str(tmp_path / "spec.yaml")], ["reproduce", "multi-head"]):
        with pytest.raises(SystemExit) as exited:
            main([*command, f"--seeds={seeds}", "--out", str(tmp_path / "out")])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --seeds: {message}" in err and "spec" not in err.splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_compare_of_a_missing_spec_says_what_it_takes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "transformer-tiny"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "error: compare spec file 'transformer-tiny' does not exist; give the path of a YAML or JSON spec (its "
        "variants, tasks and seeds; docs: Comparing), or no spec for the built-in comparison"
    )
    assert "variant name" not in line and list(tmp_path.iterdir()) == []


def test_a_plugin_defined_in_a_notebook_keeps_the_runs_in_process(tmp_path, capsys):
    from transformer_zoo.core.options import Variant
    from transformer_zoo.plugins.transformer import TINY, TransformerConfig
    from transformer_zoo.registry import hookimpl

    class Inline:  # defined here, as in a notebook cell: no module another process could import
        @hookimpl
        def tzoo_variants(self):
            return [Variant(name="transformer-inline-tiny", config=TransformerConfig, defaults={**TINY, "d_ff": 48})]

    registry = get_registry()
    registry.register(Inline(), "inline")
    try:
        spec = load_spec({**ONE_TASK, "variants": ["transformer-inline-tiny"], "seeds": [0, 1], "workers": 2})
        results = compare(spec, tmp_path / "out")
    finally:
        registry.unregister("inline")
    assert [(r.variant, r.seed) for r in results.runs] == [
        ("transformer-inline-tiny", 0),
        ("transformer-inline-tiny", 1),
    ]
    err = capsys.readouterr().err
    assert "plugin(s) inline are not importable modules" in err and "2 runs, 1 at a time" in err


def test_tzoo_plugins_names_modules_to_load(plugin_module, monkeypatch):
    from transformer_zoo.registry.manager import PluginWarning, Registry

    monkeypatch.setenv("TZOO_PLUGINS", f" {plugin_module}, ")
    assert "transformer-narrow-tiny" in Registry().load().variants()
    monkeypatch.setenv("TZOO_PLUGINS", "no_such_zoo_plugin")
    with pytest.warns(PluginWarning, match="no_such_zoo_plugin"):
        registry = Registry().load()
    assert "No module named 'no_such_zoo_plugin'" in registry.load_errors["no_such_zoo_plugin"]
    monkeypatch.delenv("TZOO_PLUGINS")  # before the fixture's teardown loads the process's registry


def test_peak_memory_of_a_step_is_exact_and_grows_with_the_batch(tmp_path):
    """The same step counted twice gives the same bytes (no process history in it), and at least
    the weights, their gradients and AdamW's two moments."""
    from transformer_zoo.comparing.runner import training_step_costs
    from transformer_zoo.training.config import load_train_config
    from transformer_zoo.training.trainer import load_run, train

    config = load_train_config({"model": "transformer-tiny", "task": TASKS[1], "steps": 1, "batch_size": 4})
    train(config, tmp_path / "run", progress=False)
    _, task, model = load_run(tmp_path / "run")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    first, second = (training_step_costs(model, task, config)[1] for _ in range(2))
    assert first == second and first > 4 * weights
    larger = training_step_costs(model, task, config.model_copy(update={"batch_size": 16}))[1]
    assert larger > first, "activations grow with the batch"


def test_model_options_reach_every_variant_that_has_the_field():
    spec = load_spec(
        {
            "variants": ["transformer-tiny", "sagan-classifier-tiny", {"variant": "vit-tiny", "dropout": 0.2}],
            "tasks": ["digits"],
            "model": {"dropout": 0.0},
            "seeds": [0],
        }
    )
    runs, _ = plan(spec)
    models = {label: config.model for label, config in runs}
    assert models["transformer-tiny"] == {"variant": "transformer-tiny", "dropout": 0.0}
    assert models["sagan-classifier-tiny"] == "sagan-classifier-tiny", "it has no dropout to turn off"
    assert models['vit-tiny {"dropout"=0.2}'] == {"variant": "vit-tiny", "dropout": 0.2}, "a variant's own value wins"


def test_a_task_of_its_own_with_a_lower_is_better_metric_is_read_that_way(tmp_path):
    """A task plugin declares its inputs and metrics; the summary, the report and the plot follow
    its directions with no library file naming them."""
    from transformer_zoo.comparing import plots
    from transformer_zoo.core.tasks import ClassificationTask, TaskOptions
    from transformer_zoo.registry import hookimpl

    class ParityErrors(TaskOptions):
        kind: Literal["parity-errors"] = "parity-errors"

        def build(self):
            return ParityErrorsTask(self)

    class ParityErrorsTask(ClassificationTask):
        inputs: ClassVar[frozenset[str]] = frozenset({"tokens"})
        metrics: ClassVar[dict] = {"error_rate": "lower", "accuracy": "higher"}
        splits: ClassVar[tuple[str, ...]] = ("train", "test")
        vocab_size, num_classes = 8, 2

        def __init__(self, options):
            self.options = options

        def dataset(self, split):
            rng = random.Random(split)
            rows = [[rng.randrange(3, 8) for _ in range(6)] for _ in range(32)]
            return datasets.Dataset.from_dict({"src": rows, "label": [sum(row) % 2 for row in rows]})

        def evaluate(self, model, split, batch_size=128):
            accuracy = super().evaluate(model, split, batch_size)["accuracy"]
            return {"error_rate": 1 - accuracy, "accuracy": accuracy}

    class Inline:
        @hookimpl
        def tzoo_tasks(self):
            return [ParityErrors]

    registry = get_registry()
    registry.register(Inline(), "inline-task")
    try:
        spec = load_spec(
            {
                "variants": ["transformer-tiny", "vit-tiny"],
                "tasks": ["parity-errors"],
                "steps": 2,
                "seeds": [0],
                "train": {"batch_size": 4},
            }
        )
        results = compare(spec, tmp_path)
    finally:
        registry.unregister("inline-task")
    (run,) = results.runs
    assert run.metric == "error_rate" and run.better == {"error_rate": "lower", "accuracy": "higher"}
    assert [s.reason for s in results.skipped] == [
        (
            "variant 'vit-tiny' cannot do task 'parity-errors': the model reads images, and this task has none (it "
            "offers tokens)"
        )
    ]
    (summary,) = results.summaries
    assert {c.name: c.better for c in summary.columns if c.kind == "metric"} == {
        "test accuracy": "higher",
        "test error_rate": "lower",
    }
    panel = next(ax for ax in plots.metric_figure(results.runs).axes if ax.get_title())
    assert panel.get_ylabel() == "test error rate (lower is better)"


def test_a_specs_problems_come_out_together_each_variant_named_by_its_entry(tmp_path):
    nystrom = {"variant": "bert-tiny", "label": "nystrom-4", "d_model": 0}
    spec = small_spec(variants=["transformer-tiny", nystrom, "transfomer-tiny"], train={"batch_sise": 4})
    with pytest.raises(tz.ConfigError) as caught:
        compare(spec, tmp_path / "out")
    message = str(caught.value)
    assert message.startswith("invalid compare spec, 3 problems:\n"), message
    assert "\n  variants.1 ('nystrom-4'): invalid config for variant 'bert-tiny':\n    d_model: " in message
    assert "\n  variants.2 ('transfomer-tiny'): unknown variant 'transfomer-tiny'; did you mean" in message
    assert message.count("unknown key 'batch_sise'") == 1, "a problem every run shares, once"
    assert not (tmp_path / "out").exists()


def test_the_sections_checked_against_each_other_are_refused_together():
    with pytest.raises(tz.ConfigError) as caught:
        small_spec(seeds=[0, 0], reference="bert-tiny", task_train={"digits": {"lr": 0.1}})
    lines = str(caught.value).splitlines()
    assert lines[0] == "invalid compare spec:" and len(lines) == 4
    assert "name a seed twice" in lines[1] and "reference 'bert-tiny'" in lines[2] and "task_train names" in lines[3]


def test_compare_reads_as_its_stages():
    import ast
    import inspect

    from transformer_zoo.comparing import runner

    source = inspect.getsource(runner.compare)
    assert len(source.splitlines()) <= 45, "compare calls its stages; each stage is a function of its own"
    calls = sorted(
        (node.lineno, node.func.id)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    )
    stages = [name for _, name in calls if name in ("plan", "tune_runs", "train_runs", "summarize_runs")]
    assert stages == ["plan", "tune_runs", "train_runs", "summarize_runs"]
