"""The factor graph: networkx structure plus vectorized numeric factor groups.

Structure (Markov blankets, scaffolds, colouring, motif matching) lives in a
networkx bipartite graph whose nodes are ``("v", i)`` for variable ``i`` and
``("f", j)`` for factor ``j``. Numbers live in :mod:`neuralblock.graph.groups`.
A state is one flat tensor ``[..., n]`` indexed by variable id (discrete values
are stored as whole numbers in the default float dtype).

Example:
    >>> import torch
    >>> fg = FactorGraph()
    >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
    >>> fg.add_table_factor([a, b], torch.log(torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    0
    >>> float(fg.log_joint(torch.tensor([1.0, 0.0])).exp())
    3.0
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
from torch import Tensor
from torch.distributions import constraints

from neuralblock.graph.groups import CallableGroup, FactorGroup, LinearGaussianGroup, TableGroup
from neuralblock.graph.supports import same_support

__all__ = ["BlockScaffold", "FactorGraph"]


@dataclass
class BlockScaffold:
    """Precomputed block -> scaffold-factor index for many blocks at once.

    ``local_log_density(state)`` returns, for every block, the sum of the log values
    of the factors in its scaffold (the factors touching the block): one subset
    evaluation per factor group and one segment-sum, whatever the number of blocks.

    Attributes:
        blocks: ``LongTensor [nb, b]`` variable ids of each block, ``-1`` padded.
        group_index: per group, the scaffold factors (one entry per (block, factor) pair).
        group_segment: per group, the block each entry belongs to.
    """

    blocks: Tensor
    group_index: list[Tensor]
    group_segment: list[Tensor]
    _distinct: list[tuple[Tensor, Tensor] | None] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_blocks(self) -> int:
        """Number of blocks."""
        return int(self.blocks.shape[0])

    @property
    def variables(self) -> Tensor:
        """All block variables, flattened (padding removed)."""
        return self.blocks[self.blocks >= 0]

    def local_log_density(self, fg: FactorGraph, state: Tensor) -> Tensor:
        """Sum of scaffold log-factors per block, ``[..., nb]``.

        A factor shared by several blocks' scaffolds (e.g. a point of a mixture, in every
        pair's scaffold) is evaluated once.
        """
        out = state.new_zeros(state.shape[:-1] + (self.num_blocks,))
        for group, index, segment, distinct in zip(fg.groups, self.group_index, self.group_segment, self._shared()):
            if index.numel() == 0:
                continue
            if distinct is None:
                values = group.log_factors(state, index)
            else:
                factors, inverse = distinct
                values = group.log_factors(state, factors)[..., inverse]
            out = out.index_add(-1, segment, values.to(out.dtype))
        return out

    def _shared(self) -> list[tuple[Tensor, Tensor] | None]:
        """Per group: ``(distinct factors, entry -> position)`` where blocks share factors, else ``None`` (cached)."""
        if self._distinct is None:
            self._distinct = []
            for index in self.group_index:
                factors, inverse = torch.unique(index, return_inverse=True)
                self._distinct.append((factors, inverse) if factors.numel() < index.numel() else None)
        return self._distinct

    def local_log_density_rows(self, fg: FactorGraph, states: Tensor) -> Tensor:
        """Block ``b``'s scaffold at its own state ``states[b]``: ``[nb]`` from ``states [nb, n]``.

        Blocks that conflict can be scored this way in one pass, each against the state in
        which only it was changed.

        Example:
            >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
            >>> _ = fg.add_table_factor([0, 1], torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
            >>> scaffold = fg.scaffold([[0], [1]])
            >>> scaffold.local_log_density_rows(fg, torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist()
            [2.0, 1.0]
        """
        if states.dim() != 2 or states.shape[0] != self.num_blocks:
            raise ValueError(f"need one state per block, [{self.num_blocks}, n]; got {tuple(states.shape)}")
        out = states.new_zeros(self.num_blocks)
        for group, index, segment in zip(fg.groups, self.group_index, self.group_segment):
            if index.numel() == 0:
                continue
            out = out.index_add(0, segment, group.log_factors_rows(states, index, segment).to(out.dtype))
        return out

    def select(self, start: int, stop: int) -> BlockScaffold:
        """The scaffold of blocks ``start .. stop - 1`` alone (renumbered from 0).

        Example:
            >>> fg = FactorGraph(); _ = fg.add_variables(3, cardinality=2)
            >>> _ = fg.add_table_factors(torch.tensor([[0, 1], [1, 2]]), torch.zeros(2, 2, 2))
            >>> fg.scaffold([[0], [1], [2]]).select(1, 3).group_segment[0].tolist()
            [0, 0, 1]
        """
        if not 0 <= start <= stop <= self.num_blocks:
            raise ValueError(f"block range [{start}, {stop}) is outside [0, {self.num_blocks})")
        keep = [(segment >= start) & (segment < stop) for segment in self.group_segment]
        return BlockScaffold(
            self.blocks[start:stop],
            [index[k] for index, k in zip(self.group_index, keep)],
            [segment[k] - start for segment, k in zip(self.group_segment, keep)],
        )


class FactorGraph:
    """A factor graph over discrete (k-ary) and continuous variables.

    Factors are added one by one or in bulk and stored in vectorized groups of the
    same kind (table, linear-Gaussian, batched callable). ``log_joint`` is one
    gather + evaluate + sum per group.

    Example:
        >>> fg = FactorGraph()
        >>> x = fg.add_variable("x")            # continuous, real support
        >>> y = fg.add_variable("y")
        >>> fg.add_linear_gaussian(y, [x], [1.0], 0.0, 1.0)
        0
        >>> fg.markov_blanket(x)
        [1]
    """

    def __init__(self) -> None:
        self.graph = nx.Graph()
        self.names: list[str] = []
        self._name_to_id: dict[str, int] = {}
        self._cards: list[int] = []
        self._supports: list[constraints.Constraint] = []
        self.evidence: dict[int, float] = {}
        self._pending_tables: dict[tuple[int, ...], tuple[list[Tensor], list[Tensor]]] = {}
        self._pending_gauss: dict[int, list[tuple[int, list[int], list[float], float, float]]] = {}
        self._extra_groups: list[FactorGroup] = []
        self._groups: list[FactorGroup] = []
        self._group_offsets: list[int] = []
        self._factor_scopes: list[list[int]] = []  # by global factor id, in insertion order
        self._factor_location: list[tuple[str, object, int]] = []
        self._compiled = False

    # ------------------------------------------------------------------ variables
    def add_variable(
        self,
        name: str | None = None,
        cardinality: int | None = None,
        support: constraints.Constraint | None = None,
    ) -> int:
        """Add a variable; ``cardinality=None`` makes it continuous.

        Args:
            name: unique name (default ``x<id>``).
            cardinality: number of states ``k >= 1`` for a discrete variable.
            support: support of a continuous variable (default ``constraints.real``).

        Returns:
            The variable id.
        """
        vid = len(self.names)
        name = f"x{vid}" if name is None else str(name)
        if name in self._name_to_id:
            raise ValueError(f"duplicate variable name {name!r}")
        if cardinality is not None:
            if int(cardinality) != cardinality or cardinality < 1:
                raise ValueError(f"cardinality of {name!r} must be a positive integer, got {cardinality!r}")
            if support is not None:
                raise ValueError(f"discrete variable {name!r} takes no support argument")
            card, support = int(cardinality), constraints.integer_interval(0, int(cardinality) - 1)
        else:
            card, support = 0, (constraints.real if support is None else support)
            if not isinstance(support, constraints.Constraint):
                raise TypeError(f"support of {name!r} must be a torch Constraint, got {type(support).__name__}")
        self.names.append(name)
        self._name_to_id[name] = vid
        self._cards.append(card)
        self._supports.append(support)
        self.graph.add_node(("v", vid), bipartite=0, name=name)
        self._compiled = False
        return vid

    def add_variables(self, count: int, cardinality: int | None = None, prefix: str = "x") -> list[int]:
        """Add ``count`` variables named ``<prefix><i>``; returns their ids."""
        start = len(self.names)
        return [self.add_variable(f"{prefix}{start + i}", cardinality) for i in range(count)]

    def variable_id(self, name: str | int) -> int:
        """Id of a variable given its name (ids pass through)."""
        if isinstance(name, int):
            if not 0 <= name < self.num_variables:
                raise ValueError(f"variable id {name} out of range [0, {self.num_variables})")
            return name
        if name not in self._name_to_id:
            raise ValueError(f"unknown variable {name!r}")
        return self._name_to_id[name]

    @property
    def num_variables(self) -> int:
        """Number of variables."""
        return len(self.names)

    @property
    def num_factors(self) -> int:
        """Number of factors."""
        return len(self._factor_scopes)

    @property
    def cardinalities(self) -> Tensor:
        """``LongTensor [n]``: k for discrete variables, 0 for continuous ones."""
        return torch.tensor(self._cards, dtype=torch.long)

    @property
    def is_discrete(self) -> Tensor:
        """``BoolTensor [n]``."""
        return self.cardinalities > 0

    def support(self, var: int) -> constraints.Constraint:
        """Support constraint of a variable."""
        return self._supports[var]

    def cardinality(self, var: int) -> int:
        """Cardinality of one variable (0 for continuous); O(1)."""
        return self._cards[var]

    @property
    def latent(self) -> Tensor:
        """Ids of the variables without evidence."""
        return torch.tensor([v for v in range(self.num_variables) if v not in self.evidence], dtype=torch.long)

    def set_evidence(self, evidence: Mapping[int | str, float]) -> None:
        """Clamp variables to observed values (replaces earlier evidence for those variables)."""
        for key, value in evidence.items():
            vid = self.variable_id(key)
            value = float(value)
            card = self._cards[vid]
            if not math.isfinite(value):
                raise ValueError(f"evidence for {self.names[vid]!r} must be finite, got {value}")
            if card > 0 and (value != int(value) or not 0 <= value < card):
                raise ValueError(f"evidence {value} for {self.names[vid]!r} is not in 0..{card - 1}")
            if card == 0 and not bool(self._supports[vid].check(torch.tensor(value))):
                raise ValueError(f"evidence {value} for {self.names[vid]!r} is outside its support")
            self.evidence[vid] = value

    # ------------------------------------------------------------------ factors
    def _register(self, scope: Sequence[int], kind: str, key: object, row: int) -> int:
        fid = len(self._factor_scopes)
        scope = [int(v) for v in scope]
        for v in scope:
            if not 0 <= v < self.num_variables:
                raise ValueError(f"factor scope refers to unknown variable id {v}")
        if len(set(scope)) != len(scope):
            raise ValueError(f"factor scope {scope} repeats a variable")
        self._factor_scopes.append(scope)
        self._factor_location.append((kind, key, row))
        self.graph.add_node(("f", fid), bipartite=1, kind=kind)
        self.graph.add_edges_from((("v", v), ("f", fid)) for v in scope)
        self._compiled = False
        return fid

    def _register_many(self, scopes: list[list[int]], kind: str, key: object, first_row: int) -> list[int]:
        start = len(self._factor_scopes)
        for scope in scopes:
            if len(set(scope)) != len(scope):
                raise ValueError(f"factor scope {scope} repeats a variable")
        ids = list(range(start, start + len(scopes)))
        self._factor_scopes.extend(scopes)
        self._factor_location.extend((kind, key, first_row + i) for i in range(len(scopes)))
        self.graph.add_nodes_from((("f", f) for f in ids), bipartite=1, kind=kind)
        self.graph.add_edges_from((("v", v), ("f", f)) for f, scope in zip(ids, scopes) for v in scope)
        self._compiled = False
        return ids

    def add_table_factor(self, scope: Sequence[int], log_table: Tensor) -> int:
        """Add a discrete factor with a log-potential table over ``scope`` (axis order).

        Returns:
            The factor id.
        """
        return self.add_table_factors(torch.tensor([list(scope)], dtype=torch.long), log_table.unsqueeze(0))[0]

    def add_table_factors(self, scopes: Tensor, log_tables: Tensor) -> list[int]:
        """Add ``F`` table factors at once: ``scopes [F, a]``, ``log_tables [F, k_1..k_a]``."""
        scopes = torch.as_tensor(scopes, dtype=torch.long)
        log_tables = torch.as_tensor(log_tables, dtype=torch.get_default_dtype())
        if scopes.dim() != 2 or log_tables.dim() != scopes.shape[1] + 1 or log_tables.shape[0] != scopes.shape[0]:
            raise ValueError(
                f"log_tables {tuple(log_tables.shape)} do not match scopes {tuple(scopes.shape)} "
                "(expected [F, a] and [F, k_1..k_a])"
            )
        if torch.isnan(log_tables).any() or (log_tables == math.inf).any():
            raise ValueError("log_tables contain NaN or +inf")
        if scopes.numel() and (scopes.min() < 0 or scopes.max() >= self.num_variables):
            raise ValueError(f"factor scopes refer to unknown variable ids (graph has {self.num_variables})")
        shape = tuple(int(k) for k in log_tables.shape[1:])
        cards = self.cardinalities[scopes]
        mismatch = (cards != torch.tensor(shape, dtype=torch.long)).nonzero()
        if len(mismatch):
            f, axis = (int(i) for i in mismatch[0])
            v = int(scopes[f, axis])
            raise ValueError(
                f"table axis {axis} has size {shape[axis]} but variable {self.names[v]!r} "
                f"has cardinality {self._cards[v]}"
            )
        bucket = self._pending_tables.setdefault(shape, ([], []))
        ids = self._register_many(scopes.tolist(), "table", shape, len(bucket[0]))
        bucket[0].extend(scopes.unbind(0))
        bucket[1].extend(log_tables.unbind(0))
        return ids

    def add_linear_gaussian(
        self, child: int, parents: Sequence[int], weights: Sequence[float], bias: float, scale: float
    ) -> int:
        """Add a linear-Gaussian CPD ``child ~ N(bias + sum(w * parents), scale)``."""
        parents = [int(p) for p in parents]
        weights = [float(w) for w in weights]
        if len(parents) != len(weights):
            raise ValueError(f"{len(parents)} parents but {len(weights)} weights")
        if not 0 <= child < self.num_variables or self._cards[child] != 0:
            raise ValueError(f"linear-Gaussian child {child} must be a continuous variable")
        if not scale > 0 or not math.isfinite(scale):
            raise ValueError(f"linear-Gaussian scale must be finite and positive, got {scale}")
        if not all(math.isfinite(float(x)) for x in (*weights, bias)):
            raise ValueError(f"linear-Gaussian weights and bias must be finite, got {list(weights)} and {bias}")
        bucket = self._pending_gauss.setdefault(len(parents), [])
        fid = self._register([child, *parents], "gauss", len(parents), len(bucket))
        bucket.append((child, parents, weights, float(bias), float(scale)))
        return fid

    def add_callable_factors(
        self,
        scopes: Tensor,
        fn: Callable[[Tensor, Tensor | None], Tensor],
        params: Tensor | None = None,
    ) -> list[int]:
        """Add a group of factors evaluated by one batched function (see :class:`CallableGroup`)."""
        return self.add_group(CallableGroup(scopes, fn, params))

    def add_group(self, group: FactorGroup) -> list[int]:
        """Add a prebuilt factor group (any :class:`FactorGroup`) as is."""
        if not isinstance(group, FactorGroup):
            raise TypeError(f"expected a FactorGroup, got {type(group).__name__}")
        key = len(self._extra_groups)
        scopes = [[v for v in row if v >= 0] for row in group.scopes.tolist()]
        flat = [v for scope in scopes for v in scope]
        if flat and not 0 <= min(flat) <= max(flat) < self.num_variables:
            bad = next(v for v in flat if not 0 <= v < self.num_variables)
            raise ValueError(f"factor scope refers to unknown variable id {bad}")
        ids = self._register_many(scopes, "group", key, 0)
        self._extra_groups.append(group)
        return ids

    # ------------------------------------------------------------------ compile
    def _compile(self) -> None:
        if self._compiled:
            return
        groups: list[FactorGroup] = []
        location: dict[tuple[str, object], int] = {}
        for shape, (scopes, tables) in self._pending_tables.items():
            location[("table", shape)] = len(groups)
            groups.append(TableGroup(torch.stack(scopes), torch.stack(tables)))
        for arity, rows in self._pending_gauss.items():
            location[("gauss", arity)] = len(groups)
            child = torch.tensor([r[0] for r in rows], dtype=torch.long)
            parents = torch.tensor([r[1] for r in rows], dtype=torch.long).reshape(len(rows), arity)
            weights = torch.tensor([r[2] for r in rows]).reshape(len(rows), arity)
            groups.append(
                LinearGaussianGroup(
                    child, parents, weights, torch.tensor([r[3] for r in rows]), torch.tensor([r[4] for r in rows])
                )
            )
        for key, group in enumerate(self._extra_groups):
            location[("group", key)] = len(groups)
            groups.append(group)
        # global factor id -> (group, row); group-local ids in global order
        self._factor_group = torch.tensor(
            [location[(kind, key)] for kind, key, _ in self._factor_location], dtype=torch.long
        )
        self._factor_row = torch.tensor([row for _, _, row in self._factor_location], dtype=torch.long)
        self._groups = groups
        self._compiled = True

    @property
    def groups(self) -> list[FactorGroup]:
        """The vectorized factor groups."""
        self._compile()
        return self._groups

    def factor_location(self, factors: Tensor) -> tuple[Tensor, Tensor]:
        """Group index and row of global factor ids."""
        self._compile()
        return self._factor_group[factors], self._factor_row[factors]

    def factor_scope(self, factor: int) -> list[int]:
        """Variables of a factor."""
        return list(self._factor_scopes[factor])

    # ------------------------------------------------------------------ evaluation
    def check_state(self, state: Tensor) -> Tensor:
        """Validate a state batch ``[..., n]`` and return it in the default float dtype."""
        if not isinstance(state, Tensor):
            raise TypeError(f"state must be a torch.Tensor, got {type(state).__name__}")
        if state.dim() == 0 or state.shape[-1] != self.num_variables:
            raise ValueError(f"state must have shape [..., {self.num_variables}], got {tuple(state.shape)}")
        if not state.is_floating_point():
            state = state.to(torch.get_default_dtype())
        finite = torch.isfinite(state)
        if not finite.all():
            where = (~finite).nonzero()[0]
            v = int(where[-1])
            value = float(state[tuple(where.tolist())])
            raise ValueError(f"state contains NaN or inf ({value}) for variable {self.names[v]!r}")
        return state

    def check_assignment(self, state: Tensor) -> Tensor:
        """Validate the start ``[n]`` of a chain (or ``[K, n]``, one per chain); return it as :meth:`check_state` does.

        Beyond :meth:`check_state`: discrete values are whole numbers in ``0..k-1``,
        continuous values lie in their supports, observed variables hold their evidence.
        It runs once per run (at ``setup``), not per transition; the chains are checked together.

        Raises:
            ValueError: naming the first offending variable (and, for ``[K, n]``, its chain).

        Example:
            >>> fg = FactorGraph()
            >>> a = fg.add_variable("a", 2)
            >>> fg.check_assignment(torch.tensor([1.0])).tolist()
            [1.0]
            >>> fg.check_assignment(torch.tensor([0.5]))
            Traceback (most recent call last):
            ...
            ValueError: initial value 0.5 of discrete variable 'a' is not in 0..1
            >>> fg.check_assignment(torch.tensor([[1.0], [2.0]]))
            Traceback (most recent call last):
            ...
            ValueError: initial value 2 of discrete variable 'a' is not in 0..1 (chain 1)
        """
        state = self.check_state(state)
        if state.dim() not in (1, 2):
            raise ValueError(f"expected a state [{self.num_variables}] or one per chain [K, {self.num_variables}], "
                             f"got shape {tuple(state.shape)}")  # fmt: skip
        rows = state.reshape(-1, self.num_variables)

        def chain(row: int) -> str:
            return f" (chain {row})" if state.dim() == 2 else ""

        try:
            discrete = self._check_domains(rows, "initial value")
        except ValueError as err:
            bad = ~self._domain_ok(rows)
            raise ValueError(f"{err}{chain(int(bad.any(1).nonzero()[0]))}") from None
        for v in (~discrete).nonzero().flatten().tolist():
            inside = self._supports[v].check(rows[:, v])
            if not bool(inside.all()):
                row = int((~inside).nonzero()[0])
                raise ValueError(
                    f"initial value {float(rows[row, v]):g} of {self.names[v]!r} is outside its support{chain(row)}"
                )
        if self.evidence:  # up to float32 rounding (a state cast to float64), then exactly the evidence
            ids = torch.tensor(list(self.evidence), dtype=torch.long)
            observed = torch.tensor(list(self.evidence.values()), dtype=torch.float64)
            wrong = (rows[:, ids].double() - observed).abs() > 1e-6 * (1.0 + observed.abs())
            if wrong.any():
                row, column = (int(i) for i in wrong.nonzero()[0])
                v = int(ids[column])
                raise ValueError(
                    f"initial value {float(rows[row, v]):g} of observed variable {self.names[v]!r} differs from its "
                    f"evidence {self.evidence[v]:g}{chain(row)}"
                )
            rows = rows.clone()
            rows[:, ids] = observed.to(rows.dtype)
        return rows.reshape(state.shape)

    def _domain_ok(self, state: Tensor) -> Tensor:
        """Per entry of ``state [..., n]``: not a discrete variable, or a whole number in its domain."""
        cards = self.cardinalities.to(state.dtype)
        return (cards <= 0) | ((state == state.round()) & (state >= 0) & (state < cards))

    def _check_domains(self, state: Tensor, what: str) -> Tensor:
        """Raise unless every discrete value of ``state [..., n]`` is a whole number in its domain.

        Returns the discrete-variable mask ``[n]``. Table lookups are flat gathers: a value
        out of its domain would read another entry (or another factor's table) silently.
        """
        discrete = self.cardinalities > 0
        bad = ~self._domain_ok(state)
        if bad.any():
            where = bad.nonzero()[0]
            v = int(where[-1])
            name, top = self.names[v], self._cards[v] - 1
            value = float(state[tuple(where.tolist())])
            raise ValueError(f"{what} {value:g} of discrete variable {name!r} is not in 0..{top}")
        return discrete

    def log_factors(self, state: Tensor) -> list[Tensor]:
        """Log value of every factor, per group: a list of ``[..., F_g]`` tensors."""
        state = self.check_state(state)
        self._check_domains(state, "value")
        return [g.log_factors(state) for g in self.groups]

    def log_joint(self, state: Tensor, check: bool = True) -> Tensor:
        """Unnormalized log density of a batch of states ``[..., n]`` -> ``[...]``.

        ``check=False`` skips the validation, for states a kernel made itself (floats of the
        graph's shape with every discrete value in its domain): on small graphs it is a large
        part of the call.

        Raises:
            ValueError: the shape is wrong, a value is not finite, or a discrete value lies outside
                its domain (``check=True``).
        """
        if check:
            state = self.check_state(state)
            self._check_domains(state, "value")
        total = state.new_zeros(state.shape[:-1])
        for group in self.groups:
            total = total + group.log_factors(state).sum(-1)
        return total

    # ------------------------------------------------------------------ structure
    def neighbors(self, var: int) -> list[int]:
        """Factor ids touching a variable."""
        return sorted(f for _, f in self.graph.neighbors(("v", var)))

    def markov_blanket(self, var: int | Iterable[int]) -> list[int]:
        """Variables sharing a factor with ``var`` (or with any variable of a block), excluding it."""
        block = {var} if isinstance(var, int) else {int(v) for v in var}
        blanket: set[int] = set()
        for v in block:
            for f in self.neighbors(v):
                blanket.update(self._factor_scopes[f])
        return sorted(blanket - block)

    def scaffold_factors(self, block: Iterable[int]) -> list[int]:
        """The scaffold of a block: the factors whose value changes when the block changes."""
        return sorted({f for v in block for f in self.neighbors(int(v))})

    def variable_graph(self) -> nx.Graph:
        """The Markov network: variables joined when they share a factor."""
        mrf = nx.Graph()
        mrf.add_nodes_from(range(self.num_variables))
        for scope in self._factor_scopes:
            mrf.add_edges_from((a, b) for i, a in enumerate(scope) for b in scope[i + 1 :])
        return mrf

    def scaffold(self, blocks: Sequence[Sequence[int]] | Tensor) -> BlockScaffold:
        """Precompute the block -> scaffold-factor index of many blocks.

        Args:
            blocks: list of variable-id lists, or ``LongTensor [nb, b]`` padded with ``-1``.
        """
        padded = _pad_blocks(blocks)
        self._compile()
        pair_block, pair_factor = [], []
        for b, row in enumerate(padded.tolist()):
            for f in self.scaffold_factors(v for v in row if v >= 0):
                pair_block.append(b)
                pair_factor.append(f)
        pair_block_t = torch.tensor(pair_block, dtype=torch.long)
        pair_factor_t = torch.tensor(pair_factor, dtype=torch.long)
        group_of = self._factor_group[pair_factor_t] if pair_factor else pair_factor_t
        index, segment = [], []
        for g in range(len(self._groups)):
            mask = group_of == g
            index.append(self._factor_row[pair_factor_t[mask]] if pair_factor else pair_factor_t)
            segment.append(pair_block_t[mask])
        return BlockScaffold(padded, index, segment)

    def conflict_graph(
        self,
        blocks: Sequence[Sequence[int]] | Tensor,
        reads: Sequence[Sequence[int]] | Tensor | None = None,
    ) -> nx.Graph:
        """Blocks joined when they cannot be updated in parallel.

        Two blocks conflict when they intersect or one intersects the other's Markov blanket
        (they share a scaffold factor or a variable), or, when ``reads`` is given, the
        extra variables the other's proposal conditions on. Non-conflicting blocks read
        only variables the others do not write, so updating them together is exact.

        Args:
            blocks: variable-id lists (or ``[nb, b]`` padded with ``-1``).
            reads: optional extra variables each block's update reads (``-1`` padding allowed).
        """
        padded = _pad_blocks(blocks)
        rows = [[v for v in row if v >= 0] for row in padded.tolist()]
        owner: dict[int, list[int]] = {}
        for b, row in enumerate(rows):
            for f in self.scaffold_factors(row):
                owner.setdefault(f, []).append(b)
        writers: dict[int, list[int]] = {}
        for b, row in enumerate(rows):
            for v in row:
                writers.setdefault(v, []).append(b)
        conflict = nx.Graph()
        conflict.add_nodes_from(range(len(rows)))
        # blocks sharing a scaffold factor, or writing the same variable (one with no factor has no scaffold);
        # each distinct member list once (a mixture's points are shared by all pairs: hundreds of equal lists)
        for members in dict.fromkeys(tuple(m) for m in [*owner.values(), *writers.values()]):  # first-seen order
            conflict.add_edges_from((a, c) for i, a in enumerate(members) for c in members[i + 1 :])
        if reads is not None:
            read_rows = [[v for v in row if v >= 0] for row in _pad_blocks(reads).tolist()]
            if len(read_rows) != len(rows):
                raise ValueError(f"reads has {len(read_rows)} rows for {len(rows)} blocks")
            for b, row in enumerate(read_rows):
                conflict.add_edges_from((b, w) for v in row for w in writers.get(v, []) if w != b)
        return conflict

    def color_blocks(
        self,
        blocks: Sequence[Sequence[int]] | Tensor,
        reads: Sequence[Sequence[int]] | Tensor | None = None,
    ) -> list[Tensor]:
        """Partition blocks into colour classes of mutually non-conflicting blocks (greedy colouring).

        Returns:
            A list of ``LongTensor`` of block indices, one per colour.
        """
        conflict = self.conflict_graph(blocks, reads)
        if conflict.number_of_nodes() == 0:
            return []
        # Colour each connected component on its own (blocks of different components never
        # conflict, so colour c of every component joins class c). networkx's DSATUR is quadratic
        # in the number of blocks: use it on small components, and on large ones keep the best of
        # three linear-time greedy orders (BFS order colours any bipartite graph with 2 colours).
        coloring: dict[int, int] = {}
        for component in nx.connected_components(conflict):
            if len(component) == 1:
                coloring[next(iter(component))] = 0
                continue
            sub = conflict.subgraph(component)
            edges = sub.number_of_edges() - nx.number_of_selfloops(sub)  # a block listing a variable twice: a loop
            if 2 * edges == len(component) * (len(component) - 1):  # all conflict: one block a class, in block order
                coloring.update({block: c for c, block in enumerate(sorted(component))})
                continue
            strategies = ["DSATUR"] if len(component) <= 400 else []
            strategies += ["connected_sequential_bfs", "smallest_last", "largest_first"]
            options: list[dict[int, int]] = [nx.coloring.greedy_color(sub, strategy=s) for s in strategies]
            best = min(options, key=lambda c: max(c.values()))
            coloring.update(best)
        classes: dict[int, list[int]] = {}
        for block, color in sorted(coloring.items()):
            classes.setdefault(color, []).append(block)
        return [torch.tensor(classes[c], dtype=torch.long) for c in sorted(classes)]

    # ------------------------------------------------------------------ parameters
    def update_parameters(self, other: FactorGraph) -> None:
        """Take ``other``'s factor parameters and evidence values, in place.

        ``other`` must have the same structure: variables (names, domains), evidence
        variables and factor groups (types, scopes and every integer index). Floating
        tensors of each group are copied into this graph's tensors (so views that
        kernels hold stay valid); other attributes that differ are replaced. This is how
        a kernel follows new values of the parameters its graph depends on (a compound
        sampler's global update) without re-finding blocks or colourings.

        Args:
            other: a graph built the same way with new parameter values.

        Raises:
            ValueError: the structures differ (the message names the first difference).

        Example:
            >>> fg, new = FactorGraph(), FactorGraph()
            >>> for g, w in ((fg, 1.0), (new, 3.0)):
            ...     a, b = g.add_variable("a", 2), g.add_variable("b", 2)
            ...     _ = g.add_table_factor([a, b], torch.tensor([[w, 0.0], [0.0, w]]))
            >>> fg.update_parameters(new)
            >>> float(fg.log_joint(torch.tensor([1.0, 1.0])))
            3.0
        """
        if not isinstance(other, FactorGraph):
            raise TypeError(f"expected a FactorGraph, got {type(other).__name__}")
        if other.names != self.names or other._cards != self._cards:
            raise ValueError("update_parameters: the graphs' variables (names or domains) differ")
        for v, (mine, theirs) in enumerate(zip(self._supports, other._supports)):
            if not same_support(mine, theirs):
                raise ValueError(f"update_parameters: the support of {self.names[v]!r} changed from {mine} to {theirs}")
        if set(other.evidence) != set(self.evidence):
            raise ValueError("update_parameters: the graphs observe different variables")
        if other._factor_scopes != self._factor_scopes:
            raise ValueError("update_parameters: the graphs' factor scopes differ")
        own_groups, new_groups = self.groups, other.groups
        if [type(g) for g in own_groups] != [type(g) for g in new_groups]:
            raise ValueError("update_parameters: the graphs' factor groups differ in kind")
        for index, (group, new) in enumerate(zip(own_groups, new_groups)):
            _update_group(index, group, new)
        self.evidence.update(other.evidence)

    def tempered(self, beta: float) -> FactorGraph:
        """A copy whose table factors' log tables are multiplied by ``beta``: the model ``p(x)^beta``.

        A tempered copy is the target of one replica of replica exchange, e.g. to enumerate
        or encode a hot replica's model on its own (the kernel itself tempers its tables in
        place of copying the graph).

        Raises:
            ValueError: ``beta`` is not a positive finite number, or the graph has factors other than tables.

        Example:
            >>> fg = FactorGraph()
            >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
            >>> _ = fg.add_table_factor([a, b], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
            >>> float(fg.tempered(0.25).log_joint(torch.tensor([1.0, 1.0])))
            0.5
        """
        try:
            beta = float(beta)  # Python and numpy numbers, 0-dim tensors
        except (TypeError, ValueError):
            raise TypeError(f"beta must be a number, got {type(beta).__name__}") from None
        if not (math.isfinite(beta) and beta > 0):
            raise ValueError(f"beta must be a positive finite number, got {beta!r}")
        return self._map_tables(lambda tables: tables * beta, "tempered")

    def split_zeros(self) -> tuple[FactorGraph, FactorGraph]:
        """Copies ``(F, Z)`` whose log joints are the finite part and the zero count of this graph's.

        ``F`` holds the finite log table entries (0 where a table has a zero, log ``-inf``), ``Z``
        holds 1 for each zero entry and 0 elsewhere, so ``log p(x) = F(x)`` where ``Z(x) = 0`` and
        ``-inf`` elsewhere. Replica exchange gives its hot replicas the models
        ``beta (F + log_zero Z)`` (:class:`~neuralblock.kernels.gibbs.SoftZeros`): a power of ``p``
        keeps every zero.

        Raises:
            ValueError: the graph has factors other than tables.

        Example:
            >>> fg = FactorGraph()
            >>> a = fg.add_variable("a", 2)
            >>> _ = fg.add_table_factor([a], torch.tensor([0.5, -math.inf]))
            >>> finite, zeros = fg.split_zeros()
            >>> states = torch.tensor([[0.0], [1.0]])
            >>> finite.log_joint(states).tolist(), zeros.log_joint(states).tolist()
            ([0.5, 0.0], [0.0, 1.0])
        """
        finite = self._map_tables(lambda tables: tables.masked_fill(tables == -math.inf, 0.0), "split")
        zeros = self._map_tables(lambda tables: (tables == -math.inf).to(tables.dtype), "split")
        return finite, zeros

    def _map_tables(self, transform: Callable[[Tensor], Tensor], what: str) -> FactorGraph:
        """A copy whose table factors' log tables are ``transform(log_tables)`` (graphs of table factors only)."""
        table_groups = [g for g in self.groups if isinstance(g, TableGroup)]
        if len(table_groups) != len(self.groups):
            raise ValueError(f"{what} copies are made of graphs of table factors only")
        # each group becomes a plain table group of its current tables (update_parameters writes into them),
        # transformed: the deep copy takes these instead of copying the groups (and a compiled model's state they hold)
        memo: dict[int, Any] = {id(g): TableGroup(g.scopes, transform(g.log_tables)) for g in table_groups}
        copied = copy.deepcopy(self, memo)
        for _, tables in copied._pending_tables.values():  # kept in step, though nothing reads them once compiled
            tables[:] = [transform(table) for table in tables]
        return copied

    # ------------------------------------------------------------------ states
    def initial_state(self, generator: torch.Generator | None = None) -> Tensor:
        """A random state ``[n]``: uniform discrete values, continuous values near 0 mapped to their support."""
        cards = self.cardinalities
        u = torch.rand(self.num_variables, generator=generator)
        state = torch.where(cards > 0, (u * cards).floor().clamp(max=(cards - 1).clamp(min=0)), torch.zeros(()))
        state = state.to(torch.get_default_dtype())
        for v in (cards == 0).nonzero().flatten().tolist():  # (the continuous ones, in id order)
            y = (torch.rand((), generator=generator) * 4 - 2).to(state.dtype)
            state[v] = torch.distributions.transform_to(self._supports[v])(y)
        for v, value in self.evidence.items():
            state[v] = value
        return state

    def __repr__(self) -> str:
        n_disc = int(self.is_discrete.sum())
        return (
            f"FactorGraph({self.num_variables} variables ({n_disc} discrete), "
            f"{self.num_factors} factors, {len(self.evidence)} observed)"
        )


def _update_group(index: int, group: FactorGroup, new: FactorGroup) -> None:
    """Copy ``new``'s floating tensors into ``group`` in place; integer tensors must match."""
    own = vars(group)
    for name, value in vars(new).items():
        old = own.get(name)
        if isinstance(value, Tensor) and isinstance(old, Tensor):
            if value.shape != old.shape:
                raise ValueError(
                    f"update_parameters: group {index} {name!r} has shape {tuple(value.shape)}, not {tuple(old.shape)}"
                )
            if value.is_floating_point() and old.is_floating_point():
                if old.data_ptr() != value.data_ptr():
                    old.copy_(value)
            elif not torch.equal(value, old):
                raise ValueError(f"update_parameters: group {index} differs in its index tensor {name!r}")
        elif isinstance(value, Tensor) or isinstance(old, Tensor):
            raise ValueError(f"update_parameters: group {index} attribute {name!r} changed type")
        elif old is not value:
            setattr(group, name, value)


def _pad_blocks(blocks: Sequence[Sequence[int]] | Tensor) -> Tensor:
    if isinstance(blocks, Tensor):
        if blocks.dim() != 2:
            raise ValueError(f"blocks tensor must be [nb, b], got {tuple(blocks.shape)}")
        return blocks.long()
    rows = [list(map(int, b)) for b in blocks]
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)
