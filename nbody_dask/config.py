"""Defaults under the ``nbody`` namespace of :mod:`dask.config`, loaded from ``nbody.yaml``.

Every tunable keyword of the public API defaults to ``None`` and is looked up here at call
time, so ``dask.config.set``, YAML files and ``DASK_NBODY__...`` environment variables all work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml

__all__ = ["get", "DEFAULTS_FILE"]

DEFAULTS_FILE = Path(__file__).with_name("nbody.yaml")

with DEFAULTS_FILE.open() as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)


def get(key: str, value: Any = None) -> Any:
    """``value`` if it is not None, else the configured ``nbody.<key>``."""
    return dask.config.get(f"nbody.{key}") if value is None else value
