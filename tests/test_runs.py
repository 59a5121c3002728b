"""The timed-run harness: the two meanings of first_time, traces, budgets, and what each clock reading counts."""

from __future__ import annotations

import math
import time

import pytest
import torch

from neuralblock import FactorGraph, GibbsKernel
from neuralblock.diagnostics import marginal_error
from neuralblock.diagnostics import runs as runs_module
from neuralblock.diagnostics.runs import (
    CLOCKS,
    ErrorTrace,
    equal_time,
    error_at,
    first_time,
    marginal_error_run,
    timed_call,
    timed_run,
)

# -- first_time on hand-built traces ---------------------------------------------------------------


def test_first_hit_and_for_good_differ_when_the_error_comes_back_up() -> None:
    trace = ErrorTrace([1.0, 2.0, 3.0, 4.0, 5.0], [0.9, 0.1, 0.5, 0.2, 0.15])
    assert first_time(trace, 0.2, for_good=False) == 2.0
    assert first_time(trace, 0.2, for_good=True) == 4.0
    assert first_time(trace, 0.5, for_good=True) == 2.0  # 0.5 itself is at the level


def test_never_reached_is_none_in_both_modes() -> None:
    trace = ErrorTrace([1.0, 2.0], [0.3, 0.2])
    assert first_time(trace, 0.1, for_good=False) is None
    assert first_time(trace, 0.1, for_good=True) is None
    # hit once, but the last point is above: never reached for good
    bounced = ErrorTrace([1.0, 2.0, 3.0], [0.3, 0.05, 0.2])
    assert first_time(bounced, 0.1, for_good=False) == 2.0
    assert first_time(bounced, 0.1, for_good=True) is None


def test_reached_at_the_first_point() -> None:
    trace = ErrorTrace([0.5, 1.0, 2.0], [0.01, 0.02, 0.03])
    assert first_time(trace, 0.05, for_good=False) == 0.5
    assert first_time(trace, 0.05, for_good=True) == 0.5
    assert first_time(trace, 0.015, for_good=False) == 0.5
    assert first_time(trace, 0.015, for_good=True) is None


def test_ties_count_as_reached_and_equal_times_are_allowed() -> None:
    trace = ErrorTrace([1.0, 2.0, 2.0, 3.0], [0.4, 0.3, 0.2, 0.2])
    assert first_time(trace, 0.2, for_good=False) == 2.0  # the second point recorded at 2.0
    assert first_time(trace, 0.2, for_good=True) == 2.0
    assert first_time(trace, 0.3, for_good=False) == 2.0
    assert first_time(ErrorTrace([1.0], [0.2]), 0.2, for_good=True) == 1.0


def test_nan_errors_count_as_above_every_level() -> None:
    trace = ErrorTrace([1.0, 2.0, 3.0], [0.1, math.nan, 0.1])
    assert first_time(trace, 0.2, for_good=False) == 1.0
    assert first_time(trace, 0.2, for_good=True) == 3.0
    assert first_time(ErrorTrace([1.0], [math.nan]), 1e9, for_good=False) is None


def test_first_time_reads_json_dicts_and_rejects_bad_input() -> None:
    assert first_time({"seconds": [1.0, 2.0], "errors": [0.5, 0.1]}, 0.2, for_good=True) == 2.0
    with pytest.raises(ValueError, match="empty"):
        first_time(ErrorTrace([], []), 0.1, for_good=False)
    for level in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            first_time(ErrorTrace([1.0], [0.1]), level, for_good=True)
    with pytest.raises(TypeError):
        first_time(ErrorTrace([1.0], [0.1]), 0.1)  # type: ignore[call-arg]  # the mode has no default
    with pytest.raises(TypeError, match="ErrorTrace"):
        first_time([1.0, 0.1], 0.1, for_good=True)  # type: ignore[arg-type]


