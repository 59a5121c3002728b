"""Alias of :mod:`neuralblock.pyro.coresets`, where the Pyro glue of the coresets now lives.

Kept so that ``from neuralblock.coresets.pyro_model import weighted_model`` still works. Importing
this module needs only torch; Pyro is imported on the first access of one of its names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuralblock.pyro.coresets import *  # noqa: F403

_TARGET = "neuralblock.pyro.coresets"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_TARGET), name)
