"""LWAKernel: the stated targets on an enumerable toy, bias shrinking with ε, the Pyro contract.

Statistical tests use batch-means MCSE z-scores with a Bonferroni threshold at a family-wise
false-failure rate ALPHA = 1e-3 per test (the draws of each test are seeded, so a given
version of the code either passes or fails deterministically; ALPHA is the rate over seeds).
"""

from __future__ import annotations

import itertools
import math
import pickle
import warnings
from collections.abc import Iterator

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.infer.mcmc.api as mcmc_api
import pyro.poutine as poutine
import pytest
import torch
from _stats import bonferroni_t  # tests/ is on sys.path under pytest
from pyro.infer import MCMC

from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.lwa import (
    LWAKernel,
    draw_distinct,
    multiple_try_log_alpha,
    propose_subset,
    subset_log_weight,
    uniform_subsets,
)
from neuralblock.kernels.summaries import (
    Autocorrelations,
    Combine,
    Means,
    MinMax,
    Quantiles,
    default_summaries,
    summarise_batch,
)
from neuralblock.subsample import SectionEvaluator

ALPHA = 1e-3
BATCHES = 20

TOY_Y = torch.tensor([-0.6, -0.2, 0.1, 0.3, 0.5, 0.9])
TOY_N, TOY_n, TOY_EPS = 6, 2, 0.3


