"""Particle Gibbs: conditional SMC with ancestor sampling for univariate state-space latents.

A state-space model over ``S`` independent series of length ``T`` is given by batched
torch callables (a :class:`StateSpaceModel`); every callable works on particle tensors
``[S, N]`` at once, so one conditional-SMC sweep costs ``T`` vectorized steps whatever
``S`` and ``N`` are. :func:`csmc_step` is the pure transition (reference path in, new
path out); :class:`ParticleGibbs` is the thin :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel`
shell that updates a latent path site given global parameters fixed by
:meth:`ParticleGibbs.condition_on` (the building block of a Gibbs sampler that alternates
the path with a global-parameter kernel such as ``AusterityMH``).

The conditional SMC uses the bootstrap proposal (the transition), multinomial resampling of
the ``N - 1`` free particles, and ancestor sampling for the reference particle, so it leaves
the smoothing distribution ``p(x_{1:T} | y_{1:T})`` of every series invariant.

References:
    Andrieu, Doucet, Holenstein, "Particle Markov chain Monte Carlo methods", JRSS B 2010.
    Lindsten, Jordan, Schön, "Particle Gibbs with ancestor sampling", JMLR 2014.

Example:
    >>> import torch
    >>> y = torch.zeros(3, 4)
    >>> ssm = linear_gaussian_ssm(y, a=0.9, q=1.0, r=1.0)
    >>> path, info = csmc_step(torch.zeros(3, 4), ssm, num_particles=16)
    >>> path.shape, info.log_evidence.shape
    (torch.Size([3, 4]), torch.Size([3]))
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import NamedTuple

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from neuralblock.kernels.functional import gibbs_sample
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second

__all__ = [
    "CSMCInfo",
    "ParticleGibbs",
    "StateSpaceModel",
    "csmc_step",
    "kalman_smoother",
    "linear_gaussian_ssm",
    "path_log_joint",
]


class StateSpaceModel(NamedTuple):
    """A univariate state-space model over ``S`` independent series, as batched callables.

    Particles are ``[S, N]`` tensors (series by particle); ``t`` is a 0-based time index.

    Attributes:
        initial_sample: ``num_particles -> x_0 [S, num_particles]``, a draw from ``p(x_0)``.
        initial_log_prob: ``x_0 [S, N] -> log p(x_0) [S, N]``.
        transition_sample: ``(x_prev [S, N], t) -> x_t [S, N]``, a draw from ``p(x_t | x_{t-1})``.
        transition_log_prob: ``(x_prev [S, N], x_t [S, N or 1], t) -> log p(x_t | x_{t-1}) [S, N]``.
        observation_log_prob: ``(x_t [S, N], t) -> log p(y_t | x_t) [S, N]``.
    """

    initial_sample: Callable[[int], Tensor]
    initial_log_prob: Callable[[Tensor], Tensor]
    transition_sample: Callable[[Tensor, int], Tensor]
    transition_log_prob: Callable[[Tensor, Tensor, int], Tensor]
    observation_log_prob: Callable[[Tensor, int], Tensor]


class CSMCInfo(NamedTuple):
    """Diagnostics of one conditional-SMC sweep.

    Attributes:
        log_evidence: the sweep's estimate of ``log p(y_{1:T})`` per series, ``[S]`` (``-inf`` for a
            series with a step where no particle had finite weight).
        mean_ess: mean over steps and series of the relative effective sample size in [0, 1] (0 at a
            step where no particle had finite weight).
        changed: fraction of path entries ``(s, t)`` that differ from the reference.
        num_degenerate: steps x series where no particle had finite weight (weights reset to uniform).
    """

    log_evidence: Tensor
    mean_ess: float
    changed: float
    num_degenerate: int


def _normalize(log_w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Finite log-weights, their log-sum per series, and the all-``-inf`` rows ``[S]`` (reset to uniform)."""
    log_w = log_w.nan_to_num(nan=-math.inf, posinf=-math.inf, neginf=-math.inf)
    dead = ~torch.isfinite(log_w.amax(-1))
    log_w = torch.where(dead[:, None], torch.zeros_like(log_w), log_w)
    return log_w, torch.logsumexp(log_w, -1), dead


