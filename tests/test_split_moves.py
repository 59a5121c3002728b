"""Smart splits and dumb merges for other kernels: exact samples stay exact, NB ends its GMM transitions with them."""

from __future__ import annotations

import pytest
import torch
from pyro.infer import MCMC
from test_jit_mixture import _set_proposal
from test_mixture_copies import Z_MAX, _exact_draws, _z_scores
from test_split_merge import SIGMA, TAU, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import gmm_graph, gmm_initial_state, sample_gmm
from neuralblock import NeuralBlockKernel
from neuralblock.kernels.split_merge import MixtureSplitMoves


@pytest.mark.parametrize(
    ("points", "m"),
    [
        (torch.tensor([[-0.3, 0.2], [0.2, -0.1], [0.4, 0.3]]), 3),
        (torch.tensor([[-1.5], [-1.2], [1.4], [1.6]]), 4),
    ],
    ids=["m3-2d", "m4-1d"],
)
def test_split_moves_keep_exact_draws_exact(points: torch.Tensor, m: int) -> None:
    # 40,000 independent exact draws, then 4 attempts each: still exact draws (|z| < 5 for every pattern probability
    # and mean moment, as in test_mixture_copies), and the attempts changed many of them
    fg = gmm_graph(points, m, SIGMA, TAU, 0.5)
    terms = _posterior_terms(points, m, SIGMA, TAU, 0.5)
    before = _exact_draws(fg, terms, 40_000, seed=3 + m)
    moves = MixtureSplitMoves.of(fg, attempts=4)
    assert moves is not None
    torch.manual_seed(5)
    after = moves.move(before)
    rates = moves.acceptance()
    assert rates["smart_split"] > 0.02 and rates["dumb_merge"] > 0.02, rates
    bits = [fg.variable_id(f"v[{k}]") for k in range(m)]
    assert (after[:, bits] != before[:, bits]).any(-1).double().mean() > 0.05
    z = _z_scores(fg, after, terms)
    assert z.abs().max() < Z_MAX, z


def test_the_neural_kernel_with_them_keeps_the_exact_posterior() -> None:
    # a random (untrained) set proposal, single-site sweeps at random and 2 split attempts after every transition
    points = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])
    fg = gmm_graph(points, 3, SIGMA, TAU, 0.5)
    kernel = NeuralBlockKernel(fg, [_set_proposal((16,), seed=4)], gibbs_prob=0.3, chains=4, split_moves=2)
    terms = _posterior_terms(points, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    assert kernel.split_moves is not None and kernel.split_moves.attempts == 2
    assert min(kernel.diagnostics()["split_move_acceptance"].values()) > 0.02
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_every_transition_ends_with_them_when_asked() -> None:
    proposal = _set_proposal((16,), seed=1)
    points, _, _ = sample_gmm(4, 40, torch.Generator().manual_seed(0))
    fg = gmm_graph(points, 4, 1.0, 5.0, 0.5)
    for attempts in (0, 3):  # (0, the default: none)
        kernel = NeuralBlockKernel(fg, [proposal], chains=2, **({"split_moves": attempts} if attempts else {}))
        MCMC(kernel, num_samples=3, warmup_steps=2, disable_progbar=True).run()
        if attempts == 0:
            assert kernel.split_moves is None and "split_move_acceptance" not in kernel.diagnostics()
            continue
        assert kernel.split_moves is not None and "split_move_acceptance" in kernel.diagnostics()
        # every attempt of each of the 5 transitions of both chains: proposed, or unavailable
        assert int(kernel.split_moves.counts[0].sum() + kernel.split_moves.counts[2].sum()) == attempts * 2 * 5


def test_a_refreshed_graph_is_read_again() -> None:
    # the moves score against the graph's current sigma: after the kernel's graph is updated they read the new one
    points, _, _ = sample_gmm(4, 40, torch.Generator().manual_seed(1))
    kernel = NeuralBlockKernel(gmm_graph(points, 4, 1.0, 5.0, 0.5), [_set_proposal((16,))], chains=2, split_moves=2)
    kernel.setup(0)
    assert kernel.split_moves is not None and kernel.split_moves.arrays.sigma == 1.0
    kernel.update_graph(gmm_graph(points, 4, 2.0, 5.0, 0.5))
    assert kernel.split_moves.arrays.sigma == 2.0


def test_one_chain_states_and_the_moves_change_them() -> None:
    # a one-chain state [N] keeps its shape, and the accepted moves change the states they return
    points, _, _ = sample_gmm(4, 40, torch.Generator().manual_seed(2))
    fg = gmm_graph(points, 4, 1.0, 5.0, 0.5)
    moves = MixtureSplitMoves.of(fg, attempts=4)
    assert moves is not None
    states = torch.stack([gmm_initial_state(fg, torch.Generator().manual_seed(s)) for s in range(50)])
    torch.manual_seed(0)
    after = moves.move(states)
    accepted = int(moves.counts[1].sum())
    assert accepted > 0 and int((after != states).any(-1).sum()) >= min(accepted, 1)
    assert moves.move(states[0]).shape == states[0].shape


def test_bad_options_are_refused() -> None:
    fg = gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5)
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match="split_moves must"):
            NeuralBlockKernel(fg, [_set_proposal((16,))], split_moves=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempts must be a positive int"):
        MixtureSplitMoves.of(fg, attempts=0)
    moves = MixtureSplitMoves.of(fg, attempts=1)
    assert moves is not None
    with pytest.raises(ValueError, match="CPU states"):
        moves.move(torch.tensor(1.0))
