"""Every registered variant builds, trains a step, gives finite outputs of its documented shape,
and survives save_pretrained / from_pretrained with identical outputs."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.model import EncoderDecoder


def example_batch(model: EncoderDecoder) -> tuple[dict, tuple[int, ...], torch.Tensor]:
    """Inputs for a tiny forward pass, the logits' documented shape, and targets for the loss."""
    config = model.config
    batch, src_len, tgt_len = 2, 5, 4
    if config.inputs == "image":
        image = torch.rand(batch, config.channels, *config.image_size)
        return {"image": image}, (batch, config.num_classes), torch.randint(0, config.num_classes, (batch,))
    src = torch.randint(1, config.vocab_size, (batch, src_len))
    out_vocab = config.output_vocab_size
    if model.architecture == "encoder-decoder":
        inputs = {"src": src, "tgt": torch.randint(1, out_vocab, (batch, tgt_len))}
        length = tgt_len
    else:
        inputs = {"src": src}
        length = src_len
    if config.head.kind == "sequence-classification":
        return inputs, (batch, config.head.num_classes), torch.randint(0, config.head.num_classes, (batch,))
    return inputs, (batch, length, out_vocab), torch.randint(1, out_vocab, (batch, length))


def generators() -> list[str]:
    return [name for name in tz.list_variants() if getattr(tz.load_config(name), "objective", "") == "image-generation"]


@pytest.mark.parametrize("name", generators())
def test_generator_builds_trains_each_phase_and_round_trips(name, tmp_path):
    model = tz.build_model(name)
    config = model.config
    labels = torch.arange(2) % config.num_classes
    model.train()
    images = model(labels).logits
    assert images.shape == (2, config.channels, *config.image_size)
    assert torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    real = torch.rand(2, config.channels, *config.image_size)
    phases = model.phases()
    assert sorted(id(p) for phase in phases for p in phase.parameters) == sorted(id(p) for p in model.parameters()), (
        "the phases train every parameter exactly once"
    )
    for phase in phases:
        model.zero_grad()
        model.adversarial_loss(real, labels, phase.name).backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in phase.parameters), phase.name

    model.eval()
    noise = torch.randn(2, config.noise_dim)
    with torch.no_grad():
        expected = model(labels, noise=noise).logits
    model.save_pretrained(tmp_path / name)
    reloaded = tz.from_pretrained(tmp_path / name)
    assert reloaded.config == model.config
    with torch.no_grad():
        assert torch.equal(reloaded(labels, noise=noise).logits, expected)


LARGE = 20_000_000
"""Parameters above which a preset is checked on the meta device: its modules and shapes are a
small sibling's (``transformer-big`` is ``transformer-tiny`` widened), whose real build below
checks the values, so a real build of 100M+ parameters would add only time."""


def _parameters_on_meta(name: str) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in tz.build_model(name).parameters())


TOKEN_VARIANTS = [name for name in tz.list_variants() if name not in generators()]
LARGE_VARIANTS = [name for name in TOKEN_VARIANTS if _parameters_on_meta(name) > LARGE]


def test_the_large_presets_are_the_ones_expected():
    assert {"transformer-big", "bert-base"} <= set(LARGE_VARIANTS)
    assert "transformer-tiny" not in LARGE_VARIANTS


@pytest.mark.parametrize("name", LARGE_VARIANTS)
def test_a_large_preset_builds_and_trains_a_step_on_meta(name):
    with torch.device("meta"):
        model = tz.build_model(name)
        inputs, shape, targets = example_batch(model)
        model.train()
        out = model(**inputs)
        assert out.logits.shape == shape
        model.loss(out, targets).backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters() if p.requires_grad), (
        "every parameter gets a gradient"
    )


@pytest.mark.parametrize("name", [name for name in TOKEN_VARIANTS if name not in LARGE_VARIANTS])
def test_variant_builds_trains_and_round_trips(name, tmp_path):
    model = tz.build_model(name)
    inputs, shape, targets = example_batch(model)
    model.train()
    out = model(**inputs)
    assert out.logits.shape == shape
    assert torch.isfinite(out.logits).all()
    loss = model.loss(out, targets)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), "every parameter gets a finite gradient"

    model.eval()
    with torch.no_grad():
        expected = model(**inputs).logits
    model.save_pretrained(tmp_path / name)
    reloaded = tz.from_pretrained(tmp_path / name)
    assert reloaded.config == model.config
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, expected)
        labelled = reloaded(**inputs, labels=targets, output_attentions=True)  # transformers' names
        torch.testing.assert_close(
            labelled.loss, reloaded.loss(reloaded(**inputs), targets)
        )  # weights asked: the math path
    assert labelled[0] is labelled.loss and labelled["loss"] is labelled.loss and labelled[1] is labelled.logits
    assert labelled.attentions, "output_attentions=True asks for the attention weights, as need_weights=True does"


@pytest.mark.parametrize("name", [name for name in TOKEN_VARIANTS if name not in LARGE_VARIANTS])
def test_every_variant_starts_at_the_loss_of_a_uniform_guess(name):
    """A fresh model's loss on random tokens lies within 25% of ln(V), V its classes: no output
    starts confidently wrong (a tied table drawn at unit scale would, with logits of std sqrt(d))."""
    torch.manual_seed(0)
    model = tz.build_model(name).eval()
    inputs, _, targets = example_batch(model)
    with torch.no_grad():
        logits = model(**inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten())
    assert abs(loss.item() - math.log(logits.size(-1))) <= 0.25 * math.log(logits.size(-1)), (loss.item(), logits.std())


@pytest.mark.parametrize("tied", [True, False])
def test_a_decoder_only_lm_of_unscaled_embeddings_starts_at_a_uniform_guess_tied_or_not(tied):
    """A tied table of unscaled embeddings starts at N(0, 1/d_model), as a scaled one does: at
    nn.Embedding's N(0, 1) its logits had a std of sqrt(d_model), and the loss started near 40."""
    scaled = False
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        vocab_size=68,
        encoder=None,
        norm_placement="pre",
        scale_embeddings=scaled,
        head={"kind": "lm", "tie_weights": tied},
    ).eval()
    ids, targets = torch.randint(1, 68, (2, 8, 32))
    with torch.no_grad():
        loss = model(ids, labels=targets).loss.item()
    assert abs(loss - math.log(68)) <= 0.25 * math.log(68)
