"""Compiled CPU loops (Numba) for the fused sweeps: a neural block sweep and a Gibbs colour class in one call each.

The NumPy functions (:func:`~neuralblock.kernels.fused_blocks.fused_class_update_numpy`,
:func:`~neuralblock.kernels.gibbs.gibbs_class_update_numpy`) cost 15-20 array calls per colour
class, a few microseconds each, while a class of a 10x10 grid at 32 chains does about 20k
arithmetic operations: the calls, not the arithmetic, are the time. Here the same arithmetic
runs as one compiled loop over chains and instances (for neural blocks, over the whole sweep of
classes), in the same dtypes and the same order of operations, so from the same random numbers
it makes the same decisions (tests: ``tests/test_fused_jit.py``).

Instances of one class touch disjoint variables (their blocks do not read each other's), so
updating them one after another is the same as updating them together; a padded slot repeats
its class's last real instance with the same random numbers, and, run after it, proposes the
value that instance left, which it accepts (the log ratio is 0 and ``log u < 0``): the same state.

The neural block loop takes a class slot by slot, every chain at each slot: first every chain's table
row, then the draws and tests, with the inverse-CDF search counted rather than branched. Each chain
still takes its slots in order and chains never interact, so the states are the chain-by-chain
loop's; but the chains' row loads now overlap, which halves the sweep where the rows outgrow the
caches (replica exchange's tempered rows: 160 MB on a 20x20 torus at 16 temperatures;
``benchmarks/replica_cost.py``).

Numba is a dependency; where it cannot be imported (``NUMBA`` is ``False``) the kernels keep
their NumPy functions. Compiled code is cached on disk (``cache=True``); a kernel's first sweep
of a new argument layout compiles it (about a second, counted in the kernel's
``compile_seconds``).

Example:
    >>> import numpy as np
    >>> state = np.zeros((1, 2), dtype=np.float32)
    >>> cdf = np.array([[0.25, 0.5, 0.75, 1.0]], dtype=np.float32)  # one class of one instance, no context, one row
    >>> out = block_sweep(state, np.array([[0, 1]]), np.zeros((1, 1, 0), np.float32), np.array([2.0, 1.0], np.float32),
    ...                   np.array([[0, 1]]), np.zeros((1, 1), np.int64), np.array([1]), cdf,
    ...                   np.zeros((1, 4), np.float32), np.array([[0.6]], np.float32), np.array([[-1.0]]),
    ...                   np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32))
    >>> state.tolist(), out[0].tolist()  # u = 0.6 draws joint value 2, accepted (equal weights)
    ([[1.0, 0.0]], [1])
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "JIT_MAX_ENTRIES",
    "NUMBA",
    "SUMMED_DIRECTLY",
    "TableLogJoint",
    "GibbsClassArgs",
    "block_sweep",
    "gibbs_class",
    "gibbs_class_args",
    "gibbs_class_prepared",
    "replica_block_transition",
    "swap_replicas",
    "timed_first_call",
]

JIT_MAX_ENTRIES = 131072
"""Largest CPU state ``[K, n]`` whose sweeps take the compiled loops by default (where Numba is installed).

Measured per chain-sweep against the torch functions (``benchmarks/fused_blocks.py``, one thread, UAI 10x10 and
20x20 Ising grids): neural blocks 0.19-0.24x at ``K = 1`` and 0.56-0.58x at 25,600-102,400 entries, Gibbs
0.38-0.39x and 0.48-0.52x; faster than the NumPy functions everywhere (0.34-0.60x). No break-even was reached up
to 102,400 entries; beyond this limit torch's threads may pay.
"""

try:  # pragma: no branch
    import numba

    NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency; a platform without its wheels keeps NumPy
    numba = None  # type: ignore[assignment]
    NUMBA = False


def timed_first_call(layouts: set[tuple], layout: tuple, function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``function(*args)`` and the seconds it took if ``layout`` is new to ``layouts`` (it compiles then), else 0.

    Example:
        >>> seen: set[tuple] = set()
        >>> out, seconds = timed_first_call(seen, ("f32",), abs, -2)
        >>> out, seconds > 0, timed_first_call(seen, ("f32",), abs, -3)
        (2, True, (3, 0.0))
    """
    if layout in layouts:
        return function(*args), 0.0
    start = time.perf_counter()
    out = function(*args)
    layouts.add(layout)
    return out, time.perf_counter() - start


