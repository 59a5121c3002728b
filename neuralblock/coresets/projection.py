"""Random finite-dimensional projections of per-datum log-likelihoods (torch only).

The Hilbert-coreset construction needs an inner product between the log-likelihood functions
``L_n(theta) = log p(x_n | theta)``. Campbell & Broderick (2019, Section 5) use two weighted norms with a
weighting distribution ``pi_hat`` over ``theta``, both estimated with ``J`` samples
``theta_1..theta_J ~ pi_hat`` so that ``<L_n, L_m> ~= f_n . f_m`` for feature vectors ``f_n`` in ``R^J``:

* ``"fisher"``: weighted Fisher information, ``E_pi_hat[grad L_n . grad L_m]``; feature
  ``f_nj = sqrt(D / J) * d L_n(theta_j) / d theta[u_j]`` with a uniformly random coordinate ``u_j`` per
  sample, computed as one forward-mode directional derivative (``torch.func.jvp``);
* ``"l2"``: weighted L2, ``E_pi_hat[(L_n - E L_n)(L_m - E L_m)]``; feature
  ``f_nj = (L_n(theta_j) - mean_j L_n(theta_j)) / sqrt(J)``.

Both are vectorized with ``torch.func.vmap`` over the ``J`` samples and over a chunk of data indices at
once, so the memory is ``O(chunk_size x J)`` beyond the returned features.

References:
    Campbell, T. and Broderick, T. "Automated Scalable Bayesian Inference via Hilbert Coresets",
    JMLR 20(15), 2019.

Example:
    >>> import torch
    >>> x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    >>> loglik = lambda theta, idx: -0.5 * (x[idx] - theta[0]) ** 2  # Gaussian mean, unit variance
    >>> proj = Projector(loglik, torch.randn(50, 1), num_data=100, norm="fisher")
    >>> proj.project(torch.arange(10)).shape
    torch.Size([10, 50])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch.func import jvp, vmap

from neuralblock.coresets.solvers import Coreset, check_size

__all__ = ["LogLikelihood", "Norm", "Projector", "ShiftEstimate"]

_TOTALS_KEPT = 4  # log-likelihood sums of the last projections kept for posterior_shift

Norm = Literal["fisher", "l2"]
LogLikelihood = Callable[[Tensor, Tensor], Tensor]
"""``loglik(theta [D], indices [m]) -> [m]`` per-datum log-likelihoods at one flat parameter vector."""


class ShiftEstimate(NamedTuple):
    """A coreset's estimated shift of the posterior mean (see :meth:`Projector.posterior_shift`).

    Attributes:
        shift: ``[D]`` per coordinate, in ``pi_hat`` sds.
        efficiency: effective fraction of the ``pi_hat`` draws under the importance weights (1 for
            the full data; near 0 when the coreset's log-likelihood differs from the data's by many nats).
    """

    shift: Tensor
    efficiency: float


class Projector:
    """Random features of per-datum log-likelihoods for the weighted Fisher or L2 norm.

    Args:
        loglik: ``loglik(theta, indices)`` with ``theta`` a flat ``[D]`` parameter vector and ``indices``
            a ``LongTensor [m]`` of data indices; returns the ``[m]`` unscaled log-likelihoods. It must
            be written in torch operations (it runs under ``torch.func.vmap`` and, for the Fisher norm,
            ``torch.func.jvp``) unless ``vectorize=False``.
        samples: ``[J, D]`` draws from the weighting distribution ``pi_hat``.
        num_data: number of data points ``N``.
        norm: ``"fisher"`` or ``"l2"``.
        chunk_size: data points evaluated at once (memory ``O(chunk_size x J)``).
        generator: RNG for the Fisher norm's random coordinates.
        vectorize: evaluate the ``J`` samples with ``vmap`` (default); ``False`` loops over the samples
            (never over data), for log-likelihoods with data-dependent control flow.

    Raises:
        ValueError: bad ``samples`` shape, ``J`` or ``num_data`` not positive, unknown norm.

    Example:
        >>> import torch
        >>> y = torch.tensor([0.0, 1.0, 2.0])
        >>> proj = Projector(lambda th, i: -(y[i] - th[0]) ** 2, torch.zeros(4, 1), 3, norm="l2")
        >>> proj.dim, proj.project().abs().max().item()  # L2 features are centred over samples
        (4, 0.0)
    """

    def __init__(
        self,
        loglik: LogLikelihood,
        samples: Tensor,
        num_data: int,
        norm: Norm = "fisher",
        chunk_size: int = 4096,
        generator: torch.Generator | None = None,
        vectorize: bool = True,
    ) -> None:
        if not callable(loglik):
            raise TypeError(f"loglik must be callable (theta [D], indices [m]) -> [m], got {type(loglik).__name__}")
        if not isinstance(samples, Tensor) or samples.dim() != 2:
            shape = tuple(samples.shape) if isinstance(samples, Tensor) else type(samples).__name__
            raise ValueError(f"samples must be a 2-D tensor [J, D] of flat parameter draws, got {shape}")
        check_size(samples.shape[0], "J (number of samples)")
        check_size(samples.shape[1], "D (parameter dimension)")
        if not torch.isfinite(samples).all():
            raise ValueError("samples contain non-finite values")
        if norm not in ("fisher", "l2"):
            raise ValueError(f"unknown norm {norm!r}; expected 'fisher' or 'l2'")
        self.loglik = loglik
        self.samples = samples
        self.num_data = check_size(num_data, "num_data")
        self.norm: Norm = norm
        self.chunk_size = check_size(chunk_size, "chunk_size")
        self.vectorize = vectorize
        num, dim = samples.shape
        self._loglik_totals: list[tuple[Tensor, Tensor]] = []  # (indices, sum of their log-likelihoods), newest first
        coords = torch.randint(dim, (num,), generator=generator)
        self.directions = math.sqrt(dim) * torch.nn.functional.one_hot(coords, dim).to(samples.dtype)

    @classmethod
    def from_model(
        cls,
        model: Callable[..., Any],
        samples: Mapping[str, Tensor],
        data_plate: str = "data",
        norm: Norm = "fisher",
        num_samples: int | None = None,
        chunk_size: int = 4096,
        model_args: Sequence[Any] = (),
        model_kwargs: Mapping[str, Any] | None = None,
        generator: torch.Generator | None = None,
    ) -> Projector:
        """Projector of an ordinary Pyro model's per-datum log-likelihoods.

        The model must index its data with the data plate's indices
        (``with pyro.plate(data_plate, N) as idx: pyro.sample("y", ..., obs=y[idx])``); every global
        latent site (outside the plate) must be in ``samples``.

        Args:
            model: the Pyro model.
            samples: ``{site: [J, *site_shape]}`` draws from ``pi_hat`` (see
                :func:`~neuralblock.coresets.laplace_samples`, :func:`~neuralblock.coresets.prior_samples`,
                :func:`~neuralblock.coresets.subsample_mcmc_samples`, or your own).
            data_plate: name of the data plate.
            norm: ``"fisher"`` or ``"l2"``.
            num_samples: ``J``, keep the first ``J`` draws (default: all).
            chunk_size: data points evaluated at once.
            model_args: positional arguments of the model.
            model_kwargs: keyword arguments of the model.
            generator: RNG for the Fisher norm's random coordinates.

        Example:
            >>> import pyro, pyro.distributions as dist, torch
            >>> y = torch.randn(50)
            >>> def model(y):
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
            ...     with pyro.plate("data", len(y)) as idx:
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
            >>> proj = Projector.from_model(model, {"mu": torch.randn(20)}, model_args=(y,))
            >>> proj.project().shape
            torch.Size([50, 20])
        """
        from neuralblock.pyro.coresets import ModelLogLikelihood

        loglik = ModelLogLikelihood(model, data_plate, model_args, model_kwargs)
        flat = loglik.flatten(samples)
        if num_samples is not None:
            check_size(num_samples, "J (num_samples)")
            if num_samples > flat.shape[0]:
                raise ValueError(f"num_samples={num_samples} but only {flat.shape[0]} draws were given")
            flat = flat[:num_samples]
        return cls(loglik, flat, loglik.num_data, norm=norm, chunk_size=chunk_size, generator=generator)

    @property
    def dim(self) -> int:
        """Projection dimension ``J``."""
        return int(self.samples.shape[0])

    def _evaluate(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        """``[J, m]`` features before scaling (log-likelihoods (L2) or directional derivatives (Fisher)) and
        the ``[J, m]`` log-likelihoods themselves (forward-mode differentiation computes them anyway)."""

        def loglik(theta: Tensor) -> Tensor:
            return self.loglik(theta, indices)

        with torch.no_grad():
            if self.norm == "l2":
                values = (
                    torch.stack([loglik(t) for t in self.samples]) if not self.vectorize else vmap(loglik)(self.samples)
                )
                return values, values
            if not self.vectorize:
                pairs = [jvp(loglik, (theta,), (direction,)) for theta, direction in zip(self.samples, self.directions)]
                return torch.stack([pair[1] for pair in pairs]), torch.stack([pair[0] for pair in pairs])
            # forward mode over the batched function runs the ops' own derivative formulas on [J, m] tensors
            # instead of batching every derivative op (same values; ~10% less time on a logistic model)
            pair = jvp(vmap(loglik), (self.samples,), (self.directions,))
            return pair[1], pair[0]

    def _check_indices(self, indices: Tensor | None) -> Tensor:
        if indices is None:
            return torch.arange(self.num_data)
        indices = torch.as_tensor(indices)
        if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"indices must be a 1-D integer tensor, got {indices.dtype} {tuple(indices.shape)}")
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_data):
            raise ValueError(f"indices must lie in [0, {self.num_data}), got [{indices.min()}, {indices.max()}]")
        return indices.long()

    def project(self, indices: Tensor | None = None) -> Tensor:
        """Features ``[m, J]`` of the data ``indices`` (default all ``N``), computed chunk by chunk.

        The result is a column-major view (the transpose of a contiguous ``[J, m]`` tensor).

        Raises:
            ValueError: bad indices, or the log-likelihood returned a wrong shape or non-finite values.
        """
        indices = self._check_indices(indices)
        # stored [J, m] and returned as its transpose: Frank-Wolfe's matrix-vector products over all data
        # read a column-major [m, J] matrix about twice as fast as a row-major one
        out = torch.empty(self.dim, len(indices), dtype=self.samples.dtype)
        loglik_total = torch.zeros(self.dim, dtype=torch.float64)
        for start in range(0, len(indices), self.chunk_size):
            chunk = indices[start : start + self.chunk_size]
            values, logliks = self._evaluate(chunk)
            if values.shape != (self.dim, len(chunk)):
                raise ValueError(
                    f"loglik returned shape {tuple(values.shape[1:])} for {len(chunk)} indices; expected "
                    f"({len(chunk)},) per-datum log-likelihoods"
                )
            if not torch.isfinite(values.sum()):  # one reduction instead of a [J, m] mask
                raise ValueError("non-finite per-datum log-likelihoods or gradients at the pi_hat samples")
            loglik_total += logliks.sum(1, dtype=torch.float64)
            if self.norm == "l2":
                values = values - values.mean(0)
            out[:, start : start + len(chunk)] = values / math.sqrt(self.dim)
        kept = (indices.clone(), loglik_total)  # a copy: the caller may change its index tensor later
        self._loglik_totals = [kept, *self._loglik_totals[: _TOTALS_KEPT - 1]]
        return out.T

    def _loglik_total(self, indices: Tensor) -> Tensor | None:
        """``sum_n L_n(theta_j)`` over ``indices`` if a :meth:`project` call of the same indices computed it."""
        for seen, total in self._loglik_totals:
            if seen.shape == indices.shape and torch.equal(seen, indices):
                return total
        return None

    def total(self, indices: Tensor | None = None) -> Tensor:
        """``sum_n f_n`` over ``indices`` (default all), streaming in chunks: memory ``O(chunk_size x J)``."""
        indices = self._check_indices(indices)
        total = torch.zeros(self.dim, dtype=torch.float64)
        for start in range(0, len(indices), self.chunk_size):
            total += self.project(indices[start : start + self.chunk_size]).sum(0, dtype=torch.float64)
        return total

    def log_likelihoods(self, indices: Tensor) -> Tensor:
        """``[J, m]`` per-datum log-likelihoods of ``indices`` at every ``pi_hat`` sample (no gradient)."""
        indices = self._check_indices(indices)
        with torch.no_grad():
            if not self.vectorize:
                return torch.stack([self.loglik(theta, indices) for theta in self.samples])
            return vmap(lambda theta: self.loglik(theta, indices))(self.samples)

    def posterior_shift(self, coreset: Coreset, indices: Tensor | None = None) -> ShiftEstimate:
        """How far a coreset moves the posterior mean, estimated by importance weights over the ``pi_hat`` draws.

        The coreset posterior is the full one times ``exp(e)``, ``e(theta) = sum_n (w_n - 1) l_n(theta)``
        (over ``indices``, default all data). With ``pi_hat`` close to the full posterior, weighting its
        draws by ``exp(e)`` gives the coreset posterior's mean; its shift from the draws' mean, in the
        draws' sds, is the bias the coreset adds (an estimate: it needs ``pi_hat`` near the posterior and
        enough effective draws). ``sum_n l_n`` comes with a :meth:`project` call on the same indices (the
        features' forward-mode pass computes the log-likelihoods too), so the check then evaluates only the
        coreset's points; otherwise it makes one pass over the data, chunk by chunk.

        Example:
            >>> y = torch.randn(200, generator=torch.Generator().manual_seed(0))
            >>> proj = Projector(lambda th, i: -0.5 * (y[i] - th[0]) ** 2, 0.07 * torch.randn(100, 1), 200)
            >>> whole = Coreset(torch.arange(200), torch.ones(200))
            >>> est = proj.posterior_shift(whole)
            >>> float(est.shift.abs().max()) < 1e-12, round(est.efficiency, 6)
            (True, 1.0)
        """
        indices = self._check_indices(indices)
        dense = coreset.dense(self.num_data).to(torch.float64)
        inside = torch.zeros(self.num_data, dtype=torch.bool).index_fill_(0, indices, True)
        points = torch.unique(coreset.indices)
        points = points[inside[points]]  # the coreset's distinct points among the indices
        # sum_rows (w - 1) l = sum_{coreset points} w_n l_n - sum_rows l: the coreset's weight of a datum counts
        # once, the data's sum once per row; that sum came with the projection when it ran on the same rows
        data_sum = self._loglik_total(indices)
        if data_sum is None:
            data_sum = torch.zeros(self.dim, dtype=torch.float64)
            for start in range(0, len(indices), self.chunk_size):
                data_sum += self.log_likelihoods(indices[start : start + self.chunk_size]).sum(1, dtype=torch.float64)
        excess = -data_sum
        if len(points):
            excess = excess + self.log_likelihoods(points).to(torch.float64) @ dense[points]
        draws = self.samples.to(torch.float64)
        importance = torch.softmax(excess, 0)
        scale = draws.std(0).clamp_min(1e-12)
        shift = (importance @ draws - draws.mean(0)) / scale
        return ShiftEstimate(shift, float(1.0 / (importance**2).sum() / self.dim))

    def error(self, coreset: Coreset, total: Tensor | None = None) -> float:
        """``||sum_n f_n - sum_i w_i f_{idx_i}||`` of a coreset without storing all features.

        Args:
            coreset: the coreset.
            total: precomputed :meth:`total` (recomputed in chunks when ``None``).
        """
        total = self.total() if total is None else total
        approx = coreset.weights.to(torch.float64) @ self.project(coreset.indices).to(torch.float64)
        return float((total - approx).norm())
