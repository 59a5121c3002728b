"""Study: austerity MH vs exact MH vs NUTS for Bayesian logistic regression (Korattikara et al.'s setting).

Datasets: synthetic (``X ~ N(0, I)``, ``N`` in {1e4, 1e5, 1e6}, ``D = 50``; and ``N = 1e6,
D = 10`` for the comparison with NUTS); MNIST 7 vs 9 (test set, pixels PCA-projected to 50
dimensions, plus an intercept; 80/20 train/test split); the logistic coreset datasets
(phishing, ds1, synth_lr, with their own test sets). Prior ``w ~ N(0, I)``.

Samplers, each for the same wall-time budget per dataset, in a random order (one round):

* ``exact MH``: :class:`~neuralblock.kernels.austerity.AusterityMH` with ``epsilon = 0`` (one
  vectorized full-data evaluation per transition, current state cached: plain MH);
* ``austerity eps=ε`` for ε in {0.01, 0.05, 0.1, 0.2}: mini-batches of 100, with the
  second-order Taylor control variate around the posterior mode;
* ``austerity (seed test) eps=0.05``: the seed's test without the control variate;
* ``Pyro NUTS`` on the full data (warmup counted, capped in wall time);
* ``NumPyro NUTS`` (JAX on CPU, one thread; optional ``bench`` extra, skipped when absent).

All MH chains use the same Gaussian random walk, scaled to the posterior: the Laplace
covariance times ``2.38/√D`` (no adaptation), and start from the same draw of the Laplace
approximation. The Laplace fit (Newton on the full data) is shared and timed separately.

Reference: self-normalised importance sampling of the exact posterior with a Laplace
proposal (covariance inflated by 1.2²), full likelihood, importance ESS reported. It gives
the posterior mean/sd and the *predictive mean* ``p̄(x*) = E[σ(x*ᵀw)]`` at test points.
Risk (as in Korattikara et al.) is the squared error of a chain's running predictive mean
against the reference's, averaged over the test points, against wall time.

Targets checked (``targets`` in the JSON): at ``N = 1e6, ε = 0.05``, mean data fraction
per transition <= 2%, time to reach exact MH's final risk <= 1/10 of exact MH's budget,
time per transition grows <= 3x from ``N = 1e4``; at ``N = 1e6, D = 10``, time to a
posterior-mean error <= 0.1 posterior sd (RMS over coordinates of the running mean's error
in posterior sds), austerity (Laplace fit included) vs Pyro NUTS and NumPyro NUTS (warmup
and compilation included). A bias table (errors of posterior mean and sd vs ε) closes.

Usage::

    python experiments/logistic_austerity.py --quick   # CI scale, seconds
    python experiments/logistic_austerity.py           # full run (~15-20 min on 1 core)
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from torch import Tensor
from tqdm import tqdm

from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json
from neuralblock.io import data_path
from neuralblock.kernels.austerity import AusterityMH

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["Dataset", "LaplaceProposal", "laplace_fit", "main", "reference_posterior"]

EPSILONS = (0.01, 0.05, 0.1, 0.2)
QUICK_EPSILONS = (0.05, 0.2)
EXACT, SEED_TEST, PYRO_NUTS, NUMPYRO_NUTS = "exact MH", "austerity (seed test) eps=0.05", "Pyro NUTS", "NumPyro NUTS"
INDEP_AUSTERITY, INDEP_EXACT = "austerity eps=0.05, Laplace independence", "exact MH, Laplace independence"
CHECKPOINTS = 20
OFFSET = ("austerity", "exact MH")  # samplers whose clock includes the Laplace fit they use


@dataclass
class Dataset:
    """A logistic-regression data set: training ``X [N, D]``, labels ``y`` in {0, 1}, test points ``Xt``."""

    name: str
    X: Tensor
    y: Tensor
    Xt: Tensor

    @property
    def size(self) -> int:
        """Number of training points ``N``."""
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        """Number of weights ``D``."""
        return int(self.X.shape[1])


# -- models -----------------------------------------------------------------------------------
def logistic_model(X: Tensor, y: Tensor) -> None:
    """Bayesian logistic regression in Pyro's subsampling idiom (sections = data points)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def logistic_model_full(X: Tensor, y: Tensor) -> None:
    """The same model written on the full data (what a user runs with exact MH or NUTS)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


# -- data -------------------------------------------------------------------------------------
def synthetic(n: int, d: int, generator: torch.Generator, test: int = 1000) -> Dataset:
    """``X ~ N(0, I)`` (last column an intercept), ``w* ~ N(0, 4/D)``, ``y ~ Bernoulli(σ(X w*))``."""
    X = torch.randn(n + test, d, generator=generator)
    X[:, -1] = 1.0
    w = torch.randn(d, generator=generator) * 2.0 / math.sqrt(d)
    y = torch.bernoulli(torch.sigmoid(X[:n] @ w), generator=generator)
    return Dataset(f"synthetic N={n:.0e} D={d}", X[:n].contiguous(), y, X[n:].contiguous())


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def mnist_7_vs_9(dim: int, generator: torch.Generator) -> Dataset:
    """MNIST test set, digits 7 (y=0) vs 9 (y=1), PCA to ``dim`` standardised components + intercept."""
    images = torch.from_numpy(_read_idx(data_path("mnist_test_idx", "t10k-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(_read_idx(data_path("mnist_test_idx", "t10k-labels-idx1-ubyte.gz")).copy())
    keep = (labels == 7) | (labels == 9)
    pixels = images[keep].reshape(int(keep.sum()), -1).float() / 255.0
    y = (labels[keep] == 9).float()
    centred = pixels - pixels.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    scores = centred @ v[:dim].T
    scores = scores / scores.std(0)
    X = torch.cat([scores, torch.ones(len(y), 1)], 1)
    order = torch.randperm(len(y), generator=generator)
    cut = int(0.8 * len(y))
    return Dataset(f"MNIST 7v9 D={dim + 1}", X[order[:cut]].contiguous(), y[order[:cut]], X[order[cut:]].contiguous())


def coreset_dataset(name: str) -> Dataset:
    """A logistic data set of ``data/coresets_data`` (trailing intercept column, ``y`` in {-1, +1})."""
    arrays = np.load(data_path("coresets_data", f"{name}.npz"))
    X = torch.from_numpy(arrays["X"]).float()
    mean, sd = X[:, :-1].mean(0), X[:, :-1].std(0).clamp_min(1e-8)

    def standardise(features: Tensor) -> Tensor:
        return torch.cat([(features[:, :-1] - mean) / sd, features[:, -1:]], 1)

    y = (torch.from_numpy(arrays["y"]).float() > 0).float()
    return Dataset(name, standardise(X).contiguous(), y, standardise(torch.from_numpy(arrays["Xt"]).float()))


# -- Laplace fit and the reference ---------------------------------------------------------
def _chunks(n: int, size: int = 200_000) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def laplace_fit(ds: Dataset, iterations: int = 25) -> tuple[Tensor, Tensor, Tensor]:
    """Posterior mode, Laplace covariance and log-likelihood Hessian by Newton's method on the full data.

    Example:
        >>> ds = synthetic(200, 3, torch.Generator().manual_seed(0))
        >>> mode, cov, hessian = laplace_fit(ds)
        >>> mode.shape, cov.shape, bool((hessian.diagonal() < 0).all())
        (torch.Size([3]), torch.Size([3, 3]), True)
    """
    w = torch.zeros(ds.dim, dtype=torch.float64)
    for it in range(iterations + 1):
        grad, fisher = -w.clone(), torch.zeros(ds.dim, ds.dim, dtype=torch.float64)
        for part in _chunks(ds.size):
            X = ds.X[part]
            p = torch.sigmoid(X @ w.float())
            grad += (X.T @ (ds.y[part] - p)).double()
            fisher += (X.T @ (X * (p * (1 - p))[:, None])).double()
        if it == iterations or float(grad.abs().max()) < 1e-6:  # fisher is at the returned mode
            break
        w = w + torch.linalg.solve(fisher + torch.eye(ds.dim, dtype=torch.float64), grad)
    precision = fisher + torch.eye(ds.dim, dtype=torch.float64)
    return w.float(), torch.linalg.inv(precision).float(), (-fisher).float()


def _log_likelihood(ds: Dataset, W: Tensor) -> Tensor:
    """Full-data log-likelihood of each weight vector in ``W [K, D]``, chunked over the data."""
    total = torch.zeros(W.shape[0], dtype=torch.float64)
    for part in _chunks(ds.size, 20_000):
        logits = ds.X[part] @ W.T
        total += (ds.y[part][:, None] * logits - torch.nn.functional.softplus(logits)).sum(0).double()
    return total


def reference_posterior(
    ds: Dataset, mode: Tensor, cov: Tensor, draws: int, generator: torch.Generator
) -> dict[str, Any]:
    """Posterior mean, sd and test predictive mean by self-normalised importance sampling.

    Proposal: ``N(mode, 1.2² cov)``; weights ``p(w) p(y | w) / q(w)`` on the full likelihood.
    """
    chol = torch.linalg.cholesky(cov.double() * 1.44)
    W = (mode.double() + torch.randn(draws, ds.dim, generator=generator, dtype=torch.float64) @ chol.T).float()
    proposal = torch.distributions.MultivariateNormal(mode.double(), scale_tril=chol)
    prior = torch.distributions.Normal(0.0, 1.0).log_prob(W.double()).sum(-1)
    log_w = prior + _log_likelihood(ds, W) - proposal.log_prob(W.double())
    weights = torch.softmax(log_w, 0)
    mean = weights @ W.double()
    sd = (weights @ (W.double() - mean) ** 2).sqrt()
    predictive = torch.sigmoid(ds.Xt @ W.T).double() @ weights
    ess = float(1.0 / (weights**2).sum())
    return {"mean": mean.float(), "sd": sd.float(), "predictive": predictive.float(), "ess": ess, "draws": draws}


# -- running samplers ---------------------------------------------------------------------------
class LaplaceProposal:
    """Independence proposal ``N(mode, scale² cov)`` for :class:`AusterityMH` (a callable ``z -> Distribution``)."""

    def __init__(self, mode: Tensor, cov: Tensor, scale: float = 1.1) -> None:
        self.dist = dist.MultivariateNormal(mode, scale_tril=scale * torch.linalg.cholesky(cov))

    def __call__(self, z: Tensor) -> dist.MultivariateNormal:
        return self.dist


@dataclass
class Chain:
    """Draws of one sampler with the wall time (from its start) at which each was produced."""

    samples: Tensor
    seconds: Tensor
    setup_seconds: float
    diagnostics: dict[str, Any]


def run_kernel(kernel: AusterityMH, ds: Dataset, init: Tensor, budget: float, model_args: tuple) -> Chain:
    """Run ``kernel`` from ``init`` for ``budget`` seconds (its setup included in the clock)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the exact arm's full-data model is not sublinear
        kernel.setup(0, *model_args)
    setup = time.perf_counter() - start
    params = {"w": init.clone()}
    samples, seconds = [], []
    while True:
        params = kernel.sample(params)
        now = time.perf_counter() - start
        samples.append(params["w"])
        seconds.append(now)
        if now > budget:
            break
    return Chain(torch.stack(samples), torch.tensor(seconds), setup, kernel.diagnostics())


