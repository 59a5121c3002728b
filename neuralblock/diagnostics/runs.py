"""The one timed-run harness: budgets, one clock, error-vs-time traces and first times.

Every study and the quickstart time their samplers through :func:`timed_run`, so their times
mean the same thing:

* **Clock.** One run reads one clock for everything it records, chosen by the single option
  ``clock``: ``"wall"`` (the default) is ``time.perf_counter``, elapsed real time;
  ``"cpu"`` is ``time.process_time``, the CPU time of this process (all its threads), which
  other processes on a shared machine do not inflate. When CUDA is in use the harness
  synchronizes the device before each reading.
* **What is timed.** ``setup_s`` is the kernel's ``setup()`` call, ``warmup_s`` its warmup
  steps, and the sampling times (``TimedRun.times``, the trace's ``seconds``) count only the
  post-warmup ``sample()`` calls, from zero (``TimedRun.total_times`` adds setup and warmup: the
  time since the run began). The harness's own bookkeeping (``observe``, ``keep`` and ``error``
  calls) is never timed.
* **Budget.** ``samples`` post-warmup draws, or ``seconds`` of sampling time (the run stops
  at the first draw whose cumulative sampling time reaches it), whichever comes first;
  ``cap_seconds`` also stops the run, during warmup too, once setup + warmup + sampling time
  reaches it. Every budget is checked after a step, so a run makes at least one step (one warmup
  step, or one draw without warmup) even when setup alone exceeds the cap. ``min_samples`` holds off the
  ``seconds`` and cap stops of the sampling phase until that many draws are made (a floor that keeps a
  short budget's diagnostics from resting on a handful of draws on a loaded machine).

:func:`timed_call` times one call (a fit, a sweep) on the same clock.
:func:`first_time` reads a trace in one of two stated modes (first hit, or reached for good),
:func:`error_at` reads a trace at a time, :func:`equal_time` says when runs compare at equal
time, and studies name their output folders with
:func:`study_folder` (a hash of the configuration with sorted keys).

Example:
    >>> import torch
    >>> from neuralblock import FactorGraph, GibbsKernel
    >>> fg = FactorGraph(); _ = fg.add_variables(3, cardinality=2)
    >>> run = marginal_error_run(GibbsKernel(fg), fg, torch.full((3, 2), 0.5), samples=200, warmup=10)
    >>> run.samples, run.warmup_steps, run.trace.sweeps[-1], run.stopped
    (200, 10, 200, 'samples')
    >>> first_time(run.trace, 1.0, for_good=True) == run.trace.seconds[0]  # errors are at most 1
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

import torch
from torch import Tensor
from tqdm import tqdm

from neuralblock.diagnostics import RunningMarginals, log_spaced_counts
from neuralblock.diagnostics.reports import study_folder
from neuralblock.graph import FactorGraph

__all__ = [
    "CLOCKS",
    "ClockName",
    "ErrorTrace",
    "KernelLike",
    "TimedRun",
    "equal_time",
    "error_at",
    "first_time",
    "marginal_error_run",
    "study_folder",
    "timed_call",
    "timed_run",
]

ClockName = Literal["wall", "cpu"]
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
Params = Mapping[str, Tensor]
T = TypeVar("T")


@runtime_checkable
class KernelLike(Protocol):
    """What the harness needs of a Pyro-style kernel (``pyro.infer.mcmc.MCMCKernel`` has it).

    After ``setup`` the kernel's ``initial_params`` is the starting state, as for ``pyro.infer.MCMC``.
    """

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None: ...

    def sample(self, params: Any) -> Any: ...


class _StartedKernel(KernelLike, Protocol):
    """A :class:`KernelLike` with ``initial_params`` (static typing only: a runtime check would read the property,
    which kernels raise on before ``setup``)."""

    initial_params: Any


@dataclass(frozen=True)
class ErrorTrace:
    """An error-vs-time trace: ``errors[i]`` was recorded at ``seconds[i]``, after ``sweeps[i]`` draws.

    ``errors`` may be any quantity where lower is better (negate a log joint to trace it).
    ``seconds`` must be finite and non-decreasing; ``sweeps`` is optional (empty, or one per point).

    Example:
        >>> trace = ErrorTrace([0.1, 0.5], [0.3, 0.1], sweeps=[1, 5])
        >>> trace.as_dict()
        {'sweeps': [1, 5], 'seconds': [0.1, 0.5], 'errors': [0.3, 0.1]}
        >>> ErrorTrace.of({"seconds": [1.0], "errors": [2.0]}) == ErrorTrace((1.0,), (2.0,))
        True
    """

    seconds: Sequence[float]
    errors: Sequence[float]
    sweeps: Sequence[int] = ()

    def __post_init__(self) -> None:
        seconds = tuple(float(t) for t in self.seconds)
        errors = tuple(float(e) for e in self.errors)
        sweeps = tuple(int(s) for s in self.sweeps)
        if len(seconds) != len(errors):
            raise ValueError(f"a trace needs one error per time, got {len(seconds)} times and {len(errors)} errors")
        if sweeps and len(sweeps) != len(seconds):
            raise ValueError(f"sweeps must be empty or one per time, got {len(sweeps)} for {len(seconds)} times")
        if not all(math.isfinite(t) for t in seconds):
            raise ValueError("trace times must be finite")
        if any(b < a for a, b in zip(seconds, seconds[1:])):
            raise ValueError("trace times must be non-decreasing")
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "errors", errors)
        object.__setattr__(self, "sweeps", sweeps)

    def __len__(self) -> int:
        return len(self.seconds)

    @classmethod
    def of(cls, trace: ErrorTrace | Mapping[str, Sequence[float]]) -> ErrorTrace:
        """The trace itself, or one read from a JSON-style dict with ``seconds``, ``errors`` (and ``sweeps``)."""
        if isinstance(trace, ErrorTrace):
            return trace
        if isinstance(trace, Mapping):
            return cls(trace["seconds"], trace["errors"], [int(s) for s in trace.get("sweeps", ())])
        raise TypeError(f"expected an ErrorTrace or a dict with 'seconds' and 'errors', got {type(trace).__name__}")

    def as_dict(self) -> dict[str, list]:
        """JSON-ready lists under the keys ``sweeps``, ``seconds``, ``errors``."""
        return {"sweeps": list(self.sweeps), "seconds": list(self.seconds), "errors": list(self.errors)}


@dataclass
class TimedRun:
    """What :func:`timed_run` measured. All times in seconds of ``clock``.

    Attributes:
        clock: ``"wall"`` or ``"cpu"``.
        setup_s: the kernel's ``setup()`` (0 for a step function).
        warmup_s: the warmup steps.
        sampling_s: the post-warmup steps (``times[-1]``, 0 without draws).
        warmup_steps: warmup steps done (fewer than asked if ``cap_seconds`` stopped the run).
        samples: post-warmup draws done.
        stopped: what ended the run: ``"samples"``, ``"seconds"`` or ``"cap"``.
        times: cumulative sampling time at each post-warmup draw.
        trace: ``error`` at the checkpoints (empty without ``error``).
        draws: ``keep(params)`` of every post-warmup draw, stacked (``None`` without ``keep``).
        params: the last state.
        diagnostics: the kernel's ``diagnostics()`` at the end (empty for a step function).
    """

    clock: str
    setup_s: float
    warmup_s: float
    sampling_s: float
    warmup_steps: int
    samples: int
    stopped: str
    times: tuple[float, ...]
    trace: ErrorTrace
    draws: Tensor | None = None
    params: Any = None
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        """Setup + warmup + sampling time."""
        return self.setup_s + self.warmup_s + self.sampling_s

    @property
    def total_times(self) -> tuple[float, ...]:
        """Setup + warmup + sampling time at each post-warmup draw: the time since the run began."""
        return tuple(self.setup_s + self.warmup_s + t for t in self.times)

    @property
    def steps(self) -> int:
        """Warmup steps + post-warmup draws."""
        return self.warmup_steps + self.samples

    def summary(self) -> dict[str, Any]:
        """The scalar fields as a JSON-ready dict (no draws, times or state)."""
        keys = ("clock", "setup_s", "warmup_s", "sampling_s", "warmup_steps", "samples", "stopped")
        return {k: getattr(self, k) for k in keys}


def _tick(clock: Callable[[], float]) -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return clock()


def _clock(clock: ClockName) -> Callable[[], float]:
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    return CLOCKS[clock]


def timed_call(fn: Callable[..., T], *args: Any, clock: ClockName = "wall", **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and the seconds it took on ``clock`` (read as :func:`timed_run` reads it).

    For one-off work a study times beside its runs (a fit, one part of a Gibbs cycle).

    Example:
        >>> timed_call(sorted, [3, 1, 2])[0]
        [1, 2, 3]
    """
    read = _clock(clock)
    start = _tick(read)
    result = fn(*args, **kwargs)
    return result, _tick(read) - start


