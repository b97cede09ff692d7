"""The ``tzoo`` command line. Every command that prints data also takes ``--json``.

torch, the registry and the commands' modules are imported by the command that needs them, so
that ``tzoo --help`` and ``tzoo --version`` start in a fraction of ``import torch``'s time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from . import __version__
from .core.errors import ZooError

# "variant" and core.options.CATEGORIES, written out so that the parser needs no torch (a test keeps them equal)
KINDS = ("variant", "attention", "positional", "norm", "ffn", "stack", "head", "task")


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _list(args: argparse.Namespace) -> Any:
    import fnmatch

    from .registry import get_registry

    registry = get_registry()
    rows = []
    if args.kind == "variant":
        for name in registry.variants(args.pattern):
            variant = registry.variant(name)
            rows.append(
                {
                    "name": name,
                    "family": variant.config.family,
                    "plugin": registry.provider("variant", name),
                    "description": variant.description,
                }
            )
    else:
        for name, options in registry.components(args.kind).items():
            if fnmatch.fnmatchcase(name, args.pattern):
                rows.append(
                    {
                        "name": name,
                        "kind": args.kind,
                        "plugin": registry.provider(args.kind, name),
                        "description": _first_line(options.__doc__),
                    }
                )
    return rows


def _show(args: argparse.Namespace) -> Any:
    import torch

    from . import api

    config = api.load_config(args.name, args.set)  # a variant name, or a YAML or JSON file
    with torch.device("meta"):  # count parameters without allocating them
        model = config.build()
    shown = {
        "config": config.model_dump(mode="json"),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if args.modules:
        from .module_tree import module_tree

        shown["modules"] = module_tree(model, config.variant)
    return shown


def _schema(args: argparse.Namespace) -> Any:
    from .registry import get_registry

    registry = get_registry()
    families: dict[type, list[str]] = {}
    for name in registry.variants():
        families.setdefault(registry.variant(name).config, []).append(name)
    branches = []
    for config, names in families.items():
        from .core.weights import FORMAT

        schema = config.model_json_schema()
        schema["properties"]["variant"] = {**schema["properties"]["variant"], "enum": names}
        schema["properties"]["format"] = {  # what save_pretrained adds to config.json
            "type": "integer",
            "minimum": 1,
            "maximum": FORMAT,
            "description": "the layout's version, written by save_pretrained; leave it out in a config of your own",
        }
        branches.append(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "transformer-zoo model config",
        "description": "A model config: 'variant' names a registered variant; other keys override its values.",
        "oneOf": branches,
    }


def _train(args: argparse.Namespace) -> Any:
    from .training import load_train_config, train
    from .training.distributed import job

    config = load_train_config(args.config, args.set)
    run_dir = args.out or Path("runs") / Path(args.config).stem
    with job():  # one process, or one of torchrun's
        summary = train(config, run_dir, resume=not args.restart, progress=not args.json)
    return {"run_dir": str(run_dir), **summary}


def _evaluate(args: argparse.Namespace) -> Any:
    from .training import evaluate_run

    return evaluate_run(args.run_dir)


def _attention(args: argparse.Namespace) -> Any:
    from .comparing.attention_maps import attention_maps, parse_query

    queries = [parse_query(q) for q in args.query]
    return [
        str(p)
        for p in attention_maps(args.run_dir, text=args.input, example=args.example, out=args.out, queries=queries)
    ]


def _tune(text: str) -> Any:
    """``--tune``: off, or a number of trials as a :class:`~transformer_zoo.comparing.tuning.TuneSpec`
    of that many (whose other settings the spec's own ``tune:`` section replaces, where it has one)."""
    if text == "off":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of trials (1 or more) nor off")
    from pydantic import ValidationError

    from .comparing.tuning import TuneSpec

    try:
        return TuneSpec(trials=value)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} trials: {exc.errors()[0]['msg']}") from None


def _until_decided_options(p: argparse.ArgumentParser, item: str) -> None:
    """``--until-decided`` and ``--budget``, of compare and reproduce."""
    p.add_argument(
        "--until-decided",
        action="store_true",
        help=f"add seeds in rounds until every {item} is decided or the budget is spent, each round judged by a "
        "sequential procedure that keeps the error rate at alpha (the spec's until_decided: settings, or 2 seeds a "
        "round up to 10)",
    )
    p.add_argument(
        "--budget",
        type=_budget,
        metavar="DURATION",
        help="wall time for all the rounds of --until-decided (which it implies): seconds, or 20m, 1.5h; default: "
        "the spec's, else 20m",
    )


