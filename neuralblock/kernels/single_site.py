"""The single-site sweep shared by the block kernels: Gibbs on discrete variables, random-walk MH on continuous ones.

Example:
    >>> import torch
    >>> fg = FactorGraph()
    >>> z = fg.add_variable("z", 3)
    >>> _ = fg.add_table_factor([z], torch.tensor([0.0, 1.0, 2.0]))
    >>> SingleSiteSweep(fg).sweep(fg, fg.initial_state(), adapt=False).shape
    torch.Size([1])
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from neuralblock.graph import FactorGraph
from neuralblock.kernels.gibbs import GibbsPlan, SoftZeros
from neuralblock.kernels.mixture_copies import MixtureCopyMoves
from neuralblock.kernels.mixture_labels import MixtureLabelMoves, check_label_steps
from neuralblock.kernels.mixture_sites import MixtureSites
from neuralblock.kernels.random_walk import RandomWalkPlan, continuous_latent
from neuralblock.kernels.vocabulary import KernelDiagnostics

__all__ = ["SingleSiteSweep"]


class SingleSiteSweep:
    """One chromatic sweep of Gibbs on the discrete latent variables, then random-walk MH on the continuous ones.

    This is the single-site half of :class:`~neuralblock.kernels.NeuralBlockKernel` (and of
    :class:`SplitMergeGMM`), built from :class:`GibbsPlan` and :class:`RandomWalkPlan`. On an
    open-universe GMM (:func:`motifs.gmm_pair.gmm_graph`; attribute ``mixture_sites``, ``None`` elsewhere
    or to turn it off) untempered sweeps of CPU states take the compiled
    :class:`~neuralblock.kernels.mixture_sites.MixtureSites` instead: the same conditional updates (a Gibbs
    draw of each bit, random-walk MH on each mean coordinate with the same adapted steps), scanned mixture by
    mixture (its bit, then its mean) from random numbers of their own, at ``O(n)`` rather than ``O(n m)`` per
    variable, and, with ``informed_means``, an informed MH move of each active mixture's mean (the Gaussian of
    one EM step; acceptance in :meth:`report`). Each such sweep ends with copy-set moves
    (:class:`~neuralblock.kernels.mixture_copies.MixtureCopyMoves`, 8 attempts; attribute ``copy_moves``): exact MH
    moves that split several mixtures into copy pairs, or merge several copy pairs, at once; then with
    ``label_steps`` label steps (:class:`~neuralblock.kernels.mixture_labels.MixtureLabelMoves`; attribute
    ``label_moves``): exact Gibbs draws of the points' labels and then of every mean at once (an inactive one from
    its prior).

    Args:
        fg: the graph.
        step_size: initial random-walk step size (adapted during warmup towards 0.44 acceptance).
        kernel: the calling kernel's name, for error messages.
        device: where the states live (random-walk updates run on the CPU only).
        compile: passed to the Gibbs plan.
        copy_moves: end each compiled GMM sweep with copy-set moves.
        informed_means: in each compiled GMM sweep, follow each active mixture's random-walk updates with an
            informed move of its mean (:mod:`neuralblock.kernels.mixture_sites`).
        label_steps: label steps at the end of each compiled GMM sweep (0: none; the kernels' transitions end
            with them too, :meth:`label_steps_after`).

    Example:
        >>> import torch
        >>> fg = FactorGraph()
        >>> a, b, x = fg.add_variable("a", 2), fg.add_variable("b", 2), fg.add_variable("x")
        >>> _ = fg.add_table_factor([a, b], torch.tensor([[0.0, -1.0], [-1.0, 0.0]]))
        >>> _ = fg.add_linear_gaussian(x, [], [], 0.0, 1.0)
        >>> sweep = SingleSiteSweep(fg)
        >>> sweep.sweep(fg, fg.initial_state(), adapt=True).shape == (fg.num_variables,)
        True
    """

    def __init__(
        self,
        fg: FactorGraph,
        step_size: float = 0.5,
        kernel: str = "SingleSiteSweep",
        device: torch.device | str = "cpu",
        compile: bool = False,
        copy_moves: bool = True,
        informed_means: bool = True,
        label_steps: int = 2,
    ) -> None:
        cards = fg.cardinalities
        discrete = [v for v in fg.latent.tolist() if cards[v] > 0]
        continuous = continuous_latent(fg, None, kernel)
        self.gibbs_plan = GibbsPlan(fg, discrete, device, compile) if discrete else None
        self.rw_plan = RandomWalkPlan(fg, continuous, step_size, 0.44) if continuous else None
        if self.rw_plan is not None and torch.device(device).type != "cpu":
            raise ValueError(f"{kernel}: random-walk updates of continuous variables run on the CPU only")
        self.mixture_sites = MixtureSites.of(fg, informed_means) if self.rw_plan is not None else None
        self._informed_tally = np.zeros(2)  # the informed moves' summed acceptance probabilities and their number
        sites = self.mixture_sites
        self.copy_moves = MixtureCopyMoves(sites) if sites is not None and copy_moves else None
        steps = check_label_steps(label_steps)
        self.label_moves = MixtureLabelMoves(sites, steps) if sites is not None and steps else None
        self._mean_positions = torch.zeros(0, dtype=torch.long)  # each mean coordinate's step size
        if self.mixture_sites is not None and self.rw_plan is not None:
            position = {v: i for i, v in enumerate(self.rw_plan.variables)}
            self._mean_positions = torch.tensor([position[int(v)] for v in self.mixture_sites.mean_ids.reshape(-1)])

    @property
    def compile_seconds(self) -> float:
        """Time spent compiling (or loading) the compiled updates: Gibbs's and the mixture sweep's (0 when eager)."""
        gibbs = self.gibbs_plan.compile_seconds if self.gibbs_plan is not None else 0.0
        sites = self.mixture_sites.compile_seconds if self.mixture_sites is not None else 0.0
        copies = self.copy_moves.compile_seconds if self.copy_moves is not None else 0.0
        return gibbs + sites + copies + (self.label_moves.compile_seconds if self.label_moves is not None else 0.0)

    def report(self) -> KernelDiagnostics:
        """The sweep's own diagnostics: ``copy_move_acceptance`` where it makes copy-set moves, and
        ``informed_mean_acceptance`` (the mean acceptance probability; NaN before any) where it makes informed
        mean moves."""
        report: KernelDiagnostics = {}
        if self.copy_moves is not None:
            report["copy_move_acceptance"] = self.copy_moves.acceptance()
        if self.mixture_sites is not None and self.mixture_sites.informed:
            total, count = self._informed_tally
            report["informed_mean_acceptance"] = float(total / count) if count else math.nan
        return report

    def refresh(self, fg: FactorGraph) -> None:
        """Re-read table values after the graph's parameters changed."""
        if self.gibbs_plan is not None:
            self.gibbs_plan.refresh(fg)
        if self.mixture_sites is not None and not self.mixture_sites.refresh(fg):
            self.mixture_sites = None  # values the compiled sweep does not cover (a bit fixed by its prior)
            self.copy_moves = None
            self.label_moves = None

    def label_steps_after(self, state: Tensor) -> Tensor:
        """The state after the label steps that end a kernel's own moves (unchanged without label moves).

        A GMM kernel's transitions all end with label steps: each single-site sweep runs them itself, and the
        kernel calls this after its own moves (a round of pairs, a split-merge sweep), for CPU states only.
        """
        if self.label_moves is None or state.device.type != "cpu":
            return state
        return self.label_moves.move(state)

    def sweep(
        self,
        fg: FactorGraph,
        state: Tensor,
        adapt: bool,
        beta: Tensor | None = None,
        soft: SoftZeros | None = None,
        record: bool = True,
    ) -> Tensor:
        """Return the state ``[..., n]`` after one sweep (adapting the random-walk steps if ``adapt``).

        ``beta`` (one inverse temperature per state) tempers the Gibbs conditionals and ``soft``
        softens their zero table entries (:class:`SoftZeros`); tempered random-walk updates are not supported.
        The copy-set and informed moves' outcomes count in :meth:`report` unless ``adapt`` or ``record=False`` (a sweep
        whose state is discarded, e.g. one timed by :class:`~neuralblock.kernels.adaptation.GibbsShare`).
        """
        if beta is not None and self.rw_plan is not None:
            raise ValueError("tempered single-site sweeps need discrete latent variables only")
        sites, rw_plan = self.mixture_sites, self.rw_plan
        if sites is not None and rw_plan is not None and soft is None and state.device.type == "cpu":
            positions = self._mean_positions
            state, accept_prob, informed_prob = sites.sweep(state, rw_plan.adapter.step_size[positions])
            if adapt:
                mean_prob = accept_prob.reshape(-1, len(positions)).mean(0)
                rw_plan.adapter.update(positions, mean_prob.to(rw_plan.adapter.log_step))
            elif record:
                made = informed_prob[~informed_prob.isnan()]
                self._informed_tally += (float(made.sum()), made.numel())
            if self.copy_moves is not None:
                state, outcome = self.copy_moves.move(state)
                if record and not adapt:
                    self.copy_moves.record(outcome)
            return self.label_steps_after(state)
        if self.gibbs_plan is not None:
            state, _ = self.gibbs_plan.sweep(fg, state, beta, soft)
        if self.rw_plan is not None:
            state, _ = self.rw_plan.sweep(fg, state, adapt=adapt)
        return state
