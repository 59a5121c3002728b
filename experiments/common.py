"""Small helpers that several studies share."""

from __future__ import annotations

import argparse
import ast
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from neuralblock.diagnostics.reports import study_folder, write_report
from neuralblock.motif import Motif
from neuralblock.proposals import NeuralBlockProposal, load_proposal


def median(values: Iterable[float | None]) -> float:
    """Median of the finite values (the mean of the two middle ones for an even count); NaN if there are none.

    ``None`` counts as missing, like NaN.

    Example:
        >>> median([1.0, 6.0]), median([1.0, math.nan, 3.0, None, 2.0]), median([])
        (3.5, 2.0, nan)
    """
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.median(finite)) if finite else math.nan


def lower_median(values: Iterable[float]) -> float:
    """``torch.median``'s median: the lower of the two middle values for an even count.

    The GMM and Gaussian-coreset studies report it (their committed numbers use it).

    Example:
        >>> lower_median([3.0, 1.0, 2.0, 4.0])
        2.0
    """
    return float(torch.tensor([float(v) for v in values]).median())


def censored_median(values: Iterable[float | None]) -> float | None:
    """Median of times to an event where ``None`` means never reached (counted as later than every time).

    The mean of the two middle values for an even count; ``None`` when the median itself is censored.

    Example:
        >>> censored_median([1.0, None, 3.0]), censored_median([1.0, None]), censored_median([2.0, 4.0])
        (3.0, None, 3.0)
    """
    ordered = sorted(math.inf if v is None else float(v) for v in values)
    if not ordered:
        raise ValueError("censored_median of no values")
    mid = len(ordered) // 2
    med = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return None if math.isinf(med) else med


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the headless ``Agg`` backend, for a study's plots.

    Example:
        >>> pyplot().get_backend().lower()
        'agg'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_proposal_or_untrained(
    name: str, quick: bool, motif: Callable[[], Motif], hidden: Sequence[int]
) -> NeuralBlockProposal:
    """A shipped proposal by name, a file, or (``--quick`` only, when absent) an untrained one.

    The untrained proposal is ``NeuralBlockProposal(motif(), components=4, hidden=hidden)`` after
    ``torch.manual_seed(0)``, so CI runs without shipped weights stay reproducible.
    """

    def untrained() -> NeuralBlockProposal:
        torch.manual_seed(0)
        return NeuralBlockProposal(motif(), components=4, hidden=hidden)

    return load_proposal(name, untrained if quick else None)


def study_parser(doc: str) -> argparse.ArgumentParser:
    """A study's parser, described by the first paragraph of its docstring ``doc``.

    The study adds its own options, then :func:`add_run_options`.

    Example:
        >>> study_parser("A study.\\n\\nDetails.").description
        'A study.'
    """
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def add_numbers(parser: argparse.ArgumentParser, **options: float | tuple[float, str]) -> None:
    """Numeric options typed by their defaults: ``name=default`` or ``name=(default, help)`` adds ``--name``.

    Underscores in a name become dashes in the flag; the options keep their order.

    Example:
        >>> parser = study_parser("A study.")
        >>> add_numbers(parser, n_train=100, budget=(5.0, "seconds per arm"))
        >>> vars(parser.parse_args(["--n-train", "7"]))
        {'n_train': 7, 'budget': 5.0}
    """
    for name, spec in options.items():
        default, text = spec if isinstance(spec, tuple) else (spec, None)
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=text)


def add_choices(parser: argparse.ArgumentParser, **options: Sequence[str] | tuple[Sequence[str], str]) -> None:
    """Options that take one of a few words: ``name=choices`` or ``name=(choices, help)`` adds ``--name``.

    The first choice is the default; underscores in a name become dashes in the flag.

    Example:
        >>> parser = study_parser("A study.")
        >>> add_choices(parser, clock=["cpu", "wall"], init=(["laplace", "uniform"], "where chains start"))
        >>> vars(parser.parse_args(["--init", "uniform"]))
        {'clock': 'cpu', 'init': 'uniform'}
    """
    for name, spec in options.items():
        choices, text = spec if isinstance(spec, tuple) else (spec, None)
        parser.add_argument("--" + name.replace("_", "-"), choices=list(choices), default=choices[0], help=text)


def add_gradient_samplers(parser: argparse.ArgumentParser, text: str) -> None:
    """``--gradient-samplers [GWG DMALA PAS ...]``: extra arms from :data:`neuralblock.kernels.GRADIENT_SAMPLERS`.

    Example:
        >>> parser = study_parser("A study.")
        >>> add_gradient_samplers(parser, "also run these")
        >>> parser.parse_args(["--gradient-samplers", "GWG", "PAS"]).gradient_samplers
        ['GWG', 'PAS']
    """
    from neuralblock.kernels import GRADIENT_SAMPLERS

    parser.add_argument("--gradient-samplers", nargs="*", default=[], choices=list(GRADIENT_SAMPLERS), help=text)


def add_switches(parser: argparse.ArgumentParser, **options: tuple[bool, str]) -> None:
    """On/off options: ``name=(default, help)`` adds ``--name`` and ``--no-name``.

    Example:
        >>> parser = study_parser("A study.")
        >>> add_switches(parser, full_direct=(True, "also run full data"), jit=(False, "compile"))
        >>> vars(parser.parse_args(["--no-full-direct"]))
        {'full_direct': False, 'jit': False}
    """
    for name, (default, text) in options.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)


