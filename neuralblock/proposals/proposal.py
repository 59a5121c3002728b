"""Neural block proposals and their files (safetensors weights + JSON sidecar).

A proposal file ``NAME.safetensors`` holds only tensors; its sidecar ``NAME.json``
holds the format version, the motif spec, the network hyper-parameters, the
training config and validation metrics, the code commit and the SHA-256 of the
weights. Loading checks all of it against the motif and the network, so a file
for another motif, a truncated file or a tampered sidecar fails with a clear
``ValueError``. Nothing a user loads is executed.

Example:
    >>> import tempfile, pathlib, torch
    >>> from neuralblock.motif import BlockSpec, Motif
    >>> class Coin(Motif):
    ...     name = "coin"
    ...     block_spec = BlockSpec([2])
    ...     feature_dim = 1
    ...     def options(self): return {}
    ...     def find_instances(self, fg): raise NotImplementedError
    ...     def encode(self, fg, instances, state): raise NotImplementedError
    ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
    >>> proposal = NeuralBlockProposal(Coin(), components=2, hidden=(8,))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "coin"
    >>> proposal.save(path)
    >>> loaded = NeuralBlockProposal.load(path, motif=Coin())
    >>> x = torch.tensor([[1.0]])
    >>> bool(torch.equal(loaded(torch.zeros(1, 1)).log_prob(x), proposal(torch.zeros(1, 1)).log_prob(x)))
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import Tensor, nn

from neuralblock._files import atomic_write_bytes, read_bounded
from neuralblock.motif import Motif, get_motif
from neuralblock.proposals.mdn import BlockMixture, MixtureDensityNetwork

__all__ = [
    "FORMAT_VERSION",
    "NeuralBlockProposal",
    "atomic_write_bytes",
    "code_commit",
    "load_checked_safetensors",
    "proposal_files",
]

FORMAT_VERSION = 1
MAX_WEIGHTS_BYTES = 1 << 30
"""Largest weights file :meth:`NeuralBlockProposal.load` reads (1 GiB; refused from its size, before reading)."""
MAX_SIDECAR_BYTES = 16 << 20
"""Largest sidecar file read (16 MiB)."""
MAX_COMPONENTS = 4096
"""Most mixture components a sidecar may declare."""
MAX_WIDTH = 1 << 16
"""Widest hidden layer a sidecar may declare."""
MAX_LAYERS = 64
"""Most hidden layers a sidecar may declare."""
MAX_JSON_INT_DIGITS = 100
"""Longest integer accepted in a sidecar (Python's own limit, 4300 digits, gives an unclear error)."""


def load_checked_safetensors(path: Path, sha256: object) -> dict[str, Tensor]:
    """Read a safetensors file whose SHA-256 must equal ``sha256`` (from its sidecar).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: not a regular file or larger than :data:`MAX_WEIGHTS_BYTES` (refused before
            reading), the digest differs (truncated, corrupted or replaced file) or the bytes
            are not a valid safetensors file. The messages name the file.
    """
    blob = read_bounded(path, MAX_WEIGHTS_BYTES, "weights file")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"weights {path.name} do not match their sidecar (sha256 {digest[:12]}... != {str(sha256)[:12]}...): "
            "the file is truncated, corrupted or was replaced"
        )
    try:
        return load_safetensors(blob)
    except (SafetensorError, ValueError) as err:
        raise ValueError(f"weights {path.name} are not a valid safetensors file: {err}") from err


def code_commit() -> str:
    """The git commit of the code, or ``"unknown"`` outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def proposal_files(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, sidecar)`` paths of a proposal: ``path`` (any other dots kept) plus each suffix.

    Example:
        >>> [p.name for p in proposal_files("runs/grid-v1.0")]
        ['grid-v1.0.safetensors', 'grid-v1.0.json']
    """
    base = Path(path)
    if base.suffix in {".safetensors", ".json"}:
        base = base.with_suffix("")
    return base.with_name(base.name + ".safetensors"), base.with_name(base.name + ".json")


def _not_a_folder(path: str | os.PathLike) -> None:
    """Refuse a folder where a proposal's path is read (the message lists the proposals in it).

    Raises:
        FileNotFoundError: ``path`` is a folder.
    """
    base = Path(path)
    if base.is_dir() and not proposal_files(base)[1].exists():  # a folder, and no files of that stem beside it
        stems = sorted({p.stem for p in base.glob("*.safetensors")})[:5]
        raise FileNotFoundError(
            f"{base} is a folder; give a proposal's path without suffix (folder/name for folder/name.safetensors "
            f"and folder/name.json){'; it holds ' + ', '.join(stems) if stems else ''}"
        )


