"""Training: one model on one task for a budget of steps, with exact resume.

A run folder holds ``train.json`` (the run's config), what the task derived from its data
(``tokenizer/`` for text tasks), ``checkpoint/`` (``model.safetensors``,
``config.json``, ``optimizer.pt``, ``state.json``; replaced atomically) and ``metrics.jsonl``
(the learning curve). Batches are drawn by a generator seeded from (seed, step), so a run
resumed from step k sees exactly the batches an uninterrupted run sees.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import safetensors.torch
import torch
from pydantic import Field
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.flop_counter import FlopCounterMode

from . import distributed
from .api import _read, build_model, load_config, merge, parse_overrides, validate
from .core.errors import ConfigError
from .core.options import Options, Task, VariantConfig

CHECKPOINT = "checkpoint"


class TrainConfig(Options):
    """One training run: a model, a task and a budget."""

    model: str | dict[str, Any] = Field(description="a variant name, or a model config mapping with 'variant'")
    task: Task = Field(description="the task to train on (a kind name or a mapping with 'kind')")
    steps: int = Field(1000, ge=1, description="optimizer steps (the schedule's length)")
    max_seconds: float | None = Field(None, gt=0, description="also stop after this much training time; null: no limit")
    batch_size: int = Field(64, ge=1, description="examples per step")
    lr: float = Field(1e-3, gt=0, description="peak learning rate of AdamW")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(100, ge=0, description="linear warm-up steps")
    schedule: Literal["constant", "cosine", "inverse-sqrt"] = Field("cosine", description="learning-rate shape after warm-up")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient norm to this value; null: no clipping")
    seed: int = Field(0, description="seed of initialisation, batch order and dropout")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train; auto: cuda when available")
    bf16: bool = Field(True, description="bfloat16 autocast on CUDA (ignored on CPU)")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="on several processes (torchrun): ddp keeps a whole copy of the model in each; fsdp shards "
        "parameters, gradients and optimizer state over them, for models too large for one device")
    compile: bool = Field(False, description="train the model through torch.compile (the first steps pay for compiling)")
    peak_tflops: float | None = Field(
        None, gt=0, description="the device's peak TFLOP/s, for model FLOPs utilisation; null: known GPUs' bf16 peak")
    eval_every: int = Field(0, ge=0, description="evaluate on the test split every N steps; 0: only at the end")
    checkpoint_every: int = Field(0, ge=0, description="write a checkpoint every N steps; 0: only at the end")
    log_every: int = Field(10, ge=1, description="record the training loss every N steps")


def load_train_config(source: str | os.PathLike | dict, overrides: list[str] | None = None) -> TrainConfig:
    """A validated training config from a YAML/JSON file or a mapping, with ``key=value`` overrides."""
    if not isinstance(source, dict) and not Path(source).is_file():
        raise ConfigError(f"training config {str(source)!r} does not exist; give a YAML or JSON file")
    data = _read(source)
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return validate(TrainConfig, data, "training config")


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available; ask for the CPU (cpu) or "
                         "for auto, which takes CUDA when there is one")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else ("cpu" if name == "auto" else name))


def lr_factor(step: int, config: TrainConfig) -> float:
    """Multiplier of ``lr`` at ``step`` (0-based): linear warm-up, then the chosen shape."""
    warm = config.warmup_steps
    if step < warm:
        return (step + 1) / warm
    if config.schedule == "constant":
        return 1.0
    if config.schedule == "inverse-sqrt":
        return math.sqrt(max(warm, 1) / (step + 1))
    progress = (step - warm) / max(1, config.steps - warm)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def model_config_for(config: TrainConfig, task) -> VariantConfig:
    """The model config with the task's fixed values applied.

    Raises:
        ValueError: the variant cannot do the task (before anything is built).
    """
    model = load_config({"variant": config.model} if isinstance(config.model, str) else config.model)
    images = getattr(model, "inputs", "tokens") == "image"
    reason = task.image_unfit_reason(model) if images else task.unfit_reason(model)
    if reason:
        raise ValueError(f"variant {model.variant!r} cannot do task {config.task.kind!r}: {reason}")
    return load_config(model, task.image_overrides() if images else task.model_overrides())


def _step_seed(config: TrainConfig, step: int) -> int:
    """The seed of step ``step``'s batch: the same whatever ran before it, so resuming is exact."""
    return config.seed * 1_000_003 + step


