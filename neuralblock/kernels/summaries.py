"""Summary statistics of a data subset, for the subset weights of :class:`~neuralblock.kernels.lwa.LWAKernel`.

A *summary* is a callable ``fn(data) -> Tensor [k]`` mapping the data rows of a subset
(``[n]`` for a scalar series, ``[n, d]`` for vector rows, in subset order) to a flat
vector of statistics. The classes here are such callables (picklable, so kernels using
them run with ``num_chains > 1``); :class:`Combine` stacks several into one. Every
statistic is vectorized over the rows (no Python loop over data points), so a summary of
``n`` rows costs ``O(n log n)`` at most. Any user callable with the same signature works.

Example:
    >>> y = torch.arange(10.0)
    >>> fn = Combine(Means(), Quantiles([0.5]), MinMax())
    >>> fn(y).tolist()
    [4.5, 4.5, 0.0, 9.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["Autocorrelations", "Combine", "Means", "MinMax", "Quantiles", "SummaryFn", "default_summaries"]

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


class Means:
    """Column means of the data rows.

    Example:
        >>> Means()(torch.tensor([[1.0, 2.0], [3.0, 6.0]])).tolist()
        [2.0, 4.0]
    """

    def __call__(self, data: Tensor) -> Tensor:
        return _rows(data).mean(0)


class Quantiles:
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

    def __call__(self, data: Tensor) -> Tensor:
        rows = _rows(data)
        return torch.quantile(rows, self.levels.to(rows.dtype), dim=0).reshape(-1)


class Autocorrelations:
    """Sample autocorrelations of each column at the given lags (rows in time order).

    ``acf(k) = sum_t (y_t - m)(y_{t+k} - m) / sum_t (y_t - m)^2`` with ``m`` the column
    mean. The loop runs over the (few) lags; each lag is one vectorized product.

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

    def __call__(self, data: Tensor) -> Tensor:
        rows = _rows(data)
        if rows.shape[0] <= max(self.lags):
            raise ValueError(f"autocorrelation at lag {max(self.lags)} needs more than {rows.shape[0]} rows")
        centred = rows - rows.mean(0)
        acf = torch.stack([(centred[:-k] * centred[k:]).sum(0) for k in self.lags])
        return (acf / centred.square().sum(0)).reshape(-1)


class MinMax:
    """Column minima then column maxima.

    Example:
        >>> MinMax()(torch.tensor([3.0, -1.0, 2.0])).tolist()
        [-1.0, 3.0]
    """

    def __call__(self, data: Tensor) -> Tensor:
        lo, hi = _rows(data).aminmax(dim=0)
        return torch.cat([lo, hi])


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
