"""Single-site Gibbs throughput on the UAI grid ``Grids_15`` (20x20 Ising, 400 binary variables).

Measures, side by side in one run, single-site Gibbs updates per second
(``sweeps * 400 / seconds``) for:

* ``vectorized_mcmc``: the chromatic, vectorized :class:`neuralblock.GibbsKernel` on the
  :class:`~neuralblock.FactorGraph`, driven by ``pyro.infer.MCMC`` (``disable_progbar=True``);
* ``vectorized_raw``: the same kernel in a bare ``params = kernel.sample(params)`` loop, so
  the overhead of Pyro's MCMC driver is visible;
* ``naive``: a straightforward per-variable Python loop over the same FactorGraph: for each
  variable, for each value, the sum of the log values of the factors touching it (one
  ``group.log_factors(state, rows)`` call per factor group on a single state), normalize,
  sample, write back. The static neighbour lists are computed once, before timing;
* ``bridge_mcmc``: a Pyro model of the same grid with one scalar ``pyro.sample`` site per
  variable and one ``pyro.factor`` per pairwise factor, written in Python loops, sampled by
  ``GibbsKernel(model)`` through ``pyro.infer.MCMC`` (the kernel converts the model with
  :func:`neuralblock.pyro.from_pyro_model` at setup). Before timing, the script asserts that
  the bridge graph's ``log_joint`` equals the UAI graph's on random states.

Every measurement (one implementation, one round) runs in a fresh subprocess
(``--impl NAME``), which warms up, times a fixed number of sweeps and reports its resident-set
high-water mark (``ru_maxrss``) after the imports and graph loading and at the end. Rounds are
interleaved (A B C D A B C D ...) and the median rate per implementation is reported. The
machine's load average (``os.getloadavg()``) is recorded, since other processes skew timings.
``--quick`` runs on the top-left 8x8 sub-grid, because ``from_pyro_model`` alone takes ~20 s on
the full grid (``pyro.infer.inspect.get_dependencies`` is quadratic in the number of sites).

Run it from the repository root::

    python benchmarks/gibbs_throughput.py              # full run (a few minutes), 3 rounds
    python benchmarks/gibbs_throughput.py --quick      # smoke test (< 30 s): 8x8 sub-grid, few sweeps
    python benchmarks/gibbs_throughput.py --threads 2 --rounds 5 --out /tmp/bench

It writes ``gibbs_throughput.json`` and ``gibbs_throughput.md`` into ``--out``
(default ``benchmarks/results/``). ``torch.set_num_threads(1)`` is the default: these kernels
work on tensors of a few hundred entries, where intra-op threads only add overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GRID = "Grids_15"
SIDE = 20  # Grids_15 is a 20x20 grid, variables numbered row by row
IMPLEMENTATIONS = ("vectorized_mcmc", "vectorized_raw", "naive", "bridge_mcmc")
DESCRIPTIONS = {
    "vectorized_mcmc": "GibbsKernel(fg) via pyro.infer.MCMC",
    "vectorized_raw": "GibbsKernel(fg), bare kernel.sample loop",
    "naive": "per-variable Python loop over the FactorGraph",
    "bridge_mcmc": "GibbsKernel(pyro model) via pyro.infer.MCMC (from_pyro_model bridge)",
}
# (warmup sweeps, timed sweeps): full runs aim at ~5-20 s per measurement on one core.
SWEEPS_FULL = {"vectorized_mcmc": (200, 8000), "vectorized_raw": (200, 12000), "naive": (3, 60), "bridge_mcmc": (2, 25)}
SWEEPS_QUICK = {"vectorized_mcmc": (5, 40), "vectorized_raw": (5, 40), "naive": (1, 3), "bridge_mcmc": (1, 3)}
QUICK_SIDE = 8  # --quick runs on the top-left 8x8 sub-grid: from_pyro_model alone takes ~15-40 s on the full grid
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


# ====================================================================== helpers
def _maxrss_mb() -> float:
    """Resident-set high-water mark of this process, in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not available on this platform
        return []


