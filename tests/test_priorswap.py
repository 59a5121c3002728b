"""Prior swapping: exactness in a conjugate case, estimator bias shrinkage, IS baseline, bad inputs.

Statistical tests compare sample moments with exact values through MCSE-scaled z-scores
(``|z| < 3.5``; the two-sided normal tail is 4.7e-4 per check, so with the 8 checks below the
suite's false-failure rate is below 0.4%, up to the accuracy of the ESS estimate).
"""

from __future__ import annotations

import math
import pickle

import pyro
import pytest
import torch
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size as pyro_ess
from torch.distributions import Gamma, HalfCauchy, HalfNormal, Laplace, LogNormal, MultivariateNormal, Normal

from neuralblock.priorswap import (
    ExactPosterior,
    GaussianFit,
    GaussianMixtureFit,
    PriorSwap,
    SemiparametricFit,
    SwappedModel,
    SwappedPotential,
    SwapProblem,
    fit_swap_reference,
    importance_swap,
    swap_log_density,
)

Z_MAX = 3.5


def conjugate(prior_mean: float, prior_sd: float, xbar: float, n: int) -> tuple[float, float]:
    """Posterior mean and sd of a normal mean with unit noise under a N(prior_mean, prior_sd^2) prior."""
    precision = 1.0 / prior_sd**2 + n
    return (prior_mean / prior_sd**2 + n * xbar) / precision, precision**-0.5


XBAR, N = 1.3, 20
FALSE_POST = conjugate(0.0, 1.0, XBAR, N)
TARGET_POST = conjugate(2.0, 0.5, XBAR, N)


def moment_z_scores(draws: torch.Tensor, mean: float, sd: float) -> list[float]:
    """z-scores of the sample mean and of the mean squared deviation, with MCSEs from the ESS."""
    scores = []
    for stat, expected in ((draws, mean), ((draws - mean) ** 2, sd**2)):
        chains = stat.reshape(-1, stat.shape[-1]) if stat.dim() > 1 else stat[None]
        ess = float(pyro_ess(chains, chain_dim=0, sample_dim=1))
        mcse = float(stat.std()) / math.sqrt(max(ess, 1.0))
        scores.append((float(stat.mean()) - expected) / mcse)
    return scores


@pytest.mark.parametrize(
    ("kernel_name", "accept_range"),
    [("mh", (0.1, 0.9)), ("independence", (0.2, 0.99)), ("elliptical", None), ("elliptical-fit", None)],
)
def test_exact_false_posterior_swap_equals_conjugate_target(kernel_name: str, accept_range: tuple | None) -> None:
    # the independence proposal is the exact false posterior itself; the priors differ strongly,
    # so its acceptance is well below 1 and the test exercises the Hastings ratio; the elliptical
    # sampler runs around the estimate as it is (several angles per step) and around its fit
    exact = ExactPosterior(Normal(*FALSE_POST))
    options = {"kernel": "elliptical", "reference": "fit" if kernel_name == "elliptical-fit" else "estimate"}
    if not kernel_name.startswith("elliptical"):
        options = {"kernel": kernel_name}
    kernel = PriorSwap(exact, Normal(0.0, 1.0), Normal(2.0, 0.5), **options)
    mcmc = MCMC(kernel, num_samples=3000, warmup_steps=300, disable_progbar=True)
    mcmc.run()
    draws = mcmc.get_samples()["theta"]
    assert max(abs(z) for z in moment_z_scores(draws, *TARGET_POST)) < Z_MAX
    diag = kernel.diagnostics()
    if accept_range is None:  # elliptical slice: no rejections; several evaluations when the priors disagree
        low = 1.0 if kernel_name == "elliptical-fit" else 1.5  # p_s is Gaussian: a fitted reference is nearly it
        assert low <= diag["evaluations_per_iteration"] < 10.0 and diag["stuck_iterations"] == 0.0
        return
    assert accept_range[0] < diag["acceptance_rate"] < accept_range[1] and diag["nonfinite_rejections"] == 0.0


