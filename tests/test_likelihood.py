"""The direct likelihood path equals the Pyro model's own log density on random models, plates and index sets."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch

from neuralblock.subsample import SectionEvaluator
from neuralblock.subsample.likelihood import CompileError, LogLikelihood, bucket_size

STYLES = ("matmul", "broadcast", "einsum", "plain")
FAMILIES = ("normal", "bernoulli", "poisson", "student", "gamma")


def _random_model(seed: int) -> tuple[Callable[[], None], str, str, int]:
    """A random GLM-like model: family, way of writing the linear predictor, plate size, dimension."""
    gen = torch.Generator().manual_seed(seed)
    family = FAMILIES[seed % len(FAMILIES)]
    style = STYLES[(seed // len(FAMILIES)) % len(STYLES)]
    n = int(torch.randint(20, 300, (1,), generator=gen))
    d = int(torch.randint(1, 6, (1,), generator=gen))
    X = torch.randn(n, d, generator=gen)
    eta = X @ torch.randn(d, generator=gen) * 0.5
    y = {
        "normal": eta + torch.randn(n, generator=gen),
        "bernoulli": torch.bernoulli(torch.sigmoid(eta), generator=gen),
        "poisson": torch.poisson(eta.exp(), generator=gen),
        "student": eta + torch.randn(n, generator=gen) * 2,
        "gamma": torch.distributions.Gamma(2.0, 2.0 / eta.exp()).sample(),
    }[family]

    def predictor(w: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        data = X if rows is None else X[rows]
        if style == "matmul":
            return data @ w
        if style == "broadcast":
            return (data * w.unsqueeze(-2)).sum(-1)
        return torch.einsum("nd,...d->...n", data, w)

    def likelihood(eta: torch.Tensor, s: torch.Tensor) -> dist.Distribution:
        return {
            "normal": lambda: dist.Normal(eta, s),
            "bernoulli": lambda: dist.Bernoulli(logits=eta),
            "poisson": lambda: dist.Poisson(eta.exp()),
            "student": lambda: dist.StudentT(4.0, eta, s),
            "gamma": lambda: dist.Gamma(s, s / eta.exp()),
        }[family]()

    def model() -> None:
        w = pyro.sample("w", dist.Normal(torch.zeros(d), 1.0).to_event(1))
        s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
        if style == "plain":
            with pyro.plate("data", n):
                pyro.sample("y", likelihood(predictor(w, None), s), obs=y)
        else:
            with pyro.plate("data", n) as idx:
                pyro.sample("y", likelihood(predictor(w, idx), s), obs=y[idx])

    return model, family, style, n


def _pyro_per_datum(model: Callable[[], None], values: dict[str, torch.Tensor]) -> torch.Tensor:
    """The Pyro model's own per-datum log-likelihood at ``values`` (an ordinary full trace)."""
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace()
    return trace.nodes["y"]["fn"].log_prob(trace.nodes["y"]["value"])


@pytest.mark.parametrize("seed", range(20))
def test_direct_path_equals_the_pyro_log_density_on_random_models(seed: int) -> None:
    model, family, style, n = _random_model(seed)
    log_lik = LogLikelihood(model)
    assert log_lik.evaluator.direct is not None and log_lik.evaluator.lazy, (family, style)
    gen = torch.Generator().manual_seed(1000 + seed)
    d = log_lik.shapes["w"][0]
    for points in (1, 2, 3):
        params = {"w": torch.randn(points, d, generator=gen), "s": torch.rand(points, generator=gen) + 0.5}
        for k in (1, 7, 16, 100, n):  # index sets of many sizes (bucketed and padded), with repeats for k = 7
            k = min(k, n)
            idx = torch.randint(n, (k,), generator=gen) if k == 7 else torch.randperm(n, generator=gen)[:k]
            got = log_lik(params, idx)
            assert got.shape == (points, k)
            for p in range(points):
                want = _pyro_per_datum(model, {"w": params["w"][p], "s": params["s"][p]})[idx]
                assert torch.allclose(got[p], want, rtol=1e-5, atol=1e-4), (family, style, points, k)
        full = log_lik(params, None)
        want = torch.stack([_pyro_per_datum(model, {"w": params["w"][p], "s": params["s"][p]}) for p in range(points)])
        assert torch.allclose(full, want, rtol=1e-5, atol=1e-4)


