"""AusterityMH.restrict: one kernel over a changing part of the plate (e.g. each cluster's expert in a mixture)."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size

from neuralblock.kernels import austerity
from neuralblock.kernels.austerity import AusterityMH

N = 600
X = torch.randn(N, 3, generator=torch.Generator().manual_seed(11)).double()
W_TRUE = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
Y = torch.bernoulli(torch.sigmoid(X @ W_TRUE), generator=torch.Generator().manual_seed(12))
SUBSET = torch.randperm(N, generator=torch.Generator().manual_seed(13))[:230]
MEANS = torch.cat([torch.zeros(N // 2), torch.full((N // 2,), 3.0)]).double()
DATA = MEANS + torch.randn(N, generator=torch.Generator().manual_seed(14)).double()


def logistic(x: torch.Tensor, y: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def normal_mean(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=y.dtype), 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _kernel(model, *args: torch.Tensor, start: dict[str, torch.Tensor] | None = None, **options) -> AusterityMH:
    kernel = AusterityMH(model, normality_check=False, audit_every=0, **options)
    if start is not None:
        kernel.initial_params = start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kernel.setup(0, *args)
    return kernel


def _draws(kernel: AusterityMH, start: dict[str, torch.Tensor], steps: int, seed: int = 0) -> list[torch.Tensor]:
    params, out = dict(start), []
    for i in range(steps):
        torch.manual_seed(seed + i)
        params = kernel.sample(params)
        out.append(params["w"].clone())
    return out


@pytest.mark.parametrize(
    ("epsilon", "control_variate", "split"),
    [(0.0, "mode", False), (0.1, "mode", False), (0.1, None, False), (0.1, {"w": W_TRUE}, False),
     (0.1, {"w": W_TRUE}, True)],
    ids=["exact", "mode", "no-cv", "given-cv", "given-cv-split-stages"],
)  # fmt: skip
def test_a_restricted_kernel_makes_the_draws_of_a_kernel_on_the_subset(
    epsilon: float, control_variate, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restricting a kernel on all the data to ``S`` gives the chain of a kernel set up on the data of ``S``.

    ``split``: stages above 8 sections run the control-variate point apart (the path of stages over 4096).
    """
    if split:
        monkeypatch.setattr(austerity, "_FUSED_MAX_SECTIONS", 8)
    start = {"w": torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64)}
    options = {"epsilon": epsilon, "batch_size": 20, "control_variate": control_variate, "step_size": 0.3}
    on_subset = _kernel(logistic, X[SUBSET], Y[SUBSET], start=start, **options)
    restricted = _kernel(logistic, X, Y, **options)
    restricted.restrict(SUBSET, start)
    assert restricted.num_sections == len(SUBSET)
    if control_variate is not None and epsilon > 0:
        assert torch.allclose(restricted._cv_point, on_subset._cv_point, atol=1e-6)
    ours, theirs = _draws(restricted, start, 60), _draws(on_subset, start, 60)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, theirs, strict=True))
    moved = sum(not torch.equal(a, b) for a, b in zip(ours, ours[1:], strict=False))
    assert moved > 5  # the chain accepts: a kernel that ignored the subset would drift apart
    if epsilon > 0:
        assert restricted.diagnostics()["data_fraction"] < 1.0


def test_restricting_to_none_restores_the_whole_plate() -> None:
    start = {"w": torch.zeros(3, dtype=torch.float64)}
    whole = _kernel(logistic, X, Y, epsilon=0.0, step_size=0.3)
    back = _kernel(logistic, X, Y, epsilon=0.0, step_size=0.3)
    back.restrict(SUBSET, start)
    _draws(back, start, 5)
    back.restrict(None, start)
    assert back.num_sections == N
    assert all(torch.equal(a, b) for a, b in zip(_draws(back, start, 30, 7), _draws(whole, start, 30, 7), strict=True))


def test_data_fraction_averages_over_the_section_sets_of_each_transition() -> None:
    start = {"w": torch.zeros(3, dtype=torch.float64)}
    kernel = _kernel(logistic, X, Y, epsilon=0.0, step_size=0.3)
    kernel.restrict(SUBSET, start)
    _draws(kernel, start, 10)
    kernel.restrict(None, start)
    _draws(kernel, start, 10)
    diagnostics = kernel.diagnostics()
    assert diagnostics["data_fraction"] == pytest.approx(1.0)
    assert diagnostics["mean_sections_used"] == pytest.approx((len(SUBSET) + N) / 2)


