"""Study: ARMA(1,1) with Light and Widely Applicable MCMC (informed sub-sampling) against exact MH.

Data: a synthetic ARMA(1,1) series ``y_t = phi y_{t-1} + e_t + theta e_{t-1}``, ``e_t ~ N(0, sigma^2)``,
of length ``N`` (1e6 in the full run) at ``θ* = (phi, theta, sigma) = (0.5, 0.7, 0.1)`` (our reading of
the seed paper's example: AR coefficient, MA coefficient, noise scale; the mean is known, 0).

Model (Stan's posteriordb ``arma11`` with its priors: ``phi, theta ~ N(0, 2)``, ``mu ~ N(0, 10)``,
``sigma ~ HalfCauchy(2.5)``): the conditional likelihood of a window ``y_s..y_{s+n-1}`` restarts the
error recursion at the window start, ``err_{s-1} = 0``, given ``y_{s-1}`` (``y_{-1} = mu`` at the
series start, as in Stan). The Pyro model receives the window's contiguous indices from the plate.

Methods, all :class:`~neuralblock.kernels.lwa.LWAKernel` runs on windows from the same far start
``(phi, theta, sigma) = (0, 0, 1)``: *exact MH* is the kernel with ``n = N`` (the full data each
iteration); LWA runs on ``n in {100, 1000, 10000}``, ``ε in {1, 1e-2, 1e-4}`` and summary sets
S0 (mean, quantiles 0.2/0.8, autocorrelations 1-3), S1 (autocorrelations 1-3), S2 (min, max).
Runs are interleaved in rounds so they share the machine's noise; each gets a wall-time budget
(exact MH a longer one, so that its time to the high-density region is observed). Exact MH and the
two headline LWA configurations (n = 1000 and n = 100 at ε = 1e-2 with S0) run ``--replicates``
chains; speed-ups compare median times (a chain that never gets there counts as infinitely late).

Reference posterior at ``N``: the conditional MLE with its Laplace (observed information)
covariance; with N = 1e6 the prior is negligible. *Reaching the high-density region* (HDR) is
the first time the chain's state satisfies ``max_j |θ_j - m_j| / s_j <= 2`` (strict: ``s_j`` the
reference posterior sd) or ``max_j |θ_j - m_j| / (s_j sqrt(N / 1000)) <= 2`` (coarse: the 2-sd box
of a posterior from 1000 points, the resolution an n = 1000 sub-posterior can have).
Posterior summaries use the second half (in time) of each run.

Posteriordb check: exact MH (the kernel with ``n = T = 200``) on ``arma-arma11`` against the
reference draws' means, z-scores with our MCSE (sd / sqrt(ESS), Pyro's multi-chain ESS) and the
reference draws' batch-means MCSE; split R-hat over our chains.

Usage::

    python experiments/arma_lwa.py --quick       # CI scale, about 20 s
    python experiments/arma_lwa.py               # full run (about 15 minutes on a loaded 2-core machine)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import zipfile
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from scipy.optimize import minimize
from scipy.signal import lfilter
from torch import Tensor
from tqdm import tqdm

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json
from neuralblock.io import data_path
from neuralblock.kernels.lwa import LWAKernel
from neuralblock.kernels.summaries import Autocorrelations, Combine, Means, MinMax, Quantiles, SummaryFn

PARAMS = ("phi", "theta", "sigma")
TRUE_THETA = (0.5, 0.7, 0.1)
FAR_START = (0.0, 0.0, 1.0)
SUMMARY_SETS: dict[str, SummaryFn] = {
    "S0": Combine(Means(), Quantiles([0.2, 0.8]), Autocorrelations([1, 2, 3])),
    "S1": Autocorrelations([1, 2, 3]),
    "S2": MinMax(),
}


# -- the model -----------------------------------------------------------------------------
def arma_residuals(y: Tensor, start: int, length: int, mu: Tensor, phi: Tensor, theta: Tensor) -> Tensor:
    """Errors ``err_t`` of the window ``y[start:start+length]`` with the recursion restarted there.

    ``err_t = y_t - mu - phi y_{t-1} - theta err_{t-1}``, ``err_{start-1} = 0`` and ``y_{-1} = mu``.
    The linear recursion runs in C (``scipy.signal.lfilter``), so no gradient flows through it.
    """
    window = y[start : start + length]
    prev = y[start - 1 : start] if start > 0 else torch.as_tensor(mu, dtype=y.dtype).reshape(1)
    drive = window - mu - phi * torch.cat([prev, window[:-1]])
    err = lfilter([1.0], [1.0, float(theta)], drive.detach().cpu().numpy())
    return torch.from_numpy(np.asarray(err)).to(y.dtype)


def arma11_model(y: Tensor, mu: float | None = None) -> None:
    """ARMA(1,1) with posteriordb's priors; the data plate's indices must be one contiguous window.

    Args:
        y: the series.
        mu: the known mean, or None to sample it (``mu ~ N(0, 10)``).
    """
    mu_value = pyro.sample("mu", dist.Normal(0.0, 10.0)) if mu is None else torch.tensor(float(mu), dtype=y.dtype)
    phi = pyro.sample("phi", dist.Normal(0.0, 2.0))
    theta = pyro.sample("theta", dist.Normal(0.0, 2.0))
    sigma = pyro.sample("sigma", dist.HalfCauchy(2.5))
    with pyro.plate("data", len(y)) as idx:
        start, length = int(idx[0]), len(idx)
        if int(idx[-1]) - start != length - 1:
            raise ValueError("arma11_model evaluates contiguous windows only (use LWAKernel(subset='window'))")
        window = y[start : start + length]
        err = arma_residuals(y, start, length, mu_value, phi, theta)
        pyro.sample("y", dist.Normal(window - err, sigma), obs=window)


def simulate_arma(num: int, theta: tuple[float, float, float], seed: int) -> Tensor:
    """``num`` points of a zero-mean ARMA(1,1) at ``(phi, theta, sigma)`` after a 1000-step burn-in."""
    phi, ma, sigma = theta
    noise = np.random.default_rng(seed).normal(0.0, sigma, num + 1000)
    return torch.from_numpy(lfilter([1.0, ma], [1.0, -phi], noise)[1000:].copy())


# -- the reference posterior ------------------------------------------------------------------
def _loglik(y: np.ndarray, phi: float, theta: float, sigma: float) -> float:
    drive = y - phi * np.concatenate([[0.0], y[:-1]])
    err = lfilter([1.0], [1.0, theta], drive)
    return float(-0.5 * np.sum(err**2) / sigma**2 - len(y) * math.log(sigma) - 0.5 * len(y) * math.log(2 * math.pi))


def laplace_reference(y: Tensor) -> dict[str, list[float]]:
    """Conditional MLE of ``(phi, theta, sigma)`` (mean known, 0) and the observed-information sd."""
    arr = y.double().numpy()

    def profile(x: np.ndarray) -> float:  # sigma profiled out
        if abs(x[1]) >= 1:
            return float("inf")
        drive = arr - x[0] * np.concatenate([[0.0], arr[:-1]])
        return float(np.mean(lfilter([1.0], [1.0, x[1]], drive) ** 2))

    res = minimize(profile, np.array([0.3, 0.3]), method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-12})
    mle = np.array([res.x[0], res.x[1], math.sqrt(res.fun)])
    hess = np.zeros((3, 3))
    h = 1e-4
    for i in range(3):
        for j in range(3):
            shifts = [(1, 1), (1, -1), (-1, 1), (-1, -1)]
            vals = []
            for a, b in shifts:
                x = mle.copy()
                x[i] += a * h
                x[j] += b * h
                vals.append(_loglik(arr, *x))
            hess[i, j] = (vals[0] - vals[1] - vals[2] + vals[3]) / (4 * h * h)
    cov = np.linalg.inv(-hess)
    return {"mean": mle.tolist(), "sd": np.sqrt(np.diag(cov)).tolist()}


# -- runs ---------------------------------------------------------------------------------
class Run:
    """One chain advanced in time slices; keeps the elapsed sampling time and the constrained draws."""

    def __init__(self, label: str, kernel: LWAKernel, y: Tensor, warmup: int) -> None:
        self.label, self.kernel = label, kernel
        start = zip(PARAMS, FAR_START, strict=True)
        kernel.initial_params = {name: unconstrained(name, value) for name, value in start}
        kernel.setup(warmup, y, mu=0.0)
        self.params = kernel.initial_params
        self.elapsed = 0.0
        self.times: list[float] = []
        self.draws: list[list[float]] = []

    def advance(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            self.params = self.kernel.sample(self.params)
            self.elapsed += time.perf_counter() - start
            self.times.append(self.elapsed)
            self.draws.append([float(self.kernel.transforms[k].inv(self.params[k])) for k in PARAMS])


def unconstrained(name: str, value: float) -> Tensor:
    """Unconstrained value of a site of :func:`arma11_model` (log for the scale ``sigma``)."""
    return torch.tensor(math.log(value) if name == "sigma" else value, dtype=torch.float64)


def first_entry(times: np.ndarray, dist_sd: np.ndarray, radius: float = 2.0) -> float | None:
    """Elapsed time of the first draw whose scaled distance is within ``radius`` (None: never)."""
    hit = np.nonzero(dist_sd <= radius)[0]
    return float(times[hit[0]]) if hit.size else None


def summarise(run: Run, ref: dict[str, list[float]], num_data: int) -> dict:
    times, draws = np.asarray(run.times), np.asarray(run.draws)
    mean_ref, sd_ref = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    scaled = np.abs(draws - mean_ref) / sd_ref
    coarse = scaled / math.sqrt(num_data / 1000)
    half = draws[times >= times[-1] / 2]
    post_mean, post_sd = half.mean(0), half.std(0)
    true = np.asarray(TRUE_THETA)
    diag = run.kernel.diagnostics()
    return {
        "label": run.label,
        "iterations": len(times),
        "seconds": float(times[-1]),
        "t_hdr_strict": first_entry(times, scaled.max(1)),
        "t_hdr_coarse": first_entry(times, coarse.max(1)),
        "post_mean": post_mean.tolist(),
        "post_sd": post_sd.tolist(),
        "z_true_own_sd": ((post_mean - true) / np.maximum(post_sd, 1e-12)).tolist(),
        "z_true_exact_sd": ((post_mean - true) / sd_ref).tolist(),
        "z_ref_exact_sd": ((post_mean - mean_ref) / sd_ref).tolist(),
        "theta_acceptance": diag["theta_acceptance_rate"],
        "subset_acceptance": diag["subset_acceptance_rate"],
        "refresh_rate": diag["subset_refresh_rate"],
    }


def _median(values: list[float | None]) -> float | None:
    """Median with censored (None = never reached) values counted as +inf; None when the median is censored."""
    ordered = sorted(math.inf if v is None else v for v in values)
    mid = len(ordered) // 2
    med = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return None if math.isinf(med) else med


def headline_summary(rows: list[dict], exact_hdr: dict, args: argparse.Namespace) -> dict:
    """The issue's targets, measured: HDR speed-up at n = 1000 and the n = 100 posterior means."""
    out: dict = {"exact_t_hdr_coarse": exact_hdr["t_hdr_coarse"], "exact_t_hdr_strict": exact_hdr["t_hdr_strict"]}
    for n in (1000, 100):
        reps = [r for r in rows if r["label"].startswith(f"n={n} eps=0.01 S0 ")]
        if not reps:
            continue
        t_lwa = _median([r["t_hdr_coarse"] for r in reps])
        out[f"n{n}_t_hdr_coarse"] = t_lwa
        out[f"n{n}_speedup_coarse"] = (
            exact_hdr["t_hdr_coarse"] / t_lwa if exact_hdr["t_hdr_coarse"] is not None and t_lwa else None
        )
        out[f"n{n}_max_abs_z_true_own_sd"] = [max(abs(z) for z in r["z_true_own_sd"]) for r in reps]
        out[f"n{n}_max_abs_z_true_exact_sd"] = [max(abs(z) for z in r["z_true_exact_sd"]) for r in reps]
    return out


