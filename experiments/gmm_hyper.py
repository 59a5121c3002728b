"""Open-universe GMM with unknown hyper-parameters: gmm_pair neural blocks + random-walk MH on (sigma, p).

The Pyro model :func:`gmm_hyper_model` puts hyper-priors on the points' noise ``sigma``
(LogNormal) and the activity probability ``p`` (Beta) of the open-universe GMM of
:mod:`motifs.gmm_pair`; the local sites are the means ``mu [m, 2]`` and the activity bits
``v [m]``, with the labels summed out. Given ``(sigma, p)`` the full conditional of
``(mu, v)`` is exactly :func:`motifs.gmm_pair.gmm_graph` (:class:`GmmConditional` builds it),
so one compound sampler runs in ``pyro.infer.MCMC``:

* local slot: :class:`~neuralblock.kernels.ConditionalGraphKernel` running a graph kernel on
  that conditional graph, rebuilt after each global move;
* global slot: :class:`~neuralblock.kernels.RandomWalkMH` on ``(sigma, p)`` through the Pyro
  bridge (``mu`` and ``v`` are then observed), walking in log / logit space.

Arms, side by side on the same data and the same starts, each for the same CPU-time budget
(the run harness's ``clock="cpu"``, :func:`neuralblock.diagnostics.runs.timed_run`: this process's
CPU time with one torch thread, equal to wall time on an idle core, robust to other jobs on a shared
machine; the kernel's setup and the per-transition records are not timed), with the same hyper-parameter kernel and
the same schedule (``--local-steps`` local sweeps per global sweep):

* ``NB(gmm_pair) + hyper-MH``: :class:`~neuralblock.NeuralBlockKernel` with the shipped
  ``gmm_pair`` proposal (location/scale free, so it follows ``sigma``), half the local
  transitions single-site sweeps;
* ``split-merge + hyper-MH``: :class:`~neuralblock.kernels.split_merge.SplitMergeGMM`, mixed
  the same way;
* reference lines: both local kernels with ``(sigma, p)`` fixed at the true values.

Data: ``--datasets`` synthetic sets of ``n`` points from the model with ``sigma = 1``,
``tau = 5`` and exactly ``M_true`` of the ``m`` mixtures active (the model conditioned on
``M = M_true``; ``p_true = M_true / m`` for the reference lines). Each run starts from a
prior draw of ``(sigma, p, mu, v)``, shared by the arms. Recorded per transition: the
model's log joint, the points' log-likelihood, ``M``, ``sigma`` and ``p``; reported: the
time each arm needs to reach the split-merge arm's median final log joint (the first hit), the posterior
of ``sigma`` and ``M`` (second half of each run) against the truth, and acceptance rates.

:func:`exact_hyper_posterior` computes ``P(M = k)``, ``E[sigma]`` and ``E[p]`` of a tiny
model by enumerating the labels and integrating the means analytically and ``(sigma, p)``
by quadrature; the tests check the compound sampler against it.

Usage::

    python -m experiments.gmm_hyper --quick
    python -m experiments.gmm_hyper
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import Tensor
from tqdm import tqdm

from experiments.common import (
    add_run_options,
    add_table,
    median,
    open_study,
    parse_quick,
    proposal_study_parser,
    pyplot,
    write_sections,
)
from experiments.gmm_models import first_time_above, load_proposal_or_untrained
from motifs.gmm_pair import gmm_graph
from neuralblock import FactorGraph, NeuralBlockKernel
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.diagnostics.runs import CLOCKS, timed_run
from neuralblock.kernels import CompoundKernel, ConditionalGraphKernel, RandomWalkMH
from neuralblock.kernels.base import GraphKernel
from neuralblock.kernels.conditioning import ConditionedModel
from neuralblock.kernels.split_merge import SplitMergeGMM
from neuralblock.proposals import NeuralBlockProposal

plt = pyplot()

__all__ = [
    "GmmConditional",
    "HyperPriors",
    "compound_sampler",
    "exact_hyper_posterior",
    "gmm_hyper_model",
    "main",
    "mixture_log_lik",
    "model_log_joint",
    "run_chain",
    "synthetic_dataset",
]

NB, SM = "NB(gmm_pair) + hyper-MH", "split-merge + hyper-MH"
FIXED = " (true hyper fixed)"
NEAR_TRUTH = 10.0  # nats below the model's log joint at the true state
HYPER_SITES = ["sigma", "p"]
LOCAL_SITES = ["mu", "v"]


# ------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class HyperPriors:
    """Hyper-priors ``sigma ~ LogNormal(sigma_loc, sigma_scale)``, ``p ~ Beta(p_a, p_b)``; known ``tau``, ``dim``.

    Example:
        >>> HyperPriors().tau
        5.0
    """

    sigma_loc: float = 0.0
    sigma_scale: float = 0.5
    p_a: float = 2.0
    p_b: float = 2.0
    tau: float = 5.0
    dim: int = 2


def mixture_log_lik(points: Tensor, mu: Tensor, v: Tensor, sigma: Tensor | float) -> Tensor:
    """``sum_j log (1 / M) sum_k v_k N(x_j; mu_k, sigma^2 I)``, batched over leading dims of ``mu, v, sigma``.

    The density of :class:`~neuralblock.graph.GaussianMixtureGroup` (``-inf`` when no mixture is active).

    Args:
        points: ``[n, D]``; ``mu``: ``[..., m, D]``; ``v``: ``[..., m]`` (0/1); ``sigma``: ``[...]`` or a float.

    Returns:
        ``[...]``.

    Example:
        >>> round(float(mixture_log_lik(torch.zeros(1, 1), torch.zeros(2, 1), torch.tensor([1.0, 0.0]), 1.0)), 4)
        -0.9189
    """
    sigma = torch.as_tensor(sigma, dtype=points.dtype)
    n, dim = points.shape
    d2 = ((points.unsqueeze(-2) - mu.unsqueeze(-3)) ** 2).sum(-1)  # [..., n, m]
    scale = sigma.unsqueeze(-1).unsqueeze(-1)
    log_v = torch.log(v.clamp(min=0.0)).unsqueeze(-2)
    count = v.sum(-1)
    per_point = torch.logsumexp(log_v - 0.5 * d2 / scale**2, -1).sum(-1)  # [...]
    value = per_point - n * torch.log(count.clamp(min=1.0)) - n * dim * (torch.log(sigma) + 0.5 * math.log(2 * math.pi))
    return torch.where(count > 0, value, torch.full_like(value, -math.inf))


def gmm_hyper_model(points: Tensor, num_mixtures: int, priors: HyperPriors = HyperPriors()) -> None:
    """Open-universe GMM with hyper-priors on ``sigma`` and ``p`` (labels summed out).

    Sites: ``sigma``, ``p`` (scalars), ``mu [m, D]``, ``v [m]``; ``v`` is conditioned on
    ``M = sum v >= 1`` (the factor ``-log(1 - (1 - p)^m)`` is its normaliser, and the
    likelihood is ``-inf`` at ``M = 0``), as in :func:`motifs.gmm_pair.sample_gmm`. The
    model evaluates on a batch of hyper-parameter values (``sigma``, ``p`` of shape ``[B]``),
    as the Pyro bridge of :class:`~neuralblock.kernels.RandomWalkMH` requires.

    Args:
        points: ``[n, D]`` observations.
        num_mixtures: candidate mixtures ``m``.
        priors: the hyper-priors and the known ``tau``.

    Example:
        >>> from pyro import poutine
        >>> trace = poutine.trace(gmm_hyper_model).get_trace(torch.randn(5, 2), 3)
        >>> trace.nodes["mu"]["value"].shape, trace.nodes["v"]["value"].shape
        (torch.Size([3, 2]), torch.Size([3]))
    """
    m = int(num_mixtures)
    sigma = pyro.sample("sigma", dist.LogNormal(priors.sigma_loc, priors.sigma_scale))
    p = pyro.sample("p", dist.Beta(priors.p_a, priors.p_b))
    pyro.factor("v_at_least_one", -torch.log1p(-((1.0 - p) ** m)))
    mu = pyro.sample("mu", dist.Normal(0.0, priors.tau).expand([m, priors.dim]).to_event(2))
    v = pyro.sample("v", dist.Bernoulli(probs=p.unsqueeze(-1).expand(p.shape + (m,))).to_event(1))
    pyro.factor("x", mixture_log_lik(points, mu, v, sigma))


def model_log_joint(points: Tensor, num_mixtures: int, priors: HyperPriors, values: Mapping[str, Tensor]) -> Tensor:
    """The model's log joint at ``values`` (every latent site given).

    Example:
        >>> values = {"sigma": torch.tensor(1.0), "p": torch.tensor(0.5), "mu": torch.zeros(2, 2), "v": torch.ones(2)}
        >>> bool(torch.isfinite(model_log_joint(torch.zeros(3, 2), 2, HyperPriors(), values)))
        True
    """
    conditioned = poutine.condition(gmm_hyper_model, data=dict(values))
    return poutine.trace(conditioned).get_trace(points, num_mixtures, priors).log_prob_sum()


class GmmConditional:
    """``build_graph`` for :class:`~neuralblock.kernels.ConditionalGraphKernel`: ``p(mu, v | sigma, p, x)``.

    Returns :func:`~motifs.gmm_pair.gmm_graph` at the current ``(sigma, p)``; repeated values
    (a rejected global move) return the previous graph, which saves the rebuild.

    Args:
        fixed: hyper-parameter values for sites the model does not sample (e.g. a model
            conditioned on the true ``sigma`` and ``p``).

    Example:
        >>> build = GmmConditional()
        >>> fg = build({"sigma": torch.tensor(1.0), "p": torch.tensor(0.5)}, torch.randn(4, 2), 3)
        >>> fg.num_variables  # 3 means (2-D), 3 bits, 4 points (2-D)
        17
    """

    def __init__(self, fixed: Mapping[str, float] | None = None) -> None:
        self.fixed = {k: float(v) for k, v in (fixed or {}).items()}
        self._key: tuple | None = None
        self._graph: FactorGraph | None = None

    def __call__(
        self,
        values: Mapping[str, Tensor],
        points: Tensor,
        num_mixtures: int,
        priors: HyperPriors = HyperPriors(),
    ) -> FactorGraph:
        hyper = {**self.fixed, **{k: float(values[k]) for k in HYPER_SITES if k in values}}
        missing = [k for k in HYPER_SITES if k not in hyper]
        if missing:
            raise ValueError(f"GmmConditional needs values or fixed values for {missing}")
        key = (hyper["sigma"], hyper["p"], id(points), int(num_mixtures), priors)
        if key != self._key or self._graph is None:
            self._graph = gmm_graph(points, num_mixtures, hyper["sigma"], priors.tau, hyper["p"])
            self._key = key
        return self._graph


def local_site_variables(num_mixtures: int, dim: int = 2) -> dict[str, list[str]]:
    """The gmm_graph variables of the sites ``mu`` (row-major) and ``v``.

    Example:
        >>> local_site_variables(2)["mu"]
        ['mu[0,0]', 'mu[0,1]', 'mu[1,0]', 'mu[1,1]']
    """
    m = int(num_mixtures)
    return {
        "mu": [f"mu[{k},{d}]" for k in range(m) for d in range(dim)],
        "v": [f"v[{k}]" for k in range(m)],
    }


def local_kernel(
    kind: str, proposal: NeuralBlockProposal | None, gibbs_prob: float, step_size: float = 0.5
) -> Callable[..., GraphKernel]:
    """``kernel(fg)`` factory of the local slot: ``"nb"`` (neural blocks) or ``"sm"`` (split-merge).

    ``step_size`` is the initial random-walk step of the single-site sweeps on the means.

    Example:
        >>> local_kernel("sm", None, 0.5).func.__name__
        'SplitMergeGMM'
    """
    if kind == "nb":
        if proposal is None:
            raise ValueError("the neural block local kernel needs a gmm_pair proposal")
        return partial(NeuralBlockKernel, proposals=[proposal], gibbs_prob=gibbs_prob, step_size=step_size)
    if kind == "sm":
        return partial(SplitMergeGMM, gibbs_prob=gibbs_prob, step_size=step_size)
    raise ValueError(f"local kernel kind must be 'nb' or 'sm', got {kind!r}")


def compound_sampler(
    kind: str,
    num_mixtures: int,
    proposal: NeuralBlockProposal | None = None,
    local_steps: int = 3,
    gibbs_prob: float = 0.5,
    fixed: Mapping[str, float] | None = None,
    priors: HyperPriors = HyperPriors(),
    step_size: float = 0.5,
) -> CompoundKernel:
    """The compound sampler: a graph kernel on ``(mu, v)`` + random-walk MH on ``(sigma, p)``.

    With ``fixed`` hyper-parameters the model is conditioned on them and only the local
    slot remains (the reference line). Run it with ``mcmc.run(points, num_mixtures, priors)``.

    Example:
        >>> from pyro.infer import MCMC
        >>> points = torch.cat([torch.randn(10, 2) - 4.0, torch.randn(10, 2) + 4.0])
        >>> kernel = compound_sampler("sm", 3, local_steps=2)
        >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True)
        >>> mcmc.run(points, 3, HyperPriors())
        >>> sorted(mcmc.get_samples())
        ['mu', 'p', 'sigma', 'v']
    """
    make = local_kernel(kind, proposal, gibbs_prob, step_size)
    sites = local_site_variables(num_mixtures, priors.dim)
    if fixed:
        model = ConditionedModel(gmm_hyper_model, {k: torch.tensor(float(x)) for k, x in fixed.items()})
        local = ConditionalGraphKernel(model, sites, GmmConditional(fixed), make)
        return CompoundKernel([(local, LOCAL_SITES)], model=model)
    local = ConditionalGraphKernel(gmm_hyper_model, sites, GmmConditional(), make)
    return CompoundKernel([(local, LOCAL_SITES), (RandomWalkMH(gmm_hyper_model), HYPER_SITES)], steps=[local_steps, 1])


# ------------------------------------------------------------------------------ data and runs
def synthetic_dataset(
    seed: int, num_mixtures: int, num_points: int, true_active: int, sigma: float = 1.0, tau: float = 5.0, dim: int = 2
) -> dict[str, Tensor]:
    """Points from the GMM with ``true_active`` of ``num_mixtures`` mixtures active (uniform labels).

    Example:
        >>> data = synthetic_dataset(0, 16, 40, 6)
        >>> data["points"].shape, int(data["v"].sum())
        (torch.Size([40, 2]), 6)
    """
    if not 1 <= true_active <= num_mixtures:
        raise ValueError(f"true_active must lie in [1, {num_mixtures}], got {true_active}")
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.get_default_dtype()
    v = torch.zeros(num_mixtures, dtype=dtype)
    v[torch.randperm(num_mixtures, generator=gen)[:true_active]] = 1.0
    mu = tau * torch.randn(num_mixtures, dim, generator=gen, dtype=dtype)
    labels = torch.multinomial(v, num_points, replacement=True, generator=gen)
    points = mu[labels] + sigma * torch.randn(num_points, dim, generator=gen, dtype=dtype)
    return {"points": points, "mu": mu, "v": v, "sigma": torch.tensor(float(sigma))}


def prior_start(seed: int, num_mixtures: int, priors: HyperPriors) -> dict[str, Tensor]:
    """A draw of every latent site from the prior, with at least one active mixture.

    Example:
        >>> sorted(prior_start(0, 4, HyperPriors()))
        ['mu', 'p', 'sigma', 'v']
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        trace = poutine.trace(gmm_hyper_model).get_trace(torch.zeros(1, priors.dim), num_mixtures, priors)
    values = {k: trace.nodes[k]["value"].detach().clone() for k in (*HYPER_SITES, *LOCAL_SITES)}
    if values["v"].sum() == 0:
        values["v"][0] = 1.0
    return values


