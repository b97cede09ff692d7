"""Progress of a grid of runs, from an executor's events: on a terminal, a live table of the
runs (queued, running on which device or node, done, failed, retried) with an overall ETA; in a
log, one line per event."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .executors import RunEvent
from .runs import Job

STYLES = {"queued": "dim", "running": "cyan", "retried": "yellow", "done": "green", "failed": "bold red"}


def duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def outcome(event: RunEvent) -> str:
    """A finished run's headline score and time, as progress shows it."""
    record = event.record or {}
    if not record:
        return ""
    score = record["metrics"]["test"][record["metric"]]
    kept = " (kept from an earlier invocation)" if record.get("reused") else ""
    return f"{record['metric']} {score:.4g}, {record['wall_seconds']:.0f} s{kept}"


class GridProgress:
    """Shows a grid's events: a live table when ``stream`` is a terminal (``live``), else a line
    for each run that ends, fails or is retried. Use as a context manager around the events."""

    def __init__(self, jobs: list[Job], stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self.total = len(jobs)
        self.rows = {job.run_dir: ["queued", job.title, "", "", ""] for job in jobs}
        self.ended, self.started = 0, time.perf_counter()
        self._live: Live | None = None

    def __enter__(self) -> GridProgress:
        if self.live:
            self._live = Live(self.table(), console=Console(file=self.stream), refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self.table())
            self._live.__exit__(*exc)

    def eta(self) -> str:
        elapsed = time.perf_counter() - self.started
        if self.ended == self.total:
            return f"all runs in {duration(elapsed)}"
        if not self.ended:
            return "the time to go is known after the first run"
        return f"about {duration(elapsed / self.ended * (self.total - self.ended))} to go"

    def table(self) -> Group:
        table = Table("run", "state", "where", "attempt", "result", box=None, pad_edge=False)
        for state, name, where, attempt, result in self.rows.values():
            table.add_row(name, Text(state, style=STYLES[state]), where, attempt, result)
        counts = {state: sum(row[0] == state for row in self.rows.values()) for state in STYLES}
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        return Group(table, Text(f"{self.ended}/{self.total} ended ({summary}); {self.eta()}"))

    def event(self, event: RunEvent) -> None:
        """Show one event."""
        if event.job is None:  # a node or the live progress lost: a line of its own, above the live table
            line = event.error
            if self._live is not None:
                self._live.console.print(line, style=STYLES["retried"], highlight=False)
            else:
                self.say(line)
            return
        row = self.rows[event.job.run_dir]
        row[0] = event.state
        if event.where:
            row[2] = event.where
        if event.state != "queued":
            row[3] = str(event.attempt)
        if event.state in ("done", "failed"):
            self.ended += 1
            row[4] = outcome(event) if event.state == "done" else event.error.splitlines()[0]
        if event.state == "retried":
            row[4] = event.error
        if self._live is not None:
            self._live.update(self.table())
            return
        where = f" on {event.where}" if event.where else ""
        if event.state == "done":
            self.say(f"[{self.ended}/{self.total}] {event.job.title}: {outcome(event)}; {self.eta()}")
        elif event.state == "failed":
            self.say(
                f"[{self.ended}/{self.total}] {event.job.title} failed{where} (attempt {event.attempt}): "
                f"{event.error.splitlines()[0]}; {self.eta()}"
            )
        elif event.state == "retried":
            cause = f"{event.error}; " if event.error else ""
            self.say(
                f"{event.job.title}: {cause}starting it again from its last checkpoint (attempt {event.attempt}){where}"
            )

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
