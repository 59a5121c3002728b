"""A compiled CPU sweep (Numba) of the ``gmm_pair_set`` proposal's mixture pairs: every pair of every chain in one call.

The eager fused step (:func:`~neuralblock.kernels.fused_mixture.mixture_pair_step`) spends about 400 torch
calls per step on about 3 MFLOP of arithmetic (one pair of each chain decided per 2-3 pairs proposed),
so its calls, not its arithmetic, are the time (``benchmarks/gmm_pair_step.py``). Here one compiled
loop does, chain by chain and pair by pair in sweep order, what the step does for one pair: the other
mixtures' share of every point's factor, the motif's features (the head and one token per point,
:meth:`~motifs.gmm_pair_set.GmmPairSetMotif.features`), the set encoder, the MDN's trunk and heads, a
draw from the proposal and both its densities, the energy change and the MH test; an accepted move is
written into the chain's state (and its two mixtures' columns of the per-point terms) before the next
pair. A sweep therefore decides exactly the pairs of a pair-by-pair sweep and proposes no pair twice.

The random numbers come from torch's global RNG, drawn before the loop as four arrays over (chain,
pair) (:func:`draw_pairs`): the component uniforms, the bits' uniforms and the means' normals of the
proposal (for one step, the draws of :meth:`~neuralblock.proposals.mdn.BlockMixture.sample`) and the
tests' uniforms. The arithmetic is the eager step's, in float64 (features, densities, energy) and in the
network's float32 (set encoder, trunk, heads), so from the same numbers the two make the same proposals
and decisions up to rounding; the feature constants mirror :mod:`motifs.gmm_pair`'s, and the tests
(``tests/test_jit_mixture.py``) compare the two on random states. Shortcuts that change only the
rounding:

* a point's share from the other mixtures comes from its sums over all mixtures, kept per chain
  (:func:`_point_sums`, summed afresh after every accepted move): the largest term's mixture, the next one's,
  and the sums of all terms, of all but the largest and of all but both. A pair takes away only its own
  shares, and never more than is left, so no pair re-sums a point (:func:`_rest_log_sum`);
* the current pair's energy is the sum of the points' log-sums, already known (:func:`_current_energy`); a
  proposed pair's, and the candidates' Laplace masses, add the pair's two terms as one ``log1p``
  (:func:`_log_sum_over`);
* the features' ``exp`` (the poorly explained weights, the anchors' kernels, the attention weights) is a
  float32 one whose loops vectorize (:func:`_exp32`: within 2e-7 relative of ``exp`` of its float32 argument,
  ``e^-80`` for anything below -80); SiLU takes it too (:func:`_silu`, within 3e-7 relative of the exact one);
* the first token layer's pair-free part is computed once per call.

The token network's outputs for a point's last 8 distinct tokens are kept (:class:`TokenCache`, from sweep to
sweep) and reused when the token comes again bitwise (only its explained density and weight depend on the
pair, and a pair far from the point leaves their float32 values as they are; a point near several copies
meets the token of each copy's pairs again and again), which skips most of the network's work on large models
without changing any number (20 x 1000, 5 chains: 12% of the tokens computed, 46% with the last two kept). A
pair's new tokens go through the network 128 at a time (:func:`_token_outputs`), each output summed in the same
order whatever else the block holds; a round of pairs at n = 1000 then cost 0.79x (12 x 1000) and 0.83x
(32 x 1000) of the per-token loop's (``benchmarks/gmm_pair_step.py --cover rounds``, medians of 7 paired rounds,
round by round 0.55-1.14), and the shortcuts above with the kept cache and mirrored candidates
(:class:`CandidateOptions`) bring it to 0.92x (12 x 240), 0.91x (12 x 1000) and 0.82x (32 x 1000) of commit
5f10ac0's (the same benchmark, against that commit). The energy leaves out a mean's term 40 nats below the
other mixtures' log-sum (``1 + e^-40`` rounds to 1 in float64). A
pair's proposal reads only its conditioning set, the other mixtures' active means and bits, so pairs with no
active member, or with the same single one, share it: it is kept and reused until an accepted move changes an
active mixture, with the numbers the pair would compute (``reuse=False`` computes every pair; the tests compare
the two bit for bit). Where most mixtures are inactive that skips most of the work (32 x 1000: 0.3-0.4 of the
pairs computed once the chains have climbed, overlap case of seed 7). The
compiled code is cached on disk; a sweep object's first call of a new argument layout compiles it (counted in
``compile_seconds``).

A pair of two active mixtures whose means lie far apart is rarely worth its proposal: scored at the states the GMM
benchmark's chains reach (every pair of 5 chains, 8 draws each), such pairs (over 6 sigma apart) were 46% of the
pairs for 15% of the accepted moves at 16 x 1000 (scaled), over 3 sigma 31% for none at 20 x 1000 (unequal), and
8-18% for 1-5% at n = 60-240, while pairs with one active mixture gave 46-98% of them. The screen
(:class:`PairScreen`) attempts such a pair's move only with probability ``attempt`` and puts the attempt
probabilities of both states into the MH ratio, so the pair's conditional stays invariant; a skipped pair costs
its block's read.

Example:
    >>> import torch
    >>> from motifs.gmm_pair import gmm_graph, gmm_initial_state
    >>> from motifs.gmm_pair_set import GmmPairSetMotif
    >>> from neuralblock.proposals import NeuralBlockProposal
    >>> from neuralblock.kernels.fused_mixture import mixture_layout
    >>> fg = gmm_graph(torch.randn(20, 2), num_mixtures=4, sigma=1.0, tau=5.0, p_active=0.5)
    >>> proposal = NeuralBlockProposal(GmmPairSetMotif(hidden=8, heads=2), components=3, hidden=(16,))
    >>> net = MixtureNetwork.from_proposal(proposal)
    >>> layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
    >>> state = torch.stack([gmm_initial_state(fg), gmm_initial_state(fg)])
    >>> slots = np.arange(len(layout.pairs)).reshape(1, -1).repeat(2, 0)  # every pair of both chains, in order
    >>> draws = draw_pairs(2, slots.shape[1], net.components, dim=2)
    >>> accepted, _, log_alpha, blocks = mixture_pair_sweep(state.numpy(), slots, slots >= 0, layout, net, draws)
    >>> accepted.shape, blocks.shape  # 6 pairs of 4 mixtures, blocks (mu_i, v_i, mu_j, v_j)
    ((2,), (2, 6, 6))
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from neuralblock.kernels.jit import _compiled, _half_sq_distance, _logaddexp
from neuralblock.proposals import NeuralBlockProposal
from neuralblock.proposals.mdn import _FEATURE_CLIP, _MAX_LOG_SCALE, _MIN_LOG_SCALE

if TYPE_CHECKING:
    from neuralblock.kernels.fused_mixture import StepConstants

__all__ = [
    "CandidateOptions",
    "MixtureNetwork",
    "PairDraws",
    "PairScreen",
    "TokenCache",
    "draw_pairs",
    "mixture_pair_sweep",
    "pair_candidates",
]

_EXPLAINED_FLOOR = -30.0  # the motif's (motifs.gmm_pair): floor of a point's log explained density
_POORLY_EXPLAINED = -3.0
_COORD_SCALE = 4.0
_ANCHOR_RADIUS = 2.5
_POINTS_SCALE = 100.0
_TINY32 = float(np.finfo(np.float32).tiny)
_NEGLIGIBLE = 30.0  # a mean's term this far below a point's other share adds under e^-30 of it: skipped
_LOG_2PI = math.log(2.0 * math.pi)
_TOKEN_SLOTS = 8  # cached token-network outputs per point (least recently used replaced)
_TOKEN_BLOCK = 128  # token-network inputs evaluated together (the loops over them vectorize)
_EXP_LOW, _EXP_HIGH = np.float32(-80.0), np.float32(80.0)  # _silu's float32 exp: its argument's range
_LOG2E_32, _ROUNDING_32 = np.float32(1.4426950408889634), np.float32(12582912.0)  # 1 / ln 2; 1.5 * 2^23
_LN2_HIGH_32, _LN2_LOW_32 = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 in two parts
_TINY_LEFT = 1e-300  # a point's sum without the pair below this (relative to its top term) is summed term by term
_BELOW_ROUNDING = 40.0  # a term this far below a point's log-sum adds e^-40 < 2^-57 of it: below float64 rounding


class MixtureNetwork(NamedTuple):
    """A ``gmm_pair_set`` proposal's network as float32 arrays, weights transposed to ``[in, out]``.

    Attributes:
        phi1_w, phi1_b, phi2_w, phi2_b: the set encoder's token MLP; ``score_w``, ``score_b``: its attention scores.
        trunk_w, trunk_b: the trunk's layers (a tuple of arrays each).
        mix_w, mix_b: mixture logits; ``disc_w``, ``disc_b``: the bits' logits ``[C * 2 * 2]``;
        loc_w, loc_b: means ``[C * 2 D]``; ``scale_w``, ``scale_b``: log scales ``[C * G]``.
        groups: ``[2 D]`` each continuous variable's scale group; ``components``: ``C``.
    """

    phi1_w: np.ndarray
    phi1_b: np.ndarray
    phi2_w: np.ndarray
    phi2_b: np.ndarray
    score_w: np.ndarray
    score_b: np.ndarray
    trunk_w: tuple[np.ndarray, ...]
    trunk_b: tuple[np.ndarray, ...]
    mix_w: np.ndarray
    mix_b: np.ndarray
    disc_w: np.ndarray
    disc_b: np.ndarray
    loc_w: np.ndarray
    loc_b: np.ndarray
    scale_w: np.ndarray
    scale_b: np.ndarray
    groups: np.ndarray
    components: int

    @classmethod
    def from_proposal(cls, proposal: NeuralBlockProposal) -> MixtureNetwork | None:
        """The arrays of a float32 CPU ``gmm_pair_set`` proposal with two hidden layers or fewer; else ``None``.

        The block must be ``(mu_i, v_i, mu_j, v_j)`` with binary bits (the ``gmm_pair`` block).
        """
        mdn, motif = proposal.mdn, proposal.motif
        dim = getattr(motif, "dim", None)
        pool = mdn.set_pooling
        cards = [0] * int(dim or 0) + [2] + [0] * int(dim or 0) + [2]
        if (
            getattr(motif, "name", None) != "gmm_pair_set"
            or pool is None
            or proposal.dtype != torch.float32
            or next(mdn.parameters()).device.type != "cpu"
            or mdn.cardinalities != cards
            or mdn.discrete_head is None
            or mdn.loc_head is None
            or mdn.scale_head is None
            or len(mdn.hidden) > 2
        ):
            return None

        def arrays(layer: Any) -> tuple[np.ndarray, np.ndarray]:
            weight = layer.weight.detach().to(torch.float32).t().contiguous().numpy()
            return weight, layer.bias.detach().to(torch.float32).contiguous().numpy()

        linears = [layer for layer in mdn.trunk if isinstance(layer, torch.nn.Linear)]
        trunk = [arrays(layer) for layer in linears]
        groups = mdn.scale_groups if mdn.scale_groups is not None else [0] * (2 * int(dim or 0))
        return cls(
            *arrays(pool.phi[0]),
            *arrays(pool.phi[2]),
            *arrays(pool.score),
            tuple(w for w, _ in trunk),
            tuple(b for _, b in trunk),
            *arrays(mdn.mixture_head),
            *arrays(mdn.discrete_head),
            *arrays(mdn.loc_head),
            *arrays(mdn.scale_head),
            np.asarray(groups, dtype=np.int64),
            int(mdn.components),
        )


class TokenCache(NamedTuple):
    """The token network's outputs per point, kept across sweeps (:func:`mixture_pair_sweep`'s ``cache``).

    A point's token changes with the pair only through its explained density and weight, so a point meets the
    same few tokens again and again (one for the pairs far from it, one for each pair with a mixture near it).
    ``known`` holds the two token entries of each of ``_TOKEN_SLOTS`` slots per point (NaN: empty), ``phi`` and
    ``scores`` their outputs, ``last_used`` each slot's last use on ``clock`` (the least recently used is
    replaced). The outputs are a pure function of the token, the point and the network: a cache serves one
    network and one model's points.

    Example:
        >>> cache = TokenCache.empty(points=5, hidden=4, heads=2)
        >>> cache.phi.shape, bool(np.isnan(cache.known).all())
        ((5, 8, 4), True)
    """

    known: np.ndarray
    phi: np.ndarray
    scores: np.ndarray
    last_used: np.ndarray
    clock: np.ndarray

    @classmethod
    def empty(cls, points: int, hidden: int, heads: int) -> TokenCache:
        """An empty cache for ``points`` points of a network of ``hidden`` token units and ``heads`` heads."""
        return cls(
            np.full((points, _TOKEN_SLOTS, 2), np.nan, dtype=np.float32),
            np.zeros((points, _TOKEN_SLOTS, hidden), dtype=np.float32),
            np.zeros((points, _TOKEN_SLOTS, heads), dtype=np.float32),
            np.zeros((points, _TOKEN_SLOTS), dtype=np.int64),
            np.zeros(1, dtype=np.int64),
        )

    def fits(self, points: int, hidden: int, heads: int) -> bool:
        """Whether this cache has the shape of ``points`` points and that network's token outputs."""
        return self.phi.shape == (points, _TOKEN_SLOTS, hidden) and self.scores.shape[2] == heads


