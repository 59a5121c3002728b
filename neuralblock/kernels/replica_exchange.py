"""Replica exchange (parallel tempering) over batched replicas of a discrete kernel.

``R`` replicas of the model at inverse temperatures ``1 = beta_1 > ... > beta_R`` (targets
``p(x)^beta``) run as one batched state, together with ``K`` independent ensembles
(``chains=K``): the inner kernel (single-site Gibbs, or neural blocks mixed with Gibbs) updates
all ``K * R`` states at once, each at its own temperature. After every sweep, neighbouring
replicas of each ensemble propose to swap states, alternating the even and the odd pairs
(the deterministic even-odd scheme), with the exact swap probability
``min(1, exp((beta_r - beta_{r+1}) (log p(x_{r+1}) - log p(x_r))))``. Every step leaves the
product of the tempered targets invariant, so the ``beta = 1`` replica samples ``p``; only it
is returned to Pyro.

During warmup the ladder adapts towards equal swap rates between all neighbours; ``T_1 = 1`` and
the hottest temperature stay fixed, and the adapted ladder is in ``diagnostics()``. By default
(``adaptation="barrier"``) the warmup runs in rounds that end at transitions ``W / 2^j`` (``W``
warmup transitions, rounds of at least 8), and after each round the ladder is set from that round's
swap rejection rates ``1 - A_r``: summed along the ladder they trace the communication barrier
``Lambda(beta)`` of non-reversible parallel tempering (Syed, Bouchard-Cote, Deligiannidis and
Doucet, JRSS-B 84, 2022), and the new inverse temperatures split it into equal parts.
``adaptation="vousden"`` takes small steps instead (Vousden, Farr and Mandel, MNRAS 455, 2016):
with ``T = 1 / beta`` and ``S_r = log(T_{r+1} - T_r)``, ``S_r += kappa(t) (A_r - A_{r+1})`` for the
running swap acceptance ``A`` of each pair, with ``kappa(t) = t0 / (nu (t + t0))``. On fresh 20x20
Ising tori with couplings up to 2, 5 and 10 (16 temperatures up to 10, 200 warmup transitions,
``benchmarks/ladder_adaptation.py``, medians of 3) the pairs' swap rates after warmup spanned
0.30-0.37, 0.24-0.49 and 0.33-0.51 with the rounds, and 0.16-0.51, 0.14-0.49 and 0.16-0.71 with the
small steps, which took 2000 warmup transitions to span 0.28-0.39, 0.23-0.36 and 0.34-0.51.

A neural inner kernel proposes, at every temperature that takes neural sweeps (see below), from a *tempered*
proposal (``tempered_proposals``, the default): the proposal raised to the power ``beta``. The log importance
weights of ``q^beta`` against a block's conditional under ``p^beta`` are ``beta`` times those of ``q`` under
``p``, so where ``q`` fits at ``beta = 1`` the powered proposal fits the hot conditionals as well or better,
while the untempered proposal is too sharp for them. The rows are computed at setup from the fully tabulated
proposal table and its block energies, with no network pass (one ``[rows, J]`` softmax per temperature), for
``tempered_tables=4`` temperatures spread along the initial ladder (``T = 1``, the hottest and two between);
a replica between two of them (the ladder moves in warmup) reads the hotter one's (flatter) rows and corrects
its MH ratio by ``(beta - beta_table) (E[j'] - E[j])`` with the untempered block energies, so MH stays exact
in warmup and after. Tables at 4 temperatures rather than every one: on fresh 10x10 Ising tori (generator
seed 4000, couplings up to 2, 5, 8 and 12; 4 seeds x 8 s CPU; 16 temperatures) the median time to mean
marginal error 0.05 was 0.11 / 0.12 / 0.11 / 0.12 s against 0.15 / 0.12 / 0.14 / 0.16 s with 8 and 0.17 /
0.18 / 0.20 / 0.27 s with every one, while the lowest block acceptance over the temperatures fell from
0.92-0.97 to 0.64-0.83 (``--re-tempered-tables`` of ``experiments/grid_study.py``; rows built after warmup
then). Rows from setup rather than after warmup (where the hot replicas took single-site sweeps while the
ladder adapted, and the first draw after warmup waited for the rows), with the hot replicas' starts drawn at
setup too (they were drawn at the first warmup transition): on fresh 10x10 tori (generator seed 5000,
couplings up to 5, 8, 12 and 15; 4 seeds x 4 s CPU, setup not counted) 200 warmup transitions took
0.034-0.043 s against 0.079-0.089 s (Gibbs replicas, whose starts moved too, 0.037-0.041 s against
0.066-0.074 s), and the median time to mean marginal error 0.05 was 0.10 / 0.65 / 0.27 / 1.38 s against 0.33
/ 0.79 / 0.67 / 2.24 s (Gibbs replicas 0.31 / 1.81 / 0.72 / 3.73 s; commit 2a285a0 against 1831c58). The
work moved into setup is about 0.03 s of starts and 0.02 s of rows on these grids, less than those gains.
The rows are built at setup where the neural replicas include the hottest (the default), whose temperature
stays fixed; with fewer (``neural_replicas``) their hottest may move in warmup, and the rows are built for
the fixed ladder. Where no rows can be built (a proposal off the fused path's dense, fully
tabulated table), only the ``warmup_neural_replicas`` coldest replicas (default: the ``T = 1`` ones, where
the untempered proposal fits) take neural sweeps while the ladder adapts, and every temperature the
untempered proposal after: with the
untempered proposal at every temperature in warmup the replicas ended it further from the target (on fresh
10x10 tori, couplings up to 5, 8 and 12, generator seed 4000, the median error of the first draw after warmup
was 0.29 / 0.41 / 0.58 against 0.07 / 0.05 / 0.04). After the model's parameters change (``update_graph``:
compound samplers) the replicas use the untempered proposal: in warmup only the ``warmup_neural_replicas``
coldest take neural sweeps, after it every neural one. Any proposal keeps MH exact; the block
acceptance per temperature and the sweeps that used the tempered rows are reported.

**One call per transition.** With the neural replicas taking the sweeps of one proposal on the compiled path
(a prefilled table, table factors), a neural transition runs the block sweep and the swaps in one compiled
call (:func:`~neuralblock.kernels.jit.replica_block_transition`), with the uniforms of the calls it replaces,
drawn in their order: the same chain, bit for bit. Where only the coldest replicas take neural sweeps (the
``T = 1`` ones on softened models, or ``neural_replicas``), the others' single-site sweep comes first, as in
the inner kernel's transition, and on softened models the swaps read the states' zero counts in the same call
(``benchmarks/replica_cost.py`` times it: with the starts and rows made at setup, a neural-replica transition
was 1.13x faster on ``Grids_12`` and 1.25x on ``Grids_16`` than at commit 1831c58; against the separate calls,
in alternating blocks of one process, 1.07x / 1.04x there and 1.02x on the softened BNs ``90-14-1`` and
``90-16-1``).

**Hard zeros.** A power ``p(x)^beta`` keeps every zero table entry (deterministic CPTs, hard
constraints), so hot replicas would be as stuck as the cold one. On such models the replicas at
``T > 1`` target the softened model ``p_L(x)^beta`` instead, whose zero entries have the
potential ``exp(-L)`` with ``L = zero_penalty T_R`` (so a zero costs the hottest replica
``zero_penalty`` nats; ``F``, the finite log table entries, and ``Z``, the number of zero entries,
come from :meth:`FactorGraph.split_zeros`), while the ``T = 1`` replica keeps ``p``. Swaps use each
replica's own target, so an impossible state never reaches the ``T = 1`` replica and the chain
stays exact. The first pair's swap rate is then at most the share of possible states in the
second replica, which does not rise as the gap closes, so the adaptation holds the first gap at
its initial value (equalizing rates would close it).

**Which replicas take neural sweeps** (``neural_replicas``): the ``m`` coldest take them (with
probability ``1 - gibbs_prob``) and the others take a single-site Gibbs sweep in the same transition;
tempered rows are built for the ``m`` coldest temperatures only. By default every replica takes them,
except on softened models, where only the ``T = 1`` replicas do: a proposal learned on the model's
zeros rarely proposes the states the softening opens (on the UAI 2008 grid BN 90-14-1, 16
temperatures, neural softened replicas put the first pair's swap rate at 0.04-0.07 against 0.09-0.12
with Gibbs there). Neural sweeps at the coldest quarter only were slower than at every temperature on
``Grids_14`` (3.9 against 1.3 s to mean marginal error 0.05, 3 seeds each).

Example:
    >>> import torch, pyro
    >>> from pyro.infer import MCMC
    >>> from neuralblock.io import read_uai, uai_grid
    >>> kernel = ReplicaExchange(read_uai(uai_grid("Grids_12")), replicas=4, chains=2)
    >>> mcmc = MCMC(kernel, num_samples=10, warmup_steps=10, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["x"].shape, len(kernel.diagnostics()["temperatures"])
    (torch.Size([10, 2, 100]), 4)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from neuralblock.graph import FactorGraph, TableGroup
from neuralblock.kernels.base import GraphKernel, find_valid_start, sequential_init
from neuralblock.kernels.fused_blocks import FusedBlockSweep
from neuralblock.kernels.gibbs import GibbsKernel, SoftZeros
from neuralblock.kernels.jit import NUMBA, TableLogJoint, replica_block_transition, timed_first_call
from neuralblock.kernels.jit import swap_replicas as swap_replicas_compiled
from neuralblock.kernels.neural_block import NeuralBlockKernel, RowPart
from neuralblock.kernels.vocabulary import KernelDiagnostics
from neuralblock.proposals import NeuralBlockProposal

__all__ = ["ReplicaExchange", "geometric_ladder", "swap_replicas"]

_RATE_SMOOTHING = 0.1  # running swap acceptance per pair (warmup adaptation)
_AUTO_ZERO_PENALTY = 0.5  # zero_penalty="auto": nats per zero table entry at the hottest replica
_MIN_GAP = 1e-3  # least gap between neighbouring temperatures (distinct float32 inverse temperatures)
_MIN_ROUND = 8  # barrier adaptation: the shortest round (transitions)
_MIN_REJECTION = 1e-3  # barrier adaptation: a pair's least rejection rate (keeps the barrier increasing)


_LadderTensors = tuple[Tensor, "Tensor | None", Tensor, Tensor, "Tensor | None", "Tensor | None"]
"""``ReplicaExchange._ladder_tensors``: betas, zeros' log-potentials, rows' replicas and betas, neural rows."""


def _pair_means(prob: np.ndarray) -> np.ndarray:
    """Each pair's mean swap probability over the ensembles, ``[P, K] -> [P]`` (NumPy's ``mean``, without its wrapper).

    Example:
        >>> _pair_means(np.array([[1.0, 0.5], [0.0, 0.25]])).tolist()
        [0.75, 0.125]
    """
    return np.add.reduce(prob, axis=-1) / prob.shape[-1]


def round_ends(warmup: int) -> frozenset[int]:
    """The warmup transitions after which the barrier adaptation sets a new ladder: ``warmup // 2^j``, at least 8.

    Example:
        >>> sorted(round_ends(200)), round_ends(7)
        ([12, 25, 50, 100, 200], frozenset())
    """
    ends, end = set(), warmup
    while end >= _MIN_ROUND:
        ends.add(end)
        end //= 2
    return frozenset(ends)


def geometric_ladder(replicas: int, max_temperature: float) -> Tensor:
    """Temperatures ``1 = T_1 < ... < T_R = max_temperature``, geometrically spaced (float64).

    Example:
        >>> geometric_ladder(3, 4.0).tolist()
        [1.0, 2.0, 4.0]
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if replicas == 1:
        return torch.ones(1, dtype=torch.float64)
    return torch.logspace(0.0, math.log10(max_temperature), replicas, dtype=torch.float64)


