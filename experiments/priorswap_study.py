"""Study: post-inference prior swapping against importance sampling and direct MCMC on the target.

Sub-studies (``--only`` picks some), all measured side by side within one run:

* ``oned``: the seed paper's 1-D example. ``x_i ~ N(θ, 1)``, ``n = 10`` observations with mean
  10, false prior ``N(0, 1)``, target prior ``Laplace(10, 1)``: the target posterior sits about
  3 false-posterior sds away, in its tail. Error ``|E[θ] - truth| / sd`` (truth by quadrature)
  against the number ``T`` of false-posterior draws for plain IS and for prior swap (Gaussian fit
  to the ``T`` draws, MH chain; plus the exact swapped mean by quadrature, and the semiparametric
  estimate by quadrature).
* ``linreg``: Bayesian linear regression, synthetic in the shape of YearPredictionMSD
  (``n = 5e5``, ``d = 90``, standard-normal features, 10% non-zero coefficients, noise sd 1).
  False prior ``N(0, I)`` (conjugate: the false posterior is exact in closed form). Target priors
  in units of the false posterior sd ``s0 = 1/sqrt(n)``: ``Laplace(0, 2 s0)``,
  ``StudentT(2, 0, s0)`` and VerySparse (``log π(β) = -Σ_j ((β_j² + ε²)^(q/2)) / s0^q``,
  ``q = 0.2``, ``ε = 0.1 s0``: a generalized-normal prior with a very small power, smoothed at 0).
  Methods: prior swap NUTS with a Gaussian fit to ``T = 2000`` false draws, and that chain
  IS-corrected (semiparametric weights at checkpoints), and elliptical slice sampling on the same
  fit; plain IS on the draws; for the Laplace prior also exact-swap chains (NUTS, independence MH
  and elliptical slice around the exact false posterior's Gaussian as it is and around it refined
  towards p_s, ``reference="fit"``: the timing target takes the fastest; each clock includes the
  kernel's setup, so the refinement's cost too), direct NUTS and direct preconditioned
  random-walk MH on the target with the full data (``O(n d)`` per gradient), capped in wall time
  (a capped direct run with no draws counts its whole time in the speed-up's lower bound).
  Error: RMS over coordinates of ``|running mean - reference|`` in reference sds; the reference
  is an independent exact prior-swap NUTS run (exact because the conjugate false posterior is
  exact; its own Monte Carlo error is part of every error). Time per iteration of prior swap at
  ``n = 5e3`` and ``n = 5e5`` is measured in interleaved rounds.
* ``kidiq``: posteriordb ``kidiq-kidscore_momiq`` (``n = 434``). The reference draws (flat prior on
  β, half-Cauchy(2.5) on σ) are the false posterior; targets put Laplace(0, 1), StudentT(3, 0, 1)
  or VerySparse (q = 0.2, scale 1) priors on β. Prior swap MH (Gaussian fit on ``(β, log σ)``, and
  semiparametric), IS, and direct full-data MH against a longer direct MH reference (every MH is
  preconditioned by the false draws' covariance; σ is compared on its own scale).
* ``phishing``: logistic regression on ``coresets_data/phishing.npz`` (``n = 500``, ``d = 11``).
  False prior ``N(0, 5² I)``, false posterior by NUTS. Target: hierarchical
  ``θ_j ~ N(0, τ²)``, ``τ ~ HalfCauchy(1)`` on the 10 feature weights (intercept keeps
  ``N(0, 5²)``), with ``τ`` **integrated** numerically (trapezoid rule on ``log τ``, 200 nodes).
  Prior swap NUTS (Gaussian fit), IS and direct NUTS on ``(θ, log τ)`` against a longer direct
  NUTS reference.
* ``gmm``: a 2-D Gaussian mixture (K = 3, unit covariances, two clusters overlapping). False
  posterior of the means from collapsed Gibbs under a conjugate ``N(0, 3² I)`` prior on the means
  (weights and means integrated out, means drawn given the labels each sweep, labels ordered by
  the first coordinate). Target: a repulsive prior ``Π N(μ_k; 0, 3² I) Π_{k<l}
  (1 - exp(-|μ_k - μ_l|² / 2))``. Reports the minimum inter-mean distance and the repulsion
  log-term under the false and swapped posteriors.

Timing, on wall time (``"wall"``, ``time.perf_counter``): every chain runs through the run harness
(:func:`neuralblock.diagnostics.runs.timed_run`), and its times count from before its kernel's setup
(``TimedRun.total_times``: setup and warmup included); one-off work (a prior-swap kernel's fit, importance
weights, a reference, a collapsed Gibbs run, each sub-study) is timed with
:func:`~neuralblock.diagnostics.runs.timed_call`, and a fit's time is added to its chain's times.
``time_to_0.05`` is the time from which the running error stays at or below 0.05 for good
(``first_time(..., for_good=True)``), not its first dip below.

Outputs (under ``--out``, in a folder named by a hash of the config): ``priorswap_study.json``,
``priorswap_study.md`` and PNG plots.

Usage::

    python -m experiments.priorswap_study --quick   # CI scale (MH everywhere, tiny sizes)
    python -m experiments.priorswap_study           # full run (under 20 min on 1 thread)
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
import zipfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor
from torch.distributions import HalfCauchy, Laplace, MultivariateNormal, Normal, StudentT
from tqdm import tqdm

from experiments.baselines import pyro_nuts_run
from experiments.common import add_run_options, open_study, pyplot, study_parser
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.diagnostics.runs import ErrorTrace, TimedRun, first_time, timed_call, timed_run
from neuralblock.io import data_path
from neuralblock.priorswap import ExactPosterior, PriorSwap, SiteLayout, SwapProblem, importance_swap

plt = pyplot()


STUDIES = ["oned", "linreg", "kidiq", "phishing", "gmm"]
THRESHOLD = 0.05
JIT: dict[str, Any] = {"jit_compile": True, "ignore_jit_warnings": True}  # emptied by --quick (compile time)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--only", nargs="*", default=STUDIES, choices=STUDIES)
    parser.add_argument("--direct-cap", type=float, default=60.0, help="wall-time cap (s) of direct NUTS at n=5e5")
    parser.add_argument("--from-json", default=None, help="rewrite the table and plots of a finished run's JSON")
    add_run_options(parser, "experiments/results/priorswap", "CI scale (MH everywhere, tiny sizes)")
    return parser.parse_args(argv)


# -- shared helpers ------------------------------------------------------------------------
def timed_chain(
    kernel: MCMCKernel, layout: SiteLayout, warmup: int, num_samples: int, cap_s: float = math.inf
) -> tuple[Tensor, Tensor, TimedRun]:
    """Run a kernel through the run harness (wall clock); constrained flat draws ``[S, D]``, seconds ``[S]``, the run.

    The run stops (in warmup too) once setup + warmup + sampling time reaches ``cap_s``.
    """
    run = timed_run(kernel, samples=num_samples, warmup=warmup, cap_seconds=cap_s, keep=layout.flatten_point)
    return chain_draws(run, layout)


def chain_draws(run: TimedRun, layout: SiteLayout) -> tuple[Tensor, Tensor, TimedRun]:
    """A run's constrained flat draws ``[S, D]`` and their times since the run began (setup and warmup included)."""
    if run.draws is None:
        return torch.empty(0, layout.dim), torch.empty(0), run
    theta, _ = layout.to_constrained(run.draws)
    return theta, torch.tensor(run.total_times, dtype=torch.float64), run


