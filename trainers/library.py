"""Register trained proposals in the shipped library index (``pretrained/index.json``).

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

__all__ = ["DEFAULT_INDEX", "register_proposal"]

DEFAULT_INDEX = Path(__file__).resolve().parents[1] / "pretrained" / "index.json"


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
        index = json.loads(index_path.read_text()) if index_path.exists() else {"format_version": 1, "proposals": {}}
        index.setdefault("proposals", {})[name] = entry
        index["proposals"] = dict(sorted(index["proposals"].items()))
        atomic_write_bytes(index_path, (json.dumps(index, indent=2) + "\n").encode())
    return entry
