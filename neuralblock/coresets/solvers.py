"""Coreset constructions: sparse non-negative weights whose weighted feature sum matches the full one.

A *solver* receives the projected log-likelihoods ``features`` (``[n, J]``, one row per datum, see
:class:`~neuralblock.coresets.projection.Projector`) and a size ``M``, and returns non-negative weights
``w`` (``[n]``) with at most ``M`` non-zero entries such that ``w @ features`` approximates
``features.sum(0)``. Solvers are stateless objects, injected into
:class:`~neuralblock.coresets.hilbert.HilbertCoreset`:

* :class:`UniformSampling`: ``M`` i.i.d. uniform draws, weight ``n / M`` per draw (needs no features);
* :class:`ImportanceSampling`: ``M`` i.i.d. draws with probability proportional to the feature norms;
* :class:`FrankWolfe`: Frank-Wolfe on the polytope ``{w >= 0, sum_n w_n ||f_n|| = sum_n ||f_n||}``
  with exact line search (so the error never increases), one new support point per iteration.

References:
    Campbell, T. and Broderick, T. "Automated Scalable Bayesian Inference via Hilbert Coresets",
    JMLR 20(15), 2019 (Algorithms 1 and 2).

Example:
    >>> import torch
    >>> features = torch.randn(200, 30, generator=torch.Generator().manual_seed(0))
    >>> fw = frank_wolfe(features, 20)
    >>> int((fw.weights > 0).sum()) <= 20, bool((fw.weights >= 0).all())
    (True, True)
    >>> bool((fw.errors[1:] <= fw.errors[:-1] + 1e-4).all())
    True
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = [
    "Coreset",
    "CoresetSolver",
    "FWResult",
    "FrankWolfe",
    "ImportanceSampling",
    "UniformSampling",
    "check_size",
    "coreset_error",
    "feature_total",
    "frank_wolfe",
    "make_solver",
    "nnls_gram",
]


class Coreset(NamedTuple):
    """A weighted subset of the data.

    Attributes:
        indices: ``LongTensor [m]``, sorted data indices with positive weight (``m <= M``).
        weights: ``Tensor [m]``, their positive weights.
    """

    indices: Tensor
    weights: Tensor

    @classmethod
    def from_dense(cls, weights: Tensor, index_map: Tensor | None = None) -> Coreset:
        """The coreset of the non-zero entries of a dense weight vector.

        Args:
            weights: ``[n]`` non-negative weights.
            index_map: optional ``[n]`` data indices of the rows (default ``arange(n)``).

        Example:
            >>> Coreset.from_dense(torch.tensor([0.0, 2.0, 0.0, 1.5]))
            Coreset(indices=tensor([1, 3]), weights=tensor([2.0000, 1.5000]))
        """
        support = torch.nonzero(weights > 0).squeeze(-1)
        indices = support if index_map is None else index_map[support]
        return cls(indices, weights[support])

    def dense(self, num_data: int) -> Tensor:
        """The weights as a dense ``[num_data]`` vector (zeros off the coreset).

        Example:
            >>> Coreset(torch.tensor([1]), torch.tensor([3.0])).dense(3)
            tensor([0., 3., 0.])
        """
        out = torch.zeros(num_data, dtype=self.weights.dtype)
        return out.index_add_(0, self.indices, self.weights)


def check_size(size: int, name: str = "M") -> int:
    """Validate a positive integer size (coreset size ``M``, projection dimension ``J``, ...).

    Example:
        >>> check_size(3)
        3
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"{name} must be an int, got {type(size).__name__}")
    if size <= 0:
        raise ValueError(f"{name} must be a positive integer, got {size}")
    return size


def _check_features(features: Tensor) -> Tensor:
    if not isinstance(features, Tensor) or features.dim() != 2:
        shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
        raise ValueError(f"features must be a 2-D tensor [num_data, J], got {shape}")
    if not torch.isfinite(features.sum()):  # one reduction instead of an [n, J] mask
        raise ValueError("features contain non-finite values (NaN or inf log-likelihoods or gradients)")
    return features


def feature_total(features: Tensor, chunk_size: int = 8192) -> Tensor:
    """``sum_n f_n`` in float64: float64 sums of row-chunk matrix-vector products (fast in either layout).

    Example:
        >>> feature_total(torch.ones(5, 2))
        tensor([5., 5.], dtype=torch.float64)
    """
    ones = features.new_ones(min(chunk_size, max(len(features), 1)))
    total = torch.zeros(features.shape[1], dtype=torch.float64)
    for start in range(0, len(features), chunk_size):
        block = features[start : start + chunk_size]
        total += (ones[: len(block)] @ block).to(torch.float64)
    return total


