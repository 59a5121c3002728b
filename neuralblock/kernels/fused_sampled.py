"""Fused block updates for discrete blocks with too many joint values to enumerate (``crf_tags``-3/4).

The fused table path (:mod:`neuralblock.kernels.fused_blocks`) stores, per (instance, context
value), the proposal and the block energy over all ``J`` joint block values: at most 512 of them.
A ``crf_tags`` block of 3 or 4 tags has 2197 or 28561, so those rows would take 9 KB-110 KB per
key. Here a key stores the proposal's own parameters instead: the MDN's mixture over components
and, per component, one categorical per block variable (``M + M b k`` numbers: 640 for
``crf_tags``-3). A block update draws a component and then each variable by inverse CDF (one
uniform each), scores the proposed and the current value by the same CDF steps (the log-sum-exp
over components of the component's step times its variables' steps: exactly the distribution
drawn, however the CDFs were rounded, as in :func:`~neuralblock.kernels.fused_blocks._draw_cdf`),
and reads the scaffold energy of the two values from the table factors
(:meth:`~neuralblock.kernels.fused_blocks.BlockTableEnergy.at_values`). The proposal depends on
the state only through the context, which holds each block's Markov blanket, so the reverse
proposal reads the same key and the MH ratio is exact. Keys are computed by the network the
first time a chain visits them and kept in slots (all forgotten and recomputed when the slots run
out). A recomputed row equals the first up to the network's float32 rounding, which depends on the
batch it was computed in (a few units of the 2^-24 CDF grid): every update reads one stored row for
both directions, so each is exact for that row; across updates the proposal can differ at that
1e-7 level with the cache's history, as on the table path's slots.

Example:
    >>> import torch
    >>> from motifs.crf import load_crf
    >>> from motifs.crf_tags import CrfTagsMotif
    >>> from neuralblock.proposals import NeuralBlockProposal
    >>> fg = load_crf().sentence_graph(["Go", "Lakers", "go", "!"])
    >>> proposal = NeuralBlockProposal(CrfTagsMotif(tags=3), components=2, hidden=(8,))
    >>> instances = proposal.motif.find_instances(fg)
    >>> supports_fused_sampled(fg, proposal, instances)
    True
    >>> sweep = FusedSampledSweep(fg, proposal, instances, torch.tensor([0, 1, 2]), torch.device("cpu"))
    >>> state, accepted, nonfinite, proposed = sweep.sweep(fg, torch.zeros(3, fg.num_variables))
    >>> state.shape, accepted.shape, proposed
    (torch.Size([3, 4]), torch.Size([3]), 6)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, TableGroup
from neuralblock.kernels.fused_blocks import (
    MAX_ENUMERATED_VALUES,
    BlockTable,
    BlockTableEnergy,
    _draw_cdf,
    _log_steps,
    context_keys,
    key_of,
)
from neuralblock.motif import MotifInstances
from neuralblock.proposals import NeuralBlockProposal

__all__ = ["FusedSampledSweep", "ProposalCache", "draw_blocks", "score_blocks", "supports_fused_sampled"]

_MAX_CACHE_FLOATS = 1 << 24  # stored floats per proposal (64 MB in float32); beyond, slots are recycled
_ENCODE_BATCH = 1 << 14  # network rows per forward pass while filling keys
_DEFENSIVE = 2.0**-14  # uniform share of each proposed variable: its values' steps stay above the CDF grid


def supports_fused_sampled(fg: FactorGraph, proposal: NeuralBlockProposal, instances: MotifInstances) -> bool:
    """Whether instances take this path: discrete blocks of more than 512 joint values on table factors, with
    contexts that hold each block's Markov blanket (:meth:`~neuralblock.kernels.fused_blocks.BlockTable.fits`)."""
    cards = list(proposal.motif.block_spec.cardinalities)
    if any(k == 0 for k in cards) or math.prod(cards) <= MAX_ENUMERATED_VALUES:
        return False
    return all(isinstance(g, TableGroup) for g in fg.groups) and BlockTable.fits(fg, instances, cards)


