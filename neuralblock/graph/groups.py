"""Vectorized factor groups: the numeric half of a :class:`FactorGraph`.

A factor group holds many factors of one kind in stacked tensors, so that the
log values of all of them (or of any subset) come from one gather and one
batched evaluation. Every group exposes the same small protocol:

* ``scopes``: a ``LongTensor [F, a]`` of variable ids (``-1`` pads short scopes);
* ``log_factors(state, index=None)``: the log value of each factor for a batch of
  states ``[..., n]``, returned as ``[..., F]`` (or ``[..., len(index)]``);
* ``log_factors_rows(states, index, rows)``: factor ``index[e]`` at its own state
  ``states[rows[e]]``, returned as ``[len(index)]`` (e.g. each block's scaffold at the
  state where only that block was changed).

Example:
    >>> import torch
    >>> group = TableGroup(torch.tensor([[0, 1]]), torch.log(torch.tensor([[[0.9, 0.1], [0.2, 0.8]]])))
    >>> group.log_factors(torch.tensor([[0.0, 1.0]])).exp()
    tensor([[0.1000]])
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "CallableGroup",
    "FactorGroup",
    "GaussianMixtureGroup",
    "LinearGaussianGroup",
    "LogLinearGaussianGroup",
    "TableGroup",
]


class FactorGroup(ABC):
    """A stack of factors of one kind, evaluated together."""

    scopes: Tensor

    @property
    def num_factors(self) -> int:
        """Number of factors in the group."""
        return int(self.scopes.shape[0])

    def scope_list(self, factor: int) -> list[int]:
        """The variable ids of one factor, without padding."""
        row = self.scopes[factor]
        return [int(v) for v in row[row >= 0]]

    @abstractmethod
    def log_factors(self, state: Tensor, index: Tensor | None = None) -> Tensor:
        """Log values of the factors (all, or those in ``index``) for states ``[..., n]``."""

    def log_factors_rows(self, states: Tensor, index: Tensor, rows: Tensor) -> Tensor:
        """Log value of factor ``index[e]`` at state ``states[rows[e]]``, ``[len(index)]``.

        This fallback evaluates every factor at every state and keeps the pairs asked for
        (``O(len(states) * len(index))``); the built-in groups read each factor's own row.

        Args:
            states: ``[R, n]`` states.
            index: ``LongTensor [E]`` factor rows of this group.
            rows: ``LongTensor [E]`` the state of each entry.
        """
        return self.log_factors(states, index)[rows, torch.arange(index.numel())]

    def _select(self, index: Tensor | None) -> Tensor:
        return self.scopes if index is None else self.scopes[index]


def _take(state: Tensor, ids: Tensor, rows: Tensor | None) -> Tensor:
    """``state[..., ids]``; with ``rows``, entry ``e`` of ``ids`` (first dimension) is read from ``state[rows[e]]``."""
    if rows is None:
        return state[..., ids]
    return state[rows.reshape(rows.shape + (1,) * (ids.dim() - 1)), ids]


class _RowwiseGroup(FactorGroup):
    """A group whose evaluation reads its factors' values through :func:`_take` (so rows come at no extra cost)."""

    def log_factors(self, state: Tensor, index: Tensor | None = None) -> Tensor:
        return self._log_factors(state, index, None)

    def log_factors_rows(self, states: Tensor, index: Tensor, rows: Tensor) -> Tensor:
        return self._log_factors(states, index, rows)

    @abstractmethod
    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        """Shared body of :meth:`log_factors` (``rows=None``) and :meth:`log_factors_rows`."""


