"""Tests of the linear-chain algorithms (neuralblock/exact/chain.py) against brute-force enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chi2

from neuralblock.exact import (
    chain_backward,
    chain_forward,
    chain_marginals,
    chain_sample,
    chain_score,
    chain_viterbi,
)
from neuralblock.exact.chain import gumbel_argmax


def _random_chain(batch: int, t_len: int, k: int, lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(batch, t_len, k, generator=g, dtype=torch.float64) * 1.5
    trans = torch.randn(k, k, generator=g, dtype=torch.float64) * 1.5
    mask = torch.arange(t_len) < torch.tensor(lengths)[:, None]
    return unary, trans, mask


def _brute_scores(unary: torch.Tensor, trans: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All ``K^length`` paths of one chain (first position slowest) and their scores, summed term by term."""
    k = unary.shape[-1]
    paths = list(itertools.product(range(k), repeat=length))
    scores = [
        sum(float(unary[t, y[t]]) for t in range(length)) + sum(float(trans[y[t - 1], y[t]]) for t in range(1, length))
        for y in paths
    ]
    return torch.tensor(paths, dtype=torch.long), torch.tensor(scores, dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_z_marginals_and_score_match_brute_force(seed):
    lengths = [4, 2, 1, 3]
    k = 2 + seed
    unary, trans, mask = _random_chain(len(lengths), 4, k, lengths, seed=seed)
    alpha, log_z = chain_forward(unary, trans, mask)
    beta = chain_backward(unary, trans, mask)
    marg = chain_marginals(unary, trans, mask)
    for b, length in enumerate(lengths):
        paths, scores = _brute_scores(unary[b], trans, length)
        assert torch.allclose(log_z[b], torch.logsumexp(scores, 0), atol=1e-10)
        padded = torch.zeros(len(paths), unary.shape[1], dtype=torch.long)
        padded[:, :length] = paths
        row_mask = mask[b : b + 1].expand(len(paths), -1)
        got = chain_score(unary[b : b + 1].expand(len(paths), -1, -1), trans, padded, row_mask)
        assert torch.allclose(got, scores, atol=1e-10)
        probs = torch.softmax(scores, 0)
        for t in range(length):
            ref = torch.zeros(k, dtype=torch.float64).index_add_(0, paths[:, t], probs)
            assert torch.allclose(marg[b, t], ref, atol=1e-10)
            assert torch.allclose((alpha[b, t] + beta[b, t] - log_z[b]).exp(), ref, atol=1e-10)
        assert (marg[b, length:] == 0).all() and (beta[b, length - 1 :] == 0).all()


@pytest.mark.parametrize("seed", [1, 4])
def test_viterbi_matches_brute_force(seed):
    lengths = [4, 3, 1, 2]
    unary, trans, mask = _random_chain(4, 4, 4, lengths, seed=seed)
    tags, score = chain_viterbi(unary, trans, mask)
    for b, length in enumerate(lengths):
        paths, scores = _brute_scores(unary[b], trans, length)
        best = int(scores.argmax())
        assert tags[b, :length].tolist() == paths[best].tolist()
        assert torch.allclose(score[b], scores[best])
        assert (tags[b, length:] == 0).all()


def test_unmasked_defaults_and_shape_errors():
    unary, trans, _ = _random_chain(2, 3, 3, [3, 3], seed=5)
    full = torch.ones(2, 3, dtype=torch.bool)
    assert torch.equal(chain_forward(unary, trans)[1], chain_forward(unary, trans, full)[1])
    assert torch.equal(chain_viterbi(unary, trans)[0], chain_viterbi(unary, trans, full)[0])
    with pytest.raises(ValueError, match=r"\[B, T, K\]"):
        chain_forward(unary[0], trans)
    with pytest.raises(ValueError, match="transitions"):
        chain_marginals(unary, trans[:2])
    with pytest.raises(ValueError, match="mask"):
        chain_viterbi(unary, trans, full[:, :2])


def test_ffbs_sample_frequencies_match_exact():
    """Chi-square goodness of fit of FFBS samples against exact path probabilities.

    Two chains (lengths 4 and 3, K = 3: 81 and 27 paths), 40000 samples each; the test
    fails when a p-value is below 1e-4, so its false-failure rate is about 2e-4.
    """
    lengths = [4, 3]
    unary, trans, mask = _random_chain(2, 4, 3, lengths, seed=2)
    unary, trans = unary * 0.6, trans * 0.6  # keep every path's expected count reasonable
    draws = chain_sample(unary, trans, mask, num_samples=40_000, generator=torch.Generator().manual_seed(3))
    for b, length in enumerate(lengths):
        paths, scores = _brute_scores(unary[b], trans, length)
        expected = torch.softmax(scores, 0) * draws.shape[0]
        code = (draws[:, b, :length] * (3 ** torch.arange(length - 1, -1, -1))).sum(-1)
        observed = torch.bincount(code, minlength=len(paths)).double()
        assert (draws[:, b, length:] == 0).all()
        keep = expected >= 5
        stat = float((((observed - expected) ** 2) / expected)[keep].sum())
        rest_o, rest_e = float(observed[~keep].sum()), float(expected[~keep].sum())
        if rest_e > 0:
            stat += (rest_o - rest_e) ** 2 / rest_e
        dof = int(keep.sum()) + (1 if rest_e > 0 else 0) - 1
        assert chi2.sf(stat, dof) > 1e-4, (b, stat, dof)


def test_chain_sample_is_deterministic_given_generator():
    unary, trans, mask = _random_chain(2, 5, 4, [5, 3])
    a = chain_sample(unary, trans, mask, 7, torch.Generator().manual_seed(9))
    b = chain_sample(unary, trans, mask, 7, torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


def test_gumbel_argmax_frequencies():
    """Chi-square fit of 60000 Gumbel-max draws to softmax(logits); false-failure rate about 1e-4."""
    logits = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    draws = gumbel_argmax(logits.expand(60_000, 4), torch.Generator().manual_seed(0))
    expected = torch.softmax(logits, 0) * draws.numel()
    observed = torch.bincount(draws, minlength=4).double()
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, 3) > 1e-4
