"""The sampled fused path (crf_tags blocks of more than 512 joint values): exact chains, its proposal, its cache.

Statistical tests compare each variable's and each neighbouring pair's visit frequencies with the exact
marginals (enumeration) by batch-means z-scores over vectorized chains (20 batches each) with a Bonferroni t
threshold: false-failure rate at most 1e-3 per test over random seeds.
"""

from __future__ import annotations

import pytest
import torch
from _stats import bonferroni_t, enumerate_joint  # tests/ is on sys.path under pytest
from scipy.stats import chi2
from test_vectorized_chains import run, zero_safe

from motifs.crf import load_crf
from motifs.crf_tags import CrfTagsMotif
from neuralblock import NeuralBlockKernel, load_pretrained
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.fused_blocks import BlockTable
from neuralblock.kernels.fused_sampled import FusedSampledSweep, draw_blocks, score_blocks, supports_fused_sampled
from neuralblock.motif import MotifInstances
from neuralblock.proposals import NeuralBlockProposal
from neuralblock.proposals.mdn import BlockMixture

ALPHA = 1e-3
BATCHES = 20
TOKENS = ["Just", "saw", "Taylor", "Swift", "!"]
CPU = torch.device("cpu")


def pair_indicators(x: torch.Tensor, k: int) -> torch.Tensor:
    """``[..., n]`` tags -> one-hot of every variable's tag and of every neighbouring pair's tags."""
    single = torch.nn.functional.one_hot(x.long(), k).flatten(-2)
    pairs = torch.nn.functional.one_hot(x[..., :-1].long() * k + x[..., 1:].long(), k * k).flatten(-2)
    return torch.cat([single, pairs], -1).double()


def assert_marginals(draws: torch.Tensor, fg, k: int) -> None:
    states, probs = enumerate_joint(fg)
    exact = (pair_indicators(states, k) * probs[:, None]).sum(0)
    mean, mcse = batch_means_mcse(pair_indicators(draws, k), BATCHES)
    iid = (exact * (1 - exact) / (draws.shape[0] * draws.shape[1])).sqrt()
    z = zero_safe((mean - exact) / torch.maximum(mcse, iid).clamp_min(1e-12), mean, exact)
    limit = bonferroni_t(len(exact), draws.shape[0] * BATCHES - 1, ALPHA)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f} > {limit:.2f}"


def sharpened(proposal: NeuralBlockProposal, power: float) -> NeuralBlockProposal:
    """The proposal with every categorical raised to ``power`` (flatter below 1, sharper above): far from the
    conditional, so the MH correction carries the chain."""
    plain = proposal.forward

    def forward(features: torch.Tensor) -> BlockMixture:
        q = plain(features)
        assert q.discrete_log_probs is not None
        return BlockMixture(q.mixture_log_weights, q.discrete_log_probs * power, None, None, q.cardinalities)

    proposal.forward = forward  # type: ignore[method-assign]
    return proposal


@pytest.mark.parametrize(("tags", "words"), [(3, 4), (4, 5)])
def test_the_sampled_path_leaves_the_crf_posterior_invariant(tags: int, words: int) -> None:
    """Neural blocks only (no Gibbs half), so every move is the sampled path's, from a flattened proposal (the
    pretrained one accepts 99.5%: it would hide a wrong energy, e.g. one without the boundary factors, which this
    test catches). (A sharpened proposal, power > 1, is lighter-tailed than the conditional: an independence-type
    chain then sticks in rare values and is not geometrically ergodic, so batch means cannot judge it; the general
    path fails such a test the same way.)"""
    fg = load_crf().sentence_graph(TOKENS[:words])
    torch.manual_seed(tags + 10 * words)
    proposal = sharpened(load_pretrained(f"crf_tags-{tags}"), 0.3)
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.0, chains=48)
    draws = run(kernel, 1500)
    diagnostics = kernel.diagnostics()
    assert isinstance(kernel.fused[0], FusedSampledSweep) and diagnostics["fused"][proposal.motif.name]
    assert 0.2 < diagnostics["acceptance_by_proposal"][proposal.motif.name] < 0.9
    assert_marginals(draws, fg, 13)


