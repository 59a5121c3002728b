"""``train-motif``: meta-train a neural block proposal for one motif from the command line.

Runs as ``train-motif ...`` (installed console script), ``python -m trainers.train_motif ...``,
``python trainers/train_motif.py ...`` and under ``torchrun --nproc_per_node=N trainers/train_motif.py ...``.

Example:
    >>> main(["--motif", "no-such-motif"])  # doctest: +SKIP
    usage: train-motif ...
    train-motif: error: argument --motif: invalid choice: 'no-such-motif' (choose from ...)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from neuralblock.proposals.proposal import proposal_files  # noqa: E402
from trainers.library import library_folder, register_proposal  # noqa: E402
from trainers.trainer import MAX_SEED, ConfigError, TrainConfig, check_resume, check_writable, train  # noqa: E402

__all__ = ["build_parser", "import_plugin", "main", "parse_option_value"]

DESCRIPTION = """\
Meta-train a neural block proposal (a mixture density network q(B | C, Psi)) for one
structural motif, on random instantiations of that motif, and write it as
OUT.safetensors + OUT.json (weights + checked sidecar with config and validation metrics).

Progress goes to a tqdm bar and to TensorBoard (tensorboard --logdir runs). A checkpoint is
written every --checkpoint-every steps; rerun the same command with --resume to continue
after an interruption, bit for bit. You may raise --steps when resuming (nothing else that
changes training); with the cosine schedule the remaining schedule is then stretched to the
new total, so the result differs from a run started with that many steps.

Every output path (--out, --checkpoint, --logdir, the library of --register) is checked before
the first step: writable, and no two the same.
"""

EPILOG = """\
examples:
  # a 2x2 grid block proposal, 2000 steps, written to pretrained/grid-2.{safetensors,json}
  train-motif --motif grid --size 2 --steps 2000

  # any motif option with --option KEY=VALUE (int/float/bool/str parsed automatically)
  python trainers/train_motif.py --motif chain --option family=linear --hidden 64,64 --seed 1

  # continue an interrupted run (same command plus --resume)
  train-motif --motif grid --size 2 --steps 2000 --resume

  # train into your own library (searched by load_pretrained after the shipped one)
  NEURALBLOCK_LIBRARY=~/nb-proposals train-motif --motif grid --size 2 --register my-grid

  # two CPU processes with DDP (each rank draws --batch-size instantiations per step)
  torchrun --nproc_per_node=2 trainers/train_motif.py --motif grid --size 2

  # a motif you wrote yourself: a module that calls neuralblock.register_motif
  train-motif --plugin my_package.my_motif --motif mine --steps 500
