"""A compiled CPU sweep (Numba) of :class:`~neuralblock.kernels.split_merge.SplitMergeGMM`'s moves: every attempt
of every chain in one call.

The eager moves (:func:`~neuralblock.kernels.split_merge.propose_moves` and the scaffold energy) cost 3.8-4.6 ms
per batched attempt of 5 chains at n = 60 points (m = 8-32 mixtures), about 200 torch calls on a few thousand
arithmetic operations per chain, and 34-39 ms at n = 1000; a split-merge sweep makes ``m (m - 1) / 2`` attempts
(19 s at 32 x 1000). Here one compiled loop takes each chain's attempts in order, with the same moves, the same
densities and the same exact MH test: per attempt it draws the move type and mixtures, builds the forward
proposal from the current state, draws the new means, builds the reverse proposal from the proposed state,
scores both, and takes the energy change from the points' mixture factors, the means' Gaussian priors and the
bits' own factors. Each chain keeps its terms ``-|x_j - mu_k|^2 / 2 sigma^2`` (mixture by point) and their
log-sum over the active mixtures, so an attempt costs ``O(n m)`` (``O(n s)`` for births and deaths, ``s`` the
birth's seed points: :attr:`~neuralblock.kernels.split_merge.MoveTuning.birth_seeds`).

The arithmetic is in float64; where the state is float32, a drawn mean is rounded to float32 before it is
scored, so that the state holds exactly the value scored. The random numbers come from torch's global RNG,
drawn before the loop (:func:`draw_attempts`): five uniforms per attempt (the move type, two choices of
mixtures, the proposal's component, the test) and the new means' normals. A move type or mixture is drawn by
inverse CDF where the eager moves take an argmax of noise: the same distribution, other numbers; the tests
(``tests/test_jit_split_merge.py``) compare the two functions' densities and energies on the same moves and
check the compiled sweep against the enumerated posterior.

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph
    >>> from neuralblock.kernels.split_merge import MoveTuning, mixture_layout
    >>> fg = gmm_graph(torch.tensor([[-3.0, 0.0], [-2.5, 0.5], [3.0, 0.0]]), 4, 1.0, 4.0, 0.5)
    >>> arrays = sweep_arrays(fg, mixture_layout(fg), MoveTuning(), torch.full((6,), 1 / 6))
    >>> state = fg.initial_state()[None].double().numpy().copy()
    >>> state[0, arrays.active_ids] = [1.0, 0.0, 0.0, 0.0]
    >>> counts, nonfinite = split_merge_sweep(state, arrays, draw_attempts(1, 6, 2), round32=False)
    >>> counts.shape, int(counts[0].sum() + counts[2].sum()), bool(state[0, arrays.active_ids].sum() >= 1)
    ((3, 6), 6, True)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from neuralblock.graph import FactorGraph, GaussianMixtureGroup, LinearGaussianGroup
from neuralblock.kernels.jit import SUMMED_DIRECTLY, _compiled, _logaddexp
from neuralblock.kernels.jit_mixture import _log_sum_except

if TYPE_CHECKING:
    from neuralblock.kernels.split_merge import MixtureLayout, MoveTuning

__all__ = ["AttemptDraws", "SweepArrays", "draw_attempts", "move_scores", "split_merge_sweep", "sweep_arrays"]

SMART_SPLIT, DUMB_MERGE, DUMB_SPLIT, SMART_MERGE, BIRTH, DEATH = range(6)
_REVERSE = (DUMB_MERGE, SMART_SPLIT, SMART_MERGE, DUMB_SPLIT, DEATH, BIRTH)
_POORLY_EXPLAINED = -3.0  # as split_merge's
_POINT_FLOOR = 0.01
_EXPLAINED_FLOOR = -1e4
_NO_MIXTURE = np.int64(-1)  # "no mixture" for _member and the log-sums (int64, not a literal: one signature)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_UNIFORMS = 5  # per attempt: move type, first and second choice, component, test


class SweepArrays(NamedTuple):
    """A graph's open-universe GMM as the compiled sweep reads it (:func:`sweep_arrays`).

    Attributes:
        point_ids: ``[n, D]`` variable ids of the points; ``mean_ids``: ``[m, D]``; ``active_ids``: ``[m]``.
        movable: ``[m]`` mixtures the moves may change.
        prior_loc, prior_scale: ``[m, D]`` the means' ``N(c, tau^2)`` priors.
        bit_log_prob: ``[m, 2]`` the log of each bit's own factors at ``v = 0`` and ``v = 1``.
        sigma: the points' standard deviation.
        tuning: ``[5]`` split scale, dumb scale, merge bandwidth, birth radius, birth prior weight.
        birth_seeds: most seed points of a birth.
        move_log_probs: ``[6]`` log-probability of each move type; ``kind_cdf``: ``[6]`` their CDF (``inf`` from
            the last type of positive probability on).
    """

    point_ids: np.ndarray
    mean_ids: np.ndarray
    active_ids: np.ndarray
    movable: np.ndarray
    prior_loc: np.ndarray
    prior_scale: np.ndarray
    bit_log_prob: np.ndarray
    sigma: float
    tuning: np.ndarray
    birth_seeds: int
    move_log_probs: np.ndarray
    kind_cdf: np.ndarray


class AttemptDraws(NamedTuple):
    """The random numbers of a sweep: ``uniforms [K, A, 5]`` and ``normals [K, A, 2, D]`` (float64)."""

    uniforms: np.ndarray
    normals: np.ndarray


def draw_attempts(chains: int, attempts: int, dim: int) -> AttemptDraws:
    """The random numbers of ``attempts`` move attempts of ``chains`` chains, from torch's global RNG.

    Example:
        >>> draws = draw_attempts(2, 3, 2)
        >>> draws.uniforms.shape, draws.normals.shape
        ((2, 3, 5), (2, 3, 2, 2))
    """
    uniforms = torch.rand(chains, attempts, _UNIFORMS, dtype=torch.float64)
    normals = torch.randn(chains, attempts, 2, dim, dtype=torch.float64)
    return AttemptDraws(uniforms.numpy(), normals.numpy())


def _bit_log_probs(fg: FactorGraph, layout: MixtureLayout) -> np.ndarray | None:
    """``[m, 2]``: each bit's own factors at 0 and 1; None where a mixture's scaffold has another kind of factor.

    The compiled energy knows three kinds: the mixture group's factors, a mean coordinate's parentless
    Gaussian prior (``layout.prior_loc``, ``layout.prior_scale``) and factors of one bit alone.
    """
    m = len(layout.active)
    blocks = torch.cat([layout.means, layout.active[:, None]], 1)
    scaffold = fg.scaffold(blocks)
    bit_of = {int(v): k for k, v in enumerate(layout.active.tolist())}
    means = set(layout.means.reshape(-1).tolist())
    table = torch.zeros(m, 2, dtype=torch.float64)
    for group, index in zip(fg.groups, scaffold.group_index):
        rows = torch.unique(index)
        if rows.numel() == 0 or isinstance(group, GaussianMixtureGroup):
            continue
        if isinstance(group, LinearGaussianGroup):
            parentless = bool((group.parents[rows] < 0).all())
            if parentless and set(group.child[rows].tolist()) <= means:
                continue  # the means' priors: in layout.prior_loc / prior_scale
            return None
        if not isinstance(getattr(group, "scopes", None), torch.Tensor):
            return None
        scopes = group.scopes[rows]
        real = scopes[:, 1:] if scopes.shape[1] > 1 else scopes[:, :0]
        if bool((real >= 0).any()) or any(int(v) not in bit_of for v in scopes[:, 0].tolist()):
            return None  # a factor that reads more than one bit
        for value in (0, 1):
            state = fg.initial_state()
            state[layout.active] = float(value)
            values = group.log_factors(state, rows).double()
            mixtures = torch.tensor([bit_of[int(v)] for v in scopes[:, 0].tolist()])
            table[:, value].index_add_(0, mixtures, values)
    return table.numpy()


def sweep_arrays(
    fg: FactorGraph, layout: MixtureLayout, tuning: MoveTuning, move_probs: torch.Tensor
) -> SweepArrays | None:
    """The compiled sweep's view of ``fg`` (None where its mixtures' scaffolds hold a factor it does not know).

    Args:
        fg: the graph.
        layout: its :func:`~neuralblock.kernels.split_merge.mixture_layout`.
        tuning: the moves' shape parameters.
        move_probs: ``[6]`` probability of each move type (in :data:`~neuralblock.kernels.split_merge.MOVES` order).
    """
    bits = _bit_log_probs(fg, layout)
    if bits is None:
        return None
    probs = move_probs.double()
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs.numpy())
    tune = np.array(
        [tuning.split_scale, tuning.dumb_scale, tuning.merge_bandwidth, tuning.birth_radius, tuning.birth_prior_weight]
    )
    cdf = np.cumsum(probs.numpy())
    cdf[int(np.flatnonzero(probs.numpy() > 0)[-1]) :] = np.inf  # the last possible type takes all of the rest
    return SweepArrays(
        layout.points.numpy().astype(np.int64),
        layout.means.numpy().astype(np.int64),
        layout.active.numpy().astype(np.int64),
        layout.movable.numpy().copy(),
        layout.prior_loc.double().numpy().copy(),
        layout.prior_scale.double().numpy().copy(),
        bits,
        float(layout.sigma),
        tune,
        int(tuning.birth_seeds),
        log_probs,
        cdf,
    )


# ------------------------------------------------------------------------------ compiled pieces
@_compiled
def _member(u, mask, skip):
    """The ``floor(u c)``-th index where ``mask`` holds (``c`` such indices, ``skip`` left out); -1 if none."""
    count = 0
    for k in range(mask.shape[0]):
        if mask[k] and k != skip:
            count += 1
    if count == 0:
        return -1
    target = min(int(u * count), count - 1)
    for k in range(mask.shape[0]):
        if mask[k] and k != skip:
            if target == 0:
                return k
            target -= 1
    return -1


@_compiled
def _pair_logits(mu, usable, bandwidth, out):
    """Fill ``out [m, m]`` with the smart merge's normalized log-probabilities of ordered pairs; their count."""
    m = mu.shape[0]
    top = -math.inf
    count = 0
    for a in range(m):
        for b in range(m):
            out[a, b] = -math.inf
            if a != b and usable[a] and usable[b]:
                s = 0.0
                for d in range(mu.shape[1]):
                    diff = mu[a, d] - mu[b, d]
                    s += diff * diff
                out[a, b] = -0.5 * s / (bandwidth * bandwidth)
                top = max(top, out[a, b])
                count += 1
    if count == 0:
        return 0
    acc = 0.0
    for a in range(m):
        for b in range(m):
            if out[a, b] > -math.inf:
                acc += math.exp(out[a, b] - top)
    norm = top + math.log(acc)
    for a in range(m):
        for b in range(m):
            if out[a, b] > -math.inf:
                out[a, b] -= norm
    return count