@pytest.mark.parametrize("kernel_name", ["independence", "elliptical"])
def test_independence_and_elliptical_swaps_reject_a_constrained_exact_density(kernel_name: str) -> None:
    exact = ExactPosterior(LogNormal(0.0, 0.3))
    kernel = PriorSwap(exact, HalfNormal(1.0), HalfNormal(2.0), kernel=kernel_name)
    with pytest.raises(ValueError, match="unconstrained"):
        kernel.setup(0)


def test_elliptical_reference_option_is_checked() -> None:
    with pytest.raises(ValueError, match="reference must be"):
        PriorSwap(ExactPosterior(Normal(0.0, 1.0)), Normal(0.0, 1.0), Normal(0.0, 2.0), reference="vi")


def test_fitted_reference_needs_a_differentiable_swap_density() -> None:
    # every term computed outside autograd: the fit must refuse, not widen the reference silently
    def detached(dist: Normal) -> object:
        def log_prior(values: dict) -> torch.Tensor:
            return dist.log_prob(values["theta"]).detach()

        log_prior.support = {"theta": torch.distributions.constraints.real}
        return log_prior

    exact = ExactPosterior(lambda x: Normal(*FALSE_POST).log_prob(x[..., 0]).detach(), dim=1)
    kernel = PriorSwap(
        exact, detached(Normal(0.0, 1.0)), detached(Normal(2.0, 0.5)), kernel="elliptical", site_shapes={"theta": ()}
    )
    with pytest.raises(ValueError, match="differentiable"):
        fit_swap_reference(kernel.problem, torch.full((1,), FALSE_POST[0]), torch.full((1, 1), FALSE_POST[1]))


def test_elliptical_swap_matches_a_correlated_gaussian_target_on_a_positive_site() -> None:
    # 2-D correlated false posterior on log-scale values, Gaussian priors on the logs: the swapped
    # target is Gaussian with a closed form, and the sites are positive (constrained) ones
    cov = torch.tensor([[0.04, 0.03], [0.03, 0.09]])
    draws = MultivariateNormal(torch.tensor([0.5, -0.2]), cov).sample((4000,))
    false_prior, target_prior = Normal(0.0, 1.0), Normal(1.0, 0.2)
    kernel = PriorSwap({"s": draws.exp()}, LogNormal(0.0, 1.0), LogNormal(1.0, 0.2), kernel="elliptical")
    fit = GaussianFit(draws)
    fit_precision = torch.linalg.inv(fit.dist.covariance_matrix)
    precision = fit_precision - torch.eye(2) / false_prior.scale**2 + torch.eye(2) / target_prior.scale**2
    shift = fit_precision @ fit.mean - false_prior.loc / false_prior.scale**2 + target_prior.loc / target_prior.scale**2
    target_cov = torch.linalg.inv(precision)
    target_mean = target_cov @ shift
    mcmc = MCMC(kernel, num_samples=3000, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    logs = mcmc.get_samples()["s"].log()
    for j in range(2):
        z_scores = moment_z_scores(logs[:, j], float(target_mean[j]), float(target_cov[j, j].sqrt()))
        assert max(abs(z) for z in z_scores) < Z_MAX


def test_fitted_elliptical_reference_approaches_the_swapped_gaussian() -> None:
    # correlated 2-D Gaussian false posterior, Gaussian priors: p_s is Gaussian in closed form, and
    # the fit may only move the mean and the per-axis scales, which is enough to match its moments
    torch.manual_seed(0)
    cov = torch.tensor([[0.04, 0.018], [0.018, 0.09]])
    exact = ExactPosterior(MultivariateNormal(torch.tensor([0.5, -0.2]), cov))
    false_prior, target_prior = Normal(torch.zeros(2), 1.0), Normal(torch.ones(2), 0.2)
    precision = torch.linalg.inv(cov) - torch.eye(2) + torch.eye(2) / 0.04
    target_cov = torch.linalg.inv(precision)
    target_mean = target_cov @ (torch.linalg.inv(cov) @ torch.tensor([0.5, -0.2]) + torch.ones(2) / 0.04)
    fitted = PriorSwap(exact, false_prior, target_prior, kernel="elliptical", site_shapes={"theta": (2,)})
    fitted.setup(0)
    loc, tril = fitted._reference
    target_sd = target_cov.diagonal().sqrt()
    assert ((loc - target_mean).abs() / target_sd).max() < 0.15
    assert ((tril @ tril.T).diagonal().sqrt() / target_sd - 1.0).abs().max() < 0.15
    estimate = PriorSwap(exact, false_prior, target_prior, kernel="elliptical", reference="estimate")
    estimate.setup(0)
    assert torch.equal(estimate._reference[0], exact.density.mean)
    # the fitted reference mixes faster: fewer angles tried per step than around the estimate
    mcmc_fit = MCMC(fitted, num_samples=500, warmup_steps=0, disable_progbar=True)
    mcmc_est = MCMC(estimate, num_samples=500, warmup_steps=0, disable_progbar=True)
    mcmc_fit.run()
    mcmc_est.run()
    assert fitted.diagnostics()["evaluations_per_iteration"] < estimate.diagnostics()["evaluations_per_iteration"]


def test_nuts_swap_runs_with_two_chains_and_matches_target() -> None:
    exact = ExactPosterior(Normal(*FALSE_POST))
    kernel = PriorSwap(exact, Normal(0.0, 1.0), Normal(2.0, 0.5), kernel="nuts")
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, num_chains=2, disable_progbar=True, mp_context="spawn")
    mcmc.run()
    draws = mcmc.get_samples(group_by_chain=True)["theta"]
    assert draws.shape == (2, 200)
    assert max(abs(z) for z in moment_z_scores(draws, *TARGET_POST)) < Z_MAX
    assert set(mcmc.diagnostics()["divergences"]) == {"chain 0", "chain 1"}


