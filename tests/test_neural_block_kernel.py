"""NeuralBlockKernel: exactness with any proposal, batching, contract and errors.

MH with any proposal that puts mass everywhere is exact, so an *untrained* MDN is
the strongest invariance check (it proposes badly, so every accept/reject decision
matters). Visit frequencies over all 3^6 states are compared with enumeration by
batch-means z-scores (4 chains x 20 batches), Bonferroni t threshold: false-failure
rate at most 1e-3 over random seeds.
"""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch
from _stats import bonferroni_t, enumerate_joint  # tests/ is on sys.path under pytest
from pyro.infer import MCMC
from torch.distributions import constraints

from neuralblock import FactorGraph, NeuralBlockKernel, load_pretrained
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.base import sequential_init
from neuralblock.kernels.neural_block import disjoint_covers, speculative_block_step, speculative_width
from neuralblock.motif import BlockSpec, Motif, MotifInstances, register_motif
from neuralblock.proposals import NeuralBlockProposal


class ChainWindow(Motif):
    """Two consecutive ternary variables of a chain, conditioned on their outer neighbours."""

    name = "test-chain-window"
    block_spec = BlockSpec([3, 3])
    feature_dim = 8

    def options(self) -> dict:
        return {}

    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        n = fg.num_variables
        starts = [v for v in range(n - 1) if v not in fg.evidence and v + 1 not in fg.evidence]
        blocks = torch.tensor([[v, v + 1] for v in starts], dtype=torch.long).reshape(-1, 2)
        context = torch.tensor([[v - 1, v + 2 if v + 2 < n else -1] for v in starts], dtype=torch.long)
        return MotifInstances(blocks, context.reshape(-1, 2), torch.zeros(len(starts), 0))

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: torch.Tensor) -> torch.Tensor:
        ctx = instances.context
        values = torch.where(ctx >= 0, state[..., ctx.clamp(min=0)].long(), torch.full_like(ctx, 3))
        return torch.nn.functional.one_hot(values, 4).flatten(-2).to(state.dtype)

    def sample_training_batch(self, batch_size, generator):  # pragma: no cover - not trained here
        raise NotImplementedError


register_motif(ChainWindow.name, ChainWindow)


def chain_graph(seed: int, evidence: bool = False) -> FactorGraph:
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    fg.add_variables(6, cardinality=3)
    fg.add_table_factors(torch.tensor([[v, v + 1] for v in range(5)]), 1.5 * torch.randn(5, 3, 3, generator=g))
    fg.add_table_factors(torch.arange(6)[:, None], torch.randn(6, 3, generator=g))
    if evidence:
        fg.set_evidence({5: 2})
    return fg


@pytest.mark.parametrize(
    ("gibbs_prob", "evidence", "window", "fused", "chains", "cover"),
    [
        (0.0, False, None, True, 1, False),  # fused path (tabulated proposal), one chain per run
        (0.3, True, None, True, 4, False),  # fused path, 4 vectorized chains
        (0.0, False, 3, False, 1, False),  # general path, speculative batches of classes
        (0.0, False, None, False, 4, False),  # general path, 4 vectorized chains
        (0.0, False, None, True, 4, True),  # fused path, one cover of disjoint blocks per sweep, in turn
        (0.0, False, 2, False, 1, True),  # general path, covers, speculative batches within a cover
    ],
)
def test_neural_block_kernel_leaves_joint_invariant(
    gibbs_prob: float, evidence: bool, window: int | None, fused: bool, chains: int, cover: bool
) -> None:
    fg = chain_graph(seed=4, evidence=evidence)
    states, probs = enumerate_joint(fg)
    torch.manual_seed(11)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    runs = []
    for _ in range(4 // chains):
        kernel = NeuralBlockKernel(
            fg, proposals=[proposal], gibbs_prob=gibbs_prob, window=window, fused=fused, chains=chains, cover=cover
        )
        mcmc = MCMC(kernel, num_samples=1500, warmup_steps=100, disable_progbar=True)
        mcmc.run()
        x = mcmc.get_samples()["x"]
        runs.extend([x] if chains == 1 else x.unbind(1))  # [S, K, n] -> K chains
    assert kernel.diagnostics()["fused"] == {"test-chain-window": fused}
    draws = torch.stack(runs)
    hits = (draws[:, :, None, :] == states[None, None]).all(-1).double()
    mean, mcse = batch_means_mcse(hits, 20)
    iid = (probs * (1 - probs) / hits[..., 0].numel()).sqrt()
    z = (mean - probs) / torch.maximum(mcse, iid)
    limit = bonferroni_t(len(probs), 79)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f}"
    acceptance = kernel.diagnostics()["acceptance_by_proposal"]["test-chain-window"]
    assert 0.0 < acceptance < 1.0
    if window is not None:  # classes were batched speculatively (some draws discarded after an accept)
        assert kernel.diagnostics()["discarded_proposals"] > 0


