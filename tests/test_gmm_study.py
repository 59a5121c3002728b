"""The open-universe GMM study runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
import torch

from experiments import gmm_models
from experiments import gmm_study as study
from experiments.gmm_models import chain_traces, held_out_gmm, mixture_group
from neuralblock.kernels.base import sequential_init


def test_gmm_study_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_study.json").read_text())
    # the one-chain, wall-clock defaults stay out of the configuration (the committed folders keep their hash)
    assert "chains" not in saved["config"] and "clock" not in saved["config"]
    (result,) = saved["results"]
    assert set(result["runs"]) == {study.NB, study.SM}
    for runs in result["runs"].values():
        assert all(run["sweeps"] >= 1 and min(run["active"]) >= 1 for run in runs)
    # Both samplers climb from the sequential start (600 to 1450 nats below the data's log-likelihood under the true
    # mixture, seeds 0-2) to within 3 nats of it in 5 to 32 sweeps. The 50-nat band is loose for load (fewer sweeps)
    # and seeds, yet a kernel that never accepts, or accepts from a wrong ratio and drifts off, stays far outside it.
    true_log_lik = result["reference"]["true_log_lik"]
    for label, runs in result["runs"].items():
        for run in runs:
            assert run["log_lik"][0] < true_log_lik - 200, (label, run["log_lik"][0], true_log_lik)
            assert abs(run["log_lik"][-1] - true_log_lik) < 50, (label, run["log_lik"][-1], true_log_lik)
    sm = next(row for row in result["summary"] if row["sampler"] == study.SM)
    assert sm["runs reaching SM final"] == "1/1"  # its own median final level, reached by its only run
    ratio = record["target"]["ratio"]
    assert ratio is None or ratio >= 0.0
    for name in ("gmm_study.md", "gmm_study_loglik.png", "gmm_study_active.png"):
        assert (folder / name).stat().st_size > 0


def test_gmm_study_quick_mode_with_vectorized_chains(tmp_path: Path) -> None:
    """``--chains 2``: each run is two chains in one kernel per sampler, and every statistic counts chains."""
    record = study.main(["--quick", "--chains", "2", "--clock", "cpu", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_study.json").read_text())
    assert saved["config"]["chains"] == 2 and saved["config"]["clock"] == "cpu"
    (result,) = saved["results"]
    # the starts the study draws for run 0 (seed 0): two chains from different states, the same for both samplers
    fg, _, reference = held_out_gmm(8, 60, 40_000 + 1000 * 8 + 60)
    start = sequential_init(fg, torch.Generator().manual_seed(0), chains=2)
    start_log_lik = mixture_group(fg).log_factors(start).sum(-1).tolist()
    assert start_log_lik[0] != start_log_lik[1]
    true_log_lik = reference["true_log_lik"]
    for label, (run,) in result["runs"].items():
        assert run["sweeps"] >= 1 and len(run["times"]) == run["sweeps"] + 1
        chains = chain_traces(run)
        assert len(chains) == 2  # one trace per chain, each read at the run's times
        for c, chain in enumerate(chains):
            assert len(chain["log_lik"]) == len(chain["log_joint"]) == len(chain["active"]) == len(run["times"])
            assert chain["log_lik"][0] == pytest.approx(start_log_lik[c], abs=1e-3), (label, c)
            assert min(chain["active"]) >= 1
            # as in the one-chain test: hundreds of nats up from the start to near the truth in 1 s, every chain
            assert chain["log_lik"][0] < true_log_lik - 200, (label, c, chain["log_lik"][0], true_log_lik)
            assert abs(chain["log_lik"][-1] - true_log_lik) < 50, (label, c, chain["log_lik"][-1], true_log_lik)
    rows = {row["sampler"]: row for row in result["summary"]}
    # counted over the run's two chains; the level is the lower of their finals, which both reach by the end
    assert rows[study.SM]["runs reaching SM final"] == "2/2"
    finals = [chain["active"][-1] for chain in chain_traces(result["runs"][study.NB][0])]
    assert rows[study.NB]["median final M"] == min(finals)  # the lower median of two chains
    assert record["target"]["ratio"] is None or record["target"]["ratio"] >= 0.0
    text = (folder / "gmm_study.md").read_text()
    assert "2 vectorized chains in one kernel" in text and "CPU time" in text
    for name in ("gmm_study_loglik.png", "gmm_study_active.png"):
        assert (folder / name).stat().st_size > 0


def test_gmm_study_rejects_no_chains() -> None:
    with pytest.raises(SystemExit):
        study.parse_args(["--chains", "0"])


def test_gmm_study_doctests() -> None:
    """experiments/ is outside the doctest paths of the pytest config, so its examples run here."""
    for module in (study, gmm_models):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, (module.__name__, result)
