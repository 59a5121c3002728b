"""Open-universe GMMs at scale: NB(set) + Gibbs vs split-merge + Gibbs vs NB(old) + Gibbs vs Gibbs (issue #27).

For every size ``m`` (candidate mixtures) in ``--mixtures`` and ``n`` (points) in ``--points``, a few
case families (:func:`experiments.gmm_models.family_gmm`, held-out generator seeds from 70 000 on) are
drawn: ``model`` (the model's own generator), ``unequal`` (about m/3 clusters of unequal sizes),
``overlap`` (pairs of clusters 2.5 sigma apart) and ``scaled`` (``unequal`` at sigma 3, tau 15). By
default each (m, n) cell runs ``--families-per-cell 2`` families, chosen by rotation so that every
family appears at every m and every n (:func:`cell_families`); ``--families`` runs the named ones in
every cell. Four arms run on every case, each one kernel of ``--chains K`` vectorized chains from
the same K starts, for the same sampling time (``--clock cpu`` by default):

* ``NB(set) + Gibbs``: :class:`~neuralblock.NeuralBlockKernel` with ``--proposal`` (``gmm_pair_copies16``, since
  session 62; ``gmm_pair_copies`` or the first set-encoder proposal, ``gmm_pair_set``, can take either NB arm);
* ``split-merge + Gibbs``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM`;
* ``NB(old) + Gibbs``: :class:`~neuralblock.NeuralBlockKernel` with ``--old-proposal`` (``gmm_pair``);
* ``Gibbs only``: the single-site sweep every arm mixes in, copy-set moves and label steps included, and nothing else
  (:class:`~neuralblock.kernels.split_merge.SplitMergeGMM` at ``gibbs_prob=1``): the baseline that tells
  how much of an arm's speed its own moves give.

The budget of a run is ``--seconds * max(1, m n / (16 * 240)) ** 0.5``, at most ``--max-seconds``. Each
arm but ``Gibbs only`` takes a single-site sweep with probability ``--gibbs-prob`` (0.5; which transitions: the
kernels' ``schedule`` by ``--schedule``: in turn with the moves at every size by default since session 66, in turn
under 500 points and at random above in sessions 63-65 (``auto``), at random before), or, with
``--gibbs-share S``, mixes its moves with single-site sweeps so that those take share S of its time (each
kernel's ``gibbs_share``: a move can cost from one to fifty single-site sweeps). The share's calibration (two
sweeps of each kind) runs at the kernel's setup, outside the sampling time, and its cost is recorded per run
(``setup_seconds``: up to about 1.3 s for split-merge at m n = 16 x 240). Records without
``share_calibration: setup`` in their config (the runs before session 36) timed it in the first transition,
where it was often most of an arm's time to the level: their share runs' time ratios compare those costs.
Per case and arm, with every chain counted as a run:

* the robust level: split-merge's lower median over its chains of the mean log joint over the last
  quarter of the run, minus 2 nats; each chain's first time at it
  (:func:`~experiments.gmm_models.first_time_above`), their censored lower median
  (:func:`~experiments.gmm_study.censored_lower_median`), the ratio of each arm's to
  split-merge's (below 1: the arm is faster) and how many chains reach it;
* the posterior of M: each chain's histogram of M over the second half of its run, the arm's pooled
  posterior (chains weighted equally) and its mode, against the true M and split-merge's mode;
* stuck chains: one M over the whole second half where split-merge's posterior gives that M < 0.5;
* the same two allowing for split-merge's between-chain spread (:func:`spread_metrics`): a chain's mode
  counts when split-merge's chains cannot rank it below their mode, and a chain is stuck only where its M's
  probability lies under 0.5 by more than their spread;
* the in-kernel acceptance (NB: the proposal's; split-merge: per move) and the fraction of
  transitions that change M.

Per size (m >= 12 for the issue's targets), the mode target also gets its chance of a miss for a sampler as
good as split-merge (:func:`exchangeable_miss_probability`; where the posterior of M is flat a chain's own mode
is nearly a draw, and a copy of split-merge misses the target at some sizes by chance) and a one-sided Fisher
exact test of NB(set) having fewer chains at the mode (:func:`fewer_hits_p_value`).

Split-merge's posterior of M (the reference of the mode and stuck metrics) comes from longer runs of its
own, independent of every arm (``--reference-start fresh``, the default): ``--chains`` new split-merge chains
from fresh starts (another generator seed) run for ``1 + --reference-factor`` budgets, and the posterior pools
each chain's histogram over the second half of its run (:func:`reference_posterior`). At equal time
split-merge's own short chains do not mix between M at the larger sizes, and a mode read from them both misses
the posterior's and favours the arm it came from. Until session 42 the reference chains were the split-merge
arm's own, continued from its last states for ``--reference-factor`` budgets more
(``--reference-start continued``): a chain that sat at one M went on from there, so the reference still leaned
towards split-merge's chains (on seed 7, six n = 60 cases, NB's chains were at the mode of long pooled runs 22
times of 30 and split-merge's 12, while against split-merge's own mode the counts were 12 and 23:
``experiments/gmm_scale_reference.py``). Both metrics are also reported against split-merge's short-run
posterior (``--reference-factor 0`` makes that the reference).

Outputs in ``--out/<config hash>/``: ``gmm_scale.json`` (everything, traces included),
``gmm_scale.md`` (a row per case and arm, a summary per case and per size) and the plots
``gmm_scale_logjoint.png`` and ``gmm_scale_active.png`` (the metrics read every transition; the JSON and the
plots keep ``--trace-points`` records per run, :func:`thin_run`). ``--workers W`` runs the cases in W spawned
processes (``--threads`` each), each of which loads its compiled loops before any clock (:func:`warm_up`); the
record does not depend on W (up to timing noise).

Usage::

    python -m experiments.gmm_scale --quick
    python -m experiments.gmm_scale --workers 2
    python -m experiments.gmm_scale --workers 2 --old-proposal gmm_pair_copies --seed 38  # the two copies proposals
    python -m experiments.gmm_scale --mixtures 16 20 --points 240 --families unequal overlap --seconds 10
    python -m experiments.gmm_scale --workers 2 --reference-factor 0  # split-merge's short runs as the reference
    python -m experiments.gmm_scale --workers 2 --reference-start continued  # the arm's chains continued (< session 42)
    python -m experiments.gmm_scale --rescore experiments/results/gmm_scale/5aa8920ed9  # today's metrics
    python -m experiments.gmm_scale --workers 2 --gibbs-share 0.5  # half of every arm's time in single-site sweeps
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import motifs
from experiments.common import add_choices, add_run_options, lower_median, open_study, pyplot
from experiments.gmm_models import (
    GMM_FAMILIES,
    chain_traces,
    family_gmm,
    first_time_above,
    run_sampler,
)
from experiments.gmm_study import SM, acceptance_summary, censored_lower_median
from motifs.gmm_pair import GmmPairMotif, gmm_graph
from neuralblock import NeuralBlockKernel
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json, write_report
from neuralblock.graph import FactorGraph
from neuralblock.kernels.base import GraphKernel, sequential_init
from neuralblock.kernels.split_merge import SplitMergeGMM
from neuralblock.proposals import NeuralBlockProposal, load_proposal

NB_SET, NB_OLD, GIBBS = "NB(set) + Gibbs", "NB(old) + Gibbs", "Gibbs only"
ARMS = (NB_SET, SM, NB_OLD, GIBBS)
COLORS = {NB_SET: "tab:blue", SM: "tab:orange", NB_OLD: "tab:green", GIBBS: "tab:gray"}
SHORT_NAMES = {SM: "SM", NB_SET: "set", NB_OLD: "old", GIBBS: "Gibbs"}
"""The arms in the report's per-arm columns, in this order (records before the Gibbs arm have three)."""
RATIO_NAMES = {SM: "SM", NB_SET: "NB(set)", NB_OLD: "NB(old)", GIBBS: "Gibbs"}
"""An arm's name in the time-ratio columns and the report's title."""
TARGET_MIXTURES = 12
"""The issue's targets hold at the sizes with at least this many mixtures."""
TIME_TARGET = 0.5
"""NB's most time to split-merge's level at those sizes, as a share of split-merge's time."""
LEVEL_MARGIN = 2.0
"""Nats below split-merge's last-quarter mean log joint that the robust level sits."""
TIE_SE = 2.0
"""Standard errors within which split-merge's chains cannot rank an M below their mode (:func:`chain_spread`)."""
REFERENCE_SIZE = 16 * 240
"""``m * n`` up to which a run gets ``--seconds``; larger cells get more, as the square root of ``m n``."""
TIME_DIGITS = 6
"""Decimals of the seconds kept in a stored trace (microseconds: the metrics are computed before, from every record)."""
LOG_DIGITS = 2
"""Decimals of the log joints and likelihoods in a stored trace (the metrics are computed before, from every record)."""
FRESH_SEED_OFFSET = 500_000
"""Split-merge's fresh reference chains start from the case's seed plus this (the arms' starts: the seed itself)."""
ALTERNATE_BELOW = 500
"""``--schedule auto`` (the default of sessions 63-65): every arm's single-site sweeps alternate with its moves on
models of fewer points than this and come at random above (session 63: NB's time to the level alternating over its
time at random was 0.75-0.84 at n = 60-240 on fresh seeds 41 and 43 and 0.94-1.12 at n = 1000 on seeds 41-43 and 45,
before the label steps; session 66, with them: 0.63 and 0.77 at n = 1000 on fresh seeds 66 and 67, so the default
alternates at every size)."""


