"""What the informed mean moves buy: every GMM sampler with and without them, at equal time, side by side.

The compiled single-site sweep of an open-universe GMM (:mod:`neuralblock.kernels.mixture_sites`) follows each
active mixture's random-walk updates with an informed MH move of its mean (the Gaussian of one EM step,
``informed_means=True``, the default). The sweep is half of every GMM sampler, so each one runs twice per case
here, from the same ``--chains`` starts for the same CPU time: ``walk`` (``informed_means=False``, the sweep
before) and ``informed``. The samplers are those of the GMM benchmark at scale (``experiments/gmm_scale.py``):

* ``split-merge``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM` (``gibbs_prob=0.5``);
* ``NB``: :class:`~neuralblock.NeuralBlockKernel` with the shipped ``gmm_pair_copies`` proposal
  (``gibbs_prob=0.5``);
* ``Gibbs only``: the single-site sweep alone (``SplitMergeGMM(gibbs_prob=1)``).

The cases are held-out draws of the benchmark's families (:func:`experiments.gmm_models.family_gmm`) at
generator seeds ``--seeds`` (the study's runs use seeds up to 21), every family of ``--families`` at every size
of ``--sizes``, each run for ``--seconds * max(1, m n / (16 * 240)) ** 0.5`` CPU seconds (one torch thread).
The level of a case is the study's robust one, read from the ``walk`` split-merge run: the lower median over its
chains of the mean log joint over the last quarter of the run, minus 2 nats. Each run's time to it is the
censored lower median over its chains of their first time there. Reported per case: those times, the ratio
``informed / walk`` per sampler and the ratio ``NB / split-merge`` per setting; over the cases, the geometric
means and medians of those ratios.

Run it from the repository root::

    python benchmarks/gmm_mean_moves.py           # full run (about 10 minutes)
    python benchmarks/gmm_mean_moves.py --quick   # smoke test: one small case, short runs

It writes ``gmm_mean_moves.json`` and ``gmm_mean_moves.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import cell, write_results  # noqa: E402
from gmm_pair_step import parse_size  # noqa: E402

from experiments.common import lower_median  # noqa: E402
from experiments.gmm_models import GMM_FAMILIES, chain_traces, family_gmm, first_time_above, run_sampler  # noqa: E402
from experiments.gmm_scale import (  # noqa: E402
    case_starts,
    last_part_mean,
    load_gmm_proposal,
    run_seconds,
    time_ratio,
    warm_up,
)
from experiments.gmm_study import censored_lower_median  # noqa: E402
from neuralblock import NeuralBlockKernel  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.kernels.base import GraphKernel  # noqa: E402
from neuralblock.kernels.split_merge import SplitMergeGMM  # noqa: E402
from neuralblock.proposals import NeuralBlockProposal  # noqa: E402

__all__ = ["main", "ratio_summary", "run_held_out", "summary_lines"]

SAMPLERS = ("split-merge", "NB", "Gibbs only")
SETTINGS = ("walk", "informed")


def build(sampler: str, fg: FactorGraph, proposal: NeuralBlockProposal, chains: int, informed: bool) -> GraphKernel:
    """One sampler's kernel of ``chains`` chains on ``fg``, with or without the informed mean moves."""
    if sampler == "NB":
        return NeuralBlockKernel(fg, [proposal], gibbs_prob=0.5, chains=chains, informed_means=informed)
    gibbs_prob = 1.0 if sampler == "Gibbs only" else 0.5
    return SplitMergeGMM(fg, gibbs_prob=gibbs_prob, chains=chains, informed_means=informed)


def ratio_summary(ratios: Sequence[float | None]) -> dict[str, Any]:
    """Geometric mean and median of the finite ratios, how many there are and how many are above 1.

    Example:
        >>> ratio_summary([0.5, 2.0, None])
        {'geometric_mean': 1.0, 'median': 1.25, 'cases': 2, 'above_1': 1, 'missing': 1}
    """
    finite = [r for r in ratios if r is not None]
    geo = math.exp(statistics.fmean(math.log(r) for r in finite)) if finite else None
    return {
        "geometric_mean": None if geo is None else round(geo, 4),
        "median": statistics.median(finite) if finite else None,
        "cases": len(finite),
        "above_1": sum(r > 1 for r in finite),
        "missing": len(ratios) - len(finite),
    }


