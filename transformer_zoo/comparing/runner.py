"""``tzoo compare``: every variant on every task, with the same data, seeds and budget.

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
from collections.abc import Iterator
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
from ..training.run_folder import check_folder
from .cache import RunCache, run_key
from .executors import (
    Executor,
    LocalExecutor,
    RayExecutor,
    check_devices,
    device_slots,
    local_devices,
)
from .progress import GridProgress, duration
from .records import CompareResults, Failed, RunRecord, ScalingPoint, Tuned
from .runs import (
    RunJob,
    available_cores,
    finished_record,
    ponder_summary,
    training_step_costs,
)
from .scaling import measure_scaling
from .spec import CompareSpec, plan
from .summary import summarize
from .tuning import Tuning, short, tuned_runs

__all__ = [
    "ComparisonFailed",
    "ComparisonInterrupted",
    "compare",
    "machine",
    "make_executor",
    "ponder_summary",
    "run_threads",
    "run_tuning",
    "scaling_points",
    "training_step_costs",
]


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
    options = next(t for t in spec.tasks if t.kind == (spec.scaling.task or spec.tasks[0].kind))
    task = options.build()
    configs = {label: config for label, config in runs if config.task.kind == options.kind}
    models = [(label, model_config_for(config, task)) for label, config in configs.items()]
    if not models:
        print(f"scaling: no variant ran on {options.kind}; nothing to measure", file=sys.stderr)
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
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
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


def compare(
    spec: CompareSpec, out_dir: str | os.PathLike, plugins: list[str] | None = None, *, rerun: bool = False
) -> CompareResults | None:
    """Run the spec and write ``results.json``, ``report.md`` and plots into ``out_dir``.

    Only the runs the cache (:mod:`~transformer_zoo.comparing.cache`) has no finished run for
    train; the others are reused and marked so. Runs train on the spec's executor
    (:mod:`~transformer_zoo.comparing.executors`); a run that fails is reported, and the others
    are summarized without it.

    Args:
        plugins: plugin modules to register here and in every worker (``--plugin``); plugins
            registered in this process before the call are carried to the workers too, and
            one that no worker could import (an object defined in a notebook) keeps the runs
            in this process, one at a time.
        rerun: train every run again, ignoring the cache (``--rerun``).

    On a torchrun job every process calls it; process 0 writes and returns the results, the
    others return None.

    Raises:
        RunFolderError: ``out_dir`` or the cache is a file.
        ConfigError: executor ray without the ray package, under torchrun, or with a plugin no
            Ray worker could import.
        ComparisonFailed: no run finished; the message gives each run's error.
        ComparisonInterrupted: Ctrl-C; the finished runs are kept, and a run trained in this
            process saves the step it reached (workers' runs keep their last checkpoints).
    """
    from .report import write_report

    out_dir = check_folder(out_dir, "report folder")
    registry = get_registry()
    for module in plugins or ():
        registry.register_module(module)
    carried, stranded = registry.portable_plugins()
    here = distributed.world()
    begun = time.perf_counter()
    runs, skipped = plan(spec, here.size)

    def say(message: str) -> None:  # progress goes to stderr: stdout is the command's result (--json)
        if here.main:
            print(message, file=sys.stderr, flush=True)

    for item in skipped:
        say(f"skipped {item.variant} on {item.task}: {item.reason}")
    out_dir.mkdir(parents=True, exist_ok=True)
    invocation = datetime.now(timezone.utc).isoformat(timespec="seconds")
    tasks = {options.kind: options.build() for options in spec.tasks}
    tuned = _tune(spec, runs, tasks, out_dir, here, carried, stranded, invocation, say) if spec.tune else []
    if tuned:
        runs = tuned_runs(spec.tune, runs, tuned)
    # absolute: a Ray task on another node does not run in this folder
    cache = RunCache((check_folder(spec.cache, "run cache") if spec.cache else out_dir / "runs").resolve())
    by_key: dict[str, str] = {}  # two labels of one config are one run, in one folder
    folders = []
    for label, config in runs:
        key = run_key(config, model_config_for(config, tasks[config.task.kind]), spec.probes)
        folders.append(by_key.setdefault(key, str(cache.folder(label, config, key))))
    cached = {} if rerun else {folder: record for folder in set(folders) if (record := finished_record(folder))}
    todo = {}  # folder -> (label, config): each run once, even when two labels name the same config
    for (label, config), folder in zip(runs, folders):
        if folder not in cached:
            todo.setdefault(folder, (label, config))
    if cached:
        say(
            f"{len(runs) - sum(f not in cached for f in folders)} of {len(runs)} runs are finished in the run cache "
            f"{cache.root}"
            + (f"; training the other {len(todo)}" if todo else "; nothing to train")
            + " (--rerun trains them all again)"
        )
    executor = make_executor(spec, here, carried, stranded, runs, len(todo), say)
    # the largest budgets (steps x batch) start first, so that no long run is left to finish alone
    order = sorted(todo.items(), key=lambda item: -item[1][1].steps * item[1][1].batch_size)
    jobs = [
        RunJob(
            name=f"{config.task.kind}/{label}/seed{config.seed}",
            config=config.model_dump(mode="json"),
            run_dir=folder,
            invocation=invocation,
            probes=tuple(spec.probes),
            rerun=rerun,
            tags={"task": config.task.kind, "variant": label, "seed": str(config.seed)},
        )
        for folder, (label, config) in order
    ]
    finished, failed = dict(cached), {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _interruptions(finished, len(set(folders)), cache.root)
        )  # entered first: left after the executor
        progress = stack.enter_context(GridProgress(jobs, live=None if here.main else False))
        events = executor.run(jobs)
        stack.callback(events.close)  # Ctrl-C: the executor stops what still trains
        for event in events:
            if here.main:
                progress.event(event)
            if event.state == "done" and event.record is not None:
                finished[event.job.run_dir] = event.record
            elif event.state == "failed":
                failed[event.job.run_dir] = event
    if not here.main:
        return None
    records = [
        _as_run(finished[folder], label, folder, out_dir, invocation)
        for (label, _), folder in zip(runs, folders)
        if folder in finished
    ]
    failures = [
        Failed(
            variant=label,
            task=config.task.kind,
            seed=config.seed,
            attempts=failed[folder].attempt,
            error=failed[folder].error,
            run_folder=_relative(folder, out_dir),
        )
        for (label, config), folder in zip(runs, folders)
        if folder in failed
    ]
    if not records:
        raise ComparisonFailed(
            "no run of the comparison finished:\n"
            + "\n".join(f"  {f.variant} on {f.task} (seed {f.seed}): {f.error.splitlines()[0]}" for f in failures)
        )
    baselines = {kind: task.baselines("test") for kind, task in tasks.items()}
    if spec.scaling is not None:
        say("measuring time and memory against length")
    budget = {
        (t.variant if spec.tune.compare == "tuned" else f"{t.variant} tuned", t.task): t.seconds for t in tuned
    }  # the tuning a variant needed, in its cost columns
    for record in records:
        record.tuning_seconds = budget.get((record.variant, record.task))
    results = CompareResults(
        spec=spec.model_dump(mode="json"),
        machine=machine(),
        invocation=invocation,
        runs=records,
        skipped=skipped,
        failed=failures,
        baselines={kind: scores for kind, scores in baselines.items() if scores},
        baseline_names={kind: task.baseline for kind, task in tasks.items() if baselines[kind]},
        scaling=scaling_points(spec, runs, out_dir),
        tuning=tuned,
    )
    results.summaries = summarize(results.runs, spec.reference, spec.test, invocation)
    (out_dir / "results.json").write_text(results.model_dump_json(indent=2))
    write_report(results, out_dir)
    say(
        f"compared {len(records)} runs in {duration(time.perf_counter() - begun)} of wall time; report: "
        f"{out_dir / 'report.md'}" + (f"; {len(failures)} run(s) failed, listed in the report" if failures else "")
    )
    return results


def _tune(
    spec: CompareSpec,
    runs: list[tuple[str, TrainConfig]],
    tasks: dict[str, Any],
    out_dir: Path,
    here: distributed.World,
    carried: list[str],
    stranded: list[str],
    invocation: str,
    say: Any,
) -> list[Tuned]:
    """Tune every variant of ``runs`` on each task (:mod:`~transformer_zoo.comparing.tuning`), its trials
    on the spec's executor; the studies are kept in ``out_dir/tuning``.

    Raises:
        ConfigError: under torchrun, or a searched path that a variant's config does not have.
    """
    if here.launched:
        raise ConfigError(
            "tune: runs each trial as a job of the executor; under torchrun every process trains each "
            "run together: tune in a job of one process"
        )
    metrics = {kind: (task.metric, task.metrics[task.metric]) for kind, task in tasks.items()}
    tuning = Tuning(spec.tune, runs, metrics, out_dir / "tuning")
    tuning.check()
    parallel = (
        max(
            1,
            len(device_slots(spec.devices or local_devices(runs[0][1].device), spec.workers, spec.runs_per_device))
            // len(tuning.studies),
        )
        if spec.executor == "local"
        else 1
    )
    executor = make_executor(spec, here, carried, stranded, runs, parallel * len(tuning.studies), say)
    say(
        f"tuning {len(tuning.studies)} variant-task pair(s), {spec.tune.per_study} trials each "
        f"({spec.tune.sampler}, {'median pruner' if spec.tune.prune else 'no pruning'}), on a validation split of the "
        "training data; the test splits are not read"
    )
    try:
        return run_tuning(tuning, executor, parallel, invocation, say)
    except KeyboardInterrupt:
        raise ComparisonInterrupted(
            f"tuning interrupted with {tuning.ended()} of {spec.tune.per_study * len(tuning.studies)} trials ended (in "
            f"{tuning.folder}); run the same command again to go on: ended trials are not run again, and those in "
            "progress resume from their checkpoints"
        ) from None


def run_tuning(tuning: Tuning, executor: Executor, parallel: int, invocation: str, say: Any) -> list[Tuned]:
    """Every study's trials, round by round, through ``executor`` (``parallel`` new trials of each
    study a round); returns what each found."""
    tune = tuning.spec.model_dump(mode="json")
    total = tuning.spec.per_study * len(tuning.studies)
    for batch in tuning.rounds(parallel):
        jobs: dict[str, tuple[tuple[str, str], Any]] = {}
        listed = []
        for pair, trial, config in batch:
            job = RunJob(
                name=f"{pair[1]}/{pair[0]}/trial{trial.number}",
                config=config.model_dump(mode="json"),
                run_dir=str(tuning.folder_of(pair, trial.number)),
                invocation=invocation,
                tags={"task": pair[1], "variant": pair[0], "trial": str(trial.number)},
                trial={
                    "journal": tuning.journal,
                    "study": tuning.names[pair],
                    "trial_id": trial._trial_id,
                    "tune": tune,
                },
            )
            jobs[job.run_dir] = (pair, trial)
            listed.append(job)
        for event in executor.run(listed):
            if event.state not in ("done", "failed"):
                continue
            pair, trial = jobs[event.job.run_dir]
            result = event.record if event.state == "done" else None
            tuning.tell(pair, trial, result, event.error)
            ended = tuning.ended()
            outcome = (
                "failed: " + event.error.splitlines()[0]
                if result is None
                else f"pruned at step {result['step']}"
                if result["pruned"]
                else f"validation {tuning.metrics[pair[1]][0]} {result['value']:.4g}"
            )
            say(
                f"tuning [{ended}/{total}] {pair[0]} on {pair[1]}, trial {trial.number} "
                f"({', '.join(f'{k}={short(v)}' for k, v in trial.params.items())}): {outcome}"
            )
    return tuning.summary()


def make_executor(
    spec: CompareSpec,
    here: distributed.World,
    carried: list[str],
    stranded: list[str],
    runs: list[tuple[str, TrainConfig]],
    count: int,
    say: Any,
) -> Executor:
    """The spec's executor for ``count`` runs, and a line saying how they will train.

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
        )
        return RayExecutor(threads, carried, spec.retries, spec.address, runs_per_device=spec.runs_per_device)
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


def _as_run(record: dict[str, Any], label: str, folder: str, out_dir: Path, invocation: str) -> RunRecord:
    """A run's record as this report shows it: under this spec's label, its plots and folder
    named from the report, and reused when another invocation trained it."""
    where = _relative(folder, out_dir)
    plots = {
        key: str(Path(where) / Path(record[key]).name) for key in ("ponder_plot", "samples_plot") if record.get(key)
    }
    return RunRecord.model_validate(
        {**record, **plots, "variant": label, "run_folder": where, "reused": record.get("invocation") != invocation}
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
