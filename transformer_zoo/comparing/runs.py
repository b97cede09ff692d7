"""One run of a comparison, wherever it trains: a :class:`RunJob` says what to train and where
to write it, and :func:`execute_run` trains it (resuming its folder's checkpoint) and measures it
into a :class:`~transformer_zoo.comparing.records.RunRecord`.

An executor (:mod:`~transformer_zoo.comparing.executors`) takes :class:`Job` s, a run's or a
tuning trial's (:class:`~transformer_zoo.comparing.tuning.TrialJob`), and calls each one's
:meth:`Job.execute` in a worker process, a Ray task or this process; a job is picklable, and its
execution reads only the job.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from ..api import from_pretrained, load_config
from ..core.files import atomic_write
from ..training import distributed
from ..training.config import TrainConfig
from ..training.placement import resolve_device
from ..training.run_folder import RunFolderError, read_json
from ..training.step import Stepper
from ..training.trainer import train
from .probes import run_probes
from .records import RunRecord
from .scaling import PeakMemory

RECORD = "record.json"
"""A finished run's measurements, in its run folder; the run is in the cache once it is there."""
ATTEMPTS = "attempts.json"
"""How many times the run was started by which invocation: a second start is a retry."""


@dataclass(frozen=True)
class Job(ABC):
    """What an executor trains and where it writes.

    Attributes:
        name: the job's name in progress and trackers (``task/variant/seed0``).
        config: its training config, as JSON data.
        run_dir: its run folder (where every process that may train it can write: see
            docs/scaling.md).
        invocation: the comparison's invocation (its unique id).
        progress: show the training's own progress bar (one run at a time, on a terminal).
        tags: task, variant and seed (or trial), for trackers that group runs.
    """

    name: str
    config: dict[str, Any]
    run_dir: str
    invocation: str
    progress: bool = False
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The job as progress names it: ``VARIANT on TASK (seed S)``."""
        tags = self.tags
        return (
            f"{tags['variant']} on {tags['task']} (seed {tags['seed']})"
            if {"variant", "task", "seed"} <= set(tags)
            else self.name
        )

    @abstractmethod
    def execute(self, where: str = "") -> Any:
        """Train the job (resuming its folder's checkpoint) and return its result, as the driver
        reads it.

        Args:
            where: the device or node it trains on, as progress shows it.
        """


@dataclass(frozen=True)
class RunJob(Job):
    """A run of the comparison: trained, measured and recorded (:func:`execute_run`).

    Attributes:
        probes: the spec's probes of the trained model.
        rerun: train from scratch even where the folder holds a finished run or a checkpoint.
    """

    probes: tuple[str, ...] = ()
    rerun: bool = False

    def execute(self, where: str = "") -> dict[str, Any] | None:
        return execute_run(self, where)


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container or ``taskset`` narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def finished_record(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The record of a finished run folder, or None: also for a record that is no
    :class:`RunRecord` (one written before records carried a field they must have now, or one
    that does not read as JSON), whose run is then trained again."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = read_json(path)
        RunRecord.model_validate(record)
    except (RunFolderError, ValidationError):
        return None
    return record


def attempts_so_far(run_dir: str | os.PathLike, invocation: str) -> int:
    """How many times ``invocation`` has started the run."""
    return started_where(run_dir, invocation)[0]


def started_where(run_dir: str | os.PathLike, invocation: str) -> tuple[int, str]:
    """How many times ``invocation`` has started the run, and where its last start was; (0, "")
    for a folder not started yet, or whose file is being replaced as it is read.

    Raises:
        OSError: the folder cannot be read (a shared file system gone, say).
    """
    try:
        seen = read_json(Path(run_dir) / ATTEMPTS)
    except RunFolderError as exc:
        if isinstance(exc.__cause__, OSError) and not isinstance(exc.__cause__, FileNotFoundError):
            raise exc.__cause__ from None
        return 0, ""  # not started yet, or the file is being replaced as it is read
    if seen.get("invocation") != invocation:
        return 0, ""
    return seen.get("attempts", 0), seen.get("where", "")


def count_attempt(run_dir: Path, invocation: str, where: str = "") -> tuple[int, float]:
    """Count this start of the run, on ``where``: its number (1: the first of this invocation;
    more: a retry), and when the first start was (Unix time), from which the run's wall time
    counts. The file is how a driver that does not start the run itself (Ray's) learns that it
    started."""
    now = time.time()
    try:
        seen = read_json(run_dir / ATTEMPTS)
    except RunFolderError:
        seen = {}
    if seen.get("invocation") != invocation:
        seen = {"attempts": 0, "first_started": now}
    attempt, first = seen.get("attempts", 0) + 1, seen.get("first_started", now)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"invocation": invocation, "attempts": attempt, "where": where, "first_started": first})
    atomic_write(run_dir / ATTEMPTS, lambda tmp: tmp.write_text(text))
    return attempt, first


_TASKS: dict[str, Any] = {}  # a process's built tasks, by options: each builds its data once for all its runs


def built_task(options: Any) -> Any:
    """``options.build()``, once per process for equal options, so that a task's data are made
    once there: for every run a worker trains, and, in the comparison's own process, for the
    runs it trains and the summary's baselines alike."""
    key = options.model_dump_json()
    if key not in _TASKS:
        _TASKS[key] = options.build()
    return _TASKS[key]


def start_job(job: Job, where: str = "") -> tuple[int, float, TrainConfig, Any]:
    """Start a job here, on ``where``: count the start in its folder (1: the first of its
    invocation; more: a retry; always 1 in a torchrun job, whose processes nothing retries), and
    read its training config and task (built once per process). Returns the start's number, when
    the first start was (Unix time), the config and the task."""
    here = distributed.world()
    attempt, first = (1, time.time()) if here.launched else count_attempt(Path(job.run_dir), job.invocation, where)
    config = TrainConfig.model_validate(job.config)
    return attempt, first, config, built_task(config.task)


def execute_run(job: RunJob, where: str = "") -> dict[str, Any] | None:
    """Train one run (resuming its folder's checkpoint, unless ``job.rerun`` and this is its
    first attempt) and measure it; returns its record (also ``record.json`` in its folder), or
    None in a torchrun job's processes but 0.

    Args:
        where: the device or node it trains on, as progress shows it.
    """
    run_dir = Path(job.run_dir)
    attempt, first_started, config, task = start_job(job, where)
    fresh = job.rerun and attempt == 1
    if fresh:
        (run_dir / RECORD).unlink(missing_ok=True)
    cuda = torch.cuda.is_available() and config.device != "cpu"
    if cuda:  # the run's own peak: what the process held before it (an earlier run's tensors) does not count
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    when, load, begun = datetime.now(timezone.utc).isoformat(timespec="seconds"), os.getloadavg()[0], time.time()
    started = time.perf_counter()
    summary = train(config, run_dir, resume=not fresh, progress=job.progress, task=task, name=job.name, tags=job.tags)
    if "rank" in summary:  # another process of a torchrun job: process 0 measures and records
        return None
    load = max(load, os.getloadavg()[0])
    model = load_config(run_dir / "model" / "config.json")
    trained = from_pretrained(run_dir / "model").to(resolve_device(config.device)).eval()
    ponder, plot = ponder_summary(trained, task, run_dir)
    probed = run_probes(list(job.probes), trained, task)
    samples = task.plot_samples(trained, run_dir / "samples.png")
    flops, step_bytes = training_step_costs(trained, task, config)  # last: a training step moves the weights
    peak = torch.cuda.max_memory_allocated() - held if cuda else step_bytes
    record = RunRecord(
        variant=job.tags.get("variant", model.variant),
        family=type(model).family or model.variant,
        task=config.task.name,
        seed=config.seed,
        parameters=summary["parameters"],
        flops_per_token=flops,
        train_tokens_per_second=summary["train_tokens_per_second"],
        peak_memory_mb=peak / 2**20,
        steps=summary["step"],
        wall_seconds=max(time.time() - first_started, time.perf_counter() - started),
        last_attempt_seconds=time.perf_counter() - started,
        metric=task.metric,
        metrics=summary["metrics"],
        better=task.metrics,
        bounds=task.bounds,
        curve=summary["history"],
        ponder_time=ponder,
        ponder_plot=plot,
        probes=probed,
        samples_plot=None if samples is None else samples.name,
        width=getattr(model, "d_model", None),
        started=when,
        timespan=(begun, time.time()),
        threads=torch.get_num_threads(),
        cpus=available_cores(),
        load_average=load,
        invocation=job.invocation,
        placed_on=where,
        attempts=attempt,
        resumed_from=summary["resumed_from"],
        shared=summary.get("shared", []),  # those three with shared_init alone
        own=summary.get("own", []),
        shared_weights=summary.get("shared_weights", 0),
    ).model_dump()
    atomic_write(run_dir / RECORD, lambda tmp: tmp.write_text(json.dumps(record)))
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
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in itertools.chain(model.parameters(), model.buffers())
    }
    with PeakMemory() as memory:
        _, flops = stepper.counted_step(0, batch)
    return flops / max(task.tokens_in(batch), 1), sum(storages.values()) + memory.peak


@torch.no_grad()
def ponder_summary(
    model: torch.nn.Module, task: Any, run_dir: Path, examples: int = 64
) -> tuple[dict[str, float], str | None]:
    """Mean ponder time per stack over the first test examples of a finished run, and a heat
    map of the first one (``ponder.png`` in the run folder, named relative to it); nothing for
    a model without a recurrent stack. One without ACT reports its fixed number of steps, and
    no map: every position would show the same number."""
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
    if all(v[v > 0].min() == v[v > 0].max() for v in maps.values()):  # fixed steps: nothing to map
        return means, None
    one = task.example_inputs(model, rows[0])
    first = {k.removesuffix("_ponder_time"): v[0] for k, v in model(**one).extras.items() if k.endswith("ponder_time")}
    labels = {"encoder": "src", "decoder": "tgt"}
    if any(labels.get(stack, "src") not in one for stack in first):  # an image model: no tokens to label
        return means, None
    tokens = {stack: task.token_strings(one[labels.get(stack, "src")][0].tolist()) for stack in first}
    plot_ponder(first, tokens, run_dir / "ponder.png")
    return means, "ponder.png"
