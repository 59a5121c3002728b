"""Compiling a discrete Pyro model into vectorized table factors with Pyro's parallel enumeration.

:func:`compile_pyro_model` runs the model once under ``poutine.enum`` (as ``TraceEnum_ELBO``
and ``infer_discrete`` do): every discrete latent site takes all its values at once along an
enumeration dim of its own, so each sample site's (and each ``pyro.factor``'s) log-probability
comes out as a table over the values of the discrete sites it depends on, batched over its
plates. Every element of a plated discrete site becomes a variable (``z[3]``, ``z[1,2]``),
every site's tables become rows of a :class:`CompiledTableGroup` (one group per table shape, so
loop models give few groups), and nothing re-runs the model during discrete updates.
:meth:`CompiledTableGroup.refresh` re-tabulates with one enumerated run when the values the
model is conditioned on change (a compound sampler's continuous update).

Site values map to and from flat states through :class:`PyroGraph.sites`
(:func:`site_values_to_state` and :func:`state_to_site_values`): a plated site comes back
under its own name with its own shape, as Pyro returns it.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> def model():
    ...     with pyro.plate("data", 3):
    ...         z = pyro.sample("z", dist.Bernoulli(0.3))
    ...         pyro.sample("y", dist.Normal(z, 1.0), obs=torch.tensor([0.0, 1.0, 2.0]))
    >>> fg = compile_pyro_model(model, (), {})
    >>> fg.names
    ['z[0]', 'z[1]', 'z[2]']
    >>> state_to_site_values(fg, torch.tensor([0.0, 1.0, 1.0]))["z"]
    tensor([0., 1., 1.])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import InferDict, Message
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import Transform

from neuralblock.graph.factor_graph import FactorGraph
from neuralblock.graph.groups import TableGroup
from neuralblock.replay import ReplayedFunction

__all__ = [
    "MAX_ENUM_DIMS",
    "PyroGraph",
    "CompiledTableGroup",
    "SiteLayout",
    "compile_pyro_model",
    "is_all_discrete",
    "params_to_state",
    "prior_states",
    "site_values_to_state",
    "state_to_params",
    "state_to_site_values",
]

MAX_ENUM_DIMS = 60
"""PyTorch tensors have at most 64 dims: enumeration dims plus plate dims must fit."""

Site = Mapping[str, Any]
"""A trace node read as a plain mapping. Pyro's ``Message`` types ``fn`` as any callable and ``value`` as
optional; the sites read here are sample sites that ran: ``fn`` is their distribution, ``value`` a tensor."""

_HOW_TO = (
    "write interacting elements as separate sites (a Python loop under pyro.markov, or one plate per "
    "independent dimension), and value-dependent branches with tensor ops (torch.where, Vindex)"
)


@dataclass
class SiteLayout:
    """Where a latent site's elements live in the flat state.

    Attributes:
        name: the site name.
        ids: ``LongTensor`` of variable ids. For a discrete site, its batch shape (its value shape
            without event dims), e.g. ``[N]`` inside ``pyro.plate("data", N)``. For a continuous
            site, its value shape (one variable per element), or, for a ``transform`` site, the
            shape of its unconstrained coordinates.
        cardinality: number of values ``k`` (0 for a continuous site).
        dtype: the dtype of the site's values (``long`` for ``Categorical``, float for ``Bernoulli``).
        one_hot: whether values are one-hot vectors (``OneHotCategorical``, event dim ``k``).
        transform: for a continuous site whose support is not elementwise (a simplex, an ordered or
            Cholesky factor...), ``biject_to(support)``: its variables are the unconstrained coordinates
            ``u`` (support real) and its value is ``transform(u)``; its factor includes the log-Jacobian.
        value_shape: the value shape of a ``transform`` site.
        event_dim: the site's number of event dims (its value dims that are not batch dims).
    """

    name: str
    ids: Tensor
    cardinality: int
    dtype: torch.dtype
    one_hot: bool = False
    transform: Transform | None = None
    value_shape: torch.Size | None = None
    event_dim: int = 0

    def __post_init__(self) -> None:
        self.first = int(self.ids.min()) if self.ids.numel() else -1  # a Python int: no tensor op when recorded

    @property
    def shape(self) -> torch.Size:
        """The shape of one value of the site (the batch shape, plus ``(k,)`` for one-hot sites)."""
        if self.value_shape is not None:
            return torch.Size(self.value_shape)
        return self.ids.shape + ((self.cardinality,) if self.one_hot else ())

    def values(self, state: Tensor) -> Tensor:
        """The site's values ``[..., *shape]`` from states ``[..., n]`` (discrete values as floats)."""
        x = state[..., self.ids]
        if self.transform is not None:
            return self.transform(x)
        if self.one_hot:
            return torch.nn.functional.one_hot(x.round().long(), self.cardinality).to(state.dtype)
        return x

    def coordinates(self, value: Tensor) -> Tensor:
        """The variables' values ``[..., *ids.shape]`` for site values ``[..., *shape]`` (inverse of ``values``)."""
        if self.transform is not None:
            return self.transform.inv(value)
        if self.one_hot:
            return value.argmax(-1)
        return value


