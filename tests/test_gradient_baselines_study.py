"""The gradient-baselines study (issue 26, item 2) runs at CI scale and writes well-formed outputs.

Checks the outputs' shape and the model builders' exactness (not timings or which sampler wins).
"""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import torch

from experiments import gradient_baselines as study
from neuralblock.exact import marginals


def test_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gradient_baselines.json").read_text())
    assert saved["config"]["quick"] is True and saved["config"]["kernels"] == list(study.KERNELS)
    assert list(saved["families"]) == list(study.FAMILIES)
    for entry in saved["families"].values():
        assert {run["kernel"] for run in entry["runs"]} == set(study.KERNELS)
        for run in entry["runs"]:
            assert len(run["seconds"]) == len(run["errors"]) == len(run["sweeps"]) == len(run["updates"]) > 0
            assert all(b >= a for a, b in zip(run["seconds"], run["seconds"][1:]))
            assert all(math.isfinite(e) and e <= 0.5 for e in run["errors"])  # log10 RMSE of means in [-1, 1]
            assert 0.0 <= run["final_marginal_error"] <= 1.0 and run["ess"] > 0
            assert run["summary"]["clock"] == "cpu" and run["summary"]["stopped"] == "seconds"
    rows = record["summary"]
    assert len(rows) == len(study.FAMILIES) * len(study.KERNELS)
    for row in rows:
        if row["kernel"] == "Gibbs":  # every gain is a ratio against Gibbs itself
            assert row["rmse_gain_time"] == row["rmse_gain_updates"] == row["rmse_gain_iterations"] == 1.0
            assert row["ess_gain_time"] == 1.0
    verdicts = saved["verdicts"]
    assert {(v["kernel"], v["family"]) for v in verdicts} == set(study.PAPER_CLAIMS)
    assert all(v["reproduces"].split(" ")[0] in {"yes", "no"} for v in verdicts)
    text = (folder / "gradient_baselines.md").read_text()
    assert text.count("\n| ") >= len(rows) + len(verdicts) + len(study.PAPERS)
    assert study.PAPERS["GWG"].cite in text and "| paper figure |" in text
    assert (folder / "gradient_baselines.png").stat().st_size > 0
    study.main(["--quick", "--rerender", "--out", str(tmp_path)])  # tables rebuilt from the saved runs
    again = json.loads((folder / "gradient_baselines.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert again["summary"] == saved["summary"] and again["families"] == saved["families"]


def test_ising_is_symmetric_and_fhmm_rbm_exact_marginals_are_proper() -> None:
    g = torch.Generator().manual_seed(3)
    for frustrated in (False, True):
        fg = study.lattice_ising(3, 0.3, frustrated, g)  # the exact means the study assumes: all 0
        assert torch.allclose(marginals(fg)[0][:, 1], torch.full((9,), 0.5, dtype=torch.float64), atol=1e-9)
    for fg in (study.random_rbm(4, 2, 1.0, g), study.factorial_hmm(2, 3, g)):
        probs = marginals(fg)[0]
        assert torch.allclose(probs.sum(-1), torch.ones(fg.num_variables, dtype=torch.float64))


def test_study_doctests() -> None:
    failed, attempted = doctest.testmod(study)  # experiments/ is not in the doctest paths
    assert attempted > 0 and failed == 0


def _row(kernel: str, gain_updates: float, gain_time: float) -> dict[str, object]:
    return {
        "kernel": kernel,
        "family": "ising-ferro",
        "rmse_gain_updates": gain_updates,
        "rmse_gain_iterations": gain_updates,
        "rmse_gain_time": gain_time,
        "updates_per_s": 100.0 if kernel == "Gibbs" else 10.0,
        "acceptance": 0.5,
        "changes_per_step": 1.0,
    }


def test_iterations_count_a_kernel_step_and_one_gibbs_site() -> None:
    # DMALA: 100 proposals per step; Gibbs: a 100-site sweep per step, each site one iteration (the papers' bg-1)
    dmala = {
        "kernel": "DMALA",
        "updates": [100.0, 1000.0, 5000.0],
        "errors": [-0.5, -1.0, -2.0],
        "updates_per_step": 100.0,
    }
    gibbs = {"kernel": "Gibbs", "updates": [10.0, 40.0, 200.0], "errors": [-0.4, -0.6, -3.0], "updates_per_step": 100.0}
    assert study.iterations(dmala) == [1.0, 10.0, 50.0] and study.iterations(gibbs) == [10.0, 40.0, 200.0]
    # the budget is the fewer final iterations (DMALA's 50): Gibbs at 40 sites, DMALA at its last step
    assert study.error_at_iterations(gibbs, dmala) == -0.6
    assert study.error_at_iterations(dmala, gibbs) == -2.0
    rows = study.summarise(
        {
            "config": {"kernels": ["Gibbs", "DMALA"]},
            "families": {
                "ising-ferro": {
                    "runs": [
                        {
                            **run,
                            "seed": 0,
                            "final_log10_rmse": run["errors"][-1],
                            "ess_per_second": 1.0,
                            "ess": 1.0,
                            "summary": {"samples": 1},
                            "steps_per_second": 1.0,
                            "acceptance_rate": 0.5,
                            "final_marginal_error": 0.1,
                            "changes_per_step": 1.0,
                        }  # fmt: skip
                        for run in (gibbs, dmala)
                    ]
                }
            },
        }
    )
    assert rows[1]["kernel"] == "DMALA" and math.isclose(rows[1]["rmse_gain_iterations"], 10**1.4)


def test_verdicts_compare_the_size_where_the_paper_gives_a_figure() -> None:
    rows = [_row("Gibbs", 1.0, 1.0), _row("GWG", 2.0, 0.1), _row("PAS", 4.0, 0.2)]
    claims = {
        ("GWG", "ising-ferro"): study.Claim("m", figure=3.0, figure_source="Table 9, 2D Ising"),  # 1.5x apart
        ("PAS", "ising-ferro"): study.Claim("m", rivals=("GWG",), figure=40.0, figure_source="Sec. 5"),  # 10x
        ("DMALA", "ising-ferro"): study.Claim("m", "rmse_gain_time"),  # no DMALA row: skipped
    }
    gwg, pas = study.verdicts(rows, claims)
    assert gwg["reproduces"].startswith("yes") and "within 3x" in gwg["reproduces"]
    assert gwg["paper figure"] == "x3 (Table 9, 2D Ising)"
    assert pas["reproduces"].startswith("no") and "vs GWG x2" in pas["reproduces"] and "10x apart" in pas["reproduces"]
    (plain,) = study.verdicts(rows, {("GWG", "ising-ferro"): study.Claim("m")})
    assert plain["paper figure"] == "—" and "direction only" in plain["reproduces"]

    text = study.papers_section([gwg, pas, plain])
    assert "2 of 3 rows carry one" in text and "| paper figure |" in text
    assert all(p.cite in text for p in study.PAPERS.values())
    assert "every row compares the direction only" in study.papers_section([plain])