@_compiled
def _choice_log_prob(kind, on, movable, mu, i, j, bandwidth, pairs):
    """log-probability of drawing mixtures ``(i, j)`` for a move of type ``kind`` in a state with bits ``on``."""
    n_on = 0
    n_off = 0
    for k in range(on.shape[0]):
        if movable[k]:
            if on[k]:
                n_on += 1
            else:
                n_off += 1
    if kind == SMART_MERGE:
        usable = on & movable
        _pair_logits(mu, usable, bandwidth, pairs)
        return pairs[i, j]
    if kind == DEATH:
        return -math.log(n_on)
    if kind == DUMB_MERGE:
        return -math.log(n_on) - math.log(n_on - 1)
    if kind == BIRTH:
        return -math.log(n_off)
    return -math.log(n_on) - math.log(n_off)


@_compiled
def _top_eigenvector(cov, out):
    """The eigenvector of the largest eigenvalue of the symmetric ``cov [D, D]`` (cyclic Jacobi), into ``out``."""
    dim = cov.shape[0]
    a = cov.copy()
    v = np.eye(dim)
    for _ in range(50):
        off = 0.0
        diagonal = 0.0
        for p in range(dim):
            diagonal += a[p, p] * a[p, p]
            for q in range(p + 1, dim):
                off += a[p, q] * a[p, q]
        if off <= 1e-30 * diagonal:
            break
        for p in range(dim):
            for q in range(p + 1, dim):
                if a[p, q] == 0.0:
                    continue
                theta = (a[q, q] - a[p, p]) / (2.0 * a[p, q])
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1.0))
                c = 1.0 / math.sqrt(t * t + 1.0)
                s = t * c
                for k in range(dim):
                    akp, akq = a[k, p], a[k, q]
                    a[k, p] = c * akp - s * akq
                    a[k, q] = s * akp + c * akq
                for k in range(dim):
                    apk, aqk = a[p, k], a[q, k]
                    a[p, k] = c * apk - s * aqk
                    a[q, k] = s * apk + c * aqk
                for k in range(dim):
                    vkp, vkq = v[k, p], v[k, q]
                    v[k, p] = c * vkp - s * vkq
                    v[k, q] = s * vkp + c * vkq
    best = 0
    for k in range(1, dim):
        if a[k, k] > a[best, best]:
            best = k
    for k in range(dim):
        out[k] = v[k, best]


