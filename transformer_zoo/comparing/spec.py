"""What to compare (:class:`CompareSpec`: variants x tasks x seeds under one budget), and its
plan: every run's training config, checked before anything trains."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from ..api import build_model, load_config
from ..configs import read_config, validate
from ..core.errors import ConfigError, UnknownNameError, ZooError, naming
from ..core.tasks import TaskField
from ..core.validation import Options
from ..training.config import TrainConfig, model_config_for
from .probes import PROBE_NAMES, ProbeName
from .records import Skipped, TestKind
from .scaling import ScalingSpec
from .stats import TEST_NAMES
from .tuning import TuneSpec

Pairing = Literal["none", "seeds"]
PAIRINGS: dict[str, str] = {
    "none": "runs at one seed share the data order only; differences between variants use the spec's test",
    "seeds": "runs at one seed also share every random draw that does not depend on the architecture and the "
    "initial value of every parameter whose name and shape agree; differences between variants use the paired "
    "t-test on the per-seed differences",
}


def budget_seconds(value: Any) -> float:
    """A time budget as seconds: a number of seconds, or ``90s``, ``20m``, ``1.5h``.

    >>> budget_seconds("20m"), budget_seconds(90)
    (1200.0, 90.0)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
        try:
            seconds = float(text[:-1] if unit else text) * (unit or 1)
        except ValueError:
            raise ValueError(
                f"budget {value!r} is not a duration; give seconds (1200) or a number with s, m or h (20m, 1.5h)"
            ) from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"budget {value!r} must be a positive, finite duration, such as 20m")
    return seconds


class UntilDecided(Options):
    """Seeds added in rounds until every claim (or test) is decided, or the time budget is spent;
    each round judged by a sequential procedure that keeps the false-verdict rate at alpha
    (:mod:`~transformer_zoo.comparing.sequential`)."""

    budget: float = Field(1200.0, description="wall time for all rounds together: seconds, or 20m, 1.5h")
    round: int = Field(2, ge=1, le=100, description="seeds added by each round after the first (the spec's seeds)")
    most_seeds: int = Field(
        10,
        ge=2,
        le=1000,
        description="the most seeds a variant runs: the planned last look, over which alpha is spent (a "
        "round that the budget would not leave time for is not started)",
    )

    @model_validator(mode="before")
    @classmethod
    def _budget(cls, data: Any) -> Any:
        if isinstance(data, dict) and "budget" in data:
            data = {**data, "budget": budget_seconds(data["budget"])}
        return data


