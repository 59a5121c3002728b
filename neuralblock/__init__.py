"""neuralblock: fast MCMC with learned neural block proposals, inside Pyro."""

from neuralblock.graph import FactorGraph

__all__ = ["FactorGraph"]
__version__ = "0.1.0"
