"""Register trained proposals in a library index: the shipped ``pretrained/index.json`` or a user library's.

Example:
    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "coin.json").write_text(json.dumps({"motif": {"name": "coin"}, "metadata": {}}))
    >>> entry = register_proposal(folder / "coin", "coin", index_path=folder / "index.json")
    >>> json.loads((folder / "index.json").read_text())["proposals"]["coin"]["file"]
    'coin'
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

from neuralblock.proposals import atomic_write_bytes, proposal_files
from neuralblock.proposals.library import read_library_index, user_library_dir

__all__ = ["DEFAULT_INDEX", "library_folder", "register_proposal"]

DEFAULT_INDEX = Path(__file__).resolve().parents[1] / "pretrained" / "index.json"


def library_folder(option: str | Path | None = None) -> Path:
    """The library ``--register`` writes to: ``option``, else ``NEURALBLOCK_LIBRARY``, else the shipped ``pretrained/``.

    Example:
        >>> library_folder("/tmp/my-proposals")
        PosixPath('/tmp/my-proposals')
    """
    if option is not None and str(option).strip():
        return Path(option).expanduser()
    user = user_library_dir()
    return user if user is not None else DEFAULT_INDEX.parent


def register_proposal(stem: str | Path, name: str, index_path: str | Path = DEFAULT_INDEX) -> dict[str, Any]:
    """Add (or replace) the entry ``name`` for the proposal at ``stem`` in the index.

    The entry records the file stem relative to the index folder, the motif spec and
    the validation metrics and training time from the proposal's sidecar.

    Raises:
        ValueError: the sidecar is missing or unreadable, or the proposal lies outside the index folder.
    """
    stem, index_path = Path(stem), Path(index_path)
    _, sidecar = proposal_files(stem)
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read proposal sidecar {sidecar}: {err}") from err
    try:
        relative = stem.resolve().relative_to(index_path.parent.resolve())
    except ValueError as err:
        raise ValueError(f"proposal {stem} is not inside the library folder {index_path.parent}") from err
    metadata = meta.get("metadata", {})
    entry = {
        "file": relative.as_posix(),
        "motif": meta.get("motif"),
        "metrics": metadata.get("validation", {}),
        "training_seconds": metadata.get("training_seconds"),
        "steps": metadata.get("steps"),
    }
    index_path.parent.mkdir(parents=True, exist_ok=True)
    with open(index_path.with_suffix(".lock"), "w") as lock:  # serialize concurrent registrations
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = {"format_version": 1, "proposals": read_library_index(index_path)}
        index["proposals"][name] = entry
        index["proposals"] = dict(sorted(index["proposals"].items()))
        atomic_write_bytes(index_path, (json.dumps(index, indent=2) + "\n").encode())
    return entry
