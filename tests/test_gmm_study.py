"""The open-universe GMM study runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from test_experiments_quick import load


def test_gmm_study_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("gmm_study")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_study.json").read_text())
    (result,) = saved["results"]
    assert set(result["runs"]) == {study.NB, study.SM}
    for runs in result["runs"].values():
        assert all(run["sweeps"] >= 1 and min(run["active"]) >= 1 for run in runs)
    sm = next(row for row in result["summary"] if row["sampler"] == study.SM)
    assert sm["runs reaching SM final"] == "1/1"  # its own median final level, reached by its only run
    ratio = record["target"]["ratio"]
    assert ratio is None or ratio >= 0.0
    for name in ("gmm_study.md", "gmm_study_loglik.png", "gmm_study_active.png"):
        assert (folder / name).stat().st_size > 0
