"""Coresets for ordinary Pyro models: per-datum log-likelihoods, ``pi_hat`` samplers, the weighted model.

The model must draw its data inside a named plate and index the data with the plate's indices::

    def model(x, y):
        beta = pyro.sample("beta", dist.Normal(torch.zeros(d), 1.0).to_event(1))
        with pyro.plate("data", len(y)) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ beta), obs=y[idx])

A plate's index set is its ``_Subsample`` sample site (named after the plate); :class:`PlateIndices`
injects chosen indices there, so the model runs on a chunk or a coreset without being rewritten, and
optionally multiplies each datum's log-likelihood by a weight. Latent sites outside the plate are
the global parameters ``theta``; observed sites inside it are the per-datum likelihood terms.

This is the Pyro glue of :mod:`neuralblock.coresets` (whose core needs only torch); that package
re-exports these names on first access, and ``neuralblock.coresets.pyro_model`` is kept as an alias.

Example:
    >>> import pyro, pyro.distributions as dist, torch
    >>> y = torch.tensor([0.5, -1.0, 2.0])
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)) as idx:
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> core = Coreset(torch.tensor([0, 2]), torch.tensor([2.0, 1.0]))
    >>> trace = pyro.poutine.trace(weighted_model(model, core)).get_trace(y)
    >>> mu = trace.nodes["mu"]["value"]
    >>> expected = dist.Normal(0.0, 10.0).log_prob(mu) + (
    ...     torch.tensor([2.0, 1.0]) * dist.Normal(mu, 1.0).log_prob(y[[0, 2]])).sum()
    >>> torch.allclose(trace.log_prob_sum(), expected)
    True
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pyro
import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.distributions.util import scale_and_mask
from pyro.infer.mcmc.util import initialize_model
from pyro.poutine.runtime import Message
from torch import Tensor

from neuralblock.coresets.solvers import Coreset, check_size
from neuralblock.pyro.log_prob import site_log_prob
from neuralblock.pyro.plates import PlateIndices, _Subsample
from neuralblock.pyro.plates import plate_dim as _plate_dim

__all__ = [
    "ModelLogLikelihood",
    "PlateIndices",
    "WeightedModel",
    "laplace_samples",
    "prior_samples",
    "subsample_mcmc_samples",
    "weighted_model",
]


def _split_flat(x: Tensor, shapes: Mapping[str, torch.Size]) -> dict[str, Tensor]:
    """``[..., D]`` -> ``{name: [..., *shape]}`` in the order of ``shapes``."""
    chunks = torch.split(x, [math.prod(shape) for shape in shapes.values()], dim=-1)
    return {name: c.reshape(x.shape[:-1] + shape) for (name, shape), c in zip(shapes.items(), chunks)}


def _require_plate(found: int | None, plate: str) -> int:
    if found is None:
        raise ValueError(f"the model has no plate named {plate!r} (or never entered it)")
    return found


class ModelLogLikelihood:
    """Per-datum log-likelihoods of a Pyro model as a function of flat global parameters.

    Traces the model once (on one datum) to find the global latent sites, their shapes, the plate
    size ``N`` and the observed sites in the data plate. Calling it with ``theta [D]`` and indices
    ``[m]`` re-runs the model conditioned on ``theta`` with the plate on those indices and returns the
    unscaled ``[m]`` per-datum log-likelihoods (summed over the observed sites in the plate). It is a
    :data:`~neuralblock.coresets.projection.LogLikelihood` and picklable when the model is.

    Args:
        model: the Pyro model.
        plate: name of its data plate.
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.

    Raises:
        ValueError: no such plate, no observed site in it, or a latent site inside it.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=y[idx])
        >>> ll = ModelLogLikelihood(model, "data", (torch.zeros(5, 2),))
        >>> ll.site_shapes, ll.num_data, ll(torch.zeros(2), torch.tensor([0, 1])).shape
        ({'mu': torch.Size([2])}, 5, torch.Size([2]))
    """

    def __init__(
        self,
        model: Callable[..., Any],
        plate: str = "data",
        model_args: Sequence[Any] = (),
        model_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        self.model = model
        self.plate = plate
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        with PlateIndices(plate, torch.tensor([0])) as inject:
            trace = poutine.trace(model).get_trace(*self.model_args, **self.model_kwargs)
        self.num_data = _require_plate(inject.size, plate)
        self.site_shapes: dict[str, torch.Size] = {}
        self.obs_sites: list[str] = []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or isinstance(site["fn"], _Subsample):
                continue
            in_plate = _plate_dim(site, plate) is not None
            if in_plate and not site["is_observed"]:
                raise ValueError(
                    f"latent site {name!r} is inside the data plate {plate!r}; coresets need "
                    "the likelihood to factorise over data given global parameters"
                )
            if in_plate:
                self.obs_sites.append(name)
            elif not site["is_observed"]:
                value = site["value"]
                assert value is not None  # a traced sample site holds its value
                self.site_shapes[name] = value.shape
        if not self.obs_sites:
            raise ValueError(f"no observed site inside the data plate {plate!r}")
        for name in self.obs_sites:  # the model must index its data by the plate's indices
            self._per_datum(trace.nodes[name], 1)
        if not self.site_shapes:
            raise ValueError("the model has no global latent site to weight the likelihood over")

    @property
    def dim(self) -> int:
        """Flat parameter dimension ``D``."""
        return sum(math.prod(shape) for shape in self.site_shapes.values())

    def flatten(self, samples: Mapping[str, Tensor]) -> Tensor:
        """``{site: [J, *shape]}`` -> ``[J, D]`` (sites in model order).

        Raises:
            ValueError: a site is missing, or shapes/numbers of draws disagree.
        """
        if not isinstance(samples, Mapping):
            raise TypeError(f"samples must be a dict site -> tensor [J, *shape], got {type(samples).__name__}")
        missing = [name for name in self.site_shapes if name not in samples]
        if missing:
            raise ValueError(f"samples lack the global latent site(s) {missing}; expected {list(self.site_shapes)}")
        parts, num = [], None
        for name, shape in self.site_shapes.items():
            value = torch.as_tensor(samples[name])
            if value.shape[1:] != shape:
                raise ValueError(f"samples[{name!r}] has shape {tuple(value.shape)}; expected (J, *{tuple(shape)})")
            if num is not None and value.shape[0] != num:
                raise ValueError(f"samples[{name!r}] has {value.shape[0]} draws, other sites have {num}")
            num = value.shape[0]
            parts.append(value.reshape(num, -1))
        return torch.cat(parts, dim=1)

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """``[..., D]`` -> ``{site: [..., *shape]}``."""
        return _split_flat(theta, self.site_shapes)

    def __call__(self, theta: Tensor, indices: Tensor) -> Tensor:
        """Unscaled per-datum log-likelihoods ``[m]`` at flat parameters ``theta [D]``."""
        conditioned = poutine.condition(self.model, data=self.unflatten(theta))
        with pyro.validation_enabled(False), PlateIndices(self.plate, indices):
            trace = poutine.trace(conditioned).get_trace(*self.model_args, **self.model_kwargs)
        first, *rest = (self._per_datum(trace.nodes[name], len(indices)) for name in self.obs_sites)
        return first if not rest else first + sum(rest)  # no copy for the usual single observed site

    def _per_datum(self, site: Message, num: int) -> Tensor:
        """A site's unscaled log-probs summed to one value per plate index: ``[num]``."""
        dim = _plate_dim(site, self.plate)
        if dim is None:
            raise ValueError(f"site {site['name']!r} left plate {self.plate!r} between model runs")
        fn, value = cast(TorchDistribution, site["fn"]), site["value"]  # a sample site's fn is its distribution
        assert value is not None  # a traced sample site holds its value
        log_prob = scale_and_mask(site_log_prob(fn, value), mask=site["mask"])
        if log_prob.dim() < -dim:
            log_prob = log_prob.reshape((1,) * (-dim - log_prob.dim()) + log_prob.shape)
        per_datum = log_prob.movedim(dim, 0)
        if per_datum.dim() > 1:  # event / inner-plate dims: one value per datum
            per_datum = per_datum.reshape(log_prob.shape[dim], -1).sum(1)
        if per_datum.shape[0] == 1 and num != 1:
            per_datum = per_datum.expand(num)
        if per_datum.shape != (num,):
            raise ValueError(
                f"site {site['name']!r} gave {per_datum.shape[0]} log-probs for {num} plate indices; index the "
                f"data with the plate's indices: `with pyro.plate({self.plate!r}, N) as idx: ... obs=y[idx]`"
            )
        return per_datum


