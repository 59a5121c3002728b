"""Tests for neuralblock.io: the shipped UAI/ERG files, round trips and malformed input."""

from __future__ import annotations

import gzip
import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from neuralblock.graph import FactorGraph
from neuralblock.io import (
    data_path,
    erg_grid,
    read_erg,
    read_evid,
    read_mar,
    read_pr,
    read_uai,
    uai_grid,
    write_mar,
)

GRIDS = {  # name: (variables, factors, log10 Z from the .PR file)
    "Grids_11": (100, 300, 169.408),
    "Grids_12": (100, 280, 303.086),
    "Grids_13": (100, 300, 333.321),
    "Grids_14": (100, 300, 497.763),
    "Grids_15": (400, 1160, 291.733),
    "Grids_16": (400, 1160, 665.116),
    "Grids_17": (400, 1160, 1311.98),
    "Grids_18": (400, 1160, 1962.98),
}
ERGS = {"90-10-1": 10, "90-14-1": 14, "90-16-1": 16}

SMALL_BAYES = """BAYES
3
2 2 3
3
1 0
2 0 1
2 1 2

2
 0.3 0.7
4
 0.9 0.1
 0.2 0.8
6
 0.5 0.25 0.25
 0.0 0.0 1.0
"""
SMALL_BAYES_CPTS = [
    torch.tensor([0.3, 0.7]),
    torch.tensor([[0.9, 0.1], [0.2, 0.8]]),
    torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]]),
]


def _write(tmp_path: Path, text: str, name: str = "bad.uai") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------- shipped files
@pytest.mark.parametrize("name", sorted(GRIDS))
def test_read_shipped_uai_grid(name: str) -> None:
    n, m, log10_z = GRIDS[name]
    fg = read_uai(uai_grid(name), evid=uai_grid(name, "evid"))
    assert (fg.num_variables, fg.num_factors) == (n, m)
    assert fg.evidence == {}
    assert bool((fg.cardinalities == 2).all())
    assert fg.names[:2] == ["x0", "x1"]
    # one unary factor per variable (file order kept), then pairwise factors on grid edges
    assert [fg.factor_scope(f) for f in range(3)] == [[0], [1], [2]]
    width = int(math.isqrt(n))
    for f in range(n, m):
        a, b = sorted(fg.factor_scope(f))
        (ra, ca), (rb, cb) = divmod(a, width), divmod(b, width)
        assert (ra == rb and (cb - ca) % width in (1, width - 1)) or (ca == cb and (rb - ra) % width in (1, width - 1))
    states = torch.randint(0, 2, (16, n)).float()
    assert bool(torch.isfinite(fg.log_joint(states)).all())

    mar = read_mar(uai_grid(name, "MAR"))
    assert tuple(mar.shape) == (n, 2)
    assert torch.allclose(mar.sum(-1), torch.ones(n), atol=1e-5)
    assert read_pr(uai_grid(name, "PR")) == pytest.approx(log10_z)
    assert read_evid(uai_grid(name, "evid")) == {}


