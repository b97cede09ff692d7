"""Executors: local workers pinned to device slots, Ray tasks, retries of runs whose worker dies,
and the same metrics whichever trains them."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from transformer_zoo.comparing import executors
from transformer_zoo.comparing.executors import LocalExecutor, RayExecutor, RunEvent, device_slots, local_devices
from transformer_zoo.comparing.progress import GridProgress
from transformer_zoo.comparing.runner import compare, make_executor
from transformer_zoo.comparing.runs import RunJob, available_cores, started_where
from transformer_zoo.comparing.spec import load_spec, plan
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.training import distributed

REVERSE = {"kind": "reverse", "train_size": 200, "test_size": 10, "train_lengths": [1, 5], "test_lengths": [6, 7]}
LISTOPS = {"kind": "listops", "train_size": 200, "test_size": 10, "max_length": 32}
GRID = {
    "name": "grid",
    "variants": ["transformer-tiny", {"variant": "transformer-tiny", "label": "narrow", "d_ff": 16}],
    "tasks": [REVERSE, LISTOPS],
    "steps": 4,
    "seeds": [0, 1],
    "threads": 1,
    "train": {"batch_size": 4},
}


def test_workers_are_dealt_round_the_devices():
    assert device_slots(["cuda:0", "cuda:1"], None, 1) == ["cuda:0", "cuda:1"]
    assert device_slots(["cuda:0", "cuda:1"], None, 2) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert device_slots(["cuda:0", "cuda:1"], 3, 1) == ["cuda:0", "cuda:1", "cuda:0"]
    assert device_slots(["cpu"], None, 1) == ["cpu"]


def test_every_gpu_of_a_machine_gets_a_worker_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert local_devices("auto") == ["cuda:0", "cuda:1"] and local_devices("cpu") == ["cpu"]
    runs, _ = plan(load_spec(GRID))
    spec = load_spec({**GRID, "runs_per_device": 2})
    executor = make_executor(spec, distributed.world(), [], [], runs, len(runs), lambda _: None)
    assert isinstance(executor, LocalExecutor) and not executor.in_process
    assert executor.slots == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    few = make_executor(spec, distributed.world(), [], [], runs, 3, lambda _: None)  # no worker without a run
    assert few.slots == ["cuda:0", "cuda:1", "cuda:0"]
    with pytest.raises(
        ConfigError,
        match=r"devices \['cuda:2', 'gpu0'\] are not devices of this machine; name cpu or "
        r"cuda:0 or cuda:1",
    ):
        make_executor(
            load_spec({**spec.model_dump(mode="json"), "devices": ["cuda:1", "cuda:2", "gpu0"]}),
            distributed.world(),
            [],
            [],
            runs,
            len(runs),
            lambda _: None,
        )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA device"):
        local_devices("cuda")


def test_ray_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    jobs = [RunJob(name="x", config={}, run_dir="x", invocation="now")]
    with pytest.raises(
        ConfigError,
        match=r"executor 'ray' \(every node of a cluster needs it, and transformer-zoo\) "
        r"needs ray, which is not installed; install it with pip install "
        r"'transformer-zoo\[ray\]'",
    ):
        list(RayExecutor(1).run(jobs))


@pytest.mark.heavy
@pytest.mark.xdist_group("ray")
def test_ray_gives_the_metrics_of_local_to_the_last_digit(tmp_path, monkeypatch, capsys):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'transformer-zoo[ray]')")
    local = compare(load_spec(GRID), tmp_path / "local")
    reads = itertools.count()

    def folders_gone_after_a_few_reads(run_dir, invocation):  # live progress reads the run folders
        if next(reads) >= 6:
            raise OSError(116, "Stale file handle", str(run_dir))
        return started_where(run_dir, invocation)

    monkeypatch.setattr(executors, "started_where", folders_gone_after_a_few_reads)
    ray = compare(load_spec({**GRID, "executor": "ray"}), tmp_path / "ray")
    told = [line for line in capsys.readouterr().err.splitlines() if "live progress lost" in line]
    assert len(told) == 1 and "Stale file handle" in told[0] and "the runs go on" in told[0], told
    assert len(ray.runs) == len(local.runs) == 8  # 2 variants x 2 tasks x 2 seeds
    for a, b in zip(local.runs, ray.runs, strict=True):
        assert (a.variant, a.task, a.seed) == (b.variant, b.task, b.seed)
        assert a.metrics == b.metrics and a.curve == b.curve, f"{a.variant} on {a.task}, seed {a.seed}"
        assert not b.reused and re.fullmatch(r"[0-9a-f]{8}@\S+ cpu", b.placed_on), b.placed_on  # node id@host, device
    # a run holds its CPU for its whole life: never more runs train at once than the Ray instance has CPUs
    cpus, spans = available_cores(), [run.timespan for run in ray.runs]
    most = max(sum(start <= begun < end for start, end in spans) for begun, _ in spans)
    assert 1 <= most <= cpus, f"{most} runs trained at once on {cpus} CPUs"


def _kill_a_run_mid_way(tmp_path: Path) -> tuple[dict, str]:
    """Run a comparison of two long runs on two local workers in a child process, SIGKILL the
    worker training one of them once it has a checkpoint, and return the results and what the
    comparison printed."""
    spec = {
        **GRID,
        "variants": ["transformer-tiny"],
        "tasks": [LISTOPS],
        "steps": 100,
        "devices": ["cpu", "cpu"],  # a device list: a worker on each
        "train": {"batch_size": 4, "checkpoint_every": 20},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-m", "transformer_zoo", "compare", str(tmp_path / "spec.json"), "--out", str(out), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, killed = time.monotonic() + 240, None
        while killed is None and time.monotonic() < deadline and child.poll() is None:
            for state in out.glob("runs/*/checkpoint/state.json"):
                pid_file = state.parent.parent / ".lock.pid"
                if pid_file.is_file() and not (state.parent.parent / "record.json").exists():
                    killed = int(pid_file.read_text())
                    os.kill(killed, signal.SIGKILL)
                    break
            time.sleep(0.02)
        printed, errors = child.communicate(timeout=300)
    finally:
        child.kill()
    assert killed is not None, f"no run had a checkpoint to kill the run at:\n{errors}"
    assert killed != child.pid
    assert child.returncode == 0, errors
    return json.loads(printed), errors


@pytest.mark.heavy
@pytest.mark.xdist_group("ray")
def test_a_lost_nodes_run_resumes_from_its_checkpoint_on_another_node(tmp_path, capsys):
    """A two-node Ray cluster on this machine, one CPU a node: once the run training on the second
    node has a checkpoint, that node is killed (its raylet and its workers). The run starts again
    on the head node from its checkpoint, the other run goes on, and the driver never sees an
    exception; the report says which run was retried and from where, and every run's metrics are
    those of the same comparison undisturbed, on the local executor."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'transformer-zoo[ray]')")
    from ray.cluster_utils import Cluster

    # Ray counts a node dead after failed health checks: every 0.2 s here, rather than every 3 s
    checks = {"health_check_period_ms": 200, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": checks})
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    lost = node.node_id[:8]
    out, killed = tmp_path / "out", []

    def kill_the_node_once_its_run_has_a_checkpoint() -> None:
        deadline = time.monotonic() + 240
        while not killed and time.monotonic() < deadline:
            for state in out.glob("runs/*/checkpoint/state.json"):
                folder = state.parent.parent
                with contextlib.suppress(OSError, ValueError):
                    where = json.loads((folder / "attempts.json").read_text())["where"]
                    if where.startswith(lost) and not (folder / "record.json").exists():
                        cluster.remove_node(node, allow_graceful=False)
                        killed.append(folder.name)
                        return
            time.sleep(0.05)

    spec = {
        **GRID,
        "variants": ["transformer-tiny"],
        "tasks": [LISTOPS],
        "steps": 100,
        "executor": "ray",
        "address": cluster.address,
        "train": {"batch_size": 4, "checkpoint_every": 20},
    }
    killer = threading.Thread(target=kill_the_node_once_its_run_has_a_checkpoint, daemon=True)
    killer.start()
    try:
        results = compare(load_spec(spec), out)
    finally:
        killer.join(timeout=10)
        cluster.shutdown()
    assert killed, "no run trained on the second node long enough to be killed there"
    runs = sorted(results.runs, key=lambda r: r.attempts)
    assert [r.attempts for r in runs] == [1, 2] and not results.failed  # the other run went on undisturbed
    again = runs[1]
    assert again.resumed_from is not None and again.resumed_from % 20 == 0 and again.resumed_from >= 20
    assert again.steps == 100 and not again.placed_on.startswith(lost), "it ended on the node that was left"
    assert again.wall_seconds > again.last_attempt_seconds, "its wall time counts every start"
    report = (out / "report.md").read_text()
    wall = re.search(rf"\| 2 \(resumed at step {again.resumed_from}\) \| ([0-9.]+) \|", report)
    assert wall and float(wall[1]) == pytest.approx(again.wall_seconds, abs=0.5), "attempts beside the total wall time"
    assert "1 of 2 runs were started more than once" in report
    printed = capsys.readouterr().err
    told = [line for line in printed.splitlines() if "starting it again" in line]
    # one line, naming where it was (Ray may not count the node dead yet when the retry starts)
    assert len(told) == 1 and f" {lost}@" in told[0] and "(attempt 2)" in told[0], told
    # once Ray counts the node dead, one line says so; Ray's own messages are in the log, not the output
    assert [line for line in printed.splitlines() if " lost: " in line] == [
        f"node {lost}@{socket.gethostname()} lost: 1 run on it is retried from its last checkpoint"
    ], printed
    assert "(raylet)" not in printed and "\x1b[" not in printed, printed
    assert "\x1b[" not in (out / "ray.log").read_text()
    undisturbed = compare(load_spec({**spec, "executor": "local", "address": None}), tmp_path / "local")
    assert [(r.seed, r.metrics, r.curve) for r in sorted(results.runs, key=lambda r: r.seed)] == [
        (r.seed, r.metrics, r.curve) for r in sorted(undisturbed.runs, key=lambda r: r.seed)
    ], "the metrics of an uninterrupted run"


@pytest.mark.heavy
def test_a_run_whose_worker_is_killed_resumes_from_its_checkpoint(tmp_path):
    results, errors = _kill_a_run_mid_way(tmp_path)
    runs = sorted(results["runs"], key=lambda r: r["attempts"])
    assert [r["attempts"] for r in runs] == [1, 2], errors  # the other run went on undisturbed
    again = runs[1]
    assert again["resumed_from"] is not None and again["resumed_from"] % 20 == 0 and again["resumed_from"] >= 20
    assert again["steps"] == 100 and not results["failed"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"| 2 (resumed at step {again['resumed_from']}) |" in report, (
        "the report says it was retried, and from where"
    )
    assert "starting it again from its last checkpoint (attempt 2)" in errors
    host = socket.gethostname()
    assert sorted(r["placed_on"] for r in runs) == [f"{host} cpu #0", f"{host} cpu #1"]  # each on its worker's slot
    assert again["wall_seconds"] > again["last_attempt_seconds"] and runs[0]["wall_seconds"] == pytest.approx(
        runs[0]["last_attempt_seconds"], abs=0.1
    ), "a retried run's wall time counts every start"


@pytest.mark.heavy
def test_a_run_whose_worker_keeps_dying_is_reported_failed_and_the_others_go_on(tmp_path):
    spec = load_spec({**GRID, "variants": ["transformer-tiny"], "tasks": [LISTOPS], "workers": 2, "retries": 1})
    runs, _ = plan(spec)
    jobs = [
        RunJob(
            name=f"run{seed}",
            config=config.model_dump(mode="json"),
            run_dir=str(tmp_path / f"run{seed}"),
            invocation="now",
            tags={"variant": label, "task": "listops", "seed": str(seed)},
        )
        for seed, (label, config) in enumerate(runs[:1])
    ]
    doomed = RunJob(
        name="doomed", config={**jobs[0].config, "steps": 10_000}, run_dir=str(tmp_path / "doomed"), invocation="now"
    )
    events, killed = [], set()
    executor = LocalExecutor(["cpu", "cpu"], 1, retries=1)
    for event in executor.run([doomed, *jobs]):
        events.append(event)
        if event.job is doomed and event.state == "running":
            pid = _holder(Path(doomed.run_dir), killed)
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
    states = [(e.job.name, e.state, e.attempt) for e in events if e.state != "queued"]
    assert ("doomed", "retried", 2) in states and ("doomed", "failed", 2) in states
    assert "died" in next(e.error for e in events if e.state == "failed")
    assert [name for name, state, _ in states if state == "done"] == ["run0"]


def _holder(run_dir: Path, dead: set[int], timeout: float = 120) -> int:
    """The pid of the process training in ``run_dir`` once it has taken the folder's lock (not one
    of the ``dead``, whose pid a killed holder left behind)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pid = int((run_dir / ".lock.pid").read_text())
            if pid not in dead:
                return pid
        time.sleep(0.02)
    raise AssertionError(f"nothing trained in {run_dir}")


def test_progress_is_a_live_table_on_a_terminal_and_lines_in_a_log():
    jobs = [
        RunJob(
            name=f"r{i}",
            config={},
            run_dir=f"r{i}",
            invocation="now",
            tags={"variant": "v", "task": "t", "seed": str(i)},
        )
        for i in range(3)
    ]
    record = {"metrics": {"test": {"accuracy": 0.5}}, "metric": "accuracy", "wall_seconds": 3.0}
    events = [
        RunEvent("running", jobs[0], "cuda:1"),
        RunEvent("running", jobs[1], "3f2a91c0@node-a gpu 0"),
        RunEvent("done", jobs[0], "cuda:1", record=record),
        RunEvent("retried", jobs[1], "77b0e1d2@node-b gpu 0", 2, error="its node 3f2a91c0@node-a was lost"),
        RunEvent(
            "failed", jobs[1], "77b0e1d2@node-b gpu 0", 3, error="TrainingDiverged: loss became nan at step 2\nmore"
        ),
    ]
    log = io.StringIO()
    with GridProgress(jobs, log, live=False) as progress:
        for event in events:
            progress.event(event)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("[1/3] v on t (seed 0): accuracy 0.5, 3 s; about")
    assert lines[1] == (
        "v on t (seed 1): its node 3f2a91c0@node-a was lost; starting it again from its last checkpoint "
        "(attempt 2) on 77b0e1d2@node-b gpu 0"
    )
    assert lines[2].startswith(
        "[2/3] v on t (seed 1) failed on 77b0e1d2@node-b gpu 0 (attempt 3): TrainingDiverged: loss became nan"
    )
    assert len(lines) == 3, "running is not a line of its own in a log"
    screen = io.StringIO()
    with GridProgress(jobs, screen, live=True) as progress:
        for event in events[:2]:
            progress.event(event)
    shown = screen.getvalue()
    assert "running" in shown and "cuda:1" in shown and "3f2a91c0@node-a gpu 0" in shown and "queued" in shown
    assert "0/3 ended" in shown


def test_a_run_job_and_a_trial_job_are_picklable_and_a_trial_is_named_by_its_number():
    import dataclasses
    import pickle

    from transformer_zoo.comparing.runs import Job
    from transformer_zoo.comparing.tuning import TrialJob, TuneSpec

    run = RunJob(name="r", config={}, run_dir="r", invocation="now", probes=("attention",), tags={"seed": "0"})
    trial = TrialJob(
        name="t",
        config={},
        run_dir="t",
        invocation="now",
        journal="j.log",
        study="s",
        number=3,
        tune=TuneSpec(rungs=2),
    )
    for job in (run, trial):
        assert isinstance(job, Job) and pickle.loads(pickle.dumps(job)) == job
    assert {f.name for f in dataclasses.fields(trial)} - {f.name for f in dataclasses.fields(Job)} == {
        "journal",
        "study",
        "number",
        "tune",
    }, "no Optuna storage id travels: the driver keeps the trial, the job names it by study and number"
    assert not hasattr(run, "trial")
