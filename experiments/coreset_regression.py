"""Study: NUTS on Hilbert coresets vs full-data NUTS for logistic and Poisson regression.

Datasets (``data/coresets_data``; non-constant columns standardised, trailing intercept kept): logistic
regression on phishing, ds1, synth_lr and a synthetic ``N = 1e5`` set (``synth_lr_1e5``, generated from
``--seed``), Poisson regression (softplus link) on biketrips_large, airportdelays_large,
synth_poiss_large. Priors ``beta ~ N(0, I)``.

For each dataset, measured side by side in one process (CPU time, ``time.process_time``):

* a reference posterior: a long NumPyro NUTS run (``bench`` extra) or, without JAX or with ``--quick``,
  the Laplace approximation (the JSON names which);
* full-data Pyro NUTS (``--warmup`` + ``--samples``);
* coresets of size ``M`` for ``--sizes``: uniform subsampling and Frank-Wolfe with fully corrective NNLS
  steps (``pi_hat`` = Laplace on a uniform subsample of ``--pi-subsample`` points, ``J =
  --projection-dim`` Fisher features), then Pyro NUTS on :func:`neuralblock.coresets.weighted_model`;
* NumPyro NUTS on the full data and on the FW coreset of the largest size (when JAX is installed).

Metrics against the reference: posterior-mean error in posterior sds (RMS over coordinates, and max),
relative covariance error (Frobenius), KL between Gaussians fitted to the two sample sets, and the CPU
time (construction included) until the running posterior-mean error stays <= 0.1 posterior sd.
A last section times the coreset construction for ``N = 1e4, 1e5, 1e6`` at ``J = 500``.

Outputs (under ``--out``, in a folder named by a hash of the config): ``coreset_regression.json``,
``coreset_regression.md``, ``coreset_regression_error_vs_M.png``, ``coreset_regression_error_vs_time.png``.

Usage::

    python experiments/coreset_regression.py --quick     # CI scale, tens of seconds
    python experiments/coreset_regression.py --jobs 4    # full run (about 15 CPU minutes)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.infer import MCMC, NUTS  # noqa: E402
from torch import Tensor  # noqa: E402
from tqdm import tqdm  # noqa: E402

from neuralblock.coresets import (  # noqa: E402
    Coreset,
    FrankWolfe,
    HilbertCoreset,
    Projector,
    UniformSampling,
    gaussian_kl,
    laplace_samples,
    weighted_model,
)
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json  # noqa: E402
from neuralblock.io import data_path  # noqa: E402

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


class Timer:
    """Per-iteration CPU timestamps of a Pyro MCMC run (``hook_fn``)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, kernel: Any, params: Any, stage: str, i: int) -> None:
        self.stamps.append(time.process_time())


def pyro_nuts(model: Callable[..., Any], args: tuple[Tensor, ...], warmup: int, samples: int) -> dict[str, Any]:
    """Pyro NUTS: draws ``[S, D]`` and the CPU seconds (from the start) at which each draw was made."""
    timer = Timer()
    start = time.process_time()
    mcmc = MCMC(NUTS(model), num_samples=samples, warmup_steps=warmup, hook_fn=timer, disable_progbar=True)
    mcmc.run(*args)
    stamps = torch.tensor(timer.stamps[warmup:], dtype=torch.float64) - start
    return {"draws": mcmc.get_samples()["beta"].double(), "seconds": stamps}


def numpyro_available() -> bool:
    try:
        import jax  # noqa: F401
        import numpyro  # noqa: F401
    except ImportError:
        return False
    return True


