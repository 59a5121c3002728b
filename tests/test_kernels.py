"""Invariance and contract tests for GibbsKernel and RandomWalkMH.

Statistical tests compare batch-means z-scores (4 chains x 20 batches) of visit
frequencies or moments with exact values. Each test tolerates
``|z| <= t_{79}^{-1}(1 - alpha / (2 m))`` for m compared quantities (Bonferroni),
so its false-failure rate over random seeds is at most ``alpha = 1e-3``.
"""

from __future__ import annotations

import math
import pickle
import warnings

import pytest
import torch
from _stats import bonferroni_t, enumerate_joint  # tests/ is on sys.path under pytest
from pyro.infer import MCMC
from torch.distributions import constraints

from neuralblock import FactorGraph, GibbsKernel, RandomWalkMH
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels import gibbs_sample, mh_accept, random_walk_propose

ALPHA = 1e-3
CHAINS = 4
BATCHES = 20


def run_chains(kernel, num_samples: int, warmup: int = 200) -> torch.Tensor:
    """Draws of a kernel built with ``chains=CHAINS`` (one vectorized run): ``[chains, samples, n]``."""
    assert kernel.chains == CHAINS
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()["x"].transpose(0, 1)


def random_discrete_graph(seed: int, evidence: bool) -> FactorGraph:
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    cards = [2, 3, 2, 3, 2]
    for i, k in enumerate(cards):
        fg.add_variable(f"v{i}", k)
    scopes = [[0, 1], [1, 2], [2, 3], [3, 4], [0, 4], [1, 3, 4], [2]]
    for scope in scopes:
        shape = [cards[v] for v in scope]
        fg.add_table_factor(scope, 1.5 * torch.randn(shape, generator=g))
    if evidence:
        fg.set_evidence({"v4": 1})
    return fg


@pytest.mark.parametrize("evidence", [False, True])
def test_gibbs_leaves_enumerated_joint_invariant(evidence: bool) -> None:
    fg = random_discrete_graph(seed=3 if evidence else 1, evidence=evidence)
    states, probs = enumerate_joint(fg)
    draws = run_chains(GibbsKernel(fg, chains=CHAINS), num_samples=2000)
    hits = (draws[:, :, None, :] == states[None, None]).all(-1).double()  # [c, s, K]
    mean, mcse = batch_means_mcse(hits, BATCHES)
    iid = (probs * (1 - probs) / hits[..., 0].numel()).sqrt()
    z = (mean - probs) / torch.maximum(mcse, iid)
    assert z.abs().max() <= bonferroni_t(len(probs), CHAINS * BATCHES - 1), f"max |z| = {z.abs().max():.2f}"
    if evidence:
        assert (draws[..., 4] == 1).all()


def test_gibbs_colours_are_conflict_free_and_cover_all_variables() -> None:
    fg = random_discrete_graph(seed=0, evidence=False)
    kernel = GibbsKernel(fg)
    kernel.setup(0)
    seen = []
    for vars_ in kernel.plan.classes:
        members = set(vars_.tolist())
        for v in members:
            assert not members & set(fg.markov_blanket(v))
        seen.extend(members)
    assert sorted(seen) == list(range(fg.num_variables))


def gaussian_chain() -> tuple[FactorGraph, torch.Tensor, torch.Tensor]:
    fg = FactorGraph()
    x = [fg.add_variable(f"x{i}") for i in range(4)]
    fg.add_linear_gaussian(x[0], [], [], 0.5, 1.0)
    fg.add_linear_gaussian(x[1], [x[0]], [0.8], 0.0, 0.7)
    fg.add_linear_gaussian(x[2], [x[1], x[0]], [0.6, -0.3], 0.2, 0.5)
    fg.add_linear_gaussian(x[3], [x[2]], [1.0], 0.0, 0.4)
    fg.set_evidence({"x3": 1.2})
    # exact posterior of x0..x2 from the joint Gaussian: x = A x + b + D eps
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[1, 0], a[2, 1], a[2, 0], a[3, 2] = 0.8, 0.6, -0.3, 1.0
    b = torch.tensor([0.5, 0.0, 0.2, 0.0], dtype=torch.float64)
    d = torch.diag(torch.tensor([1.0, 0.7, 0.5, 0.4], dtype=torch.float64))
    inv = torch.linalg.inv(torch.eye(4, dtype=torch.float64) - a)
    mean, cov = inv @ b, inv @ d @ d @ inv.T
    k = cov[:3, 3] / cov[3, 3]
    post_mean = mean[:3] + k * (1.2 - mean[3])
    post_var = torch.diag(cov[:3, :3]) - k * cov[3, :3]
    return fg, post_mean, post_var