# ------------------------------------------------------------------------------ options
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (see the module docstring); ``--quick`` sets CI-scale defaults (given options win).

    Example:
        >>> args = parse_args(["--quick", "--mixtures", "8"])
        >>> args.mixtures, args.points, args.chains, args.seconds
        ([8], [60], 2, 1.0)
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--proposal", default="gmm_pair_copies16", help="the new proposal: shipped name or file path")
    parser.add_argument("--old-proposal", default="gmm_pair", help="the old proposal: shipped name or file path")
    parser.add_argument("--mixtures", type=int, nargs="+", default=[8, 12, 16, 20, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[60, 240, 1000])
    parser.add_argument("--families", nargs="+", choices=GMM_FAMILIES, default=None, help="run these in every cell")
    parser.add_argument("--families-per-cell", type=int, default=2, help="families per cell, by rotation")
    parser.add_argument("--chains", type=int, default=5, help="vectorized chains per run (every arm, same starts)")
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling time per run up to m n = 16 * 240")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="the most sampling time of any run")
    parser.add_argument("--gibbs-prob", type=float, default=0.5)
    parser.add_argument(
        "--gibbs-share", type=float, default=0.0,
        help="every arm's share of time in single-site sweeps (each kernel's gibbs_share); 0: --gibbs-prob (default)",
    )  # fmt: skip
    parser.add_argument(
        "--reference-factor", type=float, default=2.0,
        help="split-merge's reference chains run this many budgets more than an arm (0: its short runs are it)",
    )  # fmt: skip
    add_choices(
        parser,
        reference_start=(
            ["fresh", "continued"],
            "split-merge's reference chains: new ones from fresh starts (1 + factor budgets), or the arm's continued",
        ),
        nb_cover=(
            ["rounds", "every"],
            "the NB arms' neural sweeps: one round of disjoint pairs (the kernel's default), or every pair",
        ),
        mean_moves=(
            ["informed", "walk"],
            "every arm's single-site sweep: random walk and informed moves of the means (the kernels' default, "
            "informed_means=True), or the random walk alone (the runs before session 52)",
        ),
        schedule=(
            ["alternate", "auto", "random"],
            "which transitions of every arm take the single-site sweep (the kernels' schedule): alternating at "
            f"every size (the default since session 66), alternate below {ALTERNATE_BELOW} points and at random "
            "above (auto: sessions 63-65), or at random (the runs before session 63)",
        ),
    )
    parser.add_argument(
        "--label-steps", type=int, default=2,
        help="label steps ending every arm's transitions (the kernels' label_steps; 0: the runs before session 64)",
    )  # fmt: skip
    parser.add_argument(
        "--nb-split-moves", type=int, default=0,
        help="smart-split / dumb-merge attempts ending the NB arms' transitions (NeuralBlockKernel's split_moves; "
        "0, the default: none)",
    )  # fmt: skip
    parser.add_argument("--trace-points", type=int, default=200, help="records per run kept in the JSON and plots")
    parser.add_argument("--workers", type=int, default=1, help="processes running cases (spawned, --threads each)")
    parser.add_argument(
        "--rescore", default=None,
        help="a stored run's folder: recompute its metrics from its record (other options are ignored), run nothing",
    )  # fmt: skip
    add_choices(parser, clock=(["cpu", "wall"], "the run harness's clock: the time budget and the time axis"))
    add_run_options(parser, "experiments/results/gmm_scale", "CI-scale defaults: m 8 and 12, n 60, 1 s runs, 2 chains")
    if parser.parse_args(argv).quick:
        parser.set_defaults(mixtures=[8, 12], points=[60], chains=2, seconds=1.0, max_seconds=1.0, reference_factor=1.0)
    args = parser.parse_args(argv)
    if min(args.chains, args.workers, args.trace_points - 3) < 1 or not 1 <= args.families_per_cell <= 4:
        parser.error("--chains and --workers must be at least 1, --trace-points at least 4, --families-per-cell 1 to 4")
    if not (args.seconds > 0 and args.max_seconds > 0):
        parser.error("--seconds and --max-seconds must be positive")
    if not 0.0 <= args.reference_factor < math.inf:
        parser.error("--reference-factor must be a non-negative number")
    if not 0.0 <= args.gibbs_share <= 1.0:
        parser.error("--gibbs-share must be in [0, 1]")
    if args.label_steps < 0:
        parser.error("--label-steps must be at least 0")
    if args.nb_split_moves < 0:
        parser.error("--nb-split-moves must be at least 0")
    return args


def run_seconds(m: int, n: int, seconds: float, max_seconds: float) -> float:
    """The sampling time of one run at size ``(m, n)``: ``seconds * max(1, m n / (16 * 240)) ** 0.5``, capped.

    Example:
        >>> run_seconds(8, 60, 20.0, 60.0), run_seconds(32, 240, 20.0, 60.0), run_seconds(32, 1000, 20.0, 40.0)
        (20.0, 28.28, 40.0)
    """
    return round(min(max_seconds, seconds * max(1.0, m * n / REFERENCE_SIZE) ** 0.5), 2)


def cell_families(
    mixtures: Sequence[int], points: Sequence[int], per_cell: int, families: Sequence[str] | None = None
) -> list[tuple[int, int, str]]:
    """The cases ``(m, n, family)`` of the benchmark, cell by cell (m major, then n).

    ``families`` given: those in every cell. Otherwise ``per_cell`` families per cell by rotation: cell
    ``(i, j)`` (the i-th m, the j-th n) takes the ``per_cell`` families from ``per_cell * (i + j + 1)`` on
    (cyclically), so every family appears at every m and every n whenever the cells allow it
    (``per_cell * len(points) >= 4`` and ``per_cell * len(mixtures) >= 4``); with the default sizes the
    earlier studies' headline case (the model's own generator at m=16, n=240) is among them.

    Example:
        >>> [f for _, _, f in cell_families([8], [60, 240], 2)]
        ['overlap', 'scaled', 'model', 'unequal']
        >>> cell_families([8], [60], 1, ["scaled"])
        [(8, 60, 'scaled')]
    """
    cases = []
    for i, m in enumerate(mixtures):
        for j, n in enumerate(points):
            if families:
                chosen = list(families)
            else:
                start = per_cell * (i + j + 1)
                chosen = [GMM_FAMILIES[(start + k) % len(GMM_FAMILIES)] for k in range(per_cell)]
            cases += [(m, n, family) for family in chosen]
    return cases


# ------------------------------------------------------------------------------ proposals
def load_gmm_proposal(name: str, quick: bool) -> tuple[NeuralBlockProposal, str]:
    """A GMM pair proposal by shipped name or file (its motif read from the sidecar), and where it came from.

    With ``quick``, a proposal that does not load falls back to an untrained one (``torch.manual_seed(0)``,
    4 components, hidden ``(32,)``) of the motif the name names when one is registered, else ``gmm_pair``.

    Returns:
        ``(proposal, source)``, ``source`` being ``"loaded"`` or ``"untrained"``.

    Raises:
        ValueError: the proposal is not for a :class:`~motifs.gmm_pair.GmmPairMotif` (or a subclass).
    """
    source = "loaded"

    def untrained() -> NeuralBlockProposal:
        nonlocal source
        source = "untrained"
        torch.manual_seed(0)
        motif = motifs.get(name) if name in motifs.names() else GmmPairMotif()
        return NeuralBlockProposal(motif, components=4, hidden=(32,))

    proposal = load_proposal(name, untrained if quick else None)
    if not isinstance(proposal.motif, GmmPairMotif):
        raise ValueError(f"proposal {name!r} is for motif {proposal.motif.name!r}, not a GMM pair motif")
    return proposal, source


# ------------------------------------------------------------------------------ metrics
def last_part_mean(times: Sequence[float], values: Sequence[float], fraction: float = 0.25) -> float:
    """The mean of the values recorded in the last ``fraction`` of the run's time (the last value at least).

    Example:
        >>> last_part_mean([0.0, 1.0, 2.0, 3.0, 4.0], [-9.0, -5.0, -3.0, -2.0, -1.0])
        -1.5
    """
    start = (1.0 - fraction) * times[-1]
    part = [v for t, v in zip(times, values) if t >= start]
    return sum(part) / len(part)


def second_half(times: Sequence[float], values: Sequence[float]) -> list[float]:
    """The values in force over the second half of the run: the one at half time, then every later one.

    Example:
        >>> second_half([0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0])
        [3.0, 4.0, 5.0]
        >>> second_half([0.0, 1.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
        [2.0, 3.0, 4.0]
    """
    half = 0.5 * times[-1]
    first = max(i for i, t in enumerate(times) if t <= half)
    return list(values[first:])


def m_histogram(active: Sequence[float]) -> dict[str, int]:
    """Counts of each number of active mixtures M (keys: M as text, ascending, as JSON keeps them).

    Example:
        >>> m_histogram([3.0, 2.0, 3.0])
        {'2': 1, '3': 2}
    """
    counts: dict[int, int] = {}
    for value in active:
        counts[round(value)] = counts.get(round(value), 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}


def pooled_posterior(histograms: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The posterior of M pooled over chains, each chain's histogram normalized (every chain weighs the same).

    Histograms may be counts or posteriors (the mean of posteriors).

    Example:
        >>> pooled_posterior([{"2": 1, "3": 3}, {"3": 10}])
        {'2': 0.125, '3': 0.875}
    """
    pooled: dict[int, float] = {}
    for hist in histograms:
        total = sum(hist.values())
        for key, count in hist.items():
            pooled[int(key)] = pooled.get(int(key), 0.0) + count / total / len(histograms)
    return {str(k): pooled[k] for k in sorted(pooled)}


def posterior_mode(posterior: dict[str, float] | dict[str, int]) -> int:
    """The most probable M (the smallest on ties).

    Example:
        >>> posterior_mode({"2": 0.4, "3": 0.4, "4": 0.2})
        2
    """
    return min((-p, int(k)) for k, p in posterior.items())[1]


def is_stuck(last_half: Sequence[float], sm_posterior: dict[str, float]) -> bool:
    """A chain stayed at one M over the second half while split-merge's posterior gives that M under 0.5.

    Example:
        >>> is_stuck([4.0, 4.0], {"3": 0.9, "4": 0.1}), is_stuck([3.0, 3.0], {"3": 0.9}), is_stuck([3.0, 4.0], {})
        (True, False, False)
    """
    values = {round(v) for v in last_half}
    return len(values) == 1 and sm_posterior.get(str(values.pop()), 0.0) < 0.5


def mean_and_error(samples: Sequence[float]) -> tuple[float, float]:
    """The mean of independent replicates and its standard error (sample sd over ``sqrt(K)``; 0 for one).

    Example:
        >>> mean_and_error([1.0, 3.0]), mean_and_error([2.0])
        ((2.0, 1.0), (2.0, 0.0))
    """
    count = len(samples)
    if not count:
        raise ValueError("mean_and_error needs at least one replicate")
    mean = sum(samples) / count
    if count < 2:
        return mean, 0.0
    return mean, (sum((x - mean) ** 2 for x in samples) / (count - 1) / count) ** 0.5


def chain_spread(histograms: Sequence[Mapping[str, float]], z: float = TIE_SE) -> dict[str, Any]:
    """The pooled posterior of M with its between-chain uncertainty: the mode set and upper bounds.

    Each chain's normalized histogram is one replicate (the chains are independent), so a pooled
    probability, or the gap between two, has the standard error of :func:`mean_and_error`. The mode set
    holds every M whose pooled probability lies within ``z`` standard errors of its gap below the mode's:
    the values the chains cannot rank below their mode. The upper bound of an M is its pooled probability
    plus ``z`` standard errors.

    Example:
        >>> spread = chain_spread([{"6": 1, "8": 3}, {"6": 3, "8": 1}, {"6": 1, "8": 1}])
        >>> spread["mode set"], round(spread["upper"]["6"], 2)
        ([6, 8], 0.79)
        >>> chain_spread([{"2": 9, "3": 1}, {"2": 8, "3": 2}])["mode set"]
        [2]
    """
    if not histograms or not all(sum(h.values()) > 0 for h in histograms) or not z >= 0:
        raise ValueError(f"chain_spread needs non-empty histograms of at least one chain and z >= 0, got z={z}")
    rows = [{int(k): v / sum(h.values()) for k, v in h.items()} for h in histograms]
    probs = {k: [row.get(k, 0.0) for row in rows] for k in sorted({k for row in rows for k in row})}
    mode = posterior_mode({str(k): sum(p) for k, p in probs.items()})
    mode_set = []
    for k, p in probs.items():
        gap, error = mean_and_error([a - b for a, b in zip(probs[mode], p)])
        if gap <= z * error + 1e-12:
            mode_set.append(k)
    upper = {}
    for k, p in probs.items():
        mean, error = mean_and_error(p)
        upper[str(k)] = mean + z * error
    return {"mode set": mode_set, "upper": upper}


def hit_count_distribution(rates: Sequence[float], chains: int) -> list[float]:
    """The distribution of the total number of chains at the mode, case ``c`` adding ``Binomial(chains, rates[c])``.

    Example:
        >>> [round(p, 3) for p in hit_count_distribution([0.5, 1.0], 2)]
        [0.0, 0.0, 0.25, 0.5, 0.25]
    """
    dist = [1.0]
    for rate in rates:
        case = [math.comb(chains, k) * rate**k * (1.0 - rate) ** (chains - k) for k in range(chains + 1)]
        dist = [
            sum(dist[i] * case[k - i] for i in range(len(dist)) if 0 <= k - i <= chains)
            for k in range(len(dist) + chains)
        ]
    return dist


def exchangeable_miss_probability(nb_hits: Sequence[int], sm_hits: Sequence[int], chains: int) -> float:
    """How likely a sampler as good as split-merge misses the mode target: fewer chains at the mode than split-merge.

    A plug-in estimate under a model of independent chains: per case both arms' chains reach the mode with the
    same rate, set to their pooled frequency (``nb_hits[c]`` and ``sm_hits[c]`` of ``chains`` each; the rate's own
    uncertainty is ignored, so an observed rate of 0 or 1 gives that case no chance of a miss); the two arms'
    totals over the cases are then i.i.d., and the chance that one falls below the other is ``(1 - P(tie)) / 2``,
    under 1/2. Where the reference mode comes from split-merge's own chains (its short runs, or them continued),
    what the model leaves out makes a real miss likelier still: its chains are favoured. Near 0 where the mode is
    certain; about 0.4 at 10 chains where the posterior of M is flat and a chain's own mode is nearly a draw.

    Example:
        >>> exchangeable_miss_probability([5, 5], [5, 5], 5), exchangeable_miss_probability([1], [0], 1)
        (0.0, 0.25)
    """
    if not all(0 <= h <= chains for h in (*nb_hits, *sm_hits)):
        raise ValueError(f"exchangeable_miss_probability: hits must lie in [0, {chains}]")
    rates = [(a + b) / (2 * chains) for a, b in zip(nb_hits, sm_hits, strict=True)]
    return (1.0 - sum(p * p for p in hit_count_distribution(rates, chains))) / 2.0


def fewer_hits_p_value(nb_hits: int, sm_hits: int, chains: int) -> float:
    """One-sided Fisher exact test that NB has fewer chains at the mode than split-merge, each arm ``chains`` chains.

    The probability, given the total number at the mode, that NB's share is ``nb_hits`` or fewer. The counts are
    pooled over a size's cases (conservative where the cases' rates differ) and the chains taken as independent.

    Example:
        >>> fewer_hits_p_value(0, 10, 10) == 1 / math.comb(20, 10), round(fewer_hits_p_value(6, 9, 10), 3)
        (True, 0.152)
    """
    if not (0 <= nb_hits <= chains and 0 <= sm_hits <= chains):
        raise ValueError(f"fewer_hits_p_value: hits must lie in [0, {chains}]")
    hits = nb_hits + sm_hits
    low = max(0, hits - chains)
    tail = sum(math.comb(chains, k) * math.comb(chains, hits - k) for k in range(low, nb_hits + 1))
    return tail / math.comb(2 * chains, hits)


def m_change_fraction(active: Sequence[float]) -> float:
    """The fraction of transitions after which the chain's M differs from before (0 without transitions).

    Example:
        >>> m_change_fraction([2.0, 3.0, 3.0, 2.0, 2.0])
        0.5
    """
    steps = len(active) - 1
    return sum(a != b for a, b in zip(active, active[1:])) / steps if steps else 0.0


def joined_chains(first: dict[str, Any], more: dict[str, Any]) -> list[dict[str, list[float]]]:
    """The chains of run ``first`` continued by run ``more``, which started from ``first``'s last state.

    ``more``'s times are shifted by ``first``'s last time and its start record (``first``'s last) dropped.

    Example:
        >>> first = {"times": [0.0, 1.0], "log_joint": [-5.0, -1.0], "log_lik": [-4.0, -1.0], "active": [2.0, 3.0]}
        >>> more = {"times": [0.0, 0.5], "log_joint": [-1.0, -2.0], "log_lik": [-1.0, -2.0], "active": [3.0, 4.0]}
        >>> [(c["times"], c["active"]) for c in joined_chains(first, more)]
        [([0.0, 1.0, 1.5], [2.0, 3.0, 4.0])]
    """
    end = first["times"][-1]
    joined = []
    for head, tail in zip(chain_traces(first), chain_traces(more), strict=True):
        chain = {key: head[key] + tail[key][1:] for key in ("log_joint", "log_lik", "active")}
        joined.append({"times": head["times"] + [end + t for t in tail["times"][1:]], **chain})
    return joined


def reference_posterior(first: dict[str, Any], more: dict[str, Any] | None = None) -> dict[str, Any]:
    """Split-merge's reference posterior of M: its chains ``first`` (continued by ``more``, if given), each
    chain's histogram over the second half of its whole run, pooled (chains weighted equally).

    Example:
        >>> first = {"times": [0.0, 1.0], "log_joint": [0.0] * 2, "log_lik": [0.0] * 2, "active": [2.0, 3.0]}
        >>> more = {"times": [0.0, 1.0, 2.0], "log_joint": [0.0] * 3, "log_lik": [0.0] * 3, "active": [3.0, 4.0, 4.0]}
        >>> ref = reference_posterior(first, more)
        >>> ref["M histograms"], ref["M mode"]
        ([{'3': 1, '4': 2}], 4)
        >>> reference_posterior(more)["M histograms"]  # fresh chains: their own run
        [{'4': 2}]
    """
    chains = chain_traces(first) if more is None else joined_chains(first, more)
    hists = [m_histogram(second_half(c["times"], c["active"])) for c in chains]
    posterior = pooled_posterior(hists)
    return {"M histograms": hists, "M posterior": posterior, "M mode": posterior_mode(posterior)}


def time_ratio(nb: float | None, sm: float | None) -> float | None:
    """An NB arm's median time to the level over split-merge's (``None``: NB's median chain never got there).

    ``inf`` when split-merge's median chain starts at the level (time 0) and NB's does not.

    Example:
        >>> time_ratio(1.0, 4.0), time_ratio(None, 4.0), time_ratio(0.0, 0.0)
        (0.25, None, 1.0)
    """
    if nb is None or sm is None:
        return None
    if sm == 0.0:
        return 1.0 if nb == 0.0 else math.inf
    return nb / sm


def ratio_to_baseline(nb: float | None, base: float | None) -> float | None:
    """NB's median time to the level over another arm's, where that arm's median chain may never get there.

    ``0.0`` when only the other arm never got there (NB is infinitely faster); ``None`` when NB never did;
    else :func:`time_ratio`.

    Example:
        >>> ratio_to_baseline(1.0, None), ratio_to_baseline(None, 2.0), ratio_to_baseline(1.0, 2.0)
        (0.0, None, 0.5)
    """
    if nb is not None and base is None:
        return 0.0
    return time_ratio(nb, base)


def case_metrics(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm of one case: the level, first times, posterior of M, stuck chains, acceptance and M changes."""
    traces = {label: chain_traces(runs[0]) for label, runs in result["runs"].items()}
    level = lower_median(last_part_mean(c["times"], c["log_joint"]) for c in traces[SM]) - LEVEL_MARGIN
    halves = {label: [second_half(c["times"], c["active"]) for c in chains] for label, chains in traces.items()}
    hists = {label: [m_histogram(h) for h in label_halves] for label, label_halves in halves.items()}
    short_posterior = pooled_posterior(hists[SM])  # split-merge's own equal-time chains
    short_mode = posterior_mode(short_posterior)
    sm_reference = result.get("sm_reference")
    sm_posterior = sm_reference["M posterior"] if sm_reference else short_posterior
    sm_mode = posterior_mode(sm_posterior)
    true_m = round(result["reference"]["true_active"])
    metrics: dict[str, dict[str, Any]] = {}
    for label, chains in traces.items():
        reach = [first_time_above(c["times"], c["log_joint"], level) for c in chains]
        posterior = pooled_posterior(hists[label])
        modes = [posterior_mode(h) for h in hists[label]]
        metrics[label] = {
            "level": level,
            "level - true log joint": level - result["reference"]["true_log_joint"],
            "times to level": reach,
            "chains reaching level": sum(t is not None for t in reach),
            "median time to level": censored_lower_median(reach),
            "M histograms": hists[label],
            "M posterior": posterior,
            "M mode": posterior_mode(posterior),
            "chain M modes": modes,
            "chains with mode = SM mode": sum(mode == sm_mode for mode in modes),
            "chains with mode = SM short-run mode": sum(mode == short_mode for mode in modes),
            "chains with mode = true M": sum(mode == true_m for mode in modes),
            "stuck": [is_stuck(h, sm_posterior) for h in halves[label]],
            "stuck (SM short-run posterior)": [is_stuck(h, short_posterior) for h in halves[label]],
            "M change fraction": [m_change_fraction(c["active"]) for c in chains],
            "final log joint - truth": [c["log_joint"][-1] - result["reference"]["true_log_joint"] for c in chains],
            "acceptance": acceptance_summary(result, label),
        }
    sm_time = metrics[SM]["median time to level"]
    for label in metrics:
        metrics[label]["time / SM"] = time_ratio(metrics[label]["median time to level"], sm_time)
    for label, extra in spread_metrics(result, metrics).items():
        metrics[label].update(extra)
    return metrics


def total_variation(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """The total-variation distance ``0.5 sum_M |p(M) - q(M)|`` between two posteriors of M (keys: M as text).

    Example:
        >>> total_variation({"3": 0.5, "4": 0.5}, {"4": 0.75, "5": 0.25})
        0.5
    """
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def spread_metrics(result: dict[str, Any], metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm, the mode and stuck metrics that allow for split-merge's between-chain uncertainty, and the
    total-variation distance of the arm's pooled posterior of M from split-merge's reference posterior.

    From the chains' histograms alone (so stored records can be rescored, :func:`rescore`): split-merge's
    reference chains (its longer runs, else its arm's) give the mode set and upper bounds of
    :func:`chain_spread`. A chain counts when its mode is in the mode set; it is stuck when it holds one M
    over the second half whose upper bound is under 0.5 (split-merge's chains put under 0.5 on it beyond
    their spread).

    Example:
        >>> hists = {SM: [{"6": 3, "8": 1}, {"6": 1, "8": 3}], NB_SET: [{"8": 4}, {"7": 4}]}
        >>> met = spread_metrics({}, {label: {"M histograms": h} for label, h in hists.items()})
        >>> met[NB_SET]["chains with mode in SM mode set"], met[NB_SET]["stuck beyond SM spread"]
        (1, [False, True])
        >>> met[NB_SET]["TV to SM reference"]  # NB's 8: 1/2, 7: 1/2 against split-merge's 6: 1/2, 8: 1/2
        0.5
    """
    reference = result.get("sm_reference")
    reference_hists = reference["M histograms"] if reference else metrics[SM]["M histograms"]
    spread = chain_spread(reference_hists)
    reference_posterior_m = reference["M posterior"] if reference else pooled_posterior(reference_hists)
    out = {}
    for label, met in metrics.items():
        hists = met["M histograms"]
        out[label] = {
            "TV to SM reference": total_variation(pooled_posterior(hists), reference_posterior_m),
            "SM mode set": spread["mode set"],
            "chains with mode in SM mode set": sum(posterior_mode(h) in spread["mode set"] for h in hists),
            "stuck beyond SM spread": [len(h) == 1 and spread["upper"].get(next(iter(h)), 0.0) < 0.5 for h in hists],
        }
    return out


def thin_run(run: dict[str, Any], points: int) -> dict[str, Any]:
    """A :func:`~experiments.gmm_models.run_sampler` record cut to at most ``points`` records (``points >= 4``).

    It keeps evenly spaced and log-spaced records (the early climb), the first and the last, with the times
    to the microsecond (:data:`TIME_DIGITS`), the log joints and likelihoods to 0.01 nats (:data:`LOG_DIGITS`) and
    M as a whole number, so the record of a long run stays small; ``sweeps`` still counts every transition.

    Example:
        >>> run = {"times": [0.0, 1.0, 2.0, 3.0, 4.0], "log_joint": [5.0, 6.0, 7.0, 8.0, 9.0], "sweeps": 4}
        >>> run = {**run, "log_lik": run["log_joint"], "active": [[1.0, 2.0, 2.0, 3.0, 3.0]] * 2}
        >>> small = thin_run(run, 4)
        >>> small["times"], small["active"], small["sweeps"]
        ([0.0, 1.0, 4.0], [[1, 2, 3], [1, 2, 3]], 4)
    """
    count = len(run["times"])
    keep = list(range(count))
    if count > points:
        even = torch.linspace(0, count - 1, points // 2).round().long().tolist()
        logs = torch.logspace(0, math.log10(count - 1), points - points // 2).round().long().tolist()
        keep = sorted({0, count - 1, *even, *logs})
    thinned = {**run, "times": [round(run["times"][i], TIME_DIGITS) for i in keep]}
    for key, digits in (("log_joint", LOG_DIGITS), ("log_lik", LOG_DIGITS), ("active", None)):
        trace = run[key]
        chains = trace if trace and isinstance(trace[0], list) else [trace]
        kept = [[round(c[i], digits) for i in keep] for c in chains]  # (M: a whole number, written as one)
        thinned[key] = kept if trace and isinstance(trace[0], list) else kept[0]
    return thinned


# ------------------------------------------------------------------------------ running
_WORKER: dict[str, Any] = {}


def start_worker(args: argparse.Namespace) -> dict[str, str]:
    """Set this process up to run cases (torch's threads, the two proposals); where each proposal came from."""
    torch.set_num_threads(args.threads)
    tqdm.set_lock(threading.RLock())  # no process-shared lock: the runs' (silent) bars stay in their process
    _WORKER["args"] = args
    sources = {}
    for label, name in ((NB_SET, args.proposal), (NB_OLD, args.old_proposal)):
        _WORKER[label], sources[label] = load_gmm_proposal(name, args.quick)
        warm_up(_WORKER[label], args.chains)
    return sources


def warm_up(proposal: NeuralBlockProposal, chains: int) -> float:
    """One sweep of ``proposal`` and of split-merge on a tiny GMM, so that this process's compiled loops are loaded
    before any clock.

    The compiled ``gmm_pair_set`` sweep (:mod:`neuralblock.kernels.jit_mixture`) and split-merge sweep
    (:mod:`neuralblock.kernels.jit_split_merge`) are compiled once per machine (cached on disk) and loaded once per
    process: like the imports, not part of any run's sampling time.
    Returns the seconds it took (the kernel's ``compile_seconds``).

    Example:
        >>> warm_up(load_gmm_proposal("gmm_pair_copies", quick=False)[0], 2) >= 0.0
        True
    """
    fg = gmm_graph(torch.tensor([[0.0, 0.0], [1.0, 1.0], [4.0, 4.0]]), 3, 1.0, 5.0, 0.5)
    kernel = NeuralBlockKernel(fg, [proposal], gibbs_prob=0.0, chains=chains)
    kernel.initial_params = {"x": sequential_init(fg, torch.Generator().manual_seed(0), chains=chains)}
    kernel.setup(0)
    kernel.sample(kernel.initial_params)
    kernel.single_site.sweep(fg, kernel.initial_params["x"], adapt=False)  # the compiled single-site sweep
    split_merge = SplitMergeGMM(fg, gibbs_prob=0.0, chains=chains)  # the compiled split-merge sweep
    split_merge.initial_params = kernel.initial_params
    split_merge.setup(0)
    split_merge.sample(split_merge.initial_params)
    return float(kernel.diagnostics()["compile_seconds"]) + split_merge.compile_seconds


def run_case(case: tuple[int, int, int, str]) -> tuple[int, dict[str, Any]]:
    """Run the four arms on one case ``(index, m, n, family)`` in this (set-up) process; its result with metrics.

    The case's starts and run seeds come from its generator seed alone, so the result does not depend
    on which process runs it (or after what).
    """
    index, m, n, family = case
    args = _WORKER["args"]
    fg, _, reference = family_gmm(family, m, n, args.seed)
    seconds = run_seconds(m, n, args.seconds, args.max_seconds)
    chains = args.chains
    start = case_starts(fg, reference["seed"], chains)

    def build(label: str) -> GraphKernel:
        informed = args.mean_moves == "informed"
        mix = {"gibbs_prob": args.gibbs_prob, "gibbs_share": args.gibbs_share or None, "informed_means": informed}
        mix["schedule"] = case_schedule(args.schedule, n)
        mix["label_steps"] = args.label_steps
        if label == GIBBS:  # its single-site sweeps only (the moves never run)
            return SplitMergeGMM(
                fg, chains=chains, gibbs_prob=1.0, informed_means=informed, label_steps=args.label_steps
            )
        if label == SM:
            return SplitMergeGMM(fg, chains=chains, **mix)
        cover = None if args.nb_cover == "rounds" else False
        split = getattr(args, "nb_split_moves", 0)  # (0 in the records before session 65)
        return NeuralBlockKernel(fg, proposals=[_WORKER[label]], chains=chains, cover=cover, split_moves=split, **mix)

    runs: dict[str, list[dict[str, Any]]] = {}
    continued = args.reference_factor > 0 and args.reference_start == "continued"
    for label in ARMS:
        keep_final = continued and label == SM
        run = run_sampler(build(label), start, seconds, seed=reference["seed"], clock=args.clock, keep_final=keep_final)
        diag = run.pop("diagnostics")
        run["acceptance"] = arm_acceptance(label, diag, args)
        run["gibbs_prob"] = diag["gibbs_prob"]  # (with --gibbs-share, the calibrated one)
        run["single_site_sweeps"] = diag["single_site_sweeps"]
        if label == GIBBS:  # (none: its kernel never leaves the single-site sweep)
            run["split_merge_moves"] = sum(diag["proposed"].values())
        runs[label] = [run]
    result = {"m": m, "n": n, "family": family, "seconds": seconds, "reference": reference, "runs": runs}
    if args.reference_factor > 0:  # split-merge's reference chains (not part of any arm's metrics)
        if continued:  # the arm's chains, continued
            more_seconds = round(reference_budgets(args) * seconds, 2)
            more = run_sampler(build(SM), runs[SM][0].pop("final"), more_seconds, seed=reference["seed"] + 1,
                               clock=args.clock)  # fmt: skip
            posterior = reference_posterior(runs[SM][0], more)
        else:  # new chains from fresh starts: independent of every arm's
            more_seconds = round(reference_budgets(args) * seconds, 2)
            fresh = case_starts(fg, reference["seed"] + FRESH_SEED_OFFSET, chains)
            more = run_sampler(build(SM), fresh, more_seconds, seed=reference["seed"] + 2, clock=args.clock)
            posterior = reference_posterior(more)
        starts = [c["log_joint"][0] for c in chain_traces(more)]  # (the record of where its chains began)
        result["sm_reference"] = {"seconds": more_seconds, "sweeps": more["sweeps"], "start": args.reference_start}
        result["sm_reference"]["start log joints"] = starts
        result["sm_reference"]["gibbs_prob"] = more["diagnostics"]["gibbs_prob"]  # (--gibbs-share: its own timing)
        result["sm_reference"].update(posterior)
    result["metrics"] = case_metrics(result)  # from every transition, before the traces are thinned
    runs.update({label: [thin_run(run, args.trace_points)] for label, (run,) in runs.items()})
    return index, result


def case_schedule(option: str, points: int) -> str:
    """The kernels' ``schedule`` of a case of ``points`` points under ``--schedule option``.

    Example:
        >>> case_schedule("auto", 240), case_schedule("auto", 1000), case_schedule("random", 240)
        ('alternate', 'random', 'random')
    """
    if option == "auto":
        return "alternate" if points < ALTERNATE_BELOW else "random"
    return option


def case_starts(fg: FactorGraph, seed: int, chains: int) -> torch.Tensor:
    """``chains`` random starts of a case's model from ``seed`` (``[n]`` for one chain, else ``[chains, n]``).

    Example:
        >>> fg, _, _ = family_gmm("overlap", 8, 60)
        >>> case_starts(fg, 5, 3).shape, case_starts(fg, 5, 1).shape
        (torch.Size([3, 144]), torch.Size([144]))
    """
    start = sequential_init(fg, torch.Generator().manual_seed(seed), chains=chains)
    return start[0] if chains == 1 else start


def arm_acceptance(label: str, diagnostics: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """An arm's in-kernel acceptance: split-merge's per move, an NB arm's under its proposal's name, Gibbs's copy moves.

    (The kernel names a proposal by its motif, which both set proposals share.)

    Example:
        >>> args = argparse.Namespace(proposal="gmm_pair_copies", old_proposal="pretrained/gmm_pair_set")
        >>> arm_acceptance(NB_OLD, {"acceptance_by_proposal": {"gmm_pair_set": 0.25}}, args)
        {'gmm_pair_set': 0.25}
        >>> arm_acceptance(NB_SET, {"acceptance_by_proposal": {"gmm_pair_set": 0.5}}, args)
        {'gmm_pair_copies': 0.5}
        >>> arm_acceptance(GIBBS, {"copy_move_acceptance": {"split": 0.25, "merge": 0.5}}, args)
        {'copy split': 0.25, 'copy merge': 0.5}
    """
    if label == GIBBS:
        return {f"copy {move}": rate for move, rate in diagnostics["copy_move_acceptance"].items()}
    if label == SM:
        return dict(diagnostics["acceptance_by_move"])
    (rate,) = diagnostics["acceptance_by_proposal"].values()
    return {Path(args.proposal if label == NB_SET else args.old_proposal).name: rate}


def planned_seconds(args: argparse.Namespace, m: int, n: int) -> float:
    """The sampling time one case plans: every arm's budget and split-merge's reference chains.

    Example:
        >>> planned_seconds(parse_args(["--seconds", "10"]), 8, 60), planned_seconds(parse_args(
        ...     ["--seconds", "10", "--reference-start", "continued"]), 8, 60)
        (70.0, 60.0)
    """
    return (len(ARMS) + reference_budgets(args)) * run_seconds(m, n, args.seconds, args.max_seconds)


def reference_budgets(args: argparse.Namespace) -> float:
    """How many run budgets split-merge's reference chains take: ``1 + factor`` from fresh starts, ``factor``
    continued (the arm's own budget came first), 0 without reference chains.

    Example:
        >>> reference_budgets(parse_args([])), reference_budgets(parse_args(["--reference-start", "continued"]))
        (3.0, 2.0)
    """
    if not args.reference_factor:
        return 0.0
    return args.reference_factor + (1.0 if args.reference_start == "fresh" else 0.0)


def run_cases(args: argparse.Namespace, cases: list[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """Every case, in this process (``--workers 1``) or in ``--workers`` spawned ones; results in case order.

    The cases start longest first (by planned time), so that with several workers the longest do not
    start last; a case's record does not depend on when it runs (:func:`run_case`).
    """
    planned = [planned_seconds(args, m, n) for m, n, _ in cases]
    jobs = sorted(((i, m, n, family) for i, (m, n, family) in enumerate(cases)), key=lambda job: -planned[job[0]])
    results: list[dict[str, Any] | None] = [None] * len(cases)
    bar = tqdm(total=round(sum(planned), 1), unit="s", desc="GMM cases (planned sampling s)")

    def collect(done: Iterator[tuple[int, dict[str, Any]]]) -> None:
        for index, result in done:
            results[index] = result
            bar.update(planned[index])
            bar.set_postfix_str(f"m={result['m']} n={result['n']} {result['family']}")

    with bar:
        if args.workers == 1:
            if _WORKER.get("args") is not args:
                start_worker(args)
            collect(run_case(job) for job in jobs)
        else:
            context = multiprocessing.get_context("spawn")
            with context.Pool(min(args.workers, len(jobs)), initializer=start_worker, initargs=(args,)) as pool:
                collect(pool.imap_unordered(run_case, jobs))
    return [r for r in results if r is not None]


# ------------------------------------------------------------------------------ reports
def _fmt_prob(value: float | None) -> str:
    """A probability to 3 decimals (``-`` where a record has none)."""
    return "-" if value is None else f"{value:.3f}"


def format_ratio(value: float | None) -> str:
    """A time ratio to 2 decimals (``never``: NB's median chain never got to the level).

    Example:
        >>> format_ratio(0.1234), format_ratio(None), format_ratio(math.inf)
        ('0.12', 'never', 'inf')
    """
    return "never" if value is None else f"{value:.2f}"


def worst_ratio(ratios: Sequence[float | None]) -> float | None:
    """The largest of a size's time ratios, ``None`` (never got there) above all.

    Example:
        >>> worst_ratio([0.2, 0.4]), worst_ratio([0.2, None])
        (0.4, None)
    """
    return None if any(x is None for x in ratios) else max(x for x in ratios if x is not None)


def all_sizes_met_probability(miss_probabilities: Sequence[float]) -> float:
    """The chance of meeting the mode target at every size, given each size's chance of a miss (independent sizes).

    Example:
        >>> all_sizes_met_probability([0.5, 0.2]), all_sizes_met_probability([])
        (0.4, 1.0)
    """
    return math.prod((1.0 - p for p in miss_probabilities), start=1.0)


def case_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per case and arm."""
    rows = []
    for result in results:
        for label, met in result["metrics"].items():
            chains = len(met["stuck"])
            rows.append(
                {
                    "m": result["m"],
                    "n": result["n"],
                    "family": result["family"],
                    "true M": round(result["reference"]["true_active"]),
                    "arm": label,
                    "s": result["seconds"],
                    "sweeps": result["runs"][label][0]["sweeps"],
                    "level - truth": met["level - true log joint"],
                    "reach level": f"{met['chains reaching level']}/{chains}",
                    "median time (s)": met["median time to level"],
                    "time / SM": format_ratio(met["time / SM"]),
                    "M mode": met["M mode"],
                    "P(mode)": met["M posterior"][str(met["M mode"])],
                    "mode = SM mode": f"{met['chains with mode = SM mode']}/{chains}",
                    "mode = true M": f"{met['chains with mode = true M']}/{chains}",
                    "stuck": f"{sum(met['stuck'])}/{chains}",
                    "M changes": lower_median(met["M change fraction"]),
                    "gibbs_prob": _fmt_prob(result["runs"][label][0].get("gibbs_prob")),
                    "acceptance": met["acceptance"],
                }
            )
    return rows


def nb_over_gibbs(result: dict[str, Any]) -> float | None:
    """NB(set)'s median time to the level over the Gibbs arm's in one case (:func:`ratio_to_baseline`)."""
    met = result["metrics"]
    return ratio_to_baseline(met[NB_SET]["median time to level"], met[GIBBS]["median time to level"])


def report_arms(results: list[dict[str, Any]]) -> list[str]:
    """The arms of a record in the report's column order (:data:`SHORT_NAMES`; earlier records lack the Gibbs arm).

    Example:
        >>> report_arms([{"runs": {NB_SET: [], SM: [], NB_OLD: []}}])
        ['split-merge + Gibbs', 'NB(set) + Gibbs', 'NB(old) + Gibbs']
    """
    present = set(results[0]["runs"]) if results else set()
    return [label for label in SHORT_NAMES if label in present]


def _arm_names(arms: Sequence[str]) -> str:
    """The short names of ``arms`` for a column title, as ``SM / set / old / Gibbs``."""
    return " / ".join(SHORT_NAMES[a] for a in arms)


def _per_arm(metrics: dict[str, dict[str, Any]], key: str, arms: Sequence[str]) -> str:
    """``key``'s count (a list counts its true entries) for each of ``arms``, as ``a / b / c / d``."""
    values = [metrics[a][key] for a in arms]
    return " / ".join(str(sum(v) if isinstance(v, list) else v) for v in values)


def _fmt_reference(reference: dict[str, Any] | None) -> str:
    """Split-merge's reference mode and its probability (``-`` without a reference run)."""
    if not reference:
        return "-"
    return f"{reference['M mode']} ({reference['M posterior'][str(reference['M mode'])]:.2f})"


def summary_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: every arm's time ratio (and NB(set)'s over Gibbs's), the modes of M and the stuck chains."""
    arms, names = report_arms(results), _arm_names(report_arms(results))
    rows = []
    for result in results:
        met = result["metrics"]
        ratios = {f"{RATIO_NAMES[a]}/SM": format_ratio(met[a]["time / SM"]) for a in ARMS if a in arms and a != SM}
        if GIBBS in met:
            ratios["NB(set)/Gibbs"] = format_ratio(nb_over_gibbs(result))
        rows.append(
            {
                "m": result["m"],
                "n": result["n"],
                "family": result["family"],
                "s": result["seconds"],
                **ratios,
                "true M": round(result["reference"]["true_active"]),
                "SM reference mode (P)": _fmt_reference(result.get("sm_reference")),
                f"mode {names}": " / ".join(str(met[a]["M mode"]) for a in arms),
                f"chains mode = SM mode ({names})": _per_arm(met, "chains with mode = SM mode", arms),
                "same, SM short run": _per_arm(met, "chains with mode = SM short-run mode", arms),
                "SM mode set": ", ".join(str(k) for k in met[SM]["SM mode set"]),
                f"chains mode in it ({names})": _per_arm(met, "chains with mode in SM mode set", arms),
                f"stuck ({names})": _per_arm(met, "stuck", arms),
                f"stuck beyond SM spread ({names})": _per_arm(met, "stuck beyond SM spread", arms),
                f"TV to SM reference ({names})": " / ".join(f"{met[a]['TV to SM reference']:.2f}" for a in arms),
            }
        )
    return rows


def distance_text(results: list[dict[str, Any]]) -> str:
    """The report's line on each arm's median total-variation distance from split-merge's reference posterior of M.

    Example:
        >>> met = {a: {"TV to SM reference": tv} for a, tv in ((NB_SET, 0.1), (SM, 0.3))}
        >>> reference = {"seconds": 1.0}  # (a reference run: split-merge's own distance counts)
        >>> text = distance_text([{"m": 12, "metrics": met, "sm_reference": reference}, {"m": 8, "metrics": met}])
        >>> text.startswith("Lower median over the 1 cases"), text.endswith("posterior: NB(set) 0.10, SM 0.30.")
        (True, True)
        >>> distance_text([{"m": 12, "metrics": met}]).endswith("posterior: NB(set) 0.10.")  # no reference run: no SM
        True
    """
    cases = [r for r in results if r["m"] >= TARGET_MIXTURES]
    # (without a reference run split-merge's own posterior is the reference: its distance is 0 by construction)
    arms = [a for a in ARMS if cases and a in cases[0]["metrics"] and (a != SM or cases[0].get("sm_reference"))]
    if not arms:
        return ""
    medians = [
        f"{RATIO_NAMES[a]} {lower_median(r['metrics'][a]['TV to SM reference'] for r in cases):.2f}" for a in arms
    ]
    return (
        f"Lower median over the {len(cases)} cases with m >= 12 of the total-variation distance of each arm's pooled "
        + f"posterior of M from split-merge's reference posterior: {', '.join(medians)}."
    )


def size_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, the issue's targets for NB(set): its worst time ratio over the size's cases and the checks.

    ``<= 0.5x`` split-merge's time at m >= 12 and never slower (a ratio of ``None``, never reached,
    counts as slower); as many chains with M's mode = split-merge's mode as split-merge's own chains; no
    stuck chain. The mode and stuck checks are given against split-merge's reference posterior, against
    its short runs', and allowing for its chains' spread (:func:`spread_metrics`). The other arms' worst
    ratios are there to compare, and (where the record has the Gibbs arm) NB(set)'s worst ratio to Gibbs's time.
    """
    arms, names = report_arms(results), _arm_names(report_arms(results))
    sizes = sorted({(r["m"], r["n"]) for r in results})
    rows = []
    for m, n in sizes:
        cell = [r for r in results if (r["m"], r["n"]) == (m, n)]

        def counts(key: str, cases: list[dict[str, Any]] = cell) -> dict[str, int]:
            return {a: sum(r["metrics"][a][key] for r in cases) for a in arms}

        def joined(values: dict[str, int]) -> str:
            return " / ".join(str(values[a]) for a in arms)

        set_ratio = worst_ratio([r["metrics"][NB_SET]["time / SM"] for r in cell])
        modes, short = counts("chains with mode = SM mode"), counts("chains with mode = SM short-run mode")
        chains = sum(len(r["metrics"][SM]["stuck"]) for r in cell)
        case_hits = {a: [r["metrics"][a]["chains with mode = SM mode"] for r in cell] for a in (NB_SET, SM)}
        miss = exchangeable_miss_probability(case_hits[NB_SET], case_hits[SM], chains // len(cell))
        in_set = counts("chains with mode in SM mode set")
        stuck = sum(sum(r["metrics"][NB_SET]["stuck"]) for r in cell)
        short_stuck = sum(sum(r["metrics"][NB_SET]["stuck (SM short-run posterior)"]) for r in cell)
        spread_stuck = sum(sum(r["metrics"][NB_SET]["stuck beyond SM spread"]) for r in cell)
        others = {
            f"worst {RATIO_NAMES[a]}/SM": format_ratio(worst_ratio([r["metrics"][a]["time / SM"] for r in cell]))
            for a in ARMS
            if a in arms and a != SM
        }
        if GIBBS in arms:
            others["worst NB(set)/Gibbs"] = format_ratio(worst_ratio([nb_over_gibbs(r) for r in cell]))
        rows.append(
            {
                "m": m,
                "n": n,
                "families": ", ".join(r["family"] for r in cell),
                **others,
                "time target": set_ratio is not None and set_ratio <= (TIME_TARGET if m >= TARGET_MIXTURES else 1.0),
                f"mode = SM mode ({names})": joined(modes),
                "mode target": modes[NB_SET] >= modes[SM],
                "P(miss) as good as SM": round(miss, 3),
                "fewer at mode: p": round(fewer_hits_p_value(modes[NB_SET], modes[SM], chains), 3),
                "stuck NB(set)": stuck,
                f"SM short run: mode = its mode ({names})": joined(short),
                "SM short run: mode target": short[NB_SET] >= short[SM],
                "SM short run: stuck NB(set)": short_stuck,
                f"mode in SM mode set ({names})": joined(in_set),
                "mode-set target": in_set[NB_SET] >= in_set[SM],
                "stuck NB(set) beyond SM spread": spread_stuck,
            }
        )
    return rows


def mode_target_text(targets: list[dict[str, Any]]) -> str:
    """The report's sentence on the mode target over the sizes with m >= 12: met, expected misses, significant misses.

    Example:
        >>> rows = [{"m": 12, "mode target": False, "P(miss) as good as SM": 0.4, "fewer at mode: p": 0.3}]
        >>> print(mode_target_text(rows + [{"m": 8, "mode target": False}]))  # doctest: +NORMALIZE_WHITESPACE
        Mode target at 0 of 1 sizes with m >= 12; a sampler as good as split-merge (`P(miss) as good as SM`,
        summed) would miss it at 0.4 of them in expectation and meet it at every one with probability 0.60
        (plug-in estimates, chains taken as independent); NB(set) has fewer chains at the mode than split-merge at
        p < 0.05 (`fewer at mode: p`, one-sided Fisher exact, no correction for the 1 tests) at 0.
    """
    rows = [t for t in targets if t["m"] >= TARGET_MIXTURES]
    if not rows:
        return ""
    met = sum(bool(t["mode target"]) for t in rows)
    expected = sum(t["P(miss) as good as SM"] for t in rows)
    significant = sum(t["fewer at mode: p"] < 0.05 for t in rows)
    all_met = all_sizes_met_probability([t["P(miss) as good as SM"] for t in rows])
    return (
        f"Mode target at {met} of {len(rows)} sizes with m >= 12; a sampler as good as split-merge (`P(miss) as good "
        + f"as SM`, summed) would miss it at {expected:.1f} of them in expectation and meet it at every one with "
        + f"probability {all_met:.2f} (plug-in estimates, chains taken as independent); NB(set) has fewer chains at "
        + "the mode than split-merge at p < 0.05 (`fewer at mode: p`, one-sided Fisher exact, no correction for "
        + f"the {len(rows)} tests) at {significant}.\n"
    )


def plot_cases(
    results: list[dict[str, Any]], path: Path, key: str, ylabel: str, time_label: str, columns: int = 4
) -> None:
    """One panel per case of ``key`` (``log_joint`` less the truth's, or ``active``) against time, every chain."""
    plt = pyplot()
    rows = math.ceil(len(results) / columns)
    cols = min(columns, len(results))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.7 * rows), squeeze=False)
    for ax, result in zip(axes.flat, results):
        ref = result["reference"]
        offset = ref["true_log_joint"] if key == "log_joint" else 0.0
        lows, highs = [], []
        for label, (run,) in result["runs"].items():
            for c, chain in enumerate(chain_traces(run)):
                values = [v - offset for v in chain[key]]
                lows.append(min(values))
                highs.append(max(values))
                ax.step(run["times"], values, where="post", color=COLORS[label], lw=0.6, alpha=0.5)
                if c == 0:
                    ax.plot([], [], color=COLORS[label], label=label)
        if key == "log_joint":
            level = result["metrics"][SM]["level"] - offset
            ax.set_ylim(max(level - 60.0, min(lows)), max(highs) + 5.0)
            ax.axhline(level, color="k", lw=0.7, ls=":")
            ax.axhline(0.0, color="k", lw=0.5, ls="--")
        else:
            ax.axhline(ref["true_active"], color="k", lw=0.7, ls="--")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(left=0.0)
        ax.set_title(f"m={result['m']}, n={result['n']}, {result['family']}", fontsize=9)
        ax.set_xlabel(f"{time_label} (log above 0.1)", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    save_figure(fig, path, dpi=80)


def reference_text(args: argparse.Namespace) -> str:
    """The report's sentence on split-merge's posterior of M, the reference of the mode and stuck metrics."""
    if not args.reference_factor:
        return "Split-merge's posterior of M is its arm's own (the short runs). "
    if args.reference_start == "fresh":
        return (
            "Split-merge's posterior of M (`SM mode`, `stuck`) is from new split-merge chains, from fresh starts "
            + f"(independent of every arm), run for {1 + args.reference_factor:g} budgets, over the second half of "
            + "each run; the columns marked `SM short run` use the arm's own chains instead. "
        )
    return (
        "Split-merge's posterior of M (`SM mode`, `stuck`) is from its chains continued from the arm's last "
        + f"states for {args.reference_factor:g} budgets more, over the second half of each whole run; the "
        + "columns marked `SM short run` use the arm's own chains instead, as earlier runs of this benchmark did. "
    )


def mixing_text(args: argparse.Namespace) -> str:
    """How the arms mix single-site sweeps with their moves: ``--gibbs-prob``, or ``--gibbs-share`` and what it does.

    Example:
        >>> mixing_text(parse_args(["--gibbs-share", "0", "--schedule", "random", "--label-steps", "0"]))
        'gibbs_prob=0.5'
    """
    if not args.gibbs_share:
        return f"gibbs_prob={args.gibbs_prob:g}" + schedule_text(args) + label_text(args) + split_text(args)
    return (
        f"gibbs_share={args.gibbs_share:g} (each kernel times one single-site sweep and one sweep of its moves at "
        + "its start and sets its probability of a single-site sweep so that those take this share of the time: "
        + "column `gibbs_prob`; "
        + (
            "the timing runs at setup, outside the sampling time)"
            if getattr(args, "share_calibration", None) == "setup"
            else "the timing ran in the first transition and counts in every arm's time to the level)"
        )
        + schedule_text(args)
        + label_text(args)
        + split_text(args)
    )


def split_text(args: argparse.Namespace) -> str:
    """The report's words on the split moves ending the NB arms' transitions (``--nb-split-moves``; empty for 0).

    Example:
        >>> split_text(parse_args(["--nb-split-moves", "8"]))
        ", the NB arms' transitions ending with 8 smart-split / dumb-merge attempts (`split_moves=8`)"
        >>> split_text(parse_args([]))
        ''
    """
    count = getattr(args, "nb_split_moves", 0)
    if not count:
        return ""
    return f", the NB arms' transitions ending with {count} smart-split / dumb-merge attempts (`split_moves={count}`)"


def label_text(args: argparse.Namespace) -> str:
    """The report's words on the label steps that end every arm's transitions (``--label-steps``; empty for 0).

    Example:
        >>> label_text(parse_args([]))
        ', 2 label steps at the end of every transition (`label_steps=2`)'
    """
    steps = getattr(args, "label_steps", 0)
    if not steps:
        return ""
    return f", {steps} label step{'s' if steps > 1 else ''} at the end of every transition (`label_steps={steps}`)"


def schedule_text(args: argparse.Namespace) -> str:
    """The report's words on which transitions take the single-site sweep (``--schedule``; empty for ``random``).

    Example:
        >>> schedule_text(parse_args([]))
        ', single-site sweeps alternating with the moves (`schedule="alternate"`)'
        >>> schedule_text(parse_args(["--schedule", "auto"]))
        ', single-site sweeps alternating with the moves under 500 points (`schedule="alternate"`), at random above'
    """
    option = getattr(args, "schedule", "random")
    if option == "random":
        return ""
    where = f" under {ALTERNATE_BELOW} points" if option == "auto" else ""
    above = ", at random above" if option == "auto" else ""
    return f', single-site sweeps alternating with the moves{where} (`schedule="alternate"`){above}'


def cover_text(args: argparse.Namespace) -> str:
    """The report's words on what one neural sweep of the NB arms visits (``--nb-cover``).

    Example:
        >>> cover_text(parse_args(["--nb-cover", "every"]))
        'each neural sweep of the NB arms visits every pair of mixtures (m (m - 1) / 2 pair moves)'
    """
    if args.nb_cover == "every":
        return "each neural sweep of the NB arms visits every pair of mixtures (m (m - 1) / 2 pair moves)"
    return (
        "each neural sweep of the NB arms is one round of a round-robin tournament over the mixtures (m / 2 "
        + "disjoint pairs, each mixture in one; every pair once in m - 1 rounds, taken in turn: the kernel's "
        + "default, `cover=None`)"
    )


def mean_moves_text(args: argparse.Namespace) -> str:
    """The report's words on how every arm's single-site sweep moves the means (``--mean-moves``).

    Example:
        >>> mean_moves_text(parse_args(["--mean-moves", "walk"]))
        'the single-site sweep moves each mean by a random walk alone (`informed_means=False`, the sweep before)'
    """
    if args.mean_moves == "walk":
        return "the single-site sweep moves each mean by a random walk alone (`informed_means=False`, the sweep before)"
    return (
        "the single-site sweep follows each active mean's random walk with an informed MH move (the Gaussian of "
        + "one EM step; `informed_means=True`, the kernels' default)"
    )


def gibbs_arm_text(results: list[dict[str, Any]]) -> str:
    """The report's words on the Gibbs arm, where the record has it (else nothing).

    Example:
        >>> gibbs_arm_text([{"runs": {SM: []}}])
        ''
    """
    if GIBBS not in report_arms(results):
        return ""
    return (
        f" and `{GIBBS}` (split-merge's kernel at gibbs_prob=1: the single-site sweeps with their copy-set moves "
        + "and, where the runs have them, label steps; no other move)"
    )


def report(args: argparse.Namespace, results: list[dict[str, Any]], sources: dict[str, str]) -> str:
    """The markdown report: the setup, a row per case and arm, then the summaries per case and per size."""
    clock = "CPU time of each run's process" if args.clock == "cpu" else "wall time"
    arms_mixing = "the other arms " if GIBBS in report_arms(results) else ""
    setup = (
        f"Arms: `{NB_SET}` (`{args.proposal}`, {sources[NB_SET]}), `{SM}`, `{NB_OLD}` (`{args.old_proposal}`, "
        + f"{sources[NB_OLD]}){gibbs_arm_text(results)}; {arms_mixing}{mixing_text(args)}; {cover_text(args)}; in "
        + f"every arm {mean_moves_text(args)}, and each single-site sweep ends with the copy-set moves "
        + f"(`MixtureCopyMoves`, the kernels' default). Each run is one kernel of {args.chains} vectorized "
        + f"chains, every arm from the same {args.chains} starts, for {args.seconds:g} s of {clock} scaled by "
        + f"sqrt(m n / 3840) above 16 x 240 (at most {args.max_seconds:g} s); {args.threads} thread(s). Every "
        + "chain counts as a run. The robust level is split-merge's lower median over chains of the mean log "
        + f"joint over the last quarter of its run, minus {LEVEL_MARGIN:g} nats; `median time` is the lower median "
        + "over chains of the first time at it, a chain that never gets there counting as later than all; "
        + "`time / SM` is an arm's over split-merge's (`never`: the arm's median chain never got there; "
        + "`NB(set)/Gibbs`: NB(set)'s over Gibbs's, 0 where only Gibbs's never got there). The "
        + "posterior of M is over the second half of each run (chains weighted equally); a chain is `stuck` when "
        + "its M stays the same over the second half where split-merge's posterior gives that M under 0.5. "
        + reference_text(args)
        + f"`SM mode set`: the M that split-merge's chains cannot rank below their mode (within {TIE_SE:g} "
        + "between-chain standard errors of the gap, each chain's histogram a replicate); `stuck beyond SM "
        + f"spread`: stuck where that M's probability plus {TIE_SE:g} standard errors is under 0.5. "
        + "`P(miss) as good as SM`: the chance that a sampler whose chains reach the reference mode as often as "
        + "split-merge's (per case, the two arms' rate pooled) has fewer chains there than split-merge, i.e. misses "
        + "the mode target by chance (`exchangeable_miss_probability`); `fewer at mode: p`: a one-sided Fisher exact "
        + "test that NB(set) has fewer. `TV to SM reference`: the total-variation distance of an arm's pooled "
        + "posterior of M from the reference's (where the reference's chains did not mix, its own noise too). "
        + "`M changes`: the median over chains of the fraction of transitions that change M. Acceptance: NB's "
        + "proposal, split-merge's per move, Gibbs's copy-set moves. The model weighs its active mixtures equally, "
        + "so where the clusters' sizes differ (`unequal`, `scaled`) its posterior favours more mixtures than the "
        + "true clusters (copies on the large ones) and a log joint above the true state's: read the modes "
        + "against split-merge's first."
    )
    sections = [  # the summaries last: the end of the printed report
        ("Per case and arm", case_rows(results)),
        ("Per case", summary_rows(results)),
        ("Targets per size (NB(set); worst over the size's cases)", size_targets(results)),
    ]
    body = "".join(f"\n\n## {title}\n\n" + markdown_table(rows, list(rows[0])) for title, rows in sections)
    body += "\n" + mode_target_text(sections[-1][1]) + "\n\n" + distance_text(results)
    plots = "\n\n![log joint](gmm_scale_logjoint.png)\n\n![active mixtures](gmm_scale_active.png)\n"
    title = " vs ".join(RATIO_NAMES[label] for label in ARMS if label in report_arms(results))
    return f"# Open-universe GMMs at scale: {title}\n\n" + setup + body + plots


def rescore(folder: str | Path) -> dict[str, Any]:
    """Recompute a stored run's histogram metrics (:func:`spread_metrics`), time ratios and targets in place.

    Rewrites ``gmm_scale.json`` and ``gmm_scale.md`` in ``folder`` (the plots do not change). The run's
    options come from its record; its ``--threads``, which the record does not keep, reads as the default.

    Raises:
        ValueError: ``folder`` holds no ``gmm_scale.json`` of this benchmark.
    """
    path = Path(folder) / "gmm_scale.json"
    try:
        record = json.loads(path.read_text())
        results, config = record["results"], record["config"]
        for result in results:
            metrics = result["metrics"]
            sm_time = metrics[SM]["median time to level"]
            for label, extra in spread_metrics(result, metrics).items():
                metrics[label].update(extra)
                metrics[label]["time / SM"] = time_ratio(metrics[label]["median time to level"], sm_time)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a gmm_scale record: {error}") from error
    # (a record without these options ran at --gibbs-prob, its reference chains continued, NB's sweeps every pair,
    # the single-site sweeps' means by random walk alone, at random transitions)
    args = parse_args(
        ["--gibbs-share", "0", "--reference-start", "continued", "--nb-cover", "every", "--mean-moves", "walk"]
        + ["--schedule", "random", "--label-steps", "0"]
    )
    vars(args).update(config)
    record["targets"] = size_targets(results)
    write_json(path, record)
    write_report(folder, "gmm_scale.md", report(args, results, record["sources"]))
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (or rescore a stored run, ``--rescore``); write and return its record."""
    args = parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    unset = ("gibbs_share",) if not args.gibbs_share else ("gibbs_prob",)  # (earlier runs keep their folders)
    unset += ("reference_start",) if args.reference_start == "continued" else ()
    unset += ("nb_cover",) if args.nb_cover == "every" else ()
    unset += ("mean_moves",) if args.mean_moves == "walk" else ()
    unset += ("schedule",) if args.schedule == "random" else ()
    unset += ("label_steps",) if args.label_steps == 0 else ()
    unset += ("nb_split_moves",) if args.nb_split_moves == 0 else ()
    if args.gibbs_share:  # the calibration runs at setup (the records before session 36: in the first transition)
        args.share_calibration = "setup"
    config, folder = open_study(args, drop=("out", "threads", "workers", "rescore", *unset), arms=list(ARMS))
    cases = cell_families(args.mixtures, args.points, args.families_per_cell, args.families)
    sources = start_worker(args)
    planned = sum(planned_seconds(args, m, n) for m, n, _ in cases)
    print(
        f"{len(cases)} cases x {len(ARMS)} arms (+ split-merge's reference): {planned:.0f} s of planned sampling "
        + f"time ({planned / 60:.1f} min, "
        + f"{planned / 60 / args.workers:.1f} min on {args.workers} worker(s); setup, recording and the last "
        + "transition's overshoot come on top)"
    )
    results = run_cases(args, cases)
    record = {
        "config": config,
        "sources": sources,
        "planned_seconds": planned,
        "targets": size_targets(results),
        "results": results,
    }
    write_json(folder / "gmm_scale.json", record)
    time_label = "CPU seconds" if args.clock == "cpu" else "seconds"
    plot_cases(results, folder / "gmm_scale_logjoint.png", "log_joint", "log joint - truth", time_label)
    plot_cases(results, folder / "gmm_scale_active.png", "active", "active mixtures M", time_label)
    write_report(folder, "gmm_scale.md", report(args, results, sources))  # printed, the summaries at its end
    return record


if __name__ == "__main__":
    main()
