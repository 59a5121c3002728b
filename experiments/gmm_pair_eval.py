"""Evaluate a trained ``gmm_pair`` proposal against the prior proposal and single-site Gibbs.

Part 1, held-out random instantiations of the motif (``m = 8`` mixtures, ``n = 60``
points, hyper-parameters from the training distribution, seeded and never seen in
training): the NLL ``E[-log q(B | C)]`` of the pair block (whitened coordinates) and the
independence-MH acceptance rate when ``q`` replaces the exact conditional, for the trained
network and for the **prior proposal** (:func:`motifs.gmm_pair.prior_proposal`, ``q = p(B)``).

Part 2, MCMC on held-out GMMs drawn from the model (``--mixtures`` candidates, ``--points``
points, ``sigma = 1``, ``tau = 5``, ``p = 0.5``), every sampler in the same engine
(:class:`~neuralblock.NeuralBlockKernel`) from the same start, for the same sampling wall time
(the run harness, setup untimed):

* ``Gibbs``: single-site sweeps only (Gibbs on the activity bits, adaptive random-walk MH
  on the mean coordinates), the baseline a user gets without a block proposal;
* ``prior pair + Gibbs``: the prior proposal on every pair, mixed half and half with Gibbs;
* ``NB(gmm_pair) + Gibbs``: the trained proposal on every pair, mixed the same way.

It reports the log joint reached, the number of active mixtures against the truth, the
in-kernel block acceptance rate, and the time to get within ``NEAR_TRUTH`` nats of the true
state's log joint: the *first hit* (:func:`experiments.gmm_models.first_time_above`).

Usage::

    python -m experiments.gmm_pair_eval --quick
    python -m experiments.gmm_pair_eval
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import matplotlib
import torch
from tqdm import tqdm

from experiments.common import open_study, parse_proposal_eval, write_sections
from experiments.gmm_models import (
    P_ACTIVE,
    SIGMA,
    TAU,
    first_time_above,
    held_out_gmm,
    load_proposal_or_untrained,
    run_sampler,
)
from motifs.gmm_pair import prior_proposal
from neuralblock import NeuralBlockKernel
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.kernels.base import sequential_init
from neuralblock.proposals import NeuralBlockProposal
from trainers.trainer import evaluate

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NEAR_TRUTH = 5.0  # nats below the log joint at the true state that count as "converged"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    quick = {"instances": 256, "mc_samples": 4, "models": 2, "seconds": 1.0}
    models, seconds = (8, "held-out GMMs in part 2"), (20.0, "wall time per sampler and model in part 2")
    out, held_out_help = "experiments/results/gmm_pair", "held-out instantiations in part 1"
    return parse_proposal_eval(
        argv, __doc__, "gmm_pair", out, quick, held_out_help, models=models, mixtures=8, points=60, seconds=seconds
    )


def held_out(proposal: NeuralBlockProposal, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part 1: NLL and independence-MH acceptance of the network and of the prior proposal."""
    motif = proposal.motif
    batch = motif.sample_training_batch(args.instances, torch.Generator().manual_seed(10_000 + args.seed))
    rows = []
    for label, candidate in (("NB(gmm_pair)", proposal), ("prior proposal", prior_proposal(motif))):
        with torch.no_grad():
            metrics = evaluate(candidate.mdn, batch, motif.block_spec, args.mc_samples, seed=args.seed)
        rows.append({"proposal": label, "instances": args.instances, **metrics})
    return rows


