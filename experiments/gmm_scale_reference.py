"""Check the GMM benchmark's mode metrics against long reference runs of the same cases.

``experiments.gmm_scale`` judges each chain's posterior mode of M against split-merge's mode pooled over its
five chains of the same (short) run. That reference is itself a short MCMC run. This script reads one
benchmark run and one or more longer runs of some of its cases (the same generator seed, e.g.
``python -m experiments.gmm_scale --seed 7 --mixtures 12 20 --points 60 --seconds 60``) and counts, per case
and arm, the benchmark chains whose mode is the reference mode: the mode of M pooled over every arm and chain
of the long runs (each arm weighs the same).

Usage:
    python -m experiments.gmm_scale_reference --run experiments/results/gmm_scale/175b4f9e2d \
        --references experiments/results/gmm_scale/e70eccf479 experiments/results/gmm_scale/63c8c188dd
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.common import pyplot, study_parser
from experiments.gmm_scale import pooled_posterior, posterior_mode
from experiments.gmm_study import SM
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json, write_report

CaseKey = tuple[int, int, str]


def load_record(folder: str | Path) -> dict[str, Any]:
    """The ``gmm_scale.json`` record in ``folder``; a missing or malformed one raises ``ValueError``."""
    path = Path(folder) / "gmm_scale.json"
    try:
        record = json.loads(path.read_text())
        fields_present = isinstance(record["config"]["seed"], int) and "metrics" in record["results"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        raise ValueError(f"{path} is not a gmm_scale record: {error}") from error
    if not fields_present:
        raise ValueError(f"{path} is not a gmm_scale record: no integer seed or no case metrics")
    return record


def case_key(result: dict[str, Any]) -> CaseKey:
    """A benchmark case's ``(m, n, family)``."""
    return int(result["m"]), int(result["n"]), str(result["family"])


def reference_posteriors(references: list[dict[str, Any]], seed: int) -> dict[CaseKey, dict[str, float]]:
    """Per case of the reference records: the posterior of M pooled over their arms (each arm weighs the same).

    Example:
        >>> metrics = {"a": {"M posterior": {"3": 1.0}}, "b": {"M posterior": {"3": 0.5, "4": 0.5}}}
        >>> record = {"config": {"seed": 7}, "results": [{"m": 8, "n": 60, "family": "model", "metrics": metrics}]}
        >>> reference_posteriors([record], seed=7)
        {(8, 60, 'model'): {'3': 0.75, '4': 0.25}}
    """
    pooled: dict[CaseKey, list[dict[str, float]]] = {}
    for record in references:
        if record["config"]["seed"] != seed:
            raise ValueError(f"a reference run has generator seed {record['config']['seed']}, the run {seed}")
        for result in record["results"]:
            pooled.setdefault(case_key(result), []).extend(m["M posterior"] for m in result["metrics"].values())
    return {key: pooled_posterior(posteriors) for key, posteriors in pooled.items()}


def case_rows(run: dict[str, Any], references: dict[CaseKey, dict[str, float]]) -> list[dict[str, Any]]:
    """Per case of ``run`` with a reference: its mode, split-merge's short-run mode and each arm's chains at it."""
    rows = []
    for result in run["results"]:
        key = case_key(result)
        if key not in references:
            continue
        reference = references[key]
        mode = posterior_mode(reference)
        row: dict[str, Any] = {
            "m": key[0],
            "n": key[1],
            "family": key[2],
            "reference mode (P)": f"{mode} ({reference[str(mode)]:.2f})",
            "SM run's mode": result["metrics"][SM]["M mode"],
        }
        for label, metrics in result["metrics"].items():
            modes = metrics["chain M modes"]
            row[f"{label}: at reference mode"] = sum(int(m) == mode for m in modes)
            row[f"{label}: at SM run's mode"] = metrics["chains with mode = SM mode"]
        rows.append(row)
    if not rows:
        raise ValueError("the reference runs share no case with the run")
    return rows


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Every count column (``arm: at ...``) of ``rows`` summed over the cases.

    Example:
        >>> totals([{"m": 8, "a: at reference mode": 2}, {"m": 8, "a: at reference mode": 3}])
        {'a: at reference mode': 5}
    """
    return {column: sum(row[column] for row in rows) for column in rows[0] if ": at " in column}


def plot_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars per case: each arm's chains at the reference mode (solid) and at split-merge's run mode (hatched)."""
    plt = pyplot()
    arms = [c.removesuffix(": at reference mode") for c in rows[0] if c.endswith(": at reference mode")]
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(rows), 3.6))
    width = 0.8 / (2 * len(arms))
    for a, arm in enumerate(arms):
        for h, (suffix, hatch) in enumerate(((": at reference mode", ""), (": at SM run's mode", "//"))):
            offsets = [i + (2 * a + h - len(arms) + 0.5) * width for i in range(len(rows))]
            values = [row[arm + suffix] for row in rows]
            ax.bar(
                offsets,
                values,
                width,
                color=f"C{a}",
                hatch=hatch,
                alpha=1.0 if not hatch else 0.5,
                label=f"{arm}{suffix}",
            )
    ax.set_xticks(range(len(rows)), [f"{r['m']}x{r['n']}\n{r['family']}" for r in rows], fontsize=8)
    ax.set_ylabel("chains at the mode")
    ax.set_ylim(0, 1.4 * max(max(row[c] for c in row if ": at " in c) for row in rows) + 0.5)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options.

    Example:
        >>> parse_args(["--run", "a", "--references", "b", "c"]).references
        ['b', 'c']
    """
    parser = study_parser(__doc__ or "")
    parser.add_argument("--run", required=True, help="the benchmark run's result folder")
    parser.add_argument("--references", nargs="+", required=True, help="result folders of longer runs")
    parser.add_argument("--out", default="experiments/results/gmm_scale_reference")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Compare the run's chain modes with the references'; write and return the record."""
    args = parse_args(argv)
    run = load_record(args.run)
    references = reference_posteriors([load_record(f) for f in args.references], run["config"]["seed"])
    rows = case_rows(run, references)
    config = {"run": Path(args.run).name, "references": [Path(f).name for f in args.references]}
    folder = study_folder(args.out, config)
    record = {"config": config, "totals": totals(rows), "cases": rows, "reference posteriors": references}
    write_json(
        folder / "gmm_scale_reference.json",
        {**record, "reference posteriors": {f"{m}x{n} {family}": p for (m, n, family), p in references.items()}},
    )
    plot_rows(rows, folder / "gmm_scale_reference.png")
    intro = (
        f"Run `{config['run']}`; references {', '.join(f'`{r}`' for r in config['references'])} (longer runs of "
        + "the same cases). The reference mode is the mode of M pooled over every arm and chain of the reference "
        + "runs (arms weighted equally; P its probability there). Per arm: the run's chains (of 5) whose mode of M "
        + "is the reference mode, and those whose mode is split-merge's pooled mode in the run itself (the "
        + "benchmark's mode metric)."
    )
    total_rows = [{"count": column, "chains": value} for column, value in record["totals"].items()]
    text = (
        "# GMM benchmark modes against long reference runs\n\n"
        + intro
        + "\n\n## Per case\n\n"
        + markdown_table(rows, list(rows[0]))
        + "\n\n## Totals\n\n"
        + markdown_table(total_rows, ["count", "chains"])
        + "\n\n![chains at the mode](gmm_scale_reference.png)\n"
    )
    write_report(folder, "gmm_scale_reference.md", text)
    return record


if __name__ == "__main__":
    main()
