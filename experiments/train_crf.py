"""Train the WNUT-17 linear-chain CRF that the NER experiment and the ``crf_tags`` motif use.

Trains :class:`motifs.crf.LinearChainCRF` with AdaGrad (:func:`experiments.crf_model.train_crf`)
for 10 sweeps over ``data/ner_wnut17/wnut17train.conll`` (minibatches of 32 sentences),
evaluates it on the dev and test sets (token accuracy, token F1 over non-O tags, entity F1
over BIO spans) and writes the shipped CRF ``data/ner_wnut17/crf.safetensors`` + ``crf.json``
atomically.

Outputs (under ``--results``, in a folder named by a hash of the config):
``train_crf.json`` (config, metrics, per-epoch NLL), ``train_crf.md`` (table) and
``train_crf.png`` (training NLL per epoch).

Usage::

    python -m experiments.train_crf --seed 0            # the shipped CRF (under a minute on 1 core)
    python -m experiments.train_crf --quick             # CI scale: 1 sweep on 200 sentences,
                                                        # the CRF goes to the results folder only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from experiments.common import add_table, parse_quick, pyplot, study_parser
from experiments.crf_model import evaluate, train_crf
from motifs.crf import load_crf, read_conll
from neuralblock.io import data_path
from neuralblock.proposals.proposal import atomic_write_bytes, code_commit

DATA_FILES = {"train": "wnut17train.conll", "dev": "emerging.dev.conll", "test": "emerging.test.annotated"}
TRAIN_OPTIONS = ("epochs", "batch_size", "lr", "l2", "min_count", "seed")  # passed on to crf_model.train_crf


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = study_parser(__doc__)
    parser.add_argument("--seed", type=int, default=0)
    quick = add_table(
        parser,
        """
        --epochs       10     1   sweeps over the training set
        --batch-size   32     -
        --lr           0.5    -   AdaGrad learning rate
        --l2           1e-5   -   AdaGrad weight decay
        --min-count    2      -   feature count threshold
        """,
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these sizes)")
    parser.add_argument("--max-sentences", type=int, default=None, help="train on the first N sentences only")
    parser.add_argument("--quick", action="store_true", help="CI scale: 1 sweep on 200 sentences")
    parser.add_argument(
        "--output", default=None, help="CRF path stem (default: data/ner_wnut17/crf; --quick: the results folder)"
    )
    parser.add_argument("--results", default="experiments/results/train_crf")
    return parse_quick(parser, argv, {**quick, "max_sentences": 200})


def config_hash(args: argparse.Namespace) -> str:
    keys = {k: v for k, v in sorted(vars(args).items()) if k not in {"output", "results", "threads"}}
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:10]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.results) / config_hash(args)
    out.mkdir(parents=True, exist_ok=True)
    if args.output is not None:
        stem = Path(args.output)
    elif args.quick:
        stem = out / "crf"
    else:
        stem = data_path("ner_wnut17") / "crf"
    splits = {name: read_conll(data_path("ner_wnut17", file)) for name, file in DATA_FILES.items()}
    train = splits["train"][: args.max_sentences] if args.max_sentences else splits["train"]
    start = time.perf_counter()
    options = {name: getattr(args, name) for name in TRAIN_OPTIONS}
    crf, losses = train_crf(train, **options, log=print)
    train_seconds = time.perf_counter() - start
    metrics = {name: evaluate(crf, splits[name]) for name in ("dev", "test")}
    crf.metadata.update(
        {
            "seed": args.seed,
            "metrics": metrics,
            "data": {
                name: {
                    "file": f"data/ner_wnut17/{file}",
                    "sha256": hashlib.sha256(data_path("ner_wnut17", file).read_bytes()).hexdigest(),
                }
                for name, file in DATA_FILES.items()
            },
            "license": "derived from WNUT-17 (CC-BY 4.0); see data/ner_wnut17/LICENSE.md",
            "commit": code_commit(),
            "command": "python -m experiments.train_crf " + " ".join(sys.argv[1:] if argv is None else argv),
        }
    )
    crf.save(stem)
    reloaded = load_crf(stem.with_suffix(".safetensors"))  # the file we ship must load and validate
    if reloaded.num_features != crf.num_features:
        raise RuntimeError(f"reloaded CRF has {reloaded.num_features} features, expected {crf.num_features}")
    sizes = {p.name: p.stat().st_size for p in (stem.with_suffix(".safetensors"), stem.with_suffix(".json"))}
    record = {
        "config": vars(args),
        "crf": str(stem),
        "num_features": crf.num_features,
        "train_seconds": train_seconds,
        "epoch_mean_nll": losses,
        "metrics": metrics,
        "file_sizes": sizes,
    }
    atomic_write_bytes(out / "train_crf.json", json.dumps(record, indent=1).encode())
    lines = [
        f"# WNUT-17 linear-chain CRF (seed {args.seed}, {args.epochs} AdaGrad sweeps, lr {args.lr}, "
        f"{crf.num_features} features, {train_seconds:.1f} s)",
        "",
        "| split | tokens | token acc | token P | token R | token F1 | entity P | entity R | entity F1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in metrics.items():
        tok, ent = m["token"], m["entity"]
        lines.append(
            f"| {name} | {m['num_tokens']} | {m['token_accuracy']:.4f} | {tok['precision']:.4f} | "
            f"{tok['recall']:.4f} | {tok['f1']:.4f} | {ent['precision']:.4f} | {ent['recall']:.4f} | "
            f"{ent['f1']:.4f} |"
        )
    table = "\n".join(lines) + "\n"
    atomic_write_bytes(out / "train_crf.md", table.encode())
    try:
        plt = pyplot()

        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(range(1, len(losses) + 1), losses, marker="o")
        ax.set_xlabel("sweep")
        ax.set_ylabel("mean training NLL per sentence")
        ax.set_title("WNUT-17 CRF, AdaGrad")
        fig.tight_layout()
        fig.savefig(out / "train_crf.png", dpi=100)
        plt.close(fig)
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        pass
    print(table)
    print(f"wrote {stem}.safetensors / .json ({sizes}) and {out}")
    return record


if __name__ == "__main__":
    main()
