"""Estimators of the false-posterior density p̃_f used inside the swapped density.

Every estimator is a :class:`FalsePosteriorDensity` over a flat vector of dimension ``dim``
with a batched ``log_prob(x [..., dim]) -> [...]``. Fitted estimators live on the flat
*unconstrained* vector ``z`` (see :class:`~neuralblock.pyro.layout.FlatLayout`);
:class:`ExactPosterior` wraps a user's closed-form density, stated on the constrained values
(``space="constrained"``, the default) or on ``z``.

* :class:`GaussianFit`: a full-covariance Gaussian fitted to the draws.
* :class:`GaussianMixtureFit`: a Gaussian mixture fitted by EM (vectorized torch).
* :class:`SemiparametricFit`: a parametric fit times a nonparametric correction (Hjort and Glad,
  1995, as used by Neiswanger and Xing, 2017):
  ``p̂(x) = f(x) * (1/T) sum_t K_H(x - x_t) / f(x_t)`` with a Gaussian kernel of covariance
  ``H = h^2 * Cov(x)``, ``h = T^(-1/(d+4))`` (Scott) unless given. It tends to the true density
  as ``T`` grows and ``h`` shrinks, with the parametric fit carrying the shape between draws.

References:
    W. Neiswanger and E. Xing, "Post-Inference Prior Swapping", ICML 2017.
    N. L. Hjort and I. K. Glad, "Nonparametric density estimation with a parametric start",
    Annals of Statistics 23(3), 1995.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.distributions import Distribution, MultivariateNormal

__all__ = [
    "ExactPosterior",
    "FalsePosteriorDensity",
    "GaussianFit",
    "GaussianMixtureFit",
    "SemiparametricFit",
    "fit_false_posterior",
]

Space = Literal["constrained", "unconstrained"]


def _check_draws(samples: Tensor, minimum: int, what: str) -> Tensor:
    if not isinstance(samples, Tensor) or samples.dim() != 2:
        raise TypeError(f"{what} expects draws as a Tensor [T, D], got {getattr(samples, 'shape', type(samples))}")
    if samples.shape[0] < minimum:
        raise ValueError(
            f"{what} needs at least {minimum} draws for dimension {samples.shape[1]}, got {samples.shape[0]} (too few)"
        )
    if not torch.isfinite(samples).all():
        raise ValueError(f"{what}: draws contain non-finite values")
    return samples.to(torch.get_default_dtype()) if not samples.is_floating_point() else samples


def _mean_cov(x: Tensor, weights: Tensor | None = None, jitter: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Weighted mean and covariance (rows of ``x``), with a relative ridge for stability."""
    if weights is None:
        weights = x.new_full((x.shape[0],), 1.0 / x.shape[0])
    mean = weights @ x
    centred = x - mean
    cov = (centred * weights[:, None]).T @ centred
    ridge = jitter * (cov.diagonal().mean().clamp(min=1e-300))
    return mean, cov + ridge * torch.eye(x.shape[1], dtype=x.dtype)


def gaussian_log_prob(x: Tensor, loc: Tensor, scale_tril: Tensor) -> Tensor:
    """``log N(x; loc, L Lᵀ)`` of ``x [..., D]``: one batched triangular solve, no validation.

    The hot path of every Gaussian estimate (a swap chain evaluates it once per step or angle
    batch); it equals ``MultivariateNormal(loc, scale_tril=L).log_prob(x)``.

    Example:
        >>> x, loc, tril = torch.randn(5, 3), torch.zeros(3), torch.eye(3) * 2.0
        >>> torch.allclose(gaussian_log_prob(x, loc, tril), MultivariateNormal(loc, scale_tril=tril).log_prob(x))
        True
    """
    batch = x.shape[:-1]
    diff = (x - loc).reshape(-1, loc.numel())
    white = torch.linalg.solve_triangular(scale_tril.to(diff.dtype), diff.T, upper=False)
    half_log_det = scale_tril.diagonal().log().sum()
    maha = (white * white).sum(0).reshape(batch)
    return -0.5 * (maha + loc.numel() * math.log(2.0 * math.pi)) - half_log_det