def _row_transfer_exact(fg: FactorGraph, width: int, height: int) -> tuple[torch.Tensor, float]:
    """Exact marginals and ln Z of a binary open grid by a row transfer sweep.

    In-row factors are tabulated over the 2^width row states; the factors between
    rows r and r+1 (vertical edges) are applied column by column as 2x2 kernels.
    """
    rows = torch.tensor(list(itertools.product([0, 1], repeat=width)), dtype=torch.long)  # [S, W]
    unary = torch.zeros(height, rows.shape[0], dtype=torch.float64)
    vertical: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(height - 1)]
    for group in fg.groups:
        for scope, table in zip(group.scopes.tolist(), group.log_tables.double()):
            r_of, cols = [v // width for v in scope], [v % width for v in scope]
            if len(set(r_of)) == 1:
                unary[r_of[0]] += table[tuple(rows[:, c] for c in cols)]
            else:
                assert len(scope) == 2 and cols[0] == cols[1] and abs(r_of[0] - r_of[1]) == 1
                vertical[min(r_of)].append((cols[0], table if r_of[0] < r_of[1] else table.T))

    def transfer(vec: torch.Tensor, r: int, backward: bool) -> torch.Tensor:
        t = vec.reshape([2] * width)
        for c, kernel in vertical[r]:
            k = kernel.T if backward else kernel
            t = torch.logsumexp(t.movedim(c, -1)[..., :, None] + k, dim=-2).movedim(-1, c)
        return t.reshape(-1)

    alpha = [unary[0]]
    for r in range(1, height):
        alpha.append(transfer(alpha[-1], r - 1, backward=False) + unary[r])
    beta = [torch.zeros(rows.shape[0], dtype=torch.float64)]
    for r in range(height - 2, -1, -1):
        beta.insert(0, transfer(unary[r + 1] + beta[0], r, backward=True))
    log_z = float(torch.logsumexp(alpha[-1], 0))
    marg = torch.zeros(width * height, 2, dtype=torch.float64)
    for r in range(height):
        p1 = ((alpha[r] + beta[r] - log_z).exp()[:, None] * rows).sum(0)
        marg[r * width : (r + 1) * width, 1] = p1
        marg[r * width : (r + 1) * width, 0] = 1 - p1
    return marg, log_z


def test_grid_reader_reproduces_reference_solution() -> None:
    # Grids_12 is an open 10x10 grid: an exact row sweep over 2^10 row states must
    # reproduce the shipped .MAR and .PR, which checks the table axis order end to end.
    fg = read_uai(uai_grid("Grids_12"))
    marg, log_z = _row_transfer_exact(fg, 10, 10)
    assert log_z / math.log(10) == pytest.approx(read_pr(uai_grid("Grids_12", "PR")), abs=2e-3)
    assert torch.allclose(marg.float(), read_mar(uai_grid("Grids_12", "MAR")), atol=1e-4)


@pytest.mark.parametrize("name", sorted(ERGS))
def test_read_shipped_erg(name: str) -> None:
    side = ERGS[name]
    fg = read_erg(erg_grid(name))
    assert fg.num_variables == fg.num_factors == side * side
    assert bool((fg.cardinalities == 2).all())
    coords = {}
    for v, label in enumerate(fg.names):
        match = re.fullmatch(r"V_(\d+)_(\d+)", label)
        assert match is not None, label
        coords[v] = (int(match[1]), int(match[2]))
    assert sorted(coords.values()) == [(r, c) for r in range(1, side + 1) for c in range(1, side + 1)]
    by_coord = {rc: v for v, rc in coords.items()}
    for v, (r, c) in coords.items():
        scope = fg.factor_scope(v)
        assert scope[-1] == v  # child last
        expected = {by_coord[p] for p in [(r, c - 1), (r - 1, c)] if p in by_coord}
        assert set(scope[:-1]) == expected
    for group in fg.groups:  # CPT rows are normalized
        assert torch.allclose(group.log_tables.exp().sum(-1), torch.ones(()), atol=1e-3)
    # an ancestral sample (ids are in topological order) has a finite log density
    state = torch.zeros(fg.num_variables)
    for v in range(fg.num_variables):
        group, row = (int(t) for t in fg.factor_location(torch.tensor([v])))
        candidates = state.repeat(2, 1)
        candidates[:, v] = torch.tensor([0.0, 1.0])
        log_p = fg.groups[group].log_factors(candidates, torch.tensor([row]))[:, 0]
        state[v] = float(torch.multinomial(log_p.exp(), 1))
    assert bool(torch.isfinite(fg.log_joint(state)))


def test_read_erg_plain_text(tmp_path: Path) -> None:
    plain = tmp_path / "g.erg"
    plain.write_bytes(gzip.decompress(erg_grid("90-10-1").read_bytes()))
    a, b = read_erg(plain), read_erg(erg_grid("90-10-1"))
    assert a.names == b.names
    state = torch.randint(0, 2, (8, 100)).float()
    assert torch.equal(a.log_joint(state), b.log_joint(state))


# ---------------------------------------------------------------------- round trips
def test_bayes_round_trip(tmp_path: Path) -> None:
    fg = read_uai(_write(tmp_path, SMALL_BAYES, "small.uai"))
    assert fg.num_variables == 3 and fg.num_factors == 3
    assert fg.cardinalities.tolist() == [2, 2, 3]
    assert [fg.factor_scope(f) for f in range(3)] == [[0], [0, 1], [1, 2]]
    states = torch.tensor(list(itertools.product(range(2), range(2), range(3)))).float()
    expected = torch.tensor(
        [
            math.log(SMALL_BAYES_CPTS[0][a]) + math.log(SMALL_BAYES_CPTS[1][a, b]) + math.log(c_p)
            if (c_p := float(SMALL_BAYES_CPTS[2][b, c])) > 0
            else -math.inf
            for a, b, c in states.long().tolist()
        ]
    )
    got = fg.log_joint(states)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-6)
    assert float(torch.logsumexp(got, 0)) == pytest.approx(0.0, abs=1e-6)  # a normalized BN


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        ([[1, 0], [0, 1]], r"the parent links form a cycle"),  # x0 | x1 and x1 | x0
        ([[0]], r"variables \['x1'\] have no CPT"),
        ([[0], [0], [1]], r"variable 'x0' is the child of 2 CPTs"),
    ],
)
def test_bayes_networks_need_one_cpt_per_variable_and_no_cycle(
    tmp_path: Path, factors: list[list[int]], message: str
) -> None:
    scopes = "".join(f"{len(scope)} {' '.join(map(str, scope))}\n" for scope in factors)
    tables = "".join(f"{2 ** len(scope)}\n{' '.join(['0.5'] * 2 ** len(scope))}\n" for scope in factors)
    text = f"BAYES\n2\n2 2\n{len(factors)}\n{scopes}\n{tables}"
    with pytest.raises(ValueError, match=message):
        read_uai(_write(tmp_path, text, "bad.uai"))


