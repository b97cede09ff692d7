"""A Ray node lost in the middle of a comparison, against the same comparison undisturbed (the
reference): how soon the lost run starts again, the steps it lost, and the comparison's wall time.

A three-node Ray cluster on this machine (``ray.cluster_utils``, one CPU a node, Ray's default
health checks unless ``--health-check-ms``), two runs of ``transformer-tiny`` on a small ListOps, so
one node is spare. Once a run on a node other than the head has a checkpoint, that node is
removed (its raylet and workers killed); the run starts again on a node left, from its
checkpoint. The reference is the same comparison on a fresh cluster of the same shape, nothing
killed. Both must end with equal metrics. (With no spare CPU, the retried run would wait for the
other run to end: the restart time would measure that wait.)

    python -m benchmarks node-loss [--steps 300 --checkpoint-every 20 --repeats 3]
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from .common import bench_parser, write_json


def one_comparison(root: Path, steps: int, every: int, kill: bool, health_ms: int | None) -> dict:
    """One comparison on a fresh three-node cluster; with ``kill``, a node other than the head is
    removed once its run has a checkpoint. Returns its wall time, its runs and, with ``kill``, the
    recovery."""
    from ray.cluster_utils import Cluster

    from transformer_zoo.comparing.runner import compare
    from transformer_zoo.comparing.spec import load_spec

    checks = {} if health_ms is None else {"health_check_period_ms": health_ms, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": checks})
    nodes = {node.node_id[:8]: node for node in (cluster.add_node(num_cpus=1) for _ in range(2))}
    cluster.wait_for_nodes()
    out, seen = root / ("killed" if kill else "undisturbed"), {}

    def remove_the_node_once_its_run_has_a_checkpoint() -> None:
        while not seen:
            for state in out.glob("runs/*/checkpoint/state.json"):
                folder = state.parent.parent
                with contextlib.suppress(OSError, ValueError):
                    where = json.loads((folder / "attempts.json").read_text())["where"]
                    node = nodes.get(where[:8])
                    if node is not None and not (folder / "record.json").exists():
                        seen.update(folder=folder, step=json.loads(state.read_text())["step"], at=time.time())
                        cluster.remove_node(node, allow_graceful=False)
                        return
            time.sleep(0.02)

    spec = {
        "name": "node-loss",
        "variants": ["transformer-tiny"],
        "tasks": [{"kind": "listops", "train_size": 2000, "test_size": 100, "max_length": 32}],
        "steps": steps,
        "seeds": [0, 1],
        "threads": 1,
        "executor": "ray",
        "address": cluster.address,
        "train": {"batch_size": 16, "checkpoint_every": every},
    }
    killer = threading.Thread(target=remove_the_node_once_its_run_has_a_checkpoint, daemon=True)
    if kill:
        killer.start()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stderr(io.StringIO()) as printed:
            results = compare(load_spec(spec), out)
    finally:
        seen.setdefault("folder", None)  # ends the killer's loop if no run was caught
        cluster.shutdown()
    row = {"seconds": time.perf_counter() - started, "runs": [r.model_dump() for r in results.runs]}
    if kill:
        folder = seen["folder"]
        if folder is None:
            raise SystemExit("no run trained on a node other than the head long enough to be killed there")
        again = json.loads((folder / "record.json").read_text())
        row.update(
            restart_seconds=(folder / "attempts.json").stat().st_mtime - seen["at"],
            killed_at_step=seen["step"],
            resumed_from=again["resumed_from"],
            lost_line=[line for line in printed.getvalue().splitlines() if " lost: " in line],
        )
    return row


def build_parser():
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--steps", type=int, default=300, help="steps of each run")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of comparisons (killed, undisturbed)")
    parser.add_argument(
        "--health-check-ms", type=int, default=None, help="Ray's health-check period (default: Ray's own, 3000)"
    )
    parser.add_argument("--json", type=str, default=None, metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            pair = {}
            for kill in (True, False) if repeat % 2 == 0 else (False, True):
                folder = Path(root) / str(repeat)
                pair[kill] = one_comparison(folder, args.steps, args.checkpoint_every, kill, args.health_check_ms)
            killed, undisturbed = pair[True], pair[False]
            same = [r["metrics"] for r in killed["runs"]] == [r["metrics"] for r in undisturbed["runs"]]
            rows.append({"killed": killed, "undisturbed": undisturbed, "metrics_equal": same})
            print(
                f"{repeat + 1}: restarted {killed['restart_seconds']:.1f} s after the kill, at step "
                f"{killed['resumed_from']} (killed at step {killed['killed_at_step']}); comparison "
                f"{killed['seconds']:.1f} s against {undisturbed['seconds']:.1f} s undisturbed "
                f"({killed['seconds'] / undisturbed['seconds']:.2f}x); metrics {'equal' if same else 'DIFFER'}; "
                f"{killed['lost_line'][0] if killed['lost_line'] else 'no node-lost line before the end'}",
                flush=True,
            )
    restart = statistics.median(r["killed"]["restart_seconds"] for r in rows)
    ratio = statistics.median(r["killed"]["seconds"] / r["undisturbed"]["seconds"] for r in rows)
    print(f"median: restarted {restart:.1f} s after the kill; wall time {ratio:.2f}x the undisturbed comparison's")
    if args.json:
        write_json(args.json, {"benchmark": "node-loss", "rows": rows, "restart_seconds": restart, "ratio": ratio})
