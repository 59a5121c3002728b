"""The gmm_pair motif, its mixture factor group and neural block MCMC on open-universe GMMs."""

from __future__ import annotations

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import MCMC

import motifs
from motifs.gmm_pair import GmmPairMotif, gmm_graph, gmm_initial_state, pair_log_density
from neuralblock import FactorGraph, NeuralBlockKernel
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.graph import GaussianMixtureGroup
from neuralblock.proposals import NeuralBlockProposal


def _clusters(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[-6.0, 0.0], [0.0, 5.0], [6.0, -1.0]])
    labels = torch.randint(0, 3, (n,), generator=gen)
    return centers[labels] + torch.randn(n, 2, generator=gen)


def test_mixture_group_sums_out_the_labels() -> None:
    fg = gmm_graph(_clusters(5, 0), num_mixtures=3, sigma=0.7, tau=4.0, p_active=0.4)
    group = next(g for g in fg.groups if isinstance(g, GaussianMixtureGroup))
    state = gmm_initial_state(fg, torch.Generator().manual_seed(1))
    state[group.active] = torch.tensor([1.0, 0.0, 1.0])
    state[group.means.reshape(-1)] = torch.randn(6)
    x, mu = state[group.points], state[group.means]
    normal = torch.distributions.Normal(mu.unsqueeze(0), 0.7)  # [1, m, D]
    per_mixture = normal.log_prob(x.unsqueeze(1)).sum(-1)  # [n, m]
    expected = torch.logsumexp(per_mixture[:, [0, 2]] - math.log(2), -1)
    assert torch.allclose(group.log_factors(state), expected, atol=1e-5)
    state[group.active] = 0.0
    assert (group.log_factors(state) == -math.inf).all()


def test_gmm_graph_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        gmm_graph(torch.tensor([[0.0, math.nan]]), 3, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="p_active"):
        gmm_graph(torch.zeros(4, 2), 3, 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="num_mixtures"):
        gmm_graph(torch.zeros(4, 2), 1, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="sigma"):
        GaussianMixtureGroup(torch.tensor([[0]]), torch.tensor([[1]]), torch.tensor([2]), 0.0)
    with pytest.raises(ValueError, match="gmm_pair option"):
        GmmPairMotif(mixtures=1)


@pytest.mark.parametrize("m", [2, 5, 16])
def test_instances_are_all_latent_pairs(m: int) -> None:
    fg = gmm_graph(_clusters(20, 1), num_mixtures=m, sigma=1.0, tau=5.0, p_active=0.5)
    inst = GmmPairMotif().find_instances(fg)
    assert len(inst) == m * (m - 1) // 2
    assert inst.blocks.shape[1] == 6
    fg.set_evidence({"v[0]": 1.0})
    assert len(GmmPairMotif().find_instances(fg)) == (m - 1) * (m - 2) // 2
    assert len(GmmPairMotif(dim=3).find_instances(fg)) == 0


def test_instances_need_the_gmm_priors() -> None:
    fg = FactorGraph()
    means = torch.tensor([[fg.add_variable(f"mu{k}")] for k in range(2)])
    bits = torch.tensor([fg.add_variable(f"v{k}", 2) for k in range(2)])
    x = fg.add_variable("x")
    fg.add_group(GaussianMixtureGroup(torch.tensor([[x]]), means, bits, 1.0))
    fg.set_evidence({x: 0.3})
    with pytest.raises(ValueError, match="Bernoulli prior"):
        GmmPairMotif(dim=1).find_instances(fg)