def _acceptance(delta: np.ndarray) -> np.ndarray:
    """Swap acceptance probabilities ``exp(min(delta, 0))`` from the log ratios (NumPy's ``exp``: both swap paths).

    Example:
        >>> _acceptance(np.array([[0.5, -math.inf]])).tolist()
        [[1.0, 0.0]]
    """
    return np.exp(np.minimum(delta, 0.0))


def swap_replicas(
    states: Tensor,
    log_p: Tensor,
    beta: Tensor,
    parity: int,
    zeros: Tensor | None = None,
    log_zero: Tensor | None = None,
    log_ratios: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Propose swaps of neighbouring replicas ``(r, r + 1)`` with ``r % 2 == parity``, for every ensemble.

    Args:
        states: ``[R, K, n]`` replica states of ``K`` ensembles.
        log_p: ``[R, K]`` untempered log densities of the states.
        beta: ``[R]`` inverse temperatures.
        parity: 0 for the pairs (1, 2), (3, 4), ... (0-based (0, 1), (2, 3), ...), 1 for the others.
        zeros: ``[R, K]`` the states' numbers of zero table entries; with it, ``log_p`` holds the
            finite parts ``F`` and replica ``r`` targets ``exp(beta_r (F + log_zero[r] Z))``.
        log_zero: ``[R]`` each replica's log-potential of a zero entry (``-inf``: the model itself).

        log_ratios: return each attempted pair's log acceptance ratio ``delta`` (NaN made ``-inf``) instead of its
            probability ``exp(min(delta, 0))``.

    Returns:
        The states and log densities after the swaps, and each attempted pair's acceptance
        probability ``[P, K]`` (pairs ``parity, parity + 2, ...``; ``log_ratios``: its log ratio).

    Example:
        >>> states = torch.tensor([[[0.0]], [[1.0]]])  # two replicas, one ensemble
        >>> new, log_p, prob = swap_replicas(states, torch.tensor([[-5.0], [0.0]]), torch.tensor([1.0, 0.5]), 0)
        >>> new.flatten().tolist(), prob.tolist()  # the colder replica takes the likelier state
        ([1.0, 0.0], [[1.0]])
    """
    replicas = states.shape[0]
    first = torch.arange(parity, replicas - 1, 2, device=states.device)
    if len(first) == 0:
        return states, log_p, log_p.new_zeros(0, log_p.shape[1])
    second = first + 1
    if zeros is None or log_zero is None:
        delta = (beta[first] - beta[second]).to(log_p.dtype)[:, None] * (log_p[second] - log_p[first])  # [P, K]
    else:  # replica r's log target at replica s's state (a state without zero entries: no -inf * 0)

        def target(r: Tensor, s: Tensor) -> Tensor:
            penalty = torch.where(zeros[s] > 0, log_zero[r].to(log_p.dtype)[:, None] * zeros[s], 0.0)
            return beta[r].to(log_p.dtype)[:, None] * (log_p[s] + penalty)

        delta = target(first, second) + target(second, first) - target(first, first) - target(second, second)
    delta = torch.nan_to_num(delta, nan=-math.inf)
    accept = torch.rand_like(delta).log() < delta
    order = torch.arange(replicas, device=states.device)[:, None].expand(replicas, states.shape[1]).clone()
    order[first] = torch.where(accept, second[:, None], first[:, None])
    order[second] = torch.where(accept, first[:, None], second[:, None])
    states = states.gather(0, order[..., None].expand_as(states))
    log_p = log_p.gather(0, order)
    return states, log_p, delta if log_ratios else delta.clamp(max=0.0).exp()


class ReplicaExchange(GraphKernel):
    """Parallel tempering with Gibbs or neural block replicas, batched over replicas and ensembles.

    Args:
        model: a :class:`FactorGraph` (or a Pyro model) with discrete latent variables only.
        proposals: neural block proposals for the replicas' inner kernel (``NeuralBlockKernel`` mixed
            with Gibbs at ``gibbs_prob``); ``None`` uses single-site Gibbs.
        replicas: the number of temperatures ``R``.
        max_temperature: the hottest temperature ``T_R`` of the initial geometric ladder.
        temperatures: an explicit initial ladder ``1 = T_1 < ... < T_R`` (overrides the two above).
        gibbs_prob: the neural inner kernel's single-site sweep probability (0.1: on the UAI Ising grids,
            replicas with more neural sweeps reached a given marginal error sooner than with 0.5).
        chains: independent ensembles ``K`` (each returns its ``beta = 1`` replica).
        adapt: adapt the ladder during warmup.
        adaptation: ``"barrier"`` (rounds that split the communication barrier evenly) or ``"vousden"``
            (small steps at every warmup transition); see above.
        adapt_nu: ``nu`` of the ``"vousden"`` adaptation rate ``kappa(t) = t0 / (nu (t + t0))``.
        adapt_t0: ``t0`` of the ``"vousden"`` adaptation rate.
        device: where states and tables live.
        compile: passed to the inner kernel.
        tempered_proposals: neural replicas propose from the proposal raised to their ``beta`` (rows built at
            setup, see above).
        zero_penalty: on models with zero table entries, the nats each zero costs the hottest replica
            (see "Hard zeros" above). ``"auto"``: 0.5 where the model has zeros and every update
            supports it (table factors, fused neural blocks with dense tables); ``None``: plain
            powers ``p(x)^beta``.
        cover: neural replicas update one cover of disjoint blocks per neural sweep (see
            :class:`NeuralBlockKernel`; on a grid, one tiling by 2x2 windows instead of all of them);
            ``"auto"``: where the proposal's path supports covers.
        neural_replicas: how many of the coldest replicas take neural sweeps (the others take a single-site
            sweep instead); ``None``: all; ``"auto"``: all, and only ``T = 1`` on softened models (see above).
        warmup_neural_replicas: how many of the coldest replicas take neural sweeps while the ladder adapts
            with ``tempered_proposals`` where no powered rows exist then (a proposal that is not fully tabulated;
            softened models, whose rows are built for the fixed ladder; see above; at most ``neural_replicas``'
            count); ``None``: as after warmup. Where rows are built at setup, every neural replica uses them.
        tempered_tables: build powered rows for this many of the neural replicas' temperatures only, spread along
            the ladder from ``T = 1`` to the hottest (see above; the initial ladder's temperatures where the rows
            are built at setup); the others read the rows of the next hotter one, their MH ratios corrected by their
            own ``beta``. ``None``: every temperature (on softened models always).

    Samples: the ``beta = 1`` replicas, laid out as :class:`GibbsKernel`'s with ``chains=K``.
    ``replica_states`` holds the last ``[R, K, n]`` replica states for diagnostics.
    """

    batched_state = True

    def __init__(
        self,
        model: FactorGraph | Callable,
        proposals: Sequence[NeuralBlockProposal] | None = None,
        replicas: int = 8,
        max_temperature: float = 10.0,
        temperatures: Sequence[float] | None = None,
        gibbs_prob: float = 0.1,
        chains: int = 1,
        adapt: bool = True,
        adaptation: str = "barrier",
        adapt_nu: float = 10.0,
        adapt_t0: float = 100.0,
        device: str | torch.device | None = None,
        compile: bool | str = "auto",
        tempered_proposals: bool = True,
        zero_penalty: float | str | None = "auto",
        cover: bool | str = "auto",
        neural_replicas: int | str | None = "auto",
        warmup_neural_replicas: int | None = 1,
        tempered_tables: int | None = 4,
    ) -> None:
        super().__init__(model, chains=chains, device=device)
        if zero_penalty is not None and zero_penalty != "auto":
            if isinstance(zero_penalty, bool) or not isinstance(zero_penalty, (int, float)):
                raise TypeError(f"zero_penalty must be a number, 'auto' or None, got {zero_penalty!r}")
            if not (math.isfinite(zero_penalty) and zero_penalty > 0):
                raise ValueError(f"zero_penalty must be a positive finite number, got {zero_penalty!r}")
        self.zero_penalty = zero_penalty
        self.penalty: float | None = None  # the penalty in use (set up per graph)
        self._split_graphs: tuple[FactorGraph, FactorGraph] | None = None  # (finite part, zero count)
        if temperatures is not None:
            ladder = torch.as_tensor(list(temperatures), dtype=torch.float64)
            if ladder.dim() != 1 or len(ladder) < 1 or not torch.isfinite(ladder).all():
                raise ValueError(f"temperatures must be a finite list, got {temperatures!r}")
            if ladder[0] != 1.0 or (ladder.diff() < _MIN_GAP).any():
                raise ValueError(
                    f"temperatures must start at 1 and increase by at least {_MIN_GAP} each, got {ladder.tolist()}"
                )
        else:
            if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
                raise ValueError(f"replicas must be a positive int, got {replicas!r}")
            if not (isinstance(max_temperature, (int, float)) and math.isfinite(max_temperature)):
                raise ValueError(f"max_temperature must be a finite number, got {max_temperature!r}")
            if replicas > 1 and max_temperature <= 1.0:
                raise ValueError(f"max_temperature must exceed 1 with several replicas, got {max_temperature}")
            ladder = geometric_ladder(replicas, float(max_temperature))
            if (ladder.diff() < _MIN_GAP).any():
                raise ValueError(
                    f"max_temperature {max_temperature} is too close to 1 for {replicas} replicas: neighbouring "
                    f"temperatures must differ by at least {_MIN_GAP}"
                )
        for name, value in (("adapt_nu", adapt_nu), ("adapt_t0", adapt_t0)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        self.temperatures = ladder
        self.replicas = len(ladder)
        self.proposals = None if proposals is None else list(proposals)
        self.gibbs_prob = gibbs_prob
        self.adapt = bool(adapt)
        self.adapt_nu, self.adapt_t0 = float(adapt_nu), float(adapt_t0)
        if adaptation not in ("barrier", "vousden"):
            raise ValueError(f"adaptation must be 'barrier' or 'vousden', got {adaptation!r}")
        self.adaptation = adaptation
        self.compile = compile
        self.tempered_proposals = bool(tempered_proposals)
        if (
            neural_replicas is not None
            and neural_replicas != "auto"
            and (isinstance(neural_replicas, bool) or not isinstance(neural_replicas, int) or neural_replicas < 1)
        ):
            raise ValueError(f"neural_replicas must be a positive int, 'auto' or None, got {neural_replicas!r}")
        self.neural_replicas = neural_replicas
        if warmup_neural_replicas is not None and (
            isinstance(warmup_neural_replicas, bool)
            or not isinstance(warmup_neural_replicas, int)
            or warmup_neural_replicas < 1
        ):
            raise ValueError(f"warmup_neural_replicas must be a positive int or None, got {warmup_neural_replicas!r}")
        self.warmup_neural_replicas = warmup_neural_replicas
        if tempered_tables is not None and (
            isinstance(tempered_tables, bool) or not isinstance(tempered_tables, int) or tempered_tables < 2
        ):
            raise ValueError(f"tempered_tables must be an int of at least 2 or None, got {tempered_tables!r}")
        self.tempered_tables = tempered_tables
        self._tempered: bool | None = None  # None: not tried yet for this ladder; then whether tables were built
        size = self.replicas * chains
        if self.proposals is None:
            self.inner: GibbsKernel | NeuralBlockKernel = GibbsKernel(
                model, chains=size, device=device, compile=compile
            )
        else:
            self.inner = NeuralBlockKernel(
                model, self.proposals, gibbs_prob=gibbs_prob, chains=size, device=device, compile=compile, cover=cover
            )
        self.replica_states: Tensor | None = None
        self._joints: tuple[TableLogJoint, TableLogJoint | None] | None = None  # compiled swaps' log joints
        self._ladder_cache: tuple[tuple, _LadderTensors] | None = None
        self._reset_stats()

    @property
    def betas(self) -> Tensor:
        """Inverse temperatures ``[R]`` (float64)."""
        return 1.0 / self.temperatures

    def _prepare(self, fg: FactorGraph) -> None:
        cards = fg.cardinalities[fg.latent]
        if (cards == 0).any():
            raise ValueError("ReplicaExchange samples discrete latent variables only; this model has continuous ones")
        self.inner.fg = fg
        self.inner._prepare(fg)
        plan = self.inner.plan if isinstance(self.inner, GibbsKernel) else self.inner.single_site.gibbs_plan
        if plan is not None and not (plan.jit and NUMBA):  # NumPy Gibbs sweeps measured 0.91-0.93x here (see
            plan.numpy = False  # gibbs.NUMPY_MAX_ENTRIES); the compiled loops 0.75-0.83x per RE
        self._soften(fg)
        self._compile_joints(fg)
        self.replica_states = None
        self._tempered = None
        self._swap_rate = np.full(max(self.replicas - 1, 0), 0.5)  # (NumPy float64: updated at every transition)

    def _soften(self, fg: FactorGraph) -> None:
        """Whether the hot replicas soften the model's zeros (see ``zero_penalty``), and at what penalty."""
        self.penalty, self._split_graphs = None, None
        self.inner.soft_zeros = None
        tables = [g for g in fg.groups if isinstance(g, TableGroup)]
        has_zeros = any(bool((g.log_tables == -math.inf).any()) for g in tables)
        if self.zero_penalty is None or self.replicas == 1 or not has_zeros:
            return
        explicit = self.zero_penalty != "auto"
        if len(tables) != len(fg.groups):
            if explicit:
                raise ValueError("zero_penalty softens table factors: this model has factors of other kinds")
            return
        if not self.inner.supports_soft_zeros():
            if explicit:
                raise ValueError(
                    "zero_penalty needs every neural proposal on the fused block path with a dense proposal table "
                    "and Gibbs on table factors for the single-site half"
                )
            return
        self.penalty = float(self.zero_penalty) if explicit else _AUTO_ZERO_PENALTY
        self._split_graphs = fg.split_zeros()

    def _compile_joints(self, fg: FactorGraph) -> None:
        """The swaps' log joints as compiled loops (CPU states, table factors, Numba installed), else ``None``."""
        self._joints = None
        if NUMBA and self.device.type == "cpu" and all(isinstance(g, TableGroup) for g in fg.groups) and fg.groups:
            finite, zeros = (fg, None) if self._split_graphs is None else self._split_graphs
            self._joints = (TableLogJoint(finite), None if zeros is None else TableLogJoint(zeros))

    def neural_count(self) -> int:
        """How many of the coldest replicas take neural sweeps (see ``neural_replicas``; all, with Gibbs replicas).

        Example:
            >>> from neuralblock.io import read_uai, uai_grid
            >>> ReplicaExchange(read_uai(uai_grid("Grids_12")), replicas=16).neural_count()
            16
        """
        if self.proposals is None or self.neural_replicas is None:
            return self.replicas
        if self.neural_replicas == "auto":
            return 1 if self.penalty is not None else self.replicas
        return min(int(self.neural_replicas), self.replicas)

    def _table_replicas(self) -> Tensor:
        """The replicas whose temperatures get powered rows: every neural one, or ``tempered_tables`` spread evenly
        along them from the coldest to the hottest (every one on softened models, whose rows are per temperature).

        Example:
            >>> from neuralblock.io import read_uai, uai_grid
            >>> kernel = ReplicaExchange(read_uai(uai_grid("Grids_12")), replicas=16, tempered_tables=4)
            >>> kernel._table_replicas().tolist()
            [0, 5, 10, 15]
        """
        neural = self.neural_count()
        if self.tempered_tables is None or self.penalty is not None or self.tempered_tables >= neural:
            return torch.arange(neural)
        return torch.linspace(0, neural - 1, self.tempered_tables, dtype=torch.float64).round().long().unique()

    def zero_log_potentials(self) -> Tensor | None:
        """Each replica's log-potential of a zero table entry, ``[R]`` (float64; ``-inf`` at ``T = 1``), or ``None``.

        Replica ``r`` targets ``exp(beta_r (F + log_zero[r] Z))``: every replica above ``T = 1``
        gives a zero the log-potential ``-zero_penalty T_R``, so a zero costs it
        ``zero_penalty T_R / T_r`` nats (``zero_penalty`` at the hottest).
        """
        if self.penalty is None:
            return None
        temps = self.temperatures
        return torch.where(temps > 1.0, -self.penalty * temps[-1], -math.inf)

    def _refresh(self, fg: FactorGraph) -> None:
        self.inner._refresh(fg)
        self._soften(fg)  # the new tables may gain or lose zeros
        self._compile_joints(fg)
        # new parameter values (a compound sampler changes them at every transition): R tempered tables per change
        # would cost more than they gain, so the replicas keep the untempered proposal from here on
        self._tempered = False

    def _reset_stats(self) -> None:
        pairs = max(self.replicas - 1, 0)
        self._swap_attempts = np.zeros(pairs)
        self._swap_accept = np.zeros(pairs)
        self._steps = 0
        self._adapt_steps = 0
        self._round_sum = np.zeros(pairs)  # barrier adaptation: the round's swap probabilities and attempts per pair
        self._round_count = np.zeros(pairs)
        self._round_ends = round_ends(self._warmup_steps)  # (setup sets the warmup length first)
        if hasattr(self, "inner"):
            self.inner._reset_stats()

    def _started(self, fg: FactorGraph, state: Tensor) -> None:
        """At setup (off the warmup's clock): the other replicas' starts, drawn right after the ``beta = 1`` ones, and
        the neural replicas' powered rows for the initial ladder (``tempered_proposals``).

        Inside a compound sampler (a model conditioned on other blocks, whose values move before the first
        transition) both wait for the first transition. The rows are built at setup only where the neural
        replicas include the hottest, whose temperature the adaptation keeps, so that no neural replica is ever
        hotter than every table (it would read the untempered rows); elsewhere (and on softened models, or where
        they cannot be built yet) they are built for the fixed ladder.
        """
        if self._conditioned is not None:
            return
        self.replica_states = self._start_replicas(state)
        if self.penalty is None and self.neural_count() == self.replicas:
            self._temper_rows(state.dtype, None)
            if not self._tempered:
                self._tempered = None  # (a table still filling as chains visit rows: tried again, for the fixed ladder)

    def _temper_rows(self, dtype: torch.dtype, log_zero: Tensor | None) -> None:
        """Build the powered rows of the table temperatures (:meth:`_table_replicas`) once, where they can be."""
        if self._tempered is None and self.tempered_proposals and isinstance(self.inner, NeuralBlockKernel):
            tables = self._table_replicas()  # rows for (some of) the temperatures whose replicas take neural sweeps
            self._tempered = self.inner.temper(
                self.betas[tables].to(dtype), None if log_zero is None else log_zero[tables]
            )

    def _start_replicas(self, state: Tensor) -> Tensor:
        """All replicas of every ensemble, ``[R, K, n]``: the given ``beta = 1`` states and fresh valid starts."""
        fg = self._graph()
        others = sequential_init(fg, chains=(self.replicas - 1) * self.chains) if self.replicas > 1 else None
        rows = [state.cpu()] + ([] if others is None else [others.reshape(self.replicas - 1, self.chains, -1)])
        replicas = torch.cat([rows[0].unsqueeze(0)] + rows[1:], 0)
        flat = find_valid_start(fg, replicas.reshape(-1, fg.num_variables))
        return flat.reshape(self.replicas, self.chains, -1).to(self.device)

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        fg = self._graph()
        if self.replica_states is None:
            self.replica_states = self._start_replicas(state)
        # Pyro's params are the beta = 1 replicas (a new tensor: Pyro keeps the beta = 1 replicas returned before)
        replicas = torch.cat((state.to(self.replica_states).unsqueeze(0), self.replica_states[1:]))
        size, n = self.replicas * self.chains, fg.num_variables
        beta, log_zero, index, row_beta, cold, warm = self._ladder_tensors(state.dtype)
        self.inner.soft_zeros = None if log_zero is None else SoftZeros(index, log_zero)
        fixed = not warmup or not self.adapt or self.replicas < 3
        if fixed:  # (softened models, or a kernel not set up: their rows are built here, for the fixed ladder)
            self._temper_rows(state.dtype, log_zero)
        if isinstance(self.inner, NeuralBlockKernel):  # the coldest replicas' chains take the neural sweeps
            self.inner.neural_rows = cold if fixed or not self.tempered_proposals or self._tempered else warm
        self.inner.beta = row_beta
        parity = self._steps % 2
        states, mean_prob = replicas.reshape(size, n), None
        one_call = self._one_call_sweep(states, log_zero)
        if one_call is None:
            flat = self.inner._transition(states, warmup)
        else:  # (mean_prob: the swaps of a neural sweep's one call)
            flat, mean_prob = self._one_call_transition(fg, *one_call, states, beta, log_zero, parity, warmup)
        replicas = flat.reshape(self.replicas, self.chains, n)
        if self.replicas > 1:
            if mean_prob is None and self._joints is not None and replicas.dtype in (torch.float32, torch.float64):
                # (in place: the inner kernel's states are new, not the caller's)
                replicas, mean_prob = self._swap_compiled(self._joints, replicas, beta, log_zero, parity)
            elif mean_prob is None:
                replicas, mean_prob = self._swap(fg, replicas, beta, log_zero, parity)
            # the running rates and counts of the pairs (parity, parity + 1), (parity + 2, ...): NumPy float64
            rate = self._swap_rate[parity::2]
            rate += _RATE_SMOOTHING * (mean_prob - rate)
            if not warmup:
                self._swap_attempts[parity::2] += 1.0
                self._swap_accept[parity::2] += mean_prob
            elif self.adapt and self.adaptation == "vousden":
                self._adapt_ladder()
            elif self.adapt:
                self._round_sum[parity::2] += mean_prob
                self._round_count[parity::2] += 1.0
                if self._t + 1 in self._round_ends:
                    self._barrier_ladder()
        self._steps += 1
        self.replica_states = replicas
        return replicas[0]

    def _one_call_sweep(
        self, states: Tensor, log_zero: Tensor | None
    ) -> tuple[FusedBlockSweep, tuple[RowPart, RowPart] | None] | None:
        """The fused block sweep a transition of ``states [R K, n]`` can run in one compiled call with its swaps
        (:func:`~neuralblock.kernels.jit.replica_block_transition`), and the inner kernel's split of the chains
        into those that take it and the others (``None``: all take it); else ``None``.

        That holds for neural replicas of one proposal on the compiled path with a prefilled table and compiled
        swaps, the chains that take the neural sweeps (:attr:`NeuralBlockKernel.neural_rows`) the coldest replicas'
        (the others' single-site sweep comes first, as in the inner kernel's transition). The inner kernel's block
        time (``updates_per_second``) then includes the swaps (not the others' single-site sweep).
        """
        inner = self.inner
        if (
            self.replicas < 2
            or not isinstance(inner, NeuralBlockKernel)
            or len(inner.fused) != 1
            or self._joints is None
            or (self._joints[1] is None) != (log_zero is None)
            or states.dtype not in (torch.float32, torch.float64)
        ):
            return None
        if inner.neural_rows is not None and inner.neural_rows.shape != states.shape[:1]:
            return None  # (the inner kernel's transition names the mismatch)
        split = None if inner.neural_rows is None else inner._split_rows(inner.neural_rows)
        if split is not None and (not len(split[0][0]) or not inner._rows_lead):  # (the coldest replicas' chains
            return None  # come first)
        fused = inner.fused[0]
        return (fused, split) if isinstance(fused, FusedBlockSweep) and fused.one_call(states) else None

    def _one_call_transition(
        self,
        fg: FactorGraph,
        fused: FusedBlockSweep,
        split: tuple[RowPart, RowPart] | None,
        states: Tensor,
        beta: Tensor,
        log_zero: Tensor | None,
        parity: int,
        warmup: bool,
    ) -> tuple[Tensor, np.ndarray | None]:
        """The inner kernel's transition of ``states``, and on a neural turn the swaps of ``parity`` in the same
        compiled call: the states after them (new) and each pair's mean swap acceptance (``None``: not swapped yet).
        ``split``: the chains that take the block sweep and the others (see :meth:`_one_call_sweep`).

        It draws from torch's RNG in the order of the calls it replaces (the turn, the hotter chains' single-site
        sweep, the block sweep's uniforms, the swap tests'), so its chains are theirs bit for bit; the inner kernel
        counts the sweeps as its own.
        """
        inner, joints = self.inner, self._joints
        if not isinstance(inner, NeuralBlockKernel) or joints is None:  # (_one_call_sweep found both)
            raise RuntimeError("the one-call transition needs neural replicas and compiled swaps")
        inner._calibrate_share(fg, states)
        if inner.single_site_turn():  # (as the inner kernel's transition: the turn first)
            return inner.single_site_transition(fg, states, warmup), None
        work, rows = states.clone(), None  # (updated in place through a NumPy view: the caller's tensor is never
        # written)
        neural_beta, neural_soft = inner.beta, inner.soft_zeros
        if split is not None:  # the hotter chains' single-site sweep first (as the inner kernel's)
            (rows, neural_beta, neural_soft), (single, single_beta, single_soft) = split
            if len(single):
                cut = len(rows)
                work[cut:] = inner.single_site_rows(fg, states[cut:], single_beta, single_soft, warmup, len(states))
        neural = len(work) if rows is None else len(rows)
        classes = inner.neural_classes(0)
        first, last = (0, len(fused.sizes)) if classes is None else classes
        start = time.perf_counter()
        draws, accept = fused.uniforms(neural, first, last, states.device)
        pairs = len(range(parity, self.replicas - 1, 2))
        log_u = torch.rand(pairs, self.chains, dtype=torch.float64).log_().numpy()
        soft = neural_soft if fused.table.has_zeros else None  # (as the fused sweep: zeros' potentials where zeros)
        index, slots, pair, tail, layout = fused.whole_arguments(states.dtype, neural_beta, soft, first, last)
        zero_logs = None if log_zero is None else log_zero.double().numpy()
        arguments = (*index, *pair, draws.numpy(), accept.log_().numpy(), *tail)
        (accepted, nonfinite, delta), seconds = timed_first_call(
            fused._jit_layouts, ("replica", log_zero is None, *layout), replica_block_transition,
            work.numpy(), arguments, joints[0], beta.double().numpy(), parity, log_u, neural, joints[1], zero_logs,
        )  # fmt: skip
        fused.compile_seconds += seconds
        inner.record_fused_sweep(
            0, torch.from_numpy(accepted), nonfinite, neural * slots, warmup, 0, rows, 0 if rows is None else len(work)
        )
        inner._transitions += 1
        if not warmup:
            inner._block_seconds += time.perf_counter() - start  # (with the swaps: they are the same call)
        return work, _pair_means(_acceptance(delta))

    def _ladder_tensors(self, dtype: torch.dtype) -> _LadderTensors:
        """``beta [R]``, the zeros' log-potentials ``[R]`` (or ``None``), each row's replica and ``beta`` ``[R K]``,
        and the rows of the replicas that take neural sweeps ``[R K]`` after warmup and while the ladder adapts
        (``warmup_neural_replicas``; bool, ``None``: all).

        Made again only when the ladder, the penalty or the dtype changes (the ladder moves in warmup only).
        """
        neural = self.neural_count()
        warmup = neural if self.warmup_neural_replicas is None else min(self.warmup_neural_replicas, neural)
        key = (self.temperatures, self.temperatures._version, self.penalty, dtype, neural, warmup)  # (_version:
        # in-place edits)
        cached = self._ladder_cache
        if cached is None or cached[0][0] is not key[0] or cached[0][1:] != key[1:]:
            beta = self.betas.to(self.device)
            if cached is not None and cached[0][3:] == key[3:]:  # the same rows, new temperatures (warmup)
                index, cold, warm = cached[1][2], cached[1][4], cached[1][5]
            else:
                index = torch.arange(self.replicas, device=self.device).repeat_interleave(self.chains)  # replica-major
                cold = None if neural == self.replicas else index < neural  # (None: every replica)
                warm = cold if warmup == neural else index < warmup
            row_beta = beta.repeat_interleave(self.chains).to(dtype)
            cached = (key, (beta, self.zero_log_potentials(), index, row_beta, cold, warm))
            self._ladder_cache = cached
        return cached[1]

    def _swap(
        self, fg: FactorGraph, replicas: Tensor, beta: Tensor, log_zero: Tensor | None, parity: int
    ) -> tuple[Tensor, np.ndarray]:
        """Swaps of the pairs of ``parity`` (torch): the replicas after them and each pair's mean acceptance."""
        size, n = self.replicas * self.chains, fg.num_variables
        flat_states = replicas.reshape(size, n).cpu()
        finite, zeros = (fg, None) if self._split_graphs is None else self._split_graphs
        # the states are the inner kernel's own (checked at the start): no validation per swap
        log_p = finite.log_joint(flat_states, check=False).reshape(self.replicas, self.chains)
        log_p = log_p.to(self.device).double()
        count = None if zeros is None else zeros.log_joint(flat_states, check=False).reshape(log_p.shape).to(log_p)
        on_device = None if log_zero is None else log_zero.to(self.device)
        replicas, _, delta = swap_replicas(replicas, log_p, beta, parity, count, on_device, log_ratios=True)
        return replicas, _pair_means(_acceptance(delta.double().cpu().numpy()))

    def _swap_compiled(
        self,
        joints: tuple[TableLogJoint, TableLogJoint | None],
        replicas: Tensor,
        beta: Tensor,
        log_zero: Tensor | None,
        parity: int,
    ) -> tuple[Tensor, np.ndarray]:
        """:meth:`_swap` through the compiled loops (:func:`~neuralblock.kernels.jit.swap_replicas`), in place.

        The log joints are added in float64 (see :class:`~neuralblock.kernels.jit.TableLogJoint`); the
        tests' uniforms are the torch path's stream, and the acceptance probabilities its arithmetic
        (:func:`_acceptance`).
        """
        finite, zeros = joints  # (the finite part and the zero count, see FactorGraph.split_zeros)
        work = replicas.numpy()
        flat = work.reshape(self.replicas * self.chains, -1)
        log_p = finite(flat).reshape(self.replicas, self.chains)
        count = None if zeros is None else zeros(flat).reshape(self.replicas, self.chains)
        pairs = len(range(parity, self.replicas - 1, 2))
        log_u = torch.rand(pairs, self.chains, dtype=torch.float64).log_().numpy()
        betas = beta.double().numpy()
        zero_logs = None if log_zero is None else log_zero.double().numpy()
        delta = swap_replicas_compiled(work, log_p, betas, parity, log_u, count, zero_logs)
        return replicas, _pair_means(_acceptance(delta))

    def _adapt_ladder(self) -> None:
        """One step of the Vousden-Farr-Mandel adaptation towards equal swap rates (``T_1``, ``T_R`` fixed).

        In NumPy float64 (a step runs at every warmup transition on ``R`` numbers: torch's calls would cost more).
        """
        if self.replicas < 3:
            return
        self._adapt_steps += 1
        kappa = self.adapt_t0 / (self.adapt_nu * (self._adapt_steps + self.adapt_t0))
        temps = self.temperatures.numpy()
        log_gaps = np.log(np.diff(temps))
        rate = np.asarray(self._swap_rate)
        step = kappa * (rate[:-1] - rate[1:])
        if self.penalty is not None:  # softened zeros: the first gap stays (see "Hard zeros" above)
            step[0] = 0.0
        log_gaps[:-1] += step
        gaps = np.maximum(np.exp(log_gaps), _MIN_GAP)
        held = 1 if self.penalty is not None else 0  # gaps not adapted
        span = float(temps[-1] - temps[0] - gaps[:held].sum())
        inner = gaps[held:-1].sum()
        if inner >= span:  # keep the hottest temperature: shrink the inner gaps to leave room for the last
            gaps[held:-1] *= 0.999 * span / float(inner)
        new = np.concatenate([temps[:1], temps[0] + np.cumsum(gaps[:-1]), temps[-1:]])
        if bool((np.diff(new) >= _MIN_GAP).all()):  # else skip the step: neighbours stay at least _MIN_GAP apart
            self.temperatures = torch.from_numpy(new)

    def _barrier_ladder(self) -> None:
        """A new ladder from the last round's swap rejection rates (Syed et al., JRSS-B 84, 2022).

        The rejection rates ``1 - A_r`` of the pairs, summed along the ladder, trace the
        communication barrier ``Lambda(beta)`` (piecewise linear in ``beta``); the new inverse
        temperatures split it into equal parts, which evens the rates in one step, however uneven
        they were. ``T_1 = 1`` and ``T_R`` stay; on softened models the first gap stays too (see
        "Hard zeros"). The round's counts are then cleared.
        """
        count, total = self._round_count, self._round_sum
        if self.replicas < 3 or not bool((count > 0).all()):
            return
        reject = np.maximum(1.0 - total / count, _MIN_REJECTION)  # (> 0: the barrier rises along the ladder)
        count[:] = 0.0
        total[:] = 0.0
        temps = self.temperatures.numpy()
        held = 1 if self.penalty is not None else 0  # gaps not adapted
        barrier = np.concatenate([[0.0], np.cumsum(reject)])[held:]
        targets = np.linspace(barrier[0], barrier[-1], len(barrier))
        new = temps.copy()
        new[held + 1 : -1] = 1.0 / np.interp(targets[1:-1], barrier, 1.0 / temps[held:])
        if bool((np.diff(new) >= _MIN_GAP).all()):  # else keep the ladder: neighbours stay _MIN_GAP apart
            self.temperatures = torch.from_numpy(new)

    def _tempered_sweeps(self) -> int:
        """Neural sweeps (warmup included) whose chains read their temperature's tables."""
        return sum(f.tempered_sweeps for f in self._fused_sweeps())

    def _fused_sweeps(self) -> list[FusedBlockSweep]:
        """The inner kernel's fused block sweeps (none with Gibbs replicas)."""
        if not isinstance(self.inner, NeuralBlockKernel):
            return []
        return [f for f in self.inner.fused if isinstance(f, FusedBlockSweep)]

    def logging(self) -> dict[str, float]:
        """The inner kernel's fields and the mean swap acceptance so far."""
        out = dict(self.inner.logging())
        if self.replicas > 1:
            out["swap"] = round(float(self._swap_rate.mean()), 3)
        return out

    def diagnostics(self) -> KernelDiagnostics:
        """Swap acceptance per neighbouring pair (post-warmup), the ladder, and the inner kernel's diagnostics.

        For neural replicas, ``block_acceptance_by_temperature`` gives each temperature's
        block acceptance (fused path; NaN for replicas that took single-site sweeps only).
        """
        attempts = np.maximum(self._swap_attempts, 1.0)
        out: KernelDiagnostics = {
            "temperatures": self.temperatures.tolist(),
            "swap_acceptance": (self._swap_accept / attempts).tolist(),
            "divergences": [],  # read by arviz.from_pyro (no divergent draws: no trajectories)
            "replicas": float(self.replicas),
            "chains": float(self.chains),
            "transitions_per_second": self._transitions_per_second(),
            "inner": self.inner.diagnostics(),
            "tempered_proposals": bool(self._tempered),
            "zero_penalty": self.penalty,
            "tempered_sweeps": self._tempered_sweeps(),
            "tempered_tables": max(
                (len(f.tempered.betas) for f in self._fused_sweeps() if f.tempered is not None), default=0
            ),
        }
        if isinstance(self.inner, NeuralBlockKernel):
            rates = []
            for i, fused in enumerate(self.inner.fused):
                accepted, offered = self.inner._accepted_per_chain[i], self.inner._proposed_per_chain[i]
                if fused is None or accepted.ndim != 1 or not self.inner._proposed[i]:
                    continue
                per_replica, proposed = (
                    t.reshape(self.replicas, self.chains).sum(-1) for t in (accepted, offered)
                )  # (replicas that took no neural sweep: NaN)
                rates.append(np.where(proposed > 0, per_replica / np.maximum(proposed, 1.0), math.nan))
            if rates:
                out["block_acceptance_by_temperature"] = np.mean(rates, 0).tolist()
        return out
