"""Export MCMC runs of our kernels to ArviZ and TensorBoard.

* :func:`to_inference_data` turns a finished ``pyro.infer.MCMC`` run (any kernel,
  discrete sites included) into an ``arviz.InferenceData`` with the draws grouped by
  chain and the kernel's diagnostics as attributes, so ``arviz.summary`` works.
* :class:`TensorBoardHook` is a ``hook_fn`` for ``pyro.infer.MCMC`` that writes the trace
  of every site (the first few elements of vector sites) and the kernel's numeric
  ``logging()`` entries (acceptance by kernel) as TensorBoard scalars.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> from pyro.infer import MCMC
    >>> from neuralblock import GibbsKernel
    >>> def model():
    ...     pyro.sample("z", dist.Bernoulli(0.3))
    >>> mcmc = MCMC(GibbsKernel(model), num_samples=10, num_chains=1, disable_progbar=True)
    >>> mcmc.run()
    >>> idata = to_inference_data(mcmc)
    >>> idata.posterior["z"].shape
    (1, 10)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["TensorBoardHook", "import_arviz", "to_inference_data"]


def import_arviz() -> Any:
    """ArviZ, imported quietly and with its Numba path off.

    ArviZ takes a Numba path wherever Numba is installed (a dependency of this package since its
    compiled sweeps), and in ArviZ 0.2x that path of ``mcse(method="sd")`` fails on NumPy 2
    (``float()`` of a one-element array); its NumPy path gives the same numbers.

    Raises:
        ImportError: ArviZ is not installed (``pip install arviz``).

    Example:
        >>> import_arviz().Numba.numba_flag
        False
    """
    try:
        with warnings.catch_warnings():  # arviz 0.2x announces its 1.0 refactor on import
            warnings.simplefilter("ignore", FutureWarning)
            import arviz as az
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("this needs arviz: pip install arviz") from err
    if az.Numba.numba_flag:
        az.Numba.disable_numba()
    return az


def to_inference_data(mcmc: Any, diagnostics: bool = True, observed_data: bool = True) -> Any:
    """An ``arviz.InferenceData`` of a finished ``pyro.infer.MCMC`` run.

    Unlike ``arviz.from_pyro`` it never re-runs the model to read the posterior (our kernels may
    sample factor graphs, conditioned models or subsampled likelihoods), keeps discrete sites
    (as integers when every draw is a whole number) and stores the kernel's ``diagnostics()`` in
    ``idata.posterior.attrs["kernel_diagnostics"]`` (as text; with several chains, one entry per
    chain, as each chain's kernel reported at its end). ``arviz.from_pyro(mcmc)`` works on our
    kernels too (they report no divergences), but re-runs the model for its log-likelihood.

    Groups:

    * ``posterior``: the draws, dims ``(chain, draw, ...)``;
    * ``sample_stats``: ``diverging`` ``(chain, draw)`` (from the kernels' ``"divergences"``, as
      ArviZ reads them) and the kernel's acceptance rates and data fractions (the
      :class:`~neuralblock.kernels.KernelDiagnostics` keys in ``_CHAIN_STATS``, nested reports
      flattened with ``_``), one value per chain (dims ``(chain,)``, e.g. ``acceptance_rate``,
      ``acceptance_by_proposal_grid`` for a neural block kernel, ``data_fraction`` for ``AusterityMH``,
      ``blocks_1_RandomWalkMH_acceptance_rate`` for a compound kernel's second block); vectorized
      chains of one process share its kernel's value;
    * ``observed_data`` (if ``observed_data``): a FactorGraph's evidence (``x``, over the
      ``observed_variable`` names), or a Pyro model's observed sites, read from one trace of the
      model with the run's arguments (RNG state restored; sites in subsampled or weighted plates,
      whose values are not the data, are left out; skipped if the model fails to trace).

    Args:
        mcmc: a ``pyro.infer.MCMC`` object after ``run``.
        diagnostics: also store Pyro's per-site ``r_hat``/``n_eff`` when available.
        observed_data: also export the observed data (see above).

    Returns:
        ``arviz.InferenceData`` with ``posterior`` and ``sample_stats`` groups (and ``observed_data``
        where known). A kernel with ``chains=K`` vectorized chains in ``P`` processes gives ``P * K``
        chains (chain ``p * K + k`` is vectorized chain ``k`` of process ``p``), so R-hat runs across
        all of them.

    Raises:
        ImportError: arviz is not installed (``pip install arviz``).
        ValueError: the run holds no samples.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> from pyro.infer import MCMC
        >>> from neuralblock import RandomWalkMH
        >>> def model():
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     pyro.sample("y", dist.Normal(mu, 1.0), obs=torch.tensor([0.3, 0.5]))
        >>> mcmc = MCMC(RandomWalkMH(model), num_samples=20, warmup_steps=10, disable_progbar=True)
        >>> mcmc.run()
        >>> idata = to_inference_data(mcmc)
        >>> idata.sample_stats["acceptance_rate"].dims, idata.observed_data["y"].values.tolist()
        (('chain',), [0.30000001192092896, 0.5])
    """
    az = import_arviz()
    samples = mcmc.get_samples(group_by_chain=True)
    if not samples:
        raise ValueError("the MCMC run holds no samples; call mcmc.run(...) first")
    vectorized = int(getattr(mcmc.kernel, "chains", 1))
    if vectorized > 1:  # [processes, draws, K, ...] -> [processes * K, draws, ...]: every chain is a chain
        samples = {name: _split_chains(value, vectorized) for name, value in samples.items()}
    posterior = {name: _as_numpy(value) for name, value in samples.items()}
    num_chains, num_draws = next(iter(posterior.values())).shape[:2]
    attrs: dict[str, Any] = {"inference_library": "pyro + neuralblock", "kernel": type(mcmc.kernel).__name__}
    per_chain = getattr(mcmc, "_diagnostics", None)  # Pyro keeps each chain's kernel.diagnostics(), workers' too
    kernel_diag = getattr(mcmc.kernel, "diagnostics", None)
    reports: list[Any] = []
    if isinstance(per_chain, list) and per_chain and all(d is not None for d in per_chain):
        chains = {f"chain {i}": d for i, d in enumerate(per_chain)}
        attrs["kernel_diagnostics"] = repr(per_chain[0] if len(per_chain) == 1 else chains)
        reports = list(per_chain)
    elif callable(kernel_diag):
        # Pyro's HMC cannot report after cleanup; a third-party kernel may not before setup (parallel chains)
        with contextlib.suppress(TypeError, ZeroDivisionError, AttributeError):
            report = kernel_diag()
            attrs["kernel_diagnostics"] = repr(report)
            reports = [report]
    if diagnostics:
        attrs["pyro_diagnostics"] = repr(_safe_pyro_diagnostics(mcmc))
    if len(reports) * vectorized != num_chains:
        reports = []  # reports that do not map onto the chains: only ``diverging``, all False
    sample_stats: dict[str, Any] = {"diverging": _diverging(reports, vectorized, num_chains, num_draws)}
    observed, dims, coords = _observed_data(mcmc) if observed_data else ({}, {}, {})
    idata = az.from_dict(posterior=posterior, sample_stats=sample_stats)
    if observed:  # its own dims: a FactorGraph's evidence "x" is not the posterior's "x"
        data = az.dict_to_dataset(observed, library=None, coords=coords, dims=dims, default_dims=[])
        idata.add_groups({"observed_data": data})
    for name, values in _chain_stats(reports, vectorized).items():
        idata.sample_stats[name] = (("chain",), values)
    idata.posterior.attrs.update(attrs)
    return idata


_CHAIN_STATS = (
    "acceptance_rate",
    "acceptance_by_proposal",
    "acceptance_by_move",
    "subset_acceptance_rate",
    "remote_acceptance_rate",
    "mean_accept_prob",
    "data_fraction",
)
"""The :class:`~neuralblock.kernels.KernelDiagnostics` keys (acceptance rates and data fractions) whose numeric
values go to ``sample_stats``, one value per chain: a flattened name qualifies when it contains one of them."""


def _flat_numbers(report: Any, prefix: tuple[str, ...] = ()) -> dict[str, float]:
    """The numeric leaves of a (nested) diagnostics dict, under ``_``-joined, identifier-like names."""
    if isinstance(report, Mapping):
        out: dict[str, float] = {}
        for key, value in report.items():
            out.update(_flat_numbers(value, prefix + (re.sub(r"\W+", "_", str(key)).strip("_"),)))
        return out
    if isinstance(report, bool) or not prefix:
        return {}
    number = _number(report) if not isinstance(report, str) else None
    return {"_".join(prefix): number} if number is not None else {}


def _chain_stats(reports: list[Any], vectorized: int) -> dict[str, Any]:
    """``{name: [chains]}``: acceptance rates and data fractions of each process, repeated per vectorized chain."""
    import numpy as np

    flat = [_flat_numbers(report) for report in reports]
    names = [n for n in (flat[0] if flat else {}) if any(key in n.lower() for key in _CHAIN_STATS)]
    return {
        name: np.repeat(np.array([f.get(name, float("nan")) for f in flat], dtype=np.float64), vectorized)
        for name in names
    }


def _diverging(reports: list[Any], vectorized: int, chains: int, draws: int) -> Any:
    """``bool [chains, draws]``: the draws each process's kernel reports in ``"divergences"`` (as ArviZ reads them)."""
    import numpy as np

    diverging = np.zeros((chains, draws), dtype=bool)
    for p, report in enumerate(reports):
        found = report.get("divergences") if isinstance(report, Mapping) else None
        if isinstance(found, list | tuple) and found:
            index = np.asarray(found, dtype=np.int64)
            index = index[(index >= 0) & (index < draws)]
            diverging[p * vectorized : (p + 1) * vectorized, index] = True
    return diverging