def gaussian_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def toy_targets() -> tuple[list[tuple[int, ...]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Subsets, ν(U), the joint target's U-marginal ∝ ν(U) Z_U, and E[mu | U] under the sub-posterior."""
    subsets = list(itertools.combinations(range(TOY_N), TOY_n))
    power = TOY_N / TOY_n
    full = TOY_Y.mean()
    log_nu, log_joint, cond_mean = [], [], []
    for u in subsets:
        yu = TOY_Y[list(u)].double()
        lnu = -((yu.mean() - full) ** 2) / (2 * TOY_EPS**2)
        prec = 1.0 + power * TOY_n  # prior N(0, 1), likelihood^power: precision power * n around mean(yu)
        # log Z_U up to a U-free constant: -power/2 sum (y - ybar)^2 + log N(ybar; 0, 1 + 1/(power n))
        log_z = -power / 2 * ((yu - yu.mean()) ** 2).sum() - yu.mean() ** 2 / (2 * (1 + 1 / (power * TOY_n)))
        log_nu.append(lnu)
        log_joint.append(lnu + log_z)
        cond_mean.append(power * TOY_n * yu.mean() / prec)
    nu = torch.softmax(torch.stack(log_nu), 0)
    joint = torch.softmax(torch.stack(log_joint), 0)
    return subsets, nu, joint, torch.stack(cond_mean)


def run_chain(kernel: LWAKernel, warmup: int, iters: int, *args: object) -> Iterator[dict[str, torch.Tensor]]:
    """Set the kernel up, run ``warmup`` adapting steps, then yield the params of ``iters`` steps."""
    kernel.setup(warmup, *args)
    params = kernel.initial_params
    for t in range(warmup + iters):
        params = kernel.sample(params)
        if t >= warmup:
            yield params


def run_toy(update: str, chains: int, iters: int, tries: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """U-indicator draws [chains, iters, subsets] and mu draws [chains, iters] from direct kernel calls."""
    subsets = list(itertools.combinations(range(TOY_N), TOY_n))
    code = {sum(1 << i for i in u): k for k, u in enumerate(subsets)}
    ind = torch.zeros(chains, iters, len(subsets))
    mus = torch.zeros(chains, iters)
    for c in range(chains):
        kernel = LWAKernel(
            gaussian_model,
            TOY_n,
            epsilon=TOY_EPS,
            summaries=Means(),
            omega=0.5,
            lam=0.5,
            subset_update=update,
            step_size=0.5,
            subset_tries=tries,
        )
        for t, params in enumerate(run_chain(kernel, 50, iters, TOY_Y)):
            ind[c, t, code[sum(1 << i for i in kernel.indices.tolist())]] = 1.0
            mus[c, t] = params["mu"]
    return ind, mus


@pytest.mark.parametrize(("update", "tries"), [("joint", 1), ("informed", 1), ("informed", 3)])
def test_subset_chain_matches_its_stated_target(update: str, tries: int) -> None:
    """joint: (U, mu) ~ ν(U) p(mu) f(Y_U|mu)^{N/n} exactly; informed: U ~ ν exactly (also with
    multiple-try remote jumps, ``tries > 1``).

    The test has power: the same visit frequencies are checked to *reject* the other mode's target.
    """
    chains, iters = 2, 1000
    _, nu, joint, cond_mean = toy_targets()
    assert (joint - nu).abs().max() > 0.05  # the two targets differ enough to tell apart
    ind, mus = run_toy(update, chains, iters, tries)
    freq, se = batch_means_mcse(ind, BATCHES)
    expected, other = (joint, nu) if update == "joint" else (nu, joint)
    limit = bonferroni_t(len(nu) + 1, chains * BATCHES - 1)
    z = (freq - expected) / se.clamp_min(1e-4)
    assert z.abs().max() < limit, f"visit z-scores {z}"
    z_other = (freq - other) / se.clamp_min(1e-4)
    assert z_other.abs().max() > limit, "the test cannot tell the two targets apart"
    if update == "joint":  # E[mu] under the joint target: sum_U π(U) E[mu | U]
        m, s = batch_means_mcse(mus, BATCHES)
        assert abs(float(m) - float((joint * cond_mean).sum())) / float(s) < limit


def test_theta_update_is_exact_for_a_constrained_site_on_the_full_data() -> None:
    """n = N: the θ-update alone, on a Poisson rate with a Gamma prior (conjugate, positive support)."""
    y = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 2.0])
    a, b = 2.0, 1.0

    def model(y: torch.Tensor) -> None:
        rate = pyro.sample("rate", dist.Gamma(a, b))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("obs", dist.Poisson(rate), obs=y[idx])

    chains, iters = 2, 1500
    draws = torch.zeros(chains, iters, 2)
    for c in range(chains):
        kernel = LWAKernel(model, len(y), step_size=0.3)
        for t, params in enumerate(run_chain(kernel, 200, iters, y)):
            rate = kernel.transforms["rate"].inv(params["rate"])
            draws[c, t] = torch.stack([rate, rate**2])
    shape, rate = a + float(y.sum()), b + len(y)
    exact = torch.tensor([shape / rate, shape * (shape + 1) / rate**2])
    m, s = batch_means_mcse(draws, BATCHES)
    z = (m - exact) / s
    assert z.abs().max() < bonferroni_t(2, chains * BATCHES - 1), f"z = {z}"
    assert kernel.diagnostics()["subset_refresh_rate"] == 0.0


def test_bias_shrinks_as_epsilon_tightens() -> None:
    """Informed LWA on a Gaussian mean: RMSE of draws about the exact posterior mean falls with ε."""
    g = torch.Generator().manual_seed(3)
    y = torch.randn(2000, generator=g) * 1.0 + 0.7
    post_prec = 1.0 + len(y)
    exact_mean, exact_sd = float(y.sum()) / post_prec, post_prec**-0.5
    rmse = {}
    for eps in (math.inf, 0.01):
        kernel = LWAKernel(gaussian_model, 20, epsilon=eps, summaries=Means(), step_size=0.05)
        mcmc = MCMC(kernel, num_samples=600, warmup_steps=200, disable_progbar=True)
        mcmc.run(y)
        mu = mcmc.get_samples()["mu"]
        rmse[eps] = float(((mu - exact_mean) ** 2).mean().sqrt())
        assert kernel.diagnostics()["subset_refresh_rate"] > 0
    assert rmse[0.01] < 0.5 * rmse[math.inf], rmse
    assert rmse[0.01] < 4 * exact_sd, (rmse, exact_sd)


def ar1_model(y: torch.Tensor) -> None:
    """AR(1) whose windowed conditional likelihood starts from the window's own first value."""
    phi = pyro.sample("phi", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", len(y)) as idx:
        prev = torch.where(idx > 0, y[(idx - 1).clamp_min(0)], torch.zeros(()))
        pyro.sample("obs", dist.Normal(phi * prev, sigma), obs=y[idx])


def test_window_subsets_in_pyro_mcmc_with_two_chains() -> None:
    """Windows on an AR(1) series, run by pyro.infer.MCMC with num_chains=2 (spawned processes)."""
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(3000, generator=g) * 0.5
    y = torch.zeros(3000)
    for t in range(1, 3000):  # data generation only (not a hot path)
        y[t] = 0.6 * y[t - 1] + noise[t]
    kernel = LWAKernel(ar1_model, 300, subset="window", epsilon=0.05, summaries=Autocorrelations([1]))
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=200, num_chains=2, disable_progbar=True)
    mcmc.run(y)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["phi"].shape == (2, 200) and bool((samples["sigma"] > 0).all())
    assert abs(float(samples["phi"].mean()) - 0.6) < 0.1
    assert abs(float(samples["sigma"].mean()) - 0.5) < 0.1
    assert "r_hat" in mcmc.diagnostics()["phi"]


def test_condition_on_fixes_other_sites_for_a_compound_sampler() -> None:
    y = torch.randn(400) * 0.5 + 5.0

    def model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        shift = pyro.sample("shift", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("obs", dist.Normal(mu + shift, 0.5), obs=y[idx])

    kernel = LWAKernel(model, 100, sites=["mu"], epsilon=0.05, step_size=0.2)
    kernel.setup(200, y)
    means = {}
    for shift in (0.0, 4.0):
        kernel.condition_on({"shift": torch.tensor(shift)})
        params = kernel.initial_params
        draws = []
        for _ in range(300):
            params = kernel.sample(params)
            draws.append(float(params["mu"]))
        means[shift] = float(np.mean(draws[150:]))
    assert set(kernel.initial_params) == {"mu"}
    assert abs(means[0.0] - 5.0) < 0.3 and abs(means[4.0] - 1.0) < 0.3, means
    with pytest.raises(ValueError, match="cannot fix sites this kernel updates"):
        kernel.condition_on({"mu": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="not latent sites"):
        kernel.condition_on({"nope": torch.tensor(0.0)})


def test_nonfinite_ratios_are_counted_rejections() -> None:
    y = torch.randn(50)

    def model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)) as idx:  # scale < 0 for mu > 1: a NaN log density
            pyro.sample("obs", dist.Normal(0.0, 1.0 - mu), obs=y[idx])

    kernel = LWAKernel(model, 10, step_size=2.0, adapt_step_size=False)
    kernel.initial_params = {"mu": torch.tensor(0.0)}
    kernel.setup(0, y)
    params = kernel.initial_params
    for _ in range(100):
        params = kernel.sample(params)
        assert float(params["mu"]) < 1.0
    assert kernel.diagnostics()["nonfinite_rejections"] > 0


def test_pickles_before_and_after_setup_and_logging() -> None:
    kernel = LWAKernel(gaussian_model, 3)
    pickle.loads(pickle.dumps(kernel))
    kernel.setup(0, TOY_Y)
    clone = pickle.loads(pickle.dumps(kernel))
    params = clone.sample(clone.initial_params)
    assert set(params) == {"mu"} and set(clone.logging()) == {"acc", "refresh"}
    diag = clone.diagnostics()
    assert diag["data_fraction"] == 0.5 and "acceptance_rate" in diag and "subset_acceptance_rate" in diag


def test_bad_input_raises_named_errors() -> None:
    with pytest.raises(ValueError, match="subset_size"):
        LWAKernel(gaussian_model, 0)
    with pytest.raises(ValueError, match="epsilon"):
        LWAKernel(gaussian_model, 2, epsilon=-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        LWAKernel(gaussian_model, 2, epsilon=True)  # type: ignore[arg-type]
    assert LWAKernel(gaussian_model, np.int64(2)).subset_size == 2  # a NumPy integer is an int
    with pytest.raises(ValueError, match="subset must be"):
        LWAKernel(gaussian_model, 2, subset="random")
    with pytest.raises(TypeError, match="summaries"):
        LWAKernel(gaussian_model, 2, summaries="quantiles")
    with pytest.raises(ValueError, match="exceeds"):
        LWAKernel(gaussian_model, 7).setup(0, TOY_Y)
    with pytest.raises(ValueError, match="plate 'rows'"):
        LWAKernel(gaussian_model, 2, plate="rows").setup(0, TOY_Y)
    with pytest.raises(ValueError, match="not global latent sites"):
        LWAKernel(gaussian_model, 2, sites=["sigma"]).setup(0, TOY_Y)
    with pytest.raises(ValueError, match="subset_tries must be"):
        LWAKernel(gaussian_model, 2, subset_tries=0)
    with pytest.raises(ValueError, match="informed"):
        LWAKernel(gaussian_model, 2, subset_tries=4, subset_update="joint")

    def local_model(y: torch.Tensor) -> None:
        with pyro.plate("data", len(y)) as idx:
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("obs", dist.Normal(z, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match="global latent sites only"):
        LWAKernel(local_model, 2).setup(0, TOY_Y)


def test_proposals_and_weights() -> None:
    u = torch.tensor([0, 5, 9])
    for _ in range(50):
        prop = propose_subset(u, 12, "iid", omega=0.7, lam=0.34)
        assert prop.valid and prop.indices.unique().numel() == 3
        assert prop.num_changed == 3 - int(torch.isin(prop.indices, u).sum())
        win = propose_subset(torch.arange(4, 8), 12, "window", omega=0.7, lam=0.5)
        if win.valid:
            start = int(win.indices[0])
            assert 0 <= start <= 8 and torch.equal(win.indices, torch.arange(start, start + 4))
    big = draw_distinct(10**6, 500, exclude=torch.arange(100))
    assert big.unique().numel() == 500 and int(big.min()) >= 100
    assert not propose_subset(torch.arange(5), 5, "iid", 1.0, 0.2).valid  # U is all the data
    assert float(subset_log_weight(torch.ones(2), torch.zeros(2), math.inf)) == 0.0
    assert subset_log_weight(torch.ones(3, 2), torch.zeros(2), 1.0).tolist() == [-1.0, -1.0, -1.0]
    iid = uniform_subsets(12, 3, "iid", 5)
    assert iid.shape == (5, 3) and all(row.unique().numel() == 3 for row in iid)
    win = uniform_subsets(12, 4, "window", 50)
    assert int(win.max()) <= 11 and torch.equal(win - win[:, :1], torch.arange(4).expand(50, 4))
    # MTM ratio: log of sum of candidate weights over (sum of reference weights + current weight)
    alpha = multiple_try_log_alpha(torch.tensor([0.0, math.log(3.0)]), torch.tensor([math.log(2.0)]), 0.0)
    assert math.isclose(float(alpha), math.log(4.0 / 3.0), rel_tol=1e-6)
    with pytest.raises(ValueError, match="K - 1"):
        multiple_try_log_alpha(torch.zeros(2), torch.zeros(2), 0.0)


def test_summaries_match_numpy() -> None:
    y = torch.randn(200, dtype=torch.float64)
    x = y.numpy()
    acf = Autocorrelations([1, 3])(y).numpy()
    c = x - x.mean()
    expected = [np.sum(c[:-k] * c[k:]) / np.sum(c * c) for k in (1, 3)]
    np.testing.assert_allclose(acf, expected)
    np.testing.assert_allclose(Quantiles([0.2, 0.8])(y).numpy(), np.quantile(x, [0.2, 0.8]))
    s = Combine(Means(), MinMax())(torch.stack([y, 2 * y], 1))
    np.testing.assert_allclose(s.numpy(), [x.mean(), 2 * x.mean(), x.min(), 2 * x.min(), x.max(), 2 * x.max()])
    assert default_summaries("iid")(y).shape == (4,)
    # batched summaries of K subsets equal the per-subset ones (scalar and vector rows; a plain callable loops)
    fn = Combine(Means(), Quantiles([0.2, 0.8]), Autocorrelations([1, 2]), MinMax(), lambda rows: rows.sum(0))
    for batch in (torch.randn(7, 30, dtype=torch.float64), torch.randn(7, 30, 2, dtype=torch.float64)):
        expected_batch = torch.stack([fn(rows) for rows in batch])
        torch.testing.assert_close(summarise_batch(fn, batch), expected_batch)
    with pytest.raises(ValueError, match="lag"):
        Autocorrelations([0])
    with pytest.raises(ValueError, match="quantile"):
        Quantiles([1.5])
    with pytest.raises(ValueError, match="subset"):
        default_summaries("blocks")


def shift_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    shift = pyro.sample("shift", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("obs", dist.Normal(mu + shift, 0.5), obs=y[idx])


def test_global_block_of_a_compound_kernel() -> None:
    """LWA updates ``mu`` inside CompoundKernel while Pyro's random walk updates ``shift`` (full data)."""
    from pyro.infer.mcmc import RandomWalkKernel

    from neuralblock.kernels.compound import CompoundKernel
    from neuralblock.kernels.conditioning import ConditionedModel

    y = torch.randn(400) * 0.5 + 5.0
    blocks = [
        (LWAKernel(shift_model, 100, epsilon=0.05, step_size=0.2), ["mu"]),
        (RandomWalkKernel(ConditionedModel(shift_model, {"mu": torch.tensor(0.0)}), init_step_size=0.2), ["shift"]),
    ]
    mcmc = MCMC(CompoundKernel(blocks), num_samples=150, warmup_steps=100, disable_progbar=True)
    mcmc.run(y)
    samples = mcmc.get_samples()
    total = samples["mu"] + samples["shift"]
    assert abs(float(total.mean()) - float(y.mean())) < 0.15
    assert samples["shift"].unique().numel() > 3 and samples["mu"].unique().numel() > 3  # both blocks move


def halfnormal_model(y: torch.Tensor) -> None:
    s = pyro.sample("s", dist.HalfNormal(5.0))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("obs", dist.Normal(0.0, s), obs=y[idx])


def test_transforms_are_none_until_setup_so_pyro_builds_them_for_parallel_chains() -> None:
    """With parallel chains only the workers run setup; Pyro's MCMC then sets the main-process kernel up
    to map the draws back, but only if its ``transforms`` is ``None`` (an empty dict left them unconstrained).
    """
    kernel = LWAKernel(halfnormal_model, 20)
    assert kernel.transforms is None
    with pytest.raises(RuntimeError, match="setup"):
        kernel.sample({"s": torch.tensor(0.0)})
    mcmc = MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True)
    mcmc._set_transforms(torch.randn(100))  # what MCMC.run does when the chains ran in worker processes
    assert set(mcmc.transforms) == {"s"} and float(mcmc.transforms["s"].inv(torch.tensor(-3.0))) > 0


def test_initial_params_start_every_chain_and_the_next_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcmc_api.mp, "cpu_count", lambda: 1)  # chains in sequence, through one kernel
    kernel = LWAKernel(gaussian_model, 2, step_size=1e-6, adapt_step_size=False)
    start = torch.tensor([5.0, 8.0])
    with pytest.warns(UserWarning, match="sequentially"):
        mcmc = MCMC(kernel, 3, 0, num_chains=2, initial_params={"mu": start}, disable_progbar=True)
    mcmc.run(TOY_Y)
    mu = mcmc.get_samples(group_by_chain=True)["mu"]
    torch.testing.assert_close(mu, start[:, None].expand(2, 3), atol=1e-4, rtol=0)
    kernel.initial_params = {"mu": torch.tensor(-4.0)}  # set after a run: applied now and at the next setup
    assert float(kernel.initial_params["mu"]) == -4.0
    kernel.setup(0, TOY_Y)
    assert float(kernel.initial_params["mu"]) == -4.0
    kernel.setup(0, TOY_Y)  # nothing set since: a prior draw, as for every kernel of the package
    assert float(kernel.initial_params["mu"]) != -4.0


def test_remote_jumps_are_counted_once() -> None:
    """omega = 0: every subset update is a remote (multiple-try) jump, so the two tallies agree."""
    kernel = LWAKernel(gaussian_model, 2, epsilon=TOY_EPS, summaries=Means(), omega=0.0, subset_tries=3)
    for _ in run_chain(kernel, 0, 200, TOY_Y):
        pass
    diag = kernel.diagnostics()
    assert 0.0 < diag["subset_acceptance_rate"] < 1.0
    assert diag["remote_jumps_accepted"] == round(200 * diag["subset_acceptance_rate"])
    assert diag["remote_acceptance_rate"] == diag["subset_acceptance_rate"]


def test_model_evals_count_post_warmup_only() -> None:
    kernel = LWAKernel(gaussian_model, 2)
    steps = list(run_chain(kernel, 5, 0, TOY_Y))
    assert not steps and kernel.diagnostics()["model_evals"] == 0.0
    kernel.sample(kernel.initial_params)
    assert kernel.diagnostics()["model_evals"] > 0


WEIGHTS = torch.linspace(0.5, 2.0, len(TOY_Y))


def weighted_model(y: torch.Tensor) -> None:
    """Per-datum (e.g. coreset or tempering) weights by ``poutine.scale`` inside the data plate."""
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)) as idx, poutine.scale(scale=WEIGHTS[idx]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def test_user_scale_inside_the_plate_is_kept() -> None:
    kernel = LWAKernel(weighted_model, 2)
    kernel.setup(0, TOY_Y)
    u, mu = torch.tensor([4, 1]), torch.tensor(0.3)
    power = len(TOY_Y) / 2
    expected = dist.Normal(0.0, 1.0).log_prob(mu) + power * (WEIGHTS[u] * dist.Normal(mu, 1.0).log_prob(TOY_Y[u])).sum()
    terms = SectionEvaluator(weighted_model, "data", len(TOY_Y), args=(TOY_Y,)).evaluate({"mu": mu}, u)
    assert math.isclose(float(terms.global_term + power * terms.sections.sum()), float(expected), rel_tol=1e-6)
    assert math.isclose(kernel.log_target({"mu": mu}, u), float(expected), rel_tol=1e-6)


SPARSE_Y = torch.zeros(200)
SPARSE_Y[::37] = 1.0  # a sparse event series: most windows of 10 are constant


def bernoulli_model(y: torch.Tensor) -> None:
    p = pyro.sample("p", dist.Beta(1.0, 1.0))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("obs", dist.Bernoulli(p), obs=y[idx])


def test_constant_windows_have_finite_weights_and_the_start_window_moves() -> None:
    assert Autocorrelations([1, 2])(torch.zeros(10)).tolist() == [0.0, 0.0]
    kernel = LWAKernel(bernoulli_model, 10, subset="window", epsilon=0.1)
    starts = {int(kernel.indices[0]) for _ in run_chain(kernel, 0, 100, SPARSE_Y)}
    assert len(starts) > 5 and kernel.diagnostics()["nonfinite_rejections"] == 0.0


def test_setup_redraws_a_start_subset_with_a_nonfinite_weight() -> None:
    def log_total(rows: torch.Tensor) -> torch.Tensor:  # -inf for a window without an event
        return rows.sum().log().reshape(1)

    kernel = LWAKernel(bernoulli_model, 10, subset="window", summaries=log_total)
    for _ in range(5):
        kernel.setup(0, SPARSE_Y)
        assert float(SPARSE_Y[kernel.indices].sum()) > 0

    def nan_on_subsets(rows: torch.Tensor) -> torch.Tensor:
        return torch.full((1,), math.nan if rows.shape[0] < len(SPARSE_Y) else 0.0)

    with pytest.raises(ValueError, match="subset weight"):
        LWAKernel(bernoulli_model, 10, subset="window", summaries=nan_on_subsets).setup(0, SPARSE_Y)


def _ar_window_model(y: torch.Tensor) -> None:
    """AR(1) conditional likelihood on a window: reads y[idx - 1] (the previous value) by index arithmetic."""
    phi = pyro.sample("phi", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(y) - 1) as idx:
        pyro.sample("obs", dist.Normal(phi * y[idx], sigma), obs=y[idx + 1])


def _vector_model(x: torch.Tensor, y: torch.Tensor) -> None:
    """Vector weights, a positive noise scale, a fixed other site, and an observed site outside the plate."""
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    shift = pyro.sample("shift", dist.Normal(0.0, 1.0))
    scale = pyro.sample("scale", dist.HalfNormal(2.0))
    pyro.sample("anchor", dist.Normal(shift, 1.0), obs=torch.tensor(0.3))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.StudentT(4.0, x[idx] @ w + shift, scale), obs=y[idx])


