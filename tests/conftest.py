"""Shared fixtures. Every test runs on CPU in float32, seeded."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def token_batch(vocab: int, batch: int = 3, length: int = 7, *, low: int = 1) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, length))
