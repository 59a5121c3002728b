"""The ``gmm_pair`` motif: two mixtures of an open-universe Gaussian mixture model.

An open-universe GMM has ``m`` candidate mixtures, each with an activity bit
``v_k ~ Bernoulli(p)`` and a mean ``mu_k ~ N(c, tau^2 I)`` in ``D`` dimensions; the number
of mixtures in use is ``M = sum_k v_k`` (at least one). Each point ``x_j`` belongs to one
of the active mixtures, uniformly, and ``x_j ~ N(mu_{z_j}, sigma^2 I)``. The labels ``z``
are summed out: the points' factors form one
:class:`~neuralblock.graph.GaussianMixtureGroup` (build a graph with :func:`gmm_graph`).

The motif (the GMM experiment of the seed paper):

* **B**: ``(mu_i, v_i, mu_j, v_j)`` of a pair of mixtures, in that order
  (``BlockSpec([0]*D + [2] + [0]*D + [2])``), so one proposal can switch a mixture on,
  off, split one cluster into two or merge two;
* **C**: the other mixtures and the points;
* **Psi**: ``sigma``, ``tau``, ``p`` and the prior mean ``c``.

**Context selection.** The proposal is trained at ``m = 8`` mixtures and ``n = 60``
points and applies to larger models by looking at ``mixtures - 2`` other mixtures and
``points`` points. Both are chosen from ``C`` alone, so the forward and reverse moves
see the same context and the MH ratio stays exact. Points are ranked by how well the
other active mixtures explain them (``log sum_k v_k N(x; mu_k, sigma^2 I)``, least
explained first); with at most ``points`` points the slots hold them in that order, and
with more, every ``(n / points)``-th point of that order, so the slots hold a sample of
the data with its cluster proportions, like a model of the training size (the first
``points`` points alone would look like one big unexplained cluster in a small model and
make the proposal over-eager to add mixtures). The other mixtures are the active ones
nearest to the selected points. Coordinates are shifted by ``c``
and measured in units of ``sigma`` (the whitening map ``B = c + sigma u`` on the means,
:meth:`GmmPairMotif.block_affine`), so one proposal serves any location and scale.

**Features** (``D = 2``: 273 numbers): ``log(tau / sigma)``, ``logit p``, the number of
active other mixtures and of points (log), the mass and centroid of the poorly explained
points, two *anchors* (centre, log mass and spread of the poorly explained points around the
least explained point, by two mean-shift steps, then around the least explained point
away from the first anchor); per selected other mixture ``[v, v u / 4]``; per selected point
``[u / 4, explained / 10, 1]`` (zeros for absent slots).

**Scale groups.** Each of the two means has its own proposal scale per component
(``BlockSpec.scale_groups``), so an inactive mean can be proposed from a broad,
prior-like Gaussian while an active one is pinned to its cluster.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018 (the
    open-universe GMM and its pair motif).

Example:
    >>> import torch
    >>> fg = gmm_graph(torch.randn(30, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> motif = GmmPairMotif()
    >>> inst = motif.find_instances(fg)
    >>> len(inst), inst.blocks.shape[1]  # 4 choose 2 pairs of (mu_i, v_i, mu_j, v_j)
    (6, 6)
    >>> motif.encode(fg, inst, gmm_initial_state(fg)).shape
    torch.Size([6, 273])
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, GaussianMixtureGroup, LinearGaussianGroup, TableGroup
from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, register_motif
from neuralblock.proposals import NeuralBlockProposal

__all__ = [
    "GmmPairMotif",
    "gmm_graph",
    "gmm_initial_state",
    "pair_log_density",
    "prior_proposal",
    "sample_gmm",
]

_EXPLAINED_FLOOR = -30.0  # log-density floor of a point no active mixture explains
_POORLY_EXPLAINED = -3.0  # a point farther than ~2.5 sigma from every active mean
_COORD_SCALE = 4.0
_ANCHOR_RADIUS = 2.5
_MC_CHUNK = 4  # proposals per chunk in the Monte Carlo acceptance density


# ------------------------------------------------------------------------------ models
def gmm_graph(
    points: Tensor,
    num_mixtures: int,
    sigma: float,
    tau: float,
    p_active: float,
    prior_mean: Tensor | None = None,
) -> FactorGraph:
    """The factor graph of an open-universe GMM with observed ``points [n, D]``.

    Variables are named ``mu[k,d]``, ``v[k]`` and ``x[j,d]`` (observed).

    Args:
        points: ``[n, D]`` finite observations.
        num_mixtures: candidate mixtures ``m >= 2``.
        sigma: the points' standard deviation around their mean.
        tau: the prior standard deviation of each mean coordinate.
        p_active: prior probability that a mixture is active, in ``(0, 1)``.
        prior_mean: ``[D]`` prior mean of the means (default 0).

    Raises:
        ValueError: for non-finite points, wrong shapes or out-of-range parameters.
    """
    points = torch.as_tensor(points, dtype=torch.get_default_dtype())
    if points.dim() != 2 or points.shape[0] < 1 or not torch.isfinite(points).all():
        raise ValueError(f"points must be a finite [n, D] tensor, got shape {tuple(points.shape)}")
    n, dim = points.shape
    if int(num_mixtures) != num_mixtures or num_mixtures < 2:
        raise ValueError(f"num_mixtures must be an integer >= 2, got {num_mixtures}")
    if not (sigma > 0 and tau > 0 and math.isfinite(sigma) and math.isfinite(tau)):
        raise ValueError(f"sigma and tau must be finite and positive, got {sigma}, {tau}")
    if not 0.0 < p_active < 1.0:
        raise ValueError(f"p_active must lie in (0, 1), got {p_active}")
    center = torch.zeros(dim) if prior_mean is None else torch.as_tensor(prior_mean, dtype=points.dtype).reshape(-1)
    if center.shape != (dim,) or not torch.isfinite(center).all():
        raise ValueError(f"prior_mean must be a finite [{dim}] tensor")
    fg = FactorGraph()
    m = int(num_mixtures)
    means = torch.tensor([[fg.add_variable(f"mu[{k},{d}]") for d in range(dim)] for k in range(m)])
    active = torch.tensor([fg.add_variable(f"v[{k}]", 2) for k in range(m)])
    ids = torch.tensor([[fg.add_variable(f"x[{j},{d}]") for d in range(dim)] for j in range(n)])
    fg.add_table_factors(active[:, None], torch.tensor([math.log1p(-p_active), math.log(p_active)]).expand(m, 2))
    for k in range(m):
        for d in range(dim):
            fg.add_linear_gaussian(int(means[k, d]), [], [], float(center[d]), float(tau))
    fg.add_group(GaussianMixtureGroup(ids, means, active, float(sigma)))
    fg.set_evidence({int(v): float(x) for v, x in zip(ids.reshape(-1), points.reshape(-1))})
    return fg


def sample_gmm(
    num_mixtures: int,
    num_points: int,
    generator: torch.Generator,
    sigma: float = 1.0,
    tau: float = 5.0,
    p_active: float = 0.5,
    dim: int = 2,
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw ``(points [n, D], means [m, D], active [m])`` from the open-universe GMM (at least one active).

    Example:
        >>> points, means, active = sample_gmm(8, 60, torch.Generator().manual_seed(0))
        >>> points.shape, bool(active.sum() >= 1)
        (torch.Size([60, 2]), True)
    """
    dtype = torch.get_default_dtype()
    active = torch.zeros(num_mixtures, dtype=dtype)
    while active.sum() == 0:
        active = (torch.rand(num_mixtures, generator=generator, dtype=dtype) < p_active).to(dtype)
    means = tau * torch.randn(num_mixtures, dim, generator=generator, dtype=dtype)
    labels = torch.multinomial(active, num_points, replacement=True, generator=generator)
    points = means[labels] + sigma * torch.randn(num_points, dim, generator=generator, dtype=dtype)
    return points, means, active


