"""The compiled gmm_pair_set sweep: the eager step's arithmetic, its own bookkeeping, and the exact posterior."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_split_merge import SIGMA, TAU, Z_MAX, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import GmmPairMotif, gmm_graph, gmm_initial_state, sample_gmm
from motifs.gmm_pair_set import GmmPairSetMotif
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.kernels.fused_mixture import (
    FusedMixtureSweep,
    _energy_change,
    mixture_layout,
    pair_context,
    step_constants,
)
from neuralblock.kernels.jit_mixture import (
    CandidateOptions,
    MixtureNetwork,
    PairDraws,
    PairScreen,
    PointSums,
    TokenCache,
    _add_candidate,
    _current_energy,
    _exp32,
    _log_q_candidates,
    _log_sum_over,
    _mirror_candidate,
    _pair_energy,
    _point_sums,
    _rest_log_sum,
    _silu,
    _split_starts,
    _token_outputs,
    draw_pairs,
    mixture_pair_sweep,
    pair_candidates,
)
from neuralblock.proposals import NeuralBlockProposal


def _set_proposal(hidden: tuple[int, ...], seed: int = 0) -> NeuralBlockProposal:
    torch.manual_seed(seed)
    return NeuralBlockProposal(GmmPairSetMotif(hidden=8, heads=2), components=3, hidden=hidden)


def _case(m: int = 6, n: int = 25, chains: int = 3, seed: int = 0):
    points, _, _ = sample_gmm(m, n, torch.Generator().manual_seed(seed))
    fg = gmm_graph(points, m, 1.3, 4.0, 0.4, prior_mean=torch.tensor([0.5, -1.0]))
    gen = torch.Generator().manual_seed(seed + 1)
    state = torch.stack([gmm_initial_state(fg, gen) for _ in range(chains)])
    return fg, state


def _every_pair(proposal: NeuralBlockProposal, m: int, n: int, chains: int, seed: int):
    """A case's graph, states, layout, compiled network and every pair of every chain in order (``[K, P]`` slots)."""
    fg, state = _case(m=m, n=n, chains=chains, seed=seed)
    layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
    net = MixtureNetwork.from_proposal(proposal)
    assert net is not None
    slots = np.ascontiguousarray(np.broadcast_to(np.arange(len(layout.pairs)), (chains, len(layout.pairs))))
    return fg, state, layout, net, slots


def _eager_moves(proposal, fg, state, slots, beta):
    """The eager step's proposed blocks and log ratios of ``slots`` at ``state`` (its draws, from the global RNG)."""
    instances = proposal.motif.find_instances(fg)
    layout = mixture_layout(fg, proposal.motif, instances)
    constants = step_constants(layout, state.dtype)
    chains, width = slots.shape
    with torch.no_grad():
        context = pair_context(state, layout, slots, constants)
        points = constants.points
        features = proposal.motif.features(
            points.expand(chains, width, *points.shape), constants.point_mask, context.u_others,
            context.v_others, constants.psi, context.rest_lse,
        )  # fmt: skip
        q = proposal(features.to(proposal.dtype))
        block_ids = layout.block_ids[slots]
        current = state.gather(1, block_ids.reshape(chains, -1)).reshape(block_ids.shape)
        u_new = q.sample().to(state.dtype)
        proposed = constants.loc + constants.scale * u_new
        log_q = q.log_prob(torch.stack([u_new, (current - constants.loc) / constants.scale])).to(state.dtype)
        log_odds = constants.log_odds[layout.pairs[slots]]
        change = _energy_change(context.rest_lse, context.v_others.sum(-1), log_odds, layout, current, proposed, points)
    return layout, proposed, change * beta[:, None].to(state.dtype) + log_q[1] - log_q[0]


