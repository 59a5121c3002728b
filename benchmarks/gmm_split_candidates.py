"""What the split candidates buy: NB with and without them, beside split-merge, at equal time, side by side.

On models of at least 500 points the compiled pair sweep mixes data-refined candidates into the network's
proposal (:class:`~neuralblock.kernels.jit_mixture.CandidateOptions`). The *split* candidates (``splits``, default
2) start both means of a pair at a refined location plus and minus the principal half-spread of the points it
explains and take the EM steps: a cluster two means fit better than one, as a split-merge move would split it.
Here each case runs three samplers from the same starts for the same CPU time (one torch thread):

* ``split-merge``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM` (``gibbs_prob=0.5``);
* ``NB (no splits)``: :class:`~neuralblock.NeuralBlockKernel` with the shipped ``gmm_pair_copies`` proposal
  (``gibbs_prob=0.5``) and ``CandidateOptions(splits=0)``, the candidates before;
* ``NB (splits)``: the same with the default ``CandidateOptions()``.

Each sampler runs ``--repeats`` times (``--chains`` vectorized chains each, a different run seed each time) and its
chains are pooled, so a case's time is read from ``repeats x chains`` chains: the study at scale reads 5, whose
ratios change by 2x from run to run at these sizes. The cases are held-out draws of the benchmark's families
(:func:`experiments.gmm_models.family_gmm`) at generator seeds ``--seeds``, every family at every size of
``--sizes``, each run for ``--seconds * (m n / (16 * 240)) ** 0.5`` CPU seconds (at most ``--max-seconds``). The
level of a case is the study's robust one from the pooled split-merge chains: the lower median of their mean log
joint over the last quarter of the run, minus 2 nats. A sampler's time to it is the censored lower median over
its pooled chains of their first time there. Reported per case: those times, ``NB / split-merge`` per setting and
``splits / no splits``; over the cases, the geometric means and medians of the ratios.

Run it from the repository root::

    python benchmarks/gmm_split_candidates.py           # full run (about 20 minutes)
    python benchmarks/gmm_split_candidates.py --quick   # smoke test: one small case, short runs

It writes ``gmm_split_candidates.json`` and ``gmm_split_candidates.md`` into ``--out`` (default
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import cell, write_results  # noqa: E402
from gmm_mean_moves import run_held_out, summary_lines  # noqa: E402
from gmm_pair_step import parse_size  # noqa: E402

from experiments.common import lower_median  # noqa: E402
from experiments.gmm_models import GMM_FAMILIES, chain_traces, family_gmm, first_time_above, run_sampler  # noqa: E402
from experiments.gmm_scale import (  # noqa: E402
    case_starts,
    last_part_mean,
    run_seconds,
    time_ratio,
)
from experiments.gmm_study import censored_lower_median  # noqa: E402
from neuralblock import NeuralBlockKernel  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.kernels.base import GraphKernel  # noqa: E402
from neuralblock.kernels.fused_mixture import FusedMixtureSweep  # noqa: E402
from neuralblock.kernels.split_merge import SplitMergeGMM  # noqa: E402
from neuralblock.proposals import NeuralBlockProposal  # noqa: E402

__all__ = ["SAMPLERS", "main"]

SAMPLERS = ("split-merge", "NB (no splits)", "NB (splits)")


def build(sampler: str, fg: FactorGraph, proposal: NeuralBlockProposal, chains: int) -> GraphKernel:
    """One sampler's kernel of ``chains`` chains on ``fg``."""
    if sampler == "split-merge":
        return SplitMergeGMM(fg, gibbs_prob=0.5, chains=chains)
    return NeuralBlockKernel(fg, [proposal], gibbs_prob=0.5, chains=chains)