def test_potential_fn_is_minus_the_log_joint_with_jacobian() -> None:
    model, _, _, n = _random_model(3)
    log_lik = LogLikelihood(model)
    potential = log_lik.potential_fn()
    transforms = log_lik.transforms()
    w, s = torch.linspace(-0.3, 0.3, log_lik.shapes["w"][0]), torch.tensor(1.3)
    trace = poutine.trace(poutine.condition(model, data={"w": w, "s": s})).get_trace()
    jacobian = transforms["s"].inv.log_abs_det_jacobian(transforms["s"](s), s)
    want = -(trace.log_prob_sum() + jacobian)
    got = potential({"w": w, "s": transforms["s"](s)})
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    weights = torch.full((n,), 1.0)
    weighted = log_lik.weighted_potential_fn(torch.arange(n), weights)({"w": w, "s": transforms["s"](s)})
    assert torch.allclose(weighted, want, rtol=1e-5, atol=1e-4)


def test_gradients_flow_through_the_graph() -> None:
    model, _, _, n = _random_model(0)
    log_lik = LogLikelihood(model)
    w = torch.zeros(2, log_lik.shapes["w"][0], requires_grad=True)
    idx = torch.arange(min(n, 10))
    (grad,) = torch.autograd.grad(log_lik({"w": w, "s": torch.ones(2)}, idx).sum(), w)
    w_ref = torch.zeros(log_lik.shapes["w"][0], requires_grad=True)
    (want,) = torch.autograd.grad(_pyro_per_datum(model, {"w": w_ref, "s": torch.tensor(1.0)})[idx].sum(), w_ref)
    assert torch.allclose(grad[0], want, atol=1e-5)


Y = torch.randn(50)


def branching_model() -> None:
    """Python control flow on a parameter value: the graph cannot replay it."""
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    scale = 1.0 if float(mu) > 0 else 3.0
    with pyro.plate("data", 50) as idx:
        pyro.sample("y", dist.Normal(mu, scale), obs=Y[idx])


def test_uncompilable_model_raises_or_falls_back_with_a_warning() -> None:
    with pytest.raises(CompileError, match="turns a sampled value into a Python number|disagrees"):
        LogLikelihood(branching_model)
    with pytest.warns(RuntimeWarning, match="cannot be compiled"):
        log_lik = LogLikelihood(branching_model, strict=False)
    assert log_lik.evaluator.direct is None
    mu = torch.tensor([-0.5, 0.5])
    got = log_lik({"mu": mu}, torch.tensor([3, 4]))
    want = torch.stack([dist.Normal(m, 1.0 if m > 0 else 3.0).log_prob(Y[[3, 4]]) for m in mu])
    assert torch.allclose(got, want)


def latent_local_model() -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 50) as idx:
        z = pyro.sample("z", dist.Normal(mu, 1.0))
        pyro.sample("y", dist.Normal(z, 1.0), obs=Y[idx])


def test_latent_sites_inside_the_plate_are_named() -> None:
    with pytest.raises(ValueError, match="'z'"):
        LogLikelihood(latent_local_model)


def scaled_model() -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 50) as idx, poutine.scale(scale=2.5):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=Y[idx])


def test_user_scales_are_kept_and_the_plate_factor_divided_out() -> None:
    got = LogLikelihood(scaled_model)({"mu": torch.tensor([0.2])}, torch.tensor([1, 2, 3]))
    assert torch.allclose(got[0], 2.5 * dist.Normal(0.2, 1.0).log_prob(Y[[1, 2, 3]]))


def test_fixed_local_latent_through_the_direct_path() -> None:
    z = torch.linspace(-1, 1, 50)
    sections = SectionEvaluator(latent_local_model, "data", 50, local_dims={"z": -1})
    values = {"mu": torch.tensor(0.3), "z": z}
    assert sections.check_lazy(values)
    idx = torch.tensor([8, 1, 33])
    expected = dist.Normal(0.3, 1.0).log_prob(z[idx]) + dist.Normal(z[idx], 1.0).log_prob(Y[idx])
    assert torch.allclose(sections.evaluate(values, idx).sections, expected)
    assert sections.direct is not None and sections.direct._graphs