def test_markov_with_evidence_file_and_dict(tmp_path: Path) -> None:
    path = _write(tmp_path, SMALL_BAYES.replace("BAYES", "MARKOV"), "small.uai")
    single = _write(tmp_path, "2 0 1 2 2\n", "single.evid")
    samples = _write(tmp_path, "1\n2 0 1 2 2\n", "samples.evid")
    assert read_evid(single) == read_evid(samples) == {0: 1, 2: 2}
    assert read_evid(_write(tmp_path, "0", "none.evid")) == {}
    assert read_uai(path, evid=single).evidence == {0: 1.0, 2: 2.0}
    assert read_uai(path, evid={"x1": 0}).evidence == {1: 0.0}


def test_write_mar_round_trip(tmp_path: Path) -> None:
    marg = torch.tensor([[0.123456789, 0.876543211, 0.0], [0.2, 0.3, 0.5]])
    path = tmp_path / "out.MAR"
    write_mar(path, marg, cardinalities=[2, 3])
    assert path.read_text() == "MAR\n2 2 0.1234568 0.8765432 3 0.2 0.3 0.5\n"
    assert torch.allclose(read_mar(path), marg, atol=1e-7)
    shipped = read_mar(uai_grid("Grids_15", "MAR"))
    write_mar(path, shipped)
    assert torch.allclose(read_mar(path), shipped, atol=1e-7)
    with pytest.raises(ValueError, match="non-negative"):
        write_mar(path, -marg)
    with pytest.raises(ValueError, match="cardinalities"):
        write_mar(path, marg, cardinalities=[2, 4])


def test_read_mar_pads_and_uses_last_block(tmp_path: Path) -> None:
    text = "MAR\n2 2 0.5 0.5 1 1.0\n-BEGIN-\n2 3 0.2 0.3 0.5 2 0.1 0.9\n"
    assert torch.allclose(read_mar(_write(tmp_path, text, "a.MAR")), torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.9, 0.0]]))


