"""One comparison of supports (``torch.distributions`` constraints), shared by the graph, kernels and prior swap.

* :func:`base_support`: the per-element support, ``independent`` wrappers removed;
* :func:`is_real`: whether a support is the whole real line;
* :func:`support_key`: a comparable description of a support;
* :func:`same_support`: whether two supports are the same set.

Example:
    >>> from torch.distributions import constraints
    >>> is_real(constraints.independent(constraints.real, 1)), is_real(constraints.positive)
    (True, False)
"""

from __future__ import annotations

import torch
from torch.distributions import constraints
from torch.distributions.constraints import Constraint

__all__ = ["base_support", "is_real", "same_support", "support_key"]


def base_support(support: Constraint | None) -> Constraint:
    """``support`` without its ``independent`` wrappers (``None`` stands for ``real``).

    Example:
        >>> base_support(constraints.independent(constraints.positive, 1))
        GreaterThan(lower_bound=0.0)
    """
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return constraints.real if support is None else support


def is_real(support: Constraint | None) -> bool:
    """Whether a support is the whole real line (``real``, also wrapped in ``independent``).

    Example:
        >>> is_real(constraints.real), is_real(constraints.unit_interval)
        (True, False)
    """
    return isinstance(base_support(support), type(constraints.real))


def support_key(support: Constraint | None) -> str:
    """A comparable description of a support (independent wrappers removed).

    Example:
        >>> from torch.distributions import Normal, MultivariateNormal, HalfNormal
        >>> mvn = MultivariateNormal(torch.zeros(2), torch.eye(2))
        >>> support_key(Normal(0.0, 1.0).support) == support_key(mvn.support)
        True
        >>> support_key(HalfNormal(1.0).support)
        'GreaterThanEq(lower_bound=0.0)'
    """
    return repr(base_support(support)).replace("GreaterThan(", "GreaterThanEq(")


def same_support(a: Constraint | None, b: Constraint | None) -> bool:
    """Whether two supports are the same set: same kind, bounds equal after broadcasting.

    Independent wrappers are removed and open/closed lower bounds are not told apart (as in
    :func:`support_key`); bounds are compared as numbers, so ``Interval(0, 1)`` equals an
    interval with tensor bounds of zeros and ones, and bounds that differ in any element differ.

    Example:
        >>> from torch.distributions import Beta, Uniform
        >>> same_support(Beta(torch.ones(3), torch.ones(3)).support, Uniform(torch.zeros(3), torch.ones(3)).support)
        True
        >>> same_support(Uniform(0.0, torch.tensor([1.0, 2.0])).support, constraints.unit_interval)
        False
    """
    if a is b:
        return True
    if support_key(a).split("(")[0] != support_key(b).split("(")[0]:
        return False
    a, b = base_support(a), base_support(b)
    for bound in ("lower_bound", "upper_bound"):
        x, y = getattr(a, bound, None), getattr(b, bound, None)
        if (x is None) != (y is None):
            return False
        if x is not None:
            x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
            try:
                if not bool((x == y).all()):
                    return False
            except RuntimeError:  # shapes that do not broadcast
                return False
    return True
