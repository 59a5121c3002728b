"""The swapped density p_s(θ) ∝ π(θ) p̃_f(θ) / π_f(θ), its potential, and the plain IS baseline.

All densities are evaluated on the flat *unconstrained* vector ``z`` (HMC's space). With
``θ = T(z)``, a fitted estimate ``q`` of the false posterior on ``z`` and priors on ``θ``,

``log p_s(z) = log q(z) + log π(T(z)) - log π_f(T(z))``

(the Jacobian of ``T`` cancels between the false posterior and the false prior); for an
:class:`~neuralblock.priorswap.estimators.ExactPosterior` stated on ``θ``,
``log q(z) = log p_f(T(z)) + log |dT/dz|``. Each evaluation costs nothing in the data size.

References:
    W. Neiswanger and E. Xing, "Post-Inference Prior Swapping", ICML 2017.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pyro
import pyro.distributions as pdist
import torch
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.constraints import Constraint

from neuralblock.priorswap.estimators import FalsePosteriorDensity, fit_false_posterior
from neuralblock.priorswap.layout import (
    DEFAULT_SITE,
    PriorLike,
    SiteLayout,
    SitePrior,
    as_sample_dict,
    same_support,
    support_key,
)

__all__ = [
    "ISResult",
    "SwapProblem",
    "SwappedModel",
    "SwappedPotential",
    "effective_sample_size",
    "importance_swap",
    "swap_log_density",
    "swapped_potential_fn",
]


def swap_log_density(
    z: Tensor, density: FalsePosteriorDensity, false_prior: SitePrior, target_prior: SitePrior, layout: SiteLayout
) -> Tensor:
    """Unnormalized ``log p_s(z)`` of flat unconstrained values ``z [..., D]`` (returns ``[...]``).

    Args:
        z: flat unconstrained values.
        density: the false-posterior estimate (on ``z``, or on ``θ`` for ``space="constrained"``).
        false_prior: the prior the false posterior was inferred under (bound to ``layout``).
        target_prior: the prior of interest (bound to ``layout``).
        layout: the sites' shapes and supports.

    Example:
        >>> from torch.distributions import Normal, Laplace
        >>> from neuralblock.priorswap.estimators import ExactPosterior
        >>> layout = SiteLayout({"theta": ()})
        >>> f, t = SitePrior(Normal(0.0, 1.0), "false prior"), SitePrior(Laplace(0.0, 1.0), "target prior")
        >>> f.bind(layout); t.bind(layout)
        >>> swap_log_density(torch.zeros(2, 1), ExactPosterior(Normal(0.0, 0.5)), f, t, layout).shape
        torch.Size([2])
    """
    theta, log_det = layout.to_constrained(z)
    if density.space == "constrained":
        log_q = density.log_prob(theta) + log_det
    else:
        log_q = density.log_prob(z)
    return log_q + target_prior.flat_log_prob(theta) - false_prior.flat_log_prob(theta)


class SwapProblem:
    """A validated prior-swap problem: sites, priors and (optionally) the false-posterior estimate.

    Args:
        false_posterior: draws (dict ``site -> [T, *shape]`` as from ``MCMC.get_samples()``, or a
            Tensor ``[T, *shape]`` for one site named ``site``) or a fitted/exact
            :class:`~neuralblock.priorswap.estimators.FalsePosteriorDensity`.
        false_prior: the prior the false posterior was inferred under.
        target_prior: the prior to swap in. Priors are distributions (one per site, or one for a
            single site) or callables ``log_prob(dict site -> [B, *shape]) -> [B]``.
        estimator: ``"gaussian"``, ``"gmm"``, ``"semiparametric"`` (fitted to draws), or ``None``
            (no density; for importance sampling only).
        site: the site name used when draws or priors are not keyed by site.
        supports: explicit supports per site (default: read from the priors; real otherwise).
        site_shapes: shapes per site when ``false_posterior`` is a density (default: read from the
            false prior's distributions).
        estimator_options: keyword options for the estimator.

    Raises:
        ValueError: mismatched sites or dimensions, non-finite or out-of-support draws, too few
            draws for the estimator, or a target prior whose support differs from the false prior's.
        TypeError: inputs of the wrong kind.

    Example:
        >>> from torch.distributions import Normal, Laplace
        >>> problem = SwapProblem(torch.randn(100) * 0.3 + 1.0, Normal(0.0, 1.0), Laplace(0.0, 1.0))
        >>> problem.layout.dim, type(problem.density).__name__
        (1, 'GaussianFit')
    """

    def __init__(
        self,
        false_posterior: Mapping[str, Tensor] | Tensor | FalsePosteriorDensity,
        false_prior: PriorLike,
        target_prior: PriorLike,
        *,
        estimator: str | None = "gaussian",
        site: str = DEFAULT_SITE,
        supports: Mapping[str, Constraint] | None = None,
        site_shapes: Mapping[str, tuple[int, ...]] | None = None,
        estimator_options: Mapping[str, float | int | None] | None = None,
    ) -> None:
        self.false_prior = SitePrior(false_prior, "false prior")
        self.target_prior = SitePrior(target_prior, "target prior")
        self.samples: dict[str, Tensor] | None = None
        if isinstance(false_posterior, FalsePosteriorDensity):
            shapes = dict(site_shapes) if site_shapes is not None else self._shapes_from_prior(site)
            density: FalsePosteriorDensity | None = false_posterior
        elif isinstance(false_posterior, Tensor | Mapping):
            self.samples = as_sample_dict(false_posterior, site)
            shapes = {n: v.shape[1:] for n, v in self.samples.items()}
            density = None
        else:
            raise TypeError(
                "false_posterior must be draws (dict site -> Tensor, or a Tensor) or a FalsePosteriorDensity, "
                f"got {type(false_posterior).__name__}"
            )
        sites = list(shapes)
        declared = {**self.target_prior.supports(sites), **self.false_prior.supports(sites), **dict(supports or {})}
        self._check_supports(sites)
        self.layout = SiteLayout(shapes, declared)
        if self.layout.reshaped_sites:  # the swap's flat vectors are the same size in both spaces
            name = self.layout.reshaped_sites[0]
            raise ValueError(
                f"site {name!r}: support {self.layout.supports[name]} changes shape when unconstrained; unsupported"
            )
        self.false_prior.bind(self.layout)
        self.target_prior.bind(self.layout)
        self.z: Tensor | None = None
        if self.samples is not None:
            self.z = self.layout.to_unconstrained(self.layout.flatten(self.samples))
            if estimator is not None:
                density = fit_false_posterior(self.z, estimator, **dict(estimator_options or {}))
        if density is not None and density.dim != self.layout.dim:
            raise ValueError(
                f"the false-posterior density has dimension {density.dim}, the sites {sites} have {self.layout.dim}"
            )
        self.density = density

    def _shapes_from_prior(self, site: str) -> dict[str, tuple[int, ...]]:
        dists = self.false_prior.dists
        if dists is None:
            raise ValueError("with a density as false_posterior and a callable false prior, pass site_shapes")
        return {site if k == "" else k: tuple(d.batch_shape + d.event_shape) for k, d in dists.items()}

    def _check_supports(self, sites: list[str]) -> None:
        false_s, target_s = self.false_prior.supports(sites), self.target_prior.supports(sites)
        for name in sites:
            if name in false_s and name in target_s and not same_support(false_s[name], target_s[name]):
                raise ValueError(
                    f"site {name!r}: the target prior's support {support_key(target_s[name])} differs from the "
                    f"false prior's support {support_key(false_s[name])}; prior swapping needs the same support"
                )

    def log_density(self, z: Tensor) -> Tensor:
        """``log p_s(z)`` for flat unconstrained ``z [..., D]`` (see :func:`swap_log_density`)."""
        if self.density is None:
            raise RuntimeError("this SwapProblem has no false-posterior density (estimator=None)")
        return swap_log_density(z, self.density, self.false_prior, self.target_prior, self.layout)

    def log_prior_ratio(self, theta: Tensor) -> Tensor:
        """``log π(θ) - log π_f(θ)`` for flat constrained ``θ [..., D]``."""
        return self.target_prior.flat_log_prob(theta) - self.false_prior.flat_log_prob(theta)


class SwappedPotential:
    """Picklable potential energy ``-log p_s`` on a dict of unconstrained site values (for HMC/NUTS).

    Example:
        >>> from torch.distributions import Normal, Laplace
        >>> problem = SwapProblem(torch.randn(100), Normal(0.0, 1.0), Laplace(0.0, 1.0))
        >>> SwappedPotential(problem)({"theta": torch.tensor(0.5)}).shape
        torch.Size([])
    """

    def __init__(self, problem: SwapProblem) -> None:
        self.problem = problem

    def flat(self, params: Mapping[str, Tensor]) -> Tensor:
        """Concatenate one draw's unconstrained site values in layout order, ``[D]``."""
        return self.problem.layout.flatten_point(params)

    def __call__(self, params: Mapping[str, Tensor]) -> Tensor:
        return -self.problem.log_density(self.flat(params)[None])[0]


def swapped_potential_fn(problem: SwapProblem) -> SwappedPotential:
    """The potential ``-log p_s`` for ``pyro.infer.HMC/NUTS(potential_fn=...)``.

    Example:
        >>> from torch.distributions import Normal, StudentT
        >>> fn = swapped_potential_fn(SwapProblem(torch.randn(50), Normal(0.0, 1.0), StudentT(3.0)))
        >>> bool(torch.isfinite(fn({"theta": torch.tensor(0.0)})))
        True
    """
    return SwappedPotential(problem)


class _ImproperSite(pdist.ImproperUniform):
    """An improper uniform site whose ``sample`` returns a fixed point of the support (for tracing)."""

    def sample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        zeros = torch.zeros(torch.Size(sample_shape) + self.batch_shape + self.event_shape)
        return biject_to(self.support)(zeros)


class SwappedModel:
    """A Pyro model whose posterior is p_s: improper-uniform sites plus one ``pyro.factor``.

    Lets Pyro tools that want a ``model`` (``initialize_model``, ``Predictive``) see the swapped
    density on the constrained sites (Pyro adds the change-of-variables Jacobian itself).

    Example:
        >>> from torch.distributions import Normal, Laplace
        >>> from pyro import poutine
        >>> model = SwappedModel(SwapProblem(torch.randn(50), Normal(0.0, 1.0), Laplace(0.0, 1.0)))
        >>> sorted(poutine.trace(model).get_trace().nodes)[-2:]
        ['swapped_density', 'theta']
    """

    def __init__(self, problem: SwapProblem) -> None:
        self.problem = problem

    def __call__(self, *args: object, **kwargs: object) -> None:
        layout = self.problem.layout
        values = {
            name: pyro.sample(name, _ImproperSite(layout.supports[name], (), shape))
            for name, shape in layout.shapes.items()
        }
        theta = layout.flatten_point(values, constrained=True)
        z = layout.to_unconstrained(theta)
        _, log_det = layout.to_constrained(z)
        pyro.factor("swapped_density", self.problem.log_density(z[None])[0] - log_det)


class ISResult(NamedTuple):
    """Self-normalized importance-sampling output.

    Attributes:
        samples: the weighted draws, ``site -> [T, *shape]``.
        weights: normalized weights ``[T]`` (sum to one).
        log_weights: unnormalized log weights ``[T]``.
        ess: effective sample size ``1 / sum(weights^2)``.
    """

    samples: dict[str, Tensor]
    weights: Tensor
    log_weights: Tensor
    ess: float

    def mean(self) -> dict[str, Tensor]:
        """Weighted posterior means per site."""
        w = self.weights
        return {k: (w.reshape((-1,) + (1,) * (v.dim() - 1)) * v).sum(0) for k, v in self.samples.items()}


def effective_sample_size(log_weights: Tensor) -> float:
    """Kish's effective sample size of (unnormalized) log importance weights.

    Example:
        >>> effective_sample_size(torch.zeros(10)), effective_sample_size(torch.tensor([0.0, -1e9]))
        (10.0, 1.0)
    """
    return float((2 * log_weights.logsumexp(0) - (2 * log_weights).logsumexp(0)).exp())


def normalized_weights(
    log_weights: Tensor, samples: dict[str, Tensor], warn_fraction: float = 0.01, what: str = "importance"
) -> ISResult:
    """Check log weights, normalize them and warn on degeneracy (ESS below ``warn_fraction * T``)."""
    bad = torch.isnan(log_weights) | (log_weights == float("inf"))
    if bad.any():
        raise ValueError(
            f"non-finite {what} weights (NaN or +inf) at {int(bad.sum())} draws, e.g. index {int(bad.nonzero()[0])}"
        )
    if not torch.isfinite(log_weights).any():
        raise ValueError(f"every {what} weight is zero: the target gives zero density to all draws")
    weights = (log_weights - log_weights.logsumexp(0)).exp()
    ess = effective_sample_size(log_weights)
    if ess < warn_fraction * log_weights.shape[0]:
        warnings.warn(
            f"{what} weights are degenerate: ESS {ess:.1f} of {log_weights.shape[0]} draws "
            f"(< {100 * warn_fraction:g}%); estimates are unreliable",
            UserWarning,
            stacklevel=3,
        )
    return ISResult(samples, weights, log_weights, ess)


def importance_swap(
    false_samples: Mapping[str, Tensor] | Tensor,
    false_prior: PriorLike,
    target_prior: PriorLike,
    *,
    site: str = DEFAULT_SITE,
    supports: Mapping[str, Constraint] | None = None,
    warn_fraction: float = 0.01,
) -> ISResult:
    """The plain IS baseline: reweight false-posterior draws by ``w_t = π(θ_t) / π_f(θ_t)``.

    Self-normalized; warns (``UserWarning``) when the ESS falls below ``warn_fraction`` of the
    draws, the degeneracy that prior swapping avoids when the target prior moves the posterior
    into the false posterior's tail.

    Args:
        false_samples: draws of the false posterior.
        false_prior: the prior they were inferred under.
        target_prior: the prior to swap in.
        site: site name for tensor draws or a single distribution.
        supports: explicit supports per site.
        warn_fraction: ESS fraction below which to warn.

    Returns:
        An :class:`ISResult`.

    Example:
        >>> from torch.distributions import Normal
        >>> res = importance_swap(torch.randn(1000), Normal(0.0, 1.0), Normal(0.0, 1.0))
        >>> round(res.ess)
        1000
    """
    problem = SwapProblem(false_samples, false_prior, target_prior, estimator=None, site=site, supports=supports)
    if problem.samples is None:
        raise TypeError("importance_swap needs false-posterior draws, not a density")
    theta = problem.layout.flatten(problem.samples)
    return normalized_weights(problem.log_prior_ratio(theta), problem.samples, warn_fraction)