@_compiled
def _split_params(x, col_i, lse, on_i, mu_i, sigma, split_scale, log_w, loc, scale):
    """Smart split of mixture ``i`` (its terms ``col_i``): two orders of two means around the halves of its points."""
    n, dim = x.shape
    w = np.zeros(n)
    total = 1.0
    if on_i:
        for q in range(n):
            w[q] = math.exp(col_i[q] - lse[q]) if lse[q] > -math.inf else 0.0
            total += w[q]
    mean = np.empty(dim)
    for d in range(dim):
        acc = mu_i[d]
        for q in range(n):
            acc += w[q] * x[q, d]
        mean[d] = acc / total
    cov = np.zeros((dim, dim))
    for q in range(n):
        for a in range(dim):
            for b in range(dim):
                cov[a, b] += w[q] * (x[q, a] - mean[a]) * (x[q, b] - mean[b])
    for a in range(dim):
        cov[a, a] += sigma * sigma
        for b in range(dim):
            cov[a, b] /= total
    axis = np.empty(dim)
    _top_eigenvector(cov, axis)
    counts = np.ones(2)
    centres = np.zeros((2, dim))
    for d in range(dim):
        centres[0, d] = mean[d] + sigma * axis[d]
        centres[1, d] = mean[d] - sigma * axis[d]
    for q in range(n):
        proj = 0.0
        for d in range(dim):
            proj += (x[q, d] - mean[d]) * axis[d]
        side = 1.0 / (1.0 + math.exp(-3.0 * proj / sigma))
        h0, h1 = w[q] * side, w[q] * (1.0 - side)
        counts[0] += h0
        counts[1] += h1
        for d in range(dim):
            centres[0, d] += h0 * x[q, d]
            centres[1, d] += h1 * x[q, d]
    for order in range(2):
        log_w[order] = -math.log(2.0)
        for s in range(2):
            half = s if order == 0 else 1 - s
            for d in range(dim):
                loc[order, s, d] = centres[half, d] / counts[half]
                scale[order, s, d] = split_scale * sigma / math.sqrt(counts[half])
    return 2


