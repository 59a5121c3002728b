"""Copy-set moves of an open-universe GMM: split several mixtures into copy pairs at once, or merge several pairs.

The GMM of :func:`motifs.gmm_pair.gmm_graph` weighs its ``M`` active mixtures equally, so a cluster's
weight is its number of copies over ``M``. Where the clusters' sizes differ, the posterior puts more copies
on the large ones; and a state where every cluster has two copies keeps the weights of the state with one
copy each. Changing one cluster's copies changes every weight, so one birth or death at a time can face a
barrier of many nats at ``n = 1000`` (on a 20 x 1000 model case with 7 clusters, each of the 14 one-death
neighbours of the doubled true state lies at least 13.8 nats below it, while the true state lies 4.9 nats
above). These moves change the copies of several clusters in one MH step.

A **copy pair** of a state is two active mixtures that are each other's nearest active mixture, closer than
``radius`` (in units of sigma). One move, with probability 1/2 each:

* **split** ``k`` mixtures: ``k`` uniform in ``1 .. min(active, inactive)``, a uniform ``k``-subset of the
  active mixtures, each paired with a distinct inactive mixture (a uniform ordered choice). Mixture ``s`` at
  ``mu`` becomes the pair ``mu - u, mu + u`` (``s`` and its partner, now active), with
  ``u ~ N(0, h_s^2 I)``, ``h_s = width sigma (c_s + 1)^(-1/4)`` and ``c_s`` the points' soft count of ``s``
  (the spread of two copies' difference shrinks as ``c^(-1/4)``: it is identified by the points' variance
  only). Every new pair must be a copy pair of the new state, or the move is rejected.
* **merge** ``k`` copy pairs: ``k`` uniform in ``1 .. pairs``, a uniform ``k``-subset of the copy pairs, in
  each a uniform survivor, which moves to the pair's midpoint; the other turns inactive with a mean drawn
  from its prior.

The MH ratio has both directions' selection probabilities, the Gaussian density of ``u`` (at the merged
state's soft counts), the prior density of the inactive means drawn or dropped, and the Jacobian ``2^D``
per pair. Proposed means are rounded to the state's dtype and every term is computed from the stored
values; a split and the merge that undoes it give back the state up to that rounding (a unit in the last
place), as any deterministic move in floating point does. The tests check that exact posterior draws stay
exact after the moves (tiny GMMs, closed-form posterior).

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
    >>> fg = gmm_graph(torch.randn(30, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> moves = MixtureCopyMoves.of(fg)
    >>> state = torch.stack([gmm_initial_state(fg), gmm_initial_state(fg)])
    >>> new, outcome = moves.move(state)
    >>> new.shape, outcome.shape  # 2 chains, 8 attempts each: an outcome code per chain and attempt
    (torch.Size([2, 72]), torch.Size([2, 8]))
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from neuralblock.graph import FactorGraph
from neuralblock.kernels.jit import _compiled, _half_sq_distance, timed_first_call
from neuralblock.kernels.mixture_sites import MixtureSites

__all__ = ["CopyRandoms", "MixtureCopyMoves", "draw_copy_randoms", "OUTCOMES"]

OUTCOMES = ("none", "split rejected", "split accepted", "merge rejected", "merge accepted")
"""The outcome codes of one attempt (``none``: no move possible, e.g. a merge without copy pairs)."""


class CopyRandoms(NamedTuple):
    """The random numbers of ``A`` attempts per chain (float64): ``kind_u``, ``count_u`` and ``log_u`` ``[K, A]``
    (split or merge, how many, the MH test), ``keys`` and ``side_u`` ``[K, A, m]`` (the random order of the
    mixtures, each merged pair's survivor), ``normals`` ``[K, A, m, D]`` (the splits' ``u``, the merges' prior
    draws)."""

    kind_u: Tensor
    count_u: Tensor
    keys: Tensor
    side_u: Tensor
    normals: Tensor
    log_u: Tensor


def draw_copy_randoms(chains: int, attempts: int, mixtures: int, dim: int) -> CopyRandoms:
    """:class:`CopyRandoms` from torch's global RNG, in this order.

    Example:
        >>> draws = draw_copy_randoms(2, 3, 4, 2)
        >>> draws.kind_u.shape, draws.keys.shape, draws.normals.shape
        (torch.Size([2, 3]), torch.Size([2, 3, 4]), torch.Size([2, 3, 4, 2]))
    """
    kind_u = torch.rand(chains, attempts, dtype=torch.float64)
    count_u = torch.rand(chains, attempts, dtype=torch.float64)
    keys = torch.rand(chains, attempts, mixtures, dtype=torch.float64)
    side_u = torch.rand(chains, attempts, mixtures, dtype=torch.float64)
    normals = torch.randn(chains, attempts, mixtures, dim, dtype=torch.float64)
    log_u = torch.rand(chains, attempts, dtype=torch.float64).log()
    return CopyRandoms(kind_u, count_u, keys, side_u, normals, log_u)


@_compiled
def _log_choose(total, k):
    """``log C(total, k)``."""
    return math.lgamma(total + 1.0) - math.lgamma(k + 1.0) - math.lgamma(total - k + 1.0)


@_compiled
def _energy(points, means, bits, sigma, prior_loc, prior_scale, log_odds, counts):
    """The log joint up to constants (points' factors, bits' log-odds, means' Gaussian priors) and each active
    mixture's soft count of the points (into ``counts``; 0 for inactive mixtures). ``points`` are whitened
    (divided by sigma), ``means`` are not."""
    n, dim = points.shape
    m = means.shape[0]
    whitened = means / sigma
    terms = np.empty(m)
    active = 0.0
    energy = 0.0
    for mixture in range(m):
        counts[mixture] = 0.0
        if bits[mixture] > 0:
            active += 1.0
            energy += log_odds[mixture]
        for d in range(dim):
            z = (means[mixture, d] - prior_loc[mixture, d]) / prior_scale[mixture, d]
            energy -= 0.5 * z * z
    if active == 0.0:
        return -math.inf
    for j in range(n):
        top = -math.inf
        for mixture in range(m):
            if bits[mixture] > 0:
                terms[mixture] = _half_sq_distance(points[j], whitened[mixture])
                if terms[mixture] > top:
                    top = terms[mixture]
        total = 0.0
        for mixture in range(m):
            if bits[mixture] > 0:
                terms[mixture] = math.exp(terms[mixture] - top)
                total += terms[mixture]
        energy += top + math.log(total)
        for mixture in range(m):
            if bits[mixture] > 0:
                counts[mixture] += terms[mixture] / total
    return energy - n * math.log(active)


@_compiled
def _copy_pairs(means, bits, limit, partner):
    """Each active mixture's copy-pair partner (``-1``: none) into ``partner``; returns the number of pairs.

    ``limit``: the largest squared distance of a pair.
    """
    m, dim = means.shape
    nearest = np.full(m, -1)
    for a in range(m):
        partner[a] = -1
        if bits[a] <= 0:
            continue
        best = math.inf
        for b in range(m):
            if b == a or bits[b] <= 0:
                continue
            s = 0.0
            for d in range(dim):
                diff = means[a, d] - means[b, d]
                s += diff * diff
            if s < best:
                best, nearest[a] = s, b
        if best >= limit:
            nearest[a] = -1
    pairs = 0
    for a in range(m):
        b = nearest[a]
        if b >= 0 and nearest[b] == a:
            partner[a] = b
            if a < b:
                pairs += 1
    return pairs


@_compiled
def _split_log_density(u, scale):
    """``log N(u; 0, scale^2 I)``."""
    s = 0.0
    for d in range(u.shape[0]):
        z = u[d] / scale
        s += -0.5 * z * z - math.log(scale) - 0.5 * math.log(2.0 * math.pi)
    return s


@_compiled
def _copy_moves(
    state, mean_ids, active_ids, points, sigma, prior_loc, prior_scale, log_odds, radius, width,
    kind_u, count_u, keys, side_u, normals, log_u, outcome, log_ratios,
):  # fmt: skip
    chains, attempts = kind_u.shape
    m, dim = mean_ids.shape
    limit = (radius * sigma) ** 2
    means = np.empty((m, dim))
    bits = np.empty(m)
    new_means = np.empty((m, dim))
    new_bits = np.empty(m)
    counts = np.empty(m)
    new_counts = np.empty(m)
    partner = np.empty(m, dtype=np.int64)
    survivors = np.empty(m, dtype=np.int64)
    others = np.empty(m, dtype=np.int64)
    u = np.empty(dim)
    stored = np.empty(2, dtype=state.dtype)
    log2 = math.log(2.0)
    for k in range(chains):
        known = False  # whether `old` and `counts` are the current state's (kept until a move is taken)
        old = 0.0
        for attempt in range(attempts):
            outcome[k, attempt] = 0
            log_ratios[k, attempt] = math.nan
            for mixture in range(m):
                bits[mixture] = state[k, active_ids[mixture]]
                new_bits[mixture] = bits[mixture]
                for d in range(dim):
                    means[mixture, d] = state[k, mean_ids[mixture, d]]
                    new_means[mixture, d] = means[mixture, d]
            order = np.argsort(keys[k, attempt])
            active = np.int64(0)  # (int64 from the start: a literal 0 made Numba compile _log_choose twice)
            for mixture in range(m):
                if bits[mixture] > 0:
                    active += 1
            inactive = m - active
            split = kind_u[k, attempt] < 0.5
            log_ratio = 0.0  # log q(reverse) - log q(forward) + log |Jacobian|, then the energies
            if split:
                most = min(active, inactive)
                if most == 0:
                    continue
                count = min(1 + int(count_u[k, attempt] * most), most)
                if not known:
                    old = _energy(points, means, bits, sigma, prior_loc, prior_scale, log_odds, counts)
                    known = True
                a = 0
                b = 0
                for position in range(m):  # the first `count` active and inactive mixtures in key order
                    mixture = order[position]
                    if bits[mixture] > 0 and a < count:
                        survivors[a] = mixture
                        a += 1
                    elif bits[mixture] <= 0 and b < count:
                        others[b] = mixture
                        b += 1
                log_ratio += math.log(most) + _log_choose(active, count) + _log_choose(inactive, count)
                log_ratio += math.lgamma(count + 1.0) + count * dim * log2
                for i in range(count):
                    s, t = survivors[i], others[i]
                    scale = width * sigma * (counts[s] + 1.0) ** -0.25
                    for d in range(dim):
                        centre = means[s, d]
                        shift = scale * normals[k, attempt, i, d]
                        stored[0] = centre - shift
                        stored[1] = centre + shift
                        first, second = float(stored[0]), float(stored[1])
                        u[d] = 0.5 * (second - first)  # as the merge back reads it from the stored values
                        new_means[s, d], new_means[t, d] = first, second
                        z = (means[t, d] - prior_loc[t, d]) / prior_scale[t, d]  # its dropped mean's prior density
                        log_ratio += -0.5 * z * z - math.log(prior_scale[t, d]) - 0.5 * math.log(2.0 * math.pi)
                    log_ratio -= _split_log_density(u, scale)
                    new_bits[t] = 1.0
                pairs = _copy_pairs(new_means, new_bits, limit, partner)
                paired = True
                for i in range(count):
                    paired = paired and partner[survivors[i]] == others[i]
                if not paired:  # no merge could undo it
                    outcome[k, attempt] = 1
                    log_ratios[k, attempt] = -math.inf
                    continue
                log_ratio -= math.log(pairs) + _log_choose(pairs, count) + count * log2
                new = _energy(points, new_means, new_bits, sigma, prior_loc, prior_scale, log_odds, new_counts)
            else:
                pairs = _copy_pairs(means, bits, limit, partner)
                if pairs == 0:
                    continue
                count = min(1 + int(count_u[k, attempt] * pairs), pairs)
                if not known:
                    old = _energy(points, means, bits, sigma, prior_loc, prior_scale, log_odds, counts)
                    known = True
                chosen = 0
                for position in range(m):  # pairs in the order of their first member's key: a uniform order
                    a = order[position]
                    b = partner[a]
                    if b < 0 or chosen == count or bits[a] <= 0 or new_bits[a] <= 0 or new_bits[b] <= 0:
                        continue
                    s, t = (a, b) if side_u[k, attempt, chosen] < 0.5 else (b, a)
                    survivors[chosen], others[chosen] = s, t
                    for d in range(dim):
                        stored[0] = 0.5 * (means[s, d] + means[t, d])
                        new_means[s, d] = float(stored[0])
                        z = normals[k, attempt, chosen, d]
                        stored[1] = prior_loc[t, d] + prior_scale[t, d] * z
                        new_means[t, d] = float(stored[1])
                        z = (new_means[t, d] - prior_loc[t, d]) / prior_scale[t, d]
                        log_ratio -= -0.5 * z * z - math.log(prior_scale[t, d]) - 0.5 * math.log(2.0 * math.pi)
                    new_bits[t] = 0.0
                    chosen += 1
                log_ratio += math.log(pairs) + _log_choose(pairs, count) + count * log2
                new = _energy(points, new_means, new_bits, sigma, prior_loc, prior_scale, log_odds, new_counts)
                after = active - count
                most = min(after, inactive + count)
                log_ratio -= math.log(most) + _log_choose(after, count) + _log_choose(inactive + count, count)
                log_ratio -= math.lgamma(count + 1.0) + count * dim * log2
                for i in range(count):
                    s, t = survivors[i], others[i]
                    scale = width * sigma * (new_counts[s] + 1.0) ** -0.25
                    for d in range(dim):
                        u[d] = 0.5 * (means[t, d] - means[s, d])
                    log_ratio += _split_log_density(u, scale)
            log_ratio += new - old
            log_ratios[k, attempt] = log_ratio
            taken = log_ratio == log_ratio and log_ratio != math.inf and log_u[k, attempt] < log_ratio  # (as
            # mh_decide: a NaN or +inf ratio is rejected)
            outcome[k, attempt] = (2 if taken else 1) if split else (4 if taken else 3)
            if taken:
                old = new
                for mixture in range(m):
                    counts[mixture] = new_counts[mixture]
                    state[k, active_ids[mixture]] = new_bits[mixture]
                    for d in range(dim):
                        state[k, mean_ids[mixture, d]] = new_means[mixture, d]


class MixtureCopyMoves:
    """Copy-set moves (see the module docstring) of a graph :class:`MixtureSites` covers.

    Args:
        sites: the graph's compiled single-site sweep (its points, sigma and priors are read from it).
        radius: a copy pair's largest distance, in units of sigma.
        width: the splits' scale ``h = width sigma (c + 1)^(-1/4)``.
        attempts: moves per call (one call ends each compiled single-site sweep; 8 attempts add 0.7-0.9x the
            sweep's own time at 16 x 60 to 32 x 1000, ``benchmarks/gmm_single_site.py``, and about 1.5% of a pair
            sweep at 20 x 1000; 8 rather than 1 was chosen on two n = 1000 cases of the GMM benchmark).
    """

    def __init__(self, sites: MixtureSites, radius: float = 2.0, width: float = 1.0, attempts: int = 8) -> None:
        for name, value in (("radius", radius), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"attempts must be a positive int, got {attempts!r}")
        self.sites, self.radius, self.width, self.attempts = sites, float(radius), float(width), attempts
        self.compile_seconds = 0.0
        self._layouts: set[tuple] = set()
        self.tally = np.zeros(len(OUTCOMES), dtype=np.int64)  # attempts by outcome (see record)
        self.last_log_ratios = np.zeros((0, attempts))  # the last call's MH log ratios (NaN: no move possible)

    @classmethod
    def of(cls, fg: FactorGraph, **options: float) -> MixtureCopyMoves | None:
        """The moves of ``fg`` (``None`` where :meth:`MixtureSites.of` is ``None``).

        Example:
            >>> import torch
            >>> from motifs.gmm_pair import gmm_graph
            >>> MixtureCopyMoves.of(gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5)).radius
            2.0
        """
        sites = MixtureSites.of(fg)
        return None if sites is None else cls(sites, **options)  # type: ignore[arg-type]

    def acceptance(self) -> dict[str, float]:
        """Acceptance of the splits and merges recorded so far (:meth:`record`; NaN where none was).

        Example:
            >>> import torch
            >>> from motifs.gmm_pair import gmm_graph
            >>> moves = MixtureCopyMoves.of(gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5))
            >>> moves.acceptance()
            {'split': nan, 'merge': nan}
        """
        tally = self.tally

        def rate(rejected: int, accepted: int) -> float:
            tried = tally[rejected] + tally[accepted]
            return float(tally[accepted] / tried) if tried else math.nan

        return {"split": rate(1, 2), "merge": rate(3, 4)}

    def record(self, outcome: Tensor) -> None:
        """Add the outcome codes of :meth:`move` to the tally :meth:`acceptance` reads."""
        self.tally += np.bincount(outcome.reshape(-1).numpy(), minlength=len(OUTCOMES))

    def move(self, state: Tensor, draws: CopyRandoms | None = None) -> tuple[Tensor, Tensor]:
        """``attempts`` moves of each CPU state ``[..., N]``; the new states and the outcome codes ``[..., A]``
        (indices into :data:`OUTCOMES`). ``draws`` (for ``K`` states in all) default to :func:`draw_copy_randoms`.
        """
        sites = self.sites
        m, dim = sites.mean_ids.shape
        batch = state.reshape(-1, state.shape[-1])
        chains = batch.shape[0]
        if draws is None:
            draws = draw_copy_randoms(chains, self.attempts, m, dim)
        pair, full = (chains, self.attempts), (chains, self.attempts, m)
        wanted = (pair, pair, full, full, (*full, dim), pair)
        if tuple(tuple(d.shape) for d in draws) != wanted or any(d.dtype != torch.float64 for d in draws):
            raise ValueError(f"draws must be float64 arrays of shapes {wanted} for {chains} states")
        out = batch.detach().clone().contiguous()
        outcome = np.zeros(pair, dtype=np.int64)
        self.last_log_ratios = np.zeros(pair)
        args = (
            out.numpy(), sites.mean_ids, sites.active_ids, sites.points, sites.sigma, sites.prior_loc,
            sites.prior_scale, sites.log_odds, self.radius, self.width, *(d.numpy() for d in draws), outcome,
            self.last_log_ratios,
        )  # fmt: skip
        _, seconds = timed_first_call(self._layouts, (out.dtype,), _copy_moves, *args)
        self.compile_seconds += seconds
        return out.reshape(state.shape), torch.from_numpy(outcome).reshape(*state.shape[:-1], self.attempts)
