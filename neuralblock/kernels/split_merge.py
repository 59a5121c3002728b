"""Split-merge MCMC for open-universe Gaussian mixtures: Smart-Dumb/Dumb-Smart moves on mixture pairs.

The hand-designed baseline for neural block proposals on the open-universe GMM (see
:class:`~neuralblock.graph.GaussianMixtureGroup`: ``m`` candidate mixtures with activity
bits ``v_k`` and means ``mu_k``, point labels summed out). Every move changes the block
``(mu_i, v_i, mu_j, v_j)`` of one pair of mixtures, or ``(mu_j, v_j)`` of one mixture, and is
an exact Metropolis-Hastings move scored on the graph's scaffold of that block. Moves come
in reverse pairs, after Wang and Russell's Smart-Dumb/Dumb-Smart (SDDS) design, adapted to
collapsed labels and activity bits (``A``: active mixtures, ``I``: inactive ones):

* ``smart_split`` (``i`` uniform in ``A``, ``j`` uniform in ``I``): the points ``i`` is
  responsible for are split along their principal axis; the two means are drawn around
  the two halves' centroids (either order); ``v_j = 1``. Its reverse is
* ``dumb_merge`` (an ordered pair of ``A``, uniform): ``mu_i`` is drawn around the centroid
  of the points of ``i`` and ``j``; ``v_j = 0`` and ``mu_j`` is redrawn from its prior.
* ``dumb_split`` (``i`` uniform in ``A``, ``j`` uniform in ``I``): both means drawn around
  ``mu_i`` without looking at the data; ``v_j = 1``. Its reverse is
* ``smart_merge``: like ``dumb_merge``, but the pair is drawn with probability
  ``exp(-|mu_i - mu_j|^2 / 2 (h sigma)^2)`` (close pairs first).
* ``birth`` (``j`` uniform in ``I``): ``mu_j`` from a mixture of Gaussians around mean-shift
  centres of the points the active mixtures explain poorly (plus a small prior component);
  ``v_j = 1``. Its reverse is ``death`` (``j`` uniform in ``A``): ``v_j = 0``, ``mu_j`` redrawn
  from its prior.

The acceptance ratio of a move ``K`` from ``S`` to ``S'`` is
``p(S') P(K') c_K'(S') q_K'(S | S') / (p(S) P(K) c_K(S) q_K(S' | S))``: target ratio (the pair's
scaffold), move-type probabilities, the probabilities of the discrete choices (which
mixtures) and the densities of the redrawn means, with ``K'`` the reverse move. A freed
mean is redrawn from its prior, which cancels its prior factor in the target.

References:
    Wang, Russell. "A Smart-Dumb/Dumb-Smart Algorithm for Efficient Split-Merge MCMC". UAI 2015.
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018 (the open-universe GMM).

Example:
    >>> import torch
    >>> from pyro.infer import MCMC
    >>> from motifs.gmm_pair import gmm_graph
    >>> points = torch.cat([torch.randn(20, 2) - 5.0, torch.randn(20, 2) + 5.0])
    >>> fg = gmm_graph(points, num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> kernel = SplitMergeGMM(fg, gibbs_prob=0.3)
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["x"].shape == (20, fg.num_variables)
    True
    >>> sorted(kernel.diagnostics()["acceptance_by_move"]) == sorted(MOVES)
    True

    Four chains in one state, each move attempt one batched step of all of them:

    >>> mcmc = MCMC(SplitMergeGMM(fg, chains=4), num_samples=5, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["x"].shape == (5, 4, fg.num_variables)
    True
"""

from __future__ import annotations

import itertools
import math
import operator
import time
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, GaussianMixtureGroup, LinearGaussianGroup
from neuralblock.kernels.adaptation import GibbsShare, check_schedule, single_site_turn
from neuralblock.kernels.base import GraphKernel, check_probability
from neuralblock.kernels.functional import mh_decide
from neuralblock.kernels.jit import NUMBA, timed_first_call
from neuralblock.kernels.jit_split_merge import SweepArrays, draw_attempts, split_merge_sweep, sweep_arrays
from neuralblock.kernels.mixture_labels import check_label_steps
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second

__all__ = [
    "MOVES",
    "REVERSE_MOVE",
    "MixtureLayout",
    "MoveBatch",
    "MoveProposal",
    "MoveTuning",
    "SplitMergeGMM",
    "mixture_layout",
    "propose_move",
    "propose_moves",
]

MOVES: tuple[str, ...] = ("smart_split", "dumb_merge", "dumb_split", "smart_merge", "birth", "death")
"""The move types, in reverse pairs."""

REVERSE_MOVE: dict[str, str] = {
    "smart_split": "dumb_merge",
    "dumb_merge": "smart_split",
    "dumb_split": "smart_merge",
    "smart_merge": "dumb_split",
    "birth": "death",
    "death": "birth",
}
"""The move that undoes each move."""

_PAIR_MOVES = frozenset({"smart_split", "dumb_merge", "dumb_split", "smart_merge"})
_SWITCH_ON = frozenset({"smart_split", "dumb_split", "birth"})
_POORLY_EXPLAINED = -3.0  # log sum_k exp(-d^2 / 2) below this: a point ~2.5 sigma from every active mean
_POINT_FLOOR = 0.01  # every point keeps some chance of seeding a birth


class MoveTuning(NamedTuple):
    """Shape parameters of the proposals (none affects exactness; distances in units of ``sigma``).

    Attributes:
        split_scale: spread of smart-split, merge and birth means, times ``sigma / sqrt(points + 1)``.
        dumb_scale: spread of dumb-split means around the split mixture's mean.
        merge_bandwidth: length scale of the smart merge's preference for close pairs.
        birth_radius: kernel radius of the mean-shift centres that seed births.
        birth_prior_weight: weight of the prior in the birth mixture (lets deaths far from the data pass).
        birth_seeds: most points that seed the birth mixture: the most poorly explained ones, so that a birth
            costs ``O(n birth_seeds)`` rather than ``O(n^2)`` (all points where ``n`` is at most this).
    """

    split_scale: float = 1.0
    dumb_scale: float = 2.0
    merge_bandwidth: float = 3.0
    birth_radius: float = 2.5
    birth_prior_weight: float = 0.1
    birth_seeds: int = 64


class MixtureLayout(NamedTuple):
    """Where an open-universe GMM lives in a graph's state vector.

    Attributes:
        points: ``LongTensor [n, D]`` variable ids of the points.
        means: ``LongTensor [m, D]`` of the mixture means; ``active``: ``LongTensor [m]`` of their bits.
        sigma: the points' standard deviation.
        prior_loc, prior_scale: ``[m, D]`` the ``N(c, tau^2)`` prior of each mean coordinate.
        movable: ``BoolTensor [m]``: mixtures whose mean and bit are all latent (the moves touch only these).
    """

    points: Tensor
    means: Tensor
    active: Tensor
    sigma: float
    prior_loc: Tensor
    prior_scale: Tensor
    movable: Tensor