def test_bucket_sizes_are_powers_of_two_up_to_n() -> None:
    assert [bucket_size(k, 1000) for k in (1, 16, 17, 100, 600)] == [16, 16, 32, 128, 600]
    assert all(bucket_size(k, 10**6) >= k for k in range(1, 2000, 37))
    assert math.log2(bucket_size(300, 10**6)).is_integer()


def test_plain_plate_model_is_lazy_through_the_direct_path() -> None:
    model, _, style, n = _random_model(15)  # a plain obs=y plate
    assert style == "plain"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not sublinear" warning: the direct path re-indexes the data
        log_lik = LogLikelihood(model)
    assert log_lik.evaluator.lazy and log_lik.evaluator.direct.plain


def test_a_new_evaluator_reuses_the_graphs_of_the_same_model_and_data_and_no_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from neuralblock.pyro.likelihood import DirectPath, _sharing_key, shared_graphs

    y = torch.randn(200, generator=torch.Generator().manual_seed(3))
    scale = torch.tensor(1.5)

    def noise() -> torch.Tensor:  # the model reads `scale` through a helper: its key cannot see it
        return scale

    def model(y: torch.Tensor, shift: float | list[float]) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        offset = shift[0] if isinstance(shift, list) else shift
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("y", dist.Normal(mu + offset, noise()), obs=y[idx])

    built: list[None] = []
    build = DirectPath._build

    def counted(self: DirectPath, *args: object) -> object:
        built.append(None)
        return build(self, *args)

    idx, params = torch.tensor([3, 7, 11]), {"mu": torch.tensor([0.0, 0.5])}

    def new_traces(*args: object) -> int:
        """How many graphs a new LogLikelihood traces for one evaluation (which must equal Pyro's terms)."""
        before = len(built)
        got = LogLikelihood(model, *args)(params, idx)
        data, shift = args
        offset = shift[0] if isinstance(shift, list) else shift
        assert torch.allclose(got, dist.Normal(params["mu"][:, None] + offset, scale).log_prob(data[idx]))
        return len(built) - before

    shared_graphs(clear=True)
    monkeypatch.setattr(DirectPath, "_build", counted)
    try:
        per_model = new_traces(y, 0.25)
        assert per_model > 0 and shared_graphs() == per_model
        assert new_traces(y, 0.25) == 0  # the same model and data: nothing traced again
        assert new_traces(y, 0.5) == per_model  # another argument value
        assert new_traces(y.clone(), 0.25) == per_model  # another data tensor
        assert new_traces(y, [0.25]) == new_traces(y, [0.25]) == per_model  # a list can change unseen: never shared
        y.mul_(2.0)  # changed in place: its version counter moved
        assert new_traces(y, 0.25) == per_model
        scale = torch.tensor(0.5)  # the same key, other terms: the reused graph fails the new evaluator's check
        assert new_traces(y, 0.25) == per_model and new_traces(y, 0.25) == 0
    finally:
        shared_graphs(clear=True)

    def direct(y: torch.Tensor) -> None:  # a tensor in the model's own closure is part of its key
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("y", dist.Normal(mu, scale), obs=y[idx])

    key = _sharing_key(LogLikelihood(direct, y).evaluator)
    assert key is not None and key == _sharing_key(LogLikelihood(direct, y).evaluator)
    scale = torch.tensor(2.0)
    assert key != _sharing_key(LogLikelihood(direct, y).evaluator)
    key = _sharing_key(LogLikelihood(direct, y).evaluator)
    pyro.param("offset", torch.zeros(()))  # Pyro's parameter store is part of every key
    assert key != _sharing_key(LogLikelihood(direct, y).evaluator)

    class Model:
        def __call__(self, y: torch.Tensor) -> None:
            direct(y)

    assert _sharing_key(LogLikelihood(Model(), y).evaluator) is None  # an object's state can change unseen
