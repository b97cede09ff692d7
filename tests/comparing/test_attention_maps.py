"""tzoo attention: one PNG per stack and layer, from typed input or a dataset example; for image
models, one PNG per query pixel."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
import torch

from transformer_zoo.cli import main
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

MODEL = {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A seq2seq run (reverse) and a classification run (listops), a few steps each."""
    root = tmp_path_factory.mktemp("runs")
    tasks = {
        "reverse": {"kind": "reverse", "train_size": 100, "test_size": 10},
        "listops": {"kind": "listops", "train_size": 100, "test_size": 10, "max_length": 32},
    }
    for name, task in tasks.items():
        train(
            load_train_config({"model": MODEL, "task": task, "steps": 3, "batch_size": 4}), root / name, progress=False
        )
    return root


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_seq2seq_run_draws_encoder_and_decoder_layers(runs, capsys, tmp_path):
    paths = run_json(capsys, "attention", str(runs / "reverse"), "--input", "3 1 4 1 5", "--out", str(tmp_path))
    layers = load_train_config(runs / "reverse" / "train.json")
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "encoder-layer1.png",
        "encoder-layer2.png",
        "decoder-layer1.png",
        "decoder-layer2.png",
    ], layers
    decoder = matplotlib.image.imread(paths[-1])
    encoder = matplotlib.image.imread(paths[0])
    assert decoder.shape[0] > encoder.shape[0], "decoder grids have a second row: cross-attention"
    assert decoder.shape[1] == encoder.shape[1], "one column per head in both"