# ====================================================================== the Pyro model (bridge)
class GridModel:
    """A Pyro model of a pairwise MRF with scalar sites, written the way a Pyro user would.

    Each variable is a ``Categorical`` site whose logits are its unary log-potentials; each
    pairwise factor is a ``pyro.factor`` looking its table up with the two site values (tensor
    indexing, so the model evaluates on batches of states). One constant factor adds back the
    Categorical normalizers, so the model's log density equals the UAI graph's ``log_joint``.

    Args:
        names: the site name of each variable.
        unary: ``[n, k]`` unary log-potentials, one row per variable.
        pair_scopes: ``[m, 2]`` variable ids of the pairwise factors.
        pair_tables: ``[m, k, k]`` pairwise log-potentials.
    """

    def __init__(self, names: list[str], unary: Any, pair_scopes: Any, pair_tables: Any) -> None:
        import torch

        self.names = list(names)
        self.unary = unary
        self.pairs = [(int(a), int(b)) for a, b in pair_scopes.tolist()]
        self.pair_tables = pair_tables
        self.log_norm = torch.logsumexp(unary, -1).sum()

    def __call__(self) -> None:
        import pyro
        import pyro.distributions as dist

        xs = [pyro.sample(name, dist.Categorical(logits=self.unary[v])) for v, name in enumerate(self.names)]
        pyro.factor("log_normalizer", self.log_norm)
        for f, (a, b) in enumerate(self.pairs):
            pyro.factor(f"pair{f}", self.pair_tables[f][xs[a], xs[b]])


def _grid_model(fg: Any) -> GridModel:
    """Build the :class:`GridModel` of a graph with one unary factor per variable plus pairwise factors."""
    import torch

    unary = torch.zeros(fg.num_variables, 2)
    pair_scopes, pair_tables = [], []
    for group in fg.groups:
        if group.scopes.shape[1] == 1:
            unary.index_add_(0, group.scopes[:, 0], group.log_tables)
        else:
            pair_scopes.append(group.scopes)
            pair_tables.append(group.log_tables)
    return GridModel(fg.names, unary, torch.cat(pair_scopes), torch.cat(pair_tables))


def check_bridge(fg: Any, model: GridModel, num_states: int = 5) -> dict[str, float]:
    """Convert ``model`` with ``from_pyro_model`` and assert its ``log_joint`` equals the graph's on random states."""
    import torch

    from neuralblock.pyro import from_pyro_model

    start = time.perf_counter()
    fg_bridge = from_pyro_model(model)
    seconds = time.perf_counter() - start
    if fg_bridge.num_variables != fg.num_variables:
        raise RuntimeError(f"bridge graph has {fg_bridge.num_variables} variables, expected {fg.num_variables}")
    perm = torch.tensor([fg_bridge.variable_id(name) for name in fg.names])  # fg id -> bridge id
    states = torch.randint(0, 2, (num_states, fg.num_variables)).float()
    bridge_states = torch.empty_like(states)
    bridge_states[:, perm] = states
    expected, got = fg.log_joint(states), fg_bridge.log_joint(bridge_states)
    if not torch.allclose(got, expected, rtol=1e-5, atol=1e-3):
        raise RuntimeError(f"bridge log_joint {got.tolist()} differs from the graph's {expected.tolist()}")
    return {
        "num_states": num_states,
        "max_abs_log_joint_error": float((got - expected).abs().max()),
        "from_pyro_model_seconds": seconds,
    }


