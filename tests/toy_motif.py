"""A tiny motif for trainer tests, importable as a ``--plugin``.

Block: two binary variables. Context: a 3-vector ``c ~ N(0, I)``. Exact conditional:
``p(B = k | c) = softmax(scale * W c)_k`` over the four joint values ``k = 2 x0 + x1``
(:meth:`BlockSpec.enumerate` order), with a fixed random ``W`` drawn from ``seed``.
With ``enumerable=False`` batches omit ``log_p`` and carry ``log_p_fn`` instead, which
exercises the Monte Carlo validation path.

Example:
    >>> import torch
    >>> batch = ToyMotif().sample_training_batch(5, torch.Generator().manual_seed(0))
    >>> batch.features.shape, batch.block.shape, batch.log_p.shape
    (torch.Size([5, 3]), torch.Size([5, 2]), torch.Size([5, 4]))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, register_motif

__all__ = ["ToyMotif"]


class ToyMotif(Motif):
    """Two binary variables whose conditional is a random logistic function of a 3-d context."""

    name = "toy"
    version = 1

    def __init__(self, scale: float = 2.0, seed: int = 0, enumerable: bool = True) -> None:
        self.scale, self.seed, self.enumerable = float(scale), int(seed), bool(enumerable)
        self.weight = torch.randn(4, 3, generator=torch.Generator().manual_seed(self.seed)) * self.scale

    @property
    def block_spec(self) -> BlockSpec:
        return BlockSpec([2, 2])

    @property
    def feature_dim(self) -> int:
        return 3

    def options(self) -> dict[str, Any]:
        return {"scale": self.scale, "seed": self.seed, "enumerable": self.enumerable}

    def find_instances(self, fg: Any) -> MotifInstances:
        raise NotImplementedError("the toy motif has no graph instances")

    def encode(self, fg: Any, instances: MotifInstances, state: Tensor) -> Tensor:
        raise NotImplementedError("the toy motif has no graph instances")

    def log_p(self, features: Tensor) -> Tensor:
        """Exact ``[B, 4]`` conditional log-probabilities."""
        return torch.log_softmax(features @ self.weight.T, -1)

    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        features = torch.randn(batch_size, 3, generator=generator)
        log_p = self.log_p(features)
        k = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
        block = torch.stack([k // 2, k % 2], -1).to(torch.get_default_dtype())

        def log_p_fn(values: Tensor) -> Tensor:
            index = (2 * values[..., 0] + values[..., 1]).long()
            return log_p.expand(index.shape + (4,)).gather(-1, index.unsqueeze(-1)).squeeze(-1)

        return TrainingBatch(features, block, log_p if self.enumerable else None, log_p_fn)


register_motif("toy", ToyMotif)