def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit`` (cached on disk) where Numba is installed; else the Python function (used only by tests)."""
    if not NUMBA:  # pragma: no cover
        return function
    return numba.njit(cache=True, nogil=True)(function)


SUMMED_DIRECTLY = 1e-3
"""A point's log-sum less some terms is re-summed term by term where those terms held over ``1 - this`` of it."""


@_compiled
def _logaddexp(a, b):
    """``log(exp(a) + exp(b))`` (either may be ``-inf``)."""
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    top = max(a, b)
    return top + math.log(math.exp(a - top) + math.exp(b - top))


@_compiled
def _half_sq_distance(point, mean):
    """``-|x - u|^2 / 2``."""
    s = 0.0
    for d in range(point.shape[0]):
        diff = point[d] - mean[d]
        s += diff * diff
    return -0.5 * s


@_compiled
def _block_sweep(
    state, ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, draws, log_accept, values,
    energy, beta_m1, slot, key_offset, zeros, log_zero, beta, accepted,
):  # fmt: skip
    chains, n_classes, width = state.shape[0], base.shape[0], base.shape[1]
    size = block_radix.shape[0]
    context = radix.shape[2]
    span = context + size
    n_values = cdf.shape[1]
    nonfinite = 0
    keys = np.empty(chains, dtype=np.int64)
    currents = np.empty(chains, dtype=np.int64)
    table_keys = np.empty(chains, dtype=np.int64)  # (the energies' rows: before the offset)
    for c in range(n_classes):
        # slot by slot, every chain at each slot (each chain still takes its slots in order: chains never interact):
        # first every chain's row, then the proposals and tests, with no branch on the rows' values, so that the
        # chains' row loads overlap (a table of many temperatures' rows is far larger than the caches)
        for i in range(sizes[c]):  # (padded slots would repeat slot sizes[c] - 1: skipped)
            at = c * width + i
            row = i * span
            for k in range(chains):
                key_sum = 0.0
                for j in range(context):
                    key_sum += state[k, ids[c, row + j]] * radix[c, i, j]
                key = base[c, i] + np.int64(key_sum)
                current_sum = 0.0
                for j in range(size):
                    current_sum += state[k, ids[c, row + context + j]] * block_radix[j]
                currents[k] = np.int64(current_sum)
                if key_offset is not None:
                    key = key + key_offset[k]
                if slot is not None:
                    key = slot[key]
                keys[k] = key
                table_keys[k] = key if key_offset is None else key - key_offset[k]
            for k in range(chains):
                key, current = keys[k], currents[k]
                u = draws[k, at]
                below = 0  # the first value whose CDF exceeds u, counted without branches (a row is non-decreasing)
                for v in range(n_values):
                    below += cdf[key, v] <= u
                proposed = below if below < n_values else 0  # (the rows end at 1 > u: never all below)
                log_alpha = log_ratio[key, proposed] - log_ratio[key, current]
                if energy is not None and beta_m1 is not None and beta_m1[k] != 0:  # (no 0 * -inf: NaN)
                    row = table_keys[k]
                    log_alpha = log_alpha + beta_m1[k] * (energy[row, proposed] - energy[row, current])
                if zeros is not None and log_zero is not None:
                    gained = zeros[key, proposed] - zeros[key, current]
                    penalty = gained - gained if gained == 0 else log_zero[k] * gained
                    if beta is not None:
                        penalty = beta[k] * penalty
                    log_alpha = log_alpha + penalty
                ok = log_alpha < math.inf  # NaN and +inf (a current value of zero density) are rejected
                take = ok and log_accept[k, at] < log_alpha
                accepted[k] += take
                nonfinite += not ok
                chosen = proposed if take else current
                for j in range(size):
                    state[k, block_ids[c, i * size + j]] = values[chosen, j]
    return nonfinite


