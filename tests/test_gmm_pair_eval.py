"""The gmm_pair proposal evaluation runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from test_experiments_quick import load


def test_gmm_pair_eval_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("gmm_pair_eval")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_pair.json").read_text())
    assert [row["proposal"] for row in saved["held_out"]] == ["NB(gmm_pair)", "prior proposal"]
    for row in record["held_out"]:
        assert 0.0 <= row["acceptance"] <= 1.0 and row["nll"] > -50
    labels = [row["sampler"] for row in record["summary"]]
    assert labels == ["Gibbs", "prior pair + Gibbs", "NB(gmm_pair) + Gibbs"]
    for model in saved["mcmc"]["models"]:
        for label in labels:
            run = model[label]
            assert run["sweeps"] >= 1 and len(run["times"]) == len(run["log_joint"]) == len(run["active"])
            assert min(run["active"]) >= 1
    assert (folder / "gmm_pair.md").read_text().count("|") > 20
    assert (folder / "gmm_pair.png").stat().st_size > 0