def test_blocks_are_drawn_with_the_probabilities_they_are_scored_with() -> None:
    fg = load_crf().sentence_graph(TOKENS[:4])
    proposal = sharpened(load_pretrained("crf_tags-3"), 0.3)
    sweep = FusedSampledSweep(fg, proposal, proposal.motif.find_instances(fg), torch.tensor([0, 1, 2]), CPU)
    state = torch.zeros(1, fg.num_variables)
    cache = sweep.cache
    slots = cache.ensure(fg, sweep.class_instances[0], cache.keys(state, sweep.rows[0]), state)
    values = CrfTagsMotif(tags=3).block_spec.enumerate().long()  # all 2197 joint values
    log_q = score_blocks(cache, slots, values[None, None])[0, 0]
    assert abs(float(torch.logsumexp(log_q.double(), 0))) < 1e-5  # a distribution over the joint values
    draws = 200_000
    drawn = draw_blocks(
        cache, slots.expand(draws, 1), torch.rand(draws, 1, 4, generator=torch.Generator().manual_seed(0))
    )
    counts = torch.bincount((drawn[:, 0] * torch.tensor([169, 13, 1])).sum(-1), minlength=2197).double()
    expected = log_q.double().exp() * draws
    keep = expected >= 5
    stat = float((((counts - expected) ** 2) / expected)[keep].sum())
    dof = int(keep.sum()) - 1
    assert chi2.sf(stat, dof) > 1e-4, (stat, dof)
    assert float(counts[~keep].sum()) <= max(5.0, 3 * float(expected[~keep].sum()) + 5)


def test_the_cache_recomputes_rows_after_evictions_and_follows_new_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    fg = load_crf().sentence_graph(TOKENS)
    proposal = load_pretrained("crf_tags-3")
    instances = proposal.motif.find_instances(fg)
    offsets = torch.arange(len(instances) + 1)
    state = torch.randint(13, (4, fg.num_variables)).float()
    full = FusedSampledSweep(fg, proposal, instances, offsets, CPU)
    full.cache.ensure(fg, full.class_instances[0], full.cache.keys(state, full.rows[0]), state)  # all the room
    monkeypatch.setattr("neuralblock.kernels.fused_sampled._MAX_CACHE_FLOATS", 4 * 2 * (16 + 16 * 3 * 13))
    small = FusedSampledSweep(fg, proposal, instances, offsets, CPU)  # 4 keys of room
    grid = 2.0**-24
    for c in range(len(instances)):
        keys = full.cache.keys(state, full.rows[c])
        want_slots = full.cache.ensure(fg, full.class_instances[c], keys, state)  # (storage is allocated lazily)
        got_slots = small.cache.ensure(fg, small.class_instances[c], keys, state)
        # the same rows up to the network's batched float32 rounding: a few units of the CDF grid
        gap = (small.cache.var_cdf[got_slots] - full.cache.var_cdf[want_slots]).abs().max()
        assert float(gap) <= 8 * grid
    assert small.cache.evictions > 0 and full.cache.evictions == 0
    # new parameters: after refresh the sweep is the one a sweep built on the new graph makes
    new = load_crf().sentence_graph(TOKENS)
    for group in new.groups:
        group.log_tables.mul_(0.5)
    monkeypatch.undo()
    new_instances = proposal.motif.find_instances(new)  # the same windows, the new potentials as features
    fresh = FusedSampledSweep(new, proposal, new_instances, offsets, CPU)
    full.refresh(new, new_instances)
    assert full.cache.used == 0
    for sweep in (full, fresh):
        torch.manual_seed(0)
        sweep.out = sweep.sweep(new, state)[0]
    assert torch.equal(full.out, fresh.out)
    torch.manual_seed(0)
    assert not torch.equal(FusedSampledSweep(fg, proposal, instances, offsets, CPU).sweep(fg, state)[0], fresh.out)


def test_a_context_holding_a_block_variable_takes_neither_fused_path() -> None:
    """The reverse proposal must read the key the forward one read: a block variable in the context would change it."""
    fg = load_crf().sentence_graph(TOKENS[:5])
    proposal = load_pretrained("crf_tags-3")
    instances = proposal.motif.find_instances(fg)
    assert supports_fused_sampled(fg, proposal, instances)
    context = torch.cat([instances.context, instances.blocks[:, :1]], 1)  # the blanket plus a block variable
    leaky = MotifInstances(instances.blocks, context, instances.params, instances.extra)
    assert not supports_fused_sampled(fg, proposal, leaky)
    assert not BlockTable.fits(fg, leaky, [13, 13, 13])


def test_covers_are_refused_on_the_sampled_path_and_left_out_by_auto() -> None:
    """cover=True names the path; cover='auto' (ReplicaExchange's default) updates every instance there."""
    from neuralblock import ReplicaExchange

    fg = load_crf().sentence_graph(TOKENS[:5])
    proposal = load_pretrained("crf_tags-3")
    with pytest.raises(ValueError, match="FusedSampledSweep"):
        NeuralBlockKernel(fg, proposals=[proposal], cover=True).setup(0)
    kernel = NeuralBlockKernel(fg, proposals=[proposal], cover="auto")
    kernel.setup(0)
    assert isinstance(kernel.fused[0], FusedSampledSweep) and len(kernel.cover_classes[0]) == 1
    replicas = ReplicaExchange(fg, [proposal], replicas=2, chains=2)
    replicas.setup(0)
    replicas.sample(replicas.initial_params)
