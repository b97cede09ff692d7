"""Tuning before comparing (``tune:`` in a compare spec): every variant's settings searched on the
same budget of trials, on a validation split carved from the training data, and the comparison
then run at each variant's best setting.

Optuna drives the search through its ask/tell interface: each study (one per variant and task)
asks for a trial, the trial trains as a :class:`TrialJob` of the comparison's own executor (the
local pool and its devices, or Ray), and the study is told its :class:`TrialResult`. The driver
keeps the Optuna trial objects; a job names its trial by study and number. Trials report their
validation score at evenly spaced steps (``rungs``) to the study's storage, where the median
pruner stops one that falls behind the trials before it. The studies live in Optuna's journal
file in the report folder, so an interrupted tuning resumes: finished trials are never run
again, and one that was running continues from its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..api import load_config
from ..core.errors import ConfigError, optional
from ..core.validation import Options
from ..training.config import TrainConfig
from ..training.holdout import VALIDATION
from ..training.trainer import Trainer
from .records import TrialRecord, Tuned
from .runs import Job, start_job

PATH_ROOTS = ("train", "model")
FIXED = frozenset({"model", "task", "steps", "max_seconds", "seed", "holdout", "holdout_seed", "eval_every", "device"})
"""Training fields a search may not set: the budget, the data and the seed are the same for every trial."""
JOURNAL = "journal.log"


class TuneSpec(Options):
    """How every variant's settings are searched before the comparison, on one budget."""

    trials: int = Field(8, ge=1, le=10_000, description="trials per variant and task, the same for every variant")
    space: dict[str, list[Any] | dict[str, list[float]]] = Field(
        {"train.lr": {"log": [1e-4, 1e-2]}},
        description="what is searched, by path: train.FIELD (a training option: lr, warmup_steps, weight_decay, "
        "batch_size, ...) or model.FIELD[.FIELD] (a model config value), each a list of choices, {log: [low, high]} "
        "(a float drawn on the log scale), {range: [low, high]} (a float) or {int: [low, high]} (an integer)",
    )
    sampler: Literal["tpe", "grid"] = Field(
        "tpe",
        description="tpe: Optuna's TPE sampler, seeded; grid: every combination of the choices (lists only), "
        "in an order drawn with the seed",
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="seed of the sampler, of the trials' training and of the validation split"
    )
    validation: float = Field(
        0.1,
        gt=0,
        description="the validation split, carved from the train split with the seed: "
        "a fraction of it (below 1) or a number of rows; the test splits are never read",
    )
    steps: int | None = Field(None, ge=1, description="training steps of each trial; null: the spec's steps")
    rungs: int = Field(
        4,
        ge=1,
        le=100,
        description="validation scores per trial, at evenly spaced steps (the last "
        "at the end), which the pruner compares",
    )
    prune: bool = Field(
        True,
        description="stop a trial whose validation score at a rung is worse than the median of "
        "the trials before it at that rung (Optuna's median pruner)",
    )
    startup_trials: int = Field(
        2,
        ge=0,
        description="trials of each variant run to the end before any is pruned, and "
        "drawn at random before TPE models the scores",
    )
    compare: Literal["tuned", "both"] = Field(
        "tuned",
        description="tuned: compare the variants at their tuned settings; both: also at the spec's own, side "
        "by side (a tuned variant is labelled 'LABEL tuned')",
    )

    @field_validator("space")
    @classmethod
    def _space(cls, space: dict[str, Any]) -> dict[str, Any]:
        if not space:
            raise ValueError("space is empty; give at least one path, e.g. train.lr: {log: [1e-4, 1e-2]}")
        for path, values in space.items():
            root, _, field = path.partition(".")
            if root not in PATH_ROOTS or not field:
                raise ValueError(
                    f"space path {path!r} starts with neither train. nor model.; write train.lr or model.dropout"
                )
            if root == "train":
                if field in FIXED:
                    raise ValueError(
                        f"space path {path!r} is fixed for every trial (the budget, data and seed are the "
                        f"same for all); search training options other than {', '.join(sorted(FIXED))}"
                    )
                if field not in TrainConfig.model_fields:
                    raise ValueError(
                        f"space path {path!r} is not a training option; options: "
                        f"{', '.join(sorted(set(TrainConfig.model_fields) - FIXED))}"
                    )
                if (
                    TrainConfig.model_fields[field].annotation is int
                    and isinstance(values, dict)
                    and "int" not in values
                ):
                    raise ValueError(
                        f"space path {path!r} is a whole number: draw it with {{int: [low, high]}} or list its choices"
                    )
            dimension(path, values)  # raises on a malformed one
        return space

    @property
    def per_study(self) -> int:
        """Trials of each study: ``trials``, or the grid's size when it has fewer combinations."""
        if self.sampler != "grid":
            return self.trials
        return min(self.trials, math.prod(len(values) for values in self.space.values()))

    @model_validator(mode="after")
    def _grid(self) -> TuneSpec:
        if self.sampler == "grid" and not all(isinstance(v, list) for v in self.space.values()):
            ranged = [p for p, v in self.space.items() if not isinstance(v, list)]
            raise ValueError(
                f"sampler grid needs a list of choices for every path; {ranged} are ranges: list values, "
                "or use sampler tpe"
            )
        return self