@pytest.mark.parametrize("hidden", [(), (16,), (8, 8), "gmm_pair_copies", "gmm_pair_copies16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_moves_are_the_eager_steps(hidden, dtype: torch.dtype) -> None:
    # the same draws (the proposal's three, in the eager sample's order) give the same blocks and log ratios
    proposal = load_pretrained(hidden) if isinstance(hidden, str) else _set_proposal(hidden)
    fg, state = _case()
    state = state.to(dtype)
    slots = torch.randint(0, 15, (3, 7), generator=torch.Generator().manual_seed(2))
    beta = torch.tensor([1.0, 0.4, 0.0], dtype=torch.float64)
    torch.manual_seed(5)
    layout, proposed, log_alpha = _eager_moves(proposal, fg, state, slots, beta)
    net = MixtureNetwork.from_proposal(proposal)
    assert net is not None
    torch.manual_seed(5)
    draws = PairDraws(
        torch.rand(3, 7, net.components), torch.rand(3, 7, 2, 2), torch.randn(3, 7, 4), torch.zeros(3, 7).double()
    )
    before = state.clone()
    valid = np.ones((3, 7), dtype=np.bool_)
    _, _, got_alpha, got_blocks = mixture_pair_sweep(
        state.numpy(), slots.numpy(), valid, layout, net, draws, beta.numpy(), decide=False
    )
    assert torch.equal(state, before)  # scoring writes nothing
    tolerance = 2e-3 if dtype == torch.float32 else 2e-4  # the network's float32, summed in another order
    assert np.allclose(got_blocks, proposed.double().numpy(), atol=tolerance, rtol=1e-4)
    want = log_alpha.double().numpy()
    assert np.array_equal(np.isinf(got_alpha), np.isinf(want))
    finite = np.isfinite(want)
    assert np.allclose(got_alpha[finite], want[finite], atol=tolerance * 10, rtol=1e-4)
    assert finite.sum() > 10


def test_the_float32_silu_is_within_rounding_of_the_exact_one() -> None:
    x = np.concatenate([np.linspace(-90.0, 90.0, 200_001), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    exact = x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))
    got = x.copy()
    _silu(got, np.empty_like(got), np.empty(len(got), dtype=np.int32))
    error = np.abs(got - exact)
    assert np.all((error <= 3e-7 * np.abs(exact)) | (error < 1e-32)), float((error / np.abs(exact)).max())
    special = np.array([np.nan, np.inf, -np.inf, 100.0, -100.0, -1000.0], dtype=np.float32)
    _silu(special, np.empty(6, np.float32), np.empty(6, np.int32))  # (beyond the exp's clamps at +-80)
    assert np.isnan(special[0]) and special[1] == np.inf and special[2] == -np.inf and special[3] == 100.0
    assert -100.0 * 1.9e-35 < special[4] < 0.0 and -1000.0 * 1.9e-35 < special[5] < 0.0


@pytest.mark.parametrize("name", ["gmm_pair_copies", "gmm_pair_copies16"])
def test_token_outputs_are_a_pure_function_of_each_token(name: str) -> None:
    # the cache reuses a token's outputs bitwise: a token's outputs must not depend on the block it came in
    net = MixtureNetwork.from_proposal(load_pretrained(name))
    assert net is not None
    rng = np.random.default_rng(0)
    n, hidden, heads = 300, net.phi2_b.shape[0], net.score_b.shape[0]
    dim = net.phi1_w.shape[0] - 3
    points = rng.normal(size=(n, dim)).astype(np.float32)
    tokens = np.concatenate([points, rng.uniform(-1, 0, (n, 1)), rng.uniform(0, 1, (n, 1)), np.ones((n, 1))], 1)
    tokens = tokens.astype(np.float32)
    base = (points @ net.phi1_w[:dim] + net.phi1_w[dim + 2] + net.phi1_b).astype(np.float32)
    order = rng.permutation(n)  # 300 tokens in three blocks, in a shuffled order, into slot 5 of each point

    def outputs(points_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        phi, scores = np.zeros((n, 8, hidden), np.float32), np.zeros((n, 8, heads), np.float32)
        scratch = [np.zeros((hidden, 128), np.float32), np.zeros((hidden, 128), np.float32)]
        scratch += [np.zeros((heads, 128), np.float32), np.empty(hidden * 128, np.float32)]
        slots = np.full(len(points_of), 5)
        _token_outputs(
            points_of, slots, len(points_of), tokens, base, net.phi1_w, net.phi2_w, net.phi2_b, net.score_w,
            net.score_b, phi, scores, *scratch, np.empty(hidden * 128, np.int32),
        )  # fmt: skip
        return phi[:, 5], scores[:, 5]

    together = outputs(order)
    alone = [outputs(np.array([j])) for j in (0, 17, 299)]
    for j, (phi, scores) in zip((0, 17, 299), alone, strict=True):
        assert np.array_equal(phi[j], together[0][j]) and np.array_equal(scores[j], together[1][j])
    silu = torch.nn.functional.silu
    weights = [torch.from_numpy(w).double() for w in (net.phi1_w, net.phi1_b, net.phi2_w, net.phi2_b)]
    phi = silu(silu(torch.from_numpy(tokens).double() @ weights[0] + weights[1]) @ weights[2] + weights[3])
    scores = phi @ torch.from_numpy(net.score_w).double() + torch.from_numpy(net.score_b).double()
    assert np.allclose(together[0], phi.numpy(), atol=1e-4) and np.allclose(together[1], scores.numpy(), atol=1e-4)


@pytest.mark.parametrize("candidates", [None, CandidateOptions(max_points=7, min_points=1)])
@pytest.mark.parametrize("points", [20, 300])
def test_one_call_over_the_pairs_is_the_calls_pair_by_pair(candidates: CandidateOptions | None, points: int) -> None:
    # the compiled sweep updates a chain's state and per-point terms (and the candidates' copies) after every
    # accepted move; calls of one pair each start from the state afresh: the same decisions from the same numbers
    # (at 300 points the token network takes blocks of 128 new tokens, and the later pairs of one call reuse the
    # cached outputs of the earlier pairs' tokens, which calls of one pair compute afresh)
    _, state, layout, net, slots = _every_pair(_set_proposal((16,), seed=1), m=5, n=points, chains=4, seed=3)
    pairs = slots.shape[1]
    torch.manual_seed(0)
    draws = draw_pairs(4, pairs, net.components, 2)
    whole = state.clone()
    accepted, nonfinite, _, _ = mixture_pair_sweep(
        whole.numpy(), slots, np.ones((4, pairs), np.bool_), layout, net, draws, candidates=candidates
    )
    one_by_one = state.clone()
    count = np.zeros(4, dtype=np.int64)
    for p in range(pairs):
        part = PairDraws(*(d[:, p : p + 1].contiguous() for d in draws))
        got, _, _, _ = mixture_pair_sweep(
            one_by_one.numpy(),
            np.ascontiguousarray(slots[:, p : p + 1]),
            np.ones((4, 1), np.bool_),
            layout,
            net,
            part,
            candidates=candidates,
        )
        count += got
    assert torch.equal(whole, one_by_one)
    assert np.array_equal(accepted, count) and 0 < accepted.sum() < 4 * pairs and nonfinite.sum() == 0


_EVERY = CandidateOptions(min_points=1)  # the default candidates, also on tiny models
_STRIDED = CandidateOptions(share=0.05, min_weight=0.0, em_steps=2, max_points=2, max_copies=1, min_points=1)


_HARSH = PairScreen(radius=0.0, attempt=0.2)  # every pair of two active mixtures attempted 1 time in 5


@pytest.mark.parametrize(
    ("gibbs_prob", "candidates", "screen", "schedule"),
    [
        (0.0, _EVERY, PairScreen(), "random"),
        (0.3, _EVERY, PairScreen(), "random"),
        (0.3, _EVERY, PairScreen(), "alternate"),
        (0.0, _STRIDED, PairScreen(), "random"),
        (0.0, None, PairScreen(), "random"),
        (0.3, None, PairScreen(), "random"),
        (0.0, _EVERY, _HARSH, "random"),
        (0.0, None, _HARSH, "random"),
        (0.0, _EVERY, None, "random"),
    ],
)
def test_the_compiled_sweep_keeps_the_exact_posterior(
    gibbs_prob: float,
    candidates: CandidateOptions | None,
    screen: PairScreen | None,
    schedule: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a random (untrained) set proposal through the kernel, with and without the data-refined candidates
    # (the default ones, ones that read every other point and one copy, none), with the default screen, one that
    # screens every active pair and none, with the single-site sweeps at random or alternating; tolerances: see
    # test_split_merge.Z_MAX
    monkeypatch.setattr(FusedMixtureSweep, "default_candidates", candidates)
    monkeypatch.setattr(FusedMixtureSweep, "default_screen", screen)
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 3, SIGMA, TAU, 0.5)
    kernel = NeuralBlockKernel(fg, [_set_proposal((16,), seed=4)], gibbs_prob=gibbs_prob, chains=4, schedule=schedule)
    terms = _posterior_terms(points, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    sweep = kernel.fused[0]
    assert isinstance(sweep, FusedMixtureSweep) and sweep._compiled_for(kernel.initial_params["x"])
    assert sweep.candidates == candidates and sweep.screen == screen
    assert (sweep.screened > 0) == (screen is not None)  # (active means over 3 sigma apart are common here)
    assert kernel.diagnostics()["acceptance_by_proposal"]["gmm_pair_set"] > 0.02
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_candidates_raise_the_acceptance_of_a_poor_network() -> None:
    # an untrained network on 60 points: every pair of 4 chains scored at the same starts (20 draws each), its own
    # moves against the candidates' mixture (three cases: mean acceptance 0.35-0.41 alone, 0.92-0.95 with them)
    rates = {}
    for seed in (7, 3, 11):
        points, _, _ = sample_gmm(8, 60, torch.Generator().manual_seed(seed))
        fg = gmm_graph(points, 8, 1.0, 5.0, 0.5)
        proposal = _set_proposal((16,), seed=2)
        layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
        net = MixtureNetwork.from_proposal(proposal)
        assert net is not None
        gen = torch.Generator().manual_seed(seed)
        state = torch.stack([gmm_initial_state(fg, gen) for _ in range(4)]).double()
        slots = np.ascontiguousarray(np.broadcast_to(np.arange(len(layout.pairs)), (4, len(layout.pairs))))
        for label, candidates in (("alone", None), ("candidates", _EVERY)):
            torch.manual_seed(seed)
            alphas = []
            for _ in range(20):
                draws = draw_pairs(4, slots.shape[1], net.components, 2)
                _, _, log_alpha, _ = mixture_pair_sweep(
                    state.numpy(), slots, slots >= 0, layout, net, draws, decide=False, candidates=candidates
                )
                alphas.append(np.exp(np.minimum(log_alpha, 0.0)).mean())
            rates[label, seed] = float(np.mean(alphas))
    for seed in (7, 3, 11):
        assert rates["candidates", seed] > 1.8 * rates["alone", seed], rates


def test_pair_candidates_sample_from_their_density() -> None:
    # E_{b ~ q}[r(b) / q(b)] = 1 for a density r narrower than q's heaviest candidate (of its pattern)
    gen = np.random.default_rng(0)
    points = np.concatenate([gen.normal(size=(40, 2)), gen.normal(size=(20, 2)) + 4.0])
    rest = np.log(np.exp(-0.5 * ((points - 4.0) ** 2).sum(1)) + 1e-4)
    log_w, loc = np.log(np.array([0.6, 0.3, 0.1])), gen.normal(size=(3, 4))
    bits, means, log_sd, weights = pair_candidates(
        points, rest, 1.0, (0.2, -0.1), 0.04, log_w, loc, np.array([[4.0, 4.0], [4.1, 3.9], [0.0, 0.0]])
    )
    assert np.isclose(np.exp(weights).sum(), 1.0) and {tuple(b) for b in bits} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    # all 3 components weigh over 0.05; the copies at (4, 4) and (4.1, 3.9) are one location (merge distance
    # 0.5), (0, 0) another: (0, 0) once, each mean active alone from 3 + 2 locations, both from 3 + 2 * 2 pairs
    # and 2 splits with their mirrors
    assert len(bits) == 1 + 2 * (3 + 2) + 3 + 2 * 2 + 2 * 2
    top = int(np.argmax(weights))
    draws = 20_000
    pick = gen.choice(len(weights), size=draws, p=np.exp(weights) / np.exp(weights).sum())
    sd = np.exp(log_sd[pick]).repeat(2, 1)
    cont = means[pick] + sd * gen.normal(size=(draws, 4))
    blocks = np.concatenate([cont[:, :2], bits[pick, :1], cont[:, 2:], bits[pick, 1:]], 1)
    log_q = np.array([_log_q_candidates(b, bits, means, log_sd, weights, len(weights), 2) for b in blocks])
    narrow = log_sd[top] - np.log(2.0)
    z = (cont - means[top]) / np.exp(narrow).repeat(2)
    log_r = -0.5 * (z**2).sum(1) - 2 * narrow.sum() - 2 * np.log(2 * np.pi)
    ratio = np.where((bits[pick] == bits[top]).all(1), np.exp(log_r - log_q), 0.0)
    assert abs(ratio.mean() - 1.0) < 5 * ratio.std() / np.sqrt(draws) + 1e-3, ratio.mean()


def test_split_candidates_fit_a_cluster_two_means_explain_better_than_one() -> None:
    # one wide cluster of two overlapping halves at (+-0.8, 0) and one the other mixtures explain at (8, 0): EM from
    # a copy (both means at the network's location) keeps the means equal; a split finds the two halves
    gen = np.random.default_rng(3)
    halves = np.concatenate([gen.normal(size=(200, 2)) + [0.8, 0.0], gen.normal(size=(200, 2)) - [0.8, 0.0]])
    points = np.concatenate([halves, gen.normal(size=(100, 2)) + [8.0, 0.0]])
    rest = -0.5 * ((points - [8.0, 0.0]) ** 2).sum(1)
    log_w, loc = np.log(np.array([0.8, 0.2])), np.array([[0.1, 0.0, 0.1, 0.0], [5.0, 5.0, -5.0, -5.0]])
    found = {}
    for splits in (0, 2):
        options = CandidateOptions(splits=splits, max_points=1000)
        other = np.array([[8.0, 0.0]])
        bits, means, _, weights = pair_candidates(points, rest, 1.0, (0.0, 0.0), 0.04, log_w, loc, other, options)
        both = (bits == 1).all(1)
        found[splits] = means[both], np.exp(weights[both])
    means, weights = found[2]
    split = means[np.argmax(weights)]
    assert abs(split[0] - split[2]) > 1.2 and abs(split[1] - split[3]) < 0.3  # the halves, apart along x
    assert np.sort(weights)[-4:].sum() > 0.99  # the two splits and their mirrors: all the mass of both means
    mirrored = np.concatenate([split[2:], split[:2]])
    others, _ = found[0]
    assert np.abs(others - split).max(1).min() > 0.2 and np.abs(others - mirrored).max(1).min() > 0.2  # not otherwise


def test_split_starts_lie_along_the_clusters_long_axis_also_when_it_is_the_anti_diagonal() -> None:
    # integer points, symmetric under swapping the coordinates: the covariance is [[a, c], [c, a]] exactly, c < 0, so
    # (1, 1) is exactly its minor eigenvector (a power iteration from there stays there); the split must go along
    # (1, -1), by sqrt(2 lambda / pi) either side
    t, s = np.meshgrid(np.arange(-3.0, 4.0), np.arange(-1.0, 2.0))
    points = np.stack([t.ravel() + s.ravel(), s.ravel() - t.ravel()], 1)
    start_i, start_j = np.empty(2), np.empty(2)
    assert _split_starts(points, np.full(len(points), -np.inf), 1, np.zeros(2), start_i, start_j)
    cov = points.T @ points / len(points)
    values, vectors = np.linalg.eigh(cov)
    offset = (start_i - start_j) / 2
    assert abs(abs(offset @ vectors[:, 1]) - math.sqrt(2 * values[1] / math.pi)) < 1e-9
    assert abs(offset @ vectors[:, 0]) < 1e-9
    assert np.allclose(start_i + start_j, 0.0)


def test_models_below_min_points_propose_from_the_network_alone() -> None:
    _, state, layout, net, slots = _every_pair(_set_proposal((8,), seed=3), m=5, n=20, chains=2, seed=1)
    torch.manual_seed(0)
    draws = draw_pairs(2, slots.shape[1], net.components, 2)
    outputs = {}
    for label, candidates in (("alone", None), ("gated", CandidateOptions(min_points=21)), ("on", _EVERY)):
        outputs[label] = mixture_pair_sweep(state.clone().numpy(), slots, slots >= 0, layout, net, draws, None, False,
                                            candidates)[2]  # fmt: skip
    assert np.array_equal(outputs["alone"], outputs["gated"])
    assert not np.allclose(outputs["alone"], outputs["on"])


def test_the_screen_skips_far_active_pairs_and_weighs_the_rest_by_their_attempt_odds() -> None:
    # at fixed states (decide=False): a pair is skipped iff both mixtures are active, over `radius` sigma apart and
    # its uniform is at least `attempt`; every other pair's log ratio is the unscreened one + log s(S') - log s(S)
    proposal = _set_proposal((16,))
    fg, state, layout, net, slots = _every_pair(proposal, m=6, n=25, chains=4, seed=3)
    state = state.double()
    state[:, layout.active_ids] = 1.0  # every pair active: the screen reads their distance
    screen = PairScreen(radius=2.0, attempt=0.3)
    torch.manual_seed(4)
    draws = draw_pairs(4, slots.shape[1], net.components, 2)
    valid = slots >= 0
    plain = mixture_pair_sweep(state.numpy(), slots, valid, layout, net, draws, decide=False)
    screened = np.zeros(4, dtype=np.int64)
    got = mixture_pair_sweep(state.numpy(), slots, valid, layout, net, draws, decide=False, screen=screen,
                             screened=screened)  # fmt: skip
    sigma = float(layout.sigma)

    def log_s(block: np.ndarray) -> np.ndarray:  # [..., 2 D + 2] blocks (mu_i, v_i, mu_j, v_j)
        far = ((block[..., 0:2] - block[..., 3:5]) / sigma) ** 2
        both = (block[..., 2] > 0.5) & (block[..., 5] > 0.5)
        return np.where(both & (far.sum(-1) > screen.radius**2), math.log(screen.attempt), 0.0)

    current = state.numpy()[:, layout.block_ids.numpy()]  # [K, P, 2 D + 2]: slots are every pair in order
    skipped = (log_s(current) < 0) & (draws.screen.numpy() >= screen.attempt)
    assert 0 < skipped.sum() < skipped.size and screened.sum() == skipped.sum()
    assert np.all(got[2][skipped] == -math.inf)
    kept = ~skipped
    want = plain[2] + log_s(plain[3]) - log_s(current)
    assert np.allclose(got[2][kept], want[kept]) and np.array_equal(got[3][kept], plain[3][kept])
    factor = log_s(plain[3][kept]) - log_s(current[kept])
    assert (factor > 0).any() and (factor < 0).any()  # the factor is exercised both ways
    assert ((log_s(current) < 0) & kept).any()  # far pairs attempted anyway (their - log s(S))
    same = mixture_pair_sweep(state.numpy(), slots, valid, layout, net, draws, decide=False,
                              screen=PairScreen(attempt=1.0))  # fmt: skip
    assert np.array_equal(same[2], plain[2])  # attempt 1: the screen changes nothing


def _one_pair():
    """A one-chain, one-pair sweep's arguments on a small case: state, slots, layout, network and draws."""
    proposal = _set_proposal((8,))
    fg, state = _case(m=4, n=6, chains=1)
    layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
    net = MixtureNetwork.from_proposal(proposal)
    assert net is not None
    return state, np.zeros((1, 1), dtype=np.int64), layout, net, draw_pairs(1, 1, net.components, 2)


def test_bad_screen_settings_are_refused() -> None:
    state, slots, layout, net, draws = _one_pair()
    for screen_u in (None, torch.rand(1, 2, dtype=torch.float64)):
        with pytest.raises(ValueError, match="screen uniforms"):
            mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws._replace(screen=screen_u),
                               screen=PairScreen())  # fmt: skip
    for bad in (PairScreen(attempt=0.0), PairScreen(attempt=1.5), PairScreen(radius=-1.0), PairScreen(math.inf)):
        with pytest.raises(ValueError, match="screen options out of range"):
            mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws, screen=bad)
    with pytest.raises(ValueError, match="screened must be"):
        mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws, screen=PairScreen(),
                           screened=np.zeros(2, dtype=np.int64))  # fmt: skip


def test_kept_step_constants_give_the_same_moves_and_wrong_ones_are_refused() -> None:
    state, slots, layout, net, draws = _one_pair()
    fresh = mixture_pair_sweep(state.numpy().copy(), slots, slots >= 0, layout, net, draws, decide=False)
    kept = mixture_pair_sweep(state.numpy().copy(), slots, slots >= 0, layout, net, draws, decide=False,
                              constants=step_constants(layout, torch.float64))  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(fresh, kept))
    for dtype, size in ((torch.float32, layout.values.shape[0]), (torch.float64, 3)):
        wrong = step_constants(layout, dtype)
        wrong = wrong._replace(points=wrong.points[:size])
        with pytest.raises(ValueError, match="constants must be the layout's float64 ones"):
            mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws, constants=wrong)


