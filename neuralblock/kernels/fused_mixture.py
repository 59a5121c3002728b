"""The fused neural block sweep for pairs of open-universe mixtures (the ``gmm_pair`` motif), over chains.

Every pair of mixtures conflicts with every other (all of them explain the same points), so a
sweep visits the pairs one after another. On the general path each visit is a separate
network pass and a scaffold evaluation that gathers every point's factor scope (all ``m``
mixtures) per factor row. Here one function (:func:`mixture_pair_step`) does the whole MH step
for ``w`` consecutive pairs of each of ``K`` chains at once:

1. **Shared terms.** ``a[k, j, l] = log v_l - |x_j - mu_l|^2 / (2 sigma^2)`` for every chain,
   point and mixture, once per step (the points are observed: whitened once per graph).
2. **Features.** The motif's pure encoder (``features`` of whitened points, other mixtures and
   ``Psi``), for every (chain, pair) at once.
3. **Proposal.** One MDN pass over ``K x w`` contexts; ``u' ~ q(u | C)`` and both densities,
   ``B = loc + scale * u`` (means shifted by the prior centre and scaled by ``sigma``).
4. **Energy.** Each point's mixture factor at the current and the proposed pair,
   ``logsumexp`` of the other mixtures' terms (``C`` only, shared by both) with the pair's two,
   minus ``log M``; plus the pair's prior terms (Bernoulli activity, Gaussian means).
5. **Accept.** Exact MH per (chain, pair) with ``beta (log p(B') - log p(B)) + log q(u) - log q(u')``.
   All ``w`` pairs of a chain are proposed at the same state, so only the first accepted one is
   kept; the pairs after it are proposed again from the new state at the next step. Each chain
   therefore makes exactly the decisions of a pair-by-pair sweep (the *speculative* batches of
   the general path, per chain), and ``w`` follows the recent rate of step-ending accepts.

   One exception keeps a step going: an accepted move of two inactive mixtures that leaves both
   inactive only redraws their means, and an inactive mean enters no other pair's features or
   energy (its bit zeroes it everywhere). The later pairs of the step were therefore proposed
   and scored at the state the sequential sweep would have, unless they contain one of those two
   mixtures: the step ends before the first such pair (it is proposed again next step). Such
   moves are frequent when many mixtures are off (at m=16-32 with half of them on, the gain was
   3-12% of pair sweeps per second).

The fused energy equals the graph's: :func:`supports_fused_mixture` admits a graph only when
each block variable's factors are its one prior factor and the mixture group's rows
(graphs of :func:`motifs.gmm_pair.gmm_graph`), and the tests compare the two on random states.

Example:
    >>> import torch
    >>> from motifs.gmm_pair import GmmPairMotif, gmm_graph, gmm_initial_state
    >>> fg = gmm_graph(torch.randn(20, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> motif = GmmPairMotif()
    >>> supports_fused_mixture(fg, motif, motif.find_instances(fg))
    True
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, GaussianMixtureGroup, LinearGaussianGroup, TableGroup
from neuralblock.kernels.functional import nonfinite_ratios, speculative_width
from neuralblock.kernels.jit import NUMBA, timed_first_call
from neuralblock.kernels.jit_mixture import (
    CandidateOptions,
    MixtureNetwork,
    PairScreen,
    TokenCache,
    draw_pairs,
    mixture_pair_sweep,
)
from neuralblock.motif import Motif, MotifInstances
from neuralblock.proposals import NeuralBlockProposal

__all__ = [
    "FusedMixtureSweep",
    "MixtureLayout",
    "PairContext",
    "StepConstants",
    "mixture_layout",
    "mixture_pair_step",
    "pair_context",
    "pair_rounds",
    "step_constants",
    "supports_fused_mixture",
]

_MAX_SLOT_ENTRIES = 4_000_000  # cap on K * w * n * m (the step's largest temporary)
_SLOT_COST = 0.08  # one more pair of one chain in a step, in units of a step's fixed cost (measured: m=16, n=240)


class MixtureLayout(NamedTuple):
    """The precomputed index tensors and constants of one mixture group's pairs, in sweep order.

    Attributes:
        values: ``[n, D]`` the observed points (float64; whitened as ``(x - c) / sigma`` in the state's dtype).
        mean_ids: ``[m, D]`` variable ids of the mixture means.
        active_ids: ``[m]`` variable ids of the activity bits.
        pairs: ``[P, 2]`` mixture indices ``(i, j)`` of each instance.
        others: ``[P, m - 2]`` the other mixtures of each instance.
        block_ids: ``[P, 2 D + 2]`` the block ``(mu_i, v_i, mu_j, v_j)`` of each instance.
        sigma: the points' standard deviation; ``center``: ``[D]`` prior mean of the means.
        tau: prior standard deviation of a mean coordinate; ``p``: prior probability of activity (both as
            the motif reads them, for the proposal's input).
        log_odds: ``[m]`` each bit's prior table difference ``log T[1] - log T[0]`` (the energy's, exact).
    """

    values: Tensor
    mean_ids: Tensor
    active_ids: Tensor
    pairs: Tensor
    others: Tensor
    block_ids: Tensor
    sigma: float
    center: Tensor
    tau: float
    p: float
    log_odds: Tensor

    def points(self, dtype: torch.dtype) -> Tensor:
        """``[n, D]`` whitened points ``(x - c) / sigma`` in ``dtype``."""
        return (self.values.to(dtype) - self.center.to(dtype)) / self.sigma


MIXTURE_PAIR_MOTIFS = ("gmm_pair", "gmm_pair_set")  # motifs whose ``features`` read a PairContext


def _mixture_group(fg: FactorGraph, motif: Motif) -> GaussianMixtureGroup | None:
    groups = [g for g in fg.groups if isinstance(g, GaussianMixtureGroup)]
    dim = getattr(motif, "dim", None)
    return groups[0] if len(groups) == 1 and groups[0].dim == dim else None


def supports_fused_mixture(fg: FactorGraph, motif: Motif, instances: MotifInstances) -> bool:
    """Whether a motif's instances can take the fused mixture-pair path.

    The motif is ``gmm_pair`` or ``gmm_pair_set`` (pure ``features`` encoders of whitened context), the graph has
    one :class:`GaussianMixtureGroup` of the motif's dimension with observed points, the
    instances are pairs of its mixtures, and each mixture's variables have exactly one factor
    besides the group's rows: a unary table on the bit and a unary linear-Gaussian on each
    mean coordinate (so the pair's energy is the group's rows plus these priors).
    """
    if motif.name not in MIXTURE_PAIR_MOTIFS or len(instances) == 0 or not callable(getattr(motif, "features", None)):
        return False
    group = _mixture_group(fg, motif)
    if group is None or not set(group.points.reshape(-1).tolist()) <= set(fg.evidence):
        return False
    slots = {int(v): k for k, row in enumerate(group.means.tolist()) for v in row}
    slots.update({int(v): k for k, v in enumerate(group.active.tolist())})
    if not set(instances.blocks.reshape(-1).tolist()) <= set(slots):
        return False
    group_index = fg.groups.index(group)
    for var in set(instances.blocks.reshape(-1).tolist()):
        factors = torch.tensor([node[1] for _, node in fg.graph.edges(("v", var))], dtype=torch.long)
        where, rows = fg.factor_location(factors)
        own = where != group_index
        if int(own.sum()) != 1:
            return False
        prior = fg.groups[int(where[own][0])]
        kind = TableGroup if var in group.active.tolist() else LinearGaussianGroup
        if not isinstance(prior, kind) or len(fg.factor_scope(int(factors[own][0]))) != 1:
            return False
    return True


def mixture_layout(fg: FactorGraph, motif: Motif, instances: MotifInstances) -> MixtureLayout:
    """The :class:`MixtureLayout` of ``instances`` (see :func:`supports_fused_mixture`).

    Raises:
        ValueError: the instances' priors or point scales differ (one group has one of each).
    """
    group = _mixture_group(fg, motif)
    if group is None:
        raise ValueError("the fused mixture path needs one GaussianMixtureGroup of the motif's dimension")
    params = instances.params
    if not torch.allclose(params, params[:1].expand_as(params)):
        raise ValueError("the fused mixture path needs one prior and one sigma for all pairs of the group")
    sigma, tau, p = (float(params[0, k]) for k in range(3))
    center = params[0, 3:].double()
    values = torch.tensor([fg.evidence[int(v)] for v in group.points.reshape(-1)], dtype=torch.float64)
    position = {int(v): k for k, v in enumerate(group.active.tolist())}
    dim = group.dim
    pairs = torch.tensor(
        [[position[int(b[dim])], position[int(b[2 * dim + 1])]] for b in instances.blocks.tolist()], dtype=torch.long
    )
    m = group.means.shape[0]
    keep = torch.ones(len(pairs), m, dtype=torch.bool)
    keep.scatter_(1, pairs, False)
    others = torch.arange(m).expand(len(pairs), m)[keep].reshape(len(pairs), m - 2)
    return MixtureLayout(
        values.reshape(group.points.shape),
        group.means,
        group.active,
        pairs,
        others,
        instances.blocks,
        sigma,
        center,
        tau,
        p,
        _bit_log_odds(fg, group),
    )


def pair_rounds(pairs: Tensor) -> list[Tensor] | None:
    """Rounds of a round-robin tournament over the mixtures: covers of disjoint pairs that hold each pair once.

    ``pairs [P, 2]`` are the mixture indices of each instance. Where they are every unordered pair of
    ``m`` mixtures once, the circle method splits them into ``m - 1`` rounds (``m`` when ``m`` is odd) in which
    each mixture is in one pair (one mixture sits out when ``m`` is odd), each round in instance order. Greedy
    covers (:func:`~neuralblock.kernels.neural_block.disjoint_covers`) need more covers, and visit some pairs
    more often than others, where ``m`` is not a power of two (at ``m = 12``: 15 covers holding 90 pairs for 66).

    Returns:
        Instance indices of each round, or ``None`` where ``pairs`` are not all pairs of ``m`` mixtures once.

    Example:
        >>> rounds = pair_rounds(torch.tensor([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]))
        >>> [r.tolist() for r in rounds]
        [[2, 3], [1, 4], [0, 5]]
    """
    if pairs.dim() != 2 or pairs.shape[1] != 2 or len(pairs) == 0:
        return None
    low, high = pairs.min(1).values, pairs.max(1).values
    m = int(high.max()) + 1
    index = {(int(a), int(b)): k for k, (a, b) in enumerate(zip(low.tolist(), high.tolist()))}
    if len(index) != len(pairs) or len(pairs) != m * (m - 1) // 2 or int(low.min()) < 0 or bool((low == high).any()):
        return None
    seats = m + m % 2  # an odd number of mixtures gets a sitting-out seat (its pairs are skipped)
    rounds = []
    for r in range(seats - 1):
        ring = [(r, seats - 1)] + [((r + k) % (seats - 1), (r - k) % (seats - 1)) for k in range(1, seats // 2)]
        members = [index[(min(a, b), max(a, b))] for a, b in ring if max(a, b) < m]
        rounds.append(torch.tensor(sorted(members), dtype=torch.long))
    return rounds


def _bit_log_odds(fg: FactorGraph, group: GaussianMixtureGroup) -> Tensor:
    """``[m]``: ``log T[1] - log T[0]`` of each activity bit's unary prior table (float64)."""
    out = []
    for bit in group.active.tolist():
        factors = torch.tensor([node[1] for _, node in fg.graph.edges(("v", bit))], dtype=torch.long)
        where, rows = fg.factor_location(factors)
        unary = [(int(g), int(r)) for f, g, r in zip(factors.tolist(), where, rows) if len(fg.factor_scope(f)) == 1]
        if len(unary) != 1 or not isinstance(fg.groups[unary[0][0]], TableGroup):
            raise ValueError(f"the fused mixture path needs one unary prior table on each bit; bit {bit} has {unary}")
        table = cast(TableGroup, fg.groups[unary[0][0]]).log_tables[unary[0][1]].reshape(-1).double()
        out.append(table[1] - table[0])
    return torch.stack(out)


class StepResult(NamedTuple):
    """One :func:`mixture_pair_step`: the new states and, per chain, what the step decided.

    Attributes:
        state: ``[K, N]`` states (each chain's accepted moves written).
        consumed: ``[K]`` pairs decided (up to and including the first accepted move that ends the step).
        accepted: ``[K]`` accepted moves.
        nonfinite: ``[K]`` decided pairs with a broken (NaN or ``+inf``) MH ratio.
        ended: ``[K]`` whether an accepted move, or a pair that shares a mixture with an earlier
            accepted inactive-pair move, ended the chain's step before its window did.
    """

    state: Tensor
    consumed: Tensor
    accepted: Tensor
    nonfinite: Tensor
    ended: Tensor


class StepConstants(NamedTuple):
    """What every step of one layout reads, in the state's dtype (made once per sweep object and dtype).

    Attributes:
        points: ``[n, D]`` whitened points; ``center``: ``[D]``.
        loc: ``[2 D + 2]`` and ``scale``: ``[2 D + 2]``: a block is ``loc + scale * u`` for the network's ``u``.
        psi: ``[2]`` the local parameters as the motif computes them, ``(log(tau / sigma), logit p)``.
        log_odds: ``[m]`` the bits' prior table differences.
        point_mask: ``[n]`` all True (every point of the model is present).
    """

    points: Tensor
    center: Tensor
    loc: Tensor
    scale: Tensor
    psi: Tensor
    log_odds: Tensor
    point_mask: Tensor


def step_constants(layout: MixtureLayout, dtype: torch.dtype) -> StepConstants:
    """The :class:`StepConstants` of ``layout`` in ``dtype``."""
    dim = layout.values.shape[1]
    center = layout.center.to(dtype)
    zero = center.new_zeros(1)
    tau, p = torch.tensor([layout.tau, layout.p], dtype=dtype)
    return StepConstants(
        layout.points(dtype),
        center,
        torch.cat([center, zero, center, zero]),
        torch.tensor([layout.sigma] * dim + [1.0] + [layout.sigma] * dim + [1.0], dtype=dtype),
        torch.stack([torch.log(tau / layout.sigma), torch.logit(p)]),
        layout.log_odds.to(dtype),
        torch.ones(layout.values.shape[0], dtype=torch.bool),
    )


class PairContext(NamedTuple):
    """What each (chain, pair) conditions on: the other mixtures, and their part of every point's factor.

    Attributes:
        u_others: ``[K, w, m - 2, D]`` the other means, whitened.
        v_others: ``[K, w, m - 2]`` their activity bits.
        rest_lse: ``[K, w, n]`` ``log sum_{k not in pair} v_k exp(-|u_j - u_k|^2 / 2)`` per point.
    """

    u_others: Tensor
    v_others: Tensor
    rest_lse: Tensor


def pair_context(
    state: Tensor, layout: MixtureLayout, slots: Tensor, constants: StepConstants | None = None
) -> PairContext:
    """The :class:`PairContext` of the pairs ``slots [K, w]`` of chains ``state [K, N]`` (from ``C`` alone)."""
    constants = step_constants(layout, state.dtype) if constants is None else constants
    chains = slots.shape[0]
    u_means = (state[:, layout.mean_ids] - constants.center) / layout.sigma  # [K, m, D]
    bits = state[:, layout.active_ids]  # [K, m]
    terms = torch.log(bits).unsqueeze(1) - 0.5 * (constants.points[None, :, None] - u_means[:, None]).square().sum(-1)
    others = layout.others[slots]  # [K, w, m - 2]
    chain = torch.arange(chains)[:, None, None]
    u_others = u_means[chain, others]  # [K, w, m - 2, D]
    v_others = bits[chain, others]
    rest = terms.transpose(1, 2)[chain, others]  # [K, w, m - 2, n]
    return PairContext(u_others, v_others, torch.logsumexp(rest, -2))


def mixture_pair_step(
    state: Tensor,
    proposal: NeuralBlockProposal,
    layout: MixtureLayout,
    slots: Tensor,
    valid: Tensor,
    beta: Tensor | None = None,
    constants: StepConstants | None = None,
) -> StepResult:
    """Propose and test ``w`` consecutive pairs of each chain at its current state, up to the first accepted move.

    Accepted moves of two inactive mixtures that stay inactive do not end the step (module docstring).

    Args:
        state: ``[K, N]`` states.
        proposal: the ``gmm_pair`` proposal.
        layout: the group's :class:`MixtureLayout`.
        slots: ``[K, w]`` instance indices (rows of the layout) each chain decides next, in order.
        valid: ``[K, w]`` which slots hold a real pair (a chain near the end of its sweep has fewer).
        beta: optional ``[K]`` inverse temperatures (targets ``p(x)^beta``).
        constants: the layout's :class:`StepConstants` in the state's dtype (default: made here).

    Returns:
        A :class:`StepResult`.
    """
    chains, width = slots.shape
    dim = layout.values.shape[1]
    dtype = state.dtype
    constants = step_constants(layout, dtype) if constants is None else constants
    points = constants.points
    context = pair_context(state, layout, slots, constants)
    n = points.shape[0]
    features = proposal.motif.features(  # type: ignore[attr-defined]
        points.expand(chains, width, n, dim),
        constants.point_mask,
        context.u_others,
        context.v_others,
        constants.psi,
        context.rest_lse,
    )
    q = proposal(features.to(proposal.dtype))
    block_ids = layout.block_ids[slots]  # [K, w, b]
    current = state.gather(1, block_ids.reshape(chains, -1)).reshape(block_ids.shape)
    u_new = q.sample().to(dtype)
    proposed = constants.loc + constants.scale * u_new
    log_q_fwd, log_q_rev = q.log_prob(torch.stack([u_new, (current - constants.loc) / constants.scale])).to(dtype)
    mixtures = layout.pairs[slots]  # [K, w, 2]
    log_odds = constants.log_odds[mixtures]  # [K, w, 2]
    change = _energy_change(context.rest_lse, context.v_others.sum(-1), log_odds, layout, current, proposed, points)
    if beta is not None:
        change = change * beta[:, None].to(dtype)
    log_alpha = change + log_q_rev - log_q_fwd
    broken = nonfinite_ratios(log_alpha)
    accepted = (torch.rand_like(log_alpha).log() < log_alpha.masked_fill(broken, -math.inf)) & valid  # mh_accept's
    bits = [dim, 2 * dim + 1]
    idle = (current[..., bits] == 0).all(-1) & (proposed[..., bits] == 0).all(-1)  # off before and after
    quiet = accepted & idle  # moves that change nothing the other pairs read
    ends = accepted & ~idle
    if width > 1 and bool(quiet.any()):
        shares = (mixtures[:, :, None, :, None] == mixtures[:, None, :, None, :]).any((-1, -2))  # [K, w, w]
        earlier = torch.ones(width, width, dtype=torch.bool).tril(-1)  # [later, earlier]
        stale = (shares & earlier & quiet[:, None, :]).any(-1) & valid  # proposed before a quiet move it shares
        ends = ends | stale
    else:
        stale = torch.zeros_like(accepted)
    ended = ends.any(1)
    stop = torch.where(ended, ends.to(torch.int8).argmax(1), valid.sum(1))  # the first slot that ends the step
    slot = torch.arange(width)
    first = slot == stop[:, None]
    consumed = stop + (first & ends & ~stale).sum(1)  # a stale pair is not decided: it is proposed again next step
    decided = slot < consumed[:, None]
    applied = accepted & decided
    if bool(applied.any()):
        chain, which = applied.nonzero(as_tuple=True)
        state = state.clone()
        state[chain[:, None], block_ids[chain, which]] = proposed[chain, which]
    return StepResult(state, consumed, applied.sum(1), (broken & valid & decided).sum(1), ended)


def _energy_change(
    rest_lse: Tensor,
    rest_count: Tensor,
    log_odds: Tensor,
    layout: MixtureLayout,
    current: Tensor,
    proposed: Tensor,
    points: Tensor,
) -> Tensor:
    """``log p(B') - log p(B)`` of each (chain, pair): the points' mixture factors and the pair's priors.

    ``rest_lse [K, w, n]`` and ``rest_count [K, w]`` are the other mixtures' part of each point's factor
    and their number of active mixtures: the conditioning set's, the same for both blocks;
    ``log_odds [K, w, 2]`` the pair's bits' prior table differences. Both blocks are scored in one pass.
    """
    dim, n = points.shape[1], points.shape[0]
    center = layout.center.to(points.dtype)
    blocks = torch.stack([proposed, current]).unflatten(-1, (2, dim + 1))  # [2, K, w, 2, D + 1]
    mu, v = blocks[..., :dim], blocks[..., dim]  # [2, K, w, 2, D], [2, K, w, 2]
    offset = mu - center
    u = offset / layout.sigma
    pair = torch.log(v).unsqueeze(-2) - 0.5 * (points[:, None] - u.unsqueeze(-3)).square().sum(-1)  # [2, K, w, n, 2]
    lse = torch.logaddexp(rest_lse, torch.logsumexp(pair, -1))
    count = rest_count + v.sum(-1)
    total = lse.sum(-1) - n * torch.log(count.clamp(min=1.0))
    prior = (v * log_odds).sum(-1) - 0.5 / layout.tau**2 * offset.square().sum((-1, -2))
    energy = torch.where(count > 0, total + prior, -math.inf)
    return energy[0] - energy[1]


class FusedMixtureSweep:
    """The ``gmm_pair`` proposal's pairs on the fused path: one sweep visits every pair of every chain once.

    Or the pairs of a range of classes (``sweep(..., classes=)``): the kernel's covers, rounds of disjoint pairs
    (:func:`pair_rounds`), are consecutive classes.

    The compiled sweep (:mod:`~neuralblock.kernels.jit_mixture`) mixes data-refined candidates into each
    pair's proposal on models of at least ``candidates.min_points`` points (:attr:`candidates`, default
    :attr:`default_candidates`; ``None``: the network alone) and reuses a pair's proposal for the later pairs
    with the same conditioning set (:attr:`reuse`, default :attr:`default_reuse`; :attr:`computed` counts the
    proposals computed), and attempts far pairs of active mixtures less often (:attr:`screen`, default
    :attr:`default_screen`, :class:`~neuralblock.kernels.jit_mixture.PairScreen`; :attr:`screened` counts the pairs
    skipped, which count as neither proposed nor decided);
    the eager steps (GPU states, no Numba, networks the loop does not cover) propose from the network
    alone. Both are exact MH moves.

    Args:
        fg: the graph (see :func:`supports_fused_mixture`).
        proposal: the ``gmm_pair`` proposal.
        instances: the proposal's instances in sweep order.
        window: pairs per step and chain (``None``: from the recent acceptance rate).
        offsets: ``[C + 1]`` the first instance of each class (each cover's classes are consecutive), for
            sweeps of a range of classes (a cover); ``None``: one instance per class.
    """

    default_candidates: CandidateOptions | None = CandidateOptions()
    default_reuse: bool = True
    default_screen: PairScreen | None = PairScreen()

    def __init__(
        self,
        fg: FactorGraph,
        proposal: NeuralBlockProposal,
        instances: MotifInstances,
        window: int | None = None,
        offsets: Tensor | None = None,
    ) -> None:
        self.proposal = proposal
        self.window = window
        self.offsets = torch.arange(len(instances) + 1) if offsets is None else offsets.cpu()
        self.compile_seconds = 0.0  # the compiled sweep's first call of each argument layout
        # CPU sweeps of gmm_pair_set proposals run the compiled loop of :mod:`~neuralblock.kernels.jit_mixture`
        # (where Numba is installed); False keeps the eager steps
        self.jit = NUMBA
        # the compiled sweep mixes data-refined candidates into each pair's proposal (CandidateOptions);
        # None proposes from the network alone, as the eager steps do
        self.candidates: CandidateOptions | None = self.default_candidates
        # the compiled sweep reuses a pair's proposal for later pairs with the same conditioning set (the same
        # numbers); False computes every pair (for timing the reuse)
        self.reuse = self.default_reuse
        # the compiled sweep attempts far pairs of active mixtures less often (PairScreen; None: every pair)
        self.screen: PairScreen | None = self.default_screen
        self.computed = 0  # pair proposals the compiled sweeps computed (not reused)
        self.screened = 0  # pairs the compiled sweeps' screen did not attempt
        self.offered: np.ndarray | None = None  # the last compiled sweep's pairs attempted per chain (None: all)
        self._jit_layouts: set[tuple] = set()
        self.rate = 1.0  # recent fraction of decided pairs that were accepted
        self.discarded = 0  # pairs the last sweep proposed but did not decide (after a chain's accepted pair)
        self.refresh(fg, instances)

    def refresh(self, fg: FactorGraph, instances: MotifInstances) -> None:
        """Re-read the pairs' priors, sigma and points (same blocks and order)."""
        self.instances = instances
        self.layout = mixture_layout(fg, self.proposal.motif, instances)
        self._constants: dict[torch.dtype, StepConstants] = {}
        self.network = MixtureNetwork.from_proposal(self.proposal)  # None: the eager steps only
        # the token network's outputs per point, kept from sweep to sweep (made by the first compiled sweep), and the
        # token network's weights they came from (the network's arrays share the proposal's parameters' memory)
        self.token_cache: TokenCache | None = None
        self._token_weights = np.zeros(0, dtype=np.float32)

    def constants(self, dtype: torch.dtype) -> StepConstants:
        """The layout's :class:`StepConstants` in ``dtype`` (made at the first step of that dtype)."""
        if dtype not in self._constants:
            self._constants[dtype] = step_constants(self.layout, dtype)
        return self._constants[dtype]

    def _width(self, chains: int, remaining: int | None = None) -> int:
        """Pairs per chain and step: ``window``, or :func:`speculative_width` of the recent acceptance rate.

        A step's cost grows with ``chains x w`` (per pair) on top of a fixed part (the calls), so the
        best width shrinks as chains are added. Capped so the step's temporaries stay bounded, and at the
        most pairs a chain has ``remaining`` in its sweep (default: all pairs).
        """
        points, means = self.layout.values.shape[0], self.layout.mean_ids.shape[0]
        left = len(self.layout.pairs) if remaining is None else remaining
        cap = max(1, min(left, _MAX_SLOT_ENTRIES // max(chains * points * means, 1)))
        if self.window is not None:
            return min(self.window, cap)
        return speculative_width(self.rate, cap, _SLOT_COST * chains)

    def sweep(
        self, fg: FactorGraph, state: Tensor, beta: Tensor | None = None, classes: tuple[int, int] | None = None
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Decide every pair of every chain once, in sweep order (or the pairs of the classes ``first..last - 1``),
        but the pairs the screen skips (:attr:`offered`: each chain's pairs attempted).

        Returns:
            The states, accepted pairs per chain ``[K]``, the non-finite count and the pairs decided
            (the pairs proposed but not decided are in :attr:`discarded`).
        """
        chains = state.shape[0]
        first, last = 0, len(self.layout.pairs)
        if classes is not None:
            first, last = int(self.offsets[classes[0]]), int(self.offsets[classes[1]])
        self.discarded = 0
        self.offered = None
        if self._compiled_for(state):
            return self._compiled_sweep(state, beta, first, last)
        position = torch.full((chains,), first, dtype=torch.long)
        accepted = torch.zeros(chains, dtype=torch.long)
        nonfinite = torch.zeros((), dtype=torch.long)
        with torch.no_grad():
            while bool((position < last).any()):
                live = (position < last).nonzero().squeeze(1)  # chains that finished their sweep wait
                every = len(live) == chains
                width = self._width(len(live), int((last - position[live]).max()))
                slots = position[live, None] + torch.arange(width)
                valid = slots < last
                step = mixture_pair_step(
                    state if every else state[live],
                    self.proposal,
                    self.layout,
                    slots.clamp(max=last - 1),
                    valid,
                    None if beta is None else (beta if every else beta[live]),
                    self.constants(state.dtype),
                )
                state = step.state if every else state.index_copy(0, live, step.state)
                self.discarded += int((valid.sum(1) - step.consumed).sum())  # proposed after a chain's accept
                position[live] += step.consumed
                accepted[live] += step.accepted
                nonfinite = nonfinite + step.nonfinite.sum()
                decided = int(step.consumed.sum())
                if decided:  # the width follows the rate of pairs that end a step
                    self.rate = 0.9 * self.rate + 0.1 * float(step.ended.sum()) / decided
        return state, accepted, nonfinite, chains * (last - first)

    def _compiled_for(self, state: Tensor) -> bool:
        """Whether this sweep takes the compiled loop: Numba on, a ``gmm_pair_set`` network, a CPU float state."""
        return (
            self.jit
            and self.network is not None
            and state.device.type == "cpu"
            and self.layout.values.shape[0] > 0
            and state.dtype in (torch.float32, torch.float64)
            and not state.requires_grad
        )

    def _compiled_sweep(
        self, state: Tensor, beta: Tensor | None, first: int, last: int
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """:meth:`sweep` by :func:`~neuralblock.kernels.jit_mixture.mixture_pair_sweep`: pairs ``first..last - 1``
        once, in order.

        Every chain decides its pairs one after another (no speculation: nothing proposed is discarded).
        """
        network = cast(MixtureNetwork, self.network)
        chains, total = state.shape[0], last - first
        slots = np.ascontiguousarray(np.broadcast_to(np.arange(first, last, dtype=np.int64), (chains, total)))
        valid = np.ones((chains, total), dtype=np.bool_)
        draws = draw_pairs(chains, total, network.components, self.layout.values.shape[1])
        out = state.detach().clone().contiguous()
        temperatures = None if beta is None else beta.detach().to(torch.float64).contiguous().numpy()
        layout = (out.dtype, beta is None)
        computed = np.zeros(chains, dtype=np.int64)
        points, hidden, heads = self.layout.values.shape[0], network.phi2_b.shape[0], network.score_b.shape[0]
        token_net = (network.phi1_w, network.phi1_b, network.phi2_w, network.phi2_b, network.score_w, network.score_b)
        weights = np.concatenate([array.ravel() for array in token_net])
        cache = self.token_cache
        if cache is None or not cache.fits(points, hidden, heads) or not np.array_equal(weights, self._token_weights):
            self.token_cache, self._token_weights = TokenCache.empty(points, hidden, heads), weights
        args: tuple[Any, ...] = (out.numpy(), slots, valid, self.layout, network, draws, temperatures, True)
        screened = np.zeros(chains, dtype=np.int64)
        args = (*args, self.candidates, self.reuse, computed, self.token_cache, self.screen, screened)
        args = (*args, self.constants(torch.float64))
        (accepted, nonfinite, _, _), seconds = timed_first_call(self._jit_layouts, layout, mixture_pair_sweep, *args)
        self.compile_seconds += seconds
        self.computed += int(computed.sum())
        skipped = int(screened.sum())
        self.screened += skipped
        self.offered = total - screened
        return out, torch.from_numpy(accepted), torch.tensor(int(nonfinite.sum())), chains * total - skipped