def block_sweep(
    state: np.ndarray,
    ids: np.ndarray,
    radix: np.ndarray,
    block_radix: np.ndarray,
    block_ids: np.ndarray,
    base: np.ndarray,
    sizes: np.ndarray,
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
) -> tuple[np.ndarray, int]:
    """Classes ``C`` of a neural block sweep in turn, in place: :func:`fused_class_update_numpy` of each, compiled.

    The uniforms come as drawn, chain by chain (slot ``i`` of class ``c`` reads column ``c W + i``), and the
    padded slots of a class (``i >= sizes[c]``, which would repeat its last real slot and its numbers) are
    skipped, so the state and the counts are those of the NumPy function on the padded classes.

    Args:
        state: ``[K, n]`` states (float32 or float64), updated in place.
        ids: ``[C, W * (c + b)]`` each slot's context variables then block variables.
        radix: ``[C, W, c]`` the context's place values (state dtype).
        block_radix: ``[b]`` the block's place values (state dtype).
        block_ids: ``[C, W * b]`` each slot's block variables.
        base: ``[C, W]`` each slot's first table row.
        sizes: ``[C]`` (int64) each class's real slots.
        cdf, log_ratio: ``[R, J]`` proposal rows and ``log w`` rows.
        draws: ``[K, C W]`` uniforms of the proposals (rows' dtype).
        log_accept: ``[K, C W]`` log uniforms of the tests (float64).
        values: ``[J, b]`` the joint values (state dtype).
        energy, beta, slot, key_offset, zeros, log_zero: as in :func:`fused_class_update_numpy`.

    Returns:
        Accepted blocks per chain ``[K]`` (int64) and the number of non-finite ratios (rejected).
    """
    accepted = np.zeros(state.shape[0], dtype=np.int64)
    beta_m1 = None if beta is None else beta - 1  # NumPy's rounding of beta - 1 in the rows' dtype, as the NumPy path
    nonfinite = _block_sweep(
        state, ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, draws, log_accept, values,
        energy, beta_m1, slot, key_offset, zeros, log_zero, beta, accepted,
    )  # fmt: skip
    return accepted, int(nonfinite)


@_compiled
def _gibbs_class(state, vars_, scopes, strides, index, mask, flat, noise, beta, table_offset, float_strides, cast):
    chains = state.shape[0]
    depth, count, arity = scopes.shape
    n_values = index.shape[2]
    binary = noise.ndim == 2
    stuck = 0
    logits = np.empty(n_values, dtype=flat.dtype)
    scores = np.empty(n_values, dtype=state.dtype)
    for k in range(chains):
        for v in range(count):
            for j in range(n_values):
                total = flat[0]  # (typed as the tables; set at d = 0)
                for d in range(depth):
                    shift = np.int64(0)
                    if arity:
                        if float_strides:
                            place = state[k, scopes[d, v, 0]] * strides[d, v, 0]
                            for a in range(1, arity):
                                place = place + state[k, scopes[d, v, a]] * strides[d, v, a]
                            shift = np.int64(place)
                        else:
                            for a in range(arity):
                                shift += np.int64(state[k, scopes[d, v, a]]) * np.int64(strides[d, v, a])
                    if table_offset is not None:
                        shift += table_offset[k]
                    term = flat[index[d, v, j] + shift]
                    total = term if d == 0 else total + term
                logits[j] = total
            current = state[k, vars_[v]]
            if binary and mask is None:  # value 1 iff the noise is below (l_1 - l_0) beta
                cast[0] = logits[1] - logits[0] if beta is None else (logits[1] - logits[0]) * beta[k]
            else:
                for j in range(n_values):
                    if beta is not None:
                        logits[j] = logits[j] * beta[k]
                    if mask is not None:
                        logits[j] = logits[j] + mask[v, j]
                if binary:
                    cast[0] = logits[1] - logits[0]
            if binary:
                diff = cast[0]
                if diff != diff:  # NaN: both values impossible, a stuck variable
                    stuck += 1
                    state[k, vars_[v]] = current
                else:
                    state[k, vars_[v]] = 1.0 if noise[k, v] < diff else 0.0
            else:  # Gumbel-max over the values; no finite score keeps the current value
                for j in range(n_values):
                    cast[0] = logits[j]
                    scores[j] = -np.inf if cast[0] != cast[0] else cast[0]
                best = 0
                top = scores[0] + noise[k, v, 0]
                for j in range(1, n_values):
                    if top != top:  # NumPy's argmax takes the first NaN
                        break
                    noisy = scores[j] + noise[k, v, j]
                    if noisy > top or noisy != noisy:
                        best, top = j, noisy
                if math.isfinite(top):
                    state[k, vars_[v]] = best
                else:
                    stuck += 1
                    state[k, vars_[v]] = current
    return stuck


