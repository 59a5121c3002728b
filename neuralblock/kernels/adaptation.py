"""Warmup adaptation, kept apart from the kernels (as in Pyro's ``adaptation.py``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["StepSizeAdapter"]


class StepSizeAdapter:
    """Per-coordinate Robbins-Monro adaptation of random-walk step sizes.

    During warmup, ``log step += t^-kappa * (accept_prob - target)``; after warmup the
    step sizes freeze. The default target 0.44 is the optimal single-site acceptance
    rate for a Gaussian random walk (Roberts and Rosenthal, 2001).

    Args:
        size: number of coordinates.
        initial: initial step size.
        target: target acceptance probability.
        kappa: decay exponent in (0.5, 1].

    Example:
        >>> adapter = StepSizeAdapter(2)
        >>> adapter.update(torch.tensor([0, 1]), torch.tensor([1.0, 0.0]))
        >>> bool(adapter.step_size[0] > adapter.step_size[1])
        True
    """

    def __init__(self, size: int, initial: float = 0.5, target: float = 0.44, kappa: float = 0.6) -> None:
        if not 0 < target < 1:
            raise ValueError(f"target acceptance must be in (0, 1), got {target}")
        if not initial > 0:
            raise ValueError(f"initial step size must be positive, got {initial}")
        self.log_step = torch.full((size,), math.log(initial))
        self.target, self.kappa = target, kappa
        self.count = torch.zeros(size)

    @property
    def step_size(self) -> Tensor:
        """Current step sizes."""
        return self.log_step.exp()

    def update(self, index: Tensor, accept_prob: Tensor) -> None:
        """Adapt the coordinates in ``index`` from their latest acceptance probabilities."""
        self.count[index] += 1
        rate = self.count[index].pow(-self.kappa)
        self.log_step[index] = (self.log_step[index] + rate * (accept_prob - self.target)).clamp(-12.0, 6.0)
