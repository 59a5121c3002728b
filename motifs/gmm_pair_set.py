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
(a mixture that duplicates another shows up as points whose ``E_j`` is already high).

**Features.** A head of ``9 + 3 D`` numbers: ``log(tau / sigma)``, ``logit p``,
``log(1 + M_C)``, ``log(n / 100)``, the log mass and centroid of the poorly explained points,
and two anchors (as ``gmm_pair``); then one token per point, ``[u / 4, log E / 10,
poorly explained, 1]`` (``D + 3`` numbers, the last its presence), for every point of the
model. The proposal pools the tokens with a set encoder
(:class:`~neuralblock.proposals.set_encoder.SetPooling`), so it reads any number of
points, in any order. Coordinates are whitened as in ``gmm_pair`` (shifted by ``c``, in
units of ``sigma``).

**Training distribution.** Models of 4 to 32 mixtures and 30 to 1000 points, with
unequal cluster sizes, overlapping clusters (``tau / sigma`` down to 1.5) and
near-duplicate mixtures (:meth:`GmmPairSetMotif.sample_training_batch`).

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
from typing import Any

import torch
from torch import Tensor

from motifs.gmm_pair import (
    _ANCHOR_RADIUS,
    _COORD_SCALE,
    _EXPLAINED_FLOOR,
    _MC_CHUNK,
    _POORLY_EXPLAINED,
    GmmPairMotif,
    _anchor,
    pair_log_density,
)
from neuralblock.motif import TrainingBatch, register_motif

__all__ = ["GmmPairSetMotif"]

_POINTS_SCALE = 100.0  # the head's log(n / 100)
_CHUNK = 64  # training examples per model size
_MIN_MIXTURES, _MAX_MIXTURES = 4, 32
_MIN_POINTS, _MAX_POINTS = 30, 1000
_DUPLICATE_RATE = 0.25  # training models with a near-duplicate mixture
_DUPLICATE_SPREAD = 0.5  # its distance from the original, in units of sigma


