"""Pyro models as users write them (issue 20), compiled into table factors and sampled on them.

Five models written the Pyro way (an HMM with ``pyro.markov`` and a vectorized emission plate, a
Gaussian mixture with a ``Categorical`` assignment in ``pyro.plate("data")``, an Ising model
with ``pyro.factor``, a Bayesian network of 3-valued ``Categorical`` sites, a hierarchical model
with one discrete latent per group in a plate) and two neural cases (a ``pyro.factor`` Ising
model with ``grid-mrf-2x2``, a 13-state Pyro HMM with ``crf_tags-3``). The GMM (with Dirichlet
weights) and the hierarchical model (with its global mean) also run under ``CompoundKernel``:
``GibbsKernel`` for the plated discrete sites, ``RandomWalkMH`` or Pyro's ``NUTS`` for the globals.

References are exact: Pyro's own ``TraceEnum_ELBO.compute_marginals`` (a contraction
independent of our compiler), or brute-force enumeration of a formula written out by hand.
Statistical tests compare sampled marginals by batch-means z-scores with ``|z| < 4.5``
(a standard error floored at 0.02 / 4.5 where a marginal barely moves); each test checks at
most ~60 z-scores, so its false-failure rate is below 60 * 6.8e-6 < 5e-4.
"""

from __future__ import annotations

import itertools
import math
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, TraceEnum_ELBO, config_enumerate
from pyro.ops.indexing import Vindex

from neuralblock import GibbsKernel, load_pretrained
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.exact import marginals
from neuralblock.kernels import CompoundKernel, NeuralBlockKernel, RandomWalkMH
from neuralblock.pyro import CompiledTableGroup, PyroGraph, from_pyro_model, samples_to_state

LIMIT = 4.5
FLOOR = 0.02 / LIMIT

# ---------------------------------------------------------------------------- the five models
K = 3
INIT = torch.tensor([0.5, 0.3, 0.2])
TRANS = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
EMIT = torch.tensor([[0.9, 0.1, 0.2, 0.5], [0.2, 0.8, 0.7, 0.5], [0.5, 0.5, 0.1, 0.9]])
TONES = torch.tensor([[1, 0, 0, 1], [1, 0, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0], [0, 0, 1, 1.0]])


def hmm(data: torch.Tensor) -> None:
    """HMM with K=3 states, a pyro.markov chain and a vectorized plate of Bernoulli tones per step."""
    tones = pyro.plate("tones", data.shape[-1])
    x = None
    for t in pyro.markov(range(data.shape[0])):
        x = pyro.sample(f"x_{t}", dist.Categorical(INIT if x is None else TRANS[x]))
        with tones:
            pyro.sample(f"y_{t}", dist.Bernoulli(EMIT[x.squeeze(-1)]), obs=data[t])


def hmm_sequences(data: torch.Tensor) -> None:
    """The same HMM vectorized over a plate of sequences (``data [N, T, D]``), as in Pyro's HMM tutorial."""
    tones = pyro.plate("tones", data.shape[-1], dim=-1)
    with pyro.plate("sequences", data.shape[0], dim=-2):
        x = None
        for t in pyro.markov(range(data.shape[1])):
            x = pyro.sample(f"x_{t}", dist.Categorical(INIT if x is None else TRANS[x]))
            with tones:
                pyro.sample(f"y_{t}", dist.Bernoulli(Vindex(EMIT)[x, torch.arange(data.shape[-1])]), obs=data[:, t])


GMM_DATA = torch.tensor([-2.1, -1.7, 0.3, 0.1, 2.4, 1.9, -0.2, 2.2, -1.1, 0.8])
GMM_LOCS = torch.tensor([-2.0, 0.0, 2.0])


def gmm(data: torch.Tensor, weights: torch.Tensor | None = None) -> None:
    """Gaussian mixture: mixture weights (Dirichlet unless given), a Categorical assignment per point."""
    if weights is None:
        weights = pyro.sample("weights", dist.Dirichlet(torch.ones(K)))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(GMM_LOCS[z], 0.8), obs=data)


L = 4
FIELD = 0.4 * torch.randn(L, L, generator=torch.Generator().manual_seed(5))