def _check_coreset(coreset: Coreset) -> Coreset:
    if not isinstance(coreset, tuple) or len(coreset) != 2:
        raise TypeError(f"coreset must be a Coreset(indices, weights), got {type(coreset).__name__}")
    indices, weights = (torch.as_tensor(t) for t in coreset)
    if indices.dim() != 1 or weights.dim() != 1 or len(indices) != len(weights):
        raise ValueError(
            f"coreset indices {tuple(indices.shape)} and weights {tuple(weights.shape)} must be "
            "1-D tensors of the same length"
        )
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"coreset indices must be integers, got {indices.dtype}")
    if not torch.isfinite(weights).all():
        raise ValueError("coreset weights must be finite")
    if (weights < 0).any():
        raise ValueError("coreset weights must be non-negative")
    if len(indices) and int(indices.min()) < 0:
        raise ValueError(f"coreset indices must be non-negative, got {int(indices.min())}")
    keep = weights > 0
    if not keep.any():
        raise ValueError("the coreset has no positive weight")
    return Coreset(indices[keep].long(), weights[keep])


class WeightedModel:
    """A Pyro model restricted to a coreset, each datum's log-likelihood multiplied by its weight.

    Built by :func:`weighted_model`; same call signature as the wrapped model; picklable when the
    model is (so ``MCMC(..., num_chains=2)`` works).
    """

    def __init__(self, model: Callable[..., Any], coreset: Coreset, plate: str = "data") -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        self.model = model
        self.coreset = _check_coreset(coreset)
        self.plate = plate

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with PlateIndices(self.plate, self.coreset.indices, self.coreset.weights) as inject:
            result = self.model(*args, **kwargs)
        _require_plate(inject.size, self.plate)
        return result

    def potential_fn(self, *args: Any, **kwargs: Any) -> Callable[[dict[str, Tensor]], Tensor]:
        """A Pyro HMC/NUTS ``potential_fn`` of this weighted model through the direct likelihood path.

        The model is traced once (:class:`~neuralblock.pyro.likelihood.LogLikelihood`); each call
        evaluates ``-(log prior + sum_i w_i log p(x_{idx_i} | theta) + log|J|)`` at unconstrained values
        without a Pyro run. It equals the potential Pyro derives from the weighted model.

        Args:
            *args: the model's positional arguments.
            **kwargs: its keyword arguments.

        Raises:
            CompileError: the model cannot be compiled (run ``NUTS(weighted_model(...))`` instead).

        Example:
            >>> import pyro, pyro.distributions as dist, torch
            >>> from pyro.infer import MCMC, NUTS
            >>> y = torch.randn(1000) + 3.0
            >>> def model(y):
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
            ...     with pyro.plate("data", len(y)) as idx:
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
            >>> weighted = weighted_model(model, Coreset(torch.arange(10), torch.full((10,), 100.0)))
            >>> kernel = NUTS(potential_fn=weighted.potential_fn(y))
            >>> mcmc = MCMC(kernel, 20, warmup_steps=20, initial_params={"mu": torch.tensor(3.0)}, disable_progbar=True)
            >>> mcmc.run()
            >>> mcmc.get_samples()["mu"].shape
            torch.Size([20])
        """
        from neuralblock.pyro.likelihood import LogLikelihood

        loglik = LogLikelihood(self.model, *args, plate=self.plate, **kwargs)
        return loglik.weighted_potential_fn(self.coreset.indices, self.coreset.weights)


