"""Tuning before comparing: the spec's tune: section, the validation split carved from the training
data (the test splits are never read while tuning), a planted optimum that tuning finds, pruning,
and an interrupted tuning that resumes without running its ended trials again."""

from __future__ import annotations

import functools
import json
from typing import Any, ClassVar, Literal

import numpy as np
import pytest

import transformer_zoo as tz
from transformer_zoo.comparing import runner, tuning
from transformer_zoo.comparing.runner import ComparisonInterrupted, compare
from transformer_zoo.comparing.spec import load_spec
from transformer_zoo.comparing.tuning import rung_steps, with_values
from transformer_zoo.core.tasks import ClassificationTask, TaskOptions
from transformer_zoo.registry import get_registry, hookimpl
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.holdout import carve, held_out

optuna = pytest.importorskip("optuna")

READS: list[tuple[str, str]] = []  # (phase, split) of every dataset read of the counting task
PHASE = ["compare"]


class Presence(TaskOptions):
    """Does token 5 occur in the sequence? Counts every read of its splits."""

    kind: Literal["presence"] = "presence"
    train_size: int = 1200
    test_size: int = 200

    def build(self) -> PresenceTask:
        return PresenceTask(self)


class PresenceTask(ClassificationTask):
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    vocab_size = 14
    num_classes = 2

    def __init__(self, options: Presence) -> None:
        self.options = options

    def dataset(self, split: str):
        READS.append((PHASE[0], split))
        return self._rows(split)

    @functools.cache  # the task lives as long as the test
    def _rows(self, split: str):
        import datasets

        rng = np.random.default_rng(0 if split == "train" else 1)
        size = self.options.train_size if split == "train" else self.options.test_size
        src = rng.integers(3, 13, (size, 8))
        return datasets.Dataset.from_dict({"src": src.tolist(), "label": (src == 5).any(1).astype(int).tolist()})


class PresencePlugin:  # defined in this module: the runs train in this process, so the reads are counted here
    @hookimpl
    def tzoo_tasks(self):
        return [Presence]


@pytest.fixture
def presence():
    registry = get_registry()
    registry.register(PresencePlugin(), "presence")
    READS.clear()
    yield
    registry.unregister("presence")


def spec(**tune: Any) -> Any:
    """Two encoders, one of which is given a learning rate 300x too small: a planted optimum far
    from its default."""
    return load_spec(
        {
            "name": "tuned",
            "variants": [
                {"variant": "transformer-tiny", "decoder": None, "label": "plain"},
                {"variant": "transformer-tiny", "decoder": None, "label": "slow"},
            ],
            "tasks": [{"kind": "presence"}],
            "steps": 40,
            "seeds": [0, 1, 2],
            "train": {"batch_size": 32, "lr": 3e-3, "warmup_steps": 0},
            "model": {"dropout": 0.0},
            "variant_train": {"slow": {"lr": 1e-5}},
            "tune": {
                "trials": 4,
                "space": {"train.lr": [1e-5, 1e-4, 1e-3, 3e-3]},
                "sampler": "grid",
                "validation": 100,
                "rungs": 2,
                "startup_trials": 1,
                **tune,
            },
        }
    )


@pytest.fixture
def phases(monkeypatch):
    """Mark the reads made while tuning runs."""

    def tuned(*args, **kwargs):
        PHASE[0] = "tuning"
        try:
            return run_tuning(*args, **kwargs)
        finally:
            PHASE[0] = "compare"

    run_tuning = runner.run_tuning
    monkeypatch.setattr(runner, "run_tuning", tuned)


