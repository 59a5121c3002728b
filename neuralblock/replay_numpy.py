"""Replaying a recorded graph with NumPy: the small-tensor fast path of :mod:`neuralblock.replay`.

A recorded potential of a small model (a coreset's few dozen weighted points, a 10-dimensional
regression) is about thirty operations on tensors of a few hundred numbers. Their arithmetic takes
nanoseconds; each torch call costs about 2 us of dispatch, and a NumPy ufunc about 0.5 us. So the
same graph replayed with NumPy functions runs about 3x faster (a logistic coreset potential with its
gradient: 18 against 55 us), while on large tensors torch's kernels are as fast or faster.
:func:`numpy_graph` translates a graph of ``aten`` operations into one that calls NumPy, or returns
``None`` when it meets an operation it does not know; :class:`~neuralblock.replay.ReplayedFunction`
checks its results against the recorded graph, times both, and keeps it only where it is faster.

Example:
    >>> import numpy as np, torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (torch.nn.functional.softplus(x) * 2.0).sum(0))(torch.zeros(3, 2))
    >>> fn = numpy_graph(gm)
    >>> out = fn(np.ones((3, 2), dtype=np.float32))
    >>> out[0].dtype, bool(np.allclose(out[0], 6 * np.log1p(np.e)))
    (dtype('float32'), True)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["NUMPY_DTYPES", "numpy_graph", "torch_dtype"]

NUMPY_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.bool: np.bool_,
}
_TORCH_DTYPES = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}


def torch_dtype(dtype: Any) -> torch.dtype | None:
    """The torch dtype of a NumPy dtype (``None`` where :data:`NUMPY_DTYPES` has none)."""
    return _TORCH_DTYPES.get(np.dtype(dtype))


def _axes(dims: Any) -> Any:
    if dims is None or isinstance(dims, int):
        return dims
    return tuple(dims) if len(dims) else None  # aten reduces over every dimension for an empty list


def _index_at(dim: int, ndim: int, key: Any) -> tuple[Any, ...]:
    return (slice(None),) * (dim % ndim) + (key,)


def _sum(x: Any, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    out_dtype = None if dtype is None else NUMPY_DTYPES[dtype]
    return np.asarray(np.add.reduce(x, axis=_axes(dims), keepdims=keepdim, dtype=out_dtype))  # type: ignore[call-overload]


def _mean(x: Any, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    out_dtype = None if dtype is None else NUMPY_DTYPES[dtype]
    return np.asarray(np.mean(x, axis=_axes(dims), keepdims=keepdim, dtype=out_dtype))


def _unsqueeze(x: Any, dim: int) -> Any:
    return x[(slice(None),) * (dim % (x.ndim + 1)) + (None,)]


def _reshape(x: Any, shape: Sequence[int]) -> Any:
    return x.reshape(shape)


def _permute(x: Any, dims: Sequence[int]) -> Any:
    return x.transpose(dims)


def _add(a: Any, b: Any, *, alpha: Any = 1) -> Any:
    return a + b if alpha == 1 else a + alpha * b


def _sub(a: Any, b: Any, *, alpha: Any = 1) -> Any:
    return a - b if alpha == 1 else a - alpha * b


def _rsub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return b - a if alpha == 1 else b - alpha * a


def _sigmoid(x: Any) -> Any:
    return np.exp(-np.logaddexp(0, -x))  # no overflow, full relative precision in both tails


def _softplus(x: Any, beta: Any = 1, threshold: Any = 20) -> Any:
    bx = x if beta == 1 else beta * x
    smooth = np.logaddexp(0, bx) if beta == 1 else np.logaddexp(0, bx) / beta
    return np.where(bx > threshold, x, smooth)


def _softplus_backward(grad: Any, x: Any, beta: Any = 1, threshold: Any = 20) -> Any:
    bx = x if beta == 1 else beta * x
    return grad * np.where(bx > threshold, 1.0, _sigmoid(bx))


def _squeeze(x: Any, dims: Any = None) -> Any:
    if dims is None:
        return x.squeeze()
    axes = tuple(d for d in ([dims] if isinstance(dims, int) else dims) if x.shape[d] == 1)  # torch skips others
    return x.squeeze(axes) if axes else x


def _expand(x: Any, shape: Sequence[int], *, implicit: bool = False) -> Any:
    offset = len(shape) - np.ndim(x)
    full = [np.shape(x)[i - offset] if s == -1 else s for i, s in enumerate(shape)]
    return np.broadcast_to(x, full)


def _slice(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    return x[_index_at(dim, np.ndim(x), slice(start, end, step))]


def _index(x: Any, indices: Sequence[Any]) -> Any:
    return x[tuple(slice(None) if i is None else i for i in indices)]


def _clamp(x: Any, low: Any = None, high: Any = None) -> Any:
    if low is not None:
        x = np.maximum(x, low)
    return x if high is None else np.minimum(x, high)


def _to_copy(x: Any, *, dtype: Any = None, **_: Any) -> Any:
    return np.array(x, dtype=None if dtype is None else NUMPY_DTYPES[dtype], copy=True)


def _where(cond: Any, a: Any, b: Any) -> Any:
    return np.where(cond, a, b)


def _cat(arrays: Sequence[Any], dim: int = 0) -> Any:
    return np.concatenate(arrays, axis=dim)


def _stack(arrays: Sequence[Any], dim: int = 0) -> Any:
    return np.stack(arrays, axis=dim)


def _dot(a: Any, b: Any) -> Any:
    return np.asarray(np.dot(a, b))


def _addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    product = a @ b if alpha == 1 else alpha * (a @ b)
    if beta == 0:  # torch ignores the bias then (NaN and inf included)
        return product if alpha != 0 else np.zeros_like(product)
    if alpha == 0:
        return beta * np.broadcast_to(bias, product.shape).copy()
    return product + (bias if beta == 1 else beta * bias)


_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "abs": np.abs,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sigmoid": _sigmoid,
    "clone": lambda x, **_: np.array(x, copy=True),
    "alias": lambda x: x,
    "detach": lambda x: x,
    "lift_fresh_copy": lambda x: np.array(x, copy=True),
    "t": lambda x: x.T,
}
_OPS: dict[str, Callable[..., Any]] = {
    **{f"aten.{name}.default": fn for name, fn in _UNARY.items()},
    "aten.mm.default": operator.matmul,
    "aten.mv.default": operator.matmul,
    "aten.bmm.default": operator.matmul,
    "aten.dot.default": _dot,
    "aten.addmm.default": _addmm,
    "aten.mul.Tensor": operator.mul,
    "aten.mul.Scalar": operator.mul,
    "aten.div.Tensor": operator.truediv,
    "aten.div.Scalar": operator.truediv,
    "aten.add.Tensor": _add,
    "aten.add.Scalar": _add,
    "aten.sub.Tensor": _sub,
    "aten.sub.Scalar": _sub,
    "aten.rsub.Scalar": _rsub,
    "aten.rsub.Tensor": _rsub,
    "aten.pow.Tensor_Scalar": operator.pow,
    "aten.pow.Tensor_Tensor": operator.pow,
    "aten.maximum.default": np.maximum,
    "aten.minimum.default": np.minimum,
    "aten.where.self": _where,
    "aten.clamp.default": _clamp,
    "aten.clamp_min.default": lambda x, low: np.maximum(x, low),
    "aten.clamp_max.default": lambda x, high: np.minimum(x, high),
    "aten.gt.Tensor": operator.gt,
    "aten.gt.Scalar": operator.gt,
    "aten.lt.Tensor": operator.lt,
    "aten.lt.Scalar": operator.lt,
    "aten.ge.Tensor": operator.ge,
    "aten.ge.Scalar": operator.ge,
    "aten.le.Tensor": operator.le,
    "aten.le.Scalar": operator.le,
    "aten.eq.Tensor": operator.eq,
    "aten.eq.Scalar": operator.eq,
    "aten.softplus.default": _softplus,
    "aten.softplus_backward.default": _softplus_backward,
    "aten.sum.dim_IntList": _sum,
    "aten.sum.default": _sum,
    "aten.mean.dim": _mean,
    "aten.mean.default": _mean,
    "aten.unsqueeze.default": _unsqueeze,
    "aten.squeeze.dim": _squeeze,
    "aten.squeeze.dims": _squeeze,
    "aten.squeeze.default": _squeeze,
    "aten.view.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten.permute.default": _permute,
    "aten.transpose.int": np.swapaxes,
    "aten.expand.default": _expand,
    "aten.select.int": lambda x, dim, i: x[_index_at(dim, np.ndim(x), i)],
    "aten.slice.Tensor": _slice,
    "aten.index.Tensor": _index,
    "aten._to_copy.default": _to_copy,
    "aten.cat.default": _cat,
    "aten.stack.default": _stack,
}


def _constant(value: Any) -> Any:
    """A graph constant for NumPy: a 0-dim tensor becomes a Python number (weak in type promotion, like a
    0-dim tensor beside a larger one in torch), any other tensor an array (``None``: not representable)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type != "cpu" or value.dtype not in NUMPY_DTYPES or value.requires_grad:
        return None
    array = value.detach().numpy(force=True)  # force: a zero tensor or a conjugate view is materialized
    return array.item() if array.ndim == 0 else array


