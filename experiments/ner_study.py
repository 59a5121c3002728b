"""Study: neural block proposals vs single-site Gibbs for NER tagging (WNUT-17) under the shipped CRF.

The NER experiment of the seed paper: the tag sequences of WNUT-17 test sentences are
sampled under the shipped linear-chain CRF (:mod:`motifs.crf`). All sentences live in
**one** :class:`~neuralblock.graph.FactorGraph` (``crf.corpus_graph``: one chain MRF per
sentence), so one kernel samples every sentence at once and conflict-free blocks of
different sentences are proposed in one batch. Samplers, each run by the run harness
(:func:`neuralblock.diagnostics.runs.timed_run`, ``clock="wall"``) for the same budget of sampling
time, from the same uniformly random initial tags:

* ``Gibbs``: single-site chromatic Gibbs (:class:`~neuralblock.GibbsKernel`);
* ``NB(crf_tags-n)+Gibbs``: :class:`~neuralblock.NeuralBlockKernel` with the shipped
  ``crf_tags-n`` proposal (``n = 2, 3, 4`` consecutive tags), mixed with Gibbs sweeps
  (``gibbs_prob = 0.5``);
* with ``--gradient-samplers GWG DMALA PAS`` (issue 26): Gibbs-with-Gradients, discrete Langevin
  with its MH correction and the path auxiliary sampler, on the same budget.

:class:`NerTrace`, the harness's ``observe``, records at geometric checkpoints (in sweeps,
i.e. MCMC iterations), against the harness's sampling time (the transitions alone: neither the
metric computation nor, as before the harness, ``pyro.infer.MCMC``'s per-draw bookkeeping):
token F1 (non-``O`` tags, micro) and entity F1 (BIO spans) against gold of the current sample's
tags and of the max-marginal decode of the running empirical marginals; the model log-likelihood
(CRF score, ``fg.log_joint``) of the current state; and the mean absolute error of the running
marginals against the exact forward-backward marginals. The time to Gibbs's final marginal error
is the first hit (:func:`~neuralblock.diagnostics.runs.first_time`, ``for_good=False``).
Ceilings: exact Viterbi and exact max-marginal decoding, the Viterbi score, and the
posterior mean score (Monte Carlo over exact FFBS samples).

Outputs (under ``--out``, in a folder named by a hash of the config): ``ner_study.json``,
``ner_study.md`` (table) and PNG plots (``ner_f1.png``, ``ner_loglik.png``,
``ner_marginal_error.png``).

Usage::

    python -m experiments.ner_study --quick     # CI scale: 20 sentences, 2 s per sampler, 1 seed
    python -m experiments.ner_study             # full run: 300 sentences, 60 s per sampler, 2 seeds
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import Tensor
from tqdm import tqdm

from experiments.common import add_gradient_samplers, add_run_options, parse_quick, pyplot, study_parser
from experiments.crf_model import entity_spans, precision_recall_f1
from motifs.crf import load_crf, read_conll
from neuralblock import GibbsKernel, NeuralBlockKernel, list_pretrained, load_pretrained
from neuralblock.diagnostics.plots import plot_error_traces, save_figure
from neuralblock.diagnostics.reports import write_report
from neuralblock.diagnostics.runs import CLOCKS, ErrorTrace, TimedRun, first_time, study_folder, timed_run
from neuralblock.exact import chain_marginals, chain_sample, chain_score, chain_viterbi
from neuralblock.graph import FactorGraph
from neuralblock.io import data_path
from neuralblock.kernels import GRADIENT_SAMPLERS, GraphKernel

plt = pyplot()


PROPOSALS = ["crf_tags-2", "crf_tags-3", "crf_tags-4"]
TEST_FILE = "emerging.test.annotated"
METRICS = ["errors", "loglik", "token_f1_sample", "entity_f1_sample", "token_f1_mm", "entity_f1_mm"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=300, help="first N WNUT-17 test sentences (0: all)")
    parser.add_argument("--seconds", type=float, default=60.0, help="sampling wall time per sampler and seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--proposals", nargs="*", default=PROPOSALS, help="shipped crf_tags proposals")
    parser.add_argument("--gibbs-prob", type=float, default=0.5)
    add_gradient_samplers(parser, "also run these gradient-informed samplers (issue 26) on the same budget")
    parser.add_argument("--growth", type=float, default=1.25, help="geometric checkpoint factor (sweeps)")
    parser.add_argument("--exact-samples", type=int, default=256, help="FFBS draws for the posterior mean score")
    add_run_options(parser, "experiments/results/ner_study", "CI scale (missing proposals are skipped)")
    args = parse_quick(parser, argv, {"sentences": 20, "seconds": 2.0, "seeds": 1})
    if args.seconds <= 0 or args.seeds < 1 or args.growth <= 1.0:
        parser.error("--seconds must be > 0, --seeds >= 1 and --growth > 1")
    return args


# ---------------------------------------------------------------------------- the corpus
@dataclass
class NerCorpus:
    """Test sentences, their corpus graph, gold tags and the exact references (all flat over tokens)."""

    tokens: list[list[str]]
    tags: list[str]
    fg: FactorGraph
    gold: Tensor  # [N] tag ids
    offsets: list[int]  # sentence j covers variables offsets[j]:offsets[j + 1]
    gold_spans: list[set[tuple[int, int, str]]]
    exact: Tensor  # [N, K] forward-backward marginals
    viterbi: Tensor  # [N]
    posterior_mean_score: float

    @property
    def num_entities(self) -> int:
        return sum(len(s) for s in self.gold_spans)


def load_corpus(num_sentences: int, exact_samples: int, seed: int) -> NerCorpus:
    """The first ``num_sentences`` WNUT-17 test sentences (0: all) under the shipped CRF."""
    crf = load_crf()
    sentences = read_conll(data_path("ner_wnut17", TEST_FILE), crf.tags)
    if num_sentences > 0:
        sentences = sentences[:num_sentences]
    tokens = [t for t, _ in sentences]
    fg = crf.corpus_graph(tokens)
    with torch.no_grad():
        feats, mask = crf.featurize(tokens)
        unary = crf.potentials(feats, mask).double()
        trans = crf.transitions.detach().double()
        exact = chain_marginals(unary, trans, mask)[mask]
        viterbi = chain_viterbi(unary, trans, mask)[0][mask]
        draws = chain_sample(unary, trans, mask, exact_samples, torch.Generator().manual_seed(seed))
        posterior_mean = float(chain_score(unary, trans, draws, mask).sum(-1).mean())
    lengths = [len(t) for t in tokens]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return NerCorpus(
        tokens=tokens,
        tags=list(crf.tags),
        fg=fg,
        gold=torch.cat([crf.tag_ids(g) for _, g in sentences]),
        offsets=offsets,
        gold_spans=[entity_spans(g) for _, g in sentences],
        exact=exact.to(torch.get_default_dtype()),
        viterbi=viterbi,
        posterior_mean_score=posterior_mean,
    )


# ---------------------------------------------------------------------------- metrics
def _f1(tp: int, n_pred: int, n_gold: int) -> float:
    return precision_recall_f1(tp, n_pred, n_gold)["f1"]


def token_f1(pred: Tensor, gold: Tensor) -> float:
    """Micro F1 over non-``O`` tags (tag id 0 is ``O``): exact tag match on gold non-``O`` tokens."""
    pred, gold = pred.long(), gold.long()
    tp = int(((pred == gold) & (gold != 0)).sum())
    return _f1(tp, int((pred != 0).sum()), int((gold != 0).sum()))


def entity_f1(pred: Tensor, corpus: NerCorpus) -> float:
    """Micro F1 over BIO entity spans (exact span and type), sentence by sentence."""
    names = [corpus.tags[i] for i in pred.long().tolist()]
    tp = n_pred = 0
    for j, gold in enumerate(corpus.gold_spans):
        spans = entity_spans(names[corpus.offsets[j] : corpus.offsets[j + 1]])
        tp += len(spans & gold)
        n_pred += len(spans)
    return _f1(tp, n_pred, corpus.num_entities)


def marginal_mae(est: Tensor, exact: Tensor) -> float:
    """Mean absolute error over all tokens and all tag values."""
    return float((est - exact).abs().mean())


def decode_metrics(pred: Tensor, corpus: NerCorpus) -> dict[str, float]:
    return {"token_f1": token_f1(pred, corpus.gold), "entity_f1": entity_f1(pred, corpus)}


# ---------------------------------------------------------------------------- the record
class NerTrace:
    """The run harness's ``observe`` for NER: metrics at geometric checkpoints in sweeps.

    Accumulates visit counts of every draw. At sweeps ``1, 2, ...`` growing by ``growth`` it
    records the metrics of the current state and of the running marginals; :meth:`finish`
    records the last draw and reads the checkpoints' sampling times from the harness's run.

    Args:
        corpus: the corpus (graph, gold tags, exact marginals).
        initial: the initial state, recorded as sweep 0 (at 0 s).
        growth: checkpoint growth factor.
    """

    def __init__(self, corpus: NerCorpus, initial: Tensor, growth: float = 1.25) -> None:
        self.corpus, self.growth = corpus, growth
        n, k = corpus.exact.shape
        self.rows = torch.arange(n)
        self.counts = torch.zeros(n, k)
        self.trace: dict[str, list[float]] = {"sweeps": [], "seconds": [], **{m: [] for m in METRICS}}
        self.n = 0
        self.next_checkpoint = 1
        self._record(initial.long(), torch.nn.functional.one_hot(initial.long(), k).to(self.counts.dtype))

    def _record(self, state: Tensor, marginals: Tensor) -> None:
        corpus = self.corpus
        sample = decode_metrics(state, corpus)
        mm = decode_metrics(marginals.argmax(-1), corpus)
        values = {
            "sweeps": float(self.n),
            "errors": marginal_mae(marginals, corpus.exact),
            "loglik": float(corpus.fg.log_joint(state.to(torch.get_default_dtype()))),
            "token_f1_sample": sample["token_f1"],
            "entity_f1_sample": sample["entity_f1"],
            "token_f1_mm": mm["token_f1"],
            "entity_f1_mm": mm["entity_f1"],
        }
        for key, value in values.items():
            self.trace[key].append(value)

    def __call__(self, params: Mapping[str, Tensor]) -> None:
        state = params["x"].long()
        self.counts[self.rows, state] += 1
        self.n += 1
        if self.n >= self.next_checkpoint:
            self._record(state, self.counts / self.n)
            while self.next_checkpoint <= self.n:
                self.next_checkpoint = max(self.next_checkpoint + 1, math.ceil(self.next_checkpoint * self.growth))

    def finish(self, run: TimedRun) -> dict[str, list[float]]:
        """Record the last draw (if not a checkpoint) and the checkpoints' seconds; returns the trace."""
        if self.n and self.trace["sweeps"][-1] != self.n:
            self._record(run.params["x"].long(), self.counts / self.n)
        self.trace["seconds"] = [run.times[int(n) - 1] if n else 0.0 for n in self.trace["sweeps"]]
        return self.trace


