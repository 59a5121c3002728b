"""Chromatic, vectorized single-site Gibbs for discrete variables.

Example:
    >>> import torch, pyro
    >>> from pyro.infer import MCMC
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph()
    >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
    >>> _ = fg.add_table_factor([a, b], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    >>> mcmc = MCMC(GibbsKernel(fg), num_samples=20, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["x"].shape
    torch.Size([20, 2])
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from neuralblock._memo import LastInputs
from neuralblock.graph import BlockScaffold, FactorGraph, TableGroup
from neuralblock.kernels.base import GraphKernel, discrete_latent_variables, warn_frozen
from neuralblock.kernels.functional import gibbs_sample, use_numpy
from neuralblock.kernels.jit import (
    JIT_MAX_ENTRIES,
    NUMBA,
    GibbsClassArgs,
    gibbs_class_args,
    gibbs_class_prepared,
    timed_first_call,
)
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second

_VALUE_LOOP = 16
"""Classes of at most this many values gather each value's table entries apart (else all at once)."""

NUMPY_MAX_ENTRIES = 1024
"""Largest state ``[K, n]`` (``K * n`` entries) whose sweeps take the NumPy update by default.

Measured per transition against the torch function on the UAI 10x10 and 20x20 Ising grids: 1.3-1.6x faster at
``K = 1`` and ``K = 8``; even at 1,600-12,800 entries (1.15x on a 10x10 grid at ``K = 32``, 0.96-0.99x beyond);
0.91-0.93x inside replica exchange, whose swaps then run slower (see :func:`~neuralblock.kernels.functional.use_numpy`),
so :class:`~neuralblock.kernels.ReplicaExchange` keeps its replicas' Gibbs sweeps in torch."""

__all__ = [
    "GibbsKernel",
    "GibbsPlan",
    "SoftZeros",
    "compiled",
    "flat_tables",
    "gibbs_class_update",
    "gibbs_class_update_numpy",
    "pad_by_owner",
    "resolve_compile",
]


def flat_tables(fg: FactorGraph) -> Tensor:
    """All table factors' log-tables in one flat tensor, then one zero entry (padding reads it)."""
    dtype = torch.get_default_dtype()
    tables = cast(list[TableGroup], fg.groups)  # callers pass graphs whose groups are all table factors
    return torch.cat([g._flat.reshape(-1).to(dtype) for g in tables] + [torch.zeros(1, dtype=dtype)])


