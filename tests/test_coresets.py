"""Hilbert coresets: solver invariants, projections, the weighted Pyro model, streaming merge, bad input.

Statistical checks use z-scores against Monte Carlo standard errors with a two-sided threshold of
4.5 (false-failure rate below 1e-5 per check, under a normal approximation of the MC error); the
coreset bias checks compare closed-form Gaussian posteriors, so they are exact computations.
"""

from __future__ import annotations

import math
import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, RandomWalkKernel
from pyro.infer.mcmc.util import initialize_model

from neuralblock.coresets import (
    Coreset,
    FrankWolfe,
    HilbertCoreset,
    Projector,
    coreset_error,
    frank_wolfe,
    laplace_samples,
    merge_coresets,
    nnls_gram,
    prior_samples,
    streaming_coreset,
    subsample_mcmc_samples,
    weighted_model,
)

Z = 4.5
PRIOR_SD = 3.0


def gaussian_model(x: torch.Tensor) -> None:
    """theta ~ N(0, 3^2 I_2), x_n ~ N(theta, I_2)."""
    theta = pyro.sample("theta", dist.Normal(torch.zeros(2, dtype=x.dtype), PRIOR_SD).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("x", dist.Normal(theta, 1.0).to_event(1), obs=x[idx])


def gaussian_posterior(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form (isotropic) posterior mean and variance of ``theta`` under per-datum weights."""
    precision = PRIOR_SD**-2 + weights.sum()
    return (weights @ x) / precision, 1.0 / precision


def gaussian_kl(x: torch.Tensor, weights: torch.Tensor) -> float:
    """KL(coreset posterior || full posterior) for the isotropic Gaussian model."""
    m1, v1 = gaussian_posterior(x, weights)
    m0, v0 = gaussian_posterior(x, torch.ones(len(x), dtype=x.dtype))
    d = x.shape[1]
    return float(0.5 * (d * v1 / v0 + ((m1 - m0) ** 2).sum() / v0 - d + d * math.log(v0 / v1)))


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randn(400, 2, dtype=torch.float64) + torch.tensor([1.0, -2.0], dtype=torch.float64)


def projector(x: torch.Tensor, norm: str = "fisher", num_samples: int = 200, **kw) -> Projector:
    samples = laplace_samples(gaussian_model, num_samples, model_args=(x,))
    return Projector.from_model(gaussian_model, samples, norm=norm, model_args=(x,), **kw)


# --- solvers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 7, 30])
def test_frank_wolfe_invariants(size: int) -> None:
    features = torch.randn(120, 25) + 0.3
    result = frank_wolfe(features, size)
    assert int((result.weights > 0).sum()) <= size and bool((result.weights >= 0).all())
    assert len(result.errors) == size
    assert bool((result.errors[1:] <= result.errors[:-1] + 1e-9).all())
    # the tracked error equals the error recomputed from the weights
    assert result.errors[-1].item() == pytest.approx(coreset_error(features, result.weights), rel=1e-4, abs=1e-6)


def test_frank_wolfe_error_shrinks_with_size_and_reaches_zero_on_a_basis() -> None:
    features = torch.randn(200, 10, dtype=torch.float64)
    errors = frank_wolfe(features, 150).errors
    assert errors[-1] < 0.1 * errors[0]
    weights = frank_wolfe(torch.eye(5, dtype=torch.float64), 5).weights
    assert torch.allclose(weights, torch.ones(5, dtype=torch.float64))


def test_fully_corrective_frank_wolfe_never_does_worse() -> None:
    features = torch.randn(300, 40, dtype=torch.float64) + 0.2
    plain, corrective = frank_wolfe(features, 60), frank_wolfe(features, 60, refine_every=10)
    for result in (plain, corrective):
        assert int((result.weights > 0).sum()) <= 60 and bool((result.weights >= 0).all())
        assert bool((result.errors[1:] <= result.errors[:-1] + 1e-9).all())
    assert corrective.errors[-1] <= plain.errors[-1] + 1e-9
    scale = float(features.sum(0).norm())
    assert corrective.errors[-1].item() == pytest.approx(coreset_error(features, corrective.weights), abs=1e-6 * scale)


def test_frank_wolfe_tolerance_stops_early_and_keeps_the_invariants() -> None:
    features = torch.randn(400, 30, dtype=torch.float64) + 0.3
    scale = float(features.sum(0).norm())
    full = frank_wolfe(features, 200, refine_every=10)
    early = frank_wolfe(features, 200, refine_every=10, tol=0.05)
    assert len(full.errors) == 200 and len(early.errors) < 200
    assert float(early.errors[-1]) <= 0.05 * scale and float(early.errors[-2]) > 0.05 * scale
    assert int((early.weights > 0).sum()) <= len(early.errors) and bool((early.weights >= 0).all())
    assert float(early.errors[-1]) == pytest.approx(coreset_error(features, early.weights), abs=1e-6 * scale)
    # the same answer from a column-major copy (the layout Projector.project returns)
    column_major = frank_wolfe(features.T.contiguous().T, 200, refine_every=10, tol=0.05)
    assert torch.allclose(column_major.weights, early.weights, atol=1e-9 * float(early.weights.max()))
    with pytest.raises(ValueError, match="tol"):
        frank_wolfe(features, 5, tol=1.0)
    with pytest.raises(ValueError, match="tol"):
        FrankWolfe(tol=-0.1)
    with pytest.raises(ValueError, match="refine_every"):
        FrankWolfe(refine_every=-1)


def test_frank_wolfe_with_several_picks_reaches_the_tolerance_in_fewer_passes() -> None:
    g = torch.Generator().manual_seed(1)
    features = torch.randn(2000, 40, generator=g, dtype=torch.float64) + 0.3
    scale = float(features.sum(0).norm())
    one = frank_wolfe(features, 400, refine_every=1, tol=0.02)
    for picks in (2, 4, 8):
        many = frank_wolfe(features, 400, refine_every=1, tol=0.02, picks=picks)
        error = coreset_error(features, many.weights)
        assert error <= 0.02 * scale and float(many.errors[-1]) == pytest.approx(error, abs=1e-6 * scale)
        assert len(many.errors) < len(one.errors), (picks, len(many.errors), len(one.errors))
        assert bool((many.weights >= 0).all()) and bool((many.errors[1:] <= many.errors[:-1] + 1e-9).all())
    capped = frank_wolfe(features, 12, refine_every=1, picks=8)  # the support never outgrows the budget
    assert 0 < int((capped.weights > 0).sum()) <= 12
    with pytest.raises(ValueError, match="refine_every=1"):
        frank_wolfe(features, 5, refine_every=2, picks=2)
    with pytest.raises(ValueError, match="refine_every=1"):
        FrankWolfe(picks=3)
    with pytest.raises(ValueError, match="picks"):
        FrankWolfe(refine_every=1, picks=0)


def test_frank_wolfe_stops_on_the_exact_error_with_float32_features() -> None:
    # a large common component: the running error ||L||^2 - 2<L, L(w)> + ||L(w)||^2 cancels to ~sqrt(eps) ||L||
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        torch.randn(400, 30, generator=g)  # the third draw made the running error stop early before the fix
    features = (torch.randn(400, 30, generator=g) + 30.0).float()
    scale = float(features.double().sum(0).norm())
    for refine_every in (0, 10):
        result = frank_wolfe(features, 300, refine_every=refine_every, tol=1e-5)
        true_error = coreset_error(features.double(), result.weights)
        # the reported error is the returned weights' true error, to float32 rounding of the total ~1e-7 ||L||
        assert float(result.errors[-1]) == pytest.approx(true_error, abs=1e-6 * scale)
        if len(result.errors) < 300:  # it stopped: on the true error (before the fix it stopped at 2.2x tol)
            assert true_error <= 1.1e-5 * scale


def test_nnls_matches_the_kkt_conditions() -> None:
    rows = torch.randn(25, 12, dtype=torch.float64)
    target = torch.randn(12, dtype=torch.float64)
    w = nnls_gram(rows @ rows.T, rows @ target)
    grad = rows @ (w @ rows - target)  # gradient of ||F^T w - L||^2 / 2
    assert bool((w >= 0).all())
    assert float(grad[w > 0].abs().max()) < 1e-8 and float(grad[w == 0].min()) > -1e-8


@pytest.mark.parametrize("method", ["uniform", "is", "fw"])
def test_hilbert_coreset_invariants(data: torch.Tensor, method: str) -> None:
    proj = projector(data)
    coreset = HilbertCoreset(proj, method)
    for size in (1, 5, 40):
        core = coreset.build(size)
        assert len(core.indices) <= size and bool((core.weights > 0).all())
        assert torch.equal(core.indices, torch.sort(core.indices).values)
        dense = coreset.weights()
        assert dense.shape == (400,) and int((dense > 0).sum()) == len(core.indices)
        assert coreset.error() == pytest.approx(coreset_error(coreset.features, dense), rel=1e-6)
        assert coreset.error() == pytest.approx(proj.error(core), rel=1e-4)


def test_random_constructions_are_unbiased_and_their_error_shrinks(data: torch.Tensor) -> None:
    proj = projector(data)
    features = proj.project().to(torch.float64)
    for method in ("uniform", "is"):
        coreset = HilbertCoreset(proj, method)
        sums, errors = [], {}
        for size in (10, 160):
            errs = []
            for _ in range(60):
                weights = coreset.build(size) and coreset.weights()
                errs.append(coreset.error())
                if size == 10:
                    sums.append(weights.to(torch.float64) @ features)
            errors[size] = sum(errs) / len(errs)
        sums_t = torch.stack(sums)
        mcse = sums_t.std(0) / math.sqrt(len(sums))
        z = (sums_t.mean(0) - features.sum(0)) / mcse
        assert float(z.abs().max()) < Z + 1.0  # Bonferroni over J = 200 coordinates, alpha ~ 1e-4
        assert errors[160] < 0.5 * errors[10]  # error ~ 1/sqrt(M)


def test_coreset_posterior_bias_shrinks_with_size(data: torch.Tensor) -> None:
    """Exact KL(coreset posterior || posterior) of the conjugate model; FW beats uniform at equal M."""
    proj = projector(data)
    fw = HilbertCoreset(proj, "fw")
    kls = [gaussian_kl(data, fw.build(m) and fw.weights()) for m in (1, 3, 10, 50)]
    assert all(b <= a * 1.05 for a, b in zip(kls, kls[1:])) and kls[-1] < 0.2 * kls[0]
    uniform = HilbertCoreset(proj, "uniform")
    kl_uniform = sum(gaussian_kl(data, uniform.build(50) and uniform.weights()) for _ in range(20)) / 20
    assert kls[-1] < 0.1 * kl_uniform


# --- projections ---------------------------------------------------------------------------------


def test_fisher_features_estimate_the_weighted_fisher_inner_product(data: torch.Tensor) -> None:
    """f_n . f_m -> E_pi[grad L_n . grad L_m] = (x_n - m).(x_m - m) + tr(S) for pi = N(m, S)."""
    x = data[:4]
    num, mean, sd = 20000, torch.tensor([0.5, -1.0], dtype=torch.float64), 0.3
    samples = {"theta": mean + sd * torch.randn(num, 2, dtype=torch.float64)}
    proj = Projector.from_model(gaussian_model, samples, norm="fisher", model_args=(x,))
    per_sample, _ = proj._evaluate(torch.arange(4))  # [J, 4] scaled directional derivatives (and log-likelihoods)
    products = per_sample[:, :, None] * per_sample[:, None, :]  # unbiased terms of the Gram matrix
    estimate, mcse = products.mean(0), products.std(0) / math.sqrt(num)
    exact = (x - mean) @ (x - mean).T + 2 * sd**2
    features = proj.project()
    assert torch.allclose(features @ features.T, estimate, rtol=1e-9)
    assert float(((estimate - exact) / mcse).abs().max()) < Z


def test_l2_features_are_centred_log_likelihoods(data: torch.Tensor) -> None:
    x = data[:5]
    samples = {"theta": torch.randn(50, 2, dtype=torch.float64)}
    features = Projector.from_model(gaussian_model, samples, norm="l2", model_args=(x,)).project()
    ll = dist.Normal(samples["theta"][:, None, :], 1.0).log_prob(x).sum(-1).T  # [5, 50]
    assert torch.allclose(features, (ll - ll.mean(1, keepdim=True)) / math.sqrt(50))


def test_chunking_and_loops_give_the_same_features(data: torch.Tensor) -> None:
    samples = laplace_samples(gaussian_model, 30, model_args=(data,))
    gen = torch.Generator().manual_seed(3)
    base = Projector.from_model(gaussian_model, samples, model_args=(data,), generator=gen)
    chunked = Projector(base.loglik, base.samples, 400, chunk_size=7)
    chunked.directions = base.directions
    looped = Projector(base.loglik, base.samples, 400, vectorize=False)
    looped.directions = base.directions
    full = base.project()
    assert torch.allclose(chunked.project(), full) and torch.allclose(looped.project(), full)
    assert torch.allclose(base.total(), full.sum(0))


def test_pi_hat_helpers_match_the_posterior_and_prior(data: torch.Tensor) -> None:
    mean, var = gaussian_posterior(data, torch.ones(400, dtype=torch.float64))
    draws = laplace_samples(gaussian_model, 4000, model_args=(data,))["theta"]
    assert float(((draws.mean(0) - mean) / math.sqrt(var / 4000)).abs().max()) < Z
    assert float((draws.var(0) / var - 1).abs().max()) < Z * math.sqrt(2 / 4000)
    prior = prior_samples(gaussian_model, 2000, model_args=(data,))["theta"]
    assert float((prior.mean(0) / (PRIOR_SD / math.sqrt(2000))).abs().max()) < Z
    sub = subsample_mcmc_samples(gaussian_model, 30, 40, model_args=(data,))
    assert sub["theta"].shape == (30, 2) and torch.isfinite(sub["theta"]).all()


def test_projection_is_column_major_with_the_same_values(data: torch.Tensor) -> None:
    proj = projector(data, num_samples=20)
    features = proj.project()
    assert features.shape == (400, 20) and features.stride(0) == 1  # [J, N] storage
    loglik = proj.loglik
    theta, direction = proj.samples[3], proj.directions[3]
    grad = torch.func.jacrev(lambda t: loglik(t, torch.tensor([5])))(theta)[0]
    assert float(features[5, 3]) == pytest.approx(float(grad @ direction) / math.sqrt(20), rel=1e-9)


def test_laplace_finds_a_mode_far_from_the_initial_point() -> None:
    """A Poisson regression of counts ~ 200: the intercept's mode lies hundreds of units from init."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(3000, 2, generator=gen, dtype=torch.float64), torch.ones(3000, 1)], 1)
    y = torch.poisson(torch.nn.functional.softplus(x @ torch.tensor([5.0, -3.0, 200.0], dtype=torch.float64)))

    def model(x: torch.Tensor, y: torch.Tensor) -> None:
        beta = pyro.sample("beta", dist.Normal(torch.zeros(3, dtype=x.dtype), 1000.0).to_event(1))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("y", dist.Poisson(torch.nn.functional.softplus(x[idx] @ beta)), obs=y[idx])

    draws = laplace_samples(model, 4000, model_args=(x, y))["beta"]
    mode = draws.mean(0)
    loglik = lambda b: dist.Poisson(torch.nn.functional.softplus(x @ b)).log_prob(y).sum()  # noqa: E731
    grad = torch.func.grad(loglik)(mode)
    hessian = torch.func.hessian(loglik)(mode)
    # a Newton step from the draws' mean moves it by much less than the posterior sd (MC error ~ sd / 63)
    step = torch.linalg.solve(-hessian, grad) / draws.std(0)
    assert float(step.abs().max()) < Z / math.sqrt(4000)
    with pytest.warns(UserWarning, match="did not converge"):
        laplace_samples(model, 10, model_args=(x, y), num_steps=2)


def test_laplace_in_float32_stops_at_the_mode_at_float_precision() -> None:
    """A float32 logistic regression of 1e5 points: the log joint (3e4 nats) has a rounding unit of 2e-3 nats,
    and rounding noise keeps the gradient near 1 close to the mode. Newton used to creep there by rounding luck
    until num_steps ran out (2 s and a warning for this start); it must stop near the float64 mode."""
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(100_000, 9, generator=gen), torch.ones(100_000, 1)], dim=1)
    y = torch.bernoulli(torch.sigmoid(x @ torch.randn(10, generator=gen)), generator=gen)

    def model(x: torch.Tensor, y: torch.Tensor) -> None:
        beta = pyro.sample("beta", dist.Normal(torch.zeros(10), 1.0).to_event(1))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ beta), obs=y[idx])

    def log_joint(b: torch.Tensor) -> torch.Tensor:
        logits = x.double() @ b
        return dist.Bernoulli(logits=logits).log_prob(y.double()).sum() - 0.5 * (b**2).sum()

    pyro.set_rng_seed(8)  # an initial point from which the old stopping rule crept for all 50 steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "did not converge"
        draws = laplace_samples(model, 4000, model_args=(x, y))["beta"].double()
    mode = torch.zeros(10, dtype=torch.float64)
    for _ in range(20):  # float64 Newton from the origin (the posterior is log-concave)
        mode = mode - torch.linalg.solve(torch.func.hessian(log_joint)(mode), torch.func.grad(log_joint)(mode))
    sd = torch.linalg.inv(-torch.func.hessian(log_joint)(mode)).diagonal().sqrt()
    # the draws' mean: the found mode plus Monte Carlo error sd / 63; the mode itself within a few 1e-2 sd
    assert float(((draws.mean(0) - mode) / sd).abs().max()) < Z / math.sqrt(4000) + 0.05