def _step_terms(log_w: Tensor, log_z: Tensor, dead: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """A step's log-evidence increments ``[S]`` and ESS sum: a dead row has zero evidence and no effective sample."""
    evidence = torch.where(dead, torch.full_like(log_z, -math.inf), log_z - math.log(n))
    ess = torch.where(dead, torch.zeros_like(log_z), (2 * log_z - torch.logsumexp(2 * log_w, -1)).exp())
    return evidence, ess.sum()


def _resample(log_w: Tensor, num: int) -> Tensor:
    """Multinomial ancestor indices ``[S, num]`` drawn from normalized weights (inverse CDF)."""
    probs = torch.softmax(log_w, -1)
    cdf = probs.cumsum(-1)
    u = torch.rand(log_w.shape[0], num, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).clamp(max=log_w.shape[-1] - 1)


def csmc_step(
    reference: Tensor, ssm: StateSpaceModel, num_particles: int = 100, ancestor_sampling: bool = True
) -> tuple[Tensor, CSMCInfo]:
    """One conditional-SMC sweep: a draw of new paths that leaves ``p(x_{0:T-1} | y)`` invariant.

    The reference path occupies particle 0 at every step; the other ``N - 1`` particles are
    resampled multinomially and propagated through the transition (bootstrap proposal). With
    ``ancestor_sampling`` the reference's ancestor is redrawn at each step with probability
    ``∝ w_{t-1}^j p(x^ref_t | x^j_{t-1})``, which breaks path degeneracy (Lindsten et al., 2014).
    The new path is traced back from a particle drawn by its final weight.

    Args:
        reference: current paths ``[S, T]``.
        ssm: the model's batched callables.
        num_particles: ``N >= 2`` particles per series.
        ancestor_sampling: redraw the reference's ancestors (recommended).

    Returns:
        ``(new_path [S, T], CSMCInfo)``.

    Example:
        >>> ssm = linear_gaussian_ssm(torch.randn(2, 5), a=0.5, q=1.0, r=0.5)
        >>> path, info = csmc_step(torch.zeros(2, 5), ssm, num_particles=8)
        >>> bool(torch.isfinite(path).all()), 0 < info.mean_ess <= 1
        (True, True)
    """
    if not isinstance(reference, Tensor) or reference.dim() != 2:
        raise ValueError(f"reference must be a [S, T] tensor, got {getattr(reference, 'shape', type(reference))}")
    if int(num_particles) < 2:
        raise ValueError(f"num_particles must be >= 2, got {num_particles}")
    num_series, steps = reference.shape
    n = int(num_particles)
    x = ssm.initial_sample(n).to(reference.dtype)
    x[:, 0] = reference[:, 0]
    log_w, log_z, dead = _normalize(ssm.observation_log_prob(x, 0))
    log_evidence, ess_sum = _step_terms(log_w, log_z, dead, n)
    degenerate = dead.sum()
    particles, ancestors = [x], []
    for t in range(1, steps):
        free = _resample(log_w, n - 1)
        if ancestor_sampling:
            logits = log_w + ssm.transition_log_prob(x, reference[:, t : t + 1], t)
            ref_anc = gibbs_sample(logits, torch.zeros(num_series)).values.long()[:, None]
        else:
            ref_anc = torch.zeros(num_series, 1, dtype=torch.long)
        anc = torch.cat([ref_anc, free], -1)
        x = ssm.transition_sample(x.gather(1, anc), t)
        x[:, 0] = reference[:, t]
        log_w, log_z, dead = _normalize(ssm.observation_log_prob(x, t))
        evidence, ess = _step_terms(log_w, log_z, dead, n)
        degenerate, log_evidence, ess_sum = degenerate + dead.sum(), log_evidence + evidence, ess_sum + ess
        particles.append(x)
        ancestors.append(anc)
    k = gibbs_sample(log_w, torch.zeros(num_series)).values.long()[:, None]
    path = torch.empty_like(reference)
    for t in range(steps - 1, -1, -1):
        path[:, t] = particles[t].gather(1, k)[:, 0]
        if t > 0:
            k = ancestors[t - 1].gather(1, k)
    info = CSMCInfo(
        log_evidence=log_evidence,
        mean_ess=float(ess_sum) / (n * num_series * steps),
        changed=float((path != reference).to(torch.float64).mean()),
        num_degenerate=int(degenerate),
    )
    return path, info


def path_log_joint(path: Tensor, ssm: StateSpaceModel) -> Tensor:
    """``log p(x_{0:T-1}, y_{0:T-1})`` of paths ``[S, T]`` under ``ssm``, per series ``[S]``.

    Example:
        >>> ssm = linear_gaussian_ssm(torch.zeros(1, 2), a=0.0, q=1.0, r=1.0, p0=1.0)
        >>> round(float(path_log_joint(torch.zeros(1, 2), ssm)[0]), 4) == round(-4 * 0.5 * math.log(2 * math.pi), 4)
        True
    """
    total = ssm.initial_log_prob(path[:, :1])[:, 0] + ssm.observation_log_prob(path[:, :1], 0)[:, 0]
    for t in range(1, path.shape[1]):
        cur = path[:, t : t + 1]
        total = total + ssm.transition_log_prob(path[:, t - 1 : t], cur, t)[:, 0]
        total = total + ssm.observation_log_prob(cur, t)[:, 0]
    return total


# -- a linear-Gaussian model (tests, examples, and the Kalman reference) --------------------


def _normal_log_prob(x: Tensor, loc: Tensor | float, var: Tensor | float) -> Tensor:
    var = torch.as_tensor(var, dtype=x.dtype)
    return -0.5 * ((x - loc) ** 2 / var + torch.log(2 * math.pi * var))


def _lg_initial_sample(num: int, shape: int, m0: float, p0: float) -> Tensor:
    return m0 + math.sqrt(p0) * torch.randn(shape, num)


def _lg_initial_log_prob(x: Tensor, m0: float, p0: float) -> Tensor:
    return _normal_log_prob(x, m0, p0)


def _lg_transition_sample(x_prev: Tensor, t: int, a: float, q: float) -> Tensor:
    return a * x_prev + math.sqrt(q) * torch.randn_like(x_prev)


def _lg_transition_log_prob(x_prev: Tensor, x: Tensor, t: int, a: float, q: float) -> Tensor:
    return _normal_log_prob(x, a * x_prev, q)


def _lg_observation_log_prob(x: Tensor, t: int, y: Tensor, r: float) -> Tensor:
    return _normal_log_prob(y[:, t : t + 1], x, r)


def linear_gaussian_ssm(
    y: Tensor, a: float, q: float, r: float, m0: float = 0.0, p0: float | None = None
) -> StateSpaceModel:
    """The model ``x_0 ~ N(m0, p0)``, ``x_t = a x_{t-1} + N(0, q)``, ``y_t = x_t + N(0, r)``.

    Args:
        y: observations ``[S, T]``.
        a: autoregression coefficient.
        q: transition variance.
        r: observation variance.
        m0: initial mean.
        p0: initial variance (default: the stationary ``q / (1 - a^2)`` when ``|a| < 1``, else ``q``).

    Returns:
        A picklable :class:`StateSpaceModel` (its callables are partials of module functions).

    Example:
        >>> ssm = linear_gaussian_ssm(torch.zeros(2, 3), a=0.5, q=1.0, r=1.0)
        >>> ssm.initial_sample(4).shape
        torch.Size([2, 4])
    """
    if y.dim() != 2:
        raise ValueError(f"y must be [S, T], got shape {tuple(y.shape)}")
    if not (q > 0 and r > 0):
        raise ValueError(f"variances must be positive, got q={q}, r={r}")
    if p0 is None:
        p0 = q / (1 - a * a) if abs(a) < 1 else q
    return StateSpaceModel(
        initial_sample=partial(_lg_initial_sample, shape=y.shape[0], m0=m0, p0=p0),
        initial_log_prob=partial(_lg_initial_log_prob, m0=m0, p0=p0),
        transition_sample=partial(_lg_transition_sample, a=a, q=q),
        transition_log_prob=partial(_lg_transition_log_prob, a=a, q=q),
        observation_log_prob=partial(_lg_observation_log_prob, y=y, r=r),
    )


def kalman_smoother(
    y: Tensor, a: float, q: float, r: float, m0: float = 0.0, p0: float | None = None
) -> tuple[Tensor, Tensor]:
    """Exact smoothing means and variances ``[S, T]`` of :func:`linear_gaussian_ssm` (RTS smoother).

    Example:
        >>> mean, var = kalman_smoother(torch.zeros(1, 3), a=0.5, q=1.0, r=1.0)
        >>> mean.abs().max().item(), bool((var > 0).all())
        (0.0, True)
    """
    if p0 is None:
        p0 = q / (1 - a * a) if abs(a) < 1 else q
    y = y.to(torch.float64)
    steps = y.shape[1]
    m_f, p_f = [], []
    m, p = torch.full_like(y[:, 0], m0), torch.full_like(y[:, 0], p0)
    for t in range(steps):
        if t > 0:
            m, p = a * m, a * a * p + q
        gain = p / (p + r)
        m, p = m + gain * (y[:, t] - m), (1 - gain) * p
        m_f.append(m)
        p_f.append(p)
    means, variances = [m_f[-1]], [p_f[-1]]
    for t in range(steps - 2, -1, -1):
        pred = a * a * p_f[t] + q
        gain = a * p_f[t] / pred
        means.insert(0, m_f[t] + gain * (means[0] - a * m_f[t]))
        variances.insert(0, p_f[t] + gain * gain * (variances[0] - pred))
    return torch.stack(means, -1), torch.stack(variances, -1)


# -- the MCMCKernel shell ------------------------------------------------------------------


def _checked_path(path: Tensor, shape: torch.Size | None) -> Tensor:
    """A latent path ``[S, T]`` of finite floats (of ``shape`` when given)."""
    path = torch.as_tensor(path)
    if not path.is_floating_point():
        raise TypeError(f"a latent path must hold floats (continuous states), got dtype {path.dtype}")
    if path.dim() != 2 or (shape is not None and path.shape != shape):
        expected = "[S, T]" if shape is None else str(tuple(shape))
        raise ValueError(f"a latent path must have shape {expected}, got {tuple(path.shape)}")
    if not torch.isfinite(path).all():
        raise ValueError("a latent path must be finite")
    return path


class ParticleGibbs(MCMCKernel):
    """Particle Gibbs update of a latent path site given fixed global parameters.

    Each :meth:`sample` runs one :func:`csmc_step` on the current path. The model is built by
    ``state_space(**values)`` from the global values last set by :meth:`condition_on`, so an
    outer Gibbs loop alternates ``kernel.condition_on({"phi": ..., ...})`` / ``kernel.sample``
    with a global-parameter kernel conditioned on the new path.

    Args:
        state_space: ``**values -> StateSpaceModel`` (a picklable callable, e.g. a ``functools.partial``
            of a module-level function, so that ``pyro.infer.MCMC(num_chains > 1)`` can spawn it).
        initial_path: starting path ``[S, T]`` (its shape is the path's shape).
        num_particles: particles per series (``>= 2``).
        ancestor_sampling: use ancestor sampling (recommended; without it long paths degenerate).
        site: the name of the path's sample site.
        values: initial global values passed to ``state_space`` (same as calling :meth:`condition_on`).
        model: optional Pyro model the path belongs to (exposed as ``.model``).

    Example:
        >>> from pyro.infer import MCMC
        >>> y = torch.randn(2, 4)
        >>> kernel = ParticleGibbs(partial(linear_gaussian_ssm, y), torch.zeros(2, 4), num_particles=8,
        ...                        values={"a": 0.5, "q": 1.0, "r": 1.0})
        >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True)
        >>> mcmc.run()
        >>> mcmc.get_samples()["h"].shape
        torch.Size([5, 2, 4])
    """

    def __init__(
        self,
        state_space: Callable[..., StateSpaceModel],
        initial_path: Tensor,
        num_particles: int = 100,
        ancestor_sampling: bool = True,
        site: str = "h",
        values: Mapping[str, Tensor | float] | None = None,
        model: Callable | None = None,
    ) -> None:
        if not callable(state_space):
            raise TypeError(f"state_space must be callable, got {type(state_space).__name__}")
        initial_path = _checked_path(initial_path, None)
        if int(num_particles) < 2:
            raise ValueError(f"num_particles must be >= 2, got {num_particles}")
        self.state_space = state_space
        self.num_particles = int(num_particles)
        self.ancestor_sampling = bool(ancestor_sampling)
        self.site = site
        self._model = model
        self._initial_path = initial_path.clone()
        self._values: dict[str, Tensor | float] = dict(values or {})
        self.transforms: dict = {}
        self._warmup_steps = 0
        self._t = 0
        self._reset_stats()

    @property
    def model(self) -> Callable | None:
        """The Pyro model given at construction (or ``None``)."""
        return self._model

    def condition_on(self, values: Mapping[str, Tensor | float]) -> None:
        """Set the global values the next sweeps condition on (merged into the current ones).

        Args:
            values: keyword arguments of ``state_space`` (e.g. ``{"phi": phi, "sigma2": s2}``).
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping of name -> value, got {type(values).__name__}")
        self._values.update(values)

    def _reset_stats(self) -> None:
        self._sweeps = 0
        self._changed = 0.0
        self._ess = 0.0
        self._degenerate = 0
        self._elapsed = 0.0
        self._last = (0.0, 0.0)

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Reset counters; the path starts from ``initial_params``."""
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        self._reset_stats()

    @property
    def initial_params(self) -> dict[str, Tensor]:
        """``{site: initial_path}``."""
        return {self.site: self._initial_path.clone()}

    @initial_params.setter
    def initial_params(self, params: Mapping[str, Tensor]) -> None:
        self._initial_path = _checked_path(params[self.site], self._initial_path.shape).clone()

    def sweep(self, path: Tensor) -> tuple[Tensor, CSMCInfo]:
        """One conditional-SMC sweep from ``path`` under the current values (no bookkeeping)."""
        return csmc_step(path, self.state_space(**self._values), self.num_particles, self.ancestor_sampling)

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One particle Gibbs sweep of the path site; other entries of ``params`` pass through."""
        if self.site not in params:
            raise ValueError(f"params lack the path site {self.site!r}; got {sorted(params)}")
        start = time.perf_counter()
        path, info = self.sweep(params[self.site])
        self._last = (info.changed, info.mean_ess)
        if self._t >= self._warmup_steps:
            self._elapsed += time.perf_counter() - start
            self._sweeps += 1
            self._changed += info.changed
            self._ess += info.mean_ess
            self._degenerate += info.num_degenerate
        self._t += 1
        return {**params, self.site: path}

    def logging(self) -> dict[str, float]:
        """Fraction of the path changed and relative ESS in the latest sweep."""
        return {"changed": round(self._last[0], 3), "ess": round(self._last[1], 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup means of the changed fraction and relative ESS, sweeps per second, degenerate steps."""
        n = max(self._sweeps, 1)
        return {
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: no trajectories)
            "path_change_rate": self._changed / n,
            "mean_relative_ess": self._ess / n,
            "transitions_per_second": per_second(self._sweeps, self._elapsed),  # one sweep per transition
            "degenerate_steps": float(self._degenerate),
        }
