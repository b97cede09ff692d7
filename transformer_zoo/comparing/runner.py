"""``tzoo compare``: every variant on every task, with the same data, seeds and budget.

:func:`compare` runs in four stages, each a function of its own: plan (every run's config,
checked before anything trains), :func:`tune_runs`, :func:`train_runs` and
:func:`summarize_runs`; a :class:`Comparison` holds what they share.

A spec lists variants x tasks x seeds and one budget. Each run is keyed by what decides its
result (:mod:`~transformer_zoo.comparing.cache`); only the runs the cache has no finished run
for train, on the spec's executor (:mod:`~transformer_zoo.comparing.executors`: worker
processes of this machine pinned to its devices, or Ray tasks); on a torchrun job every run
trains over all the job's processes, one run after another, and process 0 writes the report.
Each run records parameters, FLOPs per token, training tokens per second, peak memory, the
task metrics, the learning curve and wall time, and when, where, with how many threads and
under what load it ran. The report folder holds ``results.json`` (validated by
:class:`CompareResults`, with the intervals and tests over seeds), ``report.md`` and PNG plots.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..core.errors import ConfigError, ZooError
from ..core.files import atomic_write
from ..registry import get_registry
from ..training import distributed
from ..training.config import TrainConfig, model_config_for
from ..training.interrupts import TrainingInterrupted
from ..training.placement import resolve_device
from ..training.run_folder import RunFolderError, check_folder, read_json
from .cache import RunCache, run_key
from .executors import (
    Executor,
    LocalExecutor,
    RayExecutor,
    RunEvent,
    check_devices,
    device_slots,
    local_devices,
)
from .progress import GridProgress, duration
from .records import CompareResults, Failed, RunRecord, ScalingPoint, Skipped, Tuned
from .runs import (
    RECORD,
    RunJob,
    available_cores,
    built_task,
    finished_record,
    ponder_summary,
    training_step_costs,
)
from .scaling import measure_scaling
from .spec import CompareSpec, plan
from .suites import load_suite, suite_records
from .summary import summarize
from .tuning import TrialJob, TrialResult, Tuning, short, tuned_runs

__all__ = [
    "Comparison",
    "ComparisonFailed",
    "ComparisonInterrupted",
    "Trained",
    "compare",
    "machine",
    "make_executor",
    "ponder_summary",
    "run_threads",
    "run_tuning",
    "scaling_points",
    "summarize_runs",
    "train_runs",
    "training_step_costs",
    "tune_runs",
]

RAY_LOG = "ray.log"
"""The file of the report folder that a Ray executor writes Ray's own messages to."""


def run_threads(spec: CompareSpec, at_once: int) -> int:
    """The CPU threads of each run: the spec's, else the available cores shared among the runs
    trained at once (one for a Ray task, which asks the cluster for what it uses).

    More threads than cores is a slowdown, not a speedup: OpenMP threads that wait for one another
    spin, and on a busy machine they spin on cores another process needs."""
    if spec.threads:
        return spec.threads
    return 1 if spec.executor == "ray" else max(1, available_cores() // at_once)


def scaling_points(spec: CompareSpec, runs: list[tuple[str, TrainConfig]], out_dir: Path) -> list[ScalingPoint]:
    """The spec's scaling measurements of every variant that ran on its task (kept in
    ``scaling.json``, so a compare that is run again does not measure twice)."""
    if spec.scaling is None:
        return []
    options = next(t for t in spec.tasks if t.name == (spec.scaling.task or spec.tasks[0].name))
    task = built_task(options)
    configs = {label: config for label, config in runs if config.task.name == options.name}
    models = [(label, model_config_for(config, task)) for label, config in configs.items()]
    if not models:
        print(f"scaling: no variant ran on {options.name}; nothing to measure", file=sys.stderr)
        return []
    device = resolve_device(next(iter(configs.values())).device)
    key = {
        "spec": spec.scaling.model_dump(mode="json"),
        "task": options.model_dump(mode="json"),
        "models": [[label, config.model_dump(mode="json")] for label, config in models],
        "device": str(device),
        "machine": machine(),
        "transformer_zoo": __version__,
    }
    path = out_dir / "scaling.json"
    if path.is_file():
        try:
            saved = read_json(path)
        except RunFolderError:  # a damaged file: measured again, and written whole
            saved = {}
        if isinstance(saved, dict) and saved.get("key") == key:
            return [ScalingPoint.model_validate(p) for p in saved["points"]]
    points = measure_scaling(models, task, spec.scaling, device, progress=sys.stderr.isatty())  # no bar in a log
    text = json.dumps({"key": key, "points": [p.model_dump() for p in points]})
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return points


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": available_cores(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "processes": distributed.world().size,
    }


