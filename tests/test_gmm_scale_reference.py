"""The GMM benchmark's modes against long reference runs: counts on hand-made records, outputs, bad input."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest

from experiments import gmm_scale_reference as ref
from experiments.gmm_study import SM


def _record(folder: Path, seed: int, cases: list[tuple[int, str, dict[str, dict[str, Any]]]]) -> Path:
    results = [{"m": m, "n": 60, "family": family, "metrics": metrics} for m, family, metrics in cases]
    folder.mkdir(parents=True)
    (folder / "gmm_scale.json").write_text(json.dumps({"config": {"seed": seed}, "results": results}))
    return folder


def _arm(posterior: dict[str, float], modes: list[int], at_sm: int, mode: int) -> dict[str, Any]:
    return {"M posterior": posterior, "chain M modes": modes, "chains with mode = SM mode": at_sm, "M mode": mode}


def test_counts_chains_at_the_pooled_reference_mode(tmp_path: Path) -> None:
    run = _record(
        tmp_path / "run",
        7,
        [
            (8, "model", {SM: _arm({"4": 1.0}, [4, 4, 5], 2, 4), "NB": _arm({"5": 1.0}, [5, 5, 4], 1, 5)}),
            (12, "model", {SM: _arm({"6": 1.0}, [6], 1, 6), "NB": _arm({"6": 1.0}, [6], 1, 6)}),  # no reference
        ],
    )
    # the arms' posteriors average to {4: 0.3, 5: 0.7}: the reference mode is 5, not split-merge's 4
    long_run = _record(
        tmp_path / "long",
        7,
        [(8, "model", {SM: _arm({"4": 0.6, "5": 0.4}, [4], 1, 4), "NB": _arm({"5": 1.0}, [5], 0, 5)})],
    )
    record = ref.main(["--run", str(run), "--references", str(long_run), "--out", str(tmp_path / "out")])
    (row,) = record["cases"]
    assert (row["m"], row["reference mode (P)"], row["SM run's mode"]) == (8, "5 (0.70)", 4)
    assert row[f"{SM}: at reference mode"] == 1 and row["NB: at reference mode"] == 2
    assert row[f"{SM}: at SM run's mode"] == 2 and row["NB: at SM run's mode"] == 1
    assert record["totals"] == {key: value for key, value in row.items() if ": at " in key}
    (folder,) = (tmp_path / "out").iterdir()
    saved = json.loads((folder / "gmm_scale_reference.json").read_text())
    assert saved["reference posteriors"] == {"8x60 model": pytest.approx({"4": 0.3, "5": 0.7})}
    assert "| 8 | 60 | model | 5 (0.70) | 4 |" in (folder / "gmm_scale_reference.md").read_text()
    assert (folder / "gmm_scale_reference.png").stat().st_size > 0


def test_bad_records_are_refused(tmp_path: Path) -> None:
    metrics = {SM: _arm({"4": 1.0}, [4], 1, 4)}
    run = _record(tmp_path / "run", 7, [(8, "model", metrics)])
    other_seed = _record(tmp_path / "seed3", 3, [(8, "model", metrics)])
    other_case = _record(tmp_path / "case", 7, [(8, "overlap", metrics)])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "gmm_scale.json").write_text('{"config": {}}')
    out = ["--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="generator seed 3"):
        ref.main(["--run", str(run), "--references", str(other_seed), *out])
    with pytest.raises(ValueError, match="share no case"):
        ref.main(["--run", str(run), "--references", str(other_case), *out])
    for folder in (tmp_path / "broken", tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a gmm_scale record"):
            ref.main(["--run", str(run), "--references", str(folder), *out])


def test_doctests() -> None:
    assert doctest.testmod(ref).failed == 0