"""

# Convenience flags mapped into motif options when given.
CONVENIENCE_OPTIONS = {
    "family": "motif family (e.g. the factor family of a grid/chain motif)",
    "size": "block size (e.g. 2x2 or 3)",
    "tags": "number of tags (crf_tags)",
}


def parse_option_value(text: str) -> Any:
    """Parse a ``--option`` value: int, float, bool (true/false/yes/no), none, JSON list/dict, else str.

    Example:
        >>> [parse_option_value(v) for v in ["3", "0.5", "true", "2x2", "[1, 2]"]]
        [3, 0.5, True, '2x2', [1, 2]]
    """
    low = text.strip().lower()
    if low in {"true", "yes", "on"}:
        return True
    if low in {"false", "no", "off"}:
        return False
    if low in {"none", "null"}:
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.strip()[:1] in "[{" and text.strip():
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def import_plugin(name: str) -> None:
    """Import a module (dotted name or ``.py`` path) that registers extra motifs.

    Raises:
        ValueError: the module cannot be found or fails to import.
    """
    path = Path(name)
    try:
        if name.endswith(".py") or path.is_file():
            if not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            module_name = "_neuralblock_plugin_" + re.sub(r"\W", "_", path.stem)
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            if str(Path.cwd()) not in sys.path:
                sys.path.append(str(Path.cwd()))
            importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - report any import failure as a usage error
        raise ValueError(f"cannot import plugin {name!r}: {type(err).__name__}: {err}") from err


def _motif_names() -> list[str]:
    import motifs

    return motifs.names()


def _checked_number(text: str, kind: type, ok: Callable[[float], bool], expected: str) -> Any:
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text)} characters)"
    if kind is int and not re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", text):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {shown}")
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {shown}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {shown}")
    return value


def _positive_int(text: str) -> int:
    return _checked_number(text, int, lambda v: v > 0, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _checked_number(text, int, lambda v: v >= 0, "a non-negative integer")


def _seed(text: str) -> int:
    return _checked_number(text, int, lambda v: 0 <= v <= MAX_SEED, f"an integer in 0..{MAX_SEED}")


def _positive_float(text: str) -> float:
    return _checked_number(text, float, lambda v: 0 < v < float("inf"), "a positive finite number")


def _widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths like 128,128, got {text!r}") from None
    if not widths or any(w <= 0 for w in widths):
        raise argparse.ArgumentTypeError(f"expected positive comma-separated widths like 128,128, got {text!r}")
    return widths


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with an identifier KEY, got {text!r}")
    return key.strip(), parse_option_value(value)


def build_parser(motif_choices: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``train-motif`` argument parser (``motif_choices`` default: ``motifs.names()``)."""
    choices = list(motif_choices) if motif_choices is not None else _motif_names()
    defaults = TrainConfig(motif="")
    parser = argparse.ArgumentParser(
        prog="train-motif",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_argument_group("what to train")
    what.add_argument(
        "--motif",
        required=True,
        choices=choices or None,  # none registered: get_motif reports it
        metavar="NAME",
        help=f"motif to train; one of: {', '.join(choices) or '(none registered)'}",
    )
    what.add_argument(
        "--option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="motif option (repeatable); values parse as int, float, bool or str",
    )
    for flag, text in CONVENIENCE_OPTIONS.items():
        what.add_argument(
            f"--{flag}", type=parse_option_value, default=None, help=f"{text}; same as --option {flag}=..."
        )
    what.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (dotted name or .py file) first, to train motifs it registers (repeatable)",
    )

    opt = parser.add_argument_group("optimisation")
    opt.add_argument(
        "--steps", type=_positive_int, default=defaults.steps, help="optimizer steps (default %(default)s)"
    )
    opt.add_argument(
        "--batch-size",
        type=_positive_int,
        default=defaults.batch_size,
        help="instantiations per step per process (default %(default)s)",
    )
    opt.add_argument("--lr", type=_positive_float, default=defaults.lr, help="Adam learning rate (default %(default)s)")
    opt.add_argument(
        "--lr-schedule",
        choices=["constant", "cosine", "step"],
        default=defaults.lr_schedule,
        help="learning-rate schedule (default %(default)s)",
    )
    opt.add_argument(
        "--grad-clip", type=float, default=defaults.grad_clip, help="max gradient norm, 0 = off (default %(default)s)"
    )
    opt.add_argument(
        "--components", type=_positive_int, default=defaults.components, help="MDN components (default %(default)s)"
    )
    opt.add_argument(
        "--hidden",
        type=_widths,
        default=defaults.hidden,
        metavar="W1,W2,...",
        help="MDN hidden widths (default 128,128)",
    )
    opt.add_argument(
        "--seed",
        type=_seed,
        default=defaults.seed,
        help=f"seed of init and data, 0..{MAX_SEED} (default %(default)s)",
    )
    opt.add_argument(
        "--device",
        default=defaults.device,
        help="cpu, cuda or cuda:N (default %(default)s; torchrun ranks use cuda:LOCAL_RANK)",
    )
    opt.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="CPU threads for torch (default: torch's choice); use 1 on a shared or busy machine, where "
        "oversubscribed threads can slow training by an order of magnitude",
    )

    val = parser.add_argument_group("validation, logging and output")
    val.add_argument(
        "--val-size",
        type=_non_negative_int,
        default=defaults.val_size,
        help="held-out instantiations (default %(default)s)",
    )
    val.add_argument(
        "--val-every",
        type=_non_negative_int,
        default=defaults.val_every,
        help="validate every N steps (default %(default)s)",
    )
    val.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=defaults.checkpoint_every,
        help="checkpoint every N steps, 0 = only at the end (default %(default)s)",
    )
    val.add_argument(
        "--out",
        default=None,
        metavar="STEM",
        help="output path stem for STEM.safetensors and STEM.json (default pretrained/<motif>[-<option values>])",
    )
    val.add_argument("--logdir", default=None, help="TensorBoard folder (default runs/<name of --out>)")
    val.add_argument("--checkpoint", default=None, help="checkpoint file (default <out>.ckpt)")
    val.add_argument("--resume", action="store_true", help="continue from --checkpoint (same config; --steps may grow)")
    val.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    val.add_argument(
        "--register",
        metavar="NAME",
        default=None,
        help="add the trained proposal to the library's index.json under NAME (its --out must be inside the "
        "library; default --out: LIBRARY/<motif>[-<option values>])",
    )
    val.add_argument(
        "--library",
        metavar="DIR",
        default=None,
        help="library folder for --register (default: $NEURALBLOCK_LIBRARY, else the shipped pretrained/); "
        "load_pretrained and list_pretrained search $NEURALBLOCK_LIBRARY after the shipped library",
    )
    return parser


