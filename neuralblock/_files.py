"""File helpers shared across the package (kept free of package imports)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "read_bounded"]


def read_bounded(path: Path, limit: int, what: str = "file") -> bytes:
    """Read a regular file of at most ``limit`` bytes, refusing anything else before reading it.

    Symbolic links are followed; a directory, a device (``/dev/zero``), a pipe or a socket is
    refused from its ``stat``, a file over the limit from its size (and again if it grows
    while being read), so nothing is read without bound.

    Args:
        path: the file.
        limit: most bytes accepted.
        what: what the file is, for the messages (e.g. ``"proposal sidecar"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a regular file, larger than ``limit``, or unreadable (naming the path).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "a.json").write_bytes(b"{}")
        >>> read_bounded(folder / "a.json", 10)
        b'{}'
        >>> read_bounded(folder, 10)
        Traceback (most recent call last):
        ...
        ValueError: file ... is a directory, expected a file
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} not found") from None
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{what} {path} is a directory, expected a file")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{what} {path} is not a regular file (a device, pipe or socket); refusing to read it")
    if info.st_size > limit:
        raise ValueError(f"{what} {path} has {info.st_size} bytes, more than the limit of {limit}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    if len(data) > limit:
        raise ValueError(f"{what} {path} grew past the limit of {limit} bytes while being read")
    return data


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder + rename).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "sub" / "note.txt"
        >>> atomic_write_bytes(target, b"hello")
        >>> target.read_bytes()
        b'hello'
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
