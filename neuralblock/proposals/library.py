"""The shipped proposal library in ``pretrained/`` (indexed by ``pretrained/index.json``).

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

from neuralblock.proposals.proposal import NeuralBlockProposal

__all__ = ["list_pretrained", "load_pretrained", "load_proposal", "pretrained_dir", "pretrained_index"]


def pretrained_dir() -> Path:
    """Folder of the installed ``pretrained`` data package."""
    spec = importlib.util.find_spec("pretrained")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'pretrained' proposal library is not installed with neuralblock")
    return Path(next(iter(spec.submodule_search_locations)))


def pretrained_index() -> dict[str, dict[str, Any]]:
    """Name -> entry (file, motif, metrics) of every shipped proposal."""
    index_path = pretrained_dir() / "index.json"
    if not index_path.exists():
        return {}
    try:
        index = json.loads(index_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{index_path} is not valid JSON: {err}") from err
    return index.get("proposals", {})


def list_pretrained() -> list[str]:
    """Names of the shipped proposals."""
    return sorted(pretrained_index())


def load_pretrained(name: str) -> NeuralBlockProposal:
    """Load a shipped proposal by name (see :func:`list_pretrained`).

    Raises:
        ValueError: an unknown name (the message lists the shipped ones) or a bad file.
    """
    index = pretrained_index()
    if name not in index:
        raise ValueError(f"no pretrained proposal {name!r}; shipped: {', '.join(sorted(index)) or '(none)'}")
    return NeuralBlockProposal.load(pretrained_dir() / index[name]["file"])


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