@_compiled
def _merge_params(x, col_i, col_j, lse, mu_i, mu_j, prior_loc_j, prior_scale_j, sigma, split_scale, log_w, loc, scale):
    """Merge of ``j`` into ``i`` (both active): ``mu_i`` around their points' centroid, ``mu_j`` from its prior."""
    n, dim = x.shape
    total = 1.0
    centre = np.empty(dim)
    for d in range(dim):
        centre[d] = 0.5 * (mu_i[d] + mu_j[d])
    for q in range(n):
        w = math.exp(col_i[q] - lse[q]) + math.exp(col_j[q] - lse[q])
        total += w
        for d in range(dim):
            centre[d] += w * x[q, d]
    log_w[0] = 0.0
    for d in range(dim):
        loc[0, 0, d] = centre[d] / total
        scale[0, 0, d] = split_scale * sigma / math.sqrt(total)
        loc[0, 1, d] = prior_loc_j[d]
        scale[0, 1, d] = prior_scale_j[d]
    return 1


@_compiled
def _buffers(m, n, dim, seeds):
    """Work arrays of one chain's attempts: a proposal's components, the smart merge's pairs and the birth cache.

    The birth proposal from a state depends on the state alone (its last, prior component on ``j``): it is kept
    per state, slot ``m`` for the current state and slot ``j`` for the current state less mixture ``j`` (a death's
    reverse), until a move is accepted (:func:`_forget_births`).
    """
    width = max(2, min(n, seeds) + 1)
    return (
        np.empty(width),  # 0: log weights of the components
        np.empty((width, 2, dim)),  # 1: their means
        np.empty((width, 2, dim)),  # 2: their scales
        np.empty((m, m)),  # 3: the smart merge's pair log-probabilities
        np.zeros(m + 1, dtype=np.bool_),  # 4: birth cache slots in use
        np.empty((m + 1, width)),  # 5: cached log weights of the seeds
        np.empty((m + 1, width, dim)),  # 6: cached centres
        np.empty((m + 1, width)),  # 7: cached scales
    )


@_compiled
def _forget_births(buf):
    """Empty the birth cache (the state changed)."""
    buf[4][:] = False


@_compiled
def _birth_seeds(x, lse, slot, model, buf):
    """Fill birth cache ``slot`` from the per-point log-sums ``lse``: the seeds' log weights, centres and scales."""
    n, dim = x.shape
    sigma, tuning, seeds = model[4], model[5], model[6]
    split_scale, radius, prior_weight = tuning[0], tuning[3], tuning[4]
    log_w, centres, spread = buf[5][slot], buf[6][slot], buf[7][slot]
    explained = np.empty(n)
    poorly = np.empty(n)
    for q in range(n):
        explained[q] = max(lse[q], _EXPLAINED_FLOOR)
        poorly[q] = 1.0 / (1.0 + math.exp(-(_POORLY_EXPLAINED - explained[q])))
    if n > seeds:  # the least explained points (ties: the first)
        chosen = np.argsort(explained, kind="mergesort")[:seeds]
    else:
        chosen = np.arange(n)
    count = chosen.shape[0]
    for a in range(count):
        for d in range(dim):
            centres[a, d] = x[chosen[a], d]
    width = 1.0 / (radius * sigma) ** 2
    moved = np.empty(dim)
    for a in range(count):
        mass = 1.0
        for _ in range(2):  # two mean-shift steps
            mass = 1.0
            for d in range(dim):
                moved[d] = centres[a, d]
            for q in range(n):
                s = 0.0
                for d in range(dim):
                    diff = centres[a, d] - x[q, d]
                    s += diff * diff
                k = math.exp(-0.5 * s * width) * poorly[q]
                mass += k
                for d in range(dim):
                    moved[d] += k * x[q, d]
            for d in range(dim):
                centres[a, d] = moved[d] / mass
        spread[a] = split_scale * sigma / math.sqrt(mass)
    top = -math.inf
    for a in range(count):
        log_w[a] = math.log(poorly[chosen[a]] + _POINT_FLOOR)
        top = max(top, log_w[a])
    acc = 0.0
    for a in range(count):
        acc += math.exp(log_w[a] - top)
    norm = top + math.log(acc) - math.log1p(-prior_weight)
    for a in range(count):
        log_w[a] -= norm
    buf[4][slot] = True