def _observed_data(mcmc: Any) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, list[str]]]:
    """``(observed_data, dims, coords)`` for ``arviz.from_dict``: a FactorGraph's evidence or a Pyro model's data."""
    import numpy as np

    kernel = mcmc.kernel
    fg = getattr(kernel, "fg", None)
    from neuralblock.graph import FactorGraph

    if isinstance(getattr(kernel, "_source", None), FactorGraph) and isinstance(fg, FactorGraph):
        if not fg.evidence:
            return {}, {}, {}
        ids = sorted(fg.evidence)
        values = np.array([fg.evidence[v] for v in ids])
        if np.all(values == np.round(values)):
            values = values.astype(np.int64)
        names = [fg.names[v] for v in ids]
        return {"x": values}, {"x": ["observed_variable"]}, {"observed_variable": names}
    model = getattr(kernel, "model", None)
    if not callable(model):
        return {}, {}, {}
    import pyro
    from pyro import poutine

    try:
        with torch.random.fork_rng(), torch.no_grad(), pyro.validation_enabled(False):
            trace = poutine.trace(model).get_trace(*getattr(mcmc, "_args", ()), **getattr(mcmc, "_kwargs", {}))
    except Exception:  # noqa: BLE001 - observed data are optional: a model that needs other arguments has none
        return {}, {}, {}
    observed = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        scale = torch.as_tensor(site.get("scale", 1.0))
        if scale.numel() != 1 or float(scale) != 1.0:  # subsampled or weighted: not the data
            continue
        value = site["value"]
        if isinstance(value, Tensor):
            observed[name] = value.detach().cpu().numpy()
        elif isinstance(value, int | float):
            observed[name] = np.asarray(value)
    return observed, {}, {}


