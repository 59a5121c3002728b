"""Lazy local sections of a Pyro model: evaluate only the plate indices a test draws.

A model written in Pyro's subsampling idiom,

    with pyro.plate("data", N) as idx:
        pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

is run on a chosen index set by conditioning the plate's index site (in Pyro a plate's
index set is a ``_Subsample`` sample site named after the plate), so a run on ``k``
sections costs O(k). The per-section log-likelihoods are the *unscaled* log-probs: the
plate's ``N/k`` scale is divided out (any other ``poutine.scale`` is kept). Sites outside
the plate form the *global* term (priors, and other latent sites held fixed).

Latent sites other than the updated ones are held at given values. One inside the plate
(e.g. a local latent ``h_t`` of a time series) is given at full size and indexed along its
plate dimension, so dependent sections that read neighbouring values (``h[idx - 1]``) from
the model's arguments or closure work the same way.

A model that ignores the indices (computes on the full data) is detected at setup and
evaluated in full, once per parameter value, with a one-time warning. The plate must not
fix its own ``subsample_size`` (Pyro then rejects index sets of another size).

Several values of the updated global sites can be evaluated in *one* model run
(:meth:`SectionEvaluator.evaluate_many`): each is given a leading batch dimension left of
every plate (Pyro's vectorized-particles convention), so a model whose arithmetic broadcasts
returns ``[P, k]`` section terms for the ``P`` points at the cost of about one run. Whether the
model broadcasts is checked once (:meth:`SectionEvaluator.check_vectorized`); otherwise the
points are evaluated one run each.

The torch-only package :mod:`neuralblock.subsample` re-exports these names on first access (its
old paths ``neuralblock.subsample.sections`` and ``neuralblock.subsample.likelihood`` keep working).

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    >>> def model():
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 4) as idx:
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> sections = SectionEvaluator(model, "data", 4)
    >>> sections.check_lazy({"mu": torch.tensor(0.0)})
    True
    >>> terms = sections.evaluate({"mu": torch.tensor(0.0)}, torch.tensor([3, 1]))
    >>> [round(v, 3) for v in terms.sections.tolist()]
    [-5.419, -1.419]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import pyro
import torch
from pyro.distributions.util import scale_and_mask
from torch import Tensor

from neuralblock.pyro.log_prob import site_log_prob
from neuralblock.pyro.plates import _Subsample

__all__ = ["SectionEvaluator", "SectionTerms", "is_subsample_site", "section_scale", "site_plate_frame"]


class SectionTerms(NamedTuple):
    """Log-density terms of one model run.

    Attributes:
        global_term: sum of the log-probs of the sites outside the plate (0-dim).
        sections: unscaled log-prob of each requested section, ``[k]``.
    """

    global_term: Tensor
    sections: Tensor


def site_plate_frame(site: dict[str, Any], plate: str) -> Any | None:
    """The ``CondIndepStackFrame`` of ``plate`` on a trace site, or ``None``."""
    return next((f for f in site["cond_indep_stack"] if f.name == plate), None)


def section_scale(site: dict[str, Any], frame: Any | None) -> Any:
    """A site's scale without the plate's own ``N/k`` subsampling factor (any other ``poutine.scale`` kept).

    Args:
        site: a sample message or trace site.
        frame: the site's frame of the plate (:func:`site_plate_frame`), or ``None`` outside it.
    """
    scale = site["scale"]
    return scale if frame is None else scale * frame.size / frame.full_size


def is_subsample_site(site: dict[str, Any]) -> bool:
    """Whether a trace site is a plate's index set (a ``_Subsample`` sample site)."""
    return isinstance(site["fn"], _Subsample)