@dataclass
class Comparison:
    """What the stages of one :func:`compare` call share.

    Attributes:
        out_dir: the report folder.
        here: the processes of this job (one, or torchrun's).
        carried: plugin modules every worker registers; stranded: plugins no worker could import.
        invocation: the comparison's own id, unique (its runs' records say which invocation trained
            them; two comparisons begun in the same second are two invocations).
        started: when it began (UTC, ISO 8601), as the report gives it.
        tasks: each task of the spec, built once, by kind.
        begun: its start, on the clock of :func:`time.perf_counter`.
    """

    spec: CompareSpec
    out_dir: Path
    here: distributed.World
    carried: list[str]
    stranded: list[str]
    invocation: str = ""
    started: str = ""
    tasks: dict[str, Any] = field(default_factory=dict)
    begun: float = field(default_factory=time.perf_counter)

    def prepare(self) -> None:
        """Make the report folder, give the invocation its id and start time, and build each task once."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.invocation = uuid.uuid4().hex
        self.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.tasks = {options.name: built_task(options) for options in self.spec.tasks}

    def say(self, message: str) -> None:
        """A progress line, from process 0; to stderr, since stdout is the command's result (--json)."""
        if self.here.main:
            print(message, file=sys.stderr, flush=True)

    def executor(self, runs: list[tuple[str, TrainConfig]], count: int) -> Executor:
        """The spec's executor for ``count`` jobs (:func:`make_executor`)."""
        log = self.out_dir / RAY_LOG
        return make_executor(self.spec, self.here, self.carried, self.stranded, runs, count, self.say, log)


@dataclass
class Trained:
    """What the train stage leaves: every run's folder (in the order of the runs), and by folder the
    records of the runs that finished (the cache's included) and the events of those that failed."""

    folders: list[str]
    finished: dict[str, dict[str, Any]]
    failed: dict[str, RunEvent]


def compare(
    spec: CompareSpec,
    out_dir: str | os.PathLike,
    plugins: list[str] | None = None,
    *,
    rerun: bool = False,
    only: Collection[str] | None = None,
) -> CompareResults | None:
    """Run the spec and write ``results.json``, ``report.md`` and plots into ``out_dir``, in four
    stages: :func:`~transformer_zoo.comparing.spec.plan` every run, :func:`tune_runs` (with a
    ``tune:`` section), :func:`train_runs` those the run cache lacks, and :func:`summarize_runs`.

    Args:
        plugins: plugin modules to register here and in every worker (``--plugin``), with those
            registered here before; one no worker could import keeps the runs in this process.
        rerun: train every run again, ignoring the cache (``--rerun``).
        only: run these variants alone (by label), planned as in the whole spec (see ``plan``).

    On a torchrun job every process calls it; process 0 writes and returns the results, the
    others return None.

    Raises:
        RunFolderError: ``out_dir`` or the cache is a file.
        ConfigError: a bad spec (every problem in one message); executor ray without the ray
            package, under torchrun, or with a plugin no Ray worker could import.
        ComparisonFailed: no run finished; the message gives each run's error.
        ComparisonInterrupted: Ctrl-C; the finished runs are kept, and a run trained in this
            process saves the step it reached (workers' runs keep their last checkpoints).
    """
    out_dir = check_folder(out_dir, "report folder")
    registry = get_registry()
    for module in plugins or ():
        registry.register_module(module)
    comparison = Comparison(spec, out_dir, distributed.world(), *registry.portable_plugins())
    runs, skipped = plan(spec, comparison.here.size, only)
    for item in skipped:
        comparison.say(f"skipped {item.variant} on {item.task}: {item.reason}")
    comparison.prepare()
    tuned = tune_runs(comparison, runs) if spec.tune else []
    if tuned:
        runs = tuned_runs(spec.tune, runs, tuned)
    trained = train_runs(comparison, runs, rerun)
    if not comparison.here.main:
        return None
    return summarize_runs(comparison, runs, skipped, trained, tuned)


