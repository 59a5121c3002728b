"""Replica exchange: the cost of a transition with Gibbs replicas and with neural block replicas.

Measures, side by side in one run (one torch thread, CPU time through the public ``kernel.sample`` API, each
measurement in a fresh subprocess, rounds interleaved, medians reported), on the UAI Ising grids ``Grids_12``
(10x10 torus) and ``Grids_16`` (20x20) and the UAI 2008 grid BNs ``90-14-1`` and ``90-16-1`` (14x14 and 16x16,
hard zeros: softened hot replicas, neural sweeps at ``T = 1`` only, in one compiled call with the swaps since the
commit after d72e0a9) with the settings of the replica-exchange grid study (16 temperatures
up to 10, 2 ensembles, 200 warmup transitions that adapt the ladder):

* ``gibbs`` / ``nb``: CPU seconds per transition after warmup of ``ReplicaExchange`` with Gibbs replicas and
  with ``grid-mrf-2x2`` (``grid-bn-2x2`` on the BN) neural replicas (the kernel's defaults: covers,
  ``gibbs_prob=0.1``, tempered proposals);
* ``start``: CPU seconds of ``setup`` and the first warmup transition together (the other replicas' starts and,
  since commit 2a285a0, the neural replicas' tempered proposal rows are made at setup; before, the first
  transition drew the starts);
* ``warmup``: CPU seconds per warmup transition after the first;
* ``first``: the first transition after warmup (until commit 2a285a0 the neural replicas built their tempered
  proposal rows there);
* the same arms on ``--baseline`` (checked out into a temporary ``git worktree``);
* ``nb one call`` / ``nb separate``: in one process, neural replicas after warmup in alternating blocks
  (``--blocks`` of ``--block-seconds`` each) with the one-call transition and with the separate calls it
  replaces; both make the same chain, so this times the call overhead alone, robust to the machine's load
  drifting between subprocesses.

Ratios printed: ``nb / gibbs`` per transition (current code), ``separate / one call, nb`` (median over the
block pairs) and ``baseline / current`` for each arm.

Run it from the repository root::

    python benchmarks/replica_cost.py            # full run (about 8 minutes)
    python benchmarks/replica_cost.py --quick    # smoke test: Grids_12, one round, no baseline

It writes ``replica_cost.json`` and ``replica_cost.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.fused_blocks import baseline_worktree, paired_ratio  # noqa: E402
from neuralblock.diagnostics.reports import markdown_table, write_json  # noqa: E402

__all__ = ["main", "transition_seconds"]

BASELINE = "d72e0a9"  # the last commit before the one-call transition of softened models (neural sweeps at T = 1)
ARMS = ("gibbs", "nb")

_SNIPPET = """
import json, sys, time, torch
torch.set_num_threads(1)
from neuralblock import ReplicaExchange, load_pretrained
from neuralblock.io import erg_grid, read_erg, read_uai, uai_grid
grid, arm, budget, warmup = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
bn = grid.startswith("90-")
fg = read_erg(erg_grid(grid)) if bn else read_uai(uai_grid(grid))
proposals = [load_pretrained("grid-bn-2x2" if bn else "grid-mrf-2x2")] if arm == "nb" else None
torch.manual_seed(0)
kernel = ReplicaExchange(fg, proposals=proposals, replicas=16, max_temperature=10.0, chains=2)
start = time.process_time()
kernel.setup(warmup)
params = kernel.sample(kernel.initial_params)
begun = time.process_time() - start
start = time.process_time()
for _ in range(warmup - 1):
    params = kernel.sample(params)
warm = (time.process_time() - start) / max(warmup - 1, 1)
start = time.process_time()
params = kernel.sample(params)
first = time.process_time() - start
steps, start = 0, time.process_time()
while time.process_time() - start < budget:
    params = kernel.sample(params)
    steps += 1
per_transition = (time.process_time() - start) / steps
print(json.dumps({"start": begun, "first": first, "warmup": warm, "per_transition": per_transition}))
"""


_TOGGLE_SNIPPET = """
import json, sys, time, torch
torch.set_num_threads(1)
from neuralblock import ReplicaExchange, load_pretrained
from neuralblock.io import erg_grid, read_erg, read_uai, uai_grid
grid, blocks, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
bn = grid.startswith("90-")
fg = read_erg(erg_grid(grid)) if bn else read_uai(uai_grid(grid))
torch.manual_seed(0)
kernel = ReplicaExchange(fg, [load_pretrained("grid-bn-2x2" if bn else "grid-mrf-2x2")], replicas=16,
                         max_temperature=10.0, chains=2)
kernel.setup(200)
params = kernel.initial_params
joined = kernel._one_call_sweep
for step in range(400):  # warmup, then transitions on both paths (each compiled before it is timed)
    kernel._one_call_sweep = (lambda *args: None) if 300 <= step < 350 else joined
    params = kernel.sample(params)
