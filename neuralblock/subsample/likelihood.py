"""Alias of :mod:`neuralblock.pyro.likelihood`, where the direct likelihood path of Pyro models now lives.

Kept so that ``from neuralblock.subsample.likelihood import LogLikelihood`` still works. Importing
this module needs only torch; Pyro is imported on the first access of one of its names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuralblock.pyro.likelihood import *  # noqa: F403

_TARGET = "neuralblock.pyro.likelihood"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_TARGET), name)
