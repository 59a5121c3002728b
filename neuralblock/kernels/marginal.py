"""``MarginalRandomWalk``: random-walk MH on a Pyro model's continuous sites with its discrete sites summed out.

Pyro's NUTS handles a discrete latent site by enumerating it out of the log density
(``config_enumerate``); a Gibbs sampler instead alternates draws of the discrete sites and of
the continuous ones, and mixes only as fast as that data augmentation lets it (a mixture's
weights move little while the assignments are held fixed). This kernel does what NUTS does
with the marginal, at a fraction of its cost per step:

1. single-site random-walk Metropolis on the unconstrained continuous sites, against the
   log density with every discrete site enumerated out (Pyro's own ``TraceEinsumEvaluator``,
   as its HMC uses), recorded once as a graph and replayed
   (:class:`~neuralblock.replay.ReplayedFunction`): one sweep is one graph call;
2. then an exact draw of the discrete sites given the new continuous values: one Gibbs sweep
   on the model's compiled tables, which is exact because the kernel requires the discrete
   sites to be conditionally independent given the continuous ones (mixtures, hierarchical
   models with a discrete label per group). A model whose discrete sites interact (an HMM's
   chain) is refused with the alternative named.

Step 2 must follow step 1: the pair is then a draw from the joint posterior whenever the
continuous value is one (partially collapsed Gibbs, van Dyk and Park, JASA 2008).

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro.infer import MCMC
    >>> data = torch.tensor([-2.1, -1.9, 2.0, 2.2, 1.8])
    >>> def mixture(data):
    ...     w = pyro.sample("w", dist.Dirichlet(torch.ones(2)))
    ...     with pyro.plate("data", len(data)):
    ...         z = pyro.sample("z", dist.Categorical(w))
    ...         pyro.sample("y", dist.Normal(torch.tensor([-2.0, 2.0])[z], 0.5), obs=data)
    >>> mcmc = MCMC(MarginalRandomWalk(mixture), num_samples=30, warmup_steps=30, disable_progbar=True)
    >>> mcmc.run(data)
    >>> samples = mcmc.get_samples()
    >>> samples["w"].shape, samples["z"].shape
    (torch.Size([30, 2]), torch.Size([30, 5]))
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.infer.mcmc.util import initialize_model
from torch import Tensor

from neuralblock.kernels.adaptation import StepSizeAdapter
from neuralblock.kernels.conditioning import set_conditioning, values_changed
from neuralblock.kernels.functional import mh_decide
from neuralblock.kernels.gibbs import GibbsKernel
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second
from neuralblock.pyro.compile import fixed_sites_at, fixed_values
from neuralblock.pyro.layout import FlatLayout
from neuralblock.replay import ReplayedFunction

__all__ = ["MarginalRandomWalk"]


class MarginalRandomWalk(MCMCKernel):
    """Random-walk MH on the continuous sites with the discrete sites enumerated out, then their exact draw.

    Continuous sites walk in their unconstrained space (as in Pyro's HMC: samples come back
    constrained through :attr:`transforms`), one coordinate at a time, each with its own step
    size adapted during warmup towards ``target_accept``. The discrete sites (``Bernoulli``,
    ``Categorical``, ... in plates or loops) are drawn exactly given the continuous ones after
    every transition.

    Args:
        model: a Pyro model with continuous latent sites, and discrete latent sites that are
            conditionally independent given the continuous ones.
        step_size: initial unconstrained step size.
        target_accept: warmup adaptation target.
        adapt_step_size: whether to adapt during warmup.
        sweeps: random-walk sweeps per transition (each costs one recorded graph call).
        max_plate_nesting: as for Pyro's NUTS (default: found by a trace of the model).

    Inside a :class:`~neuralblock.kernels.CompoundKernel`, build it on a
    :class:`~neuralblock.kernels.ConditionedModel`; the fixed sites' values are inputs of the
    recorded sweep and a change of them recomputes the cached log density.

    Raises:
        ValueError: (at setup) the model has no continuous latent site, or discrete sites that
            share a factor (their exact joint draw needs more than one Gibbs sweep).

    References:
        van Dyk and Park, "Partially collapsed Gibbs samplers: theory and methods", JASA 2008.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        step_size: float = 0.5,
        target_accept: float = 0.44,
        adapt_step_size: bool = True,
        sweeps: int = 1,
        max_plate_nesting: int | None = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be a Pyro model (a callable), got {type(model).__name__}")
        if not (isinstance(step_size, int | float) and not isinstance(step_size, bool)) or not (
            math.isfinite(step_size) and step_size > 0
        ):
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}")
        if not (isinstance(target_accept, float) and 0.0 < target_accept < 1.0):
            raise ValueError(f"target_accept must be a number in (0, 1), got {target_accept!r}")
        if not isinstance(sweeps, int) or isinstance(sweeps, bool) or sweeps < 1:
            raise ValueError(f"sweeps must be a positive integer, got {sweeps!r}")
        self.model = model
        self.initial_step_size = float(step_size)
        self.target_accept = target_accept
        self.adapt_step_size = bool(adapt_step_size)
        self.sweeps = sweeps
        self.max_plate_nesting = max_plate_nesting
        self.transforms: dict[str, Any] | None = None
        self._pending_init: dict[str, Tensor] | None = None
        self._reset_stats()

    # -- setup ---------------------------------------------------------------------------------
    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Build the enumerated potential, the discrete sampler and the start."""
        nesting = self.max_plate_nesting
        if nesting is None:
            nesting = _plate_nesting(self.model, args, kwargs)
        init, potential_fn, transforms, trace = initialize_model(self.model, args, kwargs, max_plate_nesting=nesting)
        if not init:
            raise ValueError(
                "MarginalRandomWalk needs a continuous latent site to walk on; the model has only discrete "
                "latent sites: use GibbsKernel"
            )
        self.transforms = transforms
        self._names = sorted(init)
        self.layout = FlatLayout.from_trace(trace, self._names)
        self._discrete = [
            name
            for name, site in trace.iter_stochastic_nodes()
            if site["fn"].has_enumerate_support and name not in init
        ]
        self._potential_fn = potential_fn
        self._sweep = ReplayedFunction(
            self._recordable_sweep, f"the marginal random walk of model {getattr(self.model, '__name__', 'model')!r}"
        )
        self.adapter = StepSizeAdapter(self.layout.dim, self.initial_step_size, self.target_accept)
        pending, self._pending_init = self._pending_init, None
        start = {k: pending[k] if pending and k in pending else v for k, v in init.items()}
        u = self._u = self.layout.flatten_point(start).detach()
        self._potential = self._potential_of(u)
        self._fixed_key = _copy(fixed_values(self.model))
        if not torch.isfinite(self._potential):
            raise ValueError(
                f"the initial values of {self._names} have a non-finite log density ({float(-self._potential)}); "
                "give unconstrained values inside the support"
            )
        self._gibbs: GibbsKernel | None = None
        self._values: dict[str, Tensor] = {}
        if self._discrete:
            self._gibbs = GibbsKernel(self.model)
            set_conditioning(self._gibbs, self.layout.constrain_point(u), reset=True)
            discrete = {k: v for k, v in (pending or {}).items() if k in self._discrete}
            if discrete:
                self._gibbs.initial_params = discrete
            self._gibbs.setup(0, *args, **kwargs)
            _check_conditionally_independent(self._gibbs)
            self._values = self._gibbs.initial_params
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        self._reset_stats()

    def _potential_of(self, u: Tensor) -> Tensor:
        with pyro.validation_enabled(False):  # an invalid proposal gives a NaN or infinite potential: rejected
            return self._potential_fn(self.layout.unflatten(u)).detach()

    # -- the transition ------------------------------------------------------------------------
    def _recordable_sweep(
        self, u: Tensor, potential: Tensor, steps: Tensor, noise: Tensor, log_u: Tensor, *fixed: Tensor
    ) -> tuple:
        """:meth:`_sweep_core` with a conditioned model's fixed sites as inputs (sorted names), not constants."""
        with fixed_sites_at(self.model, fixed):
            return self._sweep_core(u, potential, steps, noise, log_u)

    def _sweep_core(self, u: Tensor, potential: Tensor, steps: Tensor, noise: Tensor, log_u: Tensor) -> tuple:
        """One single-site sweep over every coordinate, given its random numbers: ``(u, potential, accept_prob)``."""
        probs = []
        for j in range(u.shape[0]):
            proposal = u.clone()
            proposal[j] = u[j] + steps[j] * noise[j]
            new = self._potential_of(proposal)
            info = mh_decide(potential - new, log_u[j])
            u = torch.where(info.accepted, proposal, u)
            potential = torch.where(info.accepted, new, potential)
            probs.append(info.accept_prob)
        return u, potential, torch.stack(probs)

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """``sweeps`` random-walk sweeps on the marginal, then an exact draw of the discrete sites."""
        start = time.perf_counter()
        warmup = self._t < self._warmup_steps
        u = self.layout.flatten_point(params).detach()
        fixed = fixed_values(self.model)
        moved = values_changed(self._fixed_key, fixed)
        if moved or not torch.equal(u, self._u):  # a compound sampler moved the values or the fixed sites
            self._potential = self._potential_of(u)
            self._fixed_key = _copy(fixed) if moved else self._fixed_key
        potential = self._potential
        d = u.shape[0]
        names = sorted(fixed)
        for _ in range(self.sweeps):
            steps = self.adapter.step_size.to(u)
            noise = torch.randn(d, dtype=u.dtype, device=u.device)
            log_u = torch.rand(d, dtype=u.dtype, device=u.device).log()
            u, potential, probs = self._sweep(u, potential, steps, noise, log_u, *(fixed[k] for k in names))
            if warmup and self.adapt_step_size:
                self.adapter.update(torch.arange(d), probs.to(self.adapter.log_step))
            self._count(probs, warmup)
        self._u, self._potential = u, potential
        out = self.layout.unflatten(u)
        if self._gibbs is not None:
            set_conditioning(self._gibbs, self.layout.constrain_point(u))
            discrete = {name: params[name] for name in self._discrete if name in params} or self._values
            self._values = self._gibbs.sample(discrete)
            out.update(self._values)
        self._t += 1
        if not warmup:
            self._elapsed += time.perf_counter() - start
        return out

    # -- Pyro's kernel surface -----------------------------------------------------------------
    @property
    def initial_params(self) -> dict[str, Tensor]:
        """The start: unconstrained continuous values and the discrete values."""
        if self.transforms is None:
            raise RuntimeError("call setup() before reading initial_params")
        return {**self.layout.unflatten(self._u), **self._values}

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        """Start from ``params``: unconstrained values of continuous sites, as for Pyro's HMC (and discrete values)."""
        self._pending_init = {k: torch.as_tensor(v) for k, v in params.items()}

    def _reset_stats(self) -> None:
        self._proposed = 0
        self._accepted_prob = 0.0
        self._phase = (True, 0, 0.0)
        self._elapsed = 0.0

    def _count(self, probs: Tensor, warmup: bool) -> None:
        phase, n, total = self._phase
        if phase != warmup:
            phase, n, total = warmup, 0, 0.0
        self._phase = (phase, n + probs.numel(), total + float(probs.sum()))
        if not warmup:
            self._proposed += probs.numel()
            self._accepted_prob += float(probs.sum())

    def logging(self) -> dict[str, float]:
        """Mean acceptance probability of the current phase, for the progress bar."""
        _, n, total = self._phase
        return {"acc": round(total / n if n else 0.0, 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup mean acceptance probability, step sizes, the discrete sampler's, and no divergences."""
        out: KernelDiagnostics = {
            "divergences": [],
            "acceptance_rate": self._accepted_prob / self._proposed if self._proposed else 0.0,
            "transitions_per_second": per_second(max(self._t - self._warmup_steps, 0), self._elapsed),
        }
        if hasattr(self, "adapter"):
            out["mean_step_size"] = float(self.adapter.step_size.mean())
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_potential_fn", "_sweep"):  # closures over Pyro's evaluator: rebuilt at setup
            state.pop(name, None)
        return state


def _copy(values: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: torch.as_tensor(v).clone() for k, v in values.items()}


def _plate_nesting(model: Callable[..., Any], args: tuple, kwargs: dict) -> int:
    """The number of vectorized plate dims (and batch dims of sites) of a plain trace of ``model``."""
    trace = poutine.trace(model).get_trace(*args, **kwargs)
    nesting = 0
    for site in trace.nodes.values():
        if site["type"] != "sample":
            continue
        for frame in site["cond_indep_stack"]:
            if frame.vectorized:
                assert frame.dim is not None  # a vectorized plate has its dim
                nesting = max(nesting, -int(frame.dim))
    return nesting


def _check_conditionally_independent(gibbs: GibbsKernel) -> None:
    """Raise unless every factor of the compiled discrete graph holds at most one latent variable."""
    fg = gibbs._graph()
    latent = torch.zeros(fg.num_variables, dtype=torch.bool)
    latent[fg.latent] = True
    for group in fg.groups:
        scopes = group.scopes
        hits = torch.where(scopes >= 0, latent[scopes.clamp_min(0)], False).sum(-1)
        coupled = (hits > 1).nonzero()
        if coupled.numel():
            names = [fg.names[int(v)] for v in scopes[int(coupled[0, 0])].tolist() if v >= 0 and latent[v]]
            raise ValueError(
                f"MarginalRandomWalk draws the discrete sites exactly given the continuous ones, which needs them "
                f"conditionally independent; {names} share a factor (e.g. a Markov chain). Use "
                "CompoundKernel([(GibbsKernel(model), discrete sites), (RandomWalkMH(model), continuous sites)])"
            )
