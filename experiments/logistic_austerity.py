"""Study: austerity MH vs exact MH vs NUTS for Bayesian logistic regression (Korattikara et al.'s setting).

Datasets: synthetic (``X ~ N(0, I)``, ``N`` in {1e4, 1e5, 1e6}, ``D = 50``; ``N = 1e6, D = 10``
for the comparison with NUTS; ``N = 1e4, D = 10`` for the bias table); MNIST 7 vs 9 (test set,
pixels PCA-projected to 50 dimensions, plus an intercept; 80/20 train/test split); the logistic
coreset datasets (phishing, ds1, synth_lr, with their own test sets). Prior ``w ~ N(0, I)``.

Samplers, each for the same wall-time budget per dataset, in a random order (one round):

* ``exact MH``: :class:`~neuralblock.kernels.austerity.AusterityMH` with ``epsilon = 0`` on the
  full-data model (``X @ w``; one full-data evaluation per transition, current state cached:
  plain MH);
* ``austerity eps=ε`` for ε in {0.01, 0.05, 0.1, 0.2}: first mini-batch of 100, later stages
  doubling (``batch_growth=2``: a hard decision takes ``O(log N)`` model runs, not ``O(N/m)``), with
  the second-order Taylor control variate around the posterior mode. The model's logits are
  ``(X[idx] * w).sum(-1)``, which broadcast a batch of ``w``, so each stage evaluates ``θ`` and
  ``θ'`` in one model run;
* ``austerity (seed test) eps=0.05``: the same without the control variate;
* ``Pyro NUTS`` on the full data (warmup counted, capped in wall time; skipped on the
  ``N >= 1e5, D = 50`` sets, where it did not finish its warmup within the budget in earlier runs);
* ``NumPyro NUTS`` (JAX on CPU, one thread; optional ``bench`` extra, skipped when absent).

All MH chains use the same Gaussian random walk, scaled to the posterior: the Laplace
covariance times ``2.38/√D`` (no adaptation), and start from the same draw of the Laplace
approximation. The Laplace fit (Newton steps with the full-data gradient and, for ``N > 5e4``, a
subsampled Fisher; the exact Fisher once at the mode; see :func:`laplace_fit`) is shared; the
clocks of the MH chains include it.

Reference: self-normalised importance sampling of the exact posterior with a Laplace proposal
(covariance inflated by ``(1 + 2/D)²``) in antithetic pairs, full likelihood; its importance ESS
and Monte Carlo standard errors (pairs as iid units) are reported. It gives the posterior
mean/sd and the *predictive mean* ``p̄(x*) = E[σ(x*ᵀw)]`` at test points. Risk (as in
Korattikara et al.) is the squared error of a chain's running predictive mean against the
reference's, averaged over the test points, against wall time. Times to reach a level (exact MH's
final risk, a 0.1 sd posterior-mean error) are taken at draw resolution: the first hit
(:func:`~neuralblock.diagnostics.runs.first_time` with ``for_good=False``) of the per-draw error trace.

Timing: every sampler runs through the run harness (:func:`~neuralblock.diagnostics.runs.timed_run`,
``clock="wall"``; NUTS through :mod:`experiments.baselines`). A chain's clock at a draw is its
``TimedRun.total_times``: kernel setup (and NUTS warmup) plus sampling time, plus the Laplace fit
(timed with :func:`~neuralblock.diagnostics.runs.timed_call`) for the MH chains; its budget caps setup
+ sampling time (``cap_seconds``).

Targets checked (``targets`` in the JSON): at ``N = 1e6, ε = 0.05``, mean data fraction
per transition <= 2%, time to reach exact MH's final risk <= 1/10 of exact MH's budget,
time per transition grows <= 3x from ``N = 1e4``; at ``N = 1e6, D = 10``, time to a
posterior-mean error <= 0.1 posterior sd (RMS over coordinates of the running mean's error
in posterior sds), austerity (Laplace fit included) vs Pyro NUTS and NumPyro NUTS (warmup
and compilation included). The bias table runs exact MH and austerity with and without the
control variate at each ε for the same number of transitions of the Laplace independence
proposal (fast mixing, so Monte Carlo error is small), and reports errors of the posterior
mean and sd with the chains' MCSEs.

Usage::

    python -m experiments.logistic_austerity --quick   # CI scale, seconds
    python -m experiments.logistic_austerity           # full run (~18 min on 1 busy core)
"""

from __future__ import annotations

import argparse
import math
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pyro
import torch
from torch import Tensor
from tqdm import tqdm

from experiments import baselines
from experiments.common import add_run_options, add_table, open_study, pyplot, study_parser
from experiments.logistic_models import (
    Dataset,
    LaplaceProposal,
    coreset_dataset,
    laplace_fit,
    logistic_model,
    logistic_model_full,
    mnist_7_vs_9,
    numpyro_logistic_model,
    reference_posterior,
    synthetic,
)
from neuralblock.diagnostics.export import import_arviz
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.diagnostics.runs import ClockName, ErrorTrace, TimedRun, first_time, timed_call, timed_run
from neuralblock.kernels.austerity import AusterityMH

plt = pyplot()


__all__ = ["main", "moment_errors", "run_kernel", "running_metrics"]

