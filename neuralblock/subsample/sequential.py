"""The sequential t-test of austerity MH, as a pure function of a stream of log-ratios.

Korattikara, Chen and Welling (2014) write the MH test ``log u < log p(θ') - log p(θ) + ...``
as a comparison of a population mean with a threshold,

    accept  ⇔  μ = (1/N) Σ_i l_i  >  μ0,   l_i = log p(x_i | θ') - log p(x_i | θ),
    μ0 = (1/N) [log u + log ρ(θ) - log ρ(θ') + log q(θ' | θ) - log q(θ | θ')],

and decide it from mini-batches of sections drawn without replacement: after ``n`` draws,
``t = (l̄ - μ0) / s`` with ``s = s_l / √n · √(1 - (n - 1)/(N - 1))`` (finite population
correction). The test stops as soon as the probability of deciding the wrong side,
``δ = 1 - F_{n-1}(|t|)`` (Student-t tail), falls below ``ε``; with ``n = N`` the decision is
exact, so ``ε = 0`` is exact MH. A zero sample standard deviation draws more instead of
deciding.

References:
    Korattikara, Chen, Welling. "Austerity in MCMC Land: Cutting the Metropolis-Hastings
    Budget", ICML 2014 (Algorithm 1).

Example:
    >>> import torch
    >>> l = torch.full((1000,), 0.01) + 0.001 * torch.randn(1000)
    >>> info = sequential_test(stream_from(l), mu0=0.0, num_sections=1000, batch_size=50, epsilon=0.05)
    >>> info.accept, info.n_used < 1000
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["SequentialTestInfo", "austerity_decision", "sequential_test", "stream_from", "student_t_sf"]

_CF_MAX_ITER = 300
_CF_TINY = 1e-300
_EXACT_T_MAX_DOF = 200


class SequentialTestInfo(NamedTuple):
    """Outcome of one sequential accept test.

    Attributes:
        accept: the decision.
        decided_early: whether it stopped before seeing all ``N`` sections.
        n_used: number of sections evaluated.
        stages: number of mini-batches drawn.
        error_bound: the test's error probability ``δ`` at the decision (0 when exact).
        mean: the sample mean ``l̄`` at the decision.
        nonfinite: whether the decision was a rejection forced by a NaN / ``+inf`` value.
    """

    accept: bool
    decided_early: bool
    n_used: int
    stages: int
    error_bound: float
    mean: float
    nonfinite: bool


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_sf(t: float, dof: float) -> float:
    """Upper tail ``P(T > t)`` of Student's t with ``dof`` degrees of freedom.

    Exact (incomplete beta) up to 200 degrees of freedom; beyond, the normal tail of
    the Cornish-Fisher-corrected statistic ``t (1 - 1/(4ν)) / √(1 + t²/(2ν))``, whose
    error is far below any ε a user would pick.

    Example:
        >>> round(student_t_sf(2.0, 5), 4), round(student_t_sf(0.0, 3), 4)
        (0.051, 0.5)
    """
    if not dof > 0:
        raise ValueError(f"dof must be positive, got {dof}")
    if math.isnan(t):
        return float("nan")
    if dof > _EXACT_T_MAX_DOF:
        z = t * (1.0 - 0.25 / dof) / math.sqrt(1.0 + t * t / (2.0 * dof))
        return 0.5 * math.erfc(z / math.sqrt(2.0))
    tail = 0.5 * _betainc(0.5 * dof, 0.5, dof / (dof + t * t)) if math.isfinite(t) else 0.0
    return tail if t >= 0 else 1.0 - tail


def stream_from(values: Tensor, generator: torch.Generator | None = None) -> Callable[[int], Tensor]:
    """A ``draw(k)`` callable that returns successive mini-batches of a random permutation of ``values``.

    Used to run :func:`sequential_test` on a given set ``{l_i}`` (tests, studies).

    Example:
        >>> draw = stream_from(torch.arange(4.0))
        >>> sorted(torch.cat([draw(2), draw(2)]).tolist())
        [0.0, 1.0, 2.0, 3.0]
    """
    order = values[torch.randperm(values.numel(), generator=generator)]
    position = 0

    def draw(k: int) -> Tensor:
        nonlocal position
        out = order[position : position + k]
        position += k
        return out

    return draw


def austerity_decision(mean: float, sd: float, n: int, num_sections: int, mu0: float) -> tuple[float, float]:
    """The t statistic and error probability of one stage (finite population correction included).

    Args:
        mean: sample mean ``l̄`` of the ``n`` drawn log-ratios.
        sd: their sample standard deviation ``s_l`` (``n - 1`` denominator).
        n: number drawn so far (``2 <= n < N``).
        num_sections: population size ``N``.
        mu0: the threshold.

    Returns:
        ``(t, δ)``; ``δ = 1 - F_{n-1}(|t|)`` is the probability that the sign of ``l̄ - μ0``
        is wrong (``nan`` when ``sd == 0``, which the caller treats as "draw more").

    Example:
        >>> t, delta = austerity_decision(0.1, 1.0, 100, 10_000, 0.0)
        >>> round(t, 3), delta < 0.2
        (1.005, True)
    """
    if not sd > 0:
        return float("nan"), float("nan")
    fpc = math.sqrt(max(1.0 - (n - 1) / (num_sections - 1), 0.0))
    se = sd / math.sqrt(n) * fpc
    if se == 0.0:
        return float("nan"), float("nan")
    t = (mean - mu0) / se
    return t, student_t_sf(abs(t), n - 1)


def sequential_test(
    draw: Callable[[int], Tensor],
    mu0: float,
    num_sections: int,
    batch_size: int,
    epsilon: float,
    first_batch_size: int | None = None,
    growth: float = 1.0,
) -> SequentialTestInfo:
    """Decide ``mean(l) > mu0`` from mini-batches of ``l`` drawn without replacement.

    Args:
        draw: ``draw(k)`` returns the next ``k`` values ``l_i`` (fresh sections, without
            replacement); called at most until ``N`` values are drawn in total.
        mu0: the threshold ``μ0`` (``+inf`` rejects, ``-inf`` or NaN rejects as non-finite).
        num_sections: the population size ``N``.
        batch_size: mini-batch size ``m``.
        epsilon: error tolerance ``ε`` in ``[0, 0.5)``; 0 uses all ``N`` (exact MH).
        first_batch_size: size of the first mini-batch (default ``batch_size``).
        growth: each later mini-batch is ``growth`` times the previous one (``batch_size``,
            ``⌈growth · batch_size⌉``, ...); 1 keeps them all at ``batch_size``. Geometric
            growth bounds the number of stages (each one a model run) by
            ``O(log(N / batch_size))`` and makes fewer looks at the data, so the test's total
            error stays closer to ``epsilon``.

    Returns:
        A :class:`SequentialTestInfo`.

    Example:
        >>> l = torch.randn(500) * 0.1 + 0.02
        >>> exact = sequential_test(stream_from(l), 0.0, 500, 50, 0.0)
        >>> exact.accept == bool(l.double().mean() > 0), exact.n_used
        (True, 500)
    """
    if not 0.0 <= epsilon < 0.5:
        raise ValueError(f"epsilon must be in [0, 0.5), got {epsilon}")
    if batch_size < 1 or num_sections < 1:
        raise ValueError(f"batch_size and num_sections must be positive, got {batch_size}, {num_sections}")
    if not growth >= 1.0:
        raise ValueError(f"growth must be >= 1, got {growth}")
    if math.isnan(mu0) or mu0 == -math.inf:
        return SequentialTestInfo(False, False, 0, 0, 0.0, float("nan"), True)
    if mu0 == math.inf:
        return SequentialTestInfo(False, True, 0, 0, 0.0, float("nan"), False)
    n, stages, mean, m2 = 0, 0, 0.0, 0.0
    k = first_batch_size or batch_size
    while True:
        k = min(k, num_sections - n)
        values = draw(k).detach().to(torch.float64).reshape(-1)
        if values.numel() != k:
            raise ValueError(f"draw({k}) returned {values.numel()} values")
        stages += 1
        # Chan et al.'s pairwise update of the running mean and sum of squared deviations (one host sync)
        b_var, b_mean = torch.var_mean(values, correction=0)
        b_var, b_mean = torch.stack([b_var, b_mean]).tolist()
        b_m2 = b_var * k
        if not (math.isfinite(b_mean) and math.isfinite(b_m2)) and not bool(torch.isfinite(values).all()):
            broken = bool((torch.isnan(values) | (values == math.inf)).any())
            return SequentialTestInfo(False, n + k < num_sections, n + k, stages, 0.0, float("nan"), broken)
        total = n + k
        delta_mean = b_mean - mean
        mean += delta_mean * k / total
        m2 += b_m2 + delta_mean * delta_mean * n * k / total
        n = total
        if n >= num_sections:
            return SequentialTestInfo(mean > mu0, False, n, stages, 0.0, mean, False)
        if epsilon > 0 and n > 1:
            _, err = austerity_decision(mean, math.sqrt(max(m2, 0.0) / (n - 1)), n, num_sections, mu0)
            if err < epsilon:  # False for NaN (zero sd): draw more
                return SequentialTestInfo(mean > mu0, True, n, stages, err, mean, False)
        k = int(math.ceil(min(batch_size * growth**stages, num_sections) - 1e-9))
