"""Split-merge sweeps of open-universe GMMs: the compiled loop against the eager batched moves, side by side.

Times one split-merge sweep of :class:`~neuralblock.kernels.split_merge.SplitMergeGMM` (``m (m - 1) / 2`` move
attempts of each of ``--chains`` vectorized chains, the baseline of the GMM benchmark) in three arms:

* ``compiled``: this checkout's default, one Numba call per sweep (:mod:`neuralblock.kernels.jit_split_merge`);
* ``eager``: the batched torch moves (``compiled=False``), the same moves and births from 64 seed points;
* ``eager, all-point births``: the eager moves with every point seeding a birth (``birth_seeds`` at least ``n``):
  the ``O(n^2)`` birth proposal the kernel had before the seed points (the same as the others where ``n <= 64``).

The arms run in this process, in turn within each round, from the same start (CPU time per ``sample`` call, a
split-merge sweep at ``gibbs_prob=0``, over about ``--budget`` seconds and at least one call, after one untimed
call; one torch thread); ratios are paired per round
and their median reported. The cases are GMM benchmark cases (:func:`experiments.gmm_models.family_gmm`), started
from the benchmark's random starts.

Run it from the repository root::

    python benchmarks/split_merge_sweep.py           # full run (a few minutes)
    python benchmarks/split_merge_sweep.py --quick   # smoke test: one small size, one short round

It writes ``split_merge_sweep.json`` and ``split_merge_sweep.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import paired_ratio, sweep_seconds, write_results  # noqa: E402
from gmm_pair_step import parse_size, size_ratio_lines  # noqa: E402

from experiments.gmm_models import family_gmm  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.kernels.base import sequential_init  # noqa: E402
from neuralblock.kernels.split_merge import MoveTuning, SplitMergeGMM  # noqa: E402

__all__ = ["main"]

ARMS = ("compiled", "eager", "eager, all-point births")


def _kernel(fg: FactorGraph, start: torch.Tensor, arm: str, points: int) -> SplitMergeGMM:
    """A set-up ``SplitMergeGMM`` of an arm (moves only) on ``fg``'s chains ``start``."""
    tuning = MoveTuning(birth_seeds=max(points, MoveTuning().birth_seeds)) if arm == ARMS[2] else None
    kernel = SplitMergeGMM(fg, gibbs_prob=0.0, chains=len(start), compiled=None if arm == ARMS[0] else False,
                           tuning=tuning)  # fmt: skip
    kernel.initial_params = {"x": start}
    kernel.setup(0)
    if kernel.diagnostics()["compiled_moves"] != (arm == ARMS[0]):
        raise RuntimeError(f"the {arm!r} arm did not get its path (Numba missing?)")
    return kernel


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every size: the arms in turn per round, medians and the paired ratios."""
    torch.set_num_threads(1)
    sizes: dict[str, Any] = {}
    for m, n in args.sizes:
        fg, _, reference = family_gmm(args.family, m, n)
        start = sequential_init(fg, torch.Generator().manual_seed(reference["seed"]), chains=args.chains)
        kernels = {arm: _kernel(fg, start, arm, n) for arm in ARMS}
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                torch.manual_seed(0)
                kernels[arm].initial_params = {"x": start}
                times[arm].append(sweep_seconds(kernels[arm], args.budget, warm=1, least=1))
        attempts = m * (m - 1) // 2 * args.chains
        sizes[f"{m}x{n}"] = {
            "ms_per_sweep": {arm: 1e3 * statistics.median(values) for arm, values in times.items()},
            "us_per_chain_attempt": {arm: 1e6 * statistics.median(values) / attempts for arm, values in times.items()},
            "rounds_ms": {arm: [1e3 * v for v in values] for arm, values in times.items()},
            "ratios": {
                "compiled / eager": paired_ratio(times, "compiled", "eager"),
                "compiled / eager, all-point births": paired_ratio(times, "compiled", ARMS[2]),
            },
        }
    return {"sizes": sizes}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Split-merge sweeps of open-universe GMMs: compiled against eager",
        "",
        f"`SplitMergeGMM(gibbs_prob=0)`, one split-merge sweep (`m (m - 1) / 2` move attempts per chain) of "
        f"{result['chains']} vectorized chains on the GMM benchmark's `{result['family']}` cases. `compiled`: the "
        "default, one Numba call per sweep; `eager`: the batched torch moves (`compiled=False`); `eager, all-point "
        "births`: the eager moves with every point seeding a birth (the O(n^2) birth proposal). CPU, one torch "
        "thread, CPU "
        f"time per sweep over about {result['budget']} s per arm and round after one untimed sweep, medians over "
        f"{result['rounds']} interleaved rounds in one process, same start and seed. Load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}.",
        "",
        "| m x n | arm | ms per sweep | us per chain-attempt |",
        "|---|---|---|---|",
    ]
    for size, row in result["sizes"].items():
        for arm, ms in row["ms_per_sweep"].items():
            lines.append(f"| {size} | {arm} | {ms:.2f} | {row['us_per_chain_attempt'][arm]:.1f} |")
    lines += size_ratio_lines(result["sizes"])
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run the comparison, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    default_sizes = [(12, 60), (32, 60), (16, 240), (12, 1000), (32, 1000)]
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=default_sizes)
    parser.add_argument("--family", default="unequal", help="the GMM benchmark's case family")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
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
    write_results(args.out, "split_merge_sweep", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
