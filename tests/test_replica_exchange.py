"""ReplicaExchange: the beta = 1 target and every tempered replica's target are invariant; swaps and ladder.

Statistical tests compare visit frequencies of all 3^6 joint states with enumeration by
batch-means z-scores (each ensemble a chain, 20 batches) with a Bonferroni t threshold:
false-failure rate at most 1e-3 per compared distribution over random seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pyro.infer import MCMC
from test_neural_block_kernel import ChainWindow, chain_graph  # tests/ is on sys.path under pytest
from test_vectorized_chains import assert_matches_enumeration, enumerate_joint, zero_safe

from neuralblock import FactorGraph, NeuralBlockKernel, ReplicaExchange
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.replica_exchange import geometric_ladder, swap_replicas
from neuralblock.proposals import NeuralBlockProposal


def coupled_chain(seed: int) -> FactorGraph:
    """The ternary test chain with stronger couplings, so the hot replicas differ from the cold one."""
    fg = chain_graph(seed)
    for group in fg.groups:
        group.log_tables.mul_(2.0)
    return fg


@pytest.mark.parametrize("inner", ["gibbs", "neural", "neural, covers"])
def test_beta_one_replica_samples_the_target(inner: str) -> None:
    fg = coupled_chain(seed=4)
    torch.manual_seed(7)
    proposals = None if inner == "gibbs" else [NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))]
    covers = inner.endswith("covers")  # and neural sweeps in the two coldest replicas only
    kernel = ReplicaExchange(
        fg, proposals, replicas=4, max_temperature=6.0, chains=8, cover=covers, neural_replicas=2 if covers else None
    )
    mcmc = MCMC(kernel, num_samples=1000, warmup_steps=150, disable_progbar=True)
    mcmc.run()
    x = mcmc.get_samples()["x"]  # [S, K, n]
    assert x.shape == (1000, 8, 6)
    assert_matches_enumeration(x.transpose(0, 1), fg)
    diag = kernel.diagnostics()
    assert len(diag["temperatures"]) == 4 and diag["temperatures"][0] == 1.0
    assert diag["temperatures"][-1] == pytest.approx(6.0)
    assert all(0.0 < rate <= 1.0 for rate in diag["swap_acceptance"])
    if inner.startswith("neural"):
        acceptance = torch.tensor(diag["block_acceptance_by_temperature"])
        assert len(acceptance) == 4 and bool(acceptance[2:].isnan().all()) == covers
        inner_kernel = kernel.inner
        assert isinstance(inner_kernel, NeuralBlockKernel)
        offered = inner_kernel._proposed_per_chain[0].reshape(4, 8).sum(-1)  # per replica, post-warmup
        assert float(offered.sum()) == inner_kernel._proposed[0] and bool((offered[2:] == 0).all()) == covers
        accepted = inner_kernel._accepted_per_chain[0].reshape(4, 8).sum(-1)
        assert acceptance[:2].tolist() == pytest.approx((accepted[:2] / offered[:2]).tolist())
        assert diag["tempered_proposals"]  # built at setup for the initial ladder, then used


def test_powered_rows_from_setup_or_only_the_coldest_replicas_neural_while_the_ladder_adapts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Powered rows are built at setup for the initial ladder and serve every neural replica in warmup too; where
    they cannot be built (a table filled as chains visit rows), the untempered proposal misfits the hot replicas,
    so in warmup only the coldest take neural sweeps."""
    import neuralblock.kernels.fused_blocks as fused_blocks

    fg = coupled_chain(seed=4)
    torch.manual_seed(3)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))

    def rows_in_and_after_warmup(**options: object) -> tuple[list[bool] | None, list[bool] | None, bool]:
        kernel = ReplicaExchange(fg, [proposal], replicas=4, max_temperature=6.0, chains=2, gibbs_prob=0.0, **options)
        kernel.setup(10)
        built = bool(kernel._tempered)  # at setup, before any transition
        params = kernel.sample(kernel.initial_params)
        assert isinstance(kernel.inner, NeuralBlockKernel)
        during = kernel.inner.neural_rows
        for _ in range(10):  # the rest of warmup, then one transition after it
            params = kernel.sample(params)
        after = kernel.inner.neural_rows
        table = kernel.inner.fused[0].table  # type: ignore[union-attr]
        # rows for the fixed ladder wherever the table is full by then (a table filled on visits may be)
        assert bool(kernel._tempered) == (kernel.tempered_proposals and table.prefilled)
        return (None if during is None else during.tolist()), (None if after is None else after.tolist()), built

    assert rows_in_and_after_warmup() == (None, None, True)
    assert rows_in_and_after_warmup(warmup_neural_replicas=2) == (None, None, True)  # (rows exist: moot)
    assert rows_in_and_after_warmup(tempered_proposals=False) == (None, None, False)  # the same proposal throughout
    # with fewer neural replicas than temperatures their hottest moves in warmup: rows for the fixed ladder
    assert rows_in_and_after_warmup(neural_replicas=2) == ([True] * 2 + [False] * 6, [True] * 4 + [False] * 4, False)
    monkeypatch.setattr(fused_blocks, "_PREFILL_ROWS", 0)  # rows filled as chains visit them: no powered rows
    assert rows_in_and_after_warmup() == ([True] * 2 + [False] * 6, None, False)  # replica-major: T = 1 of both
    assert rows_in_and_after_warmup(warmup_neural_replicas=2) == ([True] * 4 + [False] * 4, None, False)
    assert rows_in_and_after_warmup(warmup_neural_replicas=None) == (None, None, False)  # as after warmup
    assert rows_in_and_after_warmup(adapt=False) == (None, None, False)  # a fixed ladder: no warmup rows to hold
    assert rows_in_and_after_warmup(neural_replicas=2, warmup_neural_replicas=3) == ([True] * 4 + [False] * 4,) * 2 + (
        False,
    )
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="warmup_neural_replicas"):
            ReplicaExchange(fg, [proposal], warmup_neural_replicas=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("tempered_tables", [None, 2])
def test_every_replica_samples_its_tempered_target(tempered_tables: int | None) -> None:
    """With a fixed ladder, replica r's states follow p^(beta_r) (swaps and tempered sweeps are both exact).

    With two tables (T = 1 and 5), the T = 2 replica proposes from T = 5's rows, its ratio corrected by its beta.
    """
    fg = coupled_chain(seed=3)
    states, _ = enumerate_joint(fg)
    log_p = fg.log_joint(states).double()
    temperatures = [1.0, 2.0, 5.0]
    torch.manual_seed(1)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    kernel = ReplicaExchange(
        fg, [proposal], temperatures=temperatures, chains=8, adapt=False, neural_replicas=None,
        tempered_tables=tempered_tables,
    )  # fmt: skip
    kernel.setup(0)
    params = kernel.initial_params
    draws = []
    for step in range(1100):
        params = kernel.sample(params)
        if step >= 100:
            draws.append(kernel.replica_states.clone())
    replicas = torch.stack(draws, 2)  # [R, K, S, n]
    for r, temperature in enumerate(temperatures):
        probs = torch.softmax(log_p / temperature, 0)
        hits = (replicas[r][:, :, None, :] == states[None, None]).all(-1).double()
        mean, mcse = batch_means_mcse(hits, 20)
        iid = (probs * (1 - probs) / hits[..., 0].numel()).sqrt()
        z = (mean - probs) / torch.maximum(mcse, iid)
        from scipy import stats

        limit = stats.t.ppf(1 - 1e-3 / (2 * len(probs)), df=8 * 20 - 1)
        assert z.abs().max() <= limit, f"replica {r} (T={temperature}): max |z| = {z.abs().max():.2f}"
    assert kernel.diagnostics()["temperatures"] == temperatures  # no adaptation
    assert kernel.diagnostics()["tempered_proposals"]  # each replica proposed from its tempered model
    assert kernel.diagnostics()["tempered_sweeps"] > 500  # and the sweeps read the tempered tables
    fused = kernel.inner.fused[0]
    assert fused is not None and fused.tempered is not None
    assert fused.tempered.betas.tolist() == pytest.approx([1.0, 0.2] if tempered_tables else [1.0, 0.5, 0.2])
    assert kernel.diagnostics()["tempered_tables"] == (2 if tempered_tables else 3)
    acceptance = kernel.diagnostics()["block_acceptance_by_temperature"]
    assert all(0 < a < 1 for a in acceptance)


def test_tempered_rows_hold_the_powered_proposal_and_the_tempered_energy() -> None:
    """Row block r: the drawn proposal raised to beta_r (normalized), and block energies times beta_r."""
    fg = coupled_chain(seed=5)
    torch.manual_seed(2)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    kernel = ReplicaExchange(fg, [proposal], temperatures=[1.0, 3.0, 7.0], chains=2, adapt=False, neural_replicas=None)
    kernel.setup(0)
    kernel.sample(kernel.initial_params)
    fused = kernel.inner.fused[0]
    assert fused is not None and fused.tempered is not None
    table, tempered = fused.table, fused.tempered
    rows = table.rows

    def drawn(cdf: torch.Tensor) -> torch.Tensor:
        return torch.diff(cdf.double(), dim=-1, prepend=torch.zeros(cdf.shape[0], 1, dtype=torch.float64))

    q = drawn(table.cdf)
    for r, beta in enumerate(tempered.betas.tolist()):
        block = slice(r * rows, (r + 1) * rows)
        want = q**beta / (q**beta).sum(-1, keepdim=True)
        assert torch.allclose(drawn(tempered.cdf[block]), want, atol=1e-6), beta
        log_ratio = table.energy_rows.double() * beta - drawn(tempered.cdf[block]).log()
        assert torch.allclose(tempered.log_ratio[block].double(), log_ratio, atol=1e-4), beta
    assert torch.equal(tempered.cdf[:rows], table.cdf)  # beta = 1: the kernel's own table
    assert torch.allclose(tempered.log_ratio[:rows], table.log_ratio)
    beta = torch.tensor([1.0, 1.0, 1 / 3, 1 / 3, 1 / 7, 1 / 7]).float()
    assigned = tempered.assign(beta)
    assert assigned is not None and assigned[0].tolist() == [0, 0, rows, rows, 2 * rows, 2 * rows]
    assert torch.equal(assigned[1], tempered.betas.repeat_interleave(2))  # on the ladder: no correction
    between = tempered.assign(torch.tensor([0.5]).float())  # between T = 1 and 3: the hotter table's rows
    assert between is not None and between[0].tolist() == [rows] and between[1].tolist() == pytest.approx([1 / 3])
    assert tempered.assign(torch.tensor([0.1]).float()) is None  # hotter than every table: untempered path


def test_hot_rows_of_a_sharp_proposal_draw_every_possible_block_value() -> None:
    """Values too unlikely for the float32 CDF at beta = 1 (a step of 0) are drawn at beta = 0.1 (powers of log q)."""
    from test_motif_grid import ising_grid

    from neuralblock import NeuralBlockKernel, load_pretrained

    fg = ising_grid(6, 6, torus=True, coupling=8.0, seed=1)
    kernel = NeuralBlockKernel(fg, [load_pretrained("grid-mrf-2x2")], chains=2)
    kernel.setup(0)
    assert kernel.temper(torch.tensor([1.0, 0.1]))
    fused = kernel.fused[0]
    assert fused is not None and fused.tempered is not None
    rows, cdf = fused.table.rows, fused.tempered.cdf
    steps = torch.diff(cdf.double(), dim=-1, prepend=torch.zeros(cdf.shape[0], 1, dtype=torch.float64))
    possible = torch.isfinite(fused.table.energy_rows)
    assert bool((steps[:rows][possible] == 0).any())  # the cold CDF never draws some possible values
    assert bool((steps[rows:][possible] > 0).all())  # the hot one draws all of them
    grid = cdf * 2**24
    assert torch.equal(grid, grid.round())  # on the grid of float32 uniforms: steps are the draw probabilities


def test_swaps_follow_the_exact_probability() -> None:
    torch.manual_seed(0)
    beta = torch.tensor([1.0, 0.25], dtype=torch.float64)
    states = torch.tensor([[[0.0]] * 20000, [[1.0]] * 20000]).reshape(2, 20000, 1)
    log_p = torch.tensor([[-1.0] * 20000, [-3.0] * 20000], dtype=torch.float64)
    new, new_log_p, prob = swap_replicas(states, log_p, beta, parity=0)
    expected = torch.tensor((1.0 - 0.25) * (-3.0 + 1.0)).exp()  # the cold replica would take the worse state
    assert prob[0, 0] == pytest.approx(float(expected))
    swapped = (new[0, :, 0] == 1.0).double().mean()
    assert abs(float(swapped) - float(expected)) < 4 * (float(expected) * (1 - float(expected)) / 20000) ** 0.5
    assert torch.equal(new_log_p[0], torch.where(new[0, :, 0] == 1.0, -3.0, -1.0).double())
    same, _, none = swap_replicas(states, log_p, beta, parity=1)  # no pair (1, 2) with two replicas
    assert torch.equal(same, states) and none.numel() == 0


def test_ladder_adapts_towards_equal_swap_rates() -> None:
    fg = coupled_chain(seed=0)
    kernel = ReplicaExchange(fg, replicas=4, max_temperature=8.0)
    kernel.setup(0)
    before = kernel.temperatures.clone()
    kernel._swap_rate = np.array([0.9, 0.1, 0.5])  # pair 0 swaps too easily
    kernel._adapt_ladder()
    after = kernel.temperatures
    assert after[0] == 1.0 and after[-1] == pytest.approx(8.0)
    assert (after.diff() > 0).all()
    assert after[1] - after[0] > before[1] - before[0]  # a wider first gap lowers its swap rate
    assert after[2] - after[1] < before[2] - before[1]


def test_barrier_adaptation_splits_the_rounds_barrier_evenly() -> None:
    """One round's rejection rates 0.1, 0.9, 0.5 put the barrier at 0, 0.1, 1.0, 1.5 along the ladder: the new
    inverse temperatures sit at its thirds (0.5 and 1.0), interpolated linearly in beta."""
    kernel = ReplicaExchange(coupled_chain(seed=0), replicas=4, max_temperature=8.0)
    kernel.setup(0)
    before = kernel.temperatures.clone()
    kernel._round_sum[:] = [9.0, 1.0, 5.0]  # acceptance 0.9, 0.1, 0.5 over 10 attempts each
    kernel._round_count[:] = 10.0
    kernel._barrier_ladder()
    after = kernel.temperatures
    betas = 1.0 / before
    expected_second = 1.0 / (betas[1] + (0.5 - 0.1) / 0.9 * (betas[2] - betas[1]))
    assert after[0] == 1.0 and after[-1] == pytest.approx(8.0) and after[2] == pytest.approx(float(before[2]))
    assert after[1] == pytest.approx(float(expected_second))
    assert after[1] > before[1]  # the pair that swapped too easily gets a wider gap
    assert not kernel._round_count.any() and not kernel._round_sum.any()  # the next round starts afresh


def test_barrier_adaptation_evens_swap_rates_in_warmup() -> None:
    """From a ladder far too wide at the hot end, 300 warmup transitions of rounds even the post-warmup swap
    rates: their spread falls from over 0.8 (the unadapted ladder, the same seed and chains) to under 0.2."""
    spreads = {}
    for adapt in (False, True):
        torch.manual_seed(0)
        kernel = ReplicaExchange(coupled_chain(seed=0), temperatures=[1.0, 1.1, 1.2, 30.0], chains=16, adapt=adapt)
        mcmc = MCMC(kernel, num_samples=300, warmup_steps=300, disable_progbar=True)
        mcmc.run()
        rates = torch.tensor(kernel.diagnostics()["swap_acceptance"])
        spreads[adapt] = float(rates.max() - rates.min())
    assert spreads[False] > 0.8 and spreads[True] < 0.2  # (seeds 0-7: 0.96-0.97 against 0.02-0.05)


def test_rejects_bad_options_and_continuous_models() -> None:
    fg = chain_graph(seed=0)
    with pytest.raises(ValueError, match="start at 1"):
        ReplicaExchange(fg, temperatures=[2.0, 3.0])
    with pytest.raises(ValueError, match="increase"):
        ReplicaExchange(fg, temperatures=[1.0, 1.0])
    with pytest.raises(ValueError, match="replicas"):
        ReplicaExchange(fg, replicas=0)
    with pytest.raises(ValueError, match="max_temperature"):
        ReplicaExchange(fg, replicas=3, max_temperature=0.5)
    with pytest.raises(ValueError, match="adaptation must be"):
        ReplicaExchange(fg, replicas=3, adaptation="steps")
    continuous = FactorGraph()
    x = continuous.add_variable("x")
    continuous.add_linear_gaussian(x, [], [], 0.0, 1.0)
    with pytest.raises(ValueError, match="discrete latent variables only"):
        ReplicaExchange(continuous, replicas=2).setup(0)
    assert geometric_ladder(1, 5.0).tolist() == [1.0]


def _with_a_callable_factor(fg: FactorGraph) -> FactorGraph:
    """The graph plus one factor that is not a table (a batched function of x0 and x1)."""
    fg.add_callable_factors(
        torch.tensor([[0, 1]]), lambda values, params: -0.3 * (values[..., 0] - values[..., 1]) ** 2
    )
    return fg


def test_neural_replicas_keep_the_untempered_proposal_where_it_cannot_be_tempered() -> None:
    """A graph with a non-table factor, and new parameters (update_graph): untempered proposals, still exact."""
    torch.manual_seed(0)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    mixed = _with_a_callable_factor(coupled_chain(seed=2))
    kernel = ReplicaExchange(mixed, [proposal], temperatures=[1.0, 3.0], chains=2, adapt=False)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    mcmc.run()  # used to raise: tempered copies are made of table factors only
    assert not kernel.diagnostics()["tempered_proposals"] and kernel.diagnostics()["tempered_sweeps"] == 0
    tables = ReplicaExchange(coupled_chain(seed=2), [proposal], temperatures=[1.0, 3.0], chains=2, adapt=False)
    tables.setup(0)
    params = tables.sample(tables.initial_params)
    assert tables.diagnostics()["tempered_proposals"]
    sweeps = tables.diagnostics()["tempered_sweeps"]
    tables.update_graph(coupled_chain(seed=3))  # new parameter values: the replicas go back to the untempered proposal
    for _ in range(3):
        params = tables.sample(params)
    assert not tables.diagnostics()["tempered_proposals"]
    assert tables.inner.fused[0] is not None and tables.inner.fused[0].tempered is None  # the old rows are gone
    assert tables.diagnostics()["tempered_sweeps"] == sweeps  # and no sweep read them


def constrained_chain(seed: int) -> FactorGraph:
    """The coupled chain with hard equality constraints ``x0 = x1`` and ``x3 = x4`` (table entries of potential 0).

    Single-site Gibbs cannot change a constrained pair, and a power ``p^beta`` keeps the zeros:
    only replicas whose zeros are softened cross between the pairs' values.
    """
    fg = chain_graph(seed)
    equal = torch.zeros(3, 3).masked_fill(~torch.eye(3, dtype=torch.bool), -float("inf"))
    fg.add_table_factors(torch.tensor([[0, 1], [3, 4]]), torch.stack([equal, equal]))
    for group in fg.groups:  # the couplings of coupled_chain (the zeros stay zeros)
        group.log_tables.mul_(2.0)
    return fg


def run_mcmc(kernel: ReplicaExchange, num_samples: int, warmup: int) -> torch.Tensor:
    """The ``beta = 1`` draws ``[K, S, n]`` of a run inside ``pyro.infer.MCMC``."""
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()["x"].transpose(0, 1)


@pytest.mark.parametrize("inner", ["gibbs", "neural"])
def test_softened_replicas_cross_hard_zeros_and_keep_the_target(inner: str) -> None:
    fg = constrained_chain(seed=4)
    torch.manual_seed(5)
    proposals = None if inner == "gibbs" else [NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))]
    kernel = ReplicaExchange(fg, proposals=proposals, replicas=4, max_temperature=6.0, chains=8, gibbs_prob=0.7)
    draws = run_mcmc(kernel, num_samples=1500, warmup=150)
    diag = kernel.diagnostics()
    assert diag["zero_penalty"] == 0.5  # "auto"
    assert diag["swap_acceptance"][0] > 0.02  # the cold replica takes states from the softened ones
    assert_matches_enumeration(draws, fg)
    frozen = ReplicaExchange(fg, replicas=4, max_temperature=6.0, chains=8, zero_penalty=None)
    frozen.setup(0)
    params = frozen.sample(frozen.initial_params)
    assert frozen.replica_states is not None
    start = frozen.replica_states[..., 0].sort(0).values  # each ensemble's x0 values over its replicas
    for _ in range(200):
        params = frozen.sample(params)
    # without softening, sweeps never change x0 and swaps only permute it between an ensemble's replicas
    assert torch.equal(frozen.replica_states[..., 0].sort(0).values, start)