@pytest.mark.parametrize("case", ["gaussian", "ar-window", "vector-conditioned", "user-scale"])
def test_direct_path_log_target_equals_the_pyro_run(case: str) -> None:
    gen = torch.Generator().manual_seed(3)
    if case == "gaussian":
        model, args, n, subset, sites = gaussian_model, (torch.randn(300, generator=gen),), 37, "iid", None
    elif case == "ar-window":
        model, args, n, subset, sites = _ar_window_model, (torch.randn(301, generator=gen),), 50, "window", None
    elif case == "vector-conditioned":
        x = torch.randn(200, 3, generator=gen)
        args, n, subset, sites = (x, x @ torch.ones(3) + torch.randn(200, generator=gen)), 20, "iid", ["w", "scale"]
        model = _vector_model
    else:
        model, args, n, subset, sites = weighted_model, (TOY_Y,), 3, "iid", None
    kernel = LWAKernel(model, n, sites=sites, subset=subset, plate="data")
    if case == "vector-conditioned":
        kernel.condition_on({"shift": torch.tensor(-0.4)})
    kernel.setup(0, *args)
    assert kernel._direct is not None
    for _ in range(5):
        params = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in kernel.initial_params.items()}
        if subset == "window":
            start = int(torch.randint(0, kernel.num_data - n + 1, (), generator=gen))
            indices = torch.arange(start, start + n)
        else:
            indices = torch.randperm(kernel.num_data, generator=gen)[:n]
        direct = kernel.log_target(params, indices)
        compiled, kernel._direct = kernel._direct, None
        pyro_value = kernel.log_target(params, indices)
        kernel._direct = compiled
        assert math.isclose(direct, pyro_value, rel_tol=1e-5, abs_tol=1e-4), (direct, pyro_value)


