"""Tests for the Pyro bridge (neuralblock.pyro): graph -> Pyro model and back."""

from __future__ import annotations

import itertools
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, Predictive, TraceEnum_ELBO, config_enumerate, infer_discrete
from torch.distributions import constraints

from neuralblock import FactorGraph
from neuralblock.pyro import (
    FactorGraphModel,
    PyroModelGroup,
    PyroTableGroup,
    from_pyro_model,
    samples_to_state,
    state_to_samples,
    to_pyro_model,
)

# ---------------------------------------------------------------------------- fixtures


def random_mrf(seed: int, n: int = 6, n_factors: int = 8, evidence: bool = False) -> FactorGraph:
    """A random discrete MRF with cardinalities 2..3 and factors of arity 1..3."""
    gen = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    cards = torch.randint(2, 4, (n,), generator=gen).tolist()
    for i, k in enumerate(cards):
        fg.add_variable(f"v{i}", k)
    for _ in range(n_factors):
        arity = int(torch.randint(1, 4, (), generator=gen))
        scope = torch.randperm(n, generator=gen)[:arity].tolist()
        fg.add_table_factor(scope, torch.randn([cards[v] for v in scope], generator=gen))
    if evidence:
        fg.set_evidence({1: 1.0})
    return fg


def gaussian_chain(evidence: float | None = 1.0) -> FactorGraph:
    """x0 ~ N(0, 1), x1 ~ N(x0, 1), x2 ~ N(x1, 0.5), with x2 observed; plus a positive s ~ HalfNormal."""
    fg = FactorGraph()
    x0, x1, x2 = (fg.add_variable(f"x{i}") for i in range(3))
    fg.add_linear_gaussian(x0, [], [], 0.0, 1.0)
    fg.add_linear_gaussian(x1, [x0], [1.0], 0.0, 1.0)
    fg.add_linear_gaussian(x2, [x1], [1.0], 0.0, 0.5)
    if evidence is not None:
        fg.set_evidence({x2: evidence})
    return fg