class PyroGraph(FactorGraph):
    """A :class:`FactorGraph` compiled from a Pyro model; ``sites`` maps its site names to variables.

    Attributes:
        sites: ``{site name: SiteLayout}`` of the latent discrete sites, in trace order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[str, SiteLayout] = {}
        self._split: tuple[list[str], Tensor, list[SiteLayout]] | None = None

    def split_sites(self) -> tuple[list[str], Tensor, list[SiteLayout]]:
        """``(names, ids [m], others)``: the scalar non-one-hot sites (mapped with one gather) and the rest."""
        if self._split is None:
            is_scalar = [
                lay.ids.dim() == 0 and not lay.one_hot and lay.transform is None for lay in self.sites.values()
            ]
            scalar = [lay for lay, yes in zip(self.sites.values(), is_scalar) if yes]
            ids = torch.tensor([int(lay.ids) for lay in scalar], dtype=torch.long)
            others = [lay for lay, yes in zip(self.sites.values(), is_scalar) if not yes]
            self._split = ([lay.name for lay in scalar], ids, others)
        return self._split


def _element_names(name: str, shape: torch.Size) -> list[str]:
    if len(shape) == 0:
        return [name]
    index = torch.cartesian_prod(*[torch.arange(s) for s in shape]).reshape(-1, len(shape)).tolist()
    return [f"{name}[{','.join(str(i) for i in idx)}]" for idx in index]


def state_to_site_values(fg: PyroGraph, state: Tensor) -> dict[str, Tensor]:
    """``{site: values [..., *site shape]}`` from states ``[..., n]``, in each site's dtype.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     with pyro.plate("p", 2):
        ...         pyro.sample("c", dist.Categorical(torch.ones(3)))
        >>> state_to_site_values(compile_pyro_model(model, (), {}), torch.tensor([[2.0, 0.0]]))["c"]
        tensor([[2, 0]])
    """
    out: dict[str, Tensor] = {}
    for name, layout in fg.sites.items():
        if layout.cardinality == 0:
            out[name] = layout.values(state).to(layout.dtype)
            continue
        value = state[..., layout.ids].round()
        if layout.one_hot:
            value = torch.nn.functional.one_hot(value.long(), layout.cardinality)
        out[name] = value.to(layout.dtype)
    return out


def site_values_to_state(fg: PyroGraph, values: Mapping[str, Tensor], state: Tensor) -> Tensor:
    """Write ``{site: values}`` into a copy of ``state [..., n]`` (one-hot values become indices).

    Raises:
        ValueError: a site is missing or a value does not have the site's shape.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     with pyro.plate("p", 2):
        ...         pyro.sample("c", dist.Categorical(torch.ones(3)))
        >>> fg = compile_pyro_model(model, (), {})
        >>> site_values_to_state(fg, {"c": torch.tensor([2, 1])}, torch.zeros(2))
        tensor([2., 1.])
    """
    missing = [name for name in fg.sites if name not in values]
    if missing:
        raise ValueError(f"params lack latent sites {missing[:5]}")
    state = state.clone()
    batch = state.shape[:-1]
    names, ids, others = fg.split_sites()
    if names:
        items = [values[name] for name in names]
        try:  # tensors (a kernel's own params): one stack, dtypes promoted
            scalars = torch.stack(items, -1)
        except TypeError:  # numbers given by a user
            scalars = torch.stack([torch.as_tensor(x) for x in items], -1)
        scalars = scalars.to(state.dtype)
        if scalars.numel() != math.prod(batch) * len(names):
            raise ValueError(f"scalar sites {names[:5]} expect one value each per state of batch shape {tuple(batch)}")
        state[..., ids] = scalars.reshape(batch + (len(names),))
    for layout in others:
        name = layout.name
        value = torch.as_tensor(values[name])
        if layout.transform is not None:
            shape = layout.shape
            if tuple(value.shape[value.dim() - len(shape) :]) != tuple(shape):
                raise ValueError(f"site {name!r} expects values of shape {tuple(shape)}, got {tuple(value.shape)}")
            if not bool(layout.transform.codomain.check(value.to(state.dtype)).all()):
                raise ValueError(f"site {name!r} has values outside its support {layout.transform.codomain}")
            coords = layout.coordinates(value.to(state.dtype))
            state[..., layout.ids.reshape(-1)] = coords.reshape(coords.shape[: coords.dim() - layout.ids.dim()] + (-1,))
            continue
        if layout.one_hot:
            if value.shape[-1:] != (layout.cardinality,):
                raise ValueError(f"site {name!r} expects one-hot values of size {layout.cardinality}")
            value = value.argmax(-1)
        shape = layout.ids.shape
        if tuple(value.shape[value.dim() - len(shape) :]) != tuple(shape) and value.numel() != layout.ids.numel():
            raise ValueError(f"site {name!r} expects values of shape {tuple(layout.shape)}, got {tuple(value.shape)}")
        value = value.reshape(batch + (layout.ids.numel(),)) if value.numel() != layout.ids.numel() else value
        state[..., layout.ids.reshape(-1)] = value.reshape(batch + (-1,)).to(state.dtype)
    return state


def state_to_params(fg: PyroGraph, state: Tensor) -> dict[str, Tensor]:
    """A kernel's params from states ``[..., n]``: ``{site: [..., *site shape]}`` as floats (one-hot stays one-hot).

    Kernels return discrete values as floats (whole numbers), like a FactorGraph kernel's state.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     with pyro.plate("p", 2):
        ...         pyro.sample("c", dist.Categorical(torch.ones(3)))
        >>> state_to_params(compile_pyro_model(model, (), {}), torch.tensor([[2.0, 0.0], [1.0, 1.0]]))["c"]
        tensor([[2., 0.],
                [1., 1.]])
    """
    names, ids, others = fg.split_sites()
    out: dict[str, Tensor] = dict(zip(names, state[..., ids].unbind(-1))) if names else {}
    for layout in others:
        out[layout.name] = layout.values(state)
    return out


def params_to_state(fg: PyroGraph, params: Mapping[str, Tensor], state: Tensor) -> Tensor:
    """States ``[..., n]`` (a copy of ``state``) holding the site values ``params`` (``[..., *site shape]`` each).

    Raises:
        ValueError: a site is missing or its value has the wrong shape.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     with pyro.plate("p", 2):
        ...         pyro.sample("c", dist.Categorical(torch.ones(3)))
        >>> params_to_state(compile_pyro_model(model, (), {}), {"c": torch.tensor([2, 1])}, torch.zeros(2))
        tensor([2., 1.])
    """
    return site_values_to_state(fg, params, state)


def prior_states(fg: PyroGraph, model: Callable[..., Any], args: tuple, kwargs: dict, count: int | None) -> Tensor:
    """Ancestral draws of the latent sites from the prior: ``[n]`` (``count=None``) or ``[count, n]``.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     with pyro.plate("p", 2):
        ...         pyro.sample("c", dist.Categorical(torch.tensor([0.0, 0.0, 1.0])))
        >>> prior_states(compile_pyro_model(model, (), {}), model, (), {}, 2)
        tensor([[2., 2.],
                [2., 2.]])
    """
    draws = []
    for _ in range(1 if count is None else count):
        with pyro.validation_enabled(False):  # a draw in a NaN region is a value to repair, not an error
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        nodes: Mapping[str, Site] = trace.nodes
        values = {name: nodes[name]["value"] for name in fg.sites}
        draws.append(site_values_to_state(fg, values, fg.initial_state()))
    return draws[0] if count is None else torch.stack(draws)


# ---------------------------------------------------------------------------- site analysis
def _base_fn(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def _is_one_hot(fn: Any) -> bool:
    return isinstance(_base_fn(fn), dist.OneHotCategorical)


def _skipped(site: Site) -> bool:
    """Sites that are not sample sites of the model (plate subsample sites, params...)."""
    return site["type"] != "sample" or site_is_subsample(cast(Message, site))  # a trace node is a Message


def _contributes(site: Site) -> bool:
    """Whether a sample site adds to the log density (not masked off, not ``pyro.deterministic``)."""
    if site["mask"] is False or site["infer"].get("_deterministic", False):
        return False
    return not (isinstance(site["fn"], dist.MaskedDistribution) and site["fn"]._mask is False)


def is_all_discrete(trace: poutine.Trace) -> bool:
    """Whether every latent sample site of a trace is discrete (``support.is_discrete``)."""
    nodes: Mapping[str, Site] = trace.nodes
    return all(
        site["fn"].support.is_discrete
        for site in nodes.values()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(cast(Message, site))
    )


def _discrete_cardinality(name: str, site: Site) -> int:
    fn = site["fn"]
    if not getattr(fn, "has_enumerate_support", False):
        raise ValueError(
            f"discrete latent site {name!r} ({type(_base_fn(fn)).__name__}) has no finite enumerable support; "
            "only supports 0..k-1 are supported"
        )
    if _is_one_hot(fn):
        return int(fn.event_shape[-1])
    if tuple(fn.event_shape):
        raise ValueError(
            f"discrete latent site {name!r} has event shape {tuple(fn.event_shape)}; enumeration needs scalar "
            "events: declare its dims with pyro.plate instead of .to_event()"
        )
    values = fn.enumerate_support(expand=False).reshape(-1)
    k = int(values.numel())
    if k < 1 or not bool((values == torch.arange(k, dtype=values.dtype)).all()):
        raise ValueError(
            f"discrete latent site {name!r} has support {values.tolist()}; only supports 0..k-1 are supported"
        )
    return k


def _check_plates(name: str, site: Site) -> None:
    for frame in site["cond_indep_stack"]:
        if frame.full_size is not None and frame.size != frame.full_size:
            raise ValueError(
                f"site {name!r} is in the subsampled plate {frame.name!r} ({frame.size} of {frame.full_size}); "
                "subsampling makes the log density random and is not supported"
            )


def _check_batch_dims(name: str, site: Site, shape: torch.Size) -> None:
    """Every non-singleton batch dim of a discrete latent site must be a plate of that size."""
    plates = {int(f.dim): f for f in site["cond_indep_stack"] if f.vectorized}
    for d in range(-len(shape), 0):
        if shape[d] == 1:
            continue
        frame = plates.get(d)
        if frame is None or frame.size != shape[d]:
            raise ValueError(
                f"discrete latent site {name!r} has batch shape {tuple(shape)}, whose dim {d} (size {shape[d]}) is "
                f"not a pyro.plate; enumeration needs every batch dim of a discrete site declared by a plate "
                f"(write `with pyro.plate('...', {shape[d]}, dim={d}):` around it instead of .expand())"
            )


def _evidence_cardinality(site: Site) -> int:
    """``k`` for an observed scalar discrete site (outside plates) whose value lies in ``0..k-1``, else 0."""
    fn, value = site["fn"], site["value"]
    if not isinstance(value, Tensor) or value.shape != () or tuple(fn.batch_shape) or tuple(fn.event_shape):
        return 0
    if not fn.support.is_discrete or not getattr(fn, "has_enumerate_support", False):
        return 0
    support = fn.enumerate_support(expand=False).reshape(-1)
    k = int(support.numel())
    if not bool((support == torch.arange(k, dtype=support.dtype)).all()):
        return 0
    return k if float(value) == int(value) and 0 <= int(value) < k else 0


def _site_log_prob(site: Site) -> Tensor:
    fn, value = site["fn"], site["value"]
    log_p = fn.log_prob(value)
    return torch.as_tensor(scale_and_mask(log_p, site["scale"], site["mask"]))


class _LastSite(Messenger):
    """Remembers the last sample site the model reached and the enumeration dims used (for errors)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None
        self.enum_dims: set[int] = set()

    def _pyro_sample(self, msg: dict) -> None:
        self.last = msg["name"]

    def _pyro_post_sample(self, msg: dict) -> None:
        dim = (msg.get("infer") or {}).get("_enumerate_dim")
        if dim is not None:
            self.enum_dims.add(int(dim))


