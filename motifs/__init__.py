"""Concrete structural motifs and their registry.

Importing this package registers every motif with :mod:`neuralblock.motif`, so
``motifs.get(name, **options)`` and ``neuralblock.get_motif`` build them by name.

Example:
    >>> import motifs
    >>> isinstance(motifs.names(), list)
    True
"""

from __future__ import annotations

from typing import Any

from neuralblock.motif import Motif, get_motif, motif_names

__all__ = ["get", "names"]


def get(name: str, **options: Any) -> Motif:
    """Build a registered motif by name (``ValueError`` lists the valid names)."""
    return get_motif(name, **options)


def names() -> list[str]:
    """Names of the registered motifs."""
    return motif_names()


# Each motif module registers itself on import (one line per motif below).
from motifs import chain, crf_tags, gmm_pair, gmm_pair_set, grid  # noqa: E402, F401