class SectionEvaluator:
    """Runs a Pyro model on chosen sections of one plate and splits its log density.

    Args:
        model: the Pyro model.
        plate: name of the plate of local sections.
        num_sections: the plate's size ``N``.
        args: the model's positional arguments.
        kwargs: the model's keyword arguments.
        local_dims: for latent sites inside the plate that are held fixed, the dimension of
            their value that the plate indexes (negative, counted from the right).
        validate: keep Pyro's argument validation on during runs (off by default: it costs
            more than a small mini-batch's arithmetic).
        direct: evaluate through the direct likelihood path (:class:`~neuralblock.pyro.likelihood.DirectPath`:
            the run is traced once per input layout and replayed as a tensor graph); models it cannot
            compile fall back to Pyro runs, with a warning.
    """

    def __init__(
        self,
        model: Callable,
        plate: str,
        num_sections: int,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        local_dims: dict[str, int] | None = None,
        validate: bool = False,
        direct: bool = True,
    ) -> None:
        self.model, self.plate, self.num_sections = model, plate, int(num_sections)
        self.args, self.kwargs = tuple(args), dict(kwargs or {})
        self.local_dims = dict(local_dims or {})
        self.validate = validate
        self.lazy = True
        self.vectorized = False
        self._nesting: int | None = None
        self._event_dims: dict[str, int] = {}
        self.direct_failure: str | None = None
        self.direct: Any = None
        if direct:
            from neuralblock.pyro.likelihood import DirectPath

            self.direct = DirectPath(self)

    @property
    def batched(self) -> bool:
        """Whether :meth:`evaluate_many` evaluates ``P`` points in one call (direct path, or a broadcasting model)."""
        return self.direct is not None or self.vectorized

    def _via_direct(
        self,
        batch: dict[str, Tensor],
        shared: dict[str, Tensor],
        idx: Tensor | None,
        with_global: bool,
        points: int | None,
    ) -> SectionTerms | None:
        """The terms through the direct path, or ``None`` if it is off (switched off, with a warning, on failure)."""
        if self.direct is None:
            return None
        from neuralblock.pyro.likelihood import CompileError

        try:
            return self.direct.terms(batch, shared, idx, with_global, points)
        except CompileError as err:
            self._drop_direct(str(err))
            return None

    def _drop_direct(self, reason: str) -> None:
        plain, self.direct, self.direct_failure = bool(self.direct.plain), None, reason
        warnings.warn(
            f"the model's plate {self.plate!r} cannot be compiled to the direct likelihood path ({reason}); "
            "falling back to one Pyro run per evaluation (slower)",
            RuntimeWarning,
            stacklevel=4,
        )
        if plain:  # the direct path was what made a model that ignores its indices lazy
            self.lazy = False
            _warn_not_lazy(self.plate)

    # -- running the model --------------------------------------------------------------
    def _run(
        self, values: dict[str, Tensor], idx: Tensor | None, with_global: bool = True, points: int | None = None
    ) -> SectionTerms:
        with pyro.validation_enabled(self.validate):
            trace = self._trace(values, idx)
            size = self.num_sections if idx is None else idx.numel()
            return self._terms(trace, size, with_global, points)

    def _trace(self, values: dict[str, Tensor], idx: Tensor | None) -> list[dict[str, Any]]:
        """Run the model with ``values`` (and the plate's indices) conditioned; return its sample messages."""
        data = dict(values)
        if idx is not None:
            for name, dim in self.local_dims.items():
                if name in data:
                    data[name] = data[name].index_select(dim, idx)
            data[self.plate] = idx
        recorder = _recorder_class()(data)
        with recorder:
            self.model(*self.args, **self.kwargs)
        return recorder.sites

    def _terms(
        self, sites: list[dict[str, Any]], size: int, with_global: bool = True, points: int | None = None
    ) -> SectionTerms:
        """Split a run's log density into the global term and per-section terms (``[P]`` and ``[P, k]`` if batched)."""
        lead = 1 if points is None else points
        glob: Tensor | None = None
        sections: Tensor | None = None  # sums start from the first term: fewer autograd nodes
        for site in sites:
            if is_subsample_site(site):
                continue
            frame = site_plate_frame(site, self.plate)
            if frame is None and not with_global:
                continue
            # the mask may be a tensor or a Python bool (poutine.mask(mask=True)); Pyro's helper takes both
            lp = scale_and_mask(site_log_prob(site["fn"], site["value"]), section_scale(site, frame), site["mask"])
            lp = self._lead(site, lp, points, 0 if frame is None else -frame.dim)
            if frame is None:
                term = lp.reshape(lead, -1).sum(-1)
                glob = term if glob is None else glob + term
                continue
            dim = frame.dim
            if lp.shape[dim] != size:
                if lp.shape[dim] != 1:
                    raise ValueError(
                        f"site {site['name']!r} has {lp.shape[dim]} entries along plate {self.plate!r}, expected {size}"
                    )
                lp = lp.expand(*lp.shape[:dim], size, *lp.shape[lp.dim() + dim + 1 :])
            per = lp if lp.dim() == 2 else lp.movedim(dim, 1).reshape(lead, size, -1).sum(-1)
            sections = per if sections is None else sections + per
        glob = torch.zeros(lead) if glob is None else glob
        sections = torch.zeros(lead, size) if sections is None else sections
        if points is None:
            return SectionTerms(glob[0], sections[0])
        return SectionTerms(glob, sections)

    def _lead(self, site: dict[str, Any], lp: Tensor, points: int | None, depth: int) -> Tensor:
        """``lp`` with a leading points dimension: ``[1, ...]`` unbatched, ``[P, ...]`` (left of all plates) batched."""
        if points is None:
            if lp.dim() < depth:
                lp = lp.reshape((1,) * (depth - lp.dim()) + lp.shape)
            return lp.unsqueeze(0)
        width = (self._nesting or 0) + 1
        if lp.dim() > width or (lp.dim() == width and lp.shape[0] not in (1, points)):
            raise ValueError(
                f"site {site['name']!r} has log-prob shape {tuple(lp.shape)}, which does not broadcast "
                f"{points} points left of the model's {width - 1} plate dimensions"
            )
        if lp.dim() < width:
            lp = lp.reshape((1,) * (width - lp.dim()) + lp.shape)
        return lp if lp.shape[0] == points else lp.expand(points, *lp.shape[1:])

    def evaluate(self, values: dict[str, Tensor], idx: Tensor, with_global: bool = True) -> SectionTerms:
        """Global term and per-section log-probs on the sections ``idx``.

        Args:
            values: constrained values of every latent site (full size for local ones).
            idx: ``LongTensor [k]`` of section indices.
            with_global: also compute the global term (else it is returned as 0).
        """
        if not self.lazy:
            full = self.evaluate_full(values)
            return SectionTerms(full.global_term, full.sections[idx])
        direct = self._via_direct({}, values, idx, with_global, None)
        return direct if direct is not None else self._run(values, idx, with_global)

    def evaluate_full(self, values: dict[str, Tensor]) -> SectionTerms:
        """Global term and all ``N`` per-section log-probs, from one ordinary model run."""
        direct = self._via_direct({}, values, None, True, None)
        return direct if direct is not None else self._run(values, None)

    def terms_of_trace(self, sites: list[dict[str, Any]]) -> SectionTerms:
        """Global term and all ``N`` per-section log-probs of a full run's sample sites (e.g. a setup trace).

        Saves a second O(N) run when the caller already traced the model at the values of
        interest. Sites are trace nodes (``poutine.trace(model).get_trace(...).nodes``) of type
        ``"sample"``. Their distributions validate as they were built (a run under Pyro's
        validation may raise on an observation its own runs would accept).
        """
        with torch.no_grad():
            return self._terms(sites, self.num_sections)

    def bind(self, values: dict[str, Tensor]) -> Callable[[Tensor], SectionTerms]:
        """``idx -> SectionTerms`` at fixed ``values``; a non-lazy model is run in full once.

        The global term is computed on the first call only (later calls return 0 for it).
        """
        if self.lazy:
            calls: list[None] = []  # the global term is computed on the first call only

            def evaluate(idx: Tensor) -> SectionTerms:
                calls.append(None)
                return self.evaluate(values, idx, with_global=len(calls) == 1)

            return evaluate
        full = self.evaluate_full(values)
        return lambda idx: SectionTerms(full.global_term, full.sections[idx])

    def evaluate_many(
        self,
        values: dict[str, Tensor],
        batch: dict[str, Tensor],
        idx: Tensor | None,
        with_global: bool = True,
    ) -> SectionTerms:
        """Global terms ``[P]`` and per-section log-probs ``[P, k]`` at ``P`` values of some sites.

        One model run when :attr:`vectorized` (see :meth:`check_vectorized`), else one run per point.

        Args:
            values: constrained values of the latent sites shared by every point (full size for local ones).
            batch: ``{site: [P, *shape]}``, the ``P`` values of the sites that differ between points.
            idx: ``LongTensor [k]`` of section indices, or ``None`` for all ``N``.
            with_global: also compute the global terms (else they are returned as 0).

        Example:
            >>> import pyro, pyro.distributions as dist
            >>> y = torch.tensor([0.0, 1.0, 2.0])
            >>> def model():
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pyro.plate("data", 3) as idx:
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
            >>> sections = SectionEvaluator(model, "data", 3)
            >>> sections.check_vectorized({}, {"mu": torch.tensor([0.0, 1.0])})
            True
            >>> sections.evaluate_many({}, {"mu": torch.tensor([0.0, 1.0])}, torch.tensor([2])).sections.shape
            torch.Size([2, 1])
        """
        points = _num_points(batch)
        if idx is not None and not self.lazy:
            full = self.evaluate_many(values, batch, None)
            return SectionTerms(full.global_term, full.sections[:, idx])
        direct = self._via_direct(batch, values, idx, with_global, points)
        if direct is not None:
            return direct
        if not self.vectorized:
            point = [{**values, **{s: v[p] for s, v in batch.items()}} for p in range(points)]
            runs = [self._run(v, idx, with_global) for v in point]
            return SectionTerms(torch.stack([r.global_term for r in runs]), torch.stack([r.sections for r in runs]))
        return self._run({**values, **self._batched(batch, points)}, idx, with_global, points)

    def bind_many(self, values: dict[str, Tensor], batch: dict[str, Tensor]) -> Callable[[Tensor], SectionTerms]:
        """``idx -> SectionTerms`` (``[P]``, ``[P, k]``) at fixed points; a non-lazy model is run in full once.

        The global terms are computed on the first call only (later calls return 0 for them).

        Example:
            >>> import pyro, pyro.distributions as dist
            >>> def model():
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pyro.plate("data", 4) as idx:
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=torch.zeros(4)[idx])
            >>> evaluate = SectionEvaluator(model, "data", 4).bind_many({}, {"mu": torch.zeros(2)})
            >>> evaluate(torch.tensor([0, 1])).global_term.shape, evaluate(torch.tensor([2])).global_term.tolist()
            (torch.Size([2]), [0.0, 0.0])
        """
        if self.lazy:
            calls: list[None] = []

            def evaluate(idx: Tensor) -> SectionTerms:
                calls.append(None)
                return self.evaluate_many(values, batch, idx, with_global=len(calls) == 1)

            return evaluate
        full = self.evaluate_many(values, batch, None)
        first = [True]

        def index(idx: Tensor) -> SectionTerms:
            glob = full.global_term if first[0] else torch.zeros_like(full.global_term)
            first[0] = False
            return SectionTerms(glob, full.sections[:, idx])

        return index

    def _batched(self, batch: dict[str, Tensor], points: int) -> dict[str, Tensor]:
        """Each ``[P, *shape]`` value reshaped so that ``P`` lies left of every plate dimension."""
        nesting = self._nesting or 0
        out = {}
        for name, value in batch.items():
            shape = value.shape[1:]
            batch_dims = len(shape) - self._event_dims.get(name, 0)
            if batch_dims > nesting:
                raise ValueError(f"site {name!r} has {batch_dims} batch dimensions outside the model's plates")
            out[name] = value.reshape(points, *((1,) * (nesting - batch_dims)), *shape)
        return out

    # -- setup ------------------------------------------------------------------------------
    def check_vectorized(self, values: dict[str, Tensor], batch: dict[str, Tensor]) -> bool:
        """Check that one run with a leading points dimension matches one run per point; set :attr:`vectorized`.

        Models whose arithmetic does not broadcast a leading dimension (e.g. ``X[idx] @ w``) are
        evaluated one run per point, silently: they are correct, only slower.

        Args:
            values: constrained values of the shared latent sites.
            batch: ``{site: [P, *shape]}`` with ``P >= 2`` distinct trial points.

        Returns:
            Whether :meth:`evaluate_many` runs the model once for all points from now on.
        """
        points = _num_points(batch)
        first = {**values, **{s: v[0] for s, v in batch.items()}}
        idx = torch.arange(min(3, self.num_sections)) if self.lazy else None
        self.vectorized = False
        try:
            with pyro.validation_enabled(self.validate):
                sites = self._trace(first, idx)
            self._nesting = max(
                [-f.dim for site in sites for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None],
                default=0,
            )
            self._event_dims = {site["name"]: int(site["fn"].event_dim) for site in sites if site["name"] in batch}
            loop = self.evaluate_many(values, batch, idx)
            one = self._run({**values, **self._batched(batch, points)}, idx, True, points)
            self.vectorized = bool(
                one.sections.shape == loop.sections.shape
                and torch.allclose(one.sections.double(), loop.sections.double(), rtol=1e-5, atol=1e-5)
                and torch.allclose(one.global_term.double(), loop.global_term.double(), rtol=1e-5, atol=1e-5)
            )
        except (ValueError, RuntimeError, IndexError, TypeError):
            self.vectorized = False
        return self.vectorized

    def check_lazy(self, values: dict[str, Tensor], full: SectionTerms | None = None) -> bool:
        """Check that the model honours injected indices; else fall back to full runs (with a warning).

        A trial run on a few sections must give those sections' values of a full run.

        Args:
            values: constrained latent values to run the trial at.
            full: the full run at ``values`` if already computed.

        Returns:
            Whether the model is evaluated lazily from now on.
        """
        n = self.num_sections
        k = min(3, n - 1)
        if k < 1:
            self.lazy = True
            return True
        idx = torch.arange(n - k, n)
        try:
            trial = self._run(values, idx)
            reference = full if full is not None else self._run(values, None)
            ok = bool(
                torch.allclose(trial.sections.double(), reference.sections[idx].double(), rtol=1e-4, atol=1e-4)
                and torch.allclose(trial.global_term.double(), reference.global_term.double(), rtol=1e-4, atol=1e-4)
            )
        except (ValueError, RuntimeError, IndexError):
            ok = False
        if not ok and self.direct is not None:  # a model that ignores its indices: re-index its data in the graph
            self.direct.plain = True
            ok = self._via_direct({}, values, idx, True, None) is not None
            if not ok:
                return False  # _drop_direct warned
        if not ok:
            _warn_not_lazy(self.plate, stacklevel=4)
        self.lazy = ok
        return ok