# --- weighted model ------------------------------------------------------------------------------


def test_weighted_model_log_density_is_the_weighted_sum(data: torch.Tensor) -> None:
    core = Coreset(torch.tensor([3, 10, 250]), torch.tensor([0.5, 7.0, 120.25], dtype=torch.float64))
    model = weighted_model(gaussian_model, core)
    trace = poutine.trace(model).get_trace(data)
    theta = trace.nodes["theta"]["value"]
    expected = (
        dist.Normal(torch.zeros(2, dtype=torch.float64), PRIOR_SD).to_event(1).log_prob(theta)
        + (core.weights * dist.Normal(theta, 1.0).to_event(1).log_prob(data[core.indices])).sum()
    )
    assert torch.allclose(trace.log_prob_sum(), expected, rtol=1e-12)
    # and the potential energy that NUTS / HMC use
    _, potential_fn, _, _ = initialize_model(model, (data,))
    assert torch.allclose(potential_fn({"theta": theta}), -expected, rtol=1e-12)


def test_weighted_model_traces_under_the_pytorch_jit(data: torch.Tensor) -> None:
    # NUTS(..., jit_compile=True) compiles the potential of the weighted model: same values and gradients, up to
    # float32 rounding of the weights (under the JIT, Pyro's plate computes its N / m scale, which PlateIndices
    # divides out, in the default dtype)
    core = Coreset(torch.tensor([3, 10, 250]), torch.tensor([0.5, 7.0, 120.25], dtype=torch.float64))
    model = weighted_model(gaussian_model, core)
    _, eager, _, _ = initialize_model(model, (data,))
    _, compiled, _, _ = initialize_model(model, (data,), jit_compile=True, skip_jit_warnings=True)
    for theta in torch.randn(3, 2, dtype=torch.float64):
        point = theta.clone().requires_grad_()
        value = compiled({"theta": point})
        (grad,) = torch.autograd.grad(value, point)
        (expected_grad,) = torch.autograd.grad(eager({"theta": point}), point)
        assert torch.allclose(value, eager({"theta": theta}), rtol=1e-6)
        assert torch.allclose(grad, expected_grad, rtol=1e-6)


