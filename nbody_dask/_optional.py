"""Optional back ends (dask-jobqueue, dask-cuda, dask-kubernetes), imported when used."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["optional_import"]


def optional_import(module: str, extra: str, what: str) -> ModuleType:
    """Import an optional back end, or fail at once saying which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module.split('.')[0].replace('_', '-')}: "
                          f"pip install 'nbody-dask[{extra}]' ({exc})") from None
