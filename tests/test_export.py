"""Every registered variant exports with ``torch.export``, its batch (and sequence) sizes dynamic,
and the exported program gives the eager model's outputs at sizes other than the traced ones.

Image models keep their image size static: their config fixes it (inputs are checked against
``image_size``, and ViT's positions are one per cell of that grid).
"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
from torch._dynamo.exc import UserError
from torch.export import Dim
from torch.utils._pytree import tree_flatten

import transformer_zoo as tz
from transformer_zoo.core.local_attention import DENSE_UP_TO
from transformer_zoo.core.options import StackOptions
from transformer_zoo.core.output import ModelOutput

NOT_EXPORTABLE: dict[str, str] = {}
"""Variants ``torch.export`` cannot take, with the reason (docs/export.md gives the same table).
Each one is checked to fail, so an entry that starts exporting must leave this list."""

SMALL = dict(
    vocab_size=40,
    d_model=16,
    n_heads=2,
    d_ff=32,
    dropout=0.0,
    widths=[8, 16],
    reduction=4,
    generator_widths=[16, 16, 8],
    discriminator_widths=[8, 16, 16],
    noise_dim=8,
)
"""Sizes that make any variant small; each variant takes the fields its config has."""

BIG_BIRD = {"kind": "block-sparse", "block": 16, "window_blocks": 1, "global_blocks": 1, "random_blocks": 2}
LIMITS: dict[str, tuple[str, dict, int]] = {
    # past DENSE_UP_TO keys the chunked kernel runs: its chunks and gathered keys depend on the length
    "sparse-past-dense-threshold": ("local-global-encoder-tiny", {}, DENSE_UP_TO + 1),
    # BigBird's random blocks are drawn from a seeded generator for each number of blocks
    "block-sparse-dynamic-length": ("local-global-encoder-tiny", {"encoder": {"attention": BIG_BIRD}}, 80),
}
"""Configurations of exportable variants that do not export with a dynamic length, as docs/export.md
says: ``(variant, overrides, length traced)``. Each is checked to fail."""

EXPORT_ERRORS = (UserError, RuntimeError)
"""What ``torch.export`` raises for a size it cannot keep dynamic (a ``UserError``), or for a branch on
tensor values or an op that needs concrete sizes (``RuntimeError``s)."""


def layers(stack: StackOptions) -> int:
    """One layer; two steps of a recurrent stack (so that ACT halts between them); one layer per
    kind of a stack whose layers alternate kinds."""
    return 2 if stack.recurrent else len(stack.attention) if isinstance(stack.attention, list) else 1


def small_config(name: str, **overrides):
    config = tz.load_config(name)
    sizes = {key: value for key, value in SMALL.items() if key in type(config).model_fields}
    if "head_dim" in type(config).model_fields:
        sizes["head_dim"] = None  # d_model / n_heads
    stacks = {
        side: {"layers": layers(stack), "attention": small_heads(stack.attention)}
        for side in ("encoder", "decoder")
        if (stack := getattr(config, side, None)) is not None
    }
    return tz.load_config(name, {**sizes, **stacks, **overrides})


def small_heads(attention):
    """A stack's attention kinds with grouped key/value heads made whole (n_kv_heads: null), so that
    the small sizes' heads divide."""
    kinds = attention if isinstance(attention, list) else [attention]
    dumped = [{**kind.model_dump(mode="json"), "n_kv_heads": None} for kind in kinds]
    return dumped if isinstance(attention, list) else dumped[0]


def small_model(name: str, **overrides) -> torch.nn.Module:
    return tz.build_model(small_config(name, **overrides)).eval()


def by_model() -> dict[str, str]:
    """Every registered variant, by the variants that export as the same model once made small
    (``transformer``, ``-base`` and ``-big`` differ only in sizes): one export covers them all."""
    groups: dict[str, list[str]] = {}
    for name in tz.list_variants():
        groups.setdefault(small_config(name).model_dump_json(exclude={"variant"}), []).append(name)
    return {",".join(names): names[0] for names in groups.values()}