def test_tuning_finds_a_planted_optimum_prunes_and_never_reads_the_test_split(presence, phases, tmp_path):
    results = compare(spec(compare="both"), tmp_path)
    tuned = {t.variant: t for t in results.tuning}
    assert tuned["slow"].best["train.lr"] >= 1e-3, "the planted optimum: far above the slow variant's 1e-5"
    assert tuned["slow"].best == tuned["plain"].best, "the same grid and seed: both studies find the same setting"

    tuning_reads = {split for phase, split in READS if phase == "tuning"}
    assert tuning_reads == {"train"}, "tuning reads the train split (carving validation from it), never test"
    assert ("compare", "test") in READS, "the comparison itself scores on the test split"

    summary = results.summaries[0]
    tests = {t.variant: t for t in summary.tests if t.column == "test accuracy"}
    assert tests["slow"].separable and tests["slow"].difference < 0, "untuned, the slow variant loses"
    slow_tuned = tests["slow tuned"]
    assert not slow_tuned.separable or slow_tuned.difference > 0, (
        "tuned, it is not separable from the reference or wins"
    )
    costs = {r.variant: r.tuning_seconds for r in results.runs}
    assert costs["slow"] is None and costs["slow tuned"] > 0, "the tuning budget is in the tuned runs' costs"

    for study in results.tuning:  # the grid's order tries a good rate first: the small ones fall behind it
        assert len(study.trials) == 4 and {t.state for t in study.trials} <= {"complete", "pruned"}
        pruned = [t for t in study.trials if t.state == "pruned"]
        assert pruned and all(t.steps < 40 and t.values["train.lr"] <= 1e-4 for t in pruned)
        assert study.saved_steps == sum(40 - t.steps for t in pruned)
        assert study.trained_steps == 4 * 40 - study.saved_steps

    report = (tmp_path / "report.md").read_text()
    assert "## Tuning" in report and "| slow | " in report and "were not trained" in report
    assert (tmp_path / "tuning-presence.png").is_file()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["tuning"][0]["trials"]) == 4, "results.json keeps every trial"


def test_an_interrupted_tuning_resumes_without_running_ended_trials_again(presence, monkeypatch, tmp_path):
    ran: list[str] = []
    execute = tuning.execute_trial

    def counted(job, config, task):
        ran.append(job.name)
        return execute(job, config, task)

    monkeypatch.setattr(tuning, "execute_trial", counted)
    told = []
    tell = tuning.Tuning.tell

    def interrupting(self, pair, trial, result, error=""):
        if len(told) == 3:
            raise KeyboardInterrupt
        told.append(trial.number)
        return tell(self, pair, trial, result, error)

    small = spec(trials=3, space={"train.lr": [3e-3, 1e-3, 1e-5]}).model_copy(update={"seeds": [0]})
    monkeypatch.setattr(tuning.Tuning, "tell", interrupting)
    with pytest.raises(ComparisonInterrupted, match="3 of 6 trials ended"):
        compare(small, tmp_path)
    first = list(ran)
    assert len(first) == 4
    monkeypatch.setattr(tuning.Tuning, "tell", tell)
    ran.clear()
    results = compare(small, tmp_path)
    assert not set(first[:3]) & set(ran), "the trials that ended are not run again"
    assert first[3] in ran, "the trial the interruption left running is taken up again"
    assert len(ran) == 6 - 3 and all(len(t.trials) == 3 for t in results.tuning)


def test_the_validation_split_is_carved_with_the_seed_and_the_test_splits_are_refused(presence):
    kept, held = carve(100, 0.1, 0)
    assert len(held) == 10 and not set(kept) & set(held) and sorted(kept + held) == list(range(100))
    assert carve(100, 0.1, 0) == (kept, held) and carve(100, 0.1, 1) != (kept, held)
    assert len(carve(100, 25, 0)[1]) == 25, "1 or more: a number of rows"
    task = held_out(Presence().build(), 200, 3)
    assert len(task.dataset("validation")) == 200 and len(task.dataset("train")) == 1000
    assert isinstance(task, PresenceTask) and task.metric == "accuracy"
    with pytest.raises(ValueError, match="split 'test' is not read while settings are chosen"):
        task.dataset("test")


def test_a_trial_config_sets_values_by_path_and_keeps_the_budget_fixed():
    base = load_train_config({"model": "transformer-tiny", "task": "reverse", "steps": 100})
    changed = with_values(base, {"train.lr": 0.01, "model.dropout": 0.2, "model.encoder.layers": 1})
    assert changed.lr == 0.01 and changed.model == {
        "variant": "transformer-tiny",
        "dropout": 0.2,
        "encoder": {"layers": 1},
    }
    assert (
        rung_steps(100, 4) == [25, 50, 75, 100] and rung_steps(10, 4) == [2, 5, 8, 10] and rung_steps(3, 5) == [1, 2, 3]
    )


