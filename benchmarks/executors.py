"""The default comparison under the local executor (the reference) and under Ray, on this
machine: the wall time of each whole comparison, and Ray's overhead per run.

Each comparison runs in a fresh process (``tzoo compare --json --rerun``) into a fresh report
folder, so both train every run, whatever cache the spec names; they run one after the other, never at once. The overhead per run is
(Ray's wall time - local's) / runs: Ray's start, its worker processes' imports and scheduling,
shared by the runs. The metrics of the two must be equal, run by run; the table says so.

    python -m benchmarks executors [--steps 300 --seeds 0,1,2 --spec SPEC]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import bench_parser, write_json


def run_comparison(executor: str, spec: Path, seeds: str | None, out: Path) -> tuple[float, dict]:
    """Wall seconds of one ``tzoo compare`` of ``spec`` in a fresh process, and its results."""
    command = [
        sys.executable,
        "-m",
        "transformer_zoo",
        "compare",
        str(spec),
        "--out",
        str(out),
        "--executor",
        executor,
        "--json",
        "--rerun",
        *(["--seeds", seeds] if seeds else []),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tzoo compare --executor {executor} failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)


def build_parser():
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--spec", default=None, help="a spec (default: the built-in comparison)")
    parser.add_argument("--steps", type=int, default=None, help="train every run this many steps instead")
    parser.add_argument("--seeds", default=None, metavar="S,S,...", help="these seeds instead of the spec's")
    parser.add_argument("--json", type=str, default=None, metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from transformer_zoo.comparing.spec import load_spec

    spec = load_spec(args.spec).model_dump(mode="json")
    if args.steps:
        spec["steps"] = args.steps
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "spec.json"
        path.write_text(json.dumps(spec))
        for executor in ("local", "ray"):
            seconds, results = run_comparison(executor, path, args.seeds, Path(root) / executor)
            rows[executor] = {
                "seconds": seconds,
                "runs": len(results["runs"]),
                "run_seconds": sum(r["wall_seconds"] for r in results["runs"]),
                "results": results,
            }
            print(
                f"{executor:>6}: {len(results['runs'])} runs in {seconds:.1f} s of wall time "
                f"(the runs' own wall time {rows[executor]['run_seconds']:.1f} s)",
                flush=True,
            )
    local, ray = rows["local"], rows["ray"]
    same = all(a["metrics"] == b["metrics"] for a, b in zip(local["results"]["runs"], ray["results"]["runs"]))
    per_run = (ray["seconds"] - local["seconds"]) / local["runs"]
    print(
        f"ray / local wall time: {ray['seconds'] / local['seconds']:.2f}x; Ray's overhead per run: {per_run:+.2f} s; "
        f"metrics {'equal run by run' if same else 'DIFFER'}"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "executors",
                "local_seconds": local["seconds"],
                "ray_seconds": ray["seconds"],
                "runs": local["runs"],
                "overhead_per_run_seconds": per_run,
                "metrics_equal": same,
            },
        )
