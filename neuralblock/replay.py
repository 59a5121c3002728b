"""Replaying a tensor function as a recorded graph: the shared fast path for Pyro model runs.

A Pyro model run costs a trace per call (messengers, site dictionaries, distribution
constructors, argument checks); the tensor arithmetic it does is often a tenth of that.
:class:`ReplayedFunction` records, once per input signature (shapes, dtypes, device), the
tensor operations a function performs with ``torch.fx.experimental.proxy_tensor.make_fx``,
folds what does not depend on the inputs, and replays the graph on new inputs. The graph
is checked against the function itself on the traced inputs and on the next calls with other
inputs; a function the recording cannot represent (data-dependent Python control flow,
randomness) falls back to plain calls with a warning that names the reason.

The graph passes (:func:`simplify_graph`, :func:`fast_call`) are shared with the direct
likelihood path of :mod:`neuralblock.pyro.likelihood`. :meth:`ReplayedFunction.call_numpy` runs
a recorded graph translated to NumPy (:mod:`neuralblock.replay_numpy`) where that is faster: on
tensors of a few hundred numbers, where torch's per-operation dispatch is most of the cost.

Example:
    >>> import torch
    >>> calls = []
    >>> def log_density(x, mu):
    ...     calls.append(1)
    ...     return torch.distributions.Normal(mu, 1.0, validate_args=False).log_prob(x).sum(-1)
    >>> fast = ReplayedFunction(log_density, "a normal log density", record_after=1)
    >>> x, mu = torch.zeros(4, 3), torch.ones(3)
    >>> bool(torch.allclose(fast(x, mu), log_density(x, mu)))
    True
    >>> _ = [fast(torch.randn(4, 3), mu) for _ in range(5)]
    >>> fast.verified, len(calls) < 12
    (True, True)
"""

from __future__ import annotations

import copy
import math
import operator
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from neuralblock.replay_numpy import numpy_graph, torch_dtype

__all__ = [
    "FusedPotential",
    "ReplayedFunction",
    "copy_graph",
    "fast_call",
    "fast_targets",
    "record_graph",
    "recording_failure",
    "simplify_graph",
]

_CHECK_RTOL, _CHECK_ATOL = 1e-4, 1e-4
_RECORDING: list[Any] = []  # the replayed functions being recorded now (innermost last)
_CPU = torch.device("cpu")


def _aten() -> Any:
    return torch.ops.aten


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val", None) if hasattr(node, "meta") else None
    if isinstance(val, Tensor):
        return tuple(val.shape)
    meta = node.meta.get("tensor_meta", None) if hasattr(node, "meta") else None
    return None if meta is None else tuple(meta.shape)


def _meta(node: Any) -> Any:
    return node.meta.get("val", None) if hasattr(node, "meta") else None


def _mutates(node: Any) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def simplify_graph(gm: Any, no_grad: bool = False) -> None:
    """Drop identity views, inverse permutes and ``select(unsqueeze(x, d), d, 0)``; fold input-free subgraphs;
    drop dead nodes; with ``no_grad`` (a graph only ever run without autograd) drop ``detach`` too.

    Shapes are fixed per recording, so ``zeros_like``/``ones_like``/``full_like`` of any node are constants
    (folded, with what only they feed, such as the seeds of a recorded backward pass). ``detach`` is the
    identity only where nothing differentiates through the graph: a graph that autograd may run keeps it.
    """
    aten = _aten()
    views = {aten.view.default, aten.expand.default, aten._unsafe_view.default, aten.reshape.default}
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if no_grad and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        elif (order := _permutation(node)) is not None and (inner := _permutation(node.args[0])) is not None:
            if [inner[i] for i in order] == list(range(len(order))):  # the two permutes undo each other
                node.replace_all_uses_with(node.args[0].args[0])
                gm.graph.erase_node(node)
        elif node.target in views and isinstance(node.args[0], type(node)):
            before, after = _shape(node.args[0]), _shape(node)
            if before is not None and before == after:
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
        elif node.target is aten.select.int and tuple(node.args[1:]) in {(0, 0), (1, 0)}:
            src = node.args[0]
            if (
                isinstance(src, type(node))
                and src.op == "call_function"
                and src.target is aten.unsqueeze.default
                and src.args[1] == node.args[1]
            ):
                node.replace_all_uses_with(src.args[0])
                gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    _fold_constants(gm)
    _drop_neutral(gm)
    _pick_stacked(gm)
    _merge_duplicates(gm)
    _drop_unused(gm)
    gm.recompile()


