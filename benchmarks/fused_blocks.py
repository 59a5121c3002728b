"""Fused, chain-batched block updates: the cost of a neural block sweep against a Gibbs sweep.

Measures, side by side in one run (one torch thread, CPU time per sweep through the public
``kernel.sample`` API, rounds interleaved, medians reported), on the UAI Ising grids
``Grids_11`` (10x10 torus) and ``Grids_15`` (20x20):

* ``nb`` / ``gibbs`` at ``K = 64`` vectorized chains: cost per chain-sweep of a pure neural
  2x2 block sweep (``grid-mrf-2x2``, ``gibbs_prob=0``) and of a single-site Gibbs sweep;
* the same at ``K = 1``, and ``nb`` at ``K = 1`` on the commit before this work
  (``--baseline``, checked out into a temporary ``git worktree`` and timed in a subprocess);
* the compiled path (``compile=True``) at ``K = 1`` and ``K = 64`` with its compile time;
* the torch functions (``_torch`` arms) and the NumPy functions (``_numpy`` arms) against the compiled loops
  that CPU states take by default (``numpy = None``: the compiled loops of ``neuralblock.kernels.jit`` up to
  ``JIT_MAX_ENTRIES`` state entries; same draws), at ``K = 1`` and for the neural kernel also at ``K = 64``;
* ``nbcover``: the neural sweep with ``cover=True`` (one 2x2 tiling per sweep, in turn, instead of every
  overlapping window), at ``K = 1`` and ``K = 64``;
* kernel setup time (the neural kernel tabulates its proposal per context value there);
* the reduced-precision option: the proposal tables computed by a bf16 network against fp32,
  as a KL divergence and as the exact expected MH acceptance of each table against the exact
  block conditional (both averaged over every instance and context value).

Ratios printed (targets of issue 19): NB/Gibbs per chain-sweep at K=64 (<= 3 on Grids_11,
<= 5 on Grids_15), Gibbs K=64 / Gibbs K=1 per chain-sweep (<= 1/5), baseline NB / NB at K=1
(>= 4). ``--device cuda`` instead times both kernels on a GPU for K up to 4096 chains on
``Grids_15`` (wall time with synchronisation, compiled).

Run it from the repository root::

    python benchmarks/fused_blocks.py                 # full run (a few minutes)
    python benchmarks/fused_blocks.py --quick         # smoke test: Grids_11, short rounds, no baseline
    python benchmarks/fused_blocks.py --device cuda   # GPU chain scaling

It writes ``fused_blocks.json`` and ``fused_blocks.md`` (``fused_blocks_<device>.*`` for a GPU run)
into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from neuralblock import GibbsKernel, NeuralBlockKernel, load_pretrained  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402
from neuralblock.io import read_uai, uai_grid  # noqa: E402
from neuralblock.kernels.fused_blocks import block_log_q_table  # noqa: E402

__all__ = ["main", "precision_check", "sweep_seconds"]

BASELINE = "709019b"  # the last commit before the fused, chain-batched path
PROPOSAL = "grid-mrf-2x2"

_BASELINE_SNIPPET = """
import importlib.metadata, pathlib, sys, time, torch
torch.set_num_threads(1)
# motifs installed as entry points since the baseline commit (e.g. gmm_pair_set) are not in its tree: skip them
_entry_points = importlib.metadata.entry_points
def _in_tree(**kwargs):
    found = _entry_points(**kwargs)
    tree = pathlib.Path.cwd()
    return importlib.metadata.EntryPoints(
        e for e in found if (tree / (e.module.replace(".", "/") + ".py")).exists()
    ) if kwargs.get("group") == "neuralblock.motifs" else found
importlib.metadata.entry_points = _in_tree
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.io import read_uai, uai_grid
fg = read_uai(uai_grid(sys.argv[1]))
kernel = NeuralBlockKernel(fg, [load_pretrained("grid-mrf-2x2")], gibbs_prob=0.0)
kernel.setup(0)
params = kernel.initial_params
for _ in range(3):
    params = kernel.sample(params)
sweeps, start = 0, time.process_time()
while time.process_time() - start < float(sys.argv[2]):
    params = kernel.sample(params)
    sweeps += 1
