"""Neural block MCMC: MH with meta-learned MDN block proposals, mixed with single-site updates.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch, pyro
    >>> from pyro.infer import MCMC
    >>> from neuralblock import FactorGraph
    >>> from neuralblock.motif import BlockSpec, Motif, MotifInstances
    >>> from neuralblock.proposals import NeuralBlockProposal
    >>> class Pair(Motif):  # two neighbouring binary variables, conditioned on nothing
    ...     name, block_spec, feature_dim = "pair-doc", BlockSpec([2, 2]), 1
    ...     def options(self): return {}
    ...     def find_instances(self, fg):
    ...         return MotifInstances(torch.tensor([[0, 1]]), torch.full((1, 1), -1), torch.zeros(1, 0))
    ...     def encode(self, fg, instances, state): return torch.zeros(state.shape[:-1] + (len(instances), 1))
    ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
    >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
    >>> _ = fg.add_table_factor([0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    >>> kernel = NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(Pair(), components=2, hidden=(8,))])
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> sorted(kernel.diagnostics()["acceptance_by_proposal"])
    ['pair-doc']
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from neuralblock._memo import LastInputs
from neuralblock.graph import BlockScaffold, FactorGraph
from neuralblock.graph.supports import is_real
from neuralblock.kernels.adaptation import GibbsShare, check_schedule, single_site_turn
from neuralblock.kernels.base import GraphKernel, check_probability
from neuralblock.kernels.functional import MHInfo, mh_accept, nonfinite_ratios, speculative_width
from neuralblock.kernels.fused_blocks import FusedBlockSweep, supports_fused
from neuralblock.kernels.fused_continuous import FusedContinuousSweep, supports_fused_continuous
from neuralblock.kernels.fused_mixture import FusedMixtureSweep, mixture_layout, pair_rounds, supports_fused_mixture
from neuralblock.kernels.fused_sampled import FusedSampledSweep, supports_fused_sampled
from neuralblock.kernels.gibbs import SoftZeros, resolve_compile
from neuralblock.kernels.mixture_labels import check_label_steps
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import MixtureSplitMoves
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second
from neuralblock.motif import Motif, MotifInstances
from neuralblock.proposals import NeuralBlockProposal

__all__ = [
    "NeuralBlockKernel",
    "disjoint_covers",
    "neural_block_step",
    "propose_blocks",
    "speculative_block_step",
    "speculative_width",
]

_RATE_SMOOTHING = 0.05  # per class, for the running fraction of classes that accept
_MAX_SPECULATIVE_ENTRIES = 1 << 24  # state copies (blocks x variables) one speculative batch may hold
_Fused = FusedBlockSweep | FusedSampledSweep | FusedContinuousSweep | FusedMixtureSweep
RowPart = tuple[Tensor, Tensor | None, SoftZeros | None]  # some chains, their beta and their SoftZeros


@dataclass
class _BlockClass:
    """One colour class of one proposal's motif instances."""

    instances: MotifInstances
    scaffold: BlockScaffold
    flat_blocks: Tensor
    members: Tensor


@dataclass
class _Sweep:
    """One proposal's instances in sweep order (class by class), for speculative batches of classes."""

    instances: MotifInstances
    scaffold: BlockScaffold
    offsets: Tensor  # [C + 1] first instance of each class
    class_of: Tensor  # [I]
    order: Tensor  # [I] positions in the motif's own instance order


