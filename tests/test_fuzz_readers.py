"""Seeded fuzzing of the file readers (issue 23): every mutated file parses or fails with a named ``ValueError``.

Each case mutates a small valid file (characters, tokens, lines, truncation, gzip) with its
own ``random.Random(seed)``, so a failure reproduces from its test id alone. A reader may
accept a mutant only if the result is well formed; anything else must be a ``ValueError``
whose message starts with the file's name (never an ``IndexError``, ``RecursionError``,
``MemoryError``, a bare ``int()`` error or a crash). The whole module runs in a few seconds.
"""

from __future__ import annotations

import gzip
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from neuralblock.graph import FactorGraph
from neuralblock.io import read_erg, read_evid, read_mar, read_pr, read_uai

MARKOV = "MARKOV\n3\n2 2 3\n3\n1 0\n2 0 1\n2 1 2\n2\n 0.5 1.5\n4\n 1.0 2.0\n 3.0 4.0\n6\n 1 2 3\n 4 5 6\n"
BAYES = "BAYES\n3\n2 2 3\n3\n1 0\n2 0 1\n2 1 2\n\n2\n 0.3 0.7\n4\n 0.9 0.1\n 0.2 0.8\n6\n 0.5 0.25 0.25\n 0.0 0.0 1.0\n"
ERG = (
    "3\n2 2 2\n0\n1 0\n2 0 1\n/* Probabilities */\n2\n 0.4 0.6\n4\n 1.0 0.0\n 0.3 0.7\n"
    "8\n 0.5 0.5\n 0.5 0.5\n 0.1 0.9\n 0.0 1.0\n/* Names */\nA\nB\nC\n/* Labels */\nX0000 X0001\n"
)
EVID = "2 0 1 2 2\n"
MAR = "MAR\n2 2 0.25 0.75 3 0.2 0.3 0.5\n"
PR = "PR\n-12.5\n"

NASTY_TOKENS = [
    "+2", "-1", "0", "1e999", "-1e999", "nan", "inf", "Infinity", "0x10", "1_0", "\uff12", "\u0661", "\u00b2",
    "9" * 30, "9" * 5000, "2147483648", "18446744073709551616", "1.5", ".", "-", "e5", "1e", "/*", "*/",
    "/* c */", "-BEGIN-", "MAR", "PR", "BAYES", "MARKOV", "\x00", "\ufffd", "65537", "4194305", "1" * 19,
]  # fmt: skip
ALPHABET = list("0123456789.-+eE /*\n\t\r") + ["\x00", "\uff13", "\u0663", "\u00e9", "\x0c", "x"]


