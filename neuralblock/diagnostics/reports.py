"""Small helpers every study in ``experiments/`` shares: output folders, JSON records, tables.

A study writes its outputs into a folder named by a hash of its configuration, so two runs
with different settings never overwrite each other and a committed result names the
configuration that produced it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuralblock.proposals import atomic_write_bytes

__all__ = ["config_hash", "format_cell", "markdown_table", "study_folder", "write_json", "write_report"]


def config_hash(config: Mapping[str, Any], length: int = 10) -> str:
    """Stable short hash of a JSON-serialisable configuration.

    Args:
        config: the study's settings (keys are sorted before hashing).
        length: number of hex digits kept.

    Returns:
        The first ``length`` hex digits of the SHA-256 of the canonical JSON.

    Example:
        >>> config_hash({"seed": 0, "quick": True}) == config_hash({"quick": True, "seed": 0})
        True
    """
    text = json.dumps(dict(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def study_folder(out: str | Path, config: Mapping[str, Any]) -> Path:
    """Create and return ``out/<config_hash(config)>``.

    Example:
        >>> import tempfile
        >>> folder = study_folder(tempfile.mkdtemp(), {"seed": 0})
        >>> folder.is_dir() and len(folder.name) == 10
        True
    """
    folder = Path(out) / config_hash(config)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_json(path: str | Path, record: Any) -> None:
    """Write ``record`` as indented JSON, atomically (a crash never leaves a torn file).

    Non-finite floats are written as ``null`` so that the file is standard JSON.

    Example:
        >>> import json, tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "r.json"
        >>> write_json(path, {"a": float("nan"), "b": [1.0]})
        >>> json.loads(path.read_text())
        {'a': None, 'b': [1.0]}
    """
    text = json.dumps(_finite(record), indent=1, sort_keys=False, default=str)
    atomic_write_bytes(Path(path), (text + "\n").encode())


def write_report(folder: str | Path, name: str, text: str) -> None:
    """Write a study's markdown report ``folder/name``, then print it and the folder.

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> write_report(folder, "r.md", "# r")  # doctest: +ELLIPSIS
        # r
        wrote ...
        >>> (folder / "r.md").read_text()
        '# r'
    """
    (Path(folder) / name).write_text(text)
    print(text)
    print(f"wrote {folder}")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def format_cell(value: Any, spec: str = ".4g") -> str:
    """Format one table cell: floats with ``spec``, ``None``/NaN as an em dash.

    Example:
        >>> format_cell(0.123456), format_cell(None), format_cell("NUTS")
        ('0.1235', '—', 'NUTS')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], spec: str = ".4g") -> str:
    """A GitHub markdown table of ``rows`` restricted to ``columns`` (missing cells: em dash).

    Example:
        >>> print(markdown_table([{"method": "MH", "time": 1.5}], ["method", "time"]))
        | method | time |
        |---|---|
        | MH | 1.5 |
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(c), spec) for c in columns) + " |")
    return "\n".join(lines)