# ---- tune ---------------------------------------------------------------------------------------
def tune_runs(comparison: Comparison, runs: list[tuple[str, TrainConfig]]) -> list[Tuned]:
    """Tune every variant of ``runs`` on each task (:mod:`~transformer_zoo.comparing.tuning`), its
    trials on the spec's executor; the studies are kept in ``out_dir/tuning``.

    Raises:
        ConfigError: under torchrun, or a searched path that a variant's config does not have.
        ComparisonInterrupted: Ctrl-C; the trials that ended are kept, and those in progress
            keep their checkpoints.
    """
    spec = comparison.spec
    if comparison.here.launched:
        raise ConfigError(
            "tune: runs each trial as a job of the executor; under torchrun every process trains each "
            "run together: tune in a job of one process"
        )
    metrics = {kind: (task.metric, task.metrics[task.metric]) for kind, task in comparison.tasks.items()}
    tuning = Tuning(spec.tune, runs, metrics, comparison.out_dir / "tuning")
    tuning.check()
    parallel = 1
    if spec.executor == "local":  # the device slots shared among the studies
        slots = device_slots(spec.devices or local_devices(runs[0][1].device), spec.workers, spec.runs_per_device)
        parallel = max(1, len(slots) // len(tuning.studies))
    executor = comparison.executor(runs, parallel * len(tuning.studies))
    comparison.say(
        f"tuning {len(tuning.studies)} variant-task pair(s), {spec.tune.per_study} trials each "
        f"({spec.tune.sampler}, {'median pruner' if spec.tune.prune else 'no pruning'}), on a validation split of the "
        "training data; the test splits are not read"
    )
    try:
        return run_tuning(tuning, executor, parallel, comparison.invocation, comparison.say)
    except KeyboardInterrupt:
        raise ComparisonInterrupted(
            f"tuning interrupted with {tuning.ended()} of {spec.tune.per_study * len(tuning.studies)} trials ended (in "
            f"{tuning.folder}); run the same command again to go on: ended trials are not run again, and those in "
            "progress resume from their checkpoints"
        ) from None


def run_tuning(tuning: Tuning, executor: Executor, parallel: int, invocation: str, say: Any) -> list[Tuned]:
    """Every study's trials, round by round, through ``executor`` (``parallel`` new trials of each
    study a round); returns what each found. The Optuna trials stay here: a job names its trial by
    study and number, and the study is told its result here."""
    total = tuning.spec.per_study * len(tuning.studies)
    for batch in tuning.rounds(parallel):
        trials: dict[str, tuple[tuple[str, str], Any]] = {}  # by run folder: the pair and Optuna's trial
        jobs = []
        for pair, trial, config in batch:
            job = TrialJob(
                name=f"{pair[1]}/{pair[0]}/trial{trial.number}",
                config=config.model_dump(mode="json"),
                run_dir=str(tuning.folder_of(pair, trial.number)),
                invocation=invocation,
                tags={"task": pair[1], "variant": pair[0], "trial": str(trial.number)},
                journal=tuning.journal,
                study=tuning.names[pair],
                number=trial.number,
                tune=tuning.spec,
            )
            trials[job.run_dir] = (pair, trial)
            jobs.append(job)
        for event in executor.run(jobs):
            if event.state not in ("done", "failed"):
                continue
            pair, trial = trials[event.job.run_dir]
            result = event.record if event.state == "done" else None
            tuning.tell(pair, trial, result, event.error)
            say(
                f"tuning [{tuning.ended()}/{total}] {pair[0]} on {pair[1]}, trial {trial.number} "
                f"({', '.join(f'{k}={short(v)}' for k, v in trial.params.items())}): "
                + _trial_outcome(result, event.error, tuning.metrics[pair[1]][0])
            )
    return tuning.summary()


def _trial_outcome(result: TrialResult | None, error: str, metric: str) -> str:
    """How a trial ended, as its progress line says it."""
    if result is None:
        return "failed: " + error.splitlines()[0]
    return f"pruned at step {result.step}" if result.pruned else f"validation {metric} {result.value:.4g}"


# ---- train --------------------------------------------------------------------------------------
def train_runs(comparison: Comparison, runs: list[tuple[str, TrainConfig]], rerun: bool = False) -> Trained:
    """Train the runs the run cache has no finished run for (every run with ``rerun``), each once
    even when two labels name the same config, on the spec's executor, showing their progress.

    Raises:
        RunFolderError: the cache is a file.
        ComparisonInterrupted: Ctrl-C; the finished runs are kept.
    """
    cache, folders = run_folders(comparison, runs)
    cached = {} if rerun else {folder: record for folder in set(folders) if (record := finished_record(folder))}
    stale = {folder for folder in set(folders) - cached.keys() if (Path(folder) / RECORD).is_file()}
    if stale and not rerun:
        comparison.say(f"{len(stale)} finished runs have records this version cannot read; training them again")
    todo = {}  # folder -> (label, config)
    for (label, config), folder in zip(runs, folders):
        if folder not in cached:
            todo.setdefault(folder, (label, config))
    if cached:
        comparison.say(
            f"{len(runs) - sum(f not in cached for f in folders)} of {len(runs)} runs are finished in the run cache "
            f"{cache.root}"
            + (f"; training the other {len(todo)}" if todo else "; nothing to train")
            + " (--rerun trains them all again)"
        )
    executor = comparison.executor(runs, len(todo))
    trained = Trained(folders, dict(cached), {})
    jobs = run_jobs(comparison, todo, rerun, stale)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_interruptions(trained.finished, len(set(folders)), cache.root))  # left after the executor
        progress = stack.enter_context(GridProgress(jobs, live=None if comparison.here.main else False))
        events = executor.run(jobs)
        stack.callback(events.close)  # Ctrl-C: the executor stops what still trains
        for event in events:
            if comparison.here.main:
                progress.event(event)
            if event.state == "done" and event.record is not None:
                trained.finished[event.job.run_dir] = event.record
            elif event.state == "failed":
                trained.failed[event.job.run_dir] = event
    return trained


