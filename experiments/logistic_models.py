"""Bayesian logistic regression as the logistic studies write it: ``w ~ N(0, I)``, ``y ~ Bernoulli(σ(X w))``.

``logistic_austerity`` runs its samplers on it (NumPyro NUTS on :func:`numpyro_logistic_model`) with its data
sets (:class:`Dataset`: :func:`synthetic`, :func:`mnist_7_vs_9`, :func:`coreset_dataset`), the Laplace
approximation (:func:`laplace_fit`, :class:`LaplaceProposal`) and the importance-sampling reference
(:func:`reference_posterior`); ``joint_dpm`` uses :func:`logistic_model` for each expert of its mixture. Both
studies' data sets take their ``size`` and ``dim`` from :class:`Design`.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

from neuralblock.io import data_path


class Design:
    """``size`` and ``dim`` of a data set whose training inputs are the matrix ``X [N, D]`` (numpy or torch).

    Example:
        >>> import torch
        >>> class Points(Design):
        ...     X = torch.zeros(5, 3)
        >>> Points().size, Points().dim
        (5, 3)
    """

    X: Any

    @property
    def size(self) -> int:
        """Number of training points ``N``."""
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        """Number of columns ``D`` of ``X``: the inputs (with an intercept column where the study adds one)."""
        return int(self.X.shape[1])


def logistic_model(X: Tensor, y: Tensor) -> None:
    """Bayesian logistic regression in Pyro's subsampling idiom (sections = data points).

    The logits are written ``(X[idx] * w).sum(-1)`` rather than ``X[idx] @ w`` so that they
    broadcast a leading batch dimension of ``w`` (``[P, 1, D]`` gives ``[P, k]`` logits): then
    :class:`AusterityMH` evaluates ``θ`` and ``θ'`` of a test stage in one model run.

    Example:
        >>> import torch
        >>> from neuralblock.subsample import SectionEvaluator
        >>> X, y = torch.randn(6, 3), torch.ones(6)
        >>> sections = SectionEvaluator(logistic_model, "data", 6, (X, y))
        >>> sections.check_vectorized({}, {"w": torch.randn(2, 3)})
        True
    """
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(X[idx] * w).sum(-1)), obs=y[idx])


def logistic_model_full(X: Tensor, y: Tensor) -> None:
    """The same model written on the full data (what a user runs with exact MH or NUTS)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def numpyro_logistic_model(X: Any, y: Any) -> None:
    """:func:`logistic_model_full` in NumPyro, on JAX arrays (NumPyro is an optional extra: imported when run)."""
    import numpyro
    import numpyro.distributions as ndist

    w = numpyro.sample("w", ndist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", ndist.Bernoulli(logits=X @ w), obs=y)


@dataclass
class Dataset(Design):
    """A logistic-regression data set: training ``X [N, D]``, labels ``y`` in {0, 1}, test points ``Xt``."""

    name: str
    X: Tensor
    y: Tensor
    Xt: Tensor


# -- data -------------------------------------------------------------------------------------
def synthetic(n: int, d: int, generator: torch.Generator, test: int = 1000) -> Dataset:
    """``X ~ N(0, I)`` (last column an intercept), ``w* ~ N(0, 4/D)``, ``y ~ Bernoulli(σ(X w*))``."""
    X = torch.randn(n + test, d, generator=generator)
    X[:, -1] = 1.0
    w = torch.randn(d, generator=generator) * 2.0 / math.sqrt(d)
    y = torch.bernoulli(torch.sigmoid(X[:n] @ w), generator=generator)
    return Dataset(f"synthetic N={n:.0e} D={d}", X[:n].contiguous(), y, X[n:].contiguous())


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def mnist_7_vs_9(dim: int, generator: torch.Generator) -> Dataset:
    """MNIST test set, digits 7 (y=0) vs 9 (y=1), PCA to ``dim`` standardised components + intercept."""
    images = torch.from_numpy(_read_idx(data_path("mnist_test_idx", "t10k-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(_read_idx(data_path("mnist_test_idx", "t10k-labels-idx1-ubyte.gz")).copy())
    keep = (labels == 7) | (labels == 9)
    pixels = images[keep].reshape(int(keep.sum()), -1).float() / 255.0
    y = (labels[keep] == 9).float()
    centred = pixels - pixels.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    scores = centred @ v[:dim].T
    scores = scores / scores.std(0)
    X = torch.cat([scores, torch.ones(len(y), 1)], 1)
    order = torch.randperm(len(y), generator=generator)
    cut = int(0.8 * len(y))
    return Dataset(f"MNIST 7v9 D={dim + 1}", X[order[:cut]].contiguous(), y[order[:cut]], X[order[cut:]].contiguous())


def coreset_dataset(name: str) -> Dataset:
    """A logistic data set of ``data/coresets_data`` (trailing intercept column, ``y`` in {-1, +1})."""
    arrays = np.load(data_path("coresets_data", f"{name}.npz"))
    X = torch.from_numpy(arrays["X"]).float()
    mean, sd = X[:, :-1].mean(0), X[:, :-1].std(0).clamp_min(1e-8)

    def standardise(features: Tensor) -> Tensor:
        return torch.cat([(features[:, :-1] - mean) / sd, features[:, -1:]], 1)

    y = (torch.from_numpy(arrays["y"]).float() > 0).float()
    return Dataset(name, standardise(X).contiguous(), y, standardise(torch.from_numpy(arrays["Xt"]).float()))


# -- Laplace fit and the reference ---------------------------------------------------------
def _chunks(n: int, size: int = 200_000) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def _fisher(X: Tensor, w: Tensor, rows: int = 20_000) -> Tensor:
    """``Xᵀ diag(σ(Xw)(1 - σ(Xw))) X`` in float64, chunked (cache-sized chunks: faster than large ones)."""
    fisher = torch.zeros(X.shape[1], X.shape[1], dtype=torch.float64)
    for part in _chunks(X.shape[0], rows):
        chunk = X[part]
        p = torch.sigmoid(chunk @ w.float())
        fisher += (chunk.T @ (chunk * (p * (1 - p))[:, None])).double()
    return fisher


def _gradient(X: Tensor, y: Tensor, w: Tensor, rows: int = 20_000) -> Tensor:
    """Log-likelihood gradient ``Xᵀ (y - σ(Xw))`` in float64, chunked (cache-sized chunks)."""
    grad = torch.zeros(X.shape[1], dtype=torch.float64)
    for part in _chunks(X.shape[0], rows):
        grad += (X[part].T @ (y[part] - torch.sigmoid(X[part] @ w.float()))).double()
    return grad


def _newton(
    w: Tensor,
    gradient: Callable[[Tensor], Tensor],
    fisher: Callable[[Tensor], Tensor],
    tolerance: float,
    iterations: int,
    last_step: bool = False,
) -> tuple[Tensor, Tensor]:
    """Newton steps on the log-likelihood plus the ``N(0, I)`` prior until the squared decrement is below ``tolerance``.

    Returns the point and the Fisher at it (``last_step``: the step that met the tolerance is
    taken too, and the Fisher returned is the one before it).
    """
    eye = torch.eye(w.numel(), dtype=torch.float64)
    for it in range(iterations + 1):
        grad, info = gradient(w) - w, fisher(w)
        step = torch.linalg.solve(info + eye, grad)
        if it == iterations or float(grad @ step) < tolerance:
            return (w + step if last_step else w), info
        w = w + step
    return w, info


def laplace_fit(
    ds: Dataset, iterations: int = 25, tolerance: float = 1e-8, fisher_rows: int = 50_000
) -> tuple[Tensor, Tensor, Tensor]:
    """Posterior mode, Laplace covariance and log-likelihood Hessian, by Newton steps with a subsampled Fisher.

    With ``N <= fisher_rows`` this is plain Newton on the full data. It stops when the squared
    Newton decrement ``gᵀ P⁻¹ g`` (the squared length of the next step in posterior-sd units) is
    below ``tolerance``: the mode is then off by ~1e-4 posterior sds, and float32 rounding of the
    O(N) gradient sums cannot keep it iterating. With ``N > fisher_rows``, a fixed uniform
    subsample of ``n = fisher_rows`` rows (likelihood scaled by ``N / n``) gives a start near the
    mode (Newton on the subsample alone); then each step uses the full-data gradient and the
    subsample's scaled Fisher at that start (computed once). Their fixed point is where the
    full-data gradient vanishes, so they converge to the exact mode, linearly at a rate of about
    ``√(D / n)``; a step costs one O(N D) pass instead of the full Fisher's O(N D²). They stop
    once the squared decrement is below ``100 · tolerance`` and take that last step, which leaves
    the mode off by about ``10 √tolerance · √(D / n)`` (~3e-5) posterior sds. The returned
    covariance and Hessian are exact: one full-data Fisher pass at the returned mode (the
    control variate needs the exact Hessian: its per-section terms use each section's exact
    Hessian, and their O(N) sum uses this matrix). The subsample comes from a fixed seed, so
    the fit does not consume the caller's random stream.

    Example:
        >>> ds = synthetic(200, 3, torch.Generator().manual_seed(0))
        >>> mode, cov, hessian = laplace_fit(ds)
        >>> mode.shape, cov.shape, bool((hessian.diagonal() < 0).all())
        (torch.Size([3]), torch.Size([3, 3]), True)
    """
    w = torch.zeros(ds.dim, dtype=torch.float64)
    if ds.size <= fisher_rows:
        w, fisher = _newton(w, lambda v: _gradient(ds.X, ds.y, v), lambda v: _fisher(ds.X, v), tolerance, iterations)
    else:
        rows = torch.randperm(ds.size, generator=torch.Generator().manual_seed(0))[:fisher_rows]
        X_sub, y_sub, scale = ds.X[rows], ds.y[rows], ds.size / fisher_rows
        w, start_fisher = _newton(
            w, lambda v: scale * _gradient(X_sub, y_sub, v), lambda v: scale * _fisher(X_sub, v), 1.0, iterations
        )
        w, _ = _newton(
            w, lambda v: _gradient(ds.X, ds.y, v), lambda v: start_fisher, 100 * tolerance, iterations, last_step=True
        )
        fisher = _fisher(ds.X, w)  # exact, at the returned mode
    precision = fisher + torch.eye(ds.dim, dtype=torch.float64)
    return w.float(), torch.linalg.inv(precision).float(), (-fisher).float()


def _log_likelihood(ds: Dataset, W: Tensor) -> Tensor:
    """Full-data log-likelihood of each weight vector in ``W [K, D]``, chunked over the data."""
    total = torch.zeros(W.shape[0], dtype=torch.float64)
    rows = max(1_000, 4_000_000 // max(W.shape[0], 1))  # bounds the [rows, K] temporaries (~16 MB)
    for part in _chunks(ds.size, rows):
        logits = ds.X[part] @ W.T
        total += (ds.y[part][:, None] * logits - torch.nn.functional.softplus(logits)).sum(0).double()
    return total


def _ratio_estimate(units: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Self-normalised estimate ``Σ a_j / Σ b_j`` over iid units and its delta-method standard error.

    ``units [J, ...]`` holds ``a_j`` (weighted sums of a function per unit), ``weights [J]`` the ``b_j``.
    """
    total = weights.sum()
    estimate = units.sum(0) / total
    residual = units - estimate * weights.reshape(-1, *([1] * (units.dim() - 1)))
    return estimate, (residual**2).sum(0).sqrt() / total


def reference_posterior(
    ds: Dataset, mode: Tensor, cov: Tensor, pairs: int, generator: torch.Generator, block: int = 2_000
) -> dict[str, Any]:
    """Posterior mean, sd and test predictive mean by antithetic self-normalised importance sampling.

    Proposal ``N(mode, (1 + 2/D)² cov)``, drawn in antithetic pairs ``(w, 2·mode - w)``; weights
    ``p(w) p(y | w) / q(w)`` on the full likelihood. For a nearly Gaussian posterior the pair's
    odd-order noise cancels, so the mean and predictive mean are far more accurate than from
    independent draws. Monte Carlo standard errors treat the pairs as iid units (delta method
    for the ratio estimator), and are returned in posterior sds (``mean_mcse``, ``sd_mcse``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> ds = synthetic(500, 3, g, test=10)
        >>> mode, cov, _ = laplace_fit(ds)
        >>> ref = reference_posterior(ds, mode, cov, 500, g)
        >>> ref["predictive"].shape, bool(ref["mean_mcse"].max() < 0.05), ref["draws"]
        (torch.Size([10]), True, 1000)
    """
    inflation = 1.0 + 2.0 / ds.dim  # tails a little wider than the posterior's; ESS stays high in larger D
    chol = torch.linalg.cholesky(cov.double() * inflation**2)
    proposal = torch.distributions.MultivariateNormal(mode.double(), scale_tril=chol)
    noise = torch.randn(pairs, ds.dim, generator=generator, dtype=torch.float64) @ chol.T
    W = torch.cat([mode.double() + noise, mode.double() - noise])  # rows j and pairs + j form unit j
    log_w = torch.cat(
        [
            torch.distributions.Normal(0.0, 1.0).log_prob(part).sum(-1)
            + _log_likelihood(ds, part.float())
            - proposal.log_prob(part)
            for part in W.split(block)
        ]
    )
    weights = torch.exp(log_w - log_w.max())
    unit_w = weights[:pairs] + weights[pairs:]

    def units(f: Tensor) -> Tensor:  # [2 pairs, ...] -> weighted per-pair sums [pairs, ...]
        wf = weights.reshape(-1, *([1] * (f.dim() - 1))) * f
        return wf[:pairs] + wf[pairs:]

    mean, mean_se = _ratio_estimate(units(W), unit_w)
    var, var_se = _ratio_estimate(units((W - mean) ** 2), unit_w)
    sd = var.sqrt()
    probs = torch.cat([torch.sigmoid(ds.Xt.double() @ part.T) for part in W.split(block)], 1).T  # [2 pairs, test]
    predictive, predictive_se = _ratio_estimate(units(probs), unit_w)
    ess = float(weights.sum() ** 2 / (weights**2).sum())
    return {
        "mean": mean.float(),
        "sd": sd.float(),
        "predictive": predictive.float(),
        "mean_mcse": (mean_se / sd).float(),
        "sd_mcse": (var_se / (2 * var)).float(),
        "predictive_mcse": predictive_se.float(),
        "ess": ess,
        "draws": 2 * pairs,
    }


class LaplaceProposal:
    """Independence proposal ``N(mode, scale² cov)`` for :class:`AusterityMH` (a callable ``z -> Distribution``)."""

    def __init__(self, mode: Tensor, cov: Tensor, scale: float = 1.1) -> None:
        self.dist = dist.MultivariateNormal(mode, scale_tril=scale * torch.linalg.cholesky(cov))

    def __call__(self, z: Tensor) -> dist.MultivariateNormal:
        return self.dist
