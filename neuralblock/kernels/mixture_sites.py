"""A compiled single-site sweep (Numba) of an open-universe GMM: Gibbs on each bit, MH on each mean.

On the general path (:class:`~neuralblock.kernels.single_site.SingleSiteSweep`) every variable of a
:func:`motifs.gmm_pair.gmm_graph` is its own colour class (each point's factor reads all mixtures), and each
class evaluates every point's factor over all ``m`` mixtures: ``O(n m)`` per variable, about 60 torch
scaffold evaluations per sweep at ``m = 20``. A variable of mixture ``l`` changes only the ``l``-th term of
each point's factor, so here one compiled loop keeps, per chain and point, the log-sum of the active
mixtures' terms and reads the other mixtures' share of a point once per mixture: ``O(n)`` per variable.

Per chain, mixture by mixture: the other mixtures' share ``r_j`` of every point (from the kept sums;
summed directly where mixture ``l`` holds over 99.9% of a point), then an exact Gibbs draw of the bit
``v_l`` from its two energies, then a random-walk MH update of each mean coordinate (Gaussian steps of the
adapted size; while ``v_l = 0`` only its prior moves it), then, while ``v_l = 1``, an informed MH move of the
whole mean, then the kept sums of every point.

The informed move proposes the Gaussian of one EM step: with ``w_j`` the responsibility of mixture ``l``
for point ``j`` at the current mean (its term against the other active mixtures' share ``r_j``), the
proposal is ``N(c, diag(1 / P))`` with ``P = sum_j w_j / sigma^2 + 1 / tau^2`` and ``c`` the precision-weighted
mean of the points and the prior mean. Its reverse density comes from the responsibilities at the proposed
mean, so the MH ratio is exact. Where a cluster has a mixture of its own, the proposal is nearly the mean's
conditional and moves it across the cluster in one step, where the random walk (a step fixed in advance:
the adaptation runs in warmup only) needs many: on 24 held-out cases the Gibbs-only sampler reached
split-merge's level in 0.65x the time (geometric mean; ``benchmarks/gmm_mean_moves.py``).
``MixtureSites(informed=False)`` turns it off. The energies
are the graph's (points' factors with ``M = sum v``, the bits' prior tables and the means' Gaussian
priors) up to terms no update changes; the tests compare the updates with the graph's conditionals and the
sweep's draws with the exact posterior. The random numbers come from torch's global RNG, drawn before the
loop (:func:`draw_site_randoms`).

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
    >>> fg = gmm_graph(torch.randn(30, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> sites = MixtureSites.of(fg)
    >>> state = torch.stack([gmm_initial_state(fg), gmm_initial_state(fg)])
    >>> new, accept_prob, informed_prob = sites.sweep(state, steps=torch.full((8,), 0.5))
    >>> new.shape, accept_prob.shape  # 2 chains; an acceptance probability per chain and mean coordinate
    (torch.Size([2, 72]), torch.Size([2, 8]))
    >>> informed_prob.shape  # and per chain and mixture (NaN: inactive, no informed move)
    torch.Size([2, 4])
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import numpy as np
import torch
from torch import Tensor
from torch.distributions import constraints

from neuralblock.graph import FactorGraph, GaussianMixtureGroup, LinearGaussianGroup, TableGroup
from neuralblock.graph.supports import same_support
from neuralblock.kernels.jit import NUMBA, SUMMED_DIRECTLY, _compiled, _half_sq_distance, _logaddexp, timed_first_call

__all__ = ["MixtureSites", "SiteRandoms", "draw_site_randoms"]


class SiteRandoms(NamedTuple):
    """One sweep's random numbers (float64): ``bit_u`` ``[K, m]`` uniforms of the bits' Gibbs draws, ``noise``
    ``[K, m, D]`` standard normal steps and ``log_u`` ``[K, m, D]`` logs of the MH tests' uniforms of the random
    walk, then ``informed_noise`` ``[K, m, D]`` and ``informed_log_u`` ``[K, m]`` of the informed moves."""

    bit_u: Tensor
    noise: Tensor
    log_u: Tensor
    informed_noise: Tensor
    informed_log_u: Tensor


def draw_site_randoms(chains: int, mixtures: int, dim: int) -> SiteRandoms:
    """A sweep's :class:`SiteRandoms` from torch's global RNG, in this order.

    Example:
        >>> draws = draw_site_randoms(2, 3, 2)
        >>> draws.bit_u.shape, draws.noise.shape, draws.log_u.shape
        (torch.Size([2, 3]), torch.Size([2, 3, 2]), torch.Size([2, 3, 2]))
    """
    bit_u = torch.rand(chains, mixtures, dtype=torch.float64)
    noise = torch.randn(chains, mixtures, dim, dtype=torch.float64)
    log_u = torch.rand(chains, mixtures, dim, dtype=torch.float64).log()
    informed_noise = torch.randn(chains, mixtures, dim, dtype=torch.float64)
    informed_log_u = torch.rand(chains, mixtures, dtype=torch.float64).log()
    return SiteRandoms(bit_u, noise, log_u, informed_noise, informed_log_u)


@_compiled
def _log_sum_others(row, bits, skip):
    """``log sum exp`` of ``row`` over the active mixtures other than ``skip`` (``-inf`` when there is none)."""
    top = -math.inf
    for mixture in range(row.shape[0]):
        if mixture != skip and bits[mixture] > 0 and row[mixture] > top:
            top = row[mixture]
    if top == -math.inf:
        return -math.inf
    acc = 0.0
    for mixture in range(row.shape[0]):
        if mixture != skip and bits[mixture] > 0:
            acc += math.exp(row[mixture] - top)
    return top + math.log(acc)


@_compiled
def _terms_of(points, mean, out):
    """``out[j] = -|x_j - mean|^2 / 2`` for whitened points ``[n, D]`` and a whitened mean ``[D]``."""
    for j in range(points.shape[0]):
        out[j] = _half_sq_distance(points[j], mean)


@_compiled
def _em_gaussian(points, own, rest, prior_loc, prior_precision, center, precision):
    """One EM step's Gaussian for a whitened mean: ``center`` and ``precision`` ``[D]`` from the responsibilities.

    A point's responsibility is ``1 / (1 + exp(rest_j - own_j))`` (its own term against the other active
    mixtures' share); the prior ``N(prior_loc, 1 / prior_precision)`` (whitened) counts as well.
    """
    n, dim = points.shape
    for d in range(dim):
        precision[d] = prior_precision[d]
        center[d] = prior_loc[d] * prior_precision[d]
    for j in range(n):
        gap = rest[j] - own[j]
        if gap > 700.0:
            continue
        weight = 1.0 / (1.0 + math.exp(gap))
        for d in range(dim):
            center[d] += weight * points[j, d]
            precision[d] += weight
    for d in range(dim):
        center[d] /= precision[d]


@_compiled
def _log_normal(x, center, precision):
    """``log N(x; center, diag(1 / precision))`` without its ``-D/2 log(2 pi)``."""
    acc = 0.0
    for d in range(x.shape[0]):
        gap = x[d] - center[d]
        acc += 0.5 * math.log(precision[d]) - 0.5 * precision[d] * gap * gap
    return acc


@_compiled
def _mixture_sites(
    state, mean_ids, active_ids, points, sigma, prior_loc, prior_scale, log_odds, steps, bit_u, noise, log_u,
    accept_prob, informed, whitened_loc, whitened_precision, informed_noise, informed_log_u, informed_prob,
):  # fmt: skip
    chains = state.shape[0]
    n, dim = points.shape
    m = mean_ids.shape[0]
    terms = np.empty((n, m))
    top = np.empty(n)  # per point: a reference and the sum of exp(term - reference) over the active mixtures
    total = np.empty(n)
    rest = np.empty(n)
    own = np.empty(n)
    fresh = np.empty(n)
    bits = np.empty(m)
    mean = np.empty(dim)
    moved = np.empty(dim)
    here = np.empty(dim)
    target = np.empty(dim)
    center = np.empty(dim)
    precision = np.empty(dim)
    stored = np.empty(1, dtype=state.dtype)  # a proposed value as the state stores it (its energy is of that)
    for k in range(chains):
        for mixture in range(m):
            bits[mixture] = state[k, active_ids[mixture]]
            for d in range(dim):
                mean[d] = state[k, mean_ids[mixture, d]] / sigma
            _terms_of(points, mean, own)
            for j in range(n):
                terms[j, mixture] = own[j]
        for j in range(n):
            row = terms[j]
            top[j] = -math.inf
            for mixture in range(m):
                if bits[mixture] > 0 and row[mixture] > top[j]:
                    top[j] = row[mixture]
            total[j] = 0.0
            if top[j] > -math.inf:
                for mixture in range(m):
                    if bits[mixture] > 0:
                        total[j] += math.exp(row[mixture] - top[j])
        count = 0.0
        for mixture in range(m):
            count += bits[mixture]
        for mixture in range(m):
            # -- the other mixtures' share of every point
            on = bits[mixture] > 0
            others = count - bits[mixture]
            rest_sum = 0.0
            for j in range(n):
                if top[j] == -math.inf:
                    rest[j] = -math.inf
                elif on:
                    left = total[j] - math.exp(terms[j, mixture] - top[j])
                    if left > SUMMED_DIRECTLY * total[j]:
                        rest[j] = top[j] + math.log(left)
                    else:
                        rest[j] = _log_sum_others(terms[j], bits, mixture)
                else:
                    rest[j] = top[j] + math.log(total[j])
                rest_sum += rest[j]
            for j in range(n):
                own[j] = terms[j, mixture]
            # -- Gibbs on the bit: log p(v = 1) - log p(v = 0), each with M = others + v
            with_it = 0.0
            for j in range(n):
                with_it += _logaddexp(rest[j], own[j])
            with_it += log_odds[mixture] - n * math.log(others + 1.0)
            if others > 0:
                without = rest_sum - n * math.log(others)
                diff = with_it - without
                p_on = 1.0 / (1.0 + math.exp(-diff)) if diff > -700.0 else 0.0
            else:
                p_on = 1.0  # the points need an active mixture
            new_bit = 1.0 if bit_u[k, mixture] < p_on else 0.0
            state[k, active_ids[mixture]] = new_bit
            bits[mixture] = new_bit
            on = new_bit > 0
            current = with_it if on else 0.0  # the points' part of the energy at the current mean (v = 1)
            # -- random-walk MH on each mean coordinate
            for d in range(dim):
                mean[d] = state[k, mean_ids[mixture, d]]
            for d in range(dim):
                value = mean[d]
                stored[0] = value + steps[mixture, d] * noise[k, mixture, d]
                step = float(stored[0])
                z_old = (value - prior_loc[mixture, d]) / prior_scale[mixture, d]
                z_new = (step - prior_loc[mixture, d]) / prior_scale[mixture, d]
                ratio = -0.5 * (z_new * z_new - z_old * z_old)
                proposed = current
                if on:
                    for e in range(dim):
                        moved[e] = mean[e] / sigma
                    moved[d] = step / sigma
                    _terms_of(points, moved, fresh)
                    proposed = log_odds[mixture] - n * math.log(others + 1.0)
                    for j in range(n):
                        proposed += _logaddexp(rest[j], fresh[j])
                    ratio += proposed - current
                if ratio != ratio or ratio == math.inf:  # (rejected, as mh_decide does)
                    accept_prob[k, mixture, d] = 0.0
                    continue
                accept_prob[k, mixture, d] = 1.0 if ratio >= 0.0 else math.exp(ratio)
                if log_u[k, mixture, d] < ratio:
                    mean[d] = step
                    state[k, mean_ids[mixture, d]] = step
                    if on:
                        current = proposed
                        for j in range(n):
                            own[j] = fresh[j]
            # -- an informed MH move of the whole mean: the Gaussian of one EM step from its responsibilities
            if informed and on:
                _em_gaussian(points, own, rest, whitened_loc[mixture], whitened_precision[mixture], center, precision)
                for d in range(dim):
                    stored[0] = (center[d] + informed_noise[k, mixture, d] / math.sqrt(precision[d])) * sigma
                    target[d] = float(stored[0])
                    moved[d] = target[d] / sigma
                    here[d] = mean[d] / sigma
                ratio = -_log_normal(moved, center, precision)
                for d in range(dim):
                    z_old = (mean[d] - prior_loc[mixture, d]) / prior_scale[mixture, d]
                    z_new = (target[d] - prior_loc[mixture, d]) / prior_scale[mixture, d]
                    ratio -= 0.5 * (z_new * z_new - z_old * z_old)
                _terms_of(points, moved, fresh)
                proposed = log_odds[mixture] - n * math.log(others + 1.0)
                for j in range(n):
                    proposed += _logaddexp(rest[j], fresh[j])
                ratio += proposed - current
                _em_gaussian(points, fresh, rest, whitened_loc[mixture], whitened_precision[mixture], center, precision)
                ratio += _log_normal(here, center, precision)
                if ratio != ratio or ratio == math.inf:  # (rejected, as mh_decide does)
                    informed_prob[k, mixture] = 0.0
                else:
                    informed_prob[k, mixture] = 1.0 if ratio >= 0.0 else math.exp(ratio)
                    if informed_log_u[k, mixture] < ratio:
                        for d in range(dim):
                            mean[d] = target[d]
                            state[k, mean_ids[mixture, d]] = target[d]
                        current = proposed
                        for j in range(n):
                            own[j] = fresh[j]
            # -- the kept sums of every point, with the mixture's new bit and mean
            for j in range(n):
                terms[j, mixture] = own[j]
                if on:
                    if rest[j] == -math.inf:
                        top[j], total[j] = own[j], 1.0
                    elif rest[j] >= own[j]:
                        top[j], total[j] = rest[j], 1.0 + math.exp(own[j] - rest[j])
                    else:
                        top[j], total[j] = own[j], 1.0 + math.exp(rest[j] - own[j])
                elif rest[j] == -math.inf:
                    top[j], total[j] = -math.inf, 0.0
                else:
                    top[j], total[j] = rest[j], 1.0
            count = others + new_bit


class MixtureSites:
    """The compiled single-site sweep of a graph whose latent variables are one GMM's bits and means.

    Built by :meth:`of` for graphs like :func:`motifs.gmm_pair.gmm_graph`: one
    :class:`~neuralblock.graph.GaussianMixtureGroup` whose points are observed (read from the graph's
    evidence), binary bits and real means, and each bit's and mean coordinate's only other factor a unary
    prior (a table with finite entries; a linear-Gaussian of that coordinate without parents). ``informed``
    (attribute :attr:`informed`, which may be changed between sweeps): end each active mixture's updates with
    the informed move of its mean.
    """

    def __init__(
        self,
        fg: FactorGraph,
        group_index: int,
        bit_priors: list[tuple[int, int]],
        mean_priors: list[tuple[int, int]],
        informed: bool = True,
    ) -> None:
        group = fg.groups[group_index]
        if not isinstance(group, GaussianMixtureGroup):
            raise TypeError(f"group {group_index} of the graph is not a GaussianMixtureGroup")
        self.mean_ids = group.means.numpy().astype(np.int64)
        self.active_ids = group.active.numpy().astype(np.int64)
        self._group_index = group_index
        self._bit_priors, self._mean_priors = bit_priors, mean_priors  # (group, row) of each variable's prior
        self.compile_seconds = 0.0  # the compiled loop's first call of each state dtype
        self.informed = bool(informed)  # end each active mixture's updates with an informed move of its mean
        self._layouts: set[tuple] = set()
        self.refresh(fg)

    def refresh(self, fg: FactorGraph) -> bool:
        """Re-read sigma, the points and the priors from ``fg`` (same structure, new values).

        Returns whether the sweep covers the new values (every bit's prior log-odds finite).
        """
        group = cast(GaussianMixtureGroup, fg.groups[self._group_index])
        self.sigma = float(group.sigma)
        values = torch.tensor([fg.evidence[int(v)] for v in group.points.reshape(-1)], dtype=torch.float64)
        self.points = np.ascontiguousarray((values.reshape(group.points.shape) / self.sigma).numpy())
        odds = []
        for where, row in self._bit_priors:
            table = cast(TableGroup, fg.groups[where]).log_tables[row].reshape(-1).double()
            odds.append(float(table[1] - table[0]))
        shape = self.mean_ids.shape
        gaussians = [(cast(LinearGaussianGroup, fg.groups[where]), row) for where, row in self._mean_priors]
        self.prior_loc = np.array([float(g.bias[row]) for g, row in gaussians]).reshape(shape)
        self.prior_scale = np.array([float(g.scale[row]) for g, row in gaussians]).reshape(shape)
        self.log_odds = np.array(odds)
        self.whitened_loc = self.prior_loc / self.sigma  # the priors in units of sigma (informed, label moves)
        self.whitened_precision = (self.sigma / self.prior_scale) ** 2
        return bool(np.isfinite(self.log_odds).all())

    @classmethod
    def of(cls, fg: FactorGraph, informed: bool = True) -> MixtureSites | None:
        """The sweep of ``fg`` (``informed``: with the informed mean moves), or ``None`` when the graph is not
        such a GMM (or Numba is missing).

        Example:
            >>> import torch
            >>> from motifs.gmm_pair import gmm_graph
            >>> MixtureSites.of(gmm_graph(torch.randn(5, 1), 3, 1.0, 2.0, 0.5)).mean_ids.shape
            (3, 1)
        """
        groups = [g for g in fg.groups if isinstance(g, GaussianMixtureGroup)]
        if not NUMBA or len(groups) != 1:
            return None
        group = groups[0]
        bits, means = group.active.tolist(), group.means.reshape(-1).tolist()
        if set(fg.latent.tolist()) != set(bits) | set(means) or not set(group.points.reshape(-1).tolist()) <= set(
            fg.evidence
        ):
            return None
        if any(fg.cardinality(v) != 2 for v in bits) or any(
            fg.cardinality(v) != 0 or not same_support(fg.support(v), constraints.real) for v in means
        ):
            return None
        group_index = fg.groups.index(group)
        priors: list[tuple[int, int]] = []
        for var in bits + means:
            factors = torch.tensor([node[1] for _, node in fg.graph.edges(("v", var))], dtype=torch.long)
            where, rows = fg.factor_location(factors)
            own = (where != group_index).nonzero().reshape(-1).tolist()
            if len(own) != 1 or fg.factor_scope(int(factors[own[0]])) != [var]:
                return None
            prior, row = fg.groups[int(where[own[0]])], int(rows[own[0]])
            if var in bits:
                if type(prior) is not TableGroup:
                    return None
            elif type(prior) is not LinearGaussianGroup or int(prior.child[row]) != var:
                return None
            priors.append((int(where[own[0]]), row))
        sites = cls(fg, group_index, priors[: len(bits)], priors[len(bits) :], informed)
        return sites if bool(np.isfinite(sites.log_odds).all()) else None  # a bit fixed by its prior: general path

    def sweep(self, state: Tensor, steps: Tensor, draws: SiteRandoms | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One sweep of CPU states ``[..., N]`` with random-walk step sizes ``steps`` ``[m D]`` (means row-major).

        Returns the new states, each state's MH acceptance probability per mean coordinate ``[..., m D]``
        (for the step-size adaptation) and per informed move ``[..., m]`` (NaN where a mixture made none: it was
        inactive after its bit's draw, or :attr:`informed` is off). ``draws`` (for ``K`` states in all) default
        to :func:`draw_site_randoms`.
        """
        m, dim = self.mean_ids.shape
        batch = state.reshape(-1, state.shape[-1])
        chains = batch.shape[0]
        if steps.shape != (m * dim,):
            raise ValueError(f"steps must have shape [{m * dim}] (one per mean coordinate), got {tuple(steps.shape)}")
        if draws is None:
            draws = draw_site_randoms(chains, m, dim)
        wanted = ((chains, m), (chains, m, dim), (chains, m, dim), (chains, m, dim), (chains, m))
        if tuple(tuple(d.shape) for d in draws) != wanted or any(d.dtype != torch.float64 for d in draws):
            raise ValueError(f"draws must be float64 arrays of shapes {wanted} for {chains} states")
        out = batch.detach().clone().contiguous()
        accept_prob = np.zeros((chains, m, dim))
        informed_prob = np.full((chains, m), np.nan)  # NaN: no informed move (the mixture inactive, or moves off)
        args = (
            out.numpy(), self.mean_ids, self.active_ids, self.points, self.sigma, self.prior_loc, self.prior_scale,
            self.log_odds, np.ascontiguousarray(steps.double().numpy().reshape(m, dim)), draws.bit_u.numpy(),
            draws.noise.numpy(), draws.log_u.numpy(), accept_prob, self.informed, self.whitened_loc,
            self.whitened_precision, draws.informed_noise.numpy(), draws.informed_log_u.numpy(), informed_prob,
        )  # fmt: skip
        _, seconds = timed_first_call(self._layouts, (out.dtype,), _mixture_sites, *args)
        self.compile_seconds += seconds
        probs = torch.from_numpy(accept_prob.reshape(chains, m * dim))
        informed = torch.from_numpy(informed_prob).reshape(*state.shape[:-1], m)
        return out.reshape(state.shape), probs.reshape(*state.shape[:-1], m * dim), informed
