"""Fused, chain-batched continuous block updates: the cost of an NB(chain) sweep on a stochastic volatility chain.

Measures, side by side in one run (one torch thread, CPU time per sweep through the public
``kernel.sample`` API, rounds interleaved, medians reported), on the log-volatility chain of
a simulated stochastic volatility series of ``T = 1000`` returns
(:func:`motifs.chain.stochastic_volatility_graph`, the shipped ``chain`` proposal):

* ``fused``: a pure neural block sweep (``gibbs_prob=0``) on the fused continuous path
  (:mod:`neuralblock.kernels.fused_continuous`), eager and (``--compile``) compiled;
* ``general``: the same sweep on the general path (``fused=False``);
* ``single``: the kernel's single-site sweep (``gibbs_prob=1``: random-walk MH on every state);
* ``baseline``: the general path on the commit before this work (``--baseline``, checked out
  into a temporary ``git worktree`` and timed in a subprocess);

each at ``K = 1`` and ``K = 64`` vectorized chains (cost per chain-sweep), with the torch op
dispatches per sweep and each arm's acceptance rate; and ``network_only``, the MDN's forward pass
alone on the rows of one ``K = 64`` sweep (the floor of any neural block sweep).

Run it from the repository root::

    python benchmarks/fused_chain.py            # full run (a few minutes)
    python benchmarks/fused_chain.py --quick    # smoke test: T = 200, short rounds, no compile, no baseline

It writes ``fused_chain.json`` and ``fused_chain.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
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

from motifs.chain import stochastic_volatility_graph  # noqa: E402
from neuralblock import NeuralBlockKernel, load_pretrained  # noqa: E402
from neuralblock.graph import FactorGraph  # noqa: E402

__all__ = ["main", "network_floor", "op_count", "sv_graph"]

BASELINE = "be6233a"  # the last commit before the fused continuous path
PHI, SIGMA, MU = 0.98, 0.15, -1.0

_BASELINE_SNIPPET = """
import sys, time, warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from fused_chain import sv_graph
from fused_blocks import sweep_seconds
from neuralblock import NeuralBlockKernel, load_pretrained
fg = sv_graph(int(sys.argv[2]))
for chains in (1, int(sys.argv[4])):
    kernel = NeuralBlockKernel(fg, [load_pretrained("chain")], gibbs_prob=0.0, chains=chains)
    kernel.setup(0)
    print(sweep_seconds(kernel, float(sys.argv[3])) / chains)
"""


def sv_graph(steps: int, seed: int = 0) -> FactorGraph:
    """The log-volatility chain of ``steps`` returns simulated from the SV model it describes.

    Example:
        >>> fg = sv_graph(20)
        >>> len(fg.latent)
        20
    """
    gen = torch.Generator().manual_seed(seed)
    h = torch.empty(steps)
    h[0] = MU + SIGMA / math.sqrt(1 - PHI * PHI) * torch.randn((), generator=gen)
    for t in range(1, steps):
        h[t] = MU + PHI * (h[t - 1] - MU) + SIGMA * torch.randn((), generator=gen)
    returns = torch.exp(h / 2) * torch.randn(steps, generator=gen)
    return stochastic_volatility_graph(returns, phi=PHI, sigma=SIGMA, mu=MU)


class _Count(TorchDispatchMode):
    """Counts aten op dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def op_count(kernel: Any) -> int:
    """Torch op dispatches of one ``kernel.sample`` call (a compiled graph counts as the kernels it launches).

    Example:
        >>> kernel = NeuralBlockKernel(sv_graph(20), [load_pretrained("chain")], gibbs_prob=0.0)
        >>> kernel.setup(0)
        >>> op_count(kernel) > 0
        True
    """
    params = kernel.sample(kernel.initial_params)
    with _Count() as counter:
        kernel.sample(params)
    return counter.count