def test_read_mar_reads_the_uai_2010_layout(tmp_path: Path) -> None:
    """UAI 2010 puts a count of evidence samples before the marginals; one sample is read, several refused."""
    want = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.9, 0.0]])
    text = "MAR\n1\n2 3 0.2 0.3 0.5 2 0.1 0.9\n"
    assert torch.allclose(read_mar(_write(tmp_path, text, "a.MAR")), want)
    text = "MAR\n2 2 0.5 0.5 1 1.0\n-BEGIN-\n1\n2 3 0.2 0.3 0.5 2 0.1 0.9\n"
    assert torch.allclose(read_mar(_write(tmp_path, text, "b.MAR")), want)
    two = "MAR\n2\n1 2 0.2 0.8\n1 2 0.3 0.7\n"
    with pytest.raises(ValueError, match="2 evidence samples"):
        read_mar(_write(tmp_path, two, "c.MAR"))
    with pytest.raises(ValueError, match="sums to"):  # the UAI 2014 reading's error, for a file neither layout fits
        read_mar(_write(tmp_path, "MAR\n1\n2 0.5 0.6\n", "d.MAR"))


def test_data_paths() -> None:
    assert data_path().name == "data"
    assert uai_grid("Grids_11.uai") == uai_grid("Grids_11")
    assert erg_grid("90-10-1.erg.gz") == erg_grid("90-10-1")
    with pytest.raises(FileNotFoundError, match="Grids_99"):
        uai_grid("Grids_99")
    with pytest.raises(FileNotFoundError, match="no shipped data file"):
        data_path("nope.txt")
    with pytest.raises(ValueError, match="kind"):
        uai_grid("Grids_11", "mar")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- malformed input
