"""Evaluate a trained ``chain`` proposal: held-out instantiations by family, then the S&P 500 volatility chain.

Part 1, held-out random instantiations of the motif (seeded, never seen in training),
per family (:class:`motifs.chain.ChainMotif` ``family=``):

* ``linear``: linear-Gaussian or missing observations, where the exact conditional is
  known: the NLL gap ``E[log p - log q]`` (a Monte Carlo KL) is the target (<= 0.05 nats);
* ``volatility``: stochastic-volatility observations (nonlinear): the independence-MH
  acceptance rate of ``q`` against the exact conditional (target >= 0.7);
* ``mixed``: the training distribution.

Each row also gives the **whitening alone** baseline: ``u ~ N(0, I)`` in the motif's
whitened coordinates, i.e. the Kim–Shephard–Chib linearised Gaussian conditional
without the network, so the table shows what the learned part adds.

Part 2, the latent log-volatility chain of S&P 500 daily log returns (standardized, the
last ``--days`` days, ``phi``/``sigma`` fixed at typical posterior values): the proposal
inside :class:`~neuralblock.NeuralBlockKernel` (mixed with single-site random-walk MH)
against single-site random-walk MH alone (:class:`~neuralblock.RandomWalkMH`), each run by the
run harness (:func:`neuralblock.diagnostics.runs.timed_run`, ``clock="wall"``) for the same number of
sweeps: block acceptance, and effective sample size per second of ``h_t`` (median over 50 evenly
spaced states). The seconds are the harness's setup + warmup + sampling time, as before the harness
(which timed the whole ``pyro.infer.MCMC`` run) less MCMC's per-draw bookkeeping.

Usage::

    python -m experiments.chain_proposal_eval --quick
    python -m experiments.chain_proposal_eval
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.ops.stats import effective_sample_size

from experiments.common import load_proposal_or_untrained, open_study, parse_proposal_eval, pyplot, write_sections
from experiments.sv_models import load_sp500_returns
from motifs.chain import ChainMotif, stochastic_volatility_graph
from neuralblock import NeuralBlockKernel, RandomWalkMH
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, write_json
from neuralblock.diagnostics.runs import TimedRun, timed_run
from neuralblock.proposals import NeuralBlockProposal
from trainers.metrics import mc_acceptance
from trainers.trainer import evaluate

plt = pyplot()


FAMILIES = ("linear", "volatility", "mixed")
ESS_STATES = 50  # evenly spaced states whose ESS is computed (Pyro's ESS is slow per state)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    quick = {"instances": 256, "mc_samples": 8, "days": 80, "sweeps": 30}
    days, sweeps = (2000, "most recent S&P 500 days in part 2"), (2000, "MCMC sweeps per sampler in part 2")
    out = "experiments/results/chain_proposal"
    held_out_help = "held-out instantiations per family"
    return parse_proposal_eval(
        argv, __doc__, "chain", out, quick, held_out_help, days=days, phi=0.98, sigma=0.15, sweeps=sweeps
    )


def held_out(proposal: NeuralBlockProposal, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part 1: metrics of the network and of the whitening alone on each family."""
    rows = []
    for k, family in enumerate(FAMILIES):
        gen = torch.Generator().manual_seed(10_000 + 97 * args.seed + k)
        batch = ChainMotif(family).sample_training_batch(args.instances, gen)
        with torch.no_grad():
            net = evaluate(proposal.mdn, batch, ChainMotif().block_spec, args.mc_samples, seed=args.seed)
            zero = torch.zeros_like(batch.block)
            standard = torch.distributions.Independent(torch.distributions.Normal(zero, 1.0), 1)
            base_nll = float(-standard.log_prob(batch.block).mean())
            torch.manual_seed(args.seed)
            base_acc = float(mc_acceptance(standard, batch.block, batch.log_p_fn, args.mc_samples).mean())
            known = torch.isfinite(batch.exact_log_p)
            base_gap = float((batch.exact_log_p[known] - standard.log_prob(batch.block)[known]).mean())
        rows.append(
            {
                "family": family,
                "instances": args.instances,
                "nll": net["nll"],
                "nll_gap": net.get("nll_gap") if bool(known.any()) else None,
                "acceptance": net["acceptance"],
                "whitening_nll": base_nll,
                "whitening_nll_gap": base_gap if bool(known.any()) else None,
                "whitening_acceptance": base_acc,
            }
        )
    return rows