def _error_text(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _model_name(model: Callable[..., Any]) -> str:
    inner = getattr(model, "model", None)  # a ConditionedModel
    model = inner if inner is not None and callable(inner) else model
    return getattr(model, "__qualname__", None) or type(model).__name__


def _enum_config(msg: Message) -> InferDict:
    if msg["type"] == "sample" and not msg["is_observed"] and getattr(msg["fn"], "has_enumerate_support", False):
        return {"enumerate": "parallel", "expand": False}
    return {}


# ---------------------------------------------------------------------------- the compiler
@dataclass
class _Factor:
    """How one sample site's log-probability becomes table rows."""

    site: str
    parents: list[str]  # discrete latent sites of the table axes, in axis order (the site itself last)
    batch_shape: torch.Size  # the site's plate shape (padded to the plate nesting), after summing free dims
    sum_dims: tuple[int, ...]  # batch dims summed out (no parent varies along them)
    group: int  # index of its CompiledTableGroup
    rows: slice  # its rows in that group


def fixed_values(model: Callable[..., Any]) -> dict[str, Tensor]:
    """The mutable dict of fixed sites of a conditioned model (a ``ConditionedModel``), else an empty dict.

    Example:
        >>> fixed_values(lambda: None)
        {}
    """
    values = getattr(model, "values", None)
    return values if isinstance(values, dict) else {}


@contextmanager
def fixed_sites_at(model: Callable[..., Any], values: Sequence[Tensor]) -> Iterator[None]:
    """Hold a conditioned model's fixed sites (in sorted name order) at ``values`` while the block runs.

    A function recorded by :class:`ReplayedFunction` takes the fixed sites as inputs this way, so
    that a compound sampler's other blocks can move them without the graph holding old values.

    Example:
        >>> class Model:
        ...     values = {"a": torch.tensor(1.0)}
        >>> with fixed_sites_at(Model, [torch.tensor(5.0)]):
        ...     float(Model.values["a"])
        5.0
        >>> float(Model.values["a"])
        1.0
    """
    fixed = fixed_values(model)
    saved = dict(fixed)
    fixed.update(zip(sorted(fixed), values))
    try:
        yield
    finally:
        fixed.update(saved)


def replay_with_fixed_sites(
    cache: dict[tuple[str, ...], ReplayedFunction], model: Callable[..., Any], fn: Callable[..., Any], what: str
) -> tuple[ReplayedFunction, tuple[Tensor, ...]]:
    """The replay of ``fn`` for the model's current set of fixed sites (kept in ``cache``) and their values.

    ``fn`` takes the fixed sites' values as its trailing arguments, in sorted name order (see
    :func:`fixed_sites_at`).

    Example:
        >>> cache = {}
        >>> replay, fixed = replay_with_fixed_sites(cache, lambda: None, torch.neg, "negation")
        >>> list(cache), fixed, replay(torch.ones(2)).tolist()
        ([()], (), [-1.0, -1.0])
    """
    fixed = fixed_values(model)
    names = tuple(sorted(fixed))
    if names not in cache:
        cache[names] = ReplayedFunction(fn, what)
    return cache[names], tuple(fixed[name] for name in names)


class _Compiler:
    """Holds what is needed to re-tabulate a model's sites with one enumerated run."""

    def __init__(self, model: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.model, self.args, self.kwargs = model, tuple(args), dict(kwargs)
        self.nesting = 0
        self.layouts: dict[str, SiteLayout] = {}
        self.factors: list[_Factor] = []
        self.groups: list[CompiledTableGroup] = []
        self._plate_names: dict[str, list[str]] = {}
        self.evidence: dict[str, tuple[int, int, float]] = {}  # scalar observed discrete site -> (id, k, value)
        self._key: dict[str, Tensor] | None = None
        self._replays: dict[tuple[str, ...], ReplayedFunction] = {}

    # -- running the model
    def plain_trace(self) -> poutine.Trace:
        try:
            return poutine.trace(self.model).get_trace(*self.args, **self.kwargs)
        except Exception as err:
            raise ValueError(f"model {_model_name(self.model)!r} failed to trace: {_error_text(err)}") from err

    def enum_trace(self) -> poutine.Trace:
        last = _LastSite()
        enum_model = poutine.enum(poutine.infer_config(self.model, _enum_config), first_available_dim=-1 - self.nesting)
        try:
            with last:
                return poutine.trace(enum_model).get_trace(*self.args, **self.kwargs)
        except Exception as err:
            if self.nesting + len(last.enum_dims) >= MAX_ENUM_DIMS:
                raise ValueError(
                    f"model {_model_name(self.model)!r} enumerates {len(self.layouts)} discrete sites at once, which "
                    f"needs more than {MAX_ENUM_DIMS} tensor dims; wrap the loops over them in pyro.markov (as "
                    "TraceEnum_ELBO requires), so that enumeration dims are recycled, or use plates"
                ) from err
            where = f"at or after site {last.last!r}" if last.last else "before its first site"
            raise ValueError(
                f"model {_model_name(self.model)!r} cannot be evaluated on a batch of values of its discrete sites "
                f"(parallel enumeration, as TraceEnum_ELBO runs it): it failed {where}: {_error_text(err)}. Under "
                "enumeration each discrete site holds all its values at once (shape (k, 1, ..., 1)); structure "
                "that changes with the sampled values, or indexing that mixes elements of one vectorized site, "
                f"cannot become a table: {_HOW_TO}; write it with tensor ops (e.g. torch.where instead of "
                "Python if on sample values)"
            ) from err

    def _conditioned_values(self) -> dict[str, Tensor] | None:
        return fixed_values(self.model) if hasattr(self.model, "values") else None

    # -- building
    def _site_table(self, name: str, site: Site) -> Tensor:
        """A site's log-probabilities under enumeration; an observed discrete site's table gets its value axis.

        The observed variable's axis is leftmost (index 0), over all its values.
        """
        if name not in self.evidence:
            return _site_log_prob(site)
        fn, k = site["fn"], self.evidence[name][1]
        values = torch.arange(k).reshape((k,) + (1,) * len(fn.batch_shape)).to(site["value"].dtype)
        log_p = torch.as_tensor(scale_and_mask(fn.log_prob(values), site["scale"], site["mask"]))
        return log_p.reshape((k,) + (1,) * max(0, self.nesting + 1 - log_p.dim()) + log_p.shape[1:])

    def analyse(self, trace: poutine.Trace) -> list[str]:
        """Check the sites of a plain trace, set the plate nesting and the layouts; returns factor sites."""
        nesting = 0
        factor_sites: list[str] = []
        shapes: dict[str, tuple[int, torch.Size, torch.dtype, bool]] = {}
        evidence: dict[str, tuple[int, float]] = {}
        nodes: Mapping[str, Site] = trace.nodes
        for name, site in nodes.items():
            if _skipped(site):
                continue
            _check_plates(name, site)
            for frame in site["cond_indep_stack"]:
                if frame.vectorized:
                    assert frame.dim is not None  # a vectorized plate has its dim
                    nesting = max(nesting, -int(frame.dim))
            if not site["is_observed"]:
                _discrete_cardinality(name, site)
            try:
                log_p = self._site_table(name, site)
            except Exception as err:
                raise ValueError(f"log_prob of site {name!r} failed: {_error_text(err)}") from err
            nesting = max(nesting, log_p.dim())
            if _contributes(site):
                factor_sites.append(name)
            if site["is_observed"]:
                card = _evidence_cardinality(site)
                if card and _contributes(site) and name not in (self._conditioned_values() or {}):
                    evidence[name] = (card, float(site["value"]))
                continue
            fn, value = site["fn"], site["value"]
            k = _discrete_cardinality(name, site)
            one_hot = _is_one_hot(fn)
            shape = value.shape[: value.dim() - fn.event_dim]
            _check_batch_dims(name, site, shape)
            nesting = max(nesting, len(shape))
            shapes[name] = (k, shape, value.dtype, one_hot)
        self.nesting = nesting
        self._plate_names = {
            name: [f.name for f in trace.nodes[name]["cond_indep_stack"] if f.vectorized] for name in shapes
        }
        start = 0
        for name, (k, shape, dtype, one_hot) in shapes.items():
            count = math.prod(shape)
            ids = torch.arange(start, start + count, dtype=torch.long).reshape(shape)
            self.layouts[name] = SiteLayout(name, ids, k, dtype, one_hot)
            start += count
        for offset, (name, (k, value)) in enumerate(evidence.items()):
            self.evidence[name] = (start + offset, k, value)
        return factor_sites

    def check_same_sites(self, reference: poutine.Trace, trace: poutine.Trace) -> None:
        """Raise if ``trace`` has other sample sites than ``reference`` (structure that depends on values)."""
        sites = [{n for n, site in t.nodes.items() if not _skipped(site)} for t in (reference, trace)]
        if sites[0] != sites[1]:
            differ = sorted(sites[0] ^ sites[1])
            raise ValueError(
                f"model {_model_name(self.model)!r} has the sample sites {differ[:5]} in some runs and not in others: "
                "its structure changes with the sampled values, which enumeration cannot express as tables; sample "
                "every site in every run and let values act through tensor ops (torch.where, poutine.mask)"
            )

    def _padded(self, shape: torch.Size) -> torch.Size:
        return torch.Size((1,) * (self.nesting - len(shape)) + tuple(shape))

    def tabulate(self, trace: poutine.Trace, plain: poutine.Trace, factor_sites: list[str]) -> list[tuple]:
        """Table rows of every factor site: ``(site, parents, batch shape, sum dims, tables [F, k...])``."""
        self.check_same_sites(plain, trace)
        by_id: dict[int, str] = {}
        nodes: Mapping[str, Site] = trace.nodes
        for name in self.layouts:
            info = nodes[name]["infer"]
            by_id[info["_dim_to_id"][info["_enumerate_dim"]]] = name
        out = []
        for name in factor_sites:
            site = trace.nodes.get(name)
            if site is None or site["type"] != "sample":
                raise ValueError(f"site {name!r} is missing when the model runs under enumeration (dynamic structure)")
            try:
                log_p = self._site_table(name, site)
            except Exception as err:
                raise ValueError(
                    f"site {name!r} cannot be evaluated on the enumerated values of its discrete parents: "
                    f"{_error_text(err)}; {_HOW_TO}"
                ) from err
            out.append(self._site_tables(name, site, log_p, plain.nodes[name], by_id))
        return out

    def _site_tables(self, name: str, site: Site, log_p: Tensor, plain_site: Site, by_id: dict[int, str]) -> tuple:
        nest = self.nesting
        plain_shape = self._padded(_site_log_prob(plain_site).shape)
        if not log_p.is_floating_point():
            log_p = log_p.to(torch.get_default_dtype())
        log_p = log_p.reshape((1,) * max(0, nest - log_p.dim()) + tuple(log_p.shape))
        num_enum = log_p.dim() - nest
        batch_part = log_p.shape[num_enum:]
        try:
            ok = torch.broadcast_shapes(batch_part, plain_shape) == plain_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(self._interaction_message(name, site, tuple(batch_part), tuple(plain_shape)))
        dim_to_id = site["infer"].get("_dim_to_id", {})
        parents: list[tuple[str, int]] = []
        for i in range(num_enum):
            if name in self.evidence and i == 0:
                parents.append((name, 0))
                continue
            if log_p.shape[i] == 1:
                continue
            d = i - log_p.dim()
            parent = by_id.get(dim_to_id.get(d, -1))
            if parent is None:
                raise ValueError(
                    f"site {name!r} has a log-probability of shape {tuple(log_p.shape)} under enumeration whose dim "
                    f"{d} (size {log_p.shape[i]}) is neither a plate nor an enumerated discrete site; a site's "
                    "batch dims must be declared by pyro.plate (see Pyro's tensor shapes tutorial)"
                )
            parents.append((parent, i))
        own = [p for p in parents if p[0] == name]
        others = sorted((p for p in parents if p[0] != name), key=lambda p: self._first_id(p[0]))
        parents = others + own
        for parent, _ in parents:
            ids = self._ids(parent).shape
            if torch.broadcast_shapes(ids, plain_shape) != plain_shape:
                raise ValueError(
                    f"site {name!r} (batch shape {tuple(plain_shape)}) reads the discrete site {parent!r} (batch "
                    f"shape {tuple(ids)}) outside of {parent!r}'s plates: it depends on several elements of "
                    f"{parent!r} at once (interactions between elements of one vectorized site), which "
                    f"enumeration cannot express as a table; put {name!r} inside {parent!r}'s plates or {_HOW_TO}"
                )
        # sum out batch dims along which no parent varies (Pyro's plate sums): fewer, identical rows
        free = [j for j in range(nest) if plain_shape[j] > 1 and all(self._ids(p).shape[j] == 1 for p, _ in parents)]
        full = log_p.expand(tuple(log_p.shape[:num_enum]) + tuple(plain_shape))
        if free:
            full = full.sum(tuple(num_enum + j for j in free), keepdim=True)
        batch_shape = torch.Size(1 if j in free else plain_shape[j] for j in range(nest))
        keep = [i for _, i in parents]
        rest = [i for i in range(num_enum) if i not in keep]
        order = rest + list(range(num_enum, num_enum + nest)) + keep
        cards = [int(log_p.shape[i]) for i in keep]
        tables = full.permute(order).reshape([math.prod(batch_shape)] + cards)
        if not parents:  # a constant: one row
            tables = tables.sum(0, keepdim=True)
        return name, [p for p, _ in parents], batch_shape, tuple(free), tables

    def _interaction_message(self, name: str, site: Site, got: tuple, expected: tuple) -> str:
        plates = {f.name for f in site["cond_indep_stack"] if f.vectorized}
        suspects = [n for n in self.layouts if n != name and self.layouts[n].ids.numel() > 1]
        outside = [n for n in suspects if not set(self._plates_of(n)) <= plates] or suspects
        return (
            f"site {name!r} has a log-probability of batch shape {got} under enumeration but {expected} in the "
            f"model: it combines several elements of the vectorized discrete site(s) {outside} (e.g. a sum, slice "
            "or shift along a plate dim), an interaction between elements of one vectorized site that enumeration "
            f"cannot express as a table; {_HOW_TO}"
        )

    def _plates_of(self, name: str) -> list[str]:
        return self._plate_names.get(name, [])

    def _first_id(self, site: str) -> int:
        """The smallest variable id of a latent or evidence site (layouts are contiguous ranges)."""
        return self.evidence[site][0] if site in self.evidence else self.layouts[site].first

    def _ids(self, site: str) -> Tensor:
        """Variable ids of a latent or evidence site, padded to the plate nesting."""
        if site in self.evidence:
            return torch.tensor(self.evidence[site][0]).reshape((1,) * self.nesting)
        ids = self.layouts[site].ids
        return ids.reshape(self._padded(ids.shape))

    def scopes(self, parents: list[str], batch_shape: torch.Size) -> Tensor:
        if not parents:
            return torch.zeros(1, 0, dtype=torch.long)
        return torch.stack([self._ids(p).expand(batch_shape).reshape(-1) for p in parents], -1)

    def refresh(self) -> None:
        """Re-tabulate every group in place (skipped when the conditioned values did not change).

        The tabulation (one enumerated and one plain run) is recorded as a graph of the fixed
        values once it has run a few times, and replayed after (see :class:`ReplayedFunction`).
        """
        values = self._conditioned_values()
        if values is not None and self._key is not None and _same_values(values, self._key):
            return
        replay, fixed = replay_with_fixed_sites(
            self._replays, self.model, self._tables, f"re-tabulating model {_model_name(self.model)!r}"
        )
        for factor, tables in zip(self.factors, replay(*fixed)):
            group = self.groups[factor.group]
            group.log_tables[factor.rows] = tables.to(group.log_tables.dtype)
        for group in self.groups:
            group._check_values()
        self._key = None if values is None else {k: torch.as_tensor(v).clone() for k, v in values.items()}

    def _tables(self, *fixed: Tensor) -> tuple[Tensor, ...]:
        """Every factor's tables with the model's fixed sites at ``fixed`` (sorted names): what refresh records."""
        # validation off, as in Pyro's MCMC: an invalid value gives NaN or +inf, refused by _check_values
        with fixed_sites_at(self.model, fixed), pyro.validation_enabled(False):
            rows = self.tabulate(self.enum_trace(), self.plain_trace(), [f.site for f in self.factors])
        for factor, (_, parents, _, _, _) in zip(self.factors, rows):
            if parents != factor.parents:
                raise ValueError(
                    f"site {factor.site!r} now depends on {parents} instead of {factor.parents}: the model's "
                    "structure changed with the conditioned values"
                )
        return tuple(tables for *_, tables in rows)

    def __getstate__(self) -> dict:
        state = dict(vars(self))
        state["_replays"] = {}  # recorded graphs hold closures: recorded again after unpickling
        return state


def _same_values(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(v), b[k]) for k, v in a.items())


class CompiledTableGroup(TableGroup):
    """Table factors of a compiled Pyro model: the rows of every site whose tables share one shape.

    ``site_names[f]`` is the sample site of row ``f``; its table axes are the site's discrete
    parents (by variable id) and then, for a latent site, its own variable (child last, as
    in a Bayesian network's conditional probability tables). :meth:`refresh` re-tabulates
    every group of the model in place with one enumerated run (the model's conditioned
    values may have changed); views of ``log_tables`` that kernels hold stay valid.

    Args:
        compiler: the model's compiler (shared by the model's groups).
        site_names: the site of each row.
        scopes: ``LongTensor [F, a]``.
        log_tables: ``[F, k_1, ..., k_a]``.
    """

    def __init__(self, compiler: _Compiler, site_names: list[str], scopes: Tensor, log_tables: Tensor) -> None:
        self.compiler = compiler
        self.site_names = list(site_names)
        super().__init__(scopes, log_tables)

    def _check_values(self) -> None:
        bad = torch.isnan(self.log_tables) | (self.log_tables == math.inf)
        if bad.any():
            rows = bad.reshape(bad.shape[0], -1).any(-1).nonzero()[:, 0].tolist()
            sites = sorted({self.site_names[f] for f in rows})
            raise ValueError(f"sites {sites[:5]} have NaN or +inf log densities at some values of their parents")

    def refresh(self) -> None:
        """Re-tabulate in place (the model's conditioned values may have changed)."""
        self.compiler.refresh()

    def __getstate__(self) -> dict:
        return dict(vars(self))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._flat = self.log_tables.reshape(self.log_tables.shape[0], -1)  # a view again, for refresh()


def compile_pyro_model(model: Callable[..., Any], args: tuple, kwargs: dict) -> PyroGraph:
    """Compile a Pyro model whose latent sites are all discrete into a :class:`PyroGraph` of tables.

    See the module docstring. Observed discrete sites are data: their log-probabilities
    become tables over their latent parents, like any observed site's.

    Args:
        model: the Pyro model (a module-level function, for pickling).
        args: positional arguments for the model.
        kwargs: keyword arguments for the model.

    Returns:
        The graph; ``fg.log_joint(state)`` equals the model's ``trace.log_prob_sum()``.

    Raises:
        ValueError: a site cannot be enumerated or tabulated; the message names the site and
            says how to write it.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> def hmm():
        ...     x = 0
        ...     for t in pyro.markov(range(3)):
        ...         x = pyro.sample(f"x{t}", dist.Categorical(torch.tensor([[0.9, 0.1], [0.2, 0.8]])[x]))
        >>> fg = compile_pyro_model(hmm, (), {})
        >>> fg.names, [g.table_shape for g in fg.groups]
        (['x0', 'x1', 'x2'], [(2,), (2, 2)])
    """
    compiler = _Compiler(model, args, kwargs)
    plain = compiler.plain_trace()
    factor_sites = compiler.analyse(plain)
    trace = compiler.enum_trace()
    rows = compiler.tabulate(trace, plain, factor_sites)

    fg = PyroGraph()
    for name, layout in compiler.layouts.items():
        for element in _element_names(name, layout.ids.shape):
            fg.add_variable(element, layout.cardinality)
    for name, (_, k, value) in compiler.evidence.items():
        fg.set_evidence({fg.add_variable(name, k): value})
    fg.sites = dict(compiler.layouts)
    buckets: dict[tuple[int, ...], list[tuple]] = {}
    for row in rows:
        buckets.setdefault(tuple(row[4].shape[1:]), []).append(row)
    for g, members in enumerate(buckets.values()):
        names, scopes, tables, start = [], [], [], 0
        for name, parents, batch_shape, sum_dims, table in members:
            scope = compiler.scopes(parents, batch_shape)
            count = scope.shape[0]
            compiler.factors.append(_Factor(name, parents, batch_shape, sum_dims, g, slice(start, start + count)))
            names.extend([name] * count)
            scopes.append(scope)
            tables.append(table.to(torch.get_default_dtype()))
            start += count
        group = CompiledTableGroup(compiler, names, torch.cat(scopes), torch.cat(tables))
        group._check_values()
        compiler.groups.append(group)
        fg.add_group(group)
    compiler.factors.sort(key=lambda f: factor_sites.index(f.site))
    values = compiler._conditioned_values()
    compiler._key = None if values is None else {k: torch.as_tensor(v).clone() for k, v in values.items()}
    _verify(fg, compiler, plain)
    return fg


def _verify(fg: PyroGraph, compiler: _Compiler, plain: poutine.Trace) -> None:
    """The tables must reproduce each site's log-probability at the traced values and at prior draws."""
    traces = [plain]
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(12345)
        traces += [compiler.plain_trace() for _ in range(2)]
    for trace in traces:
        compiler.check_same_sites(plain, trace)
        nodes: Mapping[str, Site] = trace.nodes
        values = {name: nodes[name]["value"] for name in compiler.layouts}
        state = site_values_to_state(fg, values, fg.initial_state())
        for factor in compiler.factors:
            group = compiler.groups[factor.group]
            rows = torch.arange(factor.rows.start, factor.rows.stop)
            got = group.log_factors(state, rows).double().sum()
            expected = _site_log_prob(trace.nodes[factor.site]).double().sum()
            if bool(got == expected) or bool(torch.isclose(got, expected, rtol=1e-4, atol=1e-3)):
                continue
            raise ValueError(
                f"the enumerated tables of site {factor.site!r} give log-probability {float(got):.6g} at a traced "
                f"state where the model gives {float(expected):.6g}: the site depends on its discrete parents in "
                "a way enumeration does not see (e.g. interactions between elements of one vectorized site, or "
                f"Python control flow on sampled values); {_HOW_TO}"
            )