def ising(size: int = L, coupling: float = 0.45, field: torch.Tensor = FIELD) -> None:
    """Ising model: one Bernoulli spin per cell, pyro.factor for each edge; rows under pyro.markov."""
    s: dict[tuple[int, int], torch.Tensor] = {}
    for i in pyro.markov(range(size)):
        for j in range(size):
            s[i, j] = pyro.sample(f"s_{i}_{j}", dist.Bernoulli(logits=2 * field[i, j]))
            spin = 2 * s[i, j] - 1
            if i > 0:
                pyro.factor(f"v_{i}_{j}", coupling * spin * (2 * s[i - 1, j] - 1))
            if j > 0:
                pyro.factor(f"h_{i}_{j}", coupling * spin * (2 * s[i, j - 1] - 1))


def ising_exact(size: int = L, coupling: float = 0.45, field: torch.Tensor = FIELD) -> torch.Tensor:
    """P(s_ij = 1), row-major, by brute force over 2^(size^2) states of the energy written out by hand."""
    states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=size * size)), dtype=torch.float64)
    grid = states.reshape(-1, size, size)
    spin = 2 * grid - 1
    f = 2 * field.double()
    log_p = (grid * f - torch.nn.functional.softplus(f)).sum((1, 2))
    log_p = log_p + coupling * (
        (spin[:, 1:, :] * spin[:, :-1, :]).sum((1, 2)) + (spin[:, :, 1:] * spin[:, :, :-1]).sum((1, 2))
    )
    probs = torch.softmax(log_p, 0)
    return (probs[:, None] * states).sum(0)


CPT_A = torch.tensor([0.5, 0.3, 0.2])
CPT_B = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
CPT_C = torch.softmax(torch.randn(K, K, K, generator=torch.Generator().manual_seed(6)), -1)
CPT_D = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]])


def bayes_net(evidence: torch.Tensor) -> None:
    """a -> b, (a, b) -> c, c -> d for each of several cases; d observed; 3-valued Categorical sites in a loop."""
    for n in range(len(evidence)):
        a = pyro.sample(f"a_{n}", dist.Categorical(CPT_A))
        b = pyro.sample(f"b_{n}", dist.Categorical(CPT_B[a]))
        c = pyro.sample(f"c_{n}", dist.Categorical(Vindex(CPT_C)[a, b]))
        pyro.sample(f"d_{n}", dist.Categorical(CPT_D[c]), obs=evidence[n])


HIER_DATA = torch.tensor(
    [[0.3, -0.4, 0.9, 0.1], [2.8, 3.4, 2.1, 3.0], [0.2, 1.1, -0.5, 0.4], [3.3, 2.6, 2.9, 3.9], [1.4, 1.9, 0.8, 1.6]]
)


def hierarchical(data: torch.Tensor, mu: torch.Tensor | None = None) -> None:
    """Groups share a mean mu; each group is 'shifted' (z = 1, mean mu + 3) or not; observations nested in groups."""
    if mu is None:
        mu = pyro.sample("mu", dist.Normal(0.0, 2.0))
    with pyro.plate("groups", data.shape[0], dim=-1):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        with pyro.plate("obs", data.shape[1], dim=-2):
            pyro.sample("y", dist.Normal(mu + 3.0 * z, 1.0), obs=data.T)


# ---------------------------------------------------------------------------- helpers
def enum_marginals(model, *args) -> dict[str, torch.Tensor]:
    """Pyro's exact marginals of every enumerated site (TraceEnum_ELBO.compute_marginals)."""
    elbo = TraceEnum_ELBO(max_plate_nesting=2)
    found = elbo.compute_marginals(config_enumerate(model), lambda *a, **k: None, *args)
    return {name: d.probs for name, d in found.items()}


def run(kernel, *args, num_samples: int = 2000, warmup: int = 100, **kwargs) -> dict[str, torch.Tensor]:
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*args, **kwargs)
    return mcmc.get_samples()


def assert_marginals(draws: torch.Tensor, exact: torch.Tensor, num_batches: int = 20) -> None:
    """``draws [S, m]`` indicators/values against exact means ``[m]``: batch-means z-scores below LIMIT."""
    est, se = batch_means_mcse(draws[None].double(), num_batches)
    z = (est - exact.double()) / se.clamp(min=FLOOR)
    assert z.abs().max() < LIMIT, (est.tolist(), exact.tolist(), z.tolist())