def mcmc_comparison(proposal: NeuralBlockProposal, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: the three samplers on held-out GMMs, equal wall time, same start."""
    prior = prior_proposal(proposal.motif)
    samplers = {
        "Gibbs": lambda fg: NeuralBlockKernel(fg, proposals=[prior], gibbs_prob=1.0),
        "prior pair + Gibbs": lambda fg: NeuralBlockKernel(fg, proposals=[prior], gibbs_prob=0.5),
        "NB(gmm_pair) + Gibbs": lambda fg: NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.5),
    }
    models = []
    for k in tqdm(range(args.models), desc="held-out GMMs"):
        fg, _, record = held_out_gmm(args.mixtures, args.points, 20_000 + 31 * args.seed + k)
        start = sequential_init(fg, torch.Generator().manual_seed(k))
        record["start_log_joint"] = float(fg.log_joint(start))
        for label, build in samplers.items():
            run = run_sampler(build(fg), start, args.seconds, seed=args.seed + k)
            run["acceptance"] = run.pop("diagnostics")["acceptance_by_proposal"].get("gmm_pair")
            record[label] = run
        models.append(record)
    return {"models": models, "samplers": list(samplers)}


def summarize(part2: dict[str, Any]) -> list[dict[str, Any]]:
    """Medians over models: final log joint relative to the truth, active-count error, acceptance, sweeps."""
    rows = []
    for label in part2["samplers"]:
        runs = [(m, m[label]) for m in part2["models"]]
        gap = torch.tensor([r["log_joint"][-1] - m["true_log_joint"] for m, r in runs])
        half = torch.tensor([r["log_joint"][len(r["log_joint"]) // 2] - m["true_log_joint"] for m, r in runs])
        wrong_m = torch.tensor([abs(r["active"][-1] - m["true_active"]) for m, r in runs])
        acc = [r["acceptance"] for _, r in runs if r["acceptance"] is not None and r["sweeps"] > 0]
        reach = [first_time_above(r["times"], r["log_joint"], m["true_log_joint"] - NEAR_TRUTH) for m, r in runs]
        rows.append(
            {
                "sampler": label,
                f"median time to truth - {NEAR_TRUTH:g} nats (s)": (
                    float(torch.tensor(reach).median()) if None not in reach else None
                ),
                "models reaching it": sum(t is not None for t in reach),
                "median final log joint - truth": float(gap.median()),
                "median halfway log joint - truth": float(half.median()),
                "models with right M": int((wrong_m == 0).sum()),
                "mean abs(M - M_true)": float(wrong_m.mean()),
                "block acceptance": (sum(acc) / len(acc)) if acc and label != "Gibbs" else None,
                "median sweeps": float(torch.tensor([float(r["sweeps"]) for _, r in runs]).median()),
            }
        )
    return rows


def plot(rows: list[dict[str, Any]], part2: dict[str, Any], path: Path) -> None:
    shown = part2["models"][: min(3, len(part2["models"]))]
    fig, axes = plt.subplots(1, 1 + len(shown), figsize=(4.2 * (1 + len(shown)), 3.6))
    x = torch.arange(len(rows)).float()
    axes[0].bar(x - 0.2, [r["acceptance"] for r in rows], 0.4, label="MH acceptance")
    axes[0].set_xticks(x.tolist(), [r["proposal"] for r in rows], fontsize=8)
    axes[0].set_ylabel("independence-MH acceptance")
    axes[0].set_title("held-out pair blocks")
    for ax, model in zip(axes[1:], shown):
        for label in part2["samplers"]:
            run = model[label]
            ax.plot(run["times"], [v - model["true_log_joint"] for v in run["log_joint"]], label=label, lw=1)
        ax.axhline(0.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(left=0.0)
        lowest = min(min(model[s]["log_joint"]) for s in part2["samplers"]) - model["true_log_joint"]
        ax.set_ylim(bottom=max(-200.0, lowest))
        ax.set_xlabel("seconds (linear below 0.1 s, log above)")
        ax.set_ylabel("log joint - log joint at truth")
        ax.set_title(f"M_true = {model['true_active']:.0f}")
    axes[1].legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args)
    proposal = load_proposal_or_untrained(args.proposal, args.quick)
    rows = held_out(proposal, args)
    part2 = mcmc_comparison(proposal, args)
    summary = summarize(part2)
    record = {"config": config, "held_out": rows, "mcmc": part2, "summary": summary}
    write_json(folder / "gmm_pair.json", record)
    mcmc_heading = (
        f"MCMC on {args.models} held-out GMMs (m={args.mixtures}, n={args.points}, sigma={SIGMA}, "
        f"tau={TAU}, p={P_ACTIVE}), {args.seconds:g} s per sampler, same start"
    )
    held_out_table = markdown_table(rows, ["proposal", "instances", "nll", "acceptance"])
    sections = [
        ("Held-out pair blocks (m=8, n=60)", held_out_table),
        (mcmc_heading, markdown_table(summary, list(summary[0]))),
    ]
    write_sections(folder, "gmm_pair.md", f"gmm_pair proposal `{args.proposal}`", sections)
    plot(rows, part2, folder / "gmm_pair.png")
    return record


if __name__ == "__main__":
    main()