print((time.process_time() - start) / sweeps)
"""


@contextlib.contextmanager
def baseline_worktree(commit: str, prefix: str = "nb-baseline-") -> Iterator[Path | None]:
    """A detached ``git worktree`` of ``commit`` for timing it in a subprocess (``None`` for ``""``); removed after."""
    if not commit:
        yield None
        return
    worktree = Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True)
    try:
        yield worktree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``times[a] / times[b]`` (timed in the same round, so machine load mostly cancels).

    Example:
        >>> paired_ratio({"a": [2.0, 4.0, 9.0], "b": [1.0, 1.0, 3.0]}, "a", "b")
        3.0
    """
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def cell(value: Any, spec: str = "") -> str:
    """A table cell: ``value`` formatted by ``spec``, empty for ``None``.

    Example:
        >>> cell(0.12345, ".3f"), cell(None, ".3f")
        ('0.123', '')
    """
    return "" if value is None else format(value, spec)


def arm_lines(headers: Sequence[str], cells: dict[str, Sequence[str]]) -> list[str]:
    """The markdown lines of a per-arm table: the header row, then one row of cells per arm.

    Example:
        >>> arm_lines(["arm", "ms"], {"a": ["1.0"]})
        ['| arm | ms |', '|---|---|', '| a | 1.0 |']
    """
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *(f"| {name} | " + " | ".join(row) + " |" for name, row in cells.items()),
    ]


def ratio_lines(ratios: dict[str, float]) -> list[str]:
    """The markdown lines of a benchmark's ratio table (medians over rounds of within-round ratios).

    Example:
        >>> ratio_lines({"a / b": 0.5})[-1]
        '| a / b | 0.500 |'
    """
    return [
        "",
        "Ratios are medians over rounds of the ratio within a round (arms of one round ran back to back).",
        "",
        "| ratio | value |",
        "|---|---|",
        *(f"| {name} | {value:.3f} |" for name, value in ratios.items()),
    ]


def write_results(out: str | Path, stem: str, result: dict[str, Any], markdown: str) -> None:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``out`` (created if needed) and print the markdown."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (folder / f"{stem}.md").write_text(markdown)
    print(markdown)


def sweep_seconds(
    kernel: Any, budget: float, clock: Callable[[], float] = time.process_time, warm: int = 2, least: int = 2
) -> float:
    """Seconds per ``kernel.sample`` call (a full sweep of every chain), over about ``budget`` seconds.

    ``warm`` untimed calls come first, and at least ``least`` calls are timed.

    Example:
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> kernel = GibbsKernel(fg); kernel.setup(0)
        >>> sweep_seconds(kernel, 0.01) > 0
        True
    """
    params = kernel.initial_params
    sync = torch.cuda.synchronize if kernel.device.type == "cuda" else (lambda: None)
    for _ in range(warm):
        params = kernel.sample(params)
    sync()
    sweeps, start = 0, clock()
    while sweeps < least or clock() - start < budget:
        params = kernel.sample(params)
        sweeps += 1
        if sweeps % 8 == 0:
            sync()
    sync()
    return (clock() - start) / sweeps


def _build(
    kind: str,
    fg: FactorGraph,
    chains: int,
    compile: bool,
    device: str = "cpu",
    numpy: bool | None = None,
    jit: bool = True,
) -> tuple[Any, float]:
    """A set-up kernel and its setup seconds (``numpy=False``: the torch update functions, not NumPy's;
    ``jit=False``: the NumPy functions instead of the compiled loops)."""
    start = time.perf_counter()
    if kind in ("nb", "nbcover"):
        kernel = NeuralBlockKernel(
            fg,
            [load_pretrained(PROPOSAL)],
            gibbs_prob=0.0,
            chains=chains,
            compile=compile,
            device=device,
            cover=kind == "nbcover",
        )
    else:
        kernel = GibbsKernel(fg, chains=chains, compile=compile, device=device)
    kernel.setup(0)
    plans = [kernel.plan] if kind == "gibbs" else [kernel.single_site.gibbs_plan, *kernel.fused]
    for plan in plans:
        if plan is not None:
            plan.numpy = numpy
            plan.jit = plan.jit and jit
    return kernel, time.perf_counter() - start


