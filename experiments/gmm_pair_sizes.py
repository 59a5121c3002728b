"""Held-out pair blocks by model size: the set-encoder proposals against ``gmm_pair`` and the prior.

For every size ``m`` (candidate mixtures) in ``--mixtures`` and ``n`` (points) in ``--points``,
``--instances`` whitened GMMs are drawn from the first ``gmm_pair_set`` training distribution at that
one size (:meth:`motifs.gmm_pair_set.GmmPairSetMotif.sample_models` without ``copies``:
``tau / sigma`` down to 1.5, a quarter with a near-duplicate mixture; seeds no training run uses),
which ``gmm_pair_copies`` saw in only half of its training models.
Each proposal encodes the same models with its own motif's features, and the study reports

* the NLL ``E[-log q(B | C)]`` of the pair block (whitened coordinates), and
* the independence-MH acceptance rate when ``q`` replaces the exact conditional ``p(B | C)``
  (Monte Carlo, ``--mc-samples`` proposals per instance),

for the set-encoder proposals of ``--proposal`` (read every point; by default ``gmm_pair_copies``
and ``gmm_pair_set``), the old one (``gmm_pair``: 6 other mixtures and 60
points chosen by its rule, trained at ``m = 8``, ``n = 60``; its training range of ``tau / sigma``
and ``p`` is narrower, ``[2, 8]`` and ``[0.25, 0.75]``) and the prior proposal ``q = p(B)``.

Usage::

    python -m experiments.gmm_pair_sizes --quick
    python -m experiments.gmm_pair_sizes
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from experiments.common import (
    add_numbers,
    add_run_options,
    open_study,
    parse_quick,
    pyplot,
    study_parser,
    write_sections,
)
from experiments.common import load_proposal_or_untrained as load_or_untrained
from motifs.gmm_pair import GmmPairMotif, prior_proposal
from motifs.gmm_pair_set import GmmPairSetMotif
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.proposals import NeuralBlockProposal
from trainers.trainer import evaluate

HELD_OUT_SEED = 91_000  # no training run or other study draws from these seeds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument(
        "--proposal",
        nargs="+",
        default=["gmm_pair_copies", "gmm_pair_set"],
        help="the set-encoder proposals (names or files)",
    )
    parser.add_argument("--old-proposal", default="gmm_pair", help="the fixed-context proposal (name or file)")
    parser.add_argument("--mixtures", type=int, nargs="+", default=[8, 12, 16, 20, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[60, 240, 1000])
    add_numbers(
        parser,
        instances=(512, "held-out models per size"),
        mc_samples=(16, "proposals per instance for the acceptance"),
    )
    add_run_options(parser, "experiments/results/gmm_pair_sizes")
    return parse_quick(parser, argv, {"mixtures": [8], "points": [60], "instances": 64, "mc_samples": 2})


def size_rows(m: int, n: int, proposals: dict[str, NeuralBlockProposal], args: argparse.Namespace) -> list[dict]:
    """NLL and acceptance of every proposal on the same held-out models of one size."""
    sampler = GmmPairSetMotif()
    gen = torch.Generator().manual_seed(HELD_OUT_SEED + 10_000 * args.seed + 97 * m + n)
    models = sampler.sample_models(args.instances, gen, m, n)
    rows = []
    for label, proposal in proposals.items():
        motif = proposal.motif
        batch = sampler.training_batch(models)
        if not isinstance(motif, GmmPairSetMotif):  # the old motif encodes the same models its own way
            encode = motif.features  # type: ignore[attr-defined]
            features = encode(models.u_points, models.point_mask, models.u_others, models.v_others, models.psi)
            batch = dataclasses.replace(batch, features=features)
        with torch.no_grad():
            metrics = evaluate(proposal.mdn, batch, motif.block_spec, args.mc_samples, seed=args.seed)
        rows.append({"m": m, "n": n, "proposal": label, "nll": metrics["nll"], "acceptance": metrics["acceptance"]})
    return rows


def plot(rows: list[dict[str, Any]], labels: list[str], path: Path) -> None:
    """Acceptance against ``n``, one panel per ``m``, one line per proposal."""
    plt = pyplot()
    ms = sorted({r["m"] for r in rows})
    fig, axes = plt.subplots(1, len(ms), figsize=(3.2 * len(ms), 3.0), squeeze=False, sharey=True)
    for ax, m in zip(axes[0], ms):
        for label in labels:
            mine = sorted((r["n"], r["acceptance"]) for r in rows if r["m"] == m and r["proposal"] == label)
            ax.plot([x for x, _ in mine], [y for _, y in mine], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("points n")
        ax.set_title(f"m = {m}")
    axes[0][0].set_ylabel("MH acceptance vs exact p(B | C)")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args)
    labels = [Path(name).name for name in args.proposal]
    if len(set(labels)) < len(labels):
        raise ValueError(f"--proposal names two proposals alike (by file name): {args.proposal}")
    proposals = {
        label: load_or_untrained(name, args.quick, GmmPairSetMotif, hidden=(32,))
        for label, name in zip(labels, args.proposal)
    }
    proposals[f"{Path(args.old_proposal).name} (old)"] = load_or_untrained(
        args.old_proposal, args.quick, GmmPairMotif, hidden=(32,)
    )
    proposals["prior"] = prior_proposal(GmmPairSetMotif())
    sizes = [(m, n) for m in args.mixtures for n in args.points]
    rows = [row for m, n in tqdm(sizes, desc="sizes") for row in size_rows(m, n, proposals, args)]
    write_json(folder / "gmm_pair_sizes.json", {"config": config, "rows": rows})
    wide = []
    for m, n in sizes:
        entry: dict[str, Any] = {"m": m, "n": n}
        for r in rows:
            if (r["m"], r["n"]) == (m, n):
                entry[f"acceptance {r['proposal']}"] = r["acceptance"]
                entry[f"NLL {r['proposal']}"] = r["nll"]
        wide.append(entry)
    intro = (
        f"{args.instances} held-out models per size from the first gmm_pair_set training distribution (no copies; "
        f"seeds from {HELD_OUT_SEED}); acceptance: independence MH against the exact pair conditional, "
        f"{args.mc_samples} proposals per model."
    )
    write_sections(
        folder,
        "gmm_pair_sizes.md",
        "Pair proposals by model size",
        [("Results", markdown_table(wide, list(wide[0])))],
        intro,
    )
    plot(rows, list(proposals), folder / "gmm_pair_sizes.png")
    print(markdown_table(wide, list(wide[0])))
    return {"config": config, "rows": rows}


if __name__ == "__main__":
    main()
