"""The compiled split-merge sweep (neuralblock.kernels.jit_split_merge): the same densities and energies as the eager
moves on the same moves, a well-formed sweep, and the kernel's choice of path. Its invariance against the enumerated
posterior is checked in tests/test_split_merge.py (the kernel's default path)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from motifs.gmm_pair import gmm_graph
from neuralblock import FactorGraph
from neuralblock.kernels.jit_split_merge import draw_attempts, move_scores, split_merge_sweep, sweep_arrays
from neuralblock.kernels.split_merge import MOVES, MoveTuning, SplitMergeGMM, mixture_layout, propose_moves


def _random_states(fg, layout, chains: int, gen: torch.Generator) -> torch.Tensor:
    """``[chains, N]`` states with random means and 1-3 active mixtures (the points and any evidence as observed)."""
    initial = fg.initial_state().double()
    state = initial.repeat(chains, 1)
    m = len(layout.active)
    state[:, layout.means.reshape(-1)] = 3.0 * torch.randn(chains, layout.means.numel(), generator=gen).double()
    bits = torch.zeros(chains, m, dtype=torch.float64)
    for c in range(chains):
        on = torch.randperm(m, generator=gen)[: 1 + c % 3]
        bits[c, on] = 1.0
    state[:, layout.active] = bits
    observed = torch.tensor(sorted(fg.evidence), dtype=torch.long)
    state[:, observed] = initial[observed]
    return state


def _scored_graph(n: int, observed: bool) -> FactorGraph:
    """A 5-mixture GMM of two clusters; ``observed``: mixture 0 fixed active at (3, 3), and a second factor on v[1]."""
    gen = torch.Generator().manual_seed(5)
    points = torch.cat([torch.randn(n // 2, 2, generator=gen) - 3.0, torch.randn(n - n // 2, 2, generator=gen) + 3])
    fg = gmm_graph(points, 5, 1.0, 4.0, 0.3)
    if observed:
        fg.set_evidence({"v[0]": 1.0, "mu[0,0]": 3.0, "mu[0,1]": 3.0})
        fg.add_table_factors(torch.tensor([[fg.variable_id("v[1]")]]), torch.tensor([[0.0, -1.5]]))
    return fg


@pytest.mark.parametrize(
    ("n", "seeds", "observed"),
    [(12, 64, False), (40, 8, False), (40, 8, True)],
    ids=["all-points-seed", "top-8-seeds", "observed-mixture-and-bit-factor"],
)
def test_compiled_scores_match_the_eager_moves(n: int, seeds: int, observed: bool) -> None:
    # Every move type from random states: log q forward and reverse as the eager functions compute them, and the
    # energy change as the graph's log joint (with an observed active mixture, M counts it; a second factor on a
    # bit enters the energy).
    torch.set_default_dtype(torch.float64)
    try:
        gen = torch.Generator().manual_seed(6)
        fg = _scored_graph(n, observed)
        layout = mixture_layout(fg)
        assert bool(layout.movable[0]) is not observed
        tuning = MoveTuning(birth_seeds=seeds)
        log_probs = torch.tensor([0.1, 0.1, 0.2, 0.2, 0.15, 0.25], dtype=torch.float64).log()
        arrays = sweep_arrays(fg, layout, tuning, log_probs.exp())
        assert arrays is not None
        checked = [0] * len(MOVES)
        for kind in range(len(MOVES)):
            state = _random_states(fg, layout, 12, gen)
            batch = propose_moves(torch.full((12,), kind), layout, state, log_probs, tuning)
            for c in range(12):
                if not bool(batch.available[c]):
                    continue
                i, j = batch.mixtures[c].tolist()
                fwd, rev, energy = move_scores(arrays, kind, (i, j), state[c].numpy(), batch.state[c].numpy())
                exact = float(fg.log_joint(batch.state[c]) - fg.log_joint(state[c]))
                assert fwd == pytest.approx(float(batch.log_q_fwd[c]), rel=1e-9, abs=1e-8), (MOVES[kind], c)
                assert rev == pytest.approx(float(batch.log_q_rev[c]), rel=1e-9, abs=1e-8), (MOVES[kind], c)
                assert energy == pytest.approx(exact, rel=1e-9, abs=1e-7), (MOVES[kind], c)
                checked[kind] += 1
        assert min(checked) >= 4, checked
    finally:
        torch.set_default_dtype(torch.float32)


def test_sweep_changes_only_the_moved_mixtures_and_counts_every_attempt() -> None:
    gen = torch.Generator().manual_seed(2)
    fg = gmm_graph(torch.randn(30, 2, generator=gen) * 4, 6, 1.0, 4.0, 0.5)
    layout = mixture_layout(fg)
    arrays = sweep_arrays(fg, layout, MoveTuning(), torch.full((6,), 1 / 6))
    assert arrays is not None
    start = _random_states(fg, layout, 4, gen).float().double().numpy()
    states = start.copy()
    counts, nonfinite = split_merge_sweep(states, arrays, draw_attempts(4, 50, 2), round32=True)
    assert counts.shape == (3, 6) and int(counts[0].sum() + counts[2].sum()) == 4 * 50 and nonfinite == 0
    assert 0 < int(counts[1].sum()) <= int(counts[0].sum())
    moved = np.concatenate([layout.means.reshape(-1).numpy(), layout.active.numpy()])
    others = np.setdiff1d(np.arange(fg.num_variables), moved)
    assert np.array_equal(states[:, others], start[:, others])  # the points never move
    assert np.array_equal(states, states.astype(np.float32).astype(np.float64))  # float32 values, as scored
    assert (states[:, layout.active.numpy()].sum(-1) >= 1).all()
    log_joint = fg.log_joint(torch.from_numpy(states).float())
    assert torch.isfinite(log_joint).all()


def test_kernel_picks_its_path_and_refuses_an_unknown_factor() -> None:
    fg = gmm_graph(torch.randn(10, 2), 3, 1.0, 4.0, 0.5)
    kernel = SplitMergeGMM(fg, chains=2)
    kernel.initial_params = {"x": fg.initial_state().repeat(2, 1)}
    kernel.setup(0)
    assert kernel.diagnostics()["compiled_moves"] is True
    eager = SplitMergeGMM(fg, chains=2, compiled=False)
    eager.initial_params = {"x": fg.initial_state().repeat(2, 1)}
    eager.setup(0)
    assert eager.diagnostics()["compiled_moves"] is False
    # a factor joining two bits: the compiled energy does not know it
    coupled = gmm_graph(torch.randn(10, 2), 3, 1.0, 4.0, 0.5)
    bits = [coupled.variable_id(f"v[{k}]") for k in range(2)]
    coupled.add_table_factors(torch.tensor([bits]), torch.tensor([[[0.0, -1.0], [-1.0, 0.0]]]))
    assert sweep_arrays(coupled, mixture_layout(coupled), MoveTuning(), torch.full((6,), 1 / 6)) is None
    with pytest.raises(ValueError, match="compiled sweep does not know"):
        strict = SplitMergeGMM(coupled, compiled=True)
        strict.initial_params = {"x": coupled.initial_state()}
        strict.setup(0)
    with pytest.raises(ValueError, match="compiled must be"):
        SplitMergeGMM(fg, compiled="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="birth_seeds"):
        SplitMergeGMM(fg, tuning=MoveTuning(birth_seeds=0))


def test_disabled_move_types_are_never_drawn() -> None:
    fg = gmm_graph(torch.randn(12, 2) * 3, 4, 1.0, 4.0, 0.5)
    layout = mixture_layout(fg)
    probs = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    arrays = sweep_arrays(fg, layout, MoveTuning(), probs)
    assert arrays is not None and math.isinf(arrays.move_log_probs[0])
    states = _random_states(fg, layout, 3, torch.Generator().manual_seed(1)).numpy()
    draws = draw_attempts(3, 200, 2)
    draws.uniforms[:, :, 0] = np.linspace(0.0, 1.0, 200)  # the move type's uniform up to 1 itself
    counts, _ = split_merge_sweep(states, arrays, draws, round32=False)
    total = counts[0] + counts[2]
    assert total.tolist() == [0, 0, 300, 300, 0, 0]  # u below 0.5 draws dumb_split, from 0.5 up to 1 smart_merge


def test_cached_births_give_the_states_of_fresh_ones() -> None:
    # The birth proposal of a state is kept until a move is accepted: one call of many attempts must reach the states
    # that one call per attempt (nothing kept between calls) reaches from the same random numbers (up to rounding: a
    # call keeps its per-point log-sums up to date move by move, where a new call sums them afresh).
    gen = torch.Generator().manual_seed(4)
    fg = gmm_graph(torch.randn(90, 2, generator=gen) * 4, 6, 1.0, 4.0, 0.5)
    layout = mixture_layout(fg)
    probs = torch.tensor([0.1, 0.1, 0.05, 0.05, 0.35, 0.35], dtype=torch.float64)
    arrays = sweep_arrays(fg, layout, MoveTuning(birth_seeds=16), probs)
    assert arrays is not None
    start = _random_states(fg, layout, 3, gen).numpy()
    draws = draw_attempts(3, 120, 2)
    together = start.copy()
    counts, _ = split_merge_sweep(together, arrays, draws, round32=False)
    one_by_one = start.copy()
    separate = np.zeros_like(counts)
    for a in range(120):
        step = type(draws)(draws.uniforms[:, a : a + 1].copy(), draws.normals[:, a : a + 1].copy())
        separate += split_merge_sweep(one_by_one, arrays, step, round32=False)[0]
    assert np.array_equal(counts, separate)
    np.testing.assert_allclose(together, one_by_one, rtol=1e-10, atol=1e-10)
    assert counts[0, 5] > 100 and counts[1].sum() > 0  # deaths of the same mixture between accepted moves
