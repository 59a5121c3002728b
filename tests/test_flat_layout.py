"""The shared flat layout of the global kernels (neuralblock.pyro.layout) and the data-plate finder."""

from __future__ import annotations

import math
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from torch.distributions import biject_to, constraints

from neuralblock.priorswap import SiteLayout
from neuralblock.priorswap import layout as priorswap_layout
from neuralblock.pyro import FlatLayout, find_data_plate
from neuralblock.pyro.layout import is_identity

SUPPORTS = {
    "beta": ((3,), constraints.real),
    "sigma": ((), constraints.positive),
    "w": ((4,), constraints.simplex),
    "p": ((2,), constraints.interval(-1.0, 2.0)),
}


def layout_of(*names: str) -> FlatLayout:
    return FlatLayout({n: SUPPORTS[n][0] for n in names}, {n: SUPPORTS[n][1] for n in names})


def test_priorswap_site_layout_is_the_same_class() -> None:
    assert SiteLayout is FlatLayout
    assert priorswap_layout.SiteLayout is FlatLayout
    assert isinstance(SiteLayout({"theta": ()}), FlatLayout)


def test_dims_and_shapes_in_both_spaces() -> None:
    layout = layout_of("beta", "sigma", "w", "p")
    assert layout.dim == 3 + 1 + 3 + 2 and layout.constrained_dim == 3 + 1 + 4 + 2
    assert layout.unconstrained_shapes["w"] == (3,) and layout.shapes["w"] == (4,)
    assert layout.constrained_sites == ["sigma", "w", "p"] and layout.reshaped_sites == ["w"]
    assert layout.identity == {"beta": True, "sigma": False, "w": False, "p": False}
    assert is_identity(biject_to(constraints.real_vector)) and not is_identity(biject_to(constraints.simplex))


@pytest.mark.parametrize("name", ["beta", "sigma", "w", "p"])
def test_log_jacobian_matches_torch_transforms(name: str) -> None:
    torch.manual_seed(0)
    layout = layout_of(name)
    shape, support = SUPPORTS[name]
    z = torch.randn(5, layout.dim, dtype=torch.float64)
    values, log_jacobian = layout.constrain(z)
    transform = biject_to(support)
    u = z.reshape((5, *layout.unconstrained_shapes[name]))
    expected = transform(u)
    assert values[name].shape == (5, *shape)
    torch.testing.assert_close(values[name], expected)
    assert bool(support.check(values[name]).all())
    want = transform.log_abs_det_jacobian(u, expected).reshape(5, -1).sum(-1)
    torch.testing.assert_close(log_jacobian, want)
    theta, log_det = layout.to_constrained(z)  # the flat map agrees with the dict map
    torch.testing.assert_close(theta, layout.flatten(values))
    torch.testing.assert_close(log_det, want)


def test_log_jacobian_of_several_sites_is_the_sum_and_matches_autograd() -> None:
    torch.manual_seed(1)
    layout = layout_of("sigma", "p", "beta")  # shape-preserving: the Jacobian is square
    z = torch.randn(layout.dim, dtype=torch.float64)
    _, log_jacobian = layout.constrain(z[None])
    jacobian = torch.autograd.functional.jacobian(lambda x: layout.to_constrained(x)[0], z)
    torch.testing.assert_close(log_jacobian[0], torch.linalg.slogdet(jacobian)[1])
    values, scalar = layout.constrain_params(layout.unflatten(z))
    torch.testing.assert_close(scalar, log_jacobian[0])
    point = layout.constrain_point(z)
    assert all(torch.equal(point[n], values[n]) for n in layout.shapes)


def test_round_trips() -> None:
    torch.manual_seed(2)
    layout = layout_of("beta", "sigma", "w", "p")
    z = torch.randn(6, layout.dim, dtype=torch.float64)
    theta, _ = layout.to_constrained(z)
    torch.testing.assert_close(layout.to_unconstrained(theta), z)
    values = layout.constrain(z)[0]
    back = layout.unconstrain(values)
    torch.testing.assert_close(layout.flatten(back, constrained=False), z)
    assert torch.equal(layout.flatten(layout.unflatten(z), constrained=False), z)
    assert torch.equal(layout.flatten(layout.unflatten(theta, constrained=True)), theta)
    params = layout.unflatten(z[0])
    assert {n: v.shape for n, v in params.items()} == layout.unconstrained_shapes
    assert torch.equal(layout.flatten_point(params), z[0])


def test_batch_shapes() -> None:
    layout = layout_of("beta", "sigma")
    flat = torch.zeros(2, 7, layout.dim)
    parts = layout.unflatten(flat)
    assert parts["beta"].shape == (2, 7, 3) and parts["sigma"].shape == (2, 7)
    theta, log_det = layout.to_constrained(flat)
    assert theta.shape == (2, 7, 4) and log_det.shape == (2, 7)
    values, log_jacobian = layout.constrain(torch.zeros(7, layout.dim))
    assert values["beta"].shape == (7, 3) and values["sigma"].shape == (7,) and log_jacobian.shape == (7,)
    one = layout.unflatten(torch.arange(4.0))
    assert one["beta"].tolist() == [0.0, 1.0, 2.0] and one["sigma"].shape == ()


def test_real_sites_pass_through_without_copies() -> None:
    layout = layout_of("beta")
    z = torch.randn(3, 3, requires_grad=True)
    values, log_jacobian = layout.constrain(z)
    assert values["beta"] is z and not log_jacobian.any()
    theta, _ = layout.to_constrained(z)
    assert theta is z


