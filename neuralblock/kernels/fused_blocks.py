"""The fused neural block update for discrete blocks on table factors, batched over chains.

A colour class of motif instances is updated by one function over precomputed index
tensors, for states ``[K, n]`` of ``K`` chains at once:

1. **Proposal.** The MDN's proposal ``q(B | C, Psi)`` is a distribution over the ``J``
   joint values of the block (``J <= 512``; the MDN's per-variable categoricals are
   enumerated into one table, as the training's exact loss does). It depends on the state
   only through the discrete context values ``C``, and ``Psi`` is fixed for a graph, so
   :class:`ProposalTable` caches ``q`` per (instance, context value) the first time a chain
   visits it: after a short while a proposal is one gather, not a network pass. Where the
   context is too large to cache, the network runs on every call, still batched.
2. **Energy.** :class:`BlockTableEnergy` reads the scaffold factors' tables at the current
   and the proposed block value (one gather of the blanket values and one of table entries).
3. **Accept and scatter.** Exact MH with ``log p(B') - log p(B) + log q(B) - log q(B')``.

The arithmetic after the cache lookup is :func:`fused_class_update`, a pure function over
tensors that runs eagerly or under ``torch.compile`` with the same random numbers (drawn
outside it), so both paths give the same chain. Classes are padded to one shape (a padded
row repeats a real row *and its random numbers*, so both write the same value) and the
compiled function is built once per graph.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph(); _ = fg.add_variables(3, cardinality=2)
    >>> _ = fg.add_table_factors(torch.tensor([[0, 1], [1, 2]]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]] * 2))
    >>> energy = BlockTableEnergy(fg, torch.tensor([[0, 1]]), [2, 2])
    >>> energy(energy.flat, torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[[0, 3]]])).tolist()
    [[[1.0, 2.0]]]
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from neuralblock._memo import LastInputs
from neuralblock.graph import FactorGraph, TableGroup
from neuralblock.kernels.functional import use_numpy
from neuralblock.kernels.gibbs import SoftZeros, compiled, flat_tables, pad_by_owner
from neuralblock.kernels.jit import JIT_MAX_ENTRIES, NUMBA, block_sweep, timed_first_call
from neuralblock.motif import MotifInstances
from neuralblock.proposals import NeuralBlockProposal

__all__ = [
    "MAX_ENUMERATED_VALUES",
    "BlockTableEnergy",
    "BlockTable",
    "block_log_q_table",
    "fused_class_update",
    "fused_class_update_numpy",
    "supports_fused",
]

MAX_ENUMERATED_VALUES = 512
"""Largest number of joint block values the fused path enumerates (as the trainer's exact loss)."""

_MAX_CACHE_ENTRIES = 1 << 24  # floats per proposal table (64 MB in float32); beyond: rows kept in slots
_MAX_KEYS = 1 << 24  # (instance, context value) keys per proposal: float place values stay exact
_PREFILL_ROWS = 1 << 19  # context values per proposal tabulated at setup (beyond: filled as chains visit them)
_PREFILL_BATCH = 1 << 14  # network rows per forward pass while tabulating
_TEMPER_CHUNK = 4096  # rows per step while raising a table to the ladder's powers
_PREFILL_STATE_ENTRIES = 1 << 24  # state entries per batch of enumerated states while tabulating
NUMPY_MAX_ENTRIES = 8192
"""Largest state ``[K, n]`` (``K * n`` entries) whose sweeps take :func:`fused_class_update_numpy` by default.

Measured per transition against the torch function on the UAI 10x10 and 20x20 Ising grids with the shipped
``grid-mrf-2x2`` proposal: 1.6-1.7x faster at ``K = 1``, 1.2-1.7x at ``K = 4``, 1.37x on a 10x10 grid at ``K = 32``,
1.04-1.17x inside replica exchange (16 x 2 and 4 x 2 chains); 0.97-1.06x at 12,800 entries."""


def supports_fused(fg: FactorGraph, instances: MotifInstances, cardinalities: Sequence[int]) -> bool:
    """Whether instances can take the fused path.

    Their blocks are all discrete with at most 512 joint values, the graph has table
    factors only, and :meth:`BlockTable.fits` (discrete contexts that hold each block's
    Markov blanket, a table of bounded size).
    """
    if any(k == 0 for k in cardinalities) or math.prod(cardinalities) > MAX_ENUMERATED_VALUES:
        return False
    return all(isinstance(g, TableGroup) for g in fg.groups) and BlockTable.fits(fg, instances, cardinalities)


def _radix(cardinalities: Tensor) -> Tensor:
    """Mixed-radix place values, first position slowest: ``j = sum(value * radix)``."""
    cards = cardinalities.clamp(min=1)
    tail = torch.cat([cards.flip(-1).cumprod(-1).flip(-1)[..., 1:], torch.ones_like(cards[..., :1])], -1)
    return tail


def _disjoint_context_groups(context: Tensor, largest: int) -> list[Tensor]:
    """Instances ``[I, c]`` (``-1`` padded contexts) in groups whose contexts share no variable (greedy, in order).

    Each group holds at most ``largest`` instances.

    Example:
        >>> [g.tolist() for g in _disjoint_context_groups(torch.tensor([[0, 1], [1, 2], [3, -1], [2, 4]]), 4)]
        [[0, 2, 3], [1]]
    """
    groups_of: dict[int, set[int]] = {}  # variable -> the groups whose contexts hold it
    members: list[list[int]] = []
    open_from = 0  # groups before this one are full
    for i, row in enumerate(context.tolist()):
        variables = {v for v in row if v >= 0}
        while open_from < len(members) and len(members[open_from]) >= largest:
            open_from += 1
        g = len(members)
        if not any(len(groups_of.get(v, ())) >= len(members) for v in variables):  # else every group holds one
            blocked = set().union(*(groups_of.get(v, ()) for v in variables))
            g = next((k for k in range(open_from, len(members)) if k not in blocked and len(members[k]) < largest), g)
        if g == len(members):
            members.append([])
        members[g].append(i)
        for v in variables:
            groups_of.setdefault(v, set()).add(g)
    return [torch.tensor(group, dtype=torch.long) for group in members]


def context_keys(
    context: Tensor, cardinalities: Tensor, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """Keys of (instance, context value): one mixed-radix number per instance's context value, instance after instance.

    Args:
        context: ``[I, c]`` context variable ids (``-1``: padding).
        cardinalities: ``[n]`` the graph's variable cardinalities.
        device: where the index tensors live.

    Returns:
        ``(context [I, c]`` with padding at 0, ``radix [I, c]`` place values (0 for padding), ``base [I]`` first key of
        each instance, the number of keys, and the context cardinalities ``[I, c]`` (1 for padding)).

    Example:
        >>> context, radix, base, count, _ = context_keys(torch.tensor([[0, 1], [1, -1]]), torch.tensor([2, 3]), "cpu")
        >>> radix.tolist(), base.tolist(), count
        ([[3, 1], [1, 0]], [0, 6], 9)
    """
    cards = torch.where(context >= 0, cardinalities[context.clamp(min=0)], torch.ones_like(context))
    radix = (_radix(cards) * (context >= 0)).to(device)
    sizes = cards.prod(-1) if context.shape[1] else torch.ones(len(context), dtype=torch.long)
    base = (sizes.cumsum(0) - sizes).to(device)
    return context.clamp(min=0).to(device), radix, base, int(sizes.sum()), cards


def key_of(base: Tensor, context: Tensor, radix: Tensor, state: Tensor, rows: Tensor) -> Tensor:
    """The keys ``[K, I]`` of instances ``rows`` at states ``[K, n]`` (see :func:`context_keys`)."""
    return base[rows] + (state[:, context[rows]].long() * radix[rows]).sum(-1)


class BlockTableEnergy:
    """Scaffold log-density of blocks at chosen joint values, read from the table factors.

    For every (block, scaffold factor) pair, the table offset splits into a part set by the
    block's joint value ``j`` (precomputed for all ``J`` values) and a part set by the other
    scope variables (gathered from the state at call time). Pairs are laid out ``[I, d]``
    (``d`` the most factors any block touches; shorter rows read a zero entry).

    Args:
        fg: a graph of table factors.
        blocks: ``LongTensor [I, b]`` block variable ids.
        cardinalities: the block's domains.
        enumerate_values: precompute the block parts for all ``J`` joint values (:attr:`index`, ``[I, d, J]``);
            without it only :meth:`at_values` reads energies (blocks with too many joint values to store).
    """

    def __init__(
        self, fg: FactorGraph, blocks: Tensor, cardinalities: Sequence[int], enumerate_values: bool = True
    ) -> None:
        groups = cast(list[TableGroup], fg.groups)  # the fused path takes graphs of table factors only
        offsets = [0]
        for group in groups:
            offsets.append(offsets[-1] + group._flat.numel())
        self.zero = offsets[-1]
        size = len(cardinalities)
        num = blocks.shape[0]
        scaffold = fg.scaffold(blocks)
        arity = max([g.scopes.shape[1] for g in groups if g.num_factors] + [1])
        rows_scopes, rows_strides, rows_first, rows_block_strides, rows_block = [], [], [], [], []
        for group, rows, segment, first in zip(groups, scaffold.group_index, scaffold.group_segment, offsets):
            if rows.numel() == 0:
                continue
            scopes = group.scopes[rows]  # [m, a]
            strides = group._strides.expand_as(scopes)
            position = (scopes[:, :, None] == blocks[segment][:, None, :]).long()  # [m, a, b]
            in_block = position.sum(-1).bool()
            pad = arity - scopes.shape[1]
            rows_scopes.append(torch.nn.functional.pad(scopes * ~in_block, (0, pad)))
            rows_strides.append(torch.nn.functional.pad(strides * ~in_block, (0, pad)))
            rows_first.append(first + rows * group._size)  # [m] the factor's first entry
            rows_block_strides.append((strides[:, :, None] * position).sum(1))  # [m, b]
            rows_block.append(segment)
        if not rows_block:  # no block touches a factor: padding only
            empty = torch.zeros(0, dtype=torch.long)
            rows_scopes, rows_strides = [empty.reshape(0, arity)], [empty.reshape(0, arity)]
            rows_first, rows_block_strides, rows_block = [empty], [empty.reshape(0, size)], [empty]
        self.scopes, self.strides, self.first, self.block_strides = pad_by_owner(
            torch.cat(rows_block),
            num,
            [torch.cat(rows_scopes), torch.cat(rows_strides), torch.cat(rows_first), torch.cat(rows_block_strides)],
            [0, 0, self.zero, 0],
        )  # padded pairs read the zero entry
        self.index = torch.zeros(num, self.first.shape[1], 0, dtype=torch.long)  # [I, d, J]: see enumerate_values
        if enumerate_values:
            cards = [torch.arange(int(k)) for k in cardinalities]
            values = torch.stack(torch.meshgrid(*cards, indexing="ij"), -1).reshape(-1, size)
            self.index = self.first[..., None] + self.block_strides @ values.T
        self.flat = self.flat_tables(fg)

    @staticmethod
    def flat_tables(fg: FactorGraph) -> Tensor:
        """All table factors' log-tables in one flat tensor, then one zero entry (:func:`flat_tables`)."""
        return flat_tables(fg)

    def to(self, device: torch.device) -> BlockTableEnergy:
        """Move the index tensors and tables to ``device``."""
        for name in ("scopes", "strides", "first", "block_strides", "index", "flat"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def select(self, rows: Tensor) -> BlockTableEnergy:
        """The energy of the blocks at ``rows`` (a view sharing the tables)."""
        out = object.__new__(BlockTableEnergy)
        out.zero, out.flat = self.zero, self.flat
        for name in ("scopes", "strides", "first", "block_strides", "index"):
            setattr(out, name, getattr(self, name)[rows])
        return out

    def at_values(self, state: Tensor, blocks: Tensor, rows: Tensor | None = None) -> Tensor:
        """Scaffold log-density ``[K, I, m]`` of blocks at values ``blocks [K, I, m, b]``, the rest at ``state [K, n]``.

        Args:
            state: ``[K, n]`` states (their block variables are not read).
            blocks: ``[K, I, m, b]`` block values (``m`` candidates per block).
            rows: the ``I`` blocks' rows (default: all).

        Example:
            >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
            >>> _ = fg.add_table_factors(torch.tensor([[0, 1]]), torch.tensor([[[0.5, 0.0], [1.0, 2.0]]]))
            >>> energy = BlockTableEnergy(fg, torch.tensor([[0]]), [2], enumerate_values=False)
            >>> energy.at_values(torch.tensor([[0.0, 1.0]]), torch.tensor([[[[0], [1]]]])).tolist()
            [[[0.0, 2.0]]]
        """
        scopes, strides, first, block_strides = (
            (self.scopes, self.strides, self.first, self.block_strides)
            if rows is None
            else (self.scopes[rows], self.strides[rows], self.first[rows], self.block_strides[rows])
        )
        shift = first + (state[:, scopes].long() * strides).sum(-1)  # [K, I, d]
        parts = (blocks.long()[:, :, None, :, :] * block_strides[None, :, :, None, :]).sum(-1)  # [K, I, d, m]
        return self.flat[parts + shift.unsqueeze(-1)].sum(-2)

    def __call__(self, flat: Tensor, state: Tensor, joint: Tensor) -> Tensor:
        """Scaffold log-density ``[K, I, m]`` of blocks at joint values ``joint [K, I, m]``, the rest at ``state``."""
        return block_energy(flat, state, joint, self.scopes, self.strides, self.index)

    def sums(self, state: Tensor, joint: Tensor, split_zeros: bool) -> Tensor:
        """The scaffold log-density ``[K, I, m, 1]``, or with ``split_zeros`` ``[K, I, m, 3]``: the log-density, the sum
        of its finite table entries and the number of its zero entries (log ``-inf``), from one gather of the tables.

        Example:
            >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
            >>> _ = fg.add_table_factors(torch.tensor([[0, 1]]), torch.tensor([[[0.5, -math.inf], [1.0, 2.0]]]))
            >>> energy = BlockTableEnergy(fg, torch.tensor([[0]]), [2])
            >>> energy.sums(torch.tensor([[0.0, 1.0]]), torch.tensor([[[0, 1]]]), True)[0, 0].tolist()
            [[-inf, 0.0, 1.0], [2.0, 2.0, 0.0]]
        """
        shift = (state[:, self.scopes].long() * self.strides).sum(-1)  # [K, I, d]
        chosen = self.index.expand(state.shape[0], -1, -1, -1).gather(
            -1, joint[:, :, None, :].expand(-1, -1, self.index.shape[1], -1)
        )  # [K, I, d, m]
        entries = self.flat[chosen + shift.unsqueeze(-1)]
        total = entries.sum(-2)
        if not split_zeros:
            return total.unsqueeze(-1)
        zero = entries == -math.inf
        return torch.stack([total, entries.masked_fill(zero, 0.0).sum(-2), zero.sum(-2).to(total.dtype)], -1)


def block_energy(flat: Tensor, state: Tensor, joint: Tensor, scopes: Tensor, strides: Tensor, index: Tensor) -> Tensor:
    """The arithmetic of :class:`BlockTableEnergy` (a pure function, for compilation)."""
    shift = (state[:, scopes].long() * strides).sum(-1)  # [K, I, d]
    chosen = index.expand(state.shape[0], -1, -1, -1).gather(
        -1, joint[:, :, None, :].expand(-1, -1, index.shape[1], -1)
    )  # [K, I, d, m]
    return flat[chosen + shift.unsqueeze(-1)].sum(-2)


def block_log_q_table(proposal: NeuralBlockProposal, features: Tensor, values: Tensor) -> Tensor:
    """``log q(j | C)`` for every joint block value ``values [J, b]``: ``[..., J]`` from features ``[..., F]``.

    The MDN's components are products of per-variable categoricals; the table is their
    mixture at each enumerated joint value (normalized over ``J`` by construction).

    Example:
        >>> import torch
        >>> from neuralblock.motif import BlockSpec, Motif
        >>> class Pair(Motif):
        ...     name, block_spec, feature_dim = "pair-q", BlockSpec([2, 3]), 2
        ...     def options(self): return {}
        ...     def find_instances(self, fg): raise NotImplementedError
        ...     def encode(self, fg, instances, state): raise NotImplementedError
        ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
        >>> q = NeuralBlockProposal(Pair(), components=3, hidden=(8,))
        >>> table = block_log_q_table(q, torch.randn(5, 2), Pair.block_spec.enumerate())
        >>> table.shape, bool(torch.allclose(table.logsumexp(-1), torch.zeros(5), atol=1e-5))
        (torch.Size([5, 6]), True)
    """
    with torch.no_grad():
        mixture = proposal(features.to(proposal.dtype))
        logp = mixture.discrete_log_probs  # [..., C, D, kmax]
        size, kmax = logp.shape[-2:]
        if size == 1:  # one variable: its log-probabilities are the table (a product would cost J times more)
            picked = logp[..., 0, :].index_select(-1, values[:, 0].long().to(logp.device))
            return torch.logsumexp(mixture.mixture_log_weights.unsqueeze(-1) + picked, -2)
        flat_index = (torch.arange(size) * kmax + values.long()).to(logp.device)  # [J, D]
        # sum over the block's variables of each joint value's log-probabilities as one matrix product with a 0/1
        # selector (a gather of [..., C, J, D] then a sum is several times slower); -inf entries (impossible values)
        # are held at a finite floor so that 0 * floor stays 0, and restored afterwards
        selector = torch.zeros(size * kmax, len(values), dtype=logp.dtype, device=logp.device)
        selector[flat_index, torch.arange(len(values), device=logp.device)[:, None]] = 1.0
        floor = torch.finfo(logp.dtype).min / (2 * size)
        picked = logp.clamp_min(floor).flatten(-2) @ selector  # [..., C, J]
        picked = picked.masked_fill(picked <= floor, -math.inf)
        return torch.logsumexp(mixture.mixture_log_weights.unsqueeze(-1) + picked, -2)


class BlockTable:
    """Per (instance, context value): the proposal's CDF and ``log p - log q`` over the ``J`` joint block values.

    The proposal depends on the state only through the instance's discrete context
    variables (``Psi`` is fixed for a graph), and so does the block's scaffold energy when
    the context holds every other variable of the scaffold factors (its Markov blanket).
    Both are then functions of ``(instance, context value)``, a mixed-radix key, and a
    block update needs only two rows of this table. Rows are tabulated at setup when the
    context space is small (:meth:`prefill`), else computed the first time a chain visits
    them (:meth:`ensure`); the chain is exactly the one with a network pass per proposal.

    When a dense table of every key would exceed ``_MAX_CACHE_ENTRIES`` floats (e.g. the
    ``crf_tags`` instances of a whole corpus: 169 context values times 169 block values each),
    rows live in *slots* (:attr:`slot` maps a key to its row of the stored tensors, ``-1``
    while it has none): only visited keys take memory, and when the slots run out every row
    is forgotten and recomputed on the next visit (the same rows up to the network's float32
    rounding, which depends on the batch a row is computed in: a few units of the 2^-24 CDF grid).

    Args:
        fg: the graph (table factors).
        proposal: the neural block proposal.
        instances: all of the proposal's instances (sweep order).
        energy: their :class:`BlockTableEnergy`.
        device: where the table lives.
    """

    def __init__(
        self,
        fg: FactorGraph,
        proposal: NeuralBlockProposal,
        instances: MotifInstances,
        energy: BlockTableEnergy,
        device: torch.device,
    ) -> None:
        self.proposal = proposal
        self.energy = energy
        self.device = device
        self.values = proposal.motif.block_spec.enumerate().long().to(device)  # [J, b]
        self.context, self.radix, self.base, self.rows, self._ctx_cards = context_keys(
            instances.context, fg.cardinalities, device
        )
        self.computed = 0  # rows computed by the network (setup and visits)
        width = len(self.values)
        dense = self.rows * width * 2 <= _MAX_CACHE_ENTRIES
        # slots: None (dense, row = key), else key -> stored row (-1: none yet)
        self.slot: Tensor | None = None if dense else torch.full((self.rows,), -1, dtype=torch.long, device=device)
        self.max_slots = self.rows if dense else max(1, _MAX_CACHE_ENTRIES // (3 * width))
        self.used = 0  # stored rows in use (slots only)
        self.evictions = 0  # times every stored row was forgotten to make room (slots only)
        stored = self.rows if dense else min(self.max_slots, self.rows)  # all slots at once: fixed shapes
        self.cdf = torch.zeros(stored, width, device=device)
        self.log_ratio = torch.zeros(stored, width, device=device)
        self.energy_rows = torch.zeros(stored, width, device=device)  # for tempered targets
        self.log_q = torch.zeros(stored, width, device=device)  # the network's log q (tempered proposals)
        # where some table entry is 0 (log -inf): each row's finite part and count of zero entries, so the
        # energies with the zeros at any finite log-potential follow (soft_energy, SoftZeros)
        self._zero_rows()
        self.filled = torch.zeros(self.rows, dtype=torch.bool, device=device)
        self.prefilled = dense and self.rows <= _PREFILL_ROWS
        if self.prefilled:
            self.prefill(fg, instances)

    def _zero_rows(self) -> None:
        """Storage of each row's finite energy and zero count, where the tables have zeros (else empty)."""
        self.has_zeros = bool((self.energy.flat == -math.inf).any())
        stored = self.cdf.shape[0] if self.has_zeros else 0
        self.finite_energy = self.cdf.new_zeros(stored, self.cdf.shape[1])
        self.zero_count = self.cdf.new_zeros(stored, self.cdf.shape[1])

    @staticmethod
    def fits(fg: FactorGraph, instances: MotifInstances, cardinalities: Sequence[int]) -> bool:
        """Whether the table applies: discrete contexts holding each block's blanket, and a table of bounded size."""
        context = instances.context
        if len(instances) == 0:
            return False
        cards = fg.cardinalities[context.clamp(min=0)]
        if bool(((context >= 0) & (cards == 0)).any()):
            return False
        sizes = torch.where(context >= 0, cards, torch.ones_like(cards)).double().prod(-1)
        if float(sizes.sum()) > _MAX_KEYS:
            return False
        for block, ctx in zip(instances.blocks.tolist(), context.tolist()):
            if not set(fg.markov_blanket(block)) <= set(ctx) or set(block) & set(ctx):
                return False  # (a block variable in the context: the reverse proposal would read another key)
        return True

    def clear(self) -> None:
        """Forget every row (the graph's parameters changed): rows are computed again as chains visit them.

        A compound sampler may change the parameters at every transition, so nothing is
        tabulated here; once every row is filled again, lookups skip the check again.
        """
        self.filled.zero_()
        self.prefilled = False
        self._zero_rows()  # the new tables may gain or lose zeros
        if self.slot is not None:
            self.slot.fill_(-1)
            self.used = 0

    def keys(self, state: Tensor, rows: Tensor) -> Tensor:
        """Table row of each (chain, instance): ``[K, I]`` for instances ``rows`` at states ``[K, n]``."""
        return key_of(self.base, self.context, self.radix, state, rows)

    def prefill(self, fg: FactorGraph, instances: MotifInstances) -> None:
        """Tabulate every context value of every instance (setup time).

        Instances whose contexts share no variable are tabulated together: one state sets
        each of their contexts to its own value (the other variables stay at their initial
        values, which neither the features nor the scaffold read), so a batch of states
        is encoded, scored and run through the network for a whole group at once.
        """
        start = fg.initial_state()
        if fg.evidence:
            start[torch.tensor(list(fg.evidence))] = torch.tensor(list(fg.evidence.values()), dtype=start.dtype)
        features, ratios, rows = [], [], []
        max_states = max(1, _PREFILL_STATE_ENTRIES // max(1, fg.num_variables))  # bounded memory: [batch, n] states
        for group in _disjoint_context_groups(instances.context, _PREFILL_BATCH):
            cards, radix = self._ctx_cards[group], self.radix[group].cpu()  # [G, c]
            valid = radix > 0
            written = self.context[group].cpu()[valid]  # the group's context variables (distinct)
            sizes = cards.prod(-1)  # [G] context values of each instance
            one = instances.select(group)
            energy = self.energy.select(group.to(self.device))
            base = self.base[group.to(self.device)]  # [G] first row of each instance
            batch = max(1, min(_PREFILL_BATCH // len(group), max_states))
            for lo in range(0, int(sizes.max()), batch):
                code = torch.arange(lo, min(lo + batch, int(sizes.max())))  # [B]
                digits = code[:, None, None] // radix.clamp(min=1) % cards  # [B, G, c]
                states = start.expand(len(code), -1).clone()  # on the CPU, where the motif's data lives
                states[:, written] = digits[:, valid].to(states.dtype)
                keep = (code[:, None] < sizes).to(self.device)  # [B, G]: instances with fewer values stop early
                joint = torch.arange(len(self.values), device=self.device).expand(len(code), len(group), -1)
                features.append(self._features(fg, one, states)[keep])
                ratios.append(energy.sums(states.to(self.device), joint, self.has_zeros)[keep])  # [B, G, J, e]
                rows.append((base + code[:, None].to(self.device))[keep])
        self._store(torch.cat(rows), torch.cat(features), torch.cat(ratios))

    def ensure(self, fg: FactorGraph, instances: MotifInstances, keys: Tensor, rows: Tensor, state: Tensor) -> None:
        """Compute the rows ``keys [K, I]`` not yet in the table (instances ``rows``, data ``instances``)."""
        missing = ~self.filled[keys]
        if not bool(missing.any()):
            return
        if self.slot is not None and self.used + int(keys[missing].unique().numel()) > self.max_slots:
            self.clear()  # out of slots: forget every row (this call's rows are all recomputed below)
            self.evictions += 1
            missing = torch.ones_like(missing)
        chains = missing.any(-1).nonzero().squeeze(-1)
        cols = missing.any(0).nonzero().squeeze(-1)  # encode and score only the instances some chain needs
        where = missing[chains][:, cols]
        if len(cols) < len(instances):
            instances, rows, keys = instances.select(cols.cpu()), rows[cols], keys[:, cols]
        features = self._features(fg, instances, state[chains].cpu())[where]
        joint = torch.arange(len(self.values), device=self.device).expand(len(chains), len(instances), -1)
        scores = self.energy.select(rows).sums(state[chains], joint, self.has_zeros)[where]
        self._store(keys[chains][where], features, scores)
        self.prefilled = self.slot is None and bool(self.filled.all())  # slots: some rows may be forgotten

    def soft_energy(self, log_zero: float) -> Tensor:
        """Block energies ``[stored, J]`` with every zero table entry at the log-potential ``log_zero``.

        Example:
            >>> table = object.__new__(BlockTable)
            >>> table.has_zeros, table.energy_rows = True, torch.tensor([[-math.inf, 1.0]])
            >>> table.finite_energy, table.zero_count = torch.tensor([[0.5, 1.0]]), torch.tensor([[2.0, 0.0]])
            >>> table.soft_energy(-10.0).tolist()
            [[-19.5, 1.0]]
        """
        if not self.has_zeros or log_zero == -math.inf:
            return self.energy_rows
        return self.finite_energy + log_zero * self.zero_count

    def _store(self, keys: Tensor, features: Tensor, energy: Tensor) -> None:
        """Write rows: the proposal's CDF and ``energy - log q``.

        ``energy [r, J, e]`` holds each row's block sums over all joint values of the flat tables of
        :meth:`BlockTableEnergy.sums` (``e`` = 1 or 3).
        """
        if self.slot is not None:  # one slot per key: rows asked for by several chains are computed once
            keys, inverse = torch.unique(keys, return_inverse=True)
            first = torch.full((len(keys),), len(inverse), dtype=torch.long, device=keys.device)
            first = first.scatter_reduce(0, inverse, torch.arange(len(inverse), device=keys.device), "amin")
            features, energy = features[first], energy[first]
        rows = self._allocate(keys)
        for lo in range(0, len(keys), _PREFILL_BATCH):
            chunk = slice(lo, lo + _PREFILL_BATCH)
            log_q = block_log_q_table(self.proposal, features[chunk], self.values)
            cdf = _draw_cdf(log_q, self.cdf.dtype)
            self.cdf[rows[chunk]] = cdf
            # the proposal the sampler draws is the stored CDF's steps (on the grid of the uniforms, a uniform lands
            # in [c_{j-1}, c_j) with probability exactly c_j - c_{j-1}): the MH ratio uses exactly those, not the
            # network's log q, so rounding in the CDF cannot bias the chain (a value whose step is 0 is never
            # proposed, and never left by a block)
            log_drawn = _log_steps(cdf).to(self.cdf.dtype)
            sums = energy[chunk].to(self.cdf.dtype)
            self.log_ratio[rows[chunk]] = sums[..., 0] - log_drawn
            self.energy_rows[rows[chunk]] = sums[..., 0]
            self.log_q[rows[chunk]] = log_q.to(self.cdf.dtype)
            if self.has_zeros:
                self.finite_energy[rows[chunk]] = sums[..., 1]
                self.zero_count[rows[chunk]] = sums[..., 2]
        self.filled[keys] = True
        self.computed += len(keys)

    def _allocate(self, keys: Tensor) -> Tensor:
        """Stored rows for new ``keys`` (distinct in slot mode): the keys themselves, or fresh slots."""
        if self.slot is None:
            return keys
        need = self.used + len(keys)
        if need > self.cdf.shape[0]:  # only when one call alone needs more rows than the slot budget
            grow = need - self.cdf.shape[0]
            names = ("cdf", "log_ratio", "energy_rows", "log_q") + (
                ("finite_energy", "zero_count") if self.has_zeros else ()
            )
            for name in names:
                stored = getattr(self, name)
                setattr(self, name, torch.cat([stored, stored.new_zeros(grow, stored.shape[1])]))
        rows = torch.arange(self.used, need, device=keys.device)
        self.slot[keys] = rows
        self.used = need
        return rows

    def _features(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """The motif's features at CPU states ``[..., n]`` (where the graph's data lives), on the table's device."""
        with torch.no_grad():
            features = self.proposal.motif.encode(fg, instances, state).to(self.device)
        if features.shape[-2] != len(instances):
            raise ValueError(
                f"motif {self.proposal.motif.name} encoded {len(instances)} instances as features of shape "
                f"{tuple(features.shape)}; expected [..., {len(instances)}, feature_dim]"
            )
        return features


def fused_class_update(
    state: Tensor,
    ids: Tensor,
    context_radix: Tensor,
    block_radix: Tensor,
    block_ids: Tensor,
    base: Tensor,
    cdf: Tensor,
    log_ratio: Tensor,
    draws: Tensor,
    log_accept: Tensor,
    values: Tensor,
    energy: Tensor | None = None,
    beta: Tensor | None = None,
    slot: Tensor | None = None,
    key_offset: Tensor | None = None,
    zeros: Tensor | None = None,
    log_zero: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One exact MH block update of a colour class, for states ``[K, n]``.

    With ``w = log p(B | blanket) - log q(B | C)`` read from the table row of the current
    context, the MH log-ratio of a proposed joint value ``j'`` from ``j`` is ``w[j'] - w[j]``.
    For tempered targets ``p(x)^beta`` (one ``beta`` per chain), either each chain reads the rows of
    its temperature's own table (``key_offset``: proposal and energies of the tempered model, so
    ``w`` is already tempered), or it reads the untempered rows and the log-ratio gains
    ``(beta - 1) (E[j'] - E[j])``, with the rows' block energies ``E`` (any proposal keeps MH exact). With
    both, a chain reads the rows of a nearby temperature's table and ``beta - 1`` is its own ``beta`` less
    that table's; ``E`` is read at the key before the offset (the untempered table's row).
    With ``zeros`` (each row's count ``Z`` of zero table entries) and ``log_zero`` (one per chain), the
    chains target ``exp(beta (F + log_zero Z))`` (:class:`~neuralblock.kernels.gibbs.SoftZeros`), where
    ``E = F`` and ``w`` are the rows' finite parts: the log-ratio gains ``beta log_zero (Z[j'] - Z[j])``.

    Args:
        state: ``[K, n]`` states.
        ids: ``[I * (c + b)]`` each instance's context ids then block ids, flattened (rows may
            repeat: see the module docstring).
        context_radix: ``[I, c]`` mixed-radix place values of the context value (0 for padding)
            within the instance's rows, or ``[c]`` when every instance has the same (the state's dtype).
        block_radix: ``[b]`` place values of the block's joint value (the state's dtype).
        block_ids: ``[I * b]`` the block ids, flattened.
        base: ``[I]`` first table row of each instance.
        cdf: ``[R, J]`` the proposal's CDF over joint block values, per row (each row ends at 1).
        log_ratio: ``[R, J]`` ``w`` per row.
        draws: ``[K, I]`` uniforms of the proposal draws (inverse CDF).
        log_accept: ``[K, I]`` logs of the uniforms of the accept tests.
        values: ``[J, b]`` block values of each joint index (the state's dtype).
        energy: ``[R, J]`` block energies ``E`` per row of the untempered table (tempered targets only).
        beta: ``[K]`` inverse temperatures (with ``energy``), or ``None`` for the target itself.
        slot: ``[keys]`` the stored row of each key (a :class:`BlockTable` in slot mode), or ``None``
            when the rows are the keys.
        key_offset: ``[K]`` a first row per chain, added to every key (tempered tables: each chain reads
            the block of rows of its temperature), or ``None``.
        zeros: ``[R, J]`` zero entries per row (with ``log_zero``), or ``None``.
        log_zero: ``[K]`` each chain's log-potential of a zero entry (``-inf``: the model itself).

    Returns:
        The new states, the accept indicator ``[K, I]`` and the finite-ratio indicator ``[K, I]``.
    """
    chains, count = state.shape[0], base.shape[0]
    width, size = cdf.shape[-1], block_radix.shape[0]
    read = state.index_select(1, ids).view(chains, count, -1)  # [K, I, c + b]
    context, block = read.split([read.shape[-1] - size, size], -1)
    # float place values: keys stay below 2^24, so these sums are exact
    if context_radix.dim() == 1:  # every instance has the same place values: one matrix-vector product
        keys = base + (context @ context_radix).long()  # [K, I]
    else:
        keys = base + (context * context_radix).sum(-1).long()
    current = (block @ block_radix).long()
    if key_offset is not None:
        keys = keys + key_offset[:, None]
    if slot is not None:
        keys = slot.index_select(0, keys.view(-1)).view(chains, count)
    rows = cdf.index_select(0, keys.view(-1)).view(chains, count, width)  # [K, I, J]
    proposed = torch.searchsorted(rows, draws.unsqueeze(-1), right=True).squeeze(-1)  # the rows end at 1
    first = keys * width
    flat_ratio = log_ratio.view(-1)
    log_alpha = flat_ratio.take(first + proposed) - flat_ratio.take(first + current)
    if energy is not None and beta is not None:  # (the energies' rows are the table's: before any offset)
        flat_energy = energy.view(-1)
        table_first = first if key_offset is None else first - key_offset[:, None] * width
        change = flat_energy.take(table_first + proposed) - flat_energy.take(table_first + current)
        gap = beta[:, None] - 1
        log_alpha = log_alpha + torch.where(gap == 0, torch.zeros_like(change), gap * change)  # (no 0 * -inf)
    if zeros is not None and log_zero is not None:
        flat_zeros = zeros.view(-1)
        gained = flat_zeros.take(first + proposed) - flat_zeros.take(first + current)
        penalty = torch.where(gained == 0, torch.zeros_like(gained), log_zero[:, None] * gained)
        log_alpha = log_alpha + (penalty if beta is None else beta[:, None] * penalty)
    finite = log_alpha < math.inf  # NaN and +inf (a current value of zero density) are rejected
    accepted = (log_accept < log_alpha) & finite
    chosen = torch.where(accepted, proposed, current)
    new = values.index_select(0, chosen.view(-1)).view(chains, -1)  # repeated (padded) rows write equal values
    return state.index_copy(1, block_ids, new), accepted, finite


def fused_class_update_numpy(
    state: np.ndarray,
    ids: np.ndarray,
    context_radix: np.ndarray,
    block_radix: np.ndarray,
    block_ids: np.ndarray,
    base: np.ndarray,
    cdf: np.ndarray,
    log_ratio: np.ndarray,
    draws: np.ndarray,
    log_accept: np.ndarray,
    values: np.ndarray,
    energy: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    slot: np.ndarray | None = None,
    key_offset: np.ndarray | None = None,
    zeros: np.ndarray | None = None,
    log_zero: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fused_class_update` on NumPy arrays (CPU states), writing the new block values into ``state`` in place.

    The same arithmetic in the same dtypes, so from the same uniforms it makes the same
    decisions; NumPy's calls cost a fraction of torch's dispatch on these small arrays (about
    45 against 85 us per class of a 10x10 grid at 32 chains). The proposal's inverse CDF is the
    first step above the uniform (``argmax`` of ``cdf > u``: the rows end at 1 and ``u < 1``),
    which is ``searchsorted(..., right=True)``.

    Returns:
        The accept indicator ``[K, I]`` and the finite-ratio indicator ``[K, I]``.

    Example:
        >>> state = np.zeros((1, 2), dtype=np.float32)
        >>> cdf = np.array([[0.25, 0.5, 0.75, 1.0]], dtype=np.float32)  # one instance, no context, one row
        >>> args = (np.array([0, 1]), np.zeros(0, np.float32), np.array([2.0, 1.0], np.float32), np.array([0, 1]),
        ...         np.array([0]), cdf, np.zeros((1, 4), np.float32), np.array([[0.6]], np.float32),
        ...         np.array([[-1.0]]), np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32))
        >>> accepted, finite = fused_class_update_numpy(state, *args)
        >>> state.tolist(), accepted.tolist()  # u = 0.6 draws joint value 2, accepted (equal weights)
        ([[1.0, 0.0]], [[True]])
    """
    with np.errstate(invalid="ignore"):  # inf - inf (both values impossible) and NaN ratios are rejected below
        chains, count = state.shape[0], base.shape[0]
        width, size = cdf.shape[-1], block_radix.shape[0]
        read = state[:, ids].reshape(chains, count, -1)  # [K, I, c + b]
        context, block = read[..., :-size], read[..., -size:]
        # float place values: keys stay below 2^24, so these sums are exact in any order
        if context_radix.ndim == 1:
            keys = base + (context @ context_radix).astype(np.int64)
        else:
            keys = base + (context * context_radix).sum(-1).astype(np.int64)
        current = (block @ block_radix).astype(np.int64)
        if key_offset is not None:
            keys = keys + key_offset[:, None]
        if slot is not None:
            keys = slot[keys]
        proposed = (cdf[keys] > draws[..., None]).argmax(-1)  # [K, I]
        first = keys * width
        at_proposed, at_current = first + proposed, first + current
        flat_ratio = log_ratio.reshape(-1)
        log_alpha = flat_ratio[at_proposed] - flat_ratio[at_current]
        if energy is not None and beta is not None:  # (the energies' rows are the table's: before any offset)
            flat_energy = energy.reshape(-1)
            shift = 0 if key_offset is None else key_offset[:, None] * width
            change = flat_energy[at_proposed - shift] - flat_energy[at_current - shift]
            gap = beta[:, None] - 1
            log_alpha = log_alpha + np.where(gap == 0, np.zeros_like(change), gap * change)  # (no 0 * -inf: NaN)
        if zeros is not None and log_zero is not None:
            flat_zeros = zeros.reshape(-1)
            gained = flat_zeros[at_proposed] - flat_zeros[at_current]
            penalty = np.where(gained == 0, np.zeros_like(gained), log_zero[:, None] * gained)  # (-inf * 0 masked out)
            log_alpha = log_alpha + (penalty if beta is None else beta[:, None] * penalty)
        finite = log_alpha < math.inf  # NaN and +inf (a current value of zero density) are rejected
        accepted = (log_accept < log_alpha) & finite
        chosen = np.where(accepted, proposed, current)
        # repeated (padded) rows write equal values
        state[:, block_ids] = values[chosen.reshape(-1)].reshape(chains, -1)
        return accepted, finite


class _TemperedTables(NamedTuple):
    """Stacked proposal rows of the tempered models of a ladder, ``rows`` per temperature (see :func:`powered_rows`)."""

    betas: Tensor
    cdf: Tensor
    log_ratio: Tensor
    rows: int
    log_zero: Tensor | None = None  # per temperature: the zero entries' log-potential (SoftZeros)

    def assign(self, beta: Tensor) -> tuple[Tensor, Tensor] | None:
        """Each chain's table, the coldest at or above its temperature: first rows ``[K]`` and the tables' ``beta``.

        ``None`` when some chain is hotter than every table. A chain between two tables reads the hotter one's
        (flatter) rows, with the energy correction ``(beta - beta_table) dE`` in its MH ratio.

        Example:
            >>> betas = torch.tensor([1.0, 0.25], dtype=torch.float64)
            >>> t = _TemperedTables(betas, torch.ones(4, 1), torch.ones(4, 1), 2)
            >>> rows, table_beta = t.assign(torch.tensor([1.0, 0.5, 0.25]))
            >>> rows.tolist(), table_beta.tolist(), t.assign(torch.tensor([0.1]))
            ([0, 2, 2], [1.0, 0.25, 0.25], None)
        """
        chain = beta.to(self.betas)
        usable = self.betas[None, :] <= chain[:, None]  # [K, A] tables at or above each chain's temperature
        if not bool(usable.any(1).all()):
            return None
        index = torch.where(usable, self.betas[None, :], -math.inf).argmax(1)  # the coldest of them
        return index * self.rows, self.betas[index]


def powered_rows(table: BlockTable, betas: Tensor, log_zero: Tensor | None = None) -> _TemperedTables:
    """Rows for the tempered models ``p(x)^beta``: the table's proposal raised to the power ``beta``.

    The log importance weights ``log p^beta - log q^beta`` of the block conditional are
    ``beta`` times those at ``beta = 1``, so where ``q(B | C)`` fits ``p(B | blanket)`` well,
    ``q^beta / Z`` fits ``p(B | blanket)^beta / Z'`` as well or better. Block energies of table
    factors scale by ``beta`` too, so each temperature's rows come from the (fully tabulated)
    table's network log-probabilities and block energies, ``[J]`` arithmetic per row and
    temperature, with no network pass. The powers are taken of the network's ``log q``, not of
    the CDF's float steps, so values too unlikely for the ``beta = 1`` CDF to draw (a step of 0)
    are drawn at the temperatures where they gain mass. MH is exact for any proposal.

    With ``log_zero`` (``[R]``), temperature ``r``'s model gives every zero table entry the
    log-potential ``log_zero[r]`` (``-inf``: the model itself; see
    :class:`~neuralblock.kernels.gibbs.SoftZeros`).

    Example:
        >>> import torch
        >>> from neuralblock import FactorGraph
        >>> from neuralblock.motif import BlockSpec, Motif, MotifInstances
        >>> class Pair(Motif):
        ...     name, block_spec, feature_dim = "pair-pow", BlockSpec([2, 2]), 1
        ...     def options(self): return {}
        ...     def find_instances(self, fg):
        ...         return MotifInstances(torch.tensor([[0, 1]]), torch.zeros(1, 0).long(), torch.zeros(1, 0))
        ...     def encode(self, fg, instances, state): return torch.zeros(state.shape[:-1] + (1, 1))
        ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> _ = fg.add_table_factor([0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
        >>> q = NeuralBlockProposal(Pair(), components=2, hidden=(4,))
        >>> found = q.motif.find_instances(fg)
        >>> table = BlockTable(fg, q, found, BlockTableEnergy(fg, found.blocks, [2, 2]), torch.device("cpu"))
        >>> hot = powered_rows(table, torch.tensor([1.0, 0.5]))
        >>> bool(torch.allclose(hot.cdf[:1], table.cdf)), hot.cdf.shape[0], hot.assign(torch.tensor([0.5]))[0].tolist()
        (True, 2, [1])
    """
    if table.slot is not None or not table.prefilled:
        raise ValueError("tempered rows are made of fully tabulated dense tables")
    betas = betas.to(table.device, torch.float64)
    rows = table.cdf.shape[0]
    cdf = table.cdf.new_empty(len(betas) * rows, table.cdf.shape[1])
    log_ratio = torch.empty_like(cdf)
    for r, beta in enumerate(betas.tolist()):
        energy = table.energy_rows if log_zero is None else table.soft_energy(float(log_zero[r]))
        for lo in range(0, rows, _TEMPER_CHUNK):  # small chunks: the temporaries stay in cache, not fresh pages
            part = slice(lo, min(lo + _TEMPER_CHUNK, rows))
            out = slice(r * rows + part.start, r * rows + part.stop)
            cdf_beta = table.cdf[part] if beta == 1.0 else _draw_cdf(beta * table.log_q[part], table.cdf.dtype)
            cdf[out] = cdf_beta
            torch.sub(energy[part] * beta, _log_steps(cdf_beta), out=log_ratio[out])
    return _TemperedTables(betas, cdf, log_ratio, table.rows, None if log_zero is None else log_zero.double().cpu())


_WholeRows = tuple[tuple[np.ndarray, np.ndarray], tuple["np.ndarray | None", ...], tuple, bool]
"""A compiled whole sweep's rows: the CDF and ``w``, the values and chains' extras, the layout, whether tempered."""


def _numpy_or_none(tensor: Tensor | None) -> np.ndarray | None:
    """The NumPy view of a CPU tensor, or ``None``."""
    return None if tensor is None else tensor.numpy()


def _draw_cdf(log_q: Tensor, dtype: torch.dtype) -> Tensor:
    """CDF rows ``[R, J]`` of the distributions ``softmax(log_q)``, on the grid of ``torch.rand``'s values in ``dtype``.

    ``torch.rand`` draws multiples of ``eps / 2`` (``2^-24`` in float32): with every CDF value on
    that grid, a uniform lands on each value with probability exactly its CDF step, so the MH
    ratios, which read the steps (:func:`_log_steps`), are those of the proposal actually drawn,
    however the CDF was rounded. The arithmetic is in ``dtype``: a cumulative sum of
    non-negative terms, divided by its last term and rounded, stays non-decreasing and ends at 1.

    Example:
        >>> cdf = _draw_cdf(torch.tensor([[0.0, -30.0, 0.0]]), torch.float32)
        >>> cdf.tolist(), bool(((cdf * 2**24) % 1 == 0).all())
        ([[0.5, 0.5, 1.0]], True)
    """
    grid = torch.finfo(dtype).eps / 2
    cdf = torch.softmax(log_q.to(dtype), -1).cumsum_(-1)
    cdf = cdf.div_(cdf[:, -1:] * grid).round_().mul_(grid)
    cdf[:, -1] = 1.0  # a uniform in [0, 1) always lands on a value
    return cdf


def _log_steps(cdf: Tensor) -> Tensor:
    """``log`` of the steps of CDF rows ``[R, J]`` on the grid of :func:`_draw_cdf`: each value's draw probability.

    Differences of values on the grid are exact in the CDF's own dtype.
    """
    return torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[:, :1])).clamp_min_(0.0).log_()


class FusedBlockSweep:
    """One proposal's colour classes on the fused path: padded to one shape, updated class by class.

    Args:
        fg: the graph (table factors only; see :func:`supports_fused`).
        proposal: the neural block proposal (discrete blocks of at most 512 joint values).
        instances: the proposal's instances in sweep order (class by class).
        offsets: ``[C + 1]`` first instance of each class.
        device: where the state lives.
        compile: run :func:`fused_class_update` under ``torch.compile``; eager updates of small CPU states run
            :func:`fused_class_update_numpy` (attribute ``numpy``: ``None`` by size, see :data:`NUMPY_MAX_ENTRIES`;
            ``True`` or ``False`` to choose). Where Numba is installed (attribute ``jit``, default ``True``),
            that path runs the compiled loop of :mod:`~neuralblock.kernels.jit` (a whole sweep in one call; the same
            draws) for states of up to :data:`~neuralblock.kernels.jit.JIT_MAX_ENTRIES` entries.
    """

    def __init__(
        self,
        fg: FactorGraph,
        proposal: NeuralBlockProposal,
        instances: MotifInstances,
        offsets: Tensor,
        device: torch.device,
        compile: bool,
    ) -> None:
        cards = list(proposal.motif.block_spec.cardinalities)
        self.device = device
        self.sizes = offsets.diff().tolist()
        width = max(self.sizes)
        # padded row i of class c repeats the class's last real row (and its random numbers)
        self.rand_index = [torch.arange(width).clamp(max=size - 1).to(device) for size in self.sizes]
        self.rows = [int(lo) + r for lo, r in zip(offsets[:-1].tolist(), self.rand_index)]
        self.instances = instances
        self.class_instances = [instances.select(rows.cpu()) for rows in self.rows]
        self.values = proposal.motif.block_spec.enumerate().to(device)
        self.table = BlockTable(
            fg, proposal, instances, BlockTableEnergy(fg, instances.blocks, cards).to(device), device
        )
        ids = torch.cat([self.table.context, instances.blocks.to(device)], -1)
        block_radix = _radix(torch.tensor(cards, dtype=torch.long)).to(device).expand(len(instances), -1)
        radix = torch.cat([self.table.radix, block_radix], -1)
        size = len(cards)
        self.ids = [ids[rows].reshape(-1) for rows in self.rows]
        self.block_ids = [ids[rows][:, -size:].reshape(-1) for rows in self.rows]
        context_radix = [radix[rows][:, :-size].to(torch.float32) for rows in self.rows]  # rows stay below 2^24
        self.context_radix = [r[0] if bool((r == r[:1]).all()) else r for r in context_radix]  # shared: one row
        self.block_radix = block_radix[0].to(torch.float32)
        self.base = [self.table.base[rows] for rows in self.rows]
        self._by_dtype: dict[torch.dtype, tuple[list[Tensor], Tensor, Tensor]] = {}
        self._numpy_by_dtype: dict[
            torch.dtype, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
        ] = {}
        self.padded = [size < width for size in self.sizes]
        # one draw of the swept classes' random numbers per sweep: padded slots read their class's last real slot
        self._positions: dict[tuple[int, int, torch.device], Tensor | None] = {}  # by (first, last, device)
        self.real = (torch.arange(width)[None, :] < torch.tensor(self.sizes)[:, None]).to(device)  # [C, width]
        self.update = compiled(fused_class_update) if compile else fused_class_update
        self.compiled = compile
        # eager updates of CPU states in NumPy (the same decisions): True, False (torch's function) or None (by size)
        self.numpy: bool | None = None
        # on the NumPy path, the compiled loop of :mod:`~neuralblock.kernels.jit` (True where Numba is installed)
        self.jit = NUMBA
        self._jit_layouts: set[tuple] = set()  # argument layouts this sweep has run (the first run compiles)
        self._jit_by_dtype: dict[torch.dtype, tuple[np.ndarray, ...]] = {}
        # the last rows a compiled sweep read, their NumPy views and which were absent (see _jit_rows)
        self._jit_views: tuple[tuple[Tensor | None, ...], tuple[np.ndarray | None, ...], tuple[bool, ...]] | None = None
        self._last_assigned: tuple[_TemperedTables, Tensor, tuple[Tensor, Tensor] | None] | None = None
        self._chain_cache = LastInputs[tuple[Tensor | None, Tensor | None, Tensor | None]]()
        self._whole_rows = LastInputs[_WholeRows]()  # (see _sweep_whole)
        # per range of classes and dtype: their index arrays and real slots (see _sweep_whole)
        self._class_index: dict[tuple[int, int, torch.dtype], tuple[tuple[np.ndarray, ...], int]] = {}
        self.compile_seconds = 0.0
        self.tempered: _TemperedTables | None = None  # rows per temperature of a replica-exchange ladder
        self.tempered_sweeps = 0  # sweeps whose chains read their temperature's rows
        self._split: tuple[int, Tensor] | None = None  # (rows computed, finite part of w) for SoftZeros chains

    def _in_dtype(self, dtype: torch.dtype) -> tuple[list[Tensor], Tensor, Tensor]:
        """Place values and block values in the state's dtype (converted once per dtype)."""
        if dtype not in self._by_dtype:
            self._by_dtype[dtype] = (
                [r.to(dtype) for r in self.context_radix],
                self.block_radix.to(dtype),
                self.values.to(dtype),
            )
        return self._by_dtype[dtype]

    def _numpy_class(
        self, c: int, dtype: torch.dtype
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """NumPy views of class ``c``'s index inputs: ``ids``, place values, block ids and ``base``.

        The arguments of :func:`fused_class_update_numpy` before the proposal rows, made once per dtype.
        """
        if dtype not in self._numpy_by_dtype:
            context_radix, block_radix, _ = self._in_dtype(dtype)
            self._numpy_by_dtype[dtype] = [
                (ids.numpy(), radix.numpy(), block_radix.numpy(), block_ids.numpy(), base.numpy())
                for ids, radix, block_ids, base in zip(self.ids, context_radix, self.block_ids, self.base)
            ]
        return self._numpy_by_dtype[dtype][c]

    def _jit_arrays(self, dtype: torch.dtype) -> tuple[np.ndarray, ...]:
        """The classes' index inputs stacked for :func:`~neuralblock.kernels.jit.block_sweep` (made once per dtype).

        ``ids [C, W (c + b)]``, place values ``[C, W, c]``, the block's place values ``[b]``, block ids
        ``[C, W b]``, ``base [C, W]`` and the classes' sizes ``[C]``.
        """
        if dtype not in self._jit_by_dtype:
            context_radix, block_radix, _ = self._in_dtype(dtype)
            width = len(self.rand_index[0])
            radix = [r.expand(width, -1) if r.dim() == 1 else r for r in context_radix]
            self._jit_by_dtype[dtype] = (
                torch.stack(self.ids).numpy(),
                torch.stack(radix).contiguous().numpy(),
                block_radix.numpy(),
                torch.stack(self.block_ids).numpy(),
                torch.stack(self.base).numpy(),
                np.array(self.sizes, dtype=np.int64),
            )
        return self._jit_by_dtype[dtype]

    def _assigned(self, tempered: _TemperedTables, beta: Tensor) -> tuple[Tensor, Tensor] | None:
        """``tempered.assign(beta)``, remembered for the last ``beta`` (the ladder changes in warmup only)."""
        last = self._last_assigned
        if last is not None and last[0] is tempered and last[1].shape == beta.shape and torch.equal(last[1], beta):
            return last[2]
        found = tempered.assign(beta)
        self._last_assigned = (tempered, beta.clone(), found)
        return found

    def _chain_rows(
        self, beta: Tensor | None, soft: SoftZeros | None, device: torch.device
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Each chain's ``beta`` correction, first tempered row and zeros' log-potential (``None`` where unused).

        Remembered for the last inputs (the same tensors, unchanged: a replica-exchange ladder moves in warmup only).
        """
        inputs = (self.tempered, beta, *(soft or (None, None)))  # (a SoftZeros is made per transition)
        last = self._chain_cache.get(inputs)
        if last is not None:
            return last
        table, tempered, key_offset = self.table, self.tempered, None
        beta_rows = None if beta is None else beta.to(table.cdf.dtype)
        correction = None  # with tables of some temperatures only: 1 + each chain's beta less its table's
        if tempered is not None and beta is not None:
            found = self._assigned(tempered, beta)
            if soft is None and tempered.log_zero is None and found is not None:
                key_offset, table_beta = found
                gap = beta.to(table_beta) - table_beta
                correction = (gap + 1.0).to(table.cdf.dtype) if bool((gap != 0).any()) else None
            elif (
                soft is not None
                and tempered.log_zero is not None
                and torch.equal(tempered.log_zero, soft.log_zero[: len(tempered.log_zero)])  # (a ladder's coldest part)
                and found is not None
                and torch.equal(found[1], beta.to(found[1]))  # (every chain on a table's own temperature)
            ):
                by_entry = soft.entry * tempered.rows  # built for these models: each chain's temperature by its entry
                key_offset = by_entry if torch.equal(found[0], by_entry) else None  # and built for this ladder
        chain_log_zero = None
        if key_offset is not None:  # each chain reads its (or a nearby) temperature's rows
            beta_rows = correction
        elif soft is not None:  # the rows' finite parts, with the beta and zero-count corrections
            if table.slot is not None:
                raise ValueError("soft zeros need a dense proposal table; this one keeps its rows in slots")
            chain_log_zero = soft.log_zero.to(device, table.cdf.dtype)[soft.entry]
        rows = (beta_rows, key_offset, chain_log_zero)
        self._chain_cache.put(inputs, rows)
        return rows

    def _jit_rows(self, rows: tuple[Tensor | None, ...]) -> tuple[tuple[np.ndarray | None, ...], tuple[bool, ...]]:
        """NumPy views of the rows a compiled sweep reads, and which are absent; remembered for the same tensors.

        A view shares its tensor's memory, so it follows in-place changes; new tensors (a refreshed or
        tempered table, new temperatures) are new inputs.
        """
        last = self._jit_views
        if last is not None and len(last[0]) == len(rows) and all(a is b for a, b in zip(last[0], rows)):
            return last[1], last[2]
        views = tuple(_numpy_or_none(t) for t in rows)
        absent = tuple(t is None for t in rows[3:])
        self._jit_views = (rows, views, absent)
        return views, absent

    def _sweep_whole(
        self, state: Tensor, draws: Tensor, log_accept: Tensor, beta: Tensor | None, soft: SoftZeros | None,
        first: int, last: int,
    ) -> tuple[Tensor, Tensor, Tensor, int]:  # fmt: skip
        """Classes ``first..last - 1`` of a prefilled table in one compiled call (see :meth:`sweep`).

        The classes' index arrays are made once per range and dtype, and the rows the chains read once per
        inputs (remembered for the same tensors, unchanged: the rows change with new parameters, the chains'
        temperatures in warmup only), so a call costs the uniforms, one copy of the states and the loop.
        """
        index, slots, (cdf, log_ratio), tail, layout = self.whole_arguments(state.dtype, beta, soft, first, last)
        state = state.clone()  # (updated in place through a NumPy view: the caller's tensor is never written)
        (accepted, nonfinite), seconds = timed_first_call(
            self._jit_layouts, layout, block_sweep,
            state.numpy(), *index, cdf, log_ratio, draws.numpy(), log_accept.numpy(), *tail,
        )  # fmt: skip
        self.compile_seconds += seconds
        return state, torch.from_numpy(accepted), torch.scalar_tensor(nonfinite, dtype=torch.long), len(state) * slots

    def whole_arguments(
        self, dtype: torch.dtype, beta: Tensor | None, soft: SoftZeros | None, first: int, last: int
    ) -> tuple[tuple[np.ndarray, ...], int, tuple[np.ndarray, np.ndarray], tuple[np.ndarray | None, ...], tuple]:
        """What one compiled sweep of classes ``first..last - 1`` of a prefilled table reads (counting a tempered one).

        Returns the classes' index arrays, their real slots, the CDF and ``w`` rows, the values and the chains'
        extras of :func:`~neuralblock.kernels.jit.block_sweep` after the uniforms, and the argument layout; each
        remembered (see :meth:`_sweep_whole`).
        """
        table = self.table
        inputs = (self.tempered, beta, *(soft or (None, None)), table.cdf, table.log_ratio)
        rows = self._whole_rows.get(inputs, (dtype,))
        if rows is None:
            rows = self._rows_call(beta, soft, dtype, table.cdf.device)
            self._whole_rows.put(inputs, rows, (dtype,))
        pair, tail, layout, tempered = rows
        found = self._class_index.get((first, last, dtype))
        if found is None:
            stacked, part = self._jit_arrays(dtype), slice(first, last)
            index = (*(a[part] for a in stacked[:2]), stacked[2], *(a[part] for a in stacked[3:]))
            found = self._class_index[(first, last, dtype)] = (index, sum(self.sizes[first:last]))
        if tempered:
            self.tempered_sweeps += 1
        return found[0], found[1], pair, tail, layout

    def _rows_call(
        self, beta: Tensor | None, soft: SoftZeros | None, dtype: torch.dtype, device: torch.device
    ) -> _WholeRows:
        """The rows a compiled sweep reads (the CDF and ``w``, then the values and the chains' extras of
        :func:`~neuralblock.kernels.jit.block_sweep`), its layout, and whether the chains read their temperatures'
        rows."""
        chain_rows = self._chain_rows(beta, soft, device)
        cdf, log_ratio, extra = self._rows_read(*chain_rows)
        tail = (self._in_dtype(dtype)[2].numpy(), *(_numpy_or_none(t) for t in extra))
        layout = tuple(t is None for t in extra) + (dtype, cdf.dtype, True)
        return (cdf.numpy(), log_ratio.numpy()), tail, layout, chain_rows[1] is not None

    def _rows_read(
        self, beta_rows: Tensor | None, key_offset: Tensor | None, chain_log_zero: Tensor | None
    ) -> tuple[Tensor, Tensor, tuple[Tensor | None, ...]]:
        """The CDF and ``w`` rows the chains read, and the extras of :func:`fused_class_update` after the values.

        With ``key_offset`` each chain reads its temperature's rows; with ``chain_log_zero`` (soft zeros) the rows'
        finite parts with the zero counts; else the table's rows (with the ``beta`` correction where given).
        """
        table = self.table
        cdf, log_ratio, energy, zeros = table.cdf, table.log_ratio, table.energy_rows, None
        if key_offset is not None:
            cdf, log_ratio = self.tempered_rows()
        elif chain_log_zero is not None:
            log_ratio, energy, zeros = self._split_rows(), table.finite_energy, table.zero_count
        extra = (None if beta_rows is None else energy, beta_rows, table.slot, key_offset, zeros, chain_log_zero)
        return cdf, log_ratio, extra

    def _run_jit(self, layout: tuple, *args: np.ndarray | None) -> tuple[np.ndarray, int]:
        """:func:`~neuralblock.kernels.jit.block_sweep`; the first run of an argument layout counts as compile time."""
        out, seconds = timed_first_call(self._jit_layouts, layout, block_sweep, *args)
        self.compile_seconds += seconds
        return out

    def refresh(self, fg: FactorGraph, instances: MotifInstances) -> None:
        """Follow new parameter values: new tables and instance parameters, a recomputed block table."""
        self.table.energy.flat = BlockTableEnergy.flat_tables(fg).to(self.device)
        self.instances = instances
        self.class_instances = [instances.select(rows.cpu()) for rows in self.rows]
        self.table.clear()
        self.tempered = None  # built for the old parameters
        self._split = None

    def temper(self, betas: Tensor, log_zero: Tensor | None = None) -> bool:
        """Propose at each temperature ``1 / betas[r]`` from the proposal raised to ``betas[r]`` (:func:`powered_rows`).

        Chains whose ``beta`` is on the ladder (or, with ``log_zero``, whose :class:`SoftZeros`
        entry names a temperature) then read their temperature's rows (proposal and block
        energies of ``p(x)^beta``: the MH ratio needs no ``beta`` correction); without ``log_zero``, a
        chain between two of ``betas`` reads the hotter one's rows with the correction
        ``(beta - betas[r]) dE`` (:meth:`_TemperedTables.assign`). Only fully tabulated dense tables are
        tempered; otherwise nothing changes and ``False`` is returned.
        """
        if self.table.slot is not None or not self.table.prefilled:
            return False
        self.tempered = powered_rows(self.table, betas, log_zero)
        return True

    def _split_rows(self) -> Tensor:
        """``w`` rows of the finite parts, ``F - log q`` (for :class:`SoftZeros` chains; rebuilt as rows fill)."""
        table = self.table
        if self._split is None or self._split[0] != table.computed:
            self._split = (table.computed, table.finite_energy - _log_steps(table.cdf))
        return self._split[1]

    def tempered_rows(self) -> tuple[Tensor, Tensor]:
        """The stacked CDF and ``w`` rows of the tempered tables (see :meth:`temper`)."""
        if self.tempered is None:
            raise RuntimeError("temper() has not built tempered tables")
        return self.tempered.cdf, self.tempered.log_ratio

    def _rand_positions(self, first: int, last: int, device: torch.device) -> Tensor | None:
        """Where classes ``first..last - 1`` read their uniforms in one draw of theirs (``None``: no class padded)."""
        key = (first, last, device)
        if key not in self._positions:
            width = len(self.rand_index[0])
            found = None
            if any(self.padded[first:last]):
                found = torch.cat([(c - first) * width + self.rand_index[c].cpu() for c in range(first, last)])
                found = found.to(device)
            self._positions[key] = found
        return self._positions[key]

    def uniforms(self, chains: int, first: int, last: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """A sweep's uniforms of classes ``first..last - 1``: the proposals' (rows' dtype), then the tests' (float64).

        Both ``[K, C W]``, drawn from torch's global RNG in this order.
        """
        size = (last - first) * len(self.rand_index[0])
        draws = torch.rand(chains, size, device=device, dtype=self.table.cdf.dtype)
        return draws, torch.rand(chains, size, device=device, dtype=torch.float64)  # (a double-precision test)

    def one_call(self, state: Tensor) -> bool:
        """Whether a sweep of ``state`` runs as one compiled call (:meth:`whole_arguments`): a prefilled table on the
        compiled CPU path."""
        return (
            self.jit
            and NUMBA
            and not self.compiled
            and self.table.prefilled
            and use_numpy(self.numpy, state, JIT_MAX_ENTRIES)
        )

    def sweep(
        self,
        fg: FactorGraph,
        state: Tensor,
        beta: Tensor | None = None,
        soft: SoftZeros | None = None,
        classes: tuple[int, int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Update every class once (or the classes ``first..last - 1`` of ``classes``, in order).

        Args:
            fg: the graph.
            state: ``[K, n]`` states.
            beta: optional ``[K]`` inverse temperatures (targets ``p(x)^beta``).
            soft: optional log-potentials of the zero table entries per chain (:class:`SoftZeros`).
            classes: ``(first, last)``: update only these consecutive classes (e.g. one cover of the
                instances, see :class:`~neuralblock.kernels.neural_block.NeuralBlockKernel`'s ``cover``).

        Returns:
            The states, accepted blocks per chain ``[K]``, the non-finite count and the proposals made.
        """
        chains = state.shape[0]
        table = self.table
        first, last = (0, len(self.sizes)) if classes is None else classes
        if not (isinstance(first, int) and isinstance(last, int) and 0 <= first < last <= len(self.sizes)):
            raise ValueError(f"classes must be a range within 0..{len(self.sizes)}, got {classes!r}")
        count, width = last - first, len(self.rand_index[0])
        limit = JIT_MAX_ENTRIES if self.jit and NUMBA else NUMPY_MAX_ENTRIES
        on_numpy = not self.compiled and use_numpy(self.numpy, state, limit)
        on_jit = on_numpy and self.jit and NUMBA
        draws, accept = self.uniforms(chains, first, last, state.device)
        if on_jit:  # the compiled loop reads them as drawn, [K, C width], and skips padded slots
            log_accept = accept.log_()
        else:
            positions = self._rand_positions(first, last, state.device)
            if positions is not None:
                draws, accept = (u.index_select(1, positions) for u in (draws, accept))
            draws = draws.reshape(chains, count, width).transpose(0, 1).contiguous()  # [C, K, width]
            log_accept = accept.reshape(chains, count, width).log().transpose(0, 1)
        soft = soft if table.has_zeros else None  # the zeros' potentials matter only where there are zeros
        if self.one_call(state):  # prefilled tables never change during a sweep: one compiled call
            return self._sweep_whole(state, draws, log_accept, beta, soft, first, last)
        beta_rows, key_offset, chain_log_zero = self._chain_rows(beta, soft, state.device)
        if key_offset is not None:
            self.tempered_sweeps += 1
        # NumPy: one copy of the states per sweep (a torch clone: the caller's tensor is never written), updated in
        # place class by class through a NumPy view
        if on_numpy:
            state = state.clone()
        work = state.numpy() if on_numpy else None
        context_radix, block_radix, values = self._in_dtype(state.dtype)
        stacked = self._jit_arrays(state.dtype) if on_jit else None
        accepts: list[Tensor] = []
        broken: list[Tensor] = []
        found_np: list[tuple[np.ndarray, int]] = []  # the compiled path's counts: accepted per chain, non-finite
        for c in range(first, last):  # (a table that fills up during this sweep: one compiled call per class)
            if not table.prefilled:
                table.ensure(fg, self.class_instances[c], table.keys(state, self.rows[c]), self.rows[c], state)
            start = time.perf_counter() if self.compiled and self.compile_seconds == 0.0 else None
            # (read after ensure(): a table in slot mode may have grown its tensors)
            cdf, log_ratio, extra = self._rows_read(beta_rows, key_offset, chain_log_zero)
            if stacked is not None:
                part, own = slice(c, c + 1), slice((c - first) * width, (c - first + 1) * width)
                (cdf_np, ratio_np, values_np, *extra_np), absent = self._jit_rows((cdf, log_ratio, values, *extra))
                found = self._run_jit(
                    absent + (state.dtype, cdf.dtype, False),
                    work, *(a[part] for a in stacked[:2]), stacked[2], *(a[part] for a in stacked[3:]),
                    cdf_np, ratio_np, np.ascontiguousarray(draws[:, own].numpy()),
                    np.ascontiguousarray(log_accept[:, own].numpy()), values_np, *extra_np,
                )  # fmt: skip
                found_np.append(found)
                continue
            rows = (cdf, log_ratio, draws[c - first], log_accept[c - first])
            if work is not None:
                ids, radix, place, block_ids, base = self._numpy_class(c, state.dtype)
                cdf_np, ratio_np, draws_np, accept_np = (t.numpy() for t in rows)
                energy_np, beta_np, slot_np, offset_np, zeros_np, log_zero_np = (_numpy_or_none(t) for t in extra)
                acc_np, fin_np = fused_class_update_numpy(
                    work, ids, radix, place, block_ids, base, cdf_np, ratio_np, draws_np, accept_np, values.numpy(),
                    energy_np, beta_np, slot_np, offset_np, zeros_np, log_zero_np,
                )  # fmt: skip
                acc, bad = torch.from_numpy(acc_np), torch.from_numpy(fin_np)
            else:
                state, acc, bad = self.update(
                    state, self.ids[c], context_radix[c], block_radix, self.block_ids[c], self.base[c], *rows,
                    values, *extra,
                )  # fmt: skip
            if start is not None:
                self.compile_seconds = time.perf_counter() - start
            accepts.append(acc)
            broken.append(bad)
        proposed = chains * sum(self.sizes[first:last])
        if len(found_np) == 1:  # (padded slots were skipped)
            return state, torch.from_numpy(found_np[0][0]), torch.tensor(found_np[0][1]), proposed
        if found_np:
            counts = np.sum([f[0] for f in found_np], 0)
            return state, torch.from_numpy(counts), torch.tensor(sum(f[1] for f in found_np)), proposed
        real = self.real[first:last].to(state.device)
        accepted = (torch.stack(accepts, 1) & real).sum((1, 2))  # padded slots repeat a real one: not counted
        nonfinite = (~torch.stack(broken, 1) & real).sum()
        return state, accepted, nonfinite, proposed
