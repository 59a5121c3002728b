"""Mixture density network over a block of discrete and continuous variables.

``MixtureDensityNetwork(context)`` returns a :class:`BlockMixture`: explicit mixture
weights; inside each component the bounded discrete variables are independent
categoricals and the continuous variables an isotropic Gaussian whose variance is
floored at ``1e-5`` (isotropic within each *scale group* when the block declares
several, e.g. one per mixture mean). Everything is computed in log space.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch
    >>> mdn = MixtureDensityNetwork(in_features=5, block_cardinalities=[2, 3, 0], components=4)
    >>> q = mdn(torch.randn(7, 5))
    >>> x = q.sample()
    >>> x.shape, q.log_prob(x).shape
    (torch.Size([7, 3]), torch.Size([7]))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributions import Distribution, constraints

from neuralblock.exact.chain import gumbel_argmax
from neuralblock.motif import BlockSpec
from neuralblock.proposals.set_encoder import SetPooling, check_set_encoder

__all__ = ["BlockMixture", "MixtureDensityNetwork"]

MIN_VARIANCE = 1e-5
_MIN_LOG_SCALE = 0.5 * math.log(MIN_VARIANCE)
_MAX_LOG_SCALE = 8.0
_FEATURE_CLIP = 1e4


class BlockMixture(Distribution):
    """A mixture over blocks: categorical and isotropic-Gaussian parts per component.

    Args:
        mixture_logits: ``[..., K]``.
        discrete_logits: ``[..., K, D, k_max]`` (entries past a variable's cardinality are ``-inf``) or ``None``.
        loc: ``[..., K, C]`` or ``None``.
        log_scale: ``[..., K]`` log standard deviation of each component's Gaussian, or
            ``[..., K, G]`` with one per scale group, or ``None``.
        cardinalities: the block's domains, in block order (0 = continuous).
        scale_groups: group id of each continuous variable (default: all in group 0).
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = False

    def __init__(
        self,
        mixture_logits: Tensor,
        discrete_logits: Tensor | None,
        loc: Tensor | None,
        log_scale: Tensor | None,
        cardinalities: Sequence[int],
        scale_groups: Sequence[int] | None = None,
    ) -> None:
        self.cardinalities = list(cardinalities)
        self.discrete_pos = [i for i, k in enumerate(self.cardinalities) if k > 0]
        self.continuous_pos = [i for i, k in enumerate(self.cardinalities) if k == 0]
        self.mixture_log_weights = torch.log_softmax(mixture_logits, -1)
        self.discrete_log_probs = None if discrete_logits is None else torch.log_softmax(discrete_logits, -1)
        self.loc = loc
        self.log_scale = None  # [..., K, C]: one log standard deviation per component and continuous variable
        if log_scale is not None:
            if log_scale.dim() == mixture_logits.dim():
                log_scale = log_scale.unsqueeze(-1)
            groups = torch.as_tensor(
                list(scale_groups) if scale_groups is not None else [0] * len(self.continuous_pos),
                dtype=torch.long,
                device=log_scale.device,
            )
            self.log_scale = log_scale.clamp(_MIN_LOG_SCALE, _MAX_LOG_SCALE)[..., groups]
        super().__init__(mixture_logits.shape[:-1], torch.Size([len(self.cardinalities)]), validate_args=False)

    @property
    def num_components(self) -> int:
        """Number of mixture components."""
        return int(self.mixture_log_weights.shape[-1])

    def component_log_prob(self, value: Tensor) -> Tensor:
        """``log p(value | component)`` for every component, ``[..., K]``."""
        out = torch.zeros((), dtype=self.mixture_log_weights.dtype)
        if self.discrete_log_probs is not None:
            index = value.index_select(-1, self._positions(self.discrete_pos)).long()  # [..., D]
            chosen = _take(self.discrete_log_probs, index[..., None, :, None], -1)  # [..., K, D, 1]
            out = out + chosen.squeeze(-1).sum(-1)
        if self.loc is not None and self.log_scale is not None:
            x = value.index_select(-1, self._positions(self.continuous_pos)).unsqueeze(-2)  # [..., 1, C]
            z = (x - self.loc) * torch.exp(-self.log_scale)
            dim = len(self.continuous_pos)
            out = out + (-0.5 * (z * z).sum(-1) - self.log_scale.sum(-1) - 0.5 * dim * math.log(2 * math.pi))
        return out

    def _positions(self, positions: list[int]) -> Tensor:
        """Block positions as an index tensor on the distribution's device (made once per pattern)."""
        return _index_tensor(tuple(positions), self.mixture_log_weights.device)

    def log_prob(self, value: Tensor) -> Tensor:
        """Mixture log-density of block values ``[..., b]`` (log-sum-exp over components)."""
        if value.shape[-1] != len(self.cardinalities):
            raise ValueError(f"block values must end in {len(self.cardinalities)}, got shape {tuple(value.shape)}")
        return torch.logsumexp(self.mixture_log_weights + self.component_log_prob(value), -1)

    def component_posterior(self, value: Tensor) -> Tensor:
        """Log responsibility of each component for ``value``, ``[..., K]``."""
        joint = self.mixture_log_weights + self.component_log_prob(value)
        return joint - torch.logsumexp(joint, -1, keepdim=True)

    @torch.no_grad()
    def sample(self, sample_shape: torch.Size | Sequence[int] = ()) -> Tensor:
        """Draw block values ``sample_shape + batch_shape + [b]`` from torch's global RNG."""
        shape = torch.Size(sample_shape) + self.batch_shape
        comp = gumbel_argmax(self.mixture_log_weights.expand(shape + (self.num_components,)))  # shape
        parts, positions = [], []
        if self.discrete_log_probs is not None:
            chosen = _take(self.discrete_log_probs, comp[..., None, None, None], -3)  # [..., 1, D, k]
            parts.append(gumbel_argmax(chosen.squeeze(-3)).to(self.mixture_log_weights.dtype))
            positions += self.discrete_pos
        if self.loc is not None and self.log_scale is not None:
            pick = comp[..., None, None]
            mean = _take(self.loc, pick, -2).squeeze(-2)
            std = _take(self.log_scale, pick, -2).squeeze(-2).exp()
            parts.append(mean + std * torch.randn_like(mean))
            positions += self.continuous_pos
        order = sorted(range(len(positions)), key=positions.__getitem__)  # parts' columns in block order
        return torch.cat(parts, -1).index_select(-1, _index_tensor(tuple(order), comp.device))


def _take(source: Tensor, index: Tensor, dim: int) -> Tensor:
    """``torch.take_along_dim`` with the batch dimensions of either side broadcast (the lower-rank one left-padded)."""
    rank = max(source.dim(), index.dim())
    source = source.reshape((1,) * (rank - source.dim()) + source.shape)
    return torch.take_along_dim(source, index.reshape((1,) * (rank - index.dim()) + index.shape), dim)


@functools.lru_cache(maxsize=256)
def _index_tensor(positions: tuple[int, ...], device: torch.device) -> Tensor:
    """``positions`` as a long tensor on ``device`` (cached: block layouts repeat on every call)."""
    return torch.tensor(positions, dtype=torch.long, device=device)


class MixtureDensityNetwork(nn.Module):
    """An MLP mapping a context vector to a :class:`BlockMixture` over the block.

    Args:
        in_features: width of the context (encoded conditioning values and local parameters).
        block_cardinalities: the block's domains (``k`` discrete, ``0`` continuous).
        components: number of mixture components.
        hidden: widths of the hidden layers.
        scale_groups: optional group id per continuous variable (one Gaussian scale per
            group and component); ``None`` gives one isotropic scale.
        set_encoder: optional ``{"token_features", "hidden", "heads"}``: contexts are then
            ``in_features`` head numbers followed by any number of tokens, pooled by a
            :class:`~neuralblock.proposals.set_encoder.SetPooling` before the MLP.

    Example:
        >>> net = MixtureDensityNetwork(3, [2, 2], components=2, hidden=(16,))
        >>> net(torch.zeros(3)).log_prob(torch.tensor([1.0, 0.0])).shape
        torch.Size([])
    """

    def __init__(
        self,
        in_features: int,
        block_cardinalities: Sequence[int],
        components: int = 8,
        hidden: Sequence[int] = (128, 128),
        scale_groups: Sequence[int] | None = None,
        set_encoder: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        cards = [int(k) for k in block_cardinalities]
        self.scale_groups = None if scale_groups is None else [int(g) for g in scale_groups]
        if self.scale_groups is not None:
            BlockSpec(cards, self.scale_groups)  # raises a clear ValueError for bad groups
        num_groups = 1 if self.scale_groups is None else len(set(self.scale_groups))
        if in_features < 1 or components < 1 or not cards or any(k < 0 or k == 1 for k in cards):
            raise ValueError(
                f"bad MDN shape: in_features={in_features}, components={components}, cardinalities={cards}"
            )
        self.in_features, self.cardinalities, self.components = int(in_features), cards, int(components)
        self.hidden = [int(h) for h in hidden]
        self.num_discrete = sum(k > 0 for k in cards)
        self.num_continuous = sum(k == 0 for k in cards)
        self.k_max = max([k for k in cards if k > 0], default=0)
        self.set_pooling = None if set_encoder is None else SetPooling(**check_set_encoder(set_encoder))
        layers: list[nn.Module] = []
        width = self.in_features + (0 if self.set_pooling is None else self.set_pooling.out_features)
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.mixture_head = nn.Linear(width, components)
        discrete_width = components * self.num_discrete * self.k_max
        self.discrete_head = nn.Linear(width, discrete_width) if self.num_discrete else None
        self.loc_head = nn.Linear(width, components * self.num_continuous) if self.num_continuous else None
        self.num_scale_groups = num_groups
        self.scale_head = nn.Linear(width, components * num_groups) if self.num_continuous else None
        mask = torch.tensor([[j >= k for j in range(self.k_max)] for k in cards if k > 0], dtype=torch.bool)
        self.register_buffer("_invalid", mask.reshape(self.num_discrete, self.k_max), persistent=False)

    def config(self) -> dict:
        """Constructor arguments (for the proposal sidecar)."""
        config: dict = {
            "in_features": self.in_features,
            "block_cardinalities": self.cardinalities,
            "components": self.components,
            "hidden": self.hidden,
        }
        if self.scale_groups is not None:
            config["scale_groups"] = self.scale_groups
        if self.set_pooling is not None:
            config["set_encoder"] = self.set_pooling.config()
        return config

    def forward(self, context: Tensor) -> BlockMixture:
        """The proposal distribution for contexts ``[..., in_features]`` (then tokens, with a set encoder)."""
        context = torch.nan_to_num(context, nan=0.0).clamp(-_FEATURE_CLIP, _FEATURE_CLIP)
        h = self.trunk(self._inputs(context))
        batch, k = h.shape[:-1], self.components
        discrete = None
        if self.discrete_head is not None:
            discrete = self.discrete_head(h).reshape(*batch, k, self.num_discrete, self.k_max)
            discrete = discrete.masked_fill(self._invalid, -float("inf"))
        loc = None if self.loc_head is None else self.loc_head(h).reshape(*batch, k, self.num_continuous)
        log_scale = None
        if self.scale_head is not None:
            log_scale = self.scale_head(h).reshape(*batch, k, self.num_scale_groups)
        return BlockMixture(self.mixture_head(h), discrete, loc, log_scale, self.cardinalities, self.scale_groups)

    def _inputs(self, context: Tensor) -> Tensor:
        """The MLP's input: the context itself, or its head beside the pooled tokens."""
        width = context.shape[-1]
        if self.set_pooling is None:
            if width != self.in_features:
                raise ValueError(f"context must end in {self.in_features} features, got shape {tuple(context.shape)}")
            return context
        token = self.set_pooling.token_features
        if width < self.in_features or (width - self.in_features) % token:
            raise ValueError(
                f"context must end in {self.in_features} head features followed by tokens of {token} numbers, "
                f"got shape {tuple(context.shape)}"
            )
        head, tokens = context[..., : self.in_features], context[..., self.in_features :]
        pooled = self.set_pooling(tokens.reshape(tokens.shape[:-1] + (-1, token)))
        return torch.cat([head, pooled], -1)
