"""The open-universe GMM that the GMM studies share: held-out models, the proposal they load, timed runs.

``gmm_pair_eval``, ``gmm_study`` and ``gmm_hyper`` draw their held-out GMMs from the same model
(``sigma = 1``, ``tau = 5``, ``p = 0.5``), load the ``gmm_pair`` proposal the same way, run their
samplers through :func:`run_sampler` (``gmm_pair_eval`` and ``gmm_study``; the run harness
:func:`neuralblock.diagnostics.runs.timed_run` underneath; one chain or K vectorized chains per
kernel, each read as a run of its own with :func:`chain_traces`) and read first times with
:func:`first_time_above`. ``gmm_scale`` draws its cases from the held-out families of :func:`family_gmm`.
"""

from __future__ import annotations

import math
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
    kernel: GraphKernel,
    start: torch.Tensor,
    seconds: float,
    seed: int,
    clock: ClockName = "wall",
    keep_final: bool = False,
) -> dict[str, Any]:
    """Run a GMM ``kernel`` from ``start`` for ``seconds`` of sampling time on ``clock`` (the run harness).

    The setup and the per-transition records are not timed. A kernel with ``chains=K > 1`` runs
    its K chains in one state: ``start`` is then ``[K, n]`` and every trace is one list per chain.

    Returns:
        Per transition, the start first (at time 0): ``times``, ``log_joint``, ``log_lik`` (the
        points' log-likelihood) and ``active`` (the number of active mixtures); plus ``sweeps``
        (transitions, each one of every chain), ``setup_seconds`` (untimed in ``times``) and the kernel's
        diagnostics. With ``K > 1`` chains, ``log_joint[c]``, ``log_lik[c]`` and ``active[c]`` are chain
        ``c``'s traces (read at ``times``).
        ``keep_final`` adds ``final``: the last state (a tensor, to continue the run from; not JSON).
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
    record = {"times": [0.0, *run.times], **trace, "sweeps": run.samples, "diagnostics": run.diagnostics}
    record["setup_seconds"] = round(run.setup_s, 4)
    return {**record, "final": run.params["x"].clone()} if keep_final else record


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
    truth, reference = true_state(fg, means, active, gen)
    return fg, truth, reference


def true_state(
    fg: FactorGraph, means: torch.Tensor, active: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, dict[str, float]]:
    """The state of a GMM graph with the given ``means [m, D]`` and ``active [m]``, and its reference numbers.

    The other variables start from :func:`~neuralblock.kernels.base.sequential_init` (drawn from
    ``generator``). The reference numbers are ``true_active`` (M), ``true_log_joint`` and ``true_log_lik``.
    """
    group = mixture_group(fg)
    truth = sequential_init(fg, generator)
    truth[group.means.reshape(-1)] = means.reshape(-1).to(truth.dtype)
    truth[group.active] = active.to(truth.dtype)
    reference = {
        "true_active": float(active.sum()),
        "true_log_joint": float(fg.log_joint(truth)),
        "true_log_lik": float(group.log_factors(truth).sum()),
    }
    return truth, reference


def first_time_above(times: Sequence[float], values: Sequence[float], level: float) -> float | None:
    """The first time at which a rising ``values`` (a log density) reaches ``level`` or above; ``None`` if never.

    The first hit, ``first_time(..., for_good=False)`` of the negated values (the harness reads errors
    at or below a level).

    Example:
        >>> first_time_above([0.0, 1.0, 2.0], [-9.0, -1.0, -3.0], -2.0)
        1.0
    """
    return first_time(ErrorTrace(times, [-v for v in values]), -level, for_good=False)


GMM_FAMILIES = ("model", "unequal", "overlap", "scaled")
"""The case families of the GMM benchmark at scale (:func:`family_gmm`)."""
FAMILY_SEED = 70_000
"""Generator seeds of :func:`family_gmm` start here (held out: no other study or training draws from them)."""


def family_seed(family: str, mixtures: int, points: int, seed: int = 0) -> int:
    """The held-out generator seed of one case: distinct for every family, ``m < 100``, ``n < 10_000`` and seed.

    Example:
        >>> family_seed("model", 8, 60), family_seed("overlap", 32, 1000, seed=1)
        (150060, 12391000)
    """
    if family not in GMM_FAMILIES:
        raise ValueError(f"unknown GMM family {family!r}; known: {', '.join(GMM_FAMILIES)}")
    if not (2 <= mixtures < 100 and 1 <= points < 10_000 and seed >= 0):
        raise ValueError(f"family seeds need 2 <= m < 100, 1 <= n < 10000, seed >= 0; got {mixtures}, {points}, {seed}")
    return FAMILY_SEED + 10_000_000 * seed + 1_000_000 * GMM_FAMILIES.index(family) + 10_000 * mixtures + points


def family_scale(family: str) -> tuple[float, float]:
    """``(sigma, tau)`` of a family's data and model: ``(3, 15)`` for ``scaled``, the study's ``(1, 5)`` otherwise."""
    return (3.0, 15.0) if family == "scaled" else (SIGMA, TAU)


def family_clusters(mixtures: int) -> int:
    """The true number of clusters of the ``unequal``, ``overlap`` and ``scaled`` families: ``round(m / 3)``, >= 2."""
    return max(2, round(mixtures / 3))


def family_gmm(
    family: str, mixtures: int, points: int, seed: int = 0
) -> tuple[FactorGraph, torch.Tensor, dict[str, Any]]:
    """One held-out case of a GMM family (2-D, ``p_active = 0.5``): its graph, true state and reference numbers.

    The families (``mixtures`` candidates, ``points`` points; ``k = round(m / 3)``, at least 2):

    * ``model``: a draw from the model itself, as :func:`held_out_gmm` draws it (``sigma = 1, tau = 5``);
    * ``unequal``: ``k`` clusters with means ``N(0, tau^2 I)`` and unequal sizes (``Dirichlet(0.7)``
      weights, every cluster at least 3 points);
    * ``overlap``: ``k`` clusters of about equal size (at least 3 points each) in pairs whose means
      sit ``2.5 sigma`` apart (around a centre ``N(0, tau^2 I)``; the last one alone when ``k`` is odd);
    * ``scaled``: ``unequal`` at ``sigma = 3, tau = 15``.

    The model graph is built with the family's ``sigma`` and ``tau`` (:func:`family_scale`). The
    generator is seeded with :func:`family_seed`; the points are shuffled.

    Returns:
        ``(fg, truth, reference)``: ``reference`` holds ``family``, ``seed`` (the generator's), ``sigma``,
        ``tau``, ``true_active`` (the true M), ``true_log_joint``, ``true_log_lik`` and ``cluster_sizes``.

    Example:
        >>> fg, truth, ref = family_gmm("unequal", 12, 60)
        >>> ref["true_active"], len(ref["cluster_sizes"]), min(ref["cluster_sizes"]) >= 3, sum(ref["cluster_sizes"])
        (4.0, 4, True, 60)
    """
    gen_seed = family_seed(family, mixtures, points, seed)
    sigma, tau = family_scale(family)
    if family == "model":
        fg, truth, numbers = held_out_gmm(mixtures, points, gen_seed)
        return fg, truth, {"family": family, "seed": gen_seed, "sigma": sigma, "tau": tau, **numbers}
    gen = torch.Generator().manual_seed(gen_seed)
    dtype = torch.get_default_dtype()
    k = family_clusters(mixtures)
    if points < 3 * k:
        raise ValueError(f"the {family} family needs at least {3 * k} points at m={mixtures}, got {points}")
    if family == "overlap":
        weights = torch.full((k,), 1.0 / k, dtype=dtype)
        cluster_means = tau * torch.randn(k, 2, generator=gen, dtype=dtype)  # pair i: clusters 2i and 2i + 1
        pairs = k // 2
        angle = 2 * math.pi * torch.rand(pairs, generator=gen, dtype=dtype)
        offset = 1.25 * sigma * torch.stack([angle.cos(), angle.sin()], -1)
        middle = cluster_means[0 : 2 * pairs : 2].clone()
        cluster_means[0 : 2 * pairs : 2] = middle + offset
        cluster_means[1 : 2 * pairs : 2] = middle - offset
    else:
        with torch.random.fork_rng(devices=[]):  # Dirichlet draws take no generator: a seeded, restored global RNG
            torch.manual_seed(gen_seed)
            weights = torch.distributions.Dirichlet(torch.full((k,), 0.7, dtype=dtype)).sample()
        cluster_means = tau * torch.randn(k, 2, generator=gen, dtype=dtype)
    sizes = 3 + torch.multinomial(weights, points - 3 * k, replacement=True, generator=gen).bincount(minlength=k)
    labels = torch.repeat_interleave(torch.arange(k), sizes)[torch.randperm(points, generator=gen)]
    data = cluster_means[labels] + sigma * torch.randn(points, 2, generator=gen, dtype=dtype)
    fg = gmm_graph(data, mixtures, sigma, tau, P_ACTIVE)
    means = tau * torch.randn(mixtures, 2, generator=gen, dtype=dtype)  # the inactive mixtures' means: prior draws
    means[:k] = cluster_means
    active = (torch.arange(mixtures) < k).to(dtype)
    truth, numbers = true_state(fg, means, active, gen)
    reference = {"family": family, "seed": gen_seed, "sigma": sigma, "tau": tau, **numbers}
    return fg, truth, {**reference, "cluster_sizes": sizes.tolist()}
