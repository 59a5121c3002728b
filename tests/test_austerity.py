"""AusterityMH: exactness at epsilon = 0, sublinear decisions, constrained sites, condition_on, pickling."""

from __future__ import annotations

import math
import pickle
import warnings

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size

from neuralblock.kernels import austerity
from neuralblock.kernels.austerity import AusterityMH

N = 400
X = torch.randn(N, 3, generator=torch.Generator().manual_seed(1))
Y = torch.bernoulli(torch.sigmoid(X @ torch.tensor([1.0, -0.5, 0.25])), generator=torch.Generator().manual_seed(2))
DATA = 0.7 + 1.3 * torch.randn(N, generator=torch.Generator().manual_seed(3))


def logistic(x: torch.Tensor, y: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def logistic_full(x: torch.Tensor, y: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


def normal_scale(y: torch.Tensor) -> None:
    """Known mean 0.7, unknown variance with a conjugate inverse-gamma prior."""
    var = pyro.sample("var", dist.InverseGamma(3.0, 2.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(0.7, var.sqrt()), obs=y[idx])


def held_fixed(y: torch.Tensor) -> None:
    """Global mean mu updated; global precision tau and local offsets z held by condition_on."""
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = pyro.sample("tau", dist.Gamma(2.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(mu + z, tau.rsqrt()), obs=y[idx])


def plain_mh_accepts(kernel: AusterityMH, z0: torch.Tensor, steps: int, log_density) -> list[bool]:
    """Accept decisions of a textbook full-data MH with the kernel's proposal and RNG order."""
    z, decisions = z0.clone(), []
    for _ in range(steps):
        proposal = kernel._propose(z)
        log_u = math.log(float(torch.rand(())))
        accept = log_u < float(log_density(proposal.value) - log_density(z)) + proposal.log_q_correction
        decisions.append(accept)
        z = proposal.value if accept else z
    return decisions


def _logistic_log_density(z: torch.Tensor) -> torch.Tensor:
    logits = X @ z
    return dist.Normal(0.0, 1.0).log_prob(z).sum() + dist.Bernoulli(logits=logits).log_prob(Y).sum()


@pytest.mark.parametrize("proposal", [None, lambda z: dist.Normal(0.8 * z, 0.3).to_event(1)])
def test_epsilon_zero_reproduces_exact_mh_decisions(proposal) -> None:
    torch.set_default_dtype(torch.float64)
    x, y = X.double(), Y.double()
    kernel = AusterityMH(
        logistic, epsilon=0.0, proposal=proposal, step_size=0.2, adapt_step_size=False, normality_check=False
    )
    kernel.setup(0, x, y)
    z0 = torch.zeros(3)
    pyro.set_rng_seed(5)
    decisions, z = [], z0
    for _ in range(150):
        new = kernel.sample({"w": z})["w"]
        decisions.append(not torch.equal(new, z))
        z = new
    pyro.set_rng_seed(5)

    def density(w: torch.Tensor) -> torch.Tensor:
        return dist.Normal(0.0, 1.0).log_prob(w).sum() + dist.Bernoulli(logits=x @ w).log_prob(y).sum()

    assert decisions == plain_mh_accepts(kernel, z0, 150, density)
    assert 0 < sum(decisions) < 150
    assert kernel.diagnostics()["data_fraction"] == 1.0


def test_runs_in_pyro_mcmc_with_subsampled_decisions() -> None:
    kernel = AusterityMH(logistic, epsilon=0.1, batch_size=50)
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, disable_progbar=True)
    mcmc.run(X, Y)
    samples = mcmc.get_samples()["w"]
    assert samples.shape == (200, 3)
    diag = kernel.diagnostics()
    assert diag["data_fraction"] < 1.0 and diag["mean_stages"] >= 1.0 and diag["sublinear"]
    assert 0.05 < diag["acceptance_rate"] < 0.7
    assert set(kernel.logging()) == {"acc", "frac", "stages"}
    assert diag["normality_ok"] in (True, False)
    assert bool((samples.mean(0)[0] > 0) & (samples.mean(0)[1] < 0))  # the data's signs


def test_constrained_site_matches_the_conjugate_posterior_at_epsilon_zero() -> None:
    # var | y ~ InverseGamma(3 + N/2, 2 + sum (y - 0.7)^2 / 2); z-score of the chain mean with
    # MCSE from the effective sample size; |z| < 4 fails with probability < 1e-4.
    kernel = AusterityMH(normal_scale, epsilon=0.0)
    mcmc = MCMC(kernel, num_samples=800, warmup_steps=200, disable_progbar=True)
    mcmc.run(DATA)
    draws = mcmc.get_samples()["var"]
    assert bool((draws > 0).all())
    post = dist.InverseGamma(3.0 + N / 2, 2.0 + float(((DATA - 0.7) ** 2).sum()) / 2)
    ess = float(effective_sample_size(draws[None, :, None]))
    z = (float(draws.mean()) - float(post.mean)) / (float(post.variance.sqrt()) / math.sqrt(ess))
    assert abs(z) < 4.0, (z, ess)
    assert "var" in kernel.transforms


def test_condition_on_holds_global_and_local_latents_fixed() -> None:
    tau, z = torch.tensor(4.0), 0.5 * torch.randn(N)
    y = 1.5 + z + tau.rsqrt() * torch.randn(N)
    kernel = AusterityMH(held_fixed, sites=["mu"], epsilon=0.05, batch_size=100, normality_check=False)
    kernel.condition_on({"tau": tau, "z": z})
    kernel.setup(100, y)
    assert kernel.sites == ["mu"] and kernel.sections.lazy
    params = kernel.initial_params
    draws = []
    for t in range(500):
        params = kernel.sample(params)
        if t >= 100:
            draws.append(float(params["mu"]))
    # mu | y, z, tau is Normal with precision 1/100 + N tau; 4-sigma band on the MCSE (rate < 1e-4)
    precision = 0.01 + N * float(tau)
    mean = float(tau * (y - z).sum()) / precision
    chain = torch.tensor(draws)
    ess = float(effective_sample_size(chain[None, :, None]))
    assert abs(float(chain.mean()) - mean) < 4.0 / math.sqrt(precision * ess)
    kernel.condition_on({"tau": torch.tensor(1.0)})  # O(1): stored, read by the next draws
    assert kernel._fixed["tau"] == 1.0
    with pytest.raises(ValueError, match="updates"):
        kernel.condition_on({"mu": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="latent sites"):
        kernel.condition_on({"nope": torch.tensor(0.0)})


def normal_mean(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(mu, 1.3), obs=y[idx])


def test_a_conditioned_default_keeps_the_laplace_walk_and_drops_only_the_proxy() -> None:
    """condition_on drops the "mode" control variate (its O(N) sum depends on the held values), not the walk's shape.

    Before setup the walk is the Laplace covariance of mu's conditional (here exactly Gaussian: variance
    1 / precision); after setup the proxy set up on other values is dropped, so no stale sum enters a test.
    """
    tau, z = torch.tensor(4.0), 0.5 * torch.randn(N)
    y = 1.5 + z + tau.rsqrt() * torch.randn(N)
    kernel = AusterityMH(held_fixed, sites=["mu"], epsilon=0.05, batch_size=100, normality_check=False)
    kernel.condition_on({"tau": tau, "z": z})
    kernel.setup(0, y)
    precision = 0.01 + N * float(tau)
    assert kernel._cv_point is None and kernel._scale is not None
    assert math.isclose(float(kernel._scale), precision**-0.5, rel_tol=1e-3)
    assert kernel._adapt and math.isclose(kernel.step_size, 2.38, rel_tol=1e-6)  # (the held values move later)
    given = AusterityMH(held_fixed, sites=["mu"], epsilon=0.05, proposal_scale=0.1, normality_check=False)
    given.condition_on({"tau": tau, "z": z})
    searches = []
    search = given._find_mode
    given._find_mode = lambda *a, **k: searches.append(1) or search(*a, **k)  # type: ignore[method-assign]
    given.setup(0, y)
    assert math.isclose(float(given._scale), 0.1, rel_tol=1e-6) and not searches  # a given scale: no mode search
    unconditioned = AusterityMH(normal_mean, epsilon=0.05, batch_size=100, normality_check=False)
    unconditioned.setup(0, DATA)
    assert unconditioned._cv_point is not None
    unconditioned.condition_on({})  # nothing held: the proxy stays valid
    assert unconditioned._cv_point is not None
    conditioned_after = AusterityMH(held_fixed, sites=["mu"], epsilon=0.05, batch_size=100, normality_check=False)
    conditioned_after.setup(0, y)
    assert conditioned_after._cv_point is not None
    conditioned_after.condition_on({"tau": tau, "z": z})  # e.g. a compound sampler's first sweep, after setup
    assert conditioned_after._cv_point is None and conditioned_after._cv_rows is None
    assert float(conditioned_after._proxy_sum(torch.zeros(1), torch.ones(1))) == 0.0
    searches = []
    search = kernel._find_mode
    kernel._find_mode = lambda *a, **k: searches.append(1) or search(*a, **k)  # type: ignore[method-assign]
    kernel.restrict(torch.arange(50), {"mu": torch.tensor(1.5)}, proposal_scale=0.2)
    assert not searches and math.isclose(float(kernel._scale), 0.2, rel_tol=1e-6)  # the given scale: no search


def test_a_chain_that_hardly_moves_after_warmup_is_warned_about() -> None:
    kernel = AusterityMH(  # steps of 50 posterior sds, from the posterior's bulk
        normal_mean, epsilon=0.05, batch_size=100, normality_check=False, step_size=50.0, adapt_step_size=False
    )
    kernel.initial_params = {"mu": DATA.mean()}
    kernel.setup(0, DATA)
    params = kernel.initial_params
    with pytest.warns(RuntimeWarning, match="hardly moving"):
        for _ in range(50):
            params = kernel.sample(params)
    assert kernel.diagnostics()["acceptance_rate"] < 0.01
    tuned = AusterityMH(normal_mean, epsilon=0.05, batch_size=100, normality_check=False)
    tuned.setup(0, DATA)
    params = tuned.initial_params
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(60):
            params = tuned.sample(params)


def test_full_data_model_is_sublinear_through_the_direct_path() -> None:
    # a plain obs=y plate: the direct path re-indexes the data, so a transition touches only its sections
    kernel = AusterityMH(logistic_full, epsilon=0.05, batch_size=50, normality_check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel.setup(0, X, Y)
        params = kernel.initial_params
        for _ in range(20):
            params = kernel.sample(params)
    record = kernel.diagnostics()
    assert record["sublinear"] and record["data_fraction"] < 1.0
    assert kernel.sections.direct is not None and kernel.sections.direct.plain


def logistic_full_branching(x: torch.Tensor, y: torch.Tensor) -> None:
    """Ignores the plate's indices and branches on a parameter value in Python: neither path can subsample it."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    logits = x @ w if float(w.sum()) < 1e9 else x @ (2 * w)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def test_full_data_model_falls_back_with_one_warning() -> None:
    kernel = AusterityMH(logistic_full_branching, epsilon=0.05, batch_size=50)
    with pytest.warns(RuntimeWarning, match="not sublinear"):
        kernel.setup(0, X, Y)
    assert not kernel.diagnostics()["sublinear"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params = kernel.sample(kernel.initial_params)
    assert params["w"].shape == (3,)


def test_setup_runs_the_full_model_once() -> None:
    # the laziness check reuses the setup trace's terms; only an initial value forces a second full run
    sizes: list[int] = []

    def counted(x: torch.Tensor, y: torch.Tensor) -> None:
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        with pyro.plate("data", x.shape[0]) as idx:
            sizes.append(idx.numel())
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    # (the default control variate's mode search makes a few more full passes, through the compiled graph)
    kernel = AusterityMH(counted, epsilon=0.05, batch_size=50, normality_check=False, control_variate=None)
    kernel.setup(0, X, Y)
    assert sizes.count(N) == 1 and kernel.sections.lazy
    sizes.clear()
    kernel = AusterityMH(counted, epsilon=0.05, batch_size=50, normality_check=False, control_variate=None)
    kernel.initial_params = {"w": torch.zeros(3)}
    kernel.setup(0, X, Y)
    assert sizes.count(N) == 2 and kernel.sections.lazy


def test_setup_trace_reuse_keeps_constrained_sites_lazy_and_tolerates_validation() -> None:
    # a positive site (non-identity transform) stays lazy when the check reuses the setup trace
    kernel = AusterityMH(normal_scale, epsilon=0.05, batch_size=50, normality_check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel.setup(0, DATA)
    assert kernel.sections.lazy
    # soft labels fail Bernoulli's support check under validation: the trace's terms cannot be
    # reused, and the check falls back to its own (unvalidated) runs instead of raising
    soft = torch.sigmoid(X @ torch.tensor([1.0, -0.5, 0.25]))
    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, normality_check=False)
    with pyro.validation_enabled(True):
        kernel.setup(0, X, soft)
    assert kernel.sections.lazy


def test_control_variate_sum_is_exact_and_cuts_the_data_used() -> None:
    torch.set_default_dtype(torch.float64)
    x, y = X.double(), Y.double()
    mode = torch.tensor([1.0, -0.5, 0.25])
    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=40, control_variate={"w": mode})
    kernel.setup(0, x, y)
    z, z_new = mode + 0.1 * torch.randn(3), mode + 0.1 * torch.randn(3)
    per_section = kernel._proxy(torch.arange(N), z, z_new)
    assert float(per_section.sum()) == pytest.approx(float(kernel._proxy_sum(z, z_new)), rel=1e-8, abs=1e-10)
    with pytest.raises(ValueError, match="control_variate"):
        kernel.condition_on({})
    p = torch.sigmoid(x @ mode)
    hessian = -(x * (p * (1 - p))[:, None]).T @ x
    assert torch.allclose(kernel._cv_hess, hessian, atol=1e-8)
    given = AusterityMH(logistic, control_variate={"w": mode}, control_variate_hessian=hessian)
    given.setup(0, x, y)
    assert float(given._proxy_sum(z, z_new)) == pytest.approx(float(kernel._proxy_sum(z, z_new)), rel=1e-10)


def heavy_tailed(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def test_normality_check_warns_on_heavy_tails() -> None:
    y = torch.randn(2000)
    y[:3] = 300.0  # three sections dominate the log-ratio
    kernel = AusterityMH(heavy_tailed, epsilon=0.05, batch_size=50)
    kernel.setup(0, y)
    with pytest.warns(RuntimeWarning, match="heavy-tailed"):
        kernel.sample(kernel.initial_params)
    assert not kernel.diagnostics()["normality_ok"]


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        AusterityMH(logistic, epsilon=0.6)
    with pytest.raises(ValueError, match="epsilon"):
        AusterityMH(logistic, epsilon=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        AusterityMH(logistic, batch_size=1)
    with pytest.raises(TypeError, match="proposal"):
        AusterityMH(logistic, proposal=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plate"):
        AusterityMH(logistic, plate="nope").setup(0, X, Y)
    with pytest.raises(ValueError, match="sites"):
        AusterityMH(logistic, sites=["nope"]).setup(0, X, Y)
    with pytest.raises(ValueError, match="proposal_scale"):
        AusterityMH(logistic, proposal_scale=torch.ones(2)).setup(0, X, Y)
    with pytest.raises(ValueError, match=r"raised IndexError .* as long as the plate"):
        AusterityMH(logistic).setup(0, X, Y[: N - 10])
    nan_x = X.clone()
    nan_x[7, 1] = float("nan")
    with pytest.raises(ValueError, match=r"'y' \(flat entries \[7\]\) have NaN log-densities"):
        AusterityMH(logistic).setup(0, nan_x, Y)
    with pytest.raises(ValueError, match=r"subsamples \(size 400, subsample_size 50\).*draws its own sections"):
        AusterityMH(subsampled_logistic).setup(0, X, Y)


def subsampled_logistic(x: torch.Tensor, y: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=50) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def test_two_chains_and_pickle() -> None:
    kernel = AusterityMH(logistic, epsilon=0.1, batch_size=50, normality_check=False)
    kernel.setup(0, X, Y)
    clone = pickle.loads(pickle.dumps(kernel))
    assert clone.sample(clone.initial_params)["w"].shape == (3,)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, num_chains=2, disable_progbar=True, mp_context="spawn")
    mcmc.run(X, Y)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (2, 20, 3)


CALLS = {"runs": 0}


def location_scale(y: torch.Tensor) -> None:
    """Unknown mean and scale; broadcasts a leading batch of (loc, scale) values; counts its runs."""
    CALLS["runs"] += 1
    loc = pyro.sample("loc", dist.Normal(0.0, 10.0))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(loc, scale), obs=y[idx])


def test_epsilon_zero_reproduces_exact_mh_decisions_with_one_run_for_both_points() -> None:
    torch.set_default_dtype(torch.float64)
    y = DATA.double()
    kernel = AusterityMH(location_scale, epsilon=0.0, step_size=0.15, adapt_step_size=False, normality_check=False)
    kernel.setup(0, y)
    assert kernel.sections.vectorized
    z0 = torch.tensor([0.5, 0.2])
    pyro.set_rng_seed(7)
    decisions, z = [], z0
    for _ in range(150):
        new = kernel.layout.flatten_point(kernel.sample(kernel.layout.unflatten(z))).detach()
        decisions.append(not torch.equal(new, z))
        z = new
    pyro.set_rng_seed(7)

    def density(point: torch.Tensor) -> torch.Tensor:  # in the unconstrained (loc, log scale) coordinates
        loc, scale = point[0], point[1].exp()
        prior = dist.Normal(0.0, 10.0).log_prob(loc) + dist.LogNormal(0.0, 1.0).log_prob(scale) + point[1]
        return prior + dist.Normal(loc, scale).log_prob(y).sum()

    assert decisions == plain_mh_accepts(kernel, z0, 150, density)
    assert 0 < sum(decisions) < 150


def test_each_stage_is_one_model_run_and_stages_grow_geometrically() -> None:
    kernel = AusterityMH(location_scale, epsilon=0.05, batch_size=25, batch_growth=2.0, normality_check=False)
    kernel.setup(0, DATA)
    assert kernel.sections.vectorized and kernel.batch_growth == 2.0
    params = kernel.initial_params
    for _ in range(120):  # builds the direct path's graphs (a few Pyro runs per stage size) and, with a second-
        params = kernel.sample(params)  # order control variate, the recorded stages of sizes used 50 times
    CALLS["runs"] = 0
    for _ in range(40):
        params = kernel.sample(params)
    diag = kernel.diagnostics()
    # each stage is one call of a compiled graph on the current and proposed points: Pyro runs only to build a
    # graph for an index-set size not seen before (a trace and its checks), far fewer than one per stage
    assert CALLS["runs"] < diag["mean_stages"] * diag["transitions"] / 4
    assert diag["mean_stages"] <= 5  # 25 + 50 + 100 + 200 + 25 = N = 400: at most 5 stages
    kernel = AusterityMH(location_scale, epsilon=0.05, batch_size=25, batch_growth=2.0, normality_check=False)
    kernel.setup(0, DATA)
    kernel.sections.direct = None  # the Pyro path: one model run per stage evaluates both points
    params, CALLS["runs"] = kernel.initial_params, 0
    for _ in range(40):
        params = kernel.sample(params)
    diag = kernel.diagnostics()
    assert CALLS["runs"] == round(diag["mean_stages"] * diag["transitions"])
    with pytest.raises(ValueError, match="batch_growth"):
        AusterityMH(location_scale, batch_growth=0.5)


def batched_logistic(x: torch.Tensor, y: torch.Tensor) -> None:
    """The logistic model written to broadcast a leading batch of weights (one run per test stage)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(x[idx] * w).sum(-1)), obs=y[idx])


def matrix_and_scale(x: torch.Tensor, y: torch.Tensor) -> None:
    """Two global sites: a ``[2, 2]`` weight matrix (no transform) and a positive scale (log transform)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        lin = (x[idx] * w.reshape(w.shape[:-2] + (4,))).sum(-1)
        pyro.sample("y", dist.Normal(lin, s), obs=y[idx])


@pytest.mark.parametrize("two_sites", [False, True])
def test_control_variate_point_joins_the_batched_stage_run(monkeypatch: pytest.MonkeyPatch, two_sites: bool) -> None:
    # the fused stage (z, z' and the control-variate point in one model run) gives the same
    # corrected log-ratios as separate runs, also with a matrix site and a constrained one
    torch.set_default_dtype(torch.float64)
    if two_sites:
        x = torch.randn(60, 4)
        y = x @ torch.tensor([1.0, -0.5, 0.3, 0.2]) + 0.7 * torch.randn(60)
        model, mode = matrix_and_scale, {"w": torch.tensor([[1.0, -0.5], [0.3, 0.2]]), "s": torch.tensor(0.7)}
    else:
        x, y = X.double(), Y.double()
        model, mode = batched_logistic, {"w": torch.tensor([1.0, -0.5, 0.25])}
    kernel = AusterityMH(model, epsilon=0.05, batch_size=40, control_variate=mode)
    kernel.setup(0, x, y)
    assert kernel.sections.vectorized
    point = kernel._cv_point  # θ̂ in the unconstrained flat space
    z, z_new = point + 0.1 * torch.randn(point.numel()), point + 0.1 * torch.randn(point.numel())
    idx = torch.arange(25)
    fused_global, fused = kernel._stage_evaluator(z, z_new)[0](idx)
    # the recorded stage (nested forward-mode jvps, one graph per stage size): plain calls, then the recording
    monkeypatch.setattr(austerity, "_RECORD_AFTER_USES", 0)
    for _ in range(5):
        recorded_global, recorded = kernel._stage_evaluator(z, z_new)[0](idx)
        torch.testing.assert_close(recorded, fused)
        torch.testing.assert_close(recorded_global, fused_global)
    replay = kernel._stage_replay
    assert replay is not None and replay.failure is None and len(replay._graphs) == 1  # idx padded to 32
    for trial in range(3):  # the recorded graph on other points and sections than it was recorded on
        a, b = point + 0.2 * torch.randn(point.numel()), point + 0.2 * torch.randn(point.numel())
        other = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(trial))[: 20 + trial]
        monkeypatch.setattr(kernel, "_stage_replay", None)
        want_global, want = kernel._stage_evaluator(a, b)[0](other)
        monkeypatch.setattr(kernel, "_stage_replay", replay)
        got_global, got = kernel._stage_evaluator(a, b)[0](other)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_global, want_global)
    assert len(replay._graphs) == 1 and replay.failure is None
    # a stage above the fused-run size: z and z' in one run without autograd, θ̂ in its own
    monkeypatch.setattr(austerity, "_FUSED_MAX_SECTIONS", 10)
    stage = kernel._stage_evaluator(z, z_new)[0]
    split_global, split = stage(idx)
    torch.testing.assert_close(fused, split)
    torch.testing.assert_close(fused_global, split_global)
    torch.testing.assert_close(stage(torch.arange(25, 30))[1], kernel._stage_evaluator(z, z_new)[0](idx[:5] + 25)[1])
    kernel.sections.vectorized = False
    separate_global, separate = kernel._stage_evaluator(z, z_new)[0](idx)
    torch.testing.assert_close(fused, separate)
    torch.testing.assert_close(fused_global, separate_global)


def test_transforms_are_none_until_setup_so_pyro_builds_them_for_parallel_chains() -> None:
    kernel = AusterityMH(normal_scale, epsilon=0.05, batch_size=50, normality_check=False)
    assert kernel.transforms is None
    with pytest.raises(RuntimeError, match="setup"):
        kernel.sample({"var": torch.tensor(0.0)})
    mcmc = MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True)
    mcmc._set_transforms(DATA)  # what MCMC.run does when the chains ran in worker processes
    assert set(mcmc.transforms) == {"var"} and float(mcmc.transforms["var"].inv(torch.tensor(-3.0))) > 0


def test_initial_params_start_each_chain_they_are_set_for() -> None:
    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, normality_check=False)
    for start in ([0.5, -1.0, 2.0], [1.5, 0.0, -2.0]):  # Pyro's sequential MCMC sets them before each chain
        kernel.initial_params = {"w": torch.tensor(start)}
        kernel.setup(0, X, Y)
        assert kernel.initial_params["w"].tolist() == start
    kernel.setup(0, X, Y)  # nothing set since: a prior draw
    assert kernel.initial_params["w"].tolist() != [1.5, 0.0, -2.0]


def masked_normal_scale(y: torch.Tensor) -> None:
    """``normal_scale`` with a Python-bool mask inside the plate."""
    var = pyro.sample("var", dist.InverseGamma(3.0, 2.0))
    with pyro.plate("data", y.shape[0]) as idx, poutine.mask(mask=True):
        pyro.sample("y", dist.Normal(0.7, var.sqrt()), obs=y[idx])


def test_python_bool_mask_inside_the_plate_matches_the_unmasked_model() -> None:
    draws = []
    for model in (normal_scale, masked_normal_scale):
        pyro.set_rng_seed(0)
        kernel = AusterityMH(model, epsilon=0.05, batch_size=50, normality_check=False)
        kernel.setup(0, DATA)
        assert kernel.sections.lazy
        params, chain = kernel.initial_params, []
        for _ in range(20):
            params = kernel.sample(params)
            chain.append(params["var"])
        draws.append(torch.stack(chain))
    assert torch.equal(draws[0], draws[1]) and draws[0].unique().numel() > 1


def test_step_adaptation_feeds_on_exact_decisions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = AusterityMH(logistic, epsilon=0.1, batch_size=50, control_variate=None, normality_check=False)
    kernel.setup(20, X, Y)
    assert kernel._adapt and kernel.warmup_exact_every == 4
    used: list[int] = []
    update = kernel.adapter.update

    def record(*args: object) -> None:
        used.append(kernel._last_used)
        update(*args)

    test = kernel._test

    def remember(*args: object, **kwargs: object):
        info = test(*args, **kwargs)
        kernel._last_used = info.n_used
        return info

    monkeypatch.setattr(kernel.adapter, "update", record)
    monkeypatch.setattr(kernel, "_test", remember)
    params = kernel.initial_params
    for _ in range(20):
        params = kernel.sample(params)
    assert len(used) == 5 and all(n == N for n in used)  # warmup transitions 0, 4, ..., 16 are exact


def test_default_control_variate_is_the_posterior_mode_with_the_laplace_walk() -> None:
    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, normality_check=False)
    kernel.setup(0, X, Y)
    assert kernel._cv_point is not None and kernel._scale is not None and kernel._scale.shape == (3, 3)
    assert not kernel._adapt  # the Laplace walk at 2.38/sqrt(d) is not adapted by default
    # the mode: the log posterior's gradient vanishes there (prior N(0, 1): gradient -w)
    assert torch.allclose(kernel._cv_grad - kernel._cv_point, torch.zeros(3), atol=1e-3)
    exact = AusterityMH(logistic, epsilon=0.0, normality_check=False)
    exact.setup(0, X, Y)
    assert exact._cv_point is None  # exact MH needs no proxy


def test_audit_counts_decisions_and_warns_when_they_are_too_often_wrong() -> None:
    kernel = AusterityMH(
        logistic, epsilon=0.05, batch_size=50, audit_every=1, audit_budget=math.inf, normality_check=False
    )
    kernel.setup(0, X, Y)
    params = kernel.initial_params
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(30):
            params = kernel.sample(params)
    record = kernel.diagnostics()
    assert record["audited_decisions"] == 30 and record["audited_error_rate"] <= 0.2
    from neuralblock.subsample import SequentialTestInfo

    right, wrong = (
        SequentialTestInfo(True, True, 50, 1, 0.01, 0.0, False),
        SequentialTestInfo(False, False, N, 1, 0, 0, False),
    )
    kernel._reset_stats()
    with pytest.warns(RuntimeWarning, match="audited decisions differ"):
        for i in range(12):  # 4 of 12 wrong at epsilon 0.05: far above the bound
            kernel._audit(right, wrong if i % 3 == 0 else right)


def test_audits_stay_within_their_time_budget_and_never_change_the_chain() -> None:
    def run(**audit: float) -> tuple[torch.Tensor, dict]:
        pyro.set_rng_seed(3)
        kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, audit_every=1, normality_check=False, **audit)
        kernel.setup(0, X, Y)
        params, draws = kernel.initial_params, []
        for _ in range(60):
            params = kernel.sample(params)
            draws.append(params["w"])
        return torch.stack(draws), kernel.diagnostics()

    unlimited, all_audited = run(audit_budget=math.inf)
    budgeted, few_audited = run(audit_budget=0.01)
    assert torch.equal(unlimited, budgeted)  # audits decide nothing
    assert all_audited["audited_decisions"] == 60
    # which due audits run depends on measured times, so the decision rule is tested exactly (next test), not
    # here; the first audit built the full-data graph, which is reported apart from the charged audit time
    assert all_audited["audit_build_seconds"] > 0 and few_audited["audited_decisions"] <= 60
    assert 0.0 <= few_audited["audit_time_fraction"] < 1.0
    generous, many_audited = run(audit_budget=1000.0)  # audits may cost 1000x the transitions: all fit
    assert torch.equal(generous, unlimited) and many_audited["audited_decisions"] >= 55
    with pytest.raises(ValueError, match="audit_budget"):
        AusterityMH(logistic, audit_budget=0.0)


def test_an_audit_is_due_only_when_it_fits_the_budget_with_its_expected_cost() -> None:
    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, audit_every=200, normality_check=False)
    kernel.setup(0, X, Y)
    kernel._n, kernel._elapsed, kernel._audit_seconds = 399, 10.0, 0.5  # transition 400: 9.5 s on transitions
    kernel._audit_estimate = 0.4
    assert kernel._audit_due(warmup=False)  # 0.5 + 0.4 <= 0.1 * 9.5
    kernel._audit_estimate = 0.5
    assert not kernel._audit_due(warmup=False)  # 0.5 + 0.5 > 0.95
    assert not kernel._audit_due(warmup=True)
    kernel._n, kernel._audit_estimate = 398, 0.0  # not an audit_every-th transition
    assert not kernel._audit_due(warmup=False)


def test_audit_warns_when_wrong_decisions_lean_towards_accepting() -> None:
    from neuralblock.subsample import SequentialTestInfo

    kernel = AusterityMH(logistic, epsilon=0.05, batch_size=50, audit_every=1, normality_check=False)
    kernel.setup(0, X, Y)
    accept = SequentialTestInfo(True, True, 50, 1, 0.01, 0.0, False)
    reject = SequentialTestInfo(False, False, N, 1, 0, 0, False)
    # 6 false accepts and 6 false rejects in 1000 audits: a 1.2% error rate, symmetric: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(1000):  # the wrong decisions last, so the error rate stays within epsilon throughout
            if i >= 988:
                kernel._audit(accept if i % 2 else reject, reject if i % 2 else accept)
            else:
                kernel._audit(accept, accept)
    assert kernel.diagnostics()["audited_false_accepts"] == 6.0
    # 12 false accepts, no false rejects: the same rate (within epsilon), one-sided (z = 3.46 > 3.3): warns
    kernel._reset_stats()
    with pytest.warns(RuntimeWarning, match="accept moves exact MH rejects"):
        for i in range(1000):
            kernel._audit(accept, reject if i >= 988 else accept)
