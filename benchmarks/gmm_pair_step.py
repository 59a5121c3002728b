"""The mixture-pair sweep of ``gmm_pair_set`` proposals: compiled, eager, and an earlier commit, side by side.

Times, in interleaved rounds, one :class:`~neuralblock.NeuralBlockKernel` sweep of every mixture pair
of ``--chains`` vectorized chains (neural moves alone, ``gibbs_prob=0``) with the shipped ``--proposal``
(or, with ``--cover rounds``, one neural transition of the kernel's default: one round of ``m / 2``
disjoint pairs, :func:`~neuralblock.kernels.fused_mixture.pair_rounds`) in four arms:

* ``compiled``: this checkout's default, the compiled loop of :mod:`neuralblock.kernels.jit_mixture` with its
  data-refined candidates (:class:`~neuralblock.kernels.jit_mixture.CandidateOptions`);
* ``fresh``: the compiled loop computing every pair's proposal (``FusedMixtureSweep.default_reuse = False``);
* ``network``: the compiled loop with the network alone (``FusedMixtureSweep.default_candidates = None``);
* ``eager``: this checkout's eager steps (:func:`~neuralblock.kernels.fused_mixture.mixture_pair_step`);
* ``baseline``: the eager steps of ``--baseline`` (checked out into a temporary ``git worktree``), or its compiled
  loop with ``--baseline-arm compiled``.

Every arm runs the same snippet in a fresh subprocess per round (one torch thread, CPU time per
sweep over about ``--budget`` seconds after ``--warm`` + 2 untimed sweeps, the same start and seed), so the arms
share the machine's load; ratios are paired per round and their median over rounds reported. The
cases are GMM benchmark cases (:func:`experiments.gmm_models.family_gmm`, family ``--family``) of
every size in ``--sizes``.

Run it from the repository root::

    python benchmarks/gmm_pair_step.py            # full run (a few minutes)
    python benchmarks/gmm_pair_step.py --quick    # smoke test: one small size, one short round, no baseline

It writes ``gmm_pair_step.json`` and ``gmm_pair_step.md`` (``gmm_pair_step_rounds.*`` with ``--cover rounds``)
into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import baseline_worktree, cell, paired_ratio, ratio_lines, write_results  # noqa: E402

from neuralblock.kernels.jit import NUMBA  # noqa: E402

__all__ = ["main", "parse_size", "size_ratio_lines"]

BASELINE = "796acff"  # the last commit before the leaner eager step and the compiled loop
ARMS = ("compiled", "fresh", "network", "eager", "baseline")
SWEEP_WORDS = {  # what one timed "sweep" is, per --cover
    "every": "one sweep decides every mixture pair of every chain.",
    "rounds": "one sweep decides one round of m / 2 disjoint mixture pairs of every chain (a transition of the "
    "kernel's default, `cover=None`; the rounds in turn).",
}

_SNIPPET = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[1])
from gmm_pair_step import time_sweep
family, m, n, chains, name, budget, arm = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), \
    sys.argv[6], float(sys.argv[7]), sys.argv[8]
print(json.dumps(time_sweep(family, m, n, chains, name, budget, arm, int(sys.argv[9]), sys.argv[10])))
"""


