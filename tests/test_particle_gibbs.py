"""Conditional SMC / particle Gibbs: invariance against the Kalman smoother, and the kernel contract.

The invariance tests run 4 independent chains of every series in one batch and compare
batch-means z-scores (4 chains x 20 batches, pooled) of the smoothing means and second central
moments of each ``x_t`` with the exact Kalman (RTS) smoother. Each test tolerates
``|z| <= t_{79}^{-1}(1 - alpha / (2 m))`` for its m compared quantities (Bonferroni), so its
false-failure rate over random seeds is at most ``alpha = 1e-3``.
"""

from __future__ import annotations

import pickle
from functools import partial

import pytest
import torch
from _stats import bonferroni_t  # tests/ is on sys.path under pytest
from pyro.infer import MCMC

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.particle_gibbs import (
    ParticleGibbs,
    csmc_step,
    kalman_smoother,
    linear_gaussian_ssm,
    path_log_joint,
)

ALPHA = 1e-3
CHAINS = 4
BATCHES = 20
MODEL = {"a": 0.8, "q": 0.5, "r": 0.7}


def pg_draws(y: torch.Tensor, sweeps: int, num_particles: int, ancestor_sampling: bool) -> torch.Tensor:
    """Draws ``[chains, sweeps, S, T]`` of CHAINS independent chains per series, run as one batch."""
    num_series, steps = y.shape
    ssm = linear_gaussian_ssm(y.repeat(CHAINS, 1), **MODEL)
    path = torch.zeros(CHAINS * num_series, steps)
    draws = []
    for i in range(sweeps + 50):
        path, _ = csmc_step(path, ssm, num_particles, ancestor_sampling)
        if i >= 50:
            draws.append(path)
    return torch.stack(draws).reshape(sweeps, CHAINS, num_series, steps).transpose(0, 1)


@pytest.mark.parametrize("ancestor_sampling", [True, False])
def test_csmc_matches_kalman_smoother(ancestor_sampling: bool) -> None:
    y = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    mean, var = kalman_smoother(y, **MODEL)
    draws = pg_draws(y, sweeps=800, num_particles=16, ancestor_sampling=ancestor_sampling).to(torch.float64)
    est_mean, se_mean = batch_means_mcse(draws, BATCHES)
    est_var, se_var = batch_means_mcse((draws - mean) ** 2, BATCHES)
    z = torch.cat([((est_mean - mean) / se_mean).flatten(), ((est_var - var) / se_var).flatten()])
    assert z.abs().max() <= bonferroni_t(z.numel(), CHAINS * BATCHES - 1), f"max |z| = {z.abs().max():.2f}"


def test_csmc_detects_a_wrong_model() -> None:
    """Power check: the same comparison fails when the sampler targets a different observation noise."""
    y = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    mean, _ = kalman_smoother(y, a=MODEL["a"], q=MODEL["q"], r=0.2)
    draws = pg_draws(y, sweeps=200, num_particles=10, ancestor_sampling=True).to(torch.float64)
    est_mean, se_mean = batch_means_mcse(draws, BATCHES)
    assert ((est_mean - mean) / se_mean).abs().max() > bonferroni_t(mean.numel(), CHAINS * BATCHES - 1)


def test_kalman_smoother_matches_dense_gaussian_posterior() -> None:
    y = torch.randn(1, 4, dtype=torch.float64)
    a, q, r = MODEL["a"], MODEL["q"], MODEL["r"]
    p0 = q / (1 - a * a)
    steps = torch.arange(4, dtype=torch.float64)
    prior_cov = p0 * a ** (steps[:, None] - steps[None, :]).abs()  # stationary AR(1) covariance
    post_cov = torch.linalg.inv(torch.linalg.inv(prior_cov) + torch.eye(4, dtype=torch.float64) / r)
    post_mean = post_cov @ (y[0] / r)
    mean, var = kalman_smoother(y, a, q, r)
    torch.testing.assert_close(mean[0], post_mean)
    torch.testing.assert_close(var[0], post_cov.diagonal())


