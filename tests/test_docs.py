"""The Markdown API reference lists every public name; the README links resolve."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MODULES = {
    "nbody_dask": None,
    "nbody_dask.initial_conditions": None,
    "nbody_dask.bodyfiles": None,
    "nbody_dask.gadget": None,
    "nbody_dask.analysis": {"DEFAULT_FRACTIONS"},
    "nbody_dask.plot": {"KINDS"},
    "nbody_dask.clusters": {"KINDS", "client_context", "total_threads"},
    "nbody_dask.k8s": None,
    "nbody_dask.lease": None,
    "nbody_dask.location": None,
    "nbody_dask.accuracy": None,
    "nbody_dask.testing": None,
    "nbody_dask.kernels.tree": None,
    "nbody_dask.kernels.law": None,
    "nbody_dask.kernels.ewald": None,
    "nbody_dask.kernels.pm": None,
    "nbody_dask.kernels.shortrange": None,
    "nbody_dask.kernels.stack": None,
    "nbody_dask.meshfft": None,
    "nbody_dask.plan": None,
    "nbody_dask.timebins": None,
    "nbody_dask.blocksteps": None,
    "nbody_dask.methods": None,
    "nbody_dask.methods.tree": None,
    "nbody_dask.methods.direct": None,
    "nbody_dask.methods.treepm": None,
    "nbody_dask.graph": None,
    "nbody_dask.tasks": None,
    "nbody_dask.sizes": None,
    "nbody_dask.spatial": None,
    "nbody_dask.units": None,
    "nbody_dask.cosmology": None,
    "nbody_dask.lpt": None,
    "nbody_dask.power": None,
    "nbody_dask.halos": None,
    "nbody_dask.kernels.cuda": None,
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_public_name_is_in_the_api_reference(module):
    api = (ROOT / "docs" / "api.md").read_text()
    names = set(importlib.import_module(module).__all__) - (MODULES[module] or set())
    names -= {"__version__", "initial_conditions"}
    missing = sorted(n for n in names if f"`{n}" not in api)
    assert not missing, f"{module}: not in docs/api.md: {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/user-guide.md", "docs/api.md"])
def test_relative_links_resolve(page):
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#:]+)\)", path.read_text()):
        assert (path.parent / target).exists(), f"{page}: broken link {target}"