def running_error(draws: Tensor, ref_mean: Tensor, ref_sd: Tensor) -> Tensor:
    """RMS over coordinates of the running mean's error in reference sds, ``[S]``."""
    if draws.shape[0] == 0:
        return torch.empty(0)
    counts = torch.arange(1, draws.shape[0] + 1, dtype=torch.float64)[:, None]
    means = draws.double().cumsum(0) / counts
    return (((means - ref_mean.double()) / ref_sd.double()) ** 2).mean(-1).sqrt()


def thin_curve(times: Tensor, errors: Tensor, points: int = 40) -> dict[str, list[float]]:
    """A small (time, error) trace for the JSON record and plots."""
    if errors.numel() == 0:
        return {"seconds": [], "error": []}
    idx = torch.unique(torch.logspace(0, math.log10(errors.numel()), points).long().clamp(1, errors.numel()) - 1)
    return {"seconds": [round(float(t), 4) for t in times[idx]], "error": [round(float(e), 5) for e in errors[idx]]}


def method_row(name: str, times: Tensor, errors: Tensor, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "method": name,
        "iterations": int(errors.numel()),
        "seconds": float(times[-1]) if times.numel() else 0.0,
        "final_error": float(errors[-1]) if errors.numel() else None,
        "time_to_0.05": first_time(ErrorTrace(times.tolist(), errors.tolist()), THRESHOLD, for_good=True)
        if errors.numel()
        else None,
        "curve": thin_curve(times, errors),
        **dict(extra or {}),
    }


class GeneralizedNormalPrior:
    """VerySparse prior: ``log π(x) = -Σ ((x² + ε²)^(q/2)) / s^q`` over a site (user-code log density)."""

    def __init__(self, site: str, power: float, scale: float, smooth: float, index: slice | None = None) -> None:
        self.site, self.power, self.scale, self.smooth, self.index = site, power, scale, smooth, index

    def __call__(self, values: Mapping[str, Tensor]) -> Tensor:
        x = values[self.site]
        x = x.reshape(x.shape[0], -1)
        if self.index is not None:
            x = x[:, self.index]
        return -((x**2 + self.smooth**2) ** (self.power / 2)).sum(-1) / self.scale**self.power


class SumPrior:
    """Sum of per-site log densities (callables or distributions) as one callable prior."""

    def __init__(self, parts: Mapping[str, Any], support: Mapping[str, Any] | None = None) -> None:
        self.parts = dict(parts)
        if support:
            self.support = dict(support)

    def __call__(self, values: Mapping[str, Tensor]) -> Tensor:
        total = 0.0
        for site, part in self.parts.items():
            if callable(part) and not isinstance(part, torch.distributions.Distribution):
                total = total + part(values)
            else:
                lp = part.log_prob(values[site])
                total = total + lp.reshape(lp.shape[0], -1).sum(-1)
        return torch.as_tensor(total)


class Potential:
    """Picklable potential ``-(log lik(θ) + log prior(θ))`` on one unconstrained flat site."""

    def __init__(self, site: str, log_joint: Callable[[Tensor], Tensor]) -> None:
        self.site, self.log_joint = site, log_joint

    def __call__(self, params: Mapping[str, Tensor]) -> Tensor:
        return -self.log_joint(params[self.site])


def direct_nuts(
    site: str,
    log_joint: Callable[[Tensor], Tensor],
    init: Tensor,
    warmup: int,
    samples: int,
    cap: float,
    **kw: Any,
) -> tuple[Tensor, Tensor, TimedRun]:
    """Pyro NUTS on the full-data potential (:func:`experiments.baselines.pyro_nuts_run`, wall clock)."""
    potential = Potential(site, log_joint)
    run = pyro_nuts_run(
        None, (), site, warmup, samples, cap=cap, initial_params={site: init.clone()}, potential_fn=potential, **kw
    )
    return chain_draws(run, SiteLayout({site: init.shape}))


