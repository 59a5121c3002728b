"""A bounded, streaming whitespace tokenizer that remembers line numbers, for precise parse errors.

Every reader in :mod:`neuralblock.io` parses a file through :class:`Tokens`, opened with
:meth:`Tokens.open`. The file is read (and gunzipped when it starts with the gzip magic
bytes) in chunks of 64 KiB and split into tokens only as far as the parser asks, so a
malformed file fails at its first bad token after reading one chunk, whatever its size.
``/* ... */`` comments on one line are single tokens. Every failure raises a
``ValueError`` of the form ``"<file> line <n>: <what went wrong>"``.

Bounds (refused with a ``ValueError`` that names the file, before they are exceeded):

* only regular files are read (a directory, ``/dev/zero``, a pipe or a socket is refused
  before it is opened, also through a symbolic link);
* at most :data:`MAX_FILE_BYTES` bytes are read from disk, and at most as many after
  decompression (a gzip bomb stops there);
* one token has at most :data:`MAX_TOKEN_CHARS` characters; an integer at most
  :data:`MAX_INTEGER_DIGITS` digits and a number at most :data:`MAX_NUMBER_CHARS` characters.

Numbers follow the C conventions UAI files are written with: integers are plain ASCII
digits (no sign, no ``_``, no full-width or other Unicode digits); real numbers are
``[+-]digits[.digits][e[+-]digits]`` in ASCII (no ``inf``, ``nan``, hexadecimal or ``_``).

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.txt"
    >>> _ = path.write_text("3 /* a comment */\\n0.5 x\\n")
    >>> with Tokens.open(path) as toks:
    ...     toks.integer("a count"), toks.next("a comment"), toks.number("a number"), toks.line()
    (3, '/* a comment */', 0.5, 2)
"""

from __future__ import annotations

import codecs
import gzip
import math
import os
import re
import stat
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_INTEGER_DIGITS",
    "MAX_NUMBER_CHARS",
    "MAX_TOKEN_CHARS",
    "PathLike",
    "Tokens",
    "open_chunks",
    "read_limit",
]

PathLike = str | os.PathLike[str]

MAX_FILE_BYTES = 128 * 2**20
"""Most bytes read from one file, on disk and again after decompression (128 MiB; the environment
variable ``NEURALBLOCK_MAX_READ_BYTES`` overrides it). Reading that much takes about half a second."""
MAX_TOKEN_CHARS = 2**16
"""Longest token (a run of non-blank characters, or a one-line ``/* ... */`` comment)."""
MAX_INTEGER_DIGITS = 18
"""Longest integer token; every count, id and size the readers accept fits in it."""
MAX_NUMBER_CHARS = 64
"""Longest real-number token (17 significant digits, a sign, a point and an exponent fit easily)."""

_CHUNK = 2**16
_TRIM = 2**16  # drop consumed tokens once this many pile up
_TOKEN = re.compile(r"(?P<comment>/\*.*?\*/)|\S+")
_INTEGER = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_GZIP_MAGIC = b"\x1f\x8b"


def read_limit() -> int:
    """The byte limit in force: ``NEURALBLOCK_MAX_READ_BYTES`` if set, else :data:`MAX_FILE_BYTES`.

    Raises:
        ValueError: the environment variable is not a positive integer.
    """
    text = os.environ.get("NEURALBLOCK_MAX_READ_BYTES")
    if text is None:
        return MAX_FILE_BYTES
    if not _INTEGER.fullmatch(text.strip()) or int(text) <= 0 or len(text.strip()) > MAX_INTEGER_DIGITS:
        raise ValueError(f"NEURALBLOCK_MAX_READ_BYTES must be a positive integer (bytes), got {text!r}")
    return int(text)