def test_covers_are_maximal_disjoint_sets_that_hold_every_instance() -> None:
    from motifs.grid import GridMotif
    from neuralblock.io import read_uai, uai_grid

    grid_blocks = GridMotif("mrf").find_instances(read_uai(uai_grid("Grids_12"))).blocks
    for blocks in (grid_blocks, torch.randint(0, 30, (60, 3), generator=torch.Generator().manual_seed(0))):
        blocks = blocks[(blocks.sort(-1).values.diff(dim=-1) > 0).all(-1)]  # (random rows: distinct variables)
        covers = disjoint_covers(blocks)
        assert torch.equal(torch.cat(covers).unique(), torch.arange(len(blocks)))  # every instance in some cover
        for cover in covers:
            held = blocks[cover].reshape(-1)
            assert len(held.unique()) == len(held)  # disjoint
            outside = torch.ones(len(blocks), dtype=torch.bool)
            outside[cover] = False
            assert torch.isin(blocks[outside], held).any(-1).all()  # maximal: every other block meets the cover
    grid = disjoint_covers(grid_blocks)
    assert [len(c) for c in grid] == [25, 20, 20, 16]  # the four tilings of a 10x10 grid by 2x2 windows


def test_covers_that_repeat_instances_follow_new_parameters() -> None:
    """An odd cycle of pairs: some instance is in two covers; refresh() still finds every block (fused and general)."""
    fg = FactorGraph()
    fg.add_variables(5, cardinality=3)
    g = torch.Generator().manual_seed(0)
    fg.add_table_factors(torch.tensor([[v, (v + 1) % 5] for v in range(5)]), torch.randn(5, 3, 3, generator=g))

    class CyclePairs(ChainWindow):
        name = "test-cycle-pairs"

        def find_instances(self, fg: FactorGraph) -> MotifInstances:
            blocks = torch.tensor([[v, (v + 1) % 5] for v in range(5)])
            context = torch.tensor([[(v - 1) % 5, (v + 2) % 5] for v in range(5)])
            return MotifInstances(blocks, context, torch.zeros(5, 0))

    covers = disjoint_covers(CyclePairs().find_instances(fg).blocks)
    assert sum(len(c) for c in covers) > 5  # an instance in two covers
    proposal = NeuralBlockProposal(CyclePairs(), components=2, hidden=(8,))
    for fused in (True, False):
        kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.0, cover=True, fused=fused, chains=2)
        kernel.setup(0)
        params = kernel.sample(kernel.initial_params)
        fg.groups[0].log_tables.mul_(0.5)  # new parameters, same blocks
        kernel._refresh(fg)
        kernel.sample(params)


def test_cover_sweeps_update_one_cover_in_turn() -> None:
    fg = chain_graph(seed=4)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.0, cover=True, chains=3)
    kernel.setup(0)
    assert len(kernel.cover_classes[0]) == 2  # windows (0,1), (2,3), (4,5) and windows (1,2), (3,4)
    params = kernel.initial_params
    for _ in range(4):
        params = kernel.sample(params)
    assert kernel.diagnostics()["acceptance_by_proposal"]["test-chain-window"] > 0
    assert kernel._proposed[0] == 3 * (3 + 2 + 3 + 2)  # chains x (blocks of cover 1, of cover 2, ...)
    with pytest.raises(TypeError, match="cover"):
        NeuralBlockKernel(fg, proposals=[proposal], cover="yes")
    with pytest.raises(ValueError, match="neural_rows"):
        kernel.neural_rows = torch.tensor([True, False])  # 3 chains
        kernel.sample(params)
    kernel.neural_rows = None
    fused = kernel.fused[0]
    assert fused is not None
    for bad in ((2, 1), (0.0, 1.0), (0, 99)):
        with pytest.raises(ValueError, match="classes"):
            fused.sweep(fg, params["x"], classes=bad)  # type: ignore[arg-type]


