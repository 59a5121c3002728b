"""Tests of the ``grid`` motif: instances, features, exact conditionals, training batches."""

from __future__ import annotations

import math

import pytest
import torch

import motifs
from motifs.grid import GridMotif
from neuralblock.graph import FactorGraph
from neuralblock.io import erg_grid, read_erg, read_uai, uai_grid


# ---------------------------------------------------------------------------- graph builders
def ising_grid(height: int, width: int, torus: bool = False, coupling: float = 3.0, seed: int = 0) -> FactorGraph:
    """A random Ising grid numbered row-major (UAI ``Grids_*`` style tables)."""
    g = torch.Generator().manual_seed(seed)
    n = height * width
    fg = FactorGraph()
    fg.add_variables(n, 2)
    h = torch.rand(n, generator=g) * 2 - 1
    fg.add_table_factors(torch.arange(n)[:, None], torch.stack([h, -h], -1))
    edges = []
    for r in range(height):
        for c in range(width):
            if c + 1 < width or torus:
                edges.append((r * width + c, r * width + (c + 1) % width))
            if r + 1 < height or torus:
                edges.append((r * width + c, ((r + 1) % height) * width + c))
    w = (torch.rand(len(edges), generator=g) * 2 - 1) * coupling
    tables = torch.stack([torch.stack([w, -w], -1), torch.stack([-w, w], -1)], -2)
    fg.add_table_factors(torch.tensor(edges), tables)
    return fg


