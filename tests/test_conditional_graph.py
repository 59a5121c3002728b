"""ConditionalGraphKernel: a graph kernel on Pyro sites whose conditional graph follows global sites."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from motifs.chain import state_space_graph
from neuralblock import FactorGraph, load_pretrained
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels import (
    CompoundKernel,
    ConditionalGraphKernel,
    GibbsKernel,
    NeuralBlockKernel,
    RandomWalkMH,
)

T, STEP_SD = 8, 0.5
Y = torch.tensor([0.3, 1.1, 0.4, -0.2, 0.9, 1.6, 0.8, 1.2])


def chain_model(y: torch.Tensor) -> None:
    """Global level w; a Gaussian random walk x starting at w; unit-noise observations y."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    x = pyro.sample("x", dist.Normal(torch.zeros(T), 1.0).mask(False).to_event(1))  # density below
    pyro.sample("x_start", dist.Normal(w, 1.0), obs=x[..., 0])
    pyro.sample("x_steps", dist.Normal(x[..., :-1], STEP_SD).to_event(1), obs=x[..., 1:])
    pyro.sample("y", dist.Normal(x, 1.0).to_event(1), obs=y)


def chain_graph(values: dict[str, torch.Tensor], y: torch.Tensor) -> FactorGraph:
    """p(x | w, y) as a state-space chain (the chain motif's graph)."""
    ones, zeros = torch.ones(T), torch.zeros(T)
    return state_space_graph(
        ones[1:], zeros[1:], STEP_SD * ones[1:], y, ones, zeros, zeros, zeros, initial_loc=float(values["w"])
    )


