"""The one vocabulary of the kernels' ``diagnostics()`` dicts.

Every kernel in :mod:`neuralblock.kernels` (and :class:`neuralblock.priorswap.PriorSwap`) returns a
:class:`KernelDiagnostics` from ``diagnostics()``: a subset of the keys declared here, each with one
meaning and unit in every kernel. All counts and rates are post-warmup (the sampling phase) unless a
key says otherwise. Rates whose denominator is zero (no post-warmup transition yet) are ``0.0``.

Example:
    >>> from neuralblock.kernels import KernelDiagnostics
    >>> report: KernelDiagnostics = {"divergences": [], "acceptance_rate": 0.25, "transitions_per_second": 1e3}
    >>> sorted(set(report) - set(KernelDiagnostics.__annotations__))
    []
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["KernelDiagnostics", "per_second"]


class KernelDiagnostics(TypedDict, total=False):
    """The keys a kernel's ``diagnostics()`` may report (a kernel reports the subset that applies to it).

    Shared keys (the same quantity in every kernel that reports it):

    Attributes:
        divergences: post-warmup draw indices of divergent transitions (list of ints; ``[]`` for kernels
            without trajectories), as ``arviz.from_pyro`` reads it.
        acceptance_rate: fraction of post-warmup proposals accepted (overall; LWAKernel: its ``θ`` moves;
            MarginalRandomWalk: the mean acceptance probability), unitless in [0, 1].
        acceptance_by_proposal: NeuralBlockKernel's post-warmup acceptance rate per proposal label
            (``{label: fraction}``).
        acceptance_by_move: SplitMergeGMM's post-warmup acceptance rate per move type (``{move: fraction}``).
        transitions_per_second: post-warmup kernel transitions (calls of ``sample``) per second of
            sampling time (1/s).
        updates_per_second: elementary updates per second where a kernel counts a unit finer than a
            transition (1/s): single-site updates of all chains (Gibbs, RandomWalkMH, the gradient
            kernels), block proposals (NeuralBlockKernel, per second of block-move time), move attempts
            (SplitMergeGMM, per second of move time).
        data_fraction: mean fraction of the data evaluated per transition (AusterityMH: sections used /
            ``N``; LWAKernel: ``|U| / N``), unitless in [0, 1].
        nonfinite_rejections: post-warmup proposals rejected for a non-finite log acceptance ratio (count).
        chains: vectorized chains the kernel runs in one state (count).
        compile_seconds: time spent compiling fused updates (s).
        step_size: the proposal step size after warmup (in the kernel's unconstrained units; AusterityMH
            reports NaN before its adapter exists).
        mean_step_size: the mean of per-variable (or per-site) step sizes after warmup (unconstrained units).
        single_site_sweeps: post-warmup single-site sweeps interleaved with block moves (count).
        gibbs_prob: the probability of a single-site sweep per transition in use (NeuralBlockKernel,
            SplitMergeGMM; with ``gibbs_share``, the calibrated one).
        schedule: which transitions take the single-site sweep, ``"random"`` or ``"alternate"``
            (NeuralBlockKernel, SplitMergeGMM; :func:`~neuralblock.kernels.adaptation.single_site_turn`).
        gibbs_share_seconds: with ``gibbs_share``, the timed seconds of one single-site sweep and one sweep
            of the kernel's moves (``{"single_site": s, "moves": s}``; empty otherwise).
        transitions: post-warmup transitions (AusterityMH; count).
        copy_move_acceptance: post-warmup acceptance of the copy-set moves that end the compiled single-site
            sweeps of an open-universe GMM (NeuralBlockKernel, SplitMergeGMM; ``{"split": fraction, "merge":
            fraction}``, NaN where none was attempted; see :mod:`neuralblock.kernels.mixture_copies`).
        split_move_acceptance: acceptance of each kind of the smart splits and dumb merges that end a
            :class:`~neuralblock.NeuralBlockKernel`'s transitions (``split_moves > 0``), warmup included.
        informed_mean_acceptance: post-warmup mean acceptance probability of the informed mean moves of the
            compiled single-site sweeps of an open-universe GMM (NeuralBlockKernel, SplitMergeGMM; NaN before
            any; see :mod:`neuralblock.kernels.mixture_sites`).

    Kernel-specific keys:

    Attributes:
        sweeps: GibbsKernel's post-warmup sweeps, one per transition (count).
        stuck_conditionals: GibbsKernel's single-site conditionals with no finite entry, kept unchanged
            (count).
        steps: the gradient kernels' post-warmup steps, one per transition (count).
        changes_per_step: the gradient kernels' mean variables changed per step and chain.
        path_length: PathAuxiliarySampler's (largest) path length (single-site moves per step).
        instances: NeuralBlockKernel's block instances per proposal label (``{label: count}``).
        discarded_proposals: NeuralBlockKernel's block draws discarded unused, made at a state an earlier
            accepted block in the same class changed (count).
        fused: NeuralBlockKernel's proposals that run a fused (table or continuous) path
            (``{label: bool}``).
        proposal_cache: NeuralBlockKernel's table cache per fused discrete proposal label (``{label: {"rows",
            "computed", "prefilled", "evictions": counts, "slots": bool}}``).
        proposed: SplitMergeGMM's post-warmup proposals per move type (``{move: count}``).
        unavailable: SplitMergeGMM's post-warmup attempts per move type that had no valid move
            (``{move: count}``).
        compiled_moves: whether SplitMergeGMM's split-merge sweeps run as one compiled loop (bool).
        blocks: CompoundKernel's inner kernels' diagnostics, keyed ``"<b> (<kernel class>)"`` in block
            order (``{label: diagnostics}``: a KernelDiagnostics for our kernels, Pyro's own keys for its HMC/NUTS).
        visits: CompoundKernel's visits of each block, in block order (list of counts; warmup included).
        inner: ReplicaExchange's inner kernel's diagnostics (a KernelDiagnostics).
        temperatures: ReplicaExchange's temperature ladder ``1 = T_1 < ... < T_R``, coldest first (list).
        swap_acceptance: ReplicaExchange's post-warmup swap acceptance per neighbouring pair (list of
            fractions).
        replicas: ReplicaExchange's number of temperatures (count).
        tempered_proposals: whether ReplicaExchange's neural proposals read tempered tables (bool).
        tempered_sweeps: ReplicaExchange's fused sweeps whose chains read their temperature's tables
            (count; warmup included).
        tempered_tables: how many of ReplicaExchange's temperatures have powered proposal rows (count; 0: none).
        zero_penalty: ReplicaExchange's cost (nats) of a zero table entry at the hottest replica, whose
            zeros are softened, or ``None`` (tempered powers ``p(x)^beta``).
        block_acceptance_by_temperature: ReplicaExchange's neural block acceptance per temperature (list of
            fractions, NaN at temperatures whose replicas took no neural sweep; fused path only).
        path_change_rate: ParticleGibbs's mean fraction of the path changed per sweep.
        mean_relative_ess: ParticleGibbs's mean relative effective sample size of the particles per sweep.
        degenerate_steps: ParticleGibbs's time steps whose particle weights were all zero or non-finite
            (count).
        subset_acceptance_rate: LWAKernel's fraction of post-warmup ``U`` proposals accepted.
        subset_refresh_rate: LWAKernel's mean fraction of ``U``'s points replaced per transition (can
            exceed 1: summed over the ``subset_steps`` updates).
        subset_renewals: LWAKernel's renewals of ``U`` (times ``U`` shared under half its points with ``U``
            at the previous renewal; count).
        remote_jumps_accepted: LWAKernel's accepted remote jumps of ``U`` (fresh subsets; count).
        remote_acceptance_rate: LWAKernel's fraction of remote ``U`` jumps accepted.
        model_evals: LWAKernel's post-warmup evaluations of the subset log density (count).
        mean_sections_used: AusterityMH's mean likelihood sections evaluated per transition (count).
        mean_stages: AusterityMH's mean sequential-test stages (mini-batches) per transition.
        decided_early_fraction: AusterityMH's fraction of transitions decided before all sections.
        mean_error_bound: AusterityMH's mean bound on the probability of a wrong accept decision.
        sublinear: whether AusterityMH evaluates sections lazily (bool).
        direct_path: whether AusterityMH evaluates sections through the compiled direct likelihood path (bool).
        control_variate: whether AusterityMH subtracts a Taylor control variate (bool).
        audited_decisions: AusterityMH's audited accept decisions (re-run on all data; count).
        audited_error_rate: AusterityMH's fraction of audited decisions that differ from exact MH (NaN
            without audits).
        audited_false_accepts: AusterityMH's audited decisions that accepted where exact MH rejects (count).
        audit_time_fraction: AusterityMH's share of sampling time spent in audits.
        audit_build_seconds: AusterityMH's time spent building the audit's exact evaluator (s).
        normality_skewness: AusterityMH's normality check: median skewness of the section log-ratios.
        normality_excess_kurtosis: AusterityMH's normality check: median excess kurtosis.
        normality_batch_skewness: AusterityMH's normality check: skewness of a mini-batch mean.
        normality_batch_excess_kurtosis: AusterityMH's normality check: excess kurtosis of a mini-batch mean.
        normality_ok: AusterityMH's normality check passed (bool).
        ess_per_draw: PriorSwap's worst-coordinate effective sample size per post-warmup draw (NaN for
            short runs).
        num_divergences: PriorSwap's (HMC/NUTS) divergent transitions (count).
        mean_accept_prob: PriorSwap's (HMC/NUTS) mean acceptance probability.
        evaluations_per_iteration: PriorSwap's (elliptical) mean density evaluations per transition.
        stuck_iterations: PriorSwap's (elliptical) transitions that hit the shrink limit (count).
        leapfrog_steps: the NUTS kernel's mean leapfrog steps per post-warmup draw.
    """

    # shared
    divergences: list[int]
    acceptance_rate: float
    acceptance_by_proposal: dict[str, float]
    acceptance_by_move: dict[str, float]
    transitions_per_second: float
    updates_per_second: float
    data_fraction: float
    nonfinite_rejections: float
    chains: float
    compile_seconds: float
    step_size: float
    mean_step_size: float
    single_site_sweeps: float
    gibbs_prob: float
    schedule: str
    gibbs_share_seconds: dict[str, float]
    transitions: float
    copy_move_acceptance: dict[str, float]
    split_move_acceptance: dict[str, float]
    informed_mean_acceptance: float
    # GibbsKernel and the gradient kernels
    sweeps: float
    stuck_conditionals: float
    steps: float
    changes_per_step: float
    path_length: float
    # NeuralBlockKernel
    instances: dict[str, int]
    discarded_proposals: float
    fused: dict[str, bool]
    proposal_cache: dict[str, dict[str, int | bool]]
    # SplitMergeGMM
    proposed: dict[str, float]
    unavailable: dict[str, float]
    compiled_moves: bool
    # CompoundKernel
    blocks: dict[str, dict[str, Any]]
    visits: list[int]
    # ReplicaExchange
    inner: KernelDiagnostics
    temperatures: list[float]
    swap_acceptance: list[float]
    replicas: float
    tempered_proposals: bool
    tempered_sweeps: int
    tempered_tables: int
    zero_penalty: float | None
    block_acceptance_by_temperature: list[float]
    # ParticleGibbs
    path_change_rate: float
    mean_relative_ess: float
    degenerate_steps: float
    # LWAKernel
    subset_acceptance_rate: float
    subset_refresh_rate: float
    subset_renewals: float
    remote_jumps_accepted: float
    remote_acceptance_rate: float
    model_evals: float
    # AusterityMH
    mean_sections_used: float
    mean_stages: float
    decided_early_fraction: float
    mean_error_bound: float
    sublinear: bool
    direct_path: bool
    control_variate: bool
    audited_decisions: float
    audited_error_rate: float
    audited_false_accepts: float
    audit_time_fraction: float
    audit_build_seconds: float
    normality_skewness: float
    normality_excess_kurtosis: float
    normality_batch_skewness: float
    normality_batch_excess_kurtosis: float
    normality_ok: bool
    # PriorSwap
    ess_per_draw: float
    num_divergences: float
    mean_accept_prob: float
    evaluations_per_iteration: float
    stuck_iterations: float
    # NUTS
    leapfrog_steps: float


def per_second(count: float, seconds: float) -> float:
    """The rate of ``count`` events in ``seconds`` (1/s), ``0.0`` when no time was spent.

    Example:
        >>> per_second(50, 0.5), per_second(0, 0.0)
        (100.0, 0.0)
    """
    return count / seconds if seconds > 0 else 0.0
