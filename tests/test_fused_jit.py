"""The compiled loops (``neuralblock.kernels.jit``) make the NumPy functions' very decisions.

Kernel level: every case of ``test_fused_numpy`` (each variant of the fused neural update and
of the fused Gibbs update) run from one seed through the NumPy functions and through the
compiled loops gives the same chain; so does a torus of 5 factors per variable (the compiled
Gibbs update adds a variable's terms in NumPy's order). Function level: random inputs with
padded slots, per-instance place values, impossible values, slots, tempered row offsets, the
``beta`` correction and softened zeros (neural), and binary, Gumbel-max, masked, tempered,
integer- and float-strided classes (Gibbs). Invariance of the compiled paths is tested wherever
the fused paths are: they are the default for small CPU states where Numba is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_fused_numpy import CASES, GIBBS_CASES, chain_of_states, proposal
from test_motif_grid import ising_grid  # tests/ is on sys.path under pytest
from test_neural_block_kernel import chain_graph
from test_replica_exchange import constrained_chain
from test_vectorized_chains import mixed_graph

from neuralblock import GibbsKernel, ReplicaExchange
from neuralblock.kernels import jit
from neuralblock.kernels.fused_blocks import _draw_cdf, fused_class_update, fused_class_update_numpy
from neuralblock.kernels.gibbs import gibbs_class_update_numpy
from neuralblock.kernels.replica_exchange import swap_replicas

pytestmark = pytest.mark.skipif(not jit.NUMBA, reason="Numba is not installed")


def assert_same_chain(make, steps: int = 120) -> object:
    """The NumPy functions' chain and the compiled loops' chain from one seed are equal; returns the latter's kernel."""
    numpy_states, _ = chain_of_states(make, steps, use_numpy=True, jit=False)
    jit_states, kernel = chain_of_states(make, steps, use_numpy=True, jit=True)
    assert torch.equal(numpy_states, jit_states)
    assert len(torch.unique(jit_states.reshape(len(jit_states), -1), dim=0)) > 5  # the chains move
    return kernel


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_and_numpy_block_sweeps_make_the_same_chain(case: str) -> None:
    q = proposal()
    assert_same_chain(lambda: CASES[case](q))


@pytest.mark.parametrize("case", list(GIBBS_CASES))
def test_compiled_and_numpy_gibbs_sweeps_make_the_same_chain(case: str) -> None:
    assert_same_chain(GIBBS_CASES[case])


def test_compiled_gibbs_adds_five_factor_terms_in_numpy_order() -> None:
    """A 3x3 Ising torus (a unary and 4 couplings per variable): the same chain, draw for draw."""
    fg = ising_grid(3, 3, torus=True, coupling=0.8, seed=2)
    assert_same_chain(lambda: GibbsKernel(fg, chains=4))


