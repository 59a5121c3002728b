"""Benchmark (issue 21): the direct likelihood path against Pyro runs, side by side in one process.

Three measurements, each an interleaved A/B (arms alternate in rounds, medians of the rounds):

1. **Per-section evaluation** at ``P = 2`` points (``θ`` and ``θ'``) on ``k = 100`` sections of a logistic
   regression (``N = 1e5``, ``D = 10``), written three ways: the README's ``X[idx] @ w`` (does not broadcast
   a batch of ``w``: two Pyro runs), a broadcasting ``(X[idx] * w).sum(-1)`` (one run), and a plain
   ``obs=y`` plate (the Pyro path evaluates all ``N``). Arms: ``SectionEvaluator(direct=False)`` (the
   section evaluator before issue 21), the direct path, and a hand-written torch likelihood (the floor
   rule's fused prototype).
2. **AusterityMH per transition**, logistic ``N = 1e6`` (``1e5`` with ``--quick``), ``ε = 0.05``, defaults
   (control variate at the mode, Laplace walk), against exact MH (``ε = 0``, same walk, full data through the
   direct path); plus the mean data fraction, the audited decision error rate and the acceptance rates.
3. **Pyro NUTS per iteration** with the model vs with the direct path's ``potential_fn``, at ``N = 500``
   (a coreset's size) and ``N = 1e5``; the ratio of the two sizes is the speed-up a coreset can give.

Usage::

    python benchmarks/global_speed.py --quick   # ~1 min
    python benchmarks/global_speed.py           # ~5 min; writes experiments/results/global_speed/
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from torch import Tensor

from neuralblock.kernels.austerity import AusterityMH
from neuralblock.subsample import SectionEvaluator
from neuralblock.subsample.likelihood import LogLikelihood

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results" / "global_speed"


def logistic_data(n: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    """Synthetic logistic data with correlated features (``Σ_ij = 0.5^|i-j|``)."""
    gen = torch.Generator().manual_seed(seed)
    cov = torch.tensor([[0.5 ** abs(i - j) for j in range(d)] for i in range(d)])
    X = torch.randn(n, d, generator=gen) @ torch.linalg.cholesky(cov).T
    y = torch.bernoulli(torch.sigmoid(X @ torch.linspace(-1.0, 1.0, d)), generator=gen)
    return X, y


def model_matmul(X: Tensor, y: Tensor) -> None:
    """The README's form: ``X[idx] @ w``."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def model_broadcast(X: Tensor, y: Tensor) -> None:
    """Broadcasts a leading batch of ``w``."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(X[idx] * w.unsqueeze(-2)).sum(-1)), obs=y[idx])


def model_plain(X: Tensor, y: Tensor) -> None:
    """A plain ``obs=y`` plate (ignores the indices)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def interleaved(arms: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of the mean seconds per call of each arm, arms alternating within a round."""
    for fn in arms.values():
        for _ in range(max(calls // 10, 2)):
            fn()
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in times.items()}


def section_evaluation(quick: bool) -> list[dict[str, Any]]:
    n, d, k = 100_000, 10, 100
    X, y = logistic_data(n, d, 0)
    w = torch.randn(2, d) * 0.1
    idx = torch.randperm(n)[:k]
    rows = []
    for model in (model_matmul, model_broadcast, model_plain):
        old = SectionEvaluator(model, "data", n, args=(X, y), direct=False)
        new = SectionEvaluator(model, "data", n, args=(X, y))
        values = {"w": w[0]}
        with torch.no_grad():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                old.check_lazy(values)
            new.check_lazy(values)
            old.check_vectorized({}, {"w": w})
            new.check_vectorized({}, {"w": w})
            got = new.evaluate_many({}, {"w": w}, idx, with_global=False).sections
            want = old.evaluate_many({}, {"w": w}, idx, with_global=False).sections
            if not torch.allclose(got, want, atol=1e-4):
                gap = float((got - want).abs().max())
                raise RuntimeError(f"{model.__name__}: the direct path differs from the Pyro path by {gap:.2e}")

            def torch_floor() -> Tensor:
                logits = X[idx] @ w.T
                return -torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, y[idx].unsqueeze(-1).expand_as(logits), reduction="none"
                )

            arms = {
                "section_evaluator": lambda ev=old: ev.evaluate_many({}, {"w": w}, idx, with_global=False),
                "direct_path": lambda ev=new: ev.evaluate_many({}, {"w": w}, idx, with_global=False),
                "torch_floor": torch_floor,
            }
            t = interleaved(arms, 50 if quick else 200, 3 if quick else 7)
        rows.append(
            {
                "model": model.__name__,
                "pyro_lazy": old.lazy,
                "pyro_vectorized": old.vectorized,
                "us_section_evaluator": 1e6 * t["section_evaluator"],
                "us_direct_path": 1e6 * t["direct_path"],
                "us_torch_floor": 1e6 * t["torch_floor"],
                "speedup": t["section_evaluator"] / t["direct_path"],
                "direct_over_floor": t["direct_path"] / t["torch_floor"],
            }
        )
    return rows


def austerity_vs_exact(quick: bool) -> dict[str, Any]:
    n, d = (100_000 if quick else 1_000_000), 10
    X, y = logistic_data(n, d, 1)
    steps = 150 if quick else 400
    out: dict[str, Any] = {"N": n, "D": d, "transitions": steps}
    kernels: dict[str, AusterityMH] = {}
    params: dict[str, dict[str, Tensor]] = {}
    for name, eps in (("austerity", 0.05), ("exact", 0.0)):
        pyro.set_rng_seed(0)
        start = time.perf_counter()
        kernel = AusterityMH(model_matmul, epsilon=eps, audit_every=50, normality_check=False)
        kernel.setup(0, X, y)
        out[f"{name}_setup_s"] = time.perf_counter() - start
        kernels[name], params[name] = kernel, kernel.initial_params
    exact = kernels["exact"]
    laplace = kernels["austerity"]._scale  # the same walk for exact MH: the Laplace Cholesky factor
    exact._scale = laplace
    exact.adapter.log_step.fill_(float(torch.log(torch.tensor(kernels["austerity"].step_size))))
    for name, kernel in kernels.items():  # untimed warm-up: builds the graphs of every stage size (timed apart)
        start = time.perf_counter()
        for _ in range(steps // 2):
            params[name] = kernel.sample(params[name])
        out[f"{name}_warmup_s"] = time.perf_counter() - start
        kernel._reset_stats()
    seconds = {name: 0.0 for name in kernels}
    for _ in range(steps):  # interleaved transitions
        for name, kernel in kernels.items():
            start = time.perf_counter()
            params[name] = kernel.sample(params[name])
            seconds[name] += time.perf_counter() - start
    for name, kernel in kernels.items():
        diag = kernel.diagnostics()
        out[f"{name}_ms_per_transition"] = 1e3 * seconds[name] / steps
        out[f"{name}_acceptance"] = diag["acceptance_rate"]
        out[f"{name}_data_fraction"] = diag["data_fraction"]
    out["austerity_audited_decisions"] = kernels["austerity"].diagnostics()["audited_decisions"]
    out["austerity_audited_error_rate"] = kernels["austerity"].diagnostics()["audited_error_rate"]
    out["note"] = (
        "austerity's clock includes its audits: one exact re-decision every 50 transitions here (the default is "
        "every 200), each costing about one exact MH transition"
    )
    out["speedup_per_transition"] = out["exact_ms_per_transition"] / out["austerity_ms_per_transition"]
    return out


def nuts_per_iteration(quick: bool) -> list[dict[str, Any]]:
    rows = []
    d = 10
    for n in (500, 100_000):
        X, y = logistic_data(n, d, 2)
        log_lik = LogLikelihood(model_matmul, X, y)
        potential = log_lik.potential_fn()
        arms: dict[str, float] = {}
        iters = 30 if quick else 100
        for name in ("pyro_model", "potential_fn"):
            pyro.set_rng_seed(0)
            if name == "pyro_model":
                kernel = NUTS(model_matmul, adapt_step_size=True, jit_compile=False)
                mcmc = MCMC(kernel, num_samples=iters, warmup_steps=iters, disable_progbar=True)
                start = time.perf_counter()
                mcmc.run(X, y)
            else:
                kernel = NUTS(potential_fn=potential, adapt_step_size=True)
                mcmc = MCMC(
                    kernel,
                    num_samples=iters,
                    warmup_steps=iters,
                    initial_params={"w": torch.zeros(d)},
                    disable_progbar=True,
                )
                start = time.perf_counter()
                mcmc.run()
            elapsed = time.perf_counter() - start
            arms[name] = elapsed / (2 * iters)
            arms[f"{name}_mean_w0"] = float(mcmc.get_samples()["w"][:, 0].mean())
        rows.append(
            {
                "N": n,
                "ms_per_iteration_pyro_model": 1e3 * arms["pyro_model"],
                "ms_per_iteration_potential_fn": 1e3 * arms["potential_fn"],
                "speedup": arms["pyro_model"] / arms["potential_fn"],
                "mean_w0_pyro_model": arms["pyro_model_mean_w0"],
                "mean_w0_potential_fn": arms["potential_fn_mean_w0"],
            }
        )
    small, big = rows
    for key in ("pyro_model", "potential_fn"):
        big[f"coreset_ratio_{key}"] = big[f"ms_per_iteration_{key}"] / small[f"ms_per_iteration_{key}"]
    return rows


def markdown(record: dict[str, Any]) -> str:
    lines = ["# Direct likelihood path: speed (issue 21)", "", f"Command: `{record['command']}`", ""]
    lines += [
        "## Per-section evaluation (P = 2 points, k = 100 sections, N = 1e5, D = 10)",
        "",
        "| model | Pyro path lazy / batched | section evaluator (us) | direct path (us) | torch floor (us) "
        "| speed-up | direct / floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in record["sections"]:
        lines.append(
            f"| {r['model']} | {r['pyro_lazy']} / {r['pyro_vectorized']} | {r['us_section_evaluator']:.0f} "
            f"| {r['us_direct_path']:.0f} | {r['us_torch_floor']:.0f} | {r['speedup']:.1f}x "
            f"| {r['direct_over_floor']:.2f} |"
        )
    a = record["austerity"]
    lines += [
        "",
        f"## AusterityMH vs exact MH per transition (logistic N = {a['N']:.0e}, D = {a['D']}, eps = 0.05, "
        f"{a['transitions']} interleaved transitions each)",
        "",
        "| arm | ms / transition | acceptance | data fraction | setup (s) | warm-up incl. graph builds (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("austerity", "exact"):
        lines.append(
            f"| {name} | {a[f'{name}_ms_per_transition']:.2f} | {a[f'{name}_acceptance']:.3f} "
            f"| {a[f'{name}_data_fraction']:.4f} | {a[f'{name}_setup_s']:.2f} | {a[f'{name}_warmup_s']:.2f} |"
        )
    lines += [
        "",
        f"Speed-up per transition: {a['speedup_per_transition']:.1f}x; audited decisions "
        f"{a['austerity_audited_decisions']:.0f}, error rate {a['austerity_audited_error_rate']:.3f}. {a['note']}.",
        "",
        "## Pyro NUTS per iteration: model vs the direct path's potential_fn (logistic, D = 10)",
        "",
        "| N | Pyro model (ms/it) | potential_fn (ms/it) | speed-up |",
        "|---|---|---|---|",
    ]
    for r in record["nuts"]:
        lines.append(
            f"| {r['N']} | {r['ms_per_iteration_pyro_model']:.2f} | {r['ms_per_iteration_potential_fn']:.2f} "
            f"| {r['speedup']:.1f}x |"
        )
    big = record["nuts"][1]
    lines += [
        "",
        f"Per-iteration cost ratio N = 1e5 / N = 500 (what a 500-point coreset saves): Pyro model "
        f"{big['coreset_ratio_pyro_model']:.1f}x, potential_fn {big['coreset_ratio_potential_fn']:.1f}x.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.set_rng_seed(args.seed)
    record: dict[str, Any] = {
        "command": "python benchmarks/global_speed.py" + (" --quick" if args.quick else ""),
        "torch": torch.__version__,
        "threads": 1,
    }
    record["sections"] = section_evaluation(args.quick)
    record["austerity"] = austerity_vs_exact(args.quick)
    record["nuts"] = nuts_per_iteration(args.quick)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "global_speed.json").write_text(json.dumps(record, indent=2))
        (args.out / "global_speed.md").write_text(markdown(record))
    print(markdown(record))
    return record


if __name__ == "__main__":
    main()
