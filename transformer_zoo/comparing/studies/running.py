"""Running studies: one study's comparison judged and written (:func:`reproduce`), and many, one
after another or each in a process of its own with its output in a log (:func:`reproduce_all`)."""

from __future__ import annotations

import os
import signal
import sys
import time
from functools import partial
from multiprocessing import connection, get_context
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ...core.errors import ConfigError, ZooError
from ...core.files import atomic_write
from ...registry import get_registry
from ...training.run_folder import read_json
from ..progress import duration
from ..records import CompareResults
from ..rounds import Looks, run_rounds
from ..runner import ComparisonInterrupted, compare
from ..sequential import claim_share
from ..spec import CompareSpec, budget_seconds
from ..tuning import untuned_label
from .figures import plot_sweep
from .pages import claims_table_lines, studies_table_lines, study_lines, sweep_report_lines
from .spec import Claim, Scale, Study, load_study
from .sweeps import InitialLosses, Sweep, SweepResult
from .verdicts import (
    ClaimResult,
    StudyResult,
    claim_labels,
    judge,
    short_runs,
    stopped_runs,
    sweep_results,
    verdict,
)


def command(name: str, scale: Scale, overrides: dict[str, Any] | None = None) -> str:
    """The command line that runs the study again as it ran."""
    overrides = overrides or {}
    given = [
        f"--{key} {','.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in overrides.items()
        if key in ("seeds", "steps")
    ]
    if "until_decided" in overrides:
        budget = overrides["until_decided"].get("budget")
        given += ["--until-decided", *([] if budget is None else [f"--budget {budget_seconds(budget) / 60:g}m"])]
    return " ".join([f"tzoo reproduce {name}", *([] if scale == "cpu" else [f"--scale {scale}"]), *given])


def reproduce(
    study: Study,
    out_dir: str | os.PathLike,
    scale: Scale = "cpu",
    overrides: dict[str, Any] | None = None,
    plugins: list[str] | None = None,
) -> StudyResult:
    """Run a study's comparison into ``out_dir`` and judge its claims: ``verdict.json`` and
    ``verdict.md`` beside the comparison's ``report.md``; a study with a sweep also draws its
    figures there (:func:`~.figures.plot_sweep`), shown on both pages."""
    for module in plugins or ():  # before the spec, whose variants a plugin may provide
        get_registry().register_module(module)
    spec = study.spec(scale, overrides)
    sweep = study.sweep_at(scale, overrides)
    initial = None if sweep is None else InitialLosses(spec, sweep)
    out_dir = Path(out_dir)
    started = time.perf_counter()
    rerun = command(study.name, scale, overrides)
    if spec.until_decided is not None:
        result = _reproduce_until_decided(study, spec, out_dir, scale, rerun, plugins, sweep, initial)
    else:
        results = compare(spec, out_dir, plugins=plugins)
        if results is None:  # another process of a torchrun job
            raise RuntimeError("reproduce runs in one process; run it without torchrun")
        result = verdict(
            study, spec, results, scale, time.perf_counter() - started, rerun, sweep=sweep, initial=initial
        )
    if result.sweeps:
        result.plots = [name for swept in result.sweeps for name in plot_sweep(swept, out_dir)]
        _add_to_report(out_dir / "report.md", result.sweeps, result.plots)
    text = result.model_dump_json(indent=2)
    atomic_write(out_dir / "verdict.json", lambda tmp: tmp.write_text(text))
    page = "\n".join(study_lines(result))
    atomic_write(out_dir / "verdict.md", lambda tmp: tmp.write_text(page))
    return result


def _add_to_report(report: Path, sweeps: list[SweepResult], plots: list[str]) -> None:
    """The sweep's figures and table at the end of the comparison's ``report.md`` (which compare
    writes anew each time it runs)."""
    if not report.is_file():
        return
    text = report.read_text().rstrip("\n") + "\n\n" + "\n".join(sweep_report_lines(sweeps, plots)) + "\n"
    atomic_write(report, lambda tmp: tmp.write_text(text))


