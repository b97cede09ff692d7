"""``tzoo compare``: every variant on every task, with the same data, seeds and budget.

A spec lists variants x tasks x seeds and one budget. Each run trains in a process of its own
(so its peak memory is its own); on a torchrun job every run trains over all the job's
processes, one run after another, and process 0 writes the report. Each run records parameters, FLOPs per token, training tokens per
second, peak memory, the task metrics, the learning curve and wall time. The report folder
holds ``results.json`` (validated by :class:`CompareResults`), ``report.md`` and PNG plots.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import platform
import resource
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field, model_validator

from . import __version__, distributed
from .api import _read, build_model, load_config, validate
from .core.errors import ConfigError
from .core.model import atomic_write
from .core.options import Options, Task
from .scaling import ScalingPoint, ScalingSpec, measure_scaling
from .train import TrainConfig, model_config_for, resolve_device, train


class CompareSpec(Options):
    """What to compare: variants x tasks x seeds, under one budget."""

    name: str = Field("compare", description="a name for the report")
    variants: list[str | dict[str, Any]] = Field(min_length=1, description="variant names or model configs")
    tasks: list[Task] = Field(min_length=1, description="tasks (kind names or mappings with 'kind')")
    steps: int = Field(500, ge=1, description="training steps of every run")
    seconds: float | None = Field(None, gt=0, description="also stop each run after this much training time")
    seeds: list[int] = Field([0], min_length=1, description="seeds; every variant and task runs once per seed")
    train: dict[str, Any] = Field({}, description="other training options for every run (batch_size, lr, ...)")
    task_train: dict[str, dict[str, Any]] = Field(
        {}, description="by task kind: training options for the runs on that task, over 'train' (a GAN's recipe)")
    scaling: ScalingSpec | None = Field(
        None, description="also measure time and memory against sequence length of the variants on one task")

    @model_validator(mode="after")
    def _scaling_task(self) -> CompareSpec:
        kinds = [task.kind for task in self.tasks]
        unknown = sorted(set(self.task_train) - set(kinds))
        if unknown:
            raise ValueError(f"task_train names {unknown}, which are not among the spec's tasks {kinds}")
        if self.scaling is not None and self.scaling.task is not None and self.scaling.task not in kinds:
            raise ValueError(f"scaling.task {self.scaling.task!r} is not one of the spec's tasks {kinds}; name one of them")
        return self


class RunRecord(BaseModel):
    """One run of one variant on one task with one seed."""

    variant: str = Field(description="the variant's label in the spec")
    family: str = Field(description="the variant's family")
    task: str = Field(description="the task kind")
    seed: int = Field(description="the run's seed")
    parameters: int = Field(description="trainable parameters (tied weights counted once)")
    flops_per_token: float = Field(
        description="training FLOPs per token read: forward and backward of one batch, counted by torch's FlopCounterMode"
    )
    train_tokens_per_second: float = Field(description="tokens read by the model per second of training")
    peak_memory_mb: float = Field(
        description="peak memory of the run: CUDA allocations on GPU, the process's resident set on CPU (on a torchrun "
        "job, process 0's: on CPU its peak so far, as the job's runs share the process)")
    steps: int = Field(description="optimizer steps taken")
    wall_seconds: float = Field(description="wall time of the run, evaluation included")
    metric: str = Field(description="the task's headline metric")
    metrics: dict[str, dict[str, float]] = Field(description="metrics by evaluation split")
    curve: list[dict[str, float]] = Field(description="the learning curve: step, loss, lr, and test metrics when evaluated")
    ponder_time: dict[str, float] = Field(
        {}, description="models with a recurrent stack: mean steps per real test position, by stack (fixed without ACT)"
    )
    ponder_plot: str | None = Field(None, description="a heat map of one test example's ponder times, relative to the report")
    samples_plot: str | None = Field(None, description="a generation task: a grid of samples, relative to the report")


class Skipped(BaseModel):
    """A variant and task that were not run, and why."""

    variant: str = Field(description="the variant's label")
    task: str = Field(description="the task kind")
    reason: str = Field(description="why the variant cannot do the task")


class CompareResults(BaseModel):
    """The contents of results.json."""

    spec: dict[str, Any] = Field(description="the spec as run")
    machine: dict[str, Any] = Field(description="where it ran")
    runs: list[RunRecord] = Field(description="one record per run")
    skipped: list[Skipped] = Field(description="pairs not run, with the reason")
    baselines: dict[str, dict[str, float]] = Field(
        {}, description="by task: test scores of a reference predictor (the majority class), where the task has one"
    )
    baseline_names: dict[str, str] = Field({}, description="by task: what its baseline is")
    scaling: list[ScalingPoint] = Field([], description="time and memory against sequence length, when the spec asks")


def default_spec_path() -> Path:
    return Path(str(resources.files("transformer_zoo") / "specs" / "default.yaml"))


def load_spec(source: str | os.PathLike | dict | None = None) -> CompareSpec:
    """A validated spec from a YAML/JSON file or mapping; the built-in default when None."""
    data = _read(default_spec_path() if source is None else source)
    return validate(CompareSpec, data, "compare spec")


def _label(variant: str | dict[str, Any]) -> str:
    if isinstance(variant, str):
        return variant
    extra = {k: v for k, v in variant.items() if k != "variant"}
    return variant["variant"] + ("" if not extra else " " + json.dumps(extra, sort_keys=True, separators=(",", "=")))


def plan(spec: CompareSpec, processes: int = 1) -> tuple[list[tuple[str, TrainConfig]], list[Skipped]]:
    """Every run's training config, and the pairs that cannot run; all checked before training.

    Args:
        processes: the processes every run trains over (a torchrun job's); a model that trains
            in several phases (a GAN) is skipped when there are more than one.
    """
    runs, skipped = [], []
    for variant in spec.variants:
        load_config({"variant": variant} if isinstance(variant, str) else variant)  # unknown names fail here
        for task_options in spec.tasks:
            task = task_options.build()
            for seed in spec.seeds:
                config = validate(
                    TrainConfig,
                    {**spec.train, **spec.task_train.get(task_options.kind, {}), "model": variant, "task": task_options,
                     "steps": spec.steps, "max_seconds": spec.seconds, "seed": seed},
                    "compare spec 'train' and 'task_train' options",
                )
                if processes > 1 and config.batch_size % processes:
                    where = "task_train" if "batch_size" in spec.task_train.get(task_options.kind, {}) else "train"
                    raise ConfigError(f"batch_size {config.batch_size} is each run's global batch, split over the job's "
                                      f"{processes} processes; set the spec's {where} batch_size "
                                      f"({task_options.kind!r}) to a multiple of {processes}")
                try:
                    model = model_config_for(config, task)
                    phases = _phases(model) if processes > 1 else []
                    if len(phases) > 1:
                        raise ValueError(f"{model.variant!r} trains in phases {phases}, which run in one process only; "
                                         "compare it in a job of one process")
                except ValueError as exc:
                    skipped.append(Skipped(variant=_label(variant), task=task_options.kind, reason=str(exc)))
                    break
                runs.append((_label(variant), config))
    if not runs:
        raise ConfigError("no variant in the spec can do any of its tasks:\n" + "\n".join(f"  {s.reason}" for s in skipped))
    return runs, skipped


def _phases(model) -> list[str]:
    """The names of a model config's training phases (the model is built without memory)."""
    with torch.device("meta"):
        return [phase.name for phase in build_model(model).phases()]


def run_name(label: str, config: TrainConfig) -> str:
    """A folder name that is the same every time the same run is planned (so it resumes)."""
    digest = hashlib.sha1(f"{label}|{config.model_dump_json()}".encode()).hexdigest()[:8]
    return f"{config.task.kind}--{label.split(' ')[0]}--seed{config.seed}--{digest}"


def _run(args: tuple[str, dict[str, Any], str]) -> dict[str, Any] | None:
    """One run, in a process of its own (or in each of a torchrun job's: None but in process 0)."""
    label, config_data, run_dir = args
    record_path = Path(run_dir) / "record.json"
    if record_path.is_file():  # finished by an earlier, interrupted compare: keep its measurements
        return json.loads(record_path.read_text())
    config = TrainConfig.model_validate(config_data)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = train(config, run_dir, resume=True, progress=True)
    if "rank" in summary:  # another process of a torchrun job: process 0 measures and records
        return None
    model = load_config(Path(run_dir, "model", "config.json"))
    if torch.cuda.is_available() and config.device != "cpu":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    from .train import load_run

    _, task, trained = load_run(run_dir)
    ponder, plot = ponder_summary(trained, task, Path(run_dir))
    samples = task.plot_samples(trained, Path(run_dir) / "samples.png")
    flops = training_flops_per_token(trained, task, config)  # last: a training step moves batch-norm statistics
    record = RunRecord(
        variant=label, family=type(model).family or model.variant, task=config.task.kind, seed=config.seed,
        parameters=summary["parameters"], flops_per_token=flops,
        train_tokens_per_second=summary["train_tokens_per_second"], peak_memory_mb=peak,
        steps=summary["step"], wall_seconds=time.perf_counter() - started, metric=task.metric,
        metrics=summary["metrics"], curve=summary["history"], ponder_time=ponder, ponder_plot=plot,
        samples_plot=None if samples is None else str(Path("runs") / Path(run_dir).name / samples.name),
    ).model_dump()
    record_path.write_text(json.dumps(record))
    return record


def training_flops_per_token(model: torch.nn.Module, task: Any, config: TrainConfig) -> float:
    """FLOPs of a training step's forward and backward on one batch of the run's size, per token
    the model reads, as counted by ``torch.utils.flop_counter`` (matrix products and attention).

    Counted, not estimated: a recurrent stack counts the steps it really ran.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from .train import _batch, _only

    model.train()
    batch = _batch(task, task.dataset("train"), 0, config, next(model.parameters()).device)
    phases = model.phases()
    with FlopCounterMode(display=False) as counter:
        if len(phases) == 1:
            task.loss(model, batch).backward()
        else:
            for phase in phases:
                with _only(phase.parameters, model):  # as training runs it: no gradient for the other phases
                    task.loss(model, batch, phase.name).backward()
    return counter.get_total_flops() / max(task.tokens_in(batch), 1)


@torch.no_grad()
def ponder_summary(model: torch.nn.Module, task: Any, run_dir: Path, examples: int = 64) -> tuple[dict[str, float], str | None]:
    """Mean ponder time per stack over the first test examples of a finished run, and a heat
    map of the first one (``ponder.png`` in the run folder); nothing for a model without a
    recurrent stack (one without ACT reports its fixed number of steps)."""
    from .report import plot_ponder

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
    points = measure_scaling(models, task, spec.scaling, device)
    text = json.dumps({"key": key, "points": [p.model_dump() for p in points]})
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return points


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "processes": distributed.world().size,
    }


def compare(spec: CompareSpec, out_dir: str | os.PathLike) -> CompareResults | None:
    """Run the spec and write ``results.json``, ``report.md`` and plots into ``out_dir``.

    On a torchrun job every process calls it; process 0 writes and returns the results, the
    others return None."""
    from .report import write_report

    out_dir = Path(out_dir)
    here = distributed.world()
    runs, skipped = plan(spec, here.size)
    def say(message: str) -> None:  # progress goes to stderr: stdout is the command's result (--json)
        if here.main:
            print(message, file=sys.stderr)

    for item in skipped:
        say(f"skipped {item.variant} on {item.task}: {item.reason}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(label, config.model_dump(mode="json"), str(out_dir / "runs" / run_name(label, config))) for label, config in runs]
    records = []
    with contextlib.ExitStack() as stack:
        if here.launched:  # the job's processes train each run together, in turn
            done = map(_run, jobs)
        else:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1))
            done = pool.imap(_run, jobs)
        for i, record in enumerate(done, start=1):
            if record is not None and here.main:
                records.append(RunRecord.model_validate(record))
                say(f"[{i}/{len(jobs)}] {record['variant']} on {record['task']} (seed {record['seed']}): "
                    f"{record['metric']} {record['metrics']['test'][record['metric']]:.3f}")
    if not here.main:
        return None
    tasks = {options.kind: options.build() for options in spec.tasks}
    baselines = {kind: task.baselines("test") for kind, task in tasks.items()}
    results = CompareResults(spec=spec.model_dump(mode="json"), machine=machine(), runs=records, skipped=skipped,
                             baselines={kind: scores for kind, scores in baselines.items() if scores},
                             baseline_names={kind: task.baseline for kind, task in tasks.items() if baselines[kind]},
                             scaling=scaling_points(spec, runs, out_dir))
    (out_dir / "results.json").write_text(results.model_dump_json(indent=2))
    write_report(results, out_dir)
    return results