def gmm_initial_state(fg: FactorGraph, generator: torch.Generator | None = None) -> Tensor:
    """A random state of a GMM graph with at least one active mixture per mixture group."""
    state = fg.initial_state(generator)
    for group in fg.groups:
        if isinstance(group, GaussianMixtureGroup):
            first = int(group.active[0])
            if first not in fg.evidence:
                state[first] = 1.0
    return state


def pair_log_density(
    pair: Tensor,
    u_points: Tensor,
    u_others: Tensor,
    v_others: Tensor,
    log_ratio: Tensor,
    logit_p: Tensor,
    point_mask: Tensor | None = None,
) -> Tensor:
    """Unnormalized ``log p(B | C)`` of whitened pair values, all points and all other mixtures.

    Args:
        pair: ``[..., B, 2D + 2]`` whitened blocks ``(u_i, v_i, u_j, v_j)``.
        u_points: ``[B, n, D]`` whitened points; ``u_others`` ``[B, m - 2, D]``; ``v_others`` ``[B, m - 2]``
            (0 for padding).
        log_ratio: ``[B]`` ``log(tau / sigma)``; ``logit_p``: ``[B]``.
        point_mask: optional ``[B, n]``, False for padding points (default: every point is real).

    Returns:
        ``[..., B]``.
    """
    dim = u_points.shape[-1]
    u_i, v_i, u_j, v_j = pair.split([dim, 1, dim, 1], -1)
    means = torch.cat([u_i.unsqueeze(-2), u_j.unsqueeze(-2), u_others.expand(u_i.shape[:-1] + u_others.shape[-2:])], -2)
    bits = torch.cat([v_i, v_j, v_others.expand(v_i.shape[:-1] + v_others.shape[-1:])], -1)
    d2 = ((u_points.unsqueeze(-2) - means.unsqueeze(-3)) ** 2).sum(-1)  # [..., B, n, m]
    count = bits.sum(-1)
    per_point = torch.logsumexp(torch.log(bits).unsqueeze(-2) - 0.5 * d2, -1)  # [..., B, n]
    if point_mask is None:
        lik = per_point.sum(-1) - u_points.shape[-2] * torch.log(count)
    else:
        lik = per_point.masked_fill(~point_mask, 0.0).sum(-1) - point_mask.sum(-1) * torch.log(count)
    lik = torch.where(count > 0, lik, torch.full_like(lik, -math.inf))
    var = torch.exp(2 * log_ratio).unsqueeze(-1)
    prior_means = -0.5 * ((u_i * u_i + u_j * u_j) / var).sum(-1)
    log_on, log_off = torch.nn.functional.logsigmoid(logit_p), torch.nn.functional.logsigmoid(-logit_p)
    prior_bits = ((v_i + v_j) * log_on.unsqueeze(-1) + (2 - v_i - v_j) * log_off.unsqueeze(-1)).squeeze(-1)
    return lik + prior_means + prior_bits


