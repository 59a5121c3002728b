"""AusterityMH.restrict: one kernel over a changing part of the plate (e.g. each cluster's expert in a mixture)."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.stats import effective_sample_size

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
    ("epsilon", "control_variate"),
    [(0.0, "mode"), (0.1, "mode"), (0.1, None), (0.1, {"w": W_TRUE})],
    ids=["exact", "mode", "no-cv", "given-cv"],
)
def test_a_restricted_kernel_makes_the_draws_of_a_kernel_on_the_subset(epsilon: float, control_variate) -> None:
    """Restricting a kernel on all the data to ``S`` gives the chain of a kernel set up on the data of ``S``."""
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
    assert abs(float(chain.std()) / post_sd - 1.0) < 4.0 * math.sqrt(2.0 / ess) + 0.05, (float(chain.std()), post_sd)
    assert kernel.diagnostics()["data_fraction"] < 0.9  # decided on mini-batches of the half


def test_restrict_refuses_bad_sections_and_changes_nothing() -> None:
    kernel = AusterityMH(logistic, normality_check=False)
    with pytest.raises(RuntimeError, match="setup"):
        kernel.restrict(SUBSET)
    kernel = _kernel(logistic, X, Y, epsilon=0.0)
    kernel.restrict(SUBSET)
    bad = [
        (SUBSET.double(), TypeError, "integer tensor"),
        (torch.ones(N, dtype=torch.bool), TypeError, "mask"),
        ([1, 2, 3], TypeError, "integer tensor"),
        (SUBSET.reshape(2, -1), ValueError, "1-D"),
        (torch.tensor([], dtype=torch.long), ValueError, "non-empty"),
        (torch.tensor([0, N]), ValueError, f"0..{N - 1}"),
        (torch.tensor([-1, 2]), ValueError, f"0..{N - 1}"),
        (torch.tensor([3, 5, 3]), ValueError, "repeat"),
    ]
    for sections, error, message in bad:
        with pytest.raises(error, match=message):
            kernel.restrict(sections)
    with pytest.raises(ValueError, match="3x3"):
        kernel.restrict(torch.arange(10), proposal_scale=torch.eye(2))
    with pytest.raises(ValueError, match="step_size"):
        kernel.restrict(torch.arange(10), step_size=0.0)
    assert kernel.num_sections == len(SUBSET)
    assert torch.equal(kernel._subset, SUBSET)
