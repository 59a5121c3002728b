"""Study: single-site Gibbs on the shipped UAI grids, marginal error vs sweeps and time.

The baseline the neural block kernel must beat. For each grid and seed, runs
``GibbsKernel`` through the run harness (:func:`neuralblock.diagnostics.runs.marginal_error_run`,
``clock="wall"``) and records the mean absolute marginal error of the draws so far against the
shipped exact marginals at log-spaced checkpoints. The seconds are the harness's sampling time (the
sweeps alone; before the harness, ``pyro.infer.MCMC``'s per-sweep bookkeeping counted too), and
``total_seconds`` is setup + warmup + sampling.

Outputs (under ``--out``, in a folder named by a hash of the config):
``gibbs_grids.json`` (every trace), ``gibbs_grids.md`` (table) and one PNG per grid.

Usage::

    python -m experiments.gibbs_grids --quick          # CI scale, seconds
    python -m experiments.gibbs_grids                  # full run (about 10 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json

import pyro
import torch

from experiments.common import add_run_options, parse_quick, study_parser
from neuralblock import GibbsKernel
from neuralblock.diagnostics.plots import plot_error_traces
from neuralblock.diagnostics.reports import write_report
from neuralblock.diagnostics.runs import marginal_error_run, study_folder
from neuralblock.io import read_mar, read_uai, uai_grid

ALL_GRIDS = [f"Grids_{i}" for i in range(11, 19)]
DEFAULT_GRIDS = ["Grids_15", "Grids_11"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--grids", nargs="+", default=DEFAULT_GRIDS, choices=ALL_GRIDS)
    parser.add_argument("--sweeps", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2, help="independent chains per grid")
    add_run_options(parser, "experiments/results/gibbs_grids", "CI scale: 200 sweeps, one seed", no_progress=True)
    return parse_quick(parser, argv, {"sweeps": 200, "seeds": 1, "warmup": 10})


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = study_folder(args.out, {k: v for k, v in vars(args).items() if k not in {"out", "no_progress"}})
    record: dict = {"config": vars(args), "grids": {}}
    for grid in args.grids:
        fg = read_uai(uai_grid(grid))
        exact = read_mar(uai_grid(grid, "MAR"))
        runs = []
        for s in range(args.seeds):
            pyro.set_rng_seed(args.seed + s)
            run = marginal_error_run(
                GibbsKernel(fg), fg, exact, samples=args.sweeps, warmup=args.warmup, progress=not args.no_progress
            )
            runs.append(
                {
                    **run.trace.as_dict(),
                    "diagnostics": run.diagnostics,
                    "seed": args.seed + s,
                    "total_seconds": run.total_s,
                }
            )
        record["grids"][grid] = {"num_variables": fg.num_variables, "runs": runs}
        plot_error_traces({"Gibbs": runs}, out / f"{grid}.png", title=f"{grid}: Gibbs", reference=0.03)
    (out / "gibbs_grids.json").write_text(json.dumps(record, indent=1))
    lines = [
        "| grid | vars | seed | sweeps | sampling s | error @10% sweeps | final error | updates/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for grid, entry in record["grids"].items():
        for run in entry["runs"]:
            tenth = next(e for s, e in zip(run["sweeps"], run["errors"]) if s >= run["sweeps"][-1] / 10)
            lines.append(
                f"| {grid} | {entry['num_variables']} | {run['seed']} | {run['sweeps'][-1]} | "
                f"{run['seconds'][-1]:.1f} | {tenth:.4f} | {run['errors'][-1]:.4f} | "
                f"{run['diagnostics']['updates_per_second']:,.0f} |"
            )
    table = "\n".join(lines)
    write_report(out, "gibbs_grids.md", f"# Gibbs on UAI grids\n\nConfig: `{json.dumps(vars(args))}`\n\n{table}\n")
    return record


if __name__ == "__main__":
    main()