def test_a_plate_with_a_fixed_subsample_size_is_a_clear_error() -> None:
    def minibatch_model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=5) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    model = weighted_model(minibatch_model, Coreset(torch.tensor([1, 2]), torch.tensor([10.0, 10.0])))
    with pytest.raises(ValueError, match="without subsample_size"):
        poutine.trace(model).get_trace(torch.randn(20))


def test_weighted_model_with_a_non_default_plate_dim() -> None:
    y = torch.randn(6, 3)

    def model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6, dim=-2) as idx, pyro.plate("cols", 3, dim=-1):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    core = Coreset(torch.tensor([1, 4]), torch.tensor([2.0, 3.0]))
    trace = poutine.trace(weighted_model(model, core)).get_trace(y)
    mu = trace.nodes["mu"]["value"]
    expected = (
        dist.Normal(0.0, 1.0).log_prob(mu)
        + (torch.tensor([2.0, 3.0])[:, None] * dist.Normal(mu, 1.0).log_prob(y[[1, 4]])).sum()
    )
    assert torch.allclose(trace.log_prob_sum(), expected)
    ll = Projector.from_model(model, {"mu": torch.zeros(3)}, norm="l2", model_args=(y,)).loglik
    assert torch.allclose(ll(torch.zeros(1), torch.tensor([1, 4])), dist.Normal(0.0, 1.0).log_prob(y[[1, 4]]).sum(1))


