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


def token_batch(vocab: int, batch: int = 3, length: int = 7, *, low: int = 1) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, length))