def test_multisite_constrained_identity_swap_is_the_fitted_density() -> None:
    draws = {"beta": torch.randn(400, 2) * 0.3 + 1.0, "sigma": LogNormal(0.0, 0.2).sample((400,))}
    prior = {"beta": Normal(torch.zeros(2), 1.0), "sigma": HalfCauchy(1.0)}
    kernel = PriorSwap(draws, prior, prior, kernel="mh")
    problem = kernel.problem
    assert problem.layout.dim == 3 and set(kernel.transforms) == {"sigma"}
    z = torch.randn(5, 3)
    assert torch.allclose(problem.log_density(z), problem.density.log_prob(z))
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=20, disable_progbar=True)
    mcmc.run()
    samples = mcmc.get_samples()
    assert samples["beta"].shape == (50, 2) and bool((samples["sigma"] > 0).all())
    # the Pyro model view has the same density on constrained values (up to Pyro's own Jacobian)
    trace = pyro.poutine.trace(kernel.model).get_trace()
    assert [n for n, site in trace.nodes.items() if site["type"] == "sample"] == ["beta", "sigma", "swapped_density"]
    clone = pickle.loads(pickle.dumps(kernel))  # what MCMC(num_chains > 1) does with a kernel
    assert torch.allclose(clone.problem.log_density(z), problem.log_density(z))
    assert isinstance(kernel.model, SwappedModel) and isinstance(kernel.potential_fn, SwappedPotential)


def swapped_mean_by_quadrature(problem: SwapProblem, grid: torch.Tensor) -> float:
    log_p = problem.log_density(grid[:, None])
    w = (log_p - log_p.logsumexp(0)).exp()
    return float((w * grid).sum())


