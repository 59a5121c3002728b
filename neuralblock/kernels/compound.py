"""``CompoundKernel``: one Pyro kernel that mixes inner kernels over disjoint site sets.

The sampler of the project: neural blocks (or Gibbs) for the local variables, a
sublinear or coreset kernel for the global parameters. Each inner kernel updates its own
sites with the others' current values held fixed (conditioning), so each leaves the
joint posterior's full conditional invariant and the cycle (or the random scan) leaves
the posterior invariant when the inner kernels are exact.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro.infer import MCMC
    >>> from neuralblock.kernels import GibbsKernel, RandomWalkMH
    >>> def model():
    ...     p = pyro.sample("p", dist.Beta(2.0, 2.0))
    ...     z = pyro.sample("z", dist.Bernoulli(p))
    ...     pyro.sample("y", dist.Normal(z, 0.5), obs=torch.tensor(1.0))
    >>> kernel = CompoundKernel([(GibbsKernel(model), ["z"]), (RandomWalkMH(model), ["p"])], steps=[2, 1])
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> sorted(mcmc.get_samples())
    ['p', 'z']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from pyro import poutine
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from neuralblock.kernels.conditioning import ConditionedModel, set_conditioning
from neuralblock.kernels.vocabulary import KernelDiagnostics

__all__ = ["CompoundKernel"]

SCHEDULES = ("cycle", "random")


class CompoundKernel(MCMCKernel):
    """Cycle or randomly mix inner kernels, each over its own latent sites.

    Args:
        blocks: ``[(kernel, sites), ...]``. ``sites`` lists the latent sites the kernel
            updates; at most one block may give ``None`` for "every latent site no other
            block claims". Site sets must be disjoint and cover every latent site. An inner
            kernel must implement ``condition_on(values)`` (every kernel of this package
            does) or be a Pyro kernel built on a :class:`ConditionedModel` (e.g.
            ``NUTS(ConditionedModel(model))``).
        schedule: ``"cycle"`` runs every block in order in each transition;
            ``"random"`` runs one block per transition, drawn with probabilities ``weights``.
        steps: inner transitions per visit of each block (default 1 each), e.g. ``[10, 1]``
            for ten local sweeps per global update.
        weights: block probabilities for ``schedule="random"`` (default uniform).
        model: the joint Pyro model (default: the first inner kernel's model).

    References:
        The seed papers' compound samplers: "Sublinear-Time Approximate MCMC Transitions
        for Probabilistic Programs" (Chen, Mansinghka, Ghahramani), which balances local
        sweeps against global updates; numpyro's ``HMCGibbs`` for the wrapping pattern.
    """

    def __init__(
        self,
        blocks: Sequence[tuple[MCMCKernel, Sequence[str] | None]],
        schedule: str = "cycle",
        steps: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
        model: Callable[..., Any] | None = None,
    ) -> None:
        blocks = list(blocks)
        if not blocks:
            raise ValueError("CompoundKernel needs at least one (kernel, sites) block")
        for i, block in enumerate(blocks):
            if not (isinstance(block, tuple | list) and len(block) == 2):
                raise TypeError(f"block {i} must be a (kernel, sites) pair, got {block!r}")
            kernel, sites = block
            if not isinstance(kernel, MCMCKernel):
                raise TypeError(f"block {i}: {type(kernel).__name__} is not a pyro MCMCKernel")
            if isinstance(sites, str):
                raise TypeError(f"block {i}: sites must be a list of site names, got the string {sites!r}")
        if sum(sites is None for _, sites in blocks) > 1:
            raise ValueError("at most one block may claim the remaining sites (sites=None)")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        steps = [1] * len(blocks) if steps is None else [int(s) for s in steps]
        if len(steps) != len(blocks) or any(s < 1 for s in steps):
            raise ValueError(f"steps must give a positive count for each of the {len(blocks)} blocks, got {steps}")
        if weights is None:
            weights = [1.0] * len(blocks)
        probs = torch.as_tensor(list(weights), dtype=torch.float64)
        if probs.shape != (len(blocks),) or not torch.isfinite(probs).all() or (probs < 0).any() or probs.sum() <= 0:
            raise ValueError(f"weights must be {len(blocks)} non-negative finite numbers, got {list(weights)}")
        self.kernels = [kernel for kernel, _ in blocks]
        self._declared = [None if sites is None else [str(s) for s in sites] for _, sites in blocks]
        self.sites: list[list[str]] = []
        self.schedule = schedule
        self.steps = steps
        self.probs = probs / probs.sum()
        self._model = model
        self._params: dict[str, Tensor] | None = None
        self._dtypes: dict[str, torch.dtype] = {}
        self._warmup_order: Tensor | None = None
        self._t = 0
        self._pending_init: dict[str, Tensor] | None = None
        self._transforms: dict | None = None
        self._visits = [0] * len(blocks)
        self._final_diagnostics: list[dict] | None = None

    # -- the Pyro-facing surface ------------------------------------------------------
    @property
    def model(self) -> Callable[..., Any]:
        """The joint Pyro model."""
        if self._model is not None:
            return self._model
        model = getattr(self.kernels[0], "model", None)
        if isinstance(model, ConditionedModel):
            model = model.model
        if model is None:
            raise ValueError("pass model= to CompoundKernel: its first inner kernel exposes no .model")
        return model

    @property
    def transforms(self) -> dict | None:
        """The union of the inner kernels' transforms (``None`` until ``setup``, as in Pyro's HMC)."""
        return self._transforms

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Resolve the site sets, condition every inner kernel on the others, set them up."""
        trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        values = {  # a traced sample site holds its value (typed Optional by Pyro)
            name: cast(Tensor, site["value"]).detach()
            for name, site in trace.nodes.items()
            if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
        }
        self.sites = self._resolve_sites(list(values))
        self._dtypes = {name: value.dtype for name, value in values.items()}
        visits = self._warmup_visits(int(warmup_steps))
        transforms: dict = {}
        params: dict[str, Tensor] = {}
        for b, kernel in enumerate(self.kernels):
            own = set(self.sites[b])
            set_conditioning(kernel, {k: v for k, v in values.items() if k not in own}, reset=True)
            if self._pending_init is not None:
                kernel.initial_params = {k: v for k, v in self._pending_init.items() if k in own}
            kernel.setup(visits[b] * self.steps[b], *args, **kwargs)  # its warmup ends with the compound's
            init = kernel.initial_params
            if set(init) != own:
                raise ValueError(
                    f"block {b} ({type(kernel).__name__}) samples sites {sorted(init)}, but the compound kernel "
                    f"assigned it {sorted(own)}; give each block exactly the sites its kernel samples"
                )
            params.update(init)
            transforms.update(getattr(kernel, "transforms", None) or {})
        self._pending_init = None
        self._params = params
        self._transforms = transforms
        self._visits = [0] * len(self.kernels)
        self._t = 0
        self._final_diagnostics = None

    def _resolve_sites(self, latent: list[str]) -> list[list[str]]:
        claimed: dict[str, int] = {}
        for b, sites in enumerate(self._declared):
            for name in sites or []:
                if name not in latent:
                    raise ValueError(f"block {b} claims site {name!r}, not a latent site of the model {latent}")
                if name in claimed:
                    raise ValueError(f"site {name!r} is claimed by blocks {claimed[name]} and {b}: must be disjoint")
                claimed[name] = b
        rest = [name for name in latent if name not in claimed]
        resolved = [list(sites) if sites is not None else rest for sites in self._declared]
        if None not in self._declared and rest:
            raise ValueError(f"latent sites {rest} are sampled by no block; add them to a block or pass sites=None")
        return resolved

    def _warmup_visits(self, warmup_steps: int) -> list[int]:
        """Visits of each block during warmup; a random schedule draws its warmup order now.

        Each inner kernel then adapts for exactly its warmup visits (times its steps), so no
        adaptation runs into the sampling phase, whatever the random order.
        """
        if self.schedule == "cycle":
            self._warmup_order = None
            return [warmup_steps] * len(self.kernels)
        self._warmup_order = torch.multinomial(self.probs, warmup_steps, replacement=True) if warmup_steps else None
        if self._warmup_order is None:
            return [0] * len(self.kernels)
        return torch.bincount(self._warmup_order, minlength=len(self.kernels)).tolist()

    @property
    def initial_params(self) -> dict[str, Tensor]:
        """The merged initial values of every inner kernel (their own spaces)."""
        if self._params is None:
            raise RuntimeError("call setup() before reading initial_params")
        return dict(self._params)

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        self._pending_init = {k: torch.as_tensor(v) for k, v in params.items()}

    def _constrained(self, params: dict[str, Tensor], names: Sequence[str]) -> dict[str, Tensor]:
        """Constrained values in each site's own dtype (graph kernels return discrete values as floats)."""
        transforms = self._transforms or {}
        out = {}
        for k in names:
            value = transforms[k].inv(params[k]) if k in transforms else params[k]
            out[k] = value if value.dtype == self._dtypes[k] else value.to(self._dtypes[k])
        return out

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One compound transition: every block (cycle) or one random block, ``steps`` times each."""
        if self._params is None:
            raise RuntimeError("call setup() before sample()")
        current = dict(params)
        order: Sequence[int]
        if self.schedule == "cycle":
            order = range(len(self.kernels))
        elif self._warmup_order is not None and self._t < len(self._warmup_order):
            order = [int(self._warmup_order[self._t])]  # the warmup order drawn at setup
        else:
            order = [int(torch.multinomial(self.probs, 1))]
        self._t += 1
        for b in order:
            kernel, own = self.kernels[b], self.sites[b]
            others = [k for k in current if k not in own]
            set_conditioning(kernel, self._constrained(current, others))
            inner = {k: current[k] for k in own}
            for _ in range(self.steps[b]):
                inner = kernel.sample(inner)
            current.update(inner)
            self._visits[b] += 1
        self._params = current
        return current

    def logging(self) -> dict[str, Any]:
        """The inner kernels' progress-bar entries, prefixed by block number."""
        out: dict[str, Any] = {}
        for b, kernel in enumerate(self.kernels):
            for key, value in (kernel.logging() or {}).items():
                out[f"{b}:{key}"] = value
        return out

    def diagnostics(self) -> KernelDiagnostics:
        """``{"blocks": {"<b> (<kernel>)": inner diagnostics, ...}}`` plus visit counts.

        Example:
            >>> import pyro, pyro.distributions as dist
            >>> from pyro.infer import MCMC
            >>> from neuralblock.kernels import GibbsKernel, RandomWalkMH
            >>> def model():
            ...     p = pyro.sample("p", dist.Beta(2.0, 2.0))
            ...     pyro.sample("z", dist.Bernoulli(p))
            >>> kernel = CompoundKernel([(GibbsKernel(model), ["z"]), (RandomWalkMH(model), ["p"])])
            >>> MCMC(kernel, num_samples=5, warmup_steps=0, disable_progbar=True).run()
            >>> sorted(kernel.diagnostics()["blocks"]), kernel.diagnostics()["visits"]
            (['0 (GibbsKernel)', '1 (RandomWalkMH)'], [5, 5])
        """
        inner = self._final_diagnostics or [kernel.diagnostics() or {} for kernel in self.kernels]
        return {
            "blocks": {
                f"{b} ({type(kernel).__name__})": diag for b, (kernel, diag) in enumerate(zip(self.kernels, inner))
            },
            "visits": list(self._visits),
            "divergences": [],  # read by arviz.from_pyro (inner kernels report their own, e.g. NUTS's, in blocks)
        }

    def end_warmup(self) -> None:
        """Inner kernels count their own warmup; nothing to do here."""

    def cleanup(self) -> None:
        """Keep the inner diagnostics (Pyro's HMC resets its counters on cleanup), then clean up."""
        if self._final_diagnostics is None:  # Pyro's MCMC calls cleanup twice
            self._final_diagnostics = [kernel.diagnostics() or {} for kernel in self.kernels]
        for kernel in self.kernels:
            kernel.cleanup()
