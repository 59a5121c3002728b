"""SplitMergeGMM: exact invariance on enumerable open-universe GMMs, moves that change M, bad input."""

from __future__ import annotations

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import MCMC
from test_motif_gmm_pair import _exact_bit_marginals  # tests/ is on sys.path under pytest

from motifs.gmm_pair import gmm_graph
from neuralblock import FactorGraph
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.split_merge import MOVES, MoveTuning, SplitMergeGMM, mixture_layout, propose_move

SIGMA, TAU, P_ACTIVE = 1.0, 2.0, 0.5
# |z| < 5 for each pattern probability, from 4 chains x 25 batch means (t with 99 degrees of freedom:
# P(|t| > 5) = 2.5e-6): with at most 7 patterns per test, a false-failure rate below 2e-5 per test.
Z_MAX = 5.0


def _exact_patterns(points: torch.Tensor, m: int, sigma: float, tau: float, p: float) -> dict[tuple[int, ...], float]:
    """P(v) of an open-universe GMM in closed form: the sum over label assignments of conjugate evidences.

    ``p(v, x) = p^M (1 - p)^(m - M) M^-n sum_z prod_{k active} Z_k`` where ``Z_k`` is the evidence
    of the points labelled ``k`` under ``mu_k ~ N(0, tau^2 I)``, ``x ~ N(mu_k, sigma^2 I)`` (each
    coordinate is ``N(0, sigma^2 I + tau^2 11^T)``). Exact for few points (``M^n`` terms).
    """
    points = points.double()
    n = points.shape[0]

    def log_evidence(members: list[int]) -> float:
        if not members:
            return 0.0
        cov = sigma**2 * torch.eye(len(members), dtype=torch.float64) + tau**2
        normal = torch.distributions.MultivariateNormal(torch.zeros(len(members), dtype=torch.float64), cov)
        return float(normal.log_prob(points[members].T).sum())

    log_p = {}
    for bits in itertools.product([0, 1], repeat=m):
        active = [k for k in range(m) if bits[k]]
        if not active:
            continue
        terms = [
            sum(log_evidence([q for q in range(n) if labels[q] == k]) for k in active)
            for labels in itertools.product(active, repeat=n)
        ]
        size = len(active)
        log_p[bits] = (
            float(torch.logsumexp(torch.tensor(terms), 0))
            - n * math.log(size)
            + size * math.log(p)
            + (m - size) * math.log(1 - p)
        )
    norm = float(torch.logsumexp(torch.tensor(list(log_p.values())), 0))
    return {bits: math.exp(value - norm) for bits, value in log_p.items()}


def _pattern_z_scores(kernel: SplitMergeGMM, fg: FactorGraph, exact: dict, draws_per_chain: int) -> torch.Tensor:
    """z-scores of the sampled activity-pattern frequencies (4 chains, 25 batch means each)."""
    m = len(next(iter(exact)))
    bits = torch.tensor([fg.variable_id(f"v[{k}]") for k in range(m)])
    chains = []
    for chain in range(4):
        pyro.set_rng_seed(100 + chain)
        mcmc = MCMC(kernel, num_samples=draws_per_chain, warmup_steps=50, disable_progbar=True)
        mcmc.run()
        chains.append(mcmc.get_samples()["x"][:, bits])
    draws = torch.stack(chains)
    patterns = sorted(exact)
    stats = torch.stack([(draws == torch.tensor(v, dtype=draws.dtype)).all(-1).double() for v in patterns], -1)
    mean, se = batch_means_mcse(stats, num_batches=25)
    return (mean - torch.tensor([exact[v] for v in patterns], dtype=mean.dtype)) / se.clamp(min=1e-3)


def test_closed_form_matches_the_quadrature() -> None:
    points = torch.tensor([[-1.5], [-1.0], [2.0]])
    closed = _exact_patterns(points, 2, SIGMA, TAU, P_ACTIVE)
    quadrature = _exact_bit_marginals(points[:, 0], SIGMA, TAU, P_ACTIVE)
    assert all(abs(closed[v] - quadrature[v]) < 1e-6 for v in quadrature)


@pytest.mark.parametrize(
    ("points", "m", "draws"),
    [
        (torch.tensor([[-1.5], [-1.0], [2.0]]), 2, 1000),
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 600),
    ],
    ids=["m2-1d", "m3-2d"],
)
def test_moves_alone_keep_the_exact_posterior(points: torch.Tensor, m: int, draws: int) -> None:
    # gibbs_prob = 0: the split/merge/birth/death moves alone must leave p(v, mu | x) invariant.
    fg = gmm_graph(points, m, SIGMA, TAU, P_ACTIVE)
    kernel = SplitMergeGMM(fg, gibbs_prob=0.0, moves_per_sweep=2)
    z = _pattern_z_scores(kernel, fg, _exact_patterns(points, m, SIGMA, TAU, P_ACTIVE), draws_per_chain=draws)
    accepted = kernel.diagnostics()["acceptance"]
    assert all(accepted[k] > 0.05 for k in MOVES), accepted
    assert z.abs().max() < Z_MAX, z


