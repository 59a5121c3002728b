"""Exact inference for discrete factor graphs.

* :func:`marginals`: all single-variable marginals and ``log Z`` (junction tree, float64);
* :func:`log_partition`: ``log Z`` only (upward pass);
* :func:`joint_enumerate`: brute force over the latent configurations of tiny graphs;
* :func:`elimination_order`: the greedy elimination heuristics used by the junction tree;
* :func:`chain_forward`, :func:`chain_backward`, :func:`chain_marginals`, :func:`chain_viterbi`,
  :func:`chain_sample`, :func:`chain_score`: batched linear chains in log space
  (:mod:`neuralblock.exact.chain`).

Example:
    >>> import torch
    >>> from neuralblock.graph import FactorGraph
    >>> from neuralblock.exact import marginals
    >>> fg = FactorGraph()
    >>> x = fg.add_variable("x", 2)
    >>> fg.add_table_factor([x], torch.tensor([1.0, 3.0]).log())
    0
    >>> marginals(fg)[0].round(decimals=6).tolist()
    [[0.25, 0.75]]
"""

from neuralblock.exact.chain import (
    chain_backward,
    chain_forward,
    chain_marginals,
    chain_sample,
    chain_score,
    chain_viterbi,
)
from neuralblock.exact.enumeration import joint_enumerate
from neuralblock.exact.junction_tree import DEFAULT_MAX_CLIQUE_STATES, elimination_order, log_partition, marginals

__all__ = [
    "DEFAULT_MAX_CLIQUE_STATES",
    "chain_backward",
    "chain_forward",
    "chain_marginals",
    "chain_sample",
    "chain_score",
    "chain_viterbi",
    "elimination_order",
    "joint_enumerate",
    "log_partition",
    "marginals",
]
