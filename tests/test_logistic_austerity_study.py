"""The logistic-regression austerity study runs end to end at CI scale and writes its outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments import logistic_austerity as study
from experiments import logistic_models
from neuralblock.diagnostics.runs import ErrorTrace, first_time


def test_logistic_austerity_quick_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "logistic_austerity.json").read_text())
    assert saved["config"]["quick"] is True
    assert [d["role"] for d in saved["datasets"]] == ["scaling", "scaling", "real", "nuts", "bias"]
    assert saved["config"]["batch_growth"] == 2.0
    for d in saved["datasets"]:
        assert d["reference_ess"] > 10
        exact = d["runs"]["exact MH"]
        assert exact["diagnostics"]["data_fraction"] == 1.0 and exact["transitions"] > 0
        assert exact["curves"]["risk"] and all(r >= 0 for r in exact["curves"]["risk"])
        aus = d["runs"]["austerity eps=0.05"]
        assert 0 < aus["diagnostics"]["data_fraction"] < 1.0
        assert aus["diagnostics"]["sublinear"] is True
    big = max(saved["datasets"][:2], key=lambda d: d["N"])
    # a few mini-batches of 100 out of 20000 sections: the control variate keeps decisions early
    assert big["runs"]["austerity eps=0.05"]["diagnostics"]["data_fraction"] < 0.05
    assert set(record["targets"]) >= {"data_fraction_at_N_large", "time_per_transition_growth", "nuts_comparison"}
    bias = saved["bias"]
    assert bias[0]["method"] == "exact MH" and {r["draws"] for r in bias} == {150}
    assert any(r["method"].startswith("austerity (seed test)") for r in bias)
    assert all(r["mean_mcse_sd"] > 0 and r["sd_z_rms"] >= 0 for r in bias)
    # 150 draws per arm against the importance-sampling reference: every arm's mean is within 0.01-0.22 posterior sd
    # and its sd within 0.04-0.13 (relative), acceptance 0.6-0.91 (seeds 0-1). The bounds are loose for 150 draws,
    # but a wrong Hastings term under the Laplace independence proposal piles draws at or away from the mode.
    for r in bias:
        assert r["mean_error_sd"] < 0.6 and r["sd_error_sd"] < 0.4 and 0.2 < r["acceptance"] < 0.98, r
    # exact MH ends within 0.12 sd of each data set's reference (seeds 0-1), acceptance 0.28-0.89
    for d in saved["datasets"]:
        exact = d["runs"]["exact MH"]
        assert exact["curves"]["mean_error"][-1] < 0.5, (d["role"], d["N"], exact["curves"]["mean_error"][-1])
        assert 0.1 < exact["diagnostics"]["acceptance_rate"] < 0.97, (d["role"], d["N"], exact["diagnostics"])
    # antithetic importance sampling: the reference's own error is far below the chains'
    ref_mcse = next(d for d in saved["datasets"] if d["role"] == "bias")["reference_mean_mcse_max"]
    assert ref_mcse < min(r["mean_mcse_sd"] for r in bias)
    assert (folder / "logistic_austerity.md").read_text().count("|") > 50
    assert {p.name for p in folder.glob("*.png")} == {
        "logistic_risk.png", "logistic_scaling_bias.png", "logistic_mean_risk.png"
    }  # fmt: skip
    for d in (d for d in saved["datasets"] if d["role"] == "scaling"):
        rep = d["replicated"]
        assert rep["replicates"] == 3 and all(len(counts) == 3 for counts in rep["transitions"].values())
        assert len(rep["curve_seconds"]) == len(rep["mean_risk"]["exact MH"]) == 200
        assert rep["exact_mean_final_risk"] > 0 and rep["end_seconds"] > 0
    assert set(record["targets"]["time_fraction_of_exact_mean_risk"]) == {d["N"] for d in saved["datasets"][:2]}
    # first-draw crossing times never exceed the checkpoint curves' (a checkpoint sees a draw at or before it). The
    # saved curves carry 4 significant digits: an error of 0.10004 reads 0.1, so the curves' crossing is taken at
    # 0.1 less that rounding (a clean-clone CI run read a checkpoint's rounded 0.1 at 0.39 s, the first draw below
    # 0.1 came at 0.46 s)
    for d in saved["datasets"]:
        for run in d["runs"].values():
            timing = run["timing"]  # the harness's split: the clock counts setup (and NUTS warmup) before the draws
            assert timing["clock"] == "wall" and timing["samples"] == run["transitions"]
            assert math.isclose(run["seconds"], timing["setup_s"] + timing["warmup_s"] + timing["sampling_s"])
            if not run["transitions"]:
                continue
            curve = ErrorTrace(run["curves"]["seconds"], run["curves"]["mean_error"])
            dense, coarse = run.get("seconds_to_0.1_sd"), first_time(curve, 0.1 * (1 - 1e-3), for_good=False)
            if coarse is not None:
                assert dense is not None and dense <= coarse * (1 + 1e-3)


def test_laplace_fit_with_a_subsampled_fisher_finds_the_exact_mode() -> None:
    import torch

    ds = logistic_models.synthetic(20_000, 4, torch.Generator().manual_seed(1), test=10)
    mode, cov, hessian = logistic_models.laplace_fit(ds, fisher_rows=1_000)  # Newton steps with a 1000-row Fisher
    exact_mode, exact_cov, exact_hessian = logistic_models.laplace_fit(ds, fisher_rows=10**9)  # plain Newton
    sd = exact_cov.diagonal().sqrt()
    assert float(((mode - exact_mode) / sd).abs().max()) < 1e-3
    torch.testing.assert_close(cov, exact_cov, rtol=1e-4, atol=0)  # the exact Fisher at the mode
    torch.testing.assert_close(hessian, exact_hessian, rtol=1e-4, atol=1e-3)