def thin(run: Run, points: int = 60) -> dict:
    idx = np.unique(np.geomspace(1, len(run.times), points).astype(int) - 1)
    return {"t": [round(run.times[i], 4) for i in idx], "theta": [[round(v, 5) for v in run.draws[i]] for i in idx]}


# -- posteriordb ------------------------------------------------------------------------------
def posteriordb_check(chains: int, warmup: int, samples: int, seed: int) -> dict:
    """Exact MH (n = T) on posteriordb arma-arma11 against the reference draws.

    Chains start from Stan's default inits (uniform on (-2, 2) in the unconstrained space).
    """
    folder = data_path("posteriordb", "arma-arma11")
    with zipfile.ZipFile(folder / "arma.data.json.zip") as z:
        data = json.loads(z.read(z.namelist()[0]))
    with zipfile.ZipFile(folder / "arma-arma11.draws.json.zip") as z:
        ref_chains = json.loads(z.read(z.namelist()[0]))
    y = torch.tensor(data["y"], dtype=torch.float64)
    names = ["mu", "phi", "theta", "sigma"]
    ref = {k: torch.tensor([c[k] for c in ref_chains], dtype=torch.float64) for k in names}  # [10, 1000]
    draws = []
    for c in range(chains):
        pyro.set_rng_seed(seed + 100 + c)
        kernel = LWAKernel(arma11_model, subset_size=len(y), subset="window", epsilon=math.inf, step_size=0.02)
        kernel.initial_params = {k: torch.rand((), dtype=torch.float64) * 4 - 2 for k in names}  # Stan's inits
        mcmc = pyro.infer.MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True)
        mcmc.run(y)
        s = mcmc.get_samples()
        draws.append(torch.stack([s[k].double() for k in names], -1))
    ours = torch.stack(draws)  # [chains, samples, 4]
    mean = ours.mean((0, 1))
    ess = effective_sample_size(ours, chain_dim=0, sample_dim=1)
    mcse = ours.reshape(-1, 4).std(0) / ess.sqrt()
    ref_all = torch.stack([ref[k] for k in names], -1)  # [10, 1000, 4]
    ref_mean, ref_mcse = batch_means_mcse(ref_all)
    z = (mean - ref_mean) / (mcse.square() + ref_mcse.square()).sqrt()
    r_hat = split_gelman_rubin(ours, chain_dim=0, sample_dim=1) if chains > 1 else torch.full((4,), math.nan)
    return {
        "chain_means": ours.mean(1).tolist(),
        "ess": ess.tolist(),
        "r_hat": r_hat.tolist(),
        "params": names,
        "mean": mean.tolist(),
        "mcse": mcse.tolist(),
        "ref_mean": ref_mean.tolist(),
        "ref_sd": ref_all.reshape(-1, 4).std(0).tolist(),
        "sd": ours.reshape(-1, 4).std(0).tolist(),
        "ref_mcse": ref_mcse.tolist(),
        "z": z.tolist(),
        "chains": chains,
        "samples": samples,
        "warmup": warmup,
    }


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-data", type=int, default=1_000_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 1e-2, 1e-4])
    parser.add_argument("--sets", nargs="+", default=["S0", "S1", "S2"], choices=sorted(SUMMARY_SETS))
    parser.add_argument("--budget", type=float, default=15.0, help="sampling seconds per LWA run")
    parser.add_argument("--exact-budget", type=float, default=120.0, help="sampling seconds per exact MH chain")
    parser.add_argument("--rounds", type=int, default=10, help="interleaving rounds")
    parser.add_argument("--replicates", type=int, default=2, help="chains for exact MH and the headline LWA configs")
    parser.add_argument("--warmup", type=int, default=1000, help="adaptation iterations")
    parser.add_argument("--pdb-chains", type=int, default=4)
    parser.add_argument("--pdb-warmup", type=int, default=3000)
    parser.add_argument("--pdb-samples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI scale (N = 20000, a few configs, ~20 s)")
    parser.add_argument("--out", default="experiments/results/arma_lwa")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_data, args.sizes, args.epsilons, args.sets = 20_000, [100, 1000], [1e-2], ["S0"]
        args.budget, args.exact_budget, args.rounds, args.warmup, args.replicates = 0.6, 1.2, 2, 200, 1
        args.pdb_chains, args.pdb_warmup, args.pdb_samples = 1, 300, 600
    if min(args.sizes) < 10 or max(args.sizes) > args.num_data:
        raise ValueError(f"sizes must lie in [10, num_data={args.num_data}], got {args.sizes}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    config = {k: v for k, v in vars(args).items() if k not in {"out", "no_progress"}}
    folder = study_folder(args.out, config)
    pyro.set_rng_seed(args.seed)
    y = simulate_arma(args.num_data, TRUE_THETA, args.seed)
    start = time.perf_counter()
    ref = laplace_reference(y)
    ref["seconds"] = time.perf_counter() - start
    headline = {(1000, 1e-2, "S0"), (100, 1e-2, "S0")}
    runs = [
        Run(f"exact #{r}", LWAKernel(arma11_model, args.num_data, subset="window", epsilon=math.inf), y, args.warmup)
        for r in range(args.replicates)
    ]
    for n in args.sizes:
        for eps in args.epsilons:
            for name in args.sets:
                for r in range(args.replicates if (n, eps, name) in headline else 1):
                    kernel = LWAKernel(arma11_model, n, subset="window", epsilon=eps, summaries=SUMMARY_SETS[name])
                    runs.append(Run(f"n={n} eps={eps:g} {name} #{r}", kernel, y, args.warmup))
    order = random.Random(args.seed)
    total = args.exact_budget + args.budget * (len(runs) - 1)
    with tqdm(total=round(total), disable=args.no_progress, desc="arma_lwa", unit="s") as bar:
        for _ in range(args.rounds):
            for run in order.sample(runs, len(runs)):
                share = (args.exact_budget if run.label.startswith("exact") else args.budget) / args.rounds
                run.advance(share)
                bar.update(share)
    rows = [summarise(run, ref, args.num_data) for run in runs]
    exact_rows = [row for row in rows if row["label"].startswith("exact")]
    exact_hdr = {key: _median([row[key] for row in exact_rows]) for key in ("t_hdr_strict", "t_hdr_coarse")}
    for row, run in zip(rows, runs, strict=True):
        row["n"] = run.kernel.subset_size
        for key, value in exact_hdr.items():  # censored (None) when an exact chain never got there
            row[f"speedup_{key[6:]}"] = value / row[key] if value is not None and row[key] is not None else None
    # exact MH's states at LWA's time budget (equal time)
    at_budget = []
    for run in runs[: args.replicates]:
        times = np.asarray(run.times)
        before = np.asarray(run.draws)[times <= args.budget]
        at_budget.append(before[-1].tolist() if len(before) else None)
    summary = headline_summary(rows, exact_hdr, args)
    pdb = posteriordb_check(args.pdb_chains, args.pdb_warmup, args.pdb_samples, args.seed)
    record = {
        "config": config,
        "true_theta": dict(zip(PARAMS, TRUE_THETA, strict=True)),
        "far_start": dict(zip(PARAMS, FAR_START, strict=True)),
        "reference": ref,
        "exact_t_hdr_median": exact_hdr,
        "exact_state_at_lwa_budget": at_budget,
        "targets": summary,
        "runs": rows,
        "traces": {run.label: thin(run) for run in runs},
        "posteriordb": pdb,
    }
    write_json(folder / "arma_lwa.json", record)
    write_markdown(folder / "arma_lwa.md", record)
    plot(folder, runs, ref, args)
    return record


def write_markdown(path: Path, record: dict) -> None:
    table_rows = []
    for row in record["runs"]:
        table_rows.append(
            {
                "method": row["label"],
                "iters": row["iterations"],
                "t_hdr coarse (s)": row["t_hdr_coarse"],
                "t_hdr strict (s)": row["t_hdr_strict"],
                "speedup coarse": row["speedup_coarse"],
                "mean phi": row["post_mean"][0],
                "mean theta": row["post_mean"][1],
                "mean sigma": row["post_mean"][2],
                "max |z| vs θ* (own sd)": max(abs(z) for z in row["z_true_own_sd"]),
                "max |z| vs θ* (exact sd)": max(abs(z) for z in row["z_true_exact_sd"]),
                "U refresh": row["refresh_rate"],
            }
        )
    columns = list(table_rows[0])
    pdb = record["posteriordb"]
    cols = {"mean": "mean", "mcse": "mcse", "ref mean": "ref_mean", "ref mcse": "ref_mcse", "sd": "sd"}
    cols.update({"ref sd": "ref_sd", "z": "z", "r_hat": "r_hat", "ess": "ess"})
    pdb_rows = [{"param": p, **{c: pdb[k][i] for c, k in cols.items()}} for i, p in enumerate(pdb["params"])]
    ref = record["reference"]
    text = [
        "# ARMA(1,1) with LWA vs exact MH",
        "",
        f"N = {record['config']['num_data']}, θ* = {record['true_theta']}, start {record['far_start']}.",
        f"Reference posterior (MLE + Laplace): mean {[round(v, 5) for v in ref['mean']]}, "
        f"sd {[f'{v:.2e}' for v in ref['sd']]}.",
        "",
        markdown_table(table_rows, columns),
        "",
        "## posteriordb arma-arma11: exact MH (LWAKernel with n = T) vs reference draws",
        "",
        markdown_table(pdb_rows, list(pdb_rows[0])),
        "",
    ]
    path.write_text("\n".join(text))


def plot(folder: Path, runs: list[Run], ref: dict, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    focus = ["exact #0"] + [r.label for r in runs if r.label.endswith("eps=0.01 S0 #0")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for run in runs:
        if run.label not in focus:
            continue
        data = thin(run, 400)
        t, th = np.asarray(data["t"]), np.asarray(data["theta"])
        for j, ax in enumerate(axes):
            ax.plot(t, th[:, j], label=run.label, lw=1)
    for j, ax in enumerate(axes):
        ax.axhline(ref["mean"][j], color="k", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("sampling time (s)")
        ax.set_title(PARAMS[j])
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "arma_lwa_traces.png", dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [r.label for r in runs]
    errs = []
    for run in runs:
        draws, times = np.asarray(run.draws), np.asarray(run.times)
        half = draws[times >= times[-1] / 2]
        errs.append(float(np.max(np.abs(half.mean(0) - np.asarray(TRUE_THETA)) / np.asarray(ref["sd"]))))
    ax.barh(range(len(labels)), errs)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("max_j |posterior mean - θ*| / exact posterior sd")
    fig.tight_layout()
    fig.savefig(folder / "arma_lwa_bias.png", dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
