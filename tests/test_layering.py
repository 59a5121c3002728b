"""The layers DESIGN.md draws: ``proposals``, ``coresets`` and ``subsample`` need only torch, and Pyro's
private names are imported in one module (``neuralblock/pyro/plates.py``)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TORCH_ONLY = [
    "neuralblock.proposals",
    "neuralblock.coresets",
    "neuralblock.coresets.pyro_model",  # the old path of neuralblock.pyro.coresets, an alias
    "neuralblock.subsample",
    "neuralblock.subsample.sections",  # old path of neuralblock.pyro.sections
    "neuralblock.subsample.likelihood",  # old path of neuralblock.pyro.likelihood
]

PRIVATE_PYRO_MODULE = Path("neuralblock/pyro/plates.py")


def test_torch_only_subpackages_import_without_pyro() -> None:
    # `neuralblock/__init__.py` imports the kernels (which need Pyro), so the script stands in an empty
    # `neuralblock` package and checks what the subpackages themselves import.
    script = textwrap.dedent(
        f"""
        import sys, types
        sys.modules["pyro"] = None  # any import of Pyro now raises ImportError
        package = types.ModuleType("neuralblock")
        package.__path__ = [{str(ROOT / "neuralblock")!r}]
        sys.modules["neuralblock"] = package
        import importlib
        for name in {TORCH_ONLY!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.startswith("neuralblock.pyro") or m.startswith("pyro."))
        assert not loaded, loaded
        import neuralblock.coresets, neuralblock.subsample
        for package, name in [(neuralblock.coresets, "weighted_model"), (neuralblock.subsample, "SectionEvaluator")]:
            try:
                getattr(package, name)
            except ImportError:
                pass
            else:
                raise AssertionError(f"{{name}} was reachable without Pyro")
        print("torch only")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch only"


def test_old_import_paths_reach_the_moved_names() -> None:
    import neuralblock.coresets as coresets
    import neuralblock.pyro.coresets as pyro_coresets
    import neuralblock.pyro.likelihood as pyro_likelihood
    import neuralblock.pyro.sections as pyro_sections
    import neuralblock.subsample as subsample
    from neuralblock.coresets.pyro_model import _newton_mode, weighted_model
    from neuralblock.subsample.likelihood import CompileError, LogLikelihood, bucket_size
    from neuralblock.subsample.sections import SectionEvaluator, section_scale

    assert weighted_model is coresets.weighted_model is pyro_coresets.weighted_model
    assert _newton_mode is pyro_coresets._newton_mode
    assert (LogLikelihood, CompileError, bucket_size) == (
        pyro_likelihood.LogLikelihood,
        pyro_likelihood.CompileError,
        pyro_likelihood.bucket_size,
    )
    assert SectionEvaluator is subsample.SectionEvaluator is pyro_sections.SectionEvaluator
    assert section_scale is pyro_sections.section_scale
    for package in (coresets, subsample):
        assert all(hasattr(package, name) for name in package.__all__)
        assert set(package.__all__) <= set(dir(package))


def _private_pyro_imports(path: Path) -> list[str]:
    """``module.name`` of every Pyro private name a source file imports or reaches by attribute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "pyro":
            module = node.module or ""
            if any(part.startswith("_") for part in module.split(".")):
                found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [
                alias.name
                for alias in node.names
                if alias.name.split(".")[0] == "pyro" and any(p.startswith("_") for p in alias.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id == "pyro":
                found.append(ast.unparse(node))
    return found


def test_pyro_private_names_are_imported_in_one_module() -> None:
    offenders = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "neuralblock").rglob("*.py"))
        if path.relative_to(ROOT) != PRIVATE_PYRO_MODULE and (names := _private_pyro_imports(path))
    }
    assert not offenders, f"import Pyro's private names from {PRIVATE_PYRO_MODULE} instead: {offenders}"
    assert _private_pyro_imports(ROOT / PRIVATE_PYRO_MODULE)  # the checker sees the one module that does
