"""Alias of :mod:`neuralblock.pyro.coresets`, where the Pyro glue of the coresets now lives.

Kept so that ``from neuralblock.coresets.pyro_model import weighted_model`` still works. Importing
this module needs only torch; Pyro is imported on the first access of one of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuralblock._lazy import forwarding_getattr

if TYPE_CHECKING:
    from neuralblock.pyro.coresets import *  # noqa: F403

__getattr__ = forwarding_getattr(__name__, "neuralblock.pyro.coresets")
