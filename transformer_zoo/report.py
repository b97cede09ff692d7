"""The compare report: ``report.md`` (the tables a person reads first) and PNG plots."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from .compare import CompareResults, RunRecord  # noqa: E402
from .scaling import MODES, ScalingPoint  # noqa: E402
from .core.tasks import LOWER_IS_BETTER  # noqa: E402


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _by(records: list[RunRecord], key) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    return dict(groups)


def task_table(records: list[RunRecord]) -> str:
    """One row per variant (mean ± std over seeds); the best value of each column in bold."""
    splits = sorted({split for r in records for split in r.metrics})
    metric_names = sorted({name for r in records for values in r.metrics.values() for name in values})
    columns = [(f"{split} {name}", (lambda r, s=split, n=name: r.metrics.get(s, {}).get(n)), name not in LOWER_IS_BETTER)
               for split in splits for name in metric_names]
    if any(r.ponder_time for r in records):
        stacks = sorted({stack for r in records for stack in r.ponder_time})
        columns += [(f"{stack} ponder", lambda r, s=stack: r.ponder_time.get(s), None) for stack in stacks]
    columns += [
        ("parameters", lambda r: r.parameters, None),
        ("FLOPs/token", lambda r: r.flops_per_token, None),
        ("train tokens/s", lambda r: r.train_tokens_per_second, True),
        ("peak MB", lambda r: r.peak_memory_mb, False),
        ("wall s", lambda r: r.wall_seconds, False),
    ]
    rows = []
    for variant, runs in _by(records, lambda r: r.variant).items():
        cells = []
        for _, get, _ in columns:
            values = [get(r) for r in runs if get(r) is not None]
            cells.append(_mean_std(values) if values else None)
        rows.append((variant, len(runs), cells))
    best = []
    for i, (_, _, higher) in enumerate(columns):
        means = [cells[i][0] for _, _, cells in rows if cells[i] is not None]
        best.append(None if higher is None or len(rows) < 2 or not means else (max(means) if higher else min(means)))

    def fmt(i: int, cell) -> str:
        if cell is None:
            return "n/a"
        mean, std = cell
        text = f"{mean:.3f}" if abs(mean) < 10 else f"{mean:,.0f}"
        if std:
            text += f" ± {std:.3f}" if abs(mean) < 10 else f" ± {std:,.0f}"
        return f"**{text}**" if best[i] is not None and mean == best[i] else text

    header = "| variant | seeds | " + " | ".join(name for name, _, _ in columns) + " |"
    lines = [header, "|" + " --- |" * (len(columns) + 2)]
    for variant, seeds, cells in rows:
        lines.append(f"| {variant} | {seeds} | " + " | ".join(fmt(i, c) for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def plot_curves(records: list[RunRecord], task: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for record in records:
        points = [(p["step"], p["loss"]) for p in record.curve if "loss" in p]
        if points:
            ax.plot(*zip(*points), label=f"{record.variant} (seed {record.seed})")
    ax.set(title=f"{task}: training loss", xlabel="step", ylabel="loss", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_metric_vs_parameters(records: list[RunRecord], path: Path) -> None:
    tasks = sorted({r.task for r in records})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for record in (r for r in records if r.task == task):
            value = record.metrics["test"][record.metric]
            ax.scatter(record.parameters, value)
            ax.annotate(record.variant.split(" ")[0], (record.parameters, value), fontsize=7)
        ax.set(title=task, xlabel="parameters", ylabel=f"test {_metric(records, task)}", xscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _metric(records: list[RunRecord], task: str) -> str:
    return next(r.metric for r in records if r.task == task)


def plot_ponder(ponder: dict, tokens: dict[str, list[str]], path: Path) -> None:
    """One row per stack: the ponder time (steps) of each position of one example."""
    fig, axes = plt.subplots(len(ponder), 1, figsize=(max(5, 0.35 * max(len(t) for t in tokens.values())), 1.6 * len(ponder)),
                             squeeze=False)
    for ax, (stack, values) in zip(axes[:, 0], ponder.items()):
        values = values.float().cpu().numpy()
        image = ax.imshow(values[None, :], cmap="magma", aspect="auto", vmin=0)
        for i, value in enumerate(values):
            ax.text(i, 0, f"{value:.1f}", ha="center", va="center", fontsize=7, color="grey")
        ax.set_yticks([0], [stack])
        ax.set_xticks(range(len(tokens[stack])), tokens[stack], fontsize=7, rotation=90)
        fig.colorbar(image, ax=ax, label="steps")
    axes[0, 0].set_title("ponder time per position (one test example)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_throughput(records: list[RunRecord], path: Path) -> None:
    labels = [f"{r.variant.split(' ')[0]}\n{r.task}" for r in records]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(records)), 3.5))
    ax.bar(range(len(records)), [r.train_tokens_per_second for r in records])
    ax.set_xticks(range(len(records)), labels, fontsize=7)
    ax.set(title="training throughput", ylabel="tokens / s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MODE_NAMES = {"forward": "forward (inference)", "train": "forward + backward"}


def _model(point: ScalingPoint) -> str:
    return point.variant if point.attention == "as configured" else f"{point.variant} [{point.attention}]"


def scaling_tables(points: list[ScalingPoint]) -> str:
    """Time and peak memory by model and length, then each sparse model against its full-attention twins."""
    lengths = sorted({p.length for p in points})
    at = {(p.variant, p.attention, p.mode, p.length): p for p in points}
    models = list(dict.fromkeys((p.variant, p.attention) for p in points))
    names = {(p.variant, p.attention): _model(p) for p in points}
    head = "| model | pass | " + " | ".join(f"n = {n}" for n in lengths) + " |"
    rule = "|" + " --- |" * (len(lengths) + 2)
    lines = ["Time (ms) and peak memory (MiB) of one pass:", "", head, rule]
    for variant, attention in models:
        for mode in MODES:
            cells = [at.get((variant, attention, mode, n)) for n in lengths]
            text = [("failed" if c.error else f"{c.seconds * 1e3:,.1f} ms, {c.peak_mb:,.1f} MiB") if c else "n/a"
                    for c in cells]
            lines.append(f"| {names[variant, attention]} | {MODE_NAMES[mode]} | " + " | ".join(text) + " |")
    twins = [(v, a) for v, a in models if a != "as configured"]
    if twins:
        lines += ["", "Against full attention: the model as configured over the same model with a full attention "
                  "kind, time x and memory x (below 1: the sparse model is cheaper):", "", head, rule]
        for variant, attention in twins:
            for mode in MODES:
                cells = []
                for n in lengths:
                    mine, full = at.get((variant, "as configured", mode, n)), at.get((variant, attention, mode, n))
                    cells.append(f"{mine.seconds / full.seconds:.2f}x time, {mine.peak_mb / full.peak_mb:.2f}x memory"
                                 if mine and full and full.seconds and full.peak_mb and mine.seconds else "n/a")
                lines.append(f"| {variant} vs [{attention}] | {MODE_NAMES[mode]} | " + " | ".join(cells) + " |")
    failed = [p for p in points if p.error and p.mode == MODES[0]]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{_model(p)} at n = {p.length} ({p.error})" for p in failed) + "."]
    return "\n".join(lines)


def plot_scaling(points: list[ScalingPoint], path: Path) -> None:
    """Time and memory (rows) of each pass (columns) against length, log-log, a line per model."""
    fig, axes = plt.subplots(2, len(MODES), figsize=(5 * len(MODES), 7), squeeze=False)
    models = list(dict.fromkeys(_model(p) for p in points))
    for column, mode in enumerate(MODES):
        for name in models:
            mine = sorted((p for p in points if p.mode == mode and _model(p) == name and not p.error),
                          key=lambda p: p.length)
            style = "--" if "[" in name else "-"
            axes[0, column].plot([p.length for p in mine], [p.seconds * 1e3 for p in mine], style, marker="o", label=name)
            axes[1, column].plot([p.length for p in mine], [p.peak_mb for p in mine], style, marker="o", label=name)
        axes[0, column].set(title=MODE_NAMES[mode], ylabel="time per pass (ms)")
        axes[1, column].set(xlabel="sequence length", ylabel="peak tensor memory (MiB)")
        for ax in axes[:, column]:
            ax.set(xscale="log", yscale="log")
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(results: CompareResults, out_dir: Path) -> Path:
    """Write ``report.md`` and the plots; returns the report's path."""
    records = results.runs
    lines = [f"# Comparison: {results.spec.get('name', 'compare')}", ""]
    machine = ", ".join(f"{k} {v}" for k, v in results.machine.items())
    lines += [f"Machine: {machine}.", "", "Spec:", "", "```yaml", yaml.safe_dump(results.spec, sort_keys=False).rstrip(), "```", ""]
    lines += ["Every run had the same data, seed and budget. Values are means over seeds (± standard deviation); "
              "the best of each metric (lowest perplexity or Frechet distance, highest otherwise), throughput, memory and time is "
              "in bold. FLOPs per token are those of one training step (forward and backward) on one batch, "
              "counted by PyTorch's FlopCounterMode, per token read.", ""]
    for task, runs in _by(records, lambda r: r.task).items():
        lines += [f"## {task}", "", task_table(runs), ""]
        if task in results.baselines:
            scores = ", ".join(f"test {name} {value:.3f}" for name, value in results.baselines[task].items())
            lines += [f"{results.baseline_names.get(task, 'Baseline')}: {scores}.", ""]
        curve = out_dir / f"curves-{task}.png"
        plot_curves(runs, task, curve)
        lines += [f"![{task} learning curves]({curve.name})", ""]
        for record in runs:
            if record.samples_plot and record.seed == runs[0].seed:
                lines += [f"Samples of {record.variant} (seed {record.seed}), a row per class:", "",
                          f"![{record.variant} samples on {task}]({record.samples_plot})", ""]
            if record.ponder_plot and record.seed == runs[0].seed:
                lines += [f"Ponder time of {record.variant} (seed {record.seed}) on one test example:", "",
                          f"![{record.variant} ponder time on {task}]({record.ponder_plot})", ""]
    if results.scaling:
        task = results.spec["scaling"].get("task") or results.spec["tasks"][0]["kind"]
        plot_scaling(results.scaling, out_dir / "scaling.png")
        lines += [f"## Time and memory against length ({task} models)", "",
                  f"Each variant as configured for {task}, freshly initialised (cost does not depend on training), "
                  "on one batch of test sequences tiled to each length, with max_len raised where needed. "
                  "A variant whose self-attention is not full is also measured with each full kind in its place "
                  "(in brackets: `sdpa` runs PyTorch's fused kernels, `math` writes out the n x n weights). "
                  "Times are medians of repeated passes; memory is the peak of the tensors a pass creates "
                  "(weights excluded), counted exactly on CPU, by the allocator on CUDA.", "",
                  scaling_tables(results.scaling), "", "![time and memory against length](scaling.png)", ""]
    if results.skipped:
        lines += ["## Not run", ""] + [f"- {s.variant} on {s.task}: {s.reason}" for s in results.skipped] + [""]
    plot_metric_vs_parameters(records, out_dir / "metric-vs-parameters.png")
    plot_throughput(records, out_dir / "throughput.png")
    lines += ["## Plots", "", "![metric against parameters](metric-vs-parameters.png)", "",
              "![throughput](throughput.png)", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