def example(model: torch.nn.Module, batch: int, length: int) -> dict[str, torch.Tensor]:
    """Keyword inputs of ``batch`` examples; token models get ``length`` source tokens (one fewer
    target tokens) and a padding mask that hides the end of the first sequence."""
    config = model.config
    if getattr(config, "objective", "") == "image-generation":
        return {"label": torch.arange(batch) % config.num_classes, "noise": torch.randn(batch, config.noise_dim)}
    if config.inputs == "image":
        return {"image": torch.rand(batch, config.channels, *config.image_size)}
    inputs = {}
    sides = ("src", "tgt") if model.architecture == "encoder-decoder" else ("src",)
    for side, size in zip(sides, (length, length - 1)):
        mask = torch.ones(batch, size, dtype=torch.long)
        mask[0, size // 2 :] = 0
        inputs |= {side: torch.randint(1, config.vocab_size, (batch, size)), f"{side}_mask": mask}
    return inputs


def dynamic_shapes(inputs: dict[str, torch.Tensor]) -> dict[str, dict[int, Dim]]:
    """Every size of integer inputs dynamic (labels ``(B,)``, ids and masks ``(B, T)``), and the
    batch of float ones (images and noise keep their configured sizes)."""
    return {
        key: {dim: Dim.DYNAMIC for dim in range(value.dim() if value.dtype == torch.long else 1)}
        for key, value in inputs.items()
    }


def assert_same(out: ModelOutput, expected: ModelOutput) -> None:
    """The same fields, extras and auxiliary loss, each tensor within 1e-5: logits, hidden, then the rest."""
    assert isinstance(out, ModelOutput)
    leaves, spec = tree_flatten(out)
    expected_leaves, expected_spec = tree_flatten(expected)
    assert spec == expected_spec
    for leaf, expected_leaf in zip(leaves, expected_leaves, strict=True):
        torch.testing.assert_close(leaf, expected_leaf, atol=1e-5, rtol=0)


def export(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.export.ExportedProgram:
    return torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes(inputs))


EXPORTS = by_model()


@pytest.mark.parametrize("name", list(EXPORTS.values()), ids=list(EXPORTS))
def test_variant_exports_with_dynamic_shapes(name):
    model = small_model(name)
    if name in NOT_EXPORTABLE:
        with pytest.raises(EXPORT_ERRORS):
            export(model, example(model, batch=2, length=6))
        return
    program = export(model, example(model, batch=2, length=6))
    inputs = example(model, batch=3, length=9)
    with torch.no_grad():
        out, expected = program.module()(**inputs), model(**inputs)
    assert_same(out, expected)


def test_act_runs_every_step_when_exported_with_the_eager_outputs():
    """Eager ACT stops once every position has halted; an exported program cannot branch on that,
    so it runs the remaining steps, which change nothing."""
    model = small_model("universal-transformer-encoder-tiny", encoder={"layers": 3, "threshold": 0.1})
    program = export(model, example(model, batch=2, length=6))
    inputs = example(model, batch=3, length=9)
    with torch.no_grad():
        out, expected = program.module()(**inputs), model(**inputs)
    assert (expected.extras["encoder_ponder_time"] <= 2).all(), "every position halts at the first step (N = R = 1)"
    assert_same(out, expected)


def test_an_exported_program_saves_and_loads_with_its_output_type():
    model = small_model("universal-transformer-encoder-tiny")
    inputs = example(model, batch=2, length=6)
    buffer = io.BytesIO()
    torch.export.save(export(model, inputs), buffer)
    buffer.seek(0)
    out = torch.export.load(buffer).module()(**inputs)
    assert isinstance(out, ModelOutput) and out.keys() == ["logits", "hidden", "aux_loss", "extras"]
    torch.testing.assert_close(out.logits, model(**inputs).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("limit", LIMITS)
def test_a_documented_limit_still_holds(limit):
    name, overrides, length = LIMITS[limit]
    model = small_model(name, **overrides)
    with pytest.raises(EXPORT_ERRORS):
        export(model, {"src": torch.randint(1, 40, (2, length))})


def test_a_saved_program_loads_in_a_fresh_process_after_importing_the_package_alone(tmp_path):
    """ModelOutput is a pytree node torch must know to read a program back: ``import transformer_zoo``
    registers it once torch is imported, whichever of the two comes first."""
    model = tz.build_model("transformer-tiny", vocab_size=40, d_model=16, n_heads=2, d_ff=32, dropout=0.0).eval()
    src, tgt = torch.randint(1, 40, (2, 7)), torch.randint(1, 40, (2, 5))
    torch.export.save(torch.export.export(model, (), {"src": src, "tgt": tgt}), tmp_path / "program.pt2")
    torch.save({"src": src, "tgt": tgt, "logits": model(src, tgt).logits}, tmp_path / "io.pt")
    for imports in ("import transformer_zoo\nimport torch", "import torch\nimport transformer_zoo"):
        code = (
            f"{imports}\nimport sys\n"
            f"program = torch.export.load({str(tmp_path / 'program.pt2')!r})\n"
            f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
            "out = program.module()(src=io['src'], tgt=io['tgt'])\n"
            "assert type(out).__name__ == 'ModelOutput', type(out)\n"
            "assert torch.allclose(out.logits, io['logits'], atol=1e-5)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