def test_autograd_flows_through_flatten_and_constrain() -> None:
    layout = layout_of("sigma", "beta")
    params = {"sigma": torch.tensor(0.3, requires_grad=True), "beta": torch.ones(3, requires_grad=True)}
    z = layout.flatten_point(params)
    values, log_jacobian = layout.constrain(z[None])
    (values["sigma"].sum() + log_jacobian.sum()).backward()
    # d/dz (exp(z) + z) at z = 0.3
    assert params["sigma"].grad is not None and float(params["sigma"].grad) == pytest.approx(math.exp(0.3) + 1, 1e-6)


def test_from_trace_and_from_samples() -> None:
    def model() -> None:
        pyro.sample("s", dist.LogNormal(0.0, 1.0))
        pyro.sample("w", dist.Dirichlet(torch.ones(3)))
        pyro.sample("b", dist.Normal(torch.zeros(2), 1.0).to_event(1))

    layout = FlatLayout.from_trace(poutine.trace(model).get_trace(), ["b", "w", "s"])
    assert list(layout.shapes) == ["b", "w", "s"] and layout.dim == 2 + 2 + 1
    assert layout.identity["b"] and not layout.identity["s"]
    assert FlatLayout.from_samples({"a": torch.zeros(10, 2, 3)}).shapes == {"a": (2, 3)}
    with pytest.raises(ValueError, match="'nope'"):
        FlatLayout.from_trace(poutine.trace(model).get_trace(), ["nope"])


def test_bad_input_raises_naming_the_site() -> None:
    layout = layout_of("beta", "sigma")
    with pytest.raises(ValueError, match="'sigma'"):
        layout.flatten({"beta": torch.zeros(4, 3)})
    with pytest.raises(ValueError, match="'beta'"):
        layout.flatten({"beta": torch.zeros(4, 2), "sigma": torch.zeros(4)})
    with pytest.raises(ValueError, match="'beta'"):
        layout.flatten_point({"beta": torch.zeros(2), "sigma": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="'sigma'"):
        layout.flatten_point({"beta": torch.zeros(3)})
    with pytest.raises(ValueError, match="'sigma'"):
        layout.constrain_params({"beta": torch.zeros(3)})
    with pytest.raises(ValueError, match="'sigma'"):
        layout.to_unconstrained(torch.tensor([[0.0, 0.0, 0.0, -1.0]]))
    with pytest.raises(ValueError, match="'sigma'"):
        layout.unconstrain({"beta": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"\[\.\.\., 4\]"):
        layout.unflatten(torch.zeros(5))
    with pytest.raises(ValueError, match=r"\[P, 4\]"):
        layout.constrain(torch.zeros(4))
    with pytest.raises(ValueError, match="'k'"):
        FlatLayout({"k": ()}, {"k": constraints.nonnegative_integer})
    with pytest.raises(ValueError, match="unknown sites"):
        FlatLayout({"a": ()}, {"b": constraints.positive})
    with pytest.raises(ValueError, match="at least one site"):
        FlatLayout({})


def _data_model(x: torch.Tensor, y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("groups", 2):
        pyro.sample("g", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), dim=-2) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0).expand([len(idx), 1]), obs=y[idx, None])
    with pyro.plate("other", len(x)):
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x)


def _one_plate_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), dim=-2):
        pyro.sample("y", dist.Normal(mu, 1.0).expand([len(y), 1]), obs=y[:, None])


def test_find_data_plate() -> None:
    one = poutine.trace(_one_plate_model).get_trace(torch.zeros(5))
    assert find_data_plate(one) == ("data", 5, -2)
    assert find_data_plate(one, shared=True, owner="K") == ("data", 5, -2)
    two = poutine.trace(_data_model).get_trace(torch.zeros(3), torch.zeros(5))
    with pytest.raises(ValueError, match="pass plate=<name>"):
        find_data_plate(two)
    with pytest.raises(ValueError, match="K needs one data plate shared.*pass plate="):
        find_data_plate(two, shared=True, owner="K")
    assert find_data_plate(two, "data") == ("data", 5, -2)
    assert find_data_plate(two, "groups") == ("groups", 2, None)  # a plate without observed sites
    with pytest.raises(ValueError, match="plate 'groups' holds no observed site"):
        find_data_plate(two, "groups", shared=True)
    with pytest.raises(ValueError, match="plate 'rows' is not a plate of the model"):
        find_data_plate(two, "rows")


def test_pickles() -> None:
    layout = layout_of("sigma", "w")
    copy = pickle.loads(pickle.dumps(layout))
    z = torch.randn(3, layout.dim)
    (a, la), (b, lb) = layout.constrain(z), copy.constrain(z)
    assert all(torch.equal(a[n], b[n]) for n in a) and torch.equal(la, lb)


def _weights_model(x: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Dirichlet(torch.ones(2)))
    with pyro.plate("data", len(x)) as idx:
        mix = dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(torch.tensor([-2.0, 2.0]), 1.0))
        pyro.sample("x", mix, obs=x[idx])


def test_austerity_walks_a_simplex_site_in_its_unconstrained_shape() -> None:
    from pyro.infer import MCMC

    from neuralblock.kernels.austerity import AusterityMH

    pyro.set_rng_seed(0)
    x = torch.cat([torch.randn(150) - 2, torch.randn(50) + 2])
    kernel = AusterityMH(_weights_model, epsilon=0.05, batch_size=50, normality_check=False)
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=40, disable_progbar=True)
    mcmc.run(x)
    w = mcmc.get_samples()["w"]
    assert kernel.layout.unconstrained_shapes["w"] == (1,) and w.shape == (40, 2)
    assert torch.allclose(w.sum(-1), torch.ones(40)) and 0.6 < float(w[:, 0].mean()) < 0.9
