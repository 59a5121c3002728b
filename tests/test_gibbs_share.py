"""``gibbs_share``: a kernel's single-site probability set from the timed cost of its two sweeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pyro.infer import MCMC
from test_split_merge import SIGMA, TAU, Z_MAX, _exact_mean_moments, _exact_patterns, _posterior_terms
from test_split_merge import _posterior_z_scores as posterior_z_scores

from motifs.gmm_pair import gmm_graph
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.graph import FactorGraph
from neuralblock.kernels import adaptation
from neuralblock.kernels.adaptation import GibbsShare, check_schedule, gibbs_prob_for_share, single_site_turn
from neuralblock.kernels.base import sequential_init
from neuralblock.kernels.split_merge import SplitMergeGMM

POINTS = torch.tensor([[-1.5, 0.5], [-1.0, -0.5], [2.0, 1.0]])


def test_the_probability_gives_single_site_sweeps_the_share_of_the_time() -> None:
    for share, single, moves in ((0.5, 0.01, 0.5), (0.2, 0.003, 0.04), (0.9, 1.0, 1.0)):
        p = gibbs_prob_for_share(share, single, moves)
        assert p * single / (p * single + (1 - p) * moves) == pytest.approx(share)
    assert gibbs_prob_for_share(0.0, 1.0, 2.0) == 0.0 and gibbs_prob_for_share(1.0, 1.0, 2.0) == 1.0
    with pytest.raises(ValueError, match="share"):
        gibbs_prob_for_share(1.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="positive and finite"):
        gibbs_prob_for_share(0.5, 0.0, 1.0)


def test_calibration_times_each_sweep_and_keeps_the_least(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]  # a fake clock: each sweep advances it by its cost
    monkeypatch.setattr(adaptation, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    calls: list[str] = []

    def single() -> None:
        calls.append("single")
        clock[0] += 0.002

    def moves() -> None:
        calls.append("moves")
        clock[0] += 0.02 if calls.count("moves") == 1 else 0.01  # the first call loads caches

    share = GibbsShare(0.5, repeats=2)
    p = share.calibrate(single, moves)
    assert calls == ["single", "single", "moves", "moves"]
    assert share.seconds == pytest.approx({"single_site": 0.002, "moves": 0.01})
    assert p == gibbs_prob_for_share(0.5, share.seconds["single_site"], share.seconds["moves"]) and p > 0.5
    for bad in (-0.1, 1.1, float("nan"), 0.0):
        with pytest.raises(ValueError, match="gibbs_share"):
            GibbsShare(bad)
    for wrong in (True, "half"):
        with pytest.raises(TypeError, match="gibbs_share"):
            GibbsShare(wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeats"):
        GibbsShare(0.5, repeats=0)
    with pytest.raises(ValueError, match="gibbs_share"):
        SplitMergeGMM(gmm_graph(POINTS, 3, SIGMA, TAU, 0.5), gibbs_share=2.0)


def _check_calibrated(kernel: NeuralBlockKernel | SplitMergeGMM, share: float) -> None:
    diagnostics = kernel.diagnostics()
    seconds = diagnostics["gibbs_share_seconds"]
    assert diagnostics["gibbs_prob"] == gibbs_prob_for_share(share, seconds["single_site"], seconds["moves"])
    assert 0.0 < diagnostics["gibbs_prob"] < 1.0 and diagnostics["single_site_sweeps"] > 0


def _unit_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed sweep takes one fake second: the calibrated probability is the share (the tolerances assume a
    fixed mixture; a real clock would vary it from run to run)."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(adaptation, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))


def test_neural_blocks_with_a_time_share_keep_the_exact_posterior(monkeypatch: pytest.MonkeyPatch) -> None:
    # the shipped copies proposal and single-site sweeps, mixed by the calibrated probability; tolerances: see
    # test_split_merge.Z_MAX
    _unit_clock(monkeypatch)
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    kernel = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], chains=4, gibbs_share=0.3)
    terms = _posterior_terms(POINTS, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    _check_calibrated(kernel, 0.3)
    assert kernel.diagnostics()["gibbs_prob"] == pytest.approx(0.3)
    assert kernel.diagnostics()["acceptance_by_proposal"]["gmm_pair_set"] > 0.02
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


def test_split_merge_with_a_time_share_keeps_the_exact_posterior(monkeypatch: pytest.MonkeyPatch) -> None:
    _unit_clock(monkeypatch)
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    kernel = SplitMergeGMM(fg, moves_per_sweep=2, chains=4, gibbs_share=0.3)
    terms = _posterior_terms(POINTS, 3, SIGMA, TAU, 0.5)
    z_patterns, z_means = posterior_z_scores(kernel, fg, _exact_patterns(terms), _exact_mean_moments(terms), 600)
    _check_calibrated(kernel, 0.3)
    assert kernel.diagnostics()["gibbs_prob"] == pytest.approx(0.3)
    assert kernel.diagnostics()["acceptance_rate"] > 0.05
    assert z_patterns.abs().max() < Z_MAX, z_patterns
    assert z_means.abs().max() < Z_MAX, z_means


@pytest.mark.parametrize("kind", ["neural", "split-merge"])
def test_calibration_runs_once_per_setup_and_records_nothing(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    if kind == "neural":
        kernel: NeuralBlockKernel | SplitMergeGMM = NeuralBlockKernel(
            fg, [load_pretrained("gmm_pair_copies")], chains=2, gibbs_share=1.0
        )
    else:
        kernel = SplitMergeGMM(fg, chains=2, gibbs_share=1.0)
    assert kernel.diagnostics()["gibbs_prob"] == 0.5 and kernel.diagnostics()["gibbs_share_seconds"] == {}
    share = kernel.share_calibration
    assert share is not None
    calibrate, calls = share.calibrate, []

    def counted(*sweeps: object) -> float:
        calls.append(1)
        return calibrate(*sweeps)  # type: ignore[arg-type]

    monkeypatch.setattr(share, "calibrate", counted)
    start = sequential_init(fg, torch.Generator().manual_seed(0), chains=2)
    kernel.initial_params = {"x": start}
    kernel.setup(0)
    assert calls == [1] and kernel.diagnostics()["gibbs_prob"] == 1.0  # timed at setup, in no transition's time
    params = kernel.sample({"x": start.clone()})
    assert kernel.diagnostics()["gibbs_prob"] == 1.0  # share 1: every transition a single-site sweep
    for _ in range(3):
        params = kernel.sample(params)
    diagnostics = kernel.diagnostics()
    assert calls == [1] and set(diagnostics["gibbs_share_seconds"]) == {"single_site", "moves"}  # timed once
    assert diagnostics["single_site_sweeps"] == 4.0
    if kind == "split-merge":
        assert sum(diagnostics["proposed"].values()) == 0  # the timed sweep of moves counts nowhere
    else:
        assert diagnostics["acceptance_by_proposal"]["gmm_pair_set"] == 0.0
    kernel.setup(0)  # a new run times again
    assert calls == [1, 1]
    kernel.sample({"x": start.clone()})
    assert calls == [1, 1]


def _kernel(kind: str, fg: FactorGraph, **options: float) -> NeuralBlockKernel | SplitMergeGMM:
    if kind == "neural":
        return NeuralBlockKernel(fg, [load_pretrained("gmm_pair_copies")], chains=2, **options)
    return SplitMergeGMM(fg, chains=2, **options)


@pytest.mark.parametrize("kind", ["neural", "split-merge"])
def test_the_timed_sweeps_run_on_copies(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps that change their input in place: only the transition's own sweep reaches the chain's state."""
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    kernel = _kernel(kind, fg, gibbs_share=1.0)  # every transition a single-site sweep
    start = sequential_init(fg, torch.Generator().manual_seed(0), chains=2)
    kernel.initial_params = {"x": start}
    kernel.setup(0)  # builds the sweeps; the patched ones below run in the next setup's timing

    def in_place(fg: FactorGraph, state: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return state.add_(1.0)

    monkeypatch.setattr(kernel.single_site, "sweep", in_place)
    monkeypatch.setattr(kernel, "_neural_sweep" if kind == "neural" else "_split_merge_sweep", in_place)
    monkeypatch.setattr(kernel, "_prepare", lambda fg: setattr(kernel, "_share_pending", True))  # keep the patches
    kernel.initial_params = {"x": start}
    kernel.setup(0)
    assert torch.equal(kernel.initial_params["x"], start)  # 2 timed single-site sweeps and 2 move sweeps: on copies
    live = start.clone()
    kernel._transition(live, warmup=False)
    assert torch.equal(live, start + 1.0)


def test_the_timed_single_site_sweeps_count_no_copy_moves() -> None:
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    start = sequential_init(fg, torch.Generator().manual_seed(0), chains=2)
    tallies = []
    for options in ({"gibbs_prob": 1.0}, {"gibbs_share": 1.0}):
        kernel = _kernel("split-merge", fg, **options)
        kernel.initial_params = {"x": start}
        kernel.setup(0)
        kernel.sample({"x": start.clone()})
        moves = kernel.single_site.copy_moves
        assert moves is not None
        tallies.append(int(moves.tally.sum()))
    assert tallies[0] == tallies[1] > 0  # one sweep's attempts, with or without the two timed sweeps


@pytest.mark.parametrize("prob", [0.0, 0.1, 0.3, 0.5, 0.75, 0.9, 1.0])
def test_the_alternate_schedule_keeps_the_share_evenly_and_draws_nothing(prob: float) -> None:
    state = torch.random.get_rng_state()
    turns = [single_site_turn("alternate", prob, t) for t in range(1000)]
    assert torch.equal(torch.random.get_rng_state(), state)  # no draw of torch's RNG
    assert not turns[0] or prob == 1.0  # the kernel's own sweep first
    for length in (10, 100, 1000):  # every prefix holds floor(length * prob) single-site sweeps
        assert sum(turns[:length]) == int(length * prob + 1e-9)
    random_share = sum(single_site_turn("random", prob, t) for t in range(4000)) / 4000
    assert abs(random_share - prob) < 4 * (prob * (1 - prob) / 4000) ** 0.5 + 1e-12


def test_kernels_refuse_unknown_schedules_and_report_theirs() -> None:
    fg = gmm_graph(POINTS, 3, SIGMA, TAU, 0.5)
    with pytest.raises(ValueError, match="schedule"):
        NeuralBlockKernel(fg, [load_pretrained("gmm_pair_set")], schedule="cyclic")
    with pytest.raises(TypeError, match="schedule"):
        check_schedule(None)
    kernel = SplitMergeGMM(fg, schedule="alternate")
    assert kernel.diagnostics()["schedule"] == "alternate"
    assert NeuralBlockKernel(fg, [load_pretrained("gmm_pair_set")]).diagnostics()["schedule"] == "random"
    neural = NeuralBlockKernel(fg, [load_pretrained("gmm_pair_set")], schedule="alternate")
    for _ in range(2):  # each run's schedule starts again at its setup: the neural sweep first
        MCMC(neural, num_samples=3, warmup_steps=2, disable_progbar=True).run()
        assert neural._turns == 5 and neural.diagnostics()["single_site_sweeps"] == 1  # turn 3 (turn 1 is a warmup one)