def prior_proposal(motif: GmmPairMotif) -> NeuralBlockProposal:
    """The GMM prior as a (fixed, not learned) pair proposal: the baseline a learned one must beat.

    A one-component MDN without hidden layers reads ``log(tau / sigma)`` and ``logit p``
    straight from the features, so ``q(B | C) = p(B)`` (means ``N(c, tau^2 I)``, bits
    ``Bernoulli(p)``) in any graph. It runs in :class:`~neuralblock.NeuralBlockKernel`
    like any trained proposal.

    Example:
        >>> motif = GmmPairMotif()
        >>> batch = motif.sample_training_batch(4, torch.Generator().manual_seed(0))
        >>> q = prior_proposal(motif)(batch.features)
        >>> bool(torch.allclose(q.log_scale[:, 0, 0], batch.features[:, 0]))
        True
    """
    proposal = NeuralBlockProposal(motif, components=1, hidden=(), metadata={"kind": "prior"})
    mdn = proposal.mdn
    with torch.no_grad():
        for head in (mdn.mixture_head, mdn.discrete_head, mdn.loc_head, mdn.scale_head):
            if head is not None:
                head.weight.zero_()
                head.bias.zero_()
        mdn.discrete_head.weight[1, 1] = 1.0  # logits of (v_i = 1), (v_j = 1): logit p
        mdn.discrete_head.weight[3, 1] = 1.0
        mdn.scale_head.weight[:, 0] = 1.0  # log scale of each mean: log(tau / sigma)
    return proposal.eval()


