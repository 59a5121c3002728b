"""Post-inference prior swapping (Neiswanger and Xing, ICML 2017).

Reuse a posterior inferred under a convenient *false* prior ``π_f`` to sample the posterior
under any *target* prior ``π``: sample ``p_s(θ) ∝ π(θ) p̃_f(θ) / π_f(θ)``, where ``p̃_f`` is the
false posterior (exact, or estimated from its draws). Each iteration costs nothing in the data
size. The plain importance-sampling baseline (:func:`importance_swap`) reweights the false
posterior's draws by ``π / π_f`` and warns when its weights degenerate.

Example:
    >>> import torch
    >>> from pyro.infer import MCMC
    >>> from torch.distributions import Normal, Laplace
    >>> from neuralblock.priorswap import PriorSwap
    >>> draws = {"theta": 2.0 + 0.2 * torch.randn(1000)}  # false posterior under N(0, 1)
    >>> mcmc = MCMC(PriorSwap(draws, Normal(0.0, 1.0), Laplace(0.0, 1.0), kernel="mh"),
    ...             num_samples=100, warmup_steps=100, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["theta"].shape
    torch.Size([100])
"""

from neuralblock.priorswap.estimators import (
    ExactPosterior,
    FalsePosteriorDensity,
    GaussianFit,
    GaussianMixtureFit,
    SemiparametricFit,
    fit_false_posterior,
)
from neuralblock.priorswap.kernel import (
    PriorSwap,
    SwapMHInfo,
    fit_swap_reference,
    preconditioned_walk_propose,
    swap_mh_step,
)
from neuralblock.priorswap.layout import SiteLayout, SitePrior, same_support, support_key
from neuralblock.priorswap.swap import (
    ISResult,
    SwappedModel,
    SwappedPotential,
    SwapProblem,
    effective_sample_size,
    importance_swap,
    swap_log_density,
    swapped_potential_fn,
)

__all__ = [
    "ExactPosterior",
    "FalsePosteriorDensity",
    "GaussianFit",
    "GaussianMixtureFit",
    "ISResult",
    "PriorSwap",
    "SemiparametricFit",
    "SiteLayout",
    "SitePrior",
    "SwapMHInfo",
    "SwapProblem",
    "SwappedModel",
    "SwappedPotential",
    "effective_sample_size",
    "fit_false_posterior",
    "fit_swap_reference",
    "importance_swap",
    "preconditioned_walk_propose",
    "same_support",
    "support_key",
    "swap_log_density",
    "swap_mh_step",
    "swapped_potential_fn",
]
