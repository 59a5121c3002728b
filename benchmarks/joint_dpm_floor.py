"""The JointDPM flagship's arithmetic floor: the least time austerity experts could need against exact MH (issue 21).

Every cycle of the JointDPM study (``experiments/joint_dpm.py``) runs the same ``z`` sweep in both arms;
only the experts' ``w`` updates differ. So even experts that cost nothing leave austerity's cycle at
``z / (z + w_exact)`` of exact MH's, and the flagship's target (austerity reaches exact MH's final test
accuracy in at most 1/5 of its time) is out of reach for *any* implementation when that floor exceeds 1/5.
This script computes the floor from the arithmetic each cycle must do, with the study's own settings and
cluster counts (read from a committed study run), in two ways:

* **unit count** (no timing): a ``z`` update scores every cluster and auxiliary cluster, and each score
  needs at least the expert's log-likelihood of the point, the unit of ``w`` work; exact MH's ``w`` updates
  evaluate every point's log-likelihood once per transition (the current state's terms are cached). So
  ``z >= (points updated) x (clusters + aux)`` units and ``w = (w updates) x N`` units;
* **timed arithmetic**: the same work as a few large vectorized torch calls (one thread, float32, no
  Python per point or per transition): the ``z`` scores of all updated points against all clusters
  (collapsed Gaussian term, expert log-likelihood, the draw by inverse CDF) and each exact transition's
  log-likelihoods (one call each), each at its best of ``--repeats``; austerity's ``w`` work at its
  measured data fraction.

Both ignore everything a real sampler adds (the sequential ``z`` loop, proposals, tests), which only
raises the floor, and count per cycle: a bound on the time ratio because austerity needs at least as many cycles as
exact MH (a noisier version of its chain; in the committed run exact MH passes at cycle 11-12, austerity at 11-22).

Run it from the repository root::

    python benchmarks/joint_dpm_floor.py
    python benchmarks/joint_dpm_floor.py --study experiments/results/joint_dpm/<hash>/joint_dpm.json

It writes ``joint_dpm_floor.json`` and ``joint_dpm_floor.md`` into ``--out`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STUDY = ROOT / "experiments" / "results" / "joint_dpm" / "91ba6cc2ae" / "joint_dpm.json"
TARGET = 0.2


def _best_seconds(fn: Any, repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one untimed call (the floor of a compute-bound call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def z_arithmetic(points: int, clusters: int, aux: int, dim: int, generator: torch.Generator) -> Any:
    """One ``z`` sweep's scoring as vectorized calls: ``points`` against ``clusters`` existing and ``aux`` new ones.

    Example:
        >>> sweep = z_arithmetic(10, 4, 3, 2, torch.Generator().manual_seed(0))
        >>> sweep().shape
        torch.Size([10])
    """
    x1 = torch.randn(points, dim + 1, generator=generator)
    sign = torch.randn(points, generator=generator).sign()
    features = torch.randn(points, dim + 2, generator=generator)
    terms = torch.randn(clusters, dim + 2, generator=generator)
    experts = torch.randn(clusters, dim + 1, generator=generator)
    prior_term = torch.randn(points, 1, generator=generator)

    def sweep() -> torch.Tensor:
        gaussian = features @ terms.T  # collapsed input density of every existing cluster
        expert = torch.nn.functional.logsigmoid(sign[:, None] * (x1 @ experts.T))
        aux_w = torch.randn(points, aux, dim + 1, generator=generator)  # the auxiliary clusters' experts
        aux_expert = torch.nn.functional.logsigmoid(sign[:, None] * torch.einsum("nad,nd->na", aux_w, x1))
        scores = torch.cat([gaussian + expert, prior_term + aux_expert], 1)
        # the draw by inverse CDF: one uniform per point (cheaper than a Gumbel per cluster)
        weights = torch.exp(scores - scores.amax(1, keepdim=True)).cumsum(1)
        u = torch.rand(points, 1, generator=generator) * weights[:, -1:]
        return torch.searchsorted(weights, u).squeeze(1)

    return sweep


def w_arithmetic(points: int, transitions: int, dim: int, generator: torch.Generator) -> Any:
    """Exact MH's ``w`` work of one cycle: each of ``transitions`` proposals evaluated on all ``points``.

    Example:
        >>> updates = w_arithmetic(100, 10, 2, torch.Generator().manual_seed(0))
        >>> updates().shape
        torch.Size([10])
    """
    x1 = torch.randn(points, dim + 1, generator=generator)
    sign = torch.randn(points, generator=generator).sign()
    proposals = torch.randn(transitions, dim + 1, generator=generator)

    def updates() -> torch.Tensor:  # one call per transition: each proposal depends on the last decision
        return torch.stack([torch.nn.functional.logsigmoid(sign * (x1 @ w)).sum() for w in proposals])

    return updates


def study_settings(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per seed of a JointDPM study record: its settings, exact MH's mean cluster count up to its first passage,
    austerity's smallest measured data fraction per ``w`` update and exact MH's measured ``z`` share."""
    config = study["config"]
    rows = []
    for seed in study["seeds"]:
        exact = seed["runs"]["exact MH"]
        passage = seed["exact_seconds_to_final_accuracy"]
        records = [r for r in exact["records"] if passage is None or r["seconds"] <= passage]
        austerity = [run for label, run in seed["runs"].items() if label != "exact MH"]
        rows.append(
            {
                "seed": seed["seed"],
                "n": config["n_train"],
                "dim": config["dim"],
                "aux": config["aux"],
                "w_updates": config["w_updates"],
                "points_updated": max(1, round(config["z_fraction"] * config["n_train"])),
                "clusters": statistics.mean(r["clusters"] for r in records),
                "exact_cycles_to_passage": len(records),
                "austerity_data_fraction": min(run["data_fraction_per_w_update"] for run in austerity),
                "exact_z_share": exact["time_split"]["z"],
            }
        )
    return rows


