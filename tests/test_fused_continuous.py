"""The fused continuous block update (the ``chain`` motif): invariance, agreement with the general path, compilation.

Statistical tests run ``K`` vectorized chains from independent exact draws of the target:
an invariant kernel keeps every chain's state an exact draw at every sweep, so each chain's
time average of ``x_v`` and of ``(x_v - mu_v)^2`` is an independent estimate of the exact mean
and variance. z-scores use the spread of those per-chain averages over the ``K`` chains (their
Monte Carlo standard error, no autocorrelation assumption), with a Bonferroni Student-t
threshold over every score of a test: false-failure rate at most 1e-3 per test.

The proposal is deliberately off target (``N(0.7, 1.5^2)`` in the whitened coordinates, where
the exact conditional of a linear-Gaussian chain is ``N(0, I)``), so the MH correction
matters: with the reverse proposal density dropped from the ratio, the invariance test
fails (max |z| = 79 against a threshold of 4.2; checked by hand, as are an ignored ``beta``, 89,
and an unwhitened current block in the reverse density, 54). The correct update passes over
seeds 0-5 of both statistical tests.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from _stats import ALPHA, bonferroni_t  # tests/ is on sys.path under pytest
from pyro.infer import MCMC
from test_motif_chain import latent_precision_and_mean, linear_chain  # tests/ is on sys.path under pytest

from motifs.chain import ChainMotif, stochastic_volatility_graph
from neuralblock import FactorGraph, NeuralBlockKernel, load_pretrained
from neuralblock.kernels.fused_continuous import GaussianScaffold
from neuralblock.motif import MotifInstances
from neuralblock.proposals import NeuralBlockProposal

CHAINS = 400
EXACT_CHAINS, SWEEPS = 1000, 20  # the invariance test's chains (half of them tempered) and sweeps

# the chains' end states lie in no block: with ``gibbs_prob=0`` they keep their exact start values
pytestmark = pytest.mark.filterwarnings("ignore:NeuralBlockKernel with gibbs_prob=0 never updates:RuntimeWarning")


def off_target_proposal() -> NeuralBlockProposal:
    """A chain proposal ``N(0.7, 1.5^2 I)`` in whitened coordinates, where the exact conditional is ``N(0, I)``."""
    proposal = NeuralBlockProposal(ChainMotif(), components=2, hidden=(8,))
    with torch.no_grad():
        for head, bias in ((proposal.mdn.loc_head, 0.7), (proposal.mdn.scale_head, math.log(1.5))):
            head.weight.zero_()
            head.bias.fill_(bias)
    return proposal


def run(kernel: NeuralBlockKernel, start: torch.Tensor, sweeps: int) -> torch.Tensor:
    """Draws ``[K, S, n]`` of the kernel's vectorized chains from ``start [K, n]`` (no warmup)."""
    mcmc = MCMC(kernel, num_samples=sweeps, warmup_steps=0, initial_params={"x": start}, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()["x"].transpose(0, 1)


def exact_starts(fg: FactorGraph, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact draws ``[K, n]`` of ``p(x)^beta_k`` (linear-Gaussian graph), its mean ``[V]`` and variances ``[K, V]``."""
    state = fg.initial_state(torch.Generator().manual_seed(0))
    precision, mean = latent_precision_and_mean(fg, state)
    cov = torch.linalg.inv(precision.double())
    chol = torch.linalg.cholesky(cov)
    noise = torch.randn(len(beta), len(mean), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    starts = state.expand(len(beta), -1).clone()
    starts[:, fg.latent] = (mean.double() + (noise @ chol.T) / beta.double().sqrt()[:, None]).to(starts.dtype)
    return starts, mean.double(), cov.diagonal()[None, :] / beta.double()[:, None]


def invariance_z(draws: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """z-scores of every variable's mean and variance, ``[2 V]``, from draws ``[K, S, V]`` of independent chains."""
    per_chain = torch.cat([draws.mean(1) - mean, ((draws - mean) ** 2).mean(1) - var], -1)  # [K, 2V]: expectation 0
    return per_chain.mean(0) / (per_chain.std(0) / math.sqrt(per_chain.shape[0]))


def test_gaussian_scaffold_matches_the_graph_scaffold() -> None:
    """The padded Gaussian rows give the graph's own scaffold log-density changes (volatility and linear rows)."""
    for fg in (stochastic_volatility_graph(torch.randn(40), phi=0.95, sigma=0.3), linear_chain(30, seed=2)):
        instances = ChainMotif().find_instances(fg)
        members = fg.color_blocks(instances.blocks, reads=instances.context)[0]  # one conflict-free class
        blocks = instances.blocks[members]
        state = fg.initial_state(torch.Generator().manual_seed(3)).expand(3, -1).clone()
        values = torch.randn(2, 3, len(blocks), 2)
        ours = GaussianScaffold.build(fg, blocks)(state, values)
        scaffold = fg.scaffold(blocks)
        theirs = []
        for new in values:
            changed = state.clone()
            changed[:, blocks] = new
            theirs.append(scaffold.local_log_density(fg, changed))
        torch.testing.assert_close(ours[1] - ours[0], theirs[1] - theirs[0], rtol=1e-5, atol=1e-3)


def test_fused_chain_update_keeps_the_exact_gaussian_posterior_at_every_temperature() -> None:
    """Exact starts stay exact under the fused update, for chains at inverse temperatures 1 and 0.4."""
    fg = linear_chain(12, seed=5)  # 7 blocks in 4 classes of sizes 2, 2, 2, 1: padding is exercised
    beta = torch.where(torch.arange(EXACT_CHAINS) % 2 == 0, 1.0, 0.4)
    starts, mean, var = exact_starts(fg, beta)
    torch.manual_seed(0)
    kernel = NeuralBlockKernel(fg, proposals=[off_target_proposal()], gibbs_prob=0.0, chains=EXACT_CHAINS)
    kernel.beta = beta
    draws = run(kernel, starts, SWEEPS)[:, :, fg.latent].double()
    moved = sorted(set(ChainMotif().find_instances(fg).blocks.reshape(-1).tolist()))
    latent = fg.latent.tolist()
    cols = torch.tensor([latent.index(v) for v in moved])
    scores = [
        invariance_z(draws[group][..., cols], mean[cols], var[group][0, cols]) for group in (beta == 1.0, beta != 1.0)
    ]
    z = torch.cat(scores)
    limit = bonferroni_t(len(z), EXACT_CHAINS // 2 - 1, ALPHA)
    assert z.abs().max() < limit, f"max |z| = {z.abs().max():.2f} >= {limit:.2f}"
    diagnostics = kernel.diagnostics()
    assert diagnostics["fused"] == {"chain": True}
    assert 0.2 < diagnostics["acceptance_by_proposal"]["chain"] < 0.9  # the MH correction is at work


def test_fused_and_general_paths_agree_in_distribution_on_a_volatility_chain() -> None:
    """From one start, both paths' states after a few sweeps have the same law (two-sample z-scores)."""
    fg = stochastic_volatility_graph(0.8 * torch.randn(24, generator=torch.Generator().manual_seed(4)), 0.95, 0.3)
    start = fg.initial_state(torch.Generator().manual_seed(5)).expand(CHAINS, -1).clone()
    finals = []
    for fused in (True, False):
        kernel = NeuralBlockKernel(fg, [load_pretrained("chain")], gibbs_prob=0.0, chains=CHAINS, fused=fused)
        finals.append(run(kernel, start, 3)[:, -1, fg.latent].double())
        assert kernel.diagnostics()["fused"] == {"chain": fused}
        assert kernel.diagnostics()["acceptance_by_proposal"]["chain"] > 0.5
    moved = (finals[0] != start[:1, fg.latent]).any(0)
    stats = [torch.cat([f[:, moved], f[:, moved] ** 2], -1) for f in finals]
    se = (stats[0].var(0) / CHAINS + stats[1].var(0) / CHAINS).sqrt()
    z = (stats[0].mean(0) - stats[1].mean(0)) / se
    limit = bonferroni_t(len(z), 2 * CHAINS - 2, ALPHA)
    assert z.abs().max() < limit, f"max |z| = {z.abs().max():.2f} >= {limit:.2f}"


def test_compiled_update_makes_the_eager_decisions() -> None:
    """Same seed, same chain: random numbers are drawn outside the compiled function (states equal to rounding)."""
    fg = linear_chain(12, seed=1)
    proposal = off_target_proposal()
    draws = []
    for compile in (False, True):
        torch.manual_seed(7)
        kernel = NeuralBlockKernel(fg, [proposal], gibbs_prob=0.0, chains=3, compile=compile)
        start = fg.initial_state(torch.Generator().manual_seed(2)).expand(3, -1).clone()
        draws.append(run(kernel, start, 8))
        assert (kernel.diagnostics()["compile_seconds"] > 0) == compile
    torch.testing.assert_close(draws[0], draws[1], rtol=1e-5, atol=1e-5)
    assert not torch.equal(draws[0][:, 0], draws[0][:, -1])  # the chains moved
    copy = pickle.loads(pickle.dumps(kernel))  # worker processes (num_chains > 1) get a copy of the kernel
    assert copy.fused[0].compiled and callable(copy.fused[0].update)  # compiled again at its first sweep


def test_a_context_holding_the_block_is_refused() -> None:
    class SelfReading(ChainMotif):
        name = "chain-self-reading"

        def find_instances(self, fg: FactorGraph) -> MotifInstances:
            found = super().find_instances(fg)
            context = found.context.clone()
            context[:, 0] = found.blocks[:, 1]
            return MotifInstances(found.blocks, context, found.params)

    fg = linear_chain(9)
    proposal = NeuralBlockProposal(SelfReading(), components=2, hidden=(8,))
    with pytest.raises(ValueError, match="reads its own block"):
        NeuralBlockKernel(fg, [proposal]).setup(0)


def test_a_parameter_update_is_the_kernel_built_on_the_new_graph() -> None:
    """``update_graph`` refreshes the encoders and the factor rows: the chain of a kernel built on the new graph."""
    returns = torch.randn(16, generator=torch.Generator().manual_seed(6))
    old, new = (stochastic_volatility_graph(returns, phi, sigma) for phi, sigma in ((0.9, 0.4), (0.97, 0.15)))
    start = new.initial_state(torch.Generator().manual_seed(8)).expand(4, -1).clone()
    draws = []
    for graph in (old, new):
        kernel = NeuralBlockKernel(graph, [load_pretrained("chain")], gibbs_prob=0.0, chains=4)
        kernel.setup(0)
        kernel.update_graph(new)
        torch.manual_seed(9)
        params = {"x": start}
        for _ in range(3):
            params = kernel.sample(params)
        draws.append(params["x"])
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], start)


def test_continuous_blocks_refuse_a_non_cpu_device_with_a_clear_error() -> None:
    """The fused chain update builds its encoders on the CPU, and continuous single-site updates are CPU-only."""
    fg = stochastic_volatility_graph(torch.randn(20, generator=torch.Generator().manual_seed(0)) * 0.1, 0.95, 0.2)
    kernel = NeuralBlockKernel(fg, [load_pretrained("chain")], device="meta")
    with pytest.raises(ValueError, match="use device='cpu'"):
        kernel.setup(0)
