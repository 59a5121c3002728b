"""The GMM benchmark's targets over several generator seeds, side by side and pooled per size.

``experiments.gmm_scale`` runs one generator seed's 30 cases and judges issue 27's targets per size on them.
At a size where the posterior of M is flat, a chain's own mode of M is nearly a draw, so one seed's count of
chains at split-merge's reference mode (SM against NB, 10 chains each) misses or meets the mode target by chance.
This script reads several finished runs that differ only in their seed and writes, per size, each seed's worst
NB/SM time ratio, chains at the reference mode and stuck NB chains; per seed, how many sizes meet each target;
and per size the chains at the mode pooled over the seeds, with a one-sided Fisher exact test that NB has fewer.

Usage:
    python -m experiments.gmm_scale_seeds --runs experiments/results/gmm_scale/7fe76d5f45 \
        experiments/results/gmm_scale/835d233c64 --labels "13 (e80363b)" "14 (dc1fea2)"
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.colors import TwoSlopeNorm

from experiments.common import pyplot, study_parser
from experiments.gmm_scale import (
    NB_SET,
    TARGET_MIXTURES,
    TIME_TARGET,
    all_sizes_met_probability,
    exchangeable_miss_probability,
    fewer_hits_p_value,
    format_ratio,
    time_ratio,
    worst_ratio,
)
from experiments.gmm_scale_reference import load_record
from experiments.gmm_study import SM
from neuralblock.diagnostics.plots import save_figure
from neuralblock.diagnostics.reports import markdown_table, study_folder, write_json, write_report

Size = tuple[int, int]
MODE = "chains with mode = SM mode"
MODE_SET = "chains with mode in SM mode set"
LOG_RATIO_RANGE = (-2.0, 1.0)  # the plot's colour scale of log10 NB/SM time (clipped to it)


def check_runs(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    """Refuse runs that differ in any setting but the seed, repeat a seed, or whose labels do not match them.

    Example:
        >>> run = {"config": {"seed": 1, "chains": 5}, "results": []}
        >>> check_runs([run, {**run, "config": {"seed": 2, "chains": 5}}], ["a", "b"])
        >>> check_runs([run, {**run, "config": {"seed": 2, "chains": 3}}], ["a", "b"])
        Traceback (most recent call last):
        ...
        ValueError: the runs differ in chains (seed 1 and seed 2); only the seed may differ
    """
    first = records[0]["config"]
    seeds = [record["config"]["seed"] for record in records]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a generator seed repeats: {seeds}")
    if len(labels) != len(records):
        raise ValueError(f"{len(labels)} labels for {len(records)} runs")
    if len(set(labels)) != len(labels):
        raise ValueError(f"the labels must differ: {sorted({x for x in labels if labels.count(x) > 1})} repeat")
    for record in records[1:]:
        config = record["config"]
        differ = sorted(k for k in set(first) | set(config) if k != "seed" and first.get(k) != config.get(k))
        if differ:
            raise ValueError(
                f"the runs differ in {', '.join(differ)} (seed {first['seed']} and seed {config['seed']}); "
                + "only the seed may differ"
            )


def size_counts(record: dict[str, Any]) -> dict[Size, dict[str, Any]]:
    """Per size of one run (:func:`_size_counts`); a record without an arm or metric raises ``ValueError`` naming it.

    Example:
        >>> size_counts({"config": {"seed": 3}, "results": [{"m": 12, "n": 60, "metrics": {}}]})
        Traceback (most recent call last):
        ...
        ValueError: the seed-3 run lacks the arm or metric 'split-merge + Gibbs'
    """
    seed = record["config"]["seed"]
    try:
        return _size_counts(record)
    except KeyError as error:
        hint = (
            " (older records: `python -m experiments.gmm_scale --rescore FOLDER` adds it)"
            if MODE_SET in str(error)
            else ""
        )
        raise ValueError(f"the seed-{seed} run lacks the arm or metric {error}{hint}") from error
    except TypeError as error:
        raise ValueError(f"the seed-{seed} run has a malformed metric: {error}") from error


def _size_counts(record: dict[str, Any]) -> dict[Size, dict[str, Any]]:
    """Per size of one run: NB's worst time ratio, both arms' chains at the mode (per case and summed), stuck NB.

    The time ratios come from the arms' median times to the level (:func:`experiments.gmm_scale.time_ratio`); one
    of ``None`` (NB's median chain never reached the level) is the worst.

    Example:
        >>> metrics = {NB_SET: {"median time to level": 0.2, MODE: 4, MODE_SET: 5, "stuck": [False] * 5},
        ...            SM: {"median time to level": 2.0, MODE: 5, MODE_SET: 5, "stuck": [False] * 5}}
        >>> counts = _size_counts({"results": [{"m": 12, "n": 60, "metrics": metrics}]})
        >>> counts[(12, 60)]["time"], counts[(12, 60)]["mode"], counts[(12, 60)]["chains"]
        (0.1, {'split-merge + Gibbs': 5, 'NB(set) + Gibbs': 4}, 5)
    """
    cells: dict[Size, list[dict[str, Any]]] = {}
    for result in record["results"]:
        cells.setdefault((int(result["m"]), int(result["n"])), []).append(result["metrics"])
    counts = {}
    for size, cell in sorted(cells.items()):
        chains = {len(metrics[arm]["stuck"]) for metrics in cell for arm in (SM, NB_SET)}
        if len(chains) != 1:
            raise ValueError(f"the {size[0]} x {size[1]} cases have different numbers of chains: {sorted(chains)}")
        # (recomputed from the median times: the JSON keeps an infinite ratio as null)
        ratios = [time_ratio(m[NB_SET]["median time to level"], m[SM]["median time to level"]) for m in cell]
        case_hits = {arm: [metrics[arm][MODE] for metrics in cell] for arm in (SM, NB_SET)}
        case_chains = chains.pop()
        counts[size] = {
            "time": worst_ratio(ratios),
            "slower cases": sum(r is None or r > 1.0 for r in ratios),
            "case hits": case_hits,
            "mode": {arm: sum(hits) for arm, hits in case_hits.items()},
            "mode set": {arm: sum(metrics[arm][MODE_SET] for metrics in cell) for arm in (SM, NB_SET)},
            "stuck": sum(sum(metrics[NB_SET]["stuck"]) for metrics in cell),
            "chains": case_chains * len(cell),
            "case chains": case_chains,
        }
    return counts


def _hits(mode: dict[str, int]) -> str:
    """Chains at the mode as ``SM / NB``."""
    return f"{mode[SM]} / {mode[NB_SET]}"


def size_rows(labels: Sequence[str], counts: Sequence[dict[Size, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per size: each seed's worst time ratio, chains at the mode (SM / NB) and stuck NB; then the pooled count.

    Example:
        >>> cell = {"time": 0.2, "mode": {SM: 8, NB_SET: 6}, "stuck": 0, "chains": 10}
        >>> row = size_rows(["a", "b"], [{(12, 60): cell}, {(12, 60): {**cell, "time": None}}])[0]
        >>> row["a: time"], row["b: time"], row["pooled: mode SM / NB"], row["pooled: fewer p"]
        ('0.20', 'never', '16 / 12', 0.15)
    """
    rows = []
    for size in sorted(set().union(*counts)):
        row: dict[str, Any] = {"m": size[0], "n": size[1]}
        pooled = {SM: 0, NB_SET: 0}
        chains = 0
        for label, run in zip(labels, counts, strict=True):
            cell = run.get(size)
            if cell is None:
                row.update({f"{label}: time": "-", f"{label}: mode SM / NB": "-", f"{label}: stuck": "-"})
                continue
            row[f"{label}: time"] = format_ratio(cell["time"])
            row[f"{label}: mode SM / NB"] = _hits(cell["mode"])
            row[f"{label}: stuck"] = cell["stuck"]
            pooled = {arm: pooled[arm] + cell["mode"][arm] for arm in pooled}
            chains += cell["chains"]
        row["pooled: mode SM / NB"] = _hits(pooled)
        row["pooled: fewer p"] = round(fewer_hits_p_value(pooled[NB_SET], pooled[SM], chains), 3)
        rows.append(row)
    return rows


def seed_rows(labels: Sequence[str], counts: Sequence[dict[Size, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per seed, over the sizes with m >= 12: sizes meeting each target, chains at the mode; at any m: the sizes
    where NB has fewer chains at the mode, cases where NB is slower than split-merge, stuck NB chains.

    ``P(all met) as good as SM``: the plug-in chance that a sampler as good as split-merge meets the mode target
    at every one of those sizes (:func:`experiments.gmm_scale.exchangeable_miss_probability`).

    Example:
        >>> cell = {"time": 0.2, "slower cases": 0, "mode": {SM: 8, NB_SET: 9}, "mode set": {SM: 9, NB_SET: 10},
        ...         "stuck": 0, "case hits": {SM: [4, 4], NB_SET: [4, 5]}, "case chains": 5}
        >>> row = seed_rows(["a"], [{(12, 60): cell, (8, 60): {**cell, "time": 0.9}}])[0]
        >>> row["time target (sizes)"], row["mode target (sizes)"], row["chains at mode SM / NB"]
        ('1 of 1', '1 of 1', '8 / 9')
    """
    rows = []
    for label, run in zip(labels, counts, strict=True):
        target = {size: cell for size, cell in run.items() if size[0] >= TARGET_MIXTURES}
        met_all = all_sizes_met_probability(  # (each size's rounded as in the run's report)
            [
                round(exchangeable_miss_probability(c["case hits"][NB_SET], c["case hits"][SM], c["case chains"]), 3)
                for c in target.values()
            ]
        )
        mode = {arm: sum(c["mode"][arm] for c in target.values()) for arm in (SM, NB_SET)}
        time_met = [size for size, c in target.items() if c["time"] is not None and c["time"] <= TIME_TARGET]
        mode_missed = [size for size, c in run.items() if c["mode"][NB_SET] < c["mode"][SM]]  # (any m)
        mode_met = [size for size, c in target.items() if c["mode"][NB_SET] >= c["mode"][SM]]
        set_met = [size for size, c in target.items() if c["mode set"][NB_SET] >= c["mode set"][SM]]
        rows.append(
            {
                "seed": label,
                "time target (sizes)": f"{len(time_met)} of {len(target)}",
                "slower cases (any m)": sum(c["slower cases"] for c in run.values()),
                "mode target (sizes)": f"{len(mode_met)} of {len(target)}",
                "mode missed at (any m)": ", ".join(f"{m} x {n}" for m, n in mode_missed) or "-",
                "mode-set target (sizes)": f"{len(set_met)} of {len(target)}",
                "chains at mode SM / NB": _hits(mode),
                "P(all met) as good as SM": round(met_all, 2),
                "stuck NB (any m)": sum(c["stuck"] for c in run.values()),
            }
        )
    return rows


def plot_seeds(labels: Sequence[str], counts: Sequence[dict[Size, dict[str, Any]]], path: Path) -> None:
    """A grid of sizes by seeds: the worst NB/SM time ratio as colour, chains at the mode (SM / NB) as text.

    Cells where NB has fewer chains at the mode than split-merge are outlined in red, stuck NB chains marked ``s``.
    """
    plt = pyplot()
    sizes = sorted(set().union(*counts))
    grid = [[math.nan] * len(labels) for _ in sizes]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(labels), 0.9 + 0.42 * len(sizes)))
    for s, size in enumerate(sizes):
        for c, run in enumerate(counts):
            cell = run.get(size)
            if cell is None:
                continue
            ratio = cell["time"]
            if ratio is not None:  # (never: left blank, grey; 0 and inf: the scale's ends)
                grid[s][c] = min(
                    max(math.log10(ratio) if ratio > 0 else -math.inf, LOG_RATIO_RANGE[0]), LOG_RATIO_RANGE[1]
                )
            text = f"{format_ratio(ratio)}  {_hits(cell['mode'])}" + (f"  s{cell['stuck']}" if cell["stuck"] else "")
            ax.text(c, s, text, ha="center", va="center", fontsize=7)
            if cell["mode"][NB_SET] < cell["mode"][SM]:
                ax.add_patch(plt.Rectangle((c - 0.5, s - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
    norm = TwoSlopeNorm(vmin=LOG_RATIO_RANGE[0], vcenter=math.log10(TIME_TARGET), vmax=LOG_RATIO_RANGE[1])
    colours = plt.get_cmap("RdYlGn_r").with_extremes(bad="lightgrey")  # green under the time target, red over
    image = ax.imshow(grid, cmap=colours, norm=norm, aspect="auto")
    ax.set_xticks(range(len(labels)), [f"seed {label}" for label in labels], fontsize=8)
    ax.set_yticks(range(len(sizes)), [f"{m} x {n}" for m, n in sizes], fontsize=8)
    ax.set_title("worst NB/SM time ratio; chains at the mode SM / NB (red: fewer NB)", fontsize=8)
    fig.colorbar(image, ax=ax, label="log10 NB/SM time (grey: never)")
    save_figure(fig, path, dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options.

    Example:
        >>> parse_args(["--runs", "a", "b"]).labels is None
        True
    """
    parser = study_parser(__doc__ or "")
    parser.add_argument("--runs", nargs="+", required=True, help="gmm_scale result folders, one per seed")
    parser.add_argument("--labels", nargs="+", default=None, help="a label per run (default: its seed)")
    parser.add_argument("--out", default="experiments/results/gmm_scale_seeds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Read the runs, check they differ only in the seed, write the side-by-side report; return its record."""
    args = parse_args(argv)
    records = [load_record(folder) for folder in args.runs]
    labels = args.labels or [str(record["config"]["seed"]) for record in records]
    check_runs(records, labels)
    counts = [size_counts(record) for record in records]
    sizes, seeds = size_rows(labels, counts), seed_rows(labels, counts)
    config = {"runs": [Path(folder).name for folder in args.runs], "labels": list(labels)}
    folder = study_folder(args.out, config)
    record = {"config": config, "settings": records[0]["config"], "sizes": sizes, "seeds": seeds}
    write_json(folder / "gmm_scale_seeds.json", record)
    plot_seeds(labels, counts, folder / "gmm_scale_seeds.png")
    runs = ", ".join(f"seed {label}: `{run}`" for label, run in zip(labels, config["runs"], strict=True))
    text = (
        "# GMM benchmark targets over generator seeds\n\n"
        + f"Runs ({runs}) share every recorded option but the seed (the code each ran at is not recorded: see the "
        + "labels). `time`: NB(set)'s worst time to split-merge's robust level over split-merge's, per size "
        + f"(target <= {TIME_TARGET} at m >= {TARGET_MIXTURES}, never above 1); `mode SM / NB`: chains whose mode "
        + "of M is split-merge's reference mode (NB fewer: the mode target missed at that size); `stuck`: NB "
        + "chains at one M over their second half where the reference gives it under 0.5. `pooled`: the counts "
        + "summed over the seeds, and a one-sided Fisher exact test that NB has fewer chains at the mode (chains "
        + "taken as independent, no correction for the sizes).\n\n"
        + "## Per size\n\n"
        + markdown_table(sizes, list(sizes[0]))
        + f"\n\n## Per seed (the targets' counts over the sizes with m >= {TARGET_MIXTURES})\n\n"
        + markdown_table(seeds, list(seeds[0]))
        + "\n\n![targets per size and seed](gmm_scale_seeds.png)\n"
    )
    write_report(folder, "gmm_scale_seeds.md", text)
    return record


if __name__ == "__main__":
    main()