def test_parametric_swap_bias_shrinks_with_false_posterior_draws() -> None:
    """The swapped mean with a Gaussian fit to T false draws approaches the exact swap as T grows."""
    grid = torch.linspace(-2.0, 4.0, 4001, dtype=torch.float64)
    exact = SwapProblem(ExactPosterior(Normal(*FALSE_POST)), Normal(0.0, 1.0), Laplace(3.0, 0.3))
    truth = swapped_mean_by_quadrature(exact, grid.float())
    errors = {}
    for t in (30, 3000):
        errs = []
        for _ in range(20):
            draws = Normal(*FALSE_POST).sample((t,))
            problem = SwapProblem(draws, Normal(0.0, 1.0), Laplace(3.0, 0.3))
            errs.append((swapped_mean_by_quadrature(problem, grid.float()) - truth) ** 2)
        errors[t] = math.sqrt(sum(errs) / len(errs))
    assert errors[3000] < 0.3 * errors[30]


def test_semiparametric_estimate_beats_gaussian_and_improves_with_draws() -> None:
    mix = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(torch.tensor([0.5, 0.5])), Normal(torch.tensor([-2.0, 2.0]), 0.7)
    )
    grid = torch.linspace(-5.0, 5.0, 201)[:, None]
    true = mix.log_prob(grid[:, 0]).exp()

    def l1(fit: object, t: int) -> float:
        est = fit.log_prob(grid).exp()  # type: ignore[attr-defined]
        est = est / (est.sum() * 0.05)
        return float((est - true).abs().sum() * 0.05)

    small, large = mix.sample((200, 1)), mix.sample((4000, 1))
    semi_small, semi_large = l1(SemiparametricFit(small), 200), l1(SemiparametricFit(large), 4000)
    assert semi_large < l1(GaussianFit(large), 4000)
    assert semi_large < semi_small
    assert l1(GaussianMixtureFit(large, num_components=2), 4000) < 0.1


def test_importance_swap_identity_and_conjugate_and_degenerate() -> None:
    draws = Normal(*FALSE_POST).sample((4000,))
    same = importance_swap(draws, Normal(0.0, 1.0), Normal(0.0, 1.0))
    assert same.ess == pytest.approx(4000.0) and torch.allclose(same.weights, torch.full((4000,), 1 / 4000))
    res = importance_swap(draws, Normal(0.0, 1.0), Normal(2.0, 0.5))
    mean = float(res.mean()["theta"])
    assert abs(mean - TARGET_POST[0]) / (TARGET_POST[1] / math.sqrt(res.ess)) < Z_MAX
    with pytest.warns(UserWarning, match="degenerate"):
        importance_swap(draws[:500], Normal(0.0, 1.0), Laplace(10.0, 0.05))


def test_is_correction_weights() -> None:
    draws = Gamma(20.0, 10.0).sample((1500,))[:, None]
    kernel = PriorSwap(draws, Normal(0.0, 5.0), Laplace(0.0, 1.0), kernel="mh", correction="is")
    chain = Normal(2.0, 0.4).sample((300, 1))
    res = kernel.importance_weights(chain)
    assert res.weights.shape == (300,) and float(res.weights.sum()) == pytest.approx(1.0)
    assert 1.0 <= res.ess <= 300.0
    plain = PriorSwap(draws, Normal(0.0, 5.0), Laplace(0.0, 1.0), kernel="mh")
    with pytest.raises(ValueError, match="correction='is'"):
        plain.importance_weights(chain)


