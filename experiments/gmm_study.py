"""Open-universe GMM: neural pair blocks (``gmm_pair``) vs a hand-designed split-merge sampler.

For every size ``m`` (candidate mixtures) in ``--mixtures`` and ``n`` (points) in
``--points``, one GMM is drawn from the model (``sigma = 1``, ``tau = 5``, ``p = 0.5``, 2-D)
and both samplers run ``--runs`` times on the same observations, each run from its own
random start, and for the same sampling time (wall time, or the process's CPU time with
``--clock cpu``), in the same engine:

* ``NB(gmm_pair) + Gibbs``: :class:`~neuralblock.NeuralBlockKernel` with the shipped
  ``gmm_pair`` proposal (trained at ``m = 8``, ``n = 60``; larger models use its context
  selection), half the transitions single-site sweeps;
* ``split-merge + Gibbs``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM`
  (Smart-Dumb/Dumb-Smart split/merge plus data-driven birth/death), mixed the same way.

With ``--chains K`` every run is K vectorized chains in one kernel (``chains=K`` for both
samplers; each chain from its own random start, the same starts for both samplers), and every
statistic below is over all ``runs * K`` chains: a chain counts as one run of the one-chain
study, read at the times of its kernel run (so a chain's times are those of its K-chain kernel).

It records the points' log-likelihood and the number of active mixtures ``M`` against
time, plots both, and reports, per size, the time each sampler needs to reach the
split-merge sampler's final log-likelihood (the median over its chains' final values; per
sampler the lower median over chains of the *first hit*,
:func:`experiments.gmm_models.first_time_above`, a chain that never reaches it counting as
later than all). The issue's target is at
``m = 16, n = 240``: NB reaches that level in at most half the time the split-merge sampler
itself needs to reach it.

Usage::

    python -m experiments.gmm_study --quick
    python -m experiments.gmm_study
    python -m experiments.gmm_study --chains 16 --clock cpu
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import matplotlib
import torch
from tqdm import tqdm

from experiments.common import add_choices, add_run_options, lower_median, open_study, proposal_study_parser
from experiments.gmm_models import (
    chain_traces,
    first_time_above,
    held_out_gmm,
    load_proposal_or_untrained,
    run_sampler,
)
from neuralblock import NeuralBlockKernel
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json, write_report
from neuralblock.kernels.base import sequential_init
from neuralblock.kernels.split_merge import SplitMergeGMM

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NB, SM = "NB(gmm_pair) + Gibbs", "split-merge + Gibbs"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = proposal_study_parser(__doc__, "gmm_pair")
    parser.add_argument("--mixtures", type=int, nargs="+", default=[8, 12, 16])
    parser.add_argument("--points", type=int, nargs="+", default=[60, 120, 240])
    parser.add_argument("--runs", type=int, default=3, help="runs per sampler on the same observations")
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling time per run (on --clock)")
    parser.add_argument("--target-seconds", type=float, default=60.0, help="sampling time per run at the largest size")
    parser.add_argument("--gibbs-prob", type=float, default=0.5)
    parser.add_argument(
        "--chains", type=int, default=1, help="vectorized chains per run, in one kernel (both samplers)"
    )
    add_choices(parser, clock=(["wall", "cpu"], "the run harness's clock: the time budget and the time axis"))
    add_run_options(parser, "experiments/results/gmm_study")
    args = parser.parse_args(argv)
    if args.chains < 1:
        parser.error(f"--chains must be at least 1, got {args.chains}")
    if args.quick:
        args.mixtures, args.points, args.runs, args.seconds, args.target_seconds = [8], [60], 1, 1.0, 1.0
    return args


def study_size(m: int, n: int, args: argparse.Namespace, proposal: Any) -> dict[str, Any]:
    """Both samplers, ``args.runs`` runs each, on one GMM of ``m`` mixtures and ``n`` points."""
    largest = m == max(args.mixtures) and n == max(args.points)
    seconds = args.target_seconds if largest else args.seconds
    fg, _, reference = held_out_gmm(m, n, 40_000 + 1000 * m + n + args.seed)
    chains = args.chains
    builders = {
        NB: lambda: NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=args.gibbs_prob, chains=chains),
        SM: lambda: SplitMergeGMM(fg, gibbs_prob=args.gibbs_prob, chains=chains),
    }
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in builders}
    for r in range(args.runs):
        gen = torch.Generator().manual_seed(100 * args.seed + r)
        start = sequential_init(fg, gen) if chains == 1 else sequential_init(fg, gen, chains=chains)
        for label, build in builders.items():
            run = run_sampler(build(), start, seconds, seed=args.seed * 1000 + r, clock=args.clock)
            diag = run.pop("diagnostics")
            run["acceptance"] = diag.get("acceptance_by_proposal", diag.get("acceptance_by_move"))
            runs[label].append(run)
    # every chain of every run counts as one run of the one-chain study (with one chain, the runs themselves)
    traces = {label: [c for run in label_runs for c in chain_traces(run)] for label, label_runs in runs.items()}
    final_sm = lower_median(c["log_lik"][-1] for c in traces[SM])
    summary = []
    for label, label_runs in runs.items():
        reach = [first_time_above(c["times"], c["log_lik"], final_sm) for c in traces[label]]
        reached = [t for t in reach if t is not None]
        summary.append(
            {
                "m": m,
                "n": n,
                "sampler": label,
                "seconds": seconds,
                "true M": reference["true_active"],
                "median final M": lower_median(c["active"][-1] for c in traces[label]),
                "median final log-lik - truth": float(
                    torch.tensor([c["log_lik"][-1] for c in traces[label]]).median() - reference["true_log_lik"]
                ),
                "runs reaching SM final": f"{len(reached)}/{len(reach)}",
                "median time to SM final (s)": censored_lower_median(reach),
                "median sweeps": lower_median(run["sweeps"] for run in label_runs),
            }
        )
    return {"m": m, "n": n, "seconds": seconds, "reference": reference, "runs": runs, "summary": summary}


def censored_lower_median(times: list[float | None]) -> float | None:
    """The lower median of first-hit times where ``None`` (never reached) counts as later than every time.

    ``None`` when the median run never reached the level; the plain lower median when every run did.

    Example:
        >>> censored_lower_median([3.0, None, 1.0]), censored_lower_median([None, 2.0]), censored_lower_median([None])
        (3.0, 2.0, None)
    """
    ordered = sorted(math.inf if t is None else float(t) for t in times)
    middle = ordered[(len(ordered) - 1) // 2]
    return None if math.isinf(middle) else middle


def fraction_right_m(result: dict[str, Any], label: str) -> float:
    """The fraction of a sampler's chains (all runs) whose final number of active mixtures is the true one."""
    finals = [c["active"][-1] for run in result["runs"][label] for c in chain_traces(run)]
    return sum(a == result["reference"]["true_active"] for a in finals) / len(finals)


