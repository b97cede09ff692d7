"""Where a comparison's runs train: an :class:`Executor` takes the jobs (:class:`~.runs.Job`: a
run, or a tuning trial) and yields what happens to them, as :class:`RunEvent` s (queued, running
where, retried, done with its result, failed with its error). Progress reads the events; Ctrl-C stops the executor, and every run
keeps its last checkpoint.

- :class:`LocalExecutor` (``executor: local``, the default): worker processes on this machine,
  each pinned to one device slot; with N GPUs, N workers by default, one GPU each
  (``runs_per_device`` K puts K runs on each). One worker trains in this process.
- :class:`RayExecutor` (``executor: ray``, the ``[ray]`` extra): every run a Ray task asking for
  the CPUs (its threads) and GPUs it needs, on a Ray instance of this machine or a cluster.

A run whose worker dies (killed, out of memory, its node lost) is started again from its last
checkpoint, up to ``retries`` times, and then reported failed; a run that raises an error is
reported failed at once (it would fail again). The other runs go on either way.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import connection, get_context
from pathlib import Path
from typing import Any, Literal, TextIO

import torch

from ..core.errors import ConfigError, optional
from ..registry import get_registry
from .runs import Job, attempts_so_far, available_cores, started_where

State = Literal["queued", "running", "retried", "done", "failed", "lost"]


@dataclass
class RunEvent:
    """What just happened to a run, or to a node of a cluster.

    Attributes:
        state: queued, running (on ``where``), retried (its worker died; it starts again from its
            last checkpoint), done (``record`` holds what its :meth:`~.runs.Job.execute` returned: a
            run's record, a trial's result) or failed (``error`` says why); or lost, with no
            ``job``: a node (``where``) or the live progress was lost, as ``error`` says.
        attempt: the start it is on (1: the first; for retried, the start to come).
    """

    state: State
    job: Job | None
    where: str = ""
    attempt: int = 1
    record: Any = None
    error: str = ""


class Executor(ABC):
    """Trains jobs and tells what happens to them."""

    name: str = ""

    @abstractmethod
    def run(self, jobs: list[Job]) -> Iterator[RunEvent]:
        """Train every job, yielding its events as they happen; every job ends done or failed.

        Raises:
            KeyboardInterrupt: Ctrl-C; the runs in progress keep their last checkpoints.
        """


def describe(exc: BaseException) -> str:
    """An error as a report says it: its type and message."""
    return f"{type(exc).__name__}: {exc}"


def device_slots(devices: list[str], workers: int | None, runs_per_device: int) -> list[str]:
    """The device of each local worker: ``workers`` (default: every device ``runs_per_device``
    times) dealt round the devices, so that no device has more than its share.

    >>> device_slots(["cuda:0", "cuda:1"], None, 2)
    ['cuda:0', 'cuda:1', 'cuda:0', 'cuda:1']
    """
    count = workers or len(devices) * runs_per_device
    return [devices[i % len(devices)] for i in range(count)]


def local_devices(config_device: str) -> list[str]:
    """The devices of this machine the runs may use: every GPU (``cuda:0``, ...) unless the runs
    ask for the CPU, else the CPU.

    Raises:
        ConfigError: the runs ask for CUDA and there is none.
    """
    if config_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "the runs ask for device 'cuda' but this machine has no CUDA device; set the spec's train "
            "device to auto or cpu"
        )
    if config_device != "cpu" and torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def check_devices(devices: list[str]) -> None:
    """Refuse a device list naming what this machine does not have.

    Raises:
        ConfigError: a device that is neither ``cpu`` nor ``cuda:N`` of one of this machine's GPUs.
    """
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    known = ["cpu", *(f"cuda:{i}" for i in range(count))]
    wrong = [device for device in devices if device not in known]
    if wrong:
        raise ConfigError(
            f"devices {wrong} are not devices of this machine; name {' or '.join(known)} (this machine "
            f"has {count} GPU(s)), or leave devices out to use every GPU"
        )


def use_device(device: str) -> None:
    """Make ``device`` this process's own: a CUDA device becomes the current one, so that runs on
    ``auto`` or ``cuda`` train on it."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))


