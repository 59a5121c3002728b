"""The fused gmm_pair path: its energy equals the graph's, it makes the general path's decisions, and its
speculative per-chain batches keep the exact open-universe GMM posterior."""

from __future__ import annotations

from typing import Any

import pyro
import pytest
import torch
from test_split_merge import SIGMA, TAU, Z_MAX, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import GmmPairMotif, gmm_graph, gmm_initial_state, prior_proposal, sample_gmm
from motifs.gmm_pair_set import GmmPairSetMotif
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.kernels import fused_mixture
from neuralblock.kernels.fused_mixture import (
    FusedMixtureSweep,
    _energy_change,
    mixture_layout,
    mixture_pair_step,
    pair_context,
    pair_rounds,
    supports_fused_mixture,
)
from neuralblock.proposals import NeuralBlockProposal


def _graph(m: int = 5, n: int = 30, seed: int = 0):
    points, _, _ = sample_gmm(m, n, torch.Generator().manual_seed(seed))
    return gmm_graph(points, m, 1.3, 4.0, 0.4, prior_mean=torch.tensor([0.5, -1.0]))


def _proposal(dim: int = 2, motif: str = "gmm_pair") -> NeuralBlockProposal:
    torch.manual_seed(0)
    chosen = GmmPairMotif(dim=dim) if motif == "gmm_pair" else GmmPairSetMotif(dim=dim, hidden=8, heads=2)
    return NeuralBlockProposal(chosen, components=3, hidden=(16,))  # untrained: any q is valid


@pytest.mark.parametrize(("p_active", "dtype"), [(0.4, torch.float32), (0.4, torch.float64), (1 - 1e-7, torch.float64)])
def test_the_fused_energy_is_the_graphs(p_active: float, dtype: torch.dtype) -> None:
    # p near 1: the bits' prior is read from the tables, not from p's float32 log-odds
    points, _, _ = sample_gmm(5, 30, torch.Generator().manual_seed(0))
    fg, motif = gmm_graph(points, 5, 1.3, 4.0, p_active, prior_mean=torch.tensor([0.5, -1.0])), GmmPairMotif()
    instances = motif.find_instances(fg)
    layout = mixture_layout(fg, motif, instances)
    chains, pairs, dim = 3, len(instances), 2
    gen = torch.Generator().manual_seed(1)
    state = torch.stack([gmm_initial_state(fg, gen) for _ in range(chains)]).to(dtype)
    slots = torch.arange(pairs).expand(chains, pairs)
    block_ids = layout.block_ids[slots]
    current = state.gather(1, block_ids.reshape(chains, -1)).reshape(block_ids.shape)
    proposed = current.clone()
    for lo in (0, dim + 1):
        proposed[..., lo : lo + dim] = 3.0 * torch.randn(chains, pairs, dim, generator=gen)
        proposed[..., lo + dim] = torch.randint(0, 2, (chains, pairs), generator=gen).to(proposed.dtype)
    context = pair_context(state, layout, slots)
    log_odds = layout.log_odds.to(state.dtype)[layout.pairs[slots]]
    fused = _energy_change(
        context.rest_lse, context.v_others.sum(-1), log_odds, layout, current, proposed, layout.points(state.dtype)
    )
    scaffold = fg.scaffold(instances.blocks)
    for p in range(pairs):
        pair = torch.stack([state, state.clone()])
        pair[1][:, instances.blocks[p]] = proposed[:, p]
        local = scaffold.select(p, p + 1).local_log_density(fg, pair).reshape(2, chains)
        want = local[1] - local[0]
        both_impossible = torch.isinf(want) & torch.isinf(fused[:, p])
        assert torch.equal(torch.isinf(want), torch.isinf(fused[:, p]))
        tolerance = 1e-3 if dtype == torch.float32 else 1e-8
        assert torch.allclose(fused[:, p][~both_impossible], want[~both_impossible], rtol=1e-6, atol=tolerance)