class TableGroup(_RowwiseGroup):
    """Discrete factors with a log-table each; all tables share one shape.

    Args:
        scopes: ``LongTensor [F, a]``, the variables of each factor (table axis order).
        log_tables: ``Tensor [F, k_1, ..., k_a]`` of log potentials (``-inf`` allowed).

    Example:
        >>> g = TableGroup(torch.tensor([[0], [1]]), torch.zeros(2, 3))
        >>> g.log_factors(torch.zeros(5, 2)).shape
        torch.Size([5, 2])
    """

    def __init__(self, scopes: Tensor, log_tables: Tensor) -> None:
        scopes = torch.as_tensor(scopes, dtype=torch.long)
        if scopes.dim() != 2:
            raise ValueError(f"table scopes must be [F, a], got shape {tuple(scopes.shape)}")
        if log_tables.dim() != scopes.shape[1] + 1 or log_tables.shape[0] != scopes.shape[0]:
            raise ValueError(f"log_tables of shape {tuple(log_tables.shape)} do not match scopes {tuple(scopes.shape)}")
        if torch.isnan(log_tables).any() or (log_tables == math.inf).any():
            raise ValueError("log_tables contain NaN or +inf")
        self.scopes = scopes
        self.table_shape = tuple(int(k) for k in log_tables.shape[1:])
        self.log_tables = log_tables
        self._flat = log_tables.reshape(log_tables.shape[0], -1)
        strides = [1] * len(self.table_shape)
        for i in range(len(self.table_shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.table_shape[i + 1]
        self._strides = torch.tensor(strides, dtype=torch.long)
        self._size = int(self._flat.shape[1])

    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        values = _take(state, self._select(index), rows).long()  # [..., m, a]
        flat = (values * self._strides).sum(-1)  # [..., m]
        factor = torch.arange(self.num_factors) if index is None else index
        return self._flat.reshape(-1)[factor * self._size + flat]

    def __getstate__(self) -> dict:
        return {"scopes": self.scopes, "log_tables": self.log_tables}

    def __setstate__(self, state: dict) -> None:
        TableGroup.__init__(self, state["scopes"], state["log_tables"])


class LinearGaussianGroup(_RowwiseGroup):
    """Linear-Gaussian CPDs ``x_child ~ N(bias + weights . x_parents, scale)``.

    Args:
        child: ``LongTensor [F]`` child variable of each CPD.
        parents: ``LongTensor [F, p]`` parent variables (``-1`` pads; padded weights are ignored).
        weights: ``Tensor [F, p]``.
        bias: ``Tensor [F]``.
        scale: ``Tensor [F]``, positive standard deviations.

    Example:
        >>> g = LinearGaussianGroup(torch.tensor([1]), torch.tensor([[0]]), torch.ones(1, 1),
        ...                         torch.zeros(1), torch.ones(1))
        >>> round(float(g.log_factors(torch.tensor([1.0, 1.0]))), 4)
        -0.9189
    """

    def __init__(self, child: Tensor, parents: Tensor, weights: Tensor, bias: Tensor, scale: Tensor) -> None:
        child = torch.as_tensor(child, dtype=torch.long).reshape(-1)
        parents = torch.as_tensor(parents, dtype=torch.long).reshape(child.shape[0], -1)
        weights = torch.as_tensor(weights, dtype=torch.get_default_dtype()).reshape(parents.shape)
        bias = torch.as_tensor(bias, dtype=weights.dtype).reshape(child.shape)
        scale = torch.as_tensor(scale, dtype=weights.dtype).reshape(child.shape)
        if not (scale > 0).all() or not torch.isfinite(scale).all():
            raise ValueError("linear-Gaussian scales must be finite and positive")
        if not (torch.isfinite(weights).all() and torch.isfinite(bias).all()):
            raise ValueError("linear-Gaussian weights and bias must be finite")
        self.child, self.parents = child, parents
        self.weights = torch.where(parents >= 0, weights, torch.zeros_like(weights))
        self.bias, self.scale = bias, scale
        self.scopes = torch.cat([child[:, None], parents], dim=1)

    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        factor = slice(None) if index is None else index
        x = _take(state, self.child[factor], rows)
        parents = self.parents[factor].clamp(min=0)
        mean = self.bias[factor] + (_take(state, parents, rows) * self.weights[factor]).sum(-1)
        scale = self.scale[factor]
        z = (x - mean) / scale
        return -0.5 * z * z - scale.log() - 0.5 * math.log(2 * math.pi)


class LogLinearGaussianGroup(_RowwiseGroup):
    """Gaussian factors with a linear mean and a log-linear variance in one parent.

    ``child ~ N(loc_weight * parent + loc_bias, exp(logvar_weight * parent + logvar_bias))``.
    With ``logvar_weight = 0`` this is a linear-Gaussian CPD; with ``loc_weight = 0`` and
    ``logvar_weight = 1`` it is the observation of a stochastic volatility model,
    ``y_t ~ N(0, exp(h_t + logvar_bias))``.

    Args:
        child: ``LongTensor [F]``.
        parent: ``LongTensor [F]``.
        loc_weight, loc_bias, logvar_weight, logvar_bias: ``Tensor [F]`` (finite).

    Example:
        >>> g = LogLinearGaussianGroup(torch.tensor([1]), torch.tensor([0]), torch.zeros(1), torch.zeros(1),
        ...                            torch.ones(1), torch.zeros(1))
        >>> round(float(g.log_factors(torch.tensor([0.0, 0.0]))), 4)  # N(0; 0, e^0)
        -0.9189
    """

    def __init__(
        self,
        child: Tensor,
        parent: Tensor,
        loc_weight: Tensor,
        loc_bias: Tensor,
        logvar_weight: Tensor,
        logvar_bias: Tensor,
    ) -> None:
        child = torch.as_tensor(child, dtype=torch.long).reshape(-1)
        parent = torch.as_tensor(parent, dtype=torch.long).reshape(-1)
        if parent.shape != child.shape or (child < 0).any() or (parent < 0).any():
            raise ValueError("log-linear-Gaussian child and parent must be [F] tensors of variable ids")
        dtype = torch.get_default_dtype()
        raw = (loc_weight, loc_bias, logvar_weight, logvar_bias)
        params = [torch.as_tensor(t, dtype=dtype).reshape(-1) for t in raw]
        if any(t.shape != child.shape for t in params):
            raise ValueError(f"log-linear-Gaussian parameters must each have {child.shape[0]} entries")
        if not all(torch.isfinite(t).all() for t in params):
            raise ValueError("log-linear-Gaussian parameters must be finite")
        self.child, self.parent = child, parent
        self.loc_weight, self.loc_bias, self.logvar_weight, self.logvar_bias = params
        self.scopes = torch.stack([child, parent], dim=1)

    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        factor = slice(None) if index is None else index
        y, x = _take(state, self.child[factor], rows), _take(state, self.parent[factor], rows)
        log_var = self.logvar_weight[factor] * x + self.logvar_bias[factor]
        resid = y - (self.loc_weight[factor] * x + self.loc_bias[factor])
        return -0.5 * (resid * resid * torch.exp(-log_var) + log_var + math.log(2 * math.pi))


class GaussianMixtureGroup(_RowwiseGroup):
    """Points of an open-universe Gaussian mixture, with their labels summed out.

    Factor ``j`` is ``log p(x_j | mu, v) = log (1 / M) sum_k v_k N(x_j; mu_k, sigma^2 I)``
    over ``m`` mixtures with means ``mu_k`` (``D`` continuous variables each) and activity
    bits ``v_k`` (binary variables), ``M = sum_k v_k``. With no active mixture the factor
    is ``-inf``. Each factor's scope is ``[x_j (D), mu_1 .. mu_m (m D), v_1 .. v_m]``.

    Args:
        points: ``LongTensor [n, D]`` variable ids of the points' coordinates.
        means: ``LongTensor [m, D]`` variable ids of the mixture means.
        active: ``LongTensor [m]`` variable ids of the activity bits.
        sigma: the points' standard deviation around their mixture mean (positive).

    Example:
        >>> g = GaussianMixtureGroup(torch.tensor([[0]]), torch.tensor([[1], [2]]), torch.tensor([3, 4]), 1.0)
        >>> state = torch.tensor([0.0, 0.0, 5.0, 1.0, 0.0])  # x = 0, only mixture 0 (mean 0) active
        >>> round(float(g.log_factors(state)), 4)
        -0.9189
    """

    def __init__(self, points: Tensor, means: Tensor, active: Tensor, sigma: float) -> None:
        points = torch.as_tensor(points, dtype=torch.long)
        means = torch.as_tensor(means, dtype=torch.long)
        active = torch.as_tensor(active, dtype=torch.long).reshape(-1)
        if points.dim() != 2 or means.dim() != 2 or points.shape[1] != means.shape[1]:
            raise ValueError(
                f"mixture points {tuple(points.shape)} and means {tuple(means.shape)} must be [n, D] and [m, D]"
            )
        if means.shape[0] != active.shape[0] or active.numel() == 0:
            raise ValueError(f"need one activity bit per mixture: {means.shape[0]} means, {active.numel()} bits")
        if not (math.isfinite(float(sigma)) and float(sigma) > 0):
            raise ValueError(f"mixture sigma must be finite and positive, got {sigma}")
        if min(int(points.min()), int(means.min()), int(active.min())) < 0:
            raise ValueError("mixture variable ids must be non-negative")
        self.points, self.means, self.active, self.sigma = points, means, active, float(sigma)
        shared = torch.cat([means.reshape(-1), active])
        self.scopes = torch.cat([points, shared.expand(points.shape[0], -1)], dim=1)

    @property
    def dim(self) -> int:
        """Dimension ``D`` of the points."""
        return int(self.points.shape[1])

    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        points = self.points if index is None else self.points[index]
        x = _take(state, points, rows)  # [..., r, D]

        def shared(ids: Tensor) -> Tensor:  # every factor reads all mixtures: [..., 1, *ids] or [r, *ids]
            if rows is None:
                return state[..., ids].unsqueeze(-ids.dim() - 1)
            return _take(state, ids.expand(rows.shape + ids.shape), rows)

        mu, v = shared(self.means), shared(self.active)  # [..., 1 | r, m, D], [..., 1 | r, m]
        d2 = ((x.unsqueeze(-2) - mu) ** 2).sum(-1) / self.sigma**2  # [..., r, m]
        log_v = torch.log(v.clamp(min=0.0))
        count = v.sum(-1)
        dim = self.dim
        log_norm = -dim * math.log(self.sigma) - 0.5 * dim * math.log(2 * math.pi)
        value = torch.logsumexp(log_v - 0.5 * d2, -1) - torch.log(count.clamp(min=1.0)) + log_norm
        return torch.where(count > 0, value, torch.full_like(value, -math.inf))


class CallableGroup(_RowwiseGroup):
    """Factors given by a batched torch function of their scope values.

    ``fn(values, params)`` receives ``values [..., m, a]`` (the scope values of ``m``
    factors) and ``params [m, ...]`` (their rows of ``params``, or ``None``) and must
    return log values ``[..., m]``. Use a module-level function so kernels pickle.

    Args:
        scopes: ``LongTensor [F, a]``.
        fn: the batched log-factor function.
        params: optional per-factor parameters ``[F, ...]``.

    Example:
        >>> def gauss(values, params):
        ...     return -0.5 * ((values[..., 0] - values[..., 1]) / params[:, 0]) ** 2
        >>> g = CallableGroup(torch.tensor([[0, 1]]), gauss, torch.ones(1, 1))
        >>> g.log_factors(torch.tensor([1.0, 3.0]))
        tensor([-2.])
    """

    def __init__(
        self,
        scopes: Tensor,
        fn: Callable[[Tensor, Tensor | None], Tensor],
        params: Tensor | None = None,
    ) -> None:
        scopes = torch.as_tensor(scopes, dtype=torch.long)
        if scopes.dim() != 2 or (scopes < 0).any():
            raise ValueError("callable-factor scopes must be a [F, a] tensor of variable ids")
        if params is not None and params.shape[0] != scopes.shape[0]:
            raise ValueError(f"params has {params.shape[0]} rows for {scopes.shape[0]} factors")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.scopes, self.fn, self.params = scopes, fn, params

    def _log_factors(self, state: Tensor, index: Tensor | None, rows: Tensor | None) -> Tensor:
        scopes = self._select(index)
        params = None if self.params is None else (self.params if index is None else self.params[index])
        out = self.fn(_take(state, scopes, rows), params)
        expected = (state.shape[:-1] if rows is None else ()) + (scopes.shape[0],)
        if out.shape != expected:
            raise ValueError(f"factor function returned shape {tuple(out.shape)}, expected {tuple(expected)}")
        return out
