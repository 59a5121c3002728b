"""The recorded fast path (neuralblock.replay) and its use for Pyro model runs."""

from __future__ import annotations

import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from neuralblock.kernels import RandomWalkMH
from neuralblock.replay import FusedPotential, ReplayedFunction, record_graph


def counted(fn):
    """``fn`` with a call counter (``wrapper.calls``)."""

    def wrapper(*args):
        wrapper.calls += 1
        return fn(*args)

    wrapper.calls = 0
    return wrapper


def test_replay_matches_the_function_and_stops_calling_it_once_verified() -> None:
    fn = counted(lambda x, w: (torch.log_softmax(x @ w, -1), (x * x).sum(-1) + torch.ones(3).sum()))
    fast = ReplayedFunction(fn, "a test function", checks=2, record_after=2)
    w = torch.randn(4, 3)
    for i in range(10):
        x = torch.randn(5, 4)
        got = fast(x, w)
        want = fn(x, w)
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
        if i == 1:
            assert not fast.verified  # just recorded: its checks are still to come
    assert fast.verified and fast.failure is None
    # 10 comparison calls + 1 plain call + the recording (1 plain call, 1 trace) + 2 checked calls; then none
    assert fn.calls == 10 + 1 + 2 + 2


def test_data_dependent_control_flow_falls_back_with_a_warning_naming_it() -> None:
    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if float(x.sum()) > 0 else -x

    fast = ReplayedFunction(branchy, "branchy", record_after=1)
    with pytest.warns(RuntimeWarning, match="Python number"):
        fast(torch.ones(3))
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(fast(x), branchy(x))
    assert fast.failure is not None and not fast.verified


def test_randomness_inside_is_caught_by_the_checks_and_falls_back() -> None:
    fast = ReplayedFunction(lambda x: x + torch.randn(()), "noisy", record_after=1)
    with pytest.warns(RuntimeWarning, match="disagrees"):
        for _ in range(4):
            fast(torch.zeros(2))
    assert fast.failure is not None


def test_inputs_that_need_gradients_run_the_function_itself() -> None:
    fast = ReplayedFunction(lambda x: (x**2).sum(), "square", record_after=1)
    for _ in range(4):
        fast(torch.ones(3))
    x = torch.ones(3, requires_grad=True)
    fast(x).backward()
    assert torch.equal(x.grad, 2 * torch.ones(3))


def test_a_pickled_replay_records_again() -> None:
    fast = ReplayedFunction(torch.sin, "sine", record_after=1)
    for _ in range(4):
        fast(torch.ones(2))
    again = pickle.loads(pickle.dumps(fast))
    assert not again._graphs
    assert torch.equal(again(torch.ones(2)), torch.sin(torch.ones(2)))


def normal_mean(data: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(data)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=data)


def test_new_data_at_setup_are_not_replaced_by_recorded_constants() -> None:
    """A graph recorded on one run's data must not serve the next run's (the graph is rebuilt at setup)."""
    kernel = RandomWalkMH(normal_mean)
    means = []
    for shift in (0.0, 5.0):
        pyro.set_rng_seed(0)
        data = shift + torch.randn(200, generator=torch.Generator().manual_seed(1))
        kernel.setup(20, data)
        params = kernel.initial_params
        draws = []
        for _ in range(400):
            params = kernel.sample(params)
            draws.append(float(params["mu"]))
        means.append(sum(draws[100:]) / 300)
        group = kernel.fg.groups[0]
        state = torch.randn(2, kernel.fg.num_variables)
        assert torch.allclose(group.log_factors(state), group._all_factors(state))
    assert abs(means[0] - 0.0) < 0.4 and abs(means[1] - 5.0) < 0.4


