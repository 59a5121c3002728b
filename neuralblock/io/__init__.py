"""Readers for discrete graphical-model files, and the shipped data folder.

* :func:`read_uai` (``MARKOV``/``BAYES`` ``.uai``), :func:`read_evid`, :func:`read_mar`,
  :func:`read_pr`, :func:`write_mar`: the UAI inference-competition formats.
* :func:`read_erg`: the ERG grid Bayesian networks of UAI 2008.
* :func:`data_path`, :func:`uai_grid`, :func:`erg_grid`: paths into ``data/``.

Malformed files raise ``ValueError("<file> line <n>: <problem>")``.

Example:
    >>> import torch
    >>> from neuralblock.io import read_uai, uai_grid
    >>> fg = read_uai(uai_grid("Grids_11"), evid=uai_grid("Grids_11", "evid"))
    >>> bool(torch.isfinite(fg.log_joint(torch.zeros(fg.num_variables))))
    True
"""

from neuralblock.io.erg import read_erg
from neuralblock.io.paths import DATA_ROOT, data_path, erg_grid, uai_grid
from neuralblock.io.uai import read_evid, read_mar, read_pr, read_uai, write_mar

__all__ = [
    "DATA_ROOT",
    "data_path",
    "erg_grid",
    "read_erg",
    "read_evid",
    "read_mar",
    "read_pr",
    "read_uai",
    "uai_grid",
    "write_mar",
]