def test_neural_rows_first_or_anywhere_make_the_same_chains() -> None:
    """Neural chains leading the state (slices) or spread (gathered): the same draws make the same chains."""
    fg = chain_graph(seed=4)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    order = torch.tensor([2, 0, 1])  # chain 0 of the leading layout is chain 2 of the spread one, and so on

    def run(mask: list[bool], start: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(3)
        kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.0, chains=3)  # (no whole-state sweeps)
        kernel.setup(0)
        kernel.neural_rows = torch.tensor(mask)
        params, states = {"x": start}, []
        for _ in range(30):
            params = kernel.sample(params)
            states.append(params["x"])
        assert kernel._rows_lead == mask[0]
        return torch.stack(states)

    start = torch.stack([fg.initial_state()] * 3)
    start[:, 0] = torch.tensor([1.0, 0.0, 1.0])
    leading = run([True, False, False], start)
    spread = run([False, False, True], start[torch.argsort(order)])
    assert torch.equal(leading, spread[:, order])
    assert len(torch.unique(leading.reshape(len(leading), -1), dim=0)) > 1


def test_speculative_step_keeps_classes_up_to_the_first_accept() -> None:
    fg = chain_graph(seed=2)
    torch.manual_seed(0)
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    kernel = NeuralBlockKernel(fg, proposals=[proposal], fused=False)
    kernel.setup(0)
    sweep = kernel.sweeps[0]
    classes = int(sweep.class_of[-1]) + 1
    assert classes >= 2
    state = torch.zeros(6)
    outcomes = set()
    for _ in range(200):
        new, used, info = speculative_block_step(
            fg, kernel.proposals[0], sweep.instances, sweep.scaffold, sweep.class_of, state
        )
        in_used = sweep.class_of < used
        assert len(info.accepted) == int(in_used.sum())
        accepted_classes = sweep.class_of[in_used][info.accepted]
        assert (accepted_classes == used - 1).all()  # only the last class kept can have accepted
        assert used == classes or info.accepted.any()  # stopping early means an accept
        changed = (new != state).nonzero().reshape(-1)
        allowed = sweep.instances.blocks[sweep.class_of == used - 1].reshape(-1)
        assert torch.isin(changed, allowed).all()
        outcomes.add((used, bool(info.accepted.any())))
        state = new
    assert len(outcomes) >= 2  # both stopping at an accept and running through happened


@pytest.mark.parametrize("rate", [1.0, 0.99, 0.7, 0.5, 0.2, 0.05, 0.01, 1e-4])
@pytest.mark.parametrize("cap", [1, 3, 200])
def test_speculative_width_minimises_the_expected_cost_per_decided_class(rate: float, cap: int) -> None:
    """The width is the brute-force minimiser of ``(1 + c w) / E[classes decided]``, within the cap."""
    cost = 0.25
    clamped = max(rate, 1e-3)
    per_class = [(1 + cost * w) * clamped / (1 - (1 - clamped) ** w) for w in range(1, cap + 1)]
    width = speculative_width(rate, cap, cost)
    assert 1 <= width <= cap
    assert per_class[width - 1] == pytest.approx(min(per_class), rel=1e-12)
    if rate >= 0.9:  # most classes accept: batching classes only wastes proposals
        assert width == 1


def test_window_must_be_a_positive_int() -> None:
    fg = chain_graph(seed=0)
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="window"):
            NeuralBlockKernel(fg, proposals=[proposal], window=bad)


def test_instances_are_batched_in_conflict_free_classes() -> None:
    fg = chain_graph(seed=0)
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    kernel = NeuralBlockKernel(fg, proposals=[proposal], fused=False)
    kernel.setup(0)
    classes = kernel.block_classes[0]
    assert sum(len(c.instances) for c in classes) == 5
    for cls in classes:
        writes = cls.instances.blocks.tolist()
        reads = [
            set(b) | set(fg.markov_blanket(b)) | {v for v in c if v >= 0}
            for b, c in zip(writes, cls.instances.context.tolist())
        ]
        for i, block in enumerate(writes):
            for j, read in enumerate(reads):
                assert i == j or not set(block) & read
    assert len(classes) < 5  # some instances share a class


def test_pickles_runs_two_chains_and_reports() -> None:
    fg = chain_graph(seed=1)
    kernel = NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))])
    kernel = pickle.loads(pickle.dumps(kernel))
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=5, num_chains=2, disable_progbar=True)
    mcmc.run()
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 30, 6)
    diag = kernel.diagnostics()
    assert set(diag) >= {"acceptance_by_proposal", "updates_per_second", "nonfinite_rejections", "instances"}
    assert diag["instances"] == {"test-chain-window": 5}
    assert "acc_test-chain-window" in kernel.logging()


