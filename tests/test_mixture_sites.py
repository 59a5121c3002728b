"""The compiled single-site sweep of open-universe GMMs: the graph's conditionals, the exact posterior, fallbacks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_split_merge import SIGMA, TAU, Z_MAX, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import gmm_graph, gmm_initial_state
from neuralblock.graph import FactorGraph
from neuralblock.kernels.mixture_sites import MixtureSites, SiteRandoms, draw_site_randoms
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import SplitMergeGMM


def _em_gaussian(sites: MixtureSites, x: torch.Tensor, mixture: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The informed move's Gaussian (whitened ``center``, ``precision``) at the state ``x``: one EM step."""
    points = torch.from_numpy(sites.points)
    active = x[torch.as_tensor(sites.active_ids)] > 0
    means = x[torch.as_tensor(sites.mean_ids)] / sites.sigma
    terms = -0.5 * ((points[:, None, :] - means[None]) ** 2).sum(-1)
    weights = torch.softmax(terms.masked_fill(~active, -math.inf), -1)[:, mixture]
    prior_precision = torch.from_numpy((sites.sigma / sites.prior_scale[mixture]) ** 2)
    precision = prior_precision + weights.sum()
    center = (prior_precision * torch.from_numpy(sites.prior_loc[mixture]) / sites.sigma + weights @ points) / precision
    return center, precision


def _log_normal(x: torch.Tensor, center: torch.Tensor, precision: torch.Tensor) -> float:
    return float(torch.distributions.Normal(center, precision.rsqrt()).log_prob(x).sum())