def test_a_model_the_direct_path_cannot_compile_falls_back_with_a_warning() -> None:
    y = torch.randn(100)

    def branching(y: torch.Tensor) -> None:  # data-dependent Python control flow: not one graph
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)) as idx:
            loc = mu if float(mu) > 0 else 2 * mu
            pyro.sample("obs", dist.Normal(loc, 1.0), obs=y[idx])

    kernel = LWAKernel(branching, 10)
    with pytest.warns(RuntimeWarning, match="direct likelihood path"):
        kernel.setup(0, y)
    assert kernel._direct is None
    params = kernel.sample(kernel.initial_params)
    assert math.isfinite(kernel.log_target(params, kernel.indices))


def test_a_run_whose_subset_hardly_moves_warns() -> None:
    y = torch.randn(2000)
    # eps tiny: nearly every subset move is rejected, so U is renewed far fewer than 20 times in 300 iterations
    stuck = LWAKernel(gaussian_model, 100, epsilon=1e-6, omega=1.0, lam=0.01)
    with pytest.warns(RuntimeWarning, match="renewed"):
        MCMC(stuck, num_samples=300, warmup_steps=50, disable_progbar=True).run(y)
    # uniform subsets (eps = inf): half the proposals are remote jumps, all accepted: about 150 renewals
    moving = LWAKernel(gaussian_model, 100, epsilon=math.inf, omega=0.5)
    mcmc = MCMC(moving, num_samples=300, warmup_steps=50, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        mcmc.run(y)
    assert moving.diagnostics()["subset_renewals"] >= 20