class GmmPairSetMotif(GmmPairMotif):
    """A pair of open-universe mixtures, conditioned on every point through a set encoder.

    Args:
        dim: dimension ``D`` of the points and means.
        hidden: width of the set encoder's token network.
        heads: attention heads of the set encoder.
    """

    name = "gmm_pair_set"
    version = 1

    def __init__(self, dim: int = 2, hidden: int = 32, heads: int = 4) -> None:
        for label, value in (("dim", dim), ("hidden", hidden), ("heads", heads)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"gmm_pair_set option {label} must be a positive integer, got {value!r}")
        self.dim, self.hidden, self.heads = int(dim), int(hidden), int(heads)

    def options(self) -> dict[str, Any]:
        return {"dim": self.dim, "hidden": self.hidden, "heads": self.heads}

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
        """The head and one token per point, ``[..., I, 9 + 3 D + n (D + 3)]``.

        Args:
            u_points: ``[..., I, n, D]`` whitened points; ``point_mask``: ``[I, n]`` (False pads).
            u_others: ``[..., I, m', D]``; ``v_others``: ``[..., I, m']`` (0 for padding).
            psi: ``[I, 2]`` = ``(log(tau / sigma), logit p)``.
            log_explained: ``[..., I, n]`` the points' ``log sum_k v_k exp(-|u - u_k|^2 / 2)`` over the
                other mixtures, when the caller has computed it (the fused path shares it with its energy).
        """
        if log_explained is None:
            d2 = ((u_points.unsqueeze(-2) - u_others.unsqueeze(-3)) ** 2).sum(-1)  # [..., I, n, m']
            log_explained = torch.logsumexp(torch.log(v_others).unsqueeze(-2) - 0.5 * d2, -1)
        explained = log_explained.clamp(min=_EXPLAINED_FLOOR)  # [..., I, n]
        mask = point_mask.expand(explained.shape)
        present = mask.to(u_points.dtype)
        poorly = torch.sigmoid(_POORLY_EXPLAINED - explained) * present
        mass = poorly.sum(-1, keepdim=True)
        centroid = (poorly.unsqueeze(-1) * u_points).sum(-2) / mass.clamp(min=1e-6)
        counts = torch.stack(
            [torch.log1p(v_others.sum(-1)), torch.log(present.sum(-1).clamp(min=1.0) / _POINTS_SCALE)], -1
        )
        key = torch.where(mask, explained, torch.full_like(explained, math.inf))
        first = _anchor(u_points, poorly, key)
        taken = torch.exp(-0.5 * ((u_points - first[0].unsqueeze(-2)) ** 2).sum(-1) / _ANCHOR_RADIUS**2)
        second = _anchor(u_points, poorly * (1 - taken), key + 1e3 * taken)
        anchors = [
            torch.cat([a / _COORD_SCALE, torch.log1p(n).unsqueeze(-1), spread.unsqueeze(-1)], -1)
            for a, n, spread in (first, second)
        ]
        head = torch.cat(
            [psi.expand(counts.shape[:-1] + (2,)), counts, torch.log1p(mass), centroid / _COORD_SCALE, *anchors], -1
        )
        tokens = torch.cat(
            [u_points / _COORD_SCALE, (explained / 10).unsqueeze(-1), poorly.unsqueeze(-1), present.unsqueeze(-1)], -1
        )
        tokens = tokens * present.unsqueeze(-1)
        return torch.cat([head, tokens.flatten(-2)], -1)

    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random GMMs of many sizes, drawn from a broadened joint; the block is mixtures 0 and 1, whitened.

        Every run of :data:`_CHUNK` examples draws a point scale ``s`` log-uniform on
        ``[30, 1000]``, and each example ``n`` uniform on ``[s / 2, s]`` (at least 30) and ``m``
        uniform on ``4 .. 32``; shorter examples are padded (absent tokens and mixtures).
        ``tau / sigma`` is log-uniform on ``[1.5, 8]`` (overlapping clusters at the low end),
        ``p`` uniform on ``[0.1, 0.75]``, the bits drawn from it with at least one active
        mixture. Clusters have unequal sizes (log-normal weights with a spread uniform on
        ``[0, 1.5]``), and a quarter of the models give one mixture a near-duplicate
        (an active copy of an active mixture, ``0.5 sigma`` away).
        """
        gen, dtype, d = generator, torch.get_default_dtype(), self.dim
        size = batch_size

        def uniform(lo: float, hi: float, *shape: int) -> Tensor:
            return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype)

        chunks = -(-size // _CHUNK)
        scale = torch.exp(uniform(math.log(_MIN_POINTS), math.log(_MAX_POINTS), chunks)).repeat_interleave(_CHUNK)
        scale = scale[:size]
        n_each = (scale * uniform(0.5, 1.0, size)).round().clamp(min=_MIN_POINTS).long()
        m_each = torch.randint(_MIN_MIXTURES, _MAX_MIXTURES + 1, (size,), generator=gen)
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
        # unequal cluster sizes: log-normal weights over the active mixtures
        spread = uniform(0.0, 1.5, size)
        weights = bits * torch.exp(spread[:, None] * torch.randn(size, m, generator=gen, dtype=dtype))
        labels = torch.multinomial(weights, n, replacement=True, generator=gen)  # [size, n]
        u_points = u_means.gather(1, labels.unsqueeze(-1).expand(size, n, d))
        u_points = u_points + torch.randn(size, n, d, generator=gen, dtype=dtype)
        point_mask = torch.arange(n)[None, :] < n_each[:, None]
        psi = torch.stack([log_ratio, torch.logit(p)], -1)
        u_others, v_others = u_means[:, 2:], bits[:, 2:]
        features = self.features(u_points, point_mask, u_others, v_others, psi)
        block = torch.cat([u_means[:, 0], bits[:, :1], u_means[:, 1], bits[:, 1:2]], -1)

        def log_p_fn(values: Tensor) -> Tensor:
            chunks = [
                pair_log_density(chunk, u_points, u_others, v_others, log_ratio, psi[:, 1], point_mask)
                for chunk in values.split(_MC_CHUNK, 0)
            ]
            return torch.cat(chunks, 0)

        return TrainingBatch(features=features, block=block, log_p_fn=log_p_fn)


register_motif("gmm_pair_set", GmmPairSetMotif)
