"""The pair proposals' held-out evaluation by model size runs at CI scale and writes JSON, markdown and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import gmm_pair_sizes as study


def test_quick_mode_writes_outputs_and_the_set_proposal_beats_the_prior(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_pair_sizes.json").read_text())
    rows = {row["proposal"]: row for row in saved["rows"]}
    assert list(rows) == ["gmm_pair_copies", "gmm_pair_set", "gmm_pair (old)", "prior"]
    assert record["rows"] == saved["rows"]
    for row in rows.values():
        assert (row["m"], row["n"]) == (8, 60) and 0.0 <= row["acceptance"] <= 1.0
    # the shipped set proposal against the prior on 64 held-out models at m=8, n=60 (seeds 0-2: NLL 7.7-8.5
    # vs 12.0-12.2): a network scoring its own draws wrongly, or fed another motif's features, loses this
    assert rows["gmm_pair_set"]["nll"] < rows["prior"]["nll"] - 1.0, rows
    assert rows["gmm_pair_copies"]["nll"] < rows["prior"]["nll"] - 1.0, rows
    assert (folder / "gmm_pair_sizes.md").read_text().count("|") > 10
    assert (folder / "gmm_pair_sizes.png").stat().st_size > 0


def test_two_proposals_with_one_label_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="alike"):
        study.main(["--quick", "--out", str(tmp_path), "--proposal", "gmm_pair_set", "pretrained/gmm_pair_set"])