def acceptance_summary(result: dict[str, Any], label: str) -> str:
    """A sampler's in-kernel acceptance, median over runs: the pair proposal's, or each split-merge move's."""
    per_run = [run["acceptance"] for run in result["runs"][label]]
    return ", ".join(f"{key} {lower_median(acc[key] for acc in per_run):.3f}" for key in per_run[0])


def target_ratio(result: dict[str, Any]) -> float | None:
    """NB's median time to the split-merge sampler's final log-likelihood over the split-merge sampler's own.

    Both times are first-passage times to the same level (the split-merge runs' median final
    log-likelihood), so the ratio compares how fast each sampler gets to where split-merge ends.
    """
    times = {row["sampler"]: row["median time to SM final (s)"] for row in result["summary"]}
    if times[NB] is None or not times[SM]:
        return None
    return times[NB] / times[SM]


def plot(results: list[dict[str, Any]], path: Path, key: str, ylabel: str, time_label: str = "seconds") -> None:
    """One panel per size (rows: m, columns: n) of ``key`` against time, every run of both samplers."""
    ms = sorted({r["m"] for r in results})
    ns = sorted({r["n"] for r in results})
    fig, axes = plt.subplots(len(ms), len(ns), figsize=(3.8 * len(ns), 2.9 * len(ms)), squeeze=False)
    colors = {NB: "tab:blue", SM: "tab:orange"}
    for result in results:
        ax = axes[ms.index(result["m"]), ns.index(result["n"])]
        ref = result["reference"]
        offset = ref["true_log_lik"] if key == "log_lik" else 0.0
        for label, label_runs in result["runs"].items():
            for k, run in enumerate(label_runs):
                chains = chain_traces(run)
                for c, chain in enumerate(chains):
                    values = [v - offset for v in chain[key]]
                    first = k == 0 and c == 0
                    lw, alpha = (0.9, 0.8) if len(chains) == 1 else (0.5, 0.25)
                    kwargs = {"color": colors[label], "lw": lw, "alpha": alpha, "label": label if first else None}
                    ax.step(run["times"], values, where="post", **kwargs)
                if len(chains) > 1:  # the run's median over its chains at each transition
                    middle = torch.tensor([chain[key] for chain in chains]).median(0).values - offset
                    ax.step(run["times"], middle.tolist(), where="post", color=colors[label], lw=1.3)
        if key == "log_lik":
            lows = [min(c["log_lik"]) for rs in result["runs"].values() for run in rs for c in chain_traces(run)]
            ax.set_ylim(max(-300.0, min(lows) - offset), 30.0)
            ax.axhline(0.0, color="k", lw=0.7, ls="--")
        else:
            ax.axhline(ref["true_active"], color="k", lw=0.7, ls="--")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(left=0.0)
        ax.set_title(f"m={result['m']}, n={result['n']}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel(f"{time_label} (log above 0.1 s)")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # the one-chain, wall-clock defaults stay out of the configuration: same folder and record as before the options
    defaults = [name for name, value in (("chains", 1), ("clock", "wall")) if getattr(args, name) == value]
    config, folder = open_study(args, drop=("out", "threads", *defaults))
    proposal = load_proposal_or_untrained(args.proposal, args.quick)
    sizes = [(m, n) for m in args.mixtures for n in args.points]
    results = [study_size(m, n, args, proposal) for m, n in tqdm(sizes, desc="GMM sizes")]
    rows = [row for result in results for row in result["summary"]]
    ratio = target_ratio(results[-1])
    record = {"config": config, "results": results, "target": {"m": sizes[-1][0], "n": sizes[-1][1], "ratio": ratio}}
    write_json(folder / "gmm_study.json", record)
    verdict = "never" if ratio is None else f"{ratio:.3f} times the split-merge sampler's own time (target <= 0.5)"
    clock = "CPU time of the process" if args.clock == "cpu" else "wall time"
    if args.chains == 1:
        setup = f"{args.runs} runs per sampler per size on the same observations (own random start each), "
        unit = "run"
    else:
        setup = (
            f"{args.runs} runs per sampler per size on the same observations, each run {args.chains} vectorized "
            + f"chains in one kernel (`chains={args.chains}`, both samplers; {args.runs * args.chains} chains per "
            + "sampler per size, each from its own random start, the same starts for both samplers); a run's time "
            + "budget is for all its chains together, and every chain counts as a run below (its times are its "
            + "kernel run's). "
        )
        unit = "chain"
    extra = [
        {
            "m": result["m"],
            "n": result["n"],
            "sampler": label,
            f"{unit}s with final M = true M": fraction_right_m(result, label),
            "acceptance (median over runs)": acceptance_summary(result, label),
        }
        for result in results
        for label in result["runs"]
    ]
    text = (
        "# Open-universe GMM: NB(gmm_pair) vs split-merge\n\n"
        + setup
        + f"{args.seconds:g} s per run ({args.target_seconds:g} s at the largest size) of {clock}, "
        + f"gibbs_prob={args.gibbs_prob}. `time to SM final` = first time a {unit}'s log-likelihood reaches the "
        + f"split-merge sampler's median final log-likelihood (median over its {unit}s); `median time` is the lower "
        + f"median over {unit}s, a {unit} that never reaches the level counting as later than all (empty when the "
        + f"median {unit} never does); the other medians are over {unit}s too, `median sweeps` over runs "
        + "(transitions, each one of every chain).\n\n"
        + markdown_table(rows, list(rows[0]))
        + f"\n\nTarget (m={sizes[-1][0]}, n={sizes[-1][1]}): NB reaches split-merge's final log-likelihood "
        + f"in {verdict}.\n\n"
        + "Posterior of M and in-kernel acceptance (NB: the pair proposal's; split-merge: per move type, "
        + "pooled over a run's chains):\n\n"
        + markdown_table(extra, list(extra[0]))
        + "\n\n![log-likelihood](gmm_study_loglik.png)\n\n![active mixtures](gmm_study_active.png)\n"
    )
    time_label = "CPU seconds" if args.clock == "cpu" else "seconds"
    plot(results, folder / "gmm_study_loglik.png", "log_lik", "log-lik - log-lik at truth", time_label)
    plot(results, folder / "gmm_study_active.png", "active", "active mixtures M", time_label)
    write_report(folder, "gmm_study.md", text)
    return record


if __name__ == "__main__":
    main()
