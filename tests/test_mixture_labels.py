"""Label moves of open-universe GMMs: exact samples stay exact, each draw is the conditional, bad input is refused."""

from __future__ import annotations

import pytest
import torch
from pyro.infer import MCMC
from test_mixture_copies import Z_MAX, _exact_draws, _z_scores
from test_split_merge import SIGMA, TAU, _posterior_terms

from motifs.gmm_pair import gmm_graph, gmm_initial_state
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.kernels.mixture_labels import LabelRandoms, MixtureLabelMoves, check_label_steps, draw_label_randoms
from neuralblock.kernels.mixture_sites import MixtureSites
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import SplitMergeGMM


def _moves(points: torch.Tensor, m: int, steps: int) -> tuple[MixtureLabelMoves, tuple[torch.Tensor, ...]]:
    fg = gmm_graph(points, m, SIGMA, TAU, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    return MixtureLabelMoves(sites, steps), (fg, *_posterior_terms(points, m, SIGMA, TAU, 0.5))


@pytest.mark.parametrize(
    ("points", "m"),
    [
        (torch.tensor([[-0.4], [0.1], [0.5]]), 3),
        (torch.tensor([[-0.3, 0.2], [0.2, -0.1], [0.4, 0.3]]), 3),
        (torch.tensor([[-1.5], [-1.2], [1.4], [1.6]]), 4),
    ],
    ids=["m3-1d", "m3-2d", "m4-1d"],
)
def test_label_steps_keep_exact_draws_exact(points: torch.Tensor, m: int) -> None:
    # 40,000 independent exact draws, then 3 label steps each: still exact draws (|z| < 5 for every pattern
    # probability and mean moment, as in test_mixture_copies). The bits never change, and every mean does (an
    # inactive one is a fresh draw from its prior).
    moves, (fg, *terms) = _moves(points, m, steps=3)
    before = _exact_draws(fg, tuple(terms), 40_000, seed=11 + len(points))
    torch.manual_seed(3)
    after = moves.move(before)
    bits, means = moves.sites.active_ids, torch.from_numpy(moves.sites.mean_ids.reshape(-1))
    assert torch.equal(after[:, bits], before[:, bits])
    assert bool((after[:, means] != before[:, means]).all())
    z = _z_scores(fg, after, tuple(terms))
    assert z.abs().max() < Z_MAX, z


def test_a_wrong_conditional_fails_the_same_check() -> None:
    # the check has power: draws of the means at 1.5x their conditional's spread move the mean moments by |z| > 5
    points = torch.tensor([[-0.3, 0.2], [0.2, -0.1], [0.4, 0.3]])
    moves, (fg, *terms) = _moves(points, 3, steps=1)
    before = _exact_draws(fg, tuple(terms), 40_000, seed=5)
    torch.manual_seed(4)
    draws = draw_label_randoms(len(before), 1, 3, 3, 2)
    after = moves.move(before, LabelRandoms(draws.label_u, 1.5 * draws.normals))
    assert _z_scores(fg, after, tuple(terms)).abs().max() > Z_MAX


def test_one_active_mixture_takes_every_point_and_its_conjugate_mean() -> None:
    # with the normals at 0 a mean lands on its conditional's centre: (sum x / sigma^2 + loc / tau^2) / precision
    points = torch.tensor([[1.0, 2.0], [3.0, -1.0], [2.0, 0.5]], dtype=torch.float64)
    sigma, tau = 0.5, 2.0
    fg = gmm_graph(points, 3, sigma, tau, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    moves = MixtureLabelMoves(sites, steps=1)
    state = gmm_initial_state(fg).double()
    state[torch.from_numpy(sites.active_ids)] = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    draws = LabelRandoms(torch.rand(1, 1, 3, dtype=torch.float64), torch.zeros(1, 1, 3, 2, dtype=torch.float64))
    new = moves.move(state[None], draws)[0]
    precision = 3 / sigma**2 + 1 / tau**2
    expected = (points.sum(0) / sigma**2) / precision
    assert torch.allclose(new[torch.from_numpy(sites.mean_ids[1])], expected, atol=1e-12)
    inactive = torch.from_numpy(sites.mean_ids[[0, 2]].reshape(-1))
    assert torch.equal(new[inactive], torch.zeros(4, dtype=torch.float64))  # (their prior's centre)


def test_inactive_means_are_fresh_draws_from_their_prior() -> None:
    # states whose inactive means all sit far out in their prior's tail (3 tau from its centre): after one step
    # they are draws from the prior N(c, tau^2) -- a step that kept them, or moved them a little, fails this
    gen = torch.Generator().manual_seed(8)
    points = torch.randn(12, 2, generator=gen, dtype=torch.float64)
    centre, tau = torch.tensor([1.0, -0.5], dtype=torch.float64), 2.0
    fg = gmm_graph(points, 4, 0.8, tau, 0.5, prior_mean=centre)
    sites = MixtureSites.of(fg)
    assert sites is not None
    states = gmm_initial_state(fg).double().repeat(20_000, 1)
    states[:, torch.from_numpy(sites.active_ids)] = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    inactive = torch.from_numpy(sites.mean_ids[[1, 3]].reshape(-1))
    states[:, inactive] = (centre + 3 * tau).repeat(2)
    torch.manual_seed(9)
    after = MixtureLabelMoves(sites, steps=1).move(states)[:, inactive] - centre.repeat(2)  # [K, 4]: N(0, tau^2)
    count = len(after)
    z_mean = after.mean(0) / (tau / count**0.5)
    z_var = (after.square().mean(0) - tau**2) / (tau**2 * (2 / count) ** 0.5)
    assert z_mean.abs().max() < 5 and z_var.abs().max() < 5, (z_mean, z_var)
    # with no mixture active (no labels to draw) every mean still gets its draw: at normals of 1, c + tau
    off = gmm_initial_state(fg).double()
    off[torch.from_numpy(sites.active_ids)] = 0.0
    ones = LabelRandoms(torch.rand(1, 1, 12, dtype=torch.float64), torch.ones(1, 1, 4, 2, dtype=torch.float64))
    new = MixtureLabelMoves(sites, steps=1).move(off[None], ones)[0]
    assert torch.allclose(new[torch.from_numpy(sites.mean_ids.reshape(-1))], (centre + tau).repeat(4))


def test_bad_inputs_and_options() -> None:
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(error, match="label_steps must"):
            check_label_steps(bad)
    fg = gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    with pytest.raises(ValueError, match="at least 1"):
        MixtureLabelMoves(sites, 0)
    moves = MixtureLabelMoves(sites, 2)
    state = torch.stack([gmm_initial_state(fg)] * 3)
    with pytest.raises(ValueError, match="draws must be float64 arrays"):
        moves.move(state, draw_label_randoms(3, 1, 5, 3, 1))
    assert moves.move(state.reshape(1, 3, -1)).shape == (1, 3, fg.num_variables)
    with pytest.raises(ValueError, match="label_steps must be at least 0"):
        SplitMergeGMM(fg, label_steps=-2)
    with pytest.raises(TypeError, match="label_steps must be an integer"):
        NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], label_steps=0.5)  # type: ignore[arg-type]