class _Stop(Exception):
    """Raised by the NUTS hook when the wall-time cap is reached."""


def run_pyro_nuts(ds: Dataset, warmup: int, draws: int, cap: float) -> Chain:
    """Pyro NUTS on the full-data model: ``draws`` post-warmup draws with times (warmup counted), or until ``cap``."""
    samples: list[Tensor] = []
    seconds: list[float] = []
    start = time.perf_counter()

    def hook(kernel: Any, params: dict[str, Tensor], stage: str, i: int) -> None:
        now = time.perf_counter() - start
        if stage == "Sample":
            samples.append(params["w"].detach().clone())
            seconds.append(now)
        if now > cap:
            raise _Stop

    mcmc = MCMC(NUTS(logistic_model_full), num_samples=draws, warmup_steps=warmup, hook_fn=hook,
                disable_progbar=True)
    with contextlib.suppress(_Stop):
        mcmc.run(ds.X, ds.y)
    if not samples:
        return Chain(torch.empty(0, ds.dim), torch.empty(0), 0.0, {"finished_warmup": False})
    return Chain(torch.stack(samples), torch.tensor(seconds), 0.0, {"finished_warmup": True})


def run_numpyro_nuts(ds: Dataset, warmup: int, draws: int, seed: int) -> Chain | None:
    """NumPyro NUTS (JAX on CPU, one thread): warmup, then ``draws`` draws in one call; ``None`` if not installed.

    Compilation counts in the time, as a user experiences it; JAX calls cannot be interrupted, so
    there is no wall-time cap.
    """
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
        from numpyro.infer import MCMC as NMCMC
        from numpyro.infer import NUTS as NNUTS
    except ImportError:
        return None

    def model(X: Any, y: Any) -> None:
        w = numpyro.sample("w", ndist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        numpyro.sample("y", ndist.Bernoulli(logits=X @ w), obs=y)

    X, y = jnp.asarray(ds.X.numpy()), jnp.asarray(ds.y.numpy())
    start = time.perf_counter()
    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=draws, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(seed), X, y)
    warm = time.perf_counter() - start
    mcmc.run(mcmc.post_warmup_state.rng_key, X, y)  # one compiled sampling call
    samples = torch.from_numpy(np.array(mcmc.get_samples()["w"])).float()
    now = time.perf_counter() - start
    # the draws of the sampling call are spread evenly over its time
    return Chain(samples, torch.linspace(warm, now, len(samples) + 1)[1:], 0.0, {"warmup_seconds": warm})