def test_weighted_model_runs_under_nuts_and_random_walk_and_pickles(data: torch.Tensor) -> None:
    proj = projector(data)
    core = HilbertCoreset(proj, "fw").build(20)
    model = weighted_model(gaussian_model, core)
    mean, var = gaussian_posterior(data, core.dense(400))
    mcmc = MCMC(NUTS(model), num_samples=150, warmup_steps=100, disable_progbar=True)
    mcmc.run(data)
    draws = mcmc.get_samples()["theta"]
    # NUTS draws are nearly independent here; allow an ESS of a third of the draws
    assert float(((draws.mean(0) - mean) / math.sqrt(3 * var / 150)).abs().max()) < Z
    rw = MCMC(RandomWalkKernel(model, init_step_size=0.05), num_samples=50, warmup_steps=50, disable_progbar=True)
    rw.run(data)
    assert rw.get_samples()["theta"].shape == (50, 2)
    clone = pickle.loads(pickle.dumps(model))
    assert torch.equal(clone.coreset.indices, core.indices)


# --- streaming -----------------------------------------------------------------------------------


def test_streaming_merge_invariants_and_error_close_to_single_pass(data: torch.Tensor) -> None:
    proj = projector(data)
    single = HilbertCoreset(proj, "fw")
    single.build(30)
    total = proj.total()
    for recompress in (True, False):
        core = streaming_coreset(proj, 30, num_shards=4, recompress=recompress)
        assert len(core.indices) <= (30 if recompress else 120) and bool((core.weights > 0).all())
        assert len(torch.unique(core.indices)) == len(core.indices)
        assert proj.error(core, total) <= 2.0 * single.error() + 1e-3 * float(total.norm())
    union = merge_coresets(proj, [Coreset(torch.tensor([0]), torch.tensor([1.0]))] * 2) is not None
    assert union
    with pytest.raises(ValueError, match="overlap"):
        merge_coresets(proj, [Coreset(torch.tensor([0]), torch.tensor([1.0]))] * 2, size=1)


