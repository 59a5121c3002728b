"""The prior-swap study runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from test_experiments_quick import load  # tests/ is on sys.path under pytest


def test_priorswap_study_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("priorswap_study")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "priorswap_study.json").read_text())
    assert saved["config"]["quick"] is True and set(saved["results"]) == set(study.STUDIES)
    res = record["results"]
    # 1-D example: IS weights collapse (tiny ESS) while the swap's estimate stays finite
    oned = res["oned"]
    assert oned["truth_mean"] > oned["false_mean"] and all(r["is_ess"] < r["T"] for r in oned["rows"])
    # linear regression: prior swap's per-iteration time is recorded at both data sizes
    lr = res["linreg"]
    assert set(lr["seconds_per_iteration"]["mh"]) == {str(lr["n_small"]), str(lr["n_large"])}
    for prior in ("Laplace", "StudentT", "VerySparse"):
        methods = {m["method"] for m in lr["priors"][prior]["methods"]}
        assert "IS (false draws)" in methods and any(m.startswith("swap parametric") for m in methods)
    assert any(m["method"].startswith("swap exact") for m in lr["priors"]["Laplace"]["methods"])
    for prior in res["kidiq"]["priors"].values():
        assert all(m["final_error"] is not None and m["final_error"] >= 0 for m in prior["methods"])
    assert res["phishing"]["d"] == 11
    gmm = {r["method"]: r for r in res["gmm"]["rows"]}
    assert set(gmm) >= {"false posterior (collapsed Gibbs)", "IS (false draws)"}
    assert (folder / "priorswap_study.md").read_text().count("|") > 50
    assert {p.name for p in folder.glob("*.png")} == {"oned_error_vs_T.png", "error_vs_time.png", "gmm_repulsive.png"}
