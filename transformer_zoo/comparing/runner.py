"""``tzoo compare``: every variant on every task, with the same data, seeds and budget.

A spec lists variants x tasks x seeds and one budget. Runs train in worker processes (``workers``
at a time, each with ``threads`` CPU threads; a worker builds each task's data once and trains
run after run; with one worker, in this process); on a torchrun job every run trains over all
the job's processes, one run after another, and process 0 writes the report. Each run records parameters, FLOPs per token,
training tokens per second, peak memory, the task metrics, the learning curve and wall time,
and when, with how many threads and under what load it ran. The report folder holds
``results.json`` (validated by :class:`CompareResults`, with the intervals and tests over
seeds), ``report.md`` and PNG plots.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..api import from_pretrained, load_config
from ..core.model import atomic_write
from ..registry import get_registry
from ..training import distributed
from ..training.checkpoints import check_folder
from ..training.config import TrainConfig
from ..training.placement import resolve_device
from ..training.step import Stepper
from ..training.trainer import TrainingInterrupted, model_config_for, train
from .probes import run_probes
from .records import CompareResults, RunRecord
from .scaling import PeakMemory, ScalingPoint, measure_scaling
from .spec import CompareSpec, plan, run_name
from .summary import summarize


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container or ``taskset`` narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

def run_threads(spec: CompareSpec) -> int:
    """The CPU threads of each run: the spec's, else the available cores shared among the workers.

    More threads than cores is a slowdown, not a speedup: OpenMP threads that wait for one another
    spin, and on a busy machine they spin on cores another process needs."""
    return spec.threads or max(1, available_cores() // spec.workers)

_TASKS: dict[str, Any] = {}  # a worker's built tasks, by options: each builds its data once for all its runs

def _init_worker(plugins: list[str], threads: int) -> None:
    """A worker process: the threads of its runs, and the plugins registered where compare was called.

    Ctrl-C reaches every process of the terminal's group; a worker ignores it, and the
    comparison's own process, which hears it too, ends the workers (see :func:`compare`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    registry = get_registry()
    for module in plugins:
        registry.register_module(module)

def _run(args: tuple[str, dict[str, Any], str, str, bool, list[str]]) -> dict[str, Any] | None:
    """One run, in a worker process (or in each of a torchrun job's: None but in process 0)."""
    label, config_data, run_dir, invocation, progress, probes = args
    record_path = Path(run_dir) / "record.json"
    if record_path.is_file():  # finished earlier: keep its measurements, flagged when another invocation made them
        record = json.loads(record_path.read_text())
        return {**record, "reused": record.get("invocation") != invocation}
    config = TrainConfig.model_validate(config_data)
    key = config.task.model_dump_json()
    if key not in _TASKS:
        _TASKS[key] = config.task.build()
    task = _TASKS[key]
    cuda = torch.cuda.is_available() and config.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    when, load = datetime.now(timezone.utc).isoformat(timespec="seconds"), os.getloadavg()[0]
    started = time.perf_counter()
    summary = train(config, run_dir, resume=True, progress=progress, task=task)
    if "rank" in summary:  # another process of a torchrun job: process 0 measures and records
        return None
    load = max(load, os.getloadavg()[0])
    model = load_config(Path(run_dir, "model", "config.json"))
    trained = from_pretrained(Path(run_dir, "model")).to(resolve_device(config.device)).eval()
    ponder, plot = ponder_summary(trained, task, Path(run_dir))
    probed = run_probes(probes, trained, task)
    samples = task.plot_samples(trained, Path(run_dir) / "samples.png")
    flops, step_bytes = training_step_costs(trained, task, config)  # last: a training step moves the weights
    peak = torch.cuda.max_memory_allocated() if cuda else step_bytes
    record = RunRecord(
        variant=label, family=type(model).family or model.variant, task=config.task.kind, seed=config.seed,
        parameters=summary["parameters"], flops_per_token=flops,
        train_tokens_per_second=summary["train_tokens_per_second"], peak_memory_mb=peak / 2**20,
        steps=summary["step"], wall_seconds=time.perf_counter() - started, metric=task.metric,
        metrics=summary["metrics"], better=task.metrics, curve=summary["history"], ponder_time=ponder, ponder_plot=plot,
        probes=probed, samples_plot=None if samples is None else str(Path("runs") / Path(run_dir).name / samples.name),
        started=when, threads=torch.get_num_threads(), cpus=available_cores(), load_average=load,
        invocation=invocation,
    ).model_dump()
    atomic_write(record_path, lambda tmp: tmp.write_text(json.dumps(record)))
    return record

