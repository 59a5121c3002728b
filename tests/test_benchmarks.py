"""Smoke test of the benchmark scripts in ``benchmarks/`` (quick mode, < 30 s)."""

from __future__ import annotations

import importlib.util
import json
import logging
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


@pytest.mark.timeout(300)
def test_fused_blocks_quick(tmp_path: Path) -> None:
    bench = _load("fused_blocks")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "fused_blocks.json").read_text())
    assert (tmp_path / "fused_blocks.md").read_text().startswith("# Fused neural block sweeps")
    row = data["grids"]["Grids_11"]
    assert set(row["per_chain_sweep_ms"]) == {
        "nb_K1",
        "nb_K8",
        "gibbs_K1",
        "gibbs_K8",
        "nb_K1_torch",
        "nb_K8_torch",
        "gibbs_K1_torch",
        "nb_K1_numpy",
        "nb_K8_numpy",
        "gibbs_K1_numpy",
        "nbcover_K1",
        "nbcover_K8",
    }
    assert all(value > 0 for value in row["per_chain_sweep_ms"].values())
    assert 0.9 < row["acceptance"] <= 1.0  # the shipped proposal on a grid it was not trained on
    precision = data["precision"]
    assert precision["rows"] == 100 * 2**8  # every context of every 2x2 window of the 10x10 torus
    assert 0.0 <= precision["kl_fp32_bf16"] < 1e-2
    assert abs(precision["acceptance_fp32"] - precision["acceptance_bf16"]) < 0.01
    assert result["grids"]["Grids_11"]["ratios"] == row["ratios"]


@pytest.mark.timeout(120)
def test_gmm_single_site_quick(tmp_path: Path) -> None:
    bench = _load("gmm_single_site")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gmm_single_site.json").read_text())
    assert (tmp_path / "gmm_single_site.md").read_text().startswith("# The single-site sweep of open-universe GMMs")
    row = data["sizes"]["8x60"]
    assert set(row["ms_per_sweep"]) == {"compiled", "general", "compiled + informed", "default"}
    assert all(ms > 0 for ms in row["ms_per_sweep"].values())
    assert list(row["ratios"]) == ["compiled / general", "(compiled + informed) / compiled", "default / compiled"]
    assert all(ratio > 0 for ratio in row["ratios"].values())
    assert result["sizes"] == data["sizes"]


@pytest.mark.timeout(180)
def test_gmm_mean_moves_quick(tmp_path: Path) -> None:
    bench = _load("gmm_mean_moves")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gmm_mean_moves.json").read_text())
    assert (tmp_path / "gmm_mean_moves.md").read_text().startswith("# What the informed mean moves buy")
    (case,) = data["cases"]
    assert (case["m"], case["n"], case["family"]) == (8, 60, "model")
    assert set(case["time_to_level"]) == {f"{s} ({w})" for s in bench.SAMPLERS for w in ("walk", "informed")}
    assert case["time_to_level"]["split-merge (walk)"] is not None  # its own chains reach the level they set
    assert all(0.0 <= rate <= 1.0 for rate in case["informed_mean_acceptance"].values())
    assert set(data["summary"]) == set(case["ratios"])
    assert result["summary"] == data["summary"]


@pytest.mark.timeout(180)
def test_gmm_split_candidates_quick(tmp_path: Path) -> None:
    bench = _load("gmm_split_candidates")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gmm_split_candidates.json").read_text())
    assert (tmp_path / "gmm_split_candidates.md").read_text().startswith("# What the split candidates buy")
    (case,) = data["cases"]
    assert (case["m"], case["n"], case["family"], case["seed"]) == (8, 500, "model", 106)
    assert set(case["time_to_level"]) == set(bench.SAMPLERS)
    assert case["time_to_level"]["split-merge"] is not None  # its own chains reach the level they set
    assert set(case["ratios"]) == {"NB (no splits) / split-merge", "NB (splits) / split-merge", "splits / no splits"}
    assert result["summary"] == data["summary"] and data["repeats"] == 2