def pad_by_owner(owner: Tensor, count: int, parts: Sequence[Tensor], fills: Sequence[int]) -> list[Tensor]:
    """Lay rows out per owner: each ``part [m, ...]`` becomes ``[count, depth, ...]`` padded with its fill.

    ``owner [m]`` names the owner (a variable or a block) of each row; ``depth`` is the most rows
    any owner has, so one gather reads every owner's rows.

    Example:
        >>> pad_by_owner(torch.tensor([1, 0, 1]), 2, [torch.tensor([5, 6, 7])], [0])[0].tolist()
        [[6, 0], [5, 7]]
    """
    order = torch.argsort(owner, stable=True)
    owner = owner[order]
    counts = torch.bincount(owner, minlength=count)
    depth = max(int(counts.max()) if count and len(owner) else 1, 1)
    slot = torch.arange(len(owner)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    out = []
    for part, fill in zip(parts, fills):
        full = torch.full((count, depth) + tuple(part.shape[1:]), fill, dtype=part.dtype)
        full[owner, slot] = part[order]
        out.append(full)
    return out


class _FusedTables:
    """The conditionals of one colour class read straight from table factors, for all chains at once.

    Every (variable, scaffold factor) pair is one entry of a factor-major ``[d, V]`` layout (``d``
    the most factors any variable of the class touches; missing pairs point at a zero entry).
    For states ``[K, n]`` the factor tables, concatenated into one flat tensor, are sliced along
    each variable's axis at the current values of the factor's other variables: one gather of
    the state (the other variables only), one gather per value, a sum over ``d``. No candidate
    states are materialized and no Python loop runs over variables or groups.
    """

    _compiled = False
    """Whether the compiled class update has run on this class's shapes (its first call compiles)."""

    def __init__(self, fg: FactorGraph, vars_: Tensor, scaffold: BlockScaffold, kmax: int, offsets: list[int]) -> None:
        num_vars = len(vars_)
        # (segment, scopes, other strides, var stride, table base)
        pairs: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = []
        arity = max([g.scopes.shape[1] for g in fg.groups if g.num_factors] + [1])
        tables = cast(list[TableGroup], fg.groups)  # built by GibbsPlan only when every group is a TableGroup
        for group, rows, segment, first in zip(tables, scaffold.group_index, scaffold.group_segment, offsets):
            if rows.numel() == 0:
                continue
            scopes = group.scopes[rows]  # [m, a]
            is_var = scopes == vars_[segment][:, None]
            strides = group._strides.expand_as(scopes) * ~is_var
            var_stride = (group._strides.expand_as(scopes) * is_var).sum(-1)
            pad = arity - scopes.shape[1]
            pairs.append(
                (
                    segment,
                    torch.nn.functional.pad(scopes, (0, pad)),
                    torch.nn.functional.pad(strides, (0, pad)),
                    var_stride,
                    first + rows * group._size,
                )
            )
        if not pairs:  # no variable of the class touches a factor: one padding pair each (a flat conditional)
            empty = torch.zeros(0, dtype=torch.long)
            pairs.append((empty, empty.reshape(0, arity), empty.reshape(0, arity), empty, empty))
        segment, scopes, strides, var_stride, base = (torch.cat([p[i] for p in pairs]) for i in range(5))
        card = fg.cardinalities[vars_]
        values = torch.minimum(torch.arange(kmax), (card - 1)[:, None])  # [V, kmax]
        index = base[:, None] + values[segment] * var_stride[:, None]  # [m, kmax]
        zero = offsets[-1]  # index of the zero entry at the end of the flat tables
        # keep only the other variables of each scope (the variable's own axis is in ``index``): a pairwise
        # factor reads one state entry, not two
        others = strides != 0
        order = torch.argsort((~others).to(torch.int8), dim=-1, stable=True)
        width = int(others.sum(-1).max()) if len(others) else 0
        scopes, strides = scopes.gather(-1, order)[:, :width], strides.gather(-1, order)[:, :width]
        scopes, strides, index = pad_by_owner(segment, num_vars, [scopes, strides, index], [0, 0, zero])
        # factor-major layout [d, V, ...]: the sum over a variable's factors adds d contiguous slices
        self.scopes, self.strides, self.index = (x.transpose(0, 1).contiguous() for x in (scopes, strides, index))
        invalid = torch.arange(kmax) >= card[:, None]
        self.mask = torch.zeros(num_vars, kmax).masked_fill(invalid, -math.inf) if invalid.any() else None

    def to(self, device: torch.device) -> _FusedTables:
        """Move the index tensors to ``device``.

        Strides become floats when every offset they make is exact in float32 (below 2^24): the
        state is gathered and weighted without an integer copy of the gathered values.
        """
        if self.strides.numel() == 0 or int(self.strides.sum(-1).max()) * int(self.index.shape[-1]) < 1 << 24:
            self.strides = self.strides.to(torch.float32)
        for name in ("scopes", "strides", "index", "mask"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self


class SoftZeros(NamedTuple):
    """Finite log-potentials for the zero table entries (log ``-inf``) of each chain's model.

    Chain ``k`` targets ``p_k(x) = exp(beta_k (F(x) + log_zero[entry[k]] Z(x)))``, where ``F`` sums
    the finite log table entries and ``Z`` counts the zero ones: every zero entry gets the
    log-potential ``log_zero``, and ``log_zero = -inf`` is the model itself. Replica exchange
    gives its hot replicas such models (tempering alone keeps every zero).

    Attributes:
        entry: ``[K]`` each chain's entry of ``log_zero`` (long).
        log_zero: ``[L]`` the log-potentials (``-inf`` allowed).
    """

    entry: Tensor
    log_zero: Tensor


def gibbs_class_update(
    state: Tensor,
    vars_: Tensor,
    scopes: Tensor,
    strides: Tensor,
    index: Tensor,
    mask: Tensor | None,
    flat: Tensor,
    noise: Tensor,
    beta: Tensor | None = None,
    table_offset: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One colour class of Gibbs on table factors, for states ``[K, n]``: the new state and the stuck count.

    The fused update (gather, slice the tables, sample, scatter) that :class:`GibbsPlan`
    runs eagerly or under ``torch.compile``. ``scopes``, ``strides``, ``index`` and ``mask``
    are the class's :class:`_FusedTables` layout (``scopes``/``strides`` ``[d, V, a]`` over the
    other variables of each factor, ``index [d, V, k_max]``); ``noise [K, V, k_max]`` are standard
    exponential draws, or for binary variables ``noise [K, V]`` are logits of uniforms (made
    outside, so both paths give the same chain for the same seed);
    ``beta [K]`` optionally tempers each chain's target to ``p(x)^beta``;
    ``table_offset [K]`` optionally shifts each chain's table reads (chains on their own copy of the tables
    in ``flat``: the softened models of replica exchange, see :class:`SoftZeros`).
    """
    chains = state.shape[0]
    depth, count, width = scopes.shape  # [d, V, a]: each variable's factors, the other variables of each
    shift: Tensor | int = 0
    if width:
        read = state.index_select(1, scopes.reshape(-1)).reshape(chains, depth, count, width)
        if not strides.is_floating_point():
            read = read.long()
        total = read[..., 0] * strides[..., 0]
        for j in range(1, width):
            total = total + read[..., j] * strides[..., j]
        shift = total.long() if strides.is_floating_point() else total  # exact below 2^24 (see _FusedTables.to)
    if table_offset is not None:
        shift = shift + table_offset[:, None, None]
    kmax = index.shape[-1]
    current = state[:, vars_]
    if noise.dim() == 2 and mask is None:  # binary variables: value 1 iff logit(u) < l_1 - l_0 (one uniform each)
        diff = flat.take(index[..., 1] + shift).sum(-2) - flat.take(index[..., 0] + shift).sum(-2)  # [K, V] or [V]
        if beta is not None:
            diff = diff * beta[:, None].to(diff.dtype)
        diff = diff.to(state.dtype)
        stuck = torch.isnan(diff)  # both values impossible: keep the current one (counted)
        values = torch.where(stuck, current, (noise < diff).to(state.dtype))
        num_stuck = stuck.sum() * (chains if stuck.dim() == 1 else 1)
    else:
        if kmax <= _VALUE_LOOP:  # one gather per value, summed over the factors (the outer dim): fastest on CPU
            columns = [flat.take(index[..., j] + shift).sum(-2) for j in range(kmax)]  # [K, V] ([V] if no shift)
            logits = torch.stack([c.expand(chains, count) for c in columns], -1)  # [K, V, kmax]
        else:
            logits = flat.take(index + (shift.unsqueeze(-1) if isinstance(shift, Tensor) else shift)).sum(-3)
            logits = logits.expand(chains, count, kmax)
        if beta is not None:
            logits = logits * beta[:, None, None].to(logits.dtype)
        if mask is not None:
            logits = logits + mask
        if noise.dim() == 2:  # binary with a masked value (a variable of cardinality 1 in the class)
            diff = (logits[..., 1] - logits[..., 0]).to(state.dtype)
            stuck = torch.isnan(diff)
            values = torch.where(stuck, current, (noise < diff).to(state.dtype))
            num_stuck = stuck.sum()
        else:
            info = gibbs_sample(logits.to(state.dtype), current, noise)
            values, num_stuck = info.values, info.num_stuck
    state = state.clone()
    state[:, vars_] = values
    return state, num_stuck


def gibbs_class_update_numpy(
    state: np.ndarray,
    vars_: np.ndarray,
    scopes: np.ndarray,
    strides: np.ndarray,
    index: np.ndarray,
    mask: np.ndarray | None,
    flat: np.ndarray,
    noise: np.ndarray,
    beta: np.ndarray | None = None,
    table_offset: np.ndarray | None = None,
) -> int:
    """:func:`gibbs_class_update` on NumPy arrays (CPU states), writing the class's new values into ``state`` in place.

    The same arithmetic in the same dtypes, so it samples the same conditionals; NumPy's calls
    cost a fraction of torch's dispatch on these small arrays. The two libraries may add a
    variable's factor terms in different orders (seen from 5 factors per variable), so the
    log-odds can differ in their last bits and, very rarely, a draw with them: the chains are
    the same in distribution, and draw for draw where the sums agree. One difference in the
    inputs: for classes of more than two values (or masked ones), ``noise`` holds standard
    *Gumbel* draws (``-log E`` of the torch function's exponential draws ``E``, taken by the
    caller in torch, so both paths round alike). Returns the stuck count.

    Example:
        >>> state = np.zeros((1, 2), dtype=np.float32)  # x0 alone in its class; one factor [x0, x1], x1 = 0
        >>> flat = np.append(np.log(np.array([0.25, 0.25, 0.75, 0.25], dtype=np.float32)), np.float32(0.0))  # + pad
        >>> args = (np.array([0]), np.array([[[1]]]), np.array([[[1.0]]], np.float32), np.array([[[0, 2]]]), None, flat)
        >>> gibbs_class_update_numpy(state, *args, np.array([[0.5]], np.float32)), state.tolist()  # 0.5 < log 3
        (0, [[1.0, 0.0]])
    """
    chains = state.shape[0]
    depth, count, width = scopes.shape  # [d, V, a]
    shift: np.ndarray | int = 0
    if width:
        read = state[:, scopes.reshape(-1)].reshape(chains, depth, count, width)
        if not np.issubdtype(strides.dtype, np.floating):
            read = read.astype(np.int64)
        total = read[..., 0] * strides[..., 0]
        for j in range(1, width):
            total = total + read[..., j] * strides[..., j]
        shift = total.astype(np.int64) if np.issubdtype(strides.dtype, np.floating) else total
    if table_offset is not None:
        shift = shift + table_offset[:, None, None]
    current = state[:, vars_]
    with np.errstate(invalid="ignore"):  # -inf - -inf: both values impossible, a stuck variable (counted)
        if noise.ndim == 2 and mask is None:  # binary: value 1 iff logit(u) < l_1 - l_0
            diff = flat[index[..., 1] + shift].sum(-2) - flat[index[..., 0] + shift].sum(-2)
            if beta is not None:
                diff = diff * beta[:, None].astype(diff.dtype)
            diff = diff.astype(state.dtype)
            stuck = np.isnan(diff)
            values = np.where(stuck, current, (noise < diff).astype(state.dtype))
            num_stuck = int(stuck.sum()) * (chains if stuck.ndim == 1 else 1)
        else:
            kmax = index.shape[-1]
            shifted = shift[..., None] if isinstance(shift, np.ndarray) else shift
            logits = flat[index + shifted].sum(-3)  # [K, V, kmax] or [V, kmax]
            logits = np.broadcast_to(logits, (chains, count, kmax))
            if beta is not None:
                logits = logits * beta[:, None, None].astype(logits.dtype)
            if mask is not None:
                logits = logits + mask
            if noise.ndim == 2:  # binary with a masked value
                diff = (logits[..., 1] - logits[..., 0]).astype(state.dtype)
                stuck = np.isnan(diff)
                values = np.where(stuck, current, (noise < diff).astype(state.dtype))
            else:  # Gumbel-max over the values (rows without a finite logit keep theirs)
                scores = np.nan_to_num(logits.astype(state.dtype), nan=-np.inf, posinf=np.inf, neginf=-np.inf)
                noisy = scores + noise
                draw = noisy.argmax(-1)
                stuck = ~np.isfinite(np.take_along_axis(noisy, draw[..., None], -1)[..., 0])
                values = np.where(stuck, current, draw.astype(state.dtype))
            num_stuck = int(stuck.sum())
    state[:, vars_] = values
    return num_stuck


class GibbsPlan:
    """Precomputed colour classes of single-variable blocks with their scaffolds.

    Variables of one class share no factor, so their full conditionals are computed
    together. On graphs of table factors they are read from the tables (:class:`_FusedTables`,
    one fused function per class, optionally compiled); otherwise, for each candidate value
    ``j`` the whole class is set to ``j`` and one scaffold evaluation gives every variable's
    conditional log-density at ``j``. States are ``[n]`` or batches of chains ``[..., n]``.

    Args:
        fg: the graph.
        variables: the discrete latent variables to update.
        device: where the plan's index tensors live (the states' device).
        compile: run the fused class update under ``torch.compile``; eager sweeps of small CPU states run
            :func:`gibbs_class_update_numpy` (attribute ``numpy``: ``None`` by size, see :data:`NUMPY_MAX_ENTRIES`;
            ``True`` or ``False`` to choose). Where Numba is installed (attribute ``jit``, default ``True``),
            that path runs the compiled loop of :mod:`~neuralblock.kernels.jit` (one call per class; the same draws) for
            states of up to :data:`~neuralblock.kernels.jit.JIT_MAX_ENTRIES` entries.
    """

    def __init__(
        self, fg: FactorGraph, variables: list[int], device: torch.device | str = "cpu", compile: bool = False
    ) -> None:
        cards = fg.cardinalities
        self.device = torch.device(device)
        self.classes: list[Tensor] = []
        self.scaffolds: list[BlockScaffold] = []
        self.values: list[Tensor] = []
        self.fused: list[_FusedTables] = []
        self.tables_only = all(isinstance(g, TableGroup) for g in fg.groups)
        sizes = [g._flat.numel() if isinstance(g, TableGroup) else 0 for g in fg.groups]
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + size)
        blocks = [[v] for v in variables]
        for members in fg.color_blocks(blocks):
            vars_ = torch.tensor([variables[int(i)] for i in members], dtype=torch.long)
            card = cards[vars_]
            kmax = int(card.max())
            grid = torch.arange(kmax)[:, None].expand(kmax, len(vars_))
            scaffold = fg.scaffold(vars_[:, None])
            self.classes.append(vars_.to(self.device))
            self.scaffolds.append(scaffold)
            if self.tables_only:
                self.fused.append(_FusedTables(fg, vars_, scaffold, kmax, offsets).to(self.device))
            values = torch.minimum(grid, card - 1).to(torch.get_default_dtype())
            self.values.append(torch.where(grid < card, values, torch.full_like(values, -1.0)))
        self.flat = flat_tables(fg).to(self.device) if self.tables_only else None
        self.update = gibbs_class_update
        # eager sweeps of CPU states in NumPy (the same conditionals): True, False (torch's function) or None (by size)
        self.numpy: bool | None = None
        self._numpy: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] | None = (
            None  # NumPy views of the classes' index tensors
        )
        # on the NumPy path, the compiled loop of :mod:`~neuralblock.kernels.jit` (True where Numba is installed)
        self.jit = NUMBA
        self._jit_layouts: set[tuple] = set()  # argument layouts run so far (the first run of one compiles)
        self._jit_args: dict[np.dtype, list[GibbsClassArgs]] = {}  # the classes' arrays for the compiled loop
        self.compile_seconds = 0.0
        self.zeros: Tensor | None = None  # where the flat tables hold a zero (log -inf), if anywhere
        self._soft: tuple[Tensor, Tensor] | None = None  # (log_zero, one copy of the tables per entry)
        self._soft_last = LastInputs[tuple[Tensor, Tensor]]()  # the last _soft_inputs
        self._find_zeros()
        if compile and self.tables_only:
            self.update = compiled(gibbs_class_update)

    def refresh(self, fg: FactorGraph) -> None:
        """Re-read the table values after the graph's parameters changed (same structure)."""
        if self.tables_only:
            self.flat = flat_tables(fg).to(self.device)
            self._find_zeros()

    def _find_zeros(self) -> None:
        zeros = None if self.flat is None else self.flat == -math.inf
        self.zeros = zeros if zeros is not None and bool(zeros.any()) else None
        self._soft = None
        self._soft_last.clear()

    def _soft_tables(self, flat: Tensor, zeros: Tensor, log_zero: Tensor) -> Tensor:
        """One copy of ``flat`` per value of ``log_zero``, each entry where ``zeros`` at that log-potential (cached)."""
        if self._soft is None or not torch.equal(self._soft[0], log_zero):
            copies = [flat.masked_fill(zeros, value) for value in log_zero.tolist()]
            self._soft = (log_zero.clone(), torch.cat(copies))
        return self._soft[1]

    def _soft_inputs(self, flat: Tensor, zeros: Tensor, soft: SoftZeros, device: torch.device) -> tuple[Tensor, Tensor]:
        """The tables with one copy per log-potential of ``soft``, and each state's offset into them.

        Remembered for the same inputs (the same tensors, unchanged): a replica-exchange ladder moves in warmup only.
        """
        inputs = (flat, zeros, soft.entry, soft.log_zero)
        last = self._soft_last.get(inputs, (device,))
        if last is not None:
            return last
        values, copy = torch.unique(soft.log_zero.to(flat.dtype), return_inverse=True)
        offset = copy.to(device)[soft.entry] * flat.numel()
        found = (self._soft_tables(flat, zeros, values), offset)
        self._soft_last.put(inputs, found, (device,))
        return found

    @staticmethod
    def _noise(state: Tensor, vars_: Tensor, tables: _FusedTables) -> Tensor:
        """A class's noise: logits of uniforms for binary variables, else standard exponentials (Gumbel-max)."""
        kmax = tables.index.shape[-1]
        if kmax == 2:
            return torch.rand(state.shape[0], len(vars_), dtype=state.dtype, device=state.device).logit_()
        noise = torch.empty(state.shape[0], len(vars_), kmax, dtype=state.dtype, device=state.device)
        return noise.exponential_()

    def _sweep_numpy(
        self, state: Tensor, flat: Tensor, beta: Tensor | None, offset: Tensor | None
    ) -> tuple[Tensor, int]:
        """The fused classes in turn through :func:`gibbs_class_update_numpy` (CPU states ``[K, n]``): states, stuck."""
        if self._numpy is None:
            self._numpy = [
                (
                    v.numpy(),
                    f.scopes.numpy(),
                    f.strides.numpy(),
                    f.index.numpy(),
                    None if f.mask is None else f.mask.numpy(),
                )
                for v, f in zip(self.classes, self.fused)
            ]
        state = state.clone()  # updated in place through a NumPy view; the caller's tensor is never written
        work = state.numpy()
        flat_np = flat.numpy()
        beta_np = None if beta is None else beta.numpy()
        offset_np = None if offset is None else offset.numpy()
        stuck = 0
        jit = self.jit and NUMBA
        prepared: list[GibbsClassArgs] = []
        if jit:  # the classes' arrays as the compiled loop reads them, made once per tables' dtype
            if flat_np.dtype not in self._jit_args:
                self._jit_args[flat_np.dtype] = [gibbs_class_args(*arrays, flat_np.dtype) for arrays in self._numpy]
            prepared = self._jit_args[flat_np.dtype]
            beta_cast = None if beta_np is None else beta_np.astype(flat_np.dtype)  # as the NumPy function
            cast = np.empty(1, dtype=work.dtype)
            shared = (work.dtype, flat_np.dtype, beta_np is None, offset_np is None)  # (beta, offset: 1-D or None)
        for c, (vars_, tables, arrays) in enumerate(zip(self.classes, self.fused, self._numpy)):
            noise = self._noise(state, vars_, tables)
            if noise.dim() == 3:  # the torch function's Gumbel draws -log E, taken in torch: both paths round alike
                noise = noise.log_().neg_()
            noise_np = noise.numpy()
            if not jit:
                stuck += gibbs_class_update_numpy(work, *arrays, flat_np, noise_np, beta_np, offset_np)
                continue
            args = prepared[c]
            layout = args.layout + shared + ((noise_np.dtype, noise_np.ndim),)
            count, seconds = timed_first_call(
                self._jit_layouts, layout, gibbs_class_prepared, work, args, flat_np, noise_np, beta_cast, offset_np,
                cast,
            )  # (the first run of a layout compiles)  # fmt: skip
            stuck += count
            self.compile_seconds += seconds
        return state, stuck

    def sweep(
        self, fg: FactorGraph, state: Tensor, beta: Tensor | None = None, soft: SoftZeros | None = None
    ) -> tuple[Tensor, Tensor | int]:
        """One chromatic sweep of states ``[..., n]``; returns the new states and the number of stuck conditionals
        (an int where the classes ran in NumPy or compiled, else a tensor on the states' device).

        ``beta`` (one inverse temperature per state) tempers each state's target to ``p(x)^beta``;
        ``soft`` gives each state's zero table entries a finite log-potential (:class:`SoftZeros`;
        graphs of table factors).
        """
        shape = state.shape
        state = state.reshape(-1, shape[-1])
        if soft is not None and not self.tables_only:
            raise ValueError("soft zeros apply to graphs of table factors only")
        if self.tables_only:
            flat = self.flat
            if flat is None:
                raise RuntimeError("GibbsPlan of table factors without its flat tables")
            offset = None
            if soft is not None and self.zeros is not None:  # each state reads the copy of its log-potential
                flat, offset = self._soft_inputs(flat, self.zeros, soft, state.device)
            limit = JIT_MAX_ENTRIES if self.jit and NUMBA else NUMPY_MAX_ENTRIES
            if self.update is gibbs_class_update and use_numpy(self.numpy, state, limit):
                state, stuck_count = self._sweep_numpy(state, flat, beta, offset)
                return state.reshape(shape), stuck_count
            stuck = torch.zeros((), dtype=torch.long, device=state.device)
            for vars_, tables in zip(self.classes, self.fused):
                start = time.perf_counter()
                noise = self._noise(state, vars_, tables)
                state, count = self.update(
                    state, vars_, tables.scopes, tables.strides, tables.index, tables.mask, flat, noise, beta, offset
                )
                if self.update is not gibbs_class_update and not getattr(tables, "_compiled", False):
                    tables._compiled = True  # the first call of a shape compiles it
                    self.compile_seconds += time.perf_counter() - start
                stuck = stuck + count
            return state.reshape(shape), stuck
        stuck = torch.zeros((), dtype=torch.long, device=state.device)
        state = state.clone()
        for vars_, scaffold, values in zip(self.classes, self.scaffolds, self.values):
            kmax = values.shape[0]
            candidates = state.expand(kmax, -1, -1).clone()  # [kmax, K, n]
            candidates[..., vars_] = values.clamp(min=0).to(state)[:, None, :]
            logits = scaffold.local_log_density(fg, candidates).permute(1, 2, 0)  # [K, m, kmax]
            if beta is not None:
                logits = logits * beta.reshape(-1)[:, None, None].to(logits.dtype)
            logits = logits.masked_fill(values.T < 0, -math.inf)
            info = gibbs_sample(logits, state[:, vars_])
            state[:, vars_] = info.values
            stuck = stuck + info.num_stuck
        return state.reshape(shape), stuck