# -- metrics -----------------------------------------------------------------------------------
def curves(chain: Chain, ds: Dataset, ref: dict[str, Any], end: float, offset: float = 0.0) -> dict[str, list]:
    """Risk of the running predictive mean and error of the running posterior mean at log-spaced times."""
    if chain.samples.shape[0] == 0:
        return {"seconds": [], "risk": [], "mean_error": [], "draws": []}
    times = chain.seconds + offset
    first = float(times[0])
    grid = torch.logspace(math.log10(max(first, 1e-3)), math.log10(max(end + offset, first * 1.001)), CHECKPOINTS)
    counts = torch.searchsorted(times, grid, right=True).clamp(min=1)
    probs = torch.sigmoid(ds.Xt @ chain.samples.T).double()  # [test, S]
    running_pred = probs.cumsum(1) / torch.arange(1, probs.shape[1] + 1)
    running_mean = chain.samples.double().cumsum(0) / torch.arange(1, chain.samples.shape[0] + 1)[:, None]
    pick = counts - 1
    risk = ((running_pred[:, pick] - ref["predictive"].double()[:, None]) ** 2).mean(0)
    err = (((running_mean[pick] - ref["mean"].double()) / ref["sd"].double()) ** 2).mean(1).sqrt()
    return {"seconds": grid.tolist(), "risk": risk.tolist(), "mean_error": err.tolist(), "draws": counts.tolist()}


