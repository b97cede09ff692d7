"""On a CUDA GPU: every variant trains in float32 and under bfloat16 autocast; the sparse kernels
equal the dense reference; cached decoding equals uncached; a compiled run follows the eager
curve; checkpoints move from GPU to CPU; ``compare`` measures CUDA memory; and NCCL jobs under
torchrun (DDP and FSDP) train, resume and continue their curve.

Marked ``cuda`` and skipped where CUDA is absent: ``python -m pytest -m cuda`` runs them alone.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import CAUSAL_KINDS, SPARSE_KINDS, sparse_pattern
from test_all_variants import example_batch, generators

import transformer_zoo as tz
from transformer_zoo.core.decoding import DecodeStep, greedy_decode
from transformer_zoo.core.local_attention import flex_attention_kernel
from transformer_zoo.plugins.local_global.kernels import chunked_attention, dense_attention
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.step import trains_only
from transformer_zoo.training.trainer import train

sys.path.insert(0, str(Path(__file__).parent / "training"))  # the torchrun helpers live beside their tests
from test_distributed import curve, torchrun

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
BF16_TOLERANCE = 2e-2
"""Largest relative error ``||out - ref|| / ||ref||`` of a bfloat16 kernel against the float32
reference: bf16 keeps 8 bits of mantissa (a rounding of 2^-8, 0.4%, per operation), and its
inputs are rounded too; elementwise bounds would fail on a few large entries."""


def _on_cuda(value):
    return {k: v.to(CUDA) for k, v in value.items()} if isinstance(value, dict) else value.to(CUDA)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", tz.list_variants())
def test_every_variant_takes_a_finite_training_step(name, bf16):
    model = tz.build_model(name).to(CUDA).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    phases = model.phases()
    optimizers = {phase.name: torch.optim.AdamW(phase.parameters, lr=1e-3) for phase in phases}
    if name in generators():
        config = model.config
        labels = (torch.arange(4) % config.num_classes).to(CUDA)
        real = torch.rand(4, config.channels, *config.image_size, device=CUDA)

        def loss_of(phase):
            return model.adversarial_loss(real, labels, phase.name)
    else:
        inputs, shape, targets = example_batch(model)
        inputs, targets = _on_cuda(inputs), _on_cuda(targets)

        def loss_of(phase):
            out = model(**inputs)
            assert out.logits.shape == shape and torch.isfinite(out.logits).all()
            if bf16 and model.config.inputs == "tokens":
                assert out.logits.dtype == torch.bfloat16, "autocast ran the head in bfloat16"
            return model.loss(out, targets)

    for phase in phases:  # as training runs them: each phase with the others frozen
        with trains_only(phase.parameters, model), torch.autocast(CUDA.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(phase)
        assert torch.isfinite(loss), f"{phase.name} loss {loss.item()}"
        loss.backward()
        grads = [p.grad for p in phase.parameters if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), phase.name
        optimizers[phase.name].step()
        optimizers[phase.name].zero_grad(set_to_none=True)
    after = dict(model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(before[n], p) for n, p in after.items()), "the optimizer step moved the weights"


def _qkv(length: int, dtype: torch.dtype, requires_grad: bool = True) -> list[torch.Tensor]:
    generator = torch.Generator(device=CUDA).manual_seed(0)
    return [
        torch.randn(2, 2, length, 16, device=CUDA, dtype=dtype, generator=generator).requires_grad_(requires_grad)
        for _ in range(3)
    ]


def _padding(length: int) -> torch.Tensor:
    padding = torch.ones(2, length, dtype=torch.bool, device=CUDA)
    padding[1, length - 30 :] = False  # some queries of row 1 see no key: their output is zero
    return padding


def _reference(kind: str, causal: bool, length: int, padding: torch.Tensor):
    """The dense masked reference in float32: output and gradients for a fixed output gradient."""
    q, k, v = _qkv(length, torch.float32)
    out, _ = dense_attention(q, k, v, sparse_pattern(kind, causal), padding)
    grad = torch.randn(out.shape, device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(1))
    return out.detach(), torch.autograd.grad((out * grad).sum(), (q, k, v)), grad


def _check(kernel, kind: str, causal: bool, dtype: torch.dtype) -> None:
    length = 203  # not a multiple of any window, block or FlexAttention's block of 128
    pad = _padding(length)
    expected, expected_grads, grad = _reference(kind, causal, length, pad)
    q, k, v = _qkv(length, dtype)
    out = kernel(q, k, v, sparse_pattern(kind, causal), pad)
    grads = torch.autograd.grad((out * grad.to(dtype)).sum(), (q, k, v))
    for mine, theirs in zip((out, *grads), (expected, *expected_grads)):
        if dtype == torch.float32:
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
        else:
            error = ((mine.float() - theirs).norm() / theirs.norm()).item()
            assert error <= BF16_TOLERANCE, f"relative error {error:.2e} in bfloat16"


CASES = [(kind, False) for kind in SPARSE_KINDS] + [(kind, True) for kind in CAUSAL_KINDS]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "loop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("kind", "causal"), CASES)
def test_chunked_kernel_equals_the_dense_reference(kind, causal, dtype, batched):
    """Every chunk in one call (the GPU's default) and the loop over chunks."""
    _check(lambda *args: chunked_attention(*args, batched=batched), kind, causal, dtype)


@pytest.mark.parametrize(
    ("kind", "causal", "dtype"),
    [(kind, causal, torch.float32) for kind, causal in CASES]
    + [(kind, False, torch.bfloat16) for kind in ("sliding-window", "local-global", "block-sparse")],
)
def test_compiled_flex_attention_equals_the_dense_reference(kind, causal, dtype):
    torch._dynamo.reset()  # each pattern compiles afresh: none falls back to the unfused path at the recompile limit
    _check(lambda *args: flex_attention_kernel(*args, compiled=True), kind, causal, dtype)


def test_a_sparse_model_on_cuda_takes_flex_attention_at_every_length_without_recompiling_each():
    """``backend: auto`` picks compiled FlexAttention on CUDA (no dropout); batches padded to many
    lengths must not recompile once per length (dynamo's limit would send them to the unfused path)."""
    from torch._dynamo.utils import counters

    model = tz.build_model("local-global-encoder-tiny", dropout=0.0).to(CUDA).eval()
    chunked = tz.build_model(model.config, encoder={"attention": {"kind": "local-global", "backend": "chunked"}})
    chunked.load_state_dict(model.state_dict())
    chunked.to(CUDA).eval()
    assert model.encoder.layers[0].self_attn.kernel.choose(1000, CUDA) == "flex"
    counters.clear()
    with torch.no_grad():
        for length in (200, 333, 517, 640, 701, 902, 1003, 1200, 1333, 1500):
            src = torch.randint(4, model.config.vocab_size, (2, length), device=CUDA)
            mask = torch.ones_like(src)
            mask[1, length // 2 :] = 0
            torch.testing.assert_close(
                model(src=src, src_mask=mask).logits, chunked(src=src, src_mask=mask).logits, atol=1e-4, rtol=1e-4
            )
    graphs = counters["stats"]["unique_graphs"]
    assert 0 < graphs <= 8, f"{graphs} graphs compiled for 10 lengths"


def _captures(monkeypatch) -> list:
    """Counts the decoding steps captured as CUDA graphs."""
    captured = []
    capture = DecodeStep._capture
    monkeypatch.setattr(DecodeStep, "_capture", lambda self, tokens: (captured.append(1), capture(self, tokens)))
    return captured


def _decoder_case(positional: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A tiny untied encoder-decoder on CUDA, and a padded batch of sources with their mask."""
    model = (
        tz.build_model(
            "transformer-tiny",
            positional=positional,
            vocab_size=60,
            d_model=32,
            n_heads=4,
            d_ff=64,
            dropout=0.0,
            head={"tie_weights": False},
        )
        .to(CUDA)
        .eval()
    )
    src = torch.randint(3, 60, (4, 9), device=CUDA)
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    return model, src, src_mask


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "alibi"])
def test_cached_greedy_decoding_equals_uncached(positional, monkeypatch):
    """On CUDA the default is the static cache with each step replayed as a CUDA graph; the
    dynamic cache and no cache give the same tokens."""
    model, src, src_mask = _decoder_case(positional)
    captured = _captures(monkeypatch)
    cached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20)
    assert captured == [1], "the static cache's step was captured once and replayed"
    dynamic = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, static_cache=False)
    uncached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=20, use_cache=False)
    assert len(set(cached[:, 1:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, uncached)
    assert torch.equal(dynamic, uncached)


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "alibi"])
def test_graphed_beam_search_equals_the_dynamic_cache(positional, monkeypatch):
    from transformer_zoo.core.decoding import beam_search

    model, src, src_mask = _decoder_case(positional)
    captured = _captures(monkeypatch)
    static, static_scores = beam_search(model, src, src_mask, bos_id=1, eos_id=2, beam_size=4, max_new_tokens=20)
    assert len(captured) == 2, "beam search and its greedy candidate each replay a captured step"
    dynamic, dynamic_scores = beam_search(
        model, src, src_mask, bos_id=1, eos_id=2, beam_size=4, max_new_tokens=20, static_cache=False
    )
    assert torch.equal(static, dynamic)
    torch.testing.assert_close(static_scores, dynamic_scores, atol=1e-4, rtol=1e-4)


def test_a_graphed_step_under_bf16_autocast_replays_what_it_computes_as_written():
    """The captured step (autocast's weight cache off while capturing) against the same static
    cache stepped as written: the same kernels, so the same logits, bit for bit."""
    from transformer_zoo.core.cache import StaticDecoderCache

    model = (
        tz.build_model(
            "transformer-tiny", vocab_size=60, d_model=64, n_heads=4, d_ff=128, dropout=0.0, head={"tie_weights": False}
        )
        .to(CUDA)
        .eval()
    )
    src = torch.randint(3, 60, (8, 9), device=CUDA)
    runs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        memory = model.encode(src).hidden
        for graph in (True, False):
            step = DecodeStep(model, memory, None, StaticDecoderCache(31, CUDA), graph=graph)
            token, logits = torch.ones(8, 1, dtype=torch.long, device=CUDA), []
            for _ in range(30):
                out = step(token)
                logits.append(out.float().clone())
                token = out.argmax(-1)
            runs.append(torch.cat(logits, dim=1))
    assert runs[0].dtype == torch.float32 and torch.isfinite(runs[0]).all()
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_flex_block_masks_are_reused_and_never_for_another_padding():
    from transformer_zoo.core.local_attention import BLOCK_MASKS

    p = sparse_pattern("local-global")
    q, k, v = (t.detach() for t in _qkv(203, torch.float32))
    pad = _padding(203)
    BLOCK_MASKS.clear()
    built = BLOCK_MASKS.built
    with torch.no_grad():
        first = flex_attention_kernel(q, k, v, p, pad)
        again = flex_attention_kernel(q, k, v, p, pad)
        assert BLOCK_MASKS.built == built + 1, "the second call reused the first's mask"
        BLOCK_MASKS.clear()
        fresh = flex_attention_kernel(q, k, v, p, pad)
        torch.testing.assert_close(again, first, rtol=0, atol=0)
        torch.testing.assert_close(fresh, first, rtol=0, atol=0)
        other = torch.ones_like(pad)
        other[0, 50:] = False
        out = flex_attention_kernel(q, k, v, p, other)
        assert BLOCK_MASKS.built == built + 3
        expected, _ = dense_attention(q, k, v, p, other)
        torch.testing.assert_close(out[0, :, :50], expected[0, :, :50], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[1], expected[1], atol=1e-4, rtol=1e-4)


RUN = {
    "model": {"variant": "transformer-tiny", "d_model": 64, "n_heads": 4, "d_ff": 128, "dropout": 0.0},
    "task": {
        "kind": "reverse",
        "train_size": 2000,
        "test_size": 50,
        "train_lengths": [1, 10],
        "test_lengths": [11, 12],
    },
    "batch_size": 32,
    "lr": 3e-3,
    "warmup_steps": 10,
    "log_every": 1,
    "device": "cuda",
}
COMPILED_TOLERANCE = {"bf16": 3e-2, "fp32": 1e-3}
"""Largest relative gap allowed between a compiled and an eager run's loss at any of 50 steps:
the compiled kernels fuse and order sums differently, and the gaps compound over the steps."""


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_compiled_run_follows_the_eager_curve_for_50_steps(tmp_path, precision):
    config = {**RUN, "steps": 50, "bf16": precision == "bf16"}
    eager = train(load_train_config(config), tmp_path / "eager", progress=False)
    compiled = train(load_train_config({**config, "compile": True}), tmp_path / "compiled", progress=False)
    eager_curve, compiled_curve = curve(eager), curve(compiled)
    assert len(eager_curve) == 50 and eager_curve[-1] < 0.8 * eager_curve[0], "the run learns"
    gap = ((compiled_curve - eager_curve).abs() / eager_curve).max().item()
    print(f"{precision}: largest relative gap {gap:.2e}")
    assert gap <= COMPILED_TOLERANCE[precision]
    assert compiled["mfu"] is None or 0 < compiled["mfu"] < 1


def test_a_run_on_cuda_resumes_exactly_with_dropout(tmp_path):
    """The checkpoint keeps the CUDA generator's state, from which dropout draws on the GPU."""
    config = load_train_config({**RUN, "model": {**RUN["model"], "dropout": 0.1}, "steps": 12, "checkpoint_every": 6})
    whole = train(config, tmp_path / "whole", progress=False)
    train(config, tmp_path / "halves", progress=False, stop_after=6)
    torch.manual_seed(123)  # what ran in between must not matter
    torch.rand(5, device=CUDA)
    resumed = train(config, tmp_path / "halves", progress=False)
    torch.testing.assert_close(curve(resumed), curve(whole), rtol=1e-5, atol=1e-6)


def test_saved_on_gpu_loads_on_cpu(tmp_path):
    model = tz.build_model("bert-tiny").to(CUDA).eval()
    src = torch.randint(4, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        expected = model(src=src.to(CUDA)).logits.cpu()
    model.save_pretrained(tmp_path / "bert")
    loaded = tz.from_pretrained(tmp_path / "bert")
    assert next(loaded.parameters()).device.type == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(loaded(src=src).logits, expected, atol=1e-4, rtol=1e-4)

    # a training run's checkpoint and model, written on the GPU, resume and load on the CPU
    config = {**RUN, "steps": 4, "checkpoint_every": 2}
    train(load_train_config(config), tmp_path / "run", progress=False, stop_after=2)
    resumed = train(load_train_config({**config, "device": "cpu"}), tmp_path / "run", progress=False)
    assert resumed["step"] == 4 and len(curve(resumed)) == 4
    assert next(tz.from_pretrained(tmp_path / "run" / "model").parameters()).device.type == "cpu"


def test_compare_runs_on_cuda_and_records_cuda_memory(tmp_path):
    from transformer_zoo.comparing.runner import compare
    from transformer_zoo.comparing.spec import load_spec

    spec = load_spec(
        {
            "name": "cuda",
            "variants": ["transformer-tiny", "local-global-encoder-tiny"],
            "tasks": [{"kind": "listops", "train_size": 200, "test_size": 20, "max_length": 32}],
            "steps": 4,
            "seeds": [0, 1],
            "train": {"batch_size": 8, "device": "cuda"},
            "scaling": {"lengths": [256, 1024], "repeats": 1},
        }
    )
    results = compare(spec, tmp_path / "report")
    assert results.machine["device"] == torch.cuda.get_device_name()
    assert len(results.runs) == 4
    for run in results.runs:
        # CUDA's allocator peak of a small model, not the process's resident set (hundreds of MB with CUDA)
        assert 0 < run.peak_memory_mb < 200, run.peak_memory_mb
    points = {(p.variant, p.attention, p.length, p.mode): p for p in results.scaling}
    assert all(p.error is None and p.seconds > 0 and p.peak_mb > 0 for p in points.values())
    sparse = points[("local-global-encoder-tiny", "as configured", 1024, "forward")]
    math = points[("local-global-encoder-tiny", "math", 1024, "forward")]
    assert sparse.peak_mb < math.peak_mb, "the n x n weights of the written-out formula take more CUDA memory"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_one_gpu_torchrun_job_trains_over_nccl_resumes_and_continues_the_curve(tmp_path, parallel):
    config = {**RUN, "schedule": "constant", "parallel": parallel, "steps": 8, "checkpoint_every": 4}
    first = torchrun(tmp_path, config, tmp_path / "job", processes=1)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    assert summary["parallel"] == parallel and summary["processes"] == 1, "trained through DDP or FSDP"
    shutil.copytree(tmp_path / "job", tmp_path / "alone")
    resumed = torchrun(tmp_path, {**config, "steps": 12}, tmp_path / "job", processes=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = torchrun(tmp_path, {**config, "steps": 12}, tmp_path / "whole", processes=1)
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed_curve, whole_curve = curve(json.loads(resumed.stdout)), curve(json.loads(whole.stdout))
    assert len(resumed_curve) == 12
    torch.testing.assert_close(resumed_curve[:8], curve(summary), rtol=0, atol=0)
    torch.testing.assert_close(resumed_curve, whole_curve, rtol=1e-3, atol=1e-4)
    # and the checkpoint resumes in a plain process, on one GPU
    alone = train(load_train_config({**config, "steps": 12}), tmp_path / "alone", progress=False)
    torch.testing.assert_close(curve(alone), whole_curve, rtol=1e-3, atol=1e-4)
