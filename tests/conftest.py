"""Shared fixtures: every test starts from a fixed seed."""

import pyro
import pytest
import torch

# Kernels work on small tensors, where intra-op threads only add contention.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    torch.set_default_dtype(torch.float32)
    yield
