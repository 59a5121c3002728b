"""Stochastic-volatility models: Pyro models in the plate idiom, particle Gibbs pieces, data.

The model (Kim, Shephard & Chib 1998; the seed's setting):

    phi ~ Beta(5, 1),   sigma2 ~ InverseGamma(5, 0.05),
    h_1 ~ N(0, sigma2 / (1 - phi^2)),   h_t = phi h_{t-1} + sigma eta_t,
    y_t = beta exp(h_t / 2) eps_t,      eta_t, eps_t ~ N(0, 1),

with the scale ``beta`` fixed (``beta = 1``; S&P 500 returns are standardized to mean 0 and
sd 1 first, which is the same as ``beta = sd(returns)`` on the raw scale).

Two Pyro models share the densities:

* :func:`sv_series_model` — ``S`` independent series ``y [S, T]`` (the seed's 200 x 5); the
  local sections of the plate ``"series"`` are whole series;
* :func:`sv_timestep_model` — one long series ``y [T]`` (S&P 500); the local sections of the
  plate ``"time"`` are the time steps, each reading its predecessor ``h[idx - 1]``.

In both, the path ``h`` is a latent site outside the plate with a flat base density (a
masked Normal: log density 0, but it samples, so kernels can initialise from the model),
and its AR(1) prior enters through the observed site ``"h_prior"`` inside the plate,
indexed by the plate's indices. So with ``h`` fixed (``condition_on({"h": h})`` of a
global-parameter kernel), a plate section's log density is exactly the transition density
of that section plus its (parameter-free) observation density, and a kernel that injects
subsample indices evaluates only the sections it draws.

Particle Gibbs for ``h`` uses :func:`sv_state_space` (the same densities as batched
callables) — directly for independent series, and through :func:`sv_blocked_sweep` for one
long series (a two-colour blocked conditional SMC, so one sweep costs ``2 * block_len``
vectorized steps instead of ``T``).

Example:
    >>> import torch, pyro
    >>> y, h = simulate_sv(num_series=4, length=5, generator=torch.Generator().manual_seed(0))
    >>> trace = pyro.poutine.trace(pyro.condition(sv_series_model, data={"h": h})).get_trace(y)
    >>> trace.nodes["h_prior"]["fn"].batch_shape
    torch.Size([4])
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

from neuralblock.io import data_path
from neuralblock.kernels.particle_gibbs import StateSpaceModel, csmc_step

__all__ = [
    "PHI_PRIOR",
    "SIGMA2_PRIOR",
    "load_sp500_returns",
    "simulate_sv",
    "sv_blocked_sweep",
    "sv_series_model",
    "sv_state_space",
    "sv_study_config",
    "sv_study_parser",
    "sv_timestep_model",
]

PHI_PRIOR = (5.0, 1.0)  # Beta(5, 1) on phi in (0, 1)
SIGMA2_PRIOR = (5.0, 0.05)  # InverseGamma(5, 0.05) on sigma2


# -- shared densities --------------------------------------------------------------------------


def _ar1_loc_var(h_prev: Tensor, fresh: Tensor, phi: Tensor, sigma2: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance of ``h_t`` given ``h_{t-1}``; where ``fresh``, the stationary law instead."""
    stationary = sigma2 / (1 - phi * phi)
    loc = torch.where(fresh, torch.zeros_like(h_prev), phi * h_prev)
    var = torch.where(fresh, stationary, sigma2).expand_as(loc)
    return loc, var


def _normal_log_prob(x: Tensor, loc: Tensor, var: Tensor) -> Tensor:
    return -0.5 * ((x - loc) ** 2 / var + torch.log(2 * math.pi * var))


def _obs_log_prob(y: Tensor, h: Tensor, beta: float) -> Tensor:
    """``log N(y; 0, beta^2 exp(h))``."""
    return -0.5 * (y * y * torch.exp(-h) / beta**2 + h + math.log(2 * math.pi * beta**2))


def _priors() -> tuple[Tensor, Tensor]:
    phi = pyro.sample("phi", dist.Beta(*PHI_PRIOR))
    sigma2 = pyro.sample("sigma2", dist.InverseGamma(*SIGMA2_PRIOR))
    return phi, sigma2