def _defensive(log_probs: Tensor) -> Tensor:
    """Categoricals ``[R, k]`` mixed with a uniform of weight ``_DEFENSIVE`` over each one's values (entries at
    ``-inf`` stay impossible): a value the network gives less than the CDF grid (2^-24) would never be proposed,
    so blocks alone could not reach it; this way every value is proposed, at almost no change in the proposal.

    Example:
        >>> _defensive(torch.tensor([[0.0, -200.0, -math.inf]])).exp().tolist()[0][2]
        0.0
    """
    valid = torch.isfinite(log_probs)
    uniform = valid / valid.sum(-1, keepdim=True).clamp_min(1)
    return torch.log((1 - _DEFENSIVE) * log_probs.exp() + _DEFENSIVE * uniform)


class ProposalCache:
    """Per (instance, context value) key: the proposal's component CDF ``[M]`` and variable CDFs ``[M, b, k]``.

    Args:
        proposal: the neural block proposal (discrete blocks).
        instances: all of the proposal's instances.
        cardinalities: ``[n]`` the graph's variable cardinalities.
        device: where the cache lives.
    """

    def __init__(
        self, proposal: NeuralBlockProposal, instances: MotifInstances, cardinalities: Tensor, device: torch.device
    ) -> None:
        self.proposal = proposal
        self.device = device
        self.context, self.radix, self.base, self.rows, _ = context_keys(instances.context, cardinalities, device)
        self.slot = torch.full((self.rows,), -1, dtype=torch.long, device=device)  # key -> stored row (-1: none)
        self.used = 0  # stored rows in use
        self.max_slots = 0  # set with the storage, once the number of components is known
        self.computed = 0  # keys computed by the network
        self.evictions = 0  # times every stored row was forgotten to make room
        self.mix_cdf = self.mix_log = self.var_cdf = self.var_log = torch.zeros(0, device=device)

    def keys(self, state: Tensor, rows: Tensor) -> Tensor:
        """Key of each (chain, instance): ``[K, I]`` for instances ``rows`` at states ``[K, n]``."""
        return key_of(self.base, self.context, self.radix, state, rows)

    def clear(self) -> None:
        """Forget every key (new parameters, or no room): keys are computed again as chains visit them."""
        self.slot.fill_(-1)
        self.used = 0

    def ensure(self, fg: FactorGraph, instances: MotifInstances, keys: Tensor, state: Tensor) -> Tensor:
        """The stored rows ``[K, I]`` of ``keys`` (of ``instances`` at states ``state``), computing missing ones."""
        slots = self.slot[keys]
        missing = slots < 0
        if not bool(missing.any()):
            return slots
        needed = int(keys[missing].unique().numel())
        if self.max_slots and self.used + needed > self.max_slots:
            self.clear()  # out of slots: forget every row, and compute every key of this call below
            self.evictions += 1
            missing = torch.ones_like(missing)
        chains = missing.any(-1).nonzero().squeeze(-1)
        cols = missing.any(0).nonzero().squeeze(-1)  # encode only the instances some chain needs
        where = missing[chains][:, cols]
        with torch.no_grad():
            features = self.proposal.motif.encode(fg, instances.select(cols.cpu()), state[chains].cpu())
        self._store(keys[chains][:, cols][where], features.to(self.device)[where])
        return self.slot[keys]

    def _store(self, keys: Tensor, features: Tensor) -> None:
        keys, inverse = torch.unique(keys, return_inverse=True)  # a key asked for by several chains: once
        first = torch.full((len(keys),), len(inverse), dtype=torch.long, device=keys.device)
        first = first.scatter_reduce(0, inverse, torch.arange(len(inverse), device=keys.device), "amin")
        features = features[first]
        for lo in range(0, len(keys), _ENCODE_BATCH):
            chunk = slice(lo, lo + _ENCODE_BATCH)
            with torch.no_grad():
                q = self.proposal(features[chunk].to(self.proposal.dtype))
            if q.discrete_log_probs is None or q.loc is not None:
                raise ValueError(f"motif {self.proposal.motif.name}: the sampled fused path needs discrete blocks")
            mix_log, var_log = q.mixture_log_weights, q.discrete_log_probs  # [r, M], [r, M, b, k]
            rows, (components, size, width) = len(mix_log), var_log.shape[1:]
            if self.max_slots == 0:
                self._allocate_storage(components, size, width)
            mix_cdf = _draw_cdf(mix_log, torch.float32)
            var_cdf = _draw_cdf(_defensive(var_log.reshape(-1, width)), torch.float32)
            stored = self._allocate(keys[chunk])
            self.mix_cdf[stored] = mix_cdf
            self.mix_log[stored] = _log_steps(mix_cdf)
            self.var_cdf[stored] = var_cdf.view(rows, components, size, width)
            self.var_log[stored] = _log_steps(var_cdf).view(rows, components, size, width)
        self.computed += len(keys)

    def _allocate_storage(self, components: int, size: int, width: int) -> None:
        per_key = 2 * (components + components * size * width)
        self.max_slots = max(1, min(self.rows, _MAX_CACHE_FLOATS // per_key))
        self.mix_cdf = torch.zeros(self.max_slots, components, device=self.device)
        self.mix_log = torch.zeros_like(self.mix_cdf)
        self.var_cdf = torch.zeros(self.max_slots, components, size, width, device=self.device)
        self.var_log = torch.zeros_like(self.var_cdf)

    def _allocate(self, keys: Tensor) -> Tensor:
        need = self.used + len(keys)
        if need > self.mix_cdf.shape[0]:  # only when one call alone needs more rows than the budget
            grow = need - self.mix_cdf.shape[0]
            for name in ("mix_cdf", "mix_log", "var_cdf", "var_log"):
                stored = getattr(self, name)
                setattr(self, name, torch.cat([stored, stored.new_zeros((grow,) + stored.shape[1:])]))
            self.max_slots = need
        rows = torch.arange(self.used, need, device=keys.device)
        self.slot[keys] = rows
        self.used = need
        return rows


def draw_blocks(cache: ProposalCache, slots: Tensor, uniforms: Tensor) -> Tensor:
    """Block values ``[K, I, b]`` drawn by inverse CDF from the stored rows ``slots [K, I]``: a component from
    ``uniforms[..., 0]``, then variable ``i`` from ``uniforms[..., 1 + i]`` (``uniforms [K, I, 1 + b]``)."""
    component = torch.searchsorted(cache.mix_cdf[slots], uniforms[..., :1].contiguous(), right=True)  # rows end at 1
    chosen = cache.var_cdf[slots, component.squeeze(-1)]  # [K, I, b, k]
    return torch.searchsorted(chosen, uniforms[..., 1:, None].contiguous(), right=True).squeeze(-1)


def score_blocks(cache: ProposalCache, slots: Tensor, values: Tensor) -> Tensor:
    """``log q`` of block values ``[K, I, m, b]`` under the rows ``slots [K, I]``: the log-sum-exp over components
    of the CDF steps :func:`draw_blocks` draws with (so the proposal scored is exactly the one drawn)."""
    components, size, width = cache.var_log.shape[1:]
    # flat offsets of (slot, component, variable) rows: one take reads the K I m M b steps, not whole rows
    rows = torch.arange(components * size, device=slots.device).view(components, size) * width
    index = (slots * (components * size * width))[:, :, None, None, None] + rows + values[:, :, :, None, :]
    per_component = cache.var_log.view(-1).take(index).sum(-1)  # [K, I, m, M]
    return torch.logsumexp(cache.mix_log[slots][:, :, None, :] + per_component, -1)


class FusedSampledSweep:
    """One proposal's colour classes on the sampled fused path, updated class by class for states ``[K, n]``.

    Args:
        fg: the graph (see :func:`supports_fused_sampled`).
        proposal: the neural block proposal.
        instances: the proposal's instances in sweep order (class by class).
        offsets: ``[C + 1]`` first instance of each class.
        device: where the state lives.
    """

    def __init__(
        self,
        fg: FactorGraph,
        proposal: NeuralBlockProposal,
        instances: MotifInstances,
        offsets: Tensor,
        device: torch.device,
    ) -> None:
        cards = list(proposal.motif.block_spec.cardinalities)
        self.device = device
        self.instances = instances
        bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist())
        self.rows = [torch.arange(lo, hi, device=device) for lo, hi in bounds if hi > lo]  # non-empty classes
        self.class_instances = [instances.select(rows.cpu()) for rows in self.rows]
        self.blocks = instances.blocks.to(device)
        self.energy = BlockTableEnergy(fg, instances.blocks, cards, enumerate_values=False).to(device)
        self.cache = ProposalCache(proposal, instances, fg.cardinalities, device)
        self.compiled = False
        self.compile_seconds = 0.0

    def refresh(self, fg: FactorGraph, instances: MotifInstances) -> None:
        """Follow new parameter values: new tables and instance parameters, every key recomputed."""
        self.energy.flat = BlockTableEnergy.flat_tables(fg).to(self.device)
        self.instances = instances
        self.class_instances = [instances.select(rows.cpu()) for rows in self.rows]
        self.cache.clear()

    def sweep(self, fg: FactorGraph, state: Tensor, beta: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, int]:
        """Update every class once.

        Args:
            fg: the graph.
            state: ``[K, n]`` states.
            beta: optional ``[K]`` inverse temperatures (targets ``p(x)^beta``; the proposal is not tempered).

        Returns:
            The states, accepted blocks per chain ``[K]``, the non-finite count and the proposals made.
        """
        chains = state.shape[0]
        accepted = torch.zeros(chains, dtype=torch.long, device=state.device)
        nonfinite = torch.zeros((), dtype=torch.long, device=state.device)
        for rows, instances in zip(self.rows, self.class_instances):
            state, acc, bad = self._update(fg, state, rows, instances, beta)
            accepted += acc.sum(-1)
            nonfinite += bad.sum()
        return state, accepted, nonfinite, chains * len(self.instances)

    def _update(
        self, fg: FactorGraph, state: Tensor, rows: Tensor, instances: MotifInstances, beta: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One exact MH update of the class ``rows``: accepted ``[K, I]`` and non-finite ``[K, I]`` indicators."""
        cache = self.cache
        slots = cache.ensure(fg, instances, cache.keys(state, rows), state)  # [K, I]
        chains, count = slots.shape
        blocks = self.blocks[rows]
        uniforms = torch.rand(chains, count, 1 + blocks.shape[1], device=state.device, dtype=cache.mix_cdf.dtype)
        proposed = draw_blocks(cache, slots, uniforms)
        current = state[:, blocks].long()
        both = torch.stack([proposed, current], 2)  # [K, I, 2, b]
        log_q = score_blocks(cache, slots, both)  # [K, I, 2]
        energy = self.energy.at_values(state, both, rows)  # [K, I, 2]
        change = energy[..., 0] - energy[..., 1]
        if beta is not None:
            change = change * beta[:, None].to(change.dtype)
        log_alpha = (change + (log_q[..., 1] - log_q[..., 0]).to(change.dtype)).double()
        finite = log_alpha < math.inf  # NaN and +inf (a current value of zero density) are rejected
        log_u = torch.rand(chains, count, device=state.device, dtype=torch.float64).log()
        accepted = (log_u < log_alpha) & finite
        new = torch.where(accepted[..., None], proposed, current).to(state.dtype)
        return state.index_copy(1, blocks.reshape(-1), new.reshape(chains, -1)), accepted, ~finite
