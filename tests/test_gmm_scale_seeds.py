"""The GMM benchmark's targets over seeds: per-size and per-seed counts on hand-made records, outputs, bad input."""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path
from typing import Any

import pytest

from experiments import gmm_scale_seeds as seeds
from experiments.gmm_scale import NB_SET, exchangeable_miss_probability, fewer_hits_p_value
from experiments.gmm_study import SM


def _arm(ratio: float | None, at_mode: int, in_set: int, stuck: int = 0, chains: int = 5) -> dict[str, Any]:
    """An arm's metrics; its median time to the level is ``ratio`` (split-merge's arm is given 1.0)."""
    return {
        "median time to level": ratio,
        "chains with mode = SM mode": at_mode,
        "chains with mode in SM mode set": in_set,
        "stuck": [True] * stuck + [False] * (chains - stuck),
    }


def _record(folder: Path, seed: int, cases: list[tuple[int, int, dict[str, Any]]], chains: int = 5) -> Path:
    results = [{"m": m, "n": n, "family": "model", "metrics": metrics} for m, n, metrics in cases]
    folder.mkdir(parents=True)
    config = {"seed": seed, "chains": chains}
    (folder / "gmm_scale.json").write_text(json.dumps({"config": config, "results": results}))
    return folder


def test_counts_per_size_and_seed_and_pools_over_seeds(tmp_path: Path) -> None:
    first = _record(
        tmp_path / "a",
        1,
        [
            (8, 60, {NB_SET: _arm(0.9, 5, 5), SM: _arm(1.0, 5, 5)}),  # m < 12: only "never slower" applies
            (12, 60, {NB_SET: _arm(0.2, 2, 5), SM: _arm(1.0, 4, 5)}),  # mode missed at 12 x 60
            (12, 60, {NB_SET: _arm(0.4, 5, 5), SM: _arm(1.0, 4, 4)}),
            (12, 240, {NB_SET: _arm(None, 5, 5, stuck=2), SM: _arm(1.0, 3, 5)}),  # never reached: time missed
        ],
    )
    second = _record(
        tmp_path / "b",
        2,
        [
            (8, 60, {NB_SET: _arm(1.5, 4, 5), SM: _arm(1.0, 5, 5)}),  # slower; fewer at the mode (m < 12)
            (12, 60, {NB_SET: _arm(0.1, 5, 5), SM: _arm(1.0, 1, 5)}),
            (12, 240, {NB_SET: _arm(0.3, 4, 5), SM: _arm(1.0, 5, 5)}),  # mode missed at 12 x 240
        ],
    )
    record = seeds.main(["--runs", str(first), str(second), "--labels", "one", "two", "--out", str(tmp_path / "out")])
    by_size = {(row["m"], row["n"]): row for row in record["sizes"]}
    small, mid, wide = by_size[(8, 60)], by_size[(12, 60)], by_size[(12, 240)]
    assert (small["one: time"], small["two: time"]) == ("0.90", "1.50")
    assert (mid["one: time"], mid["one: mode SM / NB"], mid["two: mode SM / NB"]) == ("0.40", "8 / 7", "1 / 5")
    assert (wide["one: time"], wide["one: stuck"], wide["two: mode SM / NB"]) == ("never", 2, "5 / 4")
    assert mid["pooled: mode SM / NB"] == "9 / 12" and wide["pooled: mode SM / NB"] == "8 / 9"
    # pooled over both seeds: 12 x 60 has 15 chains per arm (10 + 5), 12 x 240 10 (5 + 5)
    assert mid["pooled: fewer p"] == round(fewer_hits_p_value(12, 9, 15), 3) == 0.946
    assert wide["pooled: fewer p"] == round(fewer_hits_p_value(9, 8, 10), 3)
    one, two = record["seeds"]
    assert (one["seed"], one["time target (sizes)"], one["mode target (sizes)"]) == ("one", "1 of 2", "1 of 2")
    assert (one["mode missed at (any m)"], one["stuck NB (any m)"]) == ("12 x 60", 2)
    assert one["slower cases (any m)"] == 1
    assert (one["chains at mode SM / NB"], one["mode-set target (sizes)"]) == ("11 / 12", "2 of 2")
    assert (two["time target (sizes)"], two["mode target (sizes)"], two["slower cases (any m)"]) == (
        "2 of 2",
        "1 of 2",
        1,
    )
    assert two["mode missed at (any m)"] == "8 x 60, 12 x 240" and small["pooled: mode SM / NB"] == "10 / 9"
    # sizes with m >= 12 only, each with its cases' chains (5), not the size's (10)
    miss_mid = exchangeable_miss_probability([2, 5], [4, 4], 5)
    miss_wide = exchangeable_miss_probability([5], [3], 5)
    assert one["P(all met) as good as SM"] == round((1 - round(miss_mid, 3)) * (1 - round(miss_wide, 3)), 2)
    (folder,) = (tmp_path / "out").iterdir()
    saved = json.loads((folder / "gmm_scale_seeds.json").read_text())
    assert saved["sizes"] == record["sizes"] and saved["config"]["labels"] == ["one", "two"]
    text = (folder / "gmm_scale_seeds.md").read_text()
    assert "| 12 | 60 | 0.40 | 8 / 7 | 0 | 0.10 | 1 / 5 | 0 | 9 / 12 |" in text
    assert (folder / "gmm_scale_seeds.png").stat().st_size > 0


