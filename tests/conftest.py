"""Shared fixtures: every test starts from a fixed seed."""

import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import pyro
import pytest
import torch

# Kernels work on small tensors, where intra-op threads only add contention.
torch.set_num_threads(1)

# pyro.infer.MCMC logs every step's kernel.logging() as an INFO record (its progress bar's postfix), a fifth of a
# Gibbs step on Grids_11 (benchmarks/mcmc_overhead.py). The tests never read those records; hook_fn and the JSON
# encoding of kernel.logging() still run on every step.
logging.getLogger("pyro.infer.mcmc").setLevel(logging.WARNING)


def _compile_each_numba_function_once_across_workers() -> None:
    """Under pytest-xdist, a worker compiles a cached Numba function (per signature) after any worker compiling it.

    Numba's disk cache has no cross-process lock, so two workers reaching a function at once both compile it
    (a minute for the compiled mixture sweeps). A file lock per function makes the second wait and then load
    the first one's cache entry (``Dispatcher.compile`` reads the disk cache before compiling). The call graph
    of compiled functions has no cycles, so nested locks cannot deadlock.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    try:
        from numba.core import dispatcher
        from numba.core.caching import NullCache
    except ImportError:  # pragma: no cover - Numba is optional
        return
    original = dispatcher.Dispatcher.compile
    held: set[str] = set()
    locks = Path(tempfile.gettempdir()) / "neuralblock-numba-compile-locks"
    try:
        locks.mkdir(exist_ok=True)
    except OSError:  # no shared temporary folder: workers compile as Numba does by itself
        return

    def compile_once(self: Any, sig: Any) -> Any:
        code = self.py_func.__code__  # (the file path keeps other checkouts' sessions apart)
        key = f"{code.co_filename}:{self.py_func.__qualname__}{sig}"
        if isinstance(self._cache, NullCache) or key in held:
            return original(self, sig)
        with open(locks / hashlib.sha1(key.encode()).hexdigest(), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.add(key)
            try:
                return original(self, sig)
            finally:
                held.discard(key)

    dispatcher.Dispatcher.compile = compile_once


_compile_each_numba_function_once_across_workers()


@pytest.fixture(autouse=True)
def _seed_everything():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    torch.set_default_dtype(torch.float32)
    yield
