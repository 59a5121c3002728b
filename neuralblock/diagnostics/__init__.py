"""Diagnostics: marginal error against exact marginals, error traces, MCSE.

Timed runs (budgets, the clock, error-vs-time traces, first times) live in
:mod:`neuralblock.diagnostics.runs`, the harness the quickstart and the studies share.

Example:
    >>> import torch
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph()
    >>> _ = fg.add_variables(2, cardinality=2)
    >>> samples = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    >>> exact = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    >>> marginal_error(samples, fg, exact)
    0.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from torch import Tensor

from neuralblock.graph import FactorGraph

__all__ = [
    "MarginalErrorTrace",
    "RunningMarginals",
    "batch_means_mcse",
    "effective_sample_size",
    "empirical_marginals",
    "kept_draws",
    "log_spaced_counts",
    "marginal_error",
    "samples_to_states",
    "split_gelman_rubin",
    "trace_marginal_error",
]


def samples_to_states(samples: Tensor | Mapping[str, Tensor], fg: FactorGraph) -> Tensor:
    """Turn MCMC output into state draws ``[..., n]``.

    Accepts a state tensor ``[..., n]``, a ``get_samples()`` dict of a FactorGraph kernel
    (site ``"x"``), or of a Pyro-model kernel (one site per variable name; observed
    variables take their evidence).
    """
    if isinstance(samples, Tensor):
        states = samples
    elif "x" in samples and samples["x"].shape[-1:] == (fg.num_variables,) and "x" not in fg.names:
        states = samples["x"]
    else:
        missing = [fg.names[v] for v in fg.latent.tolist() if fg.names[v] not in samples]
        if missing:
            raise ValueError(f"samples lack sites for variables {missing[:5]}")
        first = samples[fg.names[int(fg.latent[0])]]
        states = torch.zeros(first.shape + (fg.num_variables,))
        for v in range(fg.num_variables):
            states[..., v] = fg.evidence[v] if v in fg.evidence else samples[fg.names[v]]
    if states.shape[-1] != fg.num_variables:
        raise ValueError(f"samples have {states.shape[-1]} variables, graph has {fg.num_variables}")
    return states


def empirical_marginals(samples: Tensor | Mapping[str, Tensor], fg: FactorGraph) -> Tensor:
    """Visit frequencies of each discrete variable's values, ``[n, k_max]``."""
    states = samples_to_states(samples, fg).reshape(-1, fg.num_variables).long()
    kmax = int(fg.cardinalities.max())
    counts = torch.nn.functional.one_hot(states.clamp(min=0, max=kmax - 1), kmax).sum(0)
    return counts.to(torch.get_default_dtype()) / states.shape[0]


def marginal_error(samples: Tensor | Mapping[str, Tensor], fg: FactorGraph, exact: Tensor) -> float:
    """Mean absolute error of sampled single-variable marginals against exact ones.

    The mean runs over every (variable, value) pair of the latent discrete variables,
    ``sum_v sum_x |p_hat(v=x) - p(v=x)| / sum_v k_v``; with equal cardinalities this is the
    UAI convention ``mean_v mean_x |p_hat(v=x) - p(v=x)|`` (a variable with more values
    weighs more otherwise).

    Args:
        samples: state draws ``[..., n]`` or a ``get_samples()`` dict.
        fg: the graph the samples belong to.
        exact: exact marginals ``[n, k]`` (e.g. from :func:`neuralblock.exact.marginals`).
    """
    _check_exact(fg, exact)
    est = empirical_marginals(samples, fg)
    return _mean_abs_error(est, exact, fg)


def _check_exact(fg: FactorGraph, exact: Tensor) -> None:
    if exact.dim() != 2 or exact.shape[0] != fg.num_variables:
        raise ValueError(f"exact marginals must be [{fg.num_variables}, k], got {tuple(exact.shape)}")


def _mean_abs_error(est: Tensor, exact: Tensor, fg: FactorGraph) -> float:
    k = min(est.shape[1], exact.shape[1])
    cards = fg.cardinalities
    latent = fg.latent
    latent = latent[cards[latent] > 0]
    mask = torch.arange(k)[None, :] < cards[latent][:, None]
    diff = (est[latent, :k] - exact[latent, :k].to(est.dtype)).abs()
    return float(diff[mask].sum() / mask.sum())


def log_spaced_counts(total: int, num_points: int) -> list[int]:
    """About ``num_points`` distinct counts from 1 to ``total``, log-spaced, always including ``total``.

    Example:
        >>> log_spaced_counts(100, 3), log_spaced_counts(3, 10)
        ([1, 10, 100], [1, 2, 3])
    """
    grid = torch.logspace(0, torch.log10(torch.tensor(float(max(total, 1)))), num_points)
    return sorted({int(round(float(g))) for g in grid} | {total})


_ESS_MIN_PROBABILITY = 1e-3  # variables rarer than this either way are left out of RunningMarginals.ess


