"""The direct likelihood path: a Pyro model's section terms compiled once, evaluated without Pyro runs.

A model run through :class:`~neuralblock.pyro.sections.SectionEvaluator` costs a Pyro trace per call
(messengers, site dictionaries, distribution constructors): on a mini-batch of 100 sections about
90% of the time is that framework overhead. :class:`DirectPath` traces the evaluator's run *once*
per input layout with ``torch.fx.experimental.proxy_tensor.make_fx`` (which records the tensor
operations the run performs, whatever Python wrote them) and replays the recorded graph on new
parameter values and index sets:

* ``P`` parameter points (``θ`` and ``θ'``, a control-variate point, ``K`` chains) are one call:
  a model that broadcasts a leading batch dimension is traced batched, any other one (e.g. the
  ``X[idx] @ w`` idiom) under ``torch.func.vmap``;
* index sets are padded to a few bucket sizes (powers of two), so one graph serves every
  mini-batch size of a sequential test;
* a model that ignores the plate's indices (``obs=y`` on the whole data) is traced at full size
  and its data-sized inputs are re-indexed by the drawn sections (each tensor with exactly one
  dimension of the plate's size gets an ``index_select``), so it too costs O(k) per call;
* every graph is checked against the Pyro run at a second parameter value and index set before
  it is used; a graph that disagrees (data-dependent Python control flow, randomness inside the
  model) is not used, and the evaluator falls back to Pyro runs with a warning naming the reason;
* graphs are shared between evaluators of the same model on the same data (the same function and
  argument objects, unmodified): a new kernel on a model that an earlier one compiled checks the
  earlier graphs against its own Pyro runs instead of tracing them again (:func:`shared_graphs`).

Subgraphs that do not depend on the inputs (prior constants, ``log σ`` of fixed scales, copies of
constants) are folded once, and identity views are dropped, so a call does about the operations a
hand-written likelihood would.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> X, y = torch.randn(1000, 3), torch.randint(0, 2, (1000,)).float()
    >>> def model():
    ...     w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    ...     with pyro.plate("data", 1000) as idx:
    ...         pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])
    >>> log_lik = LogLikelihood(model)
    >>> log_lik({"w": torch.zeros(4, 3)}, torch.tensor([5, 7])).shape
    torch.Size([4, 2])
"""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import pyro
import torch
from pyro import poutine
from torch import Tensor

from neuralblock.pyro.sections import SectionEvaluator, SectionTerms, is_subsample_site, site_plate_frame
from neuralblock.replay import (
    FusedPotential,
    _aten,
    _shape,
    copy_graph,
    fast_call,
    fast_targets,
    record_graph,
    recording_failure,
    simplify_graph,
)

__all__ = ["CompileError", "DirectPath", "LogLikelihood", "bucket_size", "shared_graphs"]

_MIN_BUCKET = 16
_CHECK_RTOL, _CHECK_ATOL = 1e-4, 1e-4
_BUILTIN_TYPES = ("builtin_function_or_method", "method_descriptor")
_SHARED_MODELS = 4  # models (with their data) whose graphs are kept for new evaluators, least recently used dropped
_SHARED_MAX_BYTES = 1 << 30  # a model whose data tensors take more is not kept (its graphs would hold them alive)


class CompileError(ValueError):
    """A model whose section terms cannot be compiled into a direct graph (the message says why)."""


def bucket_size(k: int, num_sections: int) -> int:
    """The padded size of an index set of ``k`` sections: the next power of two (at least 16), at most ``N``.

    Example:
        >>> bucket_size(100, 10_000), bucket_size(9_000, 10_000), bucket_size(3, 10_000)
        (128, 9000, 16)
    """
    size = max(_MIN_BUCKET, 1 << max(k - 1, 0).bit_length())
    return k if size >= num_sections else size


class _SharedGraphs(NamedTuple):
    owners: tuple[Any, ...]  # the model and the objects its key names by id, kept alive so no other object takes an id
    graphs: dict[tuple, Callable[..., tuple[Tensor, Tensor]]]