def quiet_is(*args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return importance_swap(*args, **kwargs)


def rms_sd_error(mean: Tensor, ref_mean: Tensor, ref_sd: Tensor) -> float:
    """RMS over coordinates of ``|mean - reference mean|`` in reference sds."""
    return float((((mean - ref_mean) / ref_sd) ** 2).mean().sqrt())


def _is_mean(samples: Mapping[str, Tensor] | Tensor, false_prior: Any, target: Any) -> tuple[Any, Tensor]:
    res = quiet_is(samples, false_prior, target)
    flat = torch.cat([v.reshape(v.shape[0], -1) for v in res.samples.values()], -1)
    return res, (res.weights[:, None] * flat).sum(0)


def is_row(
    samples: Mapping[str, Tensor] | Tensor, false_prior: Any, target: Any, ref_mean: Tensor, ref_sd: Tensor
) -> dict[str, Any]:
    """Plain importance sampling on the false draws, timed: the weighted mean's error (all sites, flat)."""
    (res, mean), seconds = timed_call(_is_mean, samples, false_prior, target)
    err = rms_sd_error(mean, ref_mean, ref_sd)
    return {
        "method": "IS (false draws)",
        "iterations": int(res.weights.shape[0]),
        "seconds": seconds,
        "final_error": err,
        "time_to_0.05": None if err > THRESHOLD else seconds,
        "final_ess": res.ess,
    }


# -- 1-D example ---------------------------------------------------------------------------
def study_oned(args: argparse.Namespace) -> dict[str, Any]:
    n, xbar = 10, 10.0
    post_prec = 1.0 + n
    false_post = Normal(n * xbar / post_prec, post_prec**-0.5)
    false_prior, target = Normal(0.0, 1.0), Laplace(10.0, 1.0)
    grid = torch.linspace(0.0, 20.0, 200001, dtype=torch.float64)
    log_t = Normal(xbar, n**-0.5).log_prob(grid) + Laplace(10.0, 1.0).log_prob(grid)
    w = (log_t - log_t.logsumexp(0)).exp()
    truth = float((w * grid).sum())
    sd = float((w * (grid - truth) ** 2).sum().sqrt())
    grid32 = grid.float()[::10, None]

    def quad_mean(problem: SwapProblem) -> float:
        lp = problem.log_density(grid32).double()
        ww = (lp - lp.logsumexp(0)).exp()
        return float((ww * grid32[:, 0].double()).sum())

    ts = [10, 1000] if args.quick else [10, 30, 100, 300, 1000, 3000, 10000, 30000]
    reps = 1 if args.quick else 2
    chain_len = 100 if args.quick else 1000
    rows = []
    for t in tqdm(ts, desc="1-D example", leave=False):
        errs: dict[str, list[float]] = {"is": [], "swap_mh": [], "swap_quad": [], "semi_quad": [], "is_ess": []}
        for _ in range(reps):
            draws = false_post.sample((t,))
            res = quiet_is(draws, false_prior, target)
            errs["is"].append(abs(float(res.mean()["theta"]) - truth) / sd)
            errs["is_ess"].append(res.ess)
            kernel = PriorSwap(draws, false_prior, target, kernel="mh")
            theta, _, _ = timed_chain(kernel, kernel.layout, chain_len // 4, chain_len)
            errs["swap_mh"].append(abs(float(theta.mean()) - truth) / sd)
            errs["swap_quad"].append(abs(quad_mean(kernel.problem) - truth) / sd)
            semi = SwapProblem(draws, false_prior, target, estimator="semiparametric")
            errs["semi_quad"].append(abs(quad_mean(semi) - truth) / sd)
        rows.append({"T": t, **{k: float(np.mean(v)) for k, v in errs.items()}})
    exact = PriorSwap(ExactPosterior(false_post), false_prior, target, kernel="mh")
    theta, _, _ = timed_chain(exact, exact.layout, chain_len // 4, chain_len)
    return {
        "truth_mean": truth,
        "truth_sd": sd,
        "false_mean": float(false_post.mean),
        "false_sd": float(false_post.stddev),
        "rows": rows,
        "exact_swap_mh_error": abs(float(theta.mean()) - truth) / sd,
        "chain_length": chain_len,
        "reps": reps,
    }


# -- linear regression ---------------------------------------------------------------------
def make_regression(n: int, d: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    x = torch.randn(n, d, generator=gen)
    beta = torch.zeros(d)
    k = max(1, d // 10)
    beta[:k] = torch.randn(k, generator=gen)
    y = x @ beta + torch.randn(n, generator=gen)
    return x, y, beta


def sufficient_statistics(x: Tensor, y: Tensor, chunk: int = 50000) -> tuple[Tensor, Tensor]:
    """``(X^T X, X^T y)`` in float64, by chunks."""
    d = x.shape[1]
    xtx = torch.zeros(d, d, dtype=torch.float64)
    xty = torch.zeros(d, dtype=torch.float64)
    for s in range(0, x.shape[0], chunk):
        xc = x[s : s + chunk].double()
        xtx += xc.T @ xc
        xty += xc.T @ y[s : s + chunk].double()
    return xtx, xty


def bayesian_lasso_gibbs(xtx: Tensor, xty: Tensor, scale: float, sweeps: int, seed: int) -> Tensor:
    """Exact Gibbs sampler (Park and Casella, 2008) for unit-noise regression with Laplace(0, scale) priors.

    ``β | τ ~ N(A^-1 X^T y, A^-1)``, ``A = X^T X + diag(1/τ²)``; ``1/τ_j² | β_j ~ InvGauss(λ/|β_j|, λ²)``
    with ``λ = 1/scale``. Uses only the sufficient statistics (``O(d^3)`` per sweep): an independent
    reference for the Laplace target. Returns draws ``[sweeps, d]``.
    """
    rng = np.random.default_rng(seed)
    d = xtx.shape[0]
    lam = 1.0 / scale
    inv_tau2 = np.full(d, lam**2)
    a_base, b = xtx.numpy(), xty.numpy()
    out = np.empty((sweeps, d))
    for s in range(sweeps):
        chol = np.linalg.cholesky(a_base + np.diag(inv_tau2))
        mean = np.linalg.solve(chol.T, np.linalg.solve(chol, b))
        beta = mean + np.linalg.solve(chol.T, rng.standard_normal(d))
        inv_tau2 = rng.wald(lam / np.maximum(np.abs(beta), 1e-300), lam**2)
        out[s] = beta
    return torch.tensor(out, dtype=torch.float32)


def conjugate_posterior(x: Tensor, y: Tensor) -> MultivariateNormal:
    """Exact posterior of β under the N(0, I) prior with unit noise."""
    xtx, xty = sufficient_statistics(x, y)
    d = x.shape[1]
    prec = xtx + torch.eye(d, dtype=torch.float64)
    chol = torch.linalg.cholesky(prec)
    mean = torch.cholesky_solve(xty[:, None], chol)[:, 0]
    cov = torch.cholesky_inverse(chol)
    return MultivariateNormal(mean.float(), covariance_matrix=cov.float())


class LinRegLogJoint:
    """Full-data ``log N(y; Xβ, 1) + log π(β)``: ``O(n d)`` per evaluation (the direct baseline)."""

    def __init__(self, x: Tensor, y: Tensor, prior: Callable[[Mapping[str, Tensor]], Tensor]) -> None:
        self.x, self.y, self.prior = x, y, prior

    def __call__(self, beta: Tensor) -> Tensor:
        resid = (self.y - self.x @ beta).double()
        return (-0.5 * (resid * resid).sum()).float() + self.prior({"beta": beta[None]})[0]


def linreg_priors(d: int, s0: float) -> dict[str, Any]:
    return {
        "Laplace": {"beta": Laplace(torch.zeros(d), 2 * s0)},
        "StudentT": {"beta": StudentT(2.0, torch.zeros(d), s0)},
        "VerySparse": GeneralizedNormalPrior("beta", 0.2, s0, 0.1 * s0),
    }


def prior_callable(prior: Any) -> Callable[[Mapping[str, Tensor]], Tensor]:
    return prior if callable(prior) and not isinstance(prior, Mapping) else SumPrior(prior)


def study_linreg(args: argparse.Namespace, gen: torch.Generator) -> dict[str, Any]:
    d = 4 if args.quick else 90
    n_small, n_large = (500, 5000) if args.quick else (5000, 500000)
    num_false = 100 if args.quick else 2000
    warm, samples = (30, 100) if args.quick else (100, 1000)
    ref_samples = (
        {"Laplace": 200, "StudentT": 100, "VerySparse": 100}
        if args.quick
        else {"Laplace": 500, "StudentT": 300, "VerySparse": 300}
    )
    cap = 2.0 if args.quick else 35.0
    direct_cap = 2.0 if args.quick else args.direct_cap
    out: dict[str, Any] = {"d": d, "n_small": n_small, "n_large": n_large, "T_false": num_false}

    data = {}
    for n in (n_small, n_large):
        x, y, beta = make_regression(n, d, gen)
        data[n] = (x, y, *timed_call(conjugate_posterior, x, y))
    out["conjugate_seconds"] = {str(n): data[n][3] for n in data}

    # time per iteration of prior swap at the two data sizes, interleaved rounds
    per_iter: dict[str, dict[str, list[float]]] = {"mh": {}} if args.quick else {"mh": {}, "nuts": {}}
    rounds, iters = (1, 40) if args.quick else (2, 200)
    false_prior = {"beta": Normal(torch.zeros(d), 1.0)}
    target0 = linreg_priors(d, n_large**-0.5)["Laplace"]
    for _ in tqdm(range(rounds), desc="linreg per-iteration", leave=False):
        for n in (n_small, n_large):
            for kname, its in (("mh", iters), ("nuts", iters // 5))[: 1 if args.quick else 2]:
                target = linreg_priors(d, n**-0.5)["Laplace"] if n != n_large else target0
                k = PriorSwap(
                    ExactPosterior(data[n][2]),
                    false_prior,
                    target,
                    kernel=kname,
                    site_shapes={"beta": (d,)},
                    kernel_options=JIT if kname == "nuts" else None,
                )
                _, times, _ = timed_chain(k, k.layout, its // 2, its)
                per_iter[kname].setdefault(str(n), []).append(float(times[-1] - times[its // 2 - 1]) / (its // 2))
    out["seconds_per_iteration"] = {k: {n: float(np.median(v)) for n, v in per.items()} for k, per in per_iter.items()}
    out["per_iteration_ratio"] = {
        k: out["seconds_per_iteration"][k][str(n_large)] / out["seconds_per_iteration"][k][str(n_small)]
        for k in per_iter
    }

    x, y, post, _ = data[n_large]
    s0 = n_large**-0.5
    results = {}
    per_it: dict[str, float | None] = {}
    direct_spent = 0.0
    for prior_name, target in tqdm(linreg_priors(d, s0).items(), desc="linreg priors", leave=False):
        exact = ExactPosterior(post)
        ref_draws, ref_seconds = timed_call(
            linreg_reference, args, prior_name, exact, false_prior, target, x, y, warm, ref_samples
        )
        ref_mean, ref_sd = ref_draws.mean(0), ref_draws.std(0)
        false_draws = post.sample((num_false,))
        rows = []
        if prior_name == "Laplace":  # a second, independent exact-swap chain for the timing target
            k = PriorSwap(
                exact, false_prior, target, kernel=args.kernel, site_shapes={"beta": (d,)}, kernel_options=JIT
            )
            th, ts, run = timed_chain(k, k.layout, warm, samples, cap)
            per_it["swap exact"] = run.total_s / run.steps
            rows.append(method_row(f"swap exact ({args.kernel.upper()})", ts, running_error(th, ref_mean, ref_sd)))
            # the same exact swap with the false posterior itself as an independence proposal
            k = PriorSwap(exact, false_prior, target, kernel="independence", site_shapes={"beta": (d,)})
            th, ts, _ = timed_chain(k, k.layout, 20, 20 * samples, cap)
            rows.append(method_row("swap exact (independence MH)", ts, running_error(th, ref_mean, ref_sd)))
            # ... and elliptical slice sampling (no tuning, so no warmup) around the exact false
            # posterior's Gaussian as it is, and around it refined towards p_s (the default)
            for reference, label in (("estimate", ", estimate as reference"), ("fit", "")):
                k = PriorSwap(
                    exact, false_prior, target, kernel="elliptical", site_shapes={"beta": (d,)}, reference=reference
                )
                th, ts, _ = timed_chain(k, k.layout, 0, 20 * samples, cap)
                errors = running_error(th, ref_mean, ref_sd)
                rows.append(method_row(f"swap exact (elliptical slice{label})", ts, errors))
        k, fit_s = timed_call(
            PriorSwap,
            {"beta": false_draws},
            false_prior,
            target,
            kernel=args.kernel,
            correction="is",
            kernel_options=JIT,
        )
        th, ts, _ = timed_chain(k, k.layout, warm, samples, cap)
        rows.append(
            method_row(f"swap parametric ({args.kernel.upper()})", ts + fit_s, running_error(th, ref_mean, ref_sd))
        )
        # IS-corrected: reweight the parametric chain's draws at checkpoints (weights' time added)
        is_rows = []
        for m in [] if th.shape[0] < 10 else torch.unique(torch.logspace(1, math.log10(th.shape[0]), 10).long()):
            res, extra = timed_call(k.importance_weights, {"beta": th[:m]}, warn_fraction=0.0)
            is_rows.append(
                (float(ts[m - 1]) + fit_s + extra, rms_sd_error(res.mean()["beta"], ref_mean, ref_sd), res.ess)
            )
        curve = torch.tensor(is_rows).reshape(-1, 3)
        rows.append(
            method_row(
                "swap parametric + IS correction",
                curve[:, 0].double().cummax(0).values,  # a later estimate is never ready before an earlier one
                curve[:, 1].double(),
                {"final_ess": float(curve[-1, 2]) if curve.numel() else None},
            )
        )
        k, fit_s = timed_call(PriorSwap, {"beta": false_draws}, false_prior, target, kernel="elliptical")
        th, ts, _ = timed_chain(k, k.layout, 0, 20 * samples, cap)
        rows.append(method_row("swap parametric (elliptical slice)", ts + fit_s, running_error(th, ref_mean, ref_sd)))
        rows.append(is_row({"beta": false_draws}, false_prior, target, ref_mean, ref_sd))
        if prior_name == "Laplace":
            log_joint = LinRegLogJoint(x, y, prior_callable(target))
            if args.kernel == "nuts":
                th, ts, run = direct_nuts("beta", log_joint, torch.zeros(d), warm, samples, direct_cap, **JIT)
                per_it["direct NUTS"] = run.total_s / run.steps
                direct_spent = run.total_s  # setup and warmup included: a capped run may have no draws at all
                rows.append(method_row(f"direct NUTS (cap {direct_cap:g} s)", ts, running_error(th, ref_mean, ref_sd)))
            th, ts, _ = direct_mh("beta", log_joint, torch.zeros(d), post.scale_tril, warm, 10**7, direct_cap / 3)
            rows.append(method_row(f"direct MH (cap {direct_cap / 3:g} s)", ts, running_error(th, ref_mean, ref_sd)))
        results[prior_name] = {
            "reference_seconds": ref_seconds,
            "reference": "Bayesian-lasso Gibbs" if prior_name == "Laplace" else "exact prior-swap NUTS",
            "reference_samples": ref_samples[prior_name],
            "shift_of_mean_in_sd": float((((ref_mean - post.mean) / ref_sd) ** 2).mean().sqrt()),
            "methods": rows,
        }
    out["priors"] = results
    lap = results["Laplace"]["methods"]
    swap_times = [r["time_to_0.05"] for r in lap if r["method"].startswith("swap exact") and r["time_to_0.05"]]
    swap_t = min(swap_times, default=None)  # the faster exact-swap kernel
    direct = next(r for r in lap if r["method"].startswith("direct"))
    spent = max(direct["seconds"] or 0.0, direct_spent)
    out["speedup_exact_vs_direct_nuts"] = (
        (direct["time_to_0.05"] / swap_t if direct["time_to_0.05"] is not None else spent / swap_t) if swap_t else None
    )
    out["speedup_is_lower_bound"] = direct["time_to_0.05"] is None
    out["seconds_per_iteration_laplace"] = per_it  # warmup included, same NUTS settings
    a, b = per_it.get("direct NUTS"), per_it.get("swap exact")
    out["per_iteration_speedup_vs_direct_nuts"] = a / b if a and b else None
    return out


def linreg_reference(
    args: argparse.Namespace,
    prior_name: str,
    exact: ExactPosterior,
    false_prior: Mapping[str, Any],
    target: Any,
    x: Tensor,
    y: Tensor,
    warm: int,
    ref_samples: Mapping[str, int],
) -> Tensor:
    """Reference draws of β: exact Gibbs on the sufficient statistics for the Laplace prior (independent and cheap),
    an exact prior-swap chain otherwise."""
    if prior_name == "Laplace":
        sweeps = 300 if args.quick else 8000
        scale = 2 * x.shape[0] ** -0.5
        return bayesian_lasso_gibbs(*sufficient_statistics(x, y), scale, sweeps, args.seed)[sweeps // 10 :]
    shapes = {"beta": (x.shape[1],)}
    kernel = PriorSwap(exact, false_prior, target, kernel=args.kernel, site_shapes=shapes, kernel_options=JIT)
    return timed_chain(kernel, kernel.layout, warm, ref_samples[prior_name])[0]


class DirectMH(MCMCKernel):
    """Random-walk MH on the full-data target, preconditioned like the swap's MH (the direct baseline).

    The step adapts during warmup towards acceptance 0.234 (as :class:`PriorSwap`'s MH shell).
    """

    def __init__(self, site: str, log_joint: Callable[[Tensor], Tensor], init: Tensor, scale_tril: Tensor) -> None:
        self.site, self.log_joint, self.init, self.chol = site, log_joint, init, scale_tril
        self.step = 2.38 / math.sqrt(scale_tril.shape[0])

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self.value = self.init.clone()
        self.log_p = self.log_joint(self.value)
        self.t, self.warmup = 0, warmup_steps

    @property
    def initial_params(self) -> dict[str, Tensor]:
        return {self.site: self.value}

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        prop = self.value + self.step * (self.chol @ torch.randn_like(self.value))
        log_new = self.log_joint(prop)
        accept = bool(torch.rand(()).log() < log_new - self.log_p)
        if accept:
            self.value, self.log_p = prop, log_new
        if self.t < self.warmup:
            self.step *= math.exp((float(accept) - 0.234) / math.sqrt(self.t + 1))
        self.t += 1
        return {self.site: self.value}


def direct_sampler(
    args: argparse.Namespace,
    site: str,
    log_joint: Callable[[Tensor], Tensor],
    init: Tensor,
    chol: Tensor,
    warmup: int,
    samples: int,
    cap: float = math.inf,
) -> tuple[Tensor, Tensor, TimedRun]:
    """Direct full-data sampling: NUTS (JIT) in full runs, preconditioned MH with ``--quick``."""
    if args.kernel == "mh":
        return direct_mh(site, log_joint, init, chol, warmup, samples, cap)
    return direct_nuts(site, log_joint, init, warmup, samples, cap, **JIT)


def direct_mh(
    site: str, log_joint: Callable[[Tensor], Tensor], init: Tensor, chol: Tensor, warmup: int, samples: int, cap: float
) -> tuple[Tensor, Tensor, TimedRun]:
    kernel = DirectMH(site, log_joint, init, chol)
    return timed_chain(kernel, SiteLayout({site: init.shape}), warmup, samples, cap)


# -- kidiq ---------------------------------------------------------------------------------
def load_kidiq() -> tuple[dict[str, Tensor], Tensor, Tensor]:
    folder = data_path("posteriordb", "kidiq-kidscore_momiq")
    with zipfile.ZipFile(folder / "kidiq-kidscore_momiq.draws.json.zip") as z:
        chains = json.loads(z.read(z.namelist()[0]))
    draws = {k: torch.tensor([v for c in chains for v in c[k]], dtype=torch.float32) for k in chains[0]}
    with zipfile.ZipFile(folder / "kidiq.data.json.zip") as z:
        raw = json.loads(z.read(z.namelist()[0]))
    samples = {"beta": torch.stack([draws["beta[1]"], draws["beta[2]"]], -1), "sigma": draws["sigma"]}
    return (
        samples,
        torch.tensor(raw["mom_iq"], dtype=torch.float32),
        torch.tensor(raw["kid_score"], dtype=torch.float32),
    )


class KidiqLogJoint:
    """Full-data log joint of kidiq on ``(β1, β2, log σ)`` with a target prior on β (+ half-Cauchy σ)."""

    def __init__(self, x: Tensor, y: Tensor, beta_prior: Callable[[Mapping[str, Tensor]], Tensor]) -> None:
        self.x, self.y, self.beta_prior = x, y, beta_prior

    def __call__(self, z: Tensor) -> Tensor:
        beta, log_sigma = z[:2], z[2]
        sigma = log_sigma.exp()
        lik = Normal(beta[0] + beta[1] * self.x, sigma).log_prob(self.y).sum()
        return lik + self.beta_prior({"beta": beta[None]})[0] + HalfCauchy(2.5).log_prob(sigma) + log_sigma


def flat_false_prior_beta(values: Mapping[str, Tensor]) -> Tensor:
    """Stan's improper flat prior on β (log density 0)."""
    return values["beta"].new_zeros(values["beta"].shape[0])


def study_kidiq(args: argparse.Namespace) -> dict[str, Any]:
    samples, x, y = load_kidiq()
    if args.quick:
        samples = {k: v[::10] for k, v in samples.items()}
    false_prior = SumPrior(
        {"beta": flat_false_prior_beta, "sigma": HalfCauchy(2.5)}, {"sigma": HalfCauchy(2.5).support}
    )
    priors = {
        "Laplace": {"beta": Laplace(torch.zeros(2), 1.0)},
        "StudentT": {"beta": StudentT(3.0, torch.zeros(2), 1.0)},
        "VerySparse": {"beta": GeneralizedNormalPrior("beta", 0.2, 1.0, 0.01)},
    }
    warm, num, ref_num = (30, 100, 200) if args.quick else (300, 1500, 4000)
    init = torch.tensor([26.0, 0.6, math.log(18.0)])
    z_false = torch.cat([samples["beta"], samples["sigma"].log()[:, None]], -1)
    chol = torch.linalg.cholesky(torch.cov(z_false.T))  # the false posterior's shape preconditions every MH
    results = {}
    for name, beta_prior in tqdm(priors.items(), desc="kidiq", leave=False):
        bp = prior_callable(beta_prior)
        target = SumPrior({"beta": bp, "sigma": HalfCauchy(2.5)}, {"sigma": HalfCauchy(2.5).support})
        log_joint = KidiqLogJoint(x, y, bp)
        ref, _, _ = direct_mh("z", log_joint, init, chol, warm, ref_num, math.inf)
        ref = torch.cat([ref[:, :2], ref[:, 2:].exp()], -1)  # compare σ, not log σ
        ref_mean, ref_sd = ref.mean(0), ref.std(0)
        rows = []
        th, ts, _ = direct_mh("z", log_joint, init, chol, warm, num, math.inf)
        rows.append(
            method_row("direct MH", ts, running_error(torch.cat([th[:, :2], th[:, 2:].exp()], -1), ref_mean, ref_sd))
        )
        for label, estimator in (("swap parametric (MH)", "gaussian"), ("swap semiparametric (MH)", "semiparametric")):
            k, fit = timed_call(PriorSwap, samples, false_prior, target, kernel="mh", estimator=estimator)
            th, ts, _ = timed_chain(k, k.layout, warm, num)
            rows.append(method_row(label, ts + fit, running_error(th, ref_mean, ref_sd)))
        rows.append(is_row(samples, false_prior, target, ref_mean, ref_sd))
        results[name] = {"reference_mean": ref_mean.tolist(), "reference_sd": ref_sd.tolist(), "methods": rows}
    return {"n": int(x.shape[0]), "T_false": int(samples["sigma"].shape[0]), "priors": results}


# -- phishing logistic regression ----------------------------------------------------------
class LogisticLogLik:
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __call__(self, theta: Tensor) -> Tensor:
        return torch.nn.functional.logsigmoid(self.y * (self.x @ theta)).sum(-1)


class IntegratedHierarchicalPrior:
    """``θ_j ~ N(0, τ²)``, ``τ ~ HalfCauchy(1)`` on the feature weights, τ integrated on a log grid."""

    def __init__(self, num_features: int, intercept_sd: float, nodes: int = 200) -> None:
        self.k, self.intercept_sd = num_features, intercept_sd
        u = torch.linspace(-9.0, 4.0, nodes)
        tau = u.exp()
        self.log_tau = u
        self.log_w = HalfCauchy(1.0).log_prob(tau) + u + math.log(float(u[1] - u[0]))  # dτ = τ du

    def __call__(self, values: Mapping[str, Tensor]) -> Tensor:
        theta = values["theta"]
        w = theta[..., : self.k]
        sq = (w**2).sum(-1, keepdim=True)
        tau2 = (2 * self.log_tau).exp()
        lp = -0.5 * sq / tau2 - self.k * self.log_tau - 0.5 * self.k * math.log(2 * math.pi)
        feat = (lp + self.log_w).logsumexp(-1)
        return feat + Normal(0.0, self.intercept_sd).log_prob(theta[..., self.k])


class HierarchicalJoint:
    """Direct target on ``(θ, log τ)`` with the full data (the reference and the direct baseline)."""

    def __init__(self, loglik: LogisticLogLik, k: int, intercept_sd: float) -> None:
        self.loglik, self.k, self.intercept_sd = loglik, k, intercept_sd

    def __call__(self, z: Tensor) -> Tensor:
        theta, log_tau = z[:-1], z[-1]
        tau = log_tau.exp()
        prior = Normal(0.0, tau).log_prob(theta[: self.k]).sum() + Normal(0.0, self.intercept_sd).log_prob(theta[-1])
        return self.loglik(theta) + prior + HalfCauchy(1.0).log_prob(tau) + log_tau


def study_phishing(args: argparse.Namespace) -> dict[str, Any]:
    raw = np.load(data_path("coresets_data", "phishing.npz"))
    x, y = torch.tensor(raw["X"], dtype=torch.float32), torch.tensor(raw["y"], dtype=torch.float32)
    d = x.shape[1]
    loglik = LogisticLogLik(x, y)
    sd_f = 5.0
    false_prior = Normal(torch.zeros(d), sd_f)
    warm, num_false, num, ref_num = (50, 200, 150, 300) if args.quick else (100, 600, 300, 800)
    chol0 = 0.1 * torch.eye(d)
    false_joint = _LogisticFalseJoint(loglik, sd_f)
    false_draws, _, false_run = direct_sampler(args, "theta", false_joint, torch.zeros(d), chol0, warm, num_false)
    target = IntegratedHierarchicalPrior(d - 1, sd_f)
    joint = HierarchicalJoint(loglik, d - 1, sd_f)
    chol = torch.block_diag(torch.linalg.cholesky(torch.cov(false_draws.T)), torch.ones(1))
    ref, _, _ = direct_sampler(args, "z", joint, torch.zeros(d + 1), chol, warm, ref_num)
    ref_mean, ref_sd = ref[:, :d].mean(0), ref[:, :d].std(0)
    rows = []
    th, ts, _ = direct_sampler(args, "z", joint, torch.zeros(d + 1), chol, warm, num)
    rows.append(
        method_row(f"direct {args.kernel.upper()} on (θ, log τ)", ts, running_error(th[:, :d], ref_mean, ref_sd))
    )
    for label, estimator in ((f"swap parametric ({args.kernel.upper()})", "gaussian"),):
        k, fit = timed_call(
            PriorSwap, false_draws, false_prior, target, kernel=args.kernel, estimator=estimator, kernel_options=JIT
        )
        th, ts, _ = timed_chain(k, k.layout, warm, num)
        rows.append(method_row(label, ts + fit, running_error(th, ref_mean, ref_sd)))
    rows.append(is_row(false_draws, false_prior, target, ref_mean, ref_sd))
    return {
        "n": int(x.shape[0]),
        "d": d,
        "false_posterior_seconds": false_run.total_s,
        "T_false": num_false,
        "tau": "integrated (trapezoid on log tau, 200 nodes)",
        "methods": rows,
        "shift_of_mean_in_sd": float((((ref_mean - false_draws.mean(0)) / ref_sd) ** 2).mean().sqrt()),
    }


class _LogisticFalseJoint:
    def __init__(self, loglik: LogisticLogLik, sd: float) -> None:
        self.loglik, self.sd = loglik, sd

    def __call__(self, theta: Tensor) -> Tensor:
        return self.loglik(theta) + Normal(0.0, self.sd).log_prob(theta).sum()


# -- GMM with a repulsive prior ------------------------------------------------------------
def collapsed_gibbs_means(data: Tensor, k: int, prior_sd: float, sweeps: int, seed: int, alpha: float = 1.0) -> Tensor:
    """Collapsed Gibbs for a K-component unit-covariance GMM; returns mean draws ``[sweeps, K, D]``.

    Labels are resampled one point at a time with the means and weights integrated out
    (conjugate normal prior ``N(0, prior_sd² I)``, symmetric Dirichlet(alpha)); after each sweep
    the means are drawn from their conditional given the labels, ordered by first coordinate.
    The per-point loop is the sequential nature of collapsed Gibbs (small n, numpy scalars).
    """
    rng = np.random.default_rng(seed)
    xs = data.double().numpy()
    n, dim = xs.shape
    labels = rng.integers(k, size=n)
    counts = np.bincount(labels, minlength=k).astype(float)
    sums = np.zeros((k, dim))
    np.add.at(sums, labels, xs)
    prec0 = prior_sd**-2
    out = np.empty((sweeps, k, dim))
    log_alpha_counts = np.log
    for s in range(sweeps):
        uniforms = rng.random(n)
        for i in range(n):
            counts[labels[i]] -= 1
            sums[labels[i]] -= xs[i]
            post_prec = prec0 + counts
            var = 1.0 + 1.0 / post_prec
            resid = xs[i] - sums / post_prec[:, None]
            logits = log_alpha_counts(counts + alpha) - 0.5 * dim * np.log(var) - 0.5 * (resid * resid).sum(-1) / var
            probs = np.exp(logits - logits.max())
            z = min(int(np.searchsorted(np.cumsum(probs), uniforms[i] * probs.sum())), k - 1)
            labels[i] = z
            counts[z] += 1
            sums[z] += xs[i]
        post_prec = prec0 + counts
        mu = sums / post_prec[:, None] + rng.standard_normal((k, dim)) / np.sqrt(post_prec)[:, None]
        out[s] = mu[np.argsort(mu[:, 0])]
    return torch.tensor(out, dtype=torch.float32)


class RepulsivePrior:
    """``Π_k N(μ_k; 0, s² I) Π_{k<l} (1 - exp(-|μ_k - μ_l|² / (2 ℓ²)))`` over a ``[K, D]`` site."""

    def __init__(self, prior_sd: float, length: float) -> None:
        self.prior_sd, self.length = prior_sd, length

    def repulsion(self, mu: Tensor) -> Tensor:
        d2 = (mu[..., :, None, :] - mu[..., None, :, :]).pow(2).sum(-1)
        k = mu.shape[-2]
        iu = torch.triu_indices(k, k, 1)
        pair = d2[..., iu[0], iu[1]]
        return torch.log1p(-torch.exp(-pair / (2 * self.length**2)).clamp(max=1 - 1e-12)).sum(-1)

    def __call__(self, values: Mapping[str, Tensor]) -> Tensor:
        mu = values["mu"]
        base = Normal(0.0, self.prior_sd).log_prob(mu).reshape(mu.shape[0], -1).sum(-1)
        return base + self.repulsion(mu)


def min_distance(mu: Tensor) -> Tensor:
    d = (mu[:, :, None, :] - mu[:, None, :, :]).norm(dim=-1)
    d = d + torch.eye(mu.shape[1]) * 1e9
    return d.flatten(1).min(-1).values


def study_gmm(args: argparse.Namespace, gen: torch.Generator) -> dict[str, Any]:
    k, prior_sd = 3, 3.0
    centres = torch.tensor([[-3.0, 0.0], [0.0, 0.0], [0.8, 0.5]])
    per = 15 if args.quick else 50
    data = (centres[:, None, :] + torch.randn(k, per, 2, generator=gen)).reshape(-1, 2)
    sweeps = 600 if args.quick else 800
    mu, gibbs_s = timed_call(collapsed_gibbs_means, data, k, prior_sd, sweeps, args.seed)
    mu = mu[sweeps // 5 :]
    false_prior = {"mu": Normal(torch.zeros(k, 2), prior_sd)}
    repulsive = RepulsivePrior(prior_sd, 1.0)
    # quick: independence MH from the Gaussian estimate (its min-distance mean has about a third of the random
    # walk's Monte Carlo spread at equal draws, so the smoke check is not at the mercy of the chain's seed)
    swap_kernel = "independence" if args.quick else args.kernel
    kernel = PriorSwap({"mu": mu}, false_prior, repulsive, kernel=swap_kernel, kernel_options=JIT)
    th, _, swap_run = timed_chain(kernel, kernel.layout, 200 if args.quick else 150, 2000 if args.quick else 600)
    swapped = th.reshape(-1, k, 2)
    res = quiet_is({"mu": mu}, false_prior, repulsive)
    rows = []
    for label, draws, weights in (
        ("false posterior (collapsed Gibbs)", mu, None),
        (f"prior swap ({swap_kernel})", swapped, None),
        ("IS (false draws)", mu, res.weights),
    ):
        w = torch.full((draws.shape[0],), 1.0 / draws.shape[0]) if weights is None else weights
        md = min_distance(draws)
        rows.append(
            {
                "method": label,
                "draws": int(draws.shape[0]),
                "mean_min_distance": float((w * md).sum()),
                "mean_repulsion_log_term": float((w * repulsive.repulsion(draws)).sum()),
                "ess": float(1.0 / (w**2).sum()),
            }
        )
    return {
        "n": int(data.shape[0]),
        "gibbs_seconds": gibbs_s,
        "swap_seconds": swap_run.total_s,
        "rows": rows,
        "min_distance_false": min_distance(mu)[:: max(1, mu.shape[0] // 300)].tolist(),
        "min_distance_swapped": min_distance(swapped)[:: max(1, swapped.shape[0] // 300)].tolist(),
        "data": data.tolist() if args.quick else data[::2].tolist(),
        "mean_false": mu.mean(0).tolist(),
        "mean_swapped": swapped.mean(0).tolist(),
    }


# -- outputs -------------------------------------------------------------------------------
def methods_section(title: str, methods: list[dict[str, Any]]) -> list[str]:
    """A markdown heading and the methods' table."""
    columns = ["method", "iterations", "seconds", "final_error", "time_to_0.05", "final_ess"]
    return [title, "", markdown_table(methods, columns, ".4g"), ""]


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    write_json(folder / "priorswap_study.json", record)
    lines = ["# Prior-swap study", ""]
    res = record["results"]
    if "oned" in res:
        o = res["oned"]
        lines += [
            "## 1-D example (error of E[θ] in target sds vs number T of false-posterior draws)",
            "",
            f"truth {o['truth_mean']:.3f} ± {o['truth_sd']:.3f}; false posterior {o['false_mean']:.3f} ± "
            f"{o['false_sd']:.3f}; exact-swap MH chain error {o['exact_swap_mh_error']:.3f}",
            "",
            markdown_table(o["rows"], ["T", "is", "is_ess", "swap_mh", "swap_quad", "semi_quad"], ".3g"),
            "",
        ]
    if "linreg" in res:
        lr = res["linreg"]
        lines += [
            f"## Linear regression (n={lr['n_large']}, d={lr['d']})",
            "",
            f"seconds per iteration (n={lr['n_small']} vs n={lr['n_large']}): "
            + ", ".join(
                f"{k}: {v[str(lr['n_small'])]:.4g} vs {v[str(lr['n_large'])]:.4g} "
                f"(ratio {lr['per_iteration_ratio'][k]:.3f})"
                for k, v in lr["seconds_per_iteration"].items()
            ),
            f"speed-up to error {THRESHOLD} sd, exact swap vs direct NUTS (Laplace): "
            f"{'>= ' if lr['speedup_is_lower_bound'] else ''}{lr['speedup_exact_vs_direct_nuts']}; "
            f"seconds per NUTS iteration incl. warmup (Laplace): {lr['seconds_per_iteration_laplace']}, "
            f"ratio direct/swap {lr['per_iteration_speedup_vs_direct_nuts']}",
            "",
        ]
        for prior, p in lr["priors"].items():
            title = f"### {prior} (target mean moved {p['shift_of_mean_in_sd']:.2f} sd from the false posterior)"
            lines += methods_section(title, p["methods"])
    if "kidiq" in res:
        for prior, p in res["kidiq"]["priors"].items():
            lines += methods_section(f"## kidiq, {prior} prior on β", p["methods"])
    if "phishing" in res:
        p = res["phishing"]
        lines += methods_section(f"## Phishing logistic regression, hierarchical prior (τ {p['tau']})", p["methods"])
    if "gmm" in res:
        lines += [
            "## GMM with a repulsive prior on the means",
            "",
            markdown_table(
                res["gmm"]["rows"], ["method", "draws", "mean_min_distance", "mean_repulsion_log_term", "ess"], ".4g"
            ),
            "",
        ]
    (folder / "priorswap_study.md").write_text("\n".join(lines))
    plot_all(folder, res)


def plot_all(folder: Path, res: dict[str, Any]) -> None:
    if "oned" in res:
        o = res["oned"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ts = [r["T"] for r in o["rows"]]
        for key, label in (
            ("is", "IS"),
            ("swap_mh", "prior swap (MH chain)"),
            ("swap_quad", "prior swap (exact p_s mean)"),
            ("semi_quad", "semiparametric swap (exact p_s mean)"),
        ):
            ax.loglog(ts, [max(r[key], 1e-4) for r in o["rows"]], marker="o", label=label)
        ax.set_xlabel("false-posterior draws T")
        ax.set_ylabel("|mean error| / target sd")
        ax.legend(fontsize=7)
        save_figure(fig, folder / "oned_error_vs_T.png", dpi=90)
    panels = []
    if "linreg" in res:
        panels += [(f"linreg {k}", v["methods"]) for k, v in res["linreg"]["priors"].items()]
    if "kidiq" in res:
        panels += [(f"kidiq {k}", v["methods"]) for k, v in res["kidiq"]["priors"].items()]
    if "phishing" in res:
        panels.append(("phishing hierarchical", res["phishing"]["methods"]))
    if panels:
        cols = 3
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, (title, methods) in zip(axes.flat, panels):
            for m in methods:
                curve = m.get("curve")
                if curve and curve["seconds"]:
                    ax.loglog(curve["seconds"], curve["error"], label=m["method"])
                elif m.get("final_error") is not None:
                    ax.scatter([max(m["seconds"], 1e-3)], [m["final_error"]], marker="x", label=m["method"])
            ax.axhline(THRESHOLD, color="grey", ls=":")
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("wall seconds")
            ax.set_ylabel("RMS mean error / sd")
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        save_figure(fig, folder / "error_vs_time.png", dpi=80)
    if "gmm" in res:
        g = res["gmm"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.5))
        a1.hist(g["min_distance_false"], bins=30, alpha=0.6, density=True, label="false (collapsed Gibbs)")
        a1.hist(g["min_distance_swapped"], bins=30, alpha=0.6, density=True, label="repulsive (prior swap)")
        a1.set_xlabel("min inter-mean distance")
        a1.legend(fontsize=7)
        data = np.array(g["data"])
        a2.scatter(data[:, 0], data[:, 1], s=6, c="lightgrey")
        for key, marker, label in (("mean_false", "o", "false"), ("mean_swapped", "^", "swapped")):
            m = np.array(g[key])
            a2.scatter(m[:, 0], m[:, 1], marker=marker, s=60, label=label)
        a2.legend(fontsize=7)
        save_figure(fig, folder / "gmm_repulsive.png", dpi=90)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.from_json:
        path = Path(args.from_json)
        record = json.loads(path.read_text())
        write_outputs(path.parent, record)
        return record
    config, folder = open_study(args, drop={"out", "threads", "from_json", "only"}, only=sorted(args.only))
    args.kernel = "mh" if args.quick else "nuts"
    if args.quick:
        JIT.clear()
    pyro.set_rng_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    studies = {
        "oned": partial(study_oned, args),
        "linreg": partial(study_linreg, args, gen),
        "kidiq": partial(study_kidiq, args),
        "phishing": partial(study_phishing, args),
        "gmm": partial(study_gmm, args, gen),
    }
    results: dict[str, Any] = {}
    timings = {}
    for name in args.only:
        results[name], timings[name] = timed_call(studies[name])
    record = {"config": config, "seconds": timings, "results": results}
    write_outputs(folder, record)
    return record


if __name__ == "__main__":
    main()