def _batch(task, dataset, step: int, config: TrainConfig, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(_step_seed(config, step))
    index = torch.randint(len(dataset), (config.batch_size,), generator=generator).tolist()
    rows = dataset[index]
    batch = task.collate([dict(zip(rows, values)) for values in zip(*rows.values())])
    return {k: v.to(device) for k, v in batch.items()}


def _save_checkpoint(run_dir: Path, model, optimizers: dict, schedulers: dict, step: int, history: list,
                     device: torch.device) -> None:
    """Write the checkpoint into a fresh folder, then swap it in; the old one survives a crash.

    ``optimizers`` holds each phase's optimizer state dict, in one process's layout."""
    final, tmp, old = run_dir / CHECKPOINT, run_dir / f".{CHECKPOINT}.tmp", run_dir / f".{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    states = {"optimizers": optimizers,
              "schedulers": {name: scheduler.state_dict() for name, scheduler in schedulers.items()}}
    torch.save(states, tmp / "optimizer.pt")
    state = {"step": step, "rng": torch.get_rng_state().tolist(), "history": history}
    if device.type == "cuda":  # dropout on CUDA draws from the device's generator
        state["cuda_rng"] = torch.cuda.get_rng_state(device).tolist()
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def fused_adamw(device: torch.device, sharded: bool = False) -> bool:
    """Whether AdamW takes its fused kernel: on CUDA, where it updates every parameter in a few
    launches instead of a dozen per parameter group (a bert-base step spent 4% of its time in the
    unfused update); not over FSDP's sharded parameters."""
    return device.type == "cuda" and not sharded


def _optimizers(model, config: TrainConfig, fused: bool = False) -> tuple[list, dict, dict]:
    """The model's phases, with an AdamW optimizer and a learning-rate schedule for each
    (``fused``: AdamW's fused kernel).

    Raises:
        ValueError: the phases are unnamed, named twice, or do not train every trainable
            parameter exactly once.
    """
    phases = model.phases()
    names = [phase.name for phase in phases]
    if len(set(names)) != len(names) or not phases:
        raise ValueError(f"{type(model).__name__}.phases() must name one or more phases, each once; got {names}")
    trained = [id(p) for phase in phases for p in phase.parameters if p.requires_grad]
    if len(set(trained)) != len(trained) or set(trained) != {id(p) for p in model.parameters() if p.requires_grad}:
        raise ValueError(f"{type(model).__name__}.phases() {names} must train every trainable parameter of the model "
                         "exactly once: one phase's parameters may not be in another, and none may be left out")
    optimizers, schedulers = {}, {}
    for phase in phases:
        settings = ({} if phase.betas is None else {"betas": phase.betas}) | ({"fused": True} if fused else {})
        optimizers[phase.name] = torch.optim.AdamW(
            phase.parameters, lr=config.lr * phase.lr_scale,
            weight_decay=config.weight_decay if phase.weight_decay is None else phase.weight_decay, **settings)
        schedulers[phase.name] = LambdaLR(optimizers[phase.name], lambda step: lr_factor(step, config))
    return phases, optimizers, schedulers