def open_chunks(path: PathLike, limit: int | None = None) -> tuple[Iterator[str], str]:
    """Check ``path`` and return a lazy iterator over its decoded text in chunks, plus its display name.

    The checks that need no reading happen now: the file must exist and be a regular file
    (following symbolic links) of at most ``limit`` bytes (default: :func:`read_limit`). Reading happens as the iterator
    is consumed; gzip data (detected from the magic bytes) are decompressed on the fly and
    refused once more than ``limit`` bytes come out. Undecodable UTF-8 becomes U+FFFD.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a regular file, too large, or corrupt gzip data (from the iterator).
    """
    limit = read_limit() if limit is None else limit
    path = Path(path)
    name = path.name or str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such file ({path})") from None
    except OSError as err:
        raise ValueError(f"{name}: cannot read {path}: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{name}: {path} is a directory, expected a file")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{name}: {path} is not a regular file (a device, pipe or socket); refusing to read it")
    if info.st_size > limit:
        raise ValueError(f"{name}: the file has {info.st_size} bytes, more than the limit of {limit}")
    return _chunks(path, name, limit), name


def _chunks(path: Path, name: str, limit: int) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        with open(path, "rb") as raw:
            compressed = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
            total = 0
            while True:
                try:
                    data = stream.read(_CHUNK)
                except (OSError, EOFError, zlib.error) as err:
                    raise ValueError(f"{name}: corrupt gzip data ({err})") from None
                if not data:
                    break
                total += len(data)
                if total > limit:
                    what = "after decompression" if compressed else "read"
                    raise ValueError(f"{name}: more than {limit} bytes {what}; refusing to read further")
                yield decoder.decode(data)
    except OSError as err:
        raise ValueError(f"{name}: cannot read {path}: {err.strerror or err}") from None
    yield decoder.decode(b"", final=True)


