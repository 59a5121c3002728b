"""Chain-batched open-universe GMM samplers: the cost per chain-transition at K = 1 and K = 16.

Measures, side by side in one run (one torch thread, CPU time per transition through the public
``kernel.sample`` API, rounds interleaved, medians reported), on a GMM of the GMM study's largest
size (``m = 16`` candidate mixtures, ``n = 240`` points, drawn by
:func:`experiments.gmm_models.held_out_gmm`):

* ``split_merge``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM` sweeps of split, merge,
  birth and death moves alone (``gibbs_prob=0``; ``m (m - 1) / 2 = 120`` move attempts per transition,
  each attempt one batched step of all chains);
* ``nb``: :class:`~neuralblock.NeuralBlockKernel` sweeps of the shipped ``gmm_pair`` proposal alone
  (``gibbs_prob=0``; one block proposal per mixture pair) on the fused mixture path
  (:mod:`neuralblock.kernels.fused_mixture`), and ``nb_general`` the same on the general path;
* ``single``: the single-site sweep both kernels mix in (``gibbs_prob=1``, timed on ``SplitMergeGMM``);
* ``baseline``: ``SplitMergeGMM`` at ``K = 1`` on the commit before chain batching (``--baseline``,
  checked out into a temporary ``git worktree`` and timed in a subprocess);

each at ``K = 1`` and ``K = --chains`` vectorized chains (cost per chain-transition), with each
arm's acceptance rate and its updates per second (move attempts or block proposals of all chains).

Run it from the repository root::

    python benchmarks/gmm_chains.py            # full run (a few minutes)
    python benchmarks/gmm_chains.py --quick    # smoke test: m = 8, n = 60, K = 4, short rounds, no baseline

It writes ``gmm_chains.json`` and ``gmm_chains.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import (  # noqa: E402  (shared with the grid benchmark)
    arm_lines,
    baseline_worktree,
    cell,
    paired_ratio,
    ratio_lines,
    sweep_seconds,
    write_results,
)

from experiments.gmm_models import held_out_gmm  # noqa: E402
from neuralblock import NeuralBlockKernel, load_pretrained  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.kernels.split_merge import SplitMergeGMM  # noqa: E402

__all__ = ["build", "main"]

BASELINE = "24bd511"  # the last commit before SplitMergeGMM(chains=K)
SEED = 56_240  # held_out_gmm's seed of the GMM study's m = 16, n = 240 model (40_000 + 1000 m + n)

_BASELINE_SNIPPET = """
import sys, torch, warnings
warnings.simplefilter("ignore")
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from fused_blocks import sweep_seconds
from experiments.gmm_models import held_out_gmm
from neuralblock.kernels.split_merge import SplitMergeGMM
fg, truth, _ = held_out_gmm(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
torch.manual_seed(0)
kernel = SplitMergeGMM(fg, gibbs_prob=0.0)
kernel.initial_params = {"x": truth}
kernel.setup(0)
print(sweep_seconds(kernel, float(sys.argv[5])))
"""


def build(fg: FactorGraph, start: torch.Tensor, arm: str, chains: int) -> tuple[Any, float]:
    """A set-up kernel for an arm (``split_merge``, ``nb``, ``single``) started at ``start`` and its setup seconds.

    Example:
        >>> fg, truth, _ = held_out_gmm(4, 10, 0)
        >>> kernel, seconds = build(fg, truth, "split_merge", 2)
        >>> kernel.chains, seconds > 0
        (2, True)
    """
    begin = time.perf_counter()
    kernel: Any
    if arm in ("nb", "nb_general"):
        proposals = [load_pretrained("gmm_pair")]  # every pair per sweep, on both paths (the kernel's default: a round)
        kernel = NeuralBlockKernel(fg, proposals, gibbs_prob=0.0, chains=chains, fused=arm == "nb", cover=False)
    else:
        kernel = SplitMergeGMM(fg, gibbs_prob=0.0 if arm == "split_merge" else 1.0, chains=chains)
    kernel.initial_params = {"x": start if chains == 1 else start.expand(chains, -1).clone()}
    kernel.setup(0)
    return kernel, time.perf_counter() - begin


def _baseline_seconds(worktree: Path, args: argparse.Namespace) -> float:
    """CPU seconds per transition of ``SplitMergeGMM`` (one chain) on the baseline commit."""
    here = str(Path(__file__).resolve().parent)
    command = [sys.executable, "-c", _BASELINE_SNIPPET, here, str(args.mixtures), str(args.points), str(args.seed)]
    out = subprocess.run(
        [*command, str(args.budget)],
        cwd=worktree,
        env={**os.environ, "PYTHONPATH": str(worktree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _acceptance(kernel: Any) -> float | None:
    """The arm's overall acceptance rate (``None`` for the single-site arm)."""
    report = kernel.diagnostics()
    if isinstance(kernel, SplitMergeGMM):
        return report["acceptance_rate"] if kernel.gibbs_prob == 0.0 else None
    return report["acceptance_by_proposal"]["gmm_pair"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every arm at ``K = 1`` and ``K = chains``: medians over interleaved rounds, and paired ratios."""
    fg, truth, reference = held_out_gmm(args.mixtures, args.points, args.seed)
    torch.manual_seed(0)
    arms = {
        f"{arm}_K{chains}": build(fg, truth, arm, chains)
        for arm in ("split_merge", "nb", "nb_general", "single")
        for chains in (1, args.chains)
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    if args.baseline:
        times["baseline_split_merge_K1"] = []
    with baseline_worktree(args.baseline, prefix="sm-baseline-") as worktree:
        for _ in range(args.rounds):
            for name, (kernel, _) in arms.items():
                times[name].append(sweep_seconds(kernel, args.budget) / kernel.chains)
            if worktree is not None:
                times["baseline_split_merge_K1"].append(_baseline_seconds(worktree, args))
    median = {name: 1e3 * statistics.median(values) for name, values in times.items()}

    paired = functools.partial(paired_ratio, times)

    k = args.chains
    ratios = {
        f"split_merge K={k} / K=1 per chain-transition": paired(f"split_merge_K{k}", "split_merge_K1"),
        f"nb K={k} / K=1 per chain-transition": paired(f"nb_K{k}", "nb_K1"),
        f"single-site K={k} / K=1 per chain-transition": paired(f"single_K{k}", "single_K1"),
        "split_merge / nb per chain-transition, K=1": paired("split_merge_K1", "nb_K1"),
        f"split_merge / nb per chain-transition, K={k}": paired(f"split_merge_K{k}", f"nb_K{k}"),
        "nb general / fused path per chain-transition, K=1": paired("nb_general_K1", "nb_K1"),
        f"nb general / fused path per chain-transition, K={k}": paired(f"nb_general_K{k}", f"nb_K{k}"),
    }
    if args.baseline:
        ratios["split_merge K=1 / baseline K=1"] = paired("split_merge_K1", "baseline_split_merge_K1")
    return {
        "mixtures": args.mixtures,
        "points": args.points,
        "true_active": reference["true_active"],
        "moves_per_sweep": arms["split_merge_K1"][0].moves_per_sweep,
        "pairs": arms["nb_K1"][0].num_instances[0],
        "per_chain_transition_ms": median,
        "rounds_ms": {name: [1e3 * v for v in values] for name, values in times.items()},
        "setup_seconds": {name: seconds for name, (_, seconds) in arms.items()},
        "acceptance": {name: _acceptance(kernel) for name, (kernel, _) in arms.items()},
        "updates_per_second": {
            name: kernel.diagnostics()["updates_per_second"]
            for name, (kernel, _) in arms.items()
            if "single" not in name
        },
        "ratios": ratios,
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Chain-batched open-universe GMM samplers: cost per chain-transition",
        "",
        f"GMM of the GMM study's largest size: m = {result['mixtures']} candidate mixtures, n = {result['points']} "
        f"points in 2-D (true M = {result['true_active']:g}), every chain started at the true state. CPU, 1 thread, "
        f"load average {', '.join(f'{x:.2f}' for x in result['load_average'])}. Medians over {result['rounds']} "
        f"interleaved rounds of about {result['budget']} s CPU time each (at least two transitions). "
        f"`split_merge`: `SplitMergeGMM(gibbs_prob=0)`, {result['moves_per_sweep']} move attempts per transition "
        "(each one batched step of all chains); `nb`: `NeuralBlockKernel` with the shipped `gmm_pair` proposal "
        f"(`gibbs_prob=0`, {result['pairs']} mixture pairs per transition) on the fused mixture path, "
        "`nb_general` the same on the general path (`fused=False`); `single`: the single-site sweep both "
        "mix in (`gibbs_prob=1`); `baseline`: `SplitMergeGMM` (one chain) on the commit before chain batching. "
        "`updates/s`: the kernel's own `updates_per_second` (move attempts or block proposals of all chains per "
        "second of its wall-clock move time, so it also reflects the machine's load).",
        "",
    ]
    cells = {
        name: [
            f"{value:.2f}",
            cell(result["acceptance"].get(name), ".3f"),
            cell(result["updates_per_second"].get(name), ".0f"),
            cell(result["setup_seconds"].get(name), ".2f"),
        ]
        for name, value in result["per_chain_transition_ms"].items()
    }
    lines += arm_lines(["arm", "ms per chain-transition", "acceptance", "updates/s", "setup s"], cells)
    lines += ratio_lines(result["ratios"])
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run the comparison, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mixtures", type=int, default=16)
    parser.add_argument("--points", type=int, default=240)
    parser.add_argument("--seed", type=int, default=SEED, help="held_out_gmm's seed")
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=2.0, help="CPU seconds per arm and round")
    parser.add_argument("--baseline", default=BASELINE, help="commit to time the one-chain kernel on ('' to skip)")
    parser.add_argument("--quick", action="store_true", help="smoke test: m = 8, n = 60, K = 4, short rounds")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.mixtures, args.points, args.chains, args.rounds, args.budget, args.baseline = 8, 60, 4, 1, 0.05, ""
    result = run(args)
    result.update(rounds=args.rounds, budget=args.budget, quick=args.quick, load_average=list(os.getloadavg()))
    write_results(args.out, "gmm_chains", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
