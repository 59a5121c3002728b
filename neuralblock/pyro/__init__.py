"""The Pyro bridge: factor graphs to Pyro models and back.

* :func:`to_pyro_model` turns a :class:`~neuralblock.FactorGraph` into a Pyro model with
  the same log density (one scalar sample site per latent variable, named like the
  variable), so Pyro's tools (NUTS, ``Predictive``, enumeration) run on it.
* :func:`from_pyro_model` turns a Pyro model with scalar latent sites into a
  :class:`~neuralblock.FactorGraph` (one variable per latent site, named like the site;
  one factor per sample site, with the site's true dependency structure as scope).
* :func:`state_to_samples` and :func:`samples_to_state` convert between flat states
  ``[..., n]`` and ``{site name: values}`` dicts, e.g. ``MCMC.get_samples()``.
* :class:`FlatLayout` (continuous sites as one flat unconstrained vector, with the map to
  constrained values and its log-Jacobian) and :func:`find_data_plate` are shared by the
  global-parameter kernels.
* The Pyro-specific halves of the torch-only packages: :mod:`neuralblock.pyro.sections` (a model's
  lazy local sections) and :mod:`neuralblock.pyro.likelihood` (its direct likelihood path) for
  :mod:`neuralblock.subsample`, and :mod:`neuralblock.pyro.coresets` (per-datum log-likelihoods,
  ``pi_hat`` samplers, the weighted model) for :mod:`neuralblock.coresets`. They are imported on
  demand, not by this package.
* :mod:`neuralblock.pyro.plates` is the one module that imports Pyro's private names.

Example:
    >>> import torch
    >>> from pyro import poutine
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph()
    >>> a, b = fg.add_variable("a", 2), fg.add_variable("b", 2)
    >>> fg.add_table_factor([a, b], torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    0
    >>> model = to_pyro_model(fg)
    >>> trace = poutine.trace(poutine.condition(model, {"a": torch.tensor(1), "b": torch.tensor(0)})).get_trace()
    >>> float(trace.log_prob_sum())
    2.0
"""

from neuralblock.pyro.bridge import (
    FactorGraphModel,
    PyroModelGroup,
    PyroTableGroup,
    from_pyro_model,
    samples_to_state,
    state_to_samples,
    to_pyro_model,
)
from neuralblock.pyro.compile import CompiledTableGroup, PyroGraph, SiteLayout, compile_pyro_model
from neuralblock.pyro.layout import FlatLayout
from neuralblock.pyro.plates import DataPlate, PlateIndices, find_data_plate, plate_dim

__all__ = [
    "CompiledTableGroup",
    "DataPlate",
    "FactorGraphModel",
    "FlatLayout",
    "PlateIndices",
    "PyroGraph",
    "PyroModelGroup",
    "PyroTableGroup",
    "find_data_plate",
    "from_pyro_model",
    "plate_dim",
    "SiteLayout",
    "compile_pyro_model",
    "samples_to_state",
    "state_to_samples",
    "to_pyro_model",
]