EPSILONS = (0.01, 0.05, 0.1, 0.2)
QUICK_EPSILONS = (0.05, 0.2)
EXACT, SEED_TEST, PYRO_NUTS, NUMPYRO_NUTS = "exact MH", "austerity (seed test) eps=0.05", "Pyro NUTS", "NumPyro NUTS"
INDEP_AUSTERITY, INDEP_EXACT = "austerity eps=0.05, Laplace independence", "exact MH, Laplace independence"
CHECKPOINTS = 40
REPLICATED = "austerity eps=0.05"  # the arm of the targets, replicated beside exact MH on the scaling sets
NOTES = [
    "- Austerity arms: first mini-batch of `--batch-size` sections, later stages `--batch-growth` times larger",
    "  (bounds a hard decision to O(log N) model runs); the model's logits `(X[idx] * w).sum(-1)` broadcast a",
    "  batch of `w`, so each stage evaluates θ and θ' in one model run. Exact MH runs the full-data model.",
    "- Every MH clock includes the shared Laplace fit: Newton steps with the full-data gradient and, for",
    "  N > 5e4, the Fisher of a fixed 5e4-row subsample (scaled by N/n; converges to the exact mode), then",
    "  the exact Fisher once at the mode. The control variate needs that exact Hessian: its per-section",
    "  terms use each section's exact Hessian (autograd), and its O(N) sum uses the Hessian passed in, so",
    "  a subsampled Hessian there would bias every decision. `time_fraction_of_exact_excluding_shared_laplace`",
    "  removes the fit from both clocks.",
    "- Timing: the run harness's wall clock (`timed_run`); each run's `timing` records its setup, warmup (NUTS)",
    "  and sampling apart, and a chain's clock at a draw counts all three (plus the Laplace fit for MH chains).",
    "- Times to reach a level (exact MH's final risk; a 0.1 sd posterior-mean error) are first hits of the",
    "  per-draw traces (`first_time(..., for_good=False)`), not of the plotted curves' log-spaced checkpoints.",
    "- NUTS comparison: the austerity time is the faster of the random-walk and the Laplace-independence",
    "  arms (both listed in `seconds_to_0.1_sd`); NUTS times include warmup (and JAX compilation).",
    "- Pyro NUTS is skipped on the N >= 1e5, D = 50 sets: it did not finish its 100 warmup steps within",
    "  their budgets in earlier runs. The bias table runs a fixed number of transitions per arm, not a budget.",
    "- References: antithetic self-normalised importance sampling (see 'Reference accuracy').",
    "- `time_fraction_of_exact_mean_risk`: the same target on the expected risk (mean over `--replicates`",
    "  chains per arm, see the last section); the single-chain fraction above compares one chain with one.",
]
OFFSET = ("austerity", "exact MH")  # samplers whose clock includes the Laplace fit they use
CLOCK: ClockName = "wall"  # the harness's clock of every run and of the Laplace fit
# --quick's sub-second budgets can end a chain after a handful of draws on a loaded machine, and its mean data
# fraction then rests on a few decisions: at N = 20000 about 1 decision in 1000 reads 0.3 of the data (the rest
# one batch, 0.005), so 5 draws with one such decision read 0.067 on average. The floor keeps the mean stable,
# and the exact chain's end point near the reference: unloaded, the quick budgets give 600-1700 draws and a mean
# error of 0.06-0.16 sd, while a loaded clean-clone CI run (floor 100 draws) ended 0.54 sd away at N = 2000.
QUICK_MIN_DRAWS = 400


# -- running samplers ---------------------------------------------------------------------------
def run_kernel(
    kernel: AusterityMH,
    ds: Dataset,
    init: Tensor,
    budget: float,
    transitions: int | None = None,
    min_draws: int = 0,
) -> TimedRun:
    """Run ``kernel`` from ``init`` through the harness until setup + sampling time reaches ``budget`` (and at
    least ``min_draws`` draws are made), or for ``transitions`` draws; the draws of ``w`` are kept."""
    with warnings.catch_warnings():
        # the exact arm's full-data model is not sublinear (said at setup); other warnings are shown
        warnings.filterwarnings("ignore", message=".*not sublinear", category=RuntimeWarning)
        return timed_run(
            kernel, samples=transitions, seconds=None if transitions else budget, cap_seconds=budget,
            min_samples=min_draws, clock=CLOCK, initial_params={"w": init.clone()}, model_args=(ds.X, ds.y),
            keep=lambda params: params["w"],
        )  # fmt: skip


def draws_of(run: TimedRun) -> Tensor:
    """The run's draws of ``w`` ``[S, D]`` in float32 (``[0]`` when it made none)."""
    return run.draws.float() if run.draws is not None else torch.empty(0)


def draw_times(run: TimedRun, offset: float = 0.0) -> Tensor:
    """The study's clock at each draw: the run's ``total_times`` plus ``offset`` (the Laplace fit), float64."""
    return torch.tensor(run.total_times, dtype=torch.float64) + offset