# --- bad input -----------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(data: torch.Tensor) -> None:
    proj = projector(data, num_samples=20)
    with pytest.raises(ValueError, match="M must be a positive"):
        HilbertCoreset(proj).build(0)
    with pytest.raises(TypeError, match="M must be an int"):
        HilbertCoreset(proj).build(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown coreset method"):
        HilbertCoreset(proj, "greedy")
    with pytest.raises(ValueError, match="J"):
        Projector(proj.loglik, torch.zeros(0, 2), 400)
    with pytest.raises(ValueError, match="J \\(num_samples\\)"):
        Projector.from_model(gaussian_model, {"theta": torch.zeros(5, 2)}, num_samples=0, model_args=(data,))
    with pytest.raises(ValueError, match="unknown norm"):
        Projector.from_model(gaussian_model, {"theta": torch.zeros(5, 2)}, norm="l1", model_args=(data,))
    with pytest.raises(ValueError, match="lack the global latent site"):
        Projector.from_model(gaussian_model, {"mu": torch.zeros(5, 2)}, model_args=(data,))
    with pytest.raises(ValueError, match="expected \\(J, \\*\\(2,\\)\\)"):
        Projector.from_model(gaussian_model, {"theta": torch.zeros(5, 3)}, model_args=(data,))
    with pytest.raises(ValueError, match="no plate named 'rows'"):
        Projector.from_model(gaussian_model, {"theta": torch.zeros(5, 2)}, data_plate="rows", model_args=(data,))
    with pytest.raises(ValueError, match="same length"):
        weighted_model(gaussian_model, Coreset(torch.tensor([0, 1]), torch.tensor([1.0])))
    with pytest.raises(ValueError, match="finite"):
        weighted_model(gaussian_model, Coreset(torch.tensor([0]), torch.tensor([float("nan")])))
    with pytest.raises(ValueError, match="non-negative"):
        weighted_model(gaussian_model, Coreset(torch.tensor([0]), torch.tensor([-1.0])))
    with pytest.raises(TypeError, match="integers"):
        weighted_model(gaussian_model, Coreset(torch.tensor([0.0]), torch.tensor([1.0])))
    with pytest.raises(ValueError, match="no plate named 'rows'"):
        weighted_model(gaussian_model, Coreset(torch.tensor([0]), torch.tensor([1.0])), plate="rows")(data)
    with pytest.raises(ValueError, match="out of range"):
        weighted_model(gaussian_model, Coreset(torch.tensor([400]), torch.tensor([1.0])))(data)
    with pytest.raises(ValueError, match="features must be a 2-D"):
        frank_wolfe(torch.zeros(3), 1)
    with pytest.raises(ValueError, match="non-finite"):
        frank_wolfe(torch.tensor([[1.0], [float("inf")]]), 1)
    with pytest.raises(ValueError, match="indices must lie"):
        proj.project(torch.tensor([400]))


def test_models_that_do_not_fit_the_coreset_contract_are_rejected() -> None:
    y = torch.randn(10)

    def unindexed(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    def local_latent(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)) as idx:
            z = pyro.sample("z", dist.Normal(mu, 1.0))
            pyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match="index the data with the plate's indices"):
        Projector.from_model(unindexed, {"mu": torch.zeros(4)}, model_args=(y,))
    with pytest.raises(ValueError, match="latent site 'z' is inside the data plate"):
        Projector.from_model(local_latent, {"mu": torch.zeros(4)}, model_args=(y,))


