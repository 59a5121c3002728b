"""SplitMergeGMM: exact invariance on enumerable open-universe GMMs (one chain and K batched chains), moves that
change M, batched proposals, bad input."""

from __future__ import annotations

import functools
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
from neuralblock.kernels.split_merge import (
    MOVES,
    MoveTuning,
    SplitMergeGMM,
    mixture_layout,
    propose_move,
    propose_moves,
)

SIGMA, TAU, P_ACTIVE = 1.0, 2.0, 0.5
WIDTH = 2.0  # h of the bounded moment exp(-|mu|^2 / 2 h^2) of the means (about the prior's scale TAU)
# |z| < 5 for each pattern probability and mean moment, from 4 chains x 25 batch means (t with 99 degrees
# of freedom: P(|t| > 5) = 2.5e-6): with at most 7 patterns and 4 moments per test, a false-failure rate
# below 3e-5 per test, below 2e-4 if the batch means underestimate the standard errors by 10% (over 60
# reruns of each test with other seeds, the 1500 z-scores had standard deviation 1.03 and |z| < 3.8).
Z_MAX = 5.0


def _posterior_terms(
    points: torch.Tensor, m: int, sigma: float, tau: float, p: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The posterior of an open-universe GMM as a finite mixture over patterns ``v`` and labels ``z``.

    ``p(v, z, x) = p^M (1 - p)^(m - M) M^-n prod_{k active} Z_k`` where ``Z_k`` is the evidence
    of the points labelled ``k`` under ``mu_k ~ N(0, tau^2 I)``, ``x ~ N(mu_k, sigma^2 I)`` (each
    coordinate is ``N(0, sigma^2 I + tau^2 11^T)``). Given ``(v, z, x)`` the means are independent
    Gaussians ``N(a_k, s_k^2 I)``: ``1 / s_k^2 = 1 / tau^2 + n_k / sigma^2`` and
    ``a_k = s_k^2 S_k / sigma^2`` for an active ``k`` with ``n_k`` points of sum ``S_k`` (possibly
    none), the prior ``N(0, tau^2 I)`` for an inactive one. Exact for few points (``sum_v M^n`` terms).

    Returns:
        ``(bits [T, m], weights [T], loc [T, m, D], var [T, m])``: each term's pattern ``v``, posterior
        probability and the means' Gaussians ``N(a_k, s_k^2 I)`` given it.
    """
    points = points.double()
    n, dim = points.shape
    prior = (0.0, torch.zeros(dim, dtype=torch.float64), tau**2)

    @functools.cache
    def cluster(members: tuple[int, ...]) -> tuple[float, torch.Tensor, float]:
        """``(log Z_k, a_k, s_k^2)`` of an active mixture with these points."""
        if not members:
            return prior
        cov = sigma**2 * torch.eye(len(members), dtype=torch.float64) + tau**2
        normal = torch.distributions.MultivariateNormal(torch.zeros(len(members), dtype=torch.float64), cov)
        var = 1.0 / (1.0 / tau**2 + len(members) / sigma**2)
        return float(normal.log_prob(points[list(members)].T).sum()), var * points[list(members)].sum(0) / sigma**2, var

    bits, log_weights, loc, var = [], [], [], []
    for v in itertools.product([0, 1], repeat=m):
        size = sum(v)
        if not size:
            continue
        log_v = size * math.log(p) + (m - size) * math.log(1 - p) - n * math.log(size)
        for labels in itertools.product([k for k in range(m) if v[k]], repeat=n):
            terms = [cluster(tuple(q for q in range(n) if labels[q] == k)) if v[k] else prior for k in range(m)]
            bits.append(v)
            log_weights.append(log_v + sum(log_z for log_z, _, _ in terms))
            loc.append(torch.stack([a for _, a, _ in terms]))
            var.append([s2 for _, _, s2 in terms])
    weights = torch.softmax(torch.tensor(log_weights, dtype=torch.float64), 0)
    return torch.tensor(bits, dtype=torch.float64), weights, torch.stack(loc), torch.tensor(var, dtype=torch.float64)


def _exact_patterns(terms: tuple[torch.Tensor, ...]) -> dict[tuple[int, ...], float]:
    """P(v) of an open-universe GMM in closed form: the terms of :func:`_posterior_terms` summed over the labels."""
    bits, weights, _, _ = terms
    out: dict[tuple[int, ...], float] = {}
    for v, weight in zip(bits.long().tolist(), weights.tolist()):
        out[tuple(v)] = out.get(tuple(v), 0.0) + weight
    return out


def _by_activity(on: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[..., 2, F]``: ``sum_k 1{v_k = b} values_k`` for ``b = 0, 1`` (bits ``[..., m]``, ``values [..., m, F]``)."""
    return torch.stack([((1 - on)[..., None] * values).sum(-2), (on[..., None] * values).sum(-2)], -2)


def _mean_features(mu: torch.Tensor) -> torch.Tensor:
    """``[..., 2]``: ``sum_d mu_d`` and ``exp(-|mu|^2 / 2 h^2)`` (``h = WIDTH``) of means ``[..., D]``."""
    return torch.stack([mu.sum(-1), torch.exp(-0.5 * mu.square().sum(-1) / WIDTH**2)], -1)


def _exact_mean_moments(terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``[2, 2]``: ``E[sum_k 1{v_k = b} f(mu_k)]`` for ``b = 0, 1`` and each feature ``f`` of :func:`_mean_features`.

    Under ``mu ~ N(a, s^2 I_D)`` (:func:`_posterior_terms`): ``E[sum_d mu_d] = sum_d a_d`` and
    ``E[exp(-|mu|^2 / 2 h^2)] = (h^2 / (h^2 + s^2))^(D/2) exp(-|a|^2 / 2 (h^2 + s^2))``. The bounded
    second feature stands in for ``|mu|^2``, whose batch means are skewed (empty mixtures' means roam
    the prior) and whose z-scores have a heavy left tail. Inactive means follow the prior (``b = 0``:
    ``0`` and ``(h^2 / (h^2 + tau^2))^(D/2) E[m - M]``).
    """
    bits, weights, loc, var = terms
    spread = WIDTH**2 + var
    kernel = (WIDTH**2 / spread) ** (loc.shape[-1] / 2) * torch.exp(-0.5 * loc.square().sum(-1) / spread)
    features = torch.stack([loc.sum(-1), kernel], -1)  # [T, m, 2]
    return (weights[:, None, None] * _by_activity(bits, features)).sum(0)


def _posterior_z_scores(
    kernel: SplitMergeGMM, fg: FactorGraph, patterns: dict, moments: torch.Tensor, draws_per_chain: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """z-scores of the sampled P(v) (``patterns``) and mean moments (``moments [2, 2]``, :func:`_exact_mean_moments`).

    4 chains, 25 batch means each (4 runs of one chain, or one run of a kernel with ``chains=4``);
    returns ``(z [patterns], z [2, 2])``.
    """
    m = len(next(iter(patterns)))
    dim = sum(name.startswith("mu[0,") for name in fg.names)
    bits = torch.tensor([fg.variable_id(f"v[{k}]") for k in range(m)])
    means = torch.tensor([[fg.variable_id(f"mu[{k},{d}]") for d in range(dim)] for k in range(m)])
    chains = []
    for chain in range(4 // kernel.chains):
        pyro.set_rng_seed(100 + chain)
        mcmc = MCMC(kernel, num_samples=draws_per_chain, warmup_steps=50, disable_progbar=True)
        mcmc.run()
        x = mcmc.get_samples()["x"]
        chains.extend([x] if kernel.chains == 1 else x.unbind(1))  # [S, K, N]: K chains
    draws = torch.stack(chains).double()  # [4, draws, N]
    on = draws[..., bits]
    keys = sorted(patterns)
    indicators = torch.stack([(on == torch.tensor(v, dtype=on.dtype)).all(-1).double() for v in keys], -1)
    exact = (torch.tensor([patterns[v] for v in keys], dtype=torch.float64), moments.double())
    z = []
    for stats, truth in zip((indicators, _by_activity(on, _mean_features(draws[..., means]))), exact):
        mean, se = batch_means_mcse(stats, num_batches=25)
        z.append((mean - truth) / se.clamp(min=1e-3))
    return z[0], z[1]


def test_closed_form_matches_the_quadrature() -> None:
    points = torch.tensor([[-1.5], [-1.0], [2.0]])
    closed = _exact_patterns(_posterior_terms(points, 2, SIGMA, TAU, P_ACTIVE))
    quadrature = _exact_bit_marginals(points[:, 0], SIGMA, TAU, P_ACTIVE)
    assert all(abs(closed[v] - quadrature[v]) < 1e-6 for v in quadrature)


@pytest.mark.parametrize("compiled", [None, False], ids=["compiled", "eager"])
@pytest.mark.parametrize(
    ("points", "m", "draws", "seeds"),
    [
        (torch.tensor([[-1.5], [-1.0], [2.0]]), 2, 1000, 64),
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 600, 64),
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 600, 2),
    ],
    ids=["m2-1d", "m3-2d", "m3-2d-two-seeds"],
)
def test_moves_alone_keep_the_exact_posterior(
    points: torch.Tensor, m: int, draws: int, seeds: int, compiled: bool | None
) -> None:
    # gibbs_prob = 0: the split/merge/birth/death moves alone must leave p(v, mu | x) invariant; with two birth
    # seeds for three points, a birth's seeds are the two most poorly explained points of each state. The eager
    # moves run the 4 chains as one batched state (the same code as one chain, a fourth of its time).
    fg = gmm_graph(points, m, SIGMA, TAU, P_ACTIVE)
    chains = 4 if compiled is False else 1
    tuning = MoveTuning(birth_seeds=seeds)
    kernel = SplitMergeGMM(fg, gibbs_prob=0.0, moves_per_sweep=2, tuning=tuning, compiled=compiled, chains=chains)
    terms = _posterior_terms(points, m, SIGMA, TAU, P_ACTIVE)  # enumerated once for both references
    exact = _exact_patterns(terms), _exact_mean_moments(terms)
    z_patterns, z_means = _posterior_z_scores(kernel, fg, *exact, draws_per_chain=draws)
    accepted = kernel.diagnostics()["acceptance_by_move"]
    assert kernel.diagnostics()["compiled_moves"] is (compiled is None)
    assert all(accepted[k] > 0.05 for k in MOVES), accepted
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means  # active means and inactive ones (which follow the prior)


@pytest.mark.parametrize("schedule", ["random", "alternate"])
def test_mixed_with_single_site_keeps_the_exact_gmm_posterior(schedule: str) -> None:
    points = torch.tensor([[-1.5], [-1.0], [2.0]])
    exact = _exact_bit_marginals(points[:, 0], SIGMA, TAU, P_ACTIVE)
    fg = gmm_graph(points, 2, SIGMA, TAU, P_ACTIVE)
    kernel = SplitMergeGMM(fg, gibbs_prob=0.3, schedule=schedule)
    moments = _exact_mean_moments(_posterior_terms(points, 2, SIGMA, TAU, P_ACTIVE))
    z_patterns, z_means = _posterior_z_scores(kernel, fg, exact, moments, draws_per_chain=500)
    sweeps = kernel.diagnostics()["single_site_sweeps"]
    assert sweeps > 0
    if schedule == "alternate":  # 3 in every 10 transitions of each of the 4 runs (550 each, warmup included)
        assert kernel._turns == 550 and sweeps == 150
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


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
    assert int((m_active[-10:] == 3).sum()) >= 8, m_active  # M = 4 (a spare mixture) is rare, not impossible
    means = mcmc.get_samples()["x"][-1, layout.means][mcmc.get_samples()["x"][-1, layout.active] > 0]
    assert torch.cdist(means, centres).min(0).values.max() < 1.0  # one mixture on each cluster
    assert kernel.logging()["M"] == 3.0
    diagnostics = kernel.diagnostics()
    assert diagnostics["updates_per_second"] > 0 and diagnostics["nonfinite_rejections"] == 0


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
    with pytest.raises(ValueError, match="schedule"):
        SplitMergeGMM(gmm, schedule="cyclic")
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


@pytest.mark.parametrize(
    ("points", "m", "gibbs_prob", "draws"),
    [
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 0.0, 600),
        (torch.tensor([[-1.5], [-1.0], [2.0]]), 2, 0.3, 500),
    ],
    ids=["moves-m3-2d", "mixed-m2-1d"],
)
@pytest.mark.parametrize("compiled", [None, False], ids=["compiled", "eager"])
def test_batched_chains_keep_the_exact_posterior(
    points: torch.Tensor, m: int, gibbs_prob: float, draws: int, compiled: bool | None
) -> None:
    # chains=4: every move attempt is one batched step of all four chains (each its own move type and mixtures), or
    # one compiled call takes every chain's attempts.
    fg = gmm_graph(points, m, SIGMA, TAU, P_ACTIVE)
    kernel = SplitMergeGMM(fg, gibbs_prob=gibbs_prob, moves_per_sweep=2, chains=4, compiled=compiled)
    terms = _posterior_terms(points, m, SIGMA, TAU, P_ACTIVE)
    z_patterns, z_means = _posterior_z_scores(
        kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), draws_per_chain=draws
    )
    diagnostics = kernel.diagnostics()
    assert diagnostics["chains"] == 4.0 and diagnostics["acceptance_rate"] > 0.05
    assert all(diagnostics["acceptance_by_move"][k] > 0.02 for k in MOVES), diagnostics["acceptance_by_move"]
    assert (diagnostics["single_site_sweeps"] > 0) == (gibbs_prob > 0)
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_batched_chains_are_independent_and_shaped() -> None:
    points = torch.tensor([[-2.0, 0.0], [-1.5, 0.5], [2.0, 1.0], [2.5, 0.0]])
    fg = gmm_graph(points, 4, 1.0, 3.0, 0.5)
    layout = mixture_layout(fg)
    start = fg.initial_state()
    start[layout.active] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    kernel = SplitMergeGMM(fg, gibbs_prob=0.0, moves_per_sweep=3, chains=3)
    kernel.initial_params = {"x": start.repeat(3, 1)}  # one start for all chains
    mcmc = MCMC(kernel, num_samples=6, warmup_steps=0, disable_progbar=True)
    mcmc.run()
    x = mcmc.get_samples()["x"]
    assert x.shape == (6, 3, fg.num_variables)
    means = x[-1][:, layout.means.reshape(-1)]
    assert not torch.equal(means[0], means[1]) and not torch.equal(means[1], means[2])  # chains moved apart
    diagnostics = kernel.diagnostics()
    attempts = sum(diagnostics["proposed"].values()) + sum(diagnostics["unavailable"].values())
    assert attempts == 6 * 3 * 3  # transitions x moves per sweep x chains
    assert diagnostics["updates_per_second"] > 0 and diagnostics["transitions_per_second"] > 0
    one = SplitMergeGMM(fg, gibbs_prob=0.5)  # chains=1 keeps the one-chain layout [S, N]
    single = MCMC(one, num_samples=3, warmup_steps=1, disable_progbar=True)
    single.run()
    assert single.get_samples()["x"].shape == (3, fg.num_variables)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="chains"):
            SplitMergeGMM(fg, chains=bad)  # type: ignore[arg-type]


def test_batched_proposals_per_chain() -> None:
    """Each chain's proposal changes only its own mixtures' block; moves that cannot apply leave the chain as is."""
    fg = gmm_graph(torch.randn(8, 2), 4, 1.0, 3.0, 0.5)
    layout = mixture_layout(fg)
    state = fg.initial_state().repeat(12, 1)
    state[:6, layout.active] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    state[6:, layout.active] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # one active mixture: no death, no merge
    kinds = torch.arange(len(MOVES)).repeat(2)
    batch = propose_moves(kinds, layout, state, torch.full((len(MOVES),), -math.log(len(MOVES))), MoveTuning())
    assert batch.available.tolist() == [True] * 6 + [True, False, True, False, True, False]
    for b in range(12):
        changed = set((batch.state[b] != state[b]).nonzero().squeeze(-1).tolist())
        block = torch.cat([torch.cat([layout.means[k], layout.active[k : k + 1]]) for k in batch.mixtures[b].tolist()])
        if batch.available[b]:
            assert changed and changed <= set(block.tolist()), (MOVES[int(kinds[b])], changed)
            assert torch.isfinite(batch.log_q_fwd[b]) and torch.isfinite(batch.log_q_rev[b])
        else:
            assert not changed
