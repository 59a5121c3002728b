"""Meta-training of neural block proposals (the ``train-motif`` CLI and its library API).

Example:
    >>> from trainers import TrainConfig
    >>> TrainConfig(motif="grid", steps=10).steps
    10
"""

from trainers.metrics import enumerated_log_q, exact_kl, expected_acceptance, expected_nll, mc_acceptance
from trainers.trainer import ConfigError, TrainConfig, evaluate, load_checkpoint, resolve_device, train

__all__ = [
    "ConfigError",
    "TrainConfig",
    "enumerated_log_q",
    "evaluate",
    "exact_kl",
    "expected_acceptance",
    "expected_nll",
    "load_checkpoint",
    "mc_acceptance",
    "resolve_device",
    "train",
]