class MoveProposal(NamedTuple):
    """One proposed move (the functional core's output).

    Attributes:
        state: the proposed state.
        mixtures: the mixtures whose block changed (one or two indices).
        log_q_fwd: ``log`` of the probability (density) of choosing this move and proposing ``state``.
        log_q_rev: the same for the reverse move from ``state`` back to the current state.
    """

    state: Tensor
    mixtures: tuple[int, ...]
    log_q_fwd: Tensor
    log_q_rev: Tensor


class _View(NamedTuple):
    """States of ``B`` chains through a layout: points ``[B, n, D]``, means ``[B, m, D]``, bits ``[B, m]`` (bool)."""

    x: Tensor
    mu: Tensor
    on: Tensor


def mixture_layout(fg: FactorGraph) -> MixtureLayout:
    """Find the (single) :class:`GaussianMixtureGroup` of a graph and the priors of its means.

    Raises:
        ValueError: no or several mixture groups, bits that are not binary, means that are
            not continuous or lack a parentless ``N(c, tau^2)`` linear-Gaussian prior.

    Example:
        >>> from motifs.gmm_pair import gmm_graph
        >>> layout = mixture_layout(gmm_graph(torch.zeros(5, 2), 3, 1.0, 4.0, 0.5))
        >>> tuple(layout.means.shape), layout.prior_scale[0].tolist()
        ((3, 2), [4.0, 4.0])
    """
    groups = [g for g in fg.groups if isinstance(g, GaussianMixtureGroup)]
    if len(groups) != 1:
        raise ValueError(
            f"SplitMergeGMM needs a graph with exactly one GaussianMixtureGroup (an open-universe GMM, e.g. "
            f"motifs.gmm_pair.gmm_graph), found {len(groups)}"
        )
    group = groups[0]
    cards = fg.cardinalities
    if not (cards[group.active] == 2).all():
        raise ValueError("SplitMergeGMM: the mixtures' activity bits must be binary variables")
    if not (cards[group.means] == 0).all():
        raise ValueError("SplitMergeGMM: the mixture means must be continuous variables")
    loc, scale = _mean_priors(fg, group.means)
    latent = torch.zeros(fg.num_variables, dtype=torch.bool)
    latent[fg.latent] = True
    movable = latent[group.means].all(-1) & latent[group.active]
    return MixtureLayout(group.points, group.means, group.active, group.sigma, loc, scale, movable)


def _mean_priors(fg: FactorGraph, means: Tensor) -> tuple[Tensor, Tensor]:
    """``(c, tau)`` of each mean coordinate's parentless linear-Gaussian prior, ``[m, D]`` each (a loop over groups).

    Raises:
        ValueError: a mean coordinate without exactly one such prior.
    """
    flat = means.reshape(-1)
    position = torch.full((fg.num_variables,), -1, dtype=torch.long)
    position[flat] = torch.arange(flat.numel())
    count = torch.zeros(flat.numel(), dtype=torch.long)
    loc = torch.zeros(flat.numel(), dtype=torch.float64)
    scale = torch.zeros(flat.numel(), dtype=torch.float64)
    dtype = torch.get_default_dtype()  # float64 priors stay float64
    for group in fg.groups:
        if not isinstance(group, LinearGaussianGroup):
            continue
        hit = (group.parents < 0).all(1) & (position[group.child] >= 0)
        if hit.any():
            dtype = torch.promote_types(dtype, group.bias.dtype)
        rows = position[group.child[hit]]
        count.index_add_(0, rows, torch.ones_like(rows))
        loc[rows], scale[rows] = group.bias[hit].to(torch.float64), group.scale[hit].to(torch.float64)
    bad = torch.nonzero(count != 1).reshape(-1)
    if bad.numel():
        first = int(bad[0])
        raise ValueError(
            f"SplitMergeGMM: mean {fg.names[int(flat[first])]!r} needs exactly one parentless N(c, tau^2) prior "
            f"(a linear-Gaussian factor), found {int(count[first])}"
        )
    return loc.reshape(means.shape).to(dtype), scale.reshape(means.shape).to(dtype)


# ------------------------------------------------------------------------------ proposal geometry
# Every function below is batched over chains: a state read through a layout is a _View of B chains, and
# a proposal is a _Mixtures of B padded Gaussian mixtures over the pair of means (mu_i, mu_j).
_KIND = {k: c for c, k in enumerate(MOVES)}


def _read(layout: MixtureLayout, state: Tensor) -> _View:
    """The points ``[B, n, D]``, means ``[B, m, D]`` and bits ``[B, m]`` of states ``[B, N]``."""
    return _View(state[..., layout.points], state[..., layout.means], state[..., layout.active] > 0.5)


def _rows(view: _View, rows: Tensor) -> _View:
    return _View(view.x[rows], view.mu[rows], view.on[rows])


def _pick(values: Tensor, index: Tensor) -> Tensor:
    """``values[b, index[b]]`` for ``values [B, m, ...]`` and ``index [B]``."""
    return values[torch.arange(len(index)), index]


class _Mixtures(NamedTuple):
    """``B`` mixtures of ``C`` diagonal Gaussians each, over ``S`` means of a move (``(mu_i, mu_j)`` or ``mu_j``).

    Attributes:
        log_weights: ``[B, C]`` normalized log weights.
        loc, scale: ``[B, C, S, D]`` component means and standard deviations.
    """

    log_weights: Tensor
    loc: Tensor
    scale: Tensor

    def sample(self) -> Tensor:
        """One draw per mixture, ``[B, S, D]`` (a Gumbel-max draw of the component)."""
        if self.log_weights.shape[-1] == 1:
            return self.loc[:, 0] + self.scale[:, 0] * torch.randn_like(self.loc[:, 0])
        gumbel = -torch.empty_like(self.log_weights).exponential_().log()
        k = (self.log_weights + gumbel).argmax(-1)
        return _pick(self.loc, k) + _pick(self.scale, k) * torch.randn_like(self.loc[:, 0])

    def log_prob(self, value: Tensor) -> Tensor:
        """Log density ``[B]`` of ``value [B, S, D]``."""
        z = (value[:, None] - self.loc) / self.scale
        terms = (-0.5 * z * z - self.scale.log()).flatten(2).sum(-1)
        return torch.logsumexp(self.log_weights + terms, -1) - 0.5 * value[0].numel() * math.log(2 * math.pi)


def _responsibilities(view: _View, sigma: float) -> Tensor:
    """``[B, n, m]`` posterior label probabilities of the points (0 for inactive mixtures)."""
    d2 = torch.cdist(view.x, view.mu).square() / sigma**2
    return torch.softmax((-0.5 * d2).masked_fill(~view.on[:, None, :], -math.inf), -1)