def make_austerity(
    eps: float,
    fit: tuple[Tensor, Tensor, Tensor],
    args: argparse.Namespace,
    control: bool = True,
    proposal: LaplaceProposal | None = None,
) -> AusterityMH:
    """Austerity MH on :func:`logistic_model` with the study's shared settings.

    The random walk is the Laplace covariance times ``2.38/√D`` (no adaptation); ``control``
    adds the second-order Taylor control variate around the mode (Hessian from the fit);
    later test stages grow by ``args.batch_growth``.
    """
    mode, cov, lik_hessian = fit
    return AusterityMH(
        logistic_model, epsilon=eps, batch_size=args.batch_size, step_size=2.38 / math.sqrt(mode.numel()),
        adapt_step_size=False, proposal_scale=cov, proposal=proposal,
        control_variate={"w": mode} if control else None,
        control_variate_hessian=lik_hessian if control else None, batch_growth=args.batch_growth,
    )  # fmt: skip


def make_exact(fit: tuple[Tensor, Tensor, Tensor], proposal: LaplaceProposal | None = None) -> AusterityMH:
    """Exact MH (``epsilon = 0``) on the full-data model, with the same proposals as :func:`make_austerity`."""
    mode, cov, _ = fit
    return AusterityMH(
        logistic_model_full, epsilon=0.0, step_size=2.38 / math.sqrt(mode.numel()), adapt_step_size=False,
        proposal_scale=cov, proposal=proposal, normality_check=False,
    )  # fmt: skip


def run_numpyro_nuts(ds: Dataset, warmup: int, draws: int, seed: int) -> TimedRun | None:
    """:func:`experiments.baselines.numpyro_nuts_run` on the full-data model; ``None`` if NumPyro is not installed."""
    if not baselines.numpyro_available():
        return None
    import jax.numpy as jnp

    data = (jnp.asarray(ds.X.numpy()), jnp.asarray(ds.y.numpy()))
    return baselines.numpyro_nuts_run(numpyro_logistic_model, data, "w", warmup, draws, seed, clock=CLOCK)


# -- metrics -----------------------------------------------------------------------------------
def curves(times: Tensor, metrics: tuple[Tensor, Tensor], end: float) -> dict[str, list]:
    """The per-draw risk and mean error (:func:`running_metrics`, draws at ``times``) at log-spaced times up to ``end``.

    Each checkpoint reads the latest draw at or before it (the first draw before that).
    """
    if times.numel() == 0:
        return {"seconds": [], "risk": [], "mean_error": [], "draws": []}
    first = float(times[0])
    grid = torch.logspace(math.log10(max(first, 1e-3)), math.log10(max(end, first * 1.001)), CHECKPOINTS)
    pick = (torch.searchsorted(times, grid.double(), right=True) - 1).clamp(min=0)
    risk, error = metrics
    return {"seconds": grid.tolist(), "risk": risk[pick].tolist(), "mean_error": error[pick].tolist(),
            "draws": (pick + 1).tolist()}  # fmt: skip


def running_metrics(samples: Tensor, ds: Dataset, ref: dict[str, Any], block: int = 2_000) -> tuple[Tensor, Tensor]:
    """Risk of the running predictive mean and RMS error of the running posterior mean (in sds) after every draw.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> ds = synthetic(300, 2, g, test=5)
        >>> ref = {"predictive": torch.full((5,), 0.5), "mean": torch.zeros(2), "sd": torch.ones(2)}
        >>> risk, error = running_metrics(torch.zeros(4, 2), ds, ref)
        >>> risk.tolist(), error.tolist()
        ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])
    """
    draws = samples.shape[0]
    counts = torch.arange(1, draws + 1, dtype=torch.float64)
    total = torch.zeros(ds.Xt.shape[0], dtype=torch.float64)
    risk = torch.empty(draws, dtype=torch.float64)
    for start in range(0, draws, block):  # bounds the [test, block] temporaries
        probs = torch.sigmoid(ds.Xt @ samples[start : start + block].T).double().cumsum(1) + total[:, None]
        total = probs[:, -1]
        running = probs / counts[start : start + block]
        risk[start : start + block] = ((running - ref["predictive"].double()[:, None]) ** 2).mean(0)
    running_mean = samples.double().cumsum(0) / counts[:, None]
    error = (((running_mean - ref["mean"].double()) / ref["sd"].double()) ** 2).mean(1).sqrt()
    return risk, error


def first_draw_time(times: Tensor, values: Tensor, level: float) -> float | None:
    """The first hit of ``level`` by per-draw ``values`` at ``times`` (``first_time(..., for_good=False)``).

    Example:
        >>> first_draw_time(torch.tensor([1.5, 2.5, 3.5]), torch.tensor([3.0, 2.0, 0.5]), 1.0)
        3.5
    """
    return first_time(ErrorTrace(times.tolist(), values.tolist()), level, for_good=False)