class PointSums(NamedTuple):
    """Per point, the sums of :func:`_point_sums` (arrays over the points)."""

    top: np.ndarray
    first: np.ndarray
    second: np.ndarray
    total: np.ndarray
    but_first: np.ndarray
    but_both: np.ndarray
    lse: np.ndarray


class PairDraws(NamedTuple):
    """The random numbers of ``W`` pair moves of ``K`` chains.

    Attributes:
        components: ``[K, W, C]`` uniforms (float32) of the proposal's component.
        bits: ``[K, W, 2, 2]`` uniforms (float32) of the two bits.
        normals: ``[K, W, 2 D]`` standard normals (float32) of the means.
        log_u: ``[K, W]`` log uniforms (float64) of the MH tests.
        choice: ``[K, W, 2]`` uniforms (float64) of the data-refined candidates (:class:`CandidateOptions`):
            the network or the candidates, then which candidate (``None``: the network alone).
        screen: ``[K, W]`` uniforms (float64) of the screen's attempts (:class:`PairScreen`; ``None``: no screen).
    """

    components: Tensor
    bits: Tensor
    normals: Tensor
    log_u: Tensor
    choice: Tensor | None = None
    screen: Tensor | None = None


class PairScreen(NamedTuple):
    """Far pairs of active mixtures attempted less often: a pair's move is tried with probability ``s(S)``.

    ``s(S)`` is ``attempt`` where both mixtures of the pair are active and their means lie more than
    ``radius`` sigma apart, else 1. Such a pair is the round's dearest and least useful: at states the
    GMM benchmark's chains reach at ``n = 1000`` they were 31-46% of the pairs for 0-15% of the accepted
    moves (the module docstring). An attempted move is accepted with
    ``min(1, p(S') q(S | S') s(S') / (p(S) q(S' | S) s(S)))``, which keeps the pair's conditional
    invariant (a move that is not attempted keeps ``S``): exact for any ``attempt`` in ``(0, 1]``.
    Moves that make a far active pair (births far from the pair's other mean) pay the same factor.

    Example:
        >>> screen = PairScreen()
        >>> screen.radius, screen.attempt
        (3.0, 0.25)
    """

    radius: float = 3.0
    attempt: float = 0.25


class CandidateOptions(NamedTuple):
    """Data-refined candidates mixed into the network's proposal (the compiled sweep's default).

    A pair's proposal becomes ``share q_net + (1 - share) q_cand``. ``q_cand`` is a Gaussian mixture
    built from the conditioning set alone, so MH stays exact: candidate locations are the network's
    components of weight at least ``min_weight`` (the heaviest always) and copies of the other active
    mixtures (one per group closer than ``merge_distance``, whitened); for each activity pattern of the
    pair, an active mean takes ``em_steps`` EM steps from its location on the points (the other
    mixtures' share of each point held fixed) and gets the precision ``sum_j r_j^2 + (sigma / tau)^2``
    (``r_j`` its responsibilities), an inactive mean its prior (its exact conditional); each candidate
    is weighted by its Laplace mass ``p(m*, v | C) |2 pi S*|^(1/2)``. Candidates per pattern: ``(0, 0)``
    once; ``(1, 0)`` and ``(0, 1)`` from each location of that mean; ``(1, 1)`` from each kept
    component's pair of means and from each copy paired with the heaviest component's other mean.
    The EM steps and masses read at most ``max_points`` of the points (every ``ceil(n / max_points)``-th,
    each standing for that many) and the copies are the first ``max_copies`` locations (in mixture order):
    functions of ``C`` too, so the candidates' cost stays bounded as ``n`` and ``m`` grow. From a copy's location
    the candidate with the second mean active is the first's mirrored (the same EM steps and points' mass, the
    other bit's prior odds), not refined again. *Splits*: from the ``splits`` first-mean locations of the largest
    masses, both means start at the refined mean plus and minus the points' principal half-spread there (the
    points weighted by that mean's responsibilities against the other mixtures), take the EM steps, and enter
    with their mirror (the means swapped): a cluster that two means fit better than one, as a split-merge move
    would split it, which EM from a copy (two equal means) never reaches. A sweep uses
    them on models of at least ``min_points`` points and proposes from the network alone below: on the GMM
    benchmark at scale, candidates at every size bought 2x the acceptance at ``n <= 240`` for 2-7x fewer
    sweeps and lost time there, and at ``n = 1000`` crossed the copy barrier where the network alone
    stalled (``experiments/results/gmm_scale/candidates-everywhere-07b6984``).
    ``experiments/gmm_pair_candidates.py`` measures the design (acceptance and births at n = 1000).
    """

    share: float = 0.1
    min_weight: float = 0.05
    merge_distance: float = 0.5
    em_steps: int = 1
    max_points: int = 128
    max_copies: int = 6
    splits: int = 2
    min_points: int = 500


def draw_pairs(chains: int, width: int, components: int, dim: int) -> PairDraws:
    """Fresh :class:`PairDraws` from torch's global RNG (the proposal's three draws, the tests', the candidates')."""
    return PairDraws(
        torch.rand(chains, width, components),
        torch.rand(chains, width, 2, 2),
        torch.randn(chains, width, 2 * dim),
        torch.rand(chains, width, dtype=torch.float64).log(),
        torch.rand(chains, width, 2, dtype=torch.float64),
        torch.rand(chains, width, dtype=torch.float64),
    )