GOOD_MARKOV = """MARKOV
2
2 2
2
1 0
2 0 1

2
 0.5 1.5

4
 1.0 2.0
 3.0 4.0
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n2\n 0.5 1.5\n4\n 1.0 2.0\n 3.0\n",
            r"bad\.uai line 9: expected 4 table entries, got 3",
        ),
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n2\n 0.5 1.5\n",
            r"line 8: unexpected end of file, expected the table size of factor 1",
        ),
        ("MARKOV\n2\n2 2\n", r"line 3: unexpected end of file, expected the number of factors"),
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n3\n 0.5 1.5 1\n4\n 1 2 3 4\n",
            r"line 7: table size 3 of factor 0 does not match",
        ),
        (
            "MARKOV\n3\n2 2 2\n2\n1 0\n3 0 1\n2\n 0.5 1.5\n4\n 1 2 3 4\n",
            r"line 6: factor 1 declares 3 scope variables but its line lists 2",
        ),
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n2\n 0.5 -1.5\n4\n 1 2 3 4\n",
            r"line 8: negative entry '-1\.5' in table entries",
        ),
        ("MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n2\n 0.5 nan\n4\n 1 2 3 4\n", r"line 8: non-finite entry 'nan'"),
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 1\n2\n 0.5 abc\n4\n 1 2 3 4\n",
            r"line 8: expected a number in table entries, got 'abc'",
        ),
        ("MRF\n2\n2 2\n2\n1 0\n2 0 1\n", r"line 1: unknown network type 'MRF', expected MARKOV or BAYES"),
        ("MARKOV\n2.5\n2 2\n", r"line 2: expected an integer \(ASCII digits\) for the number of variables, got '2\.5'"),
        ("MARKOV\n2\n2 0\n", r"line 3: the cardinality of variable 1 is 0, out of range 1\.\.65536"),
        (
            "MARKOV\n2\n2 2\n2\n1 0\n2 0 5\n",
            r"line 6: a variable id in the scope of factor 1 is 5, out of range 0\.\.1",
        ),
        ("MARKOV\n2\n2 2\n2\n1 0\n2 1 1\n", r"line 6: scope \[1, 1\] of factor 1 repeats a variable"),
        (GOOD_MARKOV + "7\n", r"line 14: unexpected token '7' after the last factor table"),
        (GOOD_MARKOV.replace("MARKOV", "BAYES"), r"line 8: CPT of factor 0 \(child 'x0'\) row 0 sums to 2, expected 1"),
        ("", r"line 1: unexpected end of file, expected the network type"),
    ],
)
def test_malformed_uai(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_uai(_write(tmp_path, text))


def test_good_markov_parses(tmp_path: Path) -> None:
    fg = read_uai(_write(tmp_path, GOOD_MARKOV, "good.uai"))
    assert float(fg.log_joint(torch.tensor([1.0, 0.0]))) == pytest.approx(math.log(1.5 * 3.0))


@pytest.mark.parametrize(
    ("evid", "message"),
    [
        ("1 5 0", r"evidence variable 5 is out of range 0\.\.1"),
        ("1 1 2", r"evidence value 2 for variable 1 is out of range 0\.\.1"),
        ("2 0 1 1", r"bad\.evid line 1: unexpected end of file, expected the value of observed variable 1"),
        ("1 0 x", r"line 1: expected an integer \(ASCII digits\) for the value of observed variable 0, got 'x'"),
        ("2\n1 0 1\n1 1 1\n", r"line 1: expected one evidence sample, got 2"),
        ("1 0 1 extra", r"line 1: unexpected token 'extra' after 1 observations"),
        ("2 0 1 0 0", r"line 1: variable 0 is observed twice"),
    ],
)
def test_malformed_evidence(tmp_path: Path, evid: str, message: str) -> None:
    model = _write(tmp_path, GOOD_MARKOV, "good.uai")
    with pytest.raises(ValueError, match=message):
        read_uai(model, evid=_write(tmp_path, evid, "bad.evid"))


def test_bad_evidence_dict(tmp_path: Path) -> None:
    model = _write(tmp_path, GOOD_MARKOV, "good.uai")
    with pytest.raises(ValueError, match=r"good\.uai.*not in 0\.\.1"):
        read_uai(model, evid={0: 3})
    with pytest.raises(ValueError, match="unknown variable 'zz'"):
        read_uai(model, evid={"zz": 0})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("MAR\n2 2 0.5 0.5 2 0.5\n", r"bad\.MAR line 2: expected 2 marginal entries of variable 1, got 1"),
        ("PR\n2 2 0.5 0.5\n", r"line 1: expected the 'MAR' header, got 'PR'"),
        ("MAR\n1 2 0.5 0.6\n", r"line 2: marginal of variable 0 sums to 1\.1, expected 1"),
        ("MAR\n1 2 -0.5 1.5\n", r"line 2: negative entry '-0\.5'"),
        ("MAR\n1 2 0.5 0.5 9\n", r"line 2: unexpected token '9' after 1 marginals"),
    ],
)
def test_malformed_mar(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_mar(_write(tmp_path, text, "bad.MAR"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("PR\n", r"bad\.PR line 1: unexpected end of file, expected log10 Z"),
        ("MAR\n1.0\n", r"line 1: expected the 'PR' header"),
        ("PR\nabc\n", r"line 2: expected a number for log10 Z, got 'abc'"),
        ("PR\n1.0 2.0\n", r"line 2: unexpected token '2\.0'"),
    ],
)
def test_malformed_pr(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_pr(_write(tmp_path, text, "bad.PR"))


GOOD_ERG = """3
2 2 2
0
1 0
2 0 1
/* Probabilities */
2
 0.4 0.6
4
 1.0 0.0
 0.3 0.7
8
 0.5 0.5
 0.5 0.5
 0.1 0.9
 0.0 1.0
