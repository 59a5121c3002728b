"""Curated mutation testing of the kernel hot paths (issue 25): does the suite catch a broken kernel?

Each mutant is one small, deliberate bug (a flipped sign, swapped operands, a dropped term, an off-by-one) in one
hot-path file. The tool applies it to a *copy* of the committed source (a detached ``git worktree`` of ``HEAD`` in
a temporary folder, never the working tree, which other people edit), runs only the tests relevant to that file
there (``PYTHONPATH`` pointing at the copy), and records whether a test failed ("killed") or all passed
("survived"). A mutant whose ``find`` text no longer occurs exactly once in the file is reported as "stale" (the
source moved on: update the mutant). Mutants known to be equivalent (they cannot change any result, e.g. a
comparison with a continuous random number at equality) are listed with the reason and left out of the score.

The five bugs planted for issue 25 are mutants too (``planted=True``); they are run without ``-x`` so that the
report names every test that catches them and the statistic each one printed.

Usage::

    .venv/bin/python benchmarks/mutate.py                 # all mutants, report to benchmarks/results/
    .venv/bin/python benchmarks/mutate.py --only sequential.py solvers.py
    .venv/bin/python benchmarks/mutate.py --planted       # the five planted bugs only
    .venv/bin/python benchmarks/mutate.py --list

Not part of CI (tens of minutes on one core); ``make mutate`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# tests relevant to each hot-path file (run for its mutants only): our power tests and the existing ones that
# check the file's results, selected with -k to keep one run short
TESTS: dict[str, list[str]] = {
    "neuralblock/kernels/functional.py": [
        "tests/test_kernels.py",
        "tests/test_power_neural_block.py",
        "-k",
        "power or functional_core or gibbs_leaves or positive_support",
    ],
    "neuralblock/kernels/gibbs.py": [
        "tests/test_kernels.py",
        "tests/test_vectorized_chains.py",
        "tests/test_power_neural_block.py",
        "-k",
        "power or gibbs_leaves or gibbs_chains_leave",
    ],
    "neuralblock/kernels/neural_block.py": [
        "tests/test_power_neural_block.py",
        "tests/test_neural_block_kernel.py",
        "-k",
        "power or leaves_joint_invariant",
    ],
    "neuralblock/kernels/fused_blocks.py": [
        "tests/test_power_neural_block.py",
        "tests/test_neural_block_kernel.py",
        "tests/test_vectorized_chains.py",
        "-k",
        "power or leaves_joint_invariant or slots",
    ],
    "neuralblock/pyro/layout.py": [
        "tests/test_lwa.py",
        "tests/test_flat_layout.py",
        "-k",
        "subset_chain_matches or theta_update_is_exact or direct_path_log_target or jacobian",
    ],
    "neuralblock/kernels/gradient_discrete.py": [
        "tests/test_gradient_discrete.py",
        "-k",
        "invariant or one_step or read_from_the_tables",
    ],
    "neuralblock/kernels/fused_continuous.py": ["tests/test_fused_continuous.py"],
    "neuralblock/kernels/random_walk.py": ["tests/test_kernels.py", "-k", "random_walk_matches or positive_support"],
    "neuralblock/kernels/marginal.py": ["tests/test_pyro_models.py", "-k", "marginal_random_walk"],
    "neuralblock/replay.py": [
        "tests/test_replay.py",
        "tests/test_pyro_models.py",
        "-k",
        "replay or marginal or gmm_with",
    ],
    "neuralblock/kernels/austerity.py": [
        "tests/test_power_austerity.py",
        "tests/test_austerity.py",
        "-k",
        "power or epsilon_zero_reproduces_exact_mh_decisions or constrained_site or control_variate_sum_is_exact "
        "or joins_the_batched or time_budget",
    ],
    "neuralblock/kernels/lwa.py": [
        "tests/test_lwa.py",
        "-k",
        "subset_chain_matches or theta_update_is_exact or direct_path_log_target or proposals_and_weights or nonfinite",
    ],
    "neuralblock/subsample/sequential.py": [
        "tests/test_power_sequential.py",
        "tests/test_subsample.py",
        "-k",
        "power or student or exact_decision or below_its_bound or growth",
    ],
    "neuralblock/exact/junction_tree.py": [
        "tests/test_exact.py",
        "-k",
        "random_mrf or random_bn or zero_entries or observed_and_isolated or large_log_z",
    ],
    "neuralblock/coresets/solvers.py": [
        "tests/test_power_coresets.py",
        "tests/test_coresets.py",
        "-k",
        "power or frank_wolfe or nnls or random_constructions",
    ],
    "neuralblock/priorswap/swap.py": [
        "tests/test_priorswap.py",
        "-k",
        "exact_false_posterior or swap_log_density_matches or importance_swap or is_correction"
        " or elliptical_swap_matches",
    ],
    "neuralblock/diagnostics/__init__.py": ["tests/test_power_mcse.py"],
}


@dataclass
class Mutant:
    """One deliberate bug: replace ``find`` (which must occur exactly once) by ``replace`` in ``path``."""

    path: str
    find: str
    replace: str
    what: str
    planted: bool = False
    equivalent: str = ""  # the reason, when the mutant cannot change any result


F, G, NB, FB = (
    "neuralblock/kernels/functional.py",
    "neuralblock/kernels/gibbs.py",
    "neuralblock/kernels/neural_block.py",
    "neuralblock/kernels/fused_blocks.py",
)
RW, AU, LWA = "neuralblock/kernels/random_walk.py", "neuralblock/kernels/austerity.py", "neuralblock/kernels/lwa.py"
SEQ, JT = "neuralblock/subsample/sequential.py", "neuralblock/exact/junction_tree.py"
SOL, SW, DIA = "neuralblock/coresets/solvers.py", "neuralblock/priorswap/swap.py", "neuralblock/diagnostics/__init__.py"
MRW, REP = "neuralblock/kernels/marginal.py", "neuralblock/replay.py"
LAY, GD = "neuralblock/pyro/layout.py", "neuralblock/kernels/gradient_discrete.py"
FC = "neuralblock/kernels/fused_continuous.py"

MUTANTS: list[Mutant] = [
    # --- the five bugs planted for issue 25
    Mutant(
        SEQ,
        "fpc = math.sqrt(max(1.0 - (n - 1) / (num_sections - 1), 0.0))",
        "fpc = 1.0",
        "sequential test loses its finite-population correction",
        planted=True,
    ),
    Mutant(
        SOL,
        "den = sigma**2 - 2 * scale[f] * b[f] + lw_sq",
        "den = sigma**2 - scale[f] * b[f] + lw_sq",
        "Frank-Wolfe line search loses its factor 2",
        planted=True,
    ),
    Mutant(
        AU,
        "mu0 = (log_u - log_global - proposal.log_q_correction - proxy_sum) / n_total",
        "mu0 = (log_u - log_global + proposal.log_q_correction - proxy_sum) / n_total",
        "AusterityMH's Hastings correction has the wrong sign",
        planted=True,
    ),
    Mutant(
        DIA,
        "return means.mean(0), (means.var(0, unbiased=True) / total).sqrt()",
        "return means.mean(0), 3 * (means.var(0, unbiased=True) / total).sqrt()",
        "batch_means_mcse inflated 3x",
        planted=True,
    ),
    Mutant(
        NB,
        "return proposed, current, log_q_rev - log_q_fwd",
        "return proposed, current, log_q_fwd - log_q_rev",
        "neural block proposal ratio swapped (forward - reverse)",
        planted=True,
    ),
    # --- kernels/functional.py
    Mutant(F, "return MHInfo(log_u < safe,", "return MHInfo(log_u > safe,", "MH accept test inverted"),
    Mutant(
        F,
        'return torch.isnan(log_alpha) | (log_alpha == float("inf"))',
        "return torch.isnan(log_alpha)",
        "+inf log-ratios no longer rejected",
    ),
    Mutant(F, "best, draw = (scores - gumbel).max(-1)", "best, draw = (scores + gumbel).max(-1)", "Gumbel noise sign"),
    Mutant(F, "stuck = ~torch.isfinite(best)", "stuck = torch.isnan(best)", "rows without mass not kept"),
    Mutant(
        F,
        "correction = transform.log_abs_det_jacobian(y_new, proposed) - transform.log_abs_det_jacobian(y, value)",
        "correction = transform.log_abs_det_jacobian(y, value) - transform.log_abs_det_jacobian(y_new, proposed)",
        "random-walk Jacobian correction sign",
    ),
    Mutant(F, "safe.clamp(max=0.0).exp()", "safe.clamp(min=0.0).exp()", "reported accept probability above 1"),
    # --- kernels/gibbs.py
    Mutant(
        G,
        "total = read[..., 0] * strides[..., 0]",
        "total = read[..., 0] + strides[..., 0]",
        "fused Gibbs table offset",
    ),
    Mutant(
        G,
        "logits = logits.masked_fill(values.T < 0, -math.inf)",
        "logits = logits.masked_fill(values.T <= 0, -math.inf)",
        "general Gibbs masks value 0",
    ),
    Mutant(
        G,
        "            state[:, vars_] = info.values\n            stuck = stuck + info.num_stuck",
        "            state[:, vars_] = state[:, vars_]\n            stuck = stuck + info.num_stuck",
        "general Gibbs drops its draws",
    ),
    Mutant(
        G,
        "    state = state.clone()\n    state[:, vars_] = values\n    return state, num_stuck",
        "    state = state.clone()\n    state[:, vars_[:-1]] = values[:, :-1]\n    return state, num_stuck",
        "fused Gibbs drops the last variable of each class (off-by-one)",
    ),
    Mutant(
        G,
        "values = torch.minimum(grid, card - 1).to(torch.get_default_dtype())",
        "values = torch.minimum(grid, card).to(torch.get_default_dtype())",
        "clamp of padded values",
        equivalent="entries with grid >= card are replaced by -1 on the next line; the others are < card anyway",
    ),
    # --- kernels/neural_block.py
    Mutant(NB, "change = local[1] - local[0]", "change = local[0] - local[1]", "block density change reversed"),
    Mutant(
        NB,
        "torch.where(info.accepted[..., None], proposed, current)",
        "torch.where(info.accepted[..., None], current, proposed)",
        "accepted and rejected blocks swapped",
    ),
    Mutant(
        NB,
        "log_alpha = new_local - scaffold.local_log_density(fg, state) + log_q_ratio.to(new_local.dtype)",
        "log_alpha = new_local - scaffold.local_log_density(fg, state) - log_q_ratio.to(new_local.dtype)",
        "speculative path's proposal ratio sign",
    ),
    Mutant(
        NB,
        "info = mh_accept(change + log_q_ratio.to(local.dtype))",
        "info = mh_accept(change)",
        "block MH drops the proposal ratio",
    ),
    # --- kernels/fused_blocks.py
    Mutant(
        FB,
        "log_alpha = flat_ratio.take(first + proposed) - flat_ratio.take(first + current)",
        "log_alpha = flat_ratio.take(first + current) - flat_ratio.take(first + proposed)",
        "fused ratio",
    ),
    Mutant(
        FB,
        "self.log_ratio[rows[chunk]] = energy[chunk].to(self.cdf.dtype) - log_drawn",
        "self.log_ratio[rows[chunk]] = energy[chunk].to(self.cdf.dtype) + log_drawn",
        "fused table's proposal term sign (the fused swapped ratio)",
    ),
    Mutant(
        FB,
        "keys = base + (context @ context_radix).long()",
        "keys = base + 0 * (context @ context_radix).long()",
        "fused path ignores the context (one row per instance)",
    ),
    Mutant(
        FB,
        "accepted = (log_accept < log_alpha) & finite",
        "accepted = (log_accept < log_alpha) | finite",
        "fused path accepts every finite proposal",
    ),
    Mutant(
        FB,
        "self.log_ratio[rows[chunk]] = energy[chunk].to(self.cdf.dtype) - log_drawn",
        "self.log_ratio[rows[chunk]] = energy[chunk].to(self.cdf.dtype) - log_drawn.roll(1, -1)",
        "fused ratio reads the proposal one value off (off-by-one)",
    ),
    Mutant(
        FB, "self.slot[keys] = rows", "self.slot[keys] = rows.flip(0)", "slot-mode table rows mapped to the wrong keys"
    ),
    Mutant(
        FB,
        "proposed = torch.searchsorted(rows, draws.unsqueeze(-1), right=True)",
        "proposed = torch.searchsorted(rows, draws.unsqueeze(-1), right=False)",
        "inverse-CDF comparison at equality",
        equivalent="a continuous uniform equals a CDF value with probability 0",
    ),
    # --- kernels/gradient_discrete.py
    Mutant(
        GD,
        "log_alpha = log_ratio + log_proposal_ratio if self._exact_correction else log_ratio",
        "log_alpha = log_ratio - log_proposal_ratio if self._exact_correction else log_ratio",
        "gradient kernels' proposal ratio sign",
    ),
    Mutant(
        GD,
        "for step in range(steps - 1, -1, -1):",
        "for step in range(steps):",
        "PAS scores the reverse path in forward order",
    ),
    Mutant(
        GD,
        "log_reverse = self._log_probs(reverse_grad, draw).gather(-1, values[..., None])",
        "log_reverse = self._log_probs(reverse_grad, draw).gather(-1, draw[..., None])",
        "DMALA's reverse proposal scores staying at the proposal",
    ),
    Mutant(
        GD,
        "free = entry - values[..., j] * self.radix[j]  # the entry with position j's value at 0",
        "free = entry  # the entry with position j's value at 0",
        "table-read gradient starts from the current entry, not from position j's value 0",
    ),
    # --- kernels/fused_continuous.py
    Mutant(
        FC,
        "log_alpha = change + (log_q_rev - log_q_fwd).to(change.dtype)",
        "log_alpha = change - log_q_fwd.to(change.dtype)",
        "fused continuous update drops the reverse proposal density",
    ),
    Mutant(
        FC,
        "change = change * beta[:, None].to(change.dtype)",
        "change = change",
        "fused continuous update ignores the tempering",
    ),
    # --- kernels/marginal.py
    Mutant(
        MRW,
        "info = mh_decide(potential - new, log_u[j])",
        "info = mh_decide(new - potential, log_u[j])",
        "marginal MH ratio",
    ),
    Mutant(
        MRW,
        "            u = torch.where(info.accepted, proposal, u)\n"
        "            potential = torch.where(info.accepted, new, potential)",
        "            u = torch.where(info.accepted, proposal, u)",
        "marginal walk keeps the old potential after an accept",
    ),
    Mutant(
        MRW,
        "            self._values = self._gibbs.sample(discrete)",
        "            self._values = discrete",
        "discrete sites never redrawn after the walk",
    ),
    # --- replay.py
    Mutant(
        REP,
        "            if not _same(out, want):",
        "            if False:",
        "recorded graphs never checked on new inputs",
    ),
    Mutant(
        REP,
        "        if node in written:",
        "        if False:",
        "constant folding through in-place updates",
    ),
    # --- kernels/random_walk.py
    Mutant(
        RW,
        "info = mh_decide(local[1] - local[0] + correction, log_u)",
        "info = mh_decide(local[1] - local[0] - correction, log_u)",
        "single-site RW-MH Jacobian sign",
    ),
    Mutant(
        RW,
        "info = mh_decide(local[1] - local[0] + correction, log_u)",
        "info = mh_decide(local[0] - local[1] + correction, log_u)",
        "single-site RW-MH density change reversed",
    ),
    Mutant(
        RW,
        "state[..., cls.vars] = torch.where(info.accepted, proposal, current)",
        "state[..., cls.vars] = torch.where(info.accepted, current, proposal)",
        "accepted and rejected values swapped",
    ),
    # --- kernels/austerity.py
    Mutant(
        AU,
        "correction = proposal(value).log_prob(z).sum() - forward.log_prob(value).sum()",
        "correction = forward.log_prob(value).sum() - proposal(value).log_prob(z).sum()",
        "distribution_propose's Hastings term sign",
    ),
    Mutant(AU, "log_global += log_jacobian_diff", "log_global -= log_jacobian_diff", "log-Jacobian sign"),
    Mutant(
        AU,
        "return terms.global_term, terms.sections[1] - terms.sections[0] - (first + 0.5 * second)",
        "return terms.global_term, terms.sections[1] - terms.sections[0] - (first + second)",
        "recorded control-variate stage: second-order term without its 1/2",
    ),
    Mutant(
        AU,
        "return math.isinf(self.audit_budget) or expected <= self.audit_budget * spent",
        "return math.isinf(self.audit_budget) or expected >= self.audit_budget * spent",
        "audit budget inverted",
    ),
    Mutant(
        AU,
        "mu0 = (log_u - log_global - proposal.log_q_correction - proxy_sum) / n_total",
        "mu0 = (log_u - log_global - proposal.log_q_correction + proxy_sum) / n_total",
        "control variate's exact sum sign",
    ),
    Mutant(
        AU,
        "return terms.global_term, terms.sections[1] - terms.sections[0] - self._proxy(idx, z, z_new)",
        "return terms.global_term, terms.sections[1] - terms.sections[0] + self._proxy(idx, z, z_new)",
        "per-section proxy added instead of subtracted",
    ),
    Mutant(
        AU,
        "return self._cv_rows[idx] @ (z_new - z).to(self._cv_rows.dtype)",
        "return self._cv_rows[idx] @ (z - z_new).to(self._cv_rows.dtype)",
        "first-order proxy direction",
    ),
    Mutant(
        AU,
        "return self.layout.unflatten((proposal.value if info.accept else z).detach())",
        "return self.layout.unflatten((z if info.accept else proposal.value).detach())",
        "accept keeps the old point",
    ),
    Mutant(
        AU,
        "return self._cv_grad @ delta + 0.5 * delta @ self._cv_hess @ spread",
        "return self._cv_grad @ delta - 0.5 * delta @ self._cv_hess @ spread",
        "second-order proxy sum sign (user-given control variate)",
    ),
    # --- kernels/lwa.py
    Mutant(LWA, "log_alpha = log_nu - self._log_nu", "log_alpha = self._log_nu - log_nu", "subset move ratio"),
    Mutant(LWA, "scale = self.num_data / indices.numel()", "scale = indices.numel() / self.num_data", "N/n scale"),
    Mutant(
        LAY,
        "log_jacobian = log_jacobian + bijection.log_abs_det_jacobian(u, values[name]).sum()",
        "log_jacobian = log_jacobian - bijection.log_abs_det_jacobian(u, values[name]).sum()",
        "log-Jacobian sign of one point (LWA's target)",
    ),
    Mutant(
        LWA,
        "return torch.logsumexp(log_w_candidates, 0) - torch.logsumexp(torch.cat([log_w_references, current]), 0)",
        "return torch.logsumexp(log_w_candidates, 0) - torch.logsumexp(log_w_references, 0)",
        "multiple-try ratio drops the current subset",
    ),
    Mutant(
        LWA,
        "info = mh_accept(torch.tensor([_log_ratio(new, current)], dtype=torch.float64))",
        "info = mh_accept(torch.tensor([_log_ratio(current, new)], dtype=torch.float64))",
        "theta move ratio reversed",
    ),
    # --- subsample/sequential.py
    Mutant(SEQ, "se = sd / math.sqrt(n) * fpc", "se = sd / n * fpc", "standard error uses n, not sqrt(n)"),
    Mutant(
        SEQ,
        "return t, student_t_sf(abs(t), n - 1)",
        "return t, student_t_sf(abs(t), n)",
        "t-tail degrees of freedom off by one",
    ),
    Mutant(
        SEQ,
        "m2 += b_m2 + delta_mean * delta_mean * n * k / total",
        "m2 += b_m2",
        "pooled variance drops the between-batch term",
    ),
    Mutant(SEQ, "mean += delta_mean * k / total", "mean += delta_mean * n / total", "running mean weight"),
    Mutant(
        SEQ,
        "k = int(math.ceil(min(batch_size * growth**stages, num_sections) - 1e-9))",
        "k = int(math.ceil(min(batch_size * growth ** (stages + 1), num_sections) - 1e-9))",
        "geometric growth off by one stage",
    ),
    Mutant(SEQ, "return tail if t >= 0 else 1.0 - tail", "return tail", "t tail for negative t"),
    Mutant(
        SEQ,
        "if err < epsilon:  # False for NaN",
        "if err <= epsilon:  # False for NaN",
        "stop at equality",
        equivalent="the error bound is a continuous function of the data: equality with epsilon has probability 0",
    ),
    # --- exact/junction_tree.py
    Mutant(JT, "log_const += top", "log_const -= top", "factor normalizer sign"),
    Mutant(JT, "return msg / top, math.log(top)", "return msg, math.log(top)", "message normalizer counted twice"),
    Mutant(
        JT,
        "elim_table = _sum_out(belief, cvars, clique.elim, cards) / total",
        "elim_table = _sum_out(belief, cvars, clique.elim, cards)",
        "marginals not normalized",
    ),
    Mutant(JT, "delta.div_(child_msgs[c])", "delta.mul_(child_msgs[c])", "Hugin division replaced by product"),
    Mutant(
        JT,
        "factors.append(_Potential(tuple(kept), (table - top).exp()))",
        "factors.append(_Potential(tuple(kept), table.exp()))",
        "factor tables not shifted by their max",
    ),
    Mutant(
        JT,
        "total = max(total, size) + math.log2(1 + 2 ** (min(total, size) - max(total, size)))",
        "total = max(total, size)",
        "elimination-order cost drops the log-sum term",
        equivalent="only the choice of elimination order changes; every order gives the same exact results",
    ),
    # --- coresets/solvers.py
    Mutant(
        SOL,
        "num = scale[f] * (align[f] - b[f]) - (lw_l - lw_sq)",
        "num = scale[f] * (align[f] - b[f]) + (lw_l - lw_sq)",
        "line-search numerator sign",
    ),
    Mutant(
        SOL,
        "f = int(torch.sub(align, b, out=score).mul_(inv_norms).add_(penalty).argmax())",
        "f = int(torch.sub(align, b, out=score).add_(penalty).argmax())",
        "vertex choice not normalized by the feature norms",
    ),
    Mutant(
        SOL,
        "b.mul_(1 - gamma).add_(column, alpha=float(gamma * scale[f]))",
        "b.mul_(1 - gamma).add_(column, alpha=float(gamma))",
        "running inner products drop the vertex scale",
    ),
    Mutant(SOL, "dual = target - gram @ weights", "dual = gram @ weights - target", "NNLS dual sign"),
    Mutant(
        SOL,
        "if (total - approx).norm() > (total - weights[support] @ rows).norm():",
        "if (total - approx).norm() < (total - weights[support] @ rows).norm():",
        "refit kept only when it is worse",
    ),
    Mutant(
        SOL,
        "return _counts_to_weights(draws, 1.0 / (size * probs[draws]), num_data)",
        "return _counts_to_weights(draws, 1.0 / (size * probs[draws] ** 2), num_data)",
        "importance weights squared",
    ),
    # --- priorswap/swap.py
    Mutant(
        SW,
        "return log_q + target_prior.flat_log_prob(theta) - false_prior.flat_log_prob(theta)",
        "return log_q - target_prior.flat_log_prob(theta) + false_prior.flat_log_prob(theta)",
        "swapped density's prior ratio inverted",
    ),
    Mutant(SW, "log_q = density.log_prob(theta) + log_det", "log_q = density.log_prob(theta) - log_det", "log-det"),
    Mutant(
        SW,
        "return float((2 * log_weights.logsumexp(0) - (2 * log_weights).logsumexp(0)).exp())",
        "return float((log_weights.logsumexp(0) - (2 * log_weights).logsumexp(0)).exp())",
        "Kish ESS drops a factor 2",
    ),
    Mutant(
        SW,
        "weights = (log_weights - log_weights.logsumexp(0)).exp()",
        "weights = (log_weights - log_weights.max()).exp()",
        "importance weights not normalized",
    ),
    Mutant(
        SW,
        "return self.target_prior.flat_log_prob(theta) - self.false_prior.flat_log_prob(theta)",
        "return self.false_prior.flat_log_prob(theta) - self.target_prior.flat_log_prob(theta)",
        "importance log prior ratio inverted",
    ),
    Mutant(
        SW,
        'pyro.factor("swapped_density", self.problem.log_density(z[None])[0] - log_det)',
        'pyro.factor("swapped_density", self.problem.log_density(z[None])[0] + log_det)',
        "Pyro model of the swapped density: log-det sign",
    ),
    # --- diagnostics/__init__.py (the MCSE oracle)
    Mutant(DIA, "means.var(0, unbiased=True)", "means.var(0, unbiased=False)", "biased variance of batch means"),
]


@dataclass
class Outcome:
    """What happened to one mutant."""

    mutant: Mutant
    status: str  # killed | survived | stale | equivalent | error
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)  # "test id - message" lines of the failing tests


def _pytest(tree: Path, tests: list[str], stop_first: bool, timeout: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "COLUMNS": "4000"}  # unclipped -rf lines
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rf", "--tb=no"]
    cmd += ["-o", "addopts=", "-o", f"timeout={timeout}"] + (["-x"] if stop_first else []) + tests
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return 124, "TIMEOUT"
    return proc.returncode, proc.stdout + proc.stderr


def _failures(output: str) -> list[str]:
    return [line[len("FAILED ") :].strip() for line in output.splitlines() if line.startswith("FAILED ")]


def run(
    mutants: list[Mutant],
    timeout: int,
    keep: bool = False,
    on_progress: Callable[[list[Outcome], dict], None] | None = None,
) -> tuple[list[Outcome], dict[str, str]]:
    """Apply each mutant in a worktree of ``HEAD``; returns the outcomes and the baseline status per file.

    Each file's tests first run unmutated (its baseline) just before its first mutant; ``on_progress`` is called
    after every mutant (the report is rewritten as the run goes).
    """
    tree = Path(tempfile.mkdtemp(prefix="mut-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), "HEAD"], cwd=ROOT, check=True, capture_output=True)
    outcomes: list[Outcome] = []
    baseline: dict[str, str] = {}
    try:
        for i, m in enumerate(mutants):
            source = tree / m.path
            original = source.read_text()
            if m.equivalent:
                outcomes.append(Outcome(m, "equivalent"))
                continue
            if original.count(m.find) != 1:
                outcomes.append(Outcome(m, "stale"))
                print(f"[{i + 1}/{len(mutants)}] STALE {m.path}: {m.what}", flush=True)
                continue
            if m.path not in baseline:
                code, out = _pytest(tree, TESTS[m.path], stop_first=True, timeout=timeout)
                baseline[m.path] = "pass" if code == 0 else f"FAIL ({code}): {_failures(out)[:3]}"
                print(f"baseline {m.path}: {baseline[m.path]}", flush=True)
            if baseline[m.path] != "pass":
                outcomes.append(Outcome(m, "error", failed=[f"baseline fails: {baseline[m.path]}"]))
                continue
            source.write_text(original.replace(m.find, m.replace))
            start = time.perf_counter()
            try:
                code, out = _pytest(tree, TESTS[m.path], stop_first=not m.planted, timeout=timeout)
            finally:
                source.write_text(original)
            seconds = time.perf_counter() - start
            failed = _failures(out) if code != 124 else ["timeout (the mutant hangs)"]
            status = "survived" if code == 0 else "killed" if code in (1, 124) else "error"
            if status == "error":
                failed = [out.strip().splitlines()[-1] if out.strip() else f"pytest exit {code}"]
            outcomes.append(Outcome(m, status, seconds, failed))
            print(f"[{i + 1}/{len(mutants)}] {status.upper():9s} {seconds:6.1f}s {m.path}: {m.what}", flush=True)
            if on_progress is not None:
                on_progress(outcomes, baseline)
    finally:
        if not keep:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
            shutil.rmtree(tree.parent, ignore_errors=True)
    return outcomes, baseline


def report(outcomes: list[Outcome], baseline: dict[str, str], commit: str, name: str) -> str:
    """Markdown report; also writes ``<name>.json`` and ``<name>.md`` under benchmarks/results."""
    rows, total_killed, total_scored = [], 0, 0
    for path in dict.fromkeys(o.mutant.path for o in outcomes):
        mine = [o for o in outcomes if o.mutant.path == path]
        killed = sum(o.status == "killed" for o in mine)
        scored = sum(o.status in ("killed", "survived") for o in mine)
        total_killed, total_scored = total_killed + killed, total_scored + scored
        score = f"{100 * killed / scored:.0f}%" if scored else "-"
        equivalent = sum(o.status == "equivalent" for o in mine)
        other = sum(o.status in ("stale", "error") for o in mine)
        rows.append(f"| `{path}` | {len(mine)} | {killed} | {scored - killed} | {equivalent} | {other} | {score} |")
    overall = f"{100 * total_killed / total_scored:.1f}%" if total_scored else "-"
    lines = [
        "# Mutation report (issue 25)",
        "",
        f"Commit `{commit}`; `make mutate` (`.venv/bin/python benchmarks/mutate.py`). Score: killed / (killed +",
        "survived); equivalent mutants are listed with their reason and left out; stale ones no longer match the",
        "source. Tests run per file: " + "; ".join(f"`{Path(p).name}`: `{' '.join(TESTS[p])}`" for p in baseline) + ".",
        "",
        f"**Overall: {total_killed} of {total_scored} non-equivalent mutants killed ({overall}).**",
        "",
        "| file | mutants | killed | survived | equivalent | stale/error | score |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## The five planted bugs",
        "",
    ]
    for o in (o for o in outcomes if o.mutant.planted):
        lines.append(f"- **{o.mutant.what}** (`{o.mutant.path}`): {o.status}, by {len(o.failed)} test(s):")
        lines += [f"  - `{_clip(f)}`" for f in o.failed]
    lines += ["", "## Surviving, equivalent, stale and erroring mutants", ""]
    for o in outcomes:
        if o.status in ("survived", "equivalent", "stale", "error"):
            why = o.mutant.equivalent or "; ".join(o.failed) or ""
            lines.append(f"- {o.status}: `{o.mutant.path}`: {o.mutant.what} (`{_clip(o.mutant.replace, 90)}`) {why}")
    lines += ["", "## All mutants", "", "| file | mutant | status | s | first failing test |", "|---|---|---|---|---|"]
    for o in outcomes:
        first = _clip(o.failed[0], 100).replace("|", "/") if o.failed else ""
        lines.append(f"| `{Path(o.mutant.path).name}` | {o.mutant.what} | {o.status} | {o.seconds:.0f} | {first} |")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)
    payload = {
        "commit": commit,
        "overall": {"killed": total_killed, "scored": total_scored},
        "baseline": baseline,
        "mutants": [{**asdict(o.mutant), **{k: v for k, v in asdict(o).items() if k != "mutant"}} for o in outcomes],
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    return text


def _clip(text: str, width: int = 300) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= width else text[: width - 3] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="file names (e.g. sequential.py) to mutate")
    parser.add_argument("--planted", action="store_true", help="only the five bugs planted for issue 25")
    parser.add_argument("--skip-planted", action="store_true", help="leave the five planted bugs out")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test run of one mutant")
    parser.add_argument("--name", default="mutation_report", help="report file name under benchmarks/results")
    parser.add_argument("--keep", action="store_true", help="keep the worktree (debugging)")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if (not args.planted or m.planted) and not (args.skip_planted and m.planted)]
    if args.only:
        mutants = [m for m in mutants if Path(m.path).name in args.only]
    if args.list:
        for m in mutants:
            flag = "planted" if m.planted else "equivalent" if m.equivalent else ""
            print(f"{m.path}: {m.what} {flag}")
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    sha = commit.stdout.strip()
    outcomes, baseline = run(
        mutants, args.timeout, args.keep, on_progress=lambda done, base: report(done, base, sha, args.name)
    )
    print(report(outcomes, baseline, sha, args.name))


if __name__ == "__main__":
    main()
