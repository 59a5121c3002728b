"""Exact inference on linear chains: a padded batch of ``K``-state chains in log space.

A chain of length ``T`` has unary log-potentials ``unary[t, y_t]`` and one transition
log-potential matrix ``trans[y_{t-1}, y_t]`` shared by all edges; any start/end scores
are folded into the first/last valid unary. Chains of different lengths share one padded
``[B, T, K]`` tensor and a ``[B, T]`` prefix mask.

* :func:`chain_forward`: forward messages and ``log Z``;
* :func:`chain_backward`: backward messages;
* :func:`chain_marginals`: per-position marginals (forward-backward);
* :func:`chain_viterbi`: the most probable sequences;
* :func:`chain_sample`: exact joint samples (forward filtering, backward sampling);
* :func:`chain_score`: the unnormalized log score of given sequences;
* :func:`gumbel_max`, :func:`gumbel_argmax`: categorical draws by the Gumbel-max trick (the one
  implementation the kernels and proposals share), from :func:`gumbel_from_uniform` noise.

Example:
    >>> unary, trans = torch.zeros(1, 3, 2), torch.zeros(2, 2)
    >>> round(float(chain_forward(unary, trans)[1].exp()), 4)
    8.0
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "chain_backward",
    "chain_forward",
    "chain_marginals",
    "chain_sample",
    "chain_score",
    "chain_viterbi",
    "gumbel_argmax",
    "gumbel_from_uniform",
    "gumbel_max",
]


def _check_chain(unary: Tensor, trans: Tensor, mask: Tensor | None) -> Tensor:
    """Validate shapes and return the bool mask (all ``True`` when ``mask`` is ``None``)."""
    if unary.dim() != 3:
        raise ValueError(f"unary potentials must be [B, T, K], got {tuple(unary.shape)}")
    k = unary.shape[-1]
    if trans.shape != (k, k):
        raise ValueError(f"transitions must be [{k}, {k}], got {tuple(trans.shape)}")
    if mask is None:
        return torch.ones(unary.shape[:2], dtype=torch.bool, device=unary.device)
    if mask.shape != unary.shape[:2]:
        raise ValueError(f"mask {tuple(mask.shape)} does not match unary {tuple(unary.shape[:2])}")
    return mask.bool()


def chain_forward(unary: Tensor, trans: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Forward algorithm on a padded batch of chains, in log space.

    Args:
        unary: ``[B, T, K]`` log unary potentials (start/end scores folded into the first
            and last valid positions).
        trans: ``[K, K]`` log transition potentials, ``trans[i, j]`` from state ``i`` to ``j``.
        mask: ``[B, T]`` bool, a prefix of ``True`` per chain (length >= 1); default all.

    Returns:
        ``(alpha, log_z)``: ``alpha [B, T, K]`` the log forward messages including the unary
        at ``t`` (carried unchanged over padding), and ``log_z [B]``.

    Example:
        >>> _, log_z = chain_forward(torch.zeros(1, 3, 2), torch.zeros(2, 2))
        >>> torch.allclose(log_z, torch.tensor([8.0]).log())
        True
    """
    mask = _check_chain(unary, trans, mask)
    alphas = [unary[:, 0]]
    for t in range(1, unary.shape[1]):
        prev = alphas[-1]
        new = torch.logsumexp(prev.unsqueeze(-1) + trans, dim=-2) + unary[:, t]
        alphas.append(torch.where(mask[:, t, None], new, prev))
    alpha = torch.stack(alphas, 1)
    return alpha, torch.logsumexp(alpha[:, -1], dim=-1)


def chain_backward(unary: Tensor, trans: Tensor, mask: Tensor | None = None) -> Tensor:
    """Backward log messages ``beta [B, T, K]`` (zero at the last valid position and over padding).

    ``alpha[t] + beta[t] - log_z`` are the log marginals of position ``t``.

    Example:
        >>> chain_backward(torch.zeros(1, 2, 2), torch.zeros(2, 2))[0, 0]
        tensor([0.6931, 0.6931])
    """
    mask = _check_chain(unary, trans, mask)
    t_len = unary.shape[1]
    betas = [torch.zeros_like(unary[:, 0])]
    for t in range(t_len - 2, -1, -1):
        nxt = unary[:, t + 1] + betas[-1]
        new = torch.logsumexp(trans + nxt.unsqueeze(-2), dim=-1)
        betas.append(torch.where(mask[:, t + 1, None], new, torch.zeros_like(new)))
    return torch.stack(betas[::-1], 1)


