"""Training with Muon (``optimizer: muon``): which parameters Muon takes, one step against the
update its sources write down, learning, exact resume, the refusals, and the tuning space.

Sources: Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"
(https://kellerjordan.github.io/posts/muon/); Liu et al. 2025, "Muon is Scalable for LLM
Training" (arXiv 2502.16982), whose update scale 0.2 * sqrt(max(A, B)) lets Muon share AdamW's
learning rate and weight decay.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest
import safetensors.torch
import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.training.config import TrainConfig, load_train_config
from transformer_zoo.training.step import (
    Stepper,
    hidden_matrices,
    muon_name,
    optimized_parameters,
    phase_optimizers,
)
from transformer_zoo.training.trainer import Trainer, train

MEMORISE = {"kind": "mad-memorization", "num_train_examples": 64, "num_test_examples": 16}


def muon_config(model: str = "llama-tiny", **overrides) -> TrainConfig:
    return load_train_config({"model": model, "task": MEMORISE, "optimizer": "muon", **overrides})


def stack_linear_weights(model: nn.Module) -> set[str]:
    """The rule as the sources state it, by the model's part names: the weight of every linear
    map inside the encoder and decoder stacks, but a map to or from one number (a vector)."""
    return {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and name.split(".")[0] in ("encoder", "decoder")
        and min(module.in_features, module.out_features) > 1
    }


# ---- which parameters Muon takes ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "hidden"),
    [
        ("llama-tiny", 8),  # 2 layers: attention in and out, feed-forward gate/up and down
        ("transformer-tiny", 20),  # 2 + 2 layers: the decoder's cross-attention adds 2 each
        ("universal-transformer-tiny", 10),  # one shared layer per stack; each stack's halting unit is a vector
        ("vit-tiny", 16),  # an image encoder of 4 layers
    ],
)
def test_muon_takes_every_hidden_matrix_and_adamw_the_rest_each_parameter_once(variant, hidden):
    model = tz.build_model(variant)
    names = {id(p): name for name, p in model.named_parameters()}
    parts = optimized_parameters(model, muon_config(variant))
    assert list(parts) == ["model", "model.muon"]
    muon = [names[id(p)] for p in parts["model.muon"]]
    adamw = [names[id(p)] for p in parts["model"]]
    assert set(muon) == stack_linear_weights(model) and len(muon) == hidden
    assert [names[id(p)] for p in hidden_matrices(model)] == muon
    assert sorted(muon + adamw) == sorted(names.values()), "every parameter exactly once"
    assert not [n for n in muon if n.split(".")[0] in ("src_embed", "tgt_embed", "head", "patches", "positional")]
    assert all(p.dim() == 2 for p in parts["model.muon"])
    assert all(names[id(p)] in adamw for p in model.parameters() if p.dim() != 2), "vectors and scalars: AdamW"

    _, optimizers, schedulers = phase_optimizers(model, muon_config(variant))
    assert type(optimizers["model"]) is torch.optim.AdamW and type(optimizers["model.muon"]) is torch.optim.Muon
    assert list(schedulers) == ["model", "model.muon"]
    (muon_group,) = optimizers["model.muon"].param_groups
    assert muon_group["adjust_lr_fn"] == "match_rms_adamw" and muon_group["nesterov"] and muon_group["momentum"] == 0.95


def test_a_tied_head_and_the_embeddings_go_to_adamw():
    model = tz.build_model("transformer-tiny")  # shared embeddings: one table for both stacks and the head
    assert model.head.proj.weight is model.src_embed.token.weight is model.tgt_embed.token.weight
    parts = optimized_parameters(model, muon_config("transformer-tiny"))
    assert any(p is model.head.proj.weight for p in parts["model"])
    assert not any(p is model.head.proj.weight for p in parts["model.muon"])


def test_models_without_stacks_train_with_adamw_alone_in_every_phase():
    for variant, phases in [("sagan-classifier-tiny", ["model"]), ("sagan-gan", ["discriminator", "generator"])]:
        model = tz.build_model(variant)
        assert hidden_matrices(model) == []
        _, optimizers, _ = phase_optimizers(model, muon_config(variant))
        assert list(optimizers) == phases and all(type(o) is torch.optim.AdamW for o in optimizers.values())


def test_with_adamw_every_phase_has_one_optimizer_under_its_name():
    model = tz.build_model("llama-tiny")
    config = muon_config(optimizer="adamw")
    assert {name: len(ps) for name, ps in optimized_parameters(model, config).items()} == {
        "model": len(list(model.parameters()))
    }
    assert muon_name("generator") == "generator.muon"


# ---- one step against the documented update ------------------------------------------------------
def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Jordan et al.'s quintic Newton-Schulz iteration, coefficients (3.4445, -4.7750, 2.0315),
    on the wide orientation of ``g`` normalised to unit Frobenius norm (in float32 here)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.size(0) > g.size(1)
    x = g.T if tall else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def test_a_muon_step_is_the_orthogonalised_nesterov_momentum_and_an_embeddings_step_is_adamws():
    lr, decay, momentum = 0.02, 0.5, 0.95
    model = tz.build_model("llama-tiny")
    config = muon_config(lr=lr, weight_decay=decay, warmup_steps=0, schedule="constant")
    _, optimizers, _ = phase_optimizers(model, config)
    matrix = model.decoder.layers[0].ffn.gate_up.weight  # (256, 64): tall, so it is orthogonalised transposed
    wide = model.decoder.layers[0].ffn.down.weight  # (64, 128)
    table = model.tgt_embed.token.weight
    with torch.no_grad():
        for p in (matrix, wide, table):
            p.mul_(20)  # large weights: the decay is a fifth of each Muon step, and a missing one shows
    start = {id(p): p.detach().clone() for p in (matrix, wide, table)}
    expected = dict(start)
    buffers = {id(p): torch.zeros_like(p) for p in (matrix, wide)}
    first, second = torch.zeros_like(table), torch.zeros_like(table)
    generator = torch.Generator().manual_seed(1)
    for t in (1, 2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        for optimizer in optimizers.values():
            optimizer.step()
        for p in (
            matrix,
            wide,
        ):  # B = mu B + g; Nesterov: O = NS(g + mu B); W <- W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) O
            buffers[id(p)] = momentum * buffers[id(p)] + p.grad
            orthogonal = newton_schulz(p.grad + momentum * buffers[id(p)])
            expected[id(p)] = expected[id(p)] * (1 - lr * decay) - lr * 0.2 * math.sqrt(max(p.shape)) * orthogonal
        # AdamW (Loshchilov & Hutter 2019) at torch's betas (0.9, 0.999) and eps 1e-8
        first = 0.9 * first + 0.1 * table.grad
        second = 0.999 * second + 0.001 * table.grad**2
        step = (first / (1 - 0.9**t)) / ((second / (1 - 0.999**t)).sqrt() + 1e-8)
        expected[id(table)] = expected[id(table)] * (1 - lr * decay) - lr * step
    for p in (matrix, wide):
        # torch orthogonalises in bfloat16: its rounding is about 1% of a step, far below any wrong term
        tolerance = 0.012 * lr * 0.2 * math.sqrt(max(p.shape))
        torch.testing.assert_close(p.detach(), expected[id(p)], rtol=0, atol=tolerance)
        assert (p.detach() - start[id(p)]).abs().max() > 20 * tolerance, "the weights moved far beyond the tolerance"
    torch.testing.assert_close(table.detach(), expected[id(table)], rtol=1e-6, atol=1e-6)


# ---- training and resuming -----------------------------------------------------------------------
def losses(summary) -> list[float]:
    return [row["loss"] for row in summary["history"] if "loss" in row]


def test_training_llama_tiny_with_muon_lowers_the_loss(tmp_path):
    config = muon_config(
        model={"variant": "llama-tiny", "dropout": 0.0}, steps=30, batch_size=16, lr=1e-2, warmup_steps=3, log_every=5
    )
    trainer = Trainer(config, tmp_path, progress=False)
    with trainer.lock():
        summary = trainer.setup().run()
    curve = losses(summary)
    assert curve[-1] < 0.7 * curve[0], curve
    muon = trainer.stepper.optimizers["model.muon"]
    assert all("momentum_buffer" in muon.state[p] for p in muon.param_groups[0]["params"]), "Muon took the steps"
    assert [row["lr"] for row in summary["history"] if "lr" in row][-1] == pytest.approx(
        trainer.stepper.schedulers["model.muon"].get_last_lr()[0]
    )


def test_a_muon_run_resumes_exactly_from_its_checkpoint(tmp_path, monkeypatch):
    config = muon_config(model={"variant": "llama-tiny", "dropout": 0.1}, steps=10, batch_size=8, lr=1e-2, log_every=1)
    straight = train(config, tmp_path / "straight", progress=False)
    assert train(config, tmp_path / "resumed", progress=False, stop_after=4) == {"step": 4, "stopped": True}
    saved = torch.load(tmp_path / "resumed" / "checkpoint" / "optimizer.pt", weights_only=True)
    assert sorted(saved["optimizers"]) == sorted(saved["schedulers"]) == ["model", "model.muon"]
    assert all("momentum_buffer" in state for state in saved["optimizers"]["model.muon"]["state"].values())

    def uncounted(*args, **kwargs):  # the FLOP counter's dispatch changes a step's last bits, which Muon magnifies
        raise AssertionError("a resumed run takes its FLOP count from its checkpoint, counting no step")

    monkeypatch.setattr(Stepper, "counted_step", uncounted)
    resumed = train(config, tmp_path / "resumed", progress=False)
    assert losses(resumed) == losses(straight) and len(losses(straight)) == 10
    assert resumed["train_flops_per_step"] == straight["train_flops_per_step"] > 0
    a, b = (
        safetensors.torch.load_file(str(tmp_path / run / "checkpoint" / "model.safetensors"))
        for run in ("straight", "resumed")
    )
    assert all(torch.equal(a[k], b[k]) for k in a), "resume must continue exactly where it stopped"


@pytest.mark.heavy
def test_muon_under_ddp_follows_the_curve_of_one_process(tmp_path):
    """Two gloo processes under torchrun: DDP averages the gradients, and each process takes the
    same Muon step on its whole copy of every matrix."""
    config = {
        "model": {"variant": "llama-tiny", "dropout": 0.0},
        "task": MEMORISE,
        "optimizer": "muon",
        "steps": 6,
        "batch_size": 8,
        "lr": 1e-2,
        "warmup_steps": 1,
        "log_every": 1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}"]
    command += ["-m", "transformer_zoo", "train", str(path), "--out", str(tmp_path / "ddp"), "--json"]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single = train(load_train_config(config), tmp_path / "one", progress=False)
    assert losses(single)[0] != losses(single)[-1]
    # Muon orthogonalises in bfloat16, where the averaged gradient's last bits can round either way
    torch.testing.assert_close(
        torch.tensor(losses(json.loads(result.stdout))), torch.tensor(losses(single)), rtol=1e-3, atol=1e-4
    )


# ---- refusals ------------------------------------------------------------------------------------
def test_an_unknown_optimizer_and_muon_under_fsdp_are_refused_at_validation():
    with pytest.raises(tz.ConfigError, match=r"optimizer: Input should be 'adamw' or 'muon' \(got 'sgd'\)"):
        muon_config(optimizer="sgd")
    with pytest.raises(
        tz.ConfigError,
        match="optimizer: muon orthogonalises each hidden matrix whole, and parallel: fsdp shards every matrix over "
        "the processes; train with muon in one process or under parallel: ddp, or with optimizer: adamw under fsdp",
    ):
        muon_config(parallel="fsdp")
    assert muon_config(parallel="ddp").optimizer == "muon"


# ---- tuning --------------------------------------------------------------------------------------
def test_a_tuning_space_chooses_between_the_optimizers(tmp_path):
    pytest.importorskip("optuna")
    from transformer_zoo.comparing.spec import load_spec
    from transformer_zoo.comparing.tuning import Tuning

    spec = load_spec(
        {
            "variants": ["llama-tiny"],
            "tasks": [MEMORISE],
            "tune": {"trials": 2, "space": {"train.optimizer": ["adamw", "muon"]}, "sampler": "grid"},
        }
    )
    base = load_train_config({"model": "llama-tiny", "task": MEMORISE, "steps": 4, "batch_size": 4})
    tuning = Tuning(spec.tune, [("llama-tiny", base)], {base.task.name: ("accuracy", "higher")}, tmp_path)
    tuning.check()
    trials = next(tuning.rounds(parallel=2))
    configs = {config.optimizer: config for _, _, config in trials}
    assert sorted(configs) == ["adamw", "muon"]
    assert sorted(trial.params["train.optimizer"] for _, trial, _ in trials) == ["adamw", "muon"]
    trainer = Trainer(configs["muon"], None, progress=False).setup()
    assert sorted(trainer.stepper.optimizers) == ["model", "model.muon"]
