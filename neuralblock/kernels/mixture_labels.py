"""Label moves of an open-universe GMM: Gibbs on the points' labels, then on every mean at once.

The graph of :func:`motifs.gmm_pair.gmm_graph` sums the points' labels out: point ``j``'s factor is
``log (1 / M) sum_k v_k N(x_j; mu_k, sigma^2 I)``. Put the labels ``z_j`` back, and the joint
``p(mu, v, z)`` has the graph's ``p(mu, v)`` as its marginal. One **label step** is two exact Gibbs draws in
that joint, the bits held fixed:

* every label from its conditional ``p(z_j = k) ∝ v_k N(x_j; mu_k, sigma^2 I)`` (the points' responsibilities);
* every mean from its Gaussian conditional given the points labelled with it (the prior's precision plus
  ``c_k / sigma^2`` for ``c_k`` points): an inactive mean has none, so it is a fresh draw from its prior;

and the labels are dropped. So the step leaves ``p(mu, v)`` invariant (data augmentation, Tanner and Wong,
1987). It moves all active means together, at ``O(n M)`` per step, where the single-site sweep's moves update one
mean at a time against the others' current positions. It also draws the inactive means afresh, where the
single-site sweep only random-walks them. Their prior terms are in the log joint: on a held-out 16 x 1000 GMM
split-merge's chains (before these draws) still held them 0.47 nats per mean above their prior's expected log density
after 8 s, about 5 nats of log joint, which set the level other samplers were timed to. On a held-out 20 x 240 GMM,
a neural sampler's chains reached the right mixtures after about 3 transitions but sat 5-20 nats below the
posterior's typical log joint for 5-10 more, with every mean off its conditional: that relaxation is what these
steps speed up.

Both GMM kernels (:class:`~neuralblock.NeuralBlockKernel`, :class:`~neuralblock.kernels.split_merge.SplitMergeGMM`)
end every transition of CPU states with ``label_steps=2`` of them: each compiled single-site sweep, each round of
pairs and each split-merge sweep (not the neural sweeps of a tempered kernel, or of the chains a replica-exchange
ladder splits off with ``neural_rows``). On fresh GMMs of 240 and 1000 points they took the neural sampler to
split-merge's level in about half its time without them (``experiments/results/gmm_scale/README.md``, session 64).

The random numbers come from torch's global RNG, drawn before the loop (:func:`draw_label_randoms`); the
tests compare the steps' draws with the exact posterior of tiny GMMs.

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
    >>> from neuralblock.kernels.mixture_sites import MixtureSites
    >>> fg = gmm_graph(torch.randn(30, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> moves = MixtureLabelMoves(MixtureSites.of(fg), steps=2)
    >>> state = torch.stack([gmm_initial_state(fg), gmm_initial_state(fg)])
    >>> new = moves.move(state)
    >>> new.shape, bool((new[:, moves.sites.active_ids] == state[:, moves.sites.active_ids]).all())  # bits kept
    (torch.Size([2, 72]), True)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from neuralblock.kernels.jit import _compiled, _half_sq_distance, timed_first_call
from neuralblock.kernels.mixture_sites import MixtureSites

__all__ = ["LabelRandoms", "MixtureLabelMoves", "check_label_steps", "draw_label_randoms"]


class LabelRandoms(NamedTuple):
    """The random numbers (float64) of ``S`` label steps of ``K`` chains: ``label_u`` ``[K, S, n]`` uniforms of
    the labels' draws and ``normals`` ``[K, S, m, D]`` standard normals of the means' draws."""

    label_u: Tensor
    normals: Tensor


def draw_label_randoms(chains: int, steps: int, points: int, mixtures: int, dim: int) -> LabelRandoms:
    """The :class:`LabelRandoms` of ``steps`` label steps from torch's global RNG, in this order.

    Example:
        >>> draws = draw_label_randoms(2, 3, 10, 4, 2)
        >>> draws.label_u.shape, draws.normals.shape
        (torch.Size([2, 3, 10]), torch.Size([2, 3, 4, 2]))
    """
    label_u = torch.rand(chains, steps, points, dtype=torch.float64)
    normals = torch.randn(chains, steps, mixtures, dim, dtype=torch.float64)
    return LabelRandoms(label_u, normals)


def check_label_steps(steps: object) -> int:
    """``steps`` as a number of label steps (0: none): the kernels' ``label_steps``, per transition.

    Example:
        >>> check_label_steps(2)
        2

    Raises:
        TypeError: ``steps`` is not an integer.
        ValueError: it is negative.
    """
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer):
        raise TypeError(f"label_steps must be an integer, got {type(steps).__name__}")
    if steps < 0:
        raise ValueError(f"label_steps must be at least 0, got {steps}")
    return int(steps)


@_compiled
def _label_steps(state, mean_ids, active_ids, points, sigma, whitened_loc, whitened_precision, label_u, normals):
    chains, steps, n = label_u.shape
    m, dim = mean_ids.shape
    active = np.empty(m, dtype=np.int64)
    means = np.empty((m, dim))  # whitened (in units of sigma), as the points
    weights = np.empty(m)
    counts = np.empty(m)
    sums = np.empty((m, dim))
    for k in range(chains):
        size = 0
        for mixture in range(m):
            if state[k, active_ids[mixture]] > 0:
                active[size] = mixture
                size += 1
        for step in range(steps):
            for mixture in range(m):  # every inactive mean from its conditional: its prior (no point is its)
                if state[k, active_ids[mixture]] > 0:
                    continue
                for d in range(dim):
                    precision = whitened_precision[mixture, d]
                    state[k, mean_ids[mixture, d]] = (
                        whitened_loc[mixture, d] + normals[k, step, mixture, d] / math.sqrt(precision)
                    ) * sigma
            if size == 0:
                continue
            for i in range(size):
                counts[i] = 0.0
                for d in range(dim):
                    means[i, d] = state[k, mean_ids[active[i], d]] / sigma
                    sums[i, d] = 0.0
            for j in range(n):  # the label of point j, by inversion of its responsibilities
                top = -math.inf
                for i in range(size):
                    weights[i] = _half_sq_distance(points[j], means[i])
                    if weights[i] > top:
                        top = weights[i]
                total = 0.0
                for i in range(size):
                    weights[i] = math.exp(weights[i] - top)
                    total += weights[i]
                target = label_u[k, step, j] * total
                label = size - 1  # (where rounding leaves the running sum short of the target)
                running = 0.0
                for i in range(size):
                    running += weights[i]
                    if target < running:
                        label = i
                        break
                counts[label] += 1.0
                for d in range(dim):
                    sums[label, d] += points[j, d]
            for i in range(size):  # every active mean from its conditional given its points
                mixture = active[i]
                for d in range(dim):
                    precision = counts[i] + whitened_precision[mixture, d]
                    center = (sums[i, d] + whitened_loc[mixture, d] * whitened_precision[mixture, d]) / precision
                    # (stored in the state's dtype: the next step reads the rounded value, as the state holds it)
                    state[k, mean_ids[mixture, d]] = (
                        center + normals[k, step, mixture, d] / math.sqrt(precision)
                    ) * sigma


class MixtureLabelMoves:
    """Label steps (see the module docstring) of a graph :class:`MixtureSites` covers.

    Args:
        sites: the graph's compiled single-site sweep (its points, sigma and priors).
        steps: label steps per :meth:`move` (at least 1).

    Raises:
        ValueError: ``steps`` below 1.
        TypeError: ``steps`` not an integer.
    """

    def __init__(self, sites: MixtureSites, steps: int = 2) -> None:
        if check_label_steps(steps) < 1:
            raise ValueError(f"label steps must be at least 1 (without them build no MixtureLabelMoves), got {steps}")
        self.sites = sites
        self.steps = int(steps)
        self.compile_seconds = 0.0  # the compiled loop's first call of each state dtype
        self._layouts: set[tuple] = set()
        self._mean_columns = torch.from_numpy(sites.mean_ids.reshape(-1))  # (the state's columns of the means)
        self._width = int(max(sites.mean_ids.max(), sites.active_ids.max())) + 1  # the least state width read

    def move(self, state: Tensor, draws: LabelRandoms | None = None) -> Tensor:
        """The CPU states ``[..., N]`` after :attr:`steps` label steps (``draws`` default to
        :func:`draw_label_randoms`)."""
        sites = self.sites
        m, dim = sites.mean_ids.shape
        n = sites.points.shape[0]
        if state.device.type != "cpu":
            raise ValueError(f"label steps run on CPU states only, got a state on {state.device}")
        width = self._width
        if state.dim() == 0 or state.shape[-1] < width:
            raise ValueError(
                f"states must be [..., N] with N >= {width} (the graph's variables), got {tuple(state.shape)}"
            )
        batch = state.reshape(-1, state.shape[-1])
        if not torch.isfinite(batch[:, self._mean_columns]).all():
            raise ValueError("label steps need finite means (a state holds NaN or inf)")
        chains = batch.shape[0]
        if draws is None:
            draws = draw_label_randoms(chains, self.steps, n, m, dim)
        wanted = ((chains, self.steps, n), (chains, self.steps, m, dim))
        if tuple(tuple(d.shape) for d in draws) != wanted or any(d.dtype != torch.float64 for d in draws):
            raise ValueError(f"draws must be float64 arrays of shapes {wanted} for {chains} states")
        if not math.isfinite(sites.sigma):
            raise ValueError(f"sigma must be finite, got {sites.sigma}")
        out = batch.detach().clone().contiguous()
        args = (
            out.numpy(), sites.mean_ids, sites.active_ids, sites.points, sites.sigma, sites.whitened_loc,
            sites.whitened_precision, draws.label_u.numpy(), draws.normals.numpy(),
        )  # fmt: skip
        _, seconds = timed_first_call(self._layouts, (out.dtype,), _label_steps, *args)
        self.compile_seconds += seconds
        return out.reshape(state.shape)