def prime(kernel: GraphKernel, initial: Tensor) -> None:
    """Untimed warm-up: a few transitions of each kind, so one-off costs (torch's first calls of
    an op, allocator growth) are not charged to whichever sampler happens to run first."""
    kernel.initial_params = {"x": initial.clone()}
    kernel.setup(0)
    params = kernel.initial_params
    gibbs_prob = getattr(kernel, "gibbs_prob", None)
    for prob in (0.0, 1.0) if gibbs_prob is not None else (None,):
        if prob is not None:
            kernel.gibbs_prob = prob  # type: ignore[attr-defined]
        for _ in range(3):
            params = kernel.sample(params)
    if gibbs_prob is not None:
        kernel.gibbs_prob = gibbs_prob  # type: ignore[attr-defined]


def run_sampler(kernel: GraphKernel, corpus: NerCorpus, initial: Tensor, seconds: float, growth: float) -> dict:
    """Run ``kernel`` from ``initial`` for ``seconds`` of sampling time (the run harness, wall clock).

    ``wall_seconds_total`` is the whole call on the same clock: setup and the metrics included.
    """
    trace = NerTrace(corpus, initial, growth)
    start = CLOCKS["wall"]()
    run = timed_run(kernel, seconds=seconds, initial_params={"x": initial.clone()}, observe=trace)
    out: dict[str, Any] = dict(trace.finish(run))
    out["wall_seconds_total"] = CLOCKS["wall"]() - start
    out["diagnostics"] = run.diagnostics
    return out