class CompareSpec(Options):
    """What to compare: variants x tasks x seeds, under one budget."""

    name: str = Field("compare", description="a name for the report")
    variants: list[str | dict[str, Any]] = Field(
        min_length=1,
        description="variant names or model configs; a config may carry a 'label', the short name the "
        "report gives it (otherwise its name and the values it sets)",
    )
    tasks: list[TaskField] = Field(
        min_length=1, description="tasks (kind names or mappings with 'kind'; two of one kind each with an 'id')"
    )
    suite: str | None = Field(
        None,
        description="a suite (mqar, mad, chomsky-hierarchy, or a suite's YAML file) whose tasks join the spec's: a "
        "task of the spec replaces the suite's of its name (id, or else kind); the report adds the suite's aggregate",
    )
    steps: int = Field(500, ge=1, description="training steps of every run")
    seconds: float | None = Field(None, gt=0, description="also stop each run after this much training time")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="seeds; every variant and task runs once per seed")
    reference: str | None = Field(
        None,
        description="the variant (as the spec names it) every other is tested against on each task; null: the "
        "first variant that ran the task",
    )
    test: TestKind = Field(
        "welch",
        description="the test of each difference over seeds: "
        + "; ".join(f"{name}: {text}" for name, text in TEST_NAMES.items()),
    )
    executor: Literal["local", "ray"] = Field(
        "local",
        description="where runs train: local, worker processes of this machine (one per device slot); ray, "
        "Ray tasks on this machine or a cluster (the [ray] extra)",
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="local: runs trained at once, each in a worker process of its own; null: one per device "
        "slot (every GPU runs_per_device times), or one on the CPU; ray places runs by the resources they ask for and "
        "ignores it",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads of each run; null: the cores available to this process, shared "
        "among the workers (ray: 1)",
    )
    devices: list[str] | None = Field(
        None,
        min_length=1,
        description="local: the devices the workers are dealt, e.g. [cuda:0, cuda:1]; null: every "
        "GPU of the machine, else the CPU",
    )
    runs_per_device: int = Field(1, ge=1, description="runs that share one device at once (small runs on a big GPU)")
    retries: int = Field(
        2,
        ge=0,
        description="times a run whose worker dies (killed, out of memory, its node lost) starts again from "
        "its last checkpoint before it is reported failed; a run that raises an error fails at once",
    )
    address: str | None = Field(
        None, description="ray: the cluster to join (auto, or ray://HOST:PORT); null: start Ray on this machine"
    )
    cache: str | None = Field(
        None,
        description="the run cache, a folder of finished runs several specs may share (relative to the working "
        "folder); null: the report folder's runs/",
    )
    model: dict[str, Any] = Field(
        {},
        description="model config values for every variant whose config has the field, under the variant's own "
        "(dropout: 0.0 turns dropout off wherever there is any); a field no variant has is an error",
    )
    train: dict[str, Any] = Field({}, description="other training options for every run (batch_size, lr, ...)")
    task_train: dict[str, dict[str, Any]] = Field(
        {},
        description="by task (its id, or else its kind): training options for the runs on that task, over 'train', 'steps' and "
        "'seconds' (a GAN's recipe, or its own budget)",
    )
    variant_train: dict[str, dict[str, Any]] = Field(
        {},
        description="by variant label: training options for that variant's runs, over 'train' and 'task_train' "
        "(a variant that differs from another in its recipe alone: warm-up or none)",
    )
    scaling: ScalingSpec | None = Field(
        None, description="also measure time and memory against sequence length of the variants on one task"
    )
    tune: TuneSpec | None = Field(
        None,
        description="first search every variant's settings on one budget of trials, on a validation split "
        "carved from the training data, then compare each at its best (Optuna, the [tune] extra); null: compare at "
        "the spec's settings",
    )
    probes: list[ProbeName] = Field(
        [],
        description="measurements of each trained model on test examples, reported beside the metrics: "
        + "; ".join(f"{name}: {text}" for name, text in PROBE_NAMES.items()),
    )
    pairing: Pairing = Field(
        "none",
        description="declared before any run: " + "; ".join(f"{name}: {text}" for name, text in PAIRINGS.items()),
    )
    effect: float | dict[str, float] | None = Field(
        None,
        description="the smallest difference of interest in the headline metric's units, for every task or by task "
        "name: with until_decided, a test whose interval lies within [-effect, effect] is decided (no difference that "
        "large); null: none",
    )
    until_decided: UntilDecided | None = Field(
        None,
        description="add seeds in rounds until every test against the reference is decided (or the budget is "
        "spent); null: the spec's seeds only",
    )

    @model_validator(mode="before")
    @classmethod
    def _suite_tasks(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("suite") is not None:
            from .suites import load_suite, with_suite_tasks

            data = {**data, "tasks": with_suite_tasks(list(data.get("tasks") or []), load_suite(data["suite"]))}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> CompareSpec:
        """Every section against the others, each problem found in one message."""
        problems = []
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds {self.seeds} name a seed twice; give each once")
        labels = [variant_label(variant) for variant in self.variants]
        if len(set(labels)) != len(labels):
            problems.append(f"variants {labels} name a variant twice; give each once")
        if self.reference is not None and self.reference not in labels:
            problems.append(
                f"reference {self.reference!r} is not one of the spec's variants {labels}; name one "
                "of them (a config variant by its label, as the report shows it)"
            )
        kinds = [task.name for task in self.tasks]
        twice = sorted({kind for kind in kinds if kinds.count(kind) > 1})
        if twice:
            problems.append(
                f"tasks name {twice[0]!r} more than once; a report keys its tables by task, so give each task of "
                "one kind an id of its own (id: ...)"
            )
        unknown = sorted(set(self.task_train) - set(kinds))
        if unknown:
            problems.append(f"task_train names {unknown}, which are not among the spec's tasks {kinds}")
        effects = self.effect if isinstance(self.effect, dict) else {"effect": self.effect or 0.0}
        if any(value < 0 for value in effects.values()):
            problems.append(f"effect {self.effect} must be 0 or more: the smallest difference that counts")
        unknown = sorted(set(effects) - set(kinds)) if isinstance(self.effect, dict) else []
        if unknown:
            problems.append(
                f"effect names {unknown}, which are not among the spec's tasks {kinds}; key it by task name"
            )
        if self.until_decided is not None and len(self.seeds) < 2:
            problems.append(
                f"until_decided needs two seeds or more to start from (the first look's interval); seeds is {self.seeds}"
            )
        unknown = sorted(set(self.variant_train) - set(labels))
        if unknown:
            problems.append(
                f"variant_train names {unknown}, which are not among the spec's variants {labels}; key it "
                "by a variant's label (a config variant's 'label')"
            )
        if self.scaling is not None and self.scaling.task is not None and self.scaling.task not in kinds:
            problems.append(
                f"scaling.task {self.scaling.task!r} is not one of the spec's tasks {kinds}; name one of them"
            )
        if problems:
            raise ValueError("\n  ".join(problems))
        return self


def default_spec_path() -> Path:
    return Path(str(resources.files("transformer_zoo") / "specs" / "default.yaml"))


def load_spec(
    source: str | os.PathLike | dict | None = None, seeds: list[int] | None = None, suite: str | None = None
) -> CompareSpec:
    """A validated spec from a YAML/JSON file or mapping; the built-in default when None.

    Args:
        seeds: replace the spec's seeds (``tzoo compare --seeds 0,1,2``).
        suite: run this suite's tasks in place of the spec's (``tzoo compare --suite mad``), on
            the spec's variants and budget (a task of the spec named as one of the suite's sets
            that task's options); with no spec, on the suite's own (its ``compare``).
    """
    from .suites import load_suite, task_name

    found = None if suite is None else load_suite(suite)
    if found is not None and source is None:
        if not found.compare:
            raise ConfigError(
                f"suite {found.name!r} names no variants of its own (it has no compare: section); give a spec "
                f"whose variants run it: tzoo compare SPEC --suite {suite}"
            )
        data = {"name": found.name, **found.compare}
    else:
        data = read_config(
            default_spec_path() if source is None else source,
            "compare spec file",
            "the path of a YAML or JSON spec (its variants, tasks and seeds; docs: Comparing), or no spec for the "
            "built-in comparison",
        )
    named = data.get("suite")
    if isinstance(source, (str, os.PathLike)) and isinstance(named, str) and named.endswith((".yaml", ".yml", ".json")):
        beside = Path(source).parent / named  # a suite file named by a spec: beside the spec, where it is there
        if not Path(named).is_absolute() and beside.is_file():
            data = {**data, "suite": str(beside)}
    if found is not None:
        # the suite's tasks in place of the spec's; one of the spec's of a suite task's name sets its options
        names = {task_name(task) for task in found.tasks}
        data = {**data, "suite": suite, "tasks": [t for t in data.get("tasks") or [] if task_name(t) in names]}
    if seeds is not None:
        data = {**data, "seeds": seeds}
    return validate(CompareSpec, data, "compare spec")


def variant_label(variant: str | dict[str, Any]) -> str:
    """The label of a spec's variant entry: its name, its ``label``, or its name and options."""
    if isinstance(variant, str):
        return variant
    if "label" in variant:
        return str(variant["label"])
    extra = {k: v for k, v in variant.items() if k != "variant"}
    return variant["variant"] + ("" if not extra else " " + json.dumps(extra, sort_keys=True, separators=(",", "=")))


def _unlabelled(variant: str | dict[str, Any]) -> str | dict[str, Any]:
    """The variant as a model config: its report label removed."""
    return variant if isinstance(variant, str) else {k: v for k, v in variant.items() if k != "label"}


def plan(
    spec: CompareSpec, processes: int = 1, only: Collection[str] | None = None
) -> tuple[list[tuple[str, TrainConfig]], list[Skipped]]:
    """Every run's training config, and the pairs that cannot run; all checked before training.

    With ``pairing: seeds``, each run takes the initial weights of the variants before its own
    in the spec that run its task (their model entries in ``shared_init``, in the spec's order,
    each once: variants of one model that train differently, as a sweep's do, give one entry; a
    repeat would build the same model again and give no value its first appearance had not).

    Args:
        only: the runs of these variants (by label) alone, planned as in the whole spec: a paired
            run still takes its initial values from the variants before it (a round of seeds added
            until decided, which runs the variants of the open claims).
        processes: the processes every run trains over (a torchrun job's); a model that trains
            in several phases (a GAN) is skipped when there are more than one.

    Raises:
        ConfigError: every problem of the spec's variants (each named by its entry, ``variants.1``,
            and label), training options and model options, in one message; or no variant can do
            any of the tasks.
        UnknownNameError: a variant is not registered, the spec's only problem.
    """
    runs, skipped, problems = [], [], []
    fields, unloaded = set(), []
    earlier: dict[str, list[str | dict[str, Any]]] = {task.name: [] for task in spec.tasks}  # variants run so far
    for index, entry in enumerate(spec.variants):
        label, variant = variant_label(entry), _unlabelled(entry)
        try:
            with naming(f"variants.{index} ({label!r})"):  # unknown names fail here
                config = load_config({"variant": variant} if isinstance(variant, str) else variant)
        except (ConfigError, UnknownNameError) as exc:
            problems.append(exc)
            unloaded.append(label)
            continue
        fields |= set(type(config).model_fields)
        variant = _with_model_options(variant, type(config), spec.model)
        for task_options in spec.tasks:
            shared = list(earlier[task_options.name]) if spec.pairing == "seeds" else None
            try:
                found = _task_runs(spec, label, variant, task_options, processes, shared)
            except ConfigError as exc:
                problems.append(exc)
                continue
            if isinstance(found, Skipped):
                skipped.append(found)
            else:
                runs += found
                if variant not in earlier[task_options.name]:
                    earlier[task_options.name].append(variant)
    unknown = sorted(set(spec.model) - fields)
    if unknown and not unloaded:  # a variant that did not load may have them
        problems.append(
            ConfigError(
                f"the spec's model options {unknown} are fields of none of its variants' configs; "
                "see `tzoo show VARIANT` for the fields a variant has"
            )
        )
    _refuse(problems)
    if not runs:
        raise ConfigError(
            "no variant in the spec can do any of its tasks:\n" + "\n".join(f"  {s.reason}" for s in skipped)
        )
    if only is not None:  # planned with the others (their pairing), run alone
        return [run for run in runs if run[0] in only], [s for s in skipped if s.variant in only]
    return runs, skipped


def _task_runs(
    spec: CompareSpec,
    label: str,
    variant: str | dict[str, Any],
    task_options: Any,
    processes: int,
    shared_init: list[str | dict[str, Any]] | None,
) -> list[tuple[str, TrainConfig]] | Skipped:
    """A variant's runs on one task, a seed each, taking the initial weights of the models of
    ``shared_init`` (None: their own); or why it cannot do the task.

    Raises:
        ConfigError: the spec's training options do not validate for these runs, or a batch does
            not split over the processes.
    """
    task = task_options.build()
    runs = []
    for seed in spec.seeds:
        config = validate(
            TrainConfig,
            {
                **spec.train,
                "steps": spec.steps,
                "max_seconds": spec.seconds,
                **spec.task_train.get(task_options.name, {}),
                **spec.variant_train.get(label, {}),
                "model": variant,
                "task": task_options,
                "seed": seed,
                "shared_init": shared_init,
            },
            "compare spec 'train', 'task_train' and 'variant_train' options",
        )
        if processes > 1 and config.batch_size % processes:
            where = "task_train" if "batch_size" in spec.task_train.get(task_options.name, {}) else "train"
            raise ConfigError(
                f"batch_size {config.batch_size} is each run's global batch, split over the job's "
                f"{processes} processes; set the spec's {where} batch_size "
                f"({task_options.name!r}) to a multiple of {processes}"
            )
        try:
            model = model_config_for(config, task)
            phases = _phases(model) if processes > 1 else []
            if len(phases) > 1:
                raise ValueError(
                    f"{model.variant!r} trains in phases {phases}, which run in one process only; "
                    "compare it in a job of one process"
                )
        except ValueError as exc:
            return Skipped(variant=label, task=task_options.name, reason=str(exc))
        runs.append((label, config))
    return runs


def _refuse(problems: list[ZooError]) -> None:
    """Raise the spec's problems together: the one as it is, several in one :class:`ConfigError`
    (a problem that several runs share, once)."""
    messages = list(dict.fromkeys(str(problem) for problem in problems))
    if len(messages) == 1:
        raise problems[0]
    if messages:
        raise ConfigError(
            f"invalid compare spec, {len(messages)} problems:\n"
            + "\n".join("  " + message.replace("\n", "\n  ") for message in messages)
        )


def _with_model_options(variant: str | dict[str, Any], config: type, options: dict[str, Any]) -> str | dict[str, Any]:
    """The variant with the spec's ``model`` values its config has and does not set itself."""
    given = {"variant": variant} if isinstance(variant, str) else variant
    extra = {k: v for k, v in options.items() if k in config.model_fields and k not in given}
    return {**given, **extra} if extra else variant


def _phases(model) -> list[str]:
    """The names of a model config's training phases (the model is built without memory)."""
    with torch.device("meta"):
        return [phase.name for phase in build_model(model).phases()]
