"""Comparing: variants x tasks x seeds on one budget, with statistics over seeds, a report, and
the studies that judge the papers' claims.

What lives here, in the order data flows:

- :mod:`.spec`: :class:`CompareSpec` (what to compare) and :func:`~.spec.plan` (every run's
  training config, checked before anything trains);
- :mod:`.runner`: :func:`compare`, in four stages: plan the runs, tune them (:mod:`.tuning`,
  with a ``tune:`` section), train those the run cache lacks, and summarize them in the report;
- :mod:`.runs` (one run as a :class:`~.runs.RunJob`, trained and measured by
  :func:`~.runs.execute_run`; a tuning trial is a :class:`~.tuning.TrialJob`), :mod:`.executors`
  (where jobs train: local worker processes pinned to devices, or Ray tasks), :mod:`.cache`
  (finished runs by the content that decides them) and :mod:`.progress` (a live table, or a
  line per event);
- :mod:`.records`: :class:`RunRecord`, :class:`TaskSummary` and :class:`CompareResults`, data
  only, which everything after the runner reads;
- :mod:`.stats` (intervals and tests over seeds), :mod:`.summary` (each task's table and
  verdict), :mod:`.report` (``report.md``) and :mod:`.plots` (PNG figures);
- :mod:`.scaling` (time and memory against sequence length) and :mod:`.probes` (measurements
  of trained models);
- :mod:`.studies`: ``tzoo reproduce``, a spec plus a stated claim, judged holds, does not hold
  or inconclusive (its study files, verdicts, pages and running, a module each);
- :mod:`.attention_maps`: ``tzoo attention``, figures of a trained run's attention.

What it may import: :mod:`transformer_zoo.core`, :mod:`transformer_zoo.registry`,
:mod:`transformer_zoo.api`, :mod:`transformer_zoo.configs` and :mod:`transformer_zoo.training`;
never the command line. :mod:`.records` imports nothing that reads it (summary, report, plots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_names

if TYPE_CHECKING:
    from .records import CompareResults, RunRecord, TaskSummary
    from .runner import ComparisonFailed, ComparisonInterrupted, compare
    from .spec import CompareSpec, load_spec, plan
    from .studies.running import reproduce, reproduce_all

_LAZY = {
    "CompareResults": ".records",
    "RunRecord": ".records",
    "TaskSummary": ".records",
    "ComparisonFailed": ".runner",
    "ComparisonInterrupted": ".runner",
    "compare": ".runner",
    "CompareSpec": ".spec",
    "load_spec": ".spec",
    "plan": ".spec",
    "reproduce": ".studies.running",
    "reproduce_all": ".studies.running",
}
"""Where each name below is defined: imported when first read (PEP 562), so that a worker process,
which imports :mod:`.runs` alone, starts without the runner, the studies, statistics and plots."""

__all__ = [
    "CompareResults",
    "CompareSpec",
    "ComparisonFailed",
    "ComparisonInterrupted",
    "RunRecord",
    "TaskSummary",
    "compare",
    "load_spec",
    "plan",
    "reproduce",
    "reproduce_all",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
