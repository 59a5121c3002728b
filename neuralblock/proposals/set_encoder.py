"""A permutation-invariant encoder for contexts of any size: deep sets with attention pooling.

Some motifs condition on a *set* whose size depends on the model (e.g. every point of a
Gaussian mixture). They encode it as *tokens*: a fixed-width head of features followed by
``T`` tokens of ``token_features`` numbers each, flattened into one context vector
``[..., head + T * token_features]``, where ``T`` may differ from graph to graph. The last
number of every token is its presence (1 for a real element, 0 for padding).

:class:`SetPooling` maps the tokens to a fixed-width summary that does not depend on their
order or number:

* every token goes through a small MLP ``phi``;
* the summary holds the mean of ``phi`` over the present tokens, the log of their number,
  and, for each of ``heads`` attention heads, the attention-weighted means of ``phi`` and
  of the raw tokens (each head scores every token with a linear map of its ``phi`` and
  normalizes the scores over the present tokens with a softmax).

The raw tokens' weighted means let a head locate a group of tokens precisely (e.g. the
centroid of the points no mixture explains).

References:
    Zaheer et al. "Deep Sets". NeurIPS 2017. Lee et al. "Set Transformer". ICML 2019
    (pooling by attention).

Example:
    >>> import torch
    >>> pool = SetPooling(token_features=3, hidden=8, heads=2)
    >>> tokens = torch.randn(5, 7, 3)
    >>> tokens[..., -1] = 1.0  # every token present
    >>> out = pool(tokens)
    >>> out.shape, bool(torch.allclose(out, pool(tokens[:, torch.randperm(7)]), atol=1e-5))
    (torch.Size([5, 31]), True)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SetPooling", "check_set_encoder"]

_SET_KEYS = ("token_features", "hidden", "heads")


def check_set_encoder(config: Any) -> dict[str, int]:
    """A set encoder's configuration ``{"token_features", "hidden", "heads"}``, checked.

    Raises:
        ValueError: a configuration that is not a dict of those three positive integers
            (``token_features`` at least 2: values and the presence flag).

    Example:
        >>> check_set_encoder({"token_features": 5, "hidden": 32, "heads": 4})
        {'token_features': 5, 'hidden': 32, 'heads': 4}
    """
    if not isinstance(config, dict) or sorted(config) != sorted(_SET_KEYS):
        raise ValueError(f"a set encoder is configured by {list(_SET_KEYS)}, got {config!r}")
    values = {key: config[key] for key in _SET_KEYS}
    bad = [k for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad or values["token_features"] < 2:
        raise ValueError(f"set encoder options must be positive integers (token_features >= 2), got {config!r}")
    return values


class SetPooling(nn.Module):
    """Deep-sets encoder with attention pooling over tokens ``[..., T, token_features]`` (last = presence).

    Args:
        token_features: numbers per token, the presence flag last.
        hidden: width of the token MLP ``phi``.
        heads: attention heads.
    """

    def __init__(self, token_features: int, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        check_set_encoder({"token_features": token_features, "hidden": hidden, "heads": heads})
        self.token_features, self.hidden, self.heads = int(token_features), int(hidden), int(heads)
        self.phi = nn.Sequential(nn.Linear(token_features, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.score = nn.Linear(hidden, heads)

    @property
    def out_features(self) -> int:
        """Width of the summary: mean of ``phi``, log count, and per head ``phi`` and token means."""
        return self.hidden + 1 + self.heads * (self.hidden + self.token_features)

    def config(self) -> dict[str, int]:
        """Constructor arguments (for the proposal sidecar)."""
        return {"token_features": self.token_features, "hidden": self.hidden, "heads": self.heads}

    def forward(self, tokens: Tensor) -> Tensor:
        """The summary ``[..., out_features]`` of tokens ``[..., T, token_features]``."""
        present = tokens[..., -1:] > 0.5  # [..., T, 1]
        weight = present.to(tokens.dtype)
        count = weight.sum(-2)  # [..., 1]
        phi = self.phi(tokens)  # [..., T, H]
        mean = (phi * weight).sum(-2) / count.clamp(min=1.0)
        scores = self.score(phi).masked_fill(~present, -torch.inf)  # [..., T, A]
        attention = torch.softmax(scores, -2).nan_to_num(0.0)  # no present token: all zero
        pooled_phi = attention.transpose(-1, -2) @ phi  # [..., A, H]
        pooled_tokens = attention.transpose(-1, -2) @ tokens  # [..., A, F]
        pooled = torch.cat([pooled_phi, pooled_tokens], -1).flatten(-2)
        return torch.cat([mean, torch.log1p(count), pooled], -1)