def test_the_default_labels_are_the_seeds(tmp_path: Path) -> None:
    metrics = {NB_SET: _arm(0.1, 5, 5), SM: _arm(1.0, 5, 5)}
    runs = [str(_record(tmp_path / name, seed, [(12, 60, metrics)])) for name, seed in (("a", 13), ("b", 14))]
    record = seeds.main(["--runs", *runs, "--out", str(tmp_path / "out")])
    assert [row["seed"] for row in record["seeds"]] == ["13", "14"]


def test_runs_that_differ_in_more_than_the_seed_are_refused(tmp_path: Path) -> None:
    metrics = {NB_SET: _arm(0.1, 5, 5), SM: _arm(1.0, 5, 5)}
    run = str(_record(tmp_path / "run", 1, [(12, 60, metrics)]))
    same_seed = str(_record(tmp_path / "same", 1, [(12, 60, metrics)]))
    other_chains = str(_record(tmp_path / "chains", 2, [(12, 60, metrics)], chains=3))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "gmm_scale.json").write_text("{not json")
    out = ["--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="seed repeats"):
        seeds.main(["--runs", run, same_seed, *out])
    with pytest.raises(ValueError, match="differ in chains"):
        seeds.main(["--runs", run, other_chains, *out])
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        seeds.main(["--runs", run, other_chains, "--labels", "x", *out])
    with pytest.raises(ValueError, match="not a gmm_scale record"):
        seeds.main(["--runs", run, str(tmp_path / "broken"), *out])
    older = {arm: {k: v for k, v in metrics[arm].items() if k != seeds.MODE_SET} for arm in metrics}
    with pytest.raises(
        ValueError, match="seed-2 run lacks the arm or metric 'chains with mode in SM mode set'.*rescore"
    ):
        seeds.main(["--runs", run, str(_record(tmp_path / "older", 2, [(12, 60, older)])), *out])
    no_nb = {SM: metrics[SM]}
    with pytest.raises(ValueError, match=re.escape(f"seed-3 run lacks the arm or metric '{NB_SET}'")):
        seeds.main(["--runs", run, str(_record(tmp_path / "no_nb", 3, [(12, 60, no_nb)])), *out])
    malformed = {SM: metrics[SM], NB_SET: {**metrics[NB_SET], "stuck": 3}}
    with pytest.raises(ValueError, match="seed-4 run has a malformed metric"):
        seeds.main(["--runs", run, str(_record(tmp_path / "malformed", 4, [(12, 60, malformed)])), *out])
    uneven = {NB_SET: _arm(0.1, 3, 3, chains=3), SM: _arm(1.0, 3, 3, chains=3)}
    with pytest.raises(ValueError, match=r"12 x 60 cases have different numbers of chains: \[3, 5\]"):
        seeds.main(["--runs", run, str(_record(tmp_path / "uneven", 5, [(12, 60, metrics), (12, 60, uneven)])), *out])
    with pytest.raises(ValueError, match=r"the labels must differ: \['x'\] repeat"):
        seeds.main(["--runs", run, str(tmp_path / "older"), "--labels", "x", "x", *out])
    assert not (tmp_path / "out").exists()


def test_a_size_missing_from_a_run_is_pooled_over_the_others(tmp_path: Path) -> None:
    metrics = {NB_SET: _arm(0.1, 5, 5), SM: _arm(1.0, 4, 5)}
    both = _record(tmp_path / "a", 1, [(12, 60, metrics), (16, 60, metrics)])
    one = _record(tmp_path / "b", 2, [(12, 60, metrics)])
    record = seeds.main(["--runs", str(both), str(one), "--out", str(tmp_path / "out")])
    wide = {(row["m"], row["n"]): row for row in record["sizes"]}[(16, 60)]
    assert (wide["1: time"], wide["2: time"], wide["2: mode SM / NB"]) == ("0.10", "-", "-")
    assert wide["pooled: mode SM / NB"] == "4 / 5" and wide["pooled: fewer p"] == round(fewer_hits_p_value(5, 4, 5), 3)


def test_doctests() -> None:
    result = doctest.testmod(seeds)
    assert result.attempted > 0 and result.failed == 0