def run_folders(comparison: Comparison, runs: list[tuple[str, TrainConfig]]) -> tuple[RunCache, list[str]]:
    """The run cache, and each run's folder in it, by the key of what decides its result (two
    labels of one config are one run, in one folder)."""
    spec = comparison.spec
    # absolute: a Ray task on another node does not run in this folder
    cache = RunCache((check_folder(spec.cache, "run cache") if spec.cache else comparison.out_dir / "runs").resolve())
    by_key: dict[str, str] = {}
    folders = []
    for label, config in runs:
        key = run_key(config, model_config_for(config, comparison.tasks[config.task.name]), spec.probes)
        folders.append(by_key.setdefault(key, str(cache.folder(label, config, key))))
    return cache, folders


def run_jobs(
    comparison: Comparison, todo: dict[str, tuple[str, TrainConfig]], rerun: bool, fresh: Collection[str] = ()
) -> list[RunJob]:
    """The jobs of the runs to train, by folder (those of ``fresh``, and all with ``rerun``, from
    scratch); the largest budgets (steps x batch) first, so that no long run is left to finish alone."""
    order = sorted(todo.items(), key=lambda item: -item[1][1].steps * item[1][1].batch_size)
    return [
        RunJob(
            name=f"{config.task.name}/{label}/seed{config.seed}",
            config=config.model_dump(mode="json"),
            run_dir=folder,
            invocation=comparison.invocation,
            probes=tuple(comparison.spec.probes),
            rerun=rerun or folder in fresh,
            tags={"task": config.task.name, "variant": label, "seed": str(config.seed)},
        )
        for folder, (label, config) in order
    ]