def time_sweep(
    family: str,
    m: int,
    n: int,
    chains: int,
    proposal: str,
    budget: float,
    arm: str,
    warm: int = 0,
    cover: str = "every",
) -> dict[str, Any]:
    """CPU seconds per sweep and the acceptance of one arm on one case, in this process (its checkout's code).

    ``arm`` ``"compiled"`` runs the compiled loop (with its candidates), ``"fresh"`` the compiled loop computing
    every pair's proposal, ``"network"`` the compiled loop with the network alone, any other the eager steps (a
    commit without the compiled loop ignores it). ``warm`` sweeps run untimed first (the chains climb). ``cover``
    ``"every"`` times sweeps of every pair, ``"rounds"`` the kernel's default transitions (one round of pairs each).
    """
    import torch
    from fused_blocks import sweep_seconds

    from experiments.gmm_models import family_gmm
    from neuralblock import NeuralBlockKernel
    from neuralblock.kernels import fused_mixture
    from neuralblock.kernels.base import sequential_init
    from neuralblock.proposals import load_proposal

    torch.set_num_threads(1)
    fused_mixture.NUMBA = arm in ("compiled", "fresh", "network")  # type: ignore[attr-defined]  # read when made
    if arm == "network":
        fused_mixture.FusedMixtureSweep.default_candidates = None
    if arm == "fresh":
        fused_mixture.FusedMixtureSweep.default_reuse = False
    fg, _, reference = family_gmm(family, m, n)
    start = sequential_init(fg, torch.Generator().manual_seed(reference["seed"]), chains=chains)
    kernel = NeuralBlockKernel(
        fg, [load_proposal(proposal)], gibbs_prob=0.0, chains=chains, cover=False if cover == "every" else None
    )
    kernel.initial_params = {"x": start}
    kernel.setup(0)
    torch.manual_seed(0)
    for _ in range(warm):
        kernel.initial_params = kernel.sample(kernel.initial_params)
    seconds = sweep_seconds(kernel, budget)
    acceptance = next(iter(kernel.diagnostics()["acceptance_by_proposal"].values()))
    return {"seconds": seconds, "acceptance": acceptance, "fused": kernel.fused[0] is not None}


def parse_size(text: str) -> tuple[int, int]:
    """``"MxN"`` as ``(m, n)``.

    Example:
        >>> parse_size("16x240")
        (16, 240)
    """
    try:
        m, n = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is MxN (mixtures x points), e.g. 16x240; got {text!r}") from None
    if m < 2 or n < 1:
        raise argparse.ArgumentTypeError(f"a size needs m >= 2 mixtures and n >= 1 points, got {text!r}")
    return m, n


