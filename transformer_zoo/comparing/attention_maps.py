"""Attention maps of a trained model.

Token models: one PNG per stack and layer, a grid of its heads. Rows of a grid are the layer's
attention blocks (self-attention; cross-attention in a decoder), columns are heads; each cell
shows, for every query token (rows of the cell), how much weight it gives each key token
(columns). For a seq2seq task the model first writes its own output, so the decoder's maps show
where it looked while writing it.

Image models: one PNG per query pixel, as in the SAGAN paper's figure 5. The first column is
the image with the query marked; the others overlay, for each attention block (rows) and head
(columns), the weights that query gives every position of the block's grid (patches, pixels or
a feature map, stretched over the image). A generator's maps are over an image it draws for the
example's class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..training.trainer import load_run

DPI = 110
MAX_LABELLED = 24  # longer sequences are ticked by position: more strings would overlap in a 2.6-inch cell
SIGNED_COLORMAP = "RdBu_r"
"""The diverging colormap of signed weights: red above 0, blue below, white at 0."""


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


def colour_scale(weights: list[torch.Tensor], colormap: str) -> dict[str, Any]:
    """``imshow``'s colormap and limits for attention weights shown on one scale: ``colormap``
    from 0 to the largest weight; when any weight is negative (differential attention's
    ``A1 - lambda A2``), :data:`SIGNED_COLORMAP` centred on 0, from ``-max |w|`` to ``max |w|``."""
    top = max(float(w.abs().max()) for w in weights) or 1.0  # one scale for all: long rows' small weights show
    if min(float(w.min()) for w in weights) < 0:
        return {"cmap": SIGNED_COLORMAP, "vmin": -top, "vmax": top}
    return {"cmap": colormap, "vmin": 0.0, "vmax": top}


def layer_figure(
    blocks: dict[str, torch.Tensor], labels: dict[str, tuple[list[str] | None, list[str] | None]], title: str
) -> Figure:
    """A grid of one layer's attention: a row per block (``blocks``: name -> weights
    ``(1, heads, queries, keys)``), a column per head, one colour bar; ``labels``: block name ->
    (query, key) token strings, or None to tick positions."""
    heads = next(iter(blocks.values())).size(1)
    scale = colour_scale(list(blocks.values()), "viridis")
    fig = Figure(figsize=(2.6 * heads + 0.9, 2.6 * len(blocks) + 0.3), layout="constrained")
    axes = fig.subplots(len(blocks), heads, squeeze=False)
    for row, (name, weights) in enumerate(blocks.items()):
        queries, keys = labels.get(name, labels["self"])
        for head in range(heads):
            ax = axes[row, head]
            image = ax.imshow(weights[0, head].float().cpu().numpy(), aspect="auto", **scale)
            ax.set_title(f"{name}, head {head + 1}", fontsize=8)
            _token_axis(ax.xaxis, keys, rotation=90)
            _token_axis(ax.yaxis, queries)
            ax.set_xlabel("key token" if _labelled(keys) else "key position", fontsize=7)
            if head == 0:
                ax.set_ylabel("query token" if _labelled(queries) else "query position", fontsize=7)
    fig.colorbar(image, ax=axes, label="attention weight", fraction=0.05 / heads, pad=0.01, aspect=30)
    fig.suptitle(title, fontsize=10)
    return fig


def _labelled(tokens: list[str] | None) -> bool:
    return tokens is not None and len(tokens) <= MAX_LABELLED


def _token_axis(axis: Any, tokens: list[str] | None, rotation: int = 0) -> None:
    """Tick every position with its token string, or a few positions by number (0-based) when
    there are no strings or too many to read."""
    if _labelled(tokens):
        axis.set_ticks(range(len(tokens)), tokens, fontsize=6, rotation=rotation)
    else:
        axis.set_major_locator(MaxNLocator(5, integer=True))
        axis.set_tick_params(labelsize=6)


def image_grid(keys: int, size: tuple[int, int]) -> tuple[int, tuple[int, int]]:
    """Where ``keys`` attended positions lie on an image of ``size`` (height, width): how many
    come first off the grid (a class token), and the grid's (rows, columns), each cell covering
    the same number of pixels."""
    height, width = size
    for offset in (0, 1):
        for rows in range(1, height + 1):
            cells = keys - offset
            if (
                height % rows == 0
                and cells % rows == 0
                and cells // rows
                and width % (cells // rows) == 0
                and height // rows == width // (cells // rows)
            ):
                return offset, (rows, cells // rows)
    raise ValueError(f"{keys} attended positions do not tile a {height}x{width} image")


def query_weights(weights: torch.Tensor, query: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """The weights ``(heads, rows, cols)`` that the grid cell holding pixel ``query`` gives each
    cell of its grid, from a block's ``(heads, queries, keys)`` weights over an image of ``size``."""
    (height, width), keys = size, weights.size(-1)
    offset, (rows, cols) = image_grid(keys, size)
    if weights.size(-2) != keys:
        raise ValueError(f"expected self-attention weights over {keys} positions, got {tuple(weights.shape)}")
    cell = offset + query[0] * rows // height * cols + query[1] * cols // width
    return weights[:, cell, offset:].reshape(-1, rows, cols)


def parse_query(text: str) -> tuple[int, int]:
    """``ROW,COL`` to a pixel, for ``--query``."""
    row, _, col = text.partition(",")
    if not (row.strip().isdigit() and col.strip().isdigit()):
        raise ValueError(f"--query {text!r}: expected a pixel as ROW,COL such as 3,4")
    return int(row), int(col)