# ---------------------------------------------------------------------------- reports
def summarize(record: dict) -> list[dict[str, Any]]:
    """One row per sampler: final values averaged over seeds, plus time to reach Gibbs's final error."""
    rows = []
    runs = record["runs"]
    for label in record["samplers"]:
        finals = [r[label] for r in runs]
        row: dict[str, Any] = {"sampler": label}
        for key in [*METRICS, "sweeps", "seconds"]:
            row[key] = sum(f[key][-1] for f in finals) / len(finals)
        accs = [a for f in finals for a in f["diagnostics"].get("acceptance_by_proposal", {}).values()]
        row["acceptance"] = sum(accs) / len(accs) if accs else None
        fractions = []
        for r in runs:
            reach = first_time(ErrorTrace.of(r[label]), r["Gibbs"]["errors"][-1], for_good=False)
            fractions.append(None if reach is None else reach / r["Gibbs"]["seconds"][-1])
        row["time_to_gibbs_error"] = None if None in fractions else max(fractions)
        rows.append(row)
    return rows


def markdown(record: dict, rows: list[dict[str, Any]]) -> str:
    c, ref = record["config"], record["reference"]

    def fmt(x: float | None, spec: str = ".4f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        "# Neural block proposals vs Gibbs for NER (WNUT-17 test, shipped CRF)",
        "",
        f"{record['num_sentences']} test sentences ({record['num_tokens']} tokens, {record['num_entities']} gold "
        f"entities) in one corpus graph; {c['seconds']:g} s of sampling per sampler and seed, {c['seeds']} seed(s), "
        "all chains from the same uniformly random tags. Final values (means over seeds). F1 columns: current "
        "sample / max-marginal decode of the running marginals. Marginal error: mean |running marginal - exact "
        "forward-backward marginal| over tokens and tags. `t / t_Gibbs`: worst seed's time to reach Gibbs's "
        "final marginal error, as a fraction of Gibbs's time (`-`: not reached). Sweeps: MCMC iterations (an NB "
        "iteration is either a Gibbs sweep or a sweep of neural blocks over all windows).",
        "",
        "| sampler | token F1 (sample / max-marg.) | entity F1 (sample / max-marg.) | log-lik | marginal error "
        "| sweeps | acceptance | t / t_Gibbs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sampler']} | {r['token_f1_sample']:.4f} / {r['token_f1_mm']:.4f} | "
            f"{r['entity_f1_sample']:.4f} / {r['entity_f1_mm']:.4f} | {r['loglik']:.1f} | {r['errors']:.5f} | "
            f"{r['sweeps']:.0f} | {fmt(r['acceptance'], '.3f')} | {fmt(r['time_to_gibbs_error'], '.2f')} |"
        )
    lines += [
        "",
        "Exact references:",
        "",
        "| decoder | token F1 | entity F1 | log-lik |",
        "|---|---|---|---|",
        f"| Viterbi | {ref['viterbi']['token_f1']:.4f} | {ref['viterbi']['entity_f1']:.4f} | "
        f"{ref['viterbi_loglik']:.1f} |",
        f"| max-marginal (forward-backward) | {ref['max_marginal']['token_f1']:.4f} | "
        f"{ref['max_marginal']['entity_f1']:.4f} | {ref['max_marginal_loglik']:.1f} |",
        f"| gold tags | 1.0000 | 1.0000 | {ref['gold_loglik']:.1f} |",
        f"| posterior mean (exact FFBS, {c['exact_samples']} draws) | - | - | {ref['posterior_mean_loglik']:.1f} |",
        f"| initial (random tags, seed {c['seed']}) | {ref['initial']['token_f1']:.4f} | "
        f"{ref['initial']['entity_f1']:.4f} | {ref['initial_loglik']:.1f} |",
    ]
    if record["skipped_proposals"]:
        lines += ["", f"Skipped (not shipped): {', '.join(record['skipped_proposals'])}."]
    return "\n".join(lines) + "\n"