def test_bad_candidate_settings_are_refused() -> None:
    state, slots, layout, net, draws = _one_pair()
    with pytest.raises(ValueError, match="choice uniforms"):
        mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws._replace(choice=None), None, True,
                           CandidateOptions())  # fmt: skip
    with pytest.raises(ValueError, match="out of range"):
        mixture_pair_sweep(
            state.numpy(), slots, slots >= 0, layout, net, draws, None, True, CandidateOptions(share=1.0)
        )


def test_networks_the_loop_does_not_cover_keep_the_eager_steps() -> None:
    assert MixtureNetwork.from_proposal(NeuralBlockProposal(GmmPairMotif(), components=2, hidden=(8,))) is None
    assert MixtureNetwork.from_proposal(_set_proposal((8, 8, 8))) is None  # three hidden layers
    wide = _set_proposal((8,)).to(torch.float64)
    assert MixtureNetwork.from_proposal(wide) is None
    fg, state = _case(m=4, n=10, chains=2)
    kernel = NeuralBlockKernel(fg, [wide], gibbs_prob=0.0, chains=2)
    kernel.initial_params = {"x": state}
    kernel.setup(0)
    sweep = kernel.fused[0]
    assert isinstance(sweep, FusedMixtureSweep) and not sweep._compiled_for(state)
    params = kernel.sample(kernel.initial_params)
    assert torch.isfinite(params["x"]).all()