@pytest.mark.timeout(120)
def test_split_merge_sweep_quick(tmp_path: Path) -> None:
    bench = _load("split_merge_sweep")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "split_merge_sweep.json").read_text())
    assert (tmp_path / "split_merge_sweep.md").read_text().startswith("# Split-merge sweeps of open-universe GMMs")
    row = data["sizes"]["8x60"]
    assert set(row["ms_per_sweep"]) == set(row["us_per_chain_attempt"]) == set(bench.ARMS)
    assert all(ms > 0 for ms in row["ms_per_sweep"].values())
    assert list(row["ratios"]) == ["compiled / eager", "compiled / eager, all-point births"]
    assert all(ratio > 0 for ratio in row["ratios"].values())
    assert result["sizes"] == data["sizes"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("cover", "name", "words"), [("every", "gmm_pair_step", "every"), ("rounds", "gmm_pair_step_rounds", "one round")]
)
def test_gmm_pair_step_quick(tmp_path: Path, cover: str, name: str, words: str) -> None:
    bench = _load("gmm_pair_step")
    result = bench.main(["--quick", "--cover", cover, "--out", str(tmp_path)])
    data = json.loads((tmp_path / f"{name}.json").read_text())
    text = (tmp_path / f"{name}.md").read_text()
    assert text.startswith("# The mixture-pair sweep of a gmm_pair_set") and f"one sweep decides {words}" in text
    assert data["cover"] == cover
    row = data["sizes"]["8x60"]
    assert row["fused"] and set(row["ms_per_sweep"]) == {"compiled", "fresh", "network", "eager"}  # no baseline
    assert all(ms > 0 for ms in row["ms_per_sweep"].values())
    assert list(row["ratios"]) == ["compiled / fresh", "compiled / network", "network / eager"]
    assert all(0.0 < rate <= 1.0 for rate in row["acceptance"].values())
    assert result["sizes"] == data["sizes"]
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "16by60"])


@pytest.mark.timeout(120)
def test_gmm_chains_quick(tmp_path: Path) -> None:
    bench = _load("gmm_chains")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gmm_chains.json").read_text())
    assert (tmp_path / "gmm_chains.md").read_text().startswith("# Chain-batched open-universe GMM samplers")
    arms = {f"{arm}_K{k}" for arm in ("split_merge", "nb", "nb_general", "single") for k in (1, 4)}
    assert set(data["per_chain_transition_ms"]) == arms
    assert all(value > 0 for value in data["per_chain_transition_ms"].values())
    assert data["moves_per_sweep"] == data["pairs"] == 28  # the pairs of m = 8 mixtures
    assert all(data["updates_per_second"][f"{arm}_K4"] > 0 for arm in ("split_merge", "nb"))
    assert 0.5 < data["acceptance"]["nb_K1"] <= 1.0  # gmm_pair at the true state: most pairs stay put
    assert 0.5 < data["acceptance"]["nb_general_K1"] <= 1.0  # the general path: the same chain, other draws
    assert result["ratios"] == data["ratios"] and all(ratio > 0 for ratio in data["ratios"].values())


@pytest.mark.timeout(120)
def test_grid_blocks_quick(tmp_path: Path) -> None:
    bench = _load("grid_blocks")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "grid_blocks.json").read_text())
    assert (tmp_path / "grid_blocks.md").read_text().startswith("# Larger blocks")
    assert (tmp_path / "grid_blocks.png").stat().st_size > 0
    (run,) = data["grids"]["Grids_11"]["runs"]
    assert set(bench.ARMS) <= set(run)
    assert all(run[arm]["ms_per_chain_sweep"] > 0 for arm in bench.ARMS)
    assert 0.9 < run["NB 2x2+Gibbs"]["acceptance"] <= 1.0
    assert run["exact 3x3+Gibbs"]["samples"] == run["nb3_sweeps"] == run["NB 3x3+Gibbs"]["samples"]
    assert run["NB 3x3+Gibbs"]["proposal_cache"]["slots"]  # 4096 context values per block: rows as visited
    assert all(0.0 <= run[arm]["error_at_equal_time"] <= 1.0 for arm in ("Gibbs", "NB 2x2+Gibbs", "NB 3x3+Gibbs"))
    assert result["verdict"] == data["verdict"] and data["verdict"]["grids"] == 1
    again = bench.main(["--from-json", str(tmp_path / "grid_blocks.json"), "--out", str(tmp_path / "again")])
    assert again["verdict"] == data["verdict"]
    assert (tmp_path / "again" / "grid_blocks.md").read_text() == (tmp_path / "grid_blocks.md").read_text()


def test_grid_blocks_exact_reference_draws_block_conditionals() -> None:
    """One colour class of ``ExactBlockGibbs``: every block's draws follow its exact conditional (from log_joint)."""
    bench = _load("grid_blocks")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    fg = bench.read_uai(bench.uai_grid("Grids_11"))
    chains = 8_000
    kernel = bench.ExactBlockGibbs(fg, bench.load_pretrained(bench.PROPOSAL2), chains=chains, gibbs_prob=0.0)
    kernel.setup(0)
    kernel.classes = kernel.classes[:1]  # blocks of one class are conditionally independent given the rest
    start = (torch.rand(fg.num_variables) < 0.5).float()
    out = kernel.sample({"x": start.expand(chains, -1).clone()})["x"]
    blocks = kernel.classes[0][1].view(-1, 4)
    for block in blocks:
        code = (out[:, block].long() * torch.tensor([8, 4, 2, 1])).sum(-1)
        freq = torch.bincount(code, minlength=16).double() / chains
        states = start.expand(16, -1).clone()
        states[:, block] = ((torch.arange(16)[:, None] >> torch.tensor([3, 2, 1, 0])) & 1).float()
        exact = torch.softmax(fg.log_joint(states).double(), 0)
        assert (freq - exact).abs().max() < 0.03  # 5.4 binomial sd at worst (p = 1/2, 8000 draws)


