"""Vectorized chains (``chains=K``), the fused and compiled paths, and valid starts.

Statistical tests compare visit frequencies of all joint states with enumeration by
batch-means z-scores (each of the K vectorized chains is a chain; 20 batches each) with a
Bonferroni t threshold: false-failure rate at most 1e-3 per test over random seeds.
"""

from __future__ import annotations

import pytest
import torch
from _stats import bonferroni_t, enumerate_joint  # tests/ is on sys.path under pytest
from pyro.infer import MCMC
from test_motif_grid import ising_grid
from test_neural_block_kernel import ChainWindow, chain_graph  # tests/ is on sys.path under pytest

from neuralblock import FactorGraph, GibbsKernel, NeuralBlockKernel
from neuralblock.diagnostics import MarginalErrorTrace, batch_means_mcse, marginal_error
from neuralblock.exact import marginals
from neuralblock.graph.groups import CallableGroup
from neuralblock.kernels.base import find_valid_start
from neuralblock.proposals import NeuralBlockProposal

ALPHA = 1e-3
BATCHES = 20


def assert_matches_enumeration(draws: torch.Tensor, fg: FactorGraph) -> None:
    """``draws [chains, samples, n]`` visit every state as often as its exact probability."""
    states, probs = enumerate_joint(fg)
    hits = (draws[:, :, None, :] == states[None, None]).all(-1).double()
    mean, mcse = batch_means_mcse(hits, BATCHES)
    iid = (probs * (1 - probs) / hits[..., 0].numel()).sqrt()
    z = zero_safe((mean - probs) / torch.maximum(mcse, iid), mean, probs)
    limit = bonferroni_t(len(probs), draws.shape[0] * BATCHES - 1, ALPHA)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f} > {limit:.2f}"


