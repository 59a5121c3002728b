"""The sequential t-test, the without-replacement index sampler and lazy plate sections."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch

from neuralblock.subsample import (
    IndexSampler,
    SectionEvaluator,
    austerity_decision,
    sequential_test,
    stream_from,
    student_t_sf,
)


def test_student_t_tail_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for dof in (1, 2, 7, 30, 199, 201, 1000, 10**6):
        for t in (-3.0, -0.5, 0.0, 0.3, 1.0, 1.645, 2.5, 6.0):
            assert student_t_sf(t, dof) == pytest.approx(float(stats.t.sf(t, dof)), abs=1e-5)


def test_epsilon_zero_is_the_exact_decision() -> None:
    for _ in range(200):
        n = int(torch.randint(2, 400, ()))
        values = torch.randn(n) * float(torch.rand(()) * 3)
        mu0 = float(values.double().mean() + 0.05 * torch.randn(()))
        info = sequential_test(stream_from(values), mu0, n, 17, 0.0)
        assert info.accept == bool(values.double().mean() > mu0)
        assert info.n_used == n and not info.decided_early and info.error_bound == 0.0


def _error_rate(distance: float, epsilon: float, n: int, m: int, reps: int) -> tuple[float, float]:
    """Wrong decisions over ``reps`` random orders of a Gaussian set whose exact decision has z-score ``distance``."""
    values = torch.randn(n, dtype=torch.float64)
    values = (values - values.mean()) / values.std()
    mu0 = -distance / math.sqrt(n)  # the exact answer is "accept"
    wrong, used = 0, 0
    for _ in range(reps):
        info = sequential_test(stream_from(values), mu0, n, m, epsilon)
        wrong += not info.accept
        used += info.n_used
    return wrong / reps, used / (reps * n)


def test_decision_error_is_below_its_bound() -> None:
    # Each look errs with probability below epsilon, so the test errs at most (looks x epsilon)
    # (union bound); clear cases (exact z-score >= 3) err less than epsilon itself.
    # Binomial tolerance of 3.3 sd: false-failure rate below 0.1% per check.
    n, m, reps = 1000, 50, 200
    looks = math.ceil(n / m) - 1
    for epsilon in (0.05, 0.2):
        slack = 3.3 * math.sqrt(epsilon * (1 - epsilon) / reps)
        for distance in (0.7, 4.0):
            rate, fraction = _error_rate(distance, epsilon, n, m, reps)
            assert rate <= min(1.0, looks * epsilon) + slack
            if distance >= 3.0:
                assert rate <= epsilon + slack, (epsilon, distance, rate)
                assert fraction < 1.0  # and it decides before the end


def test_smaller_epsilon_gives_fewer_errors() -> None:
    loose, _ = _error_rate(0.7, 0.2, 1000, 50, 200)
    tight, _ = _error_rate(0.7, 0.01, 1000, 50, 200)
    assert tight < loose


def test_zero_spread_draws_more_instead_of_deciding() -> None:
    values = torch.full((300,), 0.25)
    info = sequential_test(stream_from(values), 0.2, 300, 10, 0.2)
    assert info.n_used == 300 and info.stages == 30 and info.accept
    assert math.isnan(austerity_decision(0.1, 0.0, 10, 300, 0.0)[1])


def test_nonfinite_values_reject() -> None:
    values = torch.zeros(100)
    values[3] = -float("inf")
    info = sequential_test(stream_from(values), -1.0, 100, 100, 0.05)
    assert not info.accept and not info.nonfinite
    values[5] = float("nan")
    info = sequential_test(stream_from(values), -1.0, 100, 100, 0.05)
    assert not info.accept and info.nonfinite
    assert sequential_test(stream_from(torch.zeros(4)), float("nan"), 4, 2, 0.05).nonfinite
    assert not sequential_test(stream_from(torch.zeros(4)), float("inf"), 4, 2, 0.05).accept


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        sequential_test(stream_from(torch.zeros(4)), 0.0, 4, 2, 0.7)
    with pytest.raises(ValueError, match="cannot draw"):
        IndexSampler(3).draw(4)
    with pytest.raises(ValueError, match="dof"):
        student_t_sf(1.0, 0)


def test_index_sampler_is_without_replacement_and_uniform() -> None:
    sampler = IndexSampler(1000)
    counts = torch.zeros(1000)
    for _ in range(400):
        sampler.reset()
        drawn = torch.cat([sampler.draw(30), sampler.draw(30), sampler.draw(5)])
        assert drawn.unique().numel() == 65
        counts[drawn[:30]] += 1
    # first-batch frequencies: chi-square with 999 dof, 4.5 sd above its mean fails (rate < 1e-5)
    expected = 400 * 30 / 1000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 999 + 4.5 * math.sqrt(2 * 999)
    sampler.reset()
    assert sorted(torch.cat([sampler.draw(600), sampler.draw(400)]).tolist()) == list(range(1000))


def _ordered_chi2(sequences: torch.Tensor, n: int) -> tuple[float, int]:
    """Chi-square of the counts of ordered tuples of distinct values in ``range(n)`` against uniform."""
    k = sequences.shape[1]
    codes = (sequences * n ** torch.arange(k - 1, -1, -1)).sum(1)
    cells = math.perm(n, k)
    counts = torch.bincount(codes, minlength=n**k).double()
    expected = sequences.shape[0] / cells
    chi2 = float(((counts[counts > 0] - expected) ** 2 / expected).sum()) + (cells - int((counts > 0).sum())) * expected
    return chi2, cells - 1


@pytest.mark.parametrize("size", [2, 4096, 4097, 10_000])
def test_repeat_check_on_either_side_of_the_set_threshold(size: int) -> None:
    from neuralblock.subsample.indices import _SET_CHECK_MAX, _has_repeats

    assert _SET_CHECK_MAX == 4096
    distinct = torch.randperm(3 * size)[:size]
    assert not _has_repeats(distinct)
    repeated = distinct.clone()
    repeated[-1] = repeated[0]
    assert _has_repeats(repeated)


def test_index_sampler_draws_every_ordered_sample_equally_often() -> None:
    # Every path: a first draw with repeated candidates (N=6, k=3 repeats with prob 0.44), a later
    # draw by rejection against the taken mask, and the listed remainder once half are taken.
    # Each chi-square fails 4.5 sd above its mean: false-failure rate about 1e-4 per check.
    torch.manual_seed(0)
    sampler = IndexSampler(6)
    firsts, orders = [], []
    for _ in range(3000):
        sampler.reset()
        firsts.append(sampler.draw(3))
        sampler.reset()
        order = torch.cat([sampler.draw(1), sampler.draw(2), sampler.draw(3)])
        assert sorted(order.tolist()) == list(range(6))
        orders.append(order[:4])
    for sequences in (torch.stack(firsts), torch.stack(orders)):
        chi2, dof = _ordered_chi2(sequences, 6)
        assert chi2 < dof + 4.5 * math.sqrt(2 * dof), (chi2, dof)


def test_index_sampler_reset_clears_only_what_it_drew() -> None:
    sampler = IndexSampler(10_000)
    for _ in range(20):
        sampler.reset()
        drawn = torch.cat([sampler.draw(100), sampler.draw(200), sampler.draw(400)])
        assert drawn.unique().numel() == 700 and sampler.remaining == 10_000 - 700
    sampler.reset()
    assert sampler._taken is not None and not bool(sampler._taken.any())
    rest = torch.cat([sampler.draw(4000), sampler.draw(6000)])  # the second lists the remainder
    assert sorted(rest.tolist()) == list(range(10_000))


Y = torch.arange(10.0)


def indexed_model(scale: float = 1.0) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 10) as idx:
        pyro.sample("y", dist.Normal(mu, scale), obs=Y[idx])


def full_data_model() -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 10):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=Y)


def test_sections_are_unscaled_and_lazy() -> None:
    values = {"mu": torch.tensor(0.5)}
    sections = SectionEvaluator(indexed_model, "data", 10)
    idx = torch.tensor([7, 2, 9, 0, 4])  # Pyro scales these by 10/5; the sections are unscaled
    assert sections.check_lazy(values)
    terms = sections.evaluate(values, idx)
    expected = dist.Normal(0.5, 1.0).log_prob(Y[idx])
    assert torch.allclose(terms.sections, expected)
    assert torch.allclose(terms.global_term, dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.5)))


def test_model_that_ignores_indices_falls_back_with_a_warning() -> None:
    sections = SectionEvaluator(full_data_model, "data", 10, direct=False)  # the Pyro path alone cannot re-index
    with pytest.warns(RuntimeWarning, match="not sublinear"):
        assert not sections.check_lazy({"mu": torch.tensor(0.0)})
    terms = sections.evaluate({"mu": torch.tensor(0.0)}, torch.tensor([3, 1]))
    assert torch.allclose(terms.sections, dist.Normal(0.0, 1.0).log_prob(Y[[3, 1]]))


def local_latent_model() -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 10) as idx:
        z = pyro.sample("z", dist.Normal(mu, 1.0))
        pyro.sample("y", dist.Normal(z, 1.0), obs=Y[idx])


def test_fixed_local_latent_is_indexed_by_the_sections() -> None:
    z = torch.linspace(-1, 1, 10)
    sections = SectionEvaluator(local_latent_model, "data", 10, local_dims={"z": -1})
    values = {"mu": torch.tensor(0.3), "z": z}
    assert sections.check_lazy(values)
    idx = torch.tensor([8, 1])
    expected = dist.Normal(0.3, 1.0).log_prob(z[idx]) + dist.Normal(z[idx], 1.0).log_prob(Y[idx])
    assert torch.allclose(sections.evaluate(values, idx).sections, expected)


def test_geometric_growth_draws_doubling_batches() -> None:
    sizes: list[int] = []
    values = torch.full((1000,), 0.25)  # zero spread: the test never decides early

    def draw(k: int) -> torch.Tensor:
        sizes.append(k)
        return values[:k]

    info = sequential_test(draw, 0.2, 1000, 50, 0.2, growth=2.0)
    assert sizes == [50, 100, 200, 400, 250] and info.stages == 5 and info.n_used == 1000
    with pytest.raises(ValueError, match="growth"):
        sequential_test(stream_from(values), 0.0, 1000, 50, 0.2, growth=0.5)


def test_growth_keeps_the_decision_error_below_its_bound() -> None:
    # clear case (exact z-score 4): errs less than epsilon; binomial 3.3-sd slack (false-failure rate < 0.1%)
    values = torch.randn(1000, dtype=torch.float64)
    values = (values - values.mean()) / values.std()
    mu0, reps, epsilon = -4.0 / math.sqrt(1000), 200, 0.05
    decisions = [sequential_test(stream_from(values), mu0, 1000, 50, epsilon, growth=2.0) for _ in range(reps)]
    wrong = sum(not info.accept for info in decisions)
    assert wrong / reps <= epsilon + 3.3 * math.sqrt(epsilon * (1 - epsilon) / reps)


RUNS = {"count": 0}


def counted_model(scale: float = 1.0) -> None:
    """Broadcasts a leading batch of (mu, s) values; counts its runs."""
    RUNS["count"] += 1
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", 10) as idx:
        pyro.sample("y", dist.Normal(mu, s * scale), obs=Y[idx])


def matmul_model() -> None:
    """``X[idx] @ w`` does not broadcast a leading batch of ``w``: evaluated one run per point."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", 10) as idx:
        pyro.sample("y", dist.Normal(torch.stack([Y, -Y], -1)[idx] @ w, 1.0), obs=Y[idx])