def default_out(motif: str, options: dict[str, Any]) -> str:
    """``pretrained/<motif>[-<value>...]`` with the option values made file-name safe.

    Example:
        >>> default_out("grid", {"size": "2x2"})
        'pretrained/grid-2x2'
    """
    parts = [motif] + [re.sub(r"[^A-Za-z0-9_.]+", "_", str(v)).strip("_") for v in options.values()]
    return str(Path("pretrained") / "-".join(p for p in parts if p))


def _pre_import_plugins(argv: Sequence[str]) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    for name in known.plugin:
        try:
            import_plugin(name)
        except ValueError as err:
            build_parser().error(str(err))


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TrainConfig:
    """Build and check the :class:`TrainConfig` (``parser.error`` on any bad value)."""
    options: dict[str, Any] = {}
    for key, value in args.option:
        if key in options:
            parser.error(f"--option {key} given twice")
        options[key] = value
    for flag in CONVENIENCE_OPTIONS:
        value = getattr(args, flag)
        if value is not None:
            if flag in options:
                parser.error(f"--{flag} and --option {flag}=... both given")
            options[flag] = value
    library = library_folder(args.library)
    out = args.out or default_out(args.motif, options)
    if args.register is not None and args.out is None:
        out = str(library / Path(out).name)
    logdir = args.logdir or str(Path("runs") / Path(out).name)
    config = TrainConfig(
        motif=args.motif,
        motif_options=options,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        components=args.components,
        hidden=args.hidden,
        seed=args.seed,
        val_size=args.val_size,
        val_every=args.val_every,
        checkpoint_every=args.checkpoint_every,
        out=out,
        logdir=logdir,
        checkpoint=args.checkpoint,
        resume=args.resume,
        device=args.device,
        grad_clip=args.grad_clip,
        lr_schedule=args.lr_schedule,
        progress=not args.no_progress,
    )
    try:
        config.validate()
        import motifs

        motifs.get(config.motif, **config.motif_options)  # bad option keys fail here, before any work
        config.check_paths()
        if args.register is not None:
            _check_register(args.register, config.out, library)
        if config.resume:
            check_resume(config)
    except ValueError as err:  # ConfigError included
        parser.error(str(err))
    return config


def _check_register(name: str, out: str | None, library: Path) -> None:
    """Before training: ``--register NAME`` needs a valid name, ``--out`` inside the library and a writable index."""
    from neuralblock.proposals.library import read_library_index

    if not name.strip() or name != name.strip() or "/" in name:
        raise ConfigError(f"--register needs a name without '/' or surrounding blanks, got {name!r}")
    if out is None:
        raise ConfigError("--register needs an output (--out)")
    try:
        Path(out).resolve().relative_to(library.resolve())
    except ValueError:
        raise ConfigError(
            f"--register: the proposal {out} is not inside the library folder {library}; "
            "put --out inside it, or choose the library with --library or NEURALBLOCK_LIBRARY"
        ) from None
    index = library / "index.json"
    if index.exists():
        read_library_index(library)  # a broken index fails now, not after training
    check_writable(library, "library index", index)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``train-motif``; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _pre_import_plugins(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        proposal, metrics = train(config)
    except ConfigError as err:
        parser.error(str(err))
    del proposal
    if os.environ.get("RANK", "0") == "0":
        summary = {k: v for k, v in metrics.items() if k != "history"}
        weights, sidecar = proposal_files(config.out)
        print(f"wrote {weights} and {sidecar}")
        if args.register and metrics.get("finished"):
            index = library_folder(args.library) / "index.json"
            register_proposal(config.out, args.register, index_path=index)
            print(f"registered {args.register!r} in {index}")
        print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
