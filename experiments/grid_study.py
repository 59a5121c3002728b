"""Study: neural block MCMC (NB+Gibbs) vs single-site Gibbs on grids, in the same engine.

Instances: the 8 UAI Ising grids (shipped exact marginals), the three UAI 2008 grid
BNs (exact marginals we computed and ship) and random grid BNs from the grid motif's
instantiation distribution (exact marginals computed here with the junction tree).
For every instance and seed, each sampler runs inside ``pyro.infer.MCMC`` for the same
wall-time budget; the mean absolute marginal error is recorded against sweeps and
seconds. Reported per instance: both final errors at equal wall time, and the time NB+Gibbs
needs to reach Gibbs's final error as a fraction of Gibbs's time.

Outputs (under ``--out``, in a folder named by a hash of the config): ``grid_study.json``,
``grid_study.md`` (table) and one PNG per instance.

Usage::

    python experiments/grid_study.py --quick      # CI scale: two small instances, 2 s per run
    python experiments/grid_study.py              # full run (about 30 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pyro
import torch
from tqdm import tqdm

from motifs.grid import random_grid_bn
from neuralblock import GibbsKernel, NeuralBlockKernel, load_pretrained
from neuralblock.diagnostics.plots import plot_error_traces
from neuralblock.exact import marginals
from neuralblock.graph import FactorGraph
from neuralblock.io import erg_grid, read_erg, read_mar, read_uai, uai_grid
from neuralblock.quickstart import error_at, run_for_seconds

UAI = [f"Grids_{i}" for i in range(11, 19)]
STRONG = {"Grids_11", "Grids_12", "Grids_13", "Grids_14", "Grids_16", "Grids_17", "Grids_18"}  # f >= 5
ERG = ["90-10-1", "90-14-1", "90-16-1"]
RANDOM_SIZES = [10, 15, 20]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="wall time per sampler and run")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gibbs-prob", type=float, default=0.5)
    parser.add_argument("--random-sizes", type=int, nargs="*", default=RANDOM_SIZES)
    parser.add_argument("--instances", nargs="*", default=None, help="subset of instance names")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI scale")
    parser.add_argument("--out", default="experiments/results/grid_study")
    parser.add_argument("--from-json", default=None, help="rewrite the table and plots of a finished run's JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.seeds, args.random_sizes = 2.0, 1, [6]
        args.instances = args.instances or ["Grids_12", "90-10-1", "random-bn-6"]
    return args


def load_instances(args: argparse.Namespace) -> dict[str, tuple[FactorGraph, torch.Tensor, str]]:
    """name -> (graph, exact marginals, family)."""
    wanted = set(args.instances) if args.instances else None
    out: dict[str, tuple[FactorGraph, torch.Tensor, str]] = {}
    for name in UAI:
        if wanted is None or name in wanted:
            out[name] = (read_uai(uai_grid(name)), read_mar(uai_grid(name, "MAR")), "mrf")
    for name in ERG:
        if wanted is None or name in wanted:
            path = erg_grid(name)
            out[name] = (read_erg(path), read_mar(path.with_name(f"{name}.MAR")), "bn")
    for size in args.random_sizes:
        name = f"random-bn-{size}"
        if wanted is None or name in wanted:
            fg = random_grid_bn(size, size, torch.Generator().manual_seed(1000 + size))
            out[name] = (fg, marginals(fg)[0].to(torch.get_default_dtype()), "bn")
    return out


def time_to_reach(trace: dict, target: float) -> float | None:
    """First recorded time at which the error is at most ``target``."""
    return next((s for s, e in zip(trace["seconds"], trace["errors"]) if e <= target), None)


def write_outputs(record: dict, out: Path, seconds: float, seeds: int) -> str:
    """Summaries, markdown table and plots; errors are compared at the same wall time.

    Both samplers run for a calibrated number of sweeps, so their actual run times differ
    a little; each seed compares both errors at the shorter of the two run times.
    """
    summary_rows = []
    for name, entry in record["instances"].items():
        runs = entry["runs"]
        common = [min(r["NB+Gibbs"]["seconds"][-1], r["Gibbs"]["seconds"][-1]) for r in runs]
        nb = sum(error_at(r["NB+Gibbs"], t) for r, t in zip(runs, common)) / len(runs)
        gibbs = sum(error_at(r["Gibbs"], t) for r, t in zip(runs, common)) / len(runs)
        fractions = [r["nb_time_to_gibbs_final_fraction"] for r in runs]
        reached = [f for f in fractions if f is not None]
        frac = max(reached) if len(reached) == len(fractions) else None
        acc = sum(r["NB+Gibbs"]["diagnostics"]["acceptance"]["grid"] for r in runs) / len(runs)
        entry["summary"] = {"nb_final": nb, "gibbs_final": gibbs, "nb_wins": nb < gibbs, "worst_fraction": frac}
        strong = name in STRONG or entry["family"] == "bn"
        summary_rows.append(
            f"| {name} | {entry['num_variables']} | {'yes' if strong else 'no'} | {nb:.4f} | {gibbs:.4f} | "
            f"{'NB' if nb < gibbs else 'Gibbs'} | {'-' if frac is None else f'{frac:.2f}'} | {acc:.3f} |"
        )
        plot_error_traces(
            {"NB+Gibbs": [r["NB+Gibbs"] for r in runs], "Gibbs": [r["Gibbs"] for r in runs]},
            out / f"{name}.png",
            title=f"{name}: NB+Gibbs vs Gibbs ({seconds:g} s each)",
        )
    wins = sum(e["summary"]["nb_wins"] for n, e in record["instances"].items() if n in UAI or n in ERG)
    table = "\n".join(
        [
            f"Equal wall time ({seconds:g} s per sampler per seed, {seeds} seed(s)); errors are means "
            "over seeds. `NB time / Gibbs time` is the worst seed's time for NB+Gibbs to reach Gibbs's final "
            "error, as a fraction of Gibbs's time (`-`: not reached).",
            "",
            "| instance | vars | strongly coupled | NB+Gibbs error | Gibbs error | better | NB time / Gibbs time "
            "| NB acceptance |",
            "|---|---|---|---|---|---|---|---|",
            *summary_rows,
            "",
            f"NB+Gibbs beats Gibbs at equal wall time on {wins} of the UAI and UAI-2008 instances run.",
        ]
    )
    record["wins_on_uai_instances"] = wins
    (out / "grid_study.json").write_text(json.dumps(record, indent=1))
    (out / "grid_study.md").write_text(f"# Neural blocks vs Gibbs on grids\n\n{table}\n")
    return table


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        record = json.loads(Path(args.from_json).read_text())
        cfg = record["config"]
        table = write_outputs(record, Path(args.from_json).parent, cfg["seconds"], cfg["seeds"])
        print(table)
        return record
    torch.set_num_threads(args.threads)
    config = {k: v for k, v in sorted(vars(args).items()) if k != "out"}
    out = Path(args.out) / hashlib.sha256(json.dumps(config).encode()).hexdigest()[:10]
    out.mkdir(parents=True, exist_ok=True)
    proposals = {"mrf": load_pretrained("grid-mrf-2x2"), "bn": load_pretrained("grid-bn-2x2")}
    record: dict = {"config": config, "instances": {}}
    instances = load_instances(args)
    jobs = [(name, s) for name in instances for s in range(args.seeds)]
    for name, s in tqdm(jobs, desc="grid study"):
        fg, exact, family = instances[name]
        runs = record["instances"].setdefault(name, {"family": family, "num_variables": fg.num_variables, "runs": []})
        makers = {
            "NB+Gibbs": lambda fg=fg, family=family: NeuralBlockKernel(
                fg, proposals=[proposals[family]], gibbs_prob=args.gibbs_prob
            ),
            "Gibbs": lambda fg=fg: GibbsKernel(fg),
        }
        run = {"seed": args.seed + s}
        for label, make in makers.items():
            pyro.set_rng_seed(args.seed + s)
            run[label] = run_for_seconds(make, fg, exact, args.seconds, progress=False)
        gibbs_final = run["Gibbs"]["errors"][-1]
        reach = time_to_reach(run["NB+Gibbs"], gibbs_final)
        run["nb_time_to_gibbs_final_fraction"] = None if reach is None else reach / run["Gibbs"]["seconds"][-1]
        runs["runs"].append(run)
    table = write_outputs(record, out, args.seconds, args.seeds)
    print(table)
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
