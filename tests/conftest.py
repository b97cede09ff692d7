"""Shared fixtures. Every test runs on CPU in float32, seeded."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Trained tokenizers go to a folder of this session, not the user's cache."""
    os.environ["TZOO_CACHE"] = str(tmp_path_factory.mktemp("tzoo-cache"))


SPARSE_KINDS = {
    "sliding-window": {"window": 7},
    "dilated": {"kind": "sliding-window", "window": 4, "dilation": 3},
    "dilated-global": {"kind": "local-global", "window": 3, "dilation": 2, "global_positions": [0, 37]},
    "block-local": {"block": 16},
    "local-global": {"window": 5, "global_positions": [0, 37], "global_every": 50},
    "block-sparse": {"block": 16, "window_blocks": 1, "global_blocks": 1, "random_blocks": 2, "seed": 3},
}
"""Options of each sparse attention kind, small enough that a test's lengths are really sparse."""
CAUSAL_KINDS = ["sliding-window", "dilated", "block-local", "local-global", "dilated-global"]
"""The kinds a decoder may use (block-sparse is encoder-only)."""


def sparse_pattern(kind: str, causal: bool = False):
    """The :class:`~transformer_zoo.plugins.local_global.kernels.Pattern` of ``SPARSE_KINDS[kind]``."""
    from dataclasses import replace

    from transformer_zoo.registry import get_registry

    values = {"kind": kind, **SPARSE_KINDS[kind]}
    options = get_registry().component("attention", values["kind"]).model_validate(values)
    return replace(options.pattern(), causal=causal)
