"""The fused neural block update for continuous, whitened blocks on Gaussian factors, batched over chains.

A colour class of motif instances (e.g. the ``chain`` motif's ``(x_t, x_{t+1})`` pairs of a
stochastic volatility or linear-Gaussian state-space chain) is updated by one function over
precomputed index tensors, for states ``[K, n]`` of ``K`` chains at once
(:func:`fused_continuous_update`):

1. **Context.** One gather of the context variables (``0`` where absent).
2. **Features and whitening.** The motif's pure encoder (:class:`ContextEncoder`) maps the
   context values and ``Psi`` to the network's features and the whitening map
   ``B = loc + L u``, which depends on ``C`` and ``Psi`` only.
3. **Proposal.** One MDN pass; ``u' ~ q(u | C)`` by the Gumbel-max choice of a component and
   a Gaussian step, from random numbers drawn outside the function; the forward and the
   reverse densities ``q(u' | C)`` and ``q(u | C)`` (``u = L^{-1} (B - loc)``, the current block)
   come from the same network output. ``C`` excludes the block, so the reverse proposal is
   the one the chain would use from ``B'``; the Jacobian of the whitening is the same both
   ways and cancels.
4. **Energy.** :class:`GaussianScaffold` evaluates the block's scaffold factors (linear-Gaussian
   and log-linear-Gaussian rows, padded to one layout) at the current and the proposed block.
5. **Accept and scatter.** Exact MH with ``beta (log p(B') - log p(B)) + log q(u) - log q(u')``
   (``beta`` the per-chain inverse temperatures of a tempered target, ``1`` otherwise).

Classes are padded to one shape (a padded row repeats its class's last real row *and its
random numbers*, so both write the same value), so that ``torch.compile`` builds one
function per graph; random numbers are drawn outside the function, so the eager and the
compiled updates make the same decisions from the same seed.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch
    >>> from neuralblock import FactorGraph
    >>> fg = FactorGraph(); x, y = fg.add_variable("x"), fg.add_variable("y")
    >>> _ = fg.add_linear_gaussian(x, [], [], 0.0, 1.0)
    >>> _ = fg.add_linear_gaussian(y, [x], [2.0], 0.0, 0.5)
    >>> energy = GaussianScaffold.build(fg, torch.tensor([[0]]))
    >>> blocks = torch.tensor([[[[0.0]]], [[[1.0]]]])  # [S=2, K=1, I=1, b=1]: x = 0 and x = 1
    >>> change = energy(torch.tensor([[0.0, 2.0]]), blocks)  # y = 2: log p rises by 7.5 from x = 0 to x = 1
    >>> round(float(change[1] - change[0]), 4)
    7.5
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from neuralblock.exact.chain import gumbel_from_uniform, gumbel_max
from neuralblock.graph import FactorGraph, LinearGaussianGroup, LogLinearGaussianGroup
from neuralblock.kernels.functional import nonfinite_ratios
from neuralblock.kernels.gibbs import compiled, pad_by_owner
from neuralblock.motif import Motif, MotifInstances
from neuralblock.proposals import NeuralBlockProposal
from neuralblock.proposals.mdn import BlockMixture

__all__ = [
    "ContextEncoder",
    "Encoder",
    "FusedContinuousSweep",
    "GaussianScaffold",
    "fused_continuous_update",
    "mixture_draw",
    "supports_fused_continuous",
]


Encoder = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
"""Context values ``[..., I, c]`` (``0`` where absent) to ``(features [..., I, F], loc [..., I, b], L [..., I, b, b])``:
the network's inputs and the whitening ``B = loc + L u``, which depend on the context and ``Psi`` only.
"""


@runtime_checkable
class ContextEncoder(Protocol):
    """A motif whose features and whitening map are a pure function of its instances' context values.

    ``context_encoder(fg, instances, state)`` returns an :data:`Encoder` for those instances:
    it gives what :meth:`Motif.encode_with_affine` gives at a state, from the values of the
    context variables alone. The motif may precompute in it whatever depends only on ``Psi``
    and the evidence (``state`` holds the evidence; its other values are arbitrary). The
    ``chain`` motif is one.
    """

    def context_encoder(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Encoder:
        """The :data:`Encoder` of ``instances`` (rows may repeat), in ``state``'s dtype."""