def training_step_costs(model: torch.nn.Module, task: Any, config: TrainConfig) -> tuple[float, float]:
    """One training step on the run's first batch, as training takes it (each phase's loss, backward,
    gradient clipping and AdamW step, by :class:`~transformer_zoo.training.step.Stepper`), counted, not estimated:

    - FLOPs of its forward and backward passes per token the model reads, by
      ``torch.utils.flop_counter`` (matrix products and attention; a recurrent stack counts the
      steps it really ran);
    - the peak bytes of tensor storage alive at once: the weights, and what the step creates
      (activations, gradients, AdamW's state), by :class:`~transformer_zoo.comparing.scaling.PeakMemory`.
    """
    # in this process alone (under torchrun only process 0 measures), eagerly, from the model as it is
    stepper = Stepper(config, task, model.train())
    model.zero_grad(set_to_none=True)  # as each training step starts: gradients are the step's own
    batch = stepper.batch(0)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in itertools.chain(model.parameters(), model.buffers())}
    with PeakMemory() as memory:
        _, flops = stepper.counted_step(0, batch)
    return flops / max(task.tokens_in(batch), 1), sum(storages.values()) + memory.peak

@torch.no_grad()
def ponder_summary(model: torch.nn.Module, task: Any, run_dir: Path, examples: int = 64) -> tuple[dict[str, float], str | None]:
    """Mean ponder time per stack over the first test examples of a finished run, and a heat
    map of the first one (``ponder.png`` in the run folder); nothing for a model without a
    recurrent stack (one without ACT reports its fixed number of steps)."""
    from .plots import plot_ponder

    model.eval()
    test = task.dataset("test")
    rows = [test[i] for i in range(min(examples, len(test)))]
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in task.model_inputs(model, task.collate(rows)).items()}
    out = model(**inputs)
    maps = {k.removesuffix("_ponder_time"): v for k, v in out.extras.items() if k.endswith("ponder_time")}
    if not maps:
        return {}, None
    means = {stack: float(v[v > 0].mean()) for stack, v in maps.items()}
    one = task.example_inputs(model, rows[0])
    first = {k.removesuffix("_ponder_time"): v[0] for k, v in model(**one).extras.items() if k.endswith("ponder_time")}
    labels = {"encoder": "src", "decoder": "tgt"}
    if any(labels.get(stack, "src") not in one for stack in first):  # an image model: no tokens to label
        return means, None
    tokens = {stack: task.token_strings(one[labels.get(stack, "src")][0].tolist()) for stack in first}
    plot_ponder(first, tokens, run_dir / "ponder.png")
    return means, str(Path("runs") / run_dir.name / "ponder.png")

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
    key = {"spec": spec.scaling.model_dump(mode="json"), "task": options.model_dump(mode="json"),
           "models": [[label, config.model_dump(mode="json")] for label, config in models],
           "device": str(device), "machine": machine(), "transformer_zoo": __version__}
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