def run_chain(
    kernel: CompoundKernel,
    model_args: tuple,
    start: Mapping[str, Tensor],
    *,
    seconds: float | None = None,
    warmup: int = 0,
    transitions: int | None = None,
    seed: int = 0,
    record: Callable[[dict[str, Tensor]], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Run ``kernel`` for a CPU-time budget or a number of transitions (its setup untimed, then the harness).

    The kernel is set up here (as ``pyro.infer.MCMC`` does) and its ``sample`` runs as the step function of
    :func:`~neuralblock.diagnostics.runs.timed_run` (``clock="cpu"``), so the warmup transitions count in the
    budget and are recorded like the others.

    Args:
        kernel: a compound sampler of :func:`compound_sampler`.
        model_args: ``(points, num_mixtures, priors)``.
        start: initial values of every site the kernel samples.
        seconds: CPU-time budget (the harness's sampling time: setup and records are not counted).
        warmup: transitions of step-size adaptation at the start (counted in the budget).
        transitions: or a fixed number of transitions.
        seed: torch/pyro seed of the run.
        record: ``record(values) -> {name: float}`` for each state (default: ``sigma``, ``p`` and ``M``).

    Returns:
        ``{"times": [...], <recorded name>: [...], "transitions": int, "diagnostics": kernel.diagnostics()}``;
        entry 0 is the start.
    """
    if (seconds is None) == (transitions is None):
        raise ValueError("give exactly one of seconds and transitions")
    pyro.set_rng_seed(seed)
    kernel.initial_params = {k: v.clone() for k, v in start.items()}
    kernel.setup(warmup, *model_args)
    params = kernel.initial_params
    record = record or _default_record
    trace: dict[str, list[float]] = {}

    def add(values: dict[str, Tensor]) -> None:
        for key, value in record(values).items():
            trace.setdefault(key, []).append(value)

    add(params)
    run = timed_run(
        kernel.sample, initial_params=params, seconds=seconds, samples=transitions, clock="cpu", observe=add
    )
    kernel.cleanup()
    times = [0.0, *run.times]
    return {"times": times, **trace, "transitions": run.samples, "warmup": warmup, "diagnostics": kernel.diagnostics()}


def _default_record(values: Mapping[str, Tensor]) -> dict[str, float]:
    return {"sigma": float(values["sigma"]), "p": float(values["p"]), "M": float(values["v"].sum())}


def study_record(points: Tensor, num_mixtures: int, priors: HyperPriors) -> Callable[[dict[str, Tensor]], dict]:
    """The study's per-transition record: log joint, log-likelihood, ``M``, ``sigma``, ``p``."""

    def record(values: dict[str, Tensor]) -> dict[str, float]:
        with torch.no_grad():
            log_joint = float(model_log_joint(points, num_mixtures, priors, values))
            log_lik = float(mixture_log_lik(points, values["mu"], values["v"], values["sigma"]))
        return {"log_joint": log_joint, "log_lik": log_lik, **_default_record(values)}

    return record


# ------------------------------------------------------------------------------ exact reference
def exact_hyper_posterior(
    points: Tensor, num_mixtures: int, priors: HyperPriors, grid: int = 400, width: float = 6.0
) -> dict[str, Any]:
    """``P(M = k)``, ``E[sigma]`` and ``E[p]`` of a tiny model, by enumeration and quadrature.

    Labels are enumerated (``M^n`` assignments for ``M`` active mixtures, all patterns of
    ``v`` with the same ``M`` contribute equally), the means are integrated analytically
    (per coordinate, a cluster's points are jointly ``N(0, sigma^2 I + tau^2 11^T)``), and
    ``(log sigma, p)`` by a midpoint rule on ``grid`` points each (``log sigma`` within
    ``width`` prior sds of its prior mean). Cost ``O(grid * m^n)``: keep ``n`` small.

    Returns:
        ``{"P(M=k)": [m], "E[sigma]": float, "E[p]": float}``.

    Example:
        >>> out = exact_hyper_posterior(torch.tensor([[0.0, 0.0], [4.0, 4.0]]), 2, HyperPriors(), grid=50)
        >>> round(sum(out["P(M=k)"]), 6)
        1.0
    """
    x = points.to(torch.float64)
    n, dim = x.shape
    m = int(num_mixtures)
    tau2 = priors.tau**2
    half = torch.arange(grid, dtype=torch.float64) + 0.5
    u = priors.sigma_loc + priors.sigma_scale * width * (2 * half / grid - 1)  # log sigma
    p = half / grid
    log_prior_u = torch.distributions.Normal(priors.sigma_loc, priors.sigma_scale).log_prob(u)
    s2 = torch.exp(2 * u)[:, None, None]  # [G, 1, 1]
    log_lik = []
    for active in range(1, m + 1):
        labels = torch.tensor(list(itertools.product(range(active), repeat=n)), dtype=torch.long)  # [A, n]
        onehot = torch.nn.functional.one_hot(labels, active).to(torch.float64)  # [A, n, M]
        count = onehot.sum(1)  # [A, M]
        sums2 = (torch.einsum("anm,nd->amd", onehot, x) ** 2).sum(-1)  # [A, M]
        squares = torch.einsum("anm,n->am", onehot, (x**2).sum(-1))  # [A, M]
        var = s2 + count * tau2  # [G, A, M]
        log_z = (
            -0.5 * dim * count * math.log(2 * math.pi)
            - dim * (count - 1) * 0.5 * torch.log(s2)
            - 0.5 * dim * torch.log(var)
            - 0.5 * (squares / s2 - tau2 * sums2 / (s2 * var))
        )
        log_z = torch.where(count > 0, log_z, torch.zeros_like(log_z)).sum(-1)  # [G, A]
        log_lik.append(torch.logsumexp(log_z, -1) - n * math.log(active))  # [G]
    log_lik_t = torch.stack(log_lik, -1)  # [G_sigma, m]
    ks = torch.arange(1, m + 1, dtype=torch.float64)
    log_binom = torch.lgamma(torch.tensor(m + 1.0)) - torch.lgamma(ks + 1) - torch.lgamma(m - ks + 1)
    beta = torch.distributions.Beta(*torch.tensor([priors.p_a, priors.p_b], dtype=torch.float64))
    log_p_prior = beta.log_prob(p)
    log_bits = (
        ks * torch.log(p)[:, None] + (m - ks) * torch.log1p(-p)[:, None] - torch.log1p(-((1 - p) ** m))[:, None]
    )  # [G_p, m]
    log_w = (
        log_prior_u[:, None, None] + log_lik_t[:, None, :] + (log_p_prior[:, None] + log_bits + log_binom)[None, :, :]
    )  # [G_sigma, G_p, m]
    w = torch.softmax(log_w.reshape(-1), 0).reshape(log_w.shape)
    return {
        "P(M=k)": w.sum((0, 1)).tolist(),
        "E[sigma]": float((w.sum((1, 2)) * torch.exp(u)).sum()),
        "E[p]": float((w.sum((0, 2)) * p).sum()),
    }


# ------------------------------------------------------------------------------ the study
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = proposal_study_parser(__doc__, "gmm_pair")
    quick = add_table(
        parser,
        """
        --mixtures      16    6
        --points        240   40
        --true-active   6     3
        --true-sigma    1.0   -
        --datasets      3     1
        --runs          2     1     runs per arm and dataset (own prior start each)
        --seconds       15.0  1.0   CPU seconds per run
        --local-steps   3     -     local sweeps per hyper-parameter sweep
        --warmup        10    2     compound transitions of step-size adaptation
        --gibbs-prob    0.5   -
        --fixed-runs    1     -     runs per dataset of the fixed-true-hyper lines
        """,
    )
    add_run_options(parser, "experiments/results/gmm_hyper")
    return parse_quick(parser, argv, quick)


def _posterior(run: dict[str, Any]) -> dict[str, float]:
    """Posterior summaries from the second half of a run's transitions."""
    half = len(run["times"]) // 2
    sigma = torch.tensor(run["sigma"][half:], dtype=torch.float64)
    active = torch.tensor(run["M"][half:], dtype=torch.float64)
    return {"E[sigma]": float(sigma.mean()), "E[M]": float(active.mean()), "mode M": float(active.mode().values)}


def _acceptance(diagnostics: Mapping[str, Any]) -> dict[str, float | None]:
    """Local and hyper-parameter acceptance from a compound kernel's diagnostics."""
    blocks = diagnostics.get("blocks", {})
    inner = blocks.get("0 (ConditionalGraphKernel)", {})
    local = inner.get("acceptance_by_proposal", inner.get("acceptance_by_move", {}))
    hyper = blocks.get("1 (RandomWalkMH)", {}).get("acceptance_rate")
    if "proposed" in inner:  # split-merge: all move types pooled
        proposed = sum(inner["proposed"].values())
        local_rate = sum(local[k] * inner["proposed"][k] for k in local) / proposed if proposed else None
    else:
        local_rate = local.get("gmm_pair")
    return {"local": local_rate, "moves": {k: float(a) for k, a in local.items()}, "hyper": hyper}


def study_dataset(index: int, args: argparse.Namespace, proposal: NeuralBlockProposal, bar: tqdm) -> dict[str, Any]:
    """Every arm on one dataset, ``args.runs`` runs each (shared prior starts)."""
    priors = HyperPriors()
    m = args.mixtures
    data = synthetic_dataset(1000 * args.seed + index, m, args.points, args.true_active, args.true_sigma, priors.tau)
    points = data["points"]
    model_args = (points, m, priors)
    p_true = args.true_active / m
    truth = {"sigma": data["sigma"], "p": torch.tensor(p_true), "mu": data["mu"], "v": data["v"]}
    reference = {
        "true_M": float(args.true_active),
        "true_sigma": args.true_sigma,
        "true_p": p_true,
        "true_log_joint": float(model_log_joint(points, m, priors, truth)),
        "true_log_lik": float(mixture_log_lik(points, data["mu"], data["v"], data["sigma"])),
    }
    arms: dict[str, Callable[[], CompoundKernel]] = {
        NB: lambda: compound_sampler("nb", m, proposal, args.local_steps, args.gibbs_prob),
        SM: lambda: compound_sampler("sm", m, None, args.local_steps, args.gibbs_prob),
    }
    if args.fixed_runs > 0:
        fixed = {"sigma": args.true_sigma, "p": p_true}
        arms[NB + FIXED] = lambda: compound_sampler("nb", m, proposal, args.local_steps, args.gibbs_prob, fixed)
        arms[SM + FIXED] = lambda: compound_sampler("sm", m, None, args.local_steps, args.gibbs_prob, fixed)
    record = study_record(points, m, priors)

    def with_true(values: dict[str, Tensor]) -> dict[str, float]:
        return record({"sigma": truth["sigma"], "p": truth["p"], **values})

    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in arms}
    for r in range(max(args.runs, args.fixed_runs)):
        start = prior_start(10_000 * args.seed + 100 * index + r, m, priors)
        for label, build in arms.items():
            if r >= (args.fixed_runs if label.endswith(FIXED) else args.runs):
                continue
            kernel = build()
            if label.endswith(FIXED):  # only (mu, v) are sampled; the record sees the true sigma and p
                own = {k: start[k] for k in LOCAL_SITES}
                run = run_chain(
                    kernel, model_args, own, seconds=args.seconds, warmup=args.warmup, seed=r, record=with_true
                )
            else:
                run = run_chain(
                    kernel, model_args, start, seconds=args.seconds, warmup=args.warmup, seed=r, record=record
                )
            run["acceptance"] = _acceptance(run.pop("diagnostics"))
            run["posterior"] = _posterior(run)
            runs[label].append(run)
            bar.update(1)
    return {"index": index, "reference": reference, "runs": runs, "summary": summarize(runs, reference)}


def sm_level(runs: dict[str, list[dict[str, Any]]]) -> float:
    """The split-merge arm's (lower) median final log joint: the level every arm's time is measured to.

    The lower median is one of the runs' own finals, so at least half the split-merge runs reach it.
    """
    return float(statistics.median_low([run["log_joint"][-1] for run in runs[SM]]))


def run_metrics(run: dict[str, Any], level: float, reference: dict[str, float]) -> dict[str, Any]:
    """One run's numbers: first times to ``level`` and to the truth's log joint - NEAR_TRUTH, final gap, posteriors.

    The first times are first hits (:func:`experiments.gmm_models.first_time_above`).
    """
    return {
        "to SM final": first_time_above(run["times"], run["log_joint"], level),
        "to truth": first_time_above(run["times"], run["log_joint"], reference["true_log_joint"] - NEAR_TRUTH),
        "final gap": run["log_joint"][-1] - reference["true_log_joint"],
        "sigma ratio": run["posterior"]["E[sigma]"] / reference["true_sigma"],
        "M error": run["posterior"]["E[M]"] - reference["true_M"],
        "right M": run["posterior"]["mode M"] == reference["true_M"],
        **{f"acc {k}": run["acceptance"][k] for k in ("local", "hyper")},
        "transitions": float(run["transitions"]),
    }


def aggregate(label: str, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and counts) over runs of :func:`run_metrics` records."""

    def med(key: str) -> float | None:
        values = [m[key] for m in metrics]
        return None if None in values else median(values)

    def mean(key: str) -> float | None:
        values = [m[key] for m in metrics if m[key] is not None]
        return sum(values) / len(values) if values else None

    return {
        "sampler": label,
        "runs reaching SM final": f"{sum(m['to SM final'] is not None for m in metrics)}/{len(metrics)}",
        "median time to SM final (s)": med("to SM final"),
        f"median time to truth - {NEAR_TRUTH:g} nats (s)": med("to truth"),
        "median final log joint - truth": med("final gap"),
        "median E[sigma] / sigma_true": med("sigma ratio"),
        "median E[M] - M_true": med("M error"),
        "runs with mode M = M_true": f"{sum(m['right M'] for m in metrics)}/{len(metrics)}",
        "local acceptance": mean("acc local"),
        "hyper acceptance": mean("acc hyper"),
        "median transitions": med("transitions"),
    }


def summarize(runs: dict[str, list[dict[str, Any]]], reference: dict[str, float]) -> list[dict[str, Any]]:
    """Per arm on one dataset; the level is the split-merge arm's median final log joint there."""
    level = sm_level(runs)
    return [aggregate(label, [run_metrics(r, level, reference) for r in arm_runs]) for label, arm_runs in runs.items()]


def pooled_summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm over every dataset and run (each run measured against its own dataset's levels)."""
    pooled: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        level = sm_level(result["runs"])
        for label, arm_runs in result["runs"].items():
            pooled.setdefault(label, []).extend(run_metrics(r, level, result["reference"]) for r in arm_runs)
    return [aggregate(label, metrics) for label, metrics in pooled.items()]


def pooled_ratio(pooled: list[dict[str, Any]]) -> float | None:
    """NB's over split-merge's pooled median time to split-merge's final log joint (``None`` if NB misses it)."""
    times = {row["sampler"]: row["median time to SM final (s)"] for row in pooled}
    if times[NB] is None or not times[SM]:
        return None
    return times[NB] / times[SM]


COLORS = {NB: "tab:blue", SM: "tab:orange", NB + FIXED: "tab:cyan", SM + FIXED: "tab:red"}


def plot_traces(results: list[dict[str, Any]], path: Path) -> None:
    """Rows: datasets; columns: log joint - truth, M, sigma against CPU time (every run of every arm)."""
    panels = [("log_joint", "log joint - truth"), ("M", "active mixtures M"), ("sigma", "sigma")]
    fig, axes = plt.subplots(len(results), 3, figsize=(13, 3.0 * len(results)), squeeze=False)
    for row, result in zip(axes, results):
        ref = result["reference"]
        for ax, (key, label) in zip(row, panels):
            for arm, arm_runs in result["runs"].items():
                if key == "sigma" and arm.endswith(FIXED):
                    continue
                for k, run in enumerate(arm_runs):
                    values = run[key]
                    if key == "log_joint":
                        values = [v - ref["true_log_joint"] for v in values]
                    ls = "--" if arm.endswith(FIXED) else "-"
                    ax.step(run["times"], values, where="post", color=COLORS[arm], lw=0.9, ls=ls, alpha=0.85,
                            label=arm if k == 0 else None)  # fmt: skip
            truth = {"log_joint": 0.0, "M": ref["true_M"], "sigma": ref["true_sigma"]}[key]
            ax.axhline(truth, color="k", lw=0.7, ls=":")
            if key == "log_joint":
                lows = [min(r["log_joint"]) - ref["true_log_joint"] for rs in result["runs"].values() for r in rs]
                ax.set_ylim(max(-400.0, min(lows)), 40.0)
            if key == "sigma":
                ax.set_yscale("log")
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlim(left=0.0)
            ax.set_ylabel(label)
            ax.set_title(f"dataset {result['index']}: {label}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("CPU seconds (linear below 1 s)")
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def plot_posteriors(results: list[dict[str, Any]], path: Path) -> None:
    """Second-half draws pooled over runs and datasets: sigma / sigma_true and M - M_true, per compound arm."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for arm in (NB, SM):
        sig, dm = [], []
        for result in results:
            ref = result["reference"]
            for run in result["runs"][arm]:
                half = len(run["times"]) // 2
                sig += [s / ref["true_sigma"] for s in run["sigma"][half:]]
                dm += [a - ref["true_M"] for a in run["M"][half:]]
        axes[0].hist(sig, bins=30, alpha=0.5, color=COLORS[arm], label=arm, density=True)
        values = torch.tensor(dm)
        ks = torch.arange(int(values.min()), int(values.max()) + 1) if len(dm) else torch.zeros(0)
        freq = [float((values == k).float().mean()) for k in ks.tolist()]
        offset = -0.2 if arm == NB else 0.2
        axes[1].bar([k + offset for k in ks.tolist()], freq, 0.4, color=COLORS[arm], label=arm)
    axes[0].axvline(1.0, color="k", lw=0.8, ls=":")
    axes[0].set_xlabel("sigma / sigma_true (second half of each run)")
    axes[1].axvline(0.0, color="k", lw=0.8, ls=":")
    axes[1].set_xlabel("M - M_true (second half of each run)")
    axes[0].legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def warm_up(proposal: NeuralBlockProposal) -> None:
    """A few untimed transitions of both local kernels, so one-off costs (lazy imports) stay out of the timings."""
    priors = HyperPriors()
    data = synthetic_dataset(0, 4, 10, 2)
    for kind in ("nb", "sm"):
        kernel = compound_sampler(kind, 4, proposal, local_steps=1)
        run_chain(kernel, (data["points"], 4, priors), prior_start(0, 4, priors), transitions=3)


def write_markdown(folder: Path, record: dict[str, Any]) -> None:
    """``gmm_hyper.md``: the setup, the pooled and per-dataset tables, the figures."""
    cfg, pooled, ratio = record["config"], record["pooled"], record["pooled_ratio"]
    rows = [{"dataset": r["index"], **row} for r in record["results"] for row in r["summary"]]
    verdict = "never (some NB run did not reach it)" if ratio is None else f"{ratio:.3f}"
    intro = (
        f"m={cfg['mixtures']} candidate mixtures, n={cfg['points']} points, M_true={cfg['true_active']}, "
        f"sigma_true={cfg['true_sigma']:g} (unknown to the sampler: LogNormal(0, 0.5) prior; p ~ Beta(2, 2); "
        f"tau={HyperPriors().tau:g} known). {cfg['datasets']} datasets x {cfg['runs']} runs per arm (own prior "
        f"start per run, shared by the arms), {cfg['seconds']:g} CPU s of transitions per run (setup and records "
        f"not counted), {cfg['local_steps']} local sweeps per random-walk MH sweep of (sigma, p), {cfg['warmup']} "
        f"warmup transitions, gibbs_prob={cfg['gibbs_prob']}. `time to SM final` = first time a run's log joint "
        "reaches the split-merge arm's (lower) median final log joint on that dataset; E[sigma], E[M]: second "
        f"half of each run (median over runs). Rows marked '{FIXED.strip()}' ({cfg['fixed_runs']} run(s) per "
        "dataset) sample (mu, v) at the true sigma and p = M_true / m, one local sweep per transition. Local "
        "acceptance: gmm_pair blocks (NB) or all split/merge/birth/death moves (split-merge), single-site sweeps "
        "excluded."
    )
    pooled_text = markdown_table(pooled, list(pooled[0])) + (
        f"\n\nNB reaches split-merge's final log joint in {verdict} times the split-merge arm's own median time "
        "(pooled medians)."
    )
    figures = "![traces](gmm_hyper_traces.png)\n\n![posteriors](gmm_hyper_posteriors.png)"
    per_dataset = (
        f"{markdown_table(rows, list(rows[0]))}\n\nFull run: {record['wall_seconds']:.0f} s wall time.\n\n{figures}"
    )
    title = "Open-universe GMM with unknown hyper-parameters: NB(gmm_pair) vs split-merge, both + hyper-MH"
    sections = [("Pooled over datasets and runs", pooled_text), ("Per dataset", per_dataset)]
    write_sections(folder, "gmm_hyper.md", title, sections, intro)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args, priors=asdict(HyperPriors()))
    proposal = load_proposal_or_untrained(args.proposal, args.quick)
    warm_up(proposal)
    wall = CLOCKS["wall"]()
    with tqdm(total=args.datasets * 2 * (args.runs + args.fixed_runs), desc="GMM hyper runs") as bar:
        results = [study_dataset(i, args, proposal, bar) for i in range(args.datasets)]
    pooled = pooled_summary(results)
    record = {
        "config": config,
        "results": results,
        "pooled": pooled,
        "pooled_ratio": pooled_ratio(pooled),
        "wall_seconds": CLOCKS["wall"]() - wall,
    }
    write_json(folder / "gmm_hyper.json", record)
    plot_traces(results, folder / "gmm_hyper_traces.png")
    plot_posteriors(results, folder / "gmm_hyper_posteriors.png")
    write_markdown(folder, record)
    return record


if __name__ == "__main__":
    main()
