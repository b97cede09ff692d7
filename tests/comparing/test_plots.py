"""The report's plots: one colour and one mean per variant over seeds, labelled axes, readable ticks."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer

from transformer_zoo.comparing import plots
from transformer_zoo.comparing.records import RunRecord, ScalingPoint

VARIANTS = {"transformer-tiny": 101_706, "universal-transformer-tiny": 51_787, "bert-tiny": 482_570}


def record(variant: str, task: str = "listops", seed: int = 0, *, phases: tuple[str, ...] = ()) -> RunRecord:
    """A run whose numbers move a little with the seed; ``phases`` gives its curve ``loss_<phase>`` keys."""
    shift = 1 + 0.05 * seed
    curve = []
    for step in range(10, 110, 10):
        losses = {f"loss_{phase}": (2.0 if i == 0 else -0.5) * shift / step**0.5 for i, phase in enumerate(phases)}
        loss = next(iter(losses.values()), 3.0 * shift / step)
        curve.append({"step": step, "loss": loss, **losses, "lr": 1e-3})
    metric = "frechet_distance" if phases else "accuracy"
    return RunRecord(
        variant=variant,
        family="test",
        task=task,
        seed=seed,
        parameters=VARIANTS.get(variant, 268_092),
        flops_per_token=1e6,
        train_tokens_per_second=20_000 * shift * (len(variant) / 10),
        peak_memory_mb=100.0,
        steps=100,
        wall_seconds=10.0,
        metric=metric,
        metrics={"test": {metric: 0.5 * shift}},
        better={metric: "lower" if phases else "higher"},
        curve=curve,
    )


ONE_SEED = [record(v, task) for task in ("listops", "reverse") for v in VARIANTS]
SEEDS = [record(v, task, seed) for task in ("listops", "reverse") for v in VARIANTS for seed in (0, 1, 2)]
GAN = [record("sagan-gan", "digits-generation", seed, phases=("discriminator", "generator")) for seed in (0, 1)]


def labels(ax) -> tuple[str, str]:
    return ax.get_xlabel(), ax.get_ylabel()


def tick_texts(axis) -> list[str]:
    return [label.get_text() for label in axis.get_ticklabels()]


def test_log_axes_are_ticked_at_plain_1_2_5_values_with_two_at_least():
    assert plots.log_ticks(22_352, 482_826) == [20_000, 50_000, 100_000, 200_000, 500_000]
    assert plots.log_ticks(268_092, 268_092) == [200_000, 500_000]
    assert plots.log_ticks(200_000, 200_000) == [200_000, 500_000]
    assert plots.log_ticks(1, 1e6) == [1, 10, 100, 1000, 1e4, 1e5, 1e6]  # decades alone past three
    assert [plots.number(v) for v in (20_000, 1_500_000, 0.05, 512, 45_882.7, 999_600)] == [
        "20k",
        "1.5M",
        "0.05",
        "512",
        "45.9k",
        "1M",
    ]
    with pytest.raises(ValueError, match="0 < low <= high"):
        plots.log_ticks(0, 10)


def test_a_comparison_of_runs_too_fast_to_time_draws_its_report(tmp_path):
    """Every run took 0 s on a stopped clock, so each rate is 0 tokens/s, which has no logarithm: the
    throughput panels are linear, from 0, and the report and its plots are written."""
    from transformer_zoo.comparing.records import CompareResults
    from transformer_zoo.comparing.report import write_report
    from transformer_zoo.comparing.summary import summarize

    stopped = {"wall_seconds": 0.0, "last_attempt_seconds": 0.0, "train_tokens_per_second": 0.0}
    runs = [r.model_copy(update=stopped) for r in SEEDS]
    panels = [ax for ax in plots.throughput_figure(runs).axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left") for ax in panels] == ["listops", "reverse"]
    assert all(ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0 for ax in panels)
    results = CompareResults(spec={"name": "fast", "seeds": [0, 1, 2]}, machine={}, runs=runs, skipped=[])
    results.summaries = summarize(runs, "transformer-tiny")
    write_report(results, tmp_path)
    assert "## Runs" in (tmp_path / "report.md").read_text()
    assert all((tmp_path / name).stat().st_size > 0 for name in ("throughput.png", "metric-vs-parameters.png"))


@pytest.mark.parametrize("records", [ONE_SEED, SEEDS], ids=["one seed", "three seeds"])
def test_metric_against_parameters_has_one_point_per_variant(records, tmp_path):
    fig = plots.metric_figure(records)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["listops", "reverse"]
    for ax in panels:
        assert labels(ax) == ("trainable parameters", "test accuracy (higher is better)")
        assert tick_texts(ax.xaxis) == ["50k", "100k", "200k", "500k"]
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == len(VARIANTS), "one point per variant, not per seed"
        assert all(c.has_yerr == (records is SEEDS) for c in bars), "an interval only over several seeds"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(VARIANTS)
    path = tmp_path / "metric.png"
    plots.plot_metric_vs_parameters(records, path)
    assert matplotlib.image.imread(path).shape[1] == plots.WIDTH * plots.DPI


def test_throughput_has_a_log_panel_per_task_and_a_bar_per_variant_fastest_first(tmp_path):
    fig = plots.throughput_figure(SEEDS)
    panels = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left") for ax in panels] == ["listops", "reverse"]
    for ax in panels:
        assert ax.get_xscale() == "log"
        assert ax.get_xlabel() == f"training tokens / s (tokens of {ax.get_title(loc='left')})"
        assert tick_texts(ax.yaxis) == ["universal-transformer-tiny", "transformer-tiny", "bert-tiny"]
        assert len(ax.patches) == len(VARIANTS)
        assert all(c.has_xerr for c in ax.containers if isinstance(c, ErrorbarContainer))
    plots.plot_throughput(ONE_SEED, tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_curves_draw_a_mean_line_and_a_band_per_variant(tmp_path):
    fig = plots.curves_figure([r for r in SEEDS if r.task == "listops"], "listops")
    (ax,) = fig.axes
    assert labels(ax) == ("training step", "training loss")
    assert len(ax.lines) == len(VARIANTS), "one colour per variant"
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == len(VARIANTS), "a band over seeds"
    assert len({line.get_color() for line in ax.lines}) == len(VARIANTS)
    assert ax.get_yscale() == "log", "the loss falls tenfold"
    assert fig.get_suptitle() == "Learning curves on listops: mean over 3 seeds; shaded band: range over seeds"
    one = plots.curves_figure([r for r in ONE_SEED if r.task == "listops"], "listops")
    assert not [c for c in one.axes[0].collections if isinstance(c, PolyCollection)]
    plots.plot_curves(SEEDS, "listops", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_model_trained_in_phases_gets_a_labelled_panel_per_phase():
    assert plots.loss_keys(GAN) == ["loss_discriminator", "loss_generator"]
    fig = plots.curves_figure(GAN, "digits-generation")
    discriminator, generator = fig.axes
    assert discriminator.get_ylabel() == "discriminator loss"
    assert "phase 1 of 2, the run's headline loss" in discriminator.get_title()
    assert labels(generator) == ("training step", "generator loss")
    assert generator.get_yscale() == "linear", "a generator's loss goes below zero"
    mixed = plots.curves_figure(GAN + [record("vit-tiny", "digits-generation")], "digits-generation")
    assert [ax.get_ylabel() for ax in mixed.axes] == ["discriminator loss", "generator loss", "training loss"]
    assert [t.get_text() for t in mixed.legends[0].get_texts()] == ["sagan-gan (2 seeds)", "vit-tiny (1 seed)"]


def test_ponder_wraps_long_sequences_into_rows_under_a_labelled_colour_bar(tmp_path):
    tokens = [f"t{i}" for i in range(60)]
    fig = plots.ponder_figure(
        {"encoder": torch.linspace(1, 5, 60), "decoder": torch.ones(5)}, {"encoder": tokens, "decoder": ["a", "b"]}
    )
    rows, colour_bar = fig.axes[:-1], fig.axes[-1]
    assert [ax.get_ylabel() for ax in rows] == ["encoder\n1-20", "encoder\n21-40", "encoder\n41-60", "decoder\n1-5"]
    assert tick_texts(rows[1].xaxis) == tokens[20:40]
    assert tick_texts(rows[3].xaxis) == ["1", "2", "3", "4", "5"], "positions where the strings do not fit"
    assert colour_bar.get_ylabel() == "ponder time (steps)"
    assert [t.get_text() for t in rows[0].texts][:2] == ["1.0", "1.1"]
    path = tmp_path / "ponder.png"
    plots.plot_ponder({"encoder": torch.rand(60)}, {"encoder": tokens}, path)
    assert matplotlib.image.imread(path).shape[1] <= plots.WIDTH * plots.DPI


def test_scaling_has_labelled_log_axes_at_the_measured_lengths(tmp_path):
    points = [
        ScalingPoint(variant=v, attention=a, length=n, mode=m, seconds=n * 1e-6, peak_mb=n / 100)
        for v, a in (("transformer-tiny", "as configured"), ("local-global-encoder-tiny", "sdpa"))
        for n in (512, 1024)
        for m in ("forward", "train")
    ]
    fig = plots.scaling_figure(points)
    assert [labels(ax) for ax in fig.axes] == [("", "time per pass (ms)")] * 2 + [
        ("sequence length (tokens)", "peak tensor memory (MiB)")
    ] * 2
    assert tick_texts(fig.axes[2].xaxis) == ["512", "1024"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "transformer-tiny",
        "local-global-encoder-tiny [sdpa]",
    ]
    plots.plot_scaling(points, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0
