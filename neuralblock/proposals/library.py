"""The proposal libraries: the shipped one in ``pretrained/`` and an optional user library.

Each library is a folder with an ``index.json`` (``{"proposals": {name: {"file": stem, ...}}}``)
and the proposal files it names. The shipped library comes with the package; a user library
is any folder named by the environment variable ``NEURALBLOCK_LIBRARY`` (``train-motif
--register NAME`` writes there when it is set, or into ``--library DIR``).
:func:`list_pretrained` and :func:`load_pretrained` search the shipped library first, then
the user library (a user name that a shipped proposal already has is shadowed by it).

Example:
    >>> names = list_pretrained()
    >>> isinstance(names, list)
    True
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from neuralblock._files import read_bounded
from neuralblock.proposals.proposal import NeuralBlockProposal

__all__ = [
    "LIBRARY_ENV",
    "list_pretrained",
    "load_pretrained",
    "load_proposal",
    "pretrained_dir",
    "pretrained_index",
    "read_library_index",
    "user_library_dir",
]

LIBRARY_ENV = "NEURALBLOCK_LIBRARY"
"""Environment variable naming the user library folder."""
MAX_INDEX_BYTES = 16 << 20


def pretrained_dir() -> Path:
    """Folder of the installed ``pretrained`` data package."""
    spec = importlib.util.find_spec("pretrained")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'pretrained' proposal library is not installed with neuralblock")
    return Path(next(iter(spec.submodule_search_locations)))


def user_library_dir() -> Path | None:
    """The user library folder named by ``NEURALBLOCK_LIBRARY`` (``None`` when unset or empty)."""
    text = os.environ.get(LIBRARY_ENV, "").strip()
    return Path(text).expanduser() if text else None


def read_library_index(folder: Path) -> dict[str, dict[str, Any]]:
    """Name -> entry of the library in ``folder`` (empty when it has no ``index.json``).

    Args:
        folder: the library folder, or its index file itself (a path ending in ``.json``).

    Raises:
        ValueError: an index that is not a bounded regular file of valid JSON with a ``proposals`` object.
    """
    folder = Path(folder)
    index_path = folder if folder.suffix == ".json" else folder / "index.json"
    if not index_path.exists():
        return {}
    try:
        index = json.loads(read_bounded(index_path, MAX_INDEX_BYTES, "library index").decode("utf-8"))
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{index_path} is not a valid library index: {err}") from err
    proposals = index.get("proposals", {}) if isinstance(index, dict) else None
    if not isinstance(proposals, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("file"), str) for e in proposals.values()
    ):
        expected = "{'proposals': {name: {'file': stem, ...}}}"
        raise ValueError(f"{index_path} is not a valid library index: expected {expected}")
    return proposals


def _libraries() -> list[Path]:
    folders = [pretrained_dir()]
    user = user_library_dir()
    if user is not None and user.resolve() != folders[0].resolve():
        folders.append(user)
    return folders


def _find(name: str) -> tuple[Path, dict[str, Any]] | None:
    for folder in _libraries():
        entry = read_library_index(folder).get(name)
        if entry is not None:
            return folder, entry
    return None


def pretrained_index() -> dict[str, dict[str, Any]]:
    """Name -> entry (file, motif, metrics) of every proposal: the shipped ones, then the user library's."""
    merged: dict[str, dict[str, Any]] = {}
    for folder in _libraries():
        for name, entry in read_library_index(folder).items():
            merged.setdefault(name, entry)
    return merged


def list_pretrained() -> list[str]:
    """Names of the shipped proposals and of those in the user library (``NEURALBLOCK_LIBRARY``)."""
    return sorted(pretrained_index())


def load_pretrained(name: str, device: str | torch.device | None = None) -> NeuralBlockProposal:
    """Load a proposal by name from the shipped library, else from the user library (see :func:`list_pretrained`).

    ``device`` places the network's weights (default: the CPU).

    Raises:
        ValueError: an unknown name (the message lists the known ones) or a bad file.
    """
    found = _find(name)
    if found is None:
        known = ", ".join(list_pretrained()) or "(none)"
        user = user_library_dir()
        hint = ""
        if user is not None and not user.is_dir():  # a mistyped NEURALBLOCK_LIBRARY would otherwise go unnoticed
            hint = f"; {LIBRARY_ENV}={str(user)!r} is not a folder"
        raise ValueError(f"no pretrained proposal {name!r}; known: {known}{hint}")
    folder, entry = found
    return NeuralBlockProposal.load(folder / entry["file"], device=device)


def load_proposal(
    name_or_path: str | os.PathLike,
    untrained: Callable[[], NeuralBlockProposal] | None = None,
) -> NeuralBlockProposal:
    """A shipped proposal by name, or a proposal file by path (anything with a suffix or a ``/``).

    Args:
        name_or_path: a name from :func:`list_pretrained` or a proposal file's path.
        untrained: optional factory of a fallback proposal, used (instead of raising) when
            nothing loads, e.g. an untrained network for a CI-scale smoke run.

    Raises:
        ValueError, FileNotFoundError: nothing loads and there is no fallback.

    Example:
        >>> load_proposal("no-such-proposal", untrained=lambda: "fallback")
        'fallback'
    """
    text = str(name_or_path)
    try:
        if Path(text).suffix or "/" in text:
            return NeuralBlockProposal.load(text)
        return load_pretrained(text)
    except (FileNotFoundError, KeyError, ValueError):
        if untrained is None:
            raise
        return untrained()
