"""NUTS on one flat parameter vector, with the per-leapfrog framework cost taken out.

:class:`pyro.infer.NUTS` spends about 0.4 ms of Python per leapfrog step on dictionaries of
sites, the integrator, its tree recursion and the autograd call of the potential, whatever the
potential costs. On a small target (a coreset's few dozen weighted points, a 10-dimensional
regression) that framework cost is most of a step, so NUTS on a 500-point coreset was only about
3x cheaper per iteration than on 100,000 points. :class:`DirectNUTS` is the same algorithm on one
flat unconstrained vector ``z [D]``:

* the potential's value and gradient come from one call (a
  :class:`~neuralblock.replay.FusedPotential`'s ``value_and_grad``, such as
  ``LogLikelihood(...).potential_fn()``, or one ``torch.autograd.grad`` for any other potential);
* the trajectory is built by the recursive doubling of Hoffman and Gelman with multinomial sampling
  and the generalised no-U-turn criterion (Betancourt 2017), including the extra checks across
  merged subtrees that Stan and Pyro make;
* on the CPU the trajectory's vectors are NumPy arrays, and a fused potential runs as the NumPy
  translation of its recorded graph where that is faster (:meth:`~neuralblock.replay.ReplayedFunction.call_numpy`):
  on a 60-point logistic coreset a leapfrog step went from 85 to 41 us, since small torch operations cost
  ~2 us of dispatch each and NumPy's ~0.5 us;
* warmup adapts the step size by dual averaging (target acceptance statistic 0.8) and a
  diagonal inverse mass matrix over doubling windows (Stan's schedule, shortened for short
  warmups as Pyro does).

It is an ordinary Pyro ``MCMCKernel``: ``MCMC(DirectNUTS(potential_fn=..., initial_params=...))``
or ``MCMC(DirectNUTS(model))``. With a model, the potential is the direct-path
``LogLikelihood(model, *args).potential_fn()`` when the model has one data plate and compiles,
and Pyro's own potential (``initialize_model``) otherwise, with a warning. Returned samples are
unconstrained for a ``potential_fn`` (as Pyro's NUTS) and constrained for a model.

References:
    Hoffman, Gelman. "The No-U-Turn Sampler". JMLR 2014.
    Betancourt. "A Conceptual Introduction to Hamiltonian Monte Carlo". arXiv:1701.02434, 2017.

Example:
    >>> import torch
    >>> from pyro.infer import MCMC
    >>> scale = torch.tensor([1.0, 10.0])
    >>> def potential(params):  # N(0, diag(scale^2))
    ...     return ((params["z"] / scale) ** 2).sum() / 2
    >>> kernel = DirectNUTS(potential_fn=potential, initial_params={"z": torch.zeros(2)})
    >>> mcmc = MCMC(kernel, num_samples=300, warmup_steps=300, disable_progbar=True)
    >>> mcmc.run()
    >>> draws = mcmc.get_samples()["z"]
    >>> draws.shape, bool((draws.std(0) / scale - 1).abs().max() < 0.35)
    (torch.Size([300, 2]), True)
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from neuralblock.kernels.conditioning import ConditionedModel
from neuralblock.kernels.vocabulary import KernelDiagnostics
from neuralblock.replay import FusedPotential
from neuralblock.replay_numpy import NUMPY_DTYPES

__all__ = ["DirectNUTS", "DualAveraging", "WindowSchedule"]

Array = Any  # a flat state vector: np.ndarray on the CPU, Tensor elsewhere (the same operators serve both)
_MAX_ENERGY_ERROR = 1000.0  # an energy error above this ends the trajectory as divergent (Stan's threshold)


class DualAveraging:
    """Nesterov dual averaging of ``log(step size)`` toward a target acceptance statistic.

    Args:
        step_size: the step size the adaptation is centred on (``mu = log(10 * step_size)``).
        target: the target mean acceptance statistic.
        gamma, t0, kappa: the usual constants (Hoffman and Gelman, section 3.2.1).

    Example:
        >>> da = DualAveraging(0.1)
        >>> for _ in range(200):
        ...     _ = da.update(0.95)  # accepting too often: the step grows
        >>> da.final_step_size() > 0.1
        True
    """

    def __init__(
        self, step_size: float, target: float = 0.8, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75
    ):
        self.mu = math.log(10.0 * step_size)
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.count = 0
        self.error_sum = 0.0
        self.log_step_avg = 0.0

    def update(self, accept_stat: float) -> float:
        """Take one acceptance statistic; return the next step size to use."""
        self.count += 1
        t = self.count
        self.error_sum += self.target - accept_stat
        log_step = self.mu - math.sqrt(t) / self.gamma * self.error_sum / (t + self.t0)
        weight = t ** (-self.kappa)
        self.log_step_avg = weight * log_step + (1.0 - weight) * self.log_step_avg
        return math.exp(log_step)

    def final_step_size(self) -> float:
        """The averaged step size, used after warmup."""
        return math.exp(self.log_step_avg)


class WindowSchedule(NamedTuple):
    """Warmup iterations at which mass-matrix windows end (Stan's fast/slow/fast schedule).

    Attributes:
        start: the first iteration of the first window (an initial buffer adapts the step only).
        ends: the last iteration of each doubling window.
    """

    start: int
    ends: tuple[int, ...]

    @classmethod
    def for_warmup(cls, warmup: int, start: int = 75, end: int = 50, first_window: int = 25) -> WindowSchedule:
        """The schedule for ``warmup`` iterations (15% / 75% / 10% buffers when it is short, as Pyro does).

        Example:
            >>> WindowSchedule.for_warmup(1000)
            WindowSchedule(start=75, ends=(99, 149, 249, 449, 949))
            >>> WindowSchedule.for_warmup(100)
            WindowSchedule(start=15, ends=(89,))
        """
        if warmup < 20:
            return cls(warmup, ())
        if start + end + first_window > warmup:
            start, end = int(0.15 * warmup), int(0.1 * warmup)
            first_window = warmup - start - end
        ends: list[int] = []
        begin, size = start, first_window
        last = warmup - end
        while begin < last:
            stop = begin + size
            if stop + 2 * size > last:  # the next window would not fit: this one runs to the end buffer
                stop = last
            ends.append(stop - 1)
            begin, size = stop, 2 * size
        return cls(start, tuple(ends))


class _Point(NamedTuple):
    """A phase-space point: position, momentum, velocity (inverse mass times momentum), potential gradient."""

    z: Array
    r: Array
    v: Array
    grad: Array


class _Tree(NamedTuple):
    """A subtree of a trajectory: its two ends (in position order), its draw and summary."""

    minus: _Point
    plus: _Point
    draw: _Point
    draw_potential: float
    log_weight: float  # log sum of exp(-H) over the leaves, relative to the start's energy
    rho: Array  # sum of the leaves' momenta
    stop: bool  # a U-turn or a divergence inside: the caller must not use it
    diverging: bool
    accept_sum: float
    leaves: int


class DirectNUTS(MCMCKernel):
    """The No-U-Turn sampler on a flat parameter vector, with one value-and-gradient call per leapfrog.

    Args:
        model: a Pyro model (give either ``model`` or ``potential_fn``). On a
            :class:`~neuralblock.kernels.conditioning.ConditionedModel` (the global slot of a ``CompoundKernel``)
            the potential is Pyro's, one model run per leapfrog step, which reads the held values as they move.
        potential_fn: ``{site: unconstrained value} -> scalar`` minus the log density, as for
            Pyro's NUTS; a :class:`~neuralblock.replay.FusedPotential` is called through its
            ``value_and_grad``.
        initial_params: ``{site: unconstrained value}``, required with ``potential_fn``; with a
            model, the default start is Pyro's (``init_to_uniform``).
        step_size: initial step size (refined by a search before warmup when adapting).
        adapt_step_size: dual averaging during warmup.
        adapt_mass_matrix: diagonal inverse mass matrix from the warmup draws (windowed).
        target_accept_prob: dual averaging's target acceptance statistic.
        max_tree_depth: at most ``2**max_tree_depth - 1`` leapfrog steps per iteration.

    Raises:
        ValueError: both or neither of ``model`` and ``potential_fn``; ``potential_fn`` without
            ``initial_params``; bad settings; a non-finite potential or gradient at the start.
    """

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        *,
        potential_fn: Callable[[dict[str, Tensor]], Tensor] | None = None,
        initial_params: dict[str, Tensor] | None = None,
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        target_accept_prob: float = 0.8,
        max_tree_depth: int = 10,
    ) -> None:
        if (model is None) == (potential_fn is None):
            raise ValueError("DirectNUTS needs exactly one of model and potential_fn")
        if potential_fn is not None and initial_params is None:
            raise ValueError("DirectNUTS with a potential_fn needs initial_params ({site: unconstrained value})")
        if not (step_size > 0 and math.isfinite(step_size)):
            raise ValueError(f"step_size must be positive and finite, got {step_size}")
        if not 0.0 < target_accept_prob < 1.0:
            raise ValueError(f"target_accept_prob must be in (0, 1), got {target_accept_prob}")
        if int(max_tree_depth) != max_tree_depth or max_tree_depth < 1:
            raise ValueError(f"max_tree_depth must be a positive integer, got {max_tree_depth}")
        self.model = model
        self.potential_fn = potential_fn
        self.step_size = float(step_size)
        self.adapt_step_size = adapt_step_size
        self.adapt_mass_matrix = adapt_mass_matrix
        self.target_accept_prob = float(target_accept_prob)
        self.max_tree_depth = int(max_tree_depth)
        self.transforms: dict[str, Any] = {}
        self._initial_params = None if initial_params is None else {k: v.detach() for k, v in initial_params.items()}
        self._reset_stats()

    # ---- Pyro's kernel interface -------------------------------------------------------------

    @property
    def initial_params(self) -> dict[str, Tensor] | None:
        """The unconstrained starting values ``{site: value}``."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        self._initial_params = {k: v.detach() for k, v in params.items()}

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Build the potential (for a model), the flat layout, and the warmup schedule; check the start."""
        self._warmup_steps = int(warmup_steps)
        if self.model is not None:
            self._setup_model(self.model, args, kwargs)
        if self._initial_params is None:
            raise ValueError("DirectNUTS: no initial_params")
        self._sites = sorted(self._initial_params)
        self._shapes = [self._initial_params[s].shape for s in self._sites]
        self._sizes = [max(int(self._initial_params[s].numel()), 1) for s in self._sites]
        flat = torch.cat([self._initial_params[s].reshape(-1) for s in self._sites])
        # on the CPU the trajectory's vectors are NumPy arrays: its ~15 small vector operations per leapfrog
        # step cost ~0.5 us each instead of ~2 us, and a potential with a NumPy graph takes them without a copy
        self._numpy = flat.device.type == "cpu" and flat.dtype in NUMPY_DTYPES and flat.is_floating_point()
        self._dtype, self._device = flat.dtype, flat.device
        z = flat.numpy().copy() if self._numpy else flat
        potential, grad = self._value_and_grad(z)
        if not (math.isfinite(potential) and math.isfinite(float((grad * 0).sum()))):
            raise ValueError(f"DirectNUTS: the potential or its gradient is not finite at the start ({potential})")
        self._z, self._potential, self._grad, self._stale = z, potential, grad, False
        self._inverse_mass = z * 0 + 1
        self._schedule = WindowSchedule.for_warmup(self._warmup_steps)
        self._iteration = 0
        self._window = _Welford(z)
        if self.adapt_step_size and self._warmup_steps > 0:
            self.step_size = self._find_step_size(self.step_size)
            self._averaging = DualAveraging(self.step_size, self.target_accept_prob)
        self._reset_stats()

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One NUTS iteration (adapting during warmup); returns the new ``{site: value}``."""
        start = time.perf_counter()
        flat = torch.cat([params[s].detach().reshape(-1).to(self._dtype) for s in self._sites])
        z = flat.cpu().numpy() if self._numpy else flat.to(self._device)
        if self._stale or not bool((z == self._z).all()):  # the state or the held sites moved: re-evaluate
            self._z, self._stale = z, False
            self._potential, self._grad = self._value_and_grad(z)
        tree_accept, leaves, diverging = self._iterate()
        warmup = self._iteration < self._warmup_steps
        if warmup:
            self._adapt(tree_accept)
        else:
            self._accept_sum += tree_accept
            self._leapfrogs += leaves
            self._draws += 1
            if diverging:
                self._divergences.append(self._draws - 1)
            self._elapsed += time.perf_counter() - start
        self._iteration += 1
        self._last_accept = tree_accept
        return self._params(self._z)

    def clear_cache(self) -> None:
        """Forget the potential cached at the current state: the sites a compound sampler holds fixed moved.

        :func:`~neuralblock.kernels.conditioning.set_conditioning` calls it for a kernel built on a
        :class:`~neuralblock.kernels.conditioning.ConditionedModel`.
        """
        self._stale = True

    def logging(self) -> dict[str, float]:
        """Step size and the last iteration's acceptance statistic (for Pyro's progress bar)."""
        return {"step_size": round(self.step_size, 4), "acc. prob": round(self._last_accept, 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup acceptance statistic, divergences, step size, leapfrog steps per draw, speed."""
        draws = max(self._draws, 1)
        return {
            "divergences": list(self._divergences),
            "acceptance_rate": self._accept_sum / draws,
            "step_size": self.step_size,
            "leapfrog_steps": self._leapfrogs / draws,
            "transitions_per_second": self._draws / self._elapsed if self._elapsed > 0 else 0.0,
        }

    # ---- setup helpers -----------------------------------------------------------------------

    def _setup_model(self, model: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        from pyro.infer.mcmc.util import initialize_model

        from neuralblock.pyro.likelihood import LogLikelihood

        init, pyro_potential, transforms, _ = initialize_model(model, args, kwargs)
        self.transforms = transforms
        if self._initial_params is None:
            self._initial_params = {k: v.detach() for k, v in init.items()}
        if isinstance(model, ConditionedModel):  # its held values change between calls: a traced graph freezes them
            self.potential_fn = pyro_potential
            return
        try:
            self.potential_fn = LogLikelihood(model, *args, **kwargs).potential_fn(
                {name: transforms[name] for name in init}
            )
        except ValueError as err:  # no single data plate, or a CompileError
            warnings.warn(
                f"DirectNUTS: the model has no direct likelihood path ({err}); using Pyro's potential, "
                "one model run per leapfrog step",
                stacklevel=3,
            )
            self.potential_fn = pyro_potential

    def _find_step_size(self, step_size: float) -> float:
        """Double or halve the step until one leapfrog's acceptance crosses 1/2 (Hoffman and Gelman, Alg. 4)."""
        r = self._momentum()
        start = _Point(self._z, r, self._inverse_mass * r, self._grad)
        energy = self._potential + 0.5 * float(r @ start.v)
        direction = 0
        for _ in range(60):  # 2**60: far beyond any usable step
            point, potential = self._leapfrog(start, step_size)
            delta = energy - (potential + 0.5 * float(point.r @ point.v))
            up = math.isfinite(delta) and delta > math.log(0.5)
            direction = direction or (1 if up else -1)
            if (direction == 1) != up:
                break
            step_size = step_size * 2.0 if direction == 1 else step_size / 2.0
        return step_size

    def _adapt(self, accept_stat: float) -> None:
        """Warmup: dual averaging, and the mass-matrix windows (a new window restarts the step search)."""
        t = self._iteration
        if self.adapt_step_size:
            self.step_size = self._averaging.update(accept_stat)
        if self.adapt_mass_matrix and self._schedule.ends and t >= self._schedule.start:
            self._window.add(self._z)
            if t in self._schedule.ends:
                self._inverse_mass = self._window.regularised_variance()
                self._window = _Welford(self._z)
                if self.adapt_step_size:
                    self.step_size = self._find_step_size(self.step_size)
                    self._averaging = DualAveraging(self.step_size, self.target_accept_prob)
        if t == self._warmup_steps - 1 and self.adapt_step_size:
            self.step_size = self._averaging.final_step_size()

    def _reset_stats(self) -> None:
        self._accept_sum = 0.0
        self._leapfrogs = 0
        self._draws = 0
        self._divergences: list[int] = []
        self._elapsed = 0.0
        self._last_accept = 0.0

    # ---- the sampler -------------------------------------------------------------------------

    def _momentum(self) -> Array:
        """A momentum draw ``N(0, M)`` from torch's generator (seeded by ``pyro.set_rng_seed``)."""
        r = torch.randn(len(self._z), dtype=self._dtype, device=self._device)
        return (r.numpy() if self._numpy else r) / self._inverse_mass**0.5

    def _params(self, z: Array) -> dict[str, Tensor]:
        """``{site: value}`` tensors of a flat state (copies: the caller may keep them)."""
        return self._unflatten(torch.from_numpy(z.copy()) if isinstance(z, np.ndarray) else z)

    def _unflatten(self, z: Tensor) -> dict[str, Tensor]:
        if len(self._sites) == 1:
            shape = self._shapes[0]
            return {self._sites[0]: z if z.shape == shape else z.reshape(shape)}
        return {s: part.reshape(shape) for s, part, shape in zip(self._sites, z.split(self._sizes), self._shapes)}

    def _value_and_grad(self, z: Array) -> tuple[float, Array]:
        """The potential and its gradient at ``z`` (a flat vector, NumPy or torch as the state), from one call."""
        if not isinstance(z, np.ndarray):
            return self._value_and_grad_torch(z)
        potential = self.potential_fn
        if isinstance(potential, FusedPotential):  # its NumPy graph, once recorded and where it pays
            if len(self._sites) == 1:  # the hot case: no dictionaries
                out = potential.value_and_grad.call_numpy(z.reshape(self._shapes[0]))
                if out is not None:
                    return float(out[0]), out[1].reshape(-1)
            else:
                parts = np.split(z, np.cumsum(self._sizes)[:-1])
                by_site = {s: part.reshape(shape) for s, part, shape in zip(self._sites, parts, self._shapes)}
                out = potential.value_and_grad.call_numpy(*(by_site[s] for s in potential.sites))
                if out is not None:
                    grads = dict(zip(potential.sites, out[1:]))
                    return float(out[0]), np.concatenate([grads[s].reshape(-1) for s in self._sites])
        value, grad = self._value_and_grad_torch(torch.from_numpy(z))
        return value, grad.numpy()

    def _value_and_grad_torch(self, z: Tensor) -> tuple[float, Tensor]:
        potential = self.potential_fn
        if isinstance(potential, FusedPotential):
            if len(self._sites) == 1:  # the hot case: no dictionaries, no copies
                value, grad = potential.value_and_grad(self._unflatten(z)[self._sites[0]])
                return float(value), grad if grad.shape == z.shape else grad.reshape(z.shape)
            values = self._unflatten(z)
            value, *grads = potential.value_and_grad(*(values[s] for s in potential.sites))
            by_site = dict(zip(potential.sites, grads))
            return float(value), torch.cat([by_site[s].reshape(-1) for s in self._sites]).to(z)
        assert potential is not None  # set in __init__ or setup
        with torch.enable_grad():
            leaf = z.detach().requires_grad_()
            value = potential(self._unflatten(leaf))
            (grad,) = torch.autograd.grad(value, leaf)
        return float(value.detach()), grad

    def _leapfrog(self, point: _Point, step: float) -> tuple[_Point, float]:
        """One leapfrog step of size ``step`` (negative: backward); returns the new point and its potential."""
        r_half = point.r - (0.5 * step) * point.grad
        z = point.z + step * (self._inverse_mass * r_half)
        potential, grad = self._value_and_grad(z)
        r = r_half - (0.5 * step) * grad
        return _Point(z, r, self._inverse_mass * r, grad), potential

    @staticmethod
    def _turning(rho: Array, minus: _Point, plus: _Point) -> bool:
        """The generalised no-U-turn criterion on a span with momentum sum ``rho`` and these ends."""
        return float(minus.v @ rho) <= 0 or float(plus.v @ rho) <= 0

    def _leaf(self, start: _Point, direction: int, energy0: float) -> _Tree:
        point, potential = self._leapfrog(start, direction * self.step_size)
        error = potential + 0.5 * float(point.r @ point.v) - energy0
        if not math.isfinite(error):
            error = math.inf
        diverging = error > _MAX_ENERGY_ERROR
        accept = math.exp(-error) if error > 0 else 1.0
        return _Tree(point, point, point, potential, -error, point.r, diverging, diverging, accept, 1)

    def _merge(self, old: _Tree, new: _Tree, direction: int, draw_new: bool) -> _Tree:
        """Join ``new`` (built after ``old`` in ``direction``); ``draw_new`` picks the new subtree's draw.

        The joined span stops on a U-turn of the whole span, or of either half extended by the
        other half's nearest point (the extra checks of Stan and Pyro).
        """
        minus, plus = (old, new) if direction > 0 else (new, old)
        rho = old.rho + new.rho
        stop = (
            self._turning(rho, minus.minus, plus.plus)
            or self._turning(minus.rho + plus.minus.r, minus.minus, plus.minus)
            or self._turning(minus.plus.r + plus.rho, minus.plus, plus.plus)
        )
        pick = new if draw_new else old
        return _Tree(
            minus.minus,
            plus.plus,
            pick.draw,
            pick.draw_potential,
            _logaddexp(old.log_weight, new.log_weight),
            rho,
            stop,
            False,
            old.accept_sum + new.accept_sum,
            old.leaves + new.leaves,
        )

    def _build(self, start: _Point, direction: int, depth: int, energy0: float) -> _Tree:
        """A subtree of ``2**depth`` leaves from ``start`` in ``direction``, drawn multinomially."""
        if depth == 0:
            return self._leaf(start, direction, energy0)
        first = self._build(start, direction, depth - 1, energy0)
        if first.stop:
            return first
        second = self._build(first.plus if direction > 0 else first.minus, direction, depth - 1, energy0)
        if second.stop:
            return second._replace(accept_sum=first.accept_sum + second.accept_sum, leaves=first.leaves + second.leaves)
        total = _logaddexp(first.log_weight, second.log_weight)
        return self._merge(first, second, direction, _log_uniform() < second.log_weight - total)

    def _iterate(self) -> tuple[float, int, bool]:
        """One trajectory from the current state; returns (mean acceptance statistic, leapfrog steps, diverged)."""
        r = self._momentum()
        start = _Point(self._z, r, self._inverse_mass * r, self._grad)
        energy0 = self._potential + 0.5 * float(r @ start.v)
        tree = _Tree(start, start, start, self._potential, 0.0, r, False, False, 0.0, 0)
        accept_sum, leaves, diverging = 0.0, 0, False
        for depth in range(self.max_tree_depth):
            direction = 1 if random.random() < 0.5 else -1
            new = self._build(tree.plus if direction > 0 else tree.minus, direction, depth, energy0)
            accept_sum += new.accept_sum
            leaves += new.leaves
            if new.stop:
                diverging = new.diverging
                break
            tree = self._merge(tree, new, direction, _log_uniform() < new.log_weight - tree.log_weight)
            if tree.stop:
                break
        self._z, self._potential, self._grad = tree.draw.z, tree.draw_potential, tree.draw.grad
        return accept_sum / max(leaves, 1), leaves, diverging


class _Welford:
    """Running mean and variance of the warmup draws in one mass-matrix window."""

    def __init__(self, like: Array) -> None:
        self.count = 0
        self.mean = like * 0
        self.m2 = like * 0

    def add(self, z: Array) -> None:
        self.count += 1
        delta = z - self.mean
        self.mean = self.mean + delta / self.count
        self.m2 = self.m2 + delta * (z - self.mean)

    def regularised_variance(self) -> Array:
        """Stan's regularised variance: shrunk toward 1e-3 with the weight of 5 draws."""
        n = self.count
        if n < 2:
            return self.mean * 0 + 1
        variance = self.m2 / (n - 1)
        return (n / (n + 5.0)) * variance + 1e-3 * (5.0 / (n + 5.0))


def _log_uniform() -> float:
    """``log U`` for ``U ~ Uniform(0, 1]`` from Python's generator (seeded by ``pyro.set_rng_seed``)."""
    return math.log(1.0 - random.random())


def _logaddexp(a: float, b: float) -> float:
    high = max(a, b)
    if high == -math.inf:
        return -math.inf
    return high + math.log(math.exp(a - high) + math.exp(b - high))