def test_the_kernels_run_them() -> None:
    gen = torch.Generator().manual_seed(0)
    points = torch.cat([torch.randn(30, 2, generator=gen) * 0.5, torch.randn(30, 2, generator=gen) * 0.5 + 4.0])
    fg = gmm_graph(points, 6, 0.5, 5.0, 0.5)
    assert SingleSiteSweep(fg, label_steps=0).label_moves is None
    default = SingleSiteSweep(fg).label_moves
    assert default is not None and default.steps == 2
    kernel = SplitMergeGMM(fg, gibbs_prob=1.0, chains=2, label_steps=3)
    MCMC(kernel, num_samples=5, warmup_steps=1, disable_progbar=True).run()
    moves = kernel.single_site.label_moves
    assert moves is not None and moves.steps == 3
    off = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=1.0, label_steps=0)
    MCMC(off, num_samples=3, warmup_steps=1, disable_progbar=True).run()
    assert off.single_site.label_moves is None


@pytest.mark.parametrize("kind", ["neural", "split-merge"])
def test_every_transition_of_the_kernels_ends_with_label_steps(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # with gibbs_prob=0 no single-site sweep runs: the label steps come after the kernel's own moves alone
    gen = torch.Generator().manual_seed(1)
    points = torch.cat([torch.randn(20, 2, generator=gen) * 0.5, torch.randn(20, 2, generator=gen) * 0.5 + 4.0])
    fg = gmm_graph(points, 4, 0.5, 5.0, 0.5)
    calls: list[int] = []
    original = MixtureLabelMoves.move
    monkeypatch.setattr(
        MixtureLabelMoves, "move", lambda self, state, draws=None: calls.append(1) or original(self, state)
    )
    if kind == "neural":
        kernel = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=0.0, chains=2)
    else:
        kernel = SplitMergeGMM(fg, gibbs_prob=0.0, chains=2)
    MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True).run()
    assert len(calls) == 6


