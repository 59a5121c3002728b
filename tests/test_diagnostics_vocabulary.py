"""Every kernel's ``diagnostics()`` uses the one vocabulary, :class:`neuralblock.kernels.KernelDiagnostics`.

Each kernel runs a few transitions on a small model; every key of its report (and of the nested
reports of compound and replica-exchange kernels) must be declared, and documented, there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from test_neural_block_kernel import ChainWindow, chain_graph  # tests/ is on sys.path under pytest
from torch.distributions import Laplace, Normal

from neuralblock import FactorGraph
from neuralblock.kernels import (
    AusterityMH,
    CompoundKernel,
    ConditionalGraphKernel,
    DirectNUTS,
    DiscreteLangevin,
    GibbsKernel,
    GibbsWithGradients,
    KernelDiagnostics,
    LWAKernel,
    MarginalRandomWalk,
    NeuralBlockKernel,
    ParticleGibbs,
    PathAuxiliarySampler,
    RandomWalkMH,
    ReplicaExchange,
    SplitMergeGMM,
)
from neuralblock.kernels.particle_gibbs import linear_gaussian_ssm
from neuralblock.priorswap import PriorSwap
from neuralblock.proposals import NeuralBlockProposal

DECLARED = set(KernelDiagnostics.__annotations__)
NESTED = ("blocks", "inner")  # keys whose values are other kernels' reports


def mixture(data: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Dirichlet(torch.ones(2)))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(w))
        pyro.sample("y", dist.Normal(torch.tensor([-2.0, 2.0])[z], 0.5), obs=data)


def location(x: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x[idx])


def bits_given_w() -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    pyro.sample("z", dist.Bernoulli(logits=w[..., None] * torch.ones(3)).to_event(1))


def bits_graph(values: Mapping[str, torch.Tensor]) -> FactorGraph:
    fg = FactorGraph()
    bits = fg.add_variables(3, cardinality=2, prefix="z")
    logits = torch.stack([torch.zeros(()), values["w"]]).expand(3, 2)
    fg.add_table_factors(torch.tensor(bits)[:, None], torch.nn.functional.log_softmax(logits, -1))
    return fg


def gaussian_pair() -> FactorGraph:
    fg = FactorGraph()
    x, y = fg.add_variable("x"), fg.add_variable("y")
    fg.add_linear_gaussian(x, [], [], 0.0, 1.0)
    fg.add_linear_gaussian(y, [x], [1.0], 0.0, 1.0)
    return fg


def chain_proposal() -> NeuralBlockProposal:
    return NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))


def split_merge() -> SplitMergeGMM:
    from motifs.gmm_pair import gmm_graph

    points = torch.cat([torch.randn(10, 2) - 5.0, torch.randn(10, 2) + 5.0])
    return SplitMergeGMM(gmm_graph(points, num_mixtures=3, sigma=1.0, tau=5.0, p_active=0.5), gibbs_prob=0.3)


FALSE_DRAWS = {"theta": 1.0 + 0.3 * torch.randn(300, generator=torch.Generator().manual_seed(0))}

# name -> (kernel factory, run arguments)
KERNELS: dict[str, tuple[Callable[[], MCMCKernel], tuple]] = {
    "gibbs": (lambda: GibbsKernel(chain_graph(0), chains=2), ()),
    "random_walk": (lambda: RandomWalkMH(gaussian_pair()), ()),
    "gibbs_with_gradients": (lambda: GibbsWithGradients(chain_graph(0), chains=2), ()),
    "path_auxiliary": (lambda: PathAuxiliarySampler(chain_graph(0), path_length=2), ()),
    "discrete_langevin": (lambda: DiscreteLangevin(chain_graph(0), chains=2), ()),
    "neural_block": (lambda: NeuralBlockKernel(chain_graph(0), [chain_proposal()], chains=2), ()),
    "neural_block_general": (
        lambda: NeuralBlockKernel(chain_graph(0), [chain_proposal()], chains=2, fused=False),
        (),
    ),
    "replica_exchange": (lambda: ReplicaExchange(chain_graph(0), [chain_proposal()], replicas=2, chains=2), ()),
    "compound": (
        lambda: CompoundKernel(
            [(ConditionalGraphKernel(bits_given_w, {"z": [0, 1, 2]}, bits_graph, GibbsKernel), ["z"])]
            + [(RandomWalkMH(bits_given_w), ["w"])]
        ),
        (),
    ),
    "marginal": (lambda: MarginalRandomWalk(mixture), (torch.tensor([-2.1, -1.9, 2.0, 2.2]),)),
    "particle_gibbs": (
        lambda: ParticleGibbs(
            partial(linear_gaussian_ssm, torch.randn(2, 4)),
            torch.zeros(2, 4),
            num_particles=4,
            values={"a": 0.5, "q": 1.0, "r": 1.0},
        ),
        (),
    ),
    "austerity": (lambda: AusterityMH(location, epsilon=0.05, batch_size=20), (torch.randn(200),)),
    "lwa": (lambda: LWAKernel(location, subset_size=20), (torch.randn(200),)),
    "priorswap_mh": (lambda: PriorSwap(FALSE_DRAWS, Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="mh"), ()),
    "priorswap_elliptical": (
        lambda: PriorSwap(FALSE_DRAWS, Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="elliptical"),
        (),
    ),
    "priorswap_hmc": (lambda: PriorSwap(FALSE_DRAWS, Normal(0.0, 1.0), Laplace(0.0, 0.5), kernel="hmc"), ()),
    "split_merge": (split_merge, ()),
    "direct_nuts": (lambda: DirectNUTS(location), (torch.randn(200),)),
}


def undeclared(report: Mapping[str, Any], where: str = "") -> list[str]:
    """The keys of ``report`` (and of its nested kernel reports) that ``KernelDiagnostics`` does not declare."""
    missing = [f"{where}{key}" for key in report if key not in DECLARED]
    for key in NESTED:
        nested = report.get(key)
        if key == "blocks" and isinstance(nested, Mapping):
            for label, block in nested.items():
                missing += undeclared(block, f"{where}blocks[{label}].")
        elif isinstance(nested, Mapping):
            missing += undeclared(nested, f"{where}{key}.")
    return missing


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_diagnostics_key_is_declared(name: str) -> None:
    build, args = KERNELS[name]
    kernel = build()
    MCMC(kernel, num_samples=6, warmup_steps=4, disable_progbar=True).run(*args)
    report = kernel.diagnostics()
    assert isinstance(report, dict) and report, name
    assert not undeclared(report), f"{type(kernel).__name__} reports undeclared keys {undeclared(report)}"
    assert isinstance(report.get("divergences"), list), report.get("divergences")  # arviz.from_pyro reads it
    if "transitions_per_second" in report:
        assert report["transitions_per_second"] >= 0.0


def test_every_declared_key_is_documented() -> None:
    doc = inspect.getdoc(KernelDiagnostics) or ""
    entries = [line for line in doc.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    documented = {line.split(":")[0].strip() for line in entries}
    assert not DECLARED - documented, sorted(DECLARED - documented)


def test_kernels_that_time_themselves_report_transitions_per_second() -> None:
    build, args = KERNELS["gibbs"]
    kernel = build()
    MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True).run(*args)
    report = kernel.diagnostics()
    assert report["transitions_per_second"] > 0.0 and report["updates_per_second"] > report["transitions_per_second"]