def one_hot_draws(samples: torch.Tensor, k: int) -> torch.Tensor:
    """``[S, ...]`` values -> ``[S, ... * k]`` indicators."""
    return torch.nn.functional.one_hot(samples.round().long(), k).reshape(samples.shape[0], -1).double()


def check_log_density(model, *args) -> PyroGraph:
    """The compiled graph's log density equals Pyro's at prior draws; returns the graph."""
    fg = from_pyro_model(model, *args)
    for _ in range(4):
        trace = poutine.trace(model).get_trace(*args)
        values = {name: trace.nodes[name]["value"] for name in fg.sites}
        state = samples_to_state(fg, values)
        torch.testing.assert_close(fg.log_joint(state).double(), trace.log_prob_sum().double(), rtol=1e-5, atol=1e-4)
    return fg


# ---------------------------------------------------------------------------- compilation
def test_hmm_compiles_to_few_vectorized_groups_with_pyros_exact_marginals() -> None:
    fg = check_log_density(hmm, TONES)
    assert fg.names == [f"x_{t}" for t in range(6)]
    # one group per table shape: x_0's prior and the 6 emission rows (summed over the tones plate), 5 transitions
    assert [(g.table_shape, g.num_factors) for g in fg.groups] == [((3,), 7), ((3, 3), 5)]
    assert all(isinstance(g, CompiledTableGroup) for g in fg.groups)
    probs, _ = marginals(fg)
    exact = enum_marginals(hmm, TONES)
    for t in range(6):
        torch.testing.assert_close(probs[t].float(), exact[f"x_{t}"], atol=1e-5, rtol=0)


def test_plated_sites_become_element_variables_with_the_sites_shapes() -> None:
    data = torch.stack([TONES[:5], 1 - TONES[1:]])  # 2 sequences of 5 steps
    fg = check_log_density(hmm_sequences, data)
    assert fg.names[:4] == ["x_0[0,0]", "x_0[1,0]", "x_1[0,0]", "x_1[1,0]"]
    assert fg.sites["x_2"].ids.tolist() == [[4], [5]] and fg.sites["x_2"].shape == (2, 1)
    probs, _ = marginals(fg)
    exact = enum_marginals(hmm_sequences, data)
    for t in range(5):
        torch.testing.assert_close(probs[fg.sites[f"x_{t}"].ids.reshape(-1)].float(), exact[f"x_{t}"].reshape(2, 3))


def test_gmm_ising_bayes_net_and_hierarchical_compile_exactly() -> None:
    fg = check_log_density(gmm, GMM_DATA, torch.tensor([0.2, 0.5, 0.3]))
    assert fg.sites["z"].ids.tolist() == list(range(10)) and fg.names[3] == "z[3]"
    torch.testing.assert_close(
        marginals(fg)[0].float(), enum_marginals(gmm, GMM_DATA, torch.tensor([0.2, 0.5, 0.3]))["z"]
    )

    fg = check_log_density(ising)
    torch.testing.assert_close(marginals(fg)[0][:, 1], ising_exact(), atol=1e-6, rtol=0)

    evidence = torch.tensor([2, 0, 1])
    fg = check_log_density(bayes_net, evidence)
    assert sorted(fg.names[v] for v in fg.evidence) == ["d_0", "d_1", "d_2"]  # scalar observed sites: evidence
    probs, _ = marginals(fg)
    exact = enum_marginals(bayes_net, evidence)
    for name in ("a_0", "b_1", "c_2"):
        torch.testing.assert_close(probs[fg.variable_id(name)].float(), exact[name], atol=1e-5, rtol=0)

    fg = check_log_density(hierarchical, HIER_DATA, torch.tensor(0.5))
    assert [(g.table_shape, g.num_factors) for g in fg.groups] == [((2,), 10)]  # prior and likelihood per group
    p_shift = enum_marginals(hierarchical, HIER_DATA, torch.tensor(0.5))["z"]  # a Bernoulli marginal: P(z = 1)
    torch.testing.assert_close(marginals(fg)[0][:, 1].float(), p_shift)


def one_hot_model() -> None:
    with pyro.plate("p", 2):
        c = pyro.sample("c", dist.OneHotCategorical(torch.tensor([0.2, 0.3, 0.5])))
        pyro.factor("f", (c * torch.tensor([0.0, 1.0, -1.0])).sum(-1))


