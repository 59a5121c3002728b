"""Copy-set moves of open-universe GMMs: exact samples stay exact, the energy is the graph's, exact round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pyro.infer import MCMC
from test_split_merge import (
    SIGMA,
    TAU,
    _by_activity,
    _exact_mean_moments,
    _exact_patterns,
    _mean_features,
    _posterior_terms,
)

from motifs.gmm_pair import gmm_graph, gmm_initial_state
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.graph import FactorGraph
from neuralblock.kernels.mixture_copies import OUTCOMES, CopyRandoms, MixtureCopyMoves, _energy, draw_copy_randoms
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import SplitMergeGMM

# |z| < 5 for each pattern probability, mean moment and flux of 40,000 iid draws: about 45 checks per case (up to 15
# patterns and 4 moments before and after the moves, up to 6 fluxes), each failing by chance with probability under
# 1.3e-5 (the binomial tail of the rarest pattern; 5.7e-7 where the normal approximation holds): a false-failure
# rate below 6e-4 per case if the seeds change (they are fixed, so the test is deterministic)
Z_MAX = 5.0


def _exact_draws(fg: FactorGraph, terms: tuple[torch.Tensor, ...], count: int, seed: int) -> torch.Tensor:
    """``count`` independent draws of the whole state from the exact posterior (:func:`_posterior_terms`)."""
    bits, weights, loc, var = terms
    gen = torch.Generator().manual_seed(seed)
    pick = torch.multinomial(weights, count, replacement=True, generator=gen)
    means = loc[pick] + var[pick].sqrt()[..., None] * torch.randn(loc[pick].shape, generator=gen, dtype=torch.float64)
    m, dim = loc.shape[1:]
    state = gmm_initial_state(fg).double().expand(count, -1).clone()
    state[:, [fg.variable_id(f"v[{k}]") for k in range(m)]] = bits[pick]
    ids = [[fg.variable_id(f"mu[{k},{d}]") for d in range(dim)] for k in range(m)]
    state[:, torch.tensor(ids).reshape(-1)] = means.reshape(count, -1)
    return state


def _z_scores(fg: FactorGraph, state: torch.Tensor, terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """iid z-scores of the draws' pattern frequencies and mean moments against the exact ones."""
    patterns, moments = _exact_patterns(terms), _exact_mean_moments(terms)
    m, dim = terms[2].shape[1:]
    on = state[:, [fg.variable_id(f"v[{k}]") for k in range(m)]]
    ids = torch.tensor([[fg.variable_id(f"mu[{k},{d}]") for d in range(dim)] for k in range(m)])
    keys = sorted(patterns)
    stats = torch.cat(
        [
            torch.stack([(on == torch.tensor(v, dtype=on.dtype)).all(-1).double() for v in keys], -1),
            _by_activity(on, _mean_features(state[:, ids])).reshape(len(state), -1),
        ],
        -1,
    )
    exact = torch.cat([torch.tensor([patterns[v] for v in keys], dtype=torch.float64), moments.reshape(-1)])
    se = stats.std(0) / math.sqrt(len(state))
    return (stats.mean(0) - exact) / se.clamp(min=1e-4)


@pytest.mark.parametrize(
    ("points", "m"),
    [
        (torch.tensor([[-0.4], [0.1], [0.5]]), 3),
        (torch.tensor([[-0.3, 0.2], [0.2, -0.1], [0.4, 0.3]]), 3),
        (torch.tensor([[-1.5], [-1.2], [1.4], [1.6]]), 4),  # two groups: two pairs split or merged at once
    ],
    ids=["m3-1d", "m3-2d", "m4-1d"],
)
def test_moves_keep_exact_draws_exact(points: torch.Tensor, m: int) -> None:
    # 40,000 independent exact draws, then 4 moves each: still exact draws (the moves leave the posterior
    # invariant) -- and the moves must have changed many of them, or the test would have no power (dropping
    # the Jacobian fails it at |z| 70-90; smaller errors of the ratio are the next test's)
    fg = gmm_graph(points, m, SIGMA, TAU, 0.5)
    terms = _posterior_terms(points, m, SIGMA, TAU, 0.5)
    before = _exact_draws(fg, terms, 40_000, seed=len(points[0]))
    assert _z_scores(fg, before, terms).abs().max() < Z_MAX
    moves = MixtureCopyMoves.of(fg, attempts=4)
    assert moves is not None
    torch.manual_seed(7)
    after, outcome = moves.move(before)
    moves.record(outcome)
    rates = moves.acceptance()
    assert rates["split"] > 0.05 and rates["merge"] > 0.05, rates
    changed = (after[:, moves.sites.active_ids] != before[:, moves.sites.active_ids]).any(-1).double().mean()
    assert changed > 0.15, changed
    if m == 4:  # moves of two pairs at once happen (in one of the 4 moves at least)
        jumps = (after[:, moves.sites.active_ids].sum(-1) - before[:, moves.sites.active_ids].sum(-1)).abs()
        assert (jumps == 2).double().mean() > 0.01
    z = _z_scores(fg, after, terms)
    assert z.abs().max() < Z_MAX, z
    # detailed balance: from exact draws, as many go from M = i to M = j as from j to i (the moves' fluxes);
    # (f - r) / sqrt(f + r) is about standard normal under it
    before_m, after_m = (s[:, moves.sites.active_ids].sum(-1) for s in (before, after))
    for i in range(1, m + 1):
        for j in range(i + 1, m + 1):
            forward = int(((before_m == i) & (after_m == j)).sum())
            backward = int(((before_m == j) & (after_m == i)).sum())
            if forward + backward:
                assert abs(forward - backward) / math.sqrt(forward + backward) < Z_MAX, (i, j, forward, backward)