_SHARED: OrderedDict[tuple, _SharedGraphs] = OrderedDict()
# a graph's request: batch and shared site names, their values, the index bucket, whether the global term, the points
_Request = tuple[tuple[str, ...], tuple[str, ...], list[Tensor], list[Tensor], int | None, bool, int | None]


def shared_graphs(clear: bool = False) -> int:
    """How many graphs are kept for new evaluators (all of them dropped first with ``clear=True``).

    A :class:`DirectPath` that needs a graph first looks for one built by an evaluator of the same
    model on the same data: the same model function, the same argument objects (tensors, or ``None``,
    numbers and strings) unmodified since (their version counters), the same tensors in the model's
    globals and closure and in Pyro's parameter store, the same plate, local dims and input layout; the
    model must be a plain function (a module's or a bound method's state can change unseen). Such a
    graph is used only after it passes the new evaluator's own check against Pyro runs; one that fails
    it is traced anew. Graphs of the last few models are kept (the model and its data with them); a
    model with other arguments (lists, arrays, objects that can change without a version counter) is
    never shared.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> y = torch.randn(50)
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> _ = shared_graphs(clear=True)
        >>> first = LogLikelihood(model, y)({"mu": torch.zeros(2)}, torch.tensor([1, 2]))
        >>> built = shared_graphs()
        >>> again = LogLikelihood(model, y)({"mu": torch.zeros(2)}, torch.tensor([1, 2]))
        >>> shared_graphs() == built > 0, torch.equal(first, again)
        (True, True)
    """
    if clear:
        _SHARED.clear()
    return sum(len(entry.graphs) for entry in _SHARED.values())


def _sharing_key(evaluator: SectionEvaluator) -> tuple[tuple, tuple[Any, ...]] | None:
    """``(key, owners)`` naming the evaluator's model and data by identity and version, or ``None`` if not shareable."""
    model = evaluator.model
    if not isinstance(model, types.FunctionType):  # a module or bound method: its state can change unseen
        return None
    named: list[tuple[str, Any]] = [(f"arg{k}", v) for k, v in enumerate(evaluator.args)]
    named += [(f"kw:{k}", v) for k, v in evaluator.kwargs.items()]
    code, scope = model.__code__, model.__globals__  # the tensors the model's own code reads from globals and closure
    named += [(f"global:{n}", scope[n]) for n in code.co_names if isinstance(scope.get(n), Tensor)]
    cells = [(n, _cell(c)) for n, c in zip(code.co_freevars, model.__closure__ or (), strict=False)]
    named += [(f"cell:{n}", value) for n, value in cells if isinstance(value, Tensor)]
    named += [(f"param:{n}", v) for n, v in pyro.get_param_store().named_parameters()]  # pyro.params it may read
    parts: list[tuple[Any, ...]] = []
    owners: list[Any] = [model]
    size = 0
    for name, value in named:
        if isinstance(value, Tensor):
            try:
                version = value._version
            except RuntimeError:  # an inference-mode tensor has no version counter
                return None
            parts.append((name, id(value), version))
            owners.append(value)
            size += value.numel() * value.element_size()
        elif value is None or isinstance(value, bool | int | float | str):
            parts.append((name, type(value), value))
        else:
            return None
    if size > _SHARED_MAX_BYTES:
        return None
    local = tuple(sorted(evaluator.local_dims.items()))
    return (id(model), evaluator.plate, evaluator.num_sections, local, evaluator.validate, *parts), tuple(owners)


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