@pytest.mark.parametrize("candidates", [None, _EVERY])
def test_reused_proposals_give_the_same_sweeps(candidates: CandidateOptions | None) -> None:
    # pairs with no active member, or the same one, share a conditioning set between changes to active mixtures;
    # the kept proposal is the one the pair computes: the same states, decisions, ratios and blocks bit for bit
    _, state, layout, net, slots = _every_pair(_set_proposal((16,), seed=4), m=9, n=30, chains=4, seed=5)
    pairs = slots.shape[1]
    valid = np.ones((4, pairs), np.bool_)
    torch.manual_seed(3)
    computed_total = {True: 0, False: 0}
    for _ in range(6):  # sweeps from the states the last left (accepted moves on and off the active mixtures)
        draws = draw_pairs(4, pairs, net.components, 2)
        outputs = {}
        for reuse in (True, False):
            out = state.clone()
            computed = np.zeros(4, dtype=np.int64)
            result = mixture_pair_sweep(out.numpy(), slots, valid, layout, net, draws, None, True, candidates, reuse,
                                        computed)  # fmt: skip
            outputs[reuse] = (out, result, computed)
            computed_total[reuse] += int(computed.sum())
        (kept, kept_result, _), (fresh, fresh_result, fresh_computed) = outputs[True], outputs[False]
        assert torch.equal(kept, fresh)
        assert all(np.array_equal(a, b) for a, b in zip(kept_result, fresh_result, strict=True))
        assert np.array_equal(fresh_computed, valid.sum(1))
        state = kept
    assert computed_total[True] < 0.8 * computed_total[False]  # most mixtures inactive: many shared sets
    # bits with different prior odds: the candidates read them, so they are not reused (the network alone is)
    unequal = layout._replace(log_odds=layout.log_odds + 0.5 * (torch.arange(9) == 0))
    draws = draw_pairs(4, pairs, net.components, 2)
    counts, states = {}, {}
    for reuse in (True, False):
        states[reuse], counts[reuse] = state.clone(), np.zeros(4, dtype=np.int64)
        mixture_pair_sweep(states[reuse].numpy(), slots, valid, unequal, net, draws, None, True, candidates, reuse,
                           counts[reuse])  # fmt: skip
    assert torch.equal(states[True], states[False]) and np.array_equal(counts[False], valid.sum(1))
    assert np.array_equal(counts[True], valid.sum(1)) == (candidates is not None)
    with pytest.raises(ValueError, match="computed must be"):
        mixture_pair_sweep(state.numpy(), slots, valid, layout, net, draws, None, True, candidates, True,
                           np.zeros(3, dtype=np.int64))  # fmt: skip