@pytest.mark.parametrize(
    ("tune", "message"),
    [
        ({"space": {"lr": [1e-3]}}, "starts with neither train. nor model."),
        ({"space": {"train.steps": [10]}}, "is fixed for every trial"),
        ({"space": {"train.lrr": [1e-3]}}, "is not a training option"),
        ({"space": {"train.lr": {"log": [0, 1]}}}, "log needs \\[low, high\\] with 0 < low < high"),
        ({"space": {"train.lr": {"normal": [0, 1]}}}, "must be a list of choices or one of"),
        ({"space": {"train.lr": {"log": [1e-4, 1e-2]}}, "sampler": "grid"}, "sampler grid needs a list of choices"),
        ({"space": {}}, "space is empty"),
    ],
)
def test_a_bad_tune_section_is_refused_before_anything_trains(tune, message):
    with pytest.raises(tz.ConfigError, match=message):
        load_spec({"variants": ["transformer-tiny"], "tasks": ["reverse"], "tune": tune})


def test_a_model_path_a_variant_lacks_is_refused_before_anything_trains(presence, tmp_path):
    with pytest.raises(tz.ConfigError, match="tune: the space does not fit variant 'plain'"):
        compare(spec(space={"model.no_such_field": [1]}), tmp_path)
    assert not (tmp_path / "tuning" / "trials").exists()


def test_tune_on_the_command_line_is_a_tune_spec_as_the_spec_and_the_trials_hold_it():
    import dataclasses

    from transformer_zoo.cli import build_parser
    from transformer_zoo.comparing.tuning import TrialJob, TuneSpec

    assert build_parser().parse_args(["compare", "--tune", "3"]).tune == TuneSpec(trials=3)
    assert build_parser().parse_args(["compare", "--tune", "off"]).tune == "off"
    assert {f.name: f.type for f in dataclasses.fields(TrialJob)}["tune"] == "TuneSpec"


def test_tune_on_the_command_line_sets_the_trials_or_turns_tuning_off(presence, tmp_path, capsys):
    from transformer_zoo.cli import main

    path = tmp_path / "spec.json"
    path.write_text(spec(trials=4).model_dump_json())
    assert main(["compare", str(path), "--out", str(tmp_path / "off"), "--seeds", "0", "--tune", "off", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["tuning"] == [] and off["spec"]["tune"] is None
    assert main(["compare", str(path), "--out", str(tmp_path / "one"), "--seeds", "0", "--tune", "1", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert [len(t["trials"]) for t in one["tuning"]] == [1, 1] and one["spec"]["tune"]["trials"] == 1
    with pytest.raises(SystemExit):
        main(["compare", str(path), "--tune", "0"])
    assert "'0' is neither a number of trials (1 or more) nor off" in capsys.readouterr().err


def test_labels_that_share_a_first_word_get_trial_folders_and_studies_of_their_own(tmp_path):
    from transformer_zoo.comparing.spec import plan
    from transformer_zoo.comparing.tuning import Tuning

    both = load_spec(
        {
            "variants": [
                {"variant": "transformer-tiny", "norm_placement": "pre"},
                {"variant": "transformer-tiny", "norm_placement": "post"},
            ],
            "tasks": ["reverse"],
            "tune": {"trials": 2},
        }
    )
    runs, _ = plan(both)
    found = Tuning(both.tune, runs, {"reverse": ("token_accuracy", "higher")}, tmp_path)
    pairs = list(found.studies)
    assert len(pairs) == 2 and pairs[0][0].split(" ")[0] == pairs[1][0].split(" ")[0]
    assert found.folder_of(pairs[0], 0) != found.folder_of(pairs[1], 0)
    assert len(set(found.names.values())) == 2
    longer = load_spec({**both.model_dump(mode="json"), "steps": both.steps + 1})
    again = Tuning(longer.tune, plan(longer)[0], {"reverse": ("token_accuracy", "higher")}, tmp_path)
    assert set(again.names.values()).isdisjoint(found.names.values()), "another budget is another study"


def test_a_time_budget_ends_a_trial_with_the_score_it_reached(presence, tmp_path):
    timed = load_spec(
        {
            **spec(trials=2, space={"train.lr": [3e-3, 1e-3]}).model_dump(mode="json"),
            "seeds": [0],
            "steps": 100_000,
            "seconds": 1.0,
        }
    )
    results = compare(timed, tmp_path)
    for study in results.tuning:
        assert [t.state for t in study.trials] == ["complete", "complete"], "a trial out of time is scored, not failed"
        assert all(t.steps < 100_000 and t.value is not None for t in study.trials)
