"""The grid studies run end to end at CI scale and write JSON, markdown and PNG outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_experiments_quick import load  # tests/ is on sys.path under pytest

from neuralblock import ReplicaExchange, load_pretrained


@pytest.mark.parametrize("name", ["gibbs_grids", "grid_study"])
def test_study_quick_mode_writes_outputs(name: str, tmp_path: Path) -> None:
    study = load(name)
    args = ["--quick", "--out", str(tmp_path)] + (["--no-progress"] if name == "gibbs_grids" else [])
    study.main(args)
    (folder,) = list(tmp_path.iterdir())
    record = json.loads((folder / f"{name}.json").read_text())
    assert record["config"]["quick"] is True
    assert (folder / f"{name}.md").read_text().count("|") > 10
    assert list(folder.glob("*.png"))
    if name == "gibbs_grids":
        # Grids_15 (400 weakly coupled spins): the running marginals' mean absolute error falls from 0.38-0.44
        # after one sweep to 0.155-0.176 after 200 (seeds 0-2). A chain that never moves stays near its first error,
        # and one that draws each spin uniformly (a wrong conditional) converges to mean |p - 1/2| = 0.246.
        (run,) = record["grids"]["Grids_15"]["runs"]
        assert run["errors"][-1] < 0.21 and run["errors"][-1] < 0.6 * run["errors"][0], run["errors"]
    else:
        # nd-bn-6 (near-deterministic grid BN, exact marginals by junction tree): 2 s of 4 pooled chains bring
        # both samplers from 0.11-0.20 to below 0.03 (seeds 0-2). A stuck chain keeps its start's error; uniform
        # draws converge to mean |p - 1/2| = 0.23.
        for label in ("NB+Gibbs", "Gibbs"):
            (run,) = [run[label] for run in record["instances"]["nd-bn-6"]["runs"]]
            assert run["errors"][-1] < 0.06 and run["errors"][-1] < 0.6 * run["errors"][0], (label, run["errors"])


def test_grid_study_replica_exchange_arms(tmp_path: Path) -> None:
    study = load("grid_study")
    study.main(["--quick", "--arms", "RE-Gibbs", "RE-NB", "--instances", "nd-bn-6", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    record = json.loads((folder / "grid_study.json").read_text())
    assert "Replica exchange: time to mean marginal error 0.05" in (folder / "grid_study.md").read_text()
    (run,) = record["instances"]["nd-bn-6"]["runs"]
    # 4 temperatures x 1 ensemble, 2 s: the beta = 1 replica's pooled marginals fall from 0.34-0.38 to 0.026-0.034
    # (seed 0); a stuck replica keeps its start's error, uniform draws converge to 0.23
    for label in ("RE-Gibbs", "RE-NB"):
        errors = run[label]["errors"]
        assert errors[-1] < 0.08 and errors[-1] < 0.6 * errors[0], (label, errors)
    assert run["RE-NB"]["diagnostics"]["tempered_proposals"]
    assert len(run["RE-NB"]["diagnostics"]["temperatures"]) == 4
    assert "re_nb_faster_than_re_gibbs" in record and "times_to_level" in record["instances"]["nd-bn-6"]
    assert "| seeds for 80% power |" in (folder / "grid_study.md").read_text()
    assert record["instances"]["nd-bn-6"]["replica_summary"]["seeds_for_power"] is None  # one seed: no spread


def test_grid_study_merge_pools_the_seeds_of_finished_runs(tmp_path: Path) -> None:
    """Two one-seed runs merged: their seeds' times side by side, paired over both; mismatches are refused."""
    study = load("grid_study")
    halves, runs = [], []
    for seed in (1, 0):
        out = tmp_path / f"seed{seed}"
        args = ["--quick", "--arms", "RE-Gibbs", "RE-NB", "--instances", "nd-bn-6", "--seed", str(seed)]
        runs.append(study.main([*args, "--out", str(out)]))
        (folder,) = list(out.iterdir())
        halves.append(folder / "grid_study.json")
    merged = study.main(["--merge", *map(str, halves), "--out", str(tmp_path / "merged")])
    entry = merged["instances"]["nd-bn-6"]
    assert [run["seed"] for run in entry["runs"]] == [0, 1] and merged["config"]["seed_list"] == [0, 1]
    assert [run["source"] for run in entry["runs"]] == [str(halves[1]), str(halves[0])]  # (seed 1 ran first)
    alone = [run["instances"]["nd-bn-6"]["times_to_level"] for run in runs[::-1]]  # seeds 0, 1
    times = {arm: [seed[arm][0] for seed in alone] for arm in ("RE-Gibbs", "RE-NB")}
    assert entry["times_to_level"] == times
    mean, se, _ = study.paired_difference(entry["times_to_level"]["RE-NB"], entry["times_to_level"]["RE-Gibbs"])
    summary = entry["replica_summary"]
    assert summary["se"] is not None  # (paired over the two seeds)
    if None not in times["RE-NB"] + times["RE-Gibbs"]:  # (both reached the level in both seeds: no censoring)
        assert summary["re_nb_minus_re_gibbs_seconds"] == pytest.approx(mean) and summary["se"] == pytest.approx(se)
    (folder,) = list((tmp_path / "merged").iterdir())
    assert "2 seed(s)" in (folder / "grid_study.md").read_text() and list(folder.glob("*.png"))
    first, second = (json.loads(path.read_text()) for path in halves)
    with pytest.raises(ValueError, match="a seed repeats"):
        study.merge_records([first, first])
    renamed = json.loads(json.dumps(second))
    renamed["instances"]["nd-bn-7"] = renamed["instances"].pop("nd-bn-6")
    with pytest.raises(ValueError, match="different instances"):
        study.merge_records([first, renamed])
    second["config"]["seconds"] = 3.0
    with pytest.raises(ValueError, match="differ in their settings: seconds"):
        study.merge_records([first, second])