def exact_posterior(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sd of (w, x_0 .. x_{T-1}): the joint posterior is Gaussian."""
    n = T + 1
    precision = torch.zeros(n, n, dtype=torch.float64)
    linear = torch.zeros(n, dtype=torch.float64)
    precision[0, 0] += 1.0  # w ~ N(0, 1)

    def add_difference(i: int, j: int, var: float) -> None:  # (z_i - z_j)^2 / var
        precision[i, i] += 1 / var
        precision[j, j] += 1 / var
        precision[i, j] -= 1 / var
        precision[j, i] -= 1 / var

    add_difference(0, 1, 1.0)
    for t in range(T - 1):
        add_difference(t + 1, t + 2, STEP_SD**2)
    for t in range(T):
        precision[t + 1, t + 1] += 1.0
        linear[t + 1] += float(y[t])
    cov = torch.linalg.inv(precision)
    return cov @ linear, cov.diagonal().sqrt()


@pytest.mark.parametrize(("local", "draws"), [("neural", 800), ("random-walk", 600)])
def test_compound_sampler_with_a_conditional_chain_graph_is_exact(local: str, draws: int) -> None:
    # 2 chains, 10 batch means each; 9 z-scores with |z| < 4.5: false-failure rate < 1e-4.
    pyro.set_rng_seed(3)

    def make(fg: FactorGraph):
        if local == "neural":
            return NeuralBlockKernel(fg, proposals=[load_pretrained("chain")], gibbs_prob=0.3)
        return RandomWalkMH(fg)

    inner = ConditionalGraphKernel(chain_model, {"x": [f"x{t}" for t in range(T)]}, chain_graph, make)
    kernel = CompoundKernel([(inner, ["x"]), (RandomWalkMH(chain_model), ["w"])])
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=200, num_chains=2, disable_progbar=True)
    mcmc.run(Y)
    samples = mcmc.get_samples(group_by_chain=True)
    draws = torch.cat([samples["w"][..., None], samples["x"]], -1).double()
    mean, sd = exact_posterior(Y)
    est, se = batch_means_mcse(draws, num_batches=10)
    z = (est - mean) / se
    assert z.abs().max() < 4.5, (est.tolist(), mean.tolist(), z.tolist())
    # the sampler moves: posterior sds are matched to within a factor (not an exactness check)
    spread = draws.reshape(-1, T + 1).std(0)
    assert ((spread / sd - 1).abs() < 0.3).all(), (spread / sd).tolist()
    if local == "neural":
        acceptance = kernel.diagnostics()["blocks"]["0 (ConditionalGraphKernel)"]["acceptance_by_proposal"]["chain"]
        assert acceptance > 0.3


def test_update_graph_follows_new_parameters_and_rejects_new_structure() -> None:
    inner = ConditionalGraphKernel(chain_model, {"x": list(range(T))}, chain_graph, lambda fg: RandomWalkMH(fg))
    inner.condition_on({"w": torch.tensor(0.0)})
    inner.setup(0, Y)
    inner.condition_on({"w": torch.tensor(2.5)})
    state = inner.inner_graph.initial_state()
    reference = chain_graph({"w": torch.tensor(2.5)}, Y)
    assert torch.allclose(inner.inner_graph.log_joint(state), reference.log_joint(state))
    other = state_space_graph(torch.ones(2), torch.zeros(2), torch.ones(2), torch.zeros(3), *([torch.zeros(3)] * 4))
    with pytest.raises(ValueError, match="variables"):
        inner.inner.update_graph(other)


def test_conditional_graph_kernel_rejects_bad_sites() -> None:
    def gibbs(fg: FactorGraph) -> GibbsKernel:
        return GibbsKernel(fg)

    with pytest.raises(ValueError, match="at least one site"):
        ConditionalGraphKernel(chain_model, {}, chain_graph, gibbs)
    with pytest.raises(TypeError, match="build_graph must be callable"):
        ConditionalGraphKernel(chain_model, {"x": [0]}, None, gibbs)  # type: ignore[arg-type]
    bad = ConditionalGraphKernel(chain_model, {"x": [0, 1]}, chain_graph, lambda fg: RandomWalkMH(fg))
    bad.condition_on({"w": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="8 elements but 2 graph variables"):
        bad.setup(0, Y)
    observed = ConditionalGraphKernel(chain_model, {"x": list(range(T, 2 * T))}, chain_graph, RandomWalkMH)
    observed.condition_on({"w": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="observed graph variables"):
        observed.setup(0, Y)
    unknown = ConditionalGraphKernel(chain_model, {"q": [0]}, chain_graph, RandomWalkMH)
    unknown.condition_on({"w": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="not a latent sample site"):
        unknown.setup(0, Y)
    twice = ConditionalGraphKernel(chain_model, {"x": [0, 0, 1, 2, 3, 4, 5, 6]}, chain_graph, RandomWalkMH)
    twice.condition_on({"w": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="overlapping graph variables"):
        twice.setup(0, Y)

    def with_extra(values: dict[str, torch.Tensor], y: torch.Tensor) -> FactorGraph:
        fg = chain_graph(values, y)
        extra = fg.add_variable("extra")
        fg.add_linear_gaussian(extra, [], [], 0.0, 1.0)
        return fg

    hidden = ConditionalGraphKernel(chain_model, {"x": list(range(T))}, with_extra, RandomWalkMH)
    hidden.condition_on({"w": torch.tensor(0.0)})
    with pytest.raises(ValueError, match=r"\['extra'\] belong to no site"):
        hidden.setup(0, Y)
    with pytest.raises(ValueError, match="site 'w' is not finite"):
        hidden.condition_on({"w": torch.tensor(float("nan"))})


def test_update_parameters_rejects_a_changed_support() -> None:
    from torch.distributions import constraints

    def graph(upper: float) -> FactorGraph:
        fg = FactorGraph()
        fg.add_variable("z", support=constraints.interval(0.0, upper))
        return fg

    with pytest.raises(ValueError, match="support of 'z' changed"):
        graph(1.0).update_parameters(graph(5.0))
    graph(1.0).update_parameters(graph(1.0))  # equal supports (distinct objects) are fine