def add_table(parser: argparse.ArgumentParser, table: str) -> dict[str, float]:
    """Numeric options from a text table, one a line: ``--name  default  quick  help``; returns the quick values.

    ``default`` and ``quick`` are Python number literals; an option's type is its default's. ``quick`` is the
    value ``--quick`` sets (over a given one; :func:`parse_quick` applies them), or ``-`` to leave the option
    alone. The help, the rest of the line, may be empty. The options keep the table's order.

    Example:
        >>> parser = study_parser("A study.")
        >>> quick = add_table(parser, '''
        ...     --n-train   10_000   500   training points
        ...     --budget    5.0      -     seconds per arm
        ... ''')
        >>> quick, vars(parser.parse_args(["--budget", "2"]))
        ({'n_train': 500}, {'n_train': 10000, 'budget': 2.0})
    """
    quick: dict[str, float] = {}
    for line in table.strip().splitlines():
        flag, default, fast, *text = line.split(maxsplit=3)
        if not flag.startswith("--"):
            raise ValueError(f"an option table line starts with --name: {line!r}")
        value = ast.literal_eval(default)
        parser.add_argument(flag, type=type(value), default=value, help=text[0] if text else None)
        if fast != "-":
            quick[flag[2:].replace("-", "_")] = ast.literal_eval(fast)
    return quick


def parse_quick(
    parser: argparse.ArgumentParser, argv: list[str] | None, quick: Mapping[str, Any]
) -> argparse.Namespace:
    """Parse ``argv``; with ``--quick``, set the options in ``quick`` to its values (over any given ones).

    Example:
        >>> parser = study_parser("A study.")
        >>> add_run_options(parser, "demo")
        >>> parse_quick(parser, ["--quick", "--seed", "3"], {"seed": 1}).seed
        1
    """
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args


def proposal_study_parser(doc: str, proposal: str) -> argparse.ArgumentParser:
    """The parser of a study of a trained proposal: :func:`study_parser` with ``--proposal``.

    The study adds its own options, then :func:`add_run_options`.
    """
    parser = study_parser(doc)
    parser.add_argument("--proposal", default=proposal, help="shipped proposal name or a proposal file path")
    return parser


def add_run_options(
    parser: argparse.ArgumentParser,
    out: str,
    quick_help: str = "CI scale (an untrained proposal if none is shipped)",
    no_progress: bool = False,
) -> None:
    """The options most studies end with: ``--seed``, ``--threads``, ``--quick``, ``--out`` (and ``--no-progress``).

    ``quick_help`` describes the study's ``--quick`` scale (the default is the proposal studies' own).

    Example:
        >>> parser = proposal_study_parser("A study.", "chain")
        >>> add_run_options(parser, "experiments/results/demo")
        >>> vars(parser.parse_args(["--quick"]))
        {'proposal': 'chain', 'seed': 0, 'threads': 1, 'quick': True, 'out': 'experiments/results/demo'}
    """
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=out)
    if no_progress:
        parser.add_argument("--no-progress", action="store_true")


def parse_proposal_eval(
    argv: list[str] | None,
    doc: str,
    proposal: str,
    out: str,
    quick: dict[str, Any],
    instances_help: str,
    **numbers: float | tuple[float, str],
) -> argparse.Namespace:
    """The options of a proposal evaluation: a held-out part (``--instances``, ``--mc-samples``), then part 2's.

    ``--instances`` (8192, described by ``instances_help``) and ``--mc-samples`` (32 proposals per instance for
    the acceptance), then ``numbers`` (as :func:`add_numbers` takes them) and :func:`add_run_options`;
    ``--quick`` sets the options in ``quick`` to its values (over any given ones).

    Example:
        >>> args = parse_proposal_eval(["--quick"], "A.", "chain", "demo", {"instances": 4}, "held out", days=9)
        >>> vars(args)
        {'proposal': 'chain', 'instances': 4, 'mc_samples': 32, 'days': 9, 'seed': 0, 'threads': 1, 'quick': True, \
'out': 'demo'}
    """
    parser = proposal_study_parser(doc, proposal)
    add_numbers(
        parser,
        instances=(8192, instances_help),
        mc_samples=(32, "proposals per instance for the acceptance"),
        **numbers,
    )
    add_run_options(parser, out)
    return parse_quick(parser, argv, quick)


def markdown_sections(title: str, sections: Sequence[tuple[str, str]], intro: str = "") -> str:
    """A report: ``# title``, the ``intro`` paragraph if any, then each section's ``## heading`` and body.

    A blank line stands before each part.

    Example:
        >>> markdown_sections("T", [("A", "a"), ("B", "b")])
        '# T\\n\\n## A\\n\\na\\n\\n## B\\n\\nb\\n'
        >>> markdown_sections("T", [("A", "a")], intro="Setup.")
        '# T\\n\\nSetup.\\n\\n## A\\n\\na\\n'
    """
    head = f"# {title}" + (f"\n\n{intro}" if intro else "")
    return head + "".join(f"\n\n## {heading}\n\n{body}" for heading, body in sections) + "\n"


def write_sections(folder: Path, name: str, title: str, sections: Sequence[tuple[str, str]], intro: str = "") -> None:
    """Write :func:`markdown_sections` of ``title``, ``sections`` and ``intro`` as the report ``folder / name``."""
    write_report(folder, name, markdown_sections(title, sections, intro))


def open_study(
    args: argparse.Namespace, *, drop: Collection[str] = ("out", "threads"), **extra: Any
) -> tuple[dict[str, Any], Path]:
    """Set torch's threads to ``args.threads``; return the study's configuration and its output folder.

    The configuration is every option but those in ``drop`` (in the parser's order), then
    ``extra``; the folder is :func:`~neuralblock.diagnostics.reports.study_folder` of it.
    """
    torch.set_num_threads(args.threads)
    config = {k: v for k, v in vars(args).items() if k not in drop}
    config.update(extra)
    return config, study_folder(args.out, config)