def weighted_model(model: Callable[..., Any], coreset: Coreset, plate: str = "data") -> WeightedModel:
    """The same Pyro model on a coreset: log density ``prior + sum_i w_i log p(x_{idx_i} | theta)``.

    Any kernel that runs Pyro models runs it: ``NUTS``, ``HMC``, ``RandomWalkKernel`` (pyro),
    our ``AusterityMH`` (which subsamples the coreset plate). The weights enter as a per-datum
    ``poutine``-style scale on every site inside the data plate.

    Args:
        model: the Pyro model (its data plate must index the data, see the module docstring).
        coreset: :class:`~neuralblock.coresets.Coreset` ``(indices, weights)`` (zero weights are dropped).
        plate: name of the data plate.

    Raises:
        ValueError: mismatched/non-1-D indices and weights, non-finite or negative weights; at call time,
            an unknown plate or an index beyond the plate's size.
        TypeError: non-integer indices or a non-callable model.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> from pyro.infer import MCMC, NUTS
        >>> y = torch.randn(1000) + 3.0
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> core = Coreset(torch.arange(10), torch.full((10,), 100.0))
        >>> mcmc = MCMC(NUTS(weighted_model(model, core)), num_samples=20, warmup_steps=20, disable_progbar=True)
        >>> mcmc.run(y)
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([20])
    """
    return WeightedModel(model, coreset, plate)