class DirectPath:
    """Compiled section terms of a :class:`SectionEvaluator`: ``(batch, shared, idx) -> SectionTerms``.

    One graph per input layout (site names and shapes, number of points, index bucket, whether the
    global term is wanted), built at its first use and checked against the Pyro run.

    Args:
        evaluator: the evaluator whose runs are compiled (its model, plate, arguments, local dims).
    """

    def __init__(self, evaluator: SectionEvaluator) -> None:
        self.evaluator = evaluator
        self.failure: str | None = None  # why compilation was given up (then every call raises CompileError)
        self.plain = False  # the model ignores the plate's indices: graphs re-index its data-sized inputs
        self._graphs: dict[tuple, Callable[..., tuple[Tensor, Tensor]]] = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_graphs"] = {}  # graphs hold closures; they are rebuilt after unpickling
        return state

    # -- calls -------------------------------------------------------------------------------
    def terms(
        self,
        batch: dict[str, Tensor],
        shared: dict[str, Tensor],
        idx: Tensor | None,
        with_global: bool = True,
        points: int | None = None,
    ) -> SectionTerms:
        """Global term(s) and per-section terms, as :meth:`SectionEvaluator.evaluate_many` (or ``evaluate``).

        Args:
            batch: ``{site: [P, *shape]}`` values that differ between the ``points`` (empty if ``points`` is None).
            shared: values shared by every point (full size for local latent sites).
            idx: ``LongTensor [k]`` of sections, or ``None`` for all ``N``.
            with_global: also compute the global term(s) (else they are 0).
            points: ``P``, or ``None`` for one unbatched point.

        Raises:
            CompileError: the model cannot be compiled (:attr:`failure` says why).
        """
        if self.failure is not None:
            raise CompileError(self.failure)
        n = self.evaluator.num_sections
        k = n if idx is None else idx.shape[0]
        size = None if idx is None else bucket_size(k, n)
        b_vals, s_vals = list(batch.values()), list(shared.values())
        shapes = tuple((v.shape, v.dtype) for v in b_vals) + tuple((v.shape, v.dtype) for v in s_vals)
        key = (*batch, None, *shared, shapes, points, size, with_global)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graph(key, (tuple(batch), tuple(shared), b_vals, s_vals, size, with_global, points))
            self._graphs[key] = graph
        if idx is None:
            return SectionTerms(*graph(*b_vals, *s_vals))
        if size is None or size == k:
            return SectionTerms(*graph(*b_vals, *s_vals, idx))
        glob, sections = graph(*b_vals, *s_vals, torch.cat([idx, idx[:1].expand(size - k)]))
        return SectionTerms(glob, sections[..., :k])

    # -- building ---------------------------------------------------------------------------
    def _graph(self, key: tuple, request: _Request) -> Callable[..., tuple[Tensor, Tensor]]:
        """The graph an evaluator of the same model and data built, if it passes this one's check; else a new one.

        ``request`` is :meth:`_build`'s arguments.
        """
        ev = self.evaluator
        sharing = _sharing_key(ev)
        if sharing is None:
            return self._build(*request)
        model_key, owners = sharing
        layout = (self.plain, ev.vectorized, ev._nesting, tuple(sorted(ev._event_dims.items())), *key)
        entry = _SHARED.get(model_key)
        graph = None if entry is None else entry.graphs.get(layout)
        if graph is not None:
            _SHARED.move_to_end(model_key)
            try:
                self._check(graph, *request)
                return graph
            except Exception:  # noqa: BLE001 - something the key cannot see changed (e.g. a helper's global): trace anew
                pass
        graph = self._build(*request)
        if entry is None:
            entry = _SHARED[model_key] = _SharedGraphs(owners, {})
            while len(_SHARED) > _SHARED_MODELS:
                _SHARED.popitem(last=False)
        entry.graphs[layout] = graph
        return graph

    def _build(
        self,
        b_names: tuple[str, ...],
        s_names: tuple[str, ...],
        b_vals: list[Tensor],
        s_vals: list[Tensor],
        size: int | None,
        with_global: bool,
        points: int | None,
    ) -> Callable[..., tuple[Tensor, Tensor]]:
        try:
            graph = self._trace(b_names, s_names, b_vals, s_vals, size, with_global, points)
        except CompileError as err:
            self.failure = str(err)
            raise
        except Exception as err:  # noqa: BLE001 - any tracing failure means "cannot compile", with its reason
            self.failure = recording_failure(err)
            raise CompileError(self.failure) from err
        return graph

    def _function(
        self, b_names: tuple[str, ...], s_names: tuple[str, ...], with_global: bool, points: int | None, full: bool
    ) -> Callable[..., tuple[Tensor, Tensor]]:
        """The evaluator's run as a function of flat tensors ``(*batch, *shared[, idx])``."""
        ev, nb = self.evaluator, len(b_names)
        batched = points is not None and ev.vectorized

        def run(*tensors: Tensor) -> tuple[Tensor, Tensor]:
            values = dict(zip(s_names, tensors[nb : nb + len(s_names)], strict=True))
            point = dict(zip(b_names, tensors[:nb], strict=True))
            idx = None if full or len(tensors) == nb + len(s_names) else tensors[-1]
            if batched:
                assert points is not None  # batched means a number of points
                values.update(ev._batched(point, points))
                terms = ev._run(values, idx, with_global, points)
            else:
                values.update(point)
                terms = ev._run(values, idx, with_global)
            return terms.global_term, terms.sections

        if points is None or batched:
            return run
        in_dims = (0,) * nb + (None,) * (len(s_names) + (0 if full else 1))
        return lambda *tensors: torch.func.vmap(run, in_dims=in_dims)(*tensors[: len(in_dims)])

    def _trace(
        self,
        b_names: tuple[str, ...],
        s_names: tuple[str, ...],
        b_vals: list[Tensor],
        s_vals: list[Tensor],
        size: int | None,
        with_global: bool,
        points: int | None,
    ) -> Callable[..., tuple[Tensor, Tensor]]:
        n = self.evaluator.num_sections
        inputs = [v.detach() for v in (*b_vals, *s_vals)]
        if size is None:  # all sections: one ordinary run
            gm = record_graph(self._function(b_names, s_names, with_global, points, True), *inputs)
            simplify_graph(gm)
        elif not self.plain:
            idx = _some_sections(n, size)
            gm = record_graph(self._function(b_names, s_names, with_global, points, False), *inputs, idx)
            simplify_graph(gm)
        else:  # trace at full size, then re-index every data-sized input by the placeholder idx
            fn = self._function(b_names, s_names, with_global, points, True)
            gm = record_graph(lambda *t: fn(*t[:-1]), *inputs, torch.arange(n))
            simplify_graph(gm)
            _subsample(gm, n, size, skip=len(b_vals))
        plain = copy_graph(gm)
        fast_targets(gm)
        graph = fast_call(gm)
        try:
            self._check(graph, b_names, s_names, b_vals, s_vals, size, with_global, points)
        except CompileError:  # keep the aten overloads the trace recorded
            graph = fast_call(plain)
            self._check(graph, b_names, s_names, b_vals, s_vals, size, with_global, points)
        return graph

    def _check(
        self,
        graph: Callable[..., tuple[Tensor, Tensor]],
        b_names: tuple[str, ...],
        s_names: tuple[str, ...],
        b_vals: list[Tensor],
        s_vals: list[Tensor],
        size: int | None,
        with_global: bool,
        points: int | None,
    ) -> None:
        """The graph must equal the Pyro run at the traced values and at other points and sections (twice)."""
        n = self.evaluator.num_sections
        trials = [list(b_vals)]
        if points is not None and points > 1:
            trials.append([v.roll(1, 0) for v in b_vals])
        for number, trial in enumerate(trials, start=1):  # other indices than the trace's
            idx = None if size is None else _some_sections(n, size, seed=number)
            with torch.no_grad():
                got = [graph(*trial, *s_vals, *(() if idx is None else (idx,))) for _ in range(2)]
                want = self._reference(dict(zip(b_names, trial)), dict(zip(s_names, s_vals)), idx, with_global, points)
            for g in got:
                for a, b in zip(g, want, strict=True):
                    if a.shape != b.shape or not torch.allclose(
                        a.double(), b.double(), rtol=_CHECK_RTOL, atol=_CHECK_ATOL, equal_nan=True
                    ):
                        raise CompileError(
                            "the compiled graph disagrees with the Pyro model's log density (data-dependent "
                            "control flow or randomness inside the model?)"
                        )

    def _reference(
        self,
        batch: dict[str, Tensor],
        shared: dict[str, Tensor],
        idx: Tensor | None,
        with_global: bool,
        points: int | None,
    ) -> tuple[Tensor, Tensor]:
        """The same terms from Pyro runs (one per point; a full run indexed when the model ignores indices)."""
        ev = self.evaluator
        rows = [{s: v[p] for s, v in batch.items()} for p in range(points)] if points is not None else [{}]
        out = []
        for row in rows:
            values = {**shared, **row}
            if idx is None or self.plain:
                terms = ev._run(values, None, with_global)
                terms = SectionTerms(terms.global_term, terms.sections if idx is None else terms.sections[idx])
            else:
                terms = ev._run(values, idx, with_global)
            out.append(terms)
        if points is None:
            return out[0].global_term, out[0].sections
        glob = torch.stack([t.global_term for t in out]) if with_global else torch.zeros(points)
        return glob, torch.stack([t.sections for t in out])


