"""The tempered-acceptance study (issue 22, item 2) at CI scale."""

from __future__ import annotations

from pathlib import Path

from experiments import tempered_acceptance


def test_quick_run_reports_acceptance_per_temperature(tmp_path: Path) -> None:
    record = tempered_acceptance.main(["--quick", "--out", str(tmp_path)])
    (run,) = record["runs"]
    assert run["instance"] == "Grids_11" and len(run["beta"]) == 4
    assert run["beta"][0] == 1.0 and run["beta"][-1] < run["beta"][0]
    # the untempered proposal fits the beta = 1 conditional (0.99 in development runs) and misses the hottest
    # replica's far more often (0.29); the powered proposal keeps it high (0.87 at T = 10 over 300 sweeps)
    accept, powered = run["block_acceptance"], run["block_acceptance_tempered"]
    assert accept[0] > 0.9 and accept[-1] < accept[0] - 0.3
    assert powered[-1] > accept[-1] + 0.3
    folder = next(tmp_path.iterdir())
    assert {p.name for p in folder.iterdir()} >= {"tempered_acceptance.json", "tempered_acceptance.md"}
    assert (folder / "tempered_acceptance.png").stat().st_size > 0
