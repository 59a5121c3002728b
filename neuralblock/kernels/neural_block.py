"""Neural block MCMC: MH with meta-learned MDN block proposals, mixed with single-site updates.

References:
    Wang, Wu, Moore, Russell. "Meta-Learning MCMC Proposals", NeurIPS 2018.

Example:
    >>> import torch, pyro
    >>> from pyro.infer import MCMC
    >>> from neuralblock import FactorGraph
    >>> from neuralblock.motif import BlockSpec, Motif, MotifInstances
    >>> from neuralblock.proposals import NeuralBlockProposal
    >>> class Pair(Motif):  # two neighbouring binary variables, conditioned on nothing
    ...     name, block_spec, feature_dim = "pair-doc", BlockSpec([2, 2]), 1
    ...     def options(self): return {}
    ...     def find_instances(self, fg):
    ...         return MotifInstances(torch.tensor([[0, 1]]), torch.full((1, 1), -1), torch.zeros(1, 0))
    ...     def encode(self, fg, instances, state): return torch.zeros(state.shape[:-1] + (len(instances), 1))
    ...     def sample_training_batch(self, batch_size, generator): raise NotImplementedError
    >>> fg = FactorGraph(); _ = fg.add_variables(2, cardinality=2)
    >>> _ = fg.add_table_factor([0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    >>> kernel = NeuralBlockKernel(fg, proposals=[NeuralBlockProposal(Pair(), components=2, hidden=(8,))])
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run()
    >>> sorted(kernel.diagnostics()["acceptance"])
    ['pair-doc']
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from neuralblock.graph import BlockScaffold, FactorGraph
from neuralblock.kernels.base import GraphKernel
from neuralblock.kernels.functional import MHInfo, mh_accept
from neuralblock.kernels.single_site import SingleSiteSweep
from neuralblock.motif import MotifInstances
from neuralblock.proposals import NeuralBlockProposal

__all__ = ["NeuralBlockKernel", "neural_block_step"]


@dataclass
class _BlockClass:
    """One colour class of one proposal's motif instances."""

    instances: MotifInstances
    scaffold: BlockScaffold
    flat_blocks: Tensor
    members: Tensor


def neural_block_step(
    fg: FactorGraph,
    proposal: NeuralBlockProposal,
    instances: MotifInstances,
    scaffold: BlockScaffold,
    state: Tensor,
) -> tuple[Tensor, MHInfo]:
    """Propose and accept every block of one conflict-free class at once.

    One batched MDN forward pass proposes all blocks; one batched scaffold evaluation
    scores current and proposed blocks; one vectorized MH test accepts each block by
    its own exact ratio ``p(B') q(B | C) / (p(B) q(B' | C))``. The conditioning set ``C``
    does not change when ``B`` does, so the reverse proposal uses the same ``q``. Motifs
    with a whitening map (:meth:`~neuralblock.motif.Motif.block_affine`) propose
    ``B = loc + L u`` with ``u ~ q``; the map depends only on ``C`` and ``Psi``.

    Args:
        fg: the graph.
        proposal: the neural block proposal.
        instances: the class's motif instances (pairwise non-conflicting).
        scaffold: ``fg.scaffold(instances.blocks)``.
        state: the current state ``[n]``.

    Returns:
        The new state and the :class:`MHInfo` of the class.
    """
    with torch.no_grad():
        features, affine = proposal.motif.encode_with_affine(fg, instances, state)
        q = proposal(features)
        current = state[instances.blocks]
        if affine is None:
            proposed = q.sample().to(state.dtype)
            log_q_fwd, log_q_rev = q.log_prob(torch.stack([proposed, current])).unbind(0)
        else:  # B = loc + L u; the Jacobian |L| is the same both ways and cancels in the ratio
            loc, tril = affine
            u_new = q.sample().to(state.dtype)
            proposed = loc + (tril @ u_new.unsqueeze(-1)).squeeze(-1)
            u_cur = torch.linalg.solve_triangular(tril, (current - loc).unsqueeze(-1), upper=False).squeeze(-1)
            log_q_fwd, log_q_rev = q.log_prob(torch.stack([u_new, u_cur])).unbind(0)
        pair = torch.stack([state, state])
        pair[1, instances.blocks] = proposed
        local = scaffold.local_log_density(fg, pair)
        info = mh_accept(local[1] - local[0] + (log_q_rev - log_q_fwd).to(local.dtype))
    new_state = state.clone()
    new_state[instances.blocks] = torch.where(info.accepted[:, None], proposed, current)
    return new_state, info


