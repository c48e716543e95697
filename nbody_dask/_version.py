"""The version of the installed distribution, written into stores and body files."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("nbody-dask")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"