def test_features_are_location_and_scale_free_and_ignore_the_block() -> None:
    motif = GmmPairMotif()
    points = _clusters(90, 2)
    base = gmm_graph(points, 12, sigma=1.0, tau=5.0, p_active=0.5)
    moved = gmm_graph(3.0 * points + torch.tensor([10.0, -4.0]), 12, 3.0, 15.0, 0.5, torch.tensor([10.0, -4.0]))
    state = gmm_initial_state(base, torch.Generator().manual_seed(3))
    inst = motif.find_instances(base)
    means = torch.tensor([base.variable_id(f"mu[{k},{d}]") for k in range(12) for d in range(2)])
    moved_state = state.clone()
    moved_state[means] = 3.0 * state[means] + torch.tensor([10.0, -4.0]).repeat(12)
    moved_state[moved.latent.new_tensor(sorted(moved.evidence))] = torch.tensor(
        [moved.evidence[v] for v in sorted(moved.evidence)]
    )
    features = motif.encode(base, inst, state)
    assert torch.allclose(features, motif.encode(moved, motif.find_instances(moved), moved_state), atol=1e-4)
    # the context is chosen from C alone: changing a pair's own values leaves its features unchanged
    changed = state.clone()
    changed[inst.blocks[0]] = torch.tensor([7.0, 7.0, 1.0, -7.0, 2.0, 0.0])
    assert torch.equal(motif.encode(base, inst, changed)[0], features[0])
    assert features.shape == (66, motif.feature_dim) and torch.isfinite(features).all()


def test_pair_density_matches_the_graph_log_joint() -> None:
    motif = GmmPairMotif()
    fg = gmm_graph(_clusters(60, 4), 8, sigma=1.5, tau=6.0, p_active=0.4, prior_mean=torch.tensor([1.0, 2.0]))
    inst = motif.find_instances(fg).select(torch.tensor([0]))
    state = gmm_initial_state(fg, torch.Generator().manual_seed(5))
    u_points, _, u_others, v_others, psi = motif._whitened(inst, state)
    loc, tril = motif.block_affine(fg, inst, state)
    values = torch.tensor([[0.5, -1.0, 1.0, 2.0, 0.3, 1.0], [-3.0, 2.0, 0.0, 1.0, 1.0, 1.0]])
    whitened = pair_log_density(values.unsqueeze(1), u_points, u_others, v_others, psi[:, 0], psi[:, 1])[:, 0]
    states = state.expand(2, -1).clone()
    states[:, inst.blocks[0]] = loc[0] + values @ tril[0].T
    joint = fg.log_joint(states)
    assert torch.allclose(whitened[0] - whitened[1], joint[0] - joint[1], atol=1e-3)


def test_training_batches_are_finite_and_exercise_every_state() -> None:
    motif = motifs.get("gmm_pair")
    batch = motif.sample_training_batch(256, torch.Generator().manual_seed(6))
    assert batch.features.shape == (256, motif.feature_dim) and torch.isfinite(batch.features).all()
    bits = batch.block[:, [2, 5]]
    assert {tuple(b) for b in bits.tolist()} == {(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)}
    log_p = batch.log_p_fn(batch.block.unsqueeze(0))
    assert torch.isfinite(log_p).all()


def _exact_bit_marginals(points: torch.Tensor, sigma: float, tau: float, p: float) -> dict:
    """P(v) and E[mu_k | v] for a 1-D GMM with two mixtures, by quadrature on a fine grid."""
    grid = torch.linspace(-6 * tau, 6 * tau, 1601, dtype=torch.float64)
    dx = float(grid[1] - grid[0])
    log_prior = torch.distributions.Normal(0.0, tau).log_prob(grid)
    lik = torch.distributions.Normal(grid[:, None], sigma).log_prob(points.double()[None, :])  # [G, n]
    out = {}
    for v in itertools.product([0, 1], repeat=2):
        if sum(v) == 0:
            continue
        log_bits = sum(math.log(p) if b else math.log(1 - p) for b in v)
        a = lik if v[0] else torch.full_like(lik, -math.inf)
        b = lik if v[1] else torch.full_like(lik, -math.inf)
        joint = torch.logaddexp(a[:, None, :], b[None, :, :]).sum(-1) - len(points) * math.log(sum(v))
        joint = joint + log_prior[:, None] + log_prior[None, :] + log_bits
        out[v] = float(torch.logsumexp(joint.reshape(-1), 0)) + 2 * math.log(dx)
    norm = torch.logsumexp(torch.tensor(list(out.values())), 0)
    return {v: math.exp(lp - float(norm)) for v, lp in out.items()}