class RunningMarginals:
    """Visit counts of every draw it is shown, and their marginals' error against exact ones.

    Call it with each draw (a state tensor or a ``get_samples()``-style dict; vectorized chains
    pool their draws); :meth:`error` is :func:`marginal_error` of all draws so far, without
    keeping them.

    With ``thin_to=T`` it also keeps a thinned copy of every chain's draws for :meth:`ess`: every
    ``stride``-th draw, at most ``2 T`` per chain; when that fills, every other kept draw is dropped and
    the stride doubles. Memory stays ``O(T x chains x n)`` bytes whatever the run length.

    Args:
        fg: the graph.
        exact: exact marginals ``[n, k]``.
        thin_to: keep about this many thinned draws per chain for :meth:`ess` (0: none).

    Example:
        >>> from neuralblock import FactorGraph
        >>> fg = FactorGraph(); _ = fg.add_variables(1, cardinality=2)
        >>> counts = RunningMarginals(fg, torch.tensor([[0.5, 0.5]]))
        >>> counts({"x": torch.zeros(1)}); counts({"x": torch.ones(1)})
        >>> counts.draws, counts.error()
        (2, 0.0)
    """

    def __init__(self, fg: FactorGraph, exact: Tensor, thin_to: int = 0) -> None:
        _check_exact(fg, exact)
        if isinstance(thin_to, bool) or not isinstance(thin_to, int) or not (thin_to == 0 or thin_to >= 8):
            raise ValueError(f"thin_to must be 0 (no thinned draws) or an integer >= 8, got {thin_to!r}")
        self.fg, self.exact = fg, exact
        self.kmax = int(fg.cardinalities.max())
        self.counts = torch.zeros(fg.num_variables, self.kmax)
        self.draws = 0
        self.thin_to = thin_to
        self.stride = 1
        self._calls = 0
        self._kept: list[Tensor] = []

    def __call__(self, params: Tensor | Mapping[str, Tensor]) -> None:
        state = samples_to_states(params, self.fg).cpu().long().clamp(0, self.kmax - 1)
        state = state.reshape(-1, self.fg.num_variables)  # vectorized chains pool their draws
        ids = torch.arange(self.fg.num_variables).expand_as(state)
        self.counts.index_put_((ids, state), torch.ones(()).expand_as(state), accumulate=True)
        self.draws += state.shape[0]
        if self.thin_to:
            if self._calls % self.stride == 0:
                self._kept.append(state == 0)  # [chains, n] indicators of value 0
                if len(self._kept) >= 2 * self.thin_to:
                    self._kept, self.stride = self._kept[::2], 2 * self.stride
            self._calls += 1

    def ess(self) -> float | None:
        """Median over variables of the multi-chain effective sample size of the thinned draws.

        The statistic is each latent variable's indicator of its first value, over the variables
        whose exact marginal of that value is between 1e-3 and 1 - 1e-3 (a frozen chain counts; a
        deterministic or nearly deterministic variable, whose draws may rightly never change, does not).
        The ESS is Pyro's (Stan's) multi-chain estimate on the thinned draws (a failed, non-positive
        estimate counts as 1). It is a lower bound on the
        whole run's ESS that saturates near ``chains x kept draws`` (:meth:`ess_cap`) once the
        thinning stride exceeds the chains' autocorrelation time: compare samplers below that cap.
        Chains stuck in different states give an ESS of a fraction of the number of chains.

        Returns:
            The median ESS, or ``None`` with fewer than 4 kept draws or no such variable.

        Raises:
            ValueError: built without ``thin_to``.
        """
        if not self.thin_to:
            raise ValueError("RunningMarginals keeps no draws for ess(): build it with thin_to > 0")
        latent = self.fg.latent
        first = self.exact[latent, 0]
        random = (first >= _ESS_MIN_PROBABILITY) & (first <= 1 - _ESS_MIN_PROBABILITY)
        if len(self._kept) < 4 or not bool(random.any()):
            return None
        draws = torch.stack(self._kept, dim=1)[:, :, latent[random]].double()  # [chains, T, variables]
        ess = effective_sample_size(draws, chain_dim=0, sample_dim=1)
        return float(ess.nan_to_num(1.0).clamp(min=1.0).median())

    def ess_cap(self) -> int:
        """``chains x kept draws``: about where :meth:`ess` saturates (0 before the first draw)."""
        return int(self._kept[0].shape[0]) * len(self._kept) if self._kept else 0

    def error(self, params: object = None) -> float:
        """Mean absolute marginal error of the draws so far (``params`` is ignored: the counts hold them)."""
        if self.draws == 0:
            raise ValueError("no draws counted yet")
        return _mean_abs_error(self.counts / self.draws, self.exact, self.fg)


