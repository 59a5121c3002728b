"""Power test of the neural block MH ratio on discrete blocks, fused and general paths (issue 25).

The grid-BN test compares 729 states with a Bonferroni correction and an untrained, nearly uniform proposal: a
swapped proposal ratio (``log q(B'|C) - log q(B|C)`` instead of ``log q(B|C) - log q(B'|C)``) barely moves it.
Here the design is built to see exactly that bug:

* the block is the whole graph (two ternary variables, 9 states) and ``gibbs_prob = 0``, so the kernel is an
  independence sampler with the MDN's proposal ``q``; its logits are set by hand to a *peaked* distribution
  (probabilities from 0.02 to 0.63) that disagrees with the target ``p``;
* with the ratio swapped, MH targets ``p q^2 / Z`` instead of ``p`` (the stationary law is computed below in
  closed form): state frequencies move by up to 0.26, i.e. by dozens of standard errors;
* a second design conditions the block on a third variable (context one-hot, one proposal row per context
  value), mixed with Gibbs sweeps (``gibbs_prob = 0.3``): 27 states, context-dependent peaked proposals.

The MCSE of each state's frequency is the spread of the per-chain frequencies over 32 independent vectorized
chains (``t_31``), independent of ``batch_means_mcse``. Bonferroni over the compared states gives a false-failure
rate below 1e-3 per test. Each test also asserts its own power: the swapped ratio's shift, in units of the observed
standard errors, is above 3 times the limit (detected with probability > 0.999).
"""

from __future__ import annotations

import pytest
import torch
from _stats import bonferroni_t, enumerate_joint  # tests/ is on sys.path under pytest
from pyro.infer import MCMC

from neuralblock import FactorGraph, NeuralBlockKernel
from neuralblock.motif import BlockSpec, Motif, MotifInstances, register_motif
from neuralblock.proposals import NeuralBlockProposal

ALPHA = 1e-3
CHAINS = 32


class PeakedPair(Motif):
    """Variables 0 and 1 (ternary) as one block; context: variable 2 one-hot when the graph has it, else none."""

    name = "test-power-peaked-pair"
    block_spec = BlockSpec([3, 3])
    feature_dim = 3

    def options(self) -> dict:
        return {}

    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        context = torch.tensor([[2 if fg.num_variables > 2 else -1]])
        return MotifInstances(torch.tensor([[0, 1]]), context, torch.zeros(1, 0))

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: torch.Tensor) -> torch.Tensor:
        if fg.num_variables == 2:  # constant features: one proposal row
            return torch.ones(*state.shape[:-1], len(instances), 3, dtype=state.dtype) / 3
        values = state[..., instances.context].long()  # [..., I, 1]
        return torch.nn.functional.one_hot(values, 3).flatten(-2).to(state.dtype)

    def sample_training_batch(self, batch_size, generator):  # pragma: no cover - not trained here
        raise NotImplementedError


register_motif(PeakedPair.name, PeakedPair)

# proposal logits per variable and value; with context, row c of each matrix is added for x2 = c
BASE_LOGITS = torch.tensor([[2.0, 0.0, -1.5], [-1.0, 2.2, -0.5]])
CONTEXT_LOGITS = torch.tensor(
    [[[0.0, 1.5, 0.0], [0.0, 0.0, 1.5]], [[1.5, 0.0, 0.0], [1.5, 0.0, 0.0]], [[0.0, 0.0, 1.5], [0.0, 1.5, 0.0]]]
)


def peaked_proposal(with_context: bool) -> NeuralBlockProposal:
    """A one-component linear MDN whose discrete logits are ``BASE_LOGITS (+ CONTEXT_LOGITS[x2])``."""
    proposal = NeuralBlockProposal(PeakedPair(), components=1, hidden=())
    mdn = proposal.mdn
    with torch.no_grad():
        mdn.mixture_head.weight.zero_()
        mdn.mixture_head.bias.zero_()
        head = mdn.discrete_head
        if with_context:  # logits = W onehot(x2) + b
            head.weight.copy_(CONTEXT_LOGITS.permute(1, 2, 0).reshape(6, 3))
            head.bias.copy_(BASE_LOGITS.reshape(6))
        else:  # features are (1/3, 1/3, 1/3): zero weights, logits from the bias
            head.weight.zero_()
            head.bias.copy_(BASE_LOGITS.reshape(6))
    return proposal