def _some_sections(num_sections: int, size: int, seed: int = 0) -> Tensor:
    """``size`` random section indices for tracing and checking a graph, from a private generator.

    Duplicates are allowed (a graph's terms do not depend on them), so this is O(size), not an
    O(N) permutation, and the user's random stream is left alone: graph builds do not shift the chain.
    """
    generator = torch.Generator().manual_seed(seed)
    if 4 * size >= num_sections:
        return torch.randperm(num_sections, generator=generator)[:size]
    return torch.randint(num_sections, (size,), generator=generator)


# -- graph passes ---------------------------------------------------------------------------------
def _subsample(gm: Any, num_sections: int, size: int, skip: int) -> None:
    """Re-index a full-size graph to ``size`` sections given by its last placeholder.

    Every constant and shared input with exactly one dimension of the plate's size ``N`` is
    ``index_select``-ed along it, and integer arguments equal to ``N`` (shapes of views, expands,
    factories) become ``size``. The first ``skip`` placeholders (the per-point values) are left alone.
    """
    aten = _aten()
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    idx_node = placeholders[-1]
    if idx_node.users:
        raise CompileError("the model reads the plate's indices but does not honour them")
    for node in [*placeholders[skip:-1], *(n for n in graph.nodes if n.op == "get_attr")]:
        tensor = getattr(gm, node.target) if node.op == "get_attr" else node.meta.get("val", None)
        if not isinstance(tensor, Tensor):
            continue
        dims = [d for d, s in enumerate(tensor.shape) if s == num_sections]
        if not dims:
            continue
        if len(dims) > 1:
            shape = tuple(tensor.shape)
            raise CompileError(f"a data tensor of shape {shape} has several dimensions of the plate's size")
        users = list(node.users)
        with graph.inserting_after(node):
            picked = graph.call_function(aten.index_select.default, (node, dims[0], idx_node))
        for user in users:
            user.replace_input_with(node, picked)

    def resize(arg: Any) -> Any:
        if isinstance(arg, int) and not isinstance(arg, bool) and arg == num_sections:
            return size
        if isinstance(arg, list | tuple):
            return type(arg)(resize(a) for a in arg)
        return arg

    for node in graph.nodes:
        if node.op == "call_function" and node.target is not aten.index_select.default:
            node.args = resize(node.args)
            node.kwargs = {k: resize(v) for k, v in node.kwargs.items()}
    for placeholder in placeholders[:skip]:
        point_shape = _shape(placeholder)
        if point_shape is not None and num_sections in point_shape:
            raise CompileError("a per-point parameter has a dimension of the plate's size")
    graph.lint()
    gm.recompile()