def _reproduce_until_decided(
    study: Study,
    spec: CompareSpec,
    out_dir: Path,
    scale: Scale,
    rerun: str,
    plugins: list[str] | None,
    sweep: Sweep | None = None,
    initial: InitialLosses | None = None,
) -> StudyResult:
    """The study with seeds added in rounds until each claim is decided (:mod:`..rounds`): a claim
    keeps the verdict of the look that decided it."""
    looks: Looks[ClaimResult] = Looks(list(range(len(study.claims))), claim_share([c.relation for c in study.claims]))

    def judge_claims(results: CompareResults, look: int, alpha: float) -> bool:
        short = short_runs(spec, results)
        swept = {} if sweep is None else sweep_results(sweep, spec, results, initial)
        judges = {
            i: partial(
                _judged,
                study.claims[i],
                results,
                stopped_runs(study.claims[i], short, results, sweep),
                look,
                sweep=swept.get(study.claims[i].task),
            )
            for i in looks.open
        }
        return looks.judge(look, alpha, judges, lambda c: c.verdict != "inconclusive")

    def needed() -> set[str]:  # the variants of the open claims (a tuned twin's by its own variant's label)
        labels = {label for i in looks.open for label in claim_labels(study.claims[i], sweep)}
        return {untuned_label(label) for label in labels}

    started = time.perf_counter()
    results, rounds, why = run_rounds(spec, out_dir, judge_claims, spec.until_decided, plugins, needed=needed)
    claims = [looks.outcome(i)[1] for i in range(len(study.claims))]
    result = verdict(
        study,
        spec.model_copy(update={"seeds": rounds[-1].seeds}),
        results,
        scale,
        time.perf_counter() - started,
        rerun,
        claims,
        sweep,
        initial,
    )
    return result.model_copy(update={"rounds": [r.__dict__ for r in rounds], "stopped": why})


def _judged(
    claim: Claim, results: CompareResults, stopped: list[str], look: int, alpha: float, sweep: SweepResult | None
) -> ClaimResult:
    return judge(claim, results, stopped, alpha, sweep).model_copy(update={"look": look + 1})


def default_at_once(scale: Scale, count: int) -> int:
    """How many studies run at once by default: every one at the gpu scale on a machine with
    CUDA (each study's spec asks for the few GPU slots it needs, sized for sharing one GPU with
    the others), else one after another."""
    import torch

    return count if scale == "gpu" and torch.cuda.is_available() else 1


def reproduce_all(
    names: list[str],
    out_dir: str | os.PathLike,
    scale: Scale = "cpu",
    overrides: dict[str, Any] | None = None,
    plugins: list[str] | None = None,
    at_once: int | None = None,
) -> list[StudyResult]:
    """Run the named studies (each into ``out_dir/NAME``), then write ``out_dir/reproductions.md``,
    a row per study of this scale run so far in ``out_dir``, with the wall time of this call.
    Every study is validated before the first one trains.

    Args:
        plugins: plugin modules to register in every study's process (``--plugin``); plugins
            registered in this process are carried too.
        at_once: studies run at the same time, each in a process of its own whose output goes to
            ``out_dir/NAME/log.txt``; None: :func:`default_at_once`.

    Raises:
        ConfigError: two studies of one name (they would share a folder).
        StudiesFailed: a study run beside others failed; the others finished and are reported.
    """
    studies = [load_study(name) for name in names]
    twice = sorted({s.name for s in studies if [t.name for t in studies].count(s.name) > 1})
    if twice:
        raise ConfigError(f"studies {twice} are named more than once (a study's folder is its name); give each once")
    for study in studies:
        study.spec(scale, overrides)
    out_dir = Path(out_dir)
    at_once = default_at_once(scale, len(studies)) if at_once is None else at_once
    carried, stranded = get_registry().portable_plugins()
    if at_once > 1 and stranded:  # a study's own process could not register them
        print(
            f"plugin(s) {', '.join(stranded)} are not importable modules, so no study's own process could register "
            "them: the studies run one after another in this process",
            file=sys.stderr,
        )
        at_once = 1
    started = time.perf_counter()
    failed: dict[str, str] = {}
    if at_once <= 1 or len(studies) == 1:
        results = [reproduce(study, out_dir / study.name, scale, overrides, plugins) for study in studies]
    else:
        carry = list(dict.fromkeys([*(plugins or []), *carried]))
        results = _side_by_side(studies, out_dir, scale, overrides, carry, at_once, failed)
    wall = time.perf_counter() - started
    done = _verdicts(out_dir)
    ran = f"This call ran {len(results)} of {len(studies)} studies, {at_once} at a time, in {duration(wall)} of wall time."
    page = "\n".join(
        [
            f"# Reproductions ({scale} scale)",
            "",
            ran,
            "",
            *studies_table_lines([r for r in done if r.scale == scale]),
            "",
            "## Claims",
            "",
            *claims_table_lines([r for r in done if r.scale == scale]),
            "",
        ]
    )
    atomic_write(out_dir / "reproductions.md", lambda tmp: tmp.write_text(page))
    if failed:
        heading = f"{len(failed)} of {len(studies)} studies failed (the others are in {out_dir / 'reproductions.md'}):"
        raise StudiesFailed("\n".join([heading, *failed.values()]))
    return results