def _drop_neutral(gm: Any) -> None:
    """Drop arithmetic with a neutral constant: ``x - 0``, ``x * 1``, ``x / 1``, ``x ** 1``.

    A Pyro model's standard-normal priors leave ``(x - 0) / 1`` terms (and a ``** 1`` in their
    derivative) in a recorded graph. Each is exact, ``-0.0`` and NaN included (``x + 0`` is not:
    it turns ``-0.0`` into ``0.0``). The result must have ``x``'s shape, dtype and strides (no
    broadcast, promotion or new layout), the constant must not be written in place, and neither the
    result nor ``x`` (or what ``x`` views) may be written in place or reach a graph output through
    views (a replay must not hand out its input's memory).
    """
    aten = _aten()
    neutral = {aten.sub.Tensor: 0, aten.mul.Tensor: 1, aten.div.Tensor: 1}
    written = _written(gm)

    def constant(arg: Any) -> Any:
        if isinstance(arg, int | float) and not isinstance(arg, bool):
            return arg
        if getattr(arg, "op", None) == "get_attr" and arg not in written:
            return getattr(gm, arg.target)
        return None

    def is_all(value: Any, number: int) -> bool:
        if isinstance(value, Tensor):
            return value.numel() > 0 and bool((value == number).all())
        return value == number

    def untouched(node: Any) -> bool:
        while isinstance(node, type(node)) and getattr(node, "op", None) == "call_function":
            if node in written:
                return False
            node = node.args[0] if _is_view(node) else None
        return node is None or node not in written

    def reaches_output(node: Any) -> bool:
        return any(user.op == "output" or (_is_view(user) and reaches_output(user)) for user in node.users)

    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.kwargs or node in written or reaches_output(node):
            continue
        pairs: list[tuple[Any, Any, int]] = []
        if node.target in neutral and len(node.args) == 2:
            pairs.append((node.args[0], node.args[1], neutral[node.target]))
            if node.target is aten.mul.Tensor:
                pairs.append((node.args[1], node.args[0], 1))
        elif node.target is aten.pow.Tensor_Scalar:
            pairs.append((node.args[0], node.args[1], 1))
        for keep, other, number in pairs:
            value, kept, mine = constant(other), _meta(keep), _meta(node)
            if (
                value is not None
                and is_all(value, number)
                and isinstance(kept, Tensor)
                and isinstance(mine, Tensor)
                and (kept.shape, kept.dtype, kept.stride()) == (mine.shape, mine.dtype, mine.stride())
                and untouched(keep)
            ):
                node.replace_all_uses_with(keep)
                gm.graph.erase_node(node)
                break


def _permutation(node: Any) -> list[int] | None:
    """The dimension order of a ``permute`` (or a 2-D ``t``) node, else ``None``."""
    aten = _aten()
    if getattr(node, "op", None) != "call_function":
        return None
    if node.target is aten.permute.default:
        return [int(d) for d in node.args[1]]
    if node.target is aten.t.default and _shape(node) is not None and len(_shape(node) or ()) == 2:
        return [1, 0]
    return None


def _equal(a: Tensor, b: Tensor) -> bool:
    return (
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.numel() <= 4096 and torch.equal(a, b)
    )


