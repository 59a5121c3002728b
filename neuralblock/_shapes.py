"""Shape helpers that stay off ``torch.broadcast_shapes`` (its first call imports sympy, seconds)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["broadcast_shape"]


def broadcast_shape(*shapes: Sequence[int]) -> torch.Size:
    """The broadcast of ``shapes`` under NumPy rules.

    Raises:
        ValueError: the shapes do not broadcast.

    Example:
        >>> broadcast_shape((3, 1), (4,), ())
        torch.Size([3, 4])
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
                out[i] = size
    return torch.Size(out)
