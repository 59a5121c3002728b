"""FactorGraph core: log densities, scaffolds, colouring and input validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import constraints

from neuralblock import FactorGraph


def small_graph() -> FactorGraph:
    g = torch.Generator().manual_seed(0)
    fg = FactorGraph()
    for i, k in enumerate([2, 3, 2, 4]):
        fg.add_variable(f"d{i}", k)
    fg.add_variable("c0")
    fg.add_variable("c1", support=constraints.positive)
    fg.add_table_factor([0, 1], torch.randn(2, 3, generator=g))
    fg.add_table_factor([1, 2, 3], torch.randn(3, 2, 4, generator=g))
    fg.add_table_factor([3], torch.randn(4, generator=g))
    fg.add_linear_gaussian(4, [0, 5], [0.5, -1.0], 0.2, 0.7)
    return fg


def test_log_joint_is_the_sum_of_factor_values() -> None:
    fg = small_graph()
    state = torch.tensor([[1.0, 2.0, 0.0, 3.0, 0.3, 1.5], [0.0, 0.0, 1.0, 1.0, -1.0, 0.5]])
    tables = [g for g in fg.groups if hasattr(g, "log_tables")]
    manual = torch.zeros(2)
    for group in tables:
        for f in range(group.num_factors):
            scope = group.scope_list(f)
            manual += group.log_tables[f][tuple(state[:, v].long() for v in scope)]
    mean = 0.2 + 0.5 * state[:, 0] - 1.0 * state[:, 5]
    manual += torch.distributions.Normal(mean, 0.7).log_prob(state[:, 4])
    assert torch.allclose(fg.log_joint(state), manual, atol=1e-5)


def test_scaffold_differences_equal_log_joint_differences() -> None:
    fg = small_graph()
    blocks = [[1], [3, 2], [4]]
    scaffold = fg.scaffold(blocks)
    state = torch.tensor([1.0, 2.0, 0.0, 3.0, 0.3, 1.5])
    for b, block in enumerate(blocks):
        other = state.clone()
        for v in block:
            other[v] = 0.0 if fg.cardinality(v) else 2.5
        local = scaffold.local_log_density(fg, torch.stack([state, other]))[:, b]
        assert torch.allclose(local[1] - local[0], fg.log_joint(other) - fg.log_joint(state), atol=1e-5)
    assert fg.markov_blanket(1) == [0, 2, 3]
    assert fg.scaffold_factors([4]) == [3]


@pytest.mark.parametrize("side", [6, 45])
def test_colouring_is_conflict_free_and_uses_two_colours_on_grids(side: int) -> None:
    fg = FactorGraph()
    fg.add_variables(side * side, cardinality=2)
    edges = [[r * side + c, r * side + c + 1] for r in range(side) for c in range(side - 1)]
    edges += [[r * side + c, (r + 1) * side + c] for r in range(side - 1) for c in range(side)]
    fg.add_table_factors(torch.tensor(edges), torch.zeros(len(edges), 2, 2))
    classes = fg.color_blocks([[v] for v in range(side * side)])
    assert len(classes) == 2  # bipartite: DSATUR (small) and BFS greedy (large) both find 2 colours
    for members in classes:
        chosen = set(members.tolist())
        assert all(not chosen & set(fg.markov_blanket(v)) for v in chosen)
    assert sorted(torch.cat(classes).tolist()) == list(range(side * side))


def test_evidence_and_linear_gaussian_parameters_are_checked() -> None:
    from torch.distributions import constraints

    fg = FactorGraph()
    z, rate = fg.add_variable("z", 2), fg.add_variable("rate", support=constraints.positive)
    for evidence, message in (({"z": math.inf}, "'z' must be finite"), ({"z": math.nan}, "'z' must be finite")):
        with pytest.raises(ValueError, match=message):
            fg.set_evidence(evidence)
    with pytest.raises(ValueError, match="'rate' is outside its support"):
        fg.set_evidence({"rate": -1.0})
    with pytest.raises(ValueError, match="weights and bias must be finite"):
        fg.add_linear_gaussian(rate, [z], [1.0], math.nan, 1.0)


def test_log_joint_refuses_discrete_values_outside_their_domains() -> None:
    fg = FactorGraph()
    a, b = fg.add_variable("a", 2), fg.add_variable("b", 3)
    fg.add_table_factor([a, b], torch.zeros(2, 3))
    for state, name in (([-1.0, 0.0], "a"), ([0.5, 1.0], "a"), ([[0.0, 1.0], [1.0, 3.0]], "b")):
        with pytest.raises(ValueError, match=f"discrete variable '{name}' is not in"):
            fg.log_joint(torch.tensor(state))  # a flat table gather would read another entry
    assert fg.log_factors(torch.tensor([1.0, 2.0]))[0].shape == (1,)


def test_log_joint_without_checks_equals_the_checked_value_on_valid_states() -> None:
    """``check=False`` (a kernel's own states) skips validation only: the same values on valid states."""
    fg = FactorGraph()
    a, b = fg.add_variable("a", 2), fg.add_variable("b", 3)
    fg.add_table_factor([a, b], torch.randn(2, 3, generator=torch.Generator().manual_seed(0)))
    states = torch.tensor([[i, j] for i in range(2) for j in range(3)], dtype=torch.float32)
    assert torch.equal(fg.log_joint(states, check=False), fg.log_joint(states))
    with pytest.raises(ValueError, match="not in"):
        fg.log_joint(torch.tensor([0.0, 3.0]))


def test_blocks_sharing_a_variable_without_factors_conflict() -> None:
    fg = FactorGraph()
    fg.add_variables(3, cardinality=2)
    fg.add_table_factor([0], torch.zeros(2))
    fg.add_table_factor([2], torch.zeros(2))
    assert [c.tolist() for c in fg.color_blocks([[0, 1], [1, 2]])] == [[0], [1]]  # both write variable 1


def test_bad_inputs_raise_clear_errors() -> None:
    fg = FactorGraph()
    fg.add_variable("a", 2)
    with pytest.raises(ValueError, match="duplicate variable name"):
        fg.add_variable("a", 2)
    with pytest.raises(ValueError, match="cardinality"):
        fg.add_variable("b", 1.5)
    with pytest.raises(ValueError, match="unknown variable ids"):
        fg.add_table_factor([3], torch.zeros(2))
    with pytest.raises(ValueError, match="has cardinality 2"):
        fg.add_table_factor([0], torch.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        fg.add_table_factor([0], torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="not in 0..1"):
        fg.set_evidence({"a": 2})
    with pytest.raises(ValueError, match="unknown variable"):
        fg.set_evidence({"zz": 0})
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 1\]"):
        fg.log_joint(torch.zeros(3))
    with pytest.raises(ValueError, match=r"NaN or inf \(inf\) for variable 'a'"):
        fg.log_joint(torch.tensor([float("inf")]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fg.log_joint([0.0])
    with pytest.raises(ValueError, match="scale"):
        fg.add_variable("x")
        fg.add_linear_gaussian(1, [], [], 0.0, -1.0)


def _mixed_graph() -> FactorGraph:
    """Tables, linear-Gaussian, log-linear-Gaussian, mixture and callable factors in one graph."""
    from neuralblock.graph import CallableGroup, GaussianMixtureGroup, LogLinearGaussianGroup

    g = torch.Generator().manual_seed(3)
    fg = FactorGraph()
    fg.add_variables(3, cardinality=3)  # 0-2 discrete
    fg.add_table_factors(torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 3, 3, generator=g))
    cont = [fg.add_variable() for _ in range(4)]  # 3-6
    fg.add_linear_gaussian(cont[1], [cont[0], 0], [0.5, 1.0], 0.2, 1.3)
    fg.add_group(LogLinearGaussianGroup(torch.tensor([cont[2]]), torch.tensor([cont[3]]), *torch.rand(4, 1)))
    points = [[fg.add_variable(), fg.add_variable()] for _ in range(3)]  # 7-12
    means = [[fg.add_variable(), fg.add_variable()] for _ in range(2)]  # 13-16
    active = fg.add_variables(2, cardinality=2)
    fg.add_group(GaussianMixtureGroup(torch.tensor(points), torch.tensor(means), torch.tensor(active), 0.7))
    fg.add_group(CallableGroup(torch.tensor([[cont[0], cont[3]]]), _difference_factor, torch.ones(1, 1)))
    return fg


def _difference_factor(values: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    return -0.5 * ((values[..., 0] - values[..., 1]) / params[:, 0]) ** 2


def _random_states(fg: FactorGraph, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cards = fg.cardinalities
    states = torch.randn(count, fg.num_variables, generator=g)
    for v in range(fg.num_variables):
        if cards[v] > 0:
            states[:, v] = torch.randint(int(cards[v]), (count,), generator=g).float()
    states[:, 17] = 1.0  # a mixture is on (with none, the points' factors are -inf)
    return states


def test_rowwise_scaffold_equals_one_state_per_block() -> None:
    fg = _mixed_graph()
    blocks = [[v] for v in range(fg.num_variables)] + [[0, 3], [13, 17, 14]]
    scaffold = fg.scaffold(blocks)
    states = _random_states(fg, len(blocks), seed=0)
    each = torch.stack([scaffold.local_log_density(fg, states[b])[b] for b in range(len(blocks))])
    rowwise = scaffold.local_log_density_rows(fg, states)
    assert torch.isfinite(rowwise).all()
    torch.testing.assert_close(rowwise, each)
    for group, index, segment in zip(fg.groups, scaffold.group_index, scaffold.group_segment):
        diagonal = group.log_factors(states, index)[segment, torch.arange(index.numel())]
        torch.testing.assert_close(group.log_factors_rows(states, index, segment), diagonal)
        torch.testing.assert_close(super(type(group), group).log_factors_rows(states, index, segment), diagonal)


def test_scaffold_select_and_shared_factors() -> None:
    fg = _mixed_graph()
    blocks = [[13, 14], [15, 16], [17], [0], [3]]  # the first three share the mixture's point factors
    scaffold = fg.scaffold(blocks)
    state = _random_states(fg, 1, seed=1)[0]
    full = scaffold.local_log_density(fg, state)
    direct = torch.tensor([sum(float(v) for v in fg.scaffold([b]).local_log_density(fg, state)) for b in blocks])
    torch.testing.assert_close(full, direct.to(full.dtype))
    part = scaffold.select(1, 4)
    assert part.num_blocks == 3 and part.blocks.tolist() == scaffold.blocks[1:4].tolist()
    torch.testing.assert_close(part.local_log_density(fg, state), full[1:4])
    with pytest.raises(ValueError, match="block range"):
        scaffold.select(2, 9)
    with pytest.raises(ValueError, match="one state per block"):
        scaffold.local_log_density_rows(fg, state[None])


def test_tempered_copy_scales_every_table_and_leaves_the_graph_alone() -> None:
    fg = FactorGraph()
    a, b, c = fg.add_variable("a", 2), fg.add_variable("b", 3), fg.add_variable("c", 2)
    gen = torch.Generator().manual_seed(0)
    fg.add_table_factor([a, b], torch.randn(2, 3, generator=gen))
    fg.add_table_factor([b, c], torch.tensor([[0.0, -math.inf], [1.0, 2.0], [-1.0, 0.5]]))
    fg.add_table_factor([a], torch.randn(2, generator=gen))
    states = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 1.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    fg.groups[0].log_tables.mul_(2.0)  # tables changed in place after compiling (as update_parameters does)
    before = fg.log_joint(states)
    hot = fg.tempered(0.3)
    assert torch.allclose(hot.log_joint(states), 0.3 * before)  # -inf entries stay -inf
    assert torch.equal(fg.log_joint(states), before)
    assert hot.names == fg.names and hot.num_factors == fg.num_factors
    with pytest.raises(ValueError, match="positive finite"):
        fg.tempered(0.0)
    with pytest.raises(ValueError, match="positive finite"):
        fg.tempered(math.inf)
    gaussian = FactorGraph()
    x, y = gaussian.add_variable("x"), gaussian.add_variable("y")
    gaussian.add_linear_gaussian(y, [x], [1.0], 0.0, 1.0)
    with pytest.raises(ValueError, match="table factors only"):
        gaussian.tempered(0.5)


def test_tempered_copy_of_a_compiled_pyro_model_is_plain_scaled_tables() -> None:
    import pyro
    import pyro.distributions as dist

    from neuralblock.graph import TableGroup
    from neuralblock.pyro import from_pyro_model

    def model() -> None:
        a = pyro.sample("a", dist.Categorical(torch.tensor([0.2, 0.8])))
        pyro.sample("b", dist.Categorical(torch.tensor([[0.9, 0.1], [0.3, 0.7]])[a]))

    fg = from_pyro_model(model)
    hot = fg.tempered(0.5)
    states = torch.tensor([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert torch.allclose(hot.log_joint(states), 0.5 * fg.log_joint(states))
    assert all(type(g) is TableGroup for g in hot.groups)  # the model's compiler is not copied along


def test_blocks_that_all_conflict_get_one_class_each_in_block_order() -> None:
    fg = FactorGraph()
    variables = fg.add_variables(6, cardinality=2)
    fg.add_table_factor(variables, torch.zeros((2,) * 6))  # one factor over everything: every pair of blocks conflicts
    blocks = torch.tensor([[4, 5], [0, 1], [2, 3]])
    assert [c.tolist() for c in fg.color_blocks(blocks)] == [[0], [1], [2]]
    assert fg.conflict_graph(blocks).number_of_edges() == 3


def test_a_block_listing_a_variable_twice_does_not_fool_the_all_conflict_shortcut() -> None:
    fg = FactorGraph()
    a, b, c, d = fg.add_variables(4, cardinality=2)
    for u, v in ((a, b), (b, c), (c, d)):
        fg.add_table_factor([u, v], torch.zeros(2, 2))
    classes = fg.color_blocks(torch.tensor([[a, a], [b, -1], [d, -1]]))  # a path a-b .. d: two colours suffice
    assert sorted(len(c) for c in classes) in ([1, 2], [3])
    assert len(classes) <= 2


def test_check_assignment_checks_every_chain_of_a_batch_and_names_the_offending_one() -> None:
    fg = FactorGraph()
    fg.add_variable("a", 3)
    fg.add_variable("rate", support=constraints.positive)
    fg.add_variable("seen", 2)
    fg.set_evidence({"seen": 1})
    good = torch.tensor([[2.0, 0.5, 1.0], [0.0, 3.0, 1.0 + 1e-9]])
    checked = fg.check_assignment(good)
    assert torch.equal(checked, torch.stack([fg.check_assignment(row) for row in good]))
    assert checked[:, 2].tolist() == [1.0, 1.0]  # the evidence itself, not its float rounding
    with pytest.raises(ValueError, match=r"initial value 1.5 of discrete variable 'a' is not in 0..2 \(chain 1\)"):
        fg.check_assignment(torch.tensor([[2.0, 0.5, 1.0], [1.5, 0.5, 1.0]]))
    with pytest.raises(ValueError, match=r"initial value -1 of 'rate' is outside its support \(chain 2\)"):
        fg.check_assignment(torch.tensor([[2.0, 0.5, 1.0], [1.0, 0.5, 1.0], [1.0, -1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"observed variable 'seen' differs from its evidence 1 \(chain 0\)"):
        fg.check_assignment(torch.tensor([[2.0, 0.5, 0.0], [1.0, 0.5, 1.0]]))
    with pytest.raises(ValueError, match=r"outside its support$"):  # one state: no chain named
        fg.check_assignment(torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="one per chain"):
        fg.check_assignment(torch.zeros(2, 2, 3))
