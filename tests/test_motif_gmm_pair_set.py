"""The gmm_pair_set motif and its set encoder: any number of points in any order, exact MH on tiny GMMs."""

from __future__ import annotations

import json

import pytest
import torch

from motifs.gmm_pair import gmm_graph, gmm_initial_state, pair_log_density, sample_gmm
from motifs.gmm_pair_set import GmmPairSetMotif, PairModels
from neuralblock.proposals import MixtureDensityNetwork, NeuralBlockProposal
from neuralblock.proposals.set_encoder import SetPooling, check_set_encoder


def _tokens(batch: int, count: int, width: int = 4, seed: int = 0) -> torch.Tensor:
    tokens = torch.randn(batch, count, width, generator=torch.Generator().manual_seed(seed))
    tokens[..., -1] = 1.0
    return tokens


def test_set_pooling_ignores_order_and_padding() -> None:
    torch.manual_seed(0)
    pool = SetPooling(token_features=4, hidden=8, heads=3)
    tokens = _tokens(2, 6)
    out = pool(tokens)
    assert out.shape == (2, pool.out_features) == (2, 8 + 1 + 3 * (8 + 4))
    assert torch.allclose(out, pool(tokens[:, torch.randperm(6)]), atol=1e-6)
    padded = torch.cat([tokens, torch.zeros(2, 5, 4)], 1)  # absent tokens (presence 0)
    assert torch.allclose(out, pool(padded), atol=1e-6)
    assert not torch.allclose(out, pool(tokens[:, :5]), atol=1e-3)  # a real token does count
    empty = pool(torch.zeros(2, 3, 4))
    assert torch.isfinite(empty).all()


def test_set_encoder_options_are_checked() -> None:
    with pytest.raises(ValueError, match="set encoder"):
        check_set_encoder({"token_features": 4, "hidden": 8})
    with pytest.raises(ValueError, match="positive integers"):
        check_set_encoder({"token_features": 1, "hidden": 8, "heads": 2})
    with pytest.raises(ValueError, match="positive integers"):
        check_set_encoder({"token_features": 4, "hidden": True, "heads": 2})


def test_an_mdn_with_a_set_encoder_reads_any_number_of_tokens() -> None:
    torch.manual_seed(0)
    net = MixtureDensityNetwork(
        3, [2, 0], components=2, hidden=(8,), set_encoder={"token_features": 4, "hidden": 8, "heads": 2}
    )
    head = torch.randn(5, 3)
    for count in (1, 7, 40):
        q = net(torch.cat([head, _tokens(5, count).flatten(-2)], -1))
        assert q.log_prob(torch.zeros(5, 2)).shape == (5,)
    assert net.config()["set_encoder"] == {"token_features": 4, "hidden": 8, "heads": 2}
    with pytest.raises(ValueError, match="tokens of 4 numbers"):
        net(torch.randn(5, 3 + 6))
    with pytest.raises(ValueError, match="head features"):
        net(torch.randn(5, 2))


