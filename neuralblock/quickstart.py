"""The README's main job: a pretrained neural block proposal vs plain Gibbs on a shipped UAI grid.

Loads the shipped proposal ``grid-mrf-2x2`` (a mixture density network meta-trained on
random 2x2 Ising windows), runs ``NeuralBlockKernel`` (neural 2x2 blocks mixed with
single-site Gibbs) and ``GibbsKernel``, each with the same number of vectorized chains
(``--chains``, their draws pooled), for the same budget of sampling wall time each on a
shipped UAI grid, compares both with the shipped exact marginals, prints an error table and
writes a PNG plot and a JSON record.

The kernels run through the project's run harness
(:func:`neuralblock.diagnostics.runs.marginal_error_run`), which makes the calls
``pyro.infer.MCMC`` makes for a chain (``setup``, ``sample``, ``diagnostics``) and times them
on ``time.perf_counter``: 20 warmup sweeps and the setup are timed apart and left out of the
seconds, and so is the bookkeeping at the error checkpoints.

Run it with ``python -m neuralblock.quickstart`` (``--help`` lists the options).

Example:
    >>> import contextlib, io
    >>> from neuralblock.quickstart import main
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     result = main(["--grid", "Grids_12", "--seconds", "1", "--no-progress", "--out", "/tmp/nb-qs"])
    >>> sorted(result["samplers"])
    ['Gibbs', 'NB+Gibbs']
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro
import torch

from neuralblock.diagnostics.plots import plot_error_traces
from neuralblock.diagnostics.runs import equal_time, error_at, marginal_error_run
from neuralblock.io import read_mar, read_uai, uai_grid
from neuralblock.kernels import GibbsKernel, GraphKernel, NeuralBlockKernel
from neuralblock.proposals import list_pretrained, load_pretrained

__all__ = ["main"]

GRIDS = [f"Grids_{i}" for i in range(11, 19)]
WARMUP = 20  # sweeps before the timed ones (lazy torch initialisation, caches)
CHECKPOINTS = 14  # about how many log-spaced error checkpoints per run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m neuralblock.quickstart",
        description="Neural block MCMC (pretrained proposal) vs Gibbs on a shipped UAI grid, "
        "against the exact marginals.",
    )
    parser.add_argument("--grid", default="Grids_11", choices=GRIDS, help="shipped UAI grid (default: %(default)s)")
    parser.add_argument("--proposal", default="grid-mrf-2x2", help="shipped proposal (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="wall time per sampler (default: %(default)s)")
    parser.add_argument("--gibbs-prob", type=float, default=0.5, help="single-site sweep probability (NB kernel)")
    parser.add_argument(
        "--chains", type=int, default=16, help="vectorized chains per sampler, pooled (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: %(default)s)")
    parser.add_argument("--out", default="outputs/quickstart", help="output folder (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the quickstart; returns the JSON record it writes."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    if args.chains < 1:
        parser.error(f"--chains must be a positive integer, got {args.chains}")
    if args.proposal not in list_pretrained():
        parser.error(f"unknown proposal {args.proposal!r}; shipped: {', '.join(list_pretrained())}")
    torch.set_num_threads(args.threads)
    fg = read_uai(uai_grid(args.grid))
    exact = read_mar(uai_grid(args.grid, "MAR"))
    proposal = load_pretrained(args.proposal)
    samplers: dict[str, Callable[[], GraphKernel]] = {
        "NB+Gibbs": lambda: NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=args.gibbs_prob, chains=args.chains),
        "Gibbs": lambda: GibbsKernel(fg, chains=args.chains),
    }
    traces: dict[str, dict[str, Any]] = {}
    for name, make in samplers.items():
        pyro.set_rng_seed(args.seed)
        print(f"{name}: sampling {args.grid} with {args.chains} chains for about {args.seconds:g} s")
        run = marginal_error_run(
            make(),
            fg,
            exact,
            seconds=args.seconds,
            warmup=WARMUP,
            checkpoints=CHECKPOINTS,
            progress=not args.no_progress,
        )
        traces[name] = {**run.trace.as_dict(), "diagnostics": run.diagnostics, "run": run.summary()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"grid": args.grid, "config": vars(args), "samplers": traces}
    (out / "quickstart.json").write_text(json.dumps(record, indent=2))
    plot_error_traces(
        {name: [trace] for name, trace in traces.items()},
        out / "quickstart.png",
        title=f"{args.grid}: neural blocks ({args.proposal}) vs Gibbs",
    )
    print(f"\n{args.grid} ({fg.num_variables} variables): mean |marginal error| against the exact marginals")
    print(f"{'seconds':>8} " + " ".join(f"{name:>10}" for name in traces))
    common = equal_time(list(traces.values()), same_budget=True)  # each ran the same seconds budget
    for frac in (0.1, 0.25, 0.5, 1.0):
        row = [error_at(trace, frac * common) for trace in traces.values()]
        print(f"{frac * common:>8.1f} " + " ".join(f"{e:>10.4f}" for e in row))
    nb = traces["NB+Gibbs"]["diagnostics"]
    print(f"NB block acceptance: {nb['acceptance_by_proposal']}, blocks/s: {nb['updates_per_second']:,.0f}")
    print(f"wrote {out / 'quickstart.png'} and {out / 'quickstart.json'}")
    return record


if __name__ == "__main__":
    main()
