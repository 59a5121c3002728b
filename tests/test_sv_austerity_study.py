"""SV models (densities, blocked particle Gibbs) and the SV austerity study at CI scale.

The blocked-sweep test compares batch-means estimates (4 chains x 20 batches) of the
smoothing means of ``h_t`` from the blocked sweep with those of the plain conditional SMC
(32 chains, itself tested against the Kalman smoother in ``test_particle_gibbs.py``) by
two-sample z-scores, Bonferroni-corrected over the compared times, so its false-failure rate
is at most ``alpha = 1e-3``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from scipy import stats

from experiments import sv_austerity as study
from experiments import sv_models as sv
from neuralblock.diagnostics import batch_means_mcse
from neuralblock.kernels.particle_gibbs import csmc_step, path_log_joint

ALPHA = 1e-3


def model_log_density(model, y: torch.Tensor, values: dict[str, torch.Tensor]) -> torch.Tensor:
    trace = pyro.poutine.trace(pyro.condition(model, data=values)).get_trace(y)
    return trace.log_prob_sum()


def test_pyro_models_and_state_space_share_one_density() -> None:
    y, h = sv.simulate_sv(3, 6, generator=torch.Generator().manual_seed(0))
    phi, sigma2 = torch.tensor(0.9), torch.tensor(0.02)
    values = {"phi": phi, "sigma2": sigma2, "h": h}
    prior = dist.Beta(*sv.PHI_PRIOR).log_prob(phi) + dist.InverseGamma(*sv.SIGMA2_PRIOR).log_prob(sigma2)
    expected = prior + path_log_joint(h, sv.sv_state_space(y, phi, sigma2)).sum()
    torch.testing.assert_close(model_log_density(sv.sv_series_model, y, values), expected)
    # one long series: the time-step model has the same joint density as a single row
    single = {"phi": phi, "sigma2": sigma2, "h": h[0]}
    torch.testing.assert_close(
        model_log_density(sv.sv_timestep_model, y[0], single),
        prior + path_log_joint(h[:1], sv.sv_state_space(y[:1], phi, sigma2)).sum(),
    )
    with pytest.raises(ValueError, match="phi"):
        sv.sv_state_space(y, phi=1.2, sigma2=0.1)
    with pytest.raises(ValueError, match="y must be"):
        sv.sv_series_model(torch.zeros(4))


def test_sp500_returns_are_oldest_first_log_returns() -> None:
    raw = sv.load_sp500_returns(standardize=False)
    assert raw.shape == (15700,)
    # first return: 1950-01-03 close 16.66 -> 1950-01-04 close 16.85
    assert math.isclose(float(raw[0]), math.log(16.85 / 16.66), rel_tol=1e-5)


def test_blocked_sweep_matches_plain_conditional_smc() -> None:
    phi, sigma2, steps = 0.9, 0.1, 10
    y, _ = sv.simulate_sv(1, steps, phi=phi, sigma=sigma2**0.5, generator=torch.Generator().manual_seed(3))
    # reference: plain conditional SMC, 32 chains in one batch
    ref_ssm = sv.sv_state_space(y.repeat(32, 1), phi, sigma2)
    path, ref = torch.zeros(32, steps), []
    for i in range(450):
        path, _ = csmc_step(path, ref_ssm, num_particles=16)
        if i >= 50:
            ref.append(path)
    ref_draws = torch.stack(ref, 1).to(torch.float64)  # [32, 400, T]
    # blocked sweeps with random offsets, 4 chains in one batch (they share each sweep's offset;
    # given the offsets the chains are independent and each is exactly invariant)
    h, blocked = torch.zeros(4, steps), []
    for i in range(330):
        h = sv.sv_blocked_sweep(h, y[0], phi, sigma2, block_len=4, num_particles=10)
        if i >= 30:
            blocked.append(h)
    mean_b, se_b = batch_means_mcse(torch.stack(blocked, 1).to(torch.float64), 20)
    mean_r, se_r = batch_means_mcse(ref_draws, 20)
    z = (mean_b - mean_r) / (se_b**2 + se_r**2).sqrt()
    limit = stats.norm.ppf(1 - ALPHA / (2 * steps))
    assert z.abs().max() <= limit, f"max |z| = {z.abs().max():.2f}"


def test_blocked_sweep_input_errors() -> None:
    with pytest.raises(ValueError, match="h must be"):
        sv.sv_blocked_sweep(torch.zeros(5), torch.zeros(6), 0.9, 0.1)
    with pytest.raises(ValueError, match="block_len"):
        sv.sv_blocked_sweep(torch.zeros(5), torch.zeros(5), 0.9, 0.1, block_len=0)


def test_sv_austerity_study_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "sv_austerity.json").read_text())
    assert saved["config"]["quick"] is True and set(saved["settings"]) == {"seed", "sp500"}
    exact, austerity = list(record["arms"])
    for result in saved["settings"].values():
        run = result["runs"][0]
        assert run[exact]["kernel"]["mean_data_fraction"] == 1.0
        assert 0 < run[austerity]["kernel"]["mean_data_fraction"] <= 1.0
        for arm in (exact, austerity):
            assert run[arm]["draws"] > 3 and 0 < run[arm]["seconds_global"] < run[arm]["seconds_total"]
            assert 0 < run[arm]["phi"]["mean"] < 1 and run[arm]["sigma2"]["mean"] > 0
        assert {"phi_ratio_total", "sigma2_ratio_global", "phi_bias_in_sd"} <= set(result["summary"][austerity])
    # The seed setting (110-190 draws per arm): both MH arms accept 0.1-0.43 of their proposals and their phi draws
    # move (seeds 0-2); a kernel that never accepts, or always does, fails.
    run = saved["settings"]["seed"]["runs"][0]
    for arm in (exact, austerity):
        assert 0.03 < run[arm]["kernel"]["acceptance_rate"] < 0.9 and run[arm]["phi"]["sd"] > 0, run[arm]["kernel"]
    # S&P 500 (600 days, about 25 draws): the austerity arm agrees with exact MH on phi (differences 0.001-0.006,
    # chain sds 0.006-0.009, seeds 0-2). The 0.03 bound is loose for 25 draws of a slow chain; a global kernel with a
    # wrong acceptance ratio drifts off toward phi's bounds.
    run = saved["settings"]["sp500"]["runs"][0]
    assert abs(run[austerity]["phi"]["mean"] - run[exact]["phi"]["mean"]) < 0.03
    assert all(0.94 < run[arm]["phi"]["mean"] < 1.0 for arm in (exact, austerity))
    assert {row["S"] for row in saved["scaling"]} == set(saved["config"]["scaling_sizes"])
    assert "Target and bias" in (folder / "sv_austerity.md").read_text()
    assert {p.name for p in folder.glob("*.png")} == {"sv_seed.png", "sv_sp500.png"}


@pytest.mark.parametrize("long_series", [False, True])
def test_sv_models_evaluate_both_mh_points_in_one_run(long_series: bool) -> None:
    from neuralblock.kernels.austerity import AusterityMH

    y, h = sv.simulate_sv(8, 5, generator=torch.Generator().manual_seed(1))
    model, plate = (sv.sv_timestep_model, "time") if long_series else (sv.sv_series_model, "series")
    y, h = (y.reshape(-1), h.reshape(-1)) if long_series else (y, h)
    kernel = AusterityMH(model, sites=["phi", "sigma2"], plate=plate, epsilon=0.05, batch_size=4, normality_check=False)
    kernel.condition_on({"h": h})
    kernel.setup(0, y)
    assert kernel.sections.vectorized
    batch = {"phi": torch.tensor([0.9, 0.97]), "sigma2": torch.tensor([0.02, 0.005])}
    idx = torch.tensor([5, 0, 3])
    many = kernel.sections.evaluate_many({"h": h}, batch, idx)
    for p in range(2):
        one = kernel.sections.evaluate({"h": h, "phi": batch["phi"][p], "sigma2": batch["sigma2"][p]}, idx)
        torch.testing.assert_close(many.sections[p], one.sections)
        torch.testing.assert_close(many.global_term[p], one.global_term)