def _budget(text: str) -> float:
    from .comparing.spec import budget_seconds

    try:
        return budget_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _until_decided_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """What --until-decided and --budget change of a spec's until_decided settings (None: neither
    given; an empty mapping: the spec's settings, or the defaults)."""
    if not args.until_decided and args.budget is None:
        return None
    return {} if args.budget is None else {"budget": args.budget}


def _compare(args: argparse.Namespace) -> Any:
    from .comparing import compare, load_spec
    from .training.distributed import job, world

    spec = load_spec(args.spec, seeds=args.seeds, suite=args.suite)
    given = {
        key: value
        for key, value in (
            ("executor", args.executor),
            ("address", args.address),
            ("cache", args.cache and str(args.cache)),
        )
        if value is not None
    }
    if args.address is not None:
        given.setdefault("executor", "ray")
    if given:
        spec = load_spec({**spec.model_dump(mode="json"), **given})
    if args.tune == "off":
        spec = spec.model_copy(update={"tune": None})
    elif args.tune is not None:  # the spec's own search, if it has one, with the trials asked for
        tune = args.tune if spec.tune is None else spec.tune.model_copy(update={"trials": args.tune.trials})
        spec = spec.model_copy(update={"tune": tune})
    out = args.out or Path("reports") / spec.name
    until = _until_decided_settings(args)
    if until is not None or spec.until_decided is not None:
        from .comparing.rounds import compare_until_decided

        settings = {**(spec.until_decided.model_dump() if spec.until_decided else {}), **(until or {})}
        spec = load_spec({**spec.model_dump(mode="json"), "until_decided": settings})
        results, _ = compare_until_decided(spec, out)
        return {"report": str(out / "report.md"), **results.model_dump(mode="json")}
    with job():  # one process, or one of torchrun's
        results = compare(spec, out, rerun=args.rerun)
        if results is None:  # another process of a torchrun job: process 0 reports
            return {"rank": world().rank}
    return {"report": str(out / "report.md"), **results.model_dump(mode="json")}


def _reproduce(args: argparse.Namespace) -> Any:
    from .comparing.studies.running import reproduce_all
    from .comparing.studies.spec import available_studies, study_rows
    from .comparing.studies.verdicts import as_json

    overrides = {key: value for key, value in (("seeds", args.seeds), ("steps", args.steps)) if value is not None}
    until = _until_decided_settings(args)
    if until is not None:
        overrides["until_decided"] = until
    if not args.names and args.scale is None and args.out is None and args.at_once is None and not overrides:
        return study_rows()
    names = args.names or list(available_studies())  # a scale, a folder or a budget given: every study
    out = args.out or Path("reports") / "reproduce"
    results = reproduce_all(
        names, out, scale=args.scale or "cpu", overrides=overrides, plugins=args.plugin, at_once=args.at_once
    )
    return {"report": str(out / "reproductions.md"), "studies": as_json(results)}


def _bench(args: argparse.Namespace) -> Any:
    benchmarks = _benchmarks()
    if args.name is None:
        return [
            {"benchmark": name, "measures": bench.measures, "takes": bench.takes}
            for name, bench in benchmarks.BENCHMARKS.items()
        ]
    benchmarks.run(args.name, args.args)
    return None


