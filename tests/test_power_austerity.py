"""Power test of AusterityMH's invariance with a non-symmetric proposal against closed-form posteriors (issue 25).

``tests/test_austerity.py:72`` compares the kernel with a "plain MH" that reuses the kernel's own proposal and
Hastings correction, so a wrong Hastings term passes it. Here the reference is the conjugate posterior itself.

Design: an *independence* proposal ``q = N(m + s, (1.5 s)^2)`` (``m, s``: posterior mean and sd in the
unconstrained coordinate), one sd off-centre and wider than the posterior. Its Hastings term
``log q(z) - log q(z')`` is large, and MH with its sign flipped targets ``p · q^2`` instead of ``p``: the mean moves
by ``0.47 s`` and the variance shrinks to ``0.53 s^2``. The chain's mean and variance are compared with the
posterior's by z-scores whose MCSE comes from 25 batch means of the chain itself (computed here, independent of
``neuralblock.diagnostics``): a false-failure rate below 1e-3 per check (t_24 at 4.0, two checks per case);
the flipped sign gives |z| of 18-23 on the mean and 5-9 on the variance (measured; caught with probability
> 0.999). The exact test (``epsilon = 0``) and the sequential test with the default control variate at the mode are
both checked, the latter also with a tight prior, where the proxy's exact sum over all sections (the likelihood's
gradient at the mode) is large, so that a wrong sign on it moves every decision. On a Gaussian likelihood the
first-order proxy leaves residuals that are constant over sections, so the sequential test's decisions are exact
too, and the same closed form applies.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from scipy import stats

from neuralblock.kernels.austerity import AusterityMH

N = 200
X = 0.8 + torch.randn(N, generator=torch.Generator().manual_seed(21), dtype=torch.float64)
# log-variance model: y_i ~ N(0.7, var), var ~ InverseGamma(3, 2) (conjugate), Y a fixed data set
Y = 0.7 + 1.3 * torch.randn(N, generator=torch.Generator().manual_seed(22), dtype=torch.float64)


def gaussian_mean(x: torch.Tensor) -> None:
    """mu ~ N(0, 10^2), x_i ~ N(mu, 1)."""
    mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=x.dtype), 10.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x[idx])


def gaussian_mean_tight_prior(x: torch.Tensor) -> None:
    """mu ~ N(0, 0.1^2), x_i ~ N(mu, 1): the likelihood's gradient at the posterior mode is large (0.8 N / 3)."""
    mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=x.dtype), 0.1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x[idx])


def gaussian_variance(y: torch.Tensor) -> None:
    """var ~ InverseGamma(3, 2), y_i ~ N(0.7, var)."""
    var = pyro.sample("var", dist.InverseGamma(torch.tensor(3.0, dtype=y.dtype), 2.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(0.7, var.sqrt()), obs=y[idx])


def mean_posterior(prior_sd: float = 10.0) -> tuple[float, float]:
    precision = 1 / prior_sd**2 + N
    return float(X.sum()) / precision, 1 / math.sqrt(precision)


def variance_posterior() -> dist.InverseGamma:
    return dist.InverseGamma(torch.tensor(3.0 + N / 2, dtype=torch.float64), 2.0 + float(((Y - 0.7) ** 2).sum()) / 2)


def log_variance_moments(post: dist.InverseGamma) -> tuple[float, float]:
    """Mean and sd of ``log var`` for ``var ~ InverseGamma(a, b)``: ``log b - ψ(a)`` and ``sqrt(ψ'(a))``."""
    a, b = float(post.concentration), float(post.rate)
    return math.log(b) - float(torch.special.digamma(torch.tensor(a))), math.sqrt(
        float(torch.special.polygamma(1, torch.tensor(a)))
    )


def batch_means_z(draws: torch.Tensor, target: float, batches: int = 25) -> float:
    """z-score of the chain mean against ``target``, MCSE from ``batches`` non-overlapping batch means."""
    size = len(draws) // batches
    means = draws[: size * batches].reshape(batches, size).mean(1)
    return (float(means.mean()) - target) / (float(means.std()) / math.sqrt(batches))


@pytest.mark.parametrize(
    ("site", "epsilon"),
    [("mu", 0.0), ("mu", 0.05), ("var", 0.0), ("tight", 0.05)],
)
def test_non_symmetric_independence_proposal_leaves_the_closed_form_posterior_invariant(
    site: str, epsilon: float
) -> None:
    torch.set_default_dtype(torch.float64)
    if site == "mu":
        model, data = gaussian_mean, X
        m, s = mean_posterior()
    elif site == "tight":  # the control variate's exact sum over all sections is far from 0 here
        model, data, site = gaussian_mean_tight_prior, X, "mu"
        m, s = mean_posterior(prior_sd=0.1)
    else:  # the unconstrained coordinate is log var: its posterior moments in closed form
        model, data = gaussian_variance, Y
        m, s = log_variance_moments(variance_posterior())

    def proposal(z: torch.Tensor) -> dist.Distribution:
        return dist.Normal(torch.full_like(z, m + s), 1.5 * s).to_event(1)

    kernel = AusterityMH(model, epsilon=epsilon, batch_size=20, proposal=proposal, normality_check=False, audit_every=0)
    kernel.setup(0, data)
    params = {site: kernel.transforms[site](torch.tensor(m + 0.3 * s))}  # near the posterior: no burn-in needed
    draws = []
    for _ in range(2500):
        params = kernel.sample(params)
        draws.append(float(params[site]))
    z = torch.tensor(draws)  # unconstrained draws (the kernel works and returns there)
    diagnostics = kernel.diagnostics()
    assert 0.2 < diagnostics["acceptance_rate"] < 0.95
    if epsilon > 0:  # the sequential path decided (from the first mini-batches), not a fallback to all sections
        assert diagnostics["decided_early_fraction"] > 0.9 and diagnostics["data_fraction"] < 0.5
    limit = float(stats.t.ppf(1 - 1e-3 / 4, df=24))  # two-sided, two checks per case: 1e-3 per case
    z_mean = batch_means_z(z, m)
    z_var = batch_means_z((z - m) ** 2, s**2)  # E (z - m)^2 = s^2 (m, s exact)
    assert abs(z_mean) < limit and abs(z_var) < limit, (z_mean, z_var, limit)
