"""Exact marginals and log Z of the UAI 2008 ERG grid Bayesian networks.

The three Sang-Beame-Kautz grid BNs (``90-10-1``, ``90-14-1``, ``90-16-1``) ship without
reference solutions. This script computes them with :func:`neuralblock.exact.marginals`
and writes, next to each ``.erg.gz``:

* ``90-XX-1.MAR``: the single-variable marginals in UAI ``MAR`` format;
* ``90-XX-1.PR``: ``log10 Z`` (1 up to rounding for a BN without evidence);

plus a JSON record (timings, log Z, the largest clique) and a markdown table in
``experiments/results/``.

Example:
    python -m experiments.grid_bn_exact_marginals            # all three grids
    python -m experiments.grid_bn_exact_marginals --quick    # the 10x10 one only
"""

from __future__ import annotations

import json
import math
import platform
import resource
import time
from pathlib import Path

import torch

from experiments.common import study_parser
from neuralblock.diagnostics.reports import config_hash
from neuralblock.exact import marginals
from neuralblock.io import erg_grid, read_erg, write_mar

__all__ = ["GRIDS", "main", "run_grid"]

GRIDS = ("90-10-1", "90-14-1", "90-16-1")
RESULTS = Path(__file__).resolve().parent / "results"


def run_grid(name: str, out_dir: Path | None = None) -> dict:
    """Compute and write the exact marginals and log10 Z of one ERG grid BN.

    Args:
        name: ``"90-10-1"``, ``"90-14-1"`` or ``"90-16-1"``.
        out_dir: where to write ``<name>.MAR`` / ``<name>.PR`` (default: next to the ``.erg.gz``).

    Returns:
        A record with the paths, ``log_z`` (natural log), ``log10_z`` and timings in seconds.
    """
    path = erg_grid(name)
    out_dir = path.parent if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fg = read_erg(path)
    t1 = time.perf_counter()
    probs, log_z = marginals(fg)
    t2 = time.perf_counter()
    cards = fg.cardinalities.tolist()
    mar_path, pr_path = out_dir / f"{name}.MAR", out_dir / f"{name}.PR"
    write_mar(mar_path, probs, cards)
    log10_z = log_z / math.log(10.0)
    pr_path.write_text(f"PR\n{log10_z:.10g}\n")
    return {
        "name": name,
        "source": str(path.name),
        "num_variables": fg.num_variables,
        "num_factors": fg.num_factors,
        "log_z": log_z,
        "log10_z": log10_z,
        "read_s": t1 - t0,
        "inference_s": t2 - t1,
        "mar": str(mar_path),
        "pr": str(pr_path),
    }


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; returns the JSON record it writes."""
    parser = study_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="only the 10x10 grid")
    parser.add_argument("--seed", type=int, default=0, help="unused (exact computation); kept for the CLI convention")
    parser.add_argument("--out-dir", type=Path, default=None, help="where the .MAR/.PR go (default: beside the data)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON record and table")
    args = parser.parse_args(argv)
    grids = GRIDS[:1] if args.quick else GRIDS
    config = {"grids": list(grids), "seed": args.seed}
    key = config_hash(config)
    rows = []
    for name in grids:
        row = run_grid(name, args.out_dir)
        rows.append(row)
        print(f"{name}: log10 Z = {row['log10_z']:.6f}, inference {row['inference_s']:.2f} s", flush=True)
    record = {
        "experiment": "grid_bn_exact_marginals",
        "config": config,
        "config_hash": key,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": rows,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"grid_bn_exact_marginals_{key}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    table = ["| grid | variables | log10 Z | inference (s) |", "|---|---|---|---|"]
    table += [f"| {r['name']} | {r['num_variables']} | {r['log10_z']:.6f} | {r['inference_s']:.2f} |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(table) + "\n")
    return record


if __name__ == "__main__":
    main()
