"""CompoundKernel: invariance on a model with local discrete and global continuous sites, errors, plumbing."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels import CompoundKernel, ConditionedModel, GibbsKernel, RandomWalkMH

OBS = (1.1, -0.2, 0.9, 0.4)
NOISE = 0.7


def mixture_model() -> None:
    """Global p, four local labels z_i ~ Bernoulli(p), observations y_i ~ N(z_i, 0.7)."""
    p = pyro.sample("p", dist.Beta(2.0, 2.0))
    for i, y in enumerate(OBS):
        z = pyro.sample(f"z{i}", dist.Bernoulli(p))
        pyro.sample(f"y{i}", dist.Normal(z, NOISE), obs=torch.tensor(y))


def exact_moments() -> tuple[float, list[float]]:
    """E[p | y] and P(z_i = 1 | y) by quadrature over p and enumeration over z."""
    grid = torch.linspace(1e-6, 1 - 1e-6, 20001, dtype=torch.float64)
    log_prior = dist.Beta(torch.tensor(2.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)).log_prob(grid)
    y = torch.tensor(OBS, dtype=torch.float64)
    lik1 = dist.Normal(torch.ones(()).double(), NOISE).log_prob(y).exp()  # p(y_i | z_i = 1)
    lik0 = dist.Normal(torch.zeros(()).double(), NOISE).log_prob(y).exp()
    per_site = grid[:, None] * lik1 + (1 - grid[:, None]) * lik0  # [G, 4], z_i summed out
    weights = (log_prior + per_site.log().sum(1)).exp()
    weights = weights / weights.sum()
    mean_p = float((weights * grid).sum())
    post_z = [float((weights * grid * lik1[i] / per_site[:, i]).sum()) for i in range(len(OBS))]
    return mean_p, post_z


def test_compound_gibbs_plus_random_walk_matches_exact_posterior() -> None:
    # 4 chains x 800 draws (40 batch means); 5 z-scores with |z| < 4.5: false-failure rate below 1e-4.
    mean_p, post_z = exact_moments()
    kernel = CompoundKernel([(GibbsKernel(mixture_model), None), (RandomWalkMH(mixture_model), ["p"])], steps=[1, 2])
    chains = []
    for chain in range(4):
        pyro.set_rng_seed(100 + chain)
        mcmc = MCMC(kernel, num_samples=800, warmup_steps=200, disable_progbar=True)
        mcmc.run()
        samples = mcmc.get_samples()
        chains.append(torch.stack([samples["p"]] + [samples[f"z{i}"] for i in range(4)], -1))
    draws = torch.stack(chains)  # [4, 800, 5]
    mean, se = batch_means_mcse(draws, num_batches=10)
    exact = torch.tensor([mean_p, *post_z], dtype=torch.float64)
    z = (mean - exact) / se
    assert z.abs().max() < 4.5, (mean.tolist(), exact.tolist(), z.tolist())
    diag = kernel.diagnostics()
    assert diag["visits"] == [1000, 1000]


def test_compound_with_pyro_nuts_on_a_conditioned_model() -> None:
    pyro.set_rng_seed(0)
    nuts = NUTS(ConditionedModel(mixture_model))
    kernel = CompoundKernel([(GibbsKernel(mixture_model), None), (nuts, ["p"])], schedule="random", weights=[1, 1])
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples()
    assert samples["p"].shape == (200,) and ((samples["p"] > 0) & (samples["p"] < 1)).all()
    assert set(samples) == {"p", "z0", "z1", "z2", "z3"}
    assert sum(kernel.diagnostics()["visits"]) == 300


def test_compound_runs_with_two_chains() -> None:
    gibbs = GibbsKernel(mixture_model)
    kernel = CompoundKernel([(gibbs, None), (RandomWalkMH(mixture_model), ["p"])])
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=10, num_chains=2, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples(group_by_chain=True)["p"].shape == (2, 30)
    graph = gibbs.fg
    MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True).run()
    assert gibbs.fg is graph  # the same conditioned sites: the graph built for them is kept


def test_random_schedule_ends_every_inner_warmup_with_the_compound_warmup() -> None:
    pyro.set_rng_seed(1)
    gibbs, walk = GibbsKernel(mixture_model), RandomWalkMH(mixture_model)
    kernel = CompoundKernel([(gibbs, None), (walk, ["p"])], schedule="random", weights=[3, 1], steps=[2, 1])
    kernel.setup(37)
    params = kernel.initial_params
    for _ in range(37):
        params = kernel.sample(params)
    # each inner kernel has run exactly its warmup transitions: the next one is a sampling transition
    assert gibbs._t == gibbs._warmup_steps and walk._t == walk._warmup_steps
    assert gibbs._warmup_steps + 2 * walk._warmup_steps == 2 * 37


TRANSITIONS = torch.tensor([[0.9, 0.1], [0.2, 0.8]])


def indexing_hmm(obs: torch.Tensor) -> None:
    """Discrete states used as indices (``TRANSITIONS[z]``): they must reach the model as integers."""
    scale = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    z = pyro.sample("z0", dist.Categorical(torch.tensor([0.5, 0.5])))
    for t in range(len(obs)):
        if t:
            z = pyro.sample(f"z{t}", dist.Categorical(TRANSITIONS[z]))
        pyro.sample(f"y{t}", dist.Normal(2.0 * z - 1.0, scale), obs=obs[t])


def test_compound_passes_discrete_values_in_their_dtype_and_reruns_on_other_data() -> None:
    pyro.set_rng_seed(0)
    kernel = CompoundKernel([(GibbsKernel(indexing_hmm), None), (RandomWalkMH(indexing_hmm), ["s"])])
    for length in (4, 6):  # the second run's data give the model other latent sites
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
        mcmc.run(torch.linspace(-1.0, 1.0, length))
        assert set(mcmc.get_samples()) == {"s", *(f"z{t}" for t in range(length))}
    nuts = NUTS(ConditionedModel(indexing_hmm))
    kernel = CompoundKernel([(GibbsKernel(indexing_hmm), None), (nuts, ["s"])])
    for length in (3, 5):
        mcmc = MCMC(kernel, num_samples=10, warmup_steps=5, disable_progbar=True)
        mcmc.run(torch.linspace(-1.0, 1.0, length))
        assert (mcmc.get_samples()["s"] > 0).all()


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ("empty", "at least one"),
        ("gibbs-only", "sampled by no block"),
        ("overlap", "disjoint"),
        ("unknown", "not a latent site"),
        ("two-rest", "at most one block"),
    ],
)
def test_compound_rejects_bad_site_sets(blocks: str, message: str) -> None:
    gibbs, rw = GibbsKernel(mixture_model), RandomWalkMH(mixture_model)
    table = {
        "empty": [],
        "gibbs-only": [(gibbs, ["z0", "z1", "z2", "z3"])],
        "overlap": [(gibbs, ["z0", "z1", "z2", "z3"]), (rw, ["p", "z0"])],
        "unknown": [(gibbs, None), (rw, ["q"])],
        "two-rest": [(gibbs, None), (rw, None)],
    }
    with pytest.raises(ValueError, match=message):
        kernel = CompoundKernel(table[blocks])  # type: ignore[index]
        kernel.setup(0)


def test_compound_rejects_bad_arguments() -> None:
    gibbs = GibbsKernel(mixture_model)
    with pytest.raises(ValueError, match="schedule"):
        CompoundKernel([(gibbs, None)], schedule="sweep")
    with pytest.raises(ValueError, match="steps"):
        CompoundKernel([(gibbs, None)], steps=[0])
    with pytest.raises(ValueError, match="weights"):
        CompoundKernel([(gibbs, None)], weights=[math.nan])
    with pytest.raises(TypeError, match="sites must be a list"):
        CompoundKernel([(gibbs, "p")])
    with pytest.raises(TypeError, match="MCMCKernel"):
        CompoundKernel([(object(), None)])  # type: ignore[list-item]


def test_conditioned_model_rejects_changing_sites_and_non_finite_values() -> None:
    cm = ConditionedModel(mixture_model, {"p": torch.tensor(0.3)})
    with pytest.raises(ValueError, match="same sites"):
        cm.set_values({"z0": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="not finite"):
        cm.set_values({"p": torch.tensor(math.nan)})


Y_GLOBAL = 0.8 + torch.randn(200, generator=torch.Generator().manual_seed(7))


def global_local_model(y: torch.Tensor) -> None:
    """Global w with a plate likelihood; three local labels whose logits are w."""
    w = pyro.sample("w", dist.Normal(0.0, 2.0))
    for k in range(3):
        pyro.sample(f"z{k}", dist.Bernoulli(logits=w))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(w, 1.0), obs=y[idx])


@pytest.mark.parametrize("global_kernel", ["austerity", "lwa"])
def test_sublinear_global_kernel_in_a_compound_sampler(global_kernel: str) -> None:
    # AusterityMH with epsilon=0 is exact MH, so Gibbs(z) + it must give the exact posterior:
    # the labels sum out, so w | y is the conjugate normal posterior and P(z_k = 1 | y) = E[sigmoid(w)].
    # 2 chains x 800 draws (20 batch means); 4 z-scores with |z| < 4.5: false-failure rate below 1e-4.
    # LWA with n = N and epsilon = inf has a single subset and is exact MH as well.
    from neuralblock import AusterityMH, LWAKernel

    y = Y_GLOBAL
    if global_kernel == "austerity":
        inner = AusterityMH(global_local_model, sites=["w"], epsilon=0.0, normality_check=False)
    else:
        inner = LWAKernel(global_local_model, subset_size=y.shape[0], sites=["w"], epsilon=math.inf)
    kernel = CompoundKernel([(GibbsKernel(global_local_model), None), (inner, ["w"])])
    mcmc = MCMC(kernel, num_samples=800, warmup_steps=200, num_chains=2, disable_progbar=True)
    mcmc.run(y)
    samples = mcmc.get_samples(group_by_chain=True)
    draws = torch.stack([samples["w"]] + [samples[f"z{k}"] for k in range(3)], -1)
    precision = 1 / 4 + y.shape[0]
    post_mean, post_sd = float(y.sum()) / precision, precision**-0.5
    grid = torch.linspace(post_mean - 8 * post_sd, post_mean + 8 * post_sd, 4001, dtype=torch.float64)
    weights = torch.distributions.Normal(post_mean, post_sd).log_prob(grid).exp()
    p_z = float((weights * torch.sigmoid(grid)).sum() / weights.sum())
    mean, se = batch_means_mcse(draws, num_batches=10)
    exact = torch.tensor([post_mean, p_z, p_z, p_z], dtype=torch.float64)
    z = (mean - exact) / se
    assert z.abs().max() < 4.5, (mean.tolist(), exact.tolist(), z.tolist())


def labelled_model(y: torch.Tensor, labels: int) -> None:
    """``global_local_model`` with a number of local labels that depends on the run's arguments."""
    w = pyro.sample("w", dist.Normal(0.0, 2.0))
    for k in range(labels):
        pyro.sample(f"z{k}", dist.Bernoulli(logits=w))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(w, 1.0), obs=y[idx])


@pytest.mark.parametrize("global_kernel", ["austerity", "lwa"])
def test_sublinear_global_kernel_reruns_on_a_model_with_other_local_sites(global_kernel: str) -> None:
    from neuralblock import AusterityMH, LWAKernel

    if global_kernel == "austerity":
        inner = AusterityMH(labelled_model, sites=["w"], epsilon=0.05, batch_size=20, normality_check=False)
    else:
        inner = LWAKernel(labelled_model, subset_size=20, sites=["w"])
    kernel = CompoundKernel([(GibbsKernel(labelled_model), None), (inner, ["w"])])
    for labels in (3, 5):
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
        mcmc.run(Y_GLOBAL, labels)
        assert set(mcmc.get_samples()) == {"w", *(f"z{k}" for k in range(labels))}