def _whitened_case(shift: torch.Tensor, scale: float):
    """One GMM and state, with every coordinate moved to ``shift + scale * u`` (the same whitened values)."""
    points, _, _ = sample_gmm(6, 40, torch.Generator().manual_seed(4))
    fg = gmm_graph(shift + scale * points, 6, scale * 1.0, scale * 5.0, 0.4, prior_mean=shift)
    unit = gmm_initial_state(gmm_graph(points, 6, 1.0, 5.0, 0.4), torch.Generator().manual_seed(5))
    state = unit.clone()
    names = [f"mu[{k},{d}]" for k in range(6) for d in range(2)] + [f"x[{j},{d}]" for j in range(40) for d in range(2)]
    coords = torch.tensor([fg.variable_id(name) for name in names])
    state[coords] = shift.repeat(len(names) // 2) + scale * unit[coords]
    return fg, state


def test_features_are_location_and_scale_free_and_ignore_the_block() -> None:
    motif = GmmPairSetMotif()
    fg, state = _whitened_case(torch.zeros(2), 1.0)
    instances = motif.find_instances(fg)
    features = motif.encode(fg, instances, state)
    assert features.shape == (15, motif.feature_dim + 40 * (2 + 3))
    moved_fg, moved_state = _whitened_case(torch.tensor([3.0, -7.0]), 2.5)
    assert torch.allclose(motif.encode(moved_fg, motif.find_instances(moved_fg), moved_state), features, atol=1e-4)
    changed = state.clone()
    changed[instances.blocks[0]] = torch.tensor([9.0, 9.0, 1.0, -9.0, 9.0, 0.0])
    assert torch.equal(motif.encode(fg, instances, changed)[0], features[0])


def test_training_batches_mix_sizes_and_their_padding_is_inert() -> None:
    motif = GmmPairSetMotif()
    batch = motif.sample_training_batch(130, torch.Generator().manual_seed(0))  # 3 runs of 64: 3 scales
    token = motif.set_encoder["token_features"]
    tokens = batch.features[:, motif.feature_dim :].reshape(130, -1, token)
    counts = tokens[..., -1].sum(-1)
    assert torch.isfinite(batch.features).all() and counts.min() >= 30 and len(set(counts.tolist())) > 10
    assert torch.isfinite(batch.block).all()
    values = batch.block.unsqueeze(0)
    log_p = batch.log_p_fn(values)
    assert log_p.shape == (1, 130) and torch.isfinite(log_p).all()


def test_copied_models_gather_active_mixtures_and_zero_copies_keeps_the_first_draws() -> None:
    def draw(copies: float) -> PairModels:
        return GmmPairSetMotif(copies=copies).sample_models(256, torch.Generator().manual_seed(3), 12, 200)

    first, copied, half = draw(0.0), draw(1.0), draw(0.5)
    # the first release's draws (motifs/gmm_pair_set.py at c208ef9, before the option), pinned
    sums = [float(t.sum()) for t in (first.block, first.u_points, first.u_others, first.v_others)]
    assert sums == pytest.approx([297.350830078125, 9256.86328125, 313.1014404296875, 1045.0], rel=1e-5)

    def means_and_bits(models: PairModels) -> tuple[torch.Tensor, torch.Tensor]:
        means = torch.cat([models.block[:, None, 0:2], models.block[:, None, 3:5], models.u_others], 1)
        return means, torch.cat([models.block[:, 2:3], models.block[:, 5:6], models.v_others], 1) > 0

    means, bits = means_and_bits(first)
    for models in (copied, half):  # only active means move; the bits and inactive means are the first draw's
        moved_means, moved_bits = means_and_bits(models)
        assert torch.equal(moved_bits, bits) and torch.equal(moved_means[~bits], means[~bits])
    changed = (means_and_bits(half)[0] != means).any(-1).any(-1).float().mean()
    assert 0.3 < changed < 0.55  # half the models are copied (those with one active mixture cannot change)

    def nearest_active_gap(models: PairModels) -> torch.Tensor:
        """Per model with >= 2 active mixtures: the median distance of an active mean to its nearest active one."""
        means, bits = means_and_bits(models)
        gaps = torch.cdist(means, means) + torch.eye(means.shape[1]) * 1e9
        gaps = gaps.masked_fill(~bits[:, None, :], 1e9).amin(-1).masked_fill(~bits, float("nan"))
        keep = bits.sum(-1) >= 2
        return gaps[keep].nanmedian(-1).values

    # copies sit 0.05-0.5 sigma from their original; means from the prior are tau / sigma >= 1.5 apart in scale
    assert nearest_active_gap(copied).median() < 0.5 < nearest_active_gap(first).median()
    with pytest.raises(ValueError, match="copies must be a fraction"):
        GmmPairSetMotif(copies=1.5)
    assert GmmPairSetMotif(copies=0.5).options()["copies"] == 0.5 and "copies" not in GmmPairSetMotif().options()


def test_the_pair_density_skips_padding_points() -> None:
    gen = torch.Generator().manual_seed(2)
    points, others, bits = (
        torch.randn(1, 9, 2, generator=gen),
        torch.randn(1, 3, 2, generator=gen),
        torch.tensor([[1.0, 0.0, 1.0]]),
    )
    pair = torch.tensor([[[0.5, 0.1, 1.0, -2.0, 1.0, 0.0]]])
    ratio, logit_p = torch.tensor([1.0]), torch.tensor([0.3])
    mask = torch.tensor([[True] * 6 + [False] * 3])
    masked = pair_log_density(pair, points, others, bits, ratio, logit_p, mask)
    assert torch.allclose(masked, pair_log_density(pair, points[:, :6], others, bits, ratio, logit_p))


def test_proposal_files_round_trip_and_keep_the_encoder(tmp_path) -> None:
    torch.manual_seed(0)
    proposal = NeuralBlockProposal(GmmPairSetMotif(hidden=8, heads=2), components=2, hidden=(16,))
    proposal.save(tmp_path / "q")
    loaded = NeuralBlockProposal.load(tmp_path / "q")
    features = GmmPairSetMotif(hidden=8, heads=2).sample_training_batch(4, torch.Generator().manual_seed(1)).features
    assert torch.equal(loaded(features).log_prob(torch.zeros(4, 6)), proposal(features).log_prob(torch.zeros(4, 6)))
    sidecar = json.loads((tmp_path / "q.json").read_text())
    sidecar["network"]["set_encoder"]["hidden"] = 9
    (tmp_path / "q.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match="does not match motif"):
        NeuralBlockProposal.load(tmp_path / "q")


def test_the_shipped_proposals_load() -> None:
    old = NeuralBlockProposal.load("pretrained/gmm_pair")
    assert old.motif.name == "gmm_pair" and old.mdn.set_pooling is None
    new = NeuralBlockProposal.load("pretrained/gmm_pair_set")
    assert new.motif.name == "gmm_pair_set" and new.mdn.set_pooling is not None
    assert new.metadata["validation"]["acceptance"] > 0.3
    copies = NeuralBlockProposal.load("pretrained/gmm_pair_copies")
    assert copies.motif.name == "gmm_pair_set" and copies.motif.copies == 0.5
    assert copies.metadata["validation"]["acceptance"] > 0.3