def graph(with_context: bool) -> FactorGraph:
    fg = FactorGraph()
    fg.add_variables(3 if with_context else 2, cardinality=3)
    fg.add_table_factor([0, 1], torch.tensor([[0.0, 1.0, -0.5], [1.2, -1.0, 0.3], [0.2, 0.8, 0.9]]))
    fg.add_table_factor([0], torch.tensor([-0.6, 0.4, 0.3]))
    if with_context:
        fg.add_table_factor([1, 2], torch.tensor([[0.9, -0.4, 0.0], [-0.3, 0.6, 0.2], [0.0, 0.1, 0.8]]))
    return fg


def block_log_q(states: torch.Tensor, with_context: bool) -> torch.Tensor:
    """``log q(x0, x1 | x2)`` of the hand-set proposal, from the logits (independent of the MDN code)."""
    logits = BASE_LOGITS.double().expand(len(states), 2, 3)
    if with_context:
        logits = logits + CONTEXT_LOGITS.double()[states[:, 2].long()]
    log_probs = torch.log_softmax(logits, -1)
    return log_probs[:, 0].gather(1, states[:, :1].long()).squeeze(1) + log_probs[:, 1].gather(
        1, states[:, 1:2].long()
    ).squeeze(1)


def swapped_stationary(probs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Stationary law of the independence sampler whose Hastings ratio is swapped: ``∝ p q^2``."""
    weights = probs * block_log_q(states, False).exp() ** 2
    return weights / weights.sum()


def chain_frequencies(kernel: NeuralBlockKernel, states: torch.Tensor, samples: int) -> torch.Tensor:
    """Per-chain visit frequencies ``[K, S]`` of every state."""
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=50, disable_progbar=True)
    mcmc.run()
    draws = mcmc.get_samples()["x"].transpose(0, 1)  # [K, samples, n]
    return (draws[:, :, None, :] == states[None, None]).all(-1).double().mean(1)


def z_scores(freqs: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z-scores of the pooled frequencies (MCSE from the spread over chains) and the standard errors."""
    se = freqs.std(0) / freqs.shape[0] ** 0.5
    se = torch.maximum(se, (probs * (1 - probs) / (freqs.shape[0] * 400)).sqrt())  # floor: never-visited states
    return (freqs.mean(0) - probs) / se, se


@pytest.mark.parametrize("fused", [True, False])
def test_peaked_block_proposal_on_the_whole_graph(fused: bool) -> None:
    fg = graph(with_context=False)
    states, probs = enumerate_joint(fg)
    kernel = NeuralBlockKernel(fg, proposals=[peaked_proposal(False)], gibbs_prob=0.0, fused=fused, chains=CHAINS)
    freqs = chain_frequencies(kernel, states, 400)
    assert kernel.diagnostics()["fused"] == {PeakedPair.name: fused}
    z, se = z_scores(freqs, probs)
    limit = bonferroni_t(len(probs), CHAINS - 1, ALPHA)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f} > {limit:.2f}"
    # power: the swapped ratio's target is this far away, in observed standard errors
    shift = ((swapped_stationary(probs, states) - probs) / se).abs().max()
    assert shift > 3 * limit, (float(shift), limit)
    acceptance = kernel.diagnostics()["acceptance_by_proposal"][PeakedPair.name]
    assert 0.1 < acceptance < 0.9


@pytest.mark.parametrize("fused", [True, False])
def test_peaked_block_proposal_with_context_mixed_with_gibbs(fused: bool) -> None:
    fg = graph(with_context=True)
    states, probs = enumerate_joint(fg)
    kernel = NeuralBlockKernel(fg, proposals=[peaked_proposal(True)], gibbs_prob=0.3, fused=fused, chains=CHAINS)
    freqs = chain_frequencies(kernel, states, 400)
    z, se = z_scores(freqs, probs)
    limit = bonferroni_t(len(probs), CHAINS - 1, ALPHA)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f} > {limit:.2f}"
    # the proposal is peaked and disagrees with p: the block ratio matters (see the module docstring)
    log_q = block_log_q(states, True)
    assert float(log_q.max() - log_q.min()) > 5.0