def network_floor(proposal: Any, rows: int, budget: float) -> tuple[float, float]:
    """CPU seconds of the MDN's forward pass alone on ``rows`` feature rows, and its FLOPs (matmuls only).

    One pass per sweep is what every neural block proposal needs: the floor of a fused sweep.

    Example:
        >>> seconds, flops = network_floor(load_pretrained("chain"), 100, 0.01)
        >>> seconds > 0 and flops == 100 * 2 * (8 * 128 + 128 * 128 + 128 * (8 + 16 + 8))
        True
    """
    features = torch.randn(rows, proposal.mdn.in_features)
    linears = [m for m in proposal.mdn.modules() if isinstance(m, torch.nn.Linear)]
    flops = rows * 2 * sum(m.in_features * m.out_features for m in linears)
    with torch.no_grad():
        proposal(features)
        calls, start = 0, time.process_time()
        while calls < 2 or time.process_time() - start < budget:
            proposal(features)
            calls += 1
    return (time.process_time() - start) / calls, float(flops)


def _build(fg: FactorGraph, arm: str, chains: int) -> tuple[Any, float]:
    """A set-up kernel for an arm (``fused``, ``fused_compiled``, ``general``, ``single``) and its setup seconds."""
    options: dict[str, Any] = {
        "fused": {"gibbs_prob": 0.0},
        "fused_compiled": {"gibbs_prob": 0.0, "compile": True},
        "general": {"gibbs_prob": 0.0, "fused": False},
        "single": {"gibbs_prob": 1.0},
    }[arm]
    start = time.perf_counter()
    kernel = NeuralBlockKernel(fg, [load_pretrained("chain")], chains=chains, **options)
    kernel.setup(0)
    return kernel, time.perf_counter() - start


