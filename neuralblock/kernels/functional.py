"""The functional core of our kernels: pure proposal and acceptance functions.

Each function takes tensors and returns tensors plus a NamedTuple ``Info``
record, and draws randomness from torch's global RNG (so ``pyro.set_rng_seed``
reproduces a run). The stateful :mod:`pyro` kernels are thin shells around them.

Example:
    >>> import torch
    >>> info = mh_accept(torch.tensor([0.0, -float("inf"), float("nan")]))
    >>> info.accepted.tolist(), info.num_nonfinite
    ([True, False, False], 1)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.distributions import Transform

from neuralblock.exact.chain import gumbel_max

__all__ = [
    "GibbsInfo",
    "MHInfo",
    "gibbs_sample",
    "mh_accept",
    "mh_decide",
    "nonfinite_ratios",
    "random_walk_propose",
    "speculative_width",
    "use_numpy",
]


class MHInfo(NamedTuple):
    """Outcome of a batch of Metropolis-Hastings tests.

    Attributes:
        accepted: ``BoolTensor``, one entry per proposal.
        accept_prob: ``min(1, exp(log_alpha))`` (0 where ``log_alpha`` is NaN).
        num_nonfinite: proposals rejected because ``log_alpha`` was NaN or ``+inf`` (an ``int`` from
            :func:`mh_accept`, a 0-dim tensor from :func:`mh_decide`).
    """

    accepted: Tensor
    accept_prob: Tensor
    num_nonfinite: int | Tensor


class GibbsInfo(NamedTuple):
    """Outcome of a batch of Gibbs draws.

    Attributes:
        values: the drawn values.
        num_stuck: conditionals with no finite mass (the value was kept), a 0-dim tensor.
    """

    values: Tensor
    num_stuck: Tensor


def mh_accept(log_alpha: Tensor, log_u: Tensor | None = None) -> MHInfo:
    """Vectorized MH accept test; a non-finite ratio is a counted rejection.

    ``-inf`` is an ordinary certain rejection; ``NaN`` and ``+inf`` (which arise
    from a current state of zero density or a broken density) are rejected and
    counted in ``num_nonfinite``.

    Args:
        log_alpha: log acceptance ratios, any shape.
        log_u: optional ``log`` of uniform draws shaped like ``log_alpha`` (default: fresh ones).

    Returns:
        An :class:`MHInfo`.
    """
    info = mh_decide(log_alpha, torch.rand_like(log_alpha).log() if log_u is None else log_u)
    return MHInfo(info.accepted, info.accept_prob, int(info.num_nonfinite))


def mh_decide(log_alpha: Tensor, log_u: Tensor) -> MHInfo:
    """:func:`mh_accept` with given uniforms, all in tensors (``num_nonfinite`` a 0-dim tensor): recordable.

    Example:
        >>> info = mh_decide(torch.tensor([-1.0, float("nan")]), torch.tensor([-2.0, -2.0]))
        >>> info.accepted.tolist(), int(info.num_nonfinite)
        ([True, False], 1)
    """
    bad = nonfinite_ratios(log_alpha)
    safe = torch.where(bad, torch.full_like(log_alpha, -float("inf")), log_alpha)
    return MHInfo(log_u < safe, safe.clamp(max=0.0).exp(), bad.sum())


def nonfinite_ratios(log_alpha: Tensor) -> Tensor:
    """Where an MH log ratio is broken (NaN or ``+inf``): :func:`mh_accept` rejects and counts these.

    Example:
        >>> nonfinite_ratios(torch.tensor([0.0, -float("inf"), float("inf")])).tolist()
        [False, False, True]
    """
    return torch.isnan(log_alpha) | (log_alpha == float("inf"))


def gibbs_sample(logits: Tensor, current: Tensor, noise: Tensor | None = None) -> GibbsInfo:
    """Draw one value per row of ``logits [..., k]`` by the Gumbel-max trick.

    Rows with no finite logit keep ``current`` and are counted.

    Args:
        logits: unnormalized log conditionals ``[..., k]`` (``-inf`` marks impossible values).
        current: the current values ``[...]``, kept where a row has no mass.
        noise: optional standard exponential draws shaped like ``logits`` (default: fresh ones).

    Example:
        >>> gibbs_sample(torch.tensor([[0.0, -float("inf")]]), torch.tensor([1.0])).values
        tensor([0.])
    """
    scores = logits.nan_to_num(nan=-float("inf"), posinf=float("inf"), neginf=-float("inf"))
    exponential = torch.empty_like(scores).exponential_() if noise is None else noise
    best, draw = gumbel_max(scores, -exponential.log())  # -log E ~ Gumbel(0, 1) for E ~ Exp(1)
    stuck = ~torch.isfinite(best)
    values = torch.where(stuck, current, draw.to(current.dtype))
    return GibbsInfo(values, stuck.sum())


def random_walk_propose(
    value: Tensor, step_size: Tensor, transform: Transform, noise: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Gaussian random walk in the unconstrained space of ``transform``.

    The walk is symmetric in the unconstrained coordinates, so the proposal
    correction is the log-Jacobian change of ``transform`` only.

    Args:
        value: current constrained values.
        step_size: standard deviation of the unconstrained step (broadcasts with ``value``).
        transform: bijection from unconstrained reals onto the support.
        noise: optional standard normal draws shaped like ``value`` (default: fresh ones).

    Returns:
        ``(proposed, log_q_correction)`` with ``log_q_correction = log q(x | x') - log q(x' | x)``
        expressed as densities on the constrained space.

    Example:
        >>> from torch.distributions import transforms
        >>> x, corr = random_walk_propose(torch.ones(3), torch.tensor(0.1), transforms.ExpTransform())
        >>> bool((x > 0).all())
        True
    """
    y = transform.inv(value)
    y_new = y + step_size * (torch.randn_like(y) if noise is None else noise)
    proposed = transform(y_new)
    correction = transform.log_abs_det_jacobian(y_new, proposed) - transform.log_abs_det_jacobian(y, value)
    return proposed, correction


