"""Gibbs-with-Gradients, discrete Langevin (DMALA) and path auxiliary (PAS) kernels against enumeration.

Statistical tests use ``K`` independent chains, so a pooled estimate over the chains at one
time is a mean of ``K`` independent draws and its binomial standard deviation
``sqrt(p (1 - p) / K)`` is exact. Each test looks at ``m`` indicator features (every
``P(x_i = a)`` and every ``P(x_i = x_j)`` over the graph's pairwise factors) and fails when a
``|z|`` exceeds the Bonferroni normal quantile ``Phi^-1(1 - 1e-3 / (2 m))`` (about 4.1 for the
``m`` of 20-27 here): a false-failure rate of at most about 1e-3 per test over random seeds.

* **Invariance**: 512 chains start from exact draws (by enumeration) and take 20 transitions;
  they must still follow the exact distribution. The **power check** removes the proposal ratio
  from the MH test (a private flag) and runs the same test, which must then fail.
* **Convergence**: 512 chains from the all-zeros state, 300 transitions (DMALA: 50 of warmup
  adaptation, then frozen), against the exact marginals.
* **Pyro model**: 256 chains of a compiled Pyro model (categorical and Bernoulli sites, one
  observed, one ``pyro.factor``), 60 warmup steps, the last of 5 draws against enumeration.

Measured over seeds 0-5 (the tests run seed 0): exact kernels max |z| 1.4-3.0 (limits 4.06 and
4.10), broken kernels 5.9-10.6; convergence max |z| 1.3-3.6; Pyro model 0.5-3.0 (limit 3.80).
"""

from __future__ import annotations

import itertools
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from scipy import stats

from neuralblock import DiscreteLangevin, FactorGraph, GibbsWithGradients, PathAuxiliarySampler
from neuralblock.kernels.gradient_discrete import OneHotEnergy
from neuralblock.pyro import from_pyro_model

ALPHA = 1e-3
CHAINS = 512
STEPS = 20  # transitions of the invariance test
BURN_IN = 300  # transitions of the convergence test

KERNELS = {
    "gwg": lambda model, chains, **kw: GibbsWithGradients(model, chains=chains, **kw),
    "pas": lambda model, chains, **kw: PathAuxiliarySampler(model, path_length=3, chains=chains, **kw),
    "pas-random": lambda model, chains, **kw: PathAuxiliarySampler(
        model, path_length=4, random_length=True, chains=chains, **kw
    ),
    "dmala": lambda model, chains, **kw: DiscreteLangevin(
        model, step_size=1.0, adapt_step_size=False, chains=chains, **kw
    ),
}


# -- test graphs --------------------------------------------------------------------------
ISING_EDGES = [(i, (i + 1) % 8) for i in range(8)] + [(0, 4), (1, 5), (2, 6), (3, 7)]
CATEGORICAL_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 0), (0, 3), (2, 5)]
CATEGORICAL_CARDS = [3, 2, 3, 3, 2, 3, 2]


def ising_graph(seed: int = 1) -> FactorGraph:
    """8 spins on a ring with chords, couplings |J| in [0.6, 1.2] (30% frustrated), fields ~0.3."""
    gen = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    fg.add_variables(8, cardinality=2)
    count = len(ISING_EDGES)
    sign = torch.where(torch.rand(count, generator=gen) < 0.3, -1.0, 1.0)
    coupling = (torch.rand(count, generator=gen) * 0.6 + 0.6) * sign
    spin = torch.tensor([-1.0, 1.0])
    fg.add_table_factors(torch.tensor(ISING_EDGES), coupling[:, None, None] * spin[:, None] * spin[None, :])
    field = torch.randn(8, generator=gen) * 0.3
    fg.add_table_factors(torch.arange(8)[:, None], field[:, None] * spin)
    return fg


def categorical_graph(seed: int = 2) -> FactorGraph:
    """7 variables of 2 and 3 values: 9 pairwise tables (sd 1.3), one 3-way table with a zero, unary tables."""
    gen = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    for i, k in enumerate(CATEGORICAL_CARDS):
        fg.add_variable(f"v{i}", k)
    cards = CATEGORICAL_CARDS
    for a, b in CATEGORICAL_EDGES:
        fg.add_table_factor([a, b], torch.randn(cards[a], cards[b], generator=gen) * 1.3)
    triple = torch.randn(cards[1], cards[3], cards[6], generator=gen)
    triple[1, 2, 1] = -math.inf  # an impossible combination: never visited
    fg.add_table_factor([1, 3, 6], triple)
    for i, k in enumerate(cards):
        fg.add_table_factor([i], torch.randn(k, generator=gen) * 0.5)
    return fg


GRAPHS = {"ising": (ising_graph, ISING_EDGES), "categorical": (categorical_graph, CATEGORICAL_EDGES)}