def propose_blocks(
    fg: FactorGraph, proposal: NeuralBlockProposal, instances: MotifInstances, state: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw a proposal for every instance's block from the MDN, all at ``state``.

    Motifs with a whitening map (:meth:`~neuralblock.motif.Motif.block_affine`) propose
    ``B = loc + L u`` with ``u ~ q``; the map depends only on ``C`` and ``Psi``, so its
    Jacobian is the same both ways and cancels in the MH ratio.

    Args:
        fg: the graph.
        proposal: the neural block proposal.
        instances: the motif instances (any, conflicting or not).
        state: the current state ``[n]``, or states of chains ``[K, n]``.

    Returns:
        ``(proposed [..., I, b], current [..., I, b], log q(B | C) - log q(B' | C) [..., I])``.
    """
    with torch.no_grad():
        features, affine = proposal.motif.encode_with_affine(fg, instances, state)
        expected = state.shape[:-1] + instances.blocks.shape[:-1]
        if features.shape[:-1] != expected:
            shape = ", ".join(str(d) for d in expected)
            raise ValueError(
                f"motif {proposal.motif.name} encoded {len(instances)} instances as features of shape "
                f"{tuple(features.shape)}; expected [{shape}, feature_dim]"
            )
        q = proposal(features.to(proposal.dtype))  # e.g. float64 states, float32 network
        current = state[..., instances.blocks]
        if affine is None:
            proposed = q.sample().to(state.dtype)
            log_q_fwd, log_q_rev = q.log_prob(torch.stack([proposed, current])).unbind(0)
        else:
            loc, tril = affine
            u_new = q.sample().to(state.dtype)
            proposed = loc + (tril @ u_new.unsqueeze(-1)).squeeze(-1)
            u_cur = torch.linalg.solve_triangular(tril, (current - loc).unsqueeze(-1), upper=False).squeeze(-1)
            log_q_fwd, log_q_rev = q.log_prob(torch.stack([u_new, u_cur])).unbind(0)
    return proposed, current, log_q_rev - log_q_fwd


def neural_block_step(
    fg: FactorGraph,
    proposal: NeuralBlockProposal,
    instances: MotifInstances,
    scaffold: BlockScaffold,
    state: Tensor,
    beta: Tensor | None = None,
) -> tuple[Tensor, MHInfo]:
    """Propose and accept every block of one conflict-free class at once.

    One batched MDN forward pass proposes all blocks (:func:`propose_blocks`); one batched
    scaffold evaluation scores current and proposed blocks; one vectorized MH test accepts
    each block by its own exact ratio ``p(B') q(B | C) / (p(B) q(B' | C))``. The
    conditioning set ``C`` does not change when ``B`` does, so the reverse proposal uses
    the same ``q``.

    Args:
        fg: the graph.
        proposal: the neural block proposal.
        instances: the class's motif instances (pairwise non-conflicting).
        scaffold: ``fg.scaffold(instances.blocks)``.
        state: the current state ``[n]``, or states of chains ``[K, n]``.
        beta: optional ``[K]`` inverse temperatures (each chain's target is ``p(x)^beta``).

    Returns:
        The new state and the :class:`MHInfo` of the class (``[..., I]`` entries).
    """
    proposed, current, log_q_ratio = propose_blocks(fg, proposal, instances, state)
    with torch.no_grad():
        pair = torch.stack([state, state])
        pair[1][..., instances.blocks] = proposed
        local = scaffold.local_log_density(fg, pair)
        change = local[1] - local[0]
        if beta is not None:
            change = change * beta[:, None].to(change.dtype)
        info = mh_accept(change + log_q_ratio.to(local.dtype))
    new_state = state.clone()
    new_state[..., instances.blocks] = torch.where(info.accepted[..., None], proposed, current)
    return new_state, info


def speculative_block_step(
    fg: FactorGraph,
    proposal: NeuralBlockProposal,
    instances: MotifInstances,
    scaffold: BlockScaffold,
    class_of: Tensor,
    state: Tensor,
) -> tuple[Tensor, int, MHInfo]:
    """Run consecutive conflict-free classes in one batch, up to the first class that accepts.

    A sweep applies the classes one after the other, each an exact MH kernel at the state
    the previous ones left. When most proposals are rejected, that state rarely changes:
    this step proposes every block of the next classes at the current state, scores each
    against the state in which only it changed (:meth:`BlockScaffold.local_log_density_rows`)
    and tests them all. The classes before the first one with an accepted block kept the
    state, so their decisions, and that class's, are exactly those of the sequential sweep;
    the later classes' draws are discarded (they were made at a state that is no longer
    current) and the caller proposes them again. The chain's law is that of the sequential
    sweep, whatever the number of classes batched.

    Args:
        fg: the graph.
        proposal: the neural block proposal.
        instances: the instances of the classes, class by class in sweep order.
        scaffold: their scaffold, in the same order.
        class_of: ``LongTensor [I]`` class of each instance, ``0, 0, 1, ...`` (non-decreasing).
        state: the current state ``[n]``.

    Returns:
        The new state, the number of classes whose decisions were used, and the
        :class:`MHInfo` of those classes' blocks.

    Example:
        >>> from neuralblock.motif import BlockSpec, Motif
        >>> class Single(Motif):  # one binary variable, no context
        ...     name, block_spec, feature_dim = "single-doc", BlockSpec([2]), 1
        ...     def options(self): return {}
        ...     def find_instances(self, fg): raise NotImplementedError
        ...     def encode(self, fg, instances, state): return torch.zeros(len(instances), 1)
        ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> _ = fg.add_table_factor([0, 1], torch.tensor([[3.0, 0.0], [0.0, 3.0]]))
        >>> inst = MotifInstances(torch.tensor([[0], [1]]), torch.full((2, 1), -1), torch.zeros(2, 0))
        >>> q = NeuralBlockProposal(Single(), components=1, hidden=(4,))
        >>> state, used, info = speculative_block_step(
        ...     fg, q, inst, fg.scaffold(inst.blocks), torch.tensor([0, 1]), torch.zeros(2))
        >>> used in (1, 2), len(info.accepted) == used
        (True, True)
    """
    proposed, _, log_q_ratio = propose_blocks(fg, proposal, instances, state)
    with torch.no_grad():
        rows = torch.arange(len(instances))
        changed = state.expand(len(instances), -1).clone()
        changed[rows[:, None], instances.blocks] = proposed
        new_local = scaffold.local_log_density_rows(fg, changed)
        log_alpha = new_local - scaffold.local_log_density(fg, state) + log_q_ratio.to(new_local.dtype)
        info = mh_accept(log_alpha)
    hits = class_of[info.accepted]
    last = int(hits.min()) if hits.numel() else int(class_of[-1])
    used = class_of <= last
    keep = info.accepted & used  # only class ``last`` can have accepted blocks among the used ones
    new_state = state.clone()
    new_state[instances.blocks[keep]] = proposed[keep]
    nonfinite = int(nonfinite_ratios(log_alpha[used]).sum())
    return new_state, last + 1, MHInfo(info.accepted[used], info.accept_prob[used], nonfinite)


def disjoint_covers(blocks: Tensor) -> list[Tensor]:
    """Split instances into maximal sets of disjoint blocks ("covers"), until every instance is in one.

    Each cover is built greedily: first the instances no earlier cover holds, then the others, each
    taken when it shares no variable with the blocks taken so far. On a grid of 2x2 windows this gives
    the four tilings by 2x2 windows (shifted by a row, a column or both: the shifted ones leave the
    edge rows or columns out); on a chain of pairs, the two tilings. Where instances cannot be split
    into such tilings (odd cycles), some instances are in several covers. Setup-time Python (one pass
    over the instances per cover).

    Args:
        blocks: ``[I, b]`` variable ids of each instance's block.

    Returns:
        Instance indices of each cover (together they hold every instance at least once).

    Example:
        >>> [c.tolist() for c in disjoint_covers(torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]]))]
        [[0, 2], [1, 3]]
    """
    rows = [tuple(row) for row in blocks.tolist()]
    held = [False] * len(rows)
    covers: list[Tensor] = []
    while not all(held):
        taken: set[int] = set()
        chosen = []
        for i in [i for i in range(len(rows)) if not held[i]] + [i for i in range(len(rows)) if held[i]]:
            if taken.isdisjoint(rows[i]):
                taken.update(rows[i])
                chosen.append(i)
        for i in chosen:
            held[i] = True
        covers.append(torch.tensor(sorted(chosen), dtype=torch.long))
    return covers


def _check_blocks(fg: FactorGraph, motif: Motif, instances: MotifInstances, latent: set[int]) -> None:
    """Reject instances the neural block step cannot update exactly, naming the motif and the problem."""
    blocks, context, n = instances.blocks, instances.context, fg.num_variables
    if blocks.is_floating_point() or context.is_floating_point():
        raise TypeError(f"motif {motif.name} returned non-integer variable ids")
    if len(instances) == 0:
        return
    if blocks.min() < 0 or blocks.max() >= n:
        raise ValueError(f"motif {motif.name} returned block variable ids outside 0..{n - 1}")
    if context.numel() and (context.min() < -1 or context.max() >= n):
        raise ValueError(f"motif {motif.name} returned context ids outside -1..{n - 1} (-1 pads)")
    if (blocks.sort(-1).values.diff(dim=-1) == 0).any():
        raise ValueError(f"motif {motif.name} returned a block that holds the same variable twice")
    expected = torch.tensor(motif.block_spec.cardinalities, dtype=torch.long)
    if not (fg.cardinalities[blocks] == expected).all():
        raise ValueError(f"motif {motif.name} found blocks whose domains differ from its block spec {expected}")
    observed = sorted({int(v) for v in blocks.reshape(-1).tolist()} - latent)
    if observed:
        raise ValueError(f"motif {motif.name} proposed a block containing observed variable {fg.names[observed[0]]!r}")
    bounded = [v for v in blocks[:, expected == 0].unique().tolist() if not is_real(fg.support(v))]
    if bounded:
        raise ValueError(
            f"motif {motif.name} proposes Gaussian moves for {fg.names[bounded[0]]!r}, whose support is "
            f"{fg.support(bounded[0])}: neural blocks move continuous variables on the real line only "
            "(model the variable unconstrained, e.g. its log)"
        )


class NeuralBlockKernel(GraphKernel):
    """MH with neural block proposals over every motif instance, mixed with single-site updates.

    At ``setup`` each proposal's motif finds its instances in the model's factor graph
    (any size). Instances are coloured so that no instance writes a variable another
    one in its class reads (block, Markov blanket or motif context); each class is
    then proposed and accepted as one batch, in all chains at once. Each
    transition is, with probability ``gibbs_prob`` (or, with ``schedule="alternate"``, deterministically at that
    rate), a single-site sweep (Gibbs for discrete latent variables, random-walk MH for continuous ones) and
    otherwise a neural sweep over all proposals' classes. Both are exact MH/Gibbs kernels, so
    the mixture (or the sequence) leaves the target invariant.

    **Fused path.** Discrete blocks of at most 512 joint values on table factors (e.g. the
    ``grid`` motifs) are updated by one fused function per class
    (:mod:`neuralblock.kernels.fused_blocks`): the MDN's proposal is enumerated over the joint
    block values and cached per (instance, context value), the scaffold energy is read from
    the tables, and the classes are padded to one shape so that ``compile=True`` compiles
    one function per graph. Discrete blocks with more joint values on the same graphs (``crf_tags``
    with 3 or 4 tags) take the sampled fused path (:mod:`neuralblock.kernels.fused_sampled`): the MDN's
    mixture parameters are cached per (instance, context value), a block is drawn by inverse CDF and
    scored by the same steps, and the energy of the two values is read from the tables. Continuous blocks of
    a motif with a pure context encoder whose
    scaffolds are linear-Gaussian or log-linear-Gaussian rows (e.g. the ``chain`` motif) take
    the fused continuous path (:mod:`neuralblock.kernels.fused_continuous`): one function per
    class gathers the context, whitens, runs the MDN, draws and scores the block both ways,
    evaluates the scaffold energy, accepts and scatters. Pairs of open-universe mixtures
    (``gmm_pair`` on a :func:`motifs.gmm_pair.gmm_graph`) take the fused mixture path
    (:mod:`neuralblock.kernels.fused_mixture`): the other mixtures' share of every point's
    factor is computed once and serves both the proposal's context and the energy; on CPU states a
    ``gmm_pair_set`` proposal's pairs run as one compiled loop per sweep (:mod:`neuralblock.kernels.jit_mixture`,
    where Numba is installed), pair by pair, so nothing is proposed twice and ``window`` does not apply; there each
    pair's proposal also mixes in data-refined candidates built from the conditioning set (network components
    and copies of the other mixtures, refined on the points and weighted by their Laplace mass:
    :class:`~neuralblock.kernels.jit_mixture.CandidateOptions`, ``FusedMixtureSweep.candidates``). Other blocks
    (larger, other scaffolds) take the general path: one batched MDN pass, one batched scaffold
    evaluation and one vectorized MH test per class.

    When classes are many and rarely accept (e.g. ``gmm_pair``, whose pairs all share the
    points), runs of consecutive classes are proposed and tested in one batch and kept up
    to the first class that accepts: the same chain, with far fewer network passes (on the
    fused mixture path each chain keeps its own first accepted pair, and the moves before it that only
    redraw two inactive mixtures' means, so chains move through the sweep at their own pace; on the
    general path, :func:`speculative_block_step`, one chain).
    ``window`` sets how many classes a batch holds; by default it follows the recent rate of
    accepting classes (:func:`speculative_width`; one class at a time when most accept).

    Args:
        model: a :class:`FactorGraph` or a Pyro model.
        proposals: the neural block proposals (e.g. from :func:`neuralblock.load_pretrained`).
        gibbs_prob: probability of a single-site sweep per transition (the share of such transitions, with
            ``schedule="alternate"``).
        step_size: initial random-walk step for continuous single-site updates.
        window: classes per speculative batch (``1`` turns batching of classes off);
            ``None`` adapts it to the recent fraction of classes that accept
            (:func:`speculative_width`).
        chains: independent chains run together in one ``[chains, n]`` state.
        device: where the state, the proposals and the index tensors live (e.g. ``"cuda"``).
        compile: run the fused updates under ``torch.compile`` (``"auto"``: on GPUs only).
        fused: use the fused path where it applies (``False`` forces the general path, e.g.
            to compare the two).
        cover: each neural sweep updates one *cover* of a proposal's instances, a maximal set of
            disjoint blocks (:func:`disjoint_covers`; on a grid of 2x2 windows, one of the four
            tilings), taking the covers in turn, instead of every instance (``False``; on a grid
            each variable then lies in four overlapping windows). A cover sweep costs a fraction of a
            full one and moves each of its blocks' variables once (on a 10x10 grid the four tilings hold
            100, 80, 80 and 64 of them); each is an exact MH kernel, so any order of them leaves the
            target invariant. Covers run on the fused block and mixture paths and the general path (``True``
            refuses other paths; ``"auto"`` uses covers where they run and every instance elsewhere). On the
            mixture path a cover is a round of a round-robin tournament
            (:func:`~neuralblock.kernels.fused_mixture.pair_rounds`): ``m / 2`` disjoint pairs, each mixture in
            one, all pairs once in ``m - 1`` rounds (with ``fused=False``: :func:`disjoint_covers`).
            ``None`` (the default): rounds on the mixture path and every instance elsewhere. A GMM's pairs are
            ``m (m - 1) / 2`` moves that each read every point, so a sweep of them all costs tens of single-site
            sweeps at ``n = 1000`` (21-55 at ``m = 16-32``) and ``gibbs_prob`` would weigh them far above the
            single-site sweeps; a round costs a few (2-4.5 on the GMM benchmark at scale, seed 13; 1.5-3.9
            on seed 15, with the token network taken in blocks).
        copy_moves: on an open-universe GMM, end each compiled single-site sweep with copy-set moves
            (:mod:`neuralblock.kernels.mixture_copies`; ignored on other models).
        informed_means: on an open-universe GMM, follow each active mixture's random-walk updates in each
            compiled single-site sweep with an informed MH move of its mean (the Gaussian of one EM step,
            :mod:`neuralblock.kernels.mixture_sites`; ignored on other models).
        split_moves: on an open-universe GMM on the CPU, this many smart-split / dumb-merge attempts
            (:class:`~neuralblock.kernels.split_merge.MixtureSplitMoves`) end every transition of an untempered
            kernel not split by ``neural_rows`` (0, the default: none; ignored with a warning on other models and
            devices; not part of ``gibbs_share``'s timing). On a held-out 20 x 1000 GMM, 8 of them took 4 chains that
            had settled at too few copies of the large clusters (M = 9-10, where split-merge's reference chains sat
            at 14-16) to M >= 13 within 3-22 transitions, where without them none left in 678. But they cost about
            11 ms for 10 chains there, and on a fresh seed's cases without such chains NB took 1.44x its time to
            split-merge's level with them, so they are off by default (``experiments/results/gmm_scale/README.md``,
            session 65).
        label_steps: on an open-universe GMM, label steps at the end of every transition of CPU states (each
            compiled single-site sweep, and each neural sweep of a kernel that is not tempered and not split by
            ``neural_rows``): exact Gibbs draws of the points' labels, then of every mean at once (an inactive one
            from its prior; :mod:`neuralblock.kernels.mixture_labels`; 0: none; ignored on other models).
        gibbs_share: instead of ``gibbs_prob``, the share of the sampling time single-site sweeps should
            take: before the first transition both sweeps are timed on copies of the start, and
            ``gibbs_prob`` is set from their costs and kept (:class:`~neuralblock.kernels.adaptation.GibbsShare`;
            the chosen value is in ``diagnostics()["gibbs_prob"]``). The timing runs at ``setup`` (in no
            transition's time) and replaces ``gibbs_prob``; a seed then no longer fixes the run. Where a
            neural sweep costs many single-site sweeps (a GMM's pairs at n = 1000 points), ``gibbs_prob = 0.5``
            spends nearly all the time on neural sweeps.
        schedule: which transitions take the single-site sweep: ``"random"`` (each with probability
            ``gibbs_prob``) or ``"alternate"`` (deterministically at the same rate, the neural sweep first:
            :func:`~neuralblock.kernels.adaptation.single_site_turn`). On the GMM benchmark's fresh cases it took
            NB 0.75-0.84 of its time to split-merge's level with random transitions on models of 60-240 points
            (session 63), and 0.63-0.77 at 1000 points with the label steps (session 66: a single-site sweep
            first prunes a random start to a few mixtures; ``experiments/results/gmm_scale/README.md``). On
            open-universe GMMs use ``"alternate"``.
    """

    batched_state = True

    def __init__(
        self,
        model: FactorGraph | Callable,
        proposals: Sequence[NeuralBlockProposal],
        gibbs_prob: float = 0.5,
        step_size: float = 0.5,
        window: int | None = None,
        chains: int = 1,
        device: str | torch.device | None = None,
        compile: bool | str = "auto",
        fused: bool = True,
        cover: bool | str | None = None,
        copy_moves: bool = True,
        gibbs_share: float | None = None,
        informed_means: bool = True,
        schedule: str = "random",
        label_steps: int = 2,
        split_moves: int = 0,
    ) -> None:
        super().__init__(model, chains=chains, device=device)
        self.schedule = check_schedule(schedule)
        if isinstance(split_moves, bool) or not isinstance(split_moves, int):
            raise TypeError(f"split_moves must be an int, got {type(split_moves).__name__}")
        if split_moves < 0:
            raise ValueError(f"split_moves must be at least 0, got {split_moves}")
        self._split_arg = split_moves  # (the moves themselves: split_moves, set at setup)
        self.split_moves: MixtureSplitMoves | None = None
        self._copy_moves = bool(copy_moves)  # (the moves themselves: single_site.copy_moves)
        self._informed_means = bool(informed_means)
        self._label_steps = check_label_steps(label_steps)  # (the moves themselves: single_site.label_moves)
        self.use_fused = bool(fused)
        if not isinstance(cover, bool) and cover not in ("auto", None):
            raise TypeError(f"cover must be True, False, 'auto' or None, got {cover!r}")
        self.cover = cover
        self.cover_classes: list[list[tuple[int, int]]] = []  # per proposal: each cover's classes (first, last)
        if isinstance(proposals, NeuralBlockProposal):
            raise TypeError("proposals must be a list of NeuralBlockProposal objects: pass [proposal]")
        try:
            proposals = list(proposals)
        except TypeError as err:
            raise TypeError(
                f"proposals must be a list of NeuralBlockProposal objects, got {type(proposals).__name__}"
            ) from err
        if not proposals:
            raise ValueError("NeuralBlockKernel needs at least one proposal")
        for p in proposals:
            if not isinstance(p, NeuralBlockProposal):
                raise TypeError(f"proposals must be NeuralBlockProposal objects, got {type(p).__name__}")
        gibbs_prob = check_probability("gibbs_prob", gibbs_prob)
        if not (isinstance(step_size, (int, float)) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"step_size must be a positive finite number, got {step_size!r}")
        self.proposals = [p.eval().to(self.device) for p in proposals]
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        self.gibbs_prob = float(gibbs_prob)
        self.share_calibration = None if gibbs_share is None else GibbsShare(gibbs_share)
        self._share_pending = False  # set by _prepare: calibrate gibbs_prob at setup
        self.step_size = float(step_size)
        self.window = window
        self.compile = resolve_compile(compile, self.device)
        self.beta: Tensor | None = None  # per-chain inverse temperatures (set by ReplicaExchange)
        self.soft_zeros: SoftZeros | None = None  # per-chain log-potentials of zero entries (ReplicaExchange)
        # chains that take the neural sweeps (None: all); the others take a single-site sweep instead (ReplicaExchange)
        self.neural_rows: Tensor | None = None
        self._row_split = LastInputs[tuple[RowPart, RowPart]]()  # the last _split_rows
        self._rows_lead = False  # whether the last _split_rows' neural chains are the first ones
        self.num_instances: list[int] = []  # set at setup
        self.fused: list[_Fused | None] = []
        self._reset_stats()  # diagnostics() and logging() answer before setup (e.g. in the parent of worker chains)

    def _label(self, i: int) -> str:
        name = self.proposals[i].motif.name
        same = [j for j, p in enumerate(self.proposals) if p.motif.name == name]
        return name if len(same) == 1 else f"{name}#{same.index(i)}"

    def _prepare(self, fg: FactorGraph) -> None:
        self._share_pending = self.share_calibration is not None
        latent = set(fg.latent.tolist())
        self.block_classes: list[list[_BlockClass]] = []
        self.sweeps: list[_Sweep | None] = []  # None where the proposal takes a fused path
        self.fused = []
        self.num_instances = []
        self.cover_classes = []
        for proposal in self.proposals:
            motif = proposal.motif
            instances = motif.find_instances(fg)
            blocks = instances.blocks
            if blocks.dim() != 2 or blocks.shape[1] != motif.block_spec.size:
                raise ValueError(f"motif {motif.name} returned blocks of shape {tuple(blocks.shape)}")
            _check_blocks(fg, motif, instances, latent)
            path: type | None = None  # the fused path the proposal takes (None: the general path)
            if self.use_fused and supports_fused(fg, instances, motif.block_spec.cardinalities):
                path = FusedBlockSweep
            elif self.use_fused and supports_fused_sampled(fg, proposal, instances):
                path = FusedSampledSweep
            elif self.use_fused and supports_fused_continuous(fg, motif, instances):
                path = FusedContinuousSweep
            elif self.use_fused and supports_fused_mixture(fg, motif, instances):
                path = FusedMixtureSweep
            cover = self.cover if self.cover is not None else path is FusedMixtureSweep  # (None: rounds of pairs)
            covers = path in (None, FusedBlockSweep, FusedMixtureSweep) and cover is not False
            if self.cover is True and not covers:
                raise ValueError(
                    f"cover=True: proposal {motif.name} takes the {path.__name__ if path else ''} path, which "
                    "updates every instance in a sweep; covers run on the fused block and mixture paths and the "
                    "general path (cover='auto' uses them where they run)"
                )
            cover_sets = None
            if covers and len(instances):  # a mixture's pairs: round-robin rounds, each mixture in one pair
                rounds = pair_rounds(mixture_layout(fg, motif, instances).pairs) if path is FusedMixtureSweep else None
                cover_sets = rounds or disjoint_covers(instances.blocks)
            colouring, bounds = self._colour(fg, instances, cover_sets)
            self.cover_classes.append(bounds)
            sizes = torch.tensor([len(members) for members in colouring], dtype=torch.long)
            order = torch.cat(colouring) if colouring else torch.zeros(0, dtype=torch.long)
            ordered = instances.select(order)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
            fused: _Fused | None = None
            if path is FusedBlockSweep:
                fused = FusedBlockSweep(fg, proposal, ordered, offsets, self.device, self.compile)
            elif path is FusedSampledSweep:
                fused = FusedSampledSweep(fg, proposal, ordered, offsets, self.device)
            elif path is FusedContinuousSweep:
                fused = FusedContinuousSweep(fg, proposal, ordered, offsets, self.device, self.compile)
            elif path is FusedMixtureSweep:
                fused = FusedMixtureSweep(fg, proposal, ordered, self.window, offsets)
            self.fused.append(fused)
            classes, sweep = [], None
            if fused is None:
                scaffold = fg.scaffold(ordered.blocks)
                for c, members in enumerate(colouring):
                    lo, hi = int(offsets[c]), int(offsets[c + 1])
                    sub = instances.select(members)
                    classes.append(_BlockClass(sub, scaffold.select(lo, hi), sub.blocks.reshape(-1), members))
                sweep = _Sweep(ordered, scaffold, offsets, torch.repeat_interleave(sizes), order)
            self.block_classes.append(classes)
            self.sweeps.append(sweep)
            self.num_instances.append(len(instances))
            if not isinstance(fused, FusedBlockSweep | FusedSampledSweep) and self.device.type != "cpu":  # CPU only
                raise ValueError(
                    f"motif {motif.name}: only discrete blocks on table factors (the fused path) run on "
                    f"{self.device}; use device='cpu'"
                )
        if sum(self.num_instances) == 0:
            wanted = "; ".join(f"{p.motif.name} looks for {p.motif.describe()}" for p in self.proposals)
            hint = ""
            continuous = [fg.names[v] for v in fg.latent.tolist() if fg.cardinality(v) == 0]
            if continuous and self.from_pyro and any(fg.cardinality(v) > 0 for v in fg.latent.tolist()):
                hint = (  # the discrete sites' tables exist only once the continuous ones are held fixed
                    f" (the continuous latent sites {continuous[:5]} keep the discrete sites' factors from being "
                    "tables: sample them in another block of a CompoundKernel, e.g. [(NeuralBlockKernel(model, "
                    "proposals=...), None), (RandomWalkMH(model), [those sites])])"
                )
            raise ValueError(
                f"no instance of the proposals' motifs was found in this model: {wanted}; {_summary(fg)}{hint}"
            )
        self.single_site = SingleSiteSweep(
            fg,
            self.step_size,
            "NeuralBlockKernel",
            self.device,
            self.compile,
            copy_moves=self._copy_moves,
            informed_means=self._informed_means,
            label_steps=self._label_steps,
        )
        self.split_moves = None
        if self._split_arg and self.device.type == "cpu" and self.single_site.mixture_sites is not None:  # a GMM
            self.split_moves = MixtureSplitMoves.of(fg, self._split_arg)
        if self._split_arg and self.split_moves is None:
            warnings.warn(
                f"NeuralBlockKernel(split_moves={self._split_arg}) is ignored: the moves run on open-universe GMMs "
                f"(motifs.gmm_pair.gmm_graph) on the CPU, and this is {_summary(fg)} on {self.device}",
                RuntimeWarning,
                stacklevel=2,
            )
        if self.gibbs_prob == 0.0 and self.share_calibration is None:
            covered = set()
            for proposal in self.proposals:
                covered.update(proposal.motif.find_instances(fg).blocks.reshape(-1).tolist())
            missed = [fg.names[v] for v in sorted(latent - covered)]
            if missed:
                warnings.warn(
                    f"NeuralBlockKernel with gibbs_prob=0 never updates {len(missed)} latent variables that lie in "
                    f"no motif block (e.g. {missed[:3]}): the chain is not ergodic; use gibbs_prob > 0",
                    RuntimeWarning,
                    stacklevel=2,
                )

    @staticmethod
    def _colour(
        fg: FactorGraph, instances: MotifInstances, covers: list[Tensor] | None
    ) -> tuple[list[Tensor], list[tuple[int, int]]]:
        """Colour classes of the instances (cover by cover, given ``covers``); each cover's ``(first, last)`` class."""
        colouring: list[Tensor] = []
        bounds = []
        every: list[Tensor | None] = [None]
        for members in covers or every:
            blocks = instances.blocks if members is None else instances.blocks[members]
            reads = instances.context if members is None else instances.context[members]
            classes = fg.color_blocks(blocks, reads=reads)
            bounds.append((len(colouring), len(colouring) + len(classes)))
            colouring += classes if members is None else [members[c] for c in classes]
        return colouring, bounds

    def _refresh(self, fg: FactorGraph) -> None:
        """Re-read the instances' parameters (same blocks, classes, scaffolds and step sizes)."""
        self.single_site.refresh(fg)
        if self.split_moves is not None:
            self.split_moves.refresh(fg)
        for proposal, classes, sweep, fused in zip(self.proposals, self.block_classes, self.sweeps, self.fused):
            instances = proposal.motif.find_instances(fg)
            if fused is not None:
                ordered = instances
                order = _order_of(fused.instances.blocks, instances.blocks)
                if order is None:
                    raise ValueError(f"motif {proposal.motif.name} found other blocks after the graph's update")
                fused.refresh(fg, ordered.select(order))
                continue
            for cls in classes:
                sub = instances.select(cls.members)
                if not torch.equal(sub.blocks, cls.instances.blocks):
                    raise ValueError(f"motif {proposal.motif.name} found other blocks after the graph's update")
                cls.instances = sub
            if sweep is not None:
                sweep.instances = instances.select(sweep.order)

    def temper(self, betas: Tensor, log_zero: Tensor | None = None) -> bool:
        """Temper the proposals: chains at ``betas[r]`` propose from the proposal raised to the power ``betas[r]``.

        The log importance weights of ``q^beta`` against the block conditional of ``p(x)^beta`` are
        ``beta`` times those of ``q`` against ``p``'s, so hot chains keep a high acceptance where
        the untempered proposal is too sharp. Each proposal on the fused path with a fully tabulated
        dense table gains one block of rows per temperature
        (:func:`~neuralblock.kernels.fused_blocks.powered_rows`: no network pass); a chain whose
        :attr:`beta` is one of ``betas`` then reads its temperature's rows, and one between two of them the
        hotter one's, its MH ratio corrected by its own ``beta`` (exact MH for ``p(x)^beta`` either way).
        Returns whether any proposal was tempered.

        Args:
            betas: ``[R]`` inverse temperatures (the ladder; rows of :attr:`beta` take these values).
            log_zero: ``[R]`` the log-potential of a zero table entry at each temperature, for chains
                with :attr:`soft_zeros` (whose entry then names their temperature).
        """
        tempered = False
        for fused in self.fused:
            if isinstance(fused, FusedBlockSweep):
                tempered = fused.temper(betas, log_zero) or tempered
        return tempered

    def supports_soft_zeros(self) -> bool:
        """Whether :attr:`soft_zeros` can be set: every update of a chain must then target the same model.

        That holds when every proposal takes the fused block path with a dense table and the
        single-site half is Gibbs on table factors.
        """
        fused = [f for f in self.fused if isinstance(f, FusedBlockSweep)]
        plan = self.single_site.gibbs_plan
        return (
            len(fused) == len(self.fused)
            and all(f.table.slot is None for f in fused)
            and self.single_site.rw_plan is None
            and (plan is None or plan.tables_only)
        )

    def _reset_stats(self) -> None:
        self._turns = 0  # transitions whose turn was decided since setup (the alternate schedule's clock)
        n = len(self.proposals)
        self._proposed = [0] * n
        self._accepted: list[int | Tensor] = [0] * n
        self._nonfinite: list[int | Tensor] = [0] * n
        self._recent: list[float | Tensor] = [0.0] * n
        self._discarded = [0] * n
        self._class_accept_rate = [1.0] * n  # running fraction of classes with an accepted block
        self._block_seconds = 0.0
        self._single_sweeps = 0.0
        self._transitions = 0  # neural sweeps so far, warmup included
        # per chain, fused path only (NumPy float64 on the CPU: exact counts, added at a fraction of torch's cost)
        self._accepted_per_chain: list[np.ndarray] = [np.zeros(()) for _ in range(n)]
        self._proposed_per_chain: list[np.ndarray] = [np.zeros(()) for _ in range(n)]

    def _started(self, fg: FactorGraph, state: Tensor) -> None:
        self._calibrate_share(fg, state)  # at setup: not part of any transition's time

    def _calibrate_share(self, fg: FactorGraph, state: Tensor) -> None:
        """Set ``gibbs_prob`` from ``gibbs_share``, once per setup (a wrapper that prepares without setup: here)."""
        if self._share_pending and self.share_calibration is not None:
            self._share_pending = False
            beta, soft = self.beta, self.soft_zeros
            self.gibbs_prob = self.share_calibration.calibrate(
                lambda: self.single_site.sweep(fg, state.clone(), False, beta, soft, record=False),
                lambda: self.single_site.label_steps_after(self._neural_sweep(fg, state.clone(), beta, soft, True)),
                state.device,
            )

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        fg = self._graph()
        self._calibrate_share(fg, state)
        state = self._kernel_transition(fg, state, warmup)
        if self.split_moves is not None and self.neural_rows is None and self.beta is None and self.soft_zeros is None:
            state = self.split_moves.move(state)
        return state

    def _kernel_transition(self, fg: FactorGraph, state: Tensor, warmup: bool) -> Tensor:
        """A single-site sweep or a neural sweep (ending with the label steps), or both split by ``neural_rows``."""
        if self.single_site_turn():
            return self.single_site_transition(fg, state, warmup)
        if self.neural_rows is None:
            state = self._neural_sweep(fg, state, self.beta, self.soft_zeros, warmup)
            if self.beta is None and self.soft_zeros is None:  # (the label steps' target is the untempered one)
                state = self.single_site.label_steps_after(state)
        else:  # the chains of neural_rows take the neural sweep, the others a single-site sweep
            if self.neural_rows.shape != state.shape[:1]:
                shape = tuple(self.neural_rows.shape)
                raise ValueError(f"neural_rows must mask the {len(state)} chains, got shape {shape}")
            (neural, neural_beta, neural_soft), (single, single_beta, single_soft) = self._split_rows(self.neural_rows)
            lead = self._rows_lead  # the neural chains are the first ones (a ladder's coldest): slices, no copies
            cut = len(neural)
            single_out = neural_out = None
            if len(single):
                mine = state[cut:] if lead else state[single]
                single_out = self.single_site_rows(fg, mine, single_beta, single_soft, warmup, len(state))
            if len(neural):
                mine = state[:cut] if lead else state[neural]
                neural_out = self._neural_sweep(fg, mine, neural_beta, neural_soft, warmup, neural, len(state))
            if lead:
                state = torch.cat([part for part in (neural_out, single_out) if part is not None])
            else:
                state = torch.empty_like(state)
                if single_out is not None:
                    state[single] = single_out
                if neural_out is not None:
                    state[neural] = neural_out
        self._transitions += 1
        return state

    def single_site_rows(
        self, fg: FactorGraph, rows: Tensor, beta: Tensor | None, soft: SoftZeros | None, warmup: bool, chains: int
    ) -> Tensor:
        """The single-site sweep of some of a transition's ``chains`` chains, ``rows [K', n]`` (the others take the
        neural sweep), at their ``beta`` and :class:`SoftZeros`; counted in chain-sweeps of the whole state."""
        rows = self.single_site.sweep(fg, rows, warmup, beta, soft)
        if not warmup:
            self._single_sweeps += len(rows) / chains
        return rows

    def single_site_turn(self) -> bool:
        """Whether this transition takes the single-site sweep (at the rate ``gibbs_prob``, by :attr:`schedule`).

        It advances the schedule: call it once per transition.
        """
        self._turns += 1
        return single_site_turn(self.schedule, self.gibbs_prob, self._turns - 1)

    def single_site_transition(self, fg: FactorGraph, state: Tensor, warmup: bool) -> Tensor:
        """A transition's single-site sweep of every chain (at the chains' :attr:`beta` and :attr:`soft_zeros`)."""
        state = self.single_site.sweep(fg, state, adapt=warmup, beta=self.beta, soft=self.soft_zeros)
        if not warmup:
            self._single_sweeps += 1
        return state

    def neural_classes(self, i: int) -> tuple[int, int] | None:
        """The classes proposal ``i``'s next neural sweep updates: its next cover in turn (``None``: every class)."""
        bounds = self.cover_classes[i]
        return bounds[self._transitions % len(bounds)] if len(bounds) > 1 else None

    def _split_rows(self, rows: Tensor) -> tuple[RowPart, RowPart]:
        """The chains of the mask ``rows`` and the others, each with its chains' ``beta`` and :class:`SoftZeros`.

        Remembered for the last inputs (the same tensors, unchanged).
        """
        beta, soft = self.beta, self.soft_zeros
        inputs = (rows, beta, *(soft or (None, None)))  # (a SoftZeros is made per transition: its tensors are kept)
        last = self._row_split.get(inputs)
        if last is None:
            mask = rows.to(torch.bool)

            def part(chains: Tensor) -> RowPart:
                return (
                    chains,
                    None if beta is None else beta[chains],
                    None if soft is None else SoftZeros(soft.entry[chains], soft.log_zero),
                )

            last = (part(mask.nonzero().squeeze(-1)), part((~mask).nonzero().squeeze(-1)))
            self._row_split.put(inputs, last)
            self._rows_lead = bool(mask[: int(mask.sum())].all())  # the neural chains come first
        return last

    def _neural_sweep(
        self,
        fg: FactorGraph,
        state: Tensor,
        beta: Tensor | None,
        soft: SoftZeros | None,
        warmup: bool,
        rows: Tensor | None = None,
        chains: int = 0,
    ) -> Tensor:
        """Every proposal's classes (or its next cover) once, on states ``[K', n]`` (chains ``rows`` of ``chains``).

        Its post-warmup time counts in ``updates_per_second``.
        """
        start = time.perf_counter()
        for i, fused in enumerate(self.fused):
            if soft is not None and not isinstance(fused, FusedBlockSweep):
                raise ValueError(f"soft zeros need proposal {self._label(i)} on the fused block path")
            classes = self.neural_classes(i)  # the covers in turn
            if fused is not None:
                if isinstance(fused, FusedBlockSweep):
                    state, per_chain, nonfinite, proposed = fused.sweep(fg, state, beta, soft, classes)
                elif isinstance(fused, FusedMixtureSweep):
                    state, per_chain, nonfinite, proposed = fused.sweep(fg, state, beta, classes)
                else:
                    state, per_chain, nonfinite, proposed = fused.sweep(fg, state, beta)
                discarded = fused.discarded if isinstance(fused, FusedMixtureSweep) else 0
                offered = fused.offered if isinstance(fused, FusedMixtureSweep) else None  # (the screen's skips)
                self.record_fused_sweep(i, per_chain, nonfinite, proposed, warmup, discarded, rows, chains, offered)
            else:
                bounds = self.cover_classes[i][0] if classes is None else classes
                state, accepted, bad, proposed, discarded = self._general_sweep(i, fg, state, bounds, beta)
                self._record_sweep(i, accepted, bad, proposed, discarded, warmup)
        if not warmup:
            if state.device.type == "cuda":
                torch.cuda.synchronize(state.device)
            self._block_seconds += time.perf_counter() - start
        return state

    def record_fused_sweep(
        self,
        i: int,
        per_chain: Tensor,
        nonfinite: Tensor | int,
        proposed: int,
        warmup: bool,
        discarded: int = 0,
        rows: Tensor | None = None,
        chains: int = 0,
        offered: np.ndarray | None = None,
    ) -> None:
        """Count a fused sweep of proposal ``i``: accepted blocks per chain ``[K']``, non-finite ratios, proposals.

        With ``rows``, the sweep ran the chains ``rows`` of ``chains`` (see :meth:`_count_per_chain`); ``offered``
        ``[K']`` is each chain's share of ``proposed`` where they differ (``None``: an equal share).
        """
        accepted: int | Tensor
        bad: int | Tensor
        if per_chain.device.type == "cpu":  # (on a GPU the totals stay there; the per-chain counts are copied)
            accepted, bad = int(per_chain.numpy().sum()), int(nonfinite)
        else:
            accepted, bad = per_chain.sum(), nonfinite
        if not warmup:
            share = proposed // len(per_chain) if offered is None else offered
            self._count_per_chain(i, per_chain, share, rows, chains)
        self._record_sweep(i, accepted, bad, proposed, discarded, warmup)

    def _record_sweep(
        self, i: int, accepted: int | Tensor, bad: int | Tensor, proposed: int, discarded: int, warmup: bool
    ) -> None:
        """Proposal ``i``'s running acceptance and (after warmup) its totals."""
        rate = accepted / max(proposed, 1)  # a running rate for the progress bar
        self._recent[i] = rate if self._transitions == 0 else 0.9 * self._recent[i] + 0.1 * rate
        if not warmup:
            self._accepted[i] = self._accepted[i] + accepted  # (an int on the CPU, else a tensor on the device)
            self._proposed[i] += proposed
            self._nonfinite[i] = self._nonfinite[i] + bad
            self._discarded[i] += discarded

    def _count_per_chain(
        self, i: int, accepted: Tensor, offered: int | np.ndarray, rows: Tensor | None, chains: int
    ) -> None:
        """Add a fused sweep's blocks accepted ``[K']`` and offered (each chain's) to proposal ``i``'s per-chain counts.

        With ``rows``, the sweep ran the chains ``rows`` of ``chains``; the others count 0.
        """
        total, offers = self._accepted_per_chain[i], self._proposed_per_chain[i]
        width = len(accepted) if rows is None else chains
        if total.shape != (width,):  # the first sweep's counts (the totals start as 0-dim zeros)
            total, offers = np.zeros(width), np.zeros(width)
            self._accepted_per_chain[i], self._proposed_per_chain[i] = total, offers
        counts = accepted.cpu().numpy()
        if rows is None:
            total += counts
            offers += offered
        else:  # the chains of rows, each once (those that took the single-site sweep count 0)
            place = rows.cpu().numpy()
            total[place] += counts
            offers[place] += offered

    def _general_sweep(
        self, i: int, fg: FactorGraph, state: Tensor, bounds: tuple[int, int], beta: Tensor | None = None
    ) -> tuple[Tensor, int, int, int, int]:
        """The general path over proposal ``i``'s classes ``bounds[0]..bounds[1] - 1`` (speculative with one chain)."""
        proposal, classes, sweep = self.proposals[i], self.block_classes[i], self._general(i)
        accepted, proposed, nonfinite, discarded = 0, 0, 0, 0
        c, last = bounds
        single = state.shape[0] == 1 and beta is None
        if single:  # one chain: the motif sees the state as [n] (every motif supports it)
            state = state[0]
        while c < last:
            width = self._window_size(i, c, last, fg.num_variables) if single else 1
            if width == 1:
                state, info = neural_block_step(
                    fg, proposal, classes[c].instances, classes[c].scaffold, state, None if single else beta
                )
                used = 1
            else:
                lo, hi = int(sweep.offsets[c]), int(sweep.offsets[c + width])
                batch = sweep.instances.select(torch.arange(lo, hi))
                scaffold = sweep.scaffold.select(lo, hi)
                state, used, info = speculative_block_step(
                    fg, proposal, batch, scaffold, sweep.class_of[lo:hi] - c, state
                )
                discarded += hi - lo - len(info.accepted)
            self._track_class_acceptance(i, used, bool(info.accepted.any()))
            c += used
            accepted += int(info.accepted.sum())
            proposed += int(info.accepted.numel())
            nonfinite += int(info.num_nonfinite)
        if single:
            state = state.unsqueeze(0)
        return state, accepted, nonfinite, proposed, discarded

    def _general(self, i: int) -> _Sweep:
        """Proposal ``i``'s classes on the general path (a proposal on a fused path has none)."""
        sweep = self.sweeps[i]
        if sweep is None:
            raise RuntimeError(f"proposal {self._label(i)} takes a fused path: it has no general-path sweep")
        return sweep

    def _window_size(self, i: int, first: int, last: int, num_variables: int) -> int:
        """Classes of proposal ``i`` to batch from class ``first`` (before ``last``): ``window``, or
        :func:`speculative_width`.

        Capped so that the batch's one-state-per-block copies stay under ``_MAX_SPECULATIVE_ENTRIES``.
        """
        offsets = self._general(i).offsets
        fits = int(torch.searchsorted(offsets, offsets[first] + _MAX_SPECULATIVE_ENTRIES // num_variables, right=True))
        cap = max(1, min(last - first, fits - 1 - first))
        if self.window is not None:
            return min(self.window, cap)
        return speculative_width(self._class_accept_rate[i], cap)

    def _track_class_acceptance(self, i: int, classes: int, any_accepted: bool) -> None:
        """Fold ``classes`` classes, the last of which had ``any_accepted``, into the running rate."""
        decay = (1.0 - _RATE_SMOOTHING) ** classes
        self._class_accept_rate[i] = decay * self._class_accept_rate[i] + _RATE_SMOOTHING * any_accepted

    def logging(self) -> dict[str, float]:
        """Running (exponentially weighted, over neural sweeps) acceptance rate per proposal."""
        return {f"acc_{self._label(i)}": round(float(a), 3) for i, a in enumerate(self._recent)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup acceptance per proposal, transitions and block proposals per second, rejections, compile time.

        ``updates_per_second`` counts block proposals (all proposals and chains) per second of block-move
        time; ``transitions_per_second`` counts transitions per second of the whole transition.
        """
        proposed = sum(self._proposed)
        cache = {
            self._label(i): {
                "rows": f.table.rows,
                "computed": f.table.computed,
                "prefilled": f.table.prefilled,
                "slots": f.table.slot is not None,  # rows kept for visited keys only (large context spaces)
                "evictions": f.table.evictions,
            }
            for i, f in enumerate(self.fused)
            if isinstance(f, FusedBlockSweep)
        }
        return {
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: no trajectories)
            "acceptance_by_proposal": {
                self._label(i): (float(self._accepted[i]) / self._proposed[i] if self._proposed[i] else 0.0)
                for i in range(len(self.proposals))
            },
            "instances": {self._label(i): n for i, n in enumerate(self.num_instances)},
            "chains": float(self.chains),
            "transitions_per_second": self._transitions_per_second(),
            "updates_per_second": per_second(proposed, self._block_seconds),
            "nonfinite_rejections": float(sum(float(x) for x in self._nonfinite)),
            "discarded_proposals": float(sum(self._discarded)),
            "single_site_sweeps": float(self._single_sweeps),
            "gibbs_prob": self.gibbs_prob,
            "schedule": self.schedule,
            "gibbs_share_seconds": dict(self.share_calibration.seconds) if self.share_calibration else {},
            "fused": {self._label(i): f is not None for i, f in enumerate(self.fused)},
            "proposal_cache": cache,
            "compile_seconds": sum(f.compile_seconds for f in self.fused if f is not None)
            + (self.single_site.compile_seconds if hasattr(self, "single_site") else 0.0)
            + (self.split_moves.compile_seconds if self.split_moves is not None else 0.0),
            **(self.single_site.report() if hasattr(self, "single_site") else {}),
            **({"split_move_acceptance": self.split_moves.acceptance()} if self.split_moves is not None else {}),
        }


def _summary(fg: FactorGraph) -> str:
    """What a graph has, for error messages: its variables' domains and its factors' kinds and table shapes."""
    cards = sorted({int(k) for k in fg.cardinalities[fg.latent].tolist()})
    kinds = []
    for group in fg.groups:
        shape = getattr(group, "table_shape", None)
        kinds.append(f"{group.num_factors} tables of shape {list(shape)}" if shape else type(group).__name__)
    domains = ", ".join("continuous" if k == 0 else f"{k}-ary" for k in cards)
    return f"the model has latent variables that are {domains or 'absent'} and factors: {'; '.join(kinds)}"


def _order_of(blocks: Tensor, found: Tensor) -> Tensor | None:
    """Rows of ``found`` that give ``blocks`` (the same set of blocks, in ``blocks``' order, some perhaps
    repeated: covers may hold an instance twice), or ``None``.

    Example:
        >>> _order_of(torch.tensor([[1, 2], [0, 1], [1, 2]]), torch.tensor([[0, 1], [1, 2]])).tolist()
        [1, 0, 1]
    """
    if found.shape[1:] != blocks.shape[1:]:
        return None
    position = {tuple(row): i for i, row in enumerate(found.tolist())}
    order = [position.get(tuple(row)) for row in blocks.tolist()]
    if any(i is None for i in order) or len(set(order)) != len(found):
        return None
    return torch.tensor(order, dtype=torch.long)