def test_grid_study_gradient_sampler_arms(tmp_path: Path) -> None:
    study = load("grid_study")
    arms = ["NB+Gibbs", "GWG", "DMALA", "PAS"]
    study.main(["--quick", "--arms", *arms, "--instances", "nd-bn-6", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    record = json.loads((folder / "grid_study.json").read_text())
    assert "Neural blocks vs gradient-informed samplers" in (folder / "grid_study.md").read_text()
    (run,) = record["instances"]["nd-bn-6"]["runs"]
    # 4 chains, 2 s each on nd-bn-6 (start errors 0.11-0.20): NB+Gibbs falls below 0.06 (as in the default arms'
    # test); the gradient samplers move more slowly on this near-deterministic BN (PAS: 0.147 -> 0.143 in one run), so
    # they are held only to stay below 0.23, where uniform draws (a wrong conditional) converge
    nb = run["NB+Gibbs"]["errors"]
    assert nb[-1] < 0.06 and nb[-1] < 0.6 * nb[0], nb
    for label in arms[1:]:
        errors = run[label]["errors"]
        assert len(errors) > 2 and errors[-1] < 0.2, (label, errors)
    summary = record["instances"]["nd-bn-6"]["gradient_summary"]
    assert summary["best_gradient_arm"] in ("GWG", "DMALA", "PAS") and set(summary["medians"]) == set(arms)
    assert set(record["gradient_comparison"]) == {"NB+Gibbs"}


def test_grid_study_fresh_tori_and_replica_options() -> None:
    """``--ising-seed`` names its tori apart from the default seed's; ``--re-warmup-neural`` and
    ``--re-tempered-tables`` reach RE-NB only."""
    study = load("grid_study")
    args = study.parse_args(["--ising", "4x2", "--ising-seed", "7", "--instances", "ising-4-c2-s7"])
    (name,) = study.load_instances(args)
    assert name == "ising-4-c2-s7"
    default = study.parse_args(["--ising", "4x2", "--instances", "ising-4-c2"])
    fresh = study.load_instances(default)["ising-4-c2"][0]
    assert not torch.equal(fresh.groups[0].log_tables, study.load_instances(args)[name][0].groups[0].log_tables)
    proposal = load_pretrained("grid-mrf-2x2")
    for flag, expected in (("0", None), ("2", 2)):
        options = study.parse_args(["--replicas", "4", "--re-warmup-neural", flag])
        kernel = study.make_kernel("RE-NB", fresh, proposal, options)
        assert isinstance(kernel, ReplicaExchange) and kernel.warmup_neural_replicas == expected
    for flag, tables in (("0", None), ("3", 3)):
        options = study.parse_args(["--replicas", "4", "--re-tempered-tables", flag])
        kernel = study.make_kernel("RE-NB", fresh, proposal, options)
        assert isinstance(kernel, ReplicaExchange) and kernel.tempered_tables == tables
    options = study.parse_args(["--replicas", "4"])
    assert study.make_kernel("RE-NB", fresh, proposal, options).warmup_neural_replicas == 1  # the kernel's own
    assert study.make_kernel("RE-Gibbs", fresh, proposal, options).proposals is None


def test_seeds_for_power_follow_the_t_test() -> None:
    """The seeds-needed column: a difference the observed seeds already find needs no more; a smaller one needs more."""
    from scipy import stats

    study = load("grid_study")
    gaps = torch.tensor([-1.1, -0.8, -1.4, -0.9, -1.3], dtype=torch.float64)  # p about 7e-4 over 5 seeds
    mean, se, p_value = study.paired_difference(gaps.tolist(), [0.0] * 5)
    assert p_value is not None and p_value < 0.01
    needed = study.seeds_for_power(mean, se, 5)
    assert needed is not None and needed <= 5
    # at the count it returns the power reaches 80%, one seed fewer it does not (noncentral t, two-sided 0.05)
    small = study.seeds_for_power(mean / 4, se, 5)
    assert small is not None and small > needed
    effect = abs(mean / 4) / (se * 5**0.5)

    def power(count: int) -> float:
        critical, shift = stats.t.ppf(0.975, count - 1), effect * count**0.5
        return stats.nct.sf(critical, count - 1, shift) + stats.nct.cdf(-critical, count - 1, shift)

    assert power(small) >= 0.8 > power(small - 1)
    assert study.seeds_for_power(0.0, se, 5) is None and study.seeds_for_power(mean, None, 1) is None
    assert study.seeds_for_power(mean / 1000, se, 5) is None  # beyond 1000 seeds
    # textbook sample sizes of a two-sided paired t-test at 80% power: effect 0.5 -> 34, 0.8 -> 15, 1.0 -> 10
    assert [study.seeds_for_power(d, 1 / 2, 4) for d in (0.5, 0.8, 1.0)] == [34, 15, 10]  # (spread se sqrt(4) = 1)
