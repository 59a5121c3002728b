"""Study: neural block MCMC (NB+Gibbs) vs single-site Gibbs on grids, in the same engine.

Instances: the 8 UAI Ising grids (shipped exact marginals), the three UAI 2008 grid
BNs (exact marginals we computed and ship), random grid BNs from the grid motif's
instantiation distribution, and *near-deterministic* random grid BNs from a generator the
proposal never saw in training (a fraction of CPT rows at 0.02/0.98, the others uniform;
:func:`near_deterministic_grid_bn`); exact marginals of random graphs are computed here with
the junction tree. For every instance and seed, each sampler runs inside ``pyro.infer.MCMC``
with the same number of vectorized chains (``--chains``) for the same time budget (CPU time
of the process by default, ``--clock wall`` for wall time); the mean absolute marginal error
of the chains' pooled draws is recorded against sweeps and seconds. Runs go through the run
harness (:func:`neuralblock.diagnostics.runs.timed_run`, counting with
:class:`~neuralblock.diagnostics.RunningMarginals`): 20 warmup sweeps and the
setup are timed apart, and the seconds count sampling only. Reported per instance: both final
errors at equal time, and the time NB+Gibbs needs to reach Gibbs's final error as a fraction
of Gibbs's time: the *first hit* (``first_time(..., for_good=False)``), the first checkpoint
at or below that error.

Replica-exchange arms (``--arms ... RE-Gibbs RE-NB``, issue 22):
:class:`~neuralblock.kernels.ReplicaExchange` with ``--replicas`` temperatures up to
``--max-temperature`` (the ladder adapted during warmup) and Gibbs or NB+Gibbs replicas with the
kernel's defaults (``gibbs_prob`` 0.1 unless ``--re-gibbs-prob``, one 2x2 tiling per neural sweep, neural
sweeps at every temperature, at ``T = 1`` only on models with softened zeros; NB replicas propose from
their tempered model, rows built at setup); ``--chains / --replicas``
ensembles, so every arm updates ``--chains`` states per sweep, and only the ``beta = 1``
replicas' draws are pooled. They report each arm's time to mean marginal error ``--level``
(0.05; reached *for good*: from that checkpoint on the error stays at or below it), and RE-NB
against RE-Gibbs paired over seeds.

Gradient-informed arms (``--arms ... GWG DMALA PAS``, issue 26): Gibbs-with-Gradients, discrete
Langevin with its MH correction, and the path auxiliary sampler, each with ``--chains`` chains. With a
neural-block arm beside them, a table gives every arm's median time to ``--level`` and says where each
neural-block arm is ahead of the best of them, and where it is more than 2x behind. Every run also
records its ESS per second: the median over variables of the multi-chain ESS of the variable's
first-value indicator, on draws thinned to at most ``2 x ESS_DRAWS`` per chain
(:meth:`~neuralblock.diagnostics.RunningMarginals.ess`, a lower bound that saturates near chains x kept
draws, marked ``>=``), over the sampling seconds.

Outputs (under ``--out``, in a folder named by a hash of the config): ``grid_study.json``,
``grid_study.md`` (table) and one PNG per instance. ``--merge`` pools finished runs of the same settings
on distinct seeds (e.g. a replication with ``--seed 5``) into one record and table (:func:`merge_records`).

Usage::

    python -m experiments.grid_study --quick      # CI scale: two small instances, 2 s per run
    python -m experiments.grid_study              # full run (about 30 minutes on 2 cores)
    python -m experiments.grid_study --arms Gibbs NB+Gibbs RE-Gibbs RE-NB --seeds 5 --seconds 60
    python -m experiments.grid_study --arms NB+Gibbs GWG DMALA PAS --chains 32 --clock cpu --seconds 8
    python -m experiments.grid_study --merge RUN_A/grid_study.json RUN_B/grid_study.json  # pool their seeds
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pyro
import torch
from tqdm import tqdm

from experiments.common import (
    add_choices,
    add_run_options,
    add_table,
    censored_median,
    parse_quick,
    study_parser,
)
from motifs.grid import grid_bn, random_grid_bn
from neuralblock import GibbsKernel, NeuralBlockKernel, ReplicaExchange, load_pretrained
from neuralblock.diagnostics import RunningMarginals, kept_draws
from neuralblock.diagnostics.plots import plot_error_traces
from neuralblock.diagnostics.runs import equal_time, error_at, first_time, study_folder, timed_run
from neuralblock.exact import marginals
from neuralblock.graph import FactorGraph
from neuralblock.io import erg_grid, read_erg, read_mar, read_uai, uai_grid
from neuralblock.kernels import GRADIENT_SAMPLERS
from neuralblock.kernels.base import GraphKernel
from neuralblock.proposals import NeuralBlockProposal
from neuralblock.subsample import student_t_sf

UAI = [f"Grids_{i}" for i in range(11, 19)]
STRONG = {"Grids_11", "Grids_12", "Grids_13", "Grids_14", "Grids_16", "Grids_17", "Grids_18"}  # f >= 5
ERG = ["90-10-1", "90-14-1", "90-16-1"]
RANDOM_SIZES = [10, 15, 20]
NEAR_DETERMINISTIC_SIZES = [10, 15, 20]
WARMUP = 20  # sweeps before the timed ones (lazy torch initialisation, caches)
GRADIENT_ARMS = GRADIENT_SAMPLERS
"""The gradient-informed samplers (issue 26): Gibbs-with-Gradients, discrete Langevin with MH, path auxiliary."""
ARMS = ["NB+Gibbs", "Gibbs", "RE-Gibbs", "RE-NB", *GRADIENT_ARMS]
ESS_DRAWS = 1000  # thinned draws kept per chain for the ESS (RunningMarginals.ess)
RE_WARMUP = 200  # replica exchange: warmup sweeps that adapt the ladder (timed apart, as the setup)


def near_deterministic_grid_bn(size: int, generator: torch.Generator, fraction: float = 0.5) -> FactorGraph:
    """A ``size x size`` grid BN (:func:`~motifs.grid.grid_bn`) whose CPT rows are near-deterministic with ``fraction``.

    A near-deterministic row puts 0.98 on a random value and 0.02 on the other; the rest are
    uniform on the simplex. Not the grid motif's training distribution (one-hot rows).

    Example:
        >>> near_deterministic_grid_bn(3, torch.Generator().manual_seed(0)).num_factors
        9
    """

    def p_one(rows: int) -> torch.Tensor:
        sharp = torch.rand(rows, generator=generator) < fraction
        high = torch.rand(rows, generator=generator) < 0.5
        return torch.where(sharp, torch.where(high, 0.98, 0.02), torch.rand(rows, generator=generator))

    return grid_bn(size, size, p_one)


def random_ising_grid(side: int, coupling: float, generator: torch.Generator) -> FactorGraph:
    """A ``side x side`` Ising torus like the UAI ``Grids`` (fields ``U[-1, 1]``, couplings ``U[-coupling, coupling]``).

    Fresh draws for checking defaults on grids no run was tuned on (the UAI instances are fixed).

    Raises:
        ValueError: ``side < 3`` (a smaller torus repeats its edges).
    Value 0 is spin -1; the log-potential of an edge is ``w s_i s_j`` and of a field ``h s_i``.

    Example:
        >>> fg = random_ising_grid(4, 5.0, torch.Generator().manual_seed(0))
        >>> fg.num_variables, fg.num_factors
        (16, 48)
    """
    if side < 3:
        raise ValueError(f"an Ising torus needs side >= 3, got {side}")
    edges = [[r * side + c, r * side + (c + 1) % side] for r in range(side) for c in range(side)]
    edges += [[r * side + c, ((r + 1) % side) * side + c] for r in range(side) for c in range(side)]
    spins = torch.tensor([-1.0, 1.0])
    weights = (2.0 * torch.rand(len(edges), generator=generator) - 1.0) * coupling
    fields = 2.0 * torch.rand(side * side, generator=generator) - 1.0
    fg = FactorGraph()
    fg.add_variables(side * side, cardinality=2)
    fg.add_table_factors(torch.tensor(edges), weights[:, None, None] * spins[:, None] * spins[None, :])
    fg.add_table_factors(torch.arange(side * side)[:, None], fields[:, None] * spins[None, :])
    return fg


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    quick = add_table(
        parser,
        """
        --seconds           30.0   2.0   sampling time per sampler and run (on --clock)
        --seeds             2      1
        --gibbs-prob        0.5    -
        --nd-fraction       0.5    -     near-deterministic CPT rows
        --chains            32     4     vectorized chains per sampler (the same for both)
        --checkpoints       120    -     log-spaced error checkpoints per run: the resolution of errors at equal time
        --replicas          8      -     replica exchange: temperatures per ensemble
        --max-temperature   10.0   -     replica exchange: hottest temperature
        --level             0.05   -     time-to-level tables (replica exchange, gradient samplers): time to this error
        """,
    )
    parser.add_argument("--random-sizes", type=int, nargs="*", default=RANDOM_SIZES)
    parser.add_argument("--nd-sizes", type=int, nargs="*", default=NEAR_DETERMINISTIC_SIZES)
    parser.add_argument(
        "--ising",
        nargs="*",
        default=[],
        metavar="SIDExCOUPLING",
        help="fresh Ising tori like the UAI Grids, e.g. 10x5 (held-out checks of defaults; drawn with --ising-seed)",
    )
    parser.add_argument("--ising-seed", type=int, default=3000, help="the generator seed of the --ising tori")
    parser.add_argument(
        "--re-gibbs-prob", type=float, default=None, help="RE-NB's single-site sweep probability (default: its own)"
    )
    parser.add_argument(
        "--re-warmup-neural",
        type=int,
        default=None,
        help="RE-NB's warmup_neural_replicas (default: its own; 0: None, the replicas that take them after warmup)",
    )
    parser.add_argument(
        "--re-tempered-tables",
        type=int,
        default=None,
        help="RE-NB's tempered_tables (default: its own; 0: None, powered rows for every initial temperature)",
    )
    add_choices(parser, clock=(["cpu", "wall"], "time budget and time axis"))
    parser.add_argument("--instances", nargs="*", default=None, help="subset of instance names")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=["NB+Gibbs", "Gibbs"], help="samplers to run")
    add_run_options(parser, "experiments/results/grid_study", "CI scale")
    parser.add_argument("--from-json", default=None, help="rewrite the table and plots of a finished run's JSON")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="pool the seeds of finished runs with the same settings (see merge_records; --instances: those to keep) "
        "into one table under --out",
    )
    args = parse_quick(parser, argv, {**quick, "random_sizes": [6], "nd_sizes": [6]})
    if args.quick:
        args.instances = args.instances or ["Grids_12", "90-10-1", "random-bn-6", "nd-bn-6"]
        args.replicas = min(args.replicas, 4)
    if args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    if any(arm.startswith("RE-") for arm in args.arms) and args.chains % args.replicas:
        parser.error(f"--chains ({args.chains}) must be a multiple of --replicas ({args.replicas})")
    return args


def make_kernel(label: str, fg: FactorGraph, proposal: NeuralBlockProposal, args: argparse.Namespace) -> GraphKernel:
    """The sampler of an arm: every arm updates ``args.chains`` states per sweep."""
    if label == "NB+Gibbs":
        return NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=args.gibbs_prob, chains=args.chains)
    if label == "Gibbs":
        return GibbsKernel(fg, chains=args.chains)
    if label in GRADIENT_ARMS:
        return GRADIENT_ARMS[label](fg, chains=args.chains)
    options: dict[str, float | int | None] = {} if args.re_gibbs_prob is None else {"gibbs_prob": args.re_gibbs_prob}
    if args.re_warmup_neural is not None and label == "RE-NB":
        options["warmup_neural_replicas"] = args.re_warmup_neural or None
    if args.re_tempered_tables is not None and label == "RE-NB":
        options["tempered_tables"] = args.re_tempered_tables or None
    return ReplicaExchange(
        fg,
        proposals=[proposal] if label == "RE-NB" else None,
        replicas=args.replicas,
        max_temperature=args.max_temperature,
        chains=args.chains // args.replicas,
        **options,
    )


def load_instances(args: argparse.Namespace) -> dict[str, tuple[FactorGraph, torch.Tensor, str]]:
    """name -> (graph, exact marginals, family)."""
    wanted = set(args.instances) if args.instances else None
    out: dict[str, tuple[FactorGraph, torch.Tensor, str]] = {}
    for name in UAI:
        if wanted is None or name in wanted:
            out[name] = (read_uai(uai_grid(name)), read_mar(uai_grid(name, "MAR")), "mrf")
    for name in ERG:
        if wanted is None or name in wanted:
            path = erg_grid(name)
            out[name] = (read_erg(path), read_mar(path.with_name(f"{name}.MAR")), "bn")
    for size in args.random_sizes:
        name = f"random-bn-{size}"
        if wanted is None or name in wanted:
            fg = random_grid_bn(size, size, torch.Generator().manual_seed(1000 + size))
            out[name] = (fg, marginals(fg)[0].to(torch.get_default_dtype()), "bn")
    for size in args.nd_sizes:
        name = f"nd-bn-{size}"
        if wanted is None or name in wanted:
            fg = near_deterministic_grid_bn(size, torch.Generator().manual_seed(2000 + size), args.nd_fraction)
            out[name] = (fg, marginals(fg)[0].to(torch.get_default_dtype()), "bn")
    for spec in args.ising:  # (one seed for all: a name is one graph in every run)
        side, coupling = spec.split("x")
        name = f"ising-{side}-c{coupling}" + ("" if args.ising_seed == 3000 else f"-s{args.ising_seed}")
        if wanted is None or name in wanted:
            fg = random_ising_grid(int(side), float(coupling), torch.Generator().manual_seed(args.ising_seed))
            out[name] = (fg, marginals(fg)[0].to(torch.get_default_dtype()), "mrf")
    return out


def mean_curve_fraction(runs: list[dict], ends: list[float], points: int = 200) -> float | None:
    """When the seed-mean NB+Gibbs error first reaches the seed-mean Gibbs error at the end, as a fraction of the end.

    Each seed's errors are read at the same times (a geometric grid up to the shortest common
    run time; :func:`~neuralblock.diagnostics.runs.error_at`), so the two means compare like with like.

    Example:
        >>> nb, gibbs = {"seconds": [0.1, 0.5], "errors": [0.3, 0.1]}, {"seconds": [2.0], "errors": [0.2]}
        >>> round(mean_curve_fraction([{"NB+Gibbs": nb, "Gibbs": gibbs}], [2.0], points=5), 2)  # grid 0.1 .. 2
        0.47
    """
    end = min(ends)
    start = min(min(r["NB+Gibbs"]["seconds"][0], r["Gibbs"]["seconds"][0]) for r in runs)
    grid = torch.logspace(math.log10(max(start, 1e-6)), math.log10(end), points).tolist()
    gibbs_final = sum(error_at(r["Gibbs"], end) for r in runs) / len(runs)
    for t in grid:
        if sum(error_at(r["NB+Gibbs"], t) for r in runs) / len(runs) <= gibbs_final:
            return t / end
    return None


def locking(traces: list[dict], ends: list[float]) -> tuple[float, float]:
    """How far single runs still move late, against how far seeds scatter: ``(drift, spread)``.

    ``drift`` is the largest, over runs, change of a run's error between a quarter of its time
    and its end; ``spread`` is the range of the runs' final errors. Drift far below spread means each chain
    is locked in the mode it fell into early, so seeds differ by which mode, not by speed.

    Example:
        >>> runs = [{"seconds": [1.0, 4.0], "errors": [0.30, 0.29]}, {"seconds": [1.0, 4.0], "errors": [0.6, 0.6]}]
        >>> [round(v, 2) for v in locking(runs, [4.0, 4.0])]
        [0.01, 0.31]
    """
    drift = max(abs(error_at(t, end) - error_at(t, end / 4)) for t, end in zip(traces, ends))
    finals = [error_at(t, end) for t, end in zip(traces, ends)]
    return drift, max(finals) - min(finals)


def write_outputs(record: dict, out: Path, seconds: float, seeds: int) -> str:
    """Summaries, markdown tables and plots (one per instance, every arm).

    The NB+Gibbs vs Gibbs table (when both ran) compares errors at equal time: both samplers run
    on the same budget of sampling time and stop at the sweep that reaches it, so each seed compares
    their last errors (:func:`~neuralblock.diagnostics.runs.equal_time`). Records from before the
    run harness (a calibrated number of sweeps, run times that differ) compare both errors at the
    shorter of the two run times. The replica-exchange table (when an RE arm ran) gives times to
    a fixed error.
    """
    arms = record["config"].get("arms", ["NB+Gibbs", "Gibbs"])
    clock = "CPU" if record["config"].get("clock", "wall") == "cpu" else "wall"
    for name, entry in record["instances"].items():
        plot_error_traces(
            {arm: [r[arm] for r in entry["runs"]] for arm in arms},
            out / f"{name}.png",
            title=f"{name}: {', '.join(arms)} ({seconds:g} s each)",
            time_label=f"{clock} time (s)",
        )
    parts = []
    if "NB+Gibbs" in arms and "Gibbs" in arms:
        parts.append(_nb_gibbs_table(record, seconds, seeds))
    if any(arm.startswith("RE-") for arm in arms):
        parts.append(replica_table(record, seconds, seeds))
    if any(arm in GRADIENT_ARMS for arm in arms) and any(arm in NB_ARMS for arm in arms):
        parts.append(gradient_table(record, seconds, seeds))
    table = "\n\n".join(parts)
    (out / "grid_study.json").write_text(json.dumps(record, indent=1))
    (out / "grid_study.md").write_text(f"# Neural blocks vs Gibbs on grids\n\n{table}\n")
    return table


def _nb_gibbs_table(record: dict, seconds: float, seeds: int) -> str:
    """NB+Gibbs against Gibbs at equal time (fills each instance's ``summary`` and the record's counts)."""
    summary_rows = []
    for name, entry in record["instances"].items():
        runs = entry["runs"]
        common = [equal_time([r["NB+Gibbs"], r["Gibbs"]], same_budget=_same_budget(r)) for r in runs]
        nb_errors = [error_at(r["NB+Gibbs"], t) for r, t in zip(runs, common)]
        gibbs_errors = [error_at(r["Gibbs"], t) for r, t in zip(runs, common)]
        nb, gibbs = sum(nb_errors) / len(runs), sum(gibbs_errors) / len(runs)
        gap, gap_se, p_value = paired_difference(nb_errors, gibbs_errors)
        fractions = [r["nb_time_to_gibbs_final_fraction"] for r in runs]
        reached = [f for f in fractions if f is not None]
        frac = max(reached) if len(reached) == len(fractions) else None
        mean_frac = mean_curve_fraction(runs, common)
        acc = sum(r["NB+Gibbs"]["diagnostics"]["acceptance_by_proposal"]["grid"] for r in runs) / len(runs)
        strong = name in STRONG or entry["family"] == "bn"
        nb_drift, nb_spread = locking([r["NB+Gibbs"] for r in runs], common)
        gibbs_drift, gibbs_spread = locking([r["Gibbs"] for r in runs], common)
        entry["summary"] = {
            "nb_final": nb,
            "gibbs_final": gibbs,
            "nb_wins": nb < gibbs,
            "difference": gap,
            "difference_se": gap_se,
            "difference_p_value": p_value,
            "worst_fraction": frac,
            "mean_curve_fraction": mean_frac,
            "strongly_coupled": strong,
            "late_drift": {"NB+Gibbs": nb_drift, "Gibbs": gibbs_drift},
            "seed_spread": {"NB+Gibbs": nb_spread, "Gibbs": gibbs_spread},
        }
        summary_rows.append(
            f"| {name} | {entry['num_variables']} | {'yes' if strong else 'no'} | {nb:.4f} | {gibbs:.4f} | "
            f"{'NB' if nb < gibbs else 'Gibbs'} | {_signed(gap, gap_se, p_value)} | {_fraction(mean_frac)} | "
            f"{_fraction(frac)} | {nb_drift:.3f} / {gibbs_drift:.3f} | {nb_spread:.2f} / {gibbs_spread:.2f} | "
            f"{acc:.3f} |"
        )
    named = {n: e["summary"] for n, e in record["instances"].items() if n in UAI or n in ERG}
    wins = sum(summary["nb_wins"] for summary in named.values())
    strong = {n: summary for n, summary in named.items() if summary["strongly_coupled"]}
    halved = sum(1 for summary in strong.values() if (summary["mean_curve_fraction"] or 2.0) <= 0.5)
    clear = {  # paired t-test over seeds, two-sided p < 0.05
        side: sum(1 for x in named.values() if significant(x["difference_p_value"]) and sign * x["difference"] > 0)
        for side, sign in (("NB", -1.0), ("Gibbs", 1.0))
    }
    table = "\n".join(
        [
            f"Equal {'CPU' if record['config'].get('clock', 'wall') == 'cpu' else 'wall'} time ({seconds:g} s per "
            f"sampler per seed, {seeds} seed(s), {record['config'].get('chains', 1)} vectorized chain(s) per sampler "
            "with pooled draws); errors are means "
            "over seeds. `NB time / Gibbs time` is the time at which NB+Gibbs reaches Gibbs's final error, "
            "as a fraction of Gibbs's time (`-`: not reached): on the seed-mean error curves, and for the "
            "worst seed. `NB - Gibbs` is the mean over seeds of each seed's error difference at equal time, "
            "+- its standard error over seeds, and the two-sided p-value of a paired t-test: where both samplers "
            "lock into modes, single seeds scatter widely. `late drift` is the largest change of a seed's error "
            "between a quarter of its time and its end, `seed spread` the range of the seeds' final errors "
            "(NB+Gibbs / Gibbs): drift far below spread means each chain stays in the mode it fell into early.",
            "",
            "| instance | vars | strongly coupled | NB+Gibbs error | Gibbs error | better | NB - Gibbs (+- SE) | "
            "NB time / Gibbs time (seed mean) | (worst seed) | late drift | seed spread | NB acceptance |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            *summary_rows,
            "",
            f"NB+Gibbs beats Gibbs at equal time on {wins} of the {len(named)} UAI and UAI-2008 instances run; "
            f"on {halved} of the {len(strong)} strongly coupled ones its seed-mean error reaches Gibbs's final "
            "error in at most half of Gibbs's time. At p < 0.05 (paired over seeds), NB+Gibbs is better on "
            f"{clear['NB']} and Gibbs on {clear['Gibbs']} of the {len(named)}; the others are within seed noise.",
        ]
    )
    locked = [n for n, x in named.items() if max(x["late_drift"].values()) * 5 < min(x["seed_spread"].values())]
    table += (
        f" On {len(locked)} of the {len(named)} both samplers' late drift is under a fifth of their seed spread: "
        "the rest of the run barely moves the errors, consistent with each chain staying in the modes it fell "
        "into early."
    )
    targets = {n: e["summary"] for n, e in record["instances"].items() if n in ERG or n.startswith("nd-bn-")}
    target_wins = [n for n, x in targets.items() if significant(x["difference_p_value"]) and x["difference"] < 0]
    gibbs_better = [n for n, x in named.items() if significant(x["difference_p_value"]) and x["difference"] > 0]
    table += (
        f"\n\nGrid BNs (UAI 2008 and near-deterministic random ones): NB+Gibbs is better at p < 0.05 on "
        f"{len(target_wins)} of {len(targets)} ({', '.join(target_wins) or 'none'}). Gibbs is better at p < 0.05 on "
        f"{len(gibbs_better)} of the {len(named)} UAI instances ({', '.join(gibbs_better) or 'none'})."
    )
    record["bn_instances_nb_better"] = target_wins
    record["uai_instances_gibbs_better"] = gibbs_better
    record["wins_on_uai_instances"] = wins
    record["mode_locked_instances"] = locked
    record["strong_instances_within_half_time"] = halved
    return table


def time_to_level(arm_run: dict, level: float) -> float | None:
    """Seconds (warmup and sampling) until the run's error stays at or below ``level`` (``None``: never)."""
    reach = first_time(arm_run, level, for_good=True)
    return None if reach is None else reach + arm_run["run"]["warmup_s"]


