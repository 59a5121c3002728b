"""MDN contract tests and proposal-file safety (round trip, wrong motif, truncation, tampering)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from safetensors.torch import save as save_safetensors
from scipy import stats

import motifs
from neuralblock import NeuralBlockProposal, list_pretrained, load_pretrained
from neuralblock.proposals import MixtureDensityNetwork


@pytest.mark.parametrize("cards", [[2, 3], [0, 0], [2, 0, 3, 0]])
def test_mdn_shapes_normalization_and_gradients(cards: list[int]) -> None:
    mdn = MixtureDensityNetwork(5, cards, components=3, hidden=(16, 16))
    q = mdn(torch.randn(4, 5))
    x = q.sample((7,))
    assert x.shape == (7, 4, len(cards)) and q.log_prob(x).shape == (7, 4)
    q.log_prob(x).sum().backward()
    for name, param in mdn.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    if all(k > 0 for k in cards):
        grids = torch.meshgrid(*[torch.arange(k) for k in cards], indexing="ij")
        values = torch.stack([g.reshape(-1) for g in grids], -1).float()
        total = q.log_prob(values[:, None, :]).exp().sum(0)
        assert torch.allclose(total, torch.ones(4), atol=1e-5)


def test_mdn_is_finite_for_extreme_inputs() -> None:
    mdn = MixtureDensityNetwork(3, [2, 0], components=4, hidden=(8,))
    context = torch.tensor([[1e30, -1e30, float("nan")], [0.0, 1e6, -1e6]])
    q = mdn(context)
    value = q.sample()
    assert torch.isfinite(q.log_prob(value)).all()
    assert torch.isfinite(q.log_prob(torch.tensor([[1.0, 1e8], [0.0, -1e8]]))).all()


def test_mdn_samples_follow_log_prob() -> None:
    """Chi-square of 20000 draws of a 2x3 block; false-failure rate 1e-4."""
    torch.manual_seed(1)
    q = MixtureDensityNetwork(2, [2, 3], components=3, hidden=(8,))(torch.randn(2))
    draws = q.sample((20000,))
    values = torch.tensor([[a, b] for a in range(2) for b in range(3)], dtype=torch.float32)
    counts = (draws[:, None, :] == values).all(-1).sum(0).double()
    expected = q.log_prob(values).exp().double().detach() * 20000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-4, df=5)


def test_mdn_continuous_moments_match() -> None:
    """One Gaussian component: sample mean within 5 standard errors (false-failure ~6e-7 per coordinate)."""
    torch.manual_seed(2)
    q = MixtureDensityNetwork(2, [0, 0], components=1, hidden=(8,))(torch.randn(2))
    draws = q.sample((20000,))
    std = q.log_scale.exp()
    assert ((draws.mean(0) - q.loc[0]).abs() < 5 * std / math.sqrt(20000)).all()


def test_save_load_round_trip_gives_identical_log_prob(tmp_path) -> None:
    motif = motifs.get("grid", family="mrf", size=2)
    proposal = NeuralBlockProposal(motif, components=3, hidden=(16,), metadata={"note": "test"})
    proposal.save(tmp_path / "p")
    loaded = NeuralBlockProposal.load(tmp_path / "p")
    batch = motif.sample_training_batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(loaded(batch.features).log_prob(batch.block), proposal(batch.features).log_prob(batch.block))
    assert json.loads((tmp_path / "p.json").read_text())["metadata"] == {"note": "test"}


def test_loading_rejects_wrong_motif_truncation_and_tampering(tmp_path) -> None:
    grid = motifs.get("grid", family="mrf", size=2)
    NeuralBlockProposal(grid, components=2, hidden=(8,)).save(tmp_path / "p")
    with pytest.raises(ValueError, match="trained for motif"):
        NeuralBlockProposal.load(tmp_path / "p", motif=motifs.get("grid", family="bn", size=2))
    blob = (tmp_path / "p.safetensors").read_bytes()
    (tmp_path / "p.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="truncated, corrupted"):
        NeuralBlockProposal.load(tmp_path / "p")
    (tmp_path / "p.safetensors").write_bytes(blob)
    sidecar = json.loads((tmp_path / "p.json").read_text())
    sidecar["network"]["components"] = 5
    (tmp_path / "p.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match="tensors"):
        NeuralBlockProposal.load(tmp_path / "p")
    sidecar["motif"]["options"]["size"] = 3
    (tmp_path / "p.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match="network shape|trained for motif"):
        NeuralBlockProposal.load(tmp_path / "p", motif=grid)
    (tmp_path / "p.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        NeuralBlockProposal.load(tmp_path / "p")
    with pytest.raises(FileNotFoundError):
        NeuralBlockProposal.load(tmp_path / "missing")


def test_dotted_names_keep_their_own_files(tmp_path) -> None:
    mrf = NeuralBlockProposal(motifs.get("grid", family="mrf", size=2), components=2, hidden=(8,))
    bn = NeuralBlockProposal(motifs.get("grid", family="bn", size=2), components=2, hidden=(8,))
    mrf.save(tmp_path / "run.v1")
    bn.save(tmp_path / "run.v2")
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "run.v1.json", "run.v1.safetensors", "run.v2.json", "run.v2.safetensors"
    ]  # fmt: skip
    assert NeuralBlockProposal.load(tmp_path / "run.v1").motif.spec() == mrf.motif.spec()
    assert NeuralBlockProposal.load(tmp_path / "run.v2.json").motif.spec() == bn.motif.spec()


def test_loading_rejects_non_finite_weights_and_malformed_sidecars(tmp_path) -> None:
    proposal = NeuralBlockProposal(motifs.get("grid", family="mrf", size=2), components=2, hidden=(8,))
    with torch.no_grad():
        next(proposal.mdn.parameters())[0, 0] = float("nan")
    proposal.save(tmp_path / "nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        NeuralBlockProposal.load(tmp_path / "nan")
    NeuralBlockProposal(proposal.motif, components=2, hidden=(8,)).save(tmp_path / "p")
    good = json.loads((tmp_path / "p.json").read_text())
    breakages = {
        "'motif' must be an object": lambda m: m.update(motif="grid"),
        "'network' must be an object": lambda m: m.update(network=[]),
        "string 'name'": lambda m: m["motif"].pop("name"),
        "'network.hidden'": lambda m: m["network"].update(hidden=[-3]),
        "'network.components'": lambda m: m["network"].update(components=True),
        "'metadata' must be an object": lambda m: m.update(metadata=[1, 2]),
        "'network.type'": lambda m: m["network"].update(type="Transformer"),
        r"format_version True \(bool\); expected the integer 1": lambda m: m.update(format_version=True),
        r"format_version 1.0 \(float\); expected the integer 1": lambda m: m.update(format_version=1.0),
        r"format_version '1' \(str\); expected the integer 1": lambda m: m.update(format_version="1"),
        r"format version 2; this neuralblock reads version 1 only \(the file was written by a newer": (
            lambda m: m.update(format_version=2)
        ),
    }
    for message, breaks in breakages.items():
        sidecar = json.loads(json.dumps(good))
        breaks(sidecar)
        (tmp_path / "p.json").write_text(json.dumps(sidecar))
        with pytest.raises(ValueError, match=message):
            NeuralBlockProposal.load(tmp_path / "p")
    (tmp_path / "p.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not valid JSON"):
        NeuralBlockProposal.load(tmp_path / "p")
    (tmp_path / "p.json").write_text("5")
    with pytest.raises(ValueError, match="lacks fields"):
        NeuralBlockProposal.load(tmp_path / "p")


@pytest.mark.timeout(60)  # a reader that followed /dev/zero would hang: fail fast instead
def test_unbounded_or_odd_files_are_refused_before_reading(tmp_path) -> None:
    """Issue 23: /dev/zero links, directories, oversized files, huge integers and a motif name."""
    proposal = NeuralBlockProposal(motifs.get("grid", family="mrf", size=2), components=2, hidden=(8,))
    proposal.save(tmp_path / "p")
    good_sidecar = (tmp_path / "p.json").read_bytes()
    for name, label in (("p.safetensors", "weights file"), ("p.json", "proposal sidecar")):
        saved = (tmp_path / name).read_bytes()
        (tmp_path / name).unlink()
        (tmp_path / name).symlink_to("/dev/zero")
        with pytest.raises(ValueError, match=rf"{label} .*{name} is not a regular file"):  # refused, not read
            NeuralBlockProposal.load(tmp_path / "p")
        (tmp_path / name).unlink()
        (tmp_path / name).mkdir()
        with pytest.raises(ValueError, match=rf"{label} .*{name} is a directory, expected a file"):
            NeuralBlockProposal.load(tmp_path / "p")
        (tmp_path / name).rmdir()
        (tmp_path / name).write_bytes(saved)
    with open(tmp_path / "p.json", "ab") as handle:  # sparse: 17 MiB on paper, nothing on disk
        handle.truncate(17 << 20)
    with pytest.raises(ValueError, match=r"proposal sidecar .*p\.json has \d+ bytes, more than the limit of 16777216"):
        NeuralBlockProposal.load(tmp_path / "p")
    (tmp_path / "p.json").write_bytes(good_sidecar.replace(b'"format_version": 1', b'"format_version": ' + b"9" * 5000))
    with pytest.raises(ValueError, match=r"not valid JSON: an integer of 5000 digits \(at most 100"):
        NeuralBlockProposal.load(tmp_path / "p")
    (tmp_path / "p.json").write_bytes(good_sidecar)
    with pytest.raises(TypeError, match=r"motif must be a neuralblock Motif or None, got str; build it with motifs"):
        NeuralBlockProposal.load(tmp_path / "p", motif="grid")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        NeuralBlockProposal.load(3)  # type: ignore[arg-type]
    assert NeuralBlockProposal.load(tmp_path / "p").motif.spec() == proposal.motif.spec()


def test_loading_rejects_weights_of_another_dtype_even_with_a_matching_digest(tmp_path) -> None:
    proposal = NeuralBlockProposal(motifs.get("grid", family="mrf", size=2), components=2, hidden=(8,))
    proposal.save(tmp_path / "p")
    tensors = {k: v.half() for k, v in proposal.mdn.state_dict().items()}
    blob = save_safetensors(tensors)
    (tmp_path / "p.safetensors").write_bytes(blob)
    sidecar = json.loads((tmp_path / "p.json").read_text())
    sidecar["weights_sha256"] = hashlib.sha256(blob).hexdigest()
    (tmp_path / "p.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match=r"\['torch.float16'\] tensors"):
        NeuralBlockProposal.load(tmp_path / "p")


def test_every_shipped_proposal_loads_and_meets_its_recorded_targets() -> None:
    names = list_pretrained()
    shipped = {
        "grid-mrf-2x2",
        "grid-bn-2x2",
        "crf_tags-2",
        "crf_tags-3",
        "crf_tags-4",
        "chain",
        "gmm_pair",
        "gmm_pair_set",
        "gmm_pair_copies",
        "gmm_pair_copies16",
    }
    assert shipped <= set(names)
    for name in names:
        proposal = load_pretrained(name)
        metrics = proposal.metadata["validation"]
        if proposal.motif.name == "chain":  # continuous block: NLL gap on linear-Gaussian instances
            assert metrics["nll_gap"] <= 0.05 and metrics["acceptance"] >= 0.7, name
            continue
        if proposal.motif.name in ("gmm_pair", "gmm_pair_set"):  # no exact conditional: vs the prior elsewhere
            assert metrics["acceptance"] > 0.0, name
            continue
        limit = (0.05, 0.85) if proposal.motif.name == "grid" else (0.1, 0.8)
        assert metrics["kl"] <= limit[0] and metrics["acceptance"] >= limit[1], name
    with pytest.raises(ValueError, match="no pretrained proposal"):
        load_pretrained("grid-9x9")


@pytest.mark.parametrize(("name", "count"), [("grid-mrf-2x2", 256), ("grid-bn-2x2", 256), ("crf_tags-3", 64)])
def test_shipped_proposals_meet_targets_on_fresh_instantiations(name: str, count: int) -> None:
    """Recompute exact KL and MH acceptance on instantiations no training run has seen."""
    from trainers.metrics import enumerated_log_q, exact_kl, expected_acceptance

    proposal = load_pretrained(name)
    batch = proposal.motif.sample_training_batch(count, torch.Generator().manual_seed(987654))
    values = proposal.motif.block_spec.enumerate()
    kl, acc = [], []
    with torch.no_grad():
        for start in range(0, count, 16):
            log_q = enumerated_log_q(proposal(batch.features[start : start + 16]), values)
            log_p = batch.log_p[start : start + 16].to(log_q.dtype)
            kl.append(exact_kl(log_p, log_q))
            acc.append(expected_acceptance(log_p, log_q))
    kl_mean, acc_mean = float(torch.cat(kl).mean()), float(torch.cat(acc).mean())
    kl_limit, acc_limit = (0.05, 0.85) if proposal.motif.name == "grid" else (0.1, 0.8)
    assert kl_mean <= kl_limit and acc_mean >= acc_limit, (kl_mean, acc_mean)


def test_gmm_pair_beats_the_prior_proposal_on_fresh_instantiations() -> None:
    """Lower NLL and a higher MH acceptance than ``q = p(B)`` on 512 unseen GMM pair blocks."""
    from motifs.gmm_pair import prior_proposal
    from trainers.trainer import evaluate

    proposal = load_pretrained("gmm_pair")
    batch = proposal.motif.sample_training_batch(512, torch.Generator().manual_seed(24680))
    with torch.no_grad():
        net = evaluate(proposal.mdn, batch, proposal.motif.block_spec, 8, seed=0)
        prior = evaluate(prior_proposal(proposal.motif).mdn, batch, proposal.motif.block_spec, 8, seed=0)
    assert net["nll"] < prior["nll"] - 2.0 and net["acceptance"] > 2 * prior["acceptance"], (net, prior)


def test_mdn_scale_groups_give_each_group_its_own_scale() -> None:
    """One component, groups [0, 0, 1]: per-coordinate sample std within 5% of the group's scale (20000 draws)."""
    torch.manual_seed(3)
    net = MixtureDensityNetwork(2, [0, 2, 0, 0], components=1, hidden=(8,), scale_groups=[0, 0, 1])
    with torch.no_grad():
        net.scale_head.bias.copy_(torch.tensor([-2.0, 1.0]))
        net.scale_head.weight.zero_()
    q = net(torch.randn(2))
    draws = q.sample((20000,))[:, [0, 2, 3]]
    expected = torch.tensor([-2.0, -2.0, 1.0]).exp()
    assert torch.allclose(draws.std(0), expected, rtol=0.05)
    assert torch.allclose(q.log_scale[0], expected.log())
    one = torch.distributions.Normal(q.loc[0], expected)
    value = q.sample()
    direct = one.log_prob(value[[0, 2, 3]]).sum() + q.discrete_log_probs[0, 0].gather(-1, value[1].long().view(1)).sum()
    assert torch.allclose(q.log_prob(value), direct, atol=1e-5)
    with pytest.raises(ValueError, match="scale_groups"):
        MixtureDensityNetwork(2, [0, 0], components=1, scale_groups=[1, 1])


def test_loading_a_folder_says_a_proposals_path_is_its_stem(tmp_path) -> None:
    (tmp_path / "mine.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"is a folder; give a proposal's path without suffix.*holds mine"):
        NeuralBlockProposal.load(tmp_path)


def test_a_folder_named_like_a_proposal_beside_its_files_does_not_hide_them(tmp_path) -> None:
    proposal = load_pretrained("chain")
    proposal.save(tmp_path / "chain")
    (tmp_path / "chain").mkdir()  # e.g. train-motif's default logdir runs/<name of --out>
    assert NeuralBlockProposal.load(tmp_path / "chain").motif.name == "chain"