# ---- summarize ----------------------------------------------------------------------------------
def summarize_runs(
    comparison: Comparison,
    runs: list[tuple[str, TrainConfig]],
    skipped: list[Skipped],
    trained: Trained,
    tuned: list[Tuned],
) -> CompareResults:
    """The comparison's results (intervals and tests over seeds, baselines, scaling, tuning),
    written to ``results.json``, ``report.md`` and plots.

    Raises:
        ComparisonFailed: no run finished; the message gives each run's error.
    """
    from .report import write_report

    spec, out_dir, tasks = comparison.spec, comparison.out_dir, comparison.tasks
    records, failures = collect_records(comparison, runs, trained, tuned)
    if spec.suite is not None:  # the suite's aggregate, a task of its own
        records += suite_records(load_suite(spec.suite), records)
    baselines = {kind: task.baselines("test") for kind, task in tasks.items()}
    if spec.scaling is not None:
        comparison.say("measuring time and memory against length")
    results = CompareResults(
        spec=spec.model_dump(mode="json"),
        machine=machine(),
        invocation=comparison.invocation,
        started=comparison.started,
        runs=records,
        skipped=skipped,
        failed=failures,
        baselines={kind: scores for kind, scores in baselines.items() if scores},
        baseline_names={kind: task.baseline for kind, task in tasks.items() if baselines[kind]},
        scaling=scaling_points(spec, runs, out_dir),
        tuning=tuned,
    )
    results.summaries = summarize(
        results.runs, spec.reference, spec.test, comparison.invocation, paired=spec.pairing == "seeds"
    )
    (out_dir / "results.json").write_text(results.model_dump_json(indent=2))
    write_report(results, out_dir)
    comparison.say(
        f"compared {len(records)} runs in {duration(time.perf_counter() - comparison.begun)} of wall time; report: "
        f"{out_dir / 'report.md'}" + (f"; {len(failures)} run(s) failed, listed in the report" if failures else "")
    )
    return results


def collect_records(
    comparison: Comparison, runs: list[tuple[str, TrainConfig]], trained: Trained, tuned: list[Tuned]
) -> tuple[list[RunRecord], list[Failed]]:
    """Each finished run's record as the report shows it (with the tuning its variant needed, in
    its cost columns), and each failed run.

    Raises:
        ComparisonFailed: no run finished; the message gives each run's error.
    """
    out_dir, invocation = comparison.out_dir, comparison.invocation
    done = [(label, config, folder) for (label, config), folder in zip(runs, trained.folders)]
    records = [
        _as_run(trained.finished[folder], label, config.task.name, folder, out_dir, invocation)
        for label, config, folder in done
        if folder in trained.finished
    ]
    failures = [
        Failed(
            variant=label,
            task=config.task.name,
            seed=config.seed,
            attempts=trained.failed[folder].attempt,
            error=trained.failed[folder].error,
            run_folder=_relative(folder, out_dir),
        )
        for label, config, folder in done
        if folder in trained.failed
    ]
    if not records:
        raise ComparisonFailed(
            "no run of the comparison finished:\n"
            + "\n".join(f"  {f.variant} on {f.task} (seed {f.seed}): {f.error.splitlines()[0]}" for f in failures)
        )
    labelled = comparison.spec.tune is not None and comparison.spec.tune.compare == "tuned"
    budget = {(t.variant if labelled else f"{t.variant} tuned", t.task): t.seconds for t in tuned}
    for record in records:
        record.tuning_seconds = budget.get((record.variant, record.task))
    return records, failures