def load_graph(side: int = 20) -> Any:
    """``Grids_15``, or its top-left ``side x side`` sub-grid (the induced sub-model, for quick runs)."""
    import torch

    from neuralblock import FactorGraph
    from neuralblock.io import read_uai, uai_grid

    fg = read_uai(uai_grid(GRID))
    if side == SIDE:
        return fg
    if not 1 <= side <= SIDE:
        raise ValueError(f"side must be in 1..{SIDE}, got {side}")
    rows, cols = torch.arange(fg.num_variables) // SIDE, torch.arange(fg.num_variables) % SIDE
    keep = ((rows < side) & (cols < side)).nonzero().flatten()
    new_id = torch.full((fg.num_variables,), -1, dtype=torch.long)
    new_id[keep] = torch.arange(len(keep))
    sub = FactorGraph()
    for v in keep.tolist():
        sub.add_variable(fg.names[v], int(fg.cardinalities[v]))
    for group in fg.groups:
        inside = (new_id[group.scopes] >= 0).all(-1)
        sub.add_table_factors(new_id[group.scopes[inside]], group.log_tables[inside])
    return sub


# ====================================================================== the naive baseline
def naive_plan(fg: Any) -> list[tuple[int, int, list[tuple[Any, Any]]]]:
    """Per variable: (id, cardinality, [(factor group, rows of its factors touching the variable)])."""
    import torch

    plan = []
    cards = fg.cardinalities.tolist()
    for v in fg.latent.tolist():
        groups, rows = fg.factor_location(torch.tensor(fg.neighbors(v), dtype=torch.long))
        touching = [(fg.groups[g], rows[groups == g]) for g in groups.unique().tolist()]
        plan.append((v, cards[v], touching))
    return plan


def naive_sweep(plan: list[tuple[int, int, list[tuple[Any, Any]]]], state: Any) -> None:
    """One in-place Gibbs sweep, one variable and one value at a time."""
    import torch

    for v, card, touching in plan:
        logits = torch.empty(card)
        for value in range(card):
            state[v] = value
            total = 0.0
            for group, rows in touching:
                total += float(group.log_factors(state, rows).sum())
            logits[value] = total
        probs = torch.softmax(logits, 0)
        state[v] = float(torch.multinomial(probs, 1))


# ====================================================================== one measurement (child process)
def measure(impl: str, warmup: int, sweeps: int, seed: int, threads: int, side: int = SIDE) -> dict[str, Any]:
    """Warm up, then time ``sweeps`` sweeps of one implementation in this process."""
    import pyro
    import torch
    from pyro.infer import MCMC

    from neuralblock import GibbsKernel

    torch.set_num_threads(threads)
    pyro.set_rng_seed(seed)
    fg = load_graph(side)
    n = fg.num_variables
    rss_baseline = _maxrss_mb()
    load_before = _load()
    extra: dict[str, Any] = {}

    if impl in ("vectorized_mcmc", "bridge_mcmc"):
        # the bridge kernel converts the model with from_pyro_model at its first setup (in the warm-up run)
        kernel = GibbsKernel(_grid_model(fg) if impl == "bridge_mcmc" else fg)
        start = time.perf_counter()
        MCMC(kernel, num_samples=warmup, warmup_steps=0, disable_progbar=True).run()
        extra["first_setup_and_warmup_seconds"] = time.perf_counter() - start
        mcmc = MCMC(kernel, num_samples=sweeps, warmup_steps=0, disable_progbar=True)
        start = time.perf_counter()
        mcmc.run()
        seconds = time.perf_counter() - start
        extra["kernel_updates_per_second"] = kernel.diagnostics()["updates_per_second"]
        if next(iter(mcmc.get_samples().values())).shape[0] != sweeps:
            raise RuntimeError("MCMC returned the wrong number of draws")
    elif impl == "vectorized_raw":
        kernel = GibbsKernel(fg)
        start = time.perf_counter()
        kernel.setup(0)
        extra["setup_seconds"] = time.perf_counter() - start
        params = kernel.initial_params
        for _ in range(warmup):
            params = kernel.sample(params)
        start = time.perf_counter()
        for _ in range(sweeps):
            params = kernel.sample(params)
        seconds = time.perf_counter() - start
    elif impl == "naive":
        plan = naive_plan(fg)
        state = fg.initial_state()
        for _ in range(warmup):
            naive_sweep(plan, state)
        start = time.perf_counter()
        for _ in range(sweeps):
            naive_sweep(plan, state)
        seconds = time.perf_counter() - start
        if not bool(torch.isfinite(fg.log_joint(state))):
            raise RuntimeError("the naive sweep reached a state of zero density")
    else:
        raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLEMENTATIONS}")

    return {
        "impl": impl,
        "sweeps": sweeps,
        "warmup_sweeps": warmup,
        "seconds": seconds,
        "updates_per_second": sweeps * n / seconds,
        "rss_after_imports_mb": rss_baseline,
        "peak_rss_mb": _maxrss_mb(),
        "load_before": load_before,
        "load_after": _load(),
        **extra,
    }


