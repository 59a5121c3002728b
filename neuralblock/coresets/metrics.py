"""How close a coreset posterior is to the full one: KL between Gaussians.

Example:
    >>> import torch
    >>> gaussian_kl(torch.zeros(2), torch.eye(2), torch.zeros(2), torch.eye(2))
    0.0
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gaussian_kl"]


def gaussian_kl(mean1: Tensor, cov1: Tensor, mean0: Tensor, cov0: Tensor) -> float:
    """``KL(N(mean1, cov1) || N(mean0, cov0))``, e.g. of Gaussians fitted to coreset and full-data draws.

    Args:
        mean1: ``[D]`` mean of the first (coreset) Gaussian.
        cov1: ``[D, D]`` its covariance.
        mean0: ``[D]`` mean of the reference Gaussian.
        cov0: ``[D, D]`` its covariance.

    Raises:
        ValueError: shapes that do not match.

    Example:
        >>> round(gaussian_kl(torch.ones(1), torch.eye(1), torch.zeros(1), torch.eye(1)), 3)
        0.5
    """
    dim = mean0.shape[-1]
    if mean1.shape != (dim,) or mean0.shape != (dim,) or cov1.shape != (dim, dim) or cov0.shape != (dim, dim):
        raise ValueError(
            f"gaussian_kl needs means [D] and covariances [D, D], got {tuple(mean1.shape)}, {tuple(cov1.shape)}, "
            f"{tuple(mean0.shape)}, {tuple(cov0.shape)}"
        )
    chol0 = torch.linalg.cholesky(cov0)
    diff = torch.cholesky_solve((mean0 - mean1)[:, None], chol0).squeeze(1)
    trace = torch.trace(torch.cholesky_solve(cov1, chol0))
    logdet = 2 * chol0.diagonal().log().sum() - torch.logdet(cov1)
    return float(0.5 * (trace + (mean0 - mean1) @ diff - dim + logdet))