class FalsePosteriorDensity(ABC):
    """A (possibly unnormalized) density of the false posterior over a flat vector.

    Attributes:
        dim: the flat dimension ``D``.
        space: ``"unconstrained"`` (on ``z``, what fitted estimators use) or ``"constrained"``.
    """

    dim: int
    space: Space = "unconstrained"

    @abstractmethod
    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of ``x [..., D]``, returns ``[...]``."""

    def scale_tril(self) -> Tensor | None:
        """A Cholesky factor of the density's covariance (a preconditioner), if known."""
        return None

    def sample(self, num: int) -> Tensor:
        """``num`` draws ``[num, D]`` (for independence proposals); not every estimate can be sampled."""
        raise ValueError(f"{type(self).__name__} cannot be sampled; use a Gaussian or Gaussian-mixture estimate")


class ExactPosterior(FalsePosteriorDensity):
    """A false posterior known in closed form (e.g. a conjugate posterior).

    Args:
        density: a distribution with event shape ``[D]`` (or scalar for ``D = 1``), or a callable
            ``log_prob(x [..., D]) -> [...]``.
        dim: flat dimension (read from the distribution when omitted).
        space: whether ``density`` is stated on the constrained values (default) or on ``z``.

    Example:
        >>> post = ExactPosterior(torch.distributions.Normal(1.0, 0.5))
        >>> post.dim, post.log_prob(torch.ones(3, 1)).shape
        (1, torch.Size([3]))
    """

    def __init__(
        self,
        density: Distribution | Callable[[Tensor], Tensor],
        dim: int | None = None,
        space: Space = "constrained",
    ) -> None:
        if space not in ("constrained", "unconstrained"):
            raise ValueError(f"space must be 'constrained' or 'unconstrained', got {space!r}")
        self.space = space
        self.density = density
        if isinstance(density, Distribution):
            event = density.event_shape
            if len(event) > 1 or density.batch_shape != torch.Size():
                raise ValueError(f"ExactPosterior needs a distribution over a flat vector, got event shape {event}")
            self._scalar = len(event) == 0
            found = 1 if self._scalar else event[0]
            if dim is not None and dim != found:
                raise ValueError(f"dim={dim} does not match the distribution's dimension {found}")
            self.dim = found
        elif callable(density):
            if dim is None:
                raise ValueError("ExactPosterior with a callable density needs dim")
            self._scalar = False
            self.dim = int(dim)
        else:
            raise TypeError(f"density must be a Distribution or a callable, got {type(density).__name__}")

    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of ``x [..., D]``."""
        if isinstance(self.density, MultivariateNormal):
            return gaussian_log_prob(x, self.density.loc, self.density.scale_tril)
        if isinstance(self.density, Distribution):
            return self.density.log_prob(x[..., 0] if self._scalar else x)
        return self.density(x)

    def scale_tril(self) -> Tensor | None:
        """The covariance factor of a Gaussian density (else ``None``)."""
        dist = self.density
        if isinstance(dist, MultivariateNormal):
            return dist.scale_tril
        if isinstance(dist, torch.distributions.Normal) and self._scalar:
            return dist.scale.reshape(1, 1)
        return None

    def sample(self, num: int) -> Tensor:
        """Draws ``[num, D]`` of a distribution density (a callable density cannot be sampled)."""
        if not isinstance(self.density, Distribution):
            raise ValueError("an ExactPosterior given as a callable log density cannot be sampled")
        return self.density.sample((num,)).reshape(num, self.dim)


class GaussianFit(FalsePosteriorDensity):
    """A full-covariance Gaussian fitted to false-posterior draws.

    Args:
        samples: draws ``[T, D]`` with ``T >= D + 1``.
        jitter: ridge added to the covariance, relative to its mean variance.

    Example:
        >>> fit = GaussianFit(torch.randn(200, 2) + 3.0)
        >>> bool((fit.mean - 3.0).abs().max() < 0.5)
        True
    """

    def __init__(self, samples: Tensor, jitter: float = 1e-6) -> None:
        samples = _check_draws(samples, samples.shape[-1] + 1 if samples.dim() == 2 else 2, "GaussianFit")
        self.dim = samples.shape[1]
        self.mean, cov = _mean_cov(samples, jitter=jitter)
        self.dist = MultivariateNormal(self.mean, covariance_matrix=cov, validate_args=False)

    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of ``x [..., D]``."""
        return gaussian_log_prob(x, self.mean, self.dist.scale_tril)

    def scale_tril(self) -> Tensor:
        """Cholesky factor of the fitted covariance."""
        return self.dist.scale_tril

    def sample(self, num: int) -> Tensor:
        """Draws ``[num, D]`` from the fitted Gaussian."""
        return self.dist.sample((num,))