def kept_draws(calls: int, thin_to: int) -> int:
    """How many draws per chain a ``RunningMarginals(thin_to=thin_to)`` keeps after ``calls`` draws.

    The stride is the smallest power of two that keeps fewer than ``2 thin_to`` draws, each ``stride``-th
    from the first.

    Example:
        >>> kept_draws(10, 8), kept_draws(16, 8), kept_draws(1000, 8)
        (10, 8, 8)
    """
    stride = 1
    while -(-calls // stride) >= 2 * thin_to:
        stride *= 2
    return -(-calls // stride)


class MarginalErrorTrace:
    """A ``pyro.infer.MCMC`` hook recording marginal error vs sweeps and vs wall time.

    Pass it as ``hook_fn``; it accumulates visit counts of every post-warmup draw (of every
    chain, for kernels with ``chains=K``) and, at roughly geometric checkpoints, records
    ``(sweeps, seconds, error)``. Seconds
    count from the first post-warmup draw and include only sampling time, not the
    hook's own bookkeeping at checkpoints. (Outside ``pyro.infer.MCMC``,
    :func:`neuralblock.diagnostics.runs.marginal_error_run` does the same with a time budget.)

    Args:
        fg: the graph.
        exact: exact marginals ``[n, k]``.
        num_points: about how many checkpoints to record.
        total: the planned number of draws (to place checkpoints).
        clock: the time source (``time.process_time`` for CPU time, which other processes on a
            shared machine do not inflate).

    Example:
        >>> from neuralblock import FactorGraph
        >>> fg = FactorGraph(); _ = fg.add_variables(1, cardinality=2)
        >>> trace = MarginalErrorTrace(fg, torch.tensor([[1.0, 0.0]]), total=4)
        >>> for i in range(4):
        ...     trace(None, {"x": torch.zeros(1)}, "Sample", i)
        >>> trace.errors[-1]
        0.0
    """

    def __init__(
        self,
        fg: FactorGraph,
        exact: Tensor,
        num_points: int = 40,
        total: int = 1000,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.fg, self.exact, self.clock = fg, exact, clock
        self.running = RunningMarginals(fg, exact)
        self.checkpoints = log_spaced_counts(total, num_points)
        self.sweeps: list[int] = []
        self.seconds: list[float] = []
        self.errors: list[float] = []
        self._n = 0
        self._elapsed = 0.0
        self._last: float | None = None

    def __call__(self, kernel: object, params: Mapping[str, Tensor], stage: str, i: int) -> None:
        now = self.clock()
        if not stage.startswith("Sample"):
            self._last = now
            return
        if self._last is not None:
            self._elapsed += now - self._last
        self.running(params)
        self._n += 1
        if self._n in self.checkpoints:
            self.sweeps.append(self._n)
            self.seconds.append(self._elapsed)
            self.errors.append(self.running.error())
        self._last = self.clock()

    def as_dict(self) -> dict[str, list]:
        """The recorded trace as JSON-ready lists."""
        return {"sweeps": self.sweeps, "seconds": self.seconds, "errors": self.errors}


def trace_marginal_error(
    kernel: MCMCKernel,
    fg: FactorGraph,
    exact: Tensor,
    num_samples: int,
    warmup_steps: int = 0,
    progress: bool = True,
    num_points: int = 40,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list]:
    """Run ``kernel`` in ``pyro.infer.MCMC`` and record marginal error vs sweeps and time.

    Args:
        kernel: any of our kernels built on ``fg`` (or on a Pyro model whose graph is ``fg``).
        fg: the graph.
        exact: exact marginals ``[n, k]``.
        num_samples: post-warmup draws (sweeps).
        warmup_steps: warmup draws, not counted.
        progress: show Pyro's progress bar.
        num_points: about how many checkpoints to record.
        clock: the time source of the recorded seconds.

    Returns:
        ``{"sweeps", "seconds", "errors"}`` lists plus the kernel's ``diagnostics``.

    Example:
        >>> from neuralblock import FactorGraph, GibbsKernel
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> out = trace_marginal_error(GibbsKernel(fg), fg, torch.full((2, 2), 0.5), 50, progress=False)
        >>> out["sweeps"][-1]
        50
    """
    from pyro.infer import MCMC

    trace = MarginalErrorTrace(fg, exact, num_points=num_points, total=num_samples, clock=clock)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, hook_fn=trace, disable_progbar=not progress)
    mcmc.run()
    out: dict[str, list] = trace.as_dict()
    out["diagnostics"] = kernel.diagnostics()
    return out


def batch_means_mcse(draws: Tensor, num_batches: int = 20) -> tuple[Tensor, Tensor]:
    """Mean and Monte Carlo standard error by non-overlapping batch means.

    Args:
        draws: ``[chains, samples, ...]`` scalar functions of the state (e.g. indicators).
        num_batches: batches per chain.

    Returns:
        ``(mean [...], mcse [...])``, pooling ``chains * num_batches`` batch means.

    Example:
        >>> mean, se = batch_means_mcse(torch.randn(4, 1000))
        >>> bool(se < 0.05)
        True
    """
    if draws.dim() < 2:
        raise ValueError(f"draws must be [chains, samples, ...], got {tuple(draws.shape)}")
    chains, n = draws.shape[:2]
    size = n // num_batches
    if size < 1:
        raise ValueError(f"{n} samples cannot form {num_batches} batches")
    used = draws[:, : size * num_batches].to(torch.float64)
    means = used.reshape(chains, num_batches, size, *draws.shape[2:]).mean(2)
    means = means.reshape(chains * num_batches, *draws.shape[2:])
    total = means.shape[0]
    return means.mean(0), (means.var(0, unbiased=True) / total).sqrt()
