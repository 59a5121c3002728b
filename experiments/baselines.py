"""NUTS baselines the studies compare against: Pyro NUTS through the run harness, and NumPyro NUTS.

:func:`pyro_nuts_run` and :func:`numpyro_nuts_run` return the harness's
:class:`~neuralblock.diagnostics.runs.TimedRun` on the clock the study names (``"wall"`` or ``"cpu"``), so
their times stay on the clock its other samplers use. :func:`pyro_nuts` and :func:`numpyro_nuts` give the
same runs as tensors of draws and times since the start.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pyro
import torch
from pyro.infer import NUTS
from torch import Tensor

from neuralblock.diagnostics.runs import CLOCKS, ClockName, ErrorTrace, TimedRun, timed_call, timed_run


def _clock_name(clock: Callable[[], float]) -> ClockName:
    """The harness's name of a clock function (``time.perf_counter`` or ``time.process_time``)."""
    for name, read in CLOCKS.items():
        if read is clock:
            return cast(ClockName, name)
    raise ValueError(f"clock must be one of the harness's clocks {list(CLOCKS.values())}, got {clock!r}")


def pyro_nuts_run(
    model: Callable[..., Any] | None,
    model_args: tuple[Any, ...],
    site: str,
    warmup: int,
    draws: int,
    *,
    clock: ClockName = "wall",
    cap: float = math.inf,
    initial_params: dict[str, Tensor] | None = None,
    **nuts_options: Any,
) -> TimedRun:
    """Pyro NUTS on ``model`` through :func:`~neuralblock.diagnostics.runs.timed_run`; ``draws`` holds ``site``.

    Distribution validation is off during the run, as in ``pyro.infer.MCMC``.

    Args:
        model, model_args: the Pyro model and its arguments (``None`` and ``()`` with a ``potential_fn``).
        site: the (unconstrained, real-valued) site whose draws are kept.
        warmup, draws: NUTS warmup iterations and post-warmup draws.
        clock: the harness's clock.
        cap: stop once setup + warmup + sampling time reaches ``cap`` (fewer draws, maybe none).
        initial_params: unconstrained starting values (required with a ``potential_fn``).
        nuts_options: passed to :class:`pyro.infer.NUTS` (``potential_fn``, ``jit_compile``, ``init_strategy``, ...).
    """
    with pyro.validation_enabled(False):
        return timed_run(
            NUTS(model, **nuts_options), samples=draws, warmup=warmup, cap_seconds=cap, clock=clock,
            initial_params=initial_params, model_args=model_args, keep=lambda params: params[site],
        )  # fmt: skip


def pyro_nuts(*args: Any, clock: Callable[[], float] = time.perf_counter, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """:func:`pyro_nuts_run` (same arguments) as tensors: the post-warmup draws of ``site`` and their times.

    ``clock`` is ``time.perf_counter`` or ``time.process_time`` (the harness's ``"wall"`` and ``"cpu"``); the
    times are its seconds since the start (kernel setup and warmup counted, ``TimedRun.total_times``).

    Returns:
        ``(draws [S, ...], seconds [S])``, the seconds in float64; ``draws`` is empty (shape ``[0]``) when the
        cap came before the first draw.
    """
    run = pyro_nuts_run(*args, clock=_clock_name(clock), **kwargs)
    samples = run.draws if run.draws is not None else torch.empty(0)
    return samples, torch.tensor(run.total_times, dtype=torch.float64)


def _jax_on_one_cpu_thread() -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def numpyro_available() -> bool:
    """Whether NumPyro and JAX are installed (JAX is then set to one CPU thread)."""
    _jax_on_one_cpu_thread()
    try:
        import jax  # noqa: F401
        import numpyro  # noqa: F401
    except ImportError:
        return False
    return True


def numpyro_nuts_run(
    model: Callable[..., Any],
    model_args: tuple[Any, ...],
    site: str,
    warmup: int,
    draws: int,
    seed: int,
    *,
    clock: ClockName = "wall",
    init_params: dict[str, Any] | None = None,
) -> TimedRun:
    """NumPyro NUTS (JAX on one CPU thread): warmup, then ``draws`` draws in one compiled call.

    Timed with :func:`~neuralblock.diagnostics.runs.timed_call` on the harness's ``clock``: ``warmup_s`` is the
    warmup call, compilation included (as a user experiences it); the sampling call's time is spread evenly over
    the draws (``times``); ``draws`` holds ``site`` in float64. JAX calls cannot be interrupted, so there is no
    time cap. Call :func:`numpyro_available` first.
    """
    _jax_on_one_cpu_thread()
    import jax
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS

    jax.config.update("jax_platform_name", "cpu")
    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=draws, progress_bar=False)
    _, warm = timed_call(mcmc.warmup, jax.random.PRNGKey(seed), *model_args, init_params=init_params, clock=clock)
    _, sampling = timed_call(mcmc.run, mcmc.post_warmup_state.rng_key, *model_args, clock=clock)  # one compiled call
    samples = torch.tensor(np.array(mcmc.get_samples()[site]), dtype=torch.float64)
    times = (sampling * torch.arange(1, draws + 1, dtype=torch.float64) / draws).tolist()
    return TimedRun(
        clock=clock, setup_s=0.0, warmup_s=warm, sampling_s=sampling, warmup_steps=warmup, samples=draws,
        stopped="samples", times=tuple(times), trace=ErrorTrace((), ()), draws=samples,
    )  # fmt: skip


def numpyro_nuts(
    *args: Any, clock: Callable[[], float] = time.perf_counter, **kwargs: Any
) -> tuple[Tensor, Tensor, float]:
    """:func:`numpyro_nuts_run` (same arguments) as tensors (``clock``: ``time.perf_counter`` or ``time.process_time``).

    Returns:
        ``(draws [S, ...] float64, seconds [S] float64, warmup seconds)``: the seconds since the start.
    """
    run = numpyro_nuts_run(*args, clock=_clock_name(clock), **kwargs)
    return cast(Tensor, run.draws), torch.tensor(run.total_times, dtype=torch.float64), run.warmup_s