def test_one_hot_sites_compile_and_map_back_to_one_hot_values() -> None:
    fg = check_log_density(one_hot_model)
    assert fg.sites["c"].one_hot and fg.sites["c"].shape == (2, 3)
    weights = torch.tensor([0.2, 0.3, 0.5]) * torch.tensor([0.0, 1.0, -1.0]).exp()
    torch.testing.assert_close(marginals(fg)[0].float(), (weights / weights.sum()).expand(2, 3))


def test_compiled_graph_pickles_and_refreshes_in_place_for_new_conditioned_values() -> None:
    from neuralblock.kernels.conditioning import ConditionedModel

    conditioned = ConditionedModel(hierarchical, {"mu": torch.tensor(0.0)})
    fg = from_pyro_model(conditioned, HIER_DATA)
    (group,) = [g for g in fg.groups if g.table_shape == (2,)]  # mu's log-prior is a constant row of its own
    view = group._flat
    conditioned.set_values({"mu": torch.tensor(1.5)})
    group.refresh()
    fresh = from_pyro_model(hierarchical, HIER_DATA, torch.tensor(1.5))
    torch.testing.assert_close(group.log_tables, fresh.groups[0].log_tables)
    (constant,) = [g for g in fg.groups if g.table_shape == ()]
    torch.testing.assert_close(constant.log_tables, dist.Normal(0.0, 2.0).log_prob(torch.tensor([1.5])))
    assert view.data_ptr() == group._flat.data_ptr()  # kernels' views of the tables stay valid
    back = pickle.loads(pickle.dumps(fg))
    state = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(back.log_joint(state), fg.log_joint(state))


# ---------------------------------------------------------------------------- sampling on the tables
def test_gibbs_on_the_compiled_ising_and_bayes_net_matches_exact_marginals() -> None:
    # 16 + 27 z-scores, |z| < 4.5 each
    pyro.set_rng_seed(0)
    samples = run(GibbsKernel(ising), num_samples=3000)
    draws = torch.stack([samples[f"s_{i}_{j}"] for i in range(L) for j in range(L)], -1)
    assert_marginals(draws, ising_exact().float())

    evidence = torch.tensor([2, 0, 1])
    samples = run(GibbsKernel(bayes_net), evidence, num_samples=3000)
    exact = enum_marginals(bayes_net, evidence)
    names = [f"{s}_{n}" for n in range(3) for s in "abc"]
    draws = torch.cat([one_hot_draws(samples[name], K) for name in names], -1)
    assert_marginals(draws, torch.cat([exact[name] for name in names]))


def test_gibbs_samples_plated_sites_under_their_own_names_and_shapes() -> None:
    # HMM over 2 sequences (10 x 3 indicators), GMM (30), hierarchical (5): z-scores |z| < 4.5
    pyro.set_rng_seed(1)
    data = torch.stack([TONES[:5], 1 - TONES[1:]])
    samples = run(GibbsKernel(hmm_sequences), data, num_samples=2000)
    assert samples["x_3"].shape == (2000, 2, 1)
    exact = enum_marginals(hmm_sequences, data)
    draws = torch.cat([one_hot_draws(samples[f"x_{t}"], K) for t in range(5)], -1)
    assert_marginals(draws, torch.cat([exact[f"x_{t}"].reshape(-1) for t in range(5)]))

    weights = torch.tensor([0.2, 0.5, 0.3])
    samples = run(GibbsKernel(gmm), GMM_DATA, weights, num_samples=2000)
    assert samples["z"].shape == (2000, 10)
    assert_marginals(one_hot_draws(samples["z"], K), enum_marginals(gmm, GMM_DATA, weights)["z"].reshape(-1))

    mu = torch.tensor(0.5)
    samples = run(GibbsKernel(hierarchical), HIER_DATA, mu, num_samples=2000)
    assert samples["z"].shape == (2000, 5)
    assert_marginals(samples["z"], enum_marginals(hierarchical, HIER_DATA, mu)["z"])


# ---------------------------------------------------------------------------- neural block proposals
def test_pyro_factor_ising_matches_the_grid_motif_and_runs_under_neural_blocks() -> None:
    # 16 z-scores, |z| < 4.5; the 4x4 grid has 9 windows of 2x2
    proposal = load_pretrained("grid-mrf-2x2")
    assert len(proposal.motif.find_instances(from_pyro_model(ising))) == 9
    pyro.set_rng_seed(2)
    kernel = NeuralBlockKernel(ising, proposals=[proposal], gibbs_prob=0.3)
    samples = run(kernel, num_samples=2000)
    draws = torch.stack([samples[f"s_{i}_{j}"] for i in range(L) for j in range(L)], -1)
    assert_marginals(draws, ising_exact().float())
    diag = kernel.diagnostics()
    assert diag["instances"]["grid"] == 9 and diag["acceptance_by_proposal"]["grid"] > 0.2