def pair_candidates(
    points: np.ndarray,
    rest: np.ndarray,
    rest_count: float,
    log_odds: tuple[float, float],
    prior_precision: float,
    log_w: np.ndarray,
    loc: np.ndarray,
    others: np.ndarray,
    options: CandidateOptions | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One pair's data-refined candidates as the compiled sweep builds them (:class:`CandidateOptions`; ``min_points``
    is the sweep's rule and not applied here).

    Args:
        points: ``[n, D]`` whitened points; ``rest``: ``[n]`` the other mixtures' log share of each point
            (``-inf`` where none is active); ``rest_count``: their number of active mixtures.
        log_odds: the pair's bits' prior log odds; ``prior_precision``: ``(sigma / tau)^2``.
        log_w: ``[C]`` the network's log weights; ``loc``: ``[C, 2 D]`` its whitened means ``(u_i, u_j)``.
        others: ``[c, D]`` the other active mixtures' whitened means.
        options: the :class:`CandidateOptions` (default: the sweep's).

    Returns:
        ``(bits [S, 2], means [S, 2 D], log_sd [S, 2], log_weights [S])``: one isotropic Gaussian per mean
        (an inactive mean's is its prior), the weights normalized.

    Example:
        >>> points = np.array([[0.0, 0.0], [0.2, 0.1], [5.0, 5.0]])
        >>> bits, means, log_sd, log_w = pair_candidates(
        ...     points, np.full(3, -np.inf), 0.0, (0.0, 0.0), 0.04, np.zeros(1), np.zeros((1, 4)), np.zeros((0, 2)))
        >>> bits.shape, round(float(np.exp(log_w).sum()), 6)  # (0,0), (1,0), (0,1), (1,1), a split and its mirror
        ((6, 2), 1.0)
    """
    options = CandidateOptions() if options is None else options
    points = np.ascontiguousarray(points, dtype=np.float64)
    n, dim = points.shape
    loc = np.ascontiguousarray(loc, dtype=np.float64)
    others = np.ascontiguousarray(others, dtype=np.float64).reshape(-1, dim)
    components, count = loc.shape[0], others.shape[0]
    most = _most_candidates(components, count, int(options.splits))
    bits, means = np.empty((most, 2), dtype=np.int64), np.empty((most, 2 * dim))
    log_sd, weights = np.empty((most, 2)), np.empty(most)
    min_log_w = math.log(options.min_weight) if options.min_weight > 0 else -math.inf
    size = _build_candidates(
        points, np.ascontiguousarray(rest, dtype=np.float64), max(1, -(-n // options.max_points)), float(rest_count),
        float(log_odds[0]), float(log_odds[1]), float(prior_precision), np.ascontiguousarray(log_w, dtype=np.float64),
        loc, others, count, min_log_w, float(options.merge_distance) ** 2, int(options.em_steps),
        int(options.max_copies), int(options.splits), bits, means, log_sd, weights, np.empty(dim), np.empty(dim),
    )  # fmt: skip
    return bits[:size], means[:size], log_sd[:size], weights[:size]


# ---------------------------------------------------------------------------------------------- compiled
@_compiled
def _most_candidates(components, others, splits):
    """The most candidates a pair builds (:func:`_build_candidates`) from ``components`` network components, ``others``
    other mixtures and ``splits`` split locations."""
    return 1 + 2 * (components + others) + components + 2 * others + 2 * min(splits, components + others)


@_compiled
def _exp32(x, out, powers, sign):
    """``out[:size] = exp(sign * x[:size])`` over float32 vectors (``size = len(x)``), by a float32 ``exp`` whose
    loops vectorize.

    ``exp(t)`` is ``2^k exp(r)``: ``k`` the nearest integer to ``t / ln 2`` (by the ``1.5 * 2^23`` rounding
    trick), ``r`` the rest in two parts (Cody and Waite), ``exp(r)`` a degree-7 polynomial (Cephes' ``expf``)
    and ``2^k`` added to its exponent bits. ``t`` is clamped to ``[-80, 80]`` first (NaN to -80): ``exp`` of
    anything below -80 is ``e^-80`` (1.8e-35). Within 2e-7 relative of the exact ``exp`` on ``[-80, 80]``; a pure
    function of each entry. ``out`` (float32) and ``powers`` (int32) are vectors at least as long as ``x``, and
    not ``x`` itself: the loops vectorize only where the compiler finds that they do not overlap.
    """
    size = x.shape[0]
    for i in range(size):
        t = sign * x[i]
        t = t if t > _EXP_LOW else _EXP_LOW
        t = t if t < _EXP_HIGH else _EXP_HIGH
        k = (t * _LOG2E_32 + _ROUNDING_32) - _ROUNDING_32
        r = t - k * _LN2_HIGH_32 - k * _LN2_LOW_32
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        out[i] = p * r * r + r + np.float32(1.0)
        powers[i] = np.int32(k) << 23
    bits = out[:size].view(np.int32)
    for i in range(size):
        bits[i] += powers[i]


@_compiled
def _silu(x, work, powers):
    """``x * sigmoid(x)`` in place over a float32 vector, by :func:`_exp32` of ``-x``.

    Above 80 ``silu(x) = x`` in float32; below -80 it gives ``x e^-80`` (under ``|x| 1.9e-35``, the exact value
    being smaller still), and ``-inf`` for ``-inf`` (NaN exactly). Within 3e-7 relative of the exact SiLU on
    ``[-80, inf)``; a pure function of each entry (the token cache reuses its outputs). ``work`` (float32) and
    ``powers`` (int32) are scratch vectors at least as long as ``x``.
    """
    size = x.shape[0]
    _exp32(x, work, powers, np.float32(-1.0))
    for i in range(size):
        x[i] = x[i] / (np.float32(1.0) + work[i])


@_compiled
def _block_affine(x, w, b, out, size):
    """``out[:, t] = w.T @ x[:, t] + b`` for the first ``size`` columns (``w``: ``[in, out]``), columns innermost.

    Each entry is summed over the inputs in order, as :func:`_affine` sums it, whatever the other columns hold.
    """
    for o in range(out.shape[0]):
        for t in range(size):
            out[o, t] = b[o]
        for i in range(x.shape[0]):
            weight = w[i, o]
            for t in range(size):
                out[o, t] += x[i, t] * weight


@_compiled
def _affine(x, w, b, out):  # out = x @ w + b (w: [in, out]), as axpy over the output
    out[:] = b
    for i in range(x.shape[0]):
        xi = x[i]
        if xi != 0.0:
            for j in range(out.shape[0]):
                out[j] += xi * w[i, j]


@_compiled
def _token_outputs(
    points_of, slots_of, count, tokens, token_base, phi1_w, phi2_w, phi2_b, score_w, score_b, cached_phi,
    cached_scores, h1, h2, scores, work, powers,
):  # fmt: skip
    """The token network's outputs (``phi`` and the attention scores) of ``count`` tokens, into the token cache.

    Token ``t`` is point ``j = points_of[t]``'s (``tokens[j]``; its first layer's pair-free part is
    ``token_base[j]``), and its outputs go to slot ``slots_of[t]`` of ``cached_phi[j]`` and ``cached_scores[j]``.
    The tokens are taken ``_TOKEN_BLOCK`` at a time, one column each, the columns innermost in the network's loops
    (``h1``, ``h2``: ``[hidden, _TOKEN_BLOCK]``, ``scores``: ``[heads, _TOKEN_BLOCK]`` float32 scratch; ``work``,
    ``powers``: :func:`_silu`'s). Each output is summed in the same order whatever else the block holds, and only
    the block's own columns are read: a pure function of its token.
    """
    hidden, heads = phi2_b.shape[0], score_b.shape[0]
    dim = phi1_w.shape[0] - 3
    for start in range(0, count, _TOKEN_BLOCK):
        size = min(_TOKEN_BLOCK, count - start)
        for h in range(hidden):
            w_explained, w_poorly = phi1_w[dim, h], phi1_w[dim + 1, h]
            for t in range(size):
                j = points_of[start + t]
                h1[h, t] = token_base[j, h] + tokens[j, dim] * w_explained + tokens[j, dim + 1] * w_poorly
        for h in range(hidden):
            _silu(h1[h, :size], work, powers)
        _block_affine(h1, phi2_w, phi2_b, h2, size)
        for h in range(hidden):
            _silu(h2[h, :size], work, powers)
        _block_affine(h2, score_w, score_b, scores, size)
        for t in range(size):
            j, slot = points_of[start + t], slots_of[start + t]
            for o in range(hidden):
                cached_phi[j, slot, o] = h2[o, t]
            for a in range(heads):
                cached_scores[j, slot, a] = scores[a, t]


@_compiled
def _clip(x):  # as the MDN's input: NaN to 0, then clamped to +-_FEATURE_CLIP
    if x != x:
        return 0.0
    return min(max(x, -_FEATURE_CLIP), _FEATURE_CLIP)


@_compiled
def _anchor(u, weight, key, dim, w, d2, arg, kernel, powers):
    """Two mean-shift steps from the point of smallest key: (centre, mass, spread), as motifs.gmm_pair._anchor.

    The Gaussian kernel's ``exp`` is :func:`_exp32`'s of its float32-rounded argument (a feature: within 6e-6
    relative for kernels over ``e^-80``, ``e^-80`` below). ``w``, ``d2`` (float64),
    ``arg``, ``kernel`` (float32) and ``powers`` (int32) are scratch vectors of ``len(u)``.
    """
    n = u.shape[0]
    seed = 0
    for j in range(1, n):
        if key[j] < key[seed]:
            seed = j
    centre = u[seed].copy()
    mass = 0.0
    for _ in range(2):
        for j in range(n):
            s = 0.0
            for d in range(dim):
                diff = u[j, d] - centre[d]
                s += diff * diff
            d2[j] = s
            arg[j] = s * (-0.5 / 6.25)
        _exp32(arg, kernel, powers, np.float32(1.0))
        mass = 0.0
        for j in range(n):
            w[j] = weight[j] * kernel[j]
            mass += w[j]
        if mass > 1e-6:
            for d in range(dim):
                acc = 0.0
                for j in range(n):
                    acc += w[j] * u[j, d]
                centre[d] = acc / mass
    spread_sum = 0.0
    for j in range(n):
        spread_sum += w[j] * d2[j]
    spread = math.sqrt(spread_sum / max(mass, 1e-6) + 1e-6)
    return centre, mass, spread


@_compiled
def _point_sums(terms, sums):
    """Per point (row of ``terms``), summed afresh: the log-sum of all terms and what :func:`_rest_log_sum` reads.

    ``sums`` is a :class:`PointSums` of arrays over the points: the largest term ``top`` (mixture ``first``), the
    next largest's mixture ``second``, and the sums of ``exp(term - top)`` over all mixtures (``total``), all but
    ``first`` (``but_first``) and all but both (``but_both``); ``lse`` is ``top + log(total)``. Returns the sum of
    ``lse`` over the points.
    """
    grand = 0.0
    for j in range(terms.shape[0]):
        a, b = 0, -1  # (one mixture: no second)
        for mixture in range(1, terms.shape[1]):
            if terms[j, mixture] > terms[j, a]:
                a = mixture
        for mixture in range(terms.shape[1]):
            if mixture != a and (b < 0 or terms[j, mixture] > terms[j, b]):
                b = mixture
        best = terms[j, a]
        sums.top[j], sums.first[j], sums.second[j] = best, a, b
        total, but_first, but_both = 0.0, 0.0, 0.0
        if best > -math.inf:
            for mixture in range(terms.shape[1]):
                e = math.exp(terms[j, mixture] - best)
                total += e
                if mixture != a:
                    but_first += e
                    if mixture != b:
                        but_both += e
        sums.total[j], sums.but_first[j], sums.but_both[j] = total, but_first, but_both
        sums.lse[j] = best + math.log(total) if best > -math.inf else -math.inf
        grand += sums.lse[j]
    return grand


@_compiled
def _rest_log_sum(sums, terms_j, j, pi, pj, share_i, share_j):
    """Point ``j``'s log-sum without mixtures ``pi`` and ``pj`` (shares ``exp(term - top)``; 0 if inactive).

    From :func:`_point_sums`' sums with no loop over the mixtures: the sum less the pair's shares where the pair
    holds neither the largest term nor both of the largest two, else the sum without the largest (less the other
    member's share) or without both. Every subtraction takes away at most what is left (a term no larger than one
    kept), so it loses under ``m`` units of rounding. Where what is left is under ``_TINY_LEFT`` (the others' terms
    lie some 690 nats or more below the pair's, where ``exp`` loses bits to underflow, or no other mixture is
    active) the point's terms ``terms_j`` are summed without the pair instead.
    """
    top = sums.top[j]
    if top == -math.inf:
        return -math.inf
    a, b = sums.first[j], sums.second[j]
    if pi == a or pj == a:
        other, share = (pj, share_j) if pi == a else (pi, share_i)
        left = sums.but_both[j] if other == b else sums.but_first[j] - share
    else:
        left = sums.total[j] - share_i - share_j
    if left < _TINY_LEFT:
        return _log_sum_except(terms_j, pi, pj)
    return top + math.log(left)


@_compiled
def _log_sum_except(row, pi, pj):
    """``log sum exp`` of ``row`` without entries ``pi`` and ``pj`` (``-inf`` when nothing is left)."""
    top = -math.inf
    for mixture in range(row.shape[0]):
        if mixture != pi and mixture != pj and row[mixture] > top:
            top = row[mixture]
    if top == -math.inf:
        return -math.inf
    acc = 0.0
    for mixture in range(row.shape[0]):
        if mixture != pi and mixture != pj:
            acc += math.exp(row[mixture] - top)
    return top + math.log(acc)


@_compiled
def _log_sum_over(base, a, b):
    """``log(e^base + e^a + e^b)`` as ``base + log1p(e^(a - base) + e^(b - base))`` (two ``exp`` and one ``log1p``).

    A term over 40 nats below ``base`` is left out (it adds under ``e^-40 < 2^-57`` of the sum: below float64
    rounding). Where ``base`` is ``-inf``, or a term lies over 700 nats above it (``exp`` would overflow), the sum is
    taken term by term.
    """
    if base == -math.inf:
        return _logaddexp(a, b)
    d_a = a - base
    d_b = b - base
    if d_a < -_BELOW_ROUNDING and d_b < -_BELOW_ROUNDING:
        return base
    if d_a > 700.0 or d_b > 700.0:
        return _logaddexp(_logaddexp(base, a), b)
    shares = (math.exp(d_a) if d_a >= -_BELOW_ROUNDING else 0.0) + (math.exp(d_b) if d_b >= -_BELOW_ROUNDING else 0.0)
    return base + math.log1p(shares)


@_compiled
def _pair_prior(block, dim, center, tau, log_odds_i, log_odds_j):
    """The pair's prior terms: its bits' log odds and its means' Gaussian prior (up to constants)."""
    v_i, v_j = block[dim], block[2 * dim + 1]
    sq = 0.0
    for d in range(dim):
        a = block[d] - center[d]
        b = block[dim + 1 + d] - center[d]
        sq += a * a + b * b
    return v_i * log_odds_i + v_j * log_odds_j - 0.5 / (tau * tau) * sq


@_compiled
def _current_energy(grand, n, rest_count, block, dim, center, tau, log_odds_i, log_odds_j):
    """:func:`_pair_energy` of the chain's own pair ``block``, from ``grand``, the points' log-sums summed.

    The current state's per-point log-sums hold every mixture, the pair's included, so no point is summed again.
    """
    count = rest_count + block[dim] + block[2 * dim + 1]
    if count <= 0:
        return -math.inf
    return grand - n * math.log(max(count, 1.0)) + _pair_prior(block, dim, center, tau, log_odds_i, log_odds_j)


@_compiled
def _pair_energy(rest_lse, rest_count, points, block, dim, center, sigma, tau, log_odds_i, log_odds_j):
    """log p(B) up to the conditioning set's constant: the points' mixture factors and the pair's priors."""
    n = points.shape[0]
    v_i, v_j = block[dim], block[2 * dim + 1]
    count = rest_count + v_i + v_j
    if count <= 0:
        return -math.inf
    total = 0.0
    prior = _pair_prior(block, dim, center, tau, log_odds_i, log_odds_j)
    u_i = np.empty(dim)  # the whitened means
    u_j = np.empty(dim)
    for d in range(dim):
        u_i[d] = (block[d] - center[d]) / sigma
        u_j[d] = (block[dim + 1 + d] - center[d]) / sigma
    log_v_i = math.log(v_i) if v_i > 0 else -math.inf
    log_v_j = math.log(v_j) if v_j > 0 else -math.inf
    for j in range(n):
        a_i, a_j = _member_terms(points[j], u_i, u_j, int(v_i > 0), int(v_j > 0))  # (ints, as the other callers)
        total += _log_sum_over(rest_lse[j], a_i + log_v_i, a_j + log_v_j)
    return total - n * math.log(max(count, 1.0)) + prior


@_compiled
def _log_q(value, log_w, disc_logp, loc, log_scale, cont_pos, disc_pos):
    """log q(value) of the block mixture (float64), as BlockMixture.log_prob."""
    n_comp = log_w.shape[0]
    comp = np.empty(n_comp)
    top = -math.inf
    for c in range(n_comp):
        s = log_w[c]
        for d in range(disc_pos.shape[0]):
            s += disc_logp[c, d, int(value[disc_pos[d]])]
        for i in range(cont_pos.shape[0]):
            ls = log_scale[c, i]
            z = (value[cont_pos[i]] - loc[c, i]) * math.exp(-ls)
            s += -0.5 * z * z - ls - 0.9189385332046727
        comp[c] = s
        top = max(top, s)
    if top == -math.inf:
        return -math.inf
    acc = 0.0
    for c in range(n_comp):
        acc += math.exp(comp[c] - top)
    return top + math.log(acc)


@_compiled
def _read_mixture(state, mixture, mean_ids, active_ids, center, sigma, points, bits, u_means, terms):
    """A mixture's bit, whitened mean and column ``log v - |x_j - u|^2 / 2`` of the per-point terms, from ``state``."""
    dim = points.shape[1]
    bits[mixture] = state[active_ids[mixture]]
    for d in range(dim):
        u_means[mixture, d] = (state[mean_ids[mixture, d]] - center[d]) / sigma
    for j in range(points.shape[0]):
        if bits[mixture] > 0:
            s = 0.0
            for d in range(dim):
                diff = points[j, d] - u_means[mixture, d]
                s += diff * diff
            terms[j, mixture] = math.log(bits[mixture]) - 0.5 * s
        else:
            terms[j, mixture] = -math.inf


@_compiled
def _member_terms(point, mean_i, mean_j, act_i, act_j):
    """``log N(x_j; u, I)`` up to its constant for both means of a pair (``-inf`` for an inactive one)."""
    a_i = _half_sq_distance(point, mean_i) if act_i else -math.inf
    a_j = _half_sq_distance(point, mean_j) if act_j else -math.inf
    return a_i, a_j


@_compiled
def _refine_pair(points, rest, stride, act_i, act_j, mean_i, mean_j, steps, pp, acc_i, acc_j):
    """EM steps of the pair's active means in place (``rest`` held fixed); returns both precisions.

    The points read are every ``stride``-th one, each standing for ``stride`` points. A precision is
    ``sum_j r_j^2 + pp`` at the last step's responsibilities ``r`` (``pp`` when inactive).
    """
    n, dim = points.shape
    if not act_i and not act_j:
        return pp, pp
    sq_i = 0.0
    sq_j = 0.0
    for _ in range(steps):
        n_i = 0.0
        n_j = 0.0
        sq_i = 0.0
        sq_j = 0.0
        acc_i[:] = 0.0
        acc_j[:] = 0.0
        for j in range(0, n, stride):
            a_i, a_j = _member_terms(points[j], mean_i, mean_j, act_i, act_j)
            r = rest[j]
            if r > -math.inf and a_i < r - _NEGLIGIBLE and a_j < r - _NEGLIGIBLE:
                continue
            top = max(r, max(a_i, a_j))
            total = 0.0
            if r > -math.inf:
                total += math.exp(r - top)
            e_i = math.exp(a_i - top) if act_i else 0.0
            e_j = math.exp(a_j - top) if act_j else 0.0
            total += e_i + e_j
            r_i = e_i / total
            r_j = e_j / total
            n_i += r_i
            n_j += r_j
            sq_i += r_i * r_i
            sq_j += r_j * r_j
            for d in range(dim):
                acc_i[d] += r_i * points[j, d]
                acc_j[d] += r_j * points[j, d]
        for d in range(dim):
            if act_i:
                mean_i[d] = stride * acc_i[d] / (stride * n_i + pp)
            if act_j:
                mean_j[d] = stride * acc_j[d] / (stride * n_j + pp)
    return (stride * sq_i + pp if act_i else pp), (stride * sq_j + pp if act_j else pp)


@_compiled
def _laplace_mass(points, rest, stride, rest_count, act_i, act_j, mean_i, mean_j, pp, odds_i, odds_j, prec_i, prec_j):
    """``log p(m*, v | C) + log |2 pi S*|^(1/2)`` up to the conditioning set's constant (inactive: the prior's).

    The points' part is read from every ``stride``-th point, times ``stride``.
    """
    n, dim = points.shape
    count = rest_count + act_i + act_j
    if count <= 0:
        return -math.inf
    gain = 0.0
    for j in range(0, n, stride):
        a_i, a_j = _member_terms(points[j], mean_i, mean_j, act_i, act_j)
        r = rest[j]
        if r == -math.inf:
            both = _logaddexp(a_i, a_j)
            if both == -math.inf:
                return -math.inf
            gain += both
        elif a_i >= r - _NEGLIGIBLE or a_j >= r - _NEGLIGIBLE:
            gain += _log_sum_over(r, a_i, a_j) - r
    value = stride * gain - n * math.log(max(count, 1.0)) + act_i * odds_i + act_j * odds_j
    for d in range(dim):
        value -= 0.5 * pp * (act_i * mean_i[d] * mean_i[d] + act_j * mean_j[d] * mean_j[d])
    return value + 0.5 * dim * (_LOG_2PI - math.log(prec_i) + _LOG_2PI - math.log(prec_j))


@_compiled
def _add_candidate(
    slot, act_i, act_j, start_i, start_j, points, rest, stride, rest_count, pp, odds_i, odds_j, steps,
    c_bits, c_mean, c_log_sd, c_log_w, acc_i, acc_j,
):  # fmt: skip
    """Refine one candidate from its starting means and write it (bits, means, log sd, unnormalized log weight)."""
    dim = points.shape[1]
    mean_i = c_mean[slot, :dim]
    mean_j = c_mean[slot, dim:]
    for d in range(dim):
        mean_i[d] = start_i[d] if act_i else 0.0
        mean_j[d] = start_j[d] if act_j else 0.0
    prec_i, prec_j = _refine_pair(points, rest, stride, act_i, act_j, mean_i, mean_j, steps, pp, acc_i, acc_j)
    c_bits[slot, 0] = act_i
    c_bits[slot, 1] = act_j
    c_log_sd[slot, 0] = -0.5 * math.log(prec_i)
    c_log_sd[slot, 1] = -0.5 * math.log(prec_j)
    mass = _laplace_mass(
        points, rest, stride, rest_count, act_i, act_j, mean_i, mean_j, pp, odds_i, odds_j, prec_i, prec_j
    )
    c_log_w[slot] = mass if mass == mass else -math.inf


@_compiled
def _mirror_candidate(source, slot, dim, odds_i, odds_j, c_bits, c_mean, c_log_sd, c_log_w):
    """Candidate ``slot``: candidate ``source`` (the first mean active, the second not) with the means swapped.

    From the same location the EM steps and the points' part of the Laplace mass are the same for either mean
    (the pair's terms enter them symmetrically); only the active bit's prior log odds differ.
    """
    c_bits[slot, 0], c_bits[slot, 1] = c_bits[source, 1], c_bits[source, 0]
    for d in range(dim):
        c_mean[slot, d], c_mean[slot, dim + d] = c_mean[source, dim + d], c_mean[source, d]
    c_log_sd[slot, 0], c_log_sd[slot, 1] = c_log_sd[source, 1], c_log_sd[source, 0]
    c_log_w[slot] = c_log_w[source] - odds_i + odds_j if c_log_w[source] > -math.inf else -math.inf


@_compiled
def _split_starts(points, rest, stride, center, start_i, start_j):
    """A split's starting means: ``center`` plus and minus the principal half-spread of the points it explains.

    The points (every ``stride``-th) are weighted by the responsibility of a mean at ``center`` against ``rest``;
    the half-spread is ``sqrt(2 lambda / pi)`` along the leading eigenvector (``lambda`` its eigenvalue, by power
    iteration from the coordinate axis of the covariance's longest column): the means of a Gaussian's two halves.
    Returns False where the mean explains no point.
    """
    n, dim = points.shape
    weight = 0.0
    cov = np.zeros((dim, dim))
    for j in range(0, n, stride):
        a = _half_sq_distance(points[j], center)
        r = rest[j]
        if r > -math.inf and a < r - _NEGLIGIBLE:
            continue
        resp = 1.0 / (1.0 + math.exp(r - a)) if r > -math.inf else 1.0
        weight += resp
        for d in range(dim):
            for e in range(dim):
                cov[d, e] += resp * (points[j, d] - center[d]) * (points[j, e] - center[e])
    if not weight > 0.0:
        return False
    axis = np.zeros(dim)  # the longest column's axis: in 2 D never orthogonal to the leading eigenvector (if unequal)
    longest, top = 0, -1.0
    for e in range(dim):
        size = 0.0
        for d in range(dim):
            size += cov[d, e] * cov[d, e]
        if size > top:
            longest, top = e, size
    axis[longest] = 1.0
    nxt = np.empty(dim)
    value = 0.0
    for _ in range(20):
        value = 0.0
        for d in range(dim):
            acc = 0.0
            for e in range(dim):
                acc += cov[d, e] * axis[e]
            nxt[d] = acc / weight
            value += nxt[d] * nxt[d]
        value = math.sqrt(value)
        if not value > 0.0:
            return False
        for d in range(dim):
            axis[d] = nxt[d] / value
    half = math.sqrt(2.0 * value / math.pi)
    for d in range(dim):
        start_i[d] = center[d] + half * axis[d]
        start_j[d] = center[d] - half * axis[d]
    return True


@_compiled
def _mirror_split(source, slot, dim, c_bits, c_mean, c_log_sd, c_log_w):
    """Candidate ``slot``: the both-active candidate ``source`` with its means swapped (the same mass)."""
    c_bits[slot, 0], c_bits[slot, 1] = c_bits[source, 0], c_bits[source, 1]
    for d in range(dim):
        c_mean[slot, d], c_mean[slot, dim + d] = c_mean[source, dim + d], c_mean[source, d]
    c_log_sd[slot, 0], c_log_sd[slot, 1] = c_log_sd[source, 1], c_log_sd[source, 0]
    c_log_w[slot] = c_log_w[source]


@_compiled
def _build_candidates(
    points, rest, stride, rest_count, odds_i, odds_j, pp, log_w, loc, others, n_others, min_log_w, merge2, steps,
    max_copies, max_splits, c_bits, c_mean, c_log_sd, c_log_w, acc_i, acc_j,
):  # fmt: skip
    """A pair's candidates (:class:`CandidateOptions`) into the ``c_*`` arrays; returns their number."""
    dim = points.shape[1]
    n_comp = log_w.shape[0]
    top = 0
    for c in range(n_comp):
        if log_w[c] > log_w[top]:
            top = c
    kept = np.empty(n_comp, dtype=np.int64)
    n_kept = 0
    for c in range(n_comp):
        if log_w[c] >= min_log_w or c == top:
            kept[n_kept] = c
            n_kept += 1
    copies = np.empty(n_others, dtype=np.int64)
    n_copies = 0
    for o in range(n_others):
        distinct = True
        for q in range(n_copies):
            s = 0.0
            for d in range(dim):
                diff = others[o, d] - others[copies[q], d]
                s += diff * diff
            if s < merge2:
                distinct = False
                break
        if distinct and n_copies < max_copies:
            copies[n_copies] = o
            n_copies += 1
    zero = np.zeros(dim)
    args = (
        points,
        rest,
        stride,
        rest_count,
        pp,
        odds_i,
        odds_j,
        steps,
        c_bits,
        c_mean,
        c_log_sd,
        c_log_w,
        acc_i,
        acc_j,
    )
    slot = 0
    _add_candidate(slot, 0, 0, zero, zero, *args)
    slot += 1
    single = n_kept + n_copies
    for t in range(single):  # the first mean active: from each of its locations
        start = loc[kept[t], :dim] if t < n_kept else others[copies[t - n_kept]]
        _add_candidate(slot + t, 1, 0, start, start, *args)
    for t in range(single):  # the second: from each of its locations
        if t < n_kept:
            _add_candidate(slot + single + t, 0, 1, loc[kept[t], dim:], loc[kept[t], dim:], *args)
        elif not (math.isfinite(odds_i) and math.isfinite(odds_j)):  # (0 * inf: each pattern's mass its own way)
            _add_candidate(slot + single + t, 0, 1, others[copies[t - n_kept]], others[copies[t - n_kept]], *args)
        else:  # a copy's location is both means': the first's candidate, mirrored
            _mirror_candidate(slot + t, slot + single + t, dim, odds_i, odds_j, c_bits, c_mean, c_log_sd, c_log_w)
    slot += 2 * single
    for t in range(n_kept):  # both active: each kept component's pair of means
        _add_candidate(slot, 1, 1, loc[kept[t], :dim], loc[kept[t], dim:], *args)
        slot += 1
    for t in range(n_copies):  # and each copy beside the heaviest component's other mean
        _add_candidate(slot, 1, 1, others[copies[t]], loc[top, dim:], *args)
        _add_candidate(slot + 1, 1, 1, loc[top, :dim], others[copies[t]], *args)
        slot += 2
    done = np.zeros(single, dtype=np.bool_)  # splits: from the first mean's refined locations of the largest masses
    start_i = np.empty(dim)
    start_j = np.empty(dim)
    for _ in range(min(max_splits, single)):
        pick = -1
        for t in range(single):
            if not done[t] and c_log_w[1 + t] > -math.inf and (pick < 0 or c_log_w[1 + t] > c_log_w[1 + pick]):
                pick = t
        if pick < 0:
            break
        done[pick] = True
        if _split_starts(points, rest, stride, c_mean[1 + pick, :dim], start_i, start_j):
            _add_candidate(slot, 1, 1, start_i, start_j, *args)
            _mirror_split(slot, slot + 1, dim, c_bits, c_mean, c_log_sd, c_log_w)
            slot += 2
    best = -math.inf
    for c in range(slot):
        best = max(best, c_log_w[c])
    acc = 0.0
    for c in range(slot):
        acc += math.exp(c_log_w[c] - best)
    norm = best + math.log(acc)
    for c in range(slot):
        c_log_w[c] -= norm
    return slot


@_compiled
def _log_q_candidates(value, c_bits, c_mean, c_log_sd, c_log_w, count, dim):
    """log q_cand(value) of the first ``count`` candidates (those of the value's activity pattern)."""
    best = -math.inf
    comp = np.empty(count)
    for c in range(count):
        comp[c] = -math.inf
        if c_bits[c, 0] != value[dim] or c_bits[c, 1] != value[2 * dim + 1]:
            continue
        s = 0.0
        for h in range(2):
            ls = c_log_sd[c, h]
            for d in range(dim):
                z = (value[h * (dim + 1) + d] - c_mean[c, h * dim + d]) * math.exp(-ls)
                s += -0.5 * z * z - ls - 0.5 * _LOG_2PI
        comp[c] = s + c_log_w[c]
        best = max(best, comp[c])
    if best == -math.inf:
        return -math.inf
    acc = 0.0
    for c in range(count):
        acc += math.exp(comp[c] - best)
    return best + math.log(acc)


@_compiled
def _screen_log(block, dim, sigma, radius2, log_attempt):
    """``log s`` of a pair's block ``(mu_i, v_i, mu_j, v_j)`` (:class:`PairScreen`): ``log_attempt`` or 0."""
    if block[dim] > 0.5 and block[2 * dim + 1] > 0.5:
        s = 0.0
        for d in range(dim):
            diff = (block[d] - block[dim + 1 + d]) / sigma
            s += diff * diff
        if s > radius2:
            return log_attempt
    return 0.0


@_compiled
def _mixture_pairs(
    state, slots, valid, decide, mean_ids, active_ids, pairs, block_ids, points, center, sigma, tau, log_odds, psi,
    phi1_w, phi1_b, phi2_w, phi2_b, score_w, score_b, trunk_w0, trunk_b0, trunk_w1, trunk_b1, layers,
    mix_w, mix_b, disc_w, disc_b, loc_w, loc_b, scale_w, scale_b, groups, comp_u, bit_u, normals, log_u, beta,
    use_cand, net_share, min_log_w, merge2, em_steps, max_points, max_copies, max_splits, choice, reuse, cache,
    use_screen, radius2, log_attempt, screen_u, screened,
    accepted, nonfinite, log_alpha_out, proposed_out, computed,
):  # fmt: skip
    chains, width = slots.shape
    n, dim = points.shape
    m = mean_ids.shape[0]
    b_size = 2 * dim + 2
    hidden = phi2_b.shape[0]
    heads = score_b.shape[0]
    n_feat = dim + 3
    n_comp = mix_b.shape[0]
    n_cont = 2 * dim
    head_size = 9 + 3 * dim
    pooled_size = hidden + 1 + heads * (hidden + n_feat)
    cont_pos = np.empty(n_cont, dtype=np.int64)
    for i in range(dim):
        cont_pos[i] = i
        cont_pos[dim + i] = dim + 1 + i
    disc_pos = np.array([dim, 2 * dim + 1], dtype=np.int64)
    loc_vec = np.zeros(b_size)
    scale_vec = np.ones(b_size)
    for i in range(dim):
        loc_vec[i] = center[i]
        loc_vec[dim + 1 + i] = center[i]
        scale_vec[i] = sigma
        scale_vec[dim + 1 + i] = sigma
    terms = np.empty((n, m))
    sums = PointSums(  # per point: the log-sums of every mixture's terms, for every pair's rest (_rest_log_sum)
        np.empty(n), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n), np.empty(n), np.empty(n),
        np.empty(n),
    )  # fmt: skip
    scratch32 = np.empty(n, dtype=np.float32)  # _exp32's arguments over the points (its values: exp32)
    exp32 = np.empty(n, dtype=np.float32)
    powers32 = np.empty(n, dtype=np.int32)
    anchor_w = np.empty(n)
    anchor_d2 = np.empty(n)
    token_base = np.empty((n, hidden), dtype=np.float32)  # the first token layer's part that no pair changes
    for j in range(n):
        for h in range(hidden):
            token_base[j, h] = phi1_b[h]
        for d in range(dim):
            u = np.float32(_clip(points[j, d] / _COORD_SCALE))
            for h in range(hidden):
                token_base[j, h] += u * phi1_w[d, h]
        for h in range(hidden):
            token_base[j, h] += phi1_w[dim + 2, h]
    u_means = np.empty((m, dim))
    bits = np.empty(m)
    rest = np.empty(n)
    explained = np.empty(n)
    poorly = np.empty(n)
    key = np.empty(n)
    tokens = np.empty((n, n_feat), dtype=np.float32)
    slot_of = np.empty(n, dtype=np.int64)  # each point's cache slot of its token this pair
    missed_points = np.empty(n, dtype=np.int64)  # the points whose token this pair is new, and its cache slot
    missed_slots = np.empty(n, dtype=np.int64)
    block_h1 = np.zeros((hidden, _TOKEN_BLOCK), dtype=np.float32)  # _token_outputs' scratch
    block_h2 = np.zeros((hidden, _TOKEN_BLOCK), dtype=np.float32)
    block_scores = np.zeros((heads, _TOKEN_BLOCK), dtype=np.float32)
    sum_phi = np.empty(hidden, dtype=np.float32)
    known, cached_phi, cached_scores, last_used, clock_box = cache  # the token cache (TokenCache), kept across calls
    clock = clock_box[0]
    x0 = np.empty(head_size + pooled_size, dtype=np.float32)
    width0 = trunk_b0.shape[0]
    width1 = trunk_b1.shape[0]
    x1 = np.empty(width0, dtype=np.float32)
    x2 = np.empty(width1, dtype=np.float32)
    silu_work = np.empty(max(_TOKEN_BLOCK, width0, width1), dtype=np.float32)
    silu_powers = np.empty(silu_work.shape[0], dtype=np.int32)
    mix = np.empty(n_comp, dtype=np.float32)
    disc = np.empty(n_comp * 4, dtype=np.float32)
    locs = np.empty(n_comp * n_cont, dtype=np.float32)
    raw_scales = np.empty(scale_b.shape[0], dtype=np.float32)
    n_groups = scale_b.shape[0] // n_comp
    log_w = np.empty(n_comp)
    disc_logp = np.empty((n_comp, 2, 2))
    loc = np.empty((n_comp, n_cont))
    log_scale = np.empty((n_comp, n_cont))
    u_new = np.empty(b_size)
    u_cur = np.empty(b_size)
    current = np.empty(b_size)
    proposed = np.empty(b_size)
    stored = np.empty(b_size, dtype=state.dtype)
    anchor_weight = np.empty(n)
    anchor_key = np.empty(n)
    pp = (sigma / tau) ** 2  # the means' prior precision, whitened
    stride = max(1, -(-n // max_points))  # the candidates read every stride-th point
    others = np.empty((m, dim))
    most = _most_candidates(n_comp, m, max_splits)
    c_bits = np.empty((most, 2), dtype=np.int64)
    c_mean = np.empty((most, 2 * dim))
    c_log_sd = np.empty((most, 2))
    c_log_w = np.empty(most)
    acc_i = np.empty(dim)
    acc_j = np.empty(dim)
    u_fwd = np.empty(b_size)
    log_share = math.log(net_share) if use_cand else 0.0
    log_rest = math.log1p(-net_share) if use_cand else 0.0
    # A pair's proposal (network and candidates) is a function of its conditioning set: the other mixtures' active
    # means and bits (inactive means enter nothing). Pairs with the same active members (none, or one mixture)
    # share it, so it is kept per key (m: no active member; i: mixture i alone) until an accepted move changes an
    # active mixture. The kept numbers are the ones the pair would compute (the same sums in the same order).
    for mixture in range(m):  # (the candidates read the pair's bits' log odds: reused only when all are equal)
        if use_cand and log_odds[mixture] != log_odds[0]:
            reuse = False
    kept_ok = np.zeros(m + 1, dtype=np.bool_)
    kept_log_w = np.empty((m + 1, n_comp))
    kept_disc = np.empty((m + 1, n_comp, 2, 2))
    kept_loc = np.empty((m + 1, n_comp, n_cont))
    kept_log_scale = np.empty((m + 1, n_comp, n_cont))
    kept_count = np.zeros(m + 1, dtype=np.int64)
    kept_c_bits = np.empty((m + 1, most, 2), dtype=np.int64)
    kept_c_mean = np.empty((m + 1, most, 2 * dim))
    kept_c_log_sd = np.empty((m + 1, most, 2))
    kept_c_log_w = np.empty((m + 1, most))
    for k in range(chains):
        for mixture in range(m):
            _read_mixture(state[k], mixture, mean_ids, active_ids, center, sigma, points, bits, u_means, terms)
        grand = _point_sums(terms, sums)  # the sum over the points of their log-sums: the current pair's energy
        kept_ok[:] = False
        for s_ in range(width):
            if not valid[k, s_]:
                continue
            p = slots[k, s_]
            pi, pj = pairs[p, 0], pairs[p, 1]
            for i in range(b_size):
                current[i] = state[k, block_ids[p, i]]
            log_s = _screen_log(current, dim, sigma, radius2, log_attempt) if use_screen else 0.0
            if log_s < 0.0 and screen_u[k, s_] >= math.exp(log_s):  # not attempted: the chain stays at S
                screened[k] += 1
                log_alpha_out[k, s_] = -math.inf
                continue
            shared = -1  # the key of the pair's conditioning set (bits exactly 0 or 1, as the sweeps write them)
            if reuse and bits[pi] == 0.0 and bits[pj] == 0.0:
                shared = m
            elif reuse and bits[pi] == 1.0 and bits[pj] == 0.0:
                shared = pi
            elif reuse and bits[pi] == 0.0 and bits[pj] == 1.0:
                shared = pj
            # -- the other mixtures: their share of every point's factor and their number
            rest_count = 0.0
            for mixture in range(m):
                if mixture != pi and mixture != pj:
                    rest_count += bits[mixture]
            for j in range(n):  # every point's log-sum without the pair, from its sums (no loop over the mixtures)
                share_i = math.exp(terms[j, pi] - sums.top[j]) if bits[pi] > 0 else 0.0
                share_j = math.exp(terms[j, pj] - sums.top[j]) if bits[pj] > 0 else 0.0
                rest[j] = _rest_log_sum(sums, terms[j], j, pi, pj, share_i, share_j)
            n_cand = 0
            if shared >= 0 and kept_ok[shared]:  # the conditioning set of a pair computed since the last change
                log_w[:] = kept_log_w[shared]
                disc_logp[:] = kept_disc[shared]
                loc[:] = kept_loc[shared]
                log_scale[:] = kept_log_scale[shared]
                n_cand = kept_count[shared]
                c_bits[:n_cand] = kept_c_bits[shared, :n_cand]
                c_mean[:n_cand] = kept_c_mean[shared, :n_cand]
                c_log_sd[:n_cand] = kept_c_log_sd[shared, :n_cand]
                c_log_w[:n_cand] = kept_c_log_w[shared, :n_cand]
            else:
                # -- features (GmmPairSetMotif.features): the head, then one token per point
                for j in range(n):
                    explained[j] = max(rest[j], _EXPLAINED_FLOOR)
                    key[j] = explained[j]
                    scratch32[j] = explained[j] - _POORLY_EXPLAINED
                _exp32(scratch32, exp32, powers32, np.float32(1.0))
                mass = 0.0
                for j in range(n):
                    poorly[j] = 1.0 / (1.0 + exp32[j])
                    mass += poorly[j]
                x0[0] = _clip(psi[0])
                x0[1] = _clip(psi[1])
                x0[2] = _clip(math.log1p(rest_count))
                x0[3] = _clip(math.log(max(n, 1.0) / _POINTS_SCALE))
                x0[4] = _clip(math.log1p(mass))
                for d in range(dim):
                    acc = 0.0
                    for j in range(n):
                        acc += poorly[j] * points[j, d]
                    x0[5 + d] = _clip(acc / max(mass, 1e-6) / _COORD_SCALE)
                c1, mass1, spread1 = _anchor(points, poorly, key, dim, anchor_w, anchor_d2, scratch32, exp32, powers32)
                for j in range(n):
                    s = 0.0
                    for d in range(dim):
                        diff = points[j, d] - c1[d]
                        s += diff * diff
                    scratch32[j] = s * (-0.5 / (_ANCHOR_RADIUS * _ANCHOR_RADIUS))
                _exp32(scratch32, exp32, powers32, np.float32(1.0))
                for j in range(n):
                    taken = float(exp32[j])
                    anchor_weight[j] = poorly[j] * (1.0 - taken)
                    anchor_key[j] = key[j] + 1e3 * taken
                c2, mass2, spread2 = _anchor(
                    points, anchor_weight, anchor_key, dim, anchor_w, anchor_d2, scratch32, exp32, powers32
                )
                at = 5 + dim
                for d in range(dim):
                    x0[at + d] = _clip(c1[d] / _COORD_SCALE)
                x0[at + dim] = _clip(math.log1p(mass1))
                x0[at + dim + 1] = _clip(spread1)
                at += dim + 2
                for d in range(dim):
                    x0[at + d] = _clip(c2[d] / _COORD_SCALE)
                x0[at + dim] = _clip(math.log1p(mass2))
                x0[at + dim + 1] = _clip(spread2)
                for j in range(n):
                    for d in range(dim):
                        tokens[j, d] = _clip(points[j, d] / _COORD_SCALE)
                    tokens[j, dim] = _clip(explained[j] / 10.0)
                    tokens[j, dim + 1] = _clip(poorly[j])
                    tokens[j, dim + 2] = 1.0
                # -- set encoder: phi of every token, its mean, attention pooling per head
                clock += 1
                missed = np.int64(0)  # (an int64 from the start: a literal 0 made Numba compile the callee twice)
                for j in range(n):
                    # phi and scores are a pure function of the token: reuse them for a token met before (bitwise)
                    slot = -1
                    for c in range(_TOKEN_SLOTS):
                        if tokens[j, dim] == known[j, c, 0] and tokens[j, dim + 1] == known[j, c, 1]:
                            slot = c
                            break
                    if slot < 0:  # a new token: its outputs are computed below, with the others'
                        slot = 0
                        for c in range(1, _TOKEN_SLOTS):
                            if last_used[j, c] < last_used[j, slot]:
                                slot = c
                        known[j, slot, 0], known[j, slot, 1] = tokens[j, dim], tokens[j, dim + 1]
                        missed_points[missed], missed_slots[missed] = j, slot
                        missed += 1
                    last_used[j, slot] = clock
                    slot_of[j] = slot
                _token_outputs(
                    missed_points, missed_slots, missed, tokens, token_base, phi1_w, phi2_w, phi2_b, score_w, score_b,
                    cached_phi, cached_scores, block_h1, block_h2, block_scores, silu_work, silu_powers,
                )  # fmt: skip
                base = head_size
                sum_phi[:] = 0.0
                for j in range(n):  # (each sum in point order)
                    phi_j = cached_phi[j, slot_of[j]]
                    for h in range(hidden):
                        sum_phi[h] += phi_j[h]
                for h in range(hidden):
                    x0[base + h] = sum_phi[h] / np.float32(max(n, 1))
                x0[base + hidden] = math.log1p(n)
                base += hidden + 1
                for a in range(heads):
                    top32 = -np.inf
                    for j in range(n):
                        top32 = max(top32, cached_scores[j, slot_of[j], a])
                    for j in range(n):
                        scratch32[j] = cached_scores[j, slot_of[j], a] - top32
                    _exp32(scratch32, exp32, powers32, np.float32(1.0))
                    total = 0.0
                    for j in range(n):
                        total += exp32[j]
                    for h in range(hidden + n_feat):
                        x0[base + h] = 0.0
                    for j in range(n):
                        weight = np.float32(exp32[j] / total)
                        phi_j = cached_phi[j, slot_of[j]]
                        for h in range(hidden):
                            x0[base + h] += weight * phi_j[h]
                        for f in range(n_feat):
                            x0[base + hidden + f] += weight * tokens[j, f]
                    base += hidden + n_feat
                # -- trunk and heads
                if layers == 0:
                    out = x0
                else:
                    _affine(x0, trunk_w0, trunk_b0, x1)
                    _silu(x1, silu_work, silu_powers)
                    out = x1
                    if layers == 2:
                        _affine(x1, trunk_w1, trunk_b1, x2)
                        _silu(x2, silu_work, silu_powers)
                        out = x2
                _affine(out, mix_w, mix_b, mix)
                _affine(out, disc_w, disc_b, disc)
                _affine(out, loc_w, loc_b, locs)
                _affine(out, scale_w, scale_b, raw_scales)
                top = -math.inf
                for c in range(n_comp):
                    top = max(top, float(mix[c]))
                acc = 0.0
                for c in range(n_comp):
                    acc += math.exp(mix[c] - top)
                for c in range(n_comp):
                    log_w[c] = mix[c] - top - math.log(acc)
                    for d in range(2):
                        a0, a1 = float(disc[(c * 2 + d) * 2]), float(disc[(c * 2 + d) * 2 + 1])
                        t = max(a0, a1)
                        norm = t + math.log(math.exp(a0 - t) + math.exp(a1 - t))
                        disc_logp[c, d, 0] = a0 - norm
                        disc_logp[c, d, 1] = a1 - norm
                    for i in range(n_cont):
                        loc[c, i] = locs[c * n_cont + i]
                        ls = float(raw_scales[c * n_groups + groups[i]])
                        log_scale[c, i] = min(max(ls, _MIN_LOG_SCALE), _MAX_LOG_SCALE)
                # -- the data-refined candidates (CandidateOptions), from the conditioning set alone
                if use_cand:
                    n_others = np.int64(0)
                    for mixture in range(m):
                        if mixture != pi and mixture != pj and bits[mixture] > 0:
                            for d in range(dim):
                                others[n_others, d] = u_means[mixture, d]
                            n_others += 1
                    n_cand = _build_candidates(
                        points, rest, stride, rest_count, log_odds[pi], log_odds[pj], pp, log_w, loc, others, n_others,
                        min_log_w, merge2, em_steps, max_copies, max_splits, c_bits, c_mean, c_log_sd, c_log_w, acc_i,
                        acc_j,
                    )  # fmt: skip
                computed[k] += 1
                if shared >= 0:
                    kept_ok[shared] = True
                    kept_log_w[shared] = log_w
                    kept_disc[shared] = disc_logp
                    kept_loc[shared] = loc
                    kept_log_scale[shared] = log_scale
                    kept_count[shared] = n_cand
                    kept_c_bits[shared, :n_cand] = c_bits[:n_cand]
                    kept_c_mean[shared, :n_cand] = c_mean[:n_cand]
                    kept_c_log_sd[shared, :n_cand] = c_log_sd[:n_cand]
                    kept_c_log_w[shared, :n_cand] = c_log_w[:n_cand]
            # -- a draw (BlockMixture.sample, or a candidate's) and both densities
            if not use_cand or choice[k, s_, 0] < net_share:
                best, comp = -math.inf, 0
                for c in range(n_comp):
                    g = log_w[c] - math.log(-math.log(max(comp_u[k, s_, c], _TINY32)))
                    if g > best:
                        best, comp = g, c
                for d in range(2):
                    best_v, pick = -math.inf, 0
                    for v in range(2):
                        g = disc_logp[comp, d, v] - math.log(-math.log(max(bit_u[k, s_, d, v], _TINY32)))
                        if g > best_v:
                            best_v, pick = g, v
                    u_new[disc_pos[d]] = pick
                for i in range(n_cont):
                    u_new[cont_pos[i]] = np.float32(loc[comp, i] + math.exp(log_scale[comp, i]) * normals[k, s_, i])
            else:
                pick = n_cand - 1
                total = 0.0
                for c in range(n_cand):
                    total += math.exp(c_log_w[c])
                    if choice[k, s_, 1] < total:
                        pick = c
                        break
                u_new[dim] = c_bits[pick, 0]
                u_new[2 * dim + 1] = c_bits[pick, 1]
                for h in range(2):
                    sd = math.exp(c_log_sd[pick, h])
                    for d in range(dim):
                        u_new[h * (dim + 1) + d] = c_mean[pick, h * dim + d] + sd * normals[k, s_, h * dim + d]
            for i in range(b_size):
                stored[i] = loc_vec[i] + scale_vec[i] * u_new[i]
                proposed[i] = stored[i]
                u_cur[i] = (current[i] - loc_vec[i]) / scale_vec[i]
            if use_cand:  # both densities at the blocks as stored
                for i in range(b_size):
                    u_fwd[i] = (proposed[i] - loc_vec[i]) / scale_vec[i]
                net_fwd = _log_q(u_fwd, log_w, disc_logp, loc, log_scale, cont_pos, disc_pos)
                net_rev = _log_q(u_cur, log_w, disc_logp, loc, log_scale, cont_pos, disc_pos)
                cand_fwd = _log_q_candidates(u_fwd, c_bits, c_mean, c_log_sd, c_log_w, n_cand, dim)
                cand_rev = _log_q_candidates(u_cur, c_bits, c_mean, c_log_sd, c_log_w, n_cand, dim)
                log_q_fwd = _logaddexp(log_share + net_fwd, log_rest + cand_fwd)
                log_q_rev = _logaddexp(log_share + net_rev, log_rest + cand_rev)
            else:
                log_q_fwd = _log_q(u_new, log_w, disc_logp, loc, log_scale, cont_pos, disc_pos)
                log_q_rev = _log_q(u_cur, log_w, disc_logp, loc, log_scale, cont_pos, disc_pos)
            odds_i, odds_j = log_odds[pi], log_odds[pj]
            change = _pair_energy(rest, rest_count, points, proposed, dim, center, sigma, tau, odds_i, odds_j)
            change -= _current_energy(grand, n, rest_count, current, dim, center, tau, odds_i, odds_j)
            ratio = beta[k] * change + log_q_rev - log_q_fwd
            if use_screen:  # the reverse move's attempt probability over this one's
                ratio += _screen_log(proposed, dim, sigma, radius2, log_attempt) - log_s
            log_alpha_out[k, s_] = ratio
            for i in range(b_size):
                proposed_out[k, s_, i] = proposed[i]
            if ratio != ratio or ratio == math.inf:
                nonfinite[k] += 1
                continue
            if not decide or not log_u[k, s_] < ratio:
                continue
            accepted[k] += 1
            if current[dim] > 0 or current[2 * dim + 1] > 0 or stored[dim] > 0 or stored[2 * dim + 1] > 0:
                kept_ok[:] = False  # an active mixture changed: every other pair's conditioning set may have
            for i in range(b_size):
                state[k, block_ids[p, i]] = stored[i]
            _read_mixture(state[k], pi, mean_ids, active_ids, center, sigma, points, bits, u_means, terms)
            _read_mixture(state[k], pj, mean_ids, active_ids, center, sigma, points, bits, u_means, terms)
            grand = _point_sums(terms, sums)  # summed afresh: no rounding carried from move to move
    clock_box[0] = clock


def _chain_counts(name: str, counts: np.ndarray | None, chains: int) -> np.ndarray:
    """A sweep's per-chain counter: ``counts`` checked as a ``[chains]`` int64 array, or a new one of zeros."""
    if counts is None:
        return np.zeros(chains, dtype=np.int64)
    if counts.shape != (chains,) or counts.dtype != np.int64:
        raise ValueError(f"{name} must be a [{chains}] int64 array, got {counts.shape} {counts.dtype}")
    return counts


def mixture_pair_sweep(
    state: np.ndarray,
    slots: np.ndarray,
    valid: np.ndarray,
    layout: Any,
    net: MixtureNetwork,
    draws: PairDraws,
    beta: np.ndarray | None = None,
    decide: bool = True,
    candidates: CandidateOptions | None = None,
    reuse: bool = True,
    computed: np.ndarray | None = None,
    cache: TokenCache | None = None,
    screen: PairScreen | None = None,
    screened: np.ndarray | None = None,
    constants: StepConstants | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pairs ``slots [K, W]`` of each chain in turn, in place: propose, test and (``decide``) write each move.

    Args:
        state: ``[K, N]`` float32 or float64 states (a NumPy view of the kernel's tensor), updated in place.
        slots: ``[K, W]`` (int64) the layout's pair rows each chain decides, in order; ``valid``: ``[K, W]`` (bool).
        layout: the group's :class:`~neuralblock.kernels.fused_mixture.MixtureLayout`.
        net: the proposal's :class:`MixtureNetwork`.
        draws: the :class:`PairDraws` of the ``K x W`` moves.
        beta: optional ``[K]`` inverse temperatures (float64).
        decide: ``False`` scores every move at the unchanged state (for tests) and writes nothing.
        candidates: mix data-refined candidates into each pair's proposal (``None``, or a model of fewer
            than ``candidates.min_points`` points: the network alone); needs ``draws.choice``.
        reuse: keep a pair's proposal for the later pairs with the same conditioning set (the same active
            members, none or one, and no change to an active mixture since; with candidates, all bits' prior
            odds equal). The
            numbers are the ones each pair would compute: ``False`` gives the same results, slower.
        computed: optional ``[K]`` int64 array, incremented by the proposals each chain computed (not reused).
        cache: the token network's outputs kept from earlier sweeps of this network on this model's points
            (:class:`TokenCache`, updated in place; ``None``: an empty one). It changes no number.
        screen: attempt far pairs of active mixtures less often (:class:`PairScreen`; ``None``: every pair);
            needs ``draws.screen``.
        screened: optional ``[K]`` int64 array, incremented by the pairs each chain did not attempt.
        constants: the layout's float64 :class:`~neuralblock.kernels.fused_mixture.StepConstants` (``None``: made
            here; a sweep object keeps them).

    Returns:
        Accepted moves per chain ``[K]``, non-finite ratios per chain ``[K]`` (rejected), and every move's log
        ratio ``[K, W]`` (``-inf`` where the screen skipped it) and proposed block ``[K, W, 2 D + 2]`` (float64;
        invalid and skipped slots unset).
    """
    chains, width = slots.shape
    dim = layout.values.shape[1]
    if candidates is not None:
        if draws.choice is None:
            raise ValueError("candidates need the draws' choice uniforms (draw_pairs makes them)")
        if not (
            0.0 < candidates.share < 1.0
            and candidates.em_steps >= 1
            and candidates.merge_distance >= 0.0
            and candidates.max_points >= 1
            and candidates.max_copies >= 0
            and candidates.splits >= 0
        ):
            raise ValueError(f"candidate options out of range: {candidates}")
        choice = draws.choice.to(torch.float64).contiguous().numpy()
        min_log_w = math.log(candidates.min_weight) if candidates.min_weight > 0 else -math.inf
        options: tuple[Any, ...] = (True, float(candidates.share), min_log_w, float(candidates.merge_distance) ** 2)
        options += (int(candidates.em_steps), int(candidates.max_points), int(candidates.max_copies))
        options += (int(candidates.splits), choice)
    if candidates is None or layout.values.shape[0] < candidates.min_points:
        options = (False, 0.5, 0.0, 0.0, 1, 1, 0, 0, np.zeros((1, 1, 2)))
    screening: tuple[Any, ...] = (False, 0.0, 0.0, np.zeros((1, 1)))
    if screen is not None:
        if draws.screen is None:
            raise ValueError("a screen needs the draws' screen uniforms (draw_pairs makes them)")
        if not (0.0 < screen.attempt <= 1.0 and 0.0 <= screen.radius < math.inf):
            raise ValueError(f"screen options out of range (attempt in (0, 1], radius finite, >= 0): {screen}")
        if draws.screen.shape != (chains, width):
            raise ValueError(f"the draws' screen uniforms must be [{chains}, {width}], got {list(draws.screen.shape)}")
        uniforms = draws.screen.to(torch.float64).contiguous().numpy()
        screening = (True, float(screen.radius) ** 2, math.log(screen.attempt), uniforms)
    screened = _chain_counts("screened", screened, chains)
    if constants is None:
        from neuralblock.kernels.fused_mixture import step_constants  # (that module imports this one)

        constants = step_constants(layout, torch.float64)  # whitened points, psi, bits' log odds, as the eager step
    elif constants.points.dtype != torch.float64 or constants.points.shape != layout.values.shape:
        raise ValueError(f"constants must be the layout's float64 ones ({list(layout.values.shape)} points), got "
                         f"{constants.points.dtype} {list(constants.points.shape)}")  # fmt: skip
    accepted = np.zeros(chains, dtype=np.int64)
    nonfinite = np.zeros(chains, dtype=np.int64)
    log_alpha = np.zeros((chains, width))
    proposed = np.zeros((chains, width, 2 * dim + 2))
    computed = _chain_counts("computed", computed, chains)
    hidden, heads = net.phi2_b.shape[0], net.score_b.shape[0]
    if cache is None:
        cache = TokenCache.empty(layout.values.shape[0], hidden, heads)
    elif not cache.fits(layout.values.shape[0], hidden, heads):
        raise ValueError(f"the token cache holds {cache.phi.shape} outputs, not {layout.values.shape[0]} points' "
                         f"{hidden} units and {heads} heads")  # fmt: skip
    layers = len(net.trunk_w)
    empty_w, empty_b = np.zeros((1, 1), np.float32), np.zeros(1, np.float32)
    trunk = [(net.trunk_w[i], net.trunk_b[i]) if i < layers else (empty_w, empty_b) for i in range(2)]
    _mixture_pairs(
        state, slots, valid, decide, layout.mean_ids.numpy(), layout.active_ids.numpy(), layout.pairs.numpy(),
        layout.block_ids.numpy(), constants.points.numpy(), constants.center.numpy(), float(layout.sigma),
        float(layout.tau), constants.log_odds.numpy(), constants.psi.numpy(), net.phi1_w, net.phi1_b, net.phi2_w,
        net.phi2_b, net.score_w, net.score_b,
        trunk[0][0], trunk[0][1], trunk[1][0], trunk[1][1], layers, net.mix_w, net.mix_b, net.disc_w, net.disc_b,
        net.loc_w, net.loc_b, net.scale_w, net.scale_b, net.groups, draws.components.numpy(), draws.bits.numpy(),
        draws.normals.numpy(), draws.log_u.numpy(), np.ones(chains) if beta is None else beta, *options, reuse,
        tuple(cache), *screening, screened, accepted, nonfinite, log_alpha, proposed, computed,
    )  # fmt: skip
    return accepted, nonfinite, log_alpha, proposed
