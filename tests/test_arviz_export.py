"""ArviZ's own converter on our kernels, and the sample stats and observed data of ``to_inference_data`` (issue 23).

``arviz.from_pyro(mcmc)`` reads ``mcmc.diagnostics()["divergences"]``, which Pyro builds from each
chain's ``kernel.diagnostics()``: every kernel of ours reports an empty list (no divergent draws).
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from test_neural_block_kernel import ChainWindow, chain_graph  # tests/ is on sys.path under pytest

from neuralblock import GibbsKernel, NeuralBlockKernel, RandomWalkMH
from neuralblock.diagnostics.export import to_inference_data
from neuralblock.kernels import CompoundKernel
from neuralblock.proposals import NeuralBlockProposal

az = pytest.importorskip("arviz")
warnings.filterwarnings("ignore", category=FutureWarning)  # arviz 0.2x announces its 1.0 refactor

DATA = torch.tensor([0.3, 0.5, 1.1])


def normal_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def mixed_model() -> None:
    p = pyro.sample("p", dist.Beta(2.0, 2.0))
    for i in range(3):
        z = pyro.sample(f"z{i}", dist.Bernoulli(p))
        pyro.sample(f"y{i}", dist.Normal(z, 0.5), obs=torch.tensor(float(i % 2)))


def weighted_model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)), pyro.poutine.scale(scale=torch.tensor([1.0, 2.0, 0.5])):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def evidence_graph():
    fg = chain_graph(seed=0)
    fg.set_evidence({5: 2})
    return fg


def run(kernel, *args, num_samples: int = 20, num_chains: int = 1) -> MCMC:
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=10, num_chains=num_chains, disable_progbar=True)
    mcmc.run(*args)
    return mcmc


def kernels() -> dict[str, tuple]:
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    return {
        "gibbs": (GibbsKernel(evidence_graph()), ()),
        "gibbs chains=3": (GibbsKernel(evidence_graph(), chains=3), ()),
        "neural block": (NeuralBlockKernel(chain_graph(seed=0), [proposal]), ()),
        "neural block chains=2": (NeuralBlockKernel(chain_graph(seed=0), [proposal], chains=2), ()),
        "random walk": (RandomWalkMH(normal_model), (DATA,)),
        "compound": (CompoundKernel([(GibbsKernel(mixed_model), None), (RandomWalkMH(mixed_model), ["p"])]), ()),
    }


@pytest.mark.parametrize("name", list(kernels()))
def test_arviz_from_pyro_reads_our_kernels(name: str) -> None:
    kernel, args = kernels()[name]
    mcmc = run(kernel, *args)
    assert mcmc.diagnostics()["divergences"] == {"chain 0": []}
    idata = az.from_pyro(mcmc)
    assert isinstance(idata, az.InferenceData)
    assert not idata.sample_stats["diverging"].values.any()
    site = "mu" if name == "random walk" else ("p" if name == "compound" else "x")
    draws = idata.posterior[site]
    assert draws.shape[:2] == (1, 20)
    chains = getattr(kernel, "chains", 1)
    if site == "x":
        assert draws.shape[2:] == ((chains, 6) if chains > 1 else (6,))  # [S, K, n] per process, as get_samples


def test_arviz_from_pyro_with_two_processes() -> None:
    mcmc = run(RandomWalkMH(normal_model), DATA, num_chains=2)
    idata = az.from_pyro(mcmc)
    assert idata.posterior["mu"].shape == (2, 20)
    assert idata.sample_stats["diverging"].shape == (2, 20)
    assert idata.observed_data["y"].values.tolist() == pytest.approx(DATA.tolist())


def test_to_inference_data_exports_acceptance_per_chain_and_observed_data() -> None:
    mcmc = run(RandomWalkMH(normal_model), DATA, num_chains=2, num_samples=50)
    idata = to_inference_data(mcmc)
    acc = idata.sample_stats["acceptance_rate"]
    assert acc.dims == ("chain",) and acc.shape == (2,)
    assert acc.values.tolist() == pytest.approx([d["acceptance_rate"] for d in mcmc._diagnostics])
    assert 0.0 < acc.values.min() <= acc.values.max() < 1.0
    assert idata.sample_stats["diverging"].shape == (2, 50) and not idata.sample_stats["diverging"].values.any()
    assert idata.observed_data["y"].values.tolist() == pytest.approx(DATA.tolist())
    assert az.summary(idata)["mean"]["mu"] == pytest.approx(float(mcmc.get_samples()["mu"].mean()), abs=1e-2)


def test_to_inference_data_on_vectorized_chains_and_factor_graph_evidence() -> None:
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    kernel = NeuralBlockKernel(evidence_graph(), [proposal], chains=3)
    idata = to_inference_data(run(kernel))
    assert idata.posterior["x"].shape == (3, 20, 6)
    acc = idata.sample_stats["acceptance_by_proposal_test_chain_window"]
    assert acc.shape == (3,) and len(set(acc.values.tolist())) == 1  # one kernel's rate, shared by its chains
    observed = idata.observed_data["x"]
    assert observed.dims == ("observed_variable",) and observed.values.tolist() == [2]
    assert observed["observed_variable"].values.tolist() == ["x5"]


def test_to_inference_data_names_compound_blocks_and_skips_weighted_data() -> None:
    kernel = CompoundKernel([(GibbsKernel(mixed_model), None), (RandomWalkMH(mixed_model), ["p"])])
    idata = to_inference_data(run(kernel))
    assert "blocks_1_RandomWalkMH_acceptance_rate" in idata.sample_stats
    assert set(idata.observed_data.data_vars) == {"y0", "y1", "y2"}

    mcmc = run(RandomWalkMH(weighted_model), DATA)
    state = torch.get_rng_state()
    idata = to_inference_data(mcmc)
    assert torch.equal(torch.get_rng_state(), state)  # the trace for observed data leaves the RNG alone
    assert "observed_data" not in idata.groups()  # weighted (e.g. coreset) data are not the data
