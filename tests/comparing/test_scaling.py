"""Time and memory against length: the exact memory count, full-attention twins, the compare section."""

from __future__ import annotations

import json

import pytest
import torch

import transformer_zoo as tz
import transformer_zoo.comparing.runner as compare_module
from transformer_zoo.comparing.runner import compare
from transformer_zoo.comparing.scaling import PeakMemory, ScalingSpec, attention_kinds, measure_scaling, stretched, twin
from transformer_zoo.comparing.spec import load_spec

MIB = 2**20
LISTOPS = {"kind": "listops", "train_size": 50, "test_size": 8, "max_length": 32}


def test_peak_memory_counts_each_new_storage_once_until_freed():
    weight = torch.ones(256, 1024)
    with PeakMemory() as tracker:
        weight.t().contiguous()  # 1 MiB, dropped at once
        view = weight.view(-1)  # a view of a storage made before: not counted
        a = weight * 2  # 1 MiB
        a.add_(1)  # in place: nothing new
        b = a[:128] + 1  # 0.5 MiB
        del a
        c = b.repeat(2, 1)  # 1 MiB
    assert tracker.peak == 1.5 * MIB, "a and b, or b and c, at once"
    assert tracker.live == 1.5 * MIB
    del b, c, view
    assert tracker.live == 0


def test_peak_memory_sees_the_backward_pass():
    x = torch.randn(1024, 256, requires_grad=True)  # 1 MiB
    with PeakMemory() as forward_only:
        x.relu().sum()
    with PeakMemory() as both:
        x.relu().sum().backward()
    assert forward_only.peak == MIB + 4, "the relu output and the float sum"
    assert both.peak >= 2 * MIB, "the saved output and the input's gradient"
    assert x.grad is not None


def test_twins_replace_every_self_attention_and_keep_the_rest():
    config = tz.load_config("transformer-dmca-tiny")
    assert attention_kinds(config) == {"block-local", "memory-compressed"}
    full = twin(config, "sdpa")
    assert attention_kinds(full) == {"sdpa"}
    assert full.decoder.layers == config.decoder.layers and full.d_model == config.d_model
    assert attention_kinds(tz.load_config("transformer-tiny")) == {"sdpa"}


def test_a_twin_keeps_the_bias_option():
    config = tz.load_config("local-global-encoder-tiny", {"encoder": {"attention": {"bias": False}}})
    assert twin(config, "sdpa").encoder.attention.bias is False


def test_a_pass_that_fails_is_recorded_and_the_others_kept(monkeypatch):
    import transformer_zoo.comparing.scaling as scaling

    real = scaling.measure

    def out_of_memory_at_256(model, task, length, spec, device):
        if length == 256:
            raise torch.OutOfMemoryError("could not allocate 4 GiB")
        return real(model, task, length, spec, device)

    monkeypatch.setattr(scaling, "measure", out_of_memory_at_256)
    task = load_spec({"variants": ["bert-tiny"], "tasks": [LISTOPS]}).tasks[0].build()
    model = tz.load_config("transformer-tiny")
    config = tz.load_config(model, task.model_overrides(model))
    points = measure_scaling([("t", config)], task, ScalingSpec(lengths=[64, 256], repeats=1), progress=False)
    failed = [p for p in points if p.error]
    assert [(p.length, p.seconds) for p in failed] == [(256, None), (256, None)]
    assert "OutOfMemoryError: could not allocate 4 GiB" in failed[0].error
    assert all(p.seconds > 0 and p.peak_mb > 0 for p in points if p.length == 64)
    from transformer_zoo.comparing.report import scaling_tables

    assert "failed" in scaling_tables(points) and "t at n = 256 (OutOfMemoryError" in scaling_tables(points)


def test_stretched_tiles_each_sequence_to_the_length():
    batch = {
        "src": torch.tensor([[5, 6, 7], [8, 9, 0]]),
        "src_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "targets": torch.tensor([1, 2]),
    }
    out = stretched(batch, 7)
    assert out["src"].tolist() == [[5, 6, 7, 5, 6, 7, 5], [8, 9, 0, 8, 9, 0, 8]]
    assert out["src_mask"].shape == (2, 7) and out["targets"].tolist() == [1, 2]


def test_sparse_memory_grows_linearly_and_written_out_attention_quadratically():
    spec = ScalingSpec(lengths=[512, 2048], repeats=1, references=["sdpa", "math"])
    task = load_spec({"variants": ["bert-tiny"], "tasks": [LISTOPS]}).tasks[0].build()
    model = tz.load_config("local-global-encoder-tiny")
    config = tz.load_config(model, task.model_overrides(model))
    points = measure_scaling([("lg", config)], task, spec, progress=False)
    assert {(p.attention, p.mode) for p in points} == {
        (a, m) for a in ("as configured", "sdpa", "math") for m in ("forward", "train")
    }
    peak = {(p.attention, p.mode, p.length): p.peak_mb for p in points}
    for mode in ("forward", "train"):
        assert peak["as configured", mode, 2048] / peak["as configured", mode, 512] <= 4.5, "O(n w): linear"
        assert peak["math", mode, 2048] / peak["math", mode, 512] >= 10, "the n x n weights: quadratic"
    assert peak["as configured", "train", 2048] < peak["math", "train", 2048] / 4
    assert all(p.seconds > 0 for p in points)


def test_compare_reports_time_and_memory_against_length(tmp_path, monkeypatch):
    spec = load_spec(
        {
            "name": "scaling",
            "variants": ["transformer-tiny", "local-global-encoder-tiny"],
            "tasks": [LISTOPS],
            "steps": 2,
            "seeds": [0],
            "train": {"batch_size": 4},
            "scaling": {"lengths": [64, 256], "repeats": 1},
        }
    )
    results = compare(spec, tmp_path)
    models = {(p.variant, p.attention) for p in results.scaling}
    assert models == {
        ("transformer-tiny", "as configured"),
        ("local-global-encoder-tiny", "as configured"),
        ("local-global-encoder-tiny", "sdpa"),
        ("local-global-encoder-tiny", "math"),
    }, "a full-attention model is not measured again with full attention"
    assert len(results.scaling) == len(models) * 2 * 2
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["scaling"]) == len(results.scaling)
    text = (tmp_path / "report.md").read_text()
    assert "## Time and memory against length (listops models)" in text
    assert "| local-global-encoder-tiny [math] | forward + backward |" in text
    assert "| local-global-encoder-tiny vs [sdpa] | forward (inference) |" in text
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"

    def measure_again(*args, **kwargs):
        raise AssertionError("a rerun measured again")

    monkeypatch.setattr(compare_module, "measure_scaling", measure_again)
    assert compare(spec, tmp_path).scaling == results.scaling, "a rerun reads scaling.json"


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"task": "digits"}, "scaling.task 'digits' is not one of the spec's tasks"),
        ({"references": ["maths"]}, "unknown attention kind 'maths'; did you mean 'math'"),
        ({"references": ["sliding-window"]}, "references \\['sliding-window'\\] are not full attention kinds"),
        ({"lengths": [0]}, "scaling.lengths.0: Input should be greater than or equal to 1"),
    ],
)
def test_bad_scaling_sections_are_refused(scaling, message):
    with pytest.raises((tz.ConfigError, tz.UnknownNameError), match=message):
        load_spec({"variants": ["bert-tiny"], "tasks": [LISTOPS], "scaling": scaling})
