"""Pyro models compiled into the vectorized engine (issue 20): throughput, build time, ESS per second.

Measures, side by side in one run (``torch.set_num_threads(1)``):

1. **Throughput ratio.** Gibbs single-site updates per second on a model written in Pyro and
   compiled by :func:`neuralblock.pyro.from_pyro_model`, against the same model built directly
   as a :class:`~neuralblock.FactorGraph` (target >= 1/2). Timed through ``kernel.sample`` (what
   ``pyro.infer.MCMC`` calls), so the params <-> state mapping is included. Models: the
   ``pyro.factor`` Ising 10x10 (scalar sites in loops under ``pyro.markov``) and the Gaussian
   mixture with ``N = 1000`` assignments in ``pyro.plate("data")``.
2. **Build time** of ``GibbsKernel`` on a Pyro model with 10^4 discrete elements (the mixture
   with ``N = 10^4``): compile + colouring + start (target <= 2 s).
3. **ESS per second** of the main quantity of the hierarchical model (the global mean ``mu``,
   with a discrete latent per group in a plate of 50 groups): ``CompoundKernel(GibbsKernel,
   RandomWalkMH)`` against Pyro ``NUTS`` with the discrete sites enumerated out.

Writes ``results.json``, ``results.md`` and ``throughput.png`` under
``experiments/results/pyro_models/``.

Example:
    $ .venv/bin/python benchmarks/pyro_models.py            # a few minutes on one core
    $ .venv/bin/python benchmarks/pyro_models.py --quick    # seconds (CI scale)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import summary as pyro_summary

from neuralblock import FactorGraph, GibbsKernel
from neuralblock.kernels import CompoundKernel, RandomWalkMH

OUT = Path(__file__).resolve().parents[1] / "experiments" / "results" / "pyro_models"
K = 3
LOCS = torch.tensor([-2.0, 0.0, 2.0])
WEIGHTS = torch.tensor([0.2, 0.5, 0.3])


# ---------------------------------------------------------------------------- models (as users write them)
def ising(size: int, coupling: float, field: torch.Tensor) -> None:
    """Ising model: a Bernoulli spin per cell, pyro.factor per edge, rows under pyro.markov."""
    s: dict[tuple[int, int], torch.Tensor] = {}
    for i in pyro.markov(range(size)):
        for j in range(size):
            s[i, j] = pyro.sample(f"s_{i}_{j}", dist.Bernoulli(logits=2 * field[i, j]))
            spin = 2 * s[i, j] - 1
            if i > 0:
                pyro.factor(f"v_{i}_{j}", coupling * spin * (2 * s[i - 1, j] - 1))
            if j > 0:
                pyro.factor(f"h_{i}_{j}", coupling * spin * (2 * s[i, j - 1] - 1))


def ising_graph(size: int, coupling: float, field: torch.Tensor) -> FactorGraph:
    """The same Ising model built directly as a FactorGraph (unary and pairwise tables)."""
    fg = FactorGraph()
    ids = torch.tensor(fg.add_variables(size * size, 2, prefix="s")).reshape(size, size)
    f = 2 * field.reshape(-1)
    fg.add_table_factors(
        ids.reshape(-1, 1), torch.stack([-torch.nn.functional.softplus(f), f - torch.nn.functional.softplus(f)], -1)
    )
    pair = coupling * torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    edges = torch.cat(
        [
            torch.stack([ids[1:, :], ids[:-1, :]], -1).reshape(-1, 2),
            torch.stack([ids[:, 1:], ids[:, :-1]], -1).reshape(-1, 2),
        ]
    )
    fg.add_table_factors(edges, pair.expand(len(edges), 2, 2))
    return fg


def gmm(data: torch.Tensor, weights: torch.Tensor) -> None:
    """Gaussian mixture with known weights and locations: a Categorical assignment per point."""
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("obs", dist.Normal(LOCS[z], 0.8), obs=data)


def gmm_graph(data: torch.Tensor, weights: torch.Tensor) -> FactorGraph:
    fg = FactorGraph()
    ids = torch.tensor(fg.add_variables(len(data), K, prefix="z"))
    tables = weights.log() + dist.Normal(LOCS, 0.8).log_prob(data[:, None])
    fg.add_table_factors(ids[:, None], tables)
    return fg


def hierarchical(data: torch.Tensor) -> None:
    """A global mean mu; each group shifted by 3 (z = 1) or not; observations nested in the groups."""
    mu = pyro.sample("mu", dist.Normal(0.0, 2.0))
    with pyro.plate("groups", data.shape[0], dim=-1):
        z = pyro.sample("z", dist.Bernoulli(0.3), infer={"enumerate": "parallel"})
        with pyro.plate("obs", data.shape[1], dim=-2):
            pyro.sample("y", dist.Normal(mu + 3.0 * z, 1.0), obs=data.T)


# ---------------------------------------------------------------------------- measurements
def sweeps_per_second(kernel, args: tuple, sweeps: int) -> float:
    kernel.setup(0, *args)
    params = kernel.initial_params
    for _ in range(5):
        params = kernel.sample(params)
    start = time.perf_counter()
    for _ in range(sweeps):
        params = kernel.sample(params)
    return sweeps / (time.perf_counter() - start)


def throughput(name: str, model, graph, args: tuple, sweeps: int) -> dict:
    fg = graph(*args)
    pyro_rate = sweeps_per_second(GibbsKernel(model), args, sweeps)
    graph_rate = sweeps_per_second(GibbsKernel(fg), (), sweeps)
    n = fg.num_variables
    return {
        "model": name,
        "variables": n,
        "pyro_updates_per_s": pyro_rate * n,
        "graph_updates_per_s": graph_rate * n,
        "ratio": pyro_rate / graph_rate,
    }


def build_time(n: int) -> dict:
    data = torch.randn(n, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    kernel = GibbsKernel(gmm)
    kernel.setup(0, data, WEIGHTS)
    return {"model": "gmm", "discrete_elements": n, "build_s": time.perf_counter() - start}


def ess_per_second(values: torch.Tensor, seconds: float) -> float:
    ess = pyro_summary({"q": values[None]}, group_by_chain=True)["q"]["n_eff"]
    return float(ess) / seconds


def hierarchical_ess(groups: int, samples: int, warmup: int) -> list[dict]:
    gen = torch.Generator().manual_seed(7)
    shift = (torch.rand(groups, generator=gen) < 0.3).float() * 3.0
    data = 0.5 + shift[:, None] + torch.randn(groups, 4, generator=gen)
    rows = []
    pyro.set_rng_seed(0)
    kernel = CompoundKernel([(GibbsKernel(hierarchical), ["z"]), (RandomWalkMH(hierarchical), ["mu"])])
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(data)
    seconds = time.perf_counter() - start
    mu = mcmc.get_samples()["mu"]
    rows.append(
        {
            "model": "hierarchical",
            "sampler": "Gibbs + RW-MH (ours)",
            "seconds": seconds,
            "mean_mu": float(mu.mean()),
            "ess_per_s": ess_per_second(mu, seconds),
        }
    )
    pyro.set_rng_seed(0)
    mcmc = MCMC(
        NUTS(hierarchical, max_plate_nesting=2),
        num_samples=samples // 4,
        warmup_steps=warmup // 4,
        disable_progbar=True,
    )
    start = time.perf_counter()
    mcmc.run(data)
    seconds = time.perf_counter() - start
    mu = mcmc.get_samples()["mu"]
    rows.append(
        {
            "model": "hierarchical",
            "sampler": "Pyro NUTS, z enumerated",
            "seconds": seconds,
            "mean_mu": float(mu.mean()),
            "ess_per_s": ess_per_second(mu, seconds),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI scale (seconds)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    quick = args.quick
    sweeps = 50 if quick else 400
    field = 0.3 * torch.randn(10, 10, generator=torch.Generator().manual_seed(1))
    gmm_data = LOCS[torch.multinomial(WEIGHTS, 1000, replacement=True)] + 0.8 * torch.randn(1000)
    results = {
        "throughput": [
            throughput("ising 10x10 (pyro.factor)", ising, ising_graph, (10, 0.4, field), sweeps),
            throughput("gmm N=1000 (pyro.plate)", gmm, gmm_graph, (gmm_data, WEIGHTS), sweeps),
        ],
        "build": build_time(10_000),
        "ess": hierarchical_ess(10 if quick else 50, 200 if quick else 2000, 50 if quick else 200),
        "threads": torch.get_num_threads(),
        "quick": quick,
    }
    lines = ["| model | variables | Pyro-compiled updates/s | FactorGraph updates/s | ratio |", "|---|---|---|---|---|"]
    for row in results["throughput"]:
        lines.append(
            f"| {row['model']} | {row['variables']} | {row['pyro_updates_per_s']:.3g} | "
            f"{row['graph_updates_per_s']:.3g} | {row['ratio']:.2f} |"
        )
    build = results["build"]
    lines += [
        "",
        f"GibbsKernel build on a Pyro model with {build['discrete_elements']} discrete elements: "
        f"{build['build_s']:.2f} s",
        "",
        "| model | sampler | seconds | mean mu | ESS(mu)/s |",
        "|---|---|---|---|---|",
    ]
    for row in results["ess"]:
        lines.append(
            f"| {row['model']} | {row['sampler']} | {row['seconds']:.1f} | {row['mean_mu']:.3f} | "
            f"{row['ess_per_s']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3))
        names = [row["model"] for row in results["throughput"]]
        x = torch.arange(len(names)).float()
        ax.bar(x - 0.2, [row["pyro_updates_per_s"] for row in results["throughput"]], 0.4, label="Pyro model, compiled")
        ax.bar(x + 0.2, [row["graph_updates_per_s"] for row in results["throughput"]], 0.4, label="FactorGraph")
        ax.set_xticks(x.tolist(), names)
        ax.set_ylabel("Gibbs updates / s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "throughput.png", dpi=120)
    except ImportError:  # matplotlib is optional
        print("matplotlib not installed: no plot", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