def summary_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The markdown table of the :func:`ratio_summary` of each ratio over the cases (after a blank line).

    Example:
        >>> summary_lines({"NB / SM": ratio_summary([0.5])})[-1]
        '| NB / SM | 0.500 | 0.500 | 1 | 0 | 0 |'
    """
    lines = [
        "",
        "| ratio over the cases | geometric mean | median | cases | above 1 | missing |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        lines.append(
            f"| {name} | {cell(row['geometric_mean'], '.3f')} | {cell(row['median'], '.3f')} | {row['cases']} | "
            f"{row['above_1']} | {row['missing']} |"
        )
    return lines


def run_case(args: argparse.Namespace, proposal: NeuralBlockProposal, m: int, n: int, family: str, seed: int) -> dict:
    """Every sampler in both settings on one case; the level, the times to it and the ratios."""
    fg, _, reference = family_gmm(family, m, n, seed)
    start = case_starts(fg, reference["seed"], args.chains)
    seconds = run_seconds(m, n, args.seconds, args.max_seconds)
    runs: dict[tuple[str, str], list[dict[str, list[float]]]] = {}
    acceptance: dict[str, float] = {}
    for sampler in SAMPLERS:
        for setting in SETTINGS:
            kernel = build(sampler, fg, proposal, args.chains, setting == "informed")
            record = run_sampler(kernel, start, seconds, seed=reference["seed"], clock="cpu")
            runs[sampler, setting] = chain_traces(record)
            if setting == "informed":
                acceptance[sampler] = record["diagnostics"]["informed_mean_acceptance"]
    level = lower_median([last_part_mean(c["times"], c["log_joint"]) for c in runs["split-merge", "walk"]]) - 2.0
    times = {
        f"{sampler} ({setting})": censored_lower_median(
            [first_time_above(c["times"], c["log_joint"], level) for c in runs[sampler, setting]]
        )
        for sampler, setting in runs
    }
    ratios = {f"{s}: informed / walk": time_ratio(times[f"{s} (informed)"], times[f"{s} (walk)"]) for s in SAMPLERS}
    for setting in SETTINGS:
        nb, split_merge = times[f"NB ({setting})"], times[f"split-merge ({setting})"]
        ratios[f"NB / split-merge ({setting})"] = time_ratio(nb, split_merge)
    return {
        "m": m,
        "n": n,
        "family": family,
        "seed": seed,
        "seconds": seconds,
        "level": round(level, 3),
        "time_to_level": times,
        "ratios": ratios,
        "informed_mean_acceptance": acceptance,
    }


def run_held_out(args: argparse.Namespace, case_runner: Callable[..., dict], keys: Sequence[str]) -> dict[str, Any]:
    """Run ``case_runner(args, proposal, m, n, family, seed)`` on every held-out case of ``args`` (the shipped
    ``gmm_pair_copies`` proposal, one torch thread); the cases, each ratio's :func:`ratio_summary` and ``keys`` of
    ``args``."""
    torch.set_num_threads(1)
    proposal, _ = load_gmm_proposal("gmm_pair_copies", quick=False)
    warm_up(proposal, args.chains)
    plan = [(m, n, family, seed) for seed in args.seeds for m, n in args.sizes for family in args.families]
    cases = [case_runner(args, proposal, *case) for case in tqdm(plan, desc="cases", disable=args.quick)]
    return {
        "cases": cases,
        "summary": {name: ratio_summary([case["ratios"][name] for case in cases]) for name in cases[0]["ratios"]},
        **{key: getattr(args, key) for key in keys},
        "sizes": [f"{m}x{n}" for m, n in args.sizes],
        "families": args.families,
        "load_average": list(os.getloadavg()),
    }


def _markdown(result: dict[str, Any]) -> str:
    labels = [f"{s} ({setting})" for s in SAMPLERS for setting in SETTINGS]
    lines = [
        "# What the informed mean moves buy: GMM samplers with and without them",
        "",
        f"Each sampler with `informed_means=False` (`walk`, the single-site sweep before) and `True` (`informed`), "
        f"{result['chains']} chains from the same starts for the same CPU time (one torch thread), on held-out "
        f"cases (generator seeds {', '.join(map(str, result['seeds']))}). Time to the case's robust level (split-merge "
        "(walk)'s lower median of its chains' last-quarter mean log joint, minus 2 nats): the censored lower median "
        "over the chains of their first time there, in seconds (empty: the median chain never got there). Load "
        f"average {', '.join(f'{x:.2f}' for x in result['load_average'])}.",
        "",
        "| m x n | family | seed | " + " | ".join(labels) + " | NB/SM walk | NB/SM informed |",
        "|---|---|---|" + "---|" * (len(labels) + 2),
    ]
    for case in result["cases"]:
        times = [cell(case["time_to_level"][label], ".4f") for label in labels]
        ratios = [cell(case["ratios"][f"NB / split-merge ({s})"], ".2f") for s in SETTINGS]
        lines.append(
            f"| {case['m']}x{case['n']} | {case['family']} | {case['seed']} | " + " | ".join(times + ratios) + " |"
        )
    return "\n".join(lines + summary_lines(result["summary"])) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run every case, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(12, 60), (20, 240), (32, 240), (16, 1000)])
    parser.add_argument("--families", nargs="+", choices=GMM_FAMILIES, default=["model", "scaled", "unequal"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[104], help="held-out generator seeds")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per run up to m n = 16 * 240")
    parser.add_argument("--max-seconds", type=float, default=6.0)
    parser.add_argument("--quick", action="store_true", help="smoke test: one 8x60 model case, 0.2 s runs")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.families, args.chains, args.seconds = [(8, 60)], ["model"], 2, 0.2
    result = run_held_out(args, run_case, ("seeds", "chains", "seconds", "max_seconds", "quick"))
    write_results(args.out, "gmm_mean_moves", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