def enter_worker(plugins: list[str], threads: int, device: str) -> None:
    """Set up a worker process: its threads, its device, and the plugins registered where the
    comparison was called. Ctrl-C reaches every process of a terminal's group; a worker ignores
    it, and the comparison's process, which hears it too, ends the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    use_device(device)
    registry = get_registry()
    for module in plugins:
        registry.register_module(module)


def _serve(conn: connection.Connection, plugins: list[str], threads: int, device: str, where: str) -> None:
    """A local worker on ``device`` (``where`` as progress names it): train each job it is sent,
    answering ``("done", record)`` or ``("failed", error)``, until it is sent None."""
    try:
        enter_worker(plugins, threads, device)
        broken = None
    except Exception as exc:  # a plugin that does not import, a device that is not there: every run is told
        broken = f"the worker on {where} could not start: {describe(exc)}"
    while (job := conn.recv()) is not None:
        if broken is not None:
            conn.send(("failed", broken))
            continue
        try:
            conn.send(("done", job.execute(where)))
        except Exception as exc:  # the run failed; the worker trains the next
            conn.send(("failed", describe(exc) + "\n" + traceback.format_exc(limit=-3)))


class LocalExecutor(Executor):
    """Runs in worker processes of this machine, one device slot each (see :func:`device_slots`),
    or in this process when there is one slot or ``in_process``."""

    name = "local"

    def __init__(
        self,
        slots: list[str],
        threads: int,
        plugins: list[str] = (),
        retries: int = 2,
        in_process: bool = False,
        fail_fast: bool = False,
    ) -> None:
        """
        Args:
            slots: the device of each worker.
            threads: CPU threads of each run.
            plugins: plugin modules every worker registers.
            retries: how many times a run whose worker died starts again.
            in_process: train here, one run at a time, whatever the slots (a plugin no worker
                could import, or a torchrun job whose processes train each run together).
            fail_fast: raise a run's error instead of reporting it (a torchrun job, whose
                processes must stop together).
        """
        self.slots, self.threads, self.plugins, self.retries = slots, threads, list(plugins), retries
        self.in_process = in_process or len(slots) == 1
        self.fail_fast = fail_fast

    def run(self, jobs: list[Job]) -> Iterator[RunEvent]:
        yield from (RunEvent("queued", job) for job in jobs)
        yield from self._here(jobs) if self.in_process else self._pool(jobs)

    def _here(self, jobs: list[Job]) -> Iterator[RunEvent]:
        device = self.slots[0]
        where = " ".join(filter(None, (socket.gethostname(), device)))
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        use_device(device)
        try:
            for job in jobs:
                yield RunEvent("running", job, where)
                try:
                    record = job.execute(where)
                except Exception as exc:
                    if self.fail_fast:
                        raise
                    yield RunEvent("failed", job, where, error=describe(exc))
                    continue
                yield RunEvent("done", job, where, record=record)
        finally:
            torch.set_num_threads(before)

    def _pool(self, jobs: list[Job]) -> Iterator[RunEvent]:
        context = get_context("spawn")
        pending, attempts = deque(jobs), {job.run_dir: 0 for job in jobs}
        workers: dict[int, tuple[Any, connection.Connection]] = {}  # slot -> (process, its end of the pipe)
        busy: dict[int, Job] = {}

        def start(slot: int) -> None:
            here, there = context.Pipe()
            process = context.Process(
                target=_serve,
                args=(there, self.plugins, self.threads, self.slots[slot], self._where(slot)),
                name=f"tzoo-worker-{slot}",
                daemon=True,
            )
            process.start()
            there.close()
            workers[slot] = (process, here)

        try:
            while pending or busy:
                for slot in range(len(self.slots)):
                    if slot not in busy and pending:
                        if slot not in workers:
                            start(slot)
                        job = busy[slot] = pending.popleft()
                        try:
                            workers[slot][1].send(job)
                        except OSError:  # the idle worker died: another takes its place, and the job
                            pending.appendleft(busy.pop(slot))
                            self._end(*workers.pop(slot))
                            continue
                        attempts[job.run_dir] += 1
                        yield RunEvent("running", job, self._where(slot), attempts[job.run_dir])
                if not busy:  # every idle worker had died: start others
                    continue
                ready = connection.wait(
                    [workers[slot][1] for slot in busy] + [workers[slot][0].sentinel for slot in busy]
                )
                for slot in [s for s in busy if workers[s][1] in ready or workers[s][0].sentinel in ready]:
                    process, conn = workers[slot]
                    job = busy.pop(slot)
                    attempt, where = attempts[job.run_dir], self._where(slot)
                    try:
                        outcome, value = conn.recv()
                    except (EOFError, OSError):  # the worker died: start the run again from its checkpoint
                        process.join()
                        conn.close()
                        del workers[slot]
                        died = f"its worker process died (exit code {process.exitcode})"
                        if attempt <= self.retries:
                            pending.appendleft(job)
                            yield RunEvent("retried", job, where, attempt + 1, error=died)
                        else:
                            yield RunEvent("failed", job, where, attempt, error=f"{died}, {attempt} times")
                        continue
                    if outcome == "done":
                        yield RunEvent("done", job, where, attempt, record=value)
                    else:
                        yield RunEvent("failed", job, where, attempt, error=value)
        finally:
            stopped = bool(pending or busy)  # Ctrl-C, or the caller stopped listening
            for process, conn in workers.values():
                self._end(process, conn, stopped)

    @staticmethod
    def _end(process: Any, conn: connection.Connection, stop: bool = True) -> None:
        """End a worker: told there is no more work, or stopped (its run keeps its last checkpoint)."""
        if stop and process.is_alive():
            process.terminate()
        else:
            with contextlib.suppress(OSError):
                conn.send(None)
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()

    def _where(self, slot: int) -> str:
        """A worker as progress and records name it: this machine's host name and the worker's
        device (``HOST cpu #1`` where two workers share one)."""
        device = self.slots[slot] if self.slots.count(self.slots[slot]) == 1 else f"{self.slots[slot]} #{slot}"
        return f"{socket.gethostname()} {device}"


def import_ray(module: str = "ray") -> Any:
    """The ``ray`` package (or one of its modules), an optional dependency.

    Raises:
        ConfigError: it is not installed; the message says how to install it (on every node of
            a cluster, with transformer-zoo).
    """
    return optional(module, "ray", "executor 'ray' (every node of a cluster needs it, and transformer-zoo)")


def _ray_run(job: Job, plugins: list[str], threads: int, gpus: float) -> tuple[str, Any]:
    """One job as a Ray task: train it, its start (and where) counted in its run folder, which is
    how the driver learns that it started (a second start is a retry); returns where it trained
    and the job's result. Nothing here waits on the driver, so the task holds its CPUs (and GPU)
    for the whole run, and a lost driver-side actor cannot fail it."""
    ray = import_ray()
    enter_worker(plugins, threads, "cuda:0" if gpus else "cpu")  # Ray shows the task only the GPUs it was given
    device = f"gpu {','.join(map(str, ray.get_gpu_ids()))}" if gpus else "cpu"
    where = f"{ray.get_runtime_context().get_node_id()[:8]}@{socket.gethostname()} {device}"
    return where, job.execute(where)


def _why_retried(lost: set[str], was: str) -> str:
    """Why a Ray task started again, given where its last start was (``ID@HOST DEVICE``) and the
    nodes known lost: its node was lost, or else its worker process died (Ray may not count a
    node lost yet when the retry starts: a line of its own says so when it does)."""
    node = was.split(" ")[0]
    if node and node in lost:
        return f"its node {node} was lost"
    return f"its worker process on {was} died" if was else "its worker process died"


def _lost_runs(count: int) -> str:
    """What a lost node means for the ``count`` unfinished runs that had started on it."""
    if count == 0:
        return "no unfinished run was on it"
    if count == 1:
        return "1 run on it is retried from its last checkpoint"
    return f"{count} runs on it are retried from their last checkpoints"


def _node_names(ray: Any) -> dict[str, bool]:
    """Every node Ray knows, alive or not, by ``ID@HOST`` (the first 8 hex digits of its id, as
    ``where`` names it): whether it is alive."""
    return {f"{n['NodeID'][:8]}@{n.get('NodeManagerHostname', '')}": bool(n["Alive"]) for n in ray.nodes()}


class _Plain:
    """A text stream that writes to ``stream`` without terminal colour codes (Ray colours its
    prefixes whatever its output is)."""

    _codes = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(self._codes.sub("", text))

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


class RayExecutor(Executor):
    """Every run a Ray task: ``num_cpus`` its threads, ``num_gpus`` its share of a GPU. With no
    address it starts a Ray instance of this machine's cores (and ends it after); ``auto`` or
    ``ray://HOST:PORT`` joins a cluster started with ``ray start``.

    Run folders are written by the node that trains the run, so the report folder (or the
    cache) must be a path every node shares (a network filesystem); records come back to the
    driver as the tasks' results. A task tells its start only through its run folder
    (:func:`~.runs.count_attempt`), which the driver reads between results: no actor, and no
    call that waits on the driver."""

    name = "ray"

    def __init__(
        self,
        threads: int,
        plugins: list[str] = (),
        retries: int = 2,
        address: str | None = None,
        gpus_per_run: float | None = None,
        runs_per_device: int = 1,
        log: Path | None = None,
    ) -> None:
        """
        Args:
            threads: CPU threads of each run (its ``num_cpus``).
            plugins: plugin modules every task registers.
            retries: how many times a run whose worker or node died starts again (Ray's
                ``max_retries``); a run that raises is not retried.
            address: the cluster to join; None: start one on this machine.
            gpus_per_run: the GPUs each run asks for; None: ``1 / runs_per_device`` where the
                cluster has GPUs, else none.
            log: the file Ray's own messages are appended to (its raylets' last log lines when a
                node dies, its retry notices); None: standard error.
        """
        self.threads, self.plugins, self.retries, self.address = threads, list(plugins), retries, address
        self.gpus_per_run, self.runs_per_device, self.log = gpus_per_run, runs_per_device, log

    def run(self, jobs: list[Job]) -> Iterator[RunEvent]:
        ray = import_ray()
        # Ray's driver prints its raylets' messages (a node's last 20 log lines when it dies, each retry)
        # to standard output, which is the command's result (--json): while Ray runs they go to the log
        # file (or, with none, to standard error), and progress says what happened in lines of its own
        with contextlib.ExitStack() as stack:
            if self.log is None:
                sink: TextIO = sys.stderr
            else:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                sink = _Plain(stack.enter_context(open(self.log, "a", encoding="utf-8")))
            stack.enter_context(contextlib.redirect_stdout(sink))
            yield from self._run(ray, jobs)

    def _run(self, ray: Any, jobs: list[Job]) -> Iterator[RunEvent]:
        started_here = not ray.is_initialized()
        if started_here:
            options = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
            if self.address is None:
                ray.init(num_cpus=available_cores(), **options)
            else:
                ray.init(address=self.address, **options)
        refs: dict[Any, Job] = {}
        try:
            gpus = self.gpus_per_run
            if gpus is None:
                gpus = (
                    1 / self.runs_per_device
                    if ray.cluster_resources().get("GPU", 0)
                    and not all(job.config.get("device") == "cpu" for job in jobs)
                    else 0
                )
            task = ray.remote(_ray_run).options(
                num_cpus=self.threads, num_gpus=gpus, max_retries=self.retries, retry_exceptions=False
            )
            for job in jobs:
                refs[task.remote(job, self.plugins, self.threads, gpus)] = job
                yield RunEvent("queued", job)
            seen = {job.run_dir: (0, "") for job in jobs}  # each run's starts seen so far, and where the last was
            starts: dict[str, set[str]] = {job.run_dir: set() for job in jobs}  # the nodes each run started on
            retried: set[str] = set()  # the runs started more than once
            alive = {node for node, up in _node_names(ray).items() if up}
            lost: set[str] = set()

            def nodes_lost() -> Iterator[RunEvent]:
                """A line for each node Ray has counted dead since the last look, with the unfinished
                (or retried) runs that had started on it."""
                nodes = _node_names(ray)
                for node in sorted(n for n in alive if not nodes.get(n, False)):
                    alive.discard(node)
                    lost.add(node)
                    hit = sum(node in starts[d] for d in {job.run_dir for job in refs.values()} | retried)
                    yield RunEvent("lost", None, node, error=f"node {node} lost: {_lost_runs(hit)}")
                alive.update(node for node, up in nodes.items() if up and node not in lost)

            looked, unread = time.monotonic(), None
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                if time.monotonic() - looked >= 1.0:
                    looked = time.monotonic()
                    yield from nodes_lost()
                for job in list(refs.values()) if unread is None else ():  # starts and retries, from the run folders
                    try:
                        attempt, where = started_where(job.run_dir, job.invocation)
                    except OSError as exc:  # the runs go on (their results come back as tasks' results)
                        unread = describe(exc)
                        yield RunEvent("lost", None, error=f"live progress lost: {unread}; the runs go on")
                        break
                    if attempt > seen[job.run_dir][0]:
                        was = seen[job.run_dir][1]
                        seen[job.run_dir] = attempt, where
                        starts[job.run_dir].add(where.split(" ")[0])
                        if attempt == 1:
                            yield RunEvent("running", job, where, attempt)
                        else:
                            retried.add(job.run_dir)
                            yield RunEvent("retried", job, where, attempt, error=_why_retried(lost, was))
                for ref in ready:
                    job = refs.pop(ref)
                    try:
                        attempt = attempts_so_far(job.run_dir, job.invocation)
                    except OSError:  # the folders cannot be read: the starts seen so far
                        attempt = seen[job.run_dir][0]
                    try:
                        where, record = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # the run raised: it would again
                        error = describe(exc.cause) if exc.cause else str(exc)
                        yield RunEvent("failed", job, attempt=attempt, error=error)
                        continue
                    except ray.exceptions.RayError as exc:  # its worker or node died once more than it may
                        error = f"{describe(exc)} (after {self.retries} retries)"
                        yield RunEvent("failed", job, attempt=attempt, error=error)
                        continue
                    yield RunEvent("done", job, where, attempt, record=record)
            yield from nodes_lost()
        finally:
            for ref in refs:  # Ctrl-C: stop what still trains; each run keeps its last checkpoint
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()