def test_the_kernel_reuses_proposals_without_changing_its_chain() -> None:
    # FusedMixtureSweep.reuse: the same transitions with and without, fewer proposals computed with
    fg, state = _case(m=8, n=30, chains=3, seed=6)
    runs = {}
    for reuse in (True, False):
        kernel = NeuralBlockKernel(fg, [_set_proposal((16,), seed=2)], gibbs_prob=0.3, chains=3)
        kernel.initial_params = {"x": state.clone()}
        kernel.setup(0)
        sweep = kernel.fused[0]
        assert isinstance(sweep, FusedMixtureSweep) and sweep.reuse
        sweep.reuse = reuse
        torch.manual_seed(11)
        params = kernel.initial_params
        for _ in range(8):
            params = kernel.sample(params)
        runs[reuse] = (params["x"], sweep.computed)
    assert torch.equal(runs[True][0], runs[False][0])
    assert 0 < runs[True][1] < runs[False][1]


def test_the_float32_exp_is_within_rounding_of_the_exact_one() -> None:
    x = np.linspace(-80.0, 80.0, 400_001).astype(np.float32)
    got = np.empty_like(x)
    _exp32(x, got, np.empty(len(x), dtype=np.int32), np.float32(1.0))
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got / exact - 1.0)) < 2e-7
    negated = np.empty_like(x)
    _exp32(x, negated, np.empty(len(x), dtype=np.int32), np.float32(-1.0))
    assert np.array_equal(negated, got[::-1])  # sign -1: exp(-x), the same arithmetic
    clamped = np.empty(3, np.float32)
    _exp32(np.array([-1e4, np.nan, 1e4], np.float32), clamped, np.empty(3, np.int32), np.float32(1.0))
    assert np.allclose(clamped, np.exp(np.array([-80.0, -80.0, 80.0])), rtol=2e-7)


