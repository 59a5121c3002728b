"""Sites, supports and priors of a prior-swap problem, flattened into one vector.

A false posterior over several global sites (``MCMC.get_samples()`` of a model with, say,
``beta`` of shape ``[90]`` and a positive ``sigma``) is handled as one flat vector: a
:class:`SiteLayout` (the global kernels' shared :class:`~neuralblock.pyro.layout.FlatLayout`,
under its prior-swap name) records each site's shape and support, flattens dicts of samples
into ``[T, D]`` matrices, and maps the flat *unconstrained* vector ``z`` (where densities are
fitted and HMC moves) to the constrained values ``theta`` with the log-Jacobian.

A :class:`SitePrior` evaluates a prior given as a torch/Pyro distribution, a dict of
distributions (one per site) or a user log-density callable, batched over draws.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import torch
from torch import Tensor
from torch.distributions import Distribution
from torch.distributions.constraints import Constraint

from neuralblock.graph.supports import same_support, support_key
from neuralblock.pyro.layout import FlatLayout

__all__ = ["DEFAULT_SITE", "PriorLike", "SiteLayout", "SitePrior", "as_sample_dict", "same_support", "support_key"]

DEFAULT_SITE = "theta"

#: The prior-swap name of :class:`~neuralblock.pyro.layout.FlatLayout` (the same class).
SiteLayout = FlatLayout

#: A prior: one distribution (single site), one per site, or a callable log density taking a dict
#: ``site -> Tensor [B, *shape]`` of constrained values and returning ``[B]``.
PriorLike = Distribution | Mapping[str, Distribution] | Callable[[dict[str, Tensor]], Tensor]


def as_sample_dict(samples: Mapping[str, Tensor] | Tensor, site: str = DEFAULT_SITE) -> dict[str, Tensor]:
    """Samples as a dict ``site -> Tensor [T, *shape]`` (a bare tensor becomes site ``site``).

    Example:
        >>> as_sample_dict(torch.zeros(5, 2))["theta"].shape
        torch.Size([5, 2])
    """
    if isinstance(samples, Tensor):
        samples = {site: samples}
    if not isinstance(samples, Mapping) or not samples:
        raise TypeError(f"samples must be a non-empty dict site -> Tensor or a Tensor, got {type(samples).__name__}")
    out = {}
    num = None
    for name, value in samples.items():
        value = torch.as_tensor(value)
        if not value.is_floating_point():
            value = value.to(torch.get_default_dtype())
        if value.dim() == 0:
            raise ValueError(f"samples of site {name!r} need a leading draw dimension, got a scalar")
        if num is not None and value.shape[0] != num:
            raise ValueError(f"sites have different numbers of draws: {name!r} has {value.shape[0]}, expected {num}")
        num = value.shape[0]
        if not torch.isfinite(value).all():
            raise ValueError(f"samples of site {name!r} contain non-finite values")
        out[str(name)] = value
    return out


def _unvalidated(dist: Distribution) -> Distribution:
    """A shallow copy that skips argument validation (values come from the support's bijection)."""
    fast = copy.copy(dist)
    fast._validate_args = False
    return fast


class SitePrior:
    """A prior over the layout's sites, evaluated in batch.

    Args:
        prior: a distribution (only for a single site), a dict ``site -> distribution``,
            or a callable ``log_prob(values: dict[str, Tensor [B, *shape]]) -> Tensor [B]``
            (user code; a ``support`` dict attribute on it, if present, names its supports).
        name: ``"false prior"`` or ``"target prior"`` (for error messages).

    Example:
        >>> prior = SitePrior(torch.distributions.Normal(0.0, 1.0), "false prior")
        >>> layout = SiteLayout({"theta": ()})
        >>> prior.bind(layout)
        >>> prior.log_prob({"theta": torch.zeros(3)}).shape
        torch.Size([3])
    """

    def __init__(self, prior: PriorLike, name: str) -> None:
        self.name = name
        if isinstance(prior, Distribution):
            self.dists: dict[str, Distribution] | None = {"": prior}
            self.fn = None
        elif isinstance(prior, Mapping):
            bad = [k for k, v in prior.items() if not isinstance(v, Distribution)]
            if bad:
                raise TypeError(f"{name}: entries {bad} are not torch/Pyro distributions")
            self.dists = dict(prior)
            self.fn = None
        elif callable(prior):
            self.dists, self.fn = None, prior
        else:
            raise TypeError(f"{name} must be a distribution, a dict of distributions or a callable, got {type(prior)}")
        self.layout: SiteLayout | None = None

    def supports(self, sites: Sequence[str]) -> dict[str, Constraint]:
        """The declared supports of ``sites`` (those this prior states)."""
        if self.dists is not None:
            if "" in self.dists:
                if len(sites) != 1:
                    raise TypeError(f"{self.name} is one distribution but there are sites {list(sites)}; pass a dict")
                return {sites[0]: _declared_support(self.dists[""])}
            return {k: _declared_support(d) for k, d in self.dists.items() if k in sites}
        declared = getattr(self.fn, "support", None)
        return dict(declared) if isinstance(declared, Mapping) else {}

    def bind(self, layout: SiteLayout) -> None:
        """Attach the layout, checking that the prior covers its sites with matching shapes."""
        sites = list(layout.shapes)
        if self.dists is not None:
            if "" in self.dists:
                if len(sites) != 1:
                    raise TypeError(f"{self.name} is one distribution but there are sites {sites}; pass a dict")
                self.dists = {sites[0]: self.dists.pop("")}
            missing = [s for s in sites if s not in self.dists]
            extra = [s for s in self.dists if s not in layout.shapes]
            if missing or extra:
                raise ValueError(f"{self.name} covers sites {sorted(self.dists)}, the samples have sites {sites}")
            for site, dist in self.dists.items():
                dshape = dist.batch_shape + dist.event_shape
                shape = layout.shapes[site]
                try:
                    ok = len(dshape) <= len(shape) and torch.broadcast_shapes(dshape, shape) == shape
                except RuntimeError:
                    ok = False
                if not ok:
                    raise ValueError(
                        f"{self.name} for site {site!r} has shape {tuple(dshape)}, "
                        f"which does not match the site's shape {tuple(shape)} (dimension mismatch)"
                    )
        if self.dists is not None:
            self.dists = {k: _unvalidated(d) for k, d in self.dists.items()}
        self.layout = layout

    def log_prob(self, values: Mapping[str, Tensor]) -> Tensor:
        """Log prior density of a batch ``site -> [B, *shape]``, returns ``[B]``."""
        layout = self.layout
        if layout is None:
            raise RuntimeError(f"{self.name} is not bound to a layout")
        first = next(iter(layout.shapes))
        batch = values[first].shape[: values[first].dim() - len(layout.shapes[first])]
        if self.fn is not None:
            out = torch.as_tensor(self.fn(dict(values)))
            if out.shape != batch:
                raise ValueError(f"{self.name} callable returned shape {tuple(out.shape)}, expected {tuple(batch)}")
            return out
        if self.dists is None:
            raise RuntimeError(f"{self.name} has neither a callable nor distributions")
        total = values[first].new_zeros(batch)
        for site, dist in self.dists.items():
            lp = dist.log_prob(values[site])
            total = total + lp.reshape(batch + (-1,)).sum(-1)
        return total

    def flat_log_prob(self, theta: Tensor) -> Tensor:
        """Log prior density of flat constrained values ``[..., D]``."""
        if self.layout is None:
            raise RuntimeError(f"{self.name} is not bound to a layout")
        batch = theta.shape[:-1]
        flat = theta.reshape(-1, theta.shape[-1])
        return self.log_prob(self.layout.unflatten(flat, constrained=True)).reshape(batch)


def _declared_support(dist: Distribution) -> Constraint:
    """``dist.support``: torch types it ``Constraint | None``, but every concrete distribution declares one."""
    return cast(Constraint, dist.support)