def _baseline_seconds(worktree: Path, steps: int, budget: float, chains: int) -> list[float]:
    """CPU seconds per chain-sweep of the general path on the baseline commit, at ``K = 1`` and ``K = chains``."""
    env = {**os.environ, "PYTHONPATH": str(worktree)}
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE_SNIPPET, here, str(steps), str(budget), str(chains)],
        cwd=worktree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(line) for line in out.stdout.strip().splitlines()[-2:]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every arm at ``K = 1`` and ``K = chains``: medians over interleaved rounds, op counts and ratios."""
    fg = sv_graph(args.steps)
    arms: dict[str, tuple[Any, float]] = {}
    kinds = ["fused", "general", "single"] + (["fused_compiled"] if args.compile else [])
    for kind in kinds:
        for chains in (1, args.chains):
            arms[f"{kind}_K{chains}"] = _build(fg, kind, chains)
    times: dict[str, list[float]] = {name: [] for name in arms}
    k = args.chains
    kernel = arms[f"fused_K{k}"][0]
    times[f"network_only_K{k}"] = []  # the MDN alone on one sweep's rows, timed in every round like the arms
    flops = 0.0
    if args.baseline:
        times.update({"baseline_K1": [], f"baseline_K{args.chains}": []})
    with baseline_worktree(args.baseline) as worktree:
        for _ in range(args.rounds):
            for name, (arm, _) in arms.items():
                times[name].append(sweep_seconds(arm, args.budget) / arm.chains)
            seconds, flops = network_floor(kernel.proposals[0], k * kernel.num_instances[0], args.budget)
            times[f"network_only_K{k}"].append(seconds / k)
            if worktree is not None:
                one, many = _baseline_seconds(worktree, args.steps, args.budget, args.chains)
                times["baseline_K1"].append(one)
                times[f"baseline_K{args.chains}"].append(many)
    median = {name: 1e3 * statistics.median(values) for name, values in times.items()}

    paired = functools.partial(paired_ratio, times)

    ratios: dict[str, float] = {}
    for chains in (1, k):
        ratios[f"general / fused, K={chains}"] = paired(f"general_K{chains}", f"fused_K{chains}")
        ratios[f"fused / single-site per chain-sweep, K={chains}"] = paired(f"fused_K{chains}", f"single_K{chains}")
        ratios[f"general / single-site per chain-sweep, K={chains}"] = paired(f"general_K{chains}", f"single_K{chains}")
        if args.compile:
            ratios[f"fused eager / fused compiled, K={chains}"] = paired(
                f"fused_K{chains}", f"fused_compiled_K{chains}"
            )
            ratios[f"general / fused compiled, K={chains}"] = paired(f"general_K{chains}", f"fused_compiled_K{chains}")
            ratios[f"fused compiled / single-site per chain-sweep, K={chains}"] = paired(
                f"fused_compiled_K{chains}", f"single_K{chains}"
            )
        if args.baseline:
            ratios[f"baseline / fused, K={chains}"] = paired(f"baseline_K{chains}", f"fused_K{chains}")
    ratios[f"fused K={k} / fused K=1 per chain-sweep"] = paired(f"fused_K{k}", "fused_K1")
    ratios[f"fused / network alone, K={k}"] = paired(f"fused_K{k}", f"network_only_K{k}")
    if args.compile:
        ratios[f"fused compiled / network alone, K={k}"] = paired(f"fused_compiled_K{k}", f"network_only_K{k}")
    return {
        "steps": args.steps,
        "instances": arms["fused_K1"][0].num_instances[0],
        "classes": len(arms["fused_K1"][0].fused[0].sizes),
        "per_chain_sweep_ms": median,
        "rounds_ms": {name: [1e3 * v for v in values] for name, values in times.items()},
        "setup_seconds": {name: seconds for name, (_, seconds) in arms.items()},
        "compile_seconds": {name: kernel.diagnostics()["compile_seconds"] for name, (kernel, _) in arms.items()},
        "ops_per_sweep": {name: op_count(kernel) for name, (kernel, _) in arms.items() if "compiled" not in name},
        "acceptance": {
            name: kernel.diagnostics()["acceptance_by_proposal"]["chain"]
            for name, (kernel, _) in arms.items()
            if not name.startswith("single")
        },
        "ratios": ratios,
        "network_mflop_per_chain_sweep": flops / k / 1e6,
        "network_gflops": flops / k / (median[f"network_only_K{k}"] / 1e3) / 1e9,
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Fused continuous block sweeps on a stochastic volatility chain",
        "",
        f"SV log-volatility chain of T = {result['steps']} (phi {PHI}, sigma {SIGMA}, mu {MU}; simulated returns), "
        f"shipped `chain` proposal, {result['instances']} instances in {result['classes']} colour classes. "
        f"CPU, 1 thread, load average {', '.join(f'{x:.2f}' for x in result['load_average'])}. Medians over "
        f"{result['rounds']} interleaved rounds of about {result['budget']} s CPU time each. `fused`/`general`: "
        "a pure neural block sweep (`gibbs_prob=0`); `single`: the kernel's single-site sweep (random-walk MH, "
        "`gibbs_prob=1`); `baseline`: the general path on the commit before this work; `network_only`: the MDN's "
        f"eager forward pass alone on the rows of one sweep ({result['network_mflop_per_chain_sweep']:.1f} MFLOP per "
        f"chain-sweep in its matmuls, run at {result['network_gflops']:.1f} GFLOP/s here), the arithmetic every "
        "neural block sweep does.",
        "",
    ]
    cells = {
        name: [
            f"{value:.4f}",
            cell(result["ops_per_sweep"].get(name)),
            cell(result["acceptance"].get(name), ".3f"),
            cell(result["setup_seconds"].get(name), ".2f"),
            cell(result["compile_seconds"].get(name), ".1f"),
        ]
        for name, value in result["per_chain_sweep_ms"].items()
    }
    headers = ["arm", "ms per chain-sweep", "ops per sweep", "acceptance", "setup s", "compile s"]
    lines += arm_lines(headers, cells)
    lines += ratio_lines(result["ratios"])
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run the comparison, write the JSON and markdown results and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="length T of the SV chain")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0, help="CPU seconds per arm and round")
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--baseline", default=BASELINE, help="commit to time the old general path on ('' to skip)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the compiled arms")
    parser.add_argument("--quick", action="store_true", help="smoke test: T = 200, short rounds, no compile/baseline")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message="NeuralBlockKernel with gibbs_prob=0 never updates")
    if args.quick:
        args.steps, args.rounds, args.budget, args.chains, args.compile, args.baseline = 200, 1, 0.05, 8, False, ""
    result = run(args)
    result.update(rounds=args.rounds, budget=args.budget, quick=args.quick, load_average=list(os.getloadavg()))
    write_results(args.out, "fused_chain", result, _markdown(result))
    return result


if __name__ == "__main__":
    main()