class GaussianMixtureFit(FalsePosteriorDensity):
    """A full-covariance Gaussian mixture fitted by EM (vectorized over draws and components).

    Initialised with k-means++ seeding drawn from a private generator (``seed``), so a fit is
    reproducible without touching the global RNG.

    Args:
        samples: draws ``[T, D]`` with ``T >= num_components * (D + 1)``.
        num_components: mixture size ``K``.
        num_iters: maximum EM iterations.
        tol: stop when the mean log-likelihood improves by less than this.
        jitter: relative covariance ridge.
        seed: seed of the initialisation.

    Example:
        >>> x = torch.cat([torch.randn(150, 1) - 4.0, torch.randn(150, 1) + 4.0])
        >>> fit = GaussianMixtureFit(x, num_components=2)
        >>> sorted(round(m) for m in fit.means[:, 0].tolist())
        [-4, 4]
    """

    def __init__(
        self,
        samples: Tensor,
        num_components: int = 3,
        num_iters: int = 200,
        tol: float = 1e-6,
        jitter: float = 1e-6,
        seed: int = 0,
    ) -> None:
        if num_components < 1:
            raise ValueError(f"num_components must be >= 1, got {num_components}")
        dim = samples.shape[-1] if samples.dim() == 2 else 1
        x = _check_draws(samples, num_components * (dim + 1), "GaussianMixtureFit")
        self.dim = dim
        gen = torch.Generator().manual_seed(seed)
        means = self._seed(x, num_components, gen)
        _, cov = _mean_cov(x, jitter=jitter)
        covs = cov.expand(num_components, dim, dim).clone()
        log_w = torch.full((num_components,), -math.log(num_components), dtype=x.dtype)
        previous = -math.inf
        self.num_iters = 0
        for _ in range(num_iters):  # EM iterations (not a loop over draws)
            comp = MultivariateNormal(means, covariance_matrix=covs)
            joint = log_w + comp.log_prob(x[:, None, :])  # [T, K]
            norm = joint.logsumexp(-1)
            current = float(norm.mean())
            resp = (joint - norm[:, None]).exp()  # [T, K]
            nk = resp.sum(0) + 1e-10
            log_w = (nk / nk.sum()).log()
            means = (resp.T @ x) / nk[:, None]
            centred = x[None, :, :] - means[:, None, :]  # [K, T, D]
            covs = torch.einsum("kt,ktd,kte->kde", resp.T, centred, centred) / nk[:, None, None]
            # relative to each component's scale, floored by a small fraction of the draws' overall scale: a
            # component that collapses onto repeated draws (a stuck chain's) keeps a positive definite covariance
            floor = 1e-3 * float(cov.diagonal().mean())
            ridge = jitter * covs.diagonal(dim1=-2, dim2=-1).mean(-1).clamp(min=floor)
            covs = covs + ridge[:, None, None] * torch.eye(dim, dtype=x.dtype)
            self.num_iters += 1
            if current - previous < tol:
                break
            previous = current
        self.log_weights, self.means = log_w, means
        self.components = MultivariateNormal(means, covariance_matrix=covs, validate_args=False)
        self.mean = log_w.exp() @ means
        self._mixture_cov = (
            log_w.exp()[:, None, None] * (covs + (means - self.mean)[:, :, None] * (means - self.mean)[:, None, :])
        ).sum(0)

    @staticmethod
    def _seed(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
        """k-means++ seeding (a loop over the K components only)."""
        idx = [int(torch.randint(x.shape[0], (1,), generator=gen))]
        for _ in range(k - 1):
            d2 = torch.cdist(x, x[idx]).pow(2).min(-1).values
            idx.append(int(torch.multinomial(d2 / d2.sum(), 1, generator=gen)))
        return x[idx].clone()

    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of ``x [..., D]``."""
        return (self.log_weights + self.components.log_prob(x.unsqueeze(-2))).logsumexp(-1)

    def scale_tril(self) -> Tensor:
        """Cholesky factor of the mixture's overall covariance."""
        return torch.linalg.cholesky(self._mixture_cov)

    def sample(self, num: int) -> Tensor:
        """Draws ``[num, D]``: a component by weight, then its Gaussian."""
        comp = torch.multinomial(self.log_weights.exp(), num, replacement=True)
        return self.components.sample((num,))[torch.arange(num), comp]


class SemiparametricFit(FalsePosteriorDensity):
    """Parametric fit times a kernel-density correction ratio (Hjort and Glad, 1995).

    ``log p̂(x) = log f(x) + logsumexp_t [log N(x; x_t, H) - log f(x_t)] - log T``, where ``f`` is
    the parametric fit, ``H = h^2 Cov(x)`` and ``h`` is the bandwidth (Scott's ``T^(-1/(D+4))``
    when omitted). Each evaluation costs ``O(T D)`` (never the data size). At most ``max_points``
    evenly spaced draws are kept.

    Args:
        samples: draws ``[T, D]``.
        parametric: the parametric start (default: a :class:`GaussianFit` to the draws).
        bandwidth: the kernel's scale factor ``h`` (relative to the draws' covariance).
        max_points: thinning cap on the kernel centres.

    Example:
        >>> x = torch.randn(400, 1)
        >>> fit = SemiparametricFit(x)
        >>> bool(fit.log_prob(torch.zeros(1, 1)) > fit.log_prob(torch.full((1, 1), 3.0)))
        True
    """

    def __init__(
        self,
        samples: Tensor,
        parametric: FalsePosteriorDensity | None = None,
        bandwidth: float | None = None,
        max_points: int = 4000,
    ) -> None:
        dim = samples.shape[-1] if samples.dim() == 2 else 1
        x = _check_draws(samples, dim + 1, "SemiparametricFit")
        if parametric is None:
            parametric = GaussianFit(x)
        if parametric.dim != dim:
            raise ValueError(f"parametric fit has dimension {parametric.dim}, the draws have {dim}")
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        if x.shape[0] > max_points:
            x = x[torch.linspace(0, x.shape[0] - 1, max_points).round().long()]
        self.dim, self.parametric = dim, parametric
        self.bandwidth = float(bandwidth) if bandwidth is not None else x.shape[0] ** (-1.0 / (dim + 4))
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth}")
        _, cov = _mean_cov(x)
        self._chol = torch.linalg.cholesky(cov) * self.bandwidth
        self._centres = torch.linalg.solve_triangular(self._chol, x.T, upper=False).T  # whitened centres [T, D]
        log_det = self._chol.diagonal().log().sum()
        log_norm = -0.5 * dim * math.log(2 * math.pi) - log_det - math.log(x.shape[0])
        self._offset = log_norm - parametric.log_prob(x)  # [T]

    def log_correction(self, x: Tensor) -> Tensor:
        """Log of the nonparametric correction ratio at ``x [..., D]``."""
        batch = x.shape[:-1]
        flat = x.reshape(-1, self.dim)
        white = torch.linalg.solve_triangular(self._chol, flat.T, upper=False).T
        sq = (white.pow(2).sum(-1, keepdim=True) - 2 * white @ self._centres.T + self._centres.pow(2).sum(-1)).clamp(
            min=0.0
        )
        return (self._offset - 0.5 * sq).logsumexp(-1).reshape(batch)

    def log_prob(self, x: Tensor) -> Tensor:
        """Log density of ``x [..., D]`` (normalized only asymptotically)."""
        return self.parametric.log_prob(x) + self.log_correction(x)

    @property
    def mean(self) -> Tensor | None:
        """The parametric start's mean (the centre a sampler's preconditioning and reference use)."""
        return getattr(self.parametric, "mean", None)

    def scale_tril(self) -> Tensor | None:
        """The parametric start's covariance factor."""
        return self.parametric.scale_tril()


def fit_false_posterior(
    samples: Tensor, estimator: str = "gaussian", **options: float | int | None
) -> FalsePosteriorDensity:
    """Fit one of the estimators by name: ``"gaussian"``, ``"gmm"`` or ``"semiparametric"``.

    Args:
        samples: draws ``[T, D]`` (flat, unconstrained).
        estimator: the estimator's name.
        **options: keyword options of the estimator (``num_components``, ``bandwidth``, ...).

    Example:
        >>> type(fit_false_posterior(torch.randn(50, 2), "gaussian")).__name__
        'GaussianFit'
    """
    if estimator == "gaussian":
        return GaussianFit(samples, **options)  # type: ignore[arg-type]
    if estimator == "gmm":
        return GaussianMixtureFit(samples, **options)  # type: ignore[arg-type]
    if estimator == "semiparametric":
        return SemiparametricFit(samples, **options)  # type: ignore[arg-type]
    raise ValueError(f"unknown estimator {estimator!r}; expected 'gaussian', 'gmm' or 'semiparametric'")
