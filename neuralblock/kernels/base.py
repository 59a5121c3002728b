"""The thin stateful shell shared by our factor-graph kernels.

A :class:`GraphKernel` turns a FactorGraph (or a Pyro model, through the bridge)
into a :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel`:

* a kernel built from a **FactorGraph** carries one sample site ``"x"`` holding the
  whole state vector, so ``mcmc.get_samples()["x"][s, i]`` is the value of variable
  ``i`` (``fg.names[i]``) in draw ``s`` (observed variables stay at their evidence);
* a kernel built from a **Pyro model** carries one scalar sample site per latent site
  of the model, under the model's own site names.

Values are returned as floats (discrete values are whole numbers). Kernels work in
the constrained space, so ``transforms`` is empty.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from neuralblock.graph import FactorGraph
from neuralblock.kernels.conditioning import ConditionedModel, values_changed

__all__ = ["GraphKernel", "sequential_init"]

STATE_SITE = "x"


class GraphKernel(MCMCKernel):
    """Base class: state bookkeeping, warmup counting and the params <-> state map.

    Args:
        model: a :class:`FactorGraph`, or a Pyro model callable (converted with
            :func:`neuralblock.pyro.from_pyro_model` at ``setup`` with the run's args).
    """

    def __init__(self, model: FactorGraph | Callable) -> None:
        if not isinstance(model, FactorGraph) and not callable(model):
            raise TypeError(f"model must be a FactorGraph or a Pyro model callable, got {type(model).__name__}")
        self._source = model
        self.fg: FactorGraph | None = model if isinstance(model, FactorGraph) else None
        self._pending_init: dict[str, Tensor] | None = None
        self._state: Tensor | None = None
        self._warmup_steps = 0
        self._t = 0
        self._elapsed = 0.0
        self._conditioned: ConditionedModel | None = None
        self._sites_may_change = False  # set by reset_conditioning
        self._evidence: tuple[Tensor, Tensor] | None = None  # (ids, values), set at setup
        self.transforms: dict = {}

    # -- the Pyro-facing surface ------------------------------------------------------
    @property
    def model(self) -> Callable:
        """The Pyro model this kernel samples (the bridge's model for a FactorGraph)."""
        if not isinstance(self._source, FactorGraph):
            return self._source
        from neuralblock.pyro import to_pyro_model

        return to_pyro_model(self._source)

    @property
    def from_pyro(self) -> bool:
        """Whether samples are keyed by Pyro site names (else by the single ``"x"`` site)."""
        return not isinstance(self._source, FactorGraph)

    def condition_on(self, values: dict[str, Tensor]) -> None:
        """Hold other latent sites of the Pyro model fixed at ``values`` (a compound sampler's hook).

        Call it before ``setup`` with the sites this kernel must not sample (they become
        observed in its graph), and again before any ``sample`` with their new values; the
        graph re-runs the model with the current values, so nothing is rebuilt (tables of
        discrete sites are re-tabulated in place when the values changed).

        Raises:
            TypeError: the kernel was built on a FactorGraph (it has no Pyro sites to fix).
            ValueError: the set of fixed sites differs from the one the graph was built with.

        Example:
            >>> import pyro, pyro.distributions as dist, torch
            >>> from neuralblock import GibbsKernel
            >>> def model():
            ...     p = pyro.sample("p", dist.Beta(1.0, 1.0))
            ...     pyro.sample("z", dist.Bernoulli(p))
            >>> kernel = GibbsKernel(model)
            >>> kernel.condition_on({"p": torch.tensor(1.0)})
            >>> kernel.setup(0)
            >>> kernel.sample(kernel.initial_params)["z"].item()
            1.0
        """
        if not self.from_pyro:
            raise TypeError(f"{type(self).__name__} on a FactorGraph has no Pyro sites to condition on")
        may_change, self._sites_may_change = self._sites_may_change, False
        if self._conditioned is None:
            if self.fg is not None:
                raise ValueError("call condition_on before setup the first time: the graph is built at setup")
            self._conditioned = ConditionedModel(self._source, values)
        elif may_change and set(values) != set(self._conditioned.values):  # a new run's model: rebuild at setup
            self._conditioned = ConditionedModel(self._source, values)
            self.fg = None
        else:
            changed = values_changed(self._conditioned.values, values)
            self._conditioned.set_values(values)
            if changed and self.fg is not None:
                self._follow_conditioning(self.fg)

    def reset_conditioning(self) -> None:
        """Let the next :meth:`condition_on` fix another set of sites (the graph is then rebuilt at ``setup``).

        A compound sampler calls it before conditioning again for a new run, whose data may
        give the model other latent sites; the same sites keep the graph built for them.
        """
        self._sites_may_change = True

    def _follow_conditioning(self, fg: FactorGraph) -> None:
        """After the conditioned values changed: new evidence values, re-tabulated tables."""
        names = set(fg.names)
        evidence = {k: float(v) for k, v in self._conditioned.values.items() if k in names}
        if evidence:  # a conditioned discrete site the bridge made an evidence variable
            fg.set_evidence(evidence)
            self._follow_evidence(fg)
        tables = [group for group in fg.groups if callable(getattr(group, "refresh", None))]
        for group in tables:
            group.refresh()
        if tables or evidence:
            self._refresh(fg)

    def _follow_evidence(self, fg: FactorGraph) -> None:
        """Cache the evidence (ids and values) every later state is given, and give it to the current state."""
        self._evidence = None
        if fg.evidence:
            ids = torch.tensor(list(fg.evidence), dtype=torch.long)
            self._evidence = (ids, torch.tensor(list(fg.evidence.values()), dtype=torch.float64))
            if self._state is not None:
                self._state[ids] = self._evidence[1].to(self._state.dtype)

    def update_graph(self, fg: FactorGraph) -> None:
        """Follow new parameter values: take ``fg``'s parameters into the kernel's graph, in place.

        ``fg`` must have the kernel graph's structure (see
        :meth:`FactorGraph.update_parameters`); blocks, colourings and adapted step sizes
        are kept and only what depends on parameter values is refreshed. Call it between
        transitions, e.g. after a global parameter the graph was built from has moved.

        Raises:
            ValueError: the structures differ.

        Example:
            >>> import torch
            >>> from neuralblock import FactorGraph, GibbsKernel
            >>> def graph(w):
            ...     fg = FactorGraph(); a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
            ...     _ = fg.add_table_factor([a, b], torch.tensor([[w, 0.0], [0.0, w]]))
            ...     return fg
            >>> kernel = GibbsKernel(graph(0.0)); kernel.setup(0)
            >>> kernel.update_graph(graph(50.0))
            >>> x = kernel.sample(kernel.initial_params)["x"]
            >>> bool(x[0] == x[1])
            True
        """
        own = self._graph()
        own.update_parameters(fg)
        self._follow_evidence(own)
        self._refresh(own)

    def _refresh(self, fg: FactorGraph) -> None:
        """Recompute what depends on the graph's parameter values (default: all of ``_prepare``).

        Kernels whose precomputation depends only on structure override this to keep
        their colourings and adapted step sizes.
        """
        self._prepare(fg)

    def _graph(self) -> FactorGraph:
        """The kernel's graph (built at ``setup`` for Pyro models)."""
        if self.fg is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() first (the graph is built there)")
        return self.fg

    def _graph_model(self) -> Callable:
        return self._source if self._conditioned is None else self._conditioned

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Build the graph (for Pyro models), the blocks and the initial state."""
        if self.fg is None or (self.from_pyro and (args or kwargs)):
            from neuralblock.pyro import from_pyro_model

            self.fg = from_pyro_model(self._graph_model(), *args, **kwargs)
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        self._elapsed = 0.0
        self._reset_stats()
        self._prepare(self.fg)
        self._state, self._evidence = None, None  # a user's start is checked against the evidence, not overwritten
        if self._pending_init is not None:
            state = self.fg.check_assignment(self._params_to_state(self._pending_init))
            self._pending_init = None
        elif self.from_pyro:
            state = self._prior_state(*args, **kwargs)
        else:
            state = sequential_init(self.fg)
        self._state = state
        self._follow_evidence(self.fg)

    def _prior_state(self, *args, **kwargs) -> Tensor:
        """Ancestral draw of a Pyro model's latent sites from its prior."""
        import pyro.poutine as poutine

        fg = self._graph()
        trace = poutine.trace(self._graph_model()).get_trace(*args, **kwargs)
        state = fg.initial_state()
        for v in fg.latent.tolist():
            state[v] = float(trace.nodes[fg.names[v]]["value"])
        return state

    @property
    def initial_params(self) -> dict[str, Tensor]:
        """Initial values (the state drawn at ``setup``, or those set by the user)."""
        if self._state is None:
            raise RuntimeError("call setup() before reading initial_params")
        return self._state_to_params(self._state)

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        self._pending_init = {k: torch.as_tensor(v) for k, v in params.items()}

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One transition (a full sweep of this kernel's variables)."""
        state = self._params_to_state(params)
        start = time.perf_counter()
        state = self._transition(state, warmup=self._t < self._warmup_steps)
        if self._t >= self._warmup_steps:
            self._elapsed += time.perf_counter() - start
        self._t += 1
        if self._t == self._warmup_steps:
            self.end_warmup()
        self._state = state
        return self._state_to_params(state)

    # -- params <-> state -------------------------------------------------------------
    def _params_to_state(self, params: dict[str, Tensor]) -> Tensor:
        fg = self._graph()
        if not self.from_pyro:
            if STATE_SITE not in params:
                raise ValueError(f"expected a {STATE_SITE!r} site in params, got {sorted(params)}")
            state = fg.check_state(params[STATE_SITE].reshape(-1)).clone()
            if self._evidence is not None:  # observed variables hold the graph's current evidence
                state[self._evidence[0]] = self._evidence[1].to(state.dtype)
            return state
        state = self._state.clone() if self._state is not None else fg.initial_state()
        latent = fg.latent.tolist()
        missing = [fg.names[v] for v in latent if fg.names[v] not in params]
        if missing:
            raise ValueError(f"params lack latent sites {missing[:5]}")
        values = torch.stack([torch.as_tensor(params[fg.names[v]]).reshape(()).to(state.dtype) for v in latent])
        state[latent] = values
        return fg.check_state(state)

    def _state_to_params(self, state: Tensor) -> dict[str, Tensor]:
        fg = self._graph()
        if not self.from_pyro:
            return {STATE_SITE: state}
        latent = fg.latent.tolist()
        return {fg.names[v]: state[v] for v in latent}

    # -- what subclasses provide ------------------------------------------------------
    def _reset_stats(self) -> None:  # noqa: B027 - optional hook
        """Reset running statistics at setup."""

    @abstractmethod
    def _prepare(self, fg: FactorGraph) -> None:
        """Precompute blocks, colours and scaffolds for ``fg``."""

    @abstractmethod
    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        """Return the next state."""


def sequential_init(fg: FactorGraph, generator: torch.Generator | None = None) -> Tensor:
    """A starting state of positive density where one is easy to find.

    Visits the discrete latent variables in id order and samples each from the product
    of the factors whose scope is already fully assigned (ancestral sampling for a
    Bayesian network listed in topological order, a greedy start for an MRF).
    Continuous variables start from :meth:`FactorGraph.initial_state`. This runs once,
    at setup, so the loop over variables is off the hot path.

    Example:
        >>> fg = FactorGraph()
        >>> a = fg.add_variable("a", 2)
        >>> _ = fg.add_table_factor([a], torch.tensor([0.0, -float("inf")]))
        >>> sequential_init(fg).tolist()
        [0.0]
    """
    state = fg.initial_state(generator)
    cards = fg.cardinalities.tolist()
    assigned = [v in fg.evidence or cards[v] == 0 for v in range(fg.num_variables)]
    for v in fg.latent.tolist():
        if cards[v] == 0:
            continue
        ready = [f for f in fg.neighbors(v) if all(assigned[u] or u == v for u in fg.factor_scope(f))]
        if ready:
            candidates = state.expand(cards[v], -1).clone()
            candidates[:, v] = torch.arange(cards[v], dtype=state.dtype)
            groups, rows = fg.factor_location(torch.tensor(ready))
            logits = torch.zeros(cards[v])
            for g in groups.unique().tolist():
                logits = logits + fg.groups[g].log_factors(candidates, rows[groups == g]).sum(-1)
            if torch.isfinite(logits).any():
                probs = torch.softmax(logits, -1)
                state[v] = float(torch.multinomial(probs, 1, generator=generator))
        assigned[v] = True
    return state