def _split_dist(view: _View, sigma: float, i: Tensor, tuning: MoveTuning) -> tuple[Tensor, Tensor, Tensor]:
    """Smart split of mixtures ``i [B]``: two means around the halves of their points along the principal axis.

    A pseudo-point at ``mu_i`` keeps every quantity defined for a mixture without points.
    The density is symmetric in the two halves' order, so the axis' sign does not matter.
    Returns ``(log_weights [B, 2], loc [B, 2, 2, D], scale [B, 2, 2, D])``.
    """
    x = view.x
    w = _responsibilities(view, sigma).gather(2, i[:, None, None].expand(-1, x.shape[1], 1)).squeeze(-1)  # [B, n]
    total = w.sum(-1) + 1.0
    mean = ((w[:, None] @ x).squeeze(1) + _pick(view.mu, i)) / total[:, None]
    centred = x - mean[:, None]
    eye = torch.eye(x.shape[-1], dtype=x.dtype)
    cov = ((w[..., None] * centred).transpose(1, 2) @ centred + sigma**2 * eye) / total[:, None, None]
    axis = torch.linalg.eigh(cov).eigenvectors[..., -1]  # [B, D]
    side = torch.sigmoid(3.0 * (centred @ axis[..., None]).squeeze(-1) / sigma)
    halves = torch.stack([w * side, w * (1 - side)], 1)  # [B, 2, n]
    anchors = torch.stack([mean + sigma * axis, mean - sigma * axis], 1)
    counts = halves.sum(-1) + 1.0
    centres = (halves @ x + anchors) / counts[..., None]  # [B, 2, D]
    scales = (tuning.split_scale * sigma / counts.sqrt())[..., None].expand_as(centres)
    locs = torch.stack([centres, centres.flip(1)], 1)  # [B, 2 orders, 2 means, D]
    half = torch.full((len(i), 2), -math.log(2.0), dtype=x.dtype)
    return half, locs, torch.stack([scales, scales.flip(1)], 1)


def _merge_dist(
    layout: MixtureLayout, view: _View, i: Tensor, j: Tensor, tuning: MoveTuning
) -> tuple[Tensor, Tensor, Tensor]:
    """Merge ``j`` into ``i``: ``mu_i`` around the centroid of both mixtures' points, ``mu_j`` from its prior."""
    sigma, x = layout.sigma, view.x
    r = _responsibilities(view, sigma)
    w = r.gather(2, torch.stack([i, j], -1)[:, None].expand(-1, x.shape[1], 2)).sum(-1)  # [B, n]
    total = w.sum(-1) + 1.0
    centre = ((w[:, None] @ x).squeeze(1) + 0.5 * (_pick(view.mu, i) + _pick(view.mu, j))) / total[:, None]
    spread = (tuning.split_scale * sigma / total.sqrt())[:, None].expand_as(centre)
    loc = torch.stack([centre, layout.prior_loc[j].to(x.dtype)], 1)
    scale = torch.stack([spread, layout.prior_scale[j].to(x.dtype)], 1)
    return x.new_zeros(len(i), 1), loc[:, None], scale[:, None]


def _dumb_split_dist(view: _View, sigma: float, i: Tensor, tuning: MoveTuning) -> tuple[Tensor, Tensor, Tensor]:
    """Both means around ``mu_i``, blind to the data."""
    loc = _pick(view.mu, i)[:, None, None].expand(-1, 1, 2, -1)
    return loc.new_zeros(len(i), 1), loc, torch.full_like(loc, tuning.dumb_scale * sigma)


def _birth_dist(layout: MixtureLayout, view: _View, j: Tensor, tuning: MoveTuning) -> tuple[Tensor, Tensor, Tensor]:
    """``mu_j`` near clusters of poorly explained points (two mean-shift steps), or from its prior.

    The seeds are the ``birth_seeds`` most poorly explained points (all ``n`` where there are no more), each
    shifted towards its poorly explained neighbours among all points. Returns ``seeds + 1`` components over ``mu_j``.
    """
    sigma, x = layout.sigma, view.x
    d2 = torch.cdist(x, view.mu).square() / sigma**2
    explained = torch.logsumexp((-0.5 * d2).masked_fill(~view.on[:, None, :], -math.inf), -1).clamp(min=-1e4)
    poorly = torch.sigmoid(_POORLY_EXPLAINED - explained)  # [B, n]
    centres, weights = x, poorly
    if x.shape[1] > tuning.birth_seeds:  # the least explained points (ties: the first)
        chosen = torch.argsort(explained, dim=-1, stable=True)[:, : tuning.birth_seeds]
        centres, weights = x.gather(1, chosen[..., None].expand(-1, -1, x.shape[-1])), poorly.gather(1, chosen)
    for _ in range(2):  # two mean-shift steps (a fixed count, not a loop over data)
        kernel = torch.exp(-0.5 * torch.cdist(centres, x).square() / (tuning.birth_radius * sigma) ** 2)
        kernel = kernel * poorly[:, None, :]
        mass = kernel.sum(-1) + 1.0
        centres = (kernel @ x + centres) / mass[..., None]
    seeds = torch.log(weights + _POINT_FLOOR)
    seeds = seeds - torch.logsumexp(seeds, -1, keepdim=True) + math.log1p(-tuning.birth_prior_weight)
    prior = torch.full((len(j), 1), math.log(tuning.birth_prior_weight), dtype=x.dtype)
    logits = torch.cat([seeds, prior], -1)
    locs = torch.cat([centres, layout.prior_loc[j].to(x.dtype)[:, None]], 1)
    spread = (tuning.split_scale * sigma / mass.sqrt())[..., None].expand_as(centres)
    scales = torch.cat([spread, layout.prior_scale[j].to(x.dtype)[:, None]], 1)
    return logits, locs[:, :, None], scales[:, :, None]


