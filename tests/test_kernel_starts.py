"""Valid starts of the continuous kernels (issue 23): a start of positive density is found, or a clear error.

A Metropolis chain started where the density is zero or NaN never moves (every MH ratio is
undefined) and returns impossible draws. ``RandomWalkMH`` (and every ``GraphKernel``) redraws
such starts: a Pyro model's chains from its prior, then the continuous variables of the
impossible factors uniformly in ``(-2, 2)`` of their unconstrained space, as Pyro's
``initialize_model`` does. A user's start of zero or NaN density, or with NaN values, raises a
``ValueError`` naming the sites. Building the graph of a Pyro model with a NaN region no longer
depends on the seed.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.distributions import constraints

from neuralblock import FactorGraph, GibbsKernel, RandomWalkMH
from neuralblock.kernels.base import find_valid_start
from neuralblock.pyro import from_pyro_model

INF = math.inf


def half_line_model() -> None:
    """``x ~ N(0, 1)`` cut to ``x > 0``: a prior draw lands in the ``-inf`` region half the time."""
    x = pyro.sample("x", dist.Normal(0.0, 1.0))
    pyro.factor("cut", torch.where(x > 0, torch.zeros_like(x), torch.full_like(x, -INF)))
    pyro.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(0.5))


def nan_region_model() -> None:
    """``log(w)`` is NaN for ``w < 0``: a prior draw lands in the NaN region half the time."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    pyro.factor("f", torch.log(w))


def mixed_nan_model() -> None:
    """A discrete site next to a continuous one with a NaN region (the GibbsKernel case of issue 23)."""
    z = pyro.sample("z", dist.Bernoulli(0.5))
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    pyro.factor("f", torch.log(w) * (1.0 + z))


def always_nan_model() -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    pyro.factor("f", torch.log(-(w**2) - 1.0))


def impossible_model() -> None:
    x = pyro.sample("x", dist.Normal(0.0, 1.0))
    pyro.factor("cut", torch.where(x > 10.0, torch.zeros_like(x), torch.full_like(x, -INF)))