def test_a_model_indexing_with_a_scalar_sample_still_runs_correctly() -> None:
    table = torch.tensor([-1.0, 2.0])

    def model() -> None:
        z = pyro.sample("z", dist.Categorical(torch.tensor([0.5, 0.5])))
        s = pyro.sample("s", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(s + table[z], 1.0), obs=torch.tensor(0.0))

    from neuralblock.kernels.conditioning import set_conditioning

    kernel = RandomWalkMH(model)
    set_conditioning(kernel, {"z": torch.tensor(1)}, reset=True)
    kernel.setup(0)
    params = kernel.initial_params
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(30):  # past the recording (after 20 calls), which falls back
            params = kernel.sample(params)
    assert any("Python number" in str(w.message) for w in caught)
    state = torch.zeros(2, kernel.fg.num_variables)
    group = kernel.fg.groups[0]
    assert torch.allclose(group.log_factors(state), group._all_factors(state))


def test_state_read_by_the_function_is_caught_by_the_checks_on_later_calls() -> None:
    scale = {"value": 1.0}  # state outside the inputs: a recorded graph holds its value as a constant
    fast = ReplayedFunction(lambda x: x * scale["value"], "stateful", checks=2, record_after=1)
    fast(torch.ones(2))  # recorded with scale 1, and right for it
    scale["value"] = 3.0
    with pytest.warns(RuntimeWarning, match="disagrees"):
        got = fast(torch.ones(2))
    assert torch.equal(got, torch.full((2,), 3.0)) and fast.failure is not None


def test_functions_writing_into_fresh_buffers_are_recorded_and_stay_right() -> None:
    def scatter(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(4)
        out[1:3] = x  # an in-place write into a constant-born tensor: nothing downstream may be folded
        return out * 2

    fast = ReplayedFunction(scatter, "scatter", record_after=1)
    for _ in range(5):
        x = torch.randn(2)
        assert torch.equal(fast(x), scatter(x))
    assert fast.verified


def test_constant_outputs_and_batched_index_writes_and_strided_inputs() -> None:
    fast = ReplayedFunction(lambda x: (x * 2, torch.ones(3)), "constant output", record_after=1)
    for _ in range(4):
        fast(torch.randn(2))
    first = fast(torch.randn(2))[1]
    first.add_(5.0)  # a caller may write into a result: the next call's must not change
    assert torch.equal(fast(torch.randn(2))[1], torch.ones(3)) and fast.verified

    idx = torch.tensor([0, 2])

    def write(state: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        out = state.clone()
        out[..., idx] = value  # a None index before the tensor one (batched chains)
        return out

    fast = ReplayedFunction(write, "batched write", record_after=1)
    for _ in range(4):
        state, value = torch.randn(5, 4), torch.randn(5, 2)
        assert torch.equal(fast(state, value), write(state, value))
    assert fast.verified
    strided = torch.randn(4, 5).T  # same shape as the recorded input, other strides
    assert torch.equal(fast(strided, torch.zeros(5, 2)), write(strided, torch.zeros(5, 2)))


def test_fused_potential_values_and_gradients_equal_the_plain_potential_after_it_is_recorded() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=gen), torch.randn(40, generator=gen)

    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        w, log_s = params["w"], params["log_s"]
        lik = dist.StudentT(4.0, x @ w, log_s.exp(), validate_args=False).log_prob(y).sum()
        prior = dist.Normal(0.0, 1.0, validate_args=False).log_prob(w).sum() + dist.Gamma(
            2.0, 2.0, validate_args=False
        ).log_prob(log_s.exp())
        return -(lik + prior + log_s)

    fused = FusedPotential(potential, ["w", "log_s"], "a test potential", record_after=3)
    with pyro.validation_enabled(False):  # StudentT validates its inner Chi2 otherwise (a data-dependent check)
        _compare_fused_with_plain(fused, potential, gen)
    assert fused.value_and_grad.verified  # the later values came from the replayed graph


def _compare_fused_with_plain(fused: FusedPotential, potential, gen: torch.Generator) -> None:
    for step in range(12):  # before the recording, the recording call, its checks, and trusted replays
        point = {"w": torch.randn(3, generator=gen).requires_grad_(), "log_s": torch.randn((), generator=gen)}
        point["log_s"].requires_grad_()
        got, want = fused(point), potential(point)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-5), step
        got_grads = torch.autograd.grad(got, list(point.values()))
        want_grads = torch.autograd.grad(want, list(point.values()))
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got_grads, want_grads, strict=True))


