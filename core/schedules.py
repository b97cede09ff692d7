"""Learning-rate schedules."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def inverse_sqrt_factor(step: int, d_model: int, warmup_steps: int) -> float:
    """``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (Vaswani et al. 2017, eq. 3), step >= 1."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def inverse_sqrt_warmup(optimizer: Optimizer, d_model: int, warmup_steps: int = 4000) -> LambdaLR:
    """The paper's schedule: linear warm-up for ``warmup_steps``, then decay as ``1/sqrt(step)``.

    The optimizer's learning rate multiplies the factor: set it to 1.0 for the paper's values.
    Step ``n`` of the scheduler is training step ``n + 1``.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be at least 1, got {warmup_steps}")
    return LambdaLR(optimizer, lambda step: inverse_sqrt_factor(step + 1, d_model, warmup_steps))
