"""Replica exchange: how evenly each ladder adaptation spreads the swap rates after warmup.

On fresh ``side x side`` Ising tori (:func:`experiments.grid_study.random_ising_grid`: fields ``U[-1, 1]``,
couplings ``U[-c, c]``, generator seeds no other run uses) and a fresh random grid BN with hard zeros
(:func:`motifs.grid.random_grid_bn`, 90% one-hot CPT rows: softened hot replicas, the first gap held),
``ReplicaExchange`` with Gibbs replicas (16 temperatures up to 10, 2 ensembles, the grid study's settings)
adapts its ladder in ``W`` warmup transitions with ``adaptation="barrier"`` (the default) and with
``adaptation="vousden"``; then ``--post`` transitions at the fixed ladder measure each pair's swap acceptance.
Reported per case, adaptation and ``W``: the lowest and highest pair rate (medians over seeds) and the
warmup's CPU seconds. Even rates are the adaptation's goal: the slowest pair bounds the round trips.

Run it from the repository root::

    python benchmarks/ladder_adaptation.py            # full run (about 3 minutes)
    python benchmarks/ladder_adaptation.py --quick    # smoke test: one 10x10 torus, W = 200, one seed

It writes ``ladder_adaptation.json``, ``.md`` and ``.png`` (each pair's rate along the ladder) into ``--out``
(default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from experiments.common import pyplot  # noqa: E402
from experiments.grid_study import random_ising_grid  # noqa: E402
from motifs.grid import random_grid_bn  # noqa: E402
from neuralblock import ReplicaExchange  # noqa: E402
from neuralblock.diagnostics.reports import markdown_table, write_json, write_report  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402

__all__ = ["main", "make_case", "swap_rates"]

ADAPTATIONS = ("barrier", "vousden")
_TORUS_SEED = 5000  # generator seeds of the fresh cases (+ the case's seed)
_BN_SEED = 7000


def make_case(name: str, seed: int) -> FactorGraph:
    """``ising-<side>-<c>``: a fresh Ising torus; ``bn-<side>``: a fresh random grid BN with hard zeros.

    Example:
        >>> make_case("ising-4-2", 0).num_variables, make_case("bn-3", 0).num_variables
        (16, 9)
    """
    kind, *rest = name.split("-")
    if kind == "ising" and len(rest) == 2:
        return random_ising_grid(int(rest[0]), float(rest[1]), torch.Generator().manual_seed(_TORUS_SEED + seed))
    if kind == "bn" and len(rest) == 1:
        return random_grid_bn(int(rest[0]), int(rest[0]), torch.Generator().manual_seed(_BN_SEED + seed))
    raise ValueError(f"a case is 'ising-<side>-<coupling>' or 'bn-<side>', got {name!r}")


def swap_rates(fg: FactorGraph, adaptation: str, warmup: int, post: int, seed: int) -> tuple[list[float], float]:
    """Each pair's swap acceptance over ``post`` transitions after ``warmup`` adapting ones, and the warmup's CPU s.

    Example:
        >>> rates, seconds = swap_rates(make_case("ising-4-2", 0), "barrier", warmup=16, post=20, seed=0)
        >>> len(rates), all(0.0 <= r <= 1.0 for r in rates), seconds > 0
        (15, True, True)
    """
    pyro.set_rng_seed(seed)
    kernel = ReplicaExchange(fg, replicas=16, max_temperature=10.0, chains=2, adaptation=adaptation)
    kernel.setup(warmup)
    params = kernel.initial_params
    start = time.process_time()
    for _ in range(warmup):
        params = kernel.sample(params)
    seconds = time.process_time() - start
    for _ in range(post):
        params = kernel.sample(params)
    return kernel.diagnostics()["swap_acceptance"], seconds


def _plot(record: dict, path: Path) -> None:
    plt = pyplot()
    cases = list(record["cases"])
    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.6), squeeze=False)
    for ax, case in zip(axes[0], cases):
        for key, runs in record["cases"][case].items():
            pairs = range(1, len(runs[0]["rates"]) + 1)
            median = [statistics.median(run["rates"][i] for run in runs) for i in range(len(pairs))]
            ax.plot(pairs, median, marker="o", markersize=3, label=key)
        ax.set_title(case)
        ax.set_xlabel("pair (cold to hot)")
        ax.set_ylabel("swap acceptance after warmup")
        ax.set_ylim(0.0, 1.0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["ising-20-2", "ising-20-5", "ising-20-10", "bn-14"])
    parser.add_argument("--warmups", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--post", type=int, default=1000, help="transitions at the fixed ladder that measure rates")
    parser.add_argument("--quick", action="store_true", help="smoke test: one 10x10 torus, W = 200, one seed")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.cases, args.warmups, args.seeds, args.post = ["ising-10-5"], [200], 1, 200
    torch.set_num_threads(1)
    record: dict = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "cases": {}}
    rows = []
    for case in args.cases:
        graphs = [make_case(case, seed) for seed in range(args.seeds)]
        for warmup in args.warmups:
            for adaptation in ADAPTATIONS:
                runs = []
                for seed, fg in enumerate(graphs):
                    rates, seconds = swap_rates(fg, adaptation, warmup, args.post, seed)
                    runs.append({"seed": seed, "rates": rates, "warmup_seconds": seconds})
                record["cases"].setdefault(case, {})[f"{adaptation}, W={warmup}"] = runs
                rows.append(
                    {
                        "case": case,
                        "adaptation": adaptation,
                        "W": warmup,
                        "lowest rate": statistics.median(min(run["rates"]) for run in runs),
                        "highest rate": statistics.median(max(run["rates"]) for run in runs),
                        "lowest, held gap aside": statistics.median(min(run["rates"][1:]) for run in runs),
                        "warmup CPU s": statistics.median(run["warmup_seconds"] for run in runs),
                    }
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "ladder_adaptation.json", record)
    _plot(record, out / "ladder_adaptation.png")
    intro = (
        "# Replica exchange: swap rates after the ladder's warmup adaptation\n\n"
        f"Gibbs replicas, 16 temperatures up to 10, 2 ensembles; {args.post} transitions at the adapted ladder "
        f"measure each pair's swap acceptance; medians over {args.seeds} fresh case(s) and seed(s). The BN's "
        "first gap is held (softened hot replicas), so its first pair's rate is the share of possible states "
        "there; `lowest, held gap aside` leaves the first pair out.\n\n"
    )
    write_report(out, "ladder_adaptation.md", intro + markdown_table(rows, list(rows[0]), spec=".3g") + "\n")
    return record


if __name__ == "__main__":
    main()