def test_restricted_austerity_chain_matches_the_subset_posterior() -> None:
    """Normal mean, known unit variance: the posterior on the second half is conjugate.

    The chain mean's z-score uses the MCSE from its effective sample size; |z| < 4 fails with
    probability below 1e-4 for an exact chain (austerity's epsilon = 0.01 adds a bias far below one MCSE here).
    """
    pyro.set_rng_seed(5)
    kernel = _kernel(normal_mean, DATA, epsilon=0.01, batch_size=40)
    second = torch.arange(N // 2, N)
    kernel.restrict(second, {"mu": torch.tensor(3.0, dtype=torch.float64)})
    params, draws = {"mu": torch.tensor(3.0, dtype=torch.float64)}, []
    for _ in range(3000):
        params = kernel.sample(params)
        draws.append(float(params["mu"]))
    chain = torch.tensor(draws[500:], dtype=torch.float64)
    precision = 1.0 / 100.0 + len(second)
    post_mean, post_sd = float(DATA[second].sum()) / precision, 1.0 / math.sqrt(precision)
    ess = float(effective_sample_size(chain[None, :, None]))
    z = (float(chain.mean()) - post_mean) / (post_sd / math.sqrt(ess))
    assert abs(z) < 4.0, (z, ess)
    # the sd's relative standard error is about sqrt(1 / (2 ESS)); 4 of them: a 1e-4 false-failure rate
    assert abs(float(chain.std()) / post_sd - 1.0) < 4.0 * math.sqrt(1.0 / (2.0 * ess)), (float(chain.std()), post_sd)
    assert kernel.diagnostics()["data_fraction"] < 0.9  # decided on mini-batches of the half


def test_restrict_refuses_bad_sections_and_changes_nothing() -> None:
    kernel = AusterityMH(logistic, normality_check=False)
    with pytest.raises(ValueError, match="after setup"):
        kernel.restrict(SUBSET, {"w": torch.zeros(3)})
    kernel.restrict(torch.tensor([0, N + 5]))  # kept until setup, which checks it against the plate
    with pytest.raises(ValueError, match=f"0..{N - 1}"):
        kernel.setup(0, X, Y)
    kernel = _kernel(logistic, X, Y, epsilon=0.1, batch_size=20)
    kernel.restrict(SUBSET)
    rows = kernel._cv_rows.shape
    bad = [
        (SUBSET.double(), TypeError, "integer tensor"),
        (torch.ones(N, dtype=torch.bool), TypeError, "mask"),
        ([1, 2, 3], TypeError, "integer tensor"),
        (SUBSET.reshape(2, -1), ValueError, "1-D"),
        (torch.tensor([], dtype=torch.long), ValueError, "non-empty"),
        (torch.tensor([0, N]), ValueError, f"0..{N - 1}"),
        (torch.tensor([-1, 2]), ValueError, ">= 0"),
        (torch.tensor([3, 5, 3]), ValueError, "repeat"),
    ]
    for sections, error, message in bad:
        with pytest.raises(error, match=message):
            kernel.restrict(sections)
    with pytest.raises(ValueError, match="3x3"):
        kernel.restrict(torch.arange(10), proposal_scale=torch.eye(2))
    for step in (0.0, math.inf, True):
        with pytest.raises(ValueError, match="step_size"):
            kernel.restrict(torch.arange(10), step_size=step)
    with pytest.raises(ValueError, match="exactly the sites"):
        kernel.restrict(torch.arange(500), {"w": torch.zeros(3), "v": torch.zeros(1)})
    with pytest.raises(ValueError, match="exactly the sites"):
        kernel.restrict(torch.arange(500), {"v": torch.zeros(1)})
    assert kernel.num_sections == len(SUBSET)  # nothing changed: the old control variate rows still fit
    assert torch.equal(kernel._subset, SUBSET) and kernel._cv_rows.shape == rows
    kernel.sample({"w": torch.zeros(3, dtype=torch.float64)})
    kernel.restrict(torch.arange(10))
    kernel.restrict(torch.tensor([N - 1, 0]))  # the plate's range, not the previous subset's, bounds a new one
    assert kernel.num_sections == 2


def test_switching_between_subsets_of_one_size_gives_each_subsets_chain() -> None:
    """The exact path caches the current state's terms: a switch of subsets must drop them.

    Each round caches one subset's terms at ``start``, switches to another subset of the same size and
    makes one transition from ``start``, which must be the transition of a kernel set up on that subset.
    """
    start = {"w": torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)}
    ones, other = Y.nonzero().flatten()[:150], (1 - Y).nonzero().flatten()[:150]  # far apart log-likelihoods
    kernel = _kernel(logistic, X, Y, epsilon=0.0, step_size=0.3)
    on_other = _kernel(logistic, X[other], Y[other], start=start, epsilon=0.0, step_size=0.3)
    for round_ in range(20):
        kernel.restrict(ones, start)
        kernel.sample(start)  # the cache now holds the other subset's terms at ``start``
        kernel.restrict(other, start)
        (ours,) = _draws(kernel, start, 1, 100 + round_)
        (theirs,) = _draws(on_other, start, 1, 100 + round_)
        assert torch.allclose(ours, theirs, atol=1e-9), round_