def test_reports_before_setup_and_runs_float64_states() -> None:
    fg = chain_graph(seed=1)
    kernel = NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))])
    assert kernel.diagnostics()["instances"] == {} and "acc_test-chain-window" in kernel.logging()
    start = sequential_init(fg).double()  # the network is float32
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=2, initial_params={"x": start}, disable_progbar=True)
    mcmc.run()
    assert kernel.diagnostics()["nonfinite_rejections"] == 0.0


def test_rejects_bad_configuration() -> None:
    fg = chain_graph(seed=1)
    proposal = NeuralBlockProposal(ChainWindow(), components=2, hidden=(8,))
    with pytest.raises(ValueError, match="at least one proposal"):
        NeuralBlockKernel(fg, proposals=[])
    with pytest.raises(ValueError, match="gibbs_prob"):
        NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=1.5)
    with pytest.raises(TypeError, match="NeuralBlockProposal"):
        NeuralBlockKernel(fg, proposals=["grid"])
    with pytest.raises(TypeError, match=r"pass \[proposal\]"):
        NeuralBlockKernel(fg, proposals=proposal)
    with pytest.raises(TypeError, match="a list of NeuralBlockProposal objects, got NoneType"):
        NeuralBlockKernel(fg, proposals=None)
    for wrong_type in ("0.5", True, torch.ones(2)):
        with pytest.raises(TypeError, match="gibbs_prob must be a number"):
            NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=wrong_type)
    with pytest.raises(ValueError, match="gibbs_prob"):
        NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=float("nan"))
    for bad in (-1.0, 0.0, float("nan"), "big"):
        with pytest.raises(ValueError, match="step_size"):
            NeuralBlockKernel(fg, proposals=[proposal], step_size=bad)
    binary = FactorGraph()
    binary.add_variables(4, cardinality=2)
    binary.add_table_factors(torch.tensor([[0, 1], [2, 3]]), torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="domains differ"):
        NeuralBlockKernel(binary, proposals=[proposal]).setup(0)
    single = FactorGraph()
    single.add_variables(1, cardinality=3)
    single.add_table_factor([0], torch.zeros(3))
    with pytest.raises(ValueError, match="no instance"):
        NeuralBlockKernel(single, proposals=[proposal]).setup(0)


class FixedInstances(ChainWindow):
    """Returns given blocks and context (and features of a given shape) whatever the graph."""

    name = "test-fixed-instances"

    def __init__(self, blocks: list, context: list | None = None, spec=None, feature_rows: int | None = None) -> None:
        self.blocks, self.context, self.feature_rows = blocks, context, feature_rows
        if spec is not None:
            self.block_spec = spec

    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        blocks = torch.tensor(self.blocks, dtype=torch.long)
        context = torch.tensor(self.context or [[-1, -1]] * len(self.blocks), dtype=torch.long)
        return MotifInstances(blocks, context, torch.zeros(len(self.blocks), 0))

    def encode(self, fg: FactorGraph, instances: MotifInstances, state: torch.Tensor) -> torch.Tensor:
        return torch.zeros((self.feature_rows or len(instances)), self.feature_dim, dtype=state.dtype)


@pytest.mark.parametrize(
    ("motif", "error"),
    [
        (FixedInstances([[0, 0]]), "same variable twice"),
        (FixedInstances([[0, 6]]), r"ids outside 0\.\.5"),
        (FixedInstances([[-1, 0]]), r"ids outside 0\.\.5"),
        (FixedInstances([[0, 1]], context=[[-2, 3]]), r"context ids outside -1\.\.5"),
        (FixedInstances([[4, 5]]), "observed variable 'x5'"),
    ],
)
def test_rejects_instances_it_cannot_update_exactly(motif: Motif, error: str) -> None:
    fg = chain_graph(seed=1, evidence=True)
    with pytest.raises(ValueError, match=error):
        NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(motif, components=2, hidden=(8,))]).setup(0)


def test_rejects_bounded_continuous_blocks_and_misshapen_features() -> None:
    fg = FactorGraph()
    fg.add_variable("scale", support=constraints.positive)
    fg.add_variable("loc")
    motif = FixedInstances([[0], [1]], context=[[-1, -1]] * 2, spec=BlockSpec([0]))
    with pytest.raises(ValueError, match="'scale', whose support is"):
        NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(motif, components=2, hidden=(8,))]).setup(0)
    chain = chain_graph(seed=1)
    misshapen = FixedInstances([[0, 1], [2, 3], [4, 5]], feature_rows=1)
    proposal = NeuralBlockProposal(misshapen, components=2, hidden=(8,))
    kernel = NeuralBlockKernel(chain, proposals=[proposal], gibbs_prob=0.0)
    kernel.setup(0)
    with pytest.raises(ValueError, match=r"features of shape \(1, 8\)"):
        kernel.sample(kernel.initial_params)