def _reference_sweep(
    fg: FactorGraph, sites: MixtureSites, state: torch.Tensor, steps: torch.Tensor, draws: SiteRandoms
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sweep's updates from the graph's own log joint, mixture by mixture, with the same numbers.

    Proposed means are rounded to the state's dtype (as the state stores them); returns the states and the
    acceptance probabilities ``[K, m D]`` of the random walk and ``[K, m]`` of the informed moves (NaN: none).
    """
    dtype = state.dtype
    state = state.double().clone()
    m, dim = sites.mean_ids.shape
    steps = steps.double().reshape(m, dim)
    accept_prob = torch.zeros(state.shape[0], m * dim, dtype=torch.float64)
    informed_prob = torch.full((state.shape[0], m), math.nan, dtype=torch.float64)
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
                moved[var] = (x[var] + steps[mixture, d] * draws.noise[k, mixture, d]).to(dtype).double()
                ratio = float(fg.log_joint(moved, check=False) - fg.log_joint(x, check=False))
                accept_prob[k, mixture * dim + d] = min(1.0, math.exp(min(ratio, 0.0)))
                if float(draws.log_u[k, mixture, d]) < ratio:
                    x[var] = moved[var]
            if not (sites.informed and x[bit] > 0):
                continue
            ids = torch.as_tensor(sites.mean_ids[mixture])
            center, precision = _em_gaussian(sites, x, mixture)
            moved = x.clone()
            moved[ids] = (
                ((center + draws.informed_noise[k, mixture] * precision.rsqrt()) * sites.sigma).to(dtype).double()
            )
            back_center, back_precision = _em_gaussian(sites, moved, mixture)
            ratio = float(fg.log_joint(moved, check=False) - fg.log_joint(x, check=False))
            ratio += _log_normal(x[ids] / sites.sigma, back_center, back_precision)
            ratio -= _log_normal(moved[ids] / sites.sigma, center, precision)
            informed_prob[k, mixture] = min(1.0, math.exp(min(ratio, 0.0)))
            if float(draws.informed_log_u[k, mixture]) < ratio:
                x[ids] = moved[ids]
    return state.to(dtype), accept_prob, informed_prob


@pytest.mark.parametrize(("dim", "dtype"), [(1, torch.float64), (2, torch.float64), (2, torch.float32)])
def test_the_updates_are_the_graphs_conditionals(dim: int, dtype: torch.dtype) -> None:
    # the same random numbers through the compiled sweep and through the graph's log joint give the same states
    gen = torch.Generator().manual_seed(dim)
    points = torch.randn(40, dim, generator=gen) * 3.0
    fg = gmm_graph(points, 5, 1.3, 4.0, 0.4, prior_mean=torch.full((dim,), 0.5))
    sites = MixtureSites.of(fg)
    assert sites is not None
    state = torch.stack([gmm_initial_state(fg, gen) for _ in range(3)]).to(dtype)
    state[0, torch.as_tensor(sites.active_ids)] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], dtype=dtype)  # one active
    steps = torch.rand(5 * dim, generator=gen, dtype=torch.float64) + 0.3
    moved = informed = partial = 0
    for sweep in range(4):
        torch.manual_seed(sweep)
        draws = draw_site_randoms(3, 5, dim)
        want, want_prob, want_informed = _reference_sweep(fg, sites, state, steps, draws)
        got, accept_prob, informed_prob = sites.sweep(state, steps, draws)
        assert got.dtype == dtype and torch.allclose(got.double(), want.double(), atol=1e-9), (got - want).abs().max()
        tolerance = 1e-6 if dtype == torch.float32 else 1e-9
        assert torch.allclose(accept_prob, want_prob, atol=tolerance)
        assert torch.allclose(informed_prob, want_informed, atol=tolerance, equal_nan=True)
        moved += int((got != state).sum())
        informed += int((~informed_prob.isnan()).sum())
        partial += int(((informed_prob > 0.0) & (informed_prob < 1.0)).sum())  # a wrong Hastings term shows there
        state = got
    assert moved > 20 and informed > 10 and partial > 3  # bits flipped, means moved, informed moves made


def test_batch_shapes_and_bad_inputs() -> None:
    fg = gmm_graph(torch.tensor([[0.0, 1.0], [3.0, 3.0]]), 3, 1.0, 2.0, 0.5)
    sites = MixtureSites.of(fg)
    assert sites is not None
    one = gmm_initial_state(fg, torch.Generator().manual_seed(0))
    new, accept_prob, informed_prob = sites.sweep(one, torch.full((6,), 0.5))
    assert new.shape == one.shape and new.dtype == torch.float32 and accept_prob.shape == (6,)
    assert informed_prob.shape == (3,)
    grid = one.expand(2, 3, -1).clone()
    new, accept_prob, informed_prob = sites.sweep(grid, torch.full((6,), 0.5))
    assert new.shape == grid.shape and accept_prob.shape == (2, 3, 6) and informed_prob.shape == (2, 3, 3)
    assert bool((new[..., torch.as_tensor(sites.active_ids)].sum(-1) >= 1).all())  # the points keep an active mixture
    with pytest.raises(ValueError, match="steps must have shape"):
        sites.sweep(one, torch.full((5,), 0.5))
    with pytest.raises(ValueError, match="draws must be"):
        sites.sweep(grid, torch.full((6,), 0.5), draw_site_randoms(5, 3, 2))


def _gmm() -> FactorGraph:
    return gmm_graph(torch.tensor([[0.0], [1.0]]), 2, 1.0, 2.0, 0.5)


def test_other_graphs_take_the_general_path() -> None:
    assert MixtureSites.of(_gmm()) is not None and SingleSiteSweep(_gmm()).mixture_sites is not None
    coupled = _gmm()  # a factor between the bits
    coupled.add_table_factor([int(coupled.variable_id("v[0]")), int(coupled.variable_id("v[1]"))], torch.zeros(2, 2))
    second_prior = _gmm()  # a second prior on a mean
    second_prior.add_linear_gaussian(int(second_prior.variable_id("mu[0,0]")), [], [], 0.0, 1.0)
    parent = _gmm()  # a factor linking two means
    first, second = int(parent.variable_id("mu[0,0]")), int(parent.variable_id("mu[1,0]"))
    parent.add_linear_gaussian(second, [first], [1.0], 0.0, 1.0)
    observed = _gmm()  # an observed bit
    observed.set_evidence({**observed.evidence, int(observed.variable_id("v[0]")): 1.0})
    fixed = gmm_graph(torch.tensor([[0.0], [1.0]]), 2, 1.0, 2.0, 0.5)
    fixed.groups[0].log_tables[0, 1] = -math.inf  # a bit its prior keeps off
    plain = FactorGraph()
    x = plain.add_variable("x")
    plain.add_linear_gaussian(x, [], [], 0.0, 1.0)
    for fg in (coupled, second_prior, parent, observed, fixed, plain):
        assert MixtureSites.of(fg) is None
    assert SingleSiteSweep(plain).mixture_sites is None


def test_the_steps_of_each_coordinate_adapt_through_the_compiled_sweep() -> None:
    fg = gmm_graph(torch.randn(30, 2, generator=torch.Generator().manual_seed(1)), 4, 1.0, 3.0, 0.5)
    sweep = SingleSiteSweep(fg, step_size=20.0, copy_moves=False, label_steps=0)  # far too large: must shrink
    sites, plan = sweep.mixture_sites, sweep.rw_plan
    assert sites is not None and plan is not None
    plan.adapter.log_step = torch.linspace(-1.0, 1.0, 8)  # a step of its own per coordinate
    state = torch.stack([gmm_initial_state(fg) for _ in range(4)]).double()
    position = {v: i for i, v in enumerate(plan.variables)}
    steps = plan.adapter.step_size[[position[int(v)] for v in sites.mean_ids.reshape(-1)]]
    torch.manual_seed(3)
    want, _, _ = _reference_sweep(fg, sites, state, steps, draw_site_randoms(4, 4, 2))
    torch.manual_seed(3)
    assert torch.allclose(sweep.sweep(fg, state, adapt=False), want, atol=1e-9)  # each coordinate its own step
    plan.adapter.log_step = torch.full((8,), math.log(20.0))
    before = plan.adapter.step_size.clone()
    for _ in range(30):
        state = sweep.sweep(fg, state, adapt=True)
    assert bool((plan.adapter.step_size < before).all()) and bool((plan.adapter.count == 30).all())
    frozen = plan.adapter.step_size.clone()
    sweep.sweep(fg, state, adapt=False)
    assert torch.equal(plan.adapter.step_size, frozen)
    assert sweep.compile_seconds > 0


@pytest.mark.parametrize(
    ("compiled", "copy_moves", "informed"),
    [(True, False, True), (True, False, False), (False, False, False), (True, True, True)],
    ids=["compiled", "walk", "general", "copies"],
)
@pytest.mark.parametrize(
    ("points", "m", "draws"),
    [
        (torch.tensor([[-1.5], [-1.0], [2.0]]), 2, 800),
        (torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]]), 3, 600),
    ],
    ids=["m2-1d", "m3-2d"],
)
def test_single_site_sweeps_alone_keep_the_exact_posterior(
    points: torch.Tensor,
    m: int,
    draws: int,
    compiled: bool,
    copy_moves: bool,
    informed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gibbs_prob = 1: every transition is a single-site sweep, compiled (with and without the informed mean
    # moves) or on the general path, without the copy-set moves; then the compiled sweep with them (the
    # default); tolerances: see test_split_merge.Z_MAX. The general path runs the 4 chains as one batched state.
    if not compiled:
        monkeypatch.setattr(MixtureSites, "of", classmethod(lambda cls, fg, informed=True: None))
    fg = gmm_graph(points, m, SIGMA, TAU, 0.5)
    chains = 1 if compiled else 4
    kernel = SplitMergeGMM(fg, gibbs_prob=1.0, copy_moves=copy_moves, informed_means=informed, chains=chains)
    terms = _posterior_terms(points, m, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), draws)
    assert (kernel.single_site.mixture_sites is not None) == compiled
    assert (kernel.single_site.copy_moves is not None) == copy_moves
    assert ("informed_mean_acceptance" in kernel.diagnostics()) == informed
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_refresh_reads_new_values_of_the_same_structure() -> None:
    points = torch.tensor([[0.0, 1.0], [3.0, 3.0], [-1.0, 2.0]])
    sites = MixtureSites.of(gmm_graph(points, 3, 1.0, 2.0, 0.5))
    other = gmm_graph(points, 3, 1.7, 3.0, 0.3, prior_mean=torch.tensor([0.5, -0.5]))
    fresh = MixtureSites.of(other)
    assert sites is not None and fresh is not None and sites.refresh(other)
    for name in ("points", "prior_loc", "prior_scale", "log_odds"):
        assert np.array_equal(getattr(sites, name), getattr(fresh, name)), name
    assert sites.sigma == 1.7
    sweep = SingleSiteSweep(other)
    fixed = gmm_graph(points, 3, 1.0, 2.0, 0.5)
    fixed.groups[0].log_tables[0, 1] = -math.inf  # new values the compiled sweep does not cover
    sweep.refresh(fixed)
    assert sweep.mixture_sites is None
