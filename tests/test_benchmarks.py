"""Smoke test of the benchmark scripts in ``benchmarks/`` (quick mode, < 30 s)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(120)
def test_gibbs_throughput_quick(tmp_path: Path) -> None:
    bench = _load("gibbs_throughput")
    result = bench.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gibbs_throughput.json").read_text())
    assert (tmp_path / "gibbs_throughput.md").read_text().startswith("# Gibbs throughput")
    assert data["quick"] and data["threads"] == 1
    assert set(data["implementations"]) == {"vectorized_mcmc", "vectorized_raw", "naive", "bridge_mcmc"}
    for name, impl in data["implementations"].items():
        assert impl["median_updates_per_second"] > 0, name
        assert all(rate > 0 for rate in impl["rates"]), name
        assert impl["peak_rss_mb"] >= impl["rss_after_imports_mb"] > 0, name
    assert data["bridge_check"]["max_abs_log_joint_error"] < 1e-3
    assert all(ratio > 0 for ratio in data["ratios"].values())
    assert result["ratios"] == data["ratios"]


@pytest.mark.timeout(120)
def test_block_throughput_quick(tmp_path: Path) -> None:
    bench = _load("block_throughput")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "block_throughput.json").read_text())
    assert (tmp_path / "block_throughput.md").read_text().startswith("# Neural block throughput")
    (row,) = data["graphs"].values()
    assert row["instances"] == 25 and row["classes"] >= 2  # a 6x6 grid has 5x5 windows of 2x2
    assert all(rate > 0 for rates in row["blocks_per_second"].values() for rate in rates)
    assert row["ratio"] == result["graphs"]["random grid BN 6x6"]["ratio"] > 0