@contextmanager
def candidate_splits(sampler: str) -> Iterator[None]:
    """The pair sweeps a kernel sets up meanwhile take ``splits=0`` for ``NB (no splits)`` (restored after)."""
    shipped = FusedMixtureSweep.default_candidates
    if sampler == "NB (no splits)" and shipped is not None:
        FusedMixtureSweep.default_candidates = shipped._replace(splits=0)
    try:
        yield
    finally:
        FusedMixtureSweep.default_candidates = shipped


def run_case(args: argparse.Namespace, proposal: NeuralBlockProposal, m: int, n: int, family: str, seed: int) -> dict:
    """Every sampler ``--repeats`` times on one case; the level, the times to it over the pooled chains, the ratios."""
    fg, _, reference = family_gmm(family, m, n, seed)
    start = case_starts(fg, reference["seed"], args.chains)
    seconds = run_seconds(m, n, args.seconds, args.max_seconds)
    chains: dict[str, list[dict[str, list[float]]]] = {sampler: [] for sampler in SAMPLERS}
    for repeat in range(args.repeats):
        for sampler in SAMPLERS:
            run_seed = reference["seed"] + 1000 * repeat
            with candidate_splits(sampler):  # (the kernel makes its sweeps at setup, in the run)
                record = run_sampler(
                    build(sampler, fg, proposal, args.chains), start, seconds, seed=run_seed, clock="cpu"
                )
            chains[sampler] += chain_traces(record)
    level = lower_median([last_part_mean(c["times"], c["log_joint"]) for c in chains["split-merge"]]) - 2.0
    times = {
        sampler: censored_lower_median([first_time_above(c["times"], c["log_joint"], level) for c in traces])
        for sampler, traces in chains.items()
    }
    ratios = {f"{s} / split-merge": time_ratio(times[s], times["split-merge"]) for s in SAMPLERS[1:]}
    ratios["splits / no splits"] = time_ratio(times["NB (splits)"], times["NB (no splits)"])
    return {
        "m": m,
        "n": n,
        "family": family,
        "seed": seed,
        "seconds": seconds,
        "level": round(level, 3),
        "time_to_level": times,
        "ratios": ratios,
    }


def _markdown(result: dict[str, Any]) -> str:
    names = list(result["cases"][0]["ratios"])
    lines = [
        "# What the split candidates buy: NB with and without them, beside split-merge",
        "",
        f"Each sampler {result['repeats']} times x {result['chains']} chains from the same starts for the same CPU "
        f"time (one torch thread), chains pooled, on held-out cases (generator seeds "
        f"{', '.join(map(str, result['seeds']))}). Time to the case's robust level (the pooled split-merge chains' "
        "lower median of their last-quarter mean log joint, minus 2 nats): the censored lower median over the pooled "
        "chains of their first time there, in seconds (empty: the median chain never got there). Load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}.",
        "",
        "| m x n | family | seed | " + " | ".join(SAMPLERS) + " | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * (len(SAMPLERS) + len(names)),
    ]
    for case in result["cases"]:
        times = [cell(case["time_to_level"][sampler], ".4f") for sampler in SAMPLERS]
        ratios = [cell(case["ratios"][name], ".2f") for name in names]
        lines.append(
            f"| {case['m']}x{case['n']} | {case['family']} | {case['seed']} | " + " | ".join(times + ratios) + " |"
        )
    return "\n".join(lines + summary_lines(result["summary"])) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run every case, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(12, 1000), (20, 1000), (32, 1000)])
    parser.add_argument("--families", nargs="+", choices=GMM_FAMILIES, default=list(GMM_FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[106, 107], help="held-out generator seeds")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs per sampler and case, their chains pooled")
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per run at m n = 16 * 240")
    parser.add_argument("--max-seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="smoke test: one 8x500 model case, 0.3 s runs")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.families, args.seeds, args.chains, args.seconds = [(8, 500)], ["model"], [106], 2, 0.3
    result = run_held_out(args, run_case, ("seeds", "chains", "repeats", "seconds", "max_seconds", "quick"))
    write_results(args.out, "gmm_split_candidates", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
