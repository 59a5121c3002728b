"""The ``chain`` motif: the middle two of six consecutive variables of a state-space chain.

A univariate state-space chain has continuous latent states ``x_1 .. x_T`` with
linear-Gaussian transitions and observations from a parametric family that includes
nonlinear ones:

* transition ``x_{t+1} ~ N(a_t x_t + b_t, s_t^2)`` (a :class:`~neuralblock.graph.LinearGaussianGroup`
  row with one parent);
* observation ``y_t ~ N(c_t x_t + d_t, exp(e_t x_t + g_t))`` (a
  :class:`~neuralblock.graph.LogLinearGaussianGroup` row, or a linear-Gaussian row with an
  observed child), either *linear-Gaussian* (``e_t = 0``) or *volatility* type
  (``c_t = 0``, ``e_t != 0``): the latent log-volatility chain of a stochastic volatility
  model, ``y_t ~ N(0, beta^2 exp(h_t))``, is the case ``e_t = 1, g_t = 2 log beta``.

The motif covers six consecutive states ``x_{t-2} .. x_{t+3}``:

* **B**: ``(x_t, x_{t+1})`` (``BlockSpec([0, 0])``);
* **C**: the outer four states and the observations of the block;
* **Psi**: the three transitions touching the block and the block's observation factors.

**Whitening.** For every instance the motif computes the Gaussian conditional
``N(m, L L^T)`` of the block under the *linearised* model, in which each volatility
observation is replaced by its Kim–Shephard–Chib moment match
``log (y - d)^2 ~ N(e x + g - 1.2704, pi^2 / 2)``. The network models the whitened
block ``u = L^{-1} (B - m)`` (:meth:`ChainMotif.block_affine`). In ``u`` coordinates the
exact conditional is ``N(0, I)`` for a linear-Gaussian instance and a fixed nonlinear
tilt of it otherwise, which depends on each volatility observation only through two
numbers: ``zeta_i = log (y_i - d_i)^2 - g_i - e_i m_i`` and the row ``w_i = e_i L[i, :]``.
The features are therefore 8 numbers, ``[vol_i, zeta_i, w_i0, w_i1]`` for ``i = 0, 1``,
and a proposal trained once applies at any location and scale of the chain (a
log-volatility near -9 as well as a state near 0).

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals". NeurIPS 2018.
    Kim, Shephard, Chib. "Stochastic Volatility: Likelihood Inference and Comparison with
    ARCH Models". Review of Economic Studies, 1998 (the log-chi-square moment match).

Example:
    >>> fg = stochastic_volatility_graph(torch.tensor([0.5, -1.0, 0.2, 0.1, 0.9, -0.3, 0.4]), phi=0.95, sigma=0.2)
    >>> motif = ChainMotif()
    >>> inst = motif.find_instances(fg)
    >>> inst.blocks.tolist()  # (x_t, x_{t+1}) with two states on each side
    [[2, 3], [3, 4]]
    >>> motif.encode(fg, inst, fg.initial_state()).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, LinearGaussianGroup, LogLinearGaussianGroup
from neuralblock.motif import BlockSpec, Motif, MotifInstances, TrainingBatch, register_motif

__all__ = [
    "KSC_MEAN",
    "KSC_VARIANCE",
    "ChainEncoding",
    "ChainMotif",
    "chain_encoding",
    "state_space_graph",
    "stochastic_volatility_graph",
]

KSC_MEAN = -1.2704
"""Mean of ``log eps^2`` for ``eps ~ N(0, 1)`` (Kim, Shephard, Chib)."""
KSC_VARIANCE = math.pi**2 / 2
"""Variance of ``log eps^2`` for ``eps ~ N(0, 1)``."""

FAMILIES = ("mixed", "linear", "volatility")
_NONE, _LINEAR, _VOL = 0.0, 1.0, 2.0
_FEATURE_CLIP = 50.0
_TINY = 1e-12
# static parameter columns of an instance: three transitions (a, b, s), two observations (kind, c, d, e, g)
_TRANS = slice(0, 9)
_OBS = (slice(9, 14), slice(14, 19))
_NUM_PARAMS = 19


# ------------------------------------------------------------------------------ the math
class ChainEncoding(NamedTuple):
    """The linearised conditional of blocks and their network inputs, affine in the block's two neighbours.

    Everything but the mean depends on ``Psi`` and the observations only (static for a
    graph): the mean is ``loc + d_left x_{t-1} + d_right x_{t+2}`` and the features, before
    clipping, are ``static + m_0 slope[0] + m_1 slope[1]``. Made by :func:`chain_encoding`.

    Attributes:
        loc, d_left, d_right: ``[..., 2]``.
        tril: ``[..., 2, 2]`` the Cholesky factor ``L``.
        static: ``[..., 8]`` the features at mean ``0`` (unclipped).
        slope: ``[..., 2, 8]`` the features' change per unit of each mean entry.
    """

    loc: Tensor
    d_left: Tensor
    d_right: Tensor
    tril: Tensor
    static: Tensor
    slope: Tensor

    def mean(self, x_left: Tensor, x_right: Tensor) -> Tensor:
        """The conditional mean ``[..., 2]`` given the neighbours ``x_{t-1}`` and ``x_{t+2}``."""
        return self.loc + self.d_left * x_left.unsqueeze(-1) + self.d_right * x_right.unsqueeze(-1)

    def features(self, mean: Tensor) -> Tensor:
        """The 8 network inputs ``[..., 8]`` at conditional mean ``mean``."""
        slope = self.slope
        features = self.static + mean[..., 0:1] * slope[..., 0, :] + mean[..., 1:2] * slope[..., 1, :]
        return features.clamp(-_FEATURE_CLIP, _FEATURE_CLIP)

    def __call__(self, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(features, m, L)`` from the context's values ``[..., 6]`` (``x_{t-1}`` and ``x_{t+2}`` are read)."""
        mean = self.mean(values[..., 1], values[..., 2])
        return self.features(mean), mean, self.tril


