"""Readers and writers for the UAI inference-competition formats.

* ``.uai``: a ``MARKOV`` or ``BAYES`` network of discrete variables with table factors
  (UAI 2014 format: type, number of variables, cardinalities, number of factors, one
  scope ``k v1 .. vk`` per line, then one table ``size e1 .. esize`` per factor with the
  last scope variable varying fastest).
* ``.evid``: evidence, ``k v1 e1 .. vk ek`` (UAI 2014) or ``1`` then that line (UAI 2010).
* ``.MAR``: single-variable marginals, ``MAR`` then ``n c1 p .. c2 p ..``.
* ``.PR``: ``PR`` then log10 of the partition function.

Every malformed input raises ``ValueError("<file> line <n>: <problem>")``; no reader
returns a partially built graph.

Example:
    >>> from neuralblock.io import read_uai, read_mar, read_pr, uai_grid
    >>> fg = read_uai(uai_grid("Grids_12"))
    >>> fg.num_variables, fg.num_factors
    (100, 280)
    >>> tuple(read_mar(uai_grid("Grids_12", "MAR")).shape)
    (100, 2)
    >>> read_pr(uai_grid("Grids_12", "PR"))
    303.086
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from neuralblock._files import atomic_write_bytes
from neuralblock.graph import FactorGraph
from neuralblock.io._tables import ParsedTables, build_graph, table_size
from neuralblock.io._tokens import PathLike, Tokens, read_text

__all__ = ["read_evid", "read_mar", "read_pr", "read_uai", "write_mar"]

MAR_TOLERANCE = 1e-3


def read_uai(path: PathLike, evid: PathLike | Mapping[int | str, int] | None = None) -> FactorGraph:
    """Read a UAI ``.uai`` network (``MARKOV`` or ``BAYES``) into a :class:`FactorGraph`.

    Variables are named ``x0 .. x{n-1}`` (their UAI index). Factor ``f`` of the file is
    factor id ``f`` of the graph; its log-table (zeros become ``-inf``) is stored with
    axes in scope order. For ``BAYES`` files the last scope variable is the child and
    every CPT row must sum to 1 within ``1e-3``. Gzipped files are read transparently.
    Scopes are expected one per line, as the format specifies: a scope line holding a
    different number of variables than it declares is reported as an error.

    Args:
        path: the ``.uai`` file.
        evid: optional evidence: a ``.evid`` file (see :func:`read_evid`) or a mapping
            ``{variable id or name: value}``; applied with :meth:`FactorGraph.set_evidence`.

    Returns:
        The factor graph.

    Raises:
        ValueError: malformed file (the message names the file, line and problem), or
            evidence that names an unknown variable or a value outside its domain.

    Example:
        >>> from neuralblock.io import read_uai, uai_grid
        >>> fg = read_uai(uai_grid("Grids_15"), evid={0: 1})
        >>> fg
        FactorGraph(400 variables (400 discrete), 1160 factors, 1 observed)
    """
    text, source = read_text(path)
    toks = Tokens(text, source)
    line = toks.line()
    kind = toks.next("the network type (MARKOV or BAYES)").upper()
    if kind not in ("MARKOV", "BAYES"):
        raise toks.error(f"unknown network type {kind!r}, expected MARKOV or BAYES", line)
    n = toks.integer("the number of variables", 0)
    cards = [toks.integer(f"the cardinality of variable {i}", 1) for i in range(n)]
    m = toks.integer("the number of factors", 0)

    tables = ParsedTables()
    for f in range(m):
        line, first_on_line = toks.line(), _starts_line(toks)
        k = toks.integer(f"the scope size of factor {f}", 0, n)
        if kind == "BAYES" and k == 0:
            raise toks.error(f"factor {f} of a BAYES network has an empty scope (no child)", line)
        scope = [toks.integer(f"a variable id in the scope of factor {f}", 0, n - 1) for _ in range(k)]
        if first_on_line:
            on_line = toks.line_counts[line]  # the scope is written one per line
            if on_line != k + 1:
                raise toks.error(f"factor {f} declares {k} scope variables but its line lists {on_line - 1}", line)
        if len(set(scope)) != k:
            raise toks.error(f"scope {scope} of factor {f} repeats a variable", line)
        tables.scopes.append(scope)

    for f, scope in enumerate(tables.scopes):
        line = toks.line()
        size = toks.integer(f"the table size of factor {f}", 0)
        expected = table_size(cards, scope)
        if size != expected:
            raise toks.error(
                f"table size {size} of factor {f} does not match its scope {scope} "
                f"(product of cardinalities = {expected})",
                line,
            )
        tables.values.append(toks.table(size, "table entries", line=line))
        tables.lines.append(line)
    if not toks.at_end():
        raise toks.error(f"unexpected token {toks.peek()!r} after the last factor table")

    names = [f"x{i}" for i in range(n)]
    evidence: dict[int | str, int] = {}
    if evid is not None:
        if isinstance(evid, Mapping):
            evidence = dict(evid)
        else:
            evid_source = Path(evid).name
            evidence = dict(read_evid(evid))
            for v, value in evidence.items():
                if not 0 <= int(v) < n:
                    raise ValueError(f"{evid_source}: evidence variable {v} is out of range 0..{n - 1} for {source}")
                if not 0 <= value < cards[int(v)]:
                    raise ValueError(
                        f"{evid_source}: evidence value {value} for variable {v} is out of range "
                        f"0..{cards[int(v)] - 1} (its cardinality in {source})"
                    )
    fg = build_graph(names, cards, tables, source, conditional=kind == "BAYES")
    if evidence:
        try:
            fg.set_evidence(evidence)
        except ValueError as err:
            raise ValueError(f"evidence for {source}: {err}") from None
    return fg


def read_evid(path: PathLike) -> dict[int, int]:
    """Read a UAI evidence file.

    Accepts ``0`` (no evidence), the UAI 2014 single line ``k v1 e1 .. vk ek`` and the
    UAI 2010 form with a leading number of samples (``1``, then that line).

    Args:
        path: the ``.evid`` file.

    Returns:
        ``{variable id: observed value}``.

    Raises:
        ValueError: malformed file, several samples, or a variable observed twice.

    Example:
        >>> from neuralblock.io import read_evid, uai_grid
        >>> read_evid(uai_grid("Grids_11", "evid"))
        {}
    """
    text, source = read_text(path)
    toks = Tokens(text, source)
    if toks.at_end():
        return {}
    count = len(toks.tokens)
    first = toks.tokens[0]
    single_line = first.isdigit() and count == 1 + 2 * int(first)
    if not single_line and count > 1 and toks.line_counts[toks.lines[0]] == 1:
        # UAI 2010: the number of samples alone on the first line, then one sample
        line = toks.line()
        samples = toks.integer("the number of evidence samples", 0)
        if samples != 1:
            raise toks.error(f"expected one evidence sample, got {samples}", line)
    k = toks.integer("the number of observed variables", 0)
    evidence: dict[int, int] = {}
    for i in range(k):
        line = toks.line()
        var = toks.integer(f"the id of observed variable {i}", 0)
        value = toks.integer(f"the value of observed variable {var}", 0)
        if var in evidence and evidence[var] != value:
            raise toks.error(f"variable {var} is observed twice ({evidence[var]} and {value})", line)
        evidence[var] = value
    if not toks.at_end():
        raise toks.error(f"unexpected token {toks.peek()!r} after {k} observations")
    return evidence


def read_mar(path: PathLike) -> Tensor:
    """Read a UAI ``.MAR`` file of single-variable marginals.

    Both layouts are read: the UAI 2014 one (``MAR``, then the number of variables and
    each variable's cardinality and entries) and the UAI 2010 one, where a count of
    evidence samples precedes them (a count of 1 is read; several samples are refused,
    since each is a different query). If the file holds several ``-BEGIN-`` blocks
    (anytime solvers), the last one is read.

    Args:
        path: the ``.MAR`` file.

    Returns:
        ``Tensor [n, k]`` with ``k`` the largest cardinality; rows of smaller variables
        are padded with zeros.

    Raises:
        ValueError: malformed file, negative entries, a row not summing to 1 (within
            1e-3), or a UAI 2010 file with several evidence samples.

    Example:
        >>> from neuralblock.io import read_mar, uai_grid
        >>> mar = read_mar(uai_grid("Grids_11", "MAR"))
        >>> mar.shape, round(float(mar[0].sum()), 4)
        (torch.Size([100, 2]), 1.0)
    """
    text, source = read_text(path)
    toks = Tokens(text, source)
    line = toks.line()
    header = toks.next("the 'MAR' header")
    if header.upper() != "MAR":
        raise toks.error(f"expected the 'MAR' header, got {header!r}", line)
    if "-BEGIN-" in toks.tokens:
        toks.pos = len(toks.tokens) - toks.tokens[::-1].index("-BEGIN-")
    start = toks.pos
    try:
        rows = _read_marginals(toks)
    except ValueError as uai2014_error:  # maybe the UAI 2010 layout: a count of evidence samples first
        toks.pos = start
        rows = _read_uai2010_marginals(toks, uai2014_error)
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out.to(torch.get_default_dtype())


def _read_uai2010_marginals(toks: Tokens, uai2014_error: ValueError) -> list[list[float]]:
    """The UAI 2010 layout (a count of evidence samples, then the marginals); ``uai2014_error`` if it does not fit."""
    line = toks.line()
    try:
        samples = toks.integer("the number of evidence samples", 1)
        rows = _read_marginals(toks, last=samples == 1)
    except ValueError:
        raise uai2014_error from None
    if samples != 1:
        raise toks.error(f"the file holds {samples} evidence samples; read_mar reads files with one", line)
    return rows


def _read_marginals(toks: Tokens, last: bool = True) -> list[list[float]]:
    """The number of variables, then each one's cardinality and marginal (``last``: up to the end or ``-BEGIN-``)."""
    n = toks.integer("the number of variables", 0)
    rows: list[list[float]] = []
    for i in range(n):
        line = toks.line()
        card = toks.integer(f"the cardinality of variable {i}", 1)
        row = toks.table(card, f"marginal entries of variable {i}", line=line)
        if abs(math.fsum(row) - 1.0) > MAR_TOLERANCE:
            raise toks.error(f"marginal of variable {i} sums to {math.fsum(row):.6g}, expected 1", line)
        rows.append(row)
    if last and not toks.at_end() and toks.peek() != "-BEGIN-":
        raise toks.error(f"unexpected token {toks.peek()!r} after {n} marginals")
    return rows


def read_pr(path: PathLike) -> float:
    """Read a UAI ``.PR`` file: log10 of the partition function.

    Args:
        path: the ``.PR`` file.

    Returns:
        ``log10 Z``.

    Raises:
        ValueError: malformed file.

    Example:
        >>> from neuralblock.io import read_pr, uai_grid
        >>> read_pr(uai_grid("Grids_15", "PR"))
        291.733
    """
    text, source = read_text(path)
    toks = Tokens(text, source)
    line = toks.line()
    header = toks.next("the 'PR' header")
    if header.upper() != "PR":
        raise toks.error(f"expected the 'PR' header, got {header!r}", line)
    if "-BEGIN-" in toks.tokens:
        toks.pos = len(toks.tokens) - toks.tokens[::-1].index("-BEGIN-")
    value = toks.number("log10 Z")
    if not toks.at_end() and toks.peek() != "-BEGIN-":
        raise toks.error(f"unexpected token {toks.peek()!r} after log10 Z")
    return value


def write_mar(path: PathLike, marginals: Tensor, cardinalities: Sequence[int] | Tensor | None = None) -> None:
    """Write single-variable marginals in the UAI ``.MAR`` format.

    Values get 7 significant digits (10 for float64 input), enough to resolve the dtype.

    Args:
        path: the output file.
        marginals: ``[n, k]`` probabilities (rows may be zero-padded beyond a variable's cardinality).
        cardinalities: per-variable cardinality (default: ``k`` for every variable).

    Raises:
        ValueError: ``marginals`` is not ``[n, k]``, has negative or non-finite entries,
            or ``cardinalities`` do not fit.

    Example:
        >>> import tempfile, torch
        >>> from neuralblock.io import read_mar, write_mar
        >>> path = tempfile.mkdtemp() + "/m.MAR"
        >>> write_mar(path, torch.tensor([[0.25, 0.75], [1.0, 0.0]]), cardinalities=[2, 1])
        >>> read_mar(path)
        tensor([[0.2500, 0.7500],
                [1.0000, 0.0000]])
    """
    marginals = torch.as_tensor(marginals).detach().cpu()
    digits = 10 if marginals.dtype == torch.float64 else 7  # what the dtype resolves
    marginals = marginals.double()
    if marginals.dim() != 2:
        raise ValueError(f"marginals must be a [n, k] tensor, got shape {tuple(marginals.shape)}")
    n, k = marginals.shape
    if not torch.isfinite(marginals).all() or (marginals < 0).any():
        raise ValueError("marginals must be finite and non-negative")
    cards = [k] * n if cardinalities is None else [int(c) for c in torch.as_tensor(cardinalities).reshape(-1)]
    if len(cards) != n or any(not 1 <= c <= k for c in cards):
        raise ValueError(f"cardinalities must be {n} integers in 1..{k}, got {cards}")
    parts = [str(n)]
    for row, card in zip(marginals.tolist(), cards):
        parts.append(str(card))
        parts.extend(f"{p:.{digits}g}" for p in row[:card])
    atomic_write_bytes(Path(path), ("MAR\n" + " ".join(parts) + "\n").encode())


def _starts_line(toks: Tokens) -> bool:
    """Whether the next token is the first one on its line."""
    return toks.pos < len(toks.tokens) and (toks.pos == 0 or toks.lines[toks.pos - 1] != toks.lines[toks.pos])