def moment_errors(samples: Tensor, ref: dict[str, Any]) -> dict[str, float]:
    """Errors of the chain's posterior mean and sd against the reference, in posterior sds, with MCSEs.

    ``*_error_sd``: mean over coordinates of the absolute error; ``*_mcse_sd``: mean over
    coordinates of the chain's Monte Carlo standard error (ArviZ, from its effective sample
    size); ``*_z_rms``: root mean square over coordinates of ``error / √(MCSE² + reference MCSE²)``,
    about 1 when the error is Monte Carlo noise and well above 1 when the chain is biased.
    """
    s = samples.double()
    sd, ref_mean_se, ref_sd_se = ref["sd"].double(), ref["mean_mcse"].double(), ref["sd_mcse"].double()
    mean_err = (s.mean(0) - ref["mean"].double()) / sd
    out: dict[str, float] = {"mean_error_sd": float(mean_err.abs().mean()), "draws": int(s.shape[0])}
    if s.shape[0] < 2:
        return {**out, "sd_error_sd": float("nan")}
    sd_err = (s.std(0) - sd) / sd
    out["sd_error_sd"] = float(sd_err.abs().mean())
    if s.shape[0] >= 20:
        az = import_arviz()
        draws = az.convert_to_dataset({"w": s.numpy()[None]})
        mean_se = torch.from_numpy(az.mcse(draws, method="mean")["w"].values) / sd
        sd_se = torch.from_numpy(az.mcse(draws, method="sd")["w"].values) / sd
        out.update({
            "mean_mcse_sd": float(mean_se.mean()),
            "mean_z_rms": float((mean_err**2 / (mean_se**2 + ref_mean_se**2)).mean().sqrt()),
            "sd_mcse_sd": float(sd_se.mean()),
            "sd_z_rms": float((sd_err**2 / (sd_se**2 + ref_sd_se**2)).mean().sqrt()),
        })  # fmt: skip
    return out