def test_mixed_with_single_site_keeps_the_exact_gmm_posterior() -> None:
    points = torch.tensor([[-1.5], [-1.0], [2.0]])
    exact = _exact_bit_marginals(points[:, 0], SIGMA, TAU, P_ACTIVE)
    fg = gmm_graph(points, 2, SIGMA, TAU, P_ACTIVE)
    kernel = SplitMergeGMM(fg, gibbs_prob=0.3)
    z = _pattern_z_scores(kernel, fg, exact, draws_per_chain=500)
    assert kernel.diagnostics()["single_site_sweeps"] > 0
    assert z.abs().max() < Z_MAX, z


def test_split_merge_finds_the_clusters_from_one_active_mixture() -> None:
    gen = torch.Generator().manual_seed(3)
    centres = torch.tensor([[-8.0, 0.0], [0.0, 8.0], [8.0, 0.0]])
    points = centres.repeat_interleave(25, 0) + torch.randn(75, 2, generator=gen)
    fg = gmm_graph(points, 6, 1.0, 8.0, 0.5)
    layout = mixture_layout(fg)
    start = fg.initial_state()
    start[layout.active] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    start[layout.means] = points.mean(0)
    kernel = SplitMergeGMM(fg, gibbs_prob=0.2)
    kernel.initial_params = {"x": start}
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=10, disable_progbar=True)
    mcmc.run()
    m_active = mcmc.get_samples()["x"][:, layout.active].sum(-1)
    assert (m_active[-10:] == 3).all(), m_active
    means = mcmc.get_samples()["x"][-1, layout.means][mcmc.get_samples()["x"][-1, layout.active] > 0]
    assert torch.cdist(means, centres).min(0).values.max() < 1.0  # one mixture on each cluster
    assert kernel.logging()["M"] == 3.0
    diagnostics = kernel.diagnostics()
    assert diagnostics["moves_per_second"] > 0 and diagnostics["nonfinite_rejections"] == 0


def test_proposals_score_both_directions() -> None:
    fg = gmm_graph(torch.randn(8, 2), 4, 1.0, 3.0, 0.5)
    layout = mixture_layout(fg)
    state = fg.initial_state()
    state[layout.active] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    log_probs = {k: -math.log(len(MOVES)) for k in MOVES}
    for kind in MOVES:
        move = propose_move(kind, layout, state, log_probs, MoveTuning())
        assert move is not None and torch.isfinite(move.log_q_fwd) and torch.isfinite(move.log_q_rev)
        changed = (move.state != state).nonzero().squeeze(-1)
        block = torch.cat([torch.cat([layout.means[k], layout.active[k : k + 1]]) for k in move.mixtures])
        assert set(changed.tolist()) <= set(block.tolist())
    state[layout.active] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert propose_move("death", layout, state, log_probs, MoveTuning()) is None
    assert propose_move("dumb_merge", layout, state, log_probs, MoveTuning()) is None


def test_bad_input_raises_clear_errors() -> None:
    fg = FactorGraph()
    a = fg.add_variable("a", 2)
    fg.add_table_factor([a], torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="GaussianMixtureGroup"):
        SplitMergeGMM(fg)
    with pytest.raises(TypeError, match="FactorGraph"):
        SplitMergeGMM(lambda: None)
    gmm = gmm_graph(torch.zeros(3, 1), 2, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="gibbs_prob"):
        SplitMergeGMM(gmm, gibbs_prob=1.5)
    with pytest.raises(ValueError, match="moves_per_sweep"):
        SplitMergeGMM(gmm, moves_per_sweep=0)
    with pytest.raises(ValueError, match="unknown move"):
        SplitMergeGMM(gmm, move_weights={"teleport": 1.0})
    with pytest.raises(ValueError, match="reverse"):
        SplitMergeGMM(gmm, move_weights={"birth": 1.0})
    with pytest.raises(ValueError, match="birth_prior_weight"):
        SplitMergeGMM(gmm, tuning=MoveTuning(birth_prior_weight=0.0))
    gmm.set_evidence({"v[0]": 1.0})
    with pytest.raises(ValueError, match="two mixtures"):
        SplitMergeGMM(gmm)


def test_reports_before_setup_and_refuses_a_zero_density_start() -> None:
    """No move leaves a state with no active mixture (births' ratios are non-finite): setup says so."""
    gmm = gmm_graph(torch.tensor([[0.0], [1.0], [2.0]]), 3, 1.0, 2.0, 0.5)
    kernel = SplitMergeGMM(gmm, gibbs_prob=0.0)
    assert kernel.diagnostics()["proposed"]["birth"] == 0.0 and "M" not in kernel.logging()
    layout = mixture_layout(gmm)
    empty = gmm.initial_state()
    empty[layout.active] = 0.0
    kernel.initial_params = {"x": empty}
    with pytest.raises(ValueError, match="zero density"):
        kernel.setup(0)
    kernel.setup(0)  # the default start has a finite density
    assert kernel.logging()["M"] >= 1
