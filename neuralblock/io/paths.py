"""Locate the data files shipped in the repository's ``data/`` folder.

Example:
    >>> from neuralblock.io import data_path, uai_grid
    >>> uai_grid("Grids_15").name
    'Grids_15.uai'
    >>> data_path("uai_grids").is_dir()
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = ["DATA_ROOT", "data_path", "erg_grid", "uai_grid"]

DATA_ROOT = Path(__file__).resolve().parents[2] / "data"
"""The repository's shipped ``data/`` folder (next to the ``neuralblock`` package)."""

UAI_GRIDS = ("Grids_11", "Grids_12", "Grids_13", "Grids_14", "Grids_15", "Grids_16", "Grids_17", "Grids_18")
ERG_GRIDS = ("90-10-1", "90-14-1", "90-16-1")


def data_path(*parts: str) -> Path:
    """Path of a shipped data file or folder, ``data/<parts...>``.

    Args:
        *parts: path components below ``data/`` (none: the folder itself).

    Returns:
        The existing path.

    Raises:
        FileNotFoundError: the ``data/`` folder or the requested entry does not exist
            (e.g. the package was installed without the repository's data).

    Example:
        >>> from neuralblock.io import data_path
        >>> data_path("uai_grids", "Grids_11.uai.PR").read_text().split()
        ['PR', '169.408']
    """
    if not DATA_ROOT.is_dir():
        raise FileNotFoundError(
            f"the shipped data folder {DATA_ROOT} is missing; neuralblock.io.data_path needs a "
            "source checkout of the repository (pip install -e .)"
        )
    path = DATA_ROOT.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"no shipped data file {'/'.join(parts)!r} under {DATA_ROOT}")
    return path


def uai_grid(name: str, kind: Literal["uai", "MAR", "PR", "evid"] = "uai") -> Path:
    """Path of a shipped UAI 2014 grid instance or one of its solution files.

    Args:
        name: ``"Grids_11"`` .. ``"Grids_18"`` (a trailing ``.uai`` is accepted).
        kind: ``"uai"`` (the network), ``"MAR"`` (exact marginals), ``"PR"`` (log10 Z)
            or ``"evid"`` (evidence).

    Returns:
        The existing path, e.g. ``data/uai_grids/Grids_15.uai.MAR``.

    Raises:
        ValueError: unknown ``kind``.
        FileNotFoundError: no such instance.

    Example:
        >>> from neuralblock.io import uai_grid
        >>> uai_grid("Grids_15", "MAR").name
        'Grids_15.uai.MAR'
    """
    if kind not in ("uai", "MAR", "PR", "evid"):
        raise ValueError(f"kind must be one of 'uai', 'MAR', 'PR', 'evid', got {kind!r}")
    stem = name.removesuffix(".uai")
    file = f"{stem}.uai" if kind == "uai" else f"{stem}.uai.{kind}"
    try:
        return data_path("uai_grids", file)
    except FileNotFoundError as err:
        if DATA_ROOT.is_dir():
            raise FileNotFoundError(f"{err}; shipped UAI grids: {', '.join(UAI_GRIDS)}") from None
        raise


def erg_grid(name: str) -> Path:
    """Path of a shipped UAI 2008 ERG grid Bayesian network.

    Args:
        name: ``"90-10-1"``, ``"90-14-1"`` or ``"90-16-1"`` (``.erg``/``.erg.gz`` accepted).

    Returns:
        The existing ``.erg.gz`` path.

    Raises:
        FileNotFoundError: no such network.

    Example:
        >>> from neuralblock.io import erg_grid
        >>> erg_grid("90-14-1").name
        '90-14-1.erg.gz'
    """
    stem = name.removesuffix(".gz").removesuffix(".erg")
    try:
        return data_path("uai_grids", "bn_grids_uai2008_mpe_erg", f"{stem}.erg.gz")
    except FileNotFoundError as err:
        if DATA_ROOT.is_dir():
            raise FileNotFoundError(f"{err}; shipped ERG grids: {', '.join(ERG_GRIDS)}") from None
        raise
