"""Alias of :mod:`neuralblock.pyro.likelihood`, where the direct likelihood path of Pyro models now lives.

Kept so that ``from neuralblock.subsample.likelihood import LogLikelihood`` still works. Importing
this module needs only torch; Pyro is imported on the first access of one of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuralblock._lazy import forwarding_getattr

if TYPE_CHECKING:
    from neuralblock.pyro.likelihood import *  # noqa: F403

__getattr__ = forwarding_getattr(__name__, "neuralblock.pyro.likelihood")
