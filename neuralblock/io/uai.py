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

What the readers accept, and what they refuse:

* Files are read in 64 KiB chunks and parsed as they stream in (see ``_tokens``), so a bad
  file fails at its first bad token. Only regular files up to 128 MiB (also after gzip
  decompression; ``NEURALBLOCK_MAX_READ_BYTES`` changes it) are read.
* Integers (counts, cardinalities, ids, sizes, evidence) are plain ASCII digits: ``+2``,
  ``2_0``, full-width or other Unicode digits and numbers of more than 18 digits are refused.
  Real numbers are ASCII decimals with an optional sign and exponent (``+0.5`` and ``1e-3``
  are fine, as C's ``strtod`` reads them); ``nan``, ``inf`` and overflowing numbers are refused.
* Sizes that cannot fit are refused at the line that declares them: more than 2**22
  variables or factors, a cardinality above 2**16, more than 2**25 table entries in all, or
  ``n`` variables whose ``[n, largest cardinality]`` table of states exceeds 2**25 entries.
* A ``.uai`` table whose entries are all zero is refused: it gives every assignment
  probability 0, so the model has total probability 0. (Zeros spread over several tables can
  still leave no assignment with positive probability; the sampling kernels detect that.)
* Any token after the last table (or the last evidence pair, marginal or ``log10 Z``) is refused.
  A file cut inside its last number cannot be told from a file whose last number is shorter:
  it is read as written (a BAYES CPT that no longer sums to 1 is refused).
* Keywords (``MARKOV``, ``BAYES``, ``MAR``, ``PR``) are matched case-insensitively.

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
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from neuralblock._files import atomic_write_bytes
from neuralblock.graph import FactorGraph
from neuralblock.io._tables import (
    MAX_CARDINALITY,
    MAX_FACTORS,
    MAX_STATES,
    MAX_TABLE_ENTRIES,
    MAX_VARIABLES,
    ParsedTables,
    build_graph,
    check_states,
    table_size,
)
from neuralblock.io._tokens import PathLike, Tokens, _show

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
    with Tokens.open(path) as toks:
        source = toks.source
        kind, cards, tables = _read_network(toks)
    n = len(cards)
    names = [f"x{i}" for i in range(n)]
    evidence: dict[int | str, int] = {}
    if evid is not None:
        if isinstance(evid, Mapping):
            evidence = dict(evid)
        else:
            evid_source = Path(evid).name
            evidence = {v: value for v, value in read_evid(evid).items()}  # keys widen to int | str
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


def _read_network(toks: Tokens) -> tuple[str, list[int], ParsedTables]:
    """The network type, the cardinalities and the factors of a ``.uai`` file, every bound checked."""
    line = toks.line()
    kind = toks.next("the network type (MARKOV or BAYES)").upper()
    if kind not in ("MARKOV", "BAYES"):
        raise toks.error(f"unknown network type {_show(kind)}, expected MARKOV or BAYES", line)
    n = toks.integer("the number of variables", 0, MAX_VARIABLES)
    line = toks.line()
    cards = [toks.integer(f"the cardinality of variable {i}", 1, MAX_CARDINALITY) for i in range(n)]
    check_states(cards, toks.source, line)
    m = toks.integer("the number of factors", 0, MAX_FACTORS)

    tables = ParsedTables()
    for f in range(m):
        line, first_on_line = toks.line(), toks.starts_line()
        k = toks.integer(f"the scope size of factor {f}", 0, n)
        if kind == "BAYES" and k == 0:
            raise toks.error(f"factor {f} of a BAYES network has an empty scope (no child)", line)
        if first_on_line:  # the scope is written one per line
            listed = toks.count_on_line(k + 1) if toks.line() == line else 0
            if listed != k:
                lists = f"more than {k}" if listed > k else str(listed)
                raise toks.error(f"factor {f} declares {k} scope variables but its line lists {lists}", line)
        scope = [toks.integer(f"a variable id in the scope of factor {f}", 0, n - 1) for _ in range(k)]
        if len(set(scope)) != k:
            raise toks.error(f"scope {scope} of factor {f} repeats a variable", line)
        tables.scopes.append(scope)

    total = 0
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
        total += size
        if total > MAX_TABLE_ENTRIES:
            raise toks.error(
                f"the tables up to factor {f} hold {total} entries, more than the limit of {MAX_TABLE_ENTRIES}", line
            )
        values = toks.table(size, "table entries", line=line)
        if not any(values):
            raise toks.error(
                f"the table of factor {f} is all zeros: every assignment has probability 0, so the model has none",
                line,
            )
        tables.values.append(values)
        tables.lines.append(line)
    if not toks.at_end():
        raise toks.error(f"unexpected token {_show(toks.peek() or '')} after the last factor table")
    return kind, cards, tables


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
    with Tokens.open(path) as toks:
        if toks.at_end():
            return {}
        alone = toks.count_on_line(2) == 1  # a first line with one number may be the UAI 2010 sample count
        start = toks.mark()
        try:
            evidence = _read_observations(toks)
        except ValueError:
            if not alone or toks.pos == start + 1 and toks.at_end():
                raise
            toks.reset(start)  # UAI 2010: the number of samples alone on the first line, then one sample
            line = toks.line()
            samples = toks.integer("the number of evidence samples", 0)
            if samples != 1:
                raise toks.error(f"expected one evidence sample, got {samples}", line) from None
            evidence = _read_observations(toks)
        return evidence


def _read_observations(toks: Tokens) -> dict[int, int]:
    """``k v1 e1 .. vk ek`` up to the end of the file."""
    k = toks.integer("the number of observed variables", 0, MAX_VARIABLES)
    evidence: dict[int, int] = {}
    for i in range(k):
        line = toks.line()
        var = toks.integer(f"the id of observed variable {i}", 0, MAX_VARIABLES - 1)
        value = toks.integer(f"the value of observed variable {var}", 0, MAX_CARDINALITY - 1)
        if var in evidence and evidence[var] != value:
            raise toks.error(f"variable {var} is observed twice ({evidence[var]} and {value})", line)
        evidence[var] = value
    if not toks.at_end():
        raise toks.error(f"unexpected token {_show(toks.peek() or '')} after {k} observations")
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
    with Tokens.open(path) as toks:
        line = toks.line()
        header = toks.next("the 'MAR' header")
        if header.upper() != "MAR":
            raise toks.error(f"expected the 'MAR' header, got {_show(header)}", line)
        if toks.peek() != "-BEGIN-":
            rows = _read_marginal_block(toks)
        while toks.peek() == "-BEGIN-":  # anytime solvers: several solutions, the last one counts
            toks.next("-BEGIN-")
            rows = _read_marginal_block(toks)
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out.to(torch.get_default_dtype())


def _read_marginal_block(toks: Tokens) -> list[array]:
    """One solution, in the UAI 2014 layout or else the UAI 2010 one (up to the end or the next ``-BEGIN-``)."""
    start = toks.mark()
    try:
        rows = _read_marginals(toks)
    except ValueError as uai2014_error:  # maybe the UAI 2010 layout: a count of evidence samples first
        toks.reset(start)
        rows = _read_uai2010_marginals(toks, uai2014_error)
    toks.release()
    return rows


def _read_uai2010_marginals(toks: Tokens, uai2014_error: ValueError) -> list[array]:
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


def _read_marginals(toks: Tokens, last: bool = True) -> list[array]:
    """The number of variables, then each one's cardinality and marginal (``last``: up to the end or ``-BEGIN-``)."""
    line = toks.line()
    n = toks.integer("the number of variables", 0, MAX_VARIABLES)
    rows: list[array] = []
    total, widest = 0, 0
    for i in range(n):
        line = toks.line()
        card = toks.integer(f"the cardinality of variable {i}", 1, MAX_CARDINALITY)
        total, widest = total + card, max(widest, card)
        if n * widest > MAX_STATES:
            raise toks.error(
                f"{n} marginals with cardinalities up to {widest} need a {n} x {widest} table, more than "
                f"the limit of {MAX_STATES} entries",
                line,
            )
        row = toks.table(card, f"marginal entries of variable {i}", line=line)
        if abs(math.fsum(row) - 1.0) > MAR_TOLERANCE:
            raise toks.error(f"marginal of variable {i} sums to {math.fsum(row):.6g}, expected 1", line)
        rows.append(row)
    if last and not toks.at_end() and toks.peek() != "-BEGIN-":
        raise toks.error(f"unexpected token {_show(toks.peek() or '')} after {n} marginals")
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
    with Tokens.open(path) as toks:
        line = toks.line()
        header = toks.next("the 'PR' header")
        if header.upper() != "PR":
            raise toks.error(f"expected the 'PR' header, got {_show(header)}", line)
        if toks.peek() == "-BEGIN-":  # anytime solvers: several values, the last one counts
            toks.next("-BEGIN-")
        while True:
            value = toks.number("log10 Z")
            if toks.at_end():
                return value
            if toks.peek() != "-BEGIN-":
                raise toks.error(f"unexpected token {_show(toks.peek() or '')} after log10 Z")
            toks.next("-BEGIN-")


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
