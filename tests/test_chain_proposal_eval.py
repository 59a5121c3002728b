"""The chain-proposal evaluation runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from test_experiments_quick import load


def test_chain_proposal_eval_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("chain_proposal_eval")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "chain_proposal.json").read_text())
    assert [row["family"] for row in saved["held_out"]] == ["linear", "volatility", "mixed"]
    linear, volatility, _ = record["held_out"]
    assert linear["nll_gap"] is not None and volatility["nll_gap"] is None
    assert 0.0 <= volatility["acceptance"] <= 1.0 and 0.0 <= volatility["whitening_acceptance"] <= 1.0
    for label in ("single-site RW-MH", "NB(chain) + single-site"):
        assert saved["sp500"][label]["seconds"] > 0 and saved["sp500"][label]["median_ess"] > 0
    assert (folder / "chain_proposal.md").read_text().count("|") > 20
    assert (folder / "chain_proposal.png").stat().st_size > 0