def _on_indices(model: Callable[..., Any], plate: str, indices: Tensor) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with PlateIndices(plate, indices):
            return model(*args, **kwargs)

    return run


def prior_samples(
    model: Callable[..., Any],
    num_samples: int,
    plate: str = "data",
    model_args: Sequence[Any] = (),
    model_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Tensor]:
    """``pi_hat`` = the prior: ``num_samples`` prior draws of the global latent sites.

    The model runs with its data plate on one datum, so each draw costs O(1) in ``N``.

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> prior_samples(model, 7, model_args=(torch.zeros(100),))["mu"].shape
        torch.Size([7])
    """
    loglik = ModelLogLikelihood(model, plate, model_args, model_kwargs)
    check_size(num_samples, "num_samples")
    run = _on_indices(model, plate, torch.tensor([0]))
    draws: dict[str, list[Tensor]] = {name: [] for name in loglik.site_shapes}
    for _ in range(num_samples):
        trace = poutine.trace(run).get_trace(*loglik.model_args, **loglik.model_kwargs)
        for name in draws:
            value = trace.nodes[name]["value"]
            assert value is not None  # a traced sample site holds its value
            draws[name].append(value.detach())
    return {name: torch.stack(values) for name, values in draws.items()}


def laplace_samples(
    model: Callable[..., Any],
    num_samples: int,
    plate: str = "data",
    model_args: Sequence[Any] = (),
    model_kwargs: Mapping[str, Any] | None = None,
    subsample_size: int | None = None,
    num_steps: int = 50,
) -> dict[str, Tensor]:
    """``pi_hat`` = a Laplace approximation of the posterior (in the unconstrained space).

    Finds the MAP with damped Newton steps, takes the Hessian of the log joint there, and draws from the
    Gaussian (meant for a modest number ``D`` of global parameters: each step costs ``D`` backward passes).
    With ``subsample_size`` the likelihood is a uniform subsample of that size scaled by ``N / n``
    (Pyro's plate scaling), so the cost is independent of ``N``; but that Gaussian is centred about
    ``sqrt(N / n)`` full-posterior sds away from the posterior (more for overdispersed data), and a Fisher-norm
    coreset built on it matches the log-likelihood in the wrong place. On all data each Newton step costs
    ``O(N D^2)``, usually less than the projection, so prefer the default.

    Args:
        model: the Pyro model.
        num_samples: number of draws ``J``.
        plate: name of the data plate.
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.
        subsample_size: optional uniform subsample size (default: all data).
        num_steps: maximal Newton iterations (a warning says when they did not reach the mode).

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> y = torch.randn(200) + 2.0
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> draws = laplace_samples(model, 4000, model_args=(y,))["mu"]
        >>> abs(float(draws.mean() - y.mean())) < 0.02, abs(float(draws.std() * 200 ** 0.5) - 1) < 0.05
        (True, True)
    """
    loglik = ModelLogLikelihood(model, plate, model_args, model_kwargs)
    check_size(num_samples, "num_samples")
    indices = _subsample_indices(loglik.num_data, subsample_size)
    run = _on_indices(model, plate, indices) if indices is not None else model
    init, potential_fn, transforms, _ = initialize_model(run, loglik.model_args, loglik.model_kwargs)
    shapes = {name: init[name].shape for name in loglik.site_shapes}  # unconstrained shapes

    def potential(x: Tensor) -> Tensor:
        return potential_fn(_split_flat(x, shapes))

    mode, chol = _newton_mode(potential, torch.cat([init[name].detach().reshape(-1) for name in shapes]), num_steps)
    noise = torch.randn(num_samples, len(mode), dtype=mode.dtype)
    z = mode + torch.linalg.solve_triangular(chol.T, noise.T, upper=True).T
    out = {}
    for name, chunk in _split_flat(z, shapes).items():
        transform = transforms.get(name)
        out[name] = transform.inv(chunk) if transform is not None else chunk
    return out


