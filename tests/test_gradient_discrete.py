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

* **Exact one-step transitions** (GWG, DMALA, and PAS with paths of 2 moves): the transition matrix is built from the
  papers' formulas with exact single-site log-probability changes (independently of the kernels'
  one-hot gradients) and checked to leave the target invariant; 200 one-step transitions from
  every state are then compared with it by a chi-square test (``p > 1e-3``). The power check
  scores the reverse proposal with the current state's gradient instead of the proposal's, a
  slip the invariance test above is too weak to see (the stationary law of such a GWG is 0.09
  off in total variation on the Ising graph); it must fail.

Measured over seeds 0-5 (the tests run seed 0): exact kernels max |z| 1.4-3.0 (limits 4.06 and
4.10), broken kernels 5.9-10.6; convergence max |z| 1.3-3.6; Pyro model 0.5-3.0 (limit 3.80).
One-step chi-square p-values over seeds 0-2: exact 0.04-0.93, reverse-gradient slip below 1e-238.
PAS with paths of 2 moves (its matrix sums over paths; Ising graph), seeds 0-3: exact 0.70-0.88, slip 0.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from _stats import enumerate_joint  # tests/ is on sys.path under pytest
from pyro.infer import MCMC
from scipy import stats

from neuralblock import DiscreteLangevin, FactorGraph, GibbsWithGradients, PathAuxiliarySampler
from neuralblock.kernels.gradient_discrete import OneHotEnergy
from neuralblock.pyro import from_pyro_model

