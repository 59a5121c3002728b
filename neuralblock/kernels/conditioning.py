"""Holding some latent sites of a Pyro model fixed while a kernel samples the others.

A compound sampler updates disjoint site sets in turn; each inner kernel must see the
other kernels' current values. :class:`ConditionedModel` is a picklable Pyro model that
runs ``model`` under ``poutine.condition`` with a *mutable* dict of values, so a kernel
built on it (Pyro's ``NUTS``/``HMC``, or any kernel that re-runs its model) sees new
values as soon as :meth:`ConditionedModel.set_values` updates them, without a rebuild.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro import poutine
    >>> def model():
    ...     a = pyro.sample("a", dist.Normal(0.0, 1.0))
    ...     return pyro.sample("b", dist.Normal(a, 1.0))
    >>> cm = ConditionedModel(model, {"a": torch.tensor(3.0)})
    >>> float(poutine.trace(cm).get_trace().nodes["a"]["value"])
    3.0
    >>> cm.set_values({"a": torch.tensor(-1.0)})
    >>> float(poutine.trace(cm).get_trace().nodes["a"]["value"])
    -1.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from pyro import poutine
from torch import Tensor

__all__ = ["Conditionable", "ConditionedModel", "ResettableConditioning", "set_conditioning", "values_changed"]


@runtime_checkable
class Conditionable(Protocol):
    """A kernel that can hold its model's other latent sites fixed: what a compound sampler needs.

    ``condition_on(values)`` fixes the sites in ``values`` (constrained space) before the next
    ``setup`` or ``sample``; called again, it moves them. Every kernel of this package that
    updates some of a model's sites implements it; Pyro's own kernels are conditioned by
    building them on a :class:`ConditionedModel` instead (:func:`set_conditioning` handles both).

    Example:
        >>> from neuralblock.kernels import GibbsKernel
        >>> from pyro.infer import NUTS
        >>> isinstance(GibbsKernel(lambda: None), Conditionable), isinstance(NUTS(lambda: None), Conditionable)
        (True, False)
    """

    def condition_on(self, values: Mapping[str, Tensor]) -> None:
        """Hold the sites in ``values`` fixed at those values."""


@runtime_checkable
class ResettableConditioning(Conditionable, Protocol):
    """A :class:`Conditionable` kernel that can also forget the sites it holds fixed (before a new ``setup``).

    Example:
        >>> from neuralblock.kernels import AusterityMH, ParticleGibbs
        >>> issubclass(AusterityMH, ResettableConditioning), issubclass(ParticleGibbs, ResettableConditioning)
        (True, False)
    """

    def reset_conditioning(self) -> None:
        """Forget the fixed sites: the next :meth:`condition_on` may fix another set."""


class ConditionedModel:
    """``model`` with some latent sites fixed to values that can change between runs.

    Args:
        model: a Pyro model (a module-level function, so that it pickles).
        values: the initial fixed values ``{site: value}`` (constrained space).
    """

    def __init__(self, model: Callable[..., Any], values: Mapping[str, Tensor] | None = None) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        self.model = model
        self.values: dict[str, Tensor] = {}
        if values:
            self.set_values(values)

    def set_values(self, values: Mapping[str, Tensor]) -> None:
        """Replace the fixed values (the dict is updated in place, so runs see the change).

        Raises:
            ValueError: a value is not finite, or the set of fixed sites changes after it was
                first set (a kernel's structure was built for the first set).
        """
        names = {str(k) for k in values}
        if self.values and names != set(self.values):
            raise ValueError(
                f"the conditioned sites changed from {sorted(self.values)} to {sorted(names)}; "
                "condition on the same sites every time"
            )
        self.reset(values)

    def reset(self, values: Mapping[str, Tensor]) -> None:
        """Fix another set of sites (before the kernel built on this model is set up again).

        Raises:
            ValueError: a value is not finite.

        Example:
            >>> import pyro, pyro.distributions as dist, torch
            >>> cm = ConditionedModel(lambda: pyro.sample("a", dist.Normal(0.0, 1.0)), {"a": torch.tensor(1.0)})
            >>> cm.reset({"b": torch.tensor(2.0)})
            >>> sorted(cm.values)
            ['b']
        """
        new = _finite_values(values)
        self.values.clear()
        self.values.update(new)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return poutine.condition(self.model, data=self.values)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ConditionedModel({getattr(self.model, '__name__', self.model)!r}, sites={sorted(self.values)})"


def _finite_values(values: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{site: tensor}``, refusing non-finite floating-point values."""
    new = {str(k): torch.as_tensor(v) for k, v in values.items()}
    for name, value in new.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise ValueError(f"conditioning value of site {name!r} is not finite")
    return new


def set_conditioning(kernel: Any, values: Mapping[str, Tensor], reset: bool = False) -> None:
    """Fix the other sites of ``kernel``'s model to ``values`` before its next ``sample``.

    Kernels of this package implement ``condition_on(values)``. Pyro's own kernels
    (``NUTS``, ``HMC``, ``RandomWalkKernel``) work when built on a :class:`ConditionedModel`;
    their cached potential energy is cleared, since it depends on the fixed values.

    Args:
        kernel: the inner kernel.
        values: ``{site: value}`` in constrained space.
        reset: forget the sites fixed so far first (call it right before the kernel's
            ``setup``, e.g. when a new run's data give the model other latent sites).

    Raises:
        TypeError: the kernel can neither be conditioned nor was built on a ConditionedModel.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> from pyro.infer import NUTS
        >>> def model():
        ...     a = pyro.sample("a", dist.Normal(0.0, 1.0))
        ...     pyro.sample("b", dist.Normal(a, 1.0))
        >>> nuts = NUTS(ConditionedModel(model, {"a": torch.tensor(0.0)}))
        >>> set_conditioning(nuts, {"a": torch.tensor(2.0)})
        >>> nuts.model.values["a"].item()
        2.0
    """
    if isinstance(kernel, Conditionable):
        if reset and isinstance(kernel, ResettableConditioning):
            kernel.reset_conditioning()
        kernel.condition_on(values)
        return
    model = getattr(kernel, "model", None)
    if not isinstance(model, ConditionedModel):
        raise TypeError(
            f"{type(kernel).__name__} cannot be conditioned on other sites: give it a condition_on(values) "
            "method, or build it on neuralblock.kernels.ConditionedModel(model)"
        )
    if reset:
        model.reset(values)
    else:
        model.set_values(values)
    clear = getattr(kernel, "clear_cache", None)
    if callable(clear):
        clear()


def values_changed(old: Mapping[str, Tensor], new: Mapping[str, Tensor]) -> bool:
    """Whether ``new`` fixes other sites, or other values, than ``old``.

    Example:
        >>> values_changed({"a": torch.tensor(1.0)}, {"a": torch.tensor(1.0)})
        False
    """
    return new.keys() != old.keys() or any(not torch.equal(torch.as_tensor(v), old[k]) for k, v in new.items())