def _benchmarks() -> Any:
    """The ``benchmarks`` package of this checkout: the folder beside this package's source (an
    editable install), loaded from there by its path, never from the working folder or the import
    path, so a ``benchmarks/`` folder elsewhere is never imported. A wheel does not carry it."""
    import importlib.util

    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    init = folder / "__init__.py"
    if not init.is_file():
        raise ZooError(
            "the benchmarks are not part of the installed package; they live in the benchmarks/ folder of "
            "a checkout of transformer-zoo: install it with pip install -e . (tzoo bench then finds them from any "
            "folder), or run python -m benchmarks NAME in its root"
        )
    loaded = sys.modules.get("benchmarks")
    if loaded is not None and Path(getattr(loaded, "__file__", None) or "").resolve() == init:
        return loaded
    for name in [name for name in sys.modules if name == "benchmarks" or name.startswith("benchmarks.")]:
        del sys.modules[name]  # another folder's, which this one replaces with its submodules
    spec = importlib.util.spec_from_file_location("benchmarks", init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["benchmarks"]
        raise
    return module


def _plain(text: str) -> str:
    """Docstring markup as plain text: ``code`` and :role:`~a.b.name` become code and name."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _print_rows(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    """Rows as a table whose last column wraps; names and other columns are never cut. Piped (not a
    terminal): plain aligned rows, one line each. Too narrow for the table: each row's other columns
    on one line and its last column wrapped below it."""
    if not rows:
        console.print(f"no {title} match")
        return
    columns = list(rows[0])
    cells = [[_plain(str(value)) for value in row.values()] for row in rows]
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(columns)]
    if not console.is_terminal:
        for row in [columns, *cells]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        return
    if console.width - sum(widths[:-1]) - 2 * (len(columns) - 1) >= 40:  # room for a readable last column
        table = Table(title=title, title_justify="left", box=None, padding=(0, 2, 0, 0))
        for i, column in enumerate(columns):
            last = i == len(columns) - 1
            table.add_column(column, no_wrap=not last, min_width=None if last else widths[i], overflow="fold")
        for row in cells:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
        return
    console.print(Text(title, style="italic"))
    for row in cells:
        console.print(Text(row[0], style="bold") + Text("  " + "  ".join(row[1:-1]), style="dim"))
        console.print(Padding(Text(row[-1]), (0, 0, 0, 4), expand=False))


def _print_tree(console: Console, root: dict[str, Any]) -> None:
    """A :func:`module_tree` as one line per module: the tree of names, then kind, class and file in
    aligned columns, and what is repeated, shared or tied."""
    rows: list[tuple[str, str, str, str, str]] = []

    def walk(entry: dict[str, Any], lead: str, branch: str) -> None:
        notes = []
        if "count" in entry:
            notes.append(f"x{entry['count']}")
        if "same_as" in entry:
            notes.append(f"the same module as {entry['same_as']}")
        notes += [f"{name} tied to {where}" for name, where in entry.get("tied", {}).items()]
        rows.append((lead + branch + entry["name"], entry["kind"], entry["class"], entry["file"], ", ".join(notes)))
        below = lead + ("" if not branch else "   " if branch == "└─ " else "│  ")
        kids = entry.get("children", [])
        for i, child in enumerate(kids):
            walk(child, below, "└─ " if i == len(kids) - 1 else "├─ ")

    walk(root, "", "")
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for tree, kind, cls, file, note in rows:
        line = Text(tree.ljust(widths[0]) + "  ")
        line.append(kind.ljust(widths[1]), style="cyan")
        line.append("  " + cls.ljust(widths[2]) + "  ")
        line.append(file, style="green")
        if note:
            line.append(f"  ({note})", style="dim")
        console.print(line, soft_wrap=True, highlight=False)


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; give a whole number, 1 or more")
    return value


def _seeds(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item; give whole numbers separated by single commas, such as 0,1,2"
        )
    bad = [item for item in items if not item.lstrip("-").isdigit()]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} in {text!r} is not a whole number; give seeds such as 0,1,2")
    seeds = [int(item) for item in items]
    negative = [seed for seed in seeds if seed < 0]
    if negative:
        raise argparse.ArgumentTypeError(
            f"{negative[0]} in {text!r} is negative; a seed is a whole number of 0 or more"
        )
    if len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice; give each seed once")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tzoo", description="A zoo of Transformer variants.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    plugin_help = (
        "also register the plugin in this importable module (repeatable; as does the TZOO_PLUGINS "
        "variable, comma-separated); compare's workers register it too"
    )
    # before the command (tzoo --plugin M list) or after it (tzoo list --plugin M): both are kept, in that order
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE", dest="plugins_first", help=plugin_help
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=plugin_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **options: Any) -> argparse.ArgumentParser:  # every command takes --plugin
        return sub.add_parser(name, parents=[common], **options)

    p = command("list", help="registered variants or components")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style pattern, e.g. 'transformer-*'")
    p.add_argument("--kind", choices=KINDS, default="variant", help="what to list (default: variant)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_list)

    p = command("show", help="a variant's resolved config and parameter count, or its module tree")
    p.add_argument("name", help="a variant name or a config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field (repeatable)")
    p.add_argument(
        "--modules",
        action="store_true",
        help="print the built model's module tree instead of its config: each module's kind, class and the "
        "file defining it, to read the forward pass from (docs: Concepts, Anatomy of a forward pass)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_show)

    p = command("train", help="train a model on a task from a config file")
    p.add_argument("config", help="a YAML or JSON training config (model, task, steps, ...)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field (repeatable)")
    p.add_argument("--out", type=Path, help="run folder (default: runs/<config name>)")
    p.add_argument(
        "--restart",
        action="store_true",
        help="start over from step 0: the run folder's checkpoints are removed and train.json rewritten",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=_train)

    p = command("evaluate", help="score a trained run on its task's test splits")
    p.add_argument("run_dir", type=Path, help="a run folder written by tzoo train")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_evaluate)

    p = command(
        "attention", help="attention maps of a trained run on one example: grids of heads, or overlays on an image"
    )
    p.add_argument("run_dir", type=Path, help="a run folder written by tzoo train")
    p.add_argument("--input", help="the example as text, in the task's notation (e.g. '3 1 4' for reverse)")
    p.add_argument("--example", metavar="SPLIT:INDEX", help="an example of the task's data instead, e.g. test:0")
    p.add_argument("--out", type=Path, help="folder for the PNGs (default: RUN_DIR/attention)")
    p.add_argument(
        "--query",
        action="append",
        default=[],
        metavar="ROW,COL",
        help="image models: a query pixel whose attention to draw over the image (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the written paths as JSON")
    p.set_defaults(run=_attention)

    p = command("compare", help="train variants x tasks x seeds on one budget and write a report")
    p.add_argument("spec", nargs="?", help="a YAML or JSON spec (default: the built-in comparison)")
    p.add_argument("--out", type=Path, help="report folder (default: reports/<spec name>)")
    p.add_argument("--seeds", type=_seeds, metavar="S,S,...", help="run these seeds instead of the spec's, e.g. 0,1,2")
    p.add_argument(
        "--suite",
        metavar="NAME",
        help="run a suite's tasks (mqar, mad, chomsky-hierarchy, or a suite's YAML file) in place of the spec's, on "
        "its variants and budget, and report the suite's aggregate; with no spec, the suite's own variants",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        help="where runs train: local worker processes, one per device (default), or Ray tasks (the [ray] "
        "extra); overrides the spec's executor",
    )
    p.add_argument(
        "--address",
        metavar="ADDRESS",
        help="join this Ray cluster (auto, or ray://HOST:PORT; implies --executor ray) instead of starting "
        "Ray on this machine",
    )
    p.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="the run cache, a folder of finished runs that specs share (default: the report's runs/)",
    )
    p.add_argument("--rerun", action="store_true", help="train every run again, ignoring finished runs in the cache")
    p.add_argument(
        "--tune",
        type=_tune,
        metavar="TRIALS|off",
        help="tune every variant with this many trials before comparing (the spec's tune: section, or the "
        "learning rate on a log scale; the [tune] extra), or off: compare at the spec's own settings",
    )
    _until_decided_options(p, "test against the reference")
    p.add_argument("--json", action="store_true", help="print results.json's contents")
    p.set_defaults(run=_compare)

    p = command(
        "reproduce",
        help="run studies of the papers' claims and judge each (no name: list them)",
        description="Run studies: each is a comparison over seeds and the claims it tests, judged holds, "
        "does not hold or inconclusive from intervals over seeds. NAME is a built-in study or a "
        "study's YAML file.",
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="studies to run (default: list the built-in ones, or run them all when --scale, --out, "
        "--at-once, --seeds or --steps is given)",
    )
    p.add_argument(
        "--out", type=Path, help="report folder (default: reports/reproduce); each study in a folder of its own"
    )
    p.add_argument(
        "--scale",
        choices=("cpu", "gpu", "paper"),
        help="cpu: each study in about ten minutes on 2 cores (default); gpu: every study together in about "
        "eight minutes on one H100/H200; paper: the papers' own settings, hours on one GPU",
    )
    p.add_argument(
        "--at-once",
        type=_count,
        metavar="N",
        help="studies run at the same time, each in a process of its own with its log in its folder "
        "(default: all of them at the gpu scale on a machine with CUDA, else 1)",
    )
    p.add_argument("--seeds", type=_seeds, metavar="S,S,...", help="run these seeds instead of the study's")
    p.add_argument("--steps", type=int, metavar="N", help="train every run this many steps instead (a quick look)")
    _until_decided_options(p, "claim")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.set_defaults(run=_reproduce)

    p = command(
        "bench",
        help="run a benchmark against its reference (no name: list them)",
        description="Run a benchmark: it prints a table, and writes JSON with --json PATH. "
        "Arguments after the name go to the benchmark (tzoo bench NAME --help).",
    )
    p.add_argument("name", nargs="?", help="the benchmark (default: list them)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options")
    p.add_argument("--json", action="store_true", help="list as JSON")
    p.set_defaults(run=_bench)

    p = command("schema", help="the JSON Schema of model configs, plugins' kinds included")
    p.add_argument("--json", action="store_true", help="print JSON (the default; kept for uniformity)")
    p.set_defaults(run=_schema)
    return parser


def _search_current_folder() -> None:
    """Let ``--plugin`` and ``$TZOO_PLUGINS`` name a module file (or package folder) in the current
    folder, as ``python -m transformer_zoo`` does: a console script, unlike ``python -m``, does not
    put the current folder on ``sys.path``. It goes last, so a file there never shadows an installed
    module; spawned workers inherit it with the rest of ``sys.path``."""
    here = os.path.abspath(os.getcwd())
    if here not in {os.path.abspath(entry or os.curdir) for entry in sys.path}:
        sys.path.append(here)


def _warn_load_errors(err: Console) -> None:
    from .registry import get_registry

    registry = get_registry()
    for name, message in registry.load_errors.items():
        err.print(f"[yellow]warning:[/] plugin {name!r} failed to load: {message}", highlight=False, soft_wrap=True)
    for name, messages in registry.load_warnings.items():
        for message in messages:
            err.print(f"[yellow]warning:[/] plugin {name!r}: {message}", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _one_line_warnings(err: Console) -> Iterator[None]:
    """The zoo's own warnings (a checkpoint passed over, ...) as one ``warning:`` line each."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category.__module__.split(".")[0] == "transformer_zoo":
            err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command. Exit status: 0; 2 for an error the user can fix (one line on stderr); 130
    for Ctrl-C (one line: where it stopped, what is kept and how to go on)."""
    try:
        return _main(argv)
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    except KeyboardInterrupt as exc:  # training's own says at which step it stopped and what it saved
        Console(stderr=True).print(str(exc) or "interrupted", highlight=False, markup=False, soft_wrap=True)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)  # --help and --version exit here, before torch is imported
    from .registry import PluginWarning, get_registry
    from .registry.manager import PLUGINS_VARIABLE

    warnings.filterwarnings("ignore", category=PluginWarning)  # printed below as one line each, with the errors
    console = Console()
    err = Console(stderr=True)
    try:
        args.plugin = [*args.plugins_first, *args.plugin]
        if args.plugin or os.environ.get(PLUGINS_VARIABLE):
            _search_current_folder()
        for module in dict.fromkeys(args.plugin):  # a module named twice is registered once
            get_registry().register_module(module)
        with _one_line_warnings(err):
            result = args.run(args)
    except (ZooError, ValueError, FileNotFoundError) as exc:
        _warn_load_errors(err)  # a plugin that failed to load may be why a name is unknown
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
        if getattr(args, "json", False):  # the error, and what its one line leaves out, for a program
            print(json.dumps({"error": str(exc), **(getattr(exc, "details", None) or {})}, indent=2))
        return 2
    _warn_load_errors(err)
    if isinstance(result, dict) and result.get("rank", 0) != 0:
        return 0  # one of torchrun's other processes: process 0 reports
    if args.command == "bench":
        if result is not None:
            print(json.dumps(result, indent=2)) if args.json else _print_rows(console, result, "benchmarks")
        return 0
    if args.command == "schema" or args.json:
        print(json.dumps(result, indent=2))
    elif args.command == "list":
        _print_rows(console, result, f"{args.kind}s" if args.kind != "variant" else "variants")
    elif args.command in ("train", "evaluate"):
        metrics = result["metrics"] if args.command == "train" else result
        rows = [{"split": split, **{k: f"{v:.4f}" for k, v in values.items()}} for split, values in metrics.items()]
        _print_rows(
            console,
            rows,
            f"{args.command}: {result.get('run_dir', args.run_dir if args.command == 'evaluate' else '')}",
        )
    elif args.command == "compare":
        console.print(f"report: {result['report']}")
    elif args.command == "reproduce":
        if isinstance(result, list):
            _print_rows(console, result, "studies")
        else:
            for study in result["studies"]:
                console.print(f"{study['name']}: [bold]{study['verdict']}[/] ({study['title']})", highlight=False)
            console.print(f"report: {result['report']}")
    elif args.command == "attention":
        console.print("\n".join(result), highlight=False)
    elif args.command == "show" and args.modules:
        _print_tree(console, result["modules"])
        print(f"# parameters: {result['parameters']:,}")
    elif args.command == "show":
        print(yaml.safe_dump(result["config"], sort_keys=False).rstrip())
        print(f"# parameters: {result['parameters']:,}")
    if args.command == "compare" and result.get("failed"):
        err.print(
            f"[bold red]error:[/] {len(result['failed'])} run(s) failed (the report lists them and their errors; "
            "the others are summarized without them); fix the cause and run the same command again to train "
            "only those",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
        return 1
    return 0