def _mutate(text: str, rng: random.Random) -> bytes:
    """One to three random edits of ``text``, as bytes (sometimes gzipped, sometimes with broken UTF-8)."""
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(9)
        if kind == 8:  # the same number in other digits (full-width, Arabic-Indic) or with a sign or "_"
            spans = [m.span() for m in re.finditer(r"[0-9]+", text)]
            if spans:
                a, b = rng.choice(spans)
                digits = text[a:b]
                form = rng.randrange(4)
                if form == 0:
                    digits = digits.translate({ord(c): 0xFF10 + int(c) for c in "0123456789"})
                elif form == 1:
                    digits = digits.translate({ord(c): 0x0660 + int(c) for c in "0123456789"})
                elif form == 2:
                    digits = digits[0] + "_" + digits[1:] if len(digits) > 1 else "0_" + digits
                else:
                    digits = "+" + digits
                text = text[:a] + digits + text[b:]
        elif kind == 0 and text:  # delete a character
            i = rng.randrange(len(text))
            text = text[:i] + text[i + 1 :]
        elif kind == 1:  # insert a character
            i = rng.randrange(len(text) + 1)
            text = text[:i] + rng.choice(ALPHABET) + text[i:]
        elif kind == 2:  # replace a token with a nasty one
            tokens = text.split(" ")
            i = rng.randrange(len(tokens))
            tokens[i] = rng.choice(NASTY_TOKENS) + ("\n" if tokens[i].endswith("\n") else "")
            text = " ".join(tokens)
        elif kind == 3:  # truncate
            text = text[: rng.randrange(len(text) + 1)]
        elif kind == 4:  # duplicate or drop a line
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            lines[i : i + 1] = [] if rng.random() < 0.5 else [lines[i], lines[i]]
            text = "\n".join(lines)
        elif kind == 5:  # swap two lines
            lines = text.split("\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind == 6:  # append junk
            text += rng.choice(["\n", " 7", "\n/* x */ y", "\n-BEGIN-\n", " \x00", "\n" + rng.choice(NASTY_TOKENS)])
        else:  # change a digit
            digits = [i for i, c in enumerate(text) if c.isdigit()]
            if digits:
                i = rng.choice(digits)
                text = text[:i] + str(rng.randrange(10)) + text[i + 1 :]
    data = text.encode("utf-8")
    roll = rng.random()
    if roll < 0.1:
        data = gzip.compress(data)
    elif roll < 0.15:
        data = gzip.compress(data)[: rng.randrange(2, 40)]  # truncated gzip
    elif roll < 0.2 and data:
        i = rng.randrange(len(data))
        data = data[:i] + b"\xff\xfe" + data[i:]  # invalid UTF-8
    return data


_KEYWORDS = {"MARKOV", "BAYES", "MAR", "PR", "-BEGIN-"}
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _has_junk_token(data: bytes, kind: str) -> bool:
    """Whether a UAI/evid/MAR/PR mutant holds a token that no number or keyword of the format can be.

    Such a file must be refused whatever else it holds (non-ASCII digits, ``nan``, ``1_0``,
    stray text, over-long numbers). ERG files are skipped: their names and labels are free text.
    """
    if kind == "erg":
        return False
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return False  # corrupt gzip: refused anyway
    tokens = data.decode("utf-8", errors="replace").split()
    return any(
        t.upper() not in _KEYWORDS and (not _NUMBER.fullmatch(t) or len(t) > 64 or math.isinf(float(t))) for t in tokens
    )


def _check_graph(fg: Any) -> None:
    assert isinstance(fg, FactorGraph)
    cards = fg.cardinalities
    assert bool((cards >= 1).all())
    state = torch.zeros(fg.num_variables)
    value = float(fg.log_joint(state))
    assert not math.isnan(value) and value != math.inf


def _check_evid(evidence: Any) -> None:
    assert isinstance(evidence, dict)
    assert all(isinstance(k, int) and isinstance(v, int) and k >= 0 and v >= 0 for k, v in evidence.items())


def _check_mar(mar: Any) -> None:
    assert isinstance(mar, torch.Tensor) and mar.dim() == 2
    assert bool(torch.isfinite(mar).all()) and bool((mar >= 0).all())
    if mar.numel():
        assert torch.allclose(mar.double().sum(1), torch.ones(mar.shape[0], dtype=torch.float64), atol=2e-3)


def _check_pr(value: Any) -> None:
    assert isinstance(value, float) and math.isfinite(value)


READERS: dict[str, tuple[Callable[[Path], Any], str, str, Callable[[Any], None]]] = {
    "markov": (read_uai, MARKOV, "m.uai", _check_graph),
    "bayes": (read_uai, BAYES, "b.uai", _check_graph),
    "erg": (read_erg, ERG, "g.erg", _check_graph),
    "evid": (read_evid, EVID, "e.evid", _check_evid),
    "mar": (read_mar, MAR, "a.MAR", _check_mar),
    "pr": (read_pr, PR, "a.PR", _check_pr),
}
CASES = [(kind, seed) for kind in READERS for seed in range(60)]  # 360 mutants


@pytest.mark.parametrize("kind", sorted(READERS))
def test_unmutated_bases_parse(tmp_path: Path, kind: str) -> None:
    reader, text, name, check = READERS[kind]
    path = tmp_path / name
    path.write_text(text)
    check(reader(path))


def test_fuzz_readers(tmp_path: Path) -> None:
    """360 seeded mutants: each parses into a well-formed result or raises a ValueError naming its file."""
    outcomes = {"parsed": 0, "refused": 0}
    for kind, seed in CASES:
        reader, text, name, check = READERS[kind]
        data = _mutate(text, random.Random(f"{kind}-{seed}"))
        path = tmp_path / f"{kind}-{seed}-{name}"
        path.write_bytes(data)
        try:
            result = reader(path)
        except ValueError as err:
            assert str(err).startswith(path.name), f"{kind} seed {seed}: {err!r} does not name the file; data {data!r}"
            assert not isinstance(err, UnicodeError), f"{kind} seed {seed}: {err!r}"
            outcomes["refused"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - the point of the test: no other exception type escapes
            pytest.fail(f"{kind} seed {seed}: {type(err).__name__}: {err}; data {data!r}")
        assert not _has_junk_token(data, kind), f"{kind} seed {seed}: junk accepted: {data!r} -> {result!r}"
        check(result)
        outcomes["parsed"] += 1
    # the mutations must exercise both sides (else the fuzzer has gone blind)
    assert outcomes["refused"] > 200 and outcomes["parsed"] > 20, outcomes
    print(f"reader fuzz: {outcomes}")


def test_fuzz_evidence_with_a_model(tmp_path: Path) -> None:
    """60 mutated evidence files on a model: a named ValueError or a graph whose observed values fit their domains."""
    model = tmp_path / "m.uai"
    model.write_text(MARKOV)
    applied = 0
    for seed in range(60):
        path = tmp_path / f"{seed}.evid"
        path.write_bytes(_mutate(EVID, random.Random(f"evid-on-model-{seed}")))
        try:
            fg = read_uai(model, evid=path)
        except ValueError as err:
            assert path.name in str(err) or "m.uai" in str(err), repr(err)
            continue
        cards = fg.cardinalities
        assert all(0 <= value < int(cards[v]) for v, value in fg.evidence.items())
        applied += 1
    assert 0 < applied < 60
