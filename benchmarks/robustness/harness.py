"""The harness of the audit: a worker process with a memory and time limit that runs one case
at a time, the CLI run as a user runs it, and how an attempt's ending is read."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAN, INF = float("nan"), float("inf")
GOOD = {
    "configs": "clear",
    "files": "clear",
    "training": "clear",
    "inputs": "ValueError",
    "checkpoints": "clean",
    "pretrained": "clear",
    "plugins": "clean",
    "concurrency": "clean",
}
TITLES = {
    "configs": "bad model configs",
    "files": "config files and --set",
    "training": "bad training configs",
    "inputs": "runtime inputs",
    "checkpoints": "checkpoint manipulations",
    "pretrained": "hostile from_pretrained folders",
    "plugins": "plugins",
    "concurrency": "concurrency and interruption",
}


@dataclass
class Result:
    category: str
    case: str
    outcome: str
    detail: str = ""


# ---- the worker: a process with a memory and time limit ---------------------------------------
class Hang(BaseException):
    """Raised by the per-case alarm; a BaseException so that no ``except Exception`` swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


WARMUP_VARIANTS = [
    "transformer-tiny",
    "bert-tiny",
    "universal-transformer-tiny",
    "universal-transformer-encoder-tiny",
    "local-global-encoder-tiny",
    "transformer-dmca-tiny",
    "vit-tiny",
    "image-transformer-tiny",
    "sagan-classifier-tiny",
    "sagan-gan",
]


def worker_main(conn: Any, extra_bytes: int, log: str, cwd: str) -> None:
    """Answer ``(runner, payload, seconds)`` messages with what happened, until None; ``runner`` is a
    name in :data:`RUNNERS` or a function."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1), os.dup2(fd, 2)  # libraries' progress bars go to the log
    os.chdir(cwd)
    import warnings

    warnings.simplefilter("ignore")
    import transformer_zoo as tz

    for name in WARMUP_VARIANTS:  # import every plugin's modules before the clock runs
        tz.build_model(name)
    limit = _vm_size() + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    while (message := conn.recv()) is not None:
        runner, payload, seconds = message
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            call = RUNNERS[runner] if isinstance(runner, str) else runner
            answer = {"status": "returned", **(call(payload) or {})}
        except Hang:
            answer = {"status": "hang", "message": f"still running after {seconds:g} s"}
        except BaseException as exc:  # SystemExit included: whatever a case raises is its outcome
            answer = _describe(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        gc.collect()
        conn.send(answer)


def _describe(exc: BaseException) -> dict[str, Any]:
    from transformer_zoo import ZooError

    message = str(exc)
    return {
        "status": "raised",
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": message[:2000],
        "zoo": isinstance(exc, ZooError),
        "value": isinstance(exc, ValueError),
        "not_found": isinstance(exc, FileNotFoundError),
        "memory": isinstance(exc, MemoryError) or "can't allocate memory" in message,
    }


def run_build(payload: tuple) -> None:
    import transformer_zoo as tz
    from transformer_zoo.training import load_train_config

    how, *args = payload
    if how == "mapping":
        tz.build_model(args[0])
    elif how == "overrides":
        tz.build_model(tz.load_config(args[0], args[1]))
    elif how == "file":
        tz.build_model(tz.load_config(args[0]))
    else:  # a training config file
        load_train_config(args[0])


def run_train(payload: tuple) -> None:
    from transformer_zoo.training import load_train_config, train

    source, run_dir = payload
    train(load_train_config(source), run_dir, progress=False)


def run_pretrained(path: str) -> None:
    import transformer_zoo as tz

    tz.from_pretrained(path)


RUNNERS: dict[str, Callable[[Any], Any]] = {
    "build": run_build,
    "train": run_train,
    "pretrained": run_pretrained,
}


class Sandbox:
    """One worker process, replaced when it dies or stops answering."""

    def __init__(self, extra_bytes: int, log: Path, cwd: Path) -> None:
        self.extra_bytes, self.log, self.cwd = extra_bytes, log, cwd
        self.proc: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: the parent's state is not the worker's
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(child, self.extra_bytes, str(self.log), str(self.cwd)), daemon=True
        )
        checkout = str(Path(__file__).resolve().parents[2])  # the worker imports this benchmarks/ package
        added = checkout not in sys.path
        if added:  # tzoo bench loaded it by its path; the worker starts with the parent's import path
            sys.path.append(checkout)
        try:
            self.proc.start()
        finally:
            if added:
                sys.path.remove(checkout)
        child.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join()
        self.proc = None

    def run(self, runner: str | Callable[[Any], Any], payload: Any, seconds: float) -> dict[str, Any]:
        """``runner(payload)`` in the worker: a name in :data:`RUNNERS`, or a module-level function
        (sent by reference: the worker imports its module)."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((runner, payload, seconds))
        if not self.conn.poll(seconds + 90):  # the alarm cannot stop a long call into C; the parent can
            self.stop()
            return {"status": "hang", "message": f"no answer after {seconds + 90:g} s; worker killed"}
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join()
            code = self.proc.exitcode
            self.stop()
            return {"status": "crashed", "message": f"worker died (exit code {code})"}


# ---- outcomes ---------------------------------------------------------------------------------
def names_one(message: str, names: list[str]) -> bool:
    """Whether ``message`` names one of ``names`` as a word (``d_model``, ``encoder.layers``)."""
    return any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message) for name in names)


def refusal(answer: dict[str, Any], names: list[str], returned: str = "accepted") -> tuple[str, str]:
    """A worker's answer as clear / unclear / traceback / accepted / hang / allocated / crashed."""
    status = answer["status"]
    if status != "raised":
        return (returned if status == "returned" else status), answer.get("message", "")
    detail = f"{answer['type']}: {answer['message']}"
    if answer["memory"]:
        return "allocated", detail
    if answer["zoo"] or answer["value"]:
        return ("clear" if names_one(answer["message"], names) else "unclear"), detail
    return "traceback", detail


def cli_refusal(proc: subprocess.CompletedProcess | None, names: list[str]) -> tuple[str, str]:
    """A command's ending: rc 2 with an error line (naming the field: clear), a traceback, rc 0 (accepted)."""
    if proc is None:
        return "hang", "timed out"
    err = proc.stderr.strip()
    if "Traceback" in err:
        return "traceback", err.splitlines()[-1]
    if proc.returncode == 0:
        return "accepted", "exit 0"
    if proc.returncode == 2 and err:
        return ("clear" if names_one(err, names) else "unclear"), err.splitlines()[-1]
    return "crashed", f"exit {proc.returncode}: {err[-200:]}"


def cli(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess | None:
    """``python -m transformer_zoo ARGS``: the CLI of whatever ``transformer_zoo`` the path finds."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "transformer_zoo", *args],
            cwd=cwd,
            env=env or os.environ.copy(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


@dataclass
class Context:
    """What every category needs: a scratch folder, the worker, the progress display."""

    root: Path
    sandbox: Sandbox
    seed: int
    config_cases: int
    progress: Any
    controls: list[tuple[str, str, bool, str]]

    def track(self, items: list, category: str) -> Any:
        task = self.progress.add_task(TITLES[category], total=len(items))
        for item in items:
            yield item
            self.progress.advance(task)

    def control(self, category: str, name: str, ok: bool, detail: str) -> None:
        """A case that must work, so that a bad case's ending is the zoo's doing, not the harness's."""
        self.controls.append((category, name, ok, detail.strip()[-300:]))
