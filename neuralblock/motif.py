"""The abstract motif protocol the engine uses to reach concrete motifs.

A *structural motif* names a block ``B`` of variables, its conditioning set ``C``
(usually the Markov blanket) and its local parameters ``Psi`` (the numbers of the
scaffold factors). A motif

* finds its instances in any :class:`~neuralblock.graph.FactorGraph`
  (:meth:`Motif.find_instances`), whatever the graph's size;
* encodes ``(C values, Psi)`` of many instances into network inputs with one gather
  (:meth:`Motif.encode`);
* samples random instantiations with ``(B, C)`` from the local joint, for
  meta-training (:meth:`Motif.sample_training_batch`).

Concrete motifs live in the top-level ``motifs`` package. The engine never imports
it: motifs register themselves with :func:`register_motif`, and
:func:`get_motif` falls back to the ``neuralblock.motifs`` entry-point group.

Example:
    >>> spec = BlockSpec([2, 2, 0])
    >>> spec.discrete, spec.continuous
    ([0, 1], [2])
"""

from __future__ import annotations

import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from neuralblock.graph import FactorGraph

__all__ = [
    "BlockSpec",
    "Motif",
    "MotifInstances",
    "TrainingBatch",
    "get_motif",
    "motif_names",
    "register_motif",
]


@dataclass(frozen=True)
class BlockSpec:
    """Domains of the block variables, in block order: ``k`` for k-ary discrete, ``0`` for continuous.

    ``scale_groups`` optionally gives each continuous variable (in block order) a group
    id ``0 .. G-1``; a proposal's Gaussian is then isotropic within each group, with one
    scale per group and component (e.g. one per mixture mean of a GMM pair, so an
    inactive mean can stay broad while an active one is sharp). ``None`` is one group.
    """

    cardinalities: list[int]
    scale_groups: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.cardinalities:
            raise ValueError("a block needs at least one variable")
        if any(int(k) != k or k < 0 or k == 1 for k in self.cardinalities):
            raise ValueError(f"block cardinalities must be 0 (continuous) or >= 2, got {self.cardinalities}")
        if self.scale_groups is not None:
            groups = list(self.scale_groups)
            if len(groups) != len(self.continuous) or sorted(set(groups)) != list(range(len(set(groups)))):
                raise ValueError(
                    f"scale_groups must give each of the {len(self.continuous)} continuous variables a group id "
                    f"0..G-1 (every id used), got {self.scale_groups}"
                )

    @property
    def size(self) -> int:
        """Number of block variables."""
        return len(self.cardinalities)

    @property
    def discrete(self) -> list[int]:
        """Positions of the discrete block variables."""
        return [i for i, k in enumerate(self.cardinalities) if k > 0]

    @property
    def continuous(self) -> list[int]:
        """Positions of the continuous block variables."""
        return [i for i, k in enumerate(self.cardinalities) if k == 0]

    def enumerate(self) -> Tensor:
        """All joint values of an all-discrete block, ``[K, b]`` (first variable slowest)."""
        if self.continuous:
            raise ValueError("cannot enumerate a block with continuous variables")
        grids = torch.meshgrid(*[torch.arange(k) for k in self.cardinalities], indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], -1).to(torch.get_default_dtype())


@dataclass
class MotifInstances:
    """Instances of a motif found in one graph.

    Attributes:
        blocks: ``LongTensor [I, b]`` block variable ids, in block order.
        context: ``LongTensor [I, c]`` conditioning variable ids, ``-1`` where absent.
        params: ``Tensor [I, p]`` encoded local parameters ``Psi`` (static for a graph).
        extra: motif-specific precomputed tensors.
    """

    blocks: Tensor
    context: Tensor
    params: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def select(self, index: Tensor) -> MotifInstances:
        """The instances at ``index``."""
        return MotifInstances(
            self.blocks[index],
            self.context[index],
            self.params[index],
            {k: v[index] for k, v in self.extra.items()},
        )


@dataclass
class TrainingBatch:
    """Random instantiations for meta-training.

    Attributes:
        features: ``[B, feature_dim]`` network inputs (encoded ``C`` values and ``Psi``).
        block: ``[B, b]`` block values drawn from the exact conditional ``p(B | C, Psi)``.
        log_p: optional ``[B, K]`` exact conditional log-probabilities of the ``K``
            enumerated block values (:meth:`BlockSpec.enumerate` order), for blocks small
            enough to enumerate. Trainers then use the exact expectation of ``-log q``.
        log_p_fn: optional callable ``values [S, B, b] -> [S, B]`` giving the exact (or
            unnormalized) conditional log-density of arbitrary block values, used to
            estimate MH acceptance of non-enumerable blocks.
        exact_log_p: optional ``[B]`` normalized exact conditional log-density of ``block``
            (NaN where it is not known in closed form), for the NLL gap ``E[log p - log q]``
            of continuous blocks.
    """

    features: Tensor
    block: Tensor
    log_p: Tensor | None = None
    log_p_fn: Callable[[Tensor], Tensor] | None = None
    exact_log_p: Tensor | None = None


