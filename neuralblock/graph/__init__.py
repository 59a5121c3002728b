"""Factor graphs: networkx structure with vectorized factor groups."""

from neuralblock.graph.factor_graph import BlockScaffold, FactorGraph
from neuralblock.graph.groups import (
    CallableGroup,
    FactorGroup,
    GaussianMixtureGroup,
    LinearGaussianGroup,
    LogLinearGaussianGroup,
    TableGroup,
)

__all__ = [
    "BlockScaffold",
    "CallableGroup",
    "FactorGraph",
    "FactorGroup",
    "GaussianMixtureGroup",
    "LinearGaussianGroup",
    "LogLinearGaussianGroup",
    "TableGroup",
]
