"""Does ``torch.compile`` pay for the gradient-informed discrete kernels? Eager vs compiled proposals.

For each kernel (Gibbs-with-Gradients, PAS with random path lengths up to 8, DMALA) on the papers' model
families of ``experiments.gradient_baselines`` (10x10 ferromagnetic Ising, 50x10 RBM, 6x50 factorial HMM;
32 chains), measured side by side in one run (one torch thread, CPU time, through ``kernel.sample``):

* ``eager_ms`` / ``compiled_ms``: CPU milliseconds per transition once running (median of rounds,
  eager and compiled rounds interleaved);
* ``compile_s``: the compiled kernel's first transition (``diagnostics()["compile_seconds"]``);
* ``break_even_s``: the run length beyond which ``compile=True`` has made more transitions than eager.

Run it from the repository root::

    python benchmarks/gradient_compile.py            # full run (about a minute)
    python benchmarks/gradient_compile.py --quick    # smoke test: tiny models, short rounds

It writes ``gradient_compile.json`` and ``gradient_compile.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: experiments, motifs

from experiments import gradient_baselines as study  # noqa: E402
from neuralblock.diagnostics.reports import markdown_table  # noqa: E402
from neuralblock.kernels import DiscreteLangevin, GibbsWithGradients, PathAuxiliarySampler  # noqa: E402

KERNELS = {
    "GWG": lambda fg, chains, compile: GibbsWithGradients(fg, chains=chains, compile=compile),
    "PAS": lambda fg, chains, compile: PathAuxiliarySampler(
        fg, path_length=8, random_length=True, chains=chains, compile=compile
    ),
    "DMALA": lambda fg, chains, compile: DiscreteLangevin(fg, chains=chains, compile=compile),
}
COLUMNS = ["family", "kernel", "eager_ms", "compiled_ms", "speedup", "compile_s", "break_even_s"]


def seconds_per_transition(kernel: Any, params: dict, steps: int) -> tuple[float, dict]:
    """CPU seconds per ``kernel.sample`` call over ``steps`` calls, and the last parameters."""
    start = time.process_time()
    for _ in range(steps):
        params = kernel.sample(params)
    return (time.process_time() - start) / steps, params


def measure(family: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One (family, kernel) row: eager and compiled rounds interleaved after the compiled kernel's first call."""
    fg = study.build_family(family, study.parse_args(["--quick"] if args.quick else []), seed=0).fg
    kernels = {mode: KERNELS[name](fg, args.chains, mode == "compiled") for mode in ("eager", "compiled")}
    params = {}
    for mode, kernel in kernels.items():
        kernel.setup(0)
        params[mode] = kernel.sample(kernel.initial_params)  # the compiled kernel compiles here
    rounds: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for mode, kernel in kernels.items():
            cost, params[mode] = seconds_per_transition(kernel, params[mode], args.steps)
            rounds[mode].append(cost)
    eager, compiled = (statistics.median(rounds[m]) for m in ("eager", "compiled"))
    compile_s = kernels["compiled"].compile_seconds
    gain = eager - compiled
    return {
        "family": family,
        "kernel": name,
        "eager_ms": 1e3 * eager,
        "compiled_ms": 1e3 * compiled,
        "speedup": eager / compiled,
        "compile_s": compile_s,
        "break_even_s": compile_s * eager / gain if gain > 0 else None,  # eager time at which compiled catches up
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["ising-ferro", "rbm", "fhmm"])
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="transitions per round")
    parser.add_argument("--quick", action="store_true", help="tiny models and rounds (a smoke test)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.families, args.chains, args.rounds, args.steps = ["ising-ferro"], 4, 2, 5
    torch.set_num_threads(1)
    rows = [measure(family, name, args) for family in args.families for name in KERNELS]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradient_compile.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
    text = (
        "# torch.compile for the gradient-informed discrete kernels (issue 26)\n\n"
        f"{args.chains} chains, one torch thread, CPU time per transition (median of {args.rounds} interleaved "
        f"rounds of {args.steps}); `compile_s`: the compiled kernel's first transition; `break_even_s`: the "
        "eager run length after which `compile=True` has made more transitions. Command: "
        "`python benchmarks/gradient_compile.py`.\n\n" + markdown_table(rows, COLUMNS, ".3g") + "\n"
    )
    (out / "gradient_compile.md").write_text(text)
    print(text)
    return rows


if __name__ == "__main__":
    main()
