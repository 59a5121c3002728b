"""neuralblock: fast MCMC with learned neural block proposals, inside Pyro."""

from neuralblock.graph import FactorGraph
from neuralblock.kernels import (
    AusterityMH,
    CompoundKernel,
    ConditionalGraphKernel,
    ConditionedModel,
    DiscreteLangevin,
    GibbsKernel,
    GibbsWithGradients,
    LWAKernel,
    NeuralBlockKernel,
    PathAuxiliarySampler,
    RandomWalkMH,
    ReplicaExchange,
)
from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, get_motif, motif_names, register_motif
from neuralblock.priorswap import PriorSwap
from neuralblock.proposals import NeuralBlockProposal, list_pretrained, load_pretrained

__all__ = [
    "AusterityMH",
    "BlockSpec",
    "CompoundKernel",
    "ConditionalGraphKernel",
    "ConditionedModel",
    "DiscreteLangevin",
    "FactorGraph",
    "GibbsKernel",
    "GibbsWithGradients",
    "LWAKernel",
    "Motif",
    "MotifInstances",
    "NeuralBlockKernel",
    "NeuralBlockProposal",
    "PathAuxiliarySampler",
    "PriorSwap",
    "RandomWalkMH",
    "ReplicaExchange",
    "TrainingBatch",
    "get_motif",
    "list_pretrained",
    "load_pretrained",
    "motif_names",
    "register_motif",
]
__version__ = "0.1.0"
