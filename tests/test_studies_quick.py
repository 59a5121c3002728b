"""The grid studies run end to end at CI scale and write JSON, markdown and PNG outputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
