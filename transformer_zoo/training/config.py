"""The training config: what a run trains (a model, a task), for how long and how, read from a
YAML or JSON file with ``key=value`` overrides; and which of its fields a run may change when
it resumes (:data:`RESUMABLE_FIELDS`). :mod:`~transformer_zoo.training.trainer` runs it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ..api import load_config
from ..configs import merge, parse_overrides, read_config, validate
from ..core.errors import ConfigError, ZooError, naming
from ..core.options import VariantConfig
from ..core.tasks import TaskField
from ..core.validation import Options
from .run_folder import differences

MAX_COUNT = 2**31 - 1  # steps, batch sizes and cadences: far beyond any run, and within every index type

RESUMABLE_FIELDS = frozenset(
    {
        "steps",
        "max_seconds",
        "eval_every",
        "log_every",
        "checkpoint_every",
        "checkpoint_minutes",
        "device",
        "parallel",
        "compile",
        "peak_tflops",
    }
)
"""The :class:`TrainConfig` fields a run may change when it resumes: its budget, how often it
logs, evaluates and checkpoints, and where and how it computes (the checkpoint loads on any
device and under any parallel mode). The others (model, task, optimizer, schedule shape, seed,
batch, precision) are what the checkpoint's steps were taken with: changing them needs a new
run (``--restart``, or another ``--out``).

