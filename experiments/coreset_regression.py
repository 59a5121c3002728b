"""Study: NUTS on Hilbert coresets vs full-data NUTS for logistic and Poisson regression.

Datasets (``data/coresets_data``; non-constant columns standardised, trailing intercept kept): logistic
regression on phishing, ds1, synth_lr and a synthetic ``N = 1e5`` set (``synth_lr_1e5``, generated from
``--seed``), Poisson regression (softplus link) on biketrips_large, airportdelays_large,
synth_poiss_large. Priors ``beta ~ N(0, I)``.

For each dataset, measured side by side in one process (CPU time, the run harness's ``"cpu"`` clock):

* a reference posterior: a long NumPyro NUTS run (``bench`` extra; ``--ref-warmup`` + ``--ref-samples``,
  its Monte Carlo standard error by batch means is recorded) or, without JAX or with ``--quick``, the
  Laplace approximation (the JSON names which);
* full-data Pyro NUTS (``--warmup`` + ``--samples``); every chain starts at a draw of the full-data
  Laplace approximation (``--init laplace``, its CPU time counted in each run; for FW it is ``pi_hat``)
  so that no run spends its warmup walking from ``[-2, 2]`` to an intercept of ~200 (biketrips);
* coresets of size ``M`` for ``--sizes``: uniform subsampling and Frank-Wolfe with fully corrective NNLS
  steps, stopped early at relative Hilbert error ``--fw-tol`` (``pi_hat`` = Laplace approximation of the
  posterior, on all data by default (Newton steps, ``O(N D^2)`` each) or on a uniform subsample of
  ``--pi-subsample`` points; ``J = --projection-dim`` Fisher features), then NUTS on the coreset's
  direct-path potential (``weighted_model(model, core).potential_fn``: value and gradient from one replayed
  graph, no Pyro model run per leapfrog step), sampled by :class:`~neuralblock.kernels.DirectNUTS`
  (``--sampler direct``, default: no per-leapfrog framework cost) or Pyro's NUTS (``--sampler pyro``);
  ``--coreset-nuts model`` runs Pyro NUTS on :func:`neuralblock.coresets.weighted_model` itself;
  ``--jit`` compiles every Pyro NUTS potential run
  through a model with the PyTorch JIT, compile time counted; it cuts the per-iteration cost of both arms,
  the full-data one's most (its tensor work), so it raises the coreset/full time ratio and is off by default;
* full-data NUTS on the direct-path potential as well, with the same sampler (``--full-direct``, on by
  default), so the coreset's gain is also shown against full data on the same fast path;
* NumPyro NUTS on the full data and on the FW coreset of the largest size (when JAX is installed);
* the coreset *bias*: a second long NumPyro run on each FW coreset, compared with the reference, with the
  Monte Carlo standard error of the difference, so the coreset's error is separated from the sampler's.

Metrics against the reference: posterior-mean error in posterior sds (RMS over coordinates, and max),
relative covariance error (Frobenius), KL between Gaussians fitted to the two sample sets, the CPU
time (construction included) until the running posterior-mean error stays <= 0.1 posterior sd, and
for FW the relative Hilbert error on the projection it was built with and on an independent one
(fresh ``pi_hat`` draws and coordinates: the honest one, since FW fits its own projection).
A last section times the coreset construction for ``N = 1e4, 1e5, 1e6`` at ``J = 500``.

Outputs (under ``--out``, in a folder named by a hash of the config): ``coreset_regression.json``,
``coreset_regression.md``, ``coreset_regression_error_vs_M.png``, ``coreset_regression_error_vs_time.png``.

Usage::

    python -m experiments.coreset_regression --quick     # CI scale, tens of seconds
    python -m experiments.coreset_regression --jobs 4    # full run (~30 CPU minutes, NumPyro installed)
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_value
from torch import Tensor
from tqdm import tqdm

from experiments import baselines
from experiments.baselines import numpyro_available
from experiments.common import add_choices, add_numbers, add_run_options, add_switches, study_parser
from neuralblock.coresets import (
    Coreset,
    FrankWolfe,
    HilbertCoreset,
    Projector,
    UniformSampling,
    gaussian_kl,
    laplace_samples,
    weighted_model,
)
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json
from neuralblock.diagnostics.runs import ClockName, TimedRun, timed_call, timed_run
from neuralblock.io import data_path
from neuralblock.kernels.nuts import DirectNUTS
from neuralblock.subsample.likelihood import LogLikelihood

LOGISTIC = ["phishing", "ds1", "synth_lr", "synth_lr_1e5"]
POISSON = ["biketrips_large", "airportdelays_large", "synth_poiss_large"]
DEFAULT_ORDER = [
    "synth_lr_1e5",
    "biketrips_large",
    "airportdelays_large",
    "synth_poiss_large",
    "phishing",
    "ds1",
    "synth_lr",
]  # largest first, so parallel jobs finish together
TOLERANCE = 0.1  # posterior-mean error target, in posterior sds
CLOCK: ClockName = "cpu"  # every time in this study: process CPU time, through the run harness


def logistic_model(x: Tensor, y: Tensor) -> None:
    """``beta ~ N(0, I)``, ``y_n ~ Bernoulli(sigmoid(x_n . beta))`` (``y`` in {0, 1})."""
    beta = pyro.sample("beta", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ beta), obs=y[idx])


def poisson_model(x: Tensor, y: Tensor) -> None:
    """``beta ~ N(0, I)``, ``y_n ~ Poisson(softplus(x_n . beta))``."""
    beta = pyro.sample("beta", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Poisson(torch.nn.functional.softplus(x[idx] @ beta)), obs=y[idx])


MODELS: dict[str, Callable[[Tensor, Tensor], None]] = {"logistic": logistic_model, "poisson": poisson_model}


def synthetic_logistic(num: int, dim: int, seed: int) -> tuple[Tensor, Tensor]:
    """``num`` points, ``dim - 1`` standard-normal features plus an intercept, labels from a random ``beta``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(num, dim - 1, generator=gen), torch.ones(num, 1)], dim=1)
    beta = torch.randn(dim, generator=gen)
    return x, torch.bernoulli(torch.sigmoid(x @ beta), generator=gen)