def _verdicts(out_dir: Path) -> list[StudyResult]:
    """Every study's verdict in ``out_dir``; one this version cannot read (written by another) is
    left out of the page, with a line saying so."""
    found = []
    for path in sorted(out_dir.glob("*/verdict.json")):
        try:
            found.append(StudyResult.model_validate(read_json(path)))
        except ValidationError:
            print(
                f"left {path} out of reproductions.md: another version wrote it; run its study again", file=sys.stderr
            )
    return found


class StudiesFailed(ZooError):
    """Studies run side by side ended, and some of them failed."""


LOG_START = "== tzoo reproduce: "  # the line each start of a study writes first in its log


def _side_by_side(
    studies: list[Study],
    out_dir: Path,
    scale: Scale,
    overrides: dict[str, Any] | None,
    plugins: list[str],
    at_once: int,
    failed: dict[str, str],
) -> list[StudyResult]:
    """Run ``studies``, ``at_once`` at a time, each in a process of its own; returns the results
    of those that finished, and puts why each other failed in ``failed``. Ctrl-C is passed on,
    once, to each study (its comparison keeps what finished)."""
    context = get_context("spawn")
    waiting, running = list(studies), {}
    results: list[StudyResult] = []
    begun = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{duration(time.perf_counter() - begun)}] {message}", file=sys.stderr, flush=True)

    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                study = waiting.pop(0)
                (out_dir / study.name).mkdir(parents=True, exist_ok=True)
                log = out_dir / study.name / "log.txt"
                with open(log, "a") as stream:
                    stream.write(
                        f"{LOG_START}{study.name} at the {scale} scale, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                    )
                process = context.Process(
                    target=_reproduce_logged,
                    name=f"study {study.name}",
                    args=(study, out_dir / study.name, scale, overrides, plugins, str(log)),
                )
                process.start()
                running[process.sentinel] = (process, study, log)
                say(f"started {study.name} ({len(studies) - len(waiting)} of {len(studies)}); its log: {log}")
            for sentinel in connection.wait(list(running)):
                process, study, log = running.pop(sentinel)
                process.join()
                verdict = out_dir / study.name / "verdict.json"
                if process.exitcode == 0 and verdict.is_file():
                    result = StudyResult.model_validate(read_json(verdict))
                    results.append(result)
                    say(f"{study.name}: {result.verdict} ({duration(result.wall_seconds)})")
                else:
                    code = process.exitcode
                    ended = (
                        f"killed by {signal.Signals(-code).name}"
                        if code is not None and code < 0
                        else f"exit code {code}"
                    )
                    failed[study.name] = f"  {study.name} ({ended}): {_last_line(log)}; the log: {log}"
                    say(f"{study.name} failed ({ended}): {_last_line(log)}")
    except KeyboardInterrupt:
        for process, _, _ in running.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)  # each comparison keeps what finished and says so in its log
        for process, _, _ in running.values():
            process.join(60)
        failures = f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""
        raise ComparisonInterrupted(
            f"reproduction interrupted with {len(results)} of {len(studies)} studies finished (in {out_dir}){failures}; "
            "run the same command again to go on: finished runs are reused and the others resume from their checkpoints"
        ) from None
    finally:  # an error here, or a study that did not stop in time: none is left running
        for process, _, _ in running.values():
            if process.is_alive():
                process.terminate()
                process.join(10)
    order = [study.name for study in studies]
    return sorted(results, key=lambda r: order.index(r.name))


def _reproduce_logged(
    study: Study, out_dir: Path, scale: Scale, overrides: dict[str, Any] | None, plugins: list[str], log: str
) -> None:
    """A study in a process of its own, its output (progress and errors) written to ``log``. The
    process leaves the terminal's group, so that Ctrl-C reaches it once, from the caller."""
    os.setpgrp()
    with open(log, "a") as stream:
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    try:
        reproduce(study, out_dir, scale, overrides, plugins)
    except KeyboardInterrupt as exc:
        print(exc, file=sys.stderr)
        sys.exit(130)


def _last_line(log: Path) -> str:
    """The last line the study's latest start wrote to its log."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line for line in text.rpartition(LOG_START)[2].splitlines()[1:] if line.strip()]
    return lines[-1].strip() if lines else "it wrote nothing"