@pytest.mark.parametrize(
    ("tempered_proposals", "cover", "neural_replicas"),
    [(True, False, None), (False, False, None), (True, True, "auto")],
)
def test_every_softened_replica_samples_its_target(
    tempered_proposals: bool, cover: bool, neural_replicas: str | None
) -> None:
    """Replica r follows exp(beta_r (F + log_zero_r Z)): p itself at T = 1 (powered rows, or untempered rows)."""
    from scipy import stats

    fg = constrained_chain(seed=3)
    states, _ = enumerate_joint(fg)
    finite, zeros = (g.log_joint(states).double() for g in fg.split_zeros())
    temperatures = [1.0, 2.0, 4.0]
    torch.manual_seed(1)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    kernel = ReplicaExchange(
        fg, [proposal], temperatures=temperatures, chains=8, adapt=False, zero_penalty=1.0,
        tempered_proposals=tempered_proposals, gibbs_prob=0.3, cover=cover, neural_replicas=neural_replicas,
    )  # fmt: skip
    kernel.setup(0)
    log_zero = kernel.zero_log_potentials()
    assert log_zero is not None and log_zero[0] == -float("inf")
    assert (-log_zero[1:] / torch.tensor(temperatures[1:])).tolist() == pytest.approx([2.0, 1.0])  # nats per zero
    params, draws = kernel.initial_params, []
    for step in range(1100):
        params = kernel.sample(params)
        if step >= 100:
            draws.append(kernel.replica_states.clone())
    replicas = torch.stack(draws, 2)  # [R, K, S, n]
    limit = stats.t.ppf(1 - 1e-3 / (2 * len(states)), df=8 * 20 - 1)
    for r, temperature in enumerate(temperatures):
        penalty = torch.where(zeros > 0, log_zero[r] * zeros, 0.0)
        probs = torch.softmax((finite + penalty) / temperature, 0)
        hits = (replicas[r][:, :, None, :] == states[None, None]).all(-1).double()
        mean, mcse = batch_means_mcse(hits, 20)
        z = (mean - probs) / torch.maximum(mcse, (probs * (1 - probs) / hits[..., 0].numel()).sqrt())
        z = zero_safe(z, mean, probs)
        assert z.abs().max() <= limit, f"replica {r} (T={temperature}): max |z| = {z.abs().max():.2f}"
        if r > 0:
            assert probs[zeros > 0].sum() > 0.05  # the hot replicas do visit states the zeros rule out
    diag = kernel.diagnostics()
    assert diag["tempered_proposals"] == tempered_proposals and diag["zero_penalty"] == 1.0
    assert (diag["tempered_sweeps"] > 300) == tempered_proposals
    acceptance = torch.tensor(diag["block_acceptance_by_temperature"])
    assert 0 < acceptance[0] < 1  # the T = 1 replicas always take neural sweeps
    assert bool(acceptance[1:].isnan().all()) == (neural_replicas == "auto")  # "auto": the softened ones take Gibbs


