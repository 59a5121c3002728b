"""Study: can any 2x2 block proposal beat Gibbs on the UAI 2008 grid BNs? Exact block Gibbs per sweep.

The UAI 2008 grid Bayesian networks (``90-10-1``, ``90-14-1``, ``90-16-1``: binary, 90% of CPT rows
deterministic, no evidence) are where the grid study finds both NB+Gibbs and Gibbs frozen: errors move
by under 0.001 after the first quarter of a run. The neural 2x2 proposal is trained to the exact
conditional of its block, so *exact 2x2 block Gibbs* is what a perfectly trained 2x2 neural block kernel
does per sweep. (A Metropolized variant, proposing only other block values, moves at most
``1 / (1 - p_stay)`` times as often, where ``p_stay`` is the exact probability of the current value.)
This script runs it beside exact single-site Gibbs from the same exact starts and compares the pooled
marginal error per sweep:

* every chain starts at an exact draw (ancestral sampling in topological order, as the kernels' own
  start finder does for a BN), so the error at sweep 0 is the Monte Carlo error of ``K`` exact draws;
* ``frozen``: the error of those starts (chains that never move);
* ``independent``: the error of ``K * (S + 1)`` fresh exact draws, what a perfectly mixing sampler would
  reach with the same number of pooled draws;
* blocks are tiles of ``b x b`` cells; tiles are coloured so that no factor touches two tiles of one colour,
  and each colour's tiles are drawn at once from their exact conditionals (all ``2^(b*b)`` values
  enumerated through the graph's own factor tables).

Per instance: the mean over seeds of each sampler's error after ``S`` sweeps, the paired difference
2x2 - 1x1 with its standard error and t-test p-value, and the fraction of the possible gain
(``frozen - independent``) each sampler realises. Each sampler's sweeps run through the run harness
(:func:`neuralblock.diagnostics.runs.timed_run`) on CPU time (``"cpu"``, ``time.process_time``):
``cpu_seconds`` is the sweeps alone, not the error and move bookkeeping. Outputs (under ``--out``, a folder named by the
config's hash): ``bn_block_mobility.json``, ``.md`` and ``.png``.

Usage::

    python -m experiments.bn_block_mobility --quick   # CI scale
    python -m experiments.bn_block_mobility           # the committed run (about 10 CPU minutes)
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from scipy import stats
from torch import Tensor
from tqdm import tqdm

from experiments.common import open_study, parse_quick, pyplot, study_parser
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.diagnostics.runs import timed_run
from neuralblock.exact.chain import gumbel_argmax
from neuralblock.graph import FactorGraph
from neuralblock.io import erg_grid, read_erg, read_mar
from neuralblock.kernels.base import sequential_init

plt = pyplot()

INSTANCES = ["90-10-1", "90-14-1", "90-16-1"]
NEG_LARGE = -1e30  # stands for log 0 in the factor sums (-inf * 0 would be NaN in a matrix product)


class TiledBlockGibbs:
    """Exact block Gibbs on a binary grid graph with ``size x size`` tiles, one colour class at a time.

    Example:
        >>> fg = read_erg(erg_grid("90-10-1"))
        >>> sampler = TiledBlockGibbs(fg, 2)
        >>> len(sampler.classes), sampler.configs.shape
        (4, torch.Size([16, 4]))
    """

    def __init__(self, fg: FactorGraph, size: int) -> None:
        if set(fg.cardinalities.tolist()) != {2}:
            raise ValueError("TiledBlockGibbs enumerates binary variables only")
        cells = {}
        for v, name in enumerate(fg.names):
            found = re.findall(r"\d+", name)
            if len(found) < 2:
                raise ValueError(f"variable {name!r} is not named by its grid cell (e.g. V_2_3)")
            cells[(int(found[-2]), int(found[-1]))] = v
        rows = sorted({i for i, _ in cells})
        cols = sorted({j for _, j in cells})
        self.fg, self.size = fg, size
        self.configs = torch.tensor(list(itertools.product((0.0, 1.0), repeat=size * size)))  # [Q, b*b]
        groups, group_rows = fg.factor_location(torch.arange(fg.num_factors))
        offsets = torch.tensor([0] + [g.num_factors for g in fg.groups]).cumsum(0)
        self.position = offsets[groups] + group_rows  # global factor id -> column of cat(log_factors)
        tiles: dict[tuple[int, int], list[int]] = {}
        for (i, j), v in cells.items():
            tiles.setdefault((rows.index(i) // size, cols.index(j) // size), []).append(v)
        self.classes = []
        for colour in itertools.product(range(2), range(2)):
            members = [t for t in sorted(tiles) if (t[0] % 2, t[1] % 2) == colour and len(tiles[t]) == size * size]
            if members:
                self.classes.append(self._colour_class([tiles[t] for t in members]))
        covered = sorted(v for c in self.classes for v in c[0].flatten().tolist())
        if covered != list(range(fg.num_variables)):
            raise ValueError(f"the grid's sides are not multiples of the tile size {size}")

    def _colour_class(self, tiles: list[list[int]]) -> tuple[Tensor, Tensor]:
        """Variable ids ``[B, b*b]`` and the factor/tile incidence ``[F, B]`` (columns of cat(log_factors))."""
        incidence = torch.zeros(self.fg.num_factors, len(tiles), dtype=torch.float64)
        for b, tile in enumerate(tiles):
            for f in self.fg.scaffold_factors(tile):
                incidence[self.position[f], b] = 1.0
        if (incidence.sum(1) > 1).any():
            raise ValueError("a factor touches two tiles of one colour: the tiles are not conditionally independent")
        return torch.tensor(tiles), incidence

    def sweep(self, states: Tensor, generator: torch.Generator) -> Tensor:
        """One sweep over every colour class of ``states [K, n]``: the new states (``states`` is left as it is)."""
        q, states = self.configs.shape[0], states.clone()
        for tiles, incidence in self.classes:
            trial = states.expand(q, *states.shape).clone()  # [Q, K, n]: every tile of the class at config q
            trial[:, :, tiles] = self.configs[:, None, None, :].to(states.dtype)
            logs = torch.cat(self.fg.log_factors(trial), -1).double().clamp(min=NEG_LARGE)
            logits = (logs @ incidence).permute(1, 2, 0)  # [K, B, Q]: each tile's exact conditional, unnormalised
            choice = gumbel_argmax(logits, generator)  # [K, B]
            states[:, tiles] = self.configs[choice].to(states.dtype)
        return states


def pooled_error(ones: Tensor, count: int, exact: Tensor) -> float:
    """Mean over variables of ``|p_hat(v=1) - p(v=1)|`` (= the UAI mean over (variable, value) for binary)."""
    return float((ones / count - exact[:, 1]).abs().mean())


def run_instance(name: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Errors vs sweeps of each tile size from one set of exact starts, plus the frozen/independent references."""
    fg = read_erg(erg_grid(name))
    exact = read_mar(erg_grid(name).with_name(f"{name}.MAR")).double()
    torch.manual_seed(seed)
    starts = sequential_init(fg, chains=args.chains).double()
    checkpoints = sorted({0, *[c for c in args.checkpoints if c <= args.sweeps], args.sweeps})
    out: dict[str, Any] = {"checkpoints": checkpoints, "frozen": pooled_error(starts.sum(0), args.chains, exact)}
    fresh = sequential_init(fg, chains=args.chains * (args.sweeps + 1)).double()
    out["independent"] = pooled_error(fresh.sum(0), fresh.shape[0], exact)
    for size in args.sizes:
        sampler = TiledBlockGibbs(fg, size)
        generator = torch.Generator().manual_seed(seed * 1000 + size)
        sweep = partial(sampler.sweep, generator=generator)
        run = timed_run(sweep, initial_params=starts, samples=args.sweeps, clock="cpu", keep=torch.clone)
        states = torch.cat([starts[None], cast(Tensor, run.draws)])  # [S + 1, K, n], the starts first
        ones = states.sum(1).cumsum(0)  # [S + 1, n]: each variable's ones over the states so far
        moved = (states[1:] != states[:-1]).double().mean((1, 2)).tolist()  # per sweep
        out[f"{size}x{size}"] = {
            "errors": [pooled_error(ones[s], args.chains * (s + 1), exact) for s in checkpoints],
            "changed_per_sweep": sum(moved) / len(moved),
            "cpu_seconds": run.sampling_s,
        }
    return out