def _point_sums_of(terms: np.ndarray) -> PointSums:
    n = terms.shape[0]
    sums = PointSums(np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64), *(np.empty(n) for _ in range(4)))
    grand = _point_sums(terms, sums)
    with np.errstate(divide="ignore"):
        want = np.logaddexp.reduce(terms, axis=1)
    assert np.allclose(sums.lse, want, rtol=1e-14, atol=1e-12) and np.isclose(grand, want.sum(), rtol=1e-13)
    return sums


@pytest.mark.parametrize("seed", range(4))
def test_a_pairs_rest_is_every_other_mixtures_log_sum(seed: int) -> None:
    # from the per-point sums, for every pair: points the pair explains all but e^-50 of (the cancellation the
    # top-two sums avoid), ties, inactive mixtures (-inf) and points no mixture or only the pair explains
    rng = np.random.default_rng(seed)
    m = 6
    terms = -0.5 * rng.uniform(0.0, 40.0, (40, m)) ** 2 / 4.0
    terms[rng.random((40, m)) < 0.3] = -np.inf
    terms[0] = [-1.0, -1.0, -1.0, -np.inf, -np.inf, -np.inf]  # a tie
    terms[1] = [-np.inf] * m  # no active mixture
    terms[2] = [0.0, -60.0, -np.inf, -70.0, -np.inf, -np.inf]  # one mixture holds all but e^-60
    terms[3] = [-0.1, -0.2, -55.0, -58.0, -np.inf, -61.0]  # two hold all but e^-55
    terms[4] = [-np.inf, -2.0, -np.inf, -np.inf, -np.inf, -np.inf]  # one mixture alone
    terms[5] = [0.0, -800.0, -900.0, -np.inf, -1e4, -np.inf]  # the others' shares underflow (summed term by term)
    terms[6] = [-1.0, -0.5, -720.0, -730.0, -np.inf, -np.inf]  # subnormal shares
    sums = _point_sums_of(terms)
    for pi in range(m):
        for pj in range(pi + 1, m):
            others = np.delete(terms, [pi, pj], axis=1)
            with np.errstate(divide="ignore"):
                want = np.logaddexp.reduce(others, axis=1)
            for j in range(len(terms)):
                top = sums.top[j]
                share_i = np.exp(terms[j, pi] - top) if terms[j, pi] > -np.inf else 0.0
                share_j = np.exp(terms[j, pj] - top) if terms[j, pj] > -np.inf else 0.0
                got = _rest_log_sum(sums, terms[j], j, pi, pj, share_i, share_j)
                if want[j] == -np.inf:
                    assert got == -np.inf
                else:
                    assert abs(got - want[j]) < 1e-12 * max(1.0, abs(want[j])), (j, pi, pj, got, want[j])


