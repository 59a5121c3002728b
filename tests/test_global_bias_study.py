"""The bias bench (issue 21) runs end to end at CI scale, and its rows show the knobs' bias shrinking."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import global_bias as study


def test_global_bias_quick_writes_outputs(tmp_path: Path) -> None:
    # one logistic case and the AR(1) case keep CI's time (the full run has three)
    record = study.main(["--quick", "--cases", "logistic-corr", "ar1", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "global_bias.json").read_text())
    assert saved["config"]["quick"] is True
    assert [c["case"] for c in saved["cases"]] == ["logistic-corr", "ar1"]
    assert {p.name for p in folder.glob("*")} == {"global_bias.json", "global_bias.md", "global_bias.png"}
    assert (folder / "global_bias.md").read_text().count("|") > 100
    for case in saved["cases"]:
        assert case["reference_ess"] > 1000  # the t(8) Laplace proposal is close to these posteriors
        rows = {(r["method"], r["knob"]): r for r in case["rows"]}
        exact = rows[("exact MH", "eps=0")]
        # the bench's calibration: exact MH agrees with the IS reference. The worst of D <= 5 coordinates
        # beyond 5 MCSEs (chain and reference together) has probability < 1e-5 for a correct chain (the MCSE
        # itself comes from a short chain's ESS, so the real rate is higher, still well below 1e-3)
        tolerance = 5 * (exact["mean_error_mcse"] + case["reference_mean_mcse_sd"])
        assert abs(exact["mean_error_sd"]) < tolerance
        # without a control variate the sd inflation shrinks as epsilon tightens (0.2 -> 0.01): at eps = 0.2
        # the sds come out 3-4x too wide, against an MCSE of about 0.4
        loose, tight = rows[("AusterityMH (no cv)", "eps=0.2")], rows[("AusterityMH (no cv)", "eps=0.01")]
        assert abs(loose["sd_ratio"] - 1) > abs(tight["sd_ratio"] - 1)
        coreset = [r for r in case["rows"] if r["method"].startswith("coreset")]
        if coreset:  # the coreset's mean error shrinks with M (about 2 sds at M ~ 20, 0.2 at M ~ 150-400)
            assert abs(coreset[-1]["mean_error_sd"]) < abs(coreset[0]["mean_error_sd"])
            assert coreset[0]["diagnostics"]["coreset_size"] < coreset[-1]["diagnostics"]["coreset_size"]
    assert set(record["targets"]["default_rows"]) and isinstance(record["targets"]["all_pass"], bool)