def numpyro_nuts(
    kind: str, x: Tensor, y: Tensor, weights: Tensor | None, warmup: int, samples: int, seed: int
) -> dict[str, Any]:
    """NumPyro NUTS (JAX on CPU) on the (weighted) likelihood; compile time included, draw times interpolated."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS

    jax.config.update("jax_platform_name", "cpu")
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

    start = time.process_time()
    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=samples, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(seed), xj, yj, wj)
    warm = time.process_time() - start
    mcmc.run(mcmc.post_warmup_state.rng_key, xj, yj, wj)
    total = time.process_time() - start
    draws = torch.tensor(np.array(mcmc.get_samples()["beta"]), dtype=torch.float64)
    seconds = warm + (total - warm) * torch.arange(1, samples + 1, dtype=torch.float64) / samples
    return {"draws": draws, "seconds": seconds}


def reference_posterior(kind: str, x: Tensor, y: Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """Long NumPyro NUTS run (or Laplace): mean, covariance and sds of the full-data posterior."""
    if args.reference == "numpyro" and numpyro_available():
        draws = numpyro_nuts(kind, x, y, None, args.ref_warmup, args.ref_samples, args.seed)["draws"]
        method = f"NumPyro NUTS, {args.ref_warmup} warmup + {args.ref_samples} draws"
    else:
        draws = laplace_samples(MODELS[kind], 20_000, model_args=(x, y))["beta"].double()
        method = "Laplace approximation (20000 draws)"
    cov = torch.cov(draws.T)
    return {"mean": draws.mean(0), "cov": cov, "sd": cov.diagonal().sqrt(), "method": method}


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


def build_coreset(method: str, kind: str, x: Tensor, y: Tensor, size: int, args: argparse.Namespace) -> Coreset:
    """Uniform subsample, or FW (+NNLS) on Fisher features with a Laplace-on-a-subsample ``pi_hat``."""
    if method == "uniform":
        return Coreset.from_dense(UniformSampling().solve(None, len(y), size, None))
    model = MODELS[kind]
    pi_hat = laplace_samples(model, args.projection_dim, model_args=(x, y), subsample_size=args.pi_subsample)
    proj = Projector.from_model(model, pi_hat, norm="fisher", model_args=(x, y))
    return HilbertCoreset(proj, FrankWolfe(refine_every=args.refine_every)).build(size)


def warm_up(kind: str) -> None:
    """Pay the one-time costs (forward-mode AD decompositions, lazy imports) outside every timed section."""
    x, y = synthetic_logistic(20, 3, 0)
    Projector.from_model(MODELS[kind], {"beta": torch.zeros(2, 3)}, model_args=(x, y)).project()


def run_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Reference, full-data NUTS, coresets + NUTS (Pyro, and NumPyro if available) for one dataset."""
    warm_up(load_kind(name))
    pyro.set_rng_seed(args.seed)
    kind, x, y = load_dataset(name, args.seed)
    model = MODELS[kind]
    ref = reference_posterior(kind, x, y, args)
    out: dict[str, Any] = {"kind": kind, "num_data": len(y), "dim": x.shape[1], "reference": ref["method"]}
    out["full_pyro"] = score(pyro_nuts(model, (x, y), args.warmup, args.samples), ref)
    sizes = [m for m in args.sizes if m < len(y)]
    out["sizes"] = sizes
    out["coresets"] = {}
    built: dict[int, tuple[Coreset, float]] = {}
    for method in ("uniform", "fw"):
        rows = []
        for size in sizes:
            start = time.process_time()
            core = build_coreset(method, kind, x, y, size, args)
            build_seconds = time.process_time() - start
            built[size] = (core, build_seconds)  # the FW ones (built last) are re-used for NumPyro
            run = pyro_nuts(weighted_model(model, core), (x, y), args.warmup, args.samples)
            rows.append(
                {
                    "size": size,
                    "support": len(core.indices),
                    "build_seconds": build_seconds,
                    **score(run, ref, offset=build_seconds),
                }
            )
        out["coresets"][method] = rows
    if sizes and args.numpyro and numpyro_available():
        size = sizes[-1]
        core, build_seconds = built[size]
        full = numpyro_nuts(kind, x, y, None, args.warmup, args.samples, args.seed)
        dense = core.dense(len(y))
        support = dense > 0
        coreset_run = numpyro_nuts(kind, x[support], y[support], dense[support], args.warmup, args.samples, args.seed)
        out["numpyro"] = {
            "size": size,
            "full": score(full, ref),
            "coreset": {"build_seconds": build_seconds, **score(coreset_run, ref, build_seconds)},
        }
    return out


def time_ratio(coreset: dict[str, Any], full: dict[str, Any]) -> float | None:
    """Coreset CPU time to the tolerance over the full run's (``None`` if either never reaches it)."""
    if coreset["seconds_to_tolerance"] is None or full["seconds_to_tolerance"] is None:
        return None
    return coreset["seconds_to_tolerance"] / full["seconds_to_tolerance"]


