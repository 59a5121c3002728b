"""Valid starts, running acceptance and ArviZ export of the global-parameter kernels (issue 23).

``AusterityMH``, ``LWAKernel`` and ``PriorSwap`` check their start's log density at setup: a
drawn start of zero or NaN density is redrawn (prior or false-posterior draws, then uniform draws
in ``(-2, 2)`` unconstrained, as Pyro's ``init_to_uniform``); a user's impossible start raises a
``ValueError`` naming the sites. ``diagnostics()["divergences"]`` is a list, as ``arviz.from_pyro`` reads it.
"""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.distributions import Laplace, Normal

from neuralblock.kernels.austerity import AusterityMH
from neuralblock.kernels.lwa import LWAKernel
from neuralblock.priorswap.kernel import PriorSwap

az = pytest.importorskip("arviz")
warnings.filterwarnings("ignore", category=FutureWarning)

Y = 1.0 + torch.randn(200, generator=torch.Generator().manual_seed(0))


def nan_model(y: torch.Tensor) -> None:
    """``log(s)`` is NaN for ``s < 0``: a prior draw lands in the NaN region half the time."""
    s = pyro.sample("s", dist.Normal(0.0, 1.0))
    pyro.factor("f", torch.log(s))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("y", dist.Normal(s, 1.0), obs=y[idx])


def cut_model(y: torch.Tensor) -> None:
    """Zero density for ``s < 0``."""
    s = pyro.sample("s", dist.Normal(0.0, 1.0))
    pyro.factor("cut", torch.where(s > 0, torch.zeros_like(s), torch.full_like(s, -math.inf)))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("y", dist.Normal(s, 1.0), obs=y[idx])


def impossible_model(y: torch.Tensor) -> None:
    s = pyro.sample("s", dist.Normal(0.0, 1.0))
    pyro.factor("cut", torch.where(s > 10.0, torch.zeros_like(s), torch.full_like(s, -math.inf)))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("y", dist.Normal(s, 1.0), obs=y[idx])


def austerity(model) -> AusterityMH:
    return AusterityMH(model, batch_size=50, normality_check=False, control_variate=None)


def lwa(model) -> LWAKernel:
    return LWAKernel(model, 40, plate="data")


def run(kernel, *args, num_samples: int = 40, warmup: int = 20, hook=None) -> MCMC:
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True, hook_fn=hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(*args)
    return mcmc


@pytest.mark.parametrize("seed", range(10))
def test_austerity_from_the_prior_leaves_a_nan_region(seed: int) -> None:
    pyro.set_rng_seed(seed)
    samples = run(austerity(nan_model), Y).get_samples()["s"]
    assert (samples > 0).all() and torch.isfinite(samples).all()


@pytest.mark.parametrize("seed", range(5))
def test_austerity_from_the_prior_leaves_a_zero_region(seed: int) -> None:
    pyro.set_rng_seed(seed)
    assert (run(austerity(cut_model), Y).get_samples()["s"] > 0).all()


@pytest.mark.parametrize("make", [austerity, lwa], ids=["austerity", "lwa"])
@pytest.mark.parametrize(
    ("model", "init", "message"),
    [
        (nan_model, -0.5, r"initial_params have a NaN log density: sites \['f'\] at \(s=-0.5\)"),
        (cut_model, -1.0, r"initial_params have zero density: sites \['cut'\] at \(s=-1\)"),
        (nan_model, math.nan, r"sites \['s'\] hold NaN or inf values"),
        (nan_model, math.inf, r"sites \['s'\] hold NaN or inf values"),
    ],
)
def test_a_users_impossible_start_is_refused_naming_the_sites(make, model, init: float, message: str) -> None:
    kernel = make(model)
    kernel.initial_params = {"s": torch.tensor(init)}
    with pytest.raises(ValueError, match=message):
        run(kernel, Y)


@pytest.mark.parametrize("make", [austerity, lwa], ids=["austerity", "lwa"])
def test_a_valid_user_start_is_honoured(make) -> None:
    kernel = make(nan_model)
    kernel.initial_params = {"s": torch.tensor(0.9)}
    kernel.setup(0, Y)
    assert float(kernel.initial_params["s"]) == pytest.approx(0.9)