def make_executor(
    spec: CompareSpec,
    here: distributed.World,
    carried: list[str],
    stranded: list[str],
    runs: list[tuple[str, TrainConfig]],
    count: int,
    say: Any,
    log: Path | None = None,
) -> Executor:
    """The spec's executor for ``count`` runs, and a line saying how they will train.

    Args:
        log: where a Ray executor writes Ray's own messages (None: standard error).

    Raises:
        ConfigError: executor ray under torchrun, or with a plugin no Ray worker could import.
    """
    if not count:
        return LocalExecutor(["cpu"], 1)
    if spec.executor == "ray":
        if here.launched:
            raise ConfigError(
                "executor ray runs each run as a Ray task; under torchrun every process trains each run "
                "together: use executor local in a torchrun job"
            )
        if stranded:
            raise ConfigError(
                f"plugin(s) {', '.join(stranded)} are not importable modules, so no Ray worker could "
                "register them; put a plugin's hooks in a module and pass --plugin MODULE"
            )
        threads = run_threads(spec, 1)
        say(
            f"{count} runs as Ray tasks, {threads} CPU thread(s) each, on "
            + (f"the cluster at {spec.address}" if spec.address else "a Ray instance of this machine")
            + (f"; Ray's own messages go to {log}" if log else "")
        )
        return RayExecutor(threads, carried, spec.retries, spec.address, runs_per_device=spec.runs_per_device, log=log)
    if here.launched:  # the job's processes train each run together, in turn; torchrun placed them
        say(f"{count} runs, one at a time over the job's {here.size} processes")
        return LocalExecutor([""], torch.get_num_threads(), carried, spec.retries, in_process=True, fail_fast=True)
    devices = spec.devices or local_devices(runs[0][1].device)
    check_devices(devices)
    slots = device_slots(devices, spec.workers, spec.runs_per_device)[: max(count, 1)]
    if stranded and len(slots) > 1:  # a worker could not register them: train here, one run at a time
        slots = slots[:1]
        say(
            f"plugin(s) {', '.join(stranded)} are not importable modules, so no worker process could register them: "
            "the runs train in this process, one at a time (put a plugin's hooks in a module and pass --plugin "
            "MODULE to train in workers)"
        )
    threads = run_threads(spec, len(slots))
    on = "" if devices == ["cpu"] else f" on {', '.join(dict.fromkeys(slots))}"
    say(f"{count} runs, {len(slots)} at a time{on}, {threads} CPU threads each")
    return LocalExecutor(slots, threads, carried, spec.retries)


def _relative(folder: str | os.PathLike, out_dir: Path) -> str:
    """A run folder as the report names it: relative to the report when under it, else absolute."""
    folder = Path(folder).resolve()
    try:
        return str(folder.relative_to(out_dir.resolve()))
    except ValueError:
        return str(folder)


def _as_run(record: dict[str, Any], label: str, task: str, folder: str, out_dir: Path, invocation: str) -> RunRecord:
    """A run's record as this report shows it: under this spec's labels (variant and task), its plots and folder
    named from the report, and reused when another invocation trained it."""
    where = _relative(folder, out_dir)
    plots = {
        key: str(Path(where) / Path(record[key]).name) for key in ("ponder_plot", "samples_plot") if record.get(key)
    }
    return RunRecord.model_validate(
        {
            **record,
            **plots,
            "variant": label,
            "task": task,
            "run_folder": where,
            "reused": record.get("invocation") != invocation,
        }
    )


class ComparisonFailed(ZooError):
    """No run of a comparison finished."""


class ComparisonInterrupted(KeyboardInterrupt):
    """A comparison stopped by Ctrl-C; the message says what is kept and how to go on."""


@contextlib.contextmanager
def _interruptions(records: dict, total: int, runs: Path) -> Iterator[None]:
    """Ctrl-C while the runs train, as one :class:`ComparisonInterrupted` saying what is kept."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, TrainingInterrupted) and exc.saved is not None:
            current = f"the run in progress saved its step {exc.saved}"
        else:
            current = "runs in progress keep their last checkpoints"
        raise ComparisonInterrupted(
            f"comparison interrupted with {len(records)} of {total} runs finished (in {runs}); {current}; "
            "run the same command again to go on: finished runs are reused and the others resume from their "
            "checkpoints"
        ) from None