def _baseline_seconds(worktree: Path, grid: str, budget: float) -> float:
    """CPU seconds per neural block sweep on the baseline commit (subprocess in its worktree)."""
    env = {**os.environ, "PYTHONPATH": str(worktree)}
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE_SNIPPET, grid, str(budget)],
        cwd=worktree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def precision_check(fg: FactorGraph) -> dict[str, float]:
    """bf16 against fp32 proposal tables: KL(q32 || q16), exact expected acceptance of each, tabulation seconds.

    For an independence proposal ``q`` of the exact block conditional ``p`` (both over the
    ``J`` joint values of one context), the expected MH acceptance is
    ``sum_{j, j'} p_j q_{j'} min(1, p_{j'} q_j / (p_j q_{j'}))``; it is averaged over every
    instance and context value of the graph.
    """
    kernel, _ = _build("nb", fg, 1, False)
    fused = kernel.fused[0]
    table, proposal = fused.table, kernel.proposals[0]
    features, log_p = [], []
    every = torch.arange(len(table.values))
    for i in range(len(fused.instances)):
        states = _context_states(table, fg, i)
        features.append(table._features(fg, fused.instances.select(torch.tensor([i])), states)[:, 0])
        energy = table.energy.select(torch.tensor([i]))(table.energy.flat, states, every.expand(len(states), 1, -1))
        log_p.append(torch.log_softmax(energy[:, 0], -1))
    features_all, log_p_all = torch.cat(features), torch.cat(log_p)
    start = time.perf_counter()
    log_q32 = block_log_q_table(proposal, features_all, table.values)
    fp32_seconds = time.perf_counter() - start
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_q16 = block_log_q_table(proposal, features_all, table.values).float()
    bf16_seconds = time.perf_counter() - start
    log_q16 = torch.log_softmax(log_q16, -1)
    kl = (log_q32.exp() * (log_q32 - log_q16)).sum(-1).mean()
    return {
        "rows": float(len(features_all)),
        "kl_fp32_bf16": float(kl),
        "acceptance_fp32": float(_expected_acceptance(log_p_all, log_q32).mean()),
        "acceptance_bf16": float(_expected_acceptance(log_p_all, log_q16).mean()),
        "tabulation_seconds_fp32": fp32_seconds,
        "tabulation_seconds_bf16": bf16_seconds,
    }


def _context_states(table: Any, fg: FactorGraph, i: int) -> torch.Tensor:
    """States enumerating every context value of instance ``i`` (in the table's row order)."""
    cards = table._ctx_cards[i]
    radix = table.radix[i].cpu()
    digits = torch.arange(int(cards.prod()))[:, None] // radix.clamp(min=1) % cards
    states = fg.initial_state().expand(len(digits), -1).clone()
    states[:, table.context[i].cpu()[radix > 0]] = digits[:, radix > 0].to(states.dtype)
    return states