@pytest.mark.parametrize(("tempered", "motif"), [(False, "gmm_pair"), (True, "gmm_pair"), (False, "gmm_pair_set")])
def test_one_pair_at_a_time_makes_the_general_paths_decisions(tempered: bool, motif: str) -> None:
    fg, proposal = _graph(m=4, n=20, seed=2), _proposal(motif=motif)
    start = torch.stack([gmm_initial_state(fg, torch.Generator().manual_seed(s)) for s in range(3)])
    finals = []
    for fused in (True, False):
        kernel = NeuralBlockKernel(fg, [proposal], gibbs_prob=0.0, chains=3, window=1, fused=fused, cover=False)
        kernel.initial_params = {"x": start.clone()}
        kernel.setup(0)
        assert isinstance(kernel.fused[0], FusedMixtureSweep) == fused
        if fused:
            kernel.fused[0].jit = False  # the eager steps (the compiled sweep draws its numbers per sweep)
        if tempered:
            kernel.beta = torch.tensor([1.0, 0.5, 0.2])
        pyro.set_rng_seed(7)
        params = kernel.initial_params
        for _ in range(15):
            params = kernel.sample(params)
        finals.append(params["x"])
        accepted = kernel.diagnostics()["acceptance_by_proposal"][motif]
        assert 0.0 < accepted < 1.0
    # the same draws and decisions; values agree to rounding (the general path whitens with a matrix product)
    assert torch.allclose(finals[0], finals[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("motif", "gibbs_prob"), [("gmm_pair", 0.3), ("gmm_pair_set", 0.0), ("gmm_pair_set", 0.3)])
def test_speculative_batches_of_chains_keep_the_exact_posterior(
    motif: str, gibbs_prob: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 chains in one kernel, up to 3 pairs per chain and step: chains accept at different pairs, so
    # they advance through the sweep at different speeds. Tolerances: see test_split_merge.Z_MAX.
    # gmm_pair_set proposes from the GMM prior (its head starts with (log(tau / sigma), logit p) like
    # gmm_pair's), with and without single-site Gibbs moves: pair moves alone keep the posterior too.
    # (The eager steps: gmm_pair_set's compiled sweep is tested in test_jit_mixture.)
    monkeypatch.setattr(fused_mixture, "NUMBA", False)
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 3, SIGMA, TAU, 0.5)
    proposal = _proposal() if motif == "gmm_pair" else prior_proposal(GmmPairSetMotif())
    kernel = NeuralBlockKernel(fg, [proposal], gibbs_prob=gibbs_prob, chains=4, window=3, cover=False)
    terms = _posterior_terms(points, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    assert isinstance(kernel.fused[0], FusedMixtureSweep)
    assert kernel.diagnostics()["acceptance_by_proposal"][motif] > 0.02
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_the_shipped_copies_proposal_keeps_the_exact_posterior_with_pair_moves_alone() -> None:
    # the trained network end to end on the fused path (its features, set encoder, dtype), no Gibbs moves,
    # every pair per sweep (test_cover_sweeps_keep_the_exact_posterior: one round per sweep):
    # measured acceptance 0.48 and |z| <= 1.75 at seed 0; tolerances: see test_split_merge.Z_MAX
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 3, SIGMA, TAU, 0.5)
    torch.manual_seed(0)
    kernel = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=0.0, chains=4, cover=False)
    terms = _posterior_terms(points, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    assert isinstance(kernel.fused[0], FusedMixtureSweep)
    assert kernel.diagnostics()["acceptance_by_proposal"]["gmm_pair_set"] > 0.1
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_graphs_the_fused_energy_would_not_match_take_the_general_path() -> None:
    motif = GmmPairMotif()
    fg = _graph()
    assert supports_fused_mixture(fg, motif, motif.find_instances(fg))
    fg.add_linear_gaussian(fg.variable_id("mu[1,0]"), [], [], 0.5, 4.0)  # the same prior twice: the motif allows it
    assert not supports_fused_mixture(fg, motif, motif.find_instances(fg))
    kernel = NeuralBlockKernel(fg, [_proposal()], gibbs_prob=0.0)
    kernel.initial_params = {"x": gmm_initial_state(fg)}
    kernel.setup(0)
    assert kernel.fused == [None]
    assert not supports_fused_mixture(_graph(), GmmPairMotif(dim=1), GmmPairMotif(dim=1).find_instances(_graph()))


def test_width_follows_the_acceptance_rate_and_the_window() -> None:
    fg, proposal = _graph(m=12), _proposal()  # 66 pairs
    sweep = FusedMixtureSweep(fg, proposal, proposal.motif.find_instances(fg))
    sweep.rate = 1.0
    assert sweep._width(4) == 1
    sweep.rate = 0.01
    assert sweep._width(1) > sweep._width(16) > 1  # more chains: each pair costs more of a step
    assert FusedMixtureSweep(fg, proposal, proposal.motif.find_instances(fg), window=4)._width(8) == 4


def test_pairs_proposed_after_an_accept_are_counted_as_discarded() -> None:
    points, _, _ = sample_gmm(5, 30, torch.Generator().manual_seed(3))
    NeuralBlockKernel(gmm_graph(points, 5, 1.0, 4.0, 1 - 1e-9), [_proposal()]).setup(0)  # p rounds to 1 in float32
    fg = gmm_graph(points, 5, 1.0, 4.0, 0.5)
    kernel = NeuralBlockKernel(fg, [_proposal()], gibbs_prob=0.0, chains=3, window=4, cover=False)
    kernel.initial_params = {
        "x": torch.stack([gmm_initial_state(fg, torch.Generator().manual_seed(s)) for s in range(3)])
    }
    kernel.setup(0)
    pyro.set_rng_seed(0)
    params = kernel.initial_params
    for _ in range(5):
        params = kernel.sample(params)
    report = kernel.diagnostics()
    assert report["acceptance_by_proposal"]["gmm_pair"] > 0.05  # some accepts, so some pairs were re-proposed
    assert report["discarded_proposals"] > 0


def test_tempered_chains_that_finish_their_sweep_early_keep_their_own_temperature() -> None:
    # window 3: chains accept at different pairs, so some finish a sweep early and the rest step without them
    fg = _graph(m=5, n=20, seed=4)
    kernel = NeuralBlockKernel(fg, [_proposal()], gibbs_prob=0.0, chains=3, window=3, cover=False)
    kernel.initial_params = {
        "x": torch.stack([gmm_initial_state(fg, torch.Generator().manual_seed(s)) for s in range(3)])
    }
    kernel.setup(0)
    kernel.beta = torch.tensor([1.0, 0.3, 0.0])  # beta = 0: the energy is ignored, every pair move follows q alone
    pyro.set_rng_seed(1)
    params = kernel.initial_params
    for _ in range(6):
        params = kernel.sample(params)
    per_chain = kernel._accepted_per_chain[0]
    assert torch.isfinite(params["x"]).all()
    assert per_chain[2] > per_chain[0]  # the untempered chain accepts least, the beta = 0 one most


def test_moves_of_inactive_pairs_do_not_end_a_step_and_keep_the_exact_posterior(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 5 mixtures for 3 points: most pairs are two inactive mixtures, whose accepted moves (new means, both
    # still off) let the step go on to later pairs that share no mixture with them. Tolerances: Z_MAX.
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 5, SIGMA, TAU, 0.3)
    proposal = prior_proposal(GmmPairSetMotif())
    layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
    chains = 32
    state = gmm_initial_state(fg, torch.Generator().manual_seed(0)).expand(chains, -1).clone()
    state[:, layout.active_ids] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    assert layout.pairs[:2].tolist() == [[1, 4], [2, 3]]  # round-robin order: disjoint pairs first
    slots = torch.arange(10).expand(chains, 10)
    torch.manual_seed(0)
    step = mixture_pair_step(state, proposal, layout, slots, torch.ones(chains, 10, dtype=torch.bool))
    # each chain: both first pairs stay off with probability 0.49 each (the prior proposal, p = 0.3), and
    # such a move is always accepted, so about a quarter of the chains make two moves in the step
    assert int(step.accepted.max()) > 1
    assert torch.equal(step.consumed >= step.accepted, torch.ones(chains, dtype=torch.bool))
    monkeypatch.setattr(fused_mixture, "NUMBA", False)  # the eager steps in the kernel too
    kernel = NeuralBlockKernel(fg, [proposal], gibbs_prob=0.0, chains=4, window=6, cover=False)  # every pair per sweep
    terms = _posterior_terms(points, 5, SIGMA, TAU, 0.3)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


@pytest.mark.parametrize("m", [2, 3, 4, 7, 12])
def test_pair_rounds_hold_every_pair_once_and_each_mixture_once_per_round(m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    pairs = torch.combinations(torch.arange(m), 2)
    pairs = pairs[torch.randperm(len(pairs), generator=gen)]  # any instance order, either mixture first
    pairs = torch.where(torch.rand(len(pairs), 1, generator=gen) < 0.5, pairs, pairs.flip(1))
    rounds = pair_rounds(pairs)
    assert rounds is not None and len(rounds) == m - 1 + m % 2
    assert sorted(torch.cat(rounds).tolist()) == list(range(len(pairs)))
    for members in rounds:
        mixtures = pairs[members].reshape(-1)
        assert len(members) == m // 2 and len(mixtures.unique()) == len(mixtures)


def test_pair_rounds_refuse_sets_that_are_not_every_pair_once() -> None:
    assert pair_rounds(torch.tensor([[0, 1], [0, 2]])) is None  # (1, 2) missing
    assert pair_rounds(torch.tensor([[0, 1], [1, 0], [0, 2], [1, 2]])) is None  # (0, 1) twice
    assert pair_rounds(torch.tensor([[0, 1], [0, 2], [1, 1]])) is None  # a mixture paired with itself
    assert pair_rounds(torch.zeros(0, 2, dtype=torch.long)) is None


@pytest.mark.parametrize("compiled", [True, False])
def test_each_neural_sweep_decides_the_next_round_of_disjoint_pairs(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiled:
        monkeypatch.setattr(fused_mixture, "NUMBA", False)
    fg = _graph(m=6, n=20, seed=5)
    kernel = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=0.0, chains=3)  # default: rounds
    kernel.initial_params = {
        "x": torch.stack([gmm_initial_state(fg, torch.Generator().manual_seed(s)) for s in range(3)])
    }
    kernel.setup(0)
    sweep = kernel.fused[0]
    assert isinstance(sweep, FusedMixtureSweep) and sweep._compiled_for(kernel.initial_params["x"]) == compiled
    assert len(kernel.cover_classes[0]) == 5  # 15 pairs of 6 mixtures in 5 rounds of 3
    spans = [(int(sweep.offsets[a]), int(sweep.offsets[b])) for a, b in kernel.cover_classes[0]]
    rounds = [sweep.layout.pairs[a:b] for a, b in spans]
    assert all(len(r) == 3 and len(r.unique()) == 6 for r in rounds)
    assert len(torch.cat(rounds).sort(1).values.unique(dim=0)) == 15
    decided: list[tuple[int, set[int]]] = []  # (transition, pair rows handed to the sweep's steps)

    def recorded(step: Any, slot_of: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            slots, valid = slot_of(args)
            rows = {int(p) for p in torch.as_tensor(slots)[torch.as_tensor(valid)].reshape(-1)}
            if decided and decided[-1][0] == kernel._transitions:
                decided[-1][1].update(rows)
            else:
                decided.append((kernel._transitions, rows))
            return step(*args, **kwargs)

        return run

    monkeypatch.setattr(
        fused_mixture, "mixture_pair_sweep", recorded(fused_mixture.mixture_pair_sweep, lambda a: a[1:3])
    )
    monkeypatch.setattr(fused_mixture, "mixture_pair_step", recorded(fused_mixture.mixture_pair_step, lambda a: a[3:5]))
    pyro.set_rng_seed(0)
    params = kernel.initial_params
    for _ in range(7):
        params = kernel.sample(params)
    assert [t for t, _ in decided] == list(range(7))
    for t, rows in decided:  # the rounds in turn, each round's pairs once
        a, b = spans[t % 5]
        assert rows == set(range(a, b))
    screened = kernel.fused[0].screened  # the compiled sweep's screen skips far active pairs (none on eager steps)
    assert kernel._proposed[0] + screened == 7 * 3 * 3  # 7 sweeps of one round each (3 pairs) in 3 chains
    assert kernel._proposed_per_chain[0].sum() == kernel._proposed[0]  # each chain's own attempts


def test_the_default_takes_rounds_on_the_mixture_path_only() -> None:
    fg = _graph(m=6, n=20, seed=5)
    for fused, covers in ((True, 5), (False, 1)):  # the general path: every pair per sweep
        kernel = NeuralBlockKernel(fg, [_proposal()], gibbs_prob=0.0, fused=fused)
        kernel.initial_params = {"x": gmm_initial_state(fg)}
        kernel.setup(0)
        assert isinstance(kernel.fused[0], FusedMixtureSweep) == fused and len(kernel.cover_classes[0]) == covers
    kernel = NeuralBlockKernel(fg, [_proposal()], gibbs_prob=0.0, cover=False)
    kernel.initial_params = {"x": gmm_initial_state(fg)}
    kernel.setup(0)
    assert len(kernel.cover_classes[0]) == 1
    with pytest.raises(TypeError, match="cover must be"):
        NeuralBlockKernel(fg, [_proposal()], cover="rounds")


@pytest.mark.parametrize(("compiled", "gibbs_prob"), [(True, 0.0), (True, 0.3), (False, 0.0)])
def test_cover_sweeps_keep_the_exact_posterior(
    compiled: bool, gibbs_prob: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 mixtures, 3 rounds of 2 disjoint pairs, one round per neural sweep, in turn; the shipped network (compiled
    # sweep, with and without single-site moves) and the eager steps. 15 patterns and 4 moments per test at
    # |z| < Z_MAX: a false-failure rate below 5e-5 per test (see test_split_merge.Z_MAX).
    if not compiled:
        monkeypatch.setattr(fused_mixture, "NUMBA", False)
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 4, SIGMA, TAU, 0.5)
    torch.manual_seed(0)
    kernel = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], gibbs_prob=gibbs_prob, chains=4, cover=True)
    terms = _posterior_terms(points, 4, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    assert len(kernel.cover_classes[0]) == 3
    assert kernel.diagnostics()["acceptance_by_proposal"]["gmm_pair_set"] > 0.05
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means