def _ar1_normal(h_prev: Tensor, first: Tensor, phi: Tensor, sigma2: Tensor) -> dist.Normal:
    loc, var = _ar1_loc_var(h_prev, first, phi, sigma2)
    return dist.Normal(loc, var.sqrt())


def _flat(shape: tuple[int, ...]) -> dist.Distribution:
    """A flat base density for the path (log density 0) that still samples, for initialisation."""
    return dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)).mask(False)


def _check_y(y: Tensor, dim: int) -> None:
    if not isinstance(y, Tensor) or y.dim() != dim:
        raise ValueError(f"y must be a {dim}-dimensional tensor, got {getattr(y, 'shape', type(y))}")


# -- Pyro models -------------------------------------------------------------------------------


def sv_series_model(y: Tensor, beta: float = 1.0) -> None:
    """SV model over ``S`` independent series ``y [S, T]``; plate ``"series"`` of whole series.

    Sites: ``phi``, ``sigma2`` (globals), ``h [S, T]`` (latent path, flat base density),
    ``h_prior`` (observed: the AR(1) density of ``h[idx]``), ``y`` (observed). The arithmetic
    broadcasts a leading batch of ``(phi, sigma2)`` values (shape ``[P, 1]``), so a kernel can
    evaluate several parameter points in one run.

    Example:
        >>> import pyro
        >>> y = torch.zeros(3, 5)
        >>> tr = pyro.poutine.trace(pyro.condition(sv_series_model, data={"h": torch.zeros(3, 5)})).get_trace(y)
        >>> sorted(n for n, s in tr.nodes.items() if s["type"] == "sample")
        ['h', 'h_prior', 'phi', 'series', 'sigma2', 'y']
    """
    _check_y(y, 2)
    num_series, length = y.shape
    phi, sigma2 = _priors()
    h = pyro.sample("h", _flat((num_series, length)))
    first = torch.arange(length) == 0
    with pyro.plate("series", num_series) as idx:
        path = h[idx]
        prev = torch.cat([torch.zeros_like(path[:, :1]), path[:, :-1]], -1)
        # a trailing axis for time keeps a leading batch of (phi, sigma2) values left of the plate
        pyro.sample("h_prior", _ar1_normal(prev, first, phi[..., None], sigma2[..., None]).to_event(1), obs=path)
        pyro.sample("y", dist.Normal(0.0, beta * torch.exp(path / 2)).to_event(1), obs=y[idx])


def sv_timestep_model(y: Tensor, beta: float = 1.0) -> None:
    """SV model for one long series ``y [T]``; plate ``"time"`` whose sections are time steps.

    Section ``t`` is ``log p(h_t | h_{t-1}) + log p(y_t | h_t)`` (``t = 0`` uses the
    stationary law), read from the fixed path by ``h[idx]`` and ``h[idx - 1]``.

    Example:
        >>> import pyro
        >>> tr = pyro.poutine.trace(pyro.condition(sv_timestep_model, data={"h": torch.zeros(6)})).get_trace(
        ...     torch.zeros(6))
        >>> tr.nodes["h_prior"]["fn"].batch_shape
        torch.Size([6])
    """
    _check_y(y, 1)
    (length,) = y.shape
    phi, sigma2 = _priors()
    h = pyro.sample("h", _flat((length,)))
    with pyro.plate("time", length) as idx:
        first = idx == 0
        prev = h[(idx - 1).clamp(min=0)]
        pyro.sample("h_prior", _ar1_normal(prev, first, phi, sigma2), obs=h[idx])
        pyro.sample("y", dist.Normal(0.0, beta * torch.exp(h[idx] / 2)), obs=y[idx])


# -- particle Gibbs pieces ---------------------------------------------------------------------


def _sv_initial_sample(num: int, loc: Tensor, var: Tensor) -> Tensor:
    return loc + var.sqrt() * torch.randn(loc.shape[0], num)


def _sv_initial_log_prob(x: Tensor, loc: Tensor, var: Tensor) -> Tensor:
    return _normal_log_prob(x, loc, var)


