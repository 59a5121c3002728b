"""The candidate-proposal study: its target, densities and samplers agree with the kernel's, and it runs at CI scale."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from experiments import gmm_pair_candidates as study
from experiments.gmm_models import family_gmm
from experiments.gmm_scale import load_gmm_proposal
from neuralblock.kernels.base import sequential_init
from neuralblock.kernels.fused_mixture import _energy_change
from neuralblock.proposals.mdn import BlockMixture


@pytest.fixture(scope="module")
def pair_setup() -> dict:
    """A small held-out GMM, the shipped set proposal, one chain's pair contexts and the network's mixtures."""
    fg, _, _ = family_gmm("unequal", 6, 40, 0)
    proposal, _ = load_gmm_proposal("gmm_pair_copies", quick=False)
    state = sequential_init(fg, torch.Generator().manual_seed(3), chains=1).double()
    setting = study.setting_of(fg, proposal)
    context, parts = study.pair_inputs(setting, state, torch.arange(len(setting.layout.pairs))[None])
    return {"setting": setting, "context": context, "state": state, "parts": parts}


def _terms(setup: dict, pair: int) -> study.PairTerms:
    return study.pair_terms(setup["setting"], setup["context"], pair)[0]


def _network(setup: dict, pair: int) -> tuple:
    return tuple(t[0, pair] for t in setup["parts"])


def test_pair_target_differences_are_the_kernels_energy_changes(pair_setup: dict) -> None:
    layout, constants, _ = pair_setup["setting"]
    context = pair_setup["context"]
    pair = 3
    current = pair_setup["state"][0][layout.block_ids[pair]]
    gen = torch.Generator().manual_seed(0)
    proposed = current + 2.0 * torch.randn(8, current.shape[0], generator=gen, dtype=torch.float64)
    bits = [layout.values.shape[1], 2 * layout.values.shape[1] + 1]
    proposed[:, bits] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]).repeat(2, 1).double()
    expected = _energy_change(
        context.rest_lse[:, pair : pair + 1].expand(1, 8, -1).reshape(8, 1, -1),
        context.v_others[0, pair].sum().expand(8, 1),
        constants.log_odds[layout.pairs[pair]].expand(8, 1, 2),
        layout,
        current.expand(8, 1, -1),
        proposed[:, None],
        constants.points,
    )[:, 0]
    terms = _terms(pair_setup, pair)
    u_new = (proposed - constants.loc) / constants.scale
    u_cur = (current - constants.loc) / constants.scale
    new_i, new_j, new_bits = study._split(u_new)
    cur_i, cur_j, cur_bits = study._split(u_cur[None])
    mine = study.pair_log_target(new_i, new_j, new_bits[:, 0], new_bits[:, 1], terms) - study.pair_log_target(
        cur_i, cur_j, cur_bits[:, 0], cur_bits[:, 1], terms
    )
    finite = torch.isfinite(expected)
    assert bool((finite == torch.isfinite(mine)).all())
    torch.testing.assert_close(mine[finite], expected[finite], rtol=1e-9, atol=1e-8)


def test_network_density_is_the_block_mixtures(pair_setup: dict) -> None:
    log_w, disc, loc, log_scale = (t.float() for t in pair_setup["parts"])
    q = BlockMixture(log_w, disc, loc, log_scale, [0, 0, 2, 0, 0, 2], [0, 1, 2, 3])  # one scale per coordinate
    pair = 5
    gen = torch.Generator().manual_seed(1)
    blocks = study.sample_network(_network(pair_setup, pair), 32, gen)
    expected = q.log_prob(blocks[:, None, None].float().expand(32, 1, q.batch_shape[1], -1))[:, 0, pair].double()
    torch.testing.assert_close(study.network_log_q(_network(pair_setup, pair), blocks), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("copies", [False, True])
def test_candidate_sampler_draws_from_its_density(pair_setup: dict, copies: bool) -> None:
    """``E_{b ~ q}[r(b) / q(b)] = 1`` for a density ``r`` narrower than q's heaviest candidate (one pattern)."""
    pair = 2
    context = pair_setup["context"]
    others = context.u_others[0, pair][context.v_others[0, pair] > 0] if copies else None
    mixture = study.candidate_mixture(_network(pair_setup, pair), _terms(pair_setup, pair), 2, others)
    assert bool(torch.isclose(mixture.log_weights.exp().sum(), torch.tensor(1.0, dtype=torch.float64)))
    top = int(mixture.log_weights.argmax())
    gen = torch.Generator().manual_seed(2)
    draws = 40_000
    blocks = study.sample_candidates(mixture, draws, gen)
    u_i, u_j, bits = study._split(blocks)
    dim = u_i.shape[-1]
    narrow = mixture.log_sd[top] - math.log(2.0)
    log_r = study._gaussian(u_i, mixture.means[top, :dim], narrow[0]) + study._gaussian(
        u_j, mixture.means[top, dim:], narrow[1]
    )
    same = (bits == mixture.bits[top]).all(-1)
    ratio = torch.where(same, torch.exp(log_r - study.candidates_log_q(mixture, blocks)), 0.0)
    mcse = float(ratio.std()) / math.sqrt(draws)
    assert abs(float(ratio.mean()) - 1.0) < 5 * mcse + 1e-3, (float(ratio.mean()), mcse)


def test_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_pair_candidates.json").read_text())
    assert [row["variant"] for row in saved["rows"]] == list(study.VARIANTS) * 2
    for row in saved["rows"]:
        assert 0.0 <= row["acceptance"] <= 1.0 and row["births per sweep"] >= 0.0
        assert (row["candidates per pair"] > 0) == (row["variant"] != "network")
    assert [row["variant"] for row in record["summary"]] == list(study.VARIANTS)
    assert (folder / "gmm_pair_candidates.md").read_text().count("|") > 20
    assert (folder / "gmm_pair_candidates.png").stat().st_size > 0


def test_bad_cases_are_refused() -> None:
    with pytest.raises(ValueError, match="m,n,family,seed"):
        study.parse_args(["--cases", "16,1000,scaled"])