K13 = 13
_G13 = torch.Generator().manual_seed(3)
TRANS13 = torch.softmax(torch.randn(K13, K13, generator=_G13) + 2.5 * torch.eye(K13), -1)
EMIT13 = torch.sigmoid(2 * torch.randn(K13, 3, generator=_G13))
TAG_DATA = torch.bernoulli(torch.full((7, 3), 0.5), generator=torch.Generator().manual_seed(4))


def tag_hmm(data: torch.Tensor) -> None:
    """A 13-state HMM (the crf_tags motif's tag set) with a vectorized emission plate."""
    tones = pyro.plate("tones", data.shape[-1])
    x = None
    for t in pyro.markov(range(data.shape[0])):
        x = pyro.sample(f"x_{t}", dist.Categorical(torch.full((K13,), 1.0 / K13) if x is None else TRANS13[x]))
        with tones:
            pyro.sample(f"y_{t}", dist.Bernoulli(EMIT13[x.squeeze(-1)]), obs=data[t])


def test_pyro_hmm_matches_crf_tags_and_runs_under_neural_blocks() -> None:
    # 7 x 13 = 91 indicators; only those with exact marginal > 0.02 are scored (at most 50 z-scores, |z| < 4.5)
    proposal = load_pretrained("crf_tags-3")
    assert len(proposal.motif.find_instances(from_pyro_model(tag_hmm, TAG_DATA))) == 5
    pyro.set_rng_seed(3)
    kernel = NeuralBlockKernel(tag_hmm, proposals=[proposal], gibbs_prob=0.3)
    samples = run(kernel, TAG_DATA, num_samples=2000)
    exact = enum_marginals(tag_hmm, TAG_DATA)
    draws = torch.cat([one_hot_draws(samples[f"x_{t}"], K13) for t in range(7)], -1)
    target = torch.cat([exact[f"x_{t}"] for t in range(7)])
    keep = target > 0.02
    assert_marginals(draws[:, keep], target[keep])
    assert kernel.diagnostics()["acceptance_by_proposal"]["crf_tags"] > 0.05
    assert math.isfinite(float(draws.mean()))


def test_no_instance_error_names_the_expected_structure_and_what_the_model_has() -> None:
    # the 3-state HMM is a chain, but of 3-ary variables: crf_tags-3 wants 13-ary ones
    kernel = NeuralBlockKernel(hmm, proposals=[load_pretrained("crf_tags-3")])
    expected = r"crf_tags looks for 3 consecutive latent variables of a chain of 13-ary .*pairwise \[13, 13\] tables"
    has = r"the model has latent variables that are 3-ary and factors: 7 tables of shape \[3\]; 5 tables of shape \[3,"
    with pytest.raises(ValueError, match=f"no instance.*{expected}.*{has}"):
        kernel.setup(0, TONES)
    # the 3-valued Bayesian network has no binary lattice
    kernel = NeuralBlockKernel(bayes_net, proposals=[load_pretrained("grid-mrf-2x2")])
    with pytest.raises(ValueError, match=r"grid looks for 2x2 windows of latent binary .*lattice.*that are 3-ary"):
        kernel.setup(0, torch.tensor([2, 0, 1]))


# ---------------------------------------------------------------------------- clear limits
def ising_vectorized(size: int = 3) -> None:
    """Spins in two plates with a factor over neighbouring elements: not a table under enumeration."""
    with pyro.plate("rows", size, dim=-2), pyro.plate("cols", size, dim=-1):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    spin = 2 * s - 1
    pyro.factor("coupling", (spin[..., 1:, :] * spin[..., :-1, :]).sum((-1, -2)))


def sum_outside_plate() -> None:
    with pyro.plate("data", 4):
        z = pyro.sample("z", dist.Bernoulli(0.5))
    pyro.sample("total", dist.Normal(z.sum(-1), 1.0), obs=torch.tensor(2.0))