def _pick_stacked(gm: Any) -> None:
    """``stack([a, b, c], d)[..., idx]`` with a constant ``idx`` along ``d`` -> ``stack([picked], d)``.

    A model run stacks every factor's log density and a kernel then picks the few it needs (a
    block's scaffold): the others become dead code, dropped with their arithmetic.
    """
    aten = _aten()
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index.Tensor:
            continue
        src, indices = node.args
        if not (isinstance(src, type(node)) and src.op == "call_function" and src.target is aten.stack.default):
            continue
        dims = [i for i, ix in enumerate(indices) if ix is not None]
        shape = _shape(src)
        if len(dims) != 1 or shape is None or indices[dims[0]].op != "get_attr":
            continue
        dim = src.args[1] if len(src.args) > 1 else 0
        dim = dim % len(shape)
        pick = getattr(gm, indices[dims[0]].target)
        if dims[0] != dim or pick.dim() != 1 or pick.dtype not in (torch.long, torch.int):
            continue
        parts = src.args[0]
        chosen = [parts[int(i)] for i in pick.tolist()]
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.stack.default, (chosen, dim))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)


def _drop_unused(gm: Any) -> None:
    """Drop every node whose result nobody reads, random draws included (a trace's samples of sites the
    function only needs the shapes of), unless it mutates its input."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users and not _mutates(node):
            gm.graph.erase_node(node)


def _hashable(arg: Any) -> Any:
    if isinstance(arg, list | tuple):
        return tuple(_hashable(a) for a in arg)
    if isinstance(arg, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in arg.items()))
    if isinstance(arg, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return str(arg)
    return arg


def _merge_duplicates(gm: Any) -> None:
    """Common subexpressions: a node equal to an earlier one (same op, same arguments) is replaced by it.

    A model run often computes one thing twice (a transform for the value and again for its
    log-Jacobian); random and mutating ops are never merged.
    """
    seen: dict[Any, Any] = {}
    for node in list(gm.graph.nodes):
        key: tuple[Any, ...]
        if node.op == "get_attr":
            key = ("get_attr", node.target)
            if key in seen:
                node.replace_all_uses_with(seen[key])
                gm.graph.erase_node(node)
            else:
                seen[key] = node
            continue
        if node.op != "call_function" or _mutates(node) or any(_mutates(user) for user in node.users):
            continue
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            continue
        try:
            key = (node.target, _hashable(node.args), _hashable(node.kwargs))
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
        else:
            seen[key] = node


def _is_view(node: Any) -> bool:
    """Whether ``node`` returns a view of its first argument (its schema's result aliases an input)."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.returns or not schema.arguments:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _written(gm: Any) -> set[Any]:
    """The nodes whose memory an in-place op writes: each written argument and, through views, what it aliases."""
    out: set[Any] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not _mutates(node):
            continue
        given = [*node.args, *(node.kwargs.get(spec.name) for spec in node.target._schema.arguments[len(node.args) :])]
        for spec, arg in zip(node.target._schema.arguments, given):
            if spec.alias_info is None or not spec.alias_info.is_write:
                continue
            for base in arg if isinstance(arg, (list, tuple)) else [arg]:  # Tensor(a!)[]: every element is written
                while isinstance(base, type(node)) and base not in out:
                    out.add(base)
                    base = base.args[0] if _is_view(base) else None
    return out


def _fold_constants(gm: Any) -> None:
    """Evaluate once every node that depends on no placeholder (and is neither random nor mutated)."""
    from torch.fx.node import map_arg

    graph = gm.graph
    aten = _aten()
    shape_only = {aten.new_ones.default, aten.new_zeros.default, aten.new_full.default}
    like = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default}
    written = _written(gm)
    value: dict[Any, Any] = {}
    for node in graph.nodes:
        if node in written:  # an in-place op changes it after it is made: its value is not a constant
            continue
        if node.op == "get_attr":
            value[node] = getattr(gm, node.target)
        elif node.op == "call_function":
            if _mutates(node):  # (a node an in-place op writes is in `written`)
                continue
            tags = getattr(node.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags:
                continue
            if all(arg in value for arg in node.all_input_nodes):
                value[node] = node.target(*map_arg(node.args, value.get), **map_arg(node.kwargs, value.get))
            elif node.target in shape_only | like and isinstance(_meta(node.args[0]), Tensor):
                source = _meta(node.args[0])  # only its dtype and device (and shape, for *_like): constant here
                shape = tuple(source.shape) if node.target in like else ()
                dummy = torch.empty(shape, dtype=source.dtype, device=source.device)
                value[node] = node.target(dummy, *map_arg(node.args[1:], value.get), **node.kwargs)
    count = 0
    folded: dict[str, Tensor] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node not in value or not isinstance(value[node], Tensor):
            continue
        if all(user in value for user in node.users):
            continue  # only folded nodes read it
        tensor = value[node]
        name = next((n for n, t in folded.items() if _equal(t, tensor)), None)  # equal constants share a name
        if name is None:
            name = f"_folded_{count}"
            count += 1
            setattr(gm, name, tensor)
            folded[name] = tensor
        with graph.inserting_before(node), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # FX asks for a registered buffer; a plain attribute is ours
            const = graph.get_attr(name)
        node.replace_all_uses_with(const)


def record_graph(fn: Callable[..., Any], *inputs: Tensor) -> Any:
    """``make_fx(fn)(*inputs)``: the ``aten`` graph of ``fn`` at ``inputs``, with one fake-tensor mode for its metadata.

    ``make_fx`` stores each node's shape and dtype as a fake tensor; outside a tracing context it makes a
    new fake-tensor mode per node, and each mode records the Python stack where it was made: deep under
    Pyro's MCMC. One mode shared by the whole trace records it once and gives the same graph (the README's
    compound example, tracing 28 graphs: 19.6 s before, 16.1 s after; same chains).

    Example:
        >>> gm = record_graph(lambda x: torch.sin(x) * 2.0, torch.zeros(3))
        >>> [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        ['aten.sin.default', 'aten.mul.Tensor']
    """
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True))):
        return make_fx(fn)(*inputs)