@_compiled
def _birth_params(x, lse, j, slot, model, buf):
    """Birth of ``mu_j``: around the mean-shift centres of the most poorly explained points, or from its prior."""
    dim = x.shape[1]
    prior_loc, prior_scale, tuning, seeds = model[1], model[2], model[5], model[6]
    if not buf[4][slot]:
        _birth_seeds(x, lse, slot, model, buf)
    count = min(x.shape[0], seeds)
    log_w, loc, scale = buf[0], buf[1], buf[2]
    for a in range(count):
        log_w[a] = buf[5][slot, a]
        for d in range(dim):
            loc[a, 0, d] = buf[6][slot, a, d]
            scale[a, 0, d] = buf[7][slot, a]
    log_w[count] = math.log(tuning[4])
    for d in range(dim):
        loc[count, 0, d] = prior_loc[j, d]
        scale[count, 0, d] = prior_scale[j, d]
    return count + 1


@_compiled
def _move_params(kind, x, mu, on, i, j, col_i, col_j, lse, slot, model, buf):
    """The proposal of new means for a move ``kind`` on ``(i, j)`` from a state (``mu``, ``on``, the terms' columns).

    Fills the components ``buf[0] [C]`` (log weights), ``buf[1]`` and ``buf[2] [C, S, D]`` (means and scales;
    ``S = 2`` for pair moves: ``(mu_i, mu_j)``, 1 for births and deaths: ``mu_j``) and returns ``C``. ``slot``:
    the birth cache's slot of this state.
    """
    prior_loc, prior_scale, sigma, tuning = model[1], model[2], model[4], model[5]
    log_w, loc, scale = buf[0], buf[1], buf[2]
    if kind == SMART_SPLIT:
        return _split_params(x, col_i, lse, on[i], mu[i], sigma, tuning[0], log_w, loc, scale)
    if kind == DUMB_SPLIT:
        log_w[0] = 0.0
        for s in range(2):
            for d in range(x.shape[1]):
                loc[0, s, d] = mu[i, d]
                scale[0, s, d] = tuning[1] * sigma
        return 1
    if kind in (DUMB_MERGE, SMART_MERGE):
        return _merge_params(x, col_i, col_j, lse, mu[i], mu[j], prior_loc[j], prior_scale[j], sigma, tuning[0],
                             log_w, loc, scale)  # fmt: skip
    if kind == BIRTH:
        return _birth_params(x, lse, j, slot, model, buf)
    log_w[0] = 0.0  # death: mu_j from its prior
    for d in range(x.shape[1]):
        loc[0, 0, d] = prior_loc[j, d]
        scale[0, 0, d] = prior_scale[j, d]
    return 1


@_compiled
def _log_q(value, components, log_w, loc, scale, slots):
    """log density of the new means ``value [slots, D]`` under a proposal of ``components`` components."""
    dim = value.shape[1]
    terms = np.empty(components)
    for c in range(components):
        s = log_w[c]
        for a in range(slots):
            for d in range(dim):
                z = (value[a, d] - loc[c, a, d]) / scale[c, a, d]
                s += -0.5 * z * z - math.log(scale[c, a, d]) - _HALF_LOG_2PI
        terms[c] = s
    return _log_sum_except(terms, _NO_MIXTURE, _NO_MIXTURE)


@_compiled
def _terms_column(x, mean, sigma, out):
    """``out[q] = -|x_q - mean|^2 / 2 sigma^2``."""
    for q in range(x.shape[0]):
        s = 0.0
        for d in range(x.shape[1]):
            diff = (x[q, d] - mean[d]) / sigma
            s += diff * diff
        out[q] = -0.5 * s


@_compiled
def _log_sum_but(terms, on, q, skip_i, skip_j):
    """Log-sum of ``terms[k, q]`` over the active mixtures ``k`` but ``skip_i`` and ``skip_j`` (``-inf`` if none)."""
    top = -math.inf
    for k in range(terms.shape[0]):
        if on[k] and k != skip_i and k != skip_j and terms[k, q] > top:
            top = terms[k, q]
    if top == -math.inf:
        return -math.inf
    acc = 0.0
    for k in range(terms.shape[0]):
        if on[k] and k != skip_i and k != skip_j:
            acc += math.exp(terms[k, q] - top)
    return top + math.log(acc)