# ------------------------------------------------------------------------------ the motif
class GmmPairMotif(Motif):
    """Two mixtures ``(mu_i, v_i, mu_j, v_j)`` of an open-universe GMM, labels summed out.

    Args:
        dim: dimension ``D`` of the points and means.
        mixtures: mixtures the proposal looks at (the pair plus ``mixtures - 2`` others).
        points: points the proposal looks at.
    """

    name = "gmm_pair"
    version = 1

    def __init__(self, dim: int = 2, mixtures: int = 8, points: int = 60) -> None:
        for label, value, low in (("dim", dim, 1), ("mixtures", mixtures, 2), ("points", points, 1)):
            if int(value) != value or value < low:
                raise ValueError(f"gmm_pair option {label} must be an integer >= {low}, got {value!r}")
        self.dim, self.mixtures, self.points = int(dim), int(mixtures), int(points)

    def options(self) -> dict[str, Any]:
        return {"dim": self.dim, "mixtures": self.mixtures, "points": self.points}

    @property
    def block_spec(self) -> BlockSpec:
        mean = [0] * self.dim
        return BlockSpec([*mean, 2, *mean, 2], scale_groups=[0] * self.dim + [1] * self.dim)

    @property
    def feature_dim(self) -> int:
        d = self.dim
        return 4 + (1 + d) + 2 * (d + 2) + (self.mixtures - 2) * (1 + d) + self.points * (d + 2)

    def describe(self) -> str:
        """The structure the motif looks for, in words (shown when a model has no instance).

        Example:
            >>> GmmPairMotif(dim=2).describe().split(":")[0]
            'pairs of mixtures (mean in 2 continuous dims, binary activity) of an open-universe Gaussian mixture'
        """
        return (
            f"pairs of mixtures (mean in {self.dim} continuous dims, binary activity) of an open-universe Gaussian "
            f"mixture: a GaussianMixtureGroup of dimension {self.dim} with the labels summed out (built by "
            "motifs.gmm_pair.gmm_graph)"
        )

    # -- structure ----------------------------------------------------------------
    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        """Every pair of mixtures of every :class:`GaussianMixtureGroup` of dimension ``dim``."""
        latent = set(fg.latent.tolist())
        rows: list[tuple[list[int], list[int], list[int], list[int], list[float]]] = []
        for group in fg.groups:
            if not isinstance(group, GaussianMixtureGroup) or group.dim != self.dim:
                continue
            m = group.means.shape[0]
            psi = [self._prior(fg, group, k) for k in range(m)]
            for i, j in round_robin_pairs(m):
                block = [*group.means[i].tolist(), int(group.active[i])]
                block += [*group.means[j].tolist(), int(group.active[j])]
                if not set(block) <= latent:
                    continue
                if psi[i] != psi[j]:
                    raise ValueError(f"gmm_pair: mixtures {i} and {j} have different priors {psi[i]} vs {psi[j]}")
                others = [k for k in range(m) if k not in (i, j)]
                rows.append(
                    (
                        block,
                        group.points.reshape(-1).tolist(),
                        group.means[others].reshape(-1).tolist(),
                        group.active[others].tolist(),
                        [group.sigma, *psi[i]],
                    )
                )
        b = 2 * self.dim + 2
        if not rows:
            return MotifInstances(
                torch.zeros(0, b, dtype=torch.long),
                torch.zeros(0, 0, dtype=torch.long),
                torch.zeros(0, 3 + self.dim),
                {
                    "points": torch.zeros(0, 0, self.dim, dtype=torch.long),
                    "other_means": torch.zeros(0, 0, self.dim, dtype=torch.long),
                    "other_active": torch.zeros(0, 0, dtype=torch.long),
                },
            )

        def pad(lists: list[list[int]]) -> Tensor:
            width = max(len(r) for r in lists)
            return torch.tensor([r + [-1] * (width - len(r)) for r in lists], dtype=torch.long)

        blocks = torch.tensor([r[0] for r in rows], dtype=torch.long)
        points, other_means, other_active = (pad([r[k] for r in rows]) for k in (1, 2, 3))
        context = torch.cat([points, other_means, other_active], 1)
        params = torch.tensor([r[4] for r in rows], dtype=torch.get_default_dtype())
        extra = {
            "points": points.reshape(len(rows), -1, self.dim),
            "other_means": other_means.reshape(len(rows), -1, self.dim),
            "other_active": other_active,
        }
        return MotifInstances(blocks, context, params, extra)

    def _prior(self, fg: FactorGraph, group: GaussianMixtureGroup, k: int) -> tuple[float, ...]:
        """``(tau, p, c_1 .. c_D)`` of mixture ``k`` from its prior factors."""
        found: dict[str, Any] = {}
        targets = {int(v): d for d, v in enumerate(group.means[k].tolist())}
        bit = int(group.active[k])
        centers = [math.nan] * self.dim
        taus = []
        for var in [*targets, bit]:
            for _, node in fg.graph.edges(("v", var)):
                fid = node[1]
                scope = fg.factor_scope(fid)
                if len(scope) != 1:
                    continue
                group_index, rows = fg.factor_location(torch.tensor([fid]))
                grp, row = fg.groups[int(group_index[0])], int(rows[0])
                if var == bit and isinstance(grp, TableGroup):
                    found["p"] = float(torch.softmax(grp.log_tables[row].reshape(-1), 0)[1])
                elif var in targets and isinstance(grp, LinearGaussianGroup):
                    centers[targets[var]] = float(grp.bias[row])
                    taus.append(float(grp.scale[row]))
        if "p" not in found or any(math.isnan(c) for c in centers) or len(set(taus)) != 1:
            raise ValueError(
                f"gmm_pair needs a Bernoulli prior on v[{k}] and one N(c, tau) prior (same tau) on each "
                f"coordinate of mu[{k}]: build the model with gmm_graph"
            )
        return (taus[0], found["p"], *centers)

    # -- features -----------------------------------------------------------------
    def _whitened(self, instances: MotifInstances, state: Tensor) -> tuple[Tensor, ...]:
        params = instances.params.to(state.dtype)
        sigma, tau, p = params[:, 0], params[:, 1], params[:, 2]
        center = params[:, 3:]
        pts = instances.extra["points"]
        scale = sigma[:, None, None]
        u_points = (state[..., pts.clamp(min=0)] - center[:, None, :]) / scale
        u_others = (state[..., instances.extra["other_means"].clamp(min=0)] - center[:, None, :]) / scale
        other_active = instances.extra["other_active"]
        zero = torch.zeros((), dtype=state.dtype)
        v_others = torch.where(other_active >= 0, state[..., other_active.clamp(min=0)], zero)
        psi = torch.stack([torch.log(tau / sigma), torch.logit(p)], -1)
        return u_points, pts[..., 0] >= 0, u_others, v_others, psi

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """Features ``[..., I, feature_dim]``."""
        return self.features(*self._whitened(instances, state))

    def block_affine(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> tuple[Tensor, Tensor]:
        """``B = loc + diag(scale) u``: means shifted by ``c`` and scaled by ``sigma``, bits unchanged."""
        params = instances.params.to(state.dtype)
        sigma, center = params[:, 0:1], params[:, 3:]
        zero, one = torch.zeros_like(sigma), torch.ones_like(sigma)
        loc = torch.cat([center, zero, center, zero], -1)
        diag = torch.cat([sigma.expand(-1, self.dim), one, sigma.expand(-1, self.dim), one], -1)
        shape = state.shape[:-1] + loc.shape
        return loc.expand(shape), torch.diag_embed(diag).expand(shape + (loc.shape[-1],))

    def features(
        self,
        u_points: Tensor,
        point_mask: Tensor,
        u_others: Tensor,
        v_others: Tensor,
        psi: Tensor,
        log_explained: Tensor | None = None,
    ) -> Tensor:
        """Encode whitened context values (shared by graphs and training batches).

        Args:
            u_points: ``[..., I, n, D]``; ``point_mask``: ``[I, n]`` (False pads).
            u_others: ``[..., I, m', D]``; ``v_others``: ``[..., I, m']`` (0 for padding).
            psi: ``[I, 2]`` = ``(log(tau / sigma), logit p)``.
            log_explained: ``[..., I, n]`` the points' ``log sum_k v_k exp(-|u - u_k|^2 / 2)`` over the
                other mixtures, when the caller has computed it (the fused path shares it with its energy).

        Returns:
            ``[..., I, feature_dim]``.
        """
        d2 = ((u_points.unsqueeze(-2) - u_others.unsqueeze(-3)) ** 2).sum(-1)  # [..., I, n, m']
        if log_explained is None:
            log_explained = torch.logsumexp(torch.log(v_others).unsqueeze(-2) - 0.5 * d2, -1)
        explained = log_explained.clamp(min=_EXPLAINED_FLOOR)  # [..., I, n]
        mask = point_mask.expand(explained.shape)
        present = mask.to(u_points.dtype)
        # the points the other mixtures explain least, least first (C only: the same both ways)
        k_points = min(self.points, explained.shape[-1])
        key = torch.where(mask, explained, torch.full_like(explained, math.inf))
        if explained.shape[-1] > self.points:
            # more points than slots: every k-th point in that order, so the slots hold a sample
            # of the data with its cluster proportions (a model the size the proposal was trained on)
            ranked = torch.argsort(key, dim=-1, stable=True)
            stride = (mask.sum(-1, keepdim=True).to(u_points.dtype) / k_points).clamp(min=1.0)
            slots = torch.arange(k_points, dtype=u_points.dtype)
            pos = (slots * stride).floor().long().clamp(max=explained.shape[-1] - 1)
            order = ranked.gather(-1, pos)
        else:
            order = torch.topk(key, k_points, dim=-1, largest=False).indices
        sel_u = u_points.gather(-2, order.unsqueeze(-1).expand(order.shape + (self.dim,)))
        sel_e = explained.gather(-1, order)
        sel_present = present.gather(-1, order)
        # the active other mixtures nearest to the selected points
        sel_d2 = d2.gather(-2, order.unsqueeze(-1).expand(order.shape + (d2.shape[-1],)))
        near = torch.logsumexp(-0.5 * sel_d2 + torch.log(sel_present).unsqueeze(-1), -2).clamp(-1e3, 1e3)
        k_others = min(self.mixtures - 2, u_others.shape[-2])
        # active first, nearest first; ties by index, so the order never depends on an inactive mean
        nearest = torch.where(v_others > 0, near, torch.full_like(near, -math.inf))
        rank = torch.sort(nearest, dim=-1, descending=True, stable=True).indices[..., :k_others]
        sel_mu = u_others.gather(-2, rank.unsqueeze(-1).expand(rank.shape + (self.dim,)))
        sel_v = v_others.gather(-1, rank)
        # summaries of everything (selected or not): mass and centroid of the poorly explained
        # points, and two anchors (mean-shift centroids around the least explained points)
        poorly, mass, centroid, anchors = residual_summary(u_points, explained, present, key)
        counts = torch.stack([torch.log1p(v_others.sum(-1)), torch.log(present.sum(-1) / self.points)], -1)
        head = torch.cat(
            [psi.expand(counts.shape[:-1] + (2,)), counts, mass / 10, centroid / _COORD_SCALE, anchors], -1
        )
        others = torch.cat([sel_v.unsqueeze(-1), sel_v.unsqueeze(-1) * sel_mu / _COORD_SCALE], -1)
        pts = torch.cat([sel_u / _COORD_SCALE, (sel_e / 10).unsqueeze(-1), torch.ones_like(sel_e).unsqueeze(-1)], -1)
        pts = pts * sel_present.unsqueeze(-1)
        lead = head.shape[:-1]
        others = _pad_slots(others.reshape(lead + (-1,)), (self.mixtures - 2) * (1 + self.dim))
        pts = _pad_slots(pts.reshape(lead + (-1,)), self.points * (self.dim + 2))
        return torch.cat([head, others, pts], -1)

    # -- instantiations -------------------------------------------------------------
    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random GMMs with ``mixtures`` candidates and ``points`` points, drawn from the joint.

        ``sigma`` is log-uniform on ``[0.1, 10]``, ``tau / sigma`` log-uniform on ``[2, 8]``,
        ``p`` uniform on ``[0.25, 0.75]`` and ``c ~ N(0, (3 sigma)^2 I)``; bits are drawn
        from the prior conditioned on ``M >= 1``. The block is mixtures 0 and 1 (the
        mixtures are exchangeable), whitened.
        """
        gen, dtype = generator, torch.get_default_dtype()
        size, m, n, d = batch_size, self.mixtures, self.points, self.dim

        def uniform(lo: float, hi: float, *shape: int) -> Tensor:
            return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype)

        log_ratio = uniform(math.log(2.0), math.log(8.0), size)
        p = uniform(0.25, 0.75, size)
        bits = (torch.rand(size, m, generator=gen, dtype=dtype) < p[:, None]).to(dtype)
        empty = bits.sum(-1) == 0
        while empty.any():  # the prior conditioned on at least one active mixture
            redraw = (torch.rand(int(empty.sum()), m, generator=gen, dtype=dtype) < p[empty, None]).to(dtype)
            bits[empty] = redraw
            empty = bits.sum(-1) == 0
        u_means = torch.exp(log_ratio)[:, None, None] * torch.randn(size, m, d, generator=gen, dtype=dtype)
        labels = torch.multinomial(bits, n, replacement=True, generator=gen)  # [size, n]
        u_points = u_means.gather(1, labels.unsqueeze(-1).expand(size, n, d))
        u_points = u_points + torch.randn(size, n, d, generator=gen, dtype=dtype)
        psi = torch.stack([log_ratio, torch.logit(p)], -1)
        u_others, v_others = u_means[:, 2:], bits[:, 2:]
        features = self.features(u_points, torch.ones(size, n, dtype=torch.bool), u_others, v_others, psi)
        block = torch.cat([u_means[:, 0], bits[:, :1], u_means[:, 1], bits[:, 1:2]], -1)

        def log_p_fn(values: Tensor) -> Tensor:
            chunks = [
                pair_log_density(chunk, u_points, u_others, v_others, log_ratio, psi[:, 1])
                for chunk in values.split(_MC_CHUNK, 0)
            ]
            return torch.cat(chunks, 0)

        return TrainingBatch(features=features, block=block, log_p_fn=log_p_fn)


def round_robin_pairs(count: int) -> list[tuple[int, int]]:
    """Every pair ``(i, j)``, ``i < j``, of ``count`` items, in rounds of disjoint pairs (the circle method).

    A sweep in this order visits runs of pairs that share no mixture, so moves that change only two
    inactive mixtures let the fused path go on to the next pairs in the same step.

    Example:
        >>> round_robin_pairs(4)
        [(0, 3), (1, 2), (0, 2), (1, 3), (0, 1), (2, 3)]
    """
    players = list(range(count)) + ([-1] if count % 2 else [])
    size, order = len(players), []
    for _ in range(size - 1):
        for k in range(size // 2):
            a, b = players[k], players[size - 1 - k]
            if a >= 0 and b >= 0:
                order.append((min(a, b), max(a, b)))
        players = [players[0], players[-1], *players[1:-1]]
    return order


def residual_summary(
    u_points: Tensor, explained: Tensor, present: Tensor, key: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What the other mixtures leave unexplained: the poorly explained points and two anchors among them.

    Args:
        u_points: ``[..., n, D]`` whitened points; ``explained``: ``[..., n]`` their floored log explained
            density; ``present``: ``[..., n]`` 1 for real points; ``key``: ``[..., n]`` the order to seed
            anchors by (least first; ``inf`` for padding).

    Returns:
        ``(poorly [..., n], mass [..., 1], centroid [..., D], anchors [..., 2 (D + 2)])``: each point's weight
        as poorly explained, their total and centroid, and per anchor (a mean-shift centroid around the least
        explained point, then around the least explained point away from the first) its centre / 4, log mass
        and spread.
    """
    poorly = torch.sigmoid(_POORLY_EXPLAINED - explained) * present
    mass = poorly.sum(-1, keepdim=True)
    centroid = _weighted_sum(poorly, u_points) / mass.clamp(min=1e-6)
    first = _anchor(u_points, poorly, key)
    taken = torch.exp(_squared_distance(u_points, first[0]) * (-0.5 / _ANCHOR_RADIUS**2))
    second = _anchor(u_points, poorly * (1 - taken), key + 1e3 * taken)
    centres, masses, spreads = (torch.stack(parts, -2) for parts in zip(first, second))  # [..., 2, D], [..., 2, 1] x 2
    anchors = torch.cat([centres / _COORD_SCALE, torch.log1p(masses), spreads], -1)
    return poorly, mass, centroid, anchors.flatten(-2)


def _weighted_sum(weight: Tensor, u_points: Tensor) -> Tensor:
    """``sum_j weight[..., j] u_points[..., j, :]``, ``[..., D]`` (one batched product)."""
    return (weight.unsqueeze(-2) @ u_points).squeeze(-2)


def _squared_distance(u_points: Tensor, centre: Tensor) -> Tensor:
    """``|u_j - centre|^2`` of every point, ``[..., n]`` (``centre``: ``[..., D]``)."""
    return (u_points - centre.unsqueeze(-2)).square().sum(-1)


def _anchor(u_points: Tensor, weight: Tensor, key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Two mean-shift steps from the point of smallest ``key``: ``(centre [..., D], mass [..., 1], spread [..., 1])``.

    The points' kernel weights (radius :data:`_ANCHOR_RADIUS`, in units of sigma) times
    ``weight`` locate a cluster of poorly explained points; ``spread`` is its RMS radius.
    """
    seed = key.argmin(-1, keepdim=True).unsqueeze(-1)  # [..., 1, 1]
    centre = torch.take_along_dim(u_points, seed, -2).squeeze(-2)
    for _ in range(2):
        d2 = _squared_distance(u_points, centre)
        w = weight * torch.exp(d2 * (-0.5 / _ANCHOR_RADIUS**2))
        mass = w.sum(-1, keepdim=True)
        centre = torch.where(mass > 1e-6, _weighted_sum(w, u_points) / mass.clamp(min=1e-6), centre)
    spread = torch.sqrt((w * d2).sum(-1, keepdim=True) / mass.clamp(min=1e-6) + 1e-6)
    return centre, mass, spread


def _pad_slots(values: Tensor, width: int) -> Tensor:
    """Zero-pad the last axis to ``width`` (fewer points or mixtures than the proposal's slots)."""
    missing = width - values.shape[-1]
    if missing <= 0:
        return values
    return torch.cat([values, values.new_zeros(values.shape[:-1] + (missing,))], -1)


register_motif("gmm_pair", GmmPairMotif)