def run_sampler(kernel: Any, sweeps: int, seed: int) -> TimedRun:
    """``sweeps`` draws of ``x`` (kept) after ``max(10, sweeps // 10)`` warmup sweeps, through the run harness."""
    pyro.set_rng_seed(seed)
    return timed_run(
        kernel, samples=sweeps, warmup=max(10, sweeps // 10), keep=lambda params: params["x"], progress=True
    )


def sp500_chain(proposal: NeuralBlockProposal, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: NB(chain) + single-site vs single-site random-walk MH on the S&P 500 log-volatility."""
    returns = load_sp500_returns()[-args.days :]
    fg = stochastic_volatility_graph(returns, phi=args.phi, sigma=args.sigma)
    latent = fg.latent
    out: dict[str, Any] = {"days": args.days, "phi": args.phi, "sigma": args.sigma, "sweeps": args.sweeps}
    samplers = {
        "single-site RW-MH": RandomWalkMH(fg),
        "NB(chain) + single-site": NeuralBlockKernel(fg, proposals=[proposal], gibbs_prob=0.5),
    }
    for label, kernel in samplers.items():
        run = run_sampler(kernel, args.sweeps, args.seed)
        assert run.draws is not None
        h, seconds, diag = run.draws[:, latent], run.total_s, run.diagnostics
        tracked = torch.linspace(0, len(latent) - 1, min(len(latent), ESS_STATES)).round().long()
        ess = effective_sample_size(h[:, tracked].unsqueeze(0).double())  # per tracked state
        out[label] = {
            "seconds": seconds,
            "median_ess": float(ess.median()),
            "min_ess": float(ess.min()),
            "median_ess_per_second": float(ess.median() / seconds),
            "posterior_mean_h": h.mean(0)[:: max(1, len(latent) // 200)].tolist(),
            "acceptance": diag.get("acceptance_by_proposal", diag.get("acceptance_rate")),
        }
    return out


def plot(rows: list[dict[str, Any]], sv: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = torch.arange(len(rows)).float()
    axes[0].bar(x - 0.2, [r["acceptance"] for r in rows], 0.4, label="network (chain proposal)")
    axes[0].bar(x + 0.2, [r["whitening_acceptance"] for r in rows], 0.4, label="whitening alone")
    axes[0].set_xticks(x.tolist(), [r["family"] for r in rows])
    axes[0].axhline(0.7, color="k", lw=0.8, ls="--")
    axes[0].set_ylabel("independence-MH acceptance")
    axes[0].set_title("held-out instantiations")
    axes[0].legend(fontsize=8)
    labels = [k for k in sv if isinstance(sv[k], dict)]
    axes[1].bar(range(len(labels)), [sv[k]["median_ess_per_second"] for k in labels])
    axes[1].set_xticks(range(len(labels)), labels, fontsize=8)
    axes[1].set_ylabel("median ESS/s of h_t")
    axes[1].set_title(f"S&P 500 log-volatility, last {sv['days']} days")
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config, folder = open_study(args)
    proposal = load_proposal_or_untrained(args.proposal, args.quick, ChainMotif, hidden=(16,))
    rows = held_out(proposal, args)
    sv = sp500_chain(proposal, args)
    record = {"config": config, "held_out": rows, "sp500": sv}
    write_json(folder / "chain_proposal.json", record)
    columns = ["family", "instances", "nll", "nll_gap", "acceptance", "whitening_nll_gap", "whitening_acceptance"]
    sv_rows = [{"sampler": k, **v} for k, v in sv.items() if isinstance(v, dict)]
    sv_columns = ["sampler", "seconds", "median_ess", "min_ess", "median_ess_per_second"]
    sv_heading = (
        f"S&P 500 log-volatility chain (last {sv['days']} days, phi={sv['phi']}, sigma={sv['sigma']}, "
        f"{sv['sweeps']} sweeps each)"
    )
    sections = [
        ("Held-out instantiations", markdown_table(rows, columns)),
        (sv_heading, markdown_table(sv_rows, sv_columns)),
    ]
    write_sections(folder, "chain_proposal.md", f"chain proposal `{args.proposal}`", sections)
    plot(rows, sv, folder / "chain_proposal.png")
    return record


if __name__ == "__main__":
    main()
