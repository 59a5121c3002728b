"""Tests of neuralblock.exact: junction tree vs brute force, UAI grids vs their solutions."""

from __future__ import annotations

import math

import pytest
import torch

from neuralblock.exact import elimination_order, joint_enumerate, log_partition, marginals
from neuralblock.exact import junction_tree as jt
from neuralblock.graph import FactorGraph
from neuralblock.graph.groups import CallableGroup
from neuralblock.io import erg_grid, read_erg, read_mar, read_pr, read_uai, uai_grid

UAI_GRIDS = [f"Grids_{i}" for i in range(11, 19)]


# ----------------------------------------------------------------------------- helpers
def _brute_force(fg: FactorGraph) -> tuple[torch.Tensor, float]:
    """Marginals [n, k] and log Z by enumeration (float64)."""
    states, log_probs = joint_enumerate(fg)
    cards = fg.cardinalities
    k = int(cards.max())
    probs = log_probs.exp()
    onehot = torch.nn.functional.one_hot(states.long(), k).to(torch.float64)  # [N, n, k]
    marg = torch.einsum("s,snk->nk", probs, onehot)
    log_joint = torch.zeros(states.shape[0], dtype=torch.float64)
    for group in fg.groups:
        log_joint = log_joint + group.log_factors(states).to(torch.float64).sum(-1)
    return marg, float(torch.logsumexp(log_joint, 0))


def _random_mrf(seed: int, n: int = 8, num_factors: int = 12, zeros: bool = False) -> FactorGraph:
    """Random discrete MRF: cards 2-4, factors over 1-3 variables, optional zero entries."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    cards = torch.randint(2, 5, (n,), generator=g).tolist()
    for v, k in enumerate(cards):
        fg.add_variable(f"v{v}", k)
    for _ in range(num_factors):
        arity = int(torch.randint(1, 4, (1,), generator=g))
        scope = torch.randperm(n, generator=g)[:arity].tolist()
        table = torch.randn([cards[v] for v in scope], generator=g, dtype=torch.float64) * 1.5
        if zeros:
            table = table.masked_fill(torch.rand(table.shape, generator=g) < 0.2, -math.inf)
            table.view(-1)[0] = 0.0  # keep at least one allowed entry
        fg.add_table_factor(scope, table)
    return fg


def _random_bn(seed: int, n: int = 9) -> FactorGraph:
    """Random Bayesian network: each variable has up to 2 earlier parents and a CPT over [parents..., child]."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    cards = torch.randint(2, 5, (n,), generator=g).tolist()
    for v, k in enumerate(cards):
        fg.add_variable(f"b{v}", k)
    for v in range(n):
        num_parents = min(v, int(torch.randint(0, 3, (1,), generator=g)))
        parents = torch.randperm(v, generator=g)[:num_parents].tolist() if v else []
        logits = torch.randn([cards[p] for p in parents] + [cards[v]], generator=g, dtype=torch.float64)
        fg.add_table_factor(parents + [v], torch.log_softmax(logits, -1))
    return fg


def _random_evidence(fg: FactorGraph, seed: int, count: int = 3) -> dict[int, int]:
    g = torch.Generator().manual_seed(seed + 1000)
    vars_ = torch.randperm(fg.num_variables, generator=g)[:count].tolist()
    return {v: int(torch.randint(0, int(fg.cardinalities[v]), (1,), generator=g)) for v in vars_}


def _assert_matches_brute_force(fg: FactorGraph, **kwargs) -> None:
    probs, log_z = marginals(fg, **kwargs)
    ref, ref_log_z = _brute_force(fg)
    assert probs.shape == ref.shape
    assert float((probs - ref).abs().max()) < 1e-6
    assert abs(log_z - ref_log_z) < 1e-6
    assert abs(log_partition(fg, **kwargs) - ref_log_z) < 1e-6
    # padding beyond each cardinality is zero, rows sum to one
    cards = fg.cardinalities
    pad = torch.arange(probs.shape[1])[None, :] >= cards[:, None]
    assert (probs[pad] == 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(fg.num_variables, dtype=torch.float64))


# ----------------------------------------------------------------------------- brute force
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_evidence", [False, True])
def test_random_mrf_matches_enumeration(seed, with_evidence):
    fg = _random_mrf(seed)
    if with_evidence:
        fg.set_evidence(_random_evidence(fg, seed))
    _assert_matches_brute_force(fg)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_evidence", [False, True])