def zero_safe(z: torch.Tensor, mean: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """z-scores where impossible states (probability 0) score 0 if never visited, else infinity."""
    return torch.where(probs == 0, torch.where(mean > 0, torch.inf, 0.0).to(z), z)


def run(kernel, num_samples: int, warmup: int = 100) -> torch.Tensor:
    """Draws of every vectorized chain, ``[K, S, n]``."""
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run()
    x = mcmc.get_samples()["x"]
    assert x.shape == (num_samples, kernel.chains, kernel.fg.num_variables)
    return x.transpose(0, 1)


def mixed_graph(seed: int) -> FactorGraph:
    """Ternary chain with one factor that is not a table (forces Gibbs's general path)."""
    fg = chain_graph(seed)

    def pull(values: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return params[..., 0] * (values[..., 0] == values[..., 1]).to(values.dtype)

    fg.add_group(CallableGroup(torch.tensor([[0, 5]]), pull, torch.tensor([[0.8]])))
    return fg


def binary_loop(seed: int) -> FactorGraph:
    """An 8-cycle of binary variables with random unaries and couplings (Gibbs's logistic path)."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    fg.add_variables(8, cardinality=2)
    fg.add_table_factors(torch.tensor([[v, (v + 1) % 8] for v in range(8)]), 1.5 * torch.randn(8, 2, 2, generator=g))
    fg.add_table_factors(torch.arange(8)[:, None], torch.randn(8, 2, generator=g))
    return fg


@pytest.mark.parametrize("graph", ["tables", "mixed", "binary"])
def test_gibbs_chains_leave_the_joint_invariant(graph: str) -> None:
    fg = {"tables": chain_graph, "mixed": mixed_graph, "binary": binary_loop}[graph](seed=4)
    kernel = GibbsKernel(fg, chains=8)
    draws = run(kernel, 1000)
    assert_matches_enumeration(draws, fg)
    assert kernel.plan.tables_only == (graph != "mixed")
    assert kernel.diagnostics()["chains"] == 8.0


def test_compiled_paths_leave_the_joint_invariant_and_match_eager_draw_for_draw() -> None:
    """The compiled fused updates (Gibbs and neural blocks) are the eager chain: same seed, same states."""
    fg = chain_graph(seed=4, evidence=True)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    outputs = []
    for compile in (False, True):
        torch.manual_seed(3)
        kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.3, chains=8, compile=compile)
        outputs.append(run(kernel, 600))
    eager, compiled = outputs
    assert kernel.diagnostics()["fused"] == {"test-chain-window": True}
    assert kernel.diagnostics()["compile_seconds"] > 0.0
    assert torch.equal(eager, compiled)
    assert_matches_enumeration(compiled, fg)


def test_chains_are_independent_after_a_common_start() -> None:
    fg = chain_graph(seed=1)
    for kernel in (
        GibbsKernel(fg, chains=6),
        NeuralBlockKernel(fg, [NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))], chains=6),
    ):
        start = torch.zeros(6, fg.num_variables)
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, initial_params={"x": start}, disable_progbar=True)
        mcmc.run()
        last = mcmc.get_samples()["x"][-1]
        assert len({tuple(row.tolist()) for row in last}) > 1


def test_processes_multiply_with_vectorized_chains_and_export_every_chain() -> None:
    from neuralblock.diagnostics.export import to_inference_data

    fg = chain_graph(seed=2)
    mcmc = MCMC(GibbsKernel(fg, chains=3), num_samples=40, warmup_steps=5, num_chains=2, disable_progbar=True)
    mcmc.run()
    grouped = mcmc.get_samples(group_by_chain=True)["x"]
    assert grouped.shape == (2, 40, 3, 6)
    idata = to_inference_data(mcmc)
    assert idata.posterior["x"].shape == (6, 40, 6)  # 2 processes x 3 vectorized chains
    assert (idata.posterior["x"].values[4] == grouped[1, :, 1].numpy()).all()  # chain p * K + k


def test_marginal_error_and_its_trace_pool_vectorized_chains() -> None:
    fg = chain_graph(seed=5)
    exact, _ = marginals(fg)
    trace = MarginalErrorTrace(fg, exact, total=300)
    mcmc = MCMC(GibbsKernel(fg, chains=16), num_samples=300, warmup_steps=20, hook_fn=trace, disable_progbar=True)
    mcmc.run()
    x = mcmc.get_samples()["x"]
    pooled = marginal_error(x, fg, exact)
    assert trace.errors[-1] == pytest.approx(pooled, abs=1e-6)
    assert pooled < marginal_error(x[:, 0], fg, exact)  # 16 chains estimate better than one of them
    assert pooled < 0.03


def xor_graph(impossible: bool = False) -> FactorGraph:
    """``a == b == c`` with ``c = 1`` forced: an ancestral start picks ``a = 0`` half the time (zero density)."""
    fg = FactorGraph()
    a, b, c = (fg.add_variable(name, 2) for name in "abc")
    equal = torch.tensor([[0.0, -torch.inf], [-torch.inf, 0.0]])
    fg.add_table_factors(torch.tensor([[a, b], [b, c]]), torch.stack([equal, equal]))
    fg.add_table_factor([c], torch.tensor([-torch.inf, 0.0]))
    if impossible:
        fg.add_table_factor([a], torch.tensor([0.0, -torch.inf]))
    return fg


def test_kernels_find_a_valid_start_or_name_the_impossible_factors() -> None:
    fg = xor_graph()
    torch.manual_seed(0)
    for chains in (1, 32):
        kernel = GibbsKernel(fg, chains=chains)
        kernel.setup(0)
        assert (kernel.initial_params["x"] == 1).all()  # the only state of positive density
    with pytest.raises(ValueError, match=r"zero density: factors over \(a=0, b=1\)"):
        kernel = GibbsKernel(fg)
        kernel.initial_params = {"x": torch.tensor([0.0, 1.0, 1.0])}
        kernel.setup(0)
    with pytest.raises(ValueError, match="no start of positive density.*zero total probability"):
        GibbsKernel(xor_graph(impossible=True), chains=2).setup(0)


def test_find_valid_start_keeps_valid_chains() -> None:
    fg = xor_graph()
    state = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    fixed = find_valid_start(fg, state)
    assert torch.equal(fixed, torch.ones(2, 3))
    assert torch.equal(find_valid_start(fg, fixed), fixed)


def test_neural_block_kernel_repairs_an_impossible_start() -> None:
    fg = chain_graph(seed=0)
    fg.add_table_factor([0, 3], torch.tensor([[0.0, -torch.inf, -torch.inf]] * 3))  # x3 must be 0
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    kernel = NeuralBlockKernel(fg, [proposal], chains=16)
    kernel.setup(0)
    assert (kernel.initial_params["x"][:, 3] == 0).all()
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, disable_progbar=True)
    mcmc.run()
    assert (mcmc.get_samples()["x"][..., 3] == 0).all()
    assert kernel.diagnostics()["nonfinite_rejections"] == 0.0


def test_chains_argument_is_checked() -> None:
    fg = chain_graph(seed=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="chains"):
            GibbsKernel(fg, chains=bad)
    with pytest.raises(ValueError, match=r"shape \[3, 6\]"):
        kernel = GibbsKernel(fg, chains=3)
        kernel.setup(0)
        kernel.sample({"x": torch.zeros(2, 6)})
    with pytest.raises(ValueError, match="compile"):
        GibbsKernel(fg, compile="yes")


def test_fused_path_with_rows_filled_as_chains_visit_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond the tabulation limit, table rows are computed the first time a chain needs them: same law."""
    import neuralblock.kernels.fused_blocks as fused_blocks

    monkeypatch.setattr(fused_blocks, "_PREFILL_ROWS", 0)
    fg = chain_graph(seed=6)
    torch.manual_seed(2)
    kernel = NeuralBlockKernel(fg, [NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))], chains=8)
    draws = run(kernel, 800)
    table = kernel.fused[0].table
    assert 0 < int(table.filled.sum()) <= table.computed  # rows were computed on visits (some twice in one batch)
    fresh = NeuralBlockKernel(fg, kernel.proposals, chains=2)
    fresh.setup(0)
    assert int(fresh.fused[0].table.filled.sum()) == 0  # nothing tabulated at setup
    assert_matches_enumeration(draws, fg)


