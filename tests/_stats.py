"""Statistics the kernel tests share: exact joints by enumeration and Bonferroni thresholds.

Example:
    >>> from neuralblock.graph import FactorGraph
    >>> fg = FactorGraph(); _ = fg.add_variables(2, 2)
    >>> states, probs = enumerate_joint(fg)
    >>> states.shape, float(probs.sum()), round(bonferroni_t(10, 79), 2)
    (torch.Size([4, 2]), 1.0, 4.1)
"""

from __future__ import annotations

import torch
from scipy import stats

from neuralblock.exact import joint_enumerate
from neuralblock.graph import FactorGraph

ALPHA = 1e-3
"""The family-wise false-failure rate the statistical tests are set to."""


def enumerate_joint(fg: FactorGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """Every state (evidence fixed, last variable fastest) as float32 ``[N, n]``, and its probability (float64)."""
    states, log_probs = joint_enumerate(fg)
    return states.float(), log_probs.exp()


def bonferroni_t(num_tests: int, df: int, alpha: float = ALPHA) -> float:
    """Two-sided Student-t threshold for ``num_tests`` comparisons at family-wise rate ``alpha``."""
    return float(stats.t.ppf(1 - alpha / (2 * num_tests), df=df))