def summarize(name: str, runs: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Seed means at the last sweep, the paired 2x2 - 1x1 difference and the share of the possible gain."""
    row: dict[str, Any] = {"instance": name, "seeds": len(runs)}
    frozen = torch.tensor([r["frozen"] for r in runs])
    independent = torch.tensor([r["independent"] for r in runs])
    row["frozen"], row["independent"] = float(frozen.mean()), float(independent.mean())
    finals = {}
    for size in sizes:
        key = f"{size}x{size}"
        finals[size] = torch.tensor([r[key]["errors"][-1] for r in runs])
        row[key] = float(finals[size].mean())
        row[f"{key} changed/sweep"] = sum(r[key]["changed_per_sweep"] for r in runs) / len(runs)
        row[f"{key} share of gain"] = float(((frozen - finals[size]) / (frozen - independent)).mean())
    if 1 in finals and 2 in finals and len(runs) > 1:
        diff = finals[2] - finals[1]
        row["2x2 - 1x1"] = float(diff.mean())
        row["SE"] = float(diff.std() / math.sqrt(len(diff)))
        row["p"] = float(stats.ttest_1samp(diff.numpy(), 0.0).pvalue) if float(diff.std()) > 0 else 1.0
    return row


def plot(record: dict[str, Any], path: Path) -> None:
    names = list(record["instances"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        runs = record["instances"][name]["runs"]
        sweeps = runs[0]["checkpoints"]
        x = [max(s, 0.5) for s in sweeps]
        for size in record["config"]["sizes"]:
            key = f"{size}x{size}"
            mean = torch.tensor([r[key]["errors"] for r in runs]).mean(0)
            ax.plot(x, mean.tolist(), marker="o", label=f"exact {key} block Gibbs")
        ax.axhline(sum(r["frozen"] for r in runs) / len(runs), color="grey", ls="--", label="frozen starts")
        ax.axhline(sum(r["independent"] for r in runs) / len(runs), color="black", ls=":", label="independent draws")
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("sweeps")
        ax.set_ylabel("mean marginal error (pooled chains)")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def write_outputs(folder: Path, record: dict[str, Any]) -> None:
    write_json(folder / "bn_block_mobility.json", record)
    sizes = record["config"]["sizes"]
    columns = ["instance", "seeds", "frozen", "independent"]
    for size in sizes:
        columns += [f"{size}x{size}", f"{size}x{size} changed/sweep", f"{size}x{size} share of gain"]
    columns += ["2x2 - 1x1", "SE", "p"]
    cfg = record["config"]
    lines = [
        "# Exact block Gibbs on the UAI 2008 grid BNs",
        "",
        f"{cfg['chains']} chains from exact (ancestral) starts, {cfg['sweeps']} sweeps, {cfg['seeds']} seeds; errors "
        "are the mean marginal error of all draws pooled (starts included), means over seeds. `frozen`: the starts "
        "alone; `independent`: as many fresh exact draws. `share of gain`: (frozen - error) / (frozen - independent). "
        "`2x2 - 1x1`: paired over seeds, with its standard error and t-test p-value. Exact 2x2 block Gibbs is "
        "what a perfectly trained 2x2 neural proposal does per sweep.",
        "",
        markdown_table(record["summary"], [c for c in columns if any(c in r for r in record["summary"])], ".4g"),
        "",
        "![errors vs sweeps](bn_block_mobility.png)",
    ]
    (folder / "bn_block_mobility.md").write_text("\n".join(lines) + "\n")
    plot(record, folder / "bn_block_mobility.png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--instances", nargs="+", default=INSTANCES, choices=INSTANCES)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2], help="tile sides (must divide the grid side)")
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--sweeps", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[1, 3, 10, 30, 100])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI scale")
    parser.add_argument("--out", default="experiments/results/bn_block_mobility")
    return parse_quick(parser, argv, {"instances": ["90-10-1"], "sizes": [1, 2], "chains": 8, "sweeps": 6, "seeds": 2})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args)
    record: dict[str, Any] = {"config": config, "instances": {}, "summary": []}
    jobs = [(name, seed) for name in args.instances for seed in range(args.seeds)]
    for name, seed in tqdm(jobs, desc="block Gibbs", disable=args.quick):
        record["instances"].setdefault(name, {"runs": []})["runs"].append(run_instance(name, args, seed))
    record["summary"] = [summarize(n, e["runs"], args.sizes) for n, e in record["instances"].items()]
    write_outputs(folder, record)
    return record


if __name__ == "__main__":
    main()
