"""Subsampled accept tests for global parameters: the sequential t-test, index draws, lazy sections.

Only torch is needed to import this package. The parts that run Pyro models live in
:mod:`neuralblock.pyro`: the lazy local sections (:mod:`neuralblock.pyro.sections`) and the direct
likelihood path (:mod:`neuralblock.pyro.likelihood`). Their names are still importable from here (and
from the old modules ``neuralblock.subsample.sections`` and ``neuralblock.subsample.likelihood``);
Pyro is imported on the first access of one of them.

References:
    Korattikara, Chen, Welling. "Austerity in MCMC Land: Cutting the Metropolis-Hastings
    Budget", ICML 2014. Chen, Mansinghka, Ghahramani. "Sublinear-Time Approximate MCMC
    Transitions for Probabilistic Programs", 2014.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuralblock.subsample.indices import IndexSampler
from neuralblock.subsample.sequential import (
    SequentialTestInfo,
    austerity_decision,
    sequential_test,
    stream_from,
    student_t_sf,
)

if TYPE_CHECKING:
    from neuralblock.pyro.sections import SectionEvaluator, SectionTerms, is_subsample_site, site_plate_frame

# names that need Pyro: imported from neuralblock.pyro on first access
_PYRO_NAMES = {
    "SectionEvaluator": "neuralblock.pyro.sections",
    "SectionTerms": "neuralblock.pyro.sections",
    "is_subsample_site": "neuralblock.pyro.sections",
    "site_plate_frame": "neuralblock.pyro.sections",
}

__all__ = [
    "IndexSampler",
    "SectionEvaluator",
    "SectionTerms",
    "SequentialTestInfo",
    "austerity_decision",
    "is_subsample_site",
    "sequential_test",
    "site_plate_frame",
    "stream_from",
    "student_t_sf",
]


def __getattr__(name: str) -> Any:
    if name not in _PYRO_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PYRO_NAMES[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PYRO_NAMES))