def coreset_error(features: Tensor, weights: Tensor) -> float:
    """Hilbert-norm error ``||sum_n f_n - sum_n w_n f_n||`` of dense ``weights`` in the projected space.

    Args:
        features: ``[n, J]`` projected log-likelihoods.
        weights: ``[n]`` weights.

    Example:
        >>> f = torch.eye(2)
        >>> coreset_error(f, torch.tensor([1.0, 1.0])), coreset_error(f, torch.tensor([2.0, 0.0]))
        (0.0, 1.4142135381698608)
    """
    _check_features(features)
    if weights.shape != features.shape[:1]:
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected ({features.shape[0]},)")
    residual = features.sum(0) - weights.to(features.dtype) @ features
    return float(residual.norm())


class FWResult(NamedTuple):
    """Outcome of :func:`frank_wolfe`.

    Attributes:
        weights: ``[n]`` non-negative weights, at most ``size`` non-zero.
        errors: ``[iterations]`` the error ``||L - L(w)||`` after each iteration (non-increasing).
    """

    weights: Tensor
    errors: Tensor


def nnls_gram(gram: Tensor, target: Tensor, init: Tensor | None = None, max_iter: int | None = None) -> Tensor:
    """Non-negative least squares ``min_{w >= 0} ||L - F^T w||^2`` in Gram form (Lawson-Hanson active set).

    Args:
        gram: ``G = F F^T``, ``[k, k]`` (float64 recommended).
        target: ``b = F L``, ``[k]``.
        init: optional feasible start whose positive entries form the first passive set.
        max_iter: cap on outer iterations (default ``3 k``).

    Returns:
        ``[k]`` non-negative weights.

    Example:
        >>> f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        >>> nnls_gram(f @ f.T, f @ torch.tensor([2.0, -1.0], dtype=torch.float64)).round(decimals=6)
        tensor([2., 0., 0.], dtype=torch.float64)
    """
    k = len(target)
    ridge = 1e-12 * float(gram.diagonal().max().clamp(min=1e-300))
    tol = 1e-12 * float(target.abs().max().clamp(min=1e-300)) * k
    weights = torch.zeros(k, dtype=gram.dtype) if init is None else init.clone()
    passive = weights > 0

    def solve(mask: Tensor) -> Tensor:
        idx = torch.nonzero(mask).squeeze(1)
        sub = gram[idx][:, idx] + ridge * torch.eye(len(idx), dtype=gram.dtype)
        out = torch.zeros_like(weights)
        out[idx] = torch.linalg.solve(sub, target[idx])
        return out

    def restore_feasibility(trial: Tensor) -> Tensor:
        """Inner Lawson-Hanson loop: walk towards the passive-set solution until it is positive."""
        nonlocal passive, weights
        while True:
            bad = passive & (trial <= 0)
            if not bad.any():
                return trial
            ratios = weights[bad] / (weights[bad] - trial[bad])
            weights = weights + float(ratios.min().clamp(0.0, 1.0)) * (trial - weights)
            passive = passive & (weights > 1e-14 * float(weights.max().clamp(min=1e-300)))
            weights = torch.where(passive, weights, torch.zeros_like(weights))
            if not passive.any():
                return weights
            trial = solve(passive)

    if passive.any():
        weights = restore_feasibility(solve(passive))
    for _ in range(max_iter or 3 * k):
        dual = target - gram @ weights
        dual[passive] = -torch.inf
        j = int(dual.argmax())
        if passive.all() or float(dual[j]) <= tol:
            break
        passive[j] = True
        weights = restore_feasibility(solve(passive))
    return weights


