"""Drawing section indices without replacement in O(m) per mini-batch.

A persistent permutation of ``range(N)`` is built once; each transition starts a new
without-replacement sequence by resetting a cursor (O(1)), and each mini-batch of ``m``
indices moves ``m`` uniformly chosen remaining entries in front of the cursor (a
vectorized partial Fisher-Yates shuffle); when ``m`` is at least a quarter of the ``r``
remaining entries, the whole remainder is shuffled instead (O(r) = O(m), fewer tensor
operations). A draw of ``m`` touches O(m) entries after the permutation is built, so a
transition that uses ``n`` sections costs O(n).

Example:
    >>> sampler = IndexSampler(10)
    >>> first = sampler.draw(4)
    >>> rest = sampler.draw(6)
    >>> sorted(torch.cat([first, rest]).tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["IndexSampler"]


class IndexSampler:
    """Without-replacement index draws from ``range(N)`` at O(m) cost per draw of ``m``.

    Args:
        num_sections: the population size ``N``.
    """

    def __init__(self, num_sections: int) -> None:
        if num_sections < 1:
            raise ValueError(f"num_sections must be positive, got {num_sections}")
        self.num_sections = int(num_sections)
        self._perm: Tensor | None = None
        self.cursor = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_perm"] = None  # rebuilt lazily: keeps pickles small for multi-chain runs
        state["cursor"] = 0
        return state

    @property
    def remaining(self) -> int:
        """Indices left in the current without-replacement sequence."""
        return self.num_sections - self.cursor

    def reset(self) -> None:
        """Start a new without-replacement sequence (O(1))."""
        self.cursor = 0

    def draw(self, k: int) -> Tensor:
        """The next ``k`` indices, uniformly among those not drawn since the last :meth:`reset`.

        Args:
            k: how many (at most :attr:`remaining`).

        Returns:
            A ``LongTensor [k]`` of distinct indices.
        """
        if not 0 <= k <= self.remaining:
            raise ValueError(f"cannot draw {k} indices, {self.remaining} remain")
        if self._perm is None:
            self._perm = torch.arange(self.num_sections)
        perm, start = self._perm, self.cursor
        remaining = self.remaining
        if k == remaining or k == 0:
            self.cursor += k
            return perm[start : start + k].clone()
        if remaining <= 4 * k:  # shuffle the whole remainder: O(remaining) = O(k), and the fewest tensor ops
            perm[start:] = perm[start:][torch.randperm(remaining)]
            self.cursor += k
            return perm[start : start + k].clone()
        chosen = start + _distinct_uniform(remaining, k)
        front = torch.arange(start, start + k)
        # move the chosen entries in front: swap chosen-but-outside with front-but-not-chosen
        inside = chosen < start + k
        free = torch.ones(k, dtype=torch.bool)
        free[chosen[inside] - start] = False
        outside, vacant = chosen[~inside], front[free]
        if outside.numel():
            moved = perm[outside].clone()
            perm[outside] = perm[vacant]
            perm[vacant] = moved
        self.cursor += k
        return perm[start : start + k].clone()


def _distinct_uniform(population: int, k: int) -> Tensor:
    """A uniformly random ``k``-subset of ``range(population)`` (for ``k`` well below it), O(k)."""
    draws = torch.randint(population, (k + int(math.ceil(2 * k * k / population)) + 4,))
    distinct = draws.unique()
    while distinct.numel() < k:
        distinct = torch.cat([distinct, torch.randint(population, (k,))]).unique()
    return distinct[torch.randperm(distinct.numel())[:k]]