def test_path_log_joint_is_the_gaussian_density() -> None:
    y = torch.randn(2, 3)
    x = torch.randn(2, 3)
    ssm = linear_gaussian_ssm(y, **MODEL)
    a, q, r = MODEL["a"], MODEL["q"], MODEL["r"]
    normal = torch.distributions.Normal
    expected = normal(0.0, (q / (1 - a * a)) ** 0.5).log_prob(x[:, 0])
    expected = expected + normal(a * x[:, :-1], q**0.5).log_prob(x[:, 1:]).sum(-1)
    expected = expected + normal(x, r**0.5).log_prob(y).sum(-1)
    torch.testing.assert_close(path_log_joint(x, ssm), expected)


def test_csmc_input_errors() -> None:
    ssm = linear_gaussian_ssm(torch.zeros(2, 3), **MODEL)
    with pytest.raises(ValueError, match="reference"):
        csmc_step(torch.zeros(3), ssm)
    with pytest.raises(ValueError, match="num_particles"):
        csmc_step(torch.zeros(2, 3), ssm, num_particles=1)
    with pytest.raises(ValueError, match="y must be"):
        linear_gaussian_ssm(torch.zeros(3), **MODEL)
    with pytest.raises(TypeError, match="values"):
        ParticleGibbs(partial(linear_gaussian_ssm, torch.zeros(2, 3)), torch.zeros(2, 3)).condition_on([1.0])
    state_space = partial(linear_gaussian_ssm, torch.zeros(2, 3))
    with pytest.raises(TypeError, match="must hold floats"):
        ParticleGibbs(state_space, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \[S, T\]"):
        ParticleGibbs(state_space, torch.zeros(6))
    kernel = ParticleGibbs(state_space, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        kernel.initial_params = {"h": torch.zeros(3, 2)}
    with pytest.raises(ValueError, match="finite"):
        kernel.initial_params = {"h": torch.full((2, 3), float("nan"))}


def test_degenerate_weights_are_counted_not_crashing() -> None:
    y = torch.zeros(2, 3)
    ssm = linear_gaussian_ssm(y, **MODEL)._replace(observation_log_prob=lambda x, t: torch.full_like(x, -torch.inf))
    path, info = csmc_step(torch.zeros(2, 3), ssm, num_particles=4)
    assert torch.isfinite(path).all() and info.num_degenerate == 6
    assert info.mean_ess == 0.0 and bool((info.log_evidence == -torch.inf).all())  # not counted as full ESS


def test_particle_gibbs_kernel_in_pyro_mcmc_two_chains_and_conditioning() -> None:
    y = torch.randn(3, 4)
    kernel = ParticleGibbs(partial(linear_gaussian_ssm, y), torch.zeros(3, 4), num_particles=8, values=MODEL)
    kernel = pickle.loads(pickle.dumps(kernel))
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, num_chains=2, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples(group_by_chain=True)["h"]
    assert samples.shape == (2, 20, 3, 4) and not torch.equal(samples[0], samples[1])
    # condition_on changes the target: the draws follow the smoother of the new observation variance
    y_far = 2.0 * y
    kernel = ParticleGibbs(partial(linear_gaussian_ssm, y_far), torch.zeros(3, 4), num_particles=64, values=MODEL)
    kernel.condition_on({"r": 0.3})
    kernel.setup(0)
    params, draws = kernel.initial_params, []
    for _ in range(220):
        params = kernel.sample(params)
        draws.append(params["h"])
    new_mean = kalman_smoother(y_far, MODEL["a"], MODEL["q"], 0.3)[0].float()
    old_mean = kalman_smoother(y_far, **MODEL)[0].float()
    assert (torch.stack(draws[20:]).mean(0) - new_mean).abs().max() < 0.3 < (new_mean - old_mean).abs().max()
    diag = kernel.diagnostics()
    assert diag["path_change_rate"] > 0.5 and set(kernel.logging()) == {"changed", "ess"}