def load_kind(name: str) -> str:
    """``"logistic"`` or ``"poisson"``."""
    return "logistic" if name in LOGISTIC else "poisson"


def load_dataset(name: str, seed: int) -> tuple[str, Tensor, Tensor]:
    """``(kind, x, y)`` with standardised non-constant columns; logistic labels mapped to {0, 1}."""
    if name == "synth_lr_1e5":
        x, y = synthetic_logistic(100_000, 10, seed)
        return "logistic", x, y
    raw = np.load(data_path("coresets_data", f"{name}.npz"))
    x = torch.as_tensor(raw["X"], dtype=torch.float32)
    y = torch.as_tensor(raw["y"], dtype=torch.float32)
    sd = x.std(0)
    varying = sd > 0
    x[:, varying] = (x[:, varying] - x[:, varying].mean(0)) / sd[varying]
    kind = load_kind(name)
    if kind == "logistic":
        y = (y > 0).float()
    return kind, x, y


def start_point(kind: str, x: Tensor, y: Tensor, args: argparse.Namespace) -> Tensor | None:
    """Where every chain starts: one draw of the full-data Laplace approximation (``--init laplace``), or
    ``None`` (Pyro's / NumPyro's default uniform draw in [-2, 2], ``--init uniform``). Callers time it."""
    if args.init == "uniform":
        return None
    return laplace_samples(MODELS[kind], 1, model_args=(x, y))["beta"][0].detach()


def pyro_nuts(
    model: Callable[..., Any],
    args: tuple[Tensor, ...],
    warmup: int,
    samples: int,
    init: Tensor | None = None,
    jit: bool = False,
) -> dict[str, Any]:
    """Pyro NUTS from ``init`` (default: Pyro's): draws ``[S, D]`` and the CPU seconds at which each was made.

    With ``jit`` the potential is compiled with the PyTorch JIT (``jit_compile=True``); the tracing and
    compilation happen inside the timed run.
    """
    options: dict[str, Any] = {"jit_compile": True, "ignore_jit_warnings": True} if jit else {}
    if init is not None:
        options["init_strategy"] = init_to_value(values={"beta": init})
    return _draws_and_times(baselines.pyro_nuts_run(model, args, "beta", warmup, samples, clock=CLOCK, **options))


def _draws_and_times(run: TimedRun, offset: float = 0.0) -> dict[str, Any]:
    """A timed run's draws (float64) and the seconds since its start (plus ``offset``) at each."""
    draws = run.draws if run.draws is not None else torch.empty(0)
    return {"draws": draws.double(), "seconds": torch.tensor(run.total_times, dtype=torch.float64) + offset}


def direct_nuts(
    model: Callable[..., Any],
    core: Coreset | None,
    args: tuple[Tensor, ...],
    warmup: int,
    samples: int,
    init: Tensor,
    sampler: str = "direct",
) -> dict[str, Any]:
    """NUTS on the direct-path potential of the model (weighted by ``core``, or on all data).

    The potential's value and gradient are one replayed graph (``LogLikelihood.potential_fn``), so a
    leapfrog step makes no Pyro model run; tracing and checking that graph is inside the timed run.
    ``sampler`` is ``"direct"`` (:class:`~neuralblock.kernels.DirectNUTS`, no per-step framework cost)
    or ``"pyro"`` (:class:`pyro.infer.NUTS` on the same potential).
    """
    if core is None:
        potential, setup = timed_call(lambda: LogLikelihood(model, *args).potential_fn(), clock=CLOCK)
    else:
        potential, setup = timed_call(lambda: weighted_model(model, core).potential_fn(*args), clock=CLOCK)
    if sampler == "direct":
        kernel = DirectNUTS(potential_fn=potential, initial_params={"beta": init})
        run = timed_run(kernel, samples=samples, warmup=warmup, clock=CLOCK, keep=lambda params: params["beta"])
    else:
        run = baselines.pyro_nuts_run(
            None, (), "beta", warmup, samples, clock=CLOCK, potential_fn=potential, initial_params={"beta": init}
        )
    return _draws_and_times(run, offset=setup)