def _reference_step(moves: MixtureLabelMoves, state: torch.Tensor, draws: LabelRandoms) -> torch.Tensor:
    """One label step of one float64 state ``[N]`` written out in torch (labels by inversion, then every mean, an
    inactive one from its prior)."""
    sites = moves.sites
    sigma, points = sites.sigma, torch.from_numpy(sites.points)
    loc, precision0 = torch.from_numpy(sites.whitened_loc), torch.from_numpy(sites.whitened_precision)
    active = [k for k in range(len(sites.active_ids)) if state[int(sites.active_ids[k])] > 0]
    means = torch.stack([state[torch.from_numpy(sites.mean_ids[k])] / sigma for k in active])
    out = state.clone()
    counts = torch.zeros(len(active), dtype=torch.float64)
    sums = torch.zeros(len(active), points.shape[1], dtype=torch.float64)
    for j in range(len(points)):
        terms = -0.5 * (points[j] - means).square().sum(-1)
        weights = (terms - terms.max()).exp()
        running = torch.cumsum(weights, 0)
        hits = (draws.label_u[0, 0, j] * weights.sum() < running).nonzero()
        label = int(hits[0]) if len(hits) else len(active) - 1
        counts[label] += 1
        sums[label] += points[j]
    for k in range(len(sites.active_ids)):  # an inactive mean has no points: its conditional is its prior
        i = active.index(k) if k in active else None
        precision = precision0[k] + (0.0 if i is None else counts[i])
        centre = (loc[k] * precision0[k] + (0.0 if i is None else sums[i])) / precision
        out[torch.from_numpy(sites.mean_ids[k])] = (centre + draws.normals[0, 0, k] / precision.sqrt()) * sigma
    return out


def test_a_step_is_the_written_out_gibbs_draws() -> None:
    # sigma != 1, a prior mean away from 0 and priors that differ by mixture: the labels and the means as written
    # out from the conditionals, with the same random numbers (a slip of sigma, of a prior term or of a mixture's
    # index would show)
    gen = torch.Generator().manual_seed(2)
    centres = torch.tensor([[0.0, 0.0], [3.0, 1.0], [-2.0, 2.5]], dtype=torch.float64)
    points = torch.cat([c + 0.7 * torch.randn(6, 2, generator=gen, dtype=torch.float64) for c in centres])
    fg = gmm_graph(points, 5, 0.7, 3.0, 0.5, prior_mean=torch.tensor([1.0, -0.5]))
    sites = MixtureSites.of(fg)
    assert sites is not None
    sites.whitened_precision = sites.whitened_precision * torch.linspace(0.5, 4.0, 10).reshape(5, 2).numpy()
    sites.whitened_loc = sites.whitened_loc + torch.linspace(-1.0, 1.0, 10).reshape(5, 2).numpy()
    moves = MixtureLabelMoves(sites, steps=1)
    state = gmm_initial_state(fg).double()
    state[torch.from_numpy(sites.active_ids)] = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    state[torch.from_numpy(sites.mean_ids.reshape(-1))] = torch.cat([centres, centres[:1] + 0.4, centres[1:2]]).reshape(
        -1
    )
    for seed in range(5):
        torch.manual_seed(seed)
        draws = draw_label_randoms(1, 1, len(points), 5, 2)
        new = moves.move(state[None], draws)[0]
        assert torch.allclose(new, _reference_step(moves, state, draws), atol=1e-10), seed
        single = moves.move(state[None].float(), draws)[0]
        assert single.dtype == torch.float32 and torch.allclose(single.double(), new, atol=1e-4)


def test_states_it_cannot_read_are_refused() -> None:
    fg = gmm_graph(torch.randn(5, 2), 3, 1.0, 2.0, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    moves = MixtureLabelMoves(sites, 1)
    state = gmm_initial_state(fg)
    with pytest.raises(ValueError, match="N >= "):
        moves.move(state[:5])
    bad = state.clone()
    bad[int(sites.mean_ids[0, 0])] = float("nan")
    with pytest.raises(ValueError, match="finite means"):
        moves.move(bad)
    with pytest.raises(ValueError, match="CPU states only"):
        moves.move(torch.empty(fg.num_variables, device="meta"))