ALPHA = 1e-3
CHAINS = 512
STEPS = 20  # transitions of the invariance test
BURN_IN = 300  # transitions of the convergence test
REPS = 200  # one-step transitions from each state of the exact-transition test

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
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_read_from_the_tables_equals_autograd_of_the_relaxed_energy(seed: int) -> None:
    """value_and_grad's table reads give the value and gradient that autograd of energy() gives."""
    fg = categorical_graph(seed)  # arities 1, 2 and 3, 2 and 3 values, an impossible entry
    energy = OneHotEnergy(fg)
    gen = torch.Generator().manual_seed(seed)
    states = torch.stack([torch.randint(0, k, (5,), generator=gen) for k in CATEGORICAL_CARDS], -1)
    value, grad = energy.value_and_grad(states)

    def summed(onehot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        relaxed = energy.energy(onehot)
        return relaxed.sum(), relaxed

    want_grad, want_value = torch.func.grad(summed, has_aux=True)(energy.one_hot(states))
    torch.testing.assert_close(value, want_value, rtol=1e-6, atol=1e-3)  # values near -1e30 at the impossible entry
    finite = want_grad.abs() < 1e29
    torch.testing.assert_close(grad[finite], want_grad[finite])
    assert torch.equal(grad[~finite] < -1e29, want_grad[~finite] < -1e29)


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


@pytest.mark.parametrize("name", ["gwg", "pas-random", "dmala"])
def test_the_compiled_proposal_keeps_the_distribution_exact(name: str) -> None:
    """``compile=True`` runs the proposal under ``torch.compile``: the same kernel, its first call timed."""
    make, edges = GRAPHS["categorical"]
    fg = make()
    kernel = KERNELS[name](fg, CHAINS, compile=True)
    final = transitions(kernel, exact_draws(fg, CHAINS), STEPS)
    z, limit = max_z(fg, final, edges)
    assert z <= limit, f"compiled {name}: max |z| = {z:.2f} > {limit:.2f}"
    assert kernel.compile and kernel.diagnostics()["compile_seconds"] > 0.0
    assert KERNELS[name](fg, CHAINS, compile="auto").compile is False  # on a CPU


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


# -- exact one-step transitions, with a subtler power check --------------------------------------------
def _radix(cards: list[int]) -> torch.Tensor:
    """Place values of the enumeration order of :func:`enumerate_joint` (last variable fastest)."""
    out, step = [], 1
    for k in reversed(cards):
        out.append(step)
        step *= k
    return torch.tensor(out[::-1])


def _single_site_changes(fg: FactorGraph, states: torch.Tensor, log_p: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per state, variable and value: the index of the changed state and ``log p(y) - log p(x)`` ([S, n, A])."""
    cards = fg.cardinalities.tolist()
    width, radix = max(cards), _radix(cards)
    index = (states.long() * radix).sum(-1)
    values = torch.arange(width)
    target = index[:, None, None] + (values[None, None, :] - states.long()[:, :, None]) * radix[None, :, None]
    valid = values[None, None, :] < torch.tensor(cards)[None, :, None]
    target = torch.where(valid, target, index[:, None, None])
    change = torch.where(valid, log_p[target] - log_p[:, None, None], -math.inf)
    return target, change, valid


def exact_gwg_matrix(fg: FactorGraph, states: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """Gibbs-with-Gradients' transition matrix from the paper's formula, with exact single-site changes."""
    target, change, valid = _single_site_changes(fg, states, log_p)
    count = len(states)
    own = torch.nn.functional.one_hot(states.long(), change.shape[-1]).bool()
    logits = torch.where(valid & ~own, change / 2, -math.inf).flatten(1)  # log p change: tables are multilinear
    log_q = torch.log_softmax(logits, -1)  # [S, n * A]
    back = (states.long()[:, :, None] * 0 + states.long()[:, :, None]).expand_as(target)  # x_i: the value to return to
    # reverse move y -> x: at y = target[s, i, a], move variable i back to x_i
    flat_target = target.flatten(1)
    reverse_index = torch.arange(states.shape[1])[:, None].expand(-1, change.shape[-1]).flatten() * change.shape[-1]
    log_q_back = log_q[flat_target, reverse_index[None, :] + back.flatten(1)]
    log_alpha = (change.flatten(1) + log_q_back - log_q).clamp(max=0.0)
    matrix = torch.zeros(count, count, dtype=torch.float64)
    moves = torch.isfinite(log_q) & torch.isfinite(log_alpha)
    rows = torch.arange(count)[:, None].expand_as(flat_target)
    matrix.index_put_((rows[moves], flat_target[moves]), (log_q + log_alpha)[moves].exp(), accumulate=True)
    return matrix + torch.diag(1 - matrix.sum(1))  # rows of impossible states: NaN (not used)


def exact_dmala_matrix(fg: FactorGraph, states: torch.Tensor, log_p: torch.Tensor, alpha: float) -> torch.Tensor:
    """DMALA's transition matrix: independent per-variable proposals (the paper's formula), MH on the joint move."""
    _, change, valid = _single_site_changes(fg, states, log_p)
    own = torch.nn.functional.one_hot(states.long(), change.shape[-1]).bool()
    logits = torch.where(own, 0.0, change / 2 - 1 / alpha).masked_fill(~valid, -math.inf)
    log_q_var = torch.log_softmax(logits, -1)  # [S, n, A]: proposal of each variable's value from x
    picks = states.long().T  # [n, S]: the value of variable i in state t
    log_q = sum(log_q_var[:, i, picks[i]] for i in range(states.shape[1]))  # [S from, S to]
    log_alpha = (log_p[None, :] + log_q.T - log_p[:, None] - log_q).clamp(max=0.0)
    matrix = (log_q + log_alpha).exp().nan_to_num(0.0)
    matrix.fill_diagonal_(0.0)
    return matrix + torch.diag(1 - matrix.sum(1))


def one_step_p_value(kernel, fg: FactorGraph, states: torch.Tensor, matrix: torch.Tensor, reps: int) -> float:
    """Chi-square p-value of ``reps`` one-step transitions from every state of positive probability against
    ``matrix`` (all enumerated ``states``; cells with expected counts under 5 lumped per row; a transition
    the matrix gives probability 0 fails outright)."""
    valid = torch.isfinite(fg.log_joint(states))
    start = states[valid].repeat_interleave(reps, 0)
    final = transitions(kernel, start, 1)
    source = valid.nonzero().squeeze(1).repeat_interleave(reps)
    counts = torch.zeros_like(matrix)
    index = (final.long() * _radix(fg.cardinalities.tolist())).sum(-1)
    counts.index_put_((source, index), torch.ones(len(source), dtype=matrix.dtype), True)
    counts, matrix = counts[valid], matrix[valid]
    if bool(((matrix == 0) & (counts > 0)).any()):
        return 0.0
    expected = matrix * reps
    big = expected >= 5
    chi2 = (((counts - expected) ** 2 / expected.clamp(min=1e-300)) * big).sum()
    small_e, small_o = (expected * ~big).sum(1), (counts * ~big).sum(1)
    lumped = small_e > 0
    chi2 = chi2 + ((small_o - small_e)[lumped] ** 2 / small_e[lumped]).sum()
    dof = int(big.sum() + lumped.sum()) - len(matrix)
    return float(stats.chi2.sf(float(chi2), dof))


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("name", ["gwg", "dmala"])
def test_one_step_transitions_match_the_papers_kernel(name: str, graph: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, _ = GRAPHS[graph]
    fg = make()
    states, _ = enumerate_joint(fg)
    log_p = fg.log_joint(states).double()
    valid = torch.isfinite(log_p)
    if name == "gwg":
        matrix = exact_gwg_matrix(fg, states, log_p)
    else:
        matrix = exact_dmala_matrix(fg, states, log_p, alpha=1.0)
    pi = torch.softmax(log_p, 0)[valid]
    assert (pi @ matrix[valid][:, valid] - pi).abs().sum() < 1e-10  # the paper's kernel leaves the target invariant
    chains = int(valid.sum()) * REPS
    torch.manual_seed(0)
    assert one_step_p_value(KERNELS[name](fg, chains), fg, states, matrix, REPS) > ALPHA
    # power: the reverse proposal scored with the current state's gradient (an easy slip) must fail
    broken = KERNELS[name](fg, chains)
    monkeypatch.setattr(broken, "_reverse_at_proposal", False)
    assert one_step_p_value(broken, fg, states, matrix, REPS) < ALPHA


def exact_pas2_matrix(fg: FactorGraph, states: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """PAS's transition matrix for paths of 2 single-site moves, summed over paths (the paper's formula).

    Each step from walk state ``w`` proposes ``(i, a)``, ``a != w_i``, with probability proportional to
    ``exp((d_x(i, a) - d_x(i, w_i)) / 2)``, ``d_x`` the exact single-site changes at the path's start ``x``;
    the reverse path from ``y`` undoes the steps in reverse order with ``d_y``; one MH test per path.
    """
    target, change, valid = _single_site_changes(fg, states, log_p)
    count, n, width = change.shape
    moves = n * width
    var = torch.arange(moves) // width
    val = torch.arange(moves) % width
    radix = _radix(fg.cardinalities.tolist())
    longs = states.long()

    def step_log_q(start: torch.Tensor, walk: torch.Tensor) -> torch.Tensor:
        """``[B, n * A]`` log-probabilities of the moves from walk states ``walk [B, n]`` (start rows ``start``)."""
        d = change[start]  # [B, n, A] at the path's start
        own = d.gather(-1, walk[..., None])  # d(i, w_i)
        allowed = valid[0] & (torch.arange(width) != walk[..., None])
        return torch.log_softmax(((d - own) / 2).masked_fill(~allowed, -math.inf).flatten(1), -1)

    def moved(walk: torch.Tensor, move: int) -> torch.Tensor:
        out = walk.clone()
        out[:, var[move]] = val[move]
        return out

    matrix = torch.zeros(count, count, dtype=torch.float64)
    rows = torch.arange(count)
    first = step_log_q(rows, longs)  # [S, M]
    for m1 in range(moves):
        walk1 = moved(longs, m1)
        second = step_log_q(rows, walk1)  # [S, M]
        for m2 in range(moves):
            y = moved(walk1, m2)
            y_index = (y * radix).sum(-1)
            forward = first[:, m1] + second[:, m2]
            undo2 = (var[m2] * width + walk1[:, var[m2]])[:, None]
            back2 = step_log_q(y_index, y).gather(1, undo2).squeeze(1)  # undo step 2 from y
            undo1 = (var[m1] * width + longs[:, var[m1]])[:, None]
            back1 = step_log_q(y_index, walk1).gather(1, undo1).squeeze(1)  # then step 1
            log_alpha = (log_p[y_index] - log_p + back1 + back2 - forward).clamp(max=0.0)
            weight = (forward + log_alpha).exp().nan_to_num(0.0)
            matrix.index_put_((rows, y_index), weight, accumulate=True)
    return matrix + torch.diag(1 - matrix.sum(1))


def test_pas_one_step_transitions_match_the_papers_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Ising graph only: a path may pass through a state of zero probability, where the kernel's finite
    # stand-in for log 0 (exact for the kernel's own forward and reverse probabilities) differs from -inf
    fg = ising_graph()
    states, _ = enumerate_joint(fg)
    log_p = fg.log_joint(states).double()
    valid = torch.isfinite(log_p)
    matrix = exact_pas2_matrix(fg, states, log_p)
    pi = torch.softmax(log_p, 0)[valid]
    assert (pi @ matrix[valid][:, valid] - pi).abs().sum() < 1e-10
    chains = int(valid.sum()) * REPS
    torch.manual_seed(0)
    pas = PathAuxiliarySampler(fg, path_length=2, chains=chains)
    assert one_step_p_value(pas, fg, states, matrix, REPS) > ALPHA
    broken = PathAuxiliarySampler(fg, path_length=2, chains=chains)
    monkeypatch.setattr(broken, "_reverse_at_proposal", False)
    assert one_step_p_value(broken, fg, states, matrix, REPS) < ALPHA