class GibbsClassArgs(NamedTuple):
    """A colour class's index arrays for :func:`gibbs_class`, converted once (see :func:`gibbs_class_args`)."""

    vars_: np.ndarray
    scopes: np.ndarray
    strides: np.ndarray
    entries: np.ndarray  # the tables' entries of each value (``index`` of :func:`gibbs_class`)
    mask: np.ndarray | None
    float_strides: bool
    layout: tuple  # the arrays' dtypes and ranks (a part of the compiled signature)


def gibbs_class_args(
    vars_: np.ndarray, scopes: np.ndarray, strides: np.ndarray, index: np.ndarray, mask: np.ndarray | None, dtype: Any
) -> GibbsClassArgs:
    """A class's arrays as :func:`gibbs_class` reads them with tables of ``dtype`` (the mask in that dtype).

    Example:
        >>> args = gibbs_class_args(np.array([0]), np.zeros((1, 1, 1), np.int64), np.ones((1, 1, 1)),
        ...                         np.zeros((1, 1, 2), np.int64), None, np.float32)
        >>> args.float_strides, args.mask is None
        (True, True)
    """
    if mask is not None:
        mask = mask.astype(dtype, copy=False)
    arrays = (vars_, scopes, strides, index, mask)
    layout = tuple(None if a is None else (a.dtype, a.ndim) for a in arrays)
    return GibbsClassArgs(*arrays, bool(np.issubdtype(strides.dtype, np.floating)), layout)