def test_evaluate_many_runs_once_and_matches_one_run_per_point() -> None:
    sections = SectionEvaluator(counted_model, "data", 10, direct=False)  # counts Pyro runs
    batch = {"mu": torch.tensor([0.0, 0.5, -1.0]), "s": torch.tensor([1.0, 2.0, 0.5])}
    assert sections.check_vectorized({}, batch)
    idx = torch.tensor([7, 2, 9])
    RUNS["count"] = 0
    many = sections.evaluate_many({}, batch, idx)
    assert RUNS["count"] == 1 and many.sections.shape == (3, 3) and many.global_term.shape == (3,)
    for p in range(3):
        one = sections.evaluate({"mu": batch["mu"][p], "s": batch["s"][p]}, idx)
        assert torch.allclose(many.sections[p], one.sections) and torch.allclose(many.global_term[p], one.global_term)
    evaluate = sections.bind_many({}, batch)
    assert evaluate(idx).global_term.ne(0).all() and evaluate(idx).global_term.eq(0).all()


def test_non_broadcasting_model_is_evaluated_per_point() -> None:
    sections = SectionEvaluator(matmul_model, "data", 10)
    batch = {"w": torch.tensor([[0.1, 0.2], [0.3, -0.4]])}
    assert not sections.check_vectorized({}, batch)
    idx = torch.tensor([1, 4])
    many = sections.evaluate_many({}, batch, idx)
    for p in range(2):
        assert torch.allclose(many.sections[p], sections.evaluate({"w": batch["w"][p]}, idx).sections)
    with pytest.raises(ValueError, match="leading points"):
        sections.evaluate_many({}, {"w": torch.tensor(0.0)}, idx)


def masked_scaled_model(mask: bool, scale: float) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 10) as idx, poutine.mask(mask=mask), poutine.scale(scale=scale):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=Y[idx])


def test_python_bool_masks_and_user_scales_inside_the_plate() -> None:
    values, idx = {"mu": torch.tensor(0.5)}, torch.tensor([7, 2])
    plain = dist.Normal(0.5, 1.0).log_prob(Y[idx])
    for mask, scale, expected in ((True, 1.0, plain), (False, 1.0, torch.zeros(2)), (True, 2.0, 2 * plain)):
        sections = SectionEvaluator(masked_scaled_model, "data", 10, args=(mask, scale))
        assert sections.check_lazy(values)
        assert torch.allclose(sections.evaluate(values, idx).sections, expected)
