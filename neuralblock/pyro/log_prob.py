"""Observed sites' log densities with fewer recorded operations: ``Bernoulli(logits)`` as one autograd node.

torch computes ``Bernoulli(logits=l).log_prob(y)`` as ``-binary_cross_entropy_with_logits(l, y)``,
a composite of about a dozen elementwise operations whose derivative is built from their own
derivatives: a value-and-gradient graph recorded from it (the direct likelihood path,
:mod:`neuralblock.pyro.likelihood`) replays about thirty operations for one logistic
likelihood, and forward-mode differentiation (the coreset projection) runs as many.
:func:`site_log_prob` computes the same density as ``y l - softplus(l)`` in one
:class:`torch.autograd.Function` whose derivative is ``y - sigmoid(l)``, with its own forward-mode
rule and a batching rule for ``torch.func``, so graphs recorded through it hold a handful of
operations. Other distributions (and ``Independent`` wrappers of them) use their own ``log_prob``.

Example:
    >>> import pyro.distributions as dist, torch
    >>> logits, y = torch.tensor([-2.0, 0.5, 30.0]), torch.tensor([0.0, 1.0, 1.0])
    >>> fn = dist.Bernoulli(logits=logits)
    >>> torch.allclose(site_log_prob(fn, y), fn.log_prob(y))
    True
"""

from __future__ import annotations

from typing import Any

import pyro.distributions
import torch
from torch import Tensor
from torch.distributions.utils import broadcast_all

__all__ = ["site_log_prob"]

_SOFTPLUS_THRESHOLD = 40.0  # exp(40) is far from float32's overflow (at 88)


class _BernoulliLogitsLogProb(torch.autograd.Function):
    """``y * l - softplus(l)`` with derivative ``(y - sigmoid(l), l)``, forward mode and vmap included."""

    @staticmethod
    def forward(logits: Tensor, value: Tensor) -> Tensor:
        # softplus is linear from its threshold on (it drops log1p(exp(-l))): at 40 that is below 5e-18,
        # under float64's resolution of the value; torch's default threshold of 20 would drop up to 2e-9
        return value * logits - torch.nn.functional.softplus(logits, threshold=_SOFTPLUS_THRESHOLD)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        logits, value = inputs
        ctx.set_materialize_grads(False)  # an input without a tangent (the data) gets None, not a zeros tensor
        ctx.save_for_backward(logits, value)
        ctx.save_for_forward(logits, value)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        logits, value = ctx.saved_tensors
        if grad is None:
            return None, None
        grad_logits = grad * (value - torch.sigmoid(logits)) if ctx.needs_input_grad[0] else None
        grad_value = grad * logits if ctx.needs_input_grad[1] else None
        return grad_logits, grad_value

    @staticmethod
    def jvp(ctx: Any, logits_tangent: Tensor | None, value_tangent: Tensor | None) -> Tensor:
        logits, value = ctx.saved_tensors
        out = None if logits_tangent is None else (value - torch.sigmoid(logits)) * logits_tangent
        if value_tangent is not None:
            out = logits * value_tangent if out is None else out + logits * value_tangent
        return torch.zeros_like(logits) if out is None else out

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, int | None], logits: Tensor, value: Tensor) -> tuple[Tensor, int]:
        # one call on the batched tensors with the batch dimension last (an unbatched input broadcasts
        # against it): batched logits usually come from a matrix product whose batch dimension is the
        # innermost one in memory, so every elementwise operation then runs on contiguous memory, where a
        # generated rule would expand the data and mix layouts (the coreset projection's jvp(vmap(...)) ran
        # about 20% slower)
        logits_dim, value_dim = in_dims
        logits = logits.unsqueeze(-1) if logits_dim is None else logits.movedim(logits_dim, -1)
        value = value.unsqueeze(-1) if value_dim is None else value.movedim(value_dim, -1)
        logits, value = torch.broadcast_tensors(logits, value)  # vmap calls this only with a batched input
        return _BernoulliLogitsLogProb.apply(logits, value), logits.dim() - 1


def site_log_prob(fn: Any, value: Tensor) -> Tensor:
    """``fn.log_prob(value)``; a ``Bernoulli`` given by logits (possibly ``Independent``) takes the one-node form.

    Args:
        fn: a site's distribution.
        value: the site's value.

    Returns:
        The log density, as ``fn.log_prob(value)`` gives it (argument validation included).
    """
    if type(fn) in _INDEPENDENT and type(fn.base_dist) in _BERNOULLI and "logits" in fn.base_dist.__dict__:
        lp = site_log_prob(fn.base_dist, value)  # Independent.log_prob: the base's, summed over the event dims
        return lp.sum(tuple(range(-fn.reinterpreted_batch_ndims, 0))) if fn.reinterpreted_batch_ndims else lp
    if type(fn) not in _BERNOULLI or "logits" not in fn.__dict__:
        return fn.log_prob(value)
    if fn._validate_args:
        fn._validate_sample(value)
    logits, value = broadcast_all(fn.logits, value)
    return _BernoulliLogitsLogProb.apply(logits, value)


_BERNOULLI = (torch.distributions.Bernoulli, pyro.distributions.Bernoulli)  # exact types: a subclass may differ
_INDEPENDENT = (torch.distributions.Independent, pyro.distributions.Independent)