class Motif(ABC):
    """A structural motif: block, conditioning set, local parameters, instantiations.

    Subclasses set ``name`` and ``version`` and implement the abstract methods.
    ``spec()`` must be JSON-serializable and determine the network's input and
    output shapes; proposal files are checked against it on load.
    """

    name: str = ""
    version: int = 1

    @property
    @abstractmethod
    def block_spec(self) -> BlockSpec:
        """Domains of the block variables."""

    @property
    @abstractmethod
    def feature_dim(self) -> int:
        """Width of the encoded ``(C, Psi)`` network input."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The motif's constructor options (JSON-serializable)."""

    @abstractmethod
    def find_instances(self, fg: FactorGraph) -> MotifInstances:
        """Every instance of the motif in ``fg``.

        Each block holds distinct latent variables whose domains match :attr:`block_spec`
        (continuous ones with real-line support); context ids are variables or ``-1`` padding.
        :class:`~neuralblock.kernels.NeuralBlockKernel` rejects instances that break this.
        """

    @abstractmethod
    def encode(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> Tensor:
        """Network inputs ``[..., I, feature_dim]`` for states ``[..., n]``."""

    @abstractmethod
    def sample_training_batch(self, batch_size: int, generator: torch.Generator) -> TrainingBatch:
        """``batch_size`` random instantiations with ``(B, C)`` from the local joint."""

    @property
    def set_encoder(self) -> dict[str, int] | None:
        """Optional set encoder ``{"token_features", "hidden", "heads"}`` for contexts of any size.

        A motif that returns one encodes ``feature_dim`` head numbers followed by any number
        of tokens of ``token_features`` numbers each (the last one 1 for present, 0 for
        padding); its proposal pools them with
        :class:`~neuralblock.proposals.set_encoder.SetPooling`. The default (``None``) is a
        fixed-width context.
        """
        return None

    def block_affine(self, fg: FactorGraph, instances: MotifInstances, state: Tensor) -> tuple[Tensor, Tensor] | None:
        """Optional whitening of continuous blocks: ``(loc [..., I, b], scale_tril [..., I, b, b])``.

        When a motif returns a map here, its network models ``u`` with block values
        ``B = loc + scale_tril @ u``; ``loc`` and ``scale_tril`` may depend on the
        conditioning values and ``Psi`` but never on ``B`` itself, so the forward and
        reverse proposal densities share the Jacobian and the MH ratio needs only ``q(u)``.
        Training batches of such a motif hold ``u``, not ``B``. The default (``None``) is
        the identity.
        """
        return None

    def encode_with_affine(
        self, fg: FactorGraph, instances: MotifInstances, state: Tensor
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """:meth:`encode` and :meth:`block_affine` together (override to share their work)."""
        return self.encode(fg, instances, state), self.block_affine(fg, instances, state)

    def describe(self) -> str:
        """What structure the motif looks for, in words (shown when a model has no instance).

        Motifs override it with their pattern; the default names the block's domains.

        Example:
            >>> class Pair(Motif):
            ...     name, block_spec, feature_dim = "pair", BlockSpec([2, 3]), 1
            ...     def options(self): return {}
            ...     def find_instances(self, fg): raise NotImplementedError
            ...     def encode(self, fg, instances, state): raise NotImplementedError
            ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
            >>> Pair().describe()
            'blocks of 2 variables with domains [2, 3] (0 = continuous)'
        """
        spec = self.block_spec
        return f"blocks of {spec.size} variables with domains {list(spec.cardinalities)} (0 = continuous)"

    def spec(self) -> dict[str, Any]:
        """JSON description checked against proposal files."""
        spec = {
            "name": self.name,
            "version": self.version,
            "options": self.options(),
            "block_cardinalities": list(self.block_spec.cardinalities),
            "feature_dim": self.feature_dim,
        }
        if self.block_spec.scale_groups is not None:
            spec["scale_groups"] = list(self.block_spec.scale_groups)
        if self.set_encoder is not None:
            spec["set_encoder"] = dict(self.set_encoder)
        return spec

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


_REGISTRY: dict[str, Callable[..., Motif]] = {}
ENTRY_POINT_GROUP = "neuralblock.motifs"


def register_motif(name: str, factory: Callable[..., Motif]) -> None:
    """Register a motif factory under ``name`` (called by motif packages on import)."""
    if not name or not callable(factory):
        raise ValueError(f"cannot register motif {name!r}: need a name and a callable factory")
    _REGISTRY[name] = factory


def _load_entry_points() -> None:
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _REGISTRY:
            _REGISTRY[entry.name] = entry.load()


def motif_names() -> list[str]:
    """Names of all known motifs (registered or installed as entry points)."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get_motif(name: str, **options: Any) -> Motif:
    """Build the motif ``name`` with its options.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones) or bad options.
    """
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(f"unknown motif {name!r}; valid motifs: {', '.join(sorted(_REGISTRY)) or '(none)'}")
    try:
        return _REGISTRY[name](**options)
    except TypeError as err:
        raise ValueError(f"bad options {options} for motif {name!r}: {err}") from err