def enumerate_joint(fg: FactorGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """All states (evidence fixed) and their exact probabilities."""
    ranges = [[int(fg.evidence[v])] if v in fg.evidence else range(k) for v, k in enumerate(fg.cardinalities.tolist())]
    states = torch.tensor(list(itertools.product(*ranges)), dtype=torch.float32)
    return states, torch.softmax(fg.log_joint(states).double(), 0)


def features(fg: FactorGraph, states: torch.Tensor, edges: list[tuple[int, int]]) -> torch.Tensor:
    """Indicators ``[..., m]``: x_i = a (one value dropped for binary variables), x_i = x_j on the edges."""
    columns = []
    for i, k in enumerate(fg.cardinalities.tolist()):
        columns += [states[..., i] == a for a in range(1 if k == 2 else k)]
    columns += [states[..., a] == states[..., b] for a, b in edges]
    return torch.stack(columns, -1).double()


def max_z(fg: FactorGraph, draws: torch.Tensor, edges: list[tuple[int, int]]) -> tuple[float, float]:
    """Largest |z| of the pooled feature means of independent draws ``[K, n]``, and the Bonferroni limit."""
    states, probs = enumerate_joint(fg)
    exact = (probs[:, None] * features(fg, states, edges)).sum(0)
    estimate = features(fg, draws, edges).mean(0)
    sd = (exact * (1 - exact) / draws.shape[0]).sqrt()
    keep = sd > 0
    z = (estimate - exact)[keep] / sd[keep]
    limit = stats.norm.ppf(1 - ALPHA / (2 * int(keep.sum())))
    return float(z.abs().max()), float(limit)


def exact_draws(fg: FactorGraph, count: int) -> torch.Tensor:
    states, probs = enumerate_joint(fg)
    return states[torch.multinomial(probs.float(), count, replacement=True)]


def transitions(kernel, start: torch.Tensor, steps: int, warmup: int = 0) -> torch.Tensor:
    """Run ``kernel`` from ``start [K, n]`` for ``warmup + steps`` transitions; the final states."""
    kernel.initial_params = {"x": start}
    kernel.setup(warmup)
    params = kernel.initial_params
    for _ in range(warmup + steps):
        params = kernel.sample(params)
    return params["x"]


# -- the energy ------------------------------------------------------------------------------
def test_first_order_estimate_is_exact_on_tables() -> None:
    """g[i, a] - g[i, x_i] equals log p(x with x_i = a) - log p(x) for every single-variable change."""
    fg = categorical_graph()
    energy = OneHotEnergy(fg)
    states = exact_draws(fg, 64)
    value, grad = energy.value_and_grad(states)
    assert torch.allclose(value, fg.log_joint(states), atol=1e-4)
    for i, k in enumerate(CATEGORICAL_CARDS):
        for a in range(k):
            moved = states.clone()
            moved[:, i] = a
            truth = fg.log_joint(moved) - fg.log_joint(states)
            estimate = grad[:, i, a] - grad[:, i].gather(-1, states[:, i, None].long()).squeeze(-1)
            finite = torch.isfinite(truth)
            assert torch.allclose(estimate[finite], truth[finite], atol=1e-4)
            assert (estimate[~finite] < -1e29).all()  # an impossible move gets a huge negative logit


# -- invariance, with the power check -----------------------------------------------------------
@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_exact_distribution_is_invariant(name: str, graph: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, edges = GRAPHS[graph]
    fg = make()
    start = exact_draws(fg, CHAINS)
    kernel = KERNELS[name](fg, CHAINS)
    final = transitions(kernel, start, STEPS)
    z, limit = max_z(fg, final, edges)
    assert z <= limit, f"{name} on {graph}: max |z| = {z:.2f} > {limit:.2f}"
    assert torch.isfinite(fg.log_joint(final)).all()
    assert kernel.diagnostics()["acceptance_rate"] > 0.3

    # power: the same test with the proposal ratio left out of the MH test must fail
    broken = KERNELS[name](fg, CHAINS)
    monkeypatch.setattr(broken, "_exact_correction", False)
    z_broken, _ = max_z(fg, transitions(broken, start, STEPS), edges)
    assert z_broken > limit, f"{name} on {graph}: the broken kernel passes (max |z| = {z_broken:.2f})"


# -- convergence from a bad start -------------------------------------------------------------------
@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("name", ["gwg", "pas", "dmala"])
def test_converges_from_all_zeros(name: str, graph: str) -> None:
    make, edges = GRAPHS[graph]
    fg = make()
    if name == "dmala":  # adapted in warmup, frozen for the rest
        kernel = DiscreteLangevin(fg, step_size=0.2, chains=CHAINS)
        final = transitions(kernel, torch.zeros(CHAINS, fg.num_variables), BURN_IN - 50, warmup=50)
    else:
        final = transitions(KERNELS[name](fg, CHAINS), torch.zeros(CHAINS, fg.num_variables), BURN_IN)
    z, limit = max_z(fg, final, edges)
    assert z <= limit, f"{name} on {graph}: max |z| = {z:.2f} > {limit:.2f}"


def test_dmala_adapts_towards_target_then_freezes() -> None:
    fg = ising_graph()
    kernel = DiscreteLangevin(fg, step_size=5.0, target_accept=0.6, chains=256)
    kernel.initial_params = {"x": exact_draws(fg, 256)}
    kernel.setup(100)
    params = kernel.initial_params
    for _ in range(100):
        params = kernel.sample(params)
    adapted = kernel.step_size
    assert adapted < 5.0  # a too-large step was shrunk
    for _ in range(40):
        params = kernel.sample(params)
    diagnostics = kernel.diagnostics()
    assert diagnostics["step_size"] == adapted  # frozen after warmup
    assert abs(diagnostics["acceptance_rate"] - 0.6) < 0.1


# -- chains, evidence, Pyro ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_chains_are_independent_and_evidence_is_kept(name: str) -> None:
    fg = categorical_graph()
    fg.set_evidence({"v2": 1})
    kernel = KERNELS[name](fg, 64)
    final = transitions(kernel, torch.ones(64, fg.num_variables), 6)
    assert len(torch.unique(final, dim=0)) > 16  # one start, many different states
    assert (final[:, 2] == 1).all()
    assert torch.isfinite(fg.log_joint(final)).all()


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_held_variables_do_not_move(name: str) -> None:
    fg = ising_graph()
    kernel = KERNELS[name](fg, 32, variables=["x0", "x1", 2, 3])
    final = transitions(kernel, torch.zeros(32, 8), 20)
    assert (final[:, 4:] == 0).all() and (final[:, :4] != 0).any()


def test_pyro_mcmc_with_chains_gives_chain_dimension() -> None:
    fg = ising_graph()
    mcmc = MCMC(DiscreteLangevin(fg, chains=5), num_samples=12, warmup_steps=8, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples()["x"].shape == (12, 5, 8)
    diagnostics = mcmc.kernel.diagnostics()
    assert diagnostics["steps"] == 12 and diagnostics["updates_per_second"] > 0
    assert 0 < diagnostics["acceptance_rate"] <= 1


PROBS = torch.tensor([[0.2, 0.7, 0.6, 0.9], [0.5, 0.2, 0.9, 0.3], [0.8, 0.6, 0.1, 0.2]])


def mixture_model() -> None:
    """A 3-way categorical cluster with four binary features (one observed), a pairwise factor on two."""
    z = pyro.sample("z", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    feats = []
    for j in range(4):
        obs = torch.tensor(1.0) if j == 3 else None
        feats.append(pyro.sample(f"f{j}", dist.Bernoulli(PROBS[z, j]), obs=obs))
    pyro.factor("tie", 1.5 * (2 * feats[0] - 1) * (2 * feats[1] - 1))


@pytest.mark.parametrize("name", ["gwg", "pas", "dmala"])
def test_pyro_model_matches_enumeration(name: str) -> None:
    fg = from_pyro_model(mixture_model)
    chains = 256
    kernel = KERNELS[name](mixture_model, chains)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=60, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples()
    assert set(samples) == {"z", "f0", "f1", "f2"}
    assert all(value.shape == (5, chains) for value in samples.values())
    final = torch.stack([samples[site][-1] if site in samples else torch.ones(chains) for site in fg.names], -1)
    pairs = [(fg.variable_id("f0"), fg.variable_id("f1"))]
    z, limit = max_z(kernel.fg, final, pairs)
    assert z <= limit, f"{name}: max |z| = {z:.2f} > {limit:.2f}"


# -- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [GibbsWithGradients, DiscreteLangevin, PathAuxiliarySampler])
def test_bad_models_raise_clear_errors(cls) -> None:
    fg = FactorGraph()
    a, c = fg.add_variable("a", 2), fg.add_variable("c")
    fg.add_linear_gaussian(c, [a], [1.0], 0.0, 1.0)
    with pytest.raises(ValueError, match="continuous latent variables \\['c'\\]"):
        cls(fg).setup(0)
    fg = FactorGraph()
    a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
    fg.add_callable_factors(torch.tensor([[a, b]]), lambda values, params: -((values[..., 0] - values[..., 1]) ** 2))
    with pytest.raises(ValueError, match="non-table factor groups \\['CallableGroup'\\]"):
        cls(fg).setup(0)
    fg = FactorGraph()
    fg.add_variable("a", 1)
    with pytest.raises(ValueError, match="no discrete latent variable with two or more values"):
        cls(fg).setup(0)


def test_bad_arguments_raise() -> None:
    fg = ising_graph()
    with pytest.raises(ValueError, match="path_length"):
        PathAuxiliarySampler(fg, path_length=0)
    with pytest.raises(ValueError, match="step_size"):
        DiscreteLangevin(fg, step_size=-1.0)
    with pytest.raises(ValueError, match="target_accept"):
        DiscreteLangevin(fg, target_accept=1.5)
    with pytest.raises(ValueError, match="discrete latent variables only"):
        fg.set_evidence({0: 1})
        GibbsWithGradients(fg, variables=[0]).setup(0)
