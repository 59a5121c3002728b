"""The open-universe GMM that the GMM studies share: held-out models, the proposal they load, timed runs.

``gmm_pair_eval``, ``gmm_study`` and ``gmm_hyper`` draw their held-out GMMs from the same model
(``sigma = 1``, ``tau = 5``, ``p = 0.5``), load the ``gmm_pair`` proposal the same way, run their
samplers through :func:`run_sampler` (``gmm_pair_eval`` and ``gmm_study``; the run harness
:func:`neuralblock.diagnostics.runs.timed_run` underneath; one chain or K vectorized chains per
kernel, each read as a run of its own with :func:`chain_traces`) and read first times with
:func:`first_time_above`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from experiments import common
from motifs.gmm_pair import GmmPairMotif, gmm_graph, sample_gmm
from neuralblock.diagnostics.runs import ClockName, ErrorTrace, first_time, timed_run
from neuralblock.graph import FactorGraph, GaussianMixtureGroup
from neuralblock.kernels.base import GraphKernel, sequential_init
from neuralblock.proposals import NeuralBlockProposal

SIGMA, TAU, P_ACTIVE = 1.0, 5.0, 0.5


def load_proposal_or_untrained(name: str, quick: bool) -> NeuralBlockProposal:
    """The ``gmm_pair`` proposal ``name`` (:func:`experiments.common.load_proposal_or_untrained`, hidden (32,))."""
    return common.load_proposal_or_untrained(name, quick, GmmPairMotif, hidden=(32,))


def mixture_group(fg: FactorGraph) -> GaussianMixtureGroup:
    """The graph's (only) Gaussian mixture group."""
    return next(g for g in fg.groups if isinstance(g, GaussianMixtureGroup))


def run_sampler(
    kernel: GraphKernel, start: torch.Tensor, seconds: float, seed: int, clock: ClockName = "wall"
) -> dict[str, Any]:
    """Run a GMM ``kernel`` from ``start`` for ``seconds`` of sampling time on ``clock`` (the run harness).

    The setup and the per-transition records are not timed. A kernel with ``chains=K > 1`` runs
    its K chains in one state: ``start`` is then ``[K, n]`` and every trace is one list per chain.

    Returns:
        Per transition, the start first (at time 0): ``times``, ``log_joint``, ``log_lik`` (the
        points' log-likelihood) and ``active`` (the number of active mixtures); plus ``sweeps``
        (transitions, each one of every chain) and the kernel's diagnostics. With ``K > 1`` chains,
        ``log_joint[c]``, ``log_lik[c]`` and ``active[c]`` are chain ``c``'s traces (read at ``times``).
    """
    torch.manual_seed(seed)
    fg = kernel.fg
    if fg is None:
        raise ValueError("run_sampler needs a kernel built on a GMM factor graph")
    group = mixture_group(fg)
    chains = getattr(kernel, "chains", 1)
    if chains > 1 and start.shape != (chains, fg.num_variables):
        raise ValueError(f"a kernel of {chains} chains starts from [{chains}, {fg.num_variables}], got {start.shape}")
    trace: dict[str, list[Any]] = {"log_joint": [], "log_lik": [], "active": []}

    def record(params: dict[str, torch.Tensor]) -> None:
        state = params["x"]
        if chains == 1:
            trace["log_joint"].append(float(fg.log_joint(state)))
            trace["log_lik"].append(float(group.log_factors(state).sum()))
            trace["active"].append(float(state[group.active].sum()))
        else:
            trace["log_joint"].append(fg.log_joint(state))
            trace["log_lik"].append(group.log_factors(state).sum(-1))
            trace["active"].append(state[:, group.active].sum(-1))

    record({"x": start})
    run = timed_run(kernel, seconds=seconds, initial_params={"x": start.clone()}, observe=record, clock=clock)
    if chains > 1:  # [transitions, K] -> one list per chain (4 decimals: K traces per run stay a small record)
        trace = {key: torch.stack(values, 1).double().round(decimals=4).tolist() for key, values in trace.items()}
    return {"times": [0.0, *run.times], **trace, "sweeps": run.samples, "diagnostics": run.diagnostics}


def chain_traces(run: dict[str, Any]) -> list[dict[str, list[float]]]:
    """The chains of a :func:`run_sampler` record, each as a one-chain record (``times``, ``log_lik``, ...).

    A one-chain record (flat traces) is its own only chain.

    Example:
        >>> one = {"times": [0.0, 1.0], "log_joint": [-5.0, -1.0], "log_lik": [-4.0, -1.0], "active": [2.0, 3.0]}
        >>> [c["log_lik"] for c in chain_traces(one)]
        [[-4.0, -1.0]]
        >>> two = {**one, "log_lik": [[-4.0, -1.0], [-6.0, -2.0]], "log_joint": [[-5.0, -1.0], [-7.0, -3.0]],
        ...        "active": [[2.0, 3.0], [1.0, 2.0]]}
        >>> [c["log_lik"] for c in chain_traces(two)]
        [[-4.0, -1.0], [-6.0, -2.0]]
    """
    keys = ("log_joint", "log_lik", "active")
    if not run["log_lik"] or not isinstance(run["log_lik"][0], list):
        return [{"times": run["times"], **{key: run[key] for key in keys}}]
    return [{"times": run["times"], **{key: run[key][c] for key in keys}} for c in range(len(run["log_lik"]))]


def held_out_gmm(mixtures: int, points: int, seed: int) -> tuple[FactorGraph, torch.Tensor, dict[str, float]]:
    """A GMM drawn from the model (``sigma, tau, p`` of this study), its true state and reference numbers."""
    gen = torch.Generator().manual_seed(seed)
    data, means, active = sample_gmm(mixtures, points, gen, SIGMA, TAU, P_ACTIVE)
    fg = gmm_graph(data, mixtures, SIGMA, TAU, P_ACTIVE)
    group = mixture_group(fg)
    truth = sequential_init(fg, gen)
    truth[group.means.reshape(-1)] = means.reshape(-1)
    truth[group.active] = active
    reference = {
        "true_active": float(active.sum()),
        "true_log_joint": float(fg.log_joint(truth)),
        "true_log_lik": float(group.log_factors(truth).sum()),
    }
    return fg, truth, reference


def first_time_above(times: Sequence[float], values: Sequence[float], level: float) -> float | None:
    """The first time at which a rising ``values`` (a log density) reaches ``level`` or above; ``None`` if never.

    The first hit, ``first_time(..., for_good=False)`` of the negated values (the harness reads errors
    at or below a level).

    Example:
        >>> first_time_above([0.0, 1.0, 2.0], [-9.0, -1.0, -3.0], -2.0)
        1.0
    """
    return first_time(ErrorTrace(times, [-v for v in values]), -level, for_good=False)
