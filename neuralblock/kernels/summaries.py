"""Summary statistics of a data subset, for the subset weights of :class:`~neuralblock.kernels.lwa.LWAKernel`.

A *summary* is a callable ``fn(data) -> Tensor [k]`` mapping the data rows of a subset
(``[n]`` for a scalar series, ``[n, d]`` for vector rows, in subset order) to a flat
vector of statistics. The classes here are such callables (picklable, so kernels using
them run with ``num_chains > 1``); :class:`Combine` stacks several into one. Every
statistic is vectorized over the rows (no Python loop over data points), so a summary of
``n`` rows costs ``O(n log n)`` at most. Any user callable with the same signature works.

The classes also summarise ``K`` subsets at once through their ``batch(data [K, n, d]) ->
[K, k]`` method (one vectorized call, which is what makes a multiple-try subset proposal
cheap); :func:`summarise_batch` uses it when a summary has one and loops otherwise.

Example:
    >>> y = torch.arange(10.0)
    >>> fn = Combine(Means(), Quantiles([0.5]), MinMax())
    >>> fn(y).tolist()
    [4.5, 4.5, 0.0, 9.0]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "Autocorrelations",
    "Combine",
    "Means",
    "MinMax",
    "Quantiles",
    "SummaryFn",
    "default_summaries",
    "summarise_batch",
]

SummaryFn = Callable[[Tensor], Tensor]
"""``fn(data [n] or [n, d]) -> Tensor [k]``: statistics of the data rows of a subset."""


def _rows(data: Tensor) -> Tensor:
    """The data as a floating ``[n, d]`` matrix (a scalar series becomes one column)."""
    if not isinstance(data, Tensor):
        raise TypeError(f"summary statistics take a Tensor of data rows, got {type(data).__name__}")
    if data.dim() == 0 or data.shape[0] == 0:
        raise ValueError(f"summary statistics need at least one data row, got shape {tuple(data.shape)}")
    rows = data.reshape(data.shape[0], -1)
    return rows if rows.is_floating_point() else rows.to(torch.get_default_dtype())


def _batch_rows(data: Tensor) -> Tensor:
    """``K`` subsets of data rows, ``[K, n]`` or ``[K, n, ...]``, as a floating ``[K, n, d]`` tensor."""
    if not isinstance(data, Tensor):
        raise TypeError(f"batched summary statistics take a Tensor [K, n, ...], got {type(data).__name__}")
    if data.dim() < 2 or data.shape[1] == 0:
        raise ValueError(f"batched summary statistics need a [K, n, ...] tensor with n > 0, got {tuple(data.shape)}")
    rows = data.reshape(data.shape[0], data.shape[1], -1)
    return rows if rows.is_floating_point() else rows.to(torch.get_default_dtype())


class _Batched(ABC):
    """Base of the summaries here: ``__call__`` on one subset is ``batch`` on a batch of one."""

    @abstractmethod
    def batch(self, data: Tensor) -> Tensor:
        """Summaries of a batch of subsets ``[K, n, d]``."""

    def __call__(self, data: Tensor) -> Tensor:
        return self.batch(_rows(data).unsqueeze(0))[0]


def summarise_batch(fn: SummaryFn, data: Tensor) -> Tensor:
    """Summaries of ``K`` subsets at once: ``data [K, n, ...] -> Tensor [K, k]``.

    Uses ``fn.batch`` (one vectorized call) when the summary has one, else calls ``fn`` per subset.

    Example:
        >>> summarise_batch(Means(), torch.tensor([[1.0, 3.0], [2.0, 6.0]])).tolist()
        [[2.0], [4.0]]
    """
    batch = getattr(fn, "batch", None)
    if callable(batch):
        return torch.as_tensor(batch(_batch_rows(data)))
    return torch.stack([torch.as_tensor(fn(rows)).reshape(-1) for rows in data])


class Means(_Batched):
    """Column means of the data rows.

    Example:
        >>> Means()(torch.tensor([[1.0, 2.0], [3.0, 6.0]])).tolist()
        [2.0, 4.0]
    """

    def batch(self, data: Tensor) -> Tensor:
        return _batch_rows(data).mean(1)


class Quantiles(_Batched):
    """Column quantiles at ``probs`` (linear interpolation, as :func:`torch.quantile`).

    Args:
        probs: levels in ``[0, 1]``.

    Example:
        >>> Quantiles([0.2, 0.8])(torch.arange(11.0)).tolist()
        [2.0, 8.0]
    """

    def __init__(self, probs: Sequence[float]) -> None:
        levels = torch.as_tensor(list(probs), dtype=torch.float64)
        if levels.numel() == 0 or levels.dim() != 1 or not bool(((levels >= 0) & (levels <= 1)).all()):
            raise ValueError(f"quantile levels must be a non-empty list in [0, 1], got {list(probs)}")
        self.levels = levels

    def batch(self, data: Tensor) -> Tensor:
        rows = _batch_rows(data)
        out = torch.quantile(rows, self.levels.to(rows.dtype), dim=1)  # [q, K, d]
        return out.transpose(0, 1).reshape(rows.shape[0], -1)


class Autocorrelations(_Batched):
    """Sample autocorrelations of each column at the given lags (rows in time order).

    ``acf(k) = sum_t (y_t - m)(y_{t+k} - m) / sum_t (y_t - m)^2`` with ``m`` the column
    mean, and 0 for a constant column (e.g. a window of a sparse event series). The loop runs
    over the (few) lags; each lag is one vectorized product.

    Args:
        lags: positive lags, each smaller than the number of rows the summary will see.

    Example:
        >>> Autocorrelations([1, 2])(torch.tensor([1.0, -1.0, 1.0, -1.0])).tolist()
        [-0.75, 0.5]
    """

    def __init__(self, lags: Sequence[int]) -> None:
        self.lags = [int(k) for k in lags]
        if not self.lags or min(self.lags) < 1:
            raise ValueError(f"autocorrelation lags must be a non-empty list of positive integers, got {list(lags)}")

    def batch(self, data: Tensor) -> Tensor:
        rows = _batch_rows(data)
        if rows.shape[1] <= max(self.lags):
            raise ValueError(f"autocorrelation at lag {max(self.lags)} needs more than {rows.shape[1]} rows")
        centred = rows - rows.mean(1, keepdim=True)
        acf = torch.stack([(centred[:, :-k] * centred[:, k:]).sum(1) for k in self.lags], 1)  # [K, lags, d]
        var = centred.square().sum(1, keepdim=True)
        acf = torch.where(var > 0, acf / var, torch.zeros((), dtype=acf.dtype))  # 0 for a constant column
        return acf.reshape(rows.shape[0], -1)


class MinMax(_Batched):
    """Column minima then column maxima.

    Example:
        >>> MinMax()(torch.tensor([3.0, -1.0, 2.0])).tolist()
        [-1.0, 3.0]
    """

    def batch(self, data: Tensor) -> Tensor:
        lo, hi = _batch_rows(data).aminmax(dim=1)
        return torch.cat([lo, hi], 1)


class Combine:
    """Concatenate the outputs of several summaries into one vector.

    Example:
        >>> Combine(Means(), MinMax())(torch.tensor([1.0, 3.0])).tolist()
        [2.0, 1.0, 3.0]
    """

    def __init__(self, *fns: SummaryFn) -> None:
        if not fns or not all(callable(f) for f in fns):
            raise TypeError("Combine takes one or more summary callables")
        self.fns = fns

    def __call__(self, data: Tensor) -> Tensor:
        return torch.cat([torch.as_tensor(f(data)).reshape(-1) for f in self.fns])

    def batch(self, data: Tensor) -> Tensor:
        return torch.cat([summarise_batch(f, data) for f in self.fns], 1)


def default_summaries(subset: str) -> SummaryFn:
    """The default summary set for a subset kind.

    * ``"window"`` (time series): mean, quantiles 0.2 / 0.8, autocorrelations at lags 1, 2, 3;
    * ``"iid"``: column means and quantiles 0.2 / 0.5 / 0.8.

    Example:
        >>> default_summaries("window")(torch.randn(50)).shape
        torch.Size([6])
    """
    if subset == "window":
        return Combine(Means(), Quantiles([0.2, 0.8]), Autocorrelations([1, 2, 3]))
    if subset == "iid":
        return Combine(Means(), Quantiles([0.2, 0.5, 0.8]))
    raise ValueError(f"subset must be 'iid' or 'window', got {subset!r}")