def _split_chains(value: Tensor, chains: int) -> Tensor:
    """``[P, S, K, ...]`` draws of ``K`` vectorized chains in ``P`` processes as ``[P * K, S, ...]`` chains."""
    if value.dim() < 3 or value.shape[2] != chains:
        shape = tuple(value.shape)
        raise ValueError(f"expected draws [processes, samples, {chains}, ...] of {chains} chains, got {shape}")
    return value.movedim(2, 1).reshape(value.shape[0] * chains, value.shape[1], *value.shape[3:])


def _as_numpy(value: Tensor) -> Any:
    value = value.detach().cpu()
    if value.is_floating_point() and torch.isfinite(value).all() and (value == value.round()).all():
        return value.long().numpy()
    return value.numpy()


def _safe_pyro_diagnostics(mcmc: Any) -> dict:
    try:
        return mcmc.diagnostics()
    except (RuntimeError, ValueError, TypeError, ZeroDivisionError):
        return {}


class TensorBoardHook:
    """A ``pyro.infer.MCMC`` ``hook_fn`` that logs traces and kernel statistics to TensorBoard.

    Scalars: ``trace/<site>`` (constrained values; the first ``max_elements`` elements of
    vector sites as ``trace/<site>/<i>``) and ``kernel/<key>`` for every numeric entry of
    ``kernel.logging()`` (e.g. ``kernel/0:acc. prob`` for a compound kernel's first block).
    With ``num_chains > 1`` each worker writes to ``logdir/chain<k>``.

    Args:
        logdir: TensorBoard log folder.
        every: log every ``every``-th iteration.
        max_elements: elements logged per vector site.
        warmup: also log warmup iterations.

    Example:
        >>> import tempfile, torch
        >>> hook = TensorBoardHook(tempfile.mkdtemp())
        >>> hook(None, {"mu": torch.tensor([0.5, 1.0])}, "Sample", 0)
        >>> hook.close()
    """

    def __init__(self, logdir: str | Path, every: int = 1, max_elements: int = 4, warmup: bool = False) -> None:
        for name, value in (("every", every), ("max_elements", max_elements)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(warmup, bool):
            raise ValueError(f"warmup must be True or False, got {warmup!r}")
        self.logdir = Path(logdir)
        self.every, self.max_elements, self.warmup = every, max_elements, warmup
        self._writers: dict[str, Any] = {}
        self._steps: dict[str, int] = {}

    def _writer(self, chain: str) -> Any:
        if chain not in self._writers:
            from torch.utils.tensorboard import SummaryWriter

            self._writers[chain] = SummaryWriter(str(self.logdir / chain) if chain else str(self.logdir))
            self._steps[chain] = 0
        return self._writers[chain]

    def __call__(self, kernel: Any, params: Mapping[str, Tensor], stage: str, i: int) -> None:
        is_warmup = stage.startswith("Warmup")
        match = re.search(r"\[(\d+)\]", stage)
        if match:  # sequential chains: Pyro puts the chain id in the stage
            chain = f"chain{match.group(1)}"
        else:  # parallel chains: Pyro names each worker process by its chain id
            worker = multiprocessing.current_process().name
            chain = f"chain{worker}" if worker.isdigit() else ""
        writer = self._writer(chain)
        step = self._steps[chain]
        self._steps[chain] = step + 1
        if (is_warmup and not self.warmup) or step % self.every:
            return
        transforms = getattr(kernel, "transforms", None) or {}
        for name, value in params.items():
            value = transforms[name].inv(value) if name in transforms else value
            flat = torch.as_tensor(value).detach().reshape(-1)
            if flat.numel() == 1:
                writer.add_scalar(f"trace/{name}", float(flat[0]), step)
            else:
                for k in range(min(flat.numel(), self.max_elements)):
                    writer.add_scalar(f"trace/{name}/{k}", float(flat[k]), step)
        log = kernel.logging() if kernel is not None and hasattr(kernel, "logging") else {}
        for key, value in (log or {}).items():
            number = _number(value)
            if number is not None:
                writer.add_scalar(f"kernel/{key}", number, step)

    def close(self) -> None:
        """Flush and close every writer."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_writers"] = {}
        return state


def _number(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