times = {"one call": [], "separate": []}
for _ in range(blocks):  # alternating blocks: slow drifts of the machine's load cancel in each pair's ratio
    for label in times:
        kernel._one_call_sweep = joined if label == "one call" else (lambda *args: None)
        steps, start = 0, time.process_time()
        while time.process_time() - start < seconds:
            params = kernel.sample(params)
            steps += 1
        times[label].append((time.process_time() - start) / steps)
print(json.dumps(times))
"""


def one_call_seconds(grid: str, blocks: int, seconds: float) -> dict[str, list[float]]:
    """CPU seconds per transition of neural replicas after warmup, in alternating blocks of ``seconds`` with the
    one-call transition and with the separate calls it replaces (the same chain: only the cost differs).

    Example:
        >>> out = one_call_seconds("Grids_12", blocks=1, seconds=0.05)
        >>> sorted(out), len(out["separate"])
        (['one call', 'separate'], 1)
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", _TOGGLE_SNIPPET, grid, str(blocks), str(seconds)]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def transition_seconds(tree: Path, grid: str, arm: str, budget: float, warmup: int = 200) -> dict[str, float]:
    """CPU seconds of ``arm``'s setup with its first transition, per warmup transition after it, of the first
    transition after warmup and per transition after that.

    Example:
        >>> out = transition_seconds(ROOT, "Grids_12", "gibbs", budget=0.2, warmup=4)
        >>> sorted(out), out["per_transition"] > 0
        (['first', 'per_transition', 'start', 'warmup'], True)
    """
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _SNIPPET, grid, arm, str(budget), str(warmup)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", nargs="+", default=["Grids_12", "Grids_16", "90-14-1", "90-16-1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=3.0, help="CPU seconds of transitions per measurement")
    parser.add_argument("--baseline", default=BASELINE, help="commit to time the same arms on ('' for none)")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks per path (one call / separate)")
    parser.add_argument("--block-seconds", type=float, default=0.3, help="CPU seconds per block")
    parser.add_argument("--quick", action="store_true", help="smoke test: Grids_12, one round, no baseline")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.grids, args.rounds, args.budget, args.baseline, args.blocks = ["Grids_12"], 1, 0.5, "", 2
    record: dict = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "grids": {}}
    rows = []
    with baseline_worktree(args.baseline, prefix="re-baseline-") as worktree:
        trees = {"": ROOT} if worktree is None else {"": ROOT, "baseline ": worktree}
        for grid in args.grids:
            times: dict[str, list[float]] = {}
            for _ in range(args.rounds):  # interleaved: machine load mostly cancels in each round's ratios
                for label, tree in trees.items():
                    for arm in ARMS:
                        found = transition_seconds(tree, grid, arm, args.budget)
                        times.setdefault(f"{label}{arm}", []).append(found["per_transition"])
                        times.setdefault(f"{label}{arm} warmup", []).append(found["warmup"])
                        times.setdefault(f"{label}{arm} first", []).append(found["first"])
                        times.setdefault(f"{label}{arm} start", []).append(found["start"])
            toggled = one_call_seconds(grid, args.blocks, args.block_seconds)
            times.update({f"nb {label}": values for label, values in toggled.items()})
            median = {key: statistics.median(values) for key, values in times.items()}
            ratios = {
                "nb / gibbs": paired_ratio(times, "nb", "gibbs"),
                "separate / one call, nb": paired_ratio(times, "nb separate", "nb one call"),
            }
            if worktree is not None:
                for arm in ARMS:
                    ratios[f"baseline / current, {arm}"] = paired_ratio(times, f"baseline {arm}", arm)
                    for part in ("warmup", "start", "first"):
                        ratios[f"baseline / current, {arm} {part}"] = paired_ratio(
                            times, f"baseline {arm} {part}", f"{arm} {part}"
                        )
                ratios["baseline nb / baseline gibbs"] = paired_ratio(times, "baseline nb", "baseline gibbs")
            record["grids"][grid] = {"seconds": times, "median": median, "ratios": ratios}
            once = ("first", "start")  # (seconds; the others milliseconds per transition)
            rows.append(
                {"grid": grid, **{f"{k} (ms)": 1e3 * v for k, v in median.items() if not k.endswith(once)},
                 **{f"{k} (s)": v for k, v in median.items() if k.endswith(once)}, **ratios}
            )  # fmt: skip
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = markdown_table(rows, columns, spec=".3g")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "replica_cost.json", record)
    header = (
        "# Replica exchange: CPU cost per transition\n\n"
        f"16 temperatures, 2 ensembles, 200 warmup transitions; median of {args.rounds} interleaved round(s) of "
        f"{args.budget:g} CPU s each, one thread; baseline: `{args.baseline or 'none'}`. `start`: setup and the "
        "first warmup transition; `warmup`: per warmup transition after it; `first`: the first transition after "
        "warmup (until 2a285a0 neural replicas built their tempered proposal rows there).\n\n"
    )
    (out / "replica_cost.md").write_text(header + table + "\n")
    print(table)
    return record


if __name__ == "__main__":
    main()
