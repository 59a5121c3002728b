"""FactorGraph core: log densities, scaffolds, colouring and input validation."""

from __future__ import annotations

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
    with pytest.raises(ValueError, match="NaN or inf"):
        fg.log_joint(torch.tensor([float("inf")]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fg.log_joint([0.0])
    with pytest.raises(ValueError, match="scale"):
        fg.add_variable("x")
        fg.add_linear_gaussian(1, [], [], 0.0, -1.0)
