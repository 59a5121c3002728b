"""Bayesian logistic regression as the logistic studies write it: ``w ~ N(0, I)``, ``y ~ Bernoulli(σ(X w))``.

``logistic_austerity`` runs its samplers on it; ``joint_dpm`` uses :func:`logistic_model` for each expert
of its mixture. Both studies' data sets take their ``size`` and ``dim`` from :class:`Design`.
"""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
from torch import Tensor


class Design:
    """``size`` and ``dim`` of a data set whose training inputs are the matrix ``X [N, D]`` (numpy or torch).

    Example:
        >>> import torch
        >>> class Points(Design):
        ...     X = torch.zeros(5, 3)
        >>> Points().size, Points().dim
        (5, 3)
    """

    X: Any

    @property
    def size(self) -> int:
        """Number of training points ``N``."""
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        """Number of columns ``D`` of ``X``: the inputs (with an intercept column where the study adds one)."""
        return int(self.X.shape[1])


def logistic_model(X: Tensor, y: Tensor) -> None:
    """Bayesian logistic regression in Pyro's subsampling idiom (sections = data points).

    The logits are written ``(X[idx] * w).sum(-1)`` rather than ``X[idx] @ w`` so that they
    broadcast a leading batch dimension of ``w`` (``[P, 1, D]`` gives ``[P, k]`` logits): then
    :class:`AusterityMH` evaluates ``θ`` and ``θ'`` of a test stage in one model run.

    Example:
        >>> import torch
        >>> from neuralblock.subsample import SectionEvaluator
        >>> X, y = torch.randn(6, 3), torch.ones(6)
        >>> sections = SectionEvaluator(logistic_model, "data", 6, (X, y))
        >>> sections.check_vectorized({}, {"w": torch.randn(2, 3)})
        True
    """
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(X[idx] * w).sum(-1)), obs=y[idx])


def logistic_model_full(X: Tensor, y: Tensor) -> None:
    """The same model written on the full data (what a user runs with exact MH or NUTS)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)
