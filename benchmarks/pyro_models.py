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
3. **ESS per second** of each of the five models' main quantity, against Pyro (and NumPyro's
   ``DiscreteHMCGibbs`` where the optional ``bench`` extra is installed), timing whole
   ``mcmc.run`` calls (setup and compilation included):

   * HMM (K=3, T=100, ``pyro.markov`` and a tones plate), quantity: the number of steps in state 0;
   * Gaussian mixture (N=1000, ``Dirichlet`` weights, a ``Categorical`` per point in a plate),
     quantity: the weights (smallest ESS of the three);
   * ``pyro.factor`` Ising 10x10, quantity: the mean spin;
   * Bayesian network of 3-valued ``Categorical`` sites in a loop (40 cases), quantity: the
     number of cases with ``a = 0``;
   * hierarchical model (50 groups, a discrete latent per group in a plate), quantity: the
     global mean ``mu``.

   Ours: ``GibbsKernel`` on the all-discrete models (with ``--gradient-samplers GWG DMALA PAS``, issue 26:
   also Gibbs-with-Gradients, discrete Langevin and the path auxiliary sampler, same draws); where there
   are continuous globals,
   ``MarginalRandomWalk`` (random walk on the globals with the discrete sites enumerated out,
   then their exact draw) and ``CompoundKernel(GibbsKernel, RandomWalkMH)``, each at its
   defaults. Pyro: ``NUTS`` with the discrete sites
   enumerated out where there are continuous globals; on the all-discrete models (nothing for
   NUTS to sample) Pyro's own exact sampler, ``infer_discrete`` (forward filtering, backward
   sampling over the enumerated sites: independent draws).

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
from collections.abc import Sequence
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, config_enumerate, infer_discrete
from pyro.infer.mcmc.util import summary as pyro_summary
from pyro.ops.indexing import Vindex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: experiments.common

from experiments.common import add_gradient_samplers  # noqa: E402
from neuralblock import FactorGraph, GibbsKernel  # noqa: E402
from neuralblock.kernels import GRADIENT_SAMPLERS, CompoundKernel, MarginalRandomWalk, RandomWalkMH  # noqa: E402

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


INIT = torch.tensor([0.5, 0.3, 0.2])
TRANS = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
EMIT = torch.tensor([[0.9, 0.1, 0.2, 0.5], [0.2, 0.8, 0.7, 0.5], [0.5, 0.5, 0.1, 0.9]])


def hmm(data: torch.Tensor) -> None:
    """HMM with K=3 states, a pyro.markov chain and a vectorized plate of Bernoulli tones per step."""
    tones = pyro.plate("tones", data.shape[-1])
    x = None
    for t in pyro.markov(range(data.shape[0])):
        x = pyro.sample(f"x_{t}", dist.Categorical(INIT if x is None else TRANS[x]))
        with tones:
            pyro.sample(f"y_{t}", dist.Bernoulli(EMIT[x.squeeze(-1)]), obs=data[t])


def gmm_weights(data: torch.Tensor) -> None:
    """Gaussian mixture with Dirichlet weights: a Categorical assignment per point in a plate."""
    weights = pyro.sample("weights", dist.Dirichlet(torch.ones(K)))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
        pyro.sample("obs", dist.Normal(LOCS[z], 0.8), obs=data)


CPT_A = torch.tensor([0.5, 0.3, 0.2])
CPT_B = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
CPT_C = torch.softmax(torch.randn(K, K, K, generator=torch.Generator().manual_seed(6)), -1)
CPT_D = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]])


def bayes_net(evidence: torch.Tensor) -> None:
    """a -> b, (a, b) -> c, c -> d for each case; d observed; 3-valued Categorical sites in a loop.

    The cases are independent: ``pyro.markov(..., history=0)`` lets enumeration recycle their dims.
    """
    for n in pyro.markov(range(len(evidence)), history=0):
        a = pyro.sample(f"a_{n}", dist.Categorical(CPT_A))
        b = pyro.sample(f"b_{n}", dist.Categorical(CPT_B[a]))
        c = pyro.sample(f"c_{n}", dist.Categorical(Vindex(CPT_C)[a, b]))
        pyro.sample(f"d_{n}", dist.Categorical(CPT_D[c]), obs=evidence[n])


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


def ess(values: torch.Tensor) -> float:
    """Effective sample size of one chain of a scalar quantity (Pyro's estimator), or the smallest over a vector."""
    n_eff = pyro_summary({"q": values[None]}, group_by_chain=True)["q"]["n_eff"]
    return float(torch.as_tensor(n_eff).min())


def ess_row(model: str, sampler: str, quantity: str, values: torch.Tensor, seconds: float) -> dict:
    return {
        "model": model,
        "sampler": sampler,
        "quantity": quantity,
        "draws": int(values.shape[0]),
        "seconds": seconds,
        "estimate": values.double().mean(0).reshape(-1)[:3].tolist(),
        "ess": ess(values),
        "ess_per_s": ess(values) / seconds,
    }


