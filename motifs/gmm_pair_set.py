"""The ``gmm_pair_set`` motif: the ``gmm_pair`` block with a context that scales to any model size.

The block, the conditioning set and the local parameters are those of
:class:`~motifs.gmm_pair.GmmPairMotif`: a pair ``(mu_i, v_i, mu_j, v_j)`` of an
open-universe GMM, given the other mixtures and the points. ``gmm_pair`` shows its
network a fixed number of points and other mixtures, chosen by a rule, so a model larger
than its training size is seen through a keyhole. This motif shows it everything.

**What the conditional depends on.** With the labels summed out,
``p(B | C) ∝ p(B) prod_j (E_j + v_i N(x_j; mu_i) + v_j N(x_j; mu_j)) / (M_C + v_i + v_j)^n``,
where ``E_j = sum_{k in C} v_k N(x_j; mu_k)`` is how well the other mixtures explain point
``j`` and ``M_C`` is their number. So the other mixtures enter only through each point's
``E_j`` and through ``M_C``: the set of points ``(x_j, E_j)`` and the count are sufficient
(a mixture that duplicates another shows up as points whose ``E_j`` is already high; the
features floor ``log E_j`` at -30, so points no mixture explains all look alike).

**Features.** A head of ``9 + 3 D`` numbers: ``log(tau / sigma)``, ``logit p``,
``log(1 + M_C)``, ``log(n / 100)``, the log mass and centroid of the poorly explained points,
and two anchors (as ``gmm_pair``); then one token per point, ``[u / 4, log E / 10,
poorly explained, 1]`` (``D + 3`` numbers, the last its presence), for every point of the
model. The proposal pools the tokens with a set encoder
(:class:`~neuralblock.proposals.set_encoder.SetPooling`), so it reads any number of
points, in any order. Coordinates are whitened as in ``gmm_pair`` (shifted by ``c``, in
units of ``sigma``).

**Training distribution.** Models of 4 to 32 mixtures and 30 to 1000 points drawn from the
model (points uniform over the active mixtures), with overlapping clusters (``tau / sigma``
down to 1.5), a broad activity rate and near-duplicate mixtures, which is how the model
explains clusters of unequal size (:meth:`GmmPairSetMotif.sample_models`). With the option
``copies`` (the shipped ``gmm_pair_copies``: 0.5), that fraction of the training models gathers its
active mixtures as copies on a few of them, as the posterior does on clusters of unequal size
(several mixtures on one large cluster), which one near-duplicate rarely showed the first release.

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
    >>> fg = gmm_graph(torch.randn(30, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> motif = GmmPairSetMotif()
    >>> inst = motif.find_instances(fg)
    >>> motif.encode(fg, inst, gmm_initial_state(fg)).shape  # 15 head numbers, 30 tokens of 5
    torch.Size([6, 165])
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from motifs.gmm_pair import (
    _COORD_SCALE,
    _EXPLAINED_FLOOR,
    _MC_CHUNK,
    GmmPairMotif,
    pair_log_density,
    residual_summary,
)
from neuralblock.motif import TrainingBatch, register_motif

__all__ = ["GmmPairSetMotif", "PairModels"]

_POINTS_SCALE = 100.0  # the head's log(n / 100)
_CHUNK = 64  # training examples per model size
_MIN_MIXTURES, _MAX_MIXTURES = 4, 32
_MIN_POINTS, _MAX_POINTS = 30, 1000
_DUPLICATE_RATE = 0.25  # training models with a near-duplicate mixture
_DUPLICATE_SPREAD = 0.5  # its distance from the original, in units of sigma
_COPY_SHAPE = 0.7  # Gamma shape of the weights by which copied models pick the mixtures to copy
_COPY_SPREAD = (0.05, 0.5)  # range (log-uniform) of a copy's distance from its original, in units of sigma


class PairModels(NamedTuple):
    """Whitened random GMMs seen from the pair of mixtures 0 and 1 (padding: absent points, inactive mixtures).

    Attributes:
        u_points: ``[B, n, D]``; ``point_mask``: ``[B, n]`` (False pads).
        u_others: ``[B, m - 2, D]`` the other means; ``v_others``: ``[B, m - 2]`` their bits (0 pads).
        psi: ``[B, 2]`` ``(log(tau / sigma), logit p)``.
        block: ``[B, 2 D + 2]`` the pair ``(u_0, v_0, u_1, v_1)``.
    """

    u_points: Tensor
    point_mask: Tensor
    u_others: Tensor
    v_others: Tensor
    psi: Tensor
    block: Tensor


class GmmPairSetMotif(GmmPairMotif):
    """A pair of open-universe mixtures, conditioned on every point through a set encoder.

    Args:
        dim: dimension ``D`` of the points and means.
        hidden: width of the set encoder's token network.
        heads: attention heads of the set encoder.
        copies: the fraction of training models whose active mixtures gather into groups of copies
            (:meth:`sample_models`); 0 draws the training models of the first release. It is part
            of the motif's spec (when not 0), so a proposal trained with it loads with that motif
            (``NeuralBlockProposal.load(path)`` builds it from the sidecar).
    """

    name = "gmm_pair_set"
    version = 1

    def __init__(self, dim: int = 2, hidden: int = 32, heads: int = 4, copies: float = 0.0) -> None:
        for label, value in (("dim", dim), ("hidden", hidden), ("heads", heads)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"gmm_pair_set option {label} must be a positive integer, got {value!r}")
        if isinstance(copies, bool) or not isinstance(copies, (int, float)) or not 0.0 <= copies <= 1.0:
            raise ValueError(f"gmm_pair_set option copies must be a fraction in [0, 1], got {copies!r}")
        self.dim, self.hidden, self.heads, self.copies = int(dim), int(hidden), int(heads), float(copies)

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"dim": self.dim, "hidden": self.hidden, "heads": self.heads}
        return {**options, "copies": self.copies} if self.copies else options  # (the first release had none)

    @property
    def feature_dim(self) -> int:
        return 9 + 3 * self.dim

    @property
    def set_encoder(self) -> dict[str, int]:
        return {"token_features": self.dim + 3, "hidden": self.hidden, "heads": self.heads}

    def describe(self) -> str:
        """The structure the motif looks for, in words.

        Example:
            >>> GmmPairSetMotif().describe().startswith("pairs of mixtures")
            True
        """
        return super().describe() + "; every point is read through a set encoder"

    def features(
        self,
        u_points: Tensor,
        point_mask: Tensor,
        u_others: Tensor,
        v_others: Tensor,
        psi: Tensor,
        log_explained: Tensor | None = None,
    ) -> Tensor:
        """The head and one token per point, ``[..., I, 9 + 3 D + n (D + 3)]`` (arguments as ``gmm_pair``'s)."""
        if log_explained is None:
            d2 = ((u_points.unsqueeze(-2) - u_others.unsqueeze(-3)) ** 2).sum(-1)  # [..., I, n, m']
            log_explained = torch.logsumexp(torch.log(v_others).unsqueeze(-2) - 0.5 * d2, -1)
        explained = log_explained.clamp(min=_EXPLAINED_FLOOR)  # [..., I, n]
        mask = point_mask.expand(explained.shape)
        present = mask.to(u_points.dtype)
        key = torch.where(mask, explained, torch.full_like(explained, math.inf))
        poorly, mass, centroid, anchors = residual_summary(u_points, explained, present, key)
        counts = torch.stack(
            [torch.log1p(v_others.sum(-1)), torch.log(present.sum(-1).clamp(min=1.0) / _POINTS_SCALE)], -1
        )
        head = torch.cat(
            [psi.expand(counts.shape[:-1] + (2,)), counts, torch.log1p(mass), centroid / _COORD_SCALE, anchors], -1
        )
        tokens = torch.cat(
            [u_points / _COORD_SCALE, (explained / 10).unsqueeze(-1), poorly.unsqueeze(-1), present.unsqueeze(-1)], -1
        )
        tokens = tokens * present.unsqueeze(-1)
        return torch.cat([head, tokens.flatten(-2)], -1)

    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random GMMs of many sizes (:meth:`sample_models`), encoded; the block is mixtures 0 and 1, whitened."""
        return self.training_batch(self.sample_models(batch_size, generator))

    def training_batch(self, models: PairModels) -> TrainingBatch:
        """The training batch of ``models``: features, the block, and the exact conditional's log density."""
        features = self.features(models.u_points, models.point_mask, models.u_others, models.v_others, models.psi)

        def log_p_fn(values: Tensor) -> Tensor:
            chunks = [
                pair_log_density(
                    chunk,
                    models.u_points,
                    models.u_others,
                    models.v_others,
                    models.psi[:, 0],
                    models.psi[:, 1],
                    models.point_mask,
                )
                for chunk in values.split(_MC_CHUNK, 0)
            ]
            return torch.cat(chunks, 0)

        return TrainingBatch(features=features, block=models.block, log_p_fn=log_p_fn)

    def sample_models(
        self, batch_size: int, generator: torch.Generator, mixtures: int | None = None, points: int | None = None
    ) -> PairModels:
        """Whitened GMMs drawn from a broadened joint, of many sizes or of one.

        Every run of :data:`_CHUNK` examples draws a point scale ``s`` log-uniform on
        ``[30, 1000]``, and each example ``n`` uniform on ``[s / 2, s]`` (at least 30) and ``m``
        uniform on ``4 .. 32``; shorter examples are padded (absent tokens and mixtures).
        ``mixtures`` and ``points`` fix ``m`` and ``n`` instead (held-out sets of one size).
        ``tau / sigma`` is log-uniform on ``[1.5, 8]`` (overlapping clusters at the low end),
        ``p`` uniform on ``[0.1, 0.75]``, the bits drawn from it with at least one active
        mixture, and a quarter of the models give one mixture a near-duplicate (an active
        copy of an active mixture, ``0.5 sigma`` away). The points pick their mixture
        uniformly among the active ones, as the model does: the network learns the model's
        conditional (up to the near-duplicates, which change the means' prior in a quarter of
        the models; MH corrects both), and to the model a large cluster is several mixtures at one place
        (which the near-duplicates and the prior's close pairs show it, and ``copies`` shows it
        often: :meth:`_gather_copies`, after the near-duplicate). Training on
        unequal cluster weights instead taught a first version to propose what generated
        the data rather than what the model prefers: it stalled below split-merge on
        unequal clusters at ``n = 1000``.

        Example:
            >>> models = GmmPairSetMotif().sample_models(3, torch.Generator().manual_seed(0), mixtures=5, points=40)
            >>> models.u_points.shape, models.u_others.shape, models.block.shape
            (torch.Size([3, 40, 2]), torch.Size([3, 3, 2]), torch.Size([3, 6]))
        """
        gen, dtype, d = generator, torch.get_default_dtype(), self.dim
        size = batch_size

        def uniform(lo: float, hi: float, *shape: int) -> Tensor:
            return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype)

        if points is None:
            chunks = -(-size // _CHUNK)
            scale = torch.exp(uniform(math.log(_MIN_POINTS), math.log(_MAX_POINTS), chunks)).repeat_interleave(_CHUNK)
            scale = scale[:size]
            n_each = (scale * uniform(0.5, 1.0, size)).round().clamp(min=_MIN_POINTS).long()
        else:
            n_each = torch.full((size,), int(points))
        if mixtures is None:
            m_each = torch.randint(_MIN_MIXTURES, _MAX_MIXTURES + 1, (size,), generator=gen)
        else:
            m_each = torch.full((size,), int(mixtures))
        n, m = int(n_each.max()), int(m_each.max())
        slots = torch.arange(m)
        real_mixture = slots[None, :] < m_each[:, None]
        log_ratio = uniform(math.log(1.5), math.log(8.0), size)
        p = uniform(0.1, 0.75, size)
        bits = torch.zeros(size, m, dtype=dtype)
        empty = torch.ones(size, dtype=torch.bool)
        while empty.any():  # the bits conditioned on at least one active mixture
            draw = (torch.rand(int(empty.sum()), m, generator=gen, dtype=dtype) < p[empty, None]) & real_mixture[empty]
            bits[empty] = draw.to(dtype)
            empty = bits.sum(-1) == 0
        u_means = torch.exp(log_ratio)[:, None, None] * torch.randn(size, m, d, generator=gen, dtype=dtype)
        # near-duplicates: mixture `copy` becomes an active neighbour of active mixture `source`
        source = torch.multinomial(bits, 1, generator=gen).squeeze(-1)
        offset = 1 + (torch.rand(size, generator=gen, dtype=dtype) * (m_each - 1)).long()
        copy = (source + offset) % m_each
        duplicate = torch.rand(size, generator=gen, dtype=dtype) < _DUPLICATE_RATE
        rows = torch.arange(size)[duplicate]
        noise = _DUPLICATE_SPREAD * torch.randn(len(rows), d, generator=gen, dtype=dtype)
        u_means[rows, copy[duplicate]] = u_means[rows, source[duplicate]] + noise
        bits[rows, copy[duplicate]] = 1.0
        if self.copies > 0:
            u_means = self._gather_copies(u_means, bits, gen)
        labels = torch.multinomial(bits, n, replacement=True, generator=gen)  # [size, n], as the model draws them
        u_points = u_means.gather(1, labels.unsqueeze(-1).expand(size, n, d))
        u_points = u_points + torch.randn(size, n, d, generator=gen, dtype=dtype)
        return PairModels(
            u_points=u_points,
            point_mask=torch.arange(n)[None, :] < n_each[:, None],
            u_others=u_means[:, 2:],
            v_others=bits[:, 2:],
            psi=torch.stack([log_ratio, torch.logit(p)], -1),
            block=torch.cat([u_means[:, 0], bits[:, :1], u_means[:, 1], bits[:, 1:2]], -1),
        )

    def _gather_copies(self, u_means: Tensor, bits: Tensor, gen: torch.Generator) -> Tensor:
        """In a fraction ``copies`` of the models, gather the active mixtures into groups of copies.

        Each active mixture picks an active one (possibly itself) with weights drawn from
        ``Gamma(0.7)``, so a few are picked often, and moves to ``N(0, s^2 I)`` from its pick's mean
        before the gathering (``s`` log-uniform on ``[0.05, 0.5]`` per model); one that picks itself
        keeps its mean. The groups sit at about half as many places as there are active mixtures
        (1.3, 2.3, 4.1, 7.8 places for 2, 4, 8, 16 active mixtures). The points are drawn afterwards,
        uniformly over the active mixtures, so a group of ``c`` copies gets ``c`` shares of them: how
        the model's posterior explains clusters of unequal sizes (the ``unequal`` and ``scaled`` GMM
        families), which the first release's single near-duplicate rarely showed it. Inactive
        mixtures and the bits are left as drawn.
        """
        size, m, d = u_means.shape
        dtype = u_means.dtype
        copied = torch.rand(size, generator=gen, dtype=dtype) < self.copies
        weights = torch._standard_gamma(torch.full((size, m), _COPY_SHAPE, dtype=dtype), generator=gen)
        pick = torch.multinomial(torch.where(bits > 0, weights, 0.0), m, replacement=True, generator=gen)  # [size, m]
        low, high = (math.log(v) for v in _COPY_SPREAD)
        spread = torch.exp(low + (high - low) * torch.rand(size, generator=gen, dtype=dtype))
        noise = spread[:, None, None] * torch.randn(size, m, d, generator=gen, dtype=dtype)
        moved = copied[:, None] & (bits > 0) & (pick != torch.arange(m))
        target = u_means.gather(1, pick.unsqueeze(-1).expand(size, m, d)) + noise
        return torch.where(moved.unsqueeze(-1), target, u_means)


register_motif("gmm_pair_set", GmmPairSetMotif)