def _sv_transition_sample(x_prev: Tensor, t: int, fresh: Tensor, phi: Tensor, sigma2: Tensor) -> Tensor:
    loc, var = _ar1_loc_var(x_prev, fresh[:, t : t + 1], phi, sigma2)
    return loc + var.sqrt() * torch.randn_like(loc)


def _sv_transition_log_prob(x_prev: Tensor, x: Tensor, t: int, fresh: Tensor, phi: Tensor, sigma2: Tensor) -> Tensor:
    loc, var = _ar1_loc_var(x_prev, fresh[:, t : t + 1], phi, sigma2)
    return _normal_log_prob(x, loc, var)


def _sv_observation_log_prob(
    x: Tensor,
    t: int,
    y: Tensor,
    mask: Tensor,
    beta: float,
    right: Tensor,
    has_right: Tensor,
    phi: Tensor,
    sigma2: Tensor,
) -> Tensor:
    lp = torch.where(mask[:, t : t + 1], _obs_log_prob(y[:, t : t + 1], x, beta), torch.zeros_like(x))
    if t == y.shape[1] - 1:  # the right neighbour's transition density closes the block
        lp = lp + torch.where(has_right, _normal_log_prob(right, phi * x, sigma2), torch.zeros_like(x))
    return lp


def sv_state_space(
    y: Tensor,
    phi: Tensor | float,
    sigma2: Tensor | float,
    beta: float = 1.0,
    fresh: Tensor | None = None,
    mask: Tensor | None = None,
    left: Tensor | None = None,
    right: Tensor | None = None,
) -> StateSpaceModel:
    """The SV model of rows ``y [S, T]`` as a particle-Gibbs :class:`StateSpaceModel`.

    Without the optional arguments each row is an independent series starting from the
    stationary law. The optional arguments describe rows that are blocks of a longer series:

    Args:
        y: observations ``[S, T]``.
        phi: AR coefficient.
        sigma2: innovation variance.
        beta: observation scale.
        fresh: ``[S, T]`` bool, states drawn from the stationary law regardless of their
            predecessor (default: the first column); ``fresh[:, 0] == False`` means the row's
            first state follows ``left`` by the AR(1) transition.
        mask: ``[S, T]`` bool, which ``y`` are observed (default all).
        left: ``[S]`` state before each row (used where ``fresh[:, 0]`` is False).
        right: ``[S]`` state after each row, or NaN where there is none (its transition
            density from the row's last state is added to the last step's weight).

    Example:
        >>> ssm = sv_state_space(torch.zeros(2, 5), phi=0.95, sigma2=0.01)
        >>> ssm.observation_log_prob(torch.zeros(2, 3), 0).shape
        torch.Size([2, 3])
    """
    _check_y(y, 2)
    num_series, length = y.shape
    phi_t, sigma2_t = torch.as_tensor(phi, dtype=y.dtype), torch.as_tensor(sigma2, dtype=y.dtype)
    if not (0 < float(phi_t) < 1 and float(sigma2_t) > 0):
        raise ValueError(f"need 0 < phi < 1 and sigma2 > 0, got phi={float(phi_t)}, sigma2={float(sigma2_t)}")
    if fresh is None:
        fresh = (torch.arange(length) == 0).expand(num_series, length)
    mask = torch.ones(num_series, length, dtype=torch.bool) if mask is None else mask
    left = torch.zeros(num_series, dtype=y.dtype) if left is None else left
    right = torch.full((num_series,), math.nan, dtype=y.dtype) if right is None else right
    loc0, var0 = _ar1_loc_var(left[:, None], fresh[:, :1], phi_t, sigma2_t)
    has_right = ~torch.isnan(right)[:, None]
    return StateSpaceModel(
        initial_sample=partial(_sv_initial_sample, loc=loc0, var=var0),
        initial_log_prob=partial(_sv_initial_log_prob, loc=loc0, var=var0),
        transition_sample=partial(_sv_transition_sample, fresh=fresh, phi=phi_t, sigma2=sigma2_t),
        transition_log_prob=partial(_sv_transition_log_prob, fresh=fresh, phi=phi_t, sigma2=sigma2_t),
        observation_log_prob=partial(
            _sv_observation_log_prob,
            y=y,
            mask=mask,
            beta=beta,
            right=right.nan_to_num()[:, None],
            has_right=has_right,
            phi=phi_t,
            sigma2=sigma2_t,
        ),
    )