def test_random_bn_matches_enumeration(seed, with_evidence):
    fg = _random_bn(seed)
    if with_evidence:
        fg.set_evidence(_random_evidence(fg, seed))
    probs, log_z = marginals(fg)
    if not with_evidence:
        assert abs(log_z) < 1e-6  # a BN is normalised (up to the float32 rounding of its tables)
    _assert_matches_brute_force(fg)


@pytest.mark.parametrize("method", ["min-fill", "min-degree", "natural"])
@pytest.mark.parametrize("seed", range(3))
def test_every_elimination_heuristic(method, seed):
    fg = _random_mrf(seed + 10, n=9, num_factors=14)
    _assert_matches_brute_force(fg, method=method)


@pytest.mark.parametrize("seed", range(3))
def test_zero_entries_and_checkpointing(seed, monkeypatch):
    # every message counts as "big", so chains drop and recompute their upward messages
    monkeypatch.setattr(jt, "_BIG_MESSAGE", 1)
    fg = _random_mrf(seed + 20, n=10, num_factors=14, zeros=True)
    fg.set_evidence(_random_evidence(fg, seed, count=1))
    _assert_matches_brute_force(fg)
    chain = FactorGraph()
    ids = chain.add_variables(11, 3)
    g = torch.Generator().manual_seed(seed)
    for a, b, c in zip(ids, ids[1:], ids[2:]):
        chain.add_table_factor([a, b, c], torch.randn(3, 3, 3, generator=g, dtype=torch.float64))
    _assert_matches_brute_force(chain, method="natural")


def test_observed_and_isolated_variables():
    fg = FactorGraph()
    a, b, c = fg.add_variable("a", 2), fg.add_variable("b", 3), fg.add_variable("c", 4)
    fg.add_variable("one", 1)
    fg.add_table_factor([a, b], torch.randn(2, 3, dtype=torch.float64))
    fg.set_evidence({"b": 1})
    probs, log_z = marginals(fg)
    assert probs.shape == (4, 4)
    assert probs[b].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert torch.allclose(probs[c], torch.full((4,), 0.25, dtype=torch.float64))
    assert probs[3].tolist() == [1.0, 0.0, 0.0, 0.0]
    _assert_matches_brute_force(fg)


def test_large_log_z_is_exact():
    # log Z about 4800 nats: every entry of every table is offset by 400
    fg = FactorGraph()
    ids = fg.add_variables(12, 2)
    g = torch.Generator().manual_seed(0)
    for a, b in zip(ids, ids[1:]):
        fg.add_table_factor([a, b], 400.0 + torch.randn(2, 2, generator=g, dtype=torch.float64))
    fg.add_table_factor([ids[-1]], 400.0 + torch.randn(2, generator=g, dtype=torch.float64))
    _, ref = _brute_force(fg)
    assert ref > 4000
    _, log_z = marginals(fg)
    assert abs(log_z - ref) / ref < 1e-12


def test_all_observed():
    fg = _random_mrf(3, n=4, num_factors=5)
    fg.set_evidence({v: 0 for v in range(4)})
    probs, log_z = marginals(fg)
    assert torch.equal(probs[:, 0], torch.ones(4, dtype=torch.float64))
    assert abs(log_z - float(fg.log_joint(torch.zeros(4)))) < 1e-5


def test_elimination_order_on_grid():
    import networkx as nx

    g = nx.convert_node_labels_to_integers(nx.grid_2d_graph(6, 6))
    order = elimination_order(g, [2] * 36)
    assert sorted(order) == list(range(36))
    adj = {v: set(g.neighbors(v)) for v in g.nodes}
    largest, _ = jt._order_cost(adj, [2] * 36, order)
    assert largest <= 7  # treewidth 6 grid: clique of 7 variables
    with pytest.raises(ValueError, match="unknown elimination method"):
        elimination_order(g, [2] * 36, "bogus")