@_compiled
def _point_log_sums(terms, on, out):
    """``out[q]``: log-sum of ``terms[k, q]`` over the active mixtures ``k``."""
    for q in range(terms.shape[1]):
        out[q] = _log_sum_but(terms, on, q, _NO_MIXTURE, _NO_MIXTURE)


@_compiled
def _forward_log_q(kind, i, j, mu, on, value, components, model, buf):
    """log-probability of choosing move ``kind`` on ``(i, j)`` and proposing the new means ``value``."""
    movable, sigma, tuning, move_log_probs = model[0], model[4], model[5], model[7]
    slots = 1 if kind in (BIRTH, DEATH) else 2
    choice = _choice_log_prob(kind, on, movable, mu, i, j, tuning[2] * sigma, buf[3])
    return move_log_probs[kind] + choice + _log_q(value, components, buf[0], buf[1], buf[2], slots)


@_compiled
def _rest_log_sums(terms, on, lse, i, j, out):
    """``out[q]``: log-sum of ``terms[k, q]`` over the active mixtures but ``i`` and ``j``, from the full ``lse``.

    The pair's share is taken off the full sum (``lse``, summed term by term at the current state); where the rest
    holds under :data:`SUMMED_DIRECTLY` of it, the rest is summed term by term instead (a point the pair explains),
    so it keeps all but about three of its digits either way.
    """
    for q in range(terms.shape[1]):
        if lse[q] == -math.inf:
            out[q] = -math.inf
            continue
        share = 1.0
        if on[i]:
            share -= math.exp(terms[i, q] - lse[q])
        if on[j] and j != i:
            share -= math.exp(terms[j, q] - lse[q])
        if share > SUMMED_DIRECTLY:
            out[q] = lse[q] + math.log(share)
        else:
            out[q] = _log_sum_but(terms, on, q, i, j)


@_compiled
def _reverse_and_energy(kind, i, j, x, mu, on, terms, lse, new_mu, new_on, new_col_i, new_col_j, new_lse, model,
                        buf):  # fmt: skip
    """``(log q_rev, energy change)`` of a move from ``(mu, on)`` to ``(new_mu, new_on)``.

    Needs the new state's columns of ``i`` and ``j``; fills its per-point log-sums ``new_lse``.
    """
    movable, prior_loc, prior_scale, bit_log_prob = model[0], model[1], model[2], model[3]
    sigma, tuning, move_log_probs = model[4], model[5], model[7]
    n, dim = x.shape
    pair = kind not in (BIRTH, DEATH)
    old = np.empty((2, dim))
    for d in range(dim):
        old[0, d] = mu[i, d] if pair else mu[j, d]
        old[1, d] = mu[j, d]
    rest = np.empty(n)  # the new state's per-point log-sums: the other mixtures' and the move's own
    _rest_log_sums(terms, on, lse, i, j, rest)
    for q in range(n):
        acc = rest[q]
        if new_on[i] and i != j:
            acc = _logaddexp(acc, new_col_i[q])
        if new_on[j]:
            acc = _logaddexp(acc, new_col_j[q])
        new_lse[q] = acc
    reverse = _REVERSE[kind]
    components = _move_params(reverse, x, new_mu, new_on, i, j, new_col_i, new_col_j, new_lse, j, model, buf)
    choice = _choice_log_prob(reverse, new_on, movable, new_mu, i, j, tuning[2] * sigma, buf[3])
    log_q_rev = move_log_probs[reverse] + choice + _log_q(old, components, buf[0], buf[1], buf[2], 2 if pair else 1)
    count, new_count = 0, 0
    for k in range(on.shape[0]):
        if on[k]:
            count += 1
        if new_on[k]:
            new_count += 1
    if new_count == 0:
        return log_q_rev, -math.inf
    energy = n * (math.log(count) - math.log(new_count))
    for q in range(n):
        energy += new_lse[q] - lse[q]
    for which in range(2 if pair else 1):
        k = i if (pair and which == 0) else j
        for d in range(dim):
            z_new = (new_mu[k, d] - prior_loc[k, d]) / prior_scale[k, d]
            z_old = (mu[k, d] - prior_loc[k, d]) / prior_scale[k, d]
            energy += -0.5 * z_new * z_new + 0.5 * z_old * z_old
    energy += bit_log_prob[j, int(new_on[j])] - bit_log_prob[j, int(on[j])]
    return log_q_rev, energy


