"""Continuous Pyro sites of any shape under RandomWalkMH and the compound sampler (issue 20, item 3).

Vector sites (``.to_event(1)``), continuous sites in plates and constrained sites whose support
is not elementwise (a ``Dirichlet``'s simplex) compile into graph variables: one per element
with the element's support, or one per unconstrained coordinate of ``biject_to(support)`` with
the log-Jacobian in the site's factor. Samples come back under the site's name and shape.

References are exact: conjugate posteriors (Dirichlet, Normal) and 1-D quadrature. Statistical
checks use batch means over 40 batches (so a z-score is t-distributed with 39 degrees of freedom)
with ``|z| < 5``: ``P(|t_39| > 5) = 1.3e-5`` per z-score, and a test checks at most 20, so the
false-failure rate of each test is below 3e-4.
"""

from __future__ import annotations

import pickle

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import MCMC
from torch.distributions import biject_to

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels import RandomWalkMH
from neuralblock.pyro import PyroGraph, from_pyro_model, samples_to_state, state_to_samples

LIMIT = 5.0
BATCHES = 40
ALPHA = torch.tensor([1.0, 2.0, 0.5])
COUNTS = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0, 2])
Y = torch.tensor([0.5, 2.0])
X = torch.tensor([1.0, -2.0])


def shapes(c: torch.Tensor) -> None:
    """A simplex, a positive vector (``.to_event(1)``) and a real site in a plate, each with its own data."""
    w = pyro.sample("w", dist.Dirichlet(ALPHA))
    s = pyro.sample("s", dist.Gamma(2.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("groups", 2):
        theta = pyro.sample("theta", dist.Normal(0.0, 1.0))
        pyro.sample("x", dist.Normal(theta, 1.0), obs=X)
    with pyro.plate("n", len(c)):
        pyro.sample("c", dist.Categorical(w), obs=c)
    pyro.sample("y", dist.Normal(0.0, s).to_event(1), obs=Y)


def assert_means(draws: torch.Tensor, exact: torch.Tensor) -> None:
    """``draws [S, m]`` against exact means ``[m]``: batch-means z-scores below LIMIT."""
    est, se = batch_means_mcse(draws[None].double(), BATCHES)
    z = (est - exact.double()) / se
    assert z.abs().max() < LIMIT, (est.tolist(), exact.tolist(), z.tolist())


def scale_moments() -> torch.Tensor:
    """E[s_i] and E[s_i^2] under Gamma(2, 1)(s) N(y_i | 0, s), by quadrature on a fine grid: ``[2, 2]``."""
    grid = torch.linspace(1e-4, 40.0, 400_001, dtype=torch.float64)
    log_p = dist.Gamma(2.0, 1.0).log_prob(grid)[:, None] + dist.Normal(0.0, grid[:, None]).log_prob(Y.double())
    p = torch.softmax(log_p, 0)
    return torch.stack([(p * grid[:, None]).sum(0), (p * grid[:, None] ** 2).sum(0)])


def test_vector_simplex_and_plated_sites_compile_with_their_jacobians() -> None:
    fg = from_pyro_model(shapes, COUNTS)
    assert isinstance(fg, PyroGraph)
    assert fg.names == ["w:u[0]", "w:u[1]", "s[0]", "s[1]", "theta[0]", "theta[1]"]
    assert fg.sites["w"].shape == (3,) and fg.sites["w"].ids.tolist() == [0, 1]
    assert fg.sites["s"].ids.tolist() == [2, 3] and fg.support(2) is dist.Gamma(2.0, 1.0).support
    assert fg.sites["theta"].ids.tolist() == [4, 5]
    transform = biject_to(dist.constraints.simplex)
    for _ in range(4):
        trace = poutine.trace(shapes).get_trace(COUNTS)
        values = {name: trace.nodes[name]["value"] for name in ("w", "s", "theta")}
        state = samples_to_state(fg, values)
        back = state_to_samples(fg, state)
        for name, value in values.items():
            torch.testing.assert_close(back[name], value)
        # the density of the state's coordinates: Pyro's at the value they map to, plus the simplex's log-Jacobian
        # (that value, not the drawn one: a tiny simplex component does not survive a float32 round trip exactly)
        u = state[fg.sites["w"].ids]
        jacobian = transform.log_abs_det_jacobian(u, transform(u))
        expected = poutine.trace(poutine.condition(shapes, back)).get_trace(COUNTS).log_prob_sum() + jacobian
        torch.testing.assert_close(fg.log_joint(state), expected)
    again = pickle.loads(pickle.dumps(fg))
    torch.testing.assert_close(again.log_joint(state), fg.log_joint(state))
    kernel = RandomWalkMH(shapes, variables=["w", "s[1]"])  # a site name stands for all its variables
    kernel.setup(0, COUNTS)
    assert kernel.variables == [0, 1, 3]


def test_random_walk_samples_a_dirichlet_a_positive_vector_and_a_plate_exactly() -> None:
    # 3 + 3 (simplex means and second moments) + 2 + 2 (scales) + 2 + 2 (theta) = 14 z-scores, |z| < 5
    pyro.set_rng_seed(0)
    mcmc = MCMC(RandomWalkMH(shapes), num_samples=2400, warmup_steps=300, disable_progbar=True)
    mcmc.run(COUNTS)
    samples = mcmc.get_samples()
    assert samples["w"].shape == (2400, 3) and samples["s"].shape == (2400, 2) and samples["theta"].shape == (2400, 2)
    torch.testing.assert_close(samples["w"].sum(-1), torch.ones(2400))
    assert bool((samples["s"] > 0).all())
    post = ALPHA + torch.bincount(COUNTS, minlength=3)  # Dirichlet(alpha + counts)
    total = post.sum()
    w_mean, w_sq = post / total, post * (post + 1) / (total * (total + 1))
    s_moments = scale_moments()
    theta_mean = X / 2  # N(0, 1) prior, N(theta, 1) likelihood: N(x / 2, 1 / 2)
    draws = torch.cat(
        [samples["w"], samples["w"] ** 2, samples["s"], samples["s"] ** 2, samples["theta"], samples["theta"] ** 2], -1
    )
    exact = torch.cat([w_mean, w_sq, s_moments[0], s_moments[1], theta_mean, theta_mean**2 + 0.5])
    assert_means(draws, exact.float())