def positive_part(values: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
    """``log N(x; 0, 1)`` on ``x > 0``, ``-inf`` elsewhere, per factor of one variable."""
    x = values[..., 0]
    return torch.where(x > 0, -0.5 * x**2, torch.full_like(x, -INF))


def positive_graph(n: int) -> FactorGraph:
    """``n`` real variables, each cut to ``x > 0``: a uniform start is valid with probability ``2**-n``."""
    fg = FactorGraph()
    ids = fg.add_variables(n)
    fg.add_callable_factors(torch.tensor(ids)[:, None], positive_part)
    return fg


def run(kernel, num_samples: int = 30, warmup: int = 20) -> dict[str, torch.Tensor]:
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()


@pytest.mark.parametrize("seed", range(10))
def test_random_walk_from_the_prior_leaves_a_minus_inf_region(seed: int) -> None:
    pyro.set_rng_seed(seed)
    samples = run(RandomWalkMH(half_line_model))
    assert (samples["x"] > 0).all(), samples["x"][:5]


@pytest.mark.parametrize("seed", range(6))
def test_random_walk_leaves_a_nan_region(seed: int) -> None:
    pyro.set_rng_seed(seed)
    kernel = RandomWalkMH(nan_region_model)
    samples = run(kernel)
    assert (samples["w"] > 0).all() and torch.isfinite(samples["w"]).all()
    assert kernel.diagnostics()["acceptance_rate"] > 0  # the chain moves


def test_local_repair_finds_a_start_that_uniform_draws_of_every_variable_would_miss() -> None:
    """30 independent cuts: redrawing only the variables of impossible factors needs a few rounds, not 2**30."""
    fg = positive_graph(30)
    kernel = RandomWalkMH(fg)
    kernel.setup(0)
    assert (kernel.initial_params["x"] > 0).all()
    samples = run(RandomWalkMH(fg), num_samples=20)
    assert samples["x"].shape == (20, 30) and (samples["x"] > 0).all()


def test_find_valid_start_keeps_valid_chains_and_redraws_continuous_ones() -> None:
    fg = FactorGraph()
    s = fg.add_variable("s", support=constraints.interval(0.0, 1.0))
    fg.add_callable_factors(torch.tensor([[s]]), lambda v, p: torch.where(v[..., 0] > 0.5, 0.0, -INF))
    state = torch.tensor([[0.9], [0.1], [0.7]])
    fixed = find_valid_start(fg, state, torch.Generator().manual_seed(0))
    assert fixed[0, 0] == 0.9 and fixed[2, 0] == 0.7  # valid chains are kept
    assert 0.5 < fixed[1, 0] < 1.0  # redrawn inside the support and the region of positive density


@pytest.mark.parametrize(
    ("model", "init", "message"),
    [
        (half_line_model, {"x": -1.0}, r"initial_params have zero density: factors 'cut' over \(x=-1\)"),
        (nan_region_model, {"w": -0.5}, r"initial_params have a NaN log density: factors 'f' over \(w=-0.5\)"),
        (nan_region_model, {"w": math.nan}, r"sites \['w'\] hold NaN or inf values"),
        (nan_region_model, {"w": INF}, r"sites \['w'\] hold NaN or inf values"),
        (nan_region_model, {"w": 1.0, "v": 0.0}, r"initial_params name \['v'\], which are not latent sites"),
    ],
)
def test_a_users_impossible_start_is_refused_naming_the_sites(model, init, message: str) -> None:
    kernel = RandomWalkMH(model)
    kernel.initial_params = {k: torch.tensor(v) for k, v in init.items()}
    with pytest.raises(ValueError, match=message):
        run(kernel)


def test_a_users_impossible_start_on_a_factor_graph_names_the_variable() -> None:
    kernel = RandomWalkMH(positive_graph(3))
    kernel.initial_params = {"x": torch.tensor([1.0, -2.0, 0.5])}
    with pytest.raises(ValueError, match=r"zero density: factors over \(x1=-2\)"):
        kernel.setup(0)


def test_a_model_without_positive_density_in_reach_raises_naming_the_factor() -> None:
    with pytest.raises(ValueError, match=r"found no start of positive density.*'cut' over \(x=.*initial_params inside"):
        RandomWalkMH(impossible_model).setup(0)
    fg = FactorGraph()
    x = fg.add_variable("x", support=constraints.positive)
    fg.add_callable_factors(torch.tensor([[x]]), lambda v, p: torch.full_like(v[..., 0], -INF))
    with pytest.raises(ValueError, match=r"found no start.*factors over \(x=.*zero total probability"):
        RandomWalkMH(fg).setup(0)


def test_a_start_inside_a_hard_region_is_honoured() -> None:
    kernel = RandomWalkMH(impossible_model, step_size=0.1)
    kernel.initial_params = {"x": torch.tensor(10.5)}
    samples = run(kernel)
    assert (samples["x"] > 10.0).all()


@pytest.mark.parametrize("seed", range(10))
def test_gibbs_on_a_model_with_a_nan_region_sets_up_in_every_seed(seed: int) -> None:
    """The graph no longer depends on whether the prior trace fell into the NaN region (issue 23)."""
    pyro.set_rng_seed(seed)
    kernel = GibbsKernel(mixed_nan_model)
    kernel.initial_params = {"z": torch.tensor(1.0), "w": torch.tensor(1.0)}
    samples = run(kernel, num_samples=10, warmup=5)
    assert (samples["w"] == 1.0).all()  # Gibbs updates z only: w stays at the user's start
    free = GibbsKernel(mixed_nan_model)
    free.setup(0)
    assert free.initial_params["w"] > 0  # a start drawn from the prior leaves the NaN region


def test_gibbs_with_chains_repairs_every_chain_of_a_nan_region() -> None:
    kernel = GibbsKernel(mixed_nan_model, chains=16)
    kernel.setup(0)
    assert (kernel.initial_params["w"] > 0).all()


def test_a_model_that_is_nan_everywhere_says_how_to_avoid_the_region() -> None:
    with pytest.raises(ValueError, match=r"NaN log density .* in all of 100 prior draws \(sites \['f'\]\).*-inf"):
        from_pyro_model(always_nan_model)
    with pytest.raises(ValueError, match="initial_params"):
        GibbsKernel(always_nan_model).setup(0)


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("step_size", -1.0),
        ("step_size", 0.0),
        ("step_size", math.inf),
        ("step_size", math.nan),
        ("step_size", "big"),
        ("step_size", True),
        ("target_accept", 0.0),
        ("target_accept", 1.0),
        ("target_accept", math.nan),
        ("target_accept", "high"),
        ("adapt_step_size", "yes"),
        ("variables", "x"),
        ("variables", [1.5]),
    ],
)
def test_random_walk_validates_its_options(option: str, bad) -> None:
    with pytest.raises(ValueError, match=option):
        RandomWalkMH(positive_graph(2), **{option: bad})


def test_progress_bar_shows_a_running_acceptance_rate() -> None:
    """With one variable a sweep accepts 0 or 1 proposal; the bar shows the phase's running rate."""
    shown: list[float] = []
    kernel = RandomWalkMH(half_line_model, adapt_step_size=False)
    mcmc = MCMC(
        kernel,
        num_samples=200,
        warmup_steps=50,
        disable_progbar=True,
        hook_fn=lambda k, params, stage, i: shown.append(k.logging()["acc"]),
    )
    mcmc.run()
    sampling = shown[50:]
    assert any(0.0 < a < 1.0 for a in sampling)
    assert sampling[-1] == pytest.approx(kernel.diagnostics()["acceptance_rate"], abs=1e-3)