def dimension(path: str, values: Any) -> Callable[[Any], Any]:
    """The function that draws ``path``'s value from an Optuna trial, for a space entry."""
    if isinstance(values, list):
        if not values:
            raise ValueError(f"space path {path!r} lists no choices")
        return lambda trial: trial.suggest_categorical(path, values)
    if not isinstance(values, dict) or len(values) != 1 or next(iter(values)) not in ("log", "range", "int"):
        raise ValueError(
            f"space path {path!r} must be a list of choices or one of {{log: [low, high]}}, "
            f"{{range: [low, high]}}, {{int: [low, high]}}; got {values!r}"
        )
    ((how, bounds),) = values.items()
    if len(bounds) != 2 or not bounds[0] < bounds[1] or (how == "log" and bounds[0] <= 0):
        rule = "0 < low < high" if how == "log" else "low < high"
        raise ValueError(f"space path {path!r}: {how} needs [low, high] with {rule}; got {bounds}")
    low, high = bounds
    if how == "int":
        return lambda trial: trial.suggest_int(path, int(low), int(high))
    return lambda trial: trial.suggest_float(path, float(low), float(high), log=how == "log")


def with_values(config: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    """``config`` with the searched ``values`` set, by path (``train.lr``, ``model.dropout``)."""
    data = config.model_dump(mode="json")
    model = {"variant": data["model"]} if isinstance(data["model"], str) else data["model"]
    for path, value in values.items():
        root, _, field = path.partition(".")
        if root == "train":
            data[field] = value
            continue
        *parents, last = field.split(".")
        where = model
        for name in parents:
            if isinstance(where.get(name), str):  # a component given by its kind alone
                where[name] = {"kind": where[name]}
            where = where.setdefault(name, {})
        where[last] = value
    data["model"] = model
    return TrainConfig.model_validate(data)


def rung_steps(steps: int, rungs: int) -> list[int]:
    """The steps where a trial of ``steps`` is scored: ``rungs`` of them evenly spaced, the last at the end."""
    return sorted({round(steps * i / rungs) for i in range(1, rungs + 1)} - {0})


@dataclass(frozen=True)
class TrialResult:
    """How a trial ended, as its study is told (:meth:`Tuning.tell`).

    Attributes:
        pruned: the pruner stopped it.
        value: its score, the last one it reached (None when pruned).
        scores: its validation score at each rung it reached, an earlier attempt's included.
        step: the step it reached.
        seconds: how long this attempt took.
    """

    pruned: bool
    value: float | None
    scores: dict[int, float]
    step: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class TrialJob(Job):
    """A tuning trial: trained on the validation split and scored at its rungs (:func:`execute_trial`).

    Attributes:
        journal: the studies' journal file.
        study: the name of its study there.
        number: the trial's number in its study.
        tune: the spec's ``tune`` section.
    """

    journal: str
    study: str
    number: int
    tune: TuneSpec

    def execute(self, where: str = "") -> TrialResult:
        _, _, config, task = start_job(self, where)
        return execute_trial(self, config, task)


def execute_trial(job: TrialJob, config: TrainConfig, task: Any) -> TrialResult:
    """Train one trial, scoring it on the validation split at each rung; report each score to its
    study and stop when the pruner says so. Resumes the trial's checkpoint."""
    optuna = optional("optuna", "tune", "tune: in a compare spec")
    storage = _storage(optuna, job.journal)
    study = _study(optuna, storage, job.study, job.tune)
    trial = _trial(optuna, storage, study, job.number)
    started = time.perf_counter()
    trainer = Trainer(config, job.run_dir, task=task, progress=job.progress, name=job.name, tags=job.tags)
    scores: dict[int, float] = {}
    pruned = False
    with trainer.lock():
        trainer.setup(resume=True)
        for rung in rung_steps(config.steps, job.tune.rungs):
            if rung <= trainer.reached and rung != config.steps:
                continue
            left = None  # one time budget for the whole trial, not one per rung
            if config.max_seconds is not None:
                left = max(config.max_seconds - (time.perf_counter() - started), 1e-3)
            reached = trainer.run_until(rung, left, score=VALIDATION)
            scores[reached.step] = reached.scores[task.metric]
            if reached.summary is not None or reached.step < rung:  # the last step, or the time ran out
                break
            trial.report(scores[rung], rung)
            if job.tune.prune and trial.should_prune():
                pruned = True
                break
    metric = f"{VALIDATION}_{task.metric}"
    for row in trainer.history:  # scores of rungs an earlier attempt reached
        if metric in row:
            scores.setdefault(row["step"], row[metric])
    return TrialResult(
        pruned=pruned,
        value=None if pruned else scores[max(scores)],
        scores=scores,
        step=trainer.reached,
        seconds=time.perf_counter() - started,
    )


def _storage(optuna: Any, journal: str) -> Any:
    """The studies' storage: Optuna's journal file ``journal``."""
    backend = optional("optuna.storages.journal", "tune", "tune: in a compare spec").JournalFileBackend(journal)
    return optuna.storages.JournalStorage(backend)


def _study(optuna: Any, storage: Any, name: str, spec: TuneSpec, direction: str | None = None) -> Any:
    """The study ``name`` in ``storage``, with ``spec``'s sampler and pruner (created when
    ``direction`` is given and it does not exist yet)."""

    def tpe(seed: int) -> Any:
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(spec.startup_trials, 1))

    if spec.sampler == "grid":

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, *args: Any) -> None:  # ask/tell: the driver stops asking at the grid's size
                pass

        sampler = Grid(spec.space, seed=spec.seed)
    else:
        sampler = tpe(spec.seed)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials) if spec.prune else optuna.pruners.NopPruner()
    )
    if direction is None:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    study = optuna.create_study(
        study_name=name, storage=storage, sampler=sampler, pruner=pruner, direction=direction, load_if_exists=True
    )
    if spec.sampler == "tpe" and study.trials:  # resumed: the draws go on from the trials made, not from the first
        study.sampler = tpe(spec.seed + len(study.trials))
    return study