def run_mcmc(kernel, args: tuple, samples: int, warmup: int) -> tuple[dict, float]:
    """Samples and wall-clock seconds of one ``MCMC.run`` (setup included)."""
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(*args)
    return mcmc.get_samples(), time.perf_counter() - start


def exact_draws(model, args: tuple, names: list[str], draws: int) -> tuple[dict, float]:
    """Independent posterior draws by Pyro's ``infer_discrete`` (FFBS over the enumerated sites) and their time."""
    pyro.set_rng_seed(0)
    sampler = infer_discrete(config_enumerate(model), first_available_dim=-3, temperature=1)
    out: dict[str, list] = {name: [] for name in names}
    start = time.perf_counter()
    for _ in range(draws):
        trace = poutine.trace(sampler).get_trace(*args)
        for name in names:
            out[name].append(trace.nodes[name]["value"].detach().float())
    seconds = time.perf_counter() - start
    return {name: torch.stack(values) for name, values in out.items()}, seconds


def discrete_rows(
    name: str, model, args: tuple, names: list[str], quantity: str, summary, sizes: dict, gradient: Sequence[str] = ()
) -> list[dict]:
    """Gibbs (and the ``gradient`` samplers) on the compiled model against Pyro's exact ``infer_discrete`` draws."""
    samples, seconds = run_mcmc(GibbsKernel(model), args, sizes["gibbs"], sizes["warmup"])
    rows = [ess_row(name, "Gibbs (ours)", quantity, summary(samples), seconds)]
    for label in gradient:
        samples, seconds = run_mcmc(GRADIENT_SAMPLERS[label](model), args, sizes["gibbs"], sizes["warmup"])
        rows.append(ess_row(name, f"{label} (ours)", quantity, summary(samples), seconds))
    draws, seconds = exact_draws(model, args, names, sizes["exact"])
    rows.append(ess_row(name, "Pyro infer_discrete (exact draws)", quantity, summary(draws), seconds))
    return rows


def numpyro_rows(name: str, which: str, data: torch.Tensor, quantity: str, samples: int, warmup: int) -> list[dict]:
    """NumPyro ``DiscreteHMCGibbs(NUTS)`` on the same model (the optional ``bench`` extra), or nothing."""
    import os

    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
        from numpyro.infer import MCMC as NMCMC
        from numpyro.infer import NUTS as NNUTS
        from numpyro.infer import DiscreteHMCGibbs
    except ImportError:
        print("numpyro/jax not installed (pip install -e .[bench]): no NumPyro rows", file=sys.stderr)
        return []
    y = jnp.asarray(data.numpy())
    locs = jnp.asarray(LOCS.numpy())

    def np_gmm(y):
        w = numpyro.sample("weights", ndist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("data", y.shape[0]):
            z = numpyro.sample("z", ndist.Categorical(w))
            numpyro.sample("obs", ndist.Normal(locs[z], 0.8), obs=y)

    def np_hierarchical(y):
        mu = numpyro.sample("mu", ndist.Normal(0.0, 2.0))
        with numpyro.plate("groups", y.shape[0], dim=-1):
            z = numpyro.sample("z", ndist.Bernoulli(0.3))
            with numpyro.plate("obs", y.shape[1], dim=-2):
                numpyro.sample("y", ndist.Normal(mu + 3.0 * z, 1.0), obs=y.T)

    model, site = (np_gmm, "weights") if which == "gmm" else (np_hierarchical, "mu")
    mcmc = NMCMC(DiscreteHMCGibbs(NNUTS(model)), num_warmup=warmup, num_samples=samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), y)
    values = torch.tensor(jax.device_get(mcmc.get_samples()[site]).tolist())
    seconds = time.perf_counter() - start
    return [ess_row(name, "NumPyro DiscreteHMCGibbs(NUTS)", quantity, values, seconds)]