def bn_grid(height: int, width: int, seed: int = 0) -> FactorGraph:
    """A random grid BN numbered row-major: node (r, c) has parents (r, c-1), (r-1, c) (ERG style)."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    fg.add_variables(height * width, 2)
    for r in range(height):
        for c in range(width):
            parents = ([r * width + c - 1] if c else []) + ([(r - 1) * width + c] if r else [])
            rows = 2 ** len(parents)
            p = torch.where(torch.rand(rows, generator=g) < 0.9, (torch.rand(rows, generator=g) < 0.5).float(), 0.5)
            table = torch.stack([1 - p, p], -1).log().reshape([2] * (len(parents) + 1))
            fg.add_table_factor([*parents, r * width + c], table)
    return fg


def ancestral_state(fg: FactorGraph, seed: int) -> torch.Tensor:
    """A forward sample of a BN whose CPT of variable ``v`` is factor ``v`` (ids topological)."""
    g = torch.Generator().manual_seed(seed)
    state = torch.zeros(fg.num_variables)
    group, row = fg.factor_location(torch.arange(fg.num_variables))
    for v in range(fg.num_variables):
        both = state.repeat(2, 1)
        both[:, v] = torch.tensor([0.0, 1.0])
        log_f = fg.groups[int(group[v])].log_factors(both, row[v : v + 1]).squeeze(-1)
        state[v] = float(torch.rand((), generator=g) < log_f.softmax(-1)[1])
    return state


def brute_force(fg: FactorGraph, block: torch.Tensor, state: torch.Tensor, motif: GridMotif) -> torch.Tensor:
    """Exact ``log p(B | rest)`` over the enumerated block values, from ``fg.log_joint``."""
    values = motif.block_spec.enumerate()
    states = state.expand(values.shape[0], -1).clone()
    states[:, block] = values
    return torch.log_softmax(fg.log_joint(states), -1)


def assert_same_log_probs(got: torch.Tensor, want: torch.Tensor, atol: float = 2e-4) -> None:
    """Equal ``-inf`` patterns and close finite values."""
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], atol=atol)


# ---------------------------------------------------------------------------- protocol
def test_registered_and_spec() -> None:
    assert "grid" in motifs.names()
    motif = motifs.get("grid", family="bn", size=2)
    assert isinstance(motif, GridMotif)
    spec = motif.spec()
    assert spec["name"] == "grid" and spec["options"] == {"family": "bn", "size": 2}
    assert spec["block_cardinalities"] == [2] * 4 and spec["feature_dim"] == 48
    assert GridMotif("mrf", 3).feature_dim == 132 and GridMotif("bn", 3).feature_dim == 132
    with pytest.raises(ValueError, match="family"):
        GridMotif("tree")
    with pytest.raises(ValueError, match="size"):
        GridMotif("mrf", 4)


# ---------------------------------------------------------------------------- instances
@pytest.mark.parametrize(
    ("height", "width", "torus", "size", "expected"),
    [
        (2, 2, False, 2, 1),
        (3, 3, False, 2, 4),
        (5, 7, False, 2, 24),
        (7, 5, False, 2, 24),
        (5, 5, True, 2, 25),
        (6, 8, True, 2, 48),
        (5, 7, False, 3, 15),
        (6, 7, True, 3, 42),
    ],
)
def test_mrf_instance_counts(height: int, width: int, torus: bool, size: int, expected: int) -> None:
    inst = GridMotif("mrf", size).find_instances(ising_grid(height, width, torus))
    assert len(inst) == expected
    assert len({frozenset(b) for b in inst.blocks.tolist()}) == expected
    # canonical order on a row-major grid: the top-left window is row-major
    first = [r * width + c for r in range(size) for c in range(size)]
    assert first in inst.blocks.tolist()


@pytest.mark.parametrize(("height", "width", "size", "expected"), [(2, 2, 2, 1), (5, 7, 2, 24), (7, 5, 3, 15)])
def test_bn_instance_counts(height: int, width: int, size: int, expected: int) -> None:
    inst = GridMotif("bn", size).find_instances(bn_grid(height, width))
    assert len(inst) == expected
    first = [r * width + c for r in range(size) for c in range(size)]
    assert inst.blocks[0].tolist() == first


@pytest.mark.parametrize("family", ["mrf", "bn"])
def test_encode_of_no_instances_is_empty(family: str) -> None:
    fg = ising_grid(4, 4) if family == "mrf" else bn_grid(4, 4)
    motif = GridMotif(family)
    none = motif.find_instances(fg).select(torch.zeros(0, dtype=torch.long))
    assert motif.encode(fg, none, torch.zeros(fg.num_variables)).shape == (0, motif.feature_dim)


def test_shipped_grid_instance_counts() -> None:
    mrf, bn = GridMotif("mrf"), GridMotif("bn")
    assert len(mrf.find_instances(read_uai(uai_grid("Grids_11")))) == 100  # 10x10 torus
    assert len(mrf.find_instances(read_uai(uai_grid("Grids_15")))) == 361  # 20x20 open
    for name, side in [("90-10-1", 10), ("90-14-1", 14), ("90-16-1", 16)]:
        inst = bn.find_instances(read_erg(erg_grid(name)))
        assert len(inst) == (side - 1) ** 2
        assert inst.blocks[0].tolist() == [0, 1, side, side + 1]
    # the two families do not match each other's graphs
    assert len(bn.find_instances(read_uai(uai_grid("Grids_15")))) == 0
    assert len(mrf.find_instances(read_erg(erg_grid("90-10-1")))) == 0


def test_large_grid_instances() -> None:
    """A 30x30 grid has every 2x2 window (find_instances is vectorized; no timing asserted here)."""
    inst = GridMotif("mrf").find_instances(ising_grid(30, 30))
    assert len(inst) == 29 * 29
    assert len({frozenset(b) for b in inst.blocks.tolist()}) == 29 * 29


def test_evidence_excludes_blocks() -> None:
    fg = ising_grid(5, 7)
    observed = 2 * 7 + 3
    fg.set_evidence({observed: 1})
    inst = GridMotif("mrf").find_instances(fg)
    assert len(inst) == 24 - 4
    assert not (inst.blocks == observed).any()
    assert (inst.context == observed).any()  # still conditioned on
    bn = bn_grid(5, 7)
    bn.set_evidence({observed: 0})
    inst = GridMotif("bn").find_instances(bn)
    assert len(inst) == 20 and not (inst.blocks == observed).any()


def test_higher_order_factor_blocks_instances() -> None:
    fg = ising_grid(4, 4)
    fg.add_table_factor([0, 5, 10], torch.zeros(2, 2, 2))  # a non-grid factor
    blocks = GridMotif("mrf").find_instances(fg).blocks
    assert not torch.isin(blocks, torch.tensor([0, 5, 10])).any()


# ---------------------------------------------------------------------------- features = exact conditional
@pytest.mark.parametrize("size", [2, 3])
def test_mrf_features_give_exact_conditional(size: int) -> None:
    fg = read_uai(uai_grid("Grids_12"))
    motif = GridMotif("mrf", size)
    inst = motif.find_instances(fg)
    g = torch.Generator().manual_seed(1)
    states = torch.stack([fg.initial_state(g) for _ in range(3)])
    features = motif.encode(fg, inst, states)
    assert features.shape == (3, len(inst), motif.feature_dim)
    assert torch.isfinite(features).all() and features.abs().max() < 20
    log_p = motif.exact_conditional(features)
    for b in range(3):
        for i in range(0, len(inst), 5):
            assert_same_log_probs(log_p[b, i], brute_force(fg, inst.blocks[i], states[b], motif))
    # select + single state gives the same features
    sub = inst.select(torch.tensor([3, 1]))
    assert torch.allclose(motif.encode(fg, sub, states[2]), features[2, [3, 1]])


@pytest.mark.parametrize("size", [2, 3])
def test_bn_features_give_exact_conditional(size: int) -> None:
    fg = read_erg(erg_grid("90-10-1"))
    motif = GridMotif("bn", size)
    inst = motif.find_instances(fg)
    for seed in range(3):
        state = ancestral_state(fg, seed)
        features = motif.encode(fg, inst, state)
        assert torch.isfinite(features).all() and features.abs().max() < 20
        assert (features[:, motif.feature_dim // 2 :] == 1).any()  # deterministic zeros are flagged
        log_p = motif.exact_conditional(features)
        for i in range(0, len(inst), 3):
            assert_same_log_probs(log_p[i], brute_force(fg, inst.blocks[i], state, motif))


def test_features_on_torus_and_evidence() -> None:
    fg = ising_grid(5, 5, torus=True, coupling=10.0, seed=3)
    fg.set_evidence({7: 1})
    motif = GridMotif("mrf")
    inst = motif.find_instances(fg)
    state = fg.initial_state(torch.Generator().manual_seed(2))
    log_p = motif.exact_conditional(motif.encode(fg, inst, state))
    for i in range(len(inst)):
        assert_same_log_probs(log_p[i], brute_force(fg, inst.blocks[i], state, motif))


# ---------------------------------------------------------------------------- training batches
@pytest.mark.parametrize(("family", "size"), [("mrf", 2), ("bn", 2), ("mrf", 3), ("bn", 3)])
def test_training_batch_log_p_matches_features(family: str, size: int) -> None:
    motif = GridMotif(family, size)
    batch = motif.sample_training_batch(64, torch.Generator().manual_seed(0))
    k = 2 ** (size * size)
    assert batch.features.shape == (64, motif.feature_dim)
    assert batch.block.shape == (64, size * size) and batch.log_p.shape == (64, k)
    assert torch.isfinite(batch.features).all() and batch.features.abs().max() < 20
    assert torch.allclose(batch.log_p.logsumexp(-1), torch.zeros(64), atol=1e-5)
    assert_same_log_probs(motif.exact_conditional(batch.features), batch.log_p)
    # every drawn block is possible
    index = (batch.block.long() * (2 ** torch.arange(size * size - 1, -1, -1))).sum(-1)
    assert torch.isfinite(batch.log_p.gather(1, index[:, None])).all()


def test_training_batch_is_deterministic() -> None:
    for family in ("mrf", "bn"):
        motif = GridMotif(family)
        a = motif.sample_training_batch(32, torch.Generator().manual_seed(5))
        b = motif.sample_training_batch(32, torch.Generator().manual_seed(5))
        c = motif.sample_training_batch(32, torch.Generator().manual_seed(6))
        assert torch.equal(a.features, b.features) and torch.equal(a.block, b.block)
        assert torch.equal(a.log_p, b.log_p)
        assert not torch.equal(a.features, c.features)


def test_training_features_scale_and_determinism() -> None:
    mrf = GridMotif("mrf").sample_training_batch(512, torch.Generator().manual_seed(0))
    spread = mrf.features[:, :24].std(0)
    assert (spread > 0.1).all() and (spread < 10).all()  # O(1) features, none constant
    assert (mrf.features[:, 24:] == 0).all()  # Ising tables have no zeros
    bn = GridMotif("bn").sample_training_batch(512, torch.Generator().manual_seed(0))
    assert torch.isinf(bn.log_p).any() and (bn.features[:, 24:] == 1).any()
    assert torch.isfinite(bn.features).all() and bn.features.abs().max() < 20


def test_block_draws_follow_log_p() -> None:
    """Drawn blocks agree with ``log_p``, pooled over contexts and per context.

    1. Pearson test of the value counts against ``E_k = sum_i p_i(k)``. With independent
       draws ``x_i ~ p_i`` the count covariance is below the multinomial one with the same
       means (Loewner order), so the statistic is dominated by chi-square(15); 44.26 is its
       ``1 - 1e-4`` quantile.
    2. Per context: the number of draws equal to their own context's most likely value has
       mean ``sum_i max_k p_i(k)`` and variance ``sum_i p(1 - p)``; ``|z| < 4.5`` (two-sided
       rate 7e-6). This catches draws taken from the wrong instance's conditional.

    False-failure rate of the seeded test: below 1.1e-4.
    """
    motif = GridMotif("mrf")
    batch = motif.sample_training_batch(20000, torch.Generator().manual_seed(11))
    index = (batch.block.long() * torch.tensor([8, 4, 2, 1])).sum(-1)
    probs = batch.log_p.double().exp()
    counts = torch.bincount(index, minlength=16).double()
    expected = probs.sum(0)
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < 44.26, stat
    p_mode, mode = probs.max(-1)
    hits = float((index == mode).sum())
    z = (hits - float(p_mode.sum())) / float((p_mode * (1 - p_mode)).sum().sqrt())
    assert abs(z) < 4.5, z


def test_training_batch_of_a_full_step() -> None:
    """A batch of the trainer's default size: finite features and normalised block log-probabilities."""
    motif = GridMotif("mrf")
    batch = motif.sample_training_batch(256, torch.Generator().manual_seed(0))
    assert batch.features.shape == (256, motif.feature_dim) and torch.isfinite(batch.features).all()
    assert torch.allclose(batch.log_p.exp().sum(-1), torch.ones(256), atol=1e-4)


def test_bad_arguments() -> None:
    motif = GridMotif()
    with pytest.raises(ValueError, match="batch_size"):
        motif.sample_training_batch(0, torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        motif.sample_training_batch(4, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="feature"):
        motif.exact_conditional(torch.zeros(3, 7))
    assert math.isclose(float(motif.exact_conditional(torch.zeros(48)).exp().sum()), 1.0, rel_tol=1e-6)