def _trial(optuna: Any, storage: Any, study: Any, number: int) -> Any:
    """Trial ``number`` of ``study``, to report its scores to and ask whether to prune it."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return optuna.trial.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))


class Tuning:
    """The studies of a comparison, one per (variant label, task), driven round by round.

    Args:
        spec: the spec's ``tune`` section.
        runs: the comparison's planned runs ``(label, config)``; each pair's first is its base.
        metrics: by task kind, ``(headline metric, "higher" or "lower")``.
        folder: where the journal and the trials' run folders go.
    """

    def __init__(
        self, spec: TuneSpec, runs: list[tuple[str, TrainConfig]], metrics: dict[str, tuple[str, str]], folder: Path
    ) -> None:
        self.optuna = optional("optuna", "tune", "tune: in a compare spec")
        self.optuna.logging.set_verbosity(self.optuna.logging.WARNING)
        self.spec, self.folder = spec, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.journal = str((folder / JOURNAL).resolve())
        self.storage = _storage(self.optuna, self.journal)
        self.base: dict[tuple[str, str], TrainConfig] = {}
        for label, config in runs:
            self.base.setdefault((label, config.task.name), config)
        self.metrics = metrics
        self.names = {pair: f"{pair[1]}/{pair[0]}/{self.setup_key(config)}" for pair, config in self.base.items()}
        self.studies = {
            pair: _study(
                self.optuna,
                self.storage,
                self.names[pair],
                spec,
                "maximize" if metrics[pair[1]][1] == "higher" else "minimize",
            )
            for pair in self.base
        }
        self.draws = {path: dimension(path, values) for path, values in spec.space.items()}

    def setup_key(self, base: TrainConfig) -> str:
        """A digest of what decides a study's trials but the values searched: the pair's training
        config (its searched fields left out) and the tune section. A changed setup starts a new
        study in the journal rather than reusing trials of another."""
        searched = {path.partition(".")[2] for path in self.spec.space if path.startswith("train.")}
        content = {
            "train": base.model_dump(mode="json", exclude={"seed", *searched}),
            "tune": self.spec.model_dump(mode="json", exclude={"trials", "compare"}),
        }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]

    def check(self) -> None:
        """Build every pair's trial config with a value of each path, so that a path a variant's config
        lacks fails before anything trains."""
        probe = {
            path: (v[0] if isinstance(v, list) else next(iter(v.values()))[0]) for path, v in self.spec.space.items()
        }
        for (label, kind), config in self.base.items():
            try:
                trial = self.trial_config(config, probe)
                load_config({"variant": trial.model} if isinstance(trial.model, str) else trial.model)
            except (ValueError, TypeError, ConfigError) as exc:
                raise ConfigError(f"tune: the space does not fit variant {label!r} on {kind!r}: {exc}") from None

    def trial_config(self, base: TrainConfig, values: dict[str, Any]) -> TrainConfig:
        """A trial's training config: the setting drawn, the trial budget, the tuning seed, and the
        validation split carved from the training data (the test splits are never read)."""
        tuned = with_values(base, values)
        steps = self.spec.steps or base.steps
        return tuned.model_copy(
            update={
                "steps": steps,
                "seed": self.spec.seed,
                "holdout": self.spec.validation,
                "holdout_seed": self.spec.seed,
                "eval_every": 0,
            }
        )  # a trial is scored at its rungs (execute_trial)

    def rounds(self, parallel: int) -> Iterator[list[tuple[tuple[str, str], Any, TrainConfig]]]:
        """Trials to run together, round after round, until every study has its trials: each round
        asks up to ``parallel`` new trials of each study; the first also takes up the trials an
        interruption left running (they resume from their checkpoints)."""
        states = self.optuna.trial.TrialState
        while True:
            batch = []
            for pair, study in self.studies.items():
                trials = study.get_trials(deepcopy=False)
                picked = [
                    _trial(self.optuna, self.storage, study, t.number) for t in trials if t.state == states.RUNNING
                ]
                ended = sum(t.state != states.RUNNING for t in trials)
                while len(picked) < parallel and ended + len(picked) < self.spec.per_study:
                    picked.append(study.ask())
                for trial in picked:  # a resumed trial's suggestions return the values it drew
                    values = {path: draw(trial) for path, draw in self.draws.items()}
                    batch.append((pair, trial, self.trial_config(self.base[pair], values)))
            if not batch:
                return
            yield batch

    def ended(self) -> int:
        """Trials of every study that ended (complete, pruned or failed)."""
        return sum(len(s.get_trials(deepcopy=False, states=_ended(self.optuna))) for s in self.studies.values())

    def folder_of(self, pair: tuple[str, str], number: int) -> Path:
        """A trial's run folder: by task, label and trial number."""
        label = re.sub(r"[^\w.+-]+", "_", pair[0].split(" ")[0])  # short, and the whole label's digest: unique
        digest = hashlib.sha256(pair[0].encode()).hexdigest()[:8]
        return (self.folder / "trials" / f"{pair[1]}--{label}-{digest}--trial{number}").resolve()

    def tell(self, pair: tuple[str, str], trial: Any, result: TrialResult | None, error: str = "") -> None:
        """The study's answer for a trial that ended (None: it failed, with ``error``)."""
        study, states = self.studies[pair], self.optuna.trial.TrialState
        if result is None:
            trial.set_user_attr("error", error)
            study.tell(trial, state=states.FAIL)
            return
        trial.set_user_attr("steps", result.step)
        trial.set_user_attr("seconds", trial.user_attrs.get("seconds", 0.0) + result.seconds)
        trial.set_user_attr("scores", {str(k): v for k, v in result.scores.items()})
        if result.pruned:
            study.tell(trial, state=states.PRUNED)
        else:
            study.tell(trial, result.value)

    def summary(self) -> list[Tuned]:
        """What each study found, with its trials and the budget it spent."""
        states = self.optuna.trial.TrialState
        names = {states.COMPLETE: "complete", states.PRUNED: "pruned", states.FAIL: "failed", states.RUNNING: "running"}
        out = []
        for (label, kind), study in self.studies.items():
            steps = self.spec.steps or self.base[(label, kind)].steps
            trials = [
                TrialRecord(
                    number=t.number,
                    values=t.params,
                    state=names.get(t.state, "failed"),
                    value=t.value if t.state == states.COMPLETE else None,  # a pruned one's is a rung's
                    steps=t.user_attrs.get("steps", 0),
                    seconds=t.user_attrs.get("seconds", 0.0),
                    scores={int(k): v for k, v in t.user_attrs.get("scores", {}).items()},
                )
                for t in study.get_trials(deepcopy=False)
            ]
            complete = [t for t in trials if t.state == "complete"]
            maximize = study.direction == self.optuna.study.StudyDirection.MAXIMIZE
            best = (max if maximize else min)(complete, key=lambda t: t.value) if complete else None
            out.append(
                Tuned(
                    variant=label,
                    task=kind,
                    metric=self.metrics[kind][0],
                    direction="maximize" if maximize else "minimize",
                    best=best.values if best else {},
                    best_value=best.value if best else None,
                    trials=trials,
                    steps=steps,
                    seconds=sum(t.seconds for t in trials),
                    trained_steps=sum(t.steps for t in trials),
                    saved_steps=sum(steps - t.steps for t in trials if t.state == "pruned"),
                )
            )
        return out


def _ended(optuna: Any) -> tuple[Any, ...]:
    states = optuna.trial.TrialState
    return states.COMPLETE, states.PRUNED, states.FAIL


def short(value: Any) -> str:
    """A searched value as a progress line writes it."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


TUNED = " tuned"
"""The label suffix of a tuned twin run beside its untuned variant (``compare: both``)."""


def untuned_label(label: str) -> str:
    """The label of the variant a tuned twin's label names (a plain label as it is)."""
    return label.removesuffix(TUNED)


def tuned_runs(
    spec: TuneSpec, runs: list[tuple[str, TrainConfig]], found: list[Tuned]
) -> list[tuple[str, TrainConfig]]:
    """The comparison's runs at each variant's tuned setting (labelled ``LABEL tuned`` beside the
    untuned ones when the spec compares both); a pair whose trials all failed keeps the spec's."""
    best = {(t.variant, t.task): t.best for t in found}
    tuned = [
        (
            label if spec.compare == "tuned" else label + TUNED,
            with_values(config, best.get((label, config.task.name), {})),
        )
        for label, config in runs
    ]
    return tuned if spec.compare == "tuned" else runs + tuned
