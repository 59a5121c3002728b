"""Hilbert coresets: a small weighted subset of the data whose weighted log-likelihood matches the full one.

Pipeline for an ordinary Pyro model with a data plate:

1. draw ``pi_hat`` samples of the global parameters (:func:`laplace_samples`, :func:`prior_samples`,
   :func:`subsample_mcmc_samples` or your own ``{site: [J, ...]}`` dict);
2. project the per-datum log-likelihoods to ``J`` random features (:meth:`Projector.from_model`,
   weighted Fisher or L2 norm);
3. build a coreset with an injected solver (:class:`HilbertCoreset`, Frank-Wolfe / importance /
   uniform sampling, or :func:`streaming_coreset` over shards);
4. run any Pyro MCMC kernel on :func:`weighted_model`.

The core (projection, solvers, streaming) needs only torch, and so does importing this package.
The Pyro glue (:class:`ModelLogLikelihood`, the ``pi_hat`` samplers, :func:`weighted_model`) lives in
:mod:`neuralblock.pyro.coresets`; its names are still importable from here (and from the old module
``neuralblock.coresets.pyro_model``), and Pyro is imported on the first access of one of them.

References:
    Campbell, T. and Broderick, T. "Automated Scalable Bayesian Inference via Hilbert Coresets",
    JMLR 20(15), 2019.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro.infer import MCMC, NUTS
    >>> from neuralblock.coresets import HilbertCoreset, Projector, laplace_samples, weighted_model
    >>> x = torch.randn(2000, 2)
    >>> y = torch.distributions.Bernoulli(logits=x @ torch.tensor([1.0, -2.0])).sample()
    >>> def model(x, y):
    ...     beta = pyro.sample("beta", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    ...     with pyro.plate("data", len(y)) as idx:
    ...         pyro.sample("y", dist.Bernoulli(logits=x[idx] @ beta), obs=y[idx])
    >>> pi_hat = laplace_samples(model, 100, model_args=(x, y))
    >>> proj = Projector.from_model(model, pi_hat, norm="fisher", model_args=(x, y))
    >>> coreset = HilbertCoreset(proj, method="fw").build(50)
    >>> len(coreset.indices) <= 50
    True
    >>> mcmc = MCMC(NUTS(weighted_model(model, coreset)), num_samples=20, warmup_steps=20, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["beta"].shape
    torch.Size([20, 2])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuralblock.coresets.hilbert import HilbertCoreset, merge_coresets, streaming_coreset
from neuralblock.coresets.metrics import gaussian_kl
from neuralblock.coresets.projection import LogLikelihood, Norm, Projector
from neuralblock.coresets.solvers import (
    Coreset,
    CoresetSolver,
    FrankWolfe,
    FWResult,
    ImportanceSampling,
    UniformSampling,
    coreset_error,
    frank_wolfe,
    nnls_gram,
)

if TYPE_CHECKING:
    from neuralblock.pyro.coresets import (
        ModelLogLikelihood,
        PlateIndices,
        WeightedModel,
        laplace_samples,
        prior_samples,
        subsample_mcmc_samples,
        weighted_model,
    )

# names that need Pyro: imported from neuralblock.pyro.coresets on first access
_PYRO_NAMES = (
    "ModelLogLikelihood",
    "PlateIndices",
    "WeightedModel",
    "laplace_samples",
    "prior_samples",
    "subsample_mcmc_samples",
    "weighted_model",
)

__all__ = [
    "Coreset",
    "CoresetSolver",
    "FWResult",
    "FrankWolfe",
    "HilbertCoreset",
    "ImportanceSampling",
    "LogLikelihood",
    "ModelLogLikelihood",
    "Norm",
    "PlateIndices",
    "Projector",
    "UniformSampling",
    "WeightedModel",
    "coreset_error",
    "frank_wolfe",
    "gaussian_kl",
    "laplace_samples",
    "merge_coresets",
    "nnls_gram",
    "prior_samples",
    "streaming_coreset",
    "subsample_mcmc_samples",
    "weighted_model",
]


def __getattr__(name: str) -> Any:
    if name not in _PYRO_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("neuralblock.pyro.coresets"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PYRO_NAMES))