``steps`` is among them although it sets the length of the cosine schedule: a run resumed with
another ``steps`` follows the new schedule from the step it resumed at (the learning rate moves
to the new curve's value there, recorded in the learning curve). Lengthening or shortening a
run is what resuming with another budget means, and the checkpoint stays valid; refusing it
would leave no way to train a finished run further."""


class TrainConfig(Options):
    """One training run: a model, a task and a budget.

    A run folder resumes only with the config it was started with, but for the fields in
    :data:`RESUMABLE_FIELDS` (steps, max_seconds, eval_every, log_every, checkpoint_every,
    checkpoint_minutes, device, parallel, compile, peak_tflops), which may change on resume.
    """

    model: str | dict[str, Any] = Field(description="a variant name, or a model config mapping with 'variant'")
    task: TaskField = Field(description="the task to train on (a kind name or a mapping with 'kind')")
    steps: int = Field(
        1000, ge=1, le=MAX_COUNT, description="optimizer steps (the schedule's length); may change when resuming"
    )
    max_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="also stop after this much training time; null: no limit"
    )
    batch_size: int = Field(64, ge=1, le=MAX_COUNT, description="examples per step")
    lr: float = Field(
        1e-3, gt=0, le=1e6, allow_inf_nan=False, description="peak learning rate (of AdamW, and of Muon with muon)"
    )
    weight_decay: float = Field(
        0.01, ge=0, allow_inf_nan=False, description="decoupled weight decay (of AdamW, and of Muon with muon)"
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw: AdamW for every parameter; muon: Muon (Jordan et al. 2024) for the hidden matrices (the "
        "weights of the linear maps inside the encoder and decoder stacks) and AdamW for the rest (embeddings, head, "
        "norms, biases). Both take lr and weight_decay: Muon's update is scaled to the size of AdamW's "
        "(0.2 * sqrt(max(rows, columns)), Moonlight's rule, Liu et al. 2025), so the learning rate tuned for one "
        "serves the other. muon is for one process or parallel: ddp, not fsdp",
    )
    warmup_steps: int = Field(100, ge=0, le=MAX_COUNT, description="linear warm-up steps")
    schedule: Literal["constant", "cosine", "inverse-sqrt"] = Field(
        "cosine", description="learning-rate shape after warm-up"
    )
    grad_clip: float | None = Field(
        1.0, gt=0, allow_inf_nan=False, description="clip the gradient norm to this value; null: no clipping"
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of initialisation, batch order and dropout")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train; auto: cuda when available")
    bf16: bool = Field(True, description="bfloat16 autocast on CUDA (ignored on CPU)")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="on several processes (torchrun): ddp keeps a whole copy of the model in each; fsdp shards "
        "parameters, gradients and optimizer state over them, for models too large for one device",
    )
    compile: bool = Field(
        False, description="train the model through torch.compile (the first steps pay for compiling)"
    )
    peak_tflops: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="the device's peak TFLOP/s, for model FLOPs utilisation; null: known GPUs' bf16 peak",
    )
    eval_every: int = Field(
        0, ge=0, le=MAX_COUNT, description="evaluate on the test split every N steps; 0: only at the end"
    )
    checkpoint_every: int = Field(
        0,
        ge=0,
        le=MAX_COUNT,
        description="also write a checkpoint every N steps; 0: by time (checkpoint_minutes), on "
        "Ctrl-C and at the end only",
    )
    checkpoint_minutes: float | None = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="write a checkpoint whenever this many minutes of training have passed since the last one, so "
        "that a crash or kill loses at most that much; Ctrl-C and the end of training always write one; null: by "
        "steps (checkpoint_every) only",
    )
    log_every: int = Field(10, ge=1, le=MAX_COUNT, description="record the training loss every N steps")
    holdout: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="train on the train split less this part of it (a fraction below 1, or a number of rows), drawn "
        "with holdout_seed, and score on that part alone (split 'validation', also at eval_every): the test splits "
        "are never read, as when settings are tuned; null: the task's own splits",
    )
    holdout_seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of the rows holdout carves out")
    shared_init: list[str | dict[str, Any]] | None = Field(
        None,
        description="models (as 'model' takes them) whose initial weights at this seed the run takes, in order: "
        "each parameter whose name and shape agree with one of theirs starts from the first such model's value, the "
        "rest from the run's own; then the random stream of training (dropout, random offsets) starts again from the "
        "seed, whatever initialising drew (an empty list: the stream alone). A comparison with pairing: seeds sets "
        "it; the summary lists the parameters taken (shared) and those that kept their own (own). null: the run's "
        "own initialisation, its stream going on from it",
    )

    @model_validator(mode="after")
    def _muon_whole(self) -> TrainConfig:
        if self.optimizer == "muon" and self.parallel == "fsdp":
            raise ValueError(
                "optimizer: muon orthogonalises each hidden matrix whole, and parallel: fsdp shards every matrix "
                "over the processes; train with muon in one process or under parallel: ddp, or with optimizer: "
                "adamw under fsdp"
            )
        return self


def load_train_config(source: str | os.PathLike | dict, overrides: list[str] | None = None) -> TrainConfig:
    """A validated training config from a YAML/JSON file or a mapping, with ``key=value`` overrides."""
    if not isinstance(source, dict) and Path(source).is_dir():
        raise ConfigError(
            f"training config {str(source)!r} is a folder; give a YAML or JSON file (a run folder is "
            "resumed by running its command again: tzoo train CONFIG --out FOLDER)"
        )
    if not isinstance(source, dict) and not Path(source).is_file():
        raise ConfigError(f"training config {str(source)!r} does not exist; give a YAML or JSON file")
    data = read_config(source)
    if overrides:
        changes = parse_overrides(overrides)
        if isinstance(data.get("model"), str) and isinstance(changes.get("model"), dict):  # model.d_model=...
            data = {**data, "model": {"variant": data["model"]}}  # is an option of the variant named
        data = merge(data, changes)
    return validate(TrainConfig, data, "training config")


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
    with naming("model"):
        model = load_config({"variant": config.model} if isinstance(config.model, str) else config.model)
    reason = task.unfit_reason(model)
    if reason:
        raise ValueError(f"variant {model.variant!r} cannot do task {config.task.kind!r}: {reason}")
    return load_config(model, task.model_overrides(model))


def config_changes(before: TrainConfig, after: TrainConfig) -> list[str]:
    """What differs from ``before`` in ``after``, as ``dotted.path: old -> new``, leaving out
    :data:`RESUMABLE_FIELDS`; models are compared as resolved configs (a variant's name and
    the mapping of its values compare equal)."""
    return differences(_comparable(before), _comparable(after), ignore=RESUMABLE_FIELDS)


def _comparable(config: TrainConfig) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    try:
        data["model"] = load_config(
            {"variant": config.model} if isinstance(config.model, str) else config.model
        ).model_dump(mode="json")
    except (ZooError, ValueError):  # a model that no longer resolves is compared as written
        pass
    return data
