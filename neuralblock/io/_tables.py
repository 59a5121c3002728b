"""Turn parsed table factors into a :class:`FactorGraph` in a few bulk calls."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from neuralblock.graph import FactorGraph

__all__ = [
    "MAX_CARDINALITY",
    "MAX_FACTORS",
    "MAX_STATES",
    "MAX_TABLE_ENTRIES",
    "MAX_VARIABLES",
    "ParsedTables",
    "build_graph",
    "check_bayes_structure",
    "check_states",
    "table_size",
]

CPT_TOLERANCE = 1e-3

# Read-time limits: a file beyond them is refused (naming the line) before anything is allocated
# for it, so that no reader or kernel later tries to build tables that cannot fit in memory.
MAX_VARIABLES = 2**22
"""Most variables in one file."""
MAX_FACTORS = 2**22
"""Most factors in one file."""
MAX_CARDINALITY = 2**16
"""Largest cardinality of one variable."""
MAX_TABLE_ENTRIES = 2**25
"""Most table entries in one file (each table and all together; 256 MiB as float64)."""
MAX_STATES = 2**25
"""Most entries of a ``[variables, largest cardinality]`` table, the size of the per-value
tables that marginals and the Gibbs kernels build (256 MiB as float64)."""


@dataclass
class ParsedTables:
    """Table factors as read from a file, before any graph is built.

    Attributes:
        scopes: per factor, its variable ids (table axis order).
        values: per factor, its flat table (last scope variable fastest), an ``array('d')`` or a list.
        lines: per factor, the line of its table (for error messages).
    """

    scopes: list[list[int]] = field(default_factory=list)
    values: list[array | list[float]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


def build_graph(
    names: Sequence[str],
    cards: Sequence[int],
    tables: ParsedTables,
    source: str,
    conditional: bool = False,
) -> FactorGraph:
    """Build a graph of discrete variables and log-table factors.

    Factors keep their file order (factor id ``f`` is the ``f``-th table of the file):
    each maximal run of consecutive factors with the same table shape is added with
    one :meth:`FactorGraph.add_table_factors` call.

    Args:
        names: variable names.
        cards: variable cardinalities.
        tables: the parsed factors (already checked against ``cards``).
        source: file name for error messages.
        conditional: the tables are CPTs (child = last scope variable): every row over
            the child must sum to 1 within ``1e-3``.

    Raises:
        ValueError: a CPT row does not sum to 1.
    """
    if conditional:
        check_bayes_structure(names, tables, source)
    runs: list[tuple[tuple[int, ...], int, int]] = []  # (shape, start, stop)
    for f, scope in enumerate(tables.scopes):
        shape = tuple(cards[v] for v in scope)
        if runs and runs[-1][0] == shape:
            runs[-1] = (shape, runs[-1][1], f + 1)
        else:
            runs.append((shape, f, f + 1))
    batches = []
    for shape, start, stop in runs:
        count = stop - start
        flat = array("d")
        for row in tables.values[start:stop]:
            flat.extend(row)
        table = torch.frombuffer(flat, dtype=torch.float64).reshape((count, *shape))
        if conditional:
            sums = table.reshape(count, -1, shape[-1]).sum(-1)
            bad = ((sums - 1.0).abs() > CPT_TOLERANCE).nonzero()
            if bad.numel():
                f, bad_row = int(bad[0, 0]), int(bad[0, 1])
                raise ValueError(
                    f"{source} line {tables.lines[start + f]}: CPT of factor {start + f} "
                    f"(child {names[tables.scopes[start + f][-1]]!r}) row {bad_row} sums to "
                    f"{float(sums[f, bad_row]):.6g}, expected 1"
                )
        scopes = torch.tensor(tables.scopes[start:stop], dtype=torch.long).reshape(count, len(shape))
        batches.append((scopes, table.log().to(torch.get_default_dtype())))

    fg = FactorGraph()
    for name, card in zip(names, cards):
        fg.add_variable(name, card)
    for scopes, log_tables in batches:
        fg.add_table_factors(scopes, log_tables)
    return fg


def check_bayes_structure(names: Sequence[str], tables: ParsedTables, source: str) -> None:
    """A Bayesian network's CPTs: one per variable (its last scope variable), parents forming a DAG.

    Raises:
        ValueError: a variable has no CPT or several, or the parent links form a cycle (the
            product of the tables would not be a normalised joint distribution).

    Example:
        >>> tables = ParsedTables([[0], [0, 1], [1, 0]], [[0.5, 0.5]] * 3, [1, 2, 3])
        >>> check_bayes_structure(["a", "b"], tables, "net.uai")
        Traceback (most recent call last):
        ...
        ValueError: net.uai line 3: variable 'a' is the child of 2 CPTs (lines [1, 3]), expected one
    """
    import networkx as nx

    owners: dict[int, list[int]] = {}
    for f, scope in enumerate(tables.scopes):
        owners.setdefault(scope[-1], []).append(f)
    for child, factors in owners.items():
        if len(factors) > 1:
            lines = [tables.lines[f] for f in factors]
            raise ValueError(
                f"{source} line {lines[-1]}: variable {names[child]!r} is the child of {len(factors)} CPTs "
                f"(lines {lines}), expected one"
            )
    orphans = [names[v] for v in range(len(names)) if v not in owners]
    if orphans:
        raise ValueError(f"{source}: variables {orphans[:5]} have no CPT; a Bayesian network has one per variable")
    links = nx.DiGraph((parent, scope[-1]) for scope in tables.scopes for parent in scope[:-1])
    if not nx.is_directed_acyclic_graph(links):
        cycle = [names[u] for u, _ in nx.find_cycle(links)]
        raise ValueError(f"{source}: the parent links form a cycle {cycle}; a Bayesian network is acyclic")


def table_size(cards: Sequence[int], scope: Sequence[int]) -> int:
    """Number of entries of a table over ``scope``."""
    return math.prod(cards[v] for v in scope)


def check_states(cards: Sequence[int], source: str, line: int) -> None:
    """Refuse ``n`` variables whose ``[n, largest cardinality]`` table exceeds :data:`MAX_STATES`.

    Raises:
        ValueError: naming ``source`` and ``line`` (the line of the cardinalities).

    Example:
        >>> check_states([2] * 3, "a.uai", 3)
        >>> check_states([2**16] * 2**10, "a.uai", 3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: a.uai line 3: 1024 variables with cardinalities up to 65536 need a 1024 x 65536 table ...
    """
    if not cards:
        return
    widest = max(cards)
    if len(cards) * widest > MAX_STATES:
        raise ValueError(
            f"{source} line {line}: {len(cards)} variables with cardinalities up to {widest} need a "
            f"{len(cards)} x {widest} table of states ({len(cards) * widest} entries), more than the limit "
            f"of {MAX_STATES}"
        )