def _positive_model(x: torch.Tensor, y: torch.Tensor) -> None:
    """A vector site and a positive scale (its potential carries a log-Jacobian), Student-t observations."""
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.Gamma(2.0, 2.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.StudentT(5.0, x[idx] @ w, scale), obs=y[idx])


@pytest.mark.parametrize("which", ["gaussian", "positive"])
def test_direct_weighted_potential_equals_pyros_potential_of_the_weighted_model(which: str) -> None:
    gen = torch.Generator().manual_seed(5)
    if which == "gaussian":
        model, args = gaussian_model, (torch.randn(300, 2, generator=gen),)
    else:
        x = torch.randn(300, 3, generator=gen)
        model, args = _positive_model, (x, x @ torch.ones(3) + torch.randn(300, generator=gen))
    for size in (1, 17, 120):
        core = Coreset(torch.randperm(300, generator=gen)[:size], 10 * torch.rand(size, generator=gen) + 0.1)
        weighted = weighted_model(model, core)
        direct = weighted.potential_fn(*args)
        init, pyro_potential, _, _ = initialize_model(weighted, args)
        for _ in range(24):  # past the recording of the fused value-and-gradient graph and its checks
            point = {k: (v + 0.5 * torch.randn(v.shape, generator=gen)).requires_grad_() for k, v in init.items()}
            got, want = direct(point), pyro_potential(point)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got, want)
            grads = torch.autograd.grad(got, list(point.values()))  # NUTS needs the gradient too
            expected = torch.autograd.grad(want, list(point.values()))
            assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(grads, expected, strict=True))
        assert direct.value_and_grad.verified  # the last values were replayed