def _colors(labels: Sequence[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


def plot_f1(record: dict, path: Path) -> None:
    """F1 (token / entity, sample / max-marginal) vs sampling time, with the exact decoders as lines."""
    labels, ref = record["samplers"], record["reference"]
    colors = _colors(labels)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    panels = [
        ("token_f1_sample", "token F1, current sample", "token_f1"),
        ("token_f1_mm", "token F1, max-marginal decode", "token_f1"),
        ("entity_f1_sample", "entity F1, current sample", "entity_f1"),
        ("entity_f1_mm", "entity F1, max-marginal decode", "entity_f1"),
    ]
    for ax, (key, title, ref_key) in zip(axes.reshape(-1), panels):
        for label in labels:
            for j, run in enumerate(record["runs"]):
                t = run[label]
                ax.semilogx(
                    t["seconds"][1:], t[key][1:], color=colors[label], alpha=0.8, label=label if j == 0 else None
                )
        ax.axhline(ref["viterbi"][ref_key], color="black", linestyle="--", linewidth=1, label="exact Viterbi")
        ax.axhline(ref["max_marginal"][ref_key], color="grey", linestyle=":", linewidth=1.5, label="exact max-marginal")
        ax.set_title(title)
        ax.set_ylabel("F1")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("sampling time (s)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"NER F1 vs time ({record['num_sentences']} WNUT-17 test sentences)")
    save_figure(fig, path, dpi=110)


def plot_loglik(record: dict, path: Path) -> None:
    """Viterbi score minus the current sample's score (>= 0) vs time and vs sweeps, log-log."""
    labels, ref = record["samplers"], record["reference"]
    colors = _colors(labels)
    vit = ref["viterbi_loglik"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, xkey, xlabel in zip(axes, ["seconds", "sweeps"], ["sampling time (s)", "sweeps"]):
        for label in labels:
            for j, run in enumerate(record["runs"]):
                t = run[label]
                gap = [max(vit - v, 1e-3) for v in t["loglik"][1:]]
                ax.loglog(t[xkey][1:], gap, color=colors[label], alpha=0.8, label=label if j == 0 else None)
        ax.axhline(
            vit - ref["posterior_mean_loglik"],
            color="black",
            linestyle="--",
            linewidth=1,
            label="posterior mean (exact)",
        )
        ax.axhline(max(vit - ref["gold_loglik"], 1e-3), color="grey", linestyle=":", linewidth=1.5, label="gold tags")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("Viterbi log-lik - log-lik of the sample")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"CRF score gap to Viterbi (Viterbi log-lik {vit:.1f})")
    save_figure(fig, path, dpi=110)


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shipped = set(list_pretrained())
    missing = [p for p in args.proposals if p not in shipped]
    if missing and not args.quick:
        raise SystemExit(f"proposals not shipped (yet): {missing}; shipped: {sorted(shipped)}")
    proposals = {p: load_pretrained(p) for p in args.proposals if p in shipped}
    config = {k: v for k, v in sorted(vars(args).items()) if k != "out"}
    out = study_folder(args.out, config)

    t0 = CLOCKS["wall"]()
    corpus = load_corpus(args.sentences, args.exact_samples, args.seed)
    fg = corpus.fg
    default = torch.get_default_dtype()
    mm_exact = corpus.exact.argmax(-1)
    reference = {
        "viterbi": decode_metrics(corpus.viterbi, corpus),
        "max_marginal": decode_metrics(mm_exact, corpus),
        "viterbi_loglik": float(fg.log_joint(corpus.viterbi.to(default))),
        "max_marginal_loglik": float(fg.log_joint(mm_exact.to(default))),
        "gold_loglik": float(fg.log_joint(corpus.gold.to(default))),
        "posterior_mean_loglik": corpus.posterior_mean_score,
        "seconds": CLOCKS["wall"]() - t0,
    }
    makers = {"Gibbs": lambda: GibbsKernel(fg)}
    for name in args.gradient_samplers:
        makers[name] = lambda cls=GRADIENT_SAMPLERS[name]: cls(fg)
    for name, proposal in proposals.items():
        makers[f"NB({name})+Gibbs"] = lambda proposal=proposal: NeuralBlockKernel(
            fg, proposals=[proposal], gibbs_prob=args.gibbs_prob
        )
    record: dict[str, Any] = {
        "config": config,
        "num_sentences": len(corpus.tokens),
        "num_tokens": fg.num_variables,
        "num_entities": corpus.num_entities,
        "samplers": list(makers),
        "skipped_proposals": missing,
        "reference": reference,
        "non_sampling_seconds": {},  # setup + hook metrics, last seed
        "runs": [],
    }
    # one kernel per sampler, reused across seeds (MCMC re-runs its setup)
    kernels = {label: make() for label, make in makers.items()}
    init0 = fg.initial_state(torch.Generator().manual_seed(10_000 + args.seed))
    for kernel in kernels.values():
        prime(kernel, init0)
    jobs = [(s, label) for s in range(args.seeds) for label in kernels]
    run: dict[str, Any] = {}
    for s, label in tqdm(jobs, desc="ner study"):
        seed = args.seed + s
        if not run or run["seed"] != seed:
            init = fg.initial_state(torch.Generator().manual_seed(10_000 + seed))  # uniformly random tags
            run = {"seed": seed}
            record["runs"].append(run)
            if s == 0:
                reference["initial"] = decode_metrics(init, corpus)
                reference["initial_loglik"] = float(fg.log_joint(init))
        pyro.set_rng_seed(seed)
        run[label] = run_sampler(kernels[label], corpus, init, args.seconds, args.growth)
        record["non_sampling_seconds"][label] = run[label]["wall_seconds_total"] - run[label]["seconds"][-1]
    rows = summarize(record)
    record["summary"] = rows
    (out / "ner_study.json").write_text(json.dumps(record, indent=1))
    text = markdown(record, rows)
    plot_f1(record, out / "ner_f1.png")
    plot_loglik(record, out / "ner_loglik.png")
    plot_error_traces(
        {
            label: [{k: r[label][k][1:] for k in ("sweeps", "seconds", "errors")} for r in record["runs"]]
            for label in record["samplers"]
        },
        out / "ner_marginal_error.png",
        title=f"NER marginal error vs exact forward-backward ({len(corpus.tokens)} sentences)",
    )
    write_report(out, "ner_study.md", text)
    return record


if __name__ == "__main__":
    main()
