"""Warmup adaptation, kept apart from the kernels (as in Pyro's ``adaptation.py``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

from neuralblock.kernels.base import check_probability

__all__ = ["SCHEDULES", "GibbsShare", "StepSizeAdapter", "check_schedule", "gibbs_prob_for_share", "single_site_turn"]


class StepSizeAdapter:
    """Per-coordinate Robbins-Monro adaptation of random-walk step sizes.

    During warmup, ``log step += t^-kappa * (accept_prob - target)``; after warmup the
    step sizes freeze. The default target 0.44 is the optimal single-site acceptance
    rate for a Gaussian random walk (Roberts and Rosenthal, 2001).

    Args:
        size: number of coordinates.
        initial: initial step size.
        target: target acceptance probability.
        kappa: decay exponent in (0.5, 1].

    Example:
        >>> adapter = StepSizeAdapter(2)
        >>> adapter.update(torch.tensor([0, 1]), torch.tensor([1.0, 0.0]))
        >>> bool(adapter.step_size[0] > adapter.step_size[1])
        True
    """

    def __init__(self, size: int, initial: float = 0.5, target: float = 0.44, kappa: float = 0.6) -> None:
        if not 0 < target < 1:
            raise ValueError(f"target acceptance must be in (0, 1), got {target}")
        if not initial > 0:
            raise ValueError(f"initial step size must be positive, got {initial}")
        self.log_step = torch.full((size,), math.log(initial))
        self.target, self.kappa = target, kappa
        self.count = torch.zeros(size)

    @property
    def step_size(self) -> Tensor:
        """Current step sizes."""
        return self.log_step.exp()

    def update(self, index: Tensor, accept_prob: Tensor) -> None:
        """Adapt the coordinates in ``index`` from their latest acceptance probabilities."""
        self.count[index] += 1
        rate = self.count[index].pow(-self.kappa)
        self.log_step[index] = (self.log_step[index] + rate * (accept_prob - self.target)).clamp(-12.0, 6.0)


SCHEDULES: tuple[str, ...] = ("random", "alternate")
"""The kernels' schedules of their single-site sweeps (:func:`single_site_turn`)."""


def check_schedule(schedule: object) -> str:
    """``schedule`` if it names one of :data:`SCHEDULES`.

    Example:
        >>> check_schedule("alternate")
        'alternate'

    Raises:
        TypeError: ``schedule`` is not a string.
        ValueError: it names no schedule.
    """
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be one of {SCHEDULES}, got {type(schedule).__name__}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return schedule


def single_site_turn(schedule: str, prob: float, turn: int) -> bool:
    """Whether transition ``turn`` (``0, 1, ...``) of a kernel takes its single-site sweep, at the rate ``prob``.

    ``"random"``: with probability ``prob`` (one draw of torch's RNG), a random scan of the two sweeps.
    ``"alternate"``: deterministically, when ``floor((turn + 1) prob) > floor(turn prob)``: the kernel's own
    sweep first (for ``prob < 1``), the single-site sweeps spread evenly among its sweeps at the same long-run
    share (strictly in turn at 0.5), and no draw of the RNG. Both leave the target invariant, since each sweep
    does; the alternate schedule takes away the chance of long runs of one kind (which all of a kernel's chains
    share).

    Example:
        >>> [single_site_turn("alternate", 0.5, t) for t in range(4)]
        [False, True, False, True]
        >>> [single_site_turn("alternate", 0.25, t) for t in range(8)]
        [False, False, False, True, False, False, False, True]
    """
    if schedule == "random":
        return float(torch.rand(())) < prob
    if schedule == "alternate":
        return math.floor((turn + 1) * prob + 1e-9) > math.floor(turn * prob + 1e-9)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


def gibbs_prob_for_share(share: float, single_seconds: float, move_seconds: float) -> float:
    """The per-transition probability of a single-site sweep that gives single-site sweeps ``share`` of the time.

    A transition is a single-site sweep (``single_seconds``) with probability ``p`` and a sweep of the
    kernel's own moves (``move_seconds``) otherwise; ``p c_s / (p c_s + (1 - p) c_m) = share`` gives
    ``p = share c_m / (share c_m + (1 - share) c_s)``.

    Example:
        >>> round(gibbs_prob_for_share(0.5, 0.01, 0.49), 2)  # moves 49x dearer: 49 single-site sweeps to one
        0.98
        >>> gibbs_prob_for_share(0.5, 1.0, 1.0)
        0.5

    Raises:
        ValueError: ``share`` outside ``[0, 1]`` or a time that is not positive and finite.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    if not all(0.0 < t < math.inf for t in (single_seconds, move_seconds)):
        raise ValueError(f"sweep times must be positive and finite, got {single_seconds} and {move_seconds}")
    return share * move_seconds / (share * move_seconds + (1.0 - share) * single_seconds)


class GibbsShare:
    """Sets a kernel's probability of a single-site sweep from the measured cost of its two kinds of sweep.

    A kernel that mixes single-site sweeps with its own moves (neural block sweeps, split-merge sweeps)
    picks one per transition with a fixed probability ``gibbs_prob`` (or, with ``schedule="alternate"``,
    deterministically at that rate: :func:`single_site_turn`). Where the moves cost far more than a
    single-site sweep (at n = 1000 points a GMM's pair sweep costs ~50 single-site sweeps), ``gibbs_prob =
    0.5`` spends nearly all the time on the moves. :meth:`calibrate` times both sweeps ``repeats`` times
    on copies of the starting state (the least wall time of each, the first call possibly loading caches;
    the states are discarded) and returns the probability that gives single-site sweeps ``share`` of the
    expected time (:func:`gibbs_prob_for_share`). The kernel calls it once, at ``setup`` (in its first
    transition where a wrapper prepares it without ``setup``, as replica exchange does), and keeps the
    probability fixed: a fixed mixture of invariant kernels is invariant, and the probability depends on
    the start and the machine's speed alone (so a seed no longer fixes the run: read the probability used
    from the kernel's diagnostics).

    Args:
        share: the fraction of the sampling time single-site sweeps should take, in ``(0, 1]`` (0 would
            never update the variables no move touches).
        repeats: timings of each sweep (the least counts).

    Example:
        >>> share = GibbsShare(0.5)
        >>> p = share.calibrate(lambda: None, lambda: sum(range(10**5)))  # single-site sweep, moves
        >>> p == gibbs_prob_for_share(0.5, share.seconds["single_site"], share.seconds["moves"])
        True

    Raises:
        TypeError: ``share`` is not a real number.
        ValueError: ``share`` outside ``(0, 1]`` or ``repeats < 1``.
    """

    def __init__(self, share: float, repeats: int = 2) -> None:
        self.share = check_probability("gibbs_share", share)
        if self.share == 0.0:
            raise ValueError("gibbs_share must be in (0, 1]: with 0 no single-site sweep would ever run")
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.repeats = int(repeats)
        self.seconds: dict[str, float] = {}

    def calibrate(
        self, single_site: Callable[[], object], moves: Callable[[], object], device: torch.device | None = None
    ) -> float:
        """Time ``single_site()`` and ``moves()`` (one sweep each, on copies of the state); the probability.

        On a CUDA ``device`` each timing waits for the device's queued work.
        """
        for name, sweep in (("single_site", single_site), ("moves", moves)):
            times = []
            for _ in range(self.repeats):
                start = time.perf_counter()
                sweep()
                if device is not None and device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            self.seconds[name] = max(min(times), 1e-9)
        return gibbs_prob_for_share(self.share, self.seconds["single_site"], self.seconds["moves"])