@_compiled
def _sample(components, log_w, loc, scale, u, normals, slots, round32, out):
    """Draw the new means ``out [slots, D]`` (component by inverse CDF of ``u``)."""
    top = -math.inf
    for c in range(components):
        top = max(top, log_w[c])
    total = 0.0
    for c in range(components):
        total += math.exp(log_w[c] - top)
    target = u * total
    chosen = components - 1
    acc = 0.0
    for c in range(components):
        acc += math.exp(log_w[c] - top)
        if target < acc:
            chosen = c
            break
    for a in range(slots):
        for d in range(out.shape[1]):
            value = loc[chosen, a, d] + scale[chosen, a, d] * normals[a, d]
            out[a, d] = np.float32(value) if round32 else value


@_compiled
def _choose(kind, on, movable, mu, u1, u2, bandwidth, pairs):
    """``(i, j)`` of a move of type ``kind`` (``(-1, -1)`` where it cannot apply)."""
    usable = on & movable
    free = np.logical_not(on) & movable
    n_on = 0
    total_on = 0
    for k in range(on.shape[0]):
        if usable[k]:
            n_on += 1
        if on[k]:
            total_on += 1
    if kind in (SMART_SPLIT, DUMB_SPLIT):
        i, j = _member(u1, usable, _NO_MIXTURE), _member(u2, free, _NO_MIXTURE)
        return (i, j) if i >= 0 and j >= 0 else (-1, -1)
    if kind == DUMB_MERGE:
        if n_on < 2:
            return -1, -1
        i = _member(u1, usable, _NO_MIXTURE)
        return i, _member(u2, usable, i)
    if kind == SMART_MERGE:
        if n_on < 2:
            return -1, -1
        m = on.shape[0]
        _pair_logits(mu, usable, bandwidth, pairs)
        acc = 0.0
        last = -1
        for a in range(m):
            for b in range(m):
                if pairs[a, b] > -math.inf:
                    acc += math.exp(pairs[a, b])
                    last = a * m + b
                    if u1 < acc:
                        return a, b
        return last // m, last % m
    if kind == BIRTH:
        j = _member(u1, free, _NO_MIXTURE)
        return j, j
    if n_on < 1 or total_on < 2:  # death: never of the last active mixture
        return -1, -1
    j = _member(u1, usable, _NO_MIXTURE)
    return j, j


@_compiled
def _sweep(states, point_ids, mean_ids, active_ids, model, kind_cdf, uniforms, normals, round32, counts):
    """Every attempt of every chain, in place on ``states [K, N]``; adds to ``counts [3, 6]``; returns non-finite."""
    movable, sigma, tuning, seeds = model[0], model[4], model[5], model[6]
    chains, attempts = uniforms.shape[0], uniforms.shape[1]
    n, dim = point_ids.shape
    m = mean_ids.shape[0]
    buf = _buffers(m, n, dim, seeds)
    nonfinite = 0
    for c in range(chains):
        state = states[c]
        x = np.empty((n, dim))
        for q in range(n):
            for d in range(dim):
                x[q, d] = state[point_ids[q, d]]
        mu = np.empty((m, dim))
        on = np.empty(m, dtype=np.bool_)
        terms = np.empty((m, n))
        for k in range(m):
            on[k] = state[active_ids[k]] > 0.5
            for d in range(dim):
                mu[k, d] = state[mean_ids[k, d]]
            _terms_column(x, mu[k], sigma, terms[k])
        lse = np.empty(n)
        _point_log_sums(terms, on, lse)
        _forget_births(buf)
        new_mu = mu.copy()
        new_on = on.copy()
        new_col_i = np.empty(n)
        new_col_j = np.empty(n)
        new_lse = np.empty(n)
        value = np.empty((2, dim))
        for a in range(attempts):
            u = uniforms[c, a]
            kind = 0
            while kind < 5 and u[0] >= kind_cdf[kind]:
                kind += 1
            i, j = _choose(kind, on, movable, mu, u[1], u[2], tuning[2] * sigma, buf[3])
            if i < 0:
                counts[2, kind] += 1
                continue
            counts[0, kind] += 1
            pair = kind not in (BIRTH, DEATH)
            components = _move_params(kind, x, mu, on, i, j, terms[i], terms[j], lse, m, model, buf)
            _sample(components, buf[0], buf[1], buf[2], u[3], normals[c, a], 2 if pair else 1, round32, value)
            log_q_fwd = _forward_log_q(kind, i, j, mu, on, value, components, model, buf)
            for k in range(m):
                new_on[k] = on[k]
                for d in range(dim):
                    new_mu[k, d] = mu[k, d]
            for d in range(dim):
                if pair:
                    new_mu[i, d] = value[0, d]
                    new_mu[j, d] = value[1, d]
                else:
                    new_mu[j, d] = value[0, d]
            new_on[j] = kind in (SMART_SPLIT, DUMB_SPLIT, BIRTH)
            _terms_column(x, new_mu[i], sigma, new_col_i)
            _terms_column(x, new_mu[j], sigma, new_col_j)
            log_q_rev, energy = _reverse_and_energy(
                kind, i, j, x, mu, on, terms, lse, new_mu, new_on, new_col_i, new_col_j, new_lse, model, buf
            )
            log_alpha = energy + log_q_rev - log_q_fwd
            if math.isnan(log_alpha) or log_alpha == math.inf:
                nonfinite += 1
                continue
            if math.log(u[4]) < log_alpha:
                counts[1, kind] += 1
                on[j] = new_on[j]
                for d in range(dim):
                    mu[i, d] = new_mu[i, d]
                    mu[j, d] = new_mu[j, d]
                for q in range(n):
                    terms[i, q] = new_col_i[q]
                    terms[j, q] = new_col_j[q]
                _point_log_sums(terms, on, lse)  # summed afresh: no rounding carried from move to move
                _forget_births(buf)
        for k in range(m):
            state[active_ids[k]] = 1.0 if on[k] else 0.0
            for d in range(dim):
                state[mean_ids[k, d]] = mu[k, d]
    return nonfinite