def random_states(fg: FactorGraph, count: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([fg.initial_state(gen) for _ in range(count)])


def trace_log_prob(model, samples: dict, *args) -> torch.Tensor:
    return poutine.trace(poutine.condition(model, samples)).get_trace(*args).log_prob_sum()


def pyro_log_density(model, fg: FactorGraph, states: torch.Tensor, *args) -> torch.Tensor:
    """Pyro's log_prob_sum of ``model`` conditioned on each state, one trace per state."""
    return torch.stack([trace_log_prob(model, state_to_samples(fg, s), *args) for s in states])


TRANS = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
LOCS = torch.tensor([-2.0, 0.0, 2.0])


def hmm(data: torch.Tensor) -> None:
    """HMM with scalar sites in a Python loop, plus Bernoulli, positive and factor sites."""
    x = pyro.sample("x0", dist.Categorical(torch.tensor([0.5, 0.3, 0.2])))
    for t in range(len(data)):
        if t > 0:
            x = pyro.sample(f"x{t}", dist.Categorical(TRANS[x]))
        pyro.sample(f"y{t}", dist.Normal(LOCS[x], 1.0), obs=data[t])
    b = pyro.sample("b", dist.Bernoulli(0.3))
    s = pyro.sample("s", dist.HalfNormal(2.0))
    pyro.sample("z", dist.Normal(2.0 * b + x, s), obs=torch.tensor(0.3))
    pyro.factor("penalty", -0.1 * s**2)
    pyro.sample("const", dist.Normal(0.0, 1.0), obs=torch.tensor(2.0))  # no latent parent
    pyro.deterministic("double_s", 2 * s)


def plated(data: torch.Tensor) -> None:
    """A global mean, a Bernoulli switch, and vectorized observations in a plate."""
    mu = pyro.sample("mu", dist.Normal(0.0, 3.0))
    b = pyro.sample("b", dist.Bernoulli(0.5))
    with pyro.plate("data", len(data)):
        pyro.sample("obs", dist.Normal(mu + b, 1.0), obs=data)
    pyro.sample("vec", dist.Normal(mu * torch.ones(2), 1.0), obs=torch.tensor([0.1, -0.2]))  # batch dims, no plate


# ---------------------------------------------------------------------------- graph -> Pyro


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("evidence", [False, True])
def test_to_pyro_log_density_discrete(seed: int, evidence: bool) -> None:
    fg = random_mrf(seed, evidence=evidence)
    model = to_pyro_model(fg)
    states = random_states(fg, 6, seed)
    torch.testing.assert_close(pyro_log_density(model, fg, states), fg.log_joint(states))
    latent_sites = [n for n, s in poutine.trace(model).get_trace().nodes.items() if s["type"] == "sample"]
    expected = [name for v, name in enumerate(fg.names) if v not in fg.evidence]
    assert latent_sites[: len(expected)] == expected  # one site per latent variable, by name


def test_to_pyro_log_density_batched_conditioning() -> None:
    """Conditioning on whole batches of states gives log_prob_sum == sum of log_joint."""
    fg = random_mrf(3)
    states = random_states(fg, 5)
    trace = poutine.trace(poutine.condition(to_pyro_model(fg), state_to_samples(fg, states))).get_trace()
    torch.testing.assert_close(trace.log_prob_sum(), fg.log_joint(states).sum())


def test_to_pyro_log_density_gaussian_chain() -> None:
    fg = gaussian_chain()
    states = random_states(fg, 5) + torch.tensor([0.3, -0.7, 0.0])
    model = to_pyro_model(fg)
    torch.testing.assert_close(pyro_log_density(model, fg, states), fg.log_joint(states))
    assert "x2" not in poutine.trace(model).get_trace().nodes  # evidence is not a site


def test_predictive_prior_and_posterior_samples() -> None:
    fg = random_mrf(1)
    model = to_pyro_model(fg)
    draws = Predictive(model, num_samples=7)()
    assert set(fg.names) <= set(draws) and all(draws[n].shape == (7,) for n in fg.names)
    parallel = Predictive(model, num_samples=7, parallel=True)()
    assert all(parallel[n].shape == (7,) for n in fg.names)
    for v, name in enumerate(fg.names):
        assert int(draws[name].min()) >= 0 and int(draws[name].max()) < int(fg.cardinalities[v])
    states = random_states(fg, 4)
    again = Predictive(model, posterior_samples=state_to_samples(fg, states), return_sites=fg.names)()
    torch.testing.assert_close(samples_to_state(fg, again), states)


def test_continuous_flat_sites_sample_in_support() -> None:
    fg = FactorGraph()
    fg.add_variable("pos", support=constraints.positive)
    fg.add_variable("unit", support=constraints.unit_interval)
    draws = Predictive(to_pyro_model(fg), num_samples=50)()
    assert (draws["pos"] > 0).all() and ((draws["unit"] > 0) & (draws["unit"] < 1)).all()


def test_nuts_on_gaussian_chain_matches_exact_posterior() -> None:
    """x0, x1 | x2 = 1 is Gaussian with means (1/2.25, 2/2.25) and sds (sqrt(1-1/2.25), sqrt(2-4/2.25)).

    Seeded (conftest), so deterministic; over seeds 1..6 the largest error was 0.13 against the
    0.3 / 0.25 tolerances (about 5 Monte Carlo standard errors at ESS ~ 150), so a seed change
    fails with probability well under 1e-3.
    """
    fg = gaussian_chain(evidence=1.0)
    mcmc = MCMC(NUTS(to_pyro_model(fg)), num_samples=200, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    states = samples_to_state(fg, mcmc.get_samples())
    assert states.shape == (200, 3) and bool((states[:, 2] == 1.0).all())
    mean = states[:, :2].mean(0)
    torch.testing.assert_close(mean, torch.tensor([1 / 2.25, 2 / 2.25]), atol=0.3, rtol=0)  # ~5 MCSE
    sd = states[:, :2].std(0)
    torch.testing.assert_close(sd, torch.tensor([(1 - 1 / 2.25) ** 0.5, (2 - 4 / 2.25) ** 0.5]), atol=0.25, rtol=0)


def brute_force(fg: FactorGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """All states of a small discrete graph (evidence clamped) and their log_joint."""
    ranges = [[fg.evidence[v]] if v in fg.evidence else range(int(k)) for v, k in enumerate(fg.cardinalities)]
    states = torch.tensor(list(itertools.product(*ranges)), dtype=torch.get_default_dtype())
    return states, fg.log_joint(states)


@pytest.mark.parametrize("evidence", [False, True])
def test_enumeration_log_evidence_and_map(evidence: bool) -> None:
    fg = random_mrf(7, n=4, n_factors=5, evidence=evidence)
    model = config_enumerate(to_pyro_model(fg))
    states, log_p = brute_force(fg)

    def guide() -> None:
        pass

    loss = TraceEnum_ELBO(max_plate_nesting=0).loss(model, guide)  # -log Z: all sites enumerated
    assert -loss == pytest.approx(float(torch.logsumexp(log_p, 0)), abs=1e-4)

    map_trace = poutine.trace(infer_discrete(model, first_available_dim=-1, temperature=0)).get_trace()
    map_state = samples_to_state(fg, {n: s["value"] for n, s in map_trace.nodes.items() if s["type"] == "sample"})
    torch.testing.assert_close(map_state, states[log_p.argmax()])


def test_to_pyro_model_pickles() -> None:
    fg = random_mrf(2, evidence=True)
    model = pickle.loads(pickle.dumps(to_pyro_model(fg)))
    assert isinstance(model, FactorGraphModel)
    states = random_states(fg, 3)
    torch.testing.assert_close(pyro_log_density(model, model.fg, states), fg.log_joint(states))


def test_samples_to_state_errors() -> None:
    fg = random_mrf(0)
    with pytest.raises(ValueError, match="lack the latent variables"):
        samples_to_state(fg, {"v0": torch.tensor(0)})
    with pytest.raises(TypeError, match="mapping"):
        samples_to_state(fg, [torch.tensor(0)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FactorGraph"):
        to_pyro_model("not a graph")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- Pyro -> graph


def test_from_pyro_hmm_log_density_and_names() -> None:
    data = torch.tensor([-1.5, 0.2, 2.5, 1.9])
    fg = from_pyro_model(hmm, data)
    assert fg.names == ["x0", "x1", "x2", "x3", "b", "s"]
    assert fg.cardinalities.tolist() == [3, 3, 3, 3, 2, 0]
    assert fg.support(fg.variable_id("s")) is dist.HalfNormal(2.0).support
    states = random_states(fg, 8)
    states[:, 5] = torch.rand(8) * 3 + 0.1
    expected = pyro_log_density(hmm, fg, states, data)
    torch.testing.assert_close(fg.log_joint(states), expected)
    torch.testing.assert_close(fg.log_joint(states.reshape(2, 4, 6)), expected.reshape(2, 4))  # batch shapes
    samples = state_to_samples(fg, states[0])
    assert samples["x1"].dtype == torch.long and samples["b"].dtype == torch.get_default_dtype()


def fg_factor_order(fg: FactorGraph) -> torch.Tensor:
    """Column of each global factor id in ``torch.cat(fg.log_factors(state), -1)``."""
    offsets = torch.tensor([0] + [g.num_factors for g in fg.groups]).cumsum(0)
    group, row = fg.factor_location(torch.arange(fg.num_factors))
    return offsets[group] + row


def test_from_pyro_hmm_structure() -> None:
    fg = from_pyro_model(hmm, torch.zeros(4))
    mb = {name: [fg.names[u] for u in fg.markov_blanket(fg.variable_id(name))] for name in fg.names}
    assert mb == {
        "x0": ["x1"],
        "x1": ["x0", "x2"],
        "x2": ["x1", "x3"],
        "x3": ["x2", "b", "s"],  # z depends on x3, b and s
        "b": ["x3", "s"],
        "s": ["x3", "b"],
    }
    assert fg.num_factors == 13  # 6 latent + 4 y + z + penalty + const (deterministic dropped)
    # the discrete sites' factors are tables, child last: x0 (3), x1..x3 (3 x 3), b (2)
    tables = {g.table_shape: g for g in fg.groups if isinstance(g, PyroTableGroup)}
    assert sorted(tables) == [(2,), (3,), (3, 3)]
    assert tables[(3, 3)].site_names == ["x1", "x2", "x3"] and tables[(3, 3)].scopes.tolist() == [
        [0, 1],
        [1, 2],
        [2, 3],
    ]
    torch.testing.assert_close(tables[(3, 3)].log_tables[0].exp(), TRANS)
    (group,) = [g for g in fg.groups if isinstance(g, PyroModelGroup)]
    assert group.factor_names[-1] == "const" and group.scope_list(group.num_factors - 1) == []
    # scaffolds evaluate subsets of factors (one model run per call)
    blocks = [[0], [1, 2], [5]]
    states = random_states(fg, 3)
    scaffold = fg.scaffold(blocks)
    local = scaffold.local_log_density(fg, states)
    all_factors = torch.cat(fg.log_factors(states), -1)[:, fg_factor_order(fg)]
    for b, block in enumerate(blocks):
        idx = fg.scaffold_factors(block)
        torch.testing.assert_close(local[:, b], all_factors[:, idx].sum(-1))
    colors = fg.color_blocks([[0], [1], [2], [3]])
    assert sorted(len(c) for c in colors) == [2, 2]  # chain: x0/x2 and x1/x3


def test_from_pyro_plates_and_vector_observations() -> None:
    data = torch.tensor([0.5, 1.2, -0.3, 2.0])
    fg = from_pyro_model(plated, data)
    assert fg.names == ["mu", "b"] and fg.markov_blanket(0) == [1]
    states = torch.tensor([[0.1, 0.0], [1.5, 1.0], [-2.0, 1.0]])
    torch.testing.assert_close(fg.log_joint(states), pyro_log_density(plated, fg, states, data))


@pytest.mark.parametrize("seed", range(3))
def test_round_trip_graph_pyro_graph(seed: int) -> None:
    for fg in (random_mrf(seed, evidence=True), gaussian_chain()):
        back = from_pyro_model(to_pyro_model(fg))
        assert back.names == [n for v, n in enumerate(fg.names) if v not in fg.evidence]
        states = random_states(fg, 5, seed)
        latent = fg.latent
        torch.testing.assert_close(back.log_joint(states[:, latent]), fg.log_joint(states))
        for v, u in enumerate(latent.tolist()):  # structure is kept (group-level scopes may add edges)
            assert set(fg.markov_blanket(u)) - set(fg.evidence) <= {int(latent[w]) for w in back.markov_blanket(v)}


def test_from_pyro_graph_pickles() -> None:
    data = torch.tensor([0.3, -1.0, 2.0])
    fg = from_pyro_model(hmm, data)
    back = pickle.loads(pickle.dumps(fg))
    states = random_states(fg, 4)
    torch.testing.assert_close(back.log_joint(states), fg.log_joint(states))


def sequential_plate(n: int, scale: float = 1.0) -> None:
    """Scalar latents in a sequential plate, a weighted (poutine.scale) observation, keyword args."""
    mu = pyro.sample("mu", dist.Normal(0.0, scale))
    for i in pyro.plate("p", n):
        z = pyro.sample(f"z{i}", dist.Normal(mu, 1.0))
        pyro.sample(f"y{i}", dist.Normal(z, 1.0), obs=torch.tensor(float(i)))
    with poutine.scale(scale=3.0):
        pyro.sample("w", dist.Normal(mu, 1.0), obs=torch.tensor(1.0))


def test_from_pyro_sequential_plate_scale_kwargs_and_gradients() -> None:
    fg = from_pyro_model(sequential_plate, 3, scale=2.0)
    assert fg.names == ["mu", "z0", "z1", "z2"] and fg.markov_blanket(0) == [1, 2, 3]
    states = torch.randn(4, 4, requires_grad=True)
    expected = torch.stack(
        [
            poutine.trace(poutine.condition(sequential_plate, state_to_samples(fg, s.detach())))
            .get_trace(3, scale=2.0)
            .log_prob_sum()
            for s in states
        ]
    )
    log_p = fg.log_joint(states)
    torch.testing.assert_close(log_p, expected)
    log_p.sum().backward()  # differentiable in the continuous state
    assert states.grad is not None and bool(torch.isfinite(states.grad).all())


def no_latent() -> None:
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(1.0))


def test_from_pyro_without_latent_sites_is_a_constant() -> None:
    fg = from_pyro_model(no_latent)
    assert fg.num_variables == 0 and fg.num_factors == 1
    torch.testing.assert_close(fg.log_joint(torch.zeros(2, 0)), dist.Normal(0.0, 1.0).log_prob(torch.ones(2)))


# ---------------------------------------------------------------------------- errors


def vector_discrete_latent() -> None:
    pyro.sample("p", dist.Beta(1.0, 1.0))
    pyro.sample("v", dist.Bernoulli(0.5 * torch.ones(3)).to_event(1))


def discrete_in_plate_with_continuous() -> None:
    p = pyro.sample("p", dist.Beta(1.0, 1.0))
    with pyro.plate("d", 3):
        pyro.sample("z", dist.Bernoulli(p))


def poisson_latent() -> None:
    pyro.sample("n", dist.Poisson(3.0))


class _OneToK(dist.Categorical):
    """Categorical shifted to 1..k (an unsupported discrete support)."""

    @property
    def support(self):  # type: ignore[override]
        return constraints.integer_interval(1, self._num_events)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        return super().enumerate_support(expand) + 1

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return super().log_prob(value - 1)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        return super().sample(sample_shape) + 1


def shifted_support() -> None:
    pyro.sample("c", _OneToK(torch.tensor([0.5, 0.5])))


def broken() -> None:
    raise RuntimeError("boom")


def python_control_flow() -> None:
    x = pyro.sample("x", dist.Bernoulli(0.5))
    if x == 1:
        pyro.sample("y", dist.Normal(1.0, 1.0), obs=torch.tensor(0.0))
    else:
        pyro.sample("y", dist.Normal(-1.0, 1.0), obs=torch.tensor(0.0))


def subsampled(data: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(data), subsample_size=2) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=data[idx])


def dependent_support() -> None:
    s = pyro.sample("s", dist.HalfNormal(1.0))
    pyro.sample("u", dist.Uniform(0.0, s))


def delta_latent() -> None:
    pyro.sample("d", dist.Delta(torch.tensor(1.0)))


def invalid_observation() -> None:
    a = pyro.sample("a", dist.Bernoulli(0.5))
    pyro.sample("o", dist.Bernoulli(0.2 + 0.6 * a), obs=torch.tensor(2.0))


def bad_batch_shape() -> None:
    x = pyro.sample("x", dist.Categorical(torch.tensor([0.5, 0.5])))
    pyro.sample("y", dist.Normal(torch.eye(2)[x], 1.0), obs=torch.zeros(2))


@pytest.mark.parametrize(
    ("model", "args", "error", "match"),
    [
        (vector_discrete_latent, (), ValueError, r"discrete latent site 'v' has value shape \(3,\).*must be scalar"),
        (discrete_in_plate_with_continuous, (), ValueError, r"site 'z' is inside the vectorized plate 'd'.*Compound"),
        (poisson_latent, (), ValueError, r"site 'n' \(Poisson\) has no finite enumerable support"),
        (shifted_support, (), ValueError, r"site 'c' has support \[1, 2\]; only supports 0..k-1"),
        (broken, (), ValueError, r"model 'broken' failed to trace: RuntimeError: boom"),
        (python_control_flow, (), ValueError, r"'python_control_flow' cannot be evaluated on a batch.*torch.where"),
        (subsampled, (torch.zeros(5),), ValueError, r"site 'obs' is in the subsampled plate 'data' \(2 of 5\)"),
        (dependent_support, (), ValueError, r"support of latent site 'u' depends on the latent sites \['s'\]"),
        (delta_latent, (), ValueError, r"latent site 'd' has a Delta distribution"),
        (bad_batch_shape, (), ValueError, r"site 'y' has a log-probability of shape \(2, 1, 2\) under enum"),
        (invalid_observation, (), ValueError, r"observed site 'o' has value\(s\) .*2.* outside the support"),
        ("not a model", (), TypeError, r"model must be callable, got str"),
    ],
)
def test_from_pyro_errors(model, args, error, match) -> None:
    with pytest.raises(error, match=match):
        from_pyro_model(model, *args)


def copy_chain() -> None:
    """a -> b and a -> c (observed): b copies a with probability 0.95."""
    a = pyro.sample("a", dist.Bernoulli(0.5))
    pyro.sample("b", dist.Bernoulli(0.05 + 0.9 * a))
    pyro.sample("c", dist.Bernoulli(0.05 + 0.9 * a), obs=torch.tensor(1.0))


def test_conditioned_discrete_sites_follow_the_compound_sampler() -> None:
    # Each Gibbs block sees the other's site as an evidence variable of its graph; its value must
    # follow the other block. Exact: P(a = 1 | c = 1) = 0.95 and P(a = b) = 0.95. 4000 draws of a
    # fast-mixing two-site chain: |error| < 0.03 is more than 4 MCSEs (false-failure rate < 1e-4).
    from neuralblock.kernels import CompoundKernel, GibbsKernel

    pyro.set_rng_seed(0)
    kernel = CompoundKernel([(GibbsKernel(copy_chain), ["a"]), (GibbsKernel(copy_chain), ["b"])])
    mcmc = MCMC(kernel, num_samples=4000, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples()
    assert abs(float(samples["a"].float().mean()) - 0.95) < 0.03
    assert abs(float((samples["a"] == samples["b"]).float().mean()) - 0.95) < 0.03


def test_table_groups_pickle_and_refresh_and_keep_site_dtypes() -> None:
    from neuralblock.kernels import GibbsKernel

    def make() -> GibbsKernel:
        kernel = GibbsKernel(copy_chain)
        kernel.condition_on({"a": torch.tensor(0.0)})
        kernel.setup(0)
        return kernel

    kernel = pickle.loads(pickle.dumps(make()))
    kernel.condition_on({"a": torch.tensor(1.0)})
    fresh = GibbsKernel(copy_chain)
    fresh.condition_on({"a": torch.tensor(1.0)})
    fresh.setup(0)
    state = fresh.fg.initial_state()
    torch.testing.assert_close(kernel.fg.log_joint(state), fresh.fg.log_joint(state))
    samples = state_to_samples(from_pyro_model(copy_chain), torch.tensor([1.0, 0.0, 1.0]))
    assert samples["b"].dtype == torch.get_default_dtype()  # Bernoulli sites are floats, as in Pyro