def test_fused_potential_gives_zero_gradients_to_sites_it_does_not_read() -> None:
    fused = FusedPotential(lambda p: (p["a"] ** 2).sum(), ["a", "unused"], "a test potential", record_after=1)
    a, unused = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    grads = torch.autograd.grad(fused({"a": a, "unused": unused}), [a, unused])
    assert grads[0].tolist() == [2.0, 2.0] and grads[1].tolist() == [0.0, 0.0, 0.0]


def test_fused_potential_has_the_plain_potentials_hessian() -> None:
    """Newton steps and Laplace fits differentiate the gradient again (create_graph): the Hessian must be right."""

    def potential(params: dict[str, torch.Tensor]) -> torch.Tensor:
        x = params["x"]
        return (x**4).sum() / 4 + x[0] * x[1] + torch.exp(x).sum()

    fused = FusedPotential(potential, ["x"], "a test potential", record_after=1)
    for _ in range(4):  # past the recording and its checks
        x = torch.randn(3)
        got = torch.autograd.functional.hessian(lambda v: fused({"x": v}), x)
        want = torch.autograd.functional.hessian(lambda v: potential({"x": v}), x)
        assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert fused.value_and_grad.verified


def test_fused_potential_second_derivatives_for_some_sites_only() -> None:
    fused = FusedPotential(
        lambda p: (p["a"] ** 3).sum() + (p["a"] * p["b"]).sum(), ["a", "b"], "a test", record_after=1
    )
    b = torch.ones(2)  # a constant: no gradient asked for it
    for _ in range(3):
        a = torch.randn(2, requires_grad=True)
        (grad,) = torch.autograd.grad(fused({"a": a, "b": b}), a, create_graph=True)
        (curvature,) = torch.autograd.grad(grad.sum(), a)
        assert torch.allclose(grad, 3 * a**2 + b) and torch.allclose(curvature, 6 * a)


def test_tensors_written_through_a_list_argument_are_not_folded() -> None:
    def accumulate(x: torch.Tensor) -> torch.Tensor:
        buffer = torch.zeros(3)
        torch._foreach_add_([buffer], [x])
        return buffer * 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a wrongly folded buffer fails the checks and warns
        fast = ReplayedFunction(accumulate, "a list write", record_after=1)
        for _ in range(5):
            x = torch.randn(3)
            assert torch.allclose(fast(x), 2 * x)
    assert fast.verified


def test_a_stop_gradient_in_the_likelihood_keeps_its_gradient_through_the_direct_path() -> None:
    # the likelihood's compiled graphs are differentiated by autograd (FusedPotential records value and gradient
    # through them), so their `detach` must stay: dropping it gave 3.79 instead of 5.12 at mu = 0.3
    from pyro.infer.mcmc.util import initialize_model

    from neuralblock.pyro.likelihood import LogLikelihood

    y = torch.randn(10, generator=torch.Generator().manual_seed(0))

    def model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0 + mu.detach() ** 2), obs=y)

    init, pyro_potential, transforms, _ = initialize_model(model, (y,), {})
    fused = LogLikelihood(model, y).potential_fn({k: transforms[k] for k in init})
    for value in (0.3, 0.7, 1.1):
        for _ in range(25):  # past the recording and its checks
            x = torch.tensor(value, requires_grad=True)
            ours = torch.autograd.grad(fused({"mu": x}), x)[0]
        x = torch.tensor(value, requires_grad=True)
        theirs = torch.autograd.grad(pyro_potential({"mu": x}), x)[0]
        assert torch.allclose(ours, theirs, rtol=1e-5), (value, float(ours), float(theirs))