@_compiled
def _move_scores(kind, i, j, x, mu, on, new_mu, new_on, model):
    """``(log q_fwd, log q_rev, energy change)`` of one given move (:func:`move_scores`)."""
    n, dim = x.shape
    m = mu.shape[0]
    sigma = model[4]
    buf = _buffers(m, n, dim, model[6])
    terms = np.empty((m, n))
    for k in range(m):
        _terms_column(x, mu[k], sigma, terms[k])
    lse = np.empty(n)
    _point_log_sums(terms, on, lse)
    value = np.empty((2, dim))
    for d in range(dim):
        value[0, d] = new_mu[i, d] if kind not in (BIRTH, DEATH) else new_mu[j, d]
        value[1, d] = new_mu[j, d]
    components = _move_params(kind, x, mu, on, i, j, terms[i], terms[j], lse, m, model, buf)
    log_q_fwd = _forward_log_q(kind, i, j, mu, on, value, components, model, buf)
    cols = np.empty((2, n))
    _terms_column(x, new_mu[i], sigma, cols[0])
    _terms_column(x, new_mu[j], sigma, cols[1])
    log_q_rev, energy = _reverse_and_energy(
        kind, i, j, x, mu, on, terms, lse, new_mu, new_on, cols[0], cols[1], np.empty(n), model, buf
    )
    return log_q_fwd, log_q_rev, energy


def _model(arrays: SweepArrays) -> tuple:
    """The model's arrays and constants in the order the compiled functions read them (``model[k]``)."""
    return (
        arrays.movable,  # 0
        arrays.prior_loc,  # 1
        arrays.prior_scale,  # 2
        arrays.bit_log_prob,  # 3
        arrays.sigma,  # 4
        arrays.tuning,  # 5
        arrays.birth_seeds,  # 6
        arrays.move_log_probs,  # 7
    )


def split_merge_sweep(
    states: np.ndarray, arrays: SweepArrays, draws: AttemptDraws, round32: bool
) -> tuple[np.ndarray, int]:
    """Run every move attempt of ``draws`` on ``states [K, N]`` (float64, changed in place).

    Args:
        states: the chains' states.
        arrays: :func:`sweep_arrays` of their graph.
        draws: :func:`draw_attempts` (``K`` chains, the attempts per chain).
        round32: round every drawn mean to float32 before scoring it (the kernel's state is float32).

    Returns:
        ``(counts [3, 6], nonfinite)``: per move type the attempts proposed, accepted and unavailable, and the
        number of non-finite MH ratios (rejected).
    """
    counts = np.zeros((3, 6), dtype=np.int64)
    nonfinite = _sweep(
        states, arrays.point_ids, arrays.mean_ids, arrays.active_ids, _model(arrays), arrays.kind_cdf,
        draws.uniforms, draws.normals, round32, counts,
    )  # fmt: skip
    return counts, int(nonfinite)


def move_scores(
    arrays: SweepArrays, kind: int, mixtures: tuple[int, int], state: np.ndarray, proposed: np.ndarray
) -> tuple[float, float, float]:
    """``(log q_fwd, log q_rev, energy change)`` of one given move from ``state [N]`` to ``proposed [N]``.

    The compiled sweep's scores of a move, for tests against the eager functions.
    """
    i, j = mixtures
    mu, new_mu = state[arrays.mean_ids], proposed[arrays.mean_ids]
    on, new_on = state[arrays.active_ids] > 0.5, proposed[arrays.active_ids] > 0.5
    out = _move_scores(kind, i, j, state[arrays.point_ids], mu, on, new_mu, new_on, _model(arrays))
    return float(out[0]), float(out[1]), float(out[2])