def construction_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """CPU seconds of pi_hat + projection + FW for growing N (synthetic logistic, D = 5)."""
    warm_up("logistic")
    rows = []
    for num in args.scaling_sizes:
        x, y = synthetic_logistic(num, 5, args.seed)
        pyro.set_rng_seed(args.seed)
        start = time.process_time()
        pi_hat = laplace_samples(logistic_model, args.scaling_dim, model_args=(x, y), subsample_size=args.pi_subsample)
        t_pi = time.process_time()
        proj = Projector.from_model(logistic_model, pi_hat, norm="fisher", model_args=(x, y))
        coreset = HilbertCoreset(proj, FrankWolfe())
        _ = coreset.features
        t_proj = time.process_time()
        coreset.build(args.scaling_coreset)
        t_fw = time.process_time()
        del coreset, proj
        rows.append(
            {
                "N": num,
                "pi_hat_seconds": t_pi - start,
                "projection_seconds": t_proj - t_pi,
                "fw_seconds": t_fw - t_proj,
                "total_seconds": t_fw - start,
                "microseconds_per_datum": 1e6 * (t_fw - start) / num,
            }
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=DEFAULT_ORDER, choices=LOGISTIC + POISSON)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--projection-dim", type=int, default=200, help="J for the regression coresets")
    parser.add_argument("--pi-subsample", type=int, default=2000, help="Laplace pi_hat on this many points")
    parser.add_argument("--refine-every", type=int, default=20, help="FW fully corrective NNLS period")
    parser.add_argument("--reference", choices=["numpyro", "laplace"], default="numpyro")
    parser.add_argument("--ref-warmup", type=int, default=200)
    parser.add_argument("--ref-samples", type=int, default=1000)
    parser.add_argument("--no-numpyro", dest="numpyro", action="store_false", help="skip the NumPyro timings")
    parser.add_argument("--scaling-sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--scaling-dim", type=int, default=500, help="J for the construction-time scaling")
    parser.add_argument("--scaling-coreset", type=int, default=20, help="M for the construction-time scaling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="datasets run in this many processes")
    parser.add_argument("--quick", action="store_true", help="CI scale: synth_lr only, Laplace reference")
    parser.add_argument("--out", default="experiments/results/coreset_regression")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.sizes = ["synth_lr"], [30, 100]
        args.warmup, args.samples, args.projection_dim, args.pi_subsample = 25, 25, 50, 300
        args.reference, args.numpyro, args.jobs = "laplace", False, 1
        args.scaling_sizes, args.scaling_dim, args.scaling_coreset = [1000, 10_000], 50, 10
    return args


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    results, args = record["datasets"], record["config"]
    rows = []
    for name, res in results.items():
        fw = {row["size"]: row for row in res["coresets"]["fw"]}
        uni = {row["size"]: row for row in res["coresets"]["uniform"]}
        m = res["sizes"][-1] if res["sizes"] else None
        row = {
            "dataset": name,
            "N": res["num_data"],
            "full NUTS err (sd)": res["full_pyro"]["mean_error_rms_sd"],
            "full NUTS s": res["full_pyro"]["total_seconds"],
            "M": m,
        }
        if m is not None:
            row.update(
                {
                    "uniform err": uni[m]["mean_error_rms_sd"],
                    "FW err": fw[m]["mean_error_rms_sd"],
                    "FW cov err": fw[m]["cov_rel_error"],
                    "FW KL": fw[m]["gaussian_kl"],
                    "FW build s": fw[m]["build_seconds"],
                    "FW total s": fw[m]["total_seconds"],
                    "time ratio (Pyro)": time_ratio(fw[m], res["full_pyro"]),
                }
            )
        if "numpyro" in res:
            row["time ratio (NumPyro)"] = time_ratio(res["numpyro"]["coreset"], res["numpyro"]["full"])
        rows.append(row)
    columns = [
        "dataset",
        "N",
        "M",
        "full NUTS err (sd)",
        "uniform err",
        "FW err",
        "FW cov err",
        "FW KL",
        "full NUTS s",
        "FW build s",
        "FW total s",
        "time ratio (Pyro)",
        "time ratio (NumPyro)",
    ]
    scaling = record["construction_scaling"]
    text = [
        "# Coreset regression: NUTS on coresets vs full-data NUTS",
        "",
        f"Pyro NUTS {args['warmup']} warmup + {args['samples']} draws everywhere; errors against the reference "
        "(per dataset in the JSON); `err` = RMS over coordinates of |posterior-mean error| / posterior sd; "
        "`cov err` = relative Frobenius error; `KL` = KL(fitted Gaussian of coreset draws || reference's). "
        "`time ratio` = CPU seconds until the running mean error stays <= 0.1 sd, coreset (construction "
        "included) over full data; empty when either never gets there within its run. FW = Frank-Wolfe with "
        f"NNLS steps every {args['refine_every']} iterations, J={args['projection_dim']} Fisher features, "
        f"pi_hat = Laplace on {args['pi_subsample']} points.",
        "",
        markdown_table(rows, columns, spec=".3g"),
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
        target = {
            "dataset": "synth_lr_1e5",
            "size": 500,
            "fw_mean_error_rms_sd": fw["mean_error_rms_sd"],
            "time_ratio_pyro": ratio,
            "total_time_ratio_pyro": fw["total_seconds"] / headline["full_pyro"]["total_seconds"],
            "met": ratio is not None and ratio <= 0.2,
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