@pytest.mark.parametrize("adaptation", ["barrier", "vousden"])
def test_ladder_adaptation_holds_the_first_gap_with_hard_zeros(adaptation: str) -> None:
    """The first pair's swap rate is capped by the share of possible states in replica 2 and does not rise as the gap
    closes: equalizing rates would close it (to 2.6e-5 in 2000 steps in an earlier version), so it is held."""
    fg = constrained_chain(seed=0)
    torch.manual_seed(0)
    kernel = ReplicaExchange(fg, replicas=4, max_temperature=6.0, chains=4, adaptation=adaptation)
    kernel.setup(2000)
    start = kernel.temperatures.clone()
    params = kernel.initial_params
    for _ in range(2000):
        params = kernel.sample(params)
    after = kernel.temperatures
    assert after[1] == pytest.approx(float(start[1])) and after[-1] == pytest.approx(6.0)
    assert not torch.allclose(after[2], start[2])  # the other gaps adapt
    assert float(kernel._swap_rate[0]) > 0.05


def test_swaps_with_the_exact_replica_take_only_possible_states() -> None:
    torch.manual_seed(0)
    beta = torch.tensor([1.0, 0.5], dtype=torch.float64)
    log_zero = torch.tensor([-float("inf"), -4.0], dtype=torch.float64)
    states = torch.tensor([[[0.0]] * 4000, [[1.0]] * 4000]).reshape(2, 4000, 1)
    finite = torch.tensor([[-1.0] * 4000, [-2.0] * 4000], dtype=torch.float64)
    zeros = torch.tensor([[0.0] * 4000, [1.0] * 4000], dtype=torch.float64)  # the hot state is impossible
    new, _, prob = swap_replicas(states, finite, beta, 0, zeros, log_zero)
    assert torch.equal(new, states) and bool((prob == 0).all())
    zeros[1] = 0.0  # a possible hot state: the usual tempered swap probability
    _, _, prob = swap_replicas(states, finite, beta, 0, zeros, log_zero)
    assert prob[0, 0] == pytest.approx(float(torch.tensor(0.5 * -1.0).exp()))
    zeros[:] = torch.tensor([[0.0], [2.0]])  # between two softened replicas, a zero costs beta_r * -log_zero_r each
    _, _, prob = swap_replicas(states, finite, torch.tensor([0.5, 0.25], dtype=torch.float64), 0, zeros, log_zero)
    # replica 0 would take a state with two zeros at -inf each: rejected
    assert bool((prob == 0).all())
    soft = torch.tensor([-8.0, -4.0], dtype=torch.float64)
    _, _, prob = swap_replicas(states, finite, torch.tensor([0.5, 0.25], dtype=torch.float64), 0, zeros, soft)
    expected = 0.5 * (-2.0 - 16.0 - -1.0) + 0.25 * (-1.0 - (-2.0 - 8.0))
    assert prob[0, 0] == pytest.approx(float(torch.tensor(expected).exp()))


