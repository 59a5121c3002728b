"""Pair proposals at the states a sampler reaches: the shipped network against data-refined candidates (#27).

A design study for the n = 1000 cases where ``NB(set) + Gibbs`` still trails split-merge
(``experiments.gmm_scale``: a cluster of 500-770 points that the model's posterior explains with
several copies of one mixture). For each case (``--cases``, held-out ``family_gmm`` cases), the
``NB(set) + Gibbs`` kernel with the network alone (the release before the candidates) runs
``--seconds`` of CPU time from the benchmark's starts; at the states it reaches, every pair of every
chain is scored at the unchanged state with ``--draws`` proposals from each variant:

* ``network``: the shipped proposal ``q(B | C)`` as the kernel uses it;
* ``refined``: a candidate mixture built from the network's components: for each component and each of
  the four activity patterns of the pair, the active means take ``--em-steps`` EM steps on the points
  (the other mixtures' share of each point, ``E_j``, held fixed) and a Gaussian of precision
  ``sum_j r_j^2`` (the points' information about a mean that shares them) plus the prior's; an inactive
  mean is drawn from its prior, its exact conditional. Each candidate is weighted by its Laplace
  mass ``p(m*, v | C) |2 pi S*|^(1/2)`` (the target at the refined means);
* ``refined + copies``: the same, plus candidates that put one mean of the pair on another active
  mixture of ``C`` (a copy) and the other on the network's most probable component;
* ``shipped``: the candidates of the compiled sweep (:func:`~neuralblock.kernels.jit_mixture.pair_candidates`
  with the default :class:`~neuralblock.kernels.jit_mixture.CandidateOptions`), the cheaper design that
  ``refined + copies`` led to: network components of weight at least 0.05, one copy location per group of
  other means closer than 0.5 (whitened), one EM step, every ``ceil(n / 256)``-th point.

The candidate variants are mixed with the network (weight ``--network-share``), so they never
lose its moves. Every candidate is a function of the conditioning set alone, so any of them is an
exact MH proposal. Reported per case and variant: the MH acceptance (mean over pairs; by the
number of active mixtures in the pair), the expected births and deaths per sweep (sum over pairs of
the acceptance of the proposals that add or remove an active mixture) and the candidates per pair
(the cost: each takes ``em_steps + 1`` passes over the points, ``shipped`` over at most 256 of them).

Usage::

    python -m experiments.gmm_pair_candidates --quick
    python -m experiments.gmm_pair_candidates
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from tqdm import tqdm

from experiments.common import (
    add_numbers,
    add_run_options,
    open_study,
    parse_quick,
    pyplot,
    study_parser,
    write_sections,
)
from experiments.gmm_models import family_gmm
from experiments.gmm_scale import load_gmm_proposal
from neuralblock import NeuralBlockKernel
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.kernels.base import sequential_init
from neuralblock.kernels.fused_mixture import FusedMixtureSweep, mixture_layout, pair_context, step_constants
from neuralblock.kernels.jit_mixture import pair_candidates

VARIANTS = ("network", "refined", "refined + copies", "shipped")
PATTERNS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # the pair's activity patterns
DEFAULT_CASES = ["16,1000,scaled,4", "12,1000,unequal,0", "20,1000,unequal,4"]  # gmm_scale's n = 1000 misses


class PairTerms(NamedTuple):
    """What a pair's target reads from its conditioning set, in whitened coordinates.

    Attributes:
        points: ``[n, D]`` the points; ``rest``: ``[n]`` ``log E_j`` (the other mixtures' share).
        count: the other mixtures' number of active ones; ``log_odds``: ``[2]`` the pair's bits' prior
            log odds; ``prior_precision``: ``(sigma / tau)^2``, the means' prior precision.
    """

    points: Tensor
    rest: Tensor
    count: Tensor
    log_odds: Tensor
    prior_precision: float


class Candidates(NamedTuple):
    """A Gaussian mixture over pair blocks: ``S`` candidates with their activity pattern.

    Attributes:
        log_weights: ``[S]`` (normalized); ``means``: ``[S, 2 D]``; ``log_sd``: ``[S, 2]`` one per mean;
        bits: ``[S, 2]``.
    """

    log_weights: Tensor
    means: Tensor
    log_sd: Tensor
    bits: Tensor


def pair_log_target(u_i: Tensor, u_j: Tensor, v_i: Tensor, v_j: Tensor, terms: PairTerms) -> Tensor:
    """``log p(B | C)`` up to a constant for whitened means ``u [..., D]`` and bits ``v [...]``.

    Example:
        >>> terms = PairTerms(torch.zeros(3, 2), torch.full((3,), -30.0), torch.tensor(1.0), torch.zeros(2), 0.04)
        >>> near = pair_log_target(torch.zeros(2), torch.zeros(2), torch.tensor(1.0), torch.tensor(0.0), terms)
        >>> far = pair_log_target(torch.full((2,), 3.0), torch.zeros(2), torch.tensor(1.0), torch.tensor(0.0), terms)
        >>> bool(near > far)
        True
    """
    points = terms.points
    a_i = torch.log(v_i)[..., None] - 0.5 * (points - u_i[..., None, :]).square().sum(-1)
    a_j = torch.log(v_j)[..., None] - 0.5 * (points - u_j[..., None, :]).square().sum(-1)
    fit = torch.logsumexp(torch.stack(torch.broadcast_tensors(terms.rest, a_i, a_j)), 0).sum(-1)
    count = terms.count + v_i + v_j
    prior = v_i * terms.log_odds[0] + v_j * terms.log_odds[1]
    prior = prior - 0.5 * terms.prior_precision * (u_i.square().sum(-1) + u_j.square().sum(-1))
    value = fit - points.shape[0] * torch.log(count.clamp(min=1.0)) + prior
    return torch.where(count > 0, value, -math.inf)


def refine(u_i: Tensor, u_j: Tensor, bits: Tensor, terms: PairTerms, em_steps: int) -> Candidates:
    """Candidates from starting means ``u [S, D]`` and patterns ``bits [S, 2]``, weighted by Laplace mass."""
    points, pp = terms.points, terms.prior_precision
    v_i, v_j = bits[:, 0], bits[:, 1]
    precision = [torch.full_like(v_i, pp), torch.full_like(v_j, pp)]
    means = [u_i.clone(), u_j.clone()]
    for _ in range(em_steps):
        logits = [torch.log(v)[:, None] - 0.5 * (points - u[:, None]).square().sum(-1) for v, u in zip(bits.T, means)]
        total = torch.logsumexp(torch.stack(torch.broadcast_tensors(terms.rest, *logits)), 0)
        for h, logit in enumerate(logits):
            share = torch.exp(logit - total)  # [S, n] responsibilities (0 for an inactive mean)
            active = bits[:, h] > 0
            means[h] = torch.where(active[:, None], (share @ points) / (share.sum(-1) + pp)[:, None], 0.0)
            precision[h] = torch.where(active, share.square().sum(-1) + pp, pp)
    log_sd = -0.5 * torch.log(torch.stack(precision, -1))
    mass = pair_log_target(means[0], means[1], v_i, v_j, terms) + means[0].shape[-1] * (
        log_sd.sum(-1) + math.log(2 * math.pi)
    )
    log_weights = torch.log_softmax(torch.nan_to_num(mass, nan=-math.inf), 0)
    return Candidates(log_weights, torch.cat(means, -1), log_sd, bits)


def candidate_mixture(
    network: tuple[Tensor, Tensor, Tensor, Tensor], terms: PairTerms, em_steps: int, copies: Tensor | None
) -> Candidates:
    """The ``refined`` candidates of one pair (``copies [c, D]``: also copies of these means, ``refined + copies``).

    ``network`` is one pair's ``(log weights [K], discrete log probs [K, 2, 2], loc [K, 2 D], log scale [K, 2 D])``.
    """
    log_w, _, loc, _ = network
    components, dim = loc.shape[0], loc.shape[1] // 2
    u_i = loc[:, :dim].repeat_interleave(4, 0)
    u_j = loc[:, dim:].repeat_interleave(4, 0)
    bits = PATTERNS.to(loc.dtype).repeat(components, 1)
    if copies is not None and len(copies):
        top = int(log_w.argmax())
        count = copies.shape[0]
        copy_i = torch.cat([copies, loc[top, :dim].expand(count, dim)]).repeat_interleave(4, 0)
        copy_j = torch.cat([loc[top, dim:].expand(count, dim), copies]).repeat_interleave(4, 0)
        u_i, u_j = torch.cat([u_i, copy_i]), torch.cat([u_j, copy_j])
        bits = torch.cat([bits, PATTERNS.to(loc.dtype).repeat(2 * count, 1)])
    return refine(u_i, u_j, bits, terms, em_steps)


def _gaussian(x: Tensor, mean: Tensor, log_sd: Tensor) -> Tensor:
    """Isotropic Gaussian log density over the last dimension (``log_sd`` one per row)."""
    dim = x.shape[-1]
    return -0.5 * ((x - mean) / log_sd.exp()[..., None]).square().sum(-1) - dim * (log_sd + 0.5 * math.log(2 * math.pi))


def _split(block: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A whitened block ``[..., 2 D + 2]`` as ``(u_i, u_j, bits [..., 2])``."""
    dim = (block.shape[-1] - 2) // 2
    return block[..., :dim], block[..., dim + 1 : 2 * dim + 1], block[..., [dim, 2 * dim + 1]]


def candidates_log_q(candidates: Candidates, block: Tensor) -> Tensor:
    """``log q(block)`` of :class:`Candidates` for blocks ``[R, 2 D + 2]``."""
    u_i, u_j, bits = _split(block)
    match = (candidates.bits[None] == bits[:, None]).all(-1)  # [R, S]
    comp = _gaussian(u_i[:, None], candidates.means[:, : u_i.shape[-1]], candidates.log_sd[:, 0])
    comp = comp + _gaussian(u_j[:, None], candidates.means[:, u_i.shape[-1] :], candidates.log_sd[:, 1])
    return torch.logsumexp(torch.where(match, candidates.log_weights + comp, -math.inf), -1)


def sample_candidates(candidates: Candidates, draws: int, generator: torch.Generator) -> Tensor:
    """``draws`` whitened blocks ``[R, 2 D + 2]`` from :class:`Candidates`."""
    pick = torch.multinomial(candidates.log_weights.exp(), draws, replacement=True, generator=generator)
    dim = candidates.means.shape[-1] // 2
    sd = candidates.log_sd[pick].exp().repeat_interleave(dim, -1)
    means = candidates.means[pick] + sd * torch.randn(draws, 2 * dim, generator=generator, dtype=sd.dtype)
    bits = candidates.bits[pick]
    return torch.cat([means[:, :dim], bits[:, :1], means[:, dim:], bits[:, 1:]], -1)


def network_log_q(network: tuple[Tensor, Tensor, Tensor, Tensor], block: Tensor) -> Tensor:
    """The network mixture's ``log q(block)`` for whitened blocks ``[R, 2 D + 2]`` (as ``BlockMixture.log_prob``)."""
    log_w, disc, loc, log_scale = network
    u_i, u_j, bits = _split(block)
    dim = u_i.shape[-1]
    chosen = disc[:, 0, :].T[bits[:, 0].long()] + disc[:, 1, :].T[bits[:, 1].long()]  # [R, K]
    cont = torch.cat([u_i, u_j], -1)[:, None]
    z = (cont - loc) * torch.exp(-log_scale)
    comp = -0.5 * z.square().sum(-1) - log_scale.sum(-1) - dim * math.log(2 * math.pi)
    return torch.logsumexp(log_w + chosen + comp, -1)


def sample_network(network: tuple[Tensor, Tensor, Tensor, Tensor], draws: int, generator: torch.Generator) -> Tensor:
    """``draws`` whitened blocks from the network mixture of one pair."""
    log_w, disc, loc, log_scale = network
    pick = torch.multinomial(log_w.exp(), draws, replacement=True, generator=generator)
    bits = torch.stack([torch.multinomial(disc[pick, h].exp(), 1, generator=generator)[:, 0] for h in (0, 1)], -1)
    dim = loc.shape[-1] // 2
    means = loc[pick] + log_scale[pick].exp() * torch.randn(draws, 2 * dim, generator=generator, dtype=loc.dtype)
    bits = bits.to(loc.dtype)
    return torch.cat([means[:, :dim], bits[:, :1], means[:, dim:], bits[:, 1:]], -1)


def shipped_candidates(network: tuple[Tensor, Tensor, Tensor, Tensor], terms: PairTerms, copies: Tensor) -> Candidates:
    """The compiled sweep's candidates of one pair (:func:`~neuralblock.kernels.jit_mixture.pair_candidates`)."""
    log_w, _, loc, _ = network
    bits, means, log_sd, weights = pair_candidates(
        terms.points.numpy(),
        terms.rest.numpy(),
        float(terms.count),
        (float(terms.log_odds[0]), float(terms.log_odds[1])),
        terms.prior_precision,
        log_w.numpy(),
        loc.numpy(),
        copies.numpy(),
    )
    as_tensor = torch.from_numpy
    return Candidates(as_tensor(weights), as_tensor(means), as_tensor(log_sd), as_tensor(bits).to(torch.float64))


def propose(
    variant: str,
    network: tuple[Tensor, Tensor, Tensor, Tensor],
    terms: PairTerms,
    current: Tensor,
    copies: Tensor,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, int]:
    """``--draws`` whitened blocks from a variant's proposal at ``current``, their MH log ratios, its candidates."""
    share, draws = args.network_share, args.draws
    if variant == "network":
        blocks = sample_network(network, draws, generator)
        log_q_new, log_q_cur, size = network_log_q(network, blocks), network_log_q(network, current[None]), 0
    else:
        if variant == "shipped":
            mixture = shipped_candidates(network, terms, copies)
        else:
            mixture = candidate_mixture(network, terms, args.em_steps, None if variant == "refined" else copies)
        from_network = torch.rand(draws, generator=generator) < share
        blocks = torch.where(
            from_network[:, None],
            sample_network(network, draws, generator),
            sample_candidates(mixture, draws, generator),
        )

        def log_q(value: Tensor) -> Tensor:
            from_net = math.log(share) + network_log_q(network, value)
            return torch.logaddexp(from_net, math.log1p(-share) + candidates_log_q(mixture, value))

        log_q_new, log_q_cur, size = log_q(blocks), log_q(current[None]), len(mixture.log_weights)
    new_i, new_j, new_bits = _split(blocks)
    cur_i, cur_j, cur_bits = _split(current[None])
    log_p_new = pair_log_target(new_i, new_j, new_bits[:, 0], new_bits[:, 1], terms)
    log_p_current = pair_log_target(cur_i, cur_j, cur_bits[:, 0], cur_bits[:, 1], terms)
    return blocks, log_p_new - log_p_current + log_q_cur - log_q_new, size


def score_pair(
    network: tuple[Tensor, Tensor, Tensor, Tensor],
    terms: PairTerms,
    current: Tensor,
    copies: Tensor,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> dict[str, tuple[float, float, float, int]]:
    """Per variant: mean MH acceptance, births and deaths (acceptance-weighted) and candidates, at ``current``."""
    out = {}
    for variant in VARIANTS:
        blocks, log_alpha, size = propose(variant, network, terms, current, copies, args, generator)
        accept = torch.exp(log_alpha.clamp(max=0.0)).nan_to_num(0.0)
        change = _split(blocks)[2].sum(-1) - _split(current[None])[2].sum(-1)
        out[variant] = (
            float(accept.mean()),
            float((accept * (change > 0)).mean()),
            float((accept * (change < 0)).mean()),
            size,
        )
    return out


def reach_states(fg: Any, proposal: Any, start: Tensor, seconds: float) -> tuple[Tensor, int]:
    """The states of ``NB(set) + Gibbs`` with the network alone (no candidates) after ``seconds`` of CPU time."""
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.5, chains=start.shape[0])
    kernel.initial_params = {"x": start.clone()}
    kernel.setup(0)
    for sweep in kernel.fused:
        if isinstance(sweep, FusedMixtureSweep):
            sweep.candidates = None
    params, sweeps, began = {"x": start.clone()}, 0, time.process_time()
    while time.process_time() - began < seconds:
        params, sweeps = kernel.sample(params), sweeps + 1
    return params["x"], sweeps


class PairSetting(NamedTuple):
    """One GMM case as the pair moves read it: its layout, constants and the network."""

    layout: Any
    constants: Any
    proposal: Any


def pair_inputs(setting: PairSetting, state: Tensor, slots: Tensor) -> tuple[Any, list[Tensor]]:
    """The contexts and the network's mixture parts ``(log w, disc, loc, log scale)`` of pairs ``slots [K, w]``."""
    layout, constants, proposal = setting
    context = pair_context(state, layout, slots, constants)
    points = constants.points
    features = proposal.motif.features(
        points.expand(*slots.shape, *points.shape),
        constants.point_mask,
        context.u_others,
        context.v_others,
        constants.psi,
        context.rest_lse,
    )
    with torch.no_grad():
        q = proposal(features.to(proposal.dtype))
    if q.discrete_log_probs is None or q.loc is None or q.log_scale is None:
        raise ValueError("a gmm_pair_set proposal's mixture has bits and means in every component")
    return context, [t.double() for t in (q.mixture_log_weights, q.discrete_log_probs, q.loc, q.log_scale)]


def pair_terms(setting: PairSetting, context: Any, pair: int) -> tuple[PairTerms, Tensor]:
    """The :class:`PairTerms` of layout pair ``pair`` (one chain, pairs in layout order) and the other active means."""
    layout, constants, _ = setting
    terms = PairTerms(
        constants.points,
        context.rest_lse[0, pair],
        context.v_others[0, pair].sum(),
        constants.log_odds[layout.pairs[pair]],
        (layout.sigma / layout.tau) ** 2,
    )
    return terms, context.u_others[0, pair][context.v_others[0, pair] > 0]


def setting_of(fg: Any, proposal: Any) -> PairSetting:
    """The :class:`PairSetting` of graph ``fg`` (float64)."""
    layout = mixture_layout(fg, proposal.motif, proposal.motif.find_instances(fg))
    return PairSetting(layout, step_constants(layout, torch.float64), proposal)


def score_case(spec: str, proposal: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows (one per chain and variant) of one case ``"m,n,family,seed"``."""
    m, n, family, seed = _parse_case(spec)
    fg, _, reference = family_gmm(family, m, n, seed)
    torch.manual_seed(reference["seed"])
    start = sequential_init(fg, torch.Generator().manual_seed(reference["seed"]), chains=args.chains)
    states, sweeps = reach_states(fg, proposal, start, args.seconds)
    setting = setting_of(fg, proposal)
    layout, constants = setting.layout, setting.constants
    pairs = len(layout.pairs)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for chain in range(states.shape[0]):
        state = states[chain : chain + 1].double()
        context, parts = pair_inputs(setting, state, torch.arange(pairs)[None])
        current = (state[0][layout.block_ids] - constants.loc) / constants.scale  # [P, b] whitened
        bits = state[0][layout.active_ids]
        pair_active = (bits[layout.pairs[:, 0]] + bits[layout.pairs[:, 1]]).long()
        scores = []
        for p in range(pairs):
            terms, copies = pair_terms(setting, context, p)
            network = (parts[0][0, p], parts[1][0, p], parts[2][0, p], parts[3][0, p])
            scores.append(score_pair(network, terms, current[p], copies, args, generator))
        for variant in VARIANTS:
            accept = torch.tensor([s[variant][0] for s in scores])
            row: dict[str, Any] = {
                "case": spec,
                "chain": chain,
                "M": int(bits.sum()),
                "sweeps": sweeps,
                "variant": variant,
                "acceptance": float(accept.mean()),
            }
            for active in (0, 1, 2):
                chosen = pair_active == active
                row[f"acceptance, {active} active"] = float(accept[chosen].mean()) if bool(chosen.any()) else None
            row["births per sweep"] = sum(s[variant][1] for s in scores)
            row["deaths per sweep"] = sum(s[variant][2] for s in scores)
            row["candidates per pair"] = sum(s[variant][3] for s in scores) / pairs
            rows.append(row)
    return rows


def _parse_case(spec: str) -> tuple[int, int, str, int]:
    """``"m,n,family,seed"`` as numbers and a family name (a clear error for anything else)."""
    parts = spec.split(",")
    if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit() and parts[3].isdigit()):
        raise ValueError(f"a case is 'm,n,family,seed' (e.g. 16,1000,scaled,4), got {spec!r}")
    return int(parts[0]), int(parts[1]), parts[2], int(parts[3])


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and variant, the chains' means."""
    keys = [k for k in rows[0] if k not in ("case", "chain", "variant", "sweeps")]
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        for variant in VARIANTS:
            mine = [r for r in rows if r["case"] == case and r["variant"] == variant]
            entry: dict[str, Any] = {"case": case, "variant": variant, "chains": len(mine)}
            for key in keys:
                values = [r[key] for r in mine if r[key] is not None]
                entry[key] = sum(values) / len(values) if values else None
            out.append(entry)
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """Acceptance by the pair's active mixtures and births per sweep, per case (bars per variant)."""
    plt = pyplot()
    cases = list(dict.fromkeys(r["case"] for r in summary))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / len(VARIANTS)
    for v, variant in enumerate(VARIANTS):
        mine = [r for r in summary if r["variant"] == variant]
        for c, row in enumerate(mine):
            for a in (0, 1, 2):
                value = row[f"acceptance, {a} active"] or 0.0
                axes[0].bar(c * 3 + a + v * width, value, width, color=f"C{v}", label=variant if c + a == 0 else None)
            axes[1].bar(c + v * width, max(row["births per sweep"], 1e-3), width, color=f"C{v}")
    axes[0].set_xticks([c * 3 + a + 0.4 for c in range(len(cases)) for a in (0, 1, 2)])
    axes[0].set_xticklabels([f"{a}" for _ in cases for a in (0, 1, 2)], fontsize=7)
    axes[0].set_xlabel("active mixtures in the pair, case by case: " + " | ".join(cases), fontsize=7)
    axes[0].set_ylabel("MH acceptance")
    axes[0].legend(fontsize=7)
    axes[1].set_xticks([c + 0.4 for c in range(len(cases))])
    axes[1].set_xticklabels(cases, fontsize=7)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("expected births per sweep")
    save_figure(fig, path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--proposal", default="gmm_pair_copies", help="shipped gmm_pair_set proposal or file")
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="held-out cases 'm,n,family,seed'")
    add_numbers(
        parser,
        seconds=(15.0, "CPU seconds of NB(set) + Gibbs before the states are scored"),
        chains=(5, "vectorized chains (the benchmark's starts)"),
        draws=(64, "proposals per pair and variant"),
        em_steps=(2, "EM steps of each candidate"),
        network_share=(0.1, "the network's weight in the candidate variants"),
    )
    add_run_options(parser, "experiments/results/gmm_pair_candidates", "CI scale (an untrained proposal)")
    args = parse_quick(
        parser,
        argv,
        {"cases": ["6,60,unequal,0"], "seconds": 0.5, "chains": 2, "draws": 8},
    )
    args.chains, args.draws, args.em_steps = int(args.chains), int(args.draws), int(args.em_steps)
    if args.chains < 1 or args.draws < 1 or args.em_steps < 1 or not 0.0 < args.network_share < 1.0:
        parser.error("--chains, --draws and --em-steps must be at least 1 and --network-share in (0, 1)")
    for spec in args.cases:
        _parse_case(spec)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args)
    proposal, source = load_gmm_proposal(args.proposal, args.quick)
    if proposal.motif.name != "gmm_pair_set":
        raise ValueError(f"--proposal must be a gmm_pair_set proposal, got motif {proposal.motif.name!r}")
    rows = [row for spec in tqdm(args.cases, desc="cases") for row in score_case(spec, proposal, args)]
    summary = summarize(rows)
    write_json(folder / "gmm_pair_candidates.json", {"config": config, "source": source, "rows": rows})
    plot(summary, folder / "gmm_pair_candidates.png")
    intro = (
        f"Proposal `{args.proposal}` ({source}); per case, {args.chains} chains of NB(set) + Gibbs ran "
        f"{args.seconds} CPU s from gmm_scale's starts; every pair scored at the reached state with {args.draws} "
        f"proposals per variant ({args.em_steps} EM steps; network share {args.network_share} in the candidate "
        "variants). Acceptance: exact MH ratio against the pair's conditional; births / deaths: expected "
        "accepted moves per sweep that add / remove an active mixture (all pairs at the unchanged state)."
    )
    write_sections(
        folder,
        "gmm_pair_candidates.md",
        "Pair proposals at reached states: network vs data-refined candidates",
        [
            ("Per case and variant (chain means)", markdown_table(summary, list(summary[0]))),
            ("Per chain", markdown_table(rows, list(rows[0]))),
        ],
        intro,
    )
    return {"config": config, "summary": summary, "folder": str(folder)}


if __name__ == "__main__":
    main()
