"""Power tests of austerity's sequential t-test against hand-computed references (issue 25).

The references here are written from the paper's formulas (Korattikara et al. 2014, Algorithm 1) with
scipy's Student-t tail, not from the code under test:

    t = (l̄ - μ0) / (s_l / √n · √(1 - (n - 1)/(N - 1))),   δ = 1 - F_{n-1}(|t|).

Deterministic checks compare the statistic, its error probability and the stopping stage with those values.
The statistical check measures the test's error rate *from both sides*: a calibrated one-look test whose
population mean sits on the threshold errs at rate ``ε`` exactly (to the CLT's accuracy); a test that lost its
finite-population correction is too conservative (rate 0.117 instead of 0.2) and one that squared it too liberal
(0.276), both caught at more than 10 binomial standard deviations.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from neuralblock.subsample import austerity_decision, sequential_test, stream_from


def reference_decision(values: list[float], num_sections: int, mu0: float) -> tuple[float, float]:
    """``(t, δ)`` of the first ``len(values)`` sections, from the textbook formulas (float64, scipy tail)."""
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    fpc = math.sqrt(1.0 - (n - 1) / (num_sections - 1))
    t = (mean - mu0) / (sd / math.sqrt(n) * fpc)
    return t, float(stats.t.sf(abs(t), n - 1))


@pytest.mark.parametrize(
    ("mean", "sd", "n", "num_sections", "mu0"),
    [
        (0.1, 1.0, 100, 10_000, 0.0),  # FPC ~ 1: the plain t-test
        (0.05, 0.8, 150, 200, 0.01),  # FPC = 0.5: half the standard error
        (-0.02, 0.3, 990, 1000, 0.0),  # FPC ~ 0.1: nearly the whole population
        (0.3, 2.0, 5, 7, 0.1),  # tiny population, 4 degrees of freedom
        (0.01, 0.5, 400, 100_000, 0.02),  # dof > 200: the Cornish-Fisher branch
    ],
)
def test_decision_matches_the_hand_computed_statistic(
    mean: float, sd: float, n: int, num_sections: int, mu0: float
) -> None:
    fpc = math.sqrt(1.0 - (n - 1) / (num_sections - 1))
    expected_t = (mean - mu0) / (sd / math.sqrt(n) * fpc)
    t, delta = austerity_decision(mean, sd, n, num_sections, mu0)
    assert t == pytest.approx(expected_t, rel=1e-12)
    assert delta == pytest.approx(float(stats.t.sf(abs(expected_t), n - 1)), abs=2e-6)


def test_decision_by_hand_at_a_strong_finite_population_correction() -> None:
    # N = 5, n = 3: FPC = sqrt(1 - 2/4) = 1/sqrt(2); values 1, 2, 4 -> mean 7/3, sd sqrt(7/3)
    t, delta = austerity_decision(7 / 3, math.sqrt(7 / 3), 3, 5, 1.0)
    expected_t = (7 / 3 - 1.0) / (math.sqrt(7 / 3) / math.sqrt(3) / math.sqrt(2))
    assert t == pytest.approx(expected_t, rel=1e-12)  # 2.1381
    assert delta == pytest.approx(float(stats.t.sf(expected_t, 2)), abs=1e-7)
    t_neg, delta_neg = austerity_decision(-7 / 3 + 2.0, math.sqrt(7 / 3), 3, 5, 1.0)
    assert t_neg < 0 and delta_neg == pytest.approx(float(stats.t.sf(abs(t_neg), 2)), abs=1e-7)


def _ordered(values: torch.Tensor):
    """``draw(k)`` handing out ``values`` in their given order (no shuffling), recording the sizes asked."""
    position, sizes = 0, []

    def draw(k: int) -> torch.Tensor:
        nonlocal position
        sizes.append(k)
        out = values[position : position + k]
        position += k
        return out

    return draw, sizes


@pytest.mark.parametrize("growth", [1.0, 2.0])
def test_sequential_test_stops_where_the_hand_computed_error_first_falls_below_epsilon(growth: float) -> None:
    generator = torch.Generator().manual_seed(3)
    num_sections, batch, epsilon = 400, 20, 0.05
    for trial in range(40):
        values = (0.04 * trial / 40 + torch.randn(num_sections, generator=generator, dtype=torch.float64)).tolist()
        mu0 = 0.0
        # the reference: looks after each stage (sizes batch, batch*growth, ...), stop at the first delta < epsilon
        n, stage, expected = 0, 0, None
        while n < num_sections:
            k = min(int(math.ceil(batch * growth**stage - 1e-9)), num_sections - n)
            n, stage = n + k, stage + 1
            if n >= num_sections:
                expected = (math.fsum(values) / n > mu0, n, stage, 0.0)
                break
            t, delta = reference_decision(values[:n], num_sections, mu0)
            if delta < epsilon:
                expected = (t > 0, n, stage, delta)
                break
        draw, _ = _ordered(torch.tensor(values, dtype=torch.float64))
        info = sequential_test(draw, mu0, num_sections, batch, epsilon, growth=growth)
        assert expected is not None
        assert (info.accept, info.n_used, info.stages) == expected[:3], (trial, info, expected)
        assert info.error_bound == pytest.approx(expected[3], abs=2e-5)  # Cornish-Fisher tail past 200 dof
        assert info.mean == pytest.approx(math.fsum(values[: info.n_used]) / info.n_used, abs=1e-12)


def test_sequential_test_uses_the_correction_at_the_look() -> None:
    # 300 of 400 sections drawn: FPC = sqrt(1 - 299/399) = 0.50; the corrected |t| = 2.11 decides at epsilon 0.05
    # (delta 0.018), the uncorrected |t| = 1.06 would not (delta 0.145) and would draw the rest.
    values = torch.cat([torch.tensor([1.0, -1.0]).repeat(150) + 0.0612, torch.zeros(100)]).double()
    draw, sizes = _ordered(values)
    info = sequential_test(draw, 0.0, 400, 300, 0.05)
    t, delta = reference_decision(values[:300].tolist(), 400, 0.0)
    assert 2.0 < t < 2.3 and 0.01 < delta < 0.05
    assert info.decided_early and info.accept and info.n_used == 300 and sizes == [300]
    assert info.error_bound == pytest.approx(delta, abs=1e-6)


def _one_look_rates(fpc_sq: float, epsilon: float, reps: int, seed: int) -> tuple[float, float]:
    """Early wrong and early right decision rates of a one-look test whose population mean is on the threshold."""
    num_sections = 1000
    n = int(round(1 + (1 - fpc_sq) * (num_sections - 1)))  # the look's FPC^2 is fpc_sq
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(num_sections, generator=generator, dtype=torch.float64)
    values = (values - values.mean()) / values.std()
    mu0 = -1e-9  # the exact decision is "accept"; the population sits (to 1e-9) on the threshold
    wrong = right = 0
    for _ in range(reps):
        info = sequential_test(stream_from(values, generator), mu0, num_sections, n, epsilon)
        assert info.n_used in (n, num_sections)
        if info.decided_early:
            wrong += not info.accept
            right += info.accept
    return wrong / reps, right / reps


def test_one_look_error_rate_equals_epsilon_from_both_sides() -> None:
    # With the population mean on the threshold, t at the look is ~ N(0, 1) (the FPC makes the without-replacement
    # variance exact), so the look decides "reject" (wrong) with probability epsilon and "accept" with epsilon.
    # Binomial sd at reps 3000, eps 0.2: 0.0073; band +-0.035 (4.8 sd, plus the CLT's error of < 0.005 on 500
    # Gaussian draws): false-failure rate < 1e-5 per rate. Detected effects: no FPC (FPC^2 = 0.5) gives
    # Phi(-0.8416 / 0.707) = 0.117 (11 sd below); FPC applied twice gives Phi(-0.8416 * 0.707) = 0.276 (10 sd above).
    epsilon, reps = 0.2, 3000
    wrong, right = _one_look_rates(0.5, epsilon, reps, seed=7)
    assert abs(wrong - epsilon) < 0.035, wrong
    assert abs(right - epsilon) < 0.035, right


def test_error_rate_is_below_epsilon_away_from_the_threshold_and_the_test_decides() -> None:
    # Population mean 1 standard error (at the look) above the threshold: wrong early decisions happen with
    # probability Phi(-0.8416 - 1) = 0.033 at eps 0.2, right ones with Phi(1 - 0.8416) = 0.563.
    # reps 2000: sds 0.004 and 0.011; bands 5 sd. A test that never decides early (or decides at random) fails.
    num_sections, n, reps, epsilon = 1000, 500, 2000, 0.2
    generator = torch.Generator().manual_seed(11)
    values = torch.randn(num_sections, generator=generator, dtype=torch.float64)
    values = (values - values.mean()) / values.std()
    se = math.sqrt(1.0 / n * (1 - (n - 1) / (num_sections - 1)))
    mu0 = -1.0 * se
    wrong = right = 0
    for _ in range(reps):
        info = sequential_test(stream_from(values, generator), mu0, num_sections, n, epsilon)
        wrong += info.decided_early and not info.accept
        right += info.decided_early and info.accept
    expected_wrong = float(stats.norm.cdf(-stats.norm.ppf(1 - epsilon) - 1.0))
    expected_right = float(stats.norm.cdf(1.0 - stats.norm.ppf(1 - epsilon)))
    assert abs(wrong / reps - expected_wrong) < 5 * math.sqrt(expected_wrong * (1 - expected_wrong) / reps) + 0.005
    assert abs(right / reps - expected_right) < 5 * math.sqrt(expected_right * (1 - expected_right) / reps) + 0.01
