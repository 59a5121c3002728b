"""Pyro ``MCMCKernel``s over factor graphs and Pyro models."""

from neuralblock.kernels.adaptation import StepSizeAdapter
from neuralblock.kernels.austerity import AusterityMH
from neuralblock.kernels.base import GraphKernel, sequential_init
from neuralblock.kernels.compound import CompoundKernel
from neuralblock.kernels.conditional_graph import ConditionalGraphKernel
from neuralblock.kernels.conditioning import Conditionable, ConditionedModel, ResettableConditioning, set_conditioning
from neuralblock.kernels.functional import GibbsInfo, MHInfo, gibbs_sample, mh_accept, random_walk_propose
from neuralblock.kernels.gibbs import GibbsKernel
from neuralblock.kernels.gradient_discrete import (
    GRADIENT_SAMPLERS,
    DiscreteLangevin,
    GibbsWithGradients,
    PathAuxiliarySampler,
)
from neuralblock.kernels.lwa import LWAKernel
from neuralblock.kernels.marginal import MarginalRandomWalk
from neuralblock.kernels.neural_block import NeuralBlockKernel, neural_block_step
from neuralblock.kernels.nuts import DirectNUTS
from neuralblock.kernels.particle_gibbs import ParticleGibbs, StateSpaceModel, csmc_step
from neuralblock.kernels.random_walk import RandomWalkMH
from neuralblock.kernels.replica_exchange import ReplicaExchange
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.split_merge import SplitMergeGMM
from neuralblock.kernels.vocabulary import KernelDiagnostics

__all__ = [
    "GRADIENT_SAMPLERS",
    "AusterityMH",
    "CompoundKernel",
    "ConditionalGraphKernel",
    "Conditionable",
    "ConditionedModel",
    "DirectNUTS",
    "ResettableConditioning",
    "DiscreteLangevin",
    "GibbsInfo",
    "GibbsKernel",
    "GibbsWithGradients",
    "GraphKernel",
    "KernelDiagnostics",
    "LWAKernel",
    "MHInfo",
    "MarginalRandomWalk",
    "NeuralBlockKernel",
    "ParticleGibbs",
    "PathAuxiliarySampler",
    "RandomWalkMH",
    "ReplicaExchange",
    "SingleSiteSweep",
    "SplitMergeGMM",
    "StateSpaceModel",
    "StepSizeAdapter",
    "csmc_step",
    "gibbs_sample",
    "mh_accept",
    "neural_block_step",
    "random_walk_propose",
    "sequential_init",
    "set_conditioning",
]
