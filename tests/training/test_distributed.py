"""Data-parallel and sharded training: two gloo processes under torchrun follow one process's loss curve."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import safetensors.torch
import torch

import transformer_zoo as tz
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

CONFIG = {
    "model": {
        "variant": "transformer-tiny",
        "d_model": 32,
        "n_heads": 2,
        "d_ff": 64,
        "dropout": 0.0,
        "encoder": {"layers": 2},
    },
    "task": {"kind": "listops", "train_size": 200, "test_size": 20, "max_length": 24},
    "steps": 8,
    "batch_size": 8,
    "lr": 0.003,
    "warmup_steps": 2,
    "log_every": 1,
    "checkpoint_every": 4,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path, config: dict, out, processes: int = 2, command: str = "train") -> subprocess.CompletedProcess:
    path = tmp_path / f"{out.name}.json"
    path.write_text(json.dumps(config))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={processes}",
        f"--master-port={free_port()}",
        "-m",
        "transformer_zoo",
        command,
        str(path),
        "--out",
        str(out),
        "--json",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on a 2-core machine
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def weights(folder):
    return safetensors.torch.load_file(str(folder / "model" / "model.safetensors"))


@pytest.mark.heavy
def test_two_gloo_processes_follow_the_curve_of_one_with_the_same_global_batch(tmp_path):
    result = torchrun(tmp_path, CONFIG, tmp_path / "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)  # process 0 alone reports
    single = train(load_train_config(CONFIG), tmp_path / "one", progress=False)

    ddp_curve = [h["loss"] for h in summary["history"] if "loss" in h]
    one_curve = [h["loss"] for h in single["history"] if "loss" in h]
    assert len(ddp_curve) == len(one_curve) == 8
    assert one_curve[0] != one_curve[-1], "the curve moves: the comparison is not of constants"
    torch.testing.assert_close(torch.tensor(ddp_curve), torch.tensor(one_curve), rtol=1e-4, atol=1e-5)
    assert weights(tmp_path / "ddp").keys() == weights(tmp_path / "one").keys()
    # the checkpoint is the plain model, for one device; compared by outputs, because a key bias has
    # no gradient but rounding noise, which Adam turns into steps of either sign
    ddp, one = (tz.from_pretrained(tmp_path / name / "model").eval() for name in ("ddp", "one"))
    assert ddp.config == one.config
    task = load_train_config(CONFIG).task.build()
    batch = task.collate([task.dataset("test")[i] for i in range(20)])
    with torch.no_grad():
        torch.testing.assert_close(
            ddp(src=batch["src"], src_mask=batch["src_mask"]).logits,
            one(src=batch["src"], src_mask=batch["src_mask"]).logits,
            rtol=1e-4,
            atol=1e-4,
        )
    assert summary["metrics"]["test"]["accuracy"] == pytest.approx(single["metrics"]["test"]["accuracy"])


def curve(summary: dict) -> torch.Tensor:
    return torch.tensor([h["loss"] for h in summary["history"] if "loss" in h])


SHARDED = {**CONFIG, "schedule": "constant", "parallel": "fsdp"}  # constant: 8 steps are the start of 12


@pytest.mark.heavy
def test_sharded_training_follows_one_process_and_its_checkpoint_resumes_sharded_or_on_one_device(tmp_path):
    first = torchrun(tmp_path, SHARDED, tmp_path / "fsdp")
    assert first.returncode == 0, first.stderr[-3000:]
    single = train(load_train_config({**SHARDED, "steps": 12}), tmp_path / "one", progress=False)
    assert len(curve(single)) == 12 and curve(single)[0] != curve(single)[-1]
    torch.testing.assert_close(curve(json.loads(first.stdout)), curve(single)[:8], rtol=1e-4, atol=1e-5)
    summary = json.loads(first.stdout)
    assert summary["parameters"] == single["parameters"] == single["parameters_per_process"]
    # each process holds its half of every parameter (a dimension that does not split evenly rounds up)
    assert summary["parameters"] / 2 <= summary["parameters_per_process"] < summary["parameters"] / 2 + 300

    # the checkpoint holds the whole model and optimizer: it resumes sharded, and in one process
    shutil.copytree(tmp_path / "fsdp", tmp_path / "alone")
    resumed = torchrun(tmp_path, {**SHARDED, "steps": 12}, tmp_path / "fsdp")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    torch.testing.assert_close(curve(json.loads(resumed.stdout)), curve(single), rtol=1e-4, atol=1e-5)
    alone = train(load_train_config({**SHARDED, "steps": 12}), tmp_path / "alone", progress=False)
    torch.testing.assert_close(curve(alone), curve(single), rtol=1e-4, atol=1e-5)

    task = load_train_config(CONFIG).task.build()
    batch = task.collate([task.dataset("test")[i] for i in range(20)])
    fsdp, one = (tz.from_pretrained(tmp_path / name / "model").eval() for name in ("fsdp", "one"))
    with torch.no_grad():
        torch.testing.assert_close(
            fsdp(src=batch["src"], src_mask=batch["src_mask"]).logits,
            one(src=batch["src"], src_mask=batch["src_mask"]).logits,
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.slow
def test_a_compiled_sharded_run_follows_one_process_and_resumes_eagerly(tmp_path):
    """Slow (``python -m pytest -m slow``): two processes each compiling the model on one core took
    over two minutes with an empty compile cache."""
    compiled = torchrun(tmp_path, {**SHARDED, "compile": True}, tmp_path / "fsdp")
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    single = train(load_train_config({**SHARDED, "steps": 12}), tmp_path / "one", progress=False)
    torch.testing.assert_close(curve(json.loads(compiled.stdout)), curve(single)[:8], rtol=1e-4, atol=1e-5)
    resumed = torchrun(tmp_path, {**SHARDED, "steps": 12}, tmp_path / "fsdp")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    torch.testing.assert_close(curve(json.loads(resumed.stdout)), curve(single), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_one_process_torchrun_job_trains_through_its_process_group(tmp_path, parallel):
    """One process under torchrun runs the code N processes run (so a single GPU checks it). Slow
    (``python -m pytest -m slow``): on a CPU the two-process tests above run that code and more."""
    result = torchrun(tmp_path, {**CONFIG, "parallel": parallel}, tmp_path / parallel, processes=1)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["parallel"], summary["processes"]) == (parallel, 1)
    single = train(load_train_config(CONFIG), tmp_path / "one", progress=False)
    assert (single["parallel"], single["processes"]) == (None, 1), "no process group without torchrun"
    torch.testing.assert_close(curve(summary), curve(single), rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_compare_on_a_torchrun_job_trains_each_run_over_the_processes(tmp_path):
    from transformer_zoo.comparing.records import CompareResults

    model = CONFIG["model"]
    spec = {
        "name": "two",
        "variants": [model, "sagan-gan"],
        "tasks": [CONFIG["task"], "digits-generation"],
        "steps": 8,
        "seeds": [0],
        "train": {k: CONFIG[k] for k in ("batch_size", "lr", "warmup_steps", "log_every")},
    }
    result = torchrun(tmp_path, spec, tmp_path / "report", command="compare")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["report"].endswith("report.md"), "process 0 alone reports"
    results = CompareResults.model_validate_json((tmp_path / "report" / "results.json").read_text())
    assert results.machine["processes"] == 2 and (tmp_path / "report" / "report.md").is_file()
    assert [(run.task, run.steps) for run in results.runs] == [("listops", 8)]
    gan = [s.reason for s in results.skipped if s.variant == "sagan-gan" and s.task == "digits-generation"]
    assert gan and "trains in phases ['discriminator', 'generator'], which run in one process only" in gan[0]
    # the run followed one process's curve with the same global batch
    single = train(load_train_config({**CONFIG, "checkpoint_every": 0}), tmp_path / "one", progress=False)
    torch.testing.assert_close(
        torch.tensor([h["loss"] for h in results.runs[0].curve if "loss" in h]), curve(single), rtol=1e-4, atol=1e-5
    )


@pytest.fixture
def two_processes(monkeypatch):
    """As in process 0 of a torchrun job of two: the refusals below come before any process group
    is used, so the job need not be launched (the tests above launch real ones)."""
    from transformer_zoo.training import distributed

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=0, size=2, launched=True))


def test_a_compare_whose_batch_does_not_split_over_the_processes_is_refused_before_training(
    tmp_path, capsys, two_processes
):
    from transformer_zoo.cli import main

    spec = {"variants": [CONFIG["model"]], "tasks": [CONFIG["task"]], "steps": 1, "train": {"batch_size": 5}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["compare", str(tmp_path / "spec.json"), "--out", str(tmp_path / "odd")]) != 0
    assert not (tmp_path / "odd").exists()
    assert "batch_size 5 is each run's global batch, split over the job's 2 processes" in capsys.readouterr().err


def test_a_global_batch_that_does_not_split_evenly_is_refused(tmp_path, capsys, two_processes):
    from transformer_zoo.cli import main

    (tmp_path / "odd.json").write_text(json.dumps({**CONFIG, "batch_size": 7, "steps": 1}))
    assert main(["train", str(tmp_path / "odd.json"), "--out", str(tmp_path / "odd")]) != 0
    assert "batch_size 7 is the global batch, split over 2 processes; use a multiple of 2" in capsys.readouterr().err


def test_each_process_keeps_its_own_rows_of_the_global_batch():
    from transformer_zoo.training.distributed import World, shard

    batch = {"src": torch.arange(16).view(8, 2), "targets": torch.arange(8)}
    parts = [shard(batch, World(rank=r, size=2)) for r in range(2)]
    assert torch.equal(torch.cat([p["targets"] for p in parts]), batch["targets"])
    assert torch.equal(parts[1]["src"], batch["src"][4:]) and len(parts[0]["targets"]) == 4
    assert torch.equal(shard(batch, World())["src"], batch["src"])  # one process keeps the whole batch
