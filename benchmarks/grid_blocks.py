"""Larger blocks: a 3x3 neural block proposal against the shipped 2x2 one on the UAI Ising grids.

Issue 22, item 3: does a 3x3 grid proposal (512 joint block values, still exactly enumerable)
pay on the fused path? Measured side by side in one process (one torch thread, CPU time
``time.process_time``, ``--chains`` vectorized chains, arms run back to back per seed), on
``Grids_11``, ``Grids_13`` (10x10 tori) and ``Grids_16`` (20x20):

* ``Gibbs``: single-site Gibbs sweeps (:class:`~neuralblock.GibbsKernel`);
* ``NB 2x2+Gibbs``: :class:`~neuralblock.NeuralBlockKernel` with the shipped ``grid-mrf-2x2``
  (``gibbs_prob`` as the grid study, 0.5);
* ``NB 3x3+Gibbs``: the same with the 3x3 proposal (``--proposal3``, a file or a shipped name).
  Its context space (4096 values per block) is too large to tabulate, so the block table runs in
  slot mode: rows are computed by the network as chains visit them;
* ``exact 2x2+Gibbs`` / ``exact 3x3+Gibbs``: references, the perfect proposal of each block size
  (exact block Gibbs: each block drawn from its exact conditional, read from the fused table's
  block energies), mixed with single-site sweeps at the same ``gibbs_prob``. They tell whether
  bigger blocks help mixing at all, whatever the network.

For every arm: the acceptance of the block proposals, the CPU cost per chain-sweep (a sweep is
one transition, block or single-site; the table's row computations included), the setup time,
and the mean absolute marginal error against the exact marginals (all chains pooled, no burn-in)
at equal CPU time (setup included: each arm runs until setup + sampling reach ``--seconds``,
each read at its end) and at equal sweeps (the sweeps ``NB 3x3+Gibbs`` made; the
exact references run that many, or stop at 4x the budget). Verdict: 3x3 pays when ``NB 3x3+Gibbs`` has the lower
seed-mean error at equal CPU time than ``NB 2x2+Gibbs`` on more than half of the grids.

Run it from the repository root::

    python benchmarks/grid_blocks.py                  # full run (about 15 minutes)
    python benchmarks/grid_blocks.py --quick          # smoke test: Grids_11, K = 8, 1 s, one seed
    python benchmarks/grid_blocks.py --from-json benchmarks/results/grid_blocks.json   # rewrite table and plot

It writes ``grid_blocks.json``, ``grid_blocks.md`` and ``grid_blocks.png`` (error against CPU time)
into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused_blocks import arm_lines, cell, write_results  # noqa: E402  (shared with the other benchmarks)

from experiments.common import load_proposal_or_untrained, pyplot  # noqa: E402
from motifs.grid import GridMotif  # noqa: E402
from neuralblock import GibbsKernel, NeuralBlockKernel, load_pretrained  # noqa: E402
from neuralblock.diagnostics import RunningMarginals  # noqa: E402
from neuralblock.diagnostics.runs import ErrorTrace, TimedRun, equal_time, error_at, timed_run  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.io import read_mar, read_uai, uai_grid  # noqa: E402
from neuralblock.kernels.fused_blocks import FusedBlockSweep  # noqa: E402
from neuralblock.proposals import NeuralBlockProposal  # noqa: E402

__all__ = ["ExactBlockGibbs", "error_at_sweeps", "main", "run", "summarise"]

GRIDS = ["Grids_11", "Grids_13", "Grids_16"]
ARMS = ["Gibbs", "NB 2x2+Gibbs", "NB 3x3+Gibbs", "exact 2x2+Gibbs", "exact 3x3+Gibbs"]
TIMED = ARMS[:3]  # the arms run on the CPU-time budget (the exact references run a number of sweeps)
PROPOSAL2 = "grid-mrf-2x2"
PROPOSAL3 = "outputs/grid-mrf-3x3"


class ExactBlockGibbs:
    """Exact block Gibbs over a proposal's blocks, mixed with single-site sweeps: the perfect proposal of a block size.

    Each transition is, with probability ``gibbs_prob``, a single-site Gibbs sweep, else a sweep
    over the proposal's colour classes in which every block is drawn from its exact conditional
    given its blanket (the energies of all ``J`` joint values, from the fused table's
    :class:`~neuralblock.kernels.fused_blocks.BlockTableEnergy`). A benchmark reference, not a
    shipped sampler (its cost is that of enumerating every block's ``J`` energies per sweep).

    Args:
        fg: the graph (table factors, a grid the proposal's motif finds blocks in).
        proposal: the block proposal whose motif gives the blocks (the network is not used).
        chains: vectorized chains.
        gibbs_prob: probability of a single-site sweep per transition.

    Example:
        >>> fg = read_uai(uai_grid("Grids_11"))
        >>> kernel = ExactBlockGibbs(fg, load_pretrained(PROPOSAL2), chains=2, gibbs_prob=0.0)
        >>> kernel.setup(0); kernel.sample(kernel.initial_params)["x"].shape
        torch.Size([2, 100])
    """

    def __init__(self, fg: FactorGraph, proposal: NeuralBlockProposal, chains: int, gibbs_prob: float) -> None:
        self.fg, self.chains, self.gibbs_prob = fg, chains, gibbs_prob
        self.blocks = NeuralBlockKernel(fg, [proposal], gibbs_prob=0.0, chains=chains)
        self.single = GibbsKernel(fg, chains=chains)
        self.classes: list[tuple[Any, Tensor]] = []
        self.initial_params: dict[str, Tensor] = {}

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Set up both kernels and collect each colour class's block energies and block variables."""
        self.blocks.setup(warmup_steps)
        self.single.setup(warmup_steps)
        fused = self.blocks.fused[0]
        if not isinstance(fused, FusedBlockSweep):
            raise ValueError("exact block Gibbs needs the proposal on the fused table path")
        table = fused.table
        self.flat, self.values = table.energy.flat, table.values
        self.classes = []
        for rows, size in zip(fused.rows, fused.sizes):
            real = rows[:size]  # padded rows repeat a real one: drop them (each block is drawn once)
            self.classes.append((table.energy.select(real), fused.instances.blocks[real.cpu()].reshape(-1)))
        self.initial_params = self.blocks.initial_params

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One transition of every chain."""
        if float(torch.rand(())) < self.gibbs_prob:
            return dict(self.single.sample(params))
        state = params["x"]
        width = len(self.values)
        for energy, block_ids in self.classes:
            count = len(block_ids) // self.values.shape[1]
            joint = torch.arange(width).expand(state.shape[0], count, width)
            log_p = energy(self.flat, state, joint)  # [K, I, J] unnormalised block log-conditionals
            gumbel = -torch.empty_like(log_p).exponential_().log()
            chosen = (log_p + gumbel).argmax(-1)  # a draw of each block's exact conditional
            new = self.values.index_select(0, chosen.view(-1)).view(state.shape[0], -1).to(state.dtype)
            state = state.index_copy(1, block_ids, new)
        return {"x": state}

    def diagnostics(self) -> dict[str, Any]:
        """Acceptance 1 by construction (every block is drawn from its conditional)."""
        return {"acceptance_by_proposal": {"grid": 1.0}}


def _make(arm: str, fg: FactorGraph, proposals: dict[str, NeuralBlockProposal], args: argparse.Namespace) -> Any:
    """The kernel of an arm."""
    if arm == "Gibbs":
        return GibbsKernel(fg, chains=args.chains)
    size = "3x3" if "3x3" in arm else "2x2"
    if arm.startswith("NB"):
        return NeuralBlockKernel(fg, proposals=[proposals[size]], gibbs_prob=args.gibbs_prob, chains=args.chains)
    return ExactBlockGibbs(fg, proposals[size], chains=args.chains, gibbs_prob=args.gibbs_prob)


def _one_run(
    kernel: Any, fg: FactorGraph, exact: Tensor, args: argparse.Namespace, sweeps: int | None, exact_arm: bool
) -> dict[str, Any]:
    """Run one arm from setup: ``sweeps`` draws (``exact_arm``) or ``args.seconds`` of setup + sampling CPU time.

    The error after ``sweeps`` draws is recorded on the way (when the run gets there).
    """
    counts = RunningMarginals(fg, exact)
    at_sweeps: dict[str, float] = {}

    def observe(params: Any) -> None:
        counts(params)
        if sweeps is not None and counts.draws == sweeps * args.chains:
            at_sweeps["error"] = counts.error()

    budget: dict[str, Any] = {"samples": sweeps} if exact_arm else {"seconds": args.seconds}
    timed: TimedRun = timed_run(
        kernel,
        observe=observe,
        error=counts.error,
        cap_seconds=4 * args.seconds if exact_arm else args.seconds,
        clock="cpu",
        checkpoints=args.checkpoints,
        **budget,
    )
    diagnostics = timed.diagnostics
    acceptance = diagnostics.get("acceptance_by_proposal", {}).get("grid")
    return {
        "seconds": [timed.setup_s + t for t in timed.trace.seconds],  # CPU time since the run began
        "errors": list(timed.trace.errors),
        "sweeps": list(timed.trace.sweeps),
        "setup_s": timed.setup_s,
        "sampling_s": timed.sampling_s,
        "samples": timed.samples,
        "ms_per_chain_sweep": 1e3 * timed.sampling_s / max(timed.samples, 1) / args.chains,
        "acceptance": acceptance,
        "proposal_cache": diagnostics.get("proposal_cache", {}).get("grid"),
        "single_site_sweeps": diagnostics.get("single_site_sweeps"),
        "error_at_nb3_sweeps": at_sweeps.get("error"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every grid and seed: the arms back to back (``NB 3x3+Gibbs`` first: its sweeps set the equal-sweeps point)."""
    proposals = {
        "2x2": load_pretrained(PROPOSAL2),
        "3x3": load_proposal_or_untrained(args.proposal3, args.quick, lambda: GridMotif("mrf", 3), [64, 64]),
    }
    order = ["NB 3x3+Gibbs"] + [arm for arm in ARMS if arm != "NB 3x3+Gibbs"]
    result: dict[str, Any] = {"grids": {}}
    for grid in args.grids:
        fg, exact = read_uai(uai_grid(grid)), read_mar(uai_grid(grid, "MAR"))
        runs: list[dict[str, Any]] = []
        for s in range(args.seeds):
            row: dict[str, Any] = {"seed": args.seed + s}
            nb3_sweeps: int | None = None
            for arm in order:
                pyro.set_rng_seed(args.seed + s)
                kernel = _make(arm, fg, proposals, args)
                exact_arm = arm.startswith("exact")
                row[arm] = _one_run(kernel, fg, exact, args, nb3_sweeps, exact_arm)
                if arm == "NB 3x3+Gibbs":
                    nb3_sweeps = row[arm]["samples"]
                else:
                    row[arm]["nb3_sweeps_reached"] = row[arm]["samples"] >= (nb3_sweeps or 0)
                print(grid, s, arm, f"{row[arm]['samples']} sweeps, error {row[arm]['errors'][-1]:.4f}", flush=True)
            row["nb3_sweeps"] = nb3_sweeps
            runs.append(row)
        result["grids"][grid] = {"variables": fg.num_variables, "runs": runs}
    return summarise(result)


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Add each grid's seed-mean summary and the verdict to a result (also to rewrite a finished run's JSON)."""
    for g in result["grids"].values():
        for row in g["runs"]:
            # every timed arm stopped on the same budget (setup + sampling), at most one sweep past it
            traces = [ErrorTrace(row[arm]["seconds"], row[arm]["errors"]) for arm in TIMED]
            row["equal_time_s"] = equal_time(traces, same_budget=True)
            for arm, trace in zip(TIMED, traces):
                row[arm]["error_at_equal_time"] = error_at(trace, row["equal_time_s"])
        g["summary"] = _summary(g["runs"])
    wins = [g["summary"]["nb3_beats_nb2_at_equal_time"] for g in result["grids"].values()]
    result["verdict"] = {"nb3_wins": sum(wins), "grids": len(wins), "pays": sum(wins) > len(wins) / 2}
    return result


def error_at_sweeps(arm: dict[str, Any], sweeps: int) -> float | None:
    """An arm's error at its last checkpoint after at most ``sweeps`` sweeps (``None`` before its first).

    Example:
        >>> error_at_sweeps({"sweeps": [1, 10, 100], "errors": [0.5, 0.3, 0.1]}, 50)
        0.3
    """
    earlier = [e for n, e in zip(arm["sweeps"], arm["errors"]) if n <= sweeps]
    return earlier[-1] if earlier else None


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means per arm, and whether NB 3x3 beats NB 2x2 at equal CPU time."""
    arms: dict[str, dict[str, float | None]] = {}
    for arm in ARMS:
        arms[arm] = {
            key: _mean([r[arm].get(key) for r in runs])
            for key in (
                "acceptance",
                "ms_per_chain_sweep",
                "setup_s",
                "error_at_equal_time",
                "error_at_nb3_sweeps",
                "samples",
            )
        }
    arms["NB 3x3+Gibbs"]["error_at_nb3_sweeps"] = _mean([r["NB 3x3+Gibbs"]["errors"][-1] for r in runs])
    common = [min(r[arm]["samples"] for arm in ARMS) for r in runs]  # sweeps every arm made
    for arm in ARMS:
        arms[arm]["error_at_common_sweeps"] = _mean([error_at_sweeps(r[arm], m) for r, m in zip(runs, common)])
    cache = [r["NB 3x3+Gibbs"]["proposal_cache"] or {} for r in runs]
    nb2, nb3 = arms["NB 2x2+Gibbs"], arms["NB 3x3+Gibbs"]
    e2, e3 = nb2["error_at_equal_time"], nb3["error_at_equal_time"]
    return {
        "arms": arms,
        "equal_time_s": _mean([r["equal_time_s"] for r in runs]),
        "nb3_sweeps": _mean([r["nb3_sweeps"] for r in runs]),
        "common_sweeps": _mean(common),
        "nb3_rows_computed": _mean([c.get("computed") for c in cache]),
        "nb3_evictions": _mean([c.get("evictions") for c in cache]),
        "nb3_beats_nb2_at_equal_time": e2 is not None and e3 is not None and e3 < e2,
        "cost_nb3_over_nb2": (nb3["ms_per_chain_sweep"] or math.nan) / (nb2["ms_per_chain_sweep"] or math.nan),
    }


def _markdown(result: dict[str, Any]) -> str:
    v = result["verdict"]
    lines = [
        "# Larger blocks: 3x3 against 2x2 neural block proposals on the UAI Ising grids",
        "",
        f"CPU, 1 thread, {result['chains']} vectorized chains per arm, {result['seeds']} seed(s), `gibbs_prob` "
        f"{result['gibbs_prob']}, budget {result['seconds']} s CPU time per arm from setup, load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}. 3x3 proposal: `{result['proposal3']}`"
        + (
            f" (validation acceptance {result['proposal3_val_acceptance']:.3f})"
            if result["proposal3_val_acceptance"]
            else ""
        )
        + ". Seed means. `ms/chain-sweep`: CPU time of sampling per transition and chain (block and single-site "
        "sweeps mixed; the 3x3 table's row computations included); `err @ time`: mean absolute marginal error at "
        "equal CPU time since setup began (every timed arm stops on the same budget, at most one sweep past it, "
        "and is read at its end); `err @ NB3 sweeps`: at the number of "
        "sweeps NB 3x3+Gibbs made in its budget (the exact references run that many, or stop at 4x the budget); "
        "`err @ common`: at the fewest sweeps any arm of the seed made (each arm's last checkpoint at or before "
        "them). `exact`: the perfect proposal of that block size (exact block Gibbs), compared per sweep only.",
        "",
    ]
    for grid, g in result["grids"].items():
        s = g["summary"]
        lines += [
            f"## {grid} ({g['variables']} variables): equal time {s['equal_time_s']:.1f} s, "
            f"NB 3x3 sweeps {s['nb3_sweeps']:.0f}, common sweeps {s['common_sweeps']:.0f}, NB3/NB2 cost per "
            f"chain-sweep {s['cost_nb3_over_nb2']:.1f}x; the 3x3 table computed {cell(s['nb3_rows_computed'], '.0f')} "
            f"rows ({cell(s['nb3_evictions'], '.1f')} evictions of all rows)",
            "",
        ]
        cells: dict[str, Sequence[str]] = {
            arm: [
                cell(a["acceptance"], ".3f"),
                cell(a["ms_per_chain_sweep"], ".4f"),
                cell(a["setup_s"], ".2f"),
                cell(a["samples"], ".0f"),
                cell(a["error_at_equal_time"], ".4f"),
                cell(a["error_at_nb3_sweeps"], ".4f"),
                cell(a["error_at_common_sweeps"], ".4f"),
            ]
            for arm, a in s["arms"].items()
        }
        headers = [
            "arm",
            "acceptance",
            "ms/chain-sweep",
            "setup s",
            "sweeps",
            "err @ time",
            "err @ NB3 sweeps",
            "err @ common",
        ]
        lines += arm_lines(headers, cells)
        lines.append("")
    lines.append(
        f"**Verdict:** NB 3x3+Gibbs has the lower error at equal CPU time than NB 2x2+Gibbs on {v['nb3_wins']} of "
        f"{v['grids']} grid(s): 3x3 {'pays' if v['pays'] else 'does not pay'}."
    )
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], path: Path) -> None:
    """Error against CPU time since setup, one panel per grid, every seed's trace of each timed arm."""
    plt = pyplot()
    grids = list(result["grids"])
    fig, axes = plt.subplots(1, len(grids), figsize=(5 * len(grids), 4), squeeze=False)
    colours = {"Gibbs": "tab:gray", "NB 2x2+Gibbs": "tab:blue", "NB 3x3+Gibbs": "tab:red"}
    for ax, grid in zip(axes[0], grids):
        for i, r in enumerate(result["grids"][grid]["runs"]):
            for arm, colour in colours.items():
                ax.plot(r[arm]["seconds"], r[arm]["errors"], color=colour, alpha=0.8, label=arm if i == 0 else None)
        ax.set(xscale="log", yscale="log", title=grid, xlabel="CPU s since setup began", ylabel="mean |marginal error|")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run every grid, write the JSON, markdown and plot, and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--grids", nargs="+", default=GRIDS)
    parser.add_argument("--proposal3", default=PROPOSAL3, help="the 3x3 proposal: a file or a shipped name")
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="CPU seconds per arm (setup + sampling)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gibbs-prob", type=float, default=0.5)
    parser.add_argument("--checkpoints", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="smoke test: Grids_11, K = 8, 1 s, one seed")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--from-json", default=None, help="rewrite the table and plot of a finished run's JSON")
    args = parser.parse_args(argv)
    if args.from_json:
        result = summarise(json.loads(Path(args.from_json).read_text()))
        write_results(args.out, "grid_blocks", result, _markdown(result))
        _plot(result, Path(args.out) / "grid_blocks.png")
        return result
    torch.set_num_threads(1)
    if args.quick:
        args.grids, args.chains, args.seconds, args.seeds = ["Grids_11"], 8, 1.0, 1
    result = run(args)
    sidecar = Path(args.proposal3).with_suffix(".json")
    val = None
    if sidecar.is_file():
        val = json.loads(sidecar.read_text()).get("metadata", {}).get("validation", {}).get("acceptance")
    result.update(
        chains=args.chains, seconds=args.seconds, seeds=args.seeds, gibbs_prob=args.gibbs_prob, quick=args.quick,
        proposal3=args.proposal3, proposal3_val_acceptance=val, load_average=list(os.getloadavg()),
    )  # fmt: skip
    write_results(args.out, "grid_blocks", result, _markdown(result))
    _plot(result, Path(args.out) / "grid_blocks.png")
    return result


if __name__ == "__main__":
    main()