def overlay_figure(image: torch.Tensor, blocks: dict[str, torch.Tensor], query: tuple[int, int], title: str) -> Figure:
    """One query pixel's attention in every block (``blocks``: name -> weights ``(heads, queries,
    keys)``), over ``image`` ``(C, H, W)``: a row per block, a column per head, a colour bar per row."""
    height, width = image.shape[-2:]
    picture = image.float().cpu()
    picture = picture[0] if picture.size(0) == 1 else picture.permute(1, 2, 0).clamp(0, 1)
    heads = max(w.size(0) for w in blocks.values())
    fig = Figure(figsize=(2.2 * (heads + 1) + 0.9, 2.2 * len(blocks)), layout="constrained")
    axes = fig.subplots(len(blocks), heads + 1, squeeze=False)
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)
    for row, (name, weights) in enumerate(blocks.items()):  # weights (heads, queries, keys)
        grids = query_weights(weights, query, (height, width))
        # one scale per block: its heads compare, and its colour bar reads them
        scale = colour_scale([grids], "inferno")
        for col in range(heads + 1):
            ax = axes[row, col]
            ax.imshow(picture.numpy(), cmap="gray_r", extent=extent)
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.plot(query[1], query[0], "o", color="red", markersize=6)
                ax.set_ylabel(name, fontsize=7)
                ax.set_title(f"query pixel {query}" if row == 0 else "", fontsize=7)
            elif col <= weights.size(0):
                overlay = ax.imshow(grids[col - 1].float().cpu().numpy(), alpha=0.65, extent=extent, **scale)
                ax.plot(query[1], query[0], "o", color="cyan", markersize=4)
                ax.set_title(f"head {col}", fontsize=7)
            else:
                ax.axis("off")
        fig.colorbar(overlay, ax=axes[row, :], label="weight on each key", fraction=0.04, pad=0.01)
    fig.suptitle(title, fontsize=9)
    return fig


def _image_maps(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    queries: list[tuple[int, int]] | None,
    title: str,
    out: Path,
) -> list[Path]:
    output = model(**inputs, need_weights=True)
    image = (inputs["image"] if "image" in inputs else output.logits)[0]  # a generator's own drawing
    height, width = image.shape[-2:]
    queries = queries or [(height // 4, width // 4), (height // 2, width // 2), (3 * height // 4, 3 * width // 4)]
    for row, col in queries:
        if not (0 <= row < height and 0 <= col < width):
            raise ValueError(
                f"--query {row},{col} is outside the {height}x{width} image; rows are 0 to {height - 1}, "
                f"columns 0 to {width - 1}"
            )
    blocks = {}
    for stack, layers in output.attentions.items():
        for i, layer in enumerate(layers):
            for name, weights in layer.items():
                label = stack if len(layers) == 1 else f"{stack} layer {i + 1}"
                blocks[label if name == "self" else f"{label} {name}"] = weights[0]  # (heads, queries, keys)
    if not blocks:
        raise ValueError(f"{model.config.variant!r} has no attention blocks to draw")
    paths = []
    for query in queries:
        path = out / f"query-{query[0]}-{query[1]}.png"
        overlay_figure(image, blocks, query, f"{title}: attention of pixel {query}").savefig(path, dpi=DPI)
        paths.append(path)
    return paths


@torch.no_grad()
def attention_maps(
    run_dir: str | os.PathLike,
    *,
    text: str | None = None,
    example: str | None = None,
    out: str | os.PathLike | None = None,
    queries: list[tuple[int, int]] | None = None,
) -> list[Path]:
    """Draw the attention of a finished run's model on one example; returns the PNG paths.

    Args:
        run_dir: a run folder written by ``tzoo train``.
        text: typed input, in the task's own notation (``tzoo list --kind task`` describes it).
        example: ``SPLIT:INDEX`` of the task's data instead of ``text``.
        out: the folder for the PNGs (default: ``RUN_DIR/attention``).
        queries: image models: the query pixels ``(row, column)`` to draw (default: three on the
            diagonal, at a quarter, half and three quarters of the size).
    """
    config, task, model = load_run(run_dir)
    images = getattr(model.config, "inputs", "tokens") == "image"
    if queries and not images:
        raise ValueError(
            f"--query picks pixels of an image model; {model.config.variant!r} reads tokens, and its "
            "maps show every query token"
        )
    torch.manual_seed(0)  # a generator draws from noise: the same picture every time
    inputs = task.example_inputs(model, example_row(task, text, example))
    out = Path(out) if out is not None else Path(run_dir) / "attention"
    out.mkdir(parents=True, exist_ok=True)
    if images:
        return _image_maps(model, inputs, queries, f"{config.task.kind}, {model.config.variant}", out)
    output = model(**inputs, need_weights=True)
    src = task.token_strings(inputs["src"][0].tolist()) if "src" in inputs else None
    tgt = task.token_strings(inputs["tgt"][0].tolist()) if "tgt" in inputs else None
    labels = {"encoder": {"self": (src, src)}, "decoder": {"self": (tgt, tgt), "cross": (tgt, src)}}
    paths = []
    for stack, layers in output.attentions.items():
        for i, blocks in enumerate(layers):
            path = out / f"{stack}-layer{i + 1}.png"
            title = f"{config.task.kind}: {stack} layer {i + 1}"
            layer_figure(blocks, labels[stack], title).savefig(path, dpi=DPI)
            paths.append(path)
    return paths
