"""Suites: the public benchmarks of several tasks that the field compares designs on (MQAR, the
MAD tasks, the Chomsky hierarchy), each run by one command, ``tzoo compare --suite NAME``.

A suite is a YAML file of the package's ``suites/`` folder: its tasks, the source that defines
them, how the source aggregates them (MAD and the Chomsky hierarchy: the mean of the headline
metric over the tasks) and the plot its source draws. A spec's ``suite: NAME`` adds the suite's
tasks to the spec's own (a task of the spec replaces the suite's task of its name: its id, or else
its kind); the report
then gives the aggregate as a task of its own, named after the suite: for each variant and
seed, the mean of the tasks' headline metric on their test splits (:func:`suite_records`), so
the aggregate gets intervals over seeds and tests like any task, and a study may claim on it.
"""

from __future__ import annotations

import os
import statistics
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ..configs import read_config, validate
from ..core.errors import UnknownNameError
from ..core.validation import Options
from .records import RunRecord

Plot = Literal["width"]
PLOTS: dict[str, str] = {
    "width": "the headline metric against the model's width, a line per variant stem (Zoology's Figure 2); a task "
    "whose options give its splits' lengths (the Chomsky tasks) is drawn against length in any report",
}


class Suite(Options):
    """A suite's file."""

    name: str = Field("", description="the suite's name (its file's, for a built-in one)")
    title: str = Field(description="what the suite measures, in a line")
    source: str = Field(description="the paper and code that define the tasks")
    notes: str = Field("", description="how the tasks here differ from the source's, and why")
    aggregate: bool = Field(
        True, description="report the mean of the tasks' headline metric over the tasks, per seed, as a task"
    )
    label: str = Field("", description="the aggregate's name in a report and in claims (default: the suite's name)")
    plots: list[Plot] = Field([], description="; ".join(f"{k}: {v}" for k, v in PLOTS.items()))
    tasks: list[dict[str, Any]] = Field(min_length=1, description="the tasks, as a spec's tasks")
    compare: dict[str, Any] = Field(
        {}, description="the rest of a compare spec (variants, steps, seeds, ...) for `tzoo compare --suite NAME` alone"
    )

    @model_validator(mode="after")
    def _named_apart(self) -> Suite:
        if any("kind" not in task for task in self.tasks):
            raise ValueError("every task of a suite is a mapping with its 'kind' (and its options)")
        names = [task_name(task) for task in self.tasks]
        if self.aggregate and self.aggregate_name in names:
            raise ValueError(
                f"the aggregate's name {self.aggregate_name!r} is one of the suite's tasks; give the suite a label "
                "of its own (label: ...)"
            )
        return self

    @property
    def aggregate_name(self) -> str:
        """The aggregate's name: :attr:`label`, or else the suite's name."""
        return self.label or self.name


def suites_dir() -> Path:
    return Path(str(resources.files("transformer_zoo") / "suites"))


def available_suites() -> dict[str, Path]:
    """The built-in suites, by name."""
    return {path.stem: path for path in sorted(suites_dir().glob("*.yaml"))}


def load_suite(source: str | os.PathLike) -> Suite:
    """A validated suite from a built-in name or a YAML file."""
    if not str(source).endswith((".yaml", ".yml", ".json")):
        found = available_suites()
        if str(source) not in found:
            raise UnknownNameError("suite (or a path to a suite's YAML file)", str(source), found)
        source = found[str(source)]
    data = read_config(source, "suite file", "a built-in suite's name (mqar, mad, chomsky-hierarchy) or a YAML file")
    data.setdefault("name", Path(source).stem)
    return validate(Suite, data, "suite")


def task_name(task: str | dict[str, Any]) -> str:
    """A spec's task entry's name: its id, or else its kind."""
    return task if isinstance(task, str) else str(task.get("id") or task.get("kind"))


def with_suite_tasks(tasks: list[Any], suite: Suite) -> list[Any]:
    """The suite's tasks, each replaced by the spec's task of its name where there is one, then
    the spec's other tasks: the same list however often it is applied."""
    names = {task_name(task): task for task in tasks}
    own = [names.pop(task_name(task), task) for task in suite.tasks]
    return [*own, *names.values()]


def suite_records(suite: Suite, records: list[RunRecord]) -> list[RunRecord]:
    """The suite's aggregate as records of a task named after the suite: one per variant and seed
    that finished every task of the suite, whose headline metric on the ``test`` split is the mean
    over the suite's kinds of each kind's mean over its tasks (its settings, labelled apart): each
    kind weighted equally, as MAD and Delétang et al. average. Its costs: wall time and steps summed
    over the runs, tuning time too where every run has one, peak memory and parameters their
    largest, FLOPs per token their mean and throughput weighted by wall time. A suite whose tasks'
    headline metrics differ has none."""
    names = [task_name(task) for task in suite.tasks]
    runs = [r for r in records if r.task in names]
    metrics = {r.metric for r in runs}
    if not suite.aggregate or len(metrics) != 1:
        return []
    (metric,) = metrics
    found = []
    for variant in dict.fromkeys(r.variant for r in runs):
        for seed in dict.fromkeys(r.seed for r in runs):
            mine = {r.task: r for r in runs if r.variant == variant and r.seed == seed}
            if set(mine) != set(names):
                continue
            scores = {name: mine[name].metrics.get("test", {}).get(metric) for name in names}
            if any(score is None for score in scores.values()):
                continue
            by_kind: dict[str, list[float]] = {}
            for task in suite.tasks:  # a kind's settings (MAD's difficulties) first averaged together
                by_kind.setdefault(task["kind"], []).append(scores[task_name(task)])
            first = mine[names[0]]
            parts = list(mine.values())
            invocations = {r.invocation for r in parts}
            seconds = sum(r.wall_seconds for r in parts)
            found.append(
                first.model_copy(
                    update={
                        "task": suite.aggregate_name,
                        "metrics": {"test": {metric: statistics.fmean(map(statistics.fmean, by_kind.values()))}},
                        "better": {metric: first.better[metric]},
                        "bounds": {k: v for k, v in first.bounds.items() if k == metric},
                        "curve": [],
                        "parameters": max(r.parameters for r in parts),
                        "flops_per_token": statistics.fmean(r.flops_per_token for r in parts),
                        "train_tokens_per_second": sum(r.train_tokens_per_second * r.wall_seconds for r in parts)
                        / max(seconds, 1e-9),
                        "peak_memory_mb": max(r.peak_memory_mb for r in parts),
                        "wall_seconds": seconds,
                        "steps": sum(r.steps for r in parts),
                        "invocation": invocations.pop() if len(invocations) == 1 else "",
                        "reused": any(r.reused for r in parts),
                        "tuning_seconds": None
                        if any(r.tuning_seconds is None for r in parts)
                        else sum(r.tuning_seconds for r in parts),
                        "run_folder": "",
                        "samples_plot": None,
                        "ponder_time": {},
                        "ponder_plot": None,
                        "probes": {},
                        "aggregate_of": names,
                    }
                )
            )
    return found