def _sweep(tree: Path, arm: str, args: argparse.Namespace, m: int, n: int) -> dict[str, Any]:
    """One round of one arm: CPU seconds per sweep (and the acceptance) of the kernel on checkout ``tree``.

    A fresh subprocess per round; ``--quick`` times this checkout's arms in this process (a smoke test that
    starts no processes beside the test runner's).
    """
    if args.quick and tree == ROOT:
        from neuralblock.kernels import fused_mixture

        candidates = fused_mixture.FusedMixtureSweep.default_candidates
        reuse = fused_mixture.FusedMixtureSweep.default_reuse
        try:
            return time_sweep(args.family, m, n, args.chains, args.proposal, args.budget, arm, args.warm, args.cover)
        finally:
            fused_mixture.NUMBA = NUMBA
            fused_mixture.FusedMixtureSweep.default_candidates = candidates
            fused_mixture.FusedMixtureSweep.default_reuse = reuse
    here = str(Path(__file__).resolve().parent)
    command = [sys.executable, "-c", _SNIPPET, here, args.family, str(m), str(n), str(args.chains), args.proposal]
    out = subprocess.run(
        [*command, str(args.budget), arm, str(args.warm), args.cover],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every size: the arms in turn per round, medians and the paired ratios."""
    sizes: dict[str, Any] = {}
    with baseline_worktree(args.baseline, prefix="gmm-step-baseline-") as worktree:
        trees = {"compiled": ROOT, "fresh": ROOT, "network": ROOT, "eager": ROOT}
        trees.update({"baseline": worktree} if worktree is not None else {})
        for m, n in args.sizes:
            rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in trees}
            for _ in range(args.rounds):
                for arm, tree in trees.items():
                    rounds[arm].append(_sweep(tree, args.baseline_arm if arm == "baseline" else arm, args, m, n))
            times = {arm: [r["seconds"] for r in records] for arm, records in rounds.items()}
            pairs = [("compiled", "fresh"), ("compiled", "network"), ("network", "eager")]
            if args.baseline_arm == "compiled":
                pairs += [("compiled", "baseline")]
            else:
                pairs += [("network", "baseline"), ("eager", "baseline")]
            sizes[f"{m}x{n}"] = {
                "ms_per_sweep": {arm: 1e3 * statistics.median(values) for arm, values in times.items()},
                "rounds_ms": {arm: [1e3 * v for v in values] for arm, values in times.items()},
                "acceptance": {arm: statistics.median(r["acceptance"] for r in rounds[arm]) for arm in trees},
                "fused": all(r["fused"] for records in rounds.values() for r in records),
                "ratios": {f"{a} / {b}": paired_ratio(times, a, b) for a, b in pairs if b in times},
            }
    return {"sizes": sizes}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The mixture-pair sweep of a gmm_pair_set proposal: compiled, eager and an earlier commit",
        "",
        f"`NeuralBlockKernel` with the shipped `{result['proposal']}` proposal alone (`gibbs_prob=0`), "
        f"{result['chains']} vectorized chains, on the GMM benchmark's `{result['family']}` cases; "
        + SWEEP_WORDS[result.get("cover", "every")]
        + " `compiled`: the default compiled loop (with its data-refined candidates); "
        "`fresh`: the compiled loop computing every pair's proposal (no reuse); "
        "`network`: the compiled loop with the network alone; `eager`: the eager fused steps; "
        f"`baseline`: the {result['baseline_arm']} arm of commit `{result['baseline'] or '-'}`. CPU, one torch "
        "thread, CPU time per "
        f"sweep over about {result['budget']} s per arm and round after {result['warm'] + 2} untimed sweeps, "
        "medians over "
        f"{result['rounds']} interleaved rounds (each arm a fresh subprocess, same start and seed; an arm whose "
        "arithmetic rounds otherwise, the eager steps or another commit's loop, soon follows a chain of its own, so "
        "the arms' states and acceptance differ). Load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}. Ratios: medians over rounds of one arm's time "
        "over another's in the same round (below 1: the first is faster).",
        "",
        f"| m x n | arm | ms per {'round' if result.get('cover') == 'rounds' else 'sweep'} | acceptance |",
        "|---|---|---|---|",
    ]
    for size, row in result["sizes"].items():
        for arm, ms in row["ms_per_sweep"].items():
            lines.append(f"| {size} | {arm} | {ms:.1f} | {cell(row['acceptance'][arm], '.3f')} |")
    lines += size_ratio_lines(result["sizes"])
    return "\n".join(lines) + "\n"


def size_ratio_lines(sizes: dict[str, Any]) -> list[str]:
    """The ratio table of a per-size benchmark result (each size's ``ratios``, named ``"<size>: <ratio>"``).

    Example:
        >>> size_ratio_lines({"8x60": {"ratios": {"a / b": 0.5}}})[-1]
        '| 8x60: a / b | 0.500 |'
    """
    named = {f"{size}: {name}": value for size, row in sizes.items() for name, value in row["ratios"].items()}
    return ratio_lines(named)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run the comparison, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(16, 60), (16, 240), (32, 1000)])
    parser.add_argument("--family", default="unequal", help="the GMM benchmark's case family")
    parser.add_argument("--proposal", default="gmm_pair_copies", help="a shipped gmm_pair_set proposal")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--budget", type=float, default=2.0, help="CPU seconds per arm and round")
    parser.add_argument("--warm", type=int, default=0, help="untimed sweeps before the usual two (chains climb)")
    parser.add_argument("--baseline", default=BASELINE, help="commit to time against ('' to skip)")
    parser.add_argument(
        "--baseline-arm", choices=("eager", "compiled"), default="eager", help="which of the baseline's sweeps to time"
    )
    parser.add_argument(
        "--cover", choices=tuple(SWEEP_WORDS), default="every", help="time sweeps of every pair, or rounds of pairs"
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 8x60, one short round, no baseline arm")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    if args.baseline_arm == "compiled" and args.baseline == BASELINE:
        parser.error(f"--baseline-arm compiled needs a --baseline with the compiled loop ({BASELINE} has none)")
    if args.quick:
        args.sizes, args.rounds, args.budget, args.baseline = [(8, 60)], 1, 0.05, ""
    result = run(args)
    settings = ("proposal", "family", "chains", "rounds", "budget", "warm", "baseline", "baseline_arm", "cover")
    result.update({key: getattr(args, key) for key in (*settings, "quick")}, load_average=list(os.getloadavg()))
    name = "gmm_pair_step" if args.cover == "every" else "gmm_pair_step_rounds"
    write_results(args.out, name, result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