def frank_wolfe(features: Tensor, size: int, refine_every: int = 0, tol: float = 0.0, picks: int = 1) -> FWResult:
    """Frank-Wolfe coreset construction (Campbell & Broderick 2019, Algorithm 2).

    Minimises ``||L - sum_n w_n f_n||`` over ``{w >= 0: sum_n sigma_n w_n = sigma}`` where
    ``L = sum_n f_n``, ``sigma_n = ||f_n||`` and ``sigma = sum_n sigma_n``. Each of the ``size``
    iterations moves towards the vertex ``(sigma / sigma_f) e_f`` best aligned with the residual, with
    exact line search, so the error is non-increasing and at most ``size`` weights are non-zero.
    Scoring the vertices against the residual ``r = L - L(w)``, ``<f_n, r> / ||f_n||``, is one ``[n, J]``
    matrix-vector product per iteration; everything else is ``O(J)``
    (the line search reads only ``f_f``, ``r`` and ``L(w)``) or ``O(support^2 x J)`` (the NNLS steps), so an
    NNLS step at every iteration (``refine_every=1``, fully corrective) costs little and usually reaches a
    tolerance in far fewer iterations.

    With ``refine_every = k > 0`` the iteration is *fully corrective* every ``k`` iterations and at the
    end: the weights on the current support are re-optimised by non-negative least squares
    (:func:`nnls_gram`, warm-started, kept only if it lowers the error). That can only lower the error
    and shrink the support, and makes later choices of support points see a much smaller residual.
    ``refine_every = 0`` is the plain algorithm of the paper.

    With ``tol > 0`` the iteration stops (after a last NNLS step) as soon as the error is at most
    ``tol * ||L||``: ``size`` is then a budget, not a number of iterations that is always spent.

    With ``picks = k > 1`` (fully corrective iterations only) the ``k - 1`` next-best points off the
    support join it at weight 0 after each step, and the NNLS step decides their weights (keeping only
    those that lower the error). One scoring pass then grows the support by up to ``k`` points, so a
    tolerance is reached in fewer passes over the data (on a logistic regression of ``N = 1e5``, ``J =
    200``: 45 instead of 96 iterations at ``k = 4``, the same support size and error). The support stays
    at most ``size`` points: the iteration stops when it is full.
    Scores are computed on a column-major copy of ``features`` unless it is one already (as
    :meth:`~neuralblock.coresets.projection.Projector.project` returns), which is about twice as fast.

    Args:
        features: ``[n, J]`` projected log-likelihoods.
        size: maximal number of iterations = maximal number of non-zero weights.
        refine_every: NNLS re-optimisation period (0: never).
        tol: stop at a relative error ``||L - L(w)|| / ||L|| <= tol`` (0: run all ``size`` iterations).
        picks: points joining the support per iteration (``1``: the algorithm above).

    Returns:
        The weights of the iterate with the least error, and the least error after each iteration
        (non-increasing; fewer than ``size`` entries when ``tol`` stopped it).

    Example:
        >>> result = frank_wolfe(torch.eye(2), 2)
        >>> result.weights, result.errors
        (tensor([1., 1.], dtype=torch.float64), tensor([1.4142, 0.0000], dtype=torch.float64))
        >>> len(frank_wolfe(torch.eye(2).repeat(50, 1), 10, tol=1e-6).errors)  # exact after 2 iterations
        2
    """
    features = _check_features(features)  # full passes in its dtype, running sums in float64
    check_size(size)
    if refine_every < 0:
        raise ValueError(f"refine_every must be >= 0, got {refine_every}")
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"tol must be in [0, 1), got {tol}")
    check_size(picks, "picks")
    if picks > 1 and refine_every != 1:
        raise ValueError(f"picks={picks} > 1 needs the fully corrective iteration (refine_every=1), got {refine_every}")
    if features.stride(0) != 1 and features.shape[1] > 1:
        features = features.T.contiguous().T  # column-major: faster [n, J] @ [J] products
    norms = features.norm(dim=1).to(torch.float64)
    usable = norms > 0
    if not usable.any():
        raise ValueError("all feature vectors are zero: the log-likelihoods do not vary over the samples")
    sigma = norms.sum()
    total = feature_total(features)
    stop_at = tol * total.norm()
    safe_norms = torch.where(usable, norms, torch.ones_like(norms))
    scale = torch.where(usable, sigma / safe_norms, torch.zeros_like(norms))  # vertex length sigma / sigma_n
    inv_norms = torch.where(usable, 1 / safe_norms, torch.zeros_like(norms)).to(features.dtype)
    never = ~usable  # never pick a zero feature vector
    support = _Support(features, total)  # the weights live on their support: O(support) per iteration
    # L(w) is kept as a float64 vector (O(J) to update), so the error ||L - L(w)|| is taken directly, without
    # the cancellation of ||L||^2 - 2<L, L(w)> + ||L(w)||^2
    lw = torch.zeros_like(total)
    errors: list[Tensor] = []
    best = support.snapshot()  # the iterate of least error: near convergence float32 products can make a step go up
    for it in range(size):
        if picks > 1 and len(support.indices) >= size:  # the support is full: no point may join it
            break
        residual = total - lw
        scores = (features @ residual.to(features.dtype)).mul_(inv_norms)  # <f_n, r> / ||f_n||
        f = int(scores.masked_fill_(never, -torch.inf).argmax())
        # direction d = scale_f f_f - L(w); gamma = <d, L - L(w)> / ||d||^2 clipped to [0, 1]
        row = features[f].to(torch.float64)
        num = scale[f] * (row @ residual) - lw @ residual
        den = sigma**2 - 2 * scale[f] * (row @ lw) + lw @ lw
        if it == 0 or (den > 0 and num > 0):
            gamma = torch.ones((), dtype=torch.float64) if it == 0 else torch.clamp(num / den, max=1.0)
            support.step(f, row, float(gamma), float(scale[f]))
            lw = (1 - gamma) * lw + gamma * scale[f] * row
        extra = min(picks - 1, size - len(support.indices))
        if extra > 0:  # the next-best points off the support join it at weight 0; the NNLS step weighs them
            scores[torch.tensor(support.indices)] = -torch.inf
            candidates = scores.topk(extra).indices
            candidates = candidates[torch.isfinite(scores[candidates])]
            support.add(candidates, features[candidates].to(torch.float64))
        error = (total - lw).norm()
        stop = tol > 0 and bool(error <= stop_at)
        if refine_every and ((it + 1) % refine_every == 0 or it == size - 1 or stop):
            refined = support.refit()
            if refined is not None:
                lw = refined
                error = (total - lw).norm()
                stop = tol > 0 and bool(error <= stop_at)
        if not errors or error < errors[-1]:
            errors.append(error)
            best = support.snapshot()
        else:
            errors.append(errors[-1])
        if stop:
            break
    weights = torch.zeros_like(norms).index_put_((best[0],), best[1])
    return FWResult(weights, torch.stack(errors))


