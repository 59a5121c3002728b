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
    >>> sorted(kernel.diagnostics()["acceptance"]) == sorted(MOVES)
    True
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from neuralblock.graph import BlockScaffold, FactorGraph, GaussianMixtureGroup, LinearGaussianGroup
from neuralblock.kernels.base import GraphKernel
from neuralblock.kernels.functional import mh_accept
from neuralblock.kernels.single_site import SingleSiteSweep

__all__ = [
    "MOVES",
    "REVERSE_MOVE",
    "MixtureLayout",
    "MoveProposal",
    "MoveTuning",
    "SplitMergeGMM",
    "mixture_layout",
    "propose_move",
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
    """

    split_scale: float = 1.0
    dumb_scale: float = 2.0
    merge_bandwidth: float = 3.0
    birth_radius: float = 2.5
    birth_prior_weight: float = 0.1


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
    """A state read through a layout: points ``[n, D]``, means ``[m, D]``, bits ``[m]`` (bool)."""

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
def _read(layout: MixtureLayout, state: Tensor) -> _View:
    return _View(state[layout.points], state[layout.means], state[layout.active] > 0.5)


class _GaussianMixture(NamedTuple):
    """A mixture of ``K`` diagonal Gaussians over values shaped like ``loc[0]`` (every proposal below is one).

    Attributes:
        log_weights: ``[K]`` normalized log mixture weights.
        loc, scale: ``[K, *event]`` component means and standard deviations.
    """

    log_weights: Tensor
    loc: Tensor
    scale: Tensor

    def sample(self) -> Tensor:
        """One draw, shaped like ``loc[0]``."""
        k = int(torch.multinomial(self.log_weights.exp(), 1)) if len(self.log_weights) > 1 else 0
        return self.loc[k] + self.scale[k] * torch.randn_like(self.loc[k])

    def log_prob(self, value: Tensor) -> Tensor:
        """Log density (a 0-dim tensor) of ``value``, shaped like ``loc[0]``."""
        z = (value - self.loc) / self.scale
        per = (-0.5 * z * z - self.scale.log()).reshape(len(self.loc), -1).sum(-1)
        return torch.logsumexp(self.log_weights + per, 0) - 0.5 * value.numel() * math.log(2 * math.pi)


def _gaussian(loc: Tensor, scale: Tensor) -> _GaussianMixture:
    """One diagonal Gaussian as a one-component mixture."""
    return _GaussianMixture(loc.new_zeros(1), loc[None], scale[None])


def _responsibilities(view: _View, sigma: float) -> Tensor:
    """``[n, m]`` posterior label probabilities of the points (0 for inactive mixtures)."""
    d2 = torch.cdist(view.x, view.mu).square() / sigma**2
    return torch.softmax((-0.5 * d2).masked_fill(~view.on, -math.inf), -1)


def _split_dist(view: _View, sigma: float, i: int, tuning: MoveTuning) -> _GaussianMixture:
    """Smart split of mixture ``i``: two means around the halves of its points along their principal axis.

    A pseudo-point at ``mu_i`` keeps every quantity defined for a mixture without points.
    The density is symmetric in the two halves' order, so the axis' sign does not matter.
    """
    x, w = view.x, _responsibilities(view, sigma)[:, i]
    total = w.sum() + 1.0
    mean = (w @ x + view.mu[i]) / total
    centred = x - mean
    cov = (w[:, None] * centred).T @ centred / total + sigma**2 * torch.eye(x.shape[1], dtype=x.dtype) / total
    axis = torch.linalg.eigh(cov).eigenvectors[:, -1]
    side = torch.sigmoid(3.0 * (centred @ axis) / sigma)
    halves = torch.stack([w * side, w * (1 - side)])  # [2, n]
    anchors = torch.stack([mean + sigma * axis, mean - sigma * axis])
    counts = halves.sum(-1) + 1.0
    centres = (halves @ x + anchors) / counts[:, None]  # [2, D]
    scales = (tuning.split_scale * sigma / counts.sqrt())[:, None].expand_as(centres)
    locs = torch.stack([centres, centres.flip(0)])  # [2 orders, 2 means, D]
    half = torch.full((2,), -math.log(2.0), dtype=x.dtype)
    return _GaussianMixture(half, locs, torch.stack([scales, scales.flip(0)]))


def _merge_dist(
    layout: MixtureLayout, view: _View, sigma: float, i: int, j: int, tuning: MoveTuning
) -> _GaussianMixture:
    """Merge ``j`` into ``i``: ``mu_i`` around the centroid of both mixtures' points, ``mu_j`` from its prior."""
    r = _responsibilities(view, sigma)
    w = r[:, i] + r[:, j]
    total = w.sum() + 1.0
    centre = (w @ view.x + 0.5 * (view.mu[i] + view.mu[j])) / total
    spread = (tuning.split_scale * sigma / total.sqrt()).expand_as(centre)
    loc = torch.stack([centre, layout.prior_loc[j].to(centre.dtype)])
    return _gaussian(loc, torch.stack([spread, layout.prior_scale[j].to(centre.dtype)]))


def _dumb_split_dist(view: _View, sigma: float, i: int, tuning: MoveTuning) -> _GaussianMixture:
    """Both means around ``mu_i``, blind to the data."""
    loc = view.mu[i].expand(2, -1)
    return _gaussian(loc, torch.full_like(loc, tuning.dumb_scale * sigma))


def _birth_dist(layout: MixtureLayout, view: _View, sigma: float, j: int, tuning: MoveTuning) -> _GaussianMixture:
    """``mu_j`` near clusters of poorly explained points (two mean-shift steps), or from its prior."""
    x = view.x
    d2 = torch.cdist(x, view.mu).square() / sigma**2
    explained = torch.logsumexp((-0.5 * d2).masked_fill(~view.on, -math.inf), -1).clamp(min=-1e4)
    poorly = torch.sigmoid(_POORLY_EXPLAINED - explained)
    centres = x
    for _ in range(2):
        kernel = torch.exp(-0.5 * torch.cdist(centres, x).square() / (tuning.birth_radius * sigma) ** 2) * poorly
        mass = kernel.sum(-1) + 1.0
        centres = (kernel @ x + centres) / mass[:, None]
    seeds = torch.log(poorly + _POINT_FLOOR)
    seeds = seeds - torch.logsumexp(seeds, 0) + math.log1p(-tuning.birth_prior_weight)
    logits = torch.cat([seeds, torch.tensor([math.log(tuning.birth_prior_weight)], dtype=x.dtype)])
    locs = torch.cat([centres, layout.prior_loc[j].to(x.dtype)[None]])
    spread = (tuning.split_scale * sigma / mass.sqrt())[:, None].expand_as(centres)
    scales = torch.cat([spread, layout.prior_scale[j].to(x.dtype)[None]])
    return _GaussianMixture(logits, locs, scales)


def _merge_pair_logits(view: _View, movable: Tensor, sigma: float, tuning: MoveTuning) -> Tensor:
    """``[m, m]`` log-probabilities of the smart merge's ordered pairs (close pairs first)."""
    d2 = torch.cdist(view.mu, view.mu).square() / (tuning.merge_bandwidth * sigma) ** 2
    ok = (view.on & movable)[:, None] & (view.on & movable)[None, :]
    ok = ok & ~torch.eye(len(movable), dtype=torch.bool)
    logits = (-0.5 * d2).masked_fill(~ok, -math.inf)
    return logits - torch.logsumexp(logits.reshape(-1), 0)


# ------------------------------------------------------------------------------ moves
def _uniform(mask: Tensor) -> int:
    members = mask.nonzero().squeeze(-1)
    return int(members[torch.randint(len(members), ())])


def _choose(kind: str, layout: MixtureLayout, view: _View, tuning: MoveTuning) -> tuple[int, int] | None:
    """Draw the mixtures ``(i, j)`` a move acts on (``i == j`` for births and deaths), or None if it cannot apply."""
    on, off = view.on & layout.movable, ~view.on & layout.movable
    n_on, n_off = int(on.sum()), int(off.sum())
    if kind in ("smart_split", "dumb_split"):
        return (_uniform(on), _uniform(off)) if n_on and n_off else None
    if kind == "dumb_merge":
        if n_on < 2:
            return None
        i = _uniform(on)
        others = on.clone()
        others[i] = False
        return i, _uniform(others)
    if kind == "smart_merge":
        if n_on < 2:
            return None
        log_probs = _merge_pair_logits(view, layout.movable, layout.sigma, tuning).reshape(-1)
        flat = int(torch.multinomial(log_probs.exp(), 1))
        return divmod(flat, len(on))
    if kind == "birth":
        j = _uniform(off) if n_off else None
    else:  # death: never of the last active mixture
        j = _uniform(on) if n_on and int(view.on.sum()) >= 2 else None
    return None if j is None else (j, j)


def _choice_log_prob(
    kind: str, layout: MixtureLayout, view: _View, i: int, j: int, tuning: MoveTuning
) -> Tensor | float:
    """Log-probability that :func:`_choose` draws ``(i, j)`` for ``kind`` from ``view``."""
    if kind == "smart_merge":
        return _merge_pair_logits(view, layout.movable, layout.sigma, tuning)[i, j]
    n_on = int((view.on & layout.movable).sum())
    n_off = int((~view.on & layout.movable).sum())
    if kind in ("smart_split", "dumb_split"):
        return -math.log(n_on) - math.log(n_off)
    if kind == "dumb_merge":
        return -math.log(n_on) - math.log(n_on - 1)
    return -math.log(n_off) if kind == "birth" else -math.log(n_on)


def _move_dist(kind: str, layout: MixtureLayout, view: _View, i: int, j: int, tuning: MoveTuning) -> _GaussianMixture:
    """Distribution of the new means: ``[2, D]`` = ``(mu_i, mu_j)`` for pair moves, ``[D]`` = ``mu_j`` otherwise."""
    sigma = layout.sigma
    if kind == "smart_split":
        return _split_dist(view, sigma, i, tuning)
    if kind == "dumb_split":
        return _dumb_split_dist(view, sigma, i, tuning)
    if kind in ("dumb_merge", "smart_merge"):
        return _merge_dist(layout, view, sigma, i, j, tuning)
    if kind == "birth":
        return _birth_dist(layout, view, sigma, j, tuning)
    return _gaussian(layout.prior_loc[j].to(view.x.dtype), layout.prior_scale[j].to(view.x.dtype))


def _moved_means(kind: str, layout: MixtureLayout, i: int, j: int) -> Tensor:
    """Variable ids of the means a move redraws, shaped like its :func:`_move_dist` samples."""
    return layout.means[[i, j]] if kind in _PAIR_MOVES else layout.means[j]


def propose_move(
    kind: str, layout: MixtureLayout, state: Tensor, move_log_probs: Mapping[str, float], tuning: MoveTuning
) -> MoveProposal | None:
    """Propose one move of type ``kind`` and score both directions (a pure function of the RNG and ``state``).

    ``log_q_fwd = log P(kind) + log c_kind(i, j | state) + log q_kind(new means | state)`` and
    ``log_q_rev`` is the same expression for the reverse move (:data:`REVERSE_MOVE`) from the
    proposed state back to ``state``, evaluated with the same functions as its forward move.

    Args:
        kind: one of :data:`MOVES`.
        layout: from :func:`mixture_layout`.
        state: the current state ``[N]``.
        move_log_probs: log-probability of each move type per attempt.
        tuning: proposal shape parameters.

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
    view = _read(layout, state)
    pick = _choose(kind, layout, view, tuning)
    if pick is None:
        return None
    i, j = pick
    forward = _move_dist(kind, layout, view, i, j, tuning)
    values = forward.sample().to(state.dtype)
    ids = _moved_means(kind, layout, i, j)
    new_state = state.clone()
    new_state[ids] = values
    new_state[layout.active[j]] = 1.0 if kind in _SWITCH_ON else 0.0
    reverse = REVERSE_MOVE[kind]
    new_view = _read(layout, new_state)
    backward = _move_dist(reverse, layout, new_view, i, j, tuning)
    log_q_fwd = move_log_probs[kind] + _choice_log_prob(kind, layout, view, i, j, tuning) + forward.log_prob(values)
    log_q_rev = (
        move_log_probs[reverse]
        + _choice_log_prob(reverse, layout, new_view, i, j, tuning)
        + backward.log_prob(state[ids])
    )
    mixtures = (i, j) if kind in _PAIR_MOVES else (j,)
    return MoveProposal(new_state, mixtures, log_q_fwd, log_q_rev)


# ------------------------------------------------------------------------------ the kernel
class SplitMergeGMM(GraphKernel):
    """Smart-Dumb/Dumb-Smart split-merge MCMC for an open-universe GMM, mixed with single-site updates.

    Each transition is, with probability ``gibbs_prob``, a single-site sweep (Gibbs on the
    bits, random-walk MH on the mean coordinates, as in
    :class:`~neuralblock.kernels.NeuralBlockKernel`), and otherwise ``moves_per_sweep``
    split/merge/birth/death attempts (module docstring), each an exact MH move whose type
    is drawn with probabilities ``move_weights``. The target is the graph's own: each
    move's ratio evaluates the scaffold of the changed mixtures' block.

    Args:
        model: a :class:`FactorGraph` with one :class:`~neuralblock.graph.GaussianMixtureGroup`
            whose means have ``N(c, tau^2)`` priors (e.g. ``motifs.gmm_pair.gmm_graph``); a Pyro
            model has no such group, so it is refused.
        gibbs_prob: probability of a single-site sweep per transition.
        moves_per_sweep: move attempts per split-merge transition (default: the number of
            pairs of all ``m`` mixtures, movable or not, as many as a neural block sweep over
            all pairs proposes).
        move_weights: relative probability of each move type (default all equal); a move and
            its reverse must both be positive or both zero.
        step_size: initial random-walk step for the single-site sweep.
        tuning: proposal shape parameters.

    Raises:
        TypeError: ``model`` is not a :class:`FactorGraph`.
        ValueError: bad arguments, or a graph that is not an open-universe GMM.
    """

    def __init__(
        self,
        model: FactorGraph,
        gibbs_prob: float = 0.5,
        moves_per_sweep: int | None = None,
        move_weights: Mapping[str, float] | None = None,
        step_size: float = 0.5,
        tuning: MoveTuning | None = None,
    ) -> None:
        if not isinstance(model, FactorGraph):
            raise TypeError(
                f"SplitMergeGMM needs a FactorGraph with a GaussianMixtureGroup (e.g. motifs.gmm_pair.gmm_graph), "
                f"got {type(model).__name__}"
            )
        super().__init__(model)
        if not 0.0 <= gibbs_prob <= 1.0:
            raise ValueError(f"gibbs_prob must be in [0, 1], got {gibbs_prob}")
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
        self.gibbs_prob = float(gibbs_prob)
        self.step_size = float(step_size)
        self._moves_arg = None if moves_per_sweep is None else int(moves_per_sweep)
        total = sum(weights.values())
        self._kinds = [k for k in MOVES if weights[k] > 0]
        self._kind_cdf = list(itertools.accumulate(weights[k] / total for k in self._kinds))
        self.move_log_probs = {k: math.log(w / total) if w > 0 else -math.inf for k, w in weights.items()}
        self._checked_layout(model)  # fail early on a graph that is not an open-universe GMM
        self._reset_stats()  # diagnostics() and logging() answer before setup (e.g. in the parent of worker chains)

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Set up as any graph kernel; refuse a start of zero density (no move could leave it).

        Raises:
            ValueError: the starting state has log density ``-inf`` (e.g. no active mixture for the points).
        """
        super().setup(warmup_steps, *args, **kwargs)
        if self._state is not None and not bool(torch.isfinite(self._graph().log_joint(self._state))):
            raise ValueError(
                "SplitMergeGMM: the starting state has zero density (e.g. no active mixture for the points); "
                "start from a state with a finite log density, such as neuralblock.kernels.base.sequential_init(fg)"
            )

    @staticmethod
    def _checked_layout(fg: FactorGraph) -> MixtureLayout:
        layout = mixture_layout(fg)
        if int(layout.movable.sum()) < 2:
            raise ValueError("SplitMergeGMM needs at least two mixtures whose means and bits are all latent")
        return layout

    def _prepare(self, fg: FactorGraph) -> None:
        self.layout = self._checked_layout(fg)
        m = len(self.layout.active)
        self.moves_per_sweep = self._moves_arg if self._moves_arg is not None else m * (m - 1) // 2
        self.single_site = SingleSiteSweep(fg, self.step_size, "SplitMergeGMM")
        self._scaffolds: dict[tuple[int, ...], BlockScaffold] = {}

    def _refresh(self, fg: FactorGraph) -> None:
        """Re-read the mixture parameters (sigma, tau, p, c); moves' scaffolds and step sizes are kept."""
        self.layout = self._checked_layout(fg)

    def _scaffold(self, mixtures: tuple[int, ...]) -> BlockScaffold:
        """The scaffold of the block ``(mu_i, v_i[, mu_j, v_j])`` (built on first use, then cached)."""
        key = tuple(sorted(mixtures))
        if key not in self._scaffolds:
            layout = self.layout
            block = torch.cat([torch.cat([layout.means[k], layout.active[k : k + 1]]) for k in key])
            self._scaffolds[key] = self._graph().scaffold(block[None])
        return self._scaffolds[key]

    def _reset_stats(self) -> None:
        self._proposed = dict.fromkeys(MOVES, 0)
        self._accepted = dict.fromkeys(MOVES, 0)
        self._unavailable = dict.fromkeys(MOVES, 0)
        self._recent = dict.fromkeys(MOVES, 0.0)
        self._nonfinite = 0
        self._move_seconds = 0.0
        self._attempts = 0
        self._single_sweeps = 0

    def _move(self, state: Tensor, counts: dict[str, list[int]]) -> tuple[Tensor, int]:
        """One move attempt; returns the new state and the number of non-finite ratios."""
        kind = self._kinds[min(bisect.bisect(self._kind_cdf, float(torch.rand(()))), len(self._kinds) - 1)]
        move = propose_move(kind, self.layout, state, self.move_log_probs, self.tuning)
        if move is None:
            counts[kind][2] += 1
            return state, 0
        local = self._scaffold(move.mixtures).local_log_density(self._graph(), torch.stack([state, move.state]))
        info = mh_accept((local[1, 0] - local[0, 0] + move.log_q_rev - move.log_q_fwd).reshape(1))
        counts[kind][0] += 1
        nonfinite = int(info.num_nonfinite)  # an int already (mh_accept)
        if bool(info.accepted[0]):
            counts[kind][1] += 1
            return move.state, nonfinite
        return state, nonfinite

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        fg = self._graph()
        if float(torch.rand(())) < self.gibbs_prob:
            state = self.single_site.sweep(fg, state, adapt=warmup)
            if not warmup:
                self._single_sweeps += 1
            return state
        start = time.perf_counter()
        counts = {k: [0, 0, 0] for k in MOVES}  # proposed, accepted, unavailable
        nonfinite = 0
        with torch.no_grad():
            for _ in range(self.moves_per_sweep):
                state, bad = self._move(state, counts)
                nonfinite += bad
        for k, (proposed, accepted, unavailable) in counts.items():
            if proposed:
                self._recent[k] = accepted / proposed
            if not warmup:
                self._proposed[k] += proposed
                self._accepted[k] += accepted
                self._unavailable[k] += unavailable
        if not warmup:
            self._nonfinite += nonfinite
            self._attempts += self.moves_per_sweep
            self._move_seconds += time.perf_counter() - start
        return state

    def logging(self) -> dict[str, float]:
        """Latest acceptance per move type (from the last split-merge sweep) and the number of active mixtures."""
        out = {f"acc_{k}": round(a, 3) for k, a in self._recent.items()}
        if self._state is not None and hasattr(self, "layout"):
            out["M"] = float(self._state[self.layout.active].sum())
        return out

    def diagnostics(self) -> dict:
        """Post-warmup acceptance, proposals and unavailable attempts per move type, moves per second."""
        return {
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: no trajectories)
            "acceptance": {k: self._accepted[k] / self._proposed[k] if self._proposed[k] else 0.0 for k in MOVES},
            "proposed": {k: float(self._proposed[k]) for k in MOVES},
            "unavailable": {k: float(self._unavailable[k]) for k in MOVES},
            "moves_per_second": self._attempts / self._move_seconds if self._move_seconds > 0 else 0.0,
            "nonfinite_rejections": float(self._nonfinite),
            "single_site_sweeps": float(self._single_sweeps),
        }
