"""Module aliases that load their target on first use (old import paths of moved Pyro glue).

Example:
    >>> import types
    >>> alias = types.ModuleType("old_math")
    >>> alias.__getattr__ = forwarding_getattr("old_math", "math")
    >>> alias.sqrt(4.0)
    2.0
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["forwarding_getattr"]


def forwarding_getattr(module: str, target: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that takes every name from ``target``, importing it on first access.

    Importing the alias stays as cheap as its own imports; ``target`` (e.g. a module that needs Pyro) is
    imported only when one of its names is asked for. Dunder names are not forwarded.

    Args:
        module: the alias module's name (for the error message).
        target: the module that holds the names.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(target), name)

    return __getattr__
