r"""Light and Widely Applicable MCMC (informed sub-sampling) as a Pyro ``MCMCKernel``.

The chain runs on ``(θ, U)`` where ``U`` is a subset of ``n`` of the ``N`` data points
(arbitrary subsets for iid data, contiguous windows for time series). ``U`` is weighted
by how well its summary statistics match the full data's,

.. math::

    \nu(U) \propto \exp\Big(-\frac{\|\bar S(Y_U) - \bar S(Y_{1:N})\|^2}{2\varepsilon^2}\Big)

(a Gaussian kernel of bandwidth ``ε``; ``ε = inf`` gives uniform subsets), and ``θ`` is
updated against the *sub-posterior* whose likelihood on ``U`` is raised to the power
``N / n``,

.. math::

    \tilde\pi_U(\theta) \propto p(\theta)\, f(Y_U \mid \theta)^{N/n}.

Each transition does (1) ``subset_steps`` (default 1) MH updates of ``U`` with the symmetric
proposal ``R`` below, then (2) a Gaussian random-walk MH update of ``θ`` (in the unconstrained space, all
``sites`` jointly) against :math:`\tilde\pi_U`. Two subset updates are offered:

* ``subset_update="informed"`` (default; the seed paper's ISS-MCMC): ``U`` moves with
  acceptance ``min(1, ν(U') / ν(U))``, independently of ``θ``. *Exact statements*: the
  ``U``-chain is reversible with respect to ``ν``, and for a fixed ``U`` the ``θ``-update
  leaves :math:`\tilde\pi_U` invariant. The pair is a noisy MCMC approximating
  :math:`\sum_U \nu(U)\,\tilde\pi_U(\theta)/Z_U` (its ``θ``-marginal is not exactly known;
  this is the approximation the paper analyses).
* ``subset_update="joint"``: ``U`` moves with acceptance
  ``min(1, ν(U') f(Y_U'|θ)^{N/n} / (ν(U) f(Y_U|θ)^{N/n}))``: Metropolis-within-Gibbs that
  leaves **exactly** invariant the joint target

  .. math:: \pi(\theta, U) \propto \nu(U)\, p(\theta)\, f(Y_U \mid \theta)^{N/n}

  whose ``U``-marginal is :math:`\propto \nu(U) Z_U` with
  :math:`Z_U = \int p(\theta) f(Y_U\mid\theta)^{N/n} d\theta`.

The proposal ``R``: with probability ``omega`` a *local move* (iid: replace
``k = max(1, round(lam * n))`` uniformly chosen members of ``U`` by ``k`` uniformly chosen
non-members; window: shift the window by ``±j``, ``j`` uniform on ``1..max(1, round(lam * n))``,
a shift off the data being a rejection), otherwise a *remote jump* (a fresh uniform subset
or window start). Each part is symmetric, so ``R`` is symmetric and no Hastings
correction is needed.

Remote jumps at small ``ε``: ``ν`` then puts its mass on a tiny fraction of the subsets (at
``n = 100``, ``ε = 1e-2`` in ``experiments/arma_lwa.py``, about 2e-3 of the windows), so a single
uniform jump is almost never accepted and ``U`` only creeps by local moves. With
``subset_tries = K > 1`` (informed mode) a remote jump is a *multiple-try Metropolis* move
(Liu, Liang & Wong 2000) with the uniform independent proposal: draw ``K`` uniform candidates,
pick ``U'`` among them with probability ``∝ ν``, draw ``K - 1`` uniform reference subsets, and
accept with ``min(1, Σ ν(candidates) / (Σ ν(references) + ν(U)))``. It is reversible with
respect to ``ν`` (the summaries of all ``2K - 1`` subsets are one batched call,
:func:`~neuralblock.kernels.summaries.summarise_batch`).

Evaluating the model on ``U``: the model indexes its data by the data plate's indices,
``with pyro.plate("data", N) as idx: pyro.sample("y", ..., obs=y[idx])``. The kernel sets
the plate's index set (its ``_Subsample`` site) to ``U`` and uses the **unscaled**
log-probabilities of the sites inside the plate, multiplied by ``N / n`` here. For a time
series the model receives the window's contiguous indices in order and must compute the
window's conditional likelihood from them (e.g. an ARMA error recursion restarted at the
window's first index; see ``experiments/arma_lwa.py``). Latent sites inside the data
plate are not supported. Per-iteration cost is ``O(n)`` (at most two density evaluations on ``U``,
one summary of ``U``); the full-data summary is computed once at ``setup``. The densities go through
the direct likelihood path (:class:`~neuralblock.pyro.likelihood.LogLikelihood`, traced once at
``setup``, no Pyro run per call); a model it cannot compile runs through Pyro, with a warning.

References:
    F. Maire, N. Friel, P. Alquier, "Informed sub-sampling MCMC: approximate Bayesian
    inference for large datasets", Statistics and Computing 29 (2019).

Example:
    >>> import pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> y = torch.randn(500) + 1.0
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])
    >>> kernel = LWAKernel(model, subset_size=50, epsilon=0.1)
    >>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True)
    >>> mcmc.run(y)
    >>> kernel.diagnostics()["data_fraction"]
    0.1
    >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1.0) < 0.5)
    True
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions import TorchDistribution
from pyro.distributions.util import scale_and_mask
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from neuralblock.kernels.adaptation import StepSizeAdapter
from neuralblock.kernels.functional import mh_accept
from neuralblock.kernels.summaries import SummaryFn, default_summaries, summarise_batch
from neuralblock.kernels.vocabulary import KernelDiagnostics, per_second
from neuralblock.pyro.layout import FlatLayout
from neuralblock.pyro.likelihood import CompileError, LogLikelihood
from neuralblock.pyro.plates import PlateIndices, _Subsample, find_data_plate, plate_dim
from neuralblock.pyro.sections import section_scale, site_plate_frame

__all__ = [
    "LWAKernel",
    "SubsetProposal",
    "draw_distinct",
    "multiple_try_log_alpha",
    "propose_subset",
    "uniform_subsets",
    "subset_log_weight",
]

SUBSET_KINDS = ("iid", "window")
SUBSET_UPDATES = ("informed", "joint")
MIN_SUBSET_RENEWALS = 20  # fewer full renewals of U over a run: theta's draws reflect only a few subsets


class SubsetProposal(NamedTuple):
    """A proposed subset from the mixture proposal ``R``.

    Attributes:
        indices: the proposed subset ``U'`` (``LongTensor [n]``; the current ``U`` when invalid).
        num_changed: members of ``U`` that are not in ``U'``.
        remote: whether this was a remote jump (else a local move).
        valid: ``False`` for a window shifted off the data (a certain rejection).
    """

    indices: Tensor
    num_changed: int
    remote: bool
    valid: bool


def draw_distinct(num_data: int, k: int, exclude: Tensor | None = None) -> Tensor:
    """``k`` distinct indices drawn uniformly from ``range(num_data)`` minus ``exclude``.

    Costs ``O(k + len(exclude))`` when the pool is large (rejection of repeats and excluded
    values, then a uniform choice among the distinct survivors, which is uniform over
    ``k``-subsets by exchangeability); it enumerates the pool only when that is as cheap.

    Args:
        num_data: size of the index range.
        k: number of indices to draw.
        exclude: indices that must not be drawn.

    Example:
        >>> out = draw_distinct(10, 3, exclude=torch.tensor([0, 1]))
        >>> len(set(out.tolist())) == 3 and min(out.tolist()) >= 2
        True
    """
    excluded = exclude if exclude is not None else torch.zeros(0, dtype=torch.long)
    available = num_data - excluded.numel()
    if k < 0 or k > available:
        raise ValueError(f"cannot draw {k} distinct indices from {available} available ones")
    if available <= 4 * (k + excluded.numel()) + 16:
        mask = torch.ones(num_data, dtype=torch.bool)
        mask[excluded] = False
        pool = mask.nonzero().squeeze(1)
        return pool[torch.randperm(pool.numel())[:k]]
    while True:
        candidates = torch.randint(0, num_data, (2 * k + 16,))
        candidates = candidates[~torch.isin(candidates, excluded)].unique()
        if candidates.numel() >= k:
            return candidates[torch.randperm(candidates.numel())[:k]]


def propose_subset(indices: Tensor, num_data: int, subset: str, omega: float, lam: float) -> SubsetProposal:
    """Draw ``U' ~ R(U, .)``: a local move with probability ``omega``, else a remote jump.

    ``R`` is symmetric (``R(U, U') = R(U', U)``), so the MH ratio for ``U`` has no proposal term.

    Args:
        indices: the current subset ``U`` (a window: its indices in order).
        num_data: ``N``.
        subset: ``"iid"`` or ``"window"``.
        omega: probability of a local move.
        lam: local move size as a fraction of ``n`` (points swapped, or maximal window shift).

    Returns:
        A :class:`SubsetProposal`.

    Example:
        >>> prop = propose_subset(torch.arange(10, 20), 100, "window", omega=1.0, lam=0.2)
        >>> prop.num_changed in (1, 2) and prop.indices.numel() == 10
        True
    """
    n = indices.numel()
    remote = bool(torch.rand(()) >= omega)
    size = max(1, round(lam * n))
    if subset == "window":
        start = int(indices[0])
        if remote:
            new_start = int(torch.randint(0, num_data - n + 1, ()))
        else:
            shift = int(torch.randint(1, size + 1, ())) * (1 if bool(torch.rand(()) < 0.5) else -1)
            new_start = start + shift
            if not 0 <= new_start <= num_data - n:
                return SubsetProposal(indices, 0, False, False)
        return SubsetProposal(torch.arange(new_start, new_start + n), min(abs(new_start - start), n), remote, True)
    if remote:
        new = draw_distinct(num_data, n)
        return SubsetProposal(new, n - int(torch.isin(new, indices).sum()), True, True)
    k = min(size, num_data - n)
    if k == 0:  # U is all the data: nothing to swap in
        return SubsetProposal(indices, 0, False, False)
    new = indices.clone()
    new[torch.randperm(n)[:k]] = draw_distinct(num_data, k, exclude=indices)
    return SubsetProposal(new, k, False, True)


def uniform_subsets(num_data: int, n: int, subset: str, k: int) -> Tensor:
    """``k`` independent uniform subsets of size ``n`` (the remote-jump proposal), ``LongTensor [k, n]``.

    Example:
        >>> out = uniform_subsets(100, 10, "window", 3)
        >>> out.shape == (3, 10) and bool((out[:, 1:] - out[:, :-1] == 1).all())
        True
    """
    if subset == "window":
        starts = torch.randint(0, num_data - n + 1, (k,))
        return starts[:, None] + torch.arange(n)
    return torch.stack([draw_distinct(num_data, n) for _ in range(k)])


def multiple_try_log_alpha(log_w_candidates: Tensor, log_w_references: Tensor, log_w_current: float) -> Tensor:
    """Log acceptance ratio of multiple-try Metropolis with an independent symmetric proposal.

    ``log Σ_k w(candidate_k) - log(Σ_k w(reference_k) + w(current))``, with ``K`` candidates and ``K - 1``
    references (fresh draws from the same proposal).

    Example:
        >>> a = multiple_try_log_alpha(torch.tensor([0.0, 0.0]), torch.tensor([0.0]), 0.0)
        >>> float(a)
        0.0
    """
    if log_w_references.numel() != log_w_candidates.numel() - 1:
        raise ValueError("multiple-try Metropolis needs K candidates and K - 1 references")
    current = torch.tensor([log_w_current], dtype=log_w_candidates.dtype)
    return torch.logsumexp(log_w_candidates, 0) - torch.logsumexp(torch.cat([log_w_references, current]), 0)


def subset_log_weight(summary: Tensor, full_summary: Tensor, epsilon: float) -> Tensor:
    """``log ν(U)`` up to a constant: ``-||S(U) - S_N||^2 / (2 ε^2)`` (0 for ``ε = inf``).

    Example:
        >>> float(subset_log_weight(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0]), 1.0))
        -2.0
    """
    if math.isinf(epsilon):
        return torch.zeros(summary.shape[:-1], dtype=summary.dtype)
    return -(summary - full_summary).square().sum(-1) / (2.0 * epsilon**2)


class _SubsetLogDensity(PlateIndices):
    """Runs a model on the subset ``indices`` of plate ``plate`` at fixed latent ``values``, summing log densities.

    Sites inside the plate contribute their (masked) log-probabilities without the plate's own
    subsampling factor, times ``plate_scale`` (``N / n``; any other ``poutine.scale``, e.g. per-datum
    weights, is kept); other sites their log-probabilities with the model's own scale and mask.
    Lighter than ``trace`` + ``condition``: no trace is built.
    """

    def __init__(self, plate: str, indices: Tensor, values: Mapping[str, Tensor], plate_scale: float) -> None:
        super().__init__(plate, indices)
        self.values, self.plate_scale = values, plate_scale
        self.total: Tensor | float = 0.0

    def _process_message(self, msg: Any) -> None:
        if msg["type"] != "sample":
            return
        if isinstance(msg["fn"], _Subsample):
            super()._process_message(msg)
            return
        if not msg["is_observed"]:
            if msg["name"] not in self.values:
                raise ValueError(f"latent site {msg['name']!r} has no value (it appeared after setup?)")
            msg["value"] = self.values[msg["name"]]
        log_p = msg["fn"].log_prob(msg["value"])
        frame = site_plate_frame(msg, self.plate)
        term = scale_and_mask(log_p, section_scale(msg, frame), msg["mask"]).sum()
        self.total = self.total + (term if frame is None else term * self.plate_scale)


def _log_ratio(new: float, current: float) -> float:
    """``new - current``, except that any proposal is accepted from a zero-density state."""
    if current == -math.inf and not math.isnan(new):
        return 0.0 if new > -math.inf else -math.inf
    return new - current


def _in_plate(site: Mapping[str, Any], plate: str) -> bool:
    return plate_dim(site, plate) is not None  # type: ignore[arg-type]


def _is_latent(site: Mapping[str, Any]) -> bool:
    return site["type"] == "sample" and not site["is_observed"] and not isinstance(site["fn"], _Subsample)


class LWAKernel(MCMCKernel):
    """Informed sub-sampling MCMC on ``(θ, U)`` for the global sites of a Pyro model.

    The exact target and the two subset updates are stated in the module docstring.
    ``θ`` (the ``sites``) lives in the unconstrained space given by ``.transforms`` (as
    in Pyro's HMC, ``None`` until ``setup``), so constrained sites such as scales work; ``U`` is kernel state.

    Args:
        model: a Pyro model whose likelihood sits in a ``pyro.plate`` over the data and
            indexes the data by the plate's indices.
        subset_size: ``n``, the number of data points in ``U``.
        sites: global latent sites updated (default: all latent sites outside the data plate, except
            those fixed by :meth:`condition_on` before ``setup``).
        plate: name of the data plate (default: the plate shared by the observed sites).
        epsilon: bandwidth ``ε`` of the Gaussian subset weight (``inf``: uniform subsets).
        summaries: ``"default"`` (see :func:`~neuralblock.kernels.summaries.default_summaries`)
            or a callable ``fn(data rows of U) -> Tensor [k]``.
        subset: ``"iid"`` (arbitrary subsets) or ``"window"`` (contiguous windows).
        omega: probability that the subset proposal is a local move.
        lam: size of a local move as a fraction of ``n``.
        step_size: initial random-walk step size in the unconstrained space (default 0.1).
        adapt_step_size: adapt during warmup: the step size (Robbins-Monro toward ``target_accept``)
            and, for warmups of 40 steps or more, per-coordinate scales (sds of warmup's third quarter).
        target_accept: warmup target for the ``θ`` acceptance rate.
        subset_update: ``"informed"`` (the paper's algorithm) or ``"joint"`` (exact for the joint target).
        subset_steps: MH updates of ``U`` per transition (cheap in ``"informed"`` mode: a summary of ``U'``
            each, no model run), which helps ``U`` mix when ``ε`` is small.
        subset_tries: ``K``, candidates of a remote jump (multiple-try Metropolis, see the module
            docstring; ``"informed"`` mode only). ``1`` (default) is the plain uniform jump. A remote
            jump then costs ``2K - 1`` subset summaries (one batched call), ``O(K n)``.
        summary_data: rows summarised, ``[N, ...]`` (default: the observed values of the
            plate's sites, columns concatenated).
        direct: evaluate the model on ``U`` through the direct likelihood path
            (:class:`~neuralblock.pyro.likelihood.LogLikelihood`: traced once, replayed as a tensor
            graph without a Pyro run per call); a model it cannot compile falls back to Pyro runs, with a
            warning. ``False`` always runs the model.

    Example:
        >>> import pyro, pyro.distributions as dist
        >>> y = torch.randn(200)
        >>> def model(y):
        ...     s = pyro.sample("s", dist.HalfNormal(2.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("obs", dist.Normal(0.0, s), obs=y[idx])
        >>> kernel = LWAKernel(model, subset_size=20)
        >>> kernel.setup(0, y)
        >>> params = kernel.sample(kernel.initial_params)
        >>> bool(kernel.transforms["s"].inv(params["s"]) > 0)
        True
    """

    _evals: int  # post-warmup model evaluations (set by _reset_stats)

    def __init__(
        self,
        model: Callable,
        subset_size: int,
        sites: list[str] | None = None,
        plate: str | None = None,
        epsilon: float = 1e-2,
        summaries: str | SummaryFn = "default",
        subset: str = "iid",
        omega: float = 0.9,
        lam: float = 0.1,
        step_size: float | None = None,
        adapt_step_size: bool = True,
        target_accept: float = 0.234,
        subset_update: str = "informed",
        summary_data: Tensor | None = None,
        subset_steps: int = 1,
        subset_tries: int = 1,
        direct: bool = True,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be a Pyro model callable, got {type(model).__name__}")
        # (int listed for the type checker, which does not know int is a numbers.Integral)
        if isinstance(subset_size, bool) or not isinstance(subset_size, int | numbers.Integral) or subset_size < 1:
            raise ValueError(f"subset_size must be a positive int, got {subset_size!r}")
        subset_size = int(subset_size)  # e.g. a NumPy integer
        if isinstance(epsilon, bool) or not (isinstance(epsilon, int | float) and epsilon > 0):
            raise ValueError(f"epsilon must be a positive number (inf for uniform subsets), got {epsilon!r}")
        if not (isinstance(summaries, str) and summaries == "default") and not callable(summaries):
            raise TypeError(f"summaries must be 'default' or a callable, got {summaries!r}")
        if subset not in SUBSET_KINDS:
            raise ValueError(f"subset must be one of {SUBSET_KINDS}, got {subset!r}")
        if subset_update not in SUBSET_UPDATES:
            raise ValueError(f"subset_update must be one of {SUBSET_UPDATES}, got {subset_update!r}")
        if not 0.0 <= omega <= 1.0:
            raise ValueError(f"omega must be a probability in [0, 1], got {omega!r}")
        if not 0.0 < lam <= 1.0:
            raise ValueError(f"lam must be in (0, 1], got {lam!r}")
        if isinstance(subset_steps, bool) or not isinstance(subset_steps, int) or subset_steps < 1:
            raise ValueError(f"subset_steps must be a positive int, got {subset_steps!r}")
        if isinstance(subset_tries, bool) or not isinstance(subset_tries, int) or subset_tries < 1:
            raise ValueError(f"subset_tries must be a positive int, got {subset_tries!r}")
        if subset_tries > 1 and subset_update != "informed":
            raise ValueError("subset_tries > 1 (multiple-try remote jumps) needs subset_update='informed'")
        if step_size is not None and not step_size > 0:
            raise ValueError(f"step_size must be positive, got {step_size!r}")
        if sites is not None and (isinstance(sites, str) or not all(isinstance(s, str) for s in sites)):
            raise TypeError(f"sites must be a list of site names, got {sites!r}")
        self.model = model
        self.subset_size = subset_size
        self._sites_arg = list(sites) if sites is not None else None
        self._plate_arg = plate
        self.epsilon = float(epsilon)
        self._summaries_arg = summaries
        self.subset = subset
        self.omega, self.lam = float(omega), float(lam)
        self.initial_step_size = 0.1 if step_size is None else float(step_size)
        self.adapt_step_size = adapt_step_size
        self.target_accept = target_accept
        self.subset_update = subset_update
        self.subset_steps = subset_steps
        self.subset_tries = subset_tries
        self._summary_data_arg = summary_data
        self.direct = bool(direct)
        self._direct: LogLikelihood | None = None
        self.transforms: dict[str, Any] | None = None  # set by setup (None tells Pyro's MCMC to run one)
        self._conditioned: dict[str, Tensor] = {}
        self._others: list[str] | None = None  # the model's other latent sites, known after setup
        self._init_arg: dict[str, Tensor] | None = None
        self._initial_params: dict[str, Tensor] | None = None
        self._cache: tuple[dict[str, Tensor], float] | None = None
        self._warmup_steps = 0
        self._t = 0
        self.num_data = 0
        self._reset_stats()

    # -- setup ------------------------------------------------------------------------
    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Find the sites and the data plate, summarise the full data (once), draw ``U`` and ``θ``."""
        self._args, self._kwargs = args, kwargs
        self._warmup_steps = int(warmup_steps)
        self._t = 0
        trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        self._find_plate(trace)
        self._find_sites(trace)
        self._direct = self._compile() if self.direct else None
        self.layout = FlatLayout.from_trace(trace, self.sites)
        self.transforms = self.layout.transforms
        self._summary_fn: SummaryFn = (
            default_summaries(self.subset) if isinstance(self._summaries_arg, str) else self._summaries_arg
        )
        self._data = self._summary_rows(trace)
        self._full_summary = torch.as_tensor(self._summary_fn(self._data)).reshape(-1)
        if not bool(torch.isfinite(self._full_summary).all()):
            raise ValueError(f"the full-data summary statistics are not finite: {self._full_summary.tolist()}")
        self._draw_subset()
        others = self._others
        assert others is not None  # set by _find_sites
        # a traced sample site holds its value (Pyro types it Optional)
        self._base = {k: cast(Tensor, trace.nodes[k]["value"]).detach() for k in others}
        self._base.update({k: v for k, v in self._conditioned.items() if k in others})
        self._initial_params = self._prior_init(trace) if self._init_arg is None else self._given_init(self._init_arg)
        self._init_arg = None  # set values start the next chain only (Pyro's MCMC sets them before each chain)
        self._cache = None
        self._reset_stats()

    def _draw_subset(self, tries: int = 100) -> None:
        """A uniform start ``U`` with a finite ``log ν`` (up to ``tries`` draws)."""
        n, num = self.subset_size, self.num_data
        for _ in range(tries):
            if self.subset == "window":
                start = int(torch.randint(0, num - n + 1, ()))
                self._indices = torch.arange(start, start + n)
            else:
                self._indices = draw_distinct(num, n)
            self._log_nu = float(self._log_weight(self._indices))
            if math.isfinite(self._log_nu):
                return
        raise ValueError(
            f"the subset weight log ν(U) was not finite for {tries} uniform subsets (last {self._log_nu}): "
            "the summary statistics of subsets of the data are NaN or infinite; check `summaries`"
        )

    def _given_init(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The set ``initial_params`` (used at every ``setup``) as fresh values of ``sites``, density-checked.

        The full-data log density is checked once (O(N), at setup only): a start of zero or NaN
        density would never move (every MH ratio from it is undefined).

        Raises:
            ValueError: sites are missing or hold NaN or inf values, or the start has zero or NaN
                density (the message names the sites).
        """
        missing = sorted(set(self.sites) - set(params))
        if missing:
            raise ValueError(f"initial_params lack sites {missing}")
        init = {k: params[k].detach().clone() for k in self.sites}
        bad = [k for k in self.sites if not bool(torch.isfinite(init[k]).all())]
        if bad:
            raise ValueError(
                f"initial_params: sites {bad} hold NaN or inf values; give every site a finite unconstrained value"
            )
        evals = self._evals
        try:
            log_p = self.log_target(init, torch.arange(self.num_data))
        except (ValueError, RuntimeError):
            log_p = math.nan
        self._evals = evals  # a setup check, not a model evaluation of the run
        if not math.isfinite(log_p):
            kind = "a NaN log density" if math.isnan(log_p) else "zero density"
            raise ValueError(f"initial_params have {kind}: {self._describe_start(init)}; start inside its support")
        return init

    def _describe_start(self, params: Mapping[str, Tensor]) -> str:
        """Name the sites whose log density is not finite at unconstrained ``params`` (one unvalidated full run)."""
        values = dict(self._base)
        values.update(self.layout.constrain_params(params)[0])
        shown = ", ".join(
            f"{k}={float(values[k]):g}" if values[k].numel() == 1 else f"{k}={values[k].flatten()[:4].tolist()}"
            for k in self.sites
        )
        bad: list[str] = []
        try:
            with pyro.validation_enabled(False):
                trace = poutine.trace(poutine.condition(self.model, data=values)).get_trace(*self._args, **self._kwargs)
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or isinstance(site["fn"], _Subsample):
                    continue
                fn, value = cast(TorchDistribution, site["fn"]), site["value"]  # a sample site's distribution
                assert value is not None  # a traced sample site holds its value
                if not bool(torch.isfinite(fn.log_prob(value).sum())):
                    bad.append(name)
        except (ValueError, RuntimeError) as err:
            return f"the model fails at ({shown}): {err}"
        return f"sites {bad} at ({shown})" if bad else f"the log-Jacobian at ({shown})"

    def _prior_init(self, trace: Any, tries: int = 100) -> dict[str, Tensor]:
        """Unconstrained prior draw of ``sites`` with a finite target on ``U`` (up to ``tries`` draws)."""
        for _ in range(tries):
            init = self.layout.unconstrain({k: trace.nodes[k]["value"].detach() for k in self.sites})
            if math.isfinite(self.log_target(init, self._indices)):
                return init
            with PlateIndices(self.plate, self._indices):
                trace = poutine.trace(poutine.condition(self.model, data=self._base)).get_trace(
                    *self._args, **self._kwargs
                )
        raise ValueError(f"no prior draw in {tries} gave a finite log density; set initial_params")

    def _find_plate(self, trace: Any) -> None:
        plate = find_data_plate(trace, self._plate_arg, shared=True, owner="LWAKernel")
        assert plate.dim is not None  # shared=True: the plate holds the observed sites, so it has their dim
        self.plate, self.num_data, self._plate_dim = plate.name, plate.size, plate.dim
        if self.subset_size > self.num_data:
            raise ValueError(f"subset_size {self.subset_size} exceeds the {self.num_data} data points")

    def _find_sites(self, trace: Any) -> None:
        local = [k for k, s in trace.nodes.items() if _is_latent(s) and _in_plate(s, self.plate)]
        if local:
            raise ValueError(f"LWAKernel supports global latent sites only; {local} are inside plate {self.plate!r}")
        latent = [k for k, s in trace.nodes.items() if _is_latent(s)]
        if self._sites_arg is None:
            sites = [k for k in latent if k not in self._conditioned]
        else:
            bad = [s for s in self._sites_arg if s not in latent]
            if bad:
                raise ValueError(f"sites {bad} are not global latent sites of the model (found {latent})")
            sites = self._sites_arg
        if not sites:
            raise ValueError("LWAKernel found no global latent site to update")
        discrete = [k for k in sites if trace.nodes[k]["fn"].support.is_discrete]
        if discrete:
            raise ValueError(f"LWAKernel updates continuous sites only; {discrete} are discrete")
        self.sites = list(sites)
        self._others = [k for k in latent if k not in self.sites]
        unknown = sorted(set(self._conditioned) - set(self._others))
        if unknown:
            raise ValueError(f"condition_on got {unknown}, which are not latent sites outside `sites` ({self._others})")

    def _summary_rows(self, trace: Any) -> Tensor:
        num = self.num_data
        if self._summary_data_arg is not None:
            data = torch.as_tensor(self._summary_data_arg)
            if data.dim() == 0 or data.shape[0] != num:
                raise ValueError(f"summary_data must have {num} rows, got shape {tuple(data.shape)}")
            return data
        columns = []
        for site in trace.nodes.values():
            if site["type"] == "sample" and site["is_observed"] and _in_plate(site, self.plate):
                value = torch.as_tensor(site["value"])
                dim = value.dim() + self._plate_dim - len(site["fn"].event_shape)
                columns.append(value.movedim(dim, 0).reshape(num, -1))
        data = torch.cat(columns, 1)
        return data[:, 0] if data.shape[1] == 1 else data

    def _log_weight(self, indices: Tensor) -> Tensor:
        summary = torch.as_tensor(self._summary_fn(self._data[indices]))
        return subset_log_weight(summary, self._full_summary, self.epsilon)

    def _reset_stats(self) -> None:
        """Fresh adaptation state (step size, per-coordinate scales) and counters."""
        self.adapter = StepSizeAdapter(1, self.initial_step_size, self.target_accept)
        self._scale: dict[str, Tensor] = {}
        self._moments: dict[str, list[Tensor]] = {}
        self._theta_proposed = self._theta_accepted = 0
        self._subset_proposed = self._subset_accepted = 0
        self._changed = 0
        self._remote_proposed = self._remote_accepted = 0
        self._nonfinite = 0
        self._renewal_warned = False
        self._renewals = 0
        self._anchor: Tensor | None = None
        self._evals = 0
        self._elapsed = 0.0
        self._recent = (0.0, 0.0)  # (running θ acceptance rate of the phase, latest refreshed fraction of U)
        self._phase = (0, 0)  # θ moves accepted and proposed in this phase (warmup or sampling)

    # -- the Pyro-facing surface --------------------------------------------------------
    @property
    def initial_params(self) -> dict[str, Tensor]:
        """Unconstrained initial values of ``sites``: those set before this ``setup`` (or since), else a prior draw."""
        if self._initial_params is None:
            raise RuntimeError("call setup() before reading initial_params")
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: dict[str, Tensor]) -> None:
        self._init_arg = {k: torch.as_tensor(v) for k, v in params.items()}
        if self._initial_params is not None:  # already set up: apply now too
            self._initial_params = self._given_init(self._init_arg)
            self._cache = None

    @property
    def indices(self) -> Tensor:
        """The current subset ``U`` (data indices)."""
        return self._indices

    def condition_on(self, values: Mapping[str, Tensor]) -> None:
        """Fix the model's other latent sites (not in ``sites``) for subsequent ``sample`` calls.

        This is the hook of a compound sampler: after another kernel updates those sites, it
        passes their new (constrained) values here, and the next ``θ``/``U`` updates target the
        conditional ``p(θ | others) f(Y_U | θ, others)^{N/n}``. Values persist until replaced.

        Args:
            values: site name -> constrained value.

        Raises:
            ValueError: a name is in ``sites`` or is not a latent site of the model (checked at
                ``setup`` when called before it).
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"condition_on takes a dict of site values, got {type(values).__name__}")
        clash = sorted(set(values) & set(getattr(self, "sites", []) or self._sites_arg or []))
        if clash:
            raise ValueError(f"condition_on cannot fix sites this kernel updates: {clash}")
        if self._others is not None:
            unknown = sorted(set(values) - set(self._others))
            if unknown:
                raise ValueError(f"condition_on got {unknown}, not latent sites outside `sites` ({self._others})")
            self._base.update({k: torch.as_tensor(v) for k, v in values.items()})
        self._conditioned.update({k: torch.as_tensor(v) for k, v in values.items()})
        self._cache = None

    def reset_conditioning(self) -> None:
        """Forget the values fixed by :meth:`condition_on` (before a ``setup`` whose model may have other sites)."""
        self._conditioned = {}
        self._others = None

    # -- densities --------------------------------------------------------------------------
    def log_target(self, params: Mapping[str, Tensor], indices: Tensor) -> float:
        """``log p(θ, others) + (N/n) log f(Y_U | θ, others) + log|J|`` at unconstrained ``params``.

        Args:
            params: unconstrained values of ``sites``.
            indices: the subset ``U``.

        Raises:
            RuntimeError: before ``setup``.
        """
        if self.transforms is None:
            raise RuntimeError("call setup() before evaluating the log target")
        values = dict(self._base)
        constrained, log_jac = self.layout.constrain_params(params)
        values.update(constrained)
        scale = self.num_data / indices.numel()
        density: Tensor | float
        if self._direct is not None:
            terms = self._direct.terms({k: v.unsqueeze(0) for k, v in values.items()}, indices, with_global=True)
            density = terms.global_term[0] + scale * terms.sections[0].sum()
        else:
            density = self._pyro_log_density(values, indices, scale)
        self._evals += int(self._t >= self._warmup_steps)  # a post-warmup count, as the other diagnostics
        return float(log_jac + density)

    def _pyro_log_density(self, values: Mapping[str, Tensor], indices: Tensor, scale: float) -> Tensor | float:
        """The log density of one model run on ``indices`` (the path for models the direct path cannot compile)."""
        density = _SubsetLogDensity(self.plate, indices, values, scale)
        with density, pyro.validation_enabled(False):
            self.model(*self._args, **self._kwargs)
        return density.total

    def _compile(self) -> LogLikelihood | None:
        """The model's direct likelihood path over the data plate, or ``None`` (with a warning) if it cannot compile."""
        reason = None
        try:
            with warnings.catch_warnings():  # the evaluator's own warnings: this method gives one, with the reason
                warnings.simplefilter("ignore")
                assert self._others is not None  # set by _find_sites, before this
                compiled = LogLikelihood(
                    self.model, *self._args, plate=self.plate, sites=self.sites + self._others, **self._kwargs
                )
        except (CompileError, ValueError) as err:
            reason = str(err)
        else:
            if not compiled.evaluator.lazy or compiled.evaluator.direct.plain:
                # a run on U differs from the full run's terms at U (e.g. a time-series window's conditional
                # likelihood restarted at its first index): U's density is the model run on U itself
                reason = "the terms of a run on a subset differ from those of the full run"
        if reason is None:
            return compiled
        warnings.warn(
            f"LWAKernel: the model cannot be compiled to the direct likelihood path ({reason}); "
            "falling back to one Pyro run per density evaluation (slower)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None

    def _current_log_target(self, params: dict[str, Tensor]) -> float:
        if self._cache is not None:
            cached, value = self._cache
            if all(torch.equal(cached[k], params[k]) for k in self.sites):
                return value
        value = self.log_target(params, self._indices)
        self._cache = (params, value)
        return value

    # -- the transition -------------------------------------------------------------------
    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """One transition: an MH update of ``U``, then a random-walk MH update of ``θ`` given ``U``."""
        if self.transforms is None:
            raise RuntimeError("call setup() before sample()")
        missing = [k for k in self.sites if k not in params]
        if missing:
            raise ValueError(f"params lack sites {missing}")
        warmup = self._t < self._warmup_steps
        start = time.perf_counter()
        theta = {k: params[k] for k in self.sites}
        subset_acc, changed, nonfinite = 0, 0, 0
        for _ in range(self.subset_steps):
            acc, num, bad = self._subset_step(theta)
            subset_acc, changed, nonfinite = subset_acc + acc, changed + num, nonfinite + bad
        theta, theta_prob, theta_acc, bad = self._theta_step(theta)
        nonfinite += bad
        if warmup and self.adapt_step_size:
            self.adapter.update(torch.tensor([0]), torch.tensor([theta_prob]))
            self._adapt_scale(theta)
        if self._t == self._warmup_steps:  # the progress bar's running rate restarts with sampling
            self._phase = (0, 0)
        self._phase = (self._phase[0] + int(theta_acc), self._phase[1] + 1)
        self._recent = (self._phase[0] / self._phase[1], changed / self.subset_size)
        if not warmup:
            self._elapsed += time.perf_counter() - start
            self._theta_proposed += 1
            self._theta_accepted += int(theta_acc)
            self._subset_proposed += self.subset_steps
            self._subset_accepted += int(subset_acc)
            self._changed += changed
            self._nonfinite += nonfinite
            if changed or self._anchor is None:
                self._count_renewal()
        self._t += 1
        out = dict(params)
        out.update(theta)
        return out

    def _subset_step(self, theta: dict[str, Tensor]) -> tuple[bool, int, int]:
        if self.subset_size == self.num_data:  # U is all the data: nothing to move
            return False, 0, 0
        if self.subset_tries > 1 and bool(torch.rand(()) >= self.omega):
            return self._multiple_try_jump()
        omega = 1.0 if self.subset_tries > 1 else self.omega  # the remote branch was drawn above
        prop = propose_subset(self._indices, self.num_data, self.subset, omega, self.lam)
        if not prop.valid:
            return False, 0, 0
        log_nu = float(self._log_weight(prop.indices))
        log_alpha = log_nu - self._log_nu
        new_target = None
        if self.subset_update == "joint":
            new_target = self.log_target(theta, prop.indices)
            log_alpha = log_alpha + _log_ratio(new_target, self._current_log_target(theta))
        info = mh_accept(torch.tensor([log_alpha], dtype=torch.float64))
        if prop.remote:
            self._count_remote(bool(info.accepted[0]))
        nonfinite = int(info.num_nonfinite)  # an int already (mh_accept)
        if not bool(info.accepted[0]):
            return False, 0, nonfinite
        self._indices, self._log_nu = prop.indices, log_nu
        self._cache = (theta, new_target) if new_target is not None else None
        return True, prop.num_changed, nonfinite

    def _count_remote(self, accepted: bool) -> None:
        """Post-warmup count of one remote jump's outcome."""
        if self._t >= self._warmup_steps:
            self._remote_proposed += 1
            self._remote_accepted += int(accepted)

    def _multiple_try_jump(self) -> tuple[bool, int, int]:
        """A remote jump by multiple-try Metropolis over ``subset_tries`` uniform candidates (informed mode)."""
        k = self.subset_tries
        drawn = uniform_subsets(self.num_data, self.subset_size, self.subset, 2 * k - 1)
        summaries = summarise_batch(self._summary_fn, self._data[drawn])
        log_w = subset_log_weight(summaries, self._full_summary, self.epsilon).to(torch.float64)
        candidates, references = log_w[:k], log_w[k:]
        info = mh_accept(multiple_try_log_alpha(candidates, references, self._log_nu).reshape(1))
        self._count_remote(bool(info.accepted[0]))
        if not bool(info.accepted[0]):
            return False, 0, int(info.num_nonfinite)  # an int already (mh_accept)
        pick = int(torch.distributions.Categorical(logits=candidates).sample())
        new = drawn[pick]
        changed = self.subset_size - int(torch.isin(new, self._indices).sum())
        self._indices, self._log_nu = new, float(candidates[pick])
        self._cache = None
        return True, changed, 0

    def _adapt_scale(self, theta: dict[str, Tensor]) -> None:
        """Diagonal preconditioning: per-coordinate scales from the draws of warmup's third quarter.

        Draws ``t in [W/2, 3W/4)`` are accumulated; at ``t = 3W/4`` each coordinate's step scale becomes
        its sample sd and the step size restarts at ``2.38 / sqrt(d)`` (warmups shorter than 40 skip this).
        """
        lo, hi = self._warmup_steps // 2, 3 * self._warmup_steps // 4
        if self._warmup_steps < 40 or not lo <= self._t < hi:
            return
        for k, v in theta.items():
            acc = self._moments.setdefault(k, [torch.zeros_like(v), torch.zeros_like(v)])
            acc[0] += v
            acc[1] += v * v
        if self._t == hi - 1:
            count = hi - lo
            sds = {k: (m2 / count - (m1 / count) ** 2).clamp_min(0).sqrt() for k, (m1, m2) in self._moments.items()}
            if all(bool((sd > 0).all()) for sd in sds.values()):
                dim = sum(v.numel() for v in theta.values())
                self._scale = sds
                self.adapter = StepSizeAdapter(1, 2.38 / math.sqrt(dim), self.target_accept)

    def _theta_step(self, theta: dict[str, Tensor]) -> tuple[dict[str, Tensor], float, bool, int]:
        current = self._current_log_target(theta)
        step = float(self.adapter.step_size[0])
        proposal = {k: v + step * self._scale.get(k, 1.0) * torch.randn_like(v) for k, v in theta.items()}
        new = self.log_target(proposal, self._indices)
        info = mh_accept(torch.tensor([_log_ratio(new, current)], dtype=torch.float64))
        accepted = bool(info.accepted[0])
        if accepted:
            self._cache = (proposal, new)
            theta = proposal
        return theta, float(info.accept_prob[0]), accepted, int(info.num_nonfinite)  # an int already (mh_accept)

    def _count_renewal(self) -> None:
        """Count a renewal when ``U`` shares under half its points with ``U`` at the last renewal (post-warmup).

        Replaced points alone overstate it: a window shifting back and forth replaces many points while
        it stays in one stretch of the series.
        """
        if self._anchor is None:
            self._anchor = self._indices
            return
        if int(torch.isin(self._indices, self._anchor).sum()) * 2 < self.subset_size:
            self._renewals += 1
            self._anchor = self._indices

    # -- reporting --------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Warn at the end of a run whose subset ``U`` was renewed fewer than ``MIN_SUBSET_RENEWALS`` times.

        A renewal is a ``U`` sharing under half its points with ``U`` at the previous renewal. With few of
        them the ``θ``-draws come from the sub-posteriors of a handful of subsets, each centred about
        ``√(N/n)`` full-posterior sds from the full posterior's centre, so the mean can be many posterior
        sds off (and the sd too small).
        """
        if self._theta_proposed < 100 or self.subset_size == self.num_data or self._renewal_warned:
            return
        renewals = self._renewals
        if renewals < MIN_SUBSET_RENEWALS:
            self._renewal_warned = True  # Pyro's MCMC calls cleanup() twice per run
            warnings.warn(
                f"LWAKernel: the subset U was renewed (under half of it kept) only {renewals} times in "
                f"{self._theta_proposed} iterations; the draws of theta reflect a few subsets and their mean can "
                "be many posterior sds off. Raise epsilon, "
                "subset_tries (remote jumps) or subset_steps, or run longer",
                RuntimeWarning,
                stacklevel=2,
            )

    def logging(self) -> dict[str, float]:
        """The phase's (warmup or sampling) running ``θ`` acceptance rate and the latest fraction of ``U`` refreshed."""
        return {"acc": round(self._recent[0], 3), "refresh": round(self._recent[1], 3)}

    def diagnostics(self) -> KernelDiagnostics:
        """Post-warmup rates: ``θ`` (``acceptance_rate``) and ``U`` acceptance, subset refresh rate, cost counters.

        ``divergences`` is an empty list (MH has no divergent transitions): ``arviz.from_pyro`` reads it.

        ``subset_refresh_rate`` is the mean fraction of ``U``'s points replaced per iteration (summed over
        the ``subset_steps`` updates of ``U``, so it can exceed 1 when several jumps are accepted);
        ``subset_renewals`` counts the times ``U`` came to share under half its points with ``U`` at the
        previous renewal. ``transitions_per_second`` counts transitions (one ``θ`` update each, after
        ``subset_steps`` updates of ``U``).
        """
        its = max(self._theta_proposed, 1)
        return {
            "data_fraction": self.subset_size / self.num_data if self.num_data else 0.0,
            "nonfinite_rejections": float(self._nonfinite),
            "step_size": float(self.adapter.step_size[0]),
            "subset_acceptance_rate": self._subset_accepted / max(self._subset_proposed, 1),
            "subset_refresh_rate": self._changed / (its * self.subset_size),
            "subset_renewals": float(self._renewals),
            "remote_jumps_accepted": float(self._remote_accepted),
            "remote_acceptance_rate": self._remote_accepted / max(self._remote_proposed, 1),
            "acceptance_rate": self._theta_accepted / its,
            "model_evals": float(self._evals),
            "transitions_per_second": per_second(self._theta_proposed, self._elapsed),
            "divergences": [],
        }
