"""The NumPy fused updates make the torch functions' very decisions (same seed, same states).

Eager updates of CPU states run in NumPy; ``numpy = False`` on a sweep (or a Gibbs plan)
runs the torch function. Each variant of the fused neural update is run both ways from one
seed: the untempered rows, the tempered rows of replica exchange, the ``beta`` correction,
softened zeros, rows in slots with evictions and rows filled as chains visit them. So is
each path of the fused Gibbs update: binary variables, Gumbel-max over more values, masked
values (mixed cardinalities), tempered chains and softened zeros. The Gibbs functions may add
a variable's factor terms in different orders from 5 factors per variable (then the chains
agree in distribution only), so those cases have at most 4; a 5-factor torus checks the NumPy
Gibbs path against enumeration. Invariance of the NumPy paths is also tested wherever the
fused paths are (they are the default for small CPU states).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_motif_grid import ising_grid
from test_neural_block_kernel import ChainWindow, chain_graph  # tests/ is on sys.path under pytest
from test_replica_exchange import constrained_chain
from test_vectorized_chains import assert_matches_enumeration, binary_loop, run

import neuralblock.kernels.fused_blocks as fused_blocks
from neuralblock import FactorGraph, GibbsKernel, NeuralBlockKernel, ReplicaExchange
from neuralblock.kernels.functional import use_numpy
from neuralblock.kernels.fused_blocks import FusedBlockSweep, fused_class_update, fused_class_update_numpy
from neuralblock.kernels.gibbs import NUMPY_MAX_ENTRIES, GibbsPlan
from neuralblock.proposals import NeuralBlockProposal


def fused_sweeps(kernel: GibbsKernel | NeuralBlockKernel | ReplicaExchange) -> list[FusedBlockSweep | GibbsPlan]:
    """The kernel's fused neural sweeps and Gibbs plans of table factors."""
    inner = kernel.inner if isinstance(kernel, ReplicaExchange) else kernel
    if isinstance(inner, GibbsKernel):
        plans = [inner.plan]
    else:
        plans = [inner.single_site.gibbs_plan, *(f for f in inner.fused if isinstance(f, FusedBlockSweep))]
    return [p for p in plans if isinstance(p, FusedBlockSweep) or (isinstance(p, GibbsPlan) and p.tables_only)]


def chain_of_states(
    make, steps: int, use_numpy: bool, warmup: int = 20, jit: bool = False
) -> tuple[torch.Tensor, object]:
    """Every state of ``steps`` transitions of ``make()`` from seed 7, with the NumPy updates on or off.

    ``jit``: the NumPy path runs the compiled loops of :mod:`neuralblock.kernels.jit` (else the NumPy functions).
    """
    torch.manual_seed(7)
    kernel = make()
    kernel.setup(warmup)
    sweeps = fused_sweeps(kernel)
    assert sweeps, "the test needs a fused path"
    for sweep in sweeps:
        sweep.numpy = use_numpy
        sweep.jit = jit
    params, states = kernel.initial_params, []
    for _ in range(steps):
        params = kernel.sample(params)
        states.append(params["x"].clone())
    return torch.stack(states), kernel


def proposal() -> NeuralBlockProposal:
    torch.manual_seed(0)
    return NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))


CASES = {
    "plain": lambda q: NeuralBlockKernel(chain_graph(seed=4, evidence=True), [q], gibbs_prob=0.2, chains=6),
    "one chain": lambda q: NeuralBlockKernel(chain_graph(seed=5), [q], gibbs_prob=0.0, chains=1),
    # warmup: untempered rows with the beta correction; after it: each temperature's own rows
    "tempered": lambda q: ReplicaExchange(
        chain_graph(seed=4), [q], replicas=3, max_temperature=4.0, chains=2, neural_replicas=None
    ),
    "coldest replica neural, covers": lambda q: ReplicaExchange(
        chain_graph(seed=4), [q], replicas=4, chains=2, neural_replicas=1
    ),
    "untempered rows": lambda q: ReplicaExchange(
        chain_graph(seed=4), [q], replicas=3, max_temperature=4.0, chains=2, tempered_proposals=False
    ),
    "soft zeros": lambda q: ReplicaExchange(
        constrained_chain(seed=4), [q], replicas=4, max_temperature=6.0, chains=2, neural_replicas=None
    ),
    "soft zeros, T = 1 neural": lambda q: ReplicaExchange(
        constrained_chain(seed=4), [q], replicas=4, max_temperature=6.0, chains=2
    ),
    "soft zeros, untempered": lambda q: ReplicaExchange(
        constrained_chain(seed=4), [q], replicas=4, max_temperature=6.0, chains=2, tempered_proposals=False
    ),
}


