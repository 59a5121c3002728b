"""Chromatic single-site random-walk Metropolis for continuous variables.

Example:
    >>> import torch
    >>> from pyro.infer import MCMC
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph()
    >>> x, y = fg.add_variable("x"), fg.add_variable("y")
    >>> _ = fg.add_linear_gaussian(x, [], [], 0.0, 1.0)
    >>> _ = fg.add_linear_gaussian(y, [x], [1.0], 0.0, 1.0)
    >>> mcmc = MCMC(RandomWalkMH(fg), num_samples=50, warmup_steps=50, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["x"].shape
    torch.Size([50, 2])

    A Pyro model with a simplex and a positive vector:

    >>> import pyro, pyro.distributions as dist
    >>> def model():
    ...     w = pyro.sample("w", dist.Dirichlet(torch.ones(3)))
    ...     s = pyro.sample("s", dist.LogNormal(0.0, 1.0).expand([2]).to_event(1))
    ...     pyro.sample("y", dist.Normal(w[..., :2], s).to_event(1), obs=torch.tensor([0.5, 0.1]))
    >>> mcmc = MCMC(RandomWalkMH(model), num_samples=20, warmup_steps=20, disable_progbar=True)
    >>> mcmc.run()
    >>> samples = mcmc.get_samples()
    >>> samples["w"].shape, samples["s"].shape, bool(torch.allclose(samples["w"].sum(-1), torch.ones(20)))
    (torch.Size([20, 3]), torch.Size([20, 2]), True)
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.distributions import Transform, biject_to

from neuralblock.graph import BlockScaffold, FactorGraph
from neuralblock.kernels.adaptation import StepSizeAdapter
from neuralblock.kernels.base import GraphKernel, warn_frozen
from neuralblock.kernels.functional import mh_decide, random_walk_propose
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second
from neuralblock.pyro.compile import fixed_sites_at, replay_with_fixed_sites
from neuralblock.replay import ReplayedFunction

__all__ = ["RandomWalkMH", "RandomWalkPlan", "SweepStats"]


class _ColorClass:
    """One colour of continuous variables, split by support so each part shares a transform."""

    def __init__(self, fg: FactorGraph, vars_: Tensor, positions: Tensor) -> None:
        self.vars = vars_
        self.positions = positions  # index of each variable in the kernel's variable list
        self.scaffold: BlockScaffold = fg.scaffold(vars_[:, None])
        parts: dict[str, tuple[Transform, list[int]]] = {}
        for i, v in enumerate(vars_.tolist()):
            support = fg.support(v)
            parts.setdefault(repr(support), (biject_to(support), []))[1].append(i)
        self.parts = [(t, torch.tensor(idx, dtype=torch.long)) for t, idx in parts.values()]


class SweepStats(NamedTuple):
    """Counts from one sweep of MH updates."""

    proposed: int
    accepted: int
    nonfinite: int


class RandomWalkPlan:
    """Colour classes of single continuous variables with their scaffolds and step sizes.

    Args:
        fg: the graph.
        variables: continuous latent variables to update.
        step_size: initial unconstrained step size.
        target_accept: warmup adaptation target.
    """

    def __init__(self, fg: FactorGraph, variables: list[int], step_size: float, target_accept: float) -> None:
        self.variables = variables
        self.adapter = StepSizeAdapter(len(variables), step_size, target_accept)
        self.classes: list[_ColorClass] = []
        self._replays: dict[tuple[str, ...], ReplayedFunction] = {}
        for members in fg.color_blocks([[v] for v in variables]):
            vars_ = torch.tensor([variables[int(i)] for i in members], dtype=torch.long)
            self.classes.append(_ColorClass(fg, vars_, members))

    def sweep(self, fg: FactorGraph, state: Tensor, adapt: bool) -> tuple[Tensor, SweepStats]:
        """One chromatic sweep of single-site random-walk MH (adapting step sizes if ``adapt``).

        ``state`` is ``[n]`` or a batch of chains ``[..., n]``; a step size is shared by the
        chains and adapts to their mean acceptance. The random numbers are drawn first, so the
        sweep itself is a function of tensors: on a graph compiled from a Pyro model it is
        recorded once and replayed (:class:`~neuralblock.replay.ReplayedFunction`), with the
        model's fixed sites (a compound sampler's other sites) as inputs.
        """
        batch = state.shape[:-1]
        noises = [torch.randn(batch + (len(cls.vars),), dtype=state.dtype, device=state.device) for cls in self.classes]
        log_us = [
            torch.rand(batch + (len(cls.vars),), dtype=state.dtype, device=state.device).log() for cls in self.classes
        ]
        steps = self.adapter.step_size.to(state)
        model = _pyro_model(fg)
        if model is None:
            out = _sweep_core(self.classes, fg, state, steps, *noises, *log_us)
        else:
            replay, fixed = replay_with_fixed_sites(
                self._replays,
                model,
                functools.partial(_recordable_sweep, self.classes, fg, model, len(self.classes)),
                f"the random-walk sweep of model {getattr(model, '__name__', type(model).__name__)!r}",
            )
            out = replay(state, steps, *noises, *log_us, *fixed)
        count = len(self.classes)
        state, probs, accepted, nonfinite = out[0], out[1 : 1 + count], out[1 + count : 1 + 2 * count], out[-1]
        if adapt:
            for cls, prob in zip(self.classes, probs):
                self.adapter.update(cls.positions, prob.reshape(-1, len(cls.vars)).mean(0).to(self.adapter.log_step))
        return state, SweepStats(
            sum(int(a.numel()) for a in accepted), sum(int(a.sum()) for a in accepted), int(nonfinite)
        )

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_replays"] = {}  # recorded graphs hold closures: recorded again after unpickling
        return state


def _pyro_model(fg: FactorGraph) -> Any:
    """The model of a graph whose every group runs one Pyro model (fixed sites: recording inputs), else None."""
    from neuralblock.pyro.bridge import PyroModelGroup

    groups = [group for group in fg.groups if type(group) is PyroModelGroup]
    if not groups or len(groups) != len(fg.groups):
        return None
    model = groups[0].model
    return model if all(group.model is model for group in groups) else None


def _recordable_sweep(
    classes: list[_ColorClass], fg: FactorGraph, model: Any, count: int, *tensors: Tensor
) -> tuple[Tensor, ...]:
    """:func:`_sweep_core` with the model's fixed sites taken from the trailing inputs (sorted names)."""
    state, steps = tensors[0], tensors[1]
    randoms, values = tensors[2 : 2 + 2 * count], tensors[2 + 2 * count :]
    with fixed_sites_at(model, values):
        return _sweep_core(classes, fg, state, steps, *randoms)


