"""Try the zoo as a careless or hostile user would, and count how each attempt ended.

    tzoo bench robustness [--only configs,inputs,...] [--json PATH] [--markdown PATH]

Every case is bad by construction (a wrong type, an impossible size, a corrupt file, a broken
plugin, a run interrupted or shared), so the one good ending is a clear refusal: an error that
names what was wrong, or, where the zoo can recover on its own, a clean recovery. The script
prints one table: for each category, the cases tried and how many ended each way.

Only the public API is used (``load_config``, ``build_model``, ``from_pretrained``,
``save_pretrained``, training, the decoders, and the CLI as ``python -m transformer_zoo``), so it
measures whichever version of the package is installed: run ``python -m benchmarks.robustness``
from a checkout's root, with that version installed (or first on ``PYTHONPATH``); the worker and
every command inherit it.

Cases whose sizes are chosen to be huge run in one long-lived worker process whose address space
is limited (``--memory-gb`` over its own footprint) and whose cases each have a time limit; a
worker that dies or stops answering is replaced and its case recorded as ``crashed`` or ``hang``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common import bench_parser
from .configs import GAN_BASE, TRAIN_BASE, configs, files, training
from .folders import checkpoints, pretrained
from .harness import GOOD, TITLES, WARMUP_VARIANTS, Context, Result, Sandbox
from .inputs import TOKEN_MODELS, inputs, run_input
from .processes import concurrency, plugins

CATEGORIES: dict[str, Callable[[Context], list[Result]]] = {
    "configs": configs,
    "files": files,
    "training": training,
    "inputs": inputs,
    "checkpoints": checkpoints,
    "pretrained": pretrained,
    "plugins": plugins,
    "concurrency": concurrency,
}


def controls_of_worker(ctx: Context) -> None:
    for variant in WARMUP_VARIANTS:
        answer = ctx.sandbox.run("build", ("mapping", {"variant": variant}), 30.0)
        ctx.control("configs", f"{variant} builds", answer["status"] == "returned", answer.get("message", ""))
    for name, data in (("a small run trains", TRAIN_BASE), ("a GAN run trains", GAN_BASE)):
        answer = ctx.sandbox.run("train", (data, str(ctx.root / "control" / name.replace(" ", "-"))), 120.0)
        ctx.control("training", name, answer["status"] == "returned", answer.get("message", ""))
    for variant, where in [
        *((v, "src") for v in TOKEN_MODELS),
        ("vit-tiny", "image"),
        ("image-transformer-tiny", "image"),
        ("sagan-classifier-tiny", "image"),
        ("sagan-gan", "labels"),
    ]:
        answer = ctx.sandbox.run(run_input, (variant, where, ""), 60.0)
        ok = answer["status"] == "returned" and answer["finite"]
        ctx.control("inputs", f"{variant} takes a valid input", ok, answer.get("message", ""))


def summarise(results: list[Result]) -> dict[str, dict[str, Any]]:
    table = {}
    for category in CATEGORIES:
        mine = [r for r in results if r.category == category]
        if mine:
            counts = Counter(r.outcome for r in mine)
            table[category] = {
                "title": TITLES[category],
                "cases": len(mine),
                "held": counts[GOOD[category]],
                "good": GOOD[category],
                "outcomes": dict(counts.most_common()),
            }
    return table


def markdown(table: dict[str, dict[str, Any]], results: list[Result], header: str) -> str:
    lines = [header, "", "| category | cases | held | how they ended |", "|---|---:|---:|---|"]
    for row in table.values():
        ended = " · ".join(f"{k} {v}" for k, v in row["outcomes"].items())
        lines.append(
            f"| {row['title']} | {row['cases']} | {row['held']} ({row['held'] / row['cases']:.0%}) | {ended} |"
        )
    lines += [
        "",
        (
            "Held: a clear refusal (the error names the field, file or plugin), or for runtime inputs a "
            "ValueError, or a clean recovery."
        ),
        "",
        "## Cases that did not hold",
        "",
    ]
    for category, row in table.items():
        failed = [r for r in results if r.category == category and r.outcome != row["good"]]
        if failed:
            lines.append(f"### {row['title']}\n")
            lines += [f"- {r.case}: **{r.outcome}**" + (f" ({_short(r.detail)})" if r.detail else "") for r in failed]
            lines.append("")
    return "\n".join(lines)


def _short(text: str) -> str:
    line = " ".join(text.split())
    return (line[:157] + "...") if len(line) > 160 else line


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--only", help=f"comma-separated categories of cases (default: all): {','.join(CATEGORIES)}")
    parser.add_argument("--json", type=Path, help="write every case and the table as JSON here")
    parser.add_argument("--markdown", type=Path, help="write the table and the cases that did not hold here")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample of bad model configs")
    parser.add_argument("--config-cases", type=int, default=420, help="bad model configs sampled")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="what a case may allocate in the worker, in GB")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    chosen = list(CATEGORIES) if not args.only else [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown:
        parser.error(f"unknown categories {unknown}; choose among {', '.join(CATEGORIES)}")

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    import transformer_zoo

    root = Path(tempfile.mkdtemp(prefix="tzoo-robustness-"))
    (root / "cwd").mkdir()
    (root / "cwd" / "corpus.txt").write_text("the cat sat on the mat\n" * 40)
    (root / "small.json").write_text(json.dumps(TRAIN_BASE))
    os.environ.update(
        {
            "TZOO_CACHE": str(root / "cache"),
            "HF_HOME": str(root / "hf"),
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
    )
    os.environ.pop("TZOO_PLUGINS", None)
    started = time.monotonic()
    sandbox = Sandbox(int(args.memory_gb * 2**30), root / "worker.log", root / "cwd")
    results: list[Result] = []
    console = Console()
    try:
        with Progress(console=console, transient=True) as progress:
            ctx = Context(root, sandbox, args.seed, args.config_cases, progress, [])
            if {"configs", "training", "inputs"} & set(chosen):
                controls_of_worker(ctx)
            for category in chosen:
                results += CATEGORIES[category](ctx)
    finally:
        sandbox.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - started
    header = (
        f"transformer_zoo {getattr(transformer_zoo, '__version__', '?')} from "
        f"{Path(transformer_zoo.__file__).parent}; model-config sample seed {args.seed}; {seconds:.0f} s"
    )
    table = summarise(results)
    shown = Table(title=header, title_justify="left")
    for column in ("category", "cases", "held", "how they ended"):
        shown.add_column(column, justify="right" if column in ("cases", "held") else "left")
    for row in table.values():
        shown.add_row(
            row["title"],
            str(row["cases"]),
            f"{row['held']} ({row['held'] / row['cases']:.0%})",
            " · ".join(f"{k} {v}" for k, v in row["outcomes"].items()),
        )
    console.print(shown)
    failed = [c for c in ctx.controls if not c[2]]
    for category, name, _, detail in failed:
        console.print(f"[red]control failed[/] ({category}) {name}: {detail}", highlight=False)
    document = {
        "header": header,
        "seconds": seconds,
        "table": table,
        "controls": [{"category": c, "name": n, "ok": ok, "detail": d} for c, n, ok, d in ctx.controls],
        "cases": [r.__dict__ for r in results],
    }
    if args.json:
        args.json.write_text(json.dumps(document, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text(markdown(table, results, header) + "\n")
    if failed:  # the harness, not the zoo, is at fault: its counts mean nothing
        sys.exit(1)
    return 0


if __name__ == "__main__":
    main()
