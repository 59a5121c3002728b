"""Running a Pyro model's data plate on chosen indices.

In Pyro a plate's index set is a ``_Subsample`` sample site named after the plate, so a
messenger that sets that site's value runs the model on any subset of the data, provided the
model indexes its data by the plate's indices (Pyro's subsampling idiom). The coresets, the
LWA kernel and the austerity sections build on this; :func:`find_data_plate` finds that plate
in a trace for the global kernels.

This is the one module that imports Pyro's private names (``_Subsample``, the distribution of a
plate's index site); the rest of neuralblock imports them from here, so a Pyro upgrade that moves
them needs one edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from pyro.poutine.subsample_messenger import _Subsample  # Pyro-private: imported here only, re-exported
from torch import Tensor

__all__ = ["DataPlate", "PlateIndices", "find_data_plate", "plate_dim"]


class DataPlate(NamedTuple):
    """The data plate of a model, as found in a trace.

    Attributes:
        name: the plate's name.
        size: its full size ``N``.
        dim: its batch dimension on the observed sites (``None`` when no observed site lies in it).
    """

    name: str
    size: int
    dim: int | None


def find_data_plate(trace: Any, plate: str | None = None, *, shared: bool = False, owner: str = "") -> DataPlate:
    """The data plate of a traced model: the ``pyro.plate`` (with a size) its observed sites lie in.

    Args:
        trace: a ``pyro.poutine.Trace`` of the model (or a mapping site name -> site message).
        plate: the plate's name if the user gave one (checked to be a plate of the model).
        shared: the plate must hold every observed site (and a given ``plate`` at least one);
            otherwise the observed sites must lie in exactly one plate between them.
        owner: the kernel's name, for error messages.

    Raises:
        ValueError: ``plate`` is not a plate of the model (or, with ``shared``, holds no observed
            site), or the plate cannot be told: the message lists the candidates and asks for ``plate=``;
            or the plate subsamples (``subsample_size``): the kernels draw their own sections.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", len(y)):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> find_data_plate(pyro.poutine.trace(model).get_trace(torch.zeros(5)))
        DataPlate(name='data', size=5, dim=-1)
    """
    nodes = trace.nodes if hasattr(trace, "nodes") else trace
    sites = [s for s in (nodes.values() if isinstance(nodes, Mapping) else nodes) if s["type"] == "sample"]
    plates = {s["name"]: s for s in sites if isinstance(s["fn"], _Subsample)}
    observed = [s for s in sites if s["is_observed"] and s["name"] not in plates]
    frames = {f.name: f for s in observed for f in s["cond_indep_stack"] if f.vectorized}
    if plate is not None:
        if plate not in plates:
            raise ValueError(f"plate {plate!r} is not a plate of the model; plates: {sorted(plates)}")
        if shared and plate not in frames:
            raise ValueError(f"plate {plate!r} holds no observed site; plates found: {sorted(frames)}")
        name = plate
    elif shared:
        found = [p for p in frames if all(any(f.name == p for f in s["cond_indep_stack"]) for s in observed)]
        if len(found) != 1:
            raise ValueError(f"{owner} needs one data plate shared by the observed sites, found {found}; pass plate=")
        name = found[0]
    else:
        found = [p for p in frames if p in plates]
        if len(found) != 1:
            raise ValueError(
                f"cannot tell the plate of local sections (observed sites lie in plates {sorted(found)}); "
                "pass plate=<name>"
            )
        name = found[0]
    if name not in plates:
        raise ValueError(f"the data plate {name!r} must be a pyro.plate with a size")
    subsample = plates[name]["fn"]
    if subsample.subsample_size is not None and int(subsample.subsample_size) < int(subsample.size):
        raise ValueError(
            f"the data plate {name!r} subsamples (size {int(subsample.size)}, subsample_size "
            f"{int(subsample.subsample_size)}): {owner or 'the kernel'} draws its own sections; drop subsample_size "
            f"and index the data by the plate's indices (with pyro.plate({name!r}, N) as idx: ... y[idx])"
        )
    frame = frames.get(name)
    return DataPlate(name, int(plates[name]["fn"].size), None if frame is None else frame.dim)


def plate_dim(msg: Message, plate: str) -> int | None:
    """The batch dimension of ``plate`` on a site (``-1`` if unset), or ``None`` outside the plate."""
    for frame in msg["cond_indep_stack"]:
        if frame.name == plate:
            return int(frame.dim) if frame.dim is not None else -1
    return None


class PlateIndices(Messenger):
    """Run a model's data plate on chosen indices, optionally weighting each datum's log-likelihood.

    Sets the plate's ``_Subsample`` site to ``indices``. Pyro then scales every site in the plate by
    ``N / m`` (an unbiased subsample estimate); with ``weights`` that factor is replaced by the per-datum
    ``weights``, so the log density is ``prior + sum_i w_i log p(x_{idx_i} | theta)``.

    Args:
        plate: name of the data plate.
        indices: ``LongTensor [m]`` of data indices.
        weights: optional ``[m]`` positive per-datum weights.

    Attributes:
        size: the plate's full size ``N`` once the model has run (``None`` before, or if the plate
            was not met).

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> def model():
        ...     with pyro.plate("data", 10) as idx:
        ...         return idx
        >>> with PlateIndices("data", torch.tensor([3, 7])) as inject:
        ...     model().tolist(), inject.size
        ([3, 7], 10)
    """

    def __init__(self, plate: str, indices: Tensor, weights: Tensor | None = None) -> None:
        super().__init__()
        self.plate = plate
        self.indices = indices
        self.weights = weights
        self.size: int | None = None

    def _pyro_sample(self, msg: Message) -> None:
        if msg["name"] == self.plate and isinstance(msg["fn"], _Subsample):
            self.size = int(msg["fn"].size)
            fixed = msg["fn"].subsample_size
            if fixed is not None and fixed != len(self.indices):
                raise ValueError(
                    f"plate {self.plate!r} fixes subsample_size={fixed}, but neuralblock runs the data plate on "
                    f"index sets of its own ({len(self.indices)} here): write pyro.plate({self.plate!r}, "
                    f"{self.size}) without subsample_size"
                )
            if len(self.indices) and int(self.indices.max()) >= self.size:
                raise ValueError(
                    f"index {int(self.indices.max())} is out of range for plate {self.plate!r} of size {self.size}"
                )
            msg["value"] = self.indices
            return
        dim = plate_dim(msg, self.plate)
        if self.weights is None or dim is None or self.size is None:
            return
        # the plate (inner messenger, processed first) multiplied the scale by N / m: replace it by w,
        # in the observed value's floating dtype (else the default dtype) so a float32 model stays float32
        value = msg["value"]
        dtype = value.dtype if isinstance(value, Tensor) and value.is_floating_point() else torch.get_default_dtype()
        factor = (len(self.indices) / self.size) * self.weights.to(dtype).reshape((-1,) + (1,) * (-dim - 1))
        msg["scale"] = factor * msg["scale"]
