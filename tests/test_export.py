"""ArviZ export and the TensorBoard hook on a compound run with discrete and continuous sites."""

from __future__ import annotations

from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from neuralblock.diagnostics.export import TensorBoardHook, to_inference_data
from neuralblock.kernels import CompoundKernel, GibbsKernel, RandomWalkMH


def model() -> None:
    p = pyro.sample("p", dist.Beta(2.0, 2.0))
    for i in range(3):
        z = pyro.sample(f"z{i}", dist.Bernoulli(p))
        pyro.sample(f"y{i}", dist.Normal(z, 0.5), obs=torch.tensor(float(i % 2)))


def run(hook: TensorBoardHook | None = None, num_chains: int = 2) -> MCMC:
    kernel = CompoundKernel([(GibbsKernel(model), None), (RandomWalkMH(model), ["p"])])
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=10, num_chains=num_chains, hook_fn=hook, disable_progbar=True)
    mcmc.run()
    return mcmc


def test_inference_data_keeps_discrete_sites_and_summarises() -> None:
    pytest.importorskip("arviz")
    import arviz as az

    idata = to_inference_data(run())
    assert idata.posterior["p"].shape == (2, 40)
    assert idata.posterior["z0"].dtype.kind == "i"
    summary = az.summary(idata)
    assert {"p", "z0", "z1", "z2"} <= set(summary.index)
    assert "visits" in idata.posterior.attrs["kernel_diagnostics"]


def test_inference_data_keeps_each_chains_kernel_diagnostics() -> None:
    """Each chain's own report is kept; the parent's kernel holds only the last chain's (none with workers)."""
    pytest.importorskip("arviz")
    mcmc = run()
    text = to_inference_data(mcmc).posterior.attrs["kernel_diagnostics"]
    assert "'chain 0'" in text and "'chain 1'" in text
    for report in mcmc._diagnostics:  # 10 warmup + 40 draws per chain, each block visited every step
        assert report["visits"] == [50, 50] and report["blocks"]["0 (GibbsKernel)"]["sweeps"] == 40.0
    assert text == repr({"chain 0": mcmc._diagnostics[0], "chain 1": mcmc._diagnostics[1]})


def test_inference_data_rejects_an_empty_run() -> None:
    pytest.importorskip("arviz")

    class Empty:
        kernel = None

        def get_samples(self, group_by_chain: bool = False) -> dict:
            return {}

    with pytest.raises(ValueError, match="no samples"):
        to_inference_data(Empty())


def test_tensorboard_hook_writes_traces_and_acceptance(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hook = TensorBoardHook(tmp_path)
    run(hook, num_chains=1)
    hook.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"trace/p", "trace/z0"} <= tags
    assert any(tag.startswith("kernel/1:") for tag in tags), tags
    assert len(events.Scalars("trace/p")) == 40


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("every", 0),
        ("every", -3),
        ("every", 1.5),
        ("every", float("nan")),
        ("every", "x"),
        ("every", True),
        ("max_elements", 0),
        ("max_elements", 2.0),
        ("warmup", "yes"),
    ],
)
def test_tensorboard_hook_rejects_bad_arguments(tmp_path: Path, option: str, bad) -> None:
    with pytest.raises(ValueError, match=option):
        TensorBoardHook(tmp_path, **{option: bad})


def test_tensorboard_hook_writes_each_parallel_worker_to_its_chain_folder(tmp_path: Path, monkeypatch) -> None:
    import multiprocessing

    class Worker:
        name = "1"  # Pyro names a parallel chain's worker process by its chain id

    monkeypatch.setattr(multiprocessing, "current_process", lambda: Worker())
    hook = TensorBoardHook(tmp_path)
    hook(None, {"mu": torch.tensor(0.5)}, "Sample", 0)  # no chain id in a worker's stage
    hook.close()
    assert [p.name for p in tmp_path.iterdir()] == ["chain1"]
