"""Drawing section indices without replacement in O(m) per mini-batch.

While fewer than half of the ``N`` indices are taken, a mini-batch of ``m`` is drawn by
sequential rejection: uniform candidates are accepted in order unless already taken (this
sequence) or repeated, which gives exactly the law of drawing without replacement; each
candidate is accepted with probability above 1/2, so a draw costs O(m) tensor work (and one
sort of its m candidates, to find repeats). A persistent boolean mask (allocated once, N bytes)
marks the taken indices; it is read and written
only at drawn entries, and the first draw of a sequence (the usual one, whose ``m``
candidates are all distinct with probability about ``1 - m²/2N``) is written to it only
if a second draw follows. Once a draw would take more than half of the indices, the
untaken remainder is listed once and shuffled (O(N), which is then O(indices taken)), and
later draws read it in order. A transition that uses ``n`` sections therefore costs O(n),
and :meth:`~IndexSampler.reset` clears only the entries it set.

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

    Example:
        >>> sampler = IndexSampler(1_000_000)
        >>> batch = sampler.draw(100)
        >>> batch.unique().numel(), sampler.remaining
        (100, 999900)
    """

    def __init__(self, num_sections: int) -> None:
        if num_sections < 1:
            raise ValueError(f"num_sections must be positive, got {num_sections}")
        self.num_sections = int(num_sections)
        self._taken: Tensor | None = None  # bool [N]: indices drawn by rejection since the last reset
        self._marked: list[Tensor] = []  # the entries set in _taken, to clear them in O(n)
        self._first: Tensor | None = None  # the sequence's first draw, not yet marked in _taken
        self._rest: Tensor | None = None  # shuffled untaken indices, once more than half are taken
        self._rest_start = 0
        self.cursor = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_taken=None, _marked=[], _first=None, _rest=None, _rest_start=0, cursor=0)  # small pickles
        return state

    @property
    def remaining(self) -> int:
        """Indices left in the current without-replacement sequence."""
        return self.num_sections - self.cursor

    def reset(self) -> None:
        """Start a new without-replacement sequence (O(indices drawn since the last reset))."""
        if self._marked and self._taken is not None:
            self._taken[torch.cat(self._marked)] = False
        self._marked, self._first, self._rest, self._rest_start, self.cursor = [], None, None, 0, 0

    def draw(self, k: int) -> Tensor:
        """The next ``k`` indices, uniformly among those not drawn since the last :meth:`reset`.

        Args:
            k: how many (at most :attr:`remaining`).

        Returns:
            A ``LongTensor [k]`` of distinct indices, in uniformly random order.
        """
        if not 0 <= k <= self.remaining:
            raise ValueError(f"cannot draw {k} indices, {self.remaining} remain")
        if self._rest is None and 2 * (self.cursor + k) > self.num_sections:
            self._list_rest()
        if self._rest is not None:
            out = self._rest[self._rest_start : self._rest_start + k]
            self._rest_start += k
        elif self.cursor == 0:  # nothing taken yet: k candidates are accepted unless some repeat
            candidates = torch.randint(self.num_sections, (k,))
            if k > 1 and _has_repeats(candidates):
                out = self._reject(k, candidates)
            else:
                out = self._first = candidates
        else:
            out = self._reject(k)
        self.cursor += k
        return out

    def _mark_first(self) -> None:
        """Write the sequence's first draw into the mask of taken indices (before any later draw)."""
        if self._first is not None:
            if self._taken is None:
                self._taken = torch.zeros(self.num_sections, dtype=torch.bool)
            self._taken[self._first] = True
            self._marked.append(self._first)
            self._first = None

    def _reject(self, k: int, candidates: Tensor | None = None) -> Tensor:
        """``k`` untaken indices by sequential rejection of ``candidates``, then of fresh ones as needed.

        Each candidate is accepted with probability above 1/2 (fewer than half are taken).
        """
        self._mark_first()
        if self._taken is None:
            self._taken = torch.zeros(self.num_sections, dtype=torch.bool)
        taken, parts, need = self._taken, [], k
        while need > 0:
            if candidates is None:
                accept_rate = 1.0 - self.cursor / self.num_sections  # about; above 1/2 here
                candidates = torch.randint(self.num_sections, (int(math.ceil(need / accept_rate)) + 2,))
            count = candidates.numel()
            ordered, order = torch.sort(candidates, stable=True)
            first = torch.ones(count, dtype=torch.bool)
            first[1:] = ordered[1:] != ordered[:-1]  # the earliest of equal candidates comes first
            fresh = torch.empty_like(first)
            fresh[order] = first
            chosen = candidates[fresh & ~taken[candidates]][:need]
            taken[chosen] = True
            self._marked.append(chosen)
            parts.append(chosen)
            need -= chosen.numel()
            candidates = None
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _list_rest(self) -> None:
        """List the untaken indices once, in uniformly random order."""
        self._mark_first()
        if self._taken is None or not self._marked:
            rest = torch.arange(self.num_sections)
        else:
            rest = torch.nonzero(~self._taken).reshape(-1)
        self._rest, self._rest_start = rest[torch.randperm(rest.numel())], 0


_SET_CHECK_MAX = 4096  # draws up to this size are checked for repeats with a Python set (less overhead than unique)


def _has_repeats(values: Tensor) -> bool:
    """Whether a ``LongTensor`` has repeated entries (a Python set for small ones: less overhead than ``unique``)."""
    if values.numel() <= _SET_CHECK_MAX:
        return len(set(values.tolist())) < values.numel()
    return values.unique().numel() < values.numel()
