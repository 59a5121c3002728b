"""Power tests of ``batch_means_mcse``, the MCSE oracle of the statistical tests (issue 25).

Its reference is the known asymptotic variance of AR(1) chains: for ``x_t = φ x_{t-1} + e_t``, ``e_t ~ N(0, 1)``,
started stationary, ``n · Var(x̄) → 1 / (1 - φ)^2``. Over 200 replicate data sets the mean of ``mcse^2`` estimates
``Var(x̄)`` within about 1.2% (sd), so a band of +-8% fails by chance with probability < 1e-9 and catches an MCSE
off by a factor 1.05 (variance x1.10, 8 sd) or more; the planted 3x inflation (variance x9) is caught by hundreds of
sds. A deterministic hand-computed case pins the arithmetic (batch order, unbiased variance, pooling of chains).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import signal

from neuralblock.diagnostics import batch_means_mcse


def ar1_chains(phi: float, shape: tuple[int, ...], n: int, seed: int) -> torch.Tensor:
    """Stationary AR(1) chains ``[*shape, n]`` with unit innovations."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((*shape, n))
    noise[..., 0] /= math.sqrt(1 - phi**2)  # x_0 from the stationary law N(0, 1 / (1 - phi^2))
    return torch.from_numpy(signal.lfilter([1.0], [1.0, -phi], noise, axis=-1))


def test_hand_computed_batch_means() -> None:
    # two chains of 7 draws, 3 batches of 2 (the 7th draw is dropped): batch means 1.5, 3.5, 5.5 and 0, 1, 5
    draws = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0], [0.0, 0.0, 1.0, 1.0, 4.0, 6.0, -100.0]])
    means = [1.5, 3.5, 5.5, 0.0, 1.0, 5.0]
    grand = sum(means) / 6
    var = sum((m - grand) ** 2 for m in means) / 5
    mean, mcse = batch_means_mcse(draws, num_batches=3)
    assert float(mean) == pytest.approx(grand, rel=1e-12)
    assert float(mcse) == pytest.approx(math.sqrt(var / 6), rel=1e-12)
    # trailing dimensions are independent functions: the second one is 10x the first plus 1
    stacked = torch.stack([draws, 10 * draws + 1], -1)
    mean2, mcse2 = batch_means_mcse(stacked, num_batches=3)
    assert mean2.shape == (2,) and float(mean2[1]) == pytest.approx(10 * grand + 1, rel=1e-12)
    assert float(mcse2[1]) == pytest.approx(10 * math.sqrt(var / 6), rel=1e-12)


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.8])
def test_mcse_matches_the_ar1_asymptotic_variance(phi: float) -> None:
    reps, chains, n, batches = 200, 4, 4000, 20
    x = ar1_chains(phi, (reps, chains), n, seed=int(100 * phi) + 1)
    exact_var = 1.0 / (1.0 - phi) ** 2 / (chains * n)  # Var of the pooled mean, asymptotically
    # batches of b = 200 draws see a variance short by about 2 phi / (b (1 - phi^2)) (0.5% at phi = 0.5)
    bias = 1.0 - 2.0 * phi / ((n / batches) * (1 - phi**2))
    squares = []
    for r in range(reps):
        mean, mcse = batch_means_mcse(x[r], num_batches=batches)
        squares.append(float(mcse) ** 2)
    ratio = float(np.mean(squares)) / (exact_var * bias)
    # sd of the ratio: sqrt(2 / 79 / 200) = 1.1%: band +-8% is 7 sd (false-failure < 1e-9); detects x1.05 MCSE
    assert abs(ratio - 1.0) < 0.08, ratio


def test_mcse_gives_calibrated_z_scores_on_ar1_chains() -> None:
    # z = x̄ / mcse over 400 replicates (true mean 0) is close to t_79: its sd is 1.013, estimated within 3.6%;
    # the band [0.87, 1.15] fails by chance with probability < 1e-3 and catches an MCSE off by 25% either way
    # with probability > 0.95 (the main check is the variance ratio above; this one checks the pooled z-scores).
    x = ar1_chains(0.7, (400, 4), 2000, seed=5)
    z = []
    for r in range(400):
        mean, mcse = batch_means_mcse(x[r], num_batches=20)
        z.append(float(mean / mcse))
    sd = float(np.std(z))
    assert 0.87 < sd < 1.15, sd