# --- the bias warning ----------------------------------------------------------------------------


def test_posterior_shift_estimates_the_exact_shift_of_the_coreset_posterior(data: torch.Tensor) -> None:
    # exact pi_hat draws (the full Gaussian posterior); J = 4000 draws: the estimate's MC error is ~0.05 sd
    gen = torch.Generator().manual_seed(3)
    mean, var = gaussian_posterior(data, torch.ones(len(data), dtype=data.dtype))
    draws = mean + var**0.5 * torch.randn(4000, 2, generator=gen, dtype=data.dtype)
    proj = Projector.from_model(gaussian_model, {"theta": draws}, model_args=(data,))
    for size in (250, 300, 350):  # shifts of about sqrt(N / M - 1) = 0.8, 0.6 and 0.4 posterior sds
        idx = torch.randperm(len(data), generator=gen)[:size]
        core = Coreset(idx, torch.full((size,), len(data) / size, dtype=data.dtype))
        exact = (gaussian_posterior(data, core.dense(len(data)))[0] - mean) / var**0.5
        est = proj.posterior_shift(core)
        assert 0.0 < est.efficiency <= 1.0, est
        assert (est.shift - exact).abs().max() < 0.15 + 0.1 * exact.abs().max(), (est.shift, exact)


@pytest.mark.parametrize("norm", ["fisher", "l2"])
def test_posterior_shift_reuses_the_log_likelihood_sums_of_the_projection(data: torch.Tensor, norm: str) -> None:
    evaluated: list[int] = []
    samples = 0.05 * torch.randn(50, 2, dtype=data.dtype, generator=torch.Generator().manual_seed(0))

    def loglik(theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        evaluated.append(len(idx))
        return -0.5 * ((data[idx] - theta) ** 2).sum(-1)

    proj = Projector(loglik, samples + data.mean(0), len(data), norm=norm, chunk_size=64)
    core = Coreset(torch.tensor([3, 50, 7, 3]), torch.tensor([100.0, 150.0, 75.0, 75.0], dtype=data.dtype))
    streamed = proj.posterior_shift(core)  # nothing projected yet: one pass over the data, then the coreset's points
    assert sum(evaluated) == len(data) + 3  # vmap calls loglik once per chunk
    proj.project()
    evaluated.clear()
    reused = proj.posterior_shift(core)
    assert sum(evaluated) == 3  # only the coreset's distinct points
    assert torch.allclose(reused.shift, streamed.shift, atol=1e-9) and reused.efficiency == pytest.approx(
        streamed.efficiency, rel=1e-9
    )
    rows = torch.arange(100)
    proj.project(rows)  # another index set is remembered beside the first, not instead of it
    rows += 1  # and the caller's tensor changing afterwards does not change what was remembered
    evaluated.clear()
    proj.posterior_shift(core)
    assert sum(evaluated) == 3
    # rows given twice count twice in the data's sum and the coreset's weight of a datum once, on both paths
    twice = torch.cat([torch.arange(100), torch.arange(50)])
    fresh = Projector(loglik, samples + data.mean(0), len(data), norm=norm, chunk_size=64)
    streamed = fresh.posterior_shift(core, twice)
    fresh.project(twice)
    evaluated.clear()
    reused = fresh.posterior_shift(core, twice)
    assert sum(evaluated) == 3 and torch.allclose(reused.shift, streamed.shift, atol=1e-9)


def test_build_warns_when_the_coreset_moves_the_posterior_and_not_when_it_does_not(data: torch.Tensor) -> None:
    proj = projector(data)
    with pytest.warns(RuntimeWarning, match="moves the posterior mean"):
        HilbertCoreset(proj, "uniform", generator=torch.Generator().manual_seed(0)).build(3)
    hilbert = HilbertCoreset(proj, "fw")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hilbert.build(200)
        HilbertCoreset(proj, "uniform", check=False).build(3)
    assert hilbert.shift is not None and float(hilbert.shift.shift.abs().max()) < 0.1
