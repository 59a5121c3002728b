"""The single-site sweep of open-universe GMMs: the compiled mixture sweep against the general path, side by side.

Times, in interleaved rounds, one :class:`~neuralblock.kernels.single_site.SingleSiteSweep` sweep (a Gibbs
draw of every activity bit, random-walk MH on every mean coordinate) of ``--chains`` vectorized chains, the
single-site half of ``NeuralBlockKernel`` and ``SplitMergeGMM`` (``gibbs_prob``), in four arms:

* ``compiled``: :class:`~neuralblock.kernels.mixture_sites.MixtureSites` (one Numba loop, ``O(n)`` per
  variable), without the informed mean moves and the copy-set moves: the general path's updates;
* ``general``: the general path (``mixture_sites = None``: a torch scaffold evaluation of every point's
  factor over all ``m`` mixtures per variable);
* ``compiled + informed``: the compiled sweep with an informed MH move of each active mixture's mean (the
  Gaussian of one EM step), which the general path does not make;
* ``default``: this checkout's default on GMM graphs, the compiled sweep with the informed moves, followed by
  the copy-set moves (:class:`~neuralblock.kernels.mixture_copies.MixtureCopyMoves`, 8 attempts), which the
  general path does not make either.

A sweep's cost is half of the story: ``benchmarks/gmm_mean_moves.py`` measures what the informed moves buy.

The arms run in this process, in turn within each round, from the same start (CPU time per sweep over
about ``--budget`` seconds, one torch thread); ratios are paired per round and their median reported. The
cases are GMM benchmark cases (:func:`experiments.gmm_models.family_gmm`) of every size in ``--sizes``.

Run it from the repository root::

    python benchmarks/gmm_single_site.py           # full run (about a minute)
    python benchmarks/gmm_single_site.py --quick   # smoke test: one small size, one short round

It writes ``gmm_single_site.json`` and ``gmm_single_site.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import paired_ratio, write_results  # noqa: E402
from gmm_pair_step import parse_size, size_ratio_lines  # noqa: E402

from experiments.gmm_models import family_gmm  # noqa: E402
from neuralblock.kernels.base import sequential_init  # noqa: E402
from neuralblock.kernels.single_site import SingleSiteSweep  # noqa: E402

__all__ = ["main", "time_sweeps"]

ARMS = ("compiled", "general", "compiled + informed", "default")


def time_sweeps(sweep: SingleSiteSweep, fg: Any, state: torch.Tensor, budget: float) -> float:
    """CPU seconds per sweep of ``sweep`` from ``state``, over about ``budget`` seconds after one untimed sweep.

    Example:
        >>> from motifs.gmm_pair import gmm_graph
        >>> fg = gmm_graph(torch.randn(10, 2), 3, 1.0, 2.0, 0.5)
        >>> time_sweeps(SingleSiteSweep(fg), fg, fg.initial_state(), 0.01) > 0
        True
    """
    state = sweep.sweep(fg, state, adapt=False)
    sweeps, start = 0, time.process_time()
    while sweeps < 2 or time.process_time() - start < budget:
        state = sweep.sweep(fg, state, adapt=False)
        sweeps += 1
    return (time.process_time() - start) / sweeps


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every size: the arms in turn per round, medians and the paired ratio."""
    torch.set_num_threads(1)
    sizes: dict[str, Any] = {}
    for m, n in args.sizes:
        fg, _, reference = family_gmm(args.family, m, n)
        start = sequential_init(fg, torch.Generator().manual_seed(reference["seed"]), chains=args.chains)
        sweeps = {
            "compiled": SingleSiteSweep(fg, copy_moves=False, informed_means=False, label_steps=0),
            "general": SingleSiteSweep(fg, copy_moves=False, informed_means=False, label_steps=0),
            "compiled + informed": SingleSiteSweep(fg, copy_moves=False, label_steps=0),
            "default": SingleSiteSweep(fg),
        }
        sweeps["general"].mixture_sites = None
        if sweeps["compiled"].mixture_sites is None:
            raise RuntimeError("the compiled mixture sweep is unavailable (Numba missing?)")
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                torch.manual_seed(0)
                times[arm].append(time_sweeps(sweeps[arm], fg, start, args.budget))
        sizes[f"{m}x{n}"] = {
            "ms_per_sweep": {arm: 1e3 * statistics.median(values) for arm, values in times.items()},
            "rounds_ms": {arm: [1e3 * v for v in values] for arm, values in times.items()},
            "ratios": {
                "compiled / general": paired_ratio(times, "compiled", "general"),
                "(compiled + informed) / compiled": paired_ratio(times, "compiled + informed", "compiled"),
                "default / compiled": paired_ratio(times, "default", "compiled"),
            },
        }
    return {"sizes": sizes}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The single-site sweep of open-universe GMMs: compiled against the general path",
        "",
        f"`SingleSiteSweep` (a Gibbs draw of every bit, random-walk MH on every mean coordinate), {result['chains']} "
        f"vectorized chains, on the GMM benchmark's `{result['family']}` cases. `compiled`: the `MixtureSites` loop "
        "(the general path's updates); `general`: the general path (`mixture_sites = None`); `compiled + informed`: "
        "the loop with an informed move of each active mean (one EM step's Gaussian); `default`: that loop and 8 "
        "copy-set moves (`MixtureCopyMoves`). CPU, one torch thread, CPU time "
        f"per sweep over about {result['budget']} s per arm and round after one untimed sweep, medians over "
        f"{result['rounds']} interleaved rounds in one process, same start and seed. Load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}.",
        "",
        "| m x n | arm | ms per sweep |",
        "|---|---|---|",
    ]
    for size, row in result["sizes"].items():
        for arm, ms in row["ms_per_sweep"].items():
            lines.append(f"| {size} | {arm} | {ms:.2f} |")
    lines += size_ratio_lines(result["sizes"])
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run the comparison, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(16, 60), (16, 240), (20, 1000), (32, 1000)])
    parser.add_argument("--family", default="unequal", help="the GMM benchmark's case family")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=1.0, help="CPU seconds per arm and round")
    parser.add_argument("--quick", action="store_true", help="smoke test: 8x60, one short round")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds, args.budget = [(8, 60)], 1, 0.05
    result = run(args)
    result.update(
        {key: getattr(args, key) for key in ("family", "chains", "rounds", "budget", "quick")},
        load_average=list(os.getloadavg()),
    )
    write_results(args.out, "gmm_single_site", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