def compare(spec: CompareSpec, out_dir: str | os.PathLike, plugins: list[str] | None = None) -> CompareResults | None:
    """Run the spec and write ``results.json``, ``report.md`` and plots into ``out_dir``.

    Args:
        plugins: plugin modules to register here and in every worker (``--plugin``); plugins
            registered in this process before the call are carried to the workers too, and
            one that no worker could import (an object defined in a notebook) keeps the runs
            in this process, one at a time.

    On a torchrun job every process calls it; process 0 writes and returns the results, the
    others return None.

    Raises:
        RunFolderError: ``out_dir`` is a file.
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
    threads, workers = run_threads(spec), min(spec.workers, len(runs))
    # a bar redraws with carriage returns: only for one run at a time, on a terminal
    bars = workers == 1 and sys.stderr.isatty()
    # the largest budgets (steps x batch) start first, so that no long run is left to finish alone
    order = sorted(runs, key=lambda run: -run[1].steps * run[1].batch_size) if workers > 1 else runs
    jobs = [(label, config.model_dump(mode="json"), str(out_dir / "runs" / run_name(label, config)), invocation, bars,
             list(spec.probes)) for label, config in order]
    if stranded and not here.launched:  # a worker could not register them: train here, one run at a time
        workers = 1
        say(f"plugin(s) {', '.join(stranded)} are not importable modules, so no worker process could register them: "
            "the runs train in this process, one at a time (put a plugin's hooks in a module and pass --plugin "
            "MODULE to train in workers)")
    say(f"{len(jobs)} runs, {workers} at a time" + ("" if here.launched else f", {threads} CPU threads each"))
    records, started = {}, time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_interruptions(records, len(jobs), out_dir))  # entered first: left after the pool ends
        if here.launched:  # the job's processes train each run together, in turn
            done = map(_run, jobs)
        elif stranded or workers == 1:  # one run at a time: in this process, no worker to start
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
            done = map(_run, jobs)
        else:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(carried, threads)))
            done = pool.imap_unordered(_run, jobs)
        for i, record in enumerate(done, start=1):
            if record is None or not here.main:
                continue
            run = RunRecord.model_validate(record)
            records[(run.variant, run.task, run.seed)] = run
            elapsed = time.perf_counter() - started
            eta = elapsed / i * (len(jobs) - i)
            say(f"[{i}/{len(jobs)}] {run.variant} on {run.task} (seed {run.seed}): {run.metric} "
                f"{run.metrics['test'][run.metric]:.4g}, {run.wall_seconds:.0f} s"
                + (" (kept from an earlier invocation)" if run.reused else "")
                + (f"; about {_duration(eta)} to go" if i < len(jobs) else f"; all runs in {_duration(elapsed)}"))
    if not here.main:
        return None
    ordered = [records[(label, config.task.kind, config.seed)] for label, config in runs]
    tasks = {options.kind: options.build() for options in spec.tasks}
    baselines = {kind: task.baselines("test") for kind, task in tasks.items()}
    if spec.scaling is not None:
        say("measuring time and memory against length")
    results = CompareResults(spec=spec.model_dump(mode="json"), machine=machine(), invocation=invocation, runs=ordered,
                             skipped=skipped, baselines={kind: scores for kind, scores in baselines.items() if scores},
                             baseline_names={kind: task.baseline for kind, task in tasks.items() if baselines[kind]},
                             scaling=scaling_points(spec, runs, out_dir))
    results.summaries = summarize(results.runs, spec.reference, spec.test, invocation)
    (out_dir / "results.json").write_text(results.model_dump_json(indent=2))
    write_report(results, out_dir)
    say(f"compared {len(records)} runs in {_duration(time.perf_counter() - begun)} of wall time; report: "
        f"{out_dir / 'report.md'}")
    return results

class ComparisonInterrupted(KeyboardInterrupt):
    """A comparison stopped by Ctrl-C; the message says what is kept and how to go on."""

@contextlib.contextmanager
def _interruptions(records: dict, total: int, out_dir: Path) -> Iterator[None]:
    """Ctrl-C while the runs train, as one :class:`ComparisonInterrupted` saying what is kept."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, TrainingInterrupted) and exc.saved is not None:
            current = f"the run in progress saved its step {exc.saved}"
        else:
            current = "runs in progress keep their last checkpoints"
        raise ComparisonInterrupted(
            f"comparison interrupted with {len(records)} of {total} runs finished (in {out_dir / 'runs'}); {current}; "
            "run the same command again to go on: finished runs are reused and the others resume from their "
            "checkpoints") from None

def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