# -- the user-facing likelihood ---------------------------------------------------------------------
class LogLikelihood:
    """``log_lik(params [P, ...], idx) -> [P, len(idx)]``: the per-datum log-likelihood of a model's data plate.

    Traces the model once to find its data plate and global latent sites, then evaluates the
    per-section log-likelihoods (unscaled: the plate's subsampling factor is divided out, any other
    ``poutine.scale`` kept) through the direct path, at ``P`` points at once.

    Args:
        model: the Pyro model.
        *args: its positional arguments.
        plate: the data plate (default: the single plate of the observed sites).
        sites: the global sites given in ``params`` (default: every latent site outside the plate).
        strict: raise :class:`CompileError` if the model cannot be compiled (default); else fall back
            to one Pyro run per point and call, with a warning.
        **kwargs: its keyword arguments.

    Raises:
        ValueError: no single data plate, unknown sites, or latent sites inside the plate.
        CompileError: ``strict`` and the model cannot be compiled.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> y = torch.randn(100)
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> log_lik = LogLikelihood(model, y)
        >>> out = log_lik({"mu": torch.zeros(2)}, torch.tensor([0, 3]))
        >>> torch.allclose(out[0], dist.Normal(0.0, 1.0).log_prob(y[[0, 3]]))
        True
    """

    def __init__(
        self,
        model: Callable,
        *args: Any,
        plate: str | None = None,
        sites: list[str] | None = None,
        strict: bool = True,
        **kwargs: Any,
    ) -> None:
        trace = poutine.trace(model).get_trace(*args, **kwargs)
        nodes: list[Any] = [s for s in trace.nodes.values() if s["type"] == "sample"]  # Pyro's loosely typed sites
        plates = {s["name"]: s for s in nodes if is_subsample_site(s)}
        observed = [s for s in nodes if s["is_observed"] and s["name"] not in plates]
        if plate is None:
            found = {f.name for s in observed for f in s["cond_indep_stack"] if f.vectorized and f.name in plates}
            if len(found) != 1:
                raise ValueError(f"cannot tell the data plate (observed sites in plates {sorted(found)}); pass plate=")
            plate = found.pop()
        if plate not in plates:
            raise ValueError(f"plate {plate!r} is not a plate of the model; plates: {sorted(plates)}")
        latent = {s["name"]: s for s in nodes if not s["is_observed"] and s["name"] not in plates}
        inside = [name for name, s in latent.items() if site_plate_frame(s, plate) is not None]
        if inside:
            raise ValueError(f"latent sites {inside} lie inside plate {plate!r}; LogLikelihood needs them observed")
        self.sites = list(latent) if sites is None else list(sites)
        unknown = [s for s in self.sites if s not in latent]
        if unknown:
            raise ValueError(f"sites {unknown} are not latent sites of the model; latent: {sorted(latent)}")
        self.plate, self.num_sections = plate, int(plates[plate]["fn"].size)
        self.shapes = {s: latent[s]["value"].shape for s in self.sites}
        self.fixed = {s: v["value"].detach() for s, v in latent.items() if s not in self.sites}
        self.strict = strict
        self.evaluator = SectionEvaluator(model, plate, self.num_sections, args, kwargs)
        self.evaluator.check_lazy({**self.fixed, **{s: latent[s]["value"].detach() for s in self.sites}})
        trial = {s: torch.stack([latent[s]["value"].detach()] * 2) for s in self.sites}
        self.evaluator.check_vectorized(self.fixed, trial)
        if strict and self.evaluator.direct is None:
            raise CompileError(f"cannot compile the model's plate {plate!r}: {self.evaluator.direct_failure}")

    def terms(self, params: dict[str, Tensor], idx: Tensor | None, with_global: bool = False) -> SectionTerms:
        """Global terms ``[P]`` (log prior of the sites; 0 unless ``with_global``) and section terms ``[P, k]``.

        Args:
            params: ``{site: [P, *shape]}`` constrained values of :attr:`sites`.
            idx: ``LongTensor [k]`` of sections, or ``None`` for all ``N``.
            with_global: also compute the log prior of the global sites.
        """
        try:
            batch = {s: params[s] for s in self.sites}
        except KeyError as err:
            raise ValueError(f"params lack site {err.args[0]!r}; sites: {self.sites}") from None
        for s, v in batch.items():
            if v.shape[1:] != self.shapes[s]:
                raise ValueError(f"params[{s!r}] must have shape [P, *{tuple(self.shapes[s])}], got {tuple(v.shape)}")
        return self.evaluator.evaluate_many(self.fixed, batch, idx, with_global=with_global)

    def __call__(self, params: dict[str, Tensor], idx: Tensor | None = None) -> Tensor:
        """Per-datum log-likelihoods ``[P, len(idx)]`` (all ``N`` when ``idx`` is None)."""
        return self.terms(params, idx).sections

    def potential_fn(self, transforms: dict[str, Any] | None = None) -> Callable[[dict[str, Tensor]], Tensor]:
        """A Pyro HMC/NUTS ``potential_fn``: minus the log joint at unconstrained values (with log-Jacobians).

        Args:
            transforms: ``{site: constrained -> unconstrained}`` (default: ``biject_to(support).inv``).

        Example:
            >>> import pyro, pyro.distributions as dist, torch
            >>> def model(y):
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pyro.plate("data", len(y)):
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
            >>> potential = LogLikelihood(model, torch.zeros(3)).potential_fn()
            >>> round(float(potential({"mu": torch.tensor(0.0)})), 3)
            3.676
        """
        transforms = self.transforms() if transforms is None else transforms
        return self._fused(transforms, None, None)

    def transforms(self) -> dict[str, Any]:
        """``{site: biject_to(support).inv}`` of :attr:`sites` (constrained -> unconstrained)."""
        from torch.distributions import biject_to

        trace = poutine.trace(self.evaluator.model).get_trace(*self.evaluator.args, **self.evaluator.kwargs)
        nodes: dict[str, Any] = dict(trace.nodes)
        return {s: biject_to(nodes[s]["fn"].support).inv for s in self.sites}

    def weighted_potential_fn(
        self, indices: Tensor, weights: Tensor, transforms: dict[str, Any] | None = None
    ) -> Callable[[dict[str, Tensor]], Tensor]:
        """``potential_fn`` of the weighted model ``log p(θ) + Σ_j w_j log p(x_{i_j} | θ)`` (a coreset's).

        Args:
            indices: ``LongTensor [M]`` of sections.
            weights: ``[M]`` non-negative weights.
            transforms: as in :meth:`potential_fn`.
        """
        transforms = self.transforms() if transforms is None else transforms
        indices, weights = torch.as_tensor(indices, dtype=torch.long), torch.as_tensor(weights)
        return self._fused(transforms, weights, indices)

    def _fused(self, transforms: dict[str, Any], weights: Tensor | None, indices: Tensor | None) -> FusedPotential:
        potential = functools.partial(self._potential, transforms=transforms, weights=weights, indices=indices)
        return FusedPotential(potential, self.sites, f"the potential of plate {self.plate!r}'s model")

    def _potential(
        self, params: dict[str, Tensor], transforms: dict[str, Any], weights: Tensor | None, indices: Tensor | None
    ) -> Tensor:
        values, log_jacobian = {}, torch.zeros(())
        for s in self.sites:
            inv = transforms[s].inv
            u = params[s]
            values[s] = inv(u).unsqueeze(0)
            log_jacobian = log_jacobian + inv.log_abs_det_jacobian(u, values[s][0]).sum()
        terms = self.terms(values, indices, with_global=True)
        lik = terms.sections[0].sum() if weights is None else terms.sections[0] @ weights.to(terms.sections.dtype)
        return -(terms.global_term[0] + lik + log_jacobian)