def test_a_dataset_example_and_the_default_folder(runs, capsys):
    paths = run_json(capsys, "attention", str(runs / "listops"), "--example", "test:2")
    assert paths == [str(runs / "listops" / "attention" / f"encoder-layer{i}.png") for i in (1, 2)]
    paths = run_json(capsys, "attention", str(runs / "listops"), "--input", "[MAX 2 9 [MIN 4 7 ] 0 ]")
    assert len(paths) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "3 1 x"], "'x' is not a symbol of task 'reverse'; use symbols 0-9"),
        (["--example", "test:99"], "split 'test' has 10 examples (0 to 9)"),
        (["--example", "dev:0"], "task 'reverse' has no split 'dev'; splits: train, test, test_long"),
        (["--example", "test"], "expected SPLIT:INDEX such as test:0"),
        ([], "give exactly one of --input TEXT and --example SPLIT:INDEX"),
    ],
)
def test_bad_input_is_one_clear_message(runs, capsys, args, message):
    assert main(["attention", str(runs / "reverse"), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["attention", str(tmp_path), "--input", "1"]) == 2
    assert "not a finished run folder" in capsys.readouterr().err


# ---- image models: overlays for a query pixel ---------------------------------------------
@pytest.fixture(scope="module")
def image_runs(digits_run):
    """A ViT and a SAGAN classifier on digits (the learning tests' runs), and a SAGAN GAN on
    digits-generation (5 steps: the learning test's 800 are among the slow tests), trained once per
    session."""
    return {
        name: digits_run(variant)[0]
        for name, variant in (("vit", "vit-tiny"), ("sagan", "sagan-classifier-tiny"), ("gan", "sagan-gan-sketch"))
    }


@pytest.mark.xdist_group("digits")
@pytest.mark.parametrize("name, blocks", [("vit", 4), ("sagan", 2), ("gan", 1)])
def test_image_models_draw_a_query_pixels_attention_over_the_image(image_runs, capsys, tmp_path, name, blocks):
    paths = run_json(
        capsys,
        "attention",
        str(image_runs[name]),
        "--example",
        "test:0",
        "--query",
        "1,2",
        "--query",
        "6,5",
        "--out",
        str(tmp_path),
    )
    assert [p.rsplit("/", 1)[1] for p in paths] == ["query-1-2.png", "query-6-5.png"]
    figure = matplotlib.image.imread(paths[0])
    assert figure.shape[0] == pytest.approx(2.2 * 110 * blocks, rel=0.05), "a row per attention block"
    defaults = run_json(capsys, "attention", str(image_runs[name]), "--example", "test:0")
    assert [p.rsplit("/", 1)[1] for p in defaults] == ["query-2-2.png", "query-4-4.png", "query-6-6.png"]


def test_the_grid_of_each_kind_of_image_attention_is_found():
    from transformer_zoo.comparing.attention_maps import image_grid

    assert image_grid(17, (8, 8)) == (1, (4, 4))  # ViT, 2x2 patches and a class token
    assert image_grid(64, (8, 8)) == (0, (8, 8))  # pixels, or a full-size feature map
    assert image_grid(16, (8, 8)) == (0, (4, 4))  # a feature map at half the size
    assert image_grid(8, (8, 16)) == (0, (2, 4))
    with pytest.raises(ValueError, match="10 attended positions do not tile a 8x8 image"):
        image_grid(10, (8, 8))


def test_the_overlay_is_the_query_cells_row_of_weights():
    from transformer_zoo.comparing.attention_maps import query_weights

    weights = torch.rand(2, 17, 17)  # two heads, a class token and a 4x4 grid of patches on an 8x8 image
    grid = query_weights(weights, (5, 2), (8, 8))  # pixel (5, 2) is in patch (2, 1): token 1 + 2 * 4 + 1
    assert torch.equal(grid, weights[:, 10, 1:].view(2, 4, 4))


@pytest.mark.xdist_group("digits")
@pytest.mark.parametrize(
    "args, message",
    [
        (["--query", "8,0"], "--query 8,0 is outside the 8x8 image; rows are 0 to 7, columns 0 to 7"),
        (["--query", "3"], "expected a pixel as ROW,COL such as 3,4"),
    ],
)
def test_bad_queries_are_refused(image_runs, capsys, args, message):
    assert main(["attention", str(image_runs["vit"]), "--example", "test:0", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_query_on_a_token_model_is_refused(runs, capsys):
    assert main(["attention", str(runs / "listops"), "--example", "test:0", "--query", "1,1"]) == 2
    assert "--query picks pixels of an image model" in capsys.readouterr().err


# ---- what a figure shows ------------------------------------------------------------------
def test_a_layers_grid_labels_its_axes_with_tokens_or_positions_and_has_a_colour_bar():
    from transformer_zoo.comparing.attention_maps import MAX_LABELLED, layer_figure

    long = MAX_LABELLED + 1
    blocks = {
        "self": torch.softmax(torch.randn(1, 2, long, long), -1),
        "cross": torch.softmax(torch.randn(1, 2, long, 3), -1),
    }
    fig = layer_figure(blocks, {"self": ([str(i) for i in range(long)],) * 2, "cross": (None, ["a", "b", "c"])}, "t")
    (self_1, self_2, cross_1, cross_2), colour_bar = fig.axes[:4], fig.axes[4]
    assert (self_1.get_xlabel(), self_1.get_ylabel(), self_2.get_ylabel()) == ("key position", "query position", "")
    assert (cross_1.get_xlabel(), cross_1.get_ylabel()) == ("key token", "query position")
    assert [t.get_text() for t in cross_2.get_xticklabels()] == ["a", "b", "c"]
    assert len(self_1.get_xticks()) < 10, "a long sequence is ticked at a few positions"
    assert colour_bar.get_ylabel() == "attention weight"
    assert colour_bar.get_ylim()[1] == pytest.approx(float(torch.cat([b.flatten() for b in blocks.values()]).max()))


def test_an_overlay_has_a_colour_bar_per_block():
    from transformer_zoo.comparing.attention_maps import overlay_figure

    blocks = {"encoder layer 1": torch.softmax(torch.randn(2, 17, 17), -1), "encoder layer 2": torch.rand(1, 64, 64)}
    fig = overlay_figure(torch.rand(1, 8, 8), blocks, (1, 2), "t")
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "weight on each key"]
    assert len(bars) == 2
    assert fig.axes[0].get_title() == "query pixel (1, 2)"


def test_signed_weights_are_drawn_on_a_scale_centred_on_zero(tmp_path):
    """Differential attention's weights ``A1 - lambda A2`` may be negative: a grid or an overlay
    with a negative weight shows on a diverging colormap from ``-max |w|`` to ``max |w|``, so its
    negative weights show; weights that are all positive keep their scale from 0."""
    from transformer_zoo.comparing.attention_maps import SIGNED_COLORMAP, layer_figure, overlay_figure

    generator = torch.Generator().manual_seed(0)
    softmax = torch.softmax(torch.randn(1, 2, 4, 4, generator=generator), -1)
    signed = softmax - 0.8 * torch.softmax(torch.randn(1, 2, 4, 4, generator=generator), -1)
    signed[0, 1, 0, 2] = -0.9  # the largest in size, and below 0
    grid = layer_figure({"self": signed, "cross": softmax}, {"self": (None, None)}, "t")
    # a 2x2 grid of cells over a 4x4 image: pixel (0, 1) is cell 0, whose row of weights is drawn
    overlay = overlay_figure(torch.rand(1, 4, 4), {"signed": signed[0], "softmax": softmax[0]}, (0, 1), "t")
    scales = [[(image.get_cmap().name, image.get_clim()) for image in ax.get_images()] for ax in grid.axes[:4]]
    assert scales == [[(SIGNED_COLORMAP, pytest.approx((-0.9, 0.9)))]] * 4, "one scale for the layer's blocks"
    overlays = [ax.get_images()[-1] for ax in overlay.axes[:6] if len(ax.get_images()) == 2]  # the heads' overlays
    top = float(softmax[0, :, 0].max())
    assert [(image.get_cmap().name, image.get_clim()) for image in overlays] == [
        *[(SIGNED_COLORMAP, pytest.approx((-0.9, 0.9)))] * 2,
        *[("inferno", pytest.approx((0.0, top)))] * 2,
    ]
    for n, fig in enumerate((grid, overlay)):
        fig.savefig(tmp_path / f"{n}.png", dpi=30)
        assert matplotlib.image.imread(tmp_path / f"{n}.png").size > 0