VARIANTS = [
    "plain", "slot", "tempered offsets", "beta correction", "soft zeros", "soft zeros, beta", "zeros at T=1",
    "offsets and beta correction",
]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", VARIANTS)
def test_block_sweep_equals_the_numpy_function_class_by_class(dtype: type, variant: str) -> None:
    """Three classes (the last padded: its slot 2 repeats slot 1 and its numbers) against the NumPy function."""
    rng = np.random.default_rng(VARIANTS.index(variant))
    chains, n, width, classes, values_n = 4, 14, 3, 3, 4
    state = rng.integers(0, 2, (chains, n)).astype(dtype)
    ids, block_ids = np.zeros((classes, width * 4), np.int64), np.zeros((classes, width * 2), np.int64)
    for c in range(classes):  # slot i: 2 context then 2 block variables, disjoint from the class's other slots
        own = rng.permutation(n)[: width * 4].reshape(width, 4)
        if c == 2:
            own[2] = own[1]  # the padded slot repeats slot 1
        ids[c], block_ids[c] = own.reshape(-1), own[:, 2:].reshape(-1)
    radix = np.tile(np.array([2.0, 1.0], dtype), (classes, width, 1))
    radix[1, :, :] = [1.0, 2.0]  # per-class place values
    block_radix = np.array([2.0, 1.0], dtype)
    base = (np.arange(classes * width).reshape(classes, width) % 5 * 4).astype(np.int64)  # keys below 20
    base[2, 2] = base[2, 1]  # (the padded slot's rows are its original's)
    rows = 40
    log_q = torch.from_numpy(rng.normal(size=(rows, values_n)))
    cdf = _draw_cdf(log_q, torch.float32 if dtype == np.float32 else torch.float64).numpy()
    log_ratio = rng.normal(size=(rows, values_n)).astype(dtype)
    log_ratio[::3, 0] = -np.inf  # impossible values: NaN ratios are rejected
    draws = rng.random((classes, chains, width)).astype(cdf.dtype)
    draws[2, :, 2] = draws[2, :, 1]  # the padded slot's numbers are its original's
    log_accept = np.log(rng.random((classes, chains, width)))
    log_accept[2, :, 2] = log_accept[2, :, 1]
    values = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype)
    extra: dict[str, np.ndarray | None] = dict.fromkeys(["energy", "beta", "slot", "key_offset", "zeros", "log_zero"])
    if variant == "slot":
        extra["slot"] = rng.permutation(rows)
    if variant in ("tempered offsets", "offsets and beta correction"):
        extra["key_offset"] = np.array([0, 20, 0, 20])  # each chain's temperature's rows
    if variant in ("beta correction", "offsets and beta correction", "soft zeros, beta"):
        extra["beta"] = rng.uniform(0.2, 1.0, chains).astype(cdf.dtype)
    if variant in ("beta correction", "offsets and beta correction"):  # (read at the keys before the offsets)
        extra["energy"] = rng.normal(size=(rows // 2 if extra["key_offset"] is not None else rows, values_n))
        extra["energy"] = extra["energy"].astype(cdf.dtype)
    if variant.startswith("soft zeros") or variant == "zeros at T=1":
        extra["zeros"] = rng.integers(0, 3, (rows, values_n)).astype(cdf.dtype)
        extra["log_zero"] = -rng.uniform(1.0, 4.0, chains).astype(cdf.dtype)
    if variant == "zeros at T=1":  # the beta = 1 chains keep their zeros: -inf, and no -inf * 0 where none is gained
        extra["log_zero"][:2] = -np.inf
    expected = state.copy()
    expected_accepted, expected_finite = [], []
    for c in range(classes):
        found = fused_class_update_numpy(
            expected, ids[c], radix[c], block_radix, block_ids[c], base[c], cdf, log_ratio, draws[c], log_accept[c],
            values, *extra.values(),
        )  # fmt: skip
        expected_accepted.append(found[0])
        expected_finite.append(found[1])
    if variant == "offsets and beta correction":  # torch's function reads the same rows
        as_torch = [None if a is None else torch.from_numpy(a) for a in extra.values()]
        by_torch = torch.from_numpy(state.copy())
        for c in range(classes):
            by_torch = fused_class_update(
                by_torch, *(torch.from_numpy(a) for a in (ids[c], radix[c], block_radix, block_ids[c], base[c])),
                *(torch.from_numpy(a) for a in (cdf, log_ratio, draws[c], log_accept[c], values)), *as_torch,
            )[0]  # fmt: skip
        assert np.array_equal(by_torch.numpy(), expected)
    got = state.copy()
    sizes = np.array([width, width, width - 1])  # class 2's last slot is padding
    as_drawn = [u.transpose(1, 0, 2).reshape(chains, classes * width).copy() for u in (draws, log_accept)]
    accepted, nonfinite = jit.block_sweep(
        got, ids, radix, block_radix, block_ids, base, sizes, cdf, log_ratio, *as_drawn, values, *extra.values()
    )
    assert np.array_equal(got, expected)
    real = np.ones((classes, chains, width), bool)
    real[2, :, 2] = False  # a padded slot's decisions are not counted
    assert np.array_equal(accepted, (np.stack(expected_accepted) & real).sum((0, 2)))
    assert nonfinite == int((~np.stack(expected_finite) & real).sum())
    every = np.stack(expected_finite)[real]
    assert not every.all() and 0 < accepted.sum() < real.sum()  # every kind of decision was exercised


GIBBS_VARIANTS = ["binary", "binary, tempered", "binary, masked", "gumbel", "gumbel, masked and tempered", "offsets"]


@pytest.mark.parametrize(("strides_dtype", "state_dtype"), [(np.float32, np.float32), (np.int64, np.float64)])
@pytest.mark.parametrize("variant", GIBBS_VARIANTS)
def test_gibbs_class_equals_the_numpy_function(variant: str, strides_dtype: type, state_dtype: type) -> None:
    """Random tables (with impossible entries) read through 3 factors per variable: equal states and stuck counts.

    float64 states with float32 tables and float64 temperatures: the log-odds in the tables' dtype, the
    temperatures cast to it, the result rounded to the states' dtype, as the NumPy function does.
    """
    rng = np.random.default_rng(GIBBS_VARIANTS.index(variant))
    chains, n, count, depth, arity = 5, 9, 3, 3, 2
    kmax = 2 if variant.startswith("binary") or variant == "offsets" else 3
    state = rng.integers(0, kmax, (chains, n)).astype(state_dtype)
    vars_ = np.array([0, 1, 2])
    scopes = rng.integers(3, n, (depth, count, arity))
    strides = np.tile(np.array([kmax, 1]), (depth, count, 1)).astype(strides_dtype)
    entries = kmax**arity
    index = (np.arange(depth * count).reshape(depth, count, 1) * entries * kmax) + np.arange(kmax) * entries
    flat = rng.normal(size=depth * count * entries * kmax + 1).astype(np.float32)
    flat[rng.random(flat.shape) < 0.15] = -np.inf
    mask = None
    if "masked" in variant:
        mask = np.zeros((count, kmax), np.float32)
        mask[1, -1] = -np.inf  # variable 1 cannot take the last value
    if kmax == 2:  # binary: value 1 iff the logistic noise is below the log odds
        noise = rng.logistic(size=(chains, count)).astype(state_dtype)
    else:
        noise = rng.gumbel(size=(chains, count, kmax)).astype(state_dtype)
        noise[0, 0, :] = np.inf  # (an impossible value's -inf + inf: NaN, which NumPy's argmax takes: stuck)
    beta = rng.uniform(0.1, 1.0, chains).astype(state_dtype) if "tempered" in variant else None
    offset = None
    if variant == "offsets":
        flat = np.concatenate([flat, rng.normal(size=flat.shape).astype(np.float32)])
        offset = np.array([0, len(flat) // 2] * 2 + [0])
    args = (vars_, scopes, strides, index, mask, flat, noise, beta, offset)
    expected, got = state.copy(), state.copy()
    stuck_numpy = gibbs_class_update_numpy(expected, *args)
    stuck_jit = jit.gibbs_class(got, *args)
    assert np.array_equal(got, expected) and stuck_jit == stuck_numpy
    assert not np.array_equal(got, state)  # something was drawn


def dyadic(fg):
    """``fg`` with its log tables rounded to multiples of 1/8: sums in float32 and float64 are then exact."""
    for group in fg.groups:
        finite = torch.isfinite(group.log_tables)
        group.log_tables[finite] = (group.log_tables[finite] * 8).round() / 8
    return fg


def test_table_log_joint_equals_the_graph_log_joint() -> None:
    """Unary, pairwise and triple tables with zeros, evidence included: the graph's log joint."""
    fg = constrained_chain(seed=2)
    g = torch.Generator().manual_seed(0)
    fg.add_table_factors(torch.tensor([[0, 2, 4], [1, 3, 5]]), torch.randn(2, 3, 3, 3, generator=g))
    states = torch.randint(0, 3, (200, fg.num_variables), generator=g).float()
    expected = fg.log_joint(states).double()
    got = torch.from_numpy(jit.TableLogJoint(fg)(states.numpy()))
    assert torch.equal(torch.isinf(got), torch.isinf(expected)) and bool(torch.isinf(got).any())
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="table factors"):
        jit.TableLogJoint(mixed_graph(seed=1))


@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("parity", [0, 1])
def test_compiled_swaps_equal_the_torch_swaps(zeros: bool, parity: int) -> None:
    g = torch.Generator().manual_seed(parity + 2 * zeros)
    replicas, chains, n = 5, 6, 4
    states = torch.randint(0, 3, (replicas, chains, n), generator=g).double()
    log_p = torch.randn(replicas, chains, generator=g, dtype=torch.float64) * 3
    beta = torch.tensor([1.0, 0.7, 0.5, 0.3, 0.1], dtype=torch.float64)
    count = torch.randint(0, 3, (replicas, chains), generator=g).double() if zeros else None
    log_zero = torch.tensor([-torch.inf, -4.0, -3.0, -2.0, -1.0], dtype=torch.float64) if zeros else None
    torch.manual_seed(11)
    expected_states, expected_log_p, expected_prob = swap_replicas(states, log_p, beta, parity, count, log_zero)
    torch.manual_seed(11)
    log_u = torch.rand(len(range(parity, replicas - 1, 2)), chains, dtype=torch.float64).log()
    work, work_log_p = states.clone().numpy(), log_p.clone().numpy()
    delta = jit.swap_replicas(
        work, work_log_p, beta.numpy(), parity, log_u.numpy(),
        None if count is None else count.numpy(), None if log_zero is None else log_zero.numpy(),
    )  # fmt: skip
    assert np.array_equal(work, expected_states.numpy()) and np.array_equal(work_log_p, expected_log_p.numpy())
    prob = torch.from_numpy(delta).clamp(max=0.0).exp().numpy()  # (as ReplicaExchange rounds them)
    assert np.array_equal(prob, expected_prob.numpy())
    assert 0 < (prob == 1).sum() < prob.size or zeros  # both kinds of decision (zeros: impossible swaps as well)


@pytest.mark.parametrize("case", ["gibbs", "soft zeros", "neural"])
def test_compiled_replica_exchange_swaps_make_the_torch_chain(case: str) -> None:
    """Dyadic tables (exact log joints both ways): the compiled swaps make the torch swaps' chain, draw for draw."""
    q = proposal()
    makers = {
        "gibbs": lambda: ReplicaExchange(dyadic(chain_graph(seed=4)), replicas=4, max_temperature=5.0, chains=3),
        "soft zeros": lambda: ReplicaExchange(dyadic(constrained_chain(seed=4)), replicas=4, max_temperature=6.0),
        "neural": lambda: ReplicaExchange(
            dyadic(chain_graph(seed=4)), [q], replicas=3, max_temperature=4.0, chains=2, neural_replicas=None
        ),
    }

    def chain(compiled_swaps: bool) -> tuple[torch.Tensor, float]:
        torch.manual_seed(5)
        kernel = makers[case]()
        kernel.setup(20)
        assert kernel._joints is not None  # the compiled swaps are the default here
        if not compiled_swaps:
            kernel._joints = None
        params, states = kernel.initial_params, []
        for _ in range(150):
            params = kernel.sample(params)
            states.append(params["x"].clone())
        diagnostics = kernel.diagnostics()
        return torch.stack(states), (diagnostics["swap_acceptance"], diagnostics["temperatures"])

    (compiled, ladder), (plain, plain_ladder) = chain(True), chain(False)
    assert torch.equal(compiled, plain) and ladder == plain_ladder  # the same warmup-adapted ladder, to the bit
    assert len(torch.unique(compiled.reshape(len(compiled), -1), dim=0)) > 1 and float(np.mean(ladder[0])) > 0.05


def test_compiled_sweeps_follow_rows_filled_on_visits_and_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables filled as chains visit rows, then rows in slots with evictions: one compiled call per class."""
    from test_neural_block_kernel import chain_graph as graph

    import neuralblock.kernels.fused_blocks as fused_blocks
    from neuralblock import NeuralBlockKernel

    q = proposal()
    monkeypatch.setattr(fused_blocks, "_PREFILL_ROWS", 0)
    for budget, cover in ((None, False), (27, False), (None, True)):  # covers: classes of later covers start > 0
        if budget is not None:
            monkeypatch.setattr(fused_blocks, "_MAX_CACHE_ENTRIES", budget)
        kernel = assert_same_chain(
            lambda cover=cover: NeuralBlockKernel(graph(seed=6), [q], gibbs_prob=0.1, chains=4, cover=cover), 100
        )
        table = kernel.fused[0].table  # type: ignore[attr-defined]
        assert not table.prefilled and (budget is None or table.evictions > 0)
        assert len(kernel.cover_classes[0]) == (2 if cover else 1)


@pytest.mark.parametrize(
    ("cover", "case"),
    [
        (False, "every replica"),
        (True, "every replica"),
        (True, "two coldest"),
        (True, "softened"),
        (False, "softened, every replica"),
    ],
)
def test_one_call_replica_transition_makes_the_separate_calls_chain(
    cover: bool, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A neural replica-exchange transition in one compiled call (the hotter replicas' single-site sweep, the block
    sweep, then the swaps) is the separate calls', bit for bit: every replica neural, the two coldest of four, and
    hard zeros (softened hot replicas; neural sweeps at T = 1 only, or at every temperature)."""
    import neuralblock.kernels.replica_exchange as replica_exchange

    q = proposal()
    calls = []
    one_call = replica_exchange.replica_block_transition

    def counted(*args: object) -> object:
        calls.append(1)
        return one_call(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(replica_exchange, "replica_block_transition", counted)
    softened = case.startswith("softened")
    neural_replicas = {"every replica": None, "two coldest": 2, "softened": "auto", "softened, every replica": None}[
        case
    ]

    def chain(joined: bool) -> tuple[torch.Tensor, dict]:
        torch.manual_seed(5)
        graph = constrained_chain(seed=2) if softened else chain_graph(seed=4)
        kernel = ReplicaExchange(
            graph, [q], replicas=4, max_temperature=5.0, chains=2, gibbs_prob=0.3, cover=cover,
            neural_replicas=neural_replicas,
        )  # fmt: skip
        if not joined:
            monkeypatch.setattr(kernel, "_one_call_sweep", lambda *args: None)
        kernel.setup(30)
        assert (kernel.penalty is not None) == softened
        params, states = kernel.initial_params, []
        for _ in range(150):
            params = kernel.sample(params)
            states.append(params["x"].clone())
        diagnostics = kernel.diagnostics()
        inner = diagnostics.pop("inner")
        kept = ("swap_acceptance", "temperatures", "tempered_sweeps", "block_acceptance_by_temperature")
        counts = ("acceptance_by_proposal", "nonfinite_rejections", "single_site_sweeps")
        replicas = kernel.replica_states.clone()
        return torch.stack(states), {**{k: diagnostics[k] for k in kept}, **{k: inner[k] for k in counts}}, replicas

    joined, joined_stats, joined_replicas = chain(True)
    assert 90 < len(calls) < 120  # the neural turns, warmup included (30 % single-site)
    separate, separate_stats, separate_replicas = chain(False)
    assert torch.equal(joined, separate) and torch.equal(joined_replicas, separate_replicas)
    assert str(joined_stats) == str(separate_stats)  # (NaN acceptance at the temperatures without neural sweeps)
    assert joined_stats["tempered_sweeps"] > 0 and joined_stats["acceptance_by_proposal"]
    assert min(joined_stats["swap_acceptance"]) > 0.0
    assert len(torch.unique(joined.reshape(len(joined), -1), dim=0)) > 10


def test_one_call_replica_transition_needs_the_neural_chains_first() -> None:
    """Neural chains that do not lead the state (or a mask of another length) take the separate calls."""
    kernel = ReplicaExchange(chain_graph(seed=4), [proposal()], replicas=4, max_temperature=5.0, chains=2)
    kernel.setup(0)
    params = kernel.sample(kernel.initial_params)
    states = kernel.replica_states.reshape(8, -1)
    assert kernel._one_call_sweep(states, None) is not None  # every replica neural
    inner = kernel.inner
    inner.neural_rows = torch.arange(8) < 4  # the two coldest replicas' chains, leading
    assert kernel._one_call_sweep(states, None) is not None
    inner.neural_rows = torch.arange(8) >= 4  # the hottest ones: not leading
    assert kernel._one_call_sweep(states, None) is None
    inner.neural_rows = torch.zeros(8, dtype=torch.bool)  # none
    assert kernel._one_call_sweep(states, None) is None
    inner.neural_rows = torch.ones(6, dtype=torch.bool)  # a mask of other chains
    assert kernel._one_call_sweep(states, None) is None
    assert params["x"].shape == (2, states.shape[1])