def _feature_terms(params: Tensor, tril: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``(static [..., 8], slope [..., 2, 8])``: the features ``[vol_i, zeta_i, w_i0, w_i1]`` are affine in the mean."""
    parts, slopes = [], []
    for i, cols in enumerate(_OBS):
        kind, _, d, e, g = params[..., cols].unbind(-1)
        resid = y[..., i] - d
        vol, zeta, e = torch.broadcast_tensors((kind == _VOL).to(tril.dtype), torch.log(resid * resid + _TINY) - g, e)
        w = e.unsqueeze(-1) * tril[..., i, :]
        zero = torch.zeros_like(vol)
        parts += [vol, vol * zeta, vol * w[..., 0], vol * w[..., 1]]
        slopes.append([zero, zero, zero, zero] * i + [zero, -vol * e, zero, zero] + [zero, zero, zero, zero] * (1 - i))
    static = torch.stack(parts, -1)
    slope = torch.stack([torch.stack(row, -1) for row in slopes], -2)
    return static, slope


def chain_encoding(params: Tensor, y: Tensor) -> ChainEncoding:
    """The linearised Gaussian conditional of the block and its features, as affine maps of the neighbours.

    Args:
        params: ``[..., 19]`` static instance parameters (three transitions ``a, b, s``;
            two observations ``kind, c, d, e, g``).
        y: ``[..., 2]`` the block's observations (ignored where ``kind`` is none).

    Returns:
        A :class:`ChainEncoding`.

    Example:
        >>> params = torch.tensor([0.9, 0.0, 0.5] * 3 + [0.0] * 10)  # three transitions, no observation
        >>> enc = chain_encoding(params, torch.zeros(2))
        >>> enc.mean(torch.tensor(1.0), torch.tensor(0.0)).shape, enc.tril.shape
        (torch.Size([2]), torch.Size([2, 2]))
    """
    a, b, s = params[..., _TRANS].unflatten(-1, (3, 3)).unbind(-1)  # each [..., 3]
    prec = 1.0 / (s * s)
    j00 = prec[..., 0] + a[..., 1] ** 2 * prec[..., 1]
    j11 = prec[..., 1] + a[..., 2] ** 2 * prec[..., 2]
    j01 = -a[..., 1] * prec[..., 1]
    h0 = b[..., 0] * prec[..., 0] - a[..., 1] * b[..., 1] * prec[..., 1]  # the neighbours' pull is added by the mean
    h1 = b[..., 1] * prec[..., 1] - a[..., 2] * b[..., 2] * prec[..., 2]
    extra_j, extra_h = [], []
    for i, cols in enumerate(_OBS):
        kind, c, d, e, g = params[..., cols].unbind(-1)
        resid = y[..., i] - d
        lin_j = c * c * torch.exp(-g)
        lin_h = c * resid * torch.exp(-g)
        z = torch.log(resid * resid + _TINY) - g - KSC_MEAN
        vol_j = e * e / KSC_VARIANCE
        vol_h = e * z / KSC_VARIANCE
        extra_j.append(torch.where(kind == _LINEAR, lin_j, torch.where(kind == _VOL, vol_j, torch.zeros_like(c))))
        extra_h.append(torch.where(kind == _LINEAR, lin_h, torch.where(kind == _VOL, vol_h, torch.zeros_like(c))))
    j00, j11 = j00 + extra_j[0], j11 + extra_j[1]
    h0, h1 = h0 + extra_h[0], h1 + extra_h[1]
    det = j00 * j11 - j01 * j01
    cov00, cov11, cov01 = j11 / det, j00 / det, -j01 / det
    loc = torch.stack([cov00 * h0 + cov01 * h1, cov01 * h0 + cov11 * h1], -1)
    d_left = torch.stack([cov00, cov01], -1) * (a[..., 0] * prec[..., 0]).unsqueeze(-1)
    d_right = torch.stack([cov01, cov11], -1) * (a[..., 2] * prec[..., 2]).unsqueeze(-1)
    l00 = cov00.sqrt()
    l10 = cov01 / l00
    l11 = (cov11 - l10 * l10).clamp(min=1e-30).sqrt()
    zero = torch.zeros_like(l00)
    tril = torch.stack([torch.stack([l00, zero], -1), torch.stack([l10, l11], -1)], -2)
    static, slope = _feature_terms(params, tril, y)
    return ChainEncoding(loc, d_left, d_right, tril, static, slope)


def conditional_gaussian(params: Tensor, x_left: Tensor, x_right: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and Cholesky factor of the linearised Gaussian conditional of the block.

    Args:
        params: ``[..., 19]`` static instance parameters (three transitions ``a, b, s``;
            two observations ``kind, c, d, e, g``).
        x_left: ``[...]`` the state just left of the block (``x_{t-1}``).
        x_right: ``[...]`` the state just right of the block (``x_{t+2}``).
        y: ``[..., 2]`` the block's observations (ignored where ``kind`` is none).

    Returns:
        ``(m [..., 2], L [..., 2, 2])``.
    """
    encoding = chain_encoding(params, y)
    return encoding.mean(x_left, x_right), encoding.tril


def whitened_features(params: Tensor, mean: Tensor, tril: Tensor, y: Tensor) -> Tensor:
    """The 8 network inputs ``[vol_i, zeta_i, w_i0, w_i1]`` for ``i = 0, 1``, ``[..., 8]``.

    ``zeta_i = log (y_i - d_i)^2 - g_i - e_i m_i`` and ``w_i = e_i L[i, :]``, for volatility observations (0 otherwise).
    """
    static, slope = _feature_terms(params, tril, y)
    zeros = torch.zeros_like(mean)
    return ChainEncoding(zeros, zeros, zeros, tril, static, slope).features(mean)


def whitened_log_density(u: Tensor, params: Tensor, mean: Tensor, tril: Tensor, y: Tensor) -> Tensor:
    """Exact conditional log-density of whitened block values ``u [S, ..., 2]``, up to a constant.

    ``-|u|^2 / 2`` (the linearised Gaussian) plus, for each volatility observation, its
    exact log-likelihood minus its Kim–Shephard–Chib stand-in.
    """
    x = mean + (tril @ u.unsqueeze(-1)).squeeze(-1)
    out = -0.5 * (u * u).sum(-1)
    for i, cols in enumerate(_OBS):
        kind, _, d, e, g = params[..., cols].unbind(-1)
        resid = y[..., i] - d
        log_var = e * x[..., i] + g
        exact = -0.5 * (log_var + resid * resid * torch.exp(-log_var))
        z = torch.log(resid * resid + _TINY) - g - KSC_MEAN
        stand_in = -((z - e * x[..., i]) ** 2) / (2 * KSC_VARIANCE)
        out = out + torch.where(kind == _VOL, exact - stand_in, torch.zeros_like(exact))
    return out


# ------------------------------------------------------------------------------ graph builders
def state_space_graph(
    transition_weight: Tensor,
    transition_bias: Tensor,
    transition_scale: Tensor,
    observations: Tensor,
    obs_loc_weight: Tensor,
    obs_loc_bias: Tensor,
    obs_logvar_weight: Tensor,
    obs_logvar_bias: Tensor,
    initial_loc: float = 0.0,
    initial_scale: float = 1.0,
) -> FactorGraph:
    """A univariate state-space chain as a FactorGraph (one group per factor kind).

    Variables ``x0 .. x{T-1}`` (latent) then ``y0 .. y{T-1}`` (observed, ids ``T .. 2T-1``).

    Args:
        transition_weight, transition_bias, transition_scale: ``[T - 1]``, the transition
            ``x_{t+1} ~ N(a_t x_t + b_t, s_t^2)``.
        observations: ``[T]`` values ``y_t``.
        obs_loc_weight, obs_loc_bias, obs_logvar_weight, obs_logvar_bias: ``[T]``, the
            observation ``y_t ~ N(c_t x_t + d_t, exp(e_t x_t + g_t))``.
        initial_loc, initial_scale: the prior ``x_0 ~ N(initial_loc, initial_scale^2)``.

    Returns:
        The graph, with evidence set on the observations.

    Raises:
        ValueError: mismatched lengths or non-finite values.
    """
    y = torch.as_tensor(observations, dtype=torch.get_default_dtype()).reshape(-1)
    steps = y.shape[0]
    trans = [
        torch.as_tensor(t, dtype=y.dtype).reshape(-1) for t in (transition_weight, transition_bias, transition_scale)
    ]
    obs = [
        torch.as_tensor(t, dtype=y.dtype).reshape(-1)
        for t in (obs_loc_weight, obs_loc_bias, obs_logvar_weight, obs_logvar_bias)
    ]
    if steps < 1 or any(t.shape[0] != steps - 1 for t in trans) or any(t.shape[0] != steps for t in obs):
        raise ValueError(f"a chain of {steps} observations needs {steps - 1} transitions and {steps} observation rows")
    if not torch.isfinite(y).all():
        raise ValueError("observations must be finite")
    fg = FactorGraph()
    states = fg.add_variables(steps, prefix="x")
    observed = fg.add_variables(steps, prefix="y")
    fg.add_linear_gaussian(states[0], [], [], float(initial_loc), float(initial_scale))
    index = torch.arange(steps)
    if steps > 1:
        fg.add_group(LinearGaussianGroup(index[1:], index[:-1, None], trans[0][:, None], trans[1], trans[2]))
    fg.add_group(LogLinearGaussianGroup(index + steps, index, *obs))
    fg.set_evidence({v: float(val) for v, val in zip(observed, y.tolist())})
    return fg


def stochastic_volatility_graph(
    returns: Tensor, phi: float, sigma: float, mu: float = 0.0, beta: float = 1.0
) -> FactorGraph:
    """The log-volatility chain of ``h_t - mu = phi (h_{t-1} - mu) + sigma eta_t``, ``y_t ~ N(0, beta^2 e^{h_t})``.

    ``h_0`` starts from the stationary law ``N(mu, sigma^2 / (1 - phi^2))``.

    Example:
        >>> fg = stochastic_volatility_graph(torch.zeros(4), phi=0.9, sigma=0.3)
        >>> fg.num_variables, len(fg.latent)
        (8, 4)
    """
    y = torch.as_tensor(returns, dtype=torch.get_default_dtype()).reshape(-1)
    if not (-1 < phi < 1) or not sigma > 0 or not beta > 0:
        raise ValueError(f"need |phi| < 1, sigma > 0, beta > 0; got phi={phi}, sigma={sigma}, beta={beta}")
    steps = y.shape[0]
    ones, zeros = torch.ones(steps), torch.zeros(steps)
    return state_space_graph(
        torch.full((steps - 1,), float(phi)),
        torch.full((steps - 1,), float(mu * (1 - phi))),
        torch.full((steps - 1,), float(sigma)),
        y,
        zeros,
        zeros,
        ones,
        torch.full((steps,), 2 * math.log(beta)),
        initial_loc=mu,
        initial_scale=sigma / math.sqrt(1 - phi * phi),
    )


# ------------------------------------------------------------------------------ the motif
def _chain_states(fg: FactorGraph, cards: Tensor, observed: Tensor) -> Tensor:
    """``[n]`` bool: continuous variables that are latent, or observed and the parent of a one-parent row.

    An observed chain state (``x_t`` given as evidence) still has its observation or the
    next state as a child; an observation is an observed leaf.
    """
    is_parent = torch.zeros(len(cards), dtype=torch.bool)
    for group in fg.groups:
        if isinstance(group, LinearGaussianGroup) and group.parents.shape[1] > 0:
            valid = group.parents >= 0
            single = valid.sum(1) == 1
            is_parent[torch.where(valid, group.parents, -1).max(1).values[single]] = True
        elif isinstance(group, LogLinearGaussianGroup):
            is_parent[group.parent] = True
    return (cards == 0) & (~observed | is_parent)


class ChainMotif(Motif):
    """Middle two states of six consecutive states of a univariate state-space chain.

    Args:
        family: the instantiation distribution for training and evaluation (not part of
            the spec; the features do not depend on it): ``"mixed"`` (default: no,
            linear-Gaussian or volatility observations at random), ``"linear"`` (only
            linear-Gaussian or missing observations: the exact conditional is known) or
            ``"volatility"`` (only volatility observations).

    Example:
        >>> motif = ChainMotif()
        >>> batch = motif.sample_training_batch(16, torch.Generator().manual_seed(0))
        >>> batch.features.shape, batch.block.shape
        (torch.Size([16, 8]), torch.Size([16, 2]))
    """

    name = "chain"
    version = 1

    def __init__(self, family: str = "mixed") -> None:
        if family not in FAMILIES:
            raise ValueError(f"chain: family must be one of {FAMILIES}, got {family!r}")
        self.family = family

    @property
    def block_spec(self) -> BlockSpec:
        """Two continuous variables."""
        return BlockSpec([0, 0])

    @property
    def feature_dim(self) -> int:
        """8: ``[vol_i, zeta_i, w_i0, w_i1]`` for the two block states."""
        return 8

    def options(self) -> dict[str, Any]:
        """No options: one network serves every chain."""
        return {}

    def describe(self) -> str:
        """The structure the motif looks for, in words (shown when a model has no instance).

        Example:
            >>> ChainMotif().describe().split(":")[0]
            'pairs (x_t, x_t+1) of latent continuous states with two chain states on each side'
        """
        return (
            "pairs (x_t, x_t+1) of latent continuous states with two chain states on each side: states joined by "
            "linear-Gaussian transitions (LinearGaussianGroup rows with one parent), each with at most one "
            "linear-Gaussian or log-linear-Gaussian observation of an observed child, and no other factor"
        )

    # -- structure ------------------------------------------------------------------
    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        """Every ``(x_t, x_{t+1})`` with two chain states on each side, in any graph.

        Transitions are linear-Gaussian rows with one latent parent and a latent child;
        observations are linear-Gaussian or log-linear-Gaussian rows with an observed
        child. A block state must be latent and continuous, have at most one incoming and
        one outgoing transition and one observation, and touch no other factor (a
        parentless prior belongs at a chain's start). Context states may be observed: an
        observed continuous variable that is itself a parent (of its observation or of
        the next state) is a chain state, an observed leaf is an observation (so an observed
        last state without an observation of its own reads as one, and the last block is lost).

        Returns:
            ``blocks [I, 2]``, ``context [I, 6]`` (``x_{t-2}, x_{t-1}, x_{t+2}, x_{t+3}``,
            then the block's observation variables, ``-1`` where absent) and
            ``params [I, 19]``.
        """
        n = fg.num_variables
        dtype = torch.get_default_dtype()
        cards = fg.cardinalities
        observed = torch.zeros(n, dtype=torch.bool)
        if fg.evidence:
            observed[list(fg.evidence)] = True
        latent_cont = (cards == 0) & ~observed
        prev = torch.full((n,), -1, dtype=torch.long)
        trans = torch.zeros(n, 3, dtype=dtype)  # (a, b, s) of the transition into each state
        obs = torch.zeros(n, 5, dtype=dtype)  # (kind, c, d, e, g) of each state's observation
        obs_var = torch.full((n,), -1, dtype=torch.long)
        n_in = torch.zeros(n, dtype=torch.long)
        n_out = torch.zeros(n, dtype=torch.long)
        n_obs = torch.zeros(n, dtype=torch.long)
        dirty = torch.zeros(n, dtype=torch.bool)
        has_prior = torch.zeros(n, dtype=torch.bool)
        ones = torch.ones(1, dtype=torch.long)
        chain_state = _chain_states(fg, cards, observed)
        for group in fg.groups:
            if isinstance(group, LinearGaussianGroup):
                if group.parents.shape[1] == 0:  # a prior: fine at a chain's start, not inside a block
                    has_prior[group.child] = True
                    continue
                valid = group.parents >= 0
                arity = valid.sum(1)
                has_prior[group.child[arity == 0]] = True  # a prior stored as an all-padding row
                parent = torch.where(valid, group.parents, -1).max(1).values
                weight = (group.weights * valid).sum(1)
                single = arity == 1
                from_state = chain_state[parent.clamp(min=0)]
                is_trans = single & chain_state[group.child] & from_state
                is_obs = single & ~chain_state[group.child] & observed[group.child] & from_state
                other = (arity > 1) | (single & ~is_trans & ~is_obs)
                c, p = group.child[is_trans], parent[is_trans]
                prev[c] = p
                trans[c] = torch.stack([weight[is_trans], group.bias[is_trans], group.scale[is_trans]], -1)
                n_in.index_add_(0, c, ones.expand(len(c)))
                n_out.index_add_(0, p, ones.expand(len(p)))
                p = parent[is_obs]
                row = torch.stack(
                    [
                        torch.full_like(weight[is_obs], _LINEAR),
                        weight[is_obs],
                        group.bias[is_obs],
                        torch.zeros_like(weight[is_obs]),
                        2 * group.scale[is_obs].log(),
                    ],
                    -1,
                )
                obs[p], obs_var[p] = row, group.child[is_obs]
                n_obs.index_add_(0, p, ones.expand(len(p)))
                scopes = group.scopes[other]
                dirty[scopes[scopes >= 0]] = True
            elif isinstance(group, LogLinearGaussianGroup):
                linear = group.logvar_weight == 0
                vol = (group.loc_weight == 0) & ~linear
                is_obs = observed[group.child] & latent_cont[group.parent] & (linear | vol)
                p = group.parent[is_obs]
                kind = torch.where(vol[is_obs], _VOL, _LINEAR).to(dtype)
                row = torch.stack(
                    [
                        kind,
                        group.loc_weight[is_obs],
                        group.loc_bias[is_obs],
                        group.logvar_weight[is_obs],
                        group.logvar_bias[is_obs],
                    ],
                    -1,
                )
                obs[p], obs_var[p] = row, group.child[is_obs]
                n_obs.index_add_(0, p, ones.expand(len(p)))
                dirty[group.scopes[~is_obs].reshape(-1)] = True
            else:
                scopes = group.scopes
                dirty[scopes[scopes >= 0]] = True
        clean = latent_cont & ~dirty & ~has_prior & (n_in <= 1) & (n_out <= 1) & (n_obs <= 1)
        nxt = torch.full((n,), -1, dtype=torch.long)
        has_prev = prev >= 0
        nxt[prev[has_prev]] = torch.arange(n)[has_prev]  # unique where n_out <= 1, which clean states need

        def step(ids: Tensor, table: Tensor) -> Tensor:
            return torch.where(ids >= 0, table[ids.clamp(min=0)], ids)

        x2 = torch.arange(n)
        x3, x1 = step(x2, nxt), step(x2, prev)
        x0, x4 = step(x1, prev), step(x3, nxt)
        x5 = step(x4, nxt)
        ok = (torch.stack([x0, x1, x3, x4, x5]) >= 0).all(0) & clean & clean[x3.clamp(min=0)]
        ok &= n_in[x2] == 1
        ok &= n_in[x3.clamp(min=0)] == 1
        ok &= n_in[x4.clamp(min=0)] == 1
        x0, x1, x2, x3, x4, x5 = (t[ok] for t in (x0, x1, x2, x3, x4, x5))
        params = torch.cat([trans[x2], trans[x3], trans[x4], obs[x2], obs[x3]], -1)
        context = torch.stack([x0, x1, x4, x5, obs_var[x2], obs_var[x3]], -1)
        return MotifInstances(torch.stack([x2, x3], -1), context, params)

    def _context_values(self, instances: MotifInstances, state: Tensor) -> Tensor:
        ids = instances.context
        return torch.where(ids >= 0, state[..., ids.clamp(min=0)], torch.zeros((), dtype=state.dtype))

    def context_encoder(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> ChainEncoding:
        """The instances' encoder with its static part precomputed: a pure function of the context values.

        The observations are evidence, so everything but the mean is fixed for a graph; the
        encoder maps context values ``[..., I, 6]`` (``0`` where absent) to ``(features, m, L)``
        with a few elementwise operations (the fused path,
        :mod:`neuralblock.kernels.fused_continuous`, calls it inside its class update).

        Args:
            fg: the graph.
            instances: the instances (rows may repeat).
            state: a state ``[n]`` holding the evidence (its dtype is the encoder's).

        Example:
            >>> fg = stochastic_volatility_graph(torch.zeros(7), phi=0.9, sigma=0.3)
            >>> motif = ChainMotif(); inst = motif.find_instances(fg); state = fg.initial_state()
            >>> features, mean, tril = motif.context_encoder(fg, inst, state)(motif._context_values(inst, state))
            >>> bool(torch.allclose(features, motif.encode(fg, inst, state)))
            True
        """
        observations = self._context_values(instances, state)[..., 4:6]
        return chain_encoding(instances.params.to(state), observations)

    def _encoded(self, instances: MotifInstances, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        values = self._context_values(instances, state)
        return chain_encoding(instances.params.to(state.dtype), values[..., 4:6])(values)

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """Whitened features ``[..., I, 8]``."""
        return self._encoded(instances, state)[0]

    def block_affine(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> tuple[Tensor, Tensor]:
        """``(m, L)`` of the linearised Gaussian conditional: ``B = m + L u``."""
        _, mean, tril = self._encoded(instances, state)
        return mean, tril

    def encode_with_affine(
        self, fg: FactorGraph, instances: MotifInstances, state: Tensor
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Features and whitening map from one Gaussian computation."""
        features, mean, tril = self._encoded(instances, state)
        return features, (mean, tril)

    # -- instantiations -------------------------------------------------------------
    def _random_params(self, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """Five transitions ``[size, 5, 3]`` and the two block observations ``[size, 2, 5]``."""
        dtype = torch.get_default_dtype()

        def uniform(lo: float, hi: float, *shape: int) -> Tensor:
            return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=dtype)

        persistent = torch.rand(size, 5, generator=gen) < 0.5
        a = torch.where(persistent, uniform(0.8, 0.999, size, 5), uniform(-1.2, 1.2, size, 5))
        b = 0.5 * torch.randn(size, 5, generator=gen, dtype=dtype)
        s = torch.exp(uniform(math.log(0.02), math.log(3.0), size, 5))
        u = torch.rand(size, 2, generator=gen)
        if self.family == "mixed":
            kind = torch.where(u < 0.15, _NONE, torch.where(u < 0.5, _LINEAR, _VOL))
        elif self.family == "linear":
            kind = torch.where(u < 0.2, _NONE, _LINEAR)
        else:
            kind = torch.full((size, 2), _VOL)
        kind = kind.to(dtype)
        c = torch.where(kind == _LINEAR, uniform(-2.0, 2.0, size, 2), torch.zeros(size, 2, dtype=dtype))
        d = torch.where(torch.rand(size, 2, generator=gen) < 0.6, 0.0, torch.randn(size, 2, generator=gen)).to(dtype)
        standard = torch.rand(size, 2, generator=gen) < 0.6
        sign = torch.where(torch.rand(size, 2, generator=gen) < 0.8, 1.0, -1.0).to(dtype)
        e = torch.where(standard, torch.ones(size, 2, dtype=dtype), sign * uniform(0.25, 2.0, size, 2))
        e = torch.where(kind == _VOL, e, torch.zeros_like(e))
        g = torch.where(
            kind == _LINEAR, 2 * uniform(math.log(0.03), math.log(5.0), size, 2), uniform(-3.0, 3.0, size, 2)
        )
        return torch.stack([a, b, s], -1), torch.stack([kind, c, d, e, g], -1)

    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """Random chains of six states with their block observations, drawn ancestrally.

        The block is returned whitened (``u``); ``exact_log_p`` is ``log N(u; 0, I)`` for
        instances without volatility observations (their linearised Gaussian is exact)
        and NaN otherwise.
        """
        gen = generator
        dtype = torch.get_default_dtype()
        trans, obs = self._random_params(batch_size, gen)
        a, b, s = trans.unbind(-1)
        x = torch.zeros(batch_size, 6, dtype=dtype)
        x[:, 0] = torch.randn(batch_size, generator=gen, dtype=dtype)
        for k in range(5):  # five ancestral steps of a fixed-length chain, vectorized over the batch
            noise = torch.randn(batch_size, generator=gen, dtype=dtype)
            x[:, k + 1] = a[:, k] * x[:, k] + b[:, k] + s[:, k] * noise
        kind, c, d, e, g = obs.unbind(-1)
        xb = x[:, 2:4]
        noise = torch.randn(batch_size, 2, generator=gen, dtype=dtype)
        y = c * xb + d + torch.exp(0.5 * (e * xb + g)) * noise
        y = torch.where(kind == _NONE, torch.zeros_like(y), y)
        params = torch.cat([trans[:, 1:4].reshape(batch_size, 9), obs.reshape(batch_size, 10)], -1)
        mean, tril = conditional_gaussian(params, x[:, 1], x[:, 4], y)
        u = torch.linalg.solve_triangular(tril, (xb - mean).unsqueeze(-1), upper=False).squeeze(-1)
        features = whitened_features(params, mean, tril, y)
        gaussian = (kind != _VOL).all(-1)
        exact = torch.where(
            gaussian, -0.5 * (u * u).sum(-1) - math.log(2 * math.pi), torch.full_like(u[:, 0], math.nan)
        )

        def log_p_fn(values: Tensor) -> Tensor:
            return whitened_log_density(values, params, mean, tril, y)

        return TrainingBatch(features=features, block=u, log_p_fn=log_p_fn, exact_log_p=exact)


register_motif("chain", ChainMotif)
