"""The continuous global sites of a Pyro model as one flat vector, in both spaces.

The global kernels (:class:`~neuralblock.kernels.austerity.AusterityMH`,
:class:`~neuralblock.kernels.lwa.LWAKernel`, :class:`~neuralblock.priorswap.PriorSwap`,
:class:`~neuralblock.kernels.marginal.MarginalRandomWalk`) move a flat *unconstrained* vector
``z [D]`` (as Pyro's HMC does) and evaluate the model at the constrained values ``theta`` with the
log-Jacobian of the map. A :class:`FlatLayout` records each site's shape and support, and does the
bookkeeping once for all of them: dicts of site values to flat vectors (one point ``[D]`` or a batch
``[P, D]``) and back, and unconstrained to constrained values (``biject_to(support)``, as in Pyro)
with the log-Jacobian, batched over points.

A support whose bijection changes the shape (the simplex: ``K`` constrained values, ``K - 1``
unconstrained) has two flat sizes: :attr:`FlatLayout.dim` in the unconstrained space and
:attr:`FlatLayout.constrained_dim` in the constrained one.

Example:
    >>> from torch.distributions import constraints
    >>> layout = FlatLayout({"w": (3,), "s": ()}, {"w": constraints.simplex, "s": constraints.positive})
    >>> layout.dim, layout.constrained_dim
    (3, 4)
    >>> values, log_jacobian = layout.constrain(torch.zeros(5, 3))
    >>> [round(x, 4) for x in values["w"][0].tolist()], values["s"].shape, log_jacobian.shape
    ([0.3333, 0.3333, 0.3333], torch.Size([5]), torch.Size([5]))
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.distributions import biject_to, constraints
from torch.distributions.constraints import Constraint
from torch.distributions.transforms import ComposeTransform, IndependentTransform, Transform, _InverseTransform

__all__ = ["FlatLayout", "is_identity"]


def is_identity(transform: Transform) -> bool:
    """Whether a transform is the identity (as ``biject_to`` returns for real supports), by its structure.

    Example:
        >>> is_identity(biject_to(constraints.real)), is_identity(biject_to(constraints.positive))
        (True, False)
    """
    if isinstance(transform, _InverseTransform):
        return is_identity(transform.inv)
    if isinstance(transform, IndependentTransform):
        return is_identity(transform.base_transform)
    return isinstance(transform, ComposeTransform) and all(is_identity(part) for part in transform.parts)


class FlatLayout:
    """Shapes and supports of continuous sites, and the maps between site dicts and flat vectors.

    Args:
        shapes: site -> shape of one constrained value (insertion order fixes the flat order).
        supports: site -> support constraint (default: real).

    Attributes:
        shapes: site -> constrained shape.
        unconstrained_shapes: site -> shape in the unconstrained space.
        supports: site -> support.
        bijections: site -> ``biject_to(support)`` (unconstrained -> constrained).
        transforms: site -> ``biject_to(support).inv``, Pyro's ``transforms`` (constrained -> unconstrained).
        identity: site -> whether its bijection is the identity (real support).
        constrained_sites: the sites whose bijection is not the identity.
        sizes: site -> number of unconstrained values; ``dim`` is their sum.
        constrained_sizes: site -> number of constrained values; ``constrained_dim`` is their sum.
        slices: site -> its slice of a flat unconstrained vector (``constrained_slices``: constrained).

    Raises:
        ValueError: no site, supports of unknown sites, or a discrete support (naming the site).

    Example:
        >>> layout = FlatLayout({"beta": (2,), "sigma": ()}, {"sigma": constraints.positive})
        >>> z = torch.zeros(4, 3)
        >>> theta, log_det = layout.to_constrained(z)
        >>> theta[:, 2].tolist(), layout.unflatten(theta)["beta"].shape
        ([1.0, 1.0, 1.0, 1.0], torch.Size([4, 2]))
    """

    def __init__(self, shapes: Mapping[str, Sequence[int]], supports: Mapping[str, Constraint] | None = None) -> None:
        if not shapes:
            raise ValueError("a FlatLayout needs at least one site")
        supports = dict(supports or {})
        unknown = set(supports) - set(shapes)
        if unknown:
            raise ValueError(f"supports given for unknown sites {sorted(unknown)}")
        self.shapes = {name: torch.Size(shape) for name, shape in shapes.items()}
        self.supports: dict[str, Constraint] = {n: supports.get(n, constraints.real) for n in self.shapes}
        self.bijections: dict[str, Transform] = {}
        self.unconstrained_shapes: dict[str, torch.Size] = {}
        for name, support in self.supports.items():
            if support.is_discrete:
                raise ValueError(
                    f"site {name!r} has the discrete support {support}; a FlatLayout holds continuous sites"
                )
            transform = biject_to(support)
            self.bijections[name] = transform
            self.unconstrained_shapes[name] = torch.Size(transform.inverse_shape(self.shapes[name]))
        self.transforms: dict[str, Transform] = {name: bijection.inv for name, bijection in self.bijections.items()}
        self.identity = {name: is_identity(bijection) for name, bijection in self.bijections.items()}
        self.constrained_sites = [n for n in self.shapes if not self.identity[n]]
        self.reshaped_sites = [n for n in self.shapes if self.unconstrained_shapes[n] != self.shapes[n]]
        self.sizes = {name: math.prod(shape) for name, shape in self.unconstrained_shapes.items()}
        self.constrained_sizes = {name: math.prod(shape) for name, shape in self.shapes.items()}
        self.dim = sum(self.sizes.values())
        self.constrained_dim = sum(self.constrained_sizes.values())
        self.slices = _slices(self.sizes)
        self.constrained_slices = _slices(self.constrained_sizes)
        self._split = list(self.sizes.values())

    @classmethod
    def from_samples(
        cls, samples: Mapping[str, Tensor], supports: Mapping[str, Constraint] | None = None
    ) -> FlatLayout:
        """Layout of a dict of constrained draws ``site -> [T, *shape]``.

        Example:
            >>> FlatLayout.from_samples({"a": torch.zeros(10, 2)}).dim
            2
        """
        return cls({name: value.shape[1:] for name, value in samples.items()}, supports)

    @classmethod
    def from_trace(cls, trace: Any, sites: Sequence[str]) -> FlatLayout:
        """Layout of ``sites`` of a Pyro trace: the shapes of their values and their distributions' supports.

        Args:
            trace: a ``pyro.poutine.Trace`` (or a mapping site name -> site message).
            sites: the sites, in flat order.

        Raises:
            ValueError: a site is not a sample site of the trace, or is discrete.

        Example:
            >>> import pyro, pyro.distributions as dist
            >>> def model():
            ...     pyro.sample("s", dist.LogNormal(0.0, 1.0))
            ...     pyro.sample("w", dist.Dirichlet(torch.ones(3)))
            >>> layout = FlatLayout.from_trace(pyro.poutine.trace(model).get_trace(), ["w", "s"])
            >>> layout.unconstrained_shapes
            {'w': torch.Size([2]), 's': torch.Size([])}
        """
        nodes = trace.nodes if hasattr(trace, "nodes") else trace
        missing = [s for s in sites if s not in nodes or nodes[s]["type"] != "sample"]
        if missing:
            raise ValueError(f"sites {missing} are not sample sites of the trace")
        return cls({s: nodes[s]["value"].shape for s in sites}, {s: nodes[s]["fn"].support for s in sites})

    # -- site dicts <-> flat vectors ----------------------------------------------------------
    def flatten(self, values: Mapping[str, Tensor], *, constrained: bool = True) -> Tensor:
        """A batch ``site -> [B, *shape]`` to ``[B, D]``, checking that every site is present with its shape.

        Args:
            values: the batch, one tensor per site.
            constrained: whether the values are constrained (``D = constrained_dim``) or
                unconstrained (``D = dim``).

        Raises:
            ValueError: a site is missing or has the wrong shape (naming it).

        Example:
            >>> FlatLayout({"a": (2,), "b": ()}).flatten({"a": torch.ones(5, 2), "b": torch.zeros(5)}).shape
            torch.Size([5, 3])
        """
        shapes = self.shapes if constrained else self.unconstrained_shapes
        missing = [n for n in shapes if n not in values]
        if missing:
            raise ValueError(f"values lack sites {missing}; expected {list(shapes)}")
        parts = []
        for name, shape in shapes.items():
            value = torch.as_tensor(values[name])
            nd = len(shape)
            if tuple(value.shape[value.dim() - nd :]) != tuple(shape) or value.dim() < nd + 1:
                raise ValueError(f"site {name!r} has shape {tuple(value.shape)}, expected [num_draws, *{tuple(shape)}]")
            parts.append(value.reshape(value.shape[0], -1))
        return torch.cat(parts, -1)

    def flatten_point(self, params: Mapping[str, Tensor], *, constrained: bool = False) -> Tensor:
        """One point ``site -> value`` (e.g. Pyro's unconstrained ``params``) to a flat ``[D]``, keeping autograd.

        Args:
            params: one value per site (any shape with the site's number of elements).
            constrained: whether the values are constrained; by default unconstrained, as Pyro's
                kernels pass them.

        Raises:
            ValueError: a site is missing or has the wrong number of elements (naming it).

        Example:
            >>> FlatLayout({"a": (2,), "b": ()}).flatten_point({"a": torch.ones(2), "b": torch.tensor(3.0)})
            tensor([1., 1., 3.])
        """
        sizes = self.constrained_sizes if constrained else self.sizes
        missing = [n for n in sizes if n not in params]
        if missing:
            raise ValueError(f"params lack sites {missing}")
        parts = []
        for name, size in sizes.items():
            value = torch.as_tensor(params[name])
            if value.numel() != size:
                raise ValueError(f"site {name!r} has {value.numel()} values ({tuple(value.shape)}), expected {size}")
            parts.append(value.reshape(-1))
        return torch.cat(parts)

    def unflatten(self, flat: Tensor, *, constrained: bool = False) -> dict[str, Tensor]:
        """``[..., D]`` to ``site -> [..., *shape]`` (views of ``flat``).

        Args:
            flat: flat values, one point ``[D]`` or a batch.
            constrained: whether ``flat`` holds constrained values (``D = constrained_dim``);
                by default unconstrained (``D = dim``).

        Raises:
            ValueError: the last dimension is not ``D``.

        Example:
            >>> FlatLayout({"a": (2,), "b": ()}).unflatten(torch.arange(3.0))
            {'a': tensor([0., 1.]), 'b': tensor(2.)}
        """
        shapes = self.shapes if constrained else self.unconstrained_shapes
        dim = self.constrained_dim if constrained else self.dim
        if flat.dim() == 0 or flat.shape[-1] != dim:
            raise ValueError(f"flat values have shape {tuple(flat.shape)}, expected [..., {dim}]")
        batch = flat.shape[:-1]
        if flat.dim() == 1:  # one point: split (one view per site), as the kernels' hot paths want
            if len(shapes) == 1:
                name, shape = next(iter(shapes.items()))
                return {name: flat.reshape(shape)}
            sizes = list((self.constrained_sizes if constrained else self.sizes).values())
            return {n: p.reshape(shapes[n]) for n, p in zip(shapes, flat.split(sizes), strict=True)}
        slices = self.constrained_slices if constrained else self.slices
        return {n: flat[..., slices[n]].reshape(batch + shapes[n]) for n in shapes}

    # -- unconstrained <-> constrained ----------------------------------------------------------
    def constrain(self, points: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """Constrained values ``{site: [P, *shape]}`` of ``P`` flat unconstrained points ``[P, D]``, and log-Jacobians.

        The log-Jacobian ``[P]`` is ``log |det d theta / d z|`` summed over the sites. Real sites
        pass through untouched (no transform, no reshape when the shape already matches), so the
        autograd graph of a hot path stays small.

        Raises:
            ValueError: ``points`` is not ``[P, D]``.

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> values, log_jacobian = layout.constrain(torch.zeros(2, 1))
            >>> values["s"].tolist(), log_jacobian.tolist()
            ([1.0, 1.0], [0.0, 0.0])
        """
        if points.dim() != 2 or points.shape[1] != self.dim:
            raise ValueError(f"points have shape {tuple(points.shape)}, expected [P, {self.dim}]")
        count = points.shape[0]
        values, log_jacobian = {}, torch.zeros(count, dtype=points.dtype, device=points.device)
        parts = torch.split(points, self._split, dim=1) if len(self._split) > 1 else (points,)
        for name, p in zip(self.shapes, parts, strict=True):
            shape = (count, *self.unconstrained_shapes[name])
            u = p if p.shape == shape else p.reshape(shape)  # no view node for autograd to traverse
            if self.identity[name]:  # e.g. a real-valued site: no transform, zero log-Jacobian
                values[name] = u
                continue
            bijection = self.bijections[name]
            values[name] = bijection(u)
            log_jacobian = log_jacobian + bijection.log_abs_det_jacobian(u, values[name]).reshape(count, -1).sum(-1)
        return values, log_jacobian

    def constrain_point(self, z: Tensor, fixed: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Constrained values of one flat unconstrained point ``z [D]`` (no log-Jacobian), after ``fixed`` values.

        Args:
            z: the flat unconstrained point.
            fixed: values of other sites to include (e.g. sites held fixed by a compound sampler).

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> layout.constrain_point(torch.zeros(1), {"mu": torch.tensor(2.0)})
            {'mu': tensor(2.), 's': tensor(1.)}
        """
        values = dict(fixed or {})
        for name, p in zip(self.shapes, torch.split(z, self._split), strict=True):
            u = p.reshape(self.unconstrained_shapes[name])
            values[name] = u if self.identity[name] else self.bijections[name](u)
        return values

    def constrain_params(self, params: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], Tensor]:
        """Constrained values of one point given as a dict of unconstrained values, and its log-Jacobian (a scalar).

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> values, log_jacobian = layout.constrain_params({"s": torch.tensor(0.0)})
            >>> values["s"].item(), log_jacobian.item()
            (1.0, 0.0)
        """
        missing = [n for n in self.shapes if n not in params]
        if missing:
            raise ValueError(f"params lack sites {missing}")
        first = torch.as_tensor(params[next(iter(self.shapes))])
        values, log_jacobian = {}, torch.zeros((), dtype=first.dtype, device=first.device)
        for name in self.shapes:
            u = params[name]
            if self.identity[name]:
                values[name] = u
                continue
            bijection = self.bijections[name]
            values[name] = bijection(u)
            log_jacobian = log_jacobian + bijection.log_abs_det_jacobian(u, values[name]).sum()
        return values, log_jacobian

    def unconstrain(self, values: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Unconstrained values of a dict of constrained ones (any batch shape; sites in the layout's order).

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> layout.unconstrain({"s": torch.tensor(1.0)})
            {'s': tensor(0.)}
        """
        missing = [n for n in self.shapes if n not in values]
        if missing:
            raise ValueError(f"values lack sites {missing}")
        return {n: values[n] if self.identity[n] else self.transforms[n](values[n]) for n in self.shapes}

    def to_constrained(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Map flat unconstrained ``z [..., dim]`` to ``(theta [..., constrained_dim], log|d theta / d z| [...])``.

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> layout.to_constrained(torch.zeros(1))[0]
            tensor([1.])
        """
        if z.shape[-1:] != (self.dim,):
            raise ValueError(f"flat values have shape {tuple(z.shape)}, expected [..., {self.dim}]")
        batch = z.shape[:-1]
        log_det = z.new_zeros(batch)
        if not self.constrained_sites:
            return z, log_det
        if self.reshaped_sites:  # the spaces differ in size: build theta site by site
            parts = []
            for name in self.shapes:
                u = self._site_values(z, name)
                if self.identity[name]:
                    parts.append(u.reshape(batch + (-1,)))
                    continue
                transform = self.bijections[name]
                value = transform(u)
                parts.append(value.reshape(batch + (-1,)))
                log_det = log_det + transform.log_abs_det_jacobian(u, value).reshape(batch + (-1,)).sum(-1)
            return torch.cat(parts, -1), log_det
        theta = z.clone()
        for name in self.constrained_sites:  # each site's transform sees the site's own shape
            transform, u = self.bijections[name], self._site_values(z, name)
            value = transform(u)
            theta[..., self.slices[name]] = value.reshape(batch + (-1,))
            log_det = log_det + transform.log_abs_det_jacobian(u, value).reshape(batch + (-1,)).sum(-1)
        return theta, log_det

    def to_unconstrained(self, theta: Tensor) -> Tensor:
        """Map flat constrained ``theta [..., constrained_dim]`` to unconstrained ``z [..., dim]``.

        Raises:
            ValueError: values lie outside their site's support (naming the site).

        Example:
            >>> layout = FlatLayout({"s": ()}, {"s": constraints.positive})
            >>> layout.to_unconstrained(torch.ones(2, 1)).tolist()
            [[0.0], [0.0]]
        """
        if theta.shape[-1:] != (self.constrained_dim,):
            raise ValueError(f"flat values have shape {tuple(theta.shape)}, expected [..., {self.constrained_dim}]")
        batch = theta.shape[:-1]
        if self.reshaped_sites:
            parts = []
            for name in self.shapes:
                value = self._site_values(theta, name, constrained=True)
                self._check_support(name, value)
                u = value if self.identity[name] else self.transforms[name](value)
                parts.append(u.reshape(batch + (-1,)))
            return torch.cat(parts, -1)
        z = theta.clone()
        for name in self.constrained_sites:
            value = self._site_values(theta, name)
            self._check_support(name, value)
            z[..., self.slices[name]] = self.transforms[name](value).reshape(batch + (-1,))
        return z

    def unconstrained_transforms(self) -> dict[str, Any]:
        """Pyro-style ``transforms`` (constrained -> unconstrained) for the non-real sites only.

        Example:
            >>> list(FlatLayout({"a": (), "s": ()}, {"s": constraints.positive}).unconstrained_transforms())
            ['s']
        """
        return {name: self.transforms[name] for name in self.constrained_sites}

    def _check_support(self, name: str, value: Tensor) -> None:
        if self.identity[name]:
            return
        if not bool(self.supports[name].check(value).all()):
            raise ValueError(f"values of site {name!r} lie outside its support {self.supports[name]}")

    def _site_values(self, flat: Tensor, name: str, constrained: bool = False) -> Tensor:
        """Site ``name``'s part of ``flat [..., D]`` in its own shape ``[..., *shape]``."""
        if constrained:
            return flat[..., self.constrained_slices[name]].reshape(flat.shape[:-1] + self.shapes[name])
        return flat[..., self.slices[name]].reshape(flat.shape[:-1] + self.unconstrained_shapes[name])


def _slices(sizes: Mapping[str, int]) -> dict[str, slice]:
    offsets = [0, *itertools.accumulate(sizes.values())]
    return {name: slice(offsets[i], offsets[i + 1]) for i, name in enumerate(sizes)}