def _newton_mode(potential: Callable[[Tensor], Tensor], x: Tensor, num_steps: int) -> tuple[Tensor, Tensor]:
    """Minimise ``potential`` by damped Newton; return the mode and the Cholesky factor of the Hessian there.

    Steps are clipped to a trust radius (max-norm) that doubles after every full accepted step and halves
    when the line search has to backtrack, so a mode far from the initial point (e.g. an intercept of a few
    hundred in a Poisson regression of counts) is reached in ``O(log distance)`` steps. Stops when the Newton
    decrement is below ``1e-6`` (the mode is within ``1e-3`` posterior sds); warns if that takes more than
    ``num_steps``.
    """
    eye = torch.eye(len(x), dtype=x.dtype)

    def safe(point: Tensor) -> Tensor:  # a step into an invalid region is an infinite potential
        try:
            with pyro.validation_enabled(False):
                out = potential(point).detach()
        except (ValueError, RuntimeError):
            return torch.tensor(torch.inf, dtype=x.dtype)
        return out if torch.isfinite(out) else torch.tensor(torch.inf, dtype=x.dtype)

    value = safe(x)
    if not torch.isfinite(value):
        raise ValueError("the log joint is not finite at the initial point of the Laplace approximation")
    radius, converged, previous = 1.0, False, None
    for step in range(num_steps + 1):
        grad, hessian = _gradient_and_hessian(potential, x)
        if not (torch.isfinite(grad).all() and torch.isfinite(hessian).all()):
            # finite log joint but overflowing derivatives (e.g. a rate that underflows): retreat halfway to
            # the last good point, or to the origin of the unconstrained space from the initial point
            if step == num_steps:
                raise ValueError("non-finite gradient or Hessian of the log joint in the Laplace approximation")
            anchor = torch.zeros_like(x) if previous is None else previous
            x, radius = anchor + (x - anchor) / 2, max(radius / 2, 1e-3)
            value = safe(x)
            continue
        hessian = 0.5 * (hessian + hessian.T)
        damping = 0.0
        chol, info = torch.linalg.cholesky_ex(hessian)
        while int(info) != 0 and damping < 1e12:  # not positive definite: Levenberg damping
            damping = max(10 * damping, 1e-6 * float(hessian.diagonal().abs().max().clamp(min=1.0)))
            chol, info = torch.linalg.cholesky_ex(hessian + damping * eye)
        delta = torch.cholesky_solve(-grad[:, None], chol).squeeze(1)
        # Newton decrement -grad . delta: squared distance to the mode in posterior sds (affine invariant, so
        # reachable in float32 where a gradient tolerance relative to a large log joint is not)
        decrement = float(-grad @ delta)
        small = float(grad.abs().max()) < 1e-6 * (1.0 + float(value.abs())) or decrement < 1e-6
        # below twice the value's rounding unit no line search can see the decrease (in float32 a log joint of
        # 3e4 has a unit of 2e-3 nats, and a search there crept on by rounding luck until num_steps ran out); so
        # close to the mode the quadratic model is exact to far below that: take the full Newton step and stop
        resolution = float(torch.finfo(value.dtype).eps) * (1.0 + float(value.abs()))
        if damping == 0.0 and not small and decrement < 2 * resolution:
            if torch.isfinite(safe(x + delta)):  # (a step this short stays where the log joint is finite)
                x = x + delta
            converged = True
            break
        if damping == 0.0 and small:
            converged = True
            break
        if step == num_steps:
            break
        clipped = float(delta.abs().max()) > radius
        delta = delta * min(1.0, radius / float(delta.abs().max().clamp(min=1e-300)))
        backtracked = False
        for _ in range(60):  # backtracking line search
            trial = safe(x + delta)
            if trial <= value:
                break
            delta, backtracked = delta / 2, True
        else:  # no decrease along a descent direction: the mode at float precision
            converged = True
            break
        if backtracked:
            radius = max(radius / 2, 1e-3)
        elif clipped:
            radius *= 2
        # a step below the parameters' rounding unit leaves x where it is: no progress is possible any more
        unit = max(1e-10, float(torch.finfo(x.dtype).eps))  # float64: the old 1e-10; float32: its rounding unit
        converged = bool(delta.abs().max() <= unit * (1.0 + float(x.abs().max())))
        previous, x, value = x, x + delta, trial
        if converged:  # no progress possible any more at float precision
            break
    if not torch.isfinite(chol).all():
        raise ValueError("the Hessian at the MAP is not finite; use prior or MCMC samples instead")
    if not converged:
        warnings.warn(
            f"Laplace: Newton did not converge in {num_steps} steps (gradient max {float(grad.abs().max()):.3g}); "
            "pi_hat may be centred away from the posterior: raise num_steps",
            stacklevel=3,
        )
    if damping != 0.0:  # pi_hat only weights the norm: a slightly wider Gaussian is acceptable
        warnings.warn(
            f"Laplace: Hessian not positive definite at the mode, regularised by {damping:.3g} I", stacklevel=3
        )
    return x.detach(), chol


