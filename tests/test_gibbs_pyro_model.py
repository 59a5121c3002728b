"""A hand-written Pyro model (scalar sites in Python loops) under GibbsKernel.

The sampled marginals are compared with exact marginals from enumerating all
2^9 states, by batch-means z-scores (4 chains x 20 batches) with a Bonferroni
t threshold: false-failure rate at most 1e-3 over random seeds.
"""

from __future__ import annotations

import itertools

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from scipy import stats

from neuralblock import GibbsKernel
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.pyro import from_pyro_model

SIZE = 3
COUPLING = torch.tensor([[0.9, -0.4, 0.7, 0.3, -0.8, 0.6], [0.5, 0.8, -0.6, 0.4, 0.7, -0.5]])
FIELD = torch.linspace(-0.6, 0.6, SIZE * SIZE)


def ising_model(coupling: torch.Tensor = COUPLING, field: torch.Tensor = FIELD) -> None:
    """A 3x3 Ising grid written the way a user would: one Bernoulli site per cell."""
    spins = {}
    for r in range(SIZE):
        for c in range(SIZE):
            v = r * SIZE + c
            spins[r, c] = pyro.sample(f"s_{r}_{c}", dist.Bernoulli(logits=2 * field[v]))
    edge = 0
    for r in range(SIZE):
        for c in range(SIZE):
            for dr, dc in [(0, 1), (1, 0)]:
                if r + dr < SIZE and c + dc < SIZE:
                    a, b = 2 * spins[r, c] - 1, 2 * spins[r + dr, c + dc] - 1
                    pyro.factor(f"edge_{r}_{c}_{dr}", coupling[dr, edge % 6] * a * b)
                    edge += 1


def test_gibbs_on_handwritten_pyro_model_matches_exact_marginals() -> None:
    fg = from_pyro_model(ising_model)
    states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=fg.num_variables)))
    probs = torch.softmax(fg.log_joint(states).double(), 0)
    exact = (probs[:, None] * states.double()).sum(0)  # P(site = 1), in fg variable order
    chains = []
    for seed in range(4):
        pyro.set_rng_seed(seed)
        mcmc = MCMC(GibbsKernel(ising_model), num_samples=600, warmup_steps=50, disable_progbar=True)
        mcmc.run()
        samples = mcmc.get_samples()
        chains.append(torch.stack([samples[name].double() for name in fg.names], -1))
    draws = torch.stack(chains)  # [4, 600, 9]
    assert set(samples) == set(fg.names)
    mean, mcse = batch_means_mcse(draws, 20)
    iid = (exact * (1 - exact) / draws[..., 0].numel()).sqrt()
    z = (mean - exact) / torch.maximum(mcse, iid)
    limit = stats.t.ppf(1 - 1e-3 / (2 * len(exact)), df=79)
    assert z.abs().max() <= limit, f"z = {z}"


def test_sites_handed_back_are_taken_as_returned_and_a_changed_site_is_read(monkeypatch) -> None:
    """Pyro hands sample() its last output back: the kernel keeps its state without reading the sites again.

    The chain equals the one that copies of those sites make (read and checked site by site); a site another
    sampler changed is read, and a site set to NaN is refused.
    """
    from neuralblock.kernels import base

    reads = []
    read = base.GraphKernel._pyro_params_to_state
    monkeypatch.setattr(base.GraphKernel, "_pyro_params_to_state", lambda self, p: reads.append(1) or read(self, p))

    def chain(copy: bool) -> torch.Tensor:
        pyro.set_rng_seed(0)
        kernel = GibbsKernel(ising_model)
        kernel.setup(0)
        params, draws = kernel.initial_params, []
        for _ in range(30):
            params = kernel.sample({k: v.clone() for k, v in params.items()} if copy else params)
            draws.append(torch.stack([params[f"s_{r}_{c}"] for r in range(SIZE) for c in range(SIZE)]))
        return torch.stack(draws)

    handed_back = chain(copy=False)
    assert len(reads) == 1  # the first step only (the start is not yet a returned output)
    assert torch.equal(handed_back, chain(copy=True)) and len(reads) == 1 + 30
    kernel = GibbsKernel(ising_model)
    kernel.setup(0)
    params = kernel.sample(kernel.initial_params)
    changed = {**params, "s_0_0": 1.0 - params["s_0_0"], "other_site": torch.tensor(0.5)}  # (other sites ignored)
    state = kernel._params_to_state(changed)
    assert float(state.reshape(-1)[kernel._graph().variable_id("s_0_0")]) == float(changed["s_0_0"])
    with pytest.raises(ValueError, match="NaN or inf"):
        kernel.sample({**params, "s_1_1": torch.tensor(float("nan"))})
