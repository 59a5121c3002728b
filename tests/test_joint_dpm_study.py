"""The JointDPM study runs end to end at CI scale, and its z update draws from algorithm 8's conditional."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments import joint_dpm as study


def test_joint_dpm_quick_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "joint_dpm.json").read_text())
    assert saved["config"]["quick"] is True and saved["config"]["epsilons"] == [0.1, 0.3]
    (seed,) = saved["seeds"]
    assert set(seed["runs"]) == {"exact MH", "austerity eps=0.1", "austerity eps=0.3"}
    for label, run in seed["runs"].items():
        times = [r["seconds"] for r in run["records"]]
        assert run["cycles"] >= 2 and all(b > a for a, b in zip(times, times[1:], strict=False))
        assert all(0.0 <= r["accuracy"] <= 1.0 for r in run["records"])
        assert math.isclose(sum(run["time_split"].values()), 1.0, rel_tol=1e-6)
        assert run["w_transitions"] > 0 and run["final_clusters"] >= 1
        fraction = run["data_fraction_per_w_update"]
        # (sums of per-cluster means times counts: equal to 1 up to rounding for exact MH)
        assert math.isclose(fraction, 1.0, rel_tol=1e-9) if label == "exact MH" else 0.0 < fraction <= 1.0 + 1e-9
    costs = seed["kernel_costs"]
    assert costs["exact MH"]["data_fraction"] == 1.0 and costs["ms_per_model_run_all"] > 0
    assert all(
        0.0 < costs[label]["data_fraction"] <= 1.0 and costs[label]["ms_per_transition"] > 0 for label in seed["runs"]
    )
    # the chains learn: the running predictive beats guessing by a wide margin
    assert seed["runs"]["exact MH"]["final_accuracy"] > 0.6
    assert set(record["targets"]) == {"austerity eps=0.1", "austerity eps=0.3"}
    assert (folder / "joint_dpm.md").read_text().count("|") > 30
    assert {p.name for p in folder.glob("*.png")} == {"joint_dpm_accuracy.png"}
    # a saved record's tables and plot are rewritten without a run
    (folder / "joint_dpm.md").unlink()
    again = study.main(["--rewrite", str(folder / "joint_dpm.json")])
    assert again["targets"] == json.loads(json.dumps(record["targets"])) and (folder / "joint_dpm.md").exists()


def _normal_logpdf(x: np.ndarray, mean: np.ndarray, var: float) -> float:
    return float(-0.5 * len(x) * math.log(2 * math.pi * var) - 0.5 * ((x - mean) ** 2).sum() / var)


def _expected_moves(data, z: np.ndarray, W: np.ndarray, i: int, aux: int, alpha: float, draws: int) -> dict:
    """Algorithm 8's move probabilities for point ``i``, averaged over the auxiliary experts by Monte Carlo.

    Written from the model's formulas, independently of the study's cached terms: an existing
    cluster ``k`` has weight ``n_{-i,k} N(x_i; m_k, (s² + v_k) I) p(y_i | w_k)``, each auxiliary one
    ``(α/m) N(x_i; 0, (τ² + s²) I) p(y_i | w_j)`` with ``w_j`` from the prior (the first is the
    point's own expert when it is alone).
    """
    hyper = study.Hyper()
    s2, t2 = hyper.s**2, hyper.tau**2
    x, x1, y = data.X[i], np.append(data.X[i], 1.0), data.y[i]
    sign = 2 * y - 1

    def loglik(w: np.ndarray) -> np.ndarray:
        return -np.logaddexp(0.0, -sign * (w @ x1))

    others = [k for k in np.unique(np.delete(z, i))]
    log_w = []
    for k in others:
        members = data.X[(z == k) & (np.arange(len(z)) != i)]
        v = 1.0 / (1.0 / t2 + len(members) / s2)
        log_w.append(math.log(len(members)) + _normal_logpdf(x, v * members.sum(0) / s2, s2 + v) + loglik(W[k]))
    rng = np.random.default_rng(123)
    aux_w = rng.normal(size=(draws, aux, len(x1)))
    log_aux = math.log(alpha / aux) + _normal_logpdf(x, np.zeros_like(x), t2 + s2) + loglik(aux_w)
    if (z == z[i]).sum() == 1:
        log_aux[:, 0] = math.log(alpha / aux) + _normal_logpdf(x, np.zeros_like(x), t2 + s2) + loglik(W[z[i]])
    all_w = np.concatenate([np.broadcast_to(np.array(log_w), (draws, len(log_w))), log_aux], 1)
    probs = np.exp(all_w - all_w.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    moves = {int(k): probs[:, j] for j, k in enumerate(others)}
    moves[-1] = probs[:, len(others) :].sum(1)  # a cluster of its own (new, or kept when alone)
    return {k: (float(p.mean()), float(p.std() / math.sqrt(draws))) for k, p in moves.items()}


@pytest.mark.parametrize("alone", [False, True])
def test_z_update_matches_algorithm_8_conditional(alone: bool) -> None:
    # 3000 single-point updates per case; 4 categories with |z| < 4.5 (binomial sd plus the Monte Carlo
    # error of the expected probabilities): false-failure rate below 1e-4 per case.
    # point 0 between three small clusters, so that every move has mass
    X = np.array([[0.0, 0.0], [0.6, 0.1], [0.9, -0.2], [-0.7, 0.5], [-1.0, 0.2], [0.2, 1.1], [0.0, 1.4], [-0.5, 0.9]])
    y = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    data = study.Data(X, y, X[:2], y[:2], np.zeros(8, dtype=np.int64), 1.0)
    z = np.array([3, 0, 0, 1, 1, 2, 2, 0]) if alone else np.array([0, 0, 0, 1, 1, 2, 2, 1])
    W = np.random.default_rng(6).normal(size=(4, 3))
    aux, alpha, trials = 2, 8.0, 3000
    expected = _expected_moves(data, z, W, 0, aux, alpha, 200_000)
    state = study.JointDPMState(data, study.Hyper(), np.random.default_rng(0))
    counts: dict[int, int] = dict.fromkeys(expected, 0)
    for trial in range(trials):
        state.set_assignments(z, W)
        state.alpha, state.rng = alpha, np.random.default_rng(1000 + trial)
        state.gibbs_sweep(aux, order=np.array([0]))
        k = int(state.z[0])
        counts[k if k in expected and k != -1 and (state.z[1:] == k).any() else -1] += 1
    for k, (p, mc_se) in expected.items():
        se = math.sqrt(p * (1 - p) / trials + mc_se**2)
        assert abs(counts[k] / trials - p) < 4.5 * se, (k, counts, expected)
