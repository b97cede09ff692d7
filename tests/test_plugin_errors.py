"""Mistakes inside plugin code are errors that name the plugin (or its class), the kind and what
was expected, as the registration errors do, rather than raw tracebacks from deep inside the zoo:
a ``build`` of the wrong signature, task rows without the keys the task reads, and a positional
bias of the wrong shape."""

from __future__ import annotations

import types
from typing import Literal

import pytest
import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionPositional, MultiHeadAttention
from transformer_zoo.core.errors import PluginLoadError
from transformer_zoo.core.options import NormOptions, PositionalOptions
from transformer_zoo.core.tasks import ClassificationTask, LanguageModelTask, Seq2SeqTask, TaskOptions
from transformer_zoo.registry import get_registry, hookimpl


class NoHeadsOptions(PositionalOptions):
    """A positional kind whose build leaves out n_heads."""

    kind: Literal["no-heads"] = "no-heads"

    def build(self, *, d_model: int, max_len: int) -> nn.Module:
        raise AssertionError("never built")


class EpsNormOptions(NormOptions):
    """A norm kind whose build wants an argument the zoo does not pass."""

    kind: Literal["eps-norm"] = "eps-norm"

    def build(self, *, d_model: int, eps: float) -> nn.Module:
        raise AssertionError("never built")


class SplitTaskOptions(TaskOptions):
    """A task kind whose build wants an argument the zoo does not pass."""

    kind: Literal["split-task"] = "split-task"

    def build(self, split: str):
        raise AssertionError("never built")


@pytest.mark.parametrize(
    ("options", "hook", "expected", "why"),
    [
        (
            NoHeadsOptions,
            "tzoo_components",
            "build(self, *, d_model, n_heads, max_len)",
            "unexpected keyword argument 'n_heads'",
        ),
        (EpsNormOptions, "tzoo_components", "build(self, *, d_model)", "missing a required argument: 'eps'"),
        (SplitTaskOptions, "tzoo_tasks", "build(self)", "missing a required argument: 'split'"),
    ],
)
def test_a_build_of_the_wrong_signature_is_refused_at_registration(options, hook, expected, why):
    plugin = types.ModuleType("wrong_build")
    setattr(plugin, hook, hookimpl(lambda: [options]))
    kind = options.model_fields["kind"].default
    with pytest.raises(PluginLoadError) as raised:
        tz.register_plugin(plugin, "wrong-build")
    message = str(raised.value)
    assert f"plugin 'wrong-build' offers {options.category} kind {kind!r} ({options.__name__})" in message
    assert why in message
    assert message.endswith(f"expected {expected}")
    assert not get_registry().pm.has_plugin("wrong-build")  # nothing of it was registered
    assert kind not in get_registry().components(options.category)


class MQARTask(LanguageModelTask):
    """A language-modelling task whose rows name their tokens 'tokens', not 'ids'."""

    splits = ("train", "test")
    vocab_size = 16
    options = types.SimpleNamespace(kind="mqar")  # as a TaskOptions' build would give it


@pytest.mark.parametrize(
    ("task", "rows", "reads", "missing"),
    [
        (MQARTask(), [{"tokens": [3, 4, 5]}], "'ids'", "'ids'"),
        (Seq2SeqTask(), [{"src": [3, 4], "target": [4, 3]}], "'src', 'tgt'", "'tgt'"),
        (ClassificationTask(), [{"src": [3, 4], "label": 1}, {"src": [3], "class": 0}], "'src', 'label'", "'label'"),
    ],
)
def test_task_rows_without_the_keys_collate_reads_are_named(task, rows, reads, missing):
    with pytest.raises(ValueError) as raised:
        task.collate(rows)
    message = str(raised.value)
    assert f"task {task.name!r} ({type(task).__qualname__} in {type(task).__module__})" in message
    assert f"its collate reads {reads} (missing: {missing})" in message
    assert f"has rows with the keys {', '.join(map(repr, rows[-1]))}" in message


def test_a_batch_without_targets_is_named_before_the_model_runs():
    task = MQARTask()
    with pytest.raises(
        ValueError, match=r"task 'mqar' \(MQARTask\): .*the keys 'tgt', 'tgt_mask', and the loss reads 'targets'"
    ):
        task.loss(nn.Identity(), {"tgt": torch.zeros(1, 2), "tgt_mask": torch.ones(1, 2)})


class TransposedBias(AttentionPositional):
    """A scheme whose bias puts the heads last: ``(Tq, Tk, H)``."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def bias(self, q_len, k_len, device, q_offset=None):
        return torch.zeros(q_len, k_len, self.n_heads, device=device)


class HeadsSecondQueryBias(AttentionPositional):
    """A scheme whose query bias puts the heads second: ``(Tq, H, Tk)``."""

    def query_bias(self, q, k_len, q_offset=None):
        return torch.zeros(q.size(-2), q.size(1), k_len)


@pytest.mark.parametrize(
    ("scheme", "method", "shape"),
    [(TransposedBias(2), "bias", "(5, 5, 2)"), (HeadsSecondQueryBias(), "query_bias", "(5, 2, 5)")],
)
def test_a_positional_bias_of_the_wrong_shape_is_named(scheme, method, shape):
    attention = MultiHeadAttention(16, 2, positional=scheme)
    with pytest.raises(ValueError) as raised:
        attention(torch.randn(3, 5, 16))
    message = str(raised.value)
    assert message.startswith(f"positional scheme {type(scheme).__name__} ({__name__}): {method}() returned")
    assert f"a bias of shape {shape}" in message
    assert "broadcasts to (batch, heads, q_len, k_len) = (3, 2, 5, 5)" in message


@pytest.mark.parametrize("shape", [(5, 5), (2, 5, 5), (1, 5), (3, 2, 5, 5), (3, 1, 1, 5)])
def test_every_bias_that_broadcasts_is_taken(shape):
    class Shaped(AttentionPositional):
        def bias(self, q_len, k_len, device, q_offset=None):
            return torch.zeros(shape, device=device)

    out, _ = MultiHeadAttention(16, 2, positional=Shaped())(torch.randn(3, 5, 16))
    assert out.shape == (3, 5, 16)