def _json_int(text: str) -> int:
    """``parse_int`` for sidecars: refuse integers longer than :data:`MAX_JSON_INT_DIGITS` digits."""
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_JSON_INT_DIGITS} are accepted)")
    return int(text)


def _short_repr(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_sidecar_fields(meta: dict[str, Any], path: Path) -> None:
    """Types of the sidecar fields a load reads (the structure check of :meth:`NeuralBlockProposal.read_sidecar`)."""
    motif, net = meta["motif"], meta["network"]
    problems = []
    if not isinstance(motif, dict) or not isinstance(motif.get("name"), str):
        problems.append("'motif' must be an object with a string 'name'")
    elif not isinstance(motif.get("options", {}), dict):
        problems.append("'motif.options' must be an object")
    if not isinstance(net, dict):
        problems.append("'network' must be an object")
    else:
        components, hidden = net.get("components"), net.get("hidden")
        if not _positive_int(components) or components > MAX_COMPONENTS:
            problems.append(
                f"'network.components' must be an integer in 1..{MAX_COMPONENTS}, got {_short_repr(components)}"
            )
        if (
            not isinstance(hidden, list)
            or len(hidden) > MAX_LAYERS
            or not all(_positive_int(h) and h <= MAX_WIDTH for h in hidden)
        ):
            problems.append(
                f"'network.hidden' must be a list of at most {MAX_LAYERS} integers in 1..{MAX_WIDTH}, "
                f"got {_short_repr(hidden)}"
            )
        if net.get("type", "MixtureDensityNetwork") != "MixtureDensityNetwork":
            problems.append(f"'network.type' must be 'MixtureDensityNetwork', got {net.get('type')!r}")
    if not isinstance(meta.get("metadata", {}), dict):
        problems.append("'metadata' must be an object")
    if not isinstance(meta["weights_sha256"], str):
        problems.append("'weights_sha256' must be a string")
    if problems:
        raise ValueError(f"proposal sidecar {path} is malformed: " + "; ".join(problems))


class NeuralBlockProposal(nn.Module):
    """A motif plus the MDN that proposes its block given ``(C, Psi)``.

    Args:
        motif: the motif whose block this proposal covers.
        components: MDN mixture components.
        hidden: MDN hidden widths.
        metadata: training config, metrics and the like, stored in the sidecar.

    ``forward(features)`` returns the proposal distribution (a :class:`BlockMixture`).
    """

    def __init__(
        self,
        motif: Motif,
        components: int = 8,
        hidden: Sequence[int] = (128, 128),
        metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(motif, Motif):
            raise TypeError(f"motif must be a neuralblock Motif, got {type(motif).__name__}")
        self.motif = motif
        spec = motif.block_spec
        self.mdn = MixtureDensityNetwork(
            motif.feature_dim, spec.cardinalities, components, hidden, spec.scale_groups, motif.set_encoder
        )
        self.metadata: dict[str, Any] = dict(metadata or {})

    @property
    def dtype(self) -> torch.dtype:
        """The network's floating-point dtype (features are cast to it)."""
        return next(self.mdn.parameters()).dtype

    def forward(self, features: Tensor) -> BlockMixture:
        """Proposal distribution for encoded contexts ``[..., feature_dim]``."""
        return self.mdn(features)

    # ------------------------------------------------------------------ files
    def sidecar(self, weights_sha256: str) -> dict[str, Any]:
        """The JSON sidecar describing this proposal."""
        return {
            "format_version": FORMAT_VERSION,
            "motif": self.motif.spec(),
            "network": {"type": "MixtureDensityNetwork", **self.mdn.config()},
            "metadata": self.metadata,
            "commit": self.metadata.get("commit", code_commit()),
            "weights_sha256": weights_sha256,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write ``path.safetensors`` and ``path.json`` (each atomically)."""
        weights_path, sidecar_path = proposal_files(path)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.mdn.state_dict().items()}
        blob = save_safetensors(tensors, metadata={"format_version": str(FORMAT_VERSION)})
        digest = hashlib.sha256(blob).hexdigest()
        atomic_write_bytes(weights_path, blob)
        atomic_write_bytes(sidecar_path, json.dumps(self.sidecar(digest), indent=2).encode())

    @classmethod
    def read_sidecar(cls, path: str | os.PathLike) -> dict[str, Any]:
        """Parse and check the structure of a sidecar file."""
        _not_a_folder(path)
        _, sidecar_path = proposal_files(path)
        data = read_bounded(sidecar_path, MAX_SIDECAR_BYTES, "proposal sidecar")
        try:
            meta = json.loads(data.decode("utf-8"), parse_int=_json_int)
        except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, _json_int
            raise ValueError(f"proposal sidecar {sidecar_path} is not valid JSON: {err}") from err
        required = {"format_version", "motif", "network", "weights_sha256"}
        if not isinstance(meta, dict) or not required <= set(meta):
            present = set(meta) if isinstance(meta, dict) else set()
            raise ValueError(f"proposal sidecar {sidecar_path} lacks fields {sorted(required - present)}")
        version = meta["format_version"]
        if not _positive_int(version):
            raise ValueError(
                f"proposal sidecar {sidecar_path} has format_version {_short_repr(version)} "
                f"({type(version).__name__}); expected the integer {FORMAT_VERSION}"
            )
        if version != FORMAT_VERSION:
            writer = "a newer" if version > FORMAT_VERSION else "an older"
            raise ValueError(
                f"proposal sidecar {sidecar_path} has format version {version}; this neuralblock reads "
                f"version {FORMAT_VERSION} only (the file was written by {writer} neuralblock)"
            )
        _check_sidecar_fields(meta, sidecar_path)
        return meta

    @classmethod
    def load(
        cls, path: str | os.PathLike, motif: Motif | None = None, device: str | torch.device | None = None
    ) -> NeuralBlockProposal:
        """Load a proposal file, checking it against ``motif`` (default: the motif its sidecar names).

        ``device`` places the network's weights (default: the CPU); kernels given a ``device=``
        move their proposals there too.

        Raises:
            ValueError: mismatched motif or network, truncated or tampered files, or a path that
                is not a regular file of bounded size (a directory, ``/dev/zero``, over
                :data:`MAX_WEIGHTS_BYTES` or :data:`MAX_SIDECAR_BYTES`), refused before reading.
            FileNotFoundError: missing weights or sidecar.
            TypeError: ``motif`` is not a :class:`Motif` (e.g. a motif name).
        """
        if motif is not None and not isinstance(motif, Motif):
            hint = f"; build it with motifs.get({motif!r}, ...)" if isinstance(motif, str) else ""
            raise TypeError(f"motif must be a neuralblock Motif or None, got {type(motif).__name__}{hint}")
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        weights_path, sidecar_path = proposal_files(path)
        meta = cls.read_sidecar(path)
        spec = meta["motif"]
        if motif is None:
            try:
                motif = get_motif(spec["name"], **spec.get("options", {}))
            except Exception as err:  # noqa: BLE001 - a motif's own checks of options read from the file
                raise ValueError(
                    f"proposal sidecar {sidecar_path} names a motif that cannot be built ({_short_repr(spec, 80)}): "
                    f"{type(err).__name__}: {err}"
                ) from err
        if motif.spec() != spec:
            raise ValueError(f"proposal {sidecar_path.name} was trained for motif {spec} but was given {motif.spec()}")
        net = meta["network"]
        if (
            net.get("in_features") != motif.feature_dim
            or net.get("block_cardinalities") != list(motif.block_spec.cardinalities)
            or net.get("scale_groups") != motif.block_spec.scale_groups
            or net.get("set_encoder") != motif.set_encoder
        ):
            raise ValueError(f"proposal {sidecar_path.name}: network shape {net} does not match motif {motif.spec()}")
        tensors = load_checked_safetensors(weights_path, meta["weights_sha256"])
        options = {"components": net["components"], "hidden": net["hidden"], "metadata": meta.get("metadata")}
        try:
            with torch.device("meta"):  # the sidecar's shapes, checked before any memory is allocated
                expected = {k: tuple(v.shape) for k, v in cls(motif, **options).mdn.state_dict().items()}
        except (RuntimeError, TypeError, ValueError, OverflowError) as err:
            raise ValueError(
                f"proposal sidecar {sidecar_path} describes a network that cannot be built: {err}"
            ) from err
        found = {k: tuple(v.shape) for k, v in tensors.items()}
        if expected != found:
            raise ValueError(f"proposal weights {weights_path.name} have tensors {found}, expected {expected}")
        kinds = sorted({str(v.dtype) for v in tensors.values() if v.dtype not in (torch.float32, torch.float64)})
        if kinds:
            raise ValueError(f"proposal weights {weights_path.name} hold {kinds} tensors; expected float32 or float64")
        broken = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
        if broken:
            raise ValueError(f"proposal weights {weights_path.name} hold NaN or inf values in {broken}")
        proposal = cls(motif, **options)
        proposal.mdn.load_state_dict(tensors)
        proposal.eval()
        return proposal if device is None else proposal.to(torch.device(device))

    def __repr__(self) -> str:
        return f"NeuralBlockProposal({self.motif!r}, components={self.mdn.components}, hidden={self.mdn.hidden})"
