"""Exact tiled block Gibbs of the UAI 2008 block-mobility study: invariance against enumeration, and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from test_studies_quick import load  # tests/ is on sys.path under pytest

from motifs.grid import random_grid_bn
from neuralblock.exact import marginals


def test_tiled_block_gibbs_converges_to_the_exact_marginals_and_a_wrong_conditional_does_not() -> None:
    study = load("bn_block_mobility")
    fg = random_grid_bn(4, 4, torch.Generator().manual_seed(3), deterministic=0.0)  # no zeros: any start is valid
    exact = marginals(fg)[0].double()
    for size in (1, 2):
        sampler = study.TiledBlockGibbs(fg, size)
        gen = torch.Generator().manual_seed(size)
        states = torch.zeros(256, fg.num_variables, dtype=torch.float64)  # far from the target
        for _ in range(10):  # burn-in
            states = sampler.sweep(states, gen)
        ones, count = torch.zeros(fg.num_variables, dtype=torch.float64), 0
        for _ in range(40):
            states = sampler.sweep(states, gen)
            ones, count = ones + states.sum(0), count + states.shape[0]
        # 10240 draws, autocorrelated over sweeps: errors 0.002-0.005 (three sampler seeds); 0.02 is 4x the largest
        error = study.pooled_error(ones, count, exact)
        assert error < 0.02, (size, error)
    # a sampler whose conditionals ignore the factors (uniform tile draws) ends 0.22-0.23 off (three seeds)
    flat = study.TiledBlockGibbs(fg, 2)
    flat.classes = [(tiles, incidence * 0) for tiles, incidence in flat.classes]
    states = torch.zeros(256, fg.num_variables, dtype=torch.float64)
    for _ in range(20):
        states = flat.sweep(states, torch.Generator().manual_seed(0))
    assert study.pooled_error(states.sum(0), states.shape[0], exact) > 0.05


def test_block_mobility_quick_mode_writes_outputs(tmp_path: Path) -> None:
    study = load("bn_block_mobility")
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "bn_block_mobility.json").read_text())
    assert saved["config"]["quick"] is True and (folder / "bn_block_mobility.png").exists()
    (row,) = record["summary"]
    # exact starts: the frozen error is K draws' Monte Carlo error, and fresh draws at 7x the count beat it
    assert row["independent"] < row["frozen"]
    assert (folder / "bn_block_mobility.md").read_text().count("|") > 20