class NeuralBlockKernel(GraphKernel):
    """MH with neural block proposals over every motif instance, mixed with single-site updates.

    At ``setup`` each proposal's motif finds its instances in the model's factor graph
    (any size). Instances are coloured so that no instance writes a variable another
    one in its class reads (block, Markov blanket or motif context); each class is
    then proposed and accepted as one batch (:func:`neural_block_step`). Each
    transition is, with probability ``gibbs_prob``, a single-site sweep (Gibbs for
    discrete latent variables, random-walk MH for continuous ones) and otherwise a
    neural sweep over all proposals' classes. Both are exact MH/Gibbs kernels, so
    the mixture leaves the target invariant.

    Args:
        model: a :class:`FactorGraph` or a Pyro model with scalar sites.
        proposals: the neural block proposals (e.g. from :func:`neuralblock.load_pretrained`).
        gibbs_prob: probability of a single-site sweep per transition.
        step_size: initial random-walk step for continuous single-site updates.
    """

    def __init__(
        self,
        model: FactorGraph | Callable,
        proposals: Sequence[NeuralBlockProposal],
        gibbs_prob: float = 0.5,
        step_size: float = 0.5,
    ) -> None:
        super().__init__(model)
        proposals = list(proposals)
        if not proposals:
            raise ValueError("NeuralBlockKernel needs at least one proposal")
        for p in proposals:
            if not isinstance(p, NeuralBlockProposal):
                raise TypeError(f"proposals must be NeuralBlockProposal objects, got {type(p).__name__}")
        if not 0.0 <= gibbs_prob <= 1.0:
            raise ValueError(f"gibbs_prob must be in [0, 1], got {gibbs_prob}")
        self.proposals = [p.eval() for p in proposals]
        self.gibbs_prob = float(gibbs_prob)
        self.step_size = float(step_size)

    def _label(self, i: int) -> str:
        name = self.proposals[i].motif.name
        same = [j for j, p in enumerate(self.proposals) if p.motif.name == name]
        return name if len(same) == 1 else f"{name}#{same.index(i)}"

    def _prepare(self, fg: FactorGraph) -> None:
        latent = set(fg.latent.tolist())
        cards = fg.cardinalities
        self.block_classes: list[list[_BlockClass]] = []
        self.num_instances: list[int] = []
        for proposal in self.proposals:
            motif = proposal.motif
            instances = motif.find_instances(fg)
            blocks = instances.blocks
            if blocks.dim() != 2 or blocks.shape[1] != motif.block_spec.size:
                raise ValueError(f"motif {motif.name} returned blocks of shape {tuple(blocks.shape)}")
            expected = torch.tensor(motif.block_spec.cardinalities, dtype=torch.long)
            if len(instances) and not (cards[blocks] == expected).all():
                raise ValueError(f"motif {motif.name} found blocks whose domains differ from its block spec {expected}")
            if any(int(v) not in latent for v in blocks.reshape(-1).tolist()):
                raise ValueError(f"motif {motif.name} proposed a block containing an observed variable")
            classes = []
            for members in fg.color_blocks(blocks, reads=instances.context):
                sub = instances.select(members)
                classes.append(_BlockClass(sub, fg.scaffold(sub.blocks), sub.blocks.reshape(-1), members))
            self.block_classes.append(classes)
            self.num_instances.append(len(instances))
        if sum(self.num_instances) == 0:
            names = ", ".join(p.motif.name for p in self.proposals)
            raise ValueError(f"no instance of the proposals' motifs ({names}) was found in this model")
        self.single_site = SingleSiteSweep(fg, self.step_size, "NeuralBlockKernel")
        if self.gibbs_prob == 0.0:
            covered = set()
            for classes in self.block_classes:
                for cls in classes:
                    covered.update(cls.flat_blocks.tolist())
            missed = [fg.names[v] for v in sorted(latent - covered)]
            if missed:
                warnings.warn(
                    f"NeuralBlockKernel with gibbs_prob=0 never updates {len(missed)} latent variables that lie in "
                    f"no motif block (e.g. {missed[:3]}): the chain is not ergodic; use gibbs_prob > 0",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _refresh(self, fg: FactorGraph) -> None:
        """Re-read the instances' parameters (same blocks, classes, scaffolds and step sizes)."""
        for proposal, classes in zip(self.proposals, self.block_classes):
            instances = proposal.motif.find_instances(fg)
            for cls in classes:
                sub = instances.select(cls.members)
                if not torch.equal(sub.blocks, cls.instances.blocks):
                    raise ValueError(f"motif {proposal.motif.name} found other blocks after the graph's update")
                cls.instances = sub

    def _reset_stats(self) -> None:
        n = len(self.proposals)
        self._proposed = [0] * n
        self._accepted = [0] * n
        self._nonfinite = [0] * n
        self._recent = [0.0] * n
        self._block_seconds = 0.0
        self._single_sweeps = 0

    def _transition(self, state: Tensor, warmup: bool) -> Tensor:
        fg = self._graph()
        if float(torch.rand(())) < self.gibbs_prob:
            state = self.single_site.sweep(fg, state, adapt=warmup)
            if not warmup:
                self._single_sweeps += 1
            return state
        start = time.perf_counter()
        for i, (proposal, classes) in enumerate(zip(self.proposals, self.block_classes)):
            accepted, proposed, nonfinite = 0, 0, 0
            for cls in classes:
                state, info = neural_block_step(fg, proposal, cls.instances, cls.scaffold, state)
                accepted += int(info.accepted.sum())
                proposed += int(info.accepted.numel())
                nonfinite += info.num_nonfinite
            self._recent[i] = accepted / max(proposed, 1)
            if not warmup:
                self._accepted[i] += accepted
                self._proposed[i] += proposed
                self._nonfinite[i] += nonfinite
        if not warmup:
            self._block_seconds += time.perf_counter() - start
        return state

    def logging(self) -> dict[str, float]:
        """Latest acceptance rate per proposal (cheap)."""
        return {f"acc_{self._label(i)}": round(a, 3) for i, a in enumerate(self._recent)}

    def diagnostics(self) -> dict:
        """Post-warmup acceptance per motif, block proposals per second, non-finite rejections."""
        proposed = sum(self._proposed)
        return {
            "acceptance": {
                self._label(i): (self._accepted[i] / self._proposed[i] if self._proposed[i] else 0.0)
                for i in range(len(self.proposals))
            },
            "instances": {self._label(i): n for i, n in enumerate(self.num_instances)},
            "blocks_per_second": proposed / self._block_seconds if self._block_seconds > 0 else 0.0,
            "nonfinite_rejections": float(sum(self._nonfinite)),
            "single_site_sweeps": float(self._single_sweeps),
        }