def test_neural_block_kernel_keeps_the_exact_gmm_posterior() -> None:
    # 2 chains x 1500 draws (20 batch means); 3 z-scores of the activity pattern's probabilities with
    # |z| < 4.5: false-failure rate below 1e-4.
    points = torch.tensor([[-1.5], [-1.0], [2.0]])
    sigma, tau, p = 1.0, 2.0, 0.5
    exact = _exact_bit_marginals(points[:, 0], sigma, tau, p)
    fg = gmm_graph(points, 2, sigma, tau, p)
    torch.manual_seed(0)
    proposal = NeuralBlockProposal(GmmPairMotif(dim=1), components=3, hidden=(16,))  # untrained: any q is valid
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.3)
    bits = torch.tensor([fg.variable_id("v[0]"), fg.variable_id("v[1]")])
    chains = []
    for chain in range(2):
        pyro.set_rng_seed(20 + chain)
        mcmc = MCMC(kernel, num_samples=1500, warmup_steps=100, disable_progbar=True)
        mcmc.run()
        chains.append(mcmc.get_samples()["x"][:, bits])
    draws = torch.stack(chains)  # [2, 1500, 2]
    assert kernel.diagnostics()["acceptance_by_proposal"]["gmm_pair"] > 0.02
    patterns = [(0, 1), (1, 0), (1, 1)]
    stats = torch.stack([(draws == torch.tensor(v, dtype=draws.dtype)).all(-1).double() for v in patterns], -1)
    mean, se = batch_means_mcse(stats, num_batches=10)
    z = (mean - torch.tensor([exact[v] for v in patterns], dtype=mean.dtype)) / se.clamp(min=1e-3)
    assert z.abs().max() < 4.5, (z, mean, exact)


def test_large_models_show_the_proposal_a_thinned_sample_of_the_points() -> None:
    motif = GmmPairMotif(points=10)
    u_others = torch.zeros(1, 2, 2)
    v_others = torch.tensor([[1.0, 0.0]])
    psi = torch.zeros(1, 2)
    radius = 0.15 * torch.arange(40, dtype=torch.float32)  # point k at 0.15 k: explained less as k grows
    u_points = torch.stack([radius, torch.zeros(40)], -1).unsqueeze(0)
    features = motif.features(u_points, torch.ones(1, 40, dtype=torch.bool), u_others, v_others, psi)
    slots = features[0, -10 * 4 :].reshape(10, 4)
    every_fourth = 0.15 * torch.arange(39, -1, -4, dtype=torch.float32)  # every 4th point, least explained first
    assert torch.allclose(slots[:, 0] * 4.0, every_fourth, atol=1e-5)
    few = motif.features(u_points[:, :8], torch.ones(1, 8, dtype=torch.bool), u_others, v_others, psi)
    slots = few[0, -10 * 4 :].reshape(10, 4)
    assert torch.allclose(slots[:8, 0] * 4.0, 0.15 * torch.arange(7, -1, -1, dtype=torch.float32), atol=1e-5)
    assert (slots[8:] == 0).all()  # absent slots


def test_the_features_never_read_an_inactive_mean() -> None:
    # Mirror-image active mixtures tie in their distance to the points; the order of tied ones must not
    # depend on the inactive means (the fused path keeps proposals across moves of inactive pairs).
    motif = GmmPairMotif()
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(20, 2, generator=gen).abs() + 0.5
    u_points = torch.cat([half, half * torch.tensor([-1.0, 1.0])]).unsqueeze(0)
    active = torch.tensor([[2.0, 1.0], [-2.0, 1.0], [3.0, -1.0], [-3.0, -1.0]])
    v_others = torch.cat([torch.ones(4), torch.zeros(10)]).unsqueeze(0)
    psi, mask = torch.zeros(1, 2), torch.ones(1, 40, dtype=torch.bool)
    seen = set()
    for _ in range(50):
        inactive = 10.0 * torch.randn(10, 2, generator=gen)
        u_others = torch.cat([active, inactive]).unsqueeze(0)
        seen.add(tuple(motif.features(u_points, mask, u_others, v_others, psi).reshape(-1).tolist()))
    assert len(seen) == 1
