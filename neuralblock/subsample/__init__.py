"""Subsampled accept tests for global parameters: the sequential t-test, index draws, lazy sections.

Only torch is needed to import this package (the Pyro plate injection imports Pyro lazily).

References:
    Korattikara, Chen, Welling. "Austerity in MCMC Land: Cutting the Metropolis-Hastings
    Budget", ICML 2014. Chen, Mansinghka, Ghahramani. "Sublinear-Time Approximate MCMC
    Transitions for Probabilistic Programs", 2014.
"""

from neuralblock.subsample.indices import IndexSampler
from neuralblock.subsample.sections import SectionEvaluator, SectionTerms, is_subsample_site, site_plate_frame
from neuralblock.subsample.sequential import (
    SequentialTestInfo,
    austerity_decision,
    sequential_test,
    stream_from,
    student_t_sf,
)

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