def significant(p_value: float | None) -> bool:
    """Two-sided p below 0.05 (``None``: no test, e.g. one seed)."""
    return p_value is not None and p_value < 0.05


def censored_pairs(
    runs: list[dict], first: list[float | None], second: list[float | None], arms: tuple[str, str]
) -> tuple[list[float], list[float]]:
    """Paired times to a level, both cut at the seed's common end (the shorter of the two runs).

    A run that never got there (``None``), or got there after the other run ended, counts as the common
    end, so a seed where neither got there in that time is a tie and a missed level is never credited
    with a run's own length.

    Example:
        >>> spans = {"a": {"warmup_s": 1.0, "sampling_s": 9.0}, "b": {"warmup_s": 0.0, "sampling_s": 9.0}}
        >>> runs = [{arm: {"run": span} for arm, span in spans.items()}]
        >>> censored_pairs(runs, [None], [None], ("a", "b")), censored_pairs(runs, [2.0], [None], ("a", "b"))
        (([9.0], [9.0]), ([2.0], [9.0]))
    """
    out_first, out_second = [], []
    for run, t_first, t_second in zip(runs, first, second):
        end = min(run[arm]["run"]["warmup_s"] + run[arm]["run"]["sampling_s"] for arm in arms)
        out_first.append(end if t_first is None else min(t_first, end))
        out_second.append(end if t_second is None else min(t_second, end))
    return out_first, out_second