@pytest.mark.timeout(300)
def test_gradient_compile_quick(tmp_path: Path) -> None:
    rows = _load("gradient_compile").main(["--quick", "--out", str(tmp_path)])
    assert {row["kernel"] for row in rows} == {"GWG", "PAS", "DMALA"}
    assert all(row["eager_ms"] > 0 and row["compiled_ms"] > 0 and row["compile_s"] > 0 for row in rows)
    data = json.loads((tmp_path / "gradient_compile.json").read_text())
    assert data["rows"] == rows
    assert (tmp_path / "gradient_compile.md").read_text().startswith("# torch.compile for the gradient-informed")


@pytest.mark.timeout(120)
def test_joint_dpm_floor(tmp_path: Path) -> None:
    bench = _load("joint_dpm_floor")
    result = bench.main(["--repeats", "1", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "joint_dpm_floor.json").read_text())
    assert (tmp_path / "joint_dpm_floor.md").read_text().startswith("# JointDPM flagship")
    assert len(data["seeds"]) == 3 and result["smallest_floor"] == data["smallest_floor"]
    for row in data["seeds"]:
        clusters = round(row["clusters"])
        assert row["z_units"] == row["points_updated"] * (clusters + row["aux"])
        assert row["w_units"] == row["w_updates"] * row["n"]
        assert 0 < row["floor_free_experts"] <= row["floor_at_data_fraction"] < 1
        assert 0 < row["floor_units"] < 1
    assert data["reachable"] == (data["smallest_floor"] <= bench.TARGET)


@pytest.mark.timeout(120)
def test_ladder_adaptation_quick(tmp_path: Path) -> None:
    bench = _load("ladder_adaptation")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "ladder_adaptation.json").read_text())
    assert (tmp_path / "ladder_adaptation.md").read_text().startswith("# Replica exchange: swap rates after")
    assert (tmp_path / "ladder_adaptation.png").stat().st_size > 0
    (runs_by_arm,) = data["cases"].values()
    assert set(runs_by_arm) == {"barrier, W=200", "vousden, W=200"}
    for runs in runs_by_arm.values():
        (run,) = runs
        assert len(run["rates"]) == 15 and all(0.0 <= rate <= 1.0 for rate in run["rates"])
    assert result["cases"]["ising-10-5"] == data["cases"]["ising-10-5"]
    with pytest.raises(ValueError, match="a case is"):
        bench.make_case("torus-10", 0)


@pytest.mark.timeout(120)
def test_replica_cost_quick(tmp_path: Path) -> None:
    bench = _load("replica_cost")
    result = bench.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "replica_cost.json").read_text())
    assert (tmp_path / "replica_cost.md").read_text().startswith("# Replica exchange: CPU cost per transition")
    (row,) = data["grids"].values()
    parts = ("", " warmup", " first", " start")
    toggled = {"nb one call", "nb separate"}  # (the one-call transition against the separate calls, one process)
    assert set(row["median"]) == {f"{arm}{part}" for arm in ("gibbs", "nb") for part in parts} | toggled
    assert all(value > 0 for value in row["median"].values())
    assert row["ratios"]["nb / gibbs"] == result["grids"]["Grids_12"]["ratios"]["nb / gibbs"] > 0
    assert len(row["seconds"]["nb separate"]) == 2 and row["ratios"]["separate / one call, nb"] > 0
    with pytest.raises(ValueError, match="arm must be one of"):
        bench.transition_seconds(BENCHMARKS.parent, "Grids_12", "metropolis", budget=0.1)


def test_mcmc_overhead_quick(tmp_path: Path) -> None:
    rows = _load("mcmc_overhead").main(["--quick", "--out", str(tmp_path)])
    assert [row["arms"] for row in rows] == ["handed back / sites read"] * 2 + ["logging on / logging off"]
    assert all(row["us per step (first)"] > 0 and row["us per step (second)"] > 0 for row in rows)
    data = json.loads((tmp_path / "mcmc_overhead.json").read_text())
    assert set(data["raw"]) == {row["case"] for row in rows} and data["config"]["rounds"] == 1
    assert (tmp_path / "mcmc_overhead.md").read_text().startswith("# Pyro's MCMC loop around a GibbsKernel")
    assert logging.getLogger("pyro.infer.mcmc").level == logging.WARNING  # (the tests' level is restored)
