"""The NER study runs end to end at CI scale and writes JSON, markdown and PNG outputs."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType


def load(name: str) -> ModuleType:
    """The study ``experiments.<name>``, imported (a study's imports fail at its test, not at collection)."""
    return importlib.import_module(f"experiments.{name}")


def test_ner_study_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("ner_study")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "ner_study.json").read_text())
    assert saved["config"]["quick"] is True
    assert saved["samplers"][0] == "Gibbs" and len(saved["samplers"]) >= 2
    ref = saved["reference"]
    assert ref["viterbi_loglik"] >= ref["posterior_mean_loglik"] >= ref["initial_loglik"]
    for label in record["samplers"]:
        trace = saved["runs"][0][label]
        assert trace["sweeps"][0] == 0 and trace["sweeps"][-1] > 5
        assert all(b >= a for a, b in zip(trace["seconds"], trace["seconds"][1:]))
        # chains leave the random start: the sample's score and the running marginals improve
        assert trace["loglik"][-1] > trace["loglik"][0] and trace["errors"][-1] < trace["errors"][0]
        assert trace["loglik"][-1] <= ref["viterbi_loglik"] + 1e-3
    assert (folder / "ner_study.md").read_text().count("|") > 20
    assert {p.name for p in folder.glob("*.png")} == {"ner_f1.png", "ner_loglik.png", "ner_marginal_error.png"}