class _Support:
    """Frank-Wolfe's iterate on its support: indices, weights and the float64 feature rows."""

    def __init__(self, features: Tensor, total: Tensor) -> None:
        self.features = features
        self.total = total
        self.indices: list[int] = []
        self.position: dict[int, int] = {}
        self.weights = torch.zeros(0, dtype=torch.float64)
        self.rows = torch.zeros(0, len(total), dtype=torch.float64)
        self.fresh = 0  # the last points added at weight 0

    def step(self, f: int, row: Tensor, gamma: float, scale: float) -> None:
        """``w <- (1 - gamma) w + gamma scale e_f``."""
        self.weights = self.weights * (1.0 - gamma)
        if f in self.position:
            self.weights[self.position[f]] += gamma * scale
            return
        self.position[f] = len(self.indices)
        self.indices.append(f)
        self.weights = torch.cat([self.weights, self.weights.new_tensor([gamma * scale])])
        self.rows = torch.cat([self.rows, row[None]])

    def add(self, points: Tensor, rows: Tensor) -> None:
        """Points (off the support) join it with weight 0."""
        for f in points.tolist():
            self.position[f] = len(self.indices)
            self.indices.append(f)
        self.weights = torch.cat([self.weights, self.weights.new_zeros(len(points))])
        self.rows = torch.cat([self.rows, rows])
        self.fresh = len(points)

    def refit(self) -> Tensor | None:
        """NNLS on the support (dropping the points it zeroes); returns the new ``L(w)`` (``None``: unchanged)."""
        keep = self.weights > 0
        keep[len(keep) - self.fresh :] = True  # points just added (weight 0) are candidates of the NNLS step
        self.fresh = 0
        rows, weights = self.rows[keep], self.weights[keep]
        refined = nnls_gram(rows @ rows.T, rows @ self.total, init=weights)
        approx: Tensor | None = refined @ rows
        if (self.total - refined @ rows).norm() > (self.total - weights @ rows).norm():
            refined, approx = weights, None  # not kept: the points at weight 0 (the fresh ones among them) leave
        positive = refined > 0
        self._keep(torch.nonzero(keep).squeeze(1)[positive].tolist())
        self.weights, self.rows = refined[positive], rows[positive]
        return approx

    def _keep(self, positions: list[int]) -> None:
        self.indices = [self.indices[i] for i in positions]
        self.position = {f: i for i, f in enumerate(self.indices)}

    def snapshot(self) -> tuple[Tensor, Tensor]:
        """``(indices, weights)`` of the current iterate (copies)."""
        return torch.tensor(self.indices, dtype=torch.long), self.weights.clone()


def _counts_to_weights(draws: Tensor, per_draw: Tensor, num_data: int) -> Tensor:
    weights = torch.zeros(num_data, dtype=torch.float64)
    return weights.index_add_(0, draws, per_draw.to(torch.float64))