def numpyro_nuts(
    kind: str,
    x: Tensor,
    y: Tensor,
    weights: Tensor | None,
    warmup: int,
    samples: int,
    seed: int,
    init: Tensor | None = None,
) -> dict[str, Any]:
    """NumPyro NUTS (JAX on CPU) on the (weighted) likelihood; compile time included, draw times interpolated."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist

    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    wj = jnp.ones(len(y)) if weights is None else jnp.asarray(weights.float().numpy())

    def model(xj: Any, yj: Any, wj: Any) -> None:
        beta = numpyro.sample("beta", ndist.Normal(jnp.zeros(xj.shape[1]), 1.0).to_event(1))
        eta = xj @ beta
        if kind == "logistic":
            ll = ndist.Bernoulli(logits=eta).log_prob(yj)
        else:
            ll = ndist.Poisson(jax.nn.softplus(eta)).log_prob(yj)
        numpyro.factor("loglik", jnp.sum(wj * ll))

    init_params = None if init is None else {"beta": jnp.asarray(init.float().numpy())}
    return _draws_and_times(
        baselines.numpyro_nuts_run(
            model, (xj, yj, wj), "beta", warmup, samples, seed, clock=CLOCK, init_params=init_params
        )
    )


def long_run(
    kind: str,
    x: Tensor,
    y: Tensor,
    weights: Tensor | None,
    args: argparse.Namespace,
    init: Tensor | None,
    stream: int = 1,
) -> dict[str, Any]:
    """Long NumPyro NUTS run: mean, covariance, sds and the mean's Monte Carlo standard error (batch means).

    ``stream`` offsets the seed: runs whose errors are combined as independent need different streams.
    """
    draws = numpyro_nuts(kind, x, y, weights, args.ref_warmup, args.ref_samples, args.seed + stream, init)["draws"]
    cov = torch.cov(draws.T)
    mcse = batch_means_mcse(draws[None])[1]
    return {"mean": draws.mean(0), "cov": cov, "sd": cov.diagonal().sqrt(), "mcse": mcse}


def reference_posterior(
    kind: str, x: Tensor, y: Tensor, args: argparse.Namespace, init: Tensor | None
) -> dict[str, Any]:
    """Long NumPyro NUTS run (or Laplace): mean, covariance, sds and mean MCSE of the full-data posterior."""
    if args.reference == "numpyro" and numpyro_available():
        ref = long_run(kind, x, y, None, args, init)
        ref["method"] = f"NumPyro NUTS, {args.ref_warmup} warmup + {args.ref_samples} draws"
        return ref
    draws = laplace_samples(MODELS[kind], 20_000, model_args=(x, y))["beta"].double()
    cov = torch.cov(draws.T)
    mcse = torch.zeros(len(cov), dtype=torch.float64)  # the Laplace reference is its own target
    return {"mean": draws.mean(0), "cov": cov, "sd": cov.diagonal().sqrt(), "mcse": mcse, "method": "Laplace"}


def coreset_bias(
    core: Coreset, kind: str, x: Tensor, y: Tensor, ref: dict[str, Any], args: Any, init: Tensor | None
) -> dict[str, Any]:
    """Posterior-mean bias of a coreset (long NumPyro run on it vs the reference), in reference sds, with MCSE.

    ``bias_rms_sd`` is the RMS over coordinates of ``|mean_coreset - mean_ref| / sd``; its Monte Carlo
    noise floor ``bias_mcse_rms_sd`` is the RMS of the two runs' combined standard errors.
    """
    dense = core.dense(len(y))
    support = dense > 0
    run = long_run(kind, x[support], y[support], dense[support], args, init, stream=2)  # independent of the reference
    z = (run["mean"] - ref["mean"]) / ref["sd"]
    noise = (run["mcse"].pow(2) + ref["mcse"].pow(2)).sqrt() / ref["sd"]
    return {
        "bias_rms_sd": float(z.pow(2).mean().sqrt()),
        "bias_max_sd": float(z.abs().max()),
        "bias_mcse_rms_sd": float(noise.pow(2).mean().sqrt()),
        "bias_sd_ratio_range": [float((run["sd"] / ref["sd"]).min()), float((run["sd"] / ref["sd"]).max())],
    }


def uniform_start(dim: int) -> Tensor:
    """Pyro's default start for a real site: uniform in ``[-2, 2]`` (for potential-function runs)."""
    return torch.rand(dim) * 4 - 2


