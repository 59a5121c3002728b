"""Tests of the ``crf_tags`` motif (motifs/crf_tags.py) on sentence graphs of the shipped WNUT-17 CRF."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

import motifs
from motifs.crf import load_crf, read_conll
from motifs.crf_tags import CrfTagsMotif
from neuralblock.graph import FactorGraph
from neuralblock.io import data_path
from neuralblock.motif import get_motif

TOKENS = ["Just", "saw", "Taylor", "Swift", "at", "Madison", "Square", "Garden", "!"]


@pytest.fixture(scope="module")
def crf():
    return load_crf()


@pytest.fixture(scope="module")
def train_tokens():
    return [t for t, _ in read_conll(data_path("ner_wnut17", "wnut17train.conll"))]


def _brute_conditional(fg: FactorGraph, block: list[int], state: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """log p(B | rest) of every enumerated block value, from fg.log_joint: ``[S, K]``."""
    full = state[:, None, :].repeat(1, values.shape[0], 1)
    full[:, :, block] = values
    return torch.log_softmax(fg.log_joint(full), -1)


def test_registry_options_and_spec():
    motif = motifs.get("crf_tags", tags=3)
    assert isinstance(motif, CrfTagsMotif) and "crf_tags" in motifs.names()
    assert get_motif("crf_tags", tags=4).block_spec.cardinalities == [13] * 4
    spec = motif.spec()
    assert spec["name"] == "crf_tags" and spec["options"] == {"tags": 3} and spec["feature_dim"] == 405
    assert [CrfTagsMotif(n).feature_dim for n in (2, 3, 4)] == [223, 405, 587]
    for bad in (1, 5, "2", True, 2.0):
        with pytest.raises(ValueError, match="tags"):
            CrfTagsMotif(bad)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_find_instances_counts_windows(crf, n):
    lengths = [1, 2, 3, 4, 5, 7, 12]
    sents = [[f"w{i}" for i in range(length)] for length in lengths]
    motif = CrfTagsMotif(n)
    for sent, length in zip(sents, lengths):
        fg = crf.sentence_graph(sent)
        inst = motif.find_instances(fg)
        assert len(inst) == max(0, length - n + 1)
        none = inst.select(torch.zeros(0, dtype=torch.long))
        assert motif.encode(fg, none, torch.zeros(fg.num_variables)).shape == (0, motif.feature_dim)
        if len(inst):
            assert inst.blocks.tolist() == [list(range(s, s + n)) for s in range(length - n + 1)]
            left = [s - 1 for s in range(length - n + 1)]
            right = [s + n if s + n < length else -1 for s in range(length - n + 1)]
            assert inst.context.tolist() == [[a, b] for a, b in zip(left, right)]
    inst = motif.find_instances(crf.corpus_graph(sents))
    assert len(inst) == sum(max(0, length - n + 1) for length in lengths)
    assert inst.params.shape == (len(inst), motif.feature_dim)


def test_find_instances_on_generic_graphs():
    k = 13
    g = torch.Generator().manual_seed(0)
    # a chain built in reverse scope order, with two factors on one edge and an observed variable
    fg = FactorGraph()
    ids = fg.add_variables(6, k)
    for v in ids:
        fg.add_table_factor([v], torch.randn(k, generator=g))
    for a, b in zip(ids[:-1], ids[1:]):
        fg.add_table_factor([b, a], torch.randn(k, k, generator=g))
    fg.add_table_factor([ids[2], ids[3]], torch.randn(k, k, generator=g))
    fg.set_evidence({ids[5]: 4})
    motif = CrfTagsMotif(2)
    inst = motif.find_instances(fg)
    assert inst.blocks.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]  # no block holds the observed x5
    assert inst.context.tolist()[-1] == [2, 5]  # ... but it is the right Markov blanket of the last one
    state = fg.initial_state(g).expand(3, -1).clone()
    state[:, :5] = torch.randint(k, (3, 5), generator=g).float()
    logp = motif.exact_conditional(motif.encode(fg, inst, state))
    values = motif.block_spec.enumerate()
    for i, block in enumerate(inst.blocks.tolist()):
        assert torch.allclose(logp[:, i], _brute_conditional(fg, block, state, values), atol=1e-4)
    # a branching variable (degree 3) is never a block variable; a different cardinality is ignored
    fg2 = FactorGraph()
    hub, a, b, c, d = fg2.add_variables(5, k)
    other = fg2.add_variable("binary", 2)
    for u, v in [(a, hub), (hub, b), (hub, c), (c, d)]:
        fg2.add_table_factor([u, v], torch.zeros(k, k))
    fg2.add_table_factor([other, d], torch.zeros(2, k))
    blocks = CrfTagsMotif(2).find_instances(fg2).blocks.tolist()
    assert all(hub not in blk for blk in blocks) and all(d not in blk for blk in blocks)
    assert CrfTagsMotif(2).find_instances(FactorGraph()).blocks.shape == (0, 2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_encode_exact_conditional_matches_brute_force(crf, n):
    fg = crf.sentence_graph(TOKENS)
    motif = CrfTagsMotif(n)
    inst = motif.find_instances(fg)
    g = torch.Generator().manual_seed(n)
    state = torch.randint(13, (3, len(TOKENS)), generator=g).float()
    features = motif.encode(fg, inst, state)
    assert features.shape == (3, len(TOKENS) - n + 1, motif.feature_dim)
    logp = motif.exact_conditional(features)
    assert logp.shape == (3, len(inst), 13**n)
    values = motif.block_spec.enumerate()
    check = range(len(inst)) if n < 4 else [0, len(inst) - 1]  # ends: absent left / right neighbour
    for i in check:
        ref = _brute_conditional(fg, inst.blocks[i].tolist(), state, values)
        assert torch.allclose(logp[:, i], ref, atol=1e-4), i
    # features do not depend on the block's own values, only on C and Psi
    moved = state.clone()
    moved[:, inst.blocks[1]] = (moved[:, inst.blocks[1]] + 1) % 13
    assert torch.equal(motif.encode(fg, inst.select(torch.tensor([1])), moved)[:, 0], features[:, 1])


def test_training_batch_shapes_and_determinism():
    for n in (2, 3, 4):
        motif = CrfTagsMotif(n)
        a = motif.sample_training_batch(64, torch.Generator().manual_seed(5))
        b = motif.sample_training_batch(64, torch.Generator().manual_seed(5))
        c = motif.sample_training_batch(64, torch.Generator().manual_seed(6))
        assert torch.equal(a.features, b.features) and torch.equal(a.block, b.block) and torch.equal(a.log_p, b.log_p)
        assert not torch.equal(a.block, c.block)
        assert a.features.shape == (64, motif.feature_dim) and a.block.shape == (64, n)
        assert a.log_p.shape == (64, 13**n)
        assert torch.allclose(a.log_p.exp().sum(-1), torch.ones(64), atol=1e-4)
        assert ((a.block >= 0) & (a.block < 13) & (a.block == a.block.round())).all()


def test_training_features_equal_encode_on_sentence_graph(crf, train_tokens):
    motif = CrfTagsMotif(3)
    draw = motif._draw(24, torch.Generator().manual_seed(11))
    batch = motif.sample_training_batch(24, torch.Generator().manual_seed(11))
    for i in range(24):
        s, st = int(draw["sentence"][i]), int(draw["start"][i])
        tokens = train_tokens[s]
        fg = crf.sentence_graph(tokens)
        inst = motif.find_instances(fg)
        row = int((inst.blocks[:, 0] == st).nonzero())
        state = torch.zeros(len(tokens))
        vals = draw["values"][i]
        if st > 0:
            state[st - 1] = vals[0]
        if st + 3 < len(tokens):
            state[st + 3] = vals[4]
        state[st : st + 3] = vals[1:4].float()
        assert torch.allclose(motif.encode(fg, inst, state)[row], batch.features[i], atol=1e-4)
        assert torch.equal(batch.block[i], vals[1:4].float())


def test_training_blocks_follow_the_exact_conditional():
    """The drawn block is a sample of ``log_p``: z-test of the summed log-probability of the drawn blocks.

    ``sum_b log p_b(block_b)`` has mean ``sum_b sum_x p_b log p_b`` and variance
    ``sum_b Var_{p_b}(log p_b)`` if every block is drawn from its ``p_b``; fail at
    ``|z| > 4`` (false-failure rate about 6e-5).
    """
    motif = CrfTagsMotif(2)
    batch = motif.sample_training_batch(4096, torch.Generator().manual_seed(21))
    logp = batch.log_p.double()
    idx = (batch.block[:, 0] * 13 + batch.block[:, 1]).long()
    drawn = logp.gather(1, idx[:, None]).squeeze(1)
    p = logp.exp()
    mean = (p * logp).sum(-1)
    var = (p * logp.square()).sum(-1) - mean.square()
    z = (drawn.sum() - mean.sum()) / var.sum().sqrt()
    assert abs(float(z)) < 4


def test_training_context_has_the_chain_marginal(crf, train_tokens):
    """FFBS gives (C_left, B, C_right) the chain's joint: chi-square of each position's tag frequencies.

    One window (sentence 0, tokens 1-2, so both neighbours exist) is drawn 6000 times; each
    of the 4 positions is compared with the CRF's exact marginal (bins with expected count
    < 5 pooled); fail at p < 1e-4 per position (false-failure rate about 4e-4).
    """
    motif = CrfTagsMotif(2)
    cache = motif._training_cache()
    sentence = 0
    tokens = train_tokens[sentence]
    assert len(tokens) >= 4
    cache = dict(cache)
    cache["win_sent"] = torch.tensor([sentence])
    cache["win_start"] = torch.tensor([1])
    cache["win_len"] = torch.tensor([len(tokens)])
    motif._cache = cache
    draw = motif._draw(6000, torch.Generator().manual_seed(4))
    assert draw["has_left"].all() and draw["has_right"].all()
    marg = crf.marginals(tokens).double()
    for j in range(4):
        expected = marg[j] * 6000
        observed = torch.bincount(draw["values"][:, j], minlength=13).double()
        keep = expected >= 5
        stat = float((((observed - expected) ** 2) / expected)[keep].sum())
        rest_o, rest_e = float(observed[~keep].sum()), float(expected[~keep].sum())
        dof = int(keep.sum()) - 1
        if rest_e > 0:
            stat += (rest_o - rest_e) ** 2 / rest_e
            dof += 1
        if dof > 0:
            assert chi2.sf(stat, dof) > 1e-4, (j, stat, dof)
