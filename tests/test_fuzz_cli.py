"""Seeded fuzzing of the ``train-motif`` command line (issue 23): a usage error or a checked config, never a crash.

Each case draws a random argument list from a vocabulary of good and bad values (numbers
out of range or not numbers at all, Unicode digits, clashing or unwritable paths, bad
motif options, a missing or damaged checkpoint to resume). Training itself is replaced by a
stub: the test is about what happens *before* the first step. ``main`` must either exit
with status 2 and a one-line ``train-motif: error:`` message (no traceback), or hand the
stub a config whose values and paths pass every check.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import toy_motif  # noqa: F401  (registers the "toy" motif)

import trainers.train_motif as cli
from neuralblock.proposals import proposal_files
from trainers import TrainConfig

VALUES: dict[str, list[str]] = {
    "--steps": ["10", "0", "-3", "x", "1e3", "99999999999999999999", "\uff15", " 7 "],
    "--batch-size": ["8", "0", "2.5", "-1", "\u0665"],
    "--lr": ["0.001", "0", "-1", "nan", "inf", "1e-400", "1e400", "x"],
    "--lr-schedule": ["cosine", "step", "constant", "linear"],
    "--grad-clip": ["1", "0", "-1", "nan", "inf", "x"],
    "--components": ["2", "0", "x"],
    "--hidden": ["8,8", "", ",", "0", "8,-1", "x", "8,,8"],
    "--seed": ["0", "7", "-1", "9223372036854775807", "99999999999999999999", "1" * 5000, "\uff11"],
    "--threads": ["1", "0", "x"],
    "--val-size": ["0", "16", "-1", "x"],
    "--val-every": ["0", "5", "-1"],
    "--checkpoint-every": ["0", "5", "-2", "y"],
    "--out": ["{t}/o", "{t}/sub/o", "/proc/x", "{t}/file", "{t}/file/o", "{t}/dir", "{t}/o.json", "{t}/lib/o"],
    "--logdir": ["{t}/runs", "{t}/file", "{t}/o.json", "{t}/o.safetensors", "{t}/dir.safetensors", "/proc/runs"],
    "--checkpoint": ["{t}/c.ckpt", "{t}/o.json", "{t}/junk.ckpt", "{t}/dir.safetensors", "/proc/c"],
    "--option": ["scale=1.5", "=1", "x", "scale=", "1a=2", "enumerable=true", "colour=red", "scale=nan"],
    "--register": ["mine", "", "a/b", " x"],
    "--library": ["{t}/lib", "{t}/file", "/proc/lib"],
    "--motif": ["toy", "toy", "toy", "no-such-motif", ""],
}
FLAGS = ["--resume", "--no-progress"]


def _argv(rng: random.Random, folder: Path) -> list[str]:
    argv = ["--motif", rng.choice(VALUES["--motif"])] if rng.random() < 0.95 else []
    for option in rng.sample(sorted(set(VALUES) - {"--motif"}), rng.randint(0, 6)):
        argv += [option, rng.choice(VALUES[option]).format(t=folder)]
    argv += [flag for flag in FLAGS if rng.random() < 0.2]
    return argv


FIXTURES = ("dir", "dir.safetensors", "file", "junk.ckpt")


def _write_every_output(config: TrainConfig) -> None:
    """Write each output the run would write; fail if two coincide or one cannot be written."""
    files = [] if config.out is None else list(proposal_files(config.out))
    if config.checkpoint_path is not None:
        files.append(config.checkpoint_path)
    targets = [p.resolve() for p in files] + ([Path(config.logdir).resolve()] if config.logdir else [])
    assert len(set(targets)) == len(targets), f"outputs clash: {targets}"
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"output")
    if config.logdir:
        Path(config.logdir).mkdir(parents=True, exist_ok=True)
        (Path(config.logdir) / "events.out").write_bytes(b"event")


def _clean(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.name not in FIXTURES:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def test_fuzz_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """250 seeded command lines: exit 2 with a usage message, or a config that passes every check."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir.safetensors").mkdir()
    (tmp_path / "junk.ckpt").write_bytes(b"\x80\x04 not a checkpoint")
    started: list[TrainConfig] = []

    def stub(config: TrainConfig, **kwargs: Any) -> tuple[None, dict[str, Any]]:
        started.append(config)
        return None, {"finished": False}

    monkeypatch.setattr(cli, "train", stub)
    monkeypatch.delenv("NEURALBLOCK_LIBRARY", raising=False)
    outcomes = {"usage error": 0, "started": 0}
    for seed in range(250):
        argv = _argv(random.Random(seed), tmp_path)
        before = len(started)
        try:
            code = cli.main(argv)
        except SystemExit as stop:
            err = capsys.readouterr().err
            assert stop.code == 2, f"seed {seed} {argv}: exit {stop.code}\n{err}"
            assert "train-motif: error:" in err and "Traceback" not in err, f"seed {seed} {argv}:\n{err}"
            assert len(started) == before, f"seed {seed} {argv}: training started before the usage error"
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FIXTURES), f"seed {seed}: refused run wrote"
            outcomes["usage error"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - the point of the test: no traceback for any command line
            pytest.fail(f"seed {seed} {argv}: {type(err).__name__}: {err}")
        capsys.readouterr()
        assert code == 0 and len(started) == before + 1, f"seed {seed} {argv}"
        config = started[-1]
        config.validate()  # the config the run would use passes every check
        config.check_paths()
        _write_every_output(config)  # and, independently of those checks, every output can really be written
        _clean(tmp_path)
        outcomes["started"] += 1
    assert outcomes["usage error"] > 100 and outcomes["started"] > 10, outcomes
    print(f"cli fuzz: {outcomes}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FIXTURES)
