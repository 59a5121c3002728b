"""Power tests of the Frank-Wolfe coreset solver against closed forms and scipy's NNLS (issue 25).

``tests/test_coresets.py`` checks that the errors never increase, which cannot fail (the solver stores the
running minimum). Here each Frank-Wolfe iteration is replayed by an independent dense reference written from
Campbell & Broderick (2019, Algorithm 2): the vertex ``(σ/σ_f) e_f`` best aligned with the residual, and the exact
line search ``γ = argmin_{[0, 1]} ||L - L(w) - γ d||``, the latter also found numerically (golden section, no
formula). Weights and errors must agree to 1e-8 at every iteration count; a line search whose denominator loses
its factor 2 (``||d||^2 = σ^2 - 2 σ_f⟨f_f, L(w)⟩ + ||L(w)||^2``) moves the weights by O(1). The fully corrective
step and ``nnls_gram`` are compared with ``scipy.optimize.nnls``. All checks are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize

from neuralblock.coresets.solvers import FrankWolfe, coreset_error, frank_wolfe, nnls_gram


def reference_frank_wolfe(features: np.ndarray, iterations: int) -> tuple[np.ndarray, list[float]]:
    """Dense float64 Frank-Wolfe on ``{w >= 0, Σ σ_n w_n = σ}`` with exact line search (the paper's Algorithm 2)."""
    norms = np.linalg.norm(features, axis=1)
    sigma, total = norms.sum(), features.sum(0)
    weights, errors = np.zeros(len(features)), []
    for it in range(iterations):
        residual = total - weights @ features
        f = int(np.argmax(features @ residual / norms))
        vertex = np.zeros(len(features))
        vertex[f] = sigma / norms[f]
        if it == 0:
            gamma = 1.0
        else:
            d = vertex @ features - weights @ features
            gamma = float(np.clip(d @ residual / (d @ d), 0.0, 1.0)) if d @ d > 0 else 0.0
        weights = (1 - gamma) * weights + gamma * vertex
        errors.append(float(np.linalg.norm(total - weights @ features)))
    return weights, errors


def problem(seed: int, n: int = 15, dims: int = 6) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # correlated, unequal-norm rows (as projected log-likelihoods are), float64
    mix = torch.randn(dims, dims, generator=generator, dtype=torch.float64)
    scale = torch.exp(torch.randn(n, 1, generator=generator, dtype=torch.float64))
    return scale * (torch.randn(n, dims, generator=generator, dtype=torch.float64) @ mix) + 0.5


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_frank_wolfe_iterates_match_the_dense_reference(seed: int) -> None:
    features = problem(seed)
    ref_weights, ref_errors = reference_frank_wolfe(features.numpy(), 10)
    for size in range(1, 11):
        result = frank_wolfe(features, size)
        weights, errors = reference_frank_wolfe(features.numpy(), size)
        np.testing.assert_allclose(result.errors.numpy(), errors, rtol=1e-8, atol=1e-10)
        if errors[-1] < min(errors[:-1], default=np.inf):  # the best iterate is the last one
            np.testing.assert_allclose(result.weights.numpy(), weights, rtol=1e-8, atol=1e-10)
    assert ref_errors[-1] < 0.9 * ref_errors[0]  # the problems are ones where the steps matter


def test_line_search_step_is_the_minimiser_of_the_error_along_the_segment() -> None:
    # Two iterations: w2 = (1 - γ) v1 + γ v2 for vertices v1, v2; γ must minimise ||L - L(w)|| on [0, 1],
    # found here by bounded golden-section search on the error itself (no closed form used).
    for seed in range(6):
        features = problem(seed + 10)
        one, two = frank_wolfe(features, 1).weights, frank_wolfe(features, 2).weights
        f1 = int(torch.nonzero(one).squeeze())
        new = [j for j in torch.nonzero(two).squeeze(1).tolist() if j != f1]
        assert len(new) == 1, "the second iteration picks a new vertex on these problems"
        norms = features.norm(dim=1)
        v2 = torch.zeros_like(one)
        v2[new[0]] = norms.sum() / norms[new[0]]

        def error(gamma: float, v1: torch.Tensor = one, v2: torch.Tensor = v2, features: torch.Tensor = features):
            return coreset_error(features, (1 - gamma) * v1 + gamma * v2)

        best = optimize.minimize_scalar(error, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-10})
        gamma = float(two[new[0]] / v2[new[0]])
        assert gamma == pytest.approx(best.x, abs=1e-6), (seed, gamma, best.x)
        assert float(two[f1]) == pytest.approx((1 - gamma) * float(one[f1]), rel=1e-9)
        assert coreset_error(features, two) == pytest.approx(best.fun, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_nnls_gram_matches_scipy(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(6, 9, generator=generator, dtype=torch.float64)  # 6 points in 9 dims: a unique solution
    target = torch.randn(9, generator=generator, dtype=torch.float64) + rows[:2].sum(0)
    ours = nnls_gram(rows @ rows.T, rows @ target)
    theirs, _ = optimize.nnls(rows.T.numpy(), target.numpy())
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-9)
    assert bool((ours == 0).any()) or seed > 2  # most draws have active constraints


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fully_corrective_frank_wolfe_refits_its_support_as_scipy_nnls(seed: int) -> None:
    features = problem(seed + 20, n=30, dims=12)
    total = features.sum(0).numpy()
    plain = frank_wolfe(features, 6)
    refined = FrankWolfe(refine_every=6).solve(features, 30, 6, None)
    support = torch.nonzero(refined > 0).squeeze(1)
    assert set(support.tolist()) <= set(torch.nonzero(plain.weights > 0).squeeze(1).tolist())
    # scipy's NNLS over the plain iterate's support: the refit must reach its optimum
    plain_support = torch.nonzero(plain.weights > 0).squeeze(1)
    weights, residual = optimize.nnls(features[plain_support].numpy().T, total)
    assert coreset_error(features, refined) == pytest.approx(residual, rel=1e-7, abs=1e-9)
    expected = np.zeros(30)
    expected[plain_support.numpy()] = weights
    np.testing.assert_allclose(refined.numpy(), expected, rtol=1e-6, atol=1e-8)
    assert coreset_error(features, refined) < plain.errors[-1] - 1e-6  # the refit matters on these problems
