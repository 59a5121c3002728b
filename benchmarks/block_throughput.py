"""Neural block throughput on 20x20 grids: batched colour classes vs a per-instance loop.

Measures, side by side in one process, grid-motif block proposals per second (proposed,
scored and accepted or rejected by exact MH) for one sweep over every instance of the
shipped grid proposals' motif:

* ``batched``: :class:`neuralblock.NeuralBlockKernel`'s colour classes on its general path (``fused=False``; the
  fused path is measured by ``fused_blocks.py``), each one MDN forward
  pass, one scaffold evaluation and one vectorized MH test
  (:func:`neuralblock.kernels.neural_block.neural_block_step` per class);
* ``loop``: the same step on one instance at a time, in the same class order, with every
  instance's scaffold precomputed before timing (what a per-instance implementation costs in
  the same engine).

Graphs: the UAI Ising grid ``Grids_17`` (20x20, ``grid-mrf-2x2``) and a random 20x20 grid BN
from the motif's instantiation distribution (``grid-bn-2x2``). Rounds are interleaved
(batched, loop, batched, loop, ...) and the median rate of each is reported, with the
machine's load average.

Run it from the repository root::

    python benchmarks/block_throughput.py             # full run (about a minute), 5 rounds
    python benchmarks/block_throughput.py --quick     # smoke test: 6x6 random grid BN, 1 round

It writes ``block_throughput.json`` and ``block_throughput.md`` into ``--out``
(default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from motifs.grid import random_grid_bn
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.graph import FactorGraph
from neuralblock.io import read_uai, uai_grid
from neuralblock.kernels.neural_block import neural_block_step

__all__ = ["main", "sweep_rates"]


def sweep_rates(fg: FactorGraph, proposal_name: str, rounds: int, sweeps: int) -> dict[str, Any]:
    """Blocks per second of batched classes and of a per-instance loop, interleaved ``rounds`` times.

    Example:
        >>> fg = random_grid_bn(4, 4, torch.Generator().manual_seed(0))
        >>> out = sweep_rates(fg, "grid-bn-2x2", rounds=1, sweeps=1)
        >>> out["instances"] > 0 and out["ratio"] > 0
        True
    """
    proposal = load_pretrained(proposal_name)
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.0, window=1, fused=False)
    kernel.setup(0)
    classes = kernel.block_classes[0]
    per_instance = []
    for cls in classes:
        for i in range(len(cls.instances)):
            one = cls.instances.select(torch.tensor([i]))
            per_instance.append((one, fg.scaffold(one.blocks)))
    state = kernel.initial_params["x"].clone()

    def batched(state: torch.Tensor) -> torch.Tensor:
        for cls in classes:
            state, _ = neural_block_step(fg, proposal, cls.instances, cls.scaffold, state)
        return state

    def loop(state: torch.Tensor) -> torch.Tensor:
        for one, scaffold in per_instance:
            state, _ = neural_block_step(fg, proposal, one, scaffold, state)
        return state

    rates: dict[str, list[float]] = {"batched": [], "loop": []}
    state = loop(batched(state))  # warm up both paths
    for _ in range(rounds):
        for name, sweep in (("batched", batched), ("loop", loop)):
            start = time.perf_counter()
            for _ in range(sweeps):
                state = sweep(state)
            rates[name].append(sweeps * len(per_instance) / (time.perf_counter() - start))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "proposal": proposal_name,
        "variables": fg.num_variables,
        "instances": len(per_instance),
        "classes": len(classes),
        "blocks_per_second": rates,
        "median_blocks_per_second": medians,
        "ratio": medians["batched"] / medians["loop"],
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Neural block throughput: batched colour classes vs a per-instance loop",
        "",
        f"{result['rounds']} interleaved rounds of {result['sweeps']} sweep(s), 1 thread, load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}. Rates are grid-motif block proposals per "
        "second (proposed, scored, MH-tested), medians over rounds.",
        "",
        "| graph | proposal | variables | instances | classes | batched blocks/s | per-instance blocks/s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["graphs"].items():
        med = row["median_blocks_per_second"]
        lines.append(
            f"| {name} | {row['proposal']} | {row['variables']} | {row['instances']} | {row['classes']} | "
            f"{med['batched']:.0f} | {med['loop']:.0f} | {row['ratio']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweeps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke test: a 6x6 random grid BN, 1 round")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        args.rounds, args.sweeps = 1, 1
        graphs = {"random grid BN 6x6": (random_grid_bn(6, 6, torch.Generator().manual_seed(0)), "grid-bn-2x2")}
    else:
        graphs = {
            "Grids_17 (20x20 Ising)": (read_uai(uai_grid("Grids_17")), "grid-mrf-2x2"),
            "random grid BN 20x20": (random_grid_bn(20, 20, torch.Generator().manual_seed(1020)), "grid-bn-2x2"),
        }
    result: dict[str, Any] = {"rounds": args.rounds, "sweeps": args.sweeps, "quick": args.quick, "graphs": {}}
    for name, (fg, proposal_name) in graphs.items():
        result["graphs"][name] = sweep_rates(fg, proposal_name, args.rounds, args.sweeps)
    result["load_average"] = list(os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "block_throughput.json").write_text(json.dumps(result, indent=1))
    (out / "block_throughput.md").write_text(_markdown(result))
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