def gibbs_class(
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
    """The compiled :func:`~neuralblock.kernels.gibbs.gibbs_class_update_numpy`: one class in place; the stuck count.

    The arguments are the NumPy function's. A variable's factor terms are added one after another,
    in the order of its factors, as NumPy adds them along that axis, except that NumPy sums 8 or more
    terms pairwise when the class has a single variable (the axis is then contiguous): there the
    log-odds may differ in the last bit and, very rarely, a draw with them (the same conditionals).
    A sweep that runs the same classes again converts their arrays once (:func:`gibbs_class_args`)
    and calls :func:`gibbs_class_prepared`.

    Example:
        >>> state = np.zeros((1, 2), dtype=np.float32)  # x0 alone in its class; one factor [x0, x1], x1 = 0
        >>> flat = np.append(np.log(np.array([0.25, 0.25, 0.75, 0.25], dtype=np.float32)), np.float32(0.0))
        >>> args = (np.array([0]), np.array([[[1]]]), np.array([[[1.0]]], np.float32), np.array([[[0, 2]]]), None, flat)
        >>> gibbs_class(state, *args, np.array([[0.5]], np.float32)), state.tolist()  # 0.5 < log 3
        (0, [[1.0, 0.0]])
    """
    prepared = gibbs_class_args(vars_, scopes, strides, index, mask, flat.dtype)
    if beta is not None:
        beta = beta.astype(flat.dtype)  # as the NumPy function: the temperatures in the tables' dtype
    return gibbs_class_prepared(state, prepared, flat, noise, beta, table_offset, np.empty(1, dtype=state.dtype))


def gibbs_class_prepared(
    state: np.ndarray,
    args: GibbsClassArgs,
    flat: np.ndarray,
    noise: np.ndarray,
    beta: np.ndarray | None,
    table_offset: np.ndarray | None,
    cast: np.ndarray,
) -> int:
    """:func:`gibbs_class` on a class's converted arrays; ``beta`` already in the tables' dtype.

    ``cast`` is a one-entry scratch array of the state's dtype (it rounds a value as NumPy's
    ``astype(state.dtype)`` does).
    """
    return int(
        _gibbs_class(
            state, args.vars_, args.scopes, args.strides, args.entries, args.mask, flat, noise, beta, table_offset,
            args.float_strides, cast,
        )
    )  # fmt: skip


@_compiled
def _table_log_joint(states, scopes, strides, offsets, flat, out):
    for r in range(states.shape[0]):
        total = 0.0
        for f in range(scopes.shape[0]):
            entry = offsets[f]
            for a in range(scopes.shape[1]):
                variable = scopes[f, a]
                if variable < 0:
                    break
                entry += np.int64(states[r, variable]) * strides[f, a]
            total += flat[entry]
        out[r] = total


class TableLogJoint:
    """The log joint of a graph of table factors as one compiled loop: states ``[N, n]`` -> float64 ``[N]``.

    The terms are added in float64, factor by factor (:meth:`FactorGraph.log_joint` adds each
    group's terms in the states' dtype), so the two differ in the last bits: a function of the
    state either way, which is what an MH test (replica exchange's swaps) needs.

    Args:
        fg: a graph whose factors are all tables.

    Example:
        >>> import torch
        >>> from neuralblock import FactorGraph
        >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
        >>> _ = fg.add_table_factor([0, 1], torch.tensor([[0.5, -1.0], [0.0, 2.0]]))
        >>> TableLogJoint(fg)(np.array([[0.0, 1.0], [1.0, 1.0]], np.float32)).tolist()
        [-1.0, 2.0]
    """

    def __init__(self, fg: Any) -> None:
        import torch

        from neuralblock.graph import TableGroup  # (the graph package imports nothing from the kernels)

        groups = list(fg.groups)
        if not groups or not all(isinstance(g, TableGroup) for g in groups):
            raise ValueError("TableLogJoint needs a graph of table factors only")
        arity = max(int(g.scopes.shape[1]) for g in groups)
        scopes, strides, offsets, flats, start = [], [], [], [], 0
        for g in groups:
            count, size = int(g.scopes.shape[0]), int(g._size)
            pad = arity - int(g.scopes.shape[1])
            scopes.append(np.pad(g.scopes.numpy(), ((0, 0), (0, pad)), constant_values=-1))
            strides.append(np.pad(np.tile(g._strides.numpy(), (count, 1)), ((0, 0), (0, pad))))
            offsets.append(start + size * np.arange(count))
            flats.append(g._flat.detach().to(torch.float64, copy=True).reshape(-1).numpy())  # a snapshot
            start += count * size
        self.scopes = np.ascontiguousarray(np.concatenate(scopes).astype(np.int64))
        self.strides = np.ascontiguousarray(np.concatenate(strides).astype(np.int64))
        self.offsets = np.concatenate(offsets).astype(np.int64)
        self.flat = np.concatenate(flats)

    def __call__(self, states: np.ndarray) -> np.ndarray:
        out = np.empty(states.shape[0], dtype=np.float64)
        _table_log_joint(states, self.scopes, self.strides, self.offsets, self.flat, out)
        return out


@_compiled
def _tempered(log_p, zeros, beta, log_zero):
    """``beta (F + log_zero Z)``: a replica's log target at a state (no ``-inf * 0`` for a state without zeros)."""
    return beta * (log_p + (log_zero * zeros if zeros > 0 else 0.0))


@_compiled
def _swap_replicas(states, log_p, beta, parity, zeros, log_zero, log_u, deltas):
    replicas, chains = log_p.shape
    for pair, first in enumerate(range(parity, replicas - 1, 2)):
        second = first + 1
        for k in range(chains):
            if zeros is not None and log_zero is not None:  # replica r's log target at replica s's state
                delta = (
                    _tempered(log_p[second, k], zeros[second, k], beta[first], log_zero[first])
                    + _tempered(log_p[first, k], zeros[first, k], beta[second], log_zero[second])
                    - _tempered(log_p[first, k], zeros[first, k], beta[first], log_zero[first])
                    - _tempered(log_p[second, k], zeros[second, k], beta[second], log_zero[second])
                )
            else:
                delta = (beta[first] - beta[second]) * (log_p[second, k] - log_p[first, k])
            if delta != delta:
                delta = -np.inf
            deltas[pair, k] = delta
            if log_u[pair, k] < delta:
                for j in range(states.shape[2]):
                    states[first, k, j], states[second, k, j] = states[second, k, j], states[first, k, j]
                log_p[first, k], log_p[second, k] = log_p[second, k], log_p[first, k]


def swap_replicas(
    states: np.ndarray,
    log_p: np.ndarray,
    beta: np.ndarray,
    parity: int,
    log_u: np.ndarray,
    zeros: np.ndarray | None = None,
    log_zero: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`~neuralblock.kernels.replica_exchange.swap_replicas`, compiled and in place (float64 ``log_p``).

    ``log_u`` holds the log uniforms ``[P, K]`` of the pairs' tests (the torch function draws
    ``torch.rand_like(delta)`` in float64: the same stream). ``states [R, K, n]`` and ``log_p [R, K]``
    are swapped in place. Returns each pair's log acceptance ratio ``delta [P, K]`` (``NaN`` made
    ``-inf``), from which the caller takes the probabilities ``exp(min(delta, 0))`` as the torch
    function does (libm's and torch's ``exp`` differ in the last bits).

    Example:
        >>> states = np.array([[[0.0]], [[1.0]]])  # two replicas, one ensemble
        >>> log_p = np.array([[-5.0], [0.0]])
        >>> delta = swap_replicas(states, log_p, np.array([1.0, 0.5]), 0, np.log(np.array([[0.3]])))
        >>> states.ravel().tolist(), delta.tolist()  # the colder replica takes the likelier state
        ([1.0, 0.0], [[2.5]])
    """
    pairs = len(range(parity, log_p.shape[0] - 1, 2))
    deltas = np.zeros((pairs, log_p.shape[1]), dtype=np.float64)
    _swap_replicas(states, log_p, beta, parity, zeros, log_zero, log_u, deltas)
    return deltas


@_compiled
def _replica_block_transition(
    state, neural, ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, draws, log_accept, values, energy,
    beta_m1, slot, key_offset, zeros, log_zero, beta, accepted, scopes, strides, offsets, flat, log_p, zero_scopes,
    zero_strides, zero_offsets, zero_flat, zero_count, replica_log_zero, betas, parity, log_u, deltas, replicas,
):  # fmt: skip
    nonfinite = _block_sweep(
        state[:neural], ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, draws, log_accept, values,
        energy, beta_m1, slot, key_offset, zeros, log_zero, beta, accepted,
    )  # fmt: skip
    _table_log_joint(state, scopes, strides, offsets, flat, log_p)
    chains, n = state.shape[0] // replicas, state.shape[1]
    if zero_count is not None:  # soft zeros: each replica's target counts the state's zero entries
        _table_log_joint(state, zero_scopes, zero_strides, zero_offsets, zero_flat, zero_count)
        _swap_replicas(
            state.reshape(replicas, chains, n), log_p.reshape(replicas, chains), betas, parity,
            zero_count.reshape(replicas, chains), replica_log_zero, log_u, deltas,
        )  # fmt: skip
    else:
        _swap_replicas(
            state.reshape(replicas, chains, n), log_p.reshape(replicas, chains), betas, parity, None, None, log_u,
            deltas,
        )  # fmt: skip
    return nonfinite


def replica_block_transition(
    state: np.ndarray,
    sweep: tuple[np.ndarray | None, ...],
    joint: TableLogJoint,
    betas: np.ndarray,
    parity: int,
    log_u: np.ndarray,
    neural: int | None = None,
    zero_joint: TableLogJoint | None = None,
    replica_log_zero: np.ndarray | None = None,
) -> tuple[np.ndarray, int, np.ndarray]:
    """A replica-exchange transition's neural block sweep and swaps as one compiled call, in place:
    :func:`block_sweep` of the first ``neural`` states, then the swaps of :func:`swap_replicas`.

    The same arithmetic as those two calls one after the other, so with the same uniforms the states, counts and
    ratios are theirs bit for bit; only the calls between them are saved. The states after the first ``neural``
    (hotter replicas that took a single-site sweep before this call) are only swapped.

    Args:
        state: ``[R K, n]`` replica-major states (replica ``r``'s ensembles in rows ``r K .. r K + K - 1``).
        sweep: :func:`block_sweep`'s arguments after the state, ``ids`` to ``log_zero`` (17 arrays or ``None``),
            for the first ``neural`` states.
        joint: the model's :class:`TableLogJoint` (the swaps' log densities; the finite part with ``zero_joint``).
        betas: ``[R]`` inverse temperatures (float64).
        parity: which neighbouring pairs propose to swap (see :func:`swap_replicas`).
        log_u: ``[P, K]`` log uniforms of the swap tests.
        neural: how many of the first states take the block sweep (``None``: all).
        zero_joint: soft zeros: the count of zero table entries (the zeros' graph of ``FactorGraph.split_zeros``).
        replica_log_zero: with ``zero_joint``, each replica's log-potential of a zero entry ``[R]`` (float64).

    Returns:
        Accepted blocks per swept state ``[neural]``, the number of non-finite block ratios, and each attempted
        pair's log swap ratio ``[P, K]``.

    Example:
        >>> import torch
        >>> from neuralblock import FactorGraph
        >>> fg = FactorGraph(); _ = fg.add_variables(1, cardinality=2)
        >>> _ = fg.add_table_factor([0], torch.tensor([0.0, 1.0]))
        >>> state = np.array([[0.0], [1.0]])  # two replicas, one ensemble; the first takes the block sweep
        >>> ids, radix, block_radix = np.zeros((1, 1), np.int64), np.zeros((1, 1, 0)), np.ones(1)
        >>> block_ids, base, sizes = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64), np.ones(1, np.int64)
        >>> cdf, log_ratio = np.array([[0.5, 1.0]]), np.array([[0.0, 0.0]])  # propose 0 or 1; w flat (an exact q)
        >>> draws, log_accept, values = np.array([[0.9]]), np.log(np.array([[0.5]])), np.array([[0.0], [1.0]])
        >>> sweep = (ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, draws, log_accept, values)
        >>> accepted, bad, delta = replica_block_transition(state, sweep + (None,) * 6, TableLogJoint(fg),
        ...     np.array([1.0, 0.5]), 0, np.log(np.array([[0.9]])), neural=1)
        >>> state.ravel().tolist(), accepted.tolist(), delta.tolist()  # the block moves to 1; equal states: no swap
        ([1.0, 1.0], [1], [[0.0]])
    """
    replicas = betas.shape[0]
    if state.shape[0] % replicas or len(sweep) != 17:
        raise ValueError(f"expected [R K, n] states for {replicas} replicas and 17 sweep arguments")
    if (zero_joint is None) != (replica_log_zero is None):
        raise ValueError("zero_joint and replica_log_zero go together (soft zeros)")
    if replica_log_zero is not None and replica_log_zero.shape != (replicas,):
        raise ValueError(f"replica_log_zero must be [{replicas}], got shape {replica_log_zero.shape}")
    neural = state.shape[0] if neural is None else neural
    if not 0 < neural <= state.shape[0]:
        raise ValueError(f"neural must count 1..{state.shape[0]} states, got {neural}")
    *head, energy, beta, slot, key_offset, zeros, log_zero_rows = sweep
    draws, log_accept = head[8], head[9]
    if draws is None or log_accept is None or draws.shape[0] != neural or log_accept.shape[0] != neural:
        raise ValueError(f"the sweep's uniforms must have a row per swept state ({neural})")
    accepted = np.zeros(neural, dtype=np.int64)
    beta_m1 = None if beta is None else beta - 1  # (as block_sweep rounds it)
    deltas = np.zeros(log_u.shape, dtype=np.float64)
    log_p = np.empty(state.shape[0], dtype=np.float64)
    count = None if zero_joint is None else np.empty(state.shape[0], dtype=np.float64)
    zero_arrays = (None,) * 4 if zero_joint is None else (
        zero_joint.scopes, zero_joint.strides, zero_joint.offsets, zero_joint.flat
    )  # fmt: skip
    nonfinite = _replica_block_transition(
        state, neural, *head, energy, beta_m1, slot, key_offset, zeros, log_zero_rows, beta, accepted, joint.scopes,
        joint.strides, joint.offsets, joint.flat, log_p, *zero_arrays, count, replica_log_zero, betas, parity, log_u,
        deltas, replicas,
    )  # fmt: skip
    return accepted, int(nonfinite), deltas