/* Names */
A
B
C
/* Labels */
X0000 X0001
"""


def test_small_erg(tmp_path: Path) -> None:
    fg = read_erg(_write(tmp_path, GOOD_ERG, "g.erg"))
    assert fg.names == ["A", "B", "C"]
    assert [fg.factor_scope(f) for f in range(3)] == [[0], [0, 1], [0, 1, 2]]
    # p(A=1, B=1, C=1) = 0.6 * 0.7 * 1.0 ; p(A=0, B=1, C=0) = 0.4 * 0.0 * ...
    assert float(fg.log_joint(torch.tensor([1.0, 1.0, 1.0])).exp()) == pytest.approx(0.42)
    assert float(fg.log_joint(torch.tensor([0.0, 1.0, 0.0]))) == -math.inf
    gz = tmp_path / "g.erg.gz"
    gz.write_bytes(gzip.compress(GOOD_ERG.encode()))
    assert read_erg(gz).names == ["A", "B", "C"]
    no_names = GOOD_ERG.split("/* Names */")[0]
    assert read_erg(_write(tmp_path, no_names, "n.erg")).names == ["x0", "x1", "x2"]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "8\n 0.5 0.5\n 0.5 0.5\n 0.1 0.9\n 0.0 1.0\n",
            "8\n 0.5 0.5\n 0.5 0.5\n 0.1 0.9\n",
            r"g\.erg line 12: expected 8 CPT entries of variable 2, got 6",
        ),
        ("4\n 1.0 0.0", "3\n 1.0 0.0", r"line 9: CPT size 3 of variable 1 does not match its parents \[0\]"),
        (" 0.3 0.7", " 0.3 0.8", r"line 9: CPT of factor 1 \(child 'B'\) row 1 sums to 1\.1, expected 1"),
        (" 0.3 0.7", " -0.3 1.3", r"line 11: negative entry '-0\.3'"),
        ("2 0 1\n", "2 0 7\n", r"line 5: a parent id of variable 2 is 7, out of range 0\.\.2"),
        ("2 0 1\n", "2 0 2\n", r"line 5: variable 2 is its own parent"),
        ("/* Probabilities */", "/* Tables */", r"line 6: expected the '/\* Probabilities \*/' section"),
        ("B\nC\n", "B\n", r"line 20: expected 3 variable names, got 2"),
        ("B\nC\n", "A\nC\n", r"line 19: variable name 'A' is used twice"),
        ("3\n2 2 2\n", "3\n2 x 2\n", r"line 2: expected an integer \(ASCII digits\) for the cardinality of variable 1"),
    ],
)
def test_malformed_erg(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in GOOD_ERG
    with pytest.raises(ValueError, match=message):
        read_erg(_write(tmp_path, GOOD_ERG.replace(old, new, 1), "g.erg"))


def test_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    data = erg_grid("90-10-1").read_bytes()
    path = tmp_path / "t.erg.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.erg\.gz"):
        read_erg(path)
    text = gzip.decompress(data).decode()
    path.write_bytes(gzip.compress(text[: len(text) // 2].encode()))
    with pytest.raises(ValueError, match=r"t\.erg\.gz line \d+: expected \d+ CPT entries|unexpected end of file"):
        read_erg(path)


# ---------------------------------------------------------------------- hardening (issue 23)
def _peak_bytes(call) -> tuple[BaseException | None, int]:
    """Run ``call``; return the exception it raised and the peak traced allocation.

    The reader stops early in bounded memory (a deterministic check; timing belongs in benchmarks).
    """
    import tracemalloc

    tracemalloc.start()
    error = None
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the caller checks the type
        error = err
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return error, peak


def test_gzip_bomb_fails_fast_in_little_memory(tmp_path: Path) -> None:
    # the bomb: 100 MiB of "1 " compressed to about 200 KB; it used 2 GB and 25 s
    bomb = tmp_path / "bomb.uai.gz"
    bomb.write_bytes(gzip.compress(b"1 " * (50 * 2**20), 9))
    error, peak = _peak_bytes(lambda: read_uai(bomb))
    assert isinstance(error, ValueError) and "bomb.uai.gz line 1: unknown network type '1'" in str(error)
    assert peak < 8 * 2**20
    # a valid model followed by a bomb of blanks or numbers stops at the byte limit, still in little memory
    head = b"MARKOV\n1\n2\n1\n1 0\n2 0.5 0.5\n"
    for tail, message in ((b" ", "after decompression"), (b"7 ", "unexpected token '7' after the last factor table")):
        bomb.write_bytes(gzip.compress(head + tail * (3 * 2**20), 9))
        error, peak = _peak_bytes(lambda: read_uai(bomb))  # noqa: B023
        if tail == b" ":
            assert error is None  # under the limit: blanks are fine
            continue
        assert isinstance(error, ValueError) and message in str(error) and peak < 8 * 2**20


def test_byte_limit_applies_on_disk_and_after_decompression(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURALBLOCK_MAX_READ_BYTES", str(2**20))
    text = GOOD_MARKOV + " " * (2 * 2**20)
    big = _write(tmp_path, text, "big.uai")
    with pytest.raises(ValueError, match=r"big\.uai: the file has \d+ bytes, more than the limit of 1048576"):
        read_uai(big)
    packed = tmp_path / "packed.uai.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    error, peak = _peak_bytes(lambda: read_uai(packed))
    assert isinstance(error, ValueError)
    assert "packed.uai.gz: more than 1048576 bytes after decompression" in str(error)
    assert peak < 4 * 2**20
    monkeypatch.setenv("NEURALBLOCK_MAX_READ_BYTES", "lots")
    with pytest.raises(ValueError, match="NEURALBLOCK_MAX_READ_BYTES must be a positive integer"):
        read_uai(big)


@pytest.mark.parametrize("reader", [read_uai, read_evid, read_mar, read_pr, read_erg])
def test_non_regular_files_are_refused_before_reading(tmp_path: Path, reader) -> None:
    link = tmp_path / "zero.uai"
    link.symlink_to("/dev/zero")
    error, peak = _peak_bytes(lambda: reader(link))
    assert isinstance(error, ValueError) and "zero.uai" in str(error) and "not a regular file" in str(error)
    assert peak < 2**20
    folder = tmp_path / "folder.uai"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"folder\.uai: .* is a directory, expected a file"):
        reader(folder)
    with pytest.raises(FileNotFoundError, match=r"missing\.uai: no such file"):
        reader(tmp_path / "missing.uai")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # the huge cardinality: refused where it is declared, before any kernel sees it
        ("MARKOV\n2\n1000000000 2\n1\n1 1\n2 0.5 0.5\n", r"line 3: the cardinality of variable 0 is 1000000000, out"),
        ("MARKOV\n5000000\n", r"line 2: the number of variables is 5000000, out of range 0\.\.4194304"),
        ("MARKOV\n1\n2\n5000000\n", r"line 4: the number of factors is 5000000, out of range 0\.\.4194304"),
        (
            "MARKOV\n1024\n" + " ".join(["65536"] * 1024) + "\n",
            r"line 3: 1024 variables with cardinalities up to 65536 need a 1024 x 65536 table of states",
        ),
        (  # one table of 2**48 entries: refused at its size, before a single entry is read
            "MARKOV\n3\n65536 65536 65536\n1\n3 0 1 2\n281474976710656 0.5\n",
            r"line 6: the tables up to factor 0 hold 281474976710656 entries, more than the limit of 33554432",
        ),
        ("MARKOV\n1\n2\n1\n1 0\n2 0 0\n", r"line 6: the table of factor 0 is all zeros"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.0 0e5\n", r"line 6: the table of factor 0 is all zeros"),
        # accepted junk that is now refused
        ("MARKOV\n+2\n2 2\n", r"line 2: expected an integer \(ASCII digits\) for the number of variables, got '\+2'"),
        ("MARKOV\n\uff12\n2 2\n", r"line 2: expected an integer \(ASCII digits\) for the number of variables"),
        ("MARKOV\n1_0\n2 2\n", r"line 2: expected an integer \(ASCII digits\) for the number of variables, got '1_0'"),
        ("MARKOV\n" + "1" * 40 + "\n", r"line 2: the number of variables has 40 digits, more than 18"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 \u0661\n", r"line 6: expected a number in table entries, got '\u0661'"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 1_0\n", r"line 6: expected a number in table entries, got '1_0'"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 inf\n", r"line 6: non-finite entry 'inf' in table entries"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 1e999\n", r"line 6: non-finite entry '1e999' in table entries"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 0x1p3\n", r"line 6: expected a number in table entries, got '0x1p3'"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 " + "1" * 100 + "\n", r"line 6: a number in table entries has 100 characters"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 0.5\n/* trailing comment */\n", r"line 7: unexpected token '/\* trailing"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 0.5 junk", r"line 6: unexpected token 'junk' after the last factor table"),
        ("MARKOV\n1\n2\n1\n1 0\n2 0.5 " + "x" * 70000, r"line 6: a token longer than 65536 characters"),
        ("MARKOV\n2\n2 2\n1\n2 0 1 1\n4 1 1 1 1\n", r"line 5: factor 0 declares 2 scope variables but its line lists"),
    ],
)
def test_refused_at_read_time(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"bad\.uai " + message):
        read_uai(_write(tmp_path, text))


@pytest.mark.parametrize(
    "text",
    [
        "MARKOV\n1\n2\n1\n1 0\n2 +0.5 .5\n",  # signed and point-first reals, as strtod reads them
        "MARKOV\n1\n2\n1\n1 0\n2 5E-1 0.\n",
        "markov\r\n1\r\n2\r\n1\r\n1 0\r\n2 0.5 0.5",  # lower case, CRLF, no final newline
        "MARKOV\n1\n002\n1\n1 0\n2 0.5 0.4",  # leading zeros; a last number cut short is still a number
    ],
)
def test_documented_valid_input(tmp_path: Path, text: str) -> None:
    fg = read_uai(_write(tmp_path, text, "ok.uai"))
    assert fg.num_variables == 1 and fg.num_factors == 1


@pytest.mark.parametrize(
    ("evid", "message"),
    [
        ("1 0 \u0661", r"bad\.evid line 1: expected an integer \(ASCII digits\) for the value of observed variable 0"),
        ("1 0 " + "9" * 5000, r"bad\.evid line 1: the value of observed variable 0 has 5000 digits, more than 18"),
        ("\uff11 0 1", r"bad\.evid line 1: expected an integer \(ASCII digits\) for the number of observed variables"),
        ("1 0 +1", r"bad\.evid line 1: expected an integer \(ASCII digits\) for the value of observed variable 0"),
        ("1\n" + "9" * 5000 + " 0 1", r"bad\.evid line 2: the number of observed variables has 5000 digits"),
    ],
)
def test_evidence_errors_name_the_file(tmp_path: Path, evid: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_evid(_write(tmp_path, evid, "bad.evid"))


def test_streaming_keeps_lines_across_chunks(tmp_path: Path) -> None:
    # a table spread over a line longer than one 64 KiB chunk, then an error on the next line
    entries = " ".join(["0.5"] * 40000)
    text = f"MARKOV\n1\n40000\n1\n1 0\n40000 {entries}\n  oops\n"
    with pytest.raises(ValueError, match=r"bad\.uai line 7: unexpected token 'oops'"):
        read_uai(_write(tmp_path, text))
    fg = read_uai(_write(tmp_path, text.replace("  oops\n", "\n"), "ok.uai"))
    assert fg.cardinalities.tolist() == [40000]
    # a comment cut by a chunk boundary is still one token
    pad = " " * (2**16 - 3)
    erg = GOOD_ERG.replace("/* Probabilities */", pad + "/* Probabilities */")
    assert read_erg(_write(tmp_path, erg, "p.erg")).names == ["A", "B", "C"]


def test_mar_and_pr_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"a\.MAR line 2: 5000 marginals with cardinalities up to 65536"):
        read_mar(_write(tmp_path, "MAR\n5000 65536 1", "a.MAR"))
    with pytest.raises(ValueError, match=r"a\.PR line 2: expected a number for log10 Z, got '\+\+1'"):
        read_pr(_write(tmp_path, "PR\n++1\n", "a.PR"))
    assert read_pr(_write(tmp_path, "PR\n-BEGIN-\n1.5\n-BEGIN-\n-2.5\n", "b.PR")) == -2.5
    with pytest.raises(ValueError, match=r"c\.PR line 3: unexpected token 'x' after log10 Z"):
        read_pr(_write(tmp_path, "PR\n1.5\nx\n", "c.PR"))
