"""DirectNUTS: the stationary distribution against exact moments, the model path, adaptation and errors.

Every statistical check pools batch means over chains and compares a z-score with a Bonferroni
threshold at the suite's family-wise false-failure rate (``tests/_stats.ALPHA``).
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _stats import bonferroni_t  # tests/ is on sys.path under pytest
from pyro.infer import MCMC

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.nuts import DirectNUTS, DualAveraging, WindowSchedule
from neuralblock.replay import FusedPotential

BATCHES = 10


def _chains(make_kernel, site: str, chains: int, samples: int, warmup: int, seed: int) -> torch.Tensor:
    out = []
    for chain in range(chains):
        pyro.set_rng_seed(seed + chain)
        mcmc = MCMC(make_kernel(), num_samples=samples, warmup_steps=warmup, disable_progbar=True)
        mcmc.run()
        out.append(mcmc.get_samples()[site].double())
    return torch.stack(out)  # [chains, samples, ...]


def _assert_z(draws: torch.Tensor, exact: torch.Tensor, tests: int, chains: int) -> None:
    mean, se = batch_means_mcse(draws, num_batches=BATCHES)
    z = (mean - exact) / se
    limit = bonferroni_t(tests, df=chains * BATCHES - 1)
    assert z.abs().max() < limit, (mean.tolist(), exact.tolist(), z.tolist(), limit)


@pytest.mark.parametrize("numpy", [True, False], ids=["numpy-graph", "torch-graph"])
def test_correlated_badly_scaled_gaussian_moments(numpy: bool) -> None:
    # 3 means and 3 variances, scales 0.1 / 1 / 10 with correlation 0.6: the mass matrix has to adapt.
    # The fused potential runs as its NumPy translation (with the NumPy state on the CPU) or as its torch graph.
    scale = torch.tensor([0.1, 1.0, 10.0])
    corr = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.6], [0.0, 0.6, 1.0]])
    cov = corr * scale[:, None] * scale[None]
    precision = torch.linalg.inv(cov)
    loc = torch.tensor([1.0, -2.0, 3.0])

    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        d = params["z"] - loc
        return 0.5 * d @ precision @ d

    fused = FusedPotential(potential, ["z"], "a Gaussian potential", record_after=1, numpy=numpy)

    def make() -> DirectNUTS:
        return DirectNUTS(potential_fn=fused, initial_params={"z": torch.zeros(3)})

    draws = _chains(make, "z", chains=2, samples=1500, warmup=400, seed=0)
    assert (fused.value_and_grad.call_numpy(np.zeros(3, dtype=np.float32)) is not None) == numpy
    stats = torch.cat([draws, (draws - loc.double()) ** 2], -1)  # means, then variances
    exact = torch.cat([loc, cov.diagonal()]).double()
    _assert_z(stats, exact, tests=6, chains=2)


def test_heavy_tailed_logistic_target_quantiles() -> None:
    # U(z) = z + 2 softplus(-z): the standard logistic distribution, whose CDF is sigmoid.
    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        z = params["z"]
        return (z + 2 * torch.nn.functional.softplus(-z)).sum()

    def make() -> DirectNUTS:
        return DirectNUTS(potential_fn=potential, initial_params={"z": torch.tensor([3.0])})

    draws = _chains(make, "z", chains=2, samples=1500, warmup=300, seed=10)[..., 0]
    points = torch.tensor([-2.0, 0.0, 1.5], dtype=torch.float64)
    indicators = (draws[..., None] <= points).double()
    _assert_z(indicators, torch.sigmoid(points), tests=3, chains=2)


def _normal_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    pyro.sample("s", dist.LogNormal(0.0, 0.5))  # no data: its posterior is its prior (a constrained site)
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_model_path_uses_the_direct_likelihood_and_constrains_samples() -> None:
    y = torch.randn(20) + 1.0
    kernel = DirectNUTS(_normal_model)
    pyro.set_rng_seed(3)
    mcmc = MCMC(kernel, num_samples=1500, warmup_steps=300, disable_progbar=True)
    mcmc.run(y)
    samples = mcmc.get_samples()
    assert isinstance(kernel.potential_fn, FusedPotential)
    assert (samples["s"] > 0).all()
    n = len(y)
    draws = torch.stack([samples["mu"], samples["s"]], -1).double()[None]  # one chain
    exact = torch.tensor([float(y.sum()) / (n + 1), math.exp(0.125)], dtype=torch.float64)
    _assert_z(draws, exact, tests=2, chains=1)
    assert abs(float(samples["mu"].var()) * (n + 1) - 1.0) < 0.35  # posterior variance 1 / (n + 1)


def test_model_without_a_data_plate_falls_back_to_pyros_potential_with_a_warning() -> None:
    def model() -> None:
        pyro.sample("a", dist.Normal(0.0, 2.0))

    kernel = DirectNUTS(model)
    pyro.set_rng_seed(4)
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, disable_progbar=True)
    with pytest.warns(UserWarning, match="no direct likelihood path"):
        mcmc.run()
    assert mcmc.get_samples()["a"].shape == (200,)


def test_diagnostics_report_divergences_and_speed() -> None:
    # A cliff: the potential jumps by 1e4 past z = 1, so long steps into it diverge.
    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        z = params["z"]
        return (0.5 * z**2 + 1e4 * torch.relu(z - 1.0)).sum()

    kernel = DirectNUTS(potential_fn=potential, initial_params={"z": torch.zeros(1)}, step_size=0.5)
    pyro.set_rng_seed(5)
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    diag = kernel.diagnostics()
    assert set(diag) == {"divergences", "acceptance_rate", "step_size", "leapfrog_steps", "transitions_per_second"}
    assert diag["divergences"] and all(0 <= i < 300 for i in diag["divergences"])
    assert 0.0 < diag["acceptance_rate"] <= 1.0 and diag["leapfrog_steps"] >= 1 and diag["transitions_per_second"] > 0
    assert float(mcmc.get_samples()["z"].max()) < 1.01


def test_without_adaptation_the_step_size_is_kept() -> None:
    kernel = DirectNUTS(
        potential_fn=lambda p: (p["z"] ** 2).sum() / 2,
        initial_params={"z": torch.zeros(2)},
        step_size=0.3,
        adapt_step_size=False,
        adapt_mass_matrix=False,
    )
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, disable_progbar=True)
    mcmc.run()
    assert kernel.step_size == 0.3


def test_the_state_moved_by_the_caller_is_re_evaluated() -> None:
    # one leapfrog step of 0.01 from (50, -50): a kernel that kept its own state (0, 0) would answer near 0
    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return (params["z"] ** 2).sum() / 2

    kernel = DirectNUTS(
        potential_fn=potential,
        initial_params={"z": torch.zeros(2)},
        step_size=0.01,
        adapt_step_size=False,
        adapt_mass_matrix=False,
        max_tree_depth=1,
    )
    kernel.setup(0)
    out = kernel.sample({"z": torch.tensor([50.0, -50.0])})["z"]
    assert float(out.abs().min()) > 40.0, out
    assert kernel._potential == pytest.approx(float(potential({"z": out})), rel=1e-6)


def _offset_mean(data: torch.Tensor) -> None:
    z = pyro.sample("z", dist.Bernoulli(0.5))
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(data)) as idx:
        pyro.sample("obs", dist.Normal(mu + 0.15 * z, 1.0), obs=data[idx])


def test_in_a_compound_sampler_it_follows_the_sites_held_fixed() -> None:
    """On a ConditionedModel the potential reads the held values as they move (no frozen graph, no stale cache).

    The joint posterior of (z, mu) by enumeration and quadrature; a DirectNUTS that froze z at setup or kept
    its cached potential after Gibbs moved z gave p(z = 1) 0.22 against 0.53 (z-score -35).
    """
    from neuralblock.kernels import CompoundKernel, ConditionedModel, GibbsKernel
    from neuralblock.kernels.conditioning import set_conditioning

    data = torch.randn(200, generator=torch.Generator().manual_seed(1)) + 0.9
    nuts = DirectNUTS(ConditionedModel(_offset_mean, {"z": torch.tensor(0.0)}), adapt_mass_matrix=False)
    nuts.setup(0, data)
    at = {"mu": torch.tensor(0.8)}
    before = float(nuts.potential_fn(at))
    set_conditioning(nuts, {"z": torch.tensor(1.0)})
    assert nuts._stale and float(nuts.potential_fn(at)) != pytest.approx(before)

    grid = torch.linspace(-2.0, 3.0, 20001, dtype=torch.float64)
    prior = dist.Normal(0.0, 1.0).log_prob(grid)
    log_joint = torch.stack(
        [prior + dist.Normal(grid[:, None] + 0.15 * z, 1.0).log_prob(data.double()).sum(-1) for z in (0, 1)]
    )
    weights = torch.exp(log_joint - log_joint.max())
    exact = {"z": float(weights[1].sum() / weights.sum()), "mu": float((weights * grid).sum() / weights.sum())}
    kernel = CompoundKernel([(GibbsKernel(_offset_mean), ["z"]), (DirectNUTS(ConditionedModel(_offset_mean)), ["mu"])])
    mcmc = MCMC(kernel, num_samples=1200, warmup_steps=200, disable_progbar=True)
    mcmc.run(data)
    draws = mcmc.get_samples()
    for name, value in exact.items():  # 4 batch-means MCSEs (two checks: false-failure rate ~1e-4)
        mean, mcse = batch_means_mcse(draws[name].double()[None])
        assert abs(float(mean) - value) < 4.0 * float(mcse), (name, float(mean), value, float(mcse))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of model and potential_fn"),
        ({"model": _normal_model, "potential_fn": lambda p: p["z"].sum()}, "exactly one"),
        ({"potential_fn": lambda p: p["z"].sum()}, "needs initial_params"),
        ({"model": _normal_model, "step_size": 0.0}, "step_size"),
        ({"model": _normal_model, "target_accept_prob": 1.0}, "target_accept_prob"),
        ({"model": _normal_model, "max_tree_depth": 0}, "max_tree_depth"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DirectNUTS(**kwargs)


def test_a_start_with_infinite_potential_raises() -> None:
    kernel = DirectNUTS(potential_fn=lambda p: -torch.log(p["z"]).sum(), initial_params={"z": torch.zeros(1)})
    with pytest.raises(ValueError, match="not finite at the start"):
        kernel.setup(10)


def test_dual_averaging_moves_toward_the_target() -> None:
    low = DualAveraging(1.0, target=0.8)
    for _ in range(100):
        low.update(0.2)  # rejecting too often: the step shrinks
    assert low.final_step_size() < 1.0


def test_window_schedule_fits_inside_the_warmup() -> None:
    for warmup in (20, 50, 100, 150, 300, 1000, 5000):
        schedule = WindowSchedule.for_warmup(warmup)
        assert schedule.ends, warmup
        assert schedule.start < schedule.ends[0] < warmup - 1 and schedule.ends[-1] < warmup
        assert list(schedule.ends) == sorted(set(schedule.ends))
    assert WindowSchedule.for_warmup(10).ends == ()
