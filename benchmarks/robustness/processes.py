"""Broken plugins, and runs that share a folder, are interrupted or are killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .configs import TRAIN_BASE
from .harness import Context, Result, cli

# ---- 6. plugins -------------------------------------------------------------------------------------
CLASH = """from typing import Literal
from transformer_zoo import hookimpl
from transformer_zoo.core.options import NormOptions


class Clash(NormOptions):
    kind: Literal["layernorm"] = "layernorm"


class Extra(NormOptions):
    kind: Literal["rb-extra-norm"] = "rb-extra-norm"


@hookimpl
def tzoo_components():
    return [Clash, Extra]
"""
PLUGINS: list[tuple[str, str | None, list[str]]] = [  # (case, module source or None for no module, names to report)
    ("sys.exit() at import", "import sys\nsys.exit(3)\n", []),
    ("raises at import", "raise RuntimeError('this plugin is broken')\n", []),
    ("tzoo_* function without @hookimpl", "def tzoo_variants():\n    return []\n", ["tzoo_variants"]),
    (
        "misspelt hook",
        "from transformer_zoo import hookimpl\n\n\n@hookimpl\ndef tzoo_variantz():\n    return []\n",
        ["tzoo_variantz"],
    ),
    ("clashes with a built-in name", CLASH, ["layernorm"]),
    (
        "offers a string as a component",
        "from transformer_zoo import hookimpl\n\n\n@hookimpl\ndef tzoo_components():\n    return ['norm']\n",
        [],
    ),
    ("module that does not exist", None, []),
]
PYTHON_API = (
    "import transformer_zoo as tz\ntz.list_variants()\nerrors = getattr(tz, 'plugin_errors', None)\n"
    "print(errors() if errors else '')\n"
)


def plugins(ctx: Context) -> list[Result]:
    folder = ctx.root / "plugin-modules"
    folder.mkdir()

    def env(module: str) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "TZOO_PLUGINS": module}

    def listed(proc: subprocess.CompletedProcess | None) -> list[str]:
        try:
            return [row["name"] for row in json.loads(proc.stdout)]
        except (AttributeError, ValueError, TypeError, KeyError):
            return []

    good = "tzoo_rb_good"
    (folder / f"{good}.py").write_text(CLASH.replace('"layernorm"', '"rb-good-norm"'))
    proc = cli(["list", "--kind", "norm", "--json"], ctx.root, 120, env(good))
    ctx.control(
        "plugins", "a good plugin is loaded", "rb-good-norm" in listed(proc), "" if proc is None else proc.stderr
    )
    results = []
    for i, (name, source, names) in enumerate(ctx.track(PLUGINS, "plugins")):
        module = f"tzoo_rb_plugin{i}"
        if source is not None:
            (folder / f"{module}.py").write_text(source)
        proc = cli(["list", "--kind", "norm", "--json"], ctx.root, 120, env(module))
        err = "" if proc is None else proc.stderr
        works = proc is not None and proc.returncode == 0 and "layernorm" in listed(proc) and "Traceback" not in err
        reported = module in err and all(n in err for n in names)
        if "clash" in name:  # and says what became of its other name, or keeps it
            reported = reported and ("rb-extra-norm" in err or "rb-extra-norm" in listed(proc))
        detail = "timed out" if proc is None else f"exit {proc.returncode}; stderr: {err.strip()[-300:] or '(empty)'}"
        results.append(Result("plugins", name, "clean" if works and reported else "broken", detail))
    (folder / "tzoo_rb_api.py").write_text("raise RuntimeError('this plugin is broken')\n")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PYTHON_API],
            cwd=ctx.root,
            env=env("tzoo_rb_api"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen = proc.returncode == 0 and "tzoo_rb_api" in proc.stdout + proc.stderr
        detail = f"exit {proc.returncode}; {(proc.stdout + proc.stderr).strip()[-300:] or '(nothing reported)'}"
    except subprocess.TimeoutExpired:
        seen, detail = False, "timed out"
    results.append(Result("plugins", "load error seen from the Python API", "clean" if seen else "broken", detail))
    return results


# ---- 7. concurrency and interruption ------------------------------------------------------------------
def _train_cmd(config: Path, out: Path, *sets: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "transformer_zoo",
        "train",
        str(config),
        "--out",
        str(out),
        *[x for s in sets for x in ("--set", s)],
        "--json",
    ]


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int | None, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.kill()
        return None, proc.communicate()[1]


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def _two_at_once(config: Path, out: Path) -> tuple[str, str]:
    procs = [
        subprocess.Popen(
            _train_cmd(config, out, "steps=60", "checkpoint_every=5"),
            cwd=config.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    ended = [_finish(p, 300) for p in procs]
    codes = sorted(code if code is not None else -1 for code, _ in ended)
    if any("Traceback" in err for _, err in ended):
        return "traceback", next(err for _, err in ended if "Traceback" in err).strip().splitlines()[-1]
    if codes == [0, 2]:
        return "clean", next(err for code, err in ended if code == 2).strip().splitlines()[-1]
    return ("both ran" if codes == [0, 0] else "other"), f"exit codes {codes}"


def _interrupt(config: Path, out: Path) -> tuple[str, str]:
    proc = subprocess.Popen(
        _train_cmd(config, out, "steps=1000000"),
        cwd=config.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(out / "train.json", proc, 120)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    code, err = _finish(proc, 120)
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in err:
        return "traceback", lines[-1] if lines else ""
    if code == 130 and 1 <= len(lines) <= 3:
        return "clean", " / ".join(lines)
    return "other", f"exit {code}, {len(lines)} lines on stderr"


def _kill_and_resume(config: Path, out: Path, reference: dict, delay: float) -> tuple[str, str]:
    import safetensors.torch
    import torch

    cmd = _train_cmd(config, out, "steps=40", "checkpoint_every=1")
    proc = subprocess.Popen(cmd, cwd=config.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(out / "checkpoint" / "state.json", proc, 120)
    time.sleep(delay)
    proc.kill()
    proc.wait()
    resumed = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True, timeout=300)
    if "Traceback" in resumed.stderr:
        return "traceback", resumed.stderr.strip().splitlines()[-1]
    if resumed.returncode != 0:
        return "other", f"resume exit {resumed.returncode}"
    weights = safetensors.torch.load_file(str(out / "model" / "model.safetensors"))
    same = weights.keys() == reference.keys() and all(torch.equal(weights[k], reference[k]) for k in weights)
    return ("clean", "bit-identical to a run never stopped") if same else ("differs", "weights differ from a solo run")


def concurrency(ctx: Context) -> list[Result]:
    import safetensors.torch

    config = ctx.root / "concurrency.json"
    config.write_text(json.dumps({**TRAIN_BASE, "batch_size": 8}))
    solo = subprocess.run(
        _train_cmd(config, ctx.root / "solo", "steps=40", "checkpoint_every=1"),
        cwd=ctx.root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ok = solo.returncode == 0
    ctx.control("concurrency", "a run never stopped", ok, solo.stderr[-300:])
    reference = safetensors.torch.load_file(str(ctx.root / "solo" / "model" / "model.safetensors")) if ok else {}
    trials: list[tuple[str, Callable[[Path], tuple[str, str]]]] = [
        *[(f"two tzoo train on one --out, trial {i + 1}", lambda out: _two_at_once(config, out)) for i in range(2)],
        *[(f"Ctrl-C during tzoo train, trial {i + 1}", lambda out: _interrupt(config, out)) for i in range(2)],
        *[
            (
                f"kill -9 after {d:g} s and resume, trial {i + 1}",
                lambda out, d=d: _kill_and_resume(config, out, reference, d),
            )
            for i, d in enumerate((0.0, 0.7))
            if ok
        ],
    ]
    return [
        Result("concurrency", name, *trial(ctx.root / f"concurrent-{i}"))
        for i, (name, trial) in enumerate(ctx.track(trials, "concurrency"))
    ]
