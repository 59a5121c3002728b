"""Pyro's MCMC loop around a kernel: the cost per step of reading the sites back and of Pyro's diagnostics records.

Two framework costs around a :class:`~neuralblock.GibbsKernel`, measured side by side in one run (interleaved
rounds, CPU time per step, one torch thread, medians over rounds):

* ``handed back`` vs ``sites read``: on Pyro models written with scalar sites (``benchmarks/pyro_models.py``'s
  10x10 ``pyro.factor`` Ising and its 3-state HMM, 50 steps), ``pyro.infer.MCMC`` hands ``sample()`` the sites
  it returned and the kernel keeps its state; with its record of what it returned cleared before each call, the
  kernel reads and checks every site (the path that a site changed by another sampler takes, and every step's path
  before this benchmark's commit);
* ``logging on`` vs ``logging off``: ``MCMC(..., disable_progbar=True)`` on the ``Grids_11`` factor graph with
  the ``pyro.infer.mcmc`` logger at Pyro's INFO level (one diagnostics record per step) and at WARNING.

Run it from the repository root::

    python benchmarks/mcmc_overhead.py           # full run (about a minute)
    python benchmarks/mcmc_overhead.py --quick   # smoke test: a few steps, one round

It writes ``mcmc_overhead.json`` and ``mcmc_overhead.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.infer import MCMC

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.pyro_models import EMIT, hmm, ising  # noqa: E402  (the models as users write them)
from neuralblock import GibbsKernel  # noqa: E402
from neuralblock.diagnostics.reports import markdown_table, write_json, write_report  # noqa: E402
from neuralblock.io import read_uai, uai_grid  # noqa: E402

__all__ = ["main", "mcmc_logging", "site_reads"]

COLUMNS = ["case", "arms", "us per step (first)", "us per step (second)", "second / first"]


def _cpu_seconds_per_step(run: Callable[[], None], steps: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / steps


def site_reads(model: Callable[..., None], args: tuple, steps: int, rounds: int) -> dict[str, list[float]]:
    """CPU seconds per ``sample()`` call with the returned sites handed back, and with every site read."""
    kernel = GibbsKernel(model)
    kernel.setup(0, *args)
    state = {"params": kernel.sample(kernel.initial_params)}

    def chain(read: bool) -> Callable[[], None]:
        def run() -> None:
            params = state["params"]
            for _ in range(steps):
                if read:
                    kernel._returned = None  # (the kernel forgets what it returned: it reads every site)
                params = kernel.sample(params)
            state["params"] = params

        return run

    times: dict[str, list[float]] = {"handed back": [], "sites read": []}
    for _ in range(rounds):
        for arm, read in (("handed back", False), ("sites read", True)):
            times[arm].append(_cpu_seconds_per_step(chain(read), steps))
    return times


def mcmc_logging(steps: int, rounds: int) -> dict[str, list[float]]:
    """CPU seconds per step of ``MCMC(GibbsKernel(Grids_11), disable_progbar=True)`` with and without INFO records."""
    fg = read_uai(uai_grid("Grids_11"))
    logger = logging.getLogger("pyro.infer.mcmc")
    level = logger.level
    times: dict[str, list[float]] = {"logging on": [], "logging off": []}

    def run() -> None:
        MCMC(GibbsKernel(fg), num_samples=steps, warmup_steps=0, disable_progbar=True).run()

    run()  # (the first run pays one-time costs)
    try:
        for _ in range(rounds):
            for arm, arm_level in (("logging on", logging.NOTSET), ("logging off", logging.WARNING)):
                logger.setLevel(arm_level)  # NOTSET: Pyro's "pyro" logger's INFO
                times[arm].append(_cpu_seconds_per_step(run, steps))
    finally:
        logger.setLevel(level)
    return times


def _row(case: str, times: dict[str, list[float]]) -> dict[str, Any]:
    (first, a), (second, b) = times.items()
    a_med, b_med = statistics.median(a), statistics.median(b)
    return {
        "case": case,
        "arms": f"{first} / {second}",
        "us per step (first)": 1e6 * a_med,
        "us per step (second)": 1e6 * b_med,
        "second / first": b_med / a_med,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per round and arm")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="a few steps, one round (a smoke test)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 20, 1
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    gen = torch.Generator().manual_seed(0)
    field = 0.3 * torch.randn(10, 10, generator=gen)
    tones = torch.bernoulli(EMIT[torch.randint(0, 3, (50,), generator=gen)], generator=gen)
    cases = {
        "Ising 10x10, 100 scalar sites": (ising, (10, 0.3, field)),
        "HMM K=3 T=50, 50 scalar sites": (hmm, (tones,)),
    }
    raw = {case: site_reads(model, model_args, args.steps, args.rounds) for case, (model, model_args) in cases.items()}
    raw["Grids_11 factor graph, MCMC"] = mcmc_logging(args.steps, args.rounds)
    rows = [_row(case, times) for case, times in raw.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "mcmc_overhead.json", {"config": {k: v for k, v in vars(args).items() if k != "out"}, "raw": raw})
    text = (
        "# Pyro's MCMC loop around a GibbsKernel: site reads and diagnostics records\n\n"
        f"CPU microseconds per step, one torch thread, medians of {args.rounds} interleaved rounds of {args.steps} "
        "steps. `handed back`: the sites `sample()` returned are passed back (what `pyro.infer.MCMC` does); "
        "`sites read`: the same, with the kernel made to read and check every site. `logging on / off`: "
        "the `pyro.infer.mcmc` logger at Pyro's INFO level or at WARNING, `disable_progbar=True`. Command: "
        "`python benchmarks/mcmc_overhead.py`.\n\n" + markdown_table(rows, COLUMNS, ".3g") + "\n"
    )
    write_report(out, "mcmc_overhead.md", text)
    return rows


if __name__ == "__main__":
    main()