def test_rows_tabulated_at_setup_equal_rows_computed_on_visits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped setup tabulation and the per-visit path compute the same rows (grid MRF with evidence)."""
    import neuralblock.kernels.fused_blocks as fused_blocks
    from motifs.grid import GridMotif
    from neuralblock import load_pretrained
    from neuralblock.kernels.fused_blocks import BlockTable, BlockTableEnergy

    fg = ising_grid(6, 6, torus=True, coupling=4.0, seed=3)
    fg.set_evidence({0: 1, 15: 0})
    proposal = load_pretrained("grid-mrf-2x2")
    found = GridMotif("mrf", 2).find_instances(fg)
    energy = BlockTableEnergy(fg, found.blocks, [2, 2, 2, 2])
    tabulated = BlockTable(fg, proposal, found, energy, torch.device("cpu"))
    assert tabulated.prefilled and bool(tabulated.filled.all())
    monkeypatch.setattr(fused_blocks, "_PREFILL_ROWS", 0)
    visited = BlockTable(fg, proposal, found, energy, torch.device("cpu"))
    assert not bool(visited.filled.any())
    states = fg.check_state(torch.stack([fg.initial_state(torch.Generator().manual_seed(s)) for s in range(64)]))
    states[:, 0], states[:, 15] = 1.0, 0.0
    rows = torch.arange(len(found))
    visited.ensure(fg, found, visited.keys(states, rows), rows, states)
    filled = visited.filled
    assert int(filled.sum()) > len(found)  # many context values of every instance
    for name in ("cdf", "log_ratio", "energy_rows", "log_q"):
        got, want = getattr(visited, name)[filled], getattr(tabulated, name)[filled]
        assert torch.allclose(got, want, atol=1e-5, equal_nan=True), name
    grid = tabulated.cdf * 2**24  # the CDFs lie on the grid of float32 uniforms: their steps are the draw probabilities
    assert torch.equal(grid, grid.round())


def test_fused_path_follows_new_parameters() -> None:
    """After ``update_graph`` the tabulated rows are recomputed: the chain samples the new target."""
    fg, new = chain_graph(seed=6), chain_graph(seed=6)
    for group in new.groups:
        group.log_tables.mul_(-1.5)
    torch.manual_seed(4)
    kernel = NeuralBlockKernel(fg, [NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))], chains=8)
    kernel.setup(0)
    assert kernel.fused[0].table.prefilled
    kernel.update_graph(new)
    params, draws = kernel.initial_params, []
    for step in range(900):
        params = kernel.sample(params)
        if step >= 100:
            draws.append(params["x"])
    assert kernel.fused[0].table.computed > kernel.fused[0].table.rows  # rows computed again after the update
    assert_matches_enumeration(torch.stack(draws, 1), new)


def test_proposals_load_onto_a_device() -> None:
    from neuralblock import load_pretrained

    proposal = load_pretrained("grid-mrf-2x2", device="cpu")
    assert {p.device.type for p in proposal.parameters()} == {"cpu"}
    with pytest.raises(RuntimeError):
        load_pretrained("grid-mrf-2x2", device="no-such-device")


@pytest.mark.parametrize("budget", [593, 27])  # the dense table holds 33 rows x 9 values x 2 = 594 floats
def test_fused_path_with_rows_in_slots_and_evictions(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    """Beyond the dense table's size, rows live in slots of visited keys (evicted when full): same law."""
    import neuralblock.kernels.fused_blocks as fused_blocks

    monkeypatch.setattr(fused_blocks, "_MAX_CACHE_ENTRIES", budget)
    fg = chain_graph(seed=6)
    torch.manual_seed(3)
    kernel = NeuralBlockKernel(fg, [NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))], chains=8)
    draws = run(kernel, 800)
    table = kernel.fused[0].table
    assert table.slot is not None and not table.prefilled
    stored = table.slot[table.slot >= 0]
    assert len(stored) == table.used and len(set(stored.tolist())) == table.used  # one row per stored key
    assert table.cdf.shape[0] >= table.used and torch.equal(table.filled, table.slot >= 0)
    cache = kernel.diagnostics()["proposal_cache"]["test-chain-window"]
    assert cache["slots"] and cache["evictions"] == table.evictions
    if budget == 27:  # room for one row (a class needs 16): every visit forgets and recomputes its rows
        assert table.evictions > 0 and table.computed > table.rows
    assert_matches_enumeration(draws, fg)


