"""The chain-proposal evaluation runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import chain_proposal_eval as study


def test_chain_proposal_eval_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "chain_proposal.json").read_text())
    assert [row["family"] for row in saved["held_out"]] == ["linear", "volatility", "mixed"]
    linear, volatility, _ = record["held_out"]
    assert linear["nll_gap"] is not None and volatility["nll_gap"] is None
    assert 0.0 <= volatility["acceptance"] <= 1.0 and 0.0 <= volatility["whitening_acceptance"] <= 1.0
    # On the linear family the whitened exact conditional is a standard normal: the whitening alone is exact
    # (acceptance 1.0, NLL gap 0.000) and the network within 0.002 of it (seeds 0-2). The bounds are loose for 256
    # instances, but a wrong whitening (mean or Cholesky factor) or network density is off by far more.
    assert linear["whitening_acceptance"] > 0.95 and abs(linear["whitening_nll_gap"]) < 0.05, linear
    assert linear["acceptance"] > 0.9 and abs(linear["nll_gap"]) < 0.05, linear
    for row in record["held_out"]:  # 0.94-0.98 on the volatility and mixed families, seeds 0-2
        assert row["acceptance"] > 0.8, row
    # inside the kernel on the S&P 500 chain: NB block acceptance 0.98, single-site RW-MH 0.31-0.33 (seeds 0-2)
    assert saved["sp500"]["NB(chain) + single-site"]["acceptance"]["chain"] > 0.8
    assert 0.1 < saved["sp500"]["single-site RW-MH"]["acceptance"] < 0.7
    for label in ("single-site RW-MH", "NB(chain) + single-site"):
        assert saved["sp500"][label]["seconds"] > 0 and saved["sp500"][label]["median_ess"] > 0
    assert (folder / "chain_proposal.md").read_text().count("|") > 20
    assert (folder / "chain_proposal.png").stat().st_size > 0
