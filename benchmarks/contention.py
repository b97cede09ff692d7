"""What other CPU work does to a training run: the run's time alone (the reference) and beside
one CPU-bound process, by thread count.

Each measurement trains ``--variant`` on ``--task`` (the built-in comparison's settings) for
``--steps`` steps in a fresh process, with ``torch.set_num_threads(threads)``; the competitor
is a Python busy loop, started before the run and stopped after it. With more threads than
free cores, OpenMP's waiting threads spin on the cores the competitor needs; the table shows
how much each thread count slows down (beside / alone).

    python -m benchmarks.contention [--threads 2 1 --steps 150 --variant transformer-tiny --task listops]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .common import bench_parser, write_json

RUN = """
import json, tempfile, torch
torch.set_num_threads({threads})
from transformer_zoo.comparing.spec import load_spec, plan
from transformer_zoo.training.trainer import train
runs, _ = plan(load_spec())
config = next(c for label, c in runs if label == {variant!r} and c.task.kind == {task!r})
summary = train(config.model_copy(update={{"steps": {steps}}}), tempfile.mkdtemp(), progress=False)
print(json.dumps(summary["train_seconds"]))
"""


def seconds(args: argparse.Namespace, threads: int, busy: bool, environment: dict[str, str]) -> float:
    """Training seconds of one run in a fresh process, with a busy loop beside it when ``busy``."""
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        code = RUN.format(threads=threads, variant=args.variant, task=args.task, steps=args.steps)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, **environment}
        )
        return float(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="thread counts to measure")
    parser.add_argument("--steps", type=int, default=150, help="training steps of each run")
    parser.add_argument("--variant", default="transformer-tiny", help="a variant of the built-in comparison")
    parser.add_argument("--task", default="listops", help="a task of the built-in comparison")
    parser.add_argument("--passive", action="store_true", help="also measure with OMP_WAIT_POLICY=PASSIVE")
    parser.add_argument("--json", type=str, default=None, metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = [(threads, {}) for threads in args.threads]
    if args.passive:
        settings += [(threads, {"OMP_WAIT_POLICY": "PASSIVE"}) for threads in args.threads if threads > 1]
    rows = []
    print(f"{args.variant} on {args.task}, {args.steps} steps; cores available: {len(os.sched_getaffinity(0))}")
    print(f"{'threads':>28} {'alone s':>8} {'beside s':>9} {'slowdown':>9}")
    for threads, environment in settings:
        alone, beside = seconds(args, threads, False, environment), seconds(args, threads, True, environment)
        name = f"{threads}" + (" OMP_WAIT_POLICY=PASSIVE" if environment else "")
        rows.append(
            {
                "threads": threads,
                "environment": environment,
                "alone_seconds": alone,
                "beside_seconds": beside,
                "slowdown": beside / alone,
            }
        )
        print(f"{name:>28} {alone:8.2f} {beside:9.2f} {beside / alone:8.2f}x", flush=True)
    if args.json:
        write_json(args.json, {"benchmark": "contention", "rows": rows})


if __name__ == "__main__":
    main()
