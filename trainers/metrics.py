"""Validation metrics of a block proposal ``q(B | C, Psi)`` against the exact conditional ``p``.

All functions take the proposal distribution returned by
:class:`~neuralblock.proposals.NeuralBlockProposal` (a batch of ``B`` instances) and
return per-instance values, so callers can average or inspect them.

* :func:`expected_nll`: ``E_p[-log q(x)]`` (exact over enumerated values) or the sample NLL.
* :func:`exact_kl`: ``KL(p || q)`` for enumerable blocks.
* :func:`expected_acceptance`: acceptance rate of ``q`` used as an *independence* MH block
  proposal whose current state is drawn from ``p``:
  ``E_{x~p, x'~q}[min(1, p(x') q(x) / (p(x) q(x')))]``. Exact by a sum over the
  ``K x K`` value pairs, which equals ``sum_{x, x'} min(p(x) q(x'), p(x') q(x))``.
* :func:`mc_acceptance`: the same rate estimated by Monte Carlo with an (unnormalized)
  log-density callable, for blocks that cannot be enumerated.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch
    >>> from neuralblock.proposals import MixtureDensityNetwork
    >>> from neuralblock.motif import BlockSpec
    >>> values = BlockSpec([2, 2]).enumerate()
    >>> q = MixtureDensityNetwork(3, [2, 2], components=2, hidden=(8,))(torch.zeros(5, 3))
    >>> log_q = enumerated_log_q(q, values)
    >>> bool(torch.allclose(exact_kl(log_q, log_q), torch.zeros(5), atol=1e-6))
    True
    >>> bool(torch.allclose(expected_acceptance(log_q, log_q), torch.ones(5)))
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributions import Distribution

__all__ = ["enumerated_log_q", "exact_kl", "expected_acceptance", "expected_nll", "mc_acceptance"]


def enumerated_log_q(q: Distribution, values: Tensor) -> Tensor:
    """``log q`` of every enumerated block value for every instance.

    Args:
        q: proposal with batch shape ``[B]`` and event shape ``[b]``.
        values: ``[K, b]`` enumerated block values (:meth:`BlockSpec.enumerate`).

    Returns:
        ``[B, K]`` log-probabilities.
    """
    batch = q.batch_shape
    expanded = values.reshape(values.shape[0], *([1] * len(batch)), values.shape[-1])
    expanded = expanded.expand(values.shape[0], *batch, values.shape[-1])
    return q.log_prob(expanded).movedim(0, -1)


def expected_nll(log_q: Tensor, log_p: Tensor) -> Tensor:
    """Exact ``E_p[-log q]`` per instance from ``[B, K]`` log-probabilities.

    Values with ``p = 0`` contribute nothing, even where ``q = 0``.
    """
    p = log_p.exp()
    return -(p * log_q.masked_fill(p == 0, 0.0)).sum(-1)


def exact_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Exact ``KL(p || q)`` per instance from ``[B, K]`` log-probabilities.

    Example:
        >>> p = torch.tensor([[0.5, 0.5]]).log(); q = torch.tensor([[0.25, 0.75]]).log()
        >>> round(float(exact_kl(p, q)), 4)
        0.1438
    """
    p = log_p.exp()
    diff = (log_p - log_q).masked_fill(p == 0, 0.0)
    return (p * diff).sum(-1)


def expected_acceptance(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Exact independence-MH acceptance rate per instance from ``[B, K]`` log-probabilities.

    Computes ``sum_{x, x'} min(p(x) q(x'), p(x') q(x))``, which equals
    ``E_{x~p, x'~q}[min(1, p(x') q(x) / (p(x) q(x')))]`` without dividing by zero, in
    ``O(K log K)``: with the values sorted by the ratio ``w = p / q``, the pair term is
    ``p_i q_j`` for ``i`` before ``j``, so the sum is ``sum_i p_i (q_i + 2 sum_{j > i} q_j)``.

    Example:
        >>> p = torch.tensor([[0.5, 0.5]]).log(); q = torch.tensor([[1.0, 0.0]]).log()
        >>> float(expected_acceptance(p, q))
        0.5
    """
    p, q = log_p.exp(), log_q.exp()
    ratio = torch.where(p > 0, log_p - log_q, torch.full_like(log_p, -float("inf")))  # log w, +inf where q = 0
    order = torch.argsort(ratio, dim=-1)
    p_sorted, q_sorted = p.gather(-1, order), q.gather(-1, order)
    tail = q_sorted.flip(-1).cumsum(-1).flip(-1) - q_sorted  # sum_{j > i} q_j
    return (p_sorted * (q_sorted + 2 * tail)).sum(-1)


def mc_acceptance(
    q: Distribution,
    current: Tensor,
    log_p_fn: Callable[[Tensor], Tensor],
    num_samples: int = 16,
) -> Tensor:
    """Monte Carlo independence-MH acceptance rate per instance.

    Draws ``num_samples`` proposals ``x' ~ q`` (torch's global RNG; wrap the call in
    :func:`torch.random.fork_rng` to keep the caller's stream untouched) and averages
    ``min(1, p(x') q(x) / (p(x) q(x')))`` with ``x = current`` drawn from ``p``.
    Non-finite log ratios count as rejections.

    Args:
        q: proposal with batch shape ``[B]``.
        current: ``[B, b]`` block values drawn from the exact conditional.
        log_p_fn: ``values [S, B, b] -> [S, B]`` (possibly unnormalized) conditional log-density.
        num_samples: proposals per instance.

    Returns:
        ``[B]`` estimated acceptance rates.
    """
    proposed = q.sample((num_samples,))  # [S, B, b]
    current = current.to(proposed.dtype)
    log_p_new = log_p_fn(proposed)
    log_p_old = log_p_fn(current.unsqueeze(0))
    log_ratio = log_p_new + q.log_prob(current).unsqueeze(0) - log_p_old - q.log_prob(proposed)
    log_ratio = torch.nan_to_num(log_ratio, nan=-float("inf"), posinf=-float("inf"))
    return log_ratio.clamp(max=0.0).exp().mean(0)