def test_random_walk_matches_gaussian_posterior() -> None:
    fg, post_mean, post_var = gaussian_chain()
    draws = run_chains(RandomWalkMH(fg, chains=CHAINS), num_samples=3000, warmup=300)[..., :3].double()
    stats_ = torch.cat([draws, (draws - post_mean) ** 2], -1)
    target = torch.cat([post_mean, post_var])
    mean, mcse = batch_means_mcse(stats_, BATCHES)
    z = (mean - target) / mcse
    assert z.abs().max() <= bonferroni_t(len(target), CHAINS * BATCHES - 1), f"z = {z}"


def _gamma_log_density(values: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
    x = values[..., 0]
    return torch.distributions.Gamma(3.0, 2.0).log_prob(x)


def test_random_walk_on_positive_support_matches_gamma() -> None:
    fg = FactorGraph()
    fg.add_variable("rate", support=constraints.positive)
    fg.add_callable_factors(torch.tensor([[0]]), _gamma_log_density)
    draws = run_chains(RandomWalkMH(fg, chains=CHAINS), num_samples=4000, warmup=400)[..., 0].double()
    assert (draws > 0).all()
    stats_ = torch.stack([draws, draws.log()], -1)
    target = torch.tensor([1.5, torch.digamma(torch.tensor(3.0)).item() - math.log(2.0)], dtype=torch.float64)
    mean, mcse = batch_means_mcse(stats_, BATCHES)
    z = (mean - target) / mcse
    assert z.abs().max() <= bonferroni_t(2, CHAINS * BATCHES - 1), f"z = {z}"


def test_num_chains_two_and_diagnostics() -> None:
    fg = random_discrete_graph(seed=2, evidence=False)
    mcmc = MCMC(GibbsKernel(fg), num_samples=100, warmup_steps=10, num_chains=2, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples(group_by_chain=True)["x"]
    assert samples.shape == (2, 100, 5)
    assert not torch.equal(samples[0], samples[1])
    diag = mcmc.diagnostics()
    assert "r_hat" in diag["x"] and diag["sweeps"]["chain 0"] == 100.0
    mcmc.summary()


def test_kernels_pickle_and_resume_from_initial_params() -> None:
    fg, _, _ = gaussian_chain()
    kernel = RandomWalkMH(fg)
    clone = pickle.loads(pickle.dumps(kernel))
    start = torch.tensor([0.1, 0.2, 0.3, 1.2])
    mcmc = MCMC(clone, num_samples=5, warmup_steps=0, initial_params={"x": start}, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (5, 4)
    assert (mcmc.get_samples()["x"][:, 3] == 1.2).all()


def test_warmup_is_counted_by_the_kernel() -> None:
    fg, _, _ = gaussian_chain()
    kernel = RandomWalkMH(fg, step_size=5.0)
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=300, disable_progbar=True)
    mcmc.run()
    assert kernel.diagnostics()["mean_step_size"] < 5.0
    assert kernel._t == 350


def _mixture(obs: torch.Tensor) -> None:
    import pyro
    import pyro.distributions as dist

    p = pyro.sample("p", dist.Beta(2.0, 2.0))
    for i in range(len(obs)):
        z = pyro.sample(f"z{i}", dist.Bernoulli(p))
        pyro.sample(f"y{i}", dist.Normal(2.0 * z - 1.0, 0.7), obs=obs[i])


def test_a_kernel_run_alone_warns_about_the_latent_sites_it_leaves_at_their_start() -> None:
    from neuralblock import CompoundKernel

    obs = torch.tensor([1.0, 0.7, -1.2])
    with pytest.warns(RuntimeWarning, match=r"GibbsKernel leaves 1 latent variable\(s\) at their start \(\['p'\]\)"):
        GibbsKernel(_mixture).setup(0, obs)
    with pytest.warns(RuntimeWarning, match=r"RandomWalkMH leaves 3 latent variable\(s\).*'z0', 'z1', 'z2'"):
        RandomWalkMH(_mixture).setup(0, obs)
    with warnings.catch_warnings():  # in a compound sampler the other sites are another block's; or asked for
        warnings.simplefilter("error", RuntimeWarning)
        CompoundKernel([(GibbsKernel(_mixture), None), (RandomWalkMH(_mixture), ["p"])]).setup(0, obs)
        GibbsKernel(_mixture, variables=["z0", "z1", "z2"]).setup(0, obs)


def test_kernel_rejects_bad_inputs() -> None:
    fg, _, _ = gaussian_chain()
    with pytest.raises(ValueError, match="no discrete latent variable"):
        GibbsKernel(fg).setup(0)
    with pytest.raises(ValueError, match="continuous latent variables only"):
        RandomWalkMH(fg, variables=["x3"]).setup(0)
    with pytest.raises(ValueError, match="step_size"):
        RandomWalkMH(fg, step_size=0.0)
    for bad in (0.0, 1.0, 2.0):
        with pytest.raises(ValueError, match="target_accept"):
            RandomWalkMH(fg, target_accept=bad)
    with pytest.raises(TypeError, match="FactorGraph or a Pyro model"):
        GibbsKernel(42)
    with pytest.raises(TypeError, match="takes no model arguments"):  # e.g. MCMC(kernel).run(data): nowhere to go
        RandomWalkMH(fg).setup(0, torch.zeros(3))
    with pytest.raises(TypeError, match="takes no model arguments"):
        MCMC(RandomWalkMH(fg), num_samples=2, warmup_steps=0, disable_progbar=True).run(torch.zeros(3))
    kernel = RandomWalkMH(fg)
    kernel.setup(0)
    with pytest.raises(ValueError, match="NaN or inf"):
        kernel.sample({"x": torch.tensor([0.0, float("nan"), 0.0, 1.2])})
    with pytest.raises(ValueError, match=r"shape \[1, 4\] \(chains, variables\) or \[4\], got \(3,\)"):
        kernel.sample({"x": torch.zeros(3)})


@pytest.mark.parametrize(
    ("start", "message"),
    [
        ([0.0, 0.0, 0.0, 0.0, 0.0], "observed variable 'v4' differs from its evidence 1"),
        ([0.0, 0.5, 0.0, 0.0, 1.0], r"discrete variable 'v1' is not in 0\.\.2"),
        ([0.0, 3.0, 0.0, 0.0, 1.0], r"discrete variable 'v1' is not in 0\.\.2"),
    ],
)
def test_initial_states_must_respect_domains_and_evidence(start: list[float], message: str) -> None:
    kernel = GibbsKernel(random_discrete_graph(seed=0, evidence=True))
    kernel.initial_params = {"x": torch.tensor(start)}
    with pytest.raises(ValueError, match=message):
        kernel.setup(0)
    kernel.initial_params = {"x": torch.tensor([0.0, 2.0, 1.0, 0.0, 1.0])}
    kernel.setup(0)
    assert kernel.initial_params["x"].tolist() == [0.0, 2.0, 1.0, 0.0, 1.0]


def test_update_graph_moves_the_chain_to_new_evidence() -> None:
    def graph(observed: int) -> FactorGraph:
        fg = FactorGraph()
        a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
        fg.add_table_factor([a, b], torch.tensor([[30.0, 0.0], [0.0, 30.0]]))
        fg.set_evidence({"b": observed})
        return fg

    kernel = GibbsKernel(graph(0))
    kernel.setup(0)
    params = kernel.initial_params
    assert params["x"].tolist() == [0.0, 0.0]
    kernel.update_graph(graph(1))
    params = kernel.sample(params)  # the params still hold the old evidence value
    assert params["x"].tolist() == [1.0, 1.0]


def test_params_handed_back_are_taken_as_returned_and_other_params_are_checked() -> None:
    """Pyro hands sample() its last output back: the chain is the one a copy of those params makes."""
    fg = random_discrete_graph(seed=2, evidence=True)

    def chain(copy: bool) -> torch.Tensor:
        torch.manual_seed(0)
        kernel = GibbsKernel(fg, chains=3)
        kernel.setup(0)
        params, draws = kernel.initial_params, []
        for _ in range(30):
            params = kernel.sample({"x": params["x"].clone()} if copy else params)
            draws.append(params["x"].clone())
        return torch.stack(draws)

    handed_back = chain(copy=False)
    assert torch.equal(handed_back, chain(copy=True)) and (handed_back[..., 4] == 1).all()
    kernel = GibbsKernel(fg, chains=3)
    kernel.setup(0)
    params = kernel.sample(kernel.initial_params)
    bad = params["x"].clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        kernel.sample({"x": bad})


def test_float64_starts_keep_continuous_evidence() -> None:
    fg, _, _ = gaussian_chain()
    fg.set_evidence({"x3": 0.1})
    kernel = RandomWalkMH(fg)
    start = fg.initial_state()
    start[3] = 0.1
    kernel.initial_params = {"x": start.double()}  # 0.1 in float32, then float64: 0.10000000149...
    kernel.setup(0)
    assert float(kernel.initial_params["x"][3]) == 0.1


def test_initial_continuous_values_must_lie_in_their_support() -> None:
    fg = FactorGraph()
    fg.add_variable("rate", support=constraints.positive)
    kernel = RandomWalkMH(fg)
    kernel.initial_params = {"x": torch.tensor([-1.0])}
    with pytest.raises(ValueError, match="'rate' is outside its support"):
        kernel.setup(0)


def test_functional_core() -> None:
    info = mh_accept(torch.tensor([0.0, -float("inf"), float("nan"), float("inf")]))
    assert info.accepted.tolist() == [True, False, False, False] and info.num_nonfinite == 2
    draw = gibbs_sample(torch.tensor([[-float("inf"), -float("inf")], [0.0, -float("inf")]]), torch.tensor([1.0, 1.0]))
    assert draw.values.tolist() == [1.0, 0.0] and draw.num_stuck == 1
    from torch.distributions import transforms

    x, corr = random_walk_propose(torch.full((1000,), 2.0), torch.tensor(0.3), transforms.ExpTransform())
    assert torch.allclose(corr, x.log() - math.log(2.0), atol=1e-5)


def conjugate_model(y: torch.Tensor) -> None:
    """Normal mean with a Gamma-distributed nuisance site, written with scalar sites."""
    import pyro
    import pyro.distributions as dist

    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    pyro.sample("s", dist.Gamma(3.0, 2.0))
    for i in range(len(y)):
        pyro.sample(f"y{i}", dist.Normal(mu, 1.0), obs=y[i])


def test_random_walk_on_a_pyro_model_matches_the_conjugate_posterior() -> None:
    y = torch.tensor([0.8, 1.5, 0.4])
    mcmc = MCMC(RandomWalkMH(conjugate_model, chains=CHAINS), num_samples=1200, warmup_steps=200, disable_progbar=True)
    mcmc.run(y)
    samples = mcmc.get_samples()  # sites [samples, chains]
    draws = torch.stack([samples["mu"], samples["s"]], -1).transpose(0, 1).double()
    assert (draws[..., 1] > 0).all()
    target = torch.tensor([float(y.sum()) / 4, 1.5], dtype=torch.float64)  # posterior mean of mu, prior mean of s
    mean, mcse = batch_means_mcse(draws, BATCHES)
    z = (mean - target) / mcse
    assert z.abs().max() <= bonferroni_t(2, CHAINS * BATCHES - 1), f"z = {z}"