def first_time_below(curve: dict[str, list], key: str, level: float) -> float | None:
    """First checkpoint time at which ``curve[key] <= level`` (None if never)."""
    for t, v in zip(curve["seconds"], curve[key], strict=True):
        if v <= level:
            return t
    return None


def moment_errors(chain: Chain, ref: dict[str, Any]) -> dict[str, float]:
    """Mean over coordinates of |posterior mean error| and |sd error|, both in posterior sds."""
    s = chain.samples.double()
    sd = ref["sd"].double()
    return {
        "mean_error_sd": float(((s.mean(0) - ref["mean"].double()).abs() / sd).mean()),
        "sd_error_sd": float(((s.std(0) - sd).abs() / sd).mean()) if s.shape[0] > 1 else float("nan"),
        "draws": int(s.shape[0]),
    }


# -- the study -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI scale: small data, sub-second budgets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every wall-time budget")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--no-numpyro", action="store_true", help="skip NumPyro NUTS even if installed")
    parser.add_argument("--out", default="experiments/results/logistic_austerity")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace, generator: torch.Generator) -> list[tuple[Callable[[], Dataset], float, str]]:
    """``(make dataset, budget seconds, role)`` per data set; roles: scaling, real, nuts."""
    s = args.budget_scale
    if args.quick:
        return [
            (lambda: synthetic(2_000, 5, generator, 200), 0.2 * s, "scaling"),
            (lambda: synthetic(20_000, 5, generator, 200), 0.25 * s, "scaling"),
            (lambda: coreset_dataset("synth_lr"), 0.15 * s, "real"),
            (lambda: synthetic(20_000, 3, generator, 200), 0.3 * s, "nuts"),
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
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the study; write JSON, markdown and PNG plots; return the JSON record."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    folder = study_folder(args.out, config)
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


def run_dataset(
    ds: Dataset,
    budget: float,
    role: str,
    args: argparse.Namespace,
    generator: torch.Generator,
    rng: random.Random,
    record: dict[str, Any],
) -> dict[str, Any]:
    """All samplers on one data set, in a random order, each for ``budget`` seconds."""
    start = time.perf_counter()
    mode, cov, lik_hessian = laplace_fit(ds)
    laplace_seconds = time.perf_counter() - start
    ref = reference_posterior(ds, mode, cov, 300 if args.quick else (2000 if ds.size <= 200_000 else 500), generator)
    init = mode + torch.linalg.cholesky(cov) @ torch.randn(ds.dim, generator=generator)
    step = 2.38 / math.sqrt(ds.dim)
    model_args = (ds.X, ds.y)

    independent = LaplaceProposal(mode, cov)

    def austerity(eps: float, control: bool, proposal: LaplaceProposal | None = None) -> AusterityMH:
        return AusterityMH(logistic_model, epsilon=eps, batch_size=args.batch_size, step_size=step,
                           adapt_step_size=False, proposal_scale=cov, proposal=proposal,
                           control_variate={"w": mode} if control else None,
                           control_variate_hessian=lik_hessian if control else None)

    def exact(proposal: LaplaceProposal | None = None) -> AusterityMH:
        return AusterityMH(logistic_model_full, epsilon=0.0, step_size=step, adapt_step_size=False,
                           proposal_scale=cov, proposal=proposal, normality_check=False)

    methods: dict[str, Callable[[], Chain | None]] = {
        EXACT: lambda: run_kernel(exact(), ds, init, budget, model_args)
    }
    epsilons = (0.05,) if role == "nuts" else (QUICK_EPSILONS if args.quick else EPSILONS)
    for eps in epsilons:
        methods[f"austerity eps={eps}"] = lambda eps=eps: run_kernel(austerity(eps, True), ds, init, budget, model_args)
    if role != "nuts":
        methods[SEED_TEST] = lambda: run_kernel(austerity(0.05, False), ds, init, budget, model_args)
    else:  # what a user holding a Laplace fit would run: it as an independence proposal
        methods[INDEP_AUSTERITY] = lambda: run_kernel(austerity(0.05, True, independent), ds, init, budget, model_args)
        methods[INDEP_EXACT] = lambda: run_kernel(exact(independent), ds, init, budget, model_args)
    nuts_cap = budget * (3.0 if role == "nuts" else 1.0)
    warmup, draws = (20, 50) if args.quick else (100, 400)
    methods[PYRO_NUTS] = lambda: run_pyro_nuts(ds, warmup, draws, nuts_cap)
    # NumPyro's warmup cannot be interrupted: run it where it fits the budget (smallest scaling set, D=10 study)
    if not args.no_numpyro and not args.quick and (role == "nuts" or (role == "scaling" and ds.size <= 10_000)):
        methods[NUMPYRO_NUTS] = lambda: run_numpyro_nuts(ds, warmup, draws, args.seed)
    order = list(methods)
    rng.shuffle(order)
    runs: dict[str, Any] = {}
    for label in order:
        began = time.perf_counter()
        chain = methods[label]()
        wall = time.perf_counter() - began
        if chain is None:
            record["numpyro_available"] = False
            continue
        if label == NUMPYRO_NUTS:
            record["numpyro_available"] = True
        end = max(float(chain.seconds[-1]) if len(chain.seconds) else budget, budget)
        # austerity's Laplace fit is part of its pipeline: its curves are shifted by the fit's time
        offset = laplace_seconds if label.startswith(OFFSET) else 0.0
        runs[label] = {
            "curves": curves(chain, ds, ref, end, offset),
            "transitions": int(chain.samples.shape[0]),
            "seconds": float(chain.seconds[-1]) if len(chain.seconds) else 0.0,
            "setup_seconds": chain.setup_seconds,
            "wall_seconds": wall,
            "diagnostics": {k: v for k, v in chain.diagnostics.items() if isinstance(v, int | float | bool)},
            "moments": moment_errors(chain, ref) if chain.samples.shape[0] else {},
        }
    return {
        "name": ds.name, "role": role, "N": ds.size, "D": ds.dim, "budget_seconds": budget,
        "laplace_seconds": laplace_seconds, "reference_ess": ref["ess"], "reference_draws": ref["draws"],
        "order": order, "runs": runs,
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
            out["data_fraction_at_N_large"] = aus_big["diagnostics"].get("mean_data_fraction")
        if aus_big and aus_small:
            out["time_per_transition_growth"] = (
                aus_big["diagnostics"]["seconds_per_transition"] / aus_small["diagnostics"]["seconds_per_transition"]
            )
        if aus_big and ex_big and ex_big["curves"]["risk"]:
            level = ex_big["curves"]["risk"][-1]
            t_exact = ex_big["curves"]["seconds"][-1]
            t_aus = first_time_below(aus_big["curves"], "risk", level)
            shared = big["laplace_seconds"]  # both chains use the Laplace fit; their clocks include it
            out["exact_final_risk"] = level
            out["exact_seconds"] = t_exact
            out["austerity_seconds_to_exact_risk"] = t_aus
            out["time_fraction_of_exact"] = None if t_aus is None else t_aus / t_exact
            out["time_fraction_of_exact_excluding_shared_laplace"] = (
                None if t_aus is None else (t_aus - shared) / (t_exact - shared)
            )
    nuts = [d for d in record["datasets"] if d["role"] == "nuts"]
    if nuts:
        d = nuts[0]
        times = {label: first_time_below(run["curves"], "mean_error", 0.1) for label, run in d["runs"].items()}
        caps = {label: run["seconds"] + (d["laplace_seconds"] if label in OFFSET else 0.0)
                for label, run in d["runs"].items()}
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
    """Posterior mean/sd errors (in posterior sds) per ε, on the smallest scaling data set."""
    scaling = sorted((d for d in record["datasets"] if d["role"] == "scaling"), key=lambda d: d["N"])
    if not scaling:
        return []
    d = scaling[0]
    rows = []
    for label in [EXACT, *[f"austerity eps={e}" for e in sorted(EPSILONS)], SEED_TEST]:
        run = d["runs"].get(label)
        if run and run["moments"]:
            rows.append({"dataset": d["name"], "method": label, **run["moments"],
                         "acceptance": run["diagnostics"].get("acceptance_rate")})
    return rows


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    """JSON record, markdown tables and the PNG plots."""
    rows = []
    for d in record["datasets"]:
        for label, run in d["runs"].items():
            diag = run["diagnostics"]
            rows.append({
                "dataset": d["name"], "method": label, "transitions": run["transitions"],
                "ms/transition": 1000 * run["seconds"] / max(run["transitions"], 1),
                "data fraction": diag.get("mean_data_fraction"), "stages": diag.get("mean_stages"),
                "acceptance": diag.get("acceptance_rate"),
                "final risk": run["curves"]["risk"][-1] if run["curves"]["risk"] else None,
                "mean err (sd)": run["moments"].get("mean_error_sd"),
            })
    record["bias"] = bias_rows(record)
    for d in record["datasets"]:  # keep the committed record small: 4 significant digits on the curves
        for run in d["runs"].values():
            run["curves"] = {k: [float(f"{v:.4g}") for v in vals] for k, vals in run["curves"].items()}
    write_json(folder / "logistic_austerity.json", record)
    columns = ["dataset", "method", "transitions", "ms/transition", "data fraction", "stages", "acceptance",
               "final risk", "mean err (sd)"]
    text = ["# Bayesian logistic regression: austerity MH vs exact MH vs NUTS", "",
            markdown_table(rows, columns), "", "## Targets", ""]
    text += [f"- `{k}`: {v}" for k, v in record["targets"].items()]
    text += ["", "## Bias against the reference (posterior sds, mean over coordinates)", "",
             markdown_table(record["bias"], ["dataset", "method", "draws", "acceptance", "mean_error_sd",
                                             "sd_error_sd"])]
    (folder / "logistic_austerity.md").write_text("\n".join(text) + "\n")
    plot_risk(folder, record)
    plot_scaling(folder, record)


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
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "logistic_risk.png", dpi=45)
    plt.close(fig)


def plot_scaling(folder: Path, record: dict[str, Any]) -> None:
    """Time per transition vs N (scaling data sets) and bias vs ε."""
    scaling = sorted((d for d in record["datasets"] if d["role"] == "scaling"), key=lambda d: d["N"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = sorted({label for d in scaling for label in d["runs"] if "NUTS" not in label})
    for label in labels:
        pts = [(d["N"], 1000 * d["runs"][label]["seconds"] / max(d["runs"][label]["transitions"], 1))
               for d in scaling if label in d["runs"]]
        if pts:
            left.loglog(*zip(*pts, strict=True), marker="o", label=label)
    left.set_xlabel("N")
    left.set_ylabel("ms per transition")
    left.legend(fontsize=6)
    bias = [r for r in record["bias"] if r["method"].startswith("austerity eps")]
    if bias:
        eps = [float(r["method"].split("=")[1]) for r in bias]
        right.plot(eps, [r["mean_error_sd"] for r in bias], marker="o", label="|mean error| / sd")
        right.plot(eps, [r["sd_error_sd"] for r in bias], marker="s", label="|sd error| / sd")
        exact = [r for r in record["bias"] if r["method"] == EXACT]
        if exact:
            right.axhline(exact[0]["mean_error_sd"], ls="--", c="k", lw=0.8, label="exact MH, mean error")
        right.set_xlabel("ε")
        right.set_title(bias[0]["dataset"], fontsize=9)
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "logistic_scaling_bias.png", dpi=60)
    plt.close(fig)


if __name__ == "__main__":
    main()
