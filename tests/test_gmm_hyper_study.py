"""The GMM study with unknown hyper-parameters: exact conditional, exact compound sampler, --quick outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from test_experiments_quick import load

from neuralblock import load_pretrained
from neuralblock.diagnostics import batch_means_mcse

study = load("gmm_hyper")

# Two clear clusters in 2-D; m = 3 candidate mixtures, so M = 3 (a split or an unused third mean) keeps
# posterior mass 0.17 that depends on p and on the M >= 1 truncation; sigma and p are far from their priors.
TINY = torch.tensor([[-2.0, -1.5], [-2.5, -2.0], [-1.8, -2.2], [2.0, 2.5], [2.4, 1.8], [1.5, 2.2]])
TINY_PRIORS = study.HyperPriors(tau=3.0)


def test_build_graph_is_the_exact_conditional_of_the_model() -> None:
    # log p_model(sigma, p, mu, v, x) - log p_graph(mu, v) must not depend on (mu, v) at fixed (sigma, p)
    points = 3.0 * torch.randn(7, 2)
    m = 4
    names = study.local_site_variables(m)
    for sigma, p in ((0.7, 0.3), (1.6, 0.8)):
        hyper = {"sigma": torch.tensor(sigma), "p": torch.tensor(p)}
        fg = study.GmmConditional()(hyper, points, m, TINY_PRIORS)
        ids = {site: torch.tensor([fg.variable_id(n) for n in variables]) for site, variables in names.items()}
        gaps = []
        for seed in range(8):
            state = fg.initial_state(torch.Generator().manual_seed(seed))
            state[ids["mu"]] = 4.0 * torch.randn(2 * m)
            state[ids["v"][seed % m]] = 1.0  # at least one active mixture
            values = {**hyper, "mu": state[ids["mu"]].reshape(m, 2), "v": state[ids["v"]]}
            gaps.append(float(study.model_log_joint(points, m, TINY_PRIORS, values) - fg.log_joint(state)))
        assert max(gaps) - min(gaps) < 1e-3, gaps


def test_exact_posterior_sums_to_one_and_is_converged_in_the_grid() -> None:
    coarse = study.exact_hyper_posterior(TINY, 3, TINY_PRIORS, grid=200)
    fine = study.exact_hyper_posterior(TINY, 3, TINY_PRIORS, grid=600, width=8.0)
    assert abs(sum(fine["P(M=k)"]) - 1.0) < 1e-9
    for key in ("E[sigma]", "E[p]"):
        assert abs(coarse[key] - fine[key]) < 1e-4
    assert max(abs(a - b) for a, b in zip(coarse["P(M=k)"], fine["P(M=k)"])) < 1e-4


def test_compound_sampler_with_neural_blocks_matches_the_exact_hyper_posterior() -> None:
    # 2 chains x 300 transitions after 50 of warmup, 10 batch means per chain (20 in all, t with 19 dof):
    # 3 z-scores with |z| < 4.5 give a false-failure rate of about 3 * 2.5e-4 < 1e-3.
    exact = study.exact_hyper_posterior(TINY, 3, TINY_PRIORS)
    target = torch.tensor([exact["P(M=k)"][2], exact["E[sigma]"], exact["E[p]"]], dtype=torch.float64)
    proposal = load_pretrained("gmm_pair")
    chains = []
    for chain in range(2):
        kernel = study.compound_sampler("nb", 3, proposal, local_steps=1, priors=TINY_PRIORS)
        start = study.prior_start(chain, 3, TINY_PRIORS)
        run = study.run_chain(kernel, (TINY, 3, TINY_PRIORS), start, warmup=50, transitions=350, seed=chain)
        kept = slice(51, None)  # entry 0 is the start
        active = torch.tensor(run["M"][kept], dtype=torch.float64)
        sigma = torch.tensor(run["sigma"][kept], dtype=torch.float64)
        p = torch.tensor(run["p"][kept], dtype=torch.float64)
        chains.append(torch.stack([(active == 3).double(), sigma, p], -1))
        diagnostics = run["diagnostics"]
        assert diagnostics["block 0 (ConditionalGraphKernel)"]["acceptance"]["gmm_pair"] > 0.02
        assert 0.1 < diagnostics["block 1 (RandomWalkMH)"]["acceptance_rate"] < 0.9
    estimate, mcse = batch_means_mcse(torch.stack(chains), num_batches=10)
    z = (estimate - target) / mcse
    assert z.abs().max() < 4.5, (estimate.tolist(), target.tolist(), z.tolist())


def test_gmm_hyper_quick_mode_writes_outputs(tmp_path: Path) -> None:
    record = study.main(["--quick", "--out", str(tmp_path)])
    (folder,) = list(tmp_path.iterdir())
    saved = json.loads((folder / "gmm_hyper.json").read_text())
    assert saved["config"]["quick"] is True
    (result,) = saved["results"]
    assert set(result["runs"]) == {study.NB, study.SM, study.NB + study.FIXED, study.SM + study.FIXED}
    for label, runs in result["runs"].items():
        for run in runs:
            assert run["transitions"] >= 1 and min(run["M"]) >= 1
            assert all(b >= a for a, b in zip(run["times"], run["times"][1:]))
            assert len(run["log_joint"]) == len(run["times"]) == run["transitions"] + 1
            if label.endswith(study.FIXED):
                assert set(run["sigma"]) == {result["reference"]["true_sigma"]}
    rows = {row["sampler"]: row for row in record["results"][0]["summary"]}
    assert rows[study.SM]["runs reaching SM final"] == "1/1"  # its own median final level
    assert record["pooled_ratio"] is None or record["pooled_ratio"] >= 0.0
    for name in ("gmm_hyper.md", "gmm_hyper_traces.png", "gmm_hyper_posteriors.png"):
        assert (folder / name).stat().st_size > 0