def test_error_trace_validates_and_error_at_reads_the_last_point_before() -> None:
    with pytest.raises(ValueError, match="one error per time"):
        ErrorTrace([1.0, 2.0], [0.1])
    with pytest.raises(ValueError, match="non-decreasing"):
        ErrorTrace([2.0, 1.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        ErrorTrace([math.nan], [0.1])
    with pytest.raises(ValueError, match="sweeps"):
        ErrorTrace([1.0], [0.1], sweeps=[1, 2])
    trace = ErrorTrace([1.0, 2.0, 4.0], [0.5, 0.2, 0.1], sweeps=[1, 2, 4])
    assert ErrorTrace.of(trace.as_dict()) == trace
    assert [error_at(trace, t) for t in (0.5, 1.0, 3.9, 4.0, 10.0)] == [0.5, 0.5, 0.2, 0.1, 0.1]
    with pytest.raises(ValueError, match="empty"):
        error_at(ErrorTrace([], []), 1.0)


def test_equal_time_reads_same_budget_runs_at_their_last_points() -> None:
    # both stopped on a 4 s budget; the slower sampler's last step ended later, past its 3.9 s point
    fast = ErrorTrace([0.5, 3.9, 4.001], [0.5, 0.3, 0.29])
    slow = ErrorTrace([0.5, 2.0, 4.2], [0.4, 0.3, 0.1])
    same = equal_time([fast, slow], same_budget=True)
    assert same == 4.2 and [error_at(t, same) for t in (fast, slow)] == [0.29, 0.1]
    other = equal_time([fast, slow], same_budget=False)  # e.g. sample budgets: the shorter run's end
    assert other == 4.001 and [error_at(t, other) for t in (fast, slow)] == [0.29, 0.3]
    with pytest.raises(ValueError, match="empty"):
        equal_time([fast, ErrorTrace([], [])], same_budget=True)
    with pytest.raises(ValueError, match="at least one"):
        equal_time([], same_budget=False)


# -- timed_run with a fake clock: what each reading counts ------------------------------------------


class FakeClock:
    """A clock that only the simulated work advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingKernel:
    """A Pyro-style kernel whose setup costs 5 s and each step 1 s of the fake clock; it records its calls."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.calls = clock, []
        self.initial_params = {"x": torch.zeros(())}

    def setup(self, warmup_steps: int, *args: object, **kwargs: object) -> None:
        self.calls.append(("setup", warmup_steps, float(self.initial_params["x"]), *args, *kwargs.items()))
        self.clock.now += 5.0

    def sample(self, params: dict) -> dict:
        self.clock.now += 1.0
        return {"x": params["x"] + 1}

    def diagnostics(self) -> dict:
        self.calls.append(("diagnostics",))
        return {"acceptance": 1.0}

    def cleanup(self) -> None:
        self.calls.append(("cleanup",))


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setitem(CLOCKS, "wall", clock)
    return clock


def test_setup_warmup_and_sampling_are_timed_apart(fake_clock: FakeClock) -> None:
    kernel = CountingKernel(fake_clock)

    def slow_error(params: dict) -> float:  # bookkeeping is never timed
        fake_clock.now += 100.0
        return 1.0 / float(params["x"])

    run = timed_run(
        kernel, samples=6, warmup=3, initial_params={"x": torch.tensor(10.0)}, error=slow_error, checkpoints=6
    )
    assert kernel.calls == [("setup", 3, 10.0), ("diagnostics",), ("cleanup",)]  # start set before setup
    assert (run.setup_s, run.warmup_s, run.sampling_s, run.total_s) == (5.0, 3.0, 6.0, 14.0)
    assert run.times == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert (run.samples, run.warmup_steps, run.steps, run.stopped) == (6, 3, 9, "samples")
    assert float(run.params["x"]) == 19.0 and run.diagnostics == {"acceptance": 1.0}
    assert run.trace.sweeps[0] == 1 and run.trace.sweeps[-1] == 6
    assert run.trace.errors[0] == 1 / 14 and run.trace.seconds == tuple(float(s) for s in run.trace.sweeps)
    assert run.summary()["stopped"] == "samples" and run.draws is None


def test_total_times_count_setup_and_warmup_before_each_draw(fake_clock: FakeClock) -> None:
    run = timed_run(CountingKernel(fake_clock), samples=3, warmup=2)
    assert run.times == (1.0, 2.0, 3.0) and run.total_times == (8.0, 9.0, 10.0) and run.total_times[-1] == run.total_s


def test_timed_call_returns_the_result_and_the_seconds_on_the_clock(fake_clock: FakeClock) -> None:
    assert timed_call(_advance, fake_clock, 4, seconds=2.5) == (5, 2.5)
    assert timed_call(lambda: None, clock="cpu")[1] >= 0.0
    with pytest.raises(ValueError, match="clock must be one of"):
        timed_call(lambda: None, clock="gpu")  # type: ignore[arg-type]


def test_seconds_budget_stops_at_the_draw_that_reaches_it(fake_clock: FakeClock) -> None:
    run = timed_run(lambda x: _advance(fake_clock, x, 0.3), initial_params=0, seconds=1.0, warmup=2)
    assert run.stopped == "seconds" and run.samples == 4  # 0.3, 0.6, 0.9, 1.2
    assert run.setup_s == 0.0 and run.warmup_s == pytest.approx(0.6)
    assert run.times[-1] == pytest.approx(1.2) and run.times[-2] < 1.0
    # samples and seconds together: whichever comes first
    both = timed_run(lambda x: _advance(fake_clock, x, 0.3), initial_params=0, seconds=1.0, samples=2)
    assert both.stopped == "samples" and both.samples == 2


def test_cap_counts_setup_and_warmup_and_can_stop_the_warmup(fake_clock: FakeClock) -> None:
    run = timed_run(CountingKernel(fake_clock), samples=100, warmup=10, cap_seconds=8.0)
    assert run.stopped == "cap" and run.warmup_steps == 3 and run.samples == 0
    assert run.times == () and len(run.trace) == 0 and run.total_s == 8.0
    run = timed_run(CountingKernel(fake_clock), samples=100, warmup=1, cap_seconds=9.0, keep=lambda p: p["x"])
    assert run.stopped == "cap" and run.samples == 3 and run.draws.tolist() == [2.0, 3.0, 4.0]


def test_min_samples_holds_off_the_seconds_and_cap_stops(fake_clock: FakeClock) -> None:
    run = timed_run(lambda x: _advance(fake_clock, x, 0.3), initial_params=0, seconds=1.0, min_samples=7)
    assert run.stopped == "seconds" and run.samples == 7 and run.times[-1] == pytest.approx(2.1)
    run = timed_run(CountingKernel(fake_clock), samples=100, warmup=1, cap_seconds=9.0, min_samples=5)
    assert run.stopped == "cap" and run.samples == 5  # setup 5 s + warmup 1 s: the cap alone stops at 3 draws
    # a floor below what the budget makes changes nothing
    run = timed_run(lambda x: _advance(fake_clock, x, 0.3), initial_params=0, seconds=1.0, min_samples=2)
    assert run.stopped == "seconds" and run.samples == 4


def test_seconds_budget_checkpoints_are_log_spaced_in_time_and_end_at_the_last_draw(fake_clock: FakeClock) -> None:
    run = timed_run(
        lambda x: _advance(fake_clock, x, 0.25), initial_params=0, seconds=16.0, error=lambda x: 1.0, checkpoints=5
    )
    # grid 0.25, 0.71, 2, 5.66, 16 s: the first draws at or after each
    assert run.trace.sweeps == (1, 3, 8, 23, 64)
    assert run.samples == 64 and run.trace.seconds[-1] == 16.0


def test_observe_sees_every_draw_before_error_reads_it(fake_clock: FakeClock) -> None:
    seen: list[int] = []
    run = timed_run(
        lambda x: _advance(fake_clock, x, 1.0),
        initial_params=0,
        samples=10,
        warmup=2,
        observe=seen.append,
        error=lambda x: float(len(seen)),
        checkpoints=3,
    )
    assert seen == list(range(3, 13))  # warmup draws are not observed
    assert run.trace.errors == tuple(float(n) for n in run.trace.sweeps)


def test_the_cpu_clock_is_process_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CLOCKS["wall"] is time.perf_counter and CLOCKS["cpu"] is time.process_time
    clock = FakeClock()
    monkeypatch.setitem(CLOCKS, "cpu", clock)
    run = timed_run(lambda x: _advance(clock, x, 2.0), initial_params=0, samples=2, clock="cpu")
    assert run.clock == "cpu" and run.times == (2.0, 4.0)


def _advance(clock: FakeClock, x: int, seconds: float) -> int:
    clock.now += seconds
    return x + 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, "budget"),
        ({"samples": 0}, "samples"),
        ({"samples": 2.5}, "samples"),
        ({"seconds": -1.0}, "seconds"),
        ({"seconds": math.nan}, "seconds"),
        ({"seconds": math.inf}, "seconds"),
        ({"samples": 5, "warmup": -1}, "warmup"),
        ({"samples": 5, "cap_seconds": 0.0}, "cap_seconds"),
        ({"samples": 5, "cap_seconds": math.nan}, "cap_seconds"),
        ({"samples": 5, "checkpoints": 0}, "checkpoints"),
        ({"samples": 5, "clock": "gpu"}, "clock"),
        ({"seconds": 1.0, "min_samples": -1}, "min_samples"),
        ({"seconds": 1.0, "min_samples": True}, "min_samples"),
        ({"samples": 5, "min_samples": 6}, "min_samples"),
    ],
)
def test_bad_budgets_are_refused(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        timed_run(lambda x: x, initial_params=0, **kwargs)


def test_bad_kernels_are_refused() -> None:
    with pytest.raises(TypeError, match="step function"):
        timed_run(42, samples=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initial_params"):
        timed_run(lambda x: x, samples=1)
    with pytest.raises(TypeError, match="model_args"):
        timed_run(lambda x: x, initial_params=0, samples=1, model_args=(1,))


def test_model_arguments_reach_the_kernels_setup(fake_clock: FakeClock) -> None:
    kernel = CountingKernel(fake_clock)
    timed_run(kernel, samples=1, model_args=("data",), model_kwargs={"n": 3})
    assert kernel.calls[0] == ("setup", 0, 0.0, "data", ("n", 3))


# -- a real kernel ----------------------------------------------------------------------------------


def test_marginal_error_run_traces_the_error_of_all_draws_so_far() -> None:
    fg = FactorGraph()
    fg.add_variables(3, cardinality=2)
    fg.add_table_factor([0, 1], torch.tensor([[2.0, 1.0], [1.0, 2.0]]).log())
    exact = torch.tensor([[0.5, 0.5]] * 3)
    torch.manual_seed(0)
    run = marginal_error_run(
        GibbsKernel(fg, chains=4), fg, exact, samples=300, warmup=5, checkpoints=10, keep=lambda p: p["x"]
    )
    assert run.draws.shape == (300, 4, 3) and run.trace.sweeps[-1] == 300
    assert run.trace.errors[-1] == pytest.approx(marginal_error(run.draws, fg, exact), abs=1e-6)
    assert run.trace.errors[-1] < 0.1  # 1200 pooled draws of fair bits; a stuck chain stays at 0.5
    assert run.diagnostics and run.setup_s > 0 and run.warmup_s > 0 and run.sampling_s == run.times[-1]
    with pytest.raises(TypeError, match="sets observe and error"):
        marginal_error_run(GibbsKernel(fg), fg, exact, samples=2, error=lambda p: 0.0)


def test_the_module_reexports_study_folder(tmp_path) -> None:
    a = runs_module.study_folder(tmp_path, {"seed": 0, "quick": True})
    assert a == runs_module.study_folder(tmp_path, {"quick": True, "seed": 0}) and a.is_dir()


def test_a_pyro_hmc_kernel_on_a_model_with_data_runs_through_the_harness() -> None:
    import pyro
    import pyro.distributions as dist
    from pyro.infer.mcmc import HMC

    def model(data: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=data)

    pyro.set_rng_seed(0)
    data = 3.0 + torch.randn(100)
    kernel = HMC(model, step_size=0.1, num_steps=4, adapt_step_size=False)
    run = timed_run(kernel, samples=200, warmup=50, model_args=(data,), keep=lambda p: p["mu"])
    # posterior about N(mean(data), 0.1^2): the mean of 200 correlated HMC draws lands 0.007-0.088 from mean(data)
    # (seeds 0-5); 0.3 is loose for that, yet a chain that never left its start (uniform in (-2, 2)) or a model
    # run without its data (prior mean 0) is about 3 away
    assert run.samples == 200 and run.warmup_steps == 50 and run.setup_s > 0 and run.warmup_s > 0
    assert abs(float(run.draws.mean()) - float(data.mean())) < 0.3, float(run.draws.mean())


def _binary_graph(n: int) -> tuple[FactorGraph, torch.Tensor]:
    fg = FactorGraph()
    fg.add_variables(n, cardinality=2)
    return fg, torch.full((n, 2), 0.5)


def test_thinned_ess_of_independent_draws_is_all_kept_draws() -> None:
    """Independent fair bits: the ESS is the number of kept draws (8 chains x 125), up to estimation noise."""
    from neuralblock.diagnostics import RunningMarginals

    fg, exact = _binary_graph(40)
    counts = RunningMarginals(fg, exact, thin_to=100)
    gen = torch.Generator().manual_seed(0)
    for _ in range(1000):
        counts(torch.randint(0, 2, (8, 40), generator=gen))
    assert counts.stride == 8 and len(counts._kept) == 125  # 1000 draws thinned by doubling
    assert counts.ess() == pytest.approx(1000, rel=0.15)


def test_thinned_ess_of_stuck_chains_is_about_the_number_of_chains() -> None:
    from neuralblock.diagnostics import RunningMarginals

    fg, exact = _binary_graph(40)
    counts = RunningMarginals(fg, exact, thin_to=50)
    state = torch.randint(0, 2, (8, 40), generator=torch.Generator().manual_seed(1))
    for _ in range(400):
        counts(state)
    ess = counts.ess()
    assert ess is not None and ess < 16


def test_thinned_ess_of_a_sticky_chain_matches_its_autocorrelation_time() -> None:
    """Each bit is redrawn with probability 0.02 per step: lag-1 autocorrelation 0.98, so the integrated
    autocorrelation time is (1 + 0.98) / (1 - 0.98) = 99 steps (thinning keeps draws 16-32 steps apart)."""
    from neuralblock.diagnostics import RunningMarginals

    fg, exact = _binary_graph(40)
    counts = RunningMarginals(fg, exact, thin_to=200)
    gen = torch.Generator().manual_seed(2)
    state = torch.randint(0, 2, (8, 40), generator=gen)
    for _ in range(6000):
        redraw = torch.rand(8, 40, generator=gen) < 0.02
        state = torch.where(redraw, torch.randint(0, 2, (8, 40), generator=gen), state)
        counts(state)
    assert counts.ess() == pytest.approx(8 * 6000 / 99, rel=0.15)


def test_ess_needs_thinned_draws_and_says_so() -> None:
    from neuralblock.diagnostics import RunningMarginals

    fg, exact = _binary_graph(2)
    with pytest.raises(ValueError, match="thin_to"):
        RunningMarginals(fg, exact).ess()
    with pytest.raises(ValueError, match="thin_to"):
        RunningMarginals(fg, exact, thin_to=-1)
    counts = RunningMarginals(fg, exact, thin_to=10)
    counts(torch.zeros(2))
    assert counts.ess() is None  # too few draws


def test_ess_leaves_out_deterministic_variables_but_counts_frozen_ones() -> None:
    from neuralblock.diagnostics import RunningMarginals, kept_draws

    fg, _ = _binary_graph(6)
    exact = torch.tensor([[0.5, 0.5]] * 3 + [[1.0, 0.0]] * 3)  # variables 3-5 are deterministic
    counts = RunningMarginals(fg, exact, thin_to=50)
    gen = torch.Generator().manual_seed(3)
    frozen = torch.randint(0, 2, (8, 1), generator=gen)
    for _ in range(300):
        moving = torch.randint(0, 2, (8, 2), generator=gen)
        counts(torch.cat([frozen, moving, torch.zeros(8, 3, dtype=torch.long)], 1))
    assert counts.ess_cap() == 8 * kept_draws(300, 50) == 8 * len(counts._kept)
    ess = counts.ess()  # the median of one frozen (about 4) and two independent variables (about 8 x 150)
    assert ess is not None and ess > 0.5 * counts.ess_cap()
    with pytest.raises(ValueError, match=">= 8"):
        RunningMarginals(fg, exact, thin_to=3)


def test_nearly_deterministic_variables_do_not_drag_the_ess_down() -> None:
    from neuralblock.diagnostics import RunningMarginals

    fg, _ = _binary_graph(3)
    exact = torch.tensor([[0.5, 0.5], [1 - 1e-9, 1e-9], [1 - 1e-9, 1e-9]])  # two variables almost always 0
    counts = RunningMarginals(fg, exact, thin_to=100)
    gen = torch.Generator().manual_seed(4)
    for _ in range(150):  # exact iid draws: the rare values never show
        counts(torch.cat([torch.randint(0, 2, (4, 1), generator=gen), torch.zeros(4, 2, dtype=torch.long)], 1))
    ess = counts.ess()
    assert ess is not None and ess > 0.5 * counts.ess_cap()