def test_neutral_arithmetic_is_dropped_but_never_hands_out_an_input_or_a_written_tensor() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuralblock.replay import simplify_graph

    zeros, ones = torch.zeros(3), torch.ones(3)

    def prior(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = (x - zeros) / ones
        return -(z**1 * 1.0 + 0.0).pow(2).sum(), x * ones  # the second output would be x itself

    gm = make_fx(prior)(torch.randn(3))
    before = len(gm.graph.nodes)
    simplify_graph(gm, no_grad=True)
    targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
    assert len(gm.graph.nodes) < before and not any("div" in t or "sub" in t for t in targets)
    x = torch.randn(3)
    value, same = gm(x)
    assert torch.allclose(value, -(x**2).sum()) and torch.equal(same, x) and same.data_ptr() != x.data_ptr()

    def written(x: torch.Tensor) -> torch.Tensor:
        y = x + 0.0
        y.add_(1.0)  # an in-place write on the result: x + 0 must stay a copy
        return y * 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fast = ReplayedFunction(written, "an in-place write after x + 0", record_after=1)
        for _ in range(4):
            x = torch.randn(3)
            copy = x.clone()
            assert torch.allclose(fast(x), 2 * (copy + 1)) and torch.equal(x, copy)


@pytest.mark.parametrize(
    "case",
    ["view of x * 1 as output", "x * 1 of an expanded tensor, then viewed", "1 / (x + 0) at -0.0"],
)
def test_neutral_arithmetic_kept_where_dropping_it_would_change_a_replay(case: str) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        if case == "view of x * 1 as output":
            return (x * 1).view(-1)
        if case == "x * 1 of an expanded tensor, then viewed":
            return (x[:1].expand(3, 3) * 1).view(-1)
        return 1 / (x + 0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback would warn: the replay must stay right and fast
        fast = ReplayedFunction(fn, case, checks=0, record_after=1)
        for x in (torch.tensor([-0.0, 1.0, 2.0]), torch.tensor([-0.0, 3.0, 5.0])):
            want, got = fn(x.clone()), fast(x.clone())
            assert torch.equal(got, want), (case, got, want)
            if case == "view of x * 1 as output":
                assert got.data_ptr() != x.data_ptr()


def test_a_constant_written_in_place_is_not_taken_as_neutral() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuralblock.replay import simplify_graph

    state = torch.zeros(3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x - state  # zero when recorded, but the next line writes it
        state.copy_(x)
        return 2 * y

    gm = make_fx(fn)(torch.ones(3))
    simplify_graph(gm)
    assert any(str(node.target).startswith("aten.sub") for node in gm.graph.nodes)


def test_record_graph_is_make_fx_with_one_fake_tensor_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same graph as make_fx; one fake-tensor mode for its metadata, not one per node (each records the stack)."""
    from torch._subclasses import fake_tensor
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            x = torch.tanh(x @ w) + x.sum(-1, keepdim=True)
        return x

    x, w = torch.randn(4, 3), torch.randn(3, 3)
    plain = make_fx(fn)(x, w)
    made = []
    original = fake_tensor.FakeTensorMode.__init__

    def counting_init(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(fake_tensor.FakeTensorMode, "__init__", counting_init)
    gm = record_graph(fn, x, w)
    assert len(made) == 1  # make_fx alone makes one per recorded tensor (over 60 here)
    assert [str(n.target) for n in gm.graph.nodes] == [str(n.target) for n in plain.graph.nodes]
    assert all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function")
    assert torch.equal(gm(x, w), fn(x, w))
    made.clear()
    make_fx(fn)(x, w)
    assert len(made) > 60  # make_fx alone: a mode per recorded tensor, what the shared one saves
