"""The NumPy translation of recorded graphs: the same values as torch, refusals, and its use by ReplayedFunction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuralblock import replay_numpy
from neuralblock.replay import FusedPotential, ReplayedFunction, _close, copy_graph, simplify_graph
from neuralblock.replay_numpy import numpy_graph, torch_dtype

DATA = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
INDEX = torch.tensor([4, 0, 6])


def many_ops(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Most operations of the table, as make_fx records them (views, reductions, broadcasting)."""
    logits = DATA.to(x.dtype) @ w  # [7]
    soft = torch.nn.functional.softplus(logits, threshold=40.0)
    picked = logits[INDEX.tolist()] * torch.sigmoid(logits)[1:4]
    grid = x.unsqueeze(0).expand(4, -1, -1).permute(1, 0, 2)  # [2, 4, 3]
    stacked = torch.stack([x[0], x[1].clamp(-0.5, 0.5)], 1).t()
    joined = torch.cat([x.sum((0,)), x.mean(1)], 0)
    rest = torch.where(x > 0, torch.exp(-x), torch.log1p(x.abs())) ** 2 - x.select(1, 2)[:, None] / 3
    return (
        soft.sum() - 0.5 * (w**2).sum(),
        picked,
        grid.sum(-1).squeeze(),
        stacked,
        joined,
        rest,
        torch.dot(w, w),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_translated_graph_gives_torchs_values(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 3, generator=gen, dtype=dtype), torch.randn(3, generator=gen, dtype=dtype)
    gm = make_fx(many_ops)(x, w)
    fn = numpy_graph(copy_graph(gm))
    assert fn is not None
    for _ in range(3):  # other inputs than the recorded ones
        x, w = torch.randn(2, 3, generator=gen, dtype=dtype), torch.randn(3, generator=gen, dtype=dtype)
        want = many_ops(x, w)
        got = fn(x.numpy(), w.numpy())
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.shape == tuple(b.shape) and torch_dtype(a.dtype) == b.dtype
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


def test_softplus_and_its_derivative_match_in_both_tails() -> None:
    x = torch.tensor([-100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 39.0, 41.0, 100.0], dtype=torch.float64, requires_grad=True)

    def value_and_grad(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            leaf = t.detach().requires_grad_()
            value = torch.nn.functional.softplus(leaf, threshold=40.0)
            return value.detach(), torch.autograd.grad(value.sum(), leaf)[0]

    gm = make_fx(value_and_grad)(x.detach())
    simplify_graph(gm, no_grad=True)
    fn = numpy_graph(copy_graph(gm))
    assert fn is not None
    for a, b in zip(fn(x.detach().numpy()), value_and_grad(x.detach())):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-14, atol=0)  # relative: sigmoid(-100) is 4e-44


def test_an_operation_without_a_counterpart_refuses_the_translation() -> None:
    gm = make_fx(lambda x: torch.lgamma(x).sum())(torch.ones(3))
    assert numpy_graph(copy_graph(gm)) is None


def test_a_constant_output_is_a_fresh_array_per_call() -> None:
    gm = make_fx(lambda x: (x * 2.0, DATA.clone()))(torch.ones(2))
    fn = numpy_graph(copy_graph(gm))
    assert fn is not None
    first = fn(np.ones(2, dtype=np.float32))[1]
    first[0, 0] = 1e9
    assert fn(np.ones(2, dtype=np.float32))[1][0, 0] == DATA[0, 0].item()


def test_replayed_function_serves_numpy_calls_after_recording() -> None:
    calls = []

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return (x**2).sum(), 2 * x

    fast = ReplayedFunction(fn, "a square", record_after=2, numpy=True)
    x = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    assert fast.call_numpy(x) is None  # not recorded yet: the caller uses __call__
    for _ in range(2):
        fast(torch.from_numpy(x))
    recorded = len(calls)
    for k in range(10):
        value, grad = fast.call_numpy(x + k)
        assert isinstance(grad, np.ndarray) and grad.dtype == np.float32
        np.testing.assert_allclose(value, ((x + k) ** 2).sum(), rtol=1e-6)
        np.testing.assert_allclose(grad, 2 * (x + k), rtol=1e-6)
    assert len(calls) == recorded + 1 + fast.checks  # fn ran only to check the translation and its first calls
    assert fast.call_numpy(np.ones(4, dtype=np.float32)) is None  # another signature: not recorded


def test_a_recording_that_disagrees_with_fn_gives_up_on_both_paths() -> None:
    state = {"shift": 0.0}

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + state["shift"]  # state the recording takes as a constant

    for translate_first in (True, False):
        state["shift"] = 0.0
        fast = ReplayedFunction(fn, "a shifted vector", record_after=1, numpy=True)
        fast(torch.zeros(2))
        if not translate_first:
            assert fast.call_numpy(np.zeros(2, dtype=np.float32)).tolist() == [0.0, 0.0]
        state["shift"] = 5.0
        with pytest.warns(RuntimeWarning, match="disagrees"):
            out = fast.call_numpy(np.ones(2, dtype=np.float32))
        if out is not None:  # the translation's own check ran fn and returns its values
            assert out.tolist() == [6.0, 6.0]
        assert fast.call_numpy(np.zeros(2, dtype=np.float32)) is None  # no fast path any more
        assert fast(torch.zeros(2)).tolist() == [5.0, 5.0]


def test_numpy_false_never_translates() -> None:
    fused = FusedPotential(lambda p: (p["z"] ** 2).sum(), ["z"], "a bowl", record_after=1, numpy=False)
    for _ in range(3):
        fused.value_and_grad(torch.ones(2))
    assert fused.value_and_grad.call_numpy(np.ones(2, dtype=np.float32)) is None


def test_in_place_operations_translate_only_where_nothing_else_reads_their_input() -> None:
    def private(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).squeeze_(0) + 1  # the squeezed product is read by nothing else

    def shared(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        view = y[0]
        y.mul_(3)  # the view sees the change
        return view + y

    x = torch.arange(3.0).reshape(1, 3)
    fn = numpy_graph(copy_graph(make_fx(private)(x)))
    assert fn is not None
    np.testing.assert_array_equal(fn(x.numpy())[0], private(x).numpy())
    gm = make_fx(shared)(x)
    assert any(str(n.target) == "aten.mul_.Tensor" for n in gm.graph.nodes)
    assert numpy_graph(copy_graph(gm)) is None


def test_an_in_place_operation_on_a_view_is_not_translated() -> None:
    weights = torch.tensor([[1.0, 0.5], [-0.5, 2.0]])

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = x @ weights
        h[:, 0].clamp_min_(0.0)  # writes through the view into h
        return h.sum()

    gm = make_fx(fn)(torch.ones(1, 2))
    assert any(str(n.target) == "aten.clamp_min_.default" for n in gm.graph.nodes)
    assert numpy_graph(copy_graph(gm)) is None


def test_close_checks_small_components_against_their_own_size() -> None:
    big = torch.tensor([1e4, 0.5])
    assert _close((big,), (big.clone(),))
    assert not _close((torch.tensor([1e4, -0.5]),), (big,))  # a wrong sign hidden by the norm-wise scale
    assert _close((torch.tensor([200.0, 1.001]),), (torch.tensor([200.0, 1.0]),))  # float32 rounding near zero
    assert not _close((torch.tensor([1.0, 2.0], dtype=torch.float64) + 1e-9,), (torch.tensor([1.0, 2.0]).double(),))


def test_a_translation_that_alone_disagrees_is_dropped_and_the_graph_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = ReplayedFunction(lambda x: torch.sign(x) * 2.0, "a sign", record_after=1, numpy=True)
    fast(torch.ones(3))
    wrong = {"aten.sign.default": lambda x: -np.sign(x)}  # a translation unlike torch (the table has no sign)
    monkeypatch.setattr("neuralblock.replay_numpy._OPS", {**replay_numpy._OPS, **wrong})
    assert fast.call_numpy(np.ones(3, dtype=np.float32)) is None
    assert fast.failure is None and fast.verified is not None
    assert fast(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]  # the torch graph still serves calls
    assert len(fast._graphs) == 1
