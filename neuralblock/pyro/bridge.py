"""Both directions of the Pyro bridge (see :mod:`neuralblock.pyro`).

Variables and sites map one to one by name: the latent site of a Pyro model built by
:func:`to_pyro_model` is named ``fg.names[v]``, and the variable ``v`` of a graph built by
:func:`from_pyro_model` has ``fg.names[v] == <site name>`` (``fg.variable_id(name)`` goes
back). Variable ids follow the order of the latent sites in the model trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer.inspect import TrackProvenance, get_dependencies
from pyro.ops.provenance import get_provenance
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import biject_to, constraints, transform_to

from neuralblock.graph.factor_graph import FactorGraph
from neuralblock.graph.groups import FactorGroup, TableGroup
from neuralblock.graph.supports import base_support
from neuralblock.pyro.compile import (
    PyroGraph,
    Site,
    SiteLayout,
    _element_names,
    _skipped,
    compile_pyro_model,
    fixed_sites_at,
    is_all_discrete,
    replay_with_fixed_sites,
    site_values_to_state,
    state_to_site_values,
)
from neuralblock.replay import ReplayedFunction

__all__ = [
    "FactorGraphModel",
    "PyroModelGroup",
    "PyroTableGroup",
    "from_pyro_model",
    "samples_to_state",
    "state_to_samples",
    "to_pyro_model",
]


# ====================================================================== graph -> Pyro
class _Flat(dist.ImproperUniform):
    """Flat (log density 0) scalar distribution over a support that can draw reference points.

    ``sample`` returns ``transform_to(support)(u)`` with ``u ~ Uniform(-2, 2)``: a point in
    the support, so that Pyro's initialisation strategies (``init_to_uniform``, ...) work.
    It is *not* a draw from the graph's distribution.
    """

    def sample(self, sample_shape: Sequence[int] = torch.Size()) -> Tensor:  # noqa: B008
        shape = self.shape(sample_shape)
        with torch.no_grad():
            return transform_to(self.support)(torch.rand(shape) * 4 - 2)


class FactorGraphModel:
    """A Pyro model whose log density is ``fg.log_joint`` (no extra constants).

    Calling it (no arguments) samples one scalar site per latent variable, named
    ``fg.names[v]``: discrete variables from ``Categorical(logits=0).mask(False)`` (log
    density 0, enumerable), continuous ones from a flat ``ImproperUniform`` over their
    support. Evidence variables take their fixed values and are not sites. Then each
    factor group ``g`` adds ``pyro.factor(f"group_{g}", ...)``. The site values are
    broadcast together, so parallel enumeration and vectorized ``Predictive`` work.

    Prior draws of this model (``Predictive`` without ``posterior_samples``) are only
    reference points (uniform discrete values, uniform-in-unconstrained-space continuous
    values), not samples of the graph: the graph has no generative prior.

    Args:
        fg: the factor graph; evidence set on it later is honoured at each call.

    Example:
        >>> import torch
        >>> from pyro import poutine
        >>> fg = FactorGraph()
        >>> x, y = fg.add_variable("x"), fg.add_variable("y")
        >>> fg.add_linear_gaussian(y, [x], [1.0], 0.0, 1.0)
        0
        >>> model = FactorGraphModel(fg)
        >>> data = {"x": torch.tensor(0.5), "y": torch.tensor(1.0)}
        >>> trace = poutine.trace(poutine.condition(model, data)).get_trace()
        >>> bool(torch.isclose(trace.log_prob_sum(), fg.log_joint(torch.tensor([0.5, 1.0]))))
        True
    """

    def __init__(self, fg: FactorGraph) -> None:
        if not isinstance(fg, FactorGraph):
            raise TypeError(f"expected a FactorGraph, got {type(fg).__name__}")
        self.fg = fg

    def __call__(self) -> None:
        fg = self.fg
        cards = fg.cardinalities.tolist()
        evidence = fg.evidence
        dtype = torch.get_default_dtype()
        values: list[Tensor] = []
        for v, name in enumerate(fg.names):
            if v in evidence:
                values.append(torch.tensor(evidence[v]))
            elif cards[v] > 0:
                values.append(pyro.sample(name, dist.Categorical(logits=torch.zeros(cards[v])).mask(False)))
            else:
                value = pyro.sample(name, _Flat(fg.support(v), torch.Size(), torch.Size()))
                if value.is_floating_point():
                    dtype = torch.promote_types(dtype, value.dtype)
                values.append(value)
        if not values:
            return
        state = torch.stack(torch.broadcast_tensors(*[x.to(dtype) for x in values]), dim=-1)
        for g, group in enumerate(fg.groups):
            pyro.factor(f"group_{g}", group.log_factors(state).sum(-1))

    def __repr__(self) -> str:
        return f"FactorGraphModel({self.fg!r})"


def to_pyro_model(fg: FactorGraph) -> FactorGraphModel:
    """Turn a factor graph into a Pyro model with the identical log density.

    For any state, the trace of the model conditioned on the state's latent values has
    ``log_prob_sum() == fg.log_joint(state)``. The model is a picklable
    :class:`FactorGraphModel`; see it for the site layout. Discrete sites are enumerable
    (wrap with ``pyro.infer.config_enumerate`` for ``TraceEnum_ELBO``/``infer_discrete``);
    continuous sites work with ``NUTS``/``HMC``. Use :func:`samples_to_state` to map
    ``MCMC.get_samples()`` back to graph states.

    Args:
        fg: the factor graph.

    Returns:
        A callable Pyro model taking no arguments.

    Example:
        >>> import torch
        >>> fg = FactorGraph()
        >>> a = fg.add_variable("a", 3)
        >>> fg.add_table_factor([a], torch.tensor([0.0, 1.0, 2.0]))
        0
        >>> from pyro.infer import Predictive
        >>> Predictive(to_pyro_model(fg), num_samples=4)()["a"].shape
        torch.Size([4])
    """
    return FactorGraphModel(fg)


# ====================================================================== state <-> samples
def state_to_samples(fg: FactorGraph, state: Tensor) -> dict[str, Tensor]:
    """Split states ``[..., n]`` into ``{name: values [...]}`` for the latent variables.

    Discrete values come back as ``long`` (like Pyro's ``Categorical`` samples),
    continuous ones in the state's dtype; for a graph from :func:`from_pyro_model`, each
    value takes the dtype of its site (e.g. float for ``Bernoulli``), ready for
    ``poutine.condition``. Evidence variables are left out.

    Example:
        >>> fg = FactorGraph()
        >>> _ = fg.add_variable("a", 2), fg.add_variable("b")
        >>> state_to_samples(fg, torch.tensor([1.0, 0.5]))
        {'a': tensor(1), 'b': tensor(0.5000)}
    """
    state = fg.check_state(state)
    if isinstance(fg, PyroGraph):
        return state_to_site_values(fg, state)
    cards = fg.cardinalities.tolist()
    site_dtypes: dict[str, torch.dtype] = {}
    for group in fg.groups:
        source = group.evaluator if isinstance(group, PyroTableGroup) else group
        if isinstance(source, PyroModelGroup):
            site_dtypes.update(zip(source.latent_names, source.latent_dtypes))
    out: dict[str, Tensor] = {}
    for v, name in enumerate(fg.names):
        if v in fg.evidence:
            continue
        value = state[..., v].round().long() if cards[v] > 0 else state[..., v]
        out[name] = value.to(site_dtypes[name]) if name in site_dtypes else value
    return out


def samples_to_state(fg: FactorGraph, samples: Mapping[str, Tensor]) -> Tensor:
    """Stack ``{name: values [...]}`` (e.g. ``MCMC.get_samples()``) into states ``[..., n]``.

    Every latent variable must have an entry; evidence variables take their fixed
    values; entries that name no variable (e.g. deterministic sites) are ignored.
    Shapes are broadcast together.

    Example:
        >>> fg = FactorGraph()
        >>> _ = fg.add_variable("a", 2), fg.add_variable("b")
        >>> samples_to_state(fg, {"a": torch.tensor([0, 1]), "b": torch.tensor([0.5, 1.5])})
        tensor([[0.0000, 0.5000],
                [1.0000, 1.5000]])
    """
    if not isinstance(samples, Mapping):
        raise TypeError(f"samples must be a mapping from site names to tensors, got {type(samples).__name__}")
    if isinstance(fg, PyroGraph):
        shapes = [
            torch.as_tensor(samples[name]).shape[: -len(layout.shape) or None]
            for name, layout in fg.sites.items()
            if name in samples
        ]
        batch = torch.broadcast_shapes(*shapes) if shapes else torch.Size()
        return site_values_to_state(fg, samples, fg.initial_state().expand(batch + (fg.num_variables,)))
    missing = [name for v, name in enumerate(fg.names) if v not in fg.evidence and name not in samples]
    if missing:
        raise ValueError(f"samples lack the latent variables {missing}")
    dtype = torch.get_default_dtype()
    values = []
    for v, name in enumerate(fg.names):
        value = torch.tensor(fg.evidence[v]) if v in fg.evidence else torch.as_tensor(samples[name])
        if value.is_floating_point():
            dtype = torch.promote_types(dtype, value.dtype)
        values.append(value)
    if not values:
        return torch.zeros(0)
    return torch.stack(torch.broadcast_tensors(*[x.to(dtype) for x in values]), dim=-1)


# ====================================================================== Pyro -> graph
def _model_name(model: Callable[..., Any]) -> str:
    return getattr(model, "__qualname__", None) or type(model).__name__


NAN_TRACE_TRIES = 100
"""Prior draws :func:`from_pyro_model` tries for a trace whose log density is not NaN (as ``initialize_model``)."""


def _nan_sites(trace: poutine.Trace) -> list[str]:
    """The sample sites of a trace whose log density is NaN (the whole trace if none can be singled out)."""
    bad = []
    nodes: Mapping[str, Site] = trace.nodes
    for name, site in nodes.items():
        if _skipped(site):
            continue
        try:
            log_p = site["fn"].log_prob(site["value"])
        except Exception:  # noqa: BLE001 - a site that cannot be evaluated is reported by the checks after
            continue
        if torch.isnan(torch.as_tensor(log_p)).any():
            bad.append(name)
    return bad


def _check_observations(trace: poutine.Trace) -> None:
    """Every observed value lies in its distribution's support (an invalid one would score as garbage).

    Raises:
        ValueError: names the site, its first offending values and the support.
    """
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        if site.get("mask") is not None or (site.get("infer") or {}).get("_deterministic"):  # masked: not scored
            continue
        value, fn = torch.as_tensor(site["value"]), cast(Any, site["fn"])
        try:
            inside = torch.as_tensor(fn.support.check(value))
        except (NotImplementedError, RuntimeError, TypeError, ValueError):  # a support that cannot check this value
            continue
        if not bool(inside.all()):
            flat = value.reshape(-1)
            shown = flat[~inside.reshape(-1)][:3].tolist() if inside.numel() == flat.numel() else flat[:3].tolist()
            raise ValueError(
                f"observed site {name!r} has value(s) {shown} outside the support of its "
                f"{type(fn).__name__} ({fn.support})"
            )


def _defined_trace(model: Callable[..., Any], args: tuple, kwargs: dict) -> poutine.Trace:
    """A prior draw of the model whose log density is not NaN.

    The graph's structure does not depend on the traced values, but the checks that the model
    evaluates on a batch of states need a point where it is defined. Where the model gives NaN
    for some values (with Pyro's validation on, ``pyro.factor`` of a NaN raises instead), up to
    :data:`NAN_TRACE_TRIES` prior draws are tried, so that building the graph does not depend on
    the seed; a kernel's start is then its ``initial_params`` or a valid start the kernel finds
    (see :func:`~neuralblock.kernels.base.find_valid_start`), not this trace.

    Raises:
        ValueError: the model fails to trace even without validation, or every draw has a NaN (or,
            with validation, an invalid) log density; names the sites and how to avoid the region.
    """
    nan_trace, invalid = None, None
    for _ in range(NAN_TRACE_TRIES):
        try:
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        except Exception as err:
            if invalid is None:  # a validation error of this draw only if the model traces without validation
                try:
                    with pyro.validation_enabled(False):
                        poutine.trace(model).get_trace(*args, **kwargs)
                except Exception:  # noqa: BLE001 - the model's own error is the one to report
                    raise ValueError(f"model {_model_name(model)!r} failed to trace: {_error_text(err)}") from err
            invalid = err
            continue
        try:
            if not torch.isnan(torch.as_tensor(trace.log_prob_sum()).detach()):  # a float 0.0 without sites
                return trace
        except Exception:  # noqa: BLE001 - a failing log_prob is reported (with its site) by the checks after
            return trace
        nan_trace = trace
    if nan_trace is None:  # every draw failed validation: trace one without it, to name the sites
        with pyro.validation_enabled(False):
            nan_trace = poutine.trace(model).get_trace(*args, **kwargs)
    bad = _nan_sites(nan_trace)
    sites = f" (sites {bad[:5]})" if bad else ""
    why = f"; with validation: {_error_text(invalid).rstrip(':')}" if invalid is not None and not bad else ""
    raise ValueError(
        f"model {_model_name(model)!r} has a NaN log density at its traced values in all of "
        f"{NAN_TRACE_TRIES} prior draws{sites}{why}. NaN is not a density: give -inf where the model has "
        "zero density (e.g. torch.where(w > 0, torch.log(w), torch.tensor(-math.inf))) or a prior whose support "
        "avoids the region (e.g. a LogNormal for a positive site), then pass initial_params inside the region of "
        "positive density"
    )


def _error_text(err: Exception) -> str:
    """``Type: first line`` of an exception (Pyro appends multi-line trace shapes)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _contributes_nothing(site: Site) -> bool:
    """Observed sites whose log density is identically 0 (masked, or ``pyro.deterministic``)."""
    if site["mask"] is False or site["infer"].get("_deterministic", False):
        return True
    return isinstance(site["fn"], dist.MaskedDistribution) and site["fn"]._mask is False


def _base_fn(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def _check_plates(name: str, site: Site, latent: bool) -> int:
    """Validate the plates of a site (``latent``: a discrete latent one); returns its number of vectorized dims."""
    nesting = 0
    for frame in site["cond_indep_stack"]:
        if frame.full_size is not None and frame.size != frame.full_size:
            raise ValueError(
                f"site {name!r} is in the subsampled plate {frame.name!r} ({frame.size} of {frame.full_size}); "
                "subsampling makes the log density random and is not supported"
            )
        if frame.vectorized:
            if latent and frame.size != 1:
                raise ValueError(
                    f"discrete latent site {name!r} is inside the vectorized plate {frame.name!r} of size "
                    f"{frame.size} in a model with continuous latent sites; such a model compiles only scalar "
                    "discrete sites. Sample the plated discrete sites with GibbsKernel (or NeuralBlockKernel) inside "
                    "a CompoundKernel that gives the continuous sites to another kernel (each then sees the other's "
                    "sites as fixed), or write the plate as a Python loop"
                )
            nesting = max(nesting, -int(frame.dim))
    return nesting


def _latent_cardinality(name: str, site: Site) -> int:
    """0 for a continuous site, k for a discrete site with support 0..k-1."""
    fn = site["fn"]
    if type(_base_fn(fn)).__name__ == "Delta":
        raise ValueError(f"latent site {name!r} has a Delta distribution; use pyro.deterministic for derived values")
    support = fn.support
    if not support.is_discrete:
        return 0
    if not getattr(fn, "has_enumerate_support", False):
        raise ValueError(
            f"discrete latent site {name!r} ({type(_base_fn(fn)).__name__}) has no finite enumerable support; "
            "only supports 0..k-1 are supported"
        )
    values = fn.enumerate_support(expand=False).reshape(-1)
    k = int(values.numel())
    if k < 1 or not bool((values == torch.arange(k)).all()):
        raise ValueError(
            f"discrete latent site {name!r} has support {values.tolist()}; only supports 0..k-1 are supported"
        )
    return k


def _support_dependencies(model: Callable[..., Any], args: tuple, kwargs: dict, names: list[str]) -> dict[str, set]:
    """Latent sites that the support of each named site depends on (e.g. ``Uniform(0, x)``)."""
    with torch.random.fork_rng(), torch.no_grad(), pyro.validation_enabled(False), TrackProvenance():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    out: dict[str, set] = {}
    nodes: Mapping[str, Site] = trace.nodes
    for name in names:
        support = nodes[name]["fn"].support
        found: set = set()
        for value in vars(support).values():
            if isinstance(value, Tensor):
                found |= set(get_provenance(value))
        out[name] = found
    return out


class PyroModelGroup(FactorGroup):
    """Factors of a Pyro model: one per sample site, evaluated by re-running the model.

    Factor ``j`` is the (scaled, masked) log density of sample site ``factor_names[j]``;
    its scope is the site's variables (for a latent site) and its latent parents'.
    ``log_factors`` conditions the model on all latent sites at once, with a whole batch
    of states (values of shape ``[B, 1, ..., 1, *site shape]``, so that ``plate_nesting``
    dims sit right of the batch dim), and runs it once, whatever ``index`` asks for. Sites
    inside vectorized plates (or with batch dims of their own) are summed over those dims.
    The factor of a ``transform`` site (see :class:`~neuralblock.pyro.SiteLayout`) is the
    density of its unconstrained coordinates: it adds the transform's log-Jacobian.

    Args:
        model: the Pyro model (a module-level function, for pickling).
        args: positional arguments for the model.
        kwargs: keyword arguments for the model.
        latent_names: the latent sites.
        latent_dtypes: the dtype of each latent site's values (``long`` for ``Categorical``...).
        factor_names: the sample site of each factor.
        scopes: ``LongTensor [F, a]`` of variable ids, ``-1`` padded.
        plate_nesting: number of dims to keep to the right of the batch dim (vectorized plates
            and batch dims of sites); they are summed out of each site's log density.
        layouts: where each latent site's values live in the state (default: latent site ``v`` is
            the scalar variable ``v``).

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model():
        ...     x = pyro.sample("x", dist.Normal(0.0, 1.0))
        ...     pyro.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(0.5))
        >>> group = from_pyro_model(model).groups[0]
        >>> group.log_factors(torch.zeros(4, 1)).shape
        torch.Size([4, 2])
    """

    def __init__(
        self,
        model: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        latent_names: list[str],
        latent_dtypes: list[torch.dtype],
        factor_names: list[str],
        scopes: Tensor,
        plate_nesting: int = 0,
        layouts: list[SiteLayout] | None = None,
    ) -> None:
        scopes = torch.as_tensor(scopes, dtype=torch.long)
        if scopes.dim() != 2 or scopes.shape[0] != len(factor_names):
            raise ValueError(f"scopes must be [{len(factor_names)}, a], got {tuple(scopes.shape)}")
        if len(latent_dtypes) != len(latent_names):
            raise ValueError(f"{len(latent_names)} latent names but {len(latent_dtypes)} dtypes")
        self.model, self.args, self.kwargs = model, tuple(args), dict(kwargs)
        self.latent_names = list(latent_names)
        self.latent_dtypes = list(latent_dtypes)
        self.factor_names = list(factor_names)
        self.scopes = scopes
        self.plate_nesting = int(plate_nesting)
        if layouts is None:  # one scalar variable per latent site, ids in order
            layouts = [
                SiteLayout(name, torch.tensor(v), 0 if dtype.is_floating_point else 1, dtype)
                for v, (name, dtype) in enumerate(zip(self.latent_names, self.latent_dtypes))
            ]
        self.layouts = {layout.name: layout for layout in layouts}
        self._last_flat: Tensor | None = None
        self._replays: dict[tuple[str, ...], ReplayedFunction] = {}

    def _site_value(self, layout: SiteLayout, flat: Tensor) -> Tensor:
        """A site's values for a batch of states ``[B, n]``: ``[B, 1, ..., 1, *site shape]`` (plates aligned)."""
        batch = flat.shape[0]
        value = layout.values(flat)
        if layout.cardinality > 0 and not layout.one_hot:
            value = value.round()
        batch_dims = len(layout.shape) - layout.event_dim
        value = value.reshape((batch,) + (1,) * (self.plate_nesting - batch_dims) + tuple(layout.shape))
        return value.to(layout.dtype)

    def log_jacobian(self, flat: Tensor, name: str) -> Tensor:
        """``log |det d value / d u|`` ``[B]`` of a ``transform`` site at the states ``flat [B, n]`` (else 0)."""
        layout = self.layouts.get(name)
        if layout is None or layout.transform is None:
            return flat.new_zeros(flat.shape[0])
        u = flat[:, layout.ids]
        ladj = layout.transform.log_abs_det_jacobian(u, layout.transform(u))
        return ladj.reshape(flat.shape[0], -1).sum(-1)

    def _run(self, flat: Tensor) -> poutine.Trace:
        data = {name: self._site_value(layout, flat) for name, layout in self.layouts.items()}
        name = _model_name(self.model)
        try:  # as in Pyro's MCMC (validation off): a NaN or out-of-support value gives a NaN or -inf density
            with pyro.validation_enabled(False):
                trace = poutine.trace(poutine.condition(self.model, data=data)).get_trace(*self.args, **self.kwargs)
        except Exception as err:
            raise ValueError(
                f"model {name!r} cannot be evaluated on a batch of states: {_error_text(err)}; "
                "write it with tensor ops (e.g. torch.where instead of Python if on sample values)"
            ) from err
        for site_name, site in trace.nodes.items():
            if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site):
                raise ValueError(
                    f"model {name!r} sampled site {site_name!r} that is not a variable of the graph; "
                    "models whose set of latent sites changes (dynamic structure) are not supported"
                )
        return trace

    def _site_log_prob(self, trace: poutine.Trace, name: str, batch: int) -> Tensor:
        nodes: Mapping[str, Site] = trace.nodes
        site = nodes.get(name)
        if site is None or site["type"] != "sample":
            raise ValueError(f"sample site {name!r} is missing when the model is re-run on a batch of states")
        try:
            log_p = site["fn"].log_prob(site["value"])
        except Exception as err:
            raise ValueError(
                f"site {name!r} of model {_model_name(self.model)!r} cannot be evaluated on a batch of states: "
                f"{_error_text(err)}; its shapes must broadcast over a leading batch dimension"
            ) from err
        log_p = torch.as_tensor(scale_and_mask(log_p, site["scale"], site["mask"]))
        keep = self.plate_nesting + 1
        if log_p.dim() > keep:
            raise ValueError(
                f"site {name!r} has log_prob of shape {tuple(log_p.shape)} on a batch of {batch} states; "
                f"expected [{batch}] (plus plate dims): a site's shape must not depend on the batch"
            )
        log_p = log_p.reshape((1,) * (keep - log_p.dim()) + tuple(log_p.shape))
        if self.plate_nesting:
            log_p = log_p.sum(tuple(range(1, keep)))
        if log_p.shape[0] not in (1, batch):
            raise ValueError(
                f"site {name!r} has log_prob of shape {tuple(log_p.shape)} on a batch of {batch} states; "
                f"expected [{batch}]"
            )
        return log_p.expand(batch)

    def log_factors(self, state: Tensor, index: Tensor | None = None) -> Tensor:
        batch_shape = state.shape[:-1]
        flat = state.reshape(math.prod(batch_shape), state.shape[-1])
        if not self.factor_names:
            return state.new_zeros(batch_shape + (0,))
        replay, fixed = replay_with_fixed_sites(
            self._replays, self.model, self._all_factors, f"the log density of model {_model_name(self.model)!r}"
        )
        out = replay(flat, *fixed)
        if index is not None:
            out = out[:, index.reshape(-1)]
        return out.to(state.dtype).reshape(batch_shape + (out.shape[-1],))

    def _all_factors(self, flat: Tensor, *fixed: Tensor) -> Tensor:
        """Every factor ``[B, F]`` at the states ``flat``, with the model's fixed sites at ``fixed`` (sorted names).

        The function a :class:`~neuralblock.replay.ReplayedFunction` records: the conditioned
        values are its inputs (they change between a compound sampler's updates), not constants.
        """
        with fixed_sites_at(self.model, fixed):
            trace = self._run(flat)
        batch = flat.shape[0]
        out = []
        with pyro.validation_enabled(False):  # as the run: out-of-support values give -inf or NaN (rejected)
            for name in self.factor_names:
                log_p = self._site_log_prob(trace, name, batch)
                if name in self.layouts and self.layouts[name].transform is not None:  # density of u, not the value
                    log_p = log_p + self.log_jacobian(flat, name).to(log_p)
                out.append(log_p)
        return torch.stack(out, dim=-1)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_replays"] = {}  # recorded graphs hold closures: recorded again after unpickling
        return state


MAX_TABLE_ENTRIES = 1024
"""Discrete sites whose factor has at most this many entries become table factors."""


class PyroTableGroup(TableGroup):
    """Factors of discrete Pyro sites as log-tables, tabulated by re-running the model.

    Each factor belongs to one scalar discrete site whose latent parents are discrete; its
    table's axes are the parents (by variable id) and then the site's own variable, so a
    Bayesian network's conditional probability tables come out child-last. The model runs
    once per tabulation, on a batch with one row per (factor, parent assignment); the
    site's distribution in each row is evaluated at every value of the site.
    :meth:`refresh` re-tabulates in place, for a model whose other sites are conditioned
    on values that have changed (a compound sampler's global update).

    Args:
        evaluator: a :class:`PyroModelGroup` of the model (used to run it on a batch).
        rows: ``(site name, table scope)`` per factor; all scopes share one table shape.
        cardinalities: the domain size of each variable of the graph.
        reference: values of the latent variables that no table reads (e.g. the traced ones).
    """

    def __init__(
        self,
        evaluator: PyroModelGroup,
        rows: list[tuple[str, list[int]]],
        cardinalities: list[int],
        reference: Tensor,
    ) -> None:
        self.evaluator = evaluator
        self.site_names = [name for name, _ in rows]
        self.cardinalities = list(cardinalities)
        self.reference = reference
        scopes = torch.tensor([scope for _, scope in rows], dtype=torch.long)
        super().__init__(scopes, self._tabulate(scopes))

    def _tabulate(self, scopes: Tensor) -> Tensor:
        shape = [self.cardinalities[int(v)] for v in scopes[0]]
        num, arity, k = scopes.shape[0], scopes.shape[1], shape[-1]
        per_factor = math.prod(shape[:-1])
        codes = torch.arange(per_factor)
        assignment = torch.zeros(per_factor, arity - 1, dtype=self.reference.dtype)
        for axis in range(arity - 2, -1, -1):  # unravel, last parent fastest
            assignment[:, axis] = (codes % shape[axis]).to(self.reference.dtype)
            codes = codes // shape[axis]
        batch = self.reference.expand(num * per_factor, self.reference.shape[0]).clone()
        row = torch.arange(num).repeat_interleave(per_factor)
        batch[torch.arange(num * per_factor)[:, None], scopes[row, :-1]] = assignment.repeat(num, 1)
        trace = self.evaluator._run(batch)
        tables = torch.empty(num, per_factor, k, dtype=torch.get_default_dtype())
        nodes: Mapping[str, Site] = trace.nodes
        for f, name in enumerate(self.site_names):
            site = nodes[name]
            fn = site["fn"]
            values = torch.arange(k).reshape((k,) + (1,) * len(fn.batch_shape)).to(site["value"].dtype)
            log_p = torch.as_tensor(scale_and_mask(fn.log_prob(values), site["scale"], site["mask"]))
            log_p = log_p.reshape(k, -1).expand(k, num * per_factor)
            tables[f] = log_p[:, f * per_factor : (f + 1) * per_factor].T
        if torch.isnan(tables).any() or (tables == math.inf).any():
            bad = sorted(
                {self.site_names[int(f)] for f in torch.nonzero(torch.isnan(tables) | (tables == math.inf))[:, 0]}
            )
            raise ValueError(f"discrete sites {bad[:5]} have NaN or +inf log densities at some parent values")
        return tables.reshape([num] + shape)

    def refresh(self) -> None:
        """Re-tabulate in place (the model's conditioned values may have changed)."""
        self.log_tables.copy_(self._tabulate(self.scopes))

    def __getstate__(self) -> dict:
        return dict(vars(self))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._flat = self.log_tables.reshape(self.log_tables.shape[0], -1)  # a view again, for refresh()


def _observed_cardinality(site: Site) -> int:
    """``k`` for an observed scalar site with support ``0..k-1`` (its value in it), else 0."""
    fn, value = site["fn"], site["value"]
    if not isinstance(value, Tensor) or value.shape != () or tuple(fn.batch_shape) or tuple(fn.event_shape):
        return 0
    if not fn.support.is_discrete:
        return 0
    try:
        card = _latent_cardinality("", site)
    except ValueError:
        return 0
    return card if float(value) == int(value) and 0 <= int(value) < card else 0


def _table_scope(
    fg: FactorGraph, name: str, scope: list[int], observed_cards: dict[str, int], trace: poutine.Trace
) -> list[int] | None:
    """The table scope (parents, then the site's variable) of a factor to tabulate, else ``None``.

    A factor is tabulated when its site is scalar and discrete (latent, or observed with a
    value in ``0..k-1``: it then becomes an evidence variable named like the site), sits in
    no vectorized plate, has only discrete latent parents and at most
    :data:`MAX_TABLE_ENTRIES` entries.
    """
    nodes: Mapping[str, Site] = trace.nodes
    site = nodes[name]
    if any(frame.vectorized for frame in site["cond_indep_stack"]):
        return None
    if site["is_observed"]:
        card, parents = observed_cards.get(name, 0), scope
    else:
        card, parents = fg.cardinality(scope[0]), scope[1:]
    if card == 0 or any(fg.cardinality(v) == 0 for v in parents):
        return None
    if card * math.prod(fg.cardinality(v) for v in parents) > MAX_TABLE_ENTRIES:
        return None
    if site["is_observed"]:
        own = fg.add_variable(name, card)
        fg.set_evidence({own: float(site["value"])})
    else:
        own = scope[0]
    return sorted(parents) + [own]


def from_pyro_model(model: Callable[..., Any], *args: Any, **kwargs: Any) -> FactorGraph:
    """Build a factor graph from a Pyro model with scalar latent sites.

    The model is traced once. Each latent sample site (not observed, not a plate's
    subsample site, not deterministic) becomes a variable named like the site, in trace
    order: discrete if its support is ``0..k-1`` (``Categorical``, ``Bernoulli``,
    ``Binomial`` with fixed ``total_count``...), continuous with the site's support
    otherwise. Each sample site (latent, observed, or ``pyro.factor``) becomes one factor
    whose scope is the site's variable (if latent) plus its latent parents, taken from
    ``pyro.infer.inspect.get_dependencies`` — so Markov blankets, scaffolds and colourings
    of the graph are the model's true ones. Observed sites without latent parents become
    scope-less constant factors, so ``fg.log_joint(state)`` equals the model's
    ``trace.log_prob_sum()`` exactly. All factors live in one :class:`PyroModelGroup`,
    which re-runs the model once per evaluation, on the whole batch of states.

    Mapping: ``fg.names[v]`` is the site of variable ``v``, ``fg.variable_id(site)`` the
    way back; :func:`state_to_samples` / :func:`samples_to_state` convert whole states.

    The model must evaluate on a batch of states: sample values of shape ``[B]`` (or
    ``[B, 1, ..., 1]`` with vectorized plates) must flow through it with tensor ops.
    Observed sites may be non-scalar or sit in vectorized plates (their log densities are
    summed). In a model with continuous latent sites, discrete latent sites must be scalar;
    continuous ones may have any shape (see :class:`~neuralblock.pyro.SiteLayout`: one
    variable per element, or the unconstrained coordinates of ``biject_to(support)`` with the
    log-Jacobian in the site's factor), and the graph is a :class:`PyroGraph`.

    Args:
        model: a Pyro model; a module-level function if the graph must pickle.
        *args: positional arguments for the model.
        **kwargs: keyword arguments for the model.

    Returns:
        The factor graph (no evidence: observations are part of the factors).

    Raises:
        TypeError: if ``model`` is not callable.
        ValueError: if the model fails to trace, has a discrete latent site that is not scalar
            or sits in a vectorized plate of size > 1 next to continuous sites, has a discrete support other than
            ``0..k-1`` or a support that depends on other latent sites, uses subsampling,
            or cannot be evaluated on a batch of states.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def chain():
        ...     x = pyro.sample("x0", dist.Categorical(torch.tensor([0.5, 0.5])))
        ...     for t in range(1, 3):
        ...         x = pyro.sample(f"x{t}", dist.Categorical(torch.tensor([[0.9, 0.1], [0.2, 0.8]])[x]))
        >>> fg = from_pyro_model(chain)
        >>> fg.names, fg.markov_blanket(fg.variable_id("x1"))
        (['x0', 'x1', 'x2'], [0, 2])
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    trace = _defined_trace(model, args, kwargs)
    _check_observations(trace)
    if is_all_discrete(trace):
        return compile_pyro_model(model, args, kwargs)

    latent: list[str] = []
    layouts: list[SiteLayout] = []
    supports: list[list[constraints.Constraint]] = []
    factor_names: list[str] = []
    observed_cards: dict[str, int] = {}
    nesting = 0
    num_latent = 0
    nodes: Mapping[str, Site] = trace.nodes
    for name, site in nodes.items():
        if _skipped(site):
            continue
        is_latent = not site["is_observed"]
        discrete = is_latent and site["fn"].support.is_discrete
        nesting = max(nesting, _check_plates(name, site, discrete))
        if not is_latent:
            if _contributes_nothing(site):
                continue
            # an observed site with batch dims outside plates (e.g. obs of shape [N]) needs them kept too
            try:
                log_p = site["fn"].log_prob(site["value"])
            except Exception as err:
                raise ValueError(f"log_prob of observed site {name!r} failed: {_error_text(err)}") from err
            nesting = max(nesting, torch.as_tensor(log_p).dim())
            factor_names.append(name)
            card = _observed_cardinality(site)
            if card:
                observed_cards[name] = card
            continue
        fn, value = site["fn"], site["value"]
        shape = tuple(value.shape) if isinstance(value, Tensor) else None
        if discrete and (shape != () or tuple(fn.batch_shape) != () or tuple(fn.event_shape) != ()):
            raise ValueError(
                f"discrete latent site {name!r} has value shape {shape}, batch shape {tuple(fn.batch_shape)} and "
                f"event shape {tuple(fn.event_shape)}; in a model with continuous latent sites, discrete latent "
                "sites must be scalar. Sample plated discrete sites with GibbsKernel (or NeuralBlockKernel) inside "
                "a CompoundKernel that gives the continuous sites to another kernel: each kernel then sees the "
                "other's sites as fixed, and the discrete part compiles into vectorized tables"
            )
        if discrete:
            layout = SiteLayout(name, torch.tensor(num_latent), _latent_cardinality(name, site), value.dtype)
            site_supports = [fn.support]
        else:
            _latent_cardinality(name, site)  # refuses Delta sites
            nesting = max(nesting, len(fn.batch_shape))
            layout, site_supports = _continuous_layout(name, fn, value, num_latent)
        num_latent += len(site_supports)
        layouts.append(layout)
        supports.append(site_supports)
        latent.append(name)
        factor_names.append(name)

    try:
        # {site: {upstream site: ...}} (Pyro types the result as dict[str, object])
        deps = cast(Mapping[str, Mapping[str, Any]], get_dependencies(model, args, kwargs)["prior_dependencies"])
        support_deps = _support_dependencies(model, args, kwargs, latent)
    except Exception as err:
        raise ValueError(f"dependency analysis of model {_model_name(model)!r} failed: {_error_text(err)}") from err
    site_ids = {layout.name: layout.ids.reshape(-1).tolist() for layout in layouts}
    for name in latent:
        bad = sorted(support_deps[name] & site_ids.keys())
        if bad:
            raise ValueError(
                f"the support of latent site {name!r} depends on the latent sites {bad}; "
                "supports must be fixed (e.g. not Uniform(0, x) or Binomial(total_count=x))"
            )

    scopes: list[list[int]] = []
    for f, name in enumerate(factor_names):
        if name in deps:
            parents = {v for u in deps[name] if u in site_ids and u != name for v in site_ids[u]}
        else:  # a site get_dependencies skips (e.g. an observed Delta): all earlier latents, conservatively
            parents = {v for u in factor_names[:f] if u in site_ids for v in site_ids[u]}
        own = site_ids.get(name, [])
        scopes.append(own + sorted(parents))
    fg = PyroGraph()
    for layout, site_supports in zip(layouts, supports):
        if layout.cardinality > 0:
            fg.add_variable(layout.name, layout.cardinality)
            continue
        prefix = layout.name if layout.transform is None else f"{layout.name}:u"
        for element, support in zip(_element_names(prefix, layout.ids.shape), site_supports):
            fg.add_variable(element, support=support)
    fg.sites = {layout.name: layout for layout in layouts}
    dtypes = [layout.dtype for layout in layouts]
    empty = torch.zeros(0, 0, dtype=torch.long)
    evaluator = PyroModelGroup(model, args, kwargs, latent, dtypes, [], empty, nesting, layouts)
    tables: dict[tuple[int, ...], list[tuple[str, list[int]]]] = {}
    rest_names, rest_scopes = [], []
    for name, scope in zip(factor_names, scopes):
        table_scope = _table_scope(fg, name, scope, observed_cards, trace)
        if table_scope is None:
            rest_names.append(name)
            rest_scopes.append(scope)
            continue
        shape = tuple(fg.cardinality(v) for v in table_scope)
        tables.setdefault(shape, []).append((name, table_scope))
    width = max((len(s) for s in rest_scopes), default=0)
    scope_tensor = torch.tensor([s + [-1] * (width - len(s)) for s in rest_scopes], dtype=torch.long)
    scope_tensor = scope_tensor.reshape(len(rest_scopes), width)
    group = PyroModelGroup(model, args, kwargs, latent, dtypes, rest_names, scope_tensor, nesting, layouts)
    dtype = torch.get_default_dtype()
    traced = {name: nodes[name]["value"].detach() for name in latent}
    reference = site_values_to_state(fg, traced, torch.zeros(num_latent, dtype=dtype)) if latent else None
    if reference is None:
        reference = torch.zeros(0, dtype=dtype)
    table_groups = [PyroTableGroup(evaluator, rows, fg.cardinalities.tolist(), reference) for rows in tables.values()]

    # Check once that the model evaluates on a batch of states and agrees with the trace.
    expected = torch.as_tensor(trace.log_prob_sum()).detach()  # a float 0.0 without sites
    full = fg.initial_state().expand(3, fg.num_variables).clone()
    full[:, :num_latent] = reference
    batch = reference.expand(3, num_latent)
    jacobian = sum((group.log_jacobian(batch, name) for name in latent), torch.zeros(3, dtype=expected.dtype))
    got = group.log_factors(batch).sum(-1).detach().to(expected.dtype) - jacobian.detach().to(expected.dtype)
    for table in table_groups:
        got = got + table.log_factors(full).sum(-1).to(expected.dtype)
    close = torch.isclose(got, expected.expand_as(got), rtol=1e-4, atol=1e-4) | (got == expected)
    if not bool(close.all()):
        raise ValueError(
            f"model {_model_name(model)!r} gives a different log density on a batch of states "
            f"({got.tolist()}) than on one state ({float(expected)}); its sites must broadcast over a "
            "leading batch dimension"
        )
    if group.num_factors:
        fg.add_group(group)
    for table in table_groups:
        fg.add_group(table)
    return fg


def _elementwise(support: constraints.Constraint) -> constraints.Constraint | None:
    """The per-element support of a continuous site, if its support acts element by element, else ``None``.

    ``independent(positive, 1)`` gives ``positive``; a simplex, an ordered vector, a Cholesky
    factor or an interval whose bounds differ between elements give ``None``.
    """
    base = base_support(support)
    if base.is_discrete or base.event_dim != 0:
        return None
    bounds = [value for value in vars(base).values() if isinstance(value, Tensor)]
    if any(bound.numel() != 1 for bound in bounds):
        return None
    return base


def _continuous_layout(
    name: str, fn: Any, value: Tensor, first: int
) -> tuple[SiteLayout, list[constraints.Constraint]]:
    """A continuous site's layout (variable ids from ``first``) and the support of each of its variables.

    A site whose support acts element by element gets one variable per element, with that
    support (RandomWalkMH walks each in its unconstrained space, with the Jacobian); any other
    (a ``Dirichlet``'s simplex, ...) gets one real variable per unconstrained coordinate of
    ``biject_to(support)``, and its factor adds the log-Jacobian.
    """
    shape = value.shape
    event_dim = len(fn.event_shape)
    base = fn.support if len(shape) == 0 else _elementwise(fn.support)
    if base is not None:
        count = max(1, math.prod(shape))
        ids = torch.arange(first, first + count).reshape(shape)
        return SiteLayout(name, ids, 0, value.dtype, event_dim=event_dim), [base] * count
    transform = biject_to(fn.support)
    coords = torch.Size(transform.inverse_shape(shape))
    count = math.prod(coords)
    ids = torch.arange(first, first + count).reshape(coords)
    layout = SiteLayout(name, ids, 0, value.dtype, transform=transform, value_shape=shape, event_dim=event_dim)
    return layout, [constraints.real] * count
