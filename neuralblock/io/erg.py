"""Reader for the ERG Bayesian-network format (UAI 2008 grid networks).

Layout (whitespace separated, gzip or plain text)::

    n
    k_0 .. k_{n-1}                 cardinalities
    p p_1 .. p_p                   one parent list per variable
    /* Probabilities */
    size e_1 .. e_size             one CPT per variable: rows by parent configuration
                                   (parent-list order, first parent slowest), child fastest
    /* Names */
    name_0 .. name_{n-1}           optional
    /* Labels */                   ignored

Example:
    >>> from neuralblock.io import erg_grid, read_erg
    >>> fg = read_erg(erg_grid("90-10-1"))
    >>> fg.num_variables, fg.names[11], [fg.names[v] for v in fg.factor_scope(11)]
    (100, 'V_2_2', ['V_2_1', 'V_1_2', 'V_2_2'])
"""

from __future__ import annotations

from neuralblock.graph import FactorGraph
from neuralblock.io._tables import (
    MAX_CARDINALITY,
    MAX_TABLE_ENTRIES,
    MAX_VARIABLES,
    ParsedTables,
    build_graph,
    check_states,
    table_size,
)
from neuralblock.io._tokens import PathLike, Tokens, _show

__all__ = ["read_erg"]


def read_erg(path: PathLike) -> FactorGraph:
    """Read an ERG Bayesian network (gzip or plain text) into a :class:`FactorGraph`.

    Variable ``i`` gets the name from the ``/* Names */`` section (``x<i>`` if absent).
    Factor ``i`` is the CPT of variable ``i`` with scope ``parents + [i]`` (child last);
    its log-table (zeros become ``-inf``) has the child on the last axis. Every CPT row
    must sum to 1 within ``1e-3``.

    Args:
        path: the ``.erg`` or ``.erg.gz`` file (compression is detected from the content).

    Returns:
        The factor graph, one CPT factor per variable.

    Raises:
        ValueError: malformed file (the message names the file, line and problem).

    Example:
        >>> from neuralblock.io import erg_grid, read_erg
        >>> read_erg(erg_grid("90-16-1"))
        FactorGraph(256 variables (256 discrete), 256 factors, 0 observed)
    """
    with Tokens.open(path) as toks:
        names, cards, tables = _read_erg(toks)
        source = toks.source
    return build_graph(names, cards, tables, source, conditional=True)


def _read_erg(toks: Tokens) -> tuple[list[str], list[int], ParsedTables]:
    """Names, cardinalities and CPTs of an ERG file, every bound checked."""
    n = toks.integer("the number of variables", 0, MAX_VARIABLES)
    line = toks.line()
    cards = [toks.integer(f"the cardinality of variable {i}", 1, MAX_CARDINALITY) for i in range(n)]
    check_states(cards, toks.source, line)

    tables = ParsedTables()
    for i in range(n):
        line = toks.line()
        k = toks.integer(f"the number of parents of variable {i}", 0, max(n - 1, 0))
        parents = [toks.integer(f"a parent id of variable {i}", 0, n - 1) for _ in range(k)]
        if i in parents:
            raise toks.error(f"variable {i} is its own parent", line)
        if len(set(parents)) != k:
            raise toks.error(f"parent list {parents} of variable {i} repeats a variable", line)
        tables.scopes.append([*parents, i])

    toks.comment("Probabilities")
    total = 0
    for i, scope in enumerate(tables.scopes):
        line = toks.line()
        size = toks.integer(f"the CPT size of variable {i}", 0)
        expected = table_size(cards, scope)
        if size != expected:
            raise toks.error(
                f"CPT size {size} of variable {i} does not match its parents {scope[:-1]} "
                f"(product of cardinalities = {expected})",
                line,
            )
        total += size
        if total > MAX_TABLE_ENTRIES:
            raise toks.error(
                f"the CPTs up to variable {i} hold {total} entries, more than the limit of {MAX_TABLE_ENTRIES}", line
            )
        tables.values.append(toks.table(size, f"CPT entries of variable {i}", line=line))
        tables.lines.append(line)

    names = [f"x{i}" for i in range(n)]
    token = toks.peek()
    if token is not None and token.startswith("/*") and "names" in token.lower():
        toks.comment("Names")
        seen: dict[str, int] = {}
        for i in range(n):
            line = toks.line()
            name = toks.next(f"the name of variable {i}")
            if name.startswith("/*"):
                raise toks.error(f"expected {n} variable names, got {i}", line)
            if name in seen:
                raise toks.error(f"variable name {_show(name)} is used twice (variables {seen[name]} and {i})", line)
            seen[name] = i
            names[i] = name
        token = toks.peek()
    if token is not None and not token.startswith("/*"):
        raise toks.error(f"unexpected token {_show(token)} after the CPTs")
    return names, cards, tables
