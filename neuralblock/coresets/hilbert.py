"""Hilbert coresets: an injected projector and solver behind ``build(M)``, ``weights()`` and ``error()``.

References:
    Campbell, T. and Broderick, T. "Automated Scalable Bayesian Inference via Hilbert Coresets",
    JMLR 20(15), 2019.

Example:
    >>> import torch
    >>> x = torch.randn(300, generator=torch.Generator().manual_seed(0))
    >>> proj = Projector(lambda th, i: -0.5 * (x[i] - th[0]) ** 2, torch.randn(40, 1), num_data=300)
    >>> coreset = HilbertCoreset(proj, method="fw")
    >>> core = coreset.build(5)
    >>> len(core.indices) <= 5, coreset.error() < 0.05 * proj.total().norm().item()
    (True, True)
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from neuralblock.coresets.projection import Projector, ShiftEstimate
from neuralblock.coresets.solvers import (
    Coreset,
    CoresetSolver,
    FrankWolfe,
    check_size,
    feature_total,
    make_solver,
)

__all__ = ["HilbertCoreset", "merge_coresets", "streaming_coreset"]

SHIFT_WARNING = 0.1
"""Estimated shift of the posterior mean, in posterior sds, above which ``build`` warns."""
EFFICIENCY_WARNING = 0.1
"""Effective fraction of the ``pi_hat`` draws below which the shift estimate is unreliable and ``build`` warns."""


class HilbertCoreset:
    """A coreset construction over (a subset of) the data, with the projector and solver injected.

    The projected features are computed once, lazily (only when the solver or :meth:`error` needs
    them) and cached, so calling :meth:`build` for several sizes re-uses them.

    Args:
        projector: the :class:`~neuralblock.coresets.projection.Projector`.
        method: ``"fw"`` (Frank-Wolfe), ``"is"`` (importance sampling), ``"uniform"``, or any
            :class:`~neuralblock.coresets.solvers.CoresetSolver`.
        indices: optional data indices to build on (a shard); default all ``N``.
        generator: RNG of the random constructions (uniform, IS); default torch's global RNG.
        check: after each :meth:`build`, estimate how far the coreset moves the posterior mean
            (:meth:`Projector.posterior_shift`, one more pass over the data; kept in :attr:`shift`)
            and warn when it is over 0.1 posterior sds (the estimate is off by a factor of up to about 5
            on the bias bench, either way) or rests on under a tenth of
            the ``pi_hat`` draws.

    Example:
        >>> import torch
        >>> y = torch.arange(10.0)
        >>> proj = Projector(lambda th, i: -(y[i] - th[0]) ** 2, torch.randn(8, 1), num_data=10)
        >>> hc = HilbertCoreset(proj, "uniform", generator=torch.Generator().manual_seed(0))
        >>> float(hc.build(4).weights.sum()), hc.weights().shape
        (10.0, torch.Size([10]))
    """

    def __init__(
        self,
        projector: Projector,
        method: str | CoresetSolver = "fw",
        indices: Tensor | None = None,
        generator: torch.Generator | None = None,
        check: bool = True,
    ) -> None:
        if not isinstance(projector, Projector):
            raise TypeError(f"projector must be a Projector, got {type(projector).__name__}")
        self.projector = projector
        self.solver = make_solver(method)
        self.indices = projector._check_indices(indices)
        if len(self.indices) == 0:
            raise ValueError("cannot build a coreset on an empty set of indices")
        self.generator = generator
        self._features: Tensor | None = None
        self._weights: Tensor | None = None
        self.check = bool(check)
        self.shift: ShiftEstimate | None = None

    @property
    def features(self) -> Tensor:
        """``[n, J]`` projected log-likelihoods of :attr:`indices` (computed on first use)."""
        if self._features is None:
            self._features = self.projector.project(self.indices)
        return self._features

    def build(self, size: int) -> Coreset:
        """Build a coreset with at most ``size`` points.

        Args:
            size: ``M``, the maximal number of non-zero weights.

        Returns:
            :class:`~neuralblock.coresets.solvers.Coreset` with data indices and positive weights.

        Raises:
            ValueError / TypeError: ``size`` is not a positive integer.
        """
        check_size(size)
        features = self.features if self.solver.needs_features else None
        weights = self.solver.solve(features, len(self.indices), size, self.generator)
        if weights.shape != (len(self.indices),) or not torch.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"solver {type(self.solver).__name__} returned invalid weights (shape, sign or NaN)")
        self._weights = weights
        coreset = Coreset.from_dense(weights, self.indices)
        if self.check:
            self.shift = self.projector.posterior_shift(coreset, self.indices)
            worst = float(self.shift.shift.abs().max())
            if not worst <= SHIFT_WARNING or not self.shift.efficiency >= EFFICIENCY_WARNING:  # NaN warns too
                warnings.warn(
                    f"HilbertCoreset: the coreset of {len(coreset.indices)} points moves the posterior mean by about "
                    f"{worst:.2g} posterior sds or more (importance estimate over the pi_hat draws, which understates "
                    f"large shifts; effective fraction {self.shift.efficiency:.2g}); a posterior on it is biased. "
                    "Build a larger coreset",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return coreset

    def _built(self) -> Tensor:
        if self._weights is None:
            raise RuntimeError("call build(M) first")
        return self._weights

    def weights(self) -> Tensor:
        """Dense ``[N]`` weights of the last build (zeros off the coreset and off :attr:`indices`)."""
        return self.coreset().dense(self.projector.num_data)

    def coreset(self) -> Coreset:
        """The last built :class:`~neuralblock.coresets.solvers.Coreset`."""
        return Coreset.from_dense(self._built(), self.indices)

    def error(self) -> float:
        """``||sum_n f_n - sum_n w_n f_n||`` over :attr:`indices`, in the projected Hilbert norm."""
        weights = self._built()
        support = torch.nonzero(weights > 0).squeeze(1)
        approx = weights[support].to(torch.float64) @ self.features[support].to(torch.float64)
        return float((feature_total(self.features) - approx).norm())


def merge_coresets(
    projector: Projector | None, coresets: list[Coreset], size: int | None = None, method: str | CoresetSolver = "fw"
) -> Coreset:
    """Merge coresets of disjoint shards: concatenate, and optionally recompress to ``size`` points.

    Recompression runs the solver on the union's weighted features ``w_i f_i`` (whose sum is the
    merged approximation of ``L``) and multiplies the resulting weights in.

    Args:
        projector: the projector the shard coresets were built with (only needed to recompress).
        coresets: the shard coresets.
        size: recompress to at most this many points (default: keep the union).
        method: solver of the recompression.

    Example:
        >>> a = Coreset(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))
        >>> b = Coreset(torch.tensor([5]), torch.tensor([3.0]))
        >>> merge_coresets(None, [a, b])  # projector unused without recompression
        Coreset(indices=tensor([0, 2, 5]), weights=tensor([1., 2., 3.]))
    """
    if not coresets:
        raise ValueError("merge_coresets needs at least one coreset")
    indices = torch.cat([c.indices for c in coresets])
    weights = torch.cat([c.weights.to(torch.float64 if size is not None else c.weights.dtype) for c in coresets])
    order = torch.argsort(indices)
    merged = Coreset(indices[order], weights[order])
    if size is None:
        return merged
    if len(torch.unique(merged.indices)) != len(merged.indices):
        raise ValueError("the coresets overlap; merge coresets of disjoint shards")
    if projector is None:
        raise ValueError("recompressing merged coresets needs their projector")
    solver = make_solver(method)
    scaled = projector.project(merged.indices).to(torch.float64) * merged.weights[:, None]
    factors = solver.solve(scaled, len(merged.indices), check_size(size), None)
    return Coreset.from_dense(factors * merged.weights, merged.indices)


def streaming_coreset(
    projector: Projector,
    size: int,
    num_shards: int,
    method: str | CoresetSolver = "fw",
    shard_size: int | None = None,
    recompress: bool = True,
    generator: torch.Generator | None = None,
) -> Coreset:
    """Streaming / distributed construction: a coreset per shard, then a merge.

    The data indices are split into ``num_shards`` contiguous shards; each shard's features are
    computed, reduced to a coreset of ``shard_size`` points (default ``size``) and dropped, so the
    memory is that of one shard. The shard coresets are merged and, with ``recompress``, reduced to
    ``size`` points by Frank-Wolfe on the union. Shards are independent, so they may be built on
    different workers and merged with :func:`merge_coresets`.

    Args:
        projector: the projector (the same random features for every shard).
        size: ``M`` of the result.
        num_shards: number of shards.
        method: per-shard solver.
        shard_size: per-shard coreset size (default ``size``).
        recompress: Frank-Wolfe on the union down to ``size`` points (else the union is returned, with
            up to ``num_shards * shard_size`` points).
        generator: RNG of random per-shard solvers.

    Example:
        >>> import torch
        >>> x = torch.randn(400, generator=torch.Generator().manual_seed(1))
        >>> proj = Projector(lambda th, i: -0.5 * (x[i] - th[0]) ** 2, torch.randn(30, 1), num_data=400)
        >>> core = streaming_coreset(proj, 10, num_shards=4)
        >>> len(core.indices) <= 10, bool((core.weights > 0).all())
        (True, True)
    """
    check_size(size)
    check_size(num_shards, "num_shards")
    shard_size = size if shard_size is None else check_size(shard_size, "shard_size")
    shards = torch.tensor_split(torch.arange(projector.num_data), num_shards)
    parts = [
        HilbertCoreset(projector, method, shard, generator, check=False).build(shard_size)  # a shard's bias is moot
        for shard in shards
        if len(shard)
    ]
    return merge_coresets(projector, parts, size if recompress else None, FrankWolfe())