def ess_table(quick: bool, gradient: Sequence[str] = ()) -> list[dict]:
    """The ESS/s rows of the five models (see the module docstring)."""
    sizes = {"gibbs": 300, "warmup": 50, "exact": 20} if quick else {"gibbs": 3000, "warmup": 300, "exact": 100}
    rows: list[dict] = []
    gen = torch.Generator().manual_seed(11)

    # HMM, K=3, T=100, 4 tones
    steps = 20 if quick else 100
    x, seq = 0, []
    for _ in range(steps):
        x = int(torch.multinomial(TRANS[x], 1, generator=gen))
        seq.append(x)
    tones = torch.bernoulli(EMIT[torch.tensor(seq)], generator=gen)
    names = [f"x_{t}" for t in range(steps)]
    in_state_0 = lambda s: torch.stack([(s[n] == 0).float() for n in names], -1).sum(-1)  # noqa: E731
    rows += discrete_rows(f"HMM K=3 T={steps}", hmm, (tones,), names, "steps in state 0", in_state_0, sizes, gradient)

    # Ising 10x10 with pyro.factor
    size = 6 if quick else 10
    field = 0.3 * torch.randn(size, size, generator=torch.Generator().manual_seed(1))
    names = [f"s_{i}_{j}" for i in range(size) for j in range(size)]
    magnet = lambda s: torch.stack([2 * s[n].float() - 1 for n in names], -1).mean(-1)  # noqa: E731
    few = dict(sizes, exact=max(10, sizes["exact"] // 2))  # an exact draw of the 10x10 grid or 40 cases takes ~0.5 s
    ising_sizes = few
    rows += discrete_rows(
        f"Ising {size}x{size} (pyro.factor)",
        ising,
        (size, 0.4, field),
        names,
        "mean spin",
        magnet,
        ising_sizes,
        gradient,
    )

    # Bayesian network, 40 cases
    cases = 10 if quick else 40
    evidence = torch.randint(0, K, (cases,), generator=gen)
    names = [f"a_{n}" for n in range(cases)]
    a_zero = lambda s: torch.stack([(s[n] == 0).float() for n in names], -1).sum(-1)  # noqa: E731
    rows += discrete_rows(
        f"BN, {cases} cases (loop)", bayes_net, (evidence,), names, "cases with a = 0", a_zero, few, gradient
    )

    # GMM, N=1000, Dirichlet weights
    n = 200 if quick else 1000
    data = LOCS[torch.multinomial(WEIGHTS, n, replacement=True, generator=gen)] + 0.8 * torch.randn(n, generator=gen)
    name, quantity = f"GMM N={n} (Dirichlet weights)", "weights (min ESS)"
    samples, seconds = run_mcmc(MarginalRandomWalk(gmm_weights), (data,), sizes["gibbs"], sizes["warmup"])
    rows.append(ess_row(name, "MarginalRandomWalk (ours)", quantity, samples["weights"], seconds))
    kernel = CompoundKernel([(GibbsKernel(gmm_weights), ["z"]), (RandomWalkMH(gmm_weights), ["weights"])])
    samples, seconds = run_mcmc(kernel, (data,), sizes["gibbs"], sizes["warmup"])
    rows.append(ess_row(name, "Gibbs + RW-MH (ours)", quantity, samples["weights"], seconds))
    samples, seconds = run_mcmc(NUTS(gmm_weights, max_plate_nesting=1), (data,), sizes["gibbs"] // 4, sizes["warmup"])
    rows.append(ess_row(name, "Pyro NUTS, z enumerated", quantity, samples["weights"], seconds))
    rows += numpyro_rows(name, "gmm", data, quantity, sizes["gibbs"], sizes["warmup"])

    # hierarchical, 50 groups
    groups = 10 if quick else 50
    shift = (torch.rand(groups, generator=gen) < 0.3).float() * 3.0
    data = 0.5 + shift[:, None] + torch.randn(groups, 4, generator=gen)
    name = f"hierarchical, {groups} groups"
    samples, seconds = run_mcmc(MarginalRandomWalk(hierarchical), (data,), sizes["gibbs"], sizes["warmup"])
    rows.append(ess_row(name, "MarginalRandomWalk (ours)", "mu", samples["mu"], seconds))
    kernel = CompoundKernel([(GibbsKernel(hierarchical), ["z"]), (RandomWalkMH(hierarchical), ["mu"])])
    samples, seconds = run_mcmc(kernel, (data,), sizes["gibbs"], sizes["warmup"])
    rows.append(ess_row(name, "Gibbs + RW-MH (ours)", "mu", samples["mu"], seconds))
    samples, seconds = run_mcmc(NUTS(hierarchical, max_plate_nesting=2), (data,), sizes["gibbs"] // 4, sizes["warmup"])
    rows.append(ess_row(name, "Pyro NUTS, z enumerated", "mu", samples["mu"], seconds))
    rows += numpyro_rows(name, "hierarchical", data, "mu", sizes["gibbs"], sizes["warmup"])
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI scale (seconds)")
    parser.add_argument("--out", type=Path, default=OUT)
    add_gradient_samplers(parser, "also run these gradient-informed samplers (issue 26) on the all-discrete models")
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
        "ess": ess_table(quick, args.gradient_samplers),
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
        "| model | sampler | quantity | draws | seconds | ESS | ESS/s | ours / best other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["ess"]:
        others = [r["ess_per_s"] for r in results["ess"] if r["model"] == row["model"] and "(ours)" not in r["sampler"]]
        ratio = f"{row['ess_per_s'] / max(others):.1f}x" if "(ours)" in row["sampler"] and others else ""
        lines.append(
            f"| {row['model']} | {row['sampler']} | {row['quantity']} | {row['draws']} | {row['seconds']:.1f} | "
            f"{row['ess']:.0f} | {row['ess_per_s']:.1f} | {ratio} |"
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