def _load_optimizers(path: Path, optimizers: dict, schedulers: dict, device: torch.device, sharded: bool) -> None:
    # sharded: read on the CPU, and each process moves only its shards to the device
    states = torch.load(path, map_location="cpu" if sharded else device, weights_only=True)
    if "optimizer" in states and len(optimizers) == 1:  # written before models had phases
        name = next(iter(optimizers))
        states = {"optimizers": {name: states["optimizer"]}, "schedulers": {name: states["scheduler"]}}
    saved = sorted(states.get("optimizers", {}))
    if saved != sorted(optimizers):
        raise ValueError(f"the checkpoint in {path.parent} has optimizers for the phases {saved}, and the model trains "
                         f"in {sorted(optimizers)}; resume with the model it was written by, or start over (--restart)")
    for name in optimizers:
        state = states["optimizers"][name]
        optimizers[name].load_state_dict(distributed.sharded_optimizer(state, optimizers[name]) if sharded else state)
        schedulers[name].load_state_dict(states["schedulers"][name])


@contextlib.contextmanager
def _only(parameters, model):
    """Freeze every parameter of ``model`` but ``parameters`` (no gradient is computed for them)."""
    keep = {id(p) for p in parameters}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _latest_checkpoint(run_dir: Path) -> Path | None:
    for candidate in (run_dir / CHECKPOINT, run_dir / f".{CHECKPOINT}.old"):
        if (candidate / "state.json").is_file():
            return candidate
    return None


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10G": 70.0}
"""Dense bfloat16 tensor-core peaks (no sparsity) by device name, from the vendors' data sheets;
the first key found in the device's name wins, so the more specific names come first."""


def datasheet_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of a known GPU (:data:`PEAK_BF16_TFLOPS`); None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def peak_tflops(config: TrainConfig, device: torch.device) -> float | None:
    """The peak MFU is measured against: ``config.peak_tflops``, else a known GPU's bf16 peak."""
    if config.peak_tflops is not None:
        return config.peak_tflops
    return datasheet_tflops(device) if config.bf16 else None