@runtime_checkable
class CoresetSolver(Protocol):
    """What :class:`~neuralblock.coresets.hilbert.HilbertCoreset` needs from a construction.

    Attributes:
        needs_features: whether :meth:`solve` reads ``features`` (if not, it may receive ``None``).
    """

    needs_features: bool

    def solve(self, features: Tensor | None, num_data: int, size: int, generator: torch.Generator | None) -> Tensor:
        """Dense ``[num_data]`` non-negative weights with at most ``size`` non-zero entries."""
        ...


class UniformSampling:
    """``M`` i.i.d. uniform draws with replacement, each worth ``n / M`` data points.

    Example:
        >>> w = UniformSampling().solve(None, 10, 4, torch.Generator().manual_seed(0))
        >>> float(w.sum()), int((w > 0).sum()) <= 4
        (10.0, True)
    """

    needs_features = False

    def solve(self, features: Tensor | None, num_data: int, size: int, generator: torch.Generator | None) -> Tensor:
        check_size(size)
        draws = torch.randint(num_data, (size,), generator=generator)
        return _counts_to_weights(draws, torch.full((size,), num_data / size), num_data)


class ImportanceSampling:
    """``M`` i.i.d. draws with probability ``p_n = sigma_n / sigma``, each worth ``1 / (M p_n)`` times ``f_n``.

    The weighted sum is an unbiased estimate of ``L``; its variance is minimal among i.i.d.
    sampling schemes (Campbell & Broderick 2019, Algorithm 1).

    Example:
        >>> f = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
        >>> w = ImportanceSampling().solve(f, 2, 50, torch.Generator().manual_seed(0))
        >>> bool((w >= 0).all()), int((w > 0).sum())
        (True, 2)
    """

    needs_features = True

    def solve(self, features: Tensor | None, num_data: int, size: int, generator: torch.Generator | None) -> Tensor:
        check_size(size)
        if features is None:
            raise ValueError("importance sampling needs the projected features")
        norms = _check_features(features).norm(dim=1).to(torch.float64)
        if not (norms > 0).any():
            raise ValueError("all feature vectors are zero: the log-likelihoods do not vary over the samples")
        probs = norms / norms.sum()
        draws = torch.multinomial(probs, size, replacement=True, generator=generator)
        return _counts_to_weights(draws, 1.0 / (size * probs[draws]), num_data)


class FrankWolfe:
    """Frank-Wolfe construction (:func:`frank_wolfe`); deterministic given the features.

    Args:
        refine_every: period of the fully corrective NNLS steps (see :func:`frank_wolfe`; 0: the
            plain algorithm of the paper).
        tol: stop early at this relative Hilbert error (see :func:`frank_wolfe`; 0: never).
        picks: points joining the support per iteration (see :func:`frank_wolfe`; more than 1 needs
            ``refine_every=1``).

    Example:
        >>> w = FrankWolfe().solve(torch.eye(3), 3, 3, None)
        >>> w
        tensor([1., 1., 1.], dtype=torch.float64)
    """

    needs_features = True

    def __init__(self, refine_every: int = 0, tol: float = 0.0, picks: int = 1) -> None:
        if refine_every < 0:
            raise ValueError(f"refine_every must be >= 0, got {refine_every}")
        if not 0.0 <= tol < 1.0:
            raise ValueError(f"tol must be in [0, 1), got {tol}")
        check_size(picks, "picks")
        if picks > 1 and refine_every != 1:
            raise ValueError(f"picks={picks} > 1 needs the fully corrective iteration (refine_every=1)")
        self.refine_every = refine_every
        self.tol = tol
        self.picks = picks

    def solve(self, features: Tensor | None, num_data: int, size: int, generator: torch.Generator | None) -> Tensor:
        if features is None:
            raise ValueError("Frank-Wolfe needs the projected features")
        return frank_wolfe(features, size, self.refine_every, self.tol, self.picks).weights


_SOLVERS: dict[str, type[UniformSampling] | type[ImportanceSampling] | type[FrankWolfe]] = {
    "uniform": UniformSampling,
    "is": ImportanceSampling,
    "fw": FrankWolfe,
}


def make_solver(method: str | CoresetSolver) -> CoresetSolver:
    """A solver from its name (``"uniform"``, ``"is"``, ``"fw"``) or a user object passed through.

    Example:
        >>> type(make_solver("fw")).__name__
        'FrankWolfe'
    """
    if isinstance(method, str):
        if method not in _SOLVERS:
            raise ValueError(f"unknown coreset method {method!r}; expected one of {sorted(_SOLVERS)}")
        return _SOLVERS[method]()
    if not isinstance(method, CoresetSolver):
        raise TypeError(f"method must be a name or an object with needs_features and solve(), got {method!r}")
    return method