def _sweep_core(
    classes: list[_ColorClass], fg: FactorGraph, state: Tensor, steps: Tensor, *randoms: Tensor
) -> tuple[Tensor, ...]:
    """One sweep given its random numbers (per class: normal noise, then per class: log uniforms).

    Returns ``(state, *accept_prob per class, *accepted per class, number of non-finite ratios)``.
    """
    state = state.clone()
    count = len(classes)
    probs, accepted = [], []
    nonfinite = torch.zeros((), dtype=torch.long, device=state.device)
    for cls, noise, log_u in zip(classes, randoms[:count], randoms[count:]):
        current = state[..., cls.vars]
        proposal = current.clone()
        correction = torch.zeros_like(current)
        class_steps = steps[cls.positions]
        for transform, idx in cls.parts:
            proposal[..., idx], correction[..., idx] = random_walk_propose(
                current[..., idx], class_steps[idx], transform, noise[..., idx]
            )
        pair = torch.stack([state, state])
        pair[1][..., cls.vars] = proposal
        local = cls.scaffold.local_log_density(fg, pair)  # [2, ..., m]
        info = mh_decide(local[1] - local[0] + correction, log_u)
        state[..., cls.vars] = torch.where(info.accepted, proposal, current)
        probs.append(info.accept_prob)
        accepted.append(info.accepted)
        nonfinite = nonfinite + info.num_nonfinite
    return (state, *probs, *accepted, nonfinite)


def continuous_latent(fg: FactorGraph, requested: list[int | str] | None, kernel: str) -> list[int]:
    """The continuous latent variables a kernel updates (all, or the requested ones, checked)."""
    latent = set(fg.latent.tolist())
    if requested is None:
        return [v for v in sorted(latent) if fg.cardinality(v) == 0]
    sites = getattr(fg, "sites", {})  # a graph from a Pyro model: a site name stands for all its variables
    variables = []
    for v in requested:
        if isinstance(v, str) and v in sites and v not in fg._name_to_id:
            variables.extend(sites[v].ids.reshape(-1).tolist())
        else:
            variables.append(fg.variable_id(v))
    bad = [fg.names[v] for v in variables if fg.cardinality(v) > 0 or v not in latent]
    if bad:
        raise ValueError(f"{kernel} updates continuous latent variables only; got {bad[:5]}")
    return variables