def _expected_acceptance(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Expected MH acceptance of an independence proposal ``q`` for target ``p``, per row ``[R]``."""
    log_weight = log_p[:, :, None] + log_q[:, None, :]  # [R, j, j']: current j, proposed j'
    ratio = (log_weight.transpose(1, 2) - log_weight).clamp(max=0).exp()
    return torch.where(log_weight > -torch.inf, log_weight.exp() * ratio, 0.0).sum((-1, -2))


def cpu_run(args: argparse.Namespace) -> dict[str, Any]:
    """The CPU comparison of every grid: medians over interleaved rounds, and the ratios."""
    grids = ["Grids_11"] if args.quick else ["Grids_11", "Grids_15"]
    result: dict[str, Any] = {"grids": {}}
    with baseline_worktree("" if args.quick else args.baseline) as worktree:
        for grid in grids:
            fg = read_uai(uai_grid(grid))
            arms: dict[str, tuple[Any, float]] = {}
            for chains in (1, args.chains):  # one tiling of 2x2 windows per sweep (cover=True), default path only
                arms[f"nbcover_K{chains}"] = _build("nbcover", fg, chains, False)
            for kind in ("nb", "gibbs"):
                for chains in (1, args.chains):
                    arms[f"{kind}_K{chains}"] = _build(kind, fg, chains, False)
                    if args.compile:
                        arms[f"{kind}_K{chains}_compiled"] = _build(kind, fg, chains, True)
                    if chains == 1 or kind == "nb":
                        arms[f"{kind}_K{chains}_torch"] = _build(kind, fg, chains, False, numpy=False)
                        arms[f"{kind}_K{chains}_numpy"] = _build(kind, fg, chains, False, numpy=True, jit=False)
            times: dict[str, list[float]] = {name: [] for name in arms}
            if worktree is not None:
                times["nb_K1_baseline"] = []
            for _ in range(args.rounds):
                for name, (kernel, _) in arms.items():
                    times[name].append(sweep_seconds(kernel, args.budget) / kernel.chains)
                if worktree is not None:
                    times["nb_K1_baseline"].append(_baseline_seconds(worktree, grid, args.budget))
            median = {name: statistics.median(values) for name, values in times.items()}
            row: dict[str, Any] = {
                "variables": fg.num_variables,
                "per_chain_sweep_ms": {name: 1e3 * value for name, value in median.items()},
                "rounds_ms": {name: [1e3 * v for v in values] for name, values in times.items()},
                "setup_seconds": {name: seconds for name, (_, seconds) in arms.items()},
                "compile_seconds": {
                    name: kernel.diagnostics()["compile_seconds"] for name, (kernel, _) in arms.items()
                },
                "acceptance": arms["nb_K1"][0].diagnostics()["acceptance_by_proposal"][arms["nb_K1"][0]._label(0)],
            }
            k = args.chains
            ratios = {
                f"nb/gibbs per chain-sweep, K={k}": median[f"nb_K{k}"] / median[f"gibbs_K{k}"],
                "nb/gibbs per sweep, K=1": median["nb_K1"] / median["gibbs_K1"],
                f"gibbs K={k} / gibbs K=1 per chain-sweep": median[f"gibbs_K{k}"] / median["gibbs_K1"],
                "nb torch / nb default (compiled loops), K=1": median["nb_K1_torch"] / median["nb_K1"],
                "gibbs torch / gibbs default (compiled loops), K=1": median["gibbs_K1_torch"] / median["gibbs_K1"],
                f"nb torch / nb default, K={k}": median[f"nb_K{k}_torch"] / median[f"nb_K{k}"],
                "nb NumPy / nb default (compiled loops), K=1": median["nb_K1_numpy"] / median["nb_K1"],
                "gibbs NumPy / gibbs default (compiled loops), K=1": median["gibbs_K1_numpy"] / median["gibbs_K1"],
                f"nb NumPy / nb default, K={k}": median[f"nb_K{k}_numpy"] / median[f"nb_K{k}"],
                f"nb cover / nb per chain-sweep, K={k}": median[f"nbcover_K{k}"] / median[f"nb_K{k}"],
                f"nb cover / gibbs per chain-sweep, K={k}": median[f"nbcover_K{k}"] / median[f"gibbs_K{k}"],
                "nb cover / nb per sweep, K=1": median["nbcover_K1"] / median["nb_K1"],
            }
            if args.compile:
                ratios[f"nb/gibbs per chain-sweep, K={k}, compiled"] = (
                    median[f"nb_K{k}_compiled"] / median[f"gibbs_K{k}_compiled"]
                )
                ratios["nb eager / nb compiled, K=1"] = median["nb_K1"] / median["nb_K1_compiled"]
            if worktree is not None:
                ratios["nb baseline / nb, K=1"] = median["nb_K1_baseline"] / median["nb_K1"]
                if args.compile:
                    ratios["nb baseline / nb compiled, K=1"] = median["nb_K1_baseline"] / median["nb_K1_compiled"]
            row["ratios"] = ratios
            result["grids"][grid] = row
        result["precision"] = precision_check(read_uai(uai_grid("Grids_11")))
    return result


def device_run(args: argparse.Namespace) -> dict[str, Any]:
    """Per chain-sweep wall time of both kernels on ``args.device`` for growing numbers of chains."""
    fg = read_uai(uai_grid(args.grid))
    result: dict[str, Any] = {"grid": args.grid, "chains": {}}
    for chains in args.device_chains:
        row = {}
        for kind in ("nb", "gibbs"):
            kernel, setup = _build(kind, fg, chains, args.compile, args.device)
            seconds = sweep_seconds(kernel, args.budget, time.perf_counter)
            row[kind] = {
                "per_chain_sweep_us": 1e6 * seconds / chains,
                "per_sweep_ms": 1e3 * seconds,
                "setup_seconds": setup,
                "compile_seconds": kernel.diagnostics()["compile_seconds"],
            }
        row["nb/gibbs"] = row["nb"]["per_chain_sweep_us"] / row["gibbs"]["per_chain_sweep_us"]
        result["chains"][str(chains)] = row
        print(chains, json.dumps(row), flush=True)
    return result


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Fused neural block sweeps against Gibbs sweeps",
        "",
        f"Device {result['device']}, {result['threads']} thread(s), load average "
        f"{', '.join(f'{x:.2f}' for x in result['load_average'])}. "
        + (
            f"Medians over {result['rounds']} interleaved rounds of about {result['budget']} s CPU time each."
            if result["device"] == "cpu"
            else "Wall time with synchronisation."
        ),
        "",
    ]
    if result["device"] != "cpu":
        lines += [
            f"Grid {result['grid']}; cost per chain-sweep in microseconds.",
            "",
            "| chains | NB us | Gibbs us | NB/Gibbs | NB setup s | NB compile s | Gibbs compile s |",
            "|---|---|---|---|---|---|---|",
        ]
        for chains, row in result["chains"].items():
            lines.append(
                f"| {chains} | {row['nb']['per_chain_sweep_us']:.2f} | {row['gibbs']['per_chain_sweep_us']:.2f} | "
                f"{row['nb/gibbs']:.2f} | {row['nb']['setup_seconds']:.1f} | {row['nb']['compile_seconds']:.1f} | "
                f"{row['gibbs']['compile_seconds']:.1f} |"
            )
        return "\n".join(lines) + "\n"
    for grid, row in result["grids"].items():
        lines += [f"## {grid} ({row['variables']} variables), NB acceptance {row['acceptance']:.3f}", ""]
        lines += ["| arm | ms per chain-sweep | setup s | compile s |", "|---|---|---|---|"]
        for name, value in row["per_chain_sweep_ms"].items():
            setup = row["setup_seconds"].get(name)
            compile_s = row["compile_seconds"].get(name)
            lines.append(
                f"| {name} | {value:.4f} | {'' if setup is None else f'{setup:.2f}'} | "
                f"{'' if compile_s is None else f'{compile_s:.1f}'} |"
            )
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {name} | {value:.3f} |" for name, value in row["ratios"].items()]
        lines.append("")
    p = result["precision"]
    lines += [
        "## Reduced precision (bf16 network) on Grids_11",
        "",
        f"Over {p['rows']:.0f} (instance, context) rows: KL(q_fp32 || q_bf16) = {p['kl_fp32_bf16']:.2e}; expected "
        f"MH acceptance against the exact block conditional {p['acceptance_fp32']:.4f} (fp32) vs "
        f"{p['acceptance_bf16']:.4f} (bf16); tabulation {p['tabulation_seconds_fp32']:.2f} s (fp32) vs "
        f"{p['tabulation_seconds_bf16']:.2f} s (bf16). The network runs only while tabulating, at setup.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0, help="CPU seconds per arm and round")
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--baseline", default=BASELINE, help="commit to time the old neural block sweep on")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the compiled arms")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grid", default="Grids_15", help="grid of the device run")
    parser.add_argument("--device-chains", type=int, nargs="*", default=[1, 64, 256, 1024, 4096])
    parser.add_argument("--quick", action="store_true", help="smoke test: Grids_11, short rounds, no baseline")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.quick:
        args.rounds, args.budget, args.chains, args.compile = 1, 0.05, 8, False
    result = device_run(args) if args.device != "cpu" else cpu_run(args)
    result.update(
        device=args.device, threads=1, rounds=args.rounds, budget=args.budget, quick=args.quick,
        load_average=list(os.getloadavg()),
    )  # fmt: skip
    stem = "fused_blocks" if args.device == "cpu" else f"fused_blocks_{torch.device(args.device).type}"
    write_results(args.out, stem, result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
