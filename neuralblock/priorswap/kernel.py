"""``PriorSwap``: an MCMC kernel on the swapped density p_s(θ) ∝ π(θ) p̃_f(θ) / π_f(θ).

The kernel samples the flat unconstrained vector of the swapped sites with Pyro's HMC or NUTS
(``potential_fn``) or with a preconditioned random-walk Metropolis shell. Samples come back per
site and constrained through :meth:`pyro.infer.MCMC.get_samples` (the kernel's ``transforms``).
Per-iteration cost depends on the false-posterior estimate only, never on the data size.

Kernels: ``"nuts"``/``"hmc"`` (Pyro's, in the estimate's whitened coordinates), ``"mh"``
(preconditioned random walk), ``"independence"`` (the estimate as an independence proposal) and
``"elliptical"``: elliptical slice sampling (Murray, Adams and MacKay, 2010) with the estimate's
Gaussian ``N(m, L Lᵀ)`` as its reference, ``p_s(z) = N(z; m, L Lᵀ) · [p_s(z) / N(z; m, L Lᵀ)]``.
It has no step size to tune and never rejects; when the data dominate both priors the second
factor is nearly flat over the posterior and draws are nearly independent, and unlike the
independence sampler it stays efficient when the new prior moves the posterior by a fraction of an
sd in every one of many coordinates (its moves are local: an ellipse through the current point).

Corrections:

* ``correction="semiparametric"``: the chain targets p_s built from the semiparametric estimate
  (parametric start times a kernel correction) instead of the parametric fit: asymptotically
  exact as the number of false-posterior draws grows.
* ``correction="is"``: the chain targets the parametric p_s; :meth:`PriorSwap.importance_weights`
  reweights its draws back towards the false-posterior *draws*, with
  ``w(θ) = p̂_sp(z) / p̃_f(z)`` (semiparametric estimate over the parametric estimate, both on
  ``z``; priors cancel), self-normalized. Equivalently the reweighted draws target
  ``π(θ) p̂_sp(θ) / π_f(θ)``.

References:
    W. Neiswanger and E. Xing, "Post-Inference Prior Swapping", ICML 2017.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from pyro.infer.mcmc import HMC, NUTS
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor
from torch.distributions.constraints import Constraint

from neuralblock.kernels.adaptation import StepSizeAdapter
from neuralblock.kernels.functional import MHInfo, mh_accept
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second
from neuralblock.priorswap.estimators import FalsePosteriorDensity, SemiparametricFit
from neuralblock.priorswap.layout import DEFAULT_SITE, PriorLike, as_sample_dict
from neuralblock.priorswap.swap import ISResult, SwappedModel, SwappedPotential, SwapProblem, normalized_weights

__all__ = [
    "PriorSwap",
    "SwapMHInfo",
    "WhitenedPotential",
    "fit_swap_reference",
    "preconditioned_walk_propose",
    "swap_elliptical_step",
    "swap_independence_step",
    "swap_mh_step",
]

KERNELS = ("nuts", "hmc", "mh", "independence", "elliptical")
MAX_SHRINKS = 256
STALL_ESS_PER_DRAW = 0.02  # below this effective sample size per post-warmup draw (worst coordinate) a run stalled
STALL_MIN_DRAWS = 100  # the check needs this many post-warmup draws (shorter runs give too noisy an ESS)
_PRIOR_ROUNDS = 10  # rounds of 32 false-posterior draws for a start of positive density
_UNIFORM_ROUNDS = 100  # then uniform draws, as Pyro's initialize_model (max_tries=100)
_UNIFORM_RADIUS = 2.0  # as Pyro's init_to_uniform: uniform in (-2, 2) of the unconstrained space
"""Angles tried after which an elliptical slice step keeps the current point (the bracket's limit)."""
CORRECTIONS = (None, "is", "semiparametric")


def preconditioned_walk_propose(z: Tensor, step_size: float, scale_tril: Tensor | None) -> Tensor:
    """Symmetric Gaussian random walk ``z + s L eps`` (``L`` a covariance factor; identity if ``None``).

    Example:
        >>> preconditioned_walk_propose(torch.zeros(3), 0.1, torch.eye(3)).shape
        torch.Size([3])
    """
    eps = torch.randn_like(z)
    return z + step_size * (eps if scale_tril is None else scale_tril @ eps)


class SwapMHInfo(NamedTuple):
    """One MH step on p_s: the new point, its log density and the accept test's record."""

    z: Tensor
    log_density: Tensor
    mh: MHInfo


def swap_mh_step(
    z: Tensor, log_density: Tensor, step_size: float, scale_tril: Tensor | None, problem: SwapProblem
) -> SwapMHInfo:
    """One preconditioned random-walk MH step on ``log p_s`` (a non-finite ratio is a counted rejection).

    Example:
        >>> from torch.distributions import Normal
        >>> problem = SwapProblem(torch.randn(50), Normal(0.0, 1.0), Normal(0.0, 2.0))
        >>> z = torch.zeros(1)
        >>> info = swap_mh_step(z, problem.log_density(z[None])[0], 0.5, None, problem)
        >>> info.z.shape, info.mh.accepted.shape
        (torch.Size([1]), torch.Size([]))
    """
    proposal = preconditioned_walk_propose(z, step_size, scale_tril)
    log_new = problem.log_density(proposal[None])[0]
    info = mh_accept(log_new - log_density)
    return SwapMHInfo(torch.where(info.accepted, proposal, z), torch.where(info.accepted, log_new, log_density), info)


def swap_independence_step(
    z: Tensor, log_density: Tensor, log_q: Tensor, proposal: FalsePosteriorDensity, problem: SwapProblem
) -> tuple[SwapMHInfo, Tensor]:
    """One independence MH step on ``log p_s`` whose proposal is the false-posterior estimate ``q``.

    With ``q = p̃_f`` the ratio ``p_s(z') q(z) / (p_s(z) q(z'))`` reduces to the prior ratio
    ``π(z') π_f(z) / (π(z) π_f(z'))`` when p_s uses the same estimate, so when the data dominate
    both priors almost every proposal is accepted and draws are nearly independent.

    Returns:
        The step's record and ``log q`` of the new point.

    Example:
        >>> from torch.distributions import Normal
        >>> from neuralblock.priorswap.estimators import GaussianFit
        >>> draws = 1.0 + 0.1 * torch.randn(400, 1)
        >>> problem = SwapProblem(draws, Normal(0.0, 1.0), Normal(0.0, 2.0))
        >>> fit, z = GaussianFit(draws), draws[0]
        >>> info, log_q = swap_independence_step(z, problem.log_density(z[None])[0], fit.log_prob(z), fit, problem)
        >>> info.z.shape, bool(info.mh.accept_prob > 0.5)
        (torch.Size([1]), True)
    """
    proposal_z = proposal.sample(1)[0].to(z.dtype)
    log_new = problem.log_density(proposal_z[None])[0]
    log_q_new = proposal.log_prob(proposal_z).to(log_new.dtype)
    info = mh_accept((log_new - log_q_new) - (log_density - log_q))
    keep = info.accepted
    record = SwapMHInfo(torch.where(keep, proposal_z, z), torch.where(keep, log_new, log_density), info)
    return record, torch.where(keep, log_q_new, log_q)


def swap_elliptical_step(
    z: Tensor, log_density: Tensor, loc: Tensor, tril: Tensor, problem: SwapProblem, batch: int = 8
) -> tuple[Tensor, Tensor, int]:
    """One elliptical slice step on ``log p_s`` with the Gaussian reference ``N(loc, tril trilᵀ)``.

    In whitened coordinates ``u = L⁻¹ (z - m)`` the target is ``N(u; 0, I) · exp(ℓ(u))`` with
    ``ℓ(u) = log p_s(m + L u) + |u|² / 2``. The step draws ``ν ~ N(0, I)`` and a slice level
    under ``ℓ(u)``, then moves along the ellipse ``u cos t + ν sin t``, shrinking the angle
    bracket towards ``t = 0`` (the current point) until a point lies above the level. It
    leaves ``p_s`` invariant for any ``m`` and ``L``; a good reference only makes it faster.

    The bracket after a rejection depends only on the rejected angle, so the next ``batch``
    angles the sequential algorithm would try are drawn ahead and scored in one batched
    density call; the first one above the level is taken (the same draw as one at a time).

    Args:
        z: the current flat unconstrained point ``[D]``.
        log_density: ``log p_s(z)``.
        loc: the reference mean ``m [D]``.
        tril: the reference covariance factor ``L [D, D]``.
        problem: the swap problem.
        batch: angles scored per density call.

    Returns:
        The new point, its ``log p_s`` and the number of angles the sequential algorithm tried.

    Example:
        >>> from torch.distributions import Normal
        >>> problem = SwapProblem(1.0 + 0.1 * torch.randn(400, 1), Normal(0.0, 1.0), Normal(0.0, 2.0))
        >>> z = torch.ones(1)
        >>> new, log_p, tried = swap_elliptical_step(
        ...     z, problem.log_density(z[None])[0], torch.ones(1), 0.1 * torch.eye(1), problem)
        >>> new.shape, tried >= 1
        (torch.Size([1]), True)
    """
    u = _whiten(z, loc, tril)
    level = log_density + 0.5 * (u @ u) + math.log(1.0 - float(torch.rand(())))
    nu = torch.randn_like(u)
    angle = 2.0 * math.pi * float(torch.rand(()))
    low, high = angle - 2.0 * math.pi, angle
    tried = 0
    while tried < MAX_SHRINKS:
        angles = []
        for fraction in torch.rand(batch).tolist():  # the angles tried if every earlier one is rejected
            angles.append(angle)
            low, high = (angle, high) if angle < 0.0 else (low, angle)
            angle = low + (high - low) * fraction
        t = torch.tensor(angles, dtype=u.dtype)[:, None]
        candidates = u * t.cos() + nu * t.sin()  # [batch, D]
        points = (loc + candidates @ tril.T).to(z.dtype)
        log_p = problem.log_density(points)
        above = (log_p + 0.5 * (candidates * candidates).sum(-1) > level).nonzero()  # NaN is never above
        if above.numel():
            first = int(above[0, 0])
            return points[first], log_p[first], tried + first + 1
        tried += batch
    return z, log_density, MAX_SHRINKS


BETA2, AVERAGE = 0.95, 0.5
"""Adam's second-moment decay in :func:`fit_swap_reference` and the fraction of its last iterates averaged."""


def fit_swap_reference(
    problem: SwapProblem, loc: Tensor, tril: Tensor, steps: int = 200, draws: int = 64, lr: float = 0.04
) -> tuple[Tensor, Tensor]:
    """Fit the Gaussian ``N(m + L a, L S² Lᵀ)``, ``S = diag(s)``, to p_s by variational inference.

    ``(m, L)`` is the false-posterior estimate's Gaussian; only the whitened shift ``a`` and the
    per-axis scales ``s`` are fitted (``2 D`` numbers; the estimate's correlations are kept). The
    objective is the reparameterized evidence lower bound ``E_q[log p_s] + Σ log s`` with Adam
    (second-moment decay ``BETA2``); the returned parameters average the last ``AVERAGE`` of the
    iterates, which smooths the gradient noise. The fit is coarse on purpose: when the new prior
    moves p_s by several estimate sds, the default 200 steps stop short (about 0.4 target sds
    behind at a 5-sd move), which still narrows the gap the slice sampler has to bridge; it
    never affects the chain's exactness, only its speed. Draws where p_s is not finite are left
    out of a step's average, and a step whose gradient overflows is skipped.

    Args:
        problem: the swap problem (its ``log_density`` must be differentiable in ``z``).
        loc: the estimate's mean ``m [D]``.
        tril: the estimate's covariance factor ``L [D, D]``.
        steps: Adam steps.
        draws: reparameterized draws per step.
        lr: Adam's learning rate (in whitened units).

    Returns:
        The fitted ``(mean [D], factor [D, D])``; the factor is ``L S``.

    Raises:
        ValueError: if p_s carries no gradient (e.g. a prior written in numpy) or is not finite
            at any draw.

    Example:
        >>> from torch.distributions import Normal
        >>> problem = SwapProblem(1.0 + 0.1 * torch.randn(400, 1), Normal(0.0, 1.0), Normal(0.0, 0.1))
        >>> loc, tril = fit_swap_reference(problem, torch.ones(1), 0.1 * torch.eye(1))
        >>> bool(0.4 < loc.item() < 0.6 and 0.06 < tril.item() < 0.08)  # p_s is about N(0.5, 0.0707²)
        True
    """
    params = torch.zeros(2, loc.numel(), dtype=loc.dtype, requires_grad=True)  # rows: shift a, log s
    moment, second = torch.zeros_like(params), torch.zeros_like(params)
    kept, averaged = torch.zeros(2, loc.numel(), dtype=torch.float64), 0
    beta1, beta2 = 0.9, BETA2  # Adam by hand: torch.optim's first use costs over a second of imports
    with torch.enable_grad():
        for step in range(steps):
            shift, log_scale = params
            white = shift + torch.randn(draws, loc.numel(), dtype=loc.dtype) * log_scale.exp()
            log_p = problem.log_density(loc + white @ tril.T)
            if not log_p.requires_grad:
                raise ValueError("fit_swap_reference needs a differentiable p_s; use reference='estimate'")
            finite = torch.isfinite(log_p)
            if not bool(finite.any()):
                raise ValueError("fit_swap_reference: p_s is not finite at any draw around the estimate's Gaussian")
            (grad,) = torch.autograd.grad(-(log_p[finite].mean() + log_scale.sum()), params)
            with torch.no_grad():
                if bool(torch.isfinite(grad).all()):  # a step with an overflowing gradient is skipped
                    moment.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                    second.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                    corrected = moment / (1.0 - beta1 ** (step + 1))
                    scale = (second / (1.0 - beta2 ** (step + 1))).sqrt().add_(1e-8)
                    params -= lr * corrected / scale
                    params[1].clamp_(-3.0, 3.0)
                if step >= steps - max(1, int(AVERAGE * steps)):
                    kept += params.to(torch.float64)
                    averaged += 1
    shift_mean, log_scale_mean = (kept / averaged).to(loc.dtype)
    return loc + tril @ shift_mean, tril * log_scale_mean.exp()[None, :]


WHITE_SITE = "_whitened"
"""The inner HMC/NUTS site of a preconditioned :class:`PriorSwap` (never returned to the user)."""


def _whiten(z: Tensor, loc: Tensor, tril: Tensor) -> Tensor:
    return torch.linalg.solve_triangular(tril, (z.to(loc.dtype) - loc)[:, None], upper=False)[:, 0]


class WhitenedPotential:
    """``u -> potential(m + L u)``: a potential in whitened coordinates (picklable; Jacobian is constant).

    Args:
        potential: the potential on site dicts (e.g. :class:`SwappedPotential`).
        loc: ``m [D]``.
        tril: ``L [D, D]``, lower triangular with a positive diagonal.

    Example:
        >>> from torch.distributions import Normal, Laplace
        >>> problem = SwapProblem(torch.randn(100), Normal(0.0, 1.0), Laplace(0.0, 1.0))
        >>> whitened = WhitenedPotential(SwappedPotential(problem), torch.zeros(1), 2 * torch.eye(1))
        >>> bool(whitened({WHITE_SITE: torch.ones(1)}) == SwappedPotential(problem)({"theta": torch.tensor(2.0)}))
        True
    """

    def __init__(self, potential: SwappedPotential, loc: Tensor, tril: Tensor) -> None:
        self.potential, self.loc, self.tril = potential, loc, tril

    def __call__(self, params: Mapping[str, Tensor]) -> Tensor:
        z = self.loc + self.tril @ params[WHITE_SITE]
        return self.potential(self.potential.problem.layout.unflatten(z))


class PriorSwap(MCMCKernel):
    """MH, HMC or NUTS on the prior-swapped density, inside ``pyro.infer.MCMC``.

    Args:
        false_posterior: draws of the false posterior (dict ``site -> [T, *shape]`` as from
            ``MCMC.get_samples()``, or a Tensor for one site) or a
            :class:`~neuralblock.priorswap.estimators.FalsePosteriorDensity` (e.g. ``ExactPosterior``).
        false_prior: the prior the false posterior was inferred under (distribution, dict of
            distributions per site, or a callable log density on a dict of batched site values).
        target_prior: the prior to swap in (same forms; same support as the false prior).
        kernel: ``"nuts"`` (default), ``"hmc"``, ``"mh"`` (random walk preconditioned by the
            estimate's covariance, step adapted during warmup to ``target_accept``) or
            ``"independence"`` (MH whose proposal is the parametric false-posterior estimate itself:
            the cheapest choice when the data dominate both priors; needs a Gaussian or mixture fit,
            or an exact density that is a distribution on unconstrained values) or ``"elliptical"``
            (elliptical slice sampling around the estimate's Gaussian: no tuning, no rejections,
            robust when the new prior shifts many coordinates; needs an estimate with a mean and
            covariance on unconstrained values).
        reference: elliptical only: ``"fit"`` (default) refines the estimate's Gaussian towards
            p_s before sampling (:func:`fit_swap_reference`: its mean and its scale along each
            of the estimate's whitened axes, by stochastic variational inference; needs a
            differentiable p_s); ``"estimate"`` uses the estimate's Gaussian as it is. Either way
            the reference is fixed while the chain runs, so the chain is exact; a reference
            closer to p_s widens the slices and decorrelates the draws.
        estimator: ``"gaussian"`` (default) or ``"gmm"`` fitted to the draws (the parametric start
            for the corrections), or ``"semiparametric"``.
        correction: ``None``, ``"is"`` (see :meth:`importance_weights`; not with
            ``estimator="semiparametric"``, whose chain already targets the corrected estimate) or
            ``"semiparametric"``.
        site: site name for tensor draws and single distributions.
        supports: explicit supports per site (default: the priors').
        site_shapes: shapes per site when ``false_posterior`` is a density and the false prior a callable.
        estimator_options: keyword options of the estimator (``num_components``, ...).
        bandwidth: the semiparametric kernel's scale factor (default Scott's rule).
        step_size: initial step size (HMC/NUTS: Pyro's; MH: relative to the estimate's covariance,
            default ``2.38 / sqrt(D)``).
        target_accept: warmup adaptation target (default 0.8 for HMC/NUTS, 0.234 for MH).
        kernel_options: extra keyword arguments for Pyro's ``HMC``/``NUTS``.
        precondition: HMC/NUTS run on ``u = L⁻¹ (z - m)`` with ``m``, ``L L^T`` the estimate's
            mean and covariance factor (when it has them, on unconstrained values): an affine
            change of variables, exact
            for any ``m, L``, that turns a correlated, badly scaled p_s into a nearly isotropic
            one, so trajectories stay short (Pyro's adaptation only learns a diagonal mass
            matrix by default).

    Example:
        >>> import pyro
        >>> from pyro.infer import MCMC
        >>> from torch.distributions import Normal, Laplace
        >>> false_draws = {"theta": 1.0 + 0.3 * torch.randn(500)}  # e.g. MCMC(...).get_samples()
        >>> kernel = PriorSwap(false_draws, Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="mh")
        >>> mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, disable_progbar=True)
        >>> mcmc.run()
        >>> mcmc.get_samples()["theta"].shape
        torch.Size([200])
    """

    def __init__(
        self,
        false_posterior: Mapping[str, Tensor] | Tensor | FalsePosteriorDensity,
        false_prior: PriorLike,
        target_prior: PriorLike,
        *,
        kernel: str = "nuts",
        estimator: str = "gaussian",
        correction: str | None = None,
        site: str = DEFAULT_SITE,
        supports: Mapping[str, Constraint] | None = None,
        site_shapes: Mapping[str, tuple[int, ...]] | None = None,
        estimator_options: Mapping[str, Any] | None = None,
        bandwidth: float | None = None,
        step_size: float | None = None,
        target_accept: float | None = None,
        kernel_options: Mapping[str, Any] | None = None,
        precondition: bool = True,
        reference: str = "fit",
    ) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if reference not in ("fit", "estimate"):
            raise ValueError(f"reference must be 'fit' or 'estimate', got {reference!r}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
        if estimator not in ("gaussian", "gmm", "semiparametric"):
            raise ValueError(f"estimator must be 'gaussian', 'gmm' or 'semiparametric', got {estimator!r}")
        if step_size is not None and not step_size > 0:
            raise ValueError(f"step_size must be positive, got {step_size}")
        is_density = isinstance(false_posterior, FalsePosteriorDensity)
        if correction is not None and is_density:
            raise ValueError(f"correction={correction!r} needs false-posterior draws, not a density")
        if correction == "is" and estimator == "semiparametric":
            raise ValueError(
                "correction='is' reweights a chain on the parametric estimate toward the semiparametric one; "
                "with estimator='semiparametric' the chain already targets it: use correction=None"
            )
        parametric = "gaussian" if estimator == "semiparametric" else estimator
        self.problem = SwapProblem(
            false_posterior,
            false_prior,
            target_prior,
            estimator=None if is_density else parametric,
            site=site,
            supports=supports,
            site_shapes=site_shapes,
            estimator_options=estimator_options,
        )
        self.parametric = self.problem.density
        self.corrected: FalsePosteriorDensity | None = None
        if correction is not None or estimator == "semiparametric":
            if self.problem.z is None or self.parametric is None:
                raise ValueError("a semiparametric correction needs false-posterior samples and a parametric fit")
            self.corrected = SemiparametricFit(self.problem.z, parametric=self.parametric, bandwidth=bandwidth)
        if correction == "semiparametric" or estimator == "semiparametric":
            self.problem.density = self.corrected
        self.kernel_name, self.correction = kernel, correction
        self.step_size = step_size
        self.target_accept = target_accept
        self.kernel_options = dict(kernel_options or {})
        self.precondition = bool(precondition)
        self.reference = reference
        self._frame: tuple[Tensor, Tensor] | None = None
        # the sampler's float type: that of the false-posterior draws (float64 draws stay float64)
        self._dtype = self.problem.z.dtype if self.problem.z is not None else torch.get_default_dtype()
        self.potential_fn = SwappedPotential(self.problem)
        self.transforms: dict[str, Any] = self.problem.layout.unconstrained_transforms()
        self._pending_init: dict[str, Tensor] | None = None
        self._inner: HMC | None = None
        self._z: Tensor | None = None
        self._log_p: Tensor | None = None
        self._reset_stats(0)

    # -- the Pyro-facing surface ------------------------------------------------------
    @property
    def model(self) -> SwappedModel:
        """A Pyro model with posterior p_s (improper-uniform sites plus a factor)."""
        return SwappedModel(self.problem)

    @property
    def layout(self) -> Any:
        """The sites' :class:`~neuralblock.pyro.layout.FlatLayout`."""
        return self.problem.layout

    @property
    def initial_params(self) -> dict[str, Tensor]:
        """Initial unconstrained values per site (set before ``setup`` to override the default)."""
        if self._inner is not None:
            return self._from_inner(self._inner.initial_params)
        if self._z is None:
            raise RuntimeError("call setup() before reading initial_params")
        return self._to_params(self._z)

    @initial_params.setter
    def initial_params(self, params: Mapping[str, Tensor]) -> None:
        self._pending_init = {k: torch.as_tensor(v) for k, v in params.items()}

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Choose the initial point and build the inner sampler (model arguments are not needed)."""
        self._reset_stats(warmup_steps)
        if self._pending_init is not None:
            z0 = self._user_start(self._pending_init)
            self._pending_init = None
        else:
            z0 = self._default_init()
        if self.kernel_name == "independence":
            self._inner = None
            proposal = self.parametric
            if proposal is None or (proposal.space == "constrained" and self.problem.layout.constrained_sites):
                raise ValueError(
                    "kernel='independence' needs a false-posterior estimate on unconstrained values "
                    "(fitted draws, or an exact density on real-valued sites)"
                )
            self._proposal = proposal
            self._z, self._log_p = z0, self.problem.log_density(z0[None])[0]
            self._log_q = proposal.log_prob(z0).to(self._log_p.dtype)
            return
        if self.kernel_name == "elliptical":
            self._inner = None
            reference = self._whitening_frame()
            if reference is None:
                raise ValueError(
                    "kernel='elliptical' needs a false-posterior estimate with a mean and covariance on "
                    "unconstrained values (a Gaussian or semiparametric fit, or an exact Gaussian density)"
                )
            if self.reference == "fit":
                reference = fit_swap_reference(self.problem, *reference)
            self._reference: tuple[Tensor, Tensor] = reference
            self._z, self._log_p = z0, self.problem.log_density(z0[None])[0]
            return
        if self.kernel_name == "mh":
            self._inner = None
            dim = self.problem.layout.dim
            initial = self.step_size if self.step_size is not None else 2.38 / math.sqrt(dim)
            self._adapter = StepSizeAdapter(1, initial, self.target_accept or 0.234)
            if self.problem.density is None:
                raise ValueError("the MH prior-swap kernel needs a false-posterior density estimate")
            self._chol = self.problem.density.scale_tril()
            self._z, self._log_p = z0, self.problem.log_density(z0[None])[0]
            return
        cls = NUTS if self.kernel_name == "nuts" else HMC
        options: dict[str, Any] = {"target_accept_prob": self.target_accept or 0.8, **self.kernel_options}
        if self.step_size is not None:
            options["step_size"] = self.step_size
        self._frame = self._whitening_frame() if self.precondition else None
        if self._frame is None:
            inner = cls(potential_fn=self.potential_fn, **options)
            inner.initial_params = self._to_params(z0)
        else:
            loc, tril = self._frame
            inner = cls(potential_fn=WhitenedPotential(self.potential_fn, loc, tril), **options)
            inner.initial_params = {WHITE_SITE: _whiten(z0, loc, tril)}
        inner.setup(warmup_steps)
        self._inner = inner

    def _whitening_frame(self) -> tuple[Tensor, Tensor] | None:
        """``(m, L)`` of the estimate in unconstrained coordinates, or ``None`` when it has no covariance."""
        density = self.problem.density
        if density is None or (density.space == "constrained" and self.problem.layout.constrained_sites):
            return None  # its covariance is not one of the unconstrained coordinates the sampler moves in
        tril = density.scale_tril()
        mean = self._density_mean()
        if tril is None or mean is None or tril.shape != (mean.numel(), mean.numel()):
            return None
        return mean.to(self._dtype), tril.detach().to(self._dtype)

    def _density_mean(self) -> Tensor | None:
        """The estimate's mean in unconstrained coordinates (``None`` if it has none)."""
        problem, density = self.problem, self.problem.density
        mean = getattr(density, "mean", None)
        if mean is None and density is not None:
            mean = getattr(getattr(density, "density", None), "mean", None)
        if not isinstance(mean, Tensor) or mean.numel() != problem.layout.dim:
            return None
        assert density is not None  # the mean came from it
        mean = mean.detach().reshape(-1).to(self._dtype)
        return problem.layout.to_unconstrained(mean) if density.space == "constrained" else mean.clone()

    def _start_log_density(self, z: Tensor) -> Tensor:
        """``log p_s`` at flat starts ``z [B, D]`` (NaN where it cannot be evaluated; setup only)."""
        try:
            return self.problem.log_density(z).detach().reshape(-1)
        except (ValueError, RuntimeError):
            return torch.full((z.shape[0],), math.nan, dtype=z.dtype)

    def _describe(self, z: Tensor) -> str:
        """The sites and values of flat start ``z [D]``, e.g. ``sites ['theta'] at (theta=-0.5)``."""
        parts = self._to_params(z)
        shown = ", ".join(
            f"{k}={float(v):g}" if v.numel() == 1 else f"{k}={v.flatten()[:4].tolist()}" for k, v in parts.items()
        )
        return f"sites {list(parts)} at ({shown}, unconstrained)"

    def _user_start(self, params: Mapping[str, Tensor]) -> Tensor:
        """The flat start of a user's ``initial_params``, refused when impossible.

        Raises:
            ValueError: sites are missing or hold NaN or inf values, or ``log p_s`` is ``-inf`` or NaN there
                (the message names the sites).
        """
        missing = [k for k in self.problem.layout.shapes if k not in params]
        if missing:
            raise ValueError(f"initial_params lack sites {missing}")
        bad = [k for k in self.problem.layout.shapes if not bool(torch.isfinite(params[k]).all())]
        if bad:
            raise ValueError(
                f"initial_params: sites {bad} hold NaN or inf values; give every site a finite unconstrained value"
            )
        z0 = self.potential_fn.flat(params).to(self._dtype)
        if self.problem.density is not None:
            log_p = float(self._start_log_density(z0[None])[0])
            if not math.isfinite(log_p):
                kind = "zero density" if log_p < 0 else ("infinite density" if log_p > 0 else "a NaN log density")
                raise ValueError(
                    f"initial_params have {kind} under the swapped posterior: {self._describe(z0)}; start inside "
                    "the support of the new prior and the false posterior"
                )
        return z0

    def _default_init(self) -> Tensor:
        """Best of up to 32 random false-posterior draws under p_s (or the estimate's mean), of positive density.

        When none has positive density: up to 10 rounds of 32 fresh draws, then up to 100 uniform
        draws in ``(-2, 2)`` of the unconstrained space (as Pyro's ``init_to_uniform`` and
        ``initialize_model``); setup only.

        Raises:
            ValueError: no start of positive density was found (the message names the sites).
        """
        problem = self.problem
        if problem.z is not None:
            for _ in range(_PRIOR_ROUNDS):
                candidates = problem.z[torch.randint(problem.z.shape[0], (min(32, problem.z.shape[0]),))]
                log_p = problem.log_density(candidates).nan_to_num(nan=-math.inf)
                best = int(log_p.argmax())
                if problem.density is None or log_p[best] > -math.inf:
                    return candidates[best].clone()
            start = candidates[0]
        else:
            mean = self._density_mean()
            start = mean if mean is not None else torch.zeros(problem.layout.dim, dtype=self._dtype)
            if problem.density is None or math.isfinite(float(self._start_log_density(start[None])[0])):
                return start
        for _ in range(_UNIFORM_ROUNDS):
            z = (torch.rand(problem.layout.dim, dtype=self._dtype) * 2 - 1) * _UNIFORM_RADIUS
            if math.isfinite(float(self._start_log_density(z[None])[0])):
                return z
        raise ValueError(
            f"PriorSwap found no start of positive swapped density in {_PRIOR_ROUNDS} rounds of false-posterior "
            f"draws and {_UNIFORM_ROUNDS} uniform draws in (-2, 2) unconstrained: e.g. {self._describe(start)}; "
            "the new prior may put no mass where the false posterior does: give initial_params inside both"
        )

    def _to_inner(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        if self._frame is None or not params:
            return params
        return {WHITE_SITE: _whiten(self.potential_fn.flat(params), *self._frame)}

    def _from_inner(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        if self._frame is None:
            return params
        loc, tril = self._frame
        return self._to_params(loc + tril @ params[WHITE_SITE])

    def _to_params(self, z: Tensor) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.problem.layout.unflatten(z).items()}

    def _reset_stats(self, warmup_steps: int) -> None:
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        self._accepted = 0
        self._proposed = 0
        self._nonfinite = 0
        self._evaluations = 0
        self._recent_accept = 0.0
        self._elapsed = 0.0
        # post-warmup (accepted, divergent draw indices, mean accept prob) of HMC/NUTS
        self._inner_stats: tuple[int, list[int], float] = (0, [], 0.0)
        self._phase = (0, 0)  # MH moves accepted and proposed in this phase (warmup or sampling): the bar's rate
        self._draws: list[Tensor] = []  # post-warmup flat draws, for the stall check at cleanup
        self._ess_per_draw = math.nan

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One transition of the inner sampler on p_s (params are unconstrained, per site)."""
        start = time.perf_counter()
        warmup = self._t < self._warmup_steps
        if self._inner is not None:
            out = self._from_inner(self._inner.sample(self._to_inner(params)))
            if not warmup:  # read now: the inner kernel's cleanup() resets its counters before users ask
                inner = self._inner
                self._inner_stats = (inner._accept_cnt, list(inner._divergences), float(inner._mean_accept_prob))
        else:
            assert self._z is not None and self._log_p is not None  # set at setup
            z = self.potential_fn.flat(params).to(self._z.dtype) if params else self._z
            log_p = self._log_p if torch.equal(z, self._z) else self.problem.log_density(z[None])[0]
            if self.kernel_name == "elliptical":
                self._elliptical(z, log_p, warmup)
            else:
                self._metropolis(z, log_p, warmup)
            out = self._to_params(self._z)
        if not warmup:
            self._elapsed += time.perf_counter() - start
            self._draws.append(self.potential_fn.flat(out).detach().reshape(-1))
        self._t += 1
        return out

    def _elliptical(self, z: Tensor, log_p: Tensor, warmup: bool) -> None:
        self._z, self._log_p, evaluations = swap_elliptical_step(z, log_p, *self._reference, self.problem)
        if not warmup:
            self._proposed += 1
            self._evaluations += evaluations
            self._nonfinite += int(evaluations >= MAX_SHRINKS)

    def _metropolis(self, z: Tensor, log_p: Tensor, warmup: bool) -> None:
        if self.kernel_name == "independence":
            assert self._z is not None  # set at setup
            log_q = self._log_q if torch.equal(z, self._z) else self._proposal.log_prob(z).to(log_p.dtype)
            info, self._log_q = swap_independence_step(z, log_p, log_q, self._proposal, self.problem)
        else:
            info = swap_mh_step(z, log_p, float(self._adapter.step_size[0]), self._chol, self.problem)
        self._z, self._log_p = info.z, info.log_density
        accept_prob = info.mh.accept_prob.reshape(1).to(self._log_p.dtype)
        if warmup and self.kernel_name == "mh":
            self._adapter.update(torch.zeros(1, dtype=torch.long), accept_prob.to(self._adapter.log_step.dtype))
        else:
            self._accepted += int(info.mh.accepted)
            self._proposed += 1
            self._nonfinite += int(info.mh.num_nonfinite)  # an int already (mh_accept)
        if self._t == self._warmup_steps:  # the running rate restarts with sampling
            self._phase = (0, 0)
        self._phase = (self._phase[0] + int(info.mh.accepted), self._phase[1] + 1)
        self._recent_accept = self._phase[0] / self._phase[1]

    def logging(self) -> dict[str, Any]:
        """Short progress-bar dict (Pyro's for HMC/NUTS; the phase's running acceptance rate for the MH kernels)."""
        if self._inner is not None:
            return dict(self._inner.logging())
        if self.kernel_name == "elliptical":
            return {"evals": round(self._evaluations / max(self._proposed, 1), 2)}
        return {"acc": round(self._recent_accept, 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Transitions per second; acceptance (MH, HMC/NUTS), divergences, or evaluations per step (elliptical).

        ``divergences`` lists the post-warmup draw indices of HMC/NUTS's divergent transitions (empty for
        the other kernels), as ``arviz.from_pyro`` reads it; ``num_divergences`` counts them.
        """
        post = max(self._t - self._warmup_steps, 0)
        out: KernelDiagnostics = {"transitions_per_second": per_second(post, self._elapsed)}
        out["ess_per_draw"] = self._stall_check(warn=False)
        accepted, divergences, mean_prob = self._inner_stats
        out["divergences"] = list(divergences)
        out["num_divergences"] = float(len(divergences))
        if self._inner is not None:
            out["acceptance_rate"] = accepted / post if post else 0.0
            out["mean_accept_prob"] = mean_prob
            out["step_size"] = float(self._inner.step_size)
        elif self.kernel_name == "elliptical":
            out["evaluations_per_iteration"] = self._evaluations / self._proposed if self._proposed else 0.0
            out["stuck_iterations"] = float(self._nonfinite)
        else:
            out["acceptance_rate"] = self._accepted / self._proposed if self._proposed else 0.0
            out["nonfinite_rejections"] = float(self._nonfinite)
            if self.kernel_name == "mh":
                out["step_size"] = float(self._adapter.step_size[0])
        return out

    def cleanup(self) -> None:
        """Check the run for a stall (with a warning) and release the inner sampler's caches."""
        self._stall_check(warn=True)
        if self._inner is not None:
            self._inner.cleanup()

    def _stall_check(self, warn: bool) -> float:
        """The run's worst-coordinate effective sample size per post-warmup draw; warns (once) below the threshold.

        NaN for runs shorter than ``STALL_MIN_DRAWS`` draws. The draws are kept until the next ``setup``.
        """
        if len(self._draws) < STALL_MIN_DRAWS:
            return math.nan
        if math.isnan(self._ess_per_draw) or warn:
            from pyro.ops.stats import effective_sample_size

            draws = torch.stack(self._draws).double()
            moving = draws.std(0) > 0
            if not bool(moving.any()):
                ess = torch.ones(1, dtype=draws.dtype)
            else:
                ess = effective_sample_size(draws[None][..., moving], chain_dim=0, sample_dim=1)
            self._ess_per_draw = float(ess.nan_to_num(1.0).min()) / len(self._draws)
        if warn and self._ess_per_draw < STALL_ESS_PER_DRAW:
            warnings.warn(
                f"PriorSwap(kernel={self.kernel_name!r}) stalled: effective sample size "
                f"{self._ess_per_draw * len(self._draws):.1f} in {len(self._draws)} draws (worst coordinate; "
                f"{self._ess_per_draw:.4f} per draw < {STALL_ESS_PER_DRAW}); its estimates are unreliable. "
                "Try kernel='nuts' (the default), a 'gmm' estimator, or more draws",
                RuntimeWarning,
                stacklevel=2,
            )
        return self._ess_per_draw

    # -- corrections ------------------------------------------------------------------
    def importance_weights(self, samples: Mapping[str, Tensor] | Tensor, warn_fraction: float = 0.01) -> ISResult:
        """IS correction of this kernel's draws: ``w = p̂_sp(z) / p̃_f(z)``, self-normalized.

        Args:
            samples: constrained draws as returned by ``MCMC.get_samples()`` (or a Tensor).
            warn_fraction: ESS fraction below which a ``UserWarning`` is raised.

        Returns:
            An :class:`~neuralblock.priorswap.swap.ISResult` whose ``mean()`` is the corrected estimate.
        """
        if self.correction != "is" or self.corrected is None or self.parametric is None:
            raise ValueError("importance_weights needs a PriorSwap built with correction='is'")
        draws = as_sample_dict(samples, next(iter(self.problem.layout.shapes)))
        z = self.problem.layout.to_unconstrained(self.problem.layout.flatten(draws))
        log_w = self.corrected.log_prob(z) - self.parametric.log_prob(z)
        return normalized_weights(log_w, draws, warn_fraction, "prior-swap IS")
