"""Study (issue 22, item 2): how well does one neural block proposal serve the temperatures of replica exchange?

A tempered replica at inverse temperature ``beta`` targets ``p(x)^beta``: the same grid
motif with every log table scaled by ``beta``. Two arms of
:class:`~neuralblock.kernels.ReplicaExchange` on a fixed geometric ladder (no adaptation, so
every run sees the same ``beta`` s): every temperature proposing with the *untempered*
proposal (``tempered_proposals=False``: MH stays exact, only acceptance suffers), and each
temperature proposing from the proposal raised to its ``beta`` (the default, computed from
the untempered proposal table with no network pass; see
:func:`~neuralblock.kernels.fused_blocks.powered_rows`). Measured: each temperature's block
acceptance (fused path), against the replica's coupling scale ``beta max|w|``. Acceptance,
not time, is measured, so the clock does not matter.

Outputs (under ``--out``, in a folder named by a hash of the config): ``tempered_acceptance.json``,
``tempered_acceptance.md`` and ``tempered_acceptance.png`` (acceptance against the coupling scale).

Usage::

    python -m experiments.tempered_acceptance --quick   # CI scale: one grid, a few sweeps
    python -m experiments.tempered_acceptance           # the 8 UAI Ising grids (a few minutes)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.infer import MCMC
from tqdm import tqdm

from experiments.common import parse_quick, pyplot, study_parser
from neuralblock import ReplicaExchange, load_pretrained
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json, write_report
from neuralblock.graph import FactorGraph, TableGroup
from neuralblock.io import read_uai, uai_grid

UAI = [f"Grids_{i}" for i in range(11, 19)]
COLUMNS = [
    "instance",
    "beta",
    "coupling beta x max_w",
    "block acceptance (untempered proposal)",
    "block acceptance (tempered proposal)",
]


def coupling_scale(fg: FactorGraph) -> float:
    """``max |w|`` over the pairwise Ising tables ``[[w, -w], [-w, w]]`` of a grid (half a table's spread).

    Example:
        >>> fg = FactorGraph(); a, b = fg.add_variables(2, cardinality=2)
        >>> _ = fg.add_table_factor([a, b], torch.tensor([[3.0, -3.0], [-3.0, 3.0]]))
        >>> coupling_scale(fg)
        3.0
    """
    scale = 0.0
    for group in fg.groups:
        if isinstance(group, TableGroup) and group.scopes.shape[1] == 2 and group.num_factors:
            tables = group.log_tables.reshape(group.num_factors, -1)
            scale = max(scale, float((tables.amax(-1) - tables.amin(-1)).max()) / 2)
    return scale


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-temperature", type=float, default=10.0, help="the ladder's hottest temperature")
    parser.add_argument("--chains", type=int, default=4, help="independent ensembles")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instances", nargs="*", default=UAI)
    parser.add_argument("--quick", action="store_true", help="CI scale")
    parser.add_argument("--out", default="experiments/results/tempered_acceptance")
    quick = {"instances": ["Grids_11"], "warmup": 5, "samples": 20, "replicas": 4, "chains": 2}
    return parse_quick(parser, argv, quick)


def run_instance(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Block acceptance per temperature of neural replicas on one grid, with the replicas' coupling scales."""
    fg = read_uai(uai_grid(name))
    acceptance = {}
    for tempered in (False, True):
        pyro.set_rng_seed(args.seed)
        kernel = ReplicaExchange(
            fg,
            proposals=[load_pretrained("grid-mrf-2x2")],
            replicas=args.replicas,
            max_temperature=args.max_temperature,
            chains=args.chains,
            adapt=False,
            tempered_proposals=tempered,
            neural_replicas=None,  # every temperature's block acceptance
            tempered_tables=None,  # each temperature's own powered rows
        )
        MCMC(kernel, num_samples=args.samples, warmup_steps=args.warmup, disable_progbar=True).run()
        diagnostics = kernel.diagnostics()
        if diagnostics["tempered_proposals"] != tempered:
            raise RuntimeError(f"{name}: the tempered proposal tables were not built")
        acceptance[tempered] = diagnostics["block_acceptance_by_temperature"]
    scale = coupling_scale(fg)
    betas = [1.0 / t for t in diagnostics["temperatures"]]
    return {
        "instance": name,
        "max_coupling": scale,
        "beta": betas,
        "replica_coupling": [b * scale for b in betas],
        "block_acceptance": acceptance[False],
        "block_acceptance_tempered": acceptance[True],
        "swap_acceptance": diagnostics["swap_acceptance"],
    }


def summary_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (instance, temperature)."""
    rows = []
    for run in runs:
        for r, beta in enumerate(run["beta"]):
            rows.append(
                {
                    "instance": run["instance"],
                    "beta": round(beta, 4),
                    "coupling beta x max_w": round(run["replica_coupling"][r], 3),
                    "block acceptance (untempered proposal)": round(run["block_acceptance"][r], 4),
                    "block acceptance (tempered proposal)": round(run["block_acceptance_tempered"][r], 4),
                }
            )
    return rows


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Block acceptance against each replica's coupling scale, one line per grid."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for run in runs:
        line = ax.plot(run["replica_coupling"], run["block_acceptance"], marker="o", label=run["instance"])[0]
        ax.plot(run["replica_coupling"], run["block_acceptance_tempered"], marker="x", ls="--", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("replica coupling scale beta x max|w|")
    ax.set_ylabel("block acceptance (solid: untempered proposal, dashed: tempered)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every instance; write JSON, markdown and a PNG; return the record."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    config = {k: v for k, v in sorted(vars(args).items()) if k != "out"}
    folder = study_folder(args.out, config)
    runs = [run_instance(name, args) for name in tqdm(args.instances, desc="tempered acceptance")]
    gains = [t - u for run in runs for u, t in zip(run["block_acceptance"], run["block_acceptance_tempered"])]
    tempered = [a for run in runs for a in run["block_acceptance_tempered"]]
    untempered = [a for run in runs for a in run["block_acceptance"]]
    record = {"config": config, "runs": runs, "acceptance_gains": gains}
    write_json(folder / "tempered_acceptance.json", record)
    lines = [
        "# Neural block acceptance per temperature of replica exchange",
        "",
        f"`grid-mrf-2x2` replicas, {args.replicas} temperatures from 1 "
        f"to {args.max_temperature:g} (geometric, "
        f"not adapted), {args.chains} ensembles, {args.warmup} warmup and {args.samples} recorded sweeps. Two arms "
        "per grid: every temperature proposing with the untempered proposal, and each temperature proposing from "
        "the proposal raised to its beta (the default). Block acceptance over all replicas: untempered "
        f"{min(untempered):.3f}-{max(untempered):.3f}, tempered {min(tempered):.3f}-{max(tempered):.3f}; tempered "
        f"minus untempered {min(gains):+.3f} to {max(gains):+.3f} (mean {sum(gains) / len(gains):+.3f}).",
        "",
        markdown_table(summary_rows(runs), COLUMNS),
    ]
    plot(runs, folder / "tempered_acceptance.png")
    write_report(folder, "tempered_acceptance.md", "\n".join(lines) + "\n")
    return record


if __name__ == "__main__":
    main()