def _warn_not_lazy(plate: str, stacklevel: int = 5) -> None:
    warnings.warn(
        f"the model does not evaluate plate {plate!r} on the indices it is given (write it as "
        f"`with pyro.plate({plate!r}, N) as idx: ... obs=y[idx]`); every section will be evaluated, "
        "so the kernel is not sublinear for this model",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


_RECORDER: type | None = None


def _recorder_class() -> type:
    """A minimal Pyro messenger: conditions sample sites on given values and keeps their messages.

    Lighter than ``poutine.trace(poutine.condition(...))`` (no trace graph, no message copies),
    which matters when each run evaluates only a mini-batch.
    """
    global _RECORDER
    if _RECORDER is None:
        from pyro.poutine.messenger import Messenger

        class SectionRecorder(Messenger):
            def __init__(self, data: dict[str, Tensor]) -> None:
                super().__init__()
                self.data = data
                self.sites: list[dict[str, Any]] = []

            def _pyro_sample(self, msg: dict[str, Any]) -> None:
                if msg["name"] in self.data:
                    msg["value"] = self.data[msg["name"]]
                    msg["is_observed"] = True

            def _pyro_post_sample(self, msg: dict[str, Any]) -> None:
                self.sites.append(msg)

        _RECORDER = SectionRecorder
    return _RECORDER


def _num_points(batch: dict[str, Tensor]) -> int:
    sizes = {int(v.shape[0]) if v.dim() > 0 else 0 for v in batch.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"batch values must share one leading points dimension, got sizes {sorted(sizes)}")
    return sizes.pop()
