"""Brute-force enumeration of tiny discrete factor graphs (a reference for tests).

Example:
    >>> import torch
    >>> from neuralblock.graph import FactorGraph
    >>> fg = FactorGraph()
    >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 3)
    >>> fg.add_table_factor([a, b], torch.zeros(2, 3))
    0
    >>> fg.set_evidence({"b": 2})
    >>> states, log_probs = joint_enumerate(fg)
    >>> states.tolist(), log_probs.exp().tolist()
    ([[0.0, 2.0], [1.0, 2.0]], [0.5, 0.5])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neuralblock.graph.factor_graph import FactorGraph

__all__ = ["MAX_ENUMERATION_STATES", "joint_enumerate"]

MAX_ENUMERATION_STATES = 2**22


def joint_enumerate(fg: FactorGraph, max_states: int = MAX_ENUMERATION_STATES) -> tuple[Tensor, Tensor]:
    """Every joint configuration of the latent variables and its normalised log probability.

    Observed variables keep their evidence value in every row. The rows are in
    lexicographic order of the latent variables (the last latent variable fastest).

    Args:
        fg: a factor graph whose variables are all discrete (any factor kind that
            ``fg.log_joint`` evaluates is accepted).
        max_states: refuse to enumerate more configurations than this.

    Returns:
        ``(states, log_probs)``: ``states`` is a float64 ``Tensor [N, n]`` (``N`` the product
        of the latent cardinalities), ``log_probs`` a float64 ``Tensor [N]`` that logsumexps to 0.

    Raises:
        ValueError: continuous variables, too many configurations, or a zero partition function.

    Example:
        >>> from neuralblock.graph import FactorGraph
        >>> fg = FactorGraph(); _ = fg.add_variables(3, 2)
        >>> joint_enumerate(fg)[0].shape
        torch.Size([8, 3])
    """
    cards = [int(k) for k in fg.cardinalities.tolist()]
    continuous = [fg.names[v] for v, k in enumerate(cards) if k == 0]
    if continuous:
        raise ValueError(f"cannot enumerate continuous variables: {continuous[:5]}")
    latent = [v for v in range(len(cards)) if v not in fg.evidence]
    total = math.prod(cards[v] for v in latent)
    if total > max_states:
        raise ValueError(f"enumeration needs {total} configurations, above max_states={max_states}")
    states = torch.zeros(total, len(cards), dtype=torch.float64)
    for v, x in fg.evidence.items():
        states[:, v] = float(x)
    if latent:
        grids = torch.meshgrid(*[torch.arange(cards[v], dtype=torch.float64) for v in latent], indexing="ij")
        states[:, latent] = torch.stack([g.reshape(-1) for g in grids], dim=-1)
    log_joint = torch.zeros(total, dtype=torch.float64)
    for group in fg.groups:
        log_joint = log_joint + group.log_factors(states).to(torch.float64).sum(-1)
    log_z = torch.logsumexp(log_joint, 0)
    if not torch.isfinite(log_z):
        raise ValueError("the partition function is 0 (no configuration has positive weight)")
    return states, log_joint - log_z