def _prior_dist(layout: MixtureLayout, view: _View, j: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``mu_j`` from its prior (the death move)."""
    dtype = view.x.dtype
    loc = layout.prior_loc[j].to(dtype)[:, None, None]
    scale = layout.prior_scale[j].to(dtype)[:, None, None]
    return loc.new_zeros(len(j), 1), loc, scale


def _merge_pair_logits(view: _View, movable: Tensor, sigma: float, tuning: MoveTuning) -> Tensor:
    """``[B, m, m]`` log-probabilities of the smart merge's ordered pairs (close pairs first)."""
    d2 = torch.cdist(view.mu, view.mu).square() / (tuning.merge_bandwidth * sigma) ** 2
    usable = view.on & movable
    ok = usable[:, :, None] & usable[:, None, :] & ~torch.eye(len(movable), dtype=torch.bool)
    logits = (-0.5 * d2).masked_fill(~ok, -math.inf)
    return logits - torch.logsumexp(logits.flatten(1), -1)[:, None, None]


# ------------------------------------------------------------------------------ moves
def _uniform(mask: Tensor) -> Tensor:
    """``[B]``: a uniform member of each row of ``mask [B, m]`` (any index where a row is empty)."""
    return torch.rand(mask.shape, dtype=torch.float64).masked_fill(~mask, -1.0).argmax(-1)


def _choose(kind: str, layout: MixtureLayout, view: _View, tuning: MoveTuning) -> tuple[Tensor, Tensor, Tensor]:
    """Draw the mixtures ``(i, j)`` a move of type ``kind`` acts on in each chain (``i == j`` for births and deaths).

    Returns ``(i [B], j [B], available [B])``; a move is unavailable where it cannot apply (e.g. a
    split with no inactive mixture, the death of the last active mixture).
    """
    on, off = view.on & layout.movable, ~view.on & layout.movable
    n_on = on.sum(-1)
    if kind in ("smart_split", "dumb_split"):
        return _uniform(on), _uniform(off), (n_on >= 1) & off.any(-1)
    if kind == "dumb_merge":
        i = _uniform(on)
        return i, _uniform(on & (torch.arange(on.shape[-1]) != i[:, None])), n_on >= 2
    if kind == "smart_merge":
        logits = _merge_pair_logits(view, layout.movable, layout.sigma, tuning).flatten(1)
        gumbel = -torch.empty_like(logits).exponential_().log()
        pair = torch.nan_to_num(logits + gumbel, nan=-math.inf).argmax(-1)  # a categorical draw (Gumbel-max)
        return pair // on.shape[-1], pair % on.shape[-1], n_on >= 2
    if kind == "birth":
        j = _uniform(off)
        return j, j, off.any(-1)
    j = _uniform(on)  # death: never of the last active mixture
    return j, j, (n_on >= 1) & (view.on.sum(-1) >= 2)


def _choice_log_prob(kind: str, layout: MixtureLayout, view: _View, i: Tensor, j: Tensor, tuning: MoveTuning) -> Tensor:
    """``[B]``: log-probability that :func:`_choose` draws ``(i, j)`` for ``kind`` from ``view``."""
    if kind == "smart_merge":
        return _merge_pair_logits(view, layout.movable, layout.sigma, tuning)[torch.arange(len(i)), i, j]
    n_on = (view.on & layout.movable).sum(-1).to(view.x.dtype)
    if kind == "death":
        return -n_on.log()
    if kind == "dumb_merge":
        return -n_on.log() - (n_on - 1).log()
    n_off = (~view.on & layout.movable).sum(-1).to(view.x.dtype)
    return -n_off.log() if kind == "birth" else -n_on.log() - n_off.log()


def _move_dist(kind: str, layout: MixtureLayout, view: _View, i: Tensor, j: Tensor, tuning: MoveTuning) -> _Mixtures:
    """Distribution of the new means: ``(mu_i, mu_j)`` for pair moves, ``mu_j`` for births and deaths."""
    sigma = layout.sigma
    if kind == "smart_split":
        parts = _split_dist(view, sigma, i, tuning)
    elif kind == "dumb_split":
        parts = _dumb_split_dist(view, sigma, i, tuning)
    elif kind in ("dumb_merge", "smart_merge"):
        parts = _merge_dist(layout, view, i, j, tuning)
    elif kind == "birth":
        parts = _birth_dist(layout, view, j, tuning)
    else:
        parts = _prior_dist(layout, view, j)
    return _Mixtures(*parts)


class MoveBatch(NamedTuple):
    """One proposed move per chain (the batched functional core's output).

    Attributes:
        state: ``[B, N]`` the proposed states (the current state where no move was available).
        mixtures: ``[B, 2]`` the mixtures ``(i, j)`` whose blocks changed (``i == j`` for births and deaths).
        available: ``[B]`` whether the chain's move could apply.
        log_q_fwd: ``[B]`` log of the probability (density) of choosing this move and proposing ``state``
            (``-inf`` where unavailable).
        log_q_rev: ``[B]`` the same for the reverse move from ``state`` back to the current state.
    """

    state: Tensor
    mixtures: Tensor
    available: Tensor
    log_q_fwd: Tensor
    log_q_rev: Tensor


def _propose_kind(
    kind: str, layout: MixtureLayout, state: Tensor, move_log_probs: Tensor, tuning: MoveTuning
) -> MoveBatch:
    """:func:`propose_moves` for chains ``state [B, N]`` that all draw a move of type ``kind``."""
    view = _read(layout, state)
    i, j, available = _choose(kind, layout, view, tuning)
    out = MoveBatch(
        state,
        torch.stack([i, j], -1),
        available,
        torch.full_like(state[:, 0], -math.inf),
        torch.full_like(state[:, 0], -math.inf),
    )
    rows = available.nonzero().squeeze(-1)
    if rows.numel() == 0:
        return out
    if rows.numel() < len(available):  # geometry only for the chains whose move applies
        inner = _propose_kind_available(
            kind, layout, state[rows], _rows(view, rows), i[rows], j[rows], move_log_probs, tuning
        )
        proposed, log_q_fwd, log_q_rev = state.clone(), out.log_q_fwd.clone(), out.log_q_rev.clone()
        proposed[rows], log_q_fwd[rows], log_q_rev[rows] = inner
        return out._replace(state=proposed, log_q_fwd=log_q_fwd, log_q_rev=log_q_rev)
    proposed, log_q_fwd, log_q_rev = _propose_kind_available(kind, layout, state, view, i, j, move_log_probs, tuning)
    return out._replace(state=proposed, log_q_fwd=log_q_fwd, log_q_rev=log_q_rev)


def _propose_kind_available(
    kind: str,
    layout: MixtureLayout,
    state: Tensor,
    view: _View,
    i: Tensor,
    j: Tensor,
    move_log_probs: Tensor,
    tuning: MoveTuning,
) -> tuple[Tensor, Tensor, Tensor]:
    """Proposed states ``[B, N]``, ``log_q_fwd [B]`` and ``log_q_rev [B]`` of moves ``kind`` of mixtures ``(i, j)``."""
    forward = _move_dist(kind, layout, view, i, j, tuning)
    values = forward.sample().to(state.dtype)  # [B, 2 or 1, D]
    ids = layout.means[torch.stack([i, j], -1) if kind in _PAIR_MOVES else j[:, None]].flatten(1)  # [B, S D]
    proposed = state.scatter(-1, ids, values.flatten(1))
    proposed[torch.arange(len(j)), layout.active[j]] = 1.0 if kind in _SWITCH_ON else 0.0
    reverse = REVERSE_MOVE[kind]
    new_view = _read(layout, proposed)
    backward = _move_dist(reverse, layout, new_view, i, j, tuning)
    log_probs = move_log_probs.tolist()
    log_q_fwd = log_probs[_KIND[kind]] + _choice_log_prob(kind, layout, view, i, j, tuning) + forward.log_prob(values)
    old = state.gather(-1, ids).reshape(values.shape)
    log_q_rev = (
        log_probs[_KIND[reverse]] + _choice_log_prob(reverse, layout, new_view, i, j, tuning) + backward.log_prob(old)
    )
    return proposed, log_q_fwd, log_q_rev


def propose_moves(
    kinds: Tensor, layout: MixtureLayout, state: Tensor, move_log_probs: Tensor, tuning: MoveTuning
) -> MoveBatch:
    """Propose one move per chain, of type ``MOVES[kinds[b]]``, and score both directions (batched over chains).

    ``log_q_fwd = log P(kind) + log c_kind(i, j | state) + log q_kind(new means | state)`` and
    ``log_q_rev`` is the same expression for the reverse move (:data:`REVERSE_MOVE`) from the
    proposed state back to ``state``, evaluated with the same functions as its forward move.
    The chains are grouped by move type (at most six groups), and each group is proposed as
    one batch; no step loops over chains.

    Args:
        kinds: ``LongTensor [B]`` of indices into :data:`MOVES`.
        layout: from :func:`mixture_layout`.
        state: the current states ``[B, N]``.
        move_log_probs: ``[len(MOVES)]`` log-probability of each move type per attempt.
        tuning: proposal shape parameters.

    Returns:
        A :class:`MoveBatch` (chains whose move cannot apply are marked unavailable and keep their state).

    Example:
        >>> from motifs.gmm_pair import gmm_graph
        >>> fg = gmm_graph(torch.randn(10, 2), 3, 1.0, 4.0, 0.5)
        >>> layout, state = mixture_layout(fg), fg.initial_state().repeat(2, 1)
        >>> state[:, layout.active] = torch.tensor([1.0, 0.0, 0.0])
        >>> kinds = torch.tensor([MOVES.index("death"), MOVES.index("smart_split")])
        >>> batch = propose_moves(kinds, layout, state, torch.full((6,), -math.log(6)), MoveTuning())
        >>> batch.available.tolist(), batch.state[:, layout.active].sum(-1).tolist()
        ([False, True], [1.0, 2.0])
    """
    sizes = torch.bincount(kinds, minlength=len(MOVES)).tolist()
    if max(sizes) == len(kinds):  # one move type for all chains
        return _propose_kind(MOVES[sizes.index(len(kinds))], layout, state, move_log_probs, tuning)
    proposed = state.clone()
    mixtures = torch.zeros(len(kinds), 2, dtype=torch.long)
    available = torch.zeros(len(kinds), dtype=torch.bool)
    log_q_fwd = torch.empty_like(state[:, 0])
    log_q_rev = torch.empty_like(state[:, 0])
    for kind, rows in zip(MOVES, torch.argsort(kinds, stable=True).split(sizes)):  # six move types
        if rows.numel():
            part = _propose_kind(kind, layout, state[rows], move_log_probs, tuning)
            proposed[rows], mixtures[rows], available[rows] = part.state, part.mixtures, part.available
            log_q_fwd[rows], log_q_rev[rows] = part.log_q_fwd, part.log_q_rev
    return MoveBatch(proposed, mixtures, available, log_q_fwd, log_q_rev)


def propose_move(
    kind: str, layout: MixtureLayout, state: Tensor, move_log_probs: Mapping[str, float], tuning: MoveTuning
) -> MoveProposal | None:
    """Propose one move of type ``kind`` from one state ``[N]`` (:func:`propose_moves` for one chain).

    Returns:
        A :class:`MoveProposal`, or None when the move cannot apply (e.g. a split with no inactive mixture).

    Example:
        >>> from motifs.gmm_pair import gmm_graph
        >>> fg = gmm_graph(torch.randn(10, 2), 3, 1.0, 4.0, 0.5)
        >>> layout, state = mixture_layout(fg), fg.initial_state()
        >>> state[layout.active] = torch.tensor([1.0, 0.0, 0.0])
        >>> logs = {k: -math.log(len(MOVES)) for k in MOVES}
        >>> propose_move("death", layout, state, logs, MoveTuning()) is None  # never the last mixture
        True
        >>> move = propose_move("smart_split", layout, state, logs, MoveTuning())
        >>> int(move.state[layout.active].sum()), bool(torch.isfinite(move.log_q_rev))
        (2, True)
    """
    logs = torch.tensor([move_log_probs[k] for k in MOVES], dtype=torch.float64)
    batch = propose_moves(torch.tensor([_KIND[kind]]), layout, state[None], logs, tuning)
    if not bool(batch.available[0]):
        return None
    i, j = batch.mixtures[0].tolist()
    mixtures = (i, j) if kind in _PAIR_MOVES else (j,)
    return MoveProposal(batch.state[0], mixtures, batch.log_q_fwd[0], batch.log_q_rev[0])


class _Scaffolds(NamedTuple):
    """The factors touching some movable mixture's block ``(mu_k, v_k)``, and which mixtures they touch.

    Attributes:
        factors: per factor group, ``LongTensor [F_g]`` of its factor rows (the columns below, group by group).
        touch: ``BoolTensor [m, F]``: whether factor ``f`` (all groups' factors concatenated) is in the
            scaffold of mixture ``k``.
    """

    factors: list[Tensor]
    touch: Tensor


def _mixture_scaffolds(fg: FactorGraph, layout: MixtureLayout) -> _Scaffolds:
    """The scaffold of every mixture's block, as one incidence over the graph's factors (built once, at setup)."""
    blocks = torch.cat([layout.means, layout.active[:, None]], 1)  # [m, D + 1]
    scaffold = fg.scaffold(blocks)
    factors, touch = [], []
    for index, segment in zip(scaffold.group_index, scaffold.group_segment):
        rows, position = torch.unique(index, return_inverse=True)
        incidence = torch.zeros(len(blocks), len(rows), dtype=torch.bool)
        incidence[segment, position] = True
        factors.append(rows)
        touch.append(incidence)
    return _Scaffolds(factors, torch.cat(touch, 1))


def _scaffold_values(fg: FactorGraph, scaffolds: _Scaffolds, state: Tensor) -> Tensor:
    """``[B, F]``: the log values of the factors of :class:`_Scaffolds` at ``state [B, N]`` (in float64)."""
    parts = [
        group.log_factors(state, factors).double()
        for group, factors in zip(fg.groups, scaffolds.factors)
        if factors.numel()
    ]
    return torch.cat(parts, -1)


def _energy_change(scaffolds: _Scaffolds, current: Tensor, proposed: Tensor, mixtures: Tensor) -> Tensor:
    """``[B]``: ``log p(proposed) - log p(current)`` of each chain, summed over its move's scaffold.

    A chain's scaffold is the union of the scaffolds of its mixtures ``(i, j)`` (``mixtures [B, 2]``);
    ``current`` and ``proposed`` are :func:`_scaffold_values` of both states.
    """
    mask = scaffolds.touch[mixtures[:, 0]] | scaffolds.touch[mixtures[:, 1]]
    return torch.where(mask, proposed - current, 0.0).sum(-1)


# ------------------------------------------------------------------------------ the kernel
class SplitMergeGMM(GraphKernel):
    """Smart-Dumb/Dumb-Smart split-merge MCMC for an open-universe GMM, mixed with single-site updates.

    Each transition is, with probability ``gibbs_prob`` (or, with ``schedule="alternate"``, deterministically
    at that rate), a single-site sweep (Gibbs on the
    bits, random-walk MH on the mean coordinates, as in
    :class:`~neuralblock.kernels.NeuralBlockKernel`), and otherwise ``moves_per_sweep``
    split/merge/birth/death attempts (module docstring), each an exact MH move whose type
    is drawn with probabilities ``move_weights``. The target is the graph's own: each
    move's ratio evaluates the scaffold of the changed mixtures' block.

    With ``chains=K`` the K chains share one state ``[K, N]``: each move attempt is one batched
    step in which every chain draws its own move type, mixtures and means (a chain whose move
    cannot apply rejects it), and the single-site sweep is batched over the chains too. By default
    (``compiled``) a whole split-merge sweep of every chain is one compiled call instead, with the
    same moves and test (:mod:`neuralblock.kernels.jit_split_merge`). Each
    chain's transition is the one-chain transition; the chains share the per-transition choice
    between a single-site sweep and a split-merge sweep (as ``NeuralBlockKernel``'s do).

    Args:
        model: a :class:`FactorGraph` with one :class:`~neuralblock.graph.GaussianMixtureGroup`
            whose means have ``N(c, tau^2)`` priors (e.g. ``motifs.gmm_pair.gmm_graph``); a Pyro
            model has no such group, so it is refused.
        gibbs_prob: probability of a single-site sweep per transition (the share of such transitions, with
            ``schedule="alternate"``).
        moves_per_sweep: move attempts per split-merge transition (default: the number of
            pairs of all ``m`` mixtures, movable or not, as many as a neural block sweep over
            all pairs proposes).
        move_weights: relative probability of each move type (default all equal); a move and
            its reverse must both be positive or both zero.
        step_size: initial random-walk step for the single-site sweep.
        tuning: proposal shape parameters.
        chains: independent chains run together in one ``[chains, N]`` state (``get_samples()["x"]``
            is then ``[S, chains, N]``; with 1, ``[S, N]``).
        copy_moves: end each compiled single-site sweep with copy-set moves
            (:mod:`neuralblock.kernels.mixture_copies`).
        informed_means: follow each active mixture's random-walk updates in each compiled single-site sweep
            with an informed MH move of its mean (the Gaussian of one EM step,
            :mod:`neuralblock.kernels.mixture_sites`).
        label_steps: label steps at the end of every transition of CPU states (each compiled single-site sweep
            and each split-merge sweep): exact Gibbs draws of the points' labels, then of every mean at once (an
            inactive one from its prior; :mod:`neuralblock.kernels.mixture_labels`; 0: none).
        gibbs_share: instead of ``gibbs_prob``, the share of the sampling time single-site sweeps should
            take: before the first transition both sweeps are timed on copies of the start, and
            ``gibbs_prob`` is set from their costs and kept (:class:`~neuralblock.kernels.adaptation.GibbsShare`;
            the chosen value is in ``diagnostics()["gibbs_prob"]``). The timing runs at ``setup`` (in no
            transition's time) and replaces ``gibbs_prob``; a seed then no longer fixes the run.
        compiled: run each split-merge sweep as one compiled loop over the chains and their attempts
            (:mod:`neuralblock.kernels.jit_split_merge`: the same moves and MH test, 8-32x faster than the
            eager batched attempts at 12-32 mixtures and 60-1000 points, ``benchmarks/split_merge_sweep.py``).
            ``None`` (default): where Numba is installed, the state is on the CPU and every factor a move
            changes is one the loop knows (the mixture's points, the means' Gaussian priors and the bits' own
            factors, as in ``gmm_graph``); ``True`` refuses a graph it cannot run. A state of another dtype
            than float32 or float64 takes the eager moves.
        schedule: which transitions take the single-site sweep: ``"random"`` (each with probability
            ``gibbs_prob``) or ``"alternate"`` (deterministically at the same rate, the split-merge sweep first:
            :func:`~neuralblock.kernels.adaptation.single_site_turn`).

    Raises:
        TypeError: ``model`` is not a :class:`FactorGraph`.
        ValueError: bad arguments, or a graph that is not an open-universe GMM; at ``setup``, a starting
            state of log density ``-inf`` (e.g. no active mixture for the points).
    """

    batched_state = True

    def __init__(
        self,
        model: FactorGraph,
        gibbs_prob: float = 0.5,
        moves_per_sweep: int | None = None,
        move_weights: Mapping[str, float] | None = None,
        step_size: float = 0.5,
        tuning: MoveTuning | None = None,
        chains: int = 1,
        copy_moves: bool = True,
        gibbs_share: float | None = None,
        compiled: bool | None = None,
        informed_means: bool = True,
        schedule: str = "random",
        label_steps: int = 2,
    ) -> None:
        if not isinstance(model, FactorGraph):
            raise TypeError(
                f"SplitMergeGMM needs a FactorGraph with a GaussianMixtureGroup (e.g. motifs.gmm_pair.gmm_graph), "
                f"got {type(model).__name__}"
            )
        super().__init__(model, chains=chains)
        gibbs_prob = check_probability("gibbs_prob", gibbs_prob)
        if moves_per_sweep is not None and (int(moves_per_sweep) != moves_per_sweep or moves_per_sweep < 1):
            raise ValueError(f"moves_per_sweep must be a positive integer or None, got {moves_per_sweep}")
        if not step_size > 0:
            raise ValueError(f"step_size must be positive, got {step_size}")
        weights = dict.fromkeys(MOVES, 1.0) if move_weights is None else dict(move_weights)
        unknown = sorted(set(weights) - set(MOVES))
        if unknown:
            raise ValueError(f"unknown move types {unknown}; expected some of {list(MOVES)}")
        weights = {k: float(weights.get(k, 0.0)) for k in MOVES}
        if any(not (w >= 0 and math.isfinite(w)) for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"move_weights must be finite, non-negative and not all zero, got {weights}")
        for k, w in weights.items():
            if (w > 0) != (weights[REVERSE_MOVE[k]] > 0):
                raise ValueError(f"move {k!r} and its reverse {REVERSE_MOVE[k]!r} must both have positive weight")
        self.tuning = MoveTuning() if tuning is None else tuning
        if not (self.tuning.split_scale > 0 and self.tuning.dumb_scale > 0 and self.tuning.merge_bandwidth > 0):
            raise ValueError(f"tuning scales must be positive, got {self.tuning}")
        if not (self.tuning.birth_radius > 0 and 0 < self.tuning.birth_prior_weight < 1):
            raise ValueError(f"tuning needs birth_radius > 0 and birth_prior_weight in (0, 1), got {self.tuning}")
        seeds = self.tuning.birth_seeds
        if isinstance(seeds, bool) or not hasattr(seeds, "__index__") or operator.index(seeds) < 1:
            raise ValueError(f"tuning.birth_seeds must be a positive integer, got {seeds!r}")
        self.gibbs_prob = float(gibbs_prob)
        self.schedule = check_schedule(schedule)
        self.share_calibration = None if gibbs_share is None else GibbsShare(gibbs_share)
        self._share_pending = False  # set by _prepare: calibrate gibbs_prob at setup
        self.step_size = float(step_size)
        self._copy_moves = bool(copy_moves)  # (the moves themselves: single_site.copy_moves)
        self._informed_means = bool(informed_means)
        self._label_steps = check_label_steps(label_steps)  # (the moves themselves: single_site.label_moves)
        self._moves_arg = None if moves_per_sweep is None else int(moves_per_sweep)
        if compiled not in (None, True, False):
            raise ValueError(f"compiled must be None, True or False, got {compiled!r}")
        if compiled and not NUMBA:  # pragma: no cover - numba is a dependency
            raise ValueError("SplitMergeGMM(compiled=True) needs Numba, which cannot be imported here")
        self.compiled = compiled
        self._sweep_arrays: SweepArrays | None = None
        self._compiled_layouts: set[tuple] = set()
        self.compile_seconds = 0.0
        total = sum(weights.values())
        kinds = [k for k in MOVES if weights[k] > 0]
        self._kind_codes = torch.tensor([_KIND[k] for k in kinds])
        self._kind_cdf = torch.tensor(
            list(itertools.accumulate(weights[k] / total for k in kinds)), dtype=torch.float64
        )
        self.move_log_probs = {k: math.log(w / total) if w > 0 else -math.inf for k, w in weights.items()}
        self._move_log_probs = torch.tensor([self.move_log_probs[k] for k in MOVES], dtype=torch.float64)
        self._checked_layout(model)  # fail early on a graph that is not an open-universe GMM
        self._reset_stats()  # diagnostics() and logging() answer before setup (e.g. in the parent of worker chains)

    def _started(self, fg: FactorGraph, state: Tensor) -> None:
        """At the end of ``setup``: refuse a start of zero density (no move could leave it); calibrate the share."""
        if not bool(torch.isfinite(fg.log_joint(state)).all()):
            raise ValueError(
                "SplitMergeGMM: the starting state has zero density (e.g. no active mixture for the points); "
                "start from a state with a finite log density, such as neuralblock.kernels.base.sequential_init(fg)"
            )
        if self._share_pending and self.share_calibration is not None:  # at setup: not in any transition's time
            self._share_pending = False
            self.gibbs_prob = self.share_calibration.calibrate(
                lambda: self.single_site.sweep(fg, state.clone(), adapt=False, record=False),
                lambda: self.single_site.label_steps_after(self._split_merge_sweep(fg, state.clone(), warmup=True)),
            )

    @staticmethod
    def _checked_layout(fg: FactorGraph) -> MixtureLayout:
        layout = mixture_layout(fg)
        if int(layout.movable.sum()) < 2:
            raise ValueError("SplitMergeGMM needs at least two mixtures whose means and bits are all latent")
        return layout

    def _prepare(self, fg: FactorGraph) -> None:
        self._share_pending = self.share_calibration is not None
        self.layout = self._checked_layout(fg)
        m = len(self.layout.active)
        self.moves_per_sweep = self._moves_arg if self._moves_arg is not None else m * (m - 1) // 2
        self.single_site = SingleSiteSweep(
            fg,
            self.step_size,
            "SplitMergeGMM",
            copy_moves=self._copy_moves,
            informed_means=self._informed_means,
            label_steps=self._label_steps,
        )
        self._scaffolds = _mixture_scaffolds(fg, self.layout)
        self._sweep_arrays = None
        if self.compiled is not False and NUMBA and self.device.type == "cpu":
            self._sweep_arrays = sweep_arrays(fg, self.layout, self.tuning, self._move_log_probs.exp())
        if self.compiled and self._sweep_arrays is None:
            raise ValueError(
                "SplitMergeGMM(compiled=True): a move changes a factor the compiled sweep does not know (it knows "
                "the mixture's points, the means' parentless Gaussian priors and factors of one bit alone) or the "
                "state is not on the CPU; use compiled=None or False"
            )

    def _refresh(self, fg: FactorGraph) -> None:
        """Re-read the mixture parameters (sigma, tau, p, c); scaffolds and step sizes are kept."""
        self.layout = self._checked_layout(fg)
        self.single_site.refresh(fg)
        if self._sweep_arrays is not None:
            self._sweep_arrays = sweep_arrays(fg, self.layout, self.tuning, self._move_log_probs.exp())

    def _reset_stats(self) -> None:
        self._turns = 0  # transitions whose turn was decided since setup (the alternate schedule's clock)
        self._counts = torch.zeros(3, len(MOVES), dtype=torch.long)  # proposed, accepted, unavailable
        self._recent = dict.fromkeys(MOVES, 0.0)
        self._nonfinite = torch.zeros((), dtype=torch.long)
        self._move_seconds = 0.0
        self._attempts = 0  # post-warmup batched attempts (each one per chain)
        self._single_sweeps = 0

    def _move(self, state: Tensor, values: Tensor, counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One batched move attempt in every chain (``values``: the state's :func:`_scaffold_values`).

        Adds to ``counts [3, moves]``; returns the new states, their scaffold values and the non-finite ratios.
        """
        draws = torch.searchsorted(self._kind_cdf, torch.rand(state.shape[0], dtype=torch.float64), right=True)
        kinds = self._kind_codes[draws.clamp(max=len(self._kind_codes) - 1)]
        move = propose_moves(kinds, self.layout, state, self._move_log_probs, self.tuning)
        proposed = _scaffold_values(self._graph(), self._scaffolds, move.state)
        delta = _energy_change(self._scaffolds, values, proposed, move.mixtures)
        log_alpha = torch.where(move.available, delta + (move.log_q_rev - move.log_q_fwd).double(), -math.inf)
        info = mh_decide(log_alpha, torch.rand_like(log_alpha).log())
        accepted = info.accepted & move.available
        counts[0].index_add_(0, kinds, move.available.long())
        counts[1].index_add_(0, kinds, accepted.long())
        counts[2].index_add_(0, kinds, (~move.available).long())
        keep = accepted[:, None]
        values = torch.where(keep, proposed, values)
        return torch.where(keep, move.state, state), values, torch.as_tensor(info.num_nonfinite)

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        fg = self._graph()
        self._turns += 1
        if single_site_turn(self.schedule, self.gibbs_prob, self._turns - 1):
            state = self.single_site.sweep(fg, state, adapt=warmup)
            if not warmup:
                self._single_sweeps += 1
            return state
        return self.single_site.label_steps_after(self._split_merge_sweep(fg, state, warmup))

    def _split_merge_sweep(self, fg: FactorGraph, state: Tensor, warmup: bool) -> Tensor:
        """``moves_per_sweep`` batched move attempts (counted after warmup)."""
        start = time.perf_counter()
        if self._sweep_arrays is not None and state.dtype in (torch.float32, torch.float64):
            state, counts, nonfinite = self._compiled_sweep(state, self._sweep_arrays)
        else:
            counts = torch.zeros(3, len(MOVES), dtype=torch.long)
            nonfinite = torch.zeros((), dtype=torch.long)
            with torch.no_grad():
                values = _scaffold_values(fg, self._scaffolds, state)  # kept up to date as moves are accepted
                for _ in range(self.moves_per_sweep):  # sequential attempts, each batched over the chains
                    state, values, bad = self._move(state, values, counts)
                    nonfinite = nonfinite + bad
        for k, proposed, accepted in zip(MOVES, counts[0].tolist(), counts[1].tolist()):
            if proposed:
                self._recent[k] = accepted / proposed
        if not warmup:
            self._counts += counts
            self._nonfinite = self._nonfinite + nonfinite
            self._attempts += self.moves_per_sweep
            self._move_seconds += time.perf_counter() - start
        return state

    def _compiled_sweep(self, state: Tensor, arrays: SweepArrays) -> tuple[Tensor, Tensor, Tensor]:
        """A split-merge sweep as one compiled call (:func:`~neuralblock.kernels.jit_split_merge.split_merge_sweep`).

        Returns the new states, the counts ``[3, moves]`` (proposed, accepted, unavailable) and the non-finite ratios.
        """
        new_state, counts, nonfinite, seconds = _compiled_attempts(
            state, arrays, self.moves_per_sweep, self._compiled_layouts
        )
        self.compile_seconds += seconds
        return new_state, counts, nonfinite

    def logging(self) -> dict[str, float]:
        """Latest acceptance per move type (last split-merge sweep) and the number of active mixtures (chain mean)."""
        out = {f"acc_{k}": round(a, 3) for k, a in self._recent.items()}
        if self._state is not None and hasattr(self, "layout"):
            out["M"] = float(self._state[..., self.layout.active].sum(-1).mean())
        return out

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup acceptance (per move type and overall), proposals, unavailable attempts, rates."""
        proposed, accepted, unavailable = (row.tolist() for row in self._counts)
        return {
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: no trajectories)
            "acceptance_by_move": {k: a / p if p else 0.0 for k, a, p in zip(MOVES, accepted, proposed)},
            "acceptance_rate": sum(accepted) / sum(proposed) if sum(proposed) else 0.0,
            "proposed": {k: float(p) for k, p in zip(MOVES, proposed)},
            "unavailable": {k: float(u) for k, u in zip(MOVES, unavailable)},
            "chains": float(self.chains),
            "updates_per_second": per_second(self._attempts * self.chains, self._move_seconds),
            "transitions_per_second": self._transitions_per_second(),
            "nonfinite_rejections": float(self._nonfinite),
            "single_site_sweeps": float(self._single_sweeps),
            "compiled_moves": self._sweep_arrays is not None,
            "compile_seconds": self.compile_seconds,
            "gibbs_prob": self.gibbs_prob,
            "schedule": self.schedule,
            "gibbs_share_seconds": dict(self.share_calibration.seconds) if self.share_calibration else {},
            **(self.single_site.report() if hasattr(self, "single_site") else {}),
        }


def _compiled_attempts(
    state: Tensor, arrays: SweepArrays, attempts: int, layouts: set[tuple]
) -> tuple[Tensor, Tensor, Tensor, float]:
    """``attempts`` compiled move attempts on every chain of ``state [K, N]`` (a CPU tensor).

    Returns the new states, the counts ``[3, moves]``, the non-finite ratios and the seconds of a first compile.
    """
    states = state.detach().to(torch.float64, copy=True).numpy()  # the loop's own copy, changed in place
    draws = draw_attempts(states.shape[0], attempts, arrays.mean_ids.shape[1])
    round32 = state.dtype != torch.float64
    (counts, nonfinite), seconds = timed_first_call(layouts, (), split_merge_sweep, states, arrays, draws, round32)
    return torch.from_numpy(states).to(state.dtype), torch.from_numpy(counts), torch.tensor(nonfinite), seconds


class MixtureSplitMoves:
    """Smart splits and dumb merges of an open-universe GMM, compiled, for other kernels' transitions to end with.

    The data-driven pair of :class:`SplitMergeGMM`'s moves (``smart_split``: an active mixture's points split along
    their principal axis, the two means drawn around the halves' centroids; its reverse ``dumb_merge``), each
    attempt an exact MH move with probability 1/2 each. On a held-out 20 x 1000 GMM, chains of the neural sampler
    that had settled at too few copies of the large clusters (M = 9-10, where split-merge's posterior puts 14-15)
    stayed there for 40 s of its own moves; a split-merge kernel with only these two kinds took them to M >= 13
    in one or two transitions (:class:`~neuralblock.NeuralBlockKernel`'s ``split_moves``).

    Args:
        arrays: the compiled sweep's view of the graph (:meth:`of` builds it, with only these two kinds).
        attempts: attempts per :meth:`move` (each one batched over the chains).

    Example:
        >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
        >>> fg = gmm_graph(torch.cat([torch.randn(20, 2) - 4, torch.randn(20, 2) + 4]), 4, 1.0, 5.0, 0.5)
        >>> moves = MixtureSplitMoves.of(fg, attempts=3)
        >>> moves.move(torch.stack([gmm_initial_state(fg)] * 2)).shape
        torch.Size([2, 92])
        >>> sorted(moves.acceptance())
        ['dumb_merge', 'smart_split']
    """

    KINDS = ("smart_split", "dumb_merge")

    def __init__(self, arrays: SweepArrays, attempts: int) -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"attempts must be a positive int, got {attempts!r}")
        self.arrays, self.attempts = arrays, attempts
        self.compile_seconds = 0.0
        self.counts = torch.zeros(3, len(MOVES), dtype=torch.long)  # proposed, accepted, unavailable (all calls)
        self._layouts: set[tuple] = set()

    @classmethod
    def of(cls, fg: FactorGraph, attempts: int, tuning: MoveTuning | None = None) -> MixtureSplitMoves | None:
        """The moves of ``fg`` with ``attempts`` per call and the shapes ``tuning`` (``None`` where the compiled
        sweep does not cover the graph or Numba is missing).

        Raises:
            ValueError: ``fg`` is not an open-universe GMM (:func:`mixture_layout`), or ``attempts`` is not positive.
        """
        if not NUMBA:  # pragma: no cover - numba is a dependency
            return None
        probs = torch.tensor([0.5 if kind in cls.KINDS else 0.0 for kind in MOVES], dtype=torch.float64)
        arrays = sweep_arrays(fg, mixture_layout(fg), MoveTuning() if tuning is None else tuning, probs)
        return None if arrays is None else cls(arrays, attempts)

    def refresh(self, fg: FactorGraph, tuning: MoveTuning | None = None) -> None:
        """Re-read the graph's parameters (sigma, the priors, the bits' odds) after an update of the same layout.

        Raises:
            ValueError: the compiled sweep no longer covers the graph.
        """
        fresh = MixtureSplitMoves.of(fg, self.attempts, tuning)
        if fresh is None:
            raise ValueError("the split moves' compiled sweep does not cover the updated graph")
        self.arrays = fresh.arrays

    def move(self, state: Tensor) -> Tensor:
        """The CPU states ``[..., N]`` after :attr:`attempts` attempts in every chain (counted in :attr:`counts`)."""
        if state.device.type != "cpu" or state.dim() == 0:
            raise ValueError(f"split moves run on CPU states [..., N], got {tuple(state.shape)} on {state.device}")
        batch = state.reshape(-1, state.shape[-1])
        new_state, counts, _, seconds = _compiled_attempts(batch, self.arrays, self.attempts, self._layouts)
        self.compile_seconds += seconds
        self.counts += counts
        return new_state.reshape(state.shape)

    def acceptance(self) -> dict[str, float]:
        """Acceptance of each kind over the calls so far (NaN where none was proposed)."""
        out = {}
        for kind in self.KINDS:
            proposed, accepted = int(self.counts[0, MOVES.index(kind)]), int(self.counts[1, MOVES.index(kind)])
            out[kind] = accepted / proposed if proposed else math.nan
        return out