def test_normality_check_and_audits_read_the_subset() -> None:
    start = {"w": torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64)}
    options = {"epsilon": 0.2, "batch_size": 20, "control_variate": None, "step_size": 0.3}
    checks = {"normality_check": True, "normality_sections": 100, "audit_every": 3, "audit_budget": math.inf}
    kernels = []
    for args, given in (((X[SUBSET], Y[SUBSET]), start), ((X, Y), None)):
        kernel = AusterityMH(logistic, **options, **checks)
        if given is not None:
            kernel.initial_params = given
        kernel.setup(0, *args)
        kernels.append(kernel)
    kernels[1].restrict(SUBSET, start)
    draws = [_draws(kernel, start, 30) for kernel in kernels]
    assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(*draws, strict=True))
    reports = [kernel.normality for kernel in kernels]
    assert reports[0] is not None and reports[0].skewness == pytest.approx(reports[1].skewness, rel=1e-6)
    audits = [kernel.diagnostics() for kernel in kernels]
    assert audits[0]["audited_decisions"] == audits[1]["audited_decisions"] == 10
    assert audits[0]["audited_error_rate"] == audits[1]["audited_error_rate"]


def test_a_given_control_variate_hessian_is_not_reused_for_a_subset() -> None:
    """The proxy's O(d^2) sum must equal the sum of the subset's per-section proxies (else every test is biased)."""
    p = torch.sigmoid(X @ W_TRUE)
    hessian = -(X * (p * (1 - p))[:, None]).T @ X  # the whole plate's
    kernel = _kernel(logistic, X, Y, epsilon=0.1, control_variate={"w": W_TRUE}, control_variate_hessian=hessian)
    kernel.restrict(SUBSET)
    z, z_new = W_TRUE + 0.1 * torch.randn(3).double(), W_TRUE + 0.1 * torch.randn(3).double()
    per_section = kernel._proxy(torch.arange(len(SUBSET)), z, z_new)
    assert float(per_section.sum()) == pytest.approx(float(kernel._proxy_sum(z, z_new)), rel=1e-8, abs=1e-10)


def test_a_restriction_set_before_setup_holds_inside_pyro_mcmc() -> None:
    """MCMC calls setup: a restriction given before it must hold (the subset's conjugate posterior mean)."""
    kernel = AusterityMH(normal_mean, epsilon=0.0, normality_check=False)
    second = torch.arange(N // 2, N)
    kernel.restrict(second)
    mcmc = MCMC(kernel, num_samples=400, warmup_steps=100, disable_progbar=True)
    mcmc.run(DATA)
    draws = mcmc.get_samples()["mu"]
    precision = 1.0 / 100.0 + len(second)
    post_mean, post_sd = float(DATA[second].sum()) / precision, 1.0 / math.sqrt(precision)
    ess = float(effective_sample_size(draws[None, :, None]))
    assert abs(float(draws.mean()) - post_mean) < 4.0 * post_sd / math.sqrt(ess), (float(draws.mean()), post_mean)
    assert kernel.num_sections == len(second)
    kernel.restrict(None)
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=50, disable_progbar=True)
    mcmc.run(DATA)
    assert kernel.num_sections == N


def test_restrict_keeps_the_step_and_its_scale_holds_for_that_restriction_only() -> None:
    start = {"w": torch.zeros(3, dtype=torch.float64)}
    kernel = _kernel(logistic, X, Y, epsilon=0.0, step_size=0.3)
    kernel.restrict(SUBSET, start, proposal_scale=5.0, step_size=0.7)
    assert kernel.step_size == pytest.approx(0.7) and float(kernel._scale) == 5.0
    kernel.restrict(torch.arange(100), start)
    assert kernel.step_size == pytest.approx(0.7) and kernel._scale is None  # the constructor's walk again
    kernel.restrict(None, start, proposal_scale=2.0, step_size=0.4)  # the whole plate, with its own walk
    assert kernel.num_sections == N and kernel.step_size == pytest.approx(0.4) and float(kernel._scale) == 2.0


def test_the_mode_search_of_a_restriction_costs_one_pass_from_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restricting from the subset's mode finds it there (one pass); from afar, Newton steps still reach it."""
    kernel = _kernel(logistic, X, Y, epsilon=0.1, batch_size=20)
    start = {"w": torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64)}
    kernel.restrict(SUBSET, start)
    mode = kernel._cv_point.clone()
    w = mode.clone().requires_grad_(True)  # the subset's log posterior is flat there
    log_post = dist.Normal(0.0, 1.0).log_prob(w).sum() + dist.Bernoulli(logits=X[SUBSET] @ w).log_prob(Y[SUBSET]).sum()
    (grad,) = torch.autograd.grad(log_post, w)
    assert float(grad.abs().max()) < 1e-3  # a Newton step from there would gain under 1e-8 nats
    passes = []
    original = kernel._likelihood_derivatives
    monkeypatch.setattr(kernel, "_likelihood_derivatives", lambda *a, **k: passes.append(1) or original(*a, **k))
    kernel.restrict(SUBSET, {"w": mode})
    assert len(passes) == 1 and torch.allclose(kernel._cv_point, mode, atol=1e-9)
    passes.clear()
    kernel.restrict(SUBSET, {"w": mode + 0.3})  # several posterior sds away
    assert 2 <= len(passes) <= 8 and torch.allclose(kernel._cv_point, mode, atol=1e-4)