def test_zero_penalty_options() -> None:
    fg = constrained_chain(seed=0)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="zero_penalty"):
            ReplicaExchange(fg, replicas=2, zero_penalty=bad)
    with pytest.raises(TypeError, match="zero_penalty"):
        ReplicaExchange(fg, replicas=2, zero_penalty="high")
    with pytest.raises(ValueError, match="at least"):
        ReplicaExchange(fg, temperatures=[1.0, 1.0 + 1e-8])  # inverse temperatures equal in float32
    plain = ReplicaExchange(coupled_chain(seed=0), replicas=3)
    plain.setup(0)
    assert plain.diagnostics()["zero_penalty"] is None and plain.zero_log_potentials() is None  # no zeros: p^beta
    mixed = ReplicaExchange(_with_a_callable_factor(constrained_chain(seed=0)), replicas=3, zero_penalty=4.0)
    with pytest.raises(ValueError, match="table factors"):
        mixed.setup(0)
    auto = ReplicaExchange(_with_a_callable_factor(constrained_chain(seed=0)), replicas=3)
    auto.setup(0)
    assert auto.diagnostics()["zero_penalty"] is None  # "auto" leaves such models at p^beta


def test_softened_replicas_follow_new_parameters_that_add_zeros() -> None:
    """update_graph to tables with zeros: softening starts (explicit zero_penalty), rows keep finite energies and
    zero counts, hot replicas visit states the zeros rule out and the beta = 1 replicas stay possible."""

    def with_constraints(strength: float) -> FactorGraph:
        fg = chain_graph(seed=6)
        equal = torch.zeros(3, 3).masked_fill(~torch.eye(3, dtype=torch.bool), -strength)
        fg.add_table_factors(torch.tensor([[0, 1], [3, 4]]), torch.stack([equal, equal]))
        return fg

    torch.manual_seed(3)
    proposal = NeuralBlockProposal(ChainWindow(), components=3, hidden=(16,))
    kernel = ReplicaExchange(with_constraints(1.0), [proposal], temperatures=[1.0, 3.0], chains=4, zero_penalty=0.5)
    kernel.setup(0)
    params = kernel.sample(kernel.initial_params)
    fused = kernel.inner.fused[0]
    assert fused is not None and not fused.table.has_zeros and kernel.diagnostics()["zero_penalty"] is None
    kernel.update_graph(with_constraints(float("inf")))
    hot_impossible = 0
    for _ in range(100):
        params = kernel.sample(params)
        assert kernel.replica_states is not None
        hot_impossible += int((~torch.isfinite(kernel.fg.log_joint(kernel.replica_states[1]))).sum())
    assert kernel.diagnostics()["zero_penalty"] == 0.5 and hot_impossible > 0
    assert fused.table.has_zeros and fused.table.finite_energy.shape == fused.table.cdf.shape
    assert bool(torch.isfinite(kernel.fg.log_joint(params["x"])).all())  # the beta = 1 replicas stay possible


def test_neighbouring_temperatures_stay_apart() -> None:
    with pytest.raises(ValueError, match="too close to 1"):
        ReplicaExchange(coupled_chain(seed=0), replicas=3, max_temperature=1.0015)
    kernel = ReplicaExchange(coupled_chain(seed=0), replicas=16, max_temperature=1.02)
    kernel.setup(0)
    kernel._swap_rate = np.linspace(0.9, 0.0, 15)  # rates falling along the ladder
    for _ in range(500):
        kernel._adapt_ladder()
    assert float(kernel.temperatures.diff().min()) >= 1e-3 and kernel.temperatures[-1] == pytest.approx(1.02)