def _soft_counts(points: torch.Tensor, means: torch.Tensor, bits: torch.Tensor, sigma: float) -> torch.Tensor:
    """Each mixture's share of the points (0 for inactive mixtures)."""
    log_w = -0.5 * ((points[:, None] - means[None]) ** 2).sum(-1) / sigma**2
    log_w = torch.where(bits[None] > 0, log_w, -math.inf)
    return torch.softmax(log_w, -1).sum(0)


def _pairs(means: torch.Tensor, bits: torch.Tensor, limit: float) -> dict[int, int]:
    """Copy pairs as ``{mixture: partner}`` (mutual nearest active mixtures closer than ``limit``)."""
    active = [a for a in range(len(bits)) if bits[a] > 0]
    nearest = {}
    for a in active:
        others = [(float((means[a] - means[b]).square().sum()), b) for b in active if b != a]
        if others and min(others)[0] < limit**2:
            nearest[a] = min(others)[1]
    return {a: b for a, b in nearest.items() if nearest.get(b) == a}


def _reference_log_ratio(fg: FactorGraph, moves: MixtureCopyMoves, x: torch.Tensor, y: torch.Tensor) -> float:
    """The MH log ratio of the move from ``x`` to ``y``, from the graph's log joint and the module docstring's
    proposal, written out independently of the compiled loop."""
    sites = moves.sites
    m, dim = sites.mean_ids.shape
    sigma, limit = sites.sigma, moves.radius * sites.sigma
    points = torch.as_tensor(sites.points) * sigma
    bits = {s: z[torch.as_tensor(sites.active_ids)] for s, z in (("x", x), ("y", y))}
    means = {s: z[torch.as_tensor(sites.mean_ids)] for s, z in (("x", x), ("y", y))}
    split = bool(bits["y"].sum() > bits["x"].sum())
    few, many = ("x", "y") if split else ("y", "x")  # the state with fewer active mixtures, and with more
    count = int(bits[many].sum() - bits[few].sum())
    partners = _pairs(means[many], bits[many], limit)
    changed = [t for t in range(m) if bits[few][t] == 0 and bits[many][t] == 1]
    pairs = [(partners[t], t) for t in changed]  # (s, t): s stays active, t is the copy made or dropped
    assert len(pairs) == count
    active, inactive = int(bits[few].sum()), m - int(bits[few].sum())
    counts = _soft_counts(points, means[few], bits[few], sigma)
    log_split = -math.log(min(active, inactive)) - math.log(math.comb(active, count))
    log_split -= math.log(math.comb(inactive, count)) + math.lgamma(count + 1)
    log_merge = -math.log(len(partners) // 2) - math.log(math.comb(len(partners) // 2, count)) - count * math.log(2)
    prior = torch.distributions.Normal(torch.as_tensor(sites.prior_loc), torch.as_tensor(sites.prior_scale))
    for s, t in pairs:
        u = 0.5 * (means[many][t] - means[many][s])
        scale = moves.width * sigma * (float(counts[s]) + 1.0) ** -0.25
        log_split += float(torch.distributions.Normal(0.0, scale).log_prob(u).sum())
        log_merge += float(prior.log_prob(means[few])[t].sum())  # the inactive copy's mean, drawn by the merge
    jacobian = count * dim * math.log(2)
    log_joint = float(fg.log_joint(y) - fg.log_joint(x))
    return log_joint + (log_merge - log_split + jacobian if split else log_split - log_merge - jacobian)


def test_the_log_ratios_are_the_proposals(monkeypatch: pytest.MonkeyPatch) -> None:
    # every accepted move's ratio against one computed from the graph and the proposal written out by hand,
    # then the ratios of a second attempt after an accepted one (the energy and soft counts kept across attempts)
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)  # a float64 graph: ratios to 1e-8
    gen = torch.Generator().manual_seed(5)
    centres = torch.tensor([[0.0, 0.0], [3.0, 1.0], [-2.0, 3.0]])
    points = torch.cat([c + 0.6 * torch.randn(15, 2, generator=gen, dtype=torch.float64) for c in centres])
    fg = gmm_graph(points, 7, 0.7, 3.0, 0.4)
    moves = MixtureCopyMoves.of(fg, attempts=1)
    assert moves is not None
    sites, chains = moves.sites, 400
    state = torch.stack([gmm_initial_state(fg, gen) for _ in range(chains)]).double()
    active = torch.rand(chains, 7, generator=gen) < 0.6
    active[:, 0] = True
    state[:, sites.active_ids] = active.double()
    near = centres[torch.randint(3, (chains, 7), generator=gen)] + 0.3 * torch.randn(chains, 7, 2, generator=gen)
    state[:, sites.mean_ids] = torch.where(active[..., None], near.double(), state[:, sites.mean_ids])
    torch.manual_seed(11)
    draws = draw_copy_randoms(chains, 1, 7, 2)._replace(log_u=torch.full((chains, 1), -math.inf, dtype=torch.float64))
    moved, outcome = moves.move(state, draws)
    taken = (outcome[:, 0] == OUTCOMES.index("split accepted")) | (outcome[:, 0] == OUTCOMES.index("merge accepted"))
    kinds = outcome[taken, 0].tolist()
    assert kinds.count(2) > 30 and kinds.count(4) > 30, kinds  # many splits and merges, some of several pairs
    jumps = (moved[:, sites.active_ids].sum(-1) - state[:, sites.active_ids].sum(-1)).abs()
    assert (jumps[taken] >= 2).sum() > 10
    for k in taken.nonzero().reshape(-1).tolist():
        want = _reference_log_ratio(fg, moves, state[k], moved[k])
        assert moves.last_log_ratios[k, 0] == pytest.approx(want, abs=1e-8), k
    # a second attempt after the first: the same ratio as a fresh call from the moved state
    second = draw_copy_randoms(chains, 1, 7, 2)
    both = CopyRandoms(*(torch.cat([a, b], 1) for a, b in zip(draws, second)))
    two = MixtureCopyMoves.of(fg, attempts=2)
    assert two is not None
    _, _ = two.move(state, both)
    _, _ = moves.move(moved, second)
    np.testing.assert_allclose(two.last_log_ratios[:, 1], moves.last_log_ratios[:, 0], rtol=1e-12, atol=1e-9)


