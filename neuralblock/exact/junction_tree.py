"""Exact inference on discrete factor graphs by junction-tree variable elimination.

The junction tree is the *bucket tree* of a greedy elimination order (min-fill,
min-degree or the natural order, whichever gives the fewest clique states), with
non-maximal cliques merged. One upward pass gives ``log Z``; one downward pass
(Hugin style) gives the belief of every clique, and from it the marginals of the
variables eliminated in that clique. Everything runs in float64 with normalised
messages and a separate log scale, so ``log Z`` of thousands of nats stays exact.

Large messages on chains of the tree are checkpointed (every ``~sqrt(#cliques)``-th
one is kept, the others are recomputed during the downward pass), which keeps the
memory of a 20x20 grid (treewidth 20, messages of ``2**20`` entries) near a few
hundred MB.

Example:
    >>> import torch
    >>> from neuralblock.graph import FactorGraph
    >>> fg = FactorGraph()
    >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 3)
    >>> fg.add_table_factor([a, b], torch.zeros(2, 3))
    0
    >>> probs, log_z = marginals(fg)
    >>> probs.shape, round(log_z, 4)  # Z = 6
    (torch.Size([2, 3]), 1.7918)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import networkx as nx
import torch
from torch import Tensor

from neuralblock.graph.factor_graph import FactorGraph
from neuralblock.graph.groups import TableGroup

__all__ = ["DEFAULT_MAX_CLIQUE_STATES", "elimination_order", "log_partition", "marginals"]

DEFAULT_MAX_CLIQUE_STATES = 2**26
_SMALL_OPERAND = 2**12
_EINSUM_SUBSCRIPTS = 52  # torch.einsum's sublist format takes subscripts in [0, 52)
_BIG_MESSAGE = 2**14  # messages at least this large may be dropped and recomputed


# --------------------------------------------------------------------------- factors
@dataclass
class _Potential:
    """A non-negative table over ``vars`` (one axis each), times ``exp(log_scale)``."""

    vars: tuple[int, ...]
    table: Tensor


@dataclass
class _Problem:
    cards: list[int]
    latent: list[int]  # latent variables that take part in inference (cardinality > 1)
    factors: list[_Potential]
    log_const: float  # log of the constant factors (fully observed) and of the table maxima


def _prepare(fg: FactorGraph) -> _Problem:
    """Check the graph, clamp the evidence and turn log tables into scaled float64 potentials."""
    cards = [int(k) for k in fg.cardinalities.tolist()]
    continuous = [fg.names[v] for v, k in enumerate(cards) if k == 0]
    if continuous:
        shown = ", ".join(repr(n) for n in continuous[:5]) + (" ..." if len(continuous) > 5 else "")
        raise ValueError(f"exact inference needs discrete variables; continuous variables found: {shown}")
    evidence = {int(v): int(x) for v, x in fg.evidence.items()}
    # variables with one state are observed at 0 (their only value)
    for v, k in enumerate(cards):
        if k == 1:
            evidence.setdefault(v, 0)
    factors: list[_Potential] = []
    log_const = 0.0
    for gi, group in enumerate(fg.groups):
        if not isinstance(group, TableGroup):
            raise ValueError(
                f"exact inference supports table factors only; factor group {gi} is a {type(group).__name__}"
            )
        tables = group.log_tables.detach().to(torch.float64)
        for scope, table in zip(group.scopes.tolist(), tables):
            index: list[int | slice] = []
            kept: list[int] = []
            for v in scope:
                if v in evidence:
                    index.append(evidence[v])
                else:
                    index.append(slice(None))
                    kept.append(v)
            table = table[tuple(index)]
            top = float(table.max())
            if top == -math.inf:
                raise ValueError(
                    f"a factor over {[fg.names[v] for v in scope]} is zero everywhere given the evidence, "
                    "so the partition function is 0"
                )
            log_const += top
            if kept:
                factors.append(_Potential(tuple(kept), (table - top).exp()))
    latent = [v for v in range(len(cards)) if v not in evidence]
    return _Problem(cards, latent, factors, log_const)


# --------------------------------------------------------------------------- orders
def _order_cost(
    adj: dict[int, set[int]], cards: Sequence[int] | dict[Hashable, int], order: Sequence[int]
) -> tuple[float, float]:
    """Simulate elimination; returns (log2 of largest clique, log2 of total clique states)."""
    adj = {v: set(n) for v, n in adj.items()}
    largest, total = 0.0, 0.0
    for v in order:
        nbrs = adj.pop(v)
        size = math.log2(cards[v]) + sum(math.log2(cards[u]) for u in nbrs)
        largest = max(largest, size)
        total = max(total, size) + math.log2(1 + 2 ** (min(total, size) - max(total, size)))
        for u in nbrs:
            adj[u].discard(v)
            adj[u].update(nbrs)
            adj[u].discard(u)
    return largest, total


def _greedy_order(adj: dict[int, set[int]], cards: Sequence[int] | dict[Hashable, int], method: str) -> list[int]:
    """Greedy min-fill or min-degree (weighted by states, ties by id) elimination order."""
    adj = {v: set(n) for v, n in adj.items()}
    logc = {v: math.log2(cards[v]) for v in adj}

    def weight(v: int) -> float:
        return logc[v] + sum(logc[u] for u in adj[v])

    def fill(v: int) -> int:
        nbrs = adj[v]
        d = len(nbrs)
        inner = sum(len(nbrs & adj[u]) for u in nbrs)  # each present edge inside N(v) counted twice
        return (d * (d - 1) - inner) // 2

    def score(v: int) -> tuple:
        return (fill(v), weight(v), v) if method == "min-fill" else (weight(v), v)

    scores = {v: score(v) for v in adj}
    order: list[int] = []
    while scores:
        v = min(scores, key=scores.__getitem__)
        order.append(v)
        del scores[v]
        nbrs = adj.pop(v)
        for u in nbrs:
            adj[u].discard(v)
            adj[u].update(nbrs)
            adj[u].discard(u)
        touched = set(nbrs)
        if method == "min-fill":
            for u in nbrs:
                touched.update(adj[u])
        for u in touched:
            scores[u] = score(u)
    return order


def elimination_order(graph: nx.Graph, cards: Sequence[int] | dict[Hashable, int], method: str = "auto") -> list[int]:
    """A good elimination order for variable elimination on a Markov network.

    Args:
        graph: the Markov network (nodes are variable ids, e.g. ``fg.variable_graph()``
            restricted to the latent variables).
        cards: cardinality of each node (indexable by node id).
        method: ``"min-fill"``, ``"min-degree"``, ``"natural"`` (sorted ids) or ``"auto"``
            (the one of the three with the fewest total clique states).

    Returns:
        The nodes in elimination order.

    Example:
        >>> import networkx as nx
        >>> g = nx.path_graph(4)
        >>> len(elimination_order(g, [2, 2, 2, 2]))
        4
    """
    adj = {int(v): {int(u) for u in graph.neighbors(v)} for v in graph.nodes}
    methods = ["min-fill", "min-degree", "natural"] if method == "auto" else [method]
    best: tuple[tuple[float, float], list[int]] | None = None
    for m in methods:
        if m == "natural":
            order = sorted(adj)
        elif m in ("min-fill", "min-degree"):
            order = _greedy_order(adj, cards, m)
        else:
            raise ValueError(f"unknown elimination method {m!r}; expected min-fill, min-degree, natural or auto")
        largest, total = _order_cost(adj, cards, order)
        cost = (total, largest)
        if best is None or cost < best[0]:
            best = (cost, order)
    if best is None:  # unreachable: methods is never empty (keeps asserts out of library code)
        raise RuntimeError("no elimination method was tried")
    return best[1]


# --------------------------------------------------------------------------- tree
@dataclass
class _Clique:
    elim: list[int]  # variables summed out here (positions in the elimination order)
    sep: list[int]  # separator towards the parent, increasing
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    factors: list[_Potential] = field(default_factory=list)

    @property
    def vars(self) -> list[int]:
        return self.elim + self.sep


def _relabel(problem: _Problem, order: list[int]) -> tuple[list[int], list[_Potential]]:
    """Rename variables to their elimination positions and sort every table's axes by position.

    With this layout every scope, message and belief lists its variables in increasing
    order, so all products are broadcasts of aligned views (no permutation of big tensors).
    """
    pos = {v: i for i, v in enumerate(order)}
    cards = [problem.cards[v] for v in order]
    factors = []
    for f in problem.factors:
        new = [pos[v] for v in f.vars]
        perm = sorted(range(len(new)), key=new.__getitem__)
        factors.append(_Potential(tuple(new[a] for a in perm), f.table.permute(perm).contiguous()))
    return cards, factors


def _build_tree(n: int, factors: list[_Potential]) -> tuple[list[_Clique], list[int]]:
    """Bucket tree of the order ``0..n-1`` with each parent merged into a child that contains it.

    Returns the cliques (indexed by elimination position) and the alive ones in processing order.
    """
    adj: list[set[int]] = [set() for _ in range(n)]
    for f in factors:
        for a in f.vars:
            adj[a].update(f.vars)
    cliques: list[_Clique] = []
    for v in range(n):
        nbrs = adj[v]
        nbrs.discard(v)
        for u in nbrs:
            adj[u].discard(v)
            adj[u].update(nbrs)
            adj[u].discard(u)
        cliques.append(_Clique([v], sorted(nbrs)))
        adj[v] = set()
    for i, c in enumerate(cliques):
        if c.sep:
            c.parent = c.sep[0]
            cliques[c.parent].children.append(i)
    for f in factors:
        cliques[f.vars[0]].factors.append(f)
    alive = [True] * n
    for i, c in enumerate(cliques):
        p = c.parent
        if p is None:
            continue
        par = cliques[p]
        if set(par.vars) <= set(c.vars):  # the parent clique lies inside the child: merge them
            par.elim = c.elim + par.elim
            par.children = [d for d in par.children if d != i] + c.children
            for d in c.children:
                cliques[d].parent = p
            par.factors = c.factors + par.factors
            alive[i] = False
    return cliques, [i for i in range(n) if alive[i]]


# --------------------------------------------------------------------------- passes
def _aligned(table: Tensor, vars: Sequence[int], target: Sequence[int], cards: Sequence[int]) -> Tensor:
    """View ``table`` (axes ``vars``, a subsequence of ``target``) with singleton axes for the rest."""
    present = set(vars)
    return table.reshape([cards[v] if v in present else 1 for v in target])


def _sum_out(table: Tensor, vars: Sequence[int], keep: Sequence[int], cards: Sequence[int]) -> Tensor:
    """Sum ``table`` (axes ``vars``, increasing) over the variables not in ``keep``.

    Runs of adjacent summed / kept axes are coalesced, and each summed run is reduced
    with the fastest torch primitive for its shape (plain ``sum`` is very slow when
    the reduced axis has a small inner stride).
    """
    kept = set(keep)
    runs: list[list] = []  # [is_summed, size]
    for v in vars:
        summed = v not in kept
        if runs and runs[-1][0] == summed:
            runs[-1][1] *= cards[v]
        else:
            runs.append([summed, cards[v]])
    out = table
    sizes = [size for _, size in runs]
    flags = [summed for summed, _ in runs]
    while any(flags):
        r = max((i for i, f in enumerate(flags) if f), key=lambda i: sizes[i])
        pre, size, post = math.prod(sizes[:r]), sizes[r], math.prod(sizes[r + 1 :])
        x = out.reshape(pre, size, post)
        if post >= 64 or size == 1:
            out = x.sum(1)
        elif size <= 8:
            out = x[:, 0]
            for j in range(1, size):
                out = out + x[:, j]
        elif post == 1:
            out = x.reshape(pre, size) @ torch.ones(size, dtype=x.dtype)
        else:
            out = torch.matmul(torch.ones(1, size, dtype=x.dtype), x).reshape(pre, post)
        del sizes[r], flags[r]
    return out.reshape([cards[v] for v in vars if v in kept])


def _product(ops: list[tuple[Sequence[int], Tensor]], cards: Sequence[int]) -> tuple[list[int], Tensor]:
    """Product of potentials whose axes are in increasing variable order; smallest first."""
    ops = sorted(ops, key=lambda op: op[1].numel())
    acc_vars: list[int] = list(ops[0][0])
    acc = ops[0][1]
    for vars, table in ops[1:]:
        union = sorted(set(acc_vars) | set(vars))
        acc = _aligned(acc, acc_vars, union, cards) * _aligned(table, vars, union, cards)
        acc_vars = union
    return acc_vars, acc


def _contract(
    ops: list[tuple[Sequence[int], Tensor]],
    vars: Sequence[int],
    keeps: Sequence[Sequence[int]],
    cards: Sequence[int],
) -> list[Tensor]:
    """Sums of the product of ``ops`` (together over ``vars``, increasing), one per variable set in ``keeps``.

    With at most two large operands and no full-size output, each sum is one
    ``torch.einsum`` over the large operands and the product of the small ones, which
    never forms the clique-sized product (a broadcast product over a small innermost
    axis ran ~4x slower than a contiguous multiply on the ``2**21``-entry Grids cliques).
    Otherwise the product is formed once and summed per output.
    """
    small = [op for op in ops if op[1].numel() < _SMALL_OPERAND]
    large = [op for op in ops if op[1].numel() >= _SMALL_OPERAND]
    if len(vars) > _EINSUM_SUBSCRIPTS or len(large) > 2 or any(len(keep) == len(vars) for keep in keeps):
        _, table = _product(ops, cards)
        return [_sum_out(table, vars, keep, cards) for keep in keeps]
    index = {v: j for j, v in enumerate(vars)}
    args: list = []
    for op_vars, table in large + ([_product(small, cards)] if small else []):
        args += [table.reshape([cards[v] for v in op_vars]), [index[v] for v in op_vars]]
    return [torch.einsum(*args, [index[v] for v in keep]).reshape([cards[v] for v in keep]) for keep in keeps]


class _Engine:
    """Runs the upward and downward passes over a bucket tree (variables renamed to positions)."""

    def __init__(self, problem: _Problem, order: list[int]) -> None:
        self.order = order
        self.log_const = problem.log_const
        self.cards, factors = _relabel(problem, order)
        self.cliques, self.process = _build_tree(len(order), factors)
        self.ones = [torch.ones(k, dtype=torch.float64) for k in self.cards]
        self.messages: dict[int, Tensor] = {}  # clique -> normalised upward message over its separator
        n_big = sum(1 for i in self.process if self._size(self.cliques[i].sep) >= _BIG_MESSAGE)
        self.stride = max(1, math.isqrt(max(n_big, 1)))
        self.keep: dict[int, bool] = {}

    def _size(self, vars: Sequence[int]) -> int:
        return math.prod(self.cards[v] for v in vars)

    def _operands(
        self, i: int, messages: dict[int, Tensor], extra: Tensor | None = None
    ) -> list[tuple[Sequence[int], Tensor]]:
        """The clique's factors, its children's messages (and ``extra`` over its separator).

        A clique variable that no operand covers gets a table of ones, so that the
        operands' variables are exactly ``clique.vars``.
        """
        clique = self.cliques[i]
        ops: list[tuple[Sequence[int], Tensor]] = [(f.vars, f.table) for f in clique.factors]
        ops += [(self.cliques[c].sep, messages[c]) for c in clique.children]
        if extra is not None:
            ops.append((clique.sep, extra))
        covered = {v for vs, _ in ops for v in vs}
        ops += [((v,), self.ones[v]) for v in clique.vars if v not in covered]
        if not covered <= set(clique.vars):  # cannot happen for a valid bucket tree
            raise RuntimeError(f"clique operands over {sorted(covered)}, expected {clique.vars}")
        return ops

    def _message(self, i: int, messages: dict[int, Tensor]) -> tuple[Tensor, float]:
        clique = self.cliques[i]
        _, pot = _product(self._operands(i, messages), self.cards)
        msg = _sum_out(pot, clique.vars, clique.sep, self.cards)
        top = float(msg.max())
        if not top > 0:
            raise ValueError("the partition function is 0 (the evidence or the factors allow no configuration)")
        return msg / top, math.log(top)

    def upward(self) -> float:
        """Compute all upward messages; returns log Z."""
        log_z = self.log_const
        run: dict[int, int] = {}
        for i in self.process:
            clique = self.cliques[i]
            msg, scale = self._message(i, self.messages)
            log_z += scale
            for c in clique.children:
                if not self.keep[c]:
                    del self.messages[c]
            if clique.parent is None:
                continue
            # checkpointing: along a chain of large messages keep every stride-th one
            big = self._size(clique.sep) >= _BIG_MESSAGE
            if big and len(clique.children) <= 1:
                prev = clique.children[0] if clique.children else None
                run[i] = 1 if prev is None or self.keep[prev] else run[prev] + 1
                self.keep[i] = run[i] >= self.stride
            else:
                self.keep[i] = True
            self.messages[i] = msg
        return log_z

    def _get(self, c: int, cache: dict[int, Tensor]) -> Tensor:
        """Upward message of clique ``c``, recomputing a dropped chain segment if needed."""
        if c in self.messages:
            return self.messages[c]
        if c not in cache:
            for d in self.cliques[c].children:
                self._get(d, cache)
            cache[c] = self._message(c, {**self.messages, **cache})[0]
        return cache[c]

    def downward(self, out: Tensor) -> None:
        """Fill ``out[v]`` with the marginal of every latent variable ``v``."""
        cards = self.cards
        deltas: dict[int, Tensor] = {}
        cache: dict[int, Tensor] = {}
        for i in reversed(self.process):
            clique = self.cliques[i]
            child_msgs = {c: self._get(c, cache) for c in clique.children}
            ops = self._operands(i, child_msgs, deltas.pop(i) if clique.parent is not None else None)
            cvars = clique.vars
            # marginals of the variables summed out in this clique, and the separator sums for the children
            elim_table, *sep_sums = _contract(
                ops, cvars, [clique.elim] + [self.cliques[c].sep for c in clique.children], cards
            )
            elim_table = elim_table / elim_table.sum()
            for v in clique.elim:
                out[self.order[v], : cards[v]] = _sum_out(elim_table, clique.elim, [v], cards)
            # Hugin messages to the children: marginal on the separator divided by the upward message
            for c, delta in zip(clique.children, sep_sums):
                delta = torch.nan_to_num_(delta.div_(child_msgs[c]), nan=0.0, posinf=0.0)  # 0/0 -> 0
                deltas[c] = delta.div_(delta.max().clamp(min=torch.finfo(torch.float64).tiny))
                self.messages.pop(c, None)
                cache.pop(c, None)
                del delta
            del sep_sums, ops, child_msgs


def _check_size(problem: _Problem, order: list[int], max_clique_states: int) -> None:
    adj: dict[int, set[int]] = {v: set() for v in problem.latent}
    for f in problem.factors:
        for a in f.vars:
            adj[a].update(u for u in f.vars if u != a)
    largest, _ = _order_cost(adj, problem.cards, order)
    if largest > math.log2(max_clique_states) + 1e-9:
        raise ValueError(
            f"the largest clique of the best elimination order has 2**{largest:.1f} = {2**largest:.3g} states, "
            f"above max_clique_states={max_clique_states}; exact inference is too expensive for this graph"
        )


@contextmanager
def _threads(num_threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (``None`` leaves it alone)."""
    if num_threads is None:
        yield
        return
    if int(num_threads) < 1:
        raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(int(num_threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _plan(fg: FactorGraph, method: str, max_clique_states: int) -> tuple[_Problem, list[int]]:
    problem = _prepare(fg)
    graph = fg.variable_graph().subgraph(problem.latent)
    order = elimination_order(graph, problem.cards, method)
    _check_size(problem, order, max_clique_states)
    return problem, order


# --------------------------------------------------------------------------- public
def log_partition(
    fg: FactorGraph,
    *,
    method: str = "auto",
    max_clique_states: int = DEFAULT_MAX_CLIQUE_STATES,
    num_threads: int | None = 1,
) -> float:
    """Natural log of the partition function, with the evidence clamped.

    ``log Z = log sum_{latent x} exp(sum_f log phi_f(x, evidence))``. Only the upward pass runs.

    Args:
        fg: a factor graph of discrete variables and table factors.
        method: elimination heuristic (see :func:`elimination_order`).
        max_clique_states: refuse graphs whose largest clique has more states than this.
        num_threads: torch intra-op threads while the passes run (restored afterwards;
            ``None`` keeps the current setting). The passes are memory bound, and on a
            busy 2-core machine OpenMP scheduling made multi-threaded ops ~30x slower
            on ``2**20``-entry messages, hence the default of 1.

    Returns:
        ``log Z`` as a Python float (``-inf`` never: a zero partition function raises).

    Raises:
        ValueError: continuous variables, non-table factors, a clique over the limit, or Z = 0.

    Example:
        >>> import torch
        >>> from neuralblock.graph import FactorGraph
        >>> fg = FactorGraph()
        >>> x = fg.add_variable("x", 2)
        >>> fg.add_table_factor([x], torch.tensor([0.0, 1.0]))
        0
        >>> round(log_partition(fg), 4)  # log(1 + e)
        1.3133
    """
    problem, order = _plan(fg, method, max_clique_states)
    with torch.no_grad(), _threads(num_threads):
        return _Engine(problem, order).upward()


def marginals(
    fg: FactorGraph,
    *,
    method: str = "auto",
    max_clique_states: int = DEFAULT_MAX_CLIQUE_STATES,
    num_threads: int | None = 1,
) -> tuple[Tensor, float]:
    """Exact single-variable marginals and log partition function of a discrete factor graph.

    Builds a junction tree from a greedy elimination order, runs one upward and one
    downward pass in float64 with per-message log scaling, and reads every variable's
    marginal off the belief of the clique where it is eliminated.

    Args:
        fg: a factor graph whose variables are all discrete and whose factors are all
            table factors; ``fg.evidence`` is clamped.
        method: elimination heuristic (``"auto"``, ``"min-fill"``, ``"min-degree"``, ``"natural"``).
        max_clique_states: refuse graphs whose largest clique has more states than this.
        num_threads: torch intra-op threads while the passes run (restored afterwards;
            ``None`` keeps the current setting). The passes are memory bound, and on a
            busy 2-core machine OpenMP scheduling made multi-threaded ops ~30x slower
            on ``2**20``-entry messages, hence the default of 1.

    Returns:
        ``(probs, log_z)``: ``probs`` is a float64 ``Tensor [n, k]`` (``k`` the largest
        cardinality, zero-padded past each variable's cardinality; observed variables are
        one-hot), ``log_z`` the natural log of the partition function with the evidence clamped.

    Raises:
        ValueError: continuous variables, non-table factors, a clique over the limit, or Z = 0.

    Example:
        >>> import torch
        >>> from neuralblock.graph import FactorGraph
        >>> fg = FactorGraph()
        >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
        >>> fg.add_table_factor([a, b], torch.tensor([[1.0, 2.0], [3.0, 4.0]]).log())
        0
        >>> probs, log_z = marginals(fg)
        >>> [round(p, 6) for p in probs[0].tolist()], round(log_z, 6)
        ([0.3, 0.7], 2.302585)
    """
    problem, order = _plan(fg, method, max_clique_states)
    n = len(problem.cards)
    k = max(problem.cards, default=1)
    out = torch.zeros(n, max(k, 1), dtype=torch.float64)
    latent = set(problem.latent)
    for v in range(n):
        if v not in latent:
            out[v, int(fg.evidence.get(v, 0))] = 1.0
    with torch.no_grad(), _threads(num_threads):
        engine = _Engine(problem, order)
        log_z = engine.upward()
        engine.downward(out)
    return out, log_z