class GaussianScaffold(NamedTuple):
    """Blocks' scaffold factors as Gaussian rows in one padded layout ``[I, d]``.

    Every scaffold factor of a block is ``child ~ N(mean, exp(log_var))`` with ``mean`` and
    ``log_var`` linear in its scope ``v = (child, parents...)``: the residual is
    ``v . res_weight - res_bias`` and the log-variance ``v . var_weight + var_bias``
    (a :class:`LinearGaussianGroup` row has ``res_weight = (1, -w)``, ``log_var = 2 log scale``; a
    :class:`LogLinearGaussianGroup` row has ``res_weight = (1, -loc_weight)``,
    ``var_weight = (0, logvar_weight)``). Both split into a part read from the state (the
    scope variables outside the block, ``a`` of them at most) and a part linear in the block
    values. ``d`` is the most factors any block touches; padding rows have zero weights and
    biases, so they add nothing. The log-density is the groups' own up to the constant
    ``-log(2 pi) / 2`` per factor, which cancels in every MH ratio.

    Attributes:
        ids: ``[I * d * a]`` the scope variables outside the block, flattened (``0`` for padding).
        read_res, read_var: ``[I, d, a]`` their weights in the residual and the log-variance.
        block_res, block_var: ``[I, d, b]`` the block values' weights.
        res_bias, var_bias: ``[I, d]``.
    """

    ids: Tensor
    read_res: Tensor
    read_var: Tensor
    block_res: Tensor
    block_var: Tensor
    res_bias: Tensor
    var_bias: Tensor

    @staticmethod
    def supports(fg: FactorGraph, blocks: Tensor) -> bool:
        """Whether every scaffold factor of ``blocks`` is a linear-Gaussian or log-linear-Gaussian row."""
        scaffold = fg.scaffold(blocks)
        return all(
            isinstance(group, (LinearGaussianGroup, LogLinearGaussianGroup)) or index.numel() == 0
            for group, index in zip(fg.groups, scaffold.group_index)
        )

    @classmethod
    def build(cls, fg: FactorGraph, blocks: Tensor) -> GaussianScaffold:
        """The layout of ``blocks [I, b]``'s scaffolds in ``fg`` (see :meth:`supports`).

        Raises:
            TypeError: a scaffold factor is neither linear-Gaussian nor log-linear-Gaussian.
        """
        scaffold = fg.scaffold(blocks)
        dtype = torch.get_default_dtype()
        parts: list[tuple[Tensor, ...]] = []  # (segment, scope, res_weight, res_bias, var_weight, var_bias)
        for group, rows, segment in zip(fg.groups, scaffold.group_index, scaffold.group_segment):
            if rows.numel() == 0:
                continue
            if isinstance(group, LinearGaussianGroup):
                parents = group.parents[rows]
                weight = group.weights[rows].to(dtype)
                ones = torch.ones(len(rows), 1, dtype=dtype)
                scope = torch.cat([group.child[rows, None], parents], 1)
                res = torch.cat([ones, -weight], 1)
                var = torch.zeros_like(res)
                parts.append((segment, scope, res, group.bias[rows].to(dtype), var, 2 * group.scale[rows].log()))
            elif isinstance(group, LogLinearGaussianGroup):
                scope = torch.stack([group.child[rows], group.parent[rows]], 1)
                one = torch.ones(len(rows), dtype=dtype)
                res = torch.stack([one, -group.loc_weight[rows].to(dtype)], 1)
                var = torch.stack([torch.zeros_like(one), group.logvar_weight[rows].to(dtype)], 1)
                bias = group.loc_bias[rows].to(dtype)
                parts.append((segment, scope, res, bias, var, group.logvar_bias[rows].to(dtype)))
            else:
                raise TypeError(
                    f"the fused continuous path evaluates linear-Gaussian and log-linear-Gaussian factors only, "
                    f"not {type(group).__name__}"
                )
        width = max([p[1].shape[1] for p in parts] + [1])
        count = blocks.shape[0]

        def widen(t: Tensor, fill: int | float) -> Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

        if parts:
            segment = torch.cat([p[0] for p in parts])
            scope = torch.cat([widen(p[1], -1) for p in parts])
            res_w, var_w = (torch.cat([widen(p[i], 0.0) for p in parts]) for i in (2, 4))
            res_b, var_b = (torch.cat([p[i] for p in parts]) for i in (3, 5))
        else:  # no block touches a factor: padding only
            segment = torch.zeros(0, dtype=torch.long)
            scope = torch.zeros(0, width, dtype=torch.long)
            res_w = var_w = torch.zeros(0, width, dtype=dtype)
            res_b = var_b = torch.zeros(0, dtype=dtype)
        position = (scope[:, :, None] == blocks[segment][:, None, :]).to(dtype)  # [m, a, b]
        keep = ((scope >= 0) & (position.sum(-1) == 0)).to(dtype)
        block_res = (position * res_w[:, :, None]).sum(1)  # [m, b]
        block_var = (position * var_w[:, :, None]).sum(1)
        columns = [scope.clamp(min=0), keep * res_w, keep * var_w, block_res, block_var, res_b, var_b]
        ids, *rest = pad_by_owner(segment, count, columns, [0] * len(columns))
        return cls(ids.reshape(-1), *rest)

    def select(self, rows: Tensor) -> GaussianScaffold:
        """The layout of the blocks at ``rows`` (repeats allowed)."""
        ids = self.ids.view(self.read_res.shape[0], -1)[rows].reshape(-1)
        return GaussianScaffold(ids, *(t[rows] for t in self[1:]))

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> GaussianScaffold:
        """Move to ``device`` (floating tensors to ``dtype`` too, when given)."""
        return GaussianScaffold(
            *(t.to(device) if not t.is_floating_point() else t.to(device, dtype or t.dtype) for t in self)
        )

    def __call__(self, state: Tensor, blocks: Tensor) -> Tensor:
        """Scaffold log-density ``[S, K, I]`` of block values ``blocks [S, K, I, b]``, the rest at ``state [K, n]``."""
        chains = state.shape[0]
        count, depth, width = self.read_res.shape
        read = state.index_select(1, self.ids).view(chains, count, depth, width)
        resid, log_var = -self.res_bias, self.var_bias
        for k in range(width):  # a few scope positions: elementwise, no reduction over a tiny axis
            resid = resid + read[..., k] * self.read_res[..., k]
            log_var = log_var + read[..., k] * self.read_var[..., k]
        for j in range(blocks.shape[-1]):
            value = blocks[..., j, None]
            resid = resid + value * self.block_res[..., j]
            log_var = log_var + value * self.block_var[..., j]
        return (-0.5 * (resid * resid * torch.exp(-log_var) + log_var)).sum(-1)