_FRESH = {
    f"aten.{name}"
    for name in [
        *("mm", "mv", "bmm", "dot", "addmm", "mul", "div", "add", "sub", "rsub", "pow", "maximum", "minimum"),
        *("where", "clamp", "clamp_min", "clamp_max", "softplus", "softplus_backward", "sum", "mean", "neg"),
        *("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "abs", "tanh", "sin", "cos", "sigmoid"),
        *("clone", "lift_fresh_copy", "_to_copy", "cat", "stack", "gt", "lt", "ge", "le", "eq"),
    ]
}  # operations whose result is a new tensor (never a view of an input)


def _out_of_place(node: Any) -> str:
    """The name of a node's operation; an in-place one (``aten.squeeze_.dim``) by its out-of-place name when
    that computes the same: its input is an intermediate result that nothing else reads."""
    name = str(node.target)
    packet, _, overload = name.rpartition(".")
    if not packet.endswith("_") or packet.endswith("__"):
        return name
    source = node.args[0] if node.args else None
    if source is None or getattr(source, "op", None) != "call_function" or set(source.users) != {node}:
        return name  # the mutation would be visible elsewhere: no counterpart
    if str(source.target).rpartition(".")[0] not in _FRESH:
        return name  # a view (select, slice, ...) would carry the mutation to its base: no counterpart
    return f"{packet[:-1]}.{overload}"


def numpy_graph(gm: Any) -> Callable[..., tuple[Any, ...]] | None:
    """The recorded graph ``gm`` with NumPy functions in place of its ``aten`` operations, or ``None``.

    ``gm`` is changed in place (pass a copy, :func:`~neuralblock.replay.copy_graph`). The result takes and
    returns NumPy arrays; outputs that are constants of the graph are copied per call. It is not checked
    here: the caller compares it with the recorded graph (NumPy's type promotion and rounding can differ).

    Args:
        gm: a graph of ``aten`` operator overloads (as ``make_fx`` records it).

    Returns:
        ``fn(*arrays) -> tuple of arrays``, or ``None`` if the graph holds an operation, a constant or
        an argument that has no NumPy counterpart here.
    """
    constants: dict[str, Any] = {}
    names = {node: _out_of_place(node) for node in gm.graph.nodes if node.op == "call_function"}  # before renaming
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target is operator.getitem:
                continue
            fn = _OPS.get(names[node])
            if fn is None:
                return None
            node.target = fn
            if any(isinstance(a, torch.dtype) and a not in NUMPY_DTYPES for a in node.kwargs.values()):
                return None
        elif node.op == "get_attr":
            value = _constant(getattr(gm, node.target))
            if value is None:
                return None
            constants[node.target] = value
        elif node.op not in ("placeholder", "output"):
            return None
    for name, value in constants.items():
        gm._buffers.pop(name, None)
        gm._parameters.pop(name, None)
        gm.__dict__[name] = value
    gm.recompile()
    (output,) = [node for node in gm.graph.nodes if node.op == "output"]
    several = isinstance(output.args[0], list | tuple)
    results = output.args[0] if several else [output.args[0]]
    copied = [i for i, node in enumerate(results) if getattr(node, "op", None) == "get_attr"]
    forward = gm.forward

    def call(*arrays: Any) -> tuple[Any, ...]:
        with np.errstate(all="ignore"):  # torch gives inf and nan without a warning: so does the translation
            out = [np.asarray(a) for a in (forward(*arrays) if several else (forward(*arrays),))]
        for i in copied:
            out[i] = out[i].copy()
        return tuple(out)

    return call