class Tokens:
    """Tokens of one file, read lazily, with their line numbers and a read cursor.

    Args:
        chunks: the file's text, in pieces (see :func:`open_chunks`); a plain string works too.
        source: the name used in error messages (usually the file name).
    """

    def __init__(self, chunks: Iterator[str] | str, source: str) -> None:
        self.source = source
        self._chunks: Iterator[str] = iter([chunks]) if isinstance(chunks, str) else chunks
        self._tokens: list[str] = []
        self._lines: list[int] = []
        self._base = 0  # absolute index of self._tokens[0]
        self._pos = 0  # index into self._tokens of the next token
        self._keep: int | None = None  # absolute index that must stay buffered (see mark)
        self._pending = ""  # text of the current line not yet tokenized
        self._lineno = 1  # line of self._pending
        self._line_started = False  # whether line self._lineno holds any character
        self._eof = False

    @classmethod
    def open(cls, path: PathLike, limit: int | None = None) -> Tokens:
        """Tokens of a file (see :func:`open_chunks` for the checks and bounds); use it in a ``with``."""
        chunks, name = open_chunks(path, limit)
        return cls(chunks, name)

    def close(self) -> None:
        """Close the underlying file."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Tokens:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def _read_chunk(self) -> None:
        """Tokenize one more chunk of the file (all of what is left at the end)."""
        chunk = next(self._chunks, None)
        if self._keep is None and self._pos > _TRIM:
            del self._tokens[: self._pos], self._lines[: self._pos]
            self._base += self._pos
            self._pos = 0
        if chunk is None:
            self._eof = True
            self._scan(self._pending, final=True)
            self._pending = ""
            return
        if chunk.isspace() and (not self._pending or self._pending[-1].isspace()):  # blank: only count lines
            newlines = chunk.count("\n")
            if newlines:
                self._scan(self._pending, final=True)
                self._lineno += newlines
                self._pending = chunk[chunk.rfind("\n") + 1 :]
                self._line_started = bool(self._pending)
            return
        *complete, self._pending = (self._pending + chunk).split("\n")
        for line in complete:
            self._scan(line, final=True)
            self._lineno += 1
        if complete:
            self._line_started = False
        self._line_started = self._line_started or bool(self._pending)
        if len(self._pending) > _CHUNK:  # a long line: take its complete tokens now
            self._pending = self._scan(self._pending, final=False)
            if len(self._pending) > MAX_TOKEN_CHARS:
                raise self.error(f"a token longer than {MAX_TOKEN_CHARS} characters", self._lineno)

    def _scan(self, text: str, final: bool) -> str:
        """Append the tokens of ``text`` (part of one line); return the unfinished tail unless ``final``."""
        if "/*" not in text:  # the common case, at C speed
            found = text.split()
            tail = ""
            if found and not final and not text[-1].isspace():
                tail = found.pop()
            if any(len(t) > MAX_TOKEN_CHARS for t in found):
                raise self.error(f"a token longer than {MAX_TOKEN_CHARS} characters", self._lineno)
            self._tokens.extend(found)
            self._lines.extend([self._lineno] * len(found))
            return tail
        for match in _TOKEN.finditer(text):
            token = match.group()
            if not final and (match.end() == len(text) or (token.startswith("/*") and match.group("comment") is None)):
                return text[match.start() :]  # may continue (or close its comment) in the next chunk
            if len(token) > MAX_TOKEN_CHARS:
                raise self.error(f"a token longer than {MAX_TOKEN_CHARS} characters", self._lineno)
            self._tokens.append(token)
            self._lines.append(self._lineno)
        return ""

    def _fill(self, count: int) -> int:
        """Buffer up to ``count`` unread tokens; returns how many are buffered (fewer only at the end)."""
        while len(self._tokens) - self._pos < count and not self._eof:
            self._read_chunk()
        return min(len(self._tokens) - self._pos, count)

    # ------------------------------------------------------------------ errors
    def error(self, message: str, line: int | None = None) -> ValueError:
        """A ``ValueError`` naming the file and line (default: the current token's line)."""
        return ValueError(f"{self.source} line {self.line() if line is None else line}: {message}")

    # ------------------------------------------------------------------ cursor
    @property
    def pos(self) -> int:
        """Index of the next token in the file (0 = the first token)."""
        return self._base + self._pos

    def mark(self) -> int:
        """Keep every token from the cursor on buffered, so that :meth:`reset` can return here."""
        self._keep = self.pos
        return self._keep

    def reset(self, position: int) -> None:
        """Move the cursor back to a :meth:`mark`; the mark is released."""
        if position < self._base or self._keep is None or position < self._keep:
            raise RuntimeError("Tokens.reset needs a position at or after the current mark")
        self._pos = position - self._base
        self._keep = None

    def release(self) -> None:
        """Drop the mark (buffered tokens before the cursor may be discarded again)."""
        self._keep = None

    def at_end(self) -> bool:
        """Whether every token has been read."""
        return self._fill(1) == 0

    def peek(self, ahead: int = 0) -> str | None:
        """The token ``ahead`` places after the next one, without consuming it (``None`` past the end)."""
        if self._fill(ahead + 1) <= ahead:
            return None
        return self._tokens[self._pos + ahead]

    def line(self) -> int:
        """Line of the next token (the last line of the file at its end)."""
        if self._fill(1):
            return self._lines[self._pos]
        # at the end: a final newline does not open another line
        return self._lineno if self._line_started else max(self._lineno - 1, 1)

    def starts_line(self) -> bool:
        """Whether the next token is the first one on its line."""
        if not self._fill(1):
            return False
        return self._pos == 0 and self._base == 0 or self._lines[self._pos - 1] != self._lines[self._pos]

    def count_on_line(self, limit: int) -> int:
        """How many unread tokens share the next token's line, counting at most ``limit``."""
        if not self._fill(1):
            return 0
        line, count = self._lines[self._pos], 0
        while count < limit:
            if self._fill(count + 1) <= count or self._lines[self._pos + count] != line:
                break
            count += 1
        return count

    def next(self, what: str) -> str:
        """Consume one token; ``what`` describes it for the end-of-file error."""
        if not self._fill(1):
            raise self.error(f"unexpected end of file, expected {what}")
        token = self._tokens[self._pos]
        self._pos += 1
        return token

    def integer(self, what: str, low: int | None = None, high: int | None = None) -> int:
        """Consume a plain decimal integer token in ``[low, high]`` (inclusive bounds, ``None`` = open)."""
        line = self.line()
        token = self.next(what)
        if not _INTEGER.fullmatch(token):
            raise self.error(f"expected an integer (ASCII digits) for {what}, got {_show(token)}", line)
        if len(token) > MAX_INTEGER_DIGITS:
            raise self.error(f"{what} has {len(token)} digits, more than {MAX_INTEGER_DIGITS}", line)
        value = int(token)
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"{'-inf' if low is None else low}..{'inf' if high is None else high}"
            raise self.error(f"{what} is {value}, out of range {bounds}", line)
        return value

    def number(self, what: str) -> float:
        """Consume a finite real-number token."""
        line = self.line()
        token = self.next(what)
        return self._float(token, what, line, f"expected a number for {what}")

    def _float(self, token: str, what: str, line: int, expected: str, in_table: bool = False) -> float:
        if len(token) > MAX_NUMBER_CHARS:
            raise self.error(f"a number in {what} has {len(token)} characters, more than {MAX_NUMBER_CHARS}", line)
        if _NONFINITE.fullmatch(token) or (_NUMBER.fullmatch(token) and not math.isfinite(float(token))):
            if in_table:
                raise self.error(f"non-finite entry {token!r} in {what}", line)
            raise self.error(f"{what} must be finite, got {token!r}", line)
        if not _NUMBER.fullmatch(token):
            raise self.error(f"{expected}, got {_show(token)}", line)
        return float(token)

    def table(self, count: int, what: str, nonnegative: bool = True, line: int | None = None) -> array:
        """Consume ``count`` finite numbers (non-negative by default): the entries of one table.

        A missing entry (end of file, or a ``/* ... */`` section marker) reports
        ``"expected <count> <what>, got <found>"`` at ``line`` (default: the first entry's line).

        Returns:
            The entries as an ``array('d')`` (8 bytes each).
        """
        start_line = self.line() if line is None else line
        values = array("d")
        while len(values) < count:
            available = self._fill(min(count - len(values), _CHUNK))
            chunk = self._tokens[self._pos : self._pos + available]
            for i, token in enumerate(chunk):
                if token.startswith("/*"):
                    available = i
                    break
            if available < len(chunk) or not chunk:
                raise self.error(f"expected {count} {what}, got {len(values) + available}", start_line)
            try:
                if any(len(t) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(t) for t in chunk):
                    raise ValueError
                new = array("d", map(float, chunk))
            except ValueError:
                bad = next(i for i, t in enumerate(chunk) if len(t) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(t))
                token = chunk[bad]
                self._float(token, what, self._lines[self._pos + bad], f"expected a number in {what}", True)
                raise AssertionError("unreachable") from None  # pragma: no cover - _float raised
            for i, value in enumerate(new):
                if math.isinf(value) or (nonnegative and value < 0):
                    kind = "negative" if value < 0 and math.isfinite(value) else "non-finite"
                    raise self.error(f"{kind} entry {chunk[i]!r} in {what}", self._lines[self._pos + i])
            values.extend(new)
            self._pos += len(chunk)
        return values

    def comment(self, word: str) -> None:
        """Consume a ``/* ... */`` section marker that contains ``word`` (case-insensitive)."""
        line = self.line()
        token = self.next(f"the '/* {word} */' section")
        if not (token.startswith("/*") and word.lower() in token.lower()):
            raise self.error(f"expected the '/* {word} */' section, got {_show(token)}", line)


def _show(token: str, width: int = 40) -> str:
    """``repr`` of a token, shortened to about ``width`` characters."""
    return repr(token) if len(token) <= width else repr(token[:width]) + f"... ({len(token)} characters)"