def speculative_width(rate: float, cap: int, class_cost: float = 0.25) -> int:
    """Classes per speculative batch that minimise the expected cost per class decided.

    A batch of ``w`` classes costs ``1 + class_cost * w`` (a fixed part, the network call and
    bookkeeping, plus a part per class) and decides the classes up to the first one with an
    accepted block: ``(1 - (1 - rate)^w) / rate`` of them in expectation, when a class accepts
    with probability ``rate``. The cost per decided class is unimodal in ``w``: the search
    stops at its minimum (one class when most classes accept; about ``√(2 / (class_cost ·
    rate))`` when few do).

    Args:
        rate: recent fraction of classes with an accepted block (clamped to ``[1e-3, 1]``).
        cap: the largest width allowed.
        class_cost: the per-class cost relative to the fixed cost of a batch.

    Example:
        >>> speculative_width(0.99, 50), speculative_width(0.01, 50), speculative_width(0.01, 4)
        (1, 27, 4)
    """
    rate = min(max(rate, 1e-3), 1.0)
    keep = 1.0 - rate
    best, best_cost = 1, 1.0 + class_cost
    for width in range(2, cap + 1):
        cost = (1.0 + class_cost * width) * rate / (1.0 - keep**width)
        if cost >= best_cost:
            break
        best, best_cost = width, cost
    return best


_NUMPY_DTYPES = (torch.float32, torch.float64)


def use_numpy(setting: bool | None, state: Tensor, max_entries: int) -> bool:
    """Whether an eager update of ``state`` runs its NumPy function: ``setting``, or by size when it is ``None``.

    NumPy's calls cost a fraction of torch's dispatch, but its gathers are slower on large
    arrays, and in this project's measurements torch ops run slower just after NumPy work; so
    the automatic rule takes NumPy for CPU states of at most ``max_entries`` entries (a
    kernel's measured break-even). Only float32 and float64 CPU states without autograd qualify
    (NumPy has no bfloat16).

    Example:
        >>> use_numpy(None, torch.zeros(4, 100), 1024), use_numpy(None, torch.zeros(32, 100), 1024)
        (True, False)
        >>> use_numpy(True, torch.zeros(32, 100), 1024), use_numpy(False, torch.zeros(1, 10), 1024)
        (True, False)
        >>> use_numpy(True, torch.zeros(1, 10, dtype=torch.bfloat16), 1024)
        False
    """
    if state.device.type != "cpu" or state.requires_grad or state.dtype not in _NUMPY_DTYPES or setting is False:
        return False
    return setting is True or state.numel() <= max_entries