def score(run: dict[str, Any], ref: dict[str, Any], offset: float = 0.0) -> dict[str, Any]:
    """Errors of a sample set against the reference, and the CPU time to a posterior-mean error <= 0.1 sd."""
    draws, seconds = run["draws"], run["seconds"] + offset
    counts = torch.arange(1, len(draws) + 1, dtype=torch.float64)[:, None]
    running = (draws.cumsum(0) / counts - ref["mean"]) / ref["sd"]
    rms = running.pow(2).mean(1).sqrt()
    above = torch.nonzero(rms > TOLERANCE).squeeze(1)
    first_ok = 0 if len(above) == 0 else int(above[-1]) + 1
    cov = torch.cov(draws.T)
    thin = max(1, len(draws) // 40)
    return {
        "mean_error_rms_sd": float(rms[-1]),
        "mean_error_max_sd": float(running[-1].abs().max()),
        "cov_rel_error": float((cov - ref["cov"]).norm() / ref["cov"].norm()),
        "gaussian_kl": gaussian_kl(draws.mean(0), cov, ref["mean"], ref["cov"]),
        "total_seconds": float(seconds[-1]),
        "seconds_to_tolerance": float(seconds[first_ok]) if first_ok < len(draws) else None,
        "trace_seconds": seconds[::thin].tolist(),
        "trace_rms_sd": rms[::thin].tolist(),
    }


def build_coreset(
    method: str, kind: str, x: Tensor, y: Tensor, size: int, args: argparse.Namespace
) -> tuple[Coreset, HilbertCoreset | None, dict[str, float]]:
    """Uniform subsample, or FW (+NNLS, early stop) on Fisher features with a Laplace ``pi_hat``.

    Also returns the CPU seconds of FW's stages: ``pi_hat``, the projection, and the solver with the
    coreset's bias check.
    """
    if method == "uniform":
        return Coreset.from_dense(UniformSampling().solve(None, len(y), size, None)), None, {}
    solver = FrankWolfe(refine_every=args.refine_every, tol=args.fw_tol, picks=args.fw_picks)
    return fw_construction(MODELS[kind], x, y, size, args.projection_dim, solver, args.pi_subsample)


def fw_construction(
    model: Callable[..., Any], x: Tensor, y: Tensor, size: int, num_samples: int, solver: FrankWolfe, pi_subsample: int
) -> tuple[Coreset, HilbertCoreset, dict[str, float]]:
    """Laplace ``pi_hat`` (on ``pi_subsample`` points, 0: all), Fisher projection and FW solve, each timed.

    Returns the coreset, its construction and the CPU seconds of the stages (``pi_hat_seconds``,
    ``projection_seconds``, ``solve_seconds``: the solver with the coreset's bias check).
    """
    pi_hat, pi_seconds = timed_call(
        laplace_samples, model, num_samples, model_args=(x, y), subsample_size=pi_subsample or None, clock=CLOCK
    )

    def project() -> HilbertCoreset:
        hilbert = HilbertCoreset(Projector.from_model(model, pi_hat, norm="fisher", model_args=(x, y)), solver)
        hilbert.features  # noqa: B018 - computes the projection here, to time it apart
        return hilbert

    hilbert, projection_seconds = timed_call(project, clock=CLOCK)
    core, solve_seconds = timed_call(hilbert.build, size, clock=CLOCK)
    stages = {"pi_hat_seconds": pi_seconds, "projection_seconds": projection_seconds, "solve_seconds": solve_seconds}
    return core, hilbert, stages


def coreset_and_start(
    method: str, kind: str, x: Tensor, y: Tensor, size: int, args: argparse.Namespace
) -> tuple[Coreset, HilbertCoreset | None, dict[str, float], Tensor | None]:
    """:func:`build_coreset` and the coreset chain's start (a ``pi_hat`` draw for FW with Laplace starts)."""
    core, hilbert, stages = build_coreset(method, kind, x, y, size, args)
    if hilbert is not None and args.init == "laplace":  # FW has Laplace draws already: pi_hat
        return core, hilbert, stages, hilbert.projector.samples[0].reshape(x.shape[1])
    return core, hilbert, stages, start_point(kind, x, y, args)


def hilbert_errors(hilbert: HilbertCoreset, kind: str, x: Tensor, y: Tensor, args: argparse.Namespace) -> dict:
    """Relative Hilbert error on the construction's own projection and on an independent one."""
    own = hilbert.error() / float(hilbert.features.sum(0, dtype=torch.float64).norm())
    model = MODELS[kind]
    pi_hat = laplace_samples(model, args.projection_dim, model_args=(x, y), subsample_size=args.pi_subsample or None)
    fresh = Projector.from_model(model, pi_hat, norm="fisher", model_args=(x, y))
    total = fresh.total()
    return {"rel_error": own, "heldout_rel_error": fresh.error(hilbert.coreset(), total) / float(total.norm())}


def warm_up(kind: str) -> None:
    """Pay the one-time costs (forward-mode AD decompositions, lazy imports) outside every timed section."""
    x, y = synthetic_logistic(20, 3, 0)
    Projector.from_model(MODELS[kind], {"beta": torch.zeros(2, 3)}, model_args=(x, y)).project()
    laplace_samples(MODELS[kind], 1, model_args=(x, y))


def run_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Reference, full-data NUTS, coresets + NUTS (Pyro, and NumPyro if available) for one dataset.

    Every torch arm is timed before any JAX run (the NumPyro timings, the reference and the coreset-bias
    runs): the first large torch allocations after a JAX run in the same process were measured 2.5x slower
    (the projection: 0.62 against 0.25 CPU s), a cost no user who builds a coreset without JAX pays.
    """
    warm_up(load_kind(name))
    pyro.set_rng_seed(args.seed)
    kind, x, y = load_dataset(name, args.seed)
    model = MODELS[kind]
    init, init_seconds = timed_call(start_point, kind, x, y, args, clock=CLOCK)  # the full-data runs pay for it
    out: dict[str, Any] = {"kind": kind, "num_data": len(y), "dim": x.shape[1]}
    out["init_seconds"] = init_seconds
    runs = {"full_pyro": (pyro_nuts(model, (x, y), args.warmup, args.samples, init, args.jit), init_seconds)}
    if args.full_direct:
        direct_init = init if init is not None else uniform_start(x.shape[1])
        full_direct = direct_nuts(model, None, (x, y), args.warmup, args.samples, direct_init, args.sampler)
        runs["full_direct"] = (full_direct, init_seconds)
    sizes = [m for m in args.sizes if m < len(y)]
    out["sizes"] = sizes
    built: dict[int, tuple[Coreset, float, Tensor | None]] = {}
    rows: dict[str, list[tuple[dict[str, Any], dict[str, Any], HilbertCoreset | None]]] = {}
    for method in ("uniform", "fw"):
        rows[method] = []
        for size in sizes:
            (core, hilbert, stages, core_init), build_seconds = timed_call(
                coreset_and_start, method, kind, x, y, size, args, clock=CLOCK
            )
            built[size] = (core, build_seconds, core_init)  # the FW ones (built last) are re-used for NumPyro
            if args.coreset_nuts == "potential":
                direct_start = core_init if core_init is not None else uniform_start(x.shape[1])
                run = direct_nuts(model, core, (x, y), args.warmup, args.samples, direct_start, args.sampler)
            else:
                run = pyro_nuts(weighted_model(model, core), (x, y), args.warmup, args.samples, core_init, args.jit)
            row = {"size": size, "support": len(core.indices), "build_seconds": build_seconds, **stages}
            if hilbert is not None:  # untimed diagnostics of the FW coreset
                row.update(hilbert_errors(hilbert, kind, x, y, args))
            rows[method].append((row, run, hilbert))
    jax_runs: dict[str, Any] = {}
    if sizes and args.numpyro and numpyro_available():
        size = sizes[-1]
        core, build_seconds, core_init = built[size]
        dense = core.dense(len(y))
        support = dense > 0
        jax_runs = {
            "size": size,
            "full": numpyro_nuts(kind, x, y, None, args.warmup, args.samples, args.seed, init),
            "coreset": numpyro_nuts(
                kind, x[support], y[support], dense[support], args.warmup, args.samples, args.seed, core_init
            ),
            "build_seconds": build_seconds,
        }
    ref = reference_posterior(kind, x, y, args, init)
    out["reference"] = ref["method"]
    out["reference_mcse_rms_sd"] = float((ref["mcse"] / ref["sd"]).pow(2).mean().sqrt())
    for arm, (run, offset) in runs.items():
        out[arm] = score(run, ref, offset=offset)
    out["coresets"] = {}
    for method, method_rows in rows.items():
        for row, run, hilbert in method_rows:
            row.update(score(run, ref, offset=row["build_seconds"]))
            if hilbert is not None and args.reference == "numpyro" and numpyro_available():
                core, _, core_init = built[row["size"]]
                row.update(coreset_bias(core, kind, x, y, ref, args, core_init))
        out["coresets"][method] = [row for row, _, _ in method_rows]
    if jax_runs:
        build_seconds = jax_runs["build_seconds"]
        out["numpyro"] = {
            "size": jax_runs["size"],
            "full": score(jax_runs["full"], ref, offset=init_seconds),
            "coreset": {"build_seconds": build_seconds, **score(jax_runs["coreset"], ref, build_seconds)},
        }
    return out


def time_ratio(coreset: dict[str, Any], full: dict[str, Any]) -> float | None:
    """Coreset CPU time to the tolerance over the full run's (``None`` if either never reaches it)."""
    if coreset["seconds_to_tolerance"] is None or full["seconds_to_tolerance"] is None:
        return None
    return coreset["seconds_to_tolerance"] / full["seconds_to_tolerance"]


def ratio_bound(coreset: dict[str, Any], full: dict[str, Any]) -> float | None:
    """Where only the coreset run reaches the tolerance, its time over the full run's whole time: the full
    run would need longer than that, so the time ratio lies below this bound (``None`` otherwise)."""
    if coreset["seconds_to_tolerance"] is None or full["seconds_to_tolerance"] is not None:
        return None
    return coreset["seconds_to_tolerance"] / full["total_seconds"]


def ratio_cell(coreset: dict[str, Any], full: dict[str, Any]) -> float | str | None:
    """The time ratio, or ``"< bound"`` where only the coreset run reached the tolerance."""
    bound = ratio_bound(coreset, full)
    return time_ratio(coreset, full) if bound is None else f"< {bound:.3g}"


def construction_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """CPU seconds of pi_hat + projection + FW for growing N (synthetic logistic, D = 5)."""
    warm_up("logistic")
    rows = []
    for num in args.scaling_sizes:
        x, y = synthetic_logistic(num, 5, args.seed)
        pyro.set_rng_seed(args.seed)
        _, _, stages = fw_construction(
            logistic_model, x, y, args.scaling_coreset, args.scaling_dim, FrankWolfe(), args.pi_subsample
        )
        total = sum(stages.values())
        rows.append(
            {
                "N": num,
                "pi_hat_seconds": stages["pi_hat_seconds"],
                "projection_seconds": stages["projection_seconds"],
                "fw_seconds": stages["solve_seconds"],
                "total_seconds": total,
                "microseconds_per_datum": 1e6 * total / num,
            }
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--datasets", nargs="+", default=DEFAULT_ORDER, choices=LOGISTIC + POISSON)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--scaling-sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--no-numpyro", dest="numpyro", action="store_false", help="skip the NumPyro timings")
    add_numbers(
        parser,
        warmup=100,
        samples=400,
        projection_dim=(200, "J for the regression coresets"),
        pi_subsample=(0, "Laplace pi_hat on this many points (0: all)"),
        refine_every=(1, "FW fully corrective NNLS period"),
        fw_picks=(4, "points joining the FW support per iteration (1: plain FW)"),
        fw_tol=(0.01, "FW stops at this relative Hilbert error"),
        ref_warmup=(500, "warmup of the long NumPyro runs"),
        ref_samples=(4000, "draws of the long NumPyro runs"),
        scaling_dim=(500, "J for the construction-time scaling"),
        scaling_coreset=(20, "M for the construction-time scaling"),
        jobs=(1, "datasets run in this many processes"),
    )
    add_choices(
        parser,
        coreset_nuts=(
            ["potential", "model"],
            "coreset NUTS on the direct-path potential (default) or through the weighted Pyro model",
        ),
        sampler=(
            ["direct", "pyro"],
            "NUTS of the direct-path arms: DirectNUTS (default) or Pyro's NUTS on the same potential",
        ),
        reference=["numpyro", "laplace"],
        init=(
            ["laplace", "uniform"],
            "chains start at a full-data Laplace draw (its CPU time counted in every run) or Pyro's uniform init",
        ),
    )
    add_switches(
        parser,
        full_direct=(True, "also run full-data NUTS on the direct-path potential"),
        jit=(False, "compile every Pyro NUTS potential (full data and coresets alike) with the PyTorch JIT"),
    )
    add_run_options(
        parser, "experiments/results/coreset_regression", "CI scale: synth_lr only, Laplace reference", True
    )
    args = parser.parse_args(argv)
    if args.fw_picks > 1 and args.refine_every != 1:
        parser.error(f"--fw-picks {args.fw_picks} needs --refine-every 1 (fully corrective FW); or pass --fw-picks 1")
    if args.quick:
        args.datasets, args.sizes = ["synth_lr"], [30, 100]
        args.warmup, args.samples, args.projection_dim = 25, 25, 50
        args.reference, args.numpyro, args.jobs = "laplace", False, 1
        args.scaling_sizes, args.scaling_dim, args.scaling_coreset = [1000, 10_000], 50, 10
    return args


ERROR_COLUMNS = [
    "dataset",
    "N",
    "D",
    "M",
    "FW support",
    "ref MCSE (sd)",
    "full NUTS err (sd)",
    "uniform err",
    "FW err",
    "FW bias (sd)",
    "bias MCSE (sd)",
    "FW Hilbert err",
    "FW held-out Hilbert err",
    "FW cov err",
    "FW KL",
]
CORESET_NUTS = {"potential": "on the direct-path potential", "model": "through the weighted Pyro model"}
TIME_COLUMNS = [
    "dataset",
    "full NUTS s",
    "full NUTS s to 0.1",
    "full direct s to 0.1",
    "FW build s",
    "pi_hat s",
    "projection s",
    "FW solve s",
    "FW total s",
    "FW s to 0.1",
    "time ratio (Pyro)",
    "time ratio (direct)",
    "total time ratio (Pyro)",
    "NumPyro full s to 0.1",
    "NumPyro FW s to 0.1",
    "time ratio (NumPyro)",
]


def summary_row(name: str, res: dict[str, Any]) -> dict[str, Any]:
    """One dataset's numbers at the largest coreset size, keyed by the table columns."""
    full = res["full_pyro"]
    row: dict[str, Any] = {
        "dataset": name,
        "N": res["num_data"],
        "D": res["dim"],
        "ref MCSE (sd)": res.get("reference_mcse_rms_sd"),
        "full NUTS err (sd)": full["mean_error_rms_sd"],
        "full NUTS s": full["total_seconds"],
        "full NUTS s to 0.1": full["seconds_to_tolerance"],
        "full direct s to 0.1": res["full_direct"]["seconds_to_tolerance"] if "full_direct" in res else None,
    }
    if not res["sizes"]:
        return row
    m = res["sizes"][-1]
    fw = next(r for r in res["coresets"]["fw"] if r["size"] == m)
    uni = next(r for r in res["coresets"]["uniform"] if r["size"] == m)
    row.update(
        {
            "M": m,
            "FW support": fw["support"],
            "uniform err": uni["mean_error_rms_sd"],
            "FW err": fw["mean_error_rms_sd"],
            "FW bias (sd)": fw.get("bias_rms_sd"),
            "bias MCSE (sd)": fw.get("bias_mcse_rms_sd"),
            "FW Hilbert err": fw.get("rel_error"),
            "FW held-out Hilbert err": fw.get("heldout_rel_error"),
            "FW cov err": fw["cov_rel_error"],
            "FW KL": fw["gaussian_kl"],
            "FW build s": fw["build_seconds"],
            "FW total s": fw["total_seconds"],
            "FW s to 0.1": fw["seconds_to_tolerance"],
            "pi_hat s": fw.get("pi_hat_seconds"),
            "projection s": fw.get("projection_seconds"),
            "FW solve s": fw.get("solve_seconds"),
            "time ratio (Pyro)": ratio_cell(fw, full),
            "time ratio (direct)": ratio_cell(fw, res["full_direct"]) if "full_direct" in res else None,
            "total time ratio (Pyro)": fw["total_seconds"] / full["total_seconds"],
        }
    )
    if "numpyro" in res:
        nfull, ncore = res["numpyro"]["full"], res["numpyro"]["coreset"]
        row["NumPyro full s to 0.1"] = nfull["seconds_to_tolerance"]
        row["NumPyro FW s to 0.1"] = ncore["seconds_to_tolerance"]
        row["time ratio (NumPyro)"] = ratio_cell(ncore, nfull)
    return row


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    results, args = record["datasets"], record["config"]
    rows = [summary_row(name, res) for name, res in results.items()]
    pi_hat = f"Laplace on {args['pi_subsample']} points" if args["pi_subsample"] else "Laplace on all data"
    scaling = record["construction_scaling"]
    references = sorted({res["reference"] for res in results.values()})
    starts = (
        "Every chain (Pyro and NumPyro, full data and coresets) starts at a draw of the full-data Laplace "
        "approximation; its CPU time is counted in every run (for FW it is part of pi_hat, so of the build). "
        if args.get("init", "laplace") == "laplace"
        else "Chains start at Pyro's / NumPyro's default uniform draw in [-2, 2]. "
    )
    direct = args.get("sampler", "pyro") == "direct"
    sampler = (
        "`DirectNUTS` (as is the full-data direct arm; the `Pyro` arm is Pyro's NUTS)" if direct else "Pyro's NUTS"
    )
    text = [
        "# Coreset regression: NUTS on coresets vs full-data NUTS",
        "",
        f"NUTS {args['warmup']} warmup + {args['samples']} draws for every timed run"
        + (" (potential compiled by the PyTorch JIT, compile time counted)" if args.get("jit") else "")
        + "; the reference is "
        f"{' / '.join(references)}, whose own posterior-mean Monte Carlo "
        "standard error is `ref MCSE` (batch means, RMS over coordinates, in posterior sds). "
        "`err` = RMS over coordinates of |posterior-mean error| / posterior sd after the timed run: it "
        f"includes the run's Monte Carlo error (about 1/sqrt(ESS) ~ 0.05 sd at {args['samples']} draws) and "
        "the reference's. `FW bias` separates the coreset's own error: the same metric between a second "
        "long NumPyro run on the FW coreset and the reference, with its Monte Carlo noise floor "
        "`bias MCSE`. `Hilbert err` = ||L - L(w)|| / ||L|| on the projection FW was built with; `held-out` "
        "on an independent projection (fresh pi_hat draws and coordinates). `cov err` = relative "
        "Frobenius error; `KL` = KL(fitted Gaussian of coreset draws || reference's).",
        "",
        f"FW = Frank-Wolfe with NNLS steps every {args['refine_every']} iterations "
        f"({args.get('fw_picks', 1)} point(s) joining the support per iteration), stopped at relative "
        f"Hilbert error {args['fw_tol']} or M iterations, J={args['projection_dim']} Fisher features, "
        f"pi_hat = {pi_hat}. {starts}Errors at the largest M:",
        "",
        markdown_table(rows, ERROR_COLUMNS, spec=".3g"),
        "",
        "CPU seconds (construction included for FW). `s to 0.1` = CPU seconds until the running "
        "posterior-mean error stays <= 0.1 sd until the end of the run (empty: never); `time ratio` = FW's "
        "over full data's (`Pyro`: full-data NUTS through the model, as a user runs it; `direct`: full-data "
        "NUTS on the direct-path potential; `< b`: the full-data run never stayed within 0.1 sd, so the ratio is "
        "below b = FW's time over the full run's whole time); `total time ratio` = whole runs (construction "
        "included). Every torch arm runs before any JAX run (the NumPyro timings and references): the first "
        "large torch allocations after JAX in one process were measured 2.5x slower. "
        f"Coreset NUTS runs {CORESET_NUTS[args.get('coreset_nuts', 'model')]}, sampled by {sampler}. "
        "FW build = pi_hat + projection + FW solve (with the coreset's bias check).",
        "",
        markdown_table(rows, TIME_COLUMNS, spec=".3g"),
        "",
        "## Construction time vs N (synthetic logistic regression, D=5, "
        f"J={args['scaling_dim']}, FW M={args['scaling_coreset']})",
        "",
        markdown_table(
            scaling,
            ["N", "pi_hat_seconds", "projection_seconds", "fw_seconds", "total_seconds", "microseconds_per_datum"],
            spec=".3g",
        ),
        "",
    ]
    (folder / "coreset_regression.md").write_text("\n".join(text))
    panels(results, folder / "coreset_regression_error_vs_M.png", "posterior-mean error (sd)", "M", _error_vs_size)
    panels(results, folder / "coreset_regression_error_vs_time.png", "running mean error (sd)", "CPU s", _error_vs_time)


def _error_vs_size(ax: Any, res: dict[str, Any]) -> None:
    for method in ("uniform", "fw"):
        pts = res["coresets"][method]
        ax.plot([p["size"] for p in pts], [p["mean_error_rms_sd"] for p in pts], marker="o", label=method)
    ax.axhline(res["full_pyro"]["mean_error_rms_sd"], color="k", ls="--", label="full NUTS")


def _error_vs_time(ax: Any, res: dict[str, Any]) -> None:
    ax.plot(res["full_pyro"]["trace_seconds"], res["full_pyro"]["trace_rms_sd"], label="full NUTS")
    if "full_direct" in res:
        ax.plot(res["full_direct"]["trace_seconds"], res["full_direct"]["trace_rms_sd"], label="full NUTS, direct")
    for row in res["coresets"]["fw"]:
        ax.plot(row["trace_seconds"], row["trace_rms_sd"], label=f"FW M={row['size']}")
    ax.axhline(TOLERANCE, color="k", ls=":")


def panels(results: dict[str, Any], path: Path, ylabel: str, xlabel: str, draw: Callable[[Any, Any], None]) -> None:
    """One log-log panel per dataset, drawn by ``draw(ax, result)``."""
    fig, axes = plt.subplots(1, len(results), figsize=(3 * len(results), 3), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        draw(ax, res)
        ax.set(xscale="log", yscale="log", title=name, xlabel=xlabel)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def finish(
    folder: Path,
    config: dict[str, Any],
    results: dict[str, Any],
    scaling: list[dict[str, Any]],
    errors: dict[str, str],
) -> dict:
    """Targets + JSON + markdown + plots of what has finished so far (rewritten as results arrive)."""
    headline = results.get("synth_lr_1e5")
    target: dict[str, Any] = {}
    if headline and 500 in headline["sizes"]:
        fw = next(r for r in headline["coresets"]["fw"] if r["size"] == 500)
        ratio = time_ratio(fw, headline["full_pyro"])
        bound = ratio_bound(fw, headline["full_pyro"])
        judged = ratio if bound is None else bound
        target = {
            "dataset": "synth_lr_1e5",
            "size": 500,
            "fw_mean_error_rms_sd": fw["mean_error_rms_sd"],
            "fw_bias_rms_sd": fw.get("bias_rms_sd"),
            "fw_bias_mcse_rms_sd": fw.get("bias_mcse_rms_sd"),
            "time_ratio_pyro": ratio,
            "time_ratio_pyro_below": bound,  # full-data Pyro NUTS never reached the tolerance in its run
            "time_ratio_direct": time_ratio(fw, headline["full_direct"]) if "full_direct" in headline else None,
            "fw_seconds_to_tolerance": fw["seconds_to_tolerance"],
            "full_pyro_seconds_to_tolerance": headline["full_pyro"]["seconds_to_tolerance"],
            "total_time_ratio_pyro": fw["total_seconds"] / headline["full_pyro"]["total_seconds"],
            "met": judged is not None and judged <= 0.2,
        }
    if len(scaling) >= 2:
        per = [row["microseconds_per_datum"] for row in scaling]
        target["scaling_per_datum_spread"] = max(per) / min(per)
    record = {
        "config": config,
        "datasets": {name: results[name] for name in config["datasets"] if name in results},
        "missing": [name for name in config["datasets"] if name not in results],
        "errors": errors,
        "construction_scaling": scaling,
        "target": target,
        "numpyro": numpyro_available(),
    }
    write_json(folder / "coreset_regression.json", record)
    if record["datasets"]:
        write_outputs(folder, record)
    return record


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    config = {k: v for k, v in sorted(vars(args).items()) if k not in {"out", "no_progress"}}
    folder = study_folder(args.out, config)
    results: dict[str, Any] = {}
    scaling: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    if args.jobs > 1:  # datasets in separate processes; each one's timings stay side by side in its process
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            args.jobs, mp_context=ctx, initializer=torch.set_num_threads, initargs=(args.threads,)
        ) as pool:
            jobs = {pool.submit(run_dataset, name, args): name for name in args.datasets}
            jobs[pool.submit(construction_scaling, args)] = "scaling"
            for job in tqdm(as_completed(jobs), total=len(jobs), desc="jobs", disable=args.no_progress):
                try:
                    if jobs[job] == "scaling":
                        scaling = job.result()
                    else:
                        results[jobs[job]] = job.result()
                except Exception as exc:  # keep the other datasets; the failure is named in the JSON
                    errors[jobs[job]] = repr(exc)
                record = finish(folder, config, results, scaling, errors)
    else:
        for name in tqdm(args.datasets, desc="datasets", disable=args.no_progress):
            results[name] = run_dataset(name, args)
        scaling = construction_scaling(args)
        record = finish(folder, config, results, scaling, errors)
    record["folder"] = str(folder)
    return record


if __name__ == "__main__":
    out = main()
    print(Path(out["folder"]) / "coreset_regression.md")
    print(out["target"])
