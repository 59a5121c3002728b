"""``ConditionalGraphKernel``: a graph kernel on sites of a Pyro model whose full conditional is a factor graph.

Neural block proposals find their motifs in factor graphs with structured groups
(linear-Gaussian chains, Gaussian mixtures, tables). A Pyro model with global parameters
``theta`` and local sites ``z`` often has exactly such a graph as the full conditional
``p(z | theta, data)``, with parameters that are functions of ``theta``. This kernel lets
a user say so: ``build_graph(values, *args)`` returns that graph for the other sites'
current ``values``, and any :class:`~neuralblock.kernels.GraphKernel` (typically
:class:`~neuralblock.kernels.NeuralBlockKernel` with a pretrained proposal) samples it.
Inside a :class:`~neuralblock.kernels.CompoundKernel`, each global update calls
:meth:`condition_on`, which rebuilds the graph and hands its new parameters to the inner
kernel (:meth:`GraphKernel.update_graph`): blocks, colourings and adapted step sizes are
kept.

Correctness rests on one user promise: ``build_graph(values)`` is, up to a constant, the
model's conditional density of the kernel's sites given ``values``. The tests check it on
a model whose joint posterior is Gaussian.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro.infer import MCMC
    >>> from neuralblock import FactorGraph
    >>> from neuralblock.kernels import CompoundKernel, GibbsKernel, RandomWalkMH
    >>> def model():
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     pyro.sample("z", dist.Bernoulli(logits=w[..., None] * torch.ones(3)).to_event(1))
    >>> def graph(values):  # p(z | w): three independent bits
    ...     fg = FactorGraph(); bits = fg.add_variables(3, cardinality=2, prefix="z")
    ...     logits = torch.stack([torch.zeros(()), values["w"]]).expand(3, 2)
    ...     _ = fg.add_table_factors(torch.tensor(bits)[:, None], torch.nn.functional.log_softmax(logits, -1))
    ...     return fg
    >>> local = ConditionalGraphKernel(model, {"z": [0, 1, 2]}, graph, GibbsKernel)
    >>> kernel = CompoundKernel([(local, ["z"]), (RandomWalkMH(model), ["w"])])
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["z"].shape
    torch.Size([20, 3])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from pyro import poutine
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from neuralblock.graph import FactorGraph
from neuralblock.kernels.base import STATE_SITE, GraphKernel
from neuralblock.kernels.conditioning import _finite_values, values_changed
from neuralblock.kernels.vocabulary import KernelDiagnostics

__all__ = ["ConditionalGraphKernel"]


class ConditionalGraphKernel(MCMCKernel):
    """Sample Pyro sites with a graph kernel on their full conditional, rebuilt from the other sites.

    Args:
        model: the joint Pyro model (a module-level function, for ``num_chains > 1``).
        sites: ``{site: variables}``: the graph variables (ids or names) holding each
            site's elements in row-major order; the site may have any shape.
        build_graph: ``build_graph(values, *args, **kwargs) -> FactorGraph``, the
            conditional of ``sites`` given the other latent sites' constrained ``values``
            (``{}`` when there are none) and the model's arguments. Every call must return
            the same structure (see :meth:`FactorGraph.update_parameters`).
        kernel: ``kernel(fg) -> GraphKernel``, e.g.
            ``lambda fg: NeuralBlockKernel(fg, proposals=[load_pretrained("chain")])``.
            With ``num_chains > 1`` in spawned processes, ``model``, ``build_graph`` and
            ``kernel`` must pickle: use module-level functions (or ``functools.partial``).

    Raises:
        TypeError: a non-callable ``model``, ``build_graph`` or ``kernel``.
        ValueError: empty ``sites``.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        sites: Mapping[str, Sequence[int | str] | Tensor],
        build_graph: Callable[..., FactorGraph],
        kernel: Callable[[FactorGraph], GraphKernel],
    ) -> None:
        for name, value in (("model", model), ("build_graph", build_graph), ("kernel", kernel)):
            if not callable(value):
                raise TypeError(f"{name} must be callable, got {type(value).__name__}")
        if not sites:
            raise ValueError("ConditionalGraphKernel needs at least one site")
        self._model = model
        self._site_vars = {str(k): v for k, v in sites.items()}
        self.build_graph = build_graph
        self.make_kernel = kernel
        self.inner: GraphKernel | None = None
        self._values: dict[str, Tensor] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._ids: dict[str, Tensor] = {}
        self._shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self._state: Tensor | None = None
        self._pending_init: dict[str, Tensor] | None = None
        self.transforms: dict = {}

    @property
    def model(self) -> Callable[..., Any]:
        """The joint Pyro model."""
        return self._model

    def condition_on(self, values: Mapping[str, Tensor]) -> None:
        """Fix the other sites at ``values``; after ``setup`` the inner kernel's graph follows them."""
        new = _finite_values(values)
        changed = values_changed(self._values, new)
        self._values = new
        if changed and self.inner is not None:
            self.inner.update_graph(self._build())

    def _build(self) -> FactorGraph:
        fg = self.build_graph(dict(self._values), *self._args, **self._kwargs)
        if not isinstance(fg, FactorGraph):
            raise TypeError(f"build_graph must return a FactorGraph, got {type(fg).__name__}")
        return fg

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Build the conditional graph for the current values and set up the inner kernel on it."""
        self._args, self._kwargs = args, kwargs
        fg = copy.deepcopy(self._build())  # the kernel's graph is updated in place later: own it
        trace = poutine.trace(poutine.condition(self._model, data=self._values)).get_trace(*args, **kwargs)
        latent = set(fg.latent.tolist())
        self._ids, self._shapes = {}, {}
        for name, variables in self._site_vars.items():
            site = trace.nodes.get(name)
            if site is None or site["type"] != "sample" or site["is_observed"]:
                raise ValueError(f"{name!r} is not a latent sample site of the model")
            ids = torch.tensor([fg.variable_id(v) for v in _as_list(variables)], dtype=torch.long)
            value = site["value"]
            assert value is not None  # a traced sample site holds its value
            if ids.numel() != value.numel():
                raise ValueError(f"site {name!r} has {value.numel()} elements but {ids.numel()} graph variables")
            if any(int(v) not in latent for v in ids.tolist()):
                raise ValueError(f"site {name!r} maps to observed graph variables")
            self._ids[name] = ids
            self._shapes[name] = (value.shape, value.dtype)
        mapped = torch.cat(list(self._ids.values()))
        if mapped.unique().numel() != mapped.numel():
            raise ValueError("the sites map to overlapping graph variables: each variable belongs to one site")
        unmapped = sorted(latent - set(mapped.tolist()))
        if unmapped:  # the inner kernel would sample them, but the model and the other kernels never see them
            raise ValueError(
                f"latent graph variables {[fg.names[v] for v in unmapped[:5]]} belong to no site; map every latent "
                "variable of the conditional graph to a site"
            )
        self.inner = self.make_kernel(fg)
        if not isinstance(self.inner, GraphKernel) or self.inner.from_pyro:
            raise TypeError("kernel(fg) must return a GraphKernel built on the given FactorGraph")
        if self._pending_init is not None:
            self.inner.initial_params = {STATE_SITE: self._to_state(self._pending_init, fg.initial_state())}
            self._pending_init = None
        self.inner.setup(warmup_steps)
        self._state = self.inner.initial_params[STATE_SITE]

    def _to_state(self, params: Mapping[str, Tensor], state: Tensor) -> Tensor:
        """``state`` with the sites' values from ``params``.

        Observed variables keep ``state``'s values: the graph's initial state at setup, and
        later the inner kernel overwrites them with the graph's current evidence itself.
        """
        state = state.clone()
        for name, ids in self._ids.items():
            if name not in params:
                raise ValueError(f"params lack site {name!r}")
            state[ids] = torch.as_tensor(params[name]).reshape(-1).to(state.dtype)
        return state

    def _to_params(self, state: Tensor) -> dict[str, Tensor]:
        return {
            name: state[ids].reshape(self._shapes[name][0]).to(self._shapes[name][1]) for name, ids in self._ids.items()
        }

    @property
    def inner_graph(self) -> FactorGraph:
        """The inner kernel's graph (after ``setup``)."""
        if self.inner is None or self.inner.fg is None:
            raise RuntimeError("call setup() first")
        return self.inner.fg

    @property
    def initial_params(self) -> dict[str, Tensor]:
        """The sites' initial values (the inner kernel's initial state)."""
        if self._state is None:
            raise RuntimeError("call setup() before reading initial_params")
        return self._to_params(self._state)

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        self._pending_init = {k: torch.as_tensor(v) for k, v in params.items()}

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One inner transition on the current conditional graph."""
        if self.inner is None or self._state is None:
            raise RuntimeError("call setup() before sample()")
        state = self._to_state(params, self._state)
        self._state = self.inner.sample({STATE_SITE: state})[STATE_SITE]
        return self._to_params(self._state)

    def logging(self) -> dict[str, Any]:
        """The inner kernel's progress-bar entries."""
        return self.inner.logging() if self.inner is not None else {}

    def diagnostics(self) -> KernelDiagnostics:
        """The inner kernel's diagnostics (with ``"divergences"``, which arviz.from_pyro reads)."""
        return {"divergences": [], **(self.inner.diagnostics() if self.inner is not None else {})}

    def end_warmup(self) -> None:
        """The inner kernel counts its own warmup."""

    def cleanup(self) -> None:
        """Clean up the inner kernel."""
        if self.inner is not None:
            self.inner.cleanup()


def _as_list(variables: Sequence[int | str] | Tensor) -> list[int | str]:
    if isinstance(variables, Tensor):
        return [int(v) for v in variables.reshape(-1).tolist()]
    if isinstance(variables, str):
        raise TypeError(f"site variables must be a list of ids or names, got the string {variables!r}")
    return list(variables)