def grid_bn(height: int, width: int, seed: int) -> FactorGraph:
    """A directed grid BN like the UAI 2008 ones: node (r, c) has parents (r, c-1) and (r-1, c)."""
    g = torch.Generator().manual_seed(seed)
    fg = FactorGraph()
    fg.add_variables(height * width, cardinality=2)
    for r in range(height):
        for c in range(width):
            parents = ([r * width + c - 1] if c else []) + ([(r - 1) * width + c] if r else [])
            cpt = torch.rand((2,) * len(parents) + (2,), generator=g).add(0.05)
            cpt = cpt / cpt.sum(-1, keepdim=True)
            fg.add_table_factor([*parents, r * width + c], cpt.log())
    return fg


def test_grid_motif_blocks_leave_a_3x4_grid_bn_invariant() -> None:
    import motifs

    fg = grid_bn(3, 4, seed=2)
    states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=12)))
    probs = torch.softmax(fg.log_joint(states).double(), 0)
    torch.manual_seed(5)
    proposal = NeuralBlockProposal(motifs.get("grid", family="bn", size=2), components=4, hidden=(32,))
    chains = []
    for _ in range(4):
        kernel = NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.2)
        mcmc = MCMC(kernel, num_samples=1500, warmup_steps=100, disable_progbar=True)
        mcmc.run()
        chains.append(mcmc.get_samples()["x"])
    assert kernel.diagnostics()["instances"] == {"grid": 6}
    draws = torch.stack(chains)
    # marginals of every variable and of every 2x2 window's joint value: 12 + 6 * 16 statistics
    assert kernel.diagnostics()["fused"] == {"grid": True}
    blocks = proposal.motif.find_instances(fg).blocks
    codes = (draws[..., blocks] * torch.tensor([8.0, 4.0, 2.0, 1.0])).sum(-1)  # [c, s, 6]
    hits = torch.cat([draws, torch.nn.functional.one_hot(codes.long(), 16).flatten(-2).to(draws.dtype)], -1).double()
    state_codes = (states[:, blocks] * torch.tensor([8.0, 4.0, 2.0, 1.0])).sum(-1).long()  # [K, 6]
    window_probs = torch.zeros(6, 16, dtype=torch.float64).index_put_(
        (torch.arange(6).expand_as(state_codes), state_codes), probs[:, None].expand_as(state_codes), accumulate=True
    )
    exact = torch.cat([(probs[:, None] * states.double()).sum(0), window_probs.flatten()])
    mean, mcse = batch_means_mcse(hits, 20)
    iid = (exact * (1 - exact) / hits[..., 0].numel()).sqrt()
    z = (mean - exact) / torch.maximum(mcse, iid).clamp(min=1e-12)
    limit = bonferroni_t(len(exact), 79)
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f}"


def test_gibbs_prob_zero_warns_when_variables_lie_in_no_block() -> None:
    from motifs.chain import stochastic_volatility_graph

    fg = stochastic_volatility_graph(torch.tensor([0.5, -1.0, 0.2, 0.1, 0.9, -0.3, 0.4]), phi=0.95, sigma=0.2)
    kernel = NeuralBlockKernel(fg, proposals=[load_pretrained("chain")], gibbs_prob=0.0)
    with pytest.warns(RuntimeWarning, match="not ergodic"):
        kernel.setup(0)


def _grid_with_offset(y: torch.Tensor) -> None:
    import pyro
    import pyro.distributions as dist

    theta = pyro.sample("theta", dist.Normal(0.0, 1.0))
    a = pyro.sample("a", dist.Bernoulli(logits=theta))
    b = pyro.sample("b", dist.Bernoulli(logits=theta + a))
    pyro.sample("y", dist.Normal(theta + b, 1.0), obs=y)


def test_a_model_whose_continuous_sites_hide_the_tables_says_how_to_hold_them() -> None:
    from neuralblock import load_pretrained

    proposal = load_pretrained("grid-bn-2x2")
    with pytest.raises(ValueError, match=r"continuous latent sites \['theta'\] keep .* CompoundKernel"):
        NeuralBlockKernel(_grid_with_offset, proposals=[proposal]).setup(0, torch.tensor(0.5))