def sv_blocked_sweep(
    h: Tensor,
    y: Tensor,
    phi: Tensor | float,
    sigma2: Tensor | float,
    beta: float = 1.0,
    block_len: int = 100,
    num_particles: int = 50,
    offset: int | None = None,
) -> Tensor:
    """One blocked particle Gibbs sweep of a long path ``h [T]`` (or ``C`` chains ``[C, T]``) given ``y [T]``.

    The series is cut into blocks of ``block_len`` at a random ``offset`` (padded at both ends
    with auxiliary states that are independent of the path and observe nothing). Even blocks
    are updated together by one conditional-SMC sweep given their neighbours, then odd
    blocks given the new even ones; each block targets ``p(h_block | h_left, h_right, y_block)``,
    so the sweep leaves ``p(h | y, phi, sigma2)`` invariant. Several chains run in one batch
    and share the sweep's offset.

    Args:
        h: current path ``[T]``, or ``[C, T]`` for ``C`` chains on the same data.
        y: observations ``[T]``.
        phi: AR coefficient.
        sigma2: innovation variance.
        beta: observation scale.
        block_len: block length ``L``.
        num_particles: particles per block.
        offset: padding before the first state, in ``[0, L)`` (default: uniform at random).

    Returns:
        The new path, shaped like ``h``.

    Example:
        >>> y, h = simulate_sv(1, 50, generator=torch.Generator().manual_seed(0))
        >>> sv_blocked_sweep(h[0], y[0], 0.95, 0.01, block_len=10, num_particles=8).shape
        torch.Size([50])
    """
    _check_y(y, 1)
    if h.shape[-1:] != y.shape or h.dim() > 2:
        raise ValueError(f"h must be [T] or [C, T] with T = len(y), got {tuple(h.shape)} and y {tuple(y.shape)}")
    if block_len < 1:
        raise ValueError(f"block_len must be >= 1, got {block_len}")
    chains = h.reshape(-1, y.shape[0])
    length, size, num_chains = y.shape[0], int(block_len), chains.shape[0]
    offset = int(torch.randint(size, ())) if offset is None else int(offset)
    blocks = -(-(length + offset) // size)
    blocks += blocks % 2  # an even count keeps the two colours the same size
    padded = blocks * size
    real = torch.zeros(padded, dtype=torch.bool)
    real[offset : offset + length] = True
    stationary = float(torch.as_tensor(sigma2)) / (1 - float(torch.as_tensor(phi)) ** 2)
    path = math.sqrt(stationary) * torch.randn(num_chains, padded, dtype=h.dtype)  # auxiliary states: fresh draws
    path[:, real] = chains
    y_pad = torch.zeros(padded, dtype=y.dtype)
    y_pad[real] = y
    # every padded state and the first real state are fresh (independent of their predecessor)
    fresh = ~real.clone()
    fresh[offset] = True
    for colour in (0, 1):
        rows = torch.arange(colour, blocks, 2)
        cols = rows[:, None] * size + torch.arange(size)  # [B, L]
        starts, ends = cols[:, 0], cols[:, -1] + 1
        after = ends.clamp(max=padded - 1)
        left = path[:, (starts - 1).clamp(min=0)].reshape(-1)
        has_right = ((ends < padded) & ~fresh[after]).expand(num_chains, -1).reshape(-1)
        right = torch.where(has_right, path[:, after].reshape(-1), torch.full_like(left, math.nan))
        flat = lambda t: t.expand(num_chains, *t.shape).reshape(-1, size)  # noqa: E731 - chains x blocks rows
        ssm = sv_state_space(
            flat(y_pad[cols]), phi, sigma2, beta, fresh=flat(fresh[cols]), mask=flat(real[cols]), left=left, right=right
        )
        new, _ = csmc_step(path[:, cols].reshape(-1, size), ssm, num_particles)
        path[:, cols] = new.reshape(num_chains, -1, size)
    return path[:, real].reshape(h.shape)


# -- data --------------------------------------------------------------------------------------


def simulate_sv(
    num_series: int = 200,
    length: int = 5,
    phi: float = 0.95,
    sigma: float = 0.1,
    beta: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw ``(y, h)``, each ``[num_series, length]``, from the SV model (the seed's setting by default).

    Example:
        >>> y, h = simulate_sv(generator=torch.Generator().manual_seed(0))
        >>> y.shape, h.shape
        (torch.Size([200, 5]), torch.Size([200, 5]))
    """
    if not (0 < phi < 1 and sigma > 0 and num_series >= 1 and length >= 1):
        raise ValueError(f"need 0 < phi < 1, sigma > 0 and positive sizes, got {phi}, {sigma}, {num_series}, {length}")
    noise = torch.randn(num_series, length, generator=generator)
    h = torch.empty(num_series, length)
    h[:, 0] = sigma / math.sqrt(1 - phi * phi) * noise[:, 0]
    for t in range(1, length):  # data generation, once: a loop over time steps only
        h[:, t] = phi * h[:, t - 1] + sigma * noise[:, t]
    y = beta * torch.exp(h / 2) * torch.randn(num_series, length, generator=generator)
    return y, h


def load_sp500_returns(path: str | Path | None = None, standardize: bool = True) -> Tensor:
    """S&P 500 daily log returns of the Close price, oldest first (``[T]``, float32).

    Args:
        path: the ``';'``-separated CSV (newest first, header ``Date;Open;High;Low;Close;...``);
            default the shipped ``data/timeseries/SP500_daily_1950_2012_biips.csv``.
        standardize: subtract the mean and divide by the sd (so ``beta = 1`` in the SV model).

    Example:
        >>> r = load_sp500_returns()
        >>> r.shape[0] > 15000, abs(float(r.mean())) < 1e-4
        (True, True)
    """
    path = Path(path) if path is not None else data_path("timeseries", "SP500_daily_1950_2012_biips.csv")
    lines = path.read_text().strip().splitlines()
    header = lines[0].split(";")
    if "Close" not in header:
        raise ValueError(f"{path} has no Close column (header {header})")
    col = header.index("Close")
    close = torch.tensor([float(line.split(";")[col]) for line in lines[1:]], dtype=torch.float64).flip(0)
    returns = torch.diff(close.log())
    if standardize:
        returns = (returns - returns.mean()) / returns.std()
    return returns.to(torch.float32)


def sv_study_parser(doc: str, out: str, quick_help: str = "CI scale") -> argparse.ArgumentParser:
    """The SV studies' parser: the docstring's first line, then the options they share.

    ``--quick``, ``--seed``, ``--seeds``, ``--threads`` and ``--out``, then the sampler options both studies
    take alike (austerity ``--epsilon``, ``--batch-size`` and ``--growth``; particle Gibbs ``--particles`` and
    ``--block-len``; ``--global-steps``); each study adds its own after them.

    Example:
        >>> vars(sv_study_parser("An SV study.", "experiments/results/demo").parse_args(["--quick"]))
        {'quick': True, 'seed': 0, 'seeds': None, 'threads': 1, 'out': 'experiments/results/demo', \
'epsilon': 0.05, 'batch_size': None, 'growth': 2.0, 'particles': None, 'block_len': 50, 'global_steps': 5}
    """
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=None, help="repetitions (default 2, quick 1)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=out)
    p.add_argument("--epsilon", type=float, default=0.05, help="austerity epsilon")
    p.add_argument("--batch-size", type=int, default=None, help="austerity first mini-batch (default: a trial)")
    p.add_argument("--growth", type=float, default=2.0, help="austerity stage growth factor (1: fixed mini-batches)")
    p.add_argument("--particles", type=int, default=None, help="PG particles (default 50, quick 10)")
    p.add_argument("--block-len", type=int, default=50, help="PG block length")
    p.add_argument("--global-steps", type=int, default=5, help="MH transitions of (phi, sigma2) per sweep")
    return p


def sv_study_config(args: argparse.Namespace) -> dict[str, Any]:
    """Set torch's threads to ``args.threads``; return the head of an SV study's configuration.

    ``quick``, ``seed`` and ``seeds`` (2 repetitions unless given, 1 under ``--quick``).
    """
    torch.set_num_threads(args.threads)
    return {"quick": args.quick, "seed": args.seed, "seeds": args.seeds or (1 if args.quick else 2)}