def copy_graph(gm: Any) -> Any:
    """A deep copy of a traced graph module that shares its constant tensors no op writes to.

    The constants are the model's data (at ``N = 1e6`` rows, hundreds of MB): copying them made a
    graph's build cost more than its tracing.

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> data = torch.arange(3.0)
        >>> gm = make_fx(lambda x: x * data)(torch.ones(3))
        >>> twin = copy_graph(gm)
        >>> twin is gm, twin(torch.ones(3)).tolist()
        (False, [0.0, 1.0, 2.0])
    """
    written = {node.target for node in _written(gm) if node.op == "get_attr"}
    memo: dict[int, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in written:
            value = getattr(gm, node.target)
            if isinstance(value, Tensor):
                memo[id(value)] = value
    return copy.deepcopy(gm, memo)


def fast_targets(gm: Any) -> None:
    """Call ``torch.<op>`` (and ``x[i]`` for one-tensor indexing) instead of ``torch.ops.aten.<op>.<overload>``.

    The public bindings dispatch the same kernels with about half the Python overhead per call;
    the graph is checked against the Pyro run after this pass (and rebuilt without it on mismatch).
    """
    aten = _aten()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target is aten.index.Tensor:
            indices = node.args[1]
            if len(indices) == 1 and indices[0] is not None and not node.kwargs:
                node.target, node.args = operator.getitem, (node.args[0], indices[0])
            continue
        name = node.target.overloadpacket.__name__
        fast = getattr(torch, name, None)
        if fast is None:  # in-place ops and views (view, expand) are methods only
            fast = getattr(Tensor, name, None)
        if (
            fast is not None
            and callable(fast)
            and type(fast).__name__ in ("builtin_function_or_method", "method_descriptor")
        ):
            node.target = fast
    gm.recompile()


def _plain_attributes(gm: Any) -> None:
    """Move the graph's constants from the module's buffers to plain attributes (no ``Module.__getattr__`` per call)."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target in gm._buffers:
            gm.__dict__[node.target] = gm._buffers.pop(node.target)


def fast_call(gm: Any) -> Callable[..., tuple[Tensor, Tensor]]:
    """The graph's generated ``forward``, called without ``nn.Module.__call__``'s hooks machinery."""
    _plain_attributes(gm)
    forward = gm.forward
    return lambda *tensors: tuple(forward(*tensors))


def _fresh_outputs(gm: Any, graph: Callable[..., tuple[Tensor, ...]]) -> Callable[..., tuple[Tensor, ...]]:
    """``graph`` with its constant outputs (folded attributes) cloned per call, so no two calls share a result."""
    (output,) = [node for node in gm.graph.nodes if node.op == "output"]
    results = output.args[0] if isinstance(output.args[0], list | tuple) else [output.args[0]]
    constant = [i for i, node in enumerate(results) if getattr(node, "op", None) == "get_attr"]
    if not constant:
        return graph

    def call(*tensors: Tensor) -> tuple[Tensor, ...]:
        out = list(graph(*tensors))
        for i in constant:
            out[i] = out[i].clone()
        return tuple(out)

    return call


def _close(got: tuple[Tensor, ...], want: tuple[Tensor, ...]) -> bool:
    """Equal up to rounding: ``|a - b| <= tol (|b| + max |b|)`` elementwise, with ``tol`` 256 units of the dtype's
    precision (3e-5 in float32, 6e-14 in float64), and NaNs and infinities in the same places. A translation that
    sums in another order rounds a gradient component near zero differently from torch (in float32, by ~1e-3
    where the largest component is 2e2), which a purely elementwise tolerance would take for a disagreement;
    randomness or state the recording missed changes outputs by far more."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        tol = 256 * float(torch.finfo(b.dtype).eps) if b.is_floating_point() else 0.0
        a, b = a.double(), b.double()
        finite = torch.isfinite(b)
        same_specials = torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num())
        if not torch.equal(finite, torch.isfinite(a)) or not same_specials:
            return False
        if not finite.any():
            continue
        a, b = a[finite], b[finite]
        if bool(((a - b).abs() > tol * (b.abs() + b.abs().max())).any()):
            return False
    return True


