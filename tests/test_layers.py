"""The package's layering: the import-linter contracts of pyproject.toml, and no cycles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    """kernels and plan -> tasks -> graph and methods -> driver and API -> cli, each layer
    importing only from those below it (pyproject.toml's [tool.importlinter])."""
    pytest.importorskip("importlinter")
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert command, "lint-imports is not installed beside this Python"
    proc = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_import_cycle_in_the_package():
    """No two modules import each other, directly or through others (function-level
    imports included)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("nbody_dask", exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    cycles = [(a, b) for i, a in enumerate(modules) for b in modules[i + 1:]
              if graph.chain_exists(a, b) and graph.chain_exists(b, a)]
    assert not cycles, f"import cycles between: {cycles}"
