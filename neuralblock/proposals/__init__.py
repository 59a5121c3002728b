"""Neural block proposals: the MDN, proposal files and the pretrained library."""

from neuralblock.proposals.library import (
    list_pretrained,
    load_pretrained,
    load_proposal,
    pretrained_dir,
    pretrained_index,
)
from neuralblock.proposals.mdn import BlockMixture, MixtureDensityNetwork
from neuralblock.proposals.proposal import (
    FORMAT_VERSION,
    NeuralBlockProposal,
    atomic_write_bytes,
    code_commit,
    proposal_files,
)

__all__ = [
    "FORMAT_VERSION",
    "BlockMixture",
    "MixtureDensityNetwork",
    "NeuralBlockProposal",
    "atomic_write_bytes",
    "code_commit",
    "list_pretrained",
    "load_pretrained",
    "load_proposal",
    "pretrained_dir",
    "pretrained_index",
    "proposal_files",
]