def train(config: TrainConfig, run_dir: str | os.PathLike, *, resume: bool = True, progress: bool = True,
          stop_after: int | None = None, task: Any = None) -> dict[str, Any]:
    """Train ``config.model`` on ``config.task``; returns the run summary (also in ``summary.json``).

    Args:
        run_dir: the run folder; an existing checkpoint there is resumed when ``resume``.
        progress: show a progress bar with loss and throughput.
        stop_after: stop (after checkpointing) once this step is reached, as an interruption would.
        task: ``config.task`` already built (a comparison builds each task once for all its
            seeds); None: built here.
    """
    here = distributed.world()  # one process, or one of those torchrun started
    if here.size > 1 and config.batch_size % here.size:
        raise ValueError(f"batch_size {config.batch_size} is the global batch, split over {here.size} processes; "
                         f"use a multiple of {here.size}")
    run_dir = Path(run_dir)
    device = resolve_device(config.device)
    if device.type == "cuda" and here.launched:
        device = torch.device("cuda", here.local_rank)  # world() made it the process's current device
    checkpoint = _latest_checkpoint(run_dir) if resume else None
    if checkpoint is not None:  # the run's own tokenizer (or other assets), whatever the data is now
        task = config.task.with_assets(run_dir).build()
    elif task is None:
        task = config.task.build()
    torch.manual_seed(config.seed)
    model = build_model(model_config_for(config, task))
    phase_names = [phase.name for phase in model.phases()]
    if len(phase_names) > 1 and (here.size > 1 or config.compile):
        raise ValueError(f"{model.config.variant!r} trains in phases {phase_names}; training over several processes "
                         "and compile: true are for one-phase models: run it in one process, eager")
    wrapped = here.launched and len(phase_names) == 1  # a phase-trained model runs in a job of one, unwrapped
    sharded = wrapped and config.parallel == "fsdp"
    home = torch.device("cpu") if sharded else device  # sharding moves each process's shards to the device
    model.to(home).train()
    start, history = 0, []
    if checkpoint is not None:
        safetensors.torch.load_model(model, str(checkpoint / "model.safetensors"), device=str(home))
        state = json.loads((checkpoint / "state.json").read_text())
        start, history = state["step"], state["history"]
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))
        if device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(torch.tensor(state["cuda_rng"], dtype=torch.uint8), device)
    if sharded:
        distributed.fully_shard(model, device, here)  # in place: the optimizers must see the sharded parameters
    phases, optimizers, schedulers = _optimizers(model, config, fused_adamw(device, sharded))
    if checkpoint is not None:
        _load_optimizers(checkpoint / "optimizer.pt", optimizers, schedulers, device, sharded)
    if here.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "train.json").write_text(json.dumps(config.model_dump(mode="json"), indent=2))
        if checkpoint is None:
            task.save_assets(run_dir)
    eager = distributed.replicate(model, device) if wrapped and not sharded else model  # what the task calls
    # compiled, the task's loss is one graph with the model: the float32 cross-entropy over the vocabulary fuses
    # with the logits' cast (a compiled bf16 step of bert-base took 17% less time than with the loss left eager)
    def eager_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return task.loss(eager, batch)

    trained_loss = torch.compile(eager_loss) if config.compile else eager_loss
    whole = None  # a sharded model's weights gathered on process 0, on the CPU: what is saved and evaluated

    def gather() -> None:
        """Refresh ``whole`` (every process takes part; only process 0 keeps the weights)."""
        nonlocal whole
        weights = distributed.gathered_weights(model, here)
        if here.main:
            if whole is None:
                with torch.random.fork_rng(devices=[]):  # building draws initial weights: leave training's stream alone
                    whole = build_model(model.config)
            whole.load_state_dict(weights)

    def save(step: int) -> None:
        if sharded:
            gather()
            states = {name: distributed.gathered_optimizer(optimizer, here) for name, optimizer in optimizers.items()}
        else:
            states = {name: optimizer.state_dict() for name, optimizer in optimizers.items()}
        if here.main:
            _save_checkpoint(run_dir, whole if sharded else model, states, schedulers, step, history, device)
        distributed.barrier(here)

    def evaluate(split: str) -> dict[str, float] | None:
        """The trained model's scores on ``split``, from process 0 (None elsewhere)."""
        if sharded:
            gather()
        if not here.main:
            return None
        if not sharded:
            return task.evaluate(model, split)
        try:
            return task.evaluate(whole.to(device), split)
        finally:
            whole.cpu()

    train_data = task.dataset("train")
    end = config.steps if stop_after is None else min(config.steps, stop_after)
    tokens, started = 0, time.perf_counter()
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TextColumn("{task.fields[status]}"), TimeRemainingColumn(), disable=not (progress and here.main),
                   transient=True)
    bf16 = config.bf16 and device.type == "cuda"
    with bar:
        bar_task = bar.add_task(f"{config.task.kind}", total=config.steps, completed=start, status="")
        for step in range(start, end):
            if here.launched:  # every process draws the same global batch (masking included), then its own dropout
                torch.manual_seed(_step_seed(config, step))
            batch = distributed.shard(_batch(task, train_data, step, config, device), here)
            if here.launched:
                torch.manual_seed(_step_seed(config, step) * 1009 + 1 + here.rank)
            losses = {}
            # the first step is counted, eagerly: a compiled module called under the counter would never compile
            counting = step == start
            counter = FlopCounterMode(display=False) if counting else contextlib.nullcontext()
            with counter:
                for phase in phases:
                    with _only(phase.parameters, model) if len(phases) > 1 else contextlib.nullcontext():
                        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                            # a task written before phases existed takes (model, batch)
                            if len(phases) > 1:
                                loss = task.loss(model, batch, phase.name)
                            else:
                                loss = (eager_loss if counting else trained_loss)(batch)
                        if distributed.any_true(not torch.isfinite(loss), here, device):
                            raise TrainingDiverged(
                                f"{phase.name} loss became {loss.item()} at step {step + 1}; the last good checkpoint is "
                                f"kept in {run_dir / CHECKPOINT}; lower lr (now {config.lr}) or set grad_clip"
                            )
                        optimizers[phase.name].zero_grad(set_to_none=True)
                        loss.backward()
                        if config.grad_clip is not None:
                            torch.nn.utils.clip_grad_norm_(phase.parameters, config.grad_clip)
                        optimizers[phase.name].step()
                        schedulers[phase.name].step()
                    losses[phase.name] = loss.item()
            if counting:
                step_flops = counter.get_total_flops() * here.size  # every process's share of the global batch
            loss = losses[phases[0].name]  # the headline loss; every phase's is in the curve too
            tokens += task.tokens_in(batch) * here.size
            done = step + 1
            if done % config.log_every == 0 or done == config.steps:
                loss = distributed.mean(loss, here, device)  # the global batch's
                phase_losses = {f"loss_{name}": value for name, value in losses.items()} if len(phases) > 1 else {}
                history.append({"step": done, "loss": loss, **phase_losses,
                                "lr": schedulers[phases[0].name].get_last_lr()[0]})
            if config.eval_every and done % config.eval_every == 0 and done != config.steps:
                scores = evaluate("test")
                if here.main:
                    history.append({"step": done, **{f"test_{k}": v for k, v in scores.items()}})
            if config.checkpoint_every and done % config.checkpoint_every == 0:
                save(done)
            rate = tokens / (time.perf_counter() - started)
            bar.update(bar_task, completed=done, status=f"loss {loss:.3f}  {rate:,.0f} tok/s")
            spent = config.max_seconds is not None and time.perf_counter() - started >= config.max_seconds
            if config.max_seconds is not None and distributed.any_true(spent, here, device):  # all stop together
                end = done  # the time budget is spent: finish as if this were the last step
                break
    elapsed = time.perf_counter() - started
    save(end)
    if stop_after is not None and end < config.steps:
        return {"step": end, "stopped": True}
    if not here.main:
        return {"step": end, "rank": here.rank}
    held = distributed.held_parameters(model)
    if sharded:  # save() has just gathered the final weights
        model = whole.to(device)
    metrics = {split: task.evaluate(model, split) for split in task.splits if split != "train"}
    flops_per_second = step_flops * (end - start) / max(elapsed, 1e-9) if end > start else None
    peak = peak_tflops(config, device)
    summary = {
        "step": end,
        "train_seconds": elapsed,
        "metrics": metrics,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_per_process": held,  # process 0's shards with parallel: fsdp, else every parameter
        "processes": here.size,
        "parallel": config.parallel if wrapped else None,  # under torchrun: ddp or fsdp, whatever the processes
        "train_tokens_per_second": tokens / max(elapsed, 1e-9),
        "train_flops_per_step": step_flops if end > start else None,
        "train_tflops_per_second": None if flops_per_second is None else flops_per_second / 1e12,
        "mfu": None if flops_per_second is None or peak is None else flops_per_second / (peak * 1e12 * here.size),
        "history": history,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    model.save_pretrained(run_dir / "model")
    return summary


def load_run(run_dir: str | os.PathLike) -> tuple[TrainConfig, Any, torch.nn.Module]:
    """The config, task and trained model (in eval mode) of a finished run folder."""
    from .api import from_pretrained

    run_dir = Path(run_dir)
    if not (run_dir / "train.json").is_file() or not (run_dir / "model").is_dir():
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a finished run folder: expected train.json and model/ written by tzoo train"
        )
    config = load_train_config(run_dir / "train.json")
    model = from_pretrained(run_dir / "model").to(resolve_device(config.device)).eval()
    return config, config.task.with_assets(run_dir).build(), model


def evaluate_run(run_dir: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Score the model of a finished run (``run_dir/model``) on its task's test splits."""
    _, task, model = load_run(run_dir)
    return {split: task.evaluate(model, split) for split in task.splits if split != "train"}
