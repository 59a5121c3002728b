"""The ``grid`` motif: a ``size x size`` block of binary variables in a grid MRF or grid BN.

The seed paper's grid experiments propose a 2x2 (or 3x3) window of a binary grid at
once, conditioned on the window's Markov blanket. Two families share this module:

* ``family="mrf"``: pairwise binary Markov random fields on a lattice (the UAI ``Grids_*``
  Ising models: one unary table per variable, one pairwise table per lattice edge, open
  grids or tori).
* ``family="bn"``: grid Bayesian networks whose node ``(r, c)`` has the parents
  ``(r, c - 1)`` and ``(r - 1, c)`` (the UAI 2008 ERG networks ``90-*-1``, mostly
  deterministic CPTs). A CPT is a table factor whose *last* scope variable is the child.

Roles: the block ``B`` is the window's ``size**2`` variables, the conditioning set ``C`` is
its Markov blanket, and ``Psi`` are the tables of its scaffold factors (every factor that
touches the block).

**Block order.** Block variable ``i * size + j`` is window cell ``(i, j)`` (row-major).

* MRF: of the 8 symmetries of a window, the one whose row-major id tuple is
  lexicographically smallest. On a grid whose variables are numbered row-major, ``(0, 0)``
  is the top-left cell and ``j`` runs along the row. (The training distribution is
  symmetric, so any fixed rule would do; this one is deterministic and documented.)
* BN: ``(0, 0)`` is the window's source (its parents lie outside the window) and
  ``(0, 1)`` is its child with the smaller id, so every cell's in-window parents are
  ``(i, j - 1)`` and ``(i - 1, j)``. On the ERG grids (row-major ids) ``i`` is the row.

**Features** (the same function serves real graphs and training batches). Every scaffold
factor, sliced at the current Markov-blanket values, is a log-table over the block cells
it touches. Factors touching the same set of cells are added into one *slot*:

* MRF: one slot per cell (its unary tables plus the slices of its pairwise tables to
  blanket neighbours: an effective field) and one per lattice edge inside the window (the
  pairwise log-table);
* BN: one slot per cell (the CPT of the window source, plus the slices of the CPTs of
  children outside the window given their co-parents), one per top-row/left-column edge
  ``{(0, j - 1), (0, j)}``, ``{(i - 1, 0), (i, 0)}`` (the CPT of the lower cell sliced at
  its outside parent) and one per interior cell ``{(i - 1, j), (i, j - 1), (i, j)}``
  (its full CPT).

Slot entries run over the slot's cells in block order, first cell slowest. Each slot is
centred (minus the mean of its finite entries) and scaled by :data:`FEATURE_SCALE`;
impossible entries (``-inf``, from deterministic CPTs) become ``0`` and set a separate
indicator feature. With ``D`` slot entries the features are
``[scaled centred entries (D), impossible-indicators (D)]``, so ``feature_dim = 2 D``:
48 for ``size=2`` and 132 for ``size=3``, in both families. The exact conditional
``p(B | C, Psi)`` is the softmax of the sum over slots (:meth:`GridMotif.exact_conditional`);
the network sees the factorised pieces, not that sum.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018.

Example:
    >>> import torch
    >>> from neuralblock.io import read_uai, uai_grid
    >>> motif = GridMotif("mrf", size=2)
    >>> fg = read_uai(uai_grid("Grids_15"))
    >>> inst = motif.find_instances(fg)
    >>> len(inst), motif.encode(fg, inst, torch.zeros(fg.num_variables)).shape
    (361, torch.Size([361, 48]))
    >>> batch = motif.sample_training_batch(8, torch.Generator().manual_seed(0))
    >>> batch.features.shape, batch.log_p.shape
    (torch.Size([8, 48]), torch.Size([8, 16]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import Tensor

from neuralblock._shapes import broadcast_shape
from neuralblock.graph import FactorGraph
from neuralblock.graph.groups import TableGroup
from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, register_motif

__all__ = ["FEATURE_SCALE", "GridMotif"]

FEATURE_SCALE = 0.25
"""Multiplier from centred log-potentials to features (a power of two: exactly invertible)."""

_ENTRIES = 8  # a table over at most three binary variables
_AXES = 3
_FAMILIES = ("mrf", "bn")
_SIZES = (2, 3)

# Instantiation distribution (see GridMotif.sample_training_batch).
_F_MIN, _F_MAX = 0.5, 16.0  # coupling scale range of the MRF instantiations
_P_SIDE = 0.2  # probability that one side of the window lies on the grid boundary
_P_NODE = 0.05  # probability that one blanket variable is missing anyway
_P_DETERMINISTIC = 0.9  # probability that a CPT row is one-hot


# ---------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class _Layout:
    """Slots of the feature vector: which block cells each one covers, and where it lies."""

    slots: tuple[tuple[int, ...], ...]
    base: tuple[int, ...]
    size: int  # D, the number of slot entries
    index: dict[tuple[int, ...], int]
    select: Tensor  # [K, S] entry of each slot for each enumerated block value
    membership: Tensor  # [D, S] one-hot slot of each entry


def _make_layout(family: str, s: int) -> _Layout:
    def pos(i: int, j: int) -> int:
        return i * s + j

    slots: list[tuple[int, ...]] = [(p,) for p in range(s * s)]
    if family == "mrf":
        edges = [(pos(i, j), pos(i, j + 1)) for i in range(s) for j in range(s - 1)]
        edges += [(pos(i, j), pos(i + 1, j)) for i in range(s - 1) for j in range(s)]
        slots += sorted(edges)
    else:
        edges = [(pos(0, j - 1), pos(0, j)) for j in range(1, s)]
        edges += [(pos(i - 1, 0), pos(i, 0)) for i in range(1, s)]
        triples = [tuple(sorted((pos(i, j - 1), pos(i - 1, j), pos(i, j)))) for i in range(1, s) for j in range(1, s)]
        slots += sorted(edges) + sorted(triples)
    base, total = [], 0
    for slot in slots:
        base.append(total)
        total += 2 ** len(slot)
    values = BlockSpec([2] * (s * s)).enumerate().long()  # [K, s*s]
    select = torch.zeros(values.shape[0], len(slots), dtype=torch.long)
    membership = torch.zeros(total, len(slots))
    for sid, slot in enumerate(slots):
        k = len(slot)
        weights = torch.tensor([2 ** (k - 1 - t) for t in range(k)], dtype=torch.long)
        select[:, sid] = base[sid] + (values[:, list(slot)] * weights).sum(-1)
        membership[base[sid] : base[sid] + 2**k, sid] = 1.0
    return _Layout(tuple(slots), tuple(base), total, {slot: i for i, slot in enumerate(slots)}, select, membership)


# ---------------------------------------------------------------------------- graph index
@dataclass
class _GraphIndex:
    """Setup-time view of a factor graph: scopes, incident factors, binary tables."""

    scopes: list[list[int]]
    var_factors: list[list[int]]
    tables: Tensor  # [F + 1, 8] flat log-tables of binary table factors; the last row pads
    table_ok: list[bool]  # a table factor over <= max_arity binary variables
    allowed: list[bool]  # may be a block variable: latent, binary, every incident factor ok


def _index_graph(fg: FactorGraph, max_arity: int) -> _GraphIndex:
    n, num_f = fg.num_variables, fg.num_factors
    scopes = [fg.factor_scope(f) for f in range(num_f)]
    var_factors: list[list[int]] = [[] for _ in range(n)]
    for f, scope in enumerate(scopes):
        for v in scope:
            var_factors[v].append(f)
    tables = torch.zeros(num_f + 1, _ENTRIES)
    table_ok = [False] * num_f
    if num_f:
        group_of, row_of = fg.factor_location(torch.arange(num_f))
        for g, group in enumerate(fg.groups):
            shape = getattr(group, "table_shape", None)
            if not isinstance(group, TableGroup) or len(shape) > max_arity or any(k != 2 for k in shape):
                continue
            ids = (group_of == g).nonzero().squeeze(-1)
            flat = group.log_tables.reshape(group.num_factors, -1)
            tables[ids, : flat.shape[1]] = flat[row_of[ids]].to(tables.dtype)
            for f in ids.tolist():
                table_ok[f] = True
    cards = fg.cardinalities.tolist()
    allowed = [v not in fg.evidence and cards[v] == 2 and all(table_ok[f] for f in var_factors[v]) for v in range(n)]
    return _GraphIndex(scopes, var_factors, tables, table_ok, allowed)


# ---------------------------------------------------------------------------- instance rows
@dataclass
class _Row:
    """One scaffold factor of one instance, as gather instructions."""

    factor: int
    mb_vars: list[int]  # [3] blanket variable on each non-block axis (0 pads)
    mb_strides: list[int]  # [3] its table stride (0 pads)
    offsets: list[int]  # [8] table offset of each slot entry (0 pads)
    targets: list[int]  # [8] feature entry it adds to (D = discarded)


def _instance_rows(
    gi: _GraphIndex, cells: list[int], layout: _Layout, cache: dict[tuple, tuple[list[int], list[int]]]
) -> tuple[list[_Row], set[int]] | None:
    """Gather instructions for the scaffold of one window, or ``None`` if a factor fits no slot.

    ``cache`` maps (slot, table strides of its cells) to the row's (offsets, targets).
    """
    pos = {v: p for p, v in enumerate(cells)}
    rows: list[_Row] = []
    blanket: set[int] = set()
    for f in sorted({f for v in cells for f in gi.var_factors[v]}):
        if not gi.table_ok[f]:
            return None
        scope = gi.scopes[f]
        arity = len(scope)
        strides = [2 ** (arity - 1 - t) for t in range(arity)]
        stride_of = {pos[v]: strides[t] for t, v in enumerate(scope) if v in pos}
        slot = tuple(sorted(stride_of))
        sid = layout.index.get(slot)
        if sid is None:
            return None
        mb = [(v, strides[t]) for t, v in enumerate(scope) if v not in pos]
        blanket.update(v for v, _ in mb)
        key = (sid, tuple(stride_of[p] for p in slot))
        entries = cache.get(key)
        if entries is None:
            k = len(slot)
            offsets = [sum(st * ((e >> (k - 1 - t)) & 1) for t, st in enumerate(key[1])) for e in range(2**k)]
            targets = [layout.base[sid] + e for e in range(2**k)]
            pad = _ENTRIES - 2**k
            entries = cache[key] = (offsets + [0] * pad, targets + [layout.size] * pad)
        rows.append(
            _Row(
                f,
                [v for v, _ in mb] + [0] * (_AXES - len(mb)),
                [st for _, st in mb] + [0] * (_AXES - len(mb)),
                *entries,
            )
        )
    return rows, blanket


# ---------------------------------------------------------------------------- window search
def _orientations(grid: list[list[int]]) -> list[list[int]]:
    """Row-major id lists of the 8 symmetric images of a square grid."""
    out = []
    g = grid
    for _ in range(4):
        g = [list(r) for r in zip(*g[::-1])]  # rotate by 90 degrees
        out.append([v for r in g for v in r])
        out.append([v for r in (list(row) for row in zip(*g)) for v in r])  # and its transpose
    return out


def _mrf_windows(gi: _GraphIndex, s: int) -> list[list[int]]:
    """All ``s x s`` lattice windows of the pairwise graph, one canonical orientation each."""
    lattice = nx.Graph()
    lattice.add_nodes_from(range(len(gi.var_factors)))
    lattice.add_edges_from(tuple(scope) for f, scope in enumerate(gi.scopes) if len(scope) == 2 and gi.table_ok[f])
    adj = {v: set(lattice.adj[v]) for v in lattice}
    allowed = gi.allowed

    def ladder(q0: int, p0: int, q1: int, p1: int, used: set[int]) -> tuple[int, int] | None:
        # the rung straight on from the rung (p0, p1) seen from (q0, q1): x ~ p0, y ~ p1, x ~ y
        cands = [(x, y) for x in adj[p0] - {q0, p1} - used for y in adj[p1] - {q1, p0} - used if x != y and y in adj[x]]
        return cands[0] if len(cands) == 1 else None

    def extend(grid: list[list[int]]) -> list[list[int]] | None:
        # grow the 2x2 seed to s x s: rows 0-1 rung by rung, then each new row
        used = {v for row in grid for v in row}
        for j in range(2, s):
            rung = ladder(grid[0][j - 2], grid[0][j - 1], grid[1][j - 2], grid[1][j - 1], used)
            if rung is None:
                return None
            grid[0].append(rung[0])
            grid[1].append(rung[1])
            used.update(rung)
        for i in range(2, s):
            rung = ladder(grid[i - 2][0], grid[i - 1][0], grid[i - 2][1], grid[i - 1][1], used)
            if rung is None:
                return None
            grid.append(list(rung))
            used.update(rung)
            for j in range(2, s):
                common = (adj[grid[i][j - 1]] & adj[grid[i - 1][j]]) - {grid[i - 1][j - 1]} - used
                if len(common) != 1:
                    return None
                grid[i].append(common.pop())
                used.add(grid[i][j])
        return grid

    windows = []
    for a in range(len(allowed)):
        if not allowed[a]:
            continue
        for b in adj[a]:
            if not allowed[b] or (s == 2 and b < a):
                continue
            for c in adj[a]:
                if c == b or c in adj[b] or not allowed[c] or (s == 2 and c < b):
                    continue
                for d in adj[b] & adj[c]:
                    if d == a or d in adj[a] or (s == 2 and d < a):
                        continue
                    grid = extend([[a, b], [c, d]])
                    if grid is None:
                        continue
                    flat = [v for row in grid for v in row]
                    if len(set(flat)) != s * s or flat != min(_orientations(grid)):
                        continue
                    if _mrf_shape_ok(grid, adj, allowed):
                        windows.append(flat)
    return windows


def _mrf_shape_ok(grid: list[list[int]], adj: dict[int, set[int]], allowed: list[bool]) -> bool:
    s = len(grid)
    cells = {v for row in grid for v in row}
    for i in range(s):
        for j in range(s):
            v = grid[i][j]
            if not allowed[v]:
                return False
            inner = {
                grid[i + di][j + dj]
                for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1))
                if 0 <= i + di < s and 0 <= j + dj < s
            }
            if adj[v] & cells != inner:
                return False
            outside = adj[v] - cells
            if len(outside) > (i == 0) + (i == s - 1) + (j == 0) + (j == s - 1):
                return False
            if any(len(adj[m] & cells) != 1 for m in outside):
                return False
    return True


def _bn_structure(gi: _GraphIndex) -> tuple[list[list[int]], dict[int, set[int]], list[bool]]:
    """Parents (from each variable's CPT: the table whose last scope variable it is) and children."""
    n = len(gi.var_factors)
    cpt: list[int | None] = [None] * n
    allowed = list(gi.allowed)
    for f, scope in enumerate(gi.scopes):
        if scope and gi.table_ok[f]:
            child = scope[-1]
            if cpt[child] is not None:
                allowed[child] = False  # two CPTs: not a Bayesian-network node
            cpt[child] = f
    parents = [gi.scopes[f][:-1] if f is not None else [] for f in cpt]
    dag = nx.DiGraph()
    dag.add_nodes_from(range(n))
    dag.add_edges_from((p, v) for v in range(n) for p in parents[v])
    children = {v: set(dag.successors(v)) for v in dag}
    return parents, children, allowed


def _bn_windows(gi: _GraphIndex, s: int) -> list[list[int]]:
    """All ``s x s`` windows of a grid BN, oriented by the DAG (one per window source)."""
    parents, children, allowed = _bn_structure(gi)
    windows = []
    for a in range(len(allowed)):
        if not allowed[a] or len(children[a]) != 2:
            continue
        right, down = sorted(children[a])
        grid: list[list[int | None]] = [[None] * s for _ in range(s)]
        grid[0][0], grid[0][1], grid[1][0] = a, right, down
        ok = True
        for k in range(2, 2 * s - 1):
            for i in range(max(1, k - s + 1), min(k, s)):
                common = children[grid[i - 1][k - i]] & children[grid[i][k - i - 1]]
                ok = ok and len(common) == 1
                if not ok:
                    break
                grid[i][k - i] = next(iter(common))
            if ok and k < s:
                top = children[grid[0][k - 1]] - {grid[1][k - 1]}
                left = children[grid[k - 1][0]] - {grid[k - 1][1]}
                ok = len(top) == 1 and len(left) == 1
                if ok:
                    grid[0][k], grid[k][0] = next(iter(top)), next(iter(left))
            if not ok:
                break
        if not ok:
            continue
        flat = [v for row in grid for v in row]
        if len(set(flat)) == s * s and _bn_shape_ok(grid, parents, children, allowed):
            windows.append(flat)
    return windows


def _bn_shape_ok(
    grid: list[list[int]], parents: list[list[int]], children: dict[int, set[int]], allowed: list[bool]
) -> bool:
    s = len(grid)
    cells = {v for row in grid for v in row}
    for i in range(s):
        for j in range(s):
            v = grid[i][j]
            if not allowed[v] or len(parents[v]) > 2:
                return False
            inner_parents = {grid[i][j - 1]} if j > 0 else set()
            inner_parents |= {grid[i - 1][j]} if i > 0 else set()
            if set(parents[v]) & cells != inner_parents:
                return False
            inner_children = {grid[i][j + 1]} if j < s - 1 else set()
            inner_children |= {grid[i + 1][j]} if i < s - 1 else set()
            if children[v] & cells != inner_children:
                return False
            outside = children[v] - cells
            if len(outside) > (i == s - 1) + (j == s - 1):
                return False
            if any(len(parents[u]) > 2 or len(set(parents[u]) & cells) != 1 for u in outside):
                return False
    return True


# ---------------------------------------------------------------------------- shared feature code
def _slot_tables(
    tables: Tensor, mb_values: Tensor, mb_strides: Tensor, offsets: Tensor, targets: Tensor, size: int
) -> Tensor:
    """Sliced scaffold log-tables summed per slot: one gather and one scatter-add.

    Args:
        tables: ``[..., R, 8]`` flat log-tables of the scaffold factors (rows).
        mb_values: ``[..., R, 3]`` values of each row's blanket axes.
        mb_strides: ``[..., R, 3]`` their table strides (0 on padding).
        offsets: ``[..., R, 8]`` table offset of each slot entry given the block values.
        targets: ``[..., R, 8]`` feature entry each gathered value adds to (``size`` = discard).
        size: the number ``D`` of slot entries.

    Returns:
        ``[..., D]`` raw (uncentred) slot log-tables; ``-inf`` marks impossible entries.
    """
    base = (mb_values.long() * mb_strides).sum(-1, keepdim=True)
    index = base + offsets
    shape = broadcast_shape(index.shape, tables.shape)
    entries = tables.expand(shape).gather(-1, index.expand(shape))
    flat_shape = shape[:-2] + (shape[-2] * shape[-1],)
    out = entries.new_zeros(shape[:-2] + (size + 1,))
    out = out.scatter_add(-1, targets.expand(shape).reshape(flat_shape), entries.reshape(flat_shape))
    return out[..., :size]


def _features(slot_tables: Tensor, layout: _Layout) -> Tensor:
    """Centre and scale each slot, and split off the impossible-entry indicators."""
    finite = torch.isfinite(slot_tables)
    membership = layout.membership.to(slot_tables)
    values = torch.where(finite, slot_tables, torch.zeros((), dtype=slot_tables.dtype))
    counts = finite.to(slot_tables.dtype) @ membership
    center = ((values @ membership) / counts.clamp(min=1.0)) @ membership.T
    scaled = torch.where(finite, (slot_tables - center) * FEATURE_SCALE, torch.zeros((), dtype=slot_tables.dtype))
    return torch.cat([scaled, (~finite).to(slot_tables.dtype)], -1)


# ---------------------------------------------------------------------------- training template
@dataclass
class _Template:
    """The local model of one instantiation: block + full Markov blanket, all its factors."""

    num_local: int
    rows: dict[str, Tensor]  # gather instructions of the block's scaffold (shared with encode)
    side: Tensor  # [num_local] 0..3 = top/bottom/left/right side of a blanket variable, -1 = block
    parents: list[list[int]]  # bn: parents of each local node (topological = id order after roots)
    order: list[int]  # bn: topological order of the local nodes
    mrf_edges: Tensor  # mrf: [E, 2] pairwise factor scopes (block cell first)
    scaffold_scopes: Tensor  # [R, 3] local variables of each scaffold row's axes (0 pads)
    scaffold_strides: Tensor  # [R, 3] their table strides (0 pads)
    block_offsets: Tensor  # [R * 8, K] one-hot: row r's table offset from block value k is o


def _rows_tensors(all_rows: list[list[_Row]], pad_factor: int) -> dict[str, Tensor]:
    width = max([len(r) for r in all_rows] + [1])
    pad = _Row(pad_factor, [0] * _AXES, [0] * _AXES, [0] * _ENTRIES, [-1] * _ENTRIES)
    full = [rows + [pad] * (width - len(rows)) for rows in all_rows]
    n = len(all_rows)
    return {
        "factors": torch.tensor([[r.factor for r in rows] for rows in full], dtype=torch.long).reshape(n, width),
        "mb_vars": torch.tensor([[r.mb_vars for r in rows] for rows in full], dtype=torch.long).reshape(
            n, width, _AXES
        ),
        "mb_strides": torch.tensor([[r.mb_strides for r in rows] for rows in full], dtype=torch.long).reshape(
            n, width, _AXES
        ),
        "offsets": torch.tensor([[r.offsets for r in rows] for rows in full], dtype=torch.long).reshape(
            n, width, _ENTRIES
        ),
        "targets": torch.tensor([[r.targets for r in rows] for rows in full], dtype=torch.long).reshape(
            n, width, _ENTRIES
        ),
    }


def _build_template(family: str, s: int, layout: _Layout) -> _Template:
    coords: list[tuple[int, int]] = [(i, j) for i in range(s) for j in range(s)]
    side = [-1] * (s * s)
    if family == "mrf":
        for sd, cells in enumerate(
            (
                [(-1, j) for j in range(s)],
                [(s, j) for j in range(s)],
                [(i, -1) for i in range(s)],
                [(i, s) for i in range(s)],
            )
        ):
            coords += cells
            side += [sd] * len(cells)
    else:
        roots = [[(-1, j) for j in range(s)] + [(-1, s)], [], [(i, -1) for i in range(s)] + [(s, -1)], []]
        kids = [[], [(s, j) for j in range(s)], [], [(i, s) for i in range(s)]]
        for sd in (0, 2):
            coords += roots[sd]
            side += [sd] * len(roots[sd])
        for sd in (3, 1):
            coords += kids[sd]
            side += [sd] * len(kids[sd])
    vid = {c: k for k, c in enumerate(coords)}
    n = len(coords)
    fg = FactorGraph()
    fg.add_variables(n, 2, prefix="t")
    parents: list[list[int]] = [[] for _ in range(n)]
    order: list[int] = []
    edges: list[tuple[int, int]] = []
    if family == "mrf":
        fg.add_table_factors(torch.arange(n).reshape(n, 1), torch.zeros(n, 2))
        for i, j in coords[: s * s]:
            edges += [(vid[(i, j)], vid[(i, j + 1)])] if j + 1 < s else []
        for i, j in coords[: s * s]:
            edges += [(vid[(i, j)], vid[(i + 1, j)])] if i + 1 < s else []
        for m, (i, j) in enumerate(coords[s * s :], start=s * s):
            cell = (min(max(i, 0), s - 1), min(max(j, 0), s - 1))
            edges.append((vid[cell], m))
        fg.add_table_factors(torch.tensor(edges, dtype=torch.long), torch.zeros(len(edges), 2, 2))
    else:
        for k, (i, j) in enumerate(coords):
            if side[k] not in (0, 2):  # roots (outside parents, co-parents) have no parents
                parents[k] = [vid[c] for c in ((i, j - 1), (i - 1, j)) if c in vid]
            fg.add_table_factor([*parents[k], k], torch.zeros([2] * (len(parents[k]) + 1)))
        order = [k for k in range(n) if side[k] in (0, 2)] + [k for k in range(n) if side[k] not in (0, 2)]
    gi = _index_graph(fg, 2 if family == "mrf" else 3)
    windows = _mrf_windows(gi, s) if family == "mrf" else _bn_windows(gi, s)
    block = list(range(s * s))
    if block not in windows:  # pragma: no cover - guards the construction above
        raise RuntimeError(f"grid template ({family}, {s}) does not match its own window rule")
    built = _instance_rows(gi, block, layout, {})
    if built is None:  # pragma: no cover - guards the construction above
        raise RuntimeError(f"grid template ({family}, {s}) has no instance rows")
    rows = {k: v[0] for k, v in _rows_tensors([built[0]], 0).items()}
    scopes = [fg.factor_scope(f) for f in rows["factors"].tolist()]
    pad = [[0] * (_AXES - len(sc)) for sc in scopes]
    scaffold_scopes = torch.tensor([sc + p for sc, p in zip(scopes, pad)], dtype=torch.long)
    scaffold_strides = torch.tensor(
        [[2 ** (len(sc) - 1 - t) for t in range(len(sc))] + p for sc, p in zip(scopes, pad)], dtype=torch.long
    )
    values = BlockSpec([2] * (s * s)).enumerate().long()
    in_block = scaffold_scopes < s * s
    offset = (values[:, scaffold_scopes.clamp(max=s * s - 1)] * scaffold_strides * in_block).sum(-1)  # [K, R]
    block_offsets = torch.zeros(len(scopes) * _ENTRIES, values.shape[0])
    block_offsets[torch.arange(len(scopes)) * _ENTRIES + offset, torch.arange(values.shape[0])[:, None]] = 1.0
    return _Template(
        n,
        rows,
        torch.tensor(side, dtype=torch.long),
        parents,
        order,
        torch.tensor(edges, dtype=torch.long).reshape(-1, 2),
        scaffold_scopes,
        scaffold_strides,
        block_offsets,
    )


# ---------------------------------------------------------------------------- the motif
class GridMotif(Motif):
    """A ``size x size`` block of binary variables in a grid MRF or grid Bayesian network.

    See the module docstring for the block order, the feature layout and the structural
    rules. Features, training batches and :meth:`exact_conditional` share one slot layout.

    Args:
        family: ``"mrf"`` (pairwise lattice MRF, e.g. UAI ``Grids_*``) or ``"bn"`` (grid BN
            with left/up parents, e.g. the ERG networks).
        size: window side, 2 or 3 (``2**(size**2)`` block values are enumerated).

    Raises:
        ValueError: an unknown family or an unsupported size.

    References:
        Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018.

    Example:
        >>> import torch
        >>> from neuralblock.io import erg_grid, read_erg
        >>> motif = GridMotif("bn")
        >>> fg = read_erg(erg_grid("90-10-1"))
        >>> inst = motif.find_instances(fg)
        >>> len(inst), inst.blocks[0].tolist()
        (81, [0, 1, 10, 11])
        >>> f = motif.encode(fg, inst, torch.zeros(fg.num_variables))
        >>> motif.exact_conditional(f).shape
        torch.Size([81, 16])
    """

    name = "grid"
    version = 1

    def __init__(self, family: str = "mrf", size: int = 2) -> None:
        if family not in _FAMILIES:
            raise ValueError(f"grid family must be one of {_FAMILIES}, got {family!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size not in _SIZES:
            raise ValueError(f"grid size must be one of {_SIZES}, got {size!r}")
        self.family = family
        self.size = size
        self._layout = _make_layout(family, size)
        self._values = BlockSpec([2] * (size * size)).enumerate()
        self._template = _build_template(family, size, self._layout)

    # ------------------------------------------------------------------ protocol
    @property
    def block_spec(self) -> BlockSpec:
        """``size**2`` binary variables, in row-major window order."""
        return BlockSpec([2] * (self.size * self.size))

    @property
    def feature_dim(self) -> int:
        """``2 D``: ``D`` centred, scaled slot entries and ``D`` impossible-entry indicators."""
        return 2 * self._layout.size

    def options(self) -> dict[str, Any]:
        """``{"family": ..., "size": ...}``."""
        return {"family": self.family, "size": self.size}

    def describe(self) -> str:
        """The structure the motif looks for, in words (shown when a model has no instance).

        Example:
            >>> print(GridMotif("mrf", 2).describe())
            2x2 windows of latent binary (2-ary) variables in a lattice: variables joined by pairwise 2x2 tables along \
lattice edges (4-cycles), each window cell touching only unary [2] and pairwise [2, 2] tables of binary variables, \
each blanket variable next to one window cell
        """
        n = self.size
        if self.family == "mrf":
            return (
                f"{n}x{n} windows of latent binary (2-ary) variables in a lattice: variables joined by pairwise 2x2 "
                f"tables along lattice edges (4-cycles), each window cell touching only unary [2] and pairwise [2, 2] "
                "tables of binary variables, each blanket variable next to one window cell"
            )
        return (
            f"{n}x{n} windows of latent binary (2-ary) variables in a grid Bayesian network: each variable's table "
            "is a CPT (child last) of shape [2], [2, 2] or [2, 2, 2] over its left and upper neighbours, a window's "
            "cells have their in-window parents on their left and above, children outside the window hang off its "
            "last row or column"
        )

    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        """Every ``size x size`` window of ``fg`` whose variables are all latent.

        MRF rule: windows of the graph of pairwise binary table factors whose cells form a
        lattice patch (4-cycles, extended straight on for ``size=3``), whose cells touch
        only unary/pairwise binary tables, and whose blanket has the grid shape (each cell
        has at most as many outside neighbours as it has outward sides, and each blanket
        variable touches one cell). BN rule: from each window source, the children with
        the smaller / larger id start the row / column, interior cells are the common
        children of their left and upper cells; each cell has at most 2 parents, its
        in-window parents are exactly its left and upper cells, and children outside the
        window hang off the last row/column, one window parent each.

        In both families every scaffold factor must fit a slot of the feature layout.
        Setup-time Python; a 30x30 grid takes well under a second.

        Returns:
            ``blocks [I, size**2]`` (row-major cells), ``context [I, c]`` (the sorted
            Markov blanket, ``-1`` padded; ``c = 4 size`` for MRF, ``6 size`` for BN),
            ``params [I, R * 8]`` (flat log-tables of each instance's ``R`` scaffold
            factors) and ``extra`` gather instructions (``factors``, ``mb_vars``,
            ``mb_strides``, ``offsets``, ``targets``, all ``[I, R, ...]``).
        """
        if not isinstance(fg, FactorGraph):
            raise TypeError(f"expected a FactorGraph, got {type(fg).__name__}")
        s = self.size
        gi = _index_graph(fg, 2 if self.family == "mrf" else 3)
        windows = _mrf_windows(gi, s) if self.family == "mrf" else _bn_windows(gi, s)
        kept, all_rows, blankets = [], [], []
        cache: dict[tuple, tuple[list[int], list[int]]] = {}
        for cells in windows:
            built = _instance_rows(gi, cells, self._layout, cache)
            if built is None:
                continue
            kept.append(cells)
            all_rows.append(built[0])
            blankets.append(sorted(built[1]))
        width = 4 * s if self.family == "mrf" else 6 * s
        width = max([width] + [len(b) for b in blankets])
        pad_factor = fg.num_factors
        extra = _rows_tensors(all_rows, pad_factor)
        num, rows = extra["factors"].shape
        params = gi.tables[extra["factors"]].reshape(num, rows * _ENTRIES)
        extra["factors"] = extra["factors"].masked_fill(extra["factors"] == pad_factor, -1)
        extra["targets"] = extra["targets"].masked_fill(extra["targets"] < 0, self._layout.size)
        blocks = torch.tensor(kept, dtype=torch.long).reshape(num, s * s)
        context = torch.tensor([b + [-1] * (width - len(b)) for b in blankets], dtype=torch.long).reshape(num, width)
        return MotifInstances(blocks, context, params, extra)

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """Features ``[..., I, feature_dim]`` of the instances at states ``[..., n]``.

        One gather of the blanket values, one gather into the instances' stored
        log-tables and one scatter-add into the slots; no loop over instances.
        """
        state = fg.check_state(state)
        extra = instances.extra
        num = len(instances)
        tables = instances.params.reshape(num, extra["factors"].shape[1], _ENTRIES)  # R rows, also for I = 0
        mb_values = state[..., extra["mb_vars"]]  # [..., I, R, 3]
        slots = _slot_tables(
            tables.to(state.dtype),
            mb_values,
            extra["mb_strides"],
            extra["offsets"],
            extra["targets"],
            self._layout.size,
        )
        return _features(slots, self._layout)

    def exact_conditional(self, features: Tensor) -> Tensor:
        """The exact ``log p(B | C, Psi)`` encoded by features, ``[..., K]``.

        The slot log-tables are recovered from the features (up to per-slot constants),
        summed for every block value in :meth:`BlockSpec.enumerate` order and normalized.
        Impossible block values get ``-inf``.

        Args:
            features: ``[..., feature_dim]`` from :meth:`encode` or a training batch.

        Returns:
            ``[..., 2**(size**2)]`` conditional log-probabilities.
        """
        if features.shape[-1] != self.feature_dim:
            raise ValueError(f"features must have last dimension {self.feature_dim}, got {tuple(features.shape)}")
        d = self._layout.size
        impossible = features[..., d:] > 0.5
        slots = torch.where(impossible, float("-inf"), features[..., :d] / FEATURE_SCALE)
        logits = slots[..., self._layout.select.to(features.device)].sum(-1)
        return torch.log_softmax(logits, -1)

    # ------------------------------------------------------------------ training
    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random instantiations with ``(B, C)`` from the local joint, vectorized over the batch.

        The local model is the block, its full Markov blanket and all their factors:

        * MRF: Ising tables as in the UAI grids, unary ``[h, -h]`` with ``h ~ U[-1, 1]`` on
          every local variable and pairwise ``[[w, -w], [-w, w]]`` with ``w ~ U[-f, f]``,
          ``f`` drawn per instantiation on ``[0.5, 16]`` (uniform or log-uniform, half each;
          covers the grids' ``f`` in {2, 5, 10, 15}). Each side of the window is a grid
          boundary with probability 0.2 and each blanket variable is missing with
          probability 0.05 (its coupling is 0). ``B`` is drawn from its exact marginal
          (blanket variables summed out one by one) and the blanket given ``B``.
        * BN: every CPT row is one-hot (random which) with probability 0.9, else
          ``Beta(1, 1)``; outside parents and co-parents are roots with ``U(0, 1)``
          Bernoulli priors. Sides and single blanket nodes are missing as above (a
          missing node's CPT, and every CPT it is a parent of, is made constant along it).
          ``(B, C)`` is drawn ancestrally.

        ``log_p`` is computed by brute force from the local factors at the drawn ``C``
        over all ``K`` block values (``-inf`` for impossible ones), and ``block`` is a
        fresh draw from it.

        Args:
            batch_size: number of instantiations ``B``.
            generator: the random stream (the batch is a function of its state).

        Returns:
            ``TrainingBatch(features [B, feature_dim], block [B, size**2], log_p [B, K])``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if self.family == "mrf":
            local, tables = self._sample_mrf(batch_size, generator)
        else:
            local, tables = self._sample_bn(batch_size, generator)
        rows = self._template.rows
        row_tables = tables[:, rows["factors"]]  # [B, R, 8]
        mb_values = local[:, rows["mb_vars"]]  # [B, R, 3]
        slots = _slot_tables(
            row_tables, mb_values, rows["mb_strides"], rows["offsets"], rows["targets"], self._layout.size
        )
        features = _features(slots, self._layout)
        log_p = self._brute_force(local, row_tables)
        pick = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
        return TrainingBatch(features, self._values[pick], log_p)

    def _brute_force(self, local: Tensor, row_tables: Tensor) -> Tensor:
        """Conditional of the block from the scaffold factors' full tables, ``[B, K]``."""
        index, strides = self._template.scaffold_scopes, self._template.scaffold_strides
        in_block = index < self.size * self.size
        # full-table offset of every scaffold factor = blanket axes (per state) + block axes (per value)
        blanket_part = (local[:, index].long() * strides * ~in_block).sum(-1, keepdim=True)  # [B, R, 1]
        position = (blanket_part + torch.arange(_ENTRIES)).clamp(max=_ENTRIES - 1)
        entries = row_tables.gather(-1, position).flatten(1)  # [B, R * 8]: entry at block offset o
        impossible = torch.isinf(entries)
        finite = torch.where(impossible, torch.zeros((), dtype=entries.dtype), entries)
        choose = self._template.block_offsets.to(entries.dtype)  # [R * 8, K] picks offset of value k
        logits = finite @ choose
        logits = logits.masked_fill((impossible.to(entries.dtype) @ choose) > 0, float("-inf"))
        return torch.log_softmax(logits, -1)

    def _missing(self, batch: int, generator: torch.Generator) -> Tensor:
        """``[B, num_local]``: which blanket variables are absent (grid boundary or dropped)."""
        side = self._template.side
        sides = torch.rand(batch, 4, generator=generator) < _P_SIDE
        single = torch.rand(batch, side.shape[0], generator=generator) < _P_NODE
        missing = (sides[:, side.clamp(min=0)] | single) & (side >= 0)
        return missing

    def _sample_mrf(self, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        t = self._template
        s2, n = self.size * self.size, t.num_local
        u, mix = torch.rand(batch, generator=g), torch.rand(batch, generator=g) < 0.5
        f = torch.where(mix, _F_MIN + (_F_MAX - _F_MIN) * u, _F_MIN * (_F_MAX / _F_MIN) ** u)
        h = torch.rand(batch, n, generator=g) * 2 - 1
        num_edges = t.mrf_edges.shape[0]
        w = (torch.rand(batch, num_edges, generator=g) * 2 - 1) * f[:, None]
        missing = self._missing(batch, g)
        other = t.mrf_edges[:, 1]
        w = torch.where(missing[:, other], torch.zeros(()), w)
        # exact marginal of the block: blanket variables (one coupling each) summed out
        spins = 1 - 2 * self._values  # [K, s2]; value 0 <-> spin +1
        external = other >= s2
        cell, mb = t.mrf_edges[external, 0], other[external]
        internal = t.mrf_edges[~external]
        w_int, w_ext = w[:, ~external], w[:, external]
        logits = h[:, :s2] @ spins.T + w_int @ (spins[:, internal[:, 0]] * spins[:, internal[:, 1]]).T
        field = h[:, mb]  # [B, M]
        msg_plus = torch.logaddexp(field + w_ext, -field - w_ext)  # block cell spin +1
        msg_minus = torch.logaddexp(field - w_ext, -field + w_ext)
        x_cell = self._values[:, cell]  # [K, M]
        logits = logits + msg_plus @ (1 - x_cell).T + msg_minus @ x_cell.T
        pick = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
        block = self._values[pick]  # [B, s2]
        spin_cell = 1 - 2 * block[:, cell]
        p_zero = torch.sigmoid(2 * (field + w_ext * spin_cell))
        x_mb = (torch.rand(p_zero.shape, generator=g) >= p_zero).to(block.dtype)
        local = torch.zeros(batch, n)
        local[:, :s2] = block
        local[:, mb] = x_mb
        tables = torch.zeros(batch, n + num_edges, _ENTRIES)
        tables[:, :n, 0], tables[:, :n, 1] = h, -h
        tables[:, n:, 0], tables[:, n:, 1], tables[:, n:, 2], tables[:, n:, 3] = w, -w, -w, w
        return local, tables

    def _sample_bn(self, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        t = self._template
        n = t.num_local
        missing = self._missing(batch, g)
        local = torch.zeros(batch, n)
        tables = torch.zeros(batch, n, _ENTRIES)
        for v in t.order:
            par = t.parents[v]
            rows = 2 ** len(par)
            if par:
                det = torch.rand(batch, rows, generator=g) < _P_DETERMINISTIC
                onehot = (torch.rand(batch, rows, generator=g) < 0.5).to(local.dtype)
                p_one = torch.where(det, onehot, torch.rand(batch, rows, generator=g))
                cube = p_one.reshape(batch, *[2] * len(par))
                for axis, u in enumerate([*par, v]):
                    if not bool(missing[:, u].any()):
                        continue
                    if u == v:  # a missing node ignores all its parents
                        flat = cube.reshape(batch, rows)
                        const = flat[:, :1].expand(batch, rows).reshape(cube.shape)
                    else:  # a missing parent: the CPT is constant along its axis
                        const = cube.select(1 + axis, 0).unsqueeze(1 + axis).expand(cube.shape)
                    mask = missing[:, u].reshape(batch, *[1] * len(par))
                    cube = torch.where(mask, const, cube)
                p_one = cube.reshape(batch, rows)
                weights = torch.tensor([2 ** (len(par) - 1 - k) for k in range(len(par))])
                row = (local[:, par].long() * weights).sum(-1, keepdim=True)
                p = p_one.gather(1, row).squeeze(1)
            else:
                p_one = torch.rand(batch, 1, generator=g)
                p = p_one.squeeze(1)
            local[:, v] = (torch.rand(batch, generator=g) < p).to(local.dtype)
            log_table = torch.stack([1 - p_one, p_one], -1).log().reshape(batch, 2 * rows)
            tables[:, v, : 2 * rows] = log_table
        return local, tables


register_motif("grid", GridMotif)


def grid_bn(height: int, width: int, p_one: Callable[[int], Tensor]) -> FactorGraph:
    """A directed binary grid BN whose CPT rows come from ``p_one``.

    Node ``(r, c)`` (variable ``r * width + c``, named ``V_r_c``) has parents ``(r, c-1)``
    and ``(r-1, c)`` as in the UAI 2008 grid BNs. ``p_one(rows)`` returns ``P(child = 1)``
    for ``rows`` CPT rows; it is called once per number of parents (0, 1, 2), for all nodes
    with that many parents together (row-major nodes, parent configurations first-parent slowest).

    Example:
        >>> fg = grid_bn(2, 3, lambda rows: torch.full((rows,), 0.5))
        >>> fg.num_variables, fg.num_factors
        (6, 6)
    """
    if height < 1 or width < 1:
        raise ValueError(f"bad grid BN shape {height}x{width}")
    fg = FactorGraph()
    for r in range(height):
        for c in range(width):
            fg.add_variable(f"V_{r}_{c}", 2)
    by_arity: dict[int, list[list[int]]] = {}
    for r in range(height):
        for c in range(width):
            parents = ([r * width + c - 1] if c else []) + ([(r - 1) * width + c] if r else [])
            by_arity.setdefault(len(parents), []).append([*parents, r * width + c])
    for arity, scopes in by_arity.items():
        p = p_one(len(scopes) * 2**arity)
        cpt = torch.stack([1 - p, p], -1).reshape(len(scopes), *([2] * arity), 2)
        fg.add_table_factors(torch.tensor(scopes), cpt.log().to(torch.get_default_dtype()))
    return fg


def random_grid_bn(height: int, width: int, generator: torch.Generator, deterministic: float = 0.9) -> FactorGraph:
    """A random directed grid BN from the grid motif's instantiation distribution (see :func:`grid_bn`).

    Each CPT row is one-hot (a random value) with probability ``deterministic`` and
    ``Beta(1, 1)`` otherwise.

    Example:
        >>> fg = random_grid_bn(3, 4, torch.Generator().manual_seed(0))
        >>> fg.num_variables, fg.num_factors
        (12, 12)
    """
    if height < 1 or width < 1 or not 0.0 <= deterministic <= 1.0:
        raise ValueError(f"bad grid BN shape {height}x{width} or deterministic fraction {deterministic}")

    def p_one(rows: int) -> Tensor:
        uniform = torch.rand(rows, generator=generator)
        one_hot = torch.rand(rows, generator=generator) < deterministic
        return torch.where(one_hot, (torch.rand(rows, generator=generator) < 0.5).to(uniform.dtype), uniform)

    return grid_bn(height, width, p_one)
