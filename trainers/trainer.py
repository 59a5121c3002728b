"""Meta-training of neural block proposals: the loop, validation, checkpoints and DDP.

:func:`train` fits a :class:`~neuralblock.proposals.NeuralBlockProposal` for one motif
by minimising ``E[-log q(B | C, Psi)]`` over random instantiations of the motif drawn
with :meth:`Motif.sample_training_batch`. When a batch carries the exact conditional
``log_p`` over the enumerated block values, the loss is the exact expectation
``sum_k p_k * (-log q(x_k))`` (same objective, lower variance); otherwise it is the
negative log-likelihood of the sampled blocks.

Every run is reproducible from its :class:`TrainConfig`: the network is initialised from
``seed``, training data come from an explicit :class:`torch.Generator` seeded with
``seed + rank``, and the validation set from a separate generator. Checkpoints hold the
model, optimizer, scheduler, data-generator and RNG states, so a run that is stopped and
resumed ends with bit-identical parameters to one that was never interrupted.

Under ``torchrun`` (``WORLD_SIZE > 1``) the network is wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel` (gloo on CPU, nccl on CUDA); each rank
draws its own ``batch_size`` instantiations per step, and only rank 0 validates and
writes TensorBoard events, checkpoints and the output proposal.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> from trainers.trainer import TrainConfig, train
    >>> config = TrainConfig(motif="grid", motif_options={"size": "2x2"}, steps=2000,
    ...                      out="pretrained/grid-2x2", logdir="runs/grid-2x2")  # doctest: +SKIP
    >>> proposal, metrics = train(config)  # doctest: +SKIP
    >>> metrics["val/kl"]  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import io
import logging
import math
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from neuralblock.motif import BlockSpec, Motif, TrainingBatch, get_motif
from neuralblock.proposals import (
    MixtureDensityNetwork,
    NeuralBlockProposal,
    atomic_write_bytes,
    code_commit,
    proposal_files,
)
from trainers.metrics import enumerated_log_q, exact_kl, expected_acceptance, expected_nll, mc_acceptance

__all__ = [
    "CHECKPOINT_FORMAT",
    "ConfigError",
    "TrainConfig",
    "evaluate",
    "check_resume",
    "check_writable",
    "load_checkpoint",
    "remove_stale_temporaries",
    "resolve_device",
    "train",
]

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
LR_SCHEDULES = ("constant", "cosine", "step")
#: Keys that may differ between a checkpoint's config and the resuming run's config:
#: they change how long the run goes or where it writes, never the training trajectory.
RESUMABLE_KEYS = frozenset(
    {
        "steps",
        "out",
        "logdir",
        "checkpoint",
        "resume",
        "device",
        "val_every",
        "checkpoint_every",
        "log_every",
        "progress",
    }
)
_VAL_SEED_SALT = 0x5EED_7A1D
MAX_SEED = 2**63 - 2**16
"""Largest ``seed`` (ranks seed ``seed + rank``; torch generators take up to 64 bits)."""


class ConfigError(ValueError):
    """A training configuration the user must fix (bad value, mismatched resume, missing device)."""


@dataclass
class TrainConfig:
    """Everything that defines a meta-training run.

    Attributes:
        motif: registered motif name (see ``motifs.names()``).
        motif_options: keyword options for :func:`neuralblock.get_motif`.
        steps: total optimizer steps. A resumed run may raise it: with the ``constant`` and ``step``
            schedules it then continues exactly as a run given that many steps from the start;
            the ``cosine`` schedule is stretched to the new total from the resume step on, so that
            run differs from one started with the larger total (a warning says so). Resuming with
            the same ``steps`` always continues exactly.
        batch_size: instantiations per step *per rank* (global batch = ``batch_size * world_size``).
        lr: peak Adam learning rate.
        components: MDN mixture components.
        hidden: MDN hidden widths.
        seed: seeds the network initialisation, the training data (``seed + rank``) and,
            through a fixed salt, the held-out validation set.
        val_size: held-out instantiations (0 disables validation).
        val_every: validate every this many steps (0: only at the start and the end).
        exact_loss_max_states: use the exact expectation ``E_p[-log q]`` when the block has at most
            this many values, else the NLL of the batch's exact draw ``block`` (same objective,
            unbiased, far cheaper for large blocks such as 4 tags of 13).
        val_mc_samples: proposals per instance for the Monte Carlo acceptance estimate
            of blocks that cannot be enumerated.
        checkpoint_every: checkpoint every this many steps (0: only at the end).
        log_every: write training scalars every this many steps.
        out: path stem of the output proposal (``out.safetensors`` + ``out.json``); ``None`` writes nothing.
        logdir: TensorBoard folder; ``None`` disables TensorBoard.
        checkpoint: checkpoint file; default ``out + ".ckpt"`` (no checkpoints without ``out``).
        resume: continue from ``checkpoint`` (which must exist and match this config).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; under torchrun CUDA ranks use ``cuda:LOCAL_RANK``.
        grad_clip: clip the global gradient norm to this value (0 disables clipping).
        lr_schedule: ``"constant"``, ``"cosine"`` (to ``lr * lr_min_ratio`` at ``steps``) or
            ``"step"`` (multiply by ``lr_gamma`` every ``lr_step_size`` steps).
        lr_min_ratio: final learning-rate fraction of the cosine schedule.
        lr_step_size: decay interval of the step schedule.
        lr_gamma: decay factor of the step schedule.
        progress: show a tqdm progress bar on rank 0.
    """

    motif: str
    motif_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 5000
    batch_size: int = 256
    lr: float = 1e-3
    components: int = 8
    hidden: list[int] = field(default_factory=lambda: [128, 128])
    seed: int = 0
    val_size: int = 1024
    val_every: int = 250
    val_mc_samples: int = 16
    exact_loss_max_states: int = 512
    checkpoint_every: int = 500
    log_every: int = 10
    out: str | None = None
    logdir: str | None = None
    checkpoint: str | None = None
    resume: bool = False
    device: str = "cpu"
    grad_clip: float = 10.0
    lr_schedule: str = "cosine"
    lr_min_ratio: float = 0.05
    lr_step_size: int = 1000
    lr_gamma: float = 0.5
    progress: bool = True

    def __post_init__(self) -> None:
        self.hidden = [int(h) for h in self.hidden]
        self.motif_options = dict(self.motif_options)
        for key in ("out", "logdir", "checkpoint"):
            value = getattr(self, key)
            if value is not None:
                setattr(self, key, os.fspath(value))

    def validate(self) -> None:
        """Check every value.

        Raises:
            ConfigError: naming the bad value and what was expected.
        """
        positive = {"steps": self.steps, "batch_size": self.batch_size, "components": self.components}
        for key, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        non_negative = {
            "val_size": self.val_size,
            "val_every": self.val_every,
            "val_mc_samples": self.val_mc_samples,
            "checkpoint_every": self.checkpoint_every,
        }
        for key, value in non_negative.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{key} must be a non-negative integer, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be an integer in 0..{MAX_SEED}, got {self.seed!r}")
        if not isinstance(self.log_every, int) or self.log_every <= 0:
            raise ConfigError(f"log_every must be a positive integer, got {self.log_every!r}")
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ConfigError(f"hidden must be a non-empty list of positive widths, got {self.hidden!r}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr must be a positive finite number, got {self.lr!r}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ConfigError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not 0 <= self.lr_min_ratio <= 1:
            raise ConfigError(f"lr_min_ratio must be in [0, 1], got {self.lr_min_ratio!r}")
        if self.lr_step_size <= 0 or not 0 < self.lr_gamma <= 1:
            raise ConfigError(
                f"step schedule needs lr_step_size > 0 and 0 < lr_gamma <= 1, got {self.lr_step_size}, {self.lr_gamma}"
            )
        if self.resume and self.checkpoint_path is None:
            raise ConfigError("resume needs a checkpoint path (set checkpoint or out)")

    def output_paths(self) -> dict[str, Path]:
        """Every path the run writes: ``weights``, ``sidecar``, ``checkpoint`` (files) and ``logdir`` (a folder)."""
        paths: dict[str, Path] = {}
        if self.out is not None:
            paths["weights"], paths["sidecar"] = proposal_files(self.out)
        if self.checkpoint_path is not None:
            paths["checkpoint"] = self.checkpoint_path
        if self.logdir is not None:
            paths["logdir"] = Path(self.logdir)
        return paths

    def check_paths(self) -> None:
        """Check, before any work, that every output path is writable and that no two of them clash.

        Nothing is created: each missing folder's nearest existing ancestor must be a folder
        in which a file can be created (probed with a temporary file, removed at once).

        Raises:
            ConfigError: naming the path and the problem.
        """
        paths = self.output_paths()
        seen: dict[Path, str] = {}
        for role, path in paths.items():
            resolved = path.resolve()
            if resolved in seen:
                raise ConfigError(
                    f"the {role} path {path} is also the {seen[resolved]} path: the run would overwrite one "
                    "with the other; choose distinct --out, --checkpoint and --logdir"
                )
            seen[resolved] = role
        for role, path in paths.items():
            is_folder = role == "logdir"
            if path.exists() and path.is_dir() != is_folder:
                kind = "a file" if is_folder else "a folder"
                raise ConfigError(f"the {role} path {path} is {kind}; expected {'a folder' if is_folder else 'a file'}")
            check_writable(path if is_folder and path.is_dir() else path.parent, role, path)

    @property
    def checkpoint_path(self) -> Path | None:
        """Where checkpoints go: ``checkpoint``, else ``out + ".ckpt"``, else ``None``."""
        if self.checkpoint is not None:
            return Path(self.checkpoint)
        if self.out is not None:
            return Path(self.out + ".ckpt")
        return None

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-compatible values (stored in checkpoints and sidecars)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Rebuild a config written by :meth:`to_dict` (unknown keys are an error)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown TrainConfig keys {unknown}")
        return cls(**data)


def check_writable(folder: Path, role: str, path: Path) -> None:
    """Raise ``ConfigError`` unless a file can be created in ``folder`` or in its nearest existing ancestor."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"cannot write the {role} {path}: {probe} is not a folder")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".train-motif-probe.", suffix=".tmp")
    except OSError as err:
        raise ConfigError(f"cannot write the {role} {path}: {probe} is not writable ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(name)


def remove_stale_temporaries(paths: list[Path]) -> list[Path]:
    """Delete the temporary files that killed runs left next to ``paths`` (``.NAME.*.tmp`` of atomic writes).

    Returns:
        The files removed.
    """
    removed = []
    for path in paths:
        if not path.parent.is_dir():
            continue
        for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            try:
                stale.unlink()
            except OSError:  # gone already, or not ours to remove: leave it
                continue
            removed.append(stale)
    return removed


# ---------------------------------------------------------------------------------- device / dist
def resolve_device(name: str, local_rank: int = 0, world_size: int = 1) -> torch.device:
    """The torch device for ``name`` (``cpu``, ``cuda``, ``cuda:N``, ...).

    Raises:
        ConfigError: an unknown device string, or CUDA requested where it is unavailable.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"unknown device {name!r} (expected cpu, cuda or cuda:N): {err}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r} requested but CUDA is not available "
                f"(torch {torch.__version__}, cuda build: {torch.version.cuda}); use --device cpu"
            )
        if world_size > 1:
            device = torch.device("cuda", local_rank)
        elif device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device} requested but only {torch.cuda.device_count()} CUDA devices exist")
    return device


@dataclass
class _Dist:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = False

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> _Dist:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls()
        rank = int(os.environ.get("RANK", "0"))
        return cls(world_size, rank, int(os.environ.get("LOCAL_RANK", str(rank))))

    def init(self, device: torch.device) -> None:
        if self.active and not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
            self.owns_group = True
        if self.active and dist.get_world_size() != self.world_size:
            raise ConfigError(f"WORLD_SIZE={self.world_size} but the process group has {dist.get_world_size()}")

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


# ---------------------------------------------------------------------------------- objective
class _Objective(nn.Module):
    """``E[-log q]`` of a batch; a module so that DDP wraps one forward that returns the loss."""

    def __init__(self, mdn: MixtureDensityNetwork, values: Tensor | None, exact_max_states: int) -> None:
        super().__init__()
        self.mdn = mdn
        self.values = values
        self.exact_max_states = exact_max_states

    def forward(self, features: Tensor, block: Tensor, log_p: Tensor | None) -> Tensor:
        q = self.mdn(features)
        if log_p is None or log_p.shape[-1] > self.exact_max_states:
            return -q.log_prob(block).mean()
        if self.values is None:
            raise ValueError("a batch carries log_p but the motif's block cannot be enumerated")
        return expected_nll(enumerated_log_q(q, self.values), log_p).mean()


def _lr_lambda(config: TrainConfig) -> Callable[[int], float]:
    if config.lr_schedule == "constant":
        return lambda step: 1.0
    if config.lr_schedule == "step":
        size, gamma = config.lr_step_size, config.lr_gamma
        return lambda step: gamma ** (step // size)
    total, floor = config.steps, config.lr_min_ratio

    def cosine(step: int) -> float:
        progress = min(step, total) / total
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return cosine


# ---------------------------------------------------------------------------------- validation
@torch.no_grad()
def evaluate(
    mdn: MixtureDensityNetwork,
    batch: TrainingBatch,
    block_spec: BlockSpec,
    mc_samples: int = 16,
    seed: int = 0,
) -> dict[str, float]:
    """Validation metrics of ``mdn`` on a held-out batch (run on the batch's device, CPU usually).

    * ``nll``: ``E_p[-log q]`` exactly when ``batch.log_p`` is given, else the sample NLL
      of ``batch.block``;
    * ``kl``: exact ``KL(p || q)`` (only with ``log_p``);
    * ``nll_gap``: ``E[log p(B | C) - log q(B | C)]`` over the instances whose exact
      conditional density is known (``batch.exact_log_p``), a Monte Carlo KL estimate;
    * ``acceptance``: independence-MH acceptance rate of ``q`` against the exact conditional,
      exact with ``log_p``, Monte Carlo with ``batch.log_p_fn`` (seeded by ``seed`` inside
      :func:`torch.random.fork_rng`, so the caller's RNG stream is untouched); absent if neither.

    Returns:
        Metric name -> mean over the held-out instances.
    """
    features = batch.features.to(torch.get_default_dtype())
    n = int(features.shape[0])
    out: dict[str, float] = {}
    if n == 0:
        return out
    if batch.log_p is not None:
        values = block_spec.enumerate()
        k = int(values.shape[0])
        chunk = max(1, min(n, (1 << 21) // max(1, k * mdn.components)))
        nll = kl = acc = 0.0
        for start in range(0, n, chunk):
            log_q = enumerated_log_q(mdn(features[start : start + chunk]), values)
            log_p = batch.log_p[start : start + chunk].to(log_q.dtype)
            nll += float(expected_nll(log_q, log_p).sum())
            kl += float(exact_kl(log_p, log_q).sum())
            acc += float(expected_acceptance(log_p, log_q).sum())
        return {"nll": nll / n, "kl": kl / n, "acceptance": acc / n}
    block = batch.block.to(features.dtype)
    q = mdn(features)
    log_q = q.log_prob(block)
    out["nll"] = float(-log_q.mean())
    if batch.exact_log_p is not None:
        known = torch.isfinite(batch.exact_log_p)
        if known.any():  # E_p[log p - log q] over the instances with a closed-form conditional
            out["nll_gap"] = float((batch.exact_log_p[known].to(log_q.dtype) - log_q[known]).mean())
    if batch.log_p_fn is not None and mc_samples > 0:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out["acceptance"] = float(mc_acceptance(q, block, batch.log_p_fn, mc_samples).mean())
    return out


# ---------------------------------------------------------------------------------- checkpoints
def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training checkpoint with ``torch.load(weights_only=True)`` (no code is executed).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a neuralblock training checkpoint.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling errors come in many types
        raise ValueError(f"{path} is not a readable training checkpoint: {err}") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a neuralblock training checkpoint (format {CHECKPOINT_FORMAT})")
    missing = sorted(_CHECKPOINT_KEYS - set(ckpt))
    if missing:
        raise ValueError(f"{path} is not a complete training checkpoint: it lacks {missing}")
    counts = {k: ckpt[k] for k in ("step", "examples_seen", "world_size")}
    bad = [k for k, v in counts.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad or not isinstance(ckpt["config"], dict) or not isinstance(ckpt["history"], list):
        raise ValueError(f"{path} is a damaged training checkpoint (bad {bad or ['config or history']})")
    return ckpt


_CHECKPOINT_KEYS = frozenset(
    {"format", "step", "config", "model", "optimizer", "scheduler", "generators", "torch_rng", "python_rng"}
    | {"examples_seen", "training_seconds", "world_size", "history"}
)


def check_resume(config: TrainConfig, world_size: int | None = None) -> dict[str, Any]:
    """Load the checkpoint a ``resume`` run continues and check it against ``config``, before any work.

    Args:
        config: the resuming run.
        world_size: processes of this run (default: ``WORLD_SIZE`` from the environment, else 1).

    Returns:
        The checkpoint.

    Raises:
        ConfigError: no checkpoint, an unreadable or damaged one, or one whose config or process
            count differs from this run's in anything but steps and output settings.
    """
    path = config.checkpoint_path
    if path is None:
        raise ConfigError("resume needs a checkpoint path (set checkpoint or out)")
    try:
        ckpt = load_checkpoint(path)
    except FileNotFoundError as err:
        raise ConfigError(f"--resume given but {err}; run without --resume to start fresh") from err
    except ValueError as err:
        raise ConfigError(f"cannot resume: {err}") from err
    _check_resume(ckpt["config"], config.to_dict(), int(ckpt["step"]), path)
    world = _Dist.from_env().world_size if world_size is None else world_size
    if int(ckpt["world_size"]) != world:
        raise ConfigError(
            f"cannot resume from {path}: it was written by {ckpt['world_size']} processes, "
            f"this run has {world} (each rank owns a data stream)"
        )
    return ckpt


def _check_resume(saved: dict[str, Any], current: dict[str, Any], step: int, path: Path) -> None:
    keys = sorted((set(saved) | set(current)) - RESUMABLE_KEYS)
    differing = [k for k in keys if saved.get(k) != current.get(k)]
    if differing:
        detail = "; ".join(f"{k}: checkpoint {saved.get(k)!r} != now {current.get(k)!r}" for k in differing)
        raise ConfigError(
            f"cannot resume from {path}: config differs in {', '.join(differing)} ({detail}). "
            "Only steps (extension) and output/logging settings may change; restore the original "
            "values or start a fresh run without --resume."
        )
    if current["steps"] < step:
        raise ConfigError(f"cannot resume from {path}: it is already at step {step} > steps={current['steps']}")


# ---------------------------------------------------------------------------------- the loop
def train(config: TrainConfig, *, stop_after: int | None = None) -> tuple[NeuralBlockProposal, dict[str, Any]]:
    """Meta-train a neural block proposal for ``config.motif``.

    Args:
        config: the run (see :class:`TrainConfig`).
        stop_after: stop once this global step is reached, after writing a checkpoint and
            without writing the output proposal, exactly as if the job had been preempted
            there (for tests and time-boxed jobs; resume later with ``config.resume=True``).

    Returns:
        ``(proposal, metrics)``: the trained proposal (on the training device, eval mode)
        and a dict with the final ``val/nll``, ``val/kl``, ``val/acceptance`` (those that
        apply), ``train/loss``, ``steps``, ``examples_seen``, ``training_seconds``,
        ``world_size`` and ``history`` (one dict per validation). On ranks other than 0
        the validation entries are absent.

    Raises:
        ConfigError: bad config values, unknown motif/options, unavailable device, or a
            resume whose checkpoint config differs in anything but ``steps`` and output paths.
    """
    config.validate()
    config.check_paths()
    import motifs  # noqa: F401  (registers the concrete motifs)

    try:
        motif: Motif = get_motif(config.motif, **config.motif_options)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    ddp = _Dist.from_env()
    device = resolve_device(config.device, ddp.local_rank, ddp.world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ddp.init(device)
    try:
        return _train(config, motif, ddp, device, stop_after)
    finally:
        ddp.close()


def _train(
    config: TrainConfig, motif: Motif, ddp: _Dist, device: torch.device, stop_after: int | None
) -> tuple[NeuralBlockProposal, dict[str, Any]]:
    config_dict = config.to_dict()
    ckpt_path = config.checkpoint_path
    spec = motif.block_spec
    values = None if spec.continuous else spec.enumerate().to(device)

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    proposal = NeuralBlockProposal(motif, components=config.components, hidden=config.hidden).to(device)
    objective = _Objective(proposal.mdn, values, config.exact_loss_max_states)
    optimizer = torch.optim.Adam(proposal.mdn.parameters(), lr=config.lr)
    lr_lambda = _lr_lambda(config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    generator = torch.Generator().manual_seed(config.seed + ddp.rank)

    step, examples_seen, training_seconds, skipped = 0, 0, 0.0, 0
    resumed_loss = float("nan")
    resumed_window = (0.0, 0)  # this rank's loss sum and step count in the unfinished logging window
    history: list[dict[str, float]] = []
    if config.resume:
        if ckpt_path is None:  # validate() rules this out; kept as an error, not an assert
            raise ConfigError("resume needs an output path to find the checkpoint")
        ckpt = check_resume(config, ddp.world_size)
        try:
            proposal.mdn.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
        except (KeyError, RuntimeError, TypeError, ValueError) as err:
            raise ConfigError(f"cannot resume from {ckpt_path}: its saved states do not fit this run ({err})") from err
        if config.steps != int(ckpt["config"]["steps"]) and config.lr_schedule == "cosine" and ddp.is_main:
            log.warning(
                "resuming with steps=%d instead of %d: the cosine schedule is stretched to the new total from "
                "step %d on, so the result differs from a run started with steps=%d",
                config.steps,
                int(ckpt["config"]["steps"]),
                int(ckpt["step"]),
                config.steps,
            )
        # The schedule may have been extended (more steps): take the lr from the new schedule.
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * lr_lambda(scheduler.last_epoch)
        generator.set_state(ckpt["generators"][ddp.rank].clone())
        torch.set_rng_state(ckpt["torch_rng"])
        random.setstate(ckpt["python_rng"])
        if device.type == "cuda" and ckpt.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ckpt["cuda_rng"], device)
        step = int(ckpt["step"])
        examples_seen = int(ckpt["examples_seen"])
        training_seconds = float(ckpt["training_seconds"])
        skipped = int(ckpt.get("skipped_steps", 0))
        history = [dict(h) for h in ckpt["history"]]
        resumed_loss = float(ckpt.get("last_loss", float("nan")))
        if "window" in ckpt:
            resumed_window = (float(ckpt["window"]["losses"][ddp.rank]), int(ckpt["window"]["steps"]))
        log.info("resumed %s at step %d from %s", config.motif, step, ckpt_path)
    if ddp.is_main:
        for stale in remove_stale_temporaries([p for k, p in config.output_paths().items() if k != "logdir"]):
            log.info("removed %s, a temporary file left by an interrupted run", stale)
    if not config.resume and ckpt_path is not None and ckpt_path.exists() and ddp.is_main:
        log.warning(
            "starting fresh: the existing checkpoint %s will be overwritten (pass resume to continue)", ckpt_path
        )

    model: nn.Module = objective
    if ddp.active:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(objective, device_ids=ids)

    # Held-out instantiations, generated once from their own generator (rank 0 only), and
    # isolated from the global RNG so that validation can never perturb the training stream.
    val_batch = None
    if ddp.is_main and config.val_size > 0:
        val_gen = torch.Generator().manual_seed((config.seed ^ _VAL_SEED_SALT) & 0x7FFF_FFFF_FFFF_FFFF)
        with torch.random.fork_rng(devices=[]):
            val_batch = motif.sample_training_batch(config.val_size, val_gen)

    writer = None
    if ddp.is_main and config.logdir is not None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run drops the events an interrupted run wrote after its checkpoint (steps > step)
        writer = SummaryWriter(config.logdir, purge_step=step + 1 if config.resume else None)
        if not config.resume:
            writer.add_text("config", "\n".join(f"    {k}: {v!r}" for k, v in config_dict.items()), 0)

    def validate(at_step: int) -> dict[str, float]:
        if val_batch is None:
            return {}
        net = proposal.mdn if device.type == "cpu" else copy.deepcopy(proposal.mdn).cpu()
        metrics = evaluate(net, val_batch, spec, config.val_mc_samples, seed=config.seed + at_step)
        record = {"step": float(at_step), **{f"val/{k}": v for k, v in metrics.items()}}
        history.append(record)
        if writer is not None:
            for key, value in metrics.items():
                writer.add_scalar(f"val/{key}", value, at_step)
        return metrics

    def save_checkpoint(at_step: int) -> None:
        state = (generator.get_state(), window_loss)
        if ddp.active:
            states: list[Any] = [None] * ddp.world_size
            dist.all_gather_object(states, state)
        else:
            states = [state]
        if not ddp.is_main or ckpt_path is None:
            return
        ckpt = {
            "format": CHECKPOINT_FORMAT,
            "step": at_step,
            "config": config_dict,
            "model": proposal.mdn.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "generators": torch.stack([s.cpu() for s, _ in states]),
            "window": {"losses": [w for _, w in states], "steps": window_steps},
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "python_rng": random.getstate(),
            "examples_seen": examples_seen,
            "training_seconds": training_seconds + (time.perf_counter() - run_start),
            "skipped_steps": skipped,
            "world_size": ddp.world_size,
            "history": history,
            "last_loss": last_loss,
        }
        buffer = io.BytesIO()
        torch.save(ckpt, buffer)
        atomic_write_bytes(ckpt_path, buffer.getvalue())

    progress = None
    if ddp.is_main and config.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=config.steps, initial=step, desc=f"train {config.motif}", dynamic_ncols=True)

    run_start = time.perf_counter()
    if step == 0 and not config.resume:
        validate(0)
    last_loss = resumed_loss
    (window_loss, window_steps), window_start, window_val = resumed_window, time.perf_counter(), 0.0
    timed_steps = 0  # steps since window_start (a resumed window's earlier steps ran in another process)
    params = [p for p in proposal.mdn.parameters()]
    max_norm = config.grad_clip if config.grad_clip > 0 else float("inf")
    dtype = next(proposal.mdn.parameters()).dtype
    end = config.steps if stop_after is None else min(config.steps, max(stop_after, step))

    proposal.train()
    while step < end:
        batch = motif.sample_training_batch(config.batch_size, generator)
        features = batch.features.to(device=device, dtype=dtype)
        block = batch.block.to(device=device, dtype=dtype)
        log_p = None if batch.log_p is None else batch.log_p.to(device=device, dtype=dtype)
        loss = model(features, block, log_p)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
        else:  # identical on every rank: gradients are all-reduced before the norm
            skipped += 1
        scheduler.step()
        step += 1
        examples_seen += config.batch_size * ddp.world_size
        window_loss += float(loss.detach())
        window_steps += 1
        timed_steps += 1
        if progress is not None:
            progress.update(1)

        if step % config.log_every == 0 or step == config.steps:  # not at stop_after: a resume continues the window
            mean_loss = torch.tensor(window_loss / window_steps, dtype=torch.float64, device=device)
            if ddp.active:
                dist.all_reduce(mean_loss)
                mean_loss /= ddp.world_size
            last_loss = float(mean_loss)
            elapsed = max(time.perf_counter() - window_start - window_val, 1e-9)
            if writer is not None:
                writer.add_scalar("train/loss", last_loss, step)
                writer.add_scalar("lr", optimizer.param_groups[0]["lr"], step)
                writer.add_scalar("grad_norm", float(grad_norm), step)
                rate = timed_steps * config.batch_size * ddp.world_size / elapsed
                writer.add_scalar("examples_per_second", rate, step)
            if progress is not None:
                progress.set_postfix(_postfix(last_loss, history), refresh=False)
            window_loss, window_steps, window_start, window_val = 0.0, 0, time.perf_counter(), 0.0
            timed_steps = 0

        if ddp.is_main and ((config.val_every and step % config.val_every == 0) or step == config.steps):
            val_start = time.perf_counter()
            validate(step)
            window_val += time.perf_counter() - val_start
            if progress is not None:
                progress.set_postfix(_postfix(last_loss, history), refresh=False)
        if (config.checkpoint_every and step % config.checkpoint_every == 0) or step == end:
            save_checkpoint(step)

    training_seconds += time.perf_counter() - run_start
    if progress is not None:
        progress.close()
    if writer is not None:
        writer.flush()
        writer.close()
    proposal.eval()

    metrics: dict[str, Any] = {
        "train/loss": last_loss,
        "steps": step,
        "examples_seen": examples_seen,
        "training_seconds": training_seconds,
        "skipped_steps": skipped,
        "world_size": ddp.world_size,
        "device": str(device),
        "history": history,
    }
    if history:
        metrics.update({k: v for k, v in history[-1].items() if k != "step"})
    finished = step >= config.steps
    metrics["finished"] = finished
    if finished and ddp.is_main:
        proposal.metadata = {
            "training_config": config_dict,
            "steps": step,
            "training_seconds": training_seconds,
            "examples_seen": examples_seen,
            "validation": {k.removeprefix("val/"): v for k, v in history[-1].items() if k != "step"} if history else {},
            "final_train_loss": last_loss if math.isfinite(last_loss) else None,
            "validation_history": history,
            "skipped_steps": skipped,
            "device": str(device),
            "world_size": ddp.world_size,
            "torch_version": torch.__version__,
            "commit": code_commit(),
        }
        if config.out is not None:
            proposal.save(config.out)
    if ddp.active:
        dist.barrier()
    return proposal, metrics


def _postfix(loss: float, history: list[dict[str, float]]) -> dict[str, str]:
    post = {"loss": f"{loss:.4f}"}
    if history:
        last = history[-1]
        if "val/kl" in last:
            post["val_kl"] = f"{last['val/kl']:.4f}"
        if "val/acceptance" in last:
            post["acc"] = f"{last['val/acceptance']:.3f}"
    return post