# ----------------------------------------------------------------------------- errors
def test_errors_are_value_errors():
    fg = FactorGraph()
    x = fg.add_variable("x")
    y = fg.add_variable("y", 2)
    fg.add_linear_gaussian(x, [], [], 0.0, 1.0)
    with pytest.raises(ValueError, match="continuous variables found: 'x'"):
        marginals(fg)

    fg = FactorGraph()
    a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
    fg.add_group(CallableGroup(torch.tensor([[a, b]]), _pair_fn))
    with pytest.raises(ValueError, match="table factors only.*CallableGroup"):
        marginals(fg)

    fg = FactorGraph()
    ids = fg.add_variables(8, 2)
    fg.add_table_factor(ids, torch.zeros([2] * 8))
    with pytest.raises(ValueError, match="2\\*\\*8.0 = 256 states, above max_clique_states=100"):
        marginals(fg, max_clique_states=100)

    fg = FactorGraph()
    y = fg.add_variable("y", 2)
    fg.add_table_factor([y], torch.tensor([0.0, -math.inf]))
    fg.set_evidence({"y": 1})
    with pytest.raises(ValueError, match="partition function is 0"):
        marginals(fg)

    fg = FactorGraph()
    u, w = fg.add_variable("u", 2), fg.add_variable("w", 2)
    fg.add_table_factor([u], torch.tensor([0.0, -math.inf]))
    fg.add_table_factor([u, w], torch.tensor([[-math.inf, -math.inf], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="partition function is 0"):
        log_partition(fg)
    with pytest.raises(ValueError, match="num_threads"):
        marginals(_random_mrf(0), num_threads=0)


def _pair_fn(values, params):
    return -((values[..., 0] - values[..., 1]) ** 2)


def test_num_threads_restored():
    before = torch.get_num_threads()
    marginals(_random_mrf(1))
    assert torch.get_num_threads() == before


def test_joint_enumerate_rows():
    fg = _random_mrf(4, n=5, num_factors=6)
    fg.set_evidence({2: 1})
    states, log_probs = joint_enumerate(fg)
    cards = fg.cardinalities.tolist()
    assert states.shape == (math.prod(cards) // cards[2], 5)
    assert (states[:, 2] == 1).all()
    assert abs(float(torch.logsumexp(log_probs, 0))) < 1e-12
    with pytest.raises(ValueError, match="above max_states"):
        joint_enumerate(fg, max_states=3)


# ----------------------------------------------------------------------------- UAI grids
@pytest.mark.parametrize("name", UAI_GRIDS)
def test_uai_grid_matches_reference(name):
    torch.set_default_dtype(torch.float64)  # read the tables at full precision (conftest restores float32)
    fg = read_uai(uai_grid(name))
    probs, log_z = marginals(fg)
    mar = read_mar(uai_grid(name, "MAR")).to(torch.float64)
    err = float((probs - mar).abs().max())
    assert err <= 1e-4, f"{name}: max abs marginal error {err:.2e}"
    # the .PR files print 6 significant digits (e.g. 1962.98): allow 1e-3 plus half their last digit
    printed = uai_grid(name, "PR").read_text().split()[-1]
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    tol = 1e-3 + 0.5 * 10.0**-decimals
    log10_z = log_z / math.log(10.0)
    assert abs(log10_z - read_pr(uai_grid(name, "PR"))) <= tol, f"{name}: log10 Z {log10_z:.6f} vs {printed}"


# ----------------------------------------------------------------------------- ERG grid BNs
def test_shipped_grid_bn_marginals_match_fresh_computation():
    name = "90-10-1"
    fg = read_erg(erg_grid(name))
    probs, log_z = marginals(fg)
    shipped = read_mar(erg_grid(name).parent / f"{name}.MAR").to(torch.float64)
    assert float((probs - shipped).abs().max()) < 1e-6
    assert abs(log_z) < 1e-5  # a BN without evidence has Z = 1 (CPTs are stored in float32)
    shipped_pr = read_pr(erg_grid(name).parent / f"{name}.PR")
    assert abs(shipped_pr - log_z / math.log(10.0)) < 1e-8
    # roots (the variables whose CPT is a unary factor) have their CPT as marginal
    roots = 0
    for group in fg.groups:
        if group.scopes.shape[1] == 1:
            for (v,), table in zip(group.scopes.tolist(), group.log_tables):
                cpt = torch.softmax(table.to(torch.float64), -1)
                assert torch.allclose(probs[v], cpt, atol=1e-6)
                roots += 1
    assert roots >= 1
