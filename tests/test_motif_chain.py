"""The chain motif: instances in graphs of any size, exact whitening, training batches, kernel invariance."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro.infer import MCMC

from motifs.chain import (
    ChainMotif,
    state_space_graph,
    stochastic_volatility_graph,
    whitened_log_density,
)
from neuralblock import FactorGraph, NeuralBlockKernel
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.proposals import NeuralBlockProposal


def linear_chain(steps: int, seed: int = 0, observed_every: int = 1) -> FactorGraph:
    gen = torch.Generator().manual_seed(seed)
    has_obs = (torch.arange(steps) % observed_every == 0).to(torch.get_default_dtype())
    return state_space_graph(
        0.5 + 0.4 * torch.rand(steps - 1, generator=gen),
        0.3 * torch.randn(steps - 1, generator=gen),
        0.3 + torch.rand(steps - 1, generator=gen),
        torch.randn(steps, generator=gen),
        has_obs * (0.5 + torch.rand(steps, generator=gen)),  # c = 0 where unobserved: y carries no information
        torch.zeros(steps),
        torch.zeros(steps),
        torch.full((steps,), math.log(0.5)),
    )


def latent_precision_and_mean(fg: FactorGraph, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact Gaussian posterior of the latent states of a linear-Gaussian graph (Newton from ``state``)."""
    latent = fg.latent

    def log_joint(x: torch.Tensor) -> torch.Tensor:
        full = state.clone()
        full[latent] = x
        return fg.log_joint(full)

    x0 = state[latent].clone()
    hess = torch.autograd.functional.hessian(log_joint, x0)
    grad = torch.autograd.functional.jacobian(log_joint, x0)
    precision = -hess
    return precision, x0 + torch.linalg.solve(precision, grad)


@pytest.mark.parametrize("steps", [5, 6, 9, 40])
def test_instances_cover_every_interior_pair(steps: int) -> None:
    fg = stochastic_volatility_graph(torch.randn(steps), phi=0.9, sigma=0.3)
    inst = ChainMotif().find_instances(fg)
    assert len(inst) == max(steps - 5, 0)
    if len(inst):
        assert inst.blocks[:, 0].tolist() == list(range(2, steps - 3))
        assert (inst.blocks[:, 1] == inst.blocks[:, 0] + 1).all()
        assert (inst.context[:, :4] == inst.blocks[:, :1] + torch.tensor([-2, -1, 2, 3])).all()
        assert (inst.context[:, 4:] == inst.blocks + steps).all()  # the observation variables


def test_instances_skip_states_with_foreign_factors_and_handle_two_chains() -> None:
    fg = FactorGraph()
    first = stochastic_volatility_graph(torch.randn(8), phi=0.9, sigma=0.3)
    assert len(ChainMotif().find_instances(first)) == 3
    # a table factor on a state and an observed state make it unusable as a block variable
    fg = linear_chain(10)
    z = fg.add_variable("z", 2)
    fg.add_table_factor([z], torch.zeros(2))
    fg.add_callable_factors(torch.tensor([[4, z]]), _coupling)
    blocks = ChainMotif().find_instances(fg).blocks.tolist()
    assert all(4 not in b for b in blocks) and [2, 3] in blocks and [5, 6] in blocks


def test_a_prior_stored_as_a_padded_row_is_a_prior() -> None:
    from neuralblock.graph import LinearGaussianGroup

    def chain(padded: bool) -> FactorGraph:
        fg = FactorGraph()
        x = [fg.add_variable(f"x{t}") for t in range(10)]
        fg.add_linear_gaussian(x[0], [], [], 0.0, 1.0)
        child, parents = torch.tensor(x[1:]), torch.tensor([[p] for p in x[:-1]])
        if padded:  # the extra prior on x4 as an arity-0 row of the transitions' group
            child, parents = torch.cat([child, torch.tensor([x[4]])]), torch.cat([parents, torch.tensor([[-1]])])
        else:
            fg.add_linear_gaussian(x[4], [], [], 0.0, 1.0)
        rows = len(child)
        fg.add_group(
            LinearGaussianGroup(child, parents, torch.full((rows, 1), 0.9), torch.zeros(rows), torch.ones(rows))
        )
        return fg

    blocks = ChainMotif().find_instances(chain(padded=True)).blocks.tolist()
    assert blocks == ChainMotif().find_instances(chain(padded=False)).blocks.tolist()
    assert blocks and all(4 not in b for b in blocks)


