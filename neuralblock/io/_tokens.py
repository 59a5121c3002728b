"""A whitespace tokenizer that remembers line numbers, for precise parse errors.

Every reader in :mod:`neuralblock.io` parses a whole file at once through
:class:`Tokens`: the text is split into tokens (``/* ... */`` comments on one line
are single tokens), each with its 1-based line number, and every failure raises a
``ValueError`` of the form ``"<file> line <n>: <what went wrong>"``.
"""

from __future__ import annotations

import gzip
import math
import os
import re
import zlib
from collections import Counter
from pathlib import Path

__all__ = ["PathLike", "Tokens", "read_text"]

PathLike = str | os.PathLike[str]

_TOKEN = re.compile(r"/\*.*?\*/|\S+")
_GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: PathLike) -> tuple[str, str]:
    """Read a text file, gunzipping it when it starts with the gzip magic bytes.

    Returns:
        ``(text, display_name)``; the display name is the file name used in errors.
    """
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path.name}: corrupt gzip data ({err})") from None
    return data.decode("utf-8", errors="replace"), path.name


class Tokens:
    """Tokens of one file with their line numbers and a read cursor.

    Args:
        text: the file contents.
        source: the name used in error messages (usually the file name).
    """

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.tokens: list[str] = []
        self.lines: list[int] = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            found = _TOKEN.findall(line)
            self.tokens.extend(found)
            self.lines.extend([lineno] * len(found))
        self.line_counts = Counter(self.lines)
        self.last_line = max(text.count("\n") + (0 if text.endswith("\n") else 1), 1)
        self.pos = 0

    # ------------------------------------------------------------------ errors
    def error(self, message: str, line: int | None = None) -> ValueError:
        """A ``ValueError`` naming the file and line (default: the current token's line)."""
        if line is None:
            line = self.lines[self.pos] if self.pos < len(self.tokens) else self.last_line
        return ValueError(f"{self.source} line {line}: {message}")

    # ------------------------------------------------------------------ cursor
    @property
    def remaining(self) -> int:
        """Number of unread tokens."""
        return len(self.tokens) - self.pos

    def at_end(self) -> bool:
        """Whether every token has been read."""
        return self.pos >= len(self.tokens)

    def peek(self) -> str | None:
        """The next token without consuming it (``None`` at the end)."""
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def line(self) -> int:
        """Line of the next token (the last line at the end of the file)."""
        return self.lines[self.pos] if self.pos < len(self.tokens) else self.last_line

    def next(self, what: str) -> str:
        """Consume one token; ``what`` describes it for the end-of-file error."""
        if self.pos >= len(self.tokens):
            raise self.error(f"unexpected end of file, expected {what}")
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def integer(self, what: str, low: int | None = None, high: int | None = None) -> int:
        """Consume an integer token in ``[low, high]`` (inclusive bounds, ``None`` = open)."""
        line = self.line()
        token = self.next(what)
        try:
            value = int(token)
        except ValueError:
            raise self.error(f"expected an integer for {what}, got {token!r}", line) from None
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"{'-inf' if low is None else low}..{'inf' if high is None else high}"
            raise self.error(f"{what} is {value}, out of range {bounds}", line)
        return value

    def number(self, what: str) -> float:
        """Consume a finite floating-point token."""
        line = self.line()
        token = self.next(what)
        try:
            value = float(token)
        except ValueError:
            raise self.error(f"expected a number for {what}, got {token!r}", line) from None
        if not math.isfinite(value):
            raise self.error(f"{what} must be finite, got {token!r}", line)
        return value

    def table(self, count: int, what: str, nonnegative: bool = True, line: int | None = None) -> list[float]:
        """Consume ``count`` finite numbers (non-negative by default): the entries of one table.

        A missing entry (end of file, or a ``/* ... */`` section marker) reports
        ``"expected <count> <what>, got <found>"`` at ``line`` (default: the first entry's line).
        """
        start_line = self.line() if line is None else line
        stop = self.pos + count
        chunk = self.tokens[self.pos : stop]
        available = len(chunk)
        for i, token in enumerate(chunk):
            if token.startswith("/*"):
                available = i
                break
        if available < count:
            raise self.error(f"expected {count} {what}, got {available}", start_line)
        try:
            values = [float(t) for t in chunk]
        except ValueError:
            bad = next(i for i, t in enumerate(chunk) if not _is_float(t))
            raise self.error(f"expected a number in {what}, got {chunk[bad]!r}", self.lines[self.pos + bad]) from None
        for i, value in enumerate(values):
            if math.isnan(value) or math.isinf(value) or (nonnegative and value < 0):
                kind = "negative" if value < 0 and math.isfinite(value) else "non-finite"
                raise self.error(f"{kind} entry {chunk[i]!r} in {what}", self.lines[self.pos + i])
        self.pos = stop
        return values

    def comment(self, word: str) -> None:
        """Consume a ``/* ... */`` section marker that contains ``word`` (case-insensitive)."""
        line = self.line()
        token = self.next(f"the '/* {word} */' section")
        if not (token.startswith("/*") and word.lower() in token.lower()):
            raise self.error(f"expected the '/* {word} */' section, got {token!r}", line)


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