def mixture_draw(mixture: BlockMixture, gumbel: Tensor, normal: Tensor) -> Tensor:
    """A draw from a continuous :class:`BlockMixture` made from given noise.

    The component is ``argmax(log w + gumbel)`` (Gumbel-max) and the value its Gaussian's
    ``loc + exp(log_scale) * normal``: the law of :meth:`BlockMixture.sample`, with the random
    numbers drawn by the caller.

    Args:
        mixture: a mixture over continuous blocks, batch shape ``[...]``.
        gumbel: ``[..., C]`` standard Gumbel draws (``C`` components).
        normal: ``[..., b]`` standard normal draws.

    Example:
        >>> from neuralblock.proposals.mdn import MixtureDensityNetwork
        >>> q = MixtureDensityNetwork(3, [0, 0], components=4, hidden=(8,))(torch.zeros(5, 3))
        >>> mixture_draw(q, torch.zeros(5, 4), torch.zeros(5, 2)).shape
        torch.Size([5, 2])
    """
    if mixture.loc is None or mixture.log_scale is None or mixture.discrete_log_probs is not None:
        raise ValueError("mixture_draw needs a mixture over continuous variables only")
    choice = gumbel_max(mixture.mixture_log_weights, gumbel)[1]  # [...]
    index = choice[..., None, None].expand(choice.shape + (1, mixture.loc.shape[-1]))
    loc = mixture.loc.expand(choice.shape + mixture.loc.shape[-2:]).gather(-2, index).squeeze(-2)
    log_scale = mixture.log_scale.expand(choice.shape + mixture.log_scale.shape[-2:]).gather(-2, index).squeeze(-2)
    return loc + log_scale.exp() * normal