def floors(row: dict[str, Any], repeats: int, generator: torch.Generator) -> dict[str, float]:
    """The unit-count and timed floors of austerity's cycle over exact MH's for one seed's settings."""
    clusters = round(row["clusters"])
    z_units = row["points_updated"] * (clusters + row["aux"])
    w_units = row["w_updates"] * row["n"]
    z_seconds = _best_seconds(z_arithmetic(row["points_updated"], clusters, row["aux"], row["dim"], generator), repeats)
    w_seconds = _best_seconds(w_arithmetic(row["n"], row["w_updates"], row["dim"], generator), repeats)
    fraction = row["austerity_data_fraction"]
    return {
        "z_units": z_units,
        "w_units": w_units,
        "floor_units": z_units / (z_units + w_units),
        "z_ms": 1000 * z_seconds,
        "w_exact_ms": 1000 * w_seconds,
        "ns_per_z_pair": 1e9 * z_seconds / z_units,
        "ns_per_w_point": 1e9 * w_seconds / w_units,
        "floor_free_experts": z_seconds / (z_seconds + w_seconds),
        "floor_at_data_fraction": (z_seconds + fraction * w_seconds) / (z_seconds + w_seconds),
    }


def write_outputs(out: Path, record: dict[str, Any]) -> None:
    """``joint_dpm_floor.json`` and a markdown table beside it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "joint_dpm_floor.json").write_text(json.dumps(record, indent=2))
    lines = [
        "# JointDPM flagship: the arithmetic floor of austerity's time over exact MH's",
        "",
        f"Study record: `{record['study']}`; torch {record['torch']}, one thread, best of {record['repeats']}.",
        "",
        "| seed | clusters (mean, to exact's first passage) | z units / cycle | exact w units / cycle | floor (units) "
        "| ns / z pair | ns / w point | floor (timed, free experts) | floor (timed, austerity's data fraction) "
        "| exact MH's measured z share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["seeds"]:
        lines.append(
            f"| {row['seed']} | {row['clusters']:.1f} | {row['z_units']} | {row['w_units']} | {row['floor_units']:.3f} "
            f"| {row['ns_per_z_pair']:.1f} | {row['ns_per_w_point']:.1f} | {row['floor_free_experts']:.3f} "
            f"| {row['floor_at_data_fraction']:.3f} | {row['exact_z_share']:.3f} |"
        )
    lines += [
        "",
        f"Target: austerity's time <= {TARGET} of exact MH's. Smallest floor over seeds: "
        f"{record['smallest_floor']:.3f} (unit count {record['smallest_floor_units']:.3f}); "
        f"reachable by some implementation of the experts: {record['reachable']}.",
    ]
    (out / "joint_dpm_floor.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Compute the floors for every seed of ``--study`` and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, default=DEFAULT_STUDY, help="a joint_dpm.json study record")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per measurement (best is kept)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    study = json.loads(args.study.read_text())
    seeds = [{**row, **floors(row, args.repeats, generator)} for row in study_settings(study)]
    smallest = min(row["floor_free_experts"] for row in seeds)
    record = {
        "study": str(args.study.resolve().relative_to(ROOT))
        if args.study.resolve().is_relative_to(ROOT)
        else str(args.study),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "seeds": seeds,
        "smallest_floor": smallest,
        "smallest_floor_units": min(row["floor_units"] for row in seeds),
        "reachable": smallest <= TARGET,
    }
    write_outputs(args.out, record)
    print((args.out / "joint_dpm_floor.md").read_text())
    return record


if __name__ == "__main__":
    main()