def mixed_cardinalities(seed: int) -> FactorGraph:
    """Binary and ternary variables in one colour class: the masked Gibbs update."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    for v in range(6):
        fg.add_variable(f"x{v}", 2 + v % 2)
    for v in range(5):
        fg.add_table_factor([v, v + 1], 1.5 * torch.randn(2 + v % 2, 3 - v % 2, generator=g))
    return fg


GIBBS_CASES = {
    "binary": lambda: GibbsKernel(binary_loop(seed=2), chains=5),
    "ternary": lambda: GibbsKernel(chain_graph(seed=4, evidence=True), chains=5),
    "one chain": lambda: GibbsKernel(chain_graph(seed=3), chains=1),
    "masked": lambda: GibbsKernel(mixed_cardinalities(seed=1), chains=5),
    "tempered binary": lambda: ReplicaExchange(binary_loop(seed=2), replicas=3, max_temperature=4.0, chains=2),
    "tempered ternary": lambda: ReplicaExchange(chain_graph(seed=4), replicas=3, max_temperature=4.0, chains=2),
    "soft zeros": lambda: ReplicaExchange(constrained_chain(seed=4), replicas=4, max_temperature=6.0, chains=2),
}


@pytest.mark.parametrize("case", list(GIBBS_CASES))
def test_numpy_and_torch_gibbs_sweeps_make_the_same_chain(case: str) -> None:
    torch_states, _ = chain_of_states(GIBBS_CASES[case], 120, use_numpy=False)
    numpy_states, _ = chain_of_states(GIBBS_CASES[case], 120, use_numpy=True)
    assert torch.equal(torch_states, numpy_states)
    assert len(torch.unique(numpy_states.reshape(len(numpy_states), -1), dim=0)) > 5  # the chains move


def test_numpy_gibbs_on_five_factors_per_variable_keeps_the_joint() -> None:
    """A 3x3 Ising torus (a unary and 4 couplings per variable): the default NumPy sweeps sample the joint."""
    fg = ising_grid(3, 3, torus=True, coupling=0.8, seed=2)
    torch.manual_seed(5)
    kernel = GibbsKernel(fg, chains=8)
    draws = run(kernel, 1500)
    assert kernel.plan.numpy is None and kernel.plan.fused[0].index.shape[0] == 5  # by size; depth 5
    assert use_numpy(None, torch.zeros(8, fg.num_variables), NUMPY_MAX_ENTRIES)
    assert_matches_enumeration(draws, fg)


def test_states_numpy_cannot_hold_take_the_torch_functions() -> None:
    """bfloat16 states (no NumPy dtype) sweep through torch whatever the setting."""
    fg = chain_graph(seed=3)
    plan = GibbsPlan(fg, list(range(fg.num_variables)))
    state = torch.zeros(2, fg.num_variables, dtype=torch.bfloat16)
    for setting in (None, True):
        plan.numpy = setting
        new, stuck = plan.sweep(fg, state)
        assert new.dtype == torch.bfloat16 and int(stuck) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_numpy_and_torch_updates_make_the_same_chain(case: str) -> None:
    q = proposal()
    torch_states, _ = chain_of_states(lambda: CASES[case](q), 120, use_numpy=False)
    numpy_states, kernel = chain_of_states(lambda: CASES[case](q), 120, use_numpy=True)
    assert torch.equal(torch_states, numpy_states)
    assert len(torch.unique(numpy_states.reshape(len(numpy_states), -1), dim=0)) > 5  # the chains move
    if case == "tempered":
        assert kernel.diagnostics()["tempered_sweeps"] > 0  # the tempered rows were read


@pytest.mark.parametrize(("prefill", "budget"), [(0, None), (0, 27)])
def test_numpy_updates_follow_rows_filled_on_visits_and_slots(
    monkeypatch: pytest.MonkeyPatch, prefill: int, budget: int | None
) -> None:
    """Rows computed as chains visit them, and rows in slots with evictions: the same chain both ways."""
    monkeypatch.setattr(fused_blocks, "_PREFILL_ROWS", prefill)
    if budget is not None:
        monkeypatch.setattr(fused_blocks, "_MAX_CACHE_ENTRIES", budget)
    q = proposal()

    def make() -> NeuralBlockKernel:
        return NeuralBlockKernel(chain_graph(seed=6), [q], gibbs_prob=0.1, chains=4)

    torch_states, _ = chain_of_states(make, 100, use_numpy=False)
    numpy_states, kernel = chain_of_states(make, 100, use_numpy=True)
    assert torch.equal(torch_states, numpy_states)
    table = next(s for s in fused_sweeps(kernel) if isinstance(s, FusedBlockSweep)).table
    assert not table.prefilled and (budget is None or table.evictions > 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_update_equals_the_torch_function_on_random_rows(dtype: torch.dtype) -> None:
    """Per-instance place values, impossible current values (-inf rows), NaN-free draws: equal outputs."""
    g = torch.Generator().manual_seed(3)
    chains, count, n, width = 5, 4, 10, 4
    state = torch.randint(0, 2, (chains, n), generator=g).to(dtype)
    context = torch.stack([torch.randperm(n, generator=g)[:4] for _ in range(count)])  # [I, c + b]: 2 + 2
    ids, block_ids = context.reshape(-1), context[:, 2:].reshape(-1)
    context_radix = torch.tensor([[1.0, 2.0]] * 2 + [[2.0, 1.0]] * 2, dtype=dtype)  # per instance
    block_radix = torch.tensor([2.0, 1.0], dtype=dtype)
    base = torch.arange(count) * 4
    log_q = torch.randn(count * 4, width, generator=g)
    cdf = fused_blocks._draw_cdf(log_q, torch.float32)
    log_ratio = torch.randn(count * 4, width, generator=g)
    log_ratio[::3, 0] = -torch.inf  # impossible values: -inf - -inf = NaN ratios are rejected
    draws = torch.rand(chains, count, generator=g)
    log_accept = torch.rand(chains, count, generator=g, dtype=torch.float64).log()
    values = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=dtype)
    args = (ids, context_radix, block_radix, block_ids, base, cdf, log_ratio, draws, log_accept, values)
    new, accepted, finite = fused_class_update(state, *args)
    work = state.numpy().copy()
    got_accepted, got_finite = fused_class_update_numpy(work, *(a.numpy() for a in args))
    assert np.array_equal(work, new.numpy())
    assert np.array_equal(got_accepted, accepted.numpy()) and np.array_equal(got_finite, finite.numpy())
    assert not bool(finite.all()) and bool(accepted.any())  # both kinds of decision were exercised