def test_a_token_cache_carried_across_sweeps_changes_no_number() -> None:
    # the outputs kept from earlier sweeps are the ones a fresh cache computes: the same sweeps bit for bit
    _, state, layout, net, slots = _every_pair(_set_proposal((16,), seed=7), m=6, n=40, chains=3, seed=8)
    pairs = slots.shape[1]
    valid = np.ones((3, pairs), np.bool_)
    cache = TokenCache.empty(40, net.phi2_b.shape[0], net.score_b.shape[0])
    carried, fresh = state.clone(), state.clone()
    torch.manual_seed(9)
    for _ in range(4):
        draws = draw_pairs(3, pairs, net.components, 2)
        kept = mixture_pair_sweep(carried.numpy(), slots, valid, layout, net, draws, cache=cache)
        anew = mixture_pair_sweep(fresh.numpy(), slots, valid, layout, net, draws)
        assert torch.equal(carried, fresh)
        assert all(np.array_equal(a, b) for a, b in zip(kept, anew, strict=True))
    assert int(cache.clock[0]) > 0 and not np.isnan(cache.known).all()
    with pytest.raises(ValueError, match="token cache"):
        mixture_pair_sweep(state.numpy(), slots, valid, layout, net, draws, cache=TokenCache.empty(41, 8, 2))


