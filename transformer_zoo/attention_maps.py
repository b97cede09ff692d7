"""Attention maps of a trained model: one PNG per stack and layer, a grid of its heads.

Rows of a grid are the layer's attention blocks (self-attention; cross-attention in a decoder),
columns are heads; each cell shows, for every query token (rows of the cell), how much weight
it gives each key token (columns). For a seq2seq task the model first writes its own output,
so the decoder's maps show where it looked while writing it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .train import load_run  # noqa: E402

MAX_LABELLED = 48  # longer sequences get no tick labels: they would overlap


def example_row(task: Any, text: str | None, example: str | None) -> dict[str, Any]:
    """The example to look at: typed ``text``, or ``example`` as ``SPLIT:INDEX`` of the task's data."""
    if (text is None) == (example is None):
        raise ValueError("give exactly one of --input TEXT and --example SPLIT:INDEX (such as test:0)")
    if text is not None:
        return task.parse_input(text)
    split, _, index = example.partition(":")
    if not index.lstrip("-").isdigit():
        raise ValueError(f"--example {example!r}: expected SPLIT:INDEX such as test:0")
    data = task.dataset(split)
    if not -len(data) <= int(index) < len(data):
        raise ValueError(f"--example {example!r}: split {split!r} has {len(data)} examples (0 to {len(data) - 1})")
    return data[int(index)]


def _plot_layer(blocks: dict[str, torch.Tensor], labels: dict[str, tuple[list[str], list[str]]], title: str,
                path: Path) -> None:
    heads = next(iter(blocks.values())).size(1)
    fig, axes = plt.subplots(len(blocks), heads, figsize=(2.6 * heads, 2.6 * len(blocks)), squeeze=False)
    for row, (name, weights) in enumerate(blocks.items()):
        queries, keys = labels.get(name, labels["self"])
        for head in range(heads):
            ax = axes[row, head]
            ax.imshow(weights[0, head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_title(f"{name}, head {head + 1}", fontsize=8)
            labelled = len(keys) <= MAX_LABELLED and len(queries) <= MAX_LABELLED
            ax.set_xticks(range(len(keys)) if labelled else [])
            ax.set_yticks(range(len(queries)) if labelled else [])
            if labelled:
                ax.set_xticklabels(keys, rotation=90, fontsize=6)
                ax.set_yticklabels(queries, fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def attention_maps(run_dir: str | os.PathLike, *, text: str | None = None, example: str | None = None,
                   out: str | os.PathLike | None = None) -> list[Path]:
    """Draw the attention of a finished run's model on one example; returns the PNG paths.

    Args:
        run_dir: a run folder written by ``tzoo train``.
        text: typed input, in the task's own notation (``tzoo list --kind task`` describes it).
        example: ``SPLIT:INDEX`` of the task's data instead of ``text``.
        out: the folder for the PNGs (default: ``RUN_DIR/attention``).
    """
    config, task, model = load_run(run_dir)
    if getattr(model.config, "inputs", "tokens") == "image":
        raise ValueError(f"tzoo attention draws token-by-token maps; {model.config.variant!r} reads images, "
                         "whose attention is over pixels: get it from model(image, need_weights=True)")
    inputs = task.example_inputs(model, example_row(task, text, example))
    output = model(**inputs, need_weights=True)
    src = task.token_strings(inputs["src"][0].tolist()) if "src" in inputs else None
    tgt = task.token_strings(inputs["tgt"][0].tolist()) if "tgt" in inputs else None
    labels = {"encoder": {"self": (src, src)}, "decoder": {"self": (tgt, tgt), "cross": (tgt, src)}}
    out = Path(out) if out is not None else Path(run_dir) / "attention"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stack, layers in output.attentions.items():
        for i, blocks in enumerate(layers):
            path = out / f"{stack}-layer{i + 1}.png"
            title = f"{config.task.kind}: {stack} layer {i + 1}"
            _plot_layer(blocks, labels[stack], title, path)
            paths.append(path)
    return paths
