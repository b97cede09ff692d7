"""Run records made up for the tests of what is computed from them (verdicts, summaries, rounds)."""

from __future__ import annotations

from typing import Any

from transformer_zoo.comparing.records import RunRecord


def record(
    variant: str,
    seed: int,
    value: float,
    task: str = "listops",
    metric: str = "accuracy",
    better: str = "higher",
    **fields: Any,
) -> RunRecord:
    """A finished run of ``variant`` on ``task`` at ``seed`` that scored ``value`` in ``metric`` on the test split."""
    return RunRecord(
        **{
            "variant": variant,
            "family": "transformer",
            "task": task,
            "seed": seed,
            "parameters": 100,
            "flops_per_token": 1.0,
            "train_tokens_per_second": 1.0,
            "peak_memory_mb": 1.0,
            "steps": 10,
            "wall_seconds": 1.0,
            "metric": metric,
            "metrics": {"test": {metric: value}},
            "better": {metric: better},
            "curve": [],
            **fields,
        }
    )