def _run_child(impl: str, warmup: int, sweeps: int, seed: int, threads: int, side: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--impl", impl, "--warmup", str(warmup)]
    cmd += ["--sweeps", str(sweeps), "--seed", str(seed), "--threads", str(threads), "--side", str(side)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {impl!r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ====================================================================== report
def _markdown(result: dict[str, Any]) -> str:
    bc = result["bridge_check"]
    lines = [
        f"# Gibbs throughput on `{result['grid']}` ({result['num_variables']} binary variables)",
        "",
        f"torch {result['env']['torch']}, pyro {result['env']['pyro']}, python {result['env']['python']}, "
        f"{result['env']['cpus']} CPUs, `torch.set_num_threads({result['threads']})`, "
        f"interleaved rounds: {result['rounds']} (median), seed {result['seed']}"
        + (", **quick mode**" if result["quick"] else ""),
        f"load average (1/5/15 min): start {result['load_average_start']}, end {result['load_average_end']}",
        f"bridge check: `from_pyro_model` took {bc['from_pyro_model_seconds']:.1f} s; its `log_joint` matches "
        f"the UAI graph's on {bc['num_states']} random states (max abs error {bc['max_abs_log_joint_error']:.1e})",
        "",
        "| implementation | sweeps x rounds | median updates/s | min..max updates/s | peak RSS (MiB) "
        "| RSS after imports (MiB) | delta (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["implementations"].items():
        lines.append(
            f"| {name}: {r['description']} | {r['sweeps']} x {len(r['rates'])} | {r['median_updates_per_second']:,.0f} "
            f"| {min(r['rates']):,.0f}..{max(r['rates']):,.0f} | {r['peak_rss_mb']:.0f} "
            f"| {r['rss_after_imports_mb']:.0f} | {r['rss_delta_mb']:.0f} |"
        )
    lines += ["", "| ratio | value |", "|---|---:|"]
    lines += [f"| {k} | {v:,.1f}x |" for k, v in result["ratios"].items()]
    goal = result["goal"]
    lines += [
        "",
        f"Goal `vectorized >= {goal['target']:.0f}x naive` (vectorized through pyro.infer.MCMC): "
        f"{goal['ratio']:,.1f}x -> **{'MET' if goal['met'] else 'NOT MET'}** "
        f"(bare kernel loop: {result['ratios']['vectorized_raw / naive']:,.1f}x)."
        + (" Quick mode: sub-grid and few sweeps, not a meaningful check." if result["quick"] else ""),
        "",
        "updates/s = sweeps x variables / seconds of the timed sweeps (each measurement in a fresh process, after "
        "warm-up; the MCMC rows include one `MCMC.run` setup, `kernel_updates_per_second` in the JSON excludes it). "
        "Peak RSS = `ru_maxrss` at the end of the measurement process; 'after imports' = after importing torch, "
        "pyro, neuralblock and loading the graph.",
        "",
    ]
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run all measurements (interleaved rounds, one subprocess each) and write the results."""
    import pyro
    import torch
    from tqdm import tqdm

    counts = SWEEPS_QUICK if args.quick else SWEEPS_FULL
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    side = args.side if args.side is not None else (QUICK_SIDE if args.quick else SIDE)
    load_start = _load()
    torch.set_num_threads(args.threads)
    fg = load_graph(side)
    print(f"checking the Pyro-model bridge on {fg} ...", file=sys.stderr)
    bridge_check = check_bridge(fg, _grid_model(fg))
    runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLEMENTATIONS}
    jobs = [(r, impl) for r in range(rounds) for impl in IMPLEMENTATIONS]
    bar = tqdm(jobs, desc="gibbs throughput", unit="run", disable=args.no_progress)
    for r, impl in bar:
        bar.set_postfix_str(f"round {r + 1}/{rounds}: {impl}")
        warmup, sweeps = counts[impl]
        runs[impl].append(_run_child(impl, warmup, sweeps, args.seed + r, args.threads, side))

    impls: dict[str, Any] = {}
    for impl, ms in runs.items():
        rates = [m["updates_per_second"] for m in ms]
        peak = max(m["peak_rss_mb"] for m in ms)
        base = statistics.median(m["rss_after_imports_mb"] for m in ms)
        impls[impl] = {
            "description": DESCRIPTIONS[impl],
            "sweeps": ms[0]["sweeps"],
            "warmup_sweeps": ms[0]["warmup_sweeps"],
            "rates": rates,
            "median_updates_per_second": statistics.median(rates),
            "peak_rss_mb": peak,
            "rss_after_imports_mb": base,
            "rss_delta_mb": peak - base,
            "measurements": ms,
        }
    med = {impl: impls[impl]["median_updates_per_second"] for impl in IMPLEMENTATIONS}
    ratios = {
        "vectorized_mcmc / naive": med["vectorized_mcmc"] / med["naive"],
        "vectorized_mcmc / bridge_mcmc": med["vectorized_mcmc"] / med["bridge_mcmc"],
        "vectorized_raw / naive": med["vectorized_raw"] / med["naive"],
        "vectorized_raw / bridge_mcmc": med["vectorized_raw"] / med["bridge_mcmc"],
        "vectorized_raw / vectorized_mcmc": med["vectorized_raw"] / med["vectorized_mcmc"],
    }
    target = 100.0
    result = {
        "benchmark": "gibbs_throughput",
        "grid": GRID if side == SIDE else f"{GRID}[:{side}, :{side}]",
        "num_variables": fg.num_variables,
        "num_factors": fg.num_factors,
        "quick": bool(args.quick),
        "seed": args.seed,
        "threads": args.threads,
        "rounds": rounds,
        "command": " ".join([Path(sys.argv[0]).name, *(args.argv or [])]),
        "load_average_start": load_start,
        "load_average_end": _load(),
        "env": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyro": pyro.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "implementations": impls,
        "bridge_check": bridge_check,
        "ratios": ratios,
        "goal": {
            "target": target,
            "ratio": ratios["vectorized_mcmc / naive"],
            "met": ratios["vectorized_mcmc / naive"] >= target,
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gibbs_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gibbs_throughput.md").write_text(_markdown(result))
    return result


# ====================================================================== entry point
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few sweeps, one round (CI smoke test)")
    p.add_argument("--seed", type=int, default=0, help="base seed (round r uses seed + r)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every measurement (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, or 1 with --quick)")
    p.add_argument(
        "--side", type=int, default=None, help=f"top-left sub-grid size (default {SIDE}, or {QUICK_SIDE} with --quick)"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--impl", choices=IMPLEMENTATIONS, help="internal: run one measurement, print JSON")
    p.add_argument("--warmup", type=int, default=1, help="internal (with --impl): warm-up sweeps")
    p.add_argument("--sweeps", type=int, default=1, help="internal (with --impl): timed sweeps")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (or, with ``--impl``, one measurement); returns the result dict."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.threads < 1 or (args.rounds is not None and args.rounds < 1):
        raise SystemExit("--threads and --rounds must be >= 1")
    if args.impl is not None:
        side = SIDE if args.side is None else args.side
        result = measure(args.impl, args.warmup, args.sweeps, args.seed, args.threads, side)
        print(json.dumps(result))
        return result
    args.argv = argv
    result = run_benchmark(args)
    print(_markdown(result))
    print(f"results written to {Path(args.out).resolve()}")
    return result


if __name__ == "__main__":
    main()
