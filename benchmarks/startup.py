"""How long ``tzoo`` takes to start: ``--version``, ``--help``, ``list`` and ``schema``, and a
comparison's worker process up to its first run (:data:`WORKER`), each in a fresh Python
process, against a bare ``import torch`` in the same rounds.

Every command runs ``--repeats`` times, in turn with the reference (the order rotated each round,
so that all see the same machine load); the table gives median seconds, the ratio to ``import
torch``, and which of the heavy packages (torch, datasets, sacrebleu, matplotlib, tokenizers,
scipy, pandas) the command imported. The goal: ``--version`` and ``--help`` import none of them,
and ``list`` and ``schema`` take at most ``import torch`` plus one second.

    python -m benchmarks.startup [--repeats 7] [--json startup.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from .common import bench_parser

HEAVY = ("torch", "datasets", "sacrebleu", "matplotlib", "tokenizers", "scipy", "pandas")
WORKER = "import transformer_zoo.comparing.runs\nfrom transformer_zoo.registry import get_registry\nget_registry()"
"""What a comparison's worker process (a local worker, a Ray task) imports before it trains its first run."""
COMMANDS = {
    "import torch": None,
    "tzoo --version": ["--version"],
    "tzoo --help": ["--help"],
    "tzoo list": ["list"],
    "tzoo schema": ["schema"],
    "a worker": WORKER,
}

# Runs the command line in-process, then reports the heavy packages it imported on stderr's last line.
_PROBE = """
import json, sys
from transformer_zoo.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
sys.stderr.write(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def command_line(argv: list[str] | str | None) -> list[str]:
    """The process that runs ``tzoo ARGV`` (``import torch`` for None; Python code for a string),
    as the installed script does."""
    if argv is None:
        return [sys.executable, "-c", "import torch"]
    if isinstance(argv, str):
        return [sys.executable, "-c", argv]
    return [sys.executable, "-c", "import sys; from transformer_zoo.cli import main; sys.exit(main())", *argv]


def imported(argv: list[str] | str) -> list[str]:
    """The heavy packages that ``tzoo ARGV`` (or the Python code ``argv``) imports."""
    probe = (
        f"{argv}\nimport json, sys\nsys.stderr.write(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
        if isinstance(argv, str)
        else _PROBE.format(argv=argv, heavy=HEAVY)
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(done.stderr.strip().splitlines()[-1])


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command (the median is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this file")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    names = list(COMMANDS)
    for round_ in range(args.repeats + 1):  # round 0 warms the file cache and is not counted
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            subprocess.run(command_line(COMMANDS[name]), check=True, stdout=subprocess.DEVNULL)
            if round_:
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(times["import torch"])
    rows = []
    for name, argv_ in COMMANDS.items():
        median = statistics.median(times[name])
        rows.append(
            {
                "command": name,
                "seconds": round(median, 3),
                "vs import torch": round(median / reference, 2),
                "over import torch": round(median - reference, 3),
                "heavy imports": ["torch"] if argv_ is None else imported(argv_),
            }
        )
    print(f"{'command':<16} {'seconds':>8} {'x torch':>8} {'+ s':>7}  heavy imports")
    for row in rows:
        print(
            f"{row['command']:<16} {row['seconds']:>8.3f} {row['vs import torch']:>8.2f} "
            f"{row['over import torch']:>+7.3f}  {', '.join(row['heavy imports']) or '-'}"
        )
    if args.json:
        import platform

        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": {"platform": platform.platform(), "python": platform.python_version()},
                    "repeats": args.repeats,
                    "rows": rows,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