def test_austerity_without_positive_density_in_reach_raises_naming_the_site() -> None:
    with pytest.raises(ValueError, match=r"found no start of positive density.*sites \['cut'\].*initial_params inside"):
        austerity(impossible_model).setup(0, Y)


def test_lwa_without_positive_density_in_reach_raises() -> None:
    with pytest.raises(ValueError, match="initial_params"):
        lwa(impossible_model).setup(0, Y)


def test_a_start_inside_a_hard_region_is_honoured() -> None:
    kernel = AusterityMH(impossible_model, batch_size=50, normality_check=False, control_variate=None, step_size=0.1)
    kernel.initial_params = {"s": torch.tensor(10.5)}
    assert (run(kernel, Y).get_samples()["s"] > 10.0).all()


def acceptance_shown(kernel, *args) -> tuple[list[float], dict]:
    shown: list[float] = []
    run(kernel, *args, num_samples=200, warmup=50, hook=lambda k, p, stage, i: shown.append(k.logging()["acc"]))
    return shown[50:], kernel.diagnostics()


def test_lwa_progress_bar_shows_a_running_acceptance_rate() -> None:
    kernel = LWAKernel(cut_model, 40, plate="data")
    sampling, diag = acceptance_shown(kernel, Y)
    assert any(0.0 < a < 1.0 for a in sampling)
    assert sampling[-1] == pytest.approx(diag["acceptance_rate"], abs=0.01)


def swap_draws() -> dict[str, torch.Tensor]:
    return {"theta": 1.0 + 0.3 * torch.randn(500, generator=torch.Generator().manual_seed(4))}


@pytest.mark.parametrize("name", ["mh"])
def test_priorswap_progress_bar_shows_a_running_acceptance_rate(name: str) -> None:
    kernel = PriorSwap(swap_draws(), Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel=name)
    sampling, diag = acceptance_shown(kernel)
    assert any(0.0 < a < 1.0 for a in sampling)
    assert sampling[-1] == pytest.approx(diag["acceptance_rate"], abs=1e-3)


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ({"theta": math.nan}, r"sites \['theta'\] hold NaN or inf values"),
        ({"theta": -math.inf}, r"sites \['theta'\] hold NaN or inf values"),
        ({}, r"initial_params lack sites \['theta'\]"),
    ],
)
def test_priorswap_refuses_an_impossible_user_start(init: dict, message: str) -> None:
    kernel = PriorSwap(swap_draws(), Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="mh")
    kernel.initial_params = {k: torch.tensor(v) for k, v in init.items()}
    with pytest.raises(ValueError, match=message):
        run(kernel)


def test_priorswap_divergences_are_a_list_of_draw_indices_and_arviz_reads_them() -> None:
    kernel = PriorSwap(swap_draws(), Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="nuts")
    mcmc = run(kernel)
    diag = kernel.diagnostics()
    assert isinstance(diag["divergences"], list) and diag["num_divergences"] == len(diag["divergences"])
    assert all(0 <= i < 40 for i in diag["divergences"])
    idata = az.from_pyro(mcmc)
    assert idata.posterior["theta"].shape == (1, 40)
    assert int(idata.sample_stats["diverging"].values.sum()) == len(diag["divergences"])


@pytest.mark.parametrize("name", ["austerity", "lwa", "priorswap mh"])
def test_arviz_from_pyro_reads_the_global_kernels(name: str) -> None:
    if name == "priorswap mh":
        kernel, args, site = PriorSwap(swap_draws(), Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="mh"), (), "theta"
    else:
        kernel, args, site = (austerity if name == "austerity" else lwa)(cut_model), (Y,), "s"
    mcmc = run(kernel, *args)
    assert mcmc.diagnostics()["divergences"] == {"chain 0": []}
    idata = az.from_pyro(mcmc)
    assert idata.posterior[site].shape == (1, 40)
    assert not idata.sample_stats["diverging"].values.any()
