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
            assert row["rmse_gain_time"] == row["rmse_gain_updates"] == row["ess_gain_time"] == 1.0
    verdicts = saved["verdicts"]
    assert {(v["kernel"], v["family"]) for v in verdicts} == set(study.PAPER_CLAIMS)
    assert all(v["reproduces"].split(" ")[0] in {"yes", "no"} for v in verdicts)
    text = (folder / "gradient_baselines.md").read_text()
    assert text.count("\n| ") >= len(rows) + len(verdicts) and "GWG paper" in text
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
