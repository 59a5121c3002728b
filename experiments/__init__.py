"""The studies of this repository, run from its root as modules: ``python -m experiments.<study> [--quick]``.

Each study writes its outputs under ``experiments/results/<study>/<config hash>/``. Code that several
studies share lives in modules of its own here; a study keeps only what is specific to it.
"""
