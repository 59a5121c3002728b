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

from collections.abc import Callable

import torch
from torch import Tensor

from neuralblock.graph import BlockScaffold, FactorGraph, TableGroup
from neuralblock.kernels.base import GraphKernel
from neuralblock.kernels.functional import gibbs_sample

__all__ = ["GibbsKernel", "GibbsPlan"]


class _TableSlices:
    """Conditional log-potentials of one colour class read straight from table factors.

    For each (variable, scaffold factor) pair, the factor's table is sliced along the
    variable's axis at the current values of the other scope variables: one gather of
    the state and one gather of ``k_max`` table entries per pair, then a segment-sum
    into ``[m, k_max]`` conditionals. No candidate states are materialized.
    """

    def __init__(self, fg: FactorGraph, vars_: Tensor, scaffold: BlockScaffold, kmax: int) -> None:
        self.num_vars, self.kmax = len(vars_), kmax
        self.parts: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]] = []
        for group, rows, segment in zip(fg.groups, scaffold.group_index, scaffold.group_segment):
            if rows.numel() == 0:
                continue
            if not isinstance(group, TableGroup):
                raise TypeError(f"table slices need table factors, got a {type(group).__name__}")
            scopes = group.scopes[rows]  # [m, a]
            var = vars_[segment]
            is_var = scopes == var[:, None]
            strides = group._strides.expand_as(scopes)
            var_stride = (strides * is_var).sum(-1)
            masked = torch.where(is_var, torch.zeros_like(strides), strides)
            card = fg.cardinalities[var]
            steps = torch.minimum(torch.arange(kmax)[None, :], card[:, None] - 1) * var_stride[:, None]
            base = rows * group._size
            self.parts.append((group._flat.reshape(-1), scopes, masked, base, steps, segment))

    def __call__(self, state: Tensor) -> Tensor:
        logits = torch.zeros(self.num_vars, self.kmax, dtype=state.dtype)
        for flat, scopes, masked, base, steps, segment in self.parts:
            offsets = base + (state[scopes].long() * masked).sum(-1)
            logits.index_add_(0, segment, flat[offsets[:, None] + steps].to(state.dtype))
        return logits


class GibbsPlan:
    """Precomputed colour classes of single-variable blocks with their scaffolds.

    Variables of one class share no factor, so their full conditionals are computed
    together: for each candidate value ``j`` the whole class is set to ``j`` and one
    scaffold evaluation gives every variable's conditional log-density at ``j``.

    Args:
        fg: the graph.
        variables: the discrete latent variables to update.
    """

    def __init__(self, fg: FactorGraph, variables: list[int]) -> None:
        cards = fg.cardinalities
        self.classes: list[Tensor] = []
        self.scaffolds: list[BlockScaffold] = []
        self.cards: list[Tensor] = []
        self.values: list[Tensor] = []
        self.slices: list[_TableSlices | None] = []
        tables_only = all(isinstance(g, TableGroup) for g in fg.groups)
        blocks = [[v] for v in variables]
        for members in fg.color_blocks(blocks):
            vars_ = torch.tensor([variables[int(i)] for i in members], dtype=torch.long)
            card = cards[vars_]
            kmax = int(card.max())
            grid = torch.arange(kmax)[:, None].expand(kmax, len(vars_))
            scaffold = fg.scaffold(vars_[:, None])
            self.classes.append(vars_)
            self.scaffolds.append(scaffold)
            self.slices.append(_TableSlices(fg, vars_, scaffold, kmax) if tables_only else None)
            self.cards.append(card)
            self.values.append(torch.minimum(grid, card - 1).to(torch.get_default_dtype()))

    def sweep(self, fg: FactorGraph, state: Tensor) -> tuple[Tensor, Tensor]:
        """One chromatic sweep; returns the new state and the number of stuck conditionals."""
        stuck = torch.zeros((), dtype=torch.long)
        state = state.clone()
        for vars_, scaffold, slices, card, values in zip(
            self.classes, self.scaffolds, self.slices, self.cards, self.values
        ):
            kmax = values.shape[0]
            if slices is not None:
                logits = slices(state)
            else:
                candidates = state.expand(kmax, -1).clone()
                candidates[:, vars_] = values.to(state.dtype)
                logits = scaffold.local_log_density(fg, candidates).T  # [m, kmax]
            if kmax > int(card.min()):
                invalid = torch.arange(kmax) >= card[:, None]
                logits = logits.masked_fill(invalid, -float("inf"))
            info = gibbs_sample(logits, state[vars_])
            state[vars_] = info.values
            stuck += info.num_stuck
        return state, stuck


class GibbsKernel(GraphKernel):
    """Single-site Gibbs over the discrete latent variables, chromatic and vectorized.

    Variables are coloured so that no two variables of a colour share a factor; a
    sweep visits the colours in turn and redraws a whole colour from its exact full
    conditionals with one batched scaffold evaluation per candidate value. This is
    an exact (target-invariant) kernel.

    Args:
        model: a :class:`FactorGraph` or a Pyro model with scalar discrete sites.
        variables: the variables (ids or names) to update; default all discrete latent ones.

    Samples: see :mod:`neuralblock.kernels.base` for the site layout.
    """

    def __init__(self, model: FactorGraph | Callable, variables: list[int | str] | None = None) -> None:
        super().__init__(model)
        self._variables_arg = variables
        self.plan: GibbsPlan | None = None
        self._reset_stats()  # diagnostics() answer before setup (e.g. in the parent of worker chains)

    def _prepare(self, fg: FactorGraph) -> None:
        latent = set(fg.latent.tolist())
        if self._variables_arg is None:
            variables = [v for v in sorted(latent) if fg.cardinality(v) > 0]
        else:
            variables = [fg.variable_id(v) for v in self._variables_arg]
            bad = [fg.names[v] for v in variables if fg.cardinality(v) == 0 or v not in latent]
            if bad:
                raise ValueError(f"GibbsKernel updates discrete latent variables only; got {bad[:5]}")
        if not variables:
            raise ValueError("GibbsKernel found no discrete latent variable to update")
        self.variables = variables
        self.plan = GibbsPlan(fg, variables)

    def _refresh(self, fg: FactorGraph) -> None:
        """Nothing to do: the plan reads parameters through the graph (table views included)."""

    def _reset_stats(self) -> None:
        self._sweeps = 0
        self._stuck = 0

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        if self.plan is None:
            raise RuntimeError("call setup() before sampling")
        state, stuck = self.plan.sweep(self._graph(), state)
        if not warmup:
            self._sweeps += 1
            self._stuck += stuck
        return state

    def logging(self) -> dict[str, float]:
        """Cheap progress-bar fields."""
        return {"colors": float(len(self.plan.classes)) if self.plan else 0.0}

    def diagnostics(self) -> dict[str, float]:
        """Post-warmup sweeps, single-site updates per second and stuck conditionals."""
        updates = self._sweeps * len(getattr(self, "variables", []))
        return {
            "sweeps": float(self._sweeps),
            "updates_per_second": updates / self._elapsed if self._elapsed > 0 else 0.0,
            "stuck_conditionals": float(self._stuck),
        }
