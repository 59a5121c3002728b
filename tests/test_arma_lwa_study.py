"""The ARMA(1,1) LWA study runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import arma_lwa as study


def test_arma_lwa_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path), "--no-progress"])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "arma_lwa.json").read_text())
    assert saved["config"]["quick"] is True
    ref = saved["reference"]
    # the Laplace reference at N = 20000 sits within 5 sd of the simulating θ*
    assert all(abs(m - t) < 5 * s for m, t, s in zip(ref["mean"], study.TRUE_THETA, ref["sd"]))
    labels = [row["label"] for row in record["runs"]]
    assert labels[0].startswith("exact") and any(label.startswith("n=100 ") for label in labels)
    for row in record["runs"]:
        assert row["iterations"] > 5 and row["seconds"] > 0
        trace = saved["traces"][row["label"]]
        assert all(b >= a for a, b in zip(trace["t"], trace["t"][1:]))
    for row in record["runs"]:  # exact MH runs on all the data, LWA on subsets
        assert (row["n"] == saved["config"]["num_data"]) == row["label"].startswith("exact")
    targets = saved["targets"]  # the n = 100 target runs its own replicates, with seeds and both z readings
    assert len(targets["n100_max_abs_z_true_own_sd"]) == saved["config"]["target_replicates"] == 2
    assert len(set(targets["n100_seeds"])) == 2 and len(targets["n100_max_abs_z_true_mcse"]) == 2
    oracle = saved["lwa_target_by_enumeration"]  # LWA's own θ-target, from all windows
    assert oracle["n"] == 100 and 1.0 <= oracle["effective_windows"] <= 20_000 - 99
    assert all(s > 0 for s in oracle["sd"]) and len(oracle["z_true"]) == 3
    pdb = saved["posteriordb"]
    assert pdb["params"] == ["mu", "phi", "theta", "sigma"] and len(pdb["z"]) == 4
    assert abs(pdb["mean"][1] - pdb["ref_mean"][1]) < 0.1  # phi ≈ 0.957 even from a short chain
    assert (folder / "arma_lwa.md").read_text().count("|") > 30
    assert {p.name for p in folder.glob("*.png")} == {"arma_lwa_traces.png", "arma_lwa_bias.png"}
