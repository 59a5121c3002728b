"""The README's main job: sample a shipped UAI grid and report marginal error.

Runs single-site Gibbs (``GibbsKernel`` inside ``pyro.infer.MCMC``) on a shipped UAI
grid, compares the sampled marginals with the shipped exact ``.MAR`` marginals, prints
an error-vs-sweeps/time table and writes a PNG plot and a JSON record.

Run it with ``python -m neuralblock.quickstart`` (``--help`` lists the options).

Example:
    >>> from neuralblock.quickstart import main
    >>> result = main(["--grid", "Grids_12", "--sweeps", "20", "--no-progress", "--out", "/tmp/nb-qs"])
    >>> result["final_error"] < 0.5
    True
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyro
import torch

from neuralblock.diagnostics import trace_marginal_error
from neuralblock.diagnostics.plots import plot_error_traces
from neuralblock.io import read_mar, read_uai, uai_grid
from neuralblock.kernels import GibbsKernel

__all__ = ["main"]

GRIDS = [f"Grids_{i}" for i in range(11, 19)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m neuralblock.quickstart",
        description="Gibbs on a shipped UAI grid: marginal error against the exact marginals.",
    )
    parser.add_argument("--grid", default="Grids_15", choices=GRIDS, help="shipped UAI grid (default: %(default)s)")
    parser.add_argument("--sweeps", type=int, default=3000, help="post-warmup sweeps (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=100, help="warmup sweeps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: %(default)s)")
    parser.add_argument("--out", default="outputs/quickstart", help="output folder (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the quickstart; returns the JSON record it writes."""
    args = _parser().parse_args(argv)
    if args.sweeps < 1 or args.warmup < 0:
        raise ValueError(f"--sweeps must be >= 1 and --warmup >= 0, got {args.sweeps}, {args.warmup}")
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(args.seed)
    fg = read_uai(uai_grid(args.grid))
    exact = read_mar(uai_grid(args.grid, "MAR"))
    trace = trace_marginal_error(
        GibbsKernel(fg), fg, exact, args.sweeps, args.warmup, progress=not args.no_progress, num_points=12
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"grid": args.grid, "sampler": "Gibbs", **vars(args), "trace": trace, "final_error": trace["errors"][-1]}
    (out / "quickstart.json").write_text(json.dumps(record, indent=2))
    plot_error_traces({"Gibbs": [trace]}, out / "quickstart.png", title=f"{args.grid}: Gibbs vs exact marginals")
    print(f"\n{args.grid} ({fg.num_variables} variables): Gibbs marginal error vs exact marginals")
    print(f"{'sweeps':>8} {'seconds':>9} {'mean |error|':>13}")
    for sweeps, seconds, error in zip(trace["sweeps"], trace["seconds"], trace["errors"]):
        print(f"{sweeps:>8} {seconds:>9.3f} {error:>13.4f}")
    rate = trace["diagnostics"]["updates_per_second"]
    print(f"single-site updates/s: {rate:,.0f}")
    print(f"wrote {out / 'quickstart.png'} and {out / 'quickstart.json'}")
    return record


if __name__ == "__main__":
    main()