def replica_table(record: dict, seconds: float, seeds: int) -> str:
    """Time to ``level`` of every arm, and RE-NB against RE-Gibbs paired over seeds (fills ``record``)."""
    cfg = record["config"]
    level, arms = cfg["level"], cfg["arms"]
    rows, reached_all, faster, slower, lower, higher = [], [], [], [], [], []
    for name, entry in record["instances"].items():
        runs = entry["runs"]
        times: dict[str, list[float | None]] = {arm: [time_to_level(r[arm], level) for r in runs] for arm in arms}
        cells = []
        for arm in arms:
            hit = [t for t in times[arm] if t is not None]
            final = sum(r[arm]["errors"][-1] for r in runs) / len(runs)
            median = sorted(hit)[(len(hit) - 1) // 2] if len(hit) == len(runs) else None
            cells.append(f"{final:.4f} / {_seconds(median)} ({len(hit)}/{len(runs)})")
        comparison, final_comparison = "- | -", "-"
        if "RE-NB" in arms and "RE-Gibbs" in arms:
            finals = [[r[a]["errors"][-1] for r in runs] for a in ("RE-NB", "RE-Gibbs")]
            final_gap, final_se, final_p = paired_difference(*finals)
            final_comparison = _signed(final_gap, final_se, final_p)
            if significant(final_p):
                (lower if final_gap < 0 else higher).append(name)
            nb, gibbs = censored_pairs(runs, times["RE-NB"], times["RE-Gibbs"], ("RE-NB", "RE-Gibbs"))
            gap, gap_se, p_value = paired_difference(nb, gibbs)
            comparison = _signed(gap, gap_se, p_value)
            censored = any(t is None for arm in ("RE-NB", "RE-Gibbs") for t in times[arm])  # (t-test: not valid)
            needed = None if censored else seeds_for_power(gap, gap_se, len(runs))
            comparison += f" | {'-' if needed is None else needed}"
            entry["replica_summary"] = {
                "re_nb_minus_re_gibbs_seconds": gap,
                "se": gap_se,
                "p_value": p_value,
                "seeds_for_power": needed,
                "final_error_difference": final_gap,
                "final_error_se": final_se,
                "final_error_p_value": final_p,
            }
            if significant(p_value):
                (faster if gap < 0 else slower).append(name)
        if "RE-NB" in arms and all(t is not None for t in times["RE-NB"]):
            reached_all.append(name)
        entry["times_to_level"] = times
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {comparison} | {final_comparison} |")
    named = [n for n in record["instances"] if n in UAI or n in ERG]  # the 11 UAI instances (targets of issue 22)
    others = [n for n in record["instances"] if n not in named]
    record["re_nb_reached_level"] = reached_all
    record["re_nb_faster_than_re_gibbs"] = faster
    record["re_nb_slower_than_re_gibbs"] = slower
    record["re_nb_lower_final_error"] = lower
    record["re_nb_higher_final_error"] = higher
    text = [
        f"## Replica exchange: time to mean marginal error {level:g}",
        "",
        f"{cfg['replicas']} temperatures up to {cfg['max_temperature']:g} (ladder adapted in {RE_WARMUP} warmup "
        f"sweeps), {cfg['chains'] // cfg['replicas']} ensembles per RE arm, {cfg['chains']} chains for the "
        f"others; {seconds:g} s of sampling per arm and seed, {seeds} seed(s). Each cell: seed-mean final error / "
        f"median {cfg.get('clock', 'wall')} seconds until the error stays at or below {level:g} (warmup included; "
        "`-` unless every seed got there) (seeds that got there). `RE-NB - RE-Gibbs`: mean paired difference of "
        "those times, both cut at the seed's common end (the shorter run; a run that never got there counts that "
        "end, so a seed where neither did is a tie), +- SE, paired t-test p; `final error`: the same for the "
        f"errors at the end of the equal sampling budget. `seeds for {POWER:.0%} power`: the seeds a paired t-test "
        f"needs to find the observed mean difference (either sign) at p < 0.05 with that power, were it the true one "
        "and the seeds' spread the true spread: a restatement of the observed t, not a forecast (`-`: one seed, no "
        "difference, a seed of either arm that never got there, or over 1000).",
        "",
        "| instance | " + " | ".join(arms) + f" | RE-NB - RE-Gibbs (s) | seeds for {POWER:.0%} power "
        "| final error RE-NB - RE-Gibbs |",
        "|---|" + "---|" * (len(arms) + 3),
        *rows,
        "",
        _replica_summary(named, "UAI instances", level, reached_all, faster, slower, lower, higher),
    ]
    if others:
        text += ["", _replica_summary(others, "other instances", level, reached_all, faster, slower, lower, higher)]
    return "\n".join(text)


def _replica_summary(names: list[str], kind: str, level: float, *lists: list[str]) -> str:
    """One sentence on RE-NB over ``names``: reached, faster, slower, lower and higher (each list filtered to them)."""
    reached, faster, slower, lower, higher = ([n for n in found if n in names] for found in lists)

    def listed(found: list[str]) -> str:
        return f"{len(found)} ({', '.join(found) or 'none'})"

    return (
        f"On the {len(names)} {kind} run, RE-NB reached {level:g} in every seed on {listed(reached)}; at p < 0.05 "
        f"it is faster than RE-Gibbs on {listed(faster)} and slower on {listed(slower)}. At equal sampling time its "
        f"final error is lower at p < 0.05 on {listed(lower)} and higher on {listed(higher)}."
    )


NB_ARMS = ("NB+Gibbs", "RE-NB")
POWER = 0.8
"""The power of the seeds-needed column of the replica-exchange table (:func:`seeds_for_power`)."""


def gradient_table(record: dict, seconds: float, seeds: int) -> str:
    """Neural blocks against the best gradient-informed sampler in time to ``level`` (fills ``record``).

    Per instance and arm: the median over seeds of the time until the error stays at or below the level
    (warmup included; a seed that never got there counts as later than every time, so the median is
    ``None`` when half the seeds or more never got there). The best gradient arm is the one with the
    least median (ties and all-``None``: the least seed-mean final error). A neural-block arm is *ahead*
    when its median is below the best's (a reached median against ``None`` included) and *more than 2x
    behind* when its median is over twice the best's (or ``None`` against a reached one).
    """
    cfg = record["config"]
    level, arms = cfg["level"], cfg["arms"]
    gradient = [arm for arm in arms if arm in GRADIENT_ARMS]
    blocks = [arm for arm in arms if arm in NB_ARMS]
    verdicts: dict[str, dict[str, list[str]]] = {arm: {"ahead": [], "behind_2x": []} for arm in blocks}
    rows = []
    for name, entry in record["instances"].items():
        runs = entry["runs"]
        medians = {arm: censored_median(time_to_level(r[arm], level) for r in runs) for arm in gradient + blocks}
        finals = {arm: sum(r[arm]["errors"][-1] for r in runs) / len(runs) for arm in gradient + blocks}
        best = min(gradient, key=lambda arm: (math.inf if medians[arm] is None else medians[arm], finals[arm]))
        cells = [
            f"{finals[arm]:.4f} / {_seconds(medians[arm])} / {_ess_rate(runs, arm, cfg)}" for arm in gradient + blocks
        ]
        marks = []
        for arm in blocks:
            mine, theirs = medians[arm], medians[best]
            ahead = mine is not None and (theirs is None or mine < theirs)
            behind = theirs is not None and (mine is None or mine > 2 * theirs)
            if ahead:
                verdicts[arm]["ahead"].append(name)
            if behind:
                verdicts[arm]["behind_2x"].append(name)
            marks.append("ahead" if ahead else "behind > 2x" if behind else "-")
        entry["gradient_summary"] = {"medians": medians, "best_gradient_arm": best}
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {best} | " + " | ".join(marks) + " |")
    record["gradient_comparison"] = verdicts
    uai = [n for n in record["instances"] if n in UAI or n in ERG]
    bns = [n for n in record["instances"] if n.startswith(("random-bn", "nd-bn")) or n in ERG]
    summary = []
    for arm in blocks:
        ahead, behind = verdicts[arm]["ahead"], verdicts[arm]["behind_2x"]
        summary.append(
            f"- {arm}: ahead of the best gradient sampler on {len([n for n in ahead if n in uai])} of the "
            f"{len(uai)} UAI instances run and on {len([n for n in ahead if n in bns])} of the {len(bns)} grid BNs "
            f"({', '.join(ahead) or 'none'}); more than 2x behind on {len(behind)} ({', '.join(behind) or 'none'})."
        )
    return "\n".join(
        [
            f"## Neural blocks vs gradient-informed samplers: time to mean marginal error {level:g}",
            "",
            f"{cfg['chains']} chains per arm, {seconds:g} s of sampling per arm and seed, {seeds} seed(s). Each "
            f"cell: seed-mean final error / median {cfg.get('clock', 'wall')} seconds until the error stays at or "
            f"below {level:g} (warmup included; `-`: half the seeds or more never got there) / median ESS per "
            "second over seeds (median over variables of the multi-chain ESS of the variable's first-value "
            "indicator, on thinned draws: a lower bound that saturates near chains x kept draws, marked `>=` where a "
            "seed reached half of that; `0`: no estimate; `?`: not recorded). `best`: the "
            "gradient sampler with the least median time (ties: least final error); the last columns compare each "
            "neural-block arm with it.",
            "",
            "| instance | " + " | ".join(gradient + blocks) + " | best | " + " | ".join(blocks) + " |",
            "|---|" + "---|" * (len(gradient) + 2 * len(blocks) + 1),
            *rows,
            "",
            *summary,
        ]
    )


def _ess_rate(runs: list[dict], arm: str, cfg: dict) -> str:
    """Median over seeds of an arm's ESS per second; ``>=`` where a seed's ESS reached half its cap.

    The thinned-draw ESS saturates near ``chains x kept draws`` (:meth:`RunningMarginals.ess_cap`;
    recomputed from the run's sweeps for records from before it was stored): there it is only a
    lower bound. ``?`` marks records from before the ESS was kept; ``0`` an arm with no estimate.
    """
    if any("ess_per_second" not in r[arm] for r in runs):
        return "?"
    rates = sorted(r[arm]["ess_per_second"] or 0.0 for r in runs)
    middle = len(rates) // 2
    rate = rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2
    chains = cfg["chains"] // cfg["replicas"] if arm.startswith("RE-") else cfg["chains"]
    caps = [r[arm].get("ess_cap") or chains * kept_draws(r[arm]["sweeps"][-1], ESS_DRAWS) for r in runs]
    saturated = any((r[arm]["ess"] or 0.0) >= 0.5 * cap for r, cap in zip(runs, caps))
    return f"{'>=' if saturated else ''}{rate:.3g}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _same_budget(run: dict) -> bool:
    """Both samplers of a seed stopped on the seconds budget (records before the run harness: calibrated sweeps)."""
    return all(run[label].get("run", {}).get("stopped") == "seconds" for label in ("NB+Gibbs", "Gibbs"))


def paired_difference(nb: list[float], gibbs: list[float]) -> tuple[float, float | None, float | None]:
    """Mean over seeds of the paired error differences ``nb - gibbs``, its standard error and t-test p-value.

    The p-value is two-sided, from Student's t with ``seeds - 1`` degrees of freedom; the standard
    error and p-value are ``None`` for one seed, the p-value also when all differences are equal.

    Example:
        >>> mean, se, p = paired_difference([0.1, 0.3, 0.2], [0.2, 0.6, 0.4])
        >>> round(mean, 3), round(se, 3), round(p, 3)
        (-0.2, 0.058, 0.074)
    """
    gaps = torch.tensor(nb, dtype=torch.float64) - torch.tensor(gibbs, dtype=torch.float64)
    if len(gaps) < 2:
        return float(gaps.mean()), None, None
    se = float(gaps.std() / math.sqrt(len(gaps)))
    p_value = 2 * student_t_sf(abs(float(gaps.mean())) / se, len(gaps) - 1) if se > 0 else None
    return float(gaps.mean()), se, p_value


def seeds_for_power(
    gap: float, se: float | None, seeds: int, power: float = POWER, alpha: float = 0.05, most: int = 1000
) -> int | None:
    """The seeds a two-sided paired t-test at ``alpha`` needs to detect a mean difference ``gap`` with ``power``.

    The observed spread over ``seeds`` seeds (``se * sqrt(seeds)``) is taken as the true one, and the power
    read from the noncentral t distribution. ``None`` without a difference or a spread, or beyond ``most``.

    Example:
        >>> seeds_for_power(-1.0, 0.2, 5), seeds_for_power(-0.1, 0.2, 5), seeds_for_power(0.0, 0.2, 5)
        (4, 159, None)
    """
    if se is None or not se > 0 or gap == 0:
        return None
    from scipy import stats  # (a dev dependency, as the studies')

    effect = abs(gap) / (se * math.sqrt(seeds))
    for count in range(2, most + 1):
        critical, shift = stats.t.ppf(1 - alpha / 2, count - 1), effect * math.sqrt(count)
        if stats.nct.sf(critical, count - 1, shift) + stats.nct.cdf(-critical, count - 1, shift) >= power:
            return count
    return None


def _signed(value: float, se: float | None, p_value: float | None) -> str:
    if se is None:
        return f"{value:+.3f}"
    return f"{value:+.3f} +- {se:.3f}" + ("" if p_value is None else f" (p {p_value:.2g})")


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


_POOLED = (
    "seed",
    "seeds",
    "seed_list",
    "instances",
    "ising",
    "from_json",
    "merge",
    "merged",
)  # may differ between pooled runs


def merge_records(records: list[dict], instances: list[str] | None = None, sources: list[str] | None = None) -> dict:
    """One record from finished runs of the same settings on distinct seeds: each instance with the runs of all of
    them (its seeds in order, each run tagged with its record's ``source`` where given).

    Every setting but the seeds and the instances must agree (the fresh Ising tori's generator seed too), no seed
    may repeat on an instance, and the runs must have the same instances, or ``instances`` names those to keep.

    Example:
        >>> run = lambda seed: {"seed": seed, "RE-NB": {}}
        >>> a = {"config": {"seconds": 60.0, "seed": 0, "seeds": 1},
        ...      "instances": {"G": {"family": "mrf", "num_variables": 4, "runs": [run(0)]}}}
        >>> b = {"config": {"seconds": 60.0, "seed": 5, "seeds": 1},
        ...      "instances": {"G": {"family": "mrf", "num_variables": 4, "runs": [run(5)]}}}
        >>> merged = merge_records([a, b], sources=["a.json", "b.json"])
        >>> [(r["seed"], r["source"]) for r in merged["instances"]["G"]["runs"]], merged["config"]["seed_list"]
        ([(0, 'a.json'), (5, 'b.json')], [0, 5])
    """
    if len(records) < 2:
        raise ValueError(f"merge needs at least two records, got {len(records)}")
    if sources is not None and len(sources) != len(records):
        raise ValueError(f"expected a source per record ({len(records)}), got {len(sources)}")
    first = records[0]["config"]
    for record in records[1:]:
        config = record["config"]
        keys = set(first) | set(config)
        differ = sorted(k for k in keys if k not in _POOLED and first.get(k) != config.get(k))
        if differ:
            raise ValueError(f"runs to merge differ in their settings: {', '.join(differ)}")
    names = list(records[0]["instances"]) if instances is None else list(instances)
    for record in records:
        missing = [name for name in names if name not in record["instances"]]
        extra = [name for name in record["instances"] if name not in names] if instances is None else []
        if missing or extra:
            raise ValueError(
                f"runs to merge have different instances (missing {missing}, extra {extra}): name those to keep"
            )
    pooled = {}
    for name in names:
        entries = [r["instances"][name] for r in records]
        if any(
            (e["family"], e["num_variables"]) != (entries[0]["family"], entries[0]["num_variables"]) for e in entries
        ):
            raise ValueError(f"instance {name} differs between the runs to merge")
        tagged = [
            run if sources is None else {**run, "source": sources[i]}
            for i, e in enumerate(entries)
            for run in e["runs"]
        ]
        runs = sorted(tagged, key=lambda run: run["seed"])
        seeds = [run["seed"] for run in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"instance {name}: a seed repeats between the runs to merge ({seeds})")
        pooled[name] = {"family": entries[0]["family"], "num_variables": entries[0]["num_variables"], "runs": runs}
    seed_list = sorted({run["seed"] for entry in pooled.values() for run in entry["runs"]})
    config = {**first, "instances": names, "seed": seed_list[0], "seeds": len(seed_list), "seed_list": seed_list}
    return {"config": config, "instances": pooled}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        record = json.loads(Path(args.from_json).read_text())
        cfg = record["config"]
        table = write_outputs(record, Path(args.from_json).parent, cfg["seconds"], cfg["seeds"])
        print(table)
        return record
    if args.merge:
        records = [json.loads(Path(path).read_text()) for path in args.merge]
        record = merge_records(records, args.instances, sources=list(args.merge))
        record["config"]["merged"] = list(args.merge)
        out = study_folder(args.out, record["config"])
        table = write_outputs(record, out, record["config"]["seconds"], record["config"]["seeds"])
        print(table)
        print(f"wrote {out}")
        return record
    torch.set_num_threads(args.threads)
    config = {k: v for k, v in sorted(vars(args).items()) if k not in ("out", "merge")}
    out = study_folder(args.out, config)
    proposals = {"mrf": load_pretrained("grid-mrf-2x2"), "bn": load_pretrained("grid-bn-2x2")}
    record: dict = {"config": config, "instances": {}}
    instances = load_instances(args)
    jobs = [(name, s) for name in instances for s in range(args.seeds)]
    for name, s in tqdm(jobs, desc="grid study"):
        fg, exact, family = instances[name]
        runs = record["instances"].setdefault(name, {"family": family, "num_variables": fg.num_variables, "runs": []})
        run = {"seed": args.seed + s}
        for label in args.arms:
            pyro.set_rng_seed(args.seed + s)
            kernel = make_kernel(label, fg, proposals[family], args)
            warmup = RE_WARMUP if label.startswith("RE-") else WARMUP
            counts = RunningMarginals(fg, exact, thin_to=ESS_DRAWS)
            timed = timed_run(
                kernel,
                observe=counts,
                error=counts.error,
                seconds=args.seconds,
                warmup=warmup,
                checkpoints=args.checkpoints,
                clock=args.clock,
            )
            ess = counts.ess()
            run[label] = {
                **timed.trace.as_dict(),
                "diagnostics": timed.diagnostics,
                "run": timed.summary(),
                "ess": ess,
                "ess_cap": counts.ess_cap(),
                "ess_per_second": None if ess is None else ess / timed.trace.seconds[-1],
            }
        if "NB+Gibbs" in run and "Gibbs" in run:
            gibbs_final = run["Gibbs"]["errors"][-1]
            reach = first_time(run["NB+Gibbs"], gibbs_final, for_good=False)
            run["nb_time_to_gibbs_final_fraction"] = None if reach is None else reach / run["Gibbs"]["seconds"][-1]
        runs["runs"].append(run)
    table = write_outputs(record, out, args.seconds, args.seeds)
    print(table)
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
