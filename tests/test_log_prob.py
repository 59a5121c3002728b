"""site_log_prob: the one-node Bernoulli(logits) log density equals torch's in value, gradient, Hessian,
forward mode and under vmap, validates like it, and leaves other distributions alone."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from torch.func import jvp, vmap

from neuralblock.pyro.log_prob import site_log_prob


def _pair(logits: torch.Tensor, y: torch.Tensor, wrap=lambda d: d):
    return site_log_prob(wrap(dist.Bernoulli(logits=logits)), y), wrap(dist.Bernoulli(logits=logits)).log_prob(y)


@pytest.mark.parametrize("scale", [1.0, 40.0])  # 40: softplus past its linear threshold, sigmoid saturated
def test_values_gradients_and_hessians_equal_torchs(scale: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (scale * torch.randn(3, 7, generator=gen, dtype=torch.float64)).requires_grad_()
    y = torch.randint(0, 2, (7,), generator=gen).double()  # broadcasts against the logits
    fast, plain = _pair(logits, y)
    assert fast.shape == plain.shape == (3, 7)
    assert torch.allclose(fast, plain, rtol=1e-12, atol=1e-14)  # float64: no softplus cut-off at 20
    (g_fast,) = torch.autograd.grad(fast.sum(), logits, create_graph=True)
    (g_plain,) = torch.autograd.grad(plain.sum(), logits, create_graph=True)
    assert torch.allclose(g_fast, g_plain)
    (h_fast,) = torch.autograd.grad((g_fast**2).sum(), logits)
    (h_plain,) = torch.autograd.grad((g_plain**2).sum(), logits)
    assert torch.allclose(h_fast, h_plain)


def test_forward_mode_and_vmap_equal_torchs() -> None:
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 2, (6,), generator=gen).float()
    points, tangents = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)

    def fast(t: torch.Tensor) -> torch.Tensor:
        return site_log_prob(dist.Bernoulli(logits=t), y)

    def plain(t: torch.Tensor) -> torch.Tensor:
        return dist.Bernoulli(logits=t).log_prob(y)

    for a, b in zip(jvp(vmap(fast), (points,), (tangents,)), jvp(vmap(plain), (points,), (tangents,))):
        assert torch.allclose(a, b, atol=1e-6)


def test_independent_wrappers_and_probs_and_validation() -> None:
    gen = torch.Generator().manual_seed(2)
    logits, y = torch.randn(4, 5, generator=gen), torch.randint(0, 2, (4, 5), generator=gen).float()
    fast, plain = _pair(logits, y, wrap=lambda d: d.to_event(1))
    assert fast.shape == (4,) and torch.allclose(fast, plain)
    probs = dist.Bernoulli(probs=torch.tensor([0.3, 0.9]))
    assert torch.allclose(site_log_prob(probs, torch.tensor([1.0, 0.0])), probs.log_prob(torch.tensor([1.0, 0.0])))
    with pytest.raises(ValueError, match="support"):
        site_log_prob(dist.Bernoulli(logits=torch.zeros(2), validate_args=True), torch.tensor([0.5, 1.0]))


def test_other_distributions_and_subclasses_use_their_own_log_prob() -> None:
    class Tilted(dist.Bernoulli):
        def log_prob(self, value: torch.Tensor) -> torch.Tensor:
            return super().log_prob(value) + 1.0

    y = torch.tensor([1.0, 0.0])
    assert torch.allclose(site_log_prob(Tilted(logits=torch.zeros(2)), y), torch.log(torch.tensor(0.5)) + 1.0)
    normal = dist.Normal(torch.zeros(2), 2.0)
    assert torch.equal(site_log_prob(normal, y), normal.log_prob(y))