class CompiledFunction:
    """``torch.compile(fn)`` (fixed shapes), made at the first call; pickles as ``fn`` (e.g. for worker processes).

    A compiled function itself cannot be pickled, so a kernel holding one could not run in
    ``pyro.infer.MCMC(num_chains > 1)``; this wrapper pickles the plain function and compiles it
    again in the process that calls it.

    Example:
        >>> import pickle
        >>> copy = pickle.loads(pickle.dumps(CompiledFunction(torch.neg)))  # compiles at its first call
        >>> copy.fn is torch.neg
        True
    """

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self._compiled: Callable | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            try:
                self._compiled = torch.compile(self.fn, dynamic=False)
            except Exception:  # noqa: BLE001 - no compiler on this platform: the eager function is the same update
                self._compiled = self.fn
        return self._compiled(*args, **kwargs)

    def __getstate__(self) -> dict:
        return {"fn": self.fn, "_compiled": None}


def compiled(fn: Callable) -> Callable:
    """``fn`` under ``torch.compile`` (fixed shapes, compiled at its first call; see :class:`CompiledFunction`)."""
    return CompiledFunction(fn)


class GibbsKernel(GraphKernel):
    """Single-site Gibbs over the discrete latent variables, chromatic and vectorized.

    Variables are coloured so that no two variables of a colour share a factor; a
    sweep visits the colours in turn and redraws a whole colour from its exact full
    conditionals, in all chains at once. On table factors each colour is one fused
    function (gather, slice the tables, sample, scatter; see :class:`GibbsPlan`). This is
    an exact (target-invariant) kernel.

    Args:
        model: a :class:`FactorGraph` or a Pyro model with discrete sites.
        variables: the variables (ids or names) to update; default all discrete latent ones.
        chains: independent chains run together in one ``[chains, n]`` state (samples gain a
            chain dimension when ``chains > 1``).
        device: where the state and the plan live (e.g. ``"cuda"``).
        compile: run the fused class updates under ``torch.compile`` (``"auto"``: only on a GPU,
            where it pays; on small CPU problems the eager path is as fast after the compile time).

    Samples: see :mod:`neuralblock.kernels.base` for the site layout.

    Example:
        >>> from neuralblock.io import read_uai, uai_grid
        >>> kernel = GibbsKernel(read_uai(uai_grid("Grids_11")), chains=4)
        >>> kernel.setup(0)
        >>> kernel.sample(kernel.initial_params)["x"].shape
        torch.Size([4, 100])
    """

    batched_state = True

    def __init__(
        self,
        model: FactorGraph | Callable,
        variables: list[int | str] | None = None,
        chains: int = 1,
        device: str | torch.device | None = None,
        compile: bool | str = "auto",
    ) -> None:
        super().__init__(model, chains=chains, device=device)
        self._variables_arg = variables
        self.compile = resolve_compile(compile, self.device)
        self.beta: Tensor | None = None  # per-chain inverse temperatures (set by ReplicaExchange)
        self.soft_zeros: SoftZeros | None = None  # per-chain log-potentials of zero entries (ReplicaExchange)
        self.plan: GibbsPlan | None = None
        self._reset_stats()  # diagnostics() answer before setup (e.g. in the parent of worker chains)

    def _prepare(self, fg: FactorGraph) -> None:
        variables = discrete_latent_variables(fg, self._variables_arg, "GibbsKernel")
        if not variables:
            raise ValueError("GibbsKernel found no discrete latent variable to update")
        standalone = self._variables_arg is None and self._conditioned is None and type(self) is GibbsKernel
        warn_frozen(fg, variables, "GibbsKernel", standalone, "RandomWalkMH or NUTS(ConditionedModel(model))")
        self.variables = variables
        self.plan = GibbsPlan(fg, variables, self.device, compile=self.compile)

    def _refresh(self, fg: FactorGraph) -> None:
        """Re-read the tables' values (the plan's structure is kept)."""
        if self.plan is not None:
            self.plan.refresh(fg)

    def supports_soft_zeros(self) -> bool:
        """Whether :attr:`soft_zeros` can be set (graphs of table factors)."""
        if self.plan is None:
            raise RuntimeError("call setup() first")
        return self.plan.tables_only

    def _reset_stats(self) -> None:
        self._sweeps = 0
        self._stuck: int | Tensor = 0  # (a tensor once a sweep ran in torch)

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        if self.plan is None:
            raise RuntimeError("call setup() before sampling")
        state, stuck = self.plan.sweep(self._graph(), state, self.beta, self.soft_zeros)
        if not warmup:
            self._sweeps += 1
            self._stuck = self._stuck + (stuck if isinstance(stuck, int) else stuck.cpu())
        return state

    def logging(self) -> dict[str, float]:
        """Cheap progress-bar fields."""
        return {"colors": float(len(self.plan.classes)) if self.plan else 0.0}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup sweeps, transitions and single-site updates (all chains) per second, stuck conditionals."""
        updates = self._sweeps * len(getattr(self, "variables", [])) * self.chains
        return {
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: Gibbs has no trajectories)
            "sweeps": float(self._sweeps),
            "chains": float(self.chains),
            "transitions_per_second": self._transitions_per_second(),
            "updates_per_second": per_second(updates, self._elapsed),
            "stuck_conditionals": float(self._stuck),
            "compile_seconds": self.plan.compile_seconds if self.plan is not None else 0.0,
        }


def resolve_compile(option: bool | str, device: torch.device) -> bool:
    """Whether to compile the fused updates: ``True``/``False``, or ``"auto"`` (on GPUs only)."""
    if option == "auto":
        return device.type == "cuda"
    if not isinstance(option, bool):
        raise ValueError(f"compile must be True, False or 'auto', got {option!r}")
    return option