def test_a_mirrored_candidate_is_the_one_refined_for_the_other_mean() -> None:
    # one mean active from a location: the EM steps and the points' mass are symmetric in the pair's two means
    rng = np.random.default_rng(3)
    points = rng.normal(size=(60, 2)) * 2.0
    rest = np.where(rng.random(60) < 0.2, -np.inf, rng.normal(-3.0, 2.0, 60))
    count, dim, odds_i, odds_j = 4.0, 2, -0.4, 0.7
    c_bits, c_mean = np.zeros((3, 2), np.int64), np.zeros((3, 4))
    c_log_sd, c_log_w = np.zeros((3, 2)), np.zeros(3)
    start = np.array([0.5, -1.0])
    scratch = (np.empty(2), np.empty(2))
    args = (points, rest, 3, count, 0.04, odds_i, odds_j, 2, c_bits, c_mean, c_log_sd, c_log_w, *scratch)
    _add_candidate(0, 1, 0, start, start, *args)
    _add_candidate(1, 0, 1, start, start, *args)
    _mirror_candidate(0, 2, dim, odds_i, odds_j, c_bits, c_mean, c_log_sd, c_log_w)
    assert np.array_equal(c_bits[2], c_bits[1]) and np.array_equal(c_mean[2], c_mean[1])
    assert np.array_equal(c_log_sd[2], c_log_sd[1]) and np.isclose(c_log_w[2], c_log_w[1], rtol=0, atol=1e-10)
    assert np.isfinite(c_log_w[0]) and not np.array_equal(c_mean[0], c_mean[2])


def test_the_current_pairs_energy_from_the_point_sums_is_its_pair_energy() -> None:
    # the points' log-sums summed (every mixture, the pair's included) against the pair's terms added to its rest
    rng = np.random.default_rng(5)
    n, m, dim, sigma, tau = 30, 5, 2, 1.3, 4.0
    points, center = rng.normal(size=(n, dim)) * 2.0, np.array([0.5, -1.0])
    means, bits = rng.normal(size=(m, dim)) * 2.0, np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    with np.errstate(divide="ignore"):
        terms = np.log(bits) - 0.5 * ((points[:, None, :] - means[None]) ** 2).sum(-1)
    sums = _point_sums_of(terms)
    for pi, pj in [(0, 1), (0, 2), (1, 4), (2, 3)]:
        block = np.concatenate([means[pi] * sigma + center, [bits[pi]], means[pj] * sigma + center, [bits[pj]]])
        others = np.delete(terms, [pi, pj], axis=1)
        with np.errstate(divide="ignore"):
            rest = np.logaddexp.reduce(others, axis=1)
        count = bits.sum() - bits[pi] - bits[pj]
        want = _pair_energy(rest, count, points, block, dim, center, sigma, tau, -0.3, 0.2)
        got = _current_energy(float(sums.lse.sum()), n, count, block, dim, center, tau, -0.3, 0.2)
        assert np.isfinite(want) and abs(got - want) < 1e-9 * abs(want)
    nothing = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert _current_energy(0.0, n, 0.0, nothing, dim, center, tau, -0.3, 0.2) == -np.inf


def test_log_sum_over_adds_two_terms_to_a_base() -> None:
    exact = np.logaddexp
    for base, a, b in [(-3.0, -2.0, -5.0), (-1.0, -np.inf, -0.5), (-10.0, 800.0, -2.0), (0.0, -45.0, -39.0)]:
        want = exact(exact(base, a), b)
        assert abs(_log_sum_over(base, a, b) - want) < 1e-12 * max(1.0, abs(want)), (base, a, b)
    assert _log_sum_over(-np.inf, -1.0, -2.0) == pytest.approx(exact(-1.0, -2.0), rel=1e-14)
    assert _log_sum_over(-np.inf, -np.inf, -np.inf) == -np.inf
    assert _log_sum_over(-2.0, -50.0, -np.inf) == -2.0  # over 40 nats below: left out
