"""The compiled single-site sweep of open-universe GMMs: the graph's conditionals, the exact posterior, fallbacks."""

from __future__ import annotations

import math

import pytest
import torch
from test_split_merge import SIGMA, TAU, Z_MAX, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import gmm_graph, gmm_initial_state
from neuralblock.graph import FactorGraph
from neuralblock.kernels.mixture_sites import MixtureSites, SiteRandoms, draw_site_randoms
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import SplitMergeGMM


def _reference_sweep(
    fg: FactorGraph, sites: MixtureSites, state: torch.Tensor, steps: torch.Tensor, draws: SiteRandoms
) -> torch.Tensor:
    """The sweep's updates from the graph's own log joint (float64), mixture by mixture, with the same numbers."""
    state = state.double().clone()
    m, dim = sites.mean_ids.shape
    steps = steps.double().reshape(m, dim)
    for k in range(state.shape[0]):
        x = state[k]
        for mixture in range(m):
            bit = int(sites.active_ids[mixture])
            on, off = x.clone(), x.clone()
            on[bit], off[bit] = 1.0, 0.0
            diff = float(fg.log_joint(on, check=False) - fg.log_joint(off, check=False))
            p_on = 1.0 / (1.0 + math.exp(-diff)) if diff > -700 else 0.0
            x[bit] = 1.0 if float(draws.bit_u[k, mixture]) < p_on else 0.0
            for d in range(dim):
                var = int(sites.mean_ids[mixture, d])
                moved = x.clone()
                moved[var] = x[var] + steps[mixture, d] * draws.noise[k, mixture, d]
                ratio = float(fg.log_joint(moved, check=False) - fg.log_joint(x, check=False))
                if float(draws.log_u[k, mixture, d]) < ratio:
                    x[var] = moved[var]
    return state


@pytest.mark.parametrize("dim", [1, 2])
def test_the_updates_are_the_graphs_conditionals(dim: int) -> None:
    # the same random numbers through the compiled sweep and through the graph's log joint give the same states
    gen = torch.Generator().manual_seed(dim)
    points = torch.randn(40, dim, generator=gen) * 3.0
    fg = gmm_graph(points, 5, 1.3, 4.0, 0.4, prior_mean=torch.full((dim,), 0.5))
    sites = MixtureSites.of(fg)
    assert sites is not None
    state = torch.stack([gmm_initial_state(fg, gen) for _ in range(3)]).double()
    state[0, torch.as_tensor(sites.active_ids)] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]).double()  # one active
    steps = torch.rand(5 * dim, generator=gen, dtype=torch.float64) + 0.3
    moved = 0
    for sweep in range(4):
        torch.manual_seed(sweep)
        draws = draw_site_randoms(3, 5, dim)
        want = _reference_sweep(fg, sites, state, steps, draws)
        got, accept_prob = sites.sweep(state, steps, draws)
        assert torch.allclose(got, want, atol=1e-9), (got - want).abs().max()
        assert accept_prob.shape == (3, 5 * dim) and bool(((accept_prob >= 0) & (accept_prob <= 1)).all())
        moved += int((got != state).sum())
        state = got
    assert moved > 20  # bits flipped and means moved


def test_a_single_chain_and_float32_states() -> None:
    fg = gmm_graph(torch.tensor([[0.0, 1.0], [3.0, 3.0]]), 3, 1.0, 2.0, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    state = gmm_initial_state(fg, torch.Generator().manual_seed(0))
    assert state.dtype == torch.float32
    new, accept_prob = sites.sweep(state, torch.full((6,), 0.5))
    assert new.shape == state.shape and new.dtype == torch.float32 and accept_prob.shape == (6,)
    assert new[torch.as_tensor(sites.active_ids)].sum() >= 1  # the points always keep an active mixture


def test_other_graphs_take_the_general_path() -> None:
    fg = gmm_graph(torch.tensor([[0.0], [1.0]]), 2, 1.0, 2.0, 0.5)
    fg.add_table_factor([int(fg.variable_id("v[0]")), int(fg.variable_id("v[1]"))], torch.zeros(2, 2))  # a coupling
    assert MixtureSites.of(fg) is None
    plain = FactorGraph()
    x = plain.add_variable("x")
    plain.add_linear_gaussian(x, [], [], 0.0, 1.0)
    assert MixtureSites.of(plain) is None and SingleSiteSweep(plain).mixture_sites is None
    assert SingleSiteSweep(gmm_graph(torch.tensor([[0.0], [1.0]]), 2, 1.0, 2.0, 0.5)).mixture_sites is not None


def test_the_steps_adapt_from_the_compiled_sweep() -> None:
    fg = gmm_graph(torch.randn(30, 2, generator=torch.Generator().manual_seed(1)), 4, 1.0, 3.0, 0.5)
    sweep = SingleSiteSweep(fg, step_size=20.0)  # far too large: the steps must shrink
    assert sweep.rw_plan is not None
    state = torch.stack([gmm_initial_state(fg) for _ in range(4)])
    before = sweep.rw_plan.adapter.step_size.clone()
    for _ in range(30):
        state = sweep.sweep(fg, state, adapt=True)
    assert bool((sweep.rw_plan.adapter.step_size < before).all())
    frozen = sweep.rw_plan.adapter.step_size.clone()
    sweep.sweep(fg, state, adapt=False)
    assert torch.equal(sweep.rw_plan.adapter.step_size, frozen)


@pytest.mark.parametrize(
    ("points", "m", "draws"),
    [
        (torch.tensor([[-1.5], [-1.0], [2.0]]), 2, 800),
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 600),
    ],
    ids=["m2-1d", "m3-2d"],
)
def test_the_compiled_sweep_alone_keeps_the_exact_posterior(points: torch.Tensor, m: int, draws: int) -> None:
    # gibbs_prob = 1: every transition is a compiled single-site sweep; tolerances: see test_split_merge.Z_MAX
    fg = gmm_graph(points, m, SIGMA, TAU, 0.5)
    kernel = SplitMergeGMM(fg, gibbs_prob=1.0)
    terms = _posterior_terms(points, m, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), draws)
    assert kernel.single_site.mixture_sites is not None
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means