def branching() -> None:
    with pyro.plate("data", 3):
        z = pyro.sample("z", dist.Bernoulli(0.5))
    if z.sum() > 1:
        pyro.sample("extra", dist.Bernoulli(0.5))


def unrolled_without_markov(n: int = 70) -> None:
    x = pyro.sample("x_0", dist.Bernoulli(0.5))
    for t in range(1, n):
        x = pyro.sample(f"x_{t}", dist.Bernoulli(0.2 + 0.6 * x))


def expanded_not_plated() -> None:
    pyro.sample("z", dist.Bernoulli(0.5).expand([3]))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (ising_vectorized, r"site 'coupling' .*combines several elements of the vectorized discrete site.*\['s'\]"),
        (sum_outside_plate, r"site 'total' .*several elements of the vectorized discrete site.*\['z'\].*pyro.markov"),
        (branching, r"'branching' has the sample sites \['extra'\] in some runs.*torch.where"),
        (unrolled_without_markov, r"enumerates 70 discrete sites at once.*pyro.markov"),
        (expanded_not_plated, r"site 'z' has batch shape \(3,\).*not a pyro.plate.*with pyro.plate"),
    ],
)
def test_constructs_enumeration_cannot_tabulate_raise_clear_errors(model, match) -> None:
    with pytest.raises(ValueError, match=match):
        from_pyro_model(model)


# ---------------------------------------------------------------------------- compound: discrete sites + globals
# Batch means over 40 batches: a z-score is t-distributed with 39 degrees of freedom; |z| < 5 has a false-failure
# rate of 1.3e-5 per z-score, and each test below checks at most 40 z-scores (< 5e-4 per test).
COMPOUND_LIMIT = 5.0
COMPOUND_BATCHES = 40


def assert_compound_means(draws: torch.Tensor, exact: torch.Tensor) -> None:
    est, se = batch_means_mcse(draws[None].double(), COMPOUND_BATCHES)
    z = (est - exact.double()) / se.clamp(min=1e-3 / COMPOUND_LIMIT)
    assert z.abs().max() < COMPOUND_LIMIT, (est.tolist(), exact.tolist(), z.tolist())