def test_bad_inputs_raise_clear_errors() -> None:
    draws = torch.randn(100, 3)
    with pytest.raises(ValueError, match="support"):
        PriorSwap(torch.randn(100), Normal(0.0, 1.0), HalfNormal(1.0))
    with pytest.raises(ValueError, match="dimension mismatch"):
        PriorSwap(draws, Normal(torch.zeros(5), 1.0), Normal(torch.zeros(5), 2.0))
    with pytest.raises(ValueError, match="covers sites"):
        PriorSwap({"a": draws}, {"b": Normal(0.0, 1.0)}, {"a": Normal(0.0, 1.0)})
    bad = draws.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        PriorSwap(bad, Normal(0.0, 1.0), Laplace(0.0, 1.0))
    with pytest.raises(ValueError, match="too few"):
        PriorSwap(draws[:3], Normal(0.0, 1.0), Laplace(0.0, 1.0))
    with pytest.raises(ValueError, match="non-finite importance weights"):
        importance_swap(draws, Normal(0.0, 1.0), lambda v: torch.full((v["theta"].shape[0],), float("nan")))
    with pytest.raises(ValueError, match="dimension 2"):
        PriorSwap(
            ExactPosterior(torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))),
            Normal(torch.zeros(3), 1.0),
            Laplace(torch.zeros(3), 1.0),
        )
    with pytest.raises(ValueError, match="kernel must be"):
        PriorSwap(draws, Normal(0.0, 1.0), Laplace(0.0, 1.0), kernel="gibbs")
    with pytest.raises(ValueError, match="needs false-posterior draws"):
        PriorSwap(ExactPosterior(Normal(0.0, 1.0)), Normal(0.0, 1.0), Laplace(0.0, 1.0), correction="is")
    with pytest.raises(TypeError, match="false_posterior must be"):
        PriorSwap("draws", Normal(0.0, 1.0), Laplace(0.0, 1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside its support"):
        PriorSwap({"s": -torch.rand(50)}, {"s": HalfCauchy(1.0)}, {"s": HalfNormal(1.0)})


def test_semiparametric_estimate_with_preconditioned_and_elliptical_kernels() -> None:
    draws = Gamma(20.0, 10.0).sample((400,))[:, None]
    for kernel_name in ("nuts", "elliptical"):
        kernel = PriorSwap(draws, Normal(0.0, 5.0), Laplace(0.0, 1.0), kernel=kernel_name, estimator="semiparametric")
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, disable_progbar=True)
        mcmc.run()
        assert torch.isfinite(mcmc.get_samples()["theta"]).all()
        if kernel_name == "nuts":
            assert kernel._frame is not None  # preconditioned by the parametric start, not silently off
    with pytest.raises(ValueError, match="already targets it"):
        PriorSwap(draws, Normal(0.0, 5.0), Laplace(0.0, 1.0), estimator="semiparametric", correction="is")


def test_matrix_valued_constrained_sites_and_float64_draws() -> None:
    scales = HalfNormal(torch.ones(2, 3)).sample((300,)).double() + 0.5  # float64 draws of a [2, 3] site
    false_prior = {"s": torch.distributions.Independent(HalfNormal(torch.ones(2, 3)), 2)}
    target_prior = {"s": torch.distributions.Independent(Gamma(torch.full((2, 3), 2.0), 2.0), 2)}
    problem = SwapProblem({"s": scales}, false_prior, target_prior)
    z = problem.z[:4]
    batched = problem.log_density(z)
    one_by_one = torch.stack([problem.log_density(z[i : i + 1])[0] for i in range(4)])
    assert torch.allclose(batched, one_by_one)
    theta, _ = problem.layout.to_constrained(z)
    assert torch.allclose(problem.layout.to_unconstrained(theta), z)
    for kernel_name in ("nuts", "mh"):
        kernel = PriorSwap({"s": scales}, false_prior, target_prior, kernel=kernel_name)
        mcmc = MCMC(kernel, num_samples=10, warmup_steps=10, disable_progbar=True)
        mcmc.run()
        draws = mcmc.get_samples()["s"]
        assert draws.shape == (10, 2, 3) and (draws > 0).all()


def test_supports_are_compared_by_value() -> None:
    from torch.distributions import Beta, Uniform

    draws = torch.rand(200, 3) * 0.8 + 0.1
    PriorSwap(draws, Beta(torch.ones(3), torch.ones(3)), Uniform(torch.zeros(3), torch.ones(3)))  # the same set
    with pytest.raises(ValueError, match="support"):
        PriorSwap(draws, Uniform(torch.zeros(3), torch.ones(3)), Uniform(torch.zeros(3), torch.tensor([1.0, 1.0, 1.1])))


def test_gaussian_mixture_fit_survives_a_collapsed_component() -> None:
    draws = torch.cat([torch.randn(700, 2, generator=torch.Generator().manual_seed(0)), torch.zeros(300, 2)])
    fit = GaussianMixtureFit(draws, num_components=3)
    assert torch.isfinite(fit.log_prob(torch.tensor([[0.0, 0.0], [1.0, -1.0]]))).all()


def test_swap_log_density_matches_formula() -> None:
    problem = SwapProblem(ExactPosterior(Normal(0.5, 0.2)), Normal(0.0, 1.0), Laplace(1.0, 0.5))
    z = torch.linspace(-1.0, 2.0, 7)[:, None]
    expected = (
        Normal(0.5, 0.2).log_prob(z[:, 0]) + Laplace(1.0, 0.5).log_prob(z[:, 0]) - Normal(0.0, 1.0).log_prob(z[:, 0])
    )
    got = swap_log_density(z, problem.density, problem.false_prior, problem.target_prior, problem.layout)
    assert torch.allclose(got, expected)


def test_preconditioned_nuts_swap_on_a_correlated_gaussian_matches_the_closed_form() -> None:
    # p_s ∝ N(m, S) N(0, 0.5² I) / N(0, I) is Gaussian with precision S⁻¹ + (4 - 1) I; S has correlation 0.99.
    torch.manual_seed(0)
    cov = torch.tensor([[1.0, 0.99], [0.99, 1.0]]) * 0.04
    mean = torch.tensor([0.6, 0.5])
    exact = ExactPosterior(MultivariateNormal(mean, covariance_matrix=cov))
    false_prior, target = Normal(torch.zeros(2), 1.0), Normal(torch.zeros(2), 0.5)
    kernel = PriorSwap(exact, {"beta": false_prior}, {"beta": target}, kernel="nuts", site_shapes={"beta": (2,)})
    mcmc = MCMC(kernel, num_samples=500, warmup_steps=150, disable_progbar=True)
    mcmc.run()
    assert kernel._frame is not None  # NUTS ran in the estimate's whitened coordinates
    precision = torch.linalg.inv(cov) + 3.0 * torch.eye(2)
    post_cov = torch.linalg.inv(precision)
    post_mean = post_cov @ torch.linalg.inv(cov) @ mean
    draws = mcmc.get_samples()["beta"]
    for i in range(2):
        z = moment_z_scores(draws[:, i], float(post_mean[i]), float(post_cov[i, i].sqrt()))
        assert max(abs(v) for v in z) < Z_MAX, (i, z)


def test_nuts_diagnostics_survive_cleanup_and_a_healthy_run_does_not_warn() -> None:
    import warnings

    kernel = PriorSwap(ExactPosterior(Normal(*FALSE_POST)), Normal(0.0, 1.0), Normal(2.0, 0.5))
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=200, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no stall warning on a Gaussian p_s
        mcmc.run()
    diag = kernel.diagnostics()  # after MCMC's cleanup(), which resets Pyro's counters
    # NUTS on a 1-D Gaussian accepts a new point on (nearly) every iteration, at Pyro's adapted 0.8 target
    assert diag["acceptance_rate"] > 0.5 and 0.5 < diag["mean_accept_prob"] <= 1.0, diag
    assert diag["num_divergences"] == 0.0 and diag["ess_per_draw"] > 0.1


def test_a_stalled_independence_sampler_warns() -> None:
    # the proposal (the false posterior N(0, 0.1)) sits 5 of its sds from p_s ~ N(0.5, 0.07): the chain holds each
    # point for hundreds of steps, so its ESS per draw is far below the 0.02 threshold (measured 0.002-0.004 over seeds)
    kernel = PriorSwap(ExactPosterior(Normal(0.0, 0.1)), Normal(0.0, 1.0), Normal(1.0, 0.1), kernel="independence")
    mcmc = MCMC(kernel, num_samples=2000, warmup_steps=100, disable_progbar=True)
    with pytest.warns(RuntimeWarning, match="stalled"):
        mcmc.run()
    assert kernel.diagnostics()["ess_per_draw"] < 0.02