def test_compiled_grid_kernels_pickle_for_worker_processes() -> None:
    """``compile=True`` kernels pickle (``MCMC(num_chains > 1)`` sends copies to workers); each copy compiles anew."""
    import pickle

    from neuralblock.io import read_uai, uai_grid
    from neuralblock.kernels.gibbs import CompiledFunction
    from neuralblock.proposals import load_pretrained

    fg = read_uai(uai_grid("Grids_11"))
    neural = NeuralBlockKernel(fg, [load_pretrained("grid-mrf-2x2")], compile=True)
    for kernel in (neural, GibbsKernel(fg, compile=True)):
        kernel.setup(0)
        copy = pickle.loads(pickle.dumps(kernel))
        updates = [f.update for f in getattr(copy, "fused", []) if f is not None]
        updates += [copy.plan.update] if isinstance(copy, GibbsKernel) else [copy.single_site.gibbs_plan.update]
        assert updates and all(isinstance(u, CompiledFunction) and u._compiled is None for u in updates)


@pytest.mark.parametrize("cards", [[5], [2, 3], [2, 2, 2]])
def test_block_log_q_table_is_the_mixture_of_per_variable_categoricals(cards: list[int]) -> None:
    from neuralblock.kernels.fused_blocks import block_log_q_table
    from neuralblock.motif import BlockSpec, Motif

    class Block(Motif):
        name, block_spec, feature_dim = f"q-table-{len(cards)}", BlockSpec(cards), 3

        def options(self):
            return {}  # noqa: E704

        def find_instances(self, fg):
            raise NotImplementedError  # noqa: E704

        def encode(self, fg, instances, state):
            raise NotImplementedError  # noqa: E704

        def sample_training_batch(self, batch_size, generator):
            raise NotImplementedError  # noqa: E704

    torch.manual_seed(0)
    proposal = NeuralBlockProposal(Block(), components=3, hidden=(8,))
    features, values = torch.randn(7, 3), Block.block_spec.enumerate()
    table = block_log_q_table(proposal, features, values)
    with torch.no_grad():
        mixture = proposal(features)
        logp = mixture.discrete_log_probs  # [7, C, D, kmax]
        per_value = torch.stack(
            [sum(logp[:, :, d, v] for d, v in enumerate(row.long().tolist())) for row in values], -1
        )
        want = torch.logsumexp(mixture.mixture_log_weights.unsqueeze(-1) + per_value, -2)
    assert torch.allclose(table, want, atol=1e-5)
    assert torch.allclose(table.logsumexp(-1), torch.zeros(7), atol=1e-5)