def test_the_energy_is_the_graphs_log_joint_up_to_a_constant() -> None:
    gen = torch.Generator().manual_seed(3)
    fg = gmm_graph(torch.randn(25, 2, generator=gen) * 2.0, 5, 1.3, 4.0, 0.3, prior_mean=torch.tensor([0.5, -1.0]))
    moves = MixtureCopyMoves.of(fg)
    assert moves is not None
    sites = moves.sites
    gaps = []
    for _ in range(6):
        state = gmm_initial_state(fg, gen).double()
        state[sites.active_ids[:2]] = 1.0  # at least one active mixture
        means = state[sites.mean_ids].numpy()
        counts = np.empty(len(sites.active_ids))
        args = (sites.sigma, sites.prior_loc, sites.prior_scale, sites.log_odds, counts)
        energy = _energy(sites.points, means, state[sites.active_ids].numpy(), *args)
        gaps.append(energy - float(fg.log_joint(state)))
        assert counts.sum() == pytest.approx(25.0)  # every point's responsibility, shared by the active mixtures
    assert max(gaps) - min(gaps) < 1e-5, gaps  # (the graph keeps its points in float32)


def _draws(kind: float, keys: list[float], side: float, normals: torch.Tensor) -> CopyRandoms:
    """One attempt of one chain: a split (``kind < 0.5``) or merge of one mixture or pair, always accepted."""
    one = torch.tensor([[kind]], dtype=torch.float64)
    return CopyRandoms(
        one,
        torch.zeros(1, 1, dtype=torch.float64),  # count 1
        torch.tensor([[keys]], dtype=torch.float64),
        torch.full((1, 1, len(keys)), side, dtype=torch.float64),
        normals[None, None].double(),
        torch.full((1, 1), -math.inf, dtype=torch.float64),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_split_and_its_merge_give_back_the_stored_state(dtype: torch.dtype) -> None:
    # split mixture 0 with inactive mixture 2 as its partner, then merge that pair with 0 surviving and 2's old
    # mean as its prior draw: the same state, up to a unit in the last place of the stored values
    points = torch.tensor([[0.0, 0.1], [0.3, -0.2], [4.0, 4.0], [4.2, 3.9]])
    fg = gmm_graph(points, 4, 1.0, 5.0, 0.5)
    moves = MixtureCopyMoves.of(fg, attempts=1)
    assert moves is not None
    sites = moves.sites
    state = gmm_initial_state(fg).to(dtype)
    state[sites.active_ids] = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=dtype)
    state[sites.mean_ids] = torch.tensor([[0.15, -0.05], [4.1, 3.95], [-3.3, 1.7], [2.0, -6.0]], dtype=dtype)
    keys = [0.1, 0.9, 0.2, 0.8]  # in key order: 0 first of the active, 2 first of the inactive
    split_normals = torch.tensor([[0.3, -0.2], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    split, outcome = moves.move(state[None], _draws(0.1, keys, 0.0, split_normals))
    assert OUTCOMES[int(outcome)] == "split accepted"
    assert split[0, sites.active_ids].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert torch.allclose(split[0, sites.mean_ids[[0, 2]]].double().mean(0), state[sites.mean_ids[0]].double())
    old = state[sites.mean_ids[2]].double()
    prior_draw = torch.zeros(4, 2, dtype=torch.float64)
    prior_draw[0] = (old - torch.as_tensor(sites.prior_loc[2])) / torch.as_tensor(sites.prior_scale[2])
    merged, outcome = moves.move(split, _draws(0.9, keys, 0.0, prior_draw))
    assert OUTCOMES[int(outcome)] == "merge accepted"
    ulp = torch.finfo(dtype).eps * 8.0  # (the means are at most 6.0 < 8 here)
    assert (merged[0] - state).abs().max() <= ulp
    assert torch.equal(merged[0, sites.active_ids], state[sites.active_ids])


def test_bad_inputs_and_options() -> None:
    fg = gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5)
    for bad in ({"radius": 0.0}, {"width": math.inf}, {"attempts": 0}, {"attempts": True}):
        with pytest.raises(ValueError, match="must be a positive"):
            MixtureCopyMoves.of(fg, **bad)
    moves = MixtureCopyMoves.of(fg, attempts=2)
    assert moves is not None
    state = torch.stack([gmm_initial_state(fg)] * 3)
    with pytest.raises(ValueError, match="draws must be float64 arrays"):
        moves.move(state, draw_copy_randoms(3, 1, 3, 1))
    new, outcome = moves.move(state.reshape(1, 3, -1))
    assert new.shape == (1, 3, fg.num_variables) and outcome.shape == (1, 3, 2)
    graph = FactorGraph()
    _ = graph.add_variable("z", 2)
    assert MixtureCopyMoves.of(graph) is None


def test_the_kernels_run_them_and_report_their_acceptance() -> None:
    gen = torch.Generator().manual_seed(0)
    points = torch.cat([torch.randn(30, 2, generator=gen) * 0.5, torch.randn(30, 2, generator=gen) * 0.5 + 4.0])
    fg = gmm_graph(points, 6, 0.5, 5.0, 0.5)
    assert SingleSiteSweep(fg, copy_moves=False).copy_moves is None
    kernel = SplitMergeGMM(fg, gibbs_prob=1.0, chains=2)
    MCMC(kernel, num_samples=40, warmup_steps=5, disable_progbar=True).run()
    rates = kernel.diagnostics()["copy_move_acceptance"]
    assert set(rates) == {"split", "merge"}
    moves = kernel.single_site.copy_moves
    assert moves is not None and moves.tally.sum() == 40 * 2 * moves.attempts  # post-warmup attempts only
    off = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=1.0, copy_moves=False)
    MCMC(off, num_samples=3, warmup_steps=1, disable_progbar=True).run()
    assert off.single_site.copy_moves is None and "copy_move_acceptance" not in off.diagnostics()