def gmm_exact(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E[weights | data] ``[K]`` and P(z_i = k | data) ``[N, K]`` of :func:`gmm` by enumerating all K^N assignments.

    With a Dirichlet(1) prior the weights integrate out: p(z) = Gamma(K) / Gamma(K + N) prod_k Gamma(1 + n_k),
    and E[weights | z] = (1 + n) / (K + N).
    """
    n = len(data)
    z = torch.cartesian_prod(*[torch.arange(K)] * n)  # [K^N, N]
    counts = torch.nn.functional.one_hot(z, K).sum(1).double()  # [K^N, K]
    log_prior = math.lgamma(K) - math.lgamma(K + n) + torch.lgamma(1 + counts).sum(-1)
    log_lik = dist.Normal(GMM_LOCS.double()[z], 0.8).log_prob(data.double()).sum(-1)
    post = torch.softmax(log_prior + log_lik, 0)
    weights = (post[:, None] * (1 + counts) / (K + n)).sum(0)
    assign = (post[:, None, None] * torch.nn.functional.one_hot(z, K).double()).sum(0)
    return weights, assign


def test_gmm_with_dirichlet_weights_under_gibbs_plus_random_walk_matches_enumeration() -> None:
    # 3 weights + 8 x 3 assignment indicators = 27 z-scores, |z| < 5
    data = GMM_DATA[:8]
    kernel = CompoundKernel([(GibbsKernel(gmm), ["z"]), (RandomWalkMH(gmm), ["weights"])])
    samples = run(kernel, data, num_samples=4000, warmup=300)
    assert samples["weights"].shape == (4000, K) and samples["z"].shape == (4000, 8)
    torch.testing.assert_close(samples["weights"].sum(-1), torch.ones(4000))
    # both blocks ran on recorded graphs: the re-tabulation of z's tables and the random-walk sweep
    gibbs, walk = kernel.kernels
    (tables,) = gibbs.fg.groups[0].compiler._replays.values()
    (sweep,) = walk.plan._replays.values()
    assert tables.verified and sweep.verified, (tables.failure, sweep.failure)
    weights, assign = gmm_exact(data)
    draws = torch.cat([samples["weights"].double(), one_hot_draws(samples["z"], K)], -1)
    assert_compound_means(draws, torch.cat([weights, assign.reshape(-1)]))


def hierarchical_exact(data: torch.Tensor) -> torch.Tensor:
    """E[mu], E[mu^2] and P(z_g = 1) (``[2 + G]``) of :func:`hierarchical` given ``data``, by quadrature over mu.

    The z_g are summed out per group: p(mu | y) ~ N(mu; 0, 2) prod_g (0.7 N(y_g; mu, 1) + 0.3 N(y_g; mu + 3, 1)).
    """
    mu = torch.linspace(-12.0, 12.0, 48_001, dtype=torch.float64)
    y = data.double()
    lik0 = math.log(0.7) + dist.Normal(mu[:, None, None], 1.0).log_prob(y).sum(-1)  # [M, G]
    lik1 = math.log(0.3) + dist.Normal(mu[:, None, None] + 3.0, 1.0).log_prob(y).sum(-1)
    per_group = torch.logaddexp(lik0, lik1)
    p = torch.softmax(dist.Normal(0.0, 2.0).log_prob(mu) + per_group.sum(-1), 0)
    shift = (p[:, None] * torch.exp(lik1 - per_group)).sum(0)
    return torch.cat([torch.stack([(p * mu).sum(), (p * mu**2).sum()]), shift])


def test_hierarchical_under_gibbs_plus_random_walk_and_plus_nuts_matches_quadrature() -> None:
    # per sampler: mu, mu^2 and 5 group indicators = 7 z-scores, |z| < 5
    from pyro.infer import NUTS

    from neuralblock.kernels.conditioning import ConditionedModel

    exact = hierarchical_exact(HIER_DATA)
    for globals_kernel, num in ((RandomWalkMH(hierarchical), 4000), (NUTS(ConditionedModel(hierarchical)), 1200)):
        kernel = CompoundKernel([(GibbsKernel(hierarchical), ["z"]), (globals_kernel, ["mu"])])
        samples = run(kernel, HIER_DATA, num_samples=num, warmup=200)
        assert samples["mu"].shape == (num,) and samples["z"].shape == (num, 5)
        draws = torch.cat([samples["mu"][:, None], samples["mu"][:, None] ** 2, samples["z"]], -1)
        assert_compound_means(draws, exact)


def test_marginal_random_walk_on_the_gmm_and_the_hierarchical_model_matches_exact_posteriors() -> None:
    # GMM: 3 weights + 8 x 3 assignment indicators; hierarchical: mu, mu^2 and 5 group indicators; |z| < 5
    from neuralblock.kernels import MarginalRandomWalk

    pyro.set_rng_seed(0)
    data = GMM_DATA[:8]
    kernel = MarginalRandomWalk(gmm)
    samples = run(kernel, data, num_samples=4000, warmup=300)
    assert kernel._sweep.verified  # the sweep ran as a recorded graph
    weights, assign = gmm_exact(data)
    draws = torch.cat([samples["weights"].double(), one_hot_draws(samples["z"], K)], -1)
    assert_compound_means(draws, torch.cat([weights, assign.reshape(-1)]))
    samples = run(MarginalRandomWalk(hierarchical, sweeps=2), HIER_DATA, num_samples=3000, warmup=200)
    assert samples["mu"].shape == (3000,) and samples["z"].shape == (3000, 5)
    draws = torch.cat([samples["mu"][:, None], samples["mu"][:, None] ** 2, samples["z"]], -1)
    assert_compound_means(draws, hierarchical_exact(HIER_DATA))


def scaled_hmm(data: torch.Tensor) -> None:
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    x = None
    for t in pyro.markov(range(len(data))):
        x = pyro.sample(f"x_{t}", dist.Categorical(torch.tensor([0.5, 0.5]) if x is None else TRANS_2[x]))
        pyro.sample(f"y_{t}", dist.Normal(x.float(), scale), obs=data[t])


TRANS_2 = torch.tensor([[0.9, 0.1], [0.2, 0.8]])


def test_marginal_random_walk_refuses_coupled_discrete_sites_and_all_discrete_models() -> None:
    from neuralblock.kernels import MarginalRandomWalk

    with pytest.raises(ValueError, match="share a factor.*CompoundKernel"):
        MarginalRandomWalk(scaled_hmm).setup(0, torch.tensor([0.1, 0.9, 1.2]))
    with pytest.raises(ValueError, match="only discrete.*GibbsKernel"):
        MarginalRandomWalk(gmm).setup(0, GMM_DATA[:4], torch.tensor([0.2, 0.5, 0.3]))
    with pytest.raises(ValueError, match="sweeps"):
        MarginalRandomWalk(gmm, sweeps=0)
    with pytest.raises(ValueError, match="step_size"):
        MarginalRandomWalk(gmm, step_size=-1.0)


def test_marginal_random_walk_starts_where_asked() -> None:
    from torch.distributions import biject_to, constraints

    from neuralblock.kernels import MarginalRandomWalk

    kernel = MarginalRandomWalk(gmm)
    start = torch.tensor([0.6, 0.3, 0.1])
    to_simplex = biject_to(constraints.simplex)
    kernel.initial_params = {"weights": to_simplex.inv(start)}  # unconstrained, as for Pyro's HMC
    kernel.setup(0, GMM_DATA[:4])
    got = kernel.transforms["weights"].inv(kernel.initial_params["weights"])
    torch.testing.assert_close(got, start)
    assert kernel.initial_params["z"].shape == (4,)
    kernel.initial_params = {"weights": torch.tensor([float("nan"), 0.0])}
    with pytest.raises(ValueError, match="non-finite log density"):
        kernel.setup(0, GMM_DATA[:4])


def test_marginal_random_walk_in_a_compound_sampler_follows_the_other_blocks() -> None:
    # mu ~ N(0, 1) moved by a random walk; the mixture's location shift s (fixed by the other block) moves mu's
    # posterior: if the walk kept a stale density or recorded s as a constant, mu would miss E[mu | y] by sds
    from neuralblock.kernels import ConditionedModel, MarginalRandomWalk

    pyro.set_rng_seed(1)
    kernel = CompoundKernel(
        [(MarginalRandomWalk(ConditionedModel(shifted_mixture)), ["mu", "z"]), (RandomWalkMH(shifted_mixture), ["s"])]
    )
    samples = run(kernel, SHIFT_DATA, num_samples=3000, warmup=300)
    s_grid = torch.linspace(-8.0, 8.0, 801, dtype=torch.float64)
    mu_grid = torch.linspace(-12.0, 12.0, 1201, dtype=torch.float64)
    y = SHIFT_DATA.double()
    lik = torch.logaddexp(
        math.log(0.5) + dist.Normal(mu_grid[:, None, None], 1.0).log_prob(y),
        math.log(0.5) + dist.Normal(mu_grid[:, None, None] + s_grid[None, :, None], 1.0).log_prob(y),
    ).sum(-1)  # [M, S]
    log_post = lik + dist.Normal(0.0, 1.0).log_prob(mu_grid)[:, None] + dist.Normal(0.0, 3.0).log_prob(s_grid)
    post = torch.softmax(log_post.reshape(-1), 0).reshape(log_post.shape)
    exact = torch.stack([(post.sum(1) * mu_grid).sum(), (post.sum(0) * s_grid).sum()])
    draws = torch.stack([samples["mu"], samples["s"]], -1)
    assert_compound_means(draws, exact)
    walk = kernel.kernels[0]
    assert walk._sweep.verified  # the moving s is an input of the recorded sweep, not a constant of it
    # a new value of the fixed site recomputes the cached log density, even when mu itself did not move
    params = {"mu": walk._u.clone(), "z": walk._values["z"]}
    walk.model.set_values({"s": torch.tensor(-6.0)})
    walk.sample(params)
    walk.model.set_values({"s": torch.tensor(-7.0)})
    walk._u = torch.full_like(walk._u, 99.0)  # force the next call to see its start as new... then undo:
    walk._u = params["mu"].reshape(-1).clone()
    before = walk._potential.clone()
    walk.sweeps, walk.adapt_step_size = 0, False  # no walk: only the cache logic runs
    walk.sample(params)
    torch.testing.assert_close(walk._potential, walk._potential_of(params["mu"].reshape(-1)))
    assert not torch.equal(before, walk._potential)


SHIFT_DATA = torch.tensor([0.3, -0.2, 4.1, 3.8, 0.1, 4.4, -0.4, 3.9])


def shifted_mixture(data: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    s = pyro.sample("s", dist.Normal(0.0, 3.0))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(mu + s * z, 1.0), obs=data)