# -- the study -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    add_table(
        parser,
        """
        --budget-scale       1.0    -   multiplies every wall-time budget
        --batch-size         100    -
        --batch-growth       2.0    -   AusterityMH batch_growth (later stages)
        --bias-transitions   5000   -   transitions per arm of the bias table
        --replicates         3      -   chains of exact MH and austerity eps=0.05 per scaling set (mean-risk crossing)
        """,
    )
    parser.add_argument("--no-numpyro", action="store_true", help="skip NumPyro NUTS even if installed")
    add_run_options(parser, "experiments/results/logistic_austerity", "CI scale: small data, sub-second budgets")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace, generator: torch.Generator) -> list[tuple[Callable[[], Dataset], float, str]]:
    """``(make dataset, budget seconds, role)`` per data set; roles: scaling, real, nuts, bias."""
    s = args.budget_scale
    if args.quick:
        return [
            # budgets include each kernel's setup (AusterityMH finds the posterior mode there)
            (lambda: synthetic(2_000, 5, generator, 200), 0.8 * s, "scaling"),
            (lambda: synthetic(20_000, 5, generator, 200), 1.0 * s, "scaling"),
            (lambda: coreset_dataset("synth_lr"), 0.6 * s, "real"),
            (lambda: synthetic(20_000, 3, generator, 200), 1.2 * s, "nuts"),
            (lambda: synthetic(2_000, 3, generator, 200), math.inf, "bias"),
        ]
    return [
        (lambda: synthetic(10_000, 50, generator), 8 * s, "scaling"),
        (lambda: synthetic(100_000, 50, generator), 15 * s, "scaling"),
        (lambda: synthetic(1_000_000, 50, generator), 35 * s, "scaling"),
        (lambda: mnist_7_vs_9(50, generator), 5 * s, "real"),
        (lambda: coreset_dataset("phishing"), 2.5 * s, "real"),
        (lambda: coreset_dataset("ds1"), 2.5 * s, "real"),
        (lambda: coreset_dataset("synth_lr"), 2.5 * s, "real"),
        (lambda: synthetic(1_000_000, 10, generator), 30 * s, "nuts"),
        (lambda: synthetic(10_000, 10, generator), math.inf, "bias"),  # fixed transitions, not time
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the study; write JSON, markdown and PNG plots; return the JSON record."""
    args = parse_args(argv)
    config, folder = open_study(args, drop={"out"})
    generator = torch.Generator().manual_seed(args.seed)
    pyro.set_rng_seed(args.seed)
    rng = random.Random(args.seed)
    record: dict[str, Any] = {"config": config, "datasets": [], "numpyro_available": None}
    for make, budget, role in tqdm(plan(args, generator), desc="logistic austerity"):
        ds = make()
        record["datasets"].append(run_dataset(ds, budget, role, args, generator, rng, record))
        write_json(folder / "partial.json", record)  # progress survives an interrupted run
    record["targets"] = targets(record)
    write_outputs(folder, record)
    (folder / "partial.json").unlink(missing_ok=True)
    return record


def bias_methods(
    ds: Dataset, fit: tuple[Tensor, Tensor, Tensor], init: Tensor, args: argparse.Namespace
) -> dict[str, Callable[[], TimedRun | None]]:
    """The bias table's arms: exact MH, and austerity with and without the control variate at each ε.

    Every arm runs the same number of transitions of the Laplace independence proposal (it
    mixes in a few steps, so the chains' Monte Carlo error is small enough to expose bias).
    """
    proposal = LaplaceProposal(fit[0], fit[1])
    count = 150 if args.quick else args.bias_transitions

    def run(kernel: AusterityMH) -> TimedRun:
        return run_kernel(kernel, ds, init, math.inf, transitions=count)

    methods: dict[str, Callable[[], TimedRun | None]] = {EXACT: lambda: run(make_exact(fit, proposal))}
    for eps in QUICK_EPSILONS if args.quick else EPSILONS:
        methods[f"austerity eps={eps}"] = lambda eps=eps: run(make_austerity(eps, fit, args, True, proposal))
        methods[f"austerity (seed test) eps={eps}"] = lambda eps=eps: run(
            make_austerity(eps, fit, args, False, proposal)
        )
    return methods


def run_dataset(
    ds: Dataset,
    budget: float,
    role: str,
    args: argparse.Namespace,
    generator: torch.Generator,
    rng: random.Random,
    record: dict[str, Any],
) -> dict[str, Any]:
    """All samplers on one data set, in a random order, each for ``budget`` seconds (bias role: fixed transitions)."""
    fit, laplace_seconds = timed_call(laplace_fit, ds, clock=CLOCK)
    mode, cov, _ = fit
    pairs = 150 if args.quick else (20_000 if role == "bias" else (5_000 if ds.size <= 200_000 else 500))
    ref = reference_posterior(ds, mode, cov, pairs, generator)
    init = mode + torch.linalg.cholesky(cov) @ torch.randn(ds.dim, generator=generator)
    independent = LaplaceProposal(mode, cov)

    def chain(kernel: AusterityMH) -> TimedRun:
        return run_kernel(kernel, ds, init, budget, min_draws=QUICK_MIN_DRAWS if args.quick else 0)

    methods: dict[str, Callable[[], TimedRun | None]]
    if role == "bias":
        methods = bias_methods(ds, fit, init, args)
    else:
        methods = {EXACT: lambda: chain(make_exact(fit))}
        epsilons = (0.05,) if role == "nuts" else (QUICK_EPSILONS if args.quick else EPSILONS)
        for eps in epsilons:
            methods[f"austerity eps={eps}"] = lambda eps=eps: chain(make_austerity(eps, fit, args))
        if role != "nuts":
            methods[SEED_TEST] = lambda: chain(make_austerity(0.05, fit, args, False))
        else:  # what a user holding a Laplace fit would run: it as an independence proposal
            methods[INDEP_AUSTERITY] = lambda: chain(make_austerity(0.05, fit, args, True, independent))
            methods[INDEP_EXACT] = lambda: chain(make_exact(fit, independent))
        nuts_cap = budget * (3.0 if role == "nuts" else 1.0)
        warmup, draws = (20, 50) if args.quick else (100, 400)
        # Pyro NUTS did not finish warmup within the budget at N >= 1e5, D = 50 in earlier runs: skipped there
        if role != "scaling" or ds.size <= 10_000 or args.quick:
            methods[PYRO_NUTS] = lambda: baselines.pyro_nuts_run(
                logistic_model_full, (ds.X, ds.y), "w", warmup, draws, clock=CLOCK, cap=nuts_cap
            )
        # NumPyro's warmup cannot be interrupted: run it where it fits the budget (smallest scaling set, D=10 study)
        if not args.no_numpyro and not args.quick and (role == "nuts" or (role == "scaling" and ds.size <= 10_000)):
            methods[NUMPYRO_NUTS] = lambda: run_numpyro_nuts(ds, warmup, draws, args.seed)
    order = list(methods)
    rng.shuffle(order)
    runs: dict[str, Any] = {}
    done: dict[str, tuple[TimedRun, float]] = {}
    traces: dict[str, tuple[Tensor, tuple[Tensor, Tensor]]] = {}  # per-draw times, (risk, mean error)
    for label in order:
        run = methods[label]()
        if label == NUMPYRO_NUTS:
            record["numpyro_available"] = run is not None
        if run is None:
            continue
        # austerity's Laplace fit is part of its pipeline: its clock is shifted by the fit's time
        offset = laplace_seconds if label.startswith(OFFSET) else 0.0
        done[label] = (run, offset)
        if run.samples:
            traces[label] = (draw_times(run, offset), running_metrics(draws_of(run), ds, ref))
        end = run.total_s if math.isinf(budget) else max(run.total_s, budget)
        runs[label] = {
            "curves": curves(*traces.get(label, (torch.empty(0), ())), end + offset),
            "transitions": run.samples,
            "seconds": run.total_s,
            "timing": run.summary(),
            "diagnostics": {k: v for k, v in run.diagnostics.items() if isinstance(v, int | float | bool)},
            "moments": moment_errors(draws_of(run), ref) if run.samples else {},
        }
    crossings(runs, traces)
    replicated = None
    if role == "scaling" and args.replicates > 1 and EXACT in traces and REPLICATED in traces:
        replicated = replicate_crossing(done, {label: methods[label] for label in (EXACT, REPLICATED)}, ds, ref, args)
    return {
        "replicated": replicated,
        "name": ds.name, "role": role, "N": ds.size, "D": ds.dim, "budget_seconds": budget,
        "laplace_seconds": laplace_seconds, "reference_ess": ref["ess"], "reference_draws": ref["draws"],
        "reference_mean_mcse_max": float(ref["mean_mcse"].max()), "reference_sd_mcse_max": float(ref["sd_mcse"].max()),
        "reference_predictive_mse": float((ref["predictive_mcse"] ** 2).mean()),
        "order": order, "runs": runs,
    }  # fmt: skip


def crossings(runs: dict[str, Any], traces: dict[str, tuple[Tensor, tuple[Tensor, Tensor]]]) -> None:
    """Add each run's first draw times (offset included) to exact MH's final risk and to a 0.1 sd mean error.

    At draw resolution (``traces``: per-draw times and metrics), not the curves' log-spaced checkpoints (which
    overstate a crossing time by up to one checkpoint step, ~20%): ``seconds_to_exact_final_risk`` and
    ``seconds_to_0.1_sd``.
    """
    level = float(traces[EXACT][1][0][-1]) if EXACT in traces else None
    for label, (times, (risk, error)) in traces.items():
        if level is not None:
            runs[label]["seconds_to_exact_final_risk"] = first_draw_time(times, risk, level)
        runs[label]["seconds_to_0.1_sd"] = first_draw_time(times, error, 0.1)


def replicate_crossing(
    chains: dict[str, tuple[TimedRun, float]],
    runners: dict[str, Callable[[], TimedRun | None]],
    ds: Dataset,
    ref: dict[str, Any],
    args: argparse.Namespace,
    grid_points: int = 2_000,
) -> dict[str, Any]:
    """Expected risk (mean over ``--replicates`` chains) of exact MH and austerity, and its crossing time.

    Korattikara et al.'s risk is an expectation over chains; one chain's risk curve is a noisy
    estimate of it, and so is the time at which one austerity chain first reaches one exact chain's
    final value. Here both arms run ``replicates`` chains (the study's first run plus extra runs in
    random order), each chain's per-draw risk is read on a common time grid (its latest draw at
    each time, Laplace fit included), and the mean curves give the level (exact MH's mean risk at
    the end: the shortest chain's clock, or the latest first draw where that is later) and austerity's first
    time at or below it.
    """
    arms = {label: [chains[label]] for label in runners}
    extra = [label for label in runners for _ in range(args.replicates - 1)]
    random.Random(args.seed + ds.size).shuffle(extra)
    for label in extra:
        arms[label].append((cast(TimedRun, runners[label]()), chains[label][1]))
    runs = {  # per chain: the draw times and the per-draw risk
        label: [(draw_times(run, offset), running_metrics(draws_of(run), ds, ref)[0]) for run, offset in arm]
        for label, arm in arms.items()
    }
    end = min(float(times[-1]) for arm in runs.values() for times, _ in arm)
    # every chain must have a draw by the end (a slow setup under load can put one's first draw after another's last)
    end = max(end, max(float(times[0]) for arm in runs.values() for times, _ in arm))
    grid = torch.linspace(0.0, end, grid_points + 1, dtype=torch.float64)[1:]
    mean_risk = {}
    for label, arm in runs.items():
        curves = []
        for times, risk in arm:
            seen = torch.searchsorted(times, grid, right=True)
            curves.append(torch.where(seen > 0, risk[(seen - 1).clamp(min=0)], torch.tensor(math.inf)))
        mean_risk[label] = torch.stack(curves).mean(0)
    level = float(mean_risk[EXACT][-1])
    hits = torch.nonzero(mean_risk[REPLICATED] <= level)
    crossing = None if hits.numel() == 0 else float(grid[int(hits[0, 0])])
    keep = torch.linspace(0, grid_points - 1, 200).round().long()  # a small record for the plot
    return {
        "replicates": args.replicates,
        "end_seconds": end,
        "exact_mean_final_risk": level,
        "austerity_seconds_to_level": crossing,
        "time_fraction_of_exact": None if crossing is None else crossing / end,
        "transitions": {label: [len(times) for times, _ in arm] for label, arm in runs.items()},
        "curve_seconds": [float(f"{v:.4g}") for v in grid[keep].tolist()],
        "mean_risk": {label: [float(f"{v:.4g}") for v in curve[keep].tolist()] for label, curve in mean_risk.items()},
    }


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, from the runs (None where a run is missing)."""
    scaling = sorted((d for d in record["datasets"] if d["role"] == "scaling"), key=lambda d: d["N"])
    out: dict[str, Any] = {}
    if scaling:
        small, big = scaling[0], scaling[-1]
        aus_big, ex_big = big["runs"].get("austerity eps=0.05"), big["runs"].get(EXACT)
        aus_small = small["runs"].get("austerity eps=0.05")
        out["N_large"], out["N_small"] = big["N"], small["N"]
        if aus_big:
            out["data_fraction_at_N_large"] = aus_big["diagnostics"].get("data_fraction")
        if aus_big and aus_small:  # the harness's sampling time per transition (setup excluded)
            big_s, small_s = (run["timing"]["sampling_s"] / max(run["transitions"], 1) for run in (aus_big, aus_small))
            out["time_per_transition_growth"] = big_s / small_s
        if aus_big and ex_big and ex_big["curves"]["risk"]:
            level = ex_big["curves"]["risk"][-1]
            t_exact = ex_big["curves"]["seconds"][-1]
            t_aus = aus_big.get("seconds_to_exact_final_risk")
            shared = big["laplace_seconds"]  # both chains use the Laplace fit; their clocks include it
            out["exact_final_risk"] = level
            out["exact_seconds"] = t_exact
            out["austerity_seconds_to_exact_risk"] = t_aus
            out["time_fraction_of_exact"] = None if t_aus is None else t_aus / t_exact
            out["time_fraction_of_exact_excluding_shared_laplace"] = (
                None if t_aus is None else (t_aus - shared) / (t_exact - shared)
            )
        replicated = {d["N"]: d["replicated"] for d in scaling if d.get("replicated")}
        if replicated:  # the expected-risk version of the same target, per N
            out["time_fraction_of_exact_mean_risk"] = {n: r["time_fraction_of_exact"] for n, r in replicated.items()}
            out["mean_risk_replicates"] = next(iter(replicated.values()))["replicates"]
    nuts = [d for d in record["datasets"] if d["role"] == "nuts"]
    if nuts:
        d = nuts[0]
        times = {label: run.get("seconds_to_0.1_sd") for label, run in d["runs"].items()}
        caps = {
            label: run["seconds"] + (d["laplace_seconds"] if label.startswith(OFFSET) else 0.0)
            for label, run in d["runs"].items()
        }
        reached = [times[k] for k in ("austerity eps=0.05", INDEP_AUSTERITY) if times.get(k) is not None]
        aus = min(reached) if reached else None
        out["nuts_comparison_austerity_seconds"] = aus
        out["nuts_comparison"] = {"N": d["N"], "D": d["D"], "seconds_to_0.1_sd": times, "run_seconds": caps}
        for label in (PYRO_NUTS, NUMPYRO_NUTS, EXACT):
            if label not in times or aus is None:
                continue
            if times[label] is None:
                out["nuts_comparison"][f"speedup_vs_{label}"] = f">= {caps[label] / aus:.3g} (not reached in cap)"
            else:
                out["nuts_comparison"][f"speedup_vs_{label}"] = times[label] / aus
    return out


def bias_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Posterior mean/sd errors (in posterior sds, with MCSEs) per method and ε, on the bias data set."""
    bias = [d for d in record["datasets"] if d["role"] == "bias"]
    if not bias:
        return []
    d = bias[0]
    labels = [EXACT]
    for family in ("austerity eps=", "austerity (seed test) eps="):
        labels += [f"{family}{e}" for e in sorted(EPSILONS)]
    rows = []
    for label in labels:
        run = d["runs"].get(label)
        if run and run["moments"]:
            rows.append(
                {
                    "dataset": d["name"],
                    "method": label,
                    **run["moments"],
                    "acceptance": run["diagnostics"].get("acceptance_rate"),
                    "data fraction": run["diagnostics"].get("data_fraction"),
                }
            )
    return rows


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    """JSON record, markdown tables and the PNG plots."""
    rows = []
    for d in (d for d in record["datasets"] if d["role"] != "bias"):  # the bias arms have their own table
        for label, run in d["runs"].items():
            diag = run["diagnostics"]
            rows.append(
                {
                    "dataset": d["name"],
                    "method": label,
                    "transitions": run["transitions"],
                    "ms/transition": 1000 * run["seconds"] / max(run["transitions"], 1),
                    "data fraction": diag.get("data_fraction"),
                    "stages": diag.get("mean_stages"),
                    "acceptance": diag.get("acceptance_rate"),
                    "final risk": run["curves"]["risk"][-1] if run["curves"]["risk"] else None,
                    "mean err (sd)": run["moments"].get("mean_error_sd"),
                }
            )
    record["bias"] = bias_rows(record)
    for d in record["datasets"]:  # keep the committed record small: 4 significant digits on the curves
        for run in d["runs"].values():
            run["curves"] = {k: [float(f"{v:.4g}") for v in vals] for k, vals in run["curves"].items()}
    write_json(folder / "logistic_austerity.json", record)
    columns = [
        "dataset",
        "method",
        "transitions",
        "ms/transition",
        "data fraction",
        "stages",
        "acceptance",
        "final risk",
        "mean err (sd)",
    ]
    text = [
        "# Bayesian logistic regression: austerity MH vs exact MH vs NUTS",
        "",
        markdown_table(rows, columns),
        "",
        "## Targets",
        "",
    ]
    text += [f"- `{k}`: {v}" for k, v in record["targets"].items()]
    text += ["", "## Setup notes", "", *NOTES]
    text += [
        "",
        "## Reference accuracy",
        "",
        markdown_table(
            [
                {
                    "dataset": d["name"],
                    "draws": d["reference_draws"],
                    "IS ESS": d["reference_ess"],
                    "max mean MCSE (sd)": d["reference_mean_mcse_max"],
                    "max sd MCSE (sd)": d["reference_sd_mcse_max"],
                    "predictive MSE": d["reference_predictive_mse"],
                }
                for d in record["datasets"]
            ],
            ["dataset", "draws", "IS ESS", "max mean MCSE (sd)", "max sd MCSE (sd)", "predictive MSE"],
        ),
    ]
    text += [
        "",
        "## Bias against the reference (posterior sds, mean over coordinates)",
        "",
        "Same number of transitions per arm, Laplace independence proposal, same start. `*_mcse_sd`: the",
        "chain's Monte Carlo standard error; `*_z_rms`: RMS over coordinates of error / √(MCSE² + reference",
        "MCSE²), about 1 when the error is Monte Carlo noise, well above 1 when the chain is biased.",
        "",
        markdown_table(
            record["bias"],
            [
                "dataset",
                "method",
                "draws",
                "acceptance",
                "data fraction",
                "mean_error_sd",
                "mean_mcse_sd",
                "mean_z_rms",
                "sd_error_sd",
                "sd_mcse_sd",
                "sd_z_rms",
            ],
        ),
    ]
    replicated = [d for d in record["datasets"] if d.get("replicated")]
    if replicated:
        text += [
            "",
            "## Expected risk: mean over replicate chains",
            "",
            "Korattikara et al.'s risk is an expectation over chains. Each scaling set runs exact MH and austerity",
            "eps=0.05 `replicates` times (the first runs are the table's rows); the mean of their per-draw risk",
            "curves on a common clock (Laplace fit included) gives exact MH's expected final risk and the time",
            "at which austerity's expected risk first reaches it (see `logistic_mean_risk.png`).",
            "",
            markdown_table(
                [
                    {
                        "dataset": d["name"],
                        "replicates": d["replicated"]["replicates"],
                        "exact transitions": d["replicated"]["transitions"][EXACT],
                        "austerity transitions": d["replicated"]["transitions"][REPLICATED],
                        "clock end (s)": d["replicated"]["end_seconds"],
                        "exact mean final risk": d["replicated"]["exact_mean_final_risk"],
                        "austerity s to it": d["replicated"]["austerity_seconds_to_level"],
                        "time fraction": d["replicated"]["time_fraction_of_exact"],
                    }
                    for d in replicated
                ],
                [
                    "dataset",
                    "replicates",
                    "exact transitions",
                    "austerity transitions",
                    "clock end (s)",
                    "exact mean final risk",
                    "austerity s to it",
                    "time fraction",
                ],
            ),
        ]
    (folder / "logistic_austerity.md").write_text("\n".join(text) + "\n")
    plot_risk(folder, record)
    plot_scaling(folder, record)
    if replicated:
        plot_mean_risk(folder, replicated)


def plot_mean_risk(folder: Path, datasets: list[dict[str, Any]]) -> None:
    """Mean risk over replicate chains vs wall time, exact MH and austerity, one panel per scaling set."""
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.3), squeeze=False)
    for ax, d in zip(axes.flat, datasets, strict=True):
        rep = d["replicated"]
        for label, curve in rep["mean_risk"].items():
            ax.loglog(rep["curve_seconds"], curve, label=label, lw=1.2)
        ax.axhline(rep["exact_mean_final_risk"], color="grey", lw=0.8, ls="--")
        if rep["austerity_seconds_to_level"] is not None:
            ax.axvline(rep["austerity_seconds_to_level"], color="grey", lw=0.8, ls=":")
        ax.set_title(f"{d['name']} ({rep['replicates']} chains each)", fontsize=9)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("mean risk of predictive mean")
    axes.flat[0].legend(fontsize=6)
    save_figure(fig, folder / "logistic_mean_risk.png", dpi=45)


def plot_risk(folder: Path, record: dict[str, Any]) -> None:
    """Risk of the predictive mean vs wall time, one panel per data set."""
    data = record["datasets"]
    cols = min(4, len(data))
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, d in zip(axes.flat, data, strict=False):
        for label, run in sorted(d["runs"].items()):
            c = run["curves"]
            if c["risk"]:
                ax.loglog(c["seconds"], c["risk"], label=label, lw=1.2)
        ax.set_title(d["name"], fontsize=9)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("risk of predictive mean")
    for ax in list(axes.flat)[len(data) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    save_figure(fig, folder / "logistic_risk.png", dpi=45)


def plot_scaling(folder: Path, record: dict[str, Any]) -> None:
    """Time per transition vs N (scaling data sets) and bias vs ε."""
    scaling = sorted((d for d in record["datasets"] if d["role"] == "scaling"), key=lambda d: d["N"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = sorted({label for d in scaling for label in d["runs"] if "NUTS" not in label})
    for label in labels:
        pts = [
            (d["N"], 1000 * d["runs"][label]["seconds"] / max(d["runs"][label]["transitions"], 1))
            for d in scaling
            if label in d["runs"]
        ]
        if pts:
            left.loglog(*zip(*pts, strict=True), marker="o", label=label)
    left.set_xlabel("N")
    left.set_ylabel("ms per transition")
    left.legend(fontsize=6)
    for family, marker in (("austerity eps=", "o"), ("austerity (seed test) eps=", "s")):
        rows = [r for r in record["bias"] if r["method"].startswith(family) and "sd_mcse_sd" in r]
        if rows:
            eps = [float(r["method"].split("=")[1]) for r in rows]
            name = family.removesuffix(" eps=")
            right.errorbar(
                eps,
                [r["mean_error_sd"] for r in rows],
                yerr=[r["mean_mcse_sd"] for r in rows],
                marker=marker,
                capsize=2,
                label=f"{name}: |mean error| / sd",
            )
            right.errorbar(
                eps,
                [r["sd_error_sd"] for r in rows],
                yerr=[r["sd_mcse_sd"] for r in rows],
                marker=marker,
                ls="--",
                capsize=2,
                label=f"{name}: |sd error| / sd",
            )
    exact = [r for r in record["bias"] if r["method"] == EXACT]
    if exact:
        right.axhline(exact[0]["mean_error_sd"], ls=":", c="k", lw=0.8, label="exact MH, |mean error|")
        right.axhline(exact[0]["sd_error_sd"], ls="-.", c="gray", lw=0.8, label="exact MH, |sd error|")
        right.set_xscale("log")
        right.set_xlabel("ε")
        right.set_title(f"bias: {exact[0]['dataset']} (bars: mean chain MCSE)", fontsize=9)
        right.legend(fontsize=6)
    save_figure(fig, folder / "logistic_scaling_bias.png", dpi=60)


if __name__ == "__main__":
    main()
