"""neuralblock: fast MCMC with learned neural block proposals, inside Pyro."""

from neuralblock.graph import FactorGraph
from neuralblock.kernels import GibbsKernel, RandomWalkMH

__all__ = ["FactorGraph", "GibbsKernel", "RandomWalkMH"]
__version__ = "0.1.0"