def _seconds(call: Callable[[], Any], repeats: int = 5) -> float:
    """The least wall time of ``repeats`` calls (after one untimed call)."""
    call()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _as_tuple(out: Tensor | tuple[Tensor, ...] | list[Tensor]) -> tuple[Tensor, ...]:
    return (out,) if isinstance(out, Tensor) else tuple(out)


def _same(got: tuple[Tensor, ...], want: tuple[Tensor, ...]) -> bool:
    return len(got) == len(want) and all(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.allclose(a.double(), b.double(), rtol=_CHECK_RTOL, atol=_CHECK_ATOL, equal_nan=True)
        for a, b in zip(got, want)
    )


class ReplayedFunction:
    """``fn(*tensors)`` recorded once per input signature and replayed as a graph.

    ``fn`` must be a function of its tensor arguments only (everything else it reads is taken
    as a constant) that returns a tensor or a tuple of tensors and leaves its arguments unchanged
    (the recording runs it several times on them). The ``record_after``-th call with
    a new signature records the graph and checks it against ``fn`` on the same inputs; the next
    ``checks`` calls with other inputs are checked as well, after which the graph is trusted
    (:attr:`verified`). If recording fails or a check disagrees, every later call runs ``fn``
    itself, after one ``RuntimeWarning`` naming ``what`` and the reason (:attr:`failure`).
    Calls that need gradients (an input requires grad while grad mode is on) always run ``fn``.

    Args:
        fn: the function to replay.
        what: what ``fn`` computes, for the warning (e.g. ``"the log density of model 'gmm'"``).
        checks: calls with new inputs checked against ``fn`` after the recording.
        record_after: record a signature at its this-many-th call (signatures used only a few
            times, e.g. while a kernel sets up, are not worth a recording).
        numpy: whether :meth:`call_numpy` may use a NumPy translation of a recorded graph: ``None``
            (default) where it was faster than the torch graph when recorded, ``True`` wherever the graph
            translates and agrees, ``False`` never.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        what: str,
        checks: int = 2,
        record_after: int = 20,
        numpy: bool | None = None,
    ) -> None:
        self.fn = fn
        self.numpy = numpy
        self.what = what
        self.checks = int(checks)
        self.record_after = int(record_after)
        self.failure: str | None = None
        self._seen: dict[tuple, int] = {}
        self._graphs: dict[tuple, Callable[..., tuple[Tensor, ...]]] = {}
        self._unchecked: dict[tuple, int] = {}
        self._single: dict[tuple, bool] = {}
        self._plain: dict[tuple, Any] = {}  # the recorded aten graphs, for their NumPy translation
        self._numpy: dict[tuple, Callable[..., tuple[Any, ...]] | None] = {}
        self._numpy_unchecked: dict[tuple, int] = {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # graphs hold closures: recorded again
        for name in ("_graphs", "_unchecked", "_single", "_seen", "_plain", "_numpy", "_numpy_unchecked"):
            state[name] = {}
        return state

    @property
    def verified(self) -> bool:
        """Whether every recorded graph has passed all its checks (and there is at least one)."""
        return bool(self._graphs) and self.failure is None and not any(self._unchecked.values())

    def __call__(self, *tensors: Tensor) -> Any:
        if (
            _RECORDING
            or self.failure is not None
            or (torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors))
        ):
            return self.fn(*tensors)
        tensors = tuple(t.contiguous() for t in tensors)  # the recorded views assume contiguous inputs
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        graph = self._graphs.get(key)
        if graph is None:
            seen = self._seen[key] = self._seen.get(key, 0) + 1
            return self.fn(*tensors) if seen < self.record_after else self._record(key, tensors)
        with torch.no_grad():
            out = graph(*tensors)
        left = self._unchecked[key]
        if left:
            want = _as_tuple(self.fn(*tensors))
            if not _same(out, want):
                self._give_up("the recorded graph disagrees with a plain run on new inputs (randomness or state?)")
                return want[0] if self._single[key] else want
            self._unchecked[key] = left - 1
        return out[0] if self._single[key] else out

    def _record(self, key: tuple, tensors: tuple[Tensor, ...]) -> Any:
        want = self.fn(*tensors)  # the plain call first: its errors are the function's own, raised as they are
        single = isinstance(want, Tensor)
        want = _as_tuple(want)
        try:
            graph = self._trace(key, tensors, want)
        except Exception as err:  # noqa: BLE001 - any recording failure means "replay impossible", with its reason
            self._give_up(recording_failure(err))
            graph = None
        if graph is not None:
            self._graphs[key] = graph
            self._unchecked[key] = self.checks
            self._single[key] = single
        return want[0] if single else want

    def call_numpy(self, *arrays: np.ndarray) -> Any:
        """``fn`` on NumPy arrays through the graph's NumPy translation, or ``None`` where there is none.

        The first call of a recorded signature translates its graph (:func:`~neuralblock.replay_numpy.numpy_graph`)
        and keeps the translation if every operation has a NumPy counterpart, its results agree with ``fn`` up to
        rounding, and (with ``numpy=None``) it runs faster than the torch graph (small tensors: 2-3x). Its next
        ``checks`` calls are checked against ``fn`` too, as for :meth:`__call__`. Callers fall back to
        :meth:`__call__` on ``None`` (not recorded yet, or no translation).

        Example:
            >>> import numpy as np
            >>> fast = ReplayedFunction(lambda x: (x * x).sum(), "a square sum", record_after=1, numpy=True)
            >>> _ = fast(torch.ones(3))
            >>> float(fast.call_numpy(np.full(3, 2.0, dtype=np.float32)))
            12.0
        """
        if self.failure is not None or self.numpy is False:
            return None
        key = tuple((torch.Size(a.shape), torch_dtype(a.dtype), _CPU) for a in arrays)
        if key not in self._numpy:
            if key not in self._graphs:
                return None
            self._numpy[key] = self._translate(key, arrays)
            self._numpy_unchecked[key] = self.checks
        graph = self._numpy[key]
        if graph is None:
            return None
        try:
            out = graph(*arrays)
        except Exception:  # noqa: BLE001 - an input NumPy rejects (e.g. an integer power): the torch graph instead
            self._numpy[key] = None
            return None
        if self._numpy_unchecked[key]:
            tensors = tuple(torch.from_numpy(np.array(a)) for a in arrays)
            want = _as_tuple(self.fn(*tensors))
            if not _close(tuple(torch.from_numpy(np.array(o)) for o in out), want):
                self._drop_translation(key, tensors, want)
                out = tuple(w.numpy() for w in want)
            else:
                self._numpy_unchecked[key] -= 1
        return out[0] if self._single[key] else out

    def _drop_translation(self, key: tuple, tensors: tuple[Tensor, ...], want: tuple[Tensor, ...]) -> None:
        """A translation disagreed with ``fn``: give the graph up too if it disagrees as well (stale state), else
        drop only the translation of this signature."""
        with torch.no_grad():
            stale = not _same(self._graphs[key](*tensors), want)
        if stale:
            self._give_up("the recorded graph disagrees with a plain run on new inputs (randomness or state?)")
        else:
            self._numpy[key] = None

    def _translate(self, key: tuple, arrays: tuple[np.ndarray, ...]) -> Callable[..., tuple[Any, ...]] | None:
        """The NumPy translation of a recorded graph if it agrees with ``fn`` on ``arrays`` up to rounding and
        (``numpy=None``) runs faster than the torch graph on them; else ``None``."""
        if any(dtype is None for _, dtype, _ in key):
            return None
        inputs = tuple(torch.from_numpy(np.array(a)) for a in arrays)
        try:
            translated = numpy_graph(copy_graph(self._plain[key]))
            if translated is None:
                return None
            got = translated(*arrays)
        except Exception:  # noqa: BLE001 - whatever NumPy cannot take: no NumPy path, the torch graph is unaffected
            return None
        want = _as_tuple(self.fn(*inputs))
        graph = self._graphs[key]
        if not _close(tuple(torch.from_numpy(np.array(o)) for o in got), want):
            self._drop_translation(key, inputs, want)
            return None
        if self.numpy or _seconds(lambda: translated(*arrays)) < _seconds(lambda: graph(*inputs)):
            return translated
        return None

    def _trace(
        self, key: tuple, tensors: tuple[Tensor, ...], want: tuple[Tensor, ...]
    ) -> Callable[..., tuple[Tensor, ...]] | None:
        inputs = [t.detach() for t in tensors]
        _RECORDING.append(self)  # replayed functions called inside record their own operations into this graph
        try:
            with torch.no_grad():
                gm = record_graph(lambda *t: _as_tuple(self.fn(*t)), *inputs)
        finally:
            _RECORDING.pop()
        simplify_graph(gm, no_grad=True)  # replays run under torch.no_grad (see __call__)
        plain = copy_graph(gm)
        fast_targets(gm)
        for candidate in (gm, plain):  # the public bindings first; the recorded aten overloads if they disagree
            graph = _fresh_outputs(candidate, fast_call(candidate))
            try:
                with torch.no_grad():
                    agrees = _same(graph(*inputs), want)
            except Exception:  # noqa: BLE001 - a binding that rejects the recorded arguments: try the next one
                continue
            if agrees:
                self._plain[key] = plain  # translated to NumPy on the first call_numpy of this signature
                return graph
        self._give_up("the recorded graph disagrees with the function on the recorded inputs")
        return None

    def _give_up(self, reason: str) -> None:
        self.failure = reason
        self._graphs.clear()
        self._plain.clear()
        self._numpy.clear()
        warnings.warn(
            f"{self.what} runs without its recorded fast path ({reason}); results are unaffected, only slower",
            RuntimeWarning,
            stacklevel=3,
        )


class FusedPotential:
    """A Pyro HMC/NUTS ``potential_fn`` whose value and gradient come from one recorded graph.

    Pyro's integrator calls the potential and then ``torch.autograd.grad`` on it at every leapfrog
    step: a forward graph of small operations and an autograd-engine pass over it. Here the value and
    the gradient of ``potential`` (with respect to every site) are computed by one function, replayed as a
    recorded graph (:class:`ReplayedFunction`, checked against plain calls), and handed to autograd as
    one node whose backward multiplies the stored gradient. Values and gradients equal the plain ones;
    a backward pass that builds a graph (``create_graph=True``, for Hessians) differentiates the plain
    potential, so higher derivatives are right too. As for any :class:`ReplayedFunction`, tensors the
    potential reads besides its sites (data, coreset indices) are constants of the recording: build a new
    ``FusedPotential`` when they change. ``torch.func`` transforms of it are not supported (use the plain
    potential there).

    Args:
        potential: ``{site: unconstrained value} -> scalar`` (differentiable in torch operations).
        sites: the sites it reads, in a fixed order.
        what: what it computes, for the fallback warning.
        record_after: calls before the graph is recorded (see :class:`ReplayedFunction`).
        numpy: when ``value_and_grad.call_numpy`` may use a NumPy translation (see :class:`ReplayedFunction`;
            :class:`~neuralblock.kernels.DirectNUTS` uses it on the CPU).

    Example:
        >>> import torch
        >>> fused = FusedPotential(lambda p: (p["x"] ** 2).sum() / 2, ["x"], "a Gaussian potential", record_after=1)
        >>> x = torch.tensor([1.0, -2.0], requires_grad=True)
        >>> value = fused({"x": x})
        >>> float(value), torch.autograd.grad(value, x)[0].tolist()
        (2.5, [1.0, -2.0])
    """

    def __init__(
        self,
        potential: Callable[[dict[str, Tensor]], Tensor],
        sites: list[str],
        what: str,
        record_after: int = 20,
        numpy: bool | None = None,
    ) -> None:
        self.potential = potential
        self.sites = list(sites)
        self.value_and_grad = ReplayedFunction(self._value_and_grad, what, record_after=record_after, numpy=numpy)

    def _value_and_grad(self, *values: Tensor) -> tuple[Tensor, ...]:
        with torch.enable_grad():
            leaves = [v.detach().requires_grad_() for v in values]
            value = self.potential(dict(zip(self.sites, leaves)))
            grads = torch.autograd.grad(value, leaves, allow_unused=True)
        return (value.detach(), *(torch.zeros_like(v) if g is None else g for v, g in zip(values, grads)))

    def __call__(self, params: dict[str, Tensor]) -> Tensor:
        return _PotentialNode.apply(self, *(params[s] for s in self.sites))


class _PotentialNode(torch.autograd.Function):
    """Autograd node of a :class:`FusedPotential` value: backward scales the gradient computed with it."""

    @staticmethod
    def forward(ctx: Any, fused: FusedPotential, *values: Tensor) -> Tensor:
        value, *grads = fused.value_and_grad(*(v.detach() for v in values))
        ctx.fused = fused
        ctx.save_for_backward(*values, *grads)
        return value

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        values, grads = saved[: len(saved) // 2], saved[len(saved) // 2 :]
        if torch.is_grad_enabled():  # create_graph (e.g. a Hessian): differentiate the plain potential instead
            fused: FusedPotential = ctx.fused
            wanted = [i for i, v in enumerate(values) if ctx.needs_input_grad[i + 1] and v.requires_grad]
            value = fused.potential(dict(zip(fused.sites, values)))
            found = torch.autograd.grad(value, [values[i] for i in wanted], create_graph=True, allow_unused=True)
            exact: list[Tensor | None] = [None] * len(values)
            for i, g in zip(wanted, found):
                exact[i] = torch.zeros_like(values[i]) if g is None else g
            return (None, *(None if g is None else grad_output * g for g in exact))
        return (None, *(grad_output * g for g in grads))


def recording_failure(err: Exception) -> str:
    """Why recording a model run failed, in a user's terms.

    Example:
        >>> recording_failure(ValueError("bad shape"))
        'recording failed: ValueError: bad shape'
    """
    text = str(err)
    if "_local_scalar_dense" in text or "data-dependent" in text or ".item()" in text:
        return (
            "the model turns a sampled value into a Python number: indexing with a 0-dim tensor (use "
            "torch.index_select or pyro.ops.indexing.Vindex), float()/int()/item(), or an if on a value "
            "(use torch.where)"
        )
    first = text.splitlines()[0] if text else ""
    return f"recording failed: {type(err).__name__}: {first}"