def _is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (an ``int`` or ``float``, not a ``bool``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class RandomWalkMH(GraphKernel):
    """Single-site Gaussian random-walk Metropolis over continuous latent variables.

    Variables are coloured so that no two of a colour share a factor; each colour
    proposes all its variables at once, evaluates current and proposed scaffolds in
    one batch and accepts each variable by its own exact MH ratio. Constrained
    variables walk in their unconstrained space (with the Jacobian correction).
    Step sizes adapt per variable during warmup towards ``target_accept``.

    Pyro models may have continuous sites of any shape, as with Pyro's HMC: vector sites
    (``.to_event(1)``) and sites in plates give one variable per element (a positive vector
    walks each element in log space); a site whose support is not elementwise (a
    ``Dirichlet``'s simplex, an ordered vector, a Cholesky factor) gives one variable per
    unconstrained coordinate of ``biject_to(support)``, whose factor adds the log-Jacobian.
    Samples come back under the site's name with its own shape and support. The model must
    evaluate on a batch of values (``[B, 1, ..., 1, *site shape]``), e.g. ``scale[..., 0]``
    rather than ``scale[0]``. Discrete sites in plates go to a ``GibbsKernel`` in a
    :class:`~neuralblock.kernels.CompoundKernel`.

    Args:
        model: a :class:`FactorGraph` or a Pyro model.
        variables: variables (ids or names; a Pyro site's name for all its variables) to update;
            default all continuous latent ones.
        step_size: initial unconstrained step size.
        target_accept: warmup adaptation target.
        adapt_step_size: whether to adapt during warmup.
        chains: independent chains run as one ``[K, n]`` state (see
            :mod:`neuralblock.kernels.base`); they share each variable's step size, which
            adapts to their mean acceptance. The state stays on the CPU.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model():
        ...     pyro.sample("mu", dist.Normal(0.0, 1.0))
        >>> kernel = RandomWalkMH(model, chains=3)
        >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
        >>> mcmc.run()
        >>> mcmc.get_samples()["mu"].shape  # [samples, chains]
        torch.Size([5, 3])
    """

    batched_state = True

    def __init__(
        self,
        model: FactorGraph | Callable,
        variables: list[int | str] | None = None,
        step_size: float = 0.5,
        target_accept: float = 0.44,
        adapt_step_size: bool = True,
        chains: int = 1,
    ) -> None:
        super().__init__(model, chains=chains)
        if not (_is_real(step_size) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}")
        if not (_is_real(target_accept) and 0.0 < target_accept < 1.0):
            raise ValueError(f"target_accept must be a number in (0, 1), got {target_accept!r}")
        if not isinstance(adapt_step_size, bool):
            raise ValueError(f"adapt_step_size must be True or False, got {adapt_step_size!r}")
        if variables is not None and (
            isinstance(variables, str | bytes)
            or not isinstance(variables, Sequence)
            or not all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in variables)
        ):
            raise ValueError(f"variables must be a list of variable ids or names (or None), got {variables!r}")
        self._variables_arg = variables
        self.initial_step_size = step_size
        self.target_accept = target_accept
        self.adapt_step_size = adapt_step_size
        self.plan: RandomWalkPlan | None = None
        self._reset_stats()  # diagnostics() and logging() answer before setup (e.g. in the parent of worker chains)

    def _prepare(self, fg: FactorGraph) -> None:
        variables = continuous_latent(fg, self._variables_arg, "RandomWalkMH")
        if not variables:
            raise ValueError("RandomWalkMH found no continuous latent variable to update")
        standalone = self._variables_arg is None and self._conditioned is None and type(self) is RandomWalkMH
        warn_frozen(fg, variables, "RandomWalkMH", standalone, "GibbsKernel")
        self.variables = variables
        self.plan = RandomWalkPlan(fg, variables, self.initial_step_size, self.target_accept)

    def _refresh(self, fg: FactorGraph) -> None:
        """Nothing to do: proposals read parameters only through the scaffolds; step sizes are kept."""

    @property
    def adapter(self) -> StepSizeAdapter:
        """The step-size adapter (per variable)."""
        if self.plan is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() first (the step sizes are built there)")
        return self.plan.adapter

    def _reset_stats(self) -> None:
        self._proposed = 0
        self._accepted = 0
        self._nonfinite = 0
        self._phase_warmup = True  # the phase the running rate counts (it restarts when sampling starts)
        self._phase_accepted = 0
        self._phase_proposed = 0

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        assert self.plan is not None  # built at setup, before any transition
        state, stats = self.plan.sweep(self._graph(), state, adapt=warmup and self.adapt_step_size)
        if warmup != self._phase_warmup:
            self._phase_warmup, self._phase_accepted, self._phase_proposed = warmup, 0, 0
        self._phase_accepted += stats.accepted
        self._phase_proposed += stats.proposed
        if not warmup:
            self._accepted += stats.accepted
            self._proposed += stats.proposed
            self._nonfinite += stats.nonfinite
        return state

    def logging(self) -> dict[str, float]:
        """Running acceptance rate of the current phase (warmup, then sampling), for the progress bar."""
        return {"acc": round(self._phase_accepted / self._phase_proposed if self._phase_proposed else 0.0, 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup acceptance rate, transitions and updates per second, non-finite rejections, no divergences."""
        return {
            "divergences": [],
            "acceptance_rate": self._accepted / self._proposed if self._proposed else 0.0,
            "transitions_per_second": self._transitions_per_second(),
            "updates_per_second": per_second(self._proposed, self._elapsed),
            "nonfinite_rejections": float(self._nonfinite),
            "mean_step_size": float(self.adapter.step_size.mean()) if self.plan is not None else self.initial_step_size,
        }