def _coupling(values: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
    return -0.5 * (values[..., 0] - values[..., 1]) ** 2


def test_whitening_is_the_exact_conditional_of_a_linear_gaussian_chain() -> None:
    fg = linear_chain(9, seed=3, observed_every=2)
    motif = ChainMotif()
    inst = motif.find_instances(fg)
    state = fg.initial_state(torch.Generator().manual_seed(1))
    mean, tril = motif.block_affine(fg, inst, state)
    precision, post_mean = latent_precision_and_mean(fg, state)
    for i, block in enumerate(inst.blocks.tolist()):
        # the conditional of the block given the rest, from the joint precision (Schur complement)
        ids = fg.latent.tolist()
        b = [ids.index(v) for v in block]
        rest = [k for k in range(len(ids)) if k not in b]
        j_bb = precision[b][:, b]
        j_br = precision[b][:, rest]
        x_rest = state[fg.latent][rest]
        cond_mean = post_mean[b] - torch.linalg.solve(j_bb, j_br @ (x_rest - post_mean[rest]))
        cov = torch.linalg.inv(j_bb)
        torch.testing.assert_close(mean[i], cond_mean, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(tril[i] @ tril[i].T, cov, rtol=1e-4, atol=1e-5)


def test_whitened_density_matches_the_volatility_chain_up_to_a_constant() -> None:
    fg = stochastic_volatility_graph(0.3 * torch.randn(8, generator=torch.Generator().manual_seed(0)), 0.95, 0.25)
    motif = ChainMotif()
    inst = motif.find_instances(fg)
    state = fg.initial_state(torch.Generator().manual_seed(2))
    mean, tril = motif.block_affine(fg, inst, state)
    y = state[inst.context[:, 4:6]]
    u = torch.randn(5, len(inst), 2)
    approx = whitened_log_density(u, inst.params, mean, tril, y)  # [5, I]
    for i, block in enumerate(inst.blocks.tolist()):
        states = state.expand(5, -1).clone()
        states[:, block] = mean[i] + (tril[i] @ u[:, i].unsqueeze(-1)).squeeze(-1)
        diff = fg.log_joint(states) - approx[:, i]
        assert float(diff.max() - diff.min()) < 1e-3


def test_features_are_translation_invariant() -> None:
    returns = 0.2 * torch.randn(10, generator=torch.Generator().manual_seed(4))
    motif = ChainMotif()
    feats = []
    for mu in (0.0, -9.0):
        fg = stochastic_volatility_graph(returns * math.exp(mu / 2), phi=0.95, sigma=0.2, mu=mu)
        inst = motif.find_instances(fg)
        state = fg.initial_state(torch.Generator().manual_seed(0))
        state[fg.latent] = torch.linspace(-1, 1, len(fg.latent)) + mu
        feats.append(motif.encode(fg, inst, state))
    torch.testing.assert_close(feats[0], feats[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["mixed", "linear", "volatility"])
def test_training_batches(family: str) -> None:
    batch = ChainMotif(family).sample_training_batch(512, torch.Generator().manual_seed(0))
    assert torch.isfinite(batch.features).all() and torch.isfinite(batch.block).all()
    known = torch.isfinite(batch.exact_log_p)
    vol = batch.features[:, 0].bool() | batch.features[:, 4].bool()
    assert torch.equal(known, ~vol)
    if family == "linear":
        assert known.all()
        # linear-Gaussian instantiations whiten to N(0, I) exactly
        assert batch.block.mean(0).abs().max() < 0.15 and (batch.block.var(0) - 1).abs().max() < 0.15
    log_p = batch.log_p_fn(batch.block.unsqueeze(0))
    assert log_p.shape == (1, 512) and torch.isfinite(log_p).all()


def test_bad_family_is_rejected() -> None:
    with pytest.raises(ValueError, match="family"):
        ChainMotif("nonlinear")


def test_observed_chain_states_are_context_not_observations() -> None:
    """An observed x_5 (a parent of y_5 and x_6) only removes the blocks that contain it."""
    fg = linear_chain(12)
    fg.set_evidence({5: 0.3, 11: -0.2})  # an interior and the last state
    inst = ChainMotif().find_instances(fg)
    assert inst.blocks.tolist() == [[2, 3], [3, 4], [6, 7], [7, 8], [8, 9]]
    assert inst.context[1, :4].tolist() == [1, 2, 5, 6] and inst.context[4, :4].tolist() == [6, 7, 10, 11]


@pytest.mark.parametrize(("steps", "evidence"), [(7, None), (9, 4)])
def test_neural_block_kernel_with_chain_blocks_keeps_the_gaussian_posterior(steps: int, evidence: int | None) -> None:
    # 3 chains x 1000 draws (30 batch means); up to 16 z-scores (means and variances of the latent
    # states) with |z| < 4.5: false-failure rate below 1e-3. With an observed interior state, the
    # blocks on either side of it read it as context.
    fg = linear_chain(steps, seed=5, observed_every=1)
    if evidence is not None:
        fg.set_evidence({evidence: 0.4})
        assert len(ChainMotif().find_instances(fg)) == 2
    state = fg.initial_state(torch.Generator().manual_seed(0))
    precision, post_mean = latent_precision_and_mean(fg, state)
    post_var = torch.linalg.inv(precision).diagonal()
    torch.manual_seed(0)
    proposal = NeuralBlockProposal(ChainMotif(), components=2, hidden=(8,))  # untrained: any q is valid MH
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.5)  # single-site moves reach the ends
    chains = []
    for chain in range(3):
        pyro.set_rng_seed(10 + chain)
        mcmc = MCMC(kernel, num_samples=1000, warmup_steps=100, disable_progbar=True)
        mcmc.run()
        chains.append(mcmc.get_samples()["x"][:, fg.latent])
    draws = torch.stack(chains)  # [3, 1000, latent states]
    assert kernel.diagnostics()["acceptance_by_proposal"]["chain"] > 0.05
    stats = torch.cat([draws, (draws - post_mean) ** 2], -1)
    mean, se = batch_means_mcse(stats, num_batches=10)
    exact = torch.cat([post_mean, post_var])
    z = (mean - exact) / se
    assert z.abs().max() < 4.5, z
