"""NUTS baselines the studies compare against: Pyro NUTS with a time stamp per draw, and NumPyro NUTS.

Each study passes its own clock (``time.perf_counter`` or ``time.process_time``), so its times stay on the
clock its other samplers use.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from pyro.infer import MCMC, NUTS
from torch import Tensor


class _Stop(Exception):
    """Raised by the NUTS hook when the time cap is reached."""


def pyro_nuts(
    model: Callable[..., Any] | None,
    model_args: tuple[Any, ...],
    site: str,
    warmup: int,
    draws: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    cap: float = math.inf,
    initial_params: dict[str, Tensor] | None = None,
    **nuts_options: Any,
) -> tuple[Tensor, Tensor]:
    """Pyro NUTS on ``model``: the post-warmup draws of ``site`` and the time at which each was made.

    Args:
        model, model_args: the Pyro model and its arguments (``None`` and ``()`` with a ``potential_fn``).
        site: the (unconstrained, real-valued) site whose draws are returned.
        warmup, draws: NUTS warmup iterations and post-warmup draws.
        clock: the clock; times are its seconds since the start (kernel setup and warmup counted).
        cap: stop at the first iteration after ``cap`` seconds (fewer draws, maybe none).
        initial_params: unconstrained starting values (required with a ``potential_fn``).
        nuts_options: passed to :class:`pyro.infer.NUTS` (``potential_fn``, ``jit_compile``, ``init_strategy``, ...).

    Returns:
        ``(draws [S, ...], seconds [S])``, the seconds in float64; ``draws`` is empty (shape ``[0]``) when the
        cap came before the first draw.
    """
    samples: list[Tensor] = []
    seconds: list[float] = []
    start = clock()

    def hook(kernel: Any, params: dict[str, Tensor], stage: str, i: int) -> None:
        now = clock() - start
        if stage == "Sample":
            samples.append(params[site].detach().clone())
            seconds.append(now)
        if now > cap:
            raise _Stop

    mcmc = MCMC(
        NUTS(model, **nuts_options),
        num_samples=draws,
        warmup_steps=warmup,
        initial_params=initial_params,
        hook_fn=hook,
        disable_progbar=True,
    )
    with contextlib.suppress(_Stop):
        mcmc.run(*model_args)
    return (torch.stack(samples) if samples else torch.empty(0)), torch.tensor(seconds, dtype=torch.float64)


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


def numpyro_nuts(
    model: Callable[..., Any],
    model_args: tuple[Any, ...],
    site: str,
    warmup: int,
    draws: int,
    seed: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    init_params: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor, float]:
    """NumPyro NUTS (JAX on one CPU thread): warmup, then ``draws`` draws in one compiled call.

    Compilation counts in the time, as a user experiences it; JAX calls cannot be interrupted, so there is
    no time cap. Call :func:`numpyro_available` first.

    Returns:
        ``(draws [S, ...] float64, seconds [S] float64, warmup seconds)``: the draws of ``site``, spread
        evenly over the sampling call's time.
    """
    _jax_on_one_cpu_thread()
    import jax
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS

    jax.config.update("jax_platform_name", "cpu")
    start = clock()
    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=draws, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(seed), *model_args, init_params=init_params)
    warm = clock() - start
    mcmc.run(mcmc.post_warmup_state.rng_key, *model_args)  # one compiled sampling call
    total = clock() - start
    samples = torch.tensor(np.array(mcmc.get_samples()[site]), dtype=torch.float64)
    seconds = warm + (total - warm) * torch.arange(1, draws + 1, dtype=torch.float64) / draws
    return samples, seconds, warm
