"""Tests of the meta-training loop, its metrics, checkpoints, CLI and DDP launch."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import toy_motif  # noqa: F401  (registers the "toy" motif; tests/ is on sys.path under pytest)

from neuralblock import NeuralBlockProposal
from neuralblock.proposals import MixtureDensityNetwork
from trainers import ConfigError, TrainConfig, load_checkpoint, train
from trainers.metrics import enumerated_log_q, exact_kl, expected_acceptance, mc_acceptance
from trainers.train_motif import main, parse_option_value

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, **overrides) -> TrainConfig:
    base = dict(
        motif="toy",
        steps=40,
        batch_size=32,
        lr=3e-3,
        components=3,
        hidden=[16],
        seed=3,
        val_size=128,
        val_every=20,
        checkpoint_every=20,
        log_every=5,
        out=str(tmp_path / "toy"),
        logdir=None,
        progress=False,
    )
    base.update(overrides)
    return TrainConfig(**base)


# ------------------------------------------------------------------------------------- metrics
def test_exact_metrics_match_brute_force():
    gen = torch.Generator().manual_seed(0)
    log_p = torch.log_softmax(torch.randn(3, 5, generator=gen), -1)
    log_q = torch.log_softmax(torch.randn(3, 5, generator=gen), -1)
    p, q = log_p.exp(), log_q.exp()
    kl = (p * (log_p - log_q)).sum(-1)
    acc = torch.zeros(3)
    for x, y in itertools.product(range(5), range(5)):  # x ~ p current, y ~ q proposed
        ratio = (p[:, y] * q[:, x]) / (p[:, x] * q[:, y])
        acc += p[:, x] * q[:, y] * ratio.clamp(max=1.0)
    assert torch.allclose(exact_kl(log_p, log_q), kl, atol=1e-6)
    assert torch.allclose(expected_acceptance(log_p, log_q), acc, atol=1e-6)
    assert torch.allclose(expected_acceptance(log_p, log_p), torch.ones(3), atol=1e-6)


def test_zero_probability_values_are_handled():
    log_p = torch.tensor([[0.0, -float("inf")]])
    log_q = torch.tensor([[-float("inf"), 0.0]])
    assert float(expected_acceptance(log_p, log_q)) == 0.0
    assert float(exact_kl(log_p, torch.tensor([[-0.5, -1.0]]))) == pytest.approx(0.5)


def test_monte_carlo_acceptance_agrees_with_exact():
    motif = toy_motif.ToyMotif()
    batch = motif.sample_training_batch(400, torch.Generator().manual_seed(1))
    mdn = MixtureDensityNetwork(3, [2, 2], components=2, hidden=(8,))
    with torch.no_grad():
        q = mdn(batch.features)
        exact = expected_acceptance(batch.log_p, enumerated_log_q(q, motif.block_spec.enumerate())).mean()
        estimate = mc_acceptance(q, batch.block, batch.log_p_fn, num_samples=64).mean()
    # 400 instances x 64 draws of a [0, 1] variable: standard error < 0.025, so 0.08 is > 3 sigma.
    assert abs(float(exact) - float(estimate)) < 0.08


# ------------------------------------------------------------------------------------- training
def test_training_lowers_kl_and_raises_acceptance(tmp_path):
    proposal, metrics = train(_config(tmp_path, steps=150, val_every=150, batch_size=64))
    untrained, final = metrics["history"][0], metrics["history"][-1]
    assert untrained["step"] == 0 and final["step"] == 150
    assert final["val/kl"] < 0.25 * untrained["val/kl"]
    assert final["val/acceptance"] > untrained["val/acceptance"] + 0.2
    assert metrics["examples_seen"] == 150 * 64 and metrics["finished"]


def test_non_enumerable_batches_use_sample_nll_and_mc_acceptance(tmp_path):
    _, metrics = train(_config(tmp_path, motif_options={"enumerable": False}, steps=20, out=None))
    assert "val/kl" not in metrics
    assert 0.0 < metrics["val/acceptance"] <= 1.0 and metrics["val/nll"] > 0


def _assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_interrupted_and_resumed_run_is_bit_identical(tmp_path, monkeypatch):
    full, full_metrics = train(_config(tmp_path / "full"))
    part, part_metrics = train(_config(tmp_path / "part"), stop_after=20)
    assert not part_metrics["finished"] and part_metrics["steps"] == 20
    assert not (tmp_path / "part" / "toy.json").exists()  # preempted: no output yet
    calls = []
    original = toy_motif.ToyMotif.sample_training_batch
    monkeypatch.setattr(
        toy_motif.ToyMotif, "sample_training_batch", lambda self, n, g: calls.append(n) or original(self, n, g)
    )
    resumed, resumed_metrics = train(_config(tmp_path / "part", resume=True))
    assert calls == [128] + [32] * 20  # the validation set, then only the 20 remaining steps
    _assert_same_parameters(full.mdn, resumed.mdn)
    assert resumed_metrics["history"] == full_metrics["history"]
    a, b = load_checkpoint(tmp_path / "full" / "toy.ckpt"), load_checkpoint(tmp_path / "part" / "toy.ckpt")
    assert torch.equal(a["generators"], b["generators"])
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("stop", [20, 37])  # at a logged, validated, checkpointed step; inside a logging window
def test_resume_inside_a_logging_window_keeps_the_loss_and_the_tensorboard_points(tmp_path, stop):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
        acc = EventAccumulator(str(run / "runs"))
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in ("train/loss", "val/kl")}

    options = dict(log_every=5, val_every=20)
    _, full = train(_config(tmp_path / "full", logdir=str(tmp_path / "full" / "runs"), **options))
    train(_config(tmp_path / "part", logdir=str(tmp_path / "part" / "runs"), **options), stop_after=stop)
    _, resumed = train(_config(tmp_path / "part", logdir=str(tmp_path / "part" / "runs"), resume=True, **options))
    assert resumed["train/loss"] == full["train/loss"]  # the window 36..40 spans the interruption
    assert scalars(tmp_path / "part") == scalars(tmp_path / "full")  # no point at or before the stop purged


def test_resume_can_extend_steps(tmp_path):
    schedule = dict(lr_schedule="step", lr_step_size=15, lr_gamma=0.5)
    full, _ = train(_config(tmp_path / "full", steps=40, **schedule))
    short, short_metrics = train(_config(tmp_path / "ext", steps=20, **schedule))
    assert short_metrics["finished"] and (tmp_path / "ext" / "toy.json").exists()
    extended, metrics = train(_config(tmp_path / "ext", steps=40, resume=True, **schedule))
    _assert_same_parameters(full.mdn, extended.mdn)
    assert metrics["steps"] == 40 and metrics["examples_seen"] == 40 * 32


def test_resume_with_changed_config_names_the_keys(tmp_path):
    train(_config(tmp_path, steps=10))
    with pytest.raises(ConfigError, match=r"lr.*seed|seed.*lr") as info:
        train(_config(tmp_path, steps=20, lr=1e-2, seed=4, resume=True))
    assert "hidden" not in str(info.value)
    with pytest.raises(ConfigError, match="already at step 10"):
        train(_config(tmp_path, steps=5, resume=True))
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(_config(tmp_path / "empty", resume=True))


def test_tensorboard_scalars_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(_config(tmp_path, steps=10, val_every=5, logdir=str(tmp_path / "runs")))
    events = list((tmp_path / "runs").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "runs"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {"train/loss", "val/nll", "val/kl", "val/acceptance", "lr", "grad_norm", "examples_per_second"}
    assert expected <= tags
    assert [e.step for e in acc.Scalars("val/kl")] == [0, 5, 10]


def test_output_proposal_loads_with_metrics_in_sidecar(tmp_path):
    proposal, metrics = train(_config(tmp_path, steps=10))
    loaded = NeuralBlockProposal.load(tmp_path / "toy")
    _assert_same_parameters(proposal.mdn, loaded.mdn)
    meta = json.loads((tmp_path / "toy.json").read_text())["metadata"]
    assert meta["validation"]["kl"] == pytest.approx(metrics["val/kl"])
    assert set(meta["validation"]) == {"nll", "kl", "acceptance"}
    assert meta["steps"] == 10 and meta["examples_seen"] == 10 * 32
    assert meta["training_seconds"] > 0 and meta["world_size"] == 1 and meta["device"] == "cpu"
    assert meta["training_config"]["hidden"] == [16] and "commit" in meta
    assert TrainConfig.from_dict(meta["training_config"]) == _config(tmp_path, steps=10)


def test_bad_config_values_raise():
    with pytest.raises(ConfigError, match="steps"):
        TrainConfig(motif="toy", steps=0).validate()
    with pytest.raises(ConfigError, match="lr"):
        TrainConfig(motif="toy", lr=-1.0).validate()
    with pytest.raises(ConfigError, match="unknown motif"):
        train(TrainConfig(motif="no-such-motif", steps=1, progress=False))
    with pytest.raises(ConfigError, match="bad options"):
        train(TrainConfig(motif="toy", motif_options={"colour": 1}, steps=1, progress=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="CUDA is not available"):
        train(_config(tmp_path, device="cuda"))


# ------------------------------------------------------------------------------------- CLI
def test_cli_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--motif" in out and "examples:" in out and "torchrun" in out and "--resume" in out


def test_cli_bad_motif_lists_choices(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--motif", "no-such-motif"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-motif'" in err and "toy" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "positive integer"),
        (["--lr", "0"], "positive finite number"),
        (["--option", "colour=red"], "bad options"),
        (["--hidden", "12,x"], "comma-separated widths"),
        (["--option", "scale=1", "--option", "scale=2"], "given twice"),
        (["--threads", "0"], "positive integer"),
    ],
)
def test_cli_bad_values_error(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--motif", "toy", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_trains_and_maps_options(tmp_path, capsys, monkeypatch):
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    out = tmp_path / "toy-cli"
    code = main(
        ["--motif", "toy", "--option", "scale=1.5", "--option", "enumerable=true", "--steps", "4"]
        + ["--batch-size", "8", "--hidden", "8,8", "--val-size", "16", "--out", str(out), "--no-progress"]
        + ["--logdir", str(tmp_path / "runs"), "--lr-schedule", "constant", "--threads", "1"]
    )
    assert code == 0 and threads == [1]
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert sidecar["motif"]["options"] == {"scale": 1.5, "seed": 0, "enumerable": True}
    assert sidecar["network"]["hidden"] == [8, 8]
    assert (tmp_path / "toy-cli.ckpt").exists()
    assert f"wrote {out}.safetensors and {out}.json" in capsys.readouterr().out


def test_cli_names_the_files_it_wrote_for_an_out_with_a_suffix(tmp_path, capsys):
    argv = ["--motif", "toy", "--steps", "2", "--batch-size", "8", "--hidden", "8", "--val-size", "8", "--no-progress"]
    code = main([*argv, "--out", str(tmp_path / "named.json"), "--logdir", str(tmp_path / "runs")])
    assert code == 0 and (tmp_path / "named.safetensors").exists() and (tmp_path / "named.json").exists()
    assert f"wrote {tmp_path / 'named.safetensors'} and {tmp_path / 'named.json'}" in capsys.readouterr().out


def test_a_user_library_that_is_not_a_folder_is_named(tmp_path, monkeypatch):
    from neuralblock import load_pretrained

    monkeypatch.setenv("NEURALBLOCK_LIBRARY", str(tmp_path / "mistyped"))
    with pytest.raises(ValueError, match=r"NEURALBLOCK_LIBRARY='.*mistyped' is not a folder"):
        load_pretrained("mine")


def test_parse_option_value():
    assert parse_option_value("3") == 3 and parse_option_value("-2.5") == -2.5
    assert parse_option_value("False") is False and parse_option_value("2x2") == "2x2"


def test_torchrun_ddp_smoke(tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(REPO / "trainers" / "train_motif.py"), "--plugin", str(REPO / "tests" / "toy_motif.py")]
    cmd += ["--motif", "toy", "--steps", "6", "--batch-size", "16", "--hidden", "8", "--components", "2"]
    cmd += ["--val-size", "32", "--val-every", "3", "--out", str(out), "--logdir", str(tmp_path / "runs")]
    cmd += ["--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads(out.with_suffix(".json").read_text())["metadata"]
    assert meta["world_size"] == 2 and meta["examples_seen"] == 6 * 16 * 2
    ckpt = load_checkpoint(tmp_path / "ddp.ckpt")
    assert ckpt["generators"].shape[0] == 2 and not torch.equal(ckpt["generators"][0], ckpt["generators"][1])
    assert len(list((tmp_path / "runs").glob("events.out.tfevents.*"))) == 1  # rank 0 only


def test_register_proposal_updates_index(tmp_path) -> None:
    import json

    from trainers.library import register_proposal

    stem = tmp_path / "lib" / "toy-a"
    stem.parent.mkdir()
    stem.with_suffix(".json").write_text(
        json.dumps({"motif": {"name": "toy"}, "metadata": {"validation": {"kl": 0.01}, "training_seconds": 3.0}})
    )
    index = tmp_path / "lib" / "index.json"
    register_proposal(stem, "toy-a", index_path=index)
    entry = json.loads(index.read_text())["proposals"]["toy-a"]
    assert entry["file"] == "toy-a" and entry["metrics"] == {"kl": 0.01}
    with pytest.raises(ValueError, match="not inside the library folder"):
        register_proposal(stem, "toy-a", index_path=tmp_path / "elsewhere" / "index.json")
    for name, kl in (("toy-0", 0.5), ("toy-0.5", 0.25)):  # a dotted stem reads its own sidecar
        (tmp_path / "lib" / f"{name}.json").write_text(
            json.dumps({"motif": {"name": name}, "metadata": {"validation": {"kl": kl}}})
        )
    register_proposal(tmp_path / "lib" / "toy-0.5", "toy-dotted", index_path=index)
    entry = json.loads(index.read_text())["proposals"]["toy-dotted"]
    assert entry["motif"] == {"name": "toy-0.5"} and entry["metrics"] == {"kl": 0.25}


def test_expected_acceptance_matches_pairwise_sum() -> None:
    from trainers.metrics import expected_acceptance

    gen = torch.Generator().manual_seed(3)
    log_p = torch.log_softmax(2 * torch.randn(4, 40, generator=gen), -1)
    log_q = torch.log_softmax(2 * torch.randn(4, 40, generator=gen), -1)
    log_p[0, :5] = -float("inf")  # impossible values, and a proposal that misses support
    log_q[1, :5] = -float("inf")
    log_p, log_q = log_p.log_softmax(-1), log_q.log_softmax(-1)
    pairs = log_p.unsqueeze(-1) + log_q.unsqueeze(-2)
    brute = torch.logsumexp(torch.minimum(pairs, pairs.transpose(-1, -2)).flatten(-2), -1).exp()
    assert torch.allclose(expected_acceptance(log_p, log_q), brute, atol=1e-6)
    assert torch.allclose(expected_acceptance(log_p, log_p), torch.ones(4), atol=1e-6)


# ------------------------------------------------------------------------------------- issue 23: checked before work
def _no_training(monkeypatch):
    """Make any training attempt fail the test: usage errors must come before the first step."""
    import trainers.train_motif as cli

    def fail(*args, **kwargs):
        raise AssertionError("training started before the usage error")

    monkeypatch.setattr(cli, "train", fail)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "/proc/a"], "cannot write the weights /proc/a.safetensors: /proc is not writable"),
        (
            ["--out", "{t}/x/c0", "--checkpoint", "{t}/x/c0.json"],
            "the checkpoint path {t}/x/c0.json is also the sidecar",
        ),
        (["--out", "{t}/x/d", "--logdir", "{t}/x/d.json"], "the logdir path {t}/x/d.json is also the sidecar path"),
        (["--out", "{t}/x/e", "--checkpoint", "{t}/x/e.safetensors"], "is also the weights path"),
        (["--out", "{t}/x/f", "--logdir", "{t}/file"], "the logdir path {t}/file is a file; expected a folder"),
        (["--out", "{t}/folder"], "the weights path {t}/folder.safetensors is a folder; expected a file"),
        (["--out", "{t}/file/a"], "cannot write the weights {t}/file/a.safetensors: {t}/file is not a folder"),
        (["--out", "{t}/x/g", "--register", "g"], "--register: the proposal {t}/x/g is not inside the library folder"),
        (["--out", "{t}/lib/g", "--library", "{t}/lib", "--register", "a/b"], "--register needs a name without '/'"),
        (["--out", "{t}/x/h", "--resume"], "--resume given but no checkpoint at {t}/x/h.ckpt"),
        (["--out", "{t}/x/i", "--checkpoint", "{t}/junk.ckpt", "--resume"], "is not a readable training checkpoint"),
        (
            ["--seed", "99999999999999999999"],
            "must be an integer in 0..9223372036854710272, got '99999999999999999999'",
        ),
        (["--seed", "-1"], "must be an integer in 0..9223372036854710272"),
        (["--seed", "1" * 5000], "expected an integer in 0..9223372036854710272, got '1111"),
        (["--steps", "\uff15"], "expected a positive integer, got '\uff15'"),
    ],
)
def test_cli_usage_errors_come_before_any_work(tmp_path, monkeypatch, capsys, args, message):
    _no_training(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.safetensors").mkdir()
    (tmp_path / "junk.ckpt").write_bytes(b"\x80\x04not a pickle")
    argv = ["--motif", "toy", "--no-progress"] + [a.format(t=tmp_path) for a in args]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message.format(t=tmp_path) in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()  # nothing created for a refused run


def test_cli_damaged_checkpoint_is_a_usage_error(tmp_path, monkeypatch, capsys):
    train(_config(tmp_path, steps=4, val_size=0))
    ckpt = torch.load(tmp_path / "toy.ckpt", weights_only=True)
    del ckpt["optimizer"]
    torch.save(ckpt, tmp_path / "toy.ckpt")
    _no_training(monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(["--motif", "toy", "--out", str(tmp_path / "toy"), "--resume", "--steps", "8", "--no-progress"])
    assert info.value.code == 2 and "is not a complete training checkpoint: it lacks ['optimizer']" in (
        capsys.readouterr().err
    )


def test_every_epilog_example_parses(tmp_path, monkeypatch):
    import shlex

    import trainers.train_motif as cli

    monkeypatch.chdir(tmp_path)
    commands = [line.strip() for line in cli.EPILOG.splitlines() if "train-motif --motif" in line]
    commands += [line.strip() for line in cli.EPILOG.splitlines() if "train_motif.py --motif" in line]
    assert len(commands) >= 4
    parser = cli.build_parser()
    for command in commands:
        words = shlex.split(command)
        env = {}
        while "=" in words[0]:
            key, _, value = words.pop(0).partition("=")
            env[key] = value.replace("~", str(tmp_path))
        start = next(i for i, w in enumerate(words) if w == "--motif")
        argv = words[start:]
        if "--plugin" in words:
            continue  # names a module the reader writes
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        if "--resume" in argv:  # nothing to resume yet: a usage error; the same command without it is fine
            with pytest.raises(SystemExit):
                cli.config_from_args(parser.parse_args(argv), parser)
            argv.remove("--resume")
        config = cli.config_from_args(parser.parse_args(argv), parser)
        assert (config.motif, config.motif_options) in (("grid", {"size": 2}), ("chain", {"family": "linear"}))
        for key in env:
            monkeypatch.delenv(key)


def test_stale_temporary_files_are_removed_on_the_next_start(tmp_path):
    stale = [tmp_path / ".toy.ckpt.x1y2.tmp", tmp_path / ".toy.json.abcd.tmp", tmp_path / ".toy.safetensors.q.tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    keep = tmp_path / ".other.ckpt.x1y2.tmp"
    keep.write_bytes(b"someone else's")
    train(_config(tmp_path, steps=2, val_size=0))
    assert not any(p.exists() for p in stale) and keep.exists()


def test_resume_with_more_steps_says_what_the_cosine_schedule_does(tmp_path, caplog):
    train(_config(tmp_path, steps=10, val_size=0))
    with caplog.at_level("WARNING", logger="trainers.trainer"):
        train(_config(tmp_path, steps=20, val_size=0, resume=True))
    assert "the cosine schedule is stretched to the new total from step 10" in caplog.text


def test_register_into_a_user_library(tmp_path, monkeypatch, capsys):
    from neuralblock import list_pretrained, load_pretrained

    library = tmp_path / "my-library"
    monkeypatch.setenv("NEURALBLOCK_LIBRARY", str(library))
    monkeypatch.chdir(tmp_path)
    shipped = list_pretrained()
    argv = ["--motif", "toy", "--steps", "2", "--batch-size", "8", "--hidden", "8", "--val-size", "8"]
    code = main([*argv, "--no-progress", "--register", "mine"])
    assert code == 0 and f"registered 'mine' in {library / 'index.json'}" in capsys.readouterr().out
    assert (library / "toy.safetensors").exists()  # the default --out lies in the library
    assert list_pretrained() == sorted([*shipped, "mine"])
    assert load_pretrained("mine").motif.spec()["name"] == "toy"
    if shipped:  # a user entry named like a shipped one is shadowed by it
        index = json.loads((library / "index.json").read_text())
        index["proposals"][shipped[0]] = index["proposals"]["mine"]
        (library / "index.json").write_text(json.dumps(index))
        assert load_pretrained(shipped[0]).motif.spec()["name"] != "toy"
    (library / "index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a valid library index"):
        load_pretrained("mine")