def chain_marginals(unary: Tensor, trans: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-position marginal probabilities ``[B, T, K]`` by forward-backward (zero over padding).

    Example:
        >>> chain_marginals(torch.zeros(1, 2, 3), torch.zeros(3, 3))[0, 0]
        tensor([0.3333, 0.3333, 0.3333])
    """
    mask = _check_chain(unary, trans, mask)
    alpha, log_z = chain_forward(unary, trans, mask)
    beta = chain_backward(unary, trans, mask)
    probs = (alpha + beta - log_z[:, None, None]).exp()
    return probs * mask.unsqueeze(-1).to(probs.dtype)


def chain_viterbi(unary: Tensor, trans: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Most probable state sequences of a padded batch of chains.

    Returns:
        ``(states [B, T] long, score [B])``; states over padding are 0.

    Example:
        >>> unary = torch.tensor([[[0.0, 1.0], [2.0, 0.0]]])
        >>> chain_viterbi(unary, torch.zeros(2, 2))[0]
        tensor([[1, 0]])
    """
    mask = _check_chain(unary, trans, mask)
    b, t_len, k = unary.shape
    delta = unary[:, 0]
    keep = torch.arange(k, device=unary.device).expand(b, k)
    pointers = []
    for t in range(1, t_len):
        scores = delta.unsqueeze(-1) + trans  # [B, K_prev, K]
        best, arg = scores.max(dim=-2)
        m = mask[:, t, None]
        pointers.append(torch.where(m, arg, keep))
        delta = torch.where(m, best + unary[:, t], delta)
    score, last = delta.max(dim=-1)
    path = [last]
    for ptr in reversed(pointers):
        path.append(ptr.gather(-1, path[-1].unsqueeze(-1)).squeeze(-1))
    tags = torch.stack(path[::-1], 1)
    return tags * mask.long(), score


def gumbel_from_uniform(uniform: Tensor) -> Tensor:
    """Standard Gumbel draws ``-log(-log u)`` from uniforms ``u`` in ``[0, 1)`` (``0`` is clamped up to ``tiny``).

    Example:
        >>> round(float(gumbel_from_uniform(torch.tensor(0.5))), 4)
        0.3665
    """
    return -torch.log(-torch.log(uniform.clamp(min=torch.finfo(uniform.dtype).tiny)))


def gumbel_max(
    logits: Tensor, gumbel: Tensor | None = None, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """The Gumbel-max trick: ``(max, argmax)`` of ``logits + gumbel`` over the last dimension.

    The argmax is a draw from the categorical distribution with these (unnormalized) logits.
    Rows whose logits are all ``-inf`` give a ``-inf`` maximum.

    Args:
        logits: ``[..., K]`` unnormalized log probabilities.
        gumbel: standard Gumbel draws broadcasting with ``logits`` (drawn by the caller, e.g. outside a
            compiled function; :func:`gumbel_from_uniform` makes them). Default: one uniform per entry of
            ``logits`` from ``generator``.
        generator: the RNG for the default noise (default: torch's global RNG).

    Example:
        >>> best, draw = gumbel_max(torch.tensor([[0.0, -float("inf")]]), torch.zeros(1, 2))
        >>> best.tolist(), draw.tolist()
        ([0.0], [0])
    """
    if gumbel is None:
        uniform = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
        gumbel = gumbel_from_uniform(uniform)
    return (logits + gumbel).max(-1)


def gumbel_argmax(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One categorical draw per row of ``logits [..., K]`` by the Gumbel-max trick (:func:`gumbel_max`).

    Uses one uniform per entry from ``generator`` (default: the global RNG), so a draw is
    reproducible given the generator's state.

    Example:
        >>> gumbel_argmax(torch.tensor([[0.0, -1e4], [-1e4, 0.0]]), torch.Generator().manual_seed(0))
        tensor([0, 1])
    """
    return gumbel_max(logits, generator=generator)[1]


def chain_sample(
    unary: Tensor,
    trans: Tensor,
    mask: Tensor | None = None,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Exact joint samples of state sequences by forward filtering, backward sampling.

    Args:
        unary: ``[B, T, K]`` folded log unary potentials.
        trans: ``[K, K]`` log transitions.
        mask: ``[B, T]`` prefix mask.
        num_samples: samples per chain.
        generator: the torch RNG (default: the global one).

    Returns:
        ``LongTensor [num_samples, B, T]`` (0 over padding).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> chain_sample(torch.zeros(2, 4, 3), torch.zeros(3, 3), num_samples=5, generator=g).shape
        torch.Size([5, 2, 4])
    """
    mask = _check_chain(unary, trans, mask)
    alpha, _ = chain_forward(unary, trans, mask)
    b, t_len, k = unary.shape
    y = gumbel_argmax(alpha[:, -1].expand(num_samples, b, k), generator)
    path = [y]
    for t in range(t_len - 1, 0, -1):
        logits = alpha[:, t - 1] + trans.t()[y]  # [S, B, K]: trans[:, y_t]
        prev = gumbel_argmax(logits, generator)
        y = torch.where(mask[:, t], prev, y)
        path.append(y)
    return torch.stack(path[::-1], -1) * mask.long()


def chain_score(unary: Tensor, trans: Tensor, tags: Tensor, mask: Tensor | None = None) -> Tensor:
    """Unnormalized log score of state sequences ``tags [..., B, T]`` -> ``[..., B]``.

    Example:
        >>> chain_score(torch.ones(1, 3, 2), torch.eye(2), torch.tensor([[0, 0, 1]]))
        tensor([4.])
    """
    mask = _check_chain(unary, trans, mask)
    tags = tags.long()
    m = mask.to(unary.dtype)
    u = unary.expand(tags.shape + unary.shape[-1:]).gather(-1, tags.unsqueeze(-1)).squeeze(-1)
    total = (u * m).sum(-1)
    pair = trans[tags[..., :-1], tags[..., 1:]]
    return total + (pair * m[:, 1:]).sum(-1)