def _check_budget(
    samples: int | None, seconds: float | None, warmup: int, cap_seconds: float, checkpoints: int, min_samples: int
) -> None:
    if samples is None and seconds is None:
        raise ValueError("give a budget: samples, seconds or both")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be positive and finite, got {seconds!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not cap_seconds > 0:  # inf allowed, NaN rejected
        raise ValueError(f"cap_seconds must be positive, got {cap_seconds!r}")
    if isinstance(checkpoints, bool) or not isinstance(checkpoints, int) or checkpoints < 1:
        raise ValueError(f"checkpoints must be a positive integer, got {checkpoints!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 0:
        raise ValueError(f"min_samples must be a non-negative integer, got {min_samples!r}")
    if samples is not None and min_samples > samples:
        raise ValueError(f"min_samples ({min_samples}) exceeds samples ({samples})")


def timed_run(
    kernel: KernelLike | Callable[[Any], Any],
    *,
    samples: int | None = None,
    seconds: float | None = None,
    warmup: int = 0,
    cap_seconds: float = math.inf,
    min_samples: int = 0,
    clock: ClockName = "wall",
    initial_params: Any = None,
    model_args: tuple = (),
    model_kwargs: Mapping[str, Any] | None = None,
    observe: Callable[[Any], None] | None = None,
    keep: Callable[[Any], Tensor] | None = None,
    error: Callable[[Any], float] | None = None,
    checkpoints: int = 40,
    progress: bool | str = False,
) -> TimedRun:
    """Run a kernel (or a step function) for a budget, timing setup, warmup and sampling apart.

    The kernel is driven through the calls ``pyro.infer.MCMC`` makes for one chain: ``initial_params``
    (if given) is set before ``setup(warmup, *model_args, **model_kwargs)``; then ``sample(params)`` repeatedly; then
    ``diagnostics()`` and ``cleanup()`` where the kernel has them. A step function ``params -> params``
    needs ``initial_params`` and has no setup. See the module docstring for the clock and the budget.

    Args:
        kernel: a Pyro-style kernel (:class:`KernelLike`) or a step function.
        samples: post-warmup draws to make (at most).
        seconds: sampling time to spend (at least; the run stops at the draw that reaches it).
        warmup: warmup steps (untimed in ``times``, recorded in ``warmup_s``).
        cap_seconds: stop (even in warmup) once setup + warmup + sampling time reaches this (checked after
            each step: at least one step runs).
        min_samples: draws to make before ``seconds`` or ``cap_seconds`` may stop the sampling phase.
        clock: ``"wall"`` (``time.perf_counter``) or ``"cpu"`` (``time.process_time``).
        initial_params: the starting state.
        model_args: positional arguments of a Pyro model, passed to ``setup`` (as ``MCMC.run(*args)`` does).
        model_kwargs: keyword arguments of a Pyro model, passed to ``setup``.
        observe: called with every post-warmup draw (e.g. to accumulate counts).
        keep: maps every post-warmup draw to a tensor; the results are stacked into ``draws``.
        error: maps the current draw to a float at the checkpoints (after ``observe`` saw it).
        checkpoints: about how many checkpoints: log-spaced in draws up to ``samples`` when it is
            given, otherwise log-spaced in time from the first draw to ``seconds``; the last draw
            is always one.
        progress: show a progress bar (a string is its label).

    Returns:
        A :class:`TimedRun`.

    Raises:
        ValueError: no budget, or a negative, zero or non-finite one.
        TypeError: ``kernel`` is neither a kernel nor callable.

    Example:
        >>> run = timed_run(lambda x: x + 1, initial_params=0, samples=5, keep=lambda x: torch.tensor(x),
        ...                 error=lambda x: 1.0 / x, checkpoints=3)
        >>> run.draws.tolist(), run.trace.sweeps, run.trace.errors
        ([1, 2, 3, 4, 5], (1, 2, 5), (1.0, 0.5, 0.2))
    """
    _check_budget(samples, seconds, warmup, cap_seconds, checkpoints, min_samples)
    read = _clock(clock)
    is_kernel = isinstance(kernel, KernelLike)
    if not is_kernel and not callable(kernel):
        raise TypeError(f"kernel must be a Pyro-style kernel (setup, sample) or a step function, got {kernel!r}")
    if not is_kernel and initial_params is None:
        raise ValueError("a step function needs initial_params")
    if not is_kernel and (model_args or model_kwargs):
        raise TypeError("model_args and model_kwargs are for a kernel's setup; a step function has none")

    setup_s = 0.0
    step: Callable[[Any], Any]
    if isinstance(kernel, KernelLike):  # is_kernel
        started = cast(_StartedKernel, kernel)  # Pyro-style kernels have initial_params (as pyro.infer.MCMC reads)
        if initial_params is not None:
            started.initial_params = initial_params
        _, setup_s = timed_call(lambda: started.setup(warmup, *model_args, **dict(model_kwargs or {})), clock=clock)
        params = started.initial_params
        step = started.sample
    else:
        params, step = initial_params, kernel

    warmup_s, warmup_done, stopped = 0.0, 0, ""
    for _ in range(warmup):
        start = _tick(read)
        params = step(params)
        warmup_s += _tick(read) - start
        warmup_done += 1
        if setup_s + warmup_s >= cap_seconds:
            stopped = "cap"
            break

    by_draws = set(log_spaced_counts(samples, checkpoints)) if samples is not None else set()
    next_time = 0  # index into the time grid (seconds budget only)
    time_grid: list[float] = []
    times: list[float] = []
    kept: list[Tensor] = []
    points: tuple[list[float], list[float], list[int]] = ([], [], [])
    elapsed = 0.0
    label = progress if isinstance(progress, str) else None
    by_time = samples is None  # a seconds budget: the bar counts seconds, shown to a tenth
    bar = tqdm(
        total=seconds if by_time else samples,
        unit="s" if by_time else "draw",
        desc=label,
        disable=not progress,
        leave=False,
        bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]" if by_time else None,
    )
    with bar:
        while not stopped:
            start = _tick(read)
            params = step(params)
            took = _tick(read) - start
            elapsed += took
            times.append(elapsed)
            n = len(times)
            bar.update(min(took, max(seconds - bar.n, 0.0)) if by_time and seconds is not None else 1)
            if samples is not None and n >= samples:
                stopped = "samples"
            elif n < min_samples:
                pass
            elif seconds is not None and elapsed >= seconds:
                stopped = "seconds"
            elif setup_s + warmup_s + elapsed >= cap_seconds:
                stopped = "cap"
            if observe is not None:
                observe(params)
            if keep is not None:
                kept.append(keep(params).detach())
            if error is None:
                continue
            if samples is None and not time_grid:  # seconds budget: log-spaced times from the first draw
                first = max(elapsed, 1e-9)
                last = max(seconds or first, first)
                time_grid = [first * (last / first) ** (k / max(checkpoints - 1, 1)) for k in range(checkpoints)]
            due = n in by_draws or bool(stopped)
            while next_time < len(time_grid) and elapsed >= time_grid[next_time] * (1 - 1e-9):
                due, next_time = True, next_time + 1
            if due:
                points[0].append(elapsed)
                points[1].append(float(error(params)))
                points[2].append(n)

    diagnostics: dict[str, Any] = {}
    if is_kernel:
        diagnostics = dict(getattr(kernel, "diagnostics", dict)() or {})
        cleanup = getattr(kernel, "cleanup", None)
        if cleanup is not None:
            cleanup()
    return TimedRun(
        clock=clock,
        setup_s=setup_s,
        warmup_s=warmup_s,
        sampling_s=elapsed,
        warmup_steps=warmup_done,
        samples=len(times),
        stopped=stopped,
        times=tuple(times),
        trace=ErrorTrace(*points),
        draws=torch.stack(kept) if keep is not None and kept else None,
        params=params,
        diagnostics=diagnostics,
    )


def marginal_error_run(kernel: KernelLike, fg: FactorGraph, exact: Tensor, **budget: Any) -> TimedRun:
    """:func:`timed_run` tracing the mean absolute marginal error of all draws so far (chains pooled).

    Args:
        kernel: a kernel on ``fg`` (or on a Pyro model whose graph is ``fg``).
        fg: the graph.
        exact: exact marginals ``[n, k]``.
        **budget: the keyword arguments of :func:`timed_run` (``samples``, ``seconds``, ``warmup``,
            ``clock``, ``checkpoints``, ...), except ``observe`` and ``error``.

    Example:
        >>> from neuralblock import FactorGraph, GibbsKernel
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> run = marginal_error_run(GibbsKernel(fg), fg, torch.full((2, 2), 0.5), samples=50)
        >>> run.trace.sweeps[-1], len(run.times)
        (50, 50)
    """
    if "observe" in budget or "error" in budget:
        raise TypeError("marginal_error_run sets observe and error itself")
    counts = RunningMarginals(fg, exact)
    return timed_run(kernel, observe=counts, error=counts.error, **budget)


def _reached(error: float, level: float) -> bool:
    return error <= level  # NaN is never at or below a level


def first_time(trace: ErrorTrace | Mapping[str, Sequence[float]], level: float, *, for_good: bool) -> float | None:
    """When a trace gets to ``level`` or below: the first hit, or for good.

    * ``for_good=False`` (first hit): the earliest recorded time whose error is at or below ``level``.
    * ``for_good=True`` (reached for good): the earliest recorded time from which every recorded error,
      to the end of the trace, is at or below ``level``.

    A NaN error counts as above every level.

    Args:
        trace: an :class:`ErrorTrace` or a dict with ``seconds`` and ``errors``.
        level: a finite level.
        for_good: which of the two meanings (keyword only, no default: say which).

    Returns:
        The time, or ``None`` if the trace never gets there (for good: if its last error is above ``level``).

    Raises:
        ValueError: an empty trace or a NaN or infinite level.

    Example:
        >>> trace = ErrorTrace([1.0, 2.0, 3.0, 4.0], [0.5, 0.1, 0.3, 0.1])
        >>> first_time(trace, 0.2, for_good=False), first_time(trace, 0.2, for_good=True)
        (2.0, 4.0)
        >>> first_time(trace, 0.05, for_good=False) is None
        True
    """
    trace = ErrorTrace.of(trace)
    if not math.isfinite(level):
        raise ValueError(f"level must be finite, got {level!r}")
    if len(trace) == 0:
        raise ValueError("first_time of an empty trace")
    reached = [_reached(e, level) for e in trace.errors]
    if not for_good:
        return next((t for t, ok in zip(trace.seconds, reached) if ok), None)
    index = len(reached)
    while index > 0 and reached[index - 1]:
        index -= 1
    return trace.seconds[index] if index < len(reached) else None


def error_at(trace: ErrorTrace | Mapping[str, Sequence[float]], seconds: float) -> float:
    """The error at the last recorded time at or before ``seconds`` (the first error if there is none).

    Example:
        >>> error_at({"seconds": [0.1, 1.0, 2.0], "errors": [0.5, 0.2, 0.1]}, 1.5)
        0.2
    """
    trace = ErrorTrace.of(trace)
    if len(trace) == 0:
        raise ValueError("error_at of an empty trace")
    if math.isnan(seconds):
        raise ValueError("seconds must not be NaN")
    earlier = [e for t, e in zip(trace.seconds, trace.errors) if t <= seconds]
    return earlier[-1] if earlier else trace.errors[0]


def equal_time(traces: Sequence[ErrorTrace | Mapping[str, Sequence[float]]], *, same_budget: bool) -> float:
    """The time at which runs are compared "at equal time", read with :func:`error_at`.

    * ``same_budget=True``: the runs stopped on the same ``seconds`` budget, so each ended at most one
      step past it: compare at the latest end, that is, each run at its last point.
    * ``same_budget=False`` (other budgets): at the shortest run's end, where every run has a point.

    Example:
        >>> a, b = {"seconds": [0.1, 2.0], "errors": [0.5, 0.2]}, {"seconds": [0.1, 2.01], "errors": [0.4, 0.3]}
        >>> [error_at(t, equal_time([a, b], same_budget=True)) for t in (a, b)]
        [0.2, 0.3]
        >>> [error_at(t, equal_time([a, b], same_budget=False)) for t in (a, b)]
        [0.2, 0.4]
    """
    runs = [ErrorTrace.of(t) for t in traces]
    if not runs or any(len(t) == 0 for t in runs):
        raise ValueError("equal_time needs at least one trace, none of them empty")
    ends = [t.seconds[-1] for t in runs]
    return max(ends) if same_budget else min(ends)