def _solve_lower(tril: Tensor, rhs: Tensor) -> Tensor:
    """``L^{-1} rhs`` for lower-triangular ``tril [..., b, b]`` and ``rhs [..., b]``, by forward substitution."""
    out: list[Tensor] = []
    for i in range(rhs.shape[-1]):
        acc = rhs[..., i]
        for j in range(i):
            acc = acc - tril[..., i, j] * out[j]
        out.append(acc / tril[..., i, i])
    return torch.stack(out, -1)


def fused_continuous_update(
    state: Tensor,
    proposal: NeuralBlockProposal,
    encode: Encoder,
    context_ids: Tensor,
    present: Tensor,
    block_ids: Tensor,
    energy: GaussianScaffold,
    gumbel: Tensor,
    normal: Tensor,
    log_accept: Tensor,
    beta: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One exact MH block update of a colour class of continuous blocks, for states ``[K, n]``.

    The log-ratio of a proposed block ``B' = loc + L u'`` (``u' ~ q(. | C)``) from ``B`` is
    ``beta (log p(B') - log p(B)) + log q(u | C) - log q(u' | C)`` with ``u = L^{-1} (B - loc)``;
    ``loc``, ``L`` and ``q`` depend on the context and ``Psi`` only.

    Args:
        state: ``[K, n]`` states.
        proposal: the neural block proposal (its MDN runs once on all rows).
        encode: the instances' :data:`Encoder` (from the motif's :class:`ContextEncoder`).
        context_ids: ``[I * c]`` each instance's context ids, flattened (``0`` where absent).
        present: ``[I, c]`` where a context id is present.
        block_ids: ``[I * b]`` the block ids, flattened (rows may repeat: see the module docstring).
        energy: the instances' :class:`GaussianScaffold`.
        gumbel: ``[K, I, C]`` standard Gumbel draws (the mixture component).
        normal: ``[K, I, b]`` standard normal draws (the Gaussian step).
        log_accept: ``[K, I]`` logs of the uniforms of the accept tests.
        beta: ``[K]`` inverse temperatures (targets ``p(x)^beta``), or ``None`` for the target itself.

    Returns:
        The new states, the accept indicator ``[K, I]`` and the broken-ratio (NaN or ``+inf``) indicator ``[K, I]``.
    """
    chains, count = state.shape[0], present.shape[0]
    size = block_ids.shape[0] // count
    context = state.index_select(1, context_ids).view(chains, count, -1)
    context = torch.where(present, context, torch.zeros((), dtype=state.dtype, device=state.device))
    features, loc, tril = encode(context)
    q = proposal(features.to(proposal.dtype))
    u_new = mixture_draw(q, gumbel, normal).to(state.dtype)
    current = state.index_select(1, block_ids).view(chains, count, size)
    u_cur = _solve_lower(tril, current - loc)
    proposed = loc + (tril * u_new[..., None, :]).sum(-1)
    log_q_fwd, log_q_rev = q.log_prob(torch.stack([u_new, u_cur])).unbind(0)
    log_p_cur, log_p_new = energy(state, torch.stack([current, proposed])).unbind(0)
    change = log_p_new - log_p_cur
    if beta is not None:
        change = change * beta[:, None].to(change.dtype)
    log_alpha = change + (log_q_rev - log_q_fwd).to(change.dtype)
    broken = nonfinite_ratios(log_alpha)
    accepted = (log_accept < log_alpha) & ~broken
    new = torch.where(accepted[..., None], proposed, current)  # repeated (padded) rows write equal values
    return state.index_copy(1, block_ids, new.reshape(chains, -1)), accepted, broken


def supports_fused_continuous(fg: FactorGraph, motif: Motif, instances: MotifInstances) -> bool:
    """Whether instances can take the fused continuous path.

    Their blocks are all continuous, the motif is a :class:`ContextEncoder`, and every
    scaffold factor of the blocks is a linear-Gaussian or log-linear-Gaussian row.
    """
    if len(instances) == 0 or any(k != 0 for k in motif.block_spec.cardinalities):
        return False
    return isinstance(motif, ContextEncoder) and GaussianScaffold.supports(fg, instances.blocks)


class FusedContinuousSweep:
    """One proposal's colour classes of continuous blocks on the fused path, padded to one shape.

    Args:
        fg: the graph (see :func:`supports_fused_continuous`).
        proposal: the neural block proposal (a :class:`ContextEncoder` motif).
        instances: the proposal's instances in sweep order (class by class).
        offsets: ``[C + 1]`` first instance of each class.
        device: where the state lives.
        compile: run :func:`fused_continuous_update` under ``torch.compile``.

    Raises:
        ValueError: an instance's context holds a variable of its own block (the reverse
            proposal would not be the one used from the proposed block).
    """

    def __init__(
        self,
        fg: FactorGraph,
        proposal: NeuralBlockProposal,
        instances: MotifInstances,
        offsets: Tensor,
        device: torch.device,
        compile: bool,
    ) -> None:
        own = (instances.context[:, :, None] == instances.blocks[:, None, :]).any(-1).any(-1)
        if bool(own.any()):
            i = int(own.nonzero()[0, 0])
            raise ValueError(
                f"motif {proposal.motif.name}: instance {i} (block {instances.blocks[i].tolist()}) reads its own "
                "block in its context; a proposal must condition on variables outside the block"
            )
        self.proposal = proposal
        self.encoder: ContextEncoder = proposal.motif  # type: ignore[assignment]
        self.device = device
        self.sizes = offsets.diff().tolist()
        width = max(self.sizes)
        # padded row i of class c repeats the class's last real row (and its random numbers)
        self.rand_index = [torch.arange(width).clamp(max=size - 1) for size in self.sizes]
        self.rows = [int(lo) + r for lo, r in zip(offsets[:-1].tolist(), self.rand_index)]
        self.rand_flat = torch.cat([c * width + r for c, r in enumerate(self.rand_index)]).to(device)
        self.padded = any(size < width for size in self.sizes)
        self.real = (torch.arange(width)[None, :] < torch.tensor(self.sizes)[:, None]).to(device)  # [C, width]
        context = instances.context
        self.context_ids = [context[rows].clamp(min=0).reshape(-1).to(device) for rows in self.rows]
        self.present = [(context[rows] >= 0).to(device) for rows in self.rows]
        self.block_ids = [instances.blocks[rows].reshape(-1).to(device) for rows in self.rows]
        self.refresh(fg, instances)
        self.compiled = compile
        self.update = compiled(fused_continuous_update) if compile else fused_continuous_update
        self.compile_seconds = 0.0

    def refresh(self, fg: FactorGraph, instances: MotifInstances) -> None:
        """Follow new parameter or evidence values (same blocks and classes): the encoders and the factors' numbers."""
        self.instances = instances
        self.class_instances = [instances.select(rows) for rows in self.rows]
        energy = GaussianScaffold.build(fg, instances.blocks)
        self.energy = [energy.select(rows).to(self.device) for rows in self.rows]
        evidence = torch.zeros(fg.num_variables, dtype=torch.float64)  # cast once per state dtype in _in_dtype
        if fg.evidence:
            evidence[list(fg.evidence)] = torch.tensor(list(fg.evidence.values()), dtype=torch.float64)
        self.evidence = evidence
        self._by_dtype: dict[torch.dtype, tuple[list[Encoder], list[GaussianScaffold]]] = {}

    def _in_dtype(self, fg: FactorGraph, dtype: torch.dtype) -> tuple[list[Encoder], list[GaussianScaffold]]:
        """Each class's encoder and factor coefficients in the state's dtype (made once per dtype)."""
        if dtype not in self._by_dtype:
            state = self.evidence.to(self.device, dtype)
            self._by_dtype[dtype] = (
                [self.encoder.context_encoder(fg, inst, state) for inst in self.class_instances],
                [e.to(self.device, dtype) for e in self.energy],
            )
        return self._by_dtype[dtype]

    def sweep(self, fg: FactorGraph, state: Tensor, beta: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, int]:
        """Update every class once.

        Args:
            fg: the graph (its motif encoders are made at the first sweep of each state dtype).
            state: ``[K, n]`` states.
            beta: optional ``[K]`` inverse temperatures (targets ``p(x)^beta``).

        Returns:
            The states, accepted blocks per chain ``[K]``, the non-finite count and the proposals made.
        """
        chains, count, width = state.shape[0], len(self.sizes), len(self.rand_index[0])
        components, size = self.proposal.mdn.components, self.block_ids[0].shape[0] // width
        dtype = self.proposal.dtype
        uniforms = torch.rand(chains, count * width, components + 1, device=state.device, dtype=dtype)
        normals = torch.randn(chains, count * width, size, device=state.device, dtype=dtype)
        if self.padded:
            uniforms = uniforms.index_select(1, self.rand_flat)
            normals = normals.index_select(1, self.rand_flat)
        uniforms = uniforms.view(chains, count, width, components + 1).transpose(0, 1)
        gumbel = gumbel_from_uniform(uniforms[..., :components])  # [C, K, width, components]
        log_accept = uniforms[..., components].log().to(state.dtype)
        normals = normals.view(chains, count, width, size).transpose(0, 1)
        encoders, energy = self._in_dtype(fg, state.dtype)
        accepts: list[Tensor] = []
        broken: list[Tensor] = []
        with torch.no_grad():
            state = self._classes(state, encoders, energy, gumbel, normals, log_accept, beta, accepts, broken)
        accepted = (torch.stack(accepts, 1) & self.real).sum((1, 2))  # padded slots repeat a real one: not counted
        nonfinite = (torch.stack(broken, 1) & self.real).sum()
        return state, accepted, nonfinite, chains * sum(self.sizes)

    def _classes(
        self,
        state: Tensor,
        encoders: list[Encoder],
        energy: list[GaussianScaffold],
        gumbel: Tensor,
        normals: Tensor,
        log_accept: Tensor,
        beta: Tensor | None,
        accepts: list[Tensor],
        broken: list[Tensor],
    ) -> Tensor:
        """Run the class updates in order, appending each class's accept and broken-ratio indicators."""
        for c in range(len(self.sizes)):
            start = time.perf_counter() if self.compiled and self.compile_seconds == 0.0 else None
            state, acc, bad = self.update(
                state, self.proposal, encoders[c], self.context_ids[c], self.present[c], self.block_ids[c],
                energy[c], gumbel[c].contiguous(), normals[c].contiguous(), log_accept[c].contiguous(), beta,
            )  # fmt: skip
            if start is not None:
                self.compile_seconds = time.perf_counter() - start
            accepts.append(acc)
            broken.append(bad)
        return state