def _gradient_and_hessian(potential: Callable[[Tensor], Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient and Hessian of ``potential`` at ``x`` from one forward run: the Hessian's rows are backward
    passes through the gradient's graph (about 25% less than separate ``jacobian`` and ``hessian`` calls,
    which run the model ``D + 2`` times; a batched backward pass was slower for Pyro models)."""
    point = x.detach().requires_grad_()
    value = potential(point)
    zeros = torch.zeros(len(x), len(x), dtype=x.dtype)
    if not value.requires_grad:  # a constant potential
        return zeros[0], zeros
    (grad,) = torch.autograd.grad(value, point, create_graph=True, allow_unused=True)
    if grad is None or not grad.requires_grad:  # constant, or linear in x: zero Hessian
        return (zeros[0] if grad is None else grad.detach()), zeros
    rows = [torch.autograd.grad(grad[i], point, retain_graph=True, allow_unused=True)[0] for i in range(len(x))]
    hessian = torch.stack([torch.zeros_like(x) if row is None else row for row in rows])
    return grad.detach(), hessian.detach()


def _subsample_indices(num_data: int, subsample_size: int | None) -> Tensor | None:
    if subsample_size is None:
        return None
    check_size(subsample_size, "subsample_size")
    if subsample_size >= num_data:
        return None
    return torch.randperm(num_data)[:subsample_size].sort().values


def subsample_mcmc_samples(
    model: Callable[..., Any],
    num_samples: int,
    subsample_size: int,
    plate: str = "data",
    model_args: Sequence[Any] = (),
    model_kwargs: Mapping[str, Any] | None = None,
    warmup_steps: int | None = None,
) -> dict[str, Tensor]:
    """``pi_hat`` = NUTS posterior on a small uniform subsample (likelihood scaled by ``N / n``).

    Args:
        model: the Pyro model.
        num_samples: number of draws ``J`` (NUTS samples after warmup).
        subsample_size: uniform subsample size ``n``.
        plate: name of the data plate.
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.
        warmup_steps: NUTS warmup (default ``num_samples``).

    Example:
        >>> import pyro, pyro.distributions as dist, torch
        >>> y = torch.randn(500) + 2.0
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", len(y)) as idx:
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> subsample_mcmc_samples(model, 10, 50, model_args=(y,))["mu"].shape
        torch.Size([10])
    """
    from pyro.infer import MCMC, NUTS

    loglik = ModelLogLikelihood(model, plate, model_args, model_kwargs)
    check_size(num_samples, "num_samples")
    indices = _subsample_indices(loglik.num_data, subsample_size)
    run = _on_indices(model, plate, indices) if indices is not None else model
    mcmc = MCMC(NUTS(run), num_samples=num_samples, warmup_steps=warmup_steps or num_samples, disable_progbar=True)
    mcmc.run(*loglik.model_args, **loglik.model_kwargs)
    samples = mcmc.get_samples()
    return {name: samples[name].detach() for name in loglik.site_shapes}
