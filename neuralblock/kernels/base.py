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

**Vectorized chains.** Kernels that support it (``GibbsKernel``, ``NeuralBlockKernel``, ``RandomWalkMH``, ...) take
``chains=K``: K independent chains share one state tensor ``[K, n]`` and every update is
batched over them. Each sample site then carries a leading chain dimension
(``get_samples()["x"]`` is ``[S, K, n]``); with ``chains=1`` (the default) sites keep their
own shape. Pyro's ``num_chains`` (processes) multiplies with ``chains``.
"""

from __future__ import annotations

import numbers
import time
import warnings
from abc import abstractmethod
from collections.abc import Callable
from typing import cast

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor
from torch.distributions import Transform, transform_to

from neuralblock.graph import FactorGraph
from neuralblock.kernels.conditioning import ConditionedModel, values_changed
from neuralblock.kernels.vocabulary import per_second
from neuralblock.pyro.compile import PyroGraph, params_to_state, prior_states, state_to_params

__all__ = [
    "GraphKernel",
    "check_probability",
    "discrete_latent_variables",
    "find_valid_start",
    "sequential_init",
    "warn_frozen",
]

STATE_SITE = "x"


class GraphKernel(MCMCKernel):
    """Base class: state bookkeeping, warmup counting and the params <-> state map.

    Args:
        model: a :class:`FactorGraph`, or a Pyro model callable (converted with
            :func:`neuralblock.pyro.from_pyro_model` at ``setup`` with the run's args).
    """

    batched_state: bool = False
    """Whether ``_transition`` receives and returns ``[K, n]`` states (kernels that support ``chains=K``)."""

    def __init__(
        self, model: FactorGraph | Callable, chains: int = 1, device: str | torch.device | None = None
    ) -> None:
        if not isinstance(model, FactorGraph) and not callable(model):
            raise TypeError(f"model must be a FactorGraph or a Pyro model callable, got {type(model).__name__}")
        if isinstance(chains, bool) or not isinstance(chains, int) or chains < 1:
            raise ValueError(f"chains must be a positive int, got {chains!r}")
        if chains > 1 and not self.batched_state:
            raise ValueError(f"{type(self).__name__} runs one chain per process (chains=1); got chains={chains}")
        self.chains = chains
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if self.device.type != "cpu" and not self.batched_state:
            raise ValueError(f"{type(self).__name__} runs on the CPU only; got device={self.device}")
        self._source = model
        self.fg: FactorGraph | None = model if isinstance(model, FactorGraph) else None
        self._pending_init: dict[str, Tensor] | None = None
        self._state: Tensor | None = None
        self._returned: dict[str, Tensor] | None = None  # the params this kernel last returned (checked when made)
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
        if isinstance(self._source, FactorGraph):  # not self.from_pyro
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
                self._follow_conditioning(self.fg, self._conditioned.values)

    def reset_conditioning(self) -> None:
        """Let the next :meth:`condition_on` fix another set of sites (the graph is then rebuilt at ``setup``).

        A compound sampler calls it before conditioning again for a new run, whose data may
        give the model other latent sites; the same sites keep the graph built for them.
        """
        self._sites_may_change = True

    def _follow_conditioning(self, fg: FactorGraph, values: dict[str, Tensor]) -> None:
        """After the conditioned values changed to ``values``: new evidence values, re-tabulated tables."""
        names = set(fg.names)
        evidence: dict[int | str, float] = {k: float(v) for k, v in values.items() if k in names}
        if evidence:  # a conditioned discrete site the bridge made an evidence variable
            fg.set_evidence(evidence)
            self._follow_evidence(fg)
        tables = [refresh for group in fg.groups if callable(refresh := getattr(group, "refresh", None))]
        for refresh in tables:
            refresh()
        if tables or evidence:
            self._refresh(fg)

    def _follow_evidence(self, fg: FactorGraph) -> None:
        """Cache the evidence (ids and values) every later state is given, and give it to the current state."""
        self._evidence = None
        if fg.evidence:
            ids = torch.tensor(list(fg.evidence), dtype=torch.long)
            self._evidence = (ids, torch.tensor(list(fg.evidence.values()), dtype=torch.float64))
            if self._state is not None:
                self._state[..., ids] = self._evidence[1].to(self._state)

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
        # Only called for Pyro models (from_pyro): the source is then the model callable, not a FactorGraph.
        return cast(Callable, self._source) if self._conditioned is None else self._conditioned

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Build the graph (for Pyro models), the blocks and a valid initial state of every chain.

        Raises:
            TypeError: model arguments given to a kernel built on a :class:`FactorGraph` (it has no model to
                pass them to: its evidence is in the graph).
        """
        if not self.from_pyro and (args or kwargs):
            raise TypeError(
                f"{type(self).__name__} was built on a FactorGraph, which takes no model arguments; got "
                f"{len(args)} positional and {sorted(kwargs)} keyword ones (build the kernel on a Pyro model to "
                "pass data to it, or put the evidence in the graph)"
            )
        if self.fg is None or (self.from_pyro and (args or kwargs)):
            from neuralblock.pyro import from_pyro_model

            self.fg = from_pyro_model(self._graph_model(), *args, **kwargs)
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        self._elapsed = 0.0
        self._reset_stats()
        self._prepare(self.fg)
        # a user's start is checked against the evidence, not overwritten
        self._state, self._evidence, self._returned = None, None, None
        if self._pending_init is not None:
            state = self._checked_start(self._params_to_state(self._pending_init))
            self._pending_init = None
            if self._conditioned is None:  # inside a compound sampler the joint start is the compound's to judge:
                _raise_if_impossible(self.fg, state.cpu(), "the initial_params")  # other blocks may still move
        else:
            if self.from_pyro:
                state = self._prior_state(*args, **kwargs)
            else:
                state = sequential_init(self.fg, chains=self.chains if self.batched_state else None)
            state = self._valid_start(state.to(self.device))
        self._state = state
        self._follow_evidence(self.fg)
        self._started(self.fg, state)

    def _started(self, fg: FactorGraph, state: Tensor) -> None:
        """Called at the end of :meth:`setup` with every chain's start (default: nothing); one-off work goes here."""

    def _checked_start(self, state: Tensor) -> Tensor:
        """A user's start (``[n]`` or ``[K, n]``), checked by :meth:`FactorGraph.check_assignment`."""
        return self._graph().check_assignment(state.cpu()).to(self.device)

    def _valid_start(self, state: Tensor) -> Tensor:
        """Repair chains that start at zero or NaN density; raise if no start of positive density is found.

        A Pyro model's chains are first redrawn from its prior (up to 10 times, as the start came
        from there); chains still impossible then go to :func:`find_valid_start` (uniform draws in
        the unconstrained space of the continuous variables of impossible factors, Gibbs sweeps
        of the discrete ones).
        """
        fg = self._graph()
        state = state.cpu()
        prior = getattr(self, "_prior_args", None)
        if self.from_pyro and prior is not None:
            for _ in range(_PRIOR_ROUNDS):
                bad = ~torch.isfinite(fg.log_joint(state))
                if not bad.any():
                    break
                fresh = self._prior_state(*prior[0], **prior[1]).cpu().to(state.dtype)
                state = torch.where(bad[..., None], fresh, state)
        return find_valid_start(fg, state).to(self.device)

    def _prior_state(self, *args, **kwargs) -> Tensor:
        """Ancestral draws of a Pyro model's latent sites from its prior: ``[n]``, or ``[K, n]`` for batched chains."""
        import pyro
        import pyro.poutine as poutine

        fg = self._graph()
        self._prior_args = (args, kwargs)  # _valid_start redraws impossible chains from the prior
        if isinstance(fg, PyroGraph):  # compiled Pyro graph: plated sites map through their layouts
            return prior_states(fg, self._graph_model(), args, kwargs, self.chains if self.batched_state else None)
        draws = []
        for _ in range(self.chains if self.batched_state else 1):
            with pyro.validation_enabled(False):  # a draw in a NaN region is repaired by _valid_start
                trace = poutine.trace(self._graph_model()).get_trace(*args, **kwargs)
            state = fg.initial_state()
            for v in fg.latent.tolist():
                value = trace.nodes[fg.names[v]]["value"]
                assert value is not None  # a traced sample site holds its value
                state[v] = float(value)
            draws.append(state)
        return torch.stack(draws) if self.batched_state else draws[0]

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
        """One transition (a full sweep of this kernel's variables, in every chain)."""
        state = self._params_to_state(params)
        start = time.perf_counter()
        state = self._transition(state, warmup=self._t < self._warmup_steps)
        if self._t >= self._warmup_steps:
            if state.device.type == "cuda":
                torch.cuda.synchronize(state.device)
            self._elapsed += time.perf_counter() - start
        self._t += 1
        if self._t == self._warmup_steps:
            self.end_warmup()
        self._state = state
        params = self._state_to_params(state)
        self._returned = dict(params)
        return params

    # -- params <-> state -------------------------------------------------------------
    def _params_to_state(self, params: dict[str, Tensor]) -> Tensor:
        """The kernel's state (``[n]``, or ``[K, n]`` for batched chains) from Pyro's params."""
        returned = self._returned
        if self._state is not None and returned is not None and all(params.get(k) is v for k, v in returned.items()):
            state = self._state.clone()  # Pyro hands back what sample() returned (other sites aside): no new check
            if self.from_pyro:
                return state
        elif self.from_pyro:
            return self._pyro_params_to_state(params)
        elif STATE_SITE not in params:
            raise ValueError(f"expected a {STATE_SITE!r} site in params, got {sorted(params)}")
        else:
            state = self._checked_params_state(torch.as_tensor(params[STATE_SITE]))
        if self._evidence is not None:  # observed variables hold the graph's current evidence
            state[..., self._evidence[0]] = self._evidence[1].to(state)
        return state

    def _checked_params_state(self, x: Tensor) -> Tensor:
        """The state of a user's (or another sampler's) state site: shape, dtype and finiteness checked."""
        fg = self._graph()
        if self.batched_state:
            given = tuple(x.shape)
            if x.dim() == 1 and self.chains == 1:
                x = x.unsqueeze(0)
            if x.shape != (self.chains, fg.num_variables):
                raise ValueError(
                    f"site {STATE_SITE!r} must have shape [{self.chains}, {fg.num_variables}] (chains, variables)"
                    + (f" or [{fg.num_variables}]" if self.chains == 1 else "")
                    + f", got {given}"
                )
        else:
            x = x.reshape(-1)
        return fg.check_state(x).to(self.device).clone()

    def _state_to_params(self, state: Tensor) -> dict[str, Tensor]:
        """Pyro's params from the kernel's state (the chain dimension is dropped when ``chains=1``)."""
        if self.from_pyro:
            return self._pyro_state_to_params(state)
        if self.batched_state and self.chains == 1:
            state = state[0]
        return {STATE_SITE: state}

    def _pyro_params_to_state(self, params: dict[str, Tensor]) -> Tensor:
        """The state from one value per latent Pyro site (``[K]`` per site for batched chains).

        Raises:
            ValueError: a site is missing, has the wrong shape, or holds NaN or inf (the message names the sites).
        """
        fg = self._graph()
        batch = (self.chains,) if self.batched_state else ()
        if self._state is not None:
            state = self._state.clone()
        else:  # a user's start (at setup): a misspelt site would be ignored silently
            state = fg.initial_state().to(self.device).expand(batch + (fg.num_variables,)).clone()
            known = set(getattr(fg, "sites", None) or fg.names)
            unknown = sorted(set(params) - known)
            if unknown:
                raise ValueError(
                    f"initial_params name {unknown[:5]}, which are not latent sites of the model "
                    f"(its latent sites: {sorted(known)[:10]})"
                )
        try:
            if isinstance(fg, PyroGraph):  # one value [*batch, *site shape] per site (plated sites whole)
                return fg.check_state(params_to_state(fg, params, state))
            latent = fg.latent.tolist()
            missing = [fg.names[v] for v in latent if fg.names[v] not in params]
            if missing:
                raise ValueError(f"params lack latent sites {missing[:5]}")
            values = [torch.as_tensor(params[fg.names[v]]).to(state) for v in latent]
            count = max(1, self.chains * self.batched_state)
            bad = [fg.names[v] for v, x in zip(latent, values) if x.numel() != count]
            if bad:
                raise ValueError(f"latent sites {bad[:5]} must hold one value per chain ({self.chains})")
            state[..., latent] = torch.stack([x.reshape(batch) for x in values], -1)
            return fg.check_state(state)
        except ValueError as err:  # name the sites holding NaN or inf (checked only on failure: off the hot path)
            bad = [
                name
                for name, value in params.items()
                if not torch.isfinite(torch.as_tensor(value, dtype=torch.float64)).all()
            ]
            if bad:
                raise ValueError(
                    f"sites {sorted(bad)[:5]} hold NaN or inf values; give every latent site a finite value "
                    "in its support"
                ) from err
            raise

    def _pyro_state_to_params(self, state: Tensor) -> dict[str, Tensor]:
        """One value per latent Pyro site (``[K]`` for batched chains, a scalar with ``chains=1``)."""
        fg = self._graph()
        if self.batched_state and self.chains == 1:
            state = state[0]
        if isinstance(fg, PyroGraph):  # each site under its own name with its own shape
            return state_to_params(fg, state)
        return {fg.names[v]: state[..., v] for v in fg.latent.tolist()}

    # -- what subclasses provide ------------------------------------------------------
    def _transitions_per_second(self) -> float:
        """Post-warmup transitions (calls of ``sample``) per second of their time (``transitions_per_second``)."""
        return per_second(max(self._t - self._warmup_steps, 0), self._elapsed)

    def _reset_stats(self) -> None:  # noqa: B027 - optional hook
        """Reset running statistics at setup."""

    @abstractmethod
    def _prepare(self, fg: FactorGraph) -> None:
        """Precompute blocks, colours and scaffolds for ``fg``."""

    @abstractmethod
    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        """Return the next state."""


def check_probability(name: str, value: object) -> float:
    """``value`` as a float in ``[0, 1]``, or a clear error naming ``name``.

    Example:
        >>> check_probability("gibbs_prob", 0.5)
        0.5

    Raises:
        TypeError: not a real number (a string, a bool, a tensor of several values).
        ValueError: NaN or outside ``[0, 1]``.
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(value).__name__} {value!r}")
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise TypeError(f"{name} must be a number in [0, 1], got a tensor of shape {tuple(value.shape)}")
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return number


def warn_frozen(fg: FactorGraph, updated: list[int], kernel: str, standalone: bool, other: str) -> None:
    """Warn when a kernel run on its own leaves latent variables it does not update at their start.

    ``standalone``: the kernel chose its variables itself and no compound sampler conditions it (inside a
    ``CompoundKernel`` the other sites are another block's). ``other``: what to use for them.
    """
    if not standalone:
        return
    frozen = sorted(set(fg.latent.tolist()) - set(updated))
    if frozen:
        names = [fg.names[v] for v in frozen]
        warnings.warn(
            f"{kernel} leaves {len(frozen)} latent variable(s) at their start ({names[:5]}"
            f"{', ...' if len(names) > 5 else ''}): their draws will be constant. Sample them too (a CompoundKernel "
            f"with {other}), or pass variables= to say that holding them is intended",
            RuntimeWarning,
            stacklevel=4,
        )


def discrete_latent_variables(
    fg: FactorGraph, requested: list[int | str] | None, kernel: str, min_values: int = 1
) -> list[int]:
    """The discrete latent variables a kernel updates: ``requested`` (ids or names, checked) or all of them.

    Variables with fewer than ``min_values`` values are left out (a one-value variable never moves).

    Raises:
        ValueError: a requested variable is continuous or not latent (the message names ``kernel``).

    Example:
        >>> fg = FactorGraph(); a, b = fg.add_variable("a", 2), fg.add_variable("b", 1)
        >>> discrete_latent_variables(fg, None, "Gibbs"), discrete_latent_variables(fg, ["a", "b"], "Gibbs", 2)
        ([0, 1], [0])
    """
    latent = set(fg.latent.tolist())
    if requested is None:
        variables = [v for v in sorted(latent) if fg.cardinality(v) > 0]
    else:
        variables = [fg.variable_id(v) for v in requested]
        bad = [fg.names[v] for v in variables if fg.cardinality(v) == 0 or v not in latent]
        if bad:
            raise ValueError(f"{kernel} updates discrete latent variables only; got {bad[:5]}")
    return [v for v in variables if fg.cardinality(v) >= min_values]


def sequential_init(fg: FactorGraph, generator: torch.Generator | None = None, chains: int | None = None) -> Tensor:
    """A starting state of positive density where one is easy to find.

    Visits the discrete latent variables in id order and samples each from the product
    of the factors whose scope is already fully assigned (ancestral sampling for a
    Bayesian network listed in topological order, a greedy start for an MRF).
    Continuous variables start from :meth:`FactorGraph.initial_state`. This runs once,
    at setup, so the loop over variables is off the hot path; ``chains`` independent
    starts are drawn together.

    Args:
        fg: the graph.
        generator: the random source (default torch's global RNG).
        chains: draw ``[chains, n]`` independent starts; ``None`` draws one ``[n]``.

    Example:
        >>> fg = FactorGraph()
        >>> a = fg.add_variable("a", 2)
        >>> _ = fg.add_table_factor([a], torch.tensor([0.0, -float("inf")]))
        >>> sequential_init(fg).tolist(), sequential_init(fg, chains=2).tolist()
        ([0.0], [[0.0], [0.0]])
    """
    count = 1 if chains is None else chains
    state = torch.stack([fg.initial_state(generator) for _ in range(count)])  # [K, n]
    cards = fg.cardinalities.tolist()
    assigned = [v in fg.evidence or cards[v] == 0 for v in range(fg.num_variables)]
    for v in fg.latent.tolist():
        if cards[v] == 0:
            continue
        ready = [f for f in fg.neighbors(v) if all(assigned[u] or u == v for u in fg.factor_scope(f))]
        if ready:
            candidates = state.expand(cards[v], -1, -1).clone()  # [k, K, n]
            candidates[..., v] = torch.arange(cards[v], dtype=state.dtype)[:, None]
            groups, rows = fg.factor_location(torch.tensor(ready))
            logits = torch.zeros(cards[v], count, dtype=state.dtype)
            for g in groups.unique().tolist():
                logits = logits + fg.groups[g].log_factors(candidates, rows[groups == g]).sum(-1)
            logits = logits.T  # [K, k]
            finite = torch.isfinite(logits).any(-1)
            if finite.any():
                probs = torch.softmax(logits[finite], -1)
                state[finite, v] = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(state.dtype)
        assigned[v] = True
    return state[0] if chains is None else state


_REPAIR_ROUNDS = 20
_CONTINUOUS_ROUNDS = 100  # as Pyro's initialize_model (max_tries=100)
_REPAIR_SWEEPS = 10
_PRIOR_ROUNDS = 10
_UNIFORM_RADIUS = 2.0  # as Pyro's init_to_uniform: uniform in (-2, 2) in unconstrained space


def find_valid_start(fg: FactorGraph, state: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Replace the chains of ``state [..., n]`` that have zero or NaN density by starts of positive density.

    A chain started at zero density would stay there (every MH ratio is undefined) and
    return impossible samples. Each round redraws, in every such chain, the continuous latent
    variables of the impossible factors uniformly in ``(-2, 2)`` of their unconstrained space
    (as Pyro's ``init_to_uniform``), then its discrete variables with :func:`sequential_init`
    followed by single-site Gibbs sweeps (a variable of an impossible factor moves to a value
    that makes its factors possible). It runs up to 20 rounds (100 when the graph has
    continuous latent variables, as Pyro's ``initialize_model``), once, at setup.

    Raises:
        ValueError: no start of positive density was found; the message names the factors that
            stayed impossible (their variables and values), e.g. in a model of zero total probability.

    Example:
        >>> fg = FactorGraph(); a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
        >>> _ = fg.add_table_factor([a, b], torch.tensor([[-float("inf"), 0.0], [0.0, -float("inf")]]))
        >>> find_valid_start(fg, torch.tensor([[0.0, 0.0], [1.0, 0.0]])).tolist()[1]
        [1.0, 0.0]
        >>> from torch.distributions import constraints
        >>> fg = FactorGraph(); s = fg.add_variable("s", support=constraints.positive)
        >>> _ = fg.add_linear_gaussian(s, [], [], 0.0, 1.0)  # the half of the real line below 0 is impossible
        >>> bool(find_valid_start(fg, torch.tensor([[1.5], [0.2]]))[0, 0] == 1.5)
        True
    """
    bad = ~torch.isfinite(fg.log_joint(state))
    if not bad.any():
        return state
    from neuralblock.kernels.gibbs import GibbsPlan  # gibbs builds on this module

    cards = fg.cardinalities.tolist()
    latent = fg.latent.tolist()
    discrete = [v for v in latent if cards[v] > 0]
    continuous = [v for v in latent if cards[v] == 0]
    plan = GibbsPlan(fg, discrete) if discrete else None
    parts: dict[str, tuple[Transform, list[int]]] = {}
    for v in continuous:  # one transform per support: one batched draw each
        support = fg.support(v)
        parts.setdefault(repr(support), (transform_to(support), []))[1].append(v)
    draws = [(t, torch.tensor(ids, dtype=torch.long)) for t, ids in parts.values()]
    rounds = _CONTINUOUS_ROUNDS if continuous else (_REPAIR_ROUNDS if discrete else 0)
    state = state.clone()
    flat = state.reshape(-1, state.shape[-1])
    bad_rows = bad.reshape(-1).nonzero().squeeze(-1)
    rows = flat[bad_rows].clone()
    for _ in range(rounds):
        if draws:  # continuous variables of the impossible factors
            hit = _impossible_variables(fg, rows)
            for transform, ids in draws:
                u = (torch.rand(len(rows), len(ids), generator=generator, dtype=rows.dtype) * 2 - 1) * _UNIFORM_RADIUS
                rows[:, ids] = torch.where(hit[:, ids], transform(u), rows[:, ids])
        if plan is not None:  # discrete variables: ancestral draws, then Gibbs sweeps given the continuous ones
            rows[:, discrete] = sequential_init(fg, generator, chains=len(rows)).to(rows)[:, discrete]
            for _ in range(_REPAIR_SWEEPS):
                rows = plan.sweep(fg, rows)[0]
                fine = torch.isfinite(fg.log_joint(rows))
                if fine.all():
                    break
        else:
            fine = torch.isfinite(fg.log_joint(rows))
        flat[bad_rows[fine]] = rows[fine]
        bad_rows, rows = bad_rows[~fine], rows[~fine]
        if len(bad_rows) == 0:
            return state
    hint = (
        "; or its region of positive density is hard to hit by uniform draws in (-2, 2) of the unconstrained "
        "space: give initial_params inside it"
        if continuous
        else ""
    )
    raise ValueError(
        f"found no start of positive density for {len(bad_rows)} chain(s) after {rounds} redraws: "
        f"{_impossible_factors(fg, flat[bad_rows[0]])}; the model may have zero total probability{hint}"
    )


def _impossible_variables(fg: FactorGraph, rows: Tensor) -> Tensor:
    """``BoolTensor [B, n]``: the variables of each state's factors of zero or NaN density."""
    n = fg.num_variables
    hit = torch.zeros(rows.shape[0], n + 1, dtype=rows.dtype)
    for group, values in zip(fg.groups, fg.log_factors(rows)):
        impossible = ~torch.isfinite(values)  # [B, F]
        if not impossible.any() or group.scopes.numel() == 0:
            continue
        scopes = group.scopes.masked_fill(group.scopes < 0, n)  # [F, a], padding -> the extra column
        weight = impossible[:, :, None].expand(-1, -1, scopes.shape[1]).reshape(rows.shape[0], -1).to(rows.dtype)
        hit.scatter_add_(1, scopes.reshape(1, -1).expand(rows.shape[0], -1), weight)
    return hit[:, :n] > 0


def _impossible_factors(fg: FactorGraph, state: Tensor, limit: int = 3) -> str:
    """Describe the factors of zero or NaN density at one state ``[n]`` by their variables' names and values.

    Factors of a Pyro model also name their sample site, e.g. ``factors 'f' over (w=-0.5) have a NaN log density``.
    """
    shown_vars = 6
    zero: list[str] = []
    nan: list[str] = []
    for group, values in zip(fg.groups, fg.log_factors(state.cpu())):
        names = getattr(group, "factor_names", None)
        for row in (~torch.isfinite(values)).nonzero().flatten().tolist():
            scope = group.scope_list(row)
            text = ", ".join(f"{fg.names[v]}={float(state[v]):g}" for v in scope[:shown_vars])
            text = "(" + text + (f", ... {len(scope) - shown_vars} more" if len(scope) > shown_vars else "") + ")"
            text = f"{names[row]!r} over {text}" if names is not None and row < len(names) else f"over {text}"
            (nan if torch.isnan(values[row]) else zero).append(text)
    parts = []
    for found, what in ((zero, "have zero density"), (nan, "have a NaN log density")):
        if found:
            shown = ", ".join(found[:limit]) + (f" and {len(found) - limit} more" if len(found) > limit else "")
            parts.append(f"factors {shown} {what}")
    return "; ".join(parts) if parts else "the log density is not finite"


def _raise_if_impossible(fg: FactorGraph, state: Tensor, what: str) -> None:
    """Raise a ValueError naming the impossible factors if a chain of ``state [..., n]`` has zero or NaN density."""
    log_p = fg.log_joint(state)
    if not torch.isfinite(log_p).all():
        row = state.reshape(-1, state.shape[-1])[(~torch.isfinite(log_p)).reshape(-1).nonzero()[0, 0]]
        if torch.isnan(log_p).any():
            raise ValueError(
                f"{what} have a NaN log density: {_impossible_factors(fg, row)}; start where the model is "
                "defined (a model should give -inf, not NaN, where it has zero density)"
            )
        raise ValueError(f"{what} have zero density: {_impossible_factors(fg, row)}")
